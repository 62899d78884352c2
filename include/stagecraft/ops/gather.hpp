// gather(x, indices, axis), its adjoint scatter_add(x, indices, updates, axis), and one_hot.
#pragma once
#include "../backend/cpu/simd.hpp"  // first, as transpose.hpp: the intrinsics (gather_within)
#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>

#include "../backend/cpu/parallel.hpp"
#include "../core/creation.hpp"
#include "fill.hpp"
#include "reshape.hpp"
#include "rules.hpp"  // wrap_add: integer sums wrap, as add does

namespace stagecraft {
namespace ops {

namespace layout {

/// The first index outside [-extent, extent), if any (index tensors are i32 or i64, on the host).
inline bool find_bad_index(const Tensor& idx, std::int64_t extent, std::int64_t& bad) {
  return visit_dtype(idx.dtype(), [&](auto tag) {
    using I = typename decltype(tag)::type;
    if constexpr (std::is_same_v<I, std::int32_t> || std::is_same_v<I, std::int64_t>) {
      const I* p = static_cast<const I*>(idx.raw_data());
      // Blocks without an early exit, a vector loop even on baseline x86-64 (64-bit adds and ors
      // only): u = index + extent (unsigned) is in range iff u <= hi = 2 extent - 1, and then
      // neither u nor hi - u has its top bit set; out of range, one of them wraps past 2^63. Then
      // the first bad index in the block that has one.
      const std::uint64_t hi = static_cast<std::uint64_t>(2 * extent) - 1, ext = static_cast<std::uint64_t>(extent);
      constexpr std::int64_t block = 4096;
      for (std::int64_t b = 0, n = idx.numel(); b < n; b += block) {
        const std::int64_t e = std::min(n, b + block);
        std::uint64_t acc = 0;
        for (std::int64_t i = b; i < e; ++i) {
          const std::uint64_t u = static_cast<std::uint64_t>(static_cast<std::int64_t>(p[i])) + ext;
          acc |= u | (hi - u);
        }
        if (SC_UNLIKELY(acc >> 63 != 0 || extent == 0))
          for (std::int64_t i = b; i < e; ++i)
            if (p[i] < -extent || p[i] >= extent) {
              bad = p[i];
              return true;
            }
      }
    }
    return false;
  });
}

/// The error for an index outside axis `axis` of x (shape xs), raised by the kernels that index:
/// a kernel knows no call site, so eager dispatch adds the user's line (and a staged plan the
/// line of the op's call), the same message either way.
[[noreturn]] SC_COLD inline void throw_bad_index(std::string_view op, std::int64_t bad, std::int64_t axis,
                                                 const Shape& xs) {
  const int ax = static_cast<int>(axis < 0 ? axis + xs.rank() : axis);
  throw ValueError(detail::concat_parts("[", op, "] index ", bad, " is out of range for axis ", axis, " of extent ",
                                        xs[ax], " (shape ", xs, ")"));
}

/// The kernels' check: throws the first index of idx outside axis `axis` of xs, if any.
inline void require_indices_in_range(std::string_view op, const Tensor& idx, const Shape& xs, std::int64_t axis) {
  std::int64_t bad = 0;
  const int ax = static_cast<int>(axis < 0 ? axis + xs.rank() : axis);
  if (SC_UNLIKELY(find_bad_index(idx, xs[ax], bad))) throw_bad_index(op, bad, axis, xs);
}

/// The dtypes scatter_add and add_along_axis take: i32 or i64 indices, a numeric x, and updates
/// of x's dtype.
inline void require_scatter_dtypes(std::string_view op, const Tensor& x, const Tensor& idx, const Tensor& upd,
                                   const std::source_location& loc) {
  require_dtype(is_integral(idx.dtype()), op, idx.dtype(), "i32 or i64 indices", loc);
  require_dtype(x.dtype() != DType::b8, op, x.dtype(), "a numeric x", loc);
  if (SC_UNLIKELY(upd.dtype() != x.dtype()))
    detail::fail<DTypeError>(op, loc, "updates have dtype ", stagecraft::name(upd.dtype()), ", x has dtype ",
                             stagecraft::name(x.dtype()), "; they must match");
}

/// Calls f(type_tag<I>{}) for an index dtype (i32 or i64; infer has rejected the others).
template <class F>
void visit_index(DType d, F&& f) {
  if (d == DType::i32) f(type_tag<std::int32_t>{});
  else f(type_tag<std::int64_t>{});
}

/// The indexing kernels' indices a block at a time, made offsets into a slab of x: off[t] =
/// j * w + t0 + t (j * 1 when not Strided), where j is given[t], counted from the end when
/// negative. An index out of range gives j = 0 and sets the result's bit. A vector loop where the
/// target has one; the kernels then read or add through the offsets in a plain scalar loop (the
/// normalising and checking one scalar loop did per element cost it twice a hand loop's time).
template <bool Strided, class I>
SC_ALWAYS_INLINE std::uint64_t index_offsets(const I* __restrict given, std::int64_t n, std::int64_t e, std::int64_t w,
                                             std::int64_t t0, std::int64_t* __restrict off) {
  const auto ue = static_cast<std::uint64_t>(e);
  std::uint64_t bad = 0;
  for (std::int64_t t = 0; t < n; ++t) {
    const auto g = static_cast<std::int64_t>(given[t]);
    const auto j = static_cast<std::uint64_t>(g < 0 ? g + e : g);
    const bool ok = j < ue;
    bad |= !ok;
    const auto at = static_cast<std::int64_t>(ok ? j : 0);
    if constexpr (Strided) off[t] = at * w + t0 + t;
    else off[t] = at;
  }
  return bad;
}
/// The block index_offsets fills.
inline constexpr std::int64_t index_block = 256;

/// Whether most of at[0, n)'s neighbours repeat (add_line_block's choice between summing runs in
/// a register and a plain loop), judged on every 8th pair: the choice only sets the speed (both
/// loops make the same additions in the same order), and counting every pair had cost a vector
/// pass as long as the range check's (i64 on SSE2: six instructions per two indices).
template <class I>
SC_ALWAYS_INLINE bool mostly_repeats(const I* __restrict at, std::int64_t n) {
  int same = 0, pairs = 0;
  for (std::int64_t t = 1; t < n; t += 8, ++pairs) same += at[t] == at[t - 1];
  return same * 4 > 3 * pairs;
}

/// y[at[t]] += u[t] for t < n in that order while at[t] is in [0, e), a block of add_along_axis's
/// or scatter_add's line; returns how many it added (n, or the place of the first index outside
/// [0, e), which it leaves with the rest). Where most neighbours repeat (mostly_repeats: long runs,
/// as the cummax gradient's), a run is summed in a register and stored once; otherwise a plain loop
/// (a run's "did the index change" branch mispredicts on short runs: on sorted random indices, a
/// run of about one, that loop took 3.4x the plain one's time; and a plain loop waits on its own
/// store at each repeat). The same additions in the same order either way. With Check, every index
/// is checked as it is read (where a run starts, in the run loop); without, the caller has checked
/// them all.
template <bool Check, class T, class I>
SC_ALWAYS_INLINE std::int64_t add_line_block(T* __restrict y, const I* __restrict at, const T* __restrict u,
                                             std::int64_t n, std::int64_t e) {
  const auto ue = static_cast<std::uint64_t>(e);
  const auto index = [&](std::int64_t t) { return static_cast<std::uint64_t>(static_cast<std::int64_t>(at[t])); };
  if (n > 0 && mostly_repeats(at, n)) {
    std::uint64_t j = index(0);
    if (Check && SC_UNLIKELY(j >= ue)) return 0;
    T acc = y[j];
    for (std::int64_t t = 0; t < n; ++t) {
      if (SC_UNLIKELY(index(t) != j)) {
        y[j] = acc;
        j = index(t);
        if (Check && SC_UNLIKELY(j >= ue)) return t;
        acc = y[j];
      }
      acc = rules::math::wrap_add(acc, u[t]);
    }
    y[j] = acc;
  } else {
    for (std::int64_t t = 0; t < n; ++t) {
      const std::uint64_t j = index(t);
      if (Check && SC_UNLIKELY(j >= ue)) return t;
      y[j] = rules::math::wrap_add(y[j], u[t]);
    }
  }
  return n;
}

/// A block of a line added through its indices at (add_line_block) while they are in [0, e), the
/// rest through offsets (index_offsets: a negative index counted from the end; a bad one adds at 0
/// and sets the result), the same additions in the same order. Checked in one vector pass first
/// (indices_within) where it has 4 lanes or more; otherwise as they are read: i64 on SSE2, a
/// compare and a branch never taken beside the add's load and store, where the pass had cost a
/// quarter of the time (session 83, 2 threads: add rows 313-329 -> 283-296 us, scatter_add 277-300
/// -> 245-255; on AVX-512 the other way round, the pass 264-284 against 300-315).
template <class T, class I>
SC_ALWAYS_INLINE std::uint64_t add_checked_block(T* __restrict y, const I* __restrict at, const T* __restrict u,
                                                 std::int64_t n, std::int64_t e, std::int64_t* __restrict off) {
  std::int64_t done = 0;
  if constexpr (backend::cpu::index_check_vectorizes<I>) {
    if (SC_LIKELY(backend::cpu::indices_within(at, n, e))) done = add_line_block<false>(y, at, u, n, e);
  } else {
    done = add_line_block<true>(y, at, u, n, e);
  }
  if (SC_LIKELY(done == n)) return 0;
  const std::uint64_t bad = index_offsets<false>(at + done, n - done, e, 1, 0, off);
  (void)add_line_block<false>(y, off, u + done, n - done, e);
  return bad;
}

}  // namespace layout

/// index_select: picks entries of x along attrs.axis by an integer tensor of indices
/// (negative counts from the end). Output shape: x.shape[:axis] + indices.shape + x.shape[axis+1:].
struct Gather {
  SC_OP_HEAD(Gather, "gather")
  static constexpr int arity = 2;

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    const Shape& xs = in[0].shape();
    const Tensor& idx = in[1];
    require_dtype(is_integral(idx.dtype()), name, idx.dtype(), "i32 or i64 indices", loc);
    if (SC_UNLIKELY(xs.rank() == 0)) detail::fail<ShapeError>(name, loc, "cannot gather from a rank-0 tensor (shape [])");
    const int ax = normalize_axis(a.axis, xs.rank(), name, loc);
    if (SC_UNLIKELY(xs.rank() - 1 + idx.rank() > max_rank))
      detail::fail<ShapeError>(name, loc, "result of gathering ", xs, " with indices of shape ", idx.shape(),
                               " would have rank above ", max_rank);
    Shape out(xs.begin(), xs.begin() + ax);
    for (std::int64_t d : idx.shape()) out.push_back(d);
    for (int k = ax + 1; k < xs.rank(); ++k) out.push_back(xs[k]);
    // Index values are the kernel's to check: it reads them anyway, and a traced graph's are
    // known only there (its error names the user's line all the same).
    return {out, in[0].dtype()};
  }
  /// On the GPU, indices already there are not read back: one out of range gathers 0, and the
  /// next wait for the device (item, to_vector, synchronize) raises the ValueError naming this line.
  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    const AxisSplit sp = axis_split(in[0].shape(), a.axis);
    backend::cuda::gather(in[0], in[1], out, sp.outer, sp.n, sp.inner, a.axis, name, loc);
  }
  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    if (out.numel() == 0) return layout::require_indices_in_range(name, in[1], in[0].shape(), a.axis);
    const AxisSplit sp = axis_split(in[0].shape(), a.axis);
    const std::int64_t outer = sp.outer, E = sp.n, inner = sp.inner, N = in[1].numel();
    std::atomic<bool> failed{false};
    layout::visit_bytes(itemsize(out.dtype()), [&](auto utag) {
      using U = typename decltype(utag)::type;
      layout::visit_index(in[1].dtype(), [&](auto itag) {
        using I = typename decltype(itag)::type;
        const U* x = static_cast<const U*>(in[0].raw_data());
        const I* ix = static_cast<const I*>(in[1].raw_data());
        U* y = static_cast<U*>(out.raw_data());
        // One unit is one (outer index, index) pair: a run of `inner` contiguous elements;
        // a thread's range is walked as spans of indices within one outer row.
        // an element at a time (inner == 1) is a scalar loop, costlier than a copy of rows
        backend::cpu::parallel_rows(outer * N, inner, inner == 1 ? backend::cpu::grain_costly : backend::cpu::grain_cheap,
                                   [&](std::int64_t rb, std::int64_t re) {
          for (std::int64_t r = rb; r < re;) {
            const std::int64_t o = r / N, n0 = r % N, n1 = std::min(N, n0 + (re - r));
            const U* xr = x + o * E * inner;
            U* yr = y + o * N * inner;
            // The bad-index flag is read after the parallel region: exceptions may not leave it.
            const auto index = [&](std::int64_t n, std::int64_t& j) {
              j = ix[n] < 0 ? ix[n] + E : ix[n];
              if (SC_LIKELY(j >= 0 && j < E)) return true;
              failed.store(true, std::memory_order_relaxed);
              return false;
            };
            std::int64_t j = 0;
            if (inner == 1) {
              // a block of indices all in [0, E) read through directly (AVX-512's gathers)
              for (std::int64_t b = n0; b < n1; b += layout::index_block) {
                const std::int64_t len = std::min(layout::index_block, n1 - b);
                if (backend::cpu::indices_within(ix + b, len, E)) {
                  backend::cpu::gather_within(xr, ix + b, yr + b, len);
                } else {
                  for (std::int64_t n = b; n < b + len; ++n)
                    if (index(n, j)) yr[n] = xr[j];
                }
              }
            } else {
              for (std::int64_t n = n0; n < n1; ++n)
                if (index(n, j)) std::memcpy(yr + n * inner, xr + j * inner, static_cast<std::size_t>(inner) * sizeof(U));
            }
            r += n1 - n0;
          }
        });
      });
    });
    // (the first bad index, not whichever a thread met: one message for every run)
    if (SC_UNLIKELY(failed.load())) layout::require_indices_in_range(name, in[1], in[0].shape(), a.axis);
  }
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};

