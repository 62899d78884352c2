// Loops over a few wide rows, the median of 21 calls each (ms): a concat of two [64, 32768] f32
// along axis 1, a [2048, 2048] f32 transpose, a row sum of [64, 65536], a gather of
// 64 rows of [256, 65536], the cross-entropy of [64, 65536] logits, an i32 [512, 512] product and
// a max pool of [8, 64, 112, 112]. Each has fewer than parallel_for's 64 units per thread, so
// before parallel_rows they ran on one thread. Without Google Benchmark, so that two trees'
// headers can be compiled with the same command and run alternately (threads: OMP_NUM_THREADS):
//   g++ -std=c++20 -O2 -march=native -fopenmp -DNDEBUG -I<tree>/include
//       -I/usr/include/x86_64-linux-gnu/openblas-openmp bench/time_row_loops.cpp -lopenblas -lz
//   (one command line)
#include <cstdio>

#include <stagecraft/stagecraft.hpp>
#include "time_median.hpp"

int main() {
  const sc::Tensor a = sc::random::uniform({64, 32768}, -1.0, 1.0, 1), b = sc::random::uniform({64, 32768}, -1.0, 1.0, 2);
  const sc::Tensor sq = sc::random::uniform({2048, 2048}, -1.0, 1.0, 3);
  const sc::Tensor wide = sc::random::uniform({64, 65536}, -1.0, 1.0, 4);
  const sc::Tensor table = sc::random::uniform({256, 65536}, -1.0, 1.0, 5);
  const sc::Tensor idx = sc::cast(sc::random::uniform({64}, 0.0, 255.0, 6), sc::DType::i64);
  const sc::Tensor labels = sc::cast(sc::random::uniform({64}, 0.0, 65535.0, 7), sc::DType::i64);
  const sc::Tensor mi = sc::cast(sc::random::uniform({512, 512}, -8.0, 8.0, 8), sc::DType::i32);
  const sc::Tensor img = sc::random::uniform({8, 64, 112, 112}, -1.0, 1.0, 9);
  const double cat = bench::median_ms([&] { return sc::concat({a, b}, 1); }, 21);
  const double tr = bench::median_ms([&] { return sc::transpose(sq, {1, 0}); }, 21);
  const double sum = bench::median_ms([&] { return sc::sum(wide, {1}); }, 21);
  const double take = bench::median_ms([&] { return sc::gather(table, idx, 0); }, 21);
  const double xent = bench::median_ms([&] { return sc::nn::cross_entropy(wide, labels); }, 21);
  const double imm = bench::median_ms([&] { return sc::matmul(mi, mi); }, 21);
  const double pool = bench::median_ms([&] { return sc::nn::max_pool2d(img, 2, 2); }, 21);
  std::printf("%d threads, ms: concat %.3f  transpose %.3f  row_sum %.3f  gather %.3f  cross_entropy %.3f  "
              "i32_matmul %.3f  max_pool %.3f\n",
              sc::num_threads(), cat, tr, sum, take, xent, imm, pool);
  return 0;
}
