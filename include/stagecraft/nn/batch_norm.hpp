// nn::batch_norm and the nn::BatchNorm layer (Ioffe & Szegedy 2015; PyTorch's BatchNorm1d/2d
// semantics): written with other ops (mean, sqrt, where the statistics are kept: variable
// assignments), so they get gradients, tracing and every device from those ops.
#pragma once
#include <cmath>
#include <cstdint>
#include <source_location>
#include <string_view>
#include <vector>

#include "../autodiff/tape.hpp"
#include "../ops/binary.hpp"
#include "../ops/cast.hpp"
#include "../ops/reduce.hpp"
#include "../ops/reshape.hpp"
#include "../ops/unary.hpp"
#include "../state/module.hpp"
#include "functional.hpp"

namespace stagecraft::nn {

namespace batch_norm_detail {
/// Checks x [N, C, ...] (rank >= 2) against C channels; every axis but 1, and the shape [1, C, 1...]
/// per-channel values broadcast from.
struct Layout {
  std::vector<std::int64_t> axes;
  Shape channel_shape;
  std::int64_t per_channel = 1;  // values each channel's statistics are taken over
};
inline Layout layout(const Tensor& x, std::int64_t channels, std::string_view op, const std::source_location& loc) {
  stagecraft::detail::require_defined(x, op, loc);
  ops::require_dtype(!is_bool(x.dtype()), op, x.dtype(), "numeric dtypes", loc);
  if (SC_UNLIKELY(x.rank() < 2 || x.shape()[1] != channels))
    stagecraft::detail::fail<ShapeError>(op, loc, "expects x of shape [N, ", channels, ", ...] (channels on axis 1), got ",
                                         x.shape());
  Layout l;
  std::vector<std::int64_t> dims(static_cast<std::size_t>(x.rank()), 1);
  dims[1] = channels;
  l.channel_shape = Shape(dims);
  for (int i = 0; i < x.rank(); ++i)
    if (i != 1) {
      l.axes.push_back(i);
      l.per_channel *= x.shape()[i];
    }
  return l;
}
inline void check_affine(const Tensor& t, std::int64_t channels, std::string_view name, std::string_view op,
                         const std::source_location& loc) {
  if (t.defined() && SC_UNLIKELY(t.shape() != Shape{channels}))
    stagecraft::detail::fail<ShapeError>(op, loc, name, " must have shape [", channels, "], got ", t.shape());
}
/// (x - mean) * (1 / sqrt(var + eps)) * gamma + beta, the per-channel values shaped to broadcast.
inline Tensor normalize(const Tensor& xf, const Tensor& mean_c, const Tensor& var_c, const Tensor& gamma,
                        const Tensor& beta, double eps, const Layout& l, const std::source_location& loc) {
  Tensor scale = div(1, sqrt(add(var_c, eps, loc), loc), loc);
  if (gamma.defined()) scale = mul(scale, reshape(gamma, l.channel_shape, loc), loc);
  Tensor y = mul(sub(xf, mean_c, loc), scale, loc);
  if (beta.defined()) y = add(y, reshape(beta, l.channel_shape, loc), loc);
  return y;
}
inline void check_eps(double eps, std::string_view op, const std::source_location& loc) {
  if (SC_UNLIKELY(!std::isfinite(eps) || eps < 0))
    stagecraft::detail::fail<ValueError>(op, loc, "eps must be finite and >= 0, got ", eps);
}
}  // namespace batch_norm_detail

/// Batch normalization with the batch's own statistics (training mode): each channel (axis 1 of
/// x [N, C, ...]) normalized by the mean and the population variance of its values over every
/// other axis, then * gamma + beta where given ([C] each, or undefined). Integers become f32.
/// Gradients flow through the statistics. A channel of one value has no spread: a ValueError.
inline Tensor batch_norm(const Tensor& x, const Tensor& gamma = Tensor(), const Tensor& beta = Tensor(), double eps = 1e-5,
                         std::source_location loc = std::source_location::current()) {
  constexpr std::string_view op = "batch_norm";
  stagecraft::detail::require_defined(x, op, loc);
  if (SC_UNLIKELY(x.rank() < 2))
    stagecraft::detail::fail<ShapeError>(op, loc, "expects x of shape [N, C, ...] (channels on axis 1), got ", x.shape());
  const std::int64_t channels = x.shape()[1];
  const auto l = batch_norm_detail::layout(x, channels, op, loc);
  batch_norm_detail::check_affine(gamma, channels, "gamma", op, loc);
  batch_norm_detail::check_affine(beta, channels, "beta", op, loc);
  batch_norm_detail::check_eps(eps, op, loc);
  if (SC_UNLIKELY(l.per_channel < 2))
    stagecraft::detail::fail<ValueError>(op, loc, "needs more than one value per channel, got x ", x.shape());
  const Tensor xf = functional_detail::as_floating(x, loc);
  const Tensor m = mean(xf, l.axes, true, loc);
  const Tensor v = mean(square(sub(xf, m, loc), loc), l.axes, true, loc);
  return batch_norm_detail::normalize(xf, m, v, gamma, beta, eps, l, loc);
}

/// Batch normalization as a layer over the channels on axis 1 ([N, C] after a Dense layer,
/// [N, C, H, W] after a Conv2D), PyTorch's BatchNorm1d/2d: a learned scale gamma (ones) and shift
/// beta (zeros), and running statistics (non-trainable variables "moving_mean", zeros, and
/// "moving_variance", ones, saved by checkpoints). While training (the default) it normalizes by
/// the batch's mean and population variance and moves the running ones toward the batch's:
///   moving = (1 - momentum) * moving + momentum * batch   (the variance's unbiased, n / (n - 1))
/// After `bn.eval()` (or `bn(x, false)`) it normalizes by the running statistics. Inside
/// sc::function the updates are assignments of the traced step, made at every call; the mode is
/// read when the function is traced, so pass it as an argument (`[&](sc::Tensor x, bool training)
/// { return bn(x, training); }`: one trace per value) where one function serves both.
class BatchNorm : public Module {
 public:
  explicit BatchNorm(std::int64_t channels, double momentum = 0.1, double eps = 1e-5, DType dtype = DType::f32,
                     std::source_location loc = std::source_location::current())
      : channels_(channels), momentum_(momentum), eps_(eps) {
    if (SC_UNLIKELY(channels < 1))
      stagecraft::detail::fail<ValueError>("BatchNorm", loc, "needs at least one channel, got ", channels);
    if (SC_UNLIKELY(!(momentum >= 0 && momentum <= 1)))
      stagecraft::detail::fail<ValueError>("BatchNorm", loc, "momentum must be in [0, 1], got ", momentum);
    batch_norm_detail::check_eps(eps, "BatchNorm", loc);
    const Shape s{channels};
    gamma = Variable(stagecraft::ones(s, dtype, loc), "gamma", true, loc);
    beta = Variable(stagecraft::zeros(s, dtype, loc), "beta", true, loc);
    moving_mean = Variable(stagecraft::zeros(s, dtype, loc), "moving_mean", false, loc);
    moving_variance = Variable(stagecraft::ones(s, dtype, loc), "moving_variance", false, loc);
    add({{"gamma", gamma}, {"beta", beta}, {"moving_mean", moving_mean}, {"moving_variance", moving_variance}}, loc);
  }

