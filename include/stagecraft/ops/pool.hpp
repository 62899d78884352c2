// max_pool2d / avg_pool2d primitives over NCHW (no padding, floor output size), and max_pool2d_grad.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cast.hpp"  // integer inputs of avg_pool2d become f32 through cast
#include "conv.hpp"  // Window; im2col/col2im for the gradients
#include "../backend/cpu/elementwise.hpp"  // batch<T>: xsimd vectors
// The ops the gradient rules (at the end) are written with.
#include "binary.hpp"
#include "broadcast_to.hpp"
#include "gather.hpp"  // one_hot
#include "reduce.hpp"
#include "reshape.hpp"
#include "transpose.hpp"

namespace stagecraft {
namespace ops {

/// Shared by both pools: checks, output shape, and a threaded walk over output rows. A
/// window is reduced in two passes (it is separable): down the kh input rows into one
/// contiguous row (SIMD, the bulk of the work), then across kw columns of that row.
template <class Derived>
struct Pool2d {
  static constexpr int arity = 1;

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    require_dtype(!is_bool(in[0].dtype()), Derived::name, in[0].dtype(), "a numeric input", loc);
    if (SC_UNLIKELY(a.i0 < 1)) detail::fail<ValueError>(Derived::name, loc, "kernel must be >= 1, got ", a.i0);
    const Window w = Window::make(Derived::name, in[0].shape(), a.i0, a.i0, a.i1, 0, loc);
    return {Shape{w.N, w.C, w.Ho, w.Wo}, in[0].dtype()};
  }

  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    if (out.numel() == 0) return;
    const Window w = Window::make(Derived::name, in[0].shape(), a.i0, a.i0, a.i1, 0, loc);
    backend::cuda::pool2d(Derived::is_max, in[0], out, cuda_geometry(w), Derived::name, loc);
  }

  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    if (out.numel() == 0) return;
    const Window w = Window::make(Derived::name, in[0].shape(), a.i0, a.i0, a.i1, 0, std::source_location::current());
    visit_numeric(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* x = static_cast<const T*>(in[0].raw_data());
      T* y = static_cast<T*>(out.raw_data());
      if (w.kh == 2 && w.stride == 2) {
        // The common 2x2 / stride 2 window: one pass per output row, no scratch row (a row is
        // only a few dozen elements, so the generic path's per-row set-up cost more than its work).
        const std::int64_t rows = w.N * w.C * w.Ho;
        backend::cpu::parallel_rows(rows, 4 * w.Wo, backend::cpu::grain_cheap, [&](std::int64_t rb, std::int64_t re) {
          for (std::int64_t r = rb; r < re; ++r) {
            const std::int64_t nc = r / w.Ho, oy = r % w.Ho;
            const T* __restrict r0 = x + (nc * w.H + 2 * oy) * w.W;
            const T* __restrict r1 = r0 + w.W;
            T* __restrict yr = y + r * w.Wo;
            for (std::int64_t ox = 0; ox < w.Wo; ++ox) Derived::window_2x2(r0 + 2 * ox, r1 + 2 * ox, yr[ox]);
          }
        });
        return;
      }
      const std::int64_t used = (w.Wo - 1) * w.stride + w.kw;  // input columns any window reads
      // One task per output row (n, c, oy): rows of different tasks never overlap, and a
      // single image with few channels still splits across threads.
      const std::int64_t rows = w.N * w.C * w.Ho;
      backend::cpu::parallel_rows(rows, used * w.kh, backend::cpu::grain_cheap, [&](std::int64_t rb, std::int64_t re) {
        std::vector<T> tmp(static_cast<std::size_t>(used));
        for (std::int64_t r = rb; r < re; ++r) {
          const std::int64_t nc = r / w.Ho, oy = r % w.Ho;
          const T* top = x + (nc * w.H + oy * w.stride) * w.W;
          std::copy(top, top + used, tmp.data());
          for (std::int64_t i = 1; i < w.kh; ++i) fold(tmp.data(), top + i * w.W, used);
          Derived::across(w, tmp.data(), y + r * w.Wo);
        }
      });
    });
  }

 private:
  /// t[c] = Derived::combine(v[c], t[c]) over a row, whole SIMD vectors first.
  template <class T>
  static void fold(T* __restrict t, const T* __restrict v, std::int64_t n) {
    std::int64_t c = 0;
    if constexpr (backend::cpu::Vectorizable<T>) {
      using B = backend::cpu::batch<T>;
      for (; c + static_cast<std::int64_t>(B::size) <= n; c += B::size)
        Derived::combine(B::load_unaligned(v + c), B::load_unaligned(t + c)).store_unaligned(t + c);
    }
    for (; c < n; ++c) t[c] = Derived::combine(v[c], t[c]);
  }
};

