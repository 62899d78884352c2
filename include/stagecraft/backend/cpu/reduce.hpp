// CPU reduction loops: sum/max/min over any axis set (planned as [outer, R, inner] steps,
// SIMD rows or SIMD across inner, pairwise float sums, threads over rows or over chunks of a
// long reduction) and argmax/argmin.
#pragma once
#include <cstdint>
#include <type_traits>

#include "simd.hpp"  // xsimd, with GCC 12's AVX-512 intrinsics warnings handled

#include "../../core/shape.hpp"
#include "../../core/tensor.hpp"
#include "../../ops/rules.hpp"  // the max/min math
#include "elementwise.hpp"
#include "parallel.hpp"

namespace stagecraft::backend::cpu {

/// Elements of a contiguous row summed directly (several SIMD accumulators) before a float
/// sum splits pairwise; error grows with log(n) instead of n.
inline constexpr std::int64_t pair_block = 1024;
/// Rows added directly into per-column accumulators before a float sum splits pairwise.
inline constexpr std::int64_t col_block = 64;
/// Columns one task accumulates when the reduced axis is not innermost (stays in L1).
inline constexpr std::int64_t col_tile = 256;
/// Tasks a long reduction is cut into when it has too few rows to keep the threads busy.
/// Chosen from the shape only, so results do not depend on the thread count.
inline constexpr std::int64_t split_target = 256;

template <class T>
constexpr bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return v != v;
  else return false;
}

/// Sum: bool counts as i64 (NumPy's rule); other dtypes keep theirs.
struct SumReducer {
  static constexpr bool is_sum = true;
  template <class In> using out_t = std::conditional_t<std::is_same_v<In, bool>, std::int64_t, In>;
  template <class T> static T combine(T a, T b) {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {  // wraps, as the SIMD adds do
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return static_cast<T>(a + b);
    }
  }
  template <class B> static B simd(const B& a, const B& b) { return a + b; }
};
/// Max: a NaN anywhere wins and stays (once the accumulator is NaN nothing replaces it). The
/// math is the maximum op's rule (ops/rules.hpp), with the new element first.
struct MaxReducer {
  static constexpr bool is_sum = false;
  template <class In> using out_t = In;
  template <class T> static T combine(T a, T b) { return rules::Maximum::f(b, a); }
  template <class B> static B simd(const B& a, const B& b) { return rules::Maximum::f(b, a); }
};
/// Min: as Max, NaN propagates (the minimum op's rule).
struct MinReducer {
  static constexpr bool is_sum = false;
  template <class In> using out_t = In;
  template <class T> static T combine(T a, T b) { return rules::Minimum::f(b, a); }
  template <class B> static B simd(const B& a, const B& b) { return rules::Minimum::f(b, a); }
};

// ---- one contiguous row -------------------------------------------------------------------

/// The reduction of x[0..n) (n >= 1, or n >= 0 for sums).
template <class Rd, class In, class Out>
Out reduce_row(const In* x, std::int64_t n) {
  if constexpr (Rd::is_sum && std::is_floating_point_v<Out>) {
    if (n > pair_block) {
      const std::int64_t h = n / 2 / 64 * 64;
      return reduce_row<Rd, In, Out>(x, h) + reduce_row<Rd, In, Out>(x + h, n - h);
    }
  }
  if constexpr (Rd::is_sum) {
    if (n == 0) return Out(0);
  }
  std::int64_t i = 1;
  Out acc = static_cast<Out>(x[0]);
  if constexpr (std::is_same_v<In, Out> && Vectorizable<In>) {
    using B = batch<In>;
    constexpr std::int64_t W = B::size;
    if (n >= 4 * W) {  // four accumulators hide the add/compare latency
      B a0 = B::load_unaligned(x), a1 = B::load_unaligned(x + W);
      B a2 = B::load_unaligned(x + 2 * W), a3 = B::load_unaligned(x + 3 * W);
      for (i = 4 * W; i + 4 * W <= n; i += 4 * W) {
        a0 = Rd::simd(a0, B::load_unaligned(x + i));
        a1 = Rd::simd(a1, B::load_unaligned(x + i + W));
        a2 = Rd::simd(a2, B::load_unaligned(x + i + 2 * W));
        a3 = Rd::simd(a3, B::load_unaligned(x + i + 3 * W));
      }
      a0 = Rd::simd(Rd::simd(a0, a1), Rd::simd(a2, a3));
      for (; i + W <= n; i += W) a0 = Rd::simd(a0, B::load_unaligned(x + i));
      alignas(64) In lanes[W];
      a0.store_aligned(lanes);
      acc = lanes[0];
      for (std::int64_t l = 1; l < W; ++l) acc = Rd::combine(acc, lanes[l]);
    }
  }
  for (; i < n; ++i) acc = Rd::combine(acc, static_cast<Out>(x[i]));
  return acc;
}

