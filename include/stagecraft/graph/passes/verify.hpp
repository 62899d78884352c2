// The IR verifier: checks a graph's structure (definitions before uses, node kinds' fields,
// bodies) and re-runs every op's shape/dtype inference on meta tensors; run between passes.
#pragma once
#include <cstdint>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

#include "../../core/error.hpp"
#include "../ir.hpp"
#include "../op_table.hpp"

namespace stagecraft::graph {

namespace detail_verify {

/// Where in a (possibly nested) graph the verifier is, for its messages.
struct Where {
  std::string_view pass;
  std::string path;  ///< "in body 0 of node 7 (cond): " for nested bodies
};

/// Throws "[verify] after <pass>: <path>node i (name): what at file:line".
[[noreturn]] STAGECRAFT_COMPILED_INLINE void fail(const Where& w, const Node* n, int index, const std::string& what);
#if STAGECRAFT_DEFINE_COMPILED
[[noreturn]] STAGECRAFT_COMPILED_INLINE void fail(const Where& w, const Node* n, int index, const std::string& what) {
  std::string msg = "after " + std::string(w.pass) + ": " + w.path;
  if (n != nullptr) msg += "node " + std::to_string(index) + " (" + std::string(n->name()) + "): ";
  msg += what;
  if (n != nullptr && n->loc.file != nullptr && n->loc.file[0] != '\0')
    detail::fail_at<Error>("verify", n->loc.file, n->loc.line, msg);
  throw Error("[verify] " + msg);
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// "f32[2, 3]".
inline std::string type_of(const Shape& s, DType d) { return std::string(name(d)) + s.str(); }

/// A tensor with the value's shape, dtype and device and no storage: what infer() reads. It
/// is marked symbolic (of a trace serial no trace has), so infer() skips its value checks
/// (gather's index range) as it does while tracing.
STAGECRAFT_COMPILED_INLINE Tensor meta_tensor(const Value& v, int id);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE Tensor meta_tensor(const Value& v, int id) {
  auto* impl = new detail::TensorImpl();
  impl->shape = v.shape;
  impl->dtype = v.dtype;
  impl->device = v.device;
  impl->symbolic = {~std::uint64_t{0}, id};
  return Tensor(detail::Ref<detail::TensorImpl>::adopt(impl));
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// Checks g (and, through check_kind, its bodies); w says where g is.
inline void verify_graph(const Graph& g, const Where& w);

/// Checks that values `vals` of g have the types of `other`'s values `wv` (body boundaries).
STAGECRAFT_COMPILED_INLINE void same_types(const Where& w, const Node& n, int i, const Graph& g,
                                           const std::vector<int>& vals, const Graph& other, const std::vector<int>& wv,
                                           const char* what);

/// A cond node: inputs[0] picks bodies[0] (run on the next attrs.i0 inputs) or bodies[1] (the rest).
STAGECRAFT_COMPILED_INLINE void check_cond(const Where& w, const Graph& g, const Node& n, int i);

/// A while node: inputs are num_loop_vars loop variables, attrs.i0 cond captures, then body captures.
STAGECRAFT_COMPILED_INLINE void check_while(const Where& w, const Graph& g, const Node& n, int i);

/// An op node: its arity, and infer() on meta tensors gives its output's shape and dtype.
STAGECRAFT_COMPILED_INLINE void check_op(const Where& w, const Graph& g, const Node& n, int i);

/// The fields each node kind needs (inputs and outputs already checked to be defined).
STAGECRAFT_COMPILED_INLINE void check_kind(const Where& w, const Graph& g, const Node& n, int i);
STAGECRAFT_COMPILED_INLINE void verify_graph(const Graph& g, const Where& w);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE void same_types(const Where& w, const Node& n, int i, const Graph& g,
                                           const std::vector<int>& vals, const Graph& other, const std::vector<int>& wv,
                                           const char* what) {
  if (vals.size() != wv.size())
    fail(w, &n, i, std::string(what) + ": " + std::to_string(vals.size()) + " values, the body has " +
                       std::to_string(wv.size()));
  for (std::size_t k = 0; k < vals.size(); ++k) {
    const Value& a = g.values[vals[k]];
    const Value& b = other.values[wv[k]];
    if (a.shape != b.shape || a.dtype != b.dtype)
      fail(w, &n, i, std::string(what) + " " + std::to_string(k) + " is " + type_of(a.shape, a.dtype) +
                         ", the body's is " + type_of(b.shape, b.dtype));
  }
}

STAGECRAFT_COMPILED_INLINE void check_cond(const Where& w, const Graph& g, const Node& n, int i) {
  if (n.inputs.empty()) fail(w, &n, i, "has no predicate input");
  if (g.values[n.inputs[0]].shape.numel() != 1) fail(w, &n, i, "its predicate has more than one element");
  const auto k = static_cast<std::size_t>(n.attrs.i0);
  if (n.attrs.i0 < 0 || k > n.inputs.size() - 1) fail(w, &n, i, "attrs.i0 (then-captures) is out of range");
  const std::vector<int> then_in(n.inputs.begin() + 1, n.inputs.begin() + 1 + static_cast<std::ptrdiff_t>(k));
  const std::vector<int> else_in(n.inputs.begin() + 1 + static_cast<std::ptrdiff_t>(k), n.inputs.end());
  same_types(w, n, i, g, then_in, *n.bodies[0], n.bodies[0]->inputs, "then-branch argument");
  same_types(w, n, i, g, else_in, *n.bodies[1], n.bodies[1]->inputs, "else-branch argument");
  same_types(w, n, i, g, n.outputs, *n.bodies[0], n.bodies[0]->outputs, "result (then)");
  same_types(w, n, i, g, n.outputs, *n.bodies[1], n.bodies[1]->outputs, "result (else)");
}

STAGECRAFT_COMPILED_INLINE void check_while(const Where& w, const Graph& g, const Node& n, int i) {
  const auto nv = static_cast<std::size_t>(n.num_loop_vars);
  if (n.num_loop_vars < 0 || nv > n.inputs.size()) fail(w, &n, i, "num_loop_vars is out of range");
  const auto k = static_cast<std::size_t>(n.attrs.i0);
  if (n.attrs.i0 < 0 || k > n.inputs.size() - nv) fail(w, &n, i, "attrs.i0 (cond captures) is out of range");
  const auto at = [&](std::size_t p) { return n.inputs.begin() + static_cast<std::ptrdiff_t>(p); };
  const std::vector<int> vars(at(0), at(nv));
  std::vector<int> cond_in = vars, body_in = vars;
  cond_in.insert(cond_in.end(), at(nv), at(nv + k));
  body_in.insert(body_in.end(), at(nv + k), n.inputs.end());
  same_types(w, n, i, g, cond_in, *n.bodies[0], n.bodies[0]->inputs, "cond argument");
  same_types(w, n, i, g, body_in, *n.bodies[1], n.bodies[1]->inputs, "body argument");
  if (n.bodies[0]->outputs.size() != 1 || n.bodies[0]->values[n.bodies[0]->outputs[0]].shape.numel() != 1)
    fail(w, &n, i, "its cond body must return one single-element value");
  same_types(w, n, i, g, vars, *n.bodies[1], n.bodies[1]->outputs, "loop variable (body result)");
  // Results: the final loop variables, then the iteration count (i64 scalar, read by gradients).
  if (n.outputs.size() != nv + 1) fail(w, &n, i, "must have num_loop_vars + 1 results (the last is the count)");
  const std::vector<int> finals(n.outputs.begin(), n.outputs.begin() + static_cast<std::ptrdiff_t>(nv));
  same_types(w, n, i, g, finals, *n.bodies[1], n.bodies[1]->outputs, "result");
  const Value& c = g.values[n.outputs.back()];
  if (c.dtype != DType::i64 || c.shape.rank() != 0) fail(w, &n, i, "its last result (the count) must be an i64 scalar");
}

STAGECRAFT_COMPILED_INLINE void check_op(const Where& w, const Graph& g, const Node& n, int i) {
  if (static_cast<int>(n.op) >= ops::num_ops) fail(w, &n, i, "has an unknown op id");
  const ops::OpInfo& info = ops::op_info(n.op);
  if (info.arity >= 0 && static_cast<int>(n.inputs.size()) != info.arity)
    fail(w, &n, i, "has " + std::to_string(n.inputs.size()) + " inputs, the op takes " + std::to_string(info.arity));
  if (n.outputs.size() != 1) fail(w, &n, i, "has " + std::to_string(n.outputs.size()) + " outputs, an op has 1");
  std::vector<Tensor> metas;
  metas.reserve(n.inputs.size());
  for (int v : n.inputs) metas.push_back(meta_tensor(g.values[v], v));
  ops::OutMeta m;
  try {
    m = fns(n.op).infer(metas, n.attrs, std::source_location::current());
  } catch (const Error& e) {
    fail(w, &n, i, std::string("its op rejects its inputs: ") + e.what());
  }
  const Value& out = g.values[n.outputs[0]];
  if (m.shape != out.shape || m.dtype != out.dtype)
    fail(w, &n, i, "%" + std::to_string(n.outputs[0]) + " is " + type_of(out.shape, out.dtype) + ", but the op gives " +
                       type_of(m.shape, m.dtype));
}

STAGECRAFT_COMPILED_INLINE void check_kind(const Where& w, const Graph& g, const Node& n, int i) {
  auto counts = [&](std::size_t ins, std::size_t outs) {
    if (n.inputs.size() != ins || n.outputs.size() != outs)
      fail(w, &n, i, "has " + std::to_string(n.inputs.size()) + " inputs and " + std::to_string(n.outputs.size()) +
                         " outputs, expected " + std::to_string(ins) + " and " + std::to_string(outs));
  };
  switch (n.kind) {
    case NodeKind::input: counts(0, 1); break;
    case NodeKind::constant: {
      counts(0, 1);
      const Value& v = g.values[n.outputs[0]];
      if (!n.constant.defined()) fail(w, &n, i, "has no tensor");
      if (n.constant.is_symbolic()) fail(w, &n, i, "holds a symbolic tensor");
      if (n.constant.shape() != v.shape || n.constant.dtype() != v.dtype)
        fail(w, &n, i, "holds a " + type_of(n.constant.shape(), n.constant.dtype()) + " tensor, but %" +
                           std::to_string(n.outputs[0]) + " is " + type_of(v.shape, v.dtype));
      break;
    }
    case NodeKind::read_var:
      counts(0, 1);
      if (!n.var) fail(w, &n, i, "has no variable");
      break;
    case NodeKind::assign_var:
      counts(1, 0);
      if (!n.var) fail(w, &n, i, "has no variable");
      break;
    case NodeKind::op: check_op(w, g, n, i); break;
    case NodeKind::host_fn: {
      if (!n.host) fail(w, &n, i, "has no host function");
      if (n.host->outputs.size() != n.outputs.size()) fail(w, &n, i, "output count differs from its specs");
      for (std::size_t k = 0; k < n.outputs.size(); ++k) {
        const Value& v = g.values[n.outputs[k]];
        if (v.shape != n.host->outputs[k].shape || v.dtype != n.host->outputs[k].dtype)
          fail(w, &n, i, "output " + std::to_string(k) + " is " + type_of(v.shape, v.dtype) + ", its spec says " +
                             type_of(n.host->outputs[k].shape, n.host->outputs[k].dtype));
      }
      break;
    }
    case NodeKind::custom_gradient: {
      if (!n.custom) fail(w, &n, i, "has no gradient rule");
      if (n.outputs.empty() || n.inputs.size() < n.outputs.size())
        fail(w, &n, i, "has " + std::to_string(n.inputs.size()) + " inputs for " + std::to_string(n.outputs.size()) +
                           " results (its first inputs are the results it gives)");
      for (std::size_t k = 0; k < n.outputs.size(); ++k) {
        const Value &v = g.values[n.outputs[k]], &y = g.values[n.inputs[k]];
        if (v.shape != y.shape || v.dtype != y.dtype || v.device != y.device)
          fail(w, &n, i, "output " + std::to_string(k) + " is " + type_of(v.shape, v.dtype) + ", the value it gives is " +
                             type_of(y.shape, y.dtype));
      }
      break;
    }
    case NodeKind::cond:
    case NodeKind::while_loop: {
      if (n.bodies.size() != 2 || !n.bodies[0] || !n.bodies[1]) fail(w, &n, i, "needs two bodies");
      if (n.kind == NodeKind::cond) check_cond(w, g, n, i);
      else check_while(w, g, n, i);
      for (std::size_t b = 0; b < 2; ++b) {
        Where inner{w.pass, w.path + "in body " + std::to_string(b) + " of node " + std::to_string(i) + " (" +
                                std::string(n.name()) + "): "};
        verify_graph(*n.bodies[b], inner);
      }
      break;
    }
    default: fail(w, &n, i, "has an unknown kind");
  }
}

STAGECRAFT_COMPILED_INLINE void verify_graph(const Graph& g, const Where& w) {
  const int nv = static_cast<int>(g.values.size());
  std::vector<char> defined(g.values.size(), 0);
  for (int v = 0; v < nv; ++v) {
    const int d = g.values[v].node;
    if (d < 0 || d >= static_cast<int>(g.nodes.size()))
      fail(w, nullptr, -1, "value %" + std::to_string(v) + " names node " + std::to_string(d) +
                               ", which does not exist");
  }
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    const Node& n = g.nodes[i];
    for (int v : n.inputs) {
      if (v < 0 || v >= nv) fail(w, &n, i, "reads %" + std::to_string(v) + ", which does not exist");
      if (!defined[v]) fail(w, &n, i, "reads %" + std::to_string(v) + " before it is defined");
    }
    for (int v : n.outputs) {
      if (v < 0 || v >= nv) fail(w, &n, i, "defines %" + std::to_string(v) + ", which does not exist");
      if (defined[v]) fail(w, &n, i, "defines %" + std::to_string(v) + " a second time");
      if (g.values[v].node != i)
        fail(w, &n, i, "defines %" + std::to_string(v) + ", which says node " + std::to_string(g.values[v].node) +
                           " defines it");
      defined[v] = 1;
    }
    check_kind(w, g, n, i);
  }
  for (int v = 0; v < nv; ++v)
    if (!defined[v]) fail(w, nullptr, -1, "value %" + std::to_string(v) + " is defined by no node");
  int num_inputs = 0;
  for (const Node& n : g.nodes) num_inputs += n.kind == NodeKind::input;
  if (num_inputs != static_cast<int>(g.inputs.size()))
    fail(w, nullptr, -1, std::to_string(num_inputs) + " input nodes, but the graph lists " +
                             std::to_string(g.inputs.size()) + " inputs");
  for (std::size_t k = 0; k < g.inputs.size(); ++k) {
    const int v = g.inputs[k];
    if (v < 0 || v >= nv)
      fail(w, nullptr, -1, "input " + std::to_string(k) + " is %" + std::to_string(v) + ", which does not exist");
    const Node& n = g.nodes[g.values[v].node];
    if (n.kind != NodeKind::input || n.index != static_cast<int>(k))
      fail(w, &n, g.values[v].node,
           "is the graph's input " + std::to_string(k) + " but is not input node " + std::to_string(k));
  }
  for (std::size_t k = 0; k < g.outputs.size(); ++k)
    if (g.outputs[k] < 0 || g.outputs[k] >= nv)
      fail(w, nullptr, -1,
           "result " + std::to_string(k) + " is %" + std::to_string(g.outputs[k]) + ", which does not exist");
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace detail_verify

/// Checks g (and its bodies, recursively): every value defined once, before its uses; inputs
/// are the input nodes by position; each node kind has its fields; each op node's output has
/// the shape and dtype its op infers. Throws sc::Error "[verify] after <pass>: node i (name):
/// what is wrong at file:line" (the node's user line).
STAGECRAFT_COMPILED_INLINE void verify(const Graph& g, std::string_view after_pass);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE void verify(const Graph& g, std::string_view after_pass) {
  detail_verify::verify_graph(g, detail_verify::Where{after_pass, {}});
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
