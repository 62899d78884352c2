// max_pool2d / avg_pool2d primitives over NCHW (no padding, floor output size).
#pragma once
#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "cast.hpp"  // integer inputs of avg_pool2d become f32 through cast
#include "conv.hpp"  // Window; im2col/col2im for the gradients
#include "../backend/cpu/elementwise.hpp"  // batch<T>: xsimd vectors
// The ops the gradient rules (at the end) are written with.
#include "binary.hpp"
#include "broadcast_to.hpp"
#include "reduce.hpp"
#include "reshape.hpp"
#include "where.hpp"

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

  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    if (out.numel() == 0) return;
    const Window w = Window::make(Derived::name, in[0].shape(), a.i0, a.i0, a.i1, 0, std::source_location::current());
    visit_numeric(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* x = static_cast<const T*>(in[0].raw_data());
      T* y = static_cast<T*>(out.raw_data());
      const std::int64_t used = (w.Wo - 1) * w.stride + w.kw;  // input columns any window reads
      // One task per output row (n, c, oy): rows of different tasks never overlap, and a
      // single image with few channels still splits across threads.
      const std::int64_t rows = w.N * w.C * w.Ho;
      backend::cpu::parallel_for(rows, row_grain(used * w.kh), [&](std::int64_t rb, std::int64_t re) {
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
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);

  /// v if it is larger or NaN, else m: the maximum op's rule (ops/rules.hpp), a select, never a
  /// branch (on random data a branch there mispredicts half the time; measured 35x slower).
  template <class B>
  static B combine(const B& v, const B& m) {
    return rules::Maximum::f(v, m);
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
  static constexpr bool float_inputs = true;
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);

  template <class B>
  static B combine(const B& v, const B& acc) { return acc + v; }

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

/// Mean over kernel x kernel windows of x [N,C,H,W], as max_pool2d (integers become f32).
inline Tensor avg_pool2d(const Tensor& x, std::int64_t kernel, std::int64_t stride,
                         std::source_location loc = std::source_location::current()) {
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

// g goes to the window elements equal to the window's max, split equally among ties (as
// sc::max's rule; TF and PyTorch instead give it all to one of them: both are valid
// subgradients, and without ties they agree). A NaN max equals nothing, so such a window
// passes no gradient (the count is clamped to 1 there so no 0/0 appears, even in second
// derivatives).
inline std::vector<Tensor> ops::MaxPool2d::vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a) {
  const Shape& xs = in[0].shape();
  const Shape img = detail::pool_images(xs);
  const Shape per_window{img[0], 1, out.shape()[2] * out.shape()[3]};
  const std::int64_t k = a.i0;
  const Tensor cols = im2col(reshape(in[0], img), k, k, a.i1, 0);  // [N*C, k*k, L]
  const Tensor hit = equal(cols, reshape(out, per_window));
  const Tensor count = maximum(sum(cast(hit, g.dtype()), {1}, true), 1);
  const Tensor gcols = where(hit, reshape(g, per_window) / count, 0);
  return {reshape(col2im(gcols, img, k, k, a.i1, 0), xs)};
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
