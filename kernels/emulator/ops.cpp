// The emulator's compute kernels beyond the elementwise ones: gather / scatter_add / take_along_axis /
// add_along_axis (gather.cu),
// softmax cross-entropy (xent.cu), im2col, col2im and the pools (conv.cu), the matrix products
// (gemm.cu: cuBLAS and cuBLASLt there, plain loops here), the optimizers' fused updates (optim.cu)
// and Philox sampling (random.cu). Each follows its .cu file's arguments checks, index rules,
// fault records and summation orders; where the GPU's order is a warp's (xent), the CPU op's
// sequential order is taken (a GPU's order is not the CPU's either). Naive loops: correctness,
// not speed.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include <cblas.h>

#include "../conv_elements.cuh"
#include "emu.hpp"
#include "stagecraft/detail/philox.hpp"
#include "stagecraft/ops/rules.hpp"

namespace stagecraft::cuda::emu {
namespace {

/// As gemm.cu's handle tables: a device number outside them is invalid.
constexpr int max_devices = 64;

/// emu::launch, with a failed allocation of the closure reported as CUDA would report it (the ABI
/// is noexcept).
template <class F>
Status queue(Stream s, F&& kernel, bool faults = false) noexcept {
  try {
    return launch(s, std::function<void()>(std::forward<F>(kernel)), faults);
  } catch (const std::bad_alloc&) {
    return memory_allocation;
  } catch (...) {
    return invalid_value;
  }
}

/// Calls f(T{}) for every dtype but bool (which the layout and convolution kernels do not take:
/// not supported, as their .cu files say).
template <class F>
Status visit_numeric(DT dt, F&& f) {
  return visit(dt, [&](auto tag) -> Status {
    if constexpr (std::is_same_v<decltype(tag), bool>) return abi::not_supported;
    else return f(tag);
  });
}

/// Calls f(I{}) for an index dtype (i32 or i64), as gather.cu's visit_index.
template <class F>
Status visit_index(DT index_dt, F&& f) {
  if (index_dt == DT::i32) return f(std::int32_t{});
  if (index_dt == DT::i64) return f(std::int64_t{});
  return abi::not_supported;
}

/// Calls f(T{}, I{}) for floating logits and integer labels, as xent.cu's visit_float_index.
template <class F>
Status visit_float_index(DT dt, DT label_dt, F&& f) {
  if (dt != DT::f32 && dt != DT::f64) return abi::not_supported;
  if (label_dt != DT::i32 && label_dt != DT::i64) return abi::not_supported;
  auto with_index = [&](auto ttag) -> Status {
    if (label_dt == DT::i32) return f(ttag, std::int32_t{});
    return f(ttag, std::int64_t{});
  };
  if (dt == DT::f32) return with_index(float{});
  return with_index(double{});
}

/// Calls f(T{}) for f32 or f64 (the optimizers and philox); anything else is not supported.
template <class F>
Status visit_float(DT dt, F&& f) {
  if (dt == DT::f32) return f(float{});
  if (dt == DT::f64) return f(double{});
  return abi::not_supported;
}

/// v unchanged, but opaque to the optimiser: a product passed through it is not contracted with
/// the following add into an FMA (GCC does in GNU mode), so each operation rounds on its own as
/// optim.cu's kernels (built with --fmad=false) and the CPU's fused loops do.
template <class T>
T rounded(T v) {
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
  __asm__("" : "+x"(v));
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__aarch64__)
  __asm__("" : "+w"(v));
#endif
  return v;
}

// ---- softmax cross-entropy -----------------------------------------------------------------

/// The shift of row x (C > 0): its maximum (the maximum rule: NaN wins), 0 when not finite.
template <class T>
T row_shift(const T* x, std::int64_t C) {
  T m = x[0];
  for (std::int64_t j = 1; j < C; ++j) m = rules::Maximum::f(x[j], m);
  return std::fabs(m) < std::numeric_limits<T>::infinity() ? m : T(0);
}

/// z[label] - log(sum(exp(z))) of row x; a label outside [0, C) is recorded (the label, and the
/// row as the record's bound) and gives 0, as xent.cu's row_value.
template <class T, class I>
double row_value(const T* x, I label, std::int64_t C, std::int64_t row, abi::Fault* fault, std::int32_t tag) {
  const auto l = static_cast<std::int64_t>(label);
  if (l < 0 || l >= C) {
    if (fault != nullptr) report_fault(fault, tag, l, row);
    return 0.0;
  }
  const T shift = row_shift(x, C);
  double s = 0;
  for (std::int64_t j = 0; j < C; ++j) s += static_cast<double>(rules::Exp::f(static_cast<T>(x[j] - shift)));
  return static_cast<double>(static_cast<T>(x[l] - shift)) - rules::Log::f(s);
}

// ---- matrix products -----------------------------------------------------------------------

/// The element of op(A) at (m, k) and of op(B) at (k, n), for row-major storage read transposed
/// by the flags (A stored K x M when ta, B stored N x K when tb).
inline std::int64_t a_at(const abi::GemmArgs& g, std::int64_t m, std::int64_t k) {
  return g.ta ? k * g.M + m : m * g.K + k;
}
inline std::int64_t b_at(const abi::GemmArgs& g, std::int64_t k, std::int64_t n) {
  return g.tb ? n * g.K + k : k * g.N + n;
}

/// One product C (M x N) = op(A) op(B); integers wrap (accumulated unsigned, as gemm.cu's
/// int_gemm_kernel), floats sum in their own type over k in order.
template <class T>
struct accumulator {
  using type = T;
};
template <class T>
  requires std::is_integral_v<T>
struct accumulator<T> {
  using type = std::make_unsigned_t<T>;
};

template <class T>
void product(const T* a, const T* b, T* c, const abi::GemmArgs& g) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    // Floats through the host's BLAS (as cuBLAS, a blocked product: its own summation order), so
    // that a convolutional model trains at a usable speed on the emulator.
    const auto ta = g.ta ? CblasTrans : CblasNoTrans, tb = g.tb ? CblasTrans : CblasNoTrans;
    const auto M = static_cast<blasint>(g.M), N = static_cast<blasint>(g.N), K = static_cast<blasint>(g.K);
    if constexpr (std::is_same_v<T, float>) cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.f, a, g.ta ? M : K, b, g.tb ? K : N, 0.f, c, N);
    else cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, a, g.ta ? M : K, b, g.tb ? K : N, 0.0, c, N);
    return;
  }
  using Acc = typename accumulator<T>::type;
  for (std::int64_t m = 0; m < g.M; ++m)
    for (std::int64_t n = 0; n < g.N; ++n) {
      Acc acc = 0;
      for (std::int64_t k = 0; k < g.K; ++k) acc += static_cast<Acc>(a[a_at(g, m, k)]) * static_cast<Acc>(b[b_at(g, k, n)]);
      c[m * g.N + n] = static_cast<T>(acc);
    }
}

