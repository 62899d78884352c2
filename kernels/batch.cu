// Eager batches: the small ops queued on a device (abi::batch_enqueue, kept by runtime.cu)
// launched as one kernel, one block whose threads run each op's elements in turn (a reduction's
// results by lanes of a warp, a product's outputs a thread each: batch_elements.cuh; an op's
// geometry in the slot after it), a barrier between ops so that an op reads what
// the ops before it wrote. A small eager op is bound
// by its launch (~4.5 us on an H100/H200 virtual machine, session 39); queued, up to
// abi::batch_max_ops of them share one.
#include "batch_elements.cuh"
#include "common.cuh"

namespace stagecraft::cuda::kernels {
namespace {

constexpr int batch_threads = batch::block_threads;

/// A batch as the kernel's parameter (up to N slots; launched with the smallest N that holds them).
template <int N>
struct BatchParams {
  abi::BatchSlot slots[N];
  int count;
};
static_assert(sizeof(BatchParams<abi::batch_max_ops>) <= 4096, "a batch fits a launch's parameters");

__device__ __noinline__ void run_batch_op(abi::BatchOp op, const abi::BatchGeometry* g) {
  batch::run_op<int>(op, g, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), true);
}

// __grid_constant__: the ops are read where the launch put them (indexed by k), not copied first;
// a geometry is read there through its address.
template <int N>
__global__ void __launch_bounds__(batch_threads) batch_kernel(const __grid_constant__ BatchParams<N> p) {
  batch::for_each_op(p.slots, p.count, [](const abi::BatchOp& op, const abi::BatchGeometry* g) {
    run_batch_op(op, g);
    __syncthreads();
  });
}

template <int N>
Status launch_as(const abi::BatchSlot* slots, int n, cudaStream_t s) {
  BatchParams<N> p;
  for (int k = 0; k < n; ++k) p.slots[k] = slots[k];
  p.count = n;
  batch_kernel<N><<<1, batch_threads, 0, s>>>(p);
  return launched();
}

}  // namespace

Status launch_batch(const abi::BatchSlot* slots, int n, cudaStream_t s) {
  if (n <= 4) return launch_as<4>(slots, n, s);
  if (n <= 16) return launch_as<16>(slots, n, s);
  return launch_as<abi::batch_max_ops>(slots, n, s);
}

}  // namespace stagecraft::cuda::kernels
