// The executor: a Graph lowered to a flat plan of steps with kernels resolved, fused groups
// prepared and buffers planned ahead; running it allocates only the results' storage.
#pragma once
#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../backend/cuda/allocator.hpp"
#include "../backend/cuda/graph.hpp"
#include "cuda_fused.hpp"
#include "fused_kernel.hpp"
#include "ir.hpp"
#include "op_table.hpp"
#include "passes/fuse.hpp"
#include "passes/memory.hpp"

namespace stagecraft::graph {

/// What lowering made of a graph (ConcreteFunction::stats() reports it with the passes').
struct PlanStats {
  int steps = 0;                      ///< steps the plan runs
  int kernels = 0;                    ///< kernel launches per run (a fused group counts once)
  int fused_groups = 0;               ///< fused elementwise groups
  int fused_nodes = 0;                ///< nodes inside them (matmul heads and reductions included)
  int epilogues = 0;                  ///< groups run as a matmul's epilogue (on a GPU: cuBLASLt's bias/ReLU),
                                      ///< and on a GPU bias gradients summed by the weight gradient's matmul
  int fused_reductions = 0;           ///< groups ending in a reduction
  std::int64_t peak_bytes = 0;        ///< planned buffer memory (with reuse)
  std::int64_t intermediate_bytes = 0;  ///< every intermediate in its own buffer
  int buffers = 0;                    ///< planned buffers
  /// CUDA-graph replay: Plan::cuda_graph_status() when the stats were taken.
  std::string cuda_graph;
};

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
};

/// On a GPU, a dense layer's weight gradient op(x) g (a matmul, g read untransposed) and its bias
/// gradient sum(g, {0}) become one step, one cuBLASLt call, where both are f32 matrices on one
/// device and the later of the two reads nothing made after the earlier (the merged step runs
/// there). Returns how many pairs were merged.
inline int merge_bias_grads(const Graph& g, std::vector<Step>& steps) {
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

}  // namespace detail_plan

/// A graph ready to run. Thread-safe: concurrent runs each take their own run state (values and
/// buffers), made on first need and reused.
class Plan {
 public:
  explicit Plan(std::shared_ptr<const Graph> g, bool fuse = true) : g_(std::move(g)) { lower(fuse); }

  const Graph& graph() const { return *g_; }
  const PlanStats& stats() const { return stats_; }
  /// Number of fused groups and the nodes each holds (for printing).
  const FusionGroups& fusion() const { return groups_; }

  /// Runs the graph on args (already checked against the graph's inputs); returns its outputs
  /// (new handles: they stay valid whatever later runs do). With CUDA graphs on
  /// (cuda::graphs_enabled()), a plan that runs wholly on one GPU is captured on its second run and
  /// replayed from then on.
  std::vector<Tensor> run(std::span<const Tensor> args) const;

  /// Why this plan cannot be replayed as a CUDA graph ("" when it can).
  const std::string& cuda_graph_obstacle() const { return graph_obstacle_; }
  /// What became of CUDA-graph replay: "no (<why>)", "off (...)", "not captured yet", "replaying
  /// (N launches)" or "capture failed (<why>): runs kernel by kernel"; "" for a plan on the CPU.
  std::string cuda_graph_status() const;

 private:
  using Step = detail_plan::Step;
  using StepKind = detail_plan::StepKind;

  struct RunState {
    std::vector<Tensor> vals;               ///< one handle per value; impls persist across runs
    std::vector<std::vector<Tensor>> ins;   ///< per step: its inputs (sharing vals' impls)
    std::vector<std::vector<Tensor>> outs;  ///< per fused step: its outputs
    std::vector<std::vector<Tensor>> head_ins;  ///< per fused step with a matmul head: its inputs
    std::vector<stagecraft::detail::Ref<stagecraft::detail::Storage>> buffers;
    bool capture = false;  ///< a CUDA graph's capture: storage is fixed, variables are copied in and out
    /// Captured: the states of the bodies of its cond and while steps, and storage their copies
    /// pass through, kept as long as the graph.
    std::vector<std::unique_ptr<RunState>> bodies;
    std::vector<Tensor> scratch;
    /// Captured: where each variable read of a body is copied in at every launch (the top level's
    /// copies, before any conditional node runs), shared by the bodies' states.
    std::vector<std::pair<const Node*, Tensor>> hoisted;
    const std::vector<std::pair<const Node*, Tensor>>* reads = nullptr;
  };
  struct GraphRun;
  struct GraphCall;

  GraphCall graph_call(GraphRun& gr, std::span<const Tensor> args) const;
  /// A read_var node and the value it gives.
  struct Read {
    const Node* node = nullptr;
    const Value* value = nullptr;
  };
  /// The variable reads of this plan's cond and while bodies (at any depth), and with `own` its
  /// own reads too.
  void variable_reads(std::vector<Read>& out, bool own) const;
  std::optional<std::vector<Tensor>> run_graph(std::span<const Tensor> args) const;
  std::shared_ptr<GraphRun> capture(std::span<const Tensor> args) const;
  /// Gives every value of st that the memory plan leaves out its own storage on `dev` (the graph
  /// inputs too when `inputs`), so that a capture records fixed addresses.
  void fix_storage(RunState& st, Device dev, bool inputs) const;
  /// Records this plan's steps (a body of a cond or while step) into the capture under way, over
  /// args' storage; the state returned holds every value at its address.
  std::unique_ptr<RunState> capture_body(std::span<const Tensor> args, const RunState& parent) const;
  /// Records a cond or while step as a conditional graph node.
  void capture_control(const Step& s, RunState& st) const;
  std::vector<Tensor> launch(GraphRun& gr, std::span<const Tensor> args) const;
  std::string find_graph_obstacle(int& device) const;
  /// Why this plan cannot be recorded as a body of a conditional node on GPU `device` ("" when it can).
  std::string body_obstacle(int device) const;

