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
//
// fused_prepare.hpp resolves a program once; fused_tiles.hpp runs its tiles; this header binds
// the tensors of a run, checks them and runs on all threads.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "../backend/cpu/blas.hpp"
#include "../backend/cpu/parallel.hpp"
#include "../backend/cpu/reduce.hpp"
#include "../ops/registry.hpp"
#include "fused_prepare.hpp"
#include "fused_tiles.hpp"

namespace stagecraft::graph {

namespace detail_fused {

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