/// Every batch of a product: A at a_offsets[i] (or i * a_stride), B alike, C at i * M * N. The
/// offsets were copied from the caller's host arrays (empty: none given).
template <class T>
void batched_product(const T* a, const T* b, T* c, const abi::GemmArgs& g, const std::vector<std::int64_t>& a_off,
                     const std::vector<std::int64_t>& b_off) {
  for (std::int64_t i = 0; i < g.batch; ++i) {
    const auto k = static_cast<std::size_t>(i);
    const T* ai = a + (a_off.empty() ? i * g.a_stride : a_off[k]);
    const T* bi = b + (b_off.empty() ? i * g.b_stride : b_off[k]);
    product(ai, bi, c + i * g.M * g.N, g);
  }
}

}  // namespace
}  // namespace stagecraft::cuda::emu

namespace stagecraft::cuda::abi {

// ---- gather.cu -------------------------------------------------------------------------------

Status gather(int itemsize, DT index_dt, const void* x, const void* ix, void* y, std::int64_t outer, std::int64_t E,
              std::int64_t inner, std::int64_t N, Fault* fault, std::int32_t tag, Stream s) noexcept {
  const std::int64_t n = outer * N * inner;
  if (n == 0) return emu::ok;
  return emu::visit_index(index_dt, [&](auto itag) -> Status {
    using I = decltype(itag);
    auto run = [&](auto wtag) -> Status {
      using W = decltype(wtag);  // elements moved as raw words of their size
      return emu::queue(
          s,
          [=] {
            const W* xp = emu::host(static_cast<const W*>(x));
            const I* ip = emu::host(static_cast<const I*>(ix));
            W* yp = emu::host(static_cast<W*>(y));
            for (std::int64_t e = 0; e < n; ++e) {
              const std::int64_t i = e % inner, k = (e / inner) % N, o = e / (inner * N);
              const auto given = static_cast<std::int64_t>(ip[k]);
              const std::int64_t j = given < 0 ? given + E : given;  // negative counts from the end
              if (j >= 0 && j < E) {
                yp[e] = xp[(o * E + j) * inner + i];
              } else {
                yp[e] = W(0);
                // The GPU's thread of the index's first element reports (the first fault wins).
                if (o == 0 && i == 0 && fault != nullptr) emu::report_fault(fault, tag, given, E);
              }
            }
          },
          true);
    };
    switch (itemsize) {
      case 1: return run(std::uint8_t{});
      case 4: return run(std::uint32_t{});
      case 8: return run(std::uint64_t{});
      default: return emu::invalid_value;
    }
  });
}

Status take_along_axis(int itemsize, DT index_dt, const void* x, const void* ix, void* y, std::int64_t outer,
                       std::int64_t E, std::int64_t inner, std::int64_t M, Fault* fault, std::int32_t tag,
                       Stream s) noexcept {
  const std::int64_t n = outer * M * inner;
  if (n == 0) return emu::ok;
  return emu::visit_index(index_dt, [&](auto itag) -> Status {
    using I = decltype(itag);
    auto run = [&](auto wtag) -> Status {
      using W = decltype(wtag);  // elements moved as raw words of their size
      return emu::queue(
          s,
          [=] {
            const W* xp = emu::host(static_cast<const W*>(x));
            const I* ip = emu::host(static_cast<const I*>(ix));
            W* yp = emu::host(static_cast<W*>(y));
            for (std::int64_t e = 0; e < n; ++e) {
              const std::int64_t i = e % inner, o = e / (inner * M);
              const auto given = static_cast<std::int64_t>(ip[e]);
              const std::int64_t j = given < 0 ? given + E : given;
              if (j >= 0 && j < E) {
                yp[e] = xp[(o * E + j) * inner + i];
              } else {
                yp[e] = W(0);
                if (fault != nullptr) emu::report_fault(fault, tag, given, E);  // the first fault wins
              }
            }
          },
          true);
    };
    switch (itemsize) {
      case 1: return run(std::uint8_t{});
      case 4: return run(std::uint32_t{});
      case 8: return run(std::uint64_t{});
      default: return emu::invalid_value;
    }
  });
}

/// scatter_add's and add_along_axis's launch, as gather.cu's copy_then_add: y = x first (a queued
/// copy of its own, as the device-to-device copy there), then, when there are updates (`count`),
/// the task add(T{}, I{}) returns, queued as the adding kernel.
template <class Add>
Status copy_then_add(DT dt, DT index_dt, const void* x, void* y, std::int64_t numel, std::int64_t count, Stream s,
                     Add&& add) {
  if (numel == 0) return emu::ok;
  return emu::visit_numeric(dt, [&](auto ttag) -> Status {
    using T = decltype(ttag);
    const auto bytes = static_cast<std::size_t>(numel) * sizeof(T);
    if (const Status e = emu::queue(s, [=] {
          const void* from = emu::host(x);
          void* to = emu::host(y);
          if (from != to) std::memmove(to, from, bytes);
        }))
      return e;
    if (count == 0) return emu::ok;
    return emu::visit_index(index_dt, [&](auto itag) -> Status { return emu::queue(s, add(ttag, itag), true); });
  });
}

Status add_along_axis(DT dt, DT index_dt, const void* x, const void* ix, const void* updates, void* y,
                      std::int64_t outer, std::int64_t E, std::int64_t inner, std::int64_t M, Fault* fault,
                      std::int32_t tag, Stream s) noexcept {
  return copy_then_add(dt, index_dt, x, y, outer * E * inner, M, s, [=](auto ttag, auto itag) {
    using T = decltype(ttag);
    using I = decltype(itag);
    return [=] {
      const I* ip = emu::host(static_cast<const I*>(ix));
      const T* up = emu::host(static_cast<const T*>(updates));
      T* yp = emu::host(static_cast<T*>(y));
      // Column by column (gather.cu's thread each), its updates in index order.
      for (std::int64_t c = 0; c < outer * inner; ++c) {
        const std::int64_t o = c / inner, i = c % inner;
        for (std::int64_t m = 0; m < M; ++m) {
          const std::int64_t e = (o * M + m) * inner + i;
          const auto given = static_cast<std::int64_t>(ip[e]);
          const std::int64_t j = given < 0 ? given + E : given;
          if (j >= 0 && j < E) yp[(o * E + j) * inner + i] += up[e];
          else if (fault != nullptr) emu::report_fault(fault, tag, given, E);
        }
      }
    };
  });
}

Status scatter_add(DT dt, DT index_dt, const void* x, const void* ix, const void* updates, void* y, std::int64_t outer,
                   std::int64_t E, std::int64_t inner, std::int64_t N, Fault* fault, std::int32_t tag, Stream s) noexcept {
  return copy_then_add(dt, index_dt, x, y, outer * E * inner, N, s, [=](auto ttag, auto itag) {
    using T = decltype(ttag);
    using I = decltype(itag);
    return [=] {
      const I* ip = emu::host(static_cast<const I*>(ix));
      const T* up = emu::host(static_cast<const T*>(updates));
      T* yp = emu::host(static_cast<T*>(y));
      // Column by column, each adding its updates in index order (duplicates accumulate
      // deterministically); the first column reports every bad index.
      for (std::int64_t c = 0; c < outer * inner; ++c) {
        const std::int64_t o = c / inner, i = c % inner;
        for (std::int64_t k = 0; k < N; ++k) {
          const auto given = static_cast<std::int64_t>(ip[k]);
          const std::int64_t j = given < 0 ? given + E : given;
          if (j >= 0 && j < E) yp[(o * E + j) * inner + i] += up[(o * N + k) * inner + i];
          else if (c == 0 && fault != nullptr) emu::report_fault(fault, tag, given, E);
        }
      }
    };
  });
}

// ---- xent.cu ---------------------------------------------------------------------------------

namespace {
/// softmax_cross_entropy's value (xent.cu's kernels): the rows' values summed in double in row
/// order (the CPU op's order; N = 0 gives NaN), each also put in scratch when given.
template <class T, class I>
void xent_loss(const T* xp, const I* lp, T* yp, double* sp, std::int64_t N, std::int64_t C, Fault* fault, std::int32_t tag) {
  double total = 0;
  for (std::int64_t r = 0; r < N; ++r) {
    const double v = emu::row_value(xp + r * C, lp[r], C, r, fault, tag);
    if (sp != nullptr) sp[r] = v;
    total += v;
  }
  *yp = static_cast<T>(-(total / static_cast<double>(N)));
}

/// softmax_cross_entropy_grad's rows (xent_grad_kernel); a bad label is recorded when fault is given.
template <class T, class I>
void xent_grad(const T* gp, const T* xp, const I* lp, T* dp, std::int64_t N, std::int64_t C, Fault* fault, std::int32_t tag) {
  const double scale = static_cast<double>(*gp) / static_cast<double>(N);
  for (std::int64_t r = 0; r < N; ++r) {
    const T* xr = xp + r * C;
    T* dr = dp + r * C;
    const auto l = static_cast<std::int64_t>(lp[r]);
    // A bad label is recorded; its row is still written (no class gets the -1).
    if ((l < 0 || l >= C) && fault != nullptr) emu::report_fault(fault, tag, l, r);
    const T shift = emu::row_shift(xr, C);
    double sum = 0;
    for (std::int64_t j = 0; j < C; ++j) {  // exp(z) stored first, then scaled
      const T e = rules::Exp::f(static_cast<T>(xr[j] - shift));
      dr[j] = e;
      sum += static_cast<double>(e);
    }
    for (std::int64_t j = 0; j < C; ++j)
      dr[j] = static_cast<T>((static_cast<double>(dr[j]) / sum - (j == l ? 1.0 : 0.0)) * scale);
  }
}
}  // namespace

Status softmax_cross_entropy(DT dt, DT label_dt, const void* x, const void* labels, void* y, std::int64_t N,
                             std::int64_t C, double* scratch, Fault* fault, std::int32_t tag, Stream s) noexcept {
  return emu::visit_float_index(dt, label_dt, [&](auto ttag, auto itag) -> Status {
    using T = decltype(ttag);
    using I = decltype(itag);
    // Past one block the GPU puts the rows' values in scratch: it must be there, and is written.
    const bool rows_in_scratch = N * C > xent_one_block;
    if (rows_in_scratch && scratch == nullptr) return emu::invalid_value;
    return emu::queue(
        s,
        [=] {
          xent_loss(emu::host(static_cast<const T*>(x)), emu::host(static_cast<const I*>(labels)), emu::host(static_cast<T*>(y)),
                    rows_in_scratch ? emu::host(scratch) : nullptr, N, C, fault, tag);
        },
        true);
  });
}

Status softmax_cross_entropy_grad(DT dt, DT label_dt, const void* g, const void* x, const void* labels, void* dx,
                                  std::int64_t N, std::int64_t C, Fault* fault, std::int32_t tag, Stream s) noexcept {
  if (N == 0 || C == 0) return emu::ok;
  return emu::visit_float_index(dt, label_dt, [&](auto ttag, auto itag) -> Status {
    using T = decltype(ttag);
    using I = decltype(itag);
    // g is read when the kernel runs: an earlier launch computed it.
    return emu::queue(
        s,
        [=] {
          xent_grad(emu::host(static_cast<const T*>(g)), emu::host(static_cast<const T*>(x)),
                    emu::host(static_cast<const I*>(labels)), emu::host(static_cast<T*>(dx)), N, C, fault, tag);
        },
        true);
  });
}

Status softmax_cross_entropy_both(DT dt, DT label_dt, const void* g, const void* x, const void* labels, void* y, void* dx,
                                  std::int64_t N, std::int64_t C, double* scratch, Fault* fault, std::int32_t tag,
                                  Stream s) noexcept {
  return emu::visit_float_index(dt, label_dt, [&](auto ttag, auto itag) -> Status {
    using T = decltype(ttag);
    using I = decltype(itag);
    const bool rows_in_scratch = N * C > xent_one_block;
    if (rows_in_scratch && scratch == nullptr) return emu::invalid_value;
    // One launch, as xent.cu's one-block kernel (its rows kernel and the mean are two: counted as one here).
    return emu::queue(
        s,
        [=] {
          const T* xp = emu::host(static_cast<const T*>(x));
          const I* lp = emu::host(static_cast<const I*>(labels));
          xent_loss(xp, lp, emu::host(static_cast<T*>(y)), rows_in_scratch ? emu::host(scratch) : nullptr, N, C, fault, tag);
          if (N > 0 && C > 0)  // (a bad label recorded once, by the loss)
            xent_grad(emu::host(static_cast<const T*>(g)), xp, lp, emu::host(static_cast<T*>(dx)), N, C,
                      static_cast<Fault*>(nullptr), tag);
        },
        true);
  });
}

// ---- conv.cu ---------------------------------------------------------------------------------

// The elements are conv.cu's own functions (conv_elements.cuh), with the index type it picks.

/// Runs f(dims) with g in int32 where its indices fit (conv_fits_int32, as conv.cu), else int64.
template <class F>
void by_index(const ConvGeometry& g, F&& f) {
  if (kernels::conv_fits_int32(g)) f(kernels::ConvDims<std::int32_t>::of(g));
  else f(kernels::ConvDims<std::int64_t>::of(g));
}

Status im2col(DT dt, const void* x, void* cols, const ConvGeometry& g, Stream s) noexcept {
  const std::int64_t n = g.N * g.C * g.kh * g.kw * g.Ho * g.Wo;
  if (n == 0) return emu::ok;
  const ConvGeometry geo = g;  // the closure may run after the caller's struct is gone
  return emu::visit_numeric(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    return emu::queue(s, [=] {
      const T* xp = emu::host(static_cast<const T*>(x));
      T* col = emu::host(static_cast<T*>(cols));
      by_index(geo, [&](auto d) {
        for (decltype(d.N) e = 0; e < n; ++e) col[e] = kernels::im2col_element(xp, d, e);
      });
    });
  });
}

