// CPU loops for elementwise ops: linear SIMD loops when broadcasting is trivial, a collapsed
// strided walk otherwise. Hand-written rather than xtensor assignment: dynamic-rank xtensor
// expressions allocate shape/stride vectors per call, which breaks the eager dispatch budget
// (bench/bench_elementwise.cpp measures both).
#pragma once
#include <cstdint>
#include <type_traits>

#include "simd.hpp"  // xsimd, with GCC 12's AVX-512 intrinsics warnings handled
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "../../core/shape.hpp"
#include "../../core/tensor.hpp"
#include "masks.hpp"
#include "parallel.hpp"

namespace stagecraft::backend::cpu {

template <class T>
using batch = xsimd::batch<T>;

/// T has a SIMD vector type on this build (float, double and the integer types).
template <class T>
concept Vectorizable = std::is_arithmetic_v<T> && !std::is_same_v<T, bool> && (batch<T>::size > 1);

template <class Op, class T>
concept HasSimd1 = Vectorizable<T> && requires(const batch<T>& a) {
  { Op::simd(a) } -> std::convertible_to<batch<T>>;
};
template <class Op, class T>
concept HasSimd2 = Vectorizable<T> && requires(const batch<T>& a, const batch<T>& b) {
  { Op::simd(a, b) } -> std::convertible_to<batch<T>>;
};
/// Op chooses its path for one repeated second operand once a row (a rule's with_second: pow's
/// exponent), not once a batch: with_second(b, run) calls run(g) with g(a) == Op::simd(a, b).
struct AnyRun {
  template <class G> void operator()(const G&) const {}
};
template <class Op, class T>
concept FixesSecond = HasSimd2<Op, T> && requires(T b) { Op::with_second(b, AnyRun{}); };
/// Op's SIMD rule gives a lane mask (predicates, comparisons, logical ops): stored as bools.
template <class Op, class T>
concept HasMask1 = Vectorizable<T> && requires(const batch<T>& a) {
  { Op::simd(a) } -> std::same_as<mask<T>>;
};
template <class Op, class T>
concept HasMask2 = Vectorizable<T> && requires(const batch<T>& a, const batch<T>& b) {
  { Op::simd(a, b) } -> std::same_as<mask<T>>;
};
/// Op's SIMD rule converts batches of T to batches of R of as many lanes (cast between widths).
template <class Op, class T, class R>
concept HasConvert = Vectorizable<T> && Vectorizable<R> && !std::is_same_v<T, R> &&
                     batch<T>::size == batch<R>::size && requires(const batch<T>& a) {
  { Op::simd(a) } -> std::same_as<batch<R>>;
};

/// xsimd::batch_cast from S to T gives static_cast's numbers here: int32 <-> float everywhere on
/// x86 (cvtdq2ps / cvttps2dq, the scalar conversions' vector forms); int64 <-> double only with
/// AVX512DQ's instructions (xsimd emulates them elsewhere, not exactly over the whole range).
template <class S, class T>
inline constexpr bool exact_batch_cast = [] {
  if constexpr (std::is_same_v<S, T>) return true;
#if defined(__SSE2__)
  constexpr bool i32_f32 = (std::is_same_v<S, std::int32_t> && std::is_same_v<T, float>) ||
                           (std::is_same_v<S, float> && std::is_same_v<T, std::int32_t>);
  if constexpr (i32_f32) return true;
#endif
#if defined(__AVX512DQ__)
  constexpr bool i64_f64 = (std::is_same_v<S, std::int64_t> && std::is_same_v<T, double>) ||
                           (std::is_same_v<S, double> && std::is_same_v<T, std::int64_t>);
  if constexpr (i64_f64) return sizeof(batch<S>) == 64;
#endif
  return false;
}();

// ---- streaming stores ----------------------------------------------------------------------

/// Outputs at least this large are written with non-temporal (streaming) stores: they cannot
/// stay in cache for the next op anyway, and skipping the read-for-ownership of every output
/// line cuts a binary op's memory traffic by a quarter (add at 16M floats: about 1.5x faster).
inline constexpr std::int64_t stream_store_bytes = std::int64_t{16} << 20;

/// True when batches of T can be streamed to y (x86 SIMD and y aligned to a whole batch).
template <class T>
bool can_stream(const T* y) {
#if defined(__SSE2__)
  if constexpr (Vectorizable<T>) return reinterpret_cast<std::uintptr_t>(y) % sizeof(batch<T>) == 0;
#endif
  (void)y;
  return false;
}

/// Stores v to y (aligned) bypassing the caches, where the ISA has such a store.
template <class T>
SC_ALWAYS_INLINE void store_stream(T* y, const batch<T>& v) {
  // Chosen by element type and vector width (comparing the register types themselves trips
  // -Wignored-attributes); the batch converts to its native register.
  [[maybe_unused]] constexpr std::size_t bytes = sizeof(batch<T>);
  [[maybe_unused]] constexpr bool f = std::is_same_v<T, float>, d = std::is_same_v<T, double>,
                                  i = std::is_integral_v<T>;
#if defined(__AVX512F__)
  if constexpr (bytes == 64 && f) return _mm512_stream_ps(reinterpret_cast<float*>(y), v);
  if constexpr (bytes == 64 && d) return _mm512_stream_pd(reinterpret_cast<double*>(y), v);
  if constexpr (bytes == 64 && i) return _mm512_stream_si512(reinterpret_cast<__m512i*>(y), v);
#endif
#if defined(__AVX__)
  if constexpr (bytes == 32 && f) return _mm256_stream_ps(reinterpret_cast<float*>(y), v);
  if constexpr (bytes == 32 && d) return _mm256_stream_pd(reinterpret_cast<double*>(y), v);
  if constexpr (bytes == 32 && i) return _mm256_stream_si256(reinterpret_cast<__m256i*>(y), v);
#endif
#if defined(__SSE2__)
  if constexpr (bytes == 16 && f) return _mm_stream_ps(reinterpret_cast<float*>(y), v);
  if constexpr (bytes == 16 && d) return _mm_stream_pd(reinterpret_cast<double*>(y), v);
  if constexpr (bytes == 16 && i) return _mm_stream_si128(reinterpret_cast<__m128i*>(y), v);
#endif
  v.store_aligned(y);
}

/// Orders this thread's streaming stores before whatever follows (the join of the loop).
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// ---- tails ---------------------------------------------------------------------------------

/// Floating ops send the last partial batch through the SIMD rule too, on one zero-padded
/// batch: a small tensor (a batch-1 layer of 10 units) then costs one vector op instead of
/// ten libm calls, and every element is computed by the same rule, as the fused evaluator
/// computes it (eager and staged results agree bit for bit). Integer ops keep the scalar
/// tail (a padded lane of an integer division would divide by zero).
template <class T, class R>
inline constexpr bool padded_tail = std::is_floating_point_v<T> && std::is_same_v<T, R>;

/// The first r lanes of a batch loaded from p, the others zero (0 <= r <= the batch size); only
/// p[0, r) is read (AVX-512: one masked load, which touches no other memory).
template <class T>
SC_ALWAYS_INLINE batch<T> load_partial(const T* p, std::int64_t r) {
#if defined(__AVX512F__)
  if constexpr (sizeof(batch<T>) == 64 && std::is_same_v<T, float>)
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << r) - 1u), p);
  if constexpr (sizeof(batch<T>) == 64 && std::is_same_v<T, double>)
    return _mm512_maskz_loadu_pd(static_cast<__mmask8>((1u << r) - 1u), p);
  if constexpr (sizeof(batch<T>) == 64 && std::is_integral_v<T> && sizeof(T) == 4)
    return _mm512_maskz_loadu_epi32(static_cast<__mmask16>((1u << r) - 1u), p);
  if constexpr (sizeof(batch<T>) == 64 && std::is_integral_v<T> && sizeof(T) == 8)
    return _mm512_maskz_loadu_epi64(static_cast<__mmask8>((1u << r) - 1u), p);
