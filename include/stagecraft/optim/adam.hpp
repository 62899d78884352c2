// optim::Adam: adaptive moment estimation with bias correction.
#pragma once
#include <array>
#include <cmath>
#include <source_location>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../ops/binary.hpp"
#include "../ops/cast.hpp"
#include "../ops/unary.hpp"
#include "fused.hpp"
#include "optimizer.hpp"

namespace stagecraft::optim {

/// Adam (Kingma & Ba 2015) in TensorFlow's form: slots "m" and "v" per variable, starting
/// at 0; at step t (1-based)
///   m = m + (1 - beta1) * (g - m)          v = v + (1 - beta2) * (g² - v)
///   w -= lr_t * m / (sqrt(v) + eps)        lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
/// The bias correction is folded into lr_t, so eps is added to the uncorrected sqrt(v)
/// (PyTorch adds it to the corrected one; the two agree up to a rescaled eps).
class Adam : public Optimizer {
 public:
  /// beta1, beta2 in [0, 1); eps >= 0.
  explicit Adam(double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-7,
                std::source_location loc = std::source_location::current())
      : Adam("Adam", lr, beta1, beta2, eps, loc) {}

  std::string_view name() const override { return "Adam"; }
  double beta1() const { return beta1_; }
  double beta2() const { return beta2_; }
  double epsilon() const { return eps_; }

 protected:
  /// `who` names the optimizer in the errors of the checks (a derived one's name() is not yet
  /// its own while this runs).
  Adam(std::string_view who, double lr, double beta1, double beta2, double eps, const std::source_location& loc)
      : Optimizer(lr, {"m", "v"}, loc), beta1_(beta1), beta2_(beta2), eps_(eps) {
    for (const auto& [x, what] : {std::pair{beta1, "beta1"}, std::pair{beta2, "beta2"}})
      if (!(x >= 0 && x < 1))
        stagecraft::detail::fail<ValueError>(who, loc, what, " must be in [0, 1), got ", x);
    if (!(eps >= 0 && std::isfinite(eps)))
      stagecraft::detail::fail<ValueError>(who, loc, "eps must be finite and >= 0, got ", eps);
    fused::register_adam_program();  // a traced update runs as one loop (fused.hpp)
  }

  /// lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t), 8 ops once per step, in the learning
  /// rate's dtype (f64) from the `iterations` and `learning_rate` variables, so a traced step
  /// stays right. beta^t is pow(beta, t) with t a tensor: exact at beta = 0 (0^t = 0 for
  /// t >= 1, where exp(t * log(beta)) would meet log(0)), and the same std::pow as a host
  /// computation, so f64 runs match one bit for bit. The result is cast to each variable's
  /// dtype once per step (Optimizer::apply).
  Tensor step_size(const std::source_location& loc) override {
    const Tensor& lr = learning_rate_variable().value();
    const Tensor t = cast(iterations_variable().value(), lr.dtype(), loc);
    const Tensor correction2 = sqrt(sub(1.0, pow(beta2_, t, loc), loc), loc);  // sqrt(1 - beta2^t)
    const Tensor correction1 = sub(1.0, pow(beta1_, t, loc), loc);             // 1 - beta1^t
    return div(mul(lr, correction2, loc), correction1, loc);
  }

  // 22 ops per variable: 3 for m, 4 for v, 5 each to flush their subnormals, 5 for the step. lr is
  // lr_t in var's dtype. Eagerly on the CPU the same arithmetic runs as one loop (optim/fused.hpp):
  // the passes over memory (12 then) were ~75% of a batch-1 MLP training step.
  void update(const Tensor& g, Variable& var, Variable* slots, const Tensor& lr,
              const std::source_location& loc) override {
    update_decayed(g, var, slots, lr, Tensor(), loc);
  }

