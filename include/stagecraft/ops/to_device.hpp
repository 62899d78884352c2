// to(x, device): x's values on another device, as an op, so that tapes carry gradients across
// devices (the gradient goes back to x's device) and traces record the copy as a node (a
// traced function may move a value it computed, not only its arguments). Included at the end
// of eager/dispatch.hpp: Tensor::to is defined here, beside the op it calls.
#pragma once
#include <cstring>
#include <source_location>
#include <vector>

#include "../eager/dispatch.hpp"

namespace stagecraft {
namespace ops {

/// Reads attrs.i0 (the target's kind: 0 the CPU, 1 a CUDA device) and attrs.i1 (its index):
/// the device is an attribute, so a graph's node says where its copy goes, CSE keeps copies to
/// two devices apart, and saved functions keep it. Copies between a GPU and the host are
/// ordered with the GPU's stream: to the host waits for the work that makes x, from the host
/// returns once x's bytes are staged.
struct ToDevice {
  SC_OP_HEAD(ToDevice, "to")
  static constexpr int arity = 1;

  static Attrs attrs_for(Device d) {
    Attrs a;
    a.i0 = static_cast<std::int64_t>(d.kind());
    a.i1 = d.index();
    return a;
  }
  /// The device attrs name (checked by infer).
  static Device target(const Attrs& a) { return {static_cast<Device::Kind>(a.i0), static_cast<int>(a.i1)}; }

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    if (SC_UNLIKELY(a.i0 < 0 || a.i0 > 1 || a.i1 < 0 || a.i1 > 32767 || (a.i0 == 0 && a.i1 != 0)))
      detail::fail<ValueError>(name, loc, "has no device of kind ", a.i0, " and index ", a.i1,
                               " (i0: 0 the CPU, 1 CUDA; i1: the index)");
    return {in[0].shape(), in[0].dtype()};
  }
  /// The gradient goes back to the input's device (nothing to do when both are one device).
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs&) {
    return {g.to(in[0].device(), std::source_location::current())};
  }
  static void copy(Inputs in, Tensor& out, const std::source_location& loc) {
    const Tensor& x = in[0];
    if (x.nbytes() == 0) return;
    if (x.device().is_cpu() && out.device().is_cpu()) std::memcpy(out.raw_data(), x.raw_data(), x.nbytes());
    else cuda::detail::copy(out.raw_data(), out.device(), x.raw_data(), x.device(), x.nbytes(), name, loc);
  }
  static void cuda(Inputs in, Tensor& out, const Attrs&, const std::source_location& loc) { copy(in, out, loc); }
  static void cpu(Inputs in, Tensor& out, const Attrs&) { copy(in, out, std::source_location::current()); }
};

}  // namespace ops

inline Tensor Tensor::to(Device d, std::source_location loc) const {
  detail::require_defined(*this, "to", loc);
  if (device() == d) return *this;
  const ops::Attrs a = ops::ToDevice::attrs_for(d);
  return detail::dispatch<ops::ToDevice>({this, 1}, a, loc);
}

}  // namespace stagecraft
