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

/// The reduction a program feeds (its consumer): register `reg`, seen as rows of `inner`
/// elements, reduced by sum, max or min (op is OpId::Sum, Max or Min). Over each row (its trailing
/// `inner` elements: numel / inner results), or with `leading`, over the rows (its leading axes, a
/// column sum: `inner` results), of shape out_shape. The register is reduced tile by tile as it is
/// computed, never stored whole. Leading reductions run on the CPU only, each column adding in the
/// reduction kernel's order (its bits).
struct FusedReduction {
  ops::OpId op = ops::OpId::Sum;
  int reg = -1;
  std::int64_t inner = 1;
  Shape out_shape;
  bool leading = false;
  /// Results: numel / inner over rows, inner over columns.
  std::int64_t results(std::int64_t numel) const { return leading ? inner : numel / inner; }
};

/// An input read through a window of a larger tensor (a slice the fusion pass took into the
/// group): the tensor passed has shape `parent` (row-major), and the input's element at index j
/// (a multi-index of its input_shapes entry, same rank) is the parent's element at begin + j.
/// No window: begin of rank 0.
struct FusedWindow {
  Shape parent;
  Shape begin;
  bool on() const { return begin.rank() > 0; }
  friend bool operator==(const FusedWindow&, const FusedWindow&) = default;
};

/// An input the group computes instead of reading: a small matrix product op(A) op(B), formed
/// where it is read (on a GPU each thread forms the dot products of the elements it reads: an
/// LSTM step's recurrent product inside the group of its gates, no launch of its own).
/// - In a product's slot (`a` of rank 2) the tensor passed is A (shape `a`, [M, K], or [K, M]
///   when ta); B is the tensor passed in slot `b` ([K, N], or [N, K] when tb). The input itself is
///   the product, of shape [M, N] (input_shapes entry, or its window's parent when windowed).
/// - An operand's slot (`operand`, B of one or more products) is never read elementwise: its
///   register is not an operand of any instruction or an output.
/// Products run over floating dtypes only. The CPU evaluator forms them by BLAS before its tiles
/// (as the eager matmul does: same bits); a GPU kernel sums four interleaved partial sums of fused
/// multiply-adds (cuda_fused.hpp), which rounds differently from cuBLAS.
struct FusedProduct {
  Shape a;
  int b = -1;
  bool ta = false, tb = false;
  bool operand = false;
  bool on() const { return a.rank() == 2; }
  std::int64_t m() const { return a[ta ? 1 : 0]; }
  std::int64_t k() const { return a[ta ? 0 : 1]; }
  friend bool operator==(const FusedProduct&, const FusedProduct&) = default;
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
  std::vector<FusedWindow> windows = {};  ///< empty (no input windowed), or one per input
  std::vector<FusedProduct> products = {};  ///< empty (no product), or one per input
  /// Where outputs are written (a concat of the group's values that the fusion pass took into the
  /// group): empty (output j is written whole to output tensor j), or one per output: output j is
  /// written to tensor out_args[j], through out_windows[j] when that is on (the tensor then has
  /// the window's parent shape, and element j of the output goes to begin + j). Windowed outputs
  /// may share a tensor; their windows then tile it exactly (every element written once). A
  /// tensor not windowed is written by one output, whole.
  std::vector<FusedWindow> out_windows = {};
  std::vector<int> out_args = {};
  /// The dtype of the tensor passed for each input: empty (every input has the program's dtype),
  /// or one per input. An input of another dtype is converted to the program's as it is read
  /// (rules::Cast, as the cast op it stands for: a cast the fusion pass took into a GPU group).
  /// Generated GPU kernels only: the CPU evaluator refuses such a program.
  std::vector<DType> input_dtypes = {};

