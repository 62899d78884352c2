// Tensor: a cheap ref-counted handle to a TensorImpl (shape, dtype, device, storage).
#pragma once
#include <concepts>
#include <cstdint>
#include <cstring>
#include <memory>
#include <source_location>
#include <string>
#include <type_traits>
#include <vector>

#include "dtype.hpp"
#include "error.hpp"
#include "shape.hpp"
#include "storage.hpp"
#include "../eager/context.hpp"
#include "../ops/rules.hpp"

namespace stagecraft {

namespace detail {
/// What a tensor knows of the Variable whose current value it is (state/variable.hpp derives
/// the full state from it; a graph that reads the variable keeps it alive through shared_from_this).
struct VariableInfo : std::enable_shared_from_this<VariableInfo> {
  std::string name;
  bool trainable = true;
  virtual ~VariableInfo() = default;
};

/// The object a Tensor handle points to. Tensors are contiguous and row-major; reshape
/// shares the storage of its input.
struct TensorImpl : RefCounted, Pooled {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
  Ref<Storage> storage;                   // null while symbolic
  SymbolicValue symbolic;                   // trace == 0 unless this is a value being traced
  const VariableInfo* variable = nullptr;   // set on a Variable's current value only
};
}  // namespace detail

/// A multi-dimensional array on a device: concrete (has storage) or symbolic (a value in a
/// graph being traced). Copying a Tensor copies the handle, not the data.
class Tensor {
 public:
  /// An undefined tensor (no shape, no data); most calls on it throw ValueError.
  Tensor() = default;
  explicit Tensor(detail::Ref<detail::TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const noexcept { return static_cast<bool>(impl_); }
  /// The extents; on an undefined tensor (as shape(), dtype(), device(), numel() and rank())
  /// a ValueError, never a crash.
  const Shape& shape(std::source_location loc = std::source_location::current()) const { return checked(loc).shape; }
  DType dtype(std::source_location loc = std::source_location::current()) const { return checked(loc).dtype; }
  Device device(std::source_location loc = std::source_location::current()) const { return checked(loc).device; }
  std::int64_t numel(std::source_location loc = std::source_location::current()) const {
    return checked(loc).shape.numel();
  }
  int rank(std::source_location loc = std::source_location::current()) const { return checked(loc).shape.rank(); }
  /// Extent of one axis (negative counts from the end).
  std::int64_t size(std::int64_t axis, std::source_location loc = std::source_location::current()) const {
    return shape()[normalize_axis(axis, rank(), "size", loc)];
  }
  /// True while this is a value in a graph being traced (it has no data yet).
  bool is_symbolic() const noexcept { return impl_ && impl_->symbolic.trace != 0; }

  /// The single element, converted to T. Throws for more than one element. A T that is not an
  /// Element (long long, unsigned char, size_t, ...) is read as its element_t, then converted as
  /// static_cast converts integers (a value it cannot hold wraps).
  template <Number T>
  T item(std::source_location loc = std::source_location::current()) const;
  /// All elements in row-major order, converted to T (as item's).
  template <Number T>
  std::vector<T> to_vector(std::source_location loc = std::source_location::current()) const;
  /// A copy on another device (the same tensor when it is already there): an op (ops/to_device.hpp),
  /// so gradients flow back across it and a trace records it.
  Tensor to(Device d, std::source_location loc = std::source_location::current()) const;
  /// A copy converted to another dtype (the same tensor when it already has it).
  Tensor astype(DType d, std::source_location loc = std::source_location::current()) const;
  /// Truth of a one-element tensor. While tracing this throws StagingError: use sc::cond.
  explicit operator bool() const;

  /// Typed pointer to the first element of a concrete CPU tensor (T must match dtype()).
  template <Element T>
  T* data(std::source_location loc = std::source_location::current()) const {
    if (SC_UNLIKELY(dtype_of<T>() != dtype(loc)))
      detail::fail<DTypeError>("data", loc, "tensor has dtype ", name(dtype()), ", asked for ", name(dtype_of<T>()));
    if (SC_UNLIKELY(is_symbolic()))
      detail::fail<StagingError>("data", loc, "a symbolic tensor (a value of a function being traced) has no data; "
                                 "use sc::host_fn to run C++ code on its values");
    return static_cast<T*>(raw_data());
  }
  /// Untyped pointer to the first element (nullptr when symbolic or empty).
  void* raw_data() const noexcept { return impl_ && impl_->storage ? impl_->storage->data() : nullptr; }
  /// Bytes of the elements (numel * itemsize).
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * itemsize(dtype()); }
  /// True when both tensors read the same memory (reshape results, from_blob of one buffer).
  bool shares_storage_with(const Tensor& o) const {
    return impl_ && o.impl_ && impl_->storage && impl_->storage == o.impl_->storage;
  }
  /// The implementation object (for the library's own layers).
  detail::TensorImpl* impl() const noexcept { return impl_.get(); }
  /// Number of handles to this tensor (for tests of sharing and lifetime).
  long use_count() const noexcept { return impl_ ? impl_->use_count() : 0; }
  /// True when both handles are the same tensor.
  bool same(const Tensor& o) const noexcept { return impl_ == o.impl_; }

