// optim::Adam: adaptive moment estimation with bias correction.
#pragma once
#include <cmath>
#include <source_location>
#include <string>
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
      : Optimizer(lr, {"m", "v"}, loc), beta1_(beta1), beta2_(beta2), eps_(eps) {
    check_range(beta1, 0, 1, false, "beta1", loc);
    check_range(beta2, 0, 1, false, "beta2", loc);
    if (!(eps >= 0 && std::isfinite(eps)))
      stagecraft::detail::fail<ValueError>("Adam", loc, "eps must be finite and >= 0, got ", eps);
    fused::register_adam_program();  // a traced update runs as one loop (fused.hpp)
  }

  std::string_view name() const override { return "Adam"; }
  double beta1() const { return beta1_; }
  double beta2() const { return beta2_; }
  double epsilon() const { return eps_; }

 protected:
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

  // 12 ops per variable: 3 for m, 4 for v, 5 for the step. lr is lr_t in var's dtype. Eagerly on
  // the CPU the same arithmetic runs as one loop (optim/fused.hpp): the 12 passes over memory
  // were ~75% of a batch-1 MLP training step.
  void update(const Tensor& g, Variable& var, Variable* slots, const Tensor& lr,
              const std::source_location& loc) override {
    Variable& m = slots[0];
    Variable& v = slots[1];
    if (fused::eligible(g, var, slots, 2, lr)) {
      fused::adam(g, var, m, v, lr, 1 - beta1_, 1 - beta2_, eps_);
      return;
    }
    // One op per statement where a call has two made arguments: the order of the ops (and so the
    // fused group a trace makes of them, fused.hpp's adam_program) does not depend on the compiler.
    const Tensor m0 = m.value(), v0 = v.value();
    const Tensor m1 = add(m0, mul(sub(g, m0, loc), 1 - beta1_, loc), loc);
    m.assign(m1, loc);
    const Tensor g2 = square(g, loc);
    const Tensor v1 = add(v0, mul(sub(g2, v0, loc), 1 - beta2_, loc), loc);
    v.assign(v1, loc);
    const Tensor denominator = add(sqrt(v1, loc), eps_, loc);
    const Tensor scaled = mul(m1, lr, loc);
    var.assign_sub(div(scaled, denominator, loc), loc);
  }

 private:
  double beta1_, beta2_, eps_;
};

}  // namespace stagecraft::optim
