// take_along_axis(x, indices, axis) and its adjoint add_along_axis(x, indices, updates, axis): an
// index per element along one axis (NumPy's take_along_axis, PyTorch's gather and scatter_add),
// where gather and scatter_add take one index list for every line. sort, topk and the cummax
// gradient pick and add back through them.
#pragma once
#include "../backend/cpu/simd.hpp"  // first, as transpose.hpp: the intrinsics (gather_within)
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
    return {idx.shape(), in[0].dtype()};  // (index values: the kernel checks them, as gather's)
  }
  /// One GPU thread an element; an index out of range there gives 0 and the next wait raises it.
  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    const int ax = normalize_axis(a.axis, in[0].rank(), name, loc);
    const AxisSplit sp = axis_split(in[0].shape(), ax);
    backend::cuda::take_along_axis(in[0], in[1], out, sp.outer, sp.n, sp.inner, in[1].shape()[ax], a.axis, name, loc);
  }
  /// Threads split the rows (o, j) of the result, each `inner` elements read from x's slab o, a
  /// block of indices at a time. Along a contiguous line (inner == 1) a block is checked in one
  /// vector pass (indices_within) and read through directly (AVX-512's gathers), and one with a
  /// negative or bad index goes through offsets (layout::index_offsets), as strided lines always
  /// do (reading through the indices there measured 12% slower than offsets made first). An index
  /// out of range reads x's first entry of its line and sets a flag; then the first bad index is
  /// raised.
  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    const int ax = static_cast<int>(a.axis < 0 ? a.axis + in[0].rank() : a.axis);  // infer checked it
    const AxisSplit sp = axis_split(in[0].shape(), ax);
    const std::int64_t E = sp.n, inner = sp.inner, M = in[1].shape()[ax];
    // Nothing to read (an empty axis has not even a first entry): only the indices to check.
    if (out.numel() == 0 || E == 0) return layout::require_indices_in_range(name, in[1], in[0].shape(), a.axis);
    std::atomic<bool> failed{false};
    layout::visit_bytes(itemsize(out.dtype()), [&](auto utag) {
      using U = typename decltype(utag)::type;
      layout::visit_index(in[1].dtype(), [&](auto itag) {
        using I = typename decltype(itag)::type;
        const U* x = static_cast<const U*>(in[0].raw_data());
        const I* ix = static_cast<const I*>(in[1].raw_data());
        U* y = static_cast<U*>(out.raw_data());
        // grain_costly: a scalar load and store an element (about 0.5 ns) is not add's vector loop
        backend::cpu::parallel_rows(sp.outer * M, inner, backend::cpu::grain_costly, [&](std::int64_t rb, std::int64_t re) {
          constexpr std::int64_t B = layout::index_block;
          std::int64_t off[B];
          std::uint64_t bad = 0;  // an or of the "out of range" bits
          for (std::int64_t r = rb; r < re;) {
            const std::int64_t o = r / M, end = std::min(re, (o + 1) * M);  // the rows of one slab o
            const U* __restrict xo = x + o * E * inner;
            if (inner == 1) {
              for (; r < end; r += B) {
                const std::int64_t n = std::min(B, end - r);
                U* __restrict yr = y + r;
                if (backend::cpu::indices_within(ix + r, n, E)) {
                  backend::cpu::gather_within(xo, ix + r, yr, n);
                } else {
                  bad |= layout::index_offsets<false>(ix + r, n, E, 1, 0, off);
                  backend::cpu::gather_within(xo, off, yr, n);
                }
              }
              r = end;
            } else {
              for (; r < end; ++r)
                for (std::int64_t i0 = 0; i0 < inner; i0 += B) {
                  const std::int64_t n = std::min(B, inner - i0);
                  bad |= layout::index_offsets<true>(ix + r * inner + i0, n, E, inner, i0, off);
                  U* __restrict yr = y + r * inner + i0;
                  for (std::int64_t t = 0; t < n; ++t) yr[t] = xo[off[t]];
                }
            }
          }
          // (read after the parallel region: exceptions may not leave it)
          if (SC_UNLIKELY(bad != 0)) failed.store(true, std::memory_order_relaxed);
        });
      });
    });
    if (SC_UNLIKELY(failed.load())) layout::require_indices_in_range(name, in[1], in[0].shape(), a.axis);
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
    layout::require_scatter_dtypes(name, in[0], idx, upd, loc);
    const int ax = normalize_axis(a.axis, xs.rank(), name, loc);
    layout::require_along_axis_shape(name, xs, idx.shape(), ax, a.axis, loc);
    if (SC_UNLIKELY(!(upd.shape() == idx.shape())))
      detail::fail<ShapeError>(name, loc, "updates of shape ", upd.shape(), " must have the indices' shape ",
                               idx.shape());
    return {xs, in[0].dtype()};  // (index values: the kernel checks them, as gather's)
  }
  /// One GPU thread a column (o, i), adding its updates in index order (no races, no atomics).
  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    const int ax = normalize_axis(a.axis, in[0].rank(), name, loc);
    const AxisSplit sp = axis_split(in[0].shape(), ax);
    backend::cuda::add_along_axis(in[0], in[1], in[2], out, sp.outer, sp.n, sp.inner, in[1].shape()[ax], a.axis, name,
                                  loc);
  }
  /// x is copied; then threads split the columns (o, i) in blocks, each adding its updates in
  /// index order, a block of indices checked in one vector pass (indices_within) and added through
  /// directly, or through offsets (layout::index_offsets) when one is negative or bad. A contiguous
  /// line (inner == 1) goes through layout::add_checked_block (i64 indices on SSE2 checked as they
  /// add, not in a pass), a block of long runs of equal indices (the cummax gradient's) a run in a
  /// register, the same additions in the same order.
  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    // x empty (along the axis too, perhaps): only the indices to check
    if (out.numel() == 0) return layout::require_indices_in_range(name, in[1], in[0].shape(), a.axis);
    const int ax = static_cast<int>(a.axis < 0 ? a.axis + in[0].rank() : a.axis);  // infer checked it
    const AxisSplit sp = axis_split(in[0].shape(), ax);
    const std::int64_t E = sp.n, inner = sp.inner, M = in[1].shape()[ax];
    // Indices become offsets a block at a time (layout::index_offsets); a bad one adds its update
    // at the line's first entry of y, which is then dropped: the first bad index is raised.
    std::atomic<bool> failed{false};
    visit_numeric(out.dtype(), [&](auto ttag) {
      using T = typename decltype(ttag)::type;
      layout::visit_index(in[1].dtype(), [&](auto itag) {
        using I = typename decltype(itag)::type;
        const T* x = static_cast<const T*>(in[0].raw_data());
        const I* ix = static_cast<const I*>(in[1].raw_data());
        const T* u = static_cast<const T*>(in[2].raw_data());
        T* y = static_cast<T*>(out.raw_data());
        const auto copy = [&] {
          backend::cpu::parallel_for(out.numel(), backend::cpu::grain_cheap, [&](std::int64_t b, std::int64_t e) {
            std::memcpy(y + b, x + b, static_cast<std::size_t>(e - b) * sizeof(T));
          });
        };
        if (M == 0) return copy();
        constexpr std::int64_t B = layout::index_block;
        if (inner == 1) {
          // grain_costly: a scalar add an element, as take_along_axis's loop. Each line is copied
          // by the thread that adds into it, just before (in cache then, not a pass of its own).
          backend::cpu::parallel_rows(sp.outer, M + E / 8, backend::cpu::grain_costly, [&](std::int64_t ob, std::int64_t oe) {
            std::int64_t off[B];
            std::uint64_t bad = 0;
            for (std::int64_t o = ob; o < oe; ++o) {
              T* __restrict yo = y + o * E;
              const T* __restrict uo = u + o * M;
              std::memcpy(yo, x + o * E, static_cast<std::size_t>(E) * sizeof(T));
              for (std::int64_t k0 = 0; k0 < M; k0 += B) {
                const std::int64_t n = std::min(B, M - k0);
                const I* __restrict at = ix + o * M + k0;
                bad |= layout::add_checked_block(yo, at, uo + k0, n, E, off);
              }
            }
            if (SC_UNLIKELY(bad != 0)) failed.store(true, std::memory_order_relaxed);
          });
        } else {
          copy();
          backend::cpu::parallel_column_blocks(sp.outer, inner, M, backend::cpu::grain_costly,
                                               [&](std::int64_t o, std::int64_t i0, std::int64_t w) {
            static_assert(backend::cpu::column_block <= B, "a column block's offsets fit one index block");
            std::int64_t off[B];
            std::uint64_t bad = 0;
            T* __restrict yo = y + o * E * inner + i0;
            for (std::int64_t k = 0; k < M; ++k) {
              const std::int64_t row = (o * M + k) * inner + i0;
              const I* __restrict at = ix + row;
              const T* __restrict uk = u + row;
              if (backend::cpu::indices_within(at, w, E)) {
                for (std::int64_t t = 0; t < w; ++t) {
                  T& to = yo[static_cast<std::int64_t>(at[t]) * inner + t];
                  to = rules::math::wrap_add(to, uk[t]);
                }
              } else {
                bad |= layout::index_offsets<true>(at, w, E, inner, 0, off);
                for (std::int64_t t = 0; t < w; ++t) yo[off[t]] = rules::math::wrap_add(yo[off[t]], uk[t]);
              }
            }
            if (SC_UNLIKELY(bad != 0)) failed.store(true, std::memory_order_relaxed);
          });
        }
      });
    });
    if (SC_UNLIKELY(failed.load())) layout::require_indices_in_range(name, in[1], in[0].shape(), a.axis);
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
