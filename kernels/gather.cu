// gather (index_select) and its adjoint scatter_add (index_add); take_along_axis and its adjoint
// add_along_axis (an index per element). The host checks indices that live
// on the host before the launch; indices already on the GPU are not read back (that would make
// every launch wait): there an index out of range gathers 0, its update is dropped, and the kernel
// records it in the device's fault record, which the host raises at its next wait for the device.
#include "common.cuh"

namespace stagecraft::cuda::kernels {
namespace {

/// One thread per output element (o, n, i): y[o, n, i] = x[o, ix[n], i] (a negative index counts
/// from the end of the axis).
template <class W, class I>
__global__ void gather_kernel(const W* x, const I* ix, W* y, std::int64_t outer, std::int64_t E, std::int64_t inner,
                              std::int64_t N, abi::Fault* fault, std::int32_t tag) {
  const std::int64_t total = outer * N * inner;
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < total;
       e += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t i = e % inner, n = (e / inner) % N, o = e / (inner * N);
    const std::int64_t given = static_cast<std::int64_t>(ix[n]);
    const std::int64_t j = given < 0 ? given + E : given;
    if (j >= 0 && j < E) {
      y[e] = x[(o * E + j) * inner + i];
    } else {
      y[e] = W(0);
      if (o == 0 && i == 0) report_fault(fault, tag, given, E);  // one thread per index reports
    }
  }
}

/// One thread per column (o, i) of the output: it adds every update of its column in index order,
/// so duplicate indices never race and sums are deterministic (the CPU's order).
template <class T, class I>
__global__ void scatter_add_kernel(const I* ix, const T* u, T* y, std::int64_t outer, std::int64_t E,
                                   std::int64_t inner, std::int64_t N, abi::Fault* fault, std::int32_t tag) {
  for (std::int64_t c = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; c < outer * inner;
       c += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t o = c / inner, i = c % inner;
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int64_t given = static_cast<std::int64_t>(ix[n]);
      const std::int64_t j = given < 0 ? given + E : given;
      if (j >= 0 && j < E) y[(o * E + j) * inner + i] += u[(o * N + n) * inner + i];
      else if (c == 0) report_fault(fault, tag, given, E);  // the first column reports for all
    }
  }
}

/// One thread per output element (o, m, i): y[o, m, i] = x[o, ix[o, m, i], i].
template <class W, class I>
__global__ void take_along_kernel(const W* x, const I* ix, W* y, std::int64_t outer, std::int64_t E,
                                  std::int64_t inner, std::int64_t M, abi::Fault* fault, std::int32_t tag) {
  const std::int64_t total = outer * M * inner;
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < total;
       e += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t i = e % inner, o = e / (inner * M);
    const std::int64_t given = static_cast<std::int64_t>(ix[e]);
    const std::int64_t j = given < 0 ? given + E : given;
    if (j >= 0 && j < E) {
      y[e] = x[(o * E + j) * inner + i];
    } else {
      y[e] = W(0);
      report_fault(fault, tag, given, E);
    }
  }
}

/// One thread per column (o, i): it adds the column's updates in index order (no races, the CPU's
/// order, so the sums are the CPU's).
template <class T, class I>
__global__ void add_along_kernel(const I* ix, const T* u, T* y, std::int64_t outer, std::int64_t E, std::int64_t inner,
                                 std::int64_t M, abi::Fault* fault, std::int32_t tag) {
  for (std::int64_t c = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; c < outer * inner;
       c += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t o = c / inner, i = c % inner;
    for (std::int64_t m = 0; m < M; ++m) {
      const std::int64_t e = (o * M + m) * inner + i;
      const std::int64_t given = static_cast<std::int64_t>(ix[e]);
      const std::int64_t j = given < 0 ? given + E : given;
      if (j >= 0 && j < E) y[(o * E + j) * inner + i] += u[e];
      else report_fault(fault, tag, given, E);
    }
  }
}

/// y = x, each element checked against [lo, hi): one outside is recorded (its value, and its index
/// in the record's bound) for the next wait, as a bad gather index is.
template <class I>
__global__ void check_range_kernel(const I* x, I* y, std::int64_t n, std::int64_t lo, std::int64_t hi,
                                   abi::Fault* fault, std::int32_t tag) {
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < n;
       e += std::int64_t{gridDim.x} * blockDim.x) {
    const I v = x[e];
    y[e] = v;
    if (static_cast<std::int64_t>(v) < lo || static_cast<std::int64_t>(v) >= hi)
      report_fault(fault, tag, static_cast<std::int64_t>(v), e);
  }
}

template <class F>
Status visit_index(DT index_dt, F&& f) {
  if (index_dt == DT::i32) return f(std::int32_t{});
  if (index_dt == DT::i64) return f(std::int64_t{});
  return cudaErrorNotSupported;
}

