// Creating tensors: from values and nested lists, constants, ranges, and user memory.
#pragma once
#include <cmath>
#include <concepts>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <source_location>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensor.hpp"

namespace stagecraft {

namespace detail {

/// A fresh tensor on the current device filled by fill(T* data) on the host.
template <class T, class Fill>
Tensor make_host(const Shape& shape, Fill&& fill, std::string_view op = "tensor",
                 const std::source_location& loc = std::source_location::current()) {
  Tensor t = empty_tensor(shape, dtype_of<T>(), Device::cpu(), op, loc);
  fill(static_cast<T*>(t.raw_data()));
  const Device d = current_device();
  return d.is_cpu() ? t : device_copy(t, d, op, loc);
}

/// A fresh tensor on the current device with every element v. On a GPU a kernel fills it (no
/// host buffer, no copy) when the device's fill, which takes a double, gives v exactly.
template <class T>
Tensor make_full(const Shape& shape, T v, std::string_view op, const std::source_location& loc) {
  const Device d = current_device();
  if (d.is_cuda() && static_cast<T>(static_cast<double>(v)) == v) {
    cuda::detail::require_device(d, op, loc);
    const cuda::detail::ScopedCallSite site(op, loc);
    Tensor t = empty_tensor(shape, dtype_of<T>(), d, op, loc);
    cuda::detail::fill(t.raw_data(), d, static_cast<cuda::abi::DT>(dtype_of<T>()), static_cast<double>(v), t.numel(), op,
                       loc);
    return t;
  }
  return make_host<T>(
      shape,
      [&](T* p) {
        for (std::int64_t i = 0, n = shape.numel(); i < n; ++i) p[i] = v;
      },
      op, loc);
}

template <class T> struct nested_list { using type = T; static constexpr int depth = 0; };
template <class T> struct nested_list<std::initializer_list<T>> {
  using type = typename nested_list<T>::type;
  static constexpr int depth = nested_list<T>::depth + 1;
};

/// Records the extents of a nested list, checking that it is rectangular.
template <class L>
void list_shape(const L& l, Shape& s, int depth, const std::source_location& loc) {
  if constexpr (nested_list<L>::depth > 0) {
    if (s.rank() <= depth) s.push_back(static_cast<std::int64_t>(l.size()));
    else if (s[depth] != static_cast<std::int64_t>(l.size()))
      fail<ShapeError>("tensor", loc, "nested list is ragged: axis ", depth, " has lengths ", s[depth],
                       " and ", l.size());
    for (const auto& e : l) list_shape(e, s, depth + 1, loc);
    if (l.size() == 0)  // still record the deeper extents as 0
      for (int d = depth + 1; d < depth + nested_list<L>::depth; ++d)
        if (s.rank() <= d) s.push_back(0);
  }
}
/// v as the element type that stores it (element_t); a 64-bit unsigned value above INT64_MAX
/// fits no dtype: ValueError.
template <Number T>
element_t<T> to_element(T v, std::string_view op, const std::source_location& loc) {
  if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(std::int64_t)) {
    if (v > static_cast<T>(std::numeric_limits<std::int64_t>::max()))
      fail<ValueError>(op, loc, "value ", v, " does not fit i64, the widest integer dtype");
  }
  return static_cast<element_t<T>>(v);
}
template <class L, class T>
void list_fill(const L& l, T*& out, const std::source_location& loc) {
  if constexpr (nested_list<L>::depth > 0) {
    for (const auto& e : l) list_fill(e, out, loc);
  } else {
    *out++ = to_element(l, "tensor", loc);
  }
}
template <class L>
Tensor from_list(const L& l, const std::source_location& loc) {
  using T = element_t<typename nested_list<L>::type>;
  Shape s;
  list_shape(l, s, 0, loc);
  return make_host<T>(s, [&](T* p) { list_fill(l, p, loc); }, "tensor", loc);
}

}  // namespace detail

