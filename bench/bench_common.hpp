// Shared setup of the benchmark executables: one thread count for stagecraft, OpenBLAS and
// LibTorch, context lines naming it, and a main() that applies it before any benchmark runs.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <string>

#include <benchmark/benchmark.h>

#include <stagecraft/stagecraft.hpp>

#if STAGECRAFT_BENCH_TORCH
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/version.h>
#endif

namespace sc = stagecraft;

namespace bench {

/// Threads every library in the run uses: $STAGECRAFT_BENCH_THREADS, else $OMP_NUM_THREADS (its
/// first number), else 2 (this machine's cores). (Until session 74 OMP_NUM_THREADS was ignored: runs
/// that set only it to 1 ran on 2 threads.)
inline int threads() {
  for (const char* var : {"STAGECRAFT_BENCH_THREADS", "OMP_NUM_THREADS"})
    if (const char* s = std::getenv(var); s != nullptr && std::atoi(s) > 0) return std::atoi(s);
  return 2;
}

/// Applies threads() to stagecraft (OpenMP, which OpenBLAS's openmp build shares) and LibTorch,
/// and records it in the report's context.
inline void setup() {
  const int n = threads();
  sc::set_num_threads(n);
  benchmark::AddCustomContext("threads", std::to_string(n));
#if STAGECRAFT_BENCH_TORCH
  at::set_num_threads(n);
  at::set_num_interop_threads(1);
  benchmark::AddCustomContext("libtorch", TORCH_VERSION);
#else
  benchmark::AddCustomContext("libtorch", "not built in");
#endif
}

/// f32 values from a fixed pseudo-random stream in [-2, 2): inputs that keep exp/tanh in range.
inline sc::Tensor input(sc::Shape shape, std::uint64_t seed) {
  return sc::random::uniform(shape, -2.0, 2.0, seed);
}

#if STAGECRAFT_BENCH_TORCH
/// A LibTorch tensor that reads the same memory as a contiguous f32 stagecraft tensor.
inline at::Tensor as_torch(const sc::Tensor& t) {
  std::vector<std::int64_t> sizes(t.shape().begin(), t.shape().end());
  return at::from_blob(t.raw_data(), sizes, at::TensorOptions().dtype(at::kFloat));
}
#endif

}  // namespace bench

/// main(): thread setup, then Google Benchmark's usual flags.
#define STAGECRAFT_BENCH_MAIN()                                      \
  int main(int argc, char** argv) {                                  \
    benchmark::Initialize(&argc, argv);                              \
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1; \
    bench::setup();                                                  \
    benchmark::RunSpecifiedBenchmarks();                             \
    benchmark::Shutdown();                                           \
    return 0;                                                        \
  }
