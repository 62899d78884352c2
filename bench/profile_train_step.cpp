// A driver for `valgrind --tool=callgrind` or `perf record`: argv[2] (default 20) training steps of
// the Fashion-MNIST model argv[1] ("mlp" or "cnn") at batch argv[3] (default 128), eager or, with
// argv[4] = "staged", traced by sc::function (one trace, then the plan), nothing else.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fashion_mnist_models.hpp"

namespace sc = stagecraft;

template <class Model>
double run(long steps, std::int64_t batch, bool staged) {
  const sc::Tensor x = sc::random::uniform({batch, 28, 28}, 0.0, 1.0, 11);
  const sc::Tensor y = sc::cast(sc::random::uniform({batch}, 0.0, 10.0, 12), sc::i64);
  sc::manual_seed(0);
  Model model;
  sc::optim::Adam opt(1e-3);
  const std::vector<sc::Variable> vars = model.trainable_variables();
  auto step = [&](const sc::Tensor& a, const sc::Tensor& b) { return fashion::train_step(model, opt, vars, a, b); };
  auto traced = sc::function(step);
  double last = 0;
  for (long i = 0; i < steps; ++i) {
    const sc::Tensor loss = staged ? traced(x, y) : step(x, y);
    last = loss.item<double>();
  }
  return last;
}

int main(int argc, char** argv) {
  const std::string model = argc > 1 ? argv[1] : "mlp";
  const long steps = argc > 2 ? std::atol(argv[2]) : 20;
  const std::int64_t batch = argc > 3 ? std::atol(argv[3]) : 128;
  const bool staged = argc > 4 && std::string(argv[4]) == "staged";
  const double loss = model == "cnn" ? run<fashion::CNN>(steps, batch, staged) : run<fashion::MLP>(steps, batch, staged);
  std::printf("%s: %ld %s steps at batch %lld, last loss %g\n", model.c_str(), steps, staged ? "staged" : "eager",
              static_cast<long long>(batch), loss);
  return 0;
}
