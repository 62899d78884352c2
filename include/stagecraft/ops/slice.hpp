// slice(x, begin, size): a contiguous copy of a box of x.
#pragma once
#include "transpose.hpp"

namespace stagecraft {
namespace ops {

/// The box of x starting at attrs.ints (begin; negative counts from the end of the axis) with
/// extents attrs.ints2 (size; -1 runs to the end of the axis), copied.
struct Slice {
  SC_OP_HEAD(Slice, "slice")
  static constexpr int arity = 1;

  /// The begin index of axis k with negatives resolved (not range-checked).
  static std::int64_t start(const Shape& xs, const Attrs& a, int k) {
    return a.ints[k] < 0 ? a.ints[k] + xs[k] : a.ints[k];
  }
  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    const Shape& xs = in[0].shape();
    if (SC_UNLIKELY(a.ints.rank() != xs.rank() || a.ints2.rank() != xs.rank()))
      detail::fail<ShapeError>(name, loc, "begin ", a.ints, " and size ", a.ints2,
                               " need one entry per axis of shape ", xs, " (rank ", xs.rank(), ")");
    Shape out;
    for (int k = 0; k < xs.rank(); ++k) {
      const std::int64_t b = start(xs, a, k), s = a.ints2[k] == -1 ? xs[k] - b : a.ints2[k];
      if (SC_UNLIKELY(b < 0 || b > xs[k] || s < 0 || s > xs[k] - b))  // b + s could overflow
        detail::fail<ShapeError>(name, loc, "begin ", a.ints, " and size ", a.ints2,
                                 " are out of range for shape ", xs, " (axis ", k, ")");
      out.push_back(s);
    }
    return {out, in[0].dtype()};
  }
  /// The slice's first element in x (on x's device) and x's strides, which the copy walks.
  static const std::byte* first(const Tensor& x, const Attrs& a, Shape& strides) {
    const Shape& xs = x.shape();
    strides = contiguous_strides(xs);
    std::int64_t offset = 0;
    for (int k = 0; k < xs.rank(); ++k) offset += start(xs, a, k) * strides[k];
    return static_cast<const std::byte*>(x.raw_data()) + offset * static_cast<std::int64_t>(itemsize(x.dtype()));
  }
  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    if (out.numel() == 0) return;
    Shape cs;
    const std::byte* base = first(in[0], a, cs);
    backend::cpu::strided_copy(base, out.raw_data(), out.shape(), cs, out.dtype());
  }
  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    if (out.numel() == 0) return;
    Shape cs;
    const std::byte* base = first(in[0], a, cs);
    backend::cuda::strided_copy(base, out.shape(), cs, out.raw_data(), contiguous_strides(out.shape()), out.dtype(),
                                out.device(), name, loc);
  }
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};

}  // namespace ops

/// A copy of the box of x that starts at `begin` and has extents `size`, one entry per axis.
/// A negative begin counts from the end of its axis (-1 is the last element); a size of -1
/// runs to the end of the axis. A box that leaves x is a ShapeError.
inline Tensor slice(const Tensor& x, std::vector<std::int64_t> begin, std::vector<std::int64_t> size,
                    std::source_location loc = std::source_location::current()) {
  detail::require_defined(x, "slice", loc);
  ops::Attrs a;
  a.ints = ops::layout::to_shape_arg(begin, "slice", "begin", x, loc);
  a.ints2 = ops::layout::to_shape_arg(size, "slice", "size", x, loc);
  return detail::dispatch<ops::Slice>({&x, 1}, a, loc);
}

}  // namespace stagecraft

// ---- gradient rule ------------------------------------------------------------------------
// It pads with concat, and concat's own rule slices: each header includes the other here,
// after its own declarations, so whichever comes first every function a rule names is declared.
#include "concat.hpp"
#include "fill.hpp"

namespace stagecraft {

// The adjoint of taking a box: g put back in place, zeros around it. Written with concat (one
// per axis the box does not span; zero blocks on either side) rather than a padding kernel:
// a slice usually cuts one axis, and then this is one copy, as a kernel would make; concat's
// rule slices, so higher derivatives need nothing more.
inline std::vector<Tensor> ops::Slice::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs& a) {
  const Shape& xs = in[0].shape();
  Tensor r = g;
  for (int k = 0; k < xs.rank(); ++k) {
    const std::int64_t before = start(xs, a, k), after = xs[k] - before - g.shape()[k];
    if (before == 0 && after == 0) continue;
    Shape block = r.shape();
    std::vector<Tensor> parts;
    if (before > 0) {
      block[k] = before;
      parts.push_back(detail::fill_on(g.device(), block, 0.0, g.dtype()));
    }
    parts.push_back(r);
    if (after > 0) {
      block[k] = after;
      parts.push_back(detail::fill_on(g.device(), block, 0.0, g.dtype()));
    }
    r = concat(parts, k);
  }
  return {r};
}

}  // namespace stagecraft
