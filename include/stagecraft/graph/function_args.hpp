// sc::function's argument signatures (what a call is looked up by: each tensor's dtype, shape and
// device, each Variable's identity, each plain value) and the values a trace receives in place of
// its arguments.
#pragma once
#include <bit>
#include <concepts>
#include <source_location>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../core/tensor.hpp"
#include "../state/variable.hpp"
#include "trace.hpp"

namespace stagecraft {

namespace detail_fn {

template <class T>
concept PlainArg = std::is_arithmetic_v<T> || std::is_enum_v<T> || std::same_as<T, std::string> ||
                   std::same_as<T, const char*> || std::same_as<T, Shape> || std::same_as<T, DType>;
template <class T>
concept TensorArg = std::same_as<T, Tensor>;
template <class T>
concept VariableArg = std::same_as<T, Variable>;
template <class T>
concept TensorListArg = std::same_as<T, std::vector<Tensor>>;

template <class T>
concept SupportedArg = PlainArg<T> || TensorArg<T> || VariableArg<T> || TensorListArg<T>;
/// A call whose first argument is a Tensor (Function::operator() takes it as an Operand).
template <class... A>
concept FirstIsTensor = sizeof...(A) > 0 && std::same_as<std::decay_t<std::tuple_element_t<0, std::tuple<A...>>>, Tensor>;

/// What a tensor argument contributes to a signature.
struct TensorSig {
  DType dtype = DType::f32;
  Shape shape;
  Device device;
  friend bool operator==(const TensorSig&, const TensorSig&) = default;
  std::string text() const {
    return std::string(name(dtype)) + shape.str() + (device.is_cpu() ? "" : "@" + device.str());
  }
};
inline TensorSig sig_of(const Tensor& t) { return {t.dtype(), t.shape(), t.device()}; }

/// One argument's part of the signature: compared field by field at every call (no strings are
/// built on a hit), described in words only for retrace notices.
struct ArgKey {
  char kind = 0;  ///< 'T' tensor, 'V' variable, 'L' tensor list, 'N' number, 'S' string/DType/Shape
  TensorSig tensor;
  std::vector<TensorSig> list;
  const void* id = nullptr;  ///< a variable's identity
  const void* type = nullptr;  ///< a plain value's C++ type (f(x, 1) and f(x, true) trace apart)
  std::string_view type_name;  ///< that type, in words
  double number = 0;
  long long integer = 0;
  std::string str;  ///< variable name, or a printed plain value
  friend bool operator==(const ArgKey& a, const ArgKey& b) {
    if (a.kind != b.kind || a.type != b.type) return false;
    switch (a.kind) {
      case 'T': return a.tensor == b.tensor;
      case 'V': return a.id == b.id;
      case 'L': return a.list == b.list;
      // the bits: 0.0 and -0.0 trace apart (x / k differs), and a NaN matches itself
      case 'N': return a.integer == b.integer && std::bit_cast<std::uint64_t>(a.number) == std::bit_cast<std::uint64_t>(b.number);
      default: return a.str == b.str;
    }
  }
  std::string text(bool with_type = false) const {
    const std::string type = with_type && !type_name.empty() ? " (" + std::string(type_name) + ")" : "";
    switch (kind) {
      case 'T': return tensor.text();
      case 'V': return "variable '" + str + "'";
      case 'L': {
        std::string t = "[";
        for (std::size_t i = 0; i < list.size(); ++i) t += (i ? ", " : "") + list[i].text();
        return t + "]";
      }
      case 'N': {
        std::ostringstream os;
        os.precision(17);
        if (number == static_cast<double>(integer) && !std::signbit(number)) os << integer;
        else os << number;
        return os.str() + type;
      }
      case 'S': return str + type;
      default: return str;
    }
  }
};

/// One address per type: a plain argument's type identity without RTTI.
template <class T>
inline constexpr char type_tag = 0;
template <class T>
constexpr std::string_view plain_type_name() {
  if constexpr (std::same_as<T, bool>) return "bool";
  else if constexpr (std::same_as<T, char>) return "char";
  else if constexpr (std::same_as<T, float>) return "float";
  else if constexpr (std::same_as<T, double>) return "double";
  else if constexpr (std::same_as<T, long double>) return "long double";
  else if constexpr (std::is_enum_v<T>) return "enum";
  else if constexpr (std::same_as<T, std::string>) return "std::string";
  else if constexpr (std::same_as<T, const char*>) return "const char*";
  else if constexpr (std::same_as<T, Shape>) return "Shape";
  else if constexpr (std::same_as<T, DType>) return "DType";
  else return "";
}

template <class T>
ArgKey key_of(const T& a) {
  using D = std::decay_t<T>;
  ArgKey k;
  if constexpr (PlainArg<D>) {
    k.type = &type_tag<D>;
    // integer types of one signedness print alike: say their size too
    if constexpr (std::is_integral_v<D> && !std::same_as<D, bool> && !std::same_as<D, char>)
      k.type_name = sizeof(D) == 8 ? (std::is_signed_v<D> ? "int64" : "uint64")
                    : sizeof(D) == 4 ? (std::is_signed_v<D> ? "int32" : "uint32")
                    : sizeof(D) == 2 ? (std::is_signed_v<D> ? "int16" : "uint16")
                                     : (std::is_signed_v<D> ? "int8" : "uint8");
    else k.type_name = plain_type_name<D>();
  }
  if constexpr (TensorArg<D>) {
    k.kind = 'T';
    if (a.defined()) k.tensor = sig_of(a);
  } else if constexpr (VariableArg<D>) {
    k.kind = 'V';
    k.id = a.state().get();
    if (a.defined()) k.str = a.name();
  } else if constexpr (TensorListArg<D>) {
    k.kind = 'L';
    for (const Tensor& x : a)
      if (x.defined()) k.list.push_back(sig_of(x));
  } else if constexpr (std::same_as<D, DType>) {
    k.kind = 'S';
    k.str = name(a);
  } else if constexpr (std::is_arithmetic_v<D> || std::is_enum_v<D>) {
    k.kind = 'N';
    if constexpr (std::is_enum_v<D>) k.integer = static_cast<long long>(a);
    else if constexpr (std::is_integral_v<D>) k.integer = static_cast<long long>(a);
    k.number = static_cast<double>(a);
    // a long double's bits past a double's: what rounding to double dropped, exact as a double
    if constexpr (std::same_as<D, long double>)
      k.integer = std::bit_cast<long long>(static_cast<double>(a - static_cast<long double>(k.number)));
  } else {
    k.kind = 'S';
    std::ostringstream os;
    os << a;
    k.str = os.str();
  }
  return k;
}

/// The value the traced call receives in place of an argument.
template <class T>
auto traced_arg(const T& a, graph::GraphBuilder& b, const std::source_location& loc) {
  using D = std::decay_t<T>;
  if constexpr (TensorArg<D>) {
    stagecraft::detail::require_defined(a, "function", loc);
    return b.add_input({a.shape(), a.dtype()}, a.device());  // arguments have no line of their own
  } else if constexpr (TensorListArg<D>) {
    std::vector<Tensor> v;
    for (const Tensor& x : a) v.push_back(b.add_input({x.shape(), x.dtype()}, x.device()));
    return v;
  } else {
    return a;  // variables by reference (reads become graph nodes), plain values as they are
  }
}

/// True when an argument holds a symbolic tensor.
template <class T>
bool any_symbolic(const T& a) {
  using D = std::decay_t<T>;
  if constexpr (TensorArg<D>) return a.defined() && a.is_symbolic();
  else if constexpr (TensorListArg<D>) {
    for (const Tensor& x : a)
      if (x.defined() && x.is_symbolic()) return true;
    return false;
  } else return false;
}

/// Appends the tensors an argument binds to the plan's inputs.
template <class T>
void bind_arg(const T& a, std::vector<Tensor>& out) {
  using D = std::decay_t<T>;
  if constexpr (TensorArg<D>) out.push_back(a);
  else if constexpr (TensorListArg<D>) out.insert(out.end(), a.begin(), a.end());
}

}  // namespace detail_fn

}  // namespace stagecraft
