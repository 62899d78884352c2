// The elements of conv.cu's kernels, one function each, for the GPU and for the host: conv.cu's
// kernels call them per thread, and the CUDA emulator (kernels/emulator/ops.cpp) calls the same
// functions in plain loops, so the GPU's index arithmetic is what the emulated tests check against
// the CPU. Templated on the index type: 32-bit where every index of the tensors fits
// (conv_fits_int32), since a GPU divides 32-bit integers several times faster than 64-bit ones
// and these kernels divide at every element (Nsight Compute on an H200, session 39: im2col at
// batch 128 ~53 us a launch, the max-pool gradient ~60 us, with 64-bit indices).
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "stagecraft/backend/cuda/abi.hpp"

#if defined(__CUDACC__)
#define SC_CONV_HD __host__ __device__ __forceinline__
#else
#define SC_CONV_HD inline
#endif

namespace stagecraft::cuda::kernels {

/// abi::ConvGeometry in index type I.
template <class I>
struct ConvDims {
  I N, C, H, W, kh, kw, stride, pad, Ho, Wo;
  static ConvDims of(const abi::ConvGeometry& g) {
    return {static_cast<I>(g.N),  static_cast<I>(g.C),  static_cast<I>(g.H),      static_cast<I>(g.W),
            static_cast<I>(g.kh), static_cast<I>(g.kw), static_cast<I>(g.stride), static_cast<I>(g.pad),
            static_cast<I>(g.Ho), static_cast<I>(g.Wo)};
  }
};

/// True when every index the kernels form for g (the input, the columns, the pooled output, and a
/// grid-stride step past the last of them: below 2^30 each) fits in 32 bits.
inline bool conv_fits_int32(const abi::ConvGeometry& g) {
  constexpr std::int64_t limit = std::int64_t{1} << 30;
  auto below = [&](std::int64_t a, std::int64_t b) { return a >= 0 && b >= 0 && (b == 0 || a <= limit / b); };
  const std::int64_t nc = g.N * g.C, kk = g.kh * g.kw, hw = g.H * g.W, l = g.Ho * g.Wo;
  return g.N < limit && g.C < limit && below(g.N, g.C) && below(g.H, g.W) && below(g.kh, g.kw) && below(g.Ho, g.Wo) &&
         below(nc, hw) && below(nc, l) && below(nc * l, kk) && g.stride < limit && g.pad < limit;
}

/// Element e of the columns: (n, c*kh*kw + i*kw + j, oy*Wo + ox), the input pixel the window at
/// (oy, ox) has at (i, j); 0 in the padding.
template <class T, class I>
SC_CONV_HD T im2col_element(const T* x, const ConvDims<I>& g, I e) {
  const I L = g.Ho * g.Wo, kk = g.kh * g.kw;
  const I l = e % L, r = e / L, q = r % (g.C * kk), n = r / (g.C * kk);
  const I c = q / kk, i = (q % kk) / g.kw, j = q % g.kw;
  const I iy = (l / g.Wo) * g.stride - g.pad + i, ix = (l % g.Wo) * g.stride - g.pad + j;
  return iy >= 0 && iy < g.H && ix >= 0 && ix < g.W ? x[((n * g.C + c) * g.H + iy) * g.W + ix] : T(0);
}

/// Pixel e of the image: the column entries that read it, kernel row i outer, column j inner (the
/// CPU's order).
template <class T, class I>
SC_CONV_HD T col2im_element(const T* col, const ConvDims<I>& g, I e) {
  const I L = g.Ho * g.Wo, kk = g.kh * g.kw;
  const I px = e % g.W, py = (e / g.W) % g.H, nc = e / (g.W * g.H);
  T acc = T(0);
  for (I i = 0; i < g.kh; ++i) {
    const I ty = py + g.pad - i;  // = oy * stride for the window row that reads py
    if (ty < 0 || ty % g.stride != 0 || ty / g.stride >= g.Ho) continue;
    for (I j = 0; j < g.kw; ++j) {
      const I tx = px + g.pad - j;
      if (tx < 0 || tx % g.stride != 0 || tx / g.stride >= g.Wo) continue;
      acc += col[(nc * kk + i * g.kw + j) * L + (ty / g.stride) * g.Wo + tx / g.stride];
    }
  }
  return acc;
}

/// Output e of a pool: the max (any NaN gives NaN) or the mean, summed down each column of the
/// window first and then across, as the CPU's separable pass (the reciprocal in T: for integers
/// it truncates).
template <class T, class I>
SC_CONV_HD T pool2d_element(bool is_max, const T* x, const ConvDims<I>& g, I e) {
  const I ox = e % g.Wo, oy = (e / g.Wo) % g.Ho, nc = e / (g.Wo * g.Ho);
  const T* top = x + (nc * g.H + oy * g.stride) * g.W + ox * g.stride;
  if (is_max) {
    T m = top[0];
    bool nan = false;
    for (I i = 0; i < g.kh; ++i)
      for (I j = 0; j < g.kw; ++j) {
        const T v = top[i * g.W + j];
        m = v > m ? v : m;
        if constexpr (std::is_floating_point_v<T>) nan |= v != v;
      }
    if constexpr (std::is_floating_point_v<T>) return nan ? static_cast<T>(NAN) : m;
    else return m;
  }
  T acc = T(0);
  for (I j = 0; j < g.kw; ++j) {
    T column = top[j];
    for (I i = 1; i < g.kh; ++i) column = column + top[i * g.W + j];
    acc += column;
  }
  return acc * static_cast<T>(1.0 / static_cast<double>(g.kh * g.kw));
}

/// Offset (i * W + j) of the maximum of the window at `top`: the first largest, or the first NaN.
template <class T, class I>
SC_CONV_HD I window_argmax(const T* top, const ConvDims<I>& g) {
  I best = 0, first_nan = -1;
  T m = top[0];
  for (I i = 0; i < g.kh; ++i)
    for (I j = 0; j < g.kw; ++j) {
      const I at = i * g.W + j;
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

/// Pixel e of a max pool's input gradient: the gradients of the windows whose argmax it is, in
/// window order.
template <class T, class I>
SC_CONV_HD T max_pool2d_grad_element(const T* gy, const T* x, const ConvDims<I>& g, I e) {
  const I px = e % g.W, py = (e / g.W) % g.H, nc = e / (g.W * g.H);
  const T* plane = x + nc * g.H * g.W;
  // Windows oy with oy*s <= py < oy*s + kh, inside [0, Ho); columns alike.
  const I oy0 = py - g.kh + 1 > 0 ? (py - g.kh + 1 + g.stride - 1) / g.stride : 0;
  const I oy1 = py / g.stride < g.Ho - 1 ? py / g.stride : g.Ho - 1;
  const I ox0 = px - g.kw + 1 > 0 ? (px - g.kw + 1 + g.stride - 1) / g.stride : 0;
  const I ox1 = px / g.stride < g.Wo - 1 ? px / g.stride : g.Wo - 1;
  T acc = T(0);
  for (I oy = oy0; oy <= oy1; ++oy)
    for (I ox = ox0; ox <= ox1; ++ox) {
      const I top = oy * g.stride * g.W + ox * g.stride;
      if (top + window_argmax(plane + top, g) == py * g.W + px) acc += gy[(nc * g.Ho + oy) * g.Wo + ox];
    }
  return acc;
}

}  // namespace stagecraft::cuda::kernels
