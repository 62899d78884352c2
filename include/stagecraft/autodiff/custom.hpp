// custom_gradient, and jacobian / hessian-vector products built on the tape.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../core/creation.hpp"
#include "../ops/concat.hpp"
#include "../ops/fill.hpp"
#include "../ops/reshape.hpp"
#include "record.hpp"
#include "tape.hpp"

namespace stagecraft {

/// The backward half of a custom gradient: one gradient per input from the output's
/// gradient g (the inputs xs and the output y are passed for convenience).
using CustomBackward = std::function<std::vector<Tensor>(const Tensor& g, const std::vector<Tensor>& xs, const Tensor& y)>;
/// The backward half of a custom gradient with several results: one gradient per input from one
/// per result (zeros for a floating-point result no gradient reached, undefined for the others).
using CustomBackwardN = detail::CustomRule::Backward;

namespace detail {

/// A recorded custom_gradient whose forward pass read trainable variable `name` itself, not
/// through its inputs: the rule cannot give it a gradient and the tape would give it none.
[[noreturn]] SC_COLD inline void fail_unpassed_read(const std::string& name, const SrcLoc& at) {
  fail_at<ValueError>("custom_gradient", at.file, at.line, "the forward function read trainable variable '", name,
                      "', which is not one of the inputs: the rule cannot give it a gradient and the tape would "
                      "give it none; pass its value in the inputs (the rule returns its gradient), or read it "
                      "under GradientTape::StopRecording inside the forward function");
}

/// Records `rule` on the tapes watching an input of xs: one entry for the float results of ys,
/// the rule called once per backward pass with zeros for the results no gradient reached.
inline void record_custom(const std::shared_ptr<const CustomRule>& rule, const std::vector<Tensor>& xs,
                          const std::vector<Tensor>& ys, const std::source_location& loc) {
  if (context().tapes == nullptr || context().no_record > 0) return;
  // The user's line: a replayed graph node's (a staged function's gradient), else the call's.
  const SrcLoc at = context().loc_override != nullptr ? *context().loc_override : SrcLoc::from(loc);
  if (!rule->unpassed_read.empty()) fail_unpassed_read(rule->unpassed_read, at);
  record_joint("custom_gradient", xs, ys,
               [rule, xs, ys, loc, at](const std::vector<Tensor>& g, ops::Wanted) {
                 std::vector<Tensor> grads = g;
                 for (std::size_t k = 0; k < ys.size(); ++k)
                   if (!grads[k].defined() && is_floating(ys[k].dtype()))
                     grads[k] = fill_on(ys[k].device(), ys[k].shape(), 0.0, ys[k].dtype(), loc);
                 std::vector<Tensor> gs = rule->backward(grads, xs, ys);
                 if (gs.size() != xs.size())
                   fail_at<ValueError>("custom_gradient", at.file, at.line, "gradient rule returned ", gs.size(),
                                       " gradients for ", xs.size(), " inputs");
                 return gs;
               },
               loc);
}

/// ys (what a forward pass computed from xs) as the results of a call differentiated by `rule`:
/// inside a trace a custom_gradient node, which keeps the rule for the staged function's
/// gradient and which plans drop; eagerly fresh identities of ys. Recorded on the tapes.
inline std::vector<Tensor> custom_results(const std::shared_ptr<const CustomRule>& rule, const std::vector<Tensor>& ys,
                                          const std::vector<Tensor>& xs, const std::source_location& loc) {
  TraceState* trace = context().trace;
  bool symbolic = trace != nullptr;
  for (const Tensor& t : ys) symbolic |= t.is_symbolic();
  for (const Tensor& t : xs) symbolic |= t.is_symbolic();
  std::vector<Tensor> outs;
  if (symbolic) {
    if (trace == nullptr)
      fail<StagingError>("custom_gradient", loc, "an input is a symbolic tensor from a finished trace (it escaped its sc::function)");
    outs = trace->custom_gradient(rule, ys, xs, loc);
  } else {
    for (const Tensor& y : ys) outs.push_back(alias_tensor(y, y.shape()));  // fresh identities for the tapes
  }
  record_custom(rule, xs, outs, loc);
  return outs;
}

/// The name of the first trainable variable in r that is not one of xs, or "" (a forward pass may
/// read a trainable variable only through xs: one it reads itself gets no gradient from the rule;
/// TensorFlow raises here too).
inline std::string unpassed_read(const CustomReads& r, const std::vector<Tensor>& xs) {
  for (const auto& v : r.reads) {
    bool passed = false;
    for (const Tensor& x : xs) passed = passed || x.impl()->variable == v.get();
    if (!passed) return v->name;
  }
  return {};
}

/// Runs forward(xs) unrecorded, watching the trainable variables it reads: when a tape records
/// the call eagerly, one that is not among xs raises here; inside a trace (whose gradient may be
/// taken later, or never) the rule keeps their names and recording the call raises.
template <class Ys>
Ys custom_forward(const std::function<Ys(const std::vector<Tensor>&)>& forward, const std::vector<Tensor>& xs,
                  CustomRule& rule, const std::source_location& loc) {
  Context& ctx = context();
  const bool traced = ctx.trace != nullptr && ctx.no_record == 0;
  const bool recorded = ctx.tapes != nullptr && ctx.no_record == 0 && ctx.trace == nullptr;
  CustomReads reads;
  Ys ys;
  {
    GradientTape::StopRecording quiet;
    reads.depth = ctx.no_record;
    struct Watch {  // (restored however forward leaves)
      Context& ctx;
      CustomReads* outer;
      ~Watch() { ctx.custom_reads = outer; }
    } watch{ctx, ctx.custom_reads};
    if (recorded || traced) ctx.custom_reads = &reads;
    ys = forward(xs);
  }
  rule.unpassed_read = unpassed_read(reads, xs);
  if (recorded && !rule.unpassed_read.empty()) fail_unpassed_read(rule.unpassed_read, SrcLoc::from(loc));
  return ys;
}

}  // namespace detail

/// The several-results form, declared for the one-result form below.
inline std::vector<Tensor> custom_gradient(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& forward,
                                           CustomBackwardN backward, const std::vector<Tensor>& xs,
                                           std::source_location loc = std::source_location::current());

/// y = forward(xs), differentiated with `backward` instead of the ops forward ran (which are
/// not recorded). backward is written with ops, so higher-order tapes can differentiate it;
/// the y it receives is the recorded result (same values), so a rule written in terms of y
/// (exp: g * y) has correct higher derivatives too. Inside sc::function the rule is kept: the
/// staged function's gradient runs it (traced into its backward graph), while its plan runs
/// forward's ops as if custom_gradient were not there.
inline Tensor custom_gradient(const std::function<Tensor(const std::vector<Tensor>&)>& forward,
                              CustomBackward backward, const std::vector<Tensor>& xs,
                              std::source_location loc = std::source_location::current()) {
  if (!forward || !backward) detail::fail<ValueError>("custom_gradient", loc, "the forward or backward function is empty");
  return custom_gradient([&forward](const std::vector<Tensor>& in) { return std::vector<Tensor>{forward(in)}; },
                         [backward = std::move(backward)](const std::vector<Tensor>& g, const std::vector<Tensor>& in,
                                                          const std::vector<Tensor>& ys) { return backward(g[0], in, ys[0]); },
                         xs, loc)[0];
}

/// The same for a forward pass with several results: ys = forward(xs), differentiated with
/// backward(grads, xs, ys) -> one gradient per input, called once per backward pass whichever
/// results the loss used (grads holds zeros for the others).
inline std::vector<Tensor> custom_gradient(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& forward,
                                           CustomBackwardN backward, const std::vector<Tensor>& xs,
                                           std::source_location loc) {
  for (const Tensor& x : xs) detail::require_defined(x, "custom_gradient", loc);
  if (!forward || !backward) detail::fail<ValueError>("custom_gradient", loc, "the forward or backward function is empty");
  auto rule = std::make_shared<detail::CustomRule>();
  const std::vector<Tensor> ys = detail::custom_forward(forward, xs, *rule, loc);
  if (ys.empty()) detail::fail<ValueError>("custom_gradient", loc, "the forward function returned no tensors");
  for (const Tensor& y : ys) detail::require_defined(y, "custom_gradient", loc);
  rule->backward = std::move(backward);
  return detail::custom_results(rule, ys, xs, loc);
}

/// The Jacobian of f at x: shape y.shape + x.shape, one backward pass per output element
/// (each seeded with a one-hot output gradient; the forward pass runs once).
inline Tensor jacobian(const std::function<Tensor(const Tensor&)>& f, const Tensor& x,
                       std::source_location loc = std::source_location::current()) {
  detail::require_defined(x, "jacobian", loc);
  GradientTape tape(/*persistent=*/true);
  tape.watch(x, loc);
  const Tensor y = f(x);
  detail::require_defined(y, "jacobian", loc);
  Shape js = y.shape();
  for (auto d : x.shape()) js.push_back(d);
  if (y.numel() == 0 || x.numel() == 0) return detail::fill_on(x.device(), js, 0.0, x.dtype(), loc);
  const Tensor index = arange(y.numel(), loc).to(y.device(), loc);  // (the seeds go where y is)
  std::vector<Tensor> rows;
  rows.reserve(static_cast<std::size_t>(y.numel()));
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    const Tensor seed = reshape(cast(equal(index, i, loc), y.dtype(), loc), y.shape(), loc);
    rows.push_back(reshape(tape.gradient(y, x, seed, loc), {1, x.numel()}, loc));
  }
  return reshape(concat(rows, 0, loc), js, loc);
}

/// The Hessian of scalar-valued f at x times v (same shape as x), by differentiating the
/// gradient's inner product with v (two nested tapes, no Hessian materialised).
inline Tensor hvp(const std::function<Tensor(const Tensor&)>& f, const Tensor& x, const Tensor& v,
                  std::source_location loc = std::source_location::current()) {
  if (v.shape() != x.shape())
    detail::fail<ShapeError>("hvp", loc, "v has shape ", v.shape(), ", x has shape ", x.shape());
  GradientTape outer;
  outer.watch(x, loc);
  Tensor gv;
  {
    GradientTape inner;
    inner.watch(x, loc);
    const Tensor y = f(x);
    gv = sum(inner.gradient(y, x, loc) * v, {}, false, loc);
  }
  return outer.gradient(gv, x, loc);
}

}  // namespace stagecraft
