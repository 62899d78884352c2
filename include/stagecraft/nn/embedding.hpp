// nn::Embedding: a table of learned vectors looked up by integer ids (a gather, whose gradient is a
// scatter-add into the rows that were read).
#pragma once
#include <cstdint>
#include <optional>
#include <source_location>
#include <type_traits>

#include "../ops/gather.hpp"
#include "../ops/random.hpp"
#include "../state/module.hpp"
#include "ids.hpp"
#include "init.hpp"

namespace stagecraft::nn {

/// ids of any integer shape → ids.shape + [dim]: row ids[i] of the table `weight` [num, dim]
/// (starting N(0, 1), as PyTorch's). ids must be i32 or i64 in [0, num): out of range (negative
/// ones included: no counting from the end here) is a ValueError, checked on the host for
/// concrete CPU ids; on a GPU, or traced, the gather's own check reports it, and there a negative
/// id counts from the end.
class Embedding : public Module {
 public:
  Embedding(std::int64_t num, std::int64_t dim, std::optional<std::uint64_t> seed = std::nullopt,
            DType dtype = DType::f32, std::source_location loc = std::source_location::current())
      : num_(num), dim_(dim) {
    if (SC_UNLIKELY(num < 1 || dim < 1))
      stagecraft::detail::fail<ValueError>("Embedding", loc, "needs num >= 1 and dim >= 1, got ", num, " and ", dim);
    stagecraft::detail::init_check_float(dtype, "Embedding", loc);
    const std::uint64_t s = seed ? *seed : init::next_seed();
    weight = Variable(random::normal({num, dim}, s, 0.0, 1.0, dtype, loc), "weight", true, loc);
    add("weight", weight, loc);
  }

  Tensor operator()(const Tensor& ids, std::source_location loc = std::source_location::current()) const {
    constexpr std::string_view op = "Embedding";
    stagecraft::detail::require_defined(ids, op, loc);
    ops::require_dtype(ids.dtype() == DType::i32 || ids.dtype() == DType::i64, op, ids.dtype(),
                       "integer ids (i32 or i64)", loc);
    functional_detail::check_ids(ids, num_, op, "id", true, loc);
    return gather(weight, ids, 0, loc);
  }

  std::int64_t num_embeddings() const { return num_; }
  std::int64_t embedding_dim() const { return dim_; }

  Variable weight;  ///< [num, dim]

 private:
  std::int64_t num_, dim_;
};

}  // namespace stagecraft::nn