// ---- columns: the reduced axis is not innermost ------------------------------------------

/// acc[i] = combine(acc[i], v[i]) for i < len.
template <class Rd, class In, class Out>
void accumulate_row(Out* __restrict acc, const In* __restrict v, std::int64_t len) {
  std::int64_t i = 0;
  if constexpr (std::is_same_v<In, Out> && Vectorizable<In>) {
    using B = batch<In>;
    constexpr std::int64_t W = B::size;
    for (; i + W <= len; i += W) Rd::simd(B::load_unaligned(acc + i), B::load_unaligned(v + i)).store_unaligned(acc + i);
  }
  for (; i < len; ++i) acc[i] = Rd::combine(acc[i], static_cast<Out>(v[i]));
}

/// acc[i] = reduction over r < rows of x[r * stride + i], for i < len <= col_tile; rows >= 1.
template <class Rd, class In, class Out>
void reduce_cols(const In* x, std::int64_t rows, std::int64_t stride, std::int64_t len, Out* acc) {
  if constexpr (Rd::is_sum && std::is_floating_point_v<Out>) {
    if (rows > col_block) {
      const std::int64_t h = rows / 2;
      reduce_cols<Rd, In, Out>(x, h, stride, len, acc);
      alignas(64) Out tmp[col_tile];
      reduce_cols<Rd, In, Out>(x + h * stride, rows - h, stride, len, tmp);
      accumulate_row<Rd, Out, Out>(acc, tmp, len);
      return;
    }
  }
  for (std::int64_t i = 0; i < len; ++i) acc[i] = static_cast<Out>(x[i]);
  for (std::int64_t r = 1; r < rows; ++r) accumulate_row<Rd, In, Out>(acc, x + r * stride, len);
}

// ---- one [outer, R, inner] step ---------------------------------------------------------

/// The rows of each chunk reduce3 cuts R into for a [outer, R, inner] reduction (R: no cut). From
/// the shape only, so results do not depend on the thread count; the fused evaluator's column
/// reductions cut alike to add every column in the same order.
inline std::int64_t chunk_rows(std::int64_t outer, std::int64_t R, std::int64_t inner) {
  const std::int64_t natural = outer * ((inner + col_tile - 1) / col_tile);
  if (outer * R * inner < grain_cheap || natural >= split_target / 4) return R;
  const std::int64_t min_rows = std::max<std::int64_t>(2, 512 / std::min(inner, col_tile));
  const std::int64_t chunks = std::min((split_target + natural - 1) / natural, R / min_rows);
  return chunks < 2 ? R : (R + chunks - 1) / chunks;
}

/// y[o, i] = reduction over r of x[o, r, i]; R >= 1. Threads go over rows (and column tiles);
/// when those are too few for a big reduction, R is cut into chunks (chunk_rows) whose partial
/// results are reduced in a second, small step.
template <class Rd, class In, class Out>
void reduce3(const In* x, Out* y, std::int64_t outer, std::int64_t R, std::int64_t inner, bool allow_split = true) {
  const std::int64_t len = std::min(inner, col_tile);
  const std::int64_t ntiles = (inner + col_tile - 1) / col_tile;
  const std::int64_t natural = outer * ntiles;
  // Reduces rows [r0, r1) of outer index o, column tile t, into dst (a row of `inner`).
  auto block = [&](std::int64_t o, std::int64_t t, std::int64_t r0, std::int64_t r1, Out* dst) {
    const In* src = x + (o * R + r0) * inner + t * col_tile;
    if (inner == 1) *dst = reduce_row<Rd, In, Out>(src, r1 - r0);
    else reduce_cols<Rd, In, Out>(src, r1 - r0, inner, std::min(len, inner - t * col_tile), dst + t * col_tile);
  };
  const std::int64_t per = allow_split ? chunk_rows(outer, R, inner) : R;
  if (per >= R) {
    parallel_rows(natural, R * len, grain_cheap, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t k = b; k < e; ++k) block(k / ntiles, k % ntiles, 0, R, y + (k / ntiles) * inner);
    });
    return;
  }
  const std::int64_t chunks = (R + per - 1) / per;
  Tensor part = detail::empty_tensor(Shape{outer * chunks * inner}, dtype_of<Out>(), Device::cpu());
  Out* p = static_cast<Out*>(part.raw_data());
  parallel_rows(natural * chunks, per * len, grain_cheap, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t k = b; k < e; ++k) {
      const std::int64_t t = k % ntiles, c = (k / ntiles) % chunks, o = k / (ntiles * chunks);
      block(o, t, c * per, std::min(R, (c + 1) * per), p + (o * chunks + c) * inner);
    }
  });
  reduce3<Rd, Out, Out>(p, y, outer, chunks, inner, false);
}

