// custom_gradient, and jacobian / hessian-vector products built on the tape.
#pragma once
#include <functional>
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

/// y = forward(xs), differentiated with `backward` instead of the ops forward ran (which are
/// not recorded). backward is written with ops, so higher-order tapes can differentiate it;
/// the y it receives is the recorded result (same values), so a rule written in terms of y
/// (exp: g * y) has correct higher derivatives too.
inline Tensor custom_gradient(const std::function<Tensor(const std::vector<Tensor>&)>& forward,
                              CustomBackward backward, const std::vector<Tensor>& xs,
                              std::source_location loc = std::source_location::current()) {
  for (const Tensor& x : xs) detail::require_defined(x, "custom_gradient", loc);
  Tensor y;
  {
    GradientTape::StopRecording quiet;
    y = forward(xs);
  }
  detail::require_defined(y, "custom_gradient", loc);
  Tensor out = detail::alias_tensor(y, y.shape());  // a fresh identity for the tape
  detail::record_custom("custom_gradient", xs, out,
                        [backward = std::move(backward), xs, out](const Tensor& g) { return backward(g, xs, out); }, loc);
  return out;
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
