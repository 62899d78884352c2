// The interpreter's replay of cond and while nodes and of the variables they assign
// (graph/interpret.hpp declares these): a part of control_flow.hpp, included at its end.
#pragma once
#include "control_flow.hpp"

namespace stagecraft {

namespace graph::detail_interp {
STAGECRAFT_COMPILED_INLINE std::vector<Tensor> replay_cond(const Node& n, const std::vector<Tensor>& ins, ReplayVars* rv);
STAGECRAFT_COMPILED_INLINE std::vector<Tensor> replay_while(const Node& n, const std::vector<Tensor>& ins, ReplayVars* rv);
STAGECRAFT_COMPILED_INLINE ReplayVars replay_vars_of(const Graph& g);
STAGECRAFT_COMPILED_INLINE ReplayVars replay_start(const Graph& g, const std::vector<Tensor>& args);
STAGECRAFT_COMPILED_INLINE void replay_assign(const Node& n, const Tensor& value, ReplayVars& rv);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE ReplayVars replay_vars_of(const Graph& g) { return detail_cf::assigned_values({&g}); }

STAGECRAFT_COMPILED_INLINE ReplayVars replay_start(const Graph& g, const std::vector<Tensor>& args) {
  ReplayVars rv = replay_vars_of(g);
  bool finals = false;
  for (const Node& n : g.nodes) finals |= n.kind == NodeKind::assign_var && n.attrs.i0 == final_value_mark;
  if (!finals) return rv;
  // which assignment is each variable's last is known only at the end (a loop's last round, a
  // branch taken, a later branch that assigns again or not): a first replay counts them
  for (std::size_t k = 0; k < rv.vars.size(); ++k) rv.counts.push_back(zeros(Shape{}, DType::i64));
  rv.finals.resize(rv.vars.size());
  ReplayVars first = rv;
  {
    stagecraft::detail::Context& ctx = stagecraft::detail::context();
    ++ctx.no_record;  // only the counts are used
    struct Restore {
      stagecraft::detail::Context& ctx;
      ~Restore() { --ctx.no_record; }
    } restore{ctx};
    (void)run(g, args, &first);
  }
  rv.last = std::move(first.counts);
  return rv;
}

// As an eager assignment: the value under a fresh identity no gradient flows back through.
// attrs.flag: the assignment that sets where a variant's replay starts (a source itself);
// final_value_mark: the value after the call, which the last assignment gives (see ReplayVars).
STAGECRAFT_COMPILED_INLINE void replay_assign(const Node& n, const Tensor& value, ReplayVars& rv) {
  Tensor* kept = rv.find(n.var.get());
  if (kept == nullptr) return;
  const auto k = static_cast<std::size_t>(kept - rv.values.data());
  if (n.attrs.flag) {
    *kept = value;
    return;
  }
  if (n.attrs.i0 == final_value_mark) {
    if (k < rv.finals.size()) rv.finals[k] = value;
    return;
  }
  const std::source_location loc = std::source_location::current();
  *kept = call_op(ops::OpId::StopGradient, {&value, 1}, {}, n.loc);
  if (rv.counts.empty()) return;
  rv.counts[k] = rv.counts[k] + std::int64_t{1};
  if (!rv.last.empty() && rv.finals[k].defined())
    *kept = where(equal(rv.counts[k], rv.last[k], loc), rv.finals[k], *kept, loc);
}

// Without side effects (rv), a branch or a round returns the variable values it leaves after
// its outputs, so they flow through a staged cond or while as ordinary values.
STAGECRAFT_COMPILED_INLINE std::vector<Tensor> replay_cond(const Node& n, const std::vector<Tensor>& ins, ReplayVars* rv) {
  const std::source_location loc = std::source_location::current();
  const auto k = static_cast<std::ptrdiff_t>(n.attrs.i0);
  const std::vector<Tensor> then_args(ins.begin() + 1, ins.begin() + 1 + k), else_args(ins.begin() + 1 + k, ins.end());
  if (rv == nullptr)
    return detail_cf::cond_impl(
        ins[0], [&] { return interpret(*n.bodies[0], then_args); }, [&] { return interpret(*n.bodies[1], else_args); },
        loc);
  auto branch = [&](const Graph& b, const std::vector<Tensor>& args) {
    ReplayVars r = *rv;
    std::vector<Tensor> o = run(b, args, &r);
    for (const Tensor& t : r.carried()) o.push_back(t);
    return o;
  };
  std::vector<Tensor> all = detail_cf::cond_impl(
      ins[0], [&] { return branch(*n.bodies[0], then_args); }, [&] { return branch(*n.bodies[1], else_args); }, loc);
  const auto nout = static_cast<std::ptrdiff_t>(all.size() - rv->num_carried());
  rv->take(all.begin() + nout);
  all.resize(static_cast<std::size_t>(nout));
  return all;
}

STAGECRAFT_COMPILED_INLINE std::vector<Tensor> replay_while(const Node& n, const std::vector<Tensor>& ins, ReplayVars* rv) {
  const std::source_location loc = std::source_location::current();
  const auto nv = static_cast<std::ptrdiff_t>(n.num_loop_vars), k = static_cast<std::ptrdiff_t>(n.attrs.i0);
  const auto m = static_cast<std::ptrdiff_t>(rv != nullptr ? rv->num_carried() : 0);
  std::vector<Tensor> vars(ins.begin(), ins.begin() + nv);
  if (rv != nullptr)
    for (const Tensor& t : rv->carried()) vars.push_back(t);
  const std::vector<Tensor> ccaps(ins.begin() + nv, ins.begin() + nv + k), bcaps(ins.begin() + nv + k, ins.end());
  // the loop variables of a round with its captures; the variable values carried after them
  auto args_of = [nv](const std::vector<Tensor>& v, const std::vector<Tensor>& caps) {
    std::vector<Tensor> a(v.begin(), v.begin() + nv);
    a.insert(a.end(), caps.begin(), caps.end());
    return a;
  };
  auto carried = [&](const std::vector<Tensor>& v) {
    ReplayVars r;
    if (rv != nullptr) {
      r = *rv;
      r.take(v.begin() + nv);
    }
    return r;
  };
  std::vector<Tensor> all = detail_cf::while_impl(
      [&](const std::vector<Tensor>& v) {
        ReplayVars r = carried(v);
        return run(*n.bodies[0], args_of(v, ccaps), rv != nullptr ? &r : nullptr)[0];
      },
      [&](const std::vector<Tensor>& v) {
        ReplayVars r = carried(v);
        std::vector<Tensor> o = run(*n.bodies[1], args_of(v, bcaps), rv != nullptr ? &r : nullptr);
        for (const Tensor& t : r.carried()) o.push_back(t);
        return o;
      },
      vars, loc, /*with_count=*/true);
  if (rv == nullptr) return all;
  rv->take(all.begin() + nv);
  all.erase(all.begin() + nv, all.begin() + nv + m);  // the loop variables, then the count
  return all;
}
#endif  // STAGECRAFT_DEFINE_COMPILED
}  // namespace graph::detail_interp

}  // namespace stagecraft
