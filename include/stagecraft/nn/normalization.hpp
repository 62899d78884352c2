// nn::layer_norm and the nn::LayerNorm layer: written with other ops (mean, var, sqrt), so they get
// gradients, tracing and every device from those ops.
#pragma once
#include <cmath>
#include <cstdint>
#include <optional>
#include <source_location>
#include <string_view>
#include <vector>

#include "../ops/binary.hpp"
#include "../ops/reduce.hpp"
#include "../ops/unary.hpp"
#include "../state/module.hpp"
#include "composite.hpp"
#include "functional.hpp"

namespace stagecraft::nn {

/// layer_norm's ops on a floating-point x over its last `axes` axes, with gamma and/or beta where
/// the flags say (in that order among `affine`): eager, or as a staged function's body.
struct LayerNormOps {
  int axes;
  double eps;
  bool gamma, beta;
  bool operator==(const LayerNormOps&) const = default;
  template <class... T>
  Tensor operator()(const Tensor& xf, const T&... affine) const {
    return (*this)(xf, affine..., std::source_location::current());
  }
  Tensor operator()(const Tensor& xf, const std::source_location& loc) const { return apply(xf, {}, {}, loc); }
  Tensor operator()(const Tensor& xf, const Tensor& a, const std::source_location& loc) const {
    return gamma ? apply(xf, a, {}, loc) : apply(xf, {}, a, loc);
  }
  Tensor operator()(const Tensor& xf, const Tensor& g, const Tensor& b, const std::source_location& loc) const {
    return apply(xf, g, b, loc);
  }

 private:
  Tensor apply(const Tensor& xf, const Tensor& g, const Tensor& b, const std::source_location& loc) const {
    std::vector<std::int64_t> ax;
    for (int i = xf.rank() - axes; i < xf.rank(); ++i) ax.push_back(i);
    const Tensor centered = sub(xf, mean(xf, ax, true, loc), loc);
    const Tensor variance = mean(square(centered, loc), ax, true, loc);
    Tensor y = mul(centered, div(1, sqrt(add(variance, eps, loc), loc), loc), loc);
    if (g.defined()) y = mul(y, g, loc);
    if (b.defined()) y = add(y, b, loc);
    return y;
  }
};

/// (x - mean) / sqrt(var + eps) over x's trailing axes, the ones `normalized_shape` names (Ba et
/// al. 2016; PyTorch's F.layer_norm), then * gamma + beta where given (each of normalized_shape,
/// or undefined for none). var is the population variance (two passes). As PyTorch does, each row's
/// 1 / sqrt(var + eps) is computed once and its elements multiplied by it (a division per element
/// costs ~5 multiplications; the two roundings differ from one division's by at most an ulp or
/// so). Integers become f32. On a large CPU tensor the ops run as one staged function (see
/// nn/composite.hpp). A
/// normalized_shape that is not x's trailing shape, or a gamma/beta of another shape, is a
/// ShapeError; eps must be finite and >= 0.
inline Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& gamma = Tensor(),
                         const Tensor& beta = Tensor(), double eps = 1e-5,
                         std::source_location loc = std::source_location::current()) {
  constexpr std::string_view op = "layer_norm";
  stagecraft::detail::require_defined(x, op, loc);
  ops::require_dtype(!is_bool(x.dtype()), op, x.dtype(), "numeric dtypes", loc);
  if (SC_UNLIKELY(!std::isfinite(eps) || eps < 0))
    stagecraft::detail::fail<ValueError>(op, loc, "eps must be finite and >= 0, got ", eps);
  const int k = normalized_shape.rank(), r = x.rank();
  bool trailing = k >= 1 && k <= r;
  for (int i = 0; trailing && i < k; ++i) trailing = x.shape()[r - k + i] == normalized_shape[i];
  if (SC_UNLIKELY(!trailing))
    stagecraft::detail::fail<ShapeError>(op, loc, "normalized_shape ", normalized_shape,
                                         " must be the trailing shape of x (at least one axis), got x ", x.shape());
  const auto check_affine = [&](const Tensor& t, std::string_view name) {
    if (t.defined() && SC_UNLIKELY(t.shape() != normalized_shape))
      stagecraft::detail::fail<ShapeError>(op, loc, name, " must have normalized_shape ", normalized_shape, ", got ",
                                           t.shape());
  };
  check_affine(gamma, "gamma");
  check_affine(beta, "beta");
  const Tensor xf = functional_detail::as_floating(x, loc);
  const LayerNormOps body{k, eps, gamma.defined(), beta.defined()};
  std::optional<Tensor> staged;  // a large CPU tensor: the ops as one staged function (composite.hpp)
  if (gamma.defined() && beta.defined())
    staged = composite_detail::run(body, "layer_norm", loc, xf, gamma, beta);
  else if (gamma.defined() || beta.defined())
    staged = composite_detail::run(body, "layer_norm", loc, xf, gamma.defined() ? gamma : beta);
  else
    staged = composite_detail::run(body, "layer_norm", loc, xf);
  if (staged) return *std::move(staged);
  return gamma.defined() ? (beta.defined() ? body(xf, gamma, beta, loc) : body(xf, gamma, loc))
                         : (beta.defined() ? body(xf, beta, loc) : body(xf, loc));
}

/// Layer normalization over the trailing `normalized_shape` of its input, with a learned scale
/// gamma (ones) and shift beta (zeros) of that shape (Keras' names; PyTorch's weight and bias).
class LayerNorm : public Module {
 public:
  LayerNorm(Shape normalized_shape, double eps = 1e-5, DType dtype = DType::f32,
            std::source_location loc = std::source_location::current())
      : shape_(std::move(normalized_shape)), eps_(eps) {
    if (SC_UNLIKELY(shape_.rank() < 1 || shape_.numel() < 1))
      stagecraft::detail::fail<ValueError>("LayerNorm", loc, "needs a normalized_shape of at least one element, got ",
                                           shape_);
    if (SC_UNLIKELY(!std::isfinite(eps) || eps < 0))
      stagecraft::detail::fail<ValueError>("LayerNorm", loc, "eps must be finite and >= 0, got ", eps);
    gamma = Variable(stagecraft::ones(shape_, dtype, loc), "gamma", true, loc);
    beta = Variable(stagecraft::zeros(shape_, dtype, loc), "beta", true, loc);
    add({{"gamma", gamma}, {"beta", beta}}, loc);
  }
  /// Over the last axis, of `features` elements.
  explicit LayerNorm(std::int64_t features, double eps = 1e-5, DType dtype = DType::f32,
                     std::source_location loc = std::source_location::current())
      : LayerNorm(Shape{features}, eps, dtype, loc) {}

  /// x [..., normalized_shape] → the same shape.
  Tensor operator()(const Tensor& x, std::source_location loc = std::source_location::current()) const {
    return layer_norm(x, shape_, gamma, beta, eps_, loc);
  }

  const Shape& normalized_shape() const { return shape_; }
  double eps() const { return eps_; }

  Variable gamma;  ///< normalized_shape, starts at 1
  Variable beta;   ///< normalized_shape, starts at 0

 private:
  Shape shape_;
  double eps_;
};

}  // namespace stagecraft::nn
