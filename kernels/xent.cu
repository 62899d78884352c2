// softmax_cross_entropy and its gradient (ops/cross_entropy.hpp): a warp per row of the logits.
// A row's shift is its maximum (the maximum op's rule: NaN wins), 0 when not finite; exp is the exp
// op's rule in the logits' type, the row's sum and log in double, as the CPU kernel. The mean sums
// the rows' values in double in an order fixed by the launch shape (not by timing).
#include "common.cuh"
#include "stagecraft/ops/rules.hpp"

namespace stagecraft::cuda::kernels {
namespace {

constexpr int warp = 32;
constexpr unsigned full_mask = 0xffffffffu;

template <class T>
__device__ T warp_max(T v) {
  for (int o = warp / 2; o > 0; o /= 2) v = rules::Maximum::f(__shfl_xor_sync(full_mask, v, o), v);
  return v;
}
__device__ double warp_sum(double v) {
  for (int o = warp / 2; o > 0; o /= 2) v += __shfl_xor_sync(full_mask, v, o);
  return v;
}

/// The shift of row x (C > 0), the same in every lane.
template <class T>
__device__ T row_shift(const T* x, std::int64_t C, int lane) {
  T m = x[0];
  for (std::int64_t j = lane; j < C; j += warp) m = rules::Maximum::f(x[j], m);
  m = warp_max(m);
  return fabs(m) < static_cast<T>(INFINITY) ? m : T(0);
}

/// z[label] - log(sum(exp(z))) of row x, in every lane; a label outside [0, C) is recorded (lane 0)
/// and gives 0.
template <class T, class I>
__device__ double row_value(const T* x, I label, std::int64_t C, std::int64_t row, int lane, abi::Fault* fault,
                            std::int32_t tag) {
  const auto l = static_cast<std::int64_t>(label);
  if (l < 0 || l >= C) {
    if (lane == 0) report_fault(fault, tag, l, row);
    return 0.0;
  }
  const T shift = row_shift(x, C, lane);
  double s = 0;
  for (std::int64_t j = lane; j < C; j += warp) s += static_cast<double>(rules::Exp::f(static_cast<T>(x[j] - shift)));
  s = warp_sum(s);
  return static_cast<double>(static_cast<T>(x[l] - shift)) - rules::Log::f(s);
}

/// y = -(the sum of every warp's acc, in warp order) / N, written by thread 0 of the one block (acc:
/// the sum of the rows of this thread's warp, the same in its every lane).
template <class T>
__device__ void block_mean(double acc, T* y, std::int64_t N) {
  __shared__ double partial[warp];
  const int lane = threadIdx.x % warp, w = threadIdx.x / warp, warps = blockDim.x / warp;
  if (lane == 0) partial[w] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int k = 0; k < warps; ++k) total += partial[k];
    *y = static_cast<T>(-(total / static_cast<double>(N)));
  }
}

/// The whole loss in one block (blockDim.x = 1024: 32 warps, warp w taking rows w, w + 32, ...;
/// the bound keeps the registers within what 1024 threads may have).
template <class T, class I>
__global__ void __launch_bounds__(1024) xent_one_block_kernel(const T* x, const I* labels, T* y, std::int64_t N, std::int64_t C,
                                      abi::Fault* fault, std::int32_t tag) {
  const int lane = threadIdx.x % warp, w = threadIdx.x / warp, warps = blockDim.x / warp;
  double acc = 0;
  for (std::int64_t r = w; r < N; r += warps) acc += row_value(x + r * C, labels[r], C, r, lane, fault, tag);
  block_mean(acc, y, N);
}

/// Each row's value into v (a warp per row, grid-stride over rows).
template <class T, class I>
__global__ void xent_rows_kernel(const T* x, const I* labels, double* v, std::int64_t N, std::int64_t C,
                                 abi::Fault* fault, std::int32_t tag) {
  const int lane = threadIdx.x % warp;
  const std::int64_t warps = std::int64_t{gridDim.x} * (blockDim.x / warp);
  for (std::int64_t r = blockIdx.x * std::int64_t{blockDim.x / warp} + threadIdx.x / warp; r < N; r += warps) {
    const double value = row_value(x + r * C, labels[r], C, r, lane, fault, tag);
    if (lane == 0) v[r] = value;
  }
}

