// Reductions over any axes: sum max min argmax argmin (primitives), mean logsumexp (composites).
#pragma once
#include <limits>
#include <vector>

#include "../backend/cpu/reduce.hpp"
#include "../eager/dispatch.hpp"
#include "binary.hpp"
#include "cast.hpp"
#include "reshape.hpp"
#include "stop_gradient.hpp"
#include "unary.hpp"
#include "where.hpp"

namespace stagecraft {
namespace ops {

/// Flags the axes an axis list names: all of them for an empty list; negative axes count from
/// the end. Out-of-range and repeated axes are ShapeErrors naming the op.
inline void reduced_mask(const Shape& axes, const Shape& shape, std::string_view op,
                         const std::source_location& loc, bool* mask) {
  const int r = shape.rank();
  for (int i = 0; i < r; ++i) mask[i] = axes.empty();
  for (const std::int64_t a : axes) {
    const int k = normalize_axis(a, r, op, loc);
    if (SC_UNLIKELY(mask[k]))
      detail::fail<ShapeError>(op, loc, "axis ", a, " appears twice in axes ", axes, " for shape ", shape);
    mask[k] = true;
  }
}

/// Shared rules of Sum, Max, Min. Reads attrs.ints (axes, empty = all) and attrs.flag (keepdims).
template <class Op, class Rd, bool NeedsElements>
struct AxisReduce {
  static constexpr int arity = 1;

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    const Shape& s = in[0].shape();
    bool mask[max_rank];
    reduced_mask(a.ints, s, Op::name, loc, mask);
    Shape out;
    for (int i = 0; i < s.rank(); ++i) {
      if (NeedsElements && SC_UNLIKELY(mask[i] && s[i] == 0))
        detail::fail<ValueError>(Op::name, loc, "cannot reduce over axis ", i, " of shape ", s,
                                 ": it is empty and ", Op::name, " has no identity");
      if (!mask[i]) out.push_back(s[i]);
      else if (a.flag) out.push_back(1);
    }
    const DType d = in[0].dtype();
    return {out, Rd::is_sum && is_bool(d) ? DType::i64 : d};
  }
  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    bool mask[max_rank];
    reduced_mask(a.ints, in[0].shape(), Op::name, std::source_location::current(), mask);
    backend::cpu::reduce<Rd>(in[0], out, mask);
  }
  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    bool mask[max_rank];
    reduced_mask(a.ints, in[0].shape(), Op::name, loc, mask);
    constexpr auto rule = Rd::is_sum                                           ? backend::cuda::abi::ReduceRule::sum
                          : std::is_same_v<Rd, backend::cpu::MaxReducer> ? backend::cuda::abi::ReduceRule::max
                                                                           : backend::cuda::abi::ReduceRule::min;
    backend::cuda::reduce(rule, in[0], out, mask, Op::name, loc);
  }
};

/// Sum over axes; bool sums as i64, integers keep their dtype (and wrap), empty axes give 0.
struct Sum : AxisReduce<Sum, backend::cpu::SumReducer, false> {
  SC_OP_HEAD(Sum, "sum")
  static constexpr bool vjp_gives_broadcast_grad = true;  // g over the block, unbroadcast
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};
/// Largest element over axes; NaN propagates; an empty reduced axis is a ValueError.
struct Max : AxisReduce<Max, backend::cpu::MaxReducer, true> {
  SC_OP_HEAD(Max, "max")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};
/// Smallest element over axes; NaN propagates; an empty reduced axis is a ValueError.
struct Min : AxisReduce<Min, backend::cpu::MinReducer, true> {
  SC_OP_HEAD(Min, "min")
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};

/// Shared rules of ArgMax, ArgMin. Reads attrs.axis; the result is i64 without that axis.
/// A rank-0 input takes axis 0 or -1 and gives 0 (as PyTorch).
template <class Op, bool IsMax>
struct AxisArgReduce {
  static constexpr int arity = 1;
  static constexpr bool differentiable = false;

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    const Shape& s = in[0].shape();
    if (s.rank() == 0) {
      normalize_axis(a.axis, 1, Op::name, loc);
      return {Shape{}, DType::i64};
    }
    const int k = normalize_axis(a.axis, s.rank(), Op::name, loc);
    if (SC_UNLIKELY(s[k] == 0))
      detail::fail<ValueError>(Op::name, loc, "cannot take ", Op::name, " over axis ", a.axis,
                               " of shape ", s, ": it is empty");
    Shape out;
    for (int i = 0; i < s.rank(); ++i)
      if (i != k) out.push_back(s[i]);
    return {out, DType::i64};
  }
  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    const int r = in[0].rank();
    const int k = r == 0 ? 0 : static_cast<int>(a.axis < 0 ? a.axis + r : a.axis);
    backend::cpu::arg_reduce<IsMax>(in[0], out, k);
  }
  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    const int r = in[0].rank();
    bool mask[max_rank] = {};
    if (r > 0) mask[a.axis < 0 ? a.axis + r : a.axis] = true;
    backend::cuda::reduce(IsMax ? backend::cuda::abi::ReduceRule::argmax : backend::cuda::abi::ReduceRule::argmin,
                          in[0], out, mask, Op::name, loc);
  }
};

