// sgemm through each OpenBLAS kernel set ("core") this CPU can run, switched in process
// (sc::set_blas_core) and alternated round by round: GFLOP/s of the medians, on the products of
// the example's MLP (batch 128 and 1) and a square 1024^3. What the library's fallback rule
// (backend/cpu/blas_core.hpp) chooses from. Without Google Benchmark (threads: OMP_NUM_THREADS):
//   g++ -std=c++20 -O2 -fopenmp -DNDEBUG -Iinclude -I/usr/include/x86_64-linux-gnu/openblas-openmp
//       bench/time_blas_cores.cpp -o /tmp/time_blas_cores -lopenblas -lz   (one command line)
//   OMP_NUM_THREADS=1 nice -n -15 /tmp/time_blas_cores
#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <stagecraft/stagecraft.hpp>
#include "time_median.hpp"

namespace sc = stagecraft;

int main() {
  struct Product {
    int m, n, k;
    bool ta, tb;
  };
  const Product products[] = {{1024, 1024, 1024, false, false}, {128, 256, 784, false, false}, {784, 256, 128, true, false},
                              {128, 784, 256, false, true},     {128, 10, 256, false, false},  {1, 256, 784, false, false}};
  sc::ensure_blas_core();
  const std::string start = sc::blas_core();
  std::vector<std::string> cores{start};
  for (const char* c : {"Haswell", "Zen", "SkylakeX", "Cooperlake"})
    if (c != start && sc::set_blas_core(c)) cores.push_back(c);
  const int level = sc::backend::cpu::cpu_vector_level();
  std::printf("OpenBLAS core at start %s (CPU vector level %d); rounds alternate the cores\n", start.c_str(), level);
  constexpr int rounds = 3;
  for (const Product& p : products) {
    std::vector<float> a(static_cast<std::size_t>(p.m) * p.k, 0.5f), b(static_cast<std::size_t>(p.k) * p.n, 0.25f);
    std::vector<float> c(static_cast<std::size_t>(p.m) * p.n);
    const double flop = 2.0 * p.m * p.n * p.k;
    const int reps = std::clamp(static_cast<int>(2e8 / flop), 1, 20000);
    std::vector<std::vector<double>> ms(cores.size());
    for (int r = 0; r < rounds; ++r)
      for (std::size_t i = 0; i < cores.size(); ++i) {
        sc::set_blas_core(cores[i]);
        ms[i].push_back(bench::median_ms(
            [&] {
              for (int t = 0; t < reps; ++t)
                cblas_sgemm(CblasRowMajor, p.ta ? CblasTrans : CblasNoTrans, p.tb ? CblasTrans : CblasNoTrans, p.m, p.n,
                            p.k, 1.f, a.data(), p.ta ? p.m : p.k, b.data(), p.tb ? p.k : p.n, 0.f, c.data(), p.n);
              return c[0];
            },
            7));
      }
    std::printf("%4d x %4d x %4d %c%c:", p.m, p.n, p.k, p.ta ? 'T' : 'N', p.tb ? 'T' : 'N');
    for (std::size_t i = 0; i < cores.size(); ++i) {
      std::sort(ms[i].begin(), ms[i].end());
      std::printf("  %s %.1f", cores[i].c_str(), flop * reps / (ms[i][rounds / 2] * 1e-3) / 1e9);
    }
    std::printf(" GFLOP/s\n");
  }
  sc::set_blas_core(start);
}
