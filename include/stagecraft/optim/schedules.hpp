// Learning-rate schedules (Keras's): the rate as a function of the step, computed with ops from
// the optimizer's step counter, so a traced training step follows the schedule at every call
// without a retrace. `opt.set_schedule(sc::optim::CosineDecay(1e-3, 10000))`.
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>
#include <numbers>
#include <optional>
#include <source_location>
#include <vector>

#include "../core/creation.hpp"
#include "../ops/binary.hpp"
#include "../ops/cast.hpp"
#include "../ops/unary.hpp"
#include "../ops/where.hpp"

namespace stagecraft::optim {

/// A learning rate by step. operator() gets the step as an i64 scalar tensor (0 for the first
/// step an optimizer takes) and returns the rate as an f64 scalar on the step's device, with ops
/// only (no value read on the host), so it traces.
class LearningRateSchedule {
 public:
  virtual ~LearningRateSchedule() = default;
  virtual Tensor operator()(const Tensor& step, const std::source_location& loc) const = 0;
  /// The rate at `step`, computed eagerly on the host (for logs and tests).
  double at(std::int64_t step) const {
    return (*this)(scalar<std::int64_t>(step), std::source_location::current()).template item<double>();
  }

 protected:
  /// x, or a ValueError naming the schedule unless lo <= x (lo < x when strict) and x is finite.
  static double checked(double x, double lo, bool strict, const char* schedule, const char* what,
                        const std::source_location& loc) {
    if (!std::isfinite(x) || (strict ? !(x > lo) : !(x >= lo)))
      stagecraft::detail::fail<ValueError>(schedule, loc, what, strict ? " must be finite and > " : " must be finite and >= ",
                                           lo, ", got ", x);
    return x;
  }
  static Tensor as_f64(const Tensor& step, const std::source_location& loc) { return cast(step, DType::f64, loc); }
};

/// initial * decay_rate^(step / decay_steps); with staircase the exponent is rounded down, so
/// the rate drops every decay_steps steps. initial >= 0, decay_steps > 0, decay_rate > 0.
class ExponentialDecay : public LearningRateSchedule {
 public:
  ExponentialDecay(double initial, std::int64_t decay_steps, double decay_rate, bool staircase = false,
                   std::source_location loc = std::source_location::current())
      : initial_(checked(initial, 0, false, "ExponentialDecay", "initial", loc)),
        steps_(static_cast<double>(decay_steps)),
        rate_(checked(decay_rate, 0, true, "ExponentialDecay", "decay_rate", loc)),
        staircase_(staircase) {
    if (decay_steps <= 0)
      stagecraft::detail::fail<ValueError>("ExponentialDecay", loc, "decay_steps must be > 0, got ", decay_steps);
  }
  Tensor operator()(const Tensor& step, const std::source_location& loc) const override {
    Tensor p = div(as_f64(step, loc), steps_, loc);
    if (staircase_) p = cast(cast(p, DType::i64, loc), DType::f64, loc);  // floor (p >= 0)
    return mul(initial_, pow(rate_, p, loc), loc);
  }

 private:
  double initial_, steps_, rate_;
  bool staircase_;
};

/// Cosine decay (Loshchilov & Hutter's SGDR without restarts), as Keras's CosineDecay: from
/// initial down to initial * alpha over decay_steps steps, then constant:
///   initial * ((1 - alpha) * 0.5 * (1 + cos(pi * min(step, decay_steps) / decay_steps)) + alpha).
/// With warmup_steps > 0 the rate first rises linearly from initial to warmup_target over those
/// steps, and the decay then starts from warmup_target.
class CosineDecay : public LearningRateSchedule {
 public:
  CosineDecay(double initial, std::int64_t decay_steps, double alpha = 0, std::optional<double> warmup_target = {},
              std::int64_t warmup_steps = 0, std::source_location loc = std::source_location::current())
      : initial_(checked(initial, 0, false, "CosineDecay", "initial", loc)),
        steps_(static_cast<double>(decay_steps)),
        alpha_(checked(alpha, 0, false, "CosineDecay", "alpha", loc)),
        target_(warmup_target ? checked(*warmup_target, 0, false, "CosineDecay", "warmup_target", loc) : initial),
        warmup_(static_cast<double>(warmup_steps)) {
    if (decay_steps <= 0)
      stagecraft::detail::fail<ValueError>("CosineDecay", loc, "decay_steps must be > 0, got ", decay_steps);
    if (alpha > 1) stagecraft::detail::fail<ValueError>("CosineDecay", loc, "alpha must be <= 1, got ", alpha);
    if (warmup_steps < 0 || (warmup_steps > 0 && !warmup_target))
      stagecraft::detail::fail<ValueError>("CosineDecay", loc, "warmup_steps must be >= 0 and come with a warmup_target, got ",
                                           warmup_steps, warmup_target ? "" : " without a target");
  }
  Tensor operator()(const Tensor& step, const std::source_location& loc) const override {
    const Tensor s = as_f64(step, loc);
    const Tensor after = maximum(sub(s, warmup_, loc), 0.0, loc);  // steps into the decay
    const Tensor frac = div(minimum(after, steps_, loc), steps_, loc);
    const Tensor cosine = mul(0.5, add(1.0, cos(mul(std::numbers::pi, frac, loc), loc), loc), loc);
    const Tensor decayed = mul(target_, add(mul(1 - alpha_, cosine, loc), alpha_, loc), loc);
    if (warmup_ == 0) return decayed;
    const Tensor warm = add(initial_, mul(div(s, warmup_, loc), target_ - initial_, loc), loc);
    return where(less(s, warmup_, loc), warm, decayed, loc);
  }

 private:
  double initial_, steps_, alpha_, target_, warmup_;
};

/// A constant rate between boundaries, as Keras's PiecewiseConstantDecay: values[0] while
/// step <= boundaries[0], values[i] while boundaries[i-1] < step <= boundaries[i], the last value
/// after the last boundary. Boundaries strictly increasing; one more value than boundaries.
class PiecewiseConstantDecay : public LearningRateSchedule {
 public:
  PiecewiseConstantDecay(std::vector<std::int64_t> boundaries, std::vector<double> values,
                         std::source_location loc = std::source_location::current())
      : bounds_(std::move(boundaries)), values_(std::move(values)) {
    if (values_.size() != bounds_.size() + 1)
      stagecraft::detail::fail<ValueError>("PiecewiseConstantDecay", loc, "needs one more value than boundaries, got ",
                                           values_.size(), " values for ", bounds_.size(), " boundaries");
    for (std::size_t i = 1; i < bounds_.size(); ++i)
      if (bounds_[i] <= bounds_[i - 1])
        stagecraft::detail::fail<ValueError>("PiecewiseConstantDecay", loc, "boundaries must increase, got ",
                                             bounds_[i - 1], " then ", bounds_[i]);
    for (double v : values_) checked(v, 0, false, "PiecewiseConstantDecay", "each value", loc);
  }
  Tensor operator()(const Tensor& step, const std::source_location& loc) const override {
    // From the last piece back: where(step <= b_i, v_i, rest).
    Tensor rate = stagecraft::detail::fill_on(step.device(), Shape{}, values_.back(), DType::f64, loc);
    for (std::size_t i = bounds_.size(); i-- > 0;)
      rate = where(less_equal(step, bounds_[i], loc), values_[i], rate, loc);
    return rate;
  }

 private:
  std::vector<std::int64_t> bounds_;
  std::vector<double> values_;
};

}  // namespace stagecraft::optim
