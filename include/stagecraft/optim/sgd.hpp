// optim::SGD: stochastic gradient descent, with optional (Nesterov) momentum.
#pragma once
#include <source_location>
#include <string>
#include <vector>

#include "../ops/binary.hpp"
#include "fused.hpp"
#include "optimizer.hpp"

namespace stagecraft::optim {

/// Gradient descent. Without momentum: w -= lr * g. With momentum mu (TensorFlow's form,
/// one "velocity" slot per variable, starting at 0):
///   velocity = mu * velocity - lr * g    (stored with subnormals flushed to zero, as Adam's moments)
///   w += velocity                        (classic)
///   w += mu * velocity - lr * g          (nesterov = true; uses the updated velocity)
class SGD : public Optimizer {
 public:
  /// momentum in [0, 1); nesterov needs momentum > 0 to differ from plain SGD.
  explicit SGD(double lr, double momentum = 0, bool nesterov = false,
               std::source_location loc = std::source_location::current())
      : Optimizer(lr, momentum > 0 ? std::vector<std::string>{"velocity"} : std::vector<std::string>{}, loc),
        momentum_(momentum),
        nesterov_(nesterov) {
    check_range(momentum, 0, 1, false, "momentum", loc);
  }

  std::string_view name() const override { return "SGD"; }
  double momentum() const { return momentum_; }
  bool nesterov() const { return nesterov_; }

 protected:
  // lr: the learning-rate variable's value in var's dtype (see Optimizer::apply). Eagerly on the
  // CPU the same arithmetic runs as one loop (optim/fused.hpp).
  void update(const Tensor& g, Variable& var, Variable* slots, const Tensor& lr,
              const std::source_location& loc) override {
    if (fused::eligible(g, var, slots, momentum_ == 0 ? 0 : 1, lr)) {
      fused::sgd(g, var, momentum_ == 0 ? nullptr : slots, lr, momentum_, nesterov_);
      return;
    }
    const Tensor step = mul(g, lr, loc);  // lr * g
    if (momentum_ == 0) {                 // 2 ops
      var.assign_sub(step, loc);
      return;
    }
    Variable& velocity = slots[0];
    // 3 ops, and 5 to flush its subnormals to zero (fused::flush_subnormal)
    velocity.assign(fused::flush_subnormal(sub(mul(velocity.value(), momentum_, loc), step, loc), loc), loc);
    if (nesterov_) var.assign_add(sub(mul(velocity.value(), momentum_, loc), step, loc), loc);
    else var.assign_add(velocity.value(), loc);
  }

 private:
  double momentum_;
  bool nesterov_;
};

}  // namespace stagecraft::optim
