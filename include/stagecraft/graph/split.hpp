// Cutting a traced forward-and-backward graph in two, so a differentiable call computes its
// forward pass once and keeps what the backward pass needs (TensorFlow's forward/backward
// function pair for a tf.function under a tape).
#pragma once
#include <functional>
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
/// at every forward call, and B's optimizer could not see that they are constant.
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
  // Residuals: forward values (not made from constants alone) that backward nodes or the
  // gradients read.
  const std::vector<char> free = s::constant_made(c);
  std::vector<char> is_res(nv, 0);
  std::vector<int> residuals;
  auto need = [&](int v) {
    if (dep[v] || is_res[v] || free[v]) return;
    is_res[v] = 1;
    residuals.push_back(v);
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
    // A value made from constants, made again here (its makers first).
    std::function<void(int)> constant = [&](int v) {
      if (!free[v] || new_id[v] >= 0) return;
      const Node& p = c.nodes[c.values[v].node];
      for (int x : p.inputs) constant(x);
      s::copy_node(b, c, p, new_id);
    };
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
