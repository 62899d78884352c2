// The fused evaluator's preparation (fused_kernel.hpp runs what it prepares): a FusedProgram
// validated once, each instruction's kernel looked up, each register given its home (one value,
// an input read in place or gathered, a scratch slot, an output) and each broadcast input its walk,
// so a run does no lookup.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../backend/cpu/elementwise.hpp"
#include "../backend/cpu/parallel.hpp"
#include "../ops/registry.hpp"
#include "fused_chain.hpp"
#include "fused_ops.hpp"
#include "fused_program.hpp"
#include "fused_special.hpp"
#include "fused_validate.hpp"
#include "fused_walk.hpp"

namespace stagecraft::graph {

namespace detail_fused {

/// Bytes of one register's tile. The current tile of every register and buffer, and the next
/// tile's prefetched inputs, must stay in L1: bench_fusion's sweep (9-op chain, 5 buffers) found
/// 2 KiB best at 256K elements and within 5% of 1 KiB at 16M; 4 KiB 15-40% slower, 16 KiB 70%.
inline constexpr std::int64_t tile_bytes = 2048;
/// The tile of a program of at most `few_slots` scratch slots (inputs and registers): twice
/// tile_bytes, which still leaves them and the next inputs in L1, and halves the kernel calls a
/// short chain makes per element (sum(2x + 1) of [1024, 1024] traced: 89 -> 70-74 us on 2 threads).
inline constexpr std::int64_t few_slots = 3;
/// The tile of a program that is one chain over inputs read in place (one_chain). 128K floats,
/// 1 thread, AVX-512, traced over the hand loop's speed: 16 ops 0.70-0.74x at 4 KiB, 0.78-0.84x at
/// 16 KiB, 0.78-0.84x at 32 KiB; 8 ops 0.77-0.83x, 0.88-0.91x, 0.88-0.89x; 2 and 4 ops the same.
inline constexpr std::int64_t chain_tile_bytes = 16384;
/// Elements per tile (prepare's default; PreparedFused::tile may be changed before a run).
template <class T>
inline constexpr std::int64_t tile_elems = tile_bytes / static_cast<std::int64_t>(sizeof(T));

/// Where a register lives during a tile.
enum class Home : std::uint8_t { scalar, input, slot, output };
struct Reg {
  Home home = Home::slot;
  int index = -1;  ///< scalar: its value's index; input: the input; output: the output written directly
  int slot = -1;   ///< scratch slot: slot results, and inputs when gathered (broadcast or aliased)
  bool scalar_value() const { return home == Home::scalar; }
};
/// One kernel call per tile (or per run for single-element results): fn(reg a, reg b, reg y); or,
/// with chain >= 0, the chain of that index (PreparedFused::chains) from its head into y.
struct Step {
  void (*fn)() = nullptr;  ///< a Kernel<T> of the program's dtype, cast back before the call
  int a = -1, b = -1, y = -1;
  ops::OpId op{};  ///< the instruction's op and the mode fn runs it in
  Mode mode = vv;
  int chain = -1;
};
/// An input read per element: in place (same numel as the output) or gathered by `plan`.
struct VectorInput {
  int input = -1;
  bool broadcast = false;
  backend::cpu::StridedPlan<1> plan;  ///< the input's strides over the output, axes merged
  int splat = -1;  ///< its index among the inputs read as one value in a tile of one row (see place_splats)
};
/// An output not written by its instruction (an input or single value, or a register written twice).
struct CopyOut {
  int output = -1, reg = -1;
};

/// Where a register is for the tile starting at t0: (ptr, or the thread's scratch) + off + t0 * stride.
struct Loc {
  std::byte* ptr = nullptr;
  std::int64_t off = 0, stride = 0;
};
/// A gather for one tile: a broadcast input by its plan, or an aliased input copied in place.
struct Gather {
  const std::byte* src = nullptr;
  const backend::cpu::StridedPlan<1>* plan = nullptr;  ///< null: a linear copy
  std::int64_t off = 0;                                  ///< its slot's offset in the scratch
  int splat = -1;                                        ///< VectorInput::splat
  int reg = -1;                                          ///< its register (the input's index)
  bool rows = false;  ///< its plan's innermost axis has stride 1: a tile within one run is read in place
};
/// Inputs at most read as one value per tile (PreparedFused::per_tile_splat).
inline constexpr int max_splats = 8;

}  // namespace detail_fused

/// A FusedProgram with its kernels, register homes and broadcast walks resolved (see prepare()):
/// running it does no lookup and, after a thread's first run, no allocation.
struct PreparedFused {
  FusedProgram program;                                 ///< the program as given
  std::vector<detail_fused::Reg> regs;                  ///< one per register
  std::vector<detail_fused::Step> once, per_tile;       ///< single-value steps; steps per tile
  /// per_tile for a tile in which every input broadcast along the innermost axis that binary
  /// instructions only read holds one value: they read it as one (operand -2 - k: the k-th such
  /// input) instead of a tile gathered from it. Empty when no input qualifies.
  std::vector<detail_fused::Step> per_tile_splat;
  /// The chains steps of per_tile and per_tile_splat run (see form_chains).
  std::vector<detail_fused::Chain> chains;
  std::vector<int> scalar_inputs;                       ///< inputs read as one value
  std::vector<detail_fused::VectorInput> vector_inputs; ///< inputs read per element
  std::vector<detail_fused::CopyOut> copies;             ///< outputs copied at the end of a tile
  int num_slots = 0, num_scalars = 0;
  std::int64_t numel = 0, grain = 0;
  std::int64_t tile = 0;  ///< elements per tile, any positive count (default: tile_bytes of the dtype)
  const SpecialKernel* special = nullptr;  ///< a compiled loop for this program (fused_special.hpp), or null
  bool batch_dependent = false;  ///< an instruction's SIMD bits depend on the batch (OpKernels)
  std::vector<std::int64_t> arg_offsets;  ///< program.arg_offset(k) of each input (elements)
  std::vector<std::int64_t> arg_bytes;    ///< bytes of the tensor passed as each input (its arg_shape)
  std::int64_t out_bytes = 0;             ///< bytes of each elementwise output
  /// Per output written through a window (FusedProgram::out_windows): its walk over its tensor
  /// (copied there from its register at the end of each tile); empty without windows.
  std::vector<backend::cpu::StridedPlan<1>> out_plans;
  /// A program with products (FusedProduct): `program` is it with each product an input of the
  /// product's shape (formed by BLAS at each run, before the tiles) and each operand one unread
  /// element; `products` and `passed` are the program's entries and the shapes of the tensors
  /// passed. Empty otherwise.
  std::vector<FusedProduct> products;
  std::vector<Shape> passed;
};


namespace detail_fused {

template <class T>
Step step_of(const FusedInstr& c, int y, Mode m) {
  return {reinterpret_cast<void (*)()>(kernels<T>(c.op).k[m]), c.a, c.b, y, c.op, m};
}

/// Homes of the input registers: one value, in place, or gathered into a dedicated slot.
STAGECRAFT_COMPILED_INLINE void place_inputs(PreparedFused& pf, const std::vector<char>& live);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE void place_inputs(PreparedFused& pf, const std::vector<char>& live) {
  const FusedProgram& p = pf.program;
  for (int i = 0; i < static_cast<int>(p.input_shapes.size()); ++i) {
    Reg& r = pf.regs[i];
    if (p.input_shapes[i].numel() == 1) {
      r = {Home::scalar, pf.num_scalars++, -1};
      if (live[i]) pf.scalar_inputs.push_back(i);
    } else if (live[i]) {
      r = {Home::input, i, pf.num_slots++};  // the slot is used when gathered
      // a windowed input is gathered from its parent's strides as a broadcast one is
      VectorInput v{i, p.input_shapes[i].numel() != pf.numel || p.windowed(static_cast<std::size_t>(i)), {}};
      if (v.broadcast) {
        const Shape st[1] = {p.strides_over_out(static_cast<std::size_t>(i))};
        v.plan = backend::cpu::collapse_strides<1>(p.out_shape, st);
      }
      pf.vector_inputs.push_back(v);
    }
  }
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// Homes of the results and the steps: single values once per run; per-element results written
/// straight into their first output, else into scratch slots reused once their last reader ran.
template <class T>
void place_results(PreparedFused& pf, const std::vector<char>& live) {
  const FusedProgram& p = pf.program;
  const int nin = static_cast<int>(p.input_shapes.size()), nk = static_cast<int>(p.code.size());
  const int end = nk;  // "read at the end of the tile" (copied outputs)
  std::vector<int> last(nin + nk, -1), direct(nin + nk, -1);
  for (int k = 0; k < nk; ++k)
    if (live[nin + k]) {
      last[p.code[k].a] = k;
      if (p.code[k].b >= 0) last[p.code[k].b] = k;
    }
  for (int j = 0; j < static_cast<int>(p.outputs.size()); ++j) {
    const int r = p.outputs[j];  // (a windowed output is copied out through its window)
    if (r >= nin && direct[r] < 0 && !p.out_windowed(static_cast<std::size_t>(j))) direct[r] = j;
    else last[r] = end;
  }
  if (p.reduction) last[p.reduction->reg] = end;  // reduced after the tile's last step
  std::vector<int> free_slots;
  for (int k = 0; k < nk; ++k) {
    const int y = nin + k;
    if (!live[y]) continue;
    const FusedInstr& c = p.code[k];
    const bool sa = pf.regs[c.a].scalar_value(), sb = c.b < 0 || pf.regs[c.b].scalar_value();
    if (sa && sb) {  // from single values only: once per run, by the scalar rule
      pf.regs[y] = {Home::scalar, pf.num_scalars++, -1};
      pf.once.push_back(step_of<T>(c, y, scalar));
      continue;
    }
    for (int o : {c.a, c.b == c.a ? -1 : c.b})  // operands read for the last time free their slots first (y may reuse one)
      if (o >= nin && last[o] == k && pf.regs[o].home == Home::slot) free_slots.push_back(pf.regs[o].slot);
    if (direct[y] >= 0) {
      pf.regs[y] = {Home::output, direct[y], -1};
    } else {
      int s = pf.num_slots;
      if (free_slots.empty()) ++pf.num_slots;
      else s = free_slots.back(), free_slots.pop_back();
      pf.regs[y] = {Home::slot, -1, s};
    }
    pf.per_tile.push_back(step_of<T>(c, y, c.b < 0 ? vv : (sa ? sv : (sb ? vs : vv))));
  }
  for (int j = 0; j < static_cast<int>(p.outputs.size()); ++j) {
    const int r = p.outputs[j];
    if (!(pf.regs[r].home == Home::output && pf.regs[r].index == j)) pf.copies.push_back({j, r});
  }
}
#if defined(STAGECRAFT_PRECOMPILED)  // compiled in stagecraft::precompiled, with every op's kernels
extern template void place_results<bool>(PreparedFused&, const std::vector<char>&);
extern template void place_results<std::int32_t>(PreparedFused&, const std::vector<char>&);
extern template void place_results<std::int64_t>(PreparedFused&, const std::vector<char>&);
extern template void place_results<float>(PreparedFused&, const std::vector<char>&);
extern template void place_results<double>(PreparedFused&, const std::vector<char>&);
#endif

/// Marks the inputs that may be read as one value in a tile lying in one run of their broadcast
/// innermost axis (a row's mean or deviation over the row's elements): inputs only binary
/// instructions read, as one operand with the other read per element, not copied out nor reduced;
/// then writes per_tile_splat. The sv / vs kernels compute what vv does over a gathered tile of
/// that value, lane by lane (no such instruction is batch-dependent).
template <class T>
void place_splats(PreparedFused& pf, const std::vector<char>& live) {
  const FusedProgram& p = pf.program;
  const int nin = static_cast<int>(p.input_shapes.size()), nk = static_cast<int>(p.code.size());
  std::vector<char> ok(static_cast<std::size_t>(nin), 0);
  int n = 0;
  for (const VectorInput& v : pf.vector_inputs) {
    const int r = v.plan.shape.rank();
    if (v.broadcast && r > 0 && v.plan.strides[0][r - 1] == 0 && n < max_splats) ok[v.input] = 1, ++n;
  }
  if (n == 0) return;
  const auto is = [&](int r) { return r >= 0 && r < nin && ok[r]; };
  for (int k = 0; k < nk; ++k) {
    const FusedInstr& c = p.code[k];
    if (!live[nin + k] || pf.regs[nin + k].scalar_value() || !(is(c.a) || is(c.b))) continue;
    const bool fine = c.b >= 0 && is(c.a) != is(c.b) && !kernels<T>(c.op).batch_dependent &&
                      !pf.regs[is(c.a) ? c.b : c.a].scalar_value();
    if (!fine) {
      if (is(c.a)) ok[c.a] = 0;
      if (is(c.b)) ok[c.b] = 0;
    }
  }
  for (const CopyOut& c : pf.copies)
    if (is(c.reg)) ok[c.reg] = 0;
  if (p.reduction && is(p.reduction->reg)) ok[p.reduction->reg] = 0;
  std::vector<int> index(static_cast<std::size_t>(nin), -1);
  int m = 0;
  for (VectorInput& v : pf.vector_inputs)
    if (ok[v.input]) v.splat = index[v.input] = m++;
  if (m == 0) return;
  std::size_t j = 0;
  for (int k = 0; k < nk; ++k) {
    if (!live[nin + k] || pf.regs[nin + k].scalar_value()) continue;
    Step s = pf.per_tile[j++];
    const FusedInstr& c = p.code[k];
    if (is(c.a)) s = {reinterpret_cast<void (*)()>(kernels<T>(c.op).k[sv]), -2 - index[c.a], s.b, s.y, c.op, sv};
    else if (is(c.b)) s = {reinterpret_cast<void (*)()>(kernels<T>(c.op).k[vs]), s.a, -2 - index[c.b], s.y, c.op, vs};
    pf.per_tile_splat.push_back(s);
  }
}

/// Merges runs of steps into chains (fused_chain.hpp), in per_tile and per_tile_splat alike: a
/// step joins the step before when it reads that step's result, which lives in a scratch slot and
/// which nothing else reads (no other step, no copy, not the reduction), and both ops are
/// chainable over T.
template <class T>
void form_chains(PreparedFused& pf) {
  const FusedProgram& p = pf.program;
  std::vector<int> reads(pf.regs.size(), 0);
  for (const Step& s : pf.per_tile) {
    if (s.a >= 0) ++reads[static_cast<std::size_t>(s.a)];
    if (s.b >= 0) ++reads[static_cast<std::size_t>(s.b)];
  }
  for (const CopyOut& c : pf.copies) reads[static_cast<std::size_t>(c.reg)] += 2;
  if (p.reduction) reads[static_cast<std::size_t>(p.reduction->reg)] += 2;
  const auto first_link = [](const Step& q) -> Chain {
    if (q.b == -1) return {q.a, {{q.op, Link::unary, false, -1}}};
    if (q.mode == sv) return {q.b, {{q.op, Link::second, true, q.a}}};
    return {q.a, {{q.op, Link::first, q.mode == vs, q.b}}};
  };
  const auto next_link = [](const Step& s, int v) -> Link {
    if (s.b == -1) return {s.op, Link::unary, false, -1};
    if (s.a == v) return {s.op, Link::first, s.mode == vs, s.b};
    return {s.op, Link::second, s.mode == sv, s.a};
  };
  const auto chain = [&](std::vector<Step>& steps) {
    std::vector<Step> out;
    for (const Step& s : steps) {
      if (!out.empty() && chainable<T>(s.op)) {
        Step& q = out.back();
        const int v = q.y;
        const bool joins = (q.chain >= 0 ? pf.chains[static_cast<std::size_t>(q.chain)].links.size() < max_links
                                         : chainable<T>(q.op)) &&
                           pf.regs[static_cast<std::size_t>(v)].home == Home::slot &&
                           reads[static_cast<std::size_t>(v)] == 1 && (s.a == v || s.b == v);
        if (joins) {
          if (q.chain < 0) {
            q.chain = static_cast<int>(pf.chains.size());
            pf.chains.push_back(first_link(q));
          }
          pf.chains[static_cast<std::size_t>(q.chain)].links.push_back(next_link(s, v));
          q.y = s.y;
          continue;
        }
      }
      out.push_back(s);
    }
    steps = std::move(out);
  };
  if (fused_chains()) {
    chain(pf.per_tile);
    chain(pf.per_tile_splat);
  }
}

/// Whether a tile is one chain's one pass (fused_chain.hpp) over inputs read in place: its
/// running values stay in registers, so the tile holds no intermediate in L1 and may be long
/// (chain_tile_bytes), which spreads the per-tile work (operand pointers, link codes) over more
/// elements. Not with a broadcast input, which is gathered into a scratch tile of its own.
inline bool one_chain(const PreparedFused& pf) {
  const auto one = [](const std::vector<Step>& v) { return v.size() == 1 && v[0].chain >= 0; };
  for (const VectorInput& v : pf.vector_inputs)
    if (v.broadcast) return false;
  return one(pf.per_tile) && pf.per_tile_splat.empty();
}

template <class T>
std::int64_t grain_of(const FusedProgram& p, const std::vector<char>& live) {
  const int nin = static_cast<int>(p.input_shapes.size());
  // the reduction's pass counts as one more cheap op (a fused mul and max over 1M elements is
  // twice a lone max's work: split as a costlier loop, not kept on the thread a lone max would get)
  // The ops' costs add up (OpKernels::cost: 1 for add, 8 for exp, 64 for a 64-bit mod), down to
  // the heavy grain, the smallest a lone op takes (a program of a few transcendentals splits as
  // the sum of its ops, not as one of them).
  std::int64_t cost = p.reduction ? 1 : 0;
  for (int k = 0; k < static_cast<int>(p.code.size()); ++k)
    if (live[nin + k]) cost += kernels<T>(p.code[k].op).cost;
  return std::max<std::int64_t>(backend::cpu::grain_heavy, backend::cpu::grain_cheap / std::max<std::int64_t>(1, cost));
}

}  // namespace detail_fused

/// Validates p (ValueError "[fused] invalid program: ..." otherwise) and resolves, once, each
/// instruction's kernel, each register's home and each broadcast input's walk.
STAGECRAFT_COMPILED_INLINE PreparedFused prepare(const FusedProgram& p);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE PreparedFused prepare(const FusedProgram& p) {
  namespace f = detail_fused;
  f::validate(p);
  if (p.any_converted())
    f::fail_program("an input converted from another dtype (FusedProgram::input_dtypes) runs in generated GPU kernels only");
  if (p.any_product()) {  // the program over the products formed first (see PreparedFused::products)
    FusedProgram q = p;
    q.products.clear();
    for (std::size_t k = 0; k < q.input_shapes.size(); ++k)
      if (p.operand(k)) q.input_shapes[k] = Shape{};
    PreparedFused pf = prepare(q);
    pf.products = p.products;
    for (std::size_t k = 0; k < p.input_shapes.size(); ++k) pf.passed.push_back(p.arg_shape(k));
    return pf;
  }
  PreparedFused pf;
  pf.program = p;
  pf.numel = p.out_shape.numel();
  pf.tile = f::tile_bytes / static_cast<std::int64_t>(itemsize(p.dtype));
  pf.regs.resize(p.input_shapes.size() + p.code.size());
  const std::vector<char> live = f::live_registers(p);
  if (p.reduction && p.out_shape.numel() > 1 && f::single_valued(p)[p.reduction->reg])
    f::fail_program("the reduced register is one value for the whole run (reduce its input instead)");
  f::place_inputs(pf, live);
  visit_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    f::place_results<T>(pf, live);
    f::place_splats<T>(pf, live);
    pf.grain = f::grain_of<T>(p, live);
    f::form_chains<T>(pf);
    if (pf.num_slots <= f::few_slots) pf.tile = 2 * f::tile_bytes / static_cast<std::int64_t>(sizeof(T));
    if (f::one_chain(pf)) pf.tile = std::max(pf.tile, f::chain_tile_bytes / static_cast<std::int64_t>(sizeof(T)));
    for (const FusedInstr& c : p.code) pf.batch_dependent = pf.batch_dependent || f::kernels<T>(c.op).batch_dependent;
  });
  pf.special = find_special(p);
  for (std::size_t k = 0; k < p.input_shapes.size(); ++k) {
    pf.arg_offsets.push_back(p.arg_offset(k));
    pf.arg_bytes.push_back(p.arg_shape(k).numel() * static_cast<std::int64_t>(itemsize(p.dtype)));
  }
  pf.out_bytes = pf.numel * static_cast<std::int64_t>(itemsize(p.dtype));
  if (p.any_out_window())
    for (std::size_t j = 0; j < p.outputs.size(); ++j) {
      const Shape st[1] = {p.out_strides(j)};
      pf.out_plans.push_back(backend::cpu::collapse_strides<1>(p.out_shape, st));
    }
  return pf;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
