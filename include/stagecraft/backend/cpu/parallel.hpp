// The one thread pool: OpenMP (OpenBLAS's openmp build shares its runtime with these loops).
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <type_traits>

#include "../../config.hpp"
#include "cpu_quota.hpp"
#if SC_HAS_OPENMP
#include <omp.h>
#endif

namespace stagecraft {

namespace detail {
/// The thread count the process's CPU quota allows (cpu_quota.hpp) where the user set none
/// through OMP_NUM_THREADS; 0 when nothing is to be lowered. Read once per process.
inline int quota_thread_cap() {
  static const int cap = [] {
    if (std::getenv("OMP_NUM_THREADS") != nullptr) return 0;
    const std::optional<double> q = backend::cpu::cpu_quota();
    return q ? backend::cpu::threads_for_quota(*q) : 0;
  }();
  return cap;
}
/// Whether the calling thread's count was settled (the quota applied, or set_num_threads called).
inline bool& thread_count_settled() {
  thread_local bool settled = false;
  return settled;
}
/// Once per thread, before its first parallel region or BLAS product: lowers OpenMP's count for
/// this thread to what the CPU quota allows, when the count is still the runtime's default (one
/// per CPU the process may run on). A count the program chose stays.
inline void settle_thread_count() {
#if SC_HAS_OPENMP
  bool& settled = thread_count_settled();
  if (SC_LIKELY(settled) || omp_in_parallel()) return;
  settled = true;
  const int cap = quota_thread_cap(), max = omp_get_max_threads();
  if (cap > 0 && max > cap && max == backend::cpu::affinity_cpus()) omp_set_num_threads(cap);
#endif
}
}  // namespace detail

/// Threads the CPU backend uses: OpenMP's max threads (at most the process's CPU quota in whole
/// CPUs unless OMP_NUM_THREADS or set_num_threads said otherwise); 1 without OpenMP.
inline int num_threads() {
#if SC_HAS_OPENMP
  detail::settle_thread_count();
  return omp_get_max_threads();
#else
  return 1;
#endif
}
/// Sets the CPU backend's thread count for the calling thread (OpenBLAS follows, as it shares the
/// OpenMP runtime); the CPU quota no longer lowers it.
inline void set_num_threads(int n) {
#if SC_HAS_OPENMP
  detail::thread_count_settled() = true;
  omp_set_num_threads(std::max(1, n));
#else
  (void)n;
#endif
}

namespace detail {
/// The integer in environment variable `name` when it is set, else `fallback`.
inline long long env_or(const char* name, long long fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoll(v) : fallback;
}
/// The process's grain scale: STAGECRAFT_GRAIN_SCALE when set (a positive integer), else
/// config::parallel_grain_scale.
inline std::atomic<std::int64_t>& grain_scale_setting() {
  static std::atomic<std::int64_t> scale{std::clamp<long long>(env_or("STAGECRAFT_GRAIN_SCALE", config::parallel_grain_scale), 1, 1 << 20)};
  return scale;
}
}  // namespace detail

/// The factor on the work each thread of the CPU backend's parallel loops gets: larger values
/// use fewer threads on mid-sized tensors (a parallel region costs more on some machines,
/// virtual ones especially; config::parallel_grain_scale says what was measured).
inline std::int64_t parallel_grain_scale() { return detail::grain_scale_setting().load(std::memory_order_relaxed); }
/// Sets parallel_grain_scale (at least 1); 1 splits loops as finely as their grains allow.
inline void set_parallel_grain_scale(std::int64_t k) {
  detail::grain_scale_setting().store(std::clamp<std::int64_t>(k, 1, std::int64_t{1} << 20), std::memory_order_relaxed);
}

namespace detail {
/// The process's BLAS thread work: STAGECRAFT_BLAS_THREAD_FLOPS when set (>= 0), else
/// config::blas_thread_flops.
inline std::atomic<std::int64_t>& blas_thread_flops_setting() {
  static std::atomic<std::int64_t> flops{std::max<long long>(env_or("STAGECRAFT_BLAS_THREAD_FLOPS", config::blas_thread_flops), 0)};
  return flops;
}
}  // namespace detail

/// The least work (floating-point operations) each OpenBLAS thread of a matrix product gets (0:
/// OpenBLAS decides alone); see config::blas_thread_flops.
inline std::int64_t blas_thread_flops() { return detail::blas_thread_flops_setting().load(std::memory_order_relaxed); }
/// Sets blas_thread_flops (0 turns the cap off).
inline void set_blas_thread_flops(std::int64_t flops) {
  detail::blas_thread_flops_setting().store(std::max<std::int64_t>(flops, 0), std::memory_order_relaxed);
}

namespace detail {
/// The process's BLAS split work: STAGECRAFT_BLAS_SPLIT_FLOPS when set (>= 0), else
/// config::blas_split_flops.
inline std::atomic<std::int64_t>& blas_split_flops_setting() {
  static std::atomic<std::int64_t> flops{std::max<long long>(env_or("STAGECRAFT_BLAS_SPLIT_FLOPS", config::blas_split_flops), 0)};
  return flops;
}
}  // namespace detail

/// The least work (floating-point operations) of each block of a matrix product that stagecraft
/// splits over its own threads (0: off); see config::blas_split_flops.
inline std::int64_t blas_split_flops() { return detail::blas_split_flops_setting().load(std::memory_order_relaxed); }
/// Sets blas_split_flops (0 turns the split off).
inline void set_blas_split_flops(std::int64_t flops) {
  detail::blas_split_flops_setting().store(std::max<std::int64_t>(flops, 0), std::memory_order_relaxed);
}

namespace backend::cpu {

/// While alive, OpenBLAS (whose OpenMP build asks OpenMP for its thread count at each call) runs a
/// product of `flops` on at most flops / blas_thread_flops() threads. Nothing changes inside a
/// parallel region (the product is serial there), with the cap off, or without OpenMP.
class BlasThreadCap {
 public:
  explicit BlasThreadCap(double flops) {
#if SC_HAS_OPENMP
    const std::int64_t per = blas_thread_flops();
    if (per <= 0 || omp_in_parallel()) return;
    const int max = omp_get_max_threads();
    const double fit = flops / static_cast<double>(per);
    const int want = fit < 1 ? 1 : (fit >= max ? max : static_cast<int>(fit));
    if (want < max) {
      saved_ = max;
      omp_set_num_threads(want);
    }
#else
    (void)flops;
#endif
  }
  ~BlasThreadCap() {
#if SC_HAS_OPENMP
    if (saved_ > 0) omp_set_num_threads(saved_);
#endif
  }
  BlasThreadCap(const BlasThreadCap&) = delete;
  BlasThreadCap& operator=(const BlasThreadCap&) = delete;

