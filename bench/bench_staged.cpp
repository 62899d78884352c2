// Staged (sc::function) against eager and LibTorch eager, side by side in one run: small-op
// models at batch 1 (an LSTM cell unrolled 50 steps with its backward pass; an L2HMC-shaped
// leapfrog integrator) and the 9-op elementwise chain over 16M floats. The hand-written limit of
// the chain is in bench_fusion; the MLP training step staged is in bench_train.
//   staged/lstm/<lib> (eager: the cell staged, its default; eager_ops: its ops one by one),
//   staged/leapfrog/<lib>, staged/chain9/<lib>
#include "bench_models.hpp"

#include <cmath>
#include <vector>

#if STAGECRAFT_BENCH_TORCH
#include <torch/torch.h>
#endif

namespace {

// ---- LSTM: 32 -> 64, batch 1, 50 steps, loss = sum(h_50), gradients of the cell's variables --------

using bench::LstmModel;
using bench::lstm_steps;

/// Eager code: each step is the cell's own staged function (sc::nn::lstm_cell_staging(), the
/// default), or with `ops` its ops dispatched one by one.
void lstm_eager(benchmark::State& state, bool ops) {
  sc::manual_seed(1);
  LstmModel m;
  const auto vars = m.cell.trainable_variables();
  const bool was = sc::nn::lstm_cell_staging();
  sc::nn::lstm_cell_staging() = !ops;
  for (auto _ : state) benchmark::DoNotOptimize(m.step(vars).raw_data());
  sc::nn::lstm_cell_staging() = was;
}

void lstm_staged(benchmark::State& state) {
  sc::manual_seed(1);
  LstmModel m;
  const auto vars = m.cell.trainable_variables();
  auto f = sc::function([&](sc::Tensor) { return m.step(vars); }, "lstm");
  const sc::Tensor dummy = sc::zeros({1});
  f(dummy);
  const auto stats = f.get_concrete(dummy).stats();
  for (auto _ : state) benchmark::DoNotOptimize(f(dummy).raw_data());
  state.counters["plan_steps"] = stats.plan.steps;
  state.counters["ns/step"] = benchmark::Counter(static_cast<double>(stats.plan.steps),
                                                 benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// ---- L2HMC-shaped leapfrog: 10 steps, dim 2, batch 1; small tanh nets scale and shift the momentum --

constexpr int leap_steps = 10;
constexpr float eps = 0.1f;

struct Leapfrog {
  sc::nn::Dense s1{2, 10}, s2{10, 2}, t1{2, 10}, t2{10, 2};
  sc::Tensor a = sc::tensor({{1.5f, 0.3f}, {0.3f, 0.8f}});  // U(x) = 0.5 x A x^T
  sc::Tensor grad_u(const sc::Tensor& x) const { return sc::matmul(x, a); }
  std::pair<sc::Tensor, sc::Tensor> run(sc::Tensor x, sc::Tensor v) const {
    for (int k = 0; k < leap_steps; ++k) {
      const sc::Tensor s = s2(sc::tanh(s1(x))), t = t2(sc::tanh(t1(x)));
      v = v * sc::exp(s * (0.5f * eps)) - (grad_u(x) + t) * (0.5f * eps);
      x = x + v * eps;
      v = v - grad_u(x) * (0.5f * eps);
    }
    return {x, v};
  }
};

void leapfrog_eager(benchmark::State& state) {
  sc::manual_seed(2);
  Leapfrog m;
  const sc::Tensor x = sc::tensor({{0.5f, -0.3f}}), v = sc::tensor({{0.1f, 0.2f}});
  for (auto _ : state) benchmark::DoNotOptimize(m.run(x, v).first.raw_data());
}

void leapfrog_staged(benchmark::State& state) {
  sc::manual_seed(2);
  Leapfrog m;
  const sc::Tensor x = sc::tensor({{0.5f, -0.3f}}), v = sc::tensor({{0.1f, 0.2f}});
  auto f = sc::function([&](sc::Tensor x0, sc::Tensor v0) {
    auto [x1, v1] = m.run(x0, v0);
    return std::make_tuple(x1, v1);
  }, "leapfrog");
  for (auto _ : state) benchmark::DoNotOptimize(std::get<0>(f(x, v)).raw_data());
}

// ---- the 9-op chain tanh(x*a + b)*c - x/(1 + exp(-x)) over 16M floats ----------------------------------

constexpr std::int64_t chain_n = std::int64_t{1} << 24;

sc::Tensor chain(const sc::Tensor& x, const sc::Tensor& a, const sc::Tensor& b, const sc::Tensor& c) {
  return sc::tanh(x * a + b) * c - x / (1.f + sc::exp(-x));
}

struct ChainInputs {
  sc::Tensor x = bench::input({chain_n}, 1), a = bench::input({chain_n}, 2), b = bench::input({chain_n}, 3),
             c = bench::input({chain_n}, 4);
};

void chain_eager(benchmark::State& state) {
  const ChainInputs in;
  for (auto _ : state) benchmark::DoNotOptimize(chain(in.x, in.a, in.b, in.c).raw_data());
  state.SetBytesProcessed(state.iterations() * chain_n * 5 * 4);
}

void chain_staged(benchmark::State& state) {
  const ChainInputs in;
  auto f = sc::function(chain, "chain9");
  for (auto _ : state) benchmark::DoNotOptimize(f(in.x, in.a, in.b, in.c).raw_data());
  state.SetBytesProcessed(state.iterations() * chain_n * 5 * 4);
}

#if STAGECRAFT_BENCH_TORCH
void lstm_torch(benchmark::State& state) {
  torch::manual_seed(1);
  torch::nn::LSTMCell cell(32, 64);
  std::vector<torch::Tensor> xs;
  for (int t = 0; t < lstm_steps; ++t) xs.push_back(bench::as_torch(bench::input({1, 32}, 100 + t)).clone());
  for (auto _ : state) {
    cell->zero_grad();
    auto hc = std::make_tuple(torch::zeros({1, 64}), torch::zeros({1, 64}));
    for (const auto& x : xs) hc = cell(x, hc);
    torch::Tensor loss = std::get<0>(hc).sum();
    loss.backward();
    benchmark::DoNotOptimize(loss.data_ptr());
  }
}

void leapfrog_torch(benchmark::State& state) {
  torch::NoGradGuard ng;
  torch::manual_seed(2);
  torch::nn::Linear s1(2, 10), s2(10, 2), t1(2, 10), t2(10, 2);
  const torch::Tensor a = torch::tensor({{1.5f, 0.3f}, {0.3f, 0.8f}});
  const torch::Tensor x0 = torch::tensor({{0.5f, -0.3f}}), v0 = torch::tensor({{0.1f, 0.2f}});
  for (auto _ : state) {
    torch::Tensor x = x0, v = v0;
    for (int k = 0; k < leap_steps; ++k) {
      const torch::Tensor s = s2(torch::tanh(s1(x))), t = t2(torch::tanh(t1(x)));
      v = v * torch::exp(s * (0.5f * eps)) - (torch::matmul(x, a) + t) * (0.5f * eps);
      x = x + v * eps;
      v = v - torch::matmul(x, a) * (0.5f * eps);
    }
    benchmark::DoNotOptimize(x.data_ptr());
  }
}

void chain_torch(benchmark::State& state) {
  const ChainInputs in;
  const torch::Tensor x = bench::as_torch(in.x), a = bench::as_torch(in.a), b = bench::as_torch(in.b),
                      c = bench::as_torch(in.c);
  for (auto _ : state) {
    torch::Tensor r = torch::tanh(x * a + b) * c - x / (1 + torch::exp(-x));
    benchmark::DoNotOptimize(r.data_ptr());
  }
  state.SetBytesProcessed(state.iterations() * chain_n * 5 * 4);
}
#endif

BENCHMARK_CAPTURE(lstm_eager, cell, false)->Name("staged/lstm/eager")->UseRealTime();
BENCHMARK_CAPTURE(lstm_eager, ops, true)->Name("staged/lstm/eager_ops")->UseRealTime();
BENCHMARK(lstm_staged)->Name("staged/lstm/staged")->UseRealTime();
BENCHMARK(leapfrog_eager)->Name("staged/leapfrog/eager")->UseRealTime();
BENCHMARK(leapfrog_staged)->Name("staged/leapfrog/staged")->UseRealTime();
BENCHMARK(chain_eager)->Name("staged/chain9/eager")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(chain_staged)->Name("staged/chain9/staged")->UseRealTime()->Unit(benchmark::kMillisecond);
#if STAGECRAFT_BENCH_TORCH
BENCHMARK(lstm_torch)->Name("staged/lstm/libtorch")->UseRealTime();
BENCHMARK(leapfrog_torch)->Name("staged/leapfrog/libtorch")->UseRealTime();
BENCHMARK(chain_torch)->Name("staged/chain9/libtorch")->UseRealTime()->Unit(benchmark::kMillisecond);
#endif

}  // namespace

STAGECRAFT_BENCH_MAIN()
