// im2col / col2im primitives and nn::conv2d (NCHW x OIHW) built on them.
#pragma once
#include <algorithm>
#include <cstring>
#include <vector>

#include "../backend/cpu/parallel.hpp"
#include "../eager/dispatch.hpp"
#include "matmul.hpp"
#include "reshape.hpp"

namespace stagecraft {
namespace ops {

/// A sliding window over the last two axes of an NCHW tensor: kernel kh x kw, one stride
/// and one zero padding for both axes, output size Ho x Wo (floor).
struct Window {
  std::int64_t N = 0, C = 0, H = 0, W = 0, kh = 1, kw = 1, stride = 1, pad = 0, Ho = 0, Wo = 0;

  /// Checks the window against an input shape (rank 4, stride >= 1, padding >= 0, kernel
  /// >= 1 and within the padded input) and fills in the sizes; errors name `op` and `what`.
  static Window make(std::string_view op, const Shape& x, std::int64_t kh, std::int64_t kw, std::int64_t stride,
                     std::int64_t pad, const std::source_location& loc, std::string_view what = "") {
    if (SC_UNLIKELY(x.rank() != 4))
      detail::fail<ShapeError>(op, loc, "expects an input of rank 4 [N, C, H, W], got ", x, what);
    if (SC_UNLIKELY(stride < 1)) detail::fail<ValueError>(op, loc, "stride must be >= 1, got ", stride);
    if (SC_UNLIKELY(pad < 0)) detail::fail<ValueError>(op, loc, "padding must be >= 0, got ", pad);
    if (SC_UNLIKELY(kh < 1 || kw < 1))
      detail::fail<ShapeError>(op, loc, "kernel must be at least 1x1, got ", kh, "x", kw, " for input ", x, what);
    Window w{x[0], x[1], x[2], x[3], kh, kw, stride, pad, 0, 0};
    if (SC_UNLIKELY(kh > w.H + 2 * pad || kw > w.W + 2 * pad))
      detail::fail<ShapeError>(op, loc, "kernel ", kh, "x", kw, " is larger than the input ", x, " padded by ",
                               pad, what);
    w.Ho = (w.H + 2 * pad - kh) / stride + 1;
    w.Wo = (w.W + 2 * pad - kw) / stride + 1;
    return w;
  }

  /// Output columns [lo, hi) whose input column ox*stride - pad + j lies inside [0, W);
  /// the rest read padding.
  void valid_cols(std::int64_t j, std::int64_t& lo, std::int64_t& hi) const {
    const std::int64_t first = pad - j, last = W - 1 + pad - j;  // need first <= ox*stride <= last
    lo = first > 0 ? (first + stride - 1) / stride : 0;
    hi = last >= 0 ? std::min(Wo, last / stride + 1) : 0;
    lo = std::min(lo, hi);
  }
};

/// The kernel size an Im2Col / Col2Im call reads: i0 x i0, or ints2 = {kh, kw} when given.
inline void kernel_hw(const Attrs& a, std::int64_t& kh, std::int64_t& kw) {
  if (a.ints2.rank() == 2) { kh = a.ints2[0]; kw = a.ints2[1]; }
  else kh = kw = a.i0;
}

/// The window an Im2Col / Col2Im call describes over an image of shape x: kernel_hw(a),
/// stride i1, padding i2; errors name `op` and end with `what`.
inline Window window_of(std::string_view op, const Shape& x, const Attrs& a, const std::source_location& loc,
                        std::string_view what = "") {
  std::int64_t kh, kw;
  kernel_hw(a, kh, kw);
  return Window::make(op, x, kh, kw, a.i1, a.i2, loc, what);
}

/// Im2Col's and Col2Im's cpu: Op::run(window, in, out) in out's dtype, the window over
/// `image` (x's shape for im2col, the target shape for col2im; infer has checked it).
template <class Op>
void run_window(const Tensor& in, Tensor& out, const Shape& image, const Attrs& a) {
  if (out.numel() == 0) return;
  const Window w = window_of(Op::name, image, a, std::source_location::current());
  visit_numeric(out.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    Op::run(w, static_cast<const T*>(in.raw_data()), static_cast<T*>(out.raw_data()));
  });
}

/// Rows of a threaded loop that does `per_row` elements of cheap work each.
inline std::int64_t row_grain(std::int64_t per_row) {
  return std::max<std::int64_t>(1, backend::cpu::grain_cheap / std::max<std::int64_t>(1, per_row));
}

/// x [N,C,H,W] → columns [N, C*kh*kw, Ho*Wo]: column (c,i,j) of window (oy,ox) holds
/// x[n, c, oy*s - p + i, ox*s - p + j] (0 in the padding). Attrs: i0 kernel (or ints2 =
/// {kh, kw}), i1 stride, i2 padding.
struct Im2Col {
  SC_OP_HEAD(Im2Col, "im2col")
  static constexpr int arity = 1;
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    require_dtype(!is_bool(in[0].dtype()), name, in[0].dtype(), "a numeric input", loc);
    const Window w = window_of(name, in[0].shape(), a, loc);
    return {Shape{w.N, w.C * w.kh * w.kw, w.Ho * w.Wo}, in[0].dtype()};
  }

