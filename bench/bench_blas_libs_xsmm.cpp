// libxsmm back end of bench_blas_libs. libxsmm is column-major: the row-major C = op(A)·op(B) is
// computed as the column-major C^T = op(B)^T·op(A)^T, i.e. the operands swapped, each keeping
// its trans flag (a row-major matrix read column-major is its transpose).
#include <libxsmm.h>

#include <string>

#include "bench_blas_libs.hpp"

namespace blas_libs {

std::string xsmm_info() {
  libxsmm_init();
  return std::string(LIBXSMM_VERSION) + " (JIT target " + libxsmm_get_target_arch() + ")";
}

void xsmm_gemm(const Gemm& g) {
  const char ta = g.tb ? 'T' : 'N', tb = g.ta ? 'T' : 'N';
  const libxsmm_blasint m = g.n, n = g.m, k = g.k, lda = g.ldb, ldb = g.lda, ldc = g.ldc;
  const float one = 1.f, zero = 0.f;
  libxsmm_sgemm(&ta, &tb, &m, &n, &k, &one, g.b, &lda, g.a, &ldb, &zero, g.c, &ldc);
}

void* xsmm_dispatch(const Gemm& g) {
  const int flags = (g.tb ? LIBXSMM_GEMM_FLAG_TRANS_A : 0) | (g.ta ? LIBXSMM_GEMM_FLAG_TRANS_B : 0);
  const int prefetch = LIBXSMM_GEMM_PREFETCH_NONE;  // the kernel then takes (a, b, c) only
  const libxsmm_blasint lda = g.ldb, ldb = g.lda, ldc = g.ldc;
  const float one = 1.f, zero = 0.f;
  return reinterpret_cast<void*>(
      libxsmm_smmdispatch(g.n, g.m, g.k, &lda, &ldb, &ldc, &one, &zero, &flags, &prefetch));
}

void xsmm_run(void* kernel, const Gemm& g) { reinterpret_cast<libxsmm_smmfunction>(kernel)(g.b, g.a, g.c); }

}  // namespace blas_libs
