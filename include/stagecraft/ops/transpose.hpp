// transpose(x, perm): a permuted copy; and the strided copy kernel that transpose, slice and
// broadcast_to share (each describes its input as extents + strides over a contiguous output).
#pragma once
#include <cstring>
#include "../backend/cpu/simd.hpp"  // first: it includes the intrinsics with GCC 12's AVX-512 warnings handled
#if defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

#include "../backend/cpu/elementwise.hpp"
#include "reshape.hpp"

namespace stagecraft {
namespace backend::cpu {

/// The output extents with, per axis, the input stride (in elements) to read it with; size-1
/// axes dropped and adjacent axes merged where the input is contiguous across them (so a
/// [N, C, H, W] → [N, H, W, C] transpose walks as [N, H*W, C], and a row slice as one row).
inline StridedPlan<1> coalesce_copy(const Shape& ext, const Shape& in_strides) {
  StridedPlan<1> p;
  for (int i = 0; i < ext.rank(); ++i) {
    if (ext[i] == 1) continue;
    const int r = p.shape.rank();
    if (r > 0 && p.strides[0][r - 1] == in_strides[i] * ext[i]) {
      p.shape[r - 1] *= ext[i];
      p.strides[0][r - 1] = in_strides[i];
    } else {
      p.shape.push_back(ext[i]);
      p.strides[0].push_back(in_strides[i]);
    }
  }
  if (p.shape.rank() == 0) {  // a single element
    p.shape.push_back(1);
    p.strides[0].push_back(0);
  }
  return p;
}

/// A multi-index over some axes that tracks its input and output offsets as it advances.
struct Odometer {
  int n = 0;
  std::int64_t ext[max_rank] = {}, s_in[max_rank] = {}, s_out[max_rank] = {}, idx[max_rank] = {};
  std::int64_t in = 0, out = 0;
  void seek(std::int64_t flat) {
    in = out = 0;
    for (int d = n - 1; d >= 0; --d) {
      idx[d] = flat % ext[d];
      flat /= ext[d];
      in += idx[d] * s_in[d];
      out += idx[d] * s_out[d];
    }
  }
  void next() {
    for (int d = n - 1; d >= 0; --d) {
      ++idx[d];
      in += s_in[d];
      out += s_out[d];
      if (idx[d] < ext[d]) return;
      in -= idx[d] * s_in[d];
      out -= idx[d] * s_out[d];
      idx[d] = 0;
    }
  }
};

/// Side of the square tiles of the blocked transpose: 32 rows of input and output stay in L1.
inline constexpr std::int64_t transpose_tile = 32;

/// y[b*ob + a] = x[b + a*sa] for b < nb, a < na, one element at a time.
template <class U>
void copy_block_scalar(const U* __restrict x, U* __restrict y, std::int64_t nb, std::int64_t na,
                       std::int64_t sa, std::int64_t ob) {
  for (std::int64_t b = 0; b < nb; ++b)
    for (std::int64_t a = 0; a < na; ++a) y[b * ob + a] = x[b + a * sa];
}

#if defined(__AVX__)
// Register transposes of one 256-bit block: 8x8 4-byte or 4x4 8-byte elements (3-6x faster
// than element copies, measured on 512..4096 square f32). Raw intrinsics because xsimd 8 has
// no portable cross-lane shuffle; the moves are bitwise, so they serve every dtype of the size.
inline void transpose_8x8_b32(const void* xv, void* yv, std::int64_t sa, std::int64_t ob) {
  const float* x = static_cast<const float*>(xv);
  float* y = static_cast<float*>(yv);
  __m256 r[8], t[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(x + k * sa);
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
    t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    r[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44);
    r[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xEE);
    r[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44);
    r[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {
    _mm256_storeu_ps(y + k * ob, _mm256_permute2f128_ps(r[k], r[k + 4], 0x20));
    _mm256_storeu_ps(y + (k + 4) * ob, _mm256_permute2f128_ps(r[k], r[k + 4], 0x31));
  }
}
inline void transpose_4x4_b64(const void* xv, void* yv, std::int64_t sa, std::int64_t ob) {
  const double* x = static_cast<const double*>(xv);
  double* y = static_cast<double*>(yv);
  const __m256d r0 = _mm256_loadu_pd(x), r1 = _mm256_loadu_pd(x + sa), r2 = _mm256_loadu_pd(x + 2 * sa),
                r3 = _mm256_loadu_pd(x + 3 * sa);
  const __m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1),
                t2 = _mm256_unpacklo_pd(r2, r3), t3 = _mm256_unpackhi_pd(r2, r3);
  _mm256_storeu_pd(y, _mm256_permute2f128_pd(t0, t2, 0x20));
  _mm256_storeu_pd(y + ob, _mm256_permute2f128_pd(t1, t3, 0x20));
  _mm256_storeu_pd(y + 2 * ob, _mm256_permute2f128_pd(t0, t2, 0x31));
  _mm256_storeu_pd(y + 3 * ob, _mm256_permute2f128_pd(t1, t3, 0x31));
}
#elif defined(__SSE2__)
// The same with 128-bit registers (every x86-64 build without -mavx): 4x4 and 2x2 blocks.
inline void transpose_4x4_b32(const void* xv, void* yv, std::int64_t sa, std::int64_t ob) {
  const float* x = static_cast<const float*>(xv);
  float* y = static_cast<float*>(yv);
  __m128 r0 = _mm_loadu_ps(x), r1 = _mm_loadu_ps(x + sa), r2 = _mm_loadu_ps(x + 2 * sa), r3 = _mm_loadu_ps(x + 3 * sa);
  _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
  _mm_storeu_ps(y, r0);
  _mm_storeu_ps(y + ob, r1);
  _mm_storeu_ps(y + 2 * ob, r2);
  _mm_storeu_ps(y + 3 * ob, r3);
}
inline void transpose_2x2_b64(const void* xv, void* yv, std::int64_t sa, std::int64_t ob) {
  const double* x = static_cast<const double*>(xv);
  double* y = static_cast<double*>(yv);
  const __m128d r0 = _mm_loadu_pd(x), r1 = _mm_loadu_pd(x + sa);
  _mm_storeu_pd(y, _mm_unpacklo_pd(r0, r1));
  _mm_storeu_pd(y + ob, _mm_unpackhi_pd(r0, r1));
}
#endif

/// One tile: y[b*ob + a] = x[b + a*sa]; register-transposed blocks where the build has AVX or
/// SSE2, element copies for the ragged edges.
template <class U>
void copy_tile(const U* x, U* y, std::int64_t nb, std::int64_t na, std::int64_t sa, std::int64_t ob) {
#if defined(__AVX__) || defined(__SSE2__)
  if constexpr (sizeof(U) == 4 || sizeof(U) == 8) {
#if defined(__AVX__)
    constexpr std::int64_t W = 32 / sizeof(U);
#else
    constexpr std::int64_t W = 16 / sizeof(U);
#endif
    const std::int64_t nbf = nb - nb % W, naf = na - na % W;
    for (std::int64_t a = 0; a < naf; a += W)
      for (std::int64_t b = 0; b < nbf; b += W) {
#if defined(__AVX__)
        if constexpr (sizeof(U) == 4) transpose_8x8_b32(x + b + a * sa, y + b * ob + a, sa, ob);
        else transpose_4x4_b64(x + b + a * sa, y + b * ob + a, sa, ob);
#else
        if constexpr (sizeof(U) == 4) transpose_4x4_b32(x + b + a * sa, y + b * ob + a, sa, ob);
        else transpose_2x2_b64(x + b + a * sa, y + b * ob + a, sa, ob);
#endif
      }
    copy_block_scalar(x + nbf, y + nbf * ob, nb - nbf, na, sa, ob);     // the last rows of y
    copy_block_scalar(x + naf * sa, y + naf, nbf, na - naf, sa, ob);   // the last columns
    return;
  }
#endif
  copy_block_scalar(x, y, nb, na, sa, ob);
}

/// Blocked copy for a plan whose innermost output axis is strided in the input while axis j is
/// the input's contiguous one: every (outer index, tile of j, tile of the last axis) is a unit
/// of work, so threads split large tensors evenly.
template <class U>
void tiled_copy(const U* x, U* y, const StridedPlan<1>& p, int j) {
  const int r = p.shape.rank();
  const std::int64_t A = p.shape[r - 1], sa = p.strides[0][r - 1], B = p.shape[j];
  const Shape os = contiguous_strides(p.shape);
  const std::int64_t ob = os[j];
  Odometer outer;
  for (int k = 0; k < r - 1; ++k) {
    if (k == j) continue;
    outer.ext[outer.n] = p.shape[k];
    outer.s_in[outer.n] = p.strides[0][k];
    outer.s_out[outer.n] = os[k];
    ++outer.n;
  }
  constexpr std::int64_t T = transpose_tile;
  const std::int64_t ta_n = (A + T - 1) / T, tb_n = (B + T - 1) / T;
  const std::int64_t units = (p.shape.numel() / (A * B)) * ta_n * tb_n;
  parallel_rows(units, T * T, grain_cheap, [&](std::int64_t ub, std::int64_t ue) {
    Odometer o = outer;
    o.seek(ub / (ta_n * tb_n));
    std::int64_t tb = (ub / ta_n) % tb_n, ta = ub % ta_n;
    for (std::int64_t u = ub; u < ue; ++u) {
      const std::int64_t b0 = tb * T, a0 = ta * T;
      const std::int64_t nb = std::min(T, B - b0), na = std::min(T, A - a0);
      const U* xs = x + o.in + b0 + a0 * sa;
      U* ys = y + o.out + b0 * ob + a0;
      copy_tile<U>(xs, ys, nb, na, sa, ob);
      if (++ta == ta_n) {
        ta = 0;
        if (++tb == tb_n) {
          tb = 0;
          o.next();
        }
      }
    }
  });
}

/// y (contiguous, extents `ext`) = x read with `in_strides` (elements; 0 repeats, i.e.
/// broadcasts). Rows that are contiguous (or repeated) in x are copied (or filled) a piece per
/// thread (parallel_row_pieces: a scalar broadcast to any size is one row); a permutation that moves x's contiguous axis goes through the blocked tile loop.
inline void strided_copy(const void* x, void* y, const Shape& ext, const Shape& in_strides, DType dtype) {
  if (ext.numel() == 0) return;
  const StridedPlan<1> p = coalesce_copy(ext, in_strides);
  const int r = p.shape.rank();
  const std::int64_t s = p.strides[0][r - 1];
  int j = -1;
  for (int k = 0; k < r - 1 && s != 0 && s != 1; ++k)
    if (p.strides[0][k] == 1) j = k;
  ops::layout::visit_bytes(itemsize(dtype), [&](auto tag) {
    using U = typename decltype(tag)::type;
    const U* px = static_cast<const U*>(x);
    U* py = static_cast<U*>(y);
    if (j >= 0) return tiled_copy<U>(px, py, p, j);
    parallel_row_pieces<1>(p, grain_cheap, [&](const std::int64_t* off, std::int64_t o, std::int64_t lo, std::int64_t hi) {
      const U* xr = px + off[0];
      U* yr = py + o;
      if (s == 1) std::memcpy(yr + lo, xr + lo, static_cast<std::size_t>(hi - lo) * sizeof(U));
      else if (s == 0) std::fill(yr + lo, yr + hi, xr[0]);
      else for (std::int64_t i = lo; i < hi; ++i) yr[i] = xr[i * s];
    });
  });
}

}  // namespace backend::cpu

namespace ops {

/// A copy with the axes permuted: output axis k is input axis perm[k]. Reads attrs.ints (the
/// permutation; entries may be negative; empty means reverse the axes).
struct Transpose {
  SC_OP_HEAD(Transpose, "transpose")
  static constexpr int arity = 1;

