// check_range(x, lo, hi): x unchanged after checking lo <= x < hi for every (integer) element:
// the runtime check a staged function makes where eager code reads values on the host
// (cross_entropy's labels). A value outside is a ValueError when the plan runs, naming the op
// that asked for the check as its eager check does.
#pragma once
#include <array>
#include <source_location>
#include <string>
#include <string_view>

#include "../eager/dispatch.hpp"

namespace stagecraft {
namespace ops {

/// An op that asks for a range check: the name its errors carry and what it calls a value.
struct RangeAsker {
  std::string_view op, value;
};
/// The askers, by attrs.i2 (a number, so graphs keep it in their text form): a staged step's
/// error then reads as the asking op's eager one. An op that asks for a check adds a row.
inline constexpr std::array<RangeAsker, 3> range_askers{{{"check_range", "value"},
                                                          {"cross_entropy", "label"},
                                                          {"while_loop", "maximum_iterations"}}};

/// Reads attrs.i0 (lo), attrs.i1 (hi, exclusive) and attrs.i2 (the asker, a range_askers
/// index); integer inputs only; no gradient.
struct CheckRange {
  SC_OP_HEAD(CheckRange, "check_range")
  static constexpr int arity = 1;
  static constexpr bool differentiable = false;

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    if (SC_UNLIKELY(a.i2 < 0 || a.i2 >= static_cast<std::int64_t>(range_askers.size())))
      detail::fail<ValueError>(name, loc, "unknown asker i2=", a.i2, " (0 to ", range_askers.size() - 1, ")");
    const std::string_view op = asker(a).op;
    require_dtype(is_integral(in[0].dtype()), op, in[0].dtype(), "integer values", loc);
    if (SC_UNLIKELY(a.i1 < a.i0)) detail::fail<ValueError>(op, loc, "empty range [", a.i0, ", ", a.i1, ")");
    return {in[0].shape(), in[0].dtype()};
  }
  /// On the GPU: checked by the kernel without a wait; a value outside is raised at the next one.
  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    backend::cuda::check_range(in[0], out, a.i0, a.i1, asker(a).op, asker(a).value, loc);
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
          if (SC_UNLIKELY(v < a.i0 || v >= a.i1)) out_of_range(a, v, i);
          y[i] = x[i];
        }
      }
    });
  }

  static const RangeAsker& asker(const Attrs& a) { return range_askers[static_cast<std::size_t>(a.i2)]; }
  /// "[op] label v at index i is out of range [lo, hi)": the plan adds the user's line.
  [[noreturn]] SC_COLD static void out_of_range(const Attrs& a, std::int64_t v, std::int64_t i) {
    const RangeAsker& who = asker(a);
    throw ValueError("[" + std::string(who.op) + "] " + std::string(who.value) + " " + std::to_string(v) +
                     " at index " + std::to_string(i) + " is out of range [" + std::to_string(a.i0) + ", " +
                     std::to_string(a.i1) + ")");
  }
};

}  // namespace ops

namespace detail {
/// x after checking lo <= x < hi elementwise (eagerly now, or when a staged plan runs). Errors
/// name `op`, a row of ops::range_askers: the op that asks for the check.
inline Tensor check_range(const Tensor& x, std::int64_t lo, std::int64_t hi,
                          const std::source_location& loc = std::source_location::current(),
                          std::string_view op = "check_range") {
  require_defined(x, op, loc);
  ops::Attrs a;
  a.i0 = lo;
  a.i1 = hi;
  const auto& askers = ops::range_askers;
  while (a.i2 < static_cast<std::int64_t>(askers.size()) && askers[static_cast<std::size_t>(a.i2)].op != op) ++a.i2;
  if (SC_UNLIKELY(a.i2 == static_cast<std::int64_t>(askers.size())))
    fail<ValueError>("check_range", loc, "no range check is registered for op '", op, "' (ops::range_askers)");
  return dispatch<ops::CheckRange>({&x, 1}, a, loc);
}
}  // namespace detail
}  // namespace stagecraft
