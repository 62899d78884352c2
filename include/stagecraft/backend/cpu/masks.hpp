// Lane masks (xsimd::batch_bool) to and from bool arrays, one byte (0 or 1) per element: how the
// loops store comparisons and read where's condition without a scalar step per element.
//
// AVX-512 keeps a mask as bits in a k register: with AVX512BW+VL one instruction expands them to
// bytes (maskz_set1_epi8) or gathers bytes into them (test_epi8_mask), and partial batches are
// masked loads and stores. Other ISAs go through a bitmask (movemask) and a multiply that spreads
// 8 bits into 8 bytes; anything else takes xsimd's generic (scalar) forms.
#pragma once
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "simd.hpp"  // xsimd, with GCC 12's AVX-512 intrinsics warnings handled
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "../../config.hpp"

namespace stagecraft::backend::cpu {

/// The lane mask of batches of T.
template <class T>
using mask = xsimd::batch_bool<T>;

/// The low r bits set (0 <= r <= 64): the lanes a partial load or store touches.
constexpr std::uint64_t low_bits(std::int64_t r) { return r >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << r) - 1; }

/// True when masks of T are k-register bits (AVX-512) rather than vectors of all-ones lanes.
/// (Told by the batch width: naming the register type in a template argument trips
/// -Wignored-attributes for the vector types.)
template <class T>
inline constexpr bool bit_mask = XSIMD_WITH_AVX512F && sizeof(xsimd::batch<T>) == 64;

/// Bit k set when lane k of m is true.
template <class T>
SC_ALWAYS_INLINE std::uint64_t mask_bits(const mask<T>& m) {
  [[maybe_unused]] constexpr std::size_t bytes = sizeof(xsimd::batch<T>);
  [[maybe_unused]] constexpr bool f = std::is_same_v<T, float>, d = std::is_same_v<T, double>,
                                  i32 = std::is_integral_v<T> && sizeof(T) == 4,
                                  i64 = std::is_integral_v<T> && sizeof(T) == 8;
  if constexpr (bit_mask<T>) {
    return static_cast<std::uint64_t>(m.data);
  } else {
#if defined(__AVX__)
    if constexpr (bytes == 32 && f) return static_cast<std::uint32_t>(_mm256_movemask_ps(m.data));
    if constexpr (bytes == 32 && d) return static_cast<std::uint32_t>(_mm256_movemask_pd(m.data));
    if constexpr (bytes == 32 && i32) return static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(m.data)));
    if constexpr (bytes == 32 && i64) return static_cast<std::uint32_t>(_mm256_movemask_pd(_mm256_castsi256_pd(m.data)));
#endif
#if defined(__SSE2__)
    if constexpr (bytes == 16 && f) return static_cast<std::uint32_t>(_mm_movemask_ps(m.data));
    if constexpr (bytes == 16 && d) return static_cast<std::uint32_t>(_mm_movemask_pd(m.data));
    if constexpr (bytes == 16 && i32) return static_cast<std::uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(m.data)));
    if constexpr (bytes == 16 && i64) return static_cast<std::uint32_t>(_mm_movemask_pd(_mm_castsi128_pd(m.data)));
#endif
    alignas(bytes) T t[mask<T>::size];
    xsimd::batch<T>(m).store_aligned(t);
    std::uint64_t b = 0;
    for (std::size_t k = 0; k < mask<T>::size; ++k) b |= std::uint64_t{t[k] != T(0)} << k;
    return b;
  }
}

/// y[0, r) = bit k of `bits` as 0 or 1 (r <= 64).
SC_ALWAYS_INLINE void bits_to_bytes(std::uint64_t bits, bool* y, std::int64_t r) {
  if constexpr (std::endian::native == std::endian::little) {
    for (std::int64_t k = 0; k < r; k += 8, bits >>= 8) {
      // Byte j of the product holds the 8 bits; the AND keeps bit j of byte j, and adding 0x7f
      // carries it into the byte's top bit (never beyond), which the shift brings down to bit 0.
      std::uint64_t v = ((bits & 0xff) * 0x0101010101010101ull) & 0x8040201008040201ull;
      v = ((v + 0x7f7f7f7f7f7f7f7full) >> 7) & 0x0101010101010101ull;
      std::memcpy(y + k, &v, static_cast<std::size_t>(std::min<std::int64_t>(8, r - k)));
    }
  } else {
    for (std::int64_t k = 0; k < r; ++k) y[k] = (bits >> k) & 1;
  }
}

