// Elementwise unary ops: neg abs exp log sqrt tanh sigmoid relu square sign sin cos log1p expm1 erf
// floor ceil round logical_not.
#pragma once
#include <cmath>
#include <vector>

#include "../eager/dispatch.hpp"
#include "elementwise_rules.hpp"

namespace stagecraft {
namespace ops {

struct Neg : Unary<Neg, UnaryKind::numeric>, rules::Neg {
  SC_OP_HEAD(Neg, "neg")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};
struct Abs : Unary<Abs, UnaryKind::numeric>, rules::Abs {
  SC_OP_HEAD(Abs, "abs")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};
struct Square : Unary<Square, UnaryKind::numeric>, rules::Square {
  SC_OP_HEAD(Square, "square")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};
struct Relu : Unary<Relu, UnaryKind::numeric>, rules::Relu {
  SC_OP_HEAD(Relu, "relu")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};
struct Sign : Unary<Sign, UnaryKind::numeric>, rules::Sign {
  SC_OP_HEAD(Sign, "sign")
  static constexpr bool differentiable = false;  // piecewise constant: no gradient flows through
};
struct Exp : Unary<Exp, UnaryKind::floating>, rules::Exp {
  SC_OP_HEAD(Exp, "exp")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};
struct Log : Unary<Log, UnaryKind::floating>, rules::Log {
  SC_OP_HEAD(Log, "log")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};
struct Sqrt : Unary<Sqrt, UnaryKind::floating>, rules::Sqrt {
  SC_OP_HEAD(Sqrt, "sqrt")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};
struct Tanh : Unary<Tanh, UnaryKind::floating>, rules::Tanh {
  SC_OP_HEAD(Tanh, "tanh")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};
struct Sigmoid : Unary<Sigmoid, UnaryKind::floating>, rules::Sigmoid {
  SC_OP_HEAD(Sigmoid, "sigmoid")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};
/// sin x. Its SIMD rule's bits depend on the batch: xsimd reduces the arguments by the method the
/// batch's largest |x| needs, so a loop that batches other elements together than eager's flat
/// loop may differ in the last bit (the staged fused loop then runs op by op).
struct Sin : Unary<Sin, UnaryKind::floating>, rules::Sin {
  SC_OP_HEAD(Sin, "sin")
  static constexpr bool batch_dependent = true;
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};
/// cos x; its SIMD rule's bits depend on the batch, as sin's do.
struct Cos : Unary<Cos, UnaryKind::floating>, rules::Cos {
  SC_OP_HEAD(Cos, "cos")
  static constexpr bool batch_dependent = true;
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};
struct Log1p : Unary<Log1p, UnaryKind::floating>, rules::Log1p {
  SC_OP_HEAD(Log1p, "log1p")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};
struct Expm1 : Unary<Expm1, UnaryKind::floating>, rules::Expm1 {
  SC_OP_HEAD(Expm1, "expm1")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};
struct Erf : Unary<Erf, UnaryKind::floating>, rules::Erf {
  SC_OP_HEAD(Erf, "erf")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};
/// floor, ceil and round: piecewise constant (no gradient flows through, as TensorFlow's).
struct Floor : Unary<Floor, UnaryKind::numeric>, rules::Floor {
  SC_OP_HEAD(Floor, "floor")
  static constexpr bool differentiable = false;
};
struct Ceil : Unary<Ceil, UnaryKind::numeric>, rules::Ceil {
  SC_OP_HEAD(Ceil, "ceil")
  static constexpr bool differentiable = false;
};
struct Round : Unary<Round, UnaryKind::numeric>, rules::Round {
  SC_OP_HEAD(Round, "round")
  static constexpr bool differentiable = false;
};
struct LogicalNot : Unary<LogicalNot, UnaryKind::predicate>, rules::LogicalNot {
  SC_OP_HEAD(LogicalNot, "logical_not")
};

}  // namespace ops

#define SC_UNARY_API(fn, S)                                                                    \
  inline Tensor fn(const Tensor& x, std::source_location loc = std::source_location::current()) { \
    return detail::dispatch<ops::S>({&x, 1}, {}, loc);                                        \
  }
/// -x (numeric dtypes).
SC_UNARY_API(neg, Neg)
/// |x| (numeric dtypes).
SC_UNARY_API(abs, Abs)
/// x*x (numeric dtypes).
SC_UNARY_API(square, Square)
/// max(x, 0); NaN stays NaN.
SC_UNARY_API(relu, Relu)
/// -1, 0 or 1 by the sign of x; NaN stays NaN.
SC_UNARY_API(sign, Sign)
/// e^x (integer inputs become f32).
SC_UNARY_API(exp, Exp)
/// Natural logarithm (integer inputs become f32).
SC_UNARY_API(log, Log)
/// Square root (integer inputs become f32).
SC_UNARY_API(sqrt, Sqrt)
/// Hyperbolic tangent (integer inputs become f32).
SC_UNARY_API(tanh, Tanh)
/// 1 / (1 + e^-x) (integer inputs become f32).
SC_UNARY_API(sigmoid, Sigmoid)
/// Sine (integer inputs become f32).
SC_UNARY_API(sin, Sin)
/// Cosine (integer inputs become f32).
SC_UNARY_API(cos, Cos)
/// log(1 + x), accurate where x is tiny next to 1 (integer inputs become f32).
SC_UNARY_API(log1p, Log1p)
/// e^x - 1, accurate where x is near 0 (integer inputs become f32).
SC_UNARY_API(expm1, Expm1)
/// The error function erf(x) (integer inputs become f32).
SC_UNARY_API(erf, Erf)
/// The largest integer <= x, in x's dtype (numeric dtypes; integers unchanged). No gradient.
SC_UNARY_API(floor, Floor)
/// The smallest integer >= x, in x's dtype (numeric dtypes; integers unchanged). No gradient.
SC_UNARY_API(ceil, Ceil)
/// The nearest integer to x, halves to even (0.5 -> 0, 1.5 -> 2), in x's dtype (numeric dtypes;
/// integers unchanged). No gradient.
SC_UNARY_API(round, Round)
/// x == 0, as bool.
SC_UNARY_API(logical_not, LogicalNot)
#undef SC_UNARY_API

/// -x.
inline Tensor operator-(Operand x) { return detail::dispatch<ops::Neg>({&x.t, 1}, {}, x.loc); }
/// Logical not (x == 0) as bool. Takes the tensor exactly (const Tensor&) so it beats the
/// built-in ! (reachable through Tensor's explicit operator bool).
inline Tensor operator!(const Tensor& x) {
  return detail::dispatch<ops::LogicalNot>({&x, 1}, {}, std::source_location::current());
}

}  // namespace stagecraft