#endif
  alignas(sizeof(batch<T>)) T t[batch<T>::size] = {};
  for (std::int64_t k = 0; k < r; ++k) t[k] = p[k];
  return batch<T>::load_aligned(t);
}
/// Stores the first r lanes of v to p[0, r) (0 <= r <= the batch size); nothing else is written.
template <class T>
SC_ALWAYS_INLINE void store_partial(T* p, const batch<T>& v, std::int64_t r) {
#if defined(__AVX512F__)
  if constexpr (sizeof(batch<T>) == 64 && std::is_same_v<T, float>)
    return _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << r) - 1u), v);
  if constexpr (sizeof(batch<T>) == 64 && std::is_same_v<T, double>)
    return _mm512_mask_storeu_pd(p, static_cast<__mmask8>((1u << r) - 1u), v);
  if constexpr (sizeof(batch<T>) == 64 && std::is_integral_v<T> && sizeof(T) == 4)
    return _mm512_mask_storeu_epi32(p, static_cast<__mmask16>((1u << r) - 1u), v);
  if constexpr (sizeof(batch<T>) == 64 && std::is_integral_v<T> && sizeof(T) == 8)
    return _mm512_mask_storeu_epi64(p, static_cast<__mmask8>((1u << r) - 1u), v);
#endif
  alignas(sizeof(batch<T>)) T t[batch<T>::size];
  v.store_aligned(t);
  for (std::int64_t k = 0; k < r; ++k) p[k] = t[k];
}

