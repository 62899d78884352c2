// Elementwise binary ops with NumPy broadcasting: arithmetic, pow, maximum/minimum, floor_div/mod,
// comparisons and logical ops, and the C++ operators (scalars on either side are weak).
#pragma once
#include <cmath>
#include <cstring>
#include <string_view>
#include <vector>

#include "../eager/dispatch.hpp"
#include "elementwise_rules.hpp"

namespace stagecraft {
namespace ops {

struct Add : Binary<Add, BinaryKind::arithmetic>, rules::Add {
  SC_OP_HEAD(Add, "add")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};
struct Sub : Binary<Sub, BinaryKind::arithmetic>, rules::Sub {
  SC_OP_HEAD(Sub, "sub")
  static constexpr bool vjp_negates_second = true;  // b's gradient is -g (ops::NegatesSecondGrad)
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a, Wanted w);
};
struct Mul : Binary<Mul, BinaryKind::arithmetic>, rules::Mul {
  SC_OP_HEAD(Mul, "mul")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a, Wanted wanted = {});
};
/// True division: integer inputs are promoted to f32 first (as in PyTorch).
struct Div : Binary<Div, BinaryKind::floating>, rules::Div {
  SC_OP_HEAD(Div, "div")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a, Wanted wanted = {});
};
/// a^b; for integers by repeated squaring (a negative exponent gives 0 unless |a| is 1).
struct Pow : Binary<Pow, BinaryKind::arithmetic>, rules::Pow {
  SC_OP_HEAD(Pow, "pow")
  /// A heavy grain where the exponent is a float of no form of its own (pow_in_double or the C
  /// library's pow, several ns an element: a 64K-element pow takes two threads, where grain() kept
  /// it on one below 131K elements a thread); grain_of<T>() for the others (costly: integers by
  /// repeated squaring on batches, floats' forms). An exponent tensor is judged by its first element.
  template <class T> static std::int64_t cpu_grain(Inputs in) {
    if constexpr (std::is_floating_point_v<T>) {
      if (in[1].numel() > 0 && form_of(*static_cast<const T*>(in[1].raw_data())) == Form::general)
        return backend::cpu::grain_heavy;
    }
    return grain_of<T>();
  }
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a, Wanted wanted = {});
};
/// Larger of a and b; NaN in either gives NaN (as NumPy's maximum).
struct Maximum : Binary<Maximum, BinaryKind::arithmetic>, rules::Maximum {
  SC_OP_HEAD(Maximum, "maximum")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a, Wanted wanted = {});
};
/// Smaller of a and b; NaN in either gives NaN (as NumPy's minimum).
struct Minimum : Binary<Minimum, BinaryKind::arithmetic>, rules::Minimum {
  SC_OP_HEAD(Minimum, "minimum")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a, Wanted wanted = {});
};
/// a / b rounded toward minus infinity (rules::FloorDiv): piecewise constant, no gradient.
struct FloorDiv : Binary<FloorDiv, BinaryKind::arithmetic>, rules::FloorDiv {
  SC_OP_HEAD(FloorDiv, "floor_div")
  static constexpr bool differentiable = false;
};
/// a - b * floor_div(a, b), with b's sign (rules::Mod).
struct Mod : Binary<Mod, BinaryKind::arithmetic>, rules::Mod {
  SC_OP_HEAD(Mod, "mod")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a, Wanted wanted = {});
};

/// g where x > 0, else 0: relu's gradient (relu_grad(g, x)) as one elementwise op, which fuses
/// with its neighbours; where(x > 0, g, 0) made a bool tensor and took two passes.
struct ReluGrad : Binary<ReluGrad, BinaryKind::arithmetic>, rules::ReluGrad {
  SC_OP_HEAD(ReluGrad, "relu_grad")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a, Wanted wanted = {});
};

#define SC_COMPARE_OP(S, str, kind)                            \
  struct S : Binary<S, BinaryKind::kind>, rules::S {           \
    SC_OP_HEAD(S, str)                                         \
  };
SC_COMPARE_OP(Less, "less", compare)
SC_COMPARE_OP(LessEqual, "less_equal", compare)
SC_COMPARE_OP(Greater, "greater", compare)
SC_COMPARE_OP(GreaterEqual, "greater_equal", compare)
SC_COMPARE_OP(Equal, "equal", compare)
SC_COMPARE_OP(NotEqual, "not_equal", compare)
SC_COMPARE_OP(LogicalAnd, "logical_and", logical)
SC_COMPARE_OP(LogicalOr, "logical_or", logical)
#undef SC_COMPARE_OP

}  // namespace ops

