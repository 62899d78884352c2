// GPU benchmarks (issue 8), side by side in one run on one GPU: an eager small op (launch cost,
// asynchronous), a device-to-device copy (the bandwidth line), the 9-op chain
// tanh(x*a + b)*c - x/(1 + exp(-x)) eager and traced (one generated kernel), matmul 8192^3 against
// cuBLAS called directly, a whole-tensor sum of squares eager and traced. LibTorch's rows are
// bench_cuda_torch (same names, /libtorch), run right after this one by bench/gpu_session.sh.
// Every timed loop ends with a synchronize, so a row is the time the GPU needed, not the time to
// queue the work.
// Without a GPU each benchmark says so and skips.
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stagecraft/stagecraft.hpp>

namespace {

const sc::Device gpu = sc::Device::cuda(0);

/// False, with the row marked as skipped for `why`, when `available` is false.
bool runs(benchmark::State& state, bool available, const char* why) {
  if (!available) state.SkipWithError(why);
  return available;
}
bool need_gpu(benchmark::State& state) { return runs(state, sc::cuda::is_available(), "no CUDA device"); }

// ---- launch cost: one-element adds, queued back to back ------------------------------------------

// Batched (sc::cuda::eager_batching, the default): up to 64 adds share a launch; unbatched: one
// launch per add, the launch path's own cost.
void small_add(benchmark::State& state, bool batched) {
  if (!need_gpu(state)) return;
  const bool was = sc::cuda::eager_batching();
  sc::cuda::set_eager_batching(batched);
  const sc::Tensor a = sc::full({1}, 1.f).to(gpu), b = sc::full({1}, 2.f).to(gpu);
  sc::cuda::synchronize();
  constexpr int per_iter = 100;
  for (auto _ : state) {
    for (int i = 0; i < per_iter; ++i) benchmark::DoNotOptimize(a + b);
    sc::cuda::synchronize();
  }
  state.SetItemsProcessed(state.iterations() * per_iter);  // items/s: ops per second
  sc::cuda::set_eager_batching(was);
}
BENCHMARK_CAPTURE(small_add, batched, true)->Name("cuda/small_add/stagecraft")->UseRealTime();
BENCHMARK_CAPTURE(small_add, unbatched, false)->Name("cuda/small_add/stagecraft_unbatched")->UseRealTime();

// ---- bandwidth: the library's device-to-device copy ----------------------------------------------

constexpr std::int64_t big = std::int64_t{1} << 28;  // 256M floats, 1 GiB per tensor

void copy_d2d(benchmark::State& state) {
  if (!need_gpu(state)) return;
  const sc::DeviceScope on(gpu);
  const sc::Tensor x = sc::zeros({big}), y = sc::zeros({big});
  for (auto _ : state) {
    sc::cuda::detail::copy(y.raw_data(), gpu, x.raw_data(), gpu, x.nbytes(), "copy", std::source_location::current());
    sc::cuda::synchronize();
  }
  state.SetBytesProcessed(state.iterations() * 2 * x.nbytes());
}
BENCHMARK(copy_d2d)->Name("cuda/copy_d2d/256M")->UseRealTime()->Unit(benchmark::kMillisecond);

// ---- the 9-op chain ------------------------------------------------------------------------------

sc::Tensor chain9(const sc::Tensor& x, const sc::Tensor& a, const sc::Tensor& b, const sc::Tensor& c) {
  return sc::tanh(x * a + b) * c - x / (1.f + sc::exp(-x));
}

struct ChainInputs {
  sc::Tensor x, a, b, c;
  explicit ChainInputs(std::int64_t n) {
    const sc::DeviceScope on(gpu);  // drawn on the GPU (the same numbers as the CPU's)
    x = sc::random::uniform({n}, -1.0, 1.0, 1);
    a = sc::random::uniform({n}, -1.0, 1.0, 2);
    b = sc::random::uniform({n}, -1.0, 1.0, 3);
    c = sc::random::uniform({n}, -1.0, 1.0, 4);
  }
};

void chain_eager(benchmark::State& state) {
  if (!need_gpu(state)) return;
  const std::int64_t n = state.range(0);
  const ChainInputs in(n);
  for (auto _ : state) {
    benchmark::DoNotOptimize(chain9(in.x, in.a, in.b, in.c));
    sc::cuda::synchronize();
  }
  state.SetBytesProcessed(state.iterations() * 5 * n * 4);  // four reads and one write
}
BENCHMARK(chain_eager)->Name("cuda/chain9/eager")->Arg(1 << 20)->Arg(big)->UseRealTime()->Unit(benchmark::kMillisecond);

void chain_staged(benchmark::State& state) {
  if (!need_gpu(state)) return;
  const std::int64_t n = state.range(0);
  sc::graph::cuda_vector_loads() = state.range(1) != 0;  // 16-byte accesses, or one element per access
  const ChainInputs in(n);
  auto f = sc::function(chain9);
  benchmark::DoNotOptimize(f(in.x, in.a, in.b, in.c));  // trace and compile outside the loop
  sc::cuda::synchronize();
  for (auto _ : state) {
    benchmark::DoNotOptimize(f(in.x, in.a, in.b, in.c));
    sc::cuda::synchronize();
  }
  state.SetBytesProcessed(state.iterations() * 5 * n * 4);
  state.counters["fused_groups"] = f.get_concrete(in.x, in.a, in.b, in.c).stats().plan.fused_groups;
  sc::graph::cuda_vector_loads() = true;
}
BENCHMARK(chain_staged)->Name("cuda/chain9/staged")->ArgNames({"n", "vec16"})
    ->Args({1 << 20, 1})->Args({big, 1})->Args({big, 0})->UseRealTime()->Unit(benchmark::kMillisecond);

// ---- a whole-tensor reduction: sum((x - a)^2) over 256M floats ------------------------------------
// Staged, one generated kernel cut in 1024 pieces and a second combining them (cuda_fused.hpp's
// ReductionSplit); eager, a subtract, a square and a CUB sum. Bytes: the two reads.

sc::Tensor sum_sq(const sc::Tensor& x, const sc::Tensor& a) { return sc::sum(sc::square(x - a)); }

void sumsq(benchmark::State& state) {
  if (!need_gpu(state)) return;
  const bool staged = state.range(0) != 0;
  const ChainInputs in(big);
  auto f = sc::function(sum_sq);
  benchmark::DoNotOptimize(staged ? f(in.x, in.a) : sum_sq(in.x, in.a));
  sc::cuda::synchronize();
  for (auto _ : state) {
    benchmark::DoNotOptimize(staged ? f(in.x, in.a) : sum_sq(in.x, in.a));
    sc::cuda::synchronize();
  }
  state.SetBytesProcessed(state.iterations() * 2 * big * 4);
  if (staged) state.counters["fused_reductions"] = f.get_concrete(in.x, in.a).stats().plan.fused_reductions;
}
BENCHMARK(sumsq)->Name("cuda/sumsq/256M")->ArgName("staged")->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);