/// y[0, r) = f(the batch of x[0, r) zero-padded), r < the batch size.
template <class T, class F>
SC_ALWAYS_INLINE void padded_batch(const T* x, T* y, std::int64_t r, F&& f) {
  store_partial(y, batch<T>(f(load_partial(x, r))), r);
}

// ---- unary -------------------------------------------------------------------------------

/// y = Op(x) over n elements; nt: stream the stores (y must then satisfy can_stream).
template <class Op, class T, class R>
void unary_range(const T* __restrict x, R* __restrict y, std::int64_t n, bool nt = false) {
  std::int64_t i = 0;
  if constexpr (std::is_same_v<T, R> && HasSimd1<Op, T>) {
    constexpr std::int64_t W = batch<T>::size;
    if (nt) {
      for (; i + W <= n; i += W) store_stream(y + i, batch<T>(Op::simd(batch<T>::load_unaligned(x + i))));
      stream_fence();
    } else {
      for (; i + W <= n; i += W) Op::simd(batch<T>::load_unaligned(x + i)).store_unaligned(y + i);
    }
    if constexpr (padded_tail<T, R>) {
      if (i < n) padded_batch(x + i, y + i, n - i, [](const batch<T>& v) { return Op::simd(v); });
      i = n;  // done (the scalar tail below is then empty; no early return: nvcc warns of the dead loop)
    }
  } else if constexpr (std::is_same_v<R, bool> && HasMask1<Op, T>) {
    // Lane masks stored as bools; the last partial batch zero-padded (a comparison of padding
    // cannot trap, and its lanes are never stored).
    constexpr std::int64_t W = batch<T>::size;
    for (; i + W <= n; i += W) store_mask<T>(y + i, Op::simd(batch<T>::load_unaligned(x + i)));
    if (i < n) store_mask<T>(y + i, Op::simd(load_partial(x + i, n - i)), n - i);
    i = n;
  } else if constexpr (HasConvert<Op, T, R>) {
    constexpr std::int64_t W = batch<T>::size;
    if (nt) {
      for (; i + W <= n; i += W) store_stream(y + i, Op::simd(batch<T>::load_unaligned(x + i)));
      stream_fence();
    } else {
      for (; i + W <= n; i += W) Op::simd(batch<T>::load_unaligned(x + i)).store_unaligned(y + i);
    }
  }
  for (; i < n; ++i) y[i] = static_cast<R>(Op::scalar(x[i]));
}