  static void cpu(Inputs in, Tensor& out, const Attrs& a) { run_window<Im2Col>(in[0], out, in[0].shape(), a); }

  // The kernel run_window calls. One task per output row (n, c, i, j, oy) of Wo elements, so
  // even a single image with few channels splits across threads; each row is written by
  // exactly one task.
  template <class T>
  static void run(const Window& w, const T* x, T* col) {
    const std::int64_t rows = w.N * w.C * w.kh * w.kw * w.Ho, s = w.stride;
    backend::cpu::parallel_for(rows, row_grain(w.Wo), [&](std::int64_t rb, std::int64_t re) {
      std::int64_t oy = rb % w.Ho, q = rb / w.Ho;
      std::int64_t j = q % w.kw, i = (q / w.kw) % w.kh, nc = q / (w.kw * w.kh);
      std::int64_t lo, hi;
      w.valid_cols(j, lo, hi);
      for (std::int64_t r = rb; r < re; ++r) {
        T* dst = col + r * w.Wo;
        const std::int64_t iy = oy * s - w.pad + i;
        if (iy < 0 || iy >= w.H || lo == hi) {
          std::fill(dst, dst + w.Wo, T(0));
        } else {
          const T* src = x + (nc * w.H + iy) * w.W + (lo * s - w.pad + j);  // column lo of the window
          std::fill(dst, dst + lo, T(0));
          if (s == 1) std::memcpy(dst + lo, src, static_cast<std::size_t>(hi - lo) * sizeof(T));
          else for (std::int64_t ox = lo; ox < hi; ++ox) dst[ox] = src[(ox - lo) * s];
          std::fill(dst + hi, dst + w.Wo, T(0));
        }
        if (++oy == w.Ho) {  // advance (nc, i, j, oy) without dividing
          oy = 0;
          if (++j == w.kw) { j = 0; if (++i == w.kh) { i = 0; ++nc; } }
          w.valid_cols(j, lo, hi);
        }
      }
    });
  }
};

/// The adjoint of Im2Col: columns [N, C*kh*kw, Ho*Wo] are scatter-added back onto
/// [N,C,H,W] (overlapping windows sum). Attrs: ints = the input shape [N,C,H,W], i0 kernel
/// (or ints2 = {kh, kw}), i1 stride, i2 padding. Used by conv2d's gradient.
struct Col2Im {
  SC_OP_HEAD(Col2Im, "col2im")
  static constexpr int arity = 1;
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    require_dtype(!is_bool(in[0].dtype()), name, in[0].dtype(), "a numeric input", loc);
    const Window w = window_of(name, a.ints, a, loc, " (the target shape)");
    const Shape want{w.N, w.C * w.kh * w.kw, w.Ho * w.Wo};
    if (SC_UNLIKELY(in[0].shape() != want))
      detail::fail<ShapeError>(name, loc, "columns have shape ", in[0].shape(), " but a ", w.kh, "x", w.kw,
                               " window with stride ", w.stride, " and padding ", w.pad, " over ", a.ints,
                               " needs ", want);
    return {a.ints, in[0].dtype()};
  }

  static void cpu(Inputs in, Tensor& out, const Attrs& a) { run_window<Col2Im>(in[0], out, a.ints, a); }

  // The kernel run_window calls, in gather form: one task per input row (n, c, y) adds every
  // column segment that lands on it, so no two tasks write the same element (no atomics,
  // deterministic sums).
  template <class T>
  static void run(const Window& w, const T* col, T* x) {
    const std::int64_t rows = w.N * w.C * w.H, s = w.stride, L = w.Ho * w.Wo;
    backend::cpu::parallel_for(rows, row_grain(w.W + w.kh * w.kw * w.Wo / s), [&](std::int64_t rb, std::int64_t re) {
      for (std::int64_t r = rb; r < re; ++r) {
        const std::int64_t nc = r / w.H, y = r % w.H;
        T* dst = x + r * w.W;
        std::fill(dst, dst + w.W, T(0));
        for (std::int64_t i = 0; i < w.kh; ++i) {
          const std::int64_t t = y + w.pad - i;  // = oy * s for the window row that reads y
          if (t < 0 || t % s != 0 || t / s >= w.Ho) continue;
          const std::int64_t oy = t / s;
          for (std::int64_t j = 0; j < w.kw; ++j) {
            const T* src = col + (nc * w.kh * w.kw + i * w.kw + j) * L + oy * w.Wo;
            std::int64_t lo, hi;
            w.valid_cols(j, lo, hi);
            if (lo == hi) continue;
            T* d = dst + (lo * s - w.pad + j);  // the pixel window column lo reads
            if (s == 1) for (std::int64_t ox = lo; ox < hi; ++ox) d[ox - lo] += src[ox];
            else for (std::int64_t ox = lo; ox < hi; ++ox) d[(ox - lo) * s] += src[ox];
          }
        }
      }
    });
  }
};

}  // namespace ops

