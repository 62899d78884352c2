// nn::softmax, log_softmax, cross_entropy: composites of other ops (so they get gradients,
// tracing and every device from those ops; no loops here).
#pragma once
#include <cstdint>
#include <optional>
#include <source_location>
#include <type_traits>
#include <utility>

#include "../ops/binary.hpp"
#include "../ops/cast.hpp"
#include "../ops/check_range.hpp"
#include "../ops/cross_entropy.hpp"
#include "../ops/gather.hpp"
#include "../ops/reduce.hpp"
#include "../ops/unary.hpp"
#include "../ops/where.hpp"
#include "composite.hpp"
#include "ids.hpp"

namespace stagecraft::nn {

namespace functional_detail {  // not "detail": that would hide stagecraft::detail inside nn
/// x as a float tensor (integers and bool become f32, as exp would make them).
inline Tensor as_floating(const Tensor& x, const std::source_location& loc) {
  return is_floating(x.dtype()) ? x : cast(x, DType::f32, loc);
}
/// softmax's ops (log_softmax's with `take_log`) on a floating-point x along axis ax, not empty.
inline Tensor softmax_ops(const Tensor& xf, std::int64_t ax, bool take_log, const std::source_location& loc) {
  if (take_log) {
    const Tensor z = sub(xf, stagecraft::detail::logsumexp_shift(xf, {ax}, loc), loc);
    return sub(z, stagecraft::log(sum(exp(z, loc), {ax}, true, loc), loc), loc);
  }
  const Tensor e = exp(sub(xf, max(xf, {ax}, true, loc), loc), loc);
  return mul(e, div(1, sum(e, {ax}, true, loc), loc), loc);
}
/// softmax_ops as a staged function's body (composite.hpp): one traced function per axis and kind.
struct SoftmaxOps {
  std::int64_t axis;
  bool take_log;
  bool operator==(const SoftmaxOps&) const = default;
  Tensor operator()(const Tensor& xf) const { return softmax_ops(xf, axis, take_log, std::source_location::current()); }
};
/// softmax_ops of xf, as one staged function where xf is a large eager CPU tensor (composite.hpp).
/// Called here, not through a pointer that a static initialiser sets: such an initialiser made
/// every file that included the umbrella header compile the tracing JIT, whatever it called.
inline Tensor softmax_any(const Tensor& xf, std::int64_t ax, bool take_log, const std::source_location& loc) {
  if (std::optional<Tensor> r = composite_detail::run(SoftmaxOps{ax, take_log}, take_log ? "log_softmax" : "softmax",
                                                      loc, xf))
    return *std::move(r);
  return softmax_ops(xf, ax, take_log, loc);
}
}  // namespace functional_detail

/// exp(x) / sum(exp(x)) along axis, computed as softmax(x - max(x)) so large values do not
/// overflow, and each exp multiplied by its row's 1 / sum (as PyTorch does: one division per row,
/// not per element). Integer inputs become f32. On a large CPU tensor the ops run as one staged
/// function (nn/composite.hpp).
inline Tensor softmax(const Tensor& x, std::int64_t axis = -1,
                      std::source_location loc = std::source_location::current()) {
  stagecraft::detail::require_defined(x, "softmax", loc);
  const std::int64_t ax = normalize_axis(axis, x.rank(), "softmax", loc);
  const Tensor xf = functional_detail::as_floating(x, loc);
  if (x.shape()[static_cast<int>(ax)] == 0) return xf;  // nothing to normalise (and no max)
  return functional_detail::softmax_any(xf, ax, false, loc);
}

/// log(softmax(x)) along axis, as (x - shift) - log(sum(exp(x - shift))) with shift = max(x):
/// stable for large values, exact where softmax would underflow to 0, and no cancellation when
/// x is large (x - (shift + log sum) loses log 2 next to 1e7 in f32). Integer inputs become f32.
inline Tensor log_softmax(const Tensor& x, std::int64_t axis = -1,
                          std::source_location loc = std::source_location::current()) {
  stagecraft::detail::require_defined(x, "log_softmax", loc);
  const std::int64_t ax = normalize_axis(axis, x.rank(), "log_softmax", loc);
  const Tensor xf = functional_detail::as_floating(x, loc);
  if (x.shape()[static_cast<int>(ax)] == 0) return xf;
  return functional_detail::softmax_any(xf, ax, true, loc);
}

/// Mean over the batch of -log_softmax(logits)[i, labels[i]]: logits [N, C] (f32/f64),
/// labels [N] (i32/i64) in [0, C). Labels out of range are a ValueError (checked when they
/// are concrete); float labels a DTypeError; mismatched shapes a ShapeError.
inline Tensor cross_entropy(const Tensor& logits, const Tensor& labels,
                            std::source_location loc = std::source_location::current()) {
  constexpr std::string_view op = "cross_entropy";
  stagecraft::detail::require_defined(logits, op, loc);
  stagecraft::detail::require_defined(labels, op, loc);
  ops::xent::check_inputs(op, logits, labels, loc);  // the op's own checks, named as this function
  functional_detail::check_ids(labels, logits.shape()[1], "cross_entropy", "label", false, loc);
  // One op (and one for its gradient): symbolic labels (a staged step) are checked by its kernel
  // when the plan runs, and labels on a GPU by the GPU's (raised at the next wait, as a bad gather
  // index). Its numbers are log_softmax's: (x - shift) - log(sum(exp(x - shift))) at the label.
  return stagecraft::detail::softmax_cross_entropy(logits, labels, loc);
}

}  // namespace stagecraft::nn
