// conv2d and its two gradients through cuDNN, loaded at run time (dlopen): the library needs cuDNN
// neither to build nor to run, only its header to compile this file (without it, or without the
// shared library at run time, every call here is not_supported and the im2col + cuBLAS kernels
// run instead). cuDNN's legacy convolution API (deprecated in cuDNN 9 in favour of its graph API,
// still shipped and supported), one handle per device bound to the device's stream at each call,
// a fixed workspace per device (never reallocated: CUDA graphs hold its address), algorithms from
// cuDNN's heuristic (no timed search: nothing runs while one is chosen, so a call being captured
// into a graph can choose), kept per shape.
//
// The numbers: full FP32 (CUDNN_FMA_MATH: no TF32 tensor cores, as the cuBLAS products), only
// deterministic algorithms (the same bits at every run, as the other kernels), and no FFT or
// Winograd algorithm (their rounding is not a direct sum's).
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "common.cuh"

#if __has_include(<cudnn.h>)
#include <cudnn.h>
#define SC_HAVE_CUDNN_HEADER 1
#else
#define SC_HAVE_CUDNN_HEADER 0
#endif

#if SC_HAVE_CUDNN_HEADER
namespace stagecraft::cuda::kernels {
namespace {

/// The cuDNN functions used, resolved from the loaded library.
struct Api {
  decltype(&cudnnGetVersion) get_version = nullptr;
  decltype(&cudnnCreate) create = nullptr;
  decltype(&cudnnSetStream) set_stream = nullptr;
  decltype(&cudnnCreateTensorDescriptor) create_tensor = nullptr;
  decltype(&cudnnSetTensor4dDescriptor) set_tensor = nullptr;
  decltype(&cudnnDestroyTensorDescriptor) destroy_tensor = nullptr;
  decltype(&cudnnCreateFilterDescriptor) create_filter = nullptr;
  decltype(&cudnnSetFilter4dDescriptor) set_filter = nullptr;
  decltype(&cudnnDestroyFilterDescriptor) destroy_filter = nullptr;
  decltype(&cudnnCreateConvolutionDescriptor) create_conv = nullptr;
  decltype(&cudnnSetConvolution2dDescriptor) set_conv = nullptr;
  decltype(&cudnnSetConvolutionMathType) set_math = nullptr;
  decltype(&cudnnDestroyConvolutionDescriptor) destroy_conv = nullptr;
  decltype(&cudnnGetConvolutionForwardAlgorithm_v7) fwd_algos = nullptr;
  decltype(&cudnnGetConvolutionBackwardDataAlgorithm_v7) bwd_data_algos = nullptr;
  decltype(&cudnnGetConvolutionBackwardFilterAlgorithm_v7) bwd_filter_algos = nullptr;
  decltype(&cudnnConvolutionForward) forward = nullptr;
  decltype(&cudnnConvolutionBackwardData) backward_data = nullptr;
  decltype(&cudnnConvolutionBackwardFilter) backward_filter = nullptr;
};

/// What loading found: the API (null when the library could not be used) and why not.
struct Loaded {
  const Api* api = nullptr;
  int version = 0;
  char why[256] = {};
};

/// Resolves `name` into `fn`; false (and `why` names it) when the library lacks it.
template <class F>
bool resolve(void* lib, const char* name, F& fn, Loaded& out) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn) std::snprintf(out.why, sizeof out.why, "the cuDNN library has no %s", name);
  return fn != nullptr;
}

