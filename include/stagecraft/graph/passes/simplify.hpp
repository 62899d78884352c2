// Algebraic simplification: a small table of rewrite rules (x*1 -> x, neg(neg(x)) -> x,
// reshape/transpose/slice chains, casts to the same dtype, transposes folded into matmul, device
// round trips). The one pass that names ops: it is a table.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../ir.hpp"
#include "../op_table.hpp"
#include "compact.hpp"

namespace stagecraft::graph {

namespace detail_simplify {

/// What a rule makes of a node: nothing, "the node's output is value v", or a new node
/// (same output value and line) that the rules then see again.
struct Rewrite {
  enum class Kind : std::uint8_t { keep, value, node };
  Kind kind = Kind::keep;
  int value = -1;
  Node node;
  static Rewrite to_value(int v) { return {Kind::value, v, {}}; }
  static Rewrite to_node(Node n) { return {Kind::node, -1, std::move(n)}; }
};

/// The graph as the rules see it: earlier nodes already rewritten, inputs read through the
/// replacements made so far.
struct View {
  const Graph& g;
  const std::vector<int>& replace;
  int in(const Node& n, std::size_t k) const { return resolve_value(replace, n.inputs[k]); }
  const Node& producer(int v) const { return g.nodes[g.values[v].node]; }
  const Value& value(int v) const { return g.values[v]; }
};

/// True when value v is `x` everywhere: a CPU constant all of whose elements equal x exactly
/// (in its own dtype: -0.0 counts as 0), or a fill op node of value x, or either broadcast or
/// reshaped.
STAGECRAFT_COMPILED_INLINE bool is_all(const View& s, int v, double x);

/// True when value v is zeros that add to (negative) or subtract from (!negative) every value of
/// node n's floating dtype without changing it: -0.0 + 0.0 is +0.0, so only x + (-0.0) and
/// x - (+0.0) are x for every x (an integer or bool zero is +0.0 there). Any zero for integers.
STAGECRAFT_COMPILED_INLINE bool is_all_zero(const View& s, const Node& n, int v, bool negative);

/// Node n's result is operand x: x itself when shape and dtype agree, a broadcast_to of x
/// when only the shape differs (the other operand broadcast it), else nothing.
STAGECRAFT_COMPILED_INLINE Rewrite becomes_operand(const View& s, const Node& n, int x);
#if STAGECRAFT_DEFINE_COMPILED
/// The node that makes v's elements: v's producer, seen through broadcast_to and reshape (which
/// only place them).
STAGECRAFT_COMPILED_INLINE const Node& element_source(const View& s, int v) {
  for (;;) {
    const Node& p = s.producer(v);
    if (p.kind != NodeKind::op || p.inputs.size() != 1 || (p.op != ops::OpId::BroadcastTo && p.op != ops::OpId::Reshape))
      return p;
    v = p.inputs[0];
  }
}

STAGECRAFT_COMPILED_INLINE bool is_all_zero(const View& s, const Node& n, int v, bool negative) {
  if (!is_all(s, v, 0)) return false;
  if (!is_floating(s.value(n.outputs[0]).dtype)) return true;
  const Node& p = element_source(s, v);
  if (p.kind == NodeKind::op) return is_floating(s.value(v).dtype) ? std::signbit(p.attrs.scalar) == negative : !negative;
  const Tensor& t = p.constant;
  if (!is_floating(t.dtype())) return !negative;
  return visit_dtype(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T>) {
      const T* d = static_cast<const T*>(t.raw_data());
      for (std::int64_t i = 0; i < t.numel(); ++i)
        if (std::signbit(d[i]) != negative) return false;
      return true;
    } else {
      return !negative;
    }
  });
}

STAGECRAFT_COMPILED_INLINE bool is_all(const View& s, int v, double x) {
  const Node& p = element_source(s, v);
  if (p.kind == NodeKind::op && p.op == ops::OpId::Fill) return p.attrs.scalar == x;
  if (p.kind != NodeKind::constant || !p.constant.device().is_cpu()) return false;
  const Tensor& t = p.constant;
  return visit_dtype(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T want = static_cast<T>(x);
    const T* d = static_cast<const T*>(t.raw_data());
    for (std::int64_t i = 0; i < t.numel(); ++i)
      if (!(d[i] == want)) return false;
    return true;
  });
}

