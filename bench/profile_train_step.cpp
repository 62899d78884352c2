// A driver for `valgrind --tool=callgrind`: argv[2] (default 20) eager training steps of the
// Fashion-MNIST model argv[1] ("mlp" or "cnn") at batch argv[3] (default 128), nothing else.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fashion_mnist_models.hpp"

namespace sc = stagecraft;

template <class Model>
double run(long steps, std::int64_t batch) {
  const sc::Tensor x = sc::random::uniform({batch, 28, 28}, 0.0, 1.0, 11);
  const sc::Tensor y = sc::cast(sc::random::uniform({batch}, 0.0, 10.0, 12), sc::i64);
  sc::manual_seed(0);
  Model model;
  sc::optim::Adam opt(1e-3);
  const std::vector<sc::Variable> vars = model.trainable_variables();
  double last = 0;
  for (long i = 0; i < steps; ++i) {
    const sc::Tensor loss = fashion::train_step(model, opt, vars, x, y);
    last = loss.item<double>();
  }
  return last;
}

int main(int argc, char** argv) {
  const std::string model = argc > 1 ? argv[1] : "mlp";
  const long steps = argc > 2 ? std::atol(argv[2]) : 20;
  const std::int64_t batch = argc > 3 ? std::atol(argv[3]) : 128;
  const double loss = model == "cnn" ? run<fashion::CNN>(steps, batch) : run<fashion::MLP>(steps, batch);
  std::printf("%s: %ld steps at batch %lld, last loss %g\n", model.c_str(), steps, static_cast<long long>(batch), loss);
  return 0;
}
