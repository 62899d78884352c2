// Philox4x32-10 and the transforms from its words to samples: one copy for the CPU op and the CUDA kernel.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "host_device.hpp"

namespace stagecraft::detail {

/// Philox4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
SC_HOST_DEVICE inline std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> ctr,
                                                              std::array<std::uint32_t, 2> key) {
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

/// Four uniform 32-bit words: block `block` of the stream with key `seed`.
SC_HOST_DEVICE inline std::array<std::uint32_t, 4> random_block(std::uint64_t seed, std::uint64_t block) {
  return philox4x32({static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32), 0u, 0u},
                    {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
}
/// A float in (0, 1) from a 32-bit word (never 0, so log() is safe).
SC_HOST_DEVICE inline double unit_open(std::uint32_t w) { return (static_cast<double>(w) + 0.5) * (1.0 / 4294967296.0); }

/// a * b + c with the product rounded before the add, whatever the compiler's contraction
/// setting: a fused multiply-add (nvcc's default, GCC's with FMA hardware) rounds once, so the
/// CPU and the GPU would give different last bits.
SC_HOST_DEVICE inline double mul_then_add(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(__dmul_rn(a, b), c);
#else
  double p = a * b;
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  __asm__("" : "+x"(p));  // the compiler cannot see through it, so cannot fuse it into the add
#endif
  return p + c;
#endif
}

/// Four normal samples of F (Box–Muller, in double) from one block's words.
template <class F>
SC_HOST_DEVICE void normal4(const std::array<std::uint32_t, 4>& w, double mean, double stddev, F* v) {
  for (int k = 0; k < 4; k += 2) {
    const double r = std::sqrt(-2.0 * std::log(unit_open(w[k])));
    const double th = 2.0 * std::numbers::pi * unit_open(w[k + 1]);
    v[k] = static_cast<F>(mul_then_add(stddev * r, std::cos(th), mean));
    v[k + 1] = static_cast<F>(mul_then_add(stddev * r, std::sin(th), mean));
  }
}

/// Four uniform samples of F in [lo, hi) (lo when lo == hi) from one block's words.
template <class F>
SC_HOST_DEVICE void uniform4(const std::array<std::uint32_t, 4>& w, double lo, double hi, F* v) {
  // The clamp is in the result's type: an f32 value just below hi in double can round up to it.
  const F top = static_cast<F>(hi), bottom = static_cast<F>(lo);
  for (int k = 0; k < 4; ++k) {
    v[k] = static_cast<F>(mul_then_add(hi - lo, static_cast<double>(w[k]) * (1.0 / 4294967296.0), lo));
    if (v[k] >= top && bottom < top) v[k] = std::nextafter(top, bottom);
  }
}

}  // namespace stagecraft::detail
