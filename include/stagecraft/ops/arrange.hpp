// pad, tile, split and flip: layout ops written with the others (concat, broadcast_to, reshape,
// slice, gather), so they have those ops' gradients and kernels, run on every device and fuse or
// plan like them when traced. Each checks its own arguments: errors name it and the user's line.
#pragma once
#include <cstdint>
#include <limits>
#include <source_location>
#include <utility>
#include <vector>

#include "../core/creation.hpp"
#include "broadcast_to.hpp"
#include "concat.hpp"
#include "gather.hpp"
#include "reshape.hpp"
#include "slice.hpp"

namespace stagecraft {

/// x with `pads[d] = {before, after}` elements of `value` added on each side of axis d (one pair
/// per axis, in order; NumPy's np.pad with a constant, TensorFlow's tf.pad). The value is
/// converted to x's dtype as cast() converts it. Negative pads are a ValueError (slice to crop). Its gradient is the slice of the padded one.
inline Tensor pad(const Tensor& x, const std::vector<std::pair<std::int64_t, std::int64_t>>& pads, double value = 0,
                  std::source_location loc = std::source_location::current()) {
  detail::require_defined(x, "pad", loc);
  if (SC_UNLIKELY(static_cast<int>(pads.size()) != x.rank()))
    detail::fail<ShapeError>("pad", loc, "needs one (before, after) pair per axis: ", pads.size(), " pairs for x of shape ",
                             x.shape());
  Tensor y = x;
  const detail::DevicePin on(x.device());  // the fills go where x is, whatever the scope
  for (int d = 0; d < x.rank(); ++d) {
    const auto [before, after] = pads[static_cast<std::size_t>(d)];
    if (SC_UNLIKELY(before < 0 || after < 0))
      detail::fail<ValueError>("pad", loc, "pads must be >= 0, got (", before, ", ", after, ") for axis ", d,
                               " of x ", x.shape(), " (slice to crop)");
    if (before == 0 && after == 0) continue;
    std::vector<Tensor> parts;
    const auto fill = [&](std::int64_t n) {
      Shape s = y.shape();
      s[d] = n;
      return detail::full_as(s, value, x.dtype(), "pad", loc);
    };
    if (before > 0) parts.push_back(fill(before));
    parts.push_back(y);
    if (after > 0) parts.push_back(fill(after));
    y = concat(parts, d, loc);
  }
  return y;
}

/// x repeated reps[d] times along axis d (NumPy's np.tile, TensorFlow's tf.tile): with more reps
/// than axes, x gains leading axes of extent 1 first. reps >= 0 (0: an empty axis).
inline Tensor tile(const Tensor& x, const std::vector<std::int64_t>& reps,
                   std::source_location loc = std::source_location::current()) {
  detail::require_defined(x, "tile", loc);
  if (SC_UNLIKELY(static_cast<int>(reps.size()) < x.rank()))
    detail::fail<ShapeError>("tile", loc, "needs a repetition count per axis: ", reps.size(), " for x of shape ", x.shape());
  for (const std::int64_t r : reps)
    if (SC_UNLIKELY(r < 0)) detail::fail<ValueError>("tile", loc, "repetition counts must be >= 0, got ", r);
  const int rank = static_cast<int>(reps.size()), lead = rank - x.rank();
  Shape shape, out;
  for (int d = 0; d < rank; ++d) {
    const std::int64_t e = d < lead ? 1 : x.shape()[d - lead], r = reps[static_cast<std::size_t>(d)];
    if (SC_UNLIKELY(e > 0 && r > std::numeric_limits<std::int64_t>::max() / e))
      detail::fail<ShapeError>("tile", loc, "repeating x ", x.shape(), " ", r, " times along axis ", d,
                               " overflows int64");
    shape.push_back(e);
    out.push_back(r * e);
  }
  check_shape(out, "tile", loc, x.dtype());
  // Axis by axis: [pre, e, post] as [pre, 1, e, post], broadcast to [pre, r, e, post] and joined.
  Tensor y = reshape(x, shape, loc);
  for (int d = 0; d < rank; ++d) {
    const std::int64_t r = reps[static_cast<std::size_t>(d)];
    if (r == 1) continue;
    std::int64_t pre = 1, post = 1;
    for (int k = 0; k < d; ++k) pre *= shape[k];
    for (int k = d + 1; k < rank; ++k) post *= shape[k];
    y = broadcast_to(reshape(y, {pre, 1, shape[d], post}, loc), {pre, r, shape[d], post}, loc);
    shape[d] *= r;
    y = reshape(y, shape, loc);
  }
  return y;
}

/// x cut along `axis` into pieces of the given extents, which must add up to the axis's extent
/// (TensorFlow's tf.split with sizes; PyTorch's torch.split with a list).
inline std::vector<Tensor> split(const Tensor& x, const std::vector<std::int64_t>& sizes, std::int64_t axis = 0,
                                 std::source_location loc = std::source_location::current()) {
  detail::require_defined(x, "split", loc);
  const int ax = normalize_axis(axis, x.rank(), "split", loc);
  std::int64_t total = 0;
  for (const std::int64_t s : sizes) {
    if (SC_UNLIKELY(s < 0)) detail::fail<ValueError>("split", loc, "sizes must be >= 0, got ", s);
    total += s;
  }
  if (SC_UNLIKELY(total != x.shape()[ax]))
    detail::fail<ShapeError>("split", loc, "sizes add up to ", total, ", not to the extent ", x.shape()[ax], " of axis ",
                             axis, " of x ", x.shape());
  std::vector<Tensor> out;
  out.reserve(sizes.size());
  std::vector<std::int64_t> begin(static_cast<std::size_t>(x.rank()), 0), size(static_cast<std::size_t>(x.rank()), -1);
  for (const std::int64_t s : sizes) {
    size[static_cast<std::size_t>(ax)] = s;
    out.push_back(slice(x, begin, size, loc));
    begin[static_cast<std::size_t>(ax)] += s;
  }
  return out;
}

/// x cut along `axis` into `pieces` equal parts (the extent must divide evenly).
inline std::vector<Tensor> split(const Tensor& x, int pieces, std::int64_t axis = 0,
                                 std::source_location loc = std::source_location::current()) {
  detail::require_defined(x, "split", loc);
  const int ax = normalize_axis(axis, x.rank(), "split", loc);
  if (SC_UNLIKELY(pieces < 1 || x.shape()[ax] % pieces != 0))
    detail::fail<ShapeError>("split", loc, "cannot cut axis ", axis, " of x ", x.shape(), " into ", pieces, " equal pieces");
  return split(x, std::vector<std::int64_t>(static_cast<std::size_t>(pieces), x.shape()[ax] / pieces), axis, loc);
}

/// x with the order of its elements reversed along each of `axes` (NumPy's np.flip, TensorFlow's
/// tf.reverse); negative axes count from the end, each at most once.
inline Tensor flip(const Tensor& x, const std::vector<std::int64_t>& axes,
                   std::source_location loc = std::source_location::current()) {
  detail::require_defined(x, "flip", loc);
  std::vector<char> seen(static_cast<std::size_t>(x.rank()), 0);
  Tensor y = x;
  const detail::DevicePin on(x.device());  // the indices go where x is
  for (const std::int64_t a : axes) {
    const int ax = normalize_axis(a, x.rank(), "flip", loc);
    if (SC_UNLIKELY(seen[static_cast<std::size_t>(ax)]++))
      detail::fail<ValueError>("flip", loc, "axis ", a, " is given twice for x of shape ", x.shape());
    const std::int64_t n = x.shape()[ax];
    if (n < 2) continue;
    y = gather(y, detail::arange_i64(n - 1, -1, -1, loc), ax, loc);
  }
  return y;
}

}  // namespace stagecraft
