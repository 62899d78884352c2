// stop_gradient(x): the same values, but no gradient flows back through it.
#pragma once
#include "../eager/dispatch.hpp"

namespace stagecraft {
namespace ops {

/// A view of its input that tapes do not follow (not differentiable, so never recorded).
struct StopGradient {
  SC_OP_HEAD(StopGradient, "stop_gradient")
  static constexpr int arity = 1;
  static constexpr bool differentiable = false;
  static OutMeta infer(Inputs in, const Attrs&, const std::source_location&) { return {in[0].shape(), in[0].dtype()}; }
  static Tensor alias(const Tensor& x, const OutMeta& m) { return detail::alias_tensor(x, m.shape); }
};

}  // namespace ops

/// x's values as a constant: gradients do not flow through the result.
inline Tensor stop_gradient(const Tensor& x, std::source_location loc = std::source_location::current()) {
  return detail::dispatch<ops::StopGradient>({&x, 1}, {}, loc);
}

}  // namespace stagecraft
