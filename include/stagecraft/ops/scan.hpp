// Scans along an axis: cumsum, cumprod, logcumsumexp, cummax and cummin (the running value),
// cumargmax and cumargmin (where it was reached), and linear_scan (h = a * h + b, the recurrence
// of linear RNNs and state-space layers). Each inclusive or exclusive where that means something,
// forward or reversed. The steps are ops/scan_steps.hpp's, shared with the GPU.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <source_location>
#include <type_traits>
#include <vector>

#include "../backend/cpu/elementwise.hpp"
#include "../backend/cpu/parallel.hpp"
#include "../eager/dispatch.hpp"
#include "along_axis.hpp"
#include "binary.hpp"
#include "broadcast_to.hpp"
#include "fill.hpp"
#include "gather.hpp"
#include "reshape.hpp"
#include "rules.hpp"
#include "scan_steps.hpp"
#include "unary.hpp"
#include "where.hpp"

namespace stagecraft {
namespace ops {

static_assert(static_cast<int>(backend::cuda::abi::ScanRule::sum) == static_cast<int>(scan_steps::Rule::sum) &&
                  static_cast<int>(backend::cuda::abi::ScanRule::prod) == static_cast<int>(scan_steps::Rule::prod) &&
                  static_cast<int>(backend::cuda::abi::ScanRule::logsumexp) ==
                      static_cast<int>(scan_steps::Rule::logsumexp) &&
                  static_cast<int>(backend::cuda::abi::ScanRule::max) == static_cast<int>(scan_steps::Rule::max) &&
                  static_cast<int>(backend::cuda::abi::ScanRule::min) == static_cast<int>(scan_steps::Rule::min),
              "stagecraft: abi::ScanRule and scan_steps::Rule must number the rules alike");

namespace detail_scan {

/// The state after element (at, k): s.next where the steps have one (a step that reads its
/// element in place), else the join of the state and the element's own state.
template <class S>
inline typename S::State advance(const S& s, const typename S::State& acc, std::int64_t at, std::int64_t k) {
  if constexpr (requires { s.next(acc, at, k); }) return s.next(acc, at, k);
  else return S::join(acc, s.element(at, k));
}

/// Runs the scan `s` (a scan_steps type) down every line of [outer, n, inner] into y, the lines
/// forward or from the end; exclusive writes each line's state before its element (the identity's
/// value first). A line's first element starts the state itself (identity joined with it would
/// turn -0 into +0 in a sum, and read linear_scan's first a). Contiguous lines (inner == 1) run a
/// thread range of lines each; strided ones in units of an outer index and up to 256 inner
/// positions, whose states step down the axis together (a vector loop).
template <class S>
void run(const S& s, typename S::Out* y, const AxisSplit& sp, bool exclusive, bool reverse, std::int64_t row_grain,
         std::int64_t block_grain) {
  using State = typename S::State;
  const std::int64_t outer = sp.outer, n = sp.n, inner = sp.inner;
  if (outer == 0 || n == 0 || inner == 0) return;
  if (inner == 1) {
    // each step waits for the last (a dependent add is ~4 cycles), so fewer elements a thread pay
    // for its start-up than in a vector loop: row_grain
    backend::cpu::parallel_rows(outer, n, row_grain, [&](std::int64_t ob, std::int64_t oe) {
      const std::int64_t step = reverse ? -1 : 1, first = reverse ? n - 1 : 0;
      for (std::int64_t o = ob; o < oe; ++o) {
        const std::int64_t base = o * n;
        auto* yr = y + base;
        State acc = s.element(base + first, first);
        yr[first] = exclusive ? S::out(S::identity()) : S::out(acc);
        if (exclusive) {
          for (std::int64_t j = 1, k = first + step; j < n; ++j, k += step) {
            yr[k] = S::out(acc);
            acc = advance(s, acc, base + k, k);
          }
        } else {
          for (std::int64_t j = 1, k = first + step; j < n; ++j, k += step) {
            acc = advance(s, acc, base + k, k);
            yr[k] = S::out(acc);
          }
        }
      }
    });
    return;
  }
  backend::cpu::parallel_column_blocks(outer, inner, n, block_grain, [&](std::int64_t o, std::int64_t i0, std::int64_t w) {
    State st[backend::cpu::column_block];
    const std::int64_t base = o * n * inner + i0;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t k = reverse ? n - 1 - j : j, row = base + k * inner;
      auto* yk = y + row;
      if (j == 0) {
        for (std::int64_t i = 0; i < w; ++i) {
          st[i] = s.element(row + i, k);
          yk[i] = exclusive ? S::out(S::identity()) : S::out(st[i]);
        }
      } else if (exclusive) {
        for (std::int64_t i = 0; i < w; ++i) {
          yk[i] = S::out(st[i]);
          st[i] = advance(s, st[i], row + i, k);
        }
      } else {
        for (std::int64_t i = 0; i < w; ++i) {
          st[i] = advance(s, st[i], row + i, k);
          yk[i] = S::out(st[i]);
        }
      }
    }
  });
}

// ---- logcumsumexp on SIMD batches ------------------------------------------------------------
// log_add_exp costs an exp and a log1p a step, on the running value's chain: ~15 ns an element
// one at a time. Both paths below put the transcendentals on batches, every lane of them
// (tails padded), so a value does not depend on where in a row it falls.

/// log_add_exp (scan_steps) on batches: the same formula, d = -|a - b| being the scalar form's d.
template <class B>
SC_ALWAYS_INLINE B log_add_exp_batch(const B& a, const B& b) {
  using T = typename B::value_type;
  const B big = xsimd::select(a > b, a, b), d = -xsimd::abs(a - b);
  const B r = big + rules::Log1p::f(rules::exp_full(d));
  return xsimd::select(a == b, a + B(T(0.693147180559945309417232121458176568)), r);
}

/// logcumsumexp of one contiguous line, in blocks of 256 in scan order: the running maximum m
/// (cummax's rule, so a NaN stays), then on batches a = e^(m_prev - m) and e = e^(x - m), then
/// in order the sum s = a s + e of the e^(x - m) so far (rescaled each time m grows: s >= 1 once
/// an element counts, so nothing underflows), then on batches y = m + log s (m itself where it is
/// infinite: +inf stays, and -inf while no element counts). One multiply-add on the chain.
template <class T>
void logcumsumexp_line(const T* x, T* y, std::int64_t n, bool exclusive, bool reverse) {
  using B = xsimd::batch<T>;
  constexpr std::int64_t L = static_cast<std::int64_t>(B::size), block = 256;
  constexpr T ninf = -std::numeric_limits<T>::infinity();
  // m[L - 1]: the maximum before the block; m[L + i]: after its element i
  alignas(64) T xs[block], m[block + L], a[block], e[block];
  const auto at = [&](std::int64_t j) { return reverse ? n - 1 - j : j; };
  T m_carry = ninf, s = 0;
  std::int64_t out = 0;  // the scan position the next result goes to
  if (exclusive && n > 0) y[at(out++)] = ninf;
  for (std::int64_t j0 = 0; j0 < n; j0 += block) {
    const std::int64_t w = std::min(block, n - j0), wp = (w + L - 1) / L * L;
    T mx = m_carry;
    for (std::int64_t i = 0; i < w; ++i) {
      const T v = x[at(j0 + i)];
      xs[i] = v;
      m[L + i] = mx = scan_steps::Join<scan_steps::Rule::max>::f(mx, v);
    }
    for (std::int64_t i = w; i < wp; ++i) xs[i] = m[L + i] = 0;
    m[L - 1] = m_carry;
    for (std::int64_t i = 0; i < wp; i += L) {
      const B mp = B::load_unaligned(m + L - 1 + i), mc = B::load_aligned(m + L + i), xv = B::load_aligned(xs + i);
      xsimd::select(mp == B(ninf), B(0), rules::exp_full(B(mp - mc))).store_aligned(a + i);
      xsimd::select(mc == B(ninf), B(0), rules::exp_full(B(xv - mc))).store_aligned(e + i);
    }
    for (std::int64_t i = 0; i < w; ++i) e[i] = s = a[i] * s + e[i];
    for (std::int64_t i = 0; i < wp; i += L) {
      const B mc = B::load_aligned(m + L + i);
      xsimd::select(xsimd::isinf(mc), mc, B(mc + rules::log_full(B::load_aligned(e + i)))).store_aligned(e + i);
    }
    for (std::int64_t i = 0; i < w && out < n; ++i) y[at(out++)] = e[i];
    m_carry = m[L + w - 1];
  }
}

/// logcumsumexp down strided lines: as run()'s units of an outer index and up to 256 inner
/// positions, the states a batch at a time (log_add_exp_batch), the last batch padded.
template <class T>
void logcumsumexp_strided(const T* x, T* y, const AxisSplit& sp, bool exclusive, bool reverse, std::int64_t grain) {
  using B = xsimd::batch<T>;
  constexpr std::int64_t L = static_cast<std::int64_t>(B::size);
  constexpr T ninf = -std::numeric_limits<T>::infinity();
  const std::int64_t n = sp.n, inner = sp.inner;
  backend::cpu::parallel_column_blocks(sp.outer, inner, n, grain, [&](std::int64_t o, std::int64_t i0, std::int64_t w) {
    alignas(64) T st[backend::cpu::column_block], buf[L];
    const std::int64_t wp = (w + L - 1) / L * L, base = o * n * inner + i0;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t row = base + (reverse ? n - 1 - j : j) * inner;
      const T* xk = x + row;
      T* yk = y + row;
      if (j == 0) {
        for (std::int64_t i = 0; i < w; ++i) {
          st[i] = xk[i];
          yk[i] = exclusive ? ninf : xk[i];
        }
        for (std::int64_t i = w; i < wp; ++i) st[i] = 0;
        continue;
      }
      if (exclusive) std::copy(st, st + w, yk);
      for (std::int64_t i = 0; i < wp; i += L) {
        B v;
        if (i + L <= w) {
          v = B::load_unaligned(xk + i);
        } else {  // the last lanes: padded through buf
          std::copy(xk + i, xk + w, buf);
          std::fill(buf + (w - i), buf + L, T(0));
          v = B::load_aligned(buf);
        }
        log_add_exp_batch(B::load_aligned(st + i), v).store_aligned(st + i);
      }
      if (!exclusive) std::copy(st, st + w, yk);
    }
  });
}

/// cumargmax and cumargmin: the running extreme and its index as two values (Arg's join on the
/// pair, without its identity, which no line meets on the CPU): rows a line at a time, strided
/// lines as run()'s units with the values and indices in two arrays (a vector loop).
template <class T, bool IsMax>
void cum_arg(const T* x, std::int64_t* y, const AxisSplit& sp, bool reverse) {
  using Steps = scan_steps::Arg<T, IsMax>;
  const std::int64_t outer = sp.outer, n = sp.n, inner = sp.inner;
  if (outer == 0 || n == 0 || inner == 0) return;
  if (inner == 1) {
    backend::cpu::parallel_rows(outer, n, backend::cpu::grain_costly, [&](std::int64_t ob, std::int64_t oe) {
      const std::int64_t step = reverse ? -1 : 1, first = reverse ? n - 1 : 0;
      for (std::int64_t o = ob; o < oe; ++o) {
        const T* xr = x + o * n;
        std::int64_t* yr = y + o * n;
        T best = xr[first];
        std::int64_t at = first;
        yr[first] = first;
        for (std::int64_t j = 1, k = first + step; j < n; ++j, k += step) {
          const T v = xr[k];
          const bool up = Steps::beats(v, best);
          best = up ? v : best;
          at = up ? k : at;
          yr[k] = at;
        }
      }
    });
    return;
  }
  backend::cpu::parallel_column_blocks(outer, inner, n, backend::cpu::grain_cheap,
                                       [&](std::int64_t o, std::int64_t i0, std::int64_t w) {
    T best[backend::cpu::column_block];
    std::int64_t at[backend::cpu::column_block];
    const std::int64_t base = o * n * inner + i0;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t k = reverse ? n - 1 - j : j, row = base + k * inner;
      const T* xk = x + row;
      std::int64_t* yk = y + row;
      if (j == 0) {
        for (std::int64_t i = 0; i < w; ++i) best[i] = xk[i], at[i] = k, yk[i] = k;
        continue;
      }
      for (std::int64_t i = 0; i < w; ++i) {
        const T v = xk[i];
        const bool up = Steps::beats(v, best[i]);
        best[i] = up ? v : best[i];
        at[i] = up ? k : at[i];
        yk[i] = at[i];
      }
    }
  });
}

