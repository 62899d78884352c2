// Tracing: GraphBuilder (the TraceState dispatch appends to) and TraceScope, its RAII guard;
// sc::init_scope, which runs its body eagerly, outside every trace.
#pragma once
#include <atomic>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "../autodiff/record.hpp"
#include "ir.hpp"

namespace stagecraft {
namespace graph {

/// A new trace serial (never 0, never reused).
STAGECRAFT_COMPILED_INLINE std::uint64_t next_trace_serial();
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::uint64_t next_trace_serial() {
  static std::atomic<std::uint64_t> n{0};
  return ++n;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// Builds a Graph from the op calls made while it is the thread's innermost trace.
class GraphBuilder final : public stagecraft::detail::TraceState {
 public:
  explicit GraphBuilder(std::string name = "f", bool may_create_vars = true) : may_create_vars_(may_create_vars) {
    graph.name = std::move(name);
    serial = next_trace_serial();
  }

  Graph graph;

  /// Declares the next argument; returns its symbolic tensor.
  Tensor add_input(const TensorSpec& spec, Device dev, const SrcLoc& loc = {}) {
    Node n;
    n.kind = NodeKind::input;
    n.index = static_cast<int>(graph.inputs.size());
    n.loc = loc;
    const int id = graph.add_node(std::move(n), {spec}, dev);
    graph.inputs.push_back(graph.out(id));
    return handle(graph.out(id));
  }

  /// The value a lifted tensor stands for in this graph.
  int value_of(const Tensor& t) const { return t.impl()->symbolic.id; }

  /// The canonical symbolic tensor of value v.
  Tensor handle(int v) {
    if (static_cast<int>(handles_.size()) <= v) handles_.resize(v + 1);
    if (!handles_[v].defined()) handles_[v] = make_symbolic(v);
    return handles_[v];
  }

  /// Marks the results: each is lifted into the graph (a constant or a variable read is fine).
  void set_outputs(const std::vector<Tensor>& outs, const std::source_location& loc) {
    std::vector<Tensor> lifted;
    lift(outs, lifted, loc);
    graph.outputs.clear();
    for (const Tensor& t : lifted) graph.outputs.push_back(recorded_value(value_of(t), here(loc)));
  }

  // ---- TraceState ---------------------------------------------------------------------

  void lift(std::span<const Tensor> in, std::vector<Tensor>& out, const std::source_location& loc) override {
    out.clear();
    out.reserve(in.size());
    for (const Tensor& t : in) out.push_back(lift_one(t, loc));
  }

  Tensor append(ops::OpId op, std::span<const Tensor> lifted, const ops::Attrs& attrs, const ops::OutMeta& meta,
                Device dev, const std::source_location& loc) override {
    Node n;
    n.kind = NodeKind::op;
    n.op = op;
    n.attrs = attrs;
    n.loc = here(loc);
    for (const Tensor& t : lifted) n.inputs.push_back(recorded_value(value_of(t), n.loc));
    const int id = graph.add_node(std::move(n), {TensorSpec{meta.shape, meta.dtype}}, dev);
    mark_if_paused(id);
    return handle(graph.out(id));
  }

  Tensor read(const stagecraft::detail::VariableInfo* var, const std::source_location& loc) override {
    // a body reads through its parent, until a cond or while in it assigned the variable
    if (parent != nullptr && !changed_here_.count(var)) return capture(parent->read(var, loc), loc);
    return read_of(state_of(var), loc);
  }

  std::string origin(int id) const override {
    if (id < 0 || id >= static_cast<int>(graph.values.size()) || graph.values[id].node < 0) return {};
    const Node& n = graph.nodes[graph.values[id].node];
    std::string s = "`" + std::string(n.name()) + "`";
    if (const std::string at = detail_ir::loc_text(n.loc); !at.empty()) s.append(" at ").append(at);
    return s;
  }

  const Tensor* shadow(const stagecraft::detail::VariableInfo* var) override {
    auto it = vars_.find(var);
    if (it != vars_.end()) return &it->second.shadow;
    return parent != nullptr && !changed_here_.count(var) ? parent->shadow(var) : nullptr;
  }

  std::vector<Tensor> custom_gradient(const std::shared_ptr<const stagecraft::detail::CustomRule>& rule,
                                      std::span<const Tensor> ys, std::span<const Tensor> xs,
                                      const std::source_location& loc) override {
    std::vector<Tensor> all(ys.begin(), ys.end()), lifted;
    all.insert(all.end(), xs.begin(), xs.end());
    lift(all, lifted, loc);
    Node n;
    n.kind = NodeKind::custom_gradient;
    n.custom = rule;
    std::vector<TensorSpec> specs;
    std::vector<Device> devs;
    for (std::size_t k = 0; k < lifted.size(); ++k) {
      const int v = value_of(lifted[k]);
      n.inputs.push_back(v);
      if (k < ys.size()) specs.push_back({graph.values[v].shape, graph.values[v].dtype}), devs.push_back(graph.values[v].device);
    }
    return append_node(std::move(n), specs, devs, loc);
  }

  /// Appends a node of the graph's own kinds (cond, while, host_fn) on lifted inputs; returns
  /// its outputs as symbolic tensors.
  std::vector<Tensor> append_node(Node n, const std::vector<TensorSpec>& outs, Device dev,
                                  const std::source_location& loc) {
    return append_node(std::move(n), outs, std::vector<Device>(outs.size(), dev), loc);
  }
  /// The same with output k on devs[k].
  std::vector<Tensor> append_node(Node n, const std::vector<TensorSpec>& outs, const std::vector<Device>& devs,
                                  const std::source_location& loc) {
    n.loc = here(loc);
    // (a custom_gradient call is not differentiated through the results it wraps)
    const std::size_t wrapped = n.kind == NodeKind::custom_gradient ? outs.size() : 0;
    for (std::size_t k = wrapped; k < n.inputs.size(); ++k) n.inputs[k] = recorded_value(n.inputs[k], n.loc);
    const int id = graph.add_node(std::move(n), outs);
    mark_if_paused(id);
    std::vector<Tensor> r;
    for (std::size_t k = 0; k < outs.size(); ++k) {
      const int v = graph.nodes[id].outputs[k];
      graph.values[v].device = devs[k];
      r.push_back(handle(v));
    }
    return r;
  }

  void assign(const stagecraft::detail::VariableInfo* var, const Tensor& value, const std::source_location& loc) override {
    if (value.is_symbolic() && !owns(value.impl()->symbolic))
      stagecraft::detail::fail<StagingError>("Variable::assign", loc, "variable '", var->name, "' is assigned a symbolic tensor "
                                 "from a trace that has finished (it escaped its sc::function)");
    auto state = state_of(var);
    read_of(state, loc);  // a handle read before the assignment keeps reading the old value
    const Tensor v = lift_one(value, loc);
    Node n;
    n.kind = NodeKind::assign_var;
    n.var = state;
    n.inputs = {value_of(v)};
    n.loc = here(loc);
    const int assign_node = graph.add_node(std::move(n), {});
    // What value() gives from now on: the value as a stop_gradient (an eager assignment stores it
    // under a fresh identity that no tape recorded, so no gradient flows from a later read back
    // into the expression that computed it), under an identity that knows its variable. Its i0
    // names the assignment (node index + 1), so a tape outside the call can find the reads of
    // the variable's final value (ConcreteFunction::variable_inputs).
    Node r;
    r.kind = NodeKind::op;
    r.op = ops::OpId::StopGradient;
    r.inputs = {value_of(v)};
    r.attrs.i0 = assign_node + 1;
    r.loc = here(loc);
    const int read = graph.add_node(std::move(r), {TensorSpec{v.shape(), v.dtype()}}, v.device());
    Tensor s = stagecraft::detail::alias_tensor(handle(graph.out(read)), v.shape());
    s.impl()->variable = state.get();
    vars_[var].shadow = std::move(s);
    assigned_.push_back(state);
  }

  bool may_create_variables() const override { return may_create_vars_; }

  /// Variables assigned in this trace (an enclosing trace re-reads them after a cond/while).
  const std::vector<std::shared_ptr<stagecraft::detail::VariableState>>& assigned() const { return assigned_; }
  /// Forgets what this trace knows of a variable's value (it changed in a nested body): the next
  /// read is a read_var here (what an enclosing trace knows is older still).
  void forget(const stagecraft::detail::VariableInfo* var) {
    vars_.erase(var);
    changed_here_.insert(var);
  }

  /// Values of enclosing traces used here, in order of first use: `captured_outer[k]` (the
  /// outer tensor) is this graph's input `captured_inputs[k]`.
  std::vector<Tensor> captured_outer;
  std::vector<int> captured_inputs;

 private:
  SrcLoc here(const std::source_location& loc) const {
    const stagecraft::detail::Context& ctx = stagecraft::detail::context();
    return ctx.loc_override ? *ctx.loc_override : SrcLoc::from(loc);
  }

  Tensor make_symbolic(int v) const {
    auto* impl = new stagecraft::detail::TensorImpl();
    impl->shape = graph.values[v].shape;
    impl->dtype = graph.values[v].dtype;
    impl->device = graph.values[v].device;
    impl->symbolic = {serial, v};
    return Tensor(stagecraft::detail::Ref<stagecraft::detail::TensorImpl>::adopt(impl));
  }

  // ---- values made while the tapes were paused (GradientTape::StopRecording) ------------------
  // Eagerly they carry no gradient (no tape recorded the ops that made them); a use of one after
  // the pause reads it through a stop_gradient, so that gradients derived from the graph (a staged
  // function's, a cond's) agree. Only float values: the others carry no gradient anyway.

  static bool paused() { return stagecraft::detail::context().no_record > 0; }
  void mark_if_paused(int node) {
    if (!paused()) return;
    for (int v : graph.nodes[static_cast<std::size_t>(node)].outputs) {
      if (!is_floating(graph.values[static_cast<std::size_t>(v)].dtype)) continue;
      if (unrecorded_.size() <= static_cast<std::size_t>(v)) unrecorded_.resize(static_cast<std::size_t>(v) + 1, 0);
      unrecorded_[static_cast<std::size_t>(v)] = 1;
    }
  }
  /// v, or where v was made during a pause that has ended, stop_gradient(v) (one per value).
  int recorded_value(int v, const SrcLoc& loc) {
    if (static_cast<std::size_t>(v) >= unrecorded_.size() || !unrecorded_[static_cast<std::size_t>(v)] || paused()) return v;
    auto [it, fresh] = stopped_.try_emplace(v, -1);
    if (fresh) {
      Node s;
      s.kind = NodeKind::op;
      s.op = ops::OpId::StopGradient;
      s.inputs = {v};
      s.loc = loc;
      const Value& x = graph.values[static_cast<std::size_t>(v)];
      const int id = graph.add_node(std::move(s), {TensorSpec{x.shape, x.dtype}}, x.device);
      it->second = graph.out(id);
    }
    return it->second;
  }

  static std::shared_ptr<stagecraft::detail::VariableState> state_of(const stagecraft::detail::VariableInfo* var) {
    auto* mutable_var = const_cast<stagecraft::detail::VariableInfo*>(var);
    return std::static_pointer_cast<stagecraft::detail::VariableState>(mutable_var->shared_from_this());
  }

  /// The read of a variable's value at its first use in this trace.
  Tensor read_of(const std::shared_ptr<stagecraft::detail::VariableState>& state, const std::source_location& loc) {
    VarEntry& e = vars_[state.get()];
    if (e.read.defined()) return e.read;
    Node n;
    n.kind = NodeKind::read_var;
    n.var = state;
    n.loc = here(loc);
    const Tensor cur = state->get();
    const int id = graph.add_node(std::move(n), {TensorSpec{cur.shape(), cur.dtype()}}, cur.device());
    Tensor r = stagecraft::detail::alias_tensor(handle(graph.out(id)), cur.shape());
    r.impl()->variable = state.get();  // tapes watch it as they watch the variable
    e.read = r;
    if (!e.shadow.defined()) e.shadow = r;
    return r;
  }

  /// A variable read made where the caller's line is unknown (a Variable converted to a Tensor)
  /// takes the line of the first op that uses it, in whichever enclosing trace it was made.
  void locate_read(const Tensor& t, const std::source_location& loc) {
    const stagecraft::detail::TensorImpl* p = t.impl();
    if (p->variable == nullptr) return;
    if (p->symbolic.trace != serial) {
      if (parent != nullptr) static_cast<GraphBuilder*>(parent)->locate_read(t, loc);  // the only TraceState
      return;
    }
    Node& n = graph.nodes[static_cast<std::size_t>(graph.values[static_cast<std::size_t>(p->symbolic.id)].node)];
    if (n.kind == NodeKind::read_var && n.loc.line == 0) n.loc = here(loc);
  }

  Tensor lift_one(const Tensor& t, const std::source_location& loc) {
    stagecraft::detail::TensorImpl* p = t.impl();
    if (p->variable != nullptr && p->symbolic.trace != 0) locate_read(t, loc);
    if (p->symbolic.trace == serial) return t;
    if (p->symbolic.trace != 0) return capture(t, loc);
    // A concrete tensor here, even a variable's value, is a constant: inside a trace,
    // Variable::value() gives a read of the graph, so this value was taken before the trace
    // (`Tensor snapshot = w;`) and keeps the value it had then, as it does eagerly.
    auto it = constants_.find(p);
    if (it != constants_.end()) return it->second;
    Node n;
    n.kind = NodeKind::constant;
    n.constant = t;
    n.loc = here(loc);
    const int id = graph.add_node(std::move(n), {TensorSpec{t.shape(), t.dtype()}}, t.device());
    Tensor c = handle(graph.out(id));
    constants_.emplace(p, c);
    return c;
  }

  /// A value of an enclosing trace: becomes an extra input of this graph.
  Tensor capture(const Tensor& outer, const std::source_location& loc) {
    if (!owns(outer.impl()->symbolic))
      stagecraft::detail::fail<StagingError>("trace", loc, "a symbolic tensor from a finished trace was used (it escaped its "
                                 "sc::function); return it from the function instead of storing it");
    const std::uint64_t key = (outer.impl()->symbolic.trace << 32) ^ static_cast<std::uint64_t>(outer.impl()->symbolic.id);
    if (auto it = captures_.find(key); it != captures_.end()) return it->second;
    Node n;
    n.kind = NodeKind::input;
    n.index = static_cast<int>(graph.inputs.size());
    n.loc = here(loc);
    const int id = graph.add_node(std::move(n), {TensorSpec{outer.shape(), outer.dtype()}}, outer.device());
    graph.inputs.push_back(graph.out(id));
    captured_outer.push_back(outer);
    captured_inputs.push_back(graph.out(id));
    Tensor h = handle(graph.out(id));
    if (outer.impl()->variable != nullptr) {
      // still the variable's value: a loop nested in this body that assigns the variable reads
      // it afresh at each round (read_assigned_in_place finds it by this)
      h = stagecraft::detail::alias_tensor(h, outer.shape());
      h.impl()->variable = outer.impl()->variable;
    }
    captures_.emplace(key, h);
    return h;
  }

  struct VarEntry {
    Tensor read;    ///< the read_var value (first read)
    Tensor shadow;  ///< what value() returns now
  };
  bool may_create_vars_;
  std::vector<Tensor> handles_;
  std::unordered_map<const stagecraft::detail::TensorImpl*, Tensor> constants_;
  std::unordered_map<const stagecraft::detail::VariableInfo*, VarEntry> vars_;
  std::unordered_set<const stagecraft::detail::VariableInfo*> changed_here_;  ///< by a nested body
  std::unordered_map<std::uint64_t, Tensor> captures_;
  std::vector<std::shared_ptr<stagecraft::detail::VariableState>> assigned_;
  std::vector<char> unrecorded_;                 ///< by value: made while the tapes were paused
  std::unordered_map<int, int> stopped_;          ///< value -> its stop_gradient
};

using stagecraft::detail::TapeIsolation;

/// The thread's innermost trace as a GraphBuilder (null outside every trace).
inline GraphBuilder* current_builder() { return static_cast<GraphBuilder*>(stagecraft::detail::context().trace); }

/// RAII: makes a builder the thread's innermost trace for the guard's lifetime.
class TraceScope {
 public:
  explicit TraceScope(GraphBuilder& b) : b_(b) {
    stagecraft::detail::Context& ctx = stagecraft::detail::context();
    b_.parent = ctx.trace;
    ctx.trace = &b_;
  }
  ~TraceScope() { stagecraft::detail::context().trace = b_.parent; }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  GraphBuilder& b_;
};

}  // namespace graph

/// RAII: while alive, this thread runs eagerly, outside every trace, and records on no tape
/// (TensorFlow's init_scope): create variables and compute their initial values here.
class init_scope {
 public:
  init_scope() : saved_(stagecraft::detail::context().trace) {
    stagecraft::detail::context().trace = nullptr;
    ++stagecraft::detail::context().no_record;
  }
  ~init_scope() {
    stagecraft::detail::context().trace = saved_;
    --stagecraft::detail::context().no_record;
  }
  init_scope(const init_scope&) = delete;
  init_scope& operator=(const init_scope&) = delete;

 private:
  stagecraft::detail::TraceState* saved_;
};

}  // namespace stagecraft
