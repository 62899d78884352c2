// concat(xs, axis) and stack(xs, axis).
#pragma once
#include <concepts>
#include <cstring>
#include <tuple>
#include <type_traits>

#include "../backend/cpu/parallel.hpp"
#include "cast.hpp"  // dispatch promotes mixed dtypes through Cast
#include "reshape.hpp"

namespace stagecraft {
namespace ops {

/// The inputs joined along attrs.axis (negative counts from the end). Inputs are promoted to
/// their common dtype first; every other extent must match; inputs may be empty along the axis.
struct Concat {
  SC_OP_HEAD(Concat, "concat")
  static constexpr int arity = -1;
  static constexpr int promote_from = 0;

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    if (SC_UNLIKELY(in.empty())) detail::fail<ValueError>(name, loc, "needs at least one tensor, got an empty list");
    const Shape& s0 = in[0].shape();
    if (SC_UNLIKELY(s0.rank() == 0))
      detail::fail<ShapeError>(name, loc, "cannot join rank-0 tensors (shape []); use sc::stack");
    const int ax = normalize_axis(a.axis, s0.rank(), name, loc);
    Shape out = s0;
    for (std::size_t i = 1; i < in.size(); ++i) {
      const Shape& si = in[i].shape();
      bool ok = si.rank() == s0.rank();
      for (int k = 0; ok && k < s0.rank(); ++k) ok = k == ax || si[k] == s0[k];
      if (SC_UNLIKELY(!ok))
        detail::fail<ShapeError>(name, loc, "shapes must match except along axis ", a.axis, ", got ", s0,
                                 " (tensor 0) and ", si, " (tensor ", i, ")");
      out[ax] += si[ax];
    }
    return {out, in[0].dtype()};
  }
  /// Output row o (an index over the axes before `axis`) is the inputs' rows o, one after another.
  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    if (out.numel() == 0) return;
    const Shape& os = out.shape();
    const int ax = static_cast<int>(a.axis < 0 ? a.axis + os.rank() : a.axis);  // infer checked it
    const AxisSplit sp = axis_split(os, ax);
    const std::int64_t outer = sp.outer, inner = sp.inner;
    const std::size_t isz = itemsize(out.dtype());
    const std::int64_t row = sp.n * inner;  // elements of one output row
    auto* y = static_cast<std::byte*>(out.raw_data());
    backend::cpu::parallel_rows(outer, row, backend::cpu::grain_cheap,
                               [&](std::int64_t ob, std::int64_t oe) {
      for (std::int64_t o = ob; o < oe; ++o) {
        std::byte* dst = y + static_cast<std::size_t>(o * row) * isz;
        for (const Tensor& t : in) {
          const std::size_t n = static_cast<std::size_t>(t.shape()[ax] * inner) * isz;
          if (n == 0) continue;
          std::memcpy(dst, static_cast<const std::byte*>(t.raw_data()) + static_cast<std::size_t>(o) * n, n);
          dst += n;
        }
      }
    });
  }
  /// Every input copied into its block of each output row, all in one launch.
  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    const Shape& os = out.shape();
    const int ax = static_cast<int>(a.axis < 0 ? a.axis + os.rank() : a.axis);
    const AxisSplit sp = axis_split(os, ax);
    const std::int64_t outer = sp.outer, inner = sp.inner;
    const std::int64_t row = sp.n * inner;  // elements of one output row
    const auto isz = static_cast<std::int64_t>(itemsize(out.dtype()));
    std::vector<backend::cuda::abi::ConcatPiece> pieces;
    pieces.reserve(in.size());
    std::int64_t at = 0;  // the block's first element in a row
    for (const Tensor& t : in) {
      const std::int64_t n = t.shape()[ax] * inner;
      if (n > 0 && outer > 0)
        pieces.push_back({t.raw_data(), static_cast<std::byte*>(out.raw_data()) + at * isz, outer, n, row});
      at += n;
    }
    backend::cuda::concat(pieces, out.dtype(), out.device(), name, loc);
  }
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);
};

}  // namespace ops