/// index_add, the adjoint of gather: x plus `updates` added at the indices along attrs.axis,
/// duplicate indices accumulating (in index order, so results are deterministic). updates has
/// gather's result shape: x.shape[:axis] + indices.shape + x.shape[axis+1:]; inputs are
/// (x, indices, updates), x and updates of one numeric dtype.
struct ScatterAdd {
  SC_OP_HEAD(ScatterAdd, "scatter_add")
  static constexpr int arity = 3;

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    const Shape& xs = in[0].shape();
    const Tensor& idx = in[1];
    const Tensor& upd = in[2];
    layout::require_scatter_dtypes(name, in[0], idx, upd, loc);
    if (SC_UNLIKELY(xs.rank() == 0)) detail::fail<ShapeError>(name, loc, "cannot scatter into a rank-0 tensor (shape [])");
    const int ax = normalize_axis(a.axis, xs.rank(), name, loc);
    // The shape updates must have: gather's result shape (checked without building it, since
    // it may exceed the maximum rank, and then no tensor has it).
    bool ok = upd.rank() == xs.rank() - 1 + idx.rank();
    for (int k = 0; ok && k < ax; ++k) ok = upd.shape()[k] == xs[k];
    for (int k = 0; ok && k < idx.rank(); ++k) ok = upd.shape()[ax + k] == idx.shape()[k];
    for (int k = ax + 1; ok && k < xs.rank(); ++k) ok = upd.shape()[k - 1 + idx.rank()] == xs[k];
    if (SC_UNLIKELY(!ok))
      detail::fail<ShapeError>(name, loc, "updates of shape ", upd.shape(), " do not fit x of shape ", xs,
                               " with indices of shape ", idx.shape(), " along axis ", a.axis,
                               " (they need x.shape[:axis] + indices.shape + x.shape[axis+1:])");
    return {xs, in[0].dtype()};  // (index values: the kernel checks them, as gather's)
  }
  /// On the GPU, indices already there are not read back: an update at an index out of range is
  /// dropped, and the next wait for the device raises the ValueError naming this line.
  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    const AxisSplit sp = axis_split(in[0].shape(), a.axis);
    backend::cuda::scatter_add(in[0], in[1], in[2], out, sp.outer, sp.n, sp.inner, a.axis, name, loc);
  }
  /// x is copied in contiguous chunks; then threads split the (outer index, inner position)
  /// columns: each owns its columns of the output and adds every update into them, so
  /// duplicate indices never race. Integer sums wrap (two's complement), as add's do.
  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    if (out.numel() == 0) return layout::require_indices_in_range(name, in[1], in[0].shape(), a.axis);
    const AxisSplit sp = axis_split(in[0].shape(), a.axis);
    const std::int64_t outer = sp.outer, E = sp.n, inner = sp.inner, N = in[1].numel();
    // Checked once up front, so the loop cannot throw.
    layout::require_indices_in_range(name, in[1], in[0].shape(), a.axis);
    visit_numeric(out.dtype(), [&](auto ttag) {
      using T = typename decltype(ttag)::type;
      layout::visit_index(in[1].dtype(), [&](auto itag) {
        using I = typename decltype(itag)::type;
        const T* x = static_cast<const T*>(in[0].raw_data());
        const I* ix = static_cast<const I*>(in[1].raw_data());
        const T* u = static_cast<const T*>(in[2].raw_data());
        T* y = static_cast<T*>(out.raw_data());
        // x copied first, but for lines of single elements (inner == 1): each copied by the thread
        // that adds into it, just before (in cache then, not a pass of its own)
        if (N == 0 || inner != 1)
          backend::cpu::parallel_for(out.numel(), backend::cpu::grain_cheap, [&](std::int64_t b, std::int64_t e) {
            std::memcpy(y + b, x + b, static_cast<std::size_t>(e - b) * sizeof(T));
          });
        if (N == 0) return;
        // one column (inner == 1) is a scalar loop, as gather's
        backend::cpu::parallel_rows(outer * inner, inner == 1 ? N + E / 8 : N,
                                   inner == 1 ? backend::cpu::grain_costly : backend::cpu::grain_cheap,
                                   [&](std::int64_t cb, std::int64_t ce) {
          for (std::int64_t c = cb; c < ce;) {
            const std::int64_t o = c / inner, i0 = c % inner, len = std::min(inner - i0, ce - c);
            T* yo = y + o * E * inner + i0;
            const T* uo = u + o * N * inner + i0;
            if (inner == 1) {
              // a flat tensor (the cummax gradient's scatter): indices added through directly while
              // in [0, E), the rest of their block through offsets, a block of long runs of equal
              // indices a run at a time in a register (add_checked_block), in index order
              constexpr std::int64_t B = layout::index_block;
              std::int64_t off[B];
              std::memcpy(yo, x + o * E, static_cast<std::size_t>(E) * sizeof(T));
              for (std::int64_t b = 0; b < N; b += B) {
                const std::int64_t n = std::min(B, N - b);
                (void)layout::add_checked_block(yo, ix + b, uo + b, n, E, off);  // (checked up front)
              }
              c += len;
              continue;
            }
            if (len == 1) {
              // one column: a run of equal indices adds in a register rather than through memory,
              // each element in the same order
              std::int64_t at = -1;
              T acc{};
              for (std::int64_t n = 0; n < N; ++n) {
                const std::int64_t j = ix[n] < 0 ? ix[n] + E : ix[n];
                if (j != at) {
                  if (at >= 0) yo[at * inner] = acc;
                  at = j;
                  acc = yo[j * inner];
                }
                acc = rules::math::wrap_add(acc, uo[n * inner]);
              }
              if (at >= 0) yo[at * inner] = acc;
              c += len;
              continue;
            }
            for (std::int64_t n = 0; n < N; ++n) {
              T* __restrict yr = yo + (ix[n] < 0 ? ix[n] + E : ix[n]) * inner;
              const T* __restrict ur = uo + n * inner;
              for (std::int64_t i = 0; i < len; ++i) yr[i] = rules::math::wrap_add(yr[i], ur[i]);
            }
            c += len;
          }
        });
      });
    });
  }
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};

