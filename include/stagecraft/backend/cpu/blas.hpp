// The OpenBLAS bridge: one row-major matrix product that picks gemm, gemv or a blocked
// integer loop (BLAS has no integer GEMM).
#pragma once
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "blas_core.hpp"
#include "elementwise.hpp"  // batch, load_partial, store_partial
#include "parallel.hpp"

namespace stagecraft::backend::cpu {

/// The thread count to give OpenBLAS's own pool (its pthreads build, Ubuntu's default: it ignores
/// OpenMP's count) under a CPU quota allowing `cap` threads (0: none), or 0 to leave it: only that
/// build, only while it runs more than `cap`, and only where the user set no count in the
/// environment (OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS or OMP_NUM_THREADS).
inline int blas_pool_threads_for_quota(int parallel_kind, int current, int cap, bool count_in_environment) {
  if (parallel_kind != OPENBLAS_THREAD || cap <= 0 || count_in_environment || current <= cap) return 0;
  return cap;
}

/// Before a product: the calling thread's OpenMP count settled (the CPU quota; OpenBLAS's OpenMP
/// build reads that count at each call), OpenBLAS's own pool held to the quota (its pthreads
/// build; once per process) and OpenBLAS's core chosen.
inline void blas_ready() {
  stagecraft::detail::settle_thread_count();
  static const bool pool_settled = [] {
    const bool env = std::getenv("OPENBLAS_NUM_THREADS") != nullptr || std::getenv("GOTO_NUM_THREADS") != nullptr ||
                     std::getenv("OMP_NUM_THREADS") != nullptr;
    const int n = blas_pool_threads_for_quota(openblas_get_parallel(), openblas_get_num_threads(),
                                              stagecraft::detail::quota_thread_cap(), env);
    if (n > 0) openblas_set_num_threads(n);
    return true;
  }();
  (void)pool_settled;
  ensure_blas_core();
}

namespace blas_detail {

inline blasint bi(std::int64_t v) { return static_cast<blasint>(v); }

inline CBLAS_TRANSPOSE tr(bool t) { return t ? CblasTrans : CblasNoTrans; }

/// C = op(A) op(B) + beta C through one cblas call, row-major with leading dimensions.
inline void gemm_call(std::int64_t M, std::int64_t N, std::int64_t K, const float* A, std::int64_t lda, bool ta,
                      const float* B, std::int64_t ldb, bool tb, float* C, std::int64_t ldc, float beta) {
  cblas_sgemm(CblasRowMajor, tr(ta), tr(tb), bi(M), bi(N), bi(K), 1.f, A, bi(lda), B, bi(ldb), beta, C, bi(ldc));
}
inline void gemm_call(std::int64_t M, std::int64_t N, std::int64_t K, const double* A, std::int64_t lda, bool ta,
                      const double* B, std::int64_t ldb, bool tb, double* C, std::int64_t ldc, double beta) {
  cblas_dgemm(CblasRowMajor, tr(ta), tr(tb), bi(M), bi(N), bi(K), 1.0, A, bi(lda), B, bi(ldb), beta, C, bi(ldc));
}

/// gemm_call split by stagecraft over its own threads when blas_split_flops() asks it and the
/// product is mid-sized (under 4 blocks of that work per thread): blocks of C's columns (a
/// multiple of 16 wide) or rows (of 4), taken dynamically by the threads, each one OpenBLAS call,
/// which runs on one thread inside the parallel region (its kernels for a block's size may sum in
/// another order: within float rounding of the unsplit product). False (nothing done) otherwise.
template <class T>
bool split_gemm(std::int64_t M, std::int64_t N, std::int64_t K, const T* A, std::int64_t lda, bool ta, const T* B,
                std::int64_t ldb, bool tb, T* C, std::int64_t ldc, T beta) {
#if SC_HAS_OPENMP
  const std::int64_t per = blas_split_flops();
  if (per <= 0 || omp_in_parallel()) return false;
  const int max_threads = omp_get_max_threads();
  if (max_threads < 2) return false;
  const double fit = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) / static_cast<double>(per);
  if (fit >= 4.0 * max_threads) return false;  // a large product: OpenBLAS's own threads split it well
  const bool by_cols = N >= M;
  const std::int64_t extent = by_cols ? N : M, quantum = by_cols ? 16 : 4;
  std::int64_t blocks = std::clamp<std::int64_t>(static_cast<std::int64_t>(fit), 1, std::max<std::int64_t>(extent / quantum, 1));
  std::int64_t width = (extent + blocks - 1) / blocks;
  width = (width + quantum - 1) / quantum * quantum;
  blocks = (extent + width - 1) / width;
  // At least two threads even for one block: inside a parallel region OpenBLAS runs on one.
  const int threads = static_cast<int>(std::clamp<std::int64_t>(blocks, 2, max_threads));
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (std::int64_t k = 0; k < blocks; ++k) {
    const std::int64_t b = k * width, n = std::min(extent, b + width) - b;
    if (by_cols) gemm_call(M, n, K, A, lda, ta, tb ? B + b * ldb : B + b, ldb, tb, C + b, ldc, beta);
    else gemm_call(n, N, K, ta ? A + b : A + b * lda, lda, ta, B, ldb, tb, C + b * ldc, ldc, beta);
  }
  return true;
#else
  (void)M, (void)N, (void)K, (void)A, (void)lda, (void)ta, (void)B, (void)ldb, (void)tb, (void)C, (void)ldc, (void)beta;
  return false;
#endif
}

/// C[M,N] = op(A) op(B), row-major, op(X) = X or X^T: A is [M,K] (ta: [K,M]), B is [K,N]
/// (tb: [N,K]); leading dimensions are the stored row lengths. M, K, N > 0.
template <class T>
void gemm(std::int64_t M, std::int64_t N, std::int64_t K, const T* A, const T* B, T* C, bool ta, bool tb) {
  blas_ready();
  if (split_gemm(M, N, K, A, ta ? M : K, ta, B, tb ? K : N, tb, C, N, T(0))) return;
  const BlasThreadCap cap(2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K));
  gemm_call(M, N, K, A, ta ? M : K, ta, B, tb ? K : N, tb, C, N, T(0));
}
/// y = op(A) x with A stored [rows, cols] row-major: y[rows] = A x, or (t) y[cols] = A^T x.
inline void gemv(std::int64_t rows, std::int64_t cols, const float* A, const float* x, float* y, bool t) {
  blas_ready();
  cblas_sgemv(CblasRowMajor, tr(t), bi(rows), bi(cols), 1.f, A, bi(cols), x, 1, 0.f, y, 1);
}
inline void gemv(std::int64_t rows, std::int64_t cols, const double* A, const double* x, double* y, bool t) {
  blas_ready();
  cblas_dgemv(CblasRowMajor, tr(t), bi(rows), bi(cols), 1.0, A, bi(cols), x, 1, 0.0, y, 1);
}