Status col2im(DT dt, const void* cols, void* x, const ConvGeometry& g, Stream s) noexcept {
  const std::int64_t n = g.N * g.C * g.H * g.W;
  if (n == 0) return emu::ok;
  const ConvGeometry geo = g;
  return emu::visit_numeric(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    return emu::queue(s, [=] {
      const T* col = emu::host(static_cast<const T*>(cols));
      T* xp = emu::host(static_cast<T*>(x));
      by_index(geo, [&](auto d) {
        for (decltype(d.N) e = 0; e < n; ++e) xp[e] = kernels::col2im_element(col, d, e);
      });
    });
  });
}

Status pool2d(bool is_max, DT dt, const void* x, void* y, const ConvGeometry& g, Stream s) noexcept {
  const std::int64_t n = g.N * g.C * g.Ho * g.Wo;
  if (n == 0) return emu::ok;
  const ConvGeometry geo = g;
  return emu::visit_numeric(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    return emu::queue(s, [=] {
      const T* xp = emu::host(static_cast<const T*>(x));
      T* yp = emu::host(static_cast<T*>(y));
      by_index(geo, [&](auto d) {
        for (decltype(d.N) e = 0; e < n; ++e) yp[e] = kernels::pool2d_element(is_max, xp, d, e);
      });
    });
  });
}

