// sc::function (the tracing JIT: one optimized plan per input signature) and
// sc::ConcreteFunction (one traced, optimized graph with its plan).
#pragma once
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <functional>
#include <iostream>
#include <map>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "control_flow.hpp"
#include "function_args.hpp"
#include "structure.hpp"
#include "host_fn.hpp"
#include "interpret.hpp"
#include "passes/pipeline.hpp"
#include "plan.hpp"
#include "split.hpp"
#include "trace.hpp"

namespace stagecraft {

/// What tracing and optimizing made of a function (ConcreteFunction::stats()).
struct FunctionStats {
  int traced_nodes = 0;                        ///< compute nodes as traced
  std::vector<graph::PassReport> passes;       ///< nodes before and after each pass
  int optimized_nodes = 0;                     ///< compute nodes after the passes
  graph::PlanStats plan;                       ///< kernels, fused groups, memory
  /// A few lines for people.
  std::string str() const {
    const auto some = [](int n, const char* what) { return n > 0 ? ", " + std::to_string(n) + what : std::string(); };
    std::ostringstream os;
    os << "traced nodes: " << traced_nodes << "\n";
    for (const auto& p : passes) os << "  " << p.pass << ": " << p.nodes_before << " -> " << p.nodes_after << "\n";
    os << "optimized nodes: " << optimized_nodes << "\n"
       << "plan: " << plan.steps << " steps, " << plan.kernels << " kernels, " << plan.fused_groups
       << " fused groups (" << plan.fused_nodes << " nodes, " << plan.specialized << " specialized"
       << some(plan.fused_products, " products formed in them") << some(plan.fused_concats, " concats written by them") << ")"
       << some(plan.losses_with_gradient, " losses computed with their gradient") << "\n"
       << "memory: " << plan.peak_bytes << " bytes planned in " << plan.buffers << " buffers (intermediates: "
       << plan.intermediate_bytes << " bytes)";
    if (plan.pieces_in_place > 0)
      os << some(plan.pieces_in_place, " concat pieces written in place (") << plan.concats_dropped << " concats dropped)";
    os << "\n";
    if (!plan.cuda_graph.empty()) {
      os << "cuda graph: " << plan.cuda_graph;
      if (plan.cuda_graph_launches > 0)
        os << "; " << plan.cuda_graph_copy_bytes << " bytes copied per call for " << plan.cuda_graph_launches << " launches";
      os << "\n";
    }
    return os.str();
  }
};
inline std::ostream& operator<<(std::ostream& os, const FunctionStats& s) { return os << s.str(); }

/// The results of calling a ConcreteFunction: a Tensor when there is one, or a list.
class FunctionOutputs {
 public:
  explicit FunctionOutputs(std::vector<Tensor> v) : v_(std::move(v)) {}
  /// The one result (ValueError when there are several).
  operator Tensor() const {  // NOLINT: `Tensor y = g(x);`
    if (v_.size() != 1) throw ValueError("[ConcreteFunction] returns " + std::to_string(v_.size()) + " tensors; index them");
    return v_[0];
  }
  operator std::vector<Tensor>() const { return v_; }  // NOLINT
  const Tensor& operator[](std::size_t i) const { return v_.at(i); }
  std::size_t size() const { return v_.size(); }
  auto begin() const { return v_.begin(); }
  auto end() const { return v_.end(); }

 private:
  std::vector<Tensor> v_;
};

/// One traced function for one input signature: its graph (as traced and optimized), its plan,
/// and its statistics. Callable with tensors of the traced shapes and dtypes; cheap to copy.
class ConcreteFunction {
 public:
  ConcreteFunction() = default;
  /// Optimizes `traced` and lowers it to a plan.
  explicit ConcreteFunction(std::shared_ptr<const graph::Graph> traced, bool optimize = true) {
    auto impl = std::make_shared<Impl>();
    impl->traced = traced;
    impl->stats.traced_nodes = traced->num_compute_nodes();
    impl->optimized = optimize ? std::make_shared<const graph::Graph>(graph::optimize(*traced, &impl->stats.passes))
                               : traced;
    impl->stats.optimized_nodes = impl->optimized->num_compute_nodes();
    impl->plan = std::make_shared<const graph::Plan>(impl->optimized);
    impl->stats.plan = impl->plan->stats();
    impl_ = std::move(impl);
  }