  /// The update, with var -= var * decay first where decay (one element of var's dtype) is
  /// defined: AdamW's decoupled weight decay, in the same loop or kernel.
  void update_decayed(const Tensor& g, Variable& var, Variable* slots, const Tensor& lr, const Tensor& decay,
                      const std::source_location& loc) {
    Variable& m = slots[0];
    Variable& v = slots[1];
    if (fused::eligible(g, var, slots, 2, lr) &&
        (!decay.defined() || fused::scalar_ok(decay, var.dtype(), var.device()))) {
      fused::adam(g, var, m, v, lr, 1 - beta1_, 1 - beta2_, eps_, decay);
      return;
    }
    // One op per statement where a call has two made arguments: the order of the ops (and so the
    // fused group a trace makes of them, fused.hpp's adam_program) does not depend on the compiler.
    const Tensor m0 = m.value(), v0 = v.value();
    // (the moments stored with subnormals flushed to zero: fused::flush_subnormal)
    const Tensor m1 = fused::flush_subnormal(add(m0, mul(sub(g, m0, loc), 1 - beta1_, loc), loc), loc);
    m.assign(m1, loc);
    const Tensor g2 = square(g, loc);
    const Tensor v1 = fused::flush_subnormal(add(v0, mul(sub(g2, v0, loc), 1 - beta2_, loc), loc), loc);
    v.assign(v1, loc);
    const Tensor denominator = add(sqrt(v1, loc), eps_, loc);
    const Tensor scaled = mul(m1, lr, loc);
    const Tensor step = div(scaled, denominator, loc);
    if (!decay.defined()) {
      var.assign_sub(step, loc);
      return;
    }
    // AdamW: (w - w * decay) - step, one assignment, so a trace fuses it with the rest (fused.hpp's
    // adamw_program); the same roundings as the decay first.
    const Tensor w0 = var.value();
    const Tensor decayed = sub(w0, mul(w0, decay, loc), loc);
    var.assign(sub(decayed, step, loc), loc);
  }

 private:
  double beta1_, beta2_, eps_;
};

/// AdamW (Loshchilov & Hutter 2019): Adam with decoupled weight decay, as Keras's and PyTorch's
/// AdamW. Each step first shrinks every variable, w -= w * (lr * weight_decay), lr the learning
/// rate (not the bias-corrected step size; a schedule's changes apply to it), then takes Adam's
/// step from the gradient, which the decay never enters. Same slots ("m", "v") and checkpoints as
/// Adam; eagerly one loop per variable on the CPU and one launch for a step's variables on a GPU,
/// the decay included. Decaying only some variables (not biases, say): two optimizers.
class AdamW : public Adam {
 public:
  /// weight_decay finite and >= 0 (0: Adam exactly); the rest as Adam's. Keras's defaults.
  explicit AdamW(double lr = 1e-3, double weight_decay = 0.004, double beta1 = 0.9, double beta2 = 0.999,
                 double eps = 1e-7, std::source_location loc = std::source_location::current())
      : Adam("AdamW", lr, beta1, beta2, eps, loc), weight_decay_(weight_decay) {
    if (!(weight_decay >= 0 && std::isfinite(weight_decay)))
      stagecraft::detail::fail<ValueError>("AdamW", loc, "weight_decay must be finite and >= 0, got ", weight_decay);
    fused::register_adamw_program();  // a traced update runs as one loop, the decay in it
  }

  std::string_view name() const override { return "AdamW"; }
  double weight_decay() const { return weight_decay_; }

 protected:
  /// Adam's step size; also this step's decay factor lr * weight_decay (f64, from the learning
  /// rate variable: a traced step reads it at every call).
  Tensor step_size(const std::source_location& loc) override {
    decay_as_ = {};
    if (weight_decay_ != 0) decay_ = mul(learning_rate_variable().value(), weight_decay_, loc);
    return Adam::step_size(loc);
  }

  void update(const Tensor& g, Variable& var, Variable* slots, const Tensor& lr,
              const std::source_location& loc) override {
    if (weight_decay_ == 0) return Adam::update(g, var, slots, lr, loc);
    Tensor& d = decay_as_[static_cast<std::size_t>(var.dtype())];  // converted once per dtype a step
    if (!d.defined() || d.device() != var.device()) d = cast(decay_, var.dtype(), loc).to(var.device(), loc);
    update_decayed(g, var, slots, lr, d, loc);
  }

 private:
  double weight_decay_;
  Tensor decay_;
  std::array<Tensor, num_dtypes> decay_as_{};
};

}  // namespace stagecraft::optim
