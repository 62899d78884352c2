// Activations and layer norm, side by side in one run: a hand-written loop (the limit: one pass,
// <cmath> per element, OpenMP) vs stagecraft eager (as a user gets it: a large CPU tensor's
// composite runs as a staged function, nn/composite.hpp) vs eager_ops (the composite's ops one by
// one, nn::composite_staging() off: a pass each) vs traced (sc::function: the ops fused into one pass) vs compiled (sc::compile, for the elementwise
// ones) vs LibTorch's native kernels (when built in). gelu and softplus on 4M floats, layer_norm and
// softmax on [4096, 1024] rows (traced also without row chains and rematerialization, for the ratios),
// and a layer_norm training step's gradients (x, gamma and beta of sum(layer_norm(x) * r)).
#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include <omp.h>

#include "bench_common.hpp"

#if STAGECRAFT_BENCH_TORCH
#include <torch/torch.h>
#endif

namespace {

constexpr std::int64_t n_elems = std::int64_t{1} << 22;
constexpr std::int64_t rows = 4096, cols = 1024;

enum class Fn { gelu, softplus };

const sc::Tensor& x_elems() {
  static const sc::Tensor x = sc::random::uniform({n_elems}, -4.0, 4.0, 1);
  return x;
}
const sc::Tensor& x_rows() {
  static const sc::Tensor x = sc::random::uniform({rows, cols}, -4.0, 4.0, 2);
  return x;
}

void count(benchmark::State& state, std::int64_t n) {
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * 2 * std::int64_t{sizeof(float)});
}

/// Eager composites staged (the default) or op by op while alive.
using Staging = sc::nn::CompositeStagingScope;

sc::Tensor sc_call(Fn f, const sc::Tensor& x) {
  return f == Fn::gelu ? sc::nn::gelu(x) : sc::nn::softplus(x);
}

void eager(benchmark::State& state, Fn f, bool staged) {
  const Staging mode(staged);
  const sc::Tensor& x = x_elems();
  for (auto _ : state) {
    sc::Tensor y = sc_call(f, x);
    benchmark::DoNotOptimize(y.raw_data());
  }
  count(state, n_elems);
}

void traced(benchmark::State& state, Fn f) {
  const sc::Tensor& x = x_elems();
  auto fn = sc::function([f](const sc::Tensor& a) { return sc_call(f, a); });
  (void)fn(x);
  for (auto _ : state) {
    sc::Tensor y = fn(x);
    benchmark::DoNotOptimize(y.raw_data());
  }
  count(state, n_elems);
}

void compiled(benchmark::State& state, Fn f) {
  const sc::Tensor& x = x_elems();
  auto run = [&](auto g) {
    for (auto _ : state) {
      sc::Tensor y = g(x);
      benchmark::DoNotOptimize(y.raw_data());
    }
  };
  if (f == Fn::gelu) run(sc::compile<sc::f32>([](auto a) { return sc::nn::gelu(a); }));
  else run(sc::compile<sc::f32>([](auto a) { return sc::nn::softplus(a); }));
  count(state, n_elems);
}

void hand(benchmark::State& state, Fn f) {
  const sc::Tensor& x = x_elems();
  const sc::Tensor out = sc::zeros({n_elems});
  const float* __restrict a = static_cast<const float*>(x.raw_data());
  float* __restrict y = static_cast<float*>(out.raw_data());
  for (auto _ : state) {
    if (f == Fn::gelu) {
#pragma omp parallel for simd
      for (std::int64_t i = 0; i < n_elems; ++i) y[i] = 0.5f * a[i] * (1.f + std::erf(a[i] * 0.70710678f));
    } else {
#pragma omp parallel for simd
      for (std::int64_t i = 0; i < n_elems; ++i) y[i] = std::fmax(a[i], 0.f) + std::log1p(std::exp(-std::fabs(a[i])));
    }
    benchmark::DoNotOptimize(y);
    benchmark::ClobberMemory();
  }
  count(state, n_elems);
}

void layer_norm_eager(benchmark::State& state, bool staged) {
  const Staging mode(staged);
  const sc::Tensor& x = x_rows();
  for (auto _ : state) {
    sc::Tensor y = sc::nn::layer_norm(x, {cols});
    benchmark::DoNotOptimize(y.raw_data());
  }
  count(state, rows * cols);
}

/// How the traced plan is lowered: as by default (x - mean computed again in the last group, the
/// steps run a block of rows at a time), without row chains, or without either.
enum class Lowering { full, no_chains, neither };

/// f traced with the lowering `how` (the switches apply when it is traced, at its first call).
template <class F>
auto traced_with(Lowering how, F f, const sc::Tensor& x) {
  const bool remat = sc::graph::rematerialize(), chains = sc::graph::row_chains();
  sc::graph::rematerialize() = how != Lowering::neither;
  sc::graph::row_chains() = how == Lowering::full;
  auto fn = sc::function(f);
  (void)fn(x);
  sc::graph::rematerialize() = remat;
  sc::graph::row_chains() = chains;
  return fn;
}