/// The largest value in each kernel x kernel window (NaN wins, as in PyTorch). Attrs: i0
/// kernel, i1 stride.
struct MaxPool2d : Pool2d<MaxPool2d> {
  SC_OP_HEAD(MaxPool2d, "max_pool2d")
  static constexpr bool is_max = true;
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);

  /// v if it is larger or NaN, else m: the maximum op's rule (ops/rules.hpp), a select, never a
  /// branch (on random data a branch there mispredicts half the time; measured 35x slower).
  template <class B>
  static B combine(const B& v, const B& m) {
    return rules::Maximum::f(v, m);
  }
  /// The 2x2 fast path: the max of (t[0], t[1], b[0], b[1]), NaN if any is NaN. Plain compares
  /// and selects (no calls, no branches), which GCC keeps branch-free at -O2 too.
  template <class T>
  static void window_2x2(const T* t, const T* b, T& y) {
    const T m0 = t[1] > t[0] ? t[1] : t[0], m1 = b[1] > b[0] ? b[1] : b[0], m = m1 > m0 ? m1 : m0;
    if constexpr (std::is_floating_point_v<T>) {
      const bool nan = (t[0] != t[0]) | (t[1] != t[1]) | (b[0] != b[0]) | (b[1] != b[1]);
      y = nan ? std::numeric_limits<T>::quiet_NaN() : m;
    } else {
      y = m;
    }
  }

  /// Output row from the column maxima t: y[ox] = max of t[ox*s .. ox*s + kw). A plain
  /// `v > m ? v : m` (one max instruction) with NaN kept in a flag.
  template <class T>
  static void across(const Window& w, const T* t, T* y) {
    const std::int64_t kw = w.kw, s = w.stride, Wo = w.Wo;
    for (std::int64_t ox = 0; ox < Wo; ++ox) {
      const T* src = t + ox * s;
      T m = src[0];
      bool nan = false;
      for (std::int64_t j = 0; j < kw; ++j) {
        const T v = src[j];
        m = v > m ? v : m;
        if constexpr (std::is_floating_point_v<T>) nan |= v != v;
      }
      y[ox] = nan ? std::numeric_limits<T>::quiet_NaN() : m;
    }
  }
};

/// The mean of each kernel x kernel window (integer inputs become f32). Attrs: i0 kernel,
/// i1 stride.
struct AvgPool2d : Pool2d<AvgPool2d> {
  SC_OP_HEAD(AvgPool2d, "avg_pool2d")
  static constexpr bool is_max = false;
  static constexpr bool float_inputs = true;
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);

  template <class B>
  static B combine(const B& v, const B& acc) { return acc + v; }
  /// The 2x2 fast path: the mean, summed down each column and then across (the generic order).
  template <class T>
  static void window_2x2(const T* t, const T* b, T& y) {
    y = ((t[0] + b[0]) + (t[1] + b[1])) * T(0.25);
  }

  /// Output row from the column sums t.
  template <class T>
  static void across(const Window& w, const T* t, T* y) {
    const std::int64_t kw = w.kw, s = w.stride, Wo = w.Wo;
    const T scale = static_cast<T>(1.0 / static_cast<double>(w.kh * w.kw));
    for (std::int64_t ox = 0; ox < Wo; ++ox) {
      T acc = 0;
      for (std::int64_t j = 0; j < kw; ++j) acc += t[ox * s + j];
      y[ox] = acc * scale;
    }
  }
};