/// scatter_add's and add_along_axis's launch: y = x copied on the stream, then, when there are
/// updates (`count`), launch(T{}, I{}) starts the adding kernel and its fault check is armed.
template <class Launch>
Status copy_then_add(DT dt, DT index_dt, const void* x, void* y, std::int64_t numel, std::int64_t count,
                     cudaStream_t st, Launch&& launch) {
  if (numel == 0) return cudaSuccess;
  return visit(dt, [&](auto ttag) -> Status {
    using T = decltype(ttag);
    if constexpr (std::is_same_v<T, bool>) {
      return cudaErrorNotSupported;
    } else {
      if (const Status e = static_cast<Status>(
              cudaMemcpyAsync(y, x, static_cast<std::size_t>(numel) * sizeof(T), cudaMemcpyDeviceToDevice, st)))
        return e;
      if (count == 0) return cudaSuccess;
      return visit_index(index_dt, [&](auto itag) -> Status {
        launch(ttag, itag);
        arm_fault_check();
        return launched();
      });
    }
  });
}

}  // namespace
}  // namespace stagecraft::cuda::kernels

namespace stagecraft::cuda::abi {
using namespace stagecraft::cuda::kernels;

Status gather(int itemsize, DT index_dt, const void* x, const void* ix, void* y, std::int64_t outer, std::int64_t E,
              std::int64_t inner, std::int64_t N, Fault* fault, std::int32_t tag, Stream s) noexcept {
  const std::int64_t n = outer * N * inner;
  if (n == 0) return cudaSuccess;
  const auto st = static_cast<cudaStream_t>(s);
  return visit_index(index_dt, [&](auto itag) -> Status {
    using I = decltype(itag);
    const auto* idx = static_cast<const I*>(ix);
    const auto run = [&](auto wtag) {
      using W = decltype(wtag);
      gather_kernel<<<grid_for(n), block_threads, 0, st>>>(static_cast<const W*>(x), idx, static_cast<W*>(y), outer, E,
                                                           inner, N, fault, tag);
      arm_fault_check();
    };
    switch (itemsize) {
      case 1: run(std::uint8_t{}); break;
      case 4: run(std::uint32_t{}); break;
      case 8: run(std::uint64_t{}); break;
      default: return cudaErrorInvalidValue;
    }
    return launched();
  });
}

Status scatter_add(DT dt, DT index_dt, const void* x, const void* ix, const void* updates, void* y, std::int64_t outer,
                   std::int64_t E, std::int64_t inner, std::int64_t N, Fault* fault, std::int32_t tag, Stream s) noexcept {
  const auto st = static_cast<cudaStream_t>(s);
  return copy_then_add(dt, index_dt, x, y, outer * E * inner, N, st, [&](auto ttag, auto itag) {
    using T = decltype(ttag);
    using I = decltype(itag);
    scatter_add_kernel<<<grid_for(outer * inner), block_threads, 0, st>>>(
        static_cast<const I*>(ix), static_cast<const T*>(updates), static_cast<T*>(y), outer, E, inner, N, fault, tag);
  });
}

Status take_along_axis(int itemsize, DT index_dt, const void* x, const void* ix, void* y, std::int64_t outer,
                       std::int64_t E, std::int64_t inner, std::int64_t M, Fault* fault, std::int32_t tag,
                       Stream s) noexcept {
  const std::int64_t n = outer * M * inner;
  if (n == 0) return cudaSuccess;
  const auto st = static_cast<cudaStream_t>(s);
  return visit_index(index_dt, [&](auto itag) -> Status {
    using I = decltype(itag);
    const auto* idx = static_cast<const I*>(ix);
    const auto run = [&](auto wtag) {
      using W = decltype(wtag);
      take_along_kernel<<<grid_for(n), block_threads, 0, st>>>(static_cast<const W*>(x), idx, static_cast<W*>(y), outer,
                                                               E, inner, M, fault, tag);
      arm_fault_check();
    };
    switch (itemsize) {
      case 1: run(std::uint8_t{}); break;
      case 4: run(std::uint32_t{}); break;
      case 8: run(std::uint64_t{}); break;
      default: return cudaErrorInvalidValue;
    }
    return launched();
  });
}

Status add_along_axis(DT dt, DT index_dt, const void* x, const void* ix, const void* updates, void* y,
                      std::int64_t outer, std::int64_t E, std::int64_t inner, std::int64_t M, Fault* fault,
                      std::int32_t tag, Stream s) noexcept {
  const auto st = static_cast<cudaStream_t>(s);
  return copy_then_add(dt, index_dt, x, y, outer * E * inner, M, st, [&](auto ttag, auto itag) {
    using T = decltype(ttag);
    using I = decltype(itag);
    add_along_kernel<<<grid_for(outer * inner), block_threads, 0, st>>>(
        static_cast<const I*>(ix), static_cast<const T*>(updates), static_cast<T*>(y), outer, E, inner, M, fault, tag);
  });
}

Status check_range(DT dt, const void* x, void* y, std::int64_t n, std::int64_t lo, std::int64_t hi, Fault* fault,
                   std::int32_t tag, Stream s) noexcept {
  if (n == 0) return cudaSuccess;
  const auto st = static_cast<cudaStream_t>(s);
  return visit_index(dt, [&](auto itag) -> Status {
    using I = decltype(itag);
    check_range_kernel<<<grid_for(n), block_threads, 0, st>>>(static_cast<const I*>(x), static_cast<I*>(y), n, lo, hi,
                                                              fault, tag);
    arm_fault_check();
    return launched();
  });
}

}  // namespace stagecraft::cuda::abi
