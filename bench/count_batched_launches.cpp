// Kernels launched per eager step on the emulated GPU (kernels/emulator), with eager batching off
// (a launch per op) and on (sc::cuda::eager_batching, the default): the counts of
// bench/results/gpu.md's session 43 to 45 tables. Counts, not times: the emulator runs each launch on the
// host. One command (after `cmake --preset emu && cmake --build build/emu --target stagecraft_cuda`):
//   g++ -std=c++20 -O1 -fopenmp -DSTAGECRAFT_WITH_CUDA=1 -DSTAGECRAFT_CUDA_EMULATOR=1 -Iinclude
//       -Ikernels -Ibench -Iexamples -I/usr/include/x86_64-linux-gnu/openblas-openmp
//       bench/count_batched_launches.cpp build/emu/libstagecraft_cuda.a -lbenchmark -lopenblas -lz
//       -ldl -pthread && OMP_NUM_THREADS=1 ./a.out
#include <cstdio>
#include <functional>
#include "bench_models.hpp"
#include "fashion_mnist_models.hpp"
#include "emulator/emu.hpp"

long count(const std::function<void()>& f) {
  sc::cuda::flush();
  const auto a = sc::cuda::emu::counts();
  f();
  sc::cuda::flush();
  return sc::cuda::emu::counts().kernels - a.kernels;
}
void both(const char* name, const std::function<void()>& f) {
  f();  // warm
  sc::cuda::set_eager_batching(false);
  const long off = count(f);
  sc::cuda::set_eager_batching(true);
  const long on = count(f);
  std::printf("%-40s %5ld kernels a launch per op, %5ld batched\n", name, off, on);
}
int main() {
  const sc::Device gpu = sc::Device::cuda(0);
  const sc::DeviceScope on(gpu);
  {
    const sc::Tensor x = sc::random::uniform({128, 28, 28}, 0.0, 1.0, 11);
    const sc::Tensor y = sc::cast(sc::random::uniform({128}, 0.0, 10.0, 12), sc::i64);
    fashion::MLP model;
    sc::optim::Adam opt(1e-3);
    const auto vars = model.trainable_variables();
    both("MLP Adam step, batch 128, eager", [&] { fashion::train_step(model, opt, vars, x, y).item<float>(); });
  }
  {
    const sc::Tensor x = sc::random::uniform({32, 28, 28}, 0.0, 1.0, 11);
    const sc::Tensor y = sc::cast(sc::random::uniform({32}, 0.0, 10.0, 12), sc::i64);
    fashion::CNN model;
    sc::optim::Adam opt(1e-3);
    const auto vars = model.trainable_variables();
    both("CNN Adam step, batch 32, eager", [&] { fashion::train_step(model, opt, vars, x, y).item<float>(); });
  }
  {
    const bench::LstmModel m(gpu);
    const auto vars = m.cell.trainable_variables();
    sc::nn::lstm_cell_staging() = false;
    both("LSTM 50 steps + backward, ops eager", [&] { m.step(vars).item<float>(); });
    sc::nn::lstm_cell_staging() = true;
    both("LSTM 50 steps + backward, cell staged", [&] { m.step(vars).item<float>(); });
  }
  {
    const sc::Tensor x0 = sc::random::uniform({64, 64}, -1.0, 1.0, 13);
    both("while_loop 100 rounds [64,64], eager", [&] {
      sc::Tensor x = x0, n = sc::zeros({});
      while ((n < 100.f).item<bool>()) {
        x = x * 0.9f + sc::tanh(x) * 0.1f;
        n = n + 1.f;
      }
      x.to_vector<float>();
    });
  }
}