Status max_pool2d_grad(DT dt, const void* g, const void* x, void* dx, const ConvGeometry& geo, Stream s) noexcept {
  const std::int64_t n = geo.N * geo.C * geo.H * geo.W;
  if (n == 0) return emu::ok;
  const ConvGeometry cg = geo;
  return emu::visit_numeric(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    return emu::queue(s, [=] {
      const T* gy = emu::host(static_cast<const T*>(g));
      const T* xp = emu::host(static_cast<const T*>(x));
      T* dp = emu::host(static_cast<T*>(dx));
      by_index(cg, [&](auto d) {
        for (decltype(d.N) e = 0; e < n; ++e) dp[e] = kernels::max_pool2d_grad_element(gy, xp, d, e);
      });
    });
  });
}

// ---- cudnn.cu: the emulator has no cuDNN (the caller takes the im2col path) --------------------

int cudnn_version(char* why, std::size_t why_size) noexcept {
  if (why != nullptr && why_size != 0) std::snprintf(why, why_size, "%s", "the CUDA emulator has no cuDNN");
  return 0;
}

Status cudnn_conv(ConvPass, DT, const void*, const void*, void*, const ConvGeometry&, std::int64_t, int,
                  Stream) noexcept {
  return not_supported;
}

// ---- gemm.cu ---------------------------------------------------------------------------------

