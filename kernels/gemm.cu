// Matrix products: cuBLAS for f32/f64 (row-major operands read transposed by flags, never copied),
// a plain kernel for integers (cuBLAS has none), one cuBLAS handle per device on its stream; and
// f32 products with a bias (and ReLU) epilogue in one cuBLASLt call, for the staged plans.
#include <climits>
#include <cublasLt.h>
#include <cublas_v2.h>

#include <map>
#include <mutex>
#include <tuple>

#include "common.cuh"

namespace stagecraft::cuda::kernels {
namespace {

/// cuBLAS statuses are reported through the Status channel as the closest CUDA error.
Status from_cublas(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return cudaSuccess;
    case CUBLAS_STATUS_ALLOC_FAILED: return cudaErrorMemoryAllocation;
    case CUBLAS_STATUS_NOT_SUPPORTED: return cudaErrorNotSupported;
    case CUBLAS_STATUS_INVALID_VALUE: return cudaErrorInvalidValue;
    default: return cudaErrorUnknown;
  }
}

constexpr int max_devices = 64;

/// Held from binding a device's handle to a stream until its calls are queued: another thread's
/// binding in between would send them to its stream (a graph's capture stream, or the device's).
std::mutex& handle_mutex(int device) {
  static std::mutex mu[max_devices];
  return mu[device];
}

/// The workspace cuBLAS and cuBLASLt calls on a device share (in stream order: every call is
/// queued on the device's stream, or recorded into a graph that runs there). Allocated once, not
/// stream-ordered: given one, cuBLAS allocates nothing while a graph is captured (memory nodes,
/// which a conditional node's body may not hold), and cuBLASLt may choose the algorithms that need
/// one. 32 MiB is NVIDIA's advice for Hopper.
struct Workspace {
  void* p = nullptr;
  std::size_t bytes = 0;
};
constexpr std::size_t workspace_bytes = std::size_t{32} << 20;

/// The device's workspace; none (0 bytes) where it could not be allocated (then calls take the
/// algorithms that need none). The caller holds handle_mutex(device).
Workspace workspace(int device) {
  static Workspace ws[max_devices];
  static bool tried[max_devices] = {};
  if (!tried[device]) {
    tried[device] = true;
    void* p = nullptr;
    if (cudaMalloc(&p, workspace_bytes) == cudaSuccess) ws[device] = {p, workspace_bytes};
    else cudaGetLastError();  // not an error of later launches
  }
  return ws[device];
}

/// The device's handle, created on first use and bound to `s` (with the device's workspace:
/// binding a stream resets it) when its last call was on another stream (a capture's, say); the
/// caller holds handle_mutex(device).
Status handle_for(int device, cudaStream_t s, cublasHandle_t* out) {
  static cublasHandle_t handles[max_devices] = {};
  static cudaStream_t bound[max_devices] = {};  // the stream each handle is bound to (null: none yet)
  if (!handles[device])
    if (const Status st = from_cublas(cublasCreate(&handles[device]))) return st;
  *out = handles[device];
  if (bound[device] == s && s != nullptr) return cudaSuccess;
  bound[device] = nullptr;  // (until both calls succeed)
  if (const Status st = from_cublas(cublasSetStream(*out, s))) return st;
  const Workspace ws = workspace(device);
  if (ws.p)
    if (const Status st = from_cublas(cublasSetWorkspace(*out, ws.p, ws.bytes))) return st;
  bound[device] = s;
  return cudaSuccess;
}

// Row-major C (M x N) is column-major C^T (N x M) = op(B)^T op(A)^T: cuBLAS gets B first. A stored
// M x K (ld K) is column-major A^T, so it needs no transpose; stored K x M (ta, ld M) it needs one.
template <class T, class Gemm>
Status blas(Gemm gemm, cublasHandle_t h, const T* a, const T* b, T* c, const abi::GemmArgs& g) {
  const T one = 1, zero = 0;
  const cublasOperation_t opa = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int M = static_cast<int>(g.M), N = static_cast<int>(g.N), K = static_cast<int>(g.K);
  const int lda = g.ta ? M : K, ldb = g.tb ? K : N;
  const long long mn = static_cast<long long>(g.M) * g.N;
  // cuBLAS counts in int: the host refused larger dimensions (abi.hpp), and more batches than an
  // int holds go in several calls.
  if (g.M > INT_MAX || g.N > INT_MAX || g.K > INT_MAX) return cudaErrorInvalidValue;
  if (!g.a_offsets && !g.b_offsets) {
    for (std::int64_t i = 0; i < g.batch; i += INT_MAX) {
      const int count = static_cast<int>(std::min<std::int64_t>(g.batch - i, INT_MAX));
      if (const Status st = from_cublas(gemm(h, opb, opa, N, M, K, &one, b + i * g.b_stride, ldb, g.b_stride,
                                             a + i * g.a_stride, lda, g.a_stride, &zero, c + i * mn, N, mn, count)))
        return st;
    }
    return cudaSuccess;
  }
  for (std::int64_t i = 0; i < g.batch; ++i) {  // batches broadcast unevenly: one call each
    const T* ai = a + (g.a_offsets ? g.a_offsets[i] : i * g.a_stride);
    const T* bi = b + (g.b_offsets ? g.b_offsets[i] : i * g.b_stride);
    if (const Status st = from_cublas(gemm(h, opb, opa, N, M, K, &one, bi, ldb, 0, ai, lda, 0, &zero, c + i * mn, N, mn, 1)))
      return st;
  }
  return cudaSuccess;
}

/// One thread per element of C; sums wrap as the CPU's integer products do.
template <class T>
__global__ void int_gemm_kernel(const T* a, const T* b, T* c, std::int64_t M, std::int64_t N, std::int64_t K,
                                bool ta, bool tb) {
  using U = std::make_unsigned_t<T>;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < M * N;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t m = i / N, n = i % N;
    U acc = 0;
    for (std::int64_t k = 0; k < K; ++k)
      acc += static_cast<U>(a[ta ? k * M + m : m * K + k]) * static_cast<U>(b[tb ? n * K + k : k * N + n]);
    c[i] = static_cast<T>(acc);
  }
}

