// im2col / col2im primitives and nn::conv2d (NCHW x OIHW) built on them.
#pragma once
#include <algorithm>
#include <cstring>
#include <vector>

#include "../backend/cpu/parallel.hpp"
#include "../eager/dispatch.hpp"
#include "matmul.hpp"
#include "reshape.hpp"
#include "rules.hpp"  // wrap_add: integer sums wrap, as add does

namespace stagecraft {
namespace ops {

/// A sliding window over the last two axes of an NCHW tensor: kernel kh x kw, one stride
/// and one zero padding for both axes, output size Ho x Wo (floor).
struct Window {
  std::int64_t N = 0, C = 0, H = 0, W = 0, kh = 1, kw = 1, stride = 1, pad = 0, Ho = 0, Wo = 0;

  /// Checks the window against an input shape (rank 4, stride >= 1, padding >= 0, kernel
  /// >= 1 and within the padded input, sizes that fit int64) and fills in the sizes; errors
  /// name `op` and `what`.
  static Window make(std::string_view op, const Shape& x, std::int64_t kh, std::int64_t kw, std::int64_t stride,
                     std::int64_t pad, const std::source_location& loc, std::string_view what = "") {
    if (SC_UNLIKELY(x.rank() != 4))
      detail::fail<ShapeError>(op, loc, "expects an input of rank 4 [N, C, H, W], got ", x, what);
    if (SC_UNLIKELY(stride < 1)) detail::fail<ValueError>(op, loc, "stride must be >= 1, got ", stride);
    if (SC_UNLIKELY(pad < 0)) detail::fail<ValueError>(op, loc, "padding must be >= 0, got ", pad);
    if (SC_UNLIKELY(kh < 1 || kw < 1))
      detail::fail<ShapeError>(op, loc, "kernel must be at least 1x1, got ", kh, "x", kw, " for input ", x, what);
    Window w{x[0], x[1], x[2], x[3], kh, kw, stride, pad, 0, 0};
    std::int64_t ph = 0, pw = 0;  // the padded extents; a padding near INT64_MAX would overflow them
    if (SC_UNLIKELY(__builtin_mul_overflow(pad, 2, &pw) || __builtin_add_overflow(w.H, pw, &ph) ||
                    __builtin_add_overflow(w.W, pw, &pw)))
      detail::fail<ShapeError>(op, loc, "padding ", pad, " on the input ", x, " overflows int64", what);
    if (SC_UNLIKELY(kh > ph || kw > pw))
      detail::fail<ShapeError>(op, loc, "kernel ", kh, "x", kw, " is larger than the input ", x, " padded by ",
                               pad, what);
    w.Ho = (ph - kh) / stride + 1;
    w.Wo = (pw - kw) / stride + 1;
    // The columns of one image, [C*kh*kw, Ho*Wo], must be a shape a tensor may have: im2col makes
    // them, the convolutions a chunk of them, and their sizes are products nothing checks later.
    std::uint64_t cols = 0;
    if (SC_UNLIKELY(w.C >= 0 && !detail::shape_bytes(Shape{w.C, kh, kw, w.Ho, w.Wo}, 1, cols)))
      detail::fail<ShapeError>(op, loc, "a ", kh, "x", kw, " kernel with stride ", stride, " and padding ", pad,
                               " over the input ", x, " gives ", w.Ho, "x", w.Wo, " windows of ", w.C,
                               " channels: more than 2^62 window elements an image", what);
    return w;
  }