Status gemm(DT dt, const void* a, const void* b, void* c, const GemmArgs& g, int device, Stream s) noexcept {
  if (g.M == 0 || g.N == 0 || g.batch == 0) return emu::ok;
  if (g.K == 0) {
    // An empty sum: C is zeros (gemm.cu's memset). (gemm.cu counts 8 bytes for b8, which the
    // library never multiplies; its element size is used here, not to write past C.)
    const std::size_t item = dt == DT::b8 ? 1 : dt == DT::f32 || dt == DT::i32 ? 4 : 8;
    const auto bytes = static_cast<std::size_t>(g.M * g.N * g.batch) * item;
    return emu::queue(s, [=] { std::memset(emu::host(c), 0, bytes); });
  }
  // The closure keeps its own copy of the offsets (host arrays the caller may free or reuse).
  GemmArgs args = g;
  std::vector<std::int64_t> a_off, b_off;
  try {
    if (g.a_offsets) a_off.assign(g.a_offsets, g.a_offsets + g.batch);
    if (g.b_offsets) b_off.assign(g.b_offsets, g.b_offsets + g.batch);
  } catch (const std::bad_alloc&) {
    return emu::memory_allocation;
  }
  args.a_offsets = args.b_offsets = nullptr;
  auto run = [&](auto tag) -> Status {
    using T = decltype(tag);
    return emu::queue(s, [=] {
      emu::batched_product(emu::host(static_cast<const T*>(a)), emu::host(static_cast<const T*>(b)),
                           emu::host(static_cast<T*>(c)), args, a_off, b_off);
    });
  };
  // Integers take gemm.cu's plain kernel, which needs no device handle.
  if (dt == DT::i32) return run(std::int32_t{});
  if (dt == DT::i64) return run(std::int64_t{});
  if (device < 0 || device >= emu::max_devices) return emu::invalid_device;
  if (dt != DT::f32 && dt != DT::f64) return not_supported;
  // cuBLAS counts in int: larger dimensions are the caller's error.
  constexpr std::int64_t int_max = std::numeric_limits<int>::max();
  if (g.M > int_max || g.N > int_max || g.K > int_max) return emu::invalid_value;
  if (dt == DT::f32) return run(float{});
  return run(double{});
}

