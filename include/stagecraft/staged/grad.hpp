// Symbolic differentiation of staged expression types: the derivative of sum(f(args)) with
// respect to argument I is built at compile time by reverse accumulation over the expression
// type, with the rules of the eager gradient (ops/unary.hpp, ops/binary.hpp, ops/where.hpp)
// written over staged nodes. Zero and One are types, so multiplying by one, adding zero and
// every branch that does not depend on argument I disappear while the type is built.
#pragma once
#include <type_traits>

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
  else return Zero{};  // sign and predicates: piecewise constant
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
  } else if constexpr (std::is_same_v<Op, ops::Maximum> || std::is_same_v<Op, ops::Minimum>) {
    using Cmp = std::conditional_t<std::is_same_v<Op, ops::Maximum>, ops::Greater, ops::Less>;
    const auto pick_a = m2<ops::LogicalOr>(m2<Cmp>(a, b), m2<ops::NotEqual>(a, a));
    const auto tie = m2<ops::Equal>(a, b);
    const auto half = smul(g, kd(0.5));
    if constexpr (Side == 0) return sselect(pick_a, g, sselect(tie, half, Zero{}));
    else return sselect(pick_a, Zero{}, sselect(tie, half, g));
  } else {
    return Zero{};  // comparisons and logical ops
  }
}

/// The contribution to d sum / d argument I of node n whose adjoint is g.
template <int I, class N, class G>
auto backprop(const N& n, const G& g) {
  if constexpr (!depends_on<I, N>::value || is_zero<G>) {
    return Zero{};
  } else if constexpr (requires { N::arg_index; }) {
    return g;
  } else if constexpr (requires { n.m; }) {
    static_assert(always_false<N>,
                  "stagecraft: sc::grad cannot yet differentiate through matmul, reductions (other than a "
                  "sum at the root), softmax or conv2d at compile time; use sc::GradientTape, or an "
                  "sc::function with a tape");
    return Zero{};
  } else if constexpr (requires { N::grad_arg; } || requires { N::convert_to; }) {
    return backprop<I>(n.a, g);
  } else if constexpr (requires { n.c; }) {
    return sadd(backprop<I>(n.a, sselect(n.c, g, Zero{})), backprop<I>(n.b, sselect(n.c, Zero{}, g)));
  } else if constexpr (requires { n.b; }) {
    using A = decltype(n.a);
    using B = decltype(n.b);
    auto ga = [&] {
      if constexpr (depends_on<I, A>::value) return backprop<I>(n.a, adjoint<0>(n, g));
      else return Zero{};
    };
    auto gb = [&] {
      if constexpr (depends_on<I, B>::value) return backprop<I>(n.b, adjoint<1>(n, g));
      else return Zero{};
    };
    return sadd(ga(), gb());
  } else {
    return backprop<I>(n.a, adjoint(n, g));
  }
}

/// d sum(e) / d argument I, as an expression rooted at GradRoot (argument I's shape and dtype).
/// A sum at the root changes nothing (the sum of a sum is the sum).
template <class E>
struct sum_root : std::false_type {};
template <class A>
struct sum_root<Mat<ReduceOp<ReduceKind::sum>, A>> : std::true_type {};

template <int I, class E>
auto make_grad(const E& e) {
  if constexpr (sum_root<E>::value) {
    return make_grad<I>(std::get<0>(e.args));
  } else {
    using Adj = decltype(backprop<I>(e, One{}));
    return GradRoot<I, Adj, E>{{}, backprop<I>(e, One{}), e};
  }
}

}  // namespace stagecraft::staging