  /// Output columns [lo, hi) whose input column ox*stride - pad + j lies inside [0, W);
  /// the rest read padding.
  void valid_cols(std::int64_t j, std::int64_t& lo, std::int64_t& hi) const {
    const std::int64_t first = pad - j, last = W - 1 + pad - j;  // need first <= ox*stride <= last
    lo = first > 0 ? (first - 1) / stride + 1 : 0;  // ceil(first / stride); first + stride could overflow
    hi = last >= 0 ? std::min(Wo, last / stride + 1) : 0;
    lo = std::min(lo, hi);
  }
};

/// The window as the CUDA kernels take it.
inline backend::cuda::abi::ConvGeometry cuda_geometry(const Window& w) {
  return {w.N, w.C, w.H, w.W, w.kh, w.kw, w.stride, w.pad, w.Ho, w.Wo};
}

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

/// Window rows [lo, hi) whose input row oy*stride - pad + i lies inside [0, H) (the rest
/// read padding): valid_cols for rows.
inline void valid_rows(const Window& w, std::int64_t i, std::int64_t& lo, std::int64_t& hi) {
  const std::int64_t first = w.pad - i, last = w.H - 1 + w.pad - i;
  lo = first > 0 ? (first - 1) / w.stride + 1 : 0;  // as in valid_cols
  hi = last >= 0 ? std::min(w.Ho, last / w.stride + 1) : 0;
  lo = std::min(lo, hi);
}

/// True when a window block's valid part is one contiguous run in both the image plane and the
/// columns: stride 1 and rows of equal length (a "same" convolution, 2 * pad == kw - 1).
inline bool flat_blocks(const Window& w) { return w.stride == 1 && w.Wo == w.W; }

/// Columns of `images` images (x points at the first, [images, C, H, W]) with a free layout:
/// element (image g, column row q = (c*kh + i)*kw + j, window oy*Wo + ox) goes to
/// col[g*sn + q*sr + oy*Wo + ox]. Im2Col's [N, ckk, L] is sn = ckk*L, sr = L; the convolution
/// kernels' [ckk, images*L] (images side by side, one GEMM operand) is sn = L, sr = images*L.
/// One task per block (g, q) of Ho*Wo elements; each block is written by exactly one task.
/// With flat_blocks the valid part of a block is the plane shifted by one offset: one copy,
/// then the padding columns zeroed (a call per row of a few elements cost more than the copy).
template <class T>
void im2col_into(const Window& w, std::int64_t images, const T* x, T* col, std::int64_t sn, std::int64_t sr) {
  const std::int64_t kk = w.kh * w.kw, ckk = w.C * kk, L = w.Ho * w.Wo, s = w.stride;
  const bool flat = flat_blocks(w);
  backend::cpu::parallel_rows(images * ckk, L, backend::cpu::grain_cheap, [&](std::int64_t bb, std::int64_t be) {
    for (std::int64_t b = bb; b < be; ++b) {
      const std::int64_t g = b / ckk, q = b % ckk, c = q / kk, i = (q / w.kw) % w.kh, j = q % w.kw;
      T* __restrict dst = col + g * sn + q * sr;
      const T* __restrict plane = x + (g * w.C + c) * w.H * w.W;
      std::int64_t lo, hi, ylo, yhi;
      w.valid_cols(j, lo, hi);
      valid_rows(w, i, ylo, yhi);
      if (lo == hi || ylo == yhi) {
        std::fill(dst, dst + L, T(0));
        continue;
      }
      std::fill(dst, dst + ylo * w.Wo, T(0));
      std::fill(dst + yhi * w.Wo, dst + L, T(0));
      if (flat) {
        // Window (oy, ox) reads plane element (oy - pad + i) * W + ox - pad + j: one shift.
        const std::int64_t e0 = ylo * w.Wo + lo, e1 = (yhi - 1) * w.Wo + hi, shift = (i - w.pad) * w.W + j - w.pad;
        std::copy(plane + e0 + shift, plane + e1 + shift, dst + e0);
        for (std::int64_t oy = ylo; oy < yhi; ++oy) {  // the padding columns the copy filled from the next rows
          T* d = dst + oy * w.Wo;
          for (std::int64_t ox = 0; ox < lo; ++ox) d[ox] = T(0);
          for (std::int64_t ox = hi; ox < w.Wo; ++ox) d[ox] = T(0);
        }
        continue;
      }
      for (std::int64_t oy = ylo; oy < yhi; ++oy) {
        T* d = dst + oy * w.Wo;
        const T* src = plane + (oy * s - w.pad + i) * w.W + (lo * s - w.pad + j);  // column lo of the window
        for (std::int64_t ox = 0; ox < lo; ++ox) d[ox] = T(0);
        if (s == 1) for (std::int64_t ox = lo; ox < hi; ++ox) d[ox] = src[ox - lo];
        else for (std::int64_t ox = lo; ox < hi; ++ox) d[ox] = src[(ox - lo) * s];
        for (std::int64_t ox = hi; ox < w.Wo; ++ox) d[ox] = T(0);
      }
    }
  });
}

/// col2im_into for columns the caller lets it overwrite (the convolution's own scratch), when
/// flat_blocks(w): per image plane (one task each, so no two tasks write one element), each of
/// the kh*kw blocks has its padding columns zeroed and is then added onto the plane as one
/// contiguous run, in a fixed order (deterministic sums).
template <class T>
void col2im_flat(const Window& w, std::int64_t images, T* col, T* x, std::int64_t sn, std::int64_t sr) {
  const std::int64_t kk = w.kh * w.kw, plane = w.H * w.W;
  backend::cpu::parallel_rows(images * w.C, plane * kk, backend::cpu::grain_cheap, [&](std::int64_t pb, std::int64_t pe) {
    for (std::int64_t p = pb; p < pe; ++p) {
      const std::int64_t g = p / w.C, c = p % w.C;
      T* __restrict dst = x + p * plane;
      std::fill(dst, dst + plane, T(0));
      for (std::int64_t i = 0; i < w.kh; ++i)
        for (std::int64_t j = 0; j < w.kw; ++j) {
          T* __restrict src = col + g * sn + ((c * w.kh + i) * w.kw + j) * sr;
          std::int64_t lo, hi, ylo, yhi;
          w.valid_cols(j, lo, hi);
          valid_rows(w, i, ylo, yhi);
          if (lo == hi || ylo == yhi) continue;
          for (std::int64_t oy = ylo; oy < yhi; ++oy) {
            T* d = src + oy * w.Wo;
            for (std::int64_t ox = 0; ox < lo; ++ox) d[ox] = T(0);
            for (std::int64_t ox = hi; ox < w.Wo; ++ox) d[ox] = T(0);
          }
          const std::int64_t e0 = ylo * w.Wo + lo, e1 = (yhi - 1) * w.Wo + hi, shift = (i - w.pad) * w.W + j - w.pad;
          for (std::int64_t e = e0; e < e1; ++e) dst[e + shift] = rules::math::wrap_add(dst[e + shift], src[e]);
        }
    }
  });
}

/// The adjoint of im2col_into (same layout parameters): the columns are summed back onto
/// `images` images x [images, C, H, W], overwriting them. Gather form: one task per input row
/// (g, c, y) adds every column segment that lands on it, so no two tasks write one element (no
/// atomics, deterministic sums).
template <class T>
void col2im_into(const Window& w, std::int64_t images, const T* col, T* x, std::int64_t sn, std::int64_t sr) {
  const std::int64_t rows = images * w.C * w.H, s = w.stride;
  backend::cpu::parallel_rows(rows, w.W + w.kh * w.kw * w.Wo / s, backend::cpu::grain_cheap, [&](std::int64_t rb, std::int64_t re) {
    for (std::int64_t r = rb; r < re; ++r) {
      const std::int64_t gc = r / w.H, y = r % w.H, g = gc / w.C, c = gc % w.C;
      T* dst = x + r * w.W;
      std::fill(dst, dst + w.W, T(0));
      for (std::int64_t i = 0; i < w.kh; ++i) {
        const std::int64_t t = y + w.pad - i;  // = oy * s for the window row that reads y
        if (t < 0 || t % s != 0 || t / s >= w.Ho) continue;
        const std::int64_t oy = t / s;
        for (std::int64_t j = 0; j < w.kw; ++j) {
          const T* src = col + g * sn + ((c * w.kh + i) * w.kw + j) * sr + oy * w.Wo;
          std::int64_t lo, hi;
          w.valid_cols(j, lo, hi);
          if (lo == hi) continue;
          T* d = dst + (lo * s - w.pad + j);  // the pixel window column lo reads
          if (s == 1) for (std::int64_t ox = lo; ox < hi; ++ox) d[ox - lo] = rules::math::wrap_add(d[ox - lo], src[ox]);
          else for (std::int64_t ox = lo; ox < hi; ++ox) d[(ox - lo) * s] = rules::math::wrap_add(d[(ox - lo) * s], src[ox]);
        }
      }
    }
  });
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
  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    backend::cuda::im2col(in[0], out, cuda_geometry(window_of(name, in[0].shape(), a, loc)), name, loc);
  }