// Gradient rules. They are written with public ops (so an outer tape records them, giving
// higher derivatives, and a trace stages them), and the ops they use live in binary.hpp and
// where.hpp, which need this file's functions for their own rules. So the rules are defined
// here, after this file's declarations, with those headers included just before: whichever
// of the headers is included first, every function a rule names is declared by then.
#include "binary.hpp"
#include "where.hpp"

namespace stagecraft::ops {

/// What a gradient rule returns: one gradient per input (undefined for none).
using VjpResult = std::vector<Tensor>;

inline VjpResult Neg::vjp(const Tensor& g, Inputs, const Tensor&, const Attrs&) { return {neg(g)}; }
// The subgradient 0 at x == 0 (as TF and PyTorch).
inline VjpResult Abs::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs&) { return {g * sign(in[0])}; }
// 2 g x as x (2 g): g may be smaller than x (a broadcast gradient), and doubling is exact, so
// either order gives the same bits (barring overflow).
inline VjpResult Square::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs&) { return {in[0] * (g * 2)}; }
// 0 at x == 0 (as TF and PyTorch); NaN inputs get 0 too. Masked by the result (relu(x) > 0 exactly
// where x > 0), not the input: then nothing but relu reads the input, which lets a traced dense
// layer's product, bias and relu run as one cuBLASLt call with its epilogue on a GPU.
inline VjpResult Relu::vjp(const Tensor& g, Inputs, const Tensor& out, const Attrs&) { return {detail::relu_grad(g, out)}; }
// Rules that can be written with the result reuse it (no second exp/tanh/sqrt).
inline VjpResult Exp::vjp(const Tensor& g, Inputs, const Tensor& out, const Attrs&) { return {g * out}; }
inline VjpResult Log::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs&) { return {g / in[0]}; }
inline VjpResult Sqrt::vjp(const Tensor& g, Inputs, const Tensor& out, const Attrs&) { return {g / (out * 2)}; }
inline VjpResult Tanh::vjp(const Tensor& g, Inputs, const Tensor& out, const Attrs&) { return {g * (1 - out * out)}; }
inline VjpResult Sigmoid::vjp(const Tensor& g, Inputs, const Tensor& out, const Attrs&) { return {g * out * (1 - out)}; }
inline VjpResult Sin::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs&) { return {g * cos(in[0])}; }
inline VjpResult Cos::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs&) { return {g * -sin(in[0])}; }
inline VjpResult Log1p::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs&) { return {g / (in[0] + 1)}; }
inline VjpResult Expm1::vjp(const Tensor& g, Inputs, const Tensor& out, const Attrs&) { return {g * (out + 1)}; }
// 2/sqrt(pi) e^(-x^2)
inline VjpResult Erf::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs&) {
  return {g * (exp(-square(in[0])) * 1.1283791670955126)};
}

}  // namespace stagecraft::ops