/// True when a loop writing n elements to y should stream its stores.
template <class R>
bool stream_output(const R* y, std::int64_t n) {
  return n * static_cast<std::int64_t>(sizeof(R)) >= stream_store_bytes && can_stream(y);
}

/// y = Op(x) over contiguous buffers of n elements, threaded when large.
template <class Op, class T, class R>
void unary_loop(const T* x, R* y, std::int64_t n, std::int64_t grain) {
  // parallel_for's ranges start at multiples of 64 elements, so an aligned y stays aligned.
  const bool nt = stream_output(y, n);
  parallel_for(n, grain, [&](std::int64_t b, std::int64_t e) { unary_range<Op, T, R>(x + b, y + b, e - b, nt); });
}

// ---- binary ------------------------------------------------------------------------------

/// binary_row for ops whose SIMD rule gives a lane mask (comparisons, logical ops), at least one
/// operand contiguous: bools out, the last partial batch zero-padded (its padding never stored).
template <class Op, class T>
void binary_mask_row(const T* __restrict a, const T* __restrict b, bool* __restrict y, std::int64_t n, int sa,
                     int sb) {
  using B = batch<T>;
  constexpr std::int64_t W = B::size;
  const std::int64_t r = n % W, full = n - r;
  std::int64_t i = 0;
  if (sa && sb) {
    for (; i < full; i += W) store_mask<T>(y + i, Op::simd(B::load_unaligned(a + i), B::load_unaligned(b + i)));
    if (r) store_mask<T>(y + i, Op::simd(load_partial(a + i, r), load_partial(b + i, r)), r);
  } else if (sb) {
    const B va(a[0]);
    for (; i < full; i += W) store_mask<T>(y + i, Op::simd(va, B::load_unaligned(b + i)));
    if (r) store_mask<T>(y + i, Op::simd(va, load_partial(b + i, r)), r);
  } else {
    const B vb(b[0]);
    for (; i < full; i += W) store_mask<T>(y + i, Op::simd(B::load_unaligned(a + i), vb));
    if (r) store_mask<T>(y + i, Op::simd(load_partial(a + i, r), vb), r);
  }
}

/// y = g(a, b) over a row of n, with g as FixesSecond's (the path fixed for b), b itself in the
/// scalar tail of integer rows.
template <class Op, class T, class G>
void fixed_second_row(const G& g, const T* __restrict a, T b, T* __restrict y, std::int64_t n) {
  constexpr std::int64_t W = batch<T>::size;
  std::int64_t i = 0;
  for (; i + W <= n; i += W) batch<T>(g(batch<T>::load_unaligned(a + i))).store_unaligned(y + i);
  if constexpr (padded_tail<T, T>) {
    if (i < n) padded_batch(a + i, y + i, n - i, [&](const batch<T>& va) { return batch<T>(g(va)); });
    i = n;
  }
  for (; i < n; ++i) y[i] = static_cast<T>(Op::scalar(a[i], b));
}

