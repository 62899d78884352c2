// A conv2d layer: batch 32, 1->32 channels, 3x3, 28x28 input, padding 1 (the first layer of
// a small MNIST CNN): stagecraft's sc::nn::conv2d vs LibTorch's at::conv2d in one run.
#include "bench_common.hpp"

namespace {

constexpr std::int64_t batch = 32, in_ch = 1, out_ch = 32, kernel = 3, size = 28, pad = 1;

void flops(benchmark::State& state) {
  const double f = 2.0 * batch * out_ch * size * size * in_ch * kernel * kernel;  // stride 1, same size
  state.counters["FLOPS"] = benchmark::Counter(f, benchmark::Counter::kIsIterationInvariantRate);
  state.SetItemsProcessed(state.iterations() * batch);  // images per second
}

void sc_conv(benchmark::State& state) {
  const sc::Tensor x = bench::input({batch, in_ch, size, size}, 1), w = bench::input({out_ch, in_ch, kernel, kernel}, 2);
  for (auto _ : state) {
    sc::Tensor y = sc::nn::conv2d(x, w, 1, pad);
    benchmark::DoNotOptimize(y.raw_data());
  }
  flops(state);
}
BENCHMARK(sc_conv)->Name("conv2d_32x1x28x28_k3_o32/stagecraft")->UseRealTime();

#if STAGECRAFT_BENCH_TORCH
void torch_conv(benchmark::State& state) {
  const sc::Tensor sx = bench::input({batch, in_ch, size, size}, 1), sw = bench::input({out_ch, in_ch, kernel, kernel}, 2);
  const at::Tensor x = bench::as_torch(sx), w = bench::as_torch(sw);
  for (auto _ : state) {
    at::Tensor y = at::conv2d(x, w, {}, 1, pad);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  flops(state);
}
BENCHMARK(torch_conv)->Name("conv2d_32x1x28x28_k3_o32/libtorch")->UseRealTime();
#endif

}  // namespace

STAGECRAFT_BENCH_MAIN()
