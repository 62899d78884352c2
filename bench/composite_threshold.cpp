// Where an eager composite (nn/composite.hpp) should start running staged: layer_norm (with gamma
// and beta), softmax, gelu and silu on [rows, cols] f32 tensors of 4096 to 4M elements, op by op
// (nn::composite_staging() off) against staged (every size staged: the threshold at 0, the trace
// bound lifted), median of many calls each (a fresh result each time, as a user's call makes).
// Without Google Benchmark, one command (a line); threads from OMP_NUM_THREADS:
//   g++ -std=c++20 -O3 -DNDEBUG -march=x86-64-v3 -fopenmp -Iinclude
//       -I/usr/include/x86_64-linux-gnu/openblas-openmp bench/composite_threshold.cpp -lopenblas -lz -ldl -pthread
//   OMP_NUM_THREADS=16 ./a.out
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include <stagecraft/stagecraft.hpp>

namespace sc = stagecraft;

namespace {

double median_us(const std::function<void()>& f, int reps) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main() {
  sc::nn::composite_detail::max_traces() = 1000;
  sc::nn::composite_staging_min_elements() = 0;
  std::printf("threads %d; us per call, op by op / staged\n", sc::num_threads());
  for (const std::int64_t cols : {64, 256, 1024, 4096}) {
    for (const std::int64_t n : {4096, 16384, 65536, 262144, 1048576, 4194304}) {
      const std::int64_t rows = n / cols;
      if (rows < 1) continue;
      const sc::Tensor x = sc::random::normal({rows, cols}, 1);
      const sc::Tensor g = sc::ones({cols}), b = sc::zeros({cols});
      const int reps = std::min(1001, std::max(7, static_cast<int>(4e7 / static_cast<double>(n))));
      double t[4][2] = {};
      for (const int on : {1, 0, 1}) {  // staged first (it traces), op by op, staged again (timed)
        sc::nn::composite_staging() = on != 0;
        t[0][on] = median_us([&] { (void)sc::nn::layer_norm(x, {cols}, g, b); }, reps);
        t[1][on] = median_us([&] { (void)sc::nn::softmax(x); }, reps);
        t[2][on] = median_us([&] { (void)sc::nn::gelu(x); }, reps);
        t[3][on] = median_us([&] { (void)sc::nn::silu(x); }, reps);
      }
      std::printf("%5ld x %5ld (%7ld):", static_cast<long>(rows), static_cast<long>(cols), static_cast<long>(n));
      const char* names[] = {"layer_norm", "softmax", "gelu", "silu"};
      for (int k = 0; k < 4; ++k)
        std::printf(" | %s %.1f / %.1f %.2fx", names[k], t[k][0], t[k][1], t[k][0] / t[k][1]);
      std::printf("\n");
    }
  }
}