/// One contiguous row: sa, sb are 0 (the operand is one repeated element) or 1; nt: stream
/// the stores (y must then satisfy can_stream; only the both-contiguous case does).
template <class Op, class T, class R>
void binary_row(const T* __restrict a, const T* __restrict b, R* __restrict y, std::int64_t n,
                int sa, int sb, bool nt = false) {
  std::int64_t i = 0;
  if constexpr (std::is_same_v<T, R> && FixesSecond<Op, T>) {
    if (sa && !sb) return Op::with_second(b[0], [&](const auto& g) { fixed_second_row<Op>(g, a, b[0], y, n); });
  }
  if constexpr (std::is_same_v<T, R> && HasSimd2<Op, T>) {
    constexpr std::int64_t W = batch<T>::size;
    if (nt && sa && sb) {
      for (; i + W <= n; i += W)
        store_stream(y + i, batch<T>(Op::simd(batch<T>::load_unaligned(a + i), batch<T>::load_unaligned(b + i))));
      stream_fence();
    } else if (sa && sb) {
      for (; i + W <= n; i += W)
        Op::simd(batch<T>::load_unaligned(a + i), batch<T>::load_unaligned(b + i)).store_unaligned(y + i);
    } else if (sb) {
      const batch<T> va(a[0]);
      for (; i + W <= n; i += W) Op::simd(va, batch<T>::load_unaligned(b + i)).store_unaligned(y + i);
    } else if (sa) {
      const batch<T> vb(b[0]);
      for (; i + W <= n; i += W) Op::simd(batch<T>::load_unaligned(a + i), vb).store_unaligned(y + i);
    }
    if constexpr (padded_tail<T, R>) {
      if (i < n && sa && sb) {
        const batch<T> vb = load_partial(b + i, n - i);
        padded_batch(a + i, y + i, n - i, [&](const batch<T>& va) { return Op::simd(va, vb); });
        return;
      }
      if (i < n && sb) {
        const batch<T> va(a[0]);
        padded_batch(b + i, y + i, n - i, [&](const batch<T>& vb) { return Op::simd(va, vb); });
        return;
      }
      if (i < n && sa) {
        const batch<T> vb(b[0]);
        padded_batch(a + i, y + i, n - i, [&](const batch<T>& va) { return Op::simd(va, vb); });
        return;
      }
    }
  } else if constexpr (std::is_same_v<R, bool> && HasMask2<Op, T>) {
    if (sa || sb) return binary_mask_row<Op, T>(a, b, y, n, sa, sb);
  }
  if (sa && sb) {
    for (; i < n; ++i) y[i] = static_cast<R>(Op::scalar(a[i], b[i]));
  } else if (sb) {
    const T va = a[0];
    for (; i < n; ++i) y[i] = static_cast<R>(Op::scalar(va, b[i]));
  } else if (sa) {
    const T vb = b[0];
    for (; i < n; ++i) y[i] = static_cast<R>(Op::scalar(a[i], vb));
  } else {
    const R v = static_cast<R>(Op::scalar(a[0], b[0]));
    for (; i < n; ++i) y[i] = v;
  }
}

/// Output shape and per-operand strides with adjacent axes merged where every operand is
/// contiguous across them (so [N,C]+[C] walks as rows of C, and [N,C]+[N,C] as one row).
template <int N>
struct StridedPlan {
  Shape shape;
  Shape strides[N];
};
/// The plan of N operands with element strides st[k] over out's axes (0 on broadcast axes).
template <int N>
StridedPlan<N> collapse_strides(const Shape& out, const Shape (&st)[N]) {
  StridedPlan<N> p;
  for (int i = 0; i < out.rank(); ++i) {
    if (out[i] == 1) continue;  // size-1 axes carry nothing
    const int r = p.shape.rank();
    bool merge = r > 0;
    for (int k = 0; k < N && merge; ++k) merge = p.strides[k][r - 1] == st[k][i] * out[i];
    if (merge) {
      p.shape[r - 1] *= out[i];
      for (int k = 0; k < N; ++k) p.strides[k][r - 1] = st[k][i];
    } else {
      p.shape.push_back(out[i]);
      for (int k = 0; k < N; ++k) p.strides[k].push_back(st[k][i]);
    }
  }
  if (p.shape.rank() == 0) {  // a single element
    p.shape.push_back(1);
    for (int k = 0; k < N; ++k) p.strides[k].push_back(0);
  }
  return p;
}
template <int N>
StridedPlan<N> collapse(const Shape& out, const Shape* const (&ins)[N]) {
  Shape st[N];
  for (int k = 0; k < N; ++k) st[k] = broadcast_strides(*ins[k], out);
  return collapse_strides<N>(out, st);
}