  bool defined() const { return impl_ != nullptr; }
  /// The optimized graph (printable: `std::cout << cf.graph()`).
  const graph::Graph& graph() const { return *impl_->optimized; }
  /// The graph as traced, before the passes.
  const graph::Graph& traced_graph() const { return *impl_->traced; }
  const graph::Plan& plan() const { return *impl_->plan; }
  /// The staged gradient of this function for the float arguments in `wanted` (bit k: argument
  /// k): (arguments..., output seeds...) -> the gradients of those arguments, in order, the
  /// others' work dropped (when every float argument is wanted, or none: one result per
  /// argument). For inspection (graph, stats, plan): nested tapes run it, a single tape runs
  /// the backward half of the forward/backward pair cut down alike, each choosing by itself.
  ConcreteFunction gradient_function(ops::Wanted wanted = {}) const {
    if (!impl_) stagecraft::detail::fail<ValueError>("ConcreteFunction", std::source_location::current(), "is empty (default-constructed)");
    const auto [key, floats] = wanted_floats(wanted);
    if (key == floats || key == 0) return backward();
    return *pruned_gradient(backward(), 1, key);
  }
  FunctionStats stats() const {
    FunctionStats s = impl_->stats;
    s.plan.cuda_graph = impl_->plan->cuda_graph_status();
    return s;
  }
  /// What each argument must be.
  std::vector<TensorSpec> input_specs() const {
    std::vector<TensorSpec> s;
    for (int v : graph().inputs) s.push_back({graph().values[v].shape, graph().values[v].dtype});
    return s;
  }

  /// Runs the plan on tensors (checked against the traced signature). Inside another trace the
  /// graph is inlined into it; under a recording tape the call is differentiable: it runs a
  /// forward plan that also returns what the backward pass needs (the residuals), and the
  /// backward is a staged function of those (both traced on first need). Under nested tapes
  /// the backward recomputes the forward from the arguments instead, so outer tapes see
  /// through it (second derivatives).
  std::vector<Tensor> call(const std::vector<Tensor>& args,
                           std::source_location loc = std::source_location::current()) const {
    check_args(args, loc);
    stagecraft::detail::Context& ctx = stagecraft::detail::context();
    bool symbolic = ctx.trace != nullptr;
    for (const Tensor& a : args) symbolic |= a.is_symbolic();
    if (symbolic) return graph::interpret(graph(), args);
    return run(args, loc);
  }
  /// As call(), for arguments known to match the signature (sc::function checked it).
  std::vector<Tensor> run(const std::vector<Tensor>& args, const std::source_location& loc) const {
    const stagecraft::detail::Context& ctx = stagecraft::detail::context();
    const bool recording = ctx.tapes != nullptr && ctx.no_record == 0;
    if (recording) {
      // A tape outside sees the variables the function reads as inputs of the call, so their
      // gradients flow (otherwise a traced forward pass under an eager tape would give zeros).
      if (const VarInputs& vi = variable_inputs(); vi.fn) {
        std::vector<Tensor> all = args;
        const graph::Graph& vg = vi.fn->graph();
        for (std::size_t k = 0; k < vi.vars.size(); ++k) {
          const Tensor v = Variable::from_state(vi.vars[k]).value();
          const graph::Value& want = vg.values[vg.inputs[args.size() + k]];
          if (v.shape() != want.shape || v.dtype() != want.dtype || v.device() != want.device)
            stagecraft::detail::fail<StagingError>("read_var", loc, "variable '", vi.vars[k]->name,
                                                   "' changed shape, dtype or device since it was traced");
          all.push_back(v);
        }
        if (vi.after.empty()) return vi.fn->run(all, loc);
        // The function reads values it assigns: it runs as traced (the assignments happen), then
        // the variant differentiates its outputs with respect to the values read before the call
        // and the variables' values after it, as an eager run's tape would.
        stagecraft::detail::see_inputs(all);  // the values read before the call, while they are the variables'
        std::vector<Tensor> outs = impl_->plan->run(args);
        for (const auto& var : vi.after) all.push_back(Variable::from_state(var).value());
        vi.fn->record_gradient(all, outs, loc);
        return outs;
      }
    }
    if (recording && ctx.tapes->tapes.size() == 1) {
      const Split& sp = split();
      std::vector<Tensor> all = sp.forward->plan().run(args);
      const auto nout = static_cast<std::ptrdiff_t>(graph().outputs.size());
      std::vector<Tensor> outs(all.begin(), all.begin() + nout), residuals(all.begin() + nout, all.end());
      record_split_gradient(args, outs, std::move(residuals), loc);
      return outs;
    }
    std::vector<Tensor> outs = impl_->plan->run(args);
    if (recording) record_gradient(args, outs, loc);
    return outs;
  }
  /// g(x, y): tensors (or variables) in, FunctionOutputs out. The first argument is an Operand,
  /// so errors (arguments that do not match the signature) name the caller's line.
  template <class... A>
    requires(std::convertible_to<const A&, const Tensor&> && ...)
  FunctionOutputs operator()(Operand first, const A&... rest) const {
    return FunctionOutputs(call(std::vector<Tensor>{first.t, static_cast<const Tensor&>(rest)...}, first.loc));
  }
  /// g() for a function of no arguments.
  FunctionOutputs operator()(std::source_location loc = std::source_location::current()) const {
    return FunctionOutputs(call({}, loc));
  }

