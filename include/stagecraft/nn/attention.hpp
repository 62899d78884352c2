// nn::scaled_dot_product_attention and nn::MultiHeadAttention (Vaswani et al. 2017), written with
// the ops (matmul, softmax, where, layout): their gradients and kernels, fused when traced.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <source_location>

#include "../core/creation.hpp"
#include "../ops/binary.hpp"
#include "../ops/matmul.hpp"
#include "../ops/reshape.hpp"
#include "../ops/transpose.hpp"
#include "../ops/where.hpp"
#include "../state/module.hpp"
#include "dense.hpp"
#include "functional.hpp"

namespace stagecraft::nn {

/// Options of scaled_dot_product_attention and MultiHeadAttention.
struct AttentionOptions {
  /// Which keys each query may attend to: a bool tensor, true where it may, broadcast against the
  /// scores [..., Tq, Tk] (a padding mask [N, 1, Tk] or [N, 1, 1, Tk], say). Undefined: all.
  /// MultiHeadAttention takes [Tq, Tk], [N, Tq, Tk] or [N, heads, Tq, Tk].
  Tensor mask{};
  /// Query i attends only to keys j <= i + (Tk - Tq) (the last query sees every key), with `mask`.
  bool causal = false;
  /// The scores' factor; nullopt: 1 / sqrt(D), D the queries' last dimension.
  std::optional<double> scale{};
};

namespace detail_attention {

/// The lowest finite value of a floating dtype: a masked score (not -inf, so a query whose keys
/// are all masked attends to them evenly instead of giving NaN).
inline double lowest(DType d) {
  return d == DType::f64 ? std::numeric_limits<double>::lowest()
                         : static_cast<double>(std::numeric_limits<float>::lowest());
}

/// [Tq, Tk]: true where key j <= query i + (Tk - Tq), on device `on`.
inline Tensor causal_mask(std::int64_t tq, std::int64_t tk, Device on, const std::source_location& loc) {
  const stagecraft::detail::DevicePin pin(on);
  const Tensor rows = reshape(arange(tq, loc), {tq, 1}, loc), cols = reshape(arange(tk, loc), {1, tk}, loc);
  return less_equal(cols, stagecraft::add(rows, tk - tq, loc), loc);
}

}  // namespace detail_attention

/// softmax(q k^T * scale, over the keys, masked) v: q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv]
/// → [..., Tq, Dv], the batch dims broadcast as matmul's. Masked scores become the dtype's lowest
/// value before the softmax (so they get weight 0, and no gradient). Integer inputs become f32.
inline Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                           const AttentionOptions& opt = {},
                                           std::source_location loc = std::source_location::current()) {
  constexpr const char* op = "scaled_dot_product_attention";
  for (const Tensor* t : {&q, &k, &v}) stagecraft::detail::require_defined(*t, op, loc);
  if (SC_UNLIKELY(q.rank() < 2 || k.rank() < 2 || v.rank() < 2))
    stagecraft::detail::fail<ShapeError>(op, loc, "expects q, k, v of rank >= 2 ([..., T, D]), got ", q.shape(), ", ",
                                         k.shape(), " and ", v.shape());
  const std::int64_t d = q.shape().back(), tq = q.shape()[q.rank() - 2], tk = k.shape()[k.rank() - 2];
  if (SC_UNLIKELY(k.shape().back() != d || v.shape()[v.rank() - 2] != tk))
    stagecraft::detail::fail<ShapeError>(op, loc, "expects q [..., Tq, D], k [..., Tk, D] and v [..., Tk, Dv], got ",
                                         q.shape(), ", ", k.shape(), " and ", v.shape());
  if (SC_UNLIKELY(opt.mask.defined() && !is_bool(opt.mask.dtype())))
    stagecraft::detail::fail<DTypeError>(op, loc, "expects a bool mask (true: attend), got ", name(opt.mask.dtype()),
                                         " of shape ", opt.mask.shape());
  if (opt.mask.defined()) {
    const Shape& m = opt.mask.shape();
    const auto fits = [&](int back, std::int64_t want) {
      return m.rank() < back || m[m.rank() - back] == 1 || m[m.rank() - back] == want;
    };
    if (SC_UNLIKELY(!fits(1, tk) || !fits(2, tq)))
      stagecraft::detail::fail<ShapeError>(op, loc, "the mask ", m, " does not broadcast against the scores [..., Tq, Tk] = ",
                                           "[..., ", tq, ", ", tk, "] of q ", q.shape(), " and k ", k.shape());
  }
  const double scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(static_cast<double>(d > 0 ? d : 1));
  Tensor s = matmul(functional_detail::as_floating(q, loc), functional_detail::as_floating(k, loc), false, true, loc);
  s = mul(s, scale, loc);
  Tensor keep = opt.mask;
  if (opt.causal) {
    const Tensor c = detail_attention::causal_mask(tq, tk, s.device(), loc);
    keep = keep.defined() ? logical_and(keep, c, loc) : c;
  }
  if (keep.defined()) s = where(keep, s, detail_attention::lowest(s.dtype()), loc);
  return matmul(softmax(s, -1, loc), v, loc);
}