  // The kernel run_window calls: the [N, C*kh*kw, Ho*Wo] layout of im2col_into.
  template <class T>
  static void run(const Window& w, const T* x, T* col) {
    const std::int64_t L = w.Ho * w.Wo;
    im2col_into(w, w.N, x, col, w.C * w.kh * w.kw * L, L);
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
  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    backend::cuda::col2im(in[0], out, cuda_geometry(window_of(name, a.ints, a, loc)), name, loc);
  }

  // The kernel run_window calls: the [N, C*kh*kw, Ho*Wo] layout of col2im_into.
  template <class T>
  static void run(const Window& w, const T* col, T* x) {
    const std::int64_t L = w.Ho * w.Wo;
    col2im_into(w, w.N, col, x, w.C * w.kh * w.kw * L, L);
  }
};

/// Checks shared by the three convolution ops: x [N,C,H,W] and a kernel [O,C,kh,kw] with
/// matching channels, and the window (stride, padding, kernel within the padded input);
/// errors name `op` and both shapes.
inline Window conv_window(std::string_view op, const Shape& xs, const Shape& ws, std::int64_t stride,
                          std::int64_t pad, const std::source_location& loc) {
  if (SC_UNLIKELY(xs.rank() != 4 || ws.rank() != 4))
    detail::fail<ShapeError>(op, loc, "expects x as [N, C, H, W] and w as [O, C, kH, kW], got ", xs, " and ", ws);
  if (SC_UNLIKELY(xs[1] != ws[1]))
    detail::fail<ShapeError>(op, loc, "input has ", xs[1], " channels but the kernel expects ", ws[1], " (x ", xs,
                             ", w ", ws, ")");
  const std::string what = " (w " + ws.str() + ")";
  return Window::make(op, xs, ws[2], ws[3], stride, pad, loc, what);
}

/// The convolution kernels' schedule and working set. The batch is cut into chunks of images;
/// a chunk's columns, [C*kh*kw, images*Ho*Wo], are built (or, going back, summed) in a scratch
/// of the thread that runs it, next to the GEMMs that read (or write) them, instead of the whole
/// batch's columns going through memory. Chunks hold ~64K column elements (at least one image)
/// and run in parallel, one thread each, with single-threaded GEMMs: per-image products are
/// small, and threading each of them inside BLAS scaled badly. Small convolutions run serially.
struct ConvPlan {
  Window w;
  std::int64_t O = 0, ckk = 0, L = 0;
  std::int64_t group = 1;   ///< images per chunk
  std::int64_t chunks = 0;  ///< ceil(N / group)
  int threads = 1;          ///< threads the chunks run on
  bool pointwise = false;   ///< 1x1, stride 1, no padding: an image's columns are the image itself
  Tensor scratch;           ///< threads x [ckk * group * L] of the op's dtype (none when pointwise)

