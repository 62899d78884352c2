// Reductions: the sum of 16M floats: stagecraft's sc::sum vs a hand-written
// `omp parallel for simd reduction` loop in this binary vs LibTorch, in one run.
#include "bench_common.hpp"

namespace {

constexpr std::int64_t n_elems = std::int64_t{1} << 24;

void count(benchmark::State& state) {
  state.SetItemsProcessed(state.iterations() * n_elems);
  state.SetBytesProcessed(state.iterations() * n_elems * std::int64_t{sizeof(float)});
}

void sc_sum(benchmark::State& state) {
  const sc::Tensor x = bench::input({n_elems}, 1);
  for (auto _ : state) {
    sc::Tensor s = sc::sum(x);
    benchmark::DoNotOptimize(s.raw_data());
  }
  count(state);
}
BENCHMARK(sc_sum)->Name("sum_16M/stagecraft")->UseRealTime();

float hand_sum(const float* x, std::int64_t n) {
  float s = 0.f;
#pragma omp parallel for simd reduction(+ : s)
  for (std::int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}
void hand(benchmark::State& state) {
  const sc::Tensor x = bench::input({n_elems}, 1);
  for (auto _ : state) benchmark::DoNotOptimize(hand_sum(static_cast<const float*>(x.raw_data()), n_elems));
  count(state);
}
BENCHMARK(hand)->Name("sum_16M/hand_loop")->UseRealTime();

#if STAGECRAFT_BENCH_TORCH
void torch_sum(benchmark::State& state) {
  const sc::Tensor sx = bench::input({n_elems}, 1);
  const at::Tensor x = bench::as_torch(sx);
  for (auto _ : state) {
    at::Tensor s = at::sum(x);
    benchmark::DoNotOptimize(s.data_ptr());
  }
  count(state);
}
BENCHMARK(torch_sum)->Name("sum_16M/libtorch")->UseRealTime();
#endif

}  // namespace

STAGECRAFT_BENCH_MAIN()