  void lower(bool fuse);
  void add_step(Step s) { steps_.push_back(std::move(s)); }
  std::unique_ptr<RunState> make_state() const;
  void run_step(const Step& s, std::size_t i, RunState& st) const;
  /// Binds args to the graph's inputs and runs every step (an error names the node's line).
  void run_steps(RunState& st, std::span<const Tensor> args) const;
  void release(RunState& st) const;

  std::shared_ptr<const Graph> g_;
  std::vector<Step> steps_;
  FusionGroups groups_;
  MemoryPlan mem_;
  PlanStats stats_;
  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<RunState>> free_;
  // CUDA graph replay (see run_graph).
  std::string graph_obstacle_;
  bool on_gpu_ = false;  ///< some value lives on a GPU (else cuda_graph_status() has nothing to say)
  int graph_device_ = -1;
  mutable std::mutex graph_mu_;
  mutable std::shared_ptr<GraphRun> graph_;
  mutable int graph_runs_ = 0;        ///< runs that could have been replayed
  mutable std::int64_t graph_launches_ = 0;
  mutable std::string graph_failure_;  ///< why the capture failed (then never tried again)
};

inline void Plan::lower(bool fuse) {
  const Graph& g = *g_;
  groups_ = fuse ? find_fusion_groups(g) : FusionGroups(g.nodes.size());
  // Assignments of a group's value placed before the group's last node run right after it.
  std::vector<std::vector<Step>> deferred(groups_.groups.size());
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    Step s;
    s.node = static_cast<int>(i);
    s.in = n.inputs;
    s.out = n.outputs;
    switch (n.kind) {
      case NodeKind::input:
      case NodeKind::constant: continue;
      case NodeKind::op: {
        const int grp = groups_.group_of[i];
        if (grp >= 0) {
          if (groups_.groups[grp].nodes.back() != static_cast<int>(i)) continue;  // runs with its last node
          const FusionGroup& fg = groups_.groups[grp];
          s.kind = StepKind::fused;
          s.in = fg.inputs;
          s.out = fg.outputs;
          s.gpu = g.values[fg.outputs[0]].device.is_cuda();
          if (s.gpu) s.cuda_fused = std::make_shared<const CudaFused>(fg.program);
          else s.fused = std::make_shared<const PreparedFused>(prepare(fg.program));
          if (fg.head >= 0) {
            const Node& h = g.nodes[fg.head];
            s.head_fns = &fns(h.op);
            s.head_attrs = h.attrs;
            s.head_in = h.inputs;
            s.head_out = h.outputs[0];
            if (s.gpu) {  // result + bias (then relu): fuse.hpp's gpu_epilogue_head
              const FusedInstr& add = fg.program.code[0];
              const int head_reg = static_cast<int>(std::find(fg.inputs.begin(), fg.inputs.end(), s.head_out) - fg.inputs.begin());
              s.bias = add.a == head_reg ? add.b : add.a;
              s.relu = fg.program.code.size() == 2;
            }
          }
          break;
        }
        s.fns = &fns(n.op);
        s.attrs = n.attrs;
        s.kind = s.fns->cpu ? StepKind::kernel : StepKind::view;
        s.gpu = !n.outputs.empty() && g.values[n.outputs[0]].device.is_cuda();
        break;
      }
      case NodeKind::read_var: s.kind = StepKind::read_var; break;
      case NodeKind::assign_var: {
        s.kind = StepKind::assign_var;
        const int src = g.values[n.inputs[0]].node, grp = groups_.group_of[src];
        if (grp >= 0 && groups_.groups[grp].nodes.back() > static_cast<int>(i)) {
          deferred[grp].push_back(std::move(s));
          continue;
        }
        break;
      }
      case NodeKind::host_fn: s.kind = StepKind::host_fn; break;
      case NodeKind::cond:
        s.kind = StepKind::cond;
        s.sub[0] = std::make_shared<const Plan>(n.bodies[0], fuse);
        s.sub[1] = std::make_shared<const Plan>(n.bodies[1], fuse);
        break;
      case NodeKind::while_loop:
        s.kind = StepKind::while_loop;
        s.sub[0] = std::make_shared<const Plan>(n.bodies[0], fuse);
        s.sub[1] = std::make_shared<const Plan>(n.bodies[1], fuse);
        s.num_loop_vars = n.num_loop_vars;
        break;
    }
    const int grp = s.kind == StepKind::fused ? groups_.group_of[i] : -1;
    add_step(std::move(s));
    if (grp >= 0)
      for (Step& d : deferred[grp]) add_step(std::move(d));
  }
  const int bias_grads = merge_bias_grads(g, steps_);
  // Buffers: values whose storage the plan owns get a planned buffer, reused by liveness.
  std::vector<MemoryPlan::StepUse> uses;
  for (const Step& s : steps_) {
    MemoryPlan::StepUse u;
    u.in = s.head_in;
    u.in.insert(u.in.end(), s.in.begin(), s.in.end());
    if (s.head_out >= 0) u.first_out = {s.head_out};
    u.out = s.kind == StepKind::kernel || s.kind == StepKind::fused ? s.out : std::vector<int>{};
    u.views = s.kind == StepKind::view;
    u.in_place_ok = s.kind == StepKind::fused ||
                    (s.kind == StepKind::kernel && (s.fns->elementwise_unary || s.fns->elementwise_binary));
    // A GPU reduction's rows, and a cuBLASLt epilogue's product, are written while inputs are read.
    u.last_out_apart = s.kind == StepKind::fused && s.gpu && (s.cuda_fused->program().reduction.has_value() || s.bias >= 0);
    uses.push_back(std::move(u));
  }
  mem_ = plan_memory(g, uses);
  stats_.steps = static_cast<int>(steps_.size());
  for (const Step& s : steps_)  // (a GPU group with a matmul head is one cuBLASLt call)
    stats_.kernels += (s.kind == StepKind::kernel || s.kind == StepKind::fused) + (s.head_fns != nullptr && !s.gpu);
  stats_.fused_groups = static_cast<int>(groups_.groups.size());
  stats_.epilogues = bias_grads;
  for (const FusionGroup& fg : groups_.groups) {
    stats_.fused_nodes += static_cast<int>(fg.nodes.size()) + (fg.head >= 0);
    stats_.epilogues += fg.head >= 0;
    stats_.fused_reductions += fg.reduce >= 0;
  }
  stats_.peak_bytes = mem_.total_bytes();
  stats_.intermediate_bytes = g.intermediate_bytes();
  stats_.buffers = static_cast<int>(mem_.buffer_bytes.size());
  graph_obstacle_ = find_graph_obstacle(graph_device_);
  on_gpu_ = std::any_of(g_->values.begin(), g_->values.end(), [](const Value& v) { return v.device.is_cuda(); });
}