  /// thread_independent: chunks must not depend on the thread count (grad_filter sums one
  /// partial result per chunk, and the sum must be the same on any number of threads).
  ConvPlan(std::string_view op, const Window& win, std::int64_t out_channels, DType dtype,
           bool thread_independent = false)
      : w(win), O(out_channels) {
    ckk = w.C * w.kh * w.kw;
    L = w.Ho * w.Wo;
    pointwise = w.kh == 1 && w.kw == 1 && w.stride == 1 && w.pad == 0;
    constexpr std::int64_t scratch_elems = std::int64_t{1} << 16, parallel_macs = std::int64_t{1} << 21;
    const std::int64_t N = std::max<std::int64_t>(1, w.N);
    group = std::clamp<std::int64_t>(scratch_elems / std::max<std::int64_t>(1, ckk * L), 1, N);
    const int avail = O * ckk * L * N >= parallel_macs ? available_threads() : 1;
    if (!thread_independent && avail > 1) group = std::min(group, (N + avail - 1) / avail);  // a chunk per thread at least
    chunks = (w.N + group - 1) / group;
    threads = static_cast<int>(std::min<std::int64_t>(avail, chunks));
    if (!pointwise && w.N > 0 && ckk * L > 0)
      scratch = detail::empty_tensor(Shape{threads * ckk * group * L}, dtype, Device::cpu(), op);
  }
  std::int64_t image() const { return w.C * w.H * w.W; }  ///< elements of one input image
  std::int64_t first(std::int64_t chunk) const { return chunk * group; }
  std::int64_t count(std::int64_t chunk) const { return std::min(group, w.N - chunk * group); }
  /// The scratch of thread t.
  template <class T>
  T* cols(int t) const {
    return static_cast<T*>(scratch.raw_data()) + static_cast<std::int64_t>(t) * ckk * group * L;
  }

  /// f(chunk, thread) for every chunk: on `threads` threads (static schedule), or in order.
  template <class F>
  void run(F&& f) const {
#if SC_HAS_OPENMP
    if (threads > 1) {
#pragma omp parallel for schedule(static) num_threads(threads)
      for (std::int64_t c = 0; c < chunks; ++c) f(c, omp_get_thread_num());
      return;
    }
#endif
    for (std::int64_t c = 0; c < chunks; ++c) f(c, 0);
  }