STAGECRAFT_COMPILED_INLINE Rewrite becomes_operand(const View& s, const Node& n, int x) {
  const Value& out = s.value(n.outputs[0]);
  const Value& xv = s.value(x);
  if (xv.dtype != out.dtype || xv.device != out.device) return {};
  if (xv.shape == out.shape) return Rewrite::to_value(x);
  Node b = n;
  b.op = ops::OpId::BroadcastTo;
  b.inputs = {x};
  b.attrs = {};
  b.attrs.ints = out.shape;
  return Rewrite::to_node(std::move(b));
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// op(x, c) -> x when c is all `E` (x*1, x+0, x-0, x/1).
template <int E>
Rewrite right_identity(const View& s, const Node& n) {
  return is_all(s, s.in(n, 1), E) ? becomes_operand(s, n, s.in(n, 0)) : Rewrite{};
}
/// op(c, x) -> x when c is all `E` (1*x, 0+x).
template <int E>
Rewrite left_identity(const View& s, const Node& n) {
  return is_all(s, s.in(n, 0), E) ? becomes_operand(s, n, s.in(n, 1)) : Rewrite{};
}

/// x+(-0) -> x, -0+x -> x, x-0 -> x: a zero of the sign that changes no value (is_all_zero).
template <bool Negative>
Rewrite right_zero(const View& s, const Node& n) {
  return is_all_zero(s, n, s.in(n, 1), Negative) ? becomes_operand(s, n, s.in(n, 0)) : Rewrite{};
}
template <bool Negative>
Rewrite left_zero(const View& s, const Node& n) {
  return is_all_zero(s, n, s.in(n, 0), Negative) ? becomes_operand(s, n, s.in(n, 1)) : Rewrite{};
}

/// (x+0)+0 -> x+0 for zeros of sign + on either side of either sum (floating types; integer
/// zeros are gone by then): x + (+0.0) is never -0.0, and +0.0 added to anything else changes
/// nothing, NaN included. Such chains are what distribute_over_concat makes of a gradient summed
/// from slices.
STAGECRAFT_COMPILED_INLINE Rewrite zero_add_twice(const View& s, const Node& n);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE Rewrite zero_add_twice(const View& s, const Node& n) {
  for (std::size_t k = 0; k < 2; ++k) {
    if (!is_all_zero(s, n, s.in(n, k), false)) continue;
    const int u = s.in(n, 1 - k);
    const Node& p = s.producer(u);
    if (p.kind != NodeKind::op || p.op != ops::OpId::Add || p.outputs.size() != 1) continue;
    if (!is_all_zero(s, p, s.in(p, 0), false) && !is_all_zero(s, p, s.in(p, 1), false)) continue;
    const Value &uv = s.value(u), &out = s.value(n.outputs[0]);
    if (uv.shape == out.shape && uv.dtype == out.dtype && uv.device == out.device) return Rewrite::to_value(u);
  }
  return {};
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// f(f(x)) -> x for an involution f (neg).
STAGECRAFT_COMPILED_INLINE Rewrite involution(const View& s, const Node& n);

/// op(x) -> x when the result has x's shape and dtype (reshape, broadcast_to, cast).
STAGECRAFT_COMPILED_INLINE Rewrite no_op_when_same_type(const View& s, const Node& n);

/// reshape(reshape(x)) -> reshape(x), to the outer result's (resolved) shape.
STAGECRAFT_COMPILED_INLINE Rewrite reshape_reshape(const View& s, const Node& n);

/// slice(slice(x)) -> slice(x): the outer box moved by the inner one's begin, sizes resolved.
STAGECRAFT_COMPILED_INLINE Rewrite slice_slice(const View& s, const Node& n);

/// The permutation a transpose node applies (empty and negative entries resolved).
STAGECRAFT_COMPILED_INLINE Shape perm_of(const View& s, const Node& n);

/// True when p maps every axis to itself.
STAGECRAFT_COMPILED_INLINE bool is_identity(const Shape& p);

/// transpose(x, p) -> x when p is the identity.
STAGECRAFT_COMPILED_INLINE Rewrite transpose_identity(const View& s, const Node& n);

/// transpose(transpose(x, p), q) -> transpose(x, r) with r[k] = p[q[k]] (output axis k is the
/// inner result's axis q[k], which is x's axis p[q[k]]); the identity rule then removes it
/// when r is the identity.
STAGECRAFT_COMPILED_INLINE Rewrite transpose_transpose(const View& s, const Node& n);

/// True when p swaps the last two axes and keeps the others (rank >= 2).
STAGECRAFT_COMPILED_INLINE bool swaps_last_two(const Shape& p);

/// matmul(transpose(x), y) -> matmul(x, y) with x's transpose flag flipped, when the transpose
/// swaps x's last two axes only (likewise for y): BLAS reads x transposed, no copy is made.
STAGECRAFT_COMPILED_INLINE Rewrite transpose_into_matmul(const View& s, const Node& n);

/// to(x) -> x when x is already on the result's device.
STAGECRAFT_COMPILED_INLINE Rewrite to_own_device(const View& s, const Node& n);

/// to(to(x, a), b) -> to(x, b): one copy (none, by to_own_device, when x is on b: a round trip).
STAGECRAFT_COMPILED_INLINE Rewrite to_to(const View& s, const Node& n);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE Rewrite to_own_device(const View& s, const Node& n) {
  return s.value(s.in(n, 0)).device == s.value(n.outputs[0]).device ? Rewrite::to_value(s.in(n, 0)) : Rewrite{};
}

STAGECRAFT_COMPILED_INLINE Rewrite to_to(const View& s, const Node& n) {
  const Node& p = s.producer(s.in(n, 0));
  if (p.kind != NodeKind::op || p.op != ops::OpId::ToDevice) return {};
  Node r = n;
  r.inputs = {s.in(p, 0)};
  return Rewrite::to_node(std::move(r));
}

STAGECRAFT_COMPILED_INLINE Rewrite involution(const View& s, const Node& n) {
  const Node& p = s.producer(s.in(n, 0));
  if (p.kind != NodeKind::op || p.op != n.op) return {};
  return becomes_operand(s, n, s.in(p, 0));
}

STAGECRAFT_COMPILED_INLINE Rewrite no_op_when_same_type(const View& s, const Node& n) {
  const Value& out = s.value(n.outputs[0]);
  const Value& x = s.value(s.in(n, 0));
  return x.shape == out.shape && x.dtype == out.dtype ? Rewrite::to_value(s.in(n, 0)) : Rewrite{};
}

STAGECRAFT_COMPILED_INLINE Rewrite reshape_reshape(const View& s, const Node& n) {
  const Node& p = s.producer(s.in(n, 0));
  if (p.kind != NodeKind::op || p.op != ops::OpId::Reshape) return {};
  Node r = n;
  r.inputs = {s.in(p, 0)};
  r.attrs.ints = s.value(n.outputs[0]).shape;
  return Rewrite::to_node(std::move(r));
}

STAGECRAFT_COMPILED_INLINE Rewrite slice_slice(const View& s, const Node& n) {
  const int inner = s.in(n, 0);
  const Node& p = s.producer(inner);
  if (p.kind != NodeKind::op || p.op != ops::OpId::Slice || p.inputs.size() != 1 || p.outputs.size() != 1) return {};
  const int x = s.in(p, 0);
  const Shape &xs = s.value(x).shape, &ps = s.value(inner).shape, &out = s.value(n.outputs[0]).shape;
  if (xs.rank() != ps.rank() || ps.rank() != out.rank() || s.value(x).device != s.value(inner).device) return {};
  Node r = n;
  r.inputs = {x};
  r.attrs.ints = Shape{};
  for (int k = 0; k < xs.rank(); ++k)
    r.attrs.ints.push_back(ops::Slice::start(xs, p.attrs, k) + ops::Slice::start(ps, n.attrs, k));
  r.attrs.ints2 = out;
  return Rewrite::to_node(std::move(r));
}

STAGECRAFT_COMPILED_INLINE Shape perm_of(const View& s, const Node& n) {
  return ops::Transpose::resolve(s.value(s.in(n, 0)).shape, n.attrs.ints);
}

STAGECRAFT_COMPILED_INLINE bool is_identity(const Shape& p) {
  for (int k = 0; k < p.rank(); ++k)
    if (p[k] != k) return false;
  return true;
}

STAGECRAFT_COMPILED_INLINE Rewrite transpose_identity(const View& s, const Node& n) {
  return is_identity(perm_of(s, n)) ? Rewrite::to_value(s.in(n, 0)) : Rewrite{};
}

STAGECRAFT_COMPILED_INLINE Rewrite transpose_transpose(const View& s, const Node& n) {
  const Node& p = s.producer(s.in(n, 0));
  if (p.kind != NodeKind::op || p.op != ops::OpId::Transpose) return {};
  const Shape inner = perm_of(s, p), outer = perm_of(s, n);
  Shape r;
  for (int k = 0; k < outer.rank(); ++k) r.push_back(inner[static_cast<int>(outer[k])]);
  Node t = n;
  t.inputs = {s.in(p, 0)};
  t.attrs.ints = r;
  return Rewrite::to_node(std::move(t));
}

STAGECRAFT_COMPILED_INLINE bool swaps_last_two(const Shape& p) {
  const int r = p.rank();
  if (r < 2 || p[r - 1] != r - 2 || p[r - 2] != r - 1) return false;
  for (int k = 0; k < r - 2; ++k)
    if (p[k] != k) return false;
  return true;
}

STAGECRAFT_COMPILED_INLINE Rewrite transpose_into_matmul(const View& s, const Node& n) {
  for (std::size_t k = 0; k < 2; ++k) {
    const int v = s.in(n, k);
    const Node& p = s.producer(v);
    if (p.kind != NodeKind::op || p.op != ops::OpId::Transpose || !swaps_last_two(perm_of(s, p))) continue;
    if (s.value(s.in(p, 0)).device != s.value(v).device) continue;
    Node m = n;
    m.inputs = {s.in(n, 0), s.in(n, 1)};
    m.inputs[k] = s.in(p, 0);
    std::int64_t& flag = k == 0 ? m.attrs.i0 : m.attrs.i1;
    flag = flag != 0 ? 0 : 1;
    return Rewrite::to_node(std::move(m));
  }
  return {};
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// op(broadcast_to(x), y) -> op(x, y), and on the right, when x and y broadcast to the op's shape
/// themselves: the op reads x's elements where it read their copies (the same values, so the same
/// results), and the copy need not be made. (An autodiff gradient adds a reduction's broadcast
/// gradient to a value of the full shape; the fusion pass then reads x as a broadcast input.)
STAGECRAFT_COMPILED_INLINE Rewrite broadcast_into_binary(const View& s, const Node& n);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE Rewrite broadcast_into_binary(const View& s, const Node& n) {
  if (n.inputs.size() != 2) return {};
  const Shape& out = s.value(n.outputs[0]).shape;
  for (std::size_t k = 0; k < 2; ++k) {
    const int v = s.in(n, k);
    const Node& p = s.producer(v);
    if (p.kind != NodeKind::op || p.op != ops::OpId::BroadcastTo || p.inputs.size() != 1) continue;
    const int x = s.in(p, 0);
    if (s.value(x).dtype != s.value(v).dtype || s.value(x).device != s.value(v).device) continue;
    Shape joint;
    if (!broadcast_shapes(s.value(x).shape, s.value(s.in(n, 1 - k)).shape, joint) || !(joint == out)) continue;
    Node m = n;
    m.inputs = {s.in(n, 0), s.in(n, 1)};
    m.inputs[k] = x;
    return Rewrite::to_node(std::move(m));
  }
  return {};
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// One rewrite rule: the op it matches and what it does. Rules of one op are tried in order.
struct Rule {
  ops::OpId op;
  const char* what;  ///< the rule, as documentation and for debugging
  Rewrite (*apply)(const View&, const Node&);
};

inline const Rule rules[] = {
    {ops::OpId::Mul, "x*1 -> x", &right_identity<1>},
    {ops::OpId::Mul, "1*x -> x", &left_identity<1>},
    {ops::OpId::Add, "x+(-0) -> x", &right_zero<true>},
    {ops::OpId::Add, "(-0)+x -> x", &left_zero<true>},
    {ops::OpId::Add, "(x+0)+0 -> x+0", &zero_add_twice},
    {ops::OpId::Sub, "x-0 -> x", &right_zero<false>},
    {ops::OpId::Div, "x/1 -> x", &right_identity<1>},
    {ops::OpId::Add, "broadcast_to(x) + y -> x + y", &broadcast_into_binary},
    {ops::OpId::Sub, "broadcast_to(x) - y -> x - y", &broadcast_into_binary},
    {ops::OpId::Mul, "broadcast_to(x) * y -> x * y", &broadcast_into_binary},
    {ops::OpId::Div, "broadcast_to(x) / y -> x / y", &broadcast_into_binary},
    {ops::OpId::Maximum, "maximum(broadcast_to(x), y) -> maximum(x, y)", &broadcast_into_binary},
    {ops::OpId::Minimum, "minimum(broadcast_to(x), y) -> minimum(x, y)", &broadcast_into_binary},
    {ops::OpId::Neg, "neg(neg(x)) -> x", &involution},
    {ops::OpId::Reshape, "reshape(x, shape of x) -> x", &no_op_when_same_type},
    {ops::OpId::Reshape, "reshape(reshape(x)) -> reshape(x)", &reshape_reshape},
    {ops::OpId::Transpose, "transpose(x, identity) -> x", &transpose_identity},
    {ops::OpId::Transpose, "transpose(transpose(x, p), q) -> transpose(x, p o q)", &transpose_transpose},
    {ops::OpId::Slice, "slice(x, all of x) -> x", &no_op_when_same_type},
    {ops::OpId::Slice, "slice(slice(x)) -> slice(x)", &slice_slice},
    {ops::OpId::Cast, "cast(x, dtype of x) -> x", &no_op_when_same_type},
    {ops::OpId::BroadcastTo, "broadcast_to(x, shape of x) -> x", &no_op_when_same_type},
    {ops::OpId::MatMul, "matmul(transpose(x), y) -> matmul[transposed x](x, y)", &transpose_into_matmul},
    {ops::OpId::ToDevice, "to(x, device of x) -> x", &to_own_device},
    {ops::OpId::ToDevice, "to(to(x, a), b) -> to(x, b)", &to_to},
};

/// Rewrites node i of r until no rule applies (a bounded number of times); returns the value
/// its output stands for, or -1 when the node stays (possibly rewritten).
STAGECRAFT_COMPILED_INLINE int simplify_node(Graph& r, std::size_t i, const std::vector<int>& replace);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE int simplify_node(Graph& r, std::size_t i, const std::vector<int>& replace) {
  const View s{r, replace};
  for (int round = 0; round < 8; ++round) {
    const Node& n = r.nodes[i];
    if (n.kind != NodeKind::op || n.outputs.size() != 1) return -1;
    Rewrite w;
    for (const Rule& rule : rules) {
      if (rule.op != n.op) continue;
      w = rule.apply(s, n);
      if (w.kind != Rewrite::Kind::keep) break;
    }
    if (w.kind == Rewrite::Kind::keep) return -1;
    if (w.kind == Rewrite::Kind::value) return w.value;
    w.node.outputs = n.outputs;
    w.node.loc = n.loc;
    r.nodes[i] = std::move(w.node);
  }
  return -1;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace detail_simplify

/// Algebraic simplification, pure, by the rule table above (detail_simplify::rules): identity
/// elements (x*1, 1*x, x+(-0), (-0)+x, x-0, x/1, where the constant is all ones or zeros of that
/// sign (is_all_zero: x+0.0 stays, as it turns -0.0 into +0.0, but (x+0.0)+0.0 is x+0.0), or a fill of that value; kept
/// when the op changes x's dtype, a broadcast_to when it only changes its shape), neg(neg(x)),
/// reshape, transpose and slice chains, reshape/cast/broadcast_to/slice that change nothing, a
/// broadcast_to read by add, sub, mul, div, maximum or minimum that broadcast its input themselves,
/// a transpose of the last two axes folded into the matmul reading it, and chains of moves between
/// devices. Nodes it bypasses are left for dce.
STAGECRAFT_COMPILED_INLINE Graph simplify(const Graph& g);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE Graph simplify(const Graph& g) {
  Graph r = g;
  std::vector<char> keep(r.nodes.size(), 1);
  std::vector<int> replace(r.values.size(), -1);
  for (std::size_t i = 0; i < r.nodes.size(); ++i) {
    const int v = detail_simplify::simplify_node(r, i, replace);
    if (v < 0) continue;
    replace[r.nodes[i].outputs[0]] = v;
    keep[i] = 0;
  }
  return with_bodies(compact(r, keep, replace), [](const Graph& b) { return simplify(b); });
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
