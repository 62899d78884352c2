// Seeded counter-based random numbers (Philox4x32-10): element i depends only on (seed, i),
// so results are the same whatever the thread count or the order of generation.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "creation.hpp"
#include "../backend/cpu/parallel.hpp"

namespace stagecraft {
namespace detail {

/// Philox4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
inline std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> ctr, std::array<std::uint32_t, 2> key) {
  constexpr std::uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    const std::uint64_t p0 = std::uint64_t{M0} * ctr[0], p1 = std::uint64_t{M1} * ctr[2];
    ctr = {static_cast<std::uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<std::uint32_t>(p1),
           static_cast<std::uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<std::uint32_t>(p0)};
    key[0] += W0;
    key[1] += W1;
  }
  return ctr;
}

/// Four uniform 32-bit words for block `block` of stream `seed`.
inline std::array<std::uint32_t, 4> random_block(std::uint64_t seed, std::uint64_t block) {
  return philox4x32({static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32), 0u, 0u},
                    {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
}
/// A float in (0, 1) from a 32-bit word (never 0, so log() is safe).
inline double unit_open(std::uint32_t w) { return (static_cast<double>(w) + 0.5) * (1.0 / 4294967296.0); }

/// Fills n values: gen(words, out4) turns one Philox block into 4 outputs.
template <class T, class Gen>
Tensor random_fill(const Shape& shape, DType d, std::uint64_t seed, Gen&& gen) {
  return visit_floating(d, [&](auto tag) {
    using F = typename decltype(tag)::type;
    return make_host<F>(shape, [&](F* p) {
      const std::int64_t n = shape.numel(), blocks = (n + 3) / 4;
      backend::cpu::parallel_for(blocks, 4096, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t blk = b; blk < e; ++blk) {
          double v[4];
          gen(random_block(seed, static_cast<std::uint64_t>(blk)), v);
          for (int k = 0; k < 4 && blk * 4 + k < n; ++k) p[blk * 4 + k] = static_cast<F>(v[k]);
        }
      });
    });
  });
}

}  // namespace detail

namespace random {

/// Normal samples (Box–Muller over Philox), mean and stddev given; f32 unless d is f64.
inline Tensor normal(Shape shape, std::uint64_t seed = 0, double mean = 0.0, double stddev = 1.0,
                     DType d = DType::f32, std::source_location loc = std::source_location::current()) {
  check_shape(shape, "random::normal", loc);
  if (!is_floating(d)) detail::fail<DTypeError>("random::normal", loc, "expects a float dtype, got ", name(d));
  return detail::random_fill<double>(shape, d, seed, [&](const std::array<std::uint32_t, 4>& w, double* v) {
    for (int k = 0; k < 4; k += 2) {
      const double r = std::sqrt(-2.0 * std::log(detail::unit_open(w[k])));
      const double th = 2.0 * std::numbers::pi * detail::unit_open(w[k + 1]);
      v[k] = mean + stddev * r * std::cos(th);
      v[k + 1] = mean + stddev * r * std::sin(th);
    }
  });
}
/// Uniform samples in [lo, hi); f32 unless d is f64.
inline Tensor uniform(Shape shape, double lo = 0.0, double hi = 1.0, std::uint64_t seed = 0, DType d = DType::f32,
                      std::source_location loc = std::source_location::current()) {
  check_shape(shape, "random::uniform", loc);
  if (!is_floating(d)) detail::fail<DTypeError>("random::uniform", loc, "expects a float dtype, got ", name(d));
  if (!(lo <= hi)) detail::fail<ValueError>("random::uniform", loc, "needs lo <= hi, got ", lo, " and ", hi);
  return detail::random_fill<double>(shape, d, seed, [&](const std::array<std::uint32_t, 4>& w, double* v) {
    for (int k = 0; k < 4; ++k) {
      // 0.5 ulp below 1 at most: clamp so float rounding never reaches hi
      const double u = static_cast<double>(w[k]) * (1.0 / 4294967296.0);
      v[k] = lo + (hi - lo) * u;
      if (v[k] >= hi && hi > lo) v[k] = std::nextafter(hi, lo);
    }
  });
}
/// A random permutation of 0..n-1 (i64), from a seeded Philox-driven Fisher–Yates shuffle.
inline Tensor permutation(std::int64_t n, std::uint64_t seed = 0) {
  return detail::make_host<std::int64_t>(Shape{n}, [&](std::int64_t* p) {
    for (std::int64_t i = 0; i < n; ++i) p[i] = i;
    for (std::int64_t i = n - 1; i > 0; --i) {
      const auto w = detail::random_block(seed, static_cast<std::uint64_t>(i));
      const std::uint64_t r = (std::uint64_t{w[0]} << 32) | w[1];
      std::swap(p[i], p[r % static_cast<std::uint64_t>(i + 1)]);
    }
  });
}

}  // namespace random
}  // namespace stagecraft