/// y = -(sum of v [N]) / N in one block (each thread a strided partial, then the partials in order).
template <class T>
__global__ void xent_mean_kernel(const double* v, T* y, std::int64_t N) {
  __shared__ double partial[block_threads];
  double acc = 0;
  for (std::int64_t i = threadIdx.x; i < N; i += blockDim.x) acc += v[i];
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) *y = static_cast<T>(-(partial[0] / static_cast<double>(N)));
}

/// Row x's loss value (as row_value) and its gradient row dr = (softmax(x) - one_hot(label)) *
/// scale (exp(z) stored first, then scaled) in one pass over x, in every lane: the same sums in
/// the same order as the loss kernels, so the same numbers (xent_grad_kernel is this, its value
/// unused). A label outside [0, C) is recorded (lane 0); its row is still written and
/// its value is 0.
template <class T, class I>
__device__ double row_value_and_grad(const T* xr, T* dr, I label, double scale, std::int64_t C, std::int64_t row,
                                     int lane, abi::Fault* fault, std::int32_t tag) {
  const auto l = static_cast<std::int64_t>(label);
  const bool bad = l < 0 || l >= C;
  if (bad && lane == 0) report_fault(fault, tag, l, row);
  if (C == 0) return 0.0;  // (no class: nothing to read or write)
  const T shift = row_shift(xr, C, lane);
  double s = 0;
  for (std::int64_t j = lane; j < C; j += warp) {
    const T e = rules::Exp::f(static_cast<T>(xr[j] - shift));
    dr[j] = e;
    s += static_cast<double>(e);
  }
  s = warp_sum(s);
  for (std::int64_t j = lane; j < C; j += warp)
    dr[j] = static_cast<T>((static_cast<double>(dr[j]) / s - (j == l ? 1.0 : 0.0)) * scale);
  return bad ? 0.0 : static_cast<double>(static_cast<T>(xr[l] - shift)) - rules::Log::f(s);
}

/// dx = (softmax(x) - one_hot(labels)) * g / N, a warp per row: exp(z) is stored first, then
/// scaled (row_value_and_grad, its value unused).
template <class T, class I>
__global__ void xent_grad_kernel(const T* g, const T* x, const I* labels, T* dx, std::int64_t N, std::int64_t C,
                                 abi::Fault* fault, std::int32_t tag) {
  const int lane = threadIdx.x % warp;
  const double scale = static_cast<double>(*g) / static_cast<double>(N);
  const std::int64_t warps = std::int64_t{gridDim.x} * (blockDim.x / warp);
  for (std::int64_t r = blockIdx.x * std::int64_t{blockDim.x / warp} + threadIdx.x / warp; r < N; r += warps)
    row_value_and_grad(x + r * C, dx + r * C, labels[r], scale, C, r, lane, fault, tag);
}

/// The loss and its gradient in one block (as xent_one_block_kernel, each row's gradient written
/// as its value is taken).
template <class T, class I>
__global__ void __launch_bounds__(1024) xent_both_one_block_kernel(const T* g, const T* x, const I* labels, T* y, T* dx,
                                                                   std::int64_t N, std::int64_t C, abi::Fault* fault,
                                                                   std::int32_t tag) {
  const double scale = static_cast<double>(*g) / static_cast<double>(N);
  const int lane = threadIdx.x % warp, w = threadIdx.x / warp, warps = blockDim.x / warp;
  double acc = 0;
  for (std::int64_t r = w; r < N; r += warps)
    acc += row_value_and_grad(x + r * C, dx + r * C, labels[r], scale, C, r, lane, fault, tag);
  block_mean(acc, y, N);
}

/// Each row's value into v and its gradient into dx (a warp per row, grid-stride over rows).
template <class T, class I>
__global__ void xent_both_rows_kernel(const T* g, const T* x, const I* labels, double* v, T* dx, std::int64_t N,
                                      std::int64_t C, abi::Fault* fault, std::int32_t tag) {
  const double scale = static_cast<double>(*g) / static_cast<double>(N);
  const int lane = threadIdx.x % warp;
  const std::int64_t warps = std::int64_t{gridDim.x} * (blockDim.x / warp);
  for (std::int64_t r = blockIdx.x * std::int64_t{blockDim.x / warp} + threadIdx.x / warp; r < N; r += warps) {
    const double value = row_value_and_grad(x + r * C, dx + r * C, labels[r], scale, C, r, lane, fault, tag);
    if (lane == 0) v[r] = value;
  }
}