/// Opens the library once: $STAGECRAFT_CUDNN (a path) if set, else libcudnn.so.<the header's
/// major> from the loader's path, else from the directory the build found it in.
const Loaded& loaded() {
  static const Loaded state = [] {
    Loaded out;
    char name[64];
    std::snprintf(name, sizeof name, "libcudnn.so.%d", CUDNN_MAJOR);
    void* lib = nullptr;
    const char* forced = std::getenv("STAGECRAFT_CUDNN");
    if (forced && *forced) {
      lib = dlopen(forced, RTLD_NOW | RTLD_LOCAL);
    } else {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
#ifdef STAGECRAFT_CUDNN_DIR
      if (!lib) {
        char path[1024];
        std::snprintf(path, sizeof path, "%s/%s", STAGECRAFT_CUDNN_DIR, name);
        lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      }
#endif
    }
    if (!lib) {
      const char* e = dlerror();
      std::snprintf(out.why, sizeof out.why, "cannot load %s: %s", forced && *forced ? forced : name, e ? e : "?");
      return out;
    }
    static Api api;  // filled once, under the static's initialisation guard
    const bool ok =
        resolve(lib, "cudnnGetVersion", api.get_version, out) && resolve(lib, "cudnnCreate", api.create, out) &&
        resolve(lib, "cudnnSetStream", api.set_stream, out) &&
        resolve(lib, "cudnnCreateTensorDescriptor", api.create_tensor, out) &&
        resolve(lib, "cudnnSetTensor4dDescriptor", api.set_tensor, out) &&
        resolve(lib, "cudnnDestroyTensorDescriptor", api.destroy_tensor, out) &&
        resolve(lib, "cudnnCreateFilterDescriptor", api.create_filter, out) &&
        resolve(lib, "cudnnSetFilter4dDescriptor", api.set_filter, out) &&
        resolve(lib, "cudnnDestroyFilterDescriptor", api.destroy_filter, out) &&
        resolve(lib, "cudnnCreateConvolutionDescriptor", api.create_conv, out) &&
        resolve(lib, "cudnnSetConvolution2dDescriptor", api.set_conv, out) &&
        resolve(lib, "cudnnSetConvolutionMathType", api.set_math, out) &&
        resolve(lib, "cudnnDestroyConvolutionDescriptor", api.destroy_conv, out) &&
        resolve(lib, "cudnnGetConvolutionForwardAlgorithm_v7", api.fwd_algos, out) &&
        resolve(lib, "cudnnGetConvolutionBackwardDataAlgorithm_v7", api.bwd_data_algos, out) &&
        resolve(lib, "cudnnGetConvolutionBackwardFilterAlgorithm_v7", api.bwd_filter_algos, out) &&
        resolve(lib, "cudnnConvolutionForward", api.forward, out) &&
        resolve(lib, "cudnnConvolutionBackwardData", api.backward_data, out) &&
        resolve(lib, "cudnnConvolutionBackwardFilter", api.backward_filter, out);
    if (!ok) return out;  // the library stays open: harmless, and its symbols may be in use elsewhere
    out.version = static_cast<int>(api.get_version());
    // The legacy API's structures (the algorithm lists) are laid out as this header says only
    // within one major version. cuDNN 9 numbers versions major * 10000 + minor * 100 + patch
    // (91900), cuDNN 8 major * 1000 + minor * 100 + patch (8907).
    const int major = out.version < 10000 ? out.version / 1000 : out.version / 10000;
    if (major != CUDNN_MAJOR) {
      std::snprintf(out.why, sizeof out.why, "the loaded cuDNN is version %d, built against %d.x", out.version,
                    CUDNN_MAJOR);
      return out;
    }
    out.api = &api;
    return out;
  }();
  return state;
}

/// cuDNN statuses through the Status channel: NOT_SUPPORTED lets the caller fall back.
Status from_cudnn(cudnnStatus_t s) {
  switch (s) {
    case CUDNN_STATUS_SUCCESS: return cudaSuccess;
    case CUDNN_STATUS_ALLOC_FAILED: return cudaErrorMemoryAllocation;
    case CUDNN_STATUS_NOT_SUPPORTED: return abi::not_supported;
    case CUDNN_STATUS_BAD_PARAM: return cudaErrorInvalidValue;
    case CUDNN_STATUS_EXECUTION_FAILED: return cudaErrorLaunchFailure;
    default: return cudaErrorUnknown;
  }
}

constexpr int max_devices = 64;
/// Each device's workspace: algorithms that need more are not chosen. Sized for the implicit-GEMM
/// algorithms of the layers the benchmarks use; allocated once, never moved.
constexpr std::size_t workspace_bytes = std::size_t{64} << 20;


/// One convolution's descriptors and algorithm, made once per device, pass, dtype and geometry (never freed: few shapes, and a CUDA graph may replay them).
struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int algo = -1;
  std::size_t workspace = 0;
};
/// pass, dtype, N, C, H, W, O, kh, kw, stride, pad.
using PlanKey = std::tuple<int, int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                           std::int64_t, std::int64_t, std::int64_t>;

/// A device's handle, workspace and plans, guarded by `mu` from binding the handle to a stream
/// until the call is queued (another thread's binding in between would send it to its stream).
struct DeviceState {
  std::mutex mu;
  cudnnHandle_t handle = nullptr;
  bool tried = false;
  Status failed = cudaSuccess;  ///< why the handle could not be made (then every call is not_supported)
  void* workspace = nullptr;
  std::size_t workspace_size = 0;
  std::map<PlanKey, ConvPlan> plans;
};
DeviceState& device_state(int device) {
  static DeviceState states[max_devices];
  return states[device];
}

/// The device's handle, made on first use (with its workspace: none if that allocation fails);
/// the caller holds d.mu.
Status handle(const Api& api, DeviceState& d) {
  if (!d.tried) {
    d.tried = true;
    d.failed = from_cudnn(api.create(&d.handle));
    if (d.failed == cudaSuccess && cudaMalloc(&d.workspace, workspace_bytes) == cudaSuccess)
      d.workspace_size = workspace_bytes;
    else cudaGetLastError();  // not an error of later launches
  }
  return d.failed;
}

