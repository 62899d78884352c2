// Element types, their C++ types, and the one type-promotion table.
#pragma once
#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>

namespace stagecraft {

/// Element type of a tensor. Ordered by promotion rank: bool < i32 < i64 < f32 < f64.
enum class DType : std::uint8_t { b8 = 0, i32 = 1, i64 = 2, f32 = 3, f64 = 4 };

inline constexpr DType boolean = DType::b8;  ///< bool tensors (comparisons, masks)
inline constexpr DType i32 = DType::i32;     ///< 32-bit signed integers
inline constexpr DType i64 = DType::i64;     ///< 64-bit signed integers (indices, labels)
inline constexpr DType f32 = DType::f32;     ///< 32-bit float, the default
inline constexpr DType f64 = DType::f64;     ///< 64-bit float
inline constexpr int num_dtypes = 5;

/// Bytes per element.
constexpr std::size_t itemsize(DType d) {
  constexpr std::size_t sizes[] = {1, 4, 8, 4, 8};
  return sizes[static_cast<int>(d)];
}
/// Lower-case name as printed in errors and graphs: "f32", "bool", ...
constexpr std::string_view name(DType d) {
  constexpr std::string_view names[] = {"bool", "i32", "i64", "f32", "f64"};
  return names[static_cast<int>(d)];
}
constexpr bool is_floating(DType d) { return d == DType::f32 || d == DType::f64; }
constexpr bool is_integral(DType d) { return d == DType::i32 || d == DType::i64; }
constexpr bool is_bool(DType d) { return d == DType::b8; }

inline std::ostream& operator<<(std::ostream& os, DType d) { return os << name(d); }

/// The dtype of a C++ element type: float→f32, double→f64, int32→i32, int64→i64, bool→bool.
template <class T>
constexpr DType dtype_of() {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, bool>) return DType::b8;
  else if constexpr (std::is_same_v<U, float>) return DType::f32;
  else if constexpr (std::is_same_v<U, double>) return DType::f64;
  else if constexpr (std::is_integral_v<U> && sizeof(U) <= 4) return DType::i32;
  else if constexpr (std::is_integral_v<U>) return DType::i64;
  else static_assert(sizeof(U) == 0, "stagecraft: no dtype for this C++ type (use float, double, int32_t, int64_t or bool)");
}

/// The C++ type stored for a dtype.
template <DType D> struct dtype_traits;
template <> struct dtype_traits<DType::b8> { using type = bool; };
template <> struct dtype_traits<DType::i32> { using type = std::int32_t; };
template <> struct dtype_traits<DType::i64> { using type = std::int64_t; };
template <> struct dtype_traits<DType::f32> { using type = float; };
template <> struct dtype_traits<DType::f64> { using type = double; };
template <DType D> using ctype_t = typename dtype_traits<D>::type;

/// C++ types that are tensor elements.
template <class T>
concept Element = std::is_same_v<T, bool> || std::is_same_v<T, std::int32_t> ||
                  std::is_same_v<T, std::int64_t> || std::is_same_v<T, float> ||
                  std::is_same_v<T, double>;
/// C++ arithmetic types accepted as scalar operands (they are 'weak', see promote_scalar).
template <class T>
concept Scalar = std::is_arithmetic_v<std::remove_cvref_t<T>>;

/// C++ numbers that make tensors and read them back (sc::tensor, sc::scalar, sc::full, item,
/// to_vector): the Element types and the other integer types (long long, short, unsigned
/// char, unsigned, size_t, ...). Not the character types (char, wchar_t, char8/16/32_t: text,
/// not numbers) nor long double (no dtype holds it).
template <class T>
concept Number = std::is_arithmetic_v<T> && !std::is_same_v<T, long double> && !std::is_same_v<T, char> &&
                 !std::is_same_v<T, wchar_t> && !std::is_same_v<T, char8_t> && !std::is_same_v<T, char16_t> &&
                 !std::is_same_v<T, char32_t>;