/// Index of the first largest element along an axis; NaN counts as the largest (NumPy).
struct ArgMax : AxisArgReduce<ArgMax, true> {
  SC_OP_HEAD(ArgMax, "argmax")
};
/// Index of the first smallest element along an axis; NaN counts as the smallest (NumPy).
struct ArgMin : AxisArgReduce<ArgMin, false> {
  SC_OP_HEAD(ArgMin, "argmin")
};

}  // namespace ops

namespace detail {

/// The attributes of an axis reduction (the op's infer validates them; only a list longer than
/// a Shape can hold is caught here, where it must have repeats or be out of range anyway).
inline ops::Attrs reduce_attrs(const Tensor& x, const std::vector<std::int64_t>& axes, bool keepdims,
                               std::string_view op, const std::source_location& loc) {
  require_defined(x, op, loc);
  if (SC_UNLIKELY(axes.size() > static_cast<std::size_t>(max_rank)))
    fail<ShapeError>(op, loc, "got ", axes.size(), " axes for shape ", x.shape(), " of rank ", x.rank());
  ops::Attrs a;
  a.ints = Shape(axes);
  a.flag = keepdims;
  return a;
}

/// Checks an axis list against x (naming `op`) and returns how many elements each output
/// element reduces.
inline std::int64_t reduced_count(const Tensor& x, const ops::Attrs& a, std::string_view op,
                                  const std::source_location& loc) {
  bool mask[max_rank];
  ops::reduced_mask(a.ints, x.shape(), op, loc, mask);
  std::int64_t n = 1;
  for (int i = 0; i < x.rank(); ++i)
    if (mask[i]) n *= x.shape()[i];
  return n;
}

template <class Op>
Tensor axis_reduce(const Tensor& x, const std::vector<std::int64_t>& axes, bool keepdims,
                   const std::source_location& loc) {
  const ops::Attrs a = reduce_attrs(x, axes, keepdims, Op::name, loc);
  return dispatch<Op>({&x, 1}, a, loc);
}

}  // namespace detail

/// Sum over axes ({} = all), dropping them unless keepdims. bool sums as i64; integers keep
/// their dtype; an empty axis sums to 0.
inline Tensor sum(const Tensor& x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
                  std::source_location loc = std::source_location::current()) {
  return detail::axis_reduce<ops::Sum>(x, axes, keepdims, loc);
}
/// Largest element over axes ({} = all), in x's dtype (for bool: any); NaN propagates; an empty
/// reduced axis is a ValueError.
inline Tensor max(const Tensor& x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
                  std::source_location loc = std::source_location::current()) {
  return detail::axis_reduce<ops::Max>(x, axes, keepdims, loc);
}
/// Smallest element over axes ({} = all), in x's dtype (for bool: all); NaN propagates; an empty
/// reduced axis is a ValueError.
inline Tensor min(const Tensor& x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
                  std::source_location loc = std::source_location::current()) {
  return detail::axis_reduce<ops::Min>(x, axes, keepdims, loc);
}

/// Mean over axes ({} = all): sum / count. Floats keep their dtype; integers and bool give
/// f32 (summed in f64: large integer sums do not wrap, and are exact up to 2^53). An empty axis
/// gives NaN.
inline Tensor mean(const Tensor& x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
                   std::source_location loc = std::source_location::current()) {
  const ops::Attrs a = detail::reduce_attrs(x, axes, keepdims, "mean", loc);
  const double count = static_cast<double>(detail::reduced_count(x, a, "mean", loc));
  if (is_floating(x.dtype())) return div(sum(x, std::move(axes), keepdims, loc), count, loc);
  return cast(div(sum(cast(x, DType::f64, loc), std::move(axes), keepdims, loc), count, loc), DType::f32, loc);
}

/// Variance over axes ({} = all): mean((x - mean(x))^2) * n / (n - correction), two passes (no
/// cancellation of E[x^2] - E[x]^2). correction 0 (the default, NumPy's ddof) is the population
/// variance, 1 the unbiased sample variance. Floats keep their dtype; integers and bool give f32.
/// n <= correction gives NaN (an empty axis too); a negative correction is a ValueError.
inline Tensor var(const Tensor& x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
                  std::int64_t correction = 0, std::source_location loc = std::source_location::current()) {
  if (SC_UNLIKELY(correction < 0)) detail::fail<ValueError>("var", loc, "correction must be >= 0, got ", correction);
  const ops::Attrs a = detail::reduce_attrs(x, axes, keepdims, "var", loc);
  const std::int64_t n = detail::reduced_count(x, a, "var", loc);
  const Tensor xf = is_floating(x.dtype()) ? x : cast(x, DType::f32, loc);
  const Tensor d = sub(xf, mean(xf, axes, true, loc), loc);
  const Tensor ss = sum(mul(d, d, loc), std::move(axes), keepdims, loc);
  const double denom = static_cast<double>(n - correction);
  return n > correction ? div(ss, denom, loc) : mul(ss, std::numeric_limits<double>::quiet_NaN(), loc);
}