/// Patches of x [N,C,H,W] as columns [N, C*kernel_h*kernel_w, Ho*Wo] (zero padding), the
/// layout that turns a convolution into one matrix product per image.
inline Tensor im2col(const Tensor& x, std::int64_t kernel_h, std::int64_t kernel_w, std::int64_t stride,
                     std::int64_t padding, std::source_location loc = std::source_location::current()) {
  ops::Attrs a;
  a.i0 = kernel_h;
  if (kernel_h != kernel_w) a.ints2 = Shape{kernel_h, kernel_w};
  a.i1 = stride;
  a.i2 = padding;
  return detail::dispatch<ops::Im2Col>({&x, 1}, a, loc);
}

/// The adjoint of im2col: sums columns [N, C*kh*kw, Ho*Wo] back onto an [N,C,H,W] tensor
/// of shape `input_shape` (what im2col's gradient needs).
inline Tensor col2im(const Tensor& cols, Shape input_shape, std::int64_t kernel_h, std::int64_t kernel_w,
                     std::int64_t stride, std::int64_t padding,
                     std::source_location loc = std::source_location::current()) {
  ops::Attrs a;
  a.ints = input_shape;
  a.i0 = kernel_h;
  if (kernel_h != kernel_w) a.ints2 = Shape{kernel_h, kernel_w};
  a.i1 = stride;
  a.i2 = padding;
  return detail::dispatch<ops::Col2Im>({&cols, 1}, a, loc);
}

// im2col and col2im are linear and adjoint to each other, so each one's gradient is the
// other applied to g; being ops, these rules are themselves differentiable (conv2d, built
// from im2col, gets second derivatives).
inline std::vector<Tensor> ops::Im2Col::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs& a) {
  std::int64_t kh, kw;
  kernel_hw(a, kh, kw);
  return {col2im(g, in[0].shape(), kh, kw, a.i1, a.i2)};
}
inline std::vector<Tensor> ops::Col2Im::vjp(const Tensor& g, Inputs, const Tensor&, const Attrs& a) {
  std::int64_t kh, kw;
  kernel_hw(a, kh, kw);
  return {im2col(g, kh, kw, a.i1, a.i2)};
}

namespace nn {

/// 2-D cross-correlation (as every framework's conv2d): x [N,C,H,W], w [O,C,kH,kW] →
/// [N,O,Ho,Wo], zero padding on all sides, one stride for both axes. A composite:
/// im2col, one GEMM per image, reshape, so it gets gradients and tracing from those ops.
inline Tensor conv2d(const Tensor& x, const Tensor& w, std::int64_t stride = 1, std::int64_t padding = 0,
                     std::source_location loc = std::source_location::current()) {
  constexpr std::string_view op = "conv2d";
  detail::require_defined(x, op, loc);
  detail::require_defined(w, op, loc);
  if (SC_UNLIKELY(x.rank() != 4 || w.rank() != 4))
    detail::fail<ShapeError>(op, loc, "expects x as [N, C, H, W] and w as [O, C, kH, kW], got ", x.shape(),
                             " and ", w.shape());
  if (SC_UNLIKELY(is_bool(x.dtype()) || is_bool(w.dtype())))
    detail::fail<DTypeError>(op, loc, "expects numeric tensors, got ", name(x.dtype()), " and ", name(w.dtype()));
  const Shape& xs = x.shape();
  const Shape& ws = w.shape();
  if (SC_UNLIKELY(xs[1] != ws[1]))
    detail::fail<ShapeError>(op, loc, "input has ", xs[1], " channels but the kernel expects ", ws[1], " (x ", xs,
                             ", w ", ws, ")");
  const std::string what = " (w " + ws.str() + ")";
  const ops::Window win = ops::Window::make(op, xs, ws[2], ws[3], stride, padding, loc, what);
  const std::int64_t N = win.N, O = ws[0], ckk = win.C * win.kh * win.kw;
  // A 1x1 kernel with stride 1 and no padding reads every pixel once: its columns are x itself.
  const bool pointwise = win.kh == 1 && win.kw == 1 && stride == 1 && padding == 0;
  const Tensor cols = pointwise ? reshape(x, Shape{N, win.C, win.H * win.W}, loc)
                                : im2col(x, win.kh, win.kw, stride, padding, loc);
  const Tensor y = matmul(reshape(w, Shape{O, ckk}, loc), cols, loc);  // [O,ckk] x [N,ckk,L] → [N,O,L]
  return reshape(y, Shape{N, O, win.Ho, win.Wo}, loc);
}

}  // namespace nn
}  // namespace stagecraft
