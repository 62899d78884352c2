// reshape (a view: shares storage), expand_dims, squeeze, flatten; helpers of the layout ops.
#pragma once
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "../eager/dispatch.hpp"

namespace stagecraft {
namespace ops {

namespace layout {

/// "[1, -2, 3]": a list argument as printed in errors (it may be longer than a Shape holds).
inline std::string list_str(const std::vector<std::int64_t>& v) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << ']';
  return os.str();
}

/// A list argument (perm, begin, size) as a Shape for Attrs; more than max_rank entries cannot
/// match any tensor, so it is a ShapeError naming the user's call rather than Shape's own error.
inline Shape to_shape_arg(const std::vector<std::int64_t>& v, std::string_view op, const char* what,
                          const Tensor& x, const std::source_location& loc) {
  if (SC_UNLIKELY(v.size() > static_cast<std::size_t>(max_rank)))
    detail::fail<ShapeError>(op, loc, what, ' ', list_str(v), " has ", v.size(),
                             " entries, but the input has shape ", x.shape(), " (rank ", x.rank(), ")");
  return Shape(v);
}

/// The attrs of the ops that take a target shape (reshape, broadcast_to): ints = shape.
inline Attrs shape_attrs(const Shape& shape) {
  Attrs a;
  a.ints = shape;
  return a;
}

/// Calls f(type_tag<U>{}) with U an unsigned type of the given element size: layout ops move
/// bytes, so one instantiation per element size serves every dtype (bool, i32/f32, i64/f64).
template <class F>
decltype(auto) visit_bytes(std::size_t itemsize, F&& f) {
  switch (itemsize) {
    case 1: return f(type_tag<std::uint8_t>{});
    case 4: return f(type_tag<std::uint32_t>{});
    default: break;
  }
  return f(type_tag<std::uint64_t>{});
}

}  // namespace layout

/// A view with a new shape over the same storage. Reads attrs.ints (the target shape; one
/// extent may be -1 and is inferred from the element count).
struct Reshape {
  SC_OP_HEAD(Reshape, "reshape")
  static constexpr int arity = 1;

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    const Shape& from = in[0].shape();
    Shape to = a.ints;
    int infer_at = -1;
    std::int64_t known = 1;
    for (int i = 0; i < to.rank(); ++i) {
      if (to[i] == -1) {
        if (SC_UNLIKELY(infer_at >= 0))
          detail::fail<ShapeError>(name, loc, "only one -1 is allowed, got target shape ", a.ints,
                                   " for input shape ", from);
        infer_at = i;
      } else if (SC_UNLIKELY(to[i] < 0)) {
        detail::fail<ShapeError>(name, loc, "negative extent in target shape ", a.ints,
                                 " for input shape ", from);
      } else if (SC_UNLIKELY(__builtin_mul_overflow(known, to[i], &known))) {
        detail::fail<ShapeError>(name, loc, "target shape ", a.ints, " has more elements than an int64 holds",
                                 " (input shape ", from, ")");
      }
    }
    const std::int64_t n = from.numel();
    if (infer_at >= 0) {
      // With a 0 among the known extents any value fits the -1 (as NumPy/PyTorch, refuse).
      if (SC_UNLIKELY(known == 0 || n % known != 0))
        detail::fail<ShapeError>(name, loc, "cannot reshape ", from, " (", n, " elements) into ",
                                 a.ints, known == 0 && n == 0 ? ": the -1 is ambiguous next to a 0 extent" : "");
      to[infer_at] = n / known;
    } else if (SC_UNLIKELY(known != n)) {
      detail::fail<ShapeError>(name, loc, "cannot reshape ", from, " (", n, " elements) into ", to,
                               " (", known, " elements)");
    }
    detail::checked_numel(to, itemsize(in[0].dtype()), name, loc);  // a 0 extent can hide huge ones
    return {to, in[0].dtype()};
  }
  /// Tensors are contiguous row-major, so any reshape is a view.
  static Tensor alias(const Tensor& in, const OutMeta& meta) { return detail::alias_tensor(in, meta.shape); }
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};

}  // namespace ops