/// Calls row(offsets..., out_offset, row_length) for every innermost row of the plan.
/// Rows [row_begin, row_end) of the outer index space are visited.
template <int N, class Row>
void for_each_row(const StridedPlan<N>& p, std::int64_t row_begin, std::int64_t row_end, Row&& row) {
  const int r = p.shape.rank();
  const std::int64_t len = p.shape[r - 1];
  std::int64_t idx[max_rank] = {};
  std::int64_t off[N] = {};
  // unravel row_begin over the outer axes
  std::int64_t rem = row_begin;
  for (int d = r - 2; d >= 0; --d) {
    idx[d] = rem % p.shape[d];
    rem /= p.shape[d];
  }
  for (int k = 0; k < N; ++k)
    for (int d = 0; d < r - 1; ++d) off[k] += idx[d] * p.strides[k][d];
  for (std::int64_t rr = row_begin; rr < row_end; ++rr) {
    row(off, rr * len, len);
    for (int d = r - 2; d >= 0; --d) {  // advance the odometer
      ++idx[d];
      for (int k = 0; k < N; ++k) off[k] += p.strides[k][d];
      if (idx[d] < p.shape[d]) break;
      for (int k = 0; k < N; ++k) off[k] -= idx[d] * p.strides[k][d];
      idx[d] = 0;
    }
  }
}

/// The part [lo, hi) of the row of `len` elements starting at output element `o` that a thread's
/// share [b, e) of the output covers (empty when hi <= lo).
struct RowPiece {
  std::int64_t lo, hi;
};
inline RowPiece row_piece(std::int64_t b, std::int64_t e, std::int64_t o, std::int64_t len) {
  return {std::max<std::int64_t>(b - o, 0), std::min<std::int64_t>(e - o, len)};
}

/// Splits the plan's output elements (contiguous, rows of the innermost extent) over threads as
/// parallel_for splits elements, and calls row(offsets, out_offset, lo, hi) for the part [lo, hi)
/// of each row that falls in a thread's share. Threads follow the elements, not the rows: a few
/// long rows (a scalar broadcast coalesces to one) still spread, and long rows are not held to
/// parallel_for's floor of 64 units per thread (which made a [4096, 1024] broadcast one thread's).
template <int N, class Row>
void parallel_row_pieces(const StridedPlan<N>& p, std::int64_t grain, Row&& row) {
  const std::int64_t len = p.shape[p.shape.rank() - 1], n = p.shape.numel();
  if (n == 0) return;
  parallel_for(n, grain, [&](std::int64_t b, std::int64_t e) {
    for_each_row<N>(p, b / len, (e + len - 1) / len, [&](const std::int64_t* off, std::int64_t o, std::int64_t l) {
      const RowPiece rp = row_piece(b, e, o, l);
      row(off, o, rp.lo, rp.hi);
    });
  });
}

/// out = Op(a, b) with NumPy broadcasting; a and b already have the compute dtype T.
template <class Op, class T, class R>
void binary_loop(const Tensor& a, const Tensor& b, Tensor& out, std::int64_t grain) {
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  R* py = static_cast<R*>(out.raw_data());
  const std::int64_t n = out.numel();
  if (n == 0) return;
  const Shape& os = out.shape();
  // An operand with as many elements as the output has its layout, whatever size-1 axes its
  // shape adds or lacks ([10] against [1, 10]).
  const bool fa = a.numel() == n, fb = b.numel() == n;
  if ((fa || a.numel() == 1) && (fb || b.numel() == 1)) {  // linear: no broadcasting walk
    const int sa = fa ? 1 : 0, sb = fb ? 1 : 0;
    const bool nt = fa && fb && stream_output(py, n);
    parallel_for(n, grain, [&](std::int64_t s, std::int64_t e) {
      binary_row<Op, T, R>(pa + sa * s, pb + sb * s, py + s, e - s, sa, sb, nt);
    });
    return;
  }
  // One operand full, the other one row repeated ([B, N] + [N], a dense layer's bias): rows
  // without planning a strided walk.
  const std::int64_t last = os.back();
  const bool row_a = fb && a.numel() == last && a.shape().back() == last;
  const bool row_b = fa && b.numel() == last && b.shape().back() == last;
  if (row_a || row_b) {  // (threads split elements; a share may start or end inside a row)
    parallel_for(n, grain, [&](std::int64_t s, std::int64_t e) {
      for (std::int64_t r = s / last; r * last < e; ++r) {
        const std::int64_t o = r * last;
        const RowPiece rp = row_piece(s, e, o, last);
        binary_row<Op, T, R>((row_a ? pa : pa + o) + rp.lo, (row_b ? pb : pb + o) + rp.lo, py + o + rp.lo, rp.hi - rp.lo,
                             1, 1);
      }
    });
    return;
  }
  const Shape* ins[2] = {&a.shape(), &b.shape()};
  const StridedPlan<2> p = collapse<2>(os, ins);
  const int r = p.shape.rank();
  const int sa = static_cast<int>(p.strides[0][r - 1]), sb = static_cast<int>(p.strides[1][r - 1]);
  parallel_row_pieces<2>(p, grain, [&](const std::int64_t* off, std::int64_t o, std::int64_t lo, std::int64_t hi) {
    binary_row<Op, T, R>(pa + off[0] + lo * sa, pb + off[1] + lo * sb, py + o + lo, hi - lo, sa, sb);
  });
}

