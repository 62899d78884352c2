// nn::leaky_relu, elu, silu, gelu, gelu_tanh, softplus: activations written with other ops (so each gets its
// gradient, tracing and every device from them), each in two forms: on Tensors (eager, or traced
// inside sc::function) and on staged values (sc::stage, sc::compile: the same expression as nodes
// of the fused loop). Integer inputs become f32, as sc::exp makes them; bool is a DTypeError.
#pragma once
#include <cmath>
#include <cstdint>
#include <optional>
#include <source_location>
#include <string_view>
#include <utility>

#include "../ops/binary.hpp"
#include "../ops/unary.hpp"
#include "../ops/where.hpp"
#include "../staged/api.hpp"
#include "composite.hpp"
#include "functional.hpp"

namespace stagecraft::nn {

namespace functional_detail {
/// x, defined and not bool, as a float tensor (integers become f32).
inline Tensor activation_input(const Tensor& x, std::string_view op, const std::source_location& loc) {
  stagecraft::detail::require_defined(x, op, loc);
  ops::require_dtype(!is_bool(x.dtype()), op, x.dtype(), "numeric dtypes (convert a mask with astype first)", loc);
  return as_floating(x, loc);
}
/// A finite slope or scale, else ValueError naming the op.
inline void require_finite(double v, std::string_view op, std::string_view what, const std::source_location& loc) {
  if (SC_UNLIKELY(!std::isfinite(v)))
    stagecraft::detail::fail<ValueError>(op, loc, what, " must be finite, got ", v);
}
inline constexpr double sqrt1_2 = 0.70710678118654752440;    // 1/sqrt(2)
inline constexpr double sqrt2_pi = 0.79788456080286535588;   // sqrt(2/pi)
inline constexpr double gelu_cubic = 0.044715;               // the tanh form's cubic coefficient
}  // namespace functional_detail

/// The activations' ops on a floating-point x, eager or as a staged function's body (on a large
/// CPU tensor an eager call runs them staged: nn/composite.hpp).
struct ActivationOps {
  enum Kind { leaky_relu, elu, silu, gelu, gelu_tanh, softplus } kind;
  double param;  ///< leaky_relu's negative_slope, elu's alpha
  bool operator==(const ActivationOps&) const = default;
  Tensor operator()(const Tensor& xf) const { return apply(xf, std::source_location::current()); }
  Tensor apply(const Tensor& xf, const std::source_location& loc) const {
    namespace fd = functional_detail;
    switch (kind) {
      case leaky_relu:
        return where(greater(xf, 0, loc), xf, mul(xf, param, loc), loc);
      case elu:
        return where(greater(xf, 0, loc), xf, mul(expm1(minimum(xf, 0, loc), loc), param, loc), loc);
      case silu:
        return mul(xf, sigmoid(xf, loc), loc);
      case gelu:
        return mul(mul(xf, 0.5, loc), add(erf(mul(xf, fd::sqrt1_2, loc), loc), 1, loc), loc);
      case gelu_tanh: {
        const Tensor cubic = mul(mul(square(xf, loc), xf, loc), fd::gelu_cubic, loc);
        const Tensor inner = tanh(mul(add(xf, cubic, loc), fd::sqrt2_pi, loc), loc);
        return mul(mul(xf, 0.5, loc), add(inner, 1, loc), loc);
      }
      case softplus:
        return add(maximum(xf, 0, loc), log1p(exp(neg(abs(xf, loc), loc), loc), loc), loc);
    }
    return xf;  // unreachable
  }
};

namespace functional_detail {
/// x checked and made floating, then the activation's ops: staged on a large CPU tensor.
inline Tensor activate(const Tensor& x, ActivationOps ops, const char* op, const std::source_location& loc) {
  const Tensor xf = activation_input(x, op, loc);
  if (std::optional<Tensor> r = composite_detail::run(ops, op, loc, xf)) return *std::move(r);
  return ops.apply(xf, loc);
}
}  // namespace functional_detail

/// x where x > 0, else negative_slope * x (its gradient there, at 0 too). NaN stays NaN.
inline Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01,
                         std::source_location loc = std::source_location::current()) {
  functional_detail::require_finite(negative_slope, "leaky_relu", "negative_slope", loc);
  return functional_detail::activate(x, {ActivationOps::leaky_relu, negative_slope}, "leaky_relu", loc);
}

/// x where x > 0, else alpha * (e^x - 1) (Clevert et al. 2015), by expm1: exact near 0. The
/// negative branch reads min(x, 0), so a large x gives no inf there (nor a NaN gradient).
inline Tensor elu(const Tensor& x, double alpha = 1.0, std::source_location loc = std::source_location::current()) {
  functional_detail::require_finite(alpha, "elu", "alpha", loc);
  return functional_detail::activate(x, {ActivationOps::elu, alpha}, "elu", loc);
}

/// x * sigmoid(x) (also called swish).
inline Tensor silu(const Tensor& x, std::source_location loc = std::source_location::current()) {
  return functional_detail::activate(x, {ActivationOps::silu, 0}, "silu", loc);
}

/// x * Phi(x), Phi the standard normal distribution function: 0.5 x (1 + erf(x / sqrt 2))
/// (Hendrycks & Gimpel 2016; PyTorch's default form).
inline Tensor gelu(const Tensor& x, std::source_location loc = std::source_location::current()) {
  return functional_detail::activate(x, {ActivationOps::gelu, 0}, "gelu", loc);
}

/// gelu's tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (PyTorch's
/// approximate="tanh"; BERT's and GPT-2's): within 5e-4 of gelu.
inline Tensor gelu_tanh(const Tensor& x, std::source_location loc = std::source_location::current()) {
  return functional_detail::activate(x, {ActivationOps::gelu_tanh, 0}, "gelu_tanh", loc);
}

/// log(1 + e^x), as max(x, 0) + log1p(e^-|x|): no overflow for large x, exact for very negative
/// x (where it is e^x), gradient sigmoid(x).
inline Tensor softplus(const Tensor& x, std::source_location loc = std::source_location::current()) {
  return functional_detail::activate(x, {ActivationOps::softplus, 0}, "softplus", loc);
}

// The staged forms: the same expressions as nodes of a staged graph (in sc::compile, the argument
// is staged; weak scalars take its dtype).
template <staging::Staged X>
auto leaky_relu(const X& x, double negative_slope = 0.01) {
  return stagecraft::where(x > 0, x, x * negative_slope);
}
template <staging::Staged X>
auto elu(const X& x, double alpha = 1.0) {
  return stagecraft::where(x > 0, x, stagecraft::expm1(stagecraft::minimum(x, 0)) * alpha);
}
template <staging::Staged X>
auto silu(const X& x) {
  return x * stagecraft::sigmoid(x);
}
template <staging::Staged X>
auto gelu(const X& x) {
  return x * 0.5 * (stagecraft::erf(x * functional_detail::sqrt1_2) + 1);
}
template <staging::Staged X>
auto gelu_tanh(const X& x) {
  namespace fd = functional_detail;
  return x * 0.5 * (stagecraft::tanh((x + x * x * x * fd::gelu_cubic) * fd::sqrt2_pi) + 1);
}
template <staging::Staged X>
auto softplus(const X& x) {
  return stagecraft::maximum(x, 0) + stagecraft::log1p(stagecraft::exp(-stagecraft::abs(x)));
}

}  // namespace stagecraft::nn