  /// Writes the optimized graph and the variables it reads (see graph/serialize.hpp).
  void save(const std::string& path, std::source_location loc = std::source_location::current()) const;

 private:
  /// The function with the variables it reads as extra arguments (see variable_inputs()).
  struct VarInputs {
    std::shared_ptr<const ConcreteFunction> fn;  ///< null: it reads no such variable
    std::vector<std::shared_ptr<stagecraft::detail::VariableState>> vars;  ///< extra arguments, in order
    /// Then one extra argument per read of a variable's final value: their values after the
    /// call. Non-empty: fn assigns nothing and only differentiates (see final_reads_variant).
    std::vector<std::shared_ptr<stagecraft::detail::VariableState>> after;
  };
  struct Impl {
    std::shared_ptr<const graph::Graph> traced, optimized;
    std::shared_ptr<const graph::Plan> plan;
    FunctionStats stats;
    mutable std::mutex grad_mu;
    mutable std::shared_ptr<const ConcreteFunction> backward;  ///< (args..., output seeds...) -> arg gradients
    /// forward: args -> (outputs..., residuals...); backward: (residuals..., output seeds...) -> arg gradients.
    mutable std::shared_ptr<const ConcreteFunction> split_forward, split_backward;
    /// Those two gradient functions (0: split_backward, 1: backward) cut down to some
    /// arguments' gradients, by which (a bit per argument).
    mutable std::map<std::pair<int, std::uint64_t>, std::shared_ptr<const ConcreteFunction>> pruned;
    mutable std::once_flag var_inputs_once;
    mutable std::shared_ptr<const VarInputs> var_inputs;
  };

