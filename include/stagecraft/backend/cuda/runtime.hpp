// The host side of the CUDA backend: availability, streams, status checks and copies between
// devices. Declared in every build; without the kernels (STAGECRAFT_WITH_CUDA unset) there is no
// device: is_available() is false and every CUDA request is a DeviceError saying why.
#pragma once
#include <cstddef>
#include <source_location>
#include <string_view>

#include "../../core/device.hpp"
#include "../../core/error.hpp"
#include "abi.hpp"

namespace stagecraft::cuda {

/// True when stagecraft was built with its CUDA kernels (STAGECRAFT_CUDA) and finds a GPU.
inline constexpr bool built =
#if defined(STAGECRAFT_WITH_CUDA)
    true;
#else
    false;
#endif

/// The number of GPUs stagecraft can use (0 without the CUDA kernels, a driver or a device).
inline int device_count() {
#if defined(STAGECRAFT_WITH_CUDA)
  static const int n = abi::device_count();  // the set of devices is fixed for the process
  return n;
#else
  return 0;
#endif
}

/// True when a CUDA device can run stagecraft's kernels.
inline bool is_available() { return device_count() > 0; }

namespace detail {

/// Throws DeviceError "[op] CUDA error: <what> on cuda:i at file:line" for a failed status.
inline void check(abi::Status s, Device d, std::string_view op, const std::source_location& loc) {
  if (SC_UNLIKELY(s != 0))
    stagecraft::detail::fail<DeviceError>(op, loc, "CUDA error on ", d.str(), ": ",
#if defined(STAGECRAFT_WITH_CUDA)
                                          abi::error_string(s)
#else
                                          "status ", s
#endif
    );
}

/// Throws DeviceError unless `d` is a CUDA device this process can use.
inline void require_device(Device d, std::string_view op, const std::source_location& loc) {
  if (!built)
    stagecraft::detail::fail<DeviceError>(op, loc, "cannot use ", d.str(), ": stagecraft was built without CUDA "
                                          "(configure with -DSTAGECRAFT_CUDA=ON and a CUDA toolkit)");
  if (SC_UNLIKELY(d.index() < 0 || d.index() >= device_count()))
    stagecraft::detail::fail<DeviceError>(op, loc, "cannot use ", d.str(), ": ",
                                          device_count() == 0 ? std::string("no CUDA device is available")
                                                              : "only " + std::to_string(device_count()) +
                                                                    " CUDA device(s) are available");
}

/// The stream of CUDA device d (made current), where every kernel and copy of d runs.
inline abi::Stream stream(Device d, std::string_view op, const std::source_location& loc) {
  abi::Stream s = nullptr;
#if defined(STAGECRAFT_WITH_CUDA)
  check(abi::stream(d.index(), &s), d, op, loc);
#else
  require_device(d, op, loc);
#endif
  return s;
}

/// Copies n bytes between two devices, one of them CUDA (both checked by the caller). Host to
/// device returns before the copy ends (staged through pinned memory); device to host waits.
inline void copy(void* dst, Device to, const void* src, Device from, std::size_t n, std::string_view op,
                 const std::source_location& loc) {
#if defined(STAGECRAFT_WITH_CUDA)
  if (to.is_cuda() && from.is_cpu()) check(abi::copy_h2d(to.index(), dst, src, n), to, op, loc);
  else if (to.is_cpu()) check(abi::copy_d2h(from.index(), dst, src, n), from, op, loc);
  else check(abi::copy_d2d(to.index(), dst, from.index(), src, n), to, op, loc);
#else
  (void)dst, (void)src, (void)n, (void)from;
  require_device(to, op, loc);
#endif
}

/// The op and user line a CUDA allocation is made for (set around eager CUDA kernels and copies),
/// so an out-of-memory error names them although the allocator is called without them.
struct CallSite {
  std::string_view op = "cuda";
  std::source_location loc = std::source_location::current();
};
inline CallSite& call_site() {
  thread_local CallSite site;
  return site;
}
/// RAII: sets the call site for the allocations made while alive.
class ScopedCallSite {
 public:
  ScopedCallSite(std::string_view op, const std::source_location& loc) : saved_(call_site()) {
    call_site() = {op, loc};
  }
  ~ScopedCallSite() { call_site() = saved_; }
  ScopedCallSite(const ScopedCallSite&) = delete;
  ScopedCallSite& operator=(const ScopedCallSite&) = delete;

 private:
  CallSite saved_;
};

}  // namespace detail

/// Waits until every kernel and copy queued on CUDA device `index` has finished; an error of an
/// earlier asynchronous launch is raised here. A no-op without CUDA devices.
inline void synchronize(int index = 0, std::source_location loc = std::source_location::current()) {
#if defined(STAGECRAFT_WITH_CUDA)
  if (index < 0 || index >= device_count()) return;
  detail::check(abi::synchronize(index), Device::cuda(index), "synchronize", loc);
#else
  (void)index, (void)loc;
#endif
}

}  // namespace stagecraft::cuda
