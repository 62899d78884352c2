// Build-wide configuration: version, compiler hints and feature switches.
#pragma once

#define STAGECRAFT_VERSION_MAJOR 0
#define STAGECRAFT_VERSION_MINOR 1
#define STAGECRAFT_VERSION_PATCH 0

#if defined(__GNUC__) || defined(__clang__)
#define SC_LIKELY(x) __builtin_expect(!!(x), 1)
#define SC_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define SC_NOINLINE __attribute__((noinline))
#define SC_COLD __attribute__((cold, noinline))
#define SC_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define SC_LIKELY(x) (x)
#define SC_UNLIKELY(x) (x)
#define SC_NOINLINE
#define SC_COLD
#define SC_ALWAYS_INLINE inline
#endif

#if defined(_OPENMP)
#define SC_HAS_OPENMP 1
#else
#define SC_HAS_OPENMP 0
#endif

namespace stagecraft::config {
/// Elementwise loops with fewer elements than this run serially (no thread start-up).
inline constexpr long parallel_threshold = 1 << 15;
/// Bytes every CPU buffer is aligned to (one cache line, enough for AVX-512).
inline constexpr unsigned alignment = 64;
}  // namespace stagecraft::config