 private:
  // Only with OpenBLAS's OpenMP build, which runs a call made inside a parallel region on the
  // calling thread alone; its pthreads build would start its own threads from every chunk (then
  // the chunks stay serial and each GEMM is threaded, as before).
  static int available_threads() {
#if SC_HAS_OPENMP
    if (omp_in_parallel() || openblas_get_parallel() != OPENBLAS_OPENMP) return 1;
    return num_threads();
#else
    return 1;
#endif
  }
};

/// 2-D cross-correlation: x [N,C,H,W], w [O,C,kh,kw] → y [N,O,Ho,Wo], zero padding on all sides,
/// one stride for both axes (what every framework calls conv2d). Attrs: i1 stride, i2 padding.
/// Per group of images: im2col into a cached scratch, then one GEMM per image,
/// y_n[O, L] = w[O, ckk] · cols_n[ckk, L], written in place.
struct Conv2d {
  SC_OP_HEAD(Conv2d, "conv2d")
  static constexpr int arity = 2;
  static constexpr int promote_from = 0;
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a, Wanted wanted = {});

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    require_dtype(!is_bool(in[0].dtype()), name, in[0].dtype(), "numeric tensors", loc);
    const Window w = conv_window(name, in[0].shape(), in[1].shape(), a.i1, a.i2, loc);
    return {Shape{w.N, in[1].shape()[0], w.Ho, w.Wo}, in[0].dtype()};
  }

  // On the GPU: cuDNN where cuda::conv_algorithm() allows and it takes the convolution; else the
  // whole batch's columns (device memory is plentiful next to the launches a group loop would
  // cost), one strided-batched cuBLAS product with w shared by every image.
  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    if (out.numel() == 0) return;
    const Window w = conv_window(name, in[0].shape(), in[1].shape(), a.i1, a.i2, loc);
    const std::int64_t O = in[1].shape()[0], ckk = w.C * w.kh * w.kw, L = w.Ho * w.Wo;
    namespace cu = backend::cuda;
    if (cu::cudnn_conv(cu::abi::ConvPass::forward, in[0], in[1], out, cuda_geometry(w), O, name, loc)) return;
    Tensor cols = in[0];  // pointwise: the image is its own columns
    if (!(w.kh == 1 && w.kw == 1 && w.stride == 1 && w.pad == 0)) {
      cols = detail::empty_tensor(Shape{w.N, ckk, L}, out.dtype(), out.device(), name, loc);
      backend::cuda::im2col(in[0], cols, cuda_geometry(w), name, loc);
    }
    backend::cuda::gemm(in[1], cols, out, O, L, ckk, false, false, Shape{}, Shape{w.N}, Shape{w.N}, name, loc);
  }

  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    if (out.numel() == 0) return;
    const ConvPlan p(name, conv_window(name, in[0].shape(), in[1].shape(), a.i1, a.i2, std::source_location::current()),
                     in[1].shape()[0], out.dtype());
    visit_numeric(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* x = static_cast<const T*>(in[0].raw_data());
      const T* k = static_cast<const T*>(in[1].raw_data());
      T* y = static_cast<T*>(out.raw_data());
      p.run([&](std::int64_t chunk, int t) {
        const std::int64_t n0 = p.first(chunk), gn = p.count(chunk), ld = gn * p.L;
        if (p.pointwise) {
          for (std::int64_t n = n0; n < n0 + gn; ++n)
            backend::cpu::gemm_ld(p.O, p.L, p.ckk, k, p.ckk, false, x + n * p.image(), p.L, false, y + n * p.O * p.L,
                                  p.L, false);
          return;
        }
        T* col = p.template cols<T>(t);
        im2col_into(p.w, gn, x + n0 * p.image(), col, p.L, ld);
        for (std::int64_t i = 0; i < gn; ++i)
          backend::cpu::gemm_ld(p.O, p.L, p.ckk, k, p.ckk, false, col + i * p.L, ld, false, y + (n0 + i) * p.O * p.L,
                                p.L, false);
      });
    });
  }
};

