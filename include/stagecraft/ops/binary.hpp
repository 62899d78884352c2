// Elementwise binary ops with NumPy broadcasting: arithmetic, pow, maximum/minimum,
// comparisons and logical ops, and the C++ operators (scalars on either side are weak).
#pragma once
#include <cmath>

#include "../eager/dispatch.hpp"
#include "elementwise_rules.hpp"

namespace stagecraft {
namespace ops {

struct Add : Binary<Add, BinaryKind::arithmetic> {
  SC_OP_HEAD(Add, "add")
  template <class T> static T scalar(T a, T b) { return static_cast<T>(a + b); }
  template <class B> static B simd(const B& a, const B& b) { return a + b; }
};
struct Sub : Binary<Sub, BinaryKind::arithmetic> {
  SC_OP_HEAD(Sub, "sub")
  template <class T> static T scalar(T a, T b) { return static_cast<T>(a - b); }
  template <class B> static B simd(const B& a, const B& b) { return a - b; }
};
struct Mul : Binary<Mul, BinaryKind::arithmetic> {
  SC_OP_HEAD(Mul, "mul")
  template <class T> static T scalar(T a, T b) { return static_cast<T>(a * b); }
  template <class B> static B simd(const B& a, const B& b) { return a * b; }
};
/// True division: integer inputs are promoted to f32 first (as in PyTorch).
struct Div : Binary<Div, BinaryKind::floating> {
  SC_OP_HEAD(Div, "div")
  template <class T> static T scalar(T a, T b) { return a / b; }
  template <class B> static B simd(const B& a, const B& b) { return a / b; }
};
/// a^b; for integers by repeated squaring (a negative exponent gives 0 unless |a| is 1).
struct Pow : Binary<Pow, BinaryKind::arithmetic> {
  SC_OP_HEAD(Pow, "pow")
  template <class T> static T scalar(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return std::pow(a, b);
    } else {
      if (b < 0) return a == 1 ? T(1) : (a == -1 ? ((b & 1) ? T(-1) : T(1)) : T(0));
      T r = 1;
      for (; b; b >>= 1, a = static_cast<T>(a * a))
        if (b & 1) r = static_cast<T>(r * a);
      return r;
    }
  }
  template <class B> static B simd(const B& a, const B& b)
    requires std::is_floating_point_v<typename B::value_type> { return xsimd::pow(a, b); }
};
/// Larger of a and b; NaN in either gives NaN (as NumPy's maximum).
struct Maximum : Binary<Maximum, BinaryKind::arithmetic> {
  SC_OP_HEAD(Maximum, "maximum")
  template <class T> static T scalar(T a, T b) { return (a > b || a != a) ? a : b; }
  template <class B> static B simd(const B& a, const B& b) { return xsimd::select((a > b) || (a != a), a, b); }
};
/// Smaller of a and b; NaN in either gives NaN (as NumPy's minimum).
struct Minimum : Binary<Minimum, BinaryKind::arithmetic> {
  SC_OP_HEAD(Minimum, "minimum")
  template <class T> static T scalar(T a, T b) { return (a < b || a != a) ? a : b; }
  template <class B> static B simd(const B& a, const B& b) { return xsimd::select((a < b) || (a != a), a, b); }
};

#define SC_COMPARE_OP(S, str, expr)                                \
  struct S : Binary<S, BinaryKind::compare> {                      \
    SC_OP_HEAD(S, str)                                             \
    template <class T> static bool scalar(T a, T b) { return expr; } \
  };
SC_COMPARE_OP(Less, "less", a < b)
SC_COMPARE_OP(LessEqual, "less_equal", a <= b)
SC_COMPARE_OP(Greater, "greater", a > b)
SC_COMPARE_OP(GreaterEqual, "greater_equal", a >= b)
SC_COMPARE_OP(Equal, "equal", a == b)
SC_COMPARE_OP(NotEqual, "not_equal", a != b)
#undef SC_COMPARE_OP

struct LogicalAnd : Binary<LogicalAnd, BinaryKind::logical> {
  SC_OP_HEAD(LogicalAnd, "logical_and")
  template <class T> static bool scalar(T a, T b) { return a != T(0) && b != T(0); }
};
struct LogicalOr : Binary<LogicalOr, BinaryKind::logical> {
  SC_OP_HEAD(LogicalOr, "logical_or")
  template <class T> static bool scalar(T a, T b) { return a != T(0) || b != T(0); }
};

}  // namespace ops