namespace detail {
template <class T>
constexpr auto element_of() {
  if constexpr (Element<T>) return T{};
  else if constexpr (std::is_signed_v<T> ? sizeof(T) <= 4 : sizeof(T) < 4) return std::int32_t{};
  else return std::int64_t{};
}
}  // namespace detail
/// The Element type that stores a Number: itself for an Element; else the integer element type
/// that holds all its values (i32 for integers of 8 and 16 bits, i64 for long long, unsigned and
/// wider; a 64-bit unsigned value above INT64_MAX fits none: the callers raise ValueError).
template <Number T>
using element_t = decltype(detail::element_of<T>());

// ---------------------------------------------------------------------------------------
// Promotion. The one table: for two tensors the result is the higher of the two in the
// order bool < i32 < i64 < f32 < f64 (so i64 + f32 is f32, as in PyTorch and JAX).
//
//            bool  i32   i64   f32   f64
//   bool     bool  i32   i64   f32   f64
//   i32      i32   i32   i64   f32   f64
//   i64      i64   i64   i64   f32   f64
//   f32      f32   f32   f32   f32   f64
//   f64      f64   f64   f64   f64   f64
//
// A C++ scalar is weak: it takes the tensor's dtype when it is of the same kind or a lower
// one (i64 tensor + 1 → i64; f64 tensor * 0.5f → f64; f32 tensor + 1 → f32). A scalar of
// a higher kind gives that kind's default: i32 tensor * 0.5 → f32; bool tensor + 1 → i64.
// ---------------------------------------------------------------------------------------
constexpr DType promote(DType a, DType b) { return a < b ? b : a; }

/// Kind of a scalar operand: 0 bool, 1 integer, 2 floating.
enum class ScalarKind : std::uint8_t { boolean = 0, integer = 1, floating = 2 };
template <class T>
constexpr ScalarKind scalar_kind() {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, bool>) return ScalarKind::boolean;
  else if constexpr (std::is_integral_v<U>) return ScalarKind::integer;
  else return ScalarKind::floating;
}
constexpr ScalarKind kind_of(DType d) {
  return is_floating(d) ? ScalarKind::floating
                        : (is_integral(d) ? ScalarKind::integer : ScalarKind::boolean);
}
/// Result dtype of (tensor of dtype t) op (weak scalar of kind k).
constexpr DType promote_scalar(DType t, ScalarKind k) {
  if (k <= kind_of(t)) return t;
  return k == ScalarKind::floating ? DType::f32 : DType::i64;
}

// ---------------------------------------------------------------------------------------
// Visiting: run a generic callable with the C++ type of a runtime dtype.
// ---------------------------------------------------------------------------------------
template <class T> struct type_tag { using type = T; };

/// Calls f(type_tag<T>{}) with T the C++ type of d.
template <class F>
decltype(auto) visit_dtype(DType d, F&& f) {
  switch (d) {
    case DType::b8: return f(type_tag<bool>{});
    case DType::i32: return f(type_tag<std::int32_t>{});
    case DType::i64: return f(type_tag<std::int64_t>{});
    case DType::f32: return f(type_tag<float>{});
    case DType::f64: break;
  }
  return f(type_tag<double>{});
}
/// Calls f(type_tag<T>{}) for the numeric dtypes only (bool is the caller's to reject).
template <class F>
decltype(auto) visit_numeric(DType d, F&& f) {
  switch (d) {
    case DType::i32: return f(type_tag<std::int32_t>{});
    case DType::i64: return f(type_tag<std::int64_t>{});
    case DType::f32: return f(type_tag<float>{});
    default: break;
  }
  return f(type_tag<double>{});
}
/// Calls f(type_tag<T>{}) for f32 or f64 (anything else is the caller's to reject).
template <class F>
decltype(auto) visit_floating(DType d, F&& f) {
  if (d == DType::f32) return f(type_tag<float>{});
  return f(type_tag<double>{});
}

}  // namespace stagecraft