/// The shared checks of the scans: rank >= 1 and a valid axis.
inline void check_axis(const Tensor& x, const Attrs& a, std::string_view op, const std::source_location& loc) {
  if (x.rank() == 0)
    detail::fail<ShapeError>(op, loc, "needs a tensor of rank >= 1 (an axis to run along), got shape ", x.shape());
  (void)normalize_axis(a.axis, x.rank(), op, loc);
}

}  // namespace detail_scan

/// The scans of one running value (attrs: axis; i0 exclusive; i1 reverse), its rule R from
/// scan_steps. Numeric dtypes (logcumsumexp: f32 or f64), the result in x's.
template <class D, scan_steps::Rule R>
struct ValueScan {
  static constexpr int arity = 1;
  static constexpr bool floats_only = R == scan_steps::Rule::logsumexp;
  template <class T>
  static constexpr bool takes = !std::is_same_v<T, bool> && (!floats_only || std::is_floating_point_v<T>);

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    const Tensor& x = in[0];
    if constexpr (floats_only) require_dtype(is_floating(x.dtype()), D::name, x.dtype(), "f32 or f64", loc);
    else require_dtype(!is_bool(x.dtype()), D::name, x.dtype(), "numeric dtypes", loc);
    detail_scan::check_axis(x, a, D::name, loc);
    return {x.shape(), x.dtype()};
  }

  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    const AxisSplit sp = axis_split(in[0].shape(), a.axis);
    backend::cuda::scan(static_cast<backend::cuda::abi::ScanRule>(R), in[0], out, sp.outer, sp.n, sp.inner,
                        a.i0 != 0, a.i1 != 0, D::name, loc);
  }

  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    const AxisSplit sp = axis_split(in[0].shape(), a.axis);
    visit_dtype(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (takes<T>) {
        // log_add_exp costs an exp and a log1p an element: threads pay off on fewer of them
        constexpr std::int64_t block_grain =
            R == scan_steps::Rule::logsumexp ? backend::cpu::grain_costly : backend::cpu::grain_cheap;
        const T* x = static_cast<const T*>(in[0].raw_data());
        T* y = static_cast<T*>(out.raw_data());
        if constexpr (R == scan_steps::Rule::logsumexp && backend::cpu::Vectorizable<T>) {
          if (sp.inner == 1) {
            backend::cpu::parallel_rows(sp.outer, sp.n, backend::cpu::grain_costly, [&](std::int64_t ob, std::int64_t oe) {
              for (std::int64_t o = ob; o < oe; ++o)
                detail_scan::logcumsumexp_line(x + o * sp.n, y + o * sp.n, sp.n, a.i0 != 0, a.i1 != 0);
            });
          } else if (sp.outer > 0 && sp.n > 0) {
            detail_scan::logcumsumexp_strided(x, y, sp, a.i0 != 0, a.i1 != 0, block_grain);
          }
          return;
        }
        detail_scan::run(scan_steps::Values<T, R>{x}, y, sp, a.i0 != 0, a.i1 != 0, backend::cpu::grain_costly,
                         block_grain);
      }
    });
  }
};

