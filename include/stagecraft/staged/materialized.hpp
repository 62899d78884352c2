// The staged forms of the rest of the eager API that is not elementwise: the layout ops (reshape,
// transpose, broadcast_to, expand_dims, squeeze, flatten, slice, flip, pad, tile, concat, stack), picking
// (gather, one_hot), sort, einsum, pooling, layer_norm and the losses. Each is a materialized
// operand, as matmul in api.hpp: its operands are evaluated first, the eager op runs on them and
// the fused loop around it reads its result. So one generic model function (a CNN: conv2d, relu,
// max_pool2d, flatten, matmul, cross_entropy) runs eagerly, traced and under sc::compile, and
// sc::grad differentiates it with the eager ops' own gradient rules. Each takes the eager
// function's arguments and defaults; its errors are the eager op's, naming the line that called
// the compiled function (or evaluated the expression), as the other staged ops' do.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "../nn/losses.hpp"
#include "../nn/normalization.hpp"
#include "../ops/arrange.hpp"
#include "../ops/concat.hpp"
#include "../ops/einsum.hpp"
#include "../ops/gather.hpp"
#include "../ops/pool.hpp"
#include "../ops/reshape.hpp"
#include "../ops/slice.hpp"
#include "../ops/sort.hpp"
#include "../ops/transpose.hpp"
#include "api.hpp"