// Named functions, each with the C++ scalar forms: f(t, 2.f) and f(2.f, t).
#define SC_BINARY_API(fn, S)                                                                        \
  inline Tensor fn(const Tensor& a, const Tensor& b,                                                 \
                   std::source_location loc = std::source_location::current()) {                     \
    return detail::dispatch2<ops::S>(a, b, {}, loc);                                                 \
  }                                                                                                  \
  template <Scalar V>                                                                                \
  Tensor fn(const Tensor& a, V b, std::source_location loc = std::source_location::current()) {      \
    return detail::dispatch2<ops::S>(a, detail::weak_scalar(b, a, loc, ops::S::name), {}, loc);      \
  }                                                                                                  \
  template <Scalar V>                                                                                \
  Tensor fn(V a, const Tensor& b, std::source_location loc = std::source_location::current()) {      \
    return detail::dispatch2<ops::S>(detail::weak_scalar(a, b, loc, ops::S::name), b, {}, loc);      \
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
/// a / b rounded toward minus infinity, in the common dtype (Python's a // b): floor_div(-7, 2) is
/// -4. Integers: a zero divisor gives 0 (as NumPy's). No gradient (piecewise constant).
SC_BINARY_API(floor_div, FloorDiv)
/// The remainder with the divisor's sign, a - b * floor_div(a, b) (Python's a % b, TensorFlow's
/// floormod): mod(-7, 3) is 2, mod(7, -3) is -2, mod(-1.5, 1) is 0.5. Floats exact (from fmod), a
/// zero divisor gives NaN; integers 0 (as NumPy's). Gradient: g for a, -g * floor_div(a, b) for b.
SC_BINARY_API(mod, Mod)
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

namespace detail {
/// g where x > 0, else 0 (relu's gradient rule).
inline Tensor relu_grad(const Tensor& g, const Tensor& x, std::source_location loc = std::source_location::current()) {
  return dispatch2<ops::ReluGrad>(g, x, {}, loc);
}
}  // namespace detail

// Operators: the left operand is an Operand so the user's line is kept.
#define SC_BINARY_OPERATOR(op, S)                                                              \
  inline Tensor operator op(Operand a, const Tensor& b) { return detail::dispatch2<ops::S>(a.t, b, {}, a.loc); } \
  template <Scalar V>                                                                          \
  Tensor operator op(Operand a, V b) {                                                         \
    return detail::dispatch2<ops::S>(a.t, detail::weak_scalar(b, a.t, a.loc, ops::S::name), {}, a.loc); \
  }                                                                                            \
  template <Scalar V>                                                                          \
  Tensor operator op(V a, Operand b) {                                                         \
    return detail::dispatch2<ops::S>(detail::weak_scalar(a, b.t, b.loc, ops::S::name), b.t, {}, b.loc); \
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
#undef SC_BINARY_OPERATOR

// && and ||: the built-in bool operators would also match (through Tensor's explicit
// operator bool), so these take the tensor exactly (const Tensor&) to win overload
// resolution; they cannot fail on shapes with a scalar, so the library's line is enough.
#define SC_LOGICAL_OPERATOR(op, S)                                                                     \
  inline Tensor operator op(const Tensor& a, const Tensor& b) {                                       \
    return detail::dispatch2<ops::S>(a, b, {}, std::source_location::current());                      \
  }                                                                                                    \
  template <Scalar V>                                                                                  \
  Tensor operator op(const Tensor& a, V b) {                                                           \
    const auto loc = std::source_location::current();                                                  \
    return detail::dispatch2<ops::S>(a, detail::weak_scalar(b, a, loc, ops::S::name), {}, loc);        \
  }                                                                                                    \
  template <Scalar V>                                                                                  \
  Tensor operator op(V a, const Tensor& b) {                                                           \
    const auto loc = std::source_location::current();                                                  \
    return detail::dispatch2<ops::S>(detail::weak_scalar(a, b, loc, ops::S::name), b, {}, loc);        \
  }
SC_LOGICAL_OPERATOR(&&, LogicalAnd)
SC_LOGICAL_OPERATOR(||, LogicalOr)
#undef SC_LOGICAL_OPERATOR

/// A C++ number on the right of a compound assignment (t *= 0.5f), with the user's line: the
/// weak scalar t * 0.5f would make (same dtype rule, same range check on integers).
class ScalarOperand {
 public:
  template <Scalar V>
  ScalarOperand(V v, std::source_location l = std::source_location::current())  // NOLINT: the user's number
      : loc(l), make_(&make<std::remove_cvref_t<V>>) {
    const std::remove_cvref_t<V> x = v;
    std::memcpy(bytes_, &x, sizeof x);
  }
  /// The number as a weak scalar next to `like`, for op `op` (its name in errors).
  Tensor next_to(const Tensor& like, std::string_view op) const { return make_(*this, like, op); }
  std::source_location loc;

 private:
  template <class V>
  static Tensor make(const ScalarOperand& s, const Tensor& like, std::string_view op) {
    V v;
    std::memcpy(&v, s.bytes_, sizeof v);
    return detail::weak_scalar(v, like, s.loc, op);
  }
  Tensor (*make_)(const ScalarOperand&, const Tensor&, std::string_view);
  alignas(long double) unsigned char bytes_[sizeof(long double)] = {};
};

/// Compound assignment rebinds the handle to a new tensor (tensors are values; no aliasing), from
/// a tensor or a C++ number (t += 1 is t = t + 1).
#define SC_COMPOUND_OPERATOR(op, S)                                                                             \
  inline Tensor& operator op(Tensor& a, Operand b) { return a = detail::dispatch2<ops::S>(a, b.t, {}, b.loc); } \
  inline Tensor& operator op(Tensor& a, const ScalarOperand& b) {                                              \
    return a = detail::dispatch2<ops::S>(a, b.next_to(a, ops::S::name), {}, b.loc);                          \
  }
SC_COMPOUND_OPERATOR(+=, Add)
SC_COMPOUND_OPERATOR(-=, Sub)
SC_COMPOUND_OPERATOR(*=, Mul)
SC_COMPOUND_OPERATOR(/=, Div)
#undef SC_COMPOUND_OPERATOR

}  // namespace stagecraft

// Gradient rules, written with public ops (so outer tapes and traces see them). They need
// unary.hpp and where.hpp, which need this file's functions: see the note in unary.hpp.
// Each rule returns gradients of the output's (broadcast) shape; the tape sums them back
// to each input's shape.
#include "unary.hpp"
#include "where.hpp"

namespace stagecraft::ops {

inline std::vector<Tensor> Add::vjp(const Tensor& g, Inputs, const Tensor&, const Attrs&) { return {g, g}; }
inline std::vector<Tensor> Sub::vjp(const Tensor& g, Inputs, const Tensor&, const Attrs&, Wanted w) {
  return {w[0] ? g : Tensor(), w[1] ? neg(g) : Tensor()};
}
inline std::vector<Tensor> Mul::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs&, Wanted w) {
  return {w[0] ? g * in[1] : Tensor(), w[1] ? g * in[0] : Tensor()};
}
// d(a/b)/db = -(a/b)/b: reuses g/b and the result.
inline std::vector<Tensor> Div::vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs&, Wanted w) {
  Tensor ga = g / in[1];
  Tensor gb = w[1] ? -(ga * out) : Tensor();
  return {w[0] ? std::move(ga) : Tensor(), std::move(gb)};
}
// d/da = b a^(b-1), taken as 0 where b == 0 (a^0 is constant; b * a^-1 would be 0 * inf = NaN
// at a == 0). d/db = a^b ln a, taken as 0 where a <= 0 (as TF: no real logarithm there). The
// inner where keeps log's argument positive, so even the second derivative of the
// unselected branch is finite: no NaN leaks when b's gradient is not wanted.
inline std::vector<Tensor> Pow::vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs&, Wanted w) {
  const Tensor& a = in[0];
  const Tensor& b = in[1];
  Tensor ga, gb;
  if (w[0]) ga = where(b == 0, 0, g * b * pow(a, b - 1));
  if (w[1]) {
    const Tensor pos = a > 0;
    gb = g * out * where(pos, log(where(pos, a, 1)), 0);
  }
  return {std::move(ga), std::move(gb)};
}
// mod(a, b) = a - b * floor_div(a, b), the quotient piecewise constant (as TensorFlow's floormod).
inline std::vector<Tensor> Mod::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs&, Wanted w) {
  return {w[0] ? g : Tensor(), w[1] ? -(g * floor_div(in[0], in[1])) : Tensor()};
}
// The gradient goes to the input the result came from; on ties (a == b) it is split half and
// half (as JAX; the average of the two one-sided rules, so maximum(x, x) has derivative 1).
// Where the kernel propagates a NaN, the gradient goes to the NaN input (a when both are).
inline std::vector<Tensor> Maximum::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs&, Wanted w) {
  const Tensor& a = in[0];
  const Tensor& b = in[1];
  const Tensor pick_a = (a > b) || (a != a);  // the kernel's own choice of a
  const Tensor tie = a == b;
  const Tensor half = g * 0.5;
  return {w[0] ? where(pick_a, g, where(tie, half, 0)) : Tensor(), w[1] ? where(pick_a, 0, where(tie, half, g)) : Tensor()};
}
// Linear in g (the same selection); x only selects: no gradient.
inline std::vector<Tensor> ReluGrad::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs&, Wanted w) {
  return {w[0] ? detail::relu_grad(g, in[1]) : Tensor(), Tensor()};
}
// As Maximum's rule, with the kernel's choice of a for the minimum.
inline std::vector<Tensor> Minimum::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs&, Wanted w) {
  const Tensor& a = in[0];
  const Tensor& b = in[1];
  const Tensor pick_a = (a < b) || (a != a);
  const Tensor tie = a == b;
  const Tensor half = g * 0.5;
  return {w[0] ? where(pick_a, g, where(tie, half, 0)) : Tensor(), w[1] ? where(pick_a, 0, where(tie, half, g)) : Tensor()};
}

}  // namespace stagecraft::ops