void layer_norm_traced(benchmark::State& state, Lowering how) {
  const sc::Tensor& x = x_rows();
  auto fn = traced_with(how, [](const sc::Tensor& a) { return sc::nn::layer_norm(a, {cols}); }, x);
  for (auto _ : state) {
    sc::Tensor y = fn(x);
    benchmark::DoNotOptimize(y.raw_data());
  }
  count(state, rows * cols);
}

const sc::Tensor& r_rows() {
  static const sc::Tensor r = sc::random::uniform({rows, cols}, -1.0, 1.0, 3);
  return r;
}

/// sum(layer_norm(x, gamma, beta) * r) and its gradients with respect to x, gamma and beta.
std::vector<sc::Tensor> layer_norm_step(const sc::Tensor& x, const sc::Tensor& r, const sc::Tensor& gamma,
                                        const sc::Tensor& beta) {
  sc::GradientTape tape;
  tape.watch(x);
  tape.watch(gamma);
  tape.watch(beta);
  const sc::Tensor loss = sc::sum(sc::nn::layer_norm(x, {cols}, gamma, beta) * r);
  std::vector<sc::Tensor> out = tape.gradient(loss, {x, gamma, beta});
  out.push_back(loss);
  return out;
}

/// The training step's gradients, eager (traced: false) or as one sc::function (with `columns`
/// off: its column sums, gamma's and beta's gradients, as reduction kernels, not in fused groups).
void layer_norm_grad(benchmark::State& state, bool traced, bool staged = true, bool columns = true) {
  const Staging mode(staged);
  const bool columns_were = sc::graph::column_reductions();
  sc::graph::column_reductions() = columns;
  const sc::Tensor &x = x_rows(), &r = r_rows();
  const sc::Tensor gamma = sc::random::uniform({cols}, 0.5, 1.5, 4), beta = sc::random::uniform({cols}, -1.0, 1.0, 5);
  auto fn = sc::function([](const sc::Tensor& a, const sc::Tensor& b, const sc::Tensor& c, const sc::Tensor& d) {
    const std::vector<sc::Tensor> o = layer_norm_step(a, b, c, d);
    return std::make_tuple(o[0], o[1], o[2], o[3]);
  });
  if (traced) (void)fn(x, r, gamma, beta);
  // The step's memory high-water mark above what lives across steps (its residuals among it).
  sc::reset_peak_memory();
  const std::size_t live = sc::memory_stats().bytes_in_use;
  for (auto _ : state) {
    if (traced) {
      auto out = fn(x, r, gamma, beta);
      benchmark::DoNotOptimize(std::get<0>(out).raw_data());
    } else {
      std::vector<sc::Tensor> out = layer_norm_step(x, r, gamma, beta);
      benchmark::DoNotOptimize(out[0].raw_data());
    }
  }
  state.counters["peak_MB"] = static_cast<double>(sc::memory_stats().peak_bytes_in_use - live) / 1e6;
  sc::graph::column_reductions() = columns_were;
  count(state, rows * cols);
}

void softmax_eager(benchmark::State& state, bool staged) {
  const Staging mode(staged);
  const sc::Tensor& x = x_rows();
  for (auto _ : state) {
    sc::Tensor y = sc::nn::softmax(x, -1);
    benchmark::DoNotOptimize(y.raw_data());
  }
  count(state, rows * cols);
}

void softmax_traced(benchmark::State& state, Lowering how) {
  const sc::Tensor& x = x_rows();
  auto fn = traced_with(how, [](const sc::Tensor& a) { return sc::nn::softmax(a, -1); }, x);
  for (auto _ : state) {
    sc::Tensor y = fn(x);
    benchmark::DoNotOptimize(y.raw_data());
  }
  count(state, rows * cols);
}

void layer_norm_hand(benchmark::State& state) {
  const sc::Tensor& x = x_rows();
  const sc::Tensor out = sc::zeros({rows, cols});
  const float* a = static_cast<const float*>(x.raw_data());
  float* y = static_cast<float*>(out.raw_data());
  for (auto _ : state) {
#pragma omp parallel for
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xr = a + r * cols;
      float* yr = y + r * cols;
      float m = 0, v = 0;
#pragma omp simd reduction(+ : m)
      for (std::int64_t k = 0; k < cols; ++k) m += xr[k];
      m /= static_cast<float>(cols);
#pragma omp simd reduction(+ : v)
      for (std::int64_t k = 0; k < cols; ++k) v += (xr[k] - m) * (xr[k] - m);
      const float inv = 1.f / std::sqrt(v / static_cast<float>(cols) + 1e-5f);
#pragma omp simd
      for (std::int64_t k = 0; k < cols; ++k) yr[k] = (xr[k] - m) * inv;
    }
    benchmark::DoNotOptimize(y);
    benchmark::ClobberMemory();
  }
  count(state, rows * cols);
}

