// The CUDA emulator: the ABI of kernels/*.cu (backend/cuda/abi.hpp) implemented on the host, so
// that the whole GPU path (eager dispatch to cuda:0, staged plans lowered for a GPU, generated
// kernels, CUDA graphs) runs and is tested on a machine without a GPU (STAGECRAFT_CUDA_EMULATOR).
// Not a performance path: every "launch" runs at once, in order, on the calling thread.
//
// What it checks that a GPU would: "device" pointers are tagged (bit 62 set: a non-canonical
// address on x86-64), so host code that reads device memory directly faults as it would on a GPU
// machine; the kernels untag them (host()). What it cannot check: races between streams, and the
// ordering an asynchronous GPU imposes (every call here has finished when it returns).
#pragma once
#include <cstdint>
#include <cstring>
#include <functional>

#include "stagecraft/backend/cuda/abi.hpp"

namespace stagecraft::cuda::emu {

using abi::DT;
using abi::Geometry;
using abi::Status;
using abi::Stream;

// The cudaError_t values the emulator returns (the same numbers as CUDA's).
inline constexpr Status ok = 0;
inline constexpr Status invalid_value = 1;
inline constexpr Status memory_allocation = 2;
inline constexpr Status invalid_device = 101;
inline constexpr Status illegal_state = 401;
inline constexpr Status capture_unsupported = 900;
inline constexpr Status capture_invalidated = 901;
inline constexpr Status capture_unmatched = 903;
inline constexpr Status graph_update_failure = 910;

/// Bit 62 marks a device pointer (user-space addresses on x86-64 stay below 2^47).
inline constexpr std::uintptr_t device_bit = std::uintptr_t{1} << 62;

/// The host address of device pointer p (null stays null; an untagged pointer is returned as is).
template <class T>
T* host(T* p) noexcept {
  return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(p) & ~device_bit);
}
/// The device pointer of host address p.
inline void* device_ptr(void* p) noexcept {
  return p == nullptr ? p : reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(p) | device_bit);
}
inline bool is_device_ptr(const void* p) noexcept { return (reinterpret_cast<std::uintptr_t>(p) & device_bit) != 0; }

/// Calls f(T{}) with the C++ type of dt (as kernels/common.cuh's visit).
template <class F>
Status visit(DT dt, F&& f) {
  switch (dt) {
    case DT::b8: return f(bool{});
    case DT::i32: return f(std::int32_t{});
    case DT::i64: return f(std::int64_t{});
    case DT::f32: return f(float{});
    case DT::f64: return f(double{});
  }
  return invalid_value;
}

/// Offset of output element i in operand k of g (elements), as kernels/common.cuh's offset_of.
inline std::int64_t offset_of(const Geometry& g, int k, std::int64_t i) {
  std::int64_t off = 0;
  for (int d = g.rank - 1; d >= 0; --d) {
    const std::int64_t n = g.shape[d];
    off += (i % n) * g.strides[k][d];
    i /= n;
  }
  return off;
}

/// Offset of element i of an index space of `shape` laid out with `strides` (elements).
inline std::int64_t strided_offset(int rank, const std::int64_t* shape, const std::int64_t* strides, std::int64_t i) {
  std::int64_t off = 0;
  for (int d = rank - 1; d >= 0; --d) {
    off += (i % shape[d]) * strides[d];
    i /= shape[d];
  }
  return off;
}

/// A kernel launch on stream s: run now, or recorded when s is the stream of this thread's capture
/// (it then runs at every launch of the graph). `faults`: the kernel can write the device's fault
/// record (the next wait reads it). The closure must copy what it reads from the caller's
/// arguments (structs passed by reference, host arrays): it may run after the call returned.
Status launch(Stream s, std::function<void()> kernel, bool faults = false);

/// What the host has asked of the emulated devices since the process started (all devices, all
/// threads): kernels launched (a launch recorded into a CUDA graph counts once, when recorded),
/// device-to-device and host-to-device copies, and graph launches. What a plan costs in launches
/// on a GPU, counted rather than estimated (tests and benchmarks read it; no GPU counterpart).
struct Counts {
  std::int64_t kernels = 0, copies = 0, graph_launches = 0;
};
Counts counts() noexcept;

/// Records a bad index in fault record f (a device pointer): the first wins.
void report_fault(abi::Fault* f, std::int32_t tag, std::int64_t value, std::int64_t bound) noexcept;

}  // namespace stagecraft::cuda::emu