namespace detail {
/// The shift that keeps exp(x - shift) from overflowing: max(x) over axes, kept, or 0 where that
/// max is not finite. A constant to the tape (read from a stop_gradient view, so the max is not
/// even recorded): the results it shifts do not depend on its value.
inline Tensor logsumexp_shift(const Tensor& xf, const std::vector<std::int64_t>& axes,
                              const std::source_location& loc) {
  const Tensor m = max(stop_gradient(xf, loc), axes, true, loc);
  return where(less(abs(m, loc), std::numeric_limits<double>::infinity(), loc), m, 0.0, loc);
}
}  // namespace detail

/// log(sum(exp(x))) over axes ({} = all), computed stably: the max is subtracted first (0 where
/// it is not finite, so rows of -inf give -inf and +inf/NaN pass through). Integers give f32.
/// An empty reduced axis gives -inf.
inline Tensor logsumexp(const Tensor& x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
                        std::source_location loc = std::source_location::current()) {
  const ops::Attrs a = detail::reduce_attrs(x, axes, keepdims, "logsumexp", loc);
  const bool empty = detail::reduced_count(x, a, "logsumexp", loc) == 0;
  const Tensor xf = is_floating(x.dtype()) ? x : cast(x, DType::f32, loc);
  if (empty)  // no max to shift by; log(0) = -inf
    return log(sum(exp(xf, loc), std::move(axes), keepdims, loc), loc);
  // The shift is a constant to the tape: the gradient is softmax(x) exactly, at every order.
  const Tensor shift = detail::logsumexp_shift(xf, axes, loc);
  const Tensor s = sum(exp(sub(xf, shift, loc), loc), axes, keepdims, loc);
  // Without keepdims the shift loses its size-1 axes by a sum over them (a copy; no reshape).
  return add(log(s, loc), keepdims ? shift : sum(shift, std::move(axes), false, loc), loc);
}

/// Index (i64) of the first largest element along axis; NaN counts as the largest.
inline Tensor argmax(const Tensor& x, std::int64_t axis, std::source_location loc = std::source_location::current()) {
  ops::Attrs a;
  a.axis = axis;
  return detail::dispatch<ops::ArgMax>({&x, 1}, a, loc);
}
/// Index (i64) of the first smallest element along axis; NaN counts as the smallest.
inline Tensor argmin(const Tensor& x, std::int64_t axis, std::source_location loc = std::source_location::current()) {
  ops::Attrs a;
  a.axis = axis;
  return detail::dispatch<ops::ArgMin>({&x, 1}, a, loc);
}

// ---- gradient rules (after the functions they use) ---------------------------------------

namespace detail {

/// g, the reduction of a tensor of shape xs over attrs' axes, with the reduced axes back as
/// size-1 axes so that it broadcasts against the input. Without keepdims this needs a
/// reshape, unless only leading axes were reduced (broadcasting puts those back itself).
inline Tensor unreduce(const Tensor& g, const Shape& xs, const ops::Attrs& a) {
  if (a.flag) return g;
  bool mask[max_rank];
  ops::reduced_mask(a.ints, xs, "sum", std::source_location::current(), mask);
  int lead = 0;
  while (lead < xs.rank() && mask[lead]) ++lead;
  bool inner = false;
  Shape kept;
  for (int i = 0; i < xs.rank(); ++i) {
    inner |= i >= lead && mask[i];
    kept.push_back(mask[i] ? 1 : xs[i]);
  }
  return inner ? reshape(g, kept) : g;
}

/// The gradient of max/min: g goes to the elements equal to the result, divided equally
/// among ties (as TF). Where the result is NaN no element equals it and none gets gradient.
inline Tensor extremum_vjp(const Tensor& g, const Tensor& x, const Tensor& out, const ops::Attrs& a) {
  const Tensor hit = equal(x, unreduce(out, x.shape(), a));
  const Tensor count = sum(cast(hit, g.dtype()), a.ints.vec(), true);
  return where(hit, unreduce(g, x.shape(), a) / count, 0);
}

}  // namespace detail

}  // namespace stagecraft

// broadcast_to's rule sums and sum's rule feeds broadcasts: each header includes the other here,
// after its own declarations, so whichever comes first every function a rule names is declared.
#include "broadcast_to.hpp"

namespace stagecraft {

// Every element of the reduced block gets the block's gradient: g with the reduced axes kept
// (as 1), which broadcasts to x. The tape passes it on unbroadcast to rules that take it so (a
// loss's sum times its terms: no tensor of copies of one value) and broadcasts it (an op, so a
// trace records it rather than a constant of ones) for the others.
inline std::vector<Tensor> ops::Sum::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs& a) {
  return {detail::unreduce(g, in[0].shape(), a)};
}
inline std::vector<Tensor> ops::Max::vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a) {
  return {detail::extremum_vjp(g, in[0], out, a)};
}
inline std::vector<Tensor> ops::Min::vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a) {
  return {detail::extremum_vjp(g, in[0], out, a)};
}

}  // namespace stagecraft
