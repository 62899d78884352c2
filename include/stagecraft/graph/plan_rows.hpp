// Row chains (a part of plan.hpp): consecutive CPU steps that each work row by row over the same
// rows (elementwise ops and groups over [..., C], sums, maxima and minima over the last axis) run
// together, a block of rows at a time, every step of the chain on one block before the next block:
// what a step writes for a block is still in the cache when the next step reads it. layer_norm's
// traced plan (a sum, the mean, the variance's group, the deviation, the normalisation) then reads
// its input from memory once instead of three times, softmax's twice instead of three times.
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
};

/// Steps first..last (consecutive) run block by block: `rows` rows, `block` of them at a time.
struct RowChain {
  std::size_t first = 0, last = 0;
  std::int64_t rows = 0, block = 0;
  std::int64_t width = 0;  ///< elements per row of the widest step
  DType dtype = DType::f32;
  Shape lead;  ///< the axes before the last of the shape every step works over
  std::vector<RowUnit> units;
};

/// Elements of the largest step below which no chain is made (its set-up would cost more than
/// the passes it saves).
inline constexpr std::int64_t row_chain_min_elements = std::int64_t{1} << 15;

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
    case OpId::Sqrt: case OpId::Square: case OpId::Relu: case OpId::Maximum: case OpId::Minimum: return true;
    default: return false;
  }
}

inline Shape lead_of(const Shape& s) {
  Shape l;
  for (int d = 0; d + 1 < s.rank(); ++d) l.push_back(s[d]);
  return l;
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
    if (p.reduction && (p.reduction->leading || p.reduction->inner != p.out_shape[p.out_shape.rank() - 1]))
      return std::nullopt;
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
    if (row_width(y.shape, lead) != 1) return std::nullopt;  // the last axis only, kept or not
    // (the eager kernel cuts long rows into chunks when there are few of them: other bits)
    if (x.numel() >= backend::cpu::grain_cheap && lead.numel() < backend::cpu::split_target / 4) return std::nullopt;
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

/// Reduces rows [r0, r1) of a fused program with a reduction into out, each row's chunks as
/// detail_fused::run_reduction cuts and combines them.
template <class Rd, class T>
void reduce_rows(const PreparedFused& pf, const detail_fused::RunState& st, std::int64_t r0, std::int64_t r1, T* out) {
  const FusedReduction& rd = *pf.program.reduction;
  const std::int64_t chunk = pf.tile * detail_fused::reduce_chunk_tiles;
  for (std::int64_t row = r0; row < r1; ++row) {
    T acc = T(0);
    for (std::int64_t b = row * rd.inner, end = (row + 1) * rd.inner; b < end; b += chunk) {
      bool first = true;
      T part = T(0);
      detail_fused::run_tiles<T>(pf, st, b, std::min(b + chunk, end), [&](const auto& at, std::int64_t t0, std::int64_t len) {
        const T v = backend::cpu::reduce_row<Rd, T, T>(at(rd.reg, t0), len);
        part = first ? v : Rd::combine(part, v);
        first = false;
      });
      acc = b == row * rd.inner ? part : Rd::combine(acc, part);
    }
    out[row] = acc;
  }
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
  std::size_t i = 0;
  while (i < steps.size()) {
    auto first = detail_rows::unit_of(g, steps[i], i);
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
    std::int64_t widest = first->first.width;
    std::vector<int> made(steps[i].out.begin(), steps[i].out.end());
    for (std::size_t j = i + 1; j < steps.size(); ++j) {
      auto u = detail_rows::unit_of(g, steps[j], j);
      if (!u || detail_rows::lead_of(u->second) != c.lead || g.values[steps[j].out[0]].dtype != c.dtype) break;
      // what it reads of the chain's values must be laid out by the chain's rows
      bool ok = true;
      for (int v : steps[j].in)
        if (std::find(made.begin(), made.end(), v) != made.end()) ok = ok && row_width(g.values[v].shape, c.lead) >= 1;
      if (!ok) break;
      c.last = j;
      c.units.push_back(u->first);
      widest = std::max(widest, u->first.width);
      made.insert(made.end(), steps[j].out.begin(), steps[j].out.end());
    }
    i = c.last + 1;
    if (c.units.size() < 2 || c.rows < 16 || c.rows * widest < row_chain_min_elements) continue;
    c.width = widest;
    c.block = std::clamp<std::int64_t>(row_chain_block_elements() / widest, 1, std::max<std::int64_t>(1, c.rows / 8));
    chains.push_back(std::move(c));
  }
  return chains;
}

STAGECRAFT_COMPILED_INLINE bool run_row_chain(const RowChain& c, const std::vector<std::vector<Tensor>>& ins,
                                              const std::vector<std::vector<Tensor>>& outs, const std::vector<Tensor>& vals) {
  namespace f = detail_fused;
  // Every tensor the chain writes may share bytes only with tensors laid out row by row as it is.
  std::vector<detail_rows::Span> spans;
  const auto add = [&](const Tensor& t, bool written) {
    const auto* lo = static_cast<const std::byte*>(t.raw_data());
    spans.push_back({lo, lo + t.nbytes(), row_width(t.shape(), c.lead), written});
  };
  for (const RowUnit& u : c.units) {
    for (const Tensor& t : ins[u.step]) add(t, false);
    if (u.out >= 0) add(vals[static_cast<std::size_t>(u.out)], true);
    else
      for (const Tensor& t : outs[u.step]) add(t, true);
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
      // Threads as for a costly elementwise pass over the widest step's elements (as many as its
      // own step would take), each over whole blocks: a range of elements [b, e) takes the
      // blocks that start in it.
      const std::int64_t per_block = c.block * c.width;
      backend::cpu::parallel_for(c.rows * c.width, backend::cpu::grain_costly, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t blk = (b + per_block - 1) / per_block; blk < (e + per_block - 1) / per_block; ++blk) {
          const std::int64_t r0 = blk * c.block, r1 = std::min(c.rows, r0 + c.block);
          for (std::size_t k = 0; k < c.units.size(); ++k) {
            const RowUnit& u = c.units[k];
            if (u.fused && !u.fused->program.reduction) {
              f::run_tiles<T>(*u.fused, st[k], r0 * u.width, r1 * u.width, [](const auto&, std::int64_t, std::int64_t) {});
              continue;
            }
            namespace r = detail_rows;
            namespace cpu = backend::cpu;
            switch (u.fused ? u.fused->program.reduction->op : u.reduce) {
              case ops::OpId::Max: r::reduce_unit<cpu::MaxReducer, T>(u, st[k], outs, vals, r0, r1); break;
              case ops::OpId::Min: r::reduce_unit<cpu::MinReducer, T>(u, st[k], outs, vals, r0, r1); break;
              default: r::reduce_unit<cpu::SumReducer, T>(u, st[k], outs, vals, r0, r1); break;
            }
          }
        }
      });
    }
  });
  return true;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace detail_plan
}  // namespace stagecraft::graph
