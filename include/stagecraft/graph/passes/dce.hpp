// Dead-code elimination: drops nodes whose values reach neither a result nor a side effect.
#pragma once
#include <memory>
#include <vector>

#include "../ir.hpp"
#include "compact.hpp"

namespace stagecraft::graph {

/// Which nodes of g are live: side effects (assign_var, host_fn unless pure, cond, while: kept whole,
/// conservatively), input nodes (the arguments), and every node whose value (transitively)
/// feeds a result or a live node. One backward sweep suffices: nodes are in program order.
STAGECRAFT_COMPILED_INLINE std::vector<char> live_nodes(const Graph& g);

/// Dead-code elimination: g without the nodes that feed no result and no side effect (unused
/// ops, constants and variable reads), bodies of cond/while nodes included. Pure.
STAGECRAFT_COMPILED_INLINE Graph dce(const Graph& g);

/// g with its custom_gradient nodes gone (their results read as the values they wrap) and what
/// only they read dropped: what a plan runs (the rules matter to gradients, which are derived
/// from the graph before). g itself when it has none at its top level (bodies are planned alone).
STAGECRAFT_COMPILED_INLINE std::shared_ptr<const Graph> without_custom_gradients(std::shared_ptr<const Graph> g);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::vector<char> live_nodes(const Graph& g) {
  std::vector<char> used(g.values.size(), 0), live(g.nodes.size(), 0);
  for (int v : g.outputs) used[v] = 1;
  for (std::size_t i = g.nodes.size(); i-- > 0;) {
    const Node& n = g.nodes[i];
    bool l = n.kind == NodeKind::input || is_side_effect(n);
    for (int v : n.outputs) l = l || used[v];
    if (!l) continue;
    live[i] = 1;
    for (int v : n.inputs) used[v] = 1;
  }
  return live;
}

STAGECRAFT_COMPILED_INLINE Graph dce(const Graph& g) {
  return with_bodies(compact(g, live_nodes(g)), [](const Graph& b) { return dce(b); });
}

STAGECRAFT_COMPILED_INLINE std::shared_ptr<const Graph> without_custom_gradients(std::shared_ptr<const Graph> g) {
  std::vector<char> keep(g->nodes.size(), 1);
  std::vector<int> replace(g->values.size(), -1);
  bool any = false;
  for (std::size_t i = 0; i < g->nodes.size(); ++i) {
    const Node& n = g->nodes[i];
    if (n.kind != NodeKind::custom_gradient) continue;
    for (std::size_t k = 0; k < n.outputs.size(); ++k) replace[n.outputs[k]] = n.inputs[k];
    keep[i] = 0;
    any = true;
  }
  if (!any) return g;
  Graph stripped = compact(*g, keep, replace);
  return std::make_shared<const Graph>(compact(stripped, live_nodes(stripped)));
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