/// Multi-head attention: queries, keys and values each projected by a Dense layer of
/// embed_dim → embed_dim, split into `heads` heads of embed_dim / heads, attended head by head
/// (scaled_dot_product_attention) and joined by a last Dense layer (Keras's MultiHeadAttention
/// with key_dim = embed_dim / heads; PyTorch's nn.MultiheadAttention with batch_first). Its
/// variables: query/, key/, value/, output/ each with kernel [E, E] and bias [E].
class MultiHeadAttention : public Module {
 public:
  /// embed_dim a multiple of heads; seed: the weights' seed (nullopt: from the global stream).
  MultiHeadAttention(std::int64_t embed_dim, std::int64_t heads, std::optional<std::uint64_t> seed = std::nullopt,
                     DType dtype = DType::f32, std::source_location loc = std::source_location::current())
      : MultiHeadAttention(Checked{checked(embed_dim, heads, loc)}, heads, seed ? *seed : init::next_seed(), dtype, loc) {}

  /// queries [N, Tq, E] attending to keys [N, Tk, E] with values [N, Tk, E] → [N, Tq, E].
  Tensor operator()(const Tensor& queries, const Tensor& keys, const Tensor& values, const AttentionOptions& opt = {},
                    std::source_location loc = std::source_location::current()) const {
    constexpr const char* op = "MultiHeadAttention";
    for (const Tensor* t : {&queries, &keys, &values}) stagecraft::detail::require_defined(*t, op, loc);
    const auto bad = [&](const Tensor& t) { return t.rank() != 3 || t.shape()[2] != e_; };
    if (SC_UNLIKELY(bad(queries) || bad(keys) || bad(values) || keys.shape() != values.shape() ||
                    keys.shape()[0] != queries.shape()[0]))
      stagecraft::detail::fail<ShapeError>(op, loc, "expects queries [N, Tq, ", e_, "] and keys, values [N, Tk, ", e_,
                                           "] (embed_dim = ", e_, "), got ", queries.shape(), ", ", keys.shape(),
                                           " and ", values.shape());
    AttentionOptions o = opt;
    if (o.mask.defined()) {
      if (SC_UNLIKELY(o.mask.rank() < 2 || o.mask.rank() > 4))
        stagecraft::detail::fail<ShapeError>(op, loc, "expects a mask [Tq, Tk], [N, Tq, Tk] or [N, heads, Tq, Tk], got ",
                                             o.mask.shape());
      if (o.mask.rank() == 3) o.mask = expand_dims(o.mask, 1, loc);  // one mask for every head
    }
    const Tensor h = scaled_dot_product_attention(split(query(queries, loc), loc), split(key(keys, loc), loc),
                                                  split(value(values, loc), loc), o, loc);
    const std::int64_t n = queries.shape()[0], tq = queries.shape()[1];
    return output(reshape(transpose(h, {0, 2, 1, 3}, loc), {n, tq, e_}, loc), loc);
  }
  /// Self-attention: x attends to itself.
  Tensor operator()(const Tensor& x, const AttentionOptions& opt = {},
                    std::source_location loc = std::source_location::current()) const {
    return (*this)(x, x, x, opt, loc);
  }

  std::int64_t embed_dim() const { return e_; }
  std::int64_t heads() const { return heads_; }

  Dense query, key, value, output;  ///< the projections (kernel [E, E], bias [E] each)

 private:
  static std::int64_t checked(std::int64_t e, std::int64_t heads, const std::source_location& loc) {
    if (e < 1 || heads < 1 || e % heads != 0)
      stagecraft::detail::fail<ValueError>("MultiHeadAttention", loc, "needs embed_dim >= 1 a multiple of heads >= 1, got ",
                                           e, " and ", heads);
    return e;
  }
  struct Checked {  // an embed_dim checked against heads (a tag no public call can match)
    std::int64_t e;
  };
  MultiHeadAttention(Checked c, std::int64_t heads, std::uint64_t s, DType dtype, const std::source_location& loc)
      : query(c.e, c.e, init::derive_seed(s, 0), dtype, loc),
        key(c.e, c.e, init::derive_seed(s, 1), dtype, loc),
        value(c.e, c.e, init::derive_seed(s, 2), dtype, loc),
        output(c.e, c.e, init::derive_seed(s, 3), dtype, loc),
        e_(c.e),
        heads_(heads) {
    add({{"query", query}, {"key", key}, {"value", value}, {"output", output}}, loc);
  }
  /// [N, T, E] → [N, heads, T, E / heads].
  Tensor split(const Tensor& x, const std::source_location& loc) const {
    return transpose(reshape(x, {x.shape()[0], x.shape()[1], heads_, e_ / heads_}, loc), {0, 2, 1, 3}, loc);
  }

  std::int64_t e_, heads_;
};

}  // namespace stagecraft::nn
