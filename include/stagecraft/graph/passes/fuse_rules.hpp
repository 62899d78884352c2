// The fusion pass's data and rules (see fuse.hpp): a group (FusionGroup), the pass's settings,
// and what may join a group (detail_fuse: candidates, reductions, windows, products, heads).
#pragma once
#include <algorithm>
#include <vector>

#include "../cuda_fused.hpp"
#include "../fused_kernel.hpp"
#include "../ir.hpp"
#include "../op_table.hpp"
#include "../../ops/slice.hpp"

namespace stagecraft::graph {

/// One fused group: its nodes (program order; a reduction consumer last), the values it reads and
/// the values it writes (those used outside it; a reduction's result last), and the program that
/// computes them. head: a matmul node run first in the group's step, whose result the program
/// reads as an input (-1: none); reduce: the reduction node, or -1.
/// concats: concat nodes of the group's values that the group writes (their results are among
/// `outputs`, written through windows): they do not run, and they are not in `nodes` (the group
/// runs at nodes.back(), before them).
struct FusionGroup {
  std::vector<int> nodes;
  std::vector<int> inputs;
  std::vector<int> outputs;
  FusedProgram program;
  int head = -1;
  int reduce = -1;
  std::vector<int> concats = {};
  /// Nodes of other groups whose values this group computes again from their inputs instead of
  /// reading them (rematerialized: see find_fusion_groups); their instructions come first.
  std::vector<int> recomputed = {};
};

/// Every group of a graph; group_of[node] is the node's group or -1.
struct FusionGroups {
  FusionGroups() = default;
  explicit FusionGroups(std::size_t num_nodes) : group_of(num_nodes, -1) {}
  std::vector<int> group_of;
  std::vector<FusionGroup> groups;
};

/// Outputs with fewer elements than this are not fused: below it the tile evaluator's set-up
/// costs more than the memory passes fusion saves (an LSTM cell at batch 1: 388 µs fused, 300 µs
/// unfused; bench_staged). Adjustable for experiments and tests.
STAGECRAFT_COMPILED_INLINE std::int64_t& fusion_min_elements();

/// Whether traced functions on a GPU fuse elementwise groups into generated kernels (NVRTC); on
/// by default in CUDA builds. Off, each op runs as its own eager kernel (for comparisons).
STAGECRAFT_COMPILED_INLINE bool& cuda_fusion();
/// Where a fused group forms a small matrix product it reads itself (FusedProduct) instead of
/// reading it from a kernel of its own: `gpu` (the default: on a GPU the product's launch costs
/// more than forming it in the group), `off`, or `everywhere` (CPU groups too, by BLAS before the
/// tiles, and no CPU matmul heads, as on a GPU: for tests, no faster there).
enum class ProductFusion { off, gpu, everywhere };
STAGECRAFT_COMPILED_INLINE ProductFusion& product_fusion();

/// Whether a concat whose pieces are all values of one fused group (a group without a matmul head,
/// and the concat's result read by nothing that runs before the group) is written by the group,
/// each piece through its window of the concat's result (FusedProgram::out_windows), instead of
/// copied by a step of its own: on by default (on a GPU a launch less; an LSTM's backward step
/// concatenates its gates' gradients).
STAGECRAFT_COMPILED_INLINE bool& concat_fusion();

/// Whether a group with a reduction leaves a cheap value to the later groups that read it, which
/// compute it again from its inputs (FusionGroup::recomputed), instead of writing it: on by
/// default (layer_norm's centred values are then never stored). Off for comparisons.
STAGECRAFT_COMPILED_INLINE bool& rematerialize();

/// Whether a CPU group's value summed (max, min) over leading axes (a column sum: sum(x, {0}) of a
/// matrix, a bias's or LayerNorm gamma's gradient) is reduced by the group as it is computed,
/// instead of written and read again by a reduction kernel: on by default. Off for comparisons.
STAGECRAFT_COMPILED_INLINE bool& column_reductions();

/// The most multiply-adds a group may spend forming one product's elements (each element it reads
/// costs the product's inner extent); larger products stay a library call (cuBLAS). Default 2^20:
/// an LSTM step's recurrent product up to a batch of 64 at 64 hidden units.
STAGECRAFT_COMPILED_INLINE std::int64_t& product_fusion_max_macs();
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE ProductFusion& product_fusion() {
  static ProductFusion mode = ProductFusion::gpu;
  return mode;
}

STAGECRAFT_COMPILED_INLINE bool& concat_fusion() {
  static bool on = true;
  return on;
}

STAGECRAFT_COMPILED_INLINE bool& rematerialize() {
  static bool on = true;
  return on;
}

STAGECRAFT_COMPILED_INLINE bool& column_reductions() {
  static bool on = true;
  return on;
}

STAGECRAFT_COMPILED_INLINE std::int64_t& product_fusion_max_macs() {
  static std::int64_t n = std::int64_t{1} << 20;
  return n;
}

STAGECRAFT_COMPILED_INLINE std::int64_t& fusion_min_elements() {
  static std::int64_t n = 1024;
  return n;
}

STAGECRAFT_COMPILED_INLINE bool& cuda_fusion() {
  static bool on = cuda::built;
  return on;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

namespace detail_fuse {

/// Nodes that read each value (in program order).
STAGECRAFT_COMPILED_INLINE std::vector<std::vector<int>> users_of(const Graph& g);

/// True when node n can be an instruction of a program over its output dtype.
STAGECRAFT_COMPILED_INLINE bool candidate(const Graph& g, const Node& n);

/// True when node u (placed before i) is an assignment that can run after node i instead: no
/// node in between reads that variable or has effects of its own. The plan then runs it right
/// after the group (so an optimizer's whole update of one variable is one group).
STAGECRAFT_COMPILED_INLINE bool deferrable(const Graph& g, int u, int i);

/// True when every reader of the values `vals` placed before node `at` is a node of the group
/// `grp` (by `tentative`) or an assignment that can be deferred until after `at`.
STAGECRAFT_COMPILED_INLINE bool readers_ok(const Graph& g, const std::vector<std::vector<int>>& users,
                                           const std::vector<int>& tentative, const std::vector<int>& vals, int grp,
                                           int at);

/// The trailing element count a reduction node reduces (its axes a suffix of its input's), or 0.
STAGECRAFT_COMPILED_INLINE std::int64_t trailing_inner(const Graph& g, const Node& r);
/// The element count a reduction node keeps when its axes are a prefix of its input's that leaves
/// more than one element (a column reduction: sum(x, {0}) of a matrix), or 0.
STAGECRAFT_COMPILED_INLINE std::int64_t leading_kept(const Graph& g, const Node& r);

/// True when node n is a sum/max/min that can consume a group's value: the CPU evaluator's tiles
/// or, on a GPU, the generated kernel's rows (sc_fused_r) reduce it as it is computed.
STAGECRAFT_COMPILED_INLINE bool reduction_candidate(const Graph& g, const Node& n);

/// True when node `sn` is a slice of a value of rank >= 1 (same rank, dtype and device) whose result
/// is read and is not a result of the graph: a group may read it through a window of that value.
STAGECRAFT_COMPILED_INLINE bool windowable(const Graph& g, const std::vector<std::vector<int>>& users,
                                           const std::vector<char>& is_output, int sn);

/// True when node `sn` is windowable and only group `gid` reads its result: the group reads it
/// through a window.
STAGECRAFT_COMPILED_INLINE bool window_candidate(const Graph& g, const std::vector<std::vector<int>>& users,
                                                 const std::vector<char>& is_output, const std::vector<int>& group_of,
                                                 int gid, int sn);

/// True when node `cn` is a cast on a GPU (generated kernels on) between two dtypes the generated
/// kernels read, whose result is not a result of the graph: a GPU group may read its input instead,
/// converted as it is read (FusedProgram::input_dtypes), and the cast need not run.
STAGECRAFT_COMPILED_INLINE bool convertible(const Graph& g, const std::vector<char>& is_output, int cn);

/// True when node p is a matmul that can head a group of shape `shape` and dtype d.
STAGECRAFT_COMPILED_INLINE bool head_candidate(const Graph& g, const Node& p, const Shape& shape, DType d);

/// True when a group may form a product of inner extent `inner` for `elements` elements it reads:
/// inner <= 4096 and at most product_fusion_max_macs() multiply-adds.
inline bool small_product(std::int64_t inner, std::int64_t elements) {
  return inner <= 4096 && elements <= product_fusion_max_macs() / std::max<std::int64_t>(inner, 1);
}

/// Forms in group `fg` (built up to its inputs: gid's slots, windows set) each small product that
/// only the group reads (product_fusion(), product_fusion_max_macs()): the product's slots pass
/// its operand A, one new operand slot passes B (FusedProduct), and the matmul joins the group.
STAGECRAFT_COMPILED_INLINE void absorb_products(const Graph& g, const std::vector<std::vector<int>>& users,
                                                const std::vector<char>& is_output, std::vector<int>& group_of, int gid,
                                                FusionGroup& fg);

/// The concat nodes group `fg` (nodes `ms`, registers `reg`, instruction registers from `base`)
/// can write (concat_fusion()): not yet grouped, every piece a value of one of its instructions, of
/// the group's dtype and device, and its result read by nothing placed before the group's last
/// node (the group runs there) but assignments that can wait until then.
STAGECRAFT_COMPILED_INLINE std::vector<int> concats_of(const Graph& g, const std::vector<std::vector<int>>& users,
                                                       const std::vector<int>& group_of, const FusionGroup& fg,
                                                       const std::vector<int>& ms, const std::vector<int>& reg, int base);

/// Adds to fg's outputs each concat of `concats` (already of group gid): its result is written by
/// the pieces' registers, each through its window (FusedProgram::out_windows, out_args).
STAGECRAFT_COMPILED_INLINE void write_concats(const Graph& g, const std::vector<int>& concats, const std::vector<int>& reg,
                                              FusionGroup& fg);

/// True when op `id` is cheap enough to compute twice rather than store and read back once:
/// add, sub, mul, neg, abs, maximum, minimum, relu, square (no division, no transcendental).
STAGECRAFT_COMPILED_INLINE bool cheap_to_recompute(ops::OpId id);

/// The matmul whose result a GPU group `ms` can take as a cuBLASLt epilogue, or -1: the group is
/// `result + bias` or `relu(result + bias)` (the sum read by nothing else), over f32 on one GPU,
/// with result = a [M, K] x b [K, N] (transpose flags allowed, no batch) read by nothing else and
/// bias of shape [N] or [1, N]. The product and the group are then one cuBLASLt call.
STAGECRAFT_COMPILED_INLINE int gpu_epilogue_head(const Graph& g, const std::vector<std::vector<int>>& users,
                                                 const std::vector<int>& ms);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE bool cheap_to_recompute(ops::OpId id) {
  using ops::OpId;
  switch (id) {
    case OpId::Add: case OpId::Sub: case OpId::Mul: case OpId::Neg: case OpId::Abs:
    case OpId::Maximum: case OpId::Minimum: case OpId::Relu: case OpId::Square:
    case OpId::Floor: case OpId::Ceil: case OpId::Round: return true;
    default: return false;
  }
}

STAGECRAFT_COMPILED_INLINE std::vector<std::vector<int>> users_of(const Graph& g) {
  std::vector<std::vector<int>> users(g.values.size());
  for (std::size_t i = 0; i < g.nodes.size(); ++i)
    for (int v : g.nodes[i].inputs) users[v].push_back(static_cast<int>(i));
  return users;
}

STAGECRAFT_COMPILED_INLINE bool candidate(const Graph& g, const Node& n) {
  if (n.kind != NodeKind::op || n.outputs.size() != 1) return false;
  const OpFns& f = fns(n.op);
  if (!f.elementwise_unary && !f.elementwise_binary) return false;
  const Value& out = g.values[n.outputs[0]];
  // On a GPU every size is fused: one launch less saves more than any small tensor costs.
  const bool gpu = out.device.is_cuda();
  if (gpu ? !cuda_fusion() || detail_cuda_fused::rule_names[static_cast<std::size_t>(n.op)].empty() : !out.device.is_cpu())
    return false;
  if (!fusible(n.op, out.dtype) || out.shape.numel() == 0 || (!gpu && out.shape.numel() < fusion_min_elements()))
    return false;
  for (int v : n.inputs)
    if (g.values[v].dtype != out.dtype || g.values[v].device != out.device) return false;
  return true;
}

STAGECRAFT_COMPILED_INLINE bool deferrable(const Graph& g, int u, int i) {
  const Node& a = g.nodes[u];
  if (a.kind != NodeKind::assign_var) return false;
  for (int k = u + 1; k < i; ++k) {
    const Node& n = g.nodes[k];
    if (n.kind == NodeKind::cond || n.kind == NodeKind::while_loop || n.kind == NodeKind::host_fn) return false;
    if ((n.kind == NodeKind::read_var || n.kind == NodeKind::assign_var) && n.var == a.var) return false;
  }
  return true;
}

STAGECRAFT_COMPILED_INLINE bool readers_ok(const Graph& g, const std::vector<std::vector<int>>& users,
                                           const std::vector<int>& tentative, const std::vector<int>& vals, int grp,
                                           int at) {
  for (int v : vals)
    for (int u : users[v])
      if (u < at && tentative[u] != grp && !deferrable(g, u, at)) return false;
  return true;
}

STAGECRAFT_COMPILED_INLINE std::int64_t trailing_inner(const Graph& g, const Node& r) {
  const Shape& s = g.values[r.inputs[0]].shape;
  Shape axes;
  for (std::int64_t a : r.attrs.ints) axes.push_back(a < 0 ? a + s.rank() : a);
  if (r.attrs.ints.empty())
    for (int k = 0; k < s.rank(); ++k) axes.push_back(k);
  std::sort(axes.begin(), axes.end());
  std::int64_t inner = 1;
  for (int k = 0; k < axes.rank(); ++k) {
    if (axes[k] != s.rank() - axes.rank() + k) return 0;
    inner *= s[static_cast<int>(axes[k])];
  }
  return inner;
}

STAGECRAFT_COMPILED_INLINE std::int64_t leading_kept(const Graph& g, const Node& r) {
  const Shape& s = g.values[r.inputs[0]].shape;
  if (r.attrs.ints.empty()) return 0;  // every axis: trailing_inner's
  Shape axes;
  for (std::int64_t a : r.attrs.ints) axes.push_back(a < 0 ? a + s.rank() : a);
  std::sort(axes.begin(), axes.end());
  if (axes.rank() >= s.rank()) return 0;
  for (int k = 0; k < axes.rank(); ++k)
    if (axes[k] != k) return 0;
  std::int64_t kept = 1;
  for (int k = axes.rank(); k < s.rank(); ++k) kept *= s[k];
  return kept > 1 ? kept : 0;  // (one column: the kernel sums it as a row, in another order)
}

STAGECRAFT_COMPILED_INLINE bool reduction_candidate(const Graph& g, const Node& n) {
  if (n.kind != NodeKind::op || n.outputs.size() != 1 || n.inputs.size() != 1) return false;
  if (n.op != ops::OpId::Sum && n.op != ops::OpId::Max && n.op != ops::OpId::Min) return false;
  const Value& in = g.values[n.inputs[0]];
  const Value& out = g.values[n.outputs[0]];
  const bool here = in.device.is_cpu() || (in.device.is_cuda() && cuda_fusion());
  return here && out.device == in.device && is_floating(in.dtype) && out.dtype == in.dtype && in.shape.numel() > 0 &&
         (trailing_inner(g, n) > 0 || (in.device.is_cpu() && column_reductions() && leading_kept(g, n) > 0));
}

STAGECRAFT_COMPILED_INLINE bool windowable(const Graph& g, const std::vector<std::vector<int>>& users,
                                           const std::vector<char>& is_output, int sn) {
  const Node& n = g.nodes[sn];
  if (n.kind != NodeKind::op || n.op != ops::OpId::Slice || n.inputs.size() != 1 || n.outputs.size() != 1) return false;
  const int v = n.outputs[0];
  const Value &out = g.values[v], &in = g.values[n.inputs[0]];
  return !is_output[v] && !users[v].empty() && in.shape.rank() >= 1 && in.shape.rank() == out.shape.rank() &&
         in.dtype == out.dtype && in.device == out.device;
}

STAGECRAFT_COMPILED_INLINE bool window_candidate(const Graph& g, const std::vector<std::vector<int>>& users,
                                                 const std::vector<char>& is_output, const std::vector<int>& group_of,
                                                 int gid, int sn) {
  if (!windowable(g, users, is_output, sn)) return false;
  for (int u : users[g.nodes[sn].outputs[0]])
    if (group_of[u] != gid) return false;
  return true;
}

STAGECRAFT_COMPILED_INLINE bool convertible(const Graph& g, const std::vector<char>& is_output, int cn) {
  const Node& n = g.nodes[cn];
  if (n.kind != NodeKind::op || n.op != ops::OpId::Cast || n.inputs.size() != 1 || n.outputs.size() != 1) return false;
  const Value &out = g.values[n.outputs[0]], &in = g.values[n.inputs[0]];
  return !is_output[n.outputs[0]] && out.device.is_cuda() && cuda_fusion() && in.device == out.device &&
         in.dtype != out.dtype && detail_cuda_fused::c_type(out.dtype) != nullptr &&
         (in.dtype == DType::b8 || detail_cuda_fused::c_type(in.dtype) != nullptr);
}

STAGECRAFT_COMPILED_INLINE bool head_candidate(const Graph& g, const Node& p, const Shape& shape, DType d) {
  if (p.kind != NodeKind::op || p.op != ops::OpId::MatMul || p.outputs.size() != 1) return false;
  const Value& v = g.values[p.outputs[0]];
  return v.device.is_cpu() && v.dtype == d && is_floating(d) && v.shape == shape;
}

STAGECRAFT_COMPILED_INLINE void absorb_products(const Graph& g, const std::vector<std::vector<int>>& users,
                                                const std::vector<char>& is_output, std::vector<int>& group_of, int gid,
                                                FusionGroup& fg) {
  FusedProgram& pr = fg.program;
  const ProductFusion mode = product_fusion();
  const Device dev = g.values[g.nodes[fg.nodes.back()].outputs[0]].device;
  if (mode == ProductFusion::off || !is_floating(pr.dtype) || (!dev.is_cuda() && mode != ProductFusion::everywhere))
    return;
  const std::size_t nin = fg.inputs.size();
  for (std::size_t k = 0; k < nin; ++k) {
    if (pr.product(k) || pr.converted(k)) continue;  // (its slot now passes a product's A, or another dtype)
    const int v = fg.inputs[k], pn = g.values[v].node;
    const Node& p = g.nodes[pn];
    if (p.kind != NodeKind::op || p.op != ops::OpId::MatMul || p.inputs.size() != 2 || p.outputs.size() != 1 ||
        group_of[pn] >= 0 || is_output[v])
      continue;
    const Value &out = g.values[v], &a = g.values[p.inputs[0]], &b = g.values[p.inputs[1]];
    if (out.shape.rank() != 2 || a.shape.rank() != 2 || b.shape.rank() != 2) continue;
    bool fits = true;
    for (const Value* x : {&out, &a, &b}) fits = fits && x->dtype == pr.dtype && x->device == dev;
    if (!fits || group_of[a.node] == gid || group_of[b.node] == gid) continue;
    // Read by the group alone: slices it absorbed are the group's already (a slice shared with other
    // groups is not), and a product formed in it that takes v as an operand needs v made first.
    for (int u : users[v]) {
      const Node& un = g.nodes[u];
      fits = fits && group_of[u] == gid && !(un.kind == NodeKind::op && un.op == ops::OpId::MatMul);
      if (fits && un.kind == NodeKind::op && un.op == ops::OpId::Slice)
        for (int w : users[un.outputs[0]]) fits = fits && group_of[w] == gid;
    }
    const bool ta = p.attrs.i0 != 0, tb = p.attrs.i1 != 0;
    const std::int64_t inner = ta ? a.shape[0] : a.shape[1];
    std::int64_t elements = 0;  // (each element read costs `inner` multiply-adds)
    for (std::size_t j = 0; j < nin; ++j)
      if (fg.inputs[j] == v && !pr.product(j)) elements += pr.out_shape.numel();
    if (!fits || !small_product(inner, elements)) continue;
    const int b_slot = static_cast<int>(fg.inputs.size());
    fg.inputs.push_back(p.inputs[1]);
    pr.input_shapes.push_back(b.shape);
    if (!pr.windows.empty()) pr.windows.emplace_back();
    if (!pr.input_dtypes.empty()) pr.input_dtypes.push_back(pr.dtype);
    pr.products.resize(fg.inputs.size());
    pr.products[static_cast<std::size_t>(b_slot)].operand = true;
    for (std::size_t j = 0; j < nin; ++j)
      if (fg.inputs[j] == v && !pr.product(j)) {
        fg.inputs[j] = p.inputs[0];
        pr.products[j] = FusedProduct{a.shape, b_slot, ta, tb, false};
      }
    group_of[pn] = gid;
    fg.nodes.push_back(pn);
  }
  std::sort(fg.nodes.begin(), fg.nodes.end());
}

STAGECRAFT_COMPILED_INLINE std::vector<int> concats_of(const Graph& g, const std::vector<std::vector<int>>& users,
                                                       const std::vector<int>& group_of, const FusionGroup& fg,
                                                       const std::vector<int>& ms, const std::vector<int>& reg, int base) {
  std::vector<int> found;
  if (!concat_fusion() || fg.head >= 0) return found;
  const Value& first = g.values[g.nodes[ms[0]].outputs[0]];
  for (int m : ms)
    for (int u : users[g.nodes[m].outputs[0]]) {
      const Node& n = g.nodes[u];
      if (group_of[u] >= 0 || std::find(found.begin(), found.end(), u) != found.end()) continue;
      if (n.kind != NodeKind::op || n.op != ops::OpId::Concat || n.outputs.size() != 1 || n.inputs.empty()) continue;
      const Value& c = g.values[n.outputs[0]];
      bool ok = c.dtype == first.dtype && c.device == first.device && c.shape.rank() == first.shape.rank();
      for (int v : n.inputs) ok = ok && reg[v] >= base && g.values[v].shape == first.shape;
      for (int r : users[n.outputs[0]]) ok = ok && (r > fg.nodes.back() || deferrable(g, r, fg.nodes.back()));
      if (ok) found.push_back(u);
    }
  return found;
}

STAGECRAFT_COMPILED_INLINE void write_concats(const Graph& g, const std::vector<int>& concats, const std::vector<int>& reg,
                                              FusionGroup& fg) {
  FusedProgram& pr = fg.program;
  if (concats.empty()) return;
  pr.out_windows.resize(pr.outputs.size());  // the plain outputs: each its own tensor, whole
  for (std::size_t j = 0; j < pr.outputs.size(); ++j) pr.out_args.push_back(static_cast<int>(j));
  for (int cn : concats) {
    const Node& n = g.nodes[cn];
    const Shape& cs = g.values[n.outputs[0]].shape;
    const int axis = static_cast<int>(n.attrs.axis < 0 ? n.attrs.axis + cs.rank() : n.attrs.axis);
    const int t = static_cast<int>(fg.outputs.size());
    fg.outputs.push_back(n.outputs[0]);
    std::int64_t at = 0;
    for (int v : n.inputs) {
      FusedWindow w{cs, Shape{}};
      for (int d = 0; d < cs.rank(); ++d) w.begin.push_back(d == axis ? at : 0);
      pr.outputs.push_back(reg[v]);
      pr.out_windows.push_back(std::move(w));
      pr.out_args.push_back(t);
      at += g.values[v].shape[axis];
    }
  }
}

STAGECRAFT_COMPILED_INLINE int gpu_epilogue_head(const Graph& g, const std::vector<std::vector<int>>& users,
                                                 const std::vector<int>& ms) {
  if (!cuda_fusion() || ms.empty() || ms.size() > 2) return -1;
  const Node& add = g.nodes[ms[0]];
  if (add.kind != NodeKind::op || add.op != ops::OpId::Add || add.inputs.size() != 2 || add.outputs.size() != 1) return -1;
  const int sum = add.outputs[0];
  if (ms.size() == 2) {
    const Node& act = g.nodes[ms[1]];
    if (act.op != ops::OpId::Relu || act.inputs.size() != 1 || act.inputs[0] != sum) return -1;
    if (users[sum].size() != 1 || std::find(g.outputs.begin(), g.outputs.end(), sum) != g.outputs.end()) return -1;
  }
  const Value& out = g.values[sum];
  if (!out.device.is_cuda() || out.dtype != DType::f32 || out.shape.rank() != 2) return -1;
  for (int side = 0; side < 2; ++side) {
    const int v = add.inputs[side], bias = add.inputs[1 - side];
    const Node& p = g.nodes[g.values[v].node];
    if (p.kind != NodeKind::op || p.op != ops::OpId::MatMul || p.outputs.size() != 1 || v == bias) continue;
    if (users[v].size() != 1 || std::find(g.outputs.begin(), g.outputs.end(), v) != g.outputs.end()) continue;
    const Value &a = g.values[p.inputs[0]], &b = g.values[p.inputs[1]], &c = g.values[bias];
    const std::int64_t n = out.shape[1];
    const bool fits = g.values[v].shape == out.shape && a.shape.rank() == 2 && b.shape.rank() == 2 &&
                      a.dtype == DType::f32 && b.dtype == DType::f32 && a.device == out.device && b.device == out.device &&
                      c.dtype == DType::f32 && c.device == out.device &&
                      (c.shape == Shape{n} || c.shape == Shape{1, n});
    if (fits) return g.values[v].node;
  }
  return -1;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace detail_fuse

}  // namespace stagecraft::graph
