// optim::Adam: adaptive moment estimation with bias correction.
#pragma once
#include <cmath>
#include <source_location>
#include <string>
#include <vector>

#include "../ops/binary.hpp"
#include "../ops/unary.hpp"
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
  }

  std::string_view name() const override { return "Adam"; }
  double beta1() const { return beta1_; }
  double beta2() const { return beta2_; }
  double epsilon() const { return eps_; }

 protected:
  // 12 ops per variable: 3 for m, 4 for v, 5 for the step.
  void update(const Tensor& g, Variable& var, Variable* slots, std::int64_t t,
              const std::source_location& loc) override {
    const double td = static_cast<double>(t);
    const double lr_t = learning_rate() * std::sqrt(1 - std::pow(beta2_, td)) / (1 - std::pow(beta1_, td));
    Variable& m = slots[0];
    Variable& v = slots[1];
    m.assign(add(m.value(), mul(sub(g, m.value(), loc), 1 - beta1_, loc), loc), loc);
    v.assign(add(v.value(), mul(sub(square(g, loc), v.value(), loc), 1 - beta2_, loc), loc), loc);
    var.assign_sub(div(mul(m.value(), lr_t, loc), add(sqrt(v.value(), loc), eps_, loc), loc), loc);
  }

 private:
  double beta1_, beta2_, eps_;
};

}  // namespace stagecraft::optim
