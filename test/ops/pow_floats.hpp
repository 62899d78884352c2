// pow on floats (rules::Pow, rules.inc's pow_in_double) against the C library, for test_rules.cpp
// (the baseline build) and test_rules_fma.cpp (x86-64-v3, where the compiler fuses multiply-adds):
// random operands of four kinds, every one checked on scalars and in SIMD batches.
#pragma once
#include <stagecraft/backend/cpu/simd.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "../bit_patterns.hpp"

namespace sc_test {

/// What check_pow_floats counted.
struct PowFloatCounts {
  std::size_t pairs = 0;
  std::size_t not_rounded = 0;      ///< differ from float(pow(double a, double b)), the correctly rounded x^y
  std::size_t beyond_one_ulp = 0;   ///< differ from it (or from powf) by more than one ulp or in kind
  std::size_t batch_differ = 0;     ///< a batch lane differs from the scalar rule's bits
};

inline bool same_float(float x, float y) { return std::memcmp(&x, &y, 4) == 0 || (std::isnan(x) && std::isnan(y)); }
/// Within one ulp: the same, or neighbours of one sign (0 and the least subnormal included).
inline bool within_one_ulp(float x, float y) {
  if (same_float(x, y)) return true;
  if (std::isnan(x) || std::isnan(y) || std::signbit(x) != std::signbit(y)) return false;
  std::int32_t i, j;
  std::memcpy(&i, &x, 4);
  std::memcpy(&j, &y, 4);
  return i - j == 1 || j - i == 1;
}

/// pow(a, b) of n float pairs in runs of four kinds: any bit patterns; a in (0, 4) to powers in
/// [-30, 30); a in [-50, 50) to whole powers in [-40, 40]; a within 2^-11 of 1 to powers up to
/// 10^5 (results far from 1 from a log near 0). Now and then a special (+-0, +-inf, NaN, a
/// subnormal, the largest float) in either operand.
inline PowFloatCounts check_pow_floats(std::size_t n) {
  namespace r = stagecraft::rules;
  using B = xsimd::batch<float>;
  constexpr std::size_t W = B::size;
  SplitMix64 next{2024};
  const auto unit = [&] { return next.unit<float>(); };
  const float special[] = {0.f, -0.f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min(),
                           -std::numeric_limits<float>::min(), std::numeric_limits<float>::max()};
  std::vector<float> a(n), b(n);
  for (std::size_t i = 0; i < n; ++i) {
    switch (i / 4096 % 4) {
      case 0: a[i] = next.bits<float>(), b[i] = next.bits<float>(); break;
      case 1: a[i] = 4.f * unit(), b[i] = 60.f * unit() - 30.f; break;
      case 2: a[i] = 100.f * unit() - 50.f, b[i] = std::round(80.f * unit() - 40.f); break;
      default: a[i] = 1.f + (unit() - 0.5f) * 0x1p-10f, b[i] = (unit() - 0.5f) * 2e5f; break;
    }
    if (next() % 89 == 0) (next() % 2 ? a[i] : b[i]) = special[next() % 8];
  }
  PowFloatCounts c;
  alignas(64) float lanes[W];
  for (std::size_t i = 0; i + W <= n; i += W) {
    r::Pow::f(B::load_unaligned(a.data() + i), B::load_unaligned(b.data() + i)).store_aligned(lanes);
    for (std::size_t k = 0; k < W; ++k) {
      const float x = a[i + k], y = b[i + k], got = r::Pow::f(x, y);
      const float want = static_cast<float>(std::pow(static_cast<double>(x), static_cast<double>(y)));
      ++c.pairs;
      c.not_rounded += !same_float(got, want);
      c.beyond_one_ulp += !within_one_ulp(got, want) || !within_one_ulp(got, std::pow(x, y));
      c.batch_differ += !same_float(lanes[k], got);
    }
  }
  return c;
}

}  // namespace sc_test