/// Whether an algorithm sums the products as a direct convolution does: FFT and Winograd
/// transforms round differently, far more than a reordered sum (with them allowed, the filter
/// gradient of the Fashion-MNIST CNN's first layer, x [32,1,28,28] by w [8,1,5,5], was off the CPU's by
/// up to 4% in an element on an H100; the direct algorithms stay within 1e-4).
bool direct(cudnnConvolutionFwdAlgo_t a) {
  return a != CUDNN_CONVOLUTION_FWD_ALGO_FFT && a != CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING &&
         a != CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD && a != CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
bool direct(cudnnConvolutionBwdDataAlgo_t a) {
  return a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT && a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING &&
         a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD && a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
bool direct(cudnnConvolutionBwdFilterAlgo_t a) {
  return a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT && a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING &&
         a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD && a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

/// The first of the heuristic's algorithms (best first) that works, is deterministic, computes in
/// full precision without transforms (direct) and fits the workspace; -1 when none does.
template <class Perf>
int pick(const Perf* perf, int n, std::size_t limit, std::size_t* need) {
  for (int i = 0; i < n; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.determinism != CUDNN_DETERMINISTIC || p.memory > limit) continue;
    if (!direct(p.algo)) continue;
    if (p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;
    *need = p.memory;
    return static_cast<int>(p.algo);
  }
  return -1;
}

/// The plan of `key` on the device d, made on first use (the caller holds d.mu); not_supported when
/// cuDNN takes no such convolution or has no algorithm for it: any refusal while setting it up
/// (a descriptor cuDNN rejects, no algorithm, an allocation) leaves the convolution to the im2col
/// kernels, and is remembered (a plan with no algorithm) so that it is not asked again.
Status plan_for(const Api& api, DeviceState& d, const PlanKey& key, const abi::ConvGeometry& g, std::int64_t O,
                const ConvPlan** out) {
  if (const auto it = d.plans.find(key); it != d.plans.end()) {
    *out = &it->second;
    return it->second.algo < 0 ? abi::not_supported : cudaSuccess;
  }
  const auto pass = static_cast<abi::ConvPass>(std::get<0>(key));
  const cudnnDataType_t type = static_cast<abi::DT>(std::get<1>(key)) == abi::DT::f32 ? CUDNN_DATA_FLOAT : CUDNN_DATA_DOUBLE;
  ConvPlan p;
  auto decline = [&] {
    if (p.x) api.destroy_tensor(p.x);
    if (p.y) api.destroy_tensor(p.y);
    if (p.w) api.destroy_filter(p.w);
    if (p.conv) api.destroy_conv(p.conv);
    *out = &d.plans.emplace(key, ConvPlan{}).first->second;
    return abi::not_supported;
  };
  auto i = [](std::int64_t v) { return static_cast<int>(v); };
  cudnnStatus_t st = api.create_tensor(&p.x);
  if (st == CUDNN_STATUS_SUCCESS) st = api.create_tensor(&p.y);
  if (st == CUDNN_STATUS_SUCCESS) st = api.create_filter(&p.w);
  if (st == CUDNN_STATUS_SUCCESS) st = api.create_conv(&p.conv);
  if (st == CUDNN_STATUS_SUCCESS) st = api.set_tensor(p.x, CUDNN_TENSOR_NCHW, type, i(g.N), i(g.C), i(g.H), i(g.W));
  if (st == CUDNN_STATUS_SUCCESS) st = api.set_tensor(p.y, CUDNN_TENSOR_NCHW, type, i(g.N), i(O), i(g.Ho), i(g.Wo));
  if (st == CUDNN_STATUS_SUCCESS) st = api.set_filter(p.w, type, CUDNN_TENSOR_NCHW, i(O), i(g.C), i(g.kh), i(g.kw));
  if (st == CUDNN_STATUS_SUCCESS)
    st = api.set_conv(p.conv, i(g.pad), i(g.pad), i(g.stride), i(g.stride), 1, 1, CUDNN_CROSS_CORRELATION, type);
  if (st == CUDNN_STATUS_SUCCESS) st = api.set_math(p.conv, CUDNN_FMA_MATH);
  if (st != CUDNN_STATUS_SUCCESS) return decline();
  int n = 0;
  switch (pass) {
    case abi::ConvPass::forward: {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      st = api.fwd_algos(d.handle, p.x, p.w, p.conv, p.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf);
      if (st == CUDNN_STATUS_SUCCESS) p.algo = pick(perf, n, d.workspace_size, &p.workspace);
      break;
    }
    case abi::ConvPass::grad_input: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      st = api.bwd_data_algos(d.handle, p.w, p.y, p.conv, p.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf);
      if (st == CUDNN_STATUS_SUCCESS) p.algo = pick(perf, n, d.workspace_size, &p.workspace);
      break;
    }
    case abi::ConvPass::grad_filter: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      st = api.bwd_filter_algos(d.handle, p.x, p.y, p.conv, p.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf);
      if (st == CUDNN_STATUS_SUCCESS) p.algo = pick(perf, n, d.workspace_size, &p.workspace);
      break;
    }
  }
  if (st != CUDNN_STATUS_SUCCESS || p.algo < 0) return decline();
  *out = &d.plans.emplace(key, p).first->second;  // std::map: the address stays valid
  return cudaSuccess;
}

/// A convolution cuDNN's descriptors take: no empty axis (an empty sum is the im2col path's
/// zeros) and every size within an int.
bool describable(const abi::ConvGeometry& g, std::int64_t O) {
  constexpr std::int64_t m = 0x7fffffff;
  for (std::int64_t v : {g.N, g.C, g.H, g.W, g.kh, g.kw, g.stride, g.Ho, g.Wo, O})
    if (v < 1 || v > m) return false;
  return g.pad >= 0 && g.pad <= m;
}

}  // namespace
}  // namespace stagecraft::cuda::kernels
#endif  // SC_HAVE_CUDNN_HEADER