inline std::unique_ptr<Plan::RunState> Plan::make_state() const {
  const Graph& g = *g_;
  auto st = std::make_unique<RunState>();
  for (std::size_t b = 0; b < mem_.buffer_bytes.size(); ++b)
    st->buffers.push_back(
        stagecraft::detail::Storage::allocate(static_cast<std::size_t>(mem_.buffer_bytes[b]), mem_.buffer_device[b]));
  st->vals.resize(g.values.size());
  for (std::size_t v = 0; v < g.values.size(); ++v) {
    const Node& n = g.nodes[g.values[v].node];
    if (n.kind == NodeKind::constant) {
      st->vals[v] = n.constant;
      continue;
    }
    auto* impl = new stagecraft::detail::TensorImpl();
    impl->shape = g.values[v].shape;
    impl->dtype = g.values[v].dtype;
    impl->device = g.values[v].device;
    if (mem_.buffer_of[v] >= 0) impl->storage = st->buffers[mem_.buffer_of[v]];
    st->vals[v] = Tensor(stagecraft::detail::Ref<stagecraft::detail::TensorImpl>::adopt(impl));
  }
  st->ins.resize(steps_.size());
  st->outs.resize(steps_.size());
  st->head_ins.resize(steps_.size());
  for (std::size_t i = 0; i < steps_.size(); ++i) {
    for (int v : steps_[i].in) st->ins[i].push_back(st->vals[v]);
    for (int v : steps_[i].head_in) st->head_ins[i].push_back(st->vals[v]);
    if (steps_[i].kind == StepKind::fused)
      for (int v : steps_[i].out) st->outs[i].push_back(st->vals[v]);
  }
  return st;
}

namespace detail_plan {
/// Throws an error of e's kind with message m.
[[noreturn]] inline void rethrow_as(const Error& e, const std::string& m) {
  if (dynamic_cast<const ShapeError*>(&e)) throw ShapeError(m);
  if (dynamic_cast<const DTypeError*>(&e)) throw DTypeError(m);
  if (dynamic_cast<const DeviceError*>(&e)) throw DeviceError(m);
  if (dynamic_cast<const StagingError*>(&e)) throw StagingError(m);
  if (dynamic_cast<const IOError*>(&e)) throw IOError(m);
  if (dynamic_cast<const ValueError*>(&e)) throw ValueError(m);
  throw Error(m);
}

/// Rethrows a kernel's error (same kind) with the user's line of the node that raised it, when
/// the message does not name a line yet.
[[noreturn]] inline void rethrow_at(const Error& e, const SrcLoc& loc) {
  std::string m = e.what();
  const std::string at = detail_ir::loc_text(loc);
  // Already located when it ends in " at file:line".
  const std::size_t p = m.rfind(" at "), colon = m.rfind(':');
  const bool located = p != std::string::npos && colon != std::string::npos && colon > p && colon + 1 < m.size() &&
                       m.find_first_not_of("0123456789", colon + 1) == std::string::npos;
  if (!at.empty() && !located) m += " at " + at + " (while running a staged function)";
  rethrow_as(e, m);
}

/// Rethrows an error a CUDA hook raised naming `here` (the plan's own line, the hooks take a
/// std::source_location) without that line, so that rethrow_at names the node's.
[[noreturn]] inline void rethrow_unlocated(const Error& e, const std::source_location& here) {
  std::string m = e.what();
  const std::string suffix = " at " + stagecraft::detail::where(here);
  if (m.size() >= suffix.size() && m.compare(m.size() - suffix.size(), suffix.size(), suffix) == 0)
    m.erase(m.size() - suffix.size());
  rethrow_as(e, m);
}

/// A new handle over a run value's current storage (what leaves the plan: results, assigned
/// variable values, host_fn arguments).
inline Tensor detach(const Tensor& slot) {
  auto* impl = new stagecraft::detail::TensorImpl();
  impl->shape = slot.shape();
  impl->dtype = slot.dtype();
  impl->device = slot.device();
  impl->storage = slot.impl()->storage;
  return Tensor(stagecraft::detail::Ref<stagecraft::detail::TensorImpl>::adopt(impl));
}
inline void rebind(const Tensor& slot, const Tensor& src) { slot.impl()->storage = src.impl()->storage; }
/// A new tensor of slot's shape, dtype and device with storage of its own (contents unset).
inline Tensor new_like(const Tensor& slot) {
  return stagecraft::detail::empty_tensor(slot.shape(), slot.dtype(), slot.device(), "cuda graph");
}
}  // namespace detail_plan

inline std::vector<Tensor> Plan::run(std::span<const Tensor> args) const {
  if (SC_UNLIKELY(graph_device_ >= 0) && graph_obstacle_.empty() && cuda::graphs_enabled())
    if (auto out = run_graph(args)) return std::move(*out);
  std::unique_ptr<RunState> st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      st = std::move(free_.back());
      free_.pop_back();
    }
  }
  if (!st) st = make_state();
  struct GiveBack {
    const Plan* p;
    std::unique_ptr<RunState>& st;
    ~GiveBack() {
      p->release(*st);
      std::lock_guard<std::mutex> lock(p->mu_);
      p->free_.push_back(std::move(st));
    }
  } give_back{this, st};
  const Graph& g = *g_;
  run_steps(*st, args);
  std::vector<Tensor> out;
  out.reserve(g.outputs.size());
  for (int v : g.outputs) {
    const Tensor& slot = st->vals[v];
    out.push_back(g.nodes[g.values[v].node].kind == NodeKind::constant ? slot : detail_plan::detach(slot));
  }
  return out;
}