/// Products this small cost less as a plain loop than OpenBLAS's call overhead (argument
/// checks, thread dispatch, packing): the batch-1 layers of small models. Measured in
/// bench_matmul (matmul/tiny): a [1,2]x[2,10] product is several times faster as a loop.
inline constexpr std::int64_t tiny_flops = 4096;

/// c[N] = a[K] op(B) for one row a (a batch-1 layer), in SIMD batches with masked ends: B
/// stored [K,N] (rows of B scaled and added), or [N,K] (tb: one dot product per column).
template <class T>
void tiny_row(std::int64_t N, std::int64_t K, const T* a, const T* B, T* c, bool tb) {
  using V = batch<T>;
  constexpr std::int64_t W = V::size;
  if (!tb) {
    for (std::int64_t n0 = 0; n0 < N; n0 += W) {
      const std::int64_t r = std::min(W, N - n0);
      V acc(T(0));
      for (std::int64_t k = 0; k < K; ++k) acc = xsimd::fma(V(a[k]), load_partial(B + k * N + n0, r), acc);
      store_partial(c + n0, acc, r);
    }
    return;
  }
  for (std::int64_t n = 0; n < N; ++n) {
    V acc(T(0));
    for (std::int64_t k0 = 0; k0 < K; k0 += W) {
      const std::int64_t r = std::min(W, K - k0);
      acc = xsimd::fma(load_partial(a + k0, r), load_partial(B + n * K + k0, r), acc);
    }
    c[n] = xsimd::hadd(acc);
  }
}

