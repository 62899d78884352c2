// Shape: an inline small vector of extents (no heap), and the one broadcasting rule.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

#include "error.hpp"

namespace stagecraft {

/// Largest rank a tensor may have; shapes live inline, so dispatch never allocates for them.
inline constexpr int max_rank = 8;

/// Extents of a tensor, outermost first. Also used for axis lists and strides.
class Shape {
 public:
  using value_type = std::int64_t;
  constexpr Shape() = default;
  constexpr Shape(std::initializer_list<std::int64_t> dims) { assign(dims.begin(), dims.end()); }
  Shape(const std::vector<std::int64_t>& dims) { assign(dims.begin(), dims.end()); }  // NOLINT
  template <class It>
  constexpr Shape(It first, It last) { assign(first, last); }

  constexpr int rank() const { return rank_; }
  constexpr std::size_t size() const { return rank_; }
  constexpr bool empty() const { return rank_ == 0; }
  constexpr std::int64_t operator[](int i) const { return d_[i]; }
  constexpr std::int64_t& operator[](int i) { return d_[i]; }
  constexpr const std::int64_t* begin() const { return d_.data(); }
  constexpr const std::int64_t* end() const { return d_.data() + rank_; }
  constexpr std::int64_t* begin() { return d_.data(); }
  constexpr std::int64_t* end() { return d_.data() + rank_; }
  constexpr const std::int64_t* data() const { return d_.data(); }
  constexpr std::int64_t back() const { return d_[rank_ - 1]; }

  /// Number of elements (1 for rank 0).
  constexpr std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= d_[i];
    return n;
  }
  constexpr void push_back(std::int64_t v) {
    if (rank_ >= max_rank) throw ShapeError("[shape] rank above " + std::to_string(max_rank) + " is not supported");
    d_[rank_++] = v;
  }
  constexpr void pop_back() { --rank_; }
  constexpr void resize(int r, std::int64_t fill = 0) {
    if (r > max_rank) throw ShapeError("[shape] rank above " + std::to_string(max_rank) + " is not supported");
    for (int i = rank_; i < r; ++i) d_[i] = fill;
    rank_ = static_cast<std::uint8_t>(r);
  }
  std::vector<std::int64_t> vec() const { return {begin(), end()}; }

  friend constexpr bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i)
      if (a.d_[i] != b.d_[i]) return false;
    return true;
  }
  /// "[2, 3]"; "[]" for a scalar.
  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(d_[i]);
    return s + "]";
  }
  friend std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.str(); }

 private:
  template <class It>
  constexpr void assign(It first, It last) {
    for (; first != last; ++first) push_back(static_cast<std::int64_t>(*first));
  }
  std::array<std::int64_t, max_rank> d_{};
  std::uint8_t rank_ = 0;
};

