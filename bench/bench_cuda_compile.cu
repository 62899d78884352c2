// sc::compile in a file nvcc compiles (part of bench_cuda, beside its eager, traced and LibTorch
// rows): the 9-op chain tanh(x*a + b)*c - x/(1 + exp(-x)) as one templated kernel
// (staged/cuda_kernel.hpp), compiled with this file, no NVRTC. Each timed loop ends with a
// synchronize. Without a GPU the rows say so and skip.
#include <benchmark/benchmark.h>

#include <stagecraft/stagecraft.hpp>

namespace {

void chain_compiled_nvcc(benchmark::State& state) {
  if (!sc::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const std::int64_t n = state.range(0);
  sc::staging::gpu::vector_loads() = state.range(1) != 0;  // 16-byte accesses, or one element per access
  sc::Tensor x, a, b, c;
  {
    const sc::DeviceScope on(sc::Device::cuda(0));  // the inputs of bench_cuda.cpp's chain rows
    x = sc::random::uniform({n}, -1.0, 1.0, 1);
    a = sc::random::uniform({n}, -1.0, 1.0, 2);
    b = sc::random::uniform({n}, -1.0, 1.0, 3);
    c = sc::random::uniform({n}, -1.0, 1.0, 4);
  }
  auto f = sc::compile([](const auto& x_, const auto& a_, const auto& b_, const auto& c_) {
    return sc::tanh(x_ * a_ + b_) * c_ - x_ / (1.f + sc::exp(-x_));
  });
  benchmark::DoNotOptimize(f(x, a, b, c));
  sc::cuda::synchronize();
  for (auto _ : state) {
    benchmark::DoNotOptimize(f(x, a, b, c));
    sc::cuda::synchronize();
  }
  state.SetBytesProcessed(state.iterations() * 5 * n * 4);  // four reads and one write
  sc::staging::gpu::vector_loads() = true;
}
BENCHMARK(chain_compiled_nvcc)
    ->Name("cuda/chain9/compiled_nvcc")
    ->ArgNames({"n", "vec16"})
    ->Args({1 << 20, 1})
    ->Args({std::int64_t{1} << 28, 1})
    ->Args({std::int64_t{1} << 28, 0})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