/// A 1-D tensor from a list: sc::tensor({1.f, 2.f, 3.f}) is f32 [3]. The dtype follows the
/// C++ type: float f32, double f64, int i32, int64_t (and long long) i64, bool bool; other
/// integers take the dtype that holds their values (element_t: unsigned char i32, unsigned i64).
template <Number T>
Tensor tensor(std::initializer_list<T> v, std::source_location loc = std::source_location::current()) {
  return detail::from_list(v, loc);
}
/// A 2-D tensor from nested lists (rows must have equal lengths).
template <Number T>
Tensor tensor(std::initializer_list<std::initializer_list<T>> v, std::source_location loc = std::source_location::current()) {
  return detail::from_list(v, loc);
}
/// A 3-D tensor from nested lists.
template <Number T>
Tensor tensor(std::initializer_list<std::initializer_list<std::initializer_list<T>>> v,
              std::source_location loc = std::source_location::current()) {
  return detail::from_list(v, loc);
}
/// A 4-D tensor from nested lists.
template <Number T>
Tensor tensor(std::initializer_list<std::initializer_list<std::initializer_list<std::initializer_list<T>>>> v,
              std::source_location loc = std::source_location::current()) {
  return detail::from_list(v, loc);
}
/// A tensor of the given shape holding a copy of `values` (row-major; sizes must match).
/// (dtype as the lists': std::vector<std::uint8_t> pixels give i32, std::vector<bool> bool).
template <Number T>
Tensor tensor(const std::vector<T>& values, Shape shape, std::source_location loc = std::source_location::current()) {
  using E = element_t<T>;
  const std::int64_t n = detail::checked_numel(shape, itemsize(dtype_of<E>()), "tensor", loc);
  if (static_cast<std::int64_t>(values.size()) != n)
    detail::fail<ShapeError>("tensor", loc, values.size(), " values do not fill shape ", shape, " (", n, " elements)");
  return detail::make_host<E>(
      shape,
      [&](E* p) {
        if constexpr (std::is_same_v<T, E> && !std::is_same_v<T, bool>) {  // std::vector<bool> has no data()
          if (!values.empty()) std::memcpy(p, values.data(), values.size() * sizeof(T));
        } else {
          for (const T v : values) *p++ = detail::to_element(v, "tensor", loc);
        }
      },
      "tensor", loc);
}
/// A 1-D tensor holding a copy of `values`.
template <Number T>
Tensor tensor(const std::vector<T>& values, std::source_location loc = std::source_location::current()) {
  return tensor(values, Shape{static_cast<std::int64_t>(values.size())}, loc);
}
/// A rank-0 tensor (dtype as sc::tensor's).
template <Number T>
Tensor scalar(T v, std::source_location loc = std::source_location::current()) {
  const element_t<T> e = detail::to_element(v, "scalar", loc);
  return detail::make_host<element_t<T>>(Shape{}, [&](element_t<T>* p) { *p = e; }, "scalar", loc);
}

/// Checks that every extent is non-negative and the tensor fits (see detail::checked_numel).
inline void check_shape(const Shape& s, std::string_view op, const std::source_location& loc,
                        DType d = DType::b8) {
  detail::checked_numel(s, itemsize(d), op, loc);
}

namespace detail {
/// Every element `value`, as dtype d: a floating value by cast()'s rule (NaN or out of range:
/// an integer dtype's lowest value); an integer exactly (never through double), or converted to
/// a floating dtype, or a DTypeError when an integer dtype cannot hold it (as eager's weak
/// scalars). `op` names the caller in errors (full, zeros, ones).
template <class V>
Tensor full_as(const Shape& shape, V value, DType d, std::string_view op, const std::source_location& loc) {
  check_shape(shape, op, loc, d);
  return visit_dtype(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<V>) {
      return make_full<T>(shape, rules::math::batch_cast<T>(value), op, loc);
    } else if constexpr (std::is_same_v<T, bool> || std::is_floating_point_v<T>) {
      return make_full<T>(shape, static_cast<T>(value), op, loc);
    } else {
      // (as a standard integer type first: in_range takes no bool or character type)
      using W = std::conditional_t<std::is_signed_v<V>, long long, unsigned long long>;
      const W w = static_cast<W>(value);
      if (!std::in_range<T>(w)) fail<DTypeError>(op, loc, "the integer ", w, " does not fit ", name(d));
      return make_full<T>(shape, static_cast<T>(w), op, loc);
    }
  });
}
}  // namespace detail

