// Specialized kernels for fused programs that library code emits on every training step: one
// compiled loop over the elements with every value in a register, where the tile evaluator
// (fused_kernel.hpp) runs one op at a time over L1 tiles, a load and a store per op and element.
// Adam's 12-op update of one variable ran 2x slower there than as the eager fused loop
// (optim/fused.hpp), which made a traced training step slower than the eager one. The code that
// emits a program registers its kernel with that program before it is traced (optim/fused.hpp:
// Adam's update, registered by the optimizer's constructor); prepare() looks every CPU program up.
// The graph layer names no op: a program matches a pattern instruction by instruction, and results
// are the same bits as the evaluator's.
#pragma once
#include <deque>
#include <mutex>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/tensor.hpp"
#include "fused_program.hpp"

namespace stagecraft::graph {

/// A kernel for programs shaped like `pattern`: the same instructions and outputs, the inputs that
/// are single values in the pattern (shape []) single values, the others of the output's shape
/// (not broadcast), over f32 or f64, with no reduction. run(in, out) receives the program's
/// tensors, already checked by the evaluator's run(); an output may share its buffer with an
/// input, so a kernel reads each element's inputs before it writes that element's outputs.
struct SpecialKernel {
  const char* name = "";
  FusedProgram pattern;
  void (*run)(std::span<const Tensor> in, std::span<Tensor> out) = nullptr;
};

/// The registered kernels, in registration order, under their lock. A deque: a plan keeps a
/// pointer to its kernel, which a later registration must not move.
struct SpecialRegistry {
  std::mutex mu;
  std::deque<SpecialKernel> kernels;
};
inline SpecialRegistry& special_registry() {
  static SpecialRegistry r;
  return r;
}

/// Whether prepare() gives programs their specialized kernel (default true). Off, every program
/// runs in the tile evaluator (for comparisons); plans prepared before keep what they have.
inline bool& fused_specializations() {
  static bool on = true;
  return on;
}

/// Adds k unless a kernel of that name is registered; returns whether it added it. Safe from
/// any thread, at any time: the code that emits a program calls it before it can be traced (once,
/// e.g. from a function-local static: optim/fused.hpp's register_adam_program), not from a
/// static initialiser, which would make every file that includes its header compile the kernel
/// and all it reaches.
inline bool register_special(SpecialKernel k) {
  SpecialRegistry& r = special_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const SpecialKernel& have : r.kernels)
    if (std::string_view(have.name) == k.name) return false;
  r.kernels.push_back(std::move(k));
  return true;
}

/// True when program p is shaped like pattern q (see SpecialKernel).
inline bool matches(const FusedProgram& p, const FusedProgram& q) {
  if ((p.dtype != DType::f32 && p.dtype != DType::f64) || p.reduction || q.reduction) return false;
  if (p.input_shapes.size() != q.input_shapes.size() || p.code != q.code || p.outputs != q.outputs) return false;
  if (p.any_window()) return false;  // the special loops read every input from its start
  if (!p.out_args.empty() || p.any_out_window()) return false;  // and write every output whole
  for (std::size_t i = 0; i < p.input_shapes.size(); ++i) {
    const bool single = q.input_shapes[i].rank() == 0;
    if (single ? p.input_shapes[i].numel() != 1 : p.input_shapes[i] != p.out_shape) return false;
  }
  return true;
}

/// The kernel registered for p, or null (always null with fused_specializations() off).
inline const SpecialKernel* find_special(const FusedProgram& p) {
  if (!fused_specializations()) return nullptr;
  SpecialRegistry& r = special_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const SpecialKernel& k : r.kernels)
    if (matches(p, k.pattern)) return &k;
  return nullptr;
}

}  // namespace stagecraft::graph