inline void Plan::run_steps(RunState& st, std::span<const Tensor> args) const {
  const Graph& g = *g_;
  for (std::size_t i = 0; i < g.inputs.size(); ++i) detail_plan::rebind(st.vals[g.inputs[i]], args[i]);
  for (std::size_t i = 0; i < steps_.size(); ++i) {
    try {
      run_step(steps_[i], i, st);
    } catch (const Error& e) {
      detail_plan::rethrow_at(e, g.nodes[steps_[i].node].loc);
    }
  }
}

inline void Plan::release(RunState& st) const {
  // Drop what the plan does not own, so it keeps no user tensor or old variable value alive.
  for (std::size_t v = 0; v < st.vals.size(); ++v)
    if (mem_.buffer_of[v] < 0 && g_->nodes[g_->values[v].node].kind != NodeKind::constant)
      st.vals[v].impl()->storage = {};
}

namespace detail_plan {
/// A cond node's inputs after the predicate: then-branch captures (attrs.i0 of them), then
/// else-branch captures; branch b's arguments.
inline std::vector<Tensor> select_branch_args(const std::vector<Tensor>& args, const Node& n, int b) {
  const auto k = static_cast<std::ptrdiff_t>(n.attrs.i0);
  if (b == 0) return {args.begin(), args.begin() + k};
  return {args.begin() + k, args.end()};
}
/// Runs a while node: loop variables, then cond captures (attrs.i0), then body captures.
inline std::int64_t run_while(const Plan& cond, const Plan& body, const Node& n, std::vector<Tensor>& vars,
                              const std::vector<Tensor>& caps) {
  const auto k = static_cast<std::ptrdiff_t>(n.attrs.i0);
  std::vector<Tensor> args;
  std::int64_t count = 0;
  for (;; ++count) {
    args.assign(vars.begin(), vars.end());
    args.insert(args.end(), caps.begin(), caps.begin() + k);
    if (!cond.run(args)[0].item<bool>()) break;
    args.assign(vars.begin(), vars.end());
    args.insert(args.end(), caps.begin() + k, caps.end());
    vars = body.run(args);
  }
  return count;
}
}  // namespace detail_plan

