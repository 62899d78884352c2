// LibTorch's GPU rows beside bench_cuda's (issue 8): the same workloads under the same names with
// a /libtorch suffix. LibTorch only (no stagecraft header), so that on the lent GPU machine it
// compiles in under a minute against that machine's PyTorch (bench/gpu_session.sh), while
// bench_cuda comes prebuilt (bench/gpu_kit.sh); the two run back to back in one call on one GPU.
// Each timed iteration ends with a synchronize: a row is the GPU's time, not the time to queue.
// Convolutions and matmuls in full FP32 (TF32 off), as stagecraft's.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include <benchmark/benchmark.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "bench_timed.hpp"
#include "torch_models.hpp"

namespace {

constexpr std::int64_t big = std::int64_t{1} << 28;  // 256M floats, as bench_cuda
constexpr std::int64_t mm = 8192;
constexpr std::int64_t mlp_batch = 128, cnn_batch = 128;
constexpr int lstm_steps = 50, while_rounds = 100;

#if defined(SC_BENCH_TORCH_ON_CPU)
// A check of the rows' code where no GPU is (the same calls on the CPU): g++ -DSC_BENCH_TORCH_ON_CPU.
constexpr auto device = torch::kCPU;
bool torch_gpu(benchmark::State&) { return true; }
void sync() {}
#else
constexpr auto device = torch::kCUDA;
/// Skips the row where LibTorch has no GPU; else full FP32 convolutions (LibTorch lets cuDNN use
/// TF32 by default; its matmuls are FP32 by default).
bool torch_gpu(benchmark::State& state) {
  if (!torch::cuda::is_available()) {
    state.SkipWithError("LibTorch without CUDA");
    return false;
  }
  at::globalContext().setAllowTF32CuDNN(false);
  return true;
}
void sync() { torch::cuda::synchronize(); }
#endif
torch::TensorOptions on_gpu() { return torch::TensorOptions().device(device); }

/// Three untimed steps, then `step` timed, each iteration waiting for the GPU.
template <class Step>
void timed(benchmark::State& state, Step&& step) {
  bench::timed(state, step, sync);
}

void small_add(benchmark::State& state) {
  if (!torch_gpu(state)) return;
  const auto a = torch::ones({1}, on_gpu()), b = torch::ones({1}, on_gpu());
  constexpr int per_iter = 100;
  sync();
  for (auto _ : state) {
    for (int i = 0; i < per_iter; ++i) benchmark::DoNotOptimize(a + b);
    sync();
  }
  state.SetItemsProcessed(state.iterations() * per_iter);  // items/s: ops per second
}
BENCHMARK(small_add)->Name("cuda/small_add/libtorch")->UseRealTime();

void copy_d2d(benchmark::State& state) {
  if (!torch_gpu(state)) return;
  const auto x = torch::zeros({big}, on_gpu());
  auto y = torch::zeros({big}, on_gpu());
  timed(state, [&] { return y.copy_(x); });
  state.SetBytesProcessed(state.iterations() * 2 * big * 4);
}
BENCHMARK(copy_d2d)->Name("cuda/copy_d2d/256M/libtorch")->UseRealTime()->Unit(benchmark::kMillisecond);

void chain(benchmark::State& state) {
  if (!torch_gpu(state)) return;
  const std::int64_t n = state.range(0);
  torch::manual_seed(1);
  const auto x = torch::rand({n}, on_gpu()) * 2 - 1, a = torch::rand({n}, on_gpu()) * 2 - 1;
  const auto b = torch::rand({n}, on_gpu()) * 2 - 1, c = torch::rand({n}, on_gpu()) * 2 - 1;
  timed(state, [&] { return torch::tanh(x * a + b) * c - x / (1 + torch::exp(-x)); });
  state.SetBytesProcessed(state.iterations() * 5 * n * 4);  // four reads and one write
}
BENCHMARK(chain)->Name("cuda/chain9/libtorch")->Arg(1 << 20)->Arg(big)->UseRealTime()->Unit(benchmark::kMillisecond);

void sumsq(benchmark::State& state) {
  if (!torch_gpu(state)) return;
  const auto x = torch::rand({big}, on_gpu()), a = torch::rand({big}, on_gpu());
  timed(state, [&] { return torch::sum(torch::square(x - a)); });
  state.SetBytesProcessed(state.iterations() * 2 * big * 4);
}
BENCHMARK(sumsq)->Name("cuda/sumsq/256M/libtorch")->UseRealTime()->Unit(benchmark::kMillisecond);

void matmul(benchmark::State& state) {
  if (!torch_gpu(state)) return;
  const auto a = torch::randn({mm, mm}, on_gpu()), b = torch::randn({mm, mm}, on_gpu());
  timed(state, [&] { return torch::matmul(a, b); });
  state.counters["TFLOP/s"] = benchmark::Counter(2.0 * mm * mm * mm * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(matmul)->Name("cuda/matmul/8192/libtorch")->UseRealTime()->Unit(benchmark::kMillisecond);

/// One Adam step of Model on random images and labels at batch Batch.
template <class Model, std::int64_t Batch>
void adam_step(benchmark::State& state) {
  if (!torch_gpu(state)) return;
  const torch::Tensor x = torch::rand({Batch, 28, 28}, on_gpu());
  const torch::Tensor y = torch::randint(0, 10, {Batch}, on_gpu().dtype(torch::kLong));
  torch::manual_seed(0);
  Model model;
  model.to(device);
  torch::optim::Adam opt(model.parameters(), torch::optim::AdamOptions(1e-3));
  timed(state, [&] {
    opt.zero_grad();
    torch::Tensor loss = torch::nn::functional::cross_entropy(model.forward(x), y);
    loss.backward();
    opt.step();
    return loss;
  });
  state.counters["examples/s"] = benchmark::Counter(static_cast<double>(Batch), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK_TEMPLATE2(adam_step, bench::TorchMLP, mlp_batch)->Name("cuda/mlp_adam/batch128/libtorch")
    ->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE2(adam_step, bench::TorchCNN, cnn_batch)->Name("cuda/cnn_adam/batch128/libtorch")
    ->UseRealTime()->Unit(benchmark::kMicrosecond);

/// The 50-step LSTM cell 32 -> 64 at batch 1 with its backward pass (bench::LstmModel's workload).
void lstm(benchmark::State& state) {
  if (!torch_gpu(state)) return;
  torch::manual_seed(1);
  torch::nn::LSTMCell cell(32, 64);
  cell->to(device);
  std::vector<torch::Tensor> xs;
  for (int t = 0; t < lstm_steps; ++t) xs.push_back(torch::rand({1, 32}, on_gpu()) * 4 - 2);
  timed(state, [&] {
    cell->zero_grad();
    auto hc = std::make_tuple(torch::zeros({1, 64}, on_gpu()), torch::zeros({1, 64}, on_gpu()));
    for (const auto& xt : xs) hc = cell(xt, hc);
    torch::Tensor loss = std::get<0>(hc).sum();
    loss.backward();
    return loss;
  });
}
BENCHMARK(lstm)->Name("cuda/lstm50/libtorch")->UseRealTime()->Unit(benchmark::kMicrosecond);

/// 100 rounds of x <- 0.9 x + 0.1 tanh(x) over [64, 64], the test read on the host as eager code must.
void while_loop(benchmark::State& state) {
  if (!torch_gpu(state)) return;
  const torch::Tensor x0 = torch::rand({64, 64}, on_gpu()) * 2 - 1, n0 = torch::zeros({}, on_gpu());
  timed(state, [&] {
    torch::Tensor v = x0, k = n0;
    while ((k < static_cast<float>(while_rounds)).item<bool>()) {
      v = v * 0.9f + torch::tanh(v) * 0.1f;
      k = k + 1.f;
    }
    return v;
  });
}
BENCHMARK(while_loop)->Name("cuda/while100/libtorch")->UseRealTime()->Unit(benchmark::kMicrosecond);

/// The CNN's second layer at batch 128 ([128, 32, 14, 14] by [64, 32, 3, 3], padding 1): forward,
/// input gradient and kernel gradient through ATen's convolution and its backward (cuDNN).
void conv_layer(benchmark::State& state) {
  if (!torch_gpu(state)) return;
  const torch::Tensor x = torch::rand({cnn_batch, 32, 14, 14}, on_gpu()) * 2 - 1;
  const torch::Tensor w = (torch::rand({64, 32, 3, 3}, on_gpu()) - 0.5) * 0.2;
  const torch::Tensor g = torch::rand({cnn_batch, 64, 14, 14}, on_gpu()) * 2 - 1;
  timed(state, [&] {
    const torch::Tensor y = at::conv2d(x, w, {}, 1, 1);
    const auto [dx, dw, db] = at::convolution_backward(g, x, w, at::OptionalIntArrayRef{}, {1, 1}, {1, 1}, {1, 1}, false,
                                                       {0, 0}, 1, {true, true, false});
    return std::make_tuple(y, dx, dw);
  });
  constexpr double flop = 3.0 * 2 * cnn_batch * 64 * 14 * 14 * 32 * 3 * 3;  // bench_cuda's layer_flop
  state.counters["TFLOP/s"] = benchmark::Counter(flop * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(conv_layer)->Name("cuda/conv2d/32x14x14_to_64/libtorch")->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace

/// main(): LibTorch's CPU threads as bench_cuda's ($STAGECRAFT_BENCH_THREADS, else 2), then
/// Google Benchmark's usual flags.
int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const char* s = std::getenv("STAGECRAFT_BENCH_THREADS");
  const int threads = s && std::atoi(s) > 0 ? std::atoi(s) : 2;
  at::set_num_threads(threads);
  benchmark::AddCustomContext("threads", std::to_string(threads));
  benchmark::AddCustomContext("libtorch", TORCH_VERSION);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