// Named functions, each with the C++ scalar forms: f(t, 2.f) and f(2.f, t).
#define SC_BINARY_API(fn, S)                                                                        \
  inline Tensor fn(const Tensor& a, const Tensor& b,                                                 \
                   std::source_location loc = std::source_location::current()) {                     \
    return detail::dispatch2<ops::S>(a, b, {}, loc);                                                 \
  }                                                                                                  \
  template <Scalar V>                                                                                \
  Tensor fn(const Tensor& a, V b, std::source_location loc = std::source_location::current()) {      \
    return detail::dispatch2<ops::S>(a, detail::weak_scalar(b, a, loc), {}, loc);                    \
  }                                                                                                  \
  template <Scalar V>                                                                                \
  Tensor fn(V a, const Tensor& b, std::source_location loc = std::source_location::current()) {      \
    return detail::dispatch2<ops::S>(detail::weak_scalar(a, b, loc), b, {}, loc);                    \
  }
/// a + b (numeric).
SC_BINARY_API(add, Add)
/// a - b (numeric).
SC_BINARY_API(sub, Sub)
/// a * b (numeric).
SC_BINARY_API(mul, Mul)
/// a / b, true division (integers become f32).
SC_BINARY_API(div, Div)
/// a to the power b.
SC_BINARY_API(pow, Pow)
/// Elementwise larger value; NaN propagates.
SC_BINARY_API(maximum, Maximum)
/// Elementwise smaller value; NaN propagates.
SC_BINARY_API(minimum, Minimum)
/// a < b as bool.
SC_BINARY_API(less, Less)
/// a <= b as bool.
SC_BINARY_API(less_equal, LessEqual)
/// a > b as bool.
SC_BINARY_API(greater, Greater)
/// a >= b as bool.
SC_BINARY_API(greater_equal, GreaterEqual)
/// a == b as bool.
SC_BINARY_API(equal, Equal)
/// a != b as bool.
SC_BINARY_API(not_equal, NotEqual)
/// Both nonzero, as bool.
SC_BINARY_API(logical_and, LogicalAnd)
/// Either nonzero, as bool.
SC_BINARY_API(logical_or, LogicalOr)
#undef SC_BINARY_API

// Operators: the left operand is an Operand so the user's line is kept.
#define SC_BINARY_OPERATOR(op, S)                                                              \
  inline Tensor operator op(Operand a, const Tensor& b) { return detail::dispatch2<ops::S>(a.t, b, {}, a.loc); } \
  template <Scalar V>                                                                          \
  Tensor operator op(Operand a, V b) {                                                         \
    return detail::dispatch2<ops::S>(a.t, detail::weak_scalar(b, a.t, a.loc), {}, a.loc);      \
  }                                                                                            \
  template <Scalar V>                                                                          \
  Tensor operator op(V a, Operand b) {                                                         \
    return detail::dispatch2<ops::S>(detail::weak_scalar(a, b.t, b.loc), b.t, {}, b.loc);      \
  }
SC_BINARY_OPERATOR(+, Add)
SC_BINARY_OPERATOR(-, Sub)
SC_BINARY_OPERATOR(*, Mul)
SC_BINARY_OPERATOR(/, Div)
SC_BINARY_OPERATOR(<, Less)
SC_BINARY_OPERATOR(<=, LessEqual)
SC_BINARY_OPERATOR(>, Greater)
SC_BINARY_OPERATOR(>=, GreaterEqual)
SC_BINARY_OPERATOR(==, Equal)
SC_BINARY_OPERATOR(!=, NotEqual)
SC_BINARY_OPERATOR(&&, LogicalAnd)
SC_BINARY_OPERATOR(||, LogicalOr)
#undef SC_BINARY_OPERATOR

/// Compound assignment rebinds the handle to a new tensor (tensors are values; no aliasing).
inline Tensor& operator+=(Tensor& a, Operand b) { return a = detail::dispatch2<ops::Add>(a, b.t, {}, b.loc); }
inline Tensor& operator-=(Tensor& a, Operand b) { return a = detail::dispatch2<ops::Sub>(a, b.t, {}, b.loc); }
inline Tensor& operator*=(Tensor& a, Operand b) { return a = detail::dispatch2<ops::Mul>(a, b.t, {}, b.loc); }
inline Tensor& operator/=(Tensor& a, Operand b) { return a = detail::dispatch2<ops::Div>(a, b.t, {}, b.loc); }

}  // namespace stagecraft