inline void Plan::run_step(const Step& s, std::size_t i, RunState& st) const {
  const Graph& g = *g_;
  const Node& n = g.nodes[s.node];
  auto fresh = [&](int v) {
    if (mem_.buffer_of[v] < 0 && !st.capture) {
      const Tensor& t = st.vals[v];
      t.impl()->storage = stagecraft::detail::Storage::allocate(t.nbytes(), t.device());
    }
  };
  switch (s.kind) {
    case StepKind::kernel: {
      for (int v : s.out) fresh(v);
      if (SC_UNLIKELY(s.gpu)) {
        if (s.fns->cuda == nullptr)
          stagecraft::detail::fail_at<DeviceError>(ops::op_info(n.op).name, n.loc.file, n.loc.line, "has no kernel for ",
                                                   g.values[s.out[0]].device.str(), " in this build");
        const stagecraft::detail::LocOverride at(n.loc);  // what a kernel reports later names the node's line
        const std::source_location here = std::source_location::current();
        try {
          if (s.bgrad_fns == nullptr) {
            s.fns->cuda(st.ins[i], st.vals[s.out[0]], s.attrs, here);
          } else if (!backend::cuda::gemm_bgrad(st.ins[i][0], st.ins[i][1], s.attrs.i0 != 0, st.vals[s.out[0]],
                                                st.vals[s.out[1]], here)) {
            s.fns->cuda(st.ins[i], st.vals[s.out[0]], s.attrs, here);
            s.bgrad_fns->cuda(std::span<const Tensor>(&st.ins[i][1], 1), st.vals[s.out[1]], s.bgrad_attrs, here);
          }
        } catch (const Error& e) {
          detail_plan::rethrow_unlocated(e, here);
        }
      } else {
        s.fns->cpu(st.ins[i], st.vals[s.out[0]], s.attrs);
      }
      break;
    }
    case StepKind::fused: {
      if (s.head_fns && !s.gpu) {
        fresh(s.head_out);
        s.head_fns->cpu(st.head_ins[i], st.vals[s.head_out], s.head_attrs);
      }
      for (int v : s.out) fresh(v);
      if (s.gpu) {
        const stagecraft::detail::LocOverride at(n.loc);
        const std::source_location here = std::source_location::current();
        try {
          // A matmul head: one cuBLASLt call with a bias (and ReLU) epilogue; where cuBLASLt has
          // no algorithm, the product and then the group's kernel, as without a head.
          if (s.head_fns && backend::cuda::gemm_bias(st.head_ins[i][0], st.head_ins[i][1], st.ins[i][s.bias], s.relu,
                                                      s.head_attrs.i0 != 0, s.head_attrs.i1 != 0, st.outs[i][0], here))
            break;
          if (s.head_fns) {
            fresh(s.head_out);
            s.head_fns->cuda(st.head_ins[i], st.vals[s.head_out], s.head_attrs, here);
          }
          s.cuda_fused->run(st.ins[i], st.outs[i], here);
        } catch (const Error& e) {
          detail_plan::rethrow_unlocated(e, here);
        }
      } else {
        graph::run(*s.fused, st.ins[i], st.outs[i]);
      }
      break;
    }
    case StepKind::view: detail_plan::rebind(st.vals[s.out[0]], st.vals[s.in[0]]); break;
    case StepKind::read_var: {
      if (st.capture) {  // the graph copies the value in at each launch (a body's into a slot of the top level's)
        if (st.reads)
          for (const auto& [node, slot] : *st.reads)
            if (node == &n) detail_plan::rebind(st.vals[s.out[0]], slot);
        break;
      }
      std::lock_guard<std::mutex> lock(n.var->mu);
      if (SC_UNLIKELY(n.var->value.shape() != g.values[s.out[0]].shape || n.var->value.dtype() != g.values[s.out[0]].dtype))
        stagecraft::detail::fail_at<StagingError>("read_var", n.loc.file, n.loc.line, "variable '", n.var->name, "' changed shape or dtype since it was traced");
      detail_plan::rebind(st.vals[s.out[0]], n.var->value);
      break;
    }
    case StepKind::assign_var: {
      if (st.capture) break;  // assigned after each launch, from the value copied out
      Tensor v = detail_plan::detach(st.vals[s.in[0]]);
      n.var->set(v);  // swaps the handle under the variable's lock
      break;
    }
    case StepKind::host_fn: {
      std::vector<Tensor> args;
      for (int v : s.in) args.push_back(detail_plan::detach(st.vals[v]));
      std::vector<Tensor> res = n.host->fn(args);
      const auto& specs = n.host->outputs;
      if (res.size() != specs.size())
        stagecraft::detail::fail_at<ValueError>("host_fn", n.loc.file, n.loc.line, "the function returned ", res.size(),
                                    " tensors, its output specs promise ", specs.size());
      for (std::size_t k = 0; k < res.size(); ++k) {
        if (!res[k].defined() || res[k].is_symbolic() || res[k].shape() != specs[k].shape || res[k].dtype() != specs[k].dtype)
          stagecraft::detail::fail_at<ValueError>("host_fn", n.loc.file, n.loc.line, "output ", k, " is ",
                                      res[k].defined() ? std::string(name(res[k].dtype())) + res[k].shape().str() : std::string("undefined"),
                                      ", its spec says ", name(specs[k].dtype), specs[k].shape);
        detail_plan::rebind(st.vals[s.out[k]], res[k]);
      }
      break;
    }
    case StepKind::cond: {
      if (st.capture) {
        capture_control(s, st);
        break;
      }
      const bool p = st.vals[s.in[0]].item<bool>();
      std::vector<Tensor> args;
      for (std::size_t k = 1; k < s.in.size(); ++k) args.push_back(st.vals[s.in[k]]);
      const Plan& body = *s.sub[p ? 0 : 1];
      std::vector<Tensor> res = body.run(detail_plan::select_branch_args(args, n, p ? 0 : 1));
      for (std::size_t k = 0; k < res.size(); ++k) detail_plan::rebind(st.vals[s.out[k]], res[k]);
      break;
    }
    case StepKind::while_loop: {
      if (st.capture) {
        capture_control(s, st);
        break;
      }
      std::vector<Tensor> vars, captured;
      for (int k = 0; k < s.num_loop_vars; ++k) vars.push_back(st.vals[s.in[k]]);
      for (std::size_t k = s.num_loop_vars; k < s.in.size(); ++k) captured.push_back(st.vals[s.in[k]]);
      const std::int64_t count = detail_plan::run_while(*s.sub[0], *s.sub[1], n, vars, captured);
      for (std::size_t k = 0; k < vars.size(); ++k) detail_plan::rebind(st.vals[s.out[k]], vars[k]);
      if (s.out.size() > vars.size()) detail_plan::rebind(st.vals[s.out.back()], scalar(count));
      break;
    }
  }
}

// ---- CUDA graph replay ---------------------------------------------------------------------
//
// A plan that runs wholly on one GPU (its kernels and fused groups there, no host function, no
// CPU value; its cond and while steps conditional nodes, see capture_control) runs kernel by
// kernel on its first call; the second call captures
// its launches into a CUDA graph over storage the graph owns, and every call from then on is one
// graph launch: copy nodes bring the arguments and the variables' current values in, the captured
// kernels run, copy nodes carry the results and the assigned values out into new tensors. The
// host does not wait; the results are ready in stream order like any kernel's.

/// The captured graph of a plan and the storage its kernels were captured over.
struct Plan::GraphRun {
  struct In {
    Tensor slot;         ///< the fixed tensor it fills
    int arg = -1;        ///< an argument's index, or -1: a variable read
    Read read;           ///< the read_var node (of this plan or of a body) and its value
  };
  std::unique_ptr<RunState> st;  ///< every value at a fixed address
  cuda::detail::CaptureHold hold;
  cuda::abi::GraphExec exec = nullptr;
  bool armed = false;
  std::vector<In> ins;    ///< copied in at each launch (values of 0 bytes left out)
  std::vector<int> outs;  ///< values copied out (escaping, not constant, not empty), each once
  GraphRun() = default;
  GraphRun(const GraphRun&) = delete;
  GraphRun& operator=(const GraphRun&) = delete;
  ~GraphRun() {
#if defined(STAGECRAFT_WITH_CUDA)
    cuda::abi::graph_destroy(exec);  // a launch in flight finishes first
#endif
    st.reset();
    cuda::detail::release_hold(hold);
  }
};