/// Row-major strides (in elements) of a contiguous tensor of this shape.
constexpr Shape contiguous_strides(const Shape& s) {
  Shape st;
  st.resize(s.rank());
  std::int64_t acc = 1;
  for (int i = s.rank() - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

/// The broadcasting rule (NumPy's): align trailing axes; each pair of extents must be equal
/// or one of them 1. Returns false when the shapes do not broadcast.
constexpr bool broadcast_shapes(const Shape& a, const Shape& b, Shape& out) {
  const int r = std::max(a.rank(), b.rank());
  out.resize(r);
  for (int i = 0; i < r; ++i) {
    const int ia = a.rank() - r + i, ib = b.rank() - r + i;
    const std::int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da == db || db == 1) out[i] = da;
    else if (da == 1) out[i] = db;
    else return false;
  }
  return true;
}

/// Strides (in elements) to read a contiguous tensor of shape `in` as if it had shape `out`
/// (which it broadcasts to): broadcast axes get stride 0.
constexpr Shape broadcast_strides(const Shape& in, const Shape& out) {
  Shape st;
  st.resize(out.rank());
  const Shape cs = contiguous_strides(in);
  const int off = out.rank() - in.rank();
  for (int i = 0; i < out.rank(); ++i) {
    const int j = i - off;
    st[i] = (j < 0 || in[j] == 1) ? 0 : cs[j];
  }
  return st;
}

/// A shape seen around one axis, as kernels walk it: `outer` blocks of `n` steps along the axis,
/// each step `inner` contiguous elements (element (o, k, i) at (o * n + k) * inner + i).
struct AxisSplit {
  std::int64_t outer = 1, n = 1, inner = 1;
};
/// s split at `axis` (in [-rank, rank), already checked; negative counts from the end).
constexpr AxisSplit axis_split(const Shape& s, std::int64_t axis) {
  const int ax = static_cast<int>(axis < 0 ? axis + s.rank() : axis);
  AxisSplit sp;
  for (int d = 0; d < ax; ++d) sp.outer *= s[d];
  sp.n = s[ax];
  for (int d = ax + 1; d < s.rank(); ++d) sp.inner *= s[d];
  return sp;
}

/// Most bytes one tensor may hold (2^62): beyond any machine, and low enough that byte counts,
/// allocator size classes and element offsets computed from a valid shape never overflow.
inline constexpr std::int64_t max_tensor_bytes = std::int64_t{1} << 62;

namespace detail {
/// The elements of a tensor of shape s whose elements take `item` bytes. ShapeError naming op
/// when an extent is negative or the tensor would take more than max_tensor_bytes; the extents
/// of an empty tensor count too (a [0, 5, 2^62] tensor would overflow its strides). Shape::numel
/// does not check: it is on every op's path, and every new tensor's shape comes through here.
[[noreturn]] SC_COLD inline void bad_shape(const Shape& s, std::int64_t item, std::string_view op,
                                           const std::source_location& loc) {
  for (std::int64_t d : s)
    if (d < 0) fail<ShapeError>(op, loc, "negative extent in shape ", s);
  fail<ShapeError>(op, loc, "shape ", s, " is too large: more than 2^62 bytes at ", item, " bytes an element");
}
/// checked_numel's rule without the throw, for readers of untrusted files: the bytes of a tensor
/// of shape s with `item`-byte elements in `out`, or false when no tensor may have that shape.
inline bool shape_bytes(const Shape& s, std::int64_t item, std::uint64_t& out) noexcept {
  std::int64_t n = 1, extent_bytes = item;
  for (std::int64_t e : s) {
    if (e < 0) return false;
    if (e != 0 && (__builtin_mul_overflow(extent_bytes, e, &extent_bytes) || extent_bytes > max_tensor_bytes))
      return false;
    n *= e;  // cannot overflow: |n| * item <= extent_bytes
  }
  out = static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(item);
  return true;
}
inline std::int64_t checked_numel(const Shape& s, std::int64_t item, std::string_view op,
                                  const std::source_location& loc) {
  std::int64_t bytes = item, n = 1;
  bool bad = false;  // one test at the end: this is on every new tensor's path
  for (std::int64_t d : s) {
    bad |= d < 0;
    if (d != 0) bad |= __builtin_mul_overflow(bytes, d, &bytes);
    n *= d;  // cannot overflow unless bad: |n| <= bytes
  }
  if (SC_UNLIKELY(bad || bytes > max_tensor_bytes)) bad_shape(s, item, op, loc);
  return n;
}
}  // namespace detail

/// Turns a possibly negative axis into [0, rank); throws ShapeError naming the op otherwise.
/// (Ops that insert an axis, like expand_dims and stack, pass rank + 1.)
inline int normalize_axis(std::int64_t axis, int rank, std::string_view op,
                          const std::source_location& loc) {
  if (axis < -rank || axis >= rank)
    detail::fail<ShapeError>(op, loc, "axis ", axis, " is out of range for rank ", rank);
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

}  // namespace stagecraft