  /// The permutation with an empty one expanded to the reversal and negatives normalised.
  static Shape resolve(const Shape& xs, const Shape& perm) {
    Shape p;
    const int r = xs.rank();
    for (int k = 0; k < r; ++k) p.push_back(perm.empty() ? r - 1 - k : (perm[k] < 0 ? perm[k] + r : perm[k]));
    return p;
  }
  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    const Shape& xs = in[0].shape();
    const int r = xs.rank();
    if (!a.ints.empty()) {
      if (SC_UNLIKELY(a.ints.rank() != r))
        detail::fail<ShapeError>(name, loc, "perm ", a.ints, " has ", a.ints.rank(),
                                 " entries, but the input has shape ", xs, " (rank ", r, ")");
      bool seen[max_rank] = {};
      for (std::int64_t v : a.ints) {
        if (SC_UNLIKELY(v < -r || v >= r))
          detail::fail<ShapeError>(name, loc, "perm ", a.ints, " is not a permutation of the axes of shape ",
                                   xs, ": entry ", v, " is out of range");
        const std::int64_t k = v < 0 ? v + r : v;
        if (SC_UNLIKELY(seen[k]))
          detail::fail<ShapeError>(name, loc, "perm ", a.ints, " is not a permutation of the axes of shape ",
                                   xs, ": axis ", k, " appears twice");
        seen[k] = true;
      }
    }
    const Shape p = resolve(xs, a.ints);
    Shape out;
    for (int k = 0; k < r; ++k) out.push_back(xs[static_cast<int>(p[k])]);
    return {out, in[0].dtype()};
  }
  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    const Shape& xs = in[0].shape();
    const Shape p = resolve(xs, a.ints);
    const Shape cs = contiguous_strides(xs);
    Shape st;
    for (int k = 0; k < xs.rank(); ++k) st.push_back(cs[static_cast<int>(p[k])]);
    backend::cpu::strided_copy(in[0].raw_data(), out.raw_data(), out.shape(), st, out.dtype());
  }
  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    const Shape p = resolve(in[0].shape(), a.ints);
    const Shape cs = contiguous_strides(in[0].shape());
    Shape st;
    for (int k = 0; k < p.rank(); ++k) st.push_back(cs[static_cast<int>(p[k])]);
    backend::cuda::strided_copy(in[0].raw_data(), out.shape(), st, out.raw_data(), contiguous_strides(out.shape()),
                                out.dtype(), out.device(), name, loc);
  }
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};

}  // namespace ops

/// A copy of x with its axes permuted: result axis k is x's axis perm[k] (negative entries
/// count from the end). The default, {}, reverses the axes (a matrix transpose for 2-D).
inline Tensor transpose(const Tensor& x, std::vector<std::int64_t> perm = {},
                        std::source_location loc = std::source_location::current()) {
  detail::require_defined(x, "transpose", loc);
  ops::Attrs a;
  a.ints = ops::layout::to_shape_arg(perm, "transpose", "perm", x, loc);
  return detail::dispatch<ops::Transpose>({&x, 1}, a, loc);
}

// ---- gradient rule (after sc::transpose, which it uses) -----------------------------------
// Output axis k is input axis p[k], so the gradient goes back by the inverse permutation.
inline std::vector<Tensor> ops::Transpose::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs& a) {
  const Shape p = resolve(in[0].shape(), a.ints);
  std::vector<std::int64_t> inv(static_cast<std::size_t>(p.rank()));
  for (int k = 0; k < p.rank(); ++k) inv[static_cast<std::size_t>(p[k])] = k;
  return {transpose(g, inv)};
}

}  // namespace stagecraft