/// The tensors joined along an existing axis (negative counts from the end). Dtypes are
/// promoted to the common one; all other extents must match. An empty list is a ValueError.
inline Tensor concat(const std::vector<Tensor>& xs, std::int64_t axis,
                     std::source_location loc = std::source_location::current()) {
  ops::Attrs a;
  a.axis = axis;
  return detail::dispatch<ops::Concat>(xs, a, loc);
}

/// The tensors, which must all have the same shape, joined along a new axis at position
/// `axis` (in [-rank-1, rank]). An empty list is a ValueError.
inline Tensor stack(const std::vector<Tensor>& xs, std::int64_t axis = 0,
                    std::source_location loc = std::source_location::current()) {
  if (SC_UNLIKELY(xs.empty())) detail::fail<ValueError>("stack", loc, "needs at least one tensor, got an empty list");
  detail::require_defined(xs[0], "stack", loc);
  const int r = xs[0].rank();
  if (SC_UNLIKELY(axis < -r - 1 || axis > r))
    detail::fail<ShapeError>("stack", loc, "axis ", axis, " is out of range [", -r - 1, ", ", r,
                             "] for tensors of shape ", xs[0].shape());
  std::vector<Tensor> parts;
  parts.reserve(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    detail::require_defined(xs[i], "stack", loc);
    if (SC_UNLIKELY(!(xs[i].shape() == xs[0].shape())))
      detail::fail<ShapeError>("stack", loc, "all tensors must have the same shape, got ", xs[0].shape(),
                               " (tensor 0) and ", xs[i].shape(), " (tensor ", i, ")");
    parts.push_back(expand_dims(xs[i], axis, loc));
  }
  return concat(parts, axis, loc);
}

/// concat of a tuple of tensors: concat(std::tuple{a, b}, 1). The same call joins staged values
/// (staged/materialized.hpp), whose types differ, so one generic function serves every stage.
template <class... T>
  requires(sizeof...(T) >= 1 && (std::same_as<std::remove_cvref_t<T>, Tensor> && ...))
Tensor concat(const std::tuple<T...>& xs, std::int64_t axis, std::source_location loc = std::source_location::current()) {
  return std::apply([&](const auto&... x) { return concat(std::vector<Tensor>{x...}, axis, loc); }, xs);
}
/// stack of a tuple of tensors: stack(std::tuple{a, b}, 0) (staged values too).
template <class... T>
  requires(sizeof...(T) >= 1 && (std::same_as<std::remove_cvref_t<T>, Tensor> && ...))
Tensor stack(const std::tuple<T...>& xs, std::int64_t axis = 0,
             std::source_location loc = std::source_location::current()) {
  return std::apply([&](const auto&... x) { return stack(std::vector<Tensor>{x...}, axis, loc); }, xs);
}

}  // namespace stagecraft

// ---- gradient rule ------------------------------------------------------------------------
// It slices, and slice's own rule pads with concat: each header includes the other here, after
// its own declarations, so whichever comes first every function a rule names is declared.
#include "slice.hpp"

namespace stagecraft {

// Input i's gradient is its own box of g: the slice along `axis` at i's offset.
inline std::vector<Tensor> ops::Concat::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs& a) {
  if (in.size() == 1) return {g};
  const int r = g.rank();
  const int ax = static_cast<int>(a.axis < 0 ? a.axis + r : a.axis);  // infer checked it
  std::vector<std::int64_t> begin(static_cast<std::size_t>(r), 0), size(static_cast<std::size_t>(r), -1);
  std::vector<Tensor> gs;
  gs.reserve(in.size());
  for (const Tensor& x : in) {
    size[static_cast<std::size_t>(ax)] = x.shape()[ax];
    gs.push_back(slice(g, begin, size));
    begin[static_cast<std::size_t>(ax)] += x.shape()[ax];
  }
  return gs;
}

}  // namespace stagecraft