Status gemm_bias(DT dt, const void* a, const void* b, const void* bias, void* c, const GemmArgs& g, bool relu, int device,
                 Stream s) noexcept {
  if (dt != DT::f32 || g.batch != 1 || g.a_offsets || g.b_offsets) return not_supported;
  if (g.M == 0 || g.N == 0) return emu::ok;
  if (g.K == 0) return not_supported;  // C is the bias alone: the caller's fallback does it
  if (device < 0 || device >= emu::max_devices) return emu::invalid_device;
  const GemmArgs args = g;
  return emu::queue(s, [=] {
    const float* ap = emu::host(static_cast<const float*>(a));
    const float* bp = emu::host(static_cast<const float*>(b));
    const float* vp = emu::host(static_cast<const float*>(bias));
    float* cp = emu::host(static_cast<float*>(c));
    emu::product(ap, bp, cp, args);
    // The epilogue: bias n added to column n of every row, then ReLU (the relu op's rule).
    for (std::int64_t m = 0; m < args.M; ++m)
      for (std::int64_t n = 0; n < args.N; ++n) {
        float& v = cp[m * args.N + n];
        v = v + vp[n];
        if (relu) v = rules::Relu::f(v);
      }
  });
}

Status gemm_bgrad(DT dt, const void* a, const void* b, void* c, void* bgrad, const GemmArgs& g, int device,
                  Stream s) noexcept {
  if (dt != DT::f32 || g.batch != 1 || g.a_offsets || g.b_offsets || g.tb) return not_supported;
  if (g.M == 0 || g.N == 0 || g.K == 0) return not_supported;  // nothing to sum, or an empty product
  if (device < 0 || device >= emu::max_devices) return emu::invalid_device;
  const GemmArgs args = g;
  return emu::queue(s, [=] {
    const float* ap = emu::host(static_cast<const float*>(a));
    const float* bp = emu::host(static_cast<const float*>(b));
    emu::product(ap, bp, emu::host(static_cast<float*>(c)), args);
    // bgrad[n]: column n of b (K x N, untransposed) summed over its K rows.
    float* gp = emu::host(static_cast<float*>(bgrad));
    for (std::int64_t n = 0; n < args.N; ++n) {
      float acc = 0;
      for (std::int64_t k = 0; k < args.K; ++k) acc += bp[k * args.N + n];
      gp[n] = acc;
    }
  });
}