/// y[..., k, ...] = x[..., 0, ...] + ... + x[..., k, ...] along `axis` (attrs: axis; i0 exclusive:
/// the sum before k, 0 first; i1 reverse: from the end). Numeric dtypes, the result in x's
/// (integer sums wrap, as sum's do). Floats add in order along the axis on the CPU (NumPy's
/// numbers); a GPU adds a long line in a tree per block of 256, so the last bits may differ.
struct Cumsum : ValueScan<Cumsum, scan_steps::Rule::sum> {
  SC_OP_HEAD(Cumsum, "cumsum")
  /// The gradient of a running sum is the running sum of g the other way (exclusive stays so).
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};

/// The running product (as Cumsum; integer products wrap). Its gradient needs no division, so
/// zeros in x are fine: see the rule below.
struct Cumprod : ValueScan<Cumprod, scan_steps::Rule::prod> {
  SC_OP_HEAD(Cumprod, "cumprod")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};

/// y[k] = log(e^x[0] + ... + e^x[k]) without overflow (as Cumsum; exclusive starts at -inf).
/// f32 or f64.
struct Logcumsumexp : ValueScan<Logcumsumexp, scan_steps::Rule::logsumexp> {
  SC_OP_HEAD(Logcumsumexp, "logcumsumexp")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};