/// C = op(A) op(B) by plain loops: one row by tiny_row; else dot products along rows of A and B
/// when B is transposed (both contiguous), otherwise k outer so the inner loop runs along rows
/// of B and C.
template <class T>
void tiny_gemm(std::int64_t M, std::int64_t N, std::int64_t K, const T* A, const T* B, T* C, bool ta, bool tb) {
  if (M == 1) {  // [1,K] and [K,1] hold the same K numbers: ta does not matter
    tiny_row(N, K, A, B, C, tb);
    return;
  }
  if (tb && !ta) {
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t n = 0; n < N; ++n) {
        T s = T(0);
        for (std::int64_t k = 0; k < K; ++k) s += A[m * K + k] * B[n * K + k];
        C[m * N + n] = s;
      }
    return;
  }
  for (std::int64_t m = 0; m < M; ++m) {
    T* c = C + m * N;
    for (std::int64_t n = 0; n < N; ++n) c[n] = T(0);
    for (std::int64_t k = 0; k < K; ++k) {
      const T a = ta ? A[k * M + m] : A[m * K + k];
      if (tb) {
        for (std::int64_t n = 0; n < N; ++n) c[n] += a * B[n * K + k];
      } else {
        const T* b = B + k * N;
        for (std::int64_t n = 0; n < N; ++n) c[n] += a * b[n];
      }
    }
  }
}

/// Integer C = A B, blocked over K and N so a panel of B stays in cache while rows of A
/// stream past it; rows of C are split across threads. Arithmetic wraps (unsigned), as
/// NumPy's integer matmul does, instead of signed-overflow UB.
template <class T>
void int_gemm(std::int64_t M, std::int64_t N, std::int64_t K, const T* A, const T* B, T* C) {
  using U = std::make_unsigned_t<T>;
  constexpr std::int64_t kc = 128, nc = 2048;
  parallel_rows(M, N * K, grain_costly, [&](std::int64_t rb, std::int64_t re) {
    std::memset(C + rb * N, 0, static_cast<std::size_t>((re - rb) * N) * sizeof(T));
    for (std::int64_t k0 = 0; k0 < K; k0 += kc) {
      const std::int64_t k1 = std::min(K, k0 + kc);
      for (std::int64_t j0 = 0; j0 < N; j0 += nc) {
        const std::int64_t j1 = std::min(N, j0 + nc);
        for (std::int64_t i = rb; i < re; ++i) {
          U* __restrict c = reinterpret_cast<U*>(C + i * N);
          for (std::int64_t k = k0; k < k1; ++k) {
            const U a = static_cast<U>(A[i * K + k]);
            const U* __restrict b = reinterpret_cast<const U*>(B + k * N);
            for (std::int64_t j = j0; j < j1; ++j) c[j] += a * b[j];
          }
        }
      }
    }
  });
}

}  // namespace blas_detail

