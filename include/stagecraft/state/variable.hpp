// Variable: named, mutable state (weights, optimizer slots) that ops read as a Tensor.
#pragma once
#include <memory>
#include <mutex>
#include <source_location>
#include <string>
#include <utility>

#include "../autodiff/tape.hpp"
#include "../core/tensor.hpp"
#include "../ops/binary.hpp"
#include "../ops/cast.hpp"

namespace stagecraft {
namespace detail {

/// A variable's shared state. Its value is replaced, never written in place (tensors are
/// immutable), so a tensor read from it stays valid. `mu` guards the handle: every read copies
/// it and every assignment swaps it under the lock, on any thread (eager code and plans alike).
struct VariableState : VariableInfo {
  Tensor value;  // guarded by mu
  mutable std::mutex mu;
  VariableState() = default;
  VariableState(const VariableState&) = delete;
  VariableState& operator=(const VariableState&) = delete;
  // The value can outlive the variable (a user or a tape holds it); it must not keep
  // pointing here, or the next tape that sees it reads freed memory.
  ~VariableState() override {
    if (value.defined()) value.impl()->variable = nullptr;
  }
  /// A copy of the current handle, taken under the lock (safe while another thread assigns).
  Tensor get() const {
    const std::lock_guard<std::mutex> lock(mu);
    return value;
  }
  /// Stores v under a fresh tensor identity (sharing v's storage: tensors are immutable), so
  /// the tape can tell this variable's value from the tensor it came from.
  void set(const Tensor& v) {
    Tensor fresh = alias_tensor(v, v.shape());
    fresh.impl()->variable = this;
    Tensor old;  // released after the lock: freeing its storage needs no lock
    {
      const std::lock_guard<std::mutex> lock(mu);
      old = std::exchange(value, std::move(fresh));
    }
    // The old value is a plain tensor from now on (not watched automatically, and it must not
    // point at this variable once the variable is gone).
    if (old.defined()) old.impl()->variable = nullptr;
  }
};

}  // namespace detail

/// A named tensor that can be reassigned. Copies of a Variable are handles to the same
/// state. Every op accepts a Variable where it accepts a Tensor (it reads the current value),
/// and every recording GradientTape watches trainable variables automatically.
///
/// Threads: reading a variable (value(), or passing it to an op) and assigning it are safe on
/// any number of threads at once: a read returns the value of one assignment, whole (the
/// handle is copied under the variable's lock; tensors are immutable, so the copy stays valid
/// after later assignments). A read-modify-write such as assign_add is not atomic as a whole:
/// two threads adding at once may lose one update; serialise those (or use one optimizer).
class Variable {
 public:
  /// An empty handle (assign a constructed Variable to it before use).
  Variable() = default;
  /// A variable holding `initial` (its shape and dtype are fixed from now on).
  Variable(const Tensor& initial, std::string name = "", bool trainable = true,
           std::source_location loc = std::source_location::current())
      : impl_(std::make_shared<detail::VariableState>()) {
    detail::require_defined(initial, "Variable", loc);
    if (detail::TraceState* tr = detail::context().trace; SC_UNLIKELY(tr != nullptr)) {
      if (!tr->may_create_variables())
        detail::fail<StagingError>("Variable", loc, "variable '", name, "' is created inside a traced function on a "
                                   "later trace; variables must be created once: create it outside the function, or "
                                   "inside `{ sc::init_scope lift; ... }`, or only on the first call");
      if (initial.is_symbolic())
        detail::fail<StagingError>("Variable", loc, "the initial value of variable '", name, "' is computed inside a "
                                   "traced function (symbolic); compute it inside `{ sc::init_scope lift; ... }`");
    }
    detail::require_value(initial, "Variable", loc);  // on any device: it stays there
    impl_->name = std::move(name);
    impl_->trainable = trainable;
    set(initial);
  }

  /// The current value (a handle of its own: it stays this value after later assignments).
  /// While a function is traced, a symbolic read of the variable (after an assignment inside
  /// the trace, the value assigned).
  Tensor value(std::source_location loc = std::source_location::current()) const {
    if (SC_UNLIKELY(!impl_)) empty();
    if (detail::CustomReads* r = detail::context().custom_reads;
        SC_UNLIKELY(r != nullptr) && impl_->trainable && detail::context().no_record == r->depth)
      r->reads.push_back(impl_);  // (a custom_gradient's forward reads it: custom.hpp checks it is an input)
    if (detail::TraceState* tr = detail::context().trace; SC_UNLIKELY(tr != nullptr)) {
      if (const Tensor* s = tr->shadow(impl_.get())) return *s;
      // A read in the graph, not the value at trace time: sc::cond on it, item() of it and
      // every op on it see the variable as it is at each call.
      return tr->read(impl_.get(), loc);
    }
    return impl_->get();
  }
  /// Reads the current value wherever a Tensor is expected.
  /// An empty variable gives an undefined tensor here, so the op it is passed to reports it
  /// with its name and the user's line.
  /// (Inside a trace the read's line is that of the first op using it: a conversion cannot know
  /// its caller's.)
  operator Tensor() const { return impl_ ? value(std::source_location{}) : Tensor(); }  // NOLINT: implicit by design