  Tensor operator()(const Tensor& x, std::source_location loc = std::source_location::current()) {
    return (*this)(x, training_, loc);
  }
  Tensor operator()(const Tensor& x, bool training, std::source_location loc = std::source_location::current()) {
    constexpr std::string_view op = "BatchNorm";
    const auto l = batch_norm_detail::layout(x, channels_, op, loc);
    const Tensor xf = functional_detail::as_floating(x, loc);
    if (!training)
      return batch_norm_detail::normalize(xf, reshape(moving_mean, l.channel_shape, loc),
                                          reshape(moving_variance, l.channel_shape, loc), gamma, beta, eps_, l, loc);
    if (SC_UNLIKELY(l.per_channel < 2))
      stagecraft::detail::fail<ValueError>(op, loc, "needs more than one value per channel while training, got x ",
                                           x.shape(), " (evaluate with bn.eval() or bn(x, false))");
    const Tensor m = mean(xf, l.axes, true, loc);
    const Tensor v = mean(square(sub(xf, m, loc), loc), l.axes, true, loc);
    {
      GradientTape::StopRecording quiet;  // the running statistics are state, not part of a gradient
      const auto n = static_cast<double>(l.per_channel);
      const Tensor batch_mean = reshape(m, Shape{channels_}, loc);
      const Tensor batch_var = mul(reshape(v, Shape{channels_}, loc), n / (n - 1), loc);
      const DType d = moving_mean.dtype();
      moving_mean.assign(add(mul(moving_mean, 1 - momentum_, loc), mul(cast(batch_mean, d, loc), momentum_, loc), loc), loc);
      moving_variance.assign(
          add(mul(moving_variance, 1 - momentum_, loc), mul(cast(batch_var, d, loc), momentum_, loc), loc), loc);
    }
    return batch_norm_detail::normalize(xf, m, v, gamma, beta, eps_, l, loc);
  }

  /// Training mode (batch statistics, running ones updated) or evaluation mode (running ones).
  void train(bool on = true) { training_ = on; }
  void eval() { training_ = false; }
  bool training() const { return training_; }
  std::int64_t channels() const { return channels_; }
  double momentum() const { return momentum_; }
  double eps() const { return eps_; }

  Variable gamma;            ///< [C], starts at 1 (trainable)
  Variable beta;             ///< [C], starts at 0 (trainable)
  Variable moving_mean;      ///< [C], starts at 0 (not trainable)
  Variable moving_variance;  ///< [C], starts at 1 (not trainable)

 private:
  std::int64_t channels_;
  double momentum_, eps_;
  bool training_ = true;
};

}  // namespace stagecraft::nn
