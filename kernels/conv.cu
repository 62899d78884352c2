// Convolution and pooling kernels: im2col / col2im (the convolution ops pair them with cuBLAS
// GEMMs), the max and mean pools, and max_pool2d's gradient. Gathers only: every output element is
// written by one thread, sums run in the CPU kernels' order, no atomics (deterministic results).
#include <cmath>

#include "common.cuh"

namespace stagecraft::cuda::kernels {
namespace {

using abi::ConvGeometry;

/// One thread per column element (n, c*kh*kw + i*kw + j, oy*Wo + ox).
template <class T>
__global__ void im2col_kernel(const T* x, T* col, ConvGeometry g) {
  const std::int64_t L = g.Ho * g.Wo, kk = g.kh * g.kw, total = g.N * g.C * kk * L;
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < total;
       e += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t l = e % L, r = e / L, q = r % (g.C * kk), n = r / (g.C * kk);
    const std::int64_t c = q / kk, i = (q % kk) / g.kw, j = q % g.kw;
    const std::int64_t iy = (l / g.Wo) * g.stride - g.pad + i, ix = (l % g.Wo) * g.stride - g.pad + j;
    col[e] = iy >= 0 && iy < g.H && ix >= 0 && ix < g.W ? x[((n * g.C + c) * g.H + iy) * g.W + ix] : T(0);
  }
}

/// One thread per pixel: the column entries that read it, kernel row i outer, column j inner (the
/// CPU's order).
template <class T>
__global__ void col2im_kernel(const T* col, T* x, ConvGeometry g) {
  const std::int64_t L = g.Ho * g.Wo, kk = g.kh * g.kw, total = g.N * g.C * g.H * g.W;
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < total;
       e += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t px = e % g.W, py = (e / g.W) % g.H, nc = e / (g.W * g.H);
    T acc = T(0);
    for (std::int64_t i = 0; i < g.kh; ++i) {
      const std::int64_t ty = py + g.pad - i;  // = oy * stride for the window row that reads py
      if (ty < 0 || ty % g.stride != 0 || ty / g.stride >= g.Ho) continue;
      for (std::int64_t j = 0; j < g.kw; ++j) {
        const std::int64_t tx = px + g.pad - j;
        if (tx < 0 || tx % g.stride != 0 || tx / g.stride >= g.Wo) continue;
        acc += col[(nc * kk + i * g.kw + j) * L + (ty / g.stride) * g.Wo + tx / g.stride];
      }
    }
    x[e] = acc;
  }
}

/// One thread per output: the max (any NaN gives NaN) or the mean, summed down each column of the
/// window first and then across, as the CPU's separable pass.
template <class T>
__global__ void pool2d_kernel(bool is_max, const T* x, T* y, ConvGeometry g) {
  const std::int64_t total = g.N * g.C * g.Ho * g.Wo;
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < total;
       e += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t ox = e % g.Wo, oy = (e / g.Wo) % g.Ho, nc = e / (g.Wo * g.Ho);
    const T* top = x + (nc * g.H + oy * g.stride) * g.W + ox * g.stride;
    if (is_max) {
      T m = top[0];
      bool nan = false;
      for (std::int64_t i = 0; i < g.kh; ++i)
        for (std::int64_t j = 0; j < g.kw; ++j) {
          const T v = top[i * g.W + j];
          m = v > m ? v : m;
          if constexpr (std::is_floating_point_v<T>) nan |= v != v;
        }
      if constexpr (std::is_floating_point_v<T>) y[e] = nan ? T(NAN) : m;
      else y[e] = m;
    } else {
      T acc = T(0);
      for (std::int64_t j = 0; j < g.kw; ++j) {
        T col = top[j];
        for (std::int64_t i = 1; i < g.kh; ++i) col = col + top[i * g.W + j];
        acc += col;
      }
      y[e] = acc * static_cast<T>(1.0 / static_cast<double>(g.kh * g.kw));
    }
  }
}

/// Offset (i * W + j) of the maximum of the window at `top`: the first largest, or the first NaN.
template <class T>
__device__ std::int64_t window_argmax(const T* top, const ConvGeometry& g) {
  std::int64_t best = 0, first_nan = -1;
  T m = top[0];
  for (std::int64_t i = 0; i < g.kh; ++i)
    for (std::int64_t j = 0; j < g.kw; ++j) {
      const std::int64_t at = i * g.W + j;
      const T v = top[at];
      if (v > m) {
        m = v;
        best = at;
      }
      if constexpr (std::is_floating_point_v<T>)
        if (v != v && first_nan < 0) first_nan = at;
    }
  return first_nan >= 0 ? first_nan : best;
}

/// One thread per pixel: the gradients of the windows whose argmax it is, in window order.
template <class T>
__global__ void max_pool2d_grad_kernel(const T* gy, const T* x, T* dx, ConvGeometry g) {
  const std::int64_t total = g.N * g.C * g.H * g.W;
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < total;
       e += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t px = e % g.W, py = (e / g.W) % g.H, nc = e / (g.W * g.H);
    const T* plane = x + nc * g.H * g.W;
    // Windows oy with oy*s <= py < oy*s + kh, inside [0, Ho); columns alike.
    const std::int64_t oy0 = py - g.kh + 1 > 0 ? (py - g.kh + 1 + g.stride - 1) / g.stride : 0;
    const std::int64_t oy1 = py / g.stride < g.Ho - 1 ? py / g.stride : g.Ho - 1;
    const std::int64_t ox0 = px - g.kw + 1 > 0 ? (px - g.kw + 1 + g.stride - 1) / g.stride : 0;
    const std::int64_t ox1 = px / g.stride < g.Wo - 1 ? px / g.stride : g.Wo - 1;
    T acc = T(0);
    for (std::int64_t oy = oy0; oy <= oy1; ++oy)
      for (std::int64_t ox = ox0; ox <= ox1; ++ox) {
        const std::int64_t top = oy * g.stride * g.W + ox * g.stride;
        if (top + window_argmax(plane + top, g) == py * g.W + px) acc += gy[(nc * g.Ho + oy) * g.Wo + ox];
      }
    dx[e] = acc;
  }
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
      im2col_kernel<<<grid_for(n), block_threads, 0, static_cast<cudaStream_t>(s)>>>(static_cast<const T*>(x),
                                                                                     static_cast<T*>(cols), g);
      return launched();
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
      col2im_kernel<<<grid_for(n), block_threads, 0, static_cast<cudaStream_t>(s)>>>(static_cast<const T*>(cols),
                                                                                     static_cast<T*>(x), g);
      return launched();
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
      pool2d_kernel<<<grid_for(n), block_threads, 0, static_cast<cudaStream_t>(s)>>>(is_max, static_cast<const T*>(x),
                                                                                    static_cast<T*>(y), g);
      return launched();
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
      max_pool2d_grad_kernel<<<grid_for(n), block_threads, 0, static_cast<cudaStream_t>(s)>>>(
          static_cast<const T*>(g), static_cast<const T*>(x), static_cast<T*>(dx), geo);
      return launched();
    }
  });
}

}  // namespace stagecraft::cuda::abi
