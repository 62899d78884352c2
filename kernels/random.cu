// Philox random numbers on the GPU: each thread makes one block of four samples with the CPU op's
// own code (detail/philox.hpp), so the same seed gives the same values.
#include "common.cuh"
#include "stagecraft/detail/philox.hpp"

namespace stagecraft::cuda::kernels {
namespace {

template <class F, bool Normal>
__global__ void philox_kernel(const std::int64_t* state, double p0, double p1, F* y, std::int64_t n) {
  const auto key = static_cast<std::uint64_t>(state[0]), offset = static_cast<std::uint64_t>(state[1]);
  const std::int64_t blocks = (n + 3) / 4;
  for (std::int64_t blk = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; blk < blocks;
       blk += std::int64_t{gridDim.x} * blockDim.x) {
    const auto w = detail::random_block(key, offset + static_cast<std::uint64_t>(blk));
    F v[4];
    if constexpr (Normal) detail::normal4(w, p0, p1, v);
    else detail::uniform4(w, p0, p1, v);
    for (int k = 0; k < 4 && blk * 4 + k < n; ++k) y[blk * 4 + k] = v[k];
  }
}

}  // namespace
}  // namespace stagecraft::cuda::kernels

namespace stagecraft::cuda::abi {
using namespace stagecraft::cuda::kernels;

Status philox(bool normal, DT dt, const std::int64_t* state, double p0, double p1, void* y, std::int64_t n,
              Stream s) noexcept {
  if (n == 0) return cudaSuccess;
  const auto st = static_cast<cudaStream_t>(s);
  const unsigned grid = grid_for((n + 3) / 4);
  if (dt == DT::f32) {
    if (normal) philox_kernel<float, true><<<grid, block_threads, 0, st>>>(state, p0, p1, static_cast<float*>(y), n);
    else philox_kernel<float, false><<<grid, block_threads, 0, st>>>(state, p0, p1, static_cast<float*>(y), n);
  } else if (dt == DT::f64) {
    if (normal) philox_kernel<double, true><<<grid, block_threads, 0, st>>>(state, p0, p1, static_cast<double*>(y), n);
    else philox_kernel<double, false><<<grid, block_threads, 0, st>>>(state, p0, p1, static_cast<double*>(y), n);
  } else {
    return cudaErrorNotSupported;
  }
  return launched();
}

}  // namespace stagecraft::cuda::abi
