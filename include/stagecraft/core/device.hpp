// Device: where a tensor lives (cpu now, cuda later), and DeviceScope, the RAII default.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>

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

/// RAII: while alive, new tensors are created on `d` and ops run on `d` (their inputs are
/// copied there). Outside every scope an op runs where its inputs are. Nestable.
class DeviceScope {
 public:
  explicit DeviceScope(Device d) : device_(d), saved_(detail::scoped_device()) {
    detail::scoped_device() = &device_;
  }
  ~DeviceScope() { detail::scoped_device() = saved_; }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  Device device_;
  const Device* saved_;
};

}  // namespace stagecraft
