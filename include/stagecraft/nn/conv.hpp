// nn::Conv2D: a 2-D convolution layer over NCHW inputs with an OIHW kernel and a bias.
#pragma once
#include <cstdint>
#include <optional>
#include <source_location>

#include "../ops/binary.hpp"
#include "../ops/conv.hpp"
#include "../ops/reshape.hpp"
#include "../state/module.hpp"
#include "init.hpp"

namespace stagecraft::nn {

/// A convolution layer: x [N, in_ch, H, W] → conv2d(x, kernel, stride, padding) + bias,
/// [N, out_ch, Ho, Wo]. The kernel [out_ch, in_ch, k, k] starts He-normal (fan_in = in_ch·k²),
/// the bias [out_ch] at zero.
class Conv2D : public Module {
 public:
  /// seed: the weights' seed; nullopt draws one from the global stream (sc::manual_seed).
  Conv2D(std::int64_t in_ch, std::int64_t out_ch, std::int64_t kernel_size, std::int64_t stride = 1,
         std::int64_t padding = 0, std::optional<std::uint64_t> seed = std::nullopt, DType dtype = DType::f32,
         std::source_location loc = std::source_location::current())
      : in_(in_ch), out_(out_ch), k_(kernel_size), stride_(stride), pad_(padding) {
    if (in_ch < 1 || out_ch < 1 || kernel_size < 1)
      stagecraft::detail::fail<ValueError>("Conv2D", loc, "needs in_ch, out_ch and kernel >= 1, got ", in_ch, ", ",
                                           out_ch, " and ", kernel_size);
    if (stride < 1 || padding < 0)
      stagecraft::detail::fail<ValueError>("Conv2D", loc, "needs stride >= 1 and padding >= 0, got ", stride,
                                           " and ", padding);
    const std::uint64_t s = seed ? *seed : init::next_seed();
    const Shape ks{out_ch, in_ch, kernel_size, kernel_size};
    kernel = Variable(init::he_normal(ks, init::derive_seed(s, 0), dtype, loc), "kernel", true, loc);
    bias = Variable(init::zeros({out_ch}, dtype, loc), "bias", true, loc);
    add({{"kernel", kernel}, {"bias", bias}}, loc);
  }

  /// x [N, in_ch, H, W] → [N, out_ch, Ho, Wo].
  Tensor operator()(const Tensor& x, std::source_location loc = std::source_location::current()) const {
    stagecraft::detail::require_defined(x, "Conv2D", loc);
    if (SC_UNLIKELY(x.rank() != 4 || x.shape()[1] != in_))
      stagecraft::detail::fail<ShapeError>("Conv2D", loc, "expects inputs [N, ", in_, ", H, W] (in_ch = ", in_,
                                           "), got ", x.shape());
    const Tensor y = conv2d(x, kernel, stride_, pad_, loc);
    return stagecraft::add(y, reshape(bias, {1, out_, 1, 1}, loc), loc);
  }

  std::int64_t in_channels() const { return in_; }
  std::int64_t out_channels() const { return out_; }
  std::int64_t kernel_size() const { return k_; }
  std::int64_t stride() const { return stride_; }
  std::int64_t padding() const { return pad_; }

  Variable kernel;  ///< [out_ch, in_ch, k, k]
  Variable bias;    ///< [out_ch]

 private:
  std::int64_t in_, out_, k_, stride_, pad_;
};

}  // namespace stagecraft::nn