  /// Replaces the value; t must have the variable's shape (its dtype is converted, and a value
  /// on another device is copied to the variable's: an implicit copy, counted, and a
  /// DeviceError in strict mode). Inside a traced function the assignment becomes part of the
  /// graph and runs at every call.
  void assign(const Tensor& t, std::source_location loc = std::source_location::current()) {
    check(t, "Variable::assign", loc);
    GradientTape::StopRecording quiet;  // state updates are not part of any gradient
    Tensor v = t.dtype() == dtype() ? t : cast(t, dtype(), loc);
    if (const Device home = device(); SC_UNLIKELY(v.device() != home)) {  // a variable keeps its device
      detail::count_implicit_copy(v, home, "Variable::assign", loc, "the variable lives there");
      v = v.to(home, loc);
    }
    store(v, loc);
  }
  /// value += t.
  void assign_add(const Tensor& t, std::source_location loc = std::source_location::current()) {
    check(t, "Variable::assign_add", loc);
    GradientTape::StopRecording quiet;
    store(cast(add(value(), t, loc), dtype(), loc), loc);  // the variable keeps its dtype
  }
  /// value -= t.
  void assign_sub(const Tensor& t, std::source_location loc = std::source_location::current()) {
    check(t, "Variable::assign_sub", loc);
    GradientTape::StopRecording quiet;
    store(cast(sub(value(), t, loc), dtype(), loc), loc);
  }

  const std::string& name() const { return state_or_throw().name; }
  bool trainable() const { return state_or_throw().trainable; }
  /// Fixed at construction (assignments keep them).
  Shape shape() const { return state_or_throw().get().shape(); }
  DType dtype() const { return state_or_throw().get().dtype(); }
  Device device() const { return state_or_throw().get().device(); }
  std::int64_t numel() const { return state_or_throw().get().numel(); }
  bool defined() const { return impl_ != nullptr; }
  /// True when both handles are the same variable.
  bool same(const Variable& o) const { return impl_ == o.impl_; }

  /// The shared state (for the graph layer, which reads and assigns variables by reference).
  const std::shared_ptr<detail::VariableState>& state() const { return impl_; }
  /// The handle of an existing state (the graph layer hands variables back to users this way).
  static Variable from_state(std::shared_ptr<detail::VariableState> s) {
    Variable v;
    v.impl_ = std::move(s);
    return v;
  }

 private:
  [[noreturn]] SC_COLD static void empty() {
    throw ValueError("[Variable] the variable is empty (default-constructed); assign a constructed sc::Variable to it "
                     "first");
  }
  const detail::VariableState& state_or_throw() const {
    if (SC_UNLIKELY(!impl_)) empty();
    return *impl_;
  }
  void store(const Tensor& v, const std::source_location& loc) {
    detail::Context& ctx = detail::context();
    if (SC_UNLIKELY(ctx.trace != nullptr || v.is_symbolic())) {
      if (ctx.trace == nullptr)
        detail::fail<StagingError>("Variable::assign", loc, "variable '", name(), "' is assigned a symbolic tensor "
                                   "outside the trace that made it (it escaped an sc::function)");
      ctx.trace->assign(impl_.get(), v, loc);
      return;
    }
    set(v);
  }
  void check(const Tensor& t, std::string_view op, const std::source_location& loc) const {
    detail::require_defined(t, op, loc);
    if (!impl_) detail::fail<ValueError>(op, loc, "the variable is empty (default-constructed)");
    if (t.shape() != shape())
      detail::fail<ShapeError>(op, loc, "variable '", name(), "' has shape ", shape(), ", the value has shape ", t.shape());
  }
  /// Stores v under a fresh tensor identity (sharing v's storage: tensors are immutable), so
  /// the tape can tell this variable's value from the tensor it came from.
  void set(const Tensor& v) { impl_->set(v); }

  std::shared_ptr<detail::VariableState> impl_;
};

}  // namespace stagecraft