#if STAGECRAFT_BENCH_TORCH
void torch_fn(benchmark::State& state, Fn f) {
  torch::NoGradGuard ng;
  const at::Tensor x = bench::as_torch(x_elems());
  for (auto _ : state) {
    at::Tensor y = f == Fn::gelu ? torch::gelu(x) : torch::softplus(x);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  count(state, n_elems);
}
void layer_norm_torch(benchmark::State& state) {
  torch::NoGradGuard ng;
  const at::Tensor x = bench::as_torch(x_rows());
  for (auto _ : state) {
    at::Tensor y = torch::layer_norm(x, {cols});
    benchmark::DoNotOptimize(y.data_ptr());
  }
  count(state, rows * cols);
}
void layer_norm_grad_torch(benchmark::State& state) {
  const at::Tensor x = bench::as_torch(x_rows()).clone().requires_grad_(true), r = bench::as_torch(r_rows());
  const at::Tensor gamma = torch::rand({cols}).add_(0.5).requires_grad_(true);
  const at::Tensor beta = torch::rand({cols}).sub_(0.5).requires_grad_(true);
  for (auto _ : state) {
    const at::Tensor loss = (torch::layer_norm(x, {cols}, gamma, beta) * r).sum();
    const std::vector<at::Tensor> g = torch::autograd::grad({loss}, {x, gamma, beta});
    benchmark::DoNotOptimize(g[0].data_ptr());
  }
  count(state, rows * cols);
}
void softmax_torch(benchmark::State& state) {
  torch::NoGradGuard ng;
  const at::Tensor x = bench::as_torch(x_rows());
  for (auto _ : state) {
    at::Tensor y = torch::softmax(x, -1);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  count(state, rows * cols);
}
#endif

}  // namespace

BENCHMARK_CAPTURE(hand, gelu, Fn::gelu)->UseRealTime();
BENCHMARK_CAPTURE(eager, gelu, Fn::gelu, true)->UseRealTime();
BENCHMARK_CAPTURE(eager, gelu_ops, Fn::gelu, false)->UseRealTime();
BENCHMARK_CAPTURE(traced, gelu, Fn::gelu)->UseRealTime();
BENCHMARK_CAPTURE(compiled, gelu, Fn::gelu)->UseRealTime();
BENCHMARK_CAPTURE(hand, softplus, Fn::softplus)->UseRealTime();
BENCHMARK_CAPTURE(eager, softplus, Fn::softplus, true)->UseRealTime();
BENCHMARK_CAPTURE(eager, softplus_ops, Fn::softplus, false)->UseRealTime();
BENCHMARK_CAPTURE(traced, softplus, Fn::softplus)->UseRealTime();
BENCHMARK_CAPTURE(compiled, softplus, Fn::softplus)->UseRealTime();
BENCHMARK(layer_norm_hand)->UseRealTime();
BENCHMARK_CAPTURE(layer_norm_eager, staged, true)->UseRealTime();
BENCHMARK_CAPTURE(layer_norm_eager, ops, false)->UseRealTime();
BENCHMARK_CAPTURE(layer_norm_traced, full, Lowering::full)->UseRealTime();
BENCHMARK_CAPTURE(layer_norm_traced, no_row_chains, Lowering::no_chains)->UseRealTime();
BENCHMARK_CAPTURE(layer_norm_traced, no_chains_no_remat, Lowering::neither)->UseRealTime();
BENCHMARK_CAPTURE(layer_norm_grad, eager, false)->UseRealTime();
BENCHMARK_CAPTURE(layer_norm_grad, eager_ops, false, false)->UseRealTime();
BENCHMARK_CAPTURE(layer_norm_grad, traced, true)->UseRealTime();
BENCHMARK_CAPTURE(layer_norm_grad, traced_no_columns, true, true, false)->UseRealTime();
BENCHMARK_CAPTURE(softmax_eager, staged, true)->UseRealTime();
BENCHMARK_CAPTURE(softmax_eager, ops, false)->UseRealTime();
BENCHMARK_CAPTURE(softmax_traced, full, Lowering::full)->UseRealTime();
BENCHMARK_CAPTURE(softmax_traced, no_row_chains, Lowering::no_chains)->UseRealTime();
#if STAGECRAFT_BENCH_TORCH
BENCHMARK_CAPTURE(torch_fn, gelu, Fn::gelu)->UseRealTime();
BENCHMARK_CAPTURE(torch_fn, softplus, Fn::softplus)->UseRealTime();
BENCHMARK(layer_norm_torch)->UseRealTime();
BENCHMARK(softmax_torch)->UseRealTime();
BENCHMARK(layer_norm_grad_torch)->UseRealTime();
#endif

STAGECRAFT_BENCH_MAIN()