// ---- planning: any axis set --------------------------------------------------------------

/// Runs of adjacent axes that are all reduced or all kept, size-1 axes dropped.
struct AxisGroups {
  std::int64_t extent[max_rank] = {};
  bool reduced[max_rank] = {};
  int n = 0;
  int num_reduced() const {
    int k = 0;
    for (int i = 0; i < n; ++i) k += reduced[i];
    return k;
  }
  std::int64_t product(int b, int e) const {
    std::int64_t p = 1;
    for (int i = b; i < e; ++i) p *= extent[i];
    return p;
  }
  /// Drops group g (now reduced away) and merges its kept neighbours.
  void remove(int g) {
    for (int i = g; i + 1 < n; ++i) extent[i] = extent[i + 1], reduced[i] = reduced[i + 1];
    --n;
    if (g > 0 && g < n && !reduced[g - 1] && !reduced[g]) {
      extent[g - 1] *= extent[g];
      for (int i = g; i + 1 < n; ++i) extent[i] = extent[i + 1], reduced[i] = reduced[i + 1];
      --n;
    }
  }
};

inline AxisGroups group_axes(const Shape& s, const bool* reduced) {
  AxisGroups g;
  for (int i = 0; i < s.rank(); ++i) {
    if (s[i] == 1) continue;  // carries nothing either way
    if (g.n > 0 && g.reduced[g.n - 1] == reduced[i]) {
      g.extent[g.n - 1] *= s[i];
    } else {
      g.extent[g.n] = s[i];
      g.reduced[g.n] = reduced[i];
      ++g.n;
    }
  }
  return g;
}

template <class Rd, class In, class Out>
void reduce_typed(const Tensor& x, Tensor& out, const bool* reduced) {
  Out* y = static_cast<Out*>(out.raw_data());
  const In* src = static_cast<const In*>(x.raw_data());
  const std::int64_t n_out = out.numel();
  if (n_out == 0) return;
  if (x.numel() == 0) {  // only sums get here (infer rejects empty max/min): the identity
    for (std::int64_t i = 0; i < n_out; ++i) y[i] = Out(0);
    return;
  }
  AxisGroups g = group_axes(x.shape(), reduced);
  if (g.num_reduced() == 0) {  // only size-1 axes reduced: a converting copy
    parallel_for(n_out, grain_cheap, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) y[i] = static_cast<Out>(src[i]);
    });
    return;
  }
  // Non-adjacent reduced runs (axes {0, 2} of a rank-3) go in steps, the longest run first
  // so the intermediate is as small as possible; each step is one [outer, R, inner] pass.
  Tensor hold;
  const Out* mid = nullptr;
  while (true) {
    int best = -1;
    for (int i = 0; i < g.n; ++i)
      if (g.reduced[i] && (best < 0 || g.extent[i] > g.extent[best])) best = i;
    const std::int64_t outer = g.product(0, best), R = g.extent[best], inner = g.product(best + 1, g.n);
    const bool last = g.num_reduced() == 1;
    Tensor next = last ? out : detail::empty_tensor(Shape{outer * inner}, dtype_of<Out>(), Device::cpu());
    Out* dst = static_cast<Out*>(next.raw_data());
    if (mid == nullptr) reduce3<Rd, In, Out>(src, dst, outer, R, inner);
    else reduce3<Rd, Out, Out>(mid, dst, outer, R, inner);
    if (last) return;
    hold = next;
    mid = dst;
    g.remove(best);
  }
}