/// C[M,N] = op(A) op(B) for contiguous row-major buffers, overwriting C; op(X) is X, or X^T
/// when its flag is set (A then stored [K,M], B [N,K]). K == 0 gives zeros. Floats go to
/// OpenBLAS (gemv when M or N is 1: at batch 1 sgemm pays for packing it cannot amortise; a
/// plain loop below tiny_flops), integers to a blocked loop over a transposed copy where needed.
/// Threads come from OpenBLAS / parallel_for.
template <class T>
void matmul_2d(std::int64_t M, std::int64_t N, std::int64_t K, const T* A, const T* B, T* C, bool ta = false,
               bool tb = false) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // BLAS rejects lda = 0; the empty sum is 0
    std::memset(C, 0, static_cast<std::size_t>(M * N) * sizeof(T));
    return;
  }
  if constexpr (std::is_floating_point_v<T>) {
    if (M * N * K <= blas_detail::tiny_flops) {
      blas_detail::tiny_gemm(M, N, K, A, B, C, ta, tb);
      return;
    }
    // A vector operand reads the same either way: [1,K] and [K,1] hold the same K numbers.
    if (M == 1) {
      // y[N] = a op(B): B stored [K,N] needs B^T a; stored [N,K] needs B a.
      blas_detail::gemv(tb ? N : K, tb ? K : N, B, A, C, !tb);
      return;
    }
    if (N == 1) {
      // y[M] = op(A) b: A stored [M,K] needs A b; stored [K,M] needs A^T b.
      blas_detail::gemv(ta ? K : M, ta ? M : K, A, B, C, ta);
      return;
    }
    // BLAS takes 32-bit sizes: split very tall products into row blocks (N and K are checked
    // to fit by the op's inference). A transposed A has M columns, so M must fit as well.
    constexpr std::int64_t max_rows = INT_MAX;
    if (ta) {
      blas_detail::gemm(M, N, K, A, B, C, true, tb);
      return;
    }
    for (std::int64_t r0 = 0; r0 < M; r0 += max_rows) {
      const std::int64_t m = std::min(max_rows, M - r0);
      blas_detail::gemm(m, N, K, A + r0 * K, B, C + r0 * N, false, tb);
    }
  } else {
    if (!ta && !tb) {
      blas_detail::int_gemm(M, N, K, A, B, C);
      return;
    }
    // Integer products are rare and never hot: transpose into row-major copies first.
    std::vector<T> at, bt;
    if (ta) {
      at.resize(static_cast<std::size_t>(M * K));
      for (std::int64_t k = 0; k < K; ++k)
        for (std::int64_t m = 0; m < M; ++m) at[static_cast<std::size_t>(m * K + k)] = A[k * M + m];
      A = at.data();
    }
    if (tb) {
      bt.resize(static_cast<std::size_t>(K * N));
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t k = 0; k < K; ++k) bt[static_cast<std::size_t>(k * N + n)] = B[n * K + k];
      B = bt.data();
    }
    blas_detail::int_gemm(M, N, K, A, B, C);
  }
}

/// C = op(A) op(B) (+ C when `accumulate`) on row-major matrices with explicit leading
/// dimensions (the stored row lengths, so a matrix may be a block of a wider one): A is [M,K]
/// (ta: stored [K,M]), B is [K,N] (tb: stored [N,K]), C is [M,N]. K == 0 gives zeros (or
/// leaves C). Floats go to BLAS gemm with beta 0 or 1; integers to a plain loop that wraps
/// (unsigned arithmetic), for the rare integer convolution. The convolution kernels' product.
template <class T>
void gemm_ld(std::int64_t M, std::int64_t N, std::int64_t K, const T* A, std::int64_t lda, bool ta, const T* B,
             std::int64_t ldb, bool tb, T* C, std::int64_t ldc, bool accumulate) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!accumulate)
      for (std::int64_t m = 0; m < M; ++m) std::fill(C + m * ldc, C + m * ldc + N, T(0));
    return;
  }
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    blas_ready();
    // OpenBLAS scales C by beta in a pass of its own (sgemm_beta) before it adds the product,
    // and that pass was 5% of a CNN training step: zeroing C ourselves (memset) and adding
    // with beta = 1 costs less.
    if (!accumulate) {
      if (ldc == N) std::memset(C, 0, static_cast<std::size_t>(M * N) * sizeof(T));
      else for (std::int64_t m = 0; m < M; ++m) std::memset(C + m * ldc, 0, static_cast<std::size_t>(N) * sizeof(T));
    }
    if (blas_detail::split_gemm(M, N, K, A, lda, ta, B, ldb, tb, C, ldc, T(1))) return;
    const BlasThreadCap cap(2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K));
    blas_detail::gemm_call(M, N, K, A, lda, ta, B, ldb, tb, C, ldc, T(1));
  } else {
    using U = std::make_unsigned_t<T>;
    for (std::int64_t m = 0; m < M; ++m) {
      U* __restrict c = reinterpret_cast<U*>(C + m * ldc);
      if (!accumulate) std::fill(c, c + N, U(0));
      for (std::int64_t k = 0; k < K; ++k) {
        const U a = static_cast<U>(ta ? A[k * lda + m] : A[m * lda + k]);
        if (tb) {
          for (std::int64_t n = 0; n < N; ++n) c[n] += a * static_cast<U>(B[n * ldb + k]);
        } else {
          const T* b = B + k * ldb;
          for (std::int64_t n = 0; n < N; ++n) c[n] += a * static_cast<U>(b[n]);
        }
      }
    }
  }
}

}  // namespace stagecraft::backend::cpu
