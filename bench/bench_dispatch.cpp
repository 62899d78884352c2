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

// Taping: a tape made, 100 one-element adds recorded on it, the tape dropped (per op: the
// eager add, its recording and its share of freeing the tape). Items are adds.
void sc_taped_adds(benchmark::State& state) {
  const sc::Tensor x = bench::input({1}, 1), b = bench::input({1}, 2);
  for (auto _ : state) {
    sc::GradientTape tape;
    tape.watch(x);
    sc::Tensor y = x;
    for (int i = 0; i < 100; ++i) y = y + b;
    benchmark::DoNotOptimize(y.raw_data());
  }
  state.SetItemsProcessed(100 * state.iterations());
}
BENCHMARK(sc_taped_adds)->Name("dispatch/stagecraft/taped_add_x100");

// The same 100 adds with no tape (the difference is the cost of recording).
void sc_untaped_adds(benchmark::State& state) {
  const sc::Tensor x = bench::input({1}, 1), b = bench::input({1}, 2);
  for (auto _ : state) {
    sc::Tensor y = x;
    for (int i = 0; i < 100; ++i) y = y + b;
    benchmark::DoNotOptimize(y.raw_data());
  }
  state.SetItemsProcessed(100 * state.iterations());
}
BENCHMARK(sc_untaped_adds)->Name("dispatch/stagecraft/untaped_add_x100");

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

// LibTorch's autograd: 100 one-element adds from a leaf that requires grad (the graph is built
// as they run), the graph dropped with the last result.
void torch_taped_adds(benchmark::State& state) {
  const at::Tensor x = torch_input(1, 1, true), b = torch_input(1, 2);
  for (auto _ : state) {
    at::Tensor y = x;
    for (int i = 0; i < 100; ++i) y = at::add(y, b);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  state.SetItemsProcessed(100 * state.iterations());
}
BENCHMARK(torch_taped_adds)->Name("dispatch/libtorch/taped_add_x100");

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
