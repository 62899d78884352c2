// Replays a graph through dispatch, node by node: eagerly on concrete tensors, or into the
// current trace (how gradients of staged control flow and of concrete functions are staged).
#pragma once
#include <vector>

#include "ir.hpp"
#include "op_table.hpp"

namespace stagecraft::graph {

namespace detail_interp {
/// The node kinds interpret() hands to control_flow.hpp and host_fn.hpp (defined there).
std::vector<Tensor> replay_cond(const Node& n, const std::vector<Tensor>& ins);
std::vector<Tensor> replay_while(const Node& n, const std::vector<Tensor>& ins);
std::vector<Tensor> replay_host_fn(const Node& n, const std::vector<Tensor>& ins);
}  // namespace detail_interp

/// Runs g on args by calling each node's op (or the graph's own node kinds) through the public
/// API; returns the outputs. Variables are read as the graph says, and assigned unless
/// `side_effects` is false (a backward pass replaying a forward one).
STAGECRAFT_COMPILED_INLINE std::vector<Tensor> interpret(const Graph& g, const std::vector<Tensor>& args,
                                                         bool side_effects = true);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::vector<Tensor> interpret(const Graph& g, const std::vector<Tensor>& args,
                                                         bool side_effects) {
  std::vector<Tensor> vals(g.values.size());
  std::vector<Tensor> ins;
  for (const Node& n : g.nodes) {
    ins.clear();
    for (int v : n.inputs) ins.push_back(vals[v]);
    std::vector<Tensor> outs;
    switch (n.kind) {
      case NodeKind::input: outs = {args.at(static_cast<std::size_t>(n.index))}; break;
      case NodeKind::constant: outs = {n.constant}; break;
      case NodeKind::op: outs = {call_op(n.op, ins, n.attrs, n.loc)}; break;
      case NodeKind::read_var: outs = {Variable::from_state(n.var).value()}; break;
      case NodeKind::assign_var: {
        if (!side_effects) break;
        const stagecraft::detail::LocOverride at(n.loc);
        Variable::from_state(n.var).assign(ins[0]);
        break;
      }
      case NodeKind::cond: outs = detail_interp::replay_cond(n, ins); break;
      case NodeKind::while_loop: outs = detail_interp::replay_while(n, ins); break;
      case NodeKind::host_fn: outs = detail_interp::replay_host_fn(n, ins); break;
    }
    for (std::size_t k = 0; k < n.outputs.size() && k < outs.size(); ++k) vals[n.outputs[k]] = outs[k];
  }
  std::vector<Tensor> out;
  for (int v : g.outputs) out.push_back(vals[v]);
  return out;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