template <class T>
Status int_gemm(const T* a, const T* b, T* c, const abi::GemmArgs& g, cudaStream_t s) {
  for (std::int64_t i = 0; i < g.batch; ++i) {
    const T* ai = a + (g.a_offsets ? g.a_offsets[i] : i * g.a_stride);
    const T* bi = b + (g.b_offsets ? g.b_offsets[i] : i * g.b_stride);
    int_gemm_kernel<T><<<grid_for(g.M * g.N), block_threads, 0, s>>>(ai, bi, c + i * g.M * g.N, g.M, g.N, g.K, g.ta, g.tb);
    if (const Status st = launched()) return st;
  }
  return cudaSuccess;
}

// ---- cuBLASLt: C = relu?(A B + bias), bias broadcast over C's rows -------------------------------

/// One matmul's cuBLASLt set-up: descriptors and the heuristic's algorithm, kept per device and
/// shape (a staged plan calls the same shapes at every step: the heuristic runs once).
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};
/// What a cuBLASLt call does after the product.
enum class Epi : int { bias, relu_bias, bgrad_b };
using LtKey = std::tuple<int, std::int64_t, std::int64_t, std::int64_t, bool, bool, Epi>;

Status lt_handle(int device, cublasLtHandle_t* out) {
  static cublasLtHandle_t handles[max_devices] = {};
  if (!handles[device])
    if (const Status st = from_cublas(cublasLtCreate(&handles[device]))) return st;
  *out = handles[device];
  return cudaSuccess;
}

/// The plan of key, made on first use; the caller holds handle_mutex(device). not_supported when
/// cuBLASLt takes no such product (the caller then falls back), whatever status its set-up or
/// heuristic refuses with: an epilogue's layout rules (BGRADA takes only an untransposed A, for
/// one) may read as INVALID_VALUE rather than NOT_SUPPORTED or no algorithm, and nothing was
/// queued. The refusal is kept (a plan without descriptors): the heuristic is asked once.
Status lt_plan(cublasLtHandle_t h, const LtKey& key, const LtPlan** out) {
  static std::map<LtKey, LtPlan> by_device[max_devices];  // each guarded by its handle_mutex
  std::map<LtKey, LtPlan>& plans = by_device[std::get<0>(key)];
  if (const auto it = plans.find(key); it != plans.end()) {
    *out = &it->second;
    return it->second.op ? cudaSuccess : abi::not_supported;
  }
  const auto [device, M, N, K, ta, tb, epi] = key;
  LtPlan p;
  // Row-major C (M x N) is column-major C^T (N x M) = op(B)^T op(A)^T, as blas() above: cuBLASLt's
  // first operand is B, stored column-major N x K (ld N), or K x N (ld K) when tb; the bias runs
  // along C^T's rows, which are C's columns.
  const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  // (BGRADA: cuBLASLt's first operand is our b; its sums over K run along D's rows, our columns.)
  const cublasLtEpilogue_t epilogue = epi == Epi::bias        ? CUBLASLT_EPILOGUE_BIAS
                                      : epi == Epi::relu_bias ? CUBLASLT_EPILOGUE_RELU_BIAS
                                                              : CUBLASLT_EPILOGUE_BGRADA;
  auto fail = [&](cublasStatus_t) {
    if (p.op) cublasLtMatmulDescDestroy(p.op);
    for (cublasLtMatrixLayout_t l : {p.a, p.b, p.c})
      if (l) cublasLtMatrixLayoutDestroy(l);
    *out = &plans.emplace(key, LtPlan{}).first->second;
    return abi::not_supported;
  };
  cublasStatus_t st = cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&p.b, CUDA_R_32F, tb ? K : N, tb ? N : K, tb ? K : N);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&p.a, CUDA_R_32F, ta ? M : K, ta ? K : M, ta ? M : K);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, N, M, N);
  if (st != CUBLAS_STATUS_SUCCESS) return fail(st);
  // At most the device's workspace (the algorithms that need more are left out).
  cublasLtMatmulPreference_t pref = nullptr;
  st = cublasLtMatmulPreferenceCreate(&pref);
  const std::size_t max_workspace = workspace(device).bytes;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace,
                                              sizeof max_workspace);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulAlgoGetHeuristic(h, p.op, p.b, p.a, p.c, p.c, pref, 1, &result, &found);
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && found == 0) st = CUBLAS_STATUS_NOT_SUPPORTED;
  if (st != CUBLAS_STATUS_SUCCESS) return fail(st);
  p.algo = result.algo;
  *out = &plans.emplace(key, p).first->second;
  return cudaSuccess;
}

