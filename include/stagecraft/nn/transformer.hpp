// nn::TransformerEncoderLayer: self-attention and a feed-forward block, each with a residual
// connection, layer normalization and dropout (Vaswani et al. 2017; PyTorch's
// nn.TransformerEncoderLayer with batch_first), written with the layers.
#pragma once
#include <cstdint>
#include <optional>
#include <source_location>

#include "activations.hpp"
#include "attention.hpp"
#include "dense.hpp"
#include "dropout.hpp"
#include "normalization.hpp"

namespace stagecraft::nn {

/// Options of TransformerEncoderLayer (PyTorch's defaults).
struct TransformerOptions {
  std::int64_t ff_dim = 2048;  ///< the feed-forward block's hidden width
  double dropout = 0.1;        ///< after attention, inside and after the feed-forward block
  /// Pre-norm (x + f(norm(x)), steadier for deep stacks) instead of post-norm (norm(x + f(x))).
  bool norm_first = false;
  bool gelu = false;           ///< the feed-forward activation: gelu instead of relu
  double eps = 1e-5;           ///< the layer norms' epsilon
};

/// One encoder layer over x [N, T, E]: post-norm (the default)
///   x = norm1(x + drop(attention(x)));  x = norm2(x + drop(ff(x)))
/// or pre-norm (norm_first)
///   x = x + drop(attention(norm1(x)));  x = x + drop(ff(norm2(x)))
/// with ff(x) = linear2(drop(act(linear1(x)))). Training mode (dropout on) by default; eval()
/// turns the dropouts off. Variables: self_attention/..., linear1/, linear2/, norm1/, norm2/;
/// the dropouts' generator states are non-trainable variables (checkpoints resume their masks).
class TransformerEncoderLayer : public Module {
 public:
  /// embed_dim a multiple of heads; seed: the weights' and masks' seed (nullopt: the global stream).
  TransformerEncoderLayer(std::int64_t embed_dim, std::int64_t heads, const TransformerOptions& opt = {},
                          std::optional<std::uint64_t> seed = std::nullopt, DType dtype = DType::f32,
                          std::source_location loc = std::source_location::current())
      : TransformerEncoderLayer(Seeded{seed ? *seed : init::next_seed()}, embed_dim, heads, checked(opt, loc), dtype,
                                loc) {}

  /// x [N, T, E] → [N, T, E]; `attention` as MultiHeadAttention's (a mask, causal).
  Tensor operator()(const Tensor& x, const AttentionOptions& attention = {},
                    std::source_location loc = std::source_location::current()) {
    stagecraft::detail::require_defined(x, "TransformerEncoderLayer", loc);
    if (opt_.norm_first) {
      Tensor y = stagecraft::add(x, drop1(self_attention(norm1(x, loc), attention, loc), loc), loc);
      return stagecraft::add(y, drop2(feed_forward(norm2(y, loc), loc), loc), loc);
    }
    const Tensor y = norm1(stagecraft::add(x, drop1(self_attention(x, attention, loc), loc), loc), loc);
    return norm2(stagecraft::add(y, drop2(feed_forward(y, loc), loc), loc), loc);
  }

  /// Training mode (dropouts on) or evaluation mode (off).
  void train(bool on = true) {
    for (Dropout* d : {&drop1, &drop_ff, &drop2}) d->train(on);
  }
  void eval() { train(false); }
  bool training() const { return drop1.training(); }
  const TransformerOptions& options() const { return opt_; }

  MultiHeadAttention self_attention;
  Dense linear1, linear2;  ///< E → ff_dim → E
  LayerNorm norm1, norm2;
  Dropout drop1, drop_ff, drop2;  ///< after attention, after the activation, after linear2

 private:
  static const TransformerOptions& checked(const TransformerOptions& opt, const std::source_location& loc) {
    if (opt.ff_dim < 1)
      stagecraft::detail::fail<ValueError>("TransformerEncoderLayer", loc, "ff_dim must be >= 1, got ", opt.ff_dim);
    return opt;
  }
  struct Seeded {  // the seed drawn (a tag no public call can match)
    std::uint64_t s;
  };
  TransformerEncoderLayer(Seeded seed, std::int64_t e, std::int64_t heads, const TransformerOptions& opt, DType dtype,
                          const std::source_location& loc)
      : self_attention(e, heads, init::derive_seed(seed.s, 0), dtype, loc),
        linear1(e, opt.ff_dim, init::derive_seed(seed.s, 1), dtype, loc),
        linear2(opt.ff_dim, e, init::derive_seed(seed.s, 2), dtype, loc),
        norm1(e, opt.eps, dtype, loc),
        norm2(e, opt.eps, dtype, loc),
        drop1(opt.dropout, init::derive_seed(seed.s, 3), loc),
        drop_ff(opt.dropout, init::derive_seed(seed.s, 4), loc),
        drop2(opt.dropout, init::derive_seed(seed.s, 5), loc),
        opt_(opt) {
    add({{"self_attention", self_attention}, {"linear1", linear1}, {"linear2", linear2}, {"norm1", norm1},
         {"norm2", norm2}, {"drop1", drop1}, {"drop_ff", drop_ff}, {"drop2", drop2}},
        loc);
  }
  Tensor feed_forward(const Tensor& x, const std::source_location& loc) {
    const Tensor h = linear1(x, loc);
    return linear2(drop_ff(opt_.gelu ? gelu(h, loc) : relu(h, loc), loc), loc);
  }

  TransformerOptions opt_;
};

}  // namespace stagecraft::nn
