// The evaluator of one fused elementwise group: a register program over one dtype, run tile by
// tile (numexpr's idea) so every intermediate stays in L1, each instruction by its op's own rule.
//
// An instruction runs its op's SIMD rule (`Op::simd`, as the eager kernels do) over a whole tile,
// or its scalar rule where the op has no SIMD rule for the dtype. Kernels come from a table built
// from STAGECRAFT_OP_LIST, so a new elementwise op is fusible without an edit here. Numerics:
// - every element of a vector register goes through the SIMD rule (a tile's last partial batch
//   through one zero-padded batch), as the eager loops do for floating types: results equal the
//   eager op's bit for bit (integer ops: the eager tail uses the scalar rule, which for them
//   gives the same numbers);
// - a value computed from single-element inputs only is computed once per run, by the rule the
//   eager op on one-element tensors uses (a padded batch for floating types).
#pragma once
#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../backend/cpu/blas.hpp"
#include "../backend/cpu/elementwise.hpp"
#include "../backend/cpu/parallel.hpp"
#include "../backend/cpu/reduce.hpp"
#include "../ops/registry.hpp"
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
/// One kernel call per tile (or per run for single-element results): fn(reg a, reg b, reg y).
struct Step {
  void (*fn)() = nullptr;  ///< a Kernel<T> of the program's dtype, cast back before the call
  int a = -1, b = -1, y = -1;
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
  return {reinterpret_cast<void (*)()>(kernels<T>(c.op).k[m]), c.a, c.b, y};
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
    if (is(c.a)) s = {reinterpret_cast<void (*)()>(kernels<T>(c.op).k[sv]), -2 - index[c.a], s.b, s.y};
    else if (is(c.b)) s = {reinterpret_cast<void (*)()>(kernels<T>(c.op).k[vs]), s.a, -2 - index[c.b], s.y};
    pf.per_tile_splat.push_back(s);
  }
}

