// Gradient clipping by norm, as TensorFlow's tf.clip_by_norm, tf.linalg.global_norm and
// tf.clip_by_global_norm: sc::clip_by_norm, sc::global_norm, sc::clip_by_global_norm. Written
// with ops (not ops of their own), so they trace into sc::function, run on every device and have
// gradients.
#pragma once
#include <cmath>
#include <limits>
#include <source_location>
#include <utility>
#include <vector>

#include "add_n.hpp"
#include "binary.hpp"
#include "cast.hpp"
#include "op.hpp"
#include "reduce.hpp"
#include "unary.hpp"
#include "where.hpp"

namespace stagecraft {

namespace detail {
/// clip_norm must be a finite number > 0 (0 would divide 0 by 0 where a norm is 0).
inline void check_clip_norm(double clip_norm, std::string_view op, const std::source_location& loc) {
  if (SC_UNLIKELY(!(clip_norm > 0) || !std::isfinite(clip_norm)))
    fail<ValueError>(op, loc, "clip_norm must be finite and > 0, got ", clip_norm);
}
inline void require_float(const Tensor& t, std::string_view op, const std::source_location& loc) {
  require_defined(t, op, loc);
  ops::require_dtype(is_floating(t.dtype()), op, t.dtype(), "floating tensors", loc);
}
}  // namespace detail

/// t rescaled so that its L2 norm over `axes` ({} = all elements) is at most clip_norm:
/// t * clip_norm / max(norm, clip_norm), each slice on its own when axes are given (the norms
/// keep their dims, so they broadcast back). A slice within the bound is unchanged; a zero slice
/// stays zero, with a finite gradient. t is f32 or f64; clip_norm finite and > 0.
inline Tensor clip_by_norm(const Tensor& t, double clip_norm, std::vector<std::int64_t> axes = {},
                           std::source_location loc = std::source_location::current()) {
  detail::require_float(t, "clip_by_norm", loc);
  detail::check_clip_norm(clip_norm, "clip_by_norm", loc);
  const Tensor squares = sum(mul(t, t, loc), std::move(axes), /*keepdims=*/true, loc);
  const Tensor positive = greater(squares, 0.0, loc);
  // sqrt only where the sum is positive: its gradient at 0 is infinite (TensorFlow's way).
  const Tensor norm = where(positive, sqrt(where(positive, squares, 1.0, loc), loc), squares, loc);
  return div(mul(t, clip_norm, loc), maximum(norm, clip_norm, loc), loc);
}

/// sqrt(sum of every element squared, over all the tensors): the L2 norm of them taken as one
/// vector. Undefined tensors (Tensor()) are skipped; at least one must be defined. Float tensors;
/// f32 and f64 mixed give an f64 norm. The result is a scalar on the first tensor's device.
inline Tensor global_norm(const std::vector<Tensor>& ts, std::source_location loc = std::source_location::current()) {
  std::vector<Tensor> squares;
  DType dt = DType::f32;
  for (const Tensor& t : ts) {
    if (!t.defined()) continue;
    detail::require_float(t, "global_norm", loc);
    dt = promote(dt, t.dtype());
    squares.push_back(sum(mul(t, t, loc), {}, false, loc));
  }
  if (SC_UNLIKELY(squares.empty()))
    detail::fail<ValueError>("global_norm", loc, "needs at least one defined tensor, got ", ts.size(), " undefined");
  const Device dev = squares.front().device();
  for (Tensor& s : squares) {
    if (s.dtype() != dt) s = cast(s, dt, loc);
    if (s.device() != dev) s = s.to(dev, loc);
  }
  return sqrt(squares.size() == 1 ? squares.front() : add_n(squares, loc), loc);
}

/// The tensors scaled by clip_norm / max(global_norm(ts), clip_norm), and that global norm
/// (TensorFlow's tf.clip_by_global_norm): their joint norm is at most clip_norm and their
/// directions are kept. Undefined tensors stay undefined. A global norm of inf or NaN makes every
/// result NaN (as TensorFlow: a step with it would ruin the variables anyway; check the norm).
/// `auto [clipped, norm] = sc::clip_by_global_norm(grads, 5.0);`
inline std::pair<std::vector<Tensor>, Tensor> clip_by_global_norm(const std::vector<Tensor>& ts, double clip_norm,
                                                                  std::source_location loc = std::source_location::current()) {
  detail::check_clip_norm(clip_norm, "clip_by_global_norm", loc);
  Tensor norm = global_norm(ts, loc);
  // clip_norm / max(norm, clip_norm): exactly 1 for a norm within the bound (0 included).
  const Tensor finite_scale = div(clip_norm, maximum(norm, clip_norm, loc), loc);
  const Tensor finite = less(abs(norm, loc), std::numeric_limits<double>::infinity(), loc);  // false for NaN
  const Tensor scale = where(finite, finite_scale, std::numeric_limits<double>::quiet_NaN(), loc);
  std::vector<Tensor> clipped;
  clipped.reserve(ts.size());
  for (const Tensor& t : ts) {
    if (!t.defined()) {
      clipped.emplace_back();
      continue;
    }
    Tensor s = scale.dtype() == t.dtype() ? scale : cast(scale, t.dtype(), loc);
    if (s.device() != t.device()) s = s.to(t.device(), loc);
    clipped.push_back(mul(t, s, loc));
  }
  return {std::move(clipped), std::move(norm)};
}

}  // namespace stagecraft