// ---- matmul 8192^3 -------------------------------------------------------------------------------

constexpr std::int64_t mm = 8192;

/// The TFLOP/s of the 8192^3 matmul rows (2 * mm^3 flops per iteration).
void set_matmul_rate(benchmark::State& state) {
  state.counters["TFLOP/s"] = benchmark::Counter(2.0 * mm * mm * mm * static_cast<double>(state.iterations()) / 1e12,
                                                 benchmark::Counter::kIsRate);
}

void matmul_stagecraft(benchmark::State& state) {
  if (!need_gpu(state)) return;
  const sc::DeviceScope on(gpu);
  const sc::Tensor a = sc::random::normal({mm, mm}, 1), b = sc::random::normal({mm, mm}, 2);
  for (auto _ : state) {
    benchmark::DoNotOptimize(sc::matmul(a, b));
    sc::cuda::synchronize();
  }
  set_matmul_rate(state);
}
BENCHMARK(matmul_stagecraft)->Name("cuda/matmul/8192/stagecraft")->UseRealTime()->Unit(benchmark::kMillisecond);

/// cublasSgemm on the same random matrices as the stagecraft row (zeros would run faster: less
/// switching, higher clocks), into a preallocated result.
void matmul_cublas(benchmark::State& state) {
  if (!need_gpu(state)) return;
  const sc::DeviceScope on(gpu);
  const sc::Tensor a = sc::random::normal({mm, mm}, 1), b = sc::random::normal({mm, mm}, 2), c = sc::zeros({mm, mm});
  sc::cuda::synchronize();
  cublasHandle_t h = nullptr;
  cublasCreate(&h);
  const float one = 1.f, zero = 0.f;
  const int n = static_cast<int>(mm);
  const auto* pa = static_cast<const float*>(a.raw_data());
  const auto* pb = static_cast<const float*>(b.raw_data());
  auto* pc = static_cast<float*>(c.raw_data());
  for (auto _ : state) {
    cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, pb, n, pa, n, &zero, pc, n);  // row-major a b
    cudaDeviceSynchronize();
  }
  set_matmul_rate(state);
  cublasDestroy(h);
}
BENCHMARK(matmul_cublas)->Name("cuda/matmul/8192/cublas")->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