  /// For recording tapes: the traced graph with each floating-point variable it reads, and
  /// never assigns (here or in a body), read through an extra argument instead of a read_var
  /// node. A read_var gives the value at the start of the call, which is what is passed in, so
  /// the two run alike; a variable assigned in the function keeps its read_var. A function that
  /// reads a floating-point variable it assigns (see final_reads_variant) gets that instead.
  const VarInputs& variable_inputs() const {
    std::call_once(impl_->var_inputs_once, [&] {
      if (auto fr = final_reads_variant()) {
        impl_->var_inputs = std::move(fr);
        return;
      }
      auto vi = std::make_shared<VarInputs>();
      std::unordered_set<const stagecraft::detail::VariableInfo*> assigned;
      graph::detail_cf::collect_assigned(*impl_->traced, assigned);
      graph::Graph g = *impl_->traced;
      for (graph::Node& n : g.nodes) {
        if (n.kind != graph::NodeKind::read_var || assigned.count(n.var.get()) ||
            !is_floating(g.values[n.outputs[0]].dtype))
          continue;
        vi->vars.push_back(n.var);
        n.kind = graph::NodeKind::input;
        n.index = static_cast<int>(g.inputs.size());
        n.var = nullptr;
        g.inputs.push_back(n.outputs[0]);
      }
      if (!vi->vars.empty())
        vi->fn = std::make_shared<const ConcreteFunction>(std::make_shared<const graph::Graph>(std::move(g)),
                                                          impl_->optimized != impl_->traced);
      impl_->var_inputs = std::move(vi);
    });
    return *impl_->var_inputs;
  }
  /// After an eager assignment, a tape sees the variable's new value as a fresh source: the
  /// gradient with respect to the variable (its value after the call) is that of the reads that
  /// follow its last assignment. For a function that reads such a final value (a read_var after
  /// the last cond or while that assigns the variable, or a stop_gradient whose i0 names its last
  /// assign_var, see GraphBuilder::assign), or whose last assignment of a variable is in a body,
  /// or that reads a variable before assigning it: the traced graph with each read of a value
  /// from before the call an extra argument, then each final read one (the values after the
  /// call), for recording the gradient of a call that ran the function itself. Its backward pass
  /// replays it without side effects (interpret), from the values before the call: a variable a
  /// body assigns starts from an extra argument assigned at the top. Where the last assignment
  /// is in a body (the last round of a loop, a branch), which one it is is known only at run
  /// time: the variable's value after the call is one more argument, given to the replay by a
  /// marked assign_var at the top, and the replay counts the assignments and makes the last one
  /// give that value (graph::ReplayVars), so the reads that follow it, there, read it as an
  /// eager run's do. Null when none of these reads a floating-point value.
  std::shared_ptr<VarInputs> final_reads_variant() const {
    using VarPtr = std::shared_ptr<stagecraft::detail::VariableState>;
    const graph::Graph& t = *impl_->traced;
    // each variable's assignments at the top level: assign_var nodes, and cond or while nodes
    // whose bodies assign it
    std::unordered_map<const stagecraft::detail::VariableInfo*, std::size_t> first, last;
    std::vector<VarPtr> in_bodies;
    std::function<void(const graph::Graph&, std::size_t)> bodies_assign = [&](const graph::Graph& b, std::size_t i) {
      for (const graph::Node& n : b.nodes) {
        if (n.kind == graph::NodeKind::assign_var) {
          if (std::find(in_bodies.begin(), in_bodies.end(), n.var) == in_bodies.end()) in_bodies.push_back(n.var);
          first.try_emplace(n.var.get(), i);
          last[n.var.get()] = i;
        }
        for (const auto& c : n.bodies) bodies_assign(*c, i);
      }
    };
    for (std::size_t i = 0; i < t.nodes.size(); ++i) {
      const graph::Node& n = t.nodes[i];
      if (n.kind == graph::NodeKind::assign_var) {
        first.try_emplace(n.var.get(), i);
        last[n.var.get()] = i;
      }
      for (const auto& b : n.bodies) bodies_assign(*b, i);
    }
    auto final_read = [&](std::size_t i, const graph::Node& n) -> VarPtr {
      if (n.kind == graph::NodeKind::read_var) {
        const auto it = last.find(n.var.get());
        return it != last.end() && i > it->second ? n.var : nullptr;
      }
      // (a graph made from this one by interpreting it, a backward pass, copies the tag: it must
      // name an assignment of the same value here)
      const auto a = static_cast<std::size_t>(n.attrs.i0 - 1);
      if (n.kind != graph::NodeKind::op || n.op != ops::OpId::StopGradient || n.attrs.i0 <= 0 || a >= t.nodes.size())
        return nullptr;
      const graph::Node& an = t.nodes[a];
      if (an.kind != graph::NodeKind::assign_var || an.inputs != n.inputs) return nullptr;
      return last.at(an.var.get()) == a ? an.var : nullptr;
    };
    // a variable whose last assignment is in a body (the last cond or while that assigns it):
    // the reads there that follow the last assignment made at run time read its final value
    std::vector<VarPtr> in_body_finals;
    for (const VarPtr& var : in_bodies)
      if (t.nodes[last.at(var.get())].kind != graph::NodeKind::assign_var && is_floating(var->get().dtype()))
        in_body_finals.push_back(var);
    bool any = !in_body_finals.empty();
    for (std::size_t i = 0; i < t.nodes.size(); ++i) {
      const graph::Node& n = t.nodes[i];
      if (n.outputs.empty() || !is_floating(t.values[n.outputs[0]].dtype)) continue;
      // a final read, or a read before the first assignment (the value before the call)
      any |= final_read(i, n) != nullptr ||
             (n.kind == graph::NodeKind::read_var && first.count(n.var.get()) && i < first.at(n.var.get()));
    }
    if (!any) return nullptr;

    auto vi = std::make_shared<VarInputs>();
    graph::Graph g;
    g.name = t.name;
    g.values = t.values;
    g.inputs = t.inputs;
    g.outputs = t.outputs;
    g.strings = t.strings;
    std::vector<std::size_t> pre, post;  // nodes of g that become the extra arguments
    // An argument of var's value, assigned to var at the top (its attrs say what for); returns
    // the argument's node.
    auto top_assign = [&](const VarPtr& var, const ops::Attrs& attrs) {
      const Tensor now = var->get();
      graph::Node in;
      in.kind = graph::NodeKind::input;
      const int v = g.add_node(std::move(in), {TensorSpec{now.shape(), now.dtype()}}, now.device());
      graph::Node as;
      as.kind = graph::NodeKind::assign_var;
      as.var = var;
      as.inputs = {g.out(v)};
      as.attrs = attrs;
      g.add_node(std::move(as), {});
      return static_cast<std::size_t>(v);
    };
    // a variable a body assigns starts the replay from its value before the call (flag: the
    // replay's start, gradients reach the argument, see interpret)
    ops::Attrs start;
    start.flag = true;
    for (const VarPtr& var : in_bodies) {
      pre.push_back(top_assign(var, start));
      vi->vars.push_back(var);
    }
    // and its final value, for the reads in a body that follow its last assignment
    ops::Attrs final_value;
    final_value.i0 = graph::final_value_mark;  // see graph::ReplayVars
    for (const VarPtr& var : in_body_finals) {
      post.push_back(top_assign(var, final_value));
      vi->after.push_back(var);
    }
    for (std::size_t i = 0; i < t.nodes.size(); ++i) {
      const graph::Node& n = t.nodes[i];
      for (int v : n.outputs) g.values[static_cast<std::size_t>(v)].node = static_cast<int>(g.nodes.size());
      g.nodes.push_back(n);
      if (VarPtr var = final_read(i, n)) {
        vi->after.push_back(std::move(var));
        post.push_back(g.nodes.size() - 1);
      } else if (n.kind == graph::NodeKind::read_var && (!first.count(n.var.get()) || i < first.at(n.var.get()))) {
        vi->vars.push_back(n.var);
        pre.push_back(g.nodes.size() - 1);
      }  // a read between assignments stays: the replay reads the value it assigned
    }
    auto to_input = [&g](graph::Node& n) {
      n.kind = graph::NodeKind::input;
      n.index = static_cast<int>(g.inputs.size());
      n.inputs.clear();
      n.attrs = {};
      n.var = nullptr;
      g.inputs.push_back(n.outputs[0]);
    };
    for (std::size_t k : pre) to_input(g.nodes[k]);
    for (std::size_t k : post) to_input(g.nodes[k]);
    vi->fn = std::make_shared<const ConcreteFunction>(std::make_shared<const graph::Graph>(std::move(g)),
                                                      impl_->optimized != impl_->traced);
    return vi;
  }

