// The CPU caching allocator: size classes, free lists reused across ops, public counters.
#pragma once
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "../config.hpp"

namespace stagecraft {

/// Counters of the caching allocator (bytes are the rounded block sizes).
struct MemoryStats {
  std::size_t bytes_in_use = 0;       ///< held by live storages
  std::size_t peak_bytes_in_use = 0;  ///< high-water mark of bytes_in_use
  std::size_t bytes_cached = 0;       ///< free blocks kept for reuse
  std::size_t allocation_calls = 0;   ///< blocks requested from the system (cache misses)
  std::size_t requests = 0;           ///< allocate() calls, hits and misses
  std::size_t cache_hits = 0;         ///< requests served from the free lists
};

namespace detail {

/// A lock for the allocator's few-instruction critical sections: one atomic exchange to
/// take, a plain store to give back (std::mutex cost two library calls and two atomics per
/// eager op). Waiters spin briefly, then yield: on 2 shared cores the holder may be descheduled.
class SpinLock {
 public:
  void lock() noexcept {
    for (int spins = 0; flag_.exchange(true, std::memory_order_acquire); ++spins) {
      while (flag_.load(std::memory_order_relaxed)) {
        if (++spins > 64) std::this_thread::yield();
      }
    }
  }
  void unlock() noexcept { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

/// Size classes: four per power of two (waste at most 25%), 64 bytes at least.
/// Blocks above `max_cached_block` bypass the cache and go straight back to the system.
class CachingAllocator {
 public:
  static constexpr int sub_classes = 4;
  static constexpr int num_classes = 64 * sub_classes;
  static constexpr std::size_t max_cached_block = std::size_t{1} << 32;
  /// Largest request served (2^62 bytes, as max_tensor_bytes): round() stays exact below it.
  static constexpr std::size_t max_request = std::size_t{1} << 62;

  /// Rounded size and class index of a request of n > 0 bytes.
  static constexpr std::size_t round(std::size_t n, int* cls = nullptr) {
    if (n <= 64) {
      if (cls) *cls = 0;
      return 64;
    }
    const int p = std::bit_width(n - 1) - 1;  // 2^p < n <= 2^(p+1), p >= 6
    const std::size_t step = std::size_t{1} << (p - 2);
    const std::size_t j = (n - (std::size_t{1} << p) + step - 1) / step;  // 1..4
    if (cls) *cls = p * sub_classes + static_cast<int>(j) - 1;
    return (std::size_t{1} << p) + j * step;
  }

  /// A 64-byte-aligned block of at least n bytes (nullptr for n == 0).
  void* allocate(std::size_t n) {
    if (n == 0) return nullptr;
    if (n > max_request) throw std::bad_alloc();  // round() would overflow; no machine has it
    int cls = 0;
    const std::size_t size = round(n, &cls);
    {
      std::lock_guard<SpinLock> lock(mu_);
      ++stats_.requests;
      auto& list = free_[cls];
      if (!list.empty()) {
        void* p = list.back();
        list.pop_back();
        ++stats_.cache_hits;
        stats_.bytes_cached -= size;
        add_in_use(size);
        return p;
      }
      ++stats_.allocation_calls;
      peak_before_miss_ = stats_.peak_bytes_in_use;
      add_in_use(size);
    }
    // aligned_alloc needs a multiple of the alignment (size classes like 80 bytes are not).
    void* p = std::aligned_alloc(config::alignment, (size + config::alignment - 1) / config::alignment * config::alignment);
    if (!p) {
      empty_cache();  // the cached blocks may make room: give them back and try once more
      p = std::aligned_alloc(config::alignment, (size + config::alignment - 1) / config::alignment * config::alignment);
    }
    if (!p) {
      std::lock_guard<SpinLock> lock(mu_);
      stats_.bytes_in_use -= size;
      stats_.peak_bytes_in_use = std::max(peak_before_miss_, stats_.bytes_in_use);  // the failed size never counted
      throw std::bad_alloc();
    }
    return p;
  }

  /// Returns a block of n requested bytes to the cache.
  void deallocate(void* p, std::size_t n) {
    if (!p) return;
    int cls = 0;
    const std::size_t size = round(n, &cls);
    {
      std::lock_guard<SpinLock> lock(mu_);
      stats_.bytes_in_use -= size;
      if (size <= max_cached_block && stats_.bytes_cached + size <= cache_limit_) {
        free_[cls].push_back(p);
        stats_.bytes_cached += size;
        return;
      }
    }
    std::free(p);
  }

  /// Gives every cached block back to the system.
  void empty_cache() {
    std::lock_guard<SpinLock> lock(mu_);
    for (auto& list : free_) {
      for (void* p : list) std::free(p);
      list.clear();
      list.shrink_to_fit();
    }
    stats_.bytes_cached = 0;
  }
  MemoryStats stats() const {
    std::lock_guard<SpinLock> lock(mu_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard<SpinLock> lock(mu_);
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }
  void set_cache_limit(std::size_t bytes) {
    cache_limit_ = bytes;
  }
  static CachingAllocator& instance();

 private:
  void add_in_use(std::size_t size) {
    stats_.bytes_in_use += size;
    if (stats_.bytes_in_use > stats_.peak_bytes_in_use) stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }
  mutable SpinLock mu_;
  std::size_t peak_before_miss_ = 0;  // the peak before the latest miss, restored if it fails
  std::array<std::vector<void*>, num_classes> free_{};
  MemoryStats stats_{};
  std::size_t cache_limit_ = std::size_t{8} << 30;
};

/// Holds the process's allocator: constant-initialised (no guard check per call) and never
/// destroyed, so tensors released during static destruction still find it.
union AllocatorHolder {
  CachingAllocator allocator;
  constexpr AllocatorHolder() : allocator() {}
  ~AllocatorHolder() {}  // NOLINT: deliberately leaves the allocator alive
};
inline constinit AllocatorHolder allocator_holder;
inline CachingAllocator& CachingAllocator::instance() { return allocator_holder.allocator; }

}  // namespace detail

/// Counters of the CPU caching allocator.
inline MemoryStats memory_stats() { return detail::CachingAllocator::instance().stats(); }
/// Frees every cached CPU block (live tensors are untouched).
inline void empty_cache() { detail::CachingAllocator::instance().empty_cache(); }
/// Resets peak_bytes_in_use to the current bytes_in_use.
inline void reset_peak_memory() { detail::CachingAllocator::instance().reset_peak(); }
/// Caps the bytes the CPU cache keeps (freed blocks beyond it go back to the system).
inline void set_cache_limit(std::size_t bytes) { detail::CachingAllocator::instance().set_cache_limit(bytes); }

}  // namespace stagecraft
