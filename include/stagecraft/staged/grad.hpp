// Symbolic differentiation of staged expression types: the derivative of sum(f(args)) with
// respect to argument I is built at compile time by reverse accumulation over the expression
// type, with the rules of the eager gradient (ops/unary.hpp, ops/binary.hpp, ops/where.hpp)
// written over staged nodes. Zero and One are types, so multiplying by one, adding zero and
// every branch that does not depend on argument I disappear while the type is built.
#pragma once
#include <array>
#include <cstddef>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "expr.hpp"
#include "eval.hpp"

namespace stagecraft::staging {

template <class N>
inline constexpr bool is_zero = std::is_same_v<N, Zero>;
template <class N>
inline constexpr bool is_one = std::is_same_v<N, One>;

template <class Op, class A>
Map1<Op, A> m1(const A& a) {
  return {{}, a};
}
template <class Op, class A, class B>
Map2<Op, A, B> m2(const A& a, const B& b) {
  return {{}, a, b};
}
inline Const<int> k(int v) { return {{}, v}; }
inline Const<double> kd(double v) { return {{}, v}; }

template <class A, class B>
auto smul(const A& a, const B& b) {
  if constexpr (is_zero<A> || is_zero<B>) return Zero{};
  else if constexpr (is_one<A>) return b;
  else if constexpr (is_one<B>) return a;
  else return m2<ops::Mul>(a, b);
}
template <class A, class B>
auto sadd(const A& a, const B& b) {
  if constexpr (is_zero<A>) return b;
  else if constexpr (is_zero<B>) return a;
  else return m2<ops::Add>(a, b);
}
template <class A>
auto sneg(const A& a) {
  if constexpr (is_zero<A>) return Zero{};
  else return m1<ops::Neg>(a);
}
template <class A, class B>
auto sdiv(const A& a, const B& b) {
  if constexpr (is_zero<A>) return Zero{};
  else if constexpr (is_one<B>) return a;
  else return m2<ops::Div>(a, b);
}
template <class A, class B, class... C>
auto sadd_all(const A& a, const B& b, const C&... c) {
  if constexpr (sizeof...(C) == 0) return sadd(a, b);
  else return sadd_all(sadd(a, b), c...);
}
template <class Cn, class A, class B>
auto sselect(const Cn& c, const A& a, const B& b) {
  if constexpr (is_zero<A> && is_zero<B>) return Zero{};
  else return Select<Cn, A, B>{{}, c, a, b};
}

/// The adjoint of a unary node's operand, given the node's adjoint g (n is the node: its value
/// is the op's output, which several rules reuse, as eager's do).
template <class Op, class A, class G>
auto adjoint(const Map1<Op, A>& n, const G& g) {
  const A& a = n.a;
  if constexpr (std::is_same_v<Op, ops::Neg>) return sneg(g);
  else if constexpr (std::is_same_v<Op, ops::Abs>) return smul(g, m1<ops::Sign>(a));
  else if constexpr (std::is_same_v<Op, ops::Square>) return smul(g, m2<ops::Mul>(a, k(2)));
  else if constexpr (std::is_same_v<Op, ops::Relu>) return sselect(m2<ops::Greater>(a, k(0)), g, Zero{});
  else if constexpr (std::is_same_v<Op, ops::Exp>) return smul(g, n);
  else if constexpr (std::is_same_v<Op, ops::Log>) return sdiv(g, a);
  else if constexpr (std::is_same_v<Op, ops::Sqrt>) return sdiv(g, m2<ops::Mul>(n, k(2)));
  else if constexpr (std::is_same_v<Op, ops::Tanh>) return smul(g, m2<ops::Sub>(k(1), m2<ops::Mul>(n, n)));
  else if constexpr (std::is_same_v<Op, ops::Sigmoid>) return smul(smul(g, n), m2<ops::Sub>(k(1), n));
  else if constexpr (std::is_same_v<Op, ops::Sin>) return smul(g, m1<ops::Cos>(a));
  else if constexpr (std::is_same_v<Op, ops::Cos>) return smul(g, sneg(m1<ops::Sin>(a)));
  else if constexpr (std::is_same_v<Op, ops::Log1p>) return sdiv(g, m2<ops::Add>(a, k(1)));
  else if constexpr (std::is_same_v<Op, ops::Expm1>) return smul(g, m2<ops::Add>(n, k(1)));
  else if constexpr (std::is_same_v<Op, ops::Erf>)  // 2/sqrt(pi) e^(-x^2)
    return smul(g, m2<ops::Mul>(m1<ops::Exp>(m1<ops::Neg>(m2<ops::Mul>(a, a))), kd(1.1283791670955126)));
  else return Zero{};  // sign, floor, ceil, round and predicates: piecewise constant
}

/// The adjoints of a binary node's operands (Side 0: a, 1: b).
template <int Side, class Op, class A, class B, class G>
auto adjoint(const Map2<Op, A, B>& n, const G& g) {
  const A& a = n.a;
  const B& b = n.b;
  if constexpr (std::is_same_v<Op, ops::Add>) {
    return g;
  } else if constexpr (std::is_same_v<Op, ops::Sub>) {
    if constexpr (Side == 0) return g;
    else return sneg(g);
  } else if constexpr (std::is_same_v<Op, ops::Mul>) {
    if constexpr (Side == 0) return smul(g, b);
    else return smul(g, a);
  } else if constexpr (std::is_same_v<Op, ops::Div>) {
    if constexpr (Side == 0) return sdiv(g, b);
    else return sneg(smul(sdiv(g, b), n));
  } else if constexpr (std::is_same_v<Op, ops::Pow>) {
    if constexpr (Side == 0) {
      return sselect(m2<ops::Equal>(b, k(0)), Zero{}, smul(smul(g, b), m2<ops::Pow>(a, m2<ops::Sub>(b, k(1)))));
    } else {
      const auto pos = m2<ops::Greater>(a, k(0));
      return smul(smul(g, n), sselect(pos, m1<ops::Log>(sselect(pos, a, k(1))), Zero{}));
    }
  } else if constexpr (std::is_same_v<Op, ops::Mod>) {  // a - b * floor_div(a, b)
    if constexpr (Side == 0) return g;
    else return sneg(smul(g, m2<ops::FloorDiv>(a, b)));
  } else if constexpr (std::is_same_v<Op, ops::Maximum> || std::is_same_v<Op, ops::Minimum>) {
    using Cmp = std::conditional_t<std::is_same_v<Op, ops::Maximum>, ops::Greater, ops::Less>;
    const auto pick_a = m2<ops::LogicalOr>(m2<Cmp>(a, b), m2<ops::NotEqual>(a, a));
    const auto tie = m2<ops::Equal>(a, b);
    const auto half = smul(g, kd(0.5));
    if constexpr (Side == 0) return sselect(pick_a, g, sselect(tie, half, Zero{}));
    else return sselect(pick_a, Zero{}, sselect(tie, half, g));
  } else {
    return Zero{};  // floor_div, comparisons and logical ops
  }
}

// ---- materialized ops ----------------------------------------------------------------------
//
// Through a materialized op (matmul, a reduction, softmax, logsumexp, conv2d) the gradient takes
// the eager op's own rule: its adjoint and operands are materialized and the rule runs under a
// tape (VjpOp). An adjoint in the elementwise region around such an op has that region's shape
// (the region's root: the whole expression, or the operand of the enclosing materialized op),
// which a constant or smaller adjoint cannot tell; so each op's VjpOp, and each use of argument I
// inside an operand (SumToOp), also reads the region's root for its shape. The uses of argument
// I in the top region stay one fused GradRoot; the others are added to it, already reduced.

/// The value of a constant node (a seed of ones, a scaled one).
template <class N>
double constant_value(const N& n) {
  return n.template get<0, DType::f64, double, ScalarLane<true>>(Ctx<1>{}, 0);
}

/// Adjoint g (or the constant `seed`) with region r's shape, reduced to `like`'s shape and dtype.
inline Tensor region_adjoint(const std::source_location& loc, const Tensor& g, bool constant, double seed,
                             const Tensor& r, const Tensor& like) {
  Tensor s = constant ? detail::fill_on(like.device(), r.shape(), seed, like.dtype(), loc) : g;  // where `like` lives
  if (s.dtype() != like.dtype()) s = cast(s, like.dtype(), loc);
  Shape full_shape;
  if (!broadcast_shapes(s.shape(), r.shape(), full_shape))
    detail::fail<ShapeError>("grad", loc, "adjoint of shape ", s.shape(), " for a region of shape ", r.shape());
  if (s.shape() != full_shape) s = broadcast_to(s, full_shape, loc);
  return full_shape == like.shape() ? s : detail::sum_to(s, like.shape(), "grad", loc);
}

/// The vector-Jacobian product of materialized op M for its operand K: operands (adjoint, region
/// root, M's operands...), or without the adjoint where it is the constant `seed`. The forward
/// op runs again under the tape; the tape nests in outer tapes, so this differentiates again.
template <class M, int K, bool ConstSeed>
struct VjpOp {
  M m;
  double seed = 1.0;
  static constexpr std::string_view name = "vjp";
  template <class... T>
  Tensor run(const std::source_location& loc, const T&... t) const {
    std::array<Tensor, sizeof...(T)> in{t...};
    constexpr std::size_t first = ConstSeed ? 1 : 2;  // where M's operands start
    std::array<Tensor, sizeof...(T) - first> xs;
    for (std::size_t k = 0; k < xs.size(); ++k) xs[k] = in[k + first];
    // a handle of its own for operand K, so a tensor passed in several places counts once here
    xs[K] = reshape(xs[K], xs[K].shape(), loc);
    GradientTape tape;
    tape.watch(xs[K], loc);
    const Tensor out = std::apply([&](const auto&... a) { return m.run(loc, a...); }, xs);
    const Tensor g = region_adjoint(loc, ConstSeed ? Tensor() : in[0], ConstSeed, seed, in[first - 1], out);
    return tape.gradient(out, xs[K], g, loc);
  }
};

/// A use of argument I inside a materialized op's operand: operands (adjoint, region root, the
/// argument), or without the adjoint where it is the constant `seed`; the adjoint reduced to the
/// argument's shape and dtype.
template <bool ConstSeed>
struct SumToOp {
  double seed = 1.0;
  static constexpr std::string_view name = "sum_to";
  Tensor run(const std::source_location& loc, const Tensor& g, const Tensor& r, const Tensor& x) const
    requires(!ConstSeed) {
    return region_adjoint(loc, g, false, 0.0, r, x);
  }
  Tensor run(const std::source_location& loc, const Tensor& r, const Tensor& x) const
    requires(ConstSeed) {
    return region_adjoint(loc, Tensor(), true, seed, r, x);
  }
};

/// Whether argument I reaches n through a materialized op.
template <int I, class N>
constexpr bool mat_dep() {
  if constexpr (requires(const N& n) { n.m; }) return depends_on<I, N>::value;
  else if constexpr (requires { N::arg_index; }) return false;
  else if constexpr (requires(const N& n) { n.c; })
    return mat_dep<I, decltype(N::c)>() || mat_dep<I, decltype(N::a)>() || mat_dep<I, decltype(N::b)>();
  else if constexpr (requires(const N& n) { n.b; }) return mat_dep<I, decltype(N::a)>() || mat_dep<I, decltype(N::b)>();
  else if constexpr (requires(const N& n) { n.a; }) return mat_dep<I, decltype(N::a)>();
  else return false;
}

/// Modes of backprop: the uses of argument I in the top region only (materialized ops give
/// nothing), the uses inside materialized ops only, seen from the top region, and inside the
/// operand region R of a materialized op.
enum class Pass { top, inner_from_top, inner };

template <int I, Pass P, class N, class G, class R>
auto backprop(const N& n, const G& g, const R& r);

/// Whether op M passes a gradient to its operand J: all do but those from M::grad_operands on
/// (integer indices and labels).
template <class M, std::size_t J>
constexpr bool grad_flows() {
  if constexpr (requires { M::grad_operands; }) return J < M::grad_operands;
  else return true;
}

/// Materialized node n with adjoint g in region r: each operand J that depends on argument I gets
/// the op's VjpOp, and is differentiated in its own region.
template <int I, class M, class... A, class G, class R, std::size_t... K>
auto backprop_mat(const Mat<M, A...>& n, const G& g, const R& r, std::index_sequence<K...>) {
  auto one = [&]<std::size_t J>(std::integral_constant<std::size_t, J>) {
    using AJ = std::tuple_element_t<J, std::tuple<A...>>;
    const AJ& aj = std::get<J>(n.args);
    if constexpr (!depends_on<I, AJ>::value || !grad_flows<M, J>()) {
      return Zero{};
    } else if constexpr (constant_node<G>) {
      using V = Mat<VjpOp<M, static_cast<int>(J), true>, R, A...>;
      const double seed = constant_value(g);
      const V adj{{}, {n.m, seed}, std::apply([&](const auto&... a) { return std::tuple<R, A...>{r, a...}; }, n.args)};
      return backprop<I, Pass::inner>(aj, adj, aj);
    } else {
      using V = Mat<VjpOp<M, static_cast<int>(J), false>, G, R, A...>;
      const V adj{{}, {n.m}, std::apply([&](const auto&... a) { return std::tuple<G, R, A...>{g, r, a...}; }, n.args)};
      return backprop<I, Pass::inner>(aj, adj, aj);
    }
  };
  return [&](auto... c) {
    if constexpr (sizeof...(c) == 1) return (c, ...);
    else return sadd_all(c...);
  }(one(std::integral_constant<std::size_t, K>{})...);
}

/// The contribution to d sum / d argument I of node n whose adjoint is g (pass P, region r).
template <int I, Pass P, class N, class G, class R>
auto backprop(const N& n, const G& g, const R& r) {
  if constexpr (!depends_on<I, N>::value || is_zero<G>) {
    return Zero{};
  } else if constexpr (P == Pass::inner_from_top && !mat_dep<I, N>()) {
    return Zero{};
  } else if constexpr (requires { N::arg_index; }) {
    if constexpr (P == Pass::top) {
      return g;
    } else if constexpr (constant_node<G>) {
      const double seed = constant_value(g);
      return Mat<SumToOp<true>, R, Arg<I>>{{}, {seed}, {r, Arg<I>{}}};
    } else {
      return Mat<SumToOp<false>, G, R, Arg<I>>{{}, {}, {g, r, Arg<I>{}}};
    }
  } else if constexpr (requires { n.m; }) {
    if constexpr (P == Pass::top) return Zero{};
    else return backprop_mat<I>(n, g, r, std::make_index_sequence<std::tuple_size_v<decltype(n.args)>>{});
  } else if constexpr (requires { N::grad_arg; } || requires { N::convert_to; }) {
    return backprop<I, P>(n.a, g, r);
  } else if constexpr (requires { n.c; }) {
    return sadd(backprop<I, P>(n.a, sselect(n.c, g, Zero{}), r), backprop<I, P>(n.b, sselect(n.c, Zero{}, g), r));
  } else if constexpr (requires { n.b; }) {
    using A = decltype(n.a);
    using B = decltype(n.b);
    auto ga = [&] {
      if constexpr (depends_on<I, A>::value) return backprop<I, P>(n.a, adjoint<0>(n, g), r);
      else return Zero{};
    };
    auto gb = [&] {
      if constexpr (depends_on<I, B>::value) return backprop<I, P>(n.b, adjoint<1>(n, g), r);
      else return Zero{};
    };
    return sadd(ga(), gb());
  } else {
    return backprop<I, P>(n.a, adjoint(n, g), r);
  }
}

/// d sum(e) / d argument I: the uses in the top region as one fused GradRoot (argument I's shape
/// and dtype), plus those inside materialized ops, each already reduced to that shape. A sum at
/// the root changes nothing (the sum of a sum is the sum).
template <class E>
struct sum_root : std::false_type {};
template <class A>
struct sum_root<Mat<ReduceOp<ReduceKind::sum>, A>> : std::true_type {};

/// Whether node N holds a materialized op (its shape is then known only once computed).
template <class N>
constexpr bool has_mat() {
  return any_node<no_node, N, /*at_mat=*/true>();
}

template <int I, class E>
auto make_grad(const E& e) {
  if constexpr (sum_root<E>::value) {
    return make_grad<I>(std::get<0>(e.args));
  } else {
    auto top = backprop<I, Pass::top>(e, One{}, e);
    using Root = GradRoot<I, decltype(top), E>;
    if constexpr (!mat_dep<I, E>()) {
      return Root{{}, top, e};
    } else {
      auto inner = backprop<I, Pass::inner_from_top>(e, One{}, e);
      // no use of argument I that passes a gradient (it is read only through floor_div, a
      // comparison...): zeros of its shape and dtype, as the root gives them
      if constexpr (is_zero<decltype(top)> && is_zero<decltype(inner)>) return Root{{}, top, e};
      else if constexpr (is_zero<decltype(top)>) return inner;
      else return m2<ops::Add>(Root{{}, top, e}, inner);
    }
  }
}

}  // namespace stagecraft::staging
