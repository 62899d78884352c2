// Convolution and pooling kernels: im2col / col2im (the convolution ops pair them with cuBLAS
// GEMMs), the max and mean pools, and max_pool2d's gradient. Gathers only: every output element is
// written by one thread, sums run in the CPU kernels' order, no atomics (deterministic results).
#include <cmath>

#include "common.cuh"
#include "conv_elements.cuh"

namespace stagecraft::cuda::kernels {
namespace {

using abi::ConvGeometry;

// One thread per output element (conv_elements.cuh computes it), in a grid-stride loop over
// `total` of them, with indices of type I (int32 where conv_fits_int32).

template <class T, class I>
__global__ void im2col_kernel(const T* x, T* col, ConvDims<I> g, I total) {
  for (I e = blockIdx.x * I(blockDim.x) + threadIdx.x; e < total; e += I(gridDim.x) * I(blockDim.x))
    col[e] = im2col_element(x, g, e);
}

template <class T, class I>
__global__ void col2im_kernel(const T* col, T* x, ConvDims<I> g, I total) {
  for (I e = blockIdx.x * I(blockDim.x) + threadIdx.x; e < total; e += I(gridDim.x) * I(blockDim.x))
    x[e] = col2im_element(col, g, e);
}

template <class T, class I>
__global__ void pool2d_kernel(bool is_max, const T* x, T* y, ConvDims<I> g, I total) {
  for (I e = blockIdx.x * I(blockDim.x) + threadIdx.x; e < total; e += I(gridDim.x) * I(blockDim.x))
    y[e] = pool2d_element(is_max, x, g, e);
}

template <class T, class I>
__global__ void max_pool2d_grad_kernel(const T* gy, const T* x, T* dx, ConvDims<I> g, I total) {
  for (I e = blockIdx.x * I(blockDim.x) + threadIdx.x; e < total; e += I(gridDim.x) * I(blockDim.x))
    dx[e] = max_pool2d_grad_element(gy, x, g, e);
}

/// Calls launch(dims) with g in int32 where its indices fit (conv_fits_int32), else in int64;
/// then the launch's own error.
template <class F>
Status by_index(const ConvGeometry& g, F&& launch) {
  if (conv_fits_int32(g)) launch(ConvDims<std::int32_t>::of(g));
  else launch(ConvDims<std::int64_t>::of(g));
  return launched();
}

}  // namespace
}  // namespace stagecraft::cuda::kernels

namespace stagecraft::cuda::abi {
using namespace stagecraft::cuda::kernels;

Status im2col(DT dt, const void* x, void* cols, const ConvGeometry& g, Stream s) noexcept {
  const std::int64_t n = g.N * g.C * g.kh * g.kw * g.Ho * g.Wo;
  if (n == 0) return cudaSuccess;
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) return cudaErrorNotSupported;
    else {
      return by_index(g, [&](auto d) {
        im2col_kernel<<<grid_for(n), block_threads, 0, static_cast<cudaStream_t>(s)>>>(
            static_cast<const T*>(x), static_cast<T*>(cols), d, static_cast<decltype(d.N)>(n));
      });
    }
  });
}

Status col2im(DT dt, const void* cols, void* x, const ConvGeometry& g, Stream s) noexcept {
  const std::int64_t n = g.N * g.C * g.H * g.W;
  if (n == 0) return cudaSuccess;
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) return cudaErrorNotSupported;
    else {
      return by_index(g, [&](auto d) {
        col2im_kernel<<<grid_for(n), block_threads, 0, static_cast<cudaStream_t>(s)>>>(
            static_cast<const T*>(cols), static_cast<T*>(x), d, static_cast<decltype(d.N)>(n));
      });
    }
  });
}

Status pool2d(bool is_max, DT dt, const void* x, void* y, const ConvGeometry& g, Stream s) noexcept {
  const std::int64_t n = g.N * g.C * g.Ho * g.Wo;
  if (n == 0) return cudaSuccess;
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) return cudaErrorNotSupported;
    else {
      return by_index(g, [&](auto d) {
        pool2d_kernel<<<grid_for(n), block_threads, 0, static_cast<cudaStream_t>(s)>>>(
            is_max, static_cast<const T*>(x), static_cast<T*>(y), d, static_cast<decltype(d.N)>(n));
      });
    }
  });
}

Status max_pool2d_grad(DT dt, const void* g, const void* x, void* dx, const ConvGeometry& geo, Stream s) noexcept {
  const std::int64_t n = geo.N * geo.C * geo.H * geo.W;
  if (n == 0) return cudaSuccess;
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) return cudaErrorNotSupported;
    else {
      return by_index(geo, [&](auto d) {
        max_pool2d_grad_kernel<<<grid_for(n), block_threads, 0, static_cast<cudaStream_t>(s)>>>(
            static_cast<const T*>(g), static_cast<const T*>(x), static_cast<T*>(dx), d, static_cast<decltype(d.N)>(n));
      });
    }
  });
}

}  // namespace stagecraft::cuda::abi