/// conv2d's gradient with respect to its input: (g [N,O,Ho,Wo], w [O,C,kh,kw]) → dx of the
/// input's shape (attrs ints = [N,C,H,W]: with stride > 1 several input sizes give one output
/// size), i1 stride, i2 padding. Per image, dcols[ckk, L] = w^T · g_n (a GEMM into the cached
/// scratch), then col2im onto dx_n: the batch's columns never exist at once.
struct Conv2dGradInput {
  SC_OP_HEAD(Conv2dGradInput, "conv2d_grad_input")
  static constexpr int arity = 2;
  static constexpr int promote_from = 0;
  static std::vector<Tensor> vjp(const Tensor& h, Inputs in, const Tensor& out, const Attrs& a, Wanted wanted = {});

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    require_dtype(!is_bool(in[0].dtype()), name, in[0].dtype(), "numeric tensors", loc);
    if (SC_UNLIKELY(a.ints.rank() != 4))
      detail::fail<ShapeError>(name, loc, "the input shape must be [N, C, H, W], got ", a.ints);
    const Window w = conv_window(name, a.ints, in[1].shape(), a.i1, a.i2, loc);
    const Shape want{w.N, in[1].shape()[0], w.Ho, w.Wo};
    if (SC_UNLIKELY(in[0].shape() != want))
      detail::fail<ShapeError>(name, loc, "g has shape ", in[0].shape(), " but conv2d of ", a.ints, " with w ",
                               in[1].shape(), " (stride ", a.i1, ", padding ", a.i2, ") has shape ", want);
    return {a.ints, in[0].dtype()};
  }

  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    if (out.numel() == 0) return;
    const Window w = conv_window(name, a.ints, in[1].shape(), a.i1, a.i2, loc);
    const std::int64_t O = in[1].shape()[0], ckk = w.C * w.kh * w.kw, L = w.Ho * w.Wo;
    namespace cu = backend::cuda;
    if (cu::cudnn_conv(cu::abi::ConvPass::grad_input, in[0], in[1], out, cuda_geometry(w), O, name, loc)) return;
    if (w.kh == 1 && w.kw == 1 && w.stride == 1 && w.pad == 0) {
      backend::cuda::gemm(in[1], in[0], out, ckk, L, O, true, false, Shape{}, Shape{w.N}, Shape{w.N}, name, loc);
      return;
    }
    Tensor dcols = detail::empty_tensor(Shape{w.N, ckk, L}, out.dtype(), out.device(), name, loc);
    backend::cuda::gemm(in[1], in[0], dcols, ckk, L, O, true, false, Shape{}, Shape{w.N}, Shape{w.N}, name, loc);
    backend::cuda::col2im(dcols, out, cuda_geometry(w), name, loc);
  }

  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    if (out.numel() == 0) return;
    const ConvPlan p(name, conv_window(name, a.ints, in[1].shape(), a.i1, a.i2, std::source_location::current()),
                     in[1].shape()[0], out.dtype());
    visit_numeric(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* g = static_cast<const T*>(in[0].raw_data());
      const T* k = static_cast<const T*>(in[1].raw_data());
      T* dx = static_cast<T*>(out.raw_data());
      p.run([&](std::int64_t chunk, int t) {
        const std::int64_t n0 = p.first(chunk), gn = p.count(chunk), ld = gn * p.L;
        if (p.pointwise) {
          for (std::int64_t n = n0; n < n0 + gn; ++n)
            backend::cpu::gemm_ld(p.ckk, p.L, p.O, k, p.ckk, true, g + n * p.O * p.L, p.L, false, dx + n * p.image(),
                                  p.L, false);
          return;
        }
        T* col = p.template cols<T>(t);
        for (std::int64_t i = 0; i < gn; ++i)
          backend::cpu::gemm_ld(p.ckk, p.L, p.O, k, p.ckk, true, g + (n0 + i) * p.O * p.L, p.L, false, col + i * p.L,
                                ld, false);
        if (flat_blocks(p.w)) col2im_flat(p.w, gn, col, dx + n0 * p.image(), p.L, ld);
        else col2im_into(p.w, gn, col, dx + n0 * p.image(), p.L, ld);
      });
    });
  }
};

