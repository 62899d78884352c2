// Built at -O0 (a user's debug build) in CI's CUDA-off tree, and run: a traced training step (dense
// layers, relu, cross_entropy, Adam), a convolution and sc::compile must link without the CUDA
// kernels. At -O0 nothing is inlined away, so every CUDA hook a CPU program reaches must compile to
// nothing without CUDA (the plan's cuBLASLt calls once referred to the kernels' symbols here).
#include <cmath>
#include <cstdio>
#include <vector>

#include <stagecraft/stagecraft.hpp>

int main() {
  sc::manual_seed(1);
  sc::nn::Dense l1(6, 8), l2(8, 3);
  sc::optim::Adam opt(0.01);
  std::vector<sc::Variable> vars = l1.trainable_variables();
  for (const auto& v : l2.trainable_variables()) vars.push_back(v);
  auto step = sc::function([&](const sc::Tensor& x, const sc::Tensor& y) {
    sc::GradientTape tape;
    const sc::Tensor loss = sc::nn::cross_entropy(l2(sc::relu(l1(x))), y);
    opt.apply(tape.gradient(loss, vars), vars);
    return loss;
  });
  const sc::Tensor x = sc::random::normal({4, 6}, 2);
  const sc::Tensor y = sc::tensor(std::vector<std::int64_t>{0, 1, 2, 1}, sc::Shape{4});
  float first = 0, last = 0;
  for (int i = 0; i < 20; ++i) {
    last = sc::Tensor(step(x, y)).item<float>();
    if (i == 0) first = last;
  }
  const sc::Tensor img = sc::random::normal({1, 2, 5, 5}, 3), k = sc::random::normal({3, 2, 3, 3}, 4);
  const float conv = sc::sum(sc::nn::max_pool2d(sc::relu(sc::nn::conv2d(img, k, 1, 1)), 2, 2)).item<float>();
  auto f = sc::compile([](const auto& a, const auto& b) { return sc::tanh(a * b + 1.f); });
  const float staged = sc::sum(f(x, x)).item<float>();
  std::printf("loss %.4f -> %.4f, conv %.4f, compiled %.4f\n", first, last, conv, staged);
  return last < first && std::isfinite(conv) && std::isfinite(staged) ? 0 : 1;
}
