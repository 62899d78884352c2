// What every op definition provides, the fixed attribute struct, and the output description.
//
// An op is a struct in ops/ with, all in one place:
//   static constexpr OpId id;                 // its line in op_list.hpp
//   static constexpr std::string_view name;   // "add", as printed in errors and graphs
//   static constexpr int arity;               // number of inputs, -1 for a list (concat)
//   static OutMeta infer(Inputs, const Attrs&, const std::source_location&);  // checks + shape/dtype
//   static void cpu(Inputs, Tensor& out, const Attrs&);                      // the CPU kernel
// and, for a CUDA kernel (backend/cuda/kernels.hpp; without it a CUDA call is a DeviceError):
//   static void cuda(Inputs, Tensor& out, const Attrs&, const std::source_location&);
// and optionally:
//   static Tensor alias(const Tensor& in, const OutMeta&)   // a view: no kernel, shares storage
//   static constexpr int promote_from = k;   // inputs k.. are cast to their common dtype first
//   static constexpr bool differentiable = false;            // integer-valued results
//   static std::vector<Tensor> vjp(const Tensor& grad_out, Inputs in, const Tensor& out,
//                                  const Attrs&);   // the gradient slot: one Tensor per input
//                                                   // (undefined = no gradient), written with
//                                                   // other ops so it works traced too. Filled by
//                                                   // the autodiff issue; see HasVjp below.
//   ... or the same with a fifth parameter `Wanted wanted` (default {}): the inputs whose
//   gradients the caller needs; the rule may leave the others undefined and skip their work
//   (matmul skips a GEMM for an unwatched operand).
#pragma once
#include <cstdint>
#include <source_location>
#include <span>
#include <string_view>
#include <vector>

#include "../core/dtype.hpp"
#include "../core/shape.hpp"
#include "../backend/cuda/kernels.hpp"
#include "../core/tensor.hpp"
#include "op_list.hpp"

/// The two lines every op struct opens with: its id in the op list and its printed name.
#define SC_OP_HEAD(S, str)            \
  static constexpr OpId id = OpId::S; \
  static constexpr std::string_view name = str;

namespace stagecraft::ops {

/// The inputs of an op call (a view; dispatch owns the handles).
using Inputs = std::span<const Tensor>;

/// Attributes of an op call. One fixed struct for every op, so dispatch never allocates;
/// each op documents which fields it reads.
struct Attrs {
  Shape ints;               ///< axes, perm, target shape, begin
  Shape ints2;              ///< sizes (slice)
  std::int64_t axis = 0;    ///< the axis of gather, concat, argmax, softmax
  std::int64_t i0 = 0;      ///< kernel size, depth
  std::int64_t i1 = 0;      ///< stride
  std::int64_t i2 = 0;      ///< padding
  double scalar = 0.0;      ///< a constant (fill value; random: mean, lo)
  double scalar2 = 0.0;     ///< a second constant (random: stddev, hi)
  DType dtype = DType::f32; ///< target dtype (cast, one_hot, fill, random)
  bool flag = false;        ///< keepdims
  friend bool operator==(const Attrs&, const Attrs&) = default;
};

/// Shape and dtype of an op's result, computed by infer() before any data is touched.
struct OutMeta {
  Shape shape;
  DType dtype = DType::f32;
};

/// Which inputs' gradients a gradient rule's caller needs: bit k for input k (inputs past 63
/// are always wanted). The tape asks only for inputs that depend on a source, so a rule may
/// return an undefined Tensor for the others instead of computing what would be thrown away.
struct Wanted {
  std::uint64_t bits = ~std::uint64_t{0};
  constexpr bool operator[](std::size_t k) const { return k >= 64 || ((bits >> k) & 1) != 0; }
  /// Only input k.
  static constexpr Wanted only(std::size_t k) { return {k >= 64 ? ~std::uint64_t{0} : std::uint64_t{1} << k}; }
  friend constexpr bool operator==(Wanted, Wanted) = default;
};

/// An op whose gradient rule takes the wanted inputs as a fifth parameter.
template <class Op>
concept HasSelectiveVjp = requires(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a, Wanted w) {
  { Op::vjp(g, in, out, a, w) } -> std::convertible_to<std::vector<Tensor>>;
};
/// An op whose definition carries a gradient rule (vector-Jacobian product).
template <class Op>
concept HasVjp = HasSelectiveVjp<Op> || requires(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a) {
  { Op::vjp(g, in, out, a) } -> std::convertible_to<std::vector<Tensor>>;
};
/// An op whose rule is elementwise in g (`static constexpr bool vjp_takes_broadcast_grad = true`):
/// it gives the same gradients when g has a shape that broadcasts to the output's, so the tape
/// hands it a gradient still unbroadcast (sum's of a loss: one value, not a tensor of copies).
template <class Op>
concept TakesBroadcastGrad = requires { requires Op::vjp_takes_broadcast_grad; };
/// An op whose rule may give an input's gradient in a shape that broadcasts to the input's
/// (`static constexpr bool vjp_gives_broadcast_grad = true`: sum's), as may one that takes such
/// a gradient; any other rule's gradients must sum down to the input's shape exactly.
template <class Op>
concept GivesBroadcastGrad = TakesBroadcastGrad<Op> || requires { requires Op::vjp_gives_broadcast_grad; };
/// An op whose rule gives its second input -g, the output's gradient negated (`static constexpr
/// bool vjp_negates_second = true`: sub's). Where the op broadcast that input, the tape sums g
/// down to its shape and negates the sum instead of every element (the same bits: negation is
/// exact): x - mean(x) then costs no full-size negation in its backward.
template <class Op>
concept NegatesSecondGrad = requires { requires Op::vjp_negates_second; };

/// Ops that accept every dtype use this; others reject with a DTypeError naming the dtype.
inline void require_dtype(bool ok, std::string_view op, DType d, const char* what,
                          const std::source_location& loc) {
  if (SC_UNLIKELY(!ok)) detail::fail<DTypeError>(op, loc, "expects ", what, ", got ", name(d));
}

}  // namespace stagecraft::ops
