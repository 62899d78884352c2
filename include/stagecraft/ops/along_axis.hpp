// take_along_axis(x, indices, axis) and its adjoint add_along_axis(x, indices, updates, axis): an
// index per element along one axis (NumPy's take_along_axis, PyTorch's gather and scatter_add),
// where gather and scatter_add take one index list for every line. sort, topk and the cummax
// gradient pick and add back through them.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <source_location>
#include <string>
#include <vector>

#include "../backend/cpu/parallel.hpp"
#include "../eager/dispatch.hpp"
#include "fill.hpp"
#include "gather.hpp"
#include "rules.hpp"  // wrap_add: integer sums wrap, as add does

namespace stagecraft {
namespace ops {

namespace layout {
/// The along-axis ops' shape check: indices of x's rank, with x's extents but along axis `ax`.
inline void require_along_axis_shape(std::string_view op, const Shape& xs, const Shape& is, int ax, std::int64_t axis,
                                     const std::source_location& loc) {
  bool same = is.rank() == xs.rank();
  for (int d = 0; same && d < xs.rank(); ++d) same = d == ax || is[d] == xs[d];
  if (SC_UNLIKELY(!same))
    detail::fail<ShapeError>(op, loc, "indices of shape ", is, " must match x's shape ", xs, " except along axis ", axis);
}

}  // namespace layout

/// y[o, j, i] = x[o, indices[o, j, i], i] along attrs.axis (negative indices count from the end):
/// indices (i32 or i64) have x's rank and x's extents but along the axis, and y has their shape.
struct TakeAlongAxis {
  SC_OP_HEAD(TakeAlongAxis, "take_along_axis")
  static constexpr int arity = 2;

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    const Shape& xs = in[0].shape();
    const Tensor& idx = in[1];
    require_dtype(is_integral(idx.dtype()), name, idx.dtype(), "i32 or i64 indices", loc);
    const int ax = normalize_axis(a.axis, xs.rank(), name, loc);
    layout::require_along_axis_shape(name, xs, idx.shape(), ax, a.axis, loc);
    // Values are checked here, at the user's line, when they exist on the host; the kernels check
    // again (a traced graph's indices), so nothing reads out of bounds.
    layout::require_indices_in_range(name, idx, xs, ax, a.axis, loc);
    return {idx.shape(), in[0].dtype()};
  }
  /// One GPU thread an element; an index out of range there gives 0 and the next wait raises it.
  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    const int ax = normalize_axis(a.axis, in[0].rank(), name, loc);
    const AxisSplit sp = axis_split(in[0].shape(), ax);
    backend::cuda::take_along_axis(in[0], in[1], out, sp.outer, sp.n, sp.inner, in[1].shape()[ax], a.axis, name, loc);
  }
  /// Threads split the rows (o, j) of the result, each `inner` elements read from x's slab o.
  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    if (out.numel() == 0) return;
    const int ax = static_cast<int>(a.axis < 0 ? a.axis + in[0].rank() : a.axis);  // infer checked it
    const AxisSplit sp = axis_split(in[0].shape(), ax);
    const std::int64_t E = sp.n, inner = sp.inner, M = in[1].shape()[ax];
    std::atomic<bool> failed{false};
    std::atomic<std::int64_t> bad{0};
    layout::visit_bytes(itemsize(out.dtype()), [&](auto utag) {
      using U = typename decltype(utag)::type;
      layout::visit_index(in[1].dtype(), [&](auto itag) {
        using I = typename decltype(itag)::type;
        const U* x = static_cast<const U*>(in[0].raw_data());
        const I* ix = static_cast<const I*>(in[1].raw_data());
        U* y = static_cast<U*>(out.raw_data());
        backend::cpu::parallel_rows(sp.outer * M, inner, backend::cpu::grain_cheap, [&](std::int64_t rb, std::int64_t re) {
          // locals, so no store through y makes the compiler reload them; a bad index is noted here
          // and published once (read after the parallel region: exceptions may not leave it)
          const U* const xs = x;
          const I* const is = ix;
          U* const ys = y;
          const std::int64_t e = E, w = inner, m = M;
          std::int64_t bad_here = 0;
          bool any_bad = false;
          const auto pick = [&](const U* xo, std::int64_t given, std::int64_t i) {
            const std::int64_t j = given < 0 ? given + e : given;
            if (SC_LIKELY(static_cast<std::uint64_t>(j) < static_cast<std::uint64_t>(e))) return xo[j * w + i];
            bad_here = given, any_bad = true;
            return U(0);
          };
          for (std::int64_t r = rb; r < re;) {
            const std::int64_t o = r / m, end = std::min(re, (o + 1) * m);  // the rows of one slab o
            const U* xo = xs + o * e * w;
            if (w == 1) {
              for (; r < end; ++r) ys[r] = pick(xo, static_cast<std::int64_t>(is[r]), 0);
            } else {
              for (; r < end; ++r)
                for (std::int64_t i = 0; i < w; ++i) ys[r * w + i] = pick(xo, static_cast<std::int64_t>(is[r * w + i]), i);
            }
          }
          if (SC_UNLIKELY(any_bad)) {
            bad.store(bad_here, std::memory_order_relaxed);
            failed.store(true, std::memory_order_relaxed);
          }
        });
      });
    });
    if (SC_UNLIKELY(failed.load()))
      throw ValueError("[take_along_axis] index " + std::to_string(bad.load()) +
                       " is out of range for an axis of extent " + std::to_string(E));
  }
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};