namespace stagecraft {
namespace staging {

// Each op: its name, its attributes and `run` (the eager op). `grad_operands` (where present):
// the operands from that place on get no gradient (integer indices and labels).

struct ReshapeOp {
  Shape shape;
  static constexpr std::string_view name = "reshape";
  Tensor run(const std::source_location& loc, const Tensor& x) const { return stagecraft::reshape(x, shape, loc); }
};
struct TransposeOp {
  std::vector<std::int64_t> perm;
  static constexpr std::string_view name = "transpose";
  Tensor run(const std::source_location& loc, const Tensor& x) const { return stagecraft::transpose(x, perm, loc); }
};
struct BroadcastToOp {
  Shape shape;
  static constexpr std::string_view name = "broadcast_to";
  Tensor run(const std::source_location& loc, const Tensor& x) const {
    return stagecraft::broadcast_to(x, shape, loc);
  }
};
struct ExpandDimsOp {
  std::int64_t axis = 0;
  static constexpr std::string_view name = "expand_dims";
  Tensor run(const std::source_location& loc, const Tensor& x) const { return stagecraft::expand_dims(x, axis, loc); }
};
struct SqueezeOp {
  std::vector<std::int64_t> axes;
  static constexpr std::string_view name = "squeeze";
  Tensor run(const std::source_location& loc, const Tensor& x) const { return stagecraft::squeeze(x, axes, loc); }
};
struct FlattenOp {
  std::int64_t start_axis = 0;
  static constexpr std::string_view name = "flatten";
  Tensor run(const std::source_location& loc, const Tensor& x) const {
    return stagecraft::flatten(x, start_axis, loc);
  }
};
struct SliceOp {
  std::vector<std::int64_t> begin, size;
  static constexpr std::string_view name = "slice";
  Tensor run(const std::source_location& loc, const Tensor& x) const { return stagecraft::slice(x, begin, size, loc); }
};
struct FlipOp {
  std::vector<std::int64_t> axes;
  static constexpr std::string_view name = "flip";
  Tensor run(const std::source_location& loc, const Tensor& x) const { return stagecraft::flip(x, axes, loc); }
};
struct PadOp {
  std::vector<std::pair<std::int64_t, std::int64_t>> pads;
  double value = 0;
  static constexpr std::string_view name = "pad";
  Tensor run(const std::source_location& loc, const Tensor& x) const { return stagecraft::pad(x, pads, value, loc); }
};
struct TileOp {
  std::vector<std::int64_t> reps;
  static constexpr std::string_view name = "tile";
  Tensor run(const std::source_location& loc, const Tensor& x) const { return stagecraft::tile(x, reps, loc); }
};
template <bool Stack>
struct JoinOp {
  std::int64_t axis = 0;
  static constexpr std::string_view name = Stack ? "stack" : "concat";
  template <class... T>
  Tensor run(const std::source_location& loc, const T&... xs) const {
    return Stack ? stagecraft::stack(std::vector<Tensor>{xs...}, axis, loc)
                 : stagecraft::concat(std::vector<Tensor>{xs...}, axis, loc);
  }
};
struct GatherOp {
  std::int64_t axis = 0;
  static constexpr std::string_view name = "gather";
  static constexpr std::size_t grad_operands = 1;  // the indices get none
  Tensor run(const std::source_location& loc, const Tensor& x, const Tensor& indices) const {
    return stagecraft::gather(x, indices, axis, loc);
  }
};
struct OneHotOp {
  std::int64_t depth = 0;
  DType dtype = DType::f32;
  static constexpr std::string_view name = "one_hot";
  static constexpr std::size_t grad_operands = 0;
  Tensor run(const std::source_location& loc, const Tensor& indices) const {
    return stagecraft::one_hot(indices, depth, dtype, loc);
  }
};
struct SortOp {
  std::int64_t axis = -1;
  bool descending = false;
  static constexpr std::string_view name = "sort";
  Tensor run(const std::source_location& loc, const Tensor& x) const {
    return stagecraft::sort(x, axis, descending, loc);
  }
};
struct EinsumOp {
  std::string equation;  // owned: the expression may outlive the caller's string
  static constexpr std::string_view name = "einsum";
  template <class... T>
  Tensor run(const std::source_location& loc, const T&... xs) const {
    return stagecraft::einsum(equation, std::vector<Tensor>{xs...}, loc);
  }
};
template <bool Max>
struct Pool2dOp {
  std::int64_t kernel = 2, stride = 2;
  static constexpr std::string_view name = Max ? "max_pool2d" : "avg_pool2d";
  Tensor run(const std::source_location& loc, const Tensor& x) const {
    return Max ? nn::max_pool2d(x, kernel, stride, loc) : nn::avg_pool2d(x, kernel, stride, loc);
  }
};
struct LayerNormOp {
  Shape normalized_shape;
  double eps = 1e-5;
  static constexpr std::string_view name = "layer_norm";
  Tensor run(const std::source_location& loc, const Tensor& x) const {
    return nn::layer_norm(x, normalized_shape, Tensor(), Tensor(), eps, loc);
  }
  Tensor run(const std::source_location& loc, const Tensor& x, const Tensor& gamma, const Tensor& beta) const {
    return nn::layer_norm(x, normalized_shape, gamma, beta, eps, loc);
  }
};
struct CrossEntropyOp {
  static constexpr std::string_view name = "cross_entropy";
  static constexpr std::size_t grad_operands = 1;  // the labels get none
  Tensor run(const std::source_location& loc, const Tensor& logits, const Tensor& labels) const {
    return nn::cross_entropy(logits, labels, loc);
  }
};
struct MseLossOp {
  static constexpr std::string_view name = "mse_loss";
  Tensor run(const std::source_location& loc, const Tensor& pred, const Tensor& target) const {
    return nn::mse_loss(pred, target, loc);
  }
};
struct BceWithLogitsOp {
  static constexpr std::string_view name = "binary_cross_entropy_with_logits";
  Tensor run(const std::source_location& loc, const Tensor& logits, const Tensor& targets) const {
    return nn::binary_cross_entropy_with_logits(logits, targets, loc);
  }
};

/// A staged value among the operands (the others may be Tensors).
template <class... X>
concept AnyStaged = (Staged<X> || ...);

}  // namespace staging

// ---- layout ------------------------------------------------------------------------------

/// x with a new shape (see the eager reshape; one extent may be -1).
template <class X>
  requires staging::Staged<X>
auto reshape(const X& x, Shape shape) {
  return staging::materializing(staging::ReshapeOp{std::move(shape)}, x);
}
/// x with its axes permuted ({} reverses them).
template <class X>
  requires staging::Staged<X>
auto transpose(const X& x, std::vector<std::int64_t> perm = {}) {
  return staging::materializing(staging::TransposeOp{std::move(perm)}, x);
}
/// x broadcast to shape.
template <class X>
  requires staging::Staged<X>
auto broadcast_to(const X& x, Shape shape) {
  return staging::materializing(staging::BroadcastToOp{std::move(shape)}, x);
}
/// x with an axis of extent 1 inserted at axis.
template <class X>
  requires staging::Staged<X>
auto expand_dims(const X& x, std::int64_t axis) {
  return staging::materializing(staging::ExpandDimsOp{axis}, x);
}
/// x without the axes of extent 1 in axes ({}: all of them).
template <class X>
  requires staging::Staged<X>
auto squeeze(const X& x, std::vector<std::int64_t> axes = {}) {
  return staging::materializing(staging::SqueezeOp{std::move(axes)}, x);
}
/// x with the axes from start_axis on merged into one.
template <class X>
  requires staging::Staged<X>
auto flatten(const X& x, std::int64_t start_axis = 0) {
  return staging::materializing(staging::FlattenOp{start_axis}, x);
}
/// The block of x at begin, of extents size (-1: to the end).
template <class X>
  requires staging::Staged<X>
auto slice(const X& x, std::vector<std::int64_t> begin, std::vector<std::int64_t> size) {
  return staging::materializing(staging::SliceOp{std::move(begin), std::move(size)}, x);
}
/// x reversed along axes.
template <class X>
  requires staging::Staged<X>
auto flip(const X& x, std::vector<std::int64_t> axes) {
  return staging::materializing(staging::FlipOp{std::move(axes)}, x);
}
/// x with pads[d] = {before, after} elements of value on each side of axis d.
template <class X>
  requires staging::Staged<X>
auto pad(const X& x, std::vector<std::pair<std::int64_t, std::int64_t>> pads, double value = 0) {
  return staging::materializing(staging::PadOp{std::move(pads), value}, x);
}
/// x repeated reps[d] times along axis d.
template <class X>
  requires staging::Staged<X>
auto tile(const X& x, std::vector<std::int64_t> reps) {
  return staging::materializing(staging::TileOp{std::move(reps)}, x);
}

/// The operands joined along an existing axis: concat(std::tuple{a, b}, 1) (staged values and
/// tensors; the eager overload takes the same tuple of tensors).
template <class... X>
  requires(sizeof...(X) >= 1 && staging::AnyStaged<X...>)
auto concat(const std::tuple<X...>& xs, std::int64_t axis) {
  return std::apply([&](const auto&... x) { return staging::materializing(staging::JoinOp<false>{axis}, x...); }, xs);
}
/// The operands, all of one shape, joined along a new axis: stack(std::tuple{a, b}, 0).
template <class... X>
  requires(sizeof...(X) >= 1 && staging::AnyStaged<X...>)
auto stack(const std::tuple<X...>& xs, std::int64_t axis = 0) {
  return std::apply([&](const auto&... x) { return staging::materializing(staging::JoinOp<true>{axis}, x...); }, xs);
}

// ---- picking, sorting, contracting ---------------------------------------------------------

/// Entries of x along axis picked by integer indices (no gradient to the indices).
template <class X, class I>
  requires staging::AnyStaged<X, I>
auto gather(const X& x, const I& indices, std::int64_t axis = 0) {
  return staging::materializing(staging::GatherOp{axis}, x, indices);
}
/// One-hot rows of depth for integer indices, in dtype.
template <class I>
  requires staging::Staged<I>
auto one_hot(const I& indices, std::int64_t depth, DType dtype = DType::f32) {
  return staging::materializing(staging::OneHotOp{depth, dtype}, indices);
}
/// x with each line along axis sorted (differentiable: the gradient goes back to each entry's place).
template <class X>
  requires staging::Staged<X>
auto sort(const X& x, std::int64_t axis = -1, bool descending = false) {
  return staging::materializing(staging::SortOp{axis, descending}, x);
}
/// einsum of operands given one by one: einsum("bij,bjk->bik", a, b).
template <class... X>
  requires(sizeof...(X) >= 1 && staging::AnyStaged<X...>)
auto einsum(EinsumEquation equation, const X&... xs) {
  return staging::materializing(staging::EinsumOp{std::string(equation.text)}, xs...);
}

namespace nn {
/// Max pooling over kernel x kernel windows, NCHW (see the eager max_pool2d).
template <class X>
  requires staging::Staged<X>
auto max_pool2d(const X& x, std::int64_t kernel, std::int64_t stride) {
  return staging::materializing(staging::Pool2dOp<true>{kernel, stride}, x);
}
/// Average pooling over kernel x kernel windows, NCHW.
template <class X>
  requires staging::Staged<X>
auto avg_pool2d(const X& x, std::int64_t kernel, std::int64_t stride) {
  return staging::materializing(staging::Pool2dOp<false>{kernel, stride}, x);
}
/// layer_norm over the trailing normalized_shape, without an affine part.
template <class X>
  requires staging::Staged<X>
auto layer_norm(const X& x, Shape normalized_shape) {
  return staging::materializing(staging::LayerNormOp{std::move(normalized_shape)}, x);
}
/// layer_norm with gamma and beta (each a tensor or a staged value).
template <class X, class G, class B>
  requires staging::AnyStaged<X, G, B>
auto layer_norm(const X& x, Shape normalized_shape, const G& gamma, const B& beta, double eps = 1e-5) {
  return staging::materializing(staging::LayerNormOp{std::move(normalized_shape), eps}, x, gamma, beta);
}
/// The mean cross entropy of logits [N, C] and integer labels [N] (no gradient to the labels).
template <class L, class Y>
  requires staging::AnyStaged<L, Y>
auto cross_entropy(const L& logits, const Y& labels) {
  return staging::materializing(staging::CrossEntropyOp{}, logits, labels);
}
/// mean((pred - target)^2).
template <class P, class T>
  requires staging::AnyStaged<P, T>
auto mse_loss(const P& pred, const T& target) {
  return staging::materializing(staging::MseLossOp{}, pred, target);
}
/// The mean binary cross entropy of logits and targets in [0, 1].
template <class L, class T>
  requires staging::AnyStaged<L, T>
auto binary_cross_entropy_with_logits(const L& logits, const T& targets) {
  return staging::materializing(staging::BceWithLogitsOp{}, logits, targets);
}
}  // namespace nn

}  // namespace stagecraft