/// y[0, r) = the first r lanes of m as bools (0 < r <= the batch size); nothing else is written.
template <class T>
SC_ALWAYS_INLINE void store_mask(bool* y, const mask<T>& m, std::int64_t r) {
  [[maybe_unused]] constexpr std::int64_t W = mask<T>::size;
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  if constexpr (bit_mask<T>) {
    const std::uint64_t b = mask_bits(m);
    if constexpr (W <= 16) {
      const __m128i v = _mm_maskz_set1_epi8(static_cast<__mmask16>(b), 1);
      if (W == 16 && r == W) return _mm_storeu_si128(reinterpret_cast<__m128i*>(y), v);
      if (W == 8 && r == W) return _mm_storel_epi64(reinterpret_cast<__m128i*>(y), v);
      return _mm_mask_storeu_epi8(y, static_cast<__mmask16>(low_bits(r)), v);
    } else if constexpr (W <= 32) {
      const __m256i v = _mm256_maskz_set1_epi8(static_cast<__mmask32>(b), 1);
      if (r == W) return _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), v);
      return _mm256_mask_storeu_epi8(y, static_cast<__mmask32>(low_bits(r)), v);
    } else {
      const __m512i v = _mm512_maskz_set1_epi8(static_cast<__mmask64>(b), 1);
      if (r == W) return _mm512_storeu_si512(y, v);
      return _mm512_mask_storeu_epi8(y, static_cast<__mmask64>(low_bits(r)), v);
    }
  }
#endif
  bits_to_bytes(mask_bits(m), y, r);
}
/// y[0, W) = the lanes of m as bools (W the batch size).
template <class T>
SC_ALWAYS_INLINE void store_mask(bool* y, const mask<T>& m) {
  store_mask<T>(y, m, mask<T>::size);
}

/// The mask whose lane k is c[k] (a whole batch of bools is read).
template <class T>
SC_ALWAYS_INLINE mask<T> load_mask(const bool* c) {
  [[maybe_unused]] constexpr std::size_t W = mask<T>::size;
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  if constexpr (bit_mask<T>) {
    using R = typename mask<T>::register_type;
    if constexpr (W == 8) {
      const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(c));
      return mask<T>(static_cast<R>(_mm_test_epi8_mask(v, v)));
    } else if constexpr (W == 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c));
      return mask<T>(static_cast<R>(_mm_test_epi8_mask(v, v)));
    } else if constexpr (W == 32) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c));
      return mask<T>(static_cast<R>(_mm256_test_epi8_mask(v, v)));
    } else if constexpr (W == 64) {
      const __m512i v = _mm512_loadu_si512(c);
      return mask<T>(static_cast<R>(_mm512_test_epi8_mask(v, v)));
    }
  }
#endif
#if defined(__AVX2__)
  // Widen the bytes to lanes of T's width and compare with 0: all-ones lanes where true.
  if constexpr (!bit_mask<T> && sizeof(xsimd::batch<T>) == 32 && (sizeof(T) == 4 || sizeof(T) == 8)) {
    using R = typename mask<T>::register_type;
    __m256i v;
    if constexpr (sizeof(T) == 4) {
      v = _mm256_cmpgt_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c))),
                             _mm256_setzero_si256());
    } else {
      std::int32_t four;
      std::memcpy(&four, c, 4);
      v = _mm256_cmpgt_epi64(_mm256_cvtepu8_epi64(_mm_cvtsi32_si128(four)), _mm256_setzero_si256());
    }
    if constexpr (std::is_same_v<T, float>) return mask<T>(R(_mm256_castsi256_ps(v)));
    else if constexpr (std::is_same_v<T, double>) return mask<T>(R(_mm256_castsi256_pd(v)));
    else return mask<T>(R(v));
  }
#endif
  return mask<T>::load_unaligned(c);
}
/// The mask whose lanes k < r are c[k] and whose other lanes are false; only c[0, r) is read.
template <class T>
SC_ALWAYS_INLINE mask<T> load_mask(const bool* c, std::int64_t r) {
  [[maybe_unused]] constexpr std::size_t W = mask<T>::size;
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  if constexpr (bit_mask<T> && W <= 16) {
    using R = typename mask<T>::register_type;
    const __m128i v = _mm_maskz_loadu_epi8(static_cast<__mmask16>(low_bits(r)), c);
    return mask<T>(static_cast<R>(_mm_test_epi8_mask(v, v)));
  }
#endif
  alignas(64) bool t[W] = {};
  std::copy_n(c, r, t);
  return load_mask<T>(t);
}

}  // namespace stagecraft::backend::cpu
