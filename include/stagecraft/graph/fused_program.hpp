// A fused elementwise group's program (what the fusion pass emits and the CPU evaluator, the
// generated GPU kernels and the specialized kernels run): registers, instructions, outputs.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "../core/dtype.hpp"
#include "../core/shape.hpp"
#include "../ops/op_list.hpp"

namespace stagecraft::graph {

/// One instruction: reg[num_inputs + k] = op(reg[a]) or op(reg[a], reg[b]) (b = -1 for unary).
struct FusedInstr {
  ops::OpId op;
  int a;
  int b = -1;
  friend bool operator==(const FusedInstr&, const FusedInstr&) = default;
};

/// The reduction a program feeds (its consumer): register `reg` reduced over its trailing `inner`
/// elements by sum, max or min (op is OpId::Sum, Max or Min), giving numel / inner results of
/// shape out_shape. The register is reduced tile by tile as it is computed, never stored whole.
struct FusedReduction {
  ops::OpId op = ops::OpId::Sum;
  int reg = -1;
  std::int64_t inner = 1;
  Shape out_shape;
};

/// A fused elementwise program over one dtype: registers 0..input_shapes.size()-1 are the inputs,
/// each broadcast (NumPy rules) to out_shape; register input_shapes.size() + k is instruction k's result.
struct FusedProgram {
  DType dtype = DType::f32;
  Shape out_shape;
  std::vector<Shape> input_shapes;
  std::vector<FusedInstr> code;
  std::vector<int> outputs;  ///< registers written out, each to a tensor of out_shape and dtype
  std::optional<FusedReduction> reduction = std::nullopt;  ///< written to one more output tensor, after `outputs`
};

}  // namespace stagecraft::graph