// ---- optim.cu --------------------------------------------------------------------------------

namespace {

/// An update launch of count variables: checks as optim.cu's, then one kernel that runs
/// step(table entry, element) over each variable's elements in table order.
template <class Step>
Status update_launch(const UpdateTensor* t, int count, Stream s, Step step) {
  if (count < 0 || count > update_max_tensors) return emu::invalid_value;
  std::int64_t total = 0;
  for (int k = 0; k < count; ++k) total += t[k].n;
  if (total == 0) return emu::ok;  // (optim.cu launches no empty grid)
  try {
    std::vector<UpdateTensor> table(t, t + count);  // (the closure may run later: a copy)
    return emu::queue(s, [table = std::move(table), step] {
      for (const UpdateTensor& u : table)
        for (std::int64_t i = 0; i < u.n; ++i) step(u, i);
    });
  } catch (const std::bad_alloc&) {
    return emu::memory_allocation;
  }
}

template <class T>
const T* in(const UpdateTensor& u, int k) {
  return u.in[k] != nullptr ? emu::host(static_cast<const T*>(u.in[k])) : nullptr;
}
template <class T>
T* out(const UpdateTensor& u, int k) {
  return emu::host(static_cast<T*>(u.out[k]));
}

}  // namespace

Status adam_update(DT dt, const UpdateTensor* t, int count, const void* lr, double lr_host, double a1, double a2,
                   double eps, bool decayed, const void* decay, double decay_host, Stream s) noexcept {
  return emu::visit_float(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    // The constants rounded to T at the launch, as optim.cu's kernel does with its parameters.
    const T r_host = static_cast<T>(lr_host), c1 = static_cast<T>(a1), c2 = static_cast<T>(a2), e = static_cast<T>(eps);
    const T d_host = static_cast<T>(decay_host);
    return update_launch(t, count, s, [=](const UpdateTensor& u, std::int64_t i) {
      // A device rate is read when the kernel runs (an earlier launch may compute it); every
      // operation rounded on its own, in the composite's order.
      const T r = lr != nullptr ? *emu::host(static_cast<const T*>(lr)) : r_host;
      const T gi = in<T>(u, 0)[i], m0 = in<T>(u, 1)[i], v0 = in<T>(u, 2)[i], wt = in<T>(u, 3)[i];
      const T d = decay != nullptr ? *emu::host(static_cast<const T*>(decay)) : d_host;
      const T w0 = decayed ? T(wt - emu::rounded(T(wt * d))) : wt;  // AdamW's decoupled decay first
      const T tiny = rules::math::smallest_normal<T>();  // the moments stored with subnormals flushed
      const T mi = rules::FlushSubnormal::f(T(m0 + emu::rounded(T((gi - m0) * c1))), tiny);
      const T vi = rules::FlushSubnormal::f(T(v0 + emu::rounded(T((emu::rounded(T(gi * gi)) - v0) * c2))), tiny);
      const T step = emu::rounded(T(mi * r)) / T(rules::Sqrt::f(vi) + e);
      out<T>(u, 0)[i] = mi;
      out<T>(u, 1)[i] = vi;
      out<T>(u, 2)[i] = w0 - step;
    });
  });
}