/// A tensor of the given shape with every element `value` converted to dtype d: a floating value
/// as cast() converts it; an integer exactly (an i64 above 2^53 is not rounded through double),
/// a DTypeError where d is an integer dtype that cannot hold it.
inline Tensor full(Shape shape, double value, DType d, std::source_location loc = std::source_location::current()) {
  return detail::full_as(shape, value, d, "full", loc);
}
template <std::integral I>
Tensor full(Shape shape, I value, DType d, std::source_location loc = std::source_location::current()) {
  return detail::full_as(shape, value, d, "full", loc);
}
/// A tensor of the given shape with every element `value`; the dtype is value's (7.f → f32).
/// The value is stored as given (an i64 above 2^53 is not rounded through double); other
/// integer types take sc::tensor's dtype (element_t).
template <Number T>
Tensor full(Shape shape, T value, std::source_location loc = std::source_location::current()) {
  using E = element_t<T>;
  check_shape(shape, "full", loc, dtype_of<E>());
  return detail::make_full<E>(shape, detail::to_element(value, "full", loc), "full", loc);
}
/// Zeros of the given shape and dtype (f32 by default).
inline Tensor zeros(Shape shape, DType d = DType::f32, std::source_location loc = std::source_location::current()) {
  return detail::full_as(shape, 0.0, d, "zeros", loc);
}
/// Ones of the given shape and dtype (f32 by default).
inline Tensor ones(Shape shape, DType d = DType::f32, std::source_location loc = std::source_location::current()) {
  return detail::full_as(shape, 1.0, d, "ones", loc);
}
/// Zeros with x's shape and dtype, on x's device (whatever DeviceScope is active).
inline Tensor zeros_like(const Tensor& x) {
  const detail::DevicePin on(x.device());
  return zeros(x.shape(), x.dtype());
}
/// Ones with x's shape and dtype, on x's device (whatever DeviceScope is active).
inline Tensor ones_like(const Tensor& x) {
  const detail::DevicePin on(x.device());
  return ones(x.shape(), x.dtype());
}

/// start, start+step, ... below stop (above, for a negative step). Integers give i64.
inline Tensor arange(double start, double stop, double step, DType d,
                     std::source_location loc = std::source_location::current()) {
  if (step == 0) detail::fail<ValueError>("arange", loc, "step must not be zero");
  if (!std::isfinite(start) || !std::isfinite(stop) || !std::isfinite(step))
    detail::fail<ValueError>("arange", loc, "start, stop and step must be finite, got ", start, ", ", stop, ", ", step);
  const double span = std::ceil((stop - start) / step);
  if (span > static_cast<double>(max_tensor_bytes))  // also an inf from a tiny step
    detail::fail<ShapeError>("arange", loc, "[", start, ", ", stop, ") in steps of ", step, " has ", span,
                             " elements: too many");
  const std::int64_t n = span > 0 ? static_cast<std::int64_t>(span) : 0;
  return visit_dtype(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return detail::make_host<T>(
        Shape{n},
        [&](T* p) {
          // NaN/out of range: T's lowest, as cast() and full() (static_cast would be undefined)
          for (std::int64_t i = 0; i < n; ++i) p[i] = rules::math::batch_cast<T>(start + static_cast<double>(i) * step);
        },
        "arange", loc);
  });
}
namespace detail {
/// Integer arange in exact 64-bit arithmetic (through double, values above 2^53 would round).
/// Distances are unsigned: stop - start and i * step fit in 64 bits without overflow.
inline Tensor arange_i64(std::int64_t start, std::int64_t stop, std::int64_t step, const std::source_location& loc) {
  using U = std::uint64_t;
  if (step == 0) fail<ValueError>("arange", loc, "step must not be zero");
  U n = 0;
  if ((step > 0 && stop > start) || (step < 0 && stop < start)) {
    const U span = step > 0 ? U(stop) - U(start) : U(start) - U(stop);
    const U mag = step > 0 ? U(step) : U(0) - U(step);
    n = span / mag + (span % mag != 0 ? 1 : 0);
  }
  if (n > U(max_tensor_bytes) / sizeof(std::int64_t))
    fail<ShapeError>("arange", loc, "[", start, ", ", stop, ") in steps of ", step, " has ", n,
                     " elements: too many");
  const auto count = static_cast<std::int64_t>(n);
  return make_host<std::int64_t>(
      Shape{count},
      [&](std::int64_t* p) {
        U v = U(start);  // start + i*step, exact: every value lies between start and stop
        for (std::int64_t i = 0; i < count; ++i, v += U(step)) p[i] = static_cast<std::int64_t>(v);
      },
      "arange", loc);
}
}  // namespace detail

