// fill(shape, value, dtype): a constant tensor made by an op, so that a trace records a node
// (a few bytes of attributes) instead of freezing a buffer of ones or zeros into the graph.
#pragma once
#include <source_location>

#include "../backend/cpu/parallel.hpp"
#include "../core/creation.hpp"  // check_shape
#include "rules.hpp"  // batch_cast: defined float-to-integer conversions
#include "../eager/dispatch.hpp"

namespace stagecraft {
namespace ops {

/// Every element `value` converted to the dtype (to bool: value != 0). No inputs, so no
/// gradient. Reads attrs.ints (the shape), attrs.scalar (the value) and attrs.dtype.
struct Fill {
  SC_OP_HEAD(Fill, "fill")
  static constexpr int arity = 0;
  static constexpr bool differentiable = false;

  static OutMeta infer(Inputs, const Attrs& a, const std::source_location& loc) {
    check_shape(a.ints, name, loc);
    return {a.ints, a.dtype};
  }
  static void cuda(Inputs, Tensor& out, const Attrs& a, const std::source_location& loc) {
    backend::cuda::fill(out, a.scalar, name, loc);
  }
  static void cpu(Inputs, Tensor& out, const Attrs& a) {
    visit_dtype(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T v = rules::math::batch_cast<T>(a.scalar);  // NaN/out of range: T's lowest, as cast() and full()
      T* y = static_cast<T*>(out.raw_data());
      backend::cpu::parallel_for(out.numel(), backend::cpu::grain_cheap, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) y[i] = v;
      });
    });
  }
};

}  // namespace ops

namespace detail {

/// A tensor of `shape` with every element `value` in dtype d, made by the Fill op on the
/// DeviceScope's device (else the CPU). Gradient rules use it for their ones and zeros: traced,
/// it is a node, where sc::full/zeros/ones (concrete on purpose) would be a frozen constant.
inline Tensor fill(Shape shape, double value, DType d,
                   const std::source_location& loc = std::source_location::current()) {
  ops::Attrs a;
  a.ints = std::move(shape);
  a.scalar = value;
  a.dtype = d;
  return dispatch<ops::Fill>({}, a, loc);
}

/// As fill, on device d when it is a GPU: a gradient seed or zero goes where its tensor lives (on
/// the CPU it follows the DeviceScope, as fill does).
inline Tensor fill_on(Device d, Shape shape, double value, DType dt,
                      const std::source_location& loc = std::source_location::current()) {
  if (d.is_cpu()) return fill(std::move(shape), value, dt, loc);
  const DeviceScope on(d);
  return fill(std::move(shape), value, dt, loc);
}

}  // namespace detail
}  // namespace stagecraft
