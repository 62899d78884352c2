// Dead-code elimination: drops nodes whose values reach neither a result nor a side effect.
#pragma once
#include <vector>

#include "../ir.hpp"
#include "compact.hpp"

namespace stagecraft::graph {

/// Which nodes of g are live: side effects (assign_var, host_fn, cond, while: kept whole,
/// conservatively), input nodes (the arguments), and every node whose value (transitively)
/// feeds a result or a live node. One backward sweep suffices: nodes are in program order.
STAGECRAFT_COMPILED_INLINE std::vector<char> live_nodes(const Graph& g);

/// Dead-code elimination: g without the nodes that feed no result and no side effect (unused
/// ops, constants and variable reads), bodies of cond/while nodes included. Pure.
STAGECRAFT_COMPILED_INLINE Graph dce(const Graph& g);
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
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