Status sgd_update(DT dt, const UpdateTensor* t, int count, const void* lr, double lr_host, double momentum,
                  bool nesterov, Stream s) noexcept {
  return emu::visit_float(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    const T r_host = static_cast<T>(lr_host), mu = static_cast<T>(momentum);
    return update_launch(t, count, s, [=](const UpdateTensor& u, std::int64_t i) {
      const T r = lr != nullptr ? *emu::host(static_cast<const T*>(lr)) : r_host;
      const T step = emu::rounded(T(in<T>(u, 0)[i] * r));
      const T wi = in<T>(u, 1)[i];
      const T* vel = in<T>(u, 2);
      if (vel == nullptr) {  // no momentum: vel1 is not written
        out<T>(u, 0)[i] = wi - step;
        return;
      }
      const T next = rules::FlushSubnormal::f(T(emu::rounded(T(vel[i] * mu)) - step), rules::math::smallest_normal<T>());
      out<T>(u, 1)[i] = next;
      out<T>(u, 0)[i] = wi + (nesterov ? T(emu::rounded(T(next * mu)) - step) : next);
    });
  });
}

// ---- random.cu -------------------------------------------------------------------------------

Status philox(bool normal, DT dt, const std::int64_t* state, double p0, double p1, void* y, std::int64_t n,
              Stream s) noexcept {
  if (n == 0) return emu::ok;
  return emu::visit_float(dt, [&](auto tag) -> Status {
    using F = decltype(tag);
    return emu::queue(s, [=] {
      // The state {key, offset} is read when the kernel runs (an earlier launch may advance it).
      const std::int64_t* st = emu::host(state);
      const auto key = static_cast<std::uint64_t>(st[0]), offset = static_cast<std::uint64_t>(st[1]);
      F* yp = emu::host(static_cast<F*>(y));
      // Block blk of four samples from the CPU op's own code (detail/philox.hpp), as each GPU
      // thread makes one.
      const std::int64_t blocks = (n + 3) / 4;
      for (std::int64_t blk = 0; blk < blocks; ++blk) {
        const auto words = detail::random_block(key, offset + static_cast<std::uint64_t>(blk));
        F v[4];
        if (normal) detail::normal4(words, p0, p1, v);
        else detail::uniform4(words, p0, p1, v);
        for (int k = 0; k < 4 && blk * 4 + k < n; ++k) yp[blk * 4 + k] = v[k];
      }
    });
  });
}

}  // namespace stagecraft::cuda::abi
