// The host-side check of integer ids against a table's size (labels of cross_entropy, rows of
// nn::Embedding): the first id outside [0, n), named with its index, before any kernel runs.
#pragma once
#include <cstdint>
#include <source_location>
#include <string_view>
#include <type_traits>

#include "../core/dtype.hpp"
#include "../core/tensor.hpp"

namespace stagecraft::nn::functional_detail {  // not "detail": that would hide stagecraft::detail inside nn

/// Throws ValueError "[op] <what> V at index I[ of <what>s SHAPE] is out of range [0, n)" for the
/// first integer of ids outside [0, n) (negative ones included). Reads ids on the host, so only
/// concrete CPU tensors are checked (one pass); others, and non-integer dtypes, are left to the
/// kernel's own check. `with_shape`: also name ids' shape (useful where ids may have any rank).
inline void check_ids(const Tensor& ids, std::int64_t n, std::string_view op, std::string_view what, bool with_shape,
                      const std::source_location& loc) {
  if (ids.is_symbolic() || !ids.device().is_cpu() || ids.numel() == 0) return;
  visit_dtype(ids.dtype(), [&](auto tag) {
    using I = typename decltype(tag)::type;
    if constexpr (std::is_integral_v<I> && !std::is_same_v<I, bool>) {
      const I* p = static_cast<const I*>(ids.raw_data());
      for (std::int64_t i = 0, count = ids.numel(); i < count; ++i) {
        if (SC_LIKELY(p[i] >= 0 && static_cast<std::int64_t>(p[i]) < n)) continue;
        const auto v = static_cast<std::int64_t>(p[i]);
        if (with_shape)
          stagecraft::detail::fail<ValueError>(op, loc, what, " ", v, " at index ", i, " of ", what, "s ", ids.shape(),
                                               " is out of range [0, ", n, ")");
        stagecraft::detail::fail<ValueError>(op, loc, what, " ", v, " at index ", i, " is out of range [0, ", n, ")");
      }
    }
  });
}

}  // namespace stagecraft::nn::functional_detail
