// xsimd (the SIMD batches of the CPU kernels) and the x86 intrinsics: the library's headers include
// these through here, never directly, so that the workaround below sees GCC's intrinsics first.
//
// GCC 12 warns (-Wmaybe-uninitialized, -Wuninitialized) inside its own AVX-512 intrinsics, whose
// _mm512_undefined_*() is `__m512 __Y = __Y;` (GCC PR 105593, fixed in GCC 13). With AVX-512 on
// (-march=x86-64-v4, or native on such a machine) every inlined xsimd conversion, exp, log, shift
// or reduction then warns at -O2 and -O3. It is a false positive in a system header that no code
// of ours can initialise, so those two warnings are off for the text of GCC's intrinsic headers
// only: code that inlines them, ours and the user's, is still checked. (A file that includes
// <immintrin.h> itself before stagecraft gets GCC 12's warnings back.)
#pragma once
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12 && (defined(__x86_64__) || defined(__i386__))
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include <xsimd/xsimd.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "../../config.hpp"  // SC_ALWAYS_INLINE
#include "../../ops/rules.hpp"

namespace stagecraft::rules::math {
/// rules.inc's fnma_fused on this target's batches: x - q y in one rounding, by the instruction
/// itself (xsimd 8's fnma is a multiply and a subtraction on AVX-512, which the compiler fuses only
/// where it contracts: not under -std=c++20 or -ffp-contract=off). Exactness is the point: the
/// batch fmod's step is exact only so.
template <class V>
SC_HOST_DEVICE V fnma_fused(const V& q, const V& y, const V& x) {
  using T = typename V::value_type;
  static_assert(std::is_floating_point_v<T> && has_fnma_fused, "stagecraft: no fused multiply-add on this target");
  constexpr std::size_t bytes = sizeof(typename V::register_type);
  constexpr bool f32 = std::is_same_v<T, float>;
#if defined(__aarch64__)
  static_assert(bytes == 16, "stagecraft: a NEON batch is 16 bytes");
  if constexpr (f32) return vfmsq_f32(x, q, y);
  else return vfmsq_f64(x, q, y);
#elif defined(__FMA__) && (defined(__x86_64__) || defined(__i386__))
#if defined(__AVX512F__)
  if constexpr (bytes == 64) {
    if constexpr (f32) return _mm512_fnmadd_ps(q, y, x);
    else return _mm512_fnmadd_pd(q, y, x);
  } else
#endif
  if constexpr (bytes == 32) {
    if constexpr (f32) return _mm256_fnmadd_ps(q, y, x);
    else return _mm256_fnmadd_pd(q, y, x);
  } else {
    static_assert(bytes == 16, "stagecraft: an x86 batch is 16, 32 or 64 bytes");
    if constexpr (f32) return _mm_fnmadd_ps(q, y, x);
    else return _mm_fnmadd_pd(q, y, x);
  }
#else
  return x;  // (unreachable: the static_assert above)
#endif
}

/// rules_pow.inc's split_exponent and exp2_whole on batches of doubles: its scalar forms' steps.
template <class D>
  requires requires { typename D::value_type; }
D split_exponent(const D& x, D& e) {
  using U = xsimd::batch<std::uint64_t, typename D::arch_type>;
  const U bits = xsimd::bitwise_cast<U>(x), mantissa = bits & U(0x000fffffffffffffull);
  const U high = xsimd::select(mantissa > U(0x6a09e667f3bcdull), U(1), U(0));
  e = xsimd::bitwise_cast<D>(((bits >> 52) + high) | U(0x4330000000000000ull)) - D(0x1.0p52 + 1023.0);
  return xsimd::bitwise_cast<D>(mantissa | ((U(0x3ffull) - high) << 52));
}
template <class D>
  requires requires { typename D::value_type; }
D exp2_whole(const D& n) {
  using U = xsimd::batch<std::uint64_t, typename D::arch_type>;
  return xsimd::bitwise_cast<D>(xsimd::bitwise_cast<U>(n + D(0x1.0p52 + 1023.0)) << 52);
}
/// A batch of floats as two batches of doubles (its low and high halves), by the conversion
/// instructions where there are some (xsimd 8.1 converts through memory, element by element).
template <class V, class D = xsimd::batch<double, typename V::arch_type>>
  requires requires { typename V::value_type; }
SC_HOST_DEVICE void widen_floats(const V& x, D& lo, D& hi) {
  static_assert(2 * D::size == V::size, "stagecraft: a batch of doubles holds half a batch of floats");
  constexpr std::size_t bytes = sizeof(typename V::register_type);
#if defined(__AVX512F__)
  if constexpr (bytes == 64) {
    const __m512 v = x;
    lo = D(_mm512_cvtps_pd(_mm512_castps512_ps256(v)));
    hi = D(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
    return;
  }
#endif
#if defined(__AVX__)
  if constexpr (bytes == 32) {
    const __m256 v = x;
    lo = D(_mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    hi = D(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    return;
  }
#endif
#if defined(__SSE2__)
  if constexpr (bytes == 16) {
    const __m128 v = x;
    lo = D(_mm_cvtps_pd(v));
    hi = D(_mm_cvtps_pd(_mm_movehl_ps(v, v)));
    return;
  }
#endif
  alignas(V::arch_type::alignment()) float in[V::size];
  x.store_aligned(in);
  lo = D::load_unaligned(in);
  hi = D::load_unaligned(in + D::size);
}
/// Two batches of doubles rounded to one of floats (lo's lanes first): widen_floats undone.
template <class V, class D>
  requires requires { typename V::value_type; }
SC_HOST_DEVICE V narrow_to_floats(const D& lo, const D& hi) {
  constexpr std::size_t bytes = sizeof(typename V::register_type);
#if defined(__AVX512F__)
  if constexpr (bytes == 64)
    return V(_mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm512_cvtpd_ps(lo))),
                                                 _mm256_castps_pd(_mm512_cvtpd_ps(hi)), 1)));
#endif
#if defined(__AVX__)
  if constexpr (bytes == 32)
    return V(_mm256_insertf128_ps(_mm256_castps128_ps256(_mm256_cvtpd_ps(lo)), _mm256_cvtpd_ps(hi), 1));
#endif
#if defined(__SSE2__)
  if constexpr (bytes == 16) return V(_mm_movelh_ps(_mm_cvtpd_ps(lo), _mm_cvtpd_ps(hi)));
#endif
  alignas(V::arch_type::alignment()) float out[V::size];
  lo.store_unaligned(out);
  hi.store_unaligned(out + D::size);
  return V::load_aligned(out);
}
/// rules_pow.inc's pow_float_batch: |x| and y widened to batches of doubles, pow_in_double on each,
/// rounded back to floats, and the sign of a negative x to an odd power.
template <class V>
  requires requires { typename V::value_type; }
