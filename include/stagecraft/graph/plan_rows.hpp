// Row chains (a part of plan.hpp): consecutive CPU steps that each work row by row over the same
// rows (elementwise ops and groups over [..., C], sums, maxima and minima over the last axis) run
// together, a block of rows at a time, every step of the chain on one block before the next block:
// what a step writes for a block is still in the cache when the next step reads it. layer_norm's
// traced plan (a sum, the mean, the variance's group, the deviation, the normalisation) then reads
// its input from memory once instead of three times, softmax's twice instead of three times.
// A reduction over the leading axes (one result per column: a bias's or gamma's gradient, kernel
// or fused) joins a chain too: its rows are added as the block passes, so layer_norm's backward
// reads x and its output gradient once instead of three times. A chain with such a step runs by
// the column reduction's chunks of rows, one thread each, so every column adds in the same order.
//
// Each step computes the same bits as when it runs alone (a reduction's rows are combined in the
// same order, elementwise ops are exact or run through the same tiles); a chain whose buffers the
// memory plan shares in a way that is not row by row (a value of one row width reusing another's
// buffer) runs step by step instead, as does any chain of a plan captured as a CUDA graph.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "../backend/cpu/parallel.hpp"
#include "../backend/cpu/reduce.hpp"
#include "../backend/cpu/reduce_stream.hpp"
#include "fused_kernel.hpp"
#include "ir.hpp"
#include "plan_steps.hpp"

