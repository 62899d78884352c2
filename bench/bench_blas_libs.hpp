// The one call every back end of bench_blas_libs implements: row-major C = op(A)·op(B), beta 0.
// Each library that could clash with OpenBLAS's cblas.h (BLIS, libxsmm) lives in its own file
// behind these declarations, so no translation unit sees two libraries' headers.
#pragma once
#include <string>

namespace blas_libs {

/// A row-major single-precision product C[m,n] = op(A)[m,k] · op(B)[k,n], C overwritten.
/// ta: A is stored k x m (lda >= m) and used transposed; tb: B is stored n x k (ldb >= k).
struct Gemm {
  bool ta = false, tb = false;
  int m = 0, n = 0, k = 0;
  const float* a = nullptr;
  int lda = 0;
  const float* b = nullptr;
  int ldb = 0;
  float* c = nullptr;
  int ldc = 0;
};

#if STAGECRAFT_BENCH_BLIS
/// Loads BLIS (dlopen, RTLD_LOCAL: its cblas_sgemm/sgemm_ never replace OpenBLAS's) and sets its
/// thread count; "" when ready, else why not.
std::string blis_load(int threads);
/// BLIS's configuration for this CPU (bli_arch_string), after blis_load.
std::string blis_arch();
/// bli_sgemm with general strides: the row-major case needs no operand swap.
void blis_gemm(const Gemm& g);
#endif

#if STAGECRAFT_BENCH_XSMM
/// libxsmm's version and JIT target ("hsw", "skx", ...).
std::string xsmm_info();
/// libxsmm_sgemm: its BLAS-like front end (JIT for small products, the linked BLAS above its
/// LIBXSMM_MAX_MNK threshold).
void xsmm_gemm(const Gemm& g);
/// A kernel JIT-generated for g's shape and layout (libxsmm_smmdispatch); null when libxsmm has
/// none (transposed operands it does not generate, sizes past its limits). Call it through
/// xsmm_run.
void* xsmm_dispatch(const Gemm& g);
/// Runs a kernel from xsmm_dispatch on g's operands.
void xsmm_run(void* kernel, const Gemm& g);
#endif

}  // namespace blas_libs
