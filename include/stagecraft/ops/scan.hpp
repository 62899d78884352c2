// Scans: cumsum, the running sum along an axis (inclusive or exclusive, forward or reversed).
#pragma once
#include <algorithm>
#include <cstdint>
#include <source_location>
#include <vector>

#include "../backend/cpu/parallel.hpp"
#include "../eager/dispatch.hpp"
#include "rules.hpp"

namespace stagecraft {
namespace ops {

/// y[..., k, ...] = x[..., 0, ...] + ... + x[..., k, ...] along `axis` (attrs: axis; i0 exclusive:
/// the sum before k, 0 first; i1 reverse: from the end). Numeric dtypes, the result in x's
/// (integer sums wrap, as sum's do). Floats add in order along the axis on the CPU (NumPy's
/// numbers); a GPU adds a long line in a tree per block of 256, so the last bits may differ.
struct Cumsum {
  SC_OP_HEAD(Cumsum, "cumsum")
  static constexpr int arity = 1;

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    const Tensor& x = in[0];
    require_dtype(!is_bool(x.dtype()), name, x.dtype(), "numeric dtypes", loc);
    if (x.rank() == 0)
      detail::fail<ShapeError>(name, loc, "needs a tensor of rank >= 1 (an axis to run along), got shape ", x.shape());
    (void)normalize_axis(a.axis, x.rank(), name, loc);
    return {x.shape(), x.dtype()};
  }

  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    const AxisSplit sp = axis_split(in[0].shape(), a.axis);
    backend::cuda::cumsum(in[0], out, sp.outer, sp.n, sp.inner, a.i0 != 0, a.i1 != 0, name, loc);
  }

  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    if (out.numel() == 0) return;
    const AxisSplit sp = axis_split(in[0].shape(), a.axis);
    const std::int64_t outer = sp.outer, n = sp.n, inner = sp.inner;
    const bool exclusive = a.i0 != 0, reverse = a.i1 != 0;
    visit_dtype(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (!std::is_same_v<T, bool>) {
        const T* x = static_cast<const T*>(in[0].raw_data());
        T* y = static_cast<T*>(out.raw_data());
        if (inner == 1) {  // contiguous lines: one running sum down each (the same additions)
          // costly work: each add waits for the last (~4 cycles an element, where a vector add takes a
          // fraction of one), so fewer elements a thread pay for its start-up
          backend::cpu::parallel_rows(outer, n, backend::cpu::grain_costly, [&](std::int64_t ob, std::int64_t oe) {
            const std::int64_t step = reverse ? -1 : 1, first = reverse ? n - 1 : 0;
            for (std::int64_t o = ob; o < oe; ++o) {
              const T* xr = x + o * n;
              T* yr = y + o * n;
              if (exclusive) {
                T acc = T(0);
                for (std::int64_t s = 0, k = first; s < n; ++s, k += step) {
                  yr[k] = acc;
                  acc = rules::math::wrap_add(acc, xr[k]);
                }
              } else {
                T acc = xr[first];
                yr[first] = acc;
                for (std::int64_t s = 1, k = first + step; s < n; ++s, k += step) {
                  acc = rules::math::wrap_add(acc, xr[k]);
                  yr[k] = acc;
                }
              }
            }
          });
          return;
        }
        // Work units: an outer index and a block of up to 256 inner positions, each running down
        // the axis with the block's sums in y's previous row (a vector loop over the block).
        constexpr std::int64_t block = 256;
        const std::int64_t blocks = (inner + block - 1) / block;
        backend::cpu::parallel_rows(outer * blocks, n * std::min(inner, block), backend::cpu::grain_cheap,
                                    [&](std::int64_t ub, std::int64_t ue) {
          for (std::int64_t u = ub; u < ue; ++u) {
            const std::int64_t o = u / blocks, i0 = (u % blocks) * block, i1 = std::min(inner, i0 + block);
            const T* xo = x + o * n * inner;
            T* yo = y + o * n * inner;
            for (std::int64_t s = 0; s < n; ++s) {
              const std::int64_t k = reverse ? n - 1 - s : s, prev = reverse ? k + 1 : k - 1;
              T* yk = yo + k * inner;
              if (s == 0) {
                for (std::int64_t i = i0; i < i1; ++i) yk[i] = exclusive ? T(0) : xo[k * inner + i];
              } else {
                const T* yp = yo + prev * inner;
                const T* xa = xo + (exclusive ? prev : k) * inner;
                for (std::int64_t i = i0; i < i1; ++i) yk[i] = rules::math::wrap_add(yp[i], xa[i]);
              }
            }
          }
        });
      }
    });
  }

  /// The gradient of a running sum is the running sum of g the other way (exclusive stays so).
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};

}  // namespace ops

/// The running sum of x along `axis` (NumPy's and TensorFlow's cumsum): exclusive starts each
/// line at 0 and leaves the last element out; reverse runs from the end. Numeric dtypes, the
/// result in x's (integer sums wrap). On a GPU a line runs as a block's scan (or, with many lines,
/// a thread each). Its gradient is the reversed running sum of the incoming gradient.
inline Tensor cumsum(const Tensor& x, std::int64_t axis = 0, bool exclusive = false, bool reverse = false,
                     std::source_location loc = std::source_location::current()) {
  ops::Attrs a;
  a.axis = axis;
  a.i0 = exclusive ? 1 : 0;
  a.i1 = reverse ? 1 : 0;
  return detail::dispatch<ops::Cumsum>({&x, 1}, a, loc);
}

inline std::vector<Tensor> ops::Cumsum::vjp(const Tensor& g, Inputs, const Tensor&, const Attrs& a) {
  return {cumsum(g, a.axis, a.i0 != 0, a.i1 == 0)};
}

}  // namespace stagecraft