/// Indices to one-hot rows: out[..., j] = 1 where j == index, else 0. Reads attrs.i0 (depth)
/// and attrs.dtype (the output dtype). An index outside [0, depth), negative ones included,
/// gives an all-zero row (as TensorFlow's one_hot does).
struct OneHot {
  SC_OP_HEAD(OneHot, "one_hot")
  static constexpr int arity = 1;
  static constexpr bool differentiable = false;

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    const Tensor& idx = in[0];
    require_dtype(is_integral(idx.dtype()), name, idx.dtype(), "i32 or i64 indices", loc);
    if (SC_UNLIKELY(a.i0 < 0)) detail::fail<ValueError>(name, loc, "depth must be non-negative, got ", a.i0);
    if (SC_UNLIKELY(idx.rank() >= max_rank))
      detail::fail<ShapeError>(name, loc, "indices of shape ", idx.shape(), " already have the maximum rank ", max_rank);
    Shape out = idx.shape();
    out.push_back(a.i0);
    return {out, a.dtype};
  }
  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    backend::cuda::one_hot(in[0], out, a.i0, name, loc);
  }
  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    if (out.numel() == 0) return;
    const std::int64_t N = in[0].numel(), D = a.i0;
    visit_dtype(out.dtype(), [&](auto ttag) {
      using T = typename decltype(ttag)::type;
      layout::visit_index(in[0].dtype(), [&](auto itag) {
        using I = typename decltype(itag)::type;
        const I* ix = static_cast<const I*>(in[0].raw_data());
        T* y = static_cast<T*>(out.raw_data());
        backend::cpu::parallel_rows(N, D, backend::cpu::grain_cheap,
                                   [&](std::int64_t b, std::int64_t e) {
          std::fill(y + b * D, y + e * D, T(0));
          for (std::int64_t n = b; n < e; ++n)
            if (ix[n] >= 0 && ix[n] < D) y[n * D + ix[n]] = T(1);
        });
      });
    });
  }
};

}  // namespace ops

