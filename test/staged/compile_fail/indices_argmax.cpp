// EXPECT: sc::argmax gives integer indices and has no staged form.*sc::eval
#include <stagecraft/stagecraft.hpp>
int main() {
  const sc::Tensor x = sc::ones({2, 3});
  auto g = sc::compile([](auto a) { return sc::argmax(sc::tanh(a), 1); });
  (void)g(x);
}
