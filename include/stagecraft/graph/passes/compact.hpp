// What every pass shares: rebuilding a graph from a subset of its nodes with values renumbered
// (compact), which nodes are side effects, and applying a pass to cond/while bodies.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "../../core/error.hpp"
#include "../ir.hpp"

namespace stagecraft::graph {

/// True for nodes a pass may never remove or merge: they act on the world (variables, host
/// code) or run bodies that may. A dead read_var is not one of them: reading has no effect, nor
/// is a pure host_fn (a gradient rule's host code).
STAGECRAFT_COMPILED_INLINE bool is_side_effect(const Node& n);

/// The value v stands for after the replacements (replace[v] < 0 or == v: itself); chains
/// are followed (replace[a] = b, replace[b] = c: a stands for c).
STAGECRAFT_COMPILED_INLINE int resolve_value(const std::vector<int>& replace, int v);

/// Appends node n of graph g to out: n's inputs must already be out's values; its outputs get new
/// values of the same types and devices, recorded in new_id (indexed by g's values).
STAGECRAFT_COMPILED_INLINE void append_node(Graph& out, const Graph& g, Node n, std::vector<int>& new_id);

/// A new graph holding the nodes i with keep[i] != 0 (input nodes always: they are the
/// arguments), in program order, with values renumbered densely. Every use of a value v (node
/// inputs, graph outputs) reads resolve_value(replace, v) instead; replace may be empty or
/// shorter than the value list. Name, inputs (by position), outputs and strings are kept;
/// bodies are shared, not copied. Throws sc::Error when a kept use reads a removed node.
STAGECRAFT_COMPILED_INLINE Graph compact(const Graph& g, const std::vector<char>& keep,
                                         const std::vector<int>& replace = {});
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE bool is_side_effect(const Node& n) {
  return n.kind == NodeKind::assign_var || (n.kind == NodeKind::host_fn && !(n.host && n.host->pure)) ||
         n.kind == NodeKind::cond || n.kind == NodeKind::while_loop;
}

STAGECRAFT_COMPILED_INLINE int resolve_value(const std::vector<int>& replace, int v) {
  for (std::size_t steps = 0; v >= 0 && static_cast<std::size_t>(v) < replace.size(); ++steps) {
    const int r = replace[v];
    if (r < 0 || r == v) break;
    if (steps > replace.size())
      throw Error("[compact] the value replacements form a cycle through %" + std::to_string(v));
    v = r;
  }
  return v;
}

STAGECRAFT_COMPILED_INLINE void append_node(Graph& out, const Graph& g, Node n, std::vector<int>& new_id) {
  const std::vector<int> old_outputs = std::move(n.outputs);
  n.outputs.clear();
  std::vector<TensorSpec> specs;
  specs.reserve(old_outputs.size());
  for (int v : old_outputs) specs.push_back({g.values[v].shape, g.values[v].dtype});
  const Device dev = old_outputs.empty() ? Device::cpu() : g.values[old_outputs[0]].device;
  const int id = out.add_node(std::move(n), specs, dev);
  for (std::size_t k = 0; k < old_outputs.size(); ++k) {
    new_id[old_outputs[k]] = out.nodes[id].outputs[k];
    out.values[out.nodes[id].outputs[k]].device = g.values[old_outputs[k]].device;
  }
}

STAGECRAFT_COMPILED_INLINE Graph compact(const Graph& g, const std::vector<char>& keep,
                                         const std::vector<int>& replace) {
  Graph out;
  out.name = g.name;
  out.strings = g.strings;
  std::vector<int> new_id(g.values.size(), -1);
  auto use = [&](int v, const Node* user) {
    const int r = resolve_value(replace, v);
    if (r < 0 || static_cast<std::size_t>(r) >= new_id.size() || new_id[r] < 0)
      throw Error("[compact] value %" + std::to_string(v) +
                  (r != v ? " (standing for %" + std::to_string(r) + ")" : "") +
                  " is used by " + (user ? std::string(user->name()) : std::string("the results")) +
                  " but its node was removed or comes later");
    return new_id[r];
  };
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.kind != NodeKind::input && (i >= keep.size() || !keep[i])) continue;
    Node m = n;
    for (int& v : m.inputs) v = use(v, &n);
    append_node(out, g, std::move(m), new_id);
  }
  out.inputs.reserve(g.inputs.size());
  for (int v : g.inputs) out.inputs.push_back(new_id[v]);
  out.outputs.reserve(g.outputs.size());
  for (int v : g.outputs) out.outputs.push_back(use(v, nullptr));
  return out;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// g with `pass` applied to the bodies of its cond and while nodes (each body replaced by the
/// pass's result: the bodies the caller's graph shares are never modified).
template <class Pass>
Graph with_bodies(Graph g, Pass&& pass) {
  for (Node& n : g.nodes)
    for (auto& body : n.bodies)
      if (body) body = std::make_shared<const Graph>(pass(*body));
  return g;
}

}  // namespace stagecraft::graph
