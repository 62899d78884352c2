// Device: where a tensor lives (cpu now, cuda later), and DeviceScope, the RAII default.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

namespace stagecraft {

/// A place where tensors live and kernels run.
class Device {
 public:
  enum class Kind : std::uint8_t { cpu = 0, cuda = 1 };
  constexpr Device() = default;
  constexpr Device(Kind k, int index) : kind_(k), index_(static_cast<std::int16_t>(index)) {}
  /// The host.
  static constexpr Device cpu() { return {Kind::cpu, 0}; }
  /// The GPU with this ordinal.
  static constexpr Device cuda(int index = 0) { return {Kind::cuda, index}; }
  constexpr Kind kind() const { return kind_; }
  constexpr int index() const { return index_; }
  constexpr bool is_cpu() const { return kind_ == Kind::cpu; }
  constexpr bool is_cuda() const { return kind_ == Kind::cuda; }
  friend constexpr bool operator==(Device a, Device b) = default;
  /// "cpu" or "cuda:0".
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index_); }
  friend std::ostream& operator<<(std::ostream& os, Device d) { return os << d.str(); }

 private:
  Kind kind_ = Kind::cpu;
  std::int16_t index_ = 0;
};

namespace detail {
/// The device a DeviceScope pinned on this thread; null outside every scope.
inline const Device*& scoped_device() {
  thread_local const Device* d = nullptr;
  return d;
}
}  // namespace detail

/// The device new tensors go to on this thread: the innermost DeviceScope's, else the CPU.
inline Device current_device() {
  const Device* d = detail::scoped_device();
  return d ? *d : Device::cpu();
}

namespace detail {

/// One pinned device on a thread's stack of scopes (nullopt: none, as outside every scope). The
/// stack and the scope share it, so a scope destroyed on another thread leaves nothing dangling.
struct PinnedDevice {
  std::optional<Device> device;
  std::atomic<bool> dead{false};
};

/// The thread's DeviceScopes, outermost first; scoped_device() points into the innermost.
struct DeviceStack {
  std::vector<std::shared_ptr<PinnedDevice>> scopes;
  /// Drops the scopes that ended and points scoped_device() at the innermost left.
  void refresh() {
    std::erase_if(scopes, [](const std::shared_ptr<PinnedDevice>& p) { return p->dead.load(std::memory_order_acquire); });
    scoped_device() = scopes.empty() || !scopes.back()->device ? nullptr : &*scopes.back()->device;
  }
};
inline DeviceStack& device_stack() {
  thread_local DeviceStack s;
  return s;
}

/// RAII: pins `d` (or no device) on this thread's stack for its lifetime. Ended on the thread
/// that made it, in any order, it leaves the innermost remaining scope in force. Ended on another
/// thread (a mistake: scopes are per thread) it is only marked ended, and the owner thread drops
/// it at its next scope change; no memory is shared unsafely either way.
class DevicePin {
 public:
  explicit DevicePin(std::optional<Device> d)
      : pin_(std::make_shared<PinnedDevice>()), owner_(std::this_thread::get_id()) {
    pin_->device = d;
    DeviceStack& st = device_stack();
    st.scopes.push_back(pin_);
    st.refresh();
  }
  ~DevicePin() {
    pin_->dead.store(true, std::memory_order_release);
    if (std::this_thread::get_id() == owner_) device_stack().refresh();
  }
  DevicePin(const DevicePin&) = delete;
  DevicePin& operator=(const DevicePin&) = delete;

 private:
  std::shared_ptr<PinnedDevice> pin_;
  std::thread::id owner_;
};

}  // namespace detail

/// RAII: while alive, new tensors are created on `d` and ops run on `d` (their inputs are
/// copied there). Outside every scope an op runs where its inputs are. Nestable; scopes belong
/// to the thread that made them, and may end in any order (the innermost live one applies).
class DeviceScope {
 public:
  explicit DeviceScope(Device d) : pin_(d) {}
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  detail::DevicePin pin_;
};

}  // namespace stagecraft