/// y = x with updates[o, j, i] added at x[o, indices[o, j, i], i] along attrs.axis, repeated
/// indices accumulating in index order (deterministic, the GPU's order too). Inputs (x, indices,
/// updates): x and updates of one numeric dtype; indices (i32 or i64) of x's rank and x's extents
/// but along the axis; updates of the indices' shape.
struct AddAlongAxis {
  SC_OP_HEAD(AddAlongAxis, "add_along_axis")
  static constexpr int arity = 3;

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    const Shape& xs = in[0].shape();
    const Tensor& idx = in[1];
    const Tensor& upd = in[2];
    require_dtype(is_integral(idx.dtype()), name, idx.dtype(), "i32 or i64 indices", loc);
    require_dtype(in[0].dtype() != DType::b8, name, in[0].dtype(), "a numeric x", loc);
    if (SC_UNLIKELY(upd.dtype() != in[0].dtype()))
      detail::fail<DTypeError>(name, loc, "updates have dtype ", stagecraft::name(upd.dtype()), ", x has dtype ",
                               stagecraft::name(in[0].dtype()), "; they must match");
    const int ax = normalize_axis(a.axis, xs.rank(), name, loc);
    layout::require_along_axis_shape(name, xs, idx.shape(), ax, a.axis, loc);
    if (SC_UNLIKELY(!(upd.shape() == idx.shape())))
      detail::fail<ShapeError>(name, loc, "updates of shape ", upd.shape(), " must have the indices' shape ",
                               idx.shape());
    layout::require_indices_in_range(name, idx, xs, ax, a.axis, loc);
    return {xs, in[0].dtype()};
  }
  /// One GPU thread a column (o, i), adding its updates in index order (no races, no atomics).
  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    const int ax = normalize_axis(a.axis, in[0].rank(), name, loc);
    const AxisSplit sp = axis_split(in[0].shape(), ax);
    backend::cuda::add_along_axis(in[0], in[1], in[2], out, sp.outer, sp.n, sp.inner, in[1].shape()[ax], a.axis, name,
                                  loc);
  }
  /// x is copied; then threads split the columns (o, i) in blocks, each adding its updates in
  /// index order. A contiguous line (inner == 1) adds a run of equal indices in a register (the
  /// cummax gradient's runs), the same additions in the same order.
  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    if (out.numel() == 0) return;
    const int ax = static_cast<int>(a.axis < 0 ? a.axis + in[0].rank() : a.axis);  // infer checked it
    const AxisSplit sp = axis_split(in[0].shape(), ax);
    const std::int64_t E = sp.n, inner = sp.inner, M = in[1].shape()[ax];
    // A bad index (only a traced graph's get past infer) is skipped and raised after the loops.
    std::atomic<bool> failed{false};
    std::atomic<std::int64_t> bad{0};
    visit_numeric(out.dtype(), [&](auto ttag) {
      using T = typename decltype(ttag)::type;
      layout::visit_index(in[1].dtype(), [&](auto itag) {
        using I = typename decltype(itag)::type;
        const T* x = static_cast<const T*>(in[0].raw_data());
        const I* ix = static_cast<const I*>(in[1].raw_data());
        const T* u = static_cast<const T*>(in[2].raw_data());
        T* y = static_cast<T*>(out.raw_data());
        backend::cpu::parallel_for(out.numel(), backend::cpu::grain_cheap, [&](std::int64_t b, std::int64_t e) {
          std::memcpy(y + b, x + b, static_cast<std::size_t>(e - b) * sizeof(T));
        });
        if (M == 0) return;
        // j for the index `given`, or -1 (flagged) when it is out of range
        const auto at = [E, &failed, &bad](I given) {
          const std::int64_t j = given < 0 ? std::int64_t{given} + E : std::int64_t{given};
          if (SC_LIKELY(static_cast<std::uint64_t>(j) < static_cast<std::uint64_t>(E))) return j;
          bad.store(given, std::memory_order_relaxed);
          failed.store(true, std::memory_order_relaxed);
          return std::int64_t{-1};
        };
        if (inner == 1) {
          backend::cpu::parallel_rows(sp.outer, M, backend::cpu::grain_cheap, [&](std::int64_t ob, std::int64_t oe) {
            for (std::int64_t o = ob; o < oe; ++o) {
              T* yo = y + o * E;
              const I* io = ix + o * M;
              const T* uo = u + o * M;
              std::int64_t j = -1;
              T acc{};
              for (std::int64_t k = 0; k < M; ++k) {
                const std::int64_t jk = at(io[k]);
                if (SC_UNLIKELY(jk < 0)) continue;
                if (jk != j) {
                  if (j >= 0) yo[j] = acc;
                  j = jk;
                  acc = yo[j];
                }
                acc = rules::math::wrap_add(acc, uo[k]);
              }
              if (j >= 0) yo[j] = acc;
            }
          });
        } else {
          backend::cpu::parallel_column_blocks(sp.outer, inner, M, backend::cpu::grain_cheap,
                                               [&](std::int64_t o, std::int64_t i0, std::int64_t w) {
            T* yo = y + o * E * inner + i0;
            for (std::int64_t k = 0; k < M; ++k) {
              const std::int64_t row = (o * M + k) * inner + i0;
              const I* __restrict ik = ix + row;
              const T* __restrict uk = u + row;
              for (std::int64_t i = 0; i < w; ++i) {
                const std::int64_t j = at(ik[i]);
                if (SC_UNLIKELY(j < 0)) continue;
                T& dst = yo[j * inner + i];
                dst = rules::math::wrap_add(dst, uk[i]);
              }
            }
          });
        }
      });
    });
    if (SC_UNLIKELY(failed.load()))
      throw ValueError("[add_along_axis] index " + std::to_string(bad.load()) + " is out of range for an axis of extent " +
                       std::to_string(E));
  }
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};

}  // namespace ops

