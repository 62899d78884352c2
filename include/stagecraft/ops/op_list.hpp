// The op list: one line per op. Adding an op is a new file in ops/ and one line here.
// X(Struct, file) — the struct's name (ops::Struct) and the header that defines it.
#pragma once
#include <cstdint>

// clang-format off
#define STAGECRAFT_OP_LIST(X)                                   \
  /* elementwise unary (ops/unary.hpp) */                       \
  X(Neg) X(Abs) X(Exp) X(Log) X(Sqrt) X(Tanh) X(Sigmoid)        \
  X(Relu) X(Square) X(Sign) X(Sin) X(Cos) X(Log1p) X(Expm1)     \
  X(Erf) X(Floor) X(Ceil) X(Round) X(LogicalNot)                \
  /* elementwise binary (ops/binary.hpp) */                     \
  X(Add) X(Sub) X(Mul) X(Div) X(Pow) X(Maximum) X(Minimum)      \
  X(FloorDiv) X(Mod)                                            \
  X(Less) X(LessEqual) X(Greater) X(GreaterEqual) X(Equal)      \
  X(NotEqual) X(LogicalAnd) X(LogicalOr) X(ReluGrad)            \
  /* selection and conversion (ops/where.hpp, ops/cast.hpp) */  \
  X(Where) X(Cast)                                              \
  /* reductions (ops/reduce.hpp) */                             \
  X(Sum) X(Max) X(Min) X(ArgMax) X(ArgMin)                      \
  /* layout (ops/reshape.hpp, transpose, broadcast_to, concat,  \
     slice, gather: also scatter_add) */                        \
  X(Reshape) X(Transpose) X(BroadcastTo) X(Concat) X(Slice)     \
  X(Gather) X(ScatterAdd) X(OneHot)                             \
  /* linear algebra (ops/matmul.hpp) */                         \
  X(MatMul)                                                     \
  /* convolution and pooling (ops/conv.hpp, ops/pool.hpp) */    \
  X(Im2Col) X(Col2Im) X(Conv2d) X(Conv2dGradInput)              \
  X(Conv2dGradFilter) X(MaxPool2d) X(MaxPool2dGrad) X(AvgPool2d) \
  /* autodiff (ops/stop_gradient.hpp) */                        \
  X(StopGradient)                                               \
  /* creation (ops/fill.hpp, ops/random.hpp) */                 \
  X(Fill) X(RandomNormal) X(RandomUniform)                      \
  /* runtime checks (ops/check_range.hpp) */                    \
  X(CheckRange)                                                 \
  /* losses (ops/cross_entropy.hpp) */                          \
  X(SoftmaxCrossEntropy) X(SoftmaxCrossEntropyGrad)             \
  /* moves between devices (ops/to_device.hpp) */               \
  X(ToDevice)                                                   \
  /* sums of many (ops/add_n.hpp) */                            \
  X(AddN)                                                       \
  /* scans (ops/scan.hpp) */                                    \
  X(Cumsum) X(Cumprod) X(Logcumsumexp) X(Cummax) X(Cummin)      \
  X(CumArgMax) X(CumArgMin) X(LinearScan)                       \
  /* sorting (ops/sort.hpp) */                                  \
  X(TopKIndices)                                                \
  /* an index per element (ops/along_axis.hpp) */               \
  X(TakeAlongAxis) X(AddAlongAxis)
// clang-format on

namespace stagecraft::ops {
/// Every op's identity, in op-list order (graphs and tapes store this).
enum class OpId : std::uint16_t {
#define STAGECRAFT_OP_ID(S) S,
  STAGECRAFT_OP_LIST(STAGECRAFT_OP_ID)
#undef STAGECRAFT_OP_ID
  count_
};
inline constexpr int num_ops = static_cast<int>(OpId::count_);
}  // namespace stagecraft::ops
