// GEMM libraries side by side on the products stagecraft's models run: OpenBLAS (what the library
// calls), BLIS, oneDNN and libxsmm, each compiled in when CMake finds it, one family per library
// in one run. Row-major f32 C = op(A)·op(B) into a preallocated C, inputs checked once against a
// double-precision loop before timing.
#include <cblas.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#if STAGECRAFT_BENCH_DNNL
#include <dnnl.h>
#endif

#include "bench_blas_libs.hpp"
#include "bench_common.hpp"

namespace {

using blas_libs::Gemm;

/// One product of a model: C[m,n] = op(A)[m,k]·op(B)[k,n].
struct Case {
  const char* label;
  int m, k, n;
  bool ta = false, tb = false;
};

// MLP 784-256-128-10 at batch 1 and 128 and its first layer's gradients; the CNN's per-image conv
// GEMMs (batch 32: conv 1->32 3x3 pad 1 on 28x28, conv 32->64 3x3 pad 1 on 14x14); 1024^3.
const Case cases[] = {
    {"mlp.b1.fc1", 1, 784, 256},
    {"mlp.b1.fc2", 1, 256, 128},
    {"mlp.b1.fc3", 1, 128, 10},
    {"mlp.b128.fc1", 128, 784, 256},
    {"mlp.b128.fc2", 128, 256, 128},
    {"mlp.b128.fc3", 128, 128, 10},
    {"mlp.b128.fc1.dW=XtG", 784, 128, 256, true, false},
    {"mlp.b128.fc1.dX=GWt", 128, 256, 784, false, true},
    {"cnn.conv1.fwd", 32, 9, 784},
    {"cnn.conv1.dfilter", 32, 784, 9, false, true},
    {"cnn.conv2.fwd", 64, 288, 196},
    {"cnn.conv2.dfilter", 64, 196, 288, false, true},
    {"cnn.conv2.dinput", 288, 64, 196, true, false},
    {"ref.1024", 1024, 1024, 1024},
};

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], FreeDeleter>;

Buffer buffer(std::size_t n) {
  const std::size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
  return Buffer(static_cast<float*>(std::aligned_alloc(64, bytes)));
}

/// A case's operands, stored as a model stores them (A k x m when ta, B n x k when tb), filled
/// from a fixed stream in [-1, 1).
struct Operands {
  Buffer a, b, c;
  Gemm g;
  explicit Operands(const Case& s) {
    const std::size_t na = std::size_t(s.m) * s.k, nb = std::size_t(s.k) * s.n, nc = std::size_t(s.m) * s.n;
    a = buffer(na), b = buffer(nb), c = buffer(nc);
    std::uint64_t x = 0x9E3779B97F4A7C15ull;
    auto next = [&x] {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<float>((x >> 40) * (2.0 / 16777216.0) - 1.0);
    };
    for (std::size_t i = 0; i < na; ++i) a[i] = next();
    for (std::size_t i = 0; i < nb; ++i) b[i] = next();
    for (std::size_t i = 0; i < nc; ++i) c[i] = 0.f;
    g = Gemm{s.ta, s.tb, s.m, s.n, s.k, a.get(), s.ta ? s.m : s.k, b.get(), s.tb ? s.k : s.n, c.get(), s.n};
  }
};

/// "" when g.c holds op(A)·op(B) to f32 accuracy (checked in double), else what is wrong.
std::string check(const Gemm& g) {
  double worst = 0, scale = 0;
  for (int i = 0; i < g.m; ++i)
    for (int j = 0; j < g.n; ++j) {
      double s = 0;
      for (int p = 0; p < g.k; ++p)
        s += double(g.ta ? g.a[std::size_t(p) * g.lda + i] : g.a[std::size_t(i) * g.lda + p]) *
             double(g.tb ? g.b[std::size_t(j) * g.ldb + p] : g.b[std::size_t(p) * g.ldb + j]);
      worst = std::max(worst, std::abs(s - double(g.c[std::size_t(i) * g.ldc + j])));
      scale = std::max(scale, std::abs(s));
    }
  if (worst <= 1e-5 * std::sqrt(double(g.k)) * std::max(scale, 1.0)) return "";
  return "wrong result: max error " + std::to_string(worst) + " (max |C| " + std::to_string(scale) + ")";
}

/// A back end: supports() says which cases it runs, prepare() returns its per-shape state (a JIT
/// kernel; anything non-null otherwise), call() is the timed product.
struct Backend {
  const char* name;
  bool (*supports)(const Case&);
  void* (*prepare)(const Gemm&);
  void (*call)(void*, const Gemm&);
};

bool any(const Case&) { return true; }
bool gemv_shape(const Case& s) { return s.m == 1 && !s.ta && !s.tb; }
void* ready(const Gemm&) { return reinterpret_cast<void*>(1); }

void openblas(void*, const Gemm& g) {
  cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, 1.f,
              g.a, g.lda, g.b, g.ldb, 0.f, g.c, g.ldc);
}