/// The running maximum (attrs: axis; i1 reverse). A NaN propagates from where it is met. Its
/// gradient goes to the element cumargmax names.
struct Cummax : ValueScan<Cummax, scan_steps::Rule::max> {
  SC_OP_HEAD(Cummax, "cummax")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};

/// The running minimum, as Cummax.
struct Cummin : ValueScan<Cummin, scan_steps::Rule::min> {
  SC_OP_HEAD(Cummin, "cummin")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};

/// The index along the axis (i64) where the running maximum (minimum) was first reached, in scan
/// order (attrs: axis; i1 reverse): x there is cummax's (cummin's) value. A NaN beats every
/// number and keeps the first NaN's index, as argmax. Numeric dtypes.
template <class D, bool IsMax>
struct CumArg {
  static constexpr int arity = 1;
  static constexpr bool differentiable = false;

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    const Tensor& x = in[0];
    require_dtype(!is_bool(x.dtype()), D::name, x.dtype(), "numeric dtypes", loc);
    detail_scan::check_axis(x, a, D::name, loc);
    return {x.shape(), DType::i64};
  }

  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    const AxisSplit sp = axis_split(in[0].shape(), a.axis);
    backend::cuda::cum_arg(IsMax, in[0], out, sp.outer, sp.n, sp.inner, a.i1 != 0, D::name, loc);
  }

  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    const AxisSplit sp = axis_split(in[0].shape(), a.axis);
    visit_dtype(in[0].dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (!std::is_same_v<T, bool>)
        detail_scan::cum_arg<T, IsMax>(static_cast<const T*>(in[0].raw_data()), static_cast<std::int64_t*>(out.raw_data()),
                                       sp, a.i1 != 0);
    });
  }
};
struct CumArgMax : CumArg<CumArgMax, true> {
  SC_OP_HEAD(CumArgMax, "cumargmax")
};
struct CumArgMin : CumArg<CumArgMin, false> {
  SC_OP_HEAD(CumArgMin, "cumargmin")
};