// ---- select (where) ------------------------------------------------------------------------

/// One row of y = Op::f(c, a, b) (Op a select rule: c ? a : b), each operand's stride a template
/// constant, 0 (one repeated element) or 1. Batches of T read c's bools as a lane mask; bool T
/// and ISAs without batches of T take the scalar rule.
template <class Op, int S0, int S1, int S2, class T>
void select_row_fixed(const bool* __restrict c, const T* __restrict a, const T* __restrict b, T* __restrict y,
                      std::int64_t n) {
  if (n <= 0) return;
  std::int64_t i = 0;
  if constexpr (Vectorizable<T> && Op::vectorizes) {
    using B = batch<T>;
    constexpr std::int64_t W = B::size;
    const mask<T> mc(S0 ? false : c[0]);
    const B va = S1 ? B(T(0)) : B(a[0]), vb = S2 ? B(T(0)) : B(b[0]);
    for (; i + W <= n; i += W) {
      const mask<T> m = S0 ? load_mask<T>(c + i) : mc;
      const B x = S1 ? B::load_unaligned(a + i) : va, z = S2 ? B::load_unaligned(b + i) : vb;
      Op::f(m, x, z).store_unaligned(y + i);
    }
    if (i < n) {  // the last partial batch, padded: only y[i, n) is written
      const std::int64_t r = n - i;
      const mask<T> m = S0 ? load_mask<T>(c + i, r) : mc;
      const B x = S1 ? load_partial(a + i, r) : va, z = S2 ? load_partial(b + i, r) : vb;
      store_partial(y + i, B(Op::f(m, x, z)), r);
    }
    i = n;
  }
  for (; i < n; ++i) y[i] = Op::f(c[i * S0], a[i * S1], b[i * S2]);
}
/// select_row_fixed with strides s0, s1, s2 (each 0 or 1) known at run time.
template <class Op, class T>
void select_row(const bool* c, const T* a, const T* b, T* y, std::int64_t n, std::int64_t s0, std::int64_t s1,
                std::int64_t s2) {
  switch ((s0 ? 4 : 0) | (s1 ? 2 : 0) | (s2 ? 1 : 0)) {
    case 7: return select_row_fixed<Op, 1, 1, 1>(c, a, b, y, n);
    case 6: return select_row_fixed<Op, 1, 1, 0>(c, a, b, y, n);
    case 5: return select_row_fixed<Op, 1, 0, 1>(c, a, b, y, n);
    case 4: return select_row_fixed<Op, 1, 0, 0>(c, a, b, y, n);
    case 3: return select_row_fixed<Op, 0, 1, 1>(c, a, b, y, n);
    case 2: return select_row_fixed<Op, 0, 1, 0>(c, a, b, y, n);
    case 1: return select_row_fixed<Op, 0, 0, 1>(c, a, b, y, n);
    default: return select_row_fixed<Op, 0, 0, 0>(c, a, b, y, n);
  }
}

}  // namespace stagecraft::backend::cpu