/// Blocks of 256 threads (8 rows at a time each) for N rows, capped (each warp then takes several).
unsigned row_blocks(std::int64_t N) {
  const std::int64_t b = (N + 7) / 8;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

template <class F>
Status visit_float_index(DT dt, DT label_dt, F&& f) {
  if (dt != DT::f32 && dt != DT::f64) return cudaErrorNotSupported;
  if (label_dt != DT::i32 && label_dt != DT::i64) return cudaErrorNotSupported;
  auto with_index = [&](auto ttag) -> Status {
    if (label_dt == DT::i32) return f(ttag, std::int32_t{});
    return f(ttag, std::int64_t{});
  };
  if (dt == DT::f32) return with_index(float{});
  return with_index(double{});
}

}  // namespace
}  // namespace stagecraft::cuda::kernels

namespace stagecraft::cuda::abi {
using namespace stagecraft::cuda::kernels;

Status softmax_cross_entropy(DT dt, DT label_dt, const void* x, const void* labels, void* y, std::int64_t N,
                             std::int64_t C, double* scratch, Fault* fault, std::int32_t tag, Stream s) noexcept {
  const auto st = static_cast<cudaStream_t>(s);
  return visit_float_index(dt, label_dt, [&](auto ttag, auto itag) -> Status {
    using T = decltype(ttag);
    using I = decltype(itag);
    const auto* xp = static_cast<const T*>(x);
    const auto* lp = static_cast<const I*>(labels);
    auto* yp = static_cast<T*>(y);
    if (N * C <= xent_one_block) {
      xent_one_block_kernel<<<1, 1024, 0, st>>>(xp, lp, yp, N, C, fault, tag);
    } else {
      if (scratch == nullptr) return cudaErrorInvalidValue;
      xent_rows_kernel<<<row_blocks(N), block_threads, 0, st>>>(xp, lp, scratch, N, C, fault, tag);
      if (const Status e = launched()) return e;
      xent_mean_kernel<<<1, block_threads, 0, st>>>(scratch, yp, N);
    }
    arm_fault_check();
    return launched();
  });
}

Status softmax_cross_entropy_grad(DT dt, DT label_dt, const void* g, const void* x, const void* labels, void* dx,
                                  std::int64_t N, std::int64_t C, Fault* fault, std::int32_t tag, Stream s) noexcept {
  if (N == 0 || C == 0) return cudaSuccess;
  const auto st = static_cast<cudaStream_t>(s);
  return visit_float_index(dt, label_dt, [&](auto ttag, auto itag) -> Status {
    using T = decltype(ttag);
    using I = decltype(itag);
    xent_grad_kernel<<<row_blocks(N), block_threads, 0, st>>>(static_cast<const T*>(g), static_cast<const T*>(x),
                                                             static_cast<const I*>(labels), static_cast<T*>(dx), N, C,
                                                             fault, tag);
    arm_fault_check();
    return launched();
  });
}

Status softmax_cross_entropy_both(DT dt, DT label_dt, const void* g, const void* x, const void* labels, void* y, void* dx,
                                  std::int64_t N, std::int64_t C, double* scratch, Fault* fault, std::int32_t tag,
                                  Stream s) noexcept {
  const auto st = static_cast<cudaStream_t>(s);
  return visit_float_index(dt, label_dt, [&](auto ttag, auto itag) -> Status {
    using T = decltype(ttag);
    using I = decltype(itag);
    const auto* gp = static_cast<const T*>(g);
    const auto* xp = static_cast<const T*>(x);
    const auto* lp = static_cast<const I*>(labels);
    auto* yp = static_cast<T*>(y);
    auto* dp = static_cast<T*>(dx);
    if (N * C <= xent_one_block) {
      xent_both_one_block_kernel<<<1, 1024, 0, st>>>(gp, xp, lp, yp, dp, N, C, fault, tag);
    } else {
      if (scratch == nullptr) return cudaErrorInvalidValue;
      xent_both_rows_kernel<<<row_blocks(N), block_threads, 0, st>>>(gp, xp, lp, scratch, dp, N, C, fault, tag);
      if (const Status e = launched()) return e;
      xent_mean_kernel<<<1, block_threads, 0, st>>>(scratch, yp, N);
    }
    arm_fault_check();
    return launched();
  });
}

}  // namespace stagecraft::cuda::abi
