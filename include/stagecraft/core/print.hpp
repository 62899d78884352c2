// NumPy-like printing: aligned columns, one precision per tensor, large tensors elided.
#pragma once
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "tensor.hpp"

namespace stagecraft {

/// Printing options (per thread).
struct PrintOptions {
  std::int64_t threshold = 1000;  ///< tensors with more elements are elided
  std::int64_t edgeitems = 3;     ///< items kept at each edge of an elided axis
  int precision = 4;              ///< digits after the point for floats
};
inline PrintOptions& print_options() {
  thread_local PrintOptions o;
  return o;
}

namespace detail {

/// Formats every shown element, then pads them to one width.
class Printer {
 public:
  Printer(const Tensor& t, const PrintOptions& o) : t_(t), o_(o), elide_(t.numel() > o.threshold) {}

  void print(std::ostream& os, int indent) {
    collect(0, 0);
    format_floats();
    std::size_t w = 0;
    for (auto& s : cells_) w = std::max(w, s.size());
    width_ = w;
    next_ = 0;
    emit(os, 0, 0, indent);
  }

 private:
  bool skip(int axis, std::int64_t i) const {
    const std::int64_t n = t_.shape()[axis];
    return elide_ && n > 2 * o_.edgeitems && i >= o_.edgeitems && i < n - o_.edgeitems;
  }
  std::int64_t stride(int axis) const {
    std::int64_t s = 1;
    for (int d = axis + 1; d < t_.rank(); ++d) s *= t_.shape()[d];
    return s;
  }
  void collect(int axis, std::int64_t base) {
    if (axis == t_.rank()) {
      cells_.push_back(format(base));
      return;
    }
    for (std::int64_t i = 0; i < t_.shape()[axis]; ++i)
      if (!skip(axis, i)) collect(axis + 1, base + i * stride(axis));
  }
  std::string format(std::int64_t i) const {
    switch (t_.dtype()) {
      case DType::b8: return static_cast<const bool*>(t_.raw_data())[i] ? "true" : "false";
      case DType::i32: return std::to_string(static_cast<const std::int32_t*>(t_.raw_data())[i]);
      case DType::i64: return std::to_string(static_cast<const std::int64_t*>(t_.raw_data())[i]);
      default: break;
    }
    return "\x01" + std::to_string(i);  // a float: formatted once the precision is known
  }
  /// Floats share one format per tensor: the fewest decimals (<= precision) that show every
  /// element, or scientific notation when magnitudes are very large or very small.
  void format_floats() {
    if (is_integral(t_.dtype()) || is_bool(t_.dtype())) return;
    std::vector<double> v;
    for (auto& c : cells_) v.push_back(load_as<double>(t_.raw_data(), t_.dtype(), std::stoll(c.substr(1))));
    int decimals = 1;
    double big = 0, small = 1e300;
    for (double x : v) {
      if (!std::isfinite(x)) continue;
      big = std::max(big, std::fabs(x));
      if (x != 0) small = std::min(small, std::fabs(x));
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.*f", o_.precision, x);
      std::string s = buf;
      int d = o_.precision;
      while (d > 1 && s.back() == '0') { s.pop_back(); --d; }
      decimals = std::max(decimals, d);
    }
    const bool sci = big >= 1e8 || (small < 1e-4 && small != 1e300);
    for (std::size_t k = 0; k < v.size(); ++k) {
      char buf[64];
      if (std::isnan(v[k])) cells_[k] = "nan";
      else if (std::isinf(v[k])) cells_[k] = v[k] > 0 ? "inf" : "-inf";
      else {
        std::snprintf(buf, sizeof buf, sci ? "%.*e" : "%.*f", sci ? o_.precision : decimals, v[k]);
        cells_[k] = buf;
      }
    }
  }
  void emit(std::ostream& os, int axis, std::int64_t base, int indent) {
    if (axis == t_.rank()) {
      const std::string& s = cells_[next_++];
      os << std::string(width_ - s.size(), ' ') << s;
      return;
    }
    os << '[';
    const std::int64_t n = t_.shape()[axis];
    bool first = true;
    for (std::int64_t i = 0; i < n; ++i) {
      if (skip(axis, i)) {
        if (i == o_.edgeitems) {
          os << (axis + 1 == t_.rank() ? ", ..." : ",\n" + std::string(indent + axis + 1, ' ') + "...");
          first = false;
        }
        continue;
      }
      if (!first) {
        if (axis + 1 == t_.rank()) os << ", ";
        else os << ',' << std::string(t_.rank() - axis - 1, '\n') << std::string(indent + axis + 1, ' ');
      }
      first = false;
      emit(os, axis + 1, base + i * stride(axis), indent);
    }
    os << ']';
  }

  const Tensor& t_;
  const PrintOptions& o_;
  bool elide_;
  std::vector<std::string> cells_;
  std::size_t width_ = 0, next_ = 0;
};

}  // namespace detail

/// Prints "Tensor([[1., 2.], [3., 4.]], shape=[2, 2], dtype=f32)"; symbolic tensors print
/// their shape and dtype only; large tensors are elided with "...".
inline std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "Tensor(undefined)";
  if (t.is_symbolic()) return os << "Tensor(symbolic, shape=" << t.shape() << ", dtype=" << t.dtype() << ")";
  os << "Tensor(";
  // A device tensor prints its host copy: printing is one of the places the host waits.
  detail::Printer(detail::on_host(t, "print", std::source_location::current()), print_options()).print(os, 7);
  os << ", shape=" << t.shape() << ", dtype=" << t.dtype();
  if (!t.device().is_cpu()) os << ", device=" << t.device();
  return os << ")";
}

}  // namespace stagecraft
