// The graph IR: values with shape/dtype/device, nodes in program order with the user's line,
// a stable text form, DOT output and statistics. Passes are functions Graph -> Graph (passes/).
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "../autodiff/record.hpp"
#include "../core/tensor.hpp"
#include "../ops/op.hpp"
#include "../ops/registry.hpp"
#include "../state/variable.hpp"

namespace stagecraft {

/// Describes a tensor without data: a host_fn output, or a function argument.
struct TensorSpec {
  Shape shape;
  DType dtype = DType::f32;
  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;
};

namespace graph {

using stagecraft::detail::SrcLoc;

/// What a node does. `op` nodes run an op of the op list; the others are the graph's own.
enum class NodeKind : std::uint8_t {
  input,       ///< an argument of the function (index: its position)
  constant,    ///< an eager tensor captured by the trace (constant)
  op,          ///< one op call (op, attrs)
  read_var,    ///< reads a variable's value when the plan runs (var)
  assign_var,  ///< var = inputs[0], in program order (no outputs)
  cond,        ///< inputs[0] (a bool scalar) picks bodies[0] or bodies[1], run on inputs[1..]
  while_loop,  ///< while bodies[0](vars) run vars = bodies[1](vars); inputs: initial vars, captures
  host_fn,     ///< arbitrary C++ (host) on the inputs, outputs checked against host->outputs
  custom_gradient,  ///< outputs[k] = inputs[k] (the results), differentiated by `custom` with
                    ///< respect to the other inputs (sc::custom_gradient); plans drop it
};

/// The printed name of a node kind.
STAGECRAFT_COMPILED_INLINE const char* kind_name(NodeKind k);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE const char* kind_name(NodeKind k) {
  switch (k) {
    case NodeKind::input: return "input";
    case NodeKind::constant: return "const";
    case NodeKind::op: return "op";
    case NodeKind::read_var: return "read_var";
    case NodeKind::assign_var: return "assign_var";
    case NodeKind::cond: return "cond";
    case NodeKind::while_loop: return "while";
    case NodeKind::host_fn: return "host_fn";
    case NodeKind::custom_gradient: return "custom_gradient";
  }
  return "?";
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// A value of the graph: the output of one node.
struct Value {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
  int node = -1;  ///< the node that produces it
};

/// A host function inside a graph (sc::host_fn): the callable, an optional gradient and the
/// outputs it promises.
struct HostFn {
  using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
  /// (inputs, outputs, output gradients) -> input gradients (undefined: none).
  using Grad = std::function<std::vector<Tensor>(const std::vector<Tensor>&, const std::vector<Tensor>&,
                                                 const std::vector<Tensor>&)>;
  Fn fn;
  Grad grad;
  std::vector<TensorSpec> outputs;
  /// fn only computes its outputs (a gradient rule's host code): dead-code elimination drops the
  /// node when nothing uses them. A user's host_fn may act on the world, so it is kept.
  bool pure = false;

  /// Runs fn on concrete tensors and checks what it returned. fn is opaque to the tapes around
  /// it, eager or in a plan (its gradient is `grad`; tapes it makes itself record as usual), and
  /// a result that is one of its inputs gets an identity of its own.
  std::vector<Tensor> run(const std::vector<Tensor>& args, const SrcLoc& at,
                          const std::source_location& copy_loc = std::source_location::current()) const {
    std::vector<Tensor> res;
    {
      const stagecraft::detail::TapeIsolation opaque;
      res = fn(args);
    }
    check_outputs(res, at, copy_loc);
    for (Tensor& r : res)
      if (std::any_of(args.begin(), args.end(), [&](const Tensor& a) { return a.same(r); }))
        r = stagecraft::detail::alias_tensor(r, r.shape());
    return res;
  }
  /// Checks what fn returned against `outputs` (a ValueError naming the user's line `at`) and
  /// moves an output it made on another device to the CPU, where host_fn's outputs live (a failed
  /// copy names `copy_loc`).
  void check_outputs(std::vector<Tensor>& res, const SrcLoc& at,
                     const std::source_location& copy_loc = std::source_location::current()) const {
    if (res.size() != outputs.size())
      stagecraft::detail::fail_at<ValueError>("host_fn", at.file, at.line, "the function returned ", res.size(),
                                              " tensors, its output specs promise ", outputs.size());
    for (std::size_t k = 0; k < res.size(); ++k) {
      const TensorSpec& spec = outputs[k];
      if (!res[k].defined() || res[k].is_symbolic() || res[k].shape() != spec.shape || res[k].dtype() != spec.dtype)
        stagecraft::detail::fail_at<ValueError>(
            "host_fn", at.file, at.line, "output ", k, " is ",
            res[k].defined() ? std::string(name(res[k].dtype())) + res[k].shape().str() : std::string("undefined"),
            ", its spec says ", name(spec.dtype), spec.shape);
      if (!res[k].device().is_cpu())
        res[k] = stagecraft::detail::device_copy(res[k], Device::cpu(), "host_fn", copy_loc);
    }
  }
};

struct Graph;

/// One node: what it does, which values it reads and defines, and the user's line.
struct Node {
  NodeKind kind = NodeKind::op;
  ops::OpId op{};
  std::vector<int> inputs;
  std::vector<int> outputs;
  ops::Attrs attrs;
  SrcLoc loc;
  int index = 0;                                     ///< input: argument position
  Tensor constant;                                   ///< constant: the value
  std::shared_ptr<stagecraft::detail::VariableState> var;        ///< read_var, assign_var
  std::vector<std::shared_ptr<const Graph>> bodies;  ///< cond: then, else; while_loop: cond, body
  std::shared_ptr<const HostFn> host;                ///< host_fn
  std::shared_ptr<const stagecraft::detail::CustomRule> custom;  ///< custom_gradient
  int num_loop_vars = 0;                             ///< while_loop: inputs[0..n) are loop variables

  /// The printed name: the op's name, or the kind's.
  std::string_view name() const { return kind == NodeKind::op ? ops::op_info(op).name : kind_name(kind); }
};

/// A dataflow graph: values, nodes in program order (a topological order in which side effects
/// keep their order), the argument values and the results.
struct Graph {
  std::vector<Value> values;
  std::vector<Node> nodes;
  std::vector<int> inputs;   ///< values of the input nodes, by argument position
  std::vector<int> outputs;  ///< values returned, in order
  std::string name = "f";
  /// Strings that loaded graphs' source lines point into (in-process graphs need none).
  std::shared_ptr<std::vector<std::unique_ptr<std::string>>> strings;

  /// Appends a node and one value per output meta; returns the node's index.
  int add_node(Node n, const std::vector<TensorSpec>& outs, Device dev = Device::cpu()) {
    const int id = static_cast<int>(nodes.size());
    for (const TensorSpec& o : outs) {
      n.outputs.push_back(static_cast<int>(values.size()));
      values.push_back(Value{o.shape, o.dtype, dev, id});
    }
    nodes.push_back(std::move(n));
    return id;
  }
  /// The one output of node i.
  int out(int node) const { return nodes[node].outputs.at(0); }
  /// Number of op nodes (not inputs or constants): what the stats count as "nodes".
  int num_compute_nodes() const {
    int n = 0;
    for (const Node& x : nodes) n += x.kind != NodeKind::input && x.kind != NodeKind::constant;
    return n;
  }
  /// Bytes of every value produced by a compute node (the memory plan's "no reuse" figure).
  std::int64_t intermediate_bytes() const {
    std::int64_t b = 0;
    for (const Node& x : nodes)
      if (x.kind != NodeKind::input && x.kind != NodeKind::constant)
        for (int v : x.outputs) b += values[v].shape.numel() * static_cast<std::int64_t>(itemsize(values[v].dtype));
    return b;
  }

  /// The stable text form (see print_graph).
  std::string str() const;
  /// Graphviz DOT: one box per node with its line, edges labelled with shapes.
  std::string to_dot() const;
};

namespace detail_ir {

STAGECRAFT_COMPILED_INLINE std::string attr_text(const ops::Attrs& a);
STAGECRAFT_COMPILED_INLINE std::string type_text(const Value& v);
STAGECRAFT_COMPILED_INLINE std::string loc_text(const SrcLoc& l);
STAGECRAFT_COMPILED_INLINE std::string constant_text(const Tensor& t);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::string attr_text(const ops::Attrs& a) {
  // Generic: every field that differs from its default (transformations never name ops).
  const ops::Attrs d{};
  std::ostringstream os;
  const char* sep = "";
  auto field = [&](const char* k, const auto& v) {
    os << sep << k << "=" << v;
    sep = ", ";
  };
  if (a.ints != d.ints) field("ints", a.ints);
  if (a.ints2 != d.ints2) field("ints2", a.ints2);
  if (a.axis != d.axis) field("axis", a.axis);
  if (a.i0 != d.i0) field("i0", a.i0);
  if (a.i1 != d.i1) field("i1", a.i1);
  if (a.i2 != d.i2) field("i2", a.i2);
  if (a.scalar != d.scalar) {
    std::ostringstream v;
    v.precision(17);
    v << a.scalar;
    field("scalar", v.str());
  }
  if (a.scalar2 != d.scalar2) {
    std::ostringstream v;
    v.precision(17);
    v << a.scalar2;
    field("scalar2", v.str());
  }
  if (a.dtype != d.dtype) field("dtype", name(a.dtype));
  if (a.flag != d.flag) field("flag", a.flag ? "true" : "false");
  return os.str();
}

STAGECRAFT_COMPILED_INLINE std::string type_text(const Value& v) {
  std::string t = std::string(name(v.dtype)) + v.shape.str();
  // appended, not "@" + str(): GCC 12 at -O3 warns falsely (-Wrestrict) inside that operator+
  if (!v.device.is_cpu()) t.append("@").append(v.device.str());
  return t;
}

STAGECRAFT_COMPILED_INLINE std::string loc_text(const SrcLoc& l) {
  std::string_view f = l.file;
  if (auto p = f.find_last_of("/\\"); p != std::string_view::npos) f.remove_prefix(p + 1);
  if (f.empty()) return {};
  return std::string(f) + ":" + std::to_string(l.line);
}

STAGECRAFT_COMPILED_INLINE std::string constant_text(const Tensor& t) {
  if (!t.device().is_cpu())  // its value is not read back (a wait) to print a graph
    return "<" + std::to_string(t.numel()) + (t.numel() == 1 ? " value on " : " values on ") + t.device().str() + ">";
  if (t.numel() != 1) return "<" + std::to_string(t.numel()) + " values>";
  std::ostringstream os;
  os.precision(9);
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T x = *static_cast<const T*>(t.raw_data());
    if constexpr (sizeof(T) == 1 && std::is_integral_v<T>) os << static_cast<int>(x);
    else os << x;
  });
  return os.str();
}
#endif  // STAGECRAFT_DEFINE_COMPILED

inline void print_graph(std::ostream& os, const Graph& g, const std::string& indent);

STAGECRAFT_COMPILED_INLINE void print_node(std::ostream& os, const Graph& g, const Node& n, const std::string& indent);
STAGECRAFT_COMPILED_INLINE void print_graph(std::ostream& os, const Graph& g, const std::string& indent);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE void print_node(std::ostream& os, const Graph& g, const Node& n, const std::string& indent) {
  std::ostringstream line;
  line << indent;
  for (std::size_t i = 0; i < n.outputs.size(); ++i) line << (i ? ", " : "") << "%" << n.outputs[i];
  if (!n.outputs.empty()) line << " = ";
  line << n.name();
  if (n.kind == NodeKind::input) line << " " << n.index;
  if (n.kind == NodeKind::constant) line << " " << constant_text(n.constant);
  if (n.var) line << " \"" << n.var->name << "\"";
  if (!n.inputs.empty()) {
    line << "(";
    for (std::size_t i = 0; i < n.inputs.size(); ++i) line << (i ? ", " : "") << "%" << n.inputs[i];
    line << ")";
  }
  if (n.kind == NodeKind::op) {
    const std::string at = attr_text(n.attrs);
    if (!at.empty()) line << " {" << at << "}";
  }
  if (!n.outputs.empty()) {
    line << " : ";
    for (std::size_t i = 0; i < n.outputs.size(); ++i) line << (i ? ", " : "") << type_text(g.values[n.outputs[i]]);
  }
  std::string s = line.str();
  const std::string at = loc_text(n.loc);
  if (!at.empty()) {
    if (s.size() < 60) s.resize(60, ' ');
    s += "  # " + at;
  }
  os << s << "\n";
  for (std::size_t b = 0; b < n.bodies.size(); ++b) print_graph(os, *n.bodies[b], indent + "    ");
}

STAGECRAFT_COMPILED_INLINE void print_graph(std::ostream& os, const Graph& g, const std::string& indent) {
  os << indent << "graph " << g.name << "(";
  for (std::size_t i = 0; i < g.inputs.size(); ++i)
    os << (i ? ", " : "") << "%" << g.inputs[i] << ": " << type_text(g.values[g.inputs[i]]);
  os << ") {\n";
  for (const Node& n : g.nodes)
    if (n.kind != NodeKind::input) print_node(os, g, n, indent + "  ");
  os << indent << "  return ";
  for (std::size_t i = 0; i < g.outputs.size(); ++i) os << (i ? ", " : "") << "%" << g.outputs[i];
  os << "\n" << indent << "}\n";
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace detail_ir

#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::string Graph::str() const {
  std::ostringstream os;
  detail_ir::print_graph(os, *this, "");
  return os.str();
}
#endif  // STAGECRAFT_DEFINE_COMPILED

inline std::ostream& operator<<(std::ostream& os, const Graph& g) { return os << g.str(); }

#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::string Graph::to_dot() const {
  std::ostringstream os;
  os << "digraph \"" << name << "\" {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n";
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    std::string label(n.name());
    if (n.var) label += " " + n.var->name;
    if (n.kind == NodeKind::op) {
      const std::string at = detail_ir::attr_text(n.attrs);
      if (!at.empty()) label += "\\n{" + at + "}";
    }
    const std::string at = detail_ir::loc_text(n.loc);
    if (!at.empty()) label += "\\n" + at;
    std::string esc;
    for (char c : label) esc += c == '"' ? std::string("\\\"") : std::string(1, c);
    os << "  n" << i << " [label=\"" << esc << "\"" << (n.kind == NodeKind::input ? ", shape=ellipse" : "") << "];\n";
  }
  for (std::size_t i = 0; i < nodes.size(); ++i)
    for (int v : nodes[i].inputs)
      os << "  n" << values[v].node << " -> n" << i << " [label=\"" << detail_ir::type_text(values[v]) << "\"];\n";
  for (int v : outputs) os << "  n" << values[v].node << " -> out [style=dashed];\n";
  os << "  out [shape=doublecircle, label=\"return\"];\n}\n";
  return os.str();
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace graph
}  // namespace stagecraft