inline std::string Plan::find_graph_obstacle(int& device) const {
  device = -1;
  const Graph& g = *g_;
  if (std::none_of(g.values.begin(), g.values.end(), [](const Value& v) { return v.device.is_cuda(); }))
    return "it runs on the CPU";  // (cuda_graph_status() says nothing then)
  for (const Value& v : g.values) {
    if (!v.device.is_cuda()) return "it holds " + v.device.str() + " values";
    if (device >= 0 && v.device.index() != device) return "it spans several GPUs";
    device = v.device.index();
  }
  if (device < 0) return "it has no values";
  bool kernels = false;
  std::vector<const stagecraft::detail::VariableState*> assigned;
  for (const Step& s : steps_) {
    const Node& n = g.nodes[s.node];
    switch (s.kind) {
      case StepKind::kernel:
        if (s.fns->cuda == nullptr) return std::string("[") + std::string(ops::op_info(n.op).name) + "] has no CUDA kernel";
        kernels = true;
        break;
      case StepKind::fused:
        if (s.head_fns != nullptr && !s.gpu) return "a fused group has a matmul head";
        kernels = true;
        break;
      case StepKind::view: break;
      case StepKind::read_var:
        if (std::find(assigned.begin(), assigned.end(), n.var.get()) != assigned.end())
          return "it reads variable '" + n.var->name + "' after assigning it";
        break;
      case StepKind::assign_var: assigned.push_back(n.var.get()); break;
      case StepKind::host_fn: return "it calls a host function";
      case StepKind::cond:
      case StepKind::while_loop: {
        const bool is_cond = s.kind == StepKind::cond;
        std::vector<Read> reads;
        for (int b = 0; b < 2; ++b) {
          const std::string o = s.sub[b]->body_obstacle(device);
          if (!o.empty())
            return std::string(is_cond ? (b == 0 ? "its cond's true branch: " : "its cond's false branch: ")
                                       : (b == 0 ? "its while_loop's condition: " : "its while_loop's body: ")) + o;
          s.sub[b]->variable_reads(reads, true);
        }
        for (const Read& r : reads)  // (a body's reads are copied in when the graph starts)
          if (std::find(assigned.begin(), assigned.end(), r.node->var.get()) != assigned.end())
            return "it reads variable '" + r.node->var->name + "' after assigning it";
        kernels = true;  // (the node's condition is set by a kernel)
        break;
      }
    }
  }
  if (!kernels) return "it launches no kernel";
  return "";
}

inline std::string Plan::body_obstacle(int device) const {
  // A body that launches nothing (it passes values through) is recorded as its copies.
  if (!graph_obstacle_.empty() && graph_obstacle_ != "it launches no kernel") return graph_obstacle_;
  if (graph_device_ != device) return "it runs on " + (graph_device_ < 0 ? std::string("no device") : Device::cuda(graph_device_).str());
  // A variable's new value leaves a graph by a copy after the launch, where a body may have
  // assigned it any number of times.
  for (const Step& s : steps_)
    if (s.kind == StepKind::assign_var) return "it assigns variable '" + g_->nodes[s.node].var->name + "'";
  return "";
}

inline void Plan::variable_reads(std::vector<Read>& out, bool own) const {
  for (const Step& s : steps_) {
    if (own && s.kind == StepKind::read_var) out.push_back({&g_->nodes[s.node], &g_->values[s.out[0]]});
    if (s.kind == StepKind::cond || s.kind == StepKind::while_loop)
      for (int b = 0; b < 2; ++b) s.sub[b]->variable_reads(out, true);
  }
}

inline std::string Plan::cuda_graph_status() const {
  if (!on_gpu_) return "";  // nothing to say
  if (!graph_obstacle_.empty()) return "no (" + graph_obstacle_ + ")";
  std::lock_guard<std::mutex> lock(graph_mu_);
  if (!graph_failure_.empty()) return "capture failed (" + graph_failure_ + "): runs kernel by kernel";
  if (graph_) return "replaying (" + std::to_string(graph_launches_) + " launches)";
  return cuda::graphs_enabled() ? "not captured yet" : "off (cuda::set_graphs(true) turns it on)";
}

namespace detail_plan {
/// v may stand for the value `want` of read_var node n.
inline void check_read(const Node& n, const Value& want, const Tensor& v) {
  if (SC_UNLIKELY(v.shape() != want.shape || v.dtype() != want.dtype))
    stagecraft::detail::fail_at<StagingError>("read_var", n.loc.file, n.loc.line, "variable '", n.var->name,
                                              "' changed shape or dtype since it was traced");
  if (SC_UNLIKELY(v.device() != want.device))
    stagecraft::detail::fail_at<DeviceError>("read_var", n.loc.file, n.loc.line, "variable '", n.var->name, "' moved to ",
                                             v.device().str(), " since it was traced on ", want.device.str());
}
}  // namespace detail_plan

inline std::optional<std::vector<Tensor>> Plan::run_graph(std::span<const Tensor> args) const {
#if defined(STAGECRAFT_WITH_CUDA)
  for (const Tensor& a : args)  // a call with an argument elsewhere runs kernel by kernel
    if (a.device() != Device::cuda(graph_device_)) return std::nullopt;
  std::lock_guard<std::mutex> lock(graph_mu_);
  if (!graph_failure_.empty()) return std::nullopt;
  if (!graph_) {
    if (graph_runs_++ == 0) return std::nullopt;  // the first run warms up (compiles, loads, allocates)
    // A variable changed since the trace is the caller's error (raised here, as the plan would),
    // not a reason to give up on the graph.
    std::vector<Read> reads;
    variable_reads(reads, true);
    for (const Read& r : reads) detail_plan::check_read(*r.node, *r.value, r.node->var->get());
    try {
      graph_ = capture(args);
    } catch (const Error& e) {
      graph_failure_ = e.what();
      return std::nullopt;  // the plan runs as before, and raises what a real error is
    }
  }
  return launch(*graph_, args);
#else
  (void)args;
  return std::nullopt;
#endif
}


/// One call's copies (this call's arguments and variable values in, new result tensors out).
struct Plan::GraphCall {
  std::vector<cuda::abi::GraphCopy> in, out;
  std::vector<Tensor> keep;   ///< the variables' values read, alive until the launch is queued
  std::vector<Tensor> fresh;  ///< by value: the new tensor of each value copied out
};

