// Storage: a ref-counted block of device memory, from the caching allocator or the user.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

#include "../backend/cuda/allocator.hpp"
#include "allocator.hpp"
#include "device.hpp"

namespace stagecraft::detail {

/// Intrusive reference counting shared by Storage and TensorImpl.
class RefCounted {
 public:
  void retain() const noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  /// True when this was the last reference.
  bool release() const noexcept { return refs_.fetch_sub(1, std::memory_order_acq_rel) == 1; }
  long use_count() const noexcept { return refs_.load(std::memory_order_relaxed); }

 private:
  mutable std::atomic<long> refs_{1};
};

#if defined(__SANITIZE_ADDRESS__)
#define SC_OBJECT_POOL 0  // ASan must see every object's real lifetime
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SC_OBJECT_POOL 0
#endif
#endif
#ifndef SC_OBJECT_POOL
#define SC_OBJECT_POOL 1
#endif

/// Per-thread free lists of small fixed-size objects (TensorImpl, Storage): an eager op
/// creates and drops two of them, and malloc/free was a third of its cost. Plain lists, no
/// locks: a block freed on another thread simply joins that thread's list.
class ObjectPool {
 public:
  static constexpr std::size_t step = 16, buckets = 16;  // sizes up to 256 bytes
  static constexpr std::uint32_t max_per_bucket = 1024;   // beyond: back to operator delete

  static void* allocate(std::size_t n) {
    const std::size_t b = (n + step - 1) / step - 1;
    if (!SC_OBJECT_POOL || b >= buckets) return ::operator new(n);
    Lists& l = lists();
    if (void* p = l.head[b]) {
      l.head[b] = *static_cast<void**>(p);
      --l.count[b];
      return p;
    }
    arm(l);
    return ::operator new((b + 1) * step);  // the bucket's size: any later user of it fits
  }
  static void deallocate(void* p, std::size_t n) noexcept {
    const std::size_t b = (n + step - 1) / step - 1;
    if (!SC_OBJECT_POOL || b >= buckets) return ::operator delete(p);
    Lists& l = lists();
    if (SC_UNLIKELY(l.dead || l.count[b] >= max_per_bucket)) return ::operator delete(p);
    arm(l);
    *static_cast<void**>(p) = l.head[b];
    l.head[b] = p;
    ++l.count[b];
  }

 private:
  // Trivially destructible, so it stays usable while the thread (or, for the main thread,
  // static destruction) ends; the Reaper empties it and marks it dead at thread exit.
  struct Lists {
    void* head[buckets];
    std::uint32_t count[buckets];
    bool armed;
    bool dead;
  };
  struct Reaper {
    ~Reaper() {
      Lists& l = lists();
      for (std::size_t b = 0; b < buckets; ++b)
        while (void* p = l.head[b]) {
          l.head[b] = *static_cast<void**>(p);
          ::operator delete(p);
        }
      l.dead = true;
    }
  };
  static Lists& lists() noexcept {
    thread_local constinit Lists l{};
    return l;
  }
  static void arm(Lists& l) noexcept {
    if (SC_LIKELY(l.armed)) return;
    l.armed = true;
    thread_local Reaper reaper;  // registers the thread-exit cleanup once per thread
    (void)reaper;
  }
};

/// Gives a class the pooled operator new/delete (the class must not be used polymorphically).
struct Pooled {
  static void* operator new(std::size_t n) { return ObjectPool::allocate(n); }
  static void operator delete(void* p, std::size_t n) noexcept { ObjectPool::deallocate(p, n); }
};

/// A pointer that owns one reference of a RefCounted T.
template <class T>
class Ref {
 public:
  Ref() = default;
  /// Adopts the reference the caller holds (a freshly created object has one).
  static Ref adopt(T* p) { Ref r; r.p_ = p; return r; }
  Ref(const Ref& o) noexcept : p_(o.p_) { if (p_) p_->retain(); }
  Ref(Ref&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  Ref& operator=(const Ref& o) noexcept { Ref(o).swap(*this); return *this; }
  Ref& operator=(Ref&& o) noexcept { Ref(std::move(o)).swap(*this); return *this; }
  ~Ref() { if (p_ && p_->release()) delete p_; }
  void swap(Ref& o) noexcept { std::swap(p_, o.p_); }
  T* get() const noexcept { return p_; }
  T* operator->() const noexcept { return p_; }
  T& operator*() const noexcept { return *p_; }
  explicit operator bool() const noexcept { return p_ != nullptr; }
  friend bool operator==(const Ref& a, const Ref& b) { return a.p_ == b.p_; }

 private:
  T* p_ = nullptr;
};

/// A block of memory on one device. Owned blocks go back to the caching allocator;
/// borrowed ones (from_blob) belong to the user and are never freed here.
class Storage : public RefCounted, public Pooled {
 public:
  /// nbytes of fresh, uninitialised memory from the device's caching allocator.
  static Ref<Storage> allocate(std::size_t nbytes, Device device) {
    void* p = device.is_cpu() ? CachingAllocator::instance().allocate(nbytes)
                              : cuda::detail::DeviceAllocator::instance().allocate(nbytes, device);
    return Ref<Storage>::adopt(new Storage(p, nbytes, device, true));
  }
  /// A view of memory the caller owns and keeps alive.
  static Ref<Storage> borrow(void* p, std::size_t nbytes, Device device) {
    return Ref<Storage>::adopt(new Storage(p, nbytes, device, false));
  }
  ~Storage() {
    if (!owned_) return;
    if (device_.is_cpu()) CachingAllocator::instance().deallocate(data_, nbytes_);
    else cuda::detail::DeviceAllocator::instance().deallocate(data_, nbytes_, device_);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const noexcept { return data_; }
  std::size_t nbytes() const noexcept { return nbytes_; }
  Device device() const noexcept { return device_; }
  bool owned() const noexcept { return owned_; }

 private:
  Storage(void* p, std::size_t n, Device d, bool owned) : data_(p), nbytes_(n), device_(d), owned_(owned) {}
  void* data_;
  std::size_t nbytes_;
  Device device_;
  bool owned_;
};

}  // namespace stagecraft::detail
