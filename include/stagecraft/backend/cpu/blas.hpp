// The OpenBLAS bridge: one row-major matrix product that picks gemm, gemv or a blocked
// integer loop (BLAS has no integer GEMM).
#pragma once
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "parallel.hpp"

namespace stagecraft::backend::cpu {

namespace blas_detail {

inline blasint bi(std::int64_t v) { return static_cast<blasint>(v); }

/// C[M,N] = A[M,K] B[K,N]; row-major, leading dimensions K, N, N. M, K, N > 0.
inline void gemm(std::int64_t M, std::int64_t N, std::int64_t K, const float* A, const float* B, float* C) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bi(M), bi(N), bi(K), 1.f, A, bi(K), B, bi(N), 0.f, C, bi(N));
}
inline void gemm(std::int64_t M, std::int64_t N, std::int64_t K, const double* A, const double* B, double* C) {
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bi(M), bi(N), bi(K), 1.0, A, bi(K), B, bi(N), 0.0, C, bi(N));
}
/// y[N] = x[K] B[K,N], i.e. B^T x on row-major B (the batch-1 inference product).
inline void vecmat(std::int64_t N, std::int64_t K, const float* x, const float* B, float* y) {
  cblas_sgemv(CblasRowMajor, CblasTrans, bi(K), bi(N), 1.f, B, bi(N), x, 1, 0.f, y, 1);
}
inline void vecmat(std::int64_t N, std::int64_t K, const double* x, const double* B, double* y) {
  cblas_dgemv(CblasRowMajor, CblasTrans, bi(K), bi(N), 1.0, B, bi(N), x, 1, 0.0, y, 1);
}
/// y[M] = A[M,K] x[K].
inline void matvec(std::int64_t M, std::int64_t K, const float* A, const float* x, float* y) {
  cblas_sgemv(CblasRowMajor, CblasNoTrans, bi(M), bi(K), 1.f, A, bi(K), x, 1, 0.f, y, 1);
}
inline void matvec(std::int64_t M, std::int64_t K, const double* A, const double* x, double* y) {
  cblas_dgemv(CblasRowMajor, CblasNoTrans, bi(M), bi(K), 1.0, A, bi(K), x, 1, 0.0, y, 1);
}

/// Integer C = A B, blocked over K and N so a panel of B stays in cache while rows of A
/// stream past it; rows of C are split across threads. Arithmetic wraps (unsigned), as
/// NumPy's integer matmul does, instead of signed-overflow UB.
template <class T>
void int_gemm(std::int64_t M, std::int64_t N, std::int64_t K, const T* A, const T* B, T* C) {
  using U = std::make_unsigned_t<T>;
  constexpr std::int64_t kc = 128, nc = 2048;
  const std::int64_t grain = std::max<std::int64_t>(1, grain_costly / std::max<std::int64_t>(1, N * K));
  parallel_for(M, grain, [&](std::int64_t rb, std::int64_t re) {
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

/// C[M,N] = A[M,K] B[K,N] for contiguous row-major buffers, overwriting C. K == 0 gives
/// zeros. Floats go to OpenBLAS (gemv when M or N is 1: at batch 1 sgemm pays for packing
/// it cannot amortise), integers to a blocked loop. Threads come from OpenBLAS / parallel_for.
template <class T>
void matmul_2d(std::int64_t M, std::int64_t N, std::int64_t K, const T* A, const T* B, T* C) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // BLAS rejects lda = 0; the empty sum is 0
    std::memset(C, 0, static_cast<std::size_t>(M * N) * sizeof(T));
    return;
  }
  if constexpr (std::is_floating_point_v<T>) {
    // BLAS takes 32-bit sizes: split very tall products into row blocks (N and K are
    // checked to fit by the op's inference).
    constexpr std::int64_t max_rows = INT_MAX;
    for (std::int64_t r0 = 0; r0 < M; r0 += max_rows) {
      const std::int64_t m = std::min(max_rows, M - r0);
      if (m == 1) blas_detail::vecmat(N, K, A + r0 * K, B, C + r0 * N);
      else if (N == 1) blas_detail::matvec(m, K, A + r0 * K, B, C + r0 * N);
      else blas_detail::gemm(m, N, K, A + r0 * K, B, C + r0 * N);
    }
  } else {
    blas_detail::int_gemm(M, N, K, A, B, C);
  }
}

}  // namespace stagecraft::backend::cpu