/// 0, 1, ..., stop-1 as i64 (as NumPy's and PyTorch's arange of integers).
template <Scalar T>
Tensor arange(T stop, std::source_location loc = std::source_location::current()) {
  if constexpr (std::is_floating_point_v<T>) return arange(0.0, static_cast<double>(stop), 1.0, dtype_of<T>(), loc);
  else return detail::arange_i64(0, static_cast<std::int64_t>(stop), 1, loc);
}
/// start, start+step, ... below stop; the dtype follows the arguments' type (ints give i64).
template <Scalar T>
Tensor arange(T start, T stop, T step = T(1), std::source_location loc = std::source_location::current()) {
  if constexpr (std::is_floating_point_v<T>)
    return arange(static_cast<double>(start), static_cast<double>(stop), static_cast<double>(step), dtype_of<T>(), loc);
  else
    return detail::arange_i64(static_cast<std::int64_t>(start), static_cast<std::int64_t>(stop),
                              static_cast<std::int64_t>(step), loc);
}
/// The n×n identity (f32 by default).
inline Tensor eye(std::int64_t n, DType d = DType::f32, std::source_location loc = std::source_location::current()) {
  if (n < 0) detail::fail<ShapeError>("eye", loc, "size must be non-negative, got ", n);
  Tensor t = zeros({n, n}, d, loc);
  visit_dtype(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = static_cast<T*>(t.raw_data());
    for (std::int64_t i = 0; i < n; ++i) p[i * n + i] = T(1);
  });
  return t;
}
/// A zero-copy view of user memory (row-major, contiguous). The caller keeps `data` alive
/// and unchanged for as long as the tensor or anything reshaped from it is used.
inline Tensor from_blob(void* data, Shape shape, DType d, std::source_location loc = std::source_location::current()) {
  check_shape(shape, "from_blob", loc, d);
  if (!data && shape.numel() > 0) detail::fail<ValueError>("from_blob", loc, "null pointer for shape ", shape);
  auto* impl = new detail::TensorImpl();
  impl->shape = shape;
  impl->dtype = d;
  impl->device = Device::cpu();
  impl->storage = detail::Storage::borrow(data, static_cast<std::size_t>(shape.numel()) * itemsize(d), Device::cpu());
  return Tensor(detail::Ref<detail::TensorImpl>::adopt(impl));
}
/// Typed overload: from_blob(float_ptr, shape) is f32.
template <Element T>
Tensor from_blob(T* data, Shape shape, std::source_location loc = std::source_location::current()) {
  return from_blob(static_cast<void*>(data), shape, dtype_of<T>(), loc);
}

}  // namespace stagecraft