/// c = op(a) op(b) with key's epilogue, whose vector (the bias read, or the bias gradient
/// written) is at `vec`; the caller holds handle_mutex(device). not_supported when cuBLASLt has
/// no algorithm (nothing queued).
Status lt_matmul(cublasLtHandle_t h, const LtKey& key, const void* a, const void* b, const void* vec, void* c,
                 abi::Stream s) {
  const LtPlan* p = nullptr;
  if (const Status e = lt_plan(h, key, &p)) return e;
  if (const Status e = from_cublas(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec,
                                                                  sizeof vec)))
    return e;
  const float one = 1, zero = 0;
  const Workspace ws = workspace(std::get<0>(key));
  return from_cublas(cublasLtMatmul(h, p->op, &one, b, p->b, a, p->a, &zero, c, p->c, c, p->c, &p->algo, ws.p, ws.bytes,
                                    static_cast<cudaStream_t>(s)));
}

}  // namespace
}  // namespace stagecraft::cuda::kernels

namespace stagecraft::cuda::abi {
using namespace stagecraft::cuda::kernels;

Status gemm(DT dt, const void* a, const void* b, void* c, const GemmArgs& g, int device, Stream s) noexcept {
  if (g.M == 0 || g.N == 0 || g.batch == 0) return cudaSuccess;
  const auto st = static_cast<cudaStream_t>(s);
  if (g.K == 0) return static_cast<Status>(cudaMemsetAsync(c, 0, g.M * g.N * g.batch * (dt == DT::f32 || dt == DT::i32 ? 4 : 8), st));
  switch (dt) {
    case DT::i32: return int_gemm(static_cast<const std::int32_t*>(a), static_cast<const std::int32_t*>(b),
                                  static_cast<std::int32_t*>(c), g, st);
    case DT::i64: return int_gemm(static_cast<const std::int64_t*>(a), static_cast<const std::int64_t*>(b),
                                  static_cast<std::int64_t*>(c), g, st);
    default: break;
  }
  if (device < 0 || device >= max_devices) return cudaErrorInvalidDevice;
  const std::lock_guard<std::mutex> lock(handle_mutex(device));
  cublasHandle_t h = nullptr;
  if (const Status e = handle_for(device, st, &h)) return e;
  if (dt == DT::f32)
    return blas(cublasSgemmStridedBatched, h, static_cast<const float*>(a), static_cast<const float*>(b),
                static_cast<float*>(c), g);
  if (dt == DT::f64)
    return blas(cublasDgemmStridedBatched, h, static_cast<const double*>(a), static_cast<const double*>(b),
                static_cast<double*>(c), g);
  return cudaErrorNotSupported;
}

Status gemm_bias(DT dt, const void* a, const void* b, const void* bias, void* c, const GemmArgs& g, bool relu, int device,
                 Stream s) noexcept {
  if (dt != DT::f32 || g.batch != 1 || g.a_offsets || g.b_offsets) return cudaErrorNotSupported;
  if (g.M == 0 || g.N == 0) return cudaSuccess;
  if (g.K == 0) return cudaErrorNotSupported;  // C is the bias alone: the caller's fallback does it
  if (device < 0 || device >= max_devices) return cudaErrorInvalidDevice;
  const std::lock_guard<std::mutex> lock(handle_mutex(device));
  cublasLtHandle_t h = nullptr;
  if (const Status e = lt_handle(device, &h)) return e;
  return lt_matmul(h, LtKey{device, g.M, g.N, g.K, g.ta, g.tb, relu ? Epi::relu_bias : Epi::bias}, a, b, bias, c, s);
}

Status gemm_bgrad(DT dt, const void* a, const void* b, void* c, void* bgrad, const GemmArgs& g, int device,
                  Stream s) noexcept {
  if (dt != DT::f32 || g.batch != 1 || g.a_offsets || g.b_offsets || g.tb) return cudaErrorNotSupported;
  if (g.M == 0 || g.N == 0 || g.K == 0) return cudaErrorNotSupported;  // nothing to sum, or an empty product: the fallback
  if (device < 0 || device >= max_devices) return cudaErrorInvalidDevice;
  const std::lock_guard<std::mutex> lock(handle_mutex(device));
  cublasLtHandle_t h = nullptr;
  if (const Status e = lt_handle(device, &h)) return e;
  return lt_matmul(h, LtKey{device, g.M, g.N, g.K, g.ta, g.tb, Epi::bgrad_b}, a, b, bgrad, c, s);
}

}  // namespace stagecraft::cuda::abi
