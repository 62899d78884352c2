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

#include <type_traits>

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
}  // namespace stagecraft::rules::math