 private:
  int saved_ = 0;
};

namespace detail_parallel {
/// What the parallel loops run on each thread: fn(ctx, begin, end), the caller's callable behind a
/// pointer, so the OpenMP region (outlined by the compiler, a function per region) exists once,
/// not once per kernel: 624 instantiations in a file that traces one add.
using RangeFn = void (*)(void* ctx, std::int64_t b, std::int64_t e);

template <class F>
[[gnu::noinline]] void call_range(void* ctx, std::int64_t b, std::int64_t e) {
  (*static_cast<std::remove_reference_t<F>*>(ctx))(b, e);
}

/// Threads parallel_for starts for n elements (1: run serially).
inline int threads_for(std::int64_t n, std::int64_t grain) {
#if SC_HAS_OPENMP
  if (n >= grain && n >= 2 * 64 && !omp_in_parallel() && num_threads() > 1) {
    const std::int64_t per_thread = std::max<std::int64_t>(grain / 2, 64) * parallel_grain_scale();
    return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(omp_get_max_threads(), n / per_thread)));
  }
#else
  (void)n;
  (void)grain;
#endif
  return 1;
}

inline void run_elements(int want, std::int64_t n, RangeFn fn, void* ctx) {
#if SC_HAS_OPENMP
#pragma omp parallel num_threads(want)
  {
    const std::int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    std::int64_t chunk = (n + nt - 1) / nt;
    chunk = (chunk + 63) / 64 * 64;
    const std::int64_t b = std::min(n, t * chunk), e = std::min(n, b + chunk);
    if (b < e) fn(ctx, b, e);
  }
#else
  (void)want;
  fn(ctx, 0, n);
#endif
}

/// Threads parallel_rows starts (1: run serially).
inline int threads_for_rows(std::int64_t rows, std::int64_t row_work, std::int64_t grain) {
#if SC_HAS_OPENMP
  if (rows >= 2 && !omp_in_parallel() && num_threads() > 1) {
    const std::int64_t per_row = std::max<std::int64_t>(row_work, 1);
    const std::int64_t work = per_row > INT64_MAX / rows ? INT64_MAX : rows * per_row;
    const std::int64_t per_thread = std::max<std::int64_t>(grain / 2, 64) * parallel_grain_scale();
    const std::int64_t want = std::min<std::int64_t>({omp_get_max_threads(), rows, work / per_thread});
    if (work >= grain && want > 1) return static_cast<int>(want);
  }
#else
  (void)rows;
  (void)row_work;
  (void)grain;
#endif
  return 1;
}

inline void run_rows(int want, std::int64_t rows, RangeFn fn, void* ctx) {
#if SC_HAS_OPENMP
#pragma omp parallel num_threads(want)
  {
    const std::int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const std::int64_t q = rows / nt, r = rows % nt;
    const std::int64_t b = t * q + std::min(t, r), e = b + q + (t < r ? 1 : 0);
    if (b < e) fn(ctx, b, e);
  }
#else
  (void)want;
  fn(ctx, 0, rows);
#endif
}
}  // namespace detail_parallel

