// A short tour of eager stagecraft: tensors, broadcasting, promotion and errors.
#include <iostream>

#include <stagecraft/stagecraft.hpp>

int main() {
  sc::Tensor a = sc::tensor({{1.f, 2.f, 3.f}, {4.f, 5.f, 6.f}});
  sc::Tensor b = sc::tensor({10.f, 20.f, 30.f});
  std::cout << "a =\n" << a << "\n";
  std::cout << "a + b (broadcast [2,3] with [3]) =\n" << a + b << "\n";
  std::cout << "tanh(a) * 2 =\n" << sc::tanh(a) * 2 << "\n";
  std::cout << "a > 2.5 =\n" << (a > 2.5f) << "\n";
  sc::Tensor i = sc::arange(6);
  std::cout << "arange(6) + 1 stays i64: " << (i + 1) << "\n";
  std::cout << "random::normal({2, 3}, 42) =\n" << sc::random::normal({2, 3}, 42) << "\n";
  try {
    auto bad = a + sc::ones({4});
    (void)bad;
  } catch (const sc::ShapeError& e) {
    std::cout << "a + ones({4}) -> ShapeError: " << e.what() << "\n";
  }
  return 0;
}