/// out = reduction of x over the axes flagged in reduced[0..rank); out holds the kept extents
/// in order (keepdims or not, the layout is the same).
template <class Rd>
void reduce(const Tensor& x, Tensor& out, const bool* reduced) {
  visit_dtype(x.dtype(), [&](auto tag) {
    using In = typename decltype(tag)::type;
    reduce_typed<Rd, In, typename Rd::template out_t<In>>(x, out, reduced);
  });
}

// ---- argmax / argmin ---------------------------------------------------------------------

/// Index of the first max (min) of x[0..n), n >= 1; a NaN counts as the extreme (NumPy).
template <bool IsMax, class T>
std::int64_t arg_row(const T* x, std::int64_t n) {
  if (n >= 64) {  // a SIMD pass finds the value, a short scan finds where it first is
    using Rd = std::conditional_t<IsMax, MaxReducer, MinReducer>;
    const T m = reduce_row<Rd, T, T>(x, n);
    std::int64_t i = 0;
    if constexpr (Vectorizable<T>) {  // skip whole vectors that do not hold it
      using B = batch<T>;
      constexpr std::int64_t W = B::size;
      const B bm(m);
      for (; i + W <= n; i += W) {
        const B v = B::load_unaligned(x + i);
        if constexpr (std::is_floating_point_v<T>) {
          if (xsimd::any(is_nan(m) ? xsimd::isnan(v) : v == bm)) break;
        } else {
          if (xsimd::any(v == bm)) break;
        }
      }
    }
    for (; i < n; ++i)
      if (is_nan(m) ? is_nan(x[i]) : x[i] == m) return i;
  }
  std::int64_t idx = 0;
  T best = x[0];
  if (is_nan(best)) return 0;
  for (std::int64_t i = 1; i < n; ++i) {
    const T v = x[i];
    if (is_nan(v)) return i;
    if (IsMax ? v > best : v < best) best = v, idx = i;
  }
  return idx;
}

/// y[o, i] = argmax (argmin) over r of x[o, r, i]; R >= 1.
template <bool IsMax, class T>
void arg_reduce3(const T* x, std::int64_t* y, std::int64_t outer, std::int64_t R, std::int64_t inner) {
  if (outer * inner == 0) return;
  if (inner == 1) {
    parallel_rows(outer, R, grain_cheap, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t o = b; o < e; ++o) y[o] = arg_row<IsMax>(x + o * R, R);
    });
    return;
  }
  const std::int64_t ntiles = (inner + col_tile - 1) / col_tile;
  parallel_rows(outer * ntiles, R * std::min(inner, col_tile), grain_cheap, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t k = b; k < e; ++k) {
      const std::int64_t o = k / ntiles, t0 = (k % ntiles) * col_tile, len = std::min(col_tile, inner - t0);
      const T* src = x + o * R * inner + t0;
      std::int64_t* idx = y + o * inner + t0;
      T best[col_tile];
      for (std::int64_t i = 0; i < len; ++i) best[i] = src[i], idx[i] = 0;
      for (std::int64_t r = 1; r < R; ++r) {
        const T* row = src + r * inner;
        for (std::int64_t i = 0; i < len; ++i) {  // branch-free, so the compiler vectorises it
          const T v = row[i], bv = best[i];
          const bool take = (IsMax ? v > bv : v < bv) || (is_nan(v) && !is_nan(bv));
          best[i] = take ? v : bv;
          idx[i] = take ? r : idx[i];
        }
      }
    }
  });
}

/// out (i64) = argmax (argmin) of x along axis (rank-0 x: out is 0).
template <bool IsMax>
void arg_reduce(const Tensor& x, Tensor& out, int axis) {
  auto* y = static_cast<std::int64_t*>(out.raw_data());
  if (x.rank() == 0) {
    *y = 0;
    return;
  }
  const Shape& s = x.shape();
  const AxisSplit sp = axis_split(s, axis);
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    arg_reduce3<IsMax, T>(static_cast<const T*>(x.raw_data()), y, sp.outer, sp.n, sp.inner);
  });
}

}  // namespace stagecraft::backend::cpu