namespace stagecraft::graph {

/// Whether CPU plans run row chains (plan_rows.hpp): on by default; off for comparisons.
STAGECRAFT_COMPILED_INLINE bool& row_chains();
/// Elements of its widest value a chain's block of rows holds (at least one row); adjustable for
/// experiments, read when a plan is made.
STAGECRAFT_COMPILED_INLINE std::int64_t& row_chain_block_elements();
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE bool& row_chains() {
  static bool on = true;
  return on;
}
STAGECRAFT_COMPILED_INLINE std::int64_t& row_chain_block_elements() {
  static std::int64_t n = 16384;
  return n;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

namespace detail_plan {

/// One step of a row chain: a fused group (or a kernel's elementwise op, as a program of one
/// instruction) run over the elements of a block of rows, or a kernel's reduction over the last
/// axis (fused null: `reduce` is OpId::Sum, Max or Min) reduced row by row.
struct RowUnit {
  std::size_t step = 0;
  std::shared_ptr<const PreparedFused> fused;
  ops::OpId reduce = ops::OpId::Sum;
  std::int64_t width = 0;  ///< elements per row of the shape the step works over
  int in = -1, out = -1;   ///< a kernel's input (reductions) and output values
  bool columns = false;    ///< a reduction over the leading axes (one result per column), not the last
};

/// Where a column reduction adds a chunk's rows (relative to its first), in order: rows
/// [r0, r1) into `buf` (-1: the chunk's row of partial results; k >= 0: scratch row k), the first
/// copied, then after the last, each (dst, src) of `merges` adds row src into row dst. As the
/// backend's reduce_cols and the fused run_columns add them: a sum's rows halved down to blocks
/// of col_block, a right half's result added to its left's; a maximum's or minimum's one block.
struct ColumnLeaf {
  std::int64_t r0 = 0, r1 = 0;
  int buf = -1;
  std::vector<std::pair<int, int>> merges;
};

/// Steps first..last (consecutive) run block by block: `rows` rows, `block` of them at a time.
struct RowChain {
  std::size_t first = 0, last = 0;
  std::int64_t rows = 0, block = 0;
  std::int64_t width = 0;  ///< elements per row of the widest step
  DType dtype = DType::f32;
  Shape lead;  ///< the axes before the last of the shape every step works over
  std::vector<RowUnit> units;
  /// With column units: the rows of each chunk of the column reductions' cut (0 without), and
  /// the order each adds the rows of a whole chunk and of the last (shorter) one in.
  std::int64_t chunk = 0;
  std::vector<ColumnLeaf> leaves, last_leaves;
  int levels = 0;  ///< scratch rows those orders use
};

/// Elements of the largest step below which no chain is made (its set-up would cost more than
/// the passes it saves).
inline constexpr std::int64_t row_chain_min_elements = std::int64_t{1} << 15;
/// The fewest chunks a column reduction may cut its rows into to join a chain (which then runs
/// chunk by chunk, a thread each: fewer would leave threads idle).
inline constexpr std::int64_t min_column_chunks = 16;

/// The row chains of a CPU plan's steps (none when row_chains() is off).
STAGECRAFT_COMPILED_INLINE std::vector<RowChain> find_row_chains(const Graph& g, const std::vector<Step>& steps);

/// Runs chain c over the plan's values (each step's inputs `ins`, a fused step's outputs `outs`,
/// every value `vals`, outputs already given storage). Returns false, having run nothing, when
/// the buffers overlap in a way that is not row by row: the caller then runs the steps in turn.
STAGECRAFT_COMPILED_INLINE bool run_row_chain(const RowChain& c, const std::vector<std::vector<Tensor>>& ins,
                                              const std::vector<std::vector<Tensor>>& outs, const std::vector<Tensor>& vals);

/// Elements per row of a tensor of shape s in a chain over `lead`: s's last extent when s is
/// lead plus one axis, 1 when s is lead itself, -1 otherwise (not laid out row by row).
inline std::int64_t row_width(const Shape& s, const Shape& lead) {
  const int r = lead.rank();
  if (s.rank() == r) return s == lead ? 1 : -1;
  if (s.rank() != r + 1) return -1;
  for (int d = 0; d < r; ++d)
    if (s[d] != lead[d]) return -1;
  return s[r];
}

#if STAGECRAFT_DEFINE_COMPILED
namespace detail_rows {

/// Elementwise ops a kernel step may run as an instruction in a chain: correctly rounded, so the
/// bits do not depend on how the elements are batched.
inline bool exact_op(ops::OpId id) {
  using ops::OpId;
  switch (id) {
    case OpId::Add: case OpId::Sub: case OpId::Mul: case OpId::Div: case OpId::Neg: case OpId::Abs:
    case OpId::Sqrt: case OpId::Square: case OpId::Relu: case OpId::Maximum: case OpId::Minimum:
    case OpId::Floor: case OpId::Ceil: case OpId::Round: case OpId::FloorDiv: case OpId::Mod: return true;
    default: return false;
  }
}

inline Shape lead_of(const Shape& s) {
  Shape l;
  for (int d = 0; d + 1 < s.rank(); ++d) l.push_back(s[d]);
  return l;
}

/// Whether reduction node n (of a rank-`rank` input) reduces exactly the axes before the last.
inline bool reduces_leading(const Node& n, int rank) {
  std::vector<char> on(static_cast<std::size_t>(rank), 0);
  if (n.attrs.ints.rank() == 0) return false;  // (every axis)
  for (int i = 0; i < n.attrs.ints.rank(); ++i) {
    const std::int64_t a = n.attrs.ints[i] < 0 ? n.attrs.ints[i] + rank : n.attrs.ints[i];
    if (a < 0 || a >= rank) return false;
    on[static_cast<std::size_t>(a)] = 1;
  }
  for (int a = 0; a < rank; ++a)
    if (on[static_cast<std::size_t>(a)] != (a + 1 < rank)) return false;
  return true;
}

/// Appends the order a column reduction adds rows [r0, r1) of a chunk in into `buf` (ColumnLeaf;
/// `level`: the scratch row a right half at this depth goes to).
inline void column_leaves(std::int64_t r0, std::int64_t r1, int buf, int level, bool sum, std::vector<ColumnLeaf>& out,
                          int& levels) {
  levels = std::max(levels, level + 1);
  if (sum && r1 - r0 > backend::cpu::col_block) {
    const std::int64_t h = (r1 - r0) / 2;
    column_leaves(r0, r0 + h, buf, level + 1, sum, out, levels);
    column_leaves(r0 + h, r1, level, level + 1, sum, out, levels);
    out.back().merges.emplace_back(buf, level);
    return;
  }
  out.push_back({r0, r1, buf, {}});
}

/// Step s as a chain unit (and the shape it works over), or nothing.
inline std::optional<std::pair<RowUnit, Shape>> unit_of(const Graph& g, const Step& s, std::size_t i) {
  if (s.gpu) return std::nullopt;
  RowUnit u;
  u.step = i;
  if (s.kind == StepKind::fused) {
    if (!s.fused || s.head_fns || s.fused->special || s.fused->batch_dependent || !s.fused->products.empty()) return std::nullopt;
    const FusedProgram& p = s.fused->program;
    if (p.any_window() || p.any_out_window() || p.any_converted() || p.out_shape.rank() < 2) return std::nullopt;
    if (p.dtype != DType::f32 && p.dtype != DType::f64) return std::nullopt;
    if (p.reduction && p.reduction->inner != p.out_shape[p.out_shape.rank() - 1]) return std::nullopt;
    u.columns = p.reduction && p.reduction->leading;
    if (u.columns && p.reduction->inner < 2) return std::nullopt;  // (one column: the row kernel's order)
    if (p.reduction && !u.columns) {  // (rows the eager kernel cuts into chunks: run alone, as it does)
      const std::int64_t n = p.reduction->inner;
      if (n > 0 && backend::cpu::chunk_rows(p.out_shape.numel() / n, n, 1) < n) return std::nullopt;
    }
    u.fused = s.fused;
    u.width = p.out_shape[p.out_shape.rank() - 1];
    return std::pair{u, p.out_shape};
  }
  if (s.kind != StepKind::kernel || !s.rest.empty() || s.bgrad_fns || s.xent_both || s.out.size() != 1) return std::nullopt;
  const Node& n = g.nodes[s.node];
  const Value& y = g.values[s.out[0]];
  if (y.dtype != DType::f32 && y.dtype != DType::f64) return std::nullopt;
  for (int v : s.in)
    if (g.values[v].dtype != y.dtype || !g.values[v].device.is_cpu()) return std::nullopt;
  u.out = s.out[0];
  if (n.op == ops::OpId::Sum || n.op == ops::OpId::Max || n.op == ops::OpId::Min) {
    if (s.in.size() != 1) return std::nullopt;
    const Shape& x = g.values[s.in[0]].shape;
    if (x.rank() < 2 || x.numel() == 0) return std::nullopt;
    const Shape lead = lead_of(x);
    u.columns = reduces_leading(n, x.rank());  // every axis but the last: one result per column
    if (u.columns ? x[x.rank() - 1] < 2 : row_width(y.shape, lead) != 1) return std::nullopt;  // else the last only
    // (the eager kernel cuts long rows into chunks when there are few of them: other bits)
    if (!u.columns && x.numel() >= backend::cpu::grain_cheap && lead.numel() < backend::cpu::split_target / 4)
      return std::nullopt;
    u.reduce = n.op;
    u.in = s.in[0];
    u.width = x[x.rank() - 1];
    return std::pair{u, x};
  }
  if (!exact_op(n.op) || y.shape.rank() < 2 || s.in.empty() || s.in.size() > 2) return std::nullopt;
  FusedProgram p;
  p.dtype = y.dtype;
  p.out_shape = y.shape;
  for (int v : s.in) p.input_shapes.push_back(g.values[v].shape);
  const int k = static_cast<int>(s.in.size());
  p.code.push_back({n.op, 0, k == 2 ? 1 : -1});
  p.outputs.push_back(k);
  auto pf = std::make_shared<PreparedFused>(prepare(p));
  if (pf->special || pf->batch_dependent) return std::nullopt;
  u.fused = std::move(pf);
  u.width = y.shape[y.shape.rank() - 1];
  return std::pair{u, y.shape};
}

/// Reduces rows [r0, r1) of a fused program with a reduction into out, each row as
/// detail_fused::run_reduction reduces a row it does not cut (unit_of takes no program it cuts).
template <class Rd, class T>
void reduce_rows(const PreparedFused& pf, const detail_fused::RunState& st, std::int64_t r0, std::int64_t r1, T* out) {
  const std::int64_t n = pf.program.reduction->inner;
  detail_fused::TileRun<T> tiles(pf, st);
  for (std::int64_t row = r0; row < r1; ++row) out[row] = detail_fused::reduce_span<Rd, T>(pf, tiles, row * n, n);
}

/// Rows [r0, r1) of a reduction unit (a kernel's, or a fused program's) by reducer Rd.
template <class Rd, class T>
void reduce_unit(const RowUnit& u, const detail_fused::RunState& st, const std::vector<std::vector<Tensor>>& outs,
                 const std::vector<Tensor>& vals, std::int64_t r0, std::int64_t r1) {
  if (u.fused) {
    reduce_rows<Rd, T>(*u.fused, st, r0, r1, static_cast<T*>(outs[u.step].back().raw_data()));
    return;
  }
  const T* x = static_cast<const T*>(vals[static_cast<std::size_t>(u.in)].raw_data());
  T* y = static_cast<T*>(vals[static_cast<std::size_t>(u.out)].raw_data());
  for (std::int64_t row = r0; row < r1; ++row) y[row] = backend::cpu::reduce_row<Rd, T, T>(x + row * u.width, u.width);
}

/// Where a column unit adds the rows of one chunk [first, end): its leaves (null: one block, a
/// maximum's or minimum's), the chunk's row of partial results, the thread's scratch rows.
template <class T>
struct ColumnSink {
  const std::vector<ColumnLeaf>* leaves;
  T* part;
  T* scratch;
  std::int64_t width, first;
  T* row(int buf) const { return buf < 0 ? part : scratch + buf * width; }
  /// Takes elements [col, col + n) of row `r` (rows and each row's elements in order); `at`:
  /// the leaf being filled.
  template <class Rd>
  void take(std::int64_t r, std::int64_t col, const T* v, std::int64_t n, std::size_t& at) const {
    if (leaves == nullptr) {
      if (r == first) std::copy_n(v, n, part + col);
      else backend::cpu::accumulate_row<Rd, T, T>(part + col, v, n);
      return;
    }
    const std::int64_t i = r - first;
    while ((*leaves)[at].r1 <= i) ++at;
    const ColumnLeaf& l = (*leaves)[at];
    T* acc = row(l.buf);
    if (i == l.r0) std::copy_n(v, n, acc + col);
    else backend::cpu::accumulate_row<Rd, T, T>(acc + col, v, n);
    if (i + 1 == l.r1 && col + n == width)
      for (const auto& [dst, src] : l.merges) backend::cpu::accumulate_row<Rd, T, T>(row(dst), row(src), width);
  }
};

/// Rows [r0, r1) of a column unit (a kernel's reduction of its input, or a fused program's of
/// its reduction register) added into `sink`.
template <class Rd, class T>
void column_unit(const RowUnit& u, const detail_fused::RunState& st, const std::vector<Tensor>& vals, std::int64_t r0,
                 std::int64_t r1, const ColumnSink<T>& sink, std::size_t& at) {
  const std::int64_t C = u.width;
  if (!u.fused) {
    const T* x = static_cast<const T*>(vals[static_cast<std::size_t>(u.in)].raw_data());
    for (std::int64_t row = r0; row < r1; ++row) sink.template take<Rd>(row, 0, x + row * C, C, at);
    return;
  }
  const int reg = u.fused->program.reduction->reg;
  detail_fused::run_tiles<T>(*u.fused, st, r0 * C, r1 * C, [&](const auto& reg_at, std::int64_t t0, std::int64_t n) {
    const T* v = reg_at(reg, t0);
    for (std::int64_t i = t0, e = t0 + n; i < e;) {
      const std::int64_t row = i / C, col = i - row * C, k = std::min(e - i, C - col);
      sink.template take<Rd>(row, col, v + (i - t0), k, at);
      i += k;
    }
  });
}

/// A tensor a chain touches: its bytes, and how its rows lie (width -1: not row by row).
struct Span {
  const std::byte* lo;
  const std::byte* hi;
  std::int64_t width;
  bool written;
};

}  // namespace detail_rows

STAGECRAFT_COMPILED_INLINE std::vector<RowChain> find_row_chains(const Graph& g, const std::vector<Step>& steps) {
  std::vector<RowChain> chains;
  if (!row_chains()) return chains;
  // The rows of each chunk a column unit over `rows` rows of `width` adds by (the backend's cut),
  // or 0 when it cuts them into too few chunks to spread over threads (a chain runs chunk by chunk).
  const auto chunk_of = [](const RowUnit& u, std::int64_t rows) -> std::int64_t {
    const std::int64_t per = backend::cpu::chunk_rows(1, rows, u.width);
    return (rows + per - 1) / per >= min_column_chunks ? per : 0;
  };
  std::size_t i = 0;
  while (i < steps.size()) {
    auto first = detail_rows::unit_of(g, steps[i], i);
    if (first && first->first.columns && chunk_of(first->first, detail_rows::lead_of(first->second).numel()) == 0)
      first.reset();
    if (!first) {
      ++i;
      continue;
    }
    RowChain c;
    c.first = c.last = i;
    c.lead = detail_rows::lead_of(first->second);
    c.rows = c.lead.numel();
    c.dtype = g.values[steps[i].out[0]].dtype;
    c.units.push_back(first->first);
    if (first->first.columns) c.chunk = chunk_of(first->first, c.rows);
    std::int64_t widest = first->first.width;
    // the chain's values laid out by its rows, and the column results (read by no later unit)
    std::vector<int> made, sums;
    const auto note = [&](std::size_t j, const RowUnit& u) {
      for (std::size_t k = 0; k < steps[j].out.size(); ++k)
        (u.columns && k + 1 == steps[j].out.size() ? sums : made).push_back(steps[j].out[k]);
    };
    note(i, first->first);
    for (std::size_t j = i + 1; j < steps.size(); ++j) {
      auto u = detail_rows::unit_of(g, steps[j], j);
      if (!u || detail_rows::lead_of(u->second) != c.lead || g.values[steps[j].out[0]].dtype != c.dtype) break;
      if (u->first.columns) {  // every column unit of a chain cuts the rows alike
        const std::int64_t per = chunk_of(u->first, c.rows);
        if (per == 0 || (c.chunk != 0 && per != c.chunk)) break;
        c.chunk = per;
      }
      // what it reads of the chain's values must be laid out by the chain's rows
      bool ok = true;
      for (int v : steps[j].in) {
        if (std::find(sums.begin(), sums.end(), v) != sums.end()) ok = false;
        if (std::find(made.begin(), made.end(), v) != made.end()) ok = ok && row_width(g.values[v].shape, c.lead) >= 1;
      }
      if (!ok) break;
      c.last = j;
      c.units.push_back(u->first);
      widest = std::max(widest, u->first.width);
      note(j, u->first);
    }
    i = c.last + 1;
    if (c.units.size() < 2 || c.rows < 16 || c.rows * widest < row_chain_min_elements) continue;
    c.width = widest;
    c.block = std::clamp<std::int64_t>(row_chain_block_elements() / widest, 1, std::max<std::int64_t>(1, c.rows / 8));
    if (c.chunk > 0) {
      c.block = std::min(c.block, c.chunk);
      detail_rows::column_leaves(0, c.chunk, -1, 0, true, c.leaves, c.levels);
      const std::int64_t rest = c.rows - (c.rows - 1) / c.chunk * c.chunk;  // the last chunk's rows
      detail_rows::column_leaves(0, rest, -1, 0, true, c.last_leaves, c.levels);
    }
    chains.push_back(std::move(c));
  }
  return chains;
}

STAGECRAFT_COMPILED_INLINE bool run_row_chain(const RowChain& c, const std::vector<std::vector<Tensor>>& ins,
                                              const std::vector<std::vector<Tensor>>& outs, const std::vector<Tensor>& vals) {
  namespace f = detail_fused;
  // Every tensor the chain writes may share bytes only with tensors laid out row by row as it is.
  // (a column result is written at the end, not row by row)
  std::vector<detail_rows::Span> spans;
  const auto add = [&](const Tensor& t, bool written, bool columns = false) {
    const auto* lo = static_cast<const std::byte*>(t.raw_data());
    spans.push_back({lo, lo + t.nbytes(), columns ? -1 : row_width(t.shape(), c.lead), written});
  };
  for (const RowUnit& u : c.units) {
    for (const Tensor& t : ins[u.step]) add(t, false);
    if (u.out >= 0) add(vals[static_cast<std::size_t>(u.out)], true, u.columns);
    else
      for (std::size_t k = 0; k < outs[u.step].size(); ++k) add(outs[u.step][k], true, u.columns && k + 1 == outs[u.step].size());
  }
  for (const detail_rows::Span& a : spans) {
    if (!a.written) continue;
    for (const detail_rows::Span& b : spans)
      if (&a != &b && a.lo < b.hi && b.lo < a.hi && !(a.lo == b.lo && a.width == b.width && b.width >= 1)) return false;
  }
  visit_dtype(c.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T>) {
      thread_local std::vector<f::RunState> states;
      if (states.size() < c.units.size()) states.resize(c.units.size());
      std::vector<Tensor> out_args;
      for (std::size_t k = 0; k < c.units.size(); ++k) {
        const RowUnit& u = c.units[k];
        if (!u.fused) continue;
        const FusedProgram& p = u.fused->program;
        if (u.out >= 0) out_args.assign(1, vals[static_cast<std::size_t>(u.out)]);
        else out_args.assign(outs[u.step].begin(), outs[u.step].begin() + static_cast<std::ptrdiff_t>(p.num_out_args()));
        f::bind<T>(*u.fused, ins[u.step], out_args, states[k]);
      }
      const f::RunState* st = states.data();
      namespace r = detail_rows;
      namespace cpu = backend::cpu;
      const auto op_of = [](const RowUnit& u) { return u.fused ? u.fused->program.reduction->op : u.reduce; };
      // Column units: each chunk's row of partial results, then a thread's scratch rows per unit.
      const std::int64_t chunks = c.chunk > 0 ? (c.rows + c.chunk - 1) / c.chunk : 0;
      std::vector<std::vector<T>> parts(c.units.size());
      std::vector<std::int64_t> scratch_at(c.units.size(), 0);
      std::int64_t scratch_len = 0;
      for (std::size_t k = 0; k < c.units.size(); ++k)
        if (c.units[k].columns) {
          parts[k].resize(static_cast<std::size_t>(chunks * c.units[k].width));
          scratch_at[k] = scratch_len;
          scratch_len += c.levels * c.units[k].width;
        }
      // Rows [r0, r1) of every unit (rows of chunk `ch` with column units, its scratch rows `scr`).
      const auto run_block = [&](std::int64_t r0, std::int64_t r1, std::int64_t ch, T* scr, std::vector<std::size_t>& at) {
        for (std::size_t k = 0; k < c.units.size(); ++k) {
          const RowUnit& u = c.units[k];
          if (u.columns) {
            const ops::OpId op = op_of(u);
            const std::vector<ColumnLeaf>& lv = (ch + 1) * c.chunk <= c.rows ? c.leaves : c.last_leaves;
            const r::ColumnSink<T> sink{op == ops::OpId::Sum ? &lv : nullptr, parts[k].data() + ch * u.width,
                                        scr + scratch_at[k], u.width, ch * c.chunk};
            switch (op) {
              case ops::OpId::Max: r::column_unit<cpu::MaxReducer, T>(u, st[k], vals, r0, r1, sink, at[k]); break;
              case ops::OpId::Min: r::column_unit<cpu::MinReducer, T>(u, st[k], vals, r0, r1, sink, at[k]); break;
              default: r::column_unit<cpu::SumReducer, T>(u, st[k], vals, r0, r1, sink, at[k]); break;
            }
          } else if (u.fused && !u.fused->program.reduction) {
            f::run_tiles<T>(*u.fused, st[k], r0 * u.width, r1 * u.width);
          } else {
            switch (op_of(u)) {
              case ops::OpId::Max: r::reduce_unit<cpu::MaxReducer, T>(u, st[k], outs, vals, r0, r1); break;
              case ops::OpId::Min: r::reduce_unit<cpu::MinReducer, T>(u, st[k], outs, vals, r0, r1); break;
              default: r::reduce_unit<cpu::SumReducer, T>(u, st[k], outs, vals, r0, r1); break;
            }
          }
        }
      };
      // Threads as for a costly elementwise pass over the widest step's elements (as many as its
      // own step would take), each over whole blocks (with column units: whole chunks, their
      // blocks in order): a range of elements [b, e) takes the blocks (chunks) that start in it.
      const std::int64_t per_part = (c.chunk > 0 ? c.chunk : c.block) * c.width;
      backend::cpu::parallel_for(c.rows * c.width, backend::cpu::grain_costly, [&](std::int64_t b, std::int64_t e) {
        thread_local std::vector<T> scratch;
        if (scratch.size() < static_cast<std::size_t>(scratch_len)) scratch.resize(static_cast<std::size_t>(scratch_len));
        std::vector<std::size_t> at(c.units.size(), 0);  // each column unit's leaf in its chunk
        for (std::int64_t p = (b + per_part - 1) / per_part; p < (e + per_part - 1) / per_part; ++p) {
          if (c.chunk == 0) {
            run_block(p * c.block, std::min(c.rows, (p + 1) * c.block), 0, nullptr, at);
            continue;
          }
          std::fill(at.begin(), at.end(), 0);
          const std::int64_t end = std::min(c.rows, (p + 1) * c.chunk);
          for (std::int64_t r0 = p * c.chunk; r0 < end; r0 += c.block) run_block(r0, std::min(end, r0 + c.block), p, scratch.data(), at);
        }
      });
      // each column unit's chunks reduced as the backend reduces them (reduce3), into its result
      for (std::size_t k = 0; k < c.units.size(); ++k) {
        const RowUnit& u = c.units[k];
        if (!u.columns) continue;
        T* y = static_cast<T*>(u.fused ? outs[u.step].back().raw_data() : vals[static_cast<std::size_t>(u.out)].raw_data());
        switch (op_of(u)) {
          case ops::OpId::Max: cpu::reduce3<cpu::MaxReducer, T, T>(parts[k].data(), y, 1, chunks, u.width, false); break;
          case ops::OpId::Min: cpu::reduce3<cpu::MinReducer, T, T>(parts[k].data(), y, 1, chunks, u.width, false); break;
          default: cpu::reduce3<cpu::SumReducer, T, T>(parts[k].data(), y, 1, chunks, u.width, false); break;
        }
      }
    }
  });
  return true;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace detail_plan
}  // namespace stagecraft::graph