/// h[k] = a[k] * h[k-1] + b[k] along `axis` with nothing before the first element (h = b there;
/// that a is not read). Inputs (a, b) of one shape and one float dtype (the public function
/// broadcasts them); attrs: axis; i0 exclusive (h of the element before, 0 first); i1 reverse.
struct LinearScan {
  SC_OP_HEAD(LinearScan, "linear_scan")
  static constexpr int arity = 2;

  static OutMeta infer(Inputs in, const Attrs& at, const std::source_location& loc) {
    const Tensor& a = in[0];
    const Tensor& b = in[1];
    require_dtype(is_floating(a.dtype()), name, a.dtype(), "f32 or f64", loc);
    if (SC_UNLIKELY(a.dtype() != b.dtype()))
      detail::fail<DTypeError>(name, loc, "a has dtype ", stagecraft::name(a.dtype()), ", b has dtype ",
                               stagecraft::name(b.dtype()), ": they must match");
    if (SC_UNLIKELY(a.shape() != b.shape()))
      detail::fail<ShapeError>(name, loc, "a has shape ", a.shape(), ", b has shape ", b.shape(), ": they must match");
    detail_scan::check_axis(a, at, name, loc);
    return {a.shape(), a.dtype()};
  }

  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    const AxisSplit sp = axis_split(in[0].shape(), a.axis);
    backend::cuda::linear_scan(in[0], in[1], out, sp.outer, sp.n, sp.inner, a.i0 != 0, a.i1 != 0, name, loc);
  }

  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    const AxisSplit sp = axis_split(in[0].shape(), a.axis);
    visit_dtype(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_floating_point_v<T>)
        detail_scan::run(scan_steps::LinearInOrder<T>{static_cast<const T*>(in[0].raw_data()),
                                                       static_cast<const T*>(in[1].raw_data())},
                         static_cast<T*>(out.raw_data()), sp, a.i0 != 0, a.i1 != 0, backend::cpu::grain_costly,
                         backend::cpu::grain_cheap);
    });
  }

  /// Linear in b with a's coefficients run the other way; a's gradient is b's times the h before.
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a, Wanted w);
};

}  // namespace ops