inline Plan::GraphCall Plan::graph_call(GraphRun& gr, std::span<const Tensor> args) const {
  const Graph& g = *g_;
  const RunState& st = *gr.st;
  GraphCall c;
  for (const GraphRun::In& in : gr.ins) {
    Tensor src;
    if (in.arg >= 0) {
      src = args[in.arg];
    } else {
      src = in.read.node->var->get();
      detail_plan::check_read(*in.read.node, *in.read.value, src);
      c.keep.push_back(src);
    }
    c.in.push_back({in.slot.raw_data(), src.raw_data(), src.nbytes()});
  }
  c.fresh.resize(g.values.size());
  for (int v : gr.outs) {
    c.fresh[v] = detail_plan::new_like(st.vals[v]);
    c.out.push_back({c.fresh[v].raw_data(), st.vals[v].raw_data(), st.vals[v].nbytes()});
  }
  return c;
}

inline std::shared_ptr<Plan::GraphRun> Plan::capture(std::span<const Tensor> args) const {
  auto gr = std::make_shared<GraphRun>();
#if defined(STAGECRAFT_WITH_CUDA)
  const Graph& g = *g_;
  const Device dev = Device::cuda(graph_device_);
  const std::source_location here = std::source_location::current();
  const cuda::detail::ScopedCallSite site("cuda graph", here);
  gr->st = make_state();
  RunState& st = *gr->st;
  st.capture = true;
  fix_storage(st, dev, true);  // inputs, reads, results
  for (std::size_t i = 0; i < g.inputs.size(); ++i)
    if (st.vals[g.inputs[i]].nbytes() > 0) gr->ins.push_back({st.vals[g.inputs[i]], static_cast<int>(i), {}});
  for (const Step& s : steps_)
    if (s.kind == StepKind::read_var && st.vals[s.out[0]].nbytes() > 0)
      gr->ins.push_back({st.vals[s.out[0]], -1, {&g.nodes[s.node], &g.values[s.out[0]]}});
  // The bodies' variable reads: slots the top level fills at every launch, before any body runs.
  std::vector<Read> body_reads;
  variable_reads(body_reads, false);
  for (const Read& r : body_reads) {
    const Tensor slot = stagecraft::detail::empty_tensor(r.value->shape, r.value->dtype, dev, "cuda graph");
    st.hoisted.emplace_back(r.node, slot);
    if (slot.nbytes() > 0) gr->ins.push_back({slot, -1, r});
  }
  st.reads = &st.hoisted;
  auto escape = [&](int v) {
    if (g.nodes[g.values[v].node].kind == NodeKind::constant || st.vals[v].nbytes() == 0) return;
    if (std::find(gr->outs.begin(), gr->outs.end(), v) == gr->outs.end()) gr->outs.push_back(v);
  };
  for (int v : g.outputs) escape(v);
  for (const Step& s : steps_)
    if (s.kind == StepKind::assign_var) escape(s.in[0]);

  // The capture records this call's copies (their pointers are replaced at every launch).
  const GraphCall c = graph_call(*gr, args);
  auto copy = [&](const cuda::abi::GraphCopy& k) {
    cuda::detail::copy(k.dst, dev, k.src, dev, k.bytes, "cuda graph", here);
  };
  cuda::detail::check(cuda::abi::capture_begin(graph_device_), dev, "cuda graph", here);
  cuda::abi::GraphBody body = nullptr;
  bool armed = false;
  try {
    const cuda::detail::CaptureScope hold(gr->hold, graph_device_);
    for (const auto& k : c.in) copy(k);
    for (std::size_t i = 0; i < steps_.size(); ++i) run_step(steps_[i], i, st);
    for (const auto& k : c.out) copy(k);
  } catch (...) {
    (void)cuda::abi::capture_end(graph_device_, &body, &armed);
    cuda::abi::graph_body_destroy(body);
    throw;
  }
  cuda::detail::check(cuda::abi::capture_end(graph_device_, &body, &armed), dev, "cuda graph", here);
  gr->armed = armed;
  cuda::detail::check(cuda::abi::graph_instantiate(graph_device_, body, c.in.data(), static_cast<int>(c.in.size()),
                                                   c.out.data(), static_cast<int>(c.out.size()), &gr->exec),
                      dev, "cuda graph", here);
#else
  (void)args;
#endif
  return gr;
}

inline void Plan::fix_storage(RunState& st, Device dev, bool inputs) const {
  const Graph& g = *g_;
  std::vector<char> skip(g.values.size(), 0);
  for (const Step& s : steps_)
    if (s.kind == StepKind::view) skip[s.out[0]] = 1;  // shares its source's storage
  if (!inputs)
    for (int v : g.inputs) skip[v] = 1;
  for (std::size_t v = 0; v < g.values.size(); ++v) {
    const Tensor& t = st.vals[v];
    if (mem_.buffer_of[v] >= 0 || skip[v] || g.nodes[g.values[v].node].kind == NodeKind::constant) continue;
    t.impl()->storage = stagecraft::detail::Storage::allocate(t.nbytes(), dev);
  }
}

inline std::unique_ptr<Plan::RunState> Plan::capture_body(std::span<const Tensor> args, const RunState& parent) const {
  auto st = make_state();
  st->capture = true;
  st->reads = parent.reads;
  fix_storage(*st, Device::cuda(graph_device_), false);
  run_steps(*st, args);
  return st;
}

