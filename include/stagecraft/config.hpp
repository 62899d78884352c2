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
// A loop of at most 16 iterations written out in full at every optimisation level (-O2 leaves a
// loop over an array of SIMD registers rolled, and the array then lives in memory).
#if defined(__CUDACC__)
#define SC_UNROLL_FULL  // nvcc's front end warns on (and drops) GCC's pragma before its host compiler sees it
#else
#define SC_UNROLL_FULL _Pragma("GCC unroll 16")
#endif
#else
#define SC_LIKELY(x) (x)
#define SC_UNLIKELY(x) (x)
#define SC_NOINLINE
#define SC_COLD
#define SC_ALWAYS_INLINE inline
#define SC_UNROLL_FULL
#endif

// Non-template functions that stagecraft::precompiled compiles once into its archive (the graph
// layer, the safetensors JSON code). In a header-only build they are inline definitions, as the
// rest of the library. In a file built against stagecraft::precompiled (STAGECRAFT_PRECOMPILED)
// the headers only declare them: the file does not parse, instantiate what they use, or emit
// them. src/precompiled.cpp (STAGECRAFT_PRECOMPILED_SOURCE) holds the one definition of each.
//   STAGECRAFT_COMPILED_INLINE  `inline`, or nothing where the archive holds the definition
//   STAGECRAFT_DEFINE_COMPILED  1 where the definitions are compiled (guards them), else 0
#if defined(STAGECRAFT_PRECOMPILED)
#define STAGECRAFT_COMPILED_INLINE
#if defined(STAGECRAFT_PRECOMPILED_SOURCE)
#define STAGECRAFT_DEFINE_COMPILED 1
#else
#define STAGECRAFT_DEFINE_COMPILED 0
#endif
#else
#define STAGECRAFT_COMPILED_INLINE inline
#define STAGECRAFT_DEFINE_COMPILED 1
#endif

#if defined(_OPENMP)
#define SC_HAS_OPENMP 1
#else
#define SC_HAS_OPENMP 0
#endif

namespace stagecraft::config {
/// Elementwise loops with fewer elements than this run serially (no thread start-up).
inline constexpr long parallel_threshold = 1 << 15;
/// The default factor on the work each thread of a parallel loop gets (parallel_for: at least
/// max(grain / 2, 64) elements times this). On the 16-core Xeon (a virtual machine) a parallel
/// region cost so much that the Fashion-MNIST MLP ran 18.8K examples/s at 16 threads with factor
/// 1 (81.7K on one thread) and 125K with 64 (bench/results/threads.md). Changed at run
/// time by STAGECRAFT_GRAIN_SCALE or sc::set_parallel_grain_scale.
inline constexpr long parallel_grain_scale = 64;
/// The least floating-point work (2 M N K) each OpenBLAS thread of a matrix product gets: a product
/// of less runs on fewer threads (OpenBLAS otherwise threads every product above ~0.5 MFLOP over
/// all of them). 0 (the default) leaves OpenBLAS's choice alone. Changed at run time by
/// STAGECRAFT_BLAS_THREAD_FLOPS or sc::set_blas_thread_flops; under test on the 16-core Xeon,
/// where the example's MLP ran 11% slower on 16 threads than on 8 (bench/results/threads.md).
inline constexpr long blas_thread_flops = 0;
/// The least floating-point work (2 M N K) of each block when stagecraft splits a mid-sized
/// matrix product over its own threads itself (blocks of columns or rows, taken dynamically, each
/// one single-threaded OpenBLAS call): a product of less than 4 blocks per thread is split so,
/// a larger one is left to OpenBLAS. It never changes OpenBLAS's thread count (what made
/// blas_thread_flops cost), and a slow thread takes fewer blocks. 0 (the default) is off.
/// Changed at run time by STAGECRAFT_BLAS_SPLIT_FLOPS or sc::set_blas_split_flops; to be
/// measured on the 16-core Xeon against the 8 -> 16 thread drop (bench/results/threads.md).
inline constexpr long blas_split_flops = 0;
/// CUDA graphs' default policy (cuda::GraphPolicy::when_cheaper): a staged plan is replayed as a
/// graph when the bytes it copies per call (arguments and variable values in, results out) are at
/// most this many per kernel it launches. On the lent H100/H200 virtual machines a launch cost
/// 4.6-5 us of host time, and a device copy ran at ~4 TB/s of reads and writes, so 4 MiB copied
/// costs the GPU ~2 us: about what a graph saves per kernel when the GPU is the bottleneck (the
/// gaps between kernels), well under what it saves when the host is (bench/results/gpu.md).
inline constexpr long long cuda_graph_bytes_per_launch = 4ll << 20;
/// Bytes every CPU buffer is aligned to (one cache line, enough for AVX-512).
inline constexpr unsigned alignment = 64;
}  // namespace stagecraft::config
