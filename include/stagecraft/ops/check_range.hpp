// check_range(x, lo, hi): x unchanged after checking lo <= x < hi for every (integer) element:
// the runtime check a staged function makes where eager code reads values on the host
// (cross_entropy's labels). A value outside is a ValueError when the plan runs.
#pragma once
#include <source_location>
#include <string>

#include "../eager/dispatch.hpp"

namespace stagecraft {
namespace ops {

/// Reads attrs.i0 (lo) and attrs.i1 (hi, exclusive); integer inputs only; no gradient.
struct CheckRange {
  SC_OP_HEAD(CheckRange, "check_range")
  static constexpr int arity = 1;
  static constexpr bool differentiable = false;

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    require_dtype(is_integral(in[0].dtype()), name, in[0].dtype(), "integer values", loc);
    if (SC_UNLIKELY(a.i1 < a.i0)) detail::fail<ValueError>(name, loc, "empty range [", a.i0, ", ", a.i1, ")");
    return {in[0].shape(), in[0].dtype()};
  }
  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    visit_dtype(in[0].dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        const T* x = static_cast<const T*>(in[0].raw_data());
        T* y = static_cast<T*>(out.raw_data());
        const std::int64_t n = in[0].numel();
        for (std::int64_t i = 0; i < n; ++i) {  // serial: the first bad index is reported
          const auto v = static_cast<std::int64_t>(x[i]);
          if (SC_UNLIKELY(v < a.i0 || v >= a.i1))
            throw ValueError("[check_range] value " + std::to_string(v) + " at index " + std::to_string(i) +
                             " is out of range [" + std::to_string(a.i0) + ", " + std::to_string(a.i1) + ")");
          y[i] = x[i];
        }
      }
    });
  }
};

}  // namespace ops

namespace detail {
/// x after checking lo <= x < hi elementwise (eagerly now, or when a staged plan runs).
inline Tensor check_range(const Tensor& x, std::int64_t lo, std::int64_t hi,
                          const std::source_location& loc = std::source_location::current()) {
  require_defined(x, "check_range", loc);
  ops::Attrs a;
  a.i0 = lo;
  a.i1 = hi;
  return dispatch<ops::CheckRange>({&x, 1}, a, loc);
}
}  // namespace detail
}  // namespace stagecraft
