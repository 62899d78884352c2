// A plan's steps (what Plan::lower makes of a graph's nodes) and the rewrites of its step list
// that merge or batch GPU work: a dense layer's weight and bias gradients as one cuBLASLt call,
// and independent fused groups launched as one kernel.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "cuda_fused.hpp"
#include "cuda_fused_batch.hpp"
#include "fused_kernel.hpp"
#include "ir.hpp"
#include "op_table.hpp"

namespace stagecraft::graph {

class Plan;

namespace detail_plan {

enum class StepKind : std::uint8_t { kernel, view, read_var, assign_var, cond, while_loop, host_fn, fused };

struct Step {
  StepKind kind = StepKind::kernel;
  int node = -1;  ///< the graph node (the last one of a fused group)
  const OpFns* fns = nullptr;
  ops::Attrs attrs;
  std::vector<int> in, out;
  std::shared_ptr<const Plan> sub[2];            ///< cond: then/else; while: cond/body
  std::shared_ptr<const PreparedFused> fused;    ///< fused group on the CPU
  std::shared_ptr<const CudaFused> cuda_fused;   ///< fused group on a GPU (a generated kernel)
  /// GPU fused groups launched together (one kernel): `in` and `out` hold each group's in turn.
  std::shared_ptr<const CudaFusedBatch> cuda_batch;
  bool gpu = false;                              ///< kernel / fused: runs on a CUDA device
  int num_loop_vars = 0;
  const OpFns* head_fns = nullptr;  ///< fused group: its matmul head, run first
  ops::Attrs head_attrs;
  std::vector<int> head_in;
  int head_out = -1;
  int bias = -1;              ///< GPU fused group with a matmul head (a cuBLASLt epilogue): the bias in `in`
  bool relu = false;          ///< ... and whether the epilogue applies a ReLU
  /// A GPU matmul op(x) g merged with sum(g, {0}) (one cuBLASLt call, its BGRADA epilogue): the
  /// sum's kernel and attributes (its value is out[1]), run after the product where cuBLASLt cannot.
  const OpFns* bgrad_fns = nullptr;
  ops::Attrs bgrad_attrs;
  /// A GPU loss softmax_cross_entropy(x, labels) merged with its gradient
  /// softmax_cross_entropy_grad(g, x, labels) (one pass over the logits, one launch): `in` is
  /// {x, labels, g}, `out` {loss, dx}.
  bool xent_both = false;
  /// A concat some of whose pieces their own steps write in place (MemoryPlan::placed_in): it
  /// copies only the rest, each (its index in `in`, its first byte in the output); empty otherwise.
  std::vector<std::pair<int, std::int64_t>> rest;
};

/// On a GPU, a run of fused groups that do not read each other's values (each cuda_batchable, at
/// most 16) becomes one step, one launch (CudaFusedBatch; cuda_group_batching()). Between two of
/// them may lie variable assignments, which then run after the batch, and variable reads of
/// variables not assigned there, which then run before it (an optimizer's update of each
/// variable, read and assigned in turn), and views (no launch), which run before it when they read
/// nothing the batch makes and after it otherwise (a reshape between two groups). Returns how many
/// groups joined a batch.
STAGECRAFT_COMPILED_INLINE int batch_gpu_groups(const Graph& g, std::vector<Step>& steps);

/// On a GPU, a dense layer's weight gradient op(x) g (a matmul, g read untransposed) and its bias
/// gradient sum(g, {0}) become one step, one cuBLASLt call, where both are f32 matrices on one
/// device and the later of the two reads nothing made after the earlier (the merged step runs
/// there). Returns how many pairs were merged.
STAGECRAFT_COMPILED_INLINE int merge_bias_grads(const Graph& g, std::vector<Step>& steps);

/// On a GPU, a loss softmax_cross_entropy(x, labels) and its gradient softmax_cross_entropy_grad(g,
/// x, labels) over the same values become one step, one pass over the logits (Step::xent_both),
/// where g is made before the loss (a training step's seed) and nothing the gradient reads is made
/// between the two. Returns how many pairs were merged.
STAGECRAFT_COMPILED_INLINE int merge_xent_pairs(const Graph& g, std::vector<Step>& steps);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE int batch_gpu_groups(const Graph& g, std::vector<Step>& steps) {
  if (!cuda_group_batching()) return 0;
  auto batchable = [&](const Step& s) {
    return s.kind == StepKind::fused && s.gpu && s.cuda_fused && !s.head_fns && cuda_batchable(s.cuda_fused->program());
  };
  const auto var_of = [&](const Step& s) { return g.nodes[s.node].var.get(); };
  std::vector<Step> out;
  std::vector<char> made(g.values.size(), 0);  // values the batch being formed writes
  int joined = 0;
  for (std::size_t i = 0; i < steps.size();) {
    if (!batchable(steps[i])) {
      out.push_back(std::move(steps[i++]));
      continue;
    }
    const Device dev = g.values[steps[i].out[0]].device;
    std::vector<std::size_t> members{i}, before, after;  // (steps moved before and after the batch)
    std::vector<const void*> assigned;
    std::vector<int> made_here = steps[i].out;  // values made by the batch or by steps that must follow it
    for (int v : steps[i].out) made[v] = 1;
    for (std::size_t j = i + 1; j < steps.size() && members.size() < 16; ++j) {
      const Step& s = steps[j];
      if (s.kind == StepKind::assign_var) {
        after.push_back(j);
        assigned.push_back(var_of(s));
        continue;
      }
      if (s.kind == StepKind::read_var && std::find(assigned.begin(), assigned.end(), var_of(s)) == assigned.end()) {
        before.push_back(j);
        continue;
      }
      if (s.kind == StepKind::view) {
        const bool reads_made = std::any_of(s.in.begin(), s.in.end(), [&](int v) { return made[v] != 0; });
        (reads_made ? after : before).push_back(j);
        if (reads_made)
          for (int v : s.out) made[v] = 1, made_here.push_back(v);
        continue;
      }
      bool ok = batchable(s) && g.values[s.out[0]].device == dev;
      for (int v : s.in) ok = ok && !made[v];
      if (!ok) break;
      members.push_back(j);
      for (int v : s.out) made[v] = 1, made_here.push_back(v);
    }
    for (int v : made_here) made[v] = 0;
    const std::size_t end = members.back() + 1;  // (steps after the last member stay where they are)
    if (members.size() < 2) {
      out.push_back(std::move(steps[i++]));
      continue;
    }
    for (std::size_t r : before)
      if (r < end) out.push_back(std::move(steps[r]));
    Step b;
    b.kind = StepKind::fused;
    b.gpu = true;
    b.node = steps[members[0]].node;
    std::vector<FusedProgram> programs;
    for (std::size_t m : members) {
      Step& s = steps[m];
      b.in.insert(b.in.end(), s.in.begin(), s.in.end());
      b.out.insert(b.out.end(), s.out.begin(), s.out.end());
      programs.push_back(s.cuda_fused->program());
    }
    b.cuda_batch = std::make_shared<const CudaFusedBatch>(std::move(programs));
    out.push_back(std::move(b));
    joined += static_cast<int>(members.size());
    for (std::size_t a : after)
      if (a < end) out.push_back(std::move(steps[a]));
    i = end;
  }
  steps = std::move(out);
  return joined;
}

STAGECRAFT_COMPILED_INLINE int merge_bias_grads(const Graph& g, std::vector<Step>& steps) {
  std::vector<int> made_at(g.values.size(), -1);  // the step that makes each value
  auto index = [&] {
    std::fill(made_at.begin(), made_at.end(), -1);
    for (std::size_t i = 0; i < steps.size(); ++i) {
      for (int v : steps[i].out) made_at[v] = static_cast<int>(i);
      if (steps[i].head_out >= 0) made_at[steps[i].head_out] = static_cast<int>(i);
    }
  };
  auto is_op = [&](const Step& s, ops::OpId op) {
    return s.kind == StepKind::kernel && s.gpu && s.out.size() == 1 && g.nodes[s.node].op == op;
  };
  auto f32_matrix = [&](int v, Device d) {
    const Value& x = g.values[v];
    return x.dtype == DType::f32 && x.shape.rank() == 2 && x.device == d;
  };
  int merged = 0;
  index();
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const Step& m = steps[i];
    if (!is_op(m, ops::OpId::MatMul) || m.in.size() != 2 || m.attrs.i1 != 0) continue;
    const Device d = g.values[m.out[0]].device;
    if (!f32_matrix(m.in[0], d) || !f32_matrix(m.in[1], d) || !f32_matrix(m.out[0], d)) continue;
    for (std::size_t j = 0; j < steps.size(); ++j) {
      const Step& r = steps[j];
      if (!is_op(r, ops::OpId::Sum) || r.in.size() != 1 || r.in[0] != m.in[1] || r.attrs.ints != Shape{0}) continue;
      const Value& db = g.values[r.out[0]];
      if (db.dtype != DType::f32 || db.device != d || db.shape.numel() != g.values[m.in[1]].shape[1]) continue;
      const std::size_t lo = std::min(i, j), hi = std::max(i, j);
      if (std::any_of(steps[hi].in.begin(), steps[hi].in.end(), [&](int v) { return made_at[v] >= static_cast<int>(lo); }))
        continue;
      Step both = m;
      both.out.push_back(r.out[0]);
      both.bgrad_fns = r.fns;
      both.bgrad_attrs = r.attrs;
      steps[lo] = std::move(both);
      steps.erase(steps.begin() + static_cast<std::ptrdiff_t>(hi));
      ++merged;
      index();
      i = lo;  // (steps after lo moved down; lo itself is merged and skipped next round)
      break;
    }
  }
  return merged;
}

STAGECRAFT_COMPILED_INLINE int merge_xent_pairs(const Graph& g, std::vector<Step>& steps) {
  auto is_op = [&](const Step& s, ops::OpId op) {
    return s.kind == StepKind::kernel && s.gpu && s.rest.empty() && s.bgrad_fns == nullptr && !s.xent_both &&
           g.nodes[s.node].op == op;
  };
  int merged = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const Step& l = steps[i];
    if (!is_op(l, ops::OpId::SoftmaxCrossEntropy) || l.in.size() != 2 || l.out.size() != 1) continue;
    std::vector<char> made_since(g.values.size(), 0);  // values the steps from the loss on make
    for (std::size_t j = i; j < steps.size(); ++j) {
      const Step& d = steps[j];
      if (is_op(d, ops::OpId::SoftmaxCrossEntropyGrad) && d.in.size() == 3 && d.out.size() == 1 && d.in[1] == l.in[0] &&
          d.in[2] == l.in[1] && !made_since[d.in[0]] && g.values[d.out[0]].device == g.values[l.out[0]].device) {
        Step both = l;
        both.in.push_back(d.in[0]);
        both.out.push_back(d.out[0]);
        both.xent_both = true;
        steps[i] = std::move(both);
        steps.erase(steps.begin() + static_cast<std::ptrdiff_t>(j));
        ++merged;
        break;
      }
      for (int v : d.out) made_since[v] = 1;
      if (d.head_out >= 0) made_since[d.head_out] = 1;
    }
  }
  return merged;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace detail_plan

}  // namespace stagecraft::graph