/// x with a new shape, sharing x's storage (no copy). One extent may be -1: it is inferred.
/// Shapes are written as lists: sc::reshape(x, {2, -1}).
inline Tensor reshape(const Tensor& x, Shape shape, std::source_location loc = std::source_location::current()) {
  return detail::dispatch<ops::Reshape>({&x, 1}, ops::layout::shape_attrs(shape), loc);
}

/// x with a new size-1 axis at position `axis` (in [-rank-1, rank]; -1 appends). A view.
inline Tensor expand_dims(const Tensor& x, std::int64_t axis,
                          std::source_location loc = std::source_location::current()) {
  detail::require_defined(x, "expand_dims", loc);
  const int r = x.rank();
  if (SC_UNLIKELY(axis < -r - 1 || axis > r))
    detail::fail<ShapeError>("expand_dims", loc, "axis ", axis, " is out of range [", -r - 1, ", ", r,
                             "] for shape ", x.shape());
  if (SC_UNLIKELY(r >= max_rank))
    detail::fail<ShapeError>("expand_dims", loc, "shape ", x.shape(), " already has the maximum rank ", max_rank);
  const int at = static_cast<int>(axis < 0 ? axis + r + 1 : axis);
  Shape s;
  for (int i = 0; i < r; ++i) {
    if (i == at) s.push_back(1);
    s.push_back(x.shape()[i]);
  }
  if (at == r) s.push_back(1);
  return reshape(x, s, loc);
}

/// x without size-1 axes: all of them when `axes` is empty, else exactly those listed
/// (negative counts from the end); listing an axis whose extent is not 1 is a ShapeError. A view.
inline Tensor squeeze(const Tensor& x, std::vector<std::int64_t> axes = {},
                      std::source_location loc = std::source_location::current()) {
  detail::require_defined(x, "squeeze", loc);
  const Shape& xs = x.shape();
  bool drop[max_rank] = {};
  if (axes.empty()) {
    for (int i = 0; i < xs.rank(); ++i) drop[i] = xs[i] == 1;
  } else {
    for (std::int64_t ax : axes) {
      const int i = normalize_axis(ax, xs.rank(), "squeeze", loc);
      if (SC_UNLIKELY(drop[i]))
        detail::fail<ShapeError>("squeeze", loc, "axis ", ax, " is listed twice in ", ops::layout::list_str(axes));
      if (SC_UNLIKELY(xs[i] != 1))
        detail::fail<ShapeError>("squeeze", loc, "cannot squeeze axis ", ax, " of shape ", xs,
                                 ": its extent is ", xs[i], ", not 1");
      drop[i] = true;
    }
  }
  Shape s;
  for (int i = 0; i < xs.rank(); ++i)
    if (!drop[i]) s.push_back(xs[i]);
  return reshape(x, s, loc);
}

/// x with the axes from start_axis on merged into one: flatten(x) is 1-D, flatten(x, 1) of
/// [N, C, H, W] is [N, C*H*W]. start_axis is in [-rank, rank) (0 for a scalar). A view.
inline Tensor flatten(const Tensor& x, std::int64_t start_axis = 0,
                      std::source_location loc = std::source_location::current()) {
  detail::require_defined(x, "flatten", loc);
  const Shape& xs = x.shape();
  const int r = xs.rank();
  if (r == 0) {
    if (SC_UNLIKELY(start_axis != 0))
      detail::fail<ShapeError>("flatten", loc, "start_axis ", start_axis, " is out of range for a rank-0 tensor");
    return reshape(x, Shape{1}, loc);
  }
  const int start = normalize_axis(start_axis, r, "flatten", loc);
  Shape s(xs.begin(), xs.begin() + start);
  std::int64_t rest = 1;
  for (int i = start; i < r; ++i) rest *= xs[i];
  s.push_back(rest);
  return reshape(x, s, loc);
}

// ---- gradient rule (after sc::reshape, which it uses) -------------------------------------
// The same elements in the input's shape: a view, no copy. No other op is needed here (this
// header must not include reduce.hpp, whose rules reshape: that would be a cycle).
inline std::vector<Tensor> ops::Reshape::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs&) {
  return {reshape(g, in[0].shape())};
}

}  // namespace stagecraft
