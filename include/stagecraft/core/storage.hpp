// Storage: a ref-counted block of device memory, from the caching allocator or the user.
#pragma once
#include <atomic>
#include <cstddef>
#include <utility>

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
class Storage : public RefCounted {
 public:
  /// nbytes of fresh, uninitialised memory from the device's caching allocator.
  static Ref<Storage> allocate(std::size_t nbytes, Device device) {
    // The CUDA allocator arrives with the CUDA issue; only the host allocates today.
    void* p = CachingAllocator::instance().allocate(nbytes);
    return Ref<Storage>::adopt(new Storage(p, nbytes, device, true));
  }
  /// A view of memory the caller owns and keeps alive.
  static Ref<Storage> borrow(void* p, std::size_t nbytes, Device device) {
    return Ref<Storage>::adopt(new Storage(p, nbytes, device, false));
  }
  ~Storage() {
    if (owned_) CachingAllocator::instance().deallocate(data_, nbytes_);
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