/// max_pool2d's gradient as one pass: inputs (g [N,C,Ho,Wo], x [N,C,H,W]) → dx [N,C,H,W], each
/// g added at the position of its window's maximum in x, the first one of ties (row by row),
/// a NaN winning as in the forward pass (the first NaN); overlapping windows accumulate.
/// The argmax is recomputed from x (k*k compares per window, the same reads the composite
/// made) rather than saved by the forward pass, which would need a second output. Attrs: i0
/// kernel, i1 stride. Written by hand because the composite it replaces (im2col, equal, cast,
/// sum, where, col2im) made six passes and was a third of a small CNN's training step.
struct MaxPool2dGrad {
  SC_OP_HEAD(MaxPool2dGrad, "max_pool2d_grad")
  static constexpr int arity = 2;
  static std::vector<Tensor> vjp(const Tensor& gg, Inputs in, const Tensor& out, const Attrs& a);

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    const Tensor &g = in[0], &x = in[1];
    require_dtype(!is_bool(x.dtype()), name, x.dtype(), "a numeric input", loc);
    if (SC_UNLIKELY(g.dtype() != x.dtype()))
      detail::fail<DTypeError>(name, loc, "expects g and x of one dtype, got ", stagecraft::name(g.dtype()), " and ",
                               stagecraft::name(x.dtype()));
    if (SC_UNLIKELY(a.i0 < 1)) detail::fail<ValueError>(name, loc, "kernel must be >= 1, got ", a.i0);
    const Window w = Window::make(name, x.shape(), a.i0, a.i0, a.i1, 0, loc);
    const Shape want{w.N, w.C, w.Ho, w.Wo};
    if (SC_UNLIKELY(g.shape() != want))
      detail::fail<ShapeError>(name, loc, "g has shape ", g.shape(), " but max_pool2d of ", x.shape(), " (kernel ",
                               a.i0, ", stride ", a.i1, ") has shape ", want);
    return {x.shape(), x.dtype()};
  }

  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    if (out.numel() == 0) return;
    const Window w = Window::make(name, in[1].shape(), a.i0, a.i0, a.i1, 0, loc);
    backend::cuda::max_pool2d_grad(in[0], in[1], out, cuda_geometry(w), name, loc);
  }

  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    if (out.numel() == 0) return;
    const Window w = Window::make(name, in[1].shape(), a.i0, a.i0, a.i1, 0, std::source_location::current());
    visit_numeric(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* g = static_cast<const T*>(in[0].raw_data());
      const T* x = static_cast<const T*>(in[1].raw_data());
      T* dx = static_cast<T*>(out.raw_data());
      const std::int64_t plane = w.H * w.W, oplane = w.Ho * w.Wo;
      // One task per (n, c) plane: windows of one plane may overlap, planes never do.
      backend::cpu::parallel_rows(w.N * w.C, plane + oplane * w.kh * w.kw, backend::cpu::grain_cheap, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t p = b; p < e; ++p) scatter_plane(w, g + p * oplane, x + p * plane, dx + p * plane);
      });
    });
  }

  /// The offset (i * W + j) of the window's maximum in x, window top-left at `top`: the first
  /// largest element in row-major order, or the first NaN. Branch-free selects in the common
  /// case (a branch on data-dependent compares mispredicts half the time).
  template <std::int64_t K, class T>
  static std::int64_t argmax_in_window(const Window& w, const T* top) {
    const std::int64_t kh = K > 0 ? K : w.kh, kw = K > 0 ? K : w.kw;  // K > 0: a fixed size, unrolled
    std::int64_t best = 0;
    T m = top[0];
    bool nan = false;
    for (std::int64_t i = 0; i < kh; ++i)
      for (std::int64_t j = 0; j < kw; ++j) {
        const std::int64_t at = i * w.W + j;
        const T v = top[at];
        const bool more = v > m;
        best = more ? at : best;
        m = more ? v : m;
        if constexpr (std::is_floating_point_v<T>) nan |= v != v;
      }
    if constexpr (std::is_floating_point_v<T>)
      if (SC_UNLIKELY(nan))  // rare: the first NaN wins
        for (std::int64_t i = 0; i < kh; ++i)
          for (std::int64_t j = 0; j < kw; ++j)
            if (top[i * w.W + j] != top[i * w.W + j]) return i * w.W + j;
    return best;
  }

 private:
  // The common 2x2 and 3x3 kernels get unrolled window loops.
  template <class T>
  static void scatter_plane(const Window& w, const T* g, const T* x, T* dx) {
    if (w.kh == 2 && w.stride == 2) scatter_plane_2x2(w, g, x, dx);
    else if (w.kh == 2) scatter_plane_k<2>(w, g, x, dx);
    else if (w.kh == 3) scatter_plane_k<3>(w, g, x, dx);
    else scatter_plane_k<0>(w, g, x, dx);
  }
  /// v when c, else 0 (+0.0 for floats), by masking its bits: exact for every v (inf and NaN too).
  template <class T>
  static T keep_if(bool c, T v) {
    if constexpr (std::is_floating_point_v<T>) {
      using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
      U u;
      std::memcpy(&u, &v, sizeof u);
      u &= U(0) - U(c);
      std::memcpy(&v, &u, sizeof v);
      return v;
    } else {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(v) & (U(0) - U(c)));
    }
  }
  /// 2x2 windows with stride 2 (none overlap): every pixel is written once, branch-free: g goes to
  /// the first element of its window (row-major) equal to the window's maximum, or to the first
  /// NaN, the rest get 0; pixels no window covers (an odd last row or column) get 0.
  template <class T>
  static void scatter_plane_2x2(const Window& w, const T* g, const T* x, T* dx) {
    for (std::int64_t oy = 0; oy < w.Ho; ++oy) {
      const T* __restrict r0 = x + 2 * oy * w.W;
      const T* __restrict r1 = r0 + w.W;
      T* __restrict d0 = dx + 2 * oy * w.W;
      T* __restrict d1 = d0 + w.W;
      const T* __restrict gr = g + oy * w.Wo;
      for (std::int64_t ox = 0; ox < w.Wo; ++ox) {
        const T a = r0[2 * ox], b = r0[2 * ox + 1], c = r1[2 * ox], d = r1[2 * ox + 1], gv = gr[ox];
        const T m01 = b > a ? b : a, m23 = d > c ? d : c, m = m23 > m01 ? m23 : m01;
        // hit: the element is the maximum (or, in a window with a NaN, is a NaN); the first hit wins.
        bool ha = a == m, hb = b == m, hc = c == m;
        if constexpr (std::is_floating_point_v<T>) {
          const bool na = a != a, nb = b != b, nc = c != c, nd = d != d, any = na | nb | nc | nd;
          ha = (ha & !any) | na;
          hb = (hb & !any) | nb;
          hc = (hc & !any) | nc;
        }
        // Masks, not selects: GCC turned `cond ? gv : 0` into branches, mispredicted on real data.
        d0[2 * ox] = keep_if(ha, gv);
        d0[2 * ox + 1] = keep_if(hb & !ha, gv);
        d1[2 * ox] = keep_if(hc & !ha & !hb, gv);
        d1[2 * ox + 1] = keep_if(!(ha | hb | hc), gv);
      }
      if (w.W > 2 * w.Wo) {  // an odd last column
        d0[w.W - 1] = T(0);
        d1[w.W - 1] = T(0);
      }
    }
    if (w.H > 2 * w.Ho) std::fill(dx + 2 * w.Ho * w.W, dx + w.H * w.W, T(0));  // an odd last row
  }
  template <std::int64_t K, class T>
  static void scatter_plane_k(const Window& w, const T* g, const T* x, T* dx) {
    std::fill(dx, dx + w.H * w.W, T(0));
    for (std::int64_t oy = 0; oy < w.Ho; ++oy)
      for (std::int64_t ox = 0; ox < w.Wo; ++ox) {
        const std::int64_t top = oy * w.stride * w.W + ox * w.stride;
        T& d = dx[top + argmax_in_window<K>(w, x + top)];
        d = rules::math::wrap_add(d, g[oy * w.Wo + ox]);  // integer sums wrap, as add's do
      }
  }
};

