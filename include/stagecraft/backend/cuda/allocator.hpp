// The CUDA caching allocator: per device, size-classed free lists of blocks from the device's
// stream-ordered pool. Every kernel of a device runs on its one stream, so a block freed after one
// op's launch can be handed to the next op at once: the stream orders the two.
#pragma once
#include <array>
#include <cstddef>
#include <mutex>
#include <utility>
#include <vector>

#include "../../core/allocator.hpp"
#include "runtime.hpp"

namespace stagecraft::cuda {
namespace detail {

/// The blocks a CUDA graph's capture freed: its launches still use them, so the allocator keeps
/// them out of its cache until the graph is destroyed (release()).
struct CaptureHold {
  int device = -1;
  std::vector<std::pair<void*, std::size_t>> blocks;
};

class DeviceAllocator {
 public:
  static constexpr int max_devices = 16;
  using Classes = stagecraft::detail::CachingAllocator;

  /// The hold of the capture this thread runs (null: none); set by CaptureScope.
  static CaptureHold*& capturing() noexcept {
    thread_local CaptureHold* h = nullptr;
    return h;
  }

  /// A block of at least n bytes on CUDA device d. Out of memory: frees this device's cache, retries
  /// once, then throws DeviceError naming the call site.
  void* allocate(std::size_t n, Device d) {
    const CallSite& site = call_site();
    require_device(d, site.op, site.loc);
    if (n == 0) return nullptr;
    if (d.index() >= max_devices)
      stagecraft::detail::fail<DeviceError>(site.op, site.loc, "supports CUDA devices 0..", max_devices - 1,
                                            ", got ", d.str());
    int cls = 0;
    const std::size_t size = Classes::round(n, &cls);
    PerDevice& pd = devices_[d.index()];
    {
      const std::lock_guard<std::mutex> lock(pd.mu);
      ++pd.stats.requests;
      if (auto& list = pd.free[cls]; !list.empty()) {
        void* p = list.back();
        list.pop_back();
        ++pd.stats.cache_hits;
        pd.stats.bytes_cached -= size;
        add_in_use(pd, size);
        return p;
      }
    }
    void* p = nullptr;
#if defined(STAGECRAFT_WITH_CUDA)
    abi::Status s = abi::malloc_async(d.index(), size, &p);
    if (abi::is_out_of_memory(s)) {
      empty_cache(d);
      check(abi::trim_pool(d.index()), d, site.op, site.loc);
      s = abi::malloc_async(d.index(), size, &p);
      if (abi::is_out_of_memory(s))
        stagecraft::detail::fail<DeviceError>(site.op, site.loc, "out of memory on ", d.str(), " allocating ", size,
                                              " bytes (", abi::error_string(s), ", after freeing the cache); ",
                                              memory_stats(d).bytes_in_use, " bytes are held by live tensors");
    }
    check(s, d, site.op, site.loc);
#endif
    const std::lock_guard<std::mutex> lock(pd.mu);
    ++pd.stats.allocation_calls;
    add_in_use(pd, size);
    return p;
  }

  /// Returns a block of n requested bytes to device d's cache.
  void deallocate(void* p, std::size_t n, Device d) noexcept {
    if (!p) return;
    if (CaptureHold* h = capturing(); h != nullptr && h->device == d.index()) {
      try {
        h->blocks.emplace_back(p, n);  // still counted in use: the graph's
      } catch (...) {  // NOLINT(bugprone-empty-catch): not cached, so never reused under the graph
      }
      return;
    }
    int cls = 0;
    const std::size_t size = Classes::round(n, &cls);
    PerDevice& pd = devices_[d.index()];
    const std::lock_guard<std::mutex> lock(pd.mu);
    pd.stats.bytes_in_use -= size;
    pd.stats.bytes_cached += size;
    pd.free[cls].push_back(p);
  }

  /// Gives device d's cached blocks back to its pool (live tensors are untouched).
  void empty_cache(Device d) noexcept {
    if (d.index() < 0 || d.index() >= max_devices) return;
    PerDevice& pd = devices_[d.index()];
    const std::lock_guard<std::mutex> lock(pd.mu);
    for (auto& list : pd.free) {
#if defined(STAGECRAFT_WITH_CUDA)
      for (void* p : list) (void)abi::free_async(d.index(), p);
#endif
      list.clear();
    }
    pd.stats.bytes_cached = 0;
  }

  MemoryStats memory_stats(Device d) {
    if (d.index() < 0 || d.index() >= max_devices) return {};
    PerDevice& pd = devices_[d.index()];
    const std::lock_guard<std::mutex> lock(pd.mu);
    return pd.stats;
  }

  /// The process's allocator, never destroyed (tensors freed during static destruction find it).
  static DeviceAllocator& instance() {
    static DeviceAllocator* a = new DeviceAllocator();  // NOLINT: deliberately leaked
    return *a;
  }

 private:
  struct PerDevice {
    std::mutex mu;
    std::array<std::vector<void*>, Classes::num_classes> free{};
    MemoryStats stats{};
  };
  static void add_in_use(PerDevice& pd, std::size_t size) {
    pd.stats.bytes_in_use += size;
    if (pd.stats.bytes_in_use > pd.stats.peak_bytes_in_use) pd.stats.peak_bytes_in_use = pd.stats.bytes_in_use;
  }
  std::array<PerDevice, max_devices> devices_{};
};

/// RAII: while alive, the blocks this thread frees on `device` go to `hold` instead of the cache.
class CaptureScope {
 public:
  CaptureScope(CaptureHold& hold, int device) : saved_(DeviceAllocator::capturing()) {
    hold.device = device;
    DeviceAllocator::capturing() = &hold;
  }
  ~CaptureScope() { DeviceAllocator::capturing() = saved_; }
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;

 private:
  CaptureHold* saved_;
};

/// Gives a capture's held blocks back to the cache (the graph that used them is gone; its last
/// launch is ordered before any later use on the device's stream).
inline void release_hold(CaptureHold& hold) noexcept {
  const auto held = std::move(hold.blocks);
  hold.blocks.clear();
  for (const auto& [p, n] : held) DeviceAllocator::instance().deallocate(p, n, Device::cuda(hold.device));
}

}  // namespace detail

/// Counters of CUDA device `index`'s caching allocator.
inline MemoryStats memory_stats(int index) { return detail::DeviceAllocator::instance().memory_stats(Device::cuda(index)); }
/// Gives CUDA device `index`'s cached blocks back to the driver's pool.
inline void empty_cache(int index) { detail::DeviceAllocator::instance().empty_cache(Device::cuda(index)); }

}  // namespace stagecraft::cuda
