// Cutting a traced forward-and-backward graph in two, so a differentiable call computes its
// forward pass once and keeps what the backward pass needs (TensorFlow's forward/backward
// function pair for a tf.function under a tape).
#pragma once
#include <utility>
#include <vector>

#include "ir.hpp"
#include "passes/compact.hpp"  // append_node

namespace stagecraft::graph {

/// The two halves of a joint graph C(args..., seeds...) -> (outs..., grads...):
/// forward F(args...) -> (outs..., residuals...) runs every node that does not depend on a seed
/// (side effects included, in program order); backward B(residuals..., seeds...) -> grads runs
/// the rest. Residuals are the values of F (arguments included) that B reads; constants B reads,
/// and values made from constants alone by fills, broadcasts, reshapes and casts (the zeros a
/// slice's gradient pads with), are copied into it instead: kept, they would be made and stored
/// at every forward call, and B's optimizer could not see that they are constant. A value that a
/// cheap elementwise op makes from fewer bytes than its own (layer_norm's x - mean and xhat, made
/// from x and two per-row values) is made again in B too, from those inputs (remade_values).
struct SplitGraphs {
  Graph forward, backward;
  int num_residuals = 0;
};

namespace detail_split {

/// Appends node n to out with its inputs renumbered by new_id (which gains its outputs).
STAGECRAFT_COMPILED_INLINE void copy_node(Graph& out, const Graph& g, const Node& n, std::vector<int>& new_id);

/// Appends an input node (argument `index`) of value v's type; returns its value.
STAGECRAFT_COMPILED_INLINE int add_input(Graph& out, const Value& v, int index);

/// For each value of c: whether it is made from constants alone by nodes cheap and pure to make
/// again (constants, fills, and broadcast_to / reshape / cast of such values).
STAGECRAFT_COMPILED_INLINE std::vector<char> constant_made(const Graph& c);

/// Whether an op is cheap and pure enough for the backward half to run it again rather than
/// receive its result: elementwise arithmetic, comparisons, selection, casts, reshapes and
/// broadcasts (not transcendental functions, reductions, products or random draws).
STAGECRAFT_COMPILED_INLINE bool cheap_to_remake(ops::OpId op);

/// For each value of c: whether the backward half makes it again instead of receiving it as a
/// residual. A value is made again when a cheap op (cheap_to_remake) with one result makes it
/// from inputs that cost the backward half fewer bytes than the value itself: arguments, F's
/// results and values made from constants (`free`) cost nothing (they are there anyway), a value
/// made again costs what it is made from, any other value its size. `dep`: depends on a seed.
STAGECRAFT_COMPILED_INLINE std::vector<char> remade_values(const Graph& c, int num_args, int num_outs,
                                                          const std::vector<char>& dep,
                                                          const std::vector<char>& free);

/// Appends to out, in dependency order, the nodes that make value v again and have not been
/// copied yet: v's maker and, first, those of its inputs that `again` marks (an input not
/// marked must already be in new_id).
STAGECRAFT_COMPILED_INLINE void make_again(Graph& out, const Graph& c, int v, const std::vector<char>& again,
                                           std::vector<int>& new_id);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::vector<char> constant_made(const Graph& c) {
  std::vector<char> free(c.values.size(), 0);
  for (const Node& n : c.nodes) {
    bool f = n.kind == NodeKind::constant;
    if (n.kind == NodeKind::op && n.outputs.size() == 1) {
      using ops::OpId;
      f = n.op == OpId::Fill || n.op == OpId::BroadcastTo || n.op == OpId::Reshape || n.op == OpId::Cast;
      for (int v : n.inputs) f = f && free[v];
    }
    if (f)
      for (int v : n.outputs) free[v] = 1;
  }
  return free;
}

STAGECRAFT_COMPILED_INLINE bool cheap_to_remake(ops::OpId op) {
  using ops::OpId;
  switch (op) {
    case OpId::Neg: case OpId::Abs: case OpId::Relu: case OpId::Square: case OpId::Sign:
    case OpId::Floor: case OpId::Ceil: case OpId::Round:
    case OpId::LogicalNot: case OpId::Add: case OpId::Sub: case OpId::Mul: case OpId::Div:
    case OpId::Maximum: case OpId::Minimum: case OpId::Less: case OpId::LessEqual:
    case OpId::Greater: case OpId::GreaterEqual: case OpId::Equal: case OpId::NotEqual:
    case OpId::LogicalAnd: case OpId::LogicalOr: case OpId::ReluGrad: case OpId::Where:
    case OpId::Cast: case OpId::Reshape: case OpId::BroadcastTo:
      return true;
    default:
      return false;
  }
}

STAGECRAFT_COMPILED_INLINE std::vector<char> remade_values(const Graph& c, int num_args, int num_outs,
                                                          const std::vector<char>& dep,
                                                          const std::vector<char>& free) {
  const std::size_t nv = c.values.size();
  std::vector<char> there(nv, 0), again(nv, 0);  // there: in the backward half at no cost
  for (int k = 0; k < num_args; ++k) there[c.inputs[k]] = 1;
  for (int k = 0; k < num_outs; ++k) there[c.outputs[k]] = 1;
  auto bytes = [&](int v) -> double {
    const Value& x = c.values[v];
    double n = static_cast<double>(itemsize(x.dtype));
    for (std::int64_t d : x.shape) n *= static_cast<double>(d);
    return n;
  };
  std::vector<double> cost(nv, 0.0);  // bytes the backward half receives to have the value
  for (const Node& n : c.nodes) {
    for (int v : n.outputs) cost[v] = there[v] || free[v] ? 0.0 : bytes(v);
    if (n.kind != NodeKind::op || n.outputs.size() != 1 || !cheap_to_remake(n.op)) continue;
    const int v = n.outputs[0];
    if (dep[v] || there[v] || free[v]) continue;
    double make = 0;
    for (int x : n.inputs) make += cost[x];
    if (make < cost[v]) again[v] = 1, cost[v] = make;
  }
  return again;
}

STAGECRAFT_COMPILED_INLINE void make_again(Graph& out, const Graph& c, int v, const std::vector<char>& again,
                                           std::vector<int>& new_id) {
  // Depth first without recursion (a chain of elementwise ops can be long): (value, inputs seen).
  std::vector<std::pair<int, bool>> todo{{v, false}};
  while (!todo.empty()) {
    auto [x, expanded] = todo.back();
    todo.pop_back();
    if (new_id[x] >= 0 || !again[x]) continue;
    const Node& p = c.nodes[c.values[x].node];
    if (expanded) {
      copy_node(out, c, p, new_id);
      continue;
    }
    todo.push_back({x, true});
    for (int in : p.inputs) todo.push_back({in, false});
  }
}

STAGECRAFT_COMPILED_INLINE void copy_node(Graph& out, const Graph& g, const Node& n, std::vector<int>& new_id) {
  Node m = n;
  for (int& v : m.inputs) v = new_id[v];
  append_node(out, g, std::move(m), new_id);
}

STAGECRAFT_COMPILED_INLINE int add_input(Graph& out, const Value& v, int index) {
  Node n;
  n.kind = NodeKind::input;
  n.index = index;
  const int id = out.add_node(std::move(n), {TensorSpec{v.shape, v.dtype}}, v.device);
  return out.nodes[id].outputs[0];
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace detail_split

/// Splits c, whose inputs are num_args arguments then the seeds and whose outputs are num_outs
/// results then the gradients. Throws sc::Error when an assignment depends on a seed (the
/// backward half may run any number of times).
STAGECRAFT_COMPILED_INLINE SplitGraphs split_forward_backward(const Graph& c, int num_args, int num_outs);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE SplitGraphs split_forward_backward(const Graph& c, int num_args, int num_outs) {
  namespace s = detail_split;
  const std::size_t nv = c.values.size();
  std::vector<char> dep(nv, 0);  // depends on a seed
  for (std::size_t k = static_cast<std::size_t>(num_args); k < c.inputs.size(); ++k) dep[c.inputs[k]] = 1;
  std::vector<char> backward(c.nodes.size(), 0);
  for (std::size_t i = 0; i < c.nodes.size(); ++i) {
    const Node& n = c.nodes[i];
    if (n.kind == NodeKind::input) continue;
    bool d = false;
    for (int v : n.inputs) d = d || dep[v];
    if (!d) continue;
    if (n.kind == NodeKind::assign_var)
      throw Error("[split] node " + std::to_string(i) + " (" + std::string(n.name()) +
                  ") has an effect and depends on an output gradient");
    backward[i] = 1;
    for (int v : n.outputs) dep[v] = 1;
  }
  // Residuals: forward values that backward nodes or the gradients read, or that values made
  // again are made from (not values made from constants alone, not values made again).
  const std::vector<char> free = s::constant_made(c);
  const std::vector<char> remade = s::remade_values(c, num_args, num_outs, dep, free);
  std::vector<char> is_res(nv, 0);  // 1: a residual; 2: made again, its inputs seen
  std::vector<int> residuals;
  auto need = [&](int first) {
    std::vector<int> todo{first};
    while (!todo.empty()) {
      const int v = todo.back();
      todo.pop_back();
      if (dep[v] || is_res[v] || free[v]) continue;
      if (remade[v]) {
        is_res[v] = 2;
        for (int x : c.nodes[c.values[v].node].inputs) todo.push_back(x);
        continue;
      }
      is_res[v] = 1;
      residuals.push_back(v);
    }
  };
  for (std::size_t i = 0; i < c.nodes.size(); ++i)
    if (backward[i])
      for (int v : c.nodes[i].inputs) need(v);
  for (std::size_t k = static_cast<std::size_t>(num_outs); k < c.outputs.size(); ++k) need(c.outputs[k]);

  SplitGraphs r;
  r.num_residuals = static_cast<int>(residuals.size());
  {  // forward: the arguments, every seed-free node, then outs and residuals as results
    Graph& f = r.forward;
    f.name = c.name + "_forward";
    f.strings = c.strings;
    std::vector<int> new_id(nv, -1);
    for (int k = 0; k < num_args; ++k) new_id[c.inputs[k]] = s::add_input(f, c.values[c.inputs[k]], k);
    for (int k = 0; k < num_args; ++k) f.inputs.push_back(new_id[c.inputs[k]]);
    for (std::size_t i = 0; i < c.nodes.size(); ++i)
      if (c.nodes[i].kind != NodeKind::input && !backward[i]) s::copy_node(f, c, c.nodes[i], new_id);
    for (int k = 0; k < num_outs; ++k) f.outputs.push_back(new_id[c.outputs[k]]);
    for (int v : residuals) f.outputs.push_back(new_id[v]);
  }
  {  // backward: residuals and seeds as arguments, the constants it reads, its nodes
    Graph& b = r.backward;
    b.name = c.name + "_backward";
    b.strings = c.strings;
    std::vector<int> new_id(nv, -1);
    int pos = 0;
    for (int v : residuals) b.inputs.push_back(new_id[v] = s::add_input(b, c.values[v], pos++));
    for (std::size_t k = static_cast<std::size_t>(num_args); k < c.inputs.size(); ++k)
      b.inputs.push_back(new_id[c.inputs[k]] = s::add_input(b, c.values[c.inputs[k]], pos++));
    // Values made from constants, and values made again from residuals, are made here (their
    // makers first).
    std::vector<char> again(nv, 0);
    for (std::size_t v = 0; v < nv; ++v) again[v] = free[v] || (remade[v] && is_res[v] == 2);
    auto constant = [&](int v) { s::make_again(b, c, v, again, new_id); };
    for (std::size_t i = 0; i < c.nodes.size(); ++i)
      if (backward[i]) {
        for (int v : c.nodes[i].inputs) constant(v);
        s::copy_node(b, c, c.nodes[i], new_id);
      }
    for (std::size_t k = static_cast<std::size_t>(num_outs); k < c.outputs.size(); ++k) {
      constant(c.outputs[k]);
      b.outputs.push_back(new_id[c.outputs[k]]);
    }
  }
  return r;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
