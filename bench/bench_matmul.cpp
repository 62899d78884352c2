// matmul: 1024^3 f32 and batch-1 [1,784]x[784,256]: stagecraft's sc::matmul vs cblas_sgemm
// called directly (same OpenBLAS, same threads) vs LibTorch, in one run.
#include <cblas.h>

#include "bench_common.hpp"

namespace {

void flops(benchmark::State& state, std::int64_t m, std::int64_t n, std::int64_t k) {
  state.counters["FLOPS"] = benchmark::Counter(static_cast<double>(2 * m * n * k),
                                               benchmark::Counter::kIsIterationInvariantRate);
}

// Args: M, K, N.
void sc_matmul(benchmark::State& state) {
  const std::int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  const sc::Tensor a = bench::input({m, k}, 1), b = bench::input({k, n}, 2);
  for (auto _ : state) {
    sc::Tensor c = sc::matmul(a, b);
    benchmark::DoNotOptimize(c.raw_data());
  }
  flops(state, m, n, k);
}

// The limit: one cblas_sgemm into a preallocated output.
void cblas_matmul(benchmark::State& state) {
  const std::int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  const sc::Tensor a = bench::input({m, k}, 1), b = bench::input({k, n}, 2), c = sc::zeros({m, n});
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.f, static_cast<const float*>(a.raw_data()), static_cast<int>(k),
                static_cast<const float*>(b.raw_data()), static_cast<int>(n), 0.f,
                static_cast<float*>(c.raw_data()), static_cast<int>(n));
    benchmark::ClobberMemory();
  }
  flops(state, m, n, k);
}

// For batch 1, the matrix-vector form: y = x^T B computed as B^T-gemv.
void cblas_gemv(benchmark::State& state) {
  const std::int64_t k = state.range(1), n = state.range(2);
  const sc::Tensor a = bench::input({1, k}, 1), b = bench::input({k, n}, 2), c = sc::zeros({1, n});
  for (auto _ : state) {
    cblas_sgemv(CblasRowMajor, CblasTrans, static_cast<int>(k), static_cast<int>(n), 1.f,
                static_cast<const float*>(b.raw_data()), static_cast<int>(n),
                static_cast<const float*>(a.raw_data()), 1, 0.f, static_cast<float*>(c.raw_data()), 1);
    benchmark::ClobberMemory();
  }
  flops(state, 1, n, k);
}

#if STAGECRAFT_BENCH_TORCH
void torch_matmul(benchmark::State& state) {
  const std::int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  const sc::Tensor sa = bench::input({m, k}, 1), sb = bench::input({k, n}, 2);
  const at::Tensor a = bench::as_torch(sa), b = bench::as_torch(sb);
  for (auto _ : state) {
    at::Tensor c = at::matmul(a, b);
    benchmark::DoNotOptimize(c.data_ptr());
  }
  flops(state, m, n, k);
}
#endif

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "K", "N"})->Args({1024, 1024, 1024})->Args({1, 784, 256})->UseRealTime();
}
BENCHMARK(sc_matmul)->Name("matmul/stagecraft")->Apply(shapes);
BENCHMARK(cblas_matmul)->Name("matmul/cblas_sgemm")->Apply(shapes);
BENCHMARK(cblas_gemv)->Name("matmul/cblas_sgemv")->ArgNames({"M", "K", "N"})->Args({1, 784, 256})->UseRealTime();
#if STAGECRAFT_BENCH_TORCH
BENCHMARK(torch_matmul)->Name("matmul/libtorch")->Apply(shapes);
#endif

}  // namespace

STAGECRAFT_BENCH_MAIN()