/// Entries of x along `axis` picked by integer `indices` (i32 or i64; negative counts from the
/// end), like PyTorch's index_select: the result has shape
/// x.shape[:axis] + indices.shape + x.shape[axis+1:]. An index out of range is a ValueError.
inline Tensor gather(const Tensor& x, const Tensor& indices, std::int64_t axis = 0,
                     std::source_location loc = std::source_location::current()) {
  ops::Attrs a;
  a.axis = axis;
  return detail::dispatch2<ops::Gather>(x, indices, a, loc);
}

/// x with `updates` added at `indices` along `axis` (PyTorch's index_add; the adjoint of
/// gather): updates has gather's result shape x.shape[:axis] + indices.shape +
/// x.shape[axis+1:], and its entry for index n is added to x's entry indices[n] (negative
/// counts from the end). Repeated indices accumulate. x and updates share a numeric dtype.
inline Tensor scatter_add(const Tensor& x, const Tensor& indices, const Tensor& updates, std::int64_t axis = 0,
                          std::source_location loc = std::source_location::current()) {
  ops::Attrs a;
  a.axis = axis;
  const detail::BorrowedInputs<3> in({&x, &indices, &updates});
  return detail::dispatch<ops::ScatterAdd>(in.span(), a, loc);
}

/// One-hot encoding: shape indices.shape + [depth], 1 at each index and 0 elsewhere, in dtype
/// `dtype`. Indices outside [0, depth), negative ones included, give all-zero rows (as in
/// TensorFlow). A negative depth is a ValueError.
inline Tensor one_hot(const Tensor& indices, std::int64_t depth, DType dtype = DType::f32,
                      std::source_location loc = std::source_location::current()) {
  ops::Attrs a;
  a.i0 = depth;
  a.dtype = dtype;
  return detail::dispatch<ops::OneHot>({&indices, 1}, a, loc);
}

// ---- gradient rules (after the functions they use) ---------------------------------------
// gather's adjoint: every picked row's gradient added back into a zero x (repeats accumulate);
// indices get none.
inline std::vector<Tensor> ops::Gather::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs& a) {
  return {scatter_add(detail::fill_on(g.device(), in[0].shape(), 0.0, g.dtype()), in[1], g, a.axis), Tensor()};
}
// Linear in x and updates: x's gradient passes through; updates read theirs back by gather.
inline std::vector<Tensor> ops::ScatterAdd::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs& a) {
  return {g, Tensor(), gather(g, in[1], a.axis)};
}

}  // namespace stagecraft