namespace detail {
inline Tensor scan_call(auto op_tag, const Tensor& x, std::int64_t axis, bool exclusive, bool reverse,
                        const std::source_location& loc) {
  using Op = decltype(op_tag);
  ops::Attrs a;
  a.axis = axis;
  a.i0 = exclusive ? 1 : 0;
  a.i1 = reverse ? 1 : 0;
  return dispatch<Op>({&x, 1}, a, loc);
}
}  // namespace detail

/// The running sum of x along `axis` (NumPy's and TensorFlow's cumsum): exclusive starts each
/// line at 0 and leaves the last element out; reverse runs from the end. Numeric dtypes, the
/// result in x's (integer sums wrap). On a GPU a line runs as a block's scan (or, with many lines,
/// a thread each). Its gradient is the reversed running sum of the incoming gradient.
inline Tensor cumsum(const Tensor& x, std::int64_t axis = 0, bool exclusive = false, bool reverse = false,
                     std::source_location loc = std::source_location::current()) {
  return detail::scan_call(ops::Cumsum{}, x, axis, exclusive, reverse, loc);
}

/// The running product of x along `axis` (NumPy's cumprod, TensorFlow's with exclusive and
/// reverse): exclusive starts each line at 1. Numeric dtypes, the result in x's (integer products
/// wrap). Its gradient is exact with zeros in x (no division by x).
inline Tensor cumprod(const Tensor& x, std::int64_t axis = 0, bool exclusive = false, bool reverse = false,
                      std::source_location loc = std::source_location::current()) {
  return detail::scan_call(ops::Cumprod{}, x, axis, exclusive, reverse, loc);
}

/// log(cumsum(exp(x))) along `axis` without overflow or underflow (PyTorch's logcumsumexp,
/// TensorFlow's cumulative_logsumexp): exclusive starts each line at -inf. f32 or f64. Entries of
/// -inf take no part (their gradient is 0); the gradient is computed stably in a reversed scan.
inline Tensor logcumsumexp(const Tensor& x, std::int64_t axis = 0, bool exclusive = false, bool reverse = false,
                           std::source_location loc = std::source_location::current()) {
  return detail::scan_call(ops::Logcumsumexp{}, x, axis, exclusive, reverse, loc);
}