/// The entries of x along `axis` at `indices` (NumPy's take_along_axis, PyTorch's gather):
/// indices (i32 or i64, negative counting from the end) has x's rank and x's extents except
/// along the axis, and the result has its shape: y[..., j, ...] = x[..., indices[..., j, ...], ...].
/// An index out of range is a ValueError (on a GPU, at the next wait). Differentiable in x (the
/// gradient is added back at the indices by add_along_axis, repeated ones accumulating).
inline Tensor take_along_axis(const Tensor& x, const Tensor& indices, std::int64_t axis,
                              std::source_location loc = std::source_location::current()) {
  ops::Attrs a;
  a.axis = axis;
  const detail::BorrowedInputs<2> in({&x, &indices});
  return detail::dispatch<ops::TakeAlongAxis>(in.span(), a, loc);
}

/// x with updates added at `indices` along `axis` (PyTorch's scatter_add, NumPy's add.at along an
/// axis): x[..., indices[..., j, ...], ...] += updates[..., j, ...], repeated indices accumulating
/// in index order. indices (i32 or i64, negative counting from the end) has x's rank and x's
/// extents except along the axis; updates has the indices' shape and x's dtype. An index out of
/// range is a ValueError (on a GPU, at the next wait). Differentiable in x and updates.
inline Tensor add_along_axis(const Tensor& x, const Tensor& indices, const Tensor& updates, std::int64_t axis,
                             std::source_location loc = std::source_location::current()) {
  ops::Attrs a;
  a.axis = axis;
  const detail::BorrowedInputs<3> in({&x, &indices, &updates});
  return detail::dispatch<ops::AddAlongAxis>(in.span(), a, loc);
}

// ---- gradient rules (after the functions they use) ---------------------------------------
// take_along_axis's adjoint: each picked entry's gradient added back into a zero x.
inline std::vector<Tensor> ops::TakeAlongAxis::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs& a) {
  return {add_along_axis(detail::fill_on(g.device(), in[0].shape(), 0.0, g.dtype()), in[1], g, a.axis), Tensor()};
}
// Linear in x and updates: x's gradient passes through; updates read theirs back.
inline std::vector<Tensor> ops::AddAlongAxis::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs& a) {
  return {g, Tensor(), take_along_axis(g, in[1], a.axis)};
}

}  // namespace stagecraft