  struct Split {
    const ConcreteFunction* forward;
    const ConcreteFunction* backward;
  };

  /// The forward/backward pair, traced on first need: the forward pass and its gradient traced
  /// as one graph, then cut where the output gradients (seeds) come in (graph/split.hpp).
  Split split() const {
    std::lock_guard<std::mutex> lock(impl_->grad_mu);
    if (!impl_->split_forward) {
      const graph::Graph& g = graph();
      graph::GraphBuilder b(g.name + "_joint", false);
      {
        graph::TapeIsolation isolate;
        graph::TraceScope scope(b);
        std::vector<Tensor> args, seeds;
        add_signature_inputs(b, args, seeds);
        const auto loc = std::source_location::current();
        auto [res, gs] = graph::detail_cf::body_outputs_and_vjp(g, args, seeds, loc, true);
        res.insert(res.end(), gs.begin(), gs.end());
        b.set_outputs(res, loc);
      }
      graph::SplitGraphs parts = graph::split_forward_backward(b.graph, static_cast<int>(g.inputs.size()),
                                                               static_cast<int>(g.outputs.size()));
      impl_->split_backward = std::make_shared<const ConcreteFunction>(std::make_shared<const graph::Graph>(std::move(parts.backward)));
      impl_->split_forward = std::make_shared<const ConcreteFunction>(std::make_shared<const graph::Graph>(std::move(parts.forward)));
    }
    return {impl_->split_forward.get(), impl_->split_backward.get()};
  }

  /// Records the outputs' gradient: the staged backward run once on the residuals this call's
  /// forward pass kept and the outputs' gradients (zeros for an output none reached).
  void record_split_gradient(const std::vector<Tensor>& args, const std::vector<Tensor>& outs,
                             std::vector<Tensor> residuals, const std::source_location& loc) const {
    auto kept = std::make_shared<const std::vector<Tensor>>(std::move(residuals));
    ConcreteFunction self = *this;
    std::vector<TensorSpec> out_specs;
    std::vector<Device> out_devices;  // (the zero gradients are made there)
    for (const Tensor& o : outs) out_specs.push_back({o.shape(), o.dtype()}), out_devices.push_back(o.device());
    auto vjp = [self, kept, out_specs, out_devices](const std::vector<Tensor>& g, ops::Wanted wanted) {
      std::vector<Tensor> in = *kept;
      for (std::size_t j = 0; j < out_specs.size(); ++j) {
        const stagecraft::detail::DevicePin on(out_devices[j]);
        in.push_back(g[j].defined() ? g[j] : zeros(out_specs[j].shape, out_specs[j].dtype));
      }
      return self.run_gradient(*self.split().backward, 0, wanted, in);
    };
    stagecraft::detail::record_joint("function", args, outs, std::move(vjp), loc);
  }

  /// The float arguments among `wanted` as bits, and all float arguments (0, 0 past 64 arguments).
  std::pair<std::uint64_t, std::uint64_t> wanted_floats(ops::Wanted wanted) const {
    const graph::Graph& g = graph();
    std::uint64_t floats = 0, key = 0;
    if (g.inputs.size() > 64) return {0, 0};
    for (std::size_t j = 0; j < g.inputs.size(); ++j)
      if (is_floating(g.values[g.inputs[j]].dtype)) {
        floats |= std::uint64_t{1} << j;
        if (wanted[j]) key |= std::uint64_t{1} << j;
      }
    return {key, floats};
  }
  /// `full`, a gradient function of this one (`which`: 0 split().backward, 1 backward(); one
  /// result per argument), cut down to the arguments in `key` (its optimizer then drops the
  /// others' work, such as the product giving a first layer's input gradient); cached per set.
  std::shared_ptr<const ConcreteFunction> pruned_gradient(const ConcreteFunction& full, int which, std::uint64_t key) const {
    std::lock_guard<std::mutex> lock(impl_->grad_mu);
    std::shared_ptr<const ConcreteFunction>& slot = impl_->pruned[{which, key}];
    if (!slot) {
      graph::Graph pruned = *full.impl_->traced;
      std::vector<int> outs;
      for (std::size_t j = 0; j < pruned.outputs.size(); ++j)
        if ((key >> j) & 1) outs.push_back(pruned.outputs[j]);
      pruned.outputs = std::move(outs);
      slot = std::make_shared<const ConcreteFunction>(std::make_shared<const graph::Graph>(std::move(pruned)));
    }
    return slot;
  }
  /// Runs `full` (as pruned_gradient) on `in`, computing only the float arguments' gradients in
  /// `wanted`. One gradient per argument out, undefined for the others.
  std::vector<Tensor> run_gradient(const ConcreteFunction& full, int which, ops::Wanted wanted,
                                   const std::vector<Tensor>& in) const {
    const auto [key, floats] = wanted_floats(wanted);
    const std::size_t n = graph().inputs.size();
    if (key == floats || key == 0) {
      std::vector<Tensor> gs = full.call(in);
      for (std::size_t j = 0; j < n; ++j)
        if (!is_floating(graph().values[graph().inputs[j]].dtype)) gs[j] = Tensor();
      return gs;
    }
    std::vector<Tensor> gs = pruned_gradient(full, which, key)->call(in), all(n);
    for (std::size_t j = 0, r = 0; j < n; ++j)
      if ((key >> j) & 1) all[j] = std::move(gs[r++]);
    return all;
  }