SC_HOST_DEVICE V pow_float_batch(const V& x, const V& y) {
  static_assert(std::is_same_v<typename V::value_type, float>, "stagecraft: pow_float_batch takes floats");
  using D = xsimd::batch<double, typename V::arch_type>;
  D x0, x1, y0, y1;
  widen_floats(xsimd::abs(x), x0, x1);
  widen_floats(y, y0, y1);
  const V r = narrow_to_floats<V>(pow_in_double(x0, y0), pow_in_double(x1, y1)), half = y * V(0.5f);
  return xsimd::select((x < V(0.f)) & (xsimd::trunc(half) != half), r | V(-0.f), r);  // (r >= +0)
}
/// rules_pow.inc's cube_float_batch: x widened to batches of doubles, x * x * x there, rounded back.
template <class V>
  requires requires { typename V::value_type; }
SC_HOST_DEVICE V cube_float_batch(const V& x) {
  static_assert(std::is_same_v<typename V::value_type, float>, "stagecraft: cube_float_batch takes floats");
  using D = xsimd::batch<double, typename V::arch_type>;
  D lo, hi;
  widen_floats(x, lo, hi);
  return narrow_to_floats<V>(D(lo * lo * lo), D(hi * hi * hi));
}
/// rules.inc's floor_division_batch: the ints widened to two batches of doubles (the conversion
/// instructions themselves: xsimd 8.1 widens through memory, in pieces the next load cannot take
/// from the store buffer), floor(a / b) there (exact: divides_in_double), a - b floor(a / b) for
/// Mod (exact too: below |a| + |b| < 2^32), truncated back.
template <bool Mod, class V>
  requires requires { typename V::value_type; }
SC_HOST_DEVICE V floor_division_batch(const V& a, const V& b) {
  static_assert(divides_in_double<typename V::value_type>, "stagecraft: floor_division_batch takes 32-bit ints");
  using D = xsimd::batch<double, typename V::arch_type>;
  const auto divide = [](const D& u, const D& v) {
    const D q = xsimd::floor(u / v), zero(0.0);
    if constexpr (Mod) return xsimd::select(v == zero, zero, D(u - q * v));
    else return xsimd::select(v == zero, zero, xsimd::select(q == D(0x1p31), D(-0x1p31), q));  // min / -1 wraps
  };
  constexpr std::size_t bytes = sizeof(typename V::register_type);
#if (defined(__SSE4_1__) || defined(__AVX__)) && (defined(__x86_64__) || defined(__i386__))
#if defined(__AVX512F__)
  if constexpr (bytes == 64) {
    const __m512i x = a, y = b;
    const __m256i lo = _mm512_cvttpd_epi32(divide(D(_mm512_cvtepi32_pd(_mm512_castsi512_si256(x))),
                                                  D(_mm512_cvtepi32_pd(_mm512_castsi512_si256(y)))));
    const __m256i hi = _mm512_cvttpd_epi32(divide(D(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(x, 1))),
                                                  D(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(y, 1)))));
    return V(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
  } else
#endif
#if defined(__AVX__)
  if constexpr (bytes == 32) {
    const __m256i x = a, y = b;
    const __m128i lo = _mm256_cvttpd_epi32(
        divide(D(_mm256_cvtepi32_pd(_mm256_castsi256_si128(x))), D(_mm256_cvtepi32_pd(_mm256_castsi256_si128(y)))));
    const __m128i hi = _mm256_cvttpd_epi32(divide(D(_mm256_cvtepi32_pd(_mm256_extractf128_si256(x, 1))),
                                                  D(_mm256_cvtepi32_pd(_mm256_extractf128_si256(y, 1)))));
    return V(_mm256_insertf128_si256(_mm256_castsi128_si256(lo), hi, 1));
  } else
