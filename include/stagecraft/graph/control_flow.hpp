// Staged control flow: sc::cond and sc::while_loop. With a concrete predicate they are plain C++
// control flow; while tracing they record cond/while nodes holding traced bodies, with gradients.
#pragma once
#include <concepts>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <unordered_set>
#include <vector>

#include "../autodiff/tape.hpp"
#include "../core/creation.hpp"
#include "../ops/check_range.hpp"
#include "interpret.hpp"
#include "structure.hpp"
#include "trace.hpp"

namespace stagecraft {
namespace graph::detail_cf {

using Tensors = std::vector<Tensor>;
using Thunk = std::function<Tensors()>;

/// A traced body: its graph and the enclosing values it captured (its extra inputs).
struct Body {
  std::shared_ptr<const Graph> graph;
  Tensors captured;  ///< the enclosing graph's tensors, in the body's capture order
  std::vector<std::shared_ptr<stagecraft::detail::VariableState>> assigned;
};

/// Traces fn(args) as a body of the current trace. Arguments become its first inputs.
STAGECRAFT_COMPILED_INLINE Body trace_body(const std::string& name, const std::vector<TensorSpec>& arg_specs,
                                           const std::vector<Device>& devs,
                                           const std::function<Tensors(const Tensors&)>& fn,
                                           const std::source_location& loc);
STAGECRAFT_COMPILED_INLINE std::vector<TensorSpec> specs_of(const Graph& g, const std::vector<int>& vals);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE Body trace_body(const std::string& name, const std::vector<TensorSpec>& arg_specs,
                                           const std::vector<Device>& devs,
                                           const std::function<Tensors(const Tensors&)>& fn,
                                           const std::source_location& loc) {
  GraphBuilder b(name, /*may_create_vars=*/false);
  {
    TapeIsolation isolate;
    TraceScope scope(b);
    Tensors args;
    for (std::size_t i = 0; i < arg_specs.size(); ++i) args.push_back(b.add_input(arg_specs[i], devs[i], SrcLoc::from(loc)));
    const Tensors outs = fn(args);
    for (const Tensor& t : outs) stagecraft::detail::require_defined(t, name, loc);
    b.set_outputs(outs, loc);
  }
  return {std::make_shared<const Graph>(std::move(b.graph)), b.captured_outer, b.assigned()};
}

STAGECRAFT_COMPILED_INLINE std::vector<TensorSpec> specs_of(const Graph& g, const std::vector<int>& vals) {
  std::vector<TensorSpec> s;
  for (int v : vals) s.push_back({g.values[v].shape, g.values[v].dtype});
  return s;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

inline std::string spec_text(const TensorSpec& s) { return std::string(name(s.dtype)) + s.shape.str(); }

/// After a body assigned variables, the enclosing trace reads them afresh.
STAGECRAFT_COMPILED_INLINE void forget_assigned(GraphBuilder& parent, const Body& b);

/// Lifts tensors into the current trace.
STAGECRAFT_COMPILED_INLINE Tensors lifted(const Tensors& ts, const std::source_location& loc);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE void forget_assigned(GraphBuilder& parent, const Body& b) {
  for (const auto& v : b.assigned) parent.forget(v.get());
}

STAGECRAFT_COMPILED_INLINE Tensors lifted(const Tensors& ts, const std::source_location& loc) {
  Tensors out;
  current_builder()->lift(ts, out, loc);
  return out;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// A loop's bodies read the variables the loop assigns afresh at each round: a body reads a
/// variable through a capture of the enclosing graph's read (one value for the whole loop),
/// which is right for a variable the loop leaves alone, and wrong for one it assigns (`while
/// (k < 3) k += 1` would never end). Such captures become read_var nodes of the body itself.
STAGECRAFT_COMPILED_INLINE void read_assigned_in_place(Body& cond_b, Body& body_b);
/// Adds the variables g assigns, in it or in its bodies, to out.
STAGECRAFT_COMPILED_INLINE void collect_assigned(const Graph& g,
                                                 std::unordered_set<const stagecraft::detail::VariableInfo*>& out);
/// The variables the graphs assign (in them or their bodies), in program order, each once, with
/// their values now (in a trace: its reads of them here): where a replay without side effects
/// of the graphs starts.
STAGECRAFT_COMPILED_INLINE ReplayVars assigned_values(const std::vector<const Graph*>& gs);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE void assigned_in_order(const Graph& g, ReplayVars& out) {
  for (const Node& n : g.nodes) {
    if (n.kind == NodeKind::assign_var && out.find(n.var.get()) == nullptr) {
      out.vars.push_back(n.var.get());
      out.values.push_back(Variable::from_state(n.var).value());
    }
    for (const auto& b : n.bodies) assigned_in_order(*b, out);
  }
}

STAGECRAFT_COMPILED_INLINE ReplayVars assigned_values(const std::vector<const Graph*>& gs) {
  ReplayVars rv;
  for (const Graph* g : gs) assigned_in_order(*g, rv);
  return rv;
}

STAGECRAFT_COMPILED_INLINE void collect_assigned(const Graph& g, std::unordered_set<const stagecraft::detail::VariableInfo*>& out) {
  for (const Node& n : g.nodes) {
    if (n.kind == NodeKind::assign_var) out.insert(n.var.get());
    for (const auto& b : n.bodies) collect_assigned(*b, out);
  }
}

STAGECRAFT_COMPILED_INLINE void read_in_place(Body& b, const std::unordered_set<const stagecraft::detail::VariableInfo*>& vars) {
  const Graph& old = *b.graph;
  const std::size_t args = old.inputs.size() - b.captured.size();  // loop variables come first
  std::vector<std::size_t> drop;
  for (std::size_t k = 0; k < b.captured.size(); ++k) {
    const stagecraft::detail::VariableInfo* v = b.captured[k].impl()->variable;
    if (v != nullptr && vars.count(v)) drop.push_back(k);
  }
  if (drop.empty()) return;
  Graph g = old;
  Tensors captured;
  std::vector<int> inputs(g.inputs.begin(), g.inputs.begin() + static_cast<std::ptrdiff_t>(args));
  std::size_t d = 0;
  for (std::size_t k = 0; k < b.captured.size(); ++k) {
    const int val = g.inputs[args + k];
    if (d < drop.size() && drop[d] == k) {
      ++d;
      Node& n = g.nodes[static_cast<std::size_t>(g.values[val].node)];
      auto* info = const_cast<stagecraft::detail::VariableInfo*>(b.captured[k].impl()->variable);
      n.kind = NodeKind::read_var;
      n.var = std::static_pointer_cast<stagecraft::detail::VariableState>(info->shared_from_this());
      n.index = 0;
      continue;
    }
    g.nodes[static_cast<std::size_t>(g.values[val].node)].index = static_cast<int>(inputs.size());
    inputs.push_back(val);
    captured.push_back(b.captured[k]);
  }
  g.inputs = std::move(inputs);
  b.graph = std::make_shared<const Graph>(std::move(g));
  b.captured = std::move(captured);
}

STAGECRAFT_COMPILED_INLINE void read_assigned_in_place(Body& cond_b, Body& body_b) {
  std::unordered_set<const stagecraft::detail::VariableInfo*> vars;
  collect_assigned(*cond_b.graph, vars);
  collect_assigned(*body_b.graph, vars);
  if (vars.empty()) return;
  read_in_place(cond_b, vars);
  read_in_place(body_b, vars);
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// Zeros shaped like t, on t's device (a placeholder gradient: it meets t's other gradients).
inline Tensor zeros_like(const Tensor& t, const std::source_location& loc) {
  const stagecraft::detail::DevicePin on(t.device());
  return zeros(t.shape(), t.dtype(), loc);
}

/// sum_k sum(outs[k] * seeds[k]) over the float outputs with a seed: a scalar whose gradient is
/// the vector-Jacobian product of all outputs at once.
STAGECRAFT_COMPILED_INLINE Tensor weighted_total(const Tensors& outs, const Tensors& seeds,
                                                 const std::source_location& loc);

/// body(args) and the gradients of weighted_total(body(args)) with respect to args (zeros for
/// non-float and unconnected ones); args are lifted into the current trace first.
/// With `replay`, body runs without side effects from those variable values (interpret_pure).
STAGECRAFT_COMPILED_INLINE std::pair<Tensors, Tensors> body_outputs_and_vjp(const Graph& body, const Tensors& args,
                                                                            const Tensors& seeds,
                                                                            const std::source_location& loc,
                                                                            bool side_effects = true,
                                                                            const ReplayVars* replay = nullptr);

/// The gradients of body_outputs_and_vjp alone.
STAGECRAFT_COMPILED_INLINE Tensors body_vjp(const Graph& body, const Tensors& args, const Tensors& seeds,
                                            const std::source_location& loc, bool side_effects = true,
                                            const ReplayVars* replay = nullptr);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE Tensor weighted_total(const Tensors& outs, const Tensors& seeds,
                                                 const std::source_location& loc) {
  Tensor total;
  for (std::size_t k = 0; k < outs.size(); ++k) {
    if (!seeds[k].defined() || !is_floating(outs[k].dtype())) continue;
    Tensor t = sum(outs[k] * seeds[k], {}, false, loc);
    if (t.dtype() != DType::f64) t = cast(t, DType::f64, loc);
    total = total.defined() ? total + t : t;
  }
  return total;
}

STAGECRAFT_COMPILED_INLINE std::pair<Tensors, Tensors> body_outputs_and_vjp(const Graph& body, const Tensors& args,
                                                                            const Tensors& seeds,
                                                                            const std::source_location& loc,
                                                                            bool side_effects, const ReplayVars* replay) {
  const Tensors local = current_builder() ? lifted(args, loc) : args;
  GradientTape tape;
  Tensors sources;
  for (const Tensor& a : local)
    if (is_floating(a.dtype())) {
      tape.watch(a);
      sources.push_back(a);
    }
  ReplayVars rv;
  if (replay != nullptr) rv = *replay;
  Tensors outs = replay != nullptr ? interpret_pure(body, local, rv) : interpret(body, local, side_effects);
  const Tensor total = weighted_total(outs, seeds, loc);
  Tensors gs;
  if (total.defined() && !sources.empty()) gs = tape.gradient(total, sources, loc);
  Tensors res;
  std::size_t j = 0;
  for (const Tensor& a : local) {
    if (!is_floating(a.dtype())) res.push_back(zeros_like(a, loc));
    else res.push_back(gs.empty() ? zeros_like(a, loc) : gs[j++]);
  }
  return {std::move(outs), std::move(res)};
}

STAGECRAFT_COMPILED_INLINE Tensors body_vjp(const Graph& body, const Tensors& args, const Tensors& seeds,
                                            const std::source_location& loc, bool side_effects,
                                            const ReplayVars* replay) {
  return body_outputs_and_vjp(body, args, seeds, loc, side_effects, replay).second;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

Tensors cond_impl(const Tensor& pred, const Thunk& then_fn, const Thunk& else_fn, const std::source_location& loc);
Tensors while_impl(const std::function<Tensor(const Tensors&)>& cond_fn, const std::function<Tensors(const Tensors&)>& body_fn,
                   const Tensors& vars, const std::source_location& loc, bool with_count = false);

/// Records the gradient of a staged cond's outputs on the tapes watching its captures. `pre`:
/// the variables the branches assign, with their values before the cond (the backward pass
/// replays a branch from them, without assigning).
STAGECRAFT_COMPILED_INLINE void record_cond_gradient(const Tensor& pred, const Body& then_b, const Body& else_b,
                                                     const ReplayVars& pre, const Tensors& outs,
                                                     const std::source_location& loc);
STAGECRAFT_COMPILED_INLINE Tensors cond_impl(const Tensor& pred, const Thunk& then_fn, const Thunk& else_fn,
                                             const std::source_location& loc);

/// Records the gradient of a staged while loop's outputs: one backward loop for all of them,
/// over the iterations in reverse, recomputing each iteration's inputs from the initial
/// values (time O(n^2) in the iteration count, memory O(1) in it).
/// `pre`: the variables the loop assigns, with their values before it (the backward pass replays
/// the rounds from them, without assigning).
STAGECRAFT_COMPILED_INLINE void record_while_gradient(const Tensors& init, const Body& cond_b, const Body& body_b,
                                                      const ReplayVars& pre, const Tensors& outs,
                                                      const std::source_location& loc);
STAGECRAFT_COMPILED_INLINE Tensors while_impl(const std::function<Tensor(const Tensors&)>& cond_fn,
                                              const std::function<Tensors(const Tensors&)>& body_fn,
                                              const Tensors& vars, const std::source_location& loc, bool with_count);
/// while_impl stopped after at most `rounds` rounds of the body (sc::WhileOptions).
STAGECRAFT_COMPILED_INLINE Tensors while_bounded(const std::function<Tensor(const Tensors&)>& cond_fn,
                                                 const std::function<Tensors(const Tensors&)>& body_fn,
                                                 const Tensors& vars, std::int64_t rounds, const std::source_location& loc);
/// The same with the bound a one-element integer tensor: read now when it and the loop are
/// concrete; else traced, so one trace serves every bound (a negative one fails when it runs).
STAGECRAFT_COMPILED_INLINE Tensors while_bounded(const std::function<Tensor(const Tensors&)>& cond_fn,
                                                 const std::function<Tensors(const Tensors&)>& body_fn,
                                                 const Tensors& vars, const Tensor& bound, const std::source_location& loc);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE void record_cond_gradient(const Tensor& pred, const Body& then_b, const Body& else_b,
                                                     const ReplayVars& pre, const Tensors& outs,
                                                     const std::source_location& loc) {
  Tensors caps = then_b.captured;
  caps.insert(caps.end(), else_b.captured.begin(), else_b.captured.end());
  auto vjp = [pred, then_b, else_b, pre, loc](const Tensors& seeds, ops::Wanted) {
    auto branch = [&](int which) {
      return [&, which]() {
        const Body& b = which == 0 ? then_b : else_b;
        Tensors gb = body_vjp(*b.graph, b.captured, seeds, loc, false, &pre);
        Tensors all;
        for (const Tensor& c : then_b.captured) all.push_back(zeros_like(c, loc));
        for (const Tensor& c : else_b.captured) all.push_back(zeros_like(c, loc));
        const std::size_t off = which == 0 ? 0 : then_b.captured.size();
        for (std::size_t i = 0; i < gb.size(); ++i) all[off + i] = gb[i];
        return all;
      };
    };
    Tensors gs = cond_impl(pred, branch(0), branch(1), loc);
    for (std::size_t i = 0; i < gs.size(); ++i) {
      const Tensor& c = i < then_b.captured.size() ? then_b.captured[i] : else_b.captured[i - then_b.captured.size()];
      if (!is_floating(c.dtype())) gs[i] = Tensor();
    }
    return gs;
  };
  stagecraft::detail::record_joint("cond", caps, outs, std::move(vjp), loc);
}

STAGECRAFT_COMPILED_INLINE Tensors cond_impl(const Tensor& pred, const Thunk& then_fn, const Thunk& else_fn,
                                             const std::source_location& loc) {
  stagecraft::detail::require_defined(pred, "cond", loc);
  if (pred.numel() != 1)
    stagecraft::detail::fail<ShapeError>("cond", loc, "the predicate must have one element, it has shape ", pred.shape());
  if (!pred.is_symbolic()) {  // plain C++ control flow (a tape records the branch's ops)
    const Tensor p = stagecraft::detail::on_host(pred, "cond", loc);  // a GPU predicate is read back (a wait)
    return stagecraft::detail::load_as<bool>(p.raw_data(), p.dtype(), 0) ? then_fn() : else_fn();
  }
  GraphBuilder* parent = current_builder();
  if (parent == nullptr || !parent->owns(pred.impl()->symbolic))
    stagecraft::detail::fail<StagingError>("cond", loc, "the predicate is a symbolic tensor from a finished trace (it escaped its sc::function)");
  const Tensor p = pred.dtype() == DType::b8 ? pred : cast(pred, DType::b8, loc);
  const Tensor p1 = p.rank() == 0 ? p : reshape(p, Shape{}, loc);
  auto wrap = [](const Thunk& f) { return [&f](const Tensors&) { return f(); }; };
  Body then_b = trace_body("then", {}, {}, wrap(then_fn), loc);
  Body else_b = trace_body("else", {}, {}, wrap(else_fn), loc);
  const auto ts = specs_of(*then_b.graph, then_b.graph->outputs), es = specs_of(*else_b.graph, else_b.graph->outputs);
  if (ts.size() != es.size())
    stagecraft::detail::fail<StagingError>("cond", loc, "then_fn returns ", ts.size(), " tensors and else_fn ", es.size(),
                                           "; both branches must return the same number");
  for (std::size_t k = 0; k < ts.size(); ++k)
    if (!(ts[k] == es[k]))
      stagecraft::detail::fail<StagingError>("cond", loc, "output ", k, " is ", spec_text(ts[k]), " in then_fn but ",
                                             spec_text(es[k]), " in else_fn; both branches must give the same shapes and dtypes");
  // Each output lives where both branches put it (a plan cannot choose its device at run time).
  std::vector<Device> devs;
  for (std::size_t k = 0; k < ts.size(); ++k) {
    const Device td = then_b.graph->values[then_b.graph->outputs[k]].device;
    const Device ed = else_b.graph->values[else_b.graph->outputs[k]].device;
    if (td != ed)
      stagecraft::detail::fail<StagingError>("cond", loc, "output ", k, " is on ", td.str(), " in then_fn but on ",
                                             ed.str(), " in else_fn; both branches must give the same devices (move "
                                             "one with .to())");
    devs.push_back(td);
  }
  Node n;
  n.kind = NodeKind::cond;
  Tensors ins{p1};
  for (const Tensor& t : then_b.captured) ins.push_back(t);
  for (const Tensor& t : else_b.captured) ins.push_back(t);
  for (const Tensor& t : lifted(ins, loc)) n.inputs.push_back(parent->value_of(t));
  n.attrs.i0 = static_cast<std::int64_t>(then_b.captured.size());
  n.bodies = {then_b.graph, else_b.graph};
  std::optional<ReplayVars> pre;  // read before the node: the values the branches start from
  if (stagecraft::detail::context().tapes != nullptr) pre = assigned_values({then_b.graph.get(), else_b.graph.get()});
  Tensors outs = parent->append_node(std::move(n), ts, devs, loc);
  forget_assigned(*parent, then_b);
  forget_assigned(*parent, else_b);
  if (pre) record_cond_gradient(p1, then_b, else_b, *pre, outs, loc);
  return outs;
}

STAGECRAFT_COMPILED_INLINE void record_while_gradient(const Tensors& init, const Body& cond_b, const Body& body_b,
                                                      const ReplayVars& pre, const Tensors& outs,
                                                      const std::source_location& loc) {
  const std::size_t n = init.size();
  Tensors ins = init;
  ins.insert(ins.end(), cond_b.captured.begin(), cond_b.captured.end());
  ins.insert(ins.end(), body_b.captured.begin(), body_b.captured.end());
  const Tensor count = outs[n];
  auto vjp = [init, cond_b, body_b, pre, count, n, loc](const Tensors& g, ops::Wanted) {
    const Tensors& caps = body_b.captured;
    // State: i, then gradients of the loop variables at iteration i, then of the captures.
    Tensors state{count - std::int64_t{1}};
    for (std::size_t j = 0; j < n; ++j) state.push_back(g[j].defined() ? g[j] : zeros_like(init[j], loc));
    for (const Tensor& c : caps) state.push_back(zeros_like(c, loc));
    auto back_cond = [](const Tensors& st) { return st[0] >= std::int64_t{0}; };
    auto back_body = [&](const Tensors& st) {
      const Tensor& i = st[0];
      // The loop variables entering iteration i: the body applied i times to the initial values
      // (and the variables the loop assigns, carried beside them: the replay assigns nothing).
      const auto nv = static_cast<std::ptrdiff_t>(n), m = static_cast<std::ptrdiff_t>(pre.vars.size());
      Tensors fwd{zeros_like(count, loc)};  // (on the count's device, as i)
      fwd.insert(fwd.end(), init.begin(), init.end());
      fwd.insert(fwd.end(), pre.values.begin(), pre.values.end());
      // A round's arguments and the variable values it starts from, from a replay state [count,
      // loop variables..., variable values...]; the test runs before each round (what it
      // assigns, the round sees).
      auto round_start = [&](const Tensors& v, ReplayVars& rv) {
        rv = ReplayVars();
        rv.vars = pre.vars;
        rv.values.assign(v.begin() + 1 + nv, v.end());
        Tensors args(v.begin() + 1, v.begin() + 1 + nv);
        if (m > 0) {
          Tensors cargs = args;
          cargs.insert(cargs.end(), cond_b.captured.begin(), cond_b.captured.end());
          interpret_pure(*cond_b.graph, cargs, rv);
        }
        args.insert(args.end(), caps.begin(), caps.end());
        return args;
      };
      auto rc = [&i](const Tensors& v) { return v[0] < i; };
      auto rb = [&](const Tensors& v) {
        ReplayVars rv;
        const Tensors args = round_start(v, rv);
        Tensors next{v[0] + std::int64_t{1}};
        for (const Tensor& t : interpret_pure(*body_b.graph, args, rv)) next.push_back(t);
        next.insert(next.end(), rv.values.begin(), rv.values.end());
        return next;
      };
      const Tensors xs = while_impl(rc, rb, fwd, loc);
      ReplayVars at_i;
      const Tensors args = round_start(xs, at_i);
      const Tensors seeds(st.begin() + 1, st.begin() + 1 + static_cast<std::ptrdiff_t>(n));
      const Tensors d = body_vjp(*body_b.graph, args, seeds, loc, false, &at_i);
      Tensors next{i - std::int64_t{1}};
      for (std::size_t j = 0; j < n; ++j) next.push_back(d[j]);
      for (std::size_t c = 0; c < caps.size(); ++c)
        next.push_back(is_floating(caps[c].dtype()) ? st[1 + n + c] + d[n + c] : st[1 + n + c]);
      return next;
    };
    const Tensors fin = while_impl(back_cond, back_body, state, loc);
    Tensors gs;
    for (std::size_t j = 0; j < n; ++j) gs.push_back(is_floating(init[j].dtype()) ? fin[1 + j] : Tensor());
    for (std::size_t c = 0; c < cond_b.captured.size(); ++c) gs.push_back(Tensor());
    for (std::size_t c = 0; c < caps.size(); ++c)
      gs.push_back(is_floating(caps[c].dtype()) ? fin[1 + n + c] : Tensor());
    return gs;
  };
  const Tensors vars(outs.begin(), outs.begin() + static_cast<std::ptrdiff_t>(n));  // (not the count)
  stagecraft::detail::record_joint("while_loop", ins, vars, std::move(vjp), loc);
}

/// A traced cond_fn's result as the loop's condition: a one-element tensor, as a bool scalar.
STAGECRAFT_COMPILED_INLINE Tensor loop_condition(Tensor c, const std::source_location& loc) {
  stagecraft::detail::require_defined(c, "while_loop", loc);
  if (c.numel() != 1)
    stagecraft::detail::fail<ShapeError>("while_loop", loc, "cond_fn must return a one-element tensor, got shape ", c.shape());
  if (c.dtype() != DType::b8) c = cast(c, DType::b8, loc);
  return c.rank() == 0 ? c : reshape(c, Shape{}, loc);
}

/// Whether a loop over `vars` is staged: inside a trace, or with a symbolic variable.
STAGECRAFT_COMPILED_INLINE bool loop_is_symbolic(const Tensors& vars) {
  bool symbolic = stagecraft::detail::context().trace != nullptr;
  for (const Tensor& v : vars) symbolic |= v.is_symbolic();
  return symbolic;
}

STAGECRAFT_COMPILED_INLINE Tensors while_impl(const std::function<Tensor(const Tensors&)>& cond_fn,
                                              const std::function<Tensors(const Tensors&)>& body_fn,
                                              const Tensors& vars, const std::source_location& loc, bool with_count) {
  for (const Tensor& v : vars) stagecraft::detail::require_defined(v, "while_loop", loc);
  if (!loop_is_symbolic(vars)) {  // plain C++ loop (a tape records every iteration's ops)
    Tensors v = vars;
    std::int64_t iterations = 0;
    for (;; ++iterations) {
      const Tensor c = cond_fn(v);
      if (c.is_symbolic() || c.numel() != 1)
        stagecraft::detail::fail<ValueError>("while_loop", loc, "cond_fn must return a one-element tensor, got shape ", c.shape());
      if (!c) break;
      Tensors next = body_fn(v);
      if (next.size() != v.size())
        stagecraft::detail::fail<ValueError>("while_loop", loc, "body_fn returns ", next.size(), " tensors for ", v.size(), " loop variables");
      v = std::move(next);
    }
    if (with_count) v.push_back(scalar(iterations));
    return v;
  }
  GraphBuilder* parent = current_builder();
  if (parent == nullptr)
    stagecraft::detail::fail<StagingError>("while_loop", loc, "a loop variable is a symbolic tensor from a finished trace (it escaped its sc::function)");
  const Tensors lv = lifted(vars, loc);
  std::vector<TensorSpec> specs;
  std::vector<Device> devs;
  for (const Tensor& v : lv) {
    specs.push_back({v.shape(), v.dtype()});
    devs.push_back(v.device());
  }
  Body cond_b = trace_body("while_cond", specs, devs, [&](const Tensors& a) { return Tensors{loop_condition(cond_fn(a), loc)}; }, loc);
  Body body_b = trace_body("while_body", specs, devs, body_fn, loc);
  read_assigned_in_place(cond_b, body_b);
  const auto outs_spec = specs_of(*body_b.graph, body_b.graph->outputs);
  if (outs_spec.size() != specs.size())
    stagecraft::detail::fail<StagingError>("while_loop", loc, "body_fn returns ", outs_spec.size(), " tensors for ", specs.size(), " loop variables");
  for (std::size_t k = 0; k < specs.size(); ++k) {
    if (!(outs_spec[k] == specs[k]))
      stagecraft::detail::fail<StagingError>("while_loop", loc, "loop variable ", k, " enters as ", spec_text(specs[k]),
                                             " but body_fn returns ", spec_text(outs_spec[k]),
                                             "; loop variables must keep their shape and dtype");
    if (const Device d = body_b.graph->values[body_b.graph->outputs[k]].device; d != devs[k])
      stagecraft::detail::fail<StagingError>("while_loop", loc, "loop variable ", k, " enters on ", devs[k].str(),
                                             " but body_fn returns it on ", d.str(),
                                             "; loop variables must keep their device (move it back with .to())");
  }
  Node n;
  n.kind = NodeKind::while_loop;
  Tensors ins = lv;
  ins.insert(ins.end(), cond_b.captured.begin(), cond_b.captured.end());
  ins.insert(ins.end(), body_b.captured.begin(), body_b.captured.end());
  for (const Tensor& t : lifted(ins, loc)) n.inputs.push_back(parent->value_of(t));
  n.attrs.i0 = static_cast<std::int64_t>(cond_b.captured.size());
  n.num_loop_vars = static_cast<int>(specs.size());
  n.bodies = {cond_b.graph, body_b.graph};
  std::vector<TensorSpec> out_specs = specs;
  out_specs.push_back({Shape{}, DType::i64});  // the iteration count (for the gradient), on the first variable's device
  std::vector<Device> out_devs = devs;
  out_devs.push_back(devs.empty() ? Device::cpu() : devs[0]);
  std::optional<ReplayVars> pre;  // read before the node: the values the first round starts from
  if (stagecraft::detail::context().tapes != nullptr) pre = assigned_values({cond_b.graph.get(), body_b.graph.get()});
  Tensors outs = parent->append_node(std::move(n), out_specs, out_devs, loc);
  forget_assigned(*parent, cond_b);
  forget_assigned(*parent, body_b);
  if (pre) record_while_gradient(vars, cond_b, body_b, *pre, outs, loc);
  if (!with_count) outs.pop_back();
  return outs;
}

/// The staged bounded loop: a counter as one more loop variable (on the first variable's
/// device), the condition `below(counter) && cond_fn(...)`.
STAGECRAFT_COMPILED_INLINE Tensors while_counted(const std::function<Tensor(const Tensors&)>& cond_fn,
                                                 const std::function<Tensors(const Tensors&)>& body_fn,
                                                 const Tensors& vars, const std::function<Tensor(const Tensor&)>& below,
                                                 const std::source_location& loc) {
  const std::size_t n = vars.size();
  auto user_vars = [n](const Tensors& a) { return Tensors(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(n)); };
  Tensors with_counter = vars;
  with_counter.push_back(stagecraft::detail::fill_on(vars.empty() ? Device::cpu() : vars[0].device(), Shape{}, 0.0,
                                                     DType::i64, loc));
  Tensors outs = while_impl(
      [&](const Tensors& a) { return logical_and(below(a[n]), loop_condition(cond_fn(user_vars(a)), loc), loc); },
      [&](const Tensors& a) {
        Tensors next = body_fn(user_vars(a));
        if (next.size() != n)
          stagecraft::detail::fail<StagingError>("while_loop", loc, "body_fn returns ", next.size(), " tensors for ", n,
                                                 " loop variables");
        next.push_back(add(a[n], std::int64_t{1}, loc));
        return next;
      },
      with_counter, loc, false);
  outs.pop_back();
  return outs;
}

STAGECRAFT_COMPILED_INLINE Tensors while_bounded(const std::function<Tensor(const Tensors&)>& cond_fn,
                                                 const std::function<Tensors(const Tensors&)>& body_fn,
                                                 const Tensors& vars, std::int64_t rounds, const std::source_location& loc) {
  if (rounds < 0)
    stagecraft::detail::fail<ValueError>("while_loop", loc, "maximum_iterations must be >= 0, got ", rounds);
  if (!loop_is_symbolic(vars)) {  // counted in C++: cond_fn is not called once the bound is reached
    std::int64_t done = 0;
    return while_impl([&](const Tensors& v) { return done == rounds ? scalar(false) : cond_fn(v); },
                      [&](const Tensors& v) {
                        ++done;
                        return body_fn(v);
                      },
                      vars, loc, false);
  }
  return while_counted(cond_fn, body_fn, vars, [&](const Tensor& counter) { return less(counter, rounds, loc); }, loc);
}

STAGECRAFT_COMPILED_INLINE Tensors while_bounded(const std::function<Tensor(const Tensors&)>& cond_fn,
                                                 const std::function<Tensors(const Tensors&)>& body_fn,
                                                 const Tensors& vars, const Tensor& bound, const std::source_location& loc) {
  stagecraft::detail::require_defined(bound, "while_loop", loc);
  if (bound.numel() != 1)
    stagecraft::detail::fail<ShapeError>("while_loop", loc, "maximum_iterations must be a one-element tensor, got shape ",
                                         bound.shape());
  if (!is_integral(bound.dtype()))
    stagecraft::detail::fail<DTypeError>("while_loop", loc, "maximum_iterations must be an integer tensor, got ",
                                         name(bound.dtype()));
  if (!bound.is_symbolic())  // read now (inside a trace: a constant of the graph)
    return while_bounded(cond_fn, body_fn, vars, bound.astype(DType::i64).item<std::int64_t>(), loc);
  // Traced: checked when the plan runs, an i64 scalar on the counter's device.
  const Device counter_dev = vars.empty() ? Device::cpu() : vars[0].device();
  Tensor b = stagecraft::detail::check_range(bound, 0, std::numeric_limits<std::int64_t>::max(), loc, "while_loop");
  if (b.dtype() != DType::i64) b = cast(b, DType::i64, loc);
  if (b.rank() != 0) b = reshape(b, Shape{}, loc);
  if (b.device() != counter_dev) b = b.to(counter_dev);
  return while_counted(cond_fn, body_fn, vars, [&](const Tensor& counter) { return less(counter, b, loc); }, loc);
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace graph::detail_cf

/// if (pred) then_fn() else else_fn(), staged: with a concrete predicate it is C++ control flow;
/// with a symbolic one (inside sc::function) both branches are traced into a cond node, so one
/// trace serves both paths. Branches take no arguments (capture what they use) and return the
/// same kind of result (Tensor, std::vector<Tensor> or std::tuple of Tensors) with the same
/// shapes and dtypes. Gradients flow to the tensors the branches use.
template <class Then, class Else>
auto cond(const Tensor& pred, Then&& then_fn, Else&& else_fn, std::source_location loc = std::source_location::current()) {
  using R = std::invoke_result_t<Then&>;
  static_assert(std::is_same_v<R, std::invoke_result_t<Else&>>, "sc::cond: then_fn and else_fn must return the same type");
  std::vector<std::size_t> lens;
  graph::detail_cf::Thunk t = [&]() {
    R r = then_fn();
    lens.clear();
    detail_fn::vector_lengths(r, lens);
    std::vector<Tensor> out;
    detail_fn::flatten(r, out);
    return out;
  };
  graph::detail_cf::Thunk e = [&]() {
    R r = else_fn();
    std::vector<std::size_t> el;
    detail_fn::vector_lengths(r, el);
    if (!lens.empty() && el != lens)
      stagecraft::detail::fail<StagingError>("cond", loc, "then_fn and else_fn return vectors of different lengths");
    if (lens.empty()) lens = el;
    std::vector<Tensor> out;
    detail_fn::flatten(r, out);
    return out;
  };
  std::vector<Tensor> flat = graph::detail_cf::cond_impl(pred, t, e, loc);
  std::size_t pos = 0, li = 0;
  return detail_fn::unflatten<R>(flat, pos, lens, li);
}

namespace detail_cf_api {
template <class T>
struct is_tensor_tuple : std::false_type {};
template <class... T>
struct is_tensor_tuple<std::tuple<T...>> : std::bool_constant<(std::is_same_v<T, Tensor> && ...)> {};
}  // namespace detail_cf_api

/// A bound on a while_loop's rounds: a number, or a one-element integer tensor (or Variable).
/// Inside sc::function a traced tensor stays a value of the graph, so one trace serves every
/// bound; a concrete one is read when the loop is made.
class IterationBound {
 public:
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  IterationBound(I rounds) : rounds_(static_cast<std::int64_t>(rounds)) {}  // NOLINT: implicit by design
  template <class T>
    requires(std::convertible_to<const T&, Tensor> && !std::integral<T>)
  IterationBound(const T& rounds) : tensor_(rounds) {}  // NOLINT: implicit by design

  bool is_tensor() const { return tensor_.has_value(); }
  std::int64_t rounds() const { return rounds_; }          ///< the number (when not a tensor)
  const Tensor& tensor() const { return *tensor_; }        ///< the tensor (when is_tensor())

 private:
  std::int64_t rounds_ = 0;
  std::optional<Tensor> tensor_;
};

/// Options of sc::while_loop.
struct WhileOptions {
  /// At most this many rounds of the body (>= 0), as TensorFlow's maximum_iterations: the loop
  /// ends when cond_fn is false or the body has run this often. Eagerly cond_fn is not called
  /// once the bound is reached; a traced loop computes `rounds < bound && cond_fn(...)`.
  /// A number or an integer tensor (traced: a negative one is a ValueError when it runs).
  /// Unset: no bound.
  std::optional<IterationBound> maximum_iterations;
};

/// while (cond_fn(vars...)) vars = body_fn(vars...), staged: outside a trace on concrete tensors
/// it is a C++ loop; inside sc::function it records a while node, so the iteration count may
/// depend on data. loop_vars is a Tensor or a std::tuple of Tensors (passed to cond_fn and
/// body_fn as separate arguments); body_fn returns the same kind, with the same shapes and
/// dtypes. Returns the final loop variables. Gradients flow to the initial values and to the
/// tensors the body uses. `options` can bound the number of rounds.
template <class C, class B, class V>
V while_loop(C&& cond_fn, B&& body_fn, const V& loop_vars, const WhileOptions& options,
             std::source_location loc = std::source_location::current()) {
  static_assert(std::is_same_v<V, Tensor> || detail_cf_api::is_tensor_tuple<V>::value,
                "sc::while_loop: loop_vars must be a Tensor or a std::tuple of Tensors");
  using graph::detail_cf::Tensors;
  auto to_vec = [](const V& v) {
    Tensors out;
    detail_fn::flatten(v, out);
    return out;
  };
  auto from_vec = [](const Tensors& t) {
    std::size_t pos = 0, li = 0;
    return detail_fn::unflatten<V>(t, pos, {}, li);
  };
  auto c = [&](const Tensors& v) -> Tensor {
    if constexpr (std::is_same_v<V, Tensor>) return cond_fn(v[0]);
    else return std::apply(cond_fn, from_vec(v));
  };
  auto b = [&](const Tensors& v) -> Tensors {
    if constexpr (std::is_same_v<V, Tensor>) return {body_fn(v[0])};
    else return to_vec(std::apply(body_fn, from_vec(v)));
  };
  if (const auto& bound = options.maximum_iterations; bound && bound->is_tensor())
    return from_vec(graph::detail_cf::while_bounded(c, b, to_vec(loop_vars), bound->tensor(), loc));
  else if (bound)
    return from_vec(graph::detail_cf::while_bounded(c, b, to_vec(loop_vars), bound->rounds(), loc));
  return from_vec(graph::detail_cf::while_impl(c, b, to_vec(loop_vars), loc));
}

/// The same without a bound on the rounds.
template <class C, class B, class V>
V while_loop(C&& cond_fn, B&& body_fn, const V& loop_vars, std::source_location loc = std::source_location::current()) {
  return while_loop(std::forward<C>(cond_fn), std::forward<B>(body_fn), loop_vars, WhileOptions{}, loc);
}

}  // namespace stagecraft

#include "control_flow_replay.hpp"  // the interpreter's replay of cond and while nodes