  /// Adds to b one input per argument of this function, then one per output (its gradient seed).
  void add_signature_inputs(graph::GraphBuilder& b, std::vector<Tensor>& args, std::vector<Tensor>& seeds) const {
    const graph::Graph& g = graph();
    for (int v : g.inputs) args.push_back(b.add_input({g.values[v].shape, g.values[v].dtype}, g.values[v].device));
    for (int v : g.outputs) seeds.push_back(b.add_input({g.values[v].shape, g.values[v].dtype}, g.values[v].device));
  }

  /// The staged backward function, traced on first need.
  const ConcreteFunction& backward() const {
    std::lock_guard<std::mutex> lock(impl_->grad_mu);
    if (!impl_->backward) {
      const graph::Graph& g = graph();
      graph::GraphBuilder b(g.name + "_grad", false);
      {
        graph::TapeIsolation isolate;
        graph::TraceScope scope(b);
        std::vector<Tensor> args, seeds;
        add_signature_inputs(b, args, seeds);
        std::vector<Tensor> gs = graph::detail_cf::body_vjp(g, args, seeds, std::source_location::current(), false);
        b.set_outputs(gs, std::source_location::current());
      }
      impl_->backward = std::make_shared<const ConcreteFunction>(std::make_shared<const graph::Graph>(std::move(b.graph)));
    }
    return *impl_->backward;
  }

