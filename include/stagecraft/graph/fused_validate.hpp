// The fused evaluator's checks of a program (fused_kernel.hpp's prepare runs them): operands
// before their use, arities, dtypes, broadcasting, windows, products and the reduction; and which
// registers are live and which hold one value for the whole run.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../config.hpp"
#include "../core/error.hpp"
#include "fused_ops.hpp"
#include "fused_program.hpp"

namespace stagecraft::graph::detail_fused {

[[noreturn]] SC_COLD inline void fail_program(const std::string& what) {
  throw ValueError("[fused] invalid program: " + what);
}

/// Checks p: operands precede their use, arities and dtypes fit, inputs broadcast to out_shape.
STAGECRAFT_COMPILED_INLINE void validate(const FusedProgram& p);
/// The part of validate() that checks the outputs' windows and tensors.
STAGECRAFT_COMPILED_INLINE void validate_out_windows(const FusedProgram& p);

/// Registers whose value is one element for the whole run (computed from single-element inputs
/// only): computed once per run, not per tile.
STAGECRAFT_COMPILED_INLINE std::vector<char> single_valued(const FusedProgram& p);

/// Registers an output or a live instruction reads (dead instructions are skipped).
STAGECRAFT_COMPILED_INLINE std::vector<char> live_registers(const FusedProgram& p);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE void validate_out_windows(const FusedProgram& p) {
  const std::size_t nout = p.outputs.size();
  if (!p.out_windows.empty() && p.out_windows.size() != nout)
    fail_program("there are " + std::to_string(p.out_windows.size()) + " output windows for " + std::to_string(nout) + " outputs");
  if (!p.out_args.empty() && p.out_args.size() != nout)
    fail_program("there are " + std::to_string(p.out_args.size()) + " output tensors named for " + std::to_string(nout) + " outputs");
  const std::size_t nt = p.num_out_args();
  std::vector<std::int64_t> covered(nt, 0);  // elements written to each tensor
  std::vector<int> plain(nt, 0), writers(nt, 0);  // outputs written whole to each tensor; all outputs
  for (std::size_t j = 0; j < nout; ++j) {
    const int t = p.out_arg(j);
    const std::string at = "output " + std::to_string(j);
    if (t < 0) fail_program(at + " names output tensor " + std::to_string(t));
    ++writers[static_cast<std::size_t>(t)];
    if (!p.out_windowed(j)) {
      ++plain[static_cast<std::size_t>(t)];
      covered[static_cast<std::size_t>(t)] += p.out_shape.numel();
      continue;
    }
    const FusedWindow& w = p.out_windows[j];
    bool ok = w.parent.rank() == p.out_shape.rank() && w.begin.rank() == p.out_shape.rank();
    for (int d = 0; ok && d < p.out_shape.rank(); ++d) ok = w.begin[d] >= 0 && w.begin[d] <= w.parent[d] - p.out_shape[d];
    if (!ok) fail_program(at + " of shape " + p.out_shape.str() + " is not a window of " + w.parent.str() + " at " + w.begin.str());
    if (!(w.parent == p.out_arg_shape(static_cast<std::size_t>(t))))
      fail_program(at + " writes a window of " + w.parent.str() + " into output tensor " + std::to_string(t) + " of shape " +
                   p.out_arg_shape(static_cast<std::size_t>(t)).str());
    covered[static_cast<std::size_t>(t)] += p.out_shape.numel();
    for (std::size_t i = 0; i < j; ++i) {  // boxes meet unless apart along some axis
      if (!p.out_windowed(i) || p.out_arg(i) != t) continue;
      const FusedWindow& v = p.out_windows[i];
      bool apart = false;
      for (int d = 0; d < p.out_shape.rank() && !apart; ++d)
        apart = v.begin[d] + p.out_shape[d] <= w.begin[d] || w.begin[d] + p.out_shape[d] <= v.begin[d];
      if (!apart) fail_program(at + "'s window at " + w.begin.str() + " overlaps output " + std::to_string(i) + "'s at " + v.begin.str());
    }
  }
  for (std::size_t t = 0; t < nt; ++t)
    if (writers[t] == 0) fail_program("output tensor " + std::to_string(t) + " is written by no output");
  for (std::size_t t = 0; t < nt; ++t) {
    const std::string at = "output tensor " + std::to_string(t);
    if (plain[t] > 0 && (plain[t] > 1 || covered[t] != p.out_shape.numel()))
      fail_program(at + " is written whole by an output and by another output too");
    if (covered[t] != p.out_arg_shape(t).numel())
      fail_program(at + " of shape " + p.out_arg_shape(t).str() + " is not covered by its outputs' windows");
  }
}

STAGECRAFT_COMPILED_INLINE void validate(const FusedProgram& p) {
  const int nin = static_cast<int>(p.input_shapes.size());
  if (!p.products.empty() && static_cast<int>(p.products.size()) != nin)
    fail_program("there are " + std::to_string(p.products.size()) + " product entries for " + std::to_string(nin) + " inputs");
  for (int i = 0; i < nin && !p.products.empty(); ++i) {
    const FusedProduct& q = p.products[i];
    const std::string at = "input " + std::to_string(i);
    if (q.operand && q.on()) fail_program(at + " is both a product and an operand");
    if (q.operand && p.windowed(static_cast<std::size_t>(i))) fail_program(at + " is an operand read through a window");
    if (q.operand && p.input_shapes[i].rank() != 2) fail_program(at + ": an operand has rank 2, not " + p.input_shapes[i].str());
    if (!q.on()) continue;
    if (!is_floating(p.dtype)) fail_program(at + ": products run over floating dtypes only");
    if (q.b < 0 || q.b >= nin || !p.operand(static_cast<std::size_t>(q.b)))
      fail_program(at + ": its operand B (input " + std::to_string(q.b) + ") is not an operand input");
    const Shape& bs = p.input_shapes[q.b];
    if (bs.rank() != 2) fail_program(at + ": its operand B has rank 2, not " + bs.str());
    const std::int64_t kb = q.tb ? bs[1] : bs[0], n = q.tb ? bs[0] : bs[1];
    const Shape value = p.source_shape(static_cast<std::size_t>(i));
    if (kb != q.k() || !(value == Shape{q.m(), n}))
      fail_program(at + ": op(" + q.a.str() + ") op(" + bs.str() + ") is not a product of shape " + value.str());
  }
  for (int i = 0; i < nin; ++i) {
    Shape b;
    if (p.operand(static_cast<std::size_t>(i))) continue;  // (read by products only: checked above)
    if (!broadcast_shapes(p.input_shapes[i], p.out_shape, b) || !(b == p.out_shape))
      fail_program("input " + std::to_string(i) + " of shape " + p.input_shapes[i].str() +
                   " does not broadcast to the output shape " + p.out_shape.str());
  }
  if (!p.input_dtypes.empty() && static_cast<int>(p.input_dtypes.size()) != nin)
    fail_program("there are " + std::to_string(p.input_dtypes.size()) + " input dtypes for " + std::to_string(nin) + " inputs");
  for (int i = 0; i < nin; ++i)
    if (p.converted(static_cast<std::size_t>(i)) && (p.product(static_cast<std::size_t>(i)) || p.operand(static_cast<std::size_t>(i))))
      fail_program("input " + std::to_string(i) + " is converted from " + std::string(name(p.arg_dtype(static_cast<std::size_t>(i)))) +
                   " and is a product or an operand (products read the program's dtype)");
  if (!p.windows.empty() && static_cast<int>(p.windows.size()) != nin)
    fail_program("there are " + std::to_string(p.windows.size()) + " windows for " + std::to_string(nin) + " inputs");
  for (int i = 0; i < nin && !p.windows.empty(); ++i) {
    const FusedWindow& w = p.windows[i];
    if (!w.on()) continue;
    const Shape& in = p.input_shapes[i];
    bool ok = w.parent.rank() == in.rank() && w.begin.rank() == in.rank();
    for (int d = 0; ok && d < in.rank(); ++d) ok = w.begin[d] >= 0 && w.begin[d] <= w.parent[d] - in[d];
    if (!ok)
      fail_program("input " + std::to_string(i) + " of shape " + in.str() + " is not a window of " + w.parent.str() +
                   " at " + w.begin.str());
  }
  for (int k = 0; k < static_cast<int>(p.code.size()); ++k) {
    const FusedInstr& c = p.code[k];
    const std::string at = "instruction " + std::to_string(k);
    if (!fusible(c.op, p.dtype))
      fail_program(at + ": op '" + std::string(static_cast<int>(c.op) < ops::num_ops ? ops::op_info(c.op).name : "?") +
                   "' is not an elementwise op that keeps the dtype " + std::string(name(p.dtype)));
    const int arity = ops::op_info(c.op).arity;
    if ((arity == 1) != (c.b < 0)) fail_program(at + ": " + std::string(ops::op_info(c.op).name) +
                                                " takes " + std::to_string(arity) + " operand(s)");
    if (c.a < 0 || c.a >= nin + k || (arity == 2 && c.b >= nin + k))
      fail_program(at + ": an operand is not an input or an earlier result");
    if (p.operand(static_cast<std::size_t>(c.a)) || (c.b >= 0 && p.operand(static_cast<std::size_t>(c.b))))
      fail_program(at + " reads an operand input (read by products only)");
  }
  for (int r : p.outputs)
    if (r < 0 || r >= nin + static_cast<int>(p.code.size())) fail_program("output register " + std::to_string(r) + " does not exist");
    else if (p.operand(static_cast<std::size_t>(r))) fail_program("output register " + std::to_string(r) + " is an operand input");
  validate_out_windows(p);
  if (p.reduction) {
    const FusedReduction& rd = *p.reduction;
    const std::int64_t n = p.out_shape.numel();
    if (rd.op != ops::OpId::Sum && rd.op != ops::OpId::Max && rd.op != ops::OpId::Min)
      fail_program("a reduction is sum, max or min");
    if (!is_floating(p.dtype)) fail_program("reductions run over floating dtypes only");
    if (rd.reg < 0 || rd.reg >= nin + static_cast<int>(p.code.size()))
      fail_program("the reduced register " + std::to_string(rd.reg) + " does not exist");
    if (p.operand(static_cast<std::size_t>(rd.reg))) fail_program("the reduced register is an operand input");
    if (n == 0 || rd.inner < 1 || n % rd.inner != 0 || rd.out_shape.numel() != rd.results(n))
      fail_program("a reduction over " + (rd.leading ? "the rows of " + std::to_string(rd.inner) + " elements"
                                                     : std::to_string(rd.inner) + " trailing elements") +
                   " of " + p.out_shape.str() + " cannot give shape " + rd.out_shape.str());
  }
}

STAGECRAFT_COMPILED_INLINE std::vector<char> single_valued(const FusedProgram& p) {
  const int nin = static_cast<int>(p.input_shapes.size());
  std::vector<char> one(p.input_shapes.size() + p.code.size(), 0);
  for (int i = 0; i < nin; ++i) one[i] = p.input_shapes[i].numel() == 1;
  for (std::size_t k = 0; k < p.code.size(); ++k)
    one[nin + k] = one[p.code[k].a] && (p.code[k].b < 0 || one[p.code[k].b]);
  return one;
}

STAGECRAFT_COMPILED_INLINE std::vector<char> live_registers(const FusedProgram& p) {
  const int nin = static_cast<int>(p.input_shapes.size());
  std::vector<char> live(p.input_shapes.size() + p.code.size(), 0);
  for (int r : p.outputs) live[r] = 1;
  if (p.reduction) live[p.reduction->reg] = 1;
  for (int k = static_cast<int>(p.code.size()) - 1; k >= 0; --k) {
    if (!live[nin + k]) continue;
    live[p.code[k].a] = 1;
    if (p.code[k].b >= 0) live[p.code[k].b] = 1;
  }
  return live;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph::detail_fused
