// nn::leaky_relu, elu, silu, gelu, gelu_tanh, softplus: activations written with other ops (so each gets its
// gradient, tracing and every device from them), each in two forms: on Tensors (eager, or traced
// inside sc::function) and on staged values (sc::stage, sc::compile: the same expression as nodes
// of the fused loop). Integer inputs become f32, as sc::exp makes them; bool is a DTypeError.
#pragma once
#include <cmath>
#include <cstdint>
#include <source_location>
#include <string_view>

#include "../ops/binary.hpp"
#include "../ops/unary.hpp"
#include "../ops/where.hpp"
#include "../staged/api.hpp"
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

/// x where x > 0, else negative_slope * x (its gradient there, at 0 too). NaN stays NaN.
inline Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01,
                         std::source_location loc = std::source_location::current()) {
  constexpr std::string_view op = "leaky_relu";
  functional_detail::require_finite(negative_slope, op, "negative_slope", loc);
  const Tensor xf = functional_detail::activation_input(x, op, loc);
  return where(greater(xf, 0, loc), xf, mul(xf, negative_slope, loc), loc);
}

/// x where x > 0, else alpha * (e^x - 1) (Clevert et al. 2015), by expm1: exact near 0. The
/// negative branch reads min(x, 0), so a large x gives no inf there (nor a NaN gradient).
inline Tensor elu(const Tensor& x, double alpha = 1.0, std::source_location loc = std::source_location::current()) {
  constexpr std::string_view op = "elu";
  functional_detail::require_finite(alpha, op, "alpha", loc);
  const Tensor xf = functional_detail::activation_input(x, op, loc);
  return where(greater(xf, 0, loc), xf, mul(expm1(minimum(xf, 0, loc), loc), alpha, loc), loc);
}

/// x * sigmoid(x) (also called swish).
inline Tensor silu(const Tensor& x, std::source_location loc = std::source_location::current()) {
  const Tensor xf = functional_detail::activation_input(x, "silu", loc);
  return mul(xf, sigmoid(xf, loc), loc);
}

/// x * Phi(x), Phi the standard normal distribution function: 0.5 x (1 + erf(x / sqrt 2))
/// (Hendrycks & Gimpel 2016; PyTorch's default form).
inline Tensor gelu(const Tensor& x, std::source_location loc = std::source_location::current()) {
  const Tensor xf = functional_detail::activation_input(x, "gelu", loc);
  return mul(mul(xf, 0.5, loc), add(erf(mul(xf, functional_detail::sqrt1_2, loc), loc), 1, loc), loc);
}

/// gelu's tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (PyTorch's
/// approximate="tanh"; BERT's and GPT-2's): within 5e-4 of gelu.
inline Tensor gelu_tanh(const Tensor& x, std::source_location loc = std::source_location::current()) {
  namespace fd = functional_detail;
  const Tensor xf = fd::activation_input(x, "gelu_tanh", loc);
  const Tensor cubic = mul(mul(square(xf, loc), xf, loc), fd::gelu_cubic, loc);
  const Tensor inner = tanh(mul(add(xf, cubic, loc), fd::sqrt2_pi, loc), loc);
  return mul(mul(xf, 0.5, loc), add(inner, 1, loc), loc);
}

/// log(1 + e^x), as max(x, 0) + log1p(e^-|x|): no overflow for large x, exact for very negative
/// x (where it is e^x), gradient sigmoid(x).
inline Tensor softplus(const Tensor& x, std::source_location loc = std::source_location::current()) {
  const Tensor xf = functional_detail::activation_input(x, "softplus", loc);
  return add(maximum(xf, 0, loc), log1p(exp(neg(abs(xf, loc), loc), loc), loc), loc);
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