#endif
  {
    static_assert(bytes == 16, "stagecraft: an x86 batch is 16, 32 or 64 bytes");
    const __m128i x = a, y = b;
    const __m128i lo = _mm_cvttpd_epi32(divide(D(_mm_cvtepi32_pd(x)), D(_mm_cvtepi32_pd(y))));
    const __m128i hi = _mm_cvttpd_epi32(
        divide(D(_mm_cvtepi32_pd(_mm_shuffle_epi32(x, 0xee))), D(_mm_cvtepi32_pd(_mm_shuffle_epi32(y, 0xee)))));
    return V(_mm_unpacklo_epi64(lo, hi));
  }
#else
  (void)divide;
  return a;  // (unreachable: divides_in_double is false here)
#endif
}
}  // namespace stagecraft::rules::math

namespace stagecraft::backend::cpu {
/// The bytes of the integer vector registers the target compiles for (x86: 64-bit lanes need AVX2
/// for 32-byte registers).
#if defined(__AVX512F__)
inline constexpr int integer_vector_bytes = 64;
#elif defined(__AVX2__)
inline constexpr int integer_vector_bytes = 32;
#else
inline constexpr int integer_vector_bytes = 16;
#endif
/// Whether indices_within over I has 4 lanes or more a vector: with fewer (i64 on SSE2 or NEON), a
/// scalar check beside a loop's own loads and stores costs less than the pass (session 83).
template <class I>
inline constexpr bool index_check_vectorizes = integer_vector_bytes / static_cast<int>(sizeof(I)) >= 4;

/// indices_within's hi for an axis of e entries: e - 1, at most I's largest value (e == 0: all ones,
/// so every index fails).
template <class I>
SC_ALWAYS_INLINE std::make_unsigned_t<I> index_top_hi(std::int64_t e) {
  constexpr auto imax = static_cast<std::int64_t>(std::numeric_limits<I>::max());
  return static_cast<std::make_unsigned_t<I>>(e - 1 < imax ? e - 1 : imax);
}
/// Whether every index given[0, n) is in [0, e): none negative (counted from the end, for the
/// caller's slower path) and none past the end. As unsigned of the index's width, g is in [0, e)
/// iff neither g nor hi - g has its top bit set, hi = e - 1 (at most the type's largest value: an
/// i32 index into a longer axis is within iff not negative). Subtractions and ors only, one vector
/// pass on every target, i32 lanes twice as many as i64's (baseline x86-64 has no 64-bit compare: a
/// comparison there measured 1.25x this, the same on AVX-512 as its unsigned maximum).
template <class I>
SC_ALWAYS_INLINE bool indices_within(const I* __restrict given, std::int64_t n, std::int64_t e) {
  using U = std::make_unsigned_t<I>;
  constexpr int top = std::numeric_limits<U>::digits - 1;
  const U hi = index_top_hi<I>(e);
  U acc = 0;
  for (std::int64_t t = 0; t < n; ++t) {
    const auto g = static_cast<U>(given[t]);
    acc = static_cast<U>(acc | g | static_cast<U>(hi - g));
  }
  return acc >> top == 0;
}

/// y[t] = x[at[t]] for t < n, every index in range (indices_within said so). AVX-512's gathers
/// take 8 or 16 elements of 4 or 8 bytes an instruction; elsewhere a scalar loop (AVX2's gathers
/// measured no faster than it on an Intel core, and are microcoded on AMD's before Zen 4).
template <class U, class I>
SC_ALWAYS_INLINE void gather_within(const U* __restrict x, const I* __restrict at, U* __restrict y, std::int64_t n) {
  std::int64_t t = 0;
#if defined(__AVX512F__)
  static_assert(sizeof(I) == 4 || sizeof(I) == 8, "stagecraft: indices are i32 or i64");
  if constexpr (sizeof(U) == 4 && sizeof(I) == 8) {
    for (; t + 8 <= n; t += 8)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + t), _mm512_i64gather_epi32(_mm512_loadu_si512(at + t), x, 4));
  } else if constexpr (sizeof(U) == 4) {
    for (; t + 16 <= n; t += 16) _mm512_storeu_si512(y + t, _mm512_i32gather_epi32(_mm512_loadu_si512(at + t), x, 4));
  } else if constexpr (sizeof(U) == 8 && sizeof(I) == 8) {
    for (; t + 8 <= n; t += 8) _mm512_storeu_si512(y + t, _mm512_i64gather_epi64(_mm512_loadu_si512(at + t), x, 8));
  } else if constexpr (sizeof(U) == 8) {
    for (; t + 8 <= n; t += 8)
      _mm512_storeu_si512(
          y + t, _mm512_i32gather_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + t)), x, 8));
  }
#endif
  for (; t < n; ++t) y[t] = x[at[t]];
}
}  // namespace stagecraft::backend::cpu
