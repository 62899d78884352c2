// LibTorch's row of `time_train_step 4096 layer_norm`, standalone (no stagecraft, no Google
// Benchmark, so no other library's threads share the process): the gradients of
// sum(layer_norm(x, gamma, beta) * r) over [batch, 1024] with respect to x, gamma and beta, plus
// a sum of each gradient as time_train_step adds them; 7 rounds of 10 steps, median and best
// round per step. Built by hand (Debian's libtorch-dev):
//   g++ -std=c++17 -O2 -I/usr/include/torch/csrc/api/include bench/time_layer_norm_torch.cpp
//       -ltorch -ltorch_cpu -lc10 -o time_layer_norm_torch      (one command line)
//   ./time_layer_norm_torch [batch=4096]     (SC_THREADS=n: n threads instead of one)
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  torch::set_num_threads(std::getenv("SC_THREADS") != nullptr ? std::atoi(std::getenv("SC_THREADS")) : 1);
  at::set_num_interop_threads(1);
  const std::int64_t batch = argc > 1 ? std::atoll(argv[1]) : 4096, cols = 1024;
  torch::manual_seed(1);
  const at::Tensor x = (torch::rand({batch, cols}) * 2 - 1).requires_grad_(true), r = torch::rand({batch, cols}) * 2 - 1;
  const at::Tensor gamma = (torch::rand({cols}) + 0.5).requires_grad_(true), beta = (torch::rand({cols}) * 2 - 1).requires_grad_(true);
  const auto step = [&] {
    const at::Tensor loss = (torch::layer_norm(x, {cols}, gamma, beta) * r).sum();
    const std::vector<at::Tensor> g = torch::autograd::grad({loss}, {x, gamma, beta});
    return (loss + (g[0].sum() + g[1].sum() + g[2].sum()) * 0.f).item<float>();
  };
  (void)step();
  std::vector<double> ms;
  for (int round = 0; round < 7; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) (void)step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 10);
  }
  std::sort(ms.begin(), ms.end());
  std::printf("layer_norm libtorch batch %lld: %.3f ms (best %.3f)\n", static_cast<long long>(batch), ms[3], ms[0]);
  return 0;
}