// A cond is an if/else node whose condition a kernel sets from the predicate; each branch's
// steps are recorded into its body, followed by copies of its results into the cond's outputs.
// A while_loop copies its initial values into its outputs, which carry the loop variables from
// then on: its condition's steps are recorded before the node (on the initial values), and the
// body holds the body's steps, copies of its results back into the outputs, then the condition's
// steps again, whose result sets the node's condition for the next round (and counts the round).
inline void Plan::capture_control(const Step& s, RunState& st) const {
#if defined(STAGECRAFT_WITH_CUDA)
  const Graph& g = *g_;
  const Node& n = g.nodes[s.node];
  const Device dev = Device::cuda(graph_device_);
  const int device = graph_device_;
  const std::source_location here = std::source_location::current();
  auto check = [&](cuda::abi::Status e) { cuda::detail::check(e, dev, "cuda graph", here); };
  auto copy = [&](const Tensor& dst, const Tensor& src) {
    if (dst.nbytes() == 0 || dst.raw_data() == src.raw_data()) return;
    cuda::detail::copy(dst.raw_data(), dev, src.raw_data(), dev, dst.nbytes(), "cuda graph", here);
  };
  auto output = [](const Plan& p, const RunState& b, std::size_t k) -> const Tensor& {
    return b.vals[p.g_->outputs[k]];
  };
  auto dt = [](const Tensor& t) { return static_cast<cuda::abi::DT>(t.dtype()); };
  struct Free {  // the node's record, and a body left open by an error
    cuda::abi::CondNode node = nullptr;
    ~Free() { cuda::abi::capture_cond_free(node); }
  } rec;
  std::vector<Tensor> in;
  for (int v : s.in) in.push_back(st.vals[v]);
  if (s.kind == StepKind::cond) {
    const std::vector<Tensor> args(in.begin() + 1, in.end());
    check(cuda::abi::capture_if(device, in[0].raw_data(), dt(in[0]), &rec.node));
    for (int b = 0; b < 2; ++b) {
      const Plan& body = *s.sub[b];
      check(cuda::abi::capture_body_begin(rec.node, b));
      std::unique_ptr<RunState> bs = body.capture_body(detail_plan::select_branch_args(args, n, b), st);
      for (std::size_t k = 0; k < s.out.size(); ++k) copy(st.vals[s.out[k]], output(body, *bs, k));
      check(cuda::abi::capture_body_end(rec.node));
      st.bodies.push_back(std::move(bs));
    }
    return;
  }
  const auto nv = static_cast<std::size_t>(s.num_loop_vars);
  const auto k_cond = static_cast<std::size_t>(n.attrs.i0);
  const Plan& cond = *s.sub[0];
  const Plan& body = *s.sub[1];
  std::vector<Tensor> vars(nv), cond_args, body_args;
  for (std::size_t j = 0; j < nv; ++j) {
    vars[j] = st.vals[s.out[j]];  // carries the loop variables
    copy(vars[j], in[j]);
  }
  cond_args = vars;
  cond_args.insert(cond_args.end(), in.begin() + static_cast<std::ptrdiff_t>(nv),
                   in.begin() + static_cast<std::ptrdiff_t>(nv + k_cond));
  body_args = vars;
  body_args.insert(body_args.end(), in.begin() + static_cast<std::ptrdiff_t>(nv + k_cond), in.end());
  auto* count = s.out.size() > nv && st.vals[s.out.back()].nbytes() > 0
                    ? static_cast<std::int64_t*>(st.vals[s.out.back()].raw_data())
                    : nullptr;
  std::unique_ptr<RunState> first = cond.capture_body(cond_args, st);
  const Tensor& p0 = output(cond, *first, 0);
  check(cuda::abi::capture_while(device, p0.raw_data(), dt(p0), count, &rec.node));
  st.bodies.push_back(std::move(first));
  check(cuda::abi::capture_body_begin(rec.node, 0));
  std::unique_ptr<RunState> bs = body.capture_body(body_args, st);
  // A result in a loop variable's storage (passed through, or a view of one) other than its own
  // is staged first: the copies must read every old value before they write a new one.
  std::vector<Tensor> src(nv);
  for (std::size_t j = 0; j < nv; ++j) {
    src[j] = output(body, *bs, j);
    const auto* storage = src[j].impl()->storage.get();
    const bool shared = std::any_of(vars.begin(), vars.end(), [&](const Tensor& v) { return v.impl()->storage.get() == storage; });
    if (shared && src[j].raw_data() != vars[j].raw_data() && src[j].nbytes() > 0) {
      Tensor staged = detail_plan::new_like(vars[j]);
      copy(staged, src[j]);
      st.scratch.push_back(staged);
      src[j] = staged;
    }
  }
  for (std::size_t j = 0; j < nv; ++j) copy(vars[j], src[j]);
  std::unique_ptr<RunState> next = cond.capture_body(cond_args, st);
  const Tensor& p1 = output(cond, *next, 0);
  check(cuda::abi::capture_while_next(rec.node, p1.raw_data(), dt(p1), count));
  check(cuda::abi::capture_body_end(rec.node));
  st.bodies.push_back(std::move(bs));
  st.bodies.push_back(std::move(next));
#else
  (void)s, (void)st;
#endif
}

inline std::vector<Tensor> Plan::launch(GraphRun& gr, std::span<const Tensor> args) const {
  const Graph& g = *g_;
  std::vector<Tensor> out;
#if defined(STAGECRAFT_WITH_CUDA)
  const Device dev = Device::cuda(graph_device_);
  const std::source_location here = std::source_location::current();
  const cuda::detail::ScopedCallSite site("cuda graph", here);
  GraphCall c = graph_call(gr, args);
  cuda::detail::check(cuda::abi::graph_launch(gr.exec, c.in.data(), static_cast<int>(c.in.size()), c.out.data(),
                                              static_cast<int>(c.out.size()), gr.armed),
                      dev, "cuda graph", here);
  ++graph_launches_;
  auto result = [&](int v) -> Tensor {
    if (c.fresh[v].defined()) return c.fresh[v];
    const Tensor& slot = gr.st->vals[v];
    if (g.nodes[g.values[v].node].kind == NodeKind::constant) return slot;
    return detail_plan::new_like(slot);  // no elements: nothing to copy
  };
  for (const Step& s : steps_)
    if (s.kind == StepKind::assign_var) g.nodes[s.node].var->set(result(s.in[0]));
  out.reserve(g.outputs.size());
  for (int v : g.outputs) out.push_back(result(v));
#else
  (void)gr, (void)args, (void)g;
#endif
  return out;
}

}  // namespace stagecraft::graph