 private:
  // loc by value: a pointer in a register, made only on the cold path (by reference it would be
  // stored to the stack at every accessor call of the hot paths)
  const detail::TensorImpl& checked(std::source_location loc) const {
    if (SC_UNLIKELY(!impl_)) undefined(loc);
    return *impl_;
  }
  [[noreturn]] SC_COLD static void undefined(std::source_location loc) {
    detail::fail<ValueError>("tensor", loc, "the tensor is undefined (default-constructed or moved from); give it "
                             "a value first");
  }
  detail::Ref<detail::TensorImpl> impl_;
};

/// A tensor operand of an operator: it remembers the user's line, since operators cannot
/// take a defaulted std::source_location. Anything convertible to a Tensor (a Variable) fits;
/// a staged expression does not (it would bind to a temporary: staged operators take it).
/// A Tensor is referred to; anything else (a Variable) is read once into a handle held here.
struct Operand {
  Operand(const Tensor& x, std::source_location l = std::source_location::current())  // NOLINT
      : t(x), loc(l) {}
  template <class T>
    requires(!std::same_as<T, Tensor> && std::convertible_to<const T&, Tensor> && !requires { typename T::staged_tag; })
  Operand(const T& x, std::source_location l = std::source_location::current())  // NOLINT
      : held_(x), t(held_), loc(l) {}
  Operand(const Operand&) = delete;  // t may refer to held_
  Operand& operator=(const Operand&) = delete;

 private:
  Tensor held_;

