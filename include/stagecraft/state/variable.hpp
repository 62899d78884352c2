// Variable: named, mutable state (weights, optimizer slots) that ops read as a Tensor.
#pragma once
#include <memory>
#include <source_location>
#include <string>
#include <utility>

#include "../autodiff/tape.hpp"
#include "../core/tensor.hpp"
#include "../ops/binary.hpp"
#include "../ops/cast.hpp"

namespace stagecraft {

/// A named tensor that can be reassigned. Copies of a Variable are handles to the same
/// state. Every op accepts a Variable where it accepts a Tensor (it reads the current value),
/// and every recording GradientTape watches trainable variables automatically.
class Variable {
 public:
  /// An empty handle (assign a constructed Variable to it before use).
  Variable() = default;
  /// A variable holding `initial` (its shape and dtype are fixed from now on).
  Variable(const Tensor& initial, std::string name = "", bool trainable = true,
           std::source_location loc = std::source_location::current())
      : impl_(std::make_shared<Impl>()) {
    detail::require_concrete(initial, "Variable", loc);
    impl_->name = std::move(name);
    impl_->trainable = trainable;
    set(initial);
  }

  /// The current value.
  const Tensor& value() const { return impl_->value; }
  /// Reads the current value wherever a Tensor is expected.
  operator const Tensor&() const { return impl_->value; }  // NOLINT: implicit by design

  /// Replaces the value; t must have the variable's shape (its dtype is converted).
  void assign(const Tensor& t, std::source_location loc = std::source_location::current()) {
    check(t, "Variable::assign", loc);
    GradientTape::StopRecording quiet;  // state updates are not part of any gradient
    set(t.dtype() == dtype() ? t : cast(t, dtype(), loc));
  }
  /// value += t.
  void assign_add(const Tensor& t, std::source_location loc = std::source_location::current()) {
    check(t, "Variable::assign_add", loc);
    GradientTape::StopRecording quiet;
    set(cast(add(impl_->value, t, loc), dtype(), loc));  // the variable keeps its dtype
  }
  /// value -= t.
  void assign_sub(const Tensor& t, std::source_location loc = std::source_location::current()) {
    check(t, "Variable::assign_sub", loc);
    GradientTape::StopRecording quiet;
    set(cast(sub(impl_->value, t, loc), dtype(), loc));
  }

  const std::string& name() const { return impl_->name; }
  bool trainable() const { return impl_->trainable; }
  const Shape& shape() const { return impl_->value.shape(); }
  DType dtype() const { return impl_->value.dtype(); }
  Device device() const { return impl_->value.device(); }
  std::int64_t numel() const { return impl_->value.numel(); }
  bool defined() const { return impl_ != nullptr; }
  /// True when both handles are the same variable.
  bool same(const Variable& o) const { return impl_ == o.impl_; }

 private:
  struct Impl : detail::VariableInfo {
    Tensor value;
    Impl() = default;
    Impl(const Impl&) = delete;
    Impl& operator=(const Impl&) = delete;
    // The value can outlive the variable (a user or a tape holds it); it must not keep
    // pointing here, or the next tape that sees it reads freed memory.
    ~Impl() {
      if (value.defined()) value.impl()->variable = nullptr;
    }
  };
  void check(const Tensor& t, std::string_view op, const std::source_location& loc) const {
    detail::require_defined(t, op, loc);
    if (!impl_) detail::fail<ValueError>(op, loc, "the variable is empty (default-constructed)");
    if (t.shape() != shape())
      detail::fail<ShapeError>(op, loc, "variable '", name(), "' has shape ", shape(), ", the value has shape ", t.shape());
  }
  /// Stores v under a fresh tensor identity (sharing v's storage: tensors are immutable), so
  /// the tape can tell this variable's value from the tensor it came from.
  void set(const Tensor& v) {
    Tensor fresh = detail::alias_tensor(v, v.shape());
    fresh.impl()->variable = impl_.get();
    // The old value is a plain tensor from now on (not watched automatically, and it must not
    // point at this variable once the variable is gone).
    if (impl_->value.defined()) impl_->value.impl()->variable = nullptr;
    impl_->value = std::move(fresh);
  }

  std::shared_ptr<Impl> impl_;
};

}  // namespace stagecraft