namespace stagecraft::cuda::abi {

int cudnn_version(char* why, std::size_t why_size) noexcept {
#if SC_HAVE_CUDNN_HEADER
  const kernels::Loaded& l = kernels::loaded();
  if (why && why_size) std::snprintf(why, why_size, "%s", l.api ? "" : l.why);
  return l.api ? l.version : 0;
#else
  if (why && why_size) std::snprintf(why, why_size, "%s", "stagecraft's kernels were built without cudnn.h");
  return 0;
#endif
}

Status cudnn_conv(ConvPass pass, DT dt, const void* a, const void* b, void* out, const ConvGeometry& g, std::int64_t O,
                  int device, Stream s) noexcept {
#if SC_HAVE_CUDNN_HEADER
  using namespace stagecraft::cuda::kernels;
  const Loaded& l = loaded();
  if (!l.api || (dt != DT::f32 && dt != DT::f64) || !describable(g, O)) return not_supported;
  if (device < 0 || device >= max_devices) return cudaErrorInvalidDevice;
  const Api& api = *l.api;
  DeviceState& d = device_state(device);
  const std::lock_guard<std::mutex> lock(d.mu);
  if (handle(api, d) != cudaSuccess) return not_supported;
  const ConvPlan* p = nullptr;
  const PlanKey key{static_cast<int>(pass), static_cast<int>(dt), g.N, g.C, g.H, g.W, O, g.kh, g.kw, g.stride, g.pad};
  if (const Status e = plan_for(api, d, key, g, O, &p)) return e;
  if (const Status e = from_cudnn(api.set_stream(d.handle, static_cast<cudaStream_t>(s)))) return e;
  // alpha and beta are read as the compute type: double for f64, float for f32.
  const double one_d = 1, zero_d = 0;
  const float one_f = 1, zero_f = 0;
  const void* one = dt == DT::f64 ? static_cast<const void*>(&one_d) : &one_f;
  const void* zero = dt == DT::f64 ? static_cast<const void*>(&zero_d) : &zero_f;
  // The whole workspace is offered: a call given less than its algorithm needs fails (BAD_PARAM),
  // and the heuristic's figure (p->workspace, at most this) is not promised to be the amount the
  // call checks against (cudnnGet*WorkspaceSize is); offering more costs nothing.
  const std::size_t ws = d.workspace_size;
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  switch (pass) {
    case ConvPass::forward:  // a = x, b = w, out = y
      st = api.forward(d.handle, one, p->x, a, p->w, b, p->conv, static_cast<cudnnConvolutionFwdAlgo_t>(p->algo),
                       d.workspace, ws, zero, p->y, out);
      break;
    case ConvPass::grad_input:  // a = dy, b = w, out = dx
      st = api.backward_data(d.handle, one, p->w, b, p->y, a, p->conv, static_cast<cudnnConvolutionBwdDataAlgo_t>(p->algo),
                             d.workspace, ws, zero, p->x, out);
      break;
    case ConvPass::grad_filter:  // a = x, b = dy, out = dw
      st = api.backward_filter(d.handle, one, p->x, a, p->y, b, p->conv,
                               static_cast<cudnnConvolutionBwdFilterAlgo_t>(p->algo), d.workspace, ws, zero,
                               p->w, out);
      break;
  }
  return from_cudnn(st);
#else
  (void)pass, (void)dt, (void)a, (void)b, (void)out, (void)g, (void)O, (void)device, (void)s;
  return not_supported;
#endif
}

}  // namespace stagecraft::cuda::abi
