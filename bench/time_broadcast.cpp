// Broadcasting ops on a [4096, 1024] f32 tensor, the median of 41 calls each: a bias add
// ([4096, 1024] + [1024]), a scalar broadcast_to [4096, 1024], a column subtracted ([4096, 1024] -
// [4096, 1]) and where(cond, [4096, 1], [1024]). Without Google Benchmark, so that two trees'
// headers can be compiled with the same command and run alternately (threads: OMP_NUM_THREADS):
//   g++ -std=c++20 -O2 -march=native -fopenmp -DNDEBUG -I<tree>/include
//       -I/usr/include/x86_64-linux-gnu/openblas-openmp bench/time_broadcast.cpp -lopenblas -lz
//   (one command line)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <stagecraft/stagecraft.hpp>

namespace {

template <class F>
double median_ms(F f) {
  std::vector<double> ms;
  for (int i = 0; i < 41; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const sc::Tensor y = f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main() {
  const std::int64_t rows = 4096, cols = 1024;
  const sc::Tensor x = sc::random::uniform({rows, cols}, -1.0, 1.0, 1), b = sc::random::uniform({cols}, -1.0, 1.0, 2);
  const sc::Tensor col = sc::random::uniform({rows, 1}, -1.0, 1.0, 3), s = sc::tensor({1.f});
  const sc::Tensor cond = x > 0.f;
  const double bias = median_ms([&] { return x + b; });
  const double fill = median_ms([&] { return sc::broadcast_to(s, {rows, cols}); });
  const double sub = median_ms([&] { return x - col; });
  const double sel = median_ms([&] { return sc::where(cond, col, b); });
  std::printf("%d threads, ms: bias_add %.3f  scalar_broadcast %.3f  sub_column %.3f  where %.3f\n", sc::num_threads(),
              bias, fill, sub, sel);
  return 0;
}