  bool windowed(std::size_t k) const { return k < windows.size() && windows[k].on(); }
  bool any_window() const {
    for (const FusedWindow& w : windows)
      if (w.on()) return true;
    return false;
  }
  bool product(std::size_t k) const { return k < products.size() && products[k].on(); }
  bool operand(std::size_t k) const { return k < products.size() && products[k].operand; }
  bool any_product() const {
    for (const FusedProduct& q : products)
      if (q.on()) return true;
    return false;
  }
  bool out_windowed(std::size_t j) const { return j < out_windows.size() && out_windows[j].on(); }
  bool any_out_window() const {
    for (const FusedWindow& w : out_windows)
      if (w.on()) return true;
    return false;
  }
  /// The output tensor output j writes.
  int out_arg(std::size_t j) const { return out_args.empty() ? static_cast<int>(j) : out_args[j]; }
  /// Number of elementwise output tensors (a reduction's result comes after them).
  std::size_t num_out_args() const {
    int n = out_args.empty() ? static_cast<int>(outputs.size()) : 0;
    for (int t : out_args) n = t + 1 > n ? t + 1 : n;
    return static_cast<std::size_t>(n);
  }
  /// The shape of elementwise output tensor t: the parent of a window written to it, else out_shape.
  const Shape& out_arg_shape(std::size_t t) const {
    for (std::size_t j = 0; j < outputs.size(); ++j)
      if (out_windowed(j) && out_arg(j) == static_cast<int>(t)) return out_windows[j].parent;
    return out_shape;
  }
  /// Output j's element strides in its tensor over out_shape's axes (row-major; 0 on axes of one
  /// element), and the elements before its first (non-zero for a window).
  Shape out_strides(std::size_t j) const {
    const Shape& par = out_windowed(j) ? out_windows[j].parent : out_shape;
    Shape st = par;
    std::int64_t n = 1;
    for (int d = par.rank() - 1; d >= 0; --d) {
      st[d] = out_shape[d] == 1 ? 0 : n;
      n *= par[d];
    }
    return st;
  }
  std::int64_t out_offset(std::size_t j) const {
    if (!out_windowed(j)) return 0;
    const FusedWindow& w = out_windows[j];
    std::int64_t off = 0, n = 1;
    for (int d = w.parent.rank() - 1; d >= 0; --d) {
      off += w.begin[d] * n;
      n *= w.parent[d];
    }
    return off;
  }
  /// The dtype of the tensor passed as input k (input_dtypes).
  DType arg_dtype(std::size_t k) const { return k < input_dtypes.size() ? input_dtypes[k] : dtype; }
  /// Whether input k is converted from another dtype as it is read.
  bool converted(std::size_t k) const { return arg_dtype(k) != dtype; }
  bool any_converted() const {
    for (DType d : input_dtypes)
      if (d != dtype) return true;
    return false;
  }
  /// The shape input k's elements are taken from: its window's parent, else input_shapes[k].
  const Shape& source_shape(std::size_t k) const { return windowed(k) ? windows[k].parent : input_shapes[k]; }
  /// The shape of the tensor passed as input k: operand A of a product, else source_shape(k).
  const Shape& arg_shape(std::size_t k) const { return product(k) ? products[k].a : source_shape(k); }
  /// Input k's element strides in its source (row-major over source_shape(k)).
  Shape arg_strides(std::size_t k) const {
    const Shape& a = source_shape(k);
    Shape st = a;
    std::int64_t n = 1;
    for (int d = a.rank() - 1; d >= 0; --d) {
      st[d] = n;
      n *= a[d];
    }
    return st;
  }
  /// Input k's element strides in its source over out_shape's axes (0 where input k is
  /// broadcast): what a reader of the output's elements steps by along each axis.
  Shape strides_over_out(std::size_t k) const {
    const Shape& in = input_shapes[k];
    const Shape st = arg_strides(k);
    Shape r;
    const int ro = out_shape.rank(), ri = in.rank();
    for (int d = 0; d < ro; ++d) {
      const int j = d - (ro - ri);
      r.push_back(j >= 0 && in[j] == out_shape[d] && out_shape[d] != 1 ? st[j] : 0);
    }
    return r;
  }
  /// Elements from the start of input k's source to its first element read.
  std::int64_t arg_offset(std::size_t k) const {
    if (!windowed(k)) return 0;
    const Shape st = arg_strides(k);
    std::int64_t off = 0;
    for (int d = 0; d < st.rank(); ++d) off += windows[k].begin[d] * st[d];
    return off;
  }
};

}  // namespace stagecraft::graph
