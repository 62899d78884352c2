// The optimizers' fused updates on a GPU (optim/fused.hpp; the CPU runs the same arithmetic as one
// loop): one kernel per variable instead of Adam's 12 ops (SGD's 2 to 5). Each operation rounds on
// its own, in the composite's order (kernels are built with --fmad=false: no contraction), with
// sqrt and division correctly rounded, so the results are the composite's bit for bit.
#include "common.cuh"
#include "stagecraft/ops/rules.hpp"

namespace stagecraft::cuda::kernels {
namespace {

/// The learning rate: from the device (a GPU scalar, read when the kernel runs) or given.
template <class T>
__device__ T rate(const T* dev, T host) {
  return dev != nullptr ? *dev : host;
}

template <class T>
__global__ void adam_kernel(const T* g, const T* m, const T* v, const T* w, T* m1, T* v1, T* w1, const T* lr_dev,
                            T lr_host, T a1, T a2, T e, std::int64_t n) {
  const T r = rate(lr_dev, lr_host);
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += std::int64_t{gridDim.x} * blockDim.x) {
    const T gi = g[i], m0 = m[i], v0 = v[i], w0 = w[i];
    const T mi = m0 + (gi - m0) * a1;
    const T vi = v0 + (gi * gi - v0) * a2;
    const T step = (mi * r) / (rules::Sqrt::f(vi) + e);
    m1[i] = mi;
    v1[i] = vi;
    w1[i] = w0 - step;
  }
}

template <class T>
__global__ void sgd_kernel(const T* g, const T* w, const T* vel, T* w1, T* vel1, const T* lr_dev, T lr_host, T mu,
                           bool nesterov, std::int64_t n) {
  const T r = rate(lr_dev, lr_host);
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += std::int64_t{gridDim.x} * blockDim.x) {
    const T step = g[i] * r;
    if (vel == nullptr) {
      w1[i] = w[i] - step;
      continue;
    }
    const T next = vel[i] * mu - step;
    vel1[i] = next;
    w1[i] = w[i] + (nesterov ? next * mu - step : next);
  }
}

}  // namespace
}  // namespace stagecraft::cuda::kernels

namespace stagecraft::cuda::abi {
using namespace stagecraft::cuda::kernels;

Status adam_update(DT dt, const void* g, const void* m, const void* v, const void* w, void* m1, void* v1, void* w1,
                   const void* lr, double lr_host, double a1, double a2, double eps, std::int64_t n, Stream s) noexcept {
  if (n == 0) return cudaSuccess;
  const auto st = static_cast<cudaStream_t>(s);
  auto run = [&](auto tag) -> Status {
    using T = decltype(tag);
    adam_kernel<T><<<grid_for(n), block_threads, 0, st>>>(
        static_cast<const T*>(g), static_cast<const T*>(m), static_cast<const T*>(v), static_cast<const T*>(w),
        static_cast<T*>(m1), static_cast<T*>(v1), static_cast<T*>(w1), static_cast<const T*>(lr), static_cast<T>(lr_host),
        static_cast<T>(a1), static_cast<T>(a2), static_cast<T>(eps), n);
    return launched();
  };
  if (dt == DT::f32) return run(float{});
  if (dt == DT::f64) return run(double{});
  return cudaErrorNotSupported;
}

Status sgd_update(DT dt, const void* g, const void* w, const void* vel, void* w1, void* vel1, const void* lr,
                  double lr_host, double momentum, bool nesterov, std::int64_t n, Stream s) noexcept {
  if (n == 0) return cudaSuccess;
  const auto st = static_cast<cudaStream_t>(s);
  auto run = [&](auto tag) -> Status {
    using T = decltype(tag);
    sgd_kernel<T><<<grid_for(n), block_threads, 0, st>>>(static_cast<const T*>(g), static_cast<const T*>(w),
                                                         static_cast<const T*>(vel), static_cast<T*>(w1),
                                                         static_cast<T*>(vel1), static_cast<const T*>(lr),
                                                         static_cast<T>(lr_host), static_cast<T>(momentum), nesterov, n);
    return launched();
  };
  if (dt == DT::f32) return run(float{});
  if (dt == DT::f64) return run(double{});
  return cudaErrorNotSupported;
}

}  // namespace stagecraft::cuda::abi
