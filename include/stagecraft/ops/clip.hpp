// sc::clip: x limited to [lo, hi], written with where (so it gets its gradient, tracing and every
// device from it; not an op of its own).
#pragma once
#include <cmath>
#include <source_location>

#include "binary.hpp"
#include "where.hpp"

namespace stagecraft {

namespace detail {
/// m = (x < lo ? lo : x), then (m > hi ? hi : m): NaN stays NaN, the gradient goes to x on
/// [lo, hi] (both ends included, as PyTorch's clamp), to lo below and to hi above, and where
/// lo > hi the result is hi (as NumPy's minimum(maximum(x, lo), hi)).
inline Tensor clip_between(const Tensor& x, const Tensor& lo, const Tensor& hi, const std::source_location& loc) {
  const Tensor m = where(less(x, lo, loc), lo, x, loc);
  return where(greater(m, hi, loc), hi, m, loc);
}
}  // namespace detail

/// x limited to [lo, hi] elementwise: C++ scalars (weak: they take x's dtype where of its kind, so
/// an i32 tensor stays i32 with integer bounds). lo > hi or a NaN bound is a ValueError. NaN
/// elements stay NaN; the gradient is 1 on [lo, hi] (its ends included) and 0 outside.
template <Scalar L, Scalar H>
Tensor clip(const Tensor& x, L lo, H hi, std::source_location loc = std::source_location::current()) {
  detail::require_defined(x, "clip", loc);
  const double l = static_cast<double>(lo), h = static_cast<double>(hi);
  if (SC_UNLIKELY(std::isnan(l) || std::isnan(h) || l > h))
    detail::fail<ValueError>("clip", loc, "needs lo <= hi, got lo = ", l, " and hi = ", h);
  return detail::clip_between(x, detail::weak_scalar(lo, x, loc, "clip"), detail::weak_scalar(hi, x, loc, "clip"), loc);
}

/// x limited to [lo, hi] by tensors that broadcast with it (per-channel bounds, say): where
/// lo > hi for an element, the result there is hi (as NumPy's clip). Their dtypes promote.
inline Tensor clip(const Tensor& x, const Tensor& lo, const Tensor& hi,
                   std::source_location loc = std::source_location::current()) {
  detail::require_defined(x, "clip", loc);
  detail::require_defined(lo, "clip", loc);
  detail::require_defined(hi, "clip", loc);
  return detail::clip_between(x, lo, hi, loc);
}

}  // namespace stagecraft
