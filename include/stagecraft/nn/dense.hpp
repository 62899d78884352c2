// nn::Dense: a fully connected layer, y = x @ kernel + bias.
#pragma once
#include <cstdint>
#include <optional>
#include <source_location>

#include "../ops/binary.hpp"
#include "../ops/matmul.hpp"
#include "../ops/reshape.hpp"
#include "../state/module.hpp"
#include "init.hpp"

namespace stagecraft::nn {

/// A fully connected layer: x [..., in] → x @ kernel + bias, [..., out]. The kernel [in, out]
/// starts Glorot-uniform, the bias [out] at zero. No activation: apply one to the result.
class Dense : public Module {
 public:
  /// seed: the weights' seed; nullopt draws one from the global stream (sc::manual_seed).
  Dense(std::int64_t in, std::int64_t out, std::optional<std::uint64_t> seed = std::nullopt,
        DType dtype = DType::f32, std::source_location loc = std::source_location::current())
      : in_(in), out_(out) {
    if (in < 1 || out < 1)
      stagecraft::detail::fail<ValueError>("Dense", loc, "needs in >= 1 and out >= 1, got ", in, " and ", out);
    const std::uint64_t s = seed ? *seed : init::next_seed();
    kernel = Variable(init::glorot_uniform({in, out}, init::derive_seed(s, 0), dtype, loc), "kernel", true, loc);
    bias = Variable(init::zeros({out}, dtype, loc), "bias", true, loc);
    add({{"kernel", kernel}, {"bias", bias}}, loc);
  }

  /// x [..., in] → [..., out]. Inputs of rank > 2 are flattened to one matrix product.
  Tensor operator()(const Tensor& x, std::source_location loc = std::source_location::current()) const {
    stagecraft::detail::require_defined(x, "Dense", loc);
    if (SC_UNLIKELY(x.rank() == 0 || x.shape().back() != in_))
      stagecraft::detail::fail<ShapeError>("Dense", loc, "expects inputs [..., ", in_, "] (in = ", in_,
                                           "), got ", x.shape());
    if (x.rank() <= 2) return stagecraft::add(matmul(x, kernel, loc), bias, loc);
    Shape out_shape = x.shape();
    out_shape[out_shape.rank() - 1] = out_;
    const Tensor y = stagecraft::add(matmul(reshape(x, {-1, in_}, loc), kernel, loc), bias, loc);
    return reshape(y, out_shape, loc);
  }

  std::int64_t in_features() const { return in_; }
  std::int64_t out_features() const { return out_; }

  Variable kernel;  ///< [in, out]
  Variable bias;    ///< [out]

 private:
  std::int64_t in_, out_;
};

}  // namespace stagecraft::nn