/// The running maximum of x along `axis` (NumPy's maximum.accumulate, PyTorch's cummax values),
/// from the end with reverse. Numeric dtypes; a NaN propagates from where it is met. The gradient
/// goes to the element where each running maximum was first reached (cumargmax).
inline Tensor cummax(const Tensor& x, std::int64_t axis = 0, bool reverse = false,
                     std::source_location loc = std::source_location::current()) {
  return detail::scan_call(ops::Cummax{}, x, axis, false, reverse, loc);
}

/// The running minimum of x along `axis`, as cummax.
inline Tensor cummin(const Tensor& x, std::int64_t axis = 0, bool reverse = false,
                     std::source_location loc = std::source_location::current()) {
  return detail::scan_call(ops::Cummin{}, x, axis, false, reverse, loc);
}

/// The index along `axis` (i64) of each running maximum of x (PyTorch's cummax indices): where it
/// was first reached in scan order, so take_along_axis(x, cumargmax(x, a), a) == cummax(x, a). A NaN
/// counts above every number (the first NaN's index stays). Not differentiable.
inline Tensor cumargmax(const Tensor& x, std::int64_t axis = 0, bool reverse = false,
                        std::source_location loc = std::source_location::current()) {
  return detail::scan_call(ops::CumArgMax{}, x, axis, false, reverse, loc);
}

/// The index along `axis` of each running minimum of x, as cumargmax (a NaN counts below every number).
inline Tensor cumargmin(const Tensor& x, std::int64_t axis = 0, bool reverse = false,
                        std::source_location loc = std::source_location::current()) {
  return detail::scan_call(ops::CumArgMin{}, x, axis, false, reverse, loc);
}

/// The linear recurrence h[k] = a[k] * h[k-1] + b[k] along `axis`, h before the first element 0
/// (so h = b there): the scan of linear RNNs and state-space layers (a decay or gate a, an input
/// b). a and b broadcast together and share a float dtype. exclusive gives each element the h
/// before it (0 first); reverse runs from the end (h[k] = a[k] h[k+1] + b[k]). Differentiable in
/// both; on a GPU a long line is scanned by a block in a tree (maps composed), so the last bits may
/// differ from the CPU's loop.
inline Tensor linear_scan(const Tensor& a, const Tensor& b, std::int64_t axis = 0, bool exclusive = false,
                          bool reverse = false, std::source_location loc = std::source_location::current()) {
  detail::require_defined(a, ops::LinearScan::name, loc);
  detail::require_defined(b, ops::LinearScan::name, loc);
  ops::Attrs at;
  at.axis = axis;
  at.i0 = exclusive ? 1 : 0;
  at.i1 = reverse ? 1 : 0;
  if (a.shape() == b.shape()) return detail::dispatch2<ops::LinearScan>(a, b, at, loc);
  Shape s;
  if (SC_UNLIKELY(!broadcast_shapes(a.shape(), b.shape(), s)))
    detail::fail<ShapeError>(ops::LinearScan::name, loc, "a of shape ", a.shape(), " and b of shape ", b.shape(),
                             " do not broadcast together");
  return detail::dispatch2<ops::LinearScan>(broadcast_to(a, s, loc), broadcast_to(b, s, loc), at, loc);
}

// ---- gradient rules (after the functions they use) -------------------------------------------

inline std::vector<Tensor> ops::Cumsum::vjp(const Tensor& g, Inputs, const Tensor&, const Attrs& a) {
  return {cumsum(g, a.axis, a.i0 != 0, a.i1 == 0)};
}

