// Constant folding: op nodes whose inputs are all constants run now (eagerly, outside every
// trace) and become constant nodes, unless that would bake a large tensor into the graph.
#pragma once
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "../../core/device.hpp"
#include "../ir.hpp"
#include "../op_table.hpp"
#include "../trace.hpp"
#include "compact.hpp"

namespace stagecraft::graph {

/// No folded result is larger than this (elements): a bigger one would bloat the graph and
/// its saved form for a computation that is cheap to redo at run time.
inline constexpr std::int64_t fold_max_elements = std::int64_t{1} << 16;
/// Results up to this size are always folded; larger ones only when they are no bigger than
/// the op's inputs together (so fill, broadcast_to and random ops of large shapes stay ops:
/// a few bytes of attributes in the graph instead of a frozen buffer).
inline constexpr std::int64_t fold_small_elements = 64;

namespace detail_fold {

/// RAII: eager (no trace), unrecorded (no tape) and with no DeviceScope, so an op runs now
/// where its inputs are.
class EagerScope {
 public:
  EagerScope() : no_device_(std::nullopt) {}
  EagerScope(const EagerScope&) = delete;
  EagerScope& operator=(const EagerScope&) = delete;

 private:
  init_scope eager_;
  detail::DevicePin no_device_;
};

/// Bytes of a value's elements.
inline std::int64_t bytes_of(const Value& v) { return v.shape.numel() * static_cast<std::int64_t>(itemsize(v.dtype)); }

/// True when op node n of g reads only constants of its result's device and its result is small
/// enough to keep. On a GPU only results of up to fold_small_elements are folded (run once there
/// now: a tape's seed, a scalar computed from constants), each a launch less at every call. A
/// constant moved to another device (to) is always folded: the copy replaces it in the graph.
STAGECRAFT_COMPILED_INLINE bool foldable(const Graph& g, const Node& n);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE bool foldable(const Graph& g, const Node& n) {
  if (n.kind != NodeKind::op || n.outputs.size() != 1) return false;
  const Value& out = g.values[n.outputs[0]];
  const bool gpu = out.device.is_cuda();
  if (n.op == ops::OpId::ToDevice)  // a constant moved: copied once, not at every call, whatever its size
    return g.nodes[g.values[n.inputs[0]].node].kind == NodeKind::constant;
  if ((!out.device.is_cpu() && !gpu) || out.shape.numel() > (gpu ? fold_small_elements : fold_max_elements)) return false;
  std::int64_t in_bytes = 0;
  for (int v : n.inputs) {
    const Node& p = g.nodes[g.values[v].node];
    if (p.kind != NodeKind::constant || p.constant.device() != out.device) return false;
    in_bytes += bytes_of(g.values[v]);
  }
  return out.shape.numel() <= fold_small_elements || bytes_of(out) <= in_bytes;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace detail_fold

/// Constant folding, pure: every foldable op node (see fold_max_elements, fold_small_elements)
/// is run through graph::call_op now and becomes a constant node holding its result, with the
/// same value id and source line; nodes reading it see a constant and may fold in turn. The
/// constants it read are left for dce. A call that throws (say, an index out of range) is left
/// as an op, so the error is raised when the graph runs, at the user's line.
STAGECRAFT_COMPILED_INLINE Graph fold(const Graph& g);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE Graph fold(const Graph& g) {
  Graph r = g;
  {
    const detail_fold::EagerScope eager;
    std::vector<Tensor> args;
    for (Node& n : r.nodes) {
      if (!detail_fold::foldable(r, n)) continue;
      args.clear();
      for (int v : n.inputs) args.push_back(r.nodes[r.values[v].node].constant);
      Tensor t;
      try {
        // An op without inputs (fill) goes where its result lives; others run where their inputs are.
        std::optional<DeviceScope> on;
        if (const Device d = r.values[n.outputs[0]].device; d.is_cuda()) on.emplace(d);
        t = call_op(n.op, args, n.attrs, n.loc);
      } catch (const Error&) {
        continue;
      }
      const Value& out = r.values[n.outputs[0]];
      const bool fits = t.defined() && !t.is_symbolic() && t.shape() == out.shape && t.dtype() == out.dtype &&
                        t.device() == out.device;
      if (!fits) continue;
      n.kind = NodeKind::constant;
      n.constant = std::move(t);
      n.inputs.clear();
      n.op = {};
      n.attrs = {};
    }
  }
  return with_bodies(std::move(r), [](const Graph& b) { return fold(b); });
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
