// BLIS back end of bench_blas_libs: bli_sgemm looked up in a dlopen'ed libblis (RTLD_LOCAL), so
// BLIS's own cblas_sgemm/sgemm_ never take the place of OpenBLAS's in this process.
#include <dlfcn.h>

#include <blis.h>

#include "bench_blas_libs.hpp"

namespace blas_libs {

namespace {

struct Blis {
  decltype(&bli_sgemm) sgemm = nullptr;
  decltype(&bli_arch_query_id) arch_id = nullptr;
  decltype(&bli_arch_string) arch_string = nullptr;
};
Blis blis;

template <class F>
bool find(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  return f != nullptr;
}

}  // namespace

std::string blis_load(int threads) {
  // RTLD_DEEPBIND: BLIS's calls among its own functions resolve inside libblis, not to a
  // same-named OpenBLAS export already in the global scope.
  void* lib = dlopen(STAGECRAFT_BENCH_BLIS_SO, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (lib == nullptr) return std::string("dlopen: ") + dlerror();
  decltype(&bli_thread_set_num_threads) set_threads = nullptr;
  if (!find(lib, "bli_sgemm", blis.sgemm) || !find(lib, "bli_arch_query_id", blis.arch_id) ||
      !find(lib, "bli_arch_string", blis.arch_string) || !find(lib, "bli_thread_set_num_threads", set_threads))
    return "bli_sgemm / bli_thread_set_num_threads not exported";
  set_threads(threads);
  return "";
}

std::string blis_arch() { return blis.arch_string ? blis.arch_string(blis.arch_id()) : "not loaded"; }

void blis_gemm(const Gemm& g) {
  float one = 1.f, zero = 0.f;
  // Strides describe the stored matrices (row-major: row stride ld, column stride 1); the
  // trans flags say how BLIS reads them.
  blis.sgemm(g.ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, g.tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, g.m, g.n, g.k, &one,
             const_cast<float*>(g.a), g.lda, 1, const_cast<float*>(g.b), g.ldb, 1, &zero, g.c, g.ldc, 1);
}

}  // namespace blas_libs
