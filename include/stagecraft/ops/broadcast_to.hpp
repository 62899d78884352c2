// broadcast_to(x, shape): a materialised broadcast.
#pragma once
#include "reshape.hpp"  // layout::shape_attrs
#include "transpose.hpp"

namespace stagecraft {
namespace ops {

/// x repeated along its size-1 (and missing leading) axes to the target shape, as a new
/// contiguous tensor. Reads attrs.ints (the target shape).
struct BroadcastTo {
  SC_OP_HEAD(BroadcastTo, "broadcast_to")
  static constexpr int arity = 1;

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    const Shape& xs = in[0].shape();
    for (std::int64_t d : a.ints)
      if (SC_UNLIKELY(d < 0))
        detail::fail<ShapeError>(name, loc, "negative extent in target shape ", a.ints);
    // The one broadcasting rule (core/shape), plus: the target must be the result, so x may
    // not stretch it (x [3] does not broadcast to [1]) and its rank may not exceed it.
    Shape joint;
    if (SC_UNLIKELY(xs.rank() > a.ints.rank() || !broadcast_shapes(xs, a.ints, joint) || !(joint == a.ints)))
      detail::fail<ShapeError>(name, loc, "cannot broadcast shape ", xs, " to ", a.ints,
                               ": each axis of the input, aligned from the right, must be 1 or match");
    return {a.ints, in[0].dtype()};
  }
  static void cpu(Inputs in, Tensor& out, const Attrs&) {
    backend::cpu::strided_copy(in[0].raw_data(), out.raw_data(), out.shape(),
                               broadcast_strides(in[0].shape(), out.shape()), out.dtype());
  }
  static void cuda(Inputs in, Tensor& out, const Attrs&, const std::source_location& loc) {
    backend::cuda::strided_copy(in[0].raw_data(), out.shape(), broadcast_strides(in[0].shape(), out.shape()),
                                out.raw_data(), contiguous_strides(out.shape()), out.dtype(), out.device(), name, loc);
  }
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};

}  // namespace ops

/// A new tensor of the given shape holding x broadcast to it (NumPy's rule: x's axes, aligned
/// from the right, are 1 or equal to the target's; missing leading axes are added).
inline Tensor broadcast_to(const Tensor& x, Shape shape, std::source_location loc = std::source_location::current()) {
  return detail::dispatch<ops::BroadcastTo>({&x, 1}, ops::layout::shape_attrs(shape), loc);
}

}  // namespace stagecraft

// ---- gradient rule --------------------------------------------------------------------------
// It sums, and sum's rule feeds broadcasts: each header includes the other here, after its own
// declarations, so whichever comes first every function a rule names is declared.
#include "reduce.hpp"

namespace stagecraft {

// Each input element was copied to every position along the added leading axes and the
// stretched size-1 axes, so its gradient is the sum over them: one sum keeping those axes,
// then a view dropping the leading ones.
inline std::vector<Tensor> ops::BroadcastTo::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs&) {
  const Shape& xs = in[0].shape();
  const Shape& gs = g.shape();
  const int lead = gs.rank() - xs.rank();
  std::vector<std::int64_t> axes;
  for (int i = 0; i < gs.rank(); ++i)
    if (i < lead || (xs[i - lead] == 1 && gs[i] != 1)) axes.push_back(i);
  if (axes.empty()) return {g};
  const Tensor s = sum(g, axes, true);
  return {lead > 0 ? reshape(s, xs) : s};
}

}  // namespace stagecraft