// y[k] = P(k) the product up to k. dx[j] = sum over k >= j of g[k] P(k) / x[j], without the
// division: (the product before j) * T[j], T[j] = g[j] + x[j+1] T[j+1], a reversed linear scan.
// With U = x T: U[j] = x[j] g[j] + x[j] U[j+1], and T = g + U one step on: the exclusive reversed
// scan of (x, x g). Exclusive: dx[j] = (the product before j) * V[j+1], V[j] = g[j] + x[j] V[j+1].
inline std::vector<Tensor> ops::Cumprod::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs& a) {
  const Tensor& x = in[0];
  const bool exclusive = a.i0 != 0, reverse = a.i1 != 0;
  const Tensor before = cumprod(x, a.axis, true, reverse);
  const Tensor after = exclusive ? linear_scan(x, g, a.axis, true, !reverse)
                                 : g + linear_scan(x, x * g, a.axis, true, !reverse);
  return {before * after};
}

// dx[j] = sum over k >= j of g[k] e^(x[j] - y[k]) = e^(x[j] - y[j]) S[j], S[j] = g[j] + c[j+1] S[j+1]
// with c[k] = e^(y[k-1] - y[k]) <= 1 (y never falls along the scan): stable, whatever the range
// of x. As cumprod's rule, S = g + the exclusive reversed linear scan of (c, c g). Exclusive:
// the same with y the inclusive scan, and S[j] = V[j+1], V = the reversed scan of (c, g). Where
// the inclusive value is -inf (every entry so far -inf) the factors are 0, not NaN (-inf - -inf),
// and no NaN reaches a second-order gradient either (the where comes before the exp).
inline std::vector<Tensor> ops::Logcumsumexp::vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a) {
  const Tensor& x = in[0];
  const bool exclusive = a.i0 != 0, reverse = a.i1 != 0;
  const Tensor incl = exclusive ? logcumsumexp(x, a.axis, false, reverse) : out;
  const Tensor excl = exclusive ? out : logcumsumexp(x, a.axis, true, reverse);
  const double ninf = -std::numeric_limits<double>::infinity();
  const Tensor dead = incl == ninf;
  const Tensor ratio = exp(where(dead, ninf, x - incl));
  const Tensor c = exp(where(dead, ninf, excl - incl));
  const Tensor s = exclusive ? linear_scan(c, g, a.axis, true, !reverse) : g + linear_scan(c, c * g, a.axis, true, !reverse);
  return {ratio * s};
}

inline std::vector<Tensor> ops::Cummax::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs& a) {
  const int ax = static_cast<int>(a.axis < 0 ? a.axis + in[0].rank() : a.axis);
  return {add_along_axis(detail::fill_on(g.device(), g.shape(), 0.0, g.dtype()), cumargmax(in[0], a.axis, a.i1 != 0), g, ax)};
}
inline std::vector<Tensor> ops::Cummin::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs& a) {
  const int ax = static_cast<int>(a.axis < 0 ? a.axis + in[0].rank() : a.axis);
  return {add_along_axis(detail::fill_on(g.device(), g.shape(), 0.0, g.dtype()), cumargmin(in[0], a.axis, a.i1 != 0), g, ax)};
}

// h[k] = a[k] h[k-1] + b[k]. With lambda[k] = dL/dh[k] in total (g[k] plus what flows on through
// h[k+1]): lambda[k] = g[k] + a[k+1] lambda[k+1], so (as cumprod's T) lambda = g + the exclusive
// reversed scan of (a, a g); db = lambda and da[k] = lambda[k] h[k-1] (the exclusive forward scan).
// Exclusive (out[k] = h[k-1]): db[k] = lambda'[k] = the exclusive reversed scan of (a, g), and
// da = db * out.
inline std::vector<Tensor> ops::LinearScan::vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& at,
                                                Wanted w) {
  const Tensor& a = in[0];
  const bool exclusive = at.i0 != 0, reverse = at.i1 != 0;
  const Tensor db = exclusive ? linear_scan(a, g, at.axis, true, !reverse)
                              : g + linear_scan(a, a * g, at.axis, true, !reverse);
  Tensor da;
  if (w[0]) da = db * (exclusive ? out : linear_scan(a, in[1], at.axis, true, reverse));
  return {da, db};
}

}  // namespace stagecraft
