// The optimizer update alone, over the Fashion-MNIST MLP's variables (784x256, 256, 256x256, 256,
// 256x10, 10: 269,322 f32 values) with fixed gradients, side by side in one run:
//   optim/<opt>/stagecraft      opt.apply(grads, vars): the fused loop per variable (eager)
//   optim/<opt>/stagecraft_staged  the same apply traced once by sc::function
//   optim/<opt>/hand_loop        the limit: one in-place loop per variable, same arithmetic
//   optim/<opt>/libtorch         torch::optim::<Opt>::step() on parameters holding the gradients
// <opt> is adam or adamw (weight decay 0.01).
#include <cmath>
#include <vector>

#include "bench_common.hpp"

#include <stagecraft/optim/adam.hpp>

#if STAGECRAFT_BENCH_TORCH
#include <torch/torch.h>
#endif

namespace {

const std::vector<sc::Shape> shapes{{784, 256}, {256}, {256, 256}, {256}, {256, 10}, {10}};
constexpr double lr = 1e-3, wd = 0.01;

struct State {
  std::vector<sc::Variable> vars;
  std::vector<sc::Tensor> grads;
  State() {
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      vars.emplace_back(bench::input(shapes[k], 10 + k) * 0.05f, "w" + std::to_string(k));
      grads.push_back(bench::input(shapes[k], 20 + k) * 0.01f);
    }
  }
};

template <bool Decayed>
void sc_apply(benchmark::State& state) {
  State s;
  sc::optim::AdamW opt(lr, Decayed ? wd : 0.0);
  for (auto _ : state) opt.apply(s.grads, s.vars);
  benchmark::DoNotOptimize(s.vars[0].value().raw_data());
}

template <bool Decayed>
void sc_staged_apply(benchmark::State& state) {
  State s;
  sc::optim::AdamW opt(lr, Decayed ? wd : 0.0);
  auto step = sc::function([&](std::vector<sc::Tensor> g) { opt.apply(g, s.vars); });
  for (auto _ : state) step(s.grads);
  benchmark::DoNotOptimize(s.vars[0].value().raw_data());
}

/// The limit: in place, one pass per variable (parallel for the big ones), the rate computed once.
template <bool Decayed>
void hand_loop(benchmark::State& state) {
  std::vector<std::vector<float>> w, g, m, v;
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    const auto n = static_cast<std::size_t>(shapes[k].numel());
    w.push_back((bench::input(shapes[k], 10 + k) * 0.05f).to_vector<float>());
    g.push_back((bench::input(shapes[k], 20 + k) * 0.01f).to_vector<float>());
    m.emplace_back(n, 0.f);
    v.emplace_back(n, 0.f);
  }
  const float a1 = 0.1f, a2 = 0.001f, eps = 1e-7f, d = static_cast<float>(lr * wd);
  std::int64_t t = 0;
  for (auto _ : state) {
    ++t;
    const auto r = static_cast<float>(lr * std::sqrt(1 - std::pow(0.999, t)) / (1 - std::pow(0.9, t)));
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      float *pw = w[k].data(), *pm = m[k].data(), *pv = v[k].data();
      const float* pg = g[k].data();
      const auto n = static_cast<std::int64_t>(w[k].size());
#pragma omp parallel for simd if (n > 32768)
      for (std::int64_t i = 0; i < n; ++i) {
        const float w0 = Decayed ? pw[i] - pw[i] * d : pw[i];
        const float mi = pm[i] + (pg[i] - pm[i]) * a1;
        const float vi = pv[i] + (pg[i] * pg[i] - pv[i]) * a2;
        pm[i] = mi;
        pv[i] = vi;
        pw[i] = w0 - mi * r / (std::sqrt(vi) + eps);
      }
    }
  }
  benchmark::DoNotOptimize(w[0].data());
}

#if STAGECRAFT_BENCH_TORCH
template <bool Decayed>
void torch_step(benchmark::State& state) {
  std::vector<torch::Tensor> params;
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    torch::Tensor p = bench::as_torch(bench::input(shapes[k], 10 + k) * 0.05f).clone().requires_grad_(true);
    p.mutable_grad() = bench::as_torch(bench::input(shapes[k], 20 + k) * 0.01f).clone();
    params.push_back(p);
  }
  if constexpr (Decayed) {
    torch::optim::AdamW opt(params, torch::optim::AdamWOptions(lr).weight_decay(wd).eps(1e-7));
    for (auto _ : state) opt.step();
  } else {
    torch::optim::Adam opt(params, torch::optim::AdamOptions(lr).eps(1e-7));
    for (auto _ : state) opt.step();
  }
  benchmark::DoNotOptimize(params[0].data_ptr());
}
#endif

BENCHMARK(sc_apply<false>)->Name("optim/adam/stagecraft")->UseRealTime();
BENCHMARK(sc_staged_apply<false>)->Name("optim/adam/stagecraft_staged")->UseRealTime();
BENCHMARK(hand_loop<false>)->Name("optim/adam/hand_loop")->UseRealTime();
BENCHMARK(sc_apply<true>)->Name("optim/adamw/stagecraft")->UseRealTime();
BENCHMARK(sc_staged_apply<true>)->Name("optim/adamw/stagecraft_staged")->UseRealTime();
BENCHMARK(hand_loop<true>)->Name("optim/adamw/hand_loop")->UseRealTime();
#if STAGECRAFT_BENCH_TORCH
BENCHMARK(torch_step<false>)->Name("optim/adam/libtorch")->UseRealTime();
BENCHMARK(torch_step<true>)->Name("optim/adamw/libtorch")->UseRealTime();
#endif

}  // namespace

STAGECRAFT_BENCH_MAIN()