/// conv2d's gradient with respect to its kernel: (x [N,C,H,W], g [N,O,Ho,Wo]) → dw of the
/// kernel's shape (attrs ints = [O,C,kh,kw]), i1 stride, i2 padding. dw[O, ckk] = Σ_n g_n ·
/// cols_n^T, one GEMM per image accumulating into dw (no per-image partial results to sum),
/// the columns built per group in the cached scratch.
struct Conv2dGradFilter {
  SC_OP_HEAD(Conv2dGradFilter, "conv2d_grad_filter")
  static constexpr int arity = 2;
  static constexpr int promote_from = 0;
  static std::vector<Tensor> vjp(const Tensor& h, Inputs in, const Tensor& out, const Attrs& a, Wanted wanted = {});

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    require_dtype(!is_bool(in[0].dtype()), name, in[0].dtype(), "numeric tensors", loc);
    if (SC_UNLIKELY(a.ints.rank() != 4))
      detail::fail<ShapeError>(name, loc, "the kernel shape must be [O, C, kH, kW], got ", a.ints);
    const Window w = conv_window(name, in[0].shape(), a.ints, a.i1, a.i2, loc);
    const Shape want{w.N, a.ints[0], w.Ho, w.Wo};
    if (SC_UNLIKELY(in[1].shape() != want))
      detail::fail<ShapeError>(name, loc, "g has shape ", in[1].shape(), " but conv2d of ", in[0].shape(),
                               " with w ", a.ints, " (stride ", a.i1, ", padding ", a.i2, ") has shape ", want);
    return {a.ints, in[0].dtype()};
  }

  // On the GPU: cuDNN as Conv2d's; else per-image products g_n · cols_n^T as one strided-batched
  // GEMM, then their sum over the batch (the reduction kernel), instead of N accumulating calls.
  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    if (out.numel() == 0) return;
    const Window w = conv_window(name, in[0].shape(), a.ints, a.i1, a.i2, loc);
    const std::int64_t O = a.ints[0], ckk = w.C * w.kh * w.kw, L = w.Ho * w.Wo;
    if (w.N == 0) {
      backend::cuda::fill(out, 0.0, name, loc);
      return;
    }
    namespace cu = backend::cuda;
    if (cu::cudnn_conv(cu::abi::ConvPass::grad_filter, in[0], in[1], out, cuda_geometry(w), O, name, loc)) return;
    Tensor cols = in[0];
    if (!(w.kh == 1 && w.kw == 1 && w.stride == 1 && w.pad == 0)) {
      cols = detail::empty_tensor(Shape{w.N, ckk, L}, out.dtype(), out.device(), name, loc);
      backend::cuda::im2col(in[0], cols, cuda_geometry(w), name, loc);
    }
    Tensor part = detail::empty_tensor(Shape{w.N, O, ckk}, out.dtype(), out.device(), name, loc);
    backend::cuda::gemm(in[1], cols, part, O, ckk, L, false, true, Shape{w.N}, Shape{w.N}, Shape{w.N}, name, loc);
    const bool batch_axis[3] = {true, false, false};
    backend::cuda::reduce(backend::cuda::abi::ReduceRule::sum, part, out, batch_axis, name, loc);
  }

  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    if (out.numel() == 0) return;
    const ConvPlan p(name, conv_window(name, in[0].shape(), a.ints, a.i1, a.i2, std::source_location::current()),
                     a.ints[0], out.dtype(), /*thread_independent=*/true);
    visit_numeric(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* x = static_cast<const T*>(in[0].raw_data());
      const T* g = static_cast<const T*>(in[1].raw_data());
      T* dw = static_cast<T*>(out.raw_data());
      if (p.w.N == 0) {  // the empty sum
        std::fill(dw, dw + out.numel(), T(0));
        return;
      }
      // One partial dw per chunk (chunk 0's is dw itself), summed in chunk order: the same
      // numbers on any number of threads.
      const std::int64_t wn = p.O * p.ckk;
      Tensor parts;
      if (p.chunks > 1) parts = detail::empty_tensor(Shape{(p.chunks - 1) * wn}, out.dtype(), Device::cpu(), name);
      T* part = p.chunks > 1 ? static_cast<T*>(parts.raw_data()) : nullptr;
      p.run([&](std::int64_t chunk, int t) {
        const std::int64_t n0 = p.first(chunk), gn = p.count(chunk), ld = gn * p.L;
        T* acc = chunk == 0 ? dw : part + (chunk - 1) * wn;
        if (p.pointwise) {
          for (std::int64_t n = n0; n < n0 + gn; ++n)
            backend::cpu::gemm_ld(p.O, p.ckk, p.L, g + n * p.O * p.L, p.L, false, x + n * p.image(), p.L, true, acc,
                                  p.ckk, n > n0);
          return;
        }
        T* col = p.template cols<T>(t);
        im2col_into(p.w, gn, x + n0 * p.image(), col, p.L, ld);
        for (std::int64_t i = 0; i < gn; ++i)
          backend::cpu::gemm_ld(p.O, p.ckk, p.L, g + (n0 + i) * p.O * p.L, p.L, false, col + i * p.L, ld, true, acc,
                                p.ckk, i > 0);
      });
      for (std::int64_t c = 1; c < p.chunks; ++c) {
        const T* pc = part + (c - 1) * wn;
        for (std::int64_t e = 0; e < wn; ++e) dw[e] += pc[e];
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

namespace detail {
/// A conv2d gradient op (Conv2dGradInput, Conv2dGradFilter) of two numeric tensors, giving a
/// tensor of `shape` (x's or w's).
template <class Op>
Tensor conv2d_grad(const Tensor& p, const Tensor& q, Shape shape, std::int64_t stride, std::int64_t padding,
                   const std::source_location& loc) {
  constexpr std::string_view op = Op::name;
  require_defined(p, op, loc);
  require_defined(q, op, loc);
  if (SC_UNLIKELY(is_bool(p.dtype()) || is_bool(q.dtype())))
    fail<DTypeError>(op, loc, "expects numeric tensors, got ", stagecraft::name(p.dtype()), " and ",
                     stagecraft::name(q.dtype()));
  ops::Attrs a;
  a.ints = std::move(shape);
  a.i1 = stride;
  a.i2 = padding;
  return dispatch2<Op>(p, q, a, loc);
}
}  // namespace detail

namespace nn {

/// 2-D cross-correlation (as every framework's conv2d): x [N,C,H,W], w [O,C,kH,kW] →
/// [N,O,Ho,Wo], zero padding on all sides, one stride for both axes. Mixed dtypes promote.
/// One op (ops::Conv2d); its gradients are conv2d_grad_input and conv2d_grad_filter.
inline Tensor conv2d(const Tensor& x, const Tensor& w, std::int64_t stride = 1, std::int64_t padding = 0,
                     std::source_location loc = std::source_location::current()) {
  constexpr std::string_view op = ops::Conv2d::name;
  detail::require_defined(x, op, loc);
  detail::require_defined(w, op, loc);
  if (SC_UNLIKELY(x.rank() != 4 || w.rank() != 4))
    detail::fail<ShapeError>(op, loc, "expects x as [N, C, H, W] and w as [O, C, kH, kW], got ", x.shape(),
                             " and ", w.shape());
  // Checked before promotion, which would quietly turn a bool tensor into 0/1 numbers.
  if (SC_UNLIKELY(is_bool(x.dtype()) || is_bool(w.dtype())))
    detail::fail<DTypeError>(op, loc, "expects numeric tensors, got ", name(x.dtype()), " and ", name(w.dtype()));
  ops::Attrs a;
  a.i1 = stride;
  a.i2 = padding;
  return detail::dispatch2<ops::Conv2d>(x, w, a, loc);
}

/// The gradient of conv2d(x, w, stride, padding) with respect to x, for the output gradient g
/// [N,O,Ho,Wo]: the transposed convolution of g with w, of shape `input_shape` (x's shape).
inline Tensor conv2d_grad_input(const Tensor& g, const Tensor& w, Shape input_shape, std::int64_t stride,
                                std::int64_t padding, std::source_location loc = std::source_location::current()) {
  return detail::conv2d_grad<ops::Conv2dGradInput>(g, w, std::move(input_shape), stride, padding, loc);
}

/// The gradient of conv2d(x, w, stride, padding) with respect to w, for the output gradient g
/// [N,O,Ho,Wo]: the correlation of x with g summed over the batch, of shape `kernel_shape`.
inline Tensor conv2d_grad_filter(const Tensor& x, const Tensor& g, Shape kernel_shape, std::int64_t stride,
                                 std::int64_t padding, std::source_location loc = std::source_location::current()) {
  return detail::conv2d_grad<ops::Conv2dGradFilter>(x, g, std::move(kernel_shape), stride, padding, loc);
}

}  // namespace nn
}  // namespace stagecraft

namespace stagecraft {
// conv2d is bilinear in (x, w), and so are its two gradients, which makes the three ops
// closed under differentiation: each rule is one of them (second derivatives, staged
// backward passes). <h, grad_input(g, w)> = <conv2d(h, w), g> and <h, grad_filter(x, g)> =
// <conv2d(x, h), g>. Each input's gradient is made only when wanted.
inline std::vector<Tensor> ops::Conv2d::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs& a, Wanted wanted) {
  Tensor dx, dw;
  if (wanted[0]) dx = nn::conv2d_grad_input(g, in[1], in[0].shape(), a.i1, a.i2);
  if (wanted[1]) dw = nn::conv2d_grad_filter(in[0], g, in[1].shape(), a.i1, a.i2);
  return {std::move(dx), std::move(dw)};
}
inline std::vector<Tensor> ops::Conv2dGradInput::vjp(const Tensor& h, Inputs in, const Tensor&, const Attrs& a,
                                                     Wanted wanted) {
  Tensor dg, dw;
  if (wanted[0]) dg = nn::conv2d(h, in[1], a.i1, a.i2);
  if (wanted[1]) dw = nn::conv2d_grad_filter(h, in[0], in[1].shape(), a.i1, a.i2);
  return {std::move(dg), std::move(dw)};
}
inline std::vector<Tensor> ops::Conv2dGradFilter::vjp(const Tensor& h, Inputs in, const Tensor&, const Attrs& a,
                                                      Wanted wanted) {
  Tensor dx, dg;
  if (wanted[0]) dx = nn::conv2d_grad_input(in[1], h, in[0].shape(), a.i1, a.i2);
  if (wanted[1]) dg = nn::conv2d(in[0], h, a.i1, a.i2);
  return {std::move(dx), std::move(dg)};
}
}  // namespace stagecraft