/// Runs f(begin, end) over [0, n) split into one contiguous range per thread, or serially
/// when n < grain (small tensors pay no thread start-up) or when already in a parallel region.
/// Ranges are rounded to multiples of 64 so SIMD loops keep whole vectors.
template <class F>
void parallel_for(std::int64_t n, std::int64_t grain, F&& f) {
  const int want = detail_parallel::threads_for(n, grain);
  void* ctx = const_cast<void*>(static_cast<const void*>(&f));
  if (want > 1) detail_parallel::run_elements(want, n, &detail_parallel::call_range<F>, ctx);
  else detail_parallel::call_range<F>(ctx, 0, n);  // (the same body, not a second copy inlined here)
}

/// Runs f(begin, end) over rows [0, rows) of `row_work` elements of work each, one contiguous
/// range of whole rows per thread, spread evenly. The thread count comes from the total work as
/// parallel_for's comes from elements (serial below `grain`; each thread takes at least
/// grain / 2 * parallel_grain_scale() of it), with no 64-unit floor or rounding: 16 rows of 100K
/// elements split 16 ways, where parallel_for(16, ...) would keep them on one thread.
template <class F>
void parallel_rows(std::int64_t rows, std::int64_t row_work, std::int64_t grain, F&& f) {
  const int want = detail_parallel::threads_for_rows(rows, row_work, grain);
  void* ctx = const_cast<void*>(static_cast<const void*>(&f));
  if (want > 1) detail_parallel::run_rows(want, rows, &detail_parallel::call_range<F>, ctx);
  else detail_parallel::call_range<F>(ctx, 0, rows);
}

/// The widest unit parallel_column_blocks hands out.
inline constexpr std::int64_t column_block = 256;

/// Runs f(o, i0, w) over the columns of a [outer, steps, inner] array in units of one outer index
/// and up to column_block inner positions (w of them from i0), over threads as parallel_rows
/// (a unit is `steps` times its width of work). Each unit owns its columns, so no two threads
/// meet, and its columns can step down the middle axis together (a vector loop): the layout of the
/// scans and of add_along_axis along an axis that is not the last.
template <class F>
void parallel_column_blocks(std::int64_t outer, std::int64_t inner, std::int64_t steps, std::int64_t grain, F&& f) {
  constexpr std::int64_t block = column_block;
  const std::int64_t blocks = (inner + block - 1) / block;
  parallel_rows(outer * blocks, steps * std::min(inner, block), grain, [&](std::int64_t ub, std::int64_t ue) {
    for (std::int64_t u = ub; u < ue; ++u) {
      const std::int64_t o = u / blocks, i0 = (u % blocks) * block;
      f(o, i0, std::min(inner, i0 + block) - i0);
    }
  });
}

/// Grain sizes: cheap ops (add) need many elements to beat thread start-up; costly ones fewer.
inline constexpr std::int64_t grain_cheap = config::parallel_threshold;
inline constexpr std::int64_t grain_costly = config::parallel_threshold / 8;
/// Ops of several nanoseconds an element (a pow computed in doubles, a libm call a lane, an integer
/// division): a thread pays for itself from a few thousand of them.
inline constexpr std::int64_t grain_heavy = config::parallel_threshold / 64;

}  // namespace backend::cpu
}  // namespace stagecraft
