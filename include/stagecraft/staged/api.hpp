// The user-facing staged API: sc::staged<E>, sc::stage, sc::eval, and the same operators and
// free functions as eager (sc::tanh, sc::where, sc::matmul, sc::sum, ...) taking staged operands.
// A staged operand anywhere makes the result staged; Tensors become leaves (held by handle) and
// C++ scalars weak constants, with eager's dtype promotion and broadcasting.
#pragma once
#include <initializer_list>
#include <source_location>
#include <string_view>
#include <vector>

#include "../nn/functional.hpp"
#include "../ops/conv.hpp"
#include "../ops/matmul.hpp"
#include "../ops/scan.hpp"
#include "eval.hpp"

namespace stagecraft {

/// A compile-time staged expression: its type E is the graph. It holds its tensors by handle,
/// so it can be kept in `auto`; it is evaluated, as one fused loop, by sc::eval or by converting
/// it to a Tensor.
template <class E>
struct staged {
  static_assert(staging::NodeType<E>, "stagecraft: staged<E> takes a node type of stagecraft::staging");
  using staged_tag = void;
  using node_type = E;
  E node;

  /// Evaluates the expression (one fused loop): `sc::Tensor y = expr;`.
  operator Tensor() const;  // NOLINT: implicit by design

  /// A staged value has no truth value while the graph is being built.
  explicit operator bool() const {
    static_assert(staging::always_false<E>,
                  "stagecraft: a staged value cannot be used as a C++ bool (its elements are not known "
                  "until it is evaluated); choose per element with sc::where(cond, a, b), or get a Tensor "
                  "first with sc::eval(x)");
    return false;
  }
};

namespace staging {

template <class T>
concept Staged = requires { typename std::remove_cvref_t<T>::staged_tag; };
/// A Tensor, or anything that converts to one (a Variable): it becomes a leaf.
template <class T>
concept TensorLike = !Staged<T> && std::convertible_to<const T&, const Tensor&>;
/// What a staged op accepts as an operand.
template <class T>
concept Operand = Staged<T> || TensorLike<T> || Scalar<T>;

template <class T>
auto lift(const T& x) {
  if constexpr (Staged<T>) return x.node;
  else if constexpr (TensorLike<T>) return Leaf{{}, Tensor(static_cast<const Tensor&>(x))};
  else return Const<T>{{}, x};
}
template <class T>
using lifted_t = decltype(lift(std::declval<const T&>()));

template <class N>
staged<N> wrap(N n) {
  return staged<N>{std::move(n)};
}

template <class... T>
constexpr bool operands_ok() {
  static_assert((Operand<T> && ...),
                "stagecraft: staged ops take staged values, sc::Tensor or C++ arithmetic scalars; this "
                "operand is none of them (evaluate it to a Tensor first)");
  return (Operand<T> && ...);
}

template <class Op, class X>
auto unary(const X& x) {
  if constexpr (operands_ok<X>()) return wrap(Map1<Op, lifted_t<X>>{{}, lift(x)});
  else return staged<Leaf>{};
}
template <class Op, class A, class B>
auto binary(const A& a, const B& b) {
  if constexpr (operands_ok<A, B>()) return wrap(Map2<Op, lifted_t<A>, lifted_t<B>>{{}, lift(a), lift(b)});
  else return staged<Leaf>{};
}

// ---- materializing ops -------------------------------------------------------------------

struct MatMulOp {
  bool transpose_a = false, transpose_b = false;
  static constexpr std::string_view name = "matmul";
  Tensor run(const std::source_location& loc, const Tensor& a, const Tensor& b) const {
    return stagecraft::matmul(a, b, transpose_a, transpose_b, loc);
  }
};
struct SoftmaxOp {
  std::int64_t axis = -1;
  bool log = false;
  static constexpr std::string_view name = "softmax";
  Tensor run(const std::source_location& loc, const Tensor& x) const {
    return log ? nn::log_softmax(x, axis, loc) : nn::softmax(x, axis, loc);
  }
};
struct LogSumExpOp {
  std::vector<std::int64_t> axes;
  bool keepdims = false;
  static constexpr std::string_view name = "logsumexp";
  Tensor run(const std::source_location& loc, const Tensor& x) const {
    return stagecraft::logsumexp(x, axes, keepdims, loc);
  }
};
struct Conv2dOp {
  std::int64_t stride = 1, padding = 0;
  static constexpr std::string_view name = "conv2d";
  Tensor run(const std::source_location& loc, const Tensor& x, const Tensor& w) const {
    return nn::conv2d(x, w, stride, padding, loc);
  }
};

/// The scans of one running value along an axis (ops/scan.hpp).
enum class ScanKind { cumsum, cumprod, logcumsumexp, cummax, cummin };
template <ScanKind K>
struct ScanOp {
  std::int64_t axis = 0;
  bool exclusive = false, reverse = false;
  static constexpr std::string_view name = K == ScanKind::cumsum         ? "cumsum"
                                           : K == ScanKind::cumprod      ? "cumprod"
                                           : K == ScanKind::logcumsumexp ? "logcumsumexp"
                                           : K == ScanKind::cummax       ? "cummax"
                                                                         : "cummin";
  Tensor run(const std::source_location& loc, const Tensor& x) const {
    if constexpr (K == ScanKind::cumsum) return stagecraft::cumsum(x, axis, exclusive, reverse, loc);
    else if constexpr (K == ScanKind::cumprod) return stagecraft::cumprod(x, axis, exclusive, reverse, loc);
    else if constexpr (K == ScanKind::logcumsumexp) return stagecraft::logcumsumexp(x, axis, exclusive, reverse, loc);
    else if constexpr (K == ScanKind::cummax) return stagecraft::cummax(x, axis, reverse, loc);
    else return stagecraft::cummin(x, axis, reverse, loc);
  }
};
struct LinearScanOp {
  std::int64_t axis = 0;
  bool exclusive = false, reverse = false;
  static constexpr std::string_view name = "linear_scan";
  Tensor run(const std::source_location& loc, const Tensor& a, const Tensor& b) const {
    return stagecraft::linear_scan(a, b, axis, exclusive, reverse, loc);
  }
};

template <class M, class... X>
auto materializing(M m, const X&... x) {
  static_assert(((Staged<X> || TensorLike<X>) && ...),
                "stagecraft: this op takes staged values or sc::Tensor operands (not C++ scalars)");
  return wrap(Mat<M, lifted_t<X>...>{{}, std::move(m), {lift(x)...}});
}
template <ReduceKind K, class X>
auto reduce(const X& x, std::vector<std::int64_t> axes, bool keepdims) {
  return materializing(ReduceOp<K>{std::move(axes), keepdims}, x);
}

}  // namespace staging

template <class E>
staged<E>::operator Tensor() const {
  static_assert(staging::arg_count<E>::value == 0,
                "stagecraft: this staged value reads an argument of sc::compile; call the compiled "
                "function instead of evaluating the expression on its own");
  return staging::run<0>(node, staging::Env<0>{{}, std::source_location::current()});
}

/// A staged leaf holding t (by handle): operators and functions on it build a staged expression.
inline staged<staging::Leaf> stage(const Tensor& t, std::source_location loc = std::source_location::current()) {
  detail::require_defined(t, "stage", loc);
  return staged<staging::Leaf>{staging::Leaf{{}, t}};
}

/// Evaluates a staged expression as one fused loop (a reduction at its root reduces while it
/// evaluates). Shape and dtype errors are raised as eager raises them, naming the op and line.
template <class E>
Tensor eval(const staged<E>& e, std::source_location loc = std::source_location::current()) {
  static_assert(staging::arg_count<E>::value == 0,
                "stagecraft: this staged value reads an argument of sc::compile; call the compiled "
                "function instead of evaluating the expression on its own");
  return staging::run<0>(e.node, staging::Env<0>{{}, loc});
}
/// A Tensor is already evaluated (so generic code can call sc::eval on either).
inline Tensor eval(const Tensor& t) { return t; }

// ---- elementwise -------------------------------------------------------------------------

#define SC_STAGED_UNARY(fn, Op)                 \
  template <class X>                            \
    requires staging::Staged<X>                 \
  auto fn(const X& x) {                         \
    return staging::unary<ops::Op>(x);          \
  }
SC_STAGED_UNARY(neg, Neg)
SC_STAGED_UNARY(abs, Abs)
SC_STAGED_UNARY(square, Square)
SC_STAGED_UNARY(relu, Relu)
SC_STAGED_UNARY(sign, Sign)
SC_STAGED_UNARY(exp, Exp)
SC_STAGED_UNARY(log, Log)
SC_STAGED_UNARY(sqrt, Sqrt)
SC_STAGED_UNARY(tanh, Tanh)
SC_STAGED_UNARY(sigmoid, Sigmoid)
SC_STAGED_UNARY(sin, Sin)
SC_STAGED_UNARY(cos, Cos)
SC_STAGED_UNARY(log1p, Log1p)
SC_STAGED_UNARY(expm1, Expm1)
SC_STAGED_UNARY(erf, Erf)
SC_STAGED_UNARY(floor, Floor)
SC_STAGED_UNARY(ceil, Ceil)
SC_STAGED_UNARY(round, Round)
SC_STAGED_UNARY(logical_not, LogicalNot)
SC_STAGED_UNARY(operator-, Neg)
SC_STAGED_UNARY(operator!, LogicalNot)
#undef SC_STAGED_UNARY

#define SC_STAGED_BINARY(fn, Op)                                \
  template <class A, class B>                                   \
    requires(staging::Staged<A> || staging::Staged<B>)          \
  auto fn(const A& a, const B& b) {                             \
    return staging::binary<ops::Op>(a, b);                      \
  }
SC_STAGED_BINARY(add, Add)
SC_STAGED_BINARY(sub, Sub)
SC_STAGED_BINARY(mul, Mul)
SC_STAGED_BINARY(div, Div)
SC_STAGED_BINARY(pow, Pow)
SC_STAGED_BINARY(maximum, Maximum)
SC_STAGED_BINARY(floor_div, FloorDiv)
SC_STAGED_BINARY(mod, Mod)
SC_STAGED_BINARY(minimum, Minimum)
SC_STAGED_BINARY(less, Less)
SC_STAGED_BINARY(less_equal, LessEqual)
SC_STAGED_BINARY(greater, Greater)
SC_STAGED_BINARY(greater_equal, GreaterEqual)
SC_STAGED_BINARY(equal, Equal)
SC_STAGED_BINARY(not_equal, NotEqual)
SC_STAGED_BINARY(logical_and, LogicalAnd)
SC_STAGED_BINARY(logical_or, LogicalOr)
SC_STAGED_BINARY(operator+, Add)
SC_STAGED_BINARY(operator-, Sub)
SC_STAGED_BINARY(operator*, Mul)
SC_STAGED_BINARY(operator/, Div)
SC_STAGED_BINARY(operator<, Less)
SC_STAGED_BINARY(operator<=, LessEqual)
SC_STAGED_BINARY(operator>, Greater)
SC_STAGED_BINARY(operator>=, GreaterEqual)
SC_STAGED_BINARY(operator==, Equal)
SC_STAGED_BINARY(operator!=, NotEqual)
SC_STAGED_BINARY(operator&&, LogicalAnd)
SC_STAGED_BINARY(operator||, LogicalOr)
#undef SC_STAGED_BINARY

/// where(cond, a, b) on staged operands: one of a and b must be a tensor or staged value.
template <class C, class A, class B>
  requires(staging::Staged<C> || staging::Staged<A> || staging::Staged<B>)
auto where(const C& c, const A& a, const B& b) {
  static_assert(!(Scalar<A> && Scalar<B>),
                "stagecraft: sc::where needs a tensor or staged value in a branch (for where(cond, 1, 0) "
                "write sc::cast<sc::f32>(cond))");
  if constexpr (staging::operands_ok<C, A, B>() && !(Scalar<A> && Scalar<B>))
    return staging::wrap(staging::Select<staging::lifted_t<C>, staging::lifted_t<A>, staging::lifted_t<B>>{
        {}, staging::lift(c), staging::lift(a), staging::lift(b)});
  else return staged<staging::Leaf>{};
}

/// clip(x, lo, hi) on staged operands, as the eager sc::clip (ops/clip.hpp): m = (x < lo ? lo : x),
/// then (m > hi ? hi : m). Bounds are C++ scalars (weak), tensors or staged values; a staged clip
/// does not check lo <= hi (its bounds may be values of the graph).
template <class X, class L, class H>
  requires(staging::Staged<X> || staging::Staged<L> || staging::Staged<H>)
auto clip(const X& x, const L& lo, const H& hi) {
  const auto m = stagecraft::where(x < lo, lo, x);
  return stagecraft::where(m > hi, hi, m);
}

/// x converted to dtype X (a compile-time dtype: sc::cast<sc::f32>(x)).
template <DType X, class A>
  requires staging::Staged<A>
auto cast(const A& a) {
  return staging::wrap(staging::Convert<X, staging::lifted_t<A>>{{}, staging::lift(a)});
}
/// The same on a Tensor, so generic code can write sc::cast<sc::f32>(x) for either.
template <DType X>
Tensor cast(const Tensor& x, std::source_location loc = std::source_location::current()) {
  return cast(x, X, loc);
}
/// A staged cast to a run-time dtype cannot be typed.
template <class A, class... R>
  requires staging::Staged<A>
auto cast(const A&, DType, R&&...) {
  static_assert(staging::always_false<A>,
                "stagecraft: a staged cast needs its dtype at compile time: write sc::cast<sc::f32>(x)");
  return staged<staging::Leaf>{};
}

// ---- materializing (evaluated first, then read by the fused loop around them) --------------

/// op(a) @ op(b) (see the eager matmul).
template <class A, class B>
  requires(staging::Staged<A> || staging::Staged<B>)
auto matmul(const A& a, const B& b, bool transpose_a = false, bool transpose_b = false) {
  return staging::materializing(staging::MatMulOp{transpose_a, transpose_b}, a, b);
}
/// logsumexp over axes.
template <class X>
  requires staging::Staged<X>
auto logsumexp(const X& x, std::vector<std::int64_t> axes = {}, bool keepdims = false) {
  return staging::materializing(staging::LogSumExpOp{std::move(axes), keepdims}, x);
}
/// Sum over axes ({} = all); at the root of an expression it reduces while evaluating.
template <class X>
  requires staging::Staged<X>
auto sum(const X& x, std::vector<std::int64_t> axes = {}, bool keepdims = false) {
  return staging::reduce<staging::ReduceKind::sum>(x, std::move(axes), keepdims);
}
/// Mean over axes ({} = all).
template <class X>
  requires staging::Staged<X>
auto mean(const X& x, std::vector<std::int64_t> axes = {}, bool keepdims = false) {
  return staging::reduce<staging::ReduceKind::mean>(x, std::move(axes), keepdims);
}
/// Largest element over axes ({} = all); NaN propagates.
template <class X>
  requires staging::Staged<X>
auto max(const X& x, std::vector<std::int64_t> axes = {}, bool keepdims = false) {
  return staging::reduce<staging::ReduceKind::max>(x, std::move(axes), keepdims);
}
/// Smallest element over axes ({} = all); NaN propagates.
template <class X>
  requires staging::Staged<X>
auto min(const X& x, std::vector<std::int64_t> axes = {}, bool keepdims = false) {
  return staging::reduce<staging::ReduceKind::min>(x, std::move(axes), keepdims);
}

/// The running sum along axis (see the eager cumsum); evaluated first, as matmul.
template <class X>
  requires staging::Staged<X>
auto cumsum(const X& x, std::int64_t axis = 0, bool exclusive = false, bool reverse = false) {
  return staging::materializing(staging::ScanOp<staging::ScanKind::cumsum>{axis, exclusive, reverse}, x);
}
/// The running product along axis (see the eager cumprod).
template <class X>
  requires staging::Staged<X>
auto cumprod(const X& x, std::int64_t axis = 0, bool exclusive = false, bool reverse = false) {
  return staging::materializing(staging::ScanOp<staging::ScanKind::cumprod>{axis, exclusive, reverse}, x);
}
/// log(cumsum(exp(x))) along axis (see the eager logcumsumexp).
template <class X>
  requires staging::Staged<X>
auto logcumsumexp(const X& x, std::int64_t axis = 0, bool exclusive = false, bool reverse = false) {
  return staging::materializing(staging::ScanOp<staging::ScanKind::logcumsumexp>{axis, exclusive, reverse}, x);
}
/// The running maximum along axis (see the eager cummax).
template <class X>
  requires staging::Staged<X>
auto cummax(const X& x, std::int64_t axis = 0, bool reverse = false) {
  return staging::materializing(staging::ScanOp<staging::ScanKind::cummax>{axis, false, reverse}, x);
}
/// The running minimum along axis (see the eager cummin).
template <class X>
  requires staging::Staged<X>
auto cummin(const X& x, std::int64_t axis = 0, bool reverse = false) {
  return staging::materializing(staging::ScanOp<staging::ScanKind::cummin>{axis, false, reverse}, x);
}
/// h = a h + b along axis (see the eager linear_scan).
template <class A, class B>
  requires(staging::Staged<A> || staging::Staged<B>)
auto linear_scan(const A& a, const B& b, std::int64_t axis = 0, bool exclusive = false, bool reverse = false) {
  return staging::materializing(staging::LinearScanOp{axis, exclusive, reverse}, a, b);
}

namespace nn {
/// 2-D convolution (see the eager conv2d).
template <class A, class B>
  requires(staging::Staged<A> || staging::Staged<B>)
auto conv2d(const A& x, const B& w, std::int64_t stride = 1, std::int64_t padding = 0) {
  return staging::materializing(staging::Conv2dOp{stride, padding}, x, w);
}
/// softmax along axis.
template <class X>
  requires staging::Staged<X>
auto softmax(const X& x, std::int64_t axis = -1) {
  return staging::materializing(staging::SoftmaxOp{axis, false}, x);
}
/// log_softmax along axis.
template <class X>
  requires staging::Staged<X>
auto log_softmax(const X& x, std::int64_t axis = -1) {
  return staging::materializing(staging::SoftmaxOp{axis, true}, x);
}
}  // namespace nn

// ---- ops with no staged form: one message naming the fix --------------------------------
// (staged/materialized.hpp has the other non-elementwise ops; these give integer indices, which
// a staged graph of one dtype does not carry)

#define SC_STAGED_UNSUPPORTED_MESSAGE(fn)                                                        \
  "stagecraft: sc::" #fn " gives integer indices and has no staged form; evaluate its operand " \
  "first with sc::eval(x), or stage the whole function with sc::function"
// Overloads for any arguments, and for braced lists ({6}, {0, 1}) in the first two places, which
// a template pack cannot deduce.
#define SC_STAGED_UNSUPPORTED(fn)                                                                 \
  template <class X, class... R>                                                                  \
    requires staging::Staged<X>                                                                   \
  staged<staging::Leaf> fn(const X&, R&&...) {                                                    \
    static_assert(staging::always_false<X>, SC_STAGED_UNSUPPORTED_MESSAGE(fn));                   \
    return {};                                                                                    \
  }                                                                                               \
  template <class X, class... R>                                                                  \
    requires staging::Staged<X>                                                                   \
  staged<staging::Leaf> fn(const X&, std::initializer_list<std::int64_t>, R&&...) {               \
    static_assert(staging::always_false<X>, SC_STAGED_UNSUPPORTED_MESSAGE(fn));                   \
    return {};                                                                                    \
  }                                                                                               \
  template <class X, class... R>                                                                  \
    requires staging::Staged<X>                                                                   \
  staged<staging::Leaf> fn(const X&, std::initializer_list<std::int64_t>, std::initializer_list<std::int64_t>, R&&...) { \
    static_assert(staging::always_false<X>, SC_STAGED_UNSUPPORTED_MESSAGE(fn));                   \
    return {};                                                                                    \
  }
SC_STAGED_UNSUPPORTED(argmax)
SC_STAGED_UNSUPPORTED(argmin)
SC_STAGED_UNSUPPORTED(argsort)
SC_STAGED_UNSUPPORTED(cumargmax)
SC_STAGED_UNSUPPORTED(cumargmin)
SC_STAGED_UNSUPPORTED(topk)
#undef SC_STAGED_UNSUPPORTED
#undef SC_STAGED_UNSUPPORTED_MESSAGE

}  // namespace stagecraft
