// Eager dispatch overhead: small adds (1 and 100 elements), tensor + tensor and tensor + scalar,
// through stagecraft and, in the same run, LibTorch (with and without autograd recording).
#include "bench_common.hpp"

namespace {

// Items are op calls, so items_per_second is calls per second.
void sc_add(benchmark::State& state) {
  const sc::Tensor a = bench::input({state.range(0)}, 1), b = bench::input({state.range(0)}, 2);
  for (auto _ : state) {
    sc::Tensor c = a + b;
    benchmark::DoNotOptimize(c.raw_data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(sc_add)->Name("dispatch/stagecraft/add")->Arg(1)->Arg(100);

void sc_add_scalar(benchmark::State& state) {
  const sc::Tensor a = bench::input({state.range(0)}, 1);
  for (auto _ : state) {
    sc::Tensor c = a + 1.f;
    benchmark::DoNotOptimize(c.raw_data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(sc_add_scalar)->Name("dispatch/stagecraft/add_scalar")->Arg(1)->Arg(100);

// A chain of three ops, each consuming the last result: nothing can be hoisted.
void sc_chain3(benchmark::State& state) {
  const sc::Tensor a = bench::input({state.range(0)}, 1), b = bench::input({state.range(0)}, 2);
  for (auto _ : state) {
    sc::Tensor c = (a + b) * b - a;
    benchmark::DoNotOptimize(c.raw_data());
  }
  state.SetItemsProcessed(3 * state.iterations());
}
BENCHMARK(sc_chain3)->Name("dispatch/stagecraft/chain3")->Arg(1)->Arg(100);

#if STAGECRAFT_BENCH_TORCH
at::Tensor torch_input(std::int64_t n, std::uint64_t seed, bool grad = false) {
  at::Tensor t = bench::as_torch(bench::input({n}, seed)).clone();
  if (grad) t.set_requires_grad(true);
  return t;
}

// Args: n; the benchmark's name says whether the inputs require grad (autograd records).
void torch_add(benchmark::State& state, bool grad) {
  const at::Tensor a = torch_input(state.range(0), 1, grad), b = torch_input(state.range(0), 2, grad);
  for (auto _ : state) {
    at::Tensor c = at::add(a, b);
    benchmark::DoNotOptimize(c.data_ptr());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK_CAPTURE(torch_add, plain, false)->Name("dispatch/libtorch/add")->Arg(1)->Arg(100);
BENCHMARK_CAPTURE(torch_add, grad, true)->Name("dispatch/libtorch_requires_grad/add")->Arg(1)->Arg(100);

void torch_add_scalar(benchmark::State& state) {
  const at::Tensor a = torch_input(state.range(0), 1);
  for (auto _ : state) {
    at::Tensor c = at::add(a, 1.f);
    benchmark::DoNotOptimize(c.data_ptr());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(torch_add_scalar)->Name("dispatch/libtorch/add_scalar")->Arg(1)->Arg(100);

void torch_chain3(benchmark::State& state) {
  const at::Tensor a = torch_input(state.range(0), 1), b = torch_input(state.range(0), 2);
  for (auto _ : state) {
    at::Tensor c = (a + b) * b - a;
    benchmark::DoNotOptimize(c.data_ptr());
  }
  state.SetItemsProcessed(3 * state.iterations());
}
BENCHMARK(torch_chain3)->Name("dispatch/libtorch/chain3")->Arg(1)->Arg(100);
#endif

}  // namespace

STAGECRAFT_BENCH_MAIN()
