// nn::mse_loss and nn::binary_cross_entropy_with_logits: losses written with other ops (so they get
// gradients, tracing and every device from them). cross_entropy (softmax over classes) is in
// functional.hpp. Each is the mean over every element.
#pragma once
#include <source_location>
#include <string_view>

#include "../ops/binary.hpp"
#include "../ops/cast.hpp"
#include "../ops/reduce.hpp"
#include "../ops/unary.hpp"
#include "functional.hpp"

namespace stagecraft::nn {

namespace functional_detail {
/// Both defined and of one shape: a loss does not broadcast its operands (predictions [N, 1]
/// against targets [N] would silently average an [N, N] table).
inline void require_same_shape(const Tensor& a, const Tensor& b, std::string_view op, std::string_view an,
                               std::string_view bn, const std::source_location& loc) {
  stagecraft::detail::require_defined(a, op, loc);
  stagecraft::detail::require_defined(b, op, loc);
  if (SC_UNLIKELY(a.shape() != b.shape()))
    stagecraft::detail::fail<ShapeError>(op, loc, an, " and ", bn, " must have the same shape (a loss does not "
                                         "broadcast), got ", a.shape(), " and ", b.shape());
}
}  // namespace functional_detail

/// mean((pred - target)^2) over every element. pred and target have one shape; integers become
/// f32 and the dtypes promote.
inline Tensor mse_loss(const Tensor& pred, const Tensor& target,
                       std::source_location loc = std::source_location::current()) {
  constexpr std::string_view op = "mse_loss";
  functional_detail::require_same_shape(pred, target, op, "pred", "target", loc);
  ops::require_dtype(!is_bool(pred.dtype()), op, pred.dtype(), "numeric dtypes", loc);
  ops::require_dtype(!is_bool(target.dtype()), op, target.dtype(), "numeric dtypes", loc);
  const Tensor d = sub(functional_detail::as_floating(pred, loc), functional_detail::as_floating(target, loc), loc);
  return mean(square(d, loc), {}, false, loc);
}

/// The mean over every element of -(z log sigmoid(x) + (1 - z) log(1 - sigmoid(x))), logits x
/// and targets z in [0, 1] (probabilities, or 0/1 labels of any dtype) of one shape, computed as
/// max(x, 0) - x z + log1p(e^-|x|): no overflow for large |x| (TensorFlow's
/// sigmoid_cross_entropy_with_logits, PyTorch's binary_cross_entropy_with_logits). Targets take
/// the logits' float dtype.
inline Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& targets,
                                               std::source_location loc = std::source_location::current()) {
  constexpr std::string_view op = "binary_cross_entropy_with_logits";
  functional_detail::require_same_shape(logits, targets, op, "logits", "targets", loc);
  ops::require_dtype(is_floating(logits.dtype()), op, logits.dtype(), "float logits (f32 or f64)", loc);
  const Tensor z = targets.dtype() == logits.dtype() ? targets : cast(targets, logits.dtype(), loc);
  const Tensor per = add(sub(maximum(logits, 0, loc), mul(logits, z, loc), loc),
                         log1p(exp(neg(abs(logits, loc), loc), loc), loc), loc);
  return mean(per, {}, false, loc);
}

}  // namespace stagecraft::nn