 public:
  const Tensor& t;
  std::source_location loc;
};

namespace detail {

/// Out of memory for a tensor of this shape: a DeviceError naming op, the shape and the bytes.
[[noreturn]] SC_COLD inline void out_of_memory(const Shape& shape, DType dtype, Device device, std::size_t n,
                                               std::string_view op, const std::source_location& loc) {
  fail<DeviceError>(op, loc, "out of memory: ", n, " bytes for a ", dtype, " tensor of shape ", shape, " on ",
                    device.str());
}

/// A new concrete tensor with uninitialised storage from the device's caching allocator. The
/// shape is checked (no negative extent, at most max_tensor_bytes): a ShapeError naming op.
inline Tensor empty_tensor(const Shape& shape, DType dtype, Device device, std::string_view op = "allocate",
                           const std::source_location& loc = std::source_location::current()) {
  const auto n = static_cast<std::size_t>(checked_numel(shape, itemsize(dtype), op, loc)) * itemsize(dtype);
  Ref<Storage> storage;  // made first: when it fails, nothing else was
  try {
    storage = Storage::allocate(n, device);
  } catch (const std::bad_alloc&) {
    out_of_memory(shape, dtype, device, n, op, loc);
  }
  auto* impl = new TensorImpl();
  impl->shape = shape;
  impl->dtype = dtype;
  impl->device = device;
  impl->storage = std::move(storage);
  return Tensor(Ref<TensorImpl>::adopt(impl));
}

/// A tensor with a new shape over the same storage (numel must match; not checked here).
inline Tensor alias_tensor(const Tensor& src, const Shape& shape) {
  auto* impl = new TensorImpl();
  impl->shape = shape;
  impl->dtype = src.dtype();
  impl->device = src.device();
  impl->storage = src.impl()->storage;
  impl->symbolic = src.impl()->symbolic;
  return Tensor(Ref<TensorImpl>::adopt(impl));
}

/// Converts element i of a buffer of dtype d to T.
template <class T>
T load_as(const void* p, DType d, std::int64_t i) {
  return visit_dtype(d, [&](auto tag) -> T {
    using S = typename decltype(tag)::type;
    return rules::math::batch_cast<T>(static_cast<const S*>(p)[i]);  // NaN/out of range: T's lowest
  });
}

/// Throws ValueError when a tensor handle is undefined.
inline void require_defined(const Tensor& t, std::string_view op, const std::source_location& loc) {
  if (SC_UNLIKELY(!t.defined()))
    fail<ValueError>(op, loc, "got an undefined tensor (a default-constructed or moved-from sc::Tensor, or an empty "
                     "sc::Variable)");
}
/// Throws (StagingError) when a value is needed from a symbolic tensor; a tensor on any device
/// passes.
inline void require_value(const Tensor& t, std::string_view op, const std::source_location& loc) {
  require_defined(t, op, loc);
  if (SC_UNLIKELY(t.is_symbolic()))
    fail<StagingError>(op, loc, "needs a concrete value, but this tensor is symbolic (being traced); "
                                "use sc::cond / sc::while_loop for data-dependent control flow");
}
/// require_value, and the value must be on the host (DeviceError otherwise): for reading it there.
inline void require_concrete(const Tensor& t, std::string_view op, const std::source_location& loc) {
  require_value(t, op, loc);
  if (SC_UNLIKELY(!t.device().is_cpu()))
    fail<DeviceError>(op, loc, "reads values on the host; call .to(sc::Device::cpu()) first");
}

/// A concrete tensor's copy on device d (itself when it is there), made without an op: what
/// creation, loading and reading values use. Tapes and traces see no copy; Tensor::to (the op,
/// ops/to_device.hpp) is the differentiable, traceable move.
inline Tensor device_copy(const Tensor& t, Device d, std::string_view op, const std::source_location& loc) {
  require_value(t, op, loc);
  if (t.device() == d) return t;
  for (const Device x : {t.device(), d})
    if (x.is_cuda()) cuda::detail::require_device(x, op, loc);
  const cuda::detail::ScopedCallSite site(op, loc);
  Tensor out = empty_tensor(t.shape(), t.dtype(), d, op, loc);
  cuda::detail::copy(out.raw_data(), d, t.raw_data(), t.device(), t.nbytes(), op, loc);
  return out;
}

/// The tensor itself on the host, or its copy there (the host waits for the device's work).
inline Tensor on_host(const Tensor& t, std::string_view op, const std::source_location& loc) {
  require_defined(t, op, loc);
  if (t.is_symbolic() || t.device().is_cpu()) return t;
  return device_copy(t, Device::cpu(), op, loc);
}

}  // namespace detail

template <Number T>
T Tensor::item(std::source_location loc) const {
  if (defined() && device().is_cuda() && !is_symbolic()) return detail::on_host(*this, "item", loc).item<T>(loc);
  detail::require_concrete(*this, "item", loc);
  if (numel() != 1)
    detail::fail<ShapeError>("item", loc, "needs exactly one element, tensor has shape ", shape());
  return static_cast<T>(detail::load_as<element_t<T>>(raw_data(), dtype(), 0));
}

template <Number T>
std::vector<T> Tensor::to_vector(std::source_location loc) const {
  if constexpr (!Element<T>) {
    const std::vector<element_t<T>> e = to_vector<element_t<T>>(loc);
    return std::vector<T>(e.begin(), e.end());
  } else {
    if (defined() && device().is_cuda() && !is_symbolic())
      return detail::on_host(*this, "to_vector", loc).to_vector<T>(loc);
    detail::require_concrete(*this, "to_vector", loc);
    std::vector<T> out(static_cast<std::size_t>(numel()));
    if constexpr (!std::is_same_v<T, bool>) {  // std::vector<bool> has no data()
      if (dtype() == dtype_of<T>()) {
        if (!out.empty()) std::memcpy(out.data(), raw_data(), nbytes());
        return out;
      }
    }
    for (std::int64_t i = 0; i < numel(); ++i) out[i] = detail::load_as<T>(raw_data(), dtype(), i);
    return out;
  }
}

inline Tensor::operator bool() const {
  const std::source_location loc = std::source_location::current();
  detail::require_defined(*this, "bool", loc);
  if (is_symbolic()) {
    // a conversion takes no source_location: name the user's line of the op that made the value
    std::string from;
    for (const detail::TraceState* t = detail::context().trace; t != nullptr; t = t->parent)
      if (t->serial == impl_->symbolic.trace) from = t->origin(impl_->symbolic.id);
    throw StagingError("[bool] a symbolic tensor has no truth value while tracing" +
                       (from.empty() ? std::string() : " (it is the value of " + from + ")") +
                       "; use sc::cond(pred, then_fn, else_fn) or sc::while_loop instead of if/while");
  }
  if (device().is_cuda()) return static_cast<bool>(detail::on_host(*this, "bool", loc));
  if (numel() != 1)
    throw ShapeError("[bool] the truth value of a tensor with shape " + shape().str() +
                     " is ambiguous; reduce it first (sc::sum, sc::max, ...)");
  return detail::load_as<bool>(raw_data(), dtype(), 0);
}

}  // namespace stagecraft
