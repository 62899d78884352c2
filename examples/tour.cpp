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
  sc::Tensor w = sc::tensor({{1.f, 0.f}, {0.f, 1.f}, {1.f, 1.f}});
  std::cout << "matmul(a [2,3], w [3,2]) =\n" << sc::matmul(a, w) << "\n";
  sc::Tensor img = sc::reshape(sc::arange(0.f, 16.f, 1.f), {1, 1, 4, 4});
  sc::Tensor edge = sc::tensor({{{{-1.f, 1.f}, {-1.f, 1.f}}}});  // [1,1,2,2] horizontal gradient
  std::cout << "conv2d(4x4 ramp, 2x2 edge filter) =\n" << sc::nn::conv2d(img, edge) << "\n";
  std::cout << "max_pool2d(ramp, 2, 2) =\n" << sc::nn::max_pool2d(img, 2, 2) << "\n";
  std::cout << "softmax([1, 2, 3]) = " << sc::nn::softmax(sc::tensor({1.f, 2.f, 3.f})) << "\n";
  std::cout << "sum(a, {1}) = " << sc::sum(a, {1}) << ", argmax(a, 1) = " << sc::argmax(a, 1) << "\n";
  {
    sc::GradientTape tape;
    sc::Tensor x = sc::scalar(3.f);
    tape.watch(x);
    sc::Tensor y = x * x;
    std::cout << "d(x*x)/dx at 3 = " << tape.gradient(y, x) << "\n";
  }
  {  // staging: the same code traced once into an optimized graph (README's example)
    sc::Variable wv(sc::random::normal({3, 3}, /*seed=*/1), "w");
    auto step = sc::function([&](sc::Tensor x) {
      sc::GradientTape tape;
      sc::Tensor loss = sc::sum(sc::tanh(sc::matmul(x, wv)));
      wv.assign_sub(tape.gradient(loss, wv) * 0.1f);  // runs at every call
      return loss;
    });
    std::cout << "staged step: loss " << step(sc::ones({2, 3})) << " then " << step(sc::ones({2, 3})) << "\n";
    std::cout << step.get_concrete(sc::ones({2, 3})).graph();
  }
  {  // compile-time staging: the graph is the lambda's return type, evaluated as one fused loop
    auto f = [](auto x, auto y) { return sc::tanh(x * y) + 2.f * x; };
    const sc::Tensor x = sc::tensor({0.5f, -1.f, 2.f}), y = sc::tensor({1.f, 2.f, 3.f});
    auto g = sc::compile(f);
    std::cout << "eager " << f(x, y) << "\ncompiled " << g(x, y) << "\nd/dx " << sc::grad<0>(g)(x, y) << "\n";
    std::cout << g.graph(x, y);
  }
  try {
    auto bad = a + sc::ones({4});
    (void)bad;
  } catch (const sc::ShapeError& e) {
    std::cout << "a + ones({4}) -> ShapeError: " << e.what() << "\n";
  }
  return 0;
}