/// The attrs both pools read: i0 kernel, i1 stride.
inline Attrs pool_attrs(std::int64_t kernel, std::int64_t stride) {
  Attrs a;
  a.i0 = kernel;
  a.i1 = stride;
  return a;
}

}  // namespace ops

namespace nn {

/// Max over kernel x kernel windows of x [N,C,H,W] moved by `stride`, no padding:
/// [N, C, (H-kernel)/stride+1, (W-kernel)/stride+1].
inline Tensor max_pool2d(const Tensor& x, std::int64_t kernel, std::int64_t stride,
                         std::source_location loc = std::source_location::current()) {
  return detail::dispatch<ops::MaxPool2d>({&x, 1}, ops::pool_attrs(kernel, stride), loc);
}

/// The gradient of max_pool2d(x, kernel, stride) for the output gradient g: g added at each
/// window's argmax in x (the first of ties, a NaN winning), overlapping windows summing.
inline Tensor max_pool2d_grad(const Tensor& g, const Tensor& x, std::int64_t kernel, std::int64_t stride,
                              std::source_location loc = std::source_location::current()) {
  const detail::BorrowedInputs<2> in({&g, &x});
  return detail::dispatch<ops::MaxPool2dGrad>(in.span(), ops::pool_attrs(kernel, stride), loc);
}

/// Mean over kernel x kernel windows of x [N,C,H,W], as max_pool2d (integers become f32; bool is
/// a DTypeError, as for max_pool2d and conv2d).
inline Tensor avg_pool2d(const Tensor& x, std::int64_t kernel, std::int64_t stride,
                         std::source_location loc = std::source_location::current()) {
  // Checked before promotion, which would quietly turn a bool tensor into 0/1 numbers.
  detail::require_defined(x, ops::AvgPool2d::name, loc);
  ops::require_dtype(!is_bool(x.dtype()), ops::AvgPool2d::name, x.dtype(), "a numeric input", loc);
  return detail::dispatch<ops::AvgPool2d>({&x, 1}, ops::pool_attrs(kernel, stride), loc);
}

}  // namespace nn

