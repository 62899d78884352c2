// Wall time of the Fashion-MNIST models' training step (examples/fashion_mnist_models.hpp), eager
// and traced by sc::function, on one thread: 7 rounds of 50 steps (CNN: 10), median and best round
// per step. Without Google Benchmark, so that two trees' headers (old and new) can be compiled with
// the same command and run alternately:
//   g++ -std=c++20 -O2 -march=x86-64-v3 -fopenmp -DNDEBUG -I<tree>/include -Iexamples
//       -I/usr/include/x86_64-linux-gnu/openblas-openmp bench/time_train_step.cpp -lopenblas -lz
//   (one command line)
//   ./a.out [batch=128] [mlp|cnn]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <stagecraft/stagecraft.hpp>

#include "fashion_mnist_models.hpp"

int main(int argc, char** argv) {
  sc::set_num_threads(1);
  const int batch = argc > 1 ? std::atoi(argv[1]) : 128;
  const bool cnn = argc > 2 && std::string(argv[2]) == "cnn";
  const sc::Tensor x = sc::random::uniform({batch, 28, 28}, 0.0, 1.0, 11);
  const sc::Tensor y = sc::cast(sc::random::uniform({batch}, 0.0, 10.0, 12), sc::i64);
  fashion::MLP mlp;
  fashion::CNN conv;
  sc::optim::Adam opt(1e-3);
  const auto vars = cnn ? conv.trainable_variables() : mlp.trainable_variables();
  auto step = [&](const sc::Tensor& a, const sc::Tensor& b) {
    return cnn ? fashion::train_step(conv, opt, vars, a, b) : fashion::train_step(mlp, opt, vars, a, b);
  };
  auto traced = sc::function(step);
  const int per_round = cnn ? 10 : 50;
  for (int staged = 0; staged < 2; ++staged) {
    std::vector<double> ms;
    for (int r = 0; r < 7; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < per_round; ++i) (void)(staged ? sc::Tensor(traced(x, y)) : step(x, y));
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / per_round);
    }
    std::sort(ms.begin(), ms.end());
    std::printf("%s %s batch %d: %.3f ms (best %.3f)\n", cnn ? "cnn" : "mlp", staged ? "staged" : "eager", batch, ms[3],
                ms[0]);
  }
  return 0;
}
