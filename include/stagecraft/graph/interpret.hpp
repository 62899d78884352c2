// Replays a graph through dispatch, node by node: eagerly on concrete tensors, or into the
// current trace (how gradients of staged control flow and of concrete functions are staged).
#pragma once
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "../autodiff/custom.hpp"
#include "ir.hpp"
#include "op_table.hpp"

namespace stagecraft::graph {

/// The variables a replay without side effects assigns, with their values in the replay: its
/// reads of them see these values, its assignments replace them, and the variables themselves
/// are left alone (a backward pass that recomputes a forward one must not assign again).
///
/// A replay that must find the reads of a variable's final value (ConcreteFunction's variant for
/// a tape outside the call) also counts each variable's assignments (`counts`, i64 scalars) and,
/// once a first pass has counted them all (`last`), makes the value of the last one the final
/// value given (`finals`): the reads that follow it, in a loop's last round or a branch, are then
/// reads of that value, as they are in an eager run.
struct ReplayVars {
  std::vector<const stagecraft::detail::VariableInfo*> vars;
  std::vector<Tensor> values;
  std::vector<Tensor> counts;  ///< empty: not counted
  std::vector<Tensor> last;    ///< the counts at the end (empty: not known yet)
  std::vector<Tensor> finals;  ///< the values after the call (undefined: not asked for)
  Tensor* find(const stagecraft::detail::VariableInfo* v) {
    for (std::size_t k = 0; k < vars.size(); ++k)
      if (vars[k] == v) return &values[k];
    return nullptr;
  }
  /// What a replayed cond or while carries through as ordinary values: the values, then the counts.
  std::vector<Tensor> carried() const {
    std::vector<Tensor> c = values;
    c.insert(c.end(), counts.begin(), counts.end());
    return c;
  }
  std::size_t num_carried() const { return values.size() + counts.size(); }
  /// Takes the values and counts back from carried values starting at `from`.
  void take(std::vector<Tensor>::const_iterator from) {
    for (Tensor& v : values) v = *from++;
    for (Tensor& c : counts) c = *from++;
  }
};

/// attrs.i0 of the assign_var that gives a replay a variable's final value (see ReplayVars).
inline constexpr std::int64_t final_value_mark = 1;

namespace detail_interp {
/// The node kinds interpret() hands to control_flow.hpp and host_fn.hpp (defined there); rv is
/// null when the replay has side effects.
std::vector<Tensor> replay_cond(const Node& n, const std::vector<Tensor>& ins, ReplayVars* rv);
std::vector<Tensor> replay_while(const Node& n, const std::vector<Tensor>& ins, ReplayVars* rv);
std::vector<Tensor> replay_host_fn(const Node& n, const std::vector<Tensor>& ins);
/// An assignment of a replay without side effects (control_flow.hpp).
void replay_assign(const Node& n, const Tensor& value, ReplayVars& rv);
/// The variables g assigns (in it or in its bodies), each with its value now (control_flow.hpp).
ReplayVars replay_vars_of(const Graph& g);
/// replay_vars_of(g), counted and with the last counts found by a first replay on args where g
/// gives final values (control_flow.hpp).
ReplayVars replay_start(const Graph& g, const std::vector<Tensor>& args);
STAGECRAFT_COMPILED_INLINE std::vector<Tensor> run(const Graph& g, const std::vector<Tensor>& args, ReplayVars* rv);
}  // namespace detail_interp

/// Runs g on args by calling each node's op (or the graph's own node kinds) through the public
/// API; returns the outputs. Variables are read as the graph says, and assigned unless
/// `side_effects` is false (a backward pass replaying a forward one): then the replay starts
/// from the variables' current values and keeps what it assigns to itself (interpret_pure).
STAGECRAFT_COMPILED_INLINE std::vector<Tensor> interpret(const Graph& g, const std::vector<Tensor>& args,
                                                         bool side_effects = true);
/// Runs g without side effects from the variable values in rv, which must hold every variable g
/// assigns; rv ends with the values the replay assigned.
STAGECRAFT_COMPILED_INLINE std::vector<Tensor> interpret_pure(const Graph& g, const std::vector<Tensor>& args,
                                                              ReplayVars& rv);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::vector<Tensor> interpret(const Graph& g, const std::vector<Tensor>& args,
                                                         bool side_effects) {
  if (side_effects) return detail_interp::run(g, args, nullptr);
  ReplayVars rv = detail_interp::replay_start(g, args);
  return detail_interp::run(g, args, &rv);
}

STAGECRAFT_COMPILED_INLINE std::vector<Tensor> interpret_pure(const Graph& g, const std::vector<Tensor>& args,
                                                              ReplayVars& rv) {
  return detail_interp::run(g, args, &rv);
}

STAGECRAFT_COMPILED_INLINE std::vector<Tensor> detail_interp::run(const Graph& g, const std::vector<Tensor>& args,
                                                                  ReplayVars* rv) {
  std::vector<Tensor> vals(g.values.size());
  std::vector<Tensor> ins;
  // where a replay gives final values: each assignment's operand, with the value it left (a read
  // that follows it in the same graph is a stop_gradient of the operand, see GraphBuilder::assign)
  const bool finals = rv != nullptr && !rv->last.empty();
  std::vector<std::pair<int, Tensor>> assigned;
  for (const Node& n : g.nodes) {
    ins.clear();
    for (int v : n.inputs) ins.push_back(vals[v]);
    std::vector<Tensor> outs;
    switch (n.kind) {
      case NodeKind::input: outs = {args.at(static_cast<std::size_t>(n.index))}; break;
      case NodeKind::constant: outs = {n.constant}; break;
      case NodeKind::op:
        if (finals && n.op == ops::OpId::StopGradient && n.attrs.i0 > 0) {
          const auto it = std::find_if(assigned.rbegin(), assigned.rend(),
                                       [&](const auto& a) { return a.first == n.inputs[0]; });
          if (it != assigned.rend()) {
            outs = {it->second};
            break;
          }
        }
        outs = {call_op(n.op, ins, n.attrs, n.loc)};
        break;
      case NodeKind::read_var: {
        const Tensor* kept = rv != nullptr ? rv->find(n.var.get()) : nullptr;
        outs = {kept != nullptr ? *kept : Variable::from_state(n.var).value()};
        break;
      }
      case NodeKind::assign_var: {
        if (rv != nullptr) {
          detail_interp::replay_assign(n, ins[0], *rv);
          if (const Tensor* kept = finals ? rv->find(n.var.get()) : nullptr) assigned.emplace_back(n.inputs[0], *kept);
          break;
        }
        const stagecraft::detail::LocOverride at(n.loc);
        Variable::from_state(n.var).assign(ins[0]);
        break;
      }
      case NodeKind::cond: outs = detail_interp::replay_cond(n, ins, rv); break;
      case NodeKind::while_loop: outs = detail_interp::replay_while(n, ins, rv); break;
      case NodeKind::host_fn: outs = detail_interp::replay_host_fn(n, ins); break;
      case NodeKind::custom_gradient: {
        const stagecraft::detail::LocOverride at(n.loc);
        const auto m = static_cast<std::ptrdiff_t>(n.outputs.size());
        outs = stagecraft::detail::custom_results(n.custom, std::vector<Tensor>(ins.begin(), ins.begin() + m),
                                                  std::vector<Tensor>(ins.begin() + m, ins.end()),
                                                  std::source_location::current());
        break;
      }
    }
    for (std::size_t k = 0; k < n.outputs.size() && k < outs.size(); ++k) vals[n.outputs[k]] = outs[k];
  }
  std::vector<Tensor> out;
  for (int v : g.outputs) out.push_back(vals[v]);
  return out;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