  /// Records the outputs' gradient on the tapes watching an argument: the staged backward run
  /// once on the outputs' gradients (zeros for an output none reached).
  void record_gradient(const std::vector<Tensor>& args, const std::vector<Tensor>& outs,
                       const std::source_location& loc) const {
    ConcreteFunction self = *this;
    auto vjp = [self, args, outs](const std::vector<Tensor>& g, ops::Wanted wanted) {
      std::vector<Tensor> in = args;
      for (std::size_t j = 0; j < outs.size(); ++j) in.push_back(g[j].defined() ? g[j] : zeros_like(outs[j]));
      return self.run_gradient(self.backward(), 1, wanted, in);
    };
    stagecraft::detail::record_joint("function", args, outs, std::move(vjp), loc);
  }
  void check_args(const std::vector<Tensor>& args, const std::source_location& loc) const {
    if (!impl_) stagecraft::detail::fail<ValueError>("ConcreteFunction", loc, "is empty (default-constructed)");
    const graph::Graph& g = graph();
    if (args.size() != g.inputs.size())
      stagecraft::detail::fail<ValueError>("ConcreteFunction", loc, "'", g.name, "' takes ", g.inputs.size(), " tensors, got ",
                               args.size());
    const bool tracing = stagecraft::detail::context().trace != nullptr;  // then call() inlines the graph
    for (std::size_t i = 0; i < args.size(); ++i) {
      if (!tracing) stagecraft::detail::require_value(args[i], "ConcreteFunction", loc);
      const graph::Value& v = g.values[g.inputs[i]];
      if (args[i].shape() != v.shape || args[i].dtype() != v.dtype || args[i].device() != v.device)
        stagecraft::detail::fail<ShapeError>("ConcreteFunction", loc, "argument ", i, " of '", g.name, "' must be ",
                                 name(v.dtype), v.shape, " on ", v.device.str(), ", got ", name(args[i].dtype()),
                                 args[i].shape(), " on ", args[i].device().str());
    }
  }
  std::shared_ptr<const Impl> impl_;
};

/// Where retrace notices go (default: one line on std::cerr). Replace it to capture them.
STAGECRAFT_COMPILED_INLINE std::function<void(const std::string&)>& staging_log();
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::function<void(const std::string&)>& staging_log() {
  static std::function<void(const std::string&)> sink = [](const std::string& s) { std::cerr << s << "\n"; };
  return sink;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// The tracing JIT. `auto f = sc::function(fn)`: each call looks up its input signature (dtype,
/// shape and device of every tensor argument, identity of every Variable, value of every plain
/// argument, and the device of the DeviceScope it is called under, if any); the first call with a
/// signature traces fn with symbolic tensors, optimizes the graph and builds a plan; later calls
/// run the plan. So a call under a DeviceScope places the ops where the same code run eagerly
/// would. Copies share their traces; calls from several threads are safe.
template <class F>
class Function {
 public:
  /// `loc`: where the function is made (sc::function's caller), named by retrace notices and
  /// used for errors of a call whose first argument is not a Tensor.
  explicit Function(F f, std::string name = "f", std::source_location loc = std::source_location::current())
      : s_(std::make_shared<Shared>(std::move(f), std::move(name), loc)) {}

  /// f(args...). A first argument that is a Tensor is taken as an Operand, so errors of the call
  /// name the caller's line (an operator cannot take a defaulted std::source_location); with
  /// another first argument they name the line that made the function.
  template <class... A>
    requires(!detail_fn::FirstIsTensor<A...>)
  auto operator()(const A&... args) const {
    return invoke(s_->defined_at, args...);
  }
  template <class... A>
  auto operator()(Operand first, const A&... rest) const {
    return invoke(first.loc, first.t, rest...);
  }

  /// Traces (if needed) for these arguments and returns the concrete function (a first Tensor
  /// argument keeps the caller's line, as in operator()).
  template <class... A>
    requires(!detail_fn::FirstIsTensor<A...>)
  ConcreteFunction get_concrete(const A&... args) const {
    return entry_for(s_->defined_at, args...).cf;
  }
  template <class... A>
  ConcreteFunction get_concrete(Operand first, const A&... rest) const {
    return entry_for(first.loc, first.t, rest...).cf;
  }
  /// How many times fn was traced (one per distinct signature).
  int trace_count() const {
    std::lock_guard<std::mutex> lock(s_->mu);
    return static_cast<int>(s_->entries.size());
  }
  /// Traces after which a retracing warning is printed (default 5).
  void set_retrace_warning(int n) { s_->warn_at = n; }
  /// Whether retraces are reported to staging_log() (default true; a library's own staged
  /// functions, such as nn::LSTMCell's eager step, turn it off).
  void set_retrace_log(bool on) { s_->log = on; }
  /// At most n traces (default: no limit): a call whose signature would be trace n + 1 runs fn
  /// eagerly, op by op, instead of tracing it. A library's own staged functions (the eager
  /// composites of nn::staged_composites()) bound their memory so. get_concrete ignores it.
  void set_max_traces(int n) { s_->max_traces = n; }

 private:
  struct Entry {
    std::vector<detail_fn::ArgKey> sig;
    std::optional<Device> scope;  ///< the DeviceScope's device the trace ran under (none: no scope)
    ConcreteFunction cf;
    std::vector<std::size_t> lengths;
  };
  struct Shared {
    Shared(F fn, std::string n, const std::source_location& at) : f(std::move(fn)), name(std::move(n)), defined_at(at) {}
    F f;
    std::string name;
    std::source_location defined_at;
    std::mutex mu;
    std::vector<std::unique_ptr<Entry>> entries;
    int warn_at = 5;
    bool warned = false;
    bool log = true;
    int max_traces = std::numeric_limits<int>::max();
  };

  template <class... A>
  auto invoke(const std::source_location& loc, const A&... args) const {
    static_assert((detail_fn::SupportedArg<std::decay_t<A>> && ...),
                  "sc::function: arguments must be sc::Tensor, sc::Variable, std::vector<sc::Tensor>, or plain "
                  "values (arithmetic, enum, std::string, Shape, DType)");
    using R = std::invoke_result_t<F&, const A&...>;
    bool symbolic = stagecraft::detail::context().trace != nullptr;
    ((symbolic = symbolic || detail_fn::any_symbolic(args)), ...);
    if (symbolic) return s_->f(args...);  // called inside another trace: inline it
    const Entry* e = find_or_trace(loc, /*limited=*/true, args...);
    if (e == nullptr) return s_->f(args...);  // past set_max_traces: eagerly
    std::vector<Tensor> flat;
    (detail_fn::bind_arg(args, flat), ...);
    std::vector<Tensor> outs = e->cf.run(flat, loc);
    if constexpr (std::is_void_v<R>) {
      return;
    } else {
      std::size_t pos = 0, li = 0;
      return detail_fn::unflatten<R>(outs, pos, e->lengths, li);
    }
  }

  template <class... A>
  const Entry& entry_for(const std::source_location& loc, const A&... args) const {
    return *find_or_trace(loc, /*limited=*/false, args...);
  }
  /// The entry of these arguments' signature, traced now if new; null when `limited` and
  /// max_traces are traced already.
  template <class... A>
  const Entry* find_or_trace(const std::source_location& loc, bool limited, const A&... args) const {
    const std::array<detail_fn::ArgKey, sizeof...(A)> sig{detail_fn::key_of(args)...};
    const Device* scoped = stagecraft::detail::scoped_device();
    const std::optional<Device> scope = scoped != nullptr ? std::optional<Device>(*scoped) : std::nullopt;
    std::lock_guard<std::mutex> lock(s_->mu);
    for (const auto& e : s_->entries)
      if (e->scope == scope && std::equal(sig.begin(), sig.end(), e->sig.begin(), e->sig.end())) return e.get();
    if (limited && s_->entries.size() >= static_cast<std::size_t>(s_->max_traces)) return nullptr;
    std::vector<detail_fn::ArgKey> sigv(sig.begin(), sig.end());
    if (!s_->entries.empty() && s_->log) note_retrace(sigv, scope, loc);
    auto e = std::make_unique<Entry>();
    e->sig = std::move(sigv);
    e->scope = scope;
    trace_into(*e, loc, args...);
    s_->entries.push_back(std::move(e));
    return s_->entries.back().get();
  }

  void note_retrace(const std::vector<detail_fn::ArgKey>& sig, const std::optional<Device>& scope,
                    const std::source_location& loc) const {
    // Against the closest earlier signature (fewest differing arguments and scope, latest on ties).
    const Entry* closest = nullptr;
    std::size_t best = sig.size() + 2;
    for (const auto& e : s_->entries) {
      std::size_t d = e->scope != scope;
      for (std::size_t i = 0; i < sig.size(); ++i) d += !(sig[i] == e->sig[i]);
      if (d <= best) best = d, closest = e.get();
    }
    const std::vector<detail_fn::ArgKey>* prev = &closest->sig;
    const auto scope_text = [](const std::optional<Device>& d) { return d ? d->str() : std::string("none"); };
    std::string why;
    if (closest->scope != scope)
      why = "the DeviceScope changed from " + scope_text(closest->scope) + " to " + scope_text(scope);
    for (std::size_t i = 0; i < sig.size(); ++i)
      if (!(sig[i] == (*prev)[i])) {
        const bool typed = sig[i].type != (*prev)[i].type;  // name the types only when they differ
        why += (why.empty() ? "" : "; ") + std::string("argument ") + std::to_string(i) + " changed from " +
               (*prev)[i].text(typed) + " to " + sig[i].text(typed);
      }
    const int n = static_cast<int>(s_->entries.size()) + 1;
    staging_log()("[sc::function] retracing '" + s_->name + "' (trace " + std::to_string(n) + "): " + why + " at " +
                  stagecraft::detail::where(loc));
    if (n >= s_->warn_at && !s_->warned) {
      s_->warned = true;
      staging_log()("[sc::function] warning: '" + s_->name + "' (made at " + stagecraft::detail::where(s_->defined_at) +
                    ") has been traced " + std::to_string(n) +
                    " times; each trace builds a new graph. Call it with fewer distinct shapes, and pass values "
                    "that change as tensors rather than C++ values");
    }
  }

  template <class... A>
  void trace_into(Entry& e, const std::source_location& loc, const A&... args) const {
    using R = std::invoke_result_t<F&, const A&...>;
    graph::GraphBuilder b(s_->name, /*may_create_vars=*/s_->entries.empty());
    {
      graph::TapeIsolation isolate;  // tapes outside the function do not see its symbolic ops
      graph::TraceScope scope(b);
      // Braces: list-initialization evaluates left to right, so inputs are declared in order.
      std::tuple<decltype(detail_fn::traced_arg(args, b, loc))...> targs{detail_fn::traced_arg(args, b, loc)...};
      std::vector<Tensor> outs;
      if constexpr (std::is_void_v<R>) {
        std::apply(s_->f, targs);
      } else {
        R r = std::apply(s_->f, targs);
        detail_fn::flatten(r, outs);
        detail_fn::vector_lengths(r, e.lengths);
      }
      b.set_outputs(outs, loc);
    }
    e.cf = ConcreteFunction(std::make_shared<const graph::Graph>(std::move(b.graph)));
  }

  std::shared_ptr<Shared> s_;
};

/// Stages fn: `auto f = sc::function([&](sc::Tensor x) { ... }); f(x);`
template <class F>
Function<std::decay_t<F>> function(F&& fn, std::string name = "f",
                                   std::source_location loc = std::source_location::current()) {
  return Function<std::decay_t<F>>(std::forward<F>(fn), std::move(name), loc);
}

}  // namespace stagecraft

#include "serialize.hpp"  // defines ConcreteFunction::save; sc::load_function