// The pools' gradients, written with ops (so they are differentiable again and stage in a
// trace): every channel of x becomes an image of one channel, [N*C, 1, H, W], whose
// im2col, [N*C, k*k, L], holds each window as a column; g is spread over the columns and
// col2im adds the windows back onto x (overlapping windows, stride < kernel, sum).
namespace detail {
/// x's shape [N, C, H, W] seen as N*C one-channel images [N*C, 1, H, W].
inline Shape pool_images(const Shape& xs) { return Shape{xs[0] * xs[1], 1, xs[2], xs[3]}; }
}  // namespace detail

// g goes to the window's maximum, the first of ties, a NaN winning (as TensorFlow and PyTorch,
// which scatter through saved indices): one kernel, itself differentiable (below).
inline std::vector<Tensor> ops::MaxPool2d::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs& a) {
  return {nn::max_pool2d_grad(g, in[0], a.i0, a.i1)};
}

// max_pool2d_grad is linear in g: its adjoint reads gg at each window's argmax (the same
// selection: im2col lays the windows out as columns, argmax along a column follows the same
// first-max / NaN rule, one_hot picks that element). x only chooses positions: no gradient.
inline std::vector<Tensor> ops::MaxPool2dGrad::vjp(const Tensor& gg, Inputs in, const Tensor&, const Attrs& a) {
  const Tensor& x = in[1];
  const Shape img = detail::pool_images(x.shape());
  const std::int64_t k = a.i0;
  const Tensor at = argmax(im2col(reshape(x, img), k, k, a.i1, 0), 1);                      // [N*C, L]
  const Tensor pick = one_hot(at, k * k, gg.dtype());                                        // [N*C, L, k*k]
  const Tensor cols = transpose(im2col(reshape(gg, img), k, k, a.i1, 0), {0, 2, 1});         // [N*C, L, k*k]
  return {reshape(sum(cols * pick, {2}), in[0].shape()), Tensor()};
}

// Each window element gets g / (k*k).
inline std::vector<Tensor> ops::AvgPool2d::vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a) {
  const Shape& xs = in[0].shape();
  const Shape img = detail::pool_images(xs);
  const std::int64_t k = a.i0, L = out.shape()[2] * out.shape()[3];
  const Tensor share = reshape(g, Shape{img[0], 1, L}) * (1.0 / static_cast<double>(k * k));
  const Tensor gcols = broadcast_to(share, Shape{img[0], k * k, L});
  return {reshape(col2im(gcols, img, k, k, a.i1, 0), xs)};
}

}  // namespace stagecraft
