// sc::host_fn: arbitrary C++ on concrete tensors inside a staged function (TensorFlow's
// py_func), run at every call of the plan, with an optional gradient.
#pragma once
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "control_flow.hpp"
#include "trace.hpp"

namespace stagecraft {
namespace graph::detail_host {

std::vector<Tensor> call(const std::shared_ptr<const HostFn>& h, const std::vector<Tensor>& inputs,
                         const std::source_location& loc);

/// Records h's gradient (when it has one) on the tapes watching inputs: one entry for all its
/// float outputs, so h's gradient runs once per backward pass.
STAGECRAFT_COMPILED_INLINE void record_gradient(const std::shared_ptr<const HostFn>& h,
                                                const std::vector<Tensor>& inputs, const std::vector<Tensor>& outs,
                                                const std::source_location& loc);
STAGECRAFT_COMPILED_INLINE std::vector<Tensor> call(const std::shared_ptr<const HostFn>& h,
                                                    const std::vector<Tensor>& inputs, const std::source_location& loc);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE void record_gradient(const std::shared_ptr<const HostFn>& h,
                                                const std::vector<Tensor>& inputs, const std::vector<Tensor>& outs,
                                                const std::source_location& loc) {
  if (!h->grad || stagecraft::detail::context().tapes == nullptr) return;
  const std::size_t ni = inputs.size(), no = outs.size();
  auto vjp = [h, inputs, outs, ni, no, loc](const std::vector<Tensor>& g, ops::Wanted) {
    // The gradient is host code too: a host_fn over (inputs, outputs, the outputs' gradients),
    // those no gradient reached given as zeros.
    auto grad_fn = std::make_shared<HostFn>();
    grad_fn->pure = true;  // (dropped where no gradient through it is wanted)
    grad_fn->fn = [h, ni, no](const std::vector<Tensor>& a) {
      const std::vector<Tensor> in(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(ni));
      const std::vector<Tensor> out(a.begin() + static_cast<std::ptrdiff_t>(ni), a.begin() + static_cast<std::ptrdiff_t>(ni + no));
      const std::vector<Tensor> og(a.begin() + static_cast<std::ptrdiff_t>(ni + no), a.end());
      std::vector<Tensor> gi = h->grad(in, out, og);
      gi.resize(ni);
      for (std::size_t j = 0; j < ni; ++j)
        if (!gi[j].defined()) gi[j] = zeros(in[j].shape(), in[j].dtype());
      return gi;
    };
    for (const Tensor& t : inputs) grad_fn->outputs.push_back({t.shape(), t.dtype()});
    std::vector<Tensor> args = inputs;
    args.insert(args.end(), outs.begin(), outs.end());
    for (std::size_t j = 0; j < no; ++j) args.push_back(g[j].defined() ? g[j] : detail_cf::zeros_like(outs[j], loc));
    std::vector<Tensor> gi = call(grad_fn, args, loc);
    for (std::size_t j = 0; j < ni; ++j)
      if (!is_floating(inputs[j].dtype())) gi[j] = Tensor();
    return gi;
  };
  stagecraft::detail::record_joint("host_fn", inputs, outs, std::move(vjp), loc);
}

STAGECRAFT_COMPILED_INLINE std::vector<Tensor> call(const std::shared_ptr<const HostFn>& h,
                                                    const std::vector<Tensor>& given,
                                                    const std::source_location& loc) {
  for (const Tensor& t : given) stagecraft::detail::require_defined(t, "host_fn", loc);
  // The function reads its inputs on the host: one on another device is moved first, by `to`
  // (an op: traced as a node, and the tape carries gradients back across it).
  std::vector<Tensor> moved;
  const bool elsewhere = std::any_of(given.begin(), given.end(), [](const Tensor& t) { return !t.device().is_cpu(); });
  if (elsewhere)
    for (const Tensor& t : given) moved.push_back(t.to(Device::cpu(), loc));
  const std::vector<Tensor>& inputs = elsewhere ? moved : given;
  bool symbolic = stagecraft::detail::context().trace != nullptr;
  for (const Tensor& t : inputs) symbolic |= t.is_symbolic();
  std::vector<Tensor> outs;
  if (!symbolic) {
    outs = h->run(inputs, SrcLoc::from(loc), loc);
  } else {
    GraphBuilder* b = current_builder();
    if (b == nullptr)
      stagecraft::detail::fail<StagingError>("host_fn", loc, "an input is a symbolic tensor from a finished trace (it escaped its sc::function)");
    Node n;
    n.kind = NodeKind::host_fn;
    n.host = h;
    for (const Tensor& t : detail_cf::lifted(inputs, loc)) n.inputs.push_back(b->value_of(t));
    outs = b->append_node(std::move(n), h->outputs, Device::cpu(), loc);
  }
  record_gradient(h, inputs, outs, loc);
  return outs;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace graph::detail_host

/// Runs fn (any C++) on concrete CPU tensors (inputs on a GPU are moved to the host first, and
/// outputs fn makes elsewhere are moved there: host_fn's results live on the CPU); inside
/// sc::function it becomes a node that runs fn at every call of the plan. `outputs` describes
/// what fn returns (checked at every call).
/// `grad(inputs, outputs, output_grads)` -> input gradients (undefined: none) makes it
/// differentiable, with one call per backward pass whichever outputs the loss used (those it
/// did not get zero gradients); without it no gradient flows through fn, eager or staged (the
/// ops fn runs are not recorded on the tapes around it). A graph holding a host_fn cannot be saved.
STAGECRAFT_COMPILED_INLINE std::vector<Tensor> host_fn(std::function<std::vector<Tensor>(const std::vector<Tensor>&)> fn,
                                                       std::vector<Tensor> inputs, std::vector<TensorSpec> outputs,
                                                       graph::HostFn::Grad grad = {},
                                                       std::source_location loc = std::source_location::current());
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::vector<Tensor> host_fn(std::function<std::vector<Tensor>(const std::vector<Tensor>&)> fn,
                                                       std::vector<Tensor> inputs, std::vector<TensorSpec> outputs,
                                                       graph::HostFn::Grad grad, std::source_location loc) {
  if (!fn) stagecraft::detail::fail<ValueError>("host_fn", loc, "the function is empty");
  auto h = std::make_shared<graph::HostFn>();
  h->fn = std::move(fn);
  h->grad = std::move(grad);
  h->outputs = std::move(outputs);
  return graph::detail_host::call(h, inputs, loc);
}
#endif  // STAGECRAFT_DEFINE_COMPILED

namespace graph::detail_interp {
STAGECRAFT_COMPILED_INLINE std::vector<Tensor> replay_host_fn(const Node& n, const std::vector<Tensor>& ins);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::vector<Tensor> replay_host_fn(const Node& n, const std::vector<Tensor>& ins) {
  return detail_host::call(n.host, ins, std::source_location::current());
}
#endif  // STAGECRAFT_DEFINE_COMPILED
}  // namespace graph::detail_interp

}  // namespace stagecraft