template <class T>
std::int64_t grain_of(const FusedProgram& p, const std::vector<char>& live) {
  const int nin = static_cast<int>(p.input_shapes.size());
  std::int64_t cost = 0;
  for (int k = 0; k < static_cast<int>(p.code.size()); ++k)
    if (live[nin + k]) cost += kernels<T>(p.code[k].op).cost;
  return std::max<std::int64_t>(backend::cpu::grain_costly, backend::cpu::grain_cheap / std::max<std::int64_t>(1, cost));
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

namespace detail_fused {

/// Per-thread scratch, kept between runs: grows, never shrinks, so steady runs allocate nothing.
struct Scratch {
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { ::operator delete(data, std::align_val_t{64}); }
  std::byte* get(std::size_t want) {
    if (want > bytes) {
      ::operator delete(data, std::align_val_t{64});
      data = nullptr, bytes = 0;
      data = static_cast<std::byte*>(::operator new(want, std::align_val_t{64}));
      std::memset(data, 0, want);  // padding lanes start as zeros, not indeterminate bytes
      bytes = want;
    }
    return data;
  }
};
STAGECRAFT_COMPILED_INLINE Scratch& thread_scratch();

/// Bytes between scratch slots: a tile plus a cache line, so slots are not a multiple of 4 KiB
/// apart (loads from one slot and stores to the next would falsely alias in the L1).
STAGECRAFT_COMPILED_INLINE std::int64_t slot_stride(const PreparedFused& pf);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

STAGECRAFT_COMPILED_INLINE std::int64_t slot_stride(const PreparedFused& pf) {
  return (pf.tile * static_cast<std::int64_t>(itemsize(pf.program.dtype)) + 63) / 64 * 64 + 64;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// A run's register locations, gathers and single values (the calling thread's, reused).
struct RunState {
  std::vector<Loc> locs;
  std::vector<Gather> gathers;
  std::vector<std::byte> values;
  std::vector<std::pair<const std::byte*, bool>> streams;  ///< buffers walked tile by tile (true: written)
  std::vector<std::byte> partials;  ///< a reduction's partial results, one per chunk
  bool rows = false;                ///< some gather has Gather::rows
};
STAGECRAFT_COMPILED_INLINE RunState& run_state();
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE RunState& run_state() {
  thread_local RunState s;
  return s;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// Asks for lines [from, to) of the next tile of every buffer (at byte offset off) while this
/// tile computes, a few lines before each step: a tile reads each buffer in one short burst,
/// which the hardware prefetchers, stopping at every 4 KiB page, do not hide (bench_fusion, 9-op
/// chain over 5 buffers of 16M floats, 1 thread: 43 ms without, 30 ms with). Always inlined: as a
/// function of its own, GCC 12 finds it free of side effects and deletes every call to it.
SC_ALWAYS_INLINE void prefetch(const RunState& st, std::int64_t off, std::int64_t from, std::int64_t to) {
  for (const auto& [base, write] : st.streams) {
    const std::byte* p = base + off;
    if (write)
      for (std::int64_t l = from; l < to; ++l) __builtin_prefetch(p + l * 64, 1, 3);
    else
      for (std::int64_t l = from; l < to; ++l) __builtin_prefetch(p + l * 64, 0, 3);
  }
}

/// Where a register is during a tile: at(r, t0) points at register r's elements of the tile
/// starting at t0 (what run() hands the function it calls after each tile).
template <class T>
struct RegAt {
  const Loc* locs;
  std::byte* ws;
  T* operator()(int r, std::int64_t t0) const {
    const Loc& l = locs[r];
    return reinterpret_cast<T*>((l.ptr ? l.ptr : ws) + l.off + t0 * l.stride);
  }
};

/// A reference to what run() calls after each tile, f(at, t0, len) (a reduction reads its
/// register there), or nothing: one instantiation of the tile loop per dtype serves every
/// caller, at one indirect call per tile. The callable must outlive the run.
template <class T>
class AfterTile {
 public:
  AfterTile() = default;
  template <class F>
    requires std::invocable<const F&, const RegAt<T>&, std::int64_t, std::int64_t>
  AfterTile(const F& f)  // NOLINT: made from the caller's lambda
      : f_(&f), call_([](const void* p, const RegAt<T>& at, std::int64_t t0, std::int64_t len) {
          (*static_cast<const F*>(p))(at, t0, len);
        }) {}
  explicit operator bool() const { return call_ != nullptr; }
  void operator()(const RegAt<T>& at, std::int64_t t0, std::int64_t len) const { call_(f_, at, t0, len); }

 private:
  const void* f_ = nullptr;
  void (*call_)(const void*, const RegAt<T>&, std::int64_t, std::int64_t) = nullptr;
};

/// Runs tiles of a prepared program on this thread: set up once per task (the thread's scratch,
/// its copy of the register locations when some input is read in place by rows), then run(b, e,
/// after_tile) per range of output elements, as often as the task needs (a row at a time).
template <class T>
class TileRun {
 public:
  TileRun(const PreparedFused& pf, const RunState& st)
      : pf_(pf), st_(st), stride_(slot_stride(pf)), nsteps_(static_cast<std::int64_t>(pf.per_tile.size()) + 1) {
    // (one slot more with windowed outputs: a single value spread over a tile before its copy)
    const int slots = std::max(pf.num_slots + (pf.out_plans.empty() ? 0 : 1), 1);
    ws_ = thread_scratch().get(static_cast<std::size_t>(slots * stride_));
    locs_ = st.locs.data();
    if (st.rows) {  // (pointed at each such input's row per tile)
      own_.assign(st.locs.begin(), st.locs.end());
      locs_ = own_.data();
    }
  }

  /// Runs the tiles of output elements [b, e); after each, after_tile(register locations, t0,
  /// len) (a reduction reads its register there).
  void run(std::int64_t b, std::int64_t e, AfterTile<T> after_tile = {});

 private:
  const PreparedFused& pf_;
  const RunState& st_;
  std::int64_t stride_, nsteps_;
  std::byte* ws_ = nullptr;
  std::vector<Loc> own_;
  const Loc* locs_ = nullptr;
};

template <class T>
void TileRun<T>::run(std::int64_t b, std::int64_t e, AfterTile<T> after_tile) {
  const PreparedFused& pf = pf_;
  const std::int64_t tile = pf.tile;
  std::byte* const ws = ws_;
  const Loc* const locs = locs_;
  const RegAt<T> at{locs, ws};
  const T* one[max_splats] = {};  // with per_tile_splat: the value each such input holds in this tile
  for (std::int64_t t0 = b; t0 < e; t0 += tile) {
    const std::int64_t len = std::min(tile, e - t0);
    // lines of each buffer in the next tile, and where that tile starts
    const std::int64_t lines = t0 + tile < e ? (std::min(tile, e - t0 - tile) * std::int64_t{sizeof(T)} + 63) / 64 : 0;
    const std::int64_t off = (t0 + tile) * std::int64_t{sizeof(T)};
    std::int64_t k = 0;
    prefetch(st_, off, 0, lines / nsteps_);
    bool splat = !pf.per_tile_splat.empty();
    for (const Gather& g : st_.gathers)
      if (splat && g.splat >= 0)
        splat = (one[g.splat] = constant_run<T>(reinterpret_cast<const T*>(g.src), *g.plan, t0, len)) != nullptr;
    for (const Gather& g : st_.gathers) {
      if (splat && g.splat >= 0) continue;
      T* dst = reinterpret_cast<T*>(ws + g.off);
      const T* src = reinterpret_cast<const T*>(g.src);
      if (g.rows) {  // (in place when the tile lies in one row, else gathered into its slot)
        const T* row = contiguous_run<T>(src, *g.plan, t0, len);
        own_[static_cast<std::size_t>(g.reg)] = {reinterpret_cast<std::byte*>(const_cast<T*>(row)), row ? 0 : g.off, 0};
        if (row) continue;
      }
      if (g.plan) copy_walk<false, T>(src, *g.plan, t0, len, dst);
      else std::memcpy(dst, src + t0, static_cast<std::size_t>(len) * sizeof(T));
    }
    for (const Step& s : splat ? pf.per_tile_splat : pf.per_tile) {
      ++k;
      prefetch(st_, off, lines * k / nsteps_, lines * (k + 1) / nsteps_);
      const T* a = s.a >= 0 ? at(s.a, t0) : one[-2 - s.a];
      const T* bv = s.b >= 0 ? at(s.b, t0) : (s.b == -1 ? nullptr : one[-2 - s.b]);
      reinterpret_cast<Kernel<T>>(s.fn)(a, bv, at(s.y, t0), len);
    }
    for (const CopyOut& c : pf.copies) {
      const T* src = at(c.reg, t0);
      T* base = reinterpret_cast<T*>(locs[pf.regs.size() + c.output].ptr);
      if (!pf.out_plans.empty() && pf.program.out_windowed(static_cast<std::size_t>(c.output))) {
        if (pf.regs[c.reg].scalar_value()) {  // (one value: a tile of it first)
          T* tmp = reinterpret_cast<T*>(ws + pf.num_slots * stride_);
          std::fill_n(tmp, len, *src);
          src = tmp;
        }
        copy_walk<true, T>(base, pf.out_plans[static_cast<std::size_t>(c.output)], t0, len, src);
      } else if (pf.regs[c.reg].scalar_value()) {
        std::fill_n(base + t0, len, *src);
      } else {
        std::memcpy(base + t0, src, static_cast<std::size_t>(len) * sizeof(T));
      }
    }
    if (after_tile) after_tile(at, t0, len);
  }
}

/// Runs the tiles of output elements [b, e) on this thread (TileRun::run, set up for one range).
template <class T>
void run_tiles(const PreparedFused& pf, const RunState& st, std::int64_t b, std::int64_t e, AfterTile<T> after_tile = {}) {
  TileRun<T>(pf, st).run(b, e, after_tile);
}

/// Register `reg` over the whole program in flat tiles (as the eager op's flat loop batches its
/// elements), into a buffer: the reductions' path for programs whose SIMD bits depend on the batch.
template <class T>
std::vector<T> flat_values(const PreparedFused& pf, const RunState& st, int reg) {
  std::vector<T> flat(static_cast<std::size_t>(pf.numel));
  backend::cpu::parallel_for(pf.numel, pf.grain, [&](std::int64_t b, std::int64_t e) {
    run_tiles<T>(pf, st, b, e, [&](const auto& at, std::int64_t t0, std::int64_t len) {
      std::copy_n(at(reg, t0), len, flat.data() + t0);
    });
  });
  return flat;
}

/// Elements one reduction task covers (a whole number of tiles, from the shape only, so results
/// do not depend on the thread count).
inline constexpr std::int64_t reduce_chunk_tiles = 32;

template <class Rd, class T>
void run_reduction(const PreparedFused& pf, RunState& st, T* out) {
  const FusedReduction& rd = *pf.program.reduction;
  if (pf.batch_dependent && rd.inner % static_cast<std::int64_t>(batch<T>::size) != 0) {
    // Rows that do not start on a batch boundary would batch other elements together than the
    // eager op's flat loop, which changes the bits of sin and cos: the program runs over the whole
    // output in flat tiles (into a buffer), then each row is reduced.
    const std::vector<T> flat = flat_values<T>(pf, st, rd.reg);
    for (std::int64_t row = 0; row < pf.numel / rd.inner; ++row)
      out[row] = backend::cpu::reduce_row<Rd, T, T>(flat.data() + row * rd.inner, rd.inner);
    return;
  }
  const std::int64_t rows = pf.numel / rd.inner, chunk = pf.tile * reduce_chunk_tiles;
  const std::int64_t per_row = (rd.inner + chunk - 1) / chunk, tasks = rows * per_row;
  st.partials.resize(static_cast<std::size_t>(tasks) * sizeof(T));
  T* part = reinterpret_cast<T*>(st.partials.data());
  backend::cpu::parallel_rows(tasks, std::min(chunk, rd.inner), pf.grain, [&](std::int64_t tb, std::int64_t te) {
    TileRun<T> tiles(pf, st);
    for (std::int64_t t = tb; t < te; ++t) {
      const std::int64_t row = t / per_row, c = t % per_row;
      const std::int64_t b = row * rd.inner + c * chunk, e = std::min(b + chunk, (row + 1) * rd.inner);
      bool first = true;
      T acc = T(0);
      tiles.run(b, e, [&](const auto& at, std::int64_t t0, std::int64_t len) {
        const T v = backend::cpu::reduce_row<Rd, T, T>(at(rd.reg, t0), len);
        acc = first ? v : Rd::combine(acc, v);
        first = false;
      });
      part[t] = acc;
    }
  });
  for (std::int64_t row = 0; row < rows; ++row) {
    T acc = part[row * per_row];
    for (std::int64_t c = 1; c < per_row; ++c) acc = Rd::combine(acc, part[row * per_row + c]);
    out[row] = acc;
  }
}

/// Columns one task of a column reduction covers at most (a multiple of every batch size; from the
/// shape only, as the row chunks, so results do not depend on the thread count).
inline constexpr std::int64_t column_group = 2048;

/// A reduction over the program's leading axes (FusedReduction::leading): out[c] = reduction over
/// the rows r of reg[r * C + c]. Tasks take a chunk of rows and a group of columns, evaluate the
/// program over those elements (whole rows at once when a group is every column) and accumulate
/// each tile into the chunk's row of partial results as the backend's column reduction does (the
/// same chunks, a sum's rows pairwise in blocks of col_block, the first row copied), and the
/// chunks' partial rows are reduced by that kernel: every column adds in the eager sum's order,
/// so the results are its bits. Every element of the program is evaluated once, so its
/// elementwise outputs are written as by run_tiles over the whole range.
template <class Rd, class T>
void run_columns(const PreparedFused& pf, RunState& st, T* out) {
  namespace cpu = backend::cpu;
  const FusedReduction& rd = *pf.program.reduction;
  const std::int64_t C = rd.inner, R = pf.numel / C;
  const std::int64_t cw = std::min(C, column_group), groups = (C + cw - 1) / cw;
  if (pf.batch_dependent && C % static_cast<std::int64_t>(batch<T>::size) != 0) {
    // Rows that do not start on a batch boundary would batch other elements together than the
    // eager op's flat loop (sin and cos): flat tiles into a buffer, then the column reduction.
    const std::vector<T> flat = flat_values<T>(pf, st, rd.reg);
    cpu::reduce3<Rd, T, T>(flat.data(), out, 1, R, C);
    return;
  }
  // The chunks of rows the backend's column reduction (reduce3) cuts [R, C] into, so that every
  // column adds in its order: the eager sum's bits.
  const std::int64_t per = cpu::chunk_rows(1, R, C), chunks = (R + per - 1) / per;
  // (out is written last: the plan may give it the buffer of an input that the tiles read)
  st.partials.resize(static_cast<std::size_t>(chunks * C) * sizeof(T));
  T* part = reinterpret_cast<T*>(st.partials.data());
  int levels = 1;  // scratch rows the pairwise split needs (one per level; a few spare)
  for (std::int64_t n = per; n > 0; n /= 2) ++levels;
  cpu::parallel_rows(chunks * groups, per * cw, pf.grain, [&](std::int64_t tb, std::int64_t te) {
    thread_local std::vector<T> scratch;
    if (scratch.size() < static_cast<std::size_t>(levels * cw)) scratch.resize(static_cast<std::size_t>(levels * cw));
    TileRun<T> tiles(pf, st);
    for (std::int64_t t = tb; t < te; ++t) {
      const std::int64_t c = t / groups, c0 = (t % groups) * cw, len = std::min(cw, C - c0);
      // acc[0, len) = the reduction of rows [r0, r1) (r1 - r0 <= col_block, or any for max, min)
      const auto leaf = [&](std::int64_t r0, std::int64_t r1, T* acc) {
        const auto take = [&](std::int64_t row, std::int64_t col, const T* v, std::int64_t n) {
          if (row == r0) std::copy_n(v, n, acc + col);
          else cpu::accumulate_row<Rd, T, T>(acc + col, v, n);
        };
        if (len == C) {  // whole rows: one pass over them
          tiles.run(r0 * C, r1 * C, [&](const auto& at, std::int64_t t0, std::int64_t n) {
            const T* v = at(rd.reg, t0);
            for (std::int64_t i = t0, e = t0 + n; i < e;) {
              const std::int64_t row = i / C, col = i - row * C, k = std::min(e - i, C - col);
              take(row, col, v + (i - t0), k);
              i += k;
            }
          });
          return;
        }
        for (std::int64_t row = r0; row < r1; ++row) {
          const std::int64_t b = row * C + c0;
          tiles.run(b, b + len, [&](const auto& at, std::int64_t t0, std::int64_t n) {
            take(row, t0 - b, at(rd.reg, t0), n);
          });
        }
      };
      const auto rows = [&](const auto& self, std::int64_t r0, std::int64_t r1, T* acc, int level) -> void {
        if constexpr (Rd::is_sum) {
          if (r1 - r0 > cpu::col_block) {
            const std::int64_t h = (r1 - r0) / 2;
            self(self, r0, r0 + h, acc, level + 1);
            T* tmp = scratch.data() + level * cw;
            self(self, r0 + h, r1, tmp, level + 1);
            cpu::accumulate_row<Rd, T, T>(acc, tmp, len);
            return;
          }
        }
        leaf(r0, r1, acc);
      };
      rows(rows, c * per, std::min(R, (c + 1) * per), part + c * C + c0, 0);
    }
  });
  if (chunks > 1) cpu::reduce3<Rd, T, T>(part, out, 1, chunks, C, false);
  else std::copy_n(part, C, out);
}

STAGECRAFT_COMPILED_INLINE bool overlaps(const Tensor& a, const Tensor& b);

/// Throws, naming the tensor, unless t is a concrete tensor on `dev` of dtype `dt` and shape
/// `want` (the CPU evaluator's and the generated GPU kernels' argument check).
STAGECRAFT_COMPILED_INLINE void check_tensor(const Tensor& t, DType dt, Device dev, const Shape& want, const char* what,
                                             std::size_t i);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE bool overlaps(const Tensor& a, const Tensor& b) {
  const auto* pa = static_cast<const std::byte*>(a.raw_data());
  const auto* pb = static_cast<const std::byte*>(b.raw_data());
  return pa && pb && pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

STAGECRAFT_COMPILED_INLINE void check_tensor(const Tensor& t, DType dt, Device dev, const Shape& want, const char* what,
                                             std::size_t i) {
  const bool concrete = t.defined() && !t.is_symbolic();
  if (SC_LIKELY(concrete && t.device() == dev && t.dtype() == dt && t.shape() == want)) return;
  const std::string at = std::string("[fused] ") + what + " " + std::to_string(i);
  if (!concrete) throw ValueError(at + " must be a concrete tensor");
  if (t.device() != dev) throw DeviceError(at + " is on " + t.device().str() + ", the program runs on " + dev.str());
  if (t.dtype() != dt)
    throw DTypeError(at + " has dtype " + std::string(name(t.dtype())) + ", the program runs over " +
                     std::string(name(dt)));
  throw ShapeError(at + " has shape " + t.shape().str() + ", the program expects " + want.str());
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// Fills st for this run: single values computed, every register's location, the gathers.
template <class T>
void bind(const PreparedFused& pf, std::span<const Tensor> in, std::span<Tensor> out, RunState& st) {
  st.values.resize(static_cast<std::size_t>(std::max(pf.num_scalars, 1)) * sizeof(T));
  T* values = reinterpret_cast<T*>(st.values.data());
  const FusedProgram& p = pf.program;
  st.locs.assign(pf.regs.size() + p.outputs.size(), Loc{});
  for (std::size_t r = 0; r < pf.regs.size(); ++r) {
    const Reg& g = pf.regs[r];
    Loc& l = st.locs[r];
    if (g.home == Home::scalar) l = {reinterpret_cast<std::byte*>(values + g.index), 0, 0};
    else if (g.home == Home::input) l = {static_cast<std::byte*>(in[g.index].raw_data()), 0, sizeof(T)};
    else if (g.home == Home::output) l = {static_cast<std::byte*>(out[p.out_arg(g.index)].raw_data()), 0, sizeof(T)};
    else l = {nullptr, g.slot * slot_stride(pf), 0};
  }
  for (std::size_t j = 0; j < p.outputs.size(); ++j)  // (a window's first element)
    st.locs[pf.regs.size() + j] = {static_cast<std::byte*>(out[p.out_arg(j)].raw_data()) + p.out_offset(j) * std::int64_t{sizeof(T)},
                                   0, sizeof(T)};
  for (int i : pf.scalar_inputs)
    values[pf.regs[i].index] = static_cast<const T*>(in[i].raw_data())[pf.arg_offsets[static_cast<std::size_t>(i)]];
  for (const Step& s : pf.once)
    reinterpret_cast<Kernel<T>>(s.fn)(values + pf.regs[s.a].index, s.b >= 0 ? values + pf.regs[s.b].index : nullptr,
                                      values + pf.regs[s.y].index, 1);
  st.gathers.clear();
  st.streams.clear();
  st.rows = false;
  // (an output tensor written through windows is not walked tile by tile: not prefetched)
  for (std::size_t t = 0; t < out.size(); ++t)
    if (p.out_arg_shape(t) == p.out_shape) st.streams.emplace_back(static_cast<const std::byte*>(out[t].raw_data()), true);
  for (const VectorInput& v : pf.vector_inputs) {
    // shares bytes with an output (the sizes are the program's: run() checked the shapes)
    const auto* lo = static_cast<const std::byte*>(in[v.input].raw_data());
    const std::byte* hi = lo + pf.arg_bytes[static_cast<std::size_t>(v.input)];
    bool aliased = false, windowed = false;
    for (std::size_t t = 0; t < out.size(); ++t) {
      const auto* o = static_cast<const std::byte*>(out[t].raw_data());
      const bool meets = o && lo && lo < o + out[t].nbytes() && o < hi;
      aliased = aliased || meets;
      windowed = windowed || (meets && p.out_arg_shape(t) != p.out_shape);
    }
    if (windowed)
      throw ValueError("[fused] input " + std::to_string(v.input) + " shares memory with an output tensor written "
                       "through windows; it may not");
    if (v.broadcast && aliased)
      throw ValueError("[fused] input " + std::to_string(v.input) + " is broadcast and shares memory with an output; "
                       "only an input of the output's shape may");
    if (!v.broadcast) st.streams.emplace_back(static_cast<const std::byte*>(in[v.input].raw_data()), false);
    if (!v.broadcast && !aliased) continue;  // read in place
    const std::int64_t off = pf.regs[v.input].slot * slot_stride(pf);
    const std::int64_t first = pf.arg_offsets[static_cast<std::size_t>(v.input)] * std::int64_t{sizeof(T)};
    const int r = v.plan.shape.rank();
    const bool rows = v.broadcast && (r == 0 || v.plan.strides[0][r - 1] == 1);
    st.gathers.push_back({static_cast<const std::byte*>(in[v.input].raw_data()) + first, v.broadcast ? &v.plan : nullptr, off,
                          v.splat, v.input, rows});
    st.rows = st.rows || rows;
    st.locs[v.input] = {nullptr, off, 0};
  }
}

}  // namespace detail_fused

/// Runs a prepared program (see run_fused); the tensors are checked, nothing is looked up.
STAGECRAFT_COMPILED_INLINE void run(const PreparedFused& pf, std::span<const Tensor> inputs, std::span<Tensor> outputs);

/// Runs p: inputs are concrete CPU tensors of dtype p.dtype and shapes p.input_shapes (contiguous,
/// row-major); outputs are preallocated with p.out_shape and p.dtype, then (with a reduction) one
/// of the reduction's out_shape. An output may share its buffer
/// with an input of the same shape (in-place), so read each tile of the inputs before writing it.
/// Runs on all threads (backend::cpu::parallel_for) for large outputs, one thread for small ones.
STAGECRAFT_COMPILED_INLINE void run_fused(const FusedProgram& p, std::span<const Tensor> inputs,
                                          std::span<Tensor> outputs);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE void run(const PreparedFused& pf, std::span<const Tensor> inputs,
                                    std::span<Tensor> outputs) {
  namespace f = detail_fused;
  const FusedProgram& p = pf.program;
  const std::size_t nout = p.num_out_args() + (p.reduction ? 1 : 0);
  if (SC_UNLIKELY(inputs.size() != p.input_shapes.size() || outputs.size() != nout))
    throw ValueError("[fused] the program takes " + std::to_string(p.input_shapes.size()) + " inputs and " +
                     std::to_string(nout) + " outputs, got " + std::to_string(inputs.size()) + " and " +
                     std::to_string(outputs.size()));
  const Device cpu = Device::cpu();
  std::vector<Tensor> formed;  // with products: each product formed (as the eager matmul forms it), each operand one unread element
  if (!pf.products.empty()) {
    formed.assign(inputs.begin(), inputs.end());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      f::check_tensor(inputs[i], p.dtype, cpu, pf.passed[i], "input", i);
      const FusedProduct& q = pf.products[i];
      if (q.operand) {
        formed[i] = stagecraft::detail::empty_tensor(Shape{}, p.dtype, cpu, "fused");
        std::memset(const_cast<void*>(formed[i].raw_data()), 0, itemsize(p.dtype));
      }
      if (!q.on()) continue;
      const Shape& value = p.source_shape(i);
      formed[i] = stagecraft::detail::empty_tensor(value, p.dtype, cpu, "fused");
      visit_dtype(p.dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (std::is_floating_point_v<T>)
          backend::cpu::matmul_2d<T>(value[0], value[1], q.k(), static_cast<const T*>(inputs[i].raw_data()),
                                     static_cast<const T*>(inputs[static_cast<std::size_t>(q.b)].raw_data()),
                                     static_cast<T*>(formed[i].raw_data()), q.ta, q.tb);
      });
    }
    inputs = formed;
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) f::check_tensor(inputs[i], p.dtype, cpu, p.arg_shape(i), "input", i);
  for (std::size_t t = 0; t < nout - (p.reduction ? 1 : 0); ++t) f::check_tensor(outputs[t], p.dtype, cpu, p.out_arg_shape(t), "output", t);
  if (p.reduction) f::check_tensor(outputs[nout - 1], p.dtype, cpu, p.reduction->out_shape, "output", nout - 1);
  if (SC_UNLIKELY(pf.tile < 1)) throw ValueError("[fused] the tile must hold at least one element");
  if (pf.numel == 0) return;
  if (pf.special) {
    pf.special->run(inputs, outputs);
    return;
  }
  const std::span<Tensor> elementwise = outputs.first(p.num_out_args());
  visit_dtype(p.dtype, [&](auto tag) {  // (over bool no op is fusible: outputs are copied inputs)
    using T = typename decltype(tag)::type;
    f::RunState& st = f::run_state();
    f::bind<T>(pf, inputs, elementwise, st);
    if (!p.reduction) {
      backend::cpu::parallel_for(pf.numel, pf.grain, [&](std::int64_t b, std::int64_t e) {
        f::run_tiles<T>(pf, st, b, e);
      });
      return;
    }
    if constexpr (std::is_floating_point_v<T>) {
      T* out = static_cast<T*>(outputs[nout - 1].raw_data());
      if (p.reduction->leading) {
        switch (p.reduction->op) {
          case ops::OpId::Max: f::run_columns<backend::cpu::MaxReducer, T>(pf, st, out); break;
          case ops::OpId::Min: f::run_columns<backend::cpu::MinReducer, T>(pf, st, out); break;
          default: f::run_columns<backend::cpu::SumReducer, T>(pf, st, out); break;
        }
        return;
      }
      switch (p.reduction->op) {
        case ops::OpId::Max: f::run_reduction<backend::cpu::MaxReducer, T>(pf, st, out); break;
        case ops::OpId::Min: f::run_reduction<backend::cpu::MinReducer, T>(pf, st, out); break;
        default: f::run_reduction<backend::cpu::SumReducer, T>(pf, st, out); break;
      }
    }
  });
}

STAGECRAFT_COMPILED_INLINE void run_fused(const FusedProgram& p, std::span<const Tensor> inputs,
                                          std::span<Tensor> outputs) {
  run(prepare(p), inputs, outputs);
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
