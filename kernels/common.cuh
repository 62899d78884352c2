// What the kernel files share: the dtype switch, grid-stride launches and strided offsets.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "stagecraft/backend/cuda/abi.hpp"

namespace stagecraft::cuda::kernels {

using abi::DT;
using abi::Geometry;
using abi::Status;
using abi::rtc_compile_error;

inline constexpr int block_threads = 256;
static_assert(abi::not_supported == cudaErrorNotSupported, "abi::not_supported names cudaErrorNotSupported");

/// Blocks of a grid-stride loop over n elements (capped: each thread then takes several).
inline unsigned grid_for(std::int64_t n) {
  const std::int64_t b = (n + block_threads - 1) / block_threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

/// Calls f(T{}) with the C++ type of dt.
template <class F>
Status visit(DT dt, F&& f) {
  switch (dt) {
    case DT::b8: return f(bool{});
    case DT::i32: return f(std::int32_t{});
    case DT::i64: return f(std::int64_t{});
    case DT::f32: return f(float{});
    case DT::f64: return f(double{});
  }
  return cudaErrorInvalidValue;
}

/// The launch's own error (bad configuration), if any; execution errors surface later.
inline Status launched() { return static_cast<Status>(cudaGetLastError()); }

/// Offset of output element i in operand k of g (elements).
__device__ inline std::int64_t offset_of(const Geometry& g, int k, std::int64_t i) {
  std::int64_t off = 0;
  for (int d = g.rank - 1; d >= 0; --d) {
    const std::int64_t n = g.shape[d];
    off += (i % n) * g.strides[k][d];
    i /= n;
  }
  return off;
}

/// Offset of element i of an index space of `shape` laid out with `strides` (elements), computed
/// in I: int32 where every offset of the space fits (max_strided_offset), since a GPU divides
/// 32-bit integers several times faster than 64-bit ones.
template <class I>
__device__ inline I strided_offset(int rank, const std::int64_t* shape, const std::int64_t* strides, I i) {
  I off = 0;
  for (int d = rank - 1; d >= 0; --d) {
    const I n = static_cast<I>(shape[d]);
    off += (i % n) * static_cast<I>(strides[d]);
    i /= n;
  }
  return off;
}

/// The largest offset strided_offset gives over the space (0 when it is empty; strides >= 0).
inline std::int64_t max_strided_offset(int rank, const std::int64_t* shape, const std::int64_t* strides) {
  std::int64_t off = 0;
  for (int d = 0; d < rank; ++d) {
    if (shape[d] <= 0) return 0;
    off += (shape[d] - 1) * strides[d];
  }
  return off;
}

/// Called after launching a kernel that can write the current device's fault record: the next
/// wait for that device reads it (kernels/runtime.cu).
void arm_fault_check();
/// Arms the next wait for `device` to read its fault record (a graph launch whose body can write it).
void arm_fault_check(int device);
/// The device's own stream (never a capture's), made current; created on first use. The device's
/// queued eager ops (batch_enqueue) are launched on it first: whoever asks is about to queue work
/// there.
Status main_stream(int device, cudaStream_t* out);
/// Launches the n (1..abi::batch_max_ops) queued slots as one kernel on s (kernels/batch.cu).
Status launch_batch(const abi::BatchSlot* slots, int n, cudaStream_t s);
/// The stream this thread's launches on `device` are recorded on while it captures there (null
/// when it does not).
cudaStream_t capture_stream_of(int device);
/// Sends this thread's recorded launches to s (a conditional node's body; the previous stream
/// again when the body ends). Only while this thread captures.
void redirect_capture(cudaStream_t s);
/// The stream bodies at nesting depth `depth` (1, 2, ...) of this thread's captures on the device
/// are recorded on, created on first use (each thread has its own, as it has its capture stream).
Status body_stream(int device, int depth, cudaStream_t* out);

/// Records a bad index in the device's fault record: the first launch to find one wins (the
/// record keeps its tag, the index and the axis extent); the kernel goes on without it.
__device__ inline void report_fault(abi::Fault* f, std::int32_t tag, std::int64_t value, std::int64_t bound) {
  if (atomicCAS(reinterpret_cast<int*>(&f->tag), 0, static_cast<int>(tag)) == 0) {
    f->value = value;
    f->bound = bound;
  }
}

}  // namespace stagecraft::cuda::kernels
