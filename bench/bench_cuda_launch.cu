// Where an eager GPU op's time goes (issue 8's goal: at most 3 us per small op), beside
// cuda/small_add/stagecraft in the same run: the floor of a launch on this machine (an empty
// kernel; the same with a 280-byte parameter, the size of abi::Geometry), the library's add kernel
// launched straight through the abi on preallocated buffers (no dispatch, no allocation), the
// caching allocator's allocate + free of a small block (host only), and cudaGetLastError (each
// launch calls it). 100 of each per iteration, then a synchronize: rows are per operation.
// Without a GPU the rows say so and skip.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <stagecraft/stagecraft.hpp>

namespace {

constexpr int per_iter = 100;

__global__ void empty_kernel(float*) {}

struct GeometrySized {
  char bytes[sizeof(sc::cuda::abi::Geometry)];
};
__global__ void geometry_param_kernel(float*, GeometrySized) {}

bool need_gpu(benchmark::State& state) {
  if (!sc::cuda::is_available()) state.SkipWithError("no CUDA device");
  return sc::cuda::is_available();
}

cudaStream_t library_stream() {
  sc::cuda::abi::Stream s = nullptr;
  (void)sc::cuda::abi::stream(0, &s);
  return static_cast<cudaStream_t>(s);
}

void launch_empty(benchmark::State& state) {
  if (!need_gpu(state)) return;
  const cudaStream_t s = library_stream();
  const sc::Tensor buf = sc::zeros({1}).to(sc::Device::cuda(0));
  auto* p = static_cast<float*>(const_cast<void*>(buf.raw_data()));
  const bool big = state.range(0) != 0;
  GeometrySized g{};
  sc::cuda::synchronize();
  for (auto _ : state) {
    for (int i = 0; i < per_iter; ++i) {
      if (big) geometry_param_kernel<<<1, 256, 0, s>>>(p, g);
      else empty_kernel<<<1, 256, 0, s>>>(p);
    }
    cudaStreamSynchronize(s);
  }
  state.SetItemsProcessed(state.iterations() * per_iter);
}
BENCHMARK(launch_empty)->Name("cuda/launch/empty_kernel")->ArgName("param280")->Arg(0)->Arg(1)->UseRealTime();

void launch_abi_add(benchmark::State& state) {
  if (!need_gpu(state)) return;
  const sc::Device gpu = sc::Device::cuda(0);
  const sc::Tensor a = sc::full({1}, 1.f).to(gpu), b = sc::full({1}, 2.f).to(gpu), y = sc::zeros({1}).to(gpu);
  const sc::cuda::abi::Geometry geo = sc::backend::cuda::geometry(sc::Shape{1}, {&a.shape(), &b.shape()});
  const sc::cuda::abi::Stream s = library_stream();
  void* out = const_cast<void*>(y.raw_data());
  sc::cuda::synchronize();
  for (auto _ : state) {
    for (int i = 0; i < per_iter; ++i)
      benchmark::DoNotOptimize(sc::cuda::abi::binary(sc::cuda::abi::BinaryRule::Add, sc::cuda::abi::DT::f32, a.raw_data(),
                                                     b.raw_data(), out, geo, s));
    sc::cuda::synchronize();
  }
  state.SetItemsProcessed(state.iterations() * per_iter);
}
BENCHMARK(launch_abi_add)->Name("cuda/launch/abi_add")->UseRealTime();

void alloc_free(benchmark::State& state) {
  if (!need_gpu(state)) return;
  auto& alloc = sc::cuda::detail::DeviceAllocator::instance();
  const sc::Device gpu = sc::Device::cuda(0);
  alloc.deallocate(alloc.allocate(4, gpu), 4, gpu);  // one block in the cache
  for (auto _ : state)
    for (int i = 0; i < per_iter; ++i) {
      void* p = alloc.allocate(4, gpu);
      benchmark::DoNotOptimize(p);
      alloc.deallocate(p, 4, gpu);
    }
  state.SetItemsProcessed(state.iterations() * per_iter);
}
BENCHMARK(alloc_free)->Name("cuda/launch/alloc_free_cached")->UseRealTime();

void last_error(benchmark::State& state) {
  if (!need_gpu(state)) return;
  for (auto _ : state)
    for (int i = 0; i < per_iter; ++i) benchmark::DoNotOptimize(cudaGetLastError());
  state.SetItemsProcessed(state.iterations() * per_iter);
}
BENCHMARK(last_error)->Name("cuda/launch/get_last_error")->UseRealTime();

}  // namespace