// Batch 1: y[n] = x[k]·B[k,n] is a matrix-vector product, y = B^T x.
void openblas_gemv(void*, const Gemm& g) {
  cblas_sgemv(CblasRowMajor, CblasTrans, g.k, g.n, 1.f, g.b, g.ldb, g.a, 1, 0.f, g.c, 1);
}

// The same by hand: rows of B scaled by x[p] and summed, a loop GCC vectorises over n.
void hand_gemv(void*, const Gemm& g) {
  float* __restrict y = g.c;
  for (int j = 0; j < g.n; ++j) y[j] = 0.f;
  for (int p = 0; p < g.k; ++p) {
    const float xp = g.a[p];
    const float* __restrict row = g.b + std::size_t(p) * g.ldb;
    for (int j = 0; j < g.n; ++j) y[j] += xp * row[j];
  }
}

#if STAGECRAFT_BENCH_DNNL
void onednn(void*, const Gemm& g) {
  dnnl_sgemm(g.ta ? 'T' : 'N', g.tb ? 'T' : 'N', g.m, g.n, g.k, 1.f, g.a, g.lda, g.b, g.ldb, 0.f, g.c, g.ldc);
}
#endif
#if STAGECRAFT_BENCH_BLIS
void blis(void*, const Gemm& g) { blas_libs::blis_gemm(g); }
#endif
#if STAGECRAFT_BENCH_XSMM
void xsmm(void*, const Gemm& g) { blas_libs::xsmm_gemm(g); }
void* xsmm_jit_prepare(const Gemm& g) { return blas_libs::xsmm_dispatch(g); }
void xsmm_jit(void* kernel, const Gemm& g) { blas_libs::xsmm_run(kernel, g); }
#endif

const Backend backends[] = {
    {"openblas", any, ready, openblas},
    {"openblas_sgemv", gemv_shape, ready, openblas_gemv},
    {"hand_gemv", gemv_shape, ready, hand_gemv},
#if STAGECRAFT_BENCH_BLIS
    {"blis", any, ready, blis},
#endif
#if STAGECRAFT_BENCH_DNNL
    {"onednn", any, ready, onednn},
#endif
#if STAGECRAFT_BENCH_XSMM
    {"libxsmm", any, ready, xsmm},
    {"libxsmm_jit", any, xsmm_jit_prepare, xsmm_jit},
#endif
};

void run(benchmark::State& state, const Backend* be, const Case* s) {
  Operands ops(*s);
  void* ctx = be->prepare(ops.g);
  if (ctx == nullptr) {
    state.SkipWithError("no kernel for this shape/layout");
    return;
  }
  // Checked once per back end and case, not on every repetition.
  static std::map<std::pair<const Backend*, const Case*>, std::string> verdicts;
  auto [it, fresh] = verdicts.try_emplace({be, s});
  if (fresh) {
    be->call(ctx, ops.g);
    it->second = check(ops.g);
  }
  if (!it->second.empty()) {
    state.SkipWithError(it->second.c_str());
    return;
  }
  for (auto _ : state) {
    be->call(ctx, ops.g);
    benchmark::ClobberMemory();
  }
  state.counters["FLOPS"] = benchmark::Counter(2.0 * s->m * s->n * s->k, benchmark::Counter::kIsIterationInvariantRate);
}

std::string shape_name(const Case& s) {
  return std::string(s.ta ? "T" : "N") + (s.tb ? "T" : "N") + "/M:" + std::to_string(s.m) + "/K:" +
         std::to_string(s.k) + "/N:" + std::to_string(s.n) + "/" + s.label;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  bench::setup();
  // What stagecraft would run: its fallback rule applied (OPENBLAS_CORETYPE is respected unless
  // STAGECRAFT_BLAS_CORE=auto; see backend/cpu/blas_core.hpp).
  const auto& core = sc::ensure_blas_core();
  benchmark::AddCustomContext("openblas_core", core.before == core.after ? core.after : core.before + " -> " + core.after);
#if STAGECRAFT_BENCH_BLIS
  if (const std::string err = blas_libs::blis_load(bench::threads()); !err.empty()) {
    std::fprintf(stderr, "BLIS: %s\n", err.c_str());
    return 1;
  }
  benchmark::AddCustomContext("blis", blas_libs::blis_arch() + " (" STAGECRAFT_BENCH_BLIS_SO ")");
#endif
#if STAGECRAFT_BENCH_DNNL
  const dnnl_version_t* v = dnnl_version();
  benchmark::AddCustomContext("onednn", std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                                            std::to_string(v->patch) + " (cpu runtime " +
                                            std::to_string(v->cpu_runtime) + ")");
#endif
#if STAGECRAFT_BENCH_XSMM
  benchmark::AddCustomContext("libxsmm", blas_libs::xsmm_info());
#endif
  // Case by case, so one shape's back ends run close together in time (the machine drifts).
  for (const Case& s : cases)
    for (const Backend& be : backends)
      if (be.supports(s))
        benchmark::RegisterBenchmark(("gemm/" + std::string(be.name) + "/" + shape_name(s)).c_str(), run, &be, &s)
            ->UseRealTime();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
