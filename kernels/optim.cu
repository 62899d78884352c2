// The optimizers' fused updates on a GPU (optim/fused.hpp; the CPU runs the same arithmetic as one
// loop per variable): one launch for up to abi::update_max_tensors variables instead of Adam's 12
// ops each (SGD's 2 to 5), or a launch per variable. Each operation rounds on its own, in the
// composite's order (kernels are built with --fmad=false: no contraction), with sqrt and division
// correctly rounded, so the results are the composite's bit for bit.
#include "common.cuh"
#include "stagecraft/ops/rules.hpp"

namespace stagecraft::cuda::kernels {
namespace {

/// An update launch's parameter: up to N variables (launched with the smallest N that holds them),
/// the rate (a device scalar, read when the kernel runs, or lr_host) and the optimizer's constants.
template <int N>
struct UpdateParams {
  abi::UpdateTensor t[N];
  const void* lr;
  const void* decay;  // AdamW's decay factor as a device scalar (flag set), or decay_host
  double lr_host, c0, c1, c2, decay_host;
  int count;
  bool flag;
};
static_assert(sizeof(UpdateParams<abi::update_max_tensors>) <= 4096, "an update's table fits a launch's parameters");

/// Blocks a variable of n elements gets (past that, each thread takes several elements).
__host__ __device__ inline std::int64_t blocks_of(std::int64_t n) {
  const std::int64_t b = (n + block_threads - 1) / block_threads;
  return b < 2048 ? b : 2048;
}

template <class T, int N>
__device__ T rate(const UpdateParams<N>& p) {
  return p.lr != nullptr ? *static_cast<const T*>(p.lr) : static_cast<T>(p.lr_host);
}

/// Adam's arithmetic on element i (in {g, m, v, w}, out {m1, v1, w1}); c0, c1, c2: a1, a2, eps;
/// flag: AdamW's decay first (w - w d).
template <class T>
struct AdamStep {
  T r, a1, a2, e, d;
  bool decayed;
  template <int N>
  __device__ explicit AdamStep(const UpdateParams<N>& p)
      : r(rate<T>(p)), a1(static_cast<T>(p.c0)), a2(static_cast<T>(p.c1)), e(static_cast<T>(p.c2)),
        d(p.decay != nullptr ? *static_cast<const T*>(p.decay) : static_cast<T>(p.decay_host)), decayed(p.flag) {}
  __device__ void operator()(const abi::UpdateTensor& t, std::int64_t i) const {
    const T gi = static_cast<const T*>(t.in[0])[i], m0 = static_cast<const T*>(t.in[1])[i];
    const T v0 = static_cast<const T*>(t.in[2])[i], wt = static_cast<const T*>(t.in[3])[i];
    const T w0 = decayed ? wt - wt * d : wt;
    // the moments stored with subnormals flushed, as optim/fused.hpp's composite and CPU loop
    const T mi = rules::FlushSubnormal::f(T(m0 + (gi - m0) * a1), rules::math::smallest_normal<T>());
    const T vi = rules::FlushSubnormal::f(T(v0 + (gi * gi - v0) * a2), rules::math::smallest_normal<T>());
    const T step = (mi * r) / (rules::Sqrt::f(vi) + e);
    static_cast<T*>(t.out[0])[i] = mi;
    static_cast<T*>(t.out[1])[i] = vi;
    static_cast<T*>(t.out[2])[i] = w0 - step;
  }
};

/// SGD's arithmetic on element i (in {g, w, vel}, out {w1, vel1}); c0: the momentum; flag: Nesterov.
template <class T>
struct SgdStep {
  T r, mu;
  bool nesterov;
  template <int N>
  __device__ explicit SgdStep(const UpdateParams<N>& p)
      : r(rate<T>(p)), mu(static_cast<T>(p.c0)), nesterov(p.flag) {}
  __device__ void operator()(const abi::UpdateTensor& t, std::int64_t i) const {
    const T step = static_cast<const T*>(t.in[0])[i] * r;
    const T w = static_cast<const T*>(t.in[1])[i];
    if (t.in[2] == nullptr) {
      static_cast<T*>(t.out[0])[i] = w - step;
      return;
    }
    const T next = rules::FlushSubnormal::f(T(static_cast<const T*>(t.in[2])[i] * mu - step), rules::math::smallest_normal<T>());
    static_cast<T*>(t.out[1])[i] = next;
    static_cast<T*>(t.out[0])[i] = w + (nesterov ? next * mu - step : next);
  }
};

/// Each block finds its variable (blocks_of(n) consecutive blocks each, in table order) and runs
/// a grid-stride loop over that variable's elements.
template <template <class> class Step, class T, int N>
__global__ void update_kernel(const __grid_constant__ UpdateParams<N> p) {
  std::int64_t first = 0;
  int k = 0;
  for (; k < p.count - 1; ++k) {
    const std::int64_t b = blocks_of(p.t[k].n);
    if (blockIdx.x < first + b) break;
    first += b;
  }
  const abi::UpdateTensor& t = p.t[k];
  const Step<T> step(p);
  const std::int64_t stride = blocks_of(t.n) * blockDim.x;
  for (std::int64_t i = (blockIdx.x - first) * blockDim.x + threadIdx.x; i < t.n; i += stride) step(t, i);
}

/// A launch's scalars: the rate, the optimizer's constants, the flag and AdamW's decay.
struct Scalars {
  const void* lr;
  double lr_host, c0, c1, c2;
  bool flag;
  const void* decay = nullptr;
  double decay_host = 0;
};

template <template <class> class Step, int N>
Status launch_as(DT dt, const abi::UpdateTensor* t, int count, const Scalars& c, abi::Stream s) {
  UpdateParams<N> p;
  std::int64_t blocks = 0;
  for (int k = 0; k < count; ++k) {
    p.t[k] = t[k];
    blocks += blocks_of(t[k].n);
  }
  if (blocks == 0) return cudaSuccess;
  p.lr = c.lr;
  p.decay = c.decay;
  p.lr_host = c.lr_host;
  p.c0 = c.c0;
  p.c1 = c.c1;
  p.c2 = c.c2;
  p.decay_host = c.decay_host;
  p.count = count;
  p.flag = c.flag;
  const auto st = static_cast<cudaStream_t>(s);
  const auto grid = static_cast<unsigned>(blocks);
  if (dt == DT::f32) update_kernel<Step, float, N><<<grid, block_threads, 0, st>>>(p);
  else if (dt == DT::f64) update_kernel<Step, double, N><<<grid, block_threads, 0, st>>>(p);
  else return cudaErrorNotSupported;
  return launched();
}

template <template <class> class Step>
Status launch(DT dt, const abi::UpdateTensor* t, int count, const Scalars& c, abi::Stream s) {
  if (count < 0 || count > abi::update_max_tensors) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  if (count <= 4) return launch_as<Step, 4>(dt, t, count, c, s);
  if (count <= 16) return launch_as<Step, 16>(dt, t, count, c, s);
  return launch_as<Step, abi::update_max_tensors>(dt, t, count, c, s);
}

}  // namespace
}  // namespace stagecraft::cuda::kernels

namespace stagecraft::cuda::abi {
using namespace stagecraft::cuda::kernels;

Status adam_update(DT dt, const UpdateTensor* t, int count, const void* lr, double lr_host, double a1, double a2,
                   double eps, bool decayed, const void* decay, double decay_host, Stream s) noexcept {
  return launch<AdamStep>(dt, t, count, Scalars{lr, lr_host, a1, a2, eps, decayed, decay, decay_host}, s);
}

Status sgd_update(DT dt, const UpdateTensor* t, int count, const void* lr, double lr_host, double momentum,
                  bool nesterov, Stream s) noexcept {
  return launch<SgdStep>(dt, t, count, Scalars{lr, lr_host, momentum, 0, 0, nesterov}, s);
}

}  // namespace stagecraft::cuda::abi
