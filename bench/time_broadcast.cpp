// Broadcasting ops on a [4096, 1024] f32 tensor, the median of 41 calls each: a bias add
// ([4096, 1024] + [1024]), a scalar broadcast_to [4096, 1024], a column subtracted ([4096, 1024] -
// [4096, 1]) and where(cond, [4096, 1], [1024]). Without Google Benchmark, so that two trees'
// headers can be compiled with the same command and run alternately (threads: OMP_NUM_THREADS):
//   g++ -std=c++20 -O2 -march=native -fopenmp -DNDEBUG -I<tree>/include
//       -I/usr/include/x86_64-linux-gnu/openblas-openmp bench/time_broadcast.cpp -lopenblas -lz
//   (one command line)
#include <cstdio>

#include <stagecraft/stagecraft.hpp>
#include "time_median.hpp"

int main() {
  const std::int64_t rows = 4096, cols = 1024;
  const sc::Tensor x = sc::random::uniform({rows, cols}, -1.0, 1.0, 1), b = sc::random::uniform({cols}, -1.0, 1.0, 2);
  const sc::Tensor col = sc::random::uniform({rows, 1}, -1.0, 1.0, 3), s = sc::tensor({1.f});
  const sc::Tensor cond = x > 0.f;
  const double bias = bench::median_ms([&] { return x + b; }, 41);
  const double fill = bench::median_ms([&] { return sc::broadcast_to(s, {rows, cols}); }, 41);
  const double sub = bench::median_ms([&] { return x - col; }, 41);
  const double sel = bench::median_ms([&] { return sc::where(cond, col, b); }, 41);
  std::printf("%d threads, ms: bias_add %.3f  scalar_broadcast %.3f  sub_column %.3f  where %.3f\n", sc::num_threads(),
              bias, fill, sub, sel);
  return 0;
}
