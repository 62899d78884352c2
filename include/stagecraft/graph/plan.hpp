// The executor: a Graph lowered to a flat plan of steps with kernels resolved, fused groups
// prepared and buffers planned ahead; running it allocates only the results' storage.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../backend/cuda/allocator.hpp"
#include "../backend/cuda/graph.hpp"
#include "cuda_fused.hpp"
#include "cuda_fused_batch.hpp"
#include "fused_kernel.hpp"
#include "ir.hpp"
#include "op_table.hpp"
#include "passes/dce.hpp"
#include "passes/fuse.hpp"
#include "passes/memory.hpp"
#include "plan_rows.hpp"
#include "plan_steps.hpp"

namespace stagecraft::graph {

/// What lowering made of a graph (ConcreteFunction::stats() reports it with the passes').
struct PlanStats {
  int steps = 0;                      ///< steps the plan runs
  int kernels = 0;                    ///< kernel launches per run (a fused group once; on a GPU twice where its reduction takes two)
  int fused_groups = 0;               ///< fused elementwise groups
  int fused_nodes = 0;                ///< nodes inside them (matmul heads and reductions included)
  int epilogues = 0;                  ///< groups run as a matmul's epilogue (on a GPU: cuBLASLt's bias/ReLU),
                                      ///< and on a GPU bias gradients summed by the weight gradient's matmul
  int fused_reductions = 0;           ///< groups ending in a reduction
  int fused_products = 0;             ///< small products formed inside the group that reads them (FusedProduct)
  int fused_concats = 0;              ///< concats written by the group of their pieces (FusedProgram::out_windows)
  int batched_groups = 0;             ///< GPU fused groups launched together with others (CudaFusedBatch)
  int losses_with_gradient = 0;       ///< GPU cross-entropy losses computed with their gradient (one kernel)
  int specialized = 0;                ///< CPU groups run by a specialized kernel (fused_special.hpp)
  int row_chains = 0;                 ///< runs of CPU steps run a block of rows at a time (plan_rows.hpp)
  std::int64_t peak_bytes = 0;        ///< planned buffer memory (with reuse)
  std::int64_t intermediate_bytes = 0;  ///< every intermediate in its own buffer
  int buffers = 0;                    ///< planned buffers
  int pieces_in_place = 0;            ///< concat pieces their own steps write into the concat's buffer
  int concats_dropped = 0;            ///< concats left with nothing to copy (every piece in place)
  /// CUDA-graph replay: Plan::cuda_graph_status() when the stats were taken.
  std::string cuda_graph;
  /// Bytes a replay copies per call (arguments and variable values in, results out) and the
  /// kernels it saves launching (its cond and while bodies' counted once), for a plan that can be
  /// captured; 0 otherwise. GraphPolicy::when_cheaper compares the two.
  std::int64_t cuda_graph_copy_bytes = 0;
  std::int64_t cuda_graph_launches = 0;
};

/// Whether plans time the host's work for each step as they run (off by default; for profiling:
/// bench/profile_cuda_steps turns it on). Plan::host_times() then gives each step's mean, and
/// Plan::str() prints it: for a GPU step, the host's time to queue its kernels (dispatch, checks,
/// the launch calls), which bounds a step run kernel by kernel when the GPU keeps up.
STAGECRAFT_COMPILED_INLINE bool& plan_host_timing();
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE bool& plan_host_timing() {
  static bool on = false;
  return on;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// A graph ready to run. Thread-safe: concurrent runs each take their own run state (values and
/// buffers), made on first need and reused.
class Plan {
 public:
  /// Lowers g (less its custom_gradient nodes, which only gradients use).
  explicit Plan(std::shared_ptr<const Graph> g, bool fuse = true) : g_(without_custom_gradients(std::move(g))) { lower(fuse); }

  const Graph& graph() const { return *g_; }
  const PlanStats& stats() const { return stats_; }
  /// Number of fused groups and the nodes each holds (for printing).
  const FusionGroups& fusion() const { return groups_; }

  /// Runs the graph on args (already checked against the graph's inputs); returns its outputs
  /// (new handles: they stay valid whatever later runs do). With CUDA graphs on
  /// (cuda::graph_policy()), a plan that runs wholly on one GPU is captured on its second run and
  /// replayed from then on.
  std::vector<Tensor> run(std::span<const Tensor> args) const;

  /// Why this plan cannot be replayed as a CUDA graph ("" when it can).
  const std::string& cuda_graph_obstacle() const { return graph_obstacle_; }
  /// What became of CUDA-graph replay: "no (<why>)", "off (...)", "kernel by kernel (<why the
  /// policy when_cheaper leaves it>)", "not captured yet", "replaying (N launches)" or "capture
  /// failed (<why>): runs kernel by kernel"; "" for a plan on the CPU.
  std::string cuda_graph_status() const;
  /// The steps, one line each (plan_listing.hpp): kernels, views, variable reads and assignments,
  /// fused groups with their ops (a GPU batch with each group), control flow with its bodies;
  /// each step's host time first where runs were timed (plan_host_timing).
  std::string str(int indent = 0) const;
  /// The host's mean time per run of each step in microseconds, over the runs made while
  /// plan_host_timing() was on (empty before any); a cond or while step's includes its bodies'.
  /// (A run replayed as a CUDA graph is one launch: not timed here.)
  std::vector<double> host_times() const;

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
  /// The kernels one run launches, its cond and while bodies' counted once each.
  std::int64_t launches_per_run() const;
  /// The values a graph of this plan copies out at each launch: its results and the values it
  /// assigns to variables, each once, constants left out.
  std::vector<int> graph_escapes() const;
  /// What a graph of this plan would copy per call: arguments and variable values in, results
  /// and assigned values out.
  std::int64_t graph_copy_bytes() const;
  /// Why GraphPolicy::when_cheaper leaves this plan kernel by kernel ("" when it does not), from
  /// stats_'s copy bytes and launches.
  std::string graph_cost_obstacle() const;
  /// Why this plan cannot be recorded as a body of a conditional node on GPU `device` ("" when it can).
  std::string body_obstacle(int device) const;

  void lower(bool fuse);
  void add_step(Step s) { steps_.push_back(std::move(s)); }
  std::unique_ptr<RunState> make_state() const;
  void run_step(const Step& s, std::size_t i, RunState& st) const;
  /// A concat's pieces not written in place (Step::rest), copied into its output.
  void copy_rest(const Step& s, std::size_t i, RunState& st) const;
  /// Binds args to the graph's inputs and runs every step (an error names the node's line).
  void run_steps(RunState& st, std::span<const Tensor> args) const;
  /// Runs row chain c (its steps block by block, or in turn where its buffers do not allow it).
  void run_chain(const detail_plan::RowChain& c, RunState& st) const;
  void release(RunState& st) const;

  std::shared_ptr<const Graph> g_;
  std::vector<Step> steps_;
  std::vector<detail_plan::RowChain> chains_;
  std::vector<int> chain_at_;  ///< per step: the chain it starts, or -1 (empty: no chain)
  FusionGroups groups_;
  MemoryPlan mem_;
  PlanStats stats_;
  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<RunState>> free_;
  mutable std::vector<std::int64_t> host_ns_;  // (plan_host_timing) each step's host time, summed over...
  mutable std::int64_t host_runs_ = 0;         // ...this many runs; both under mu_
  // CUDA graph replay (see run_graph).
  std::string graph_obstacle_;
  bool on_gpu_ = false;  ///< some value lives on a GPU (else cuda_graph_status() has nothing to say)
  int graph_device_ = -1;
  mutable std::mutex graph_mu_;
  mutable std::shared_ptr<GraphRun> graph_;
  mutable int graph_runs_ = 0;        ///< runs that could have been replayed
  mutable std::int64_t graph_launches_ = 0;
  mutable std::string graph_failure_;  ///< why the capture failed (then never tried again)
  std::string graph_costly_;           ///< graph_cost_obstacle(), found when lowered
};

#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE void Plan::lower(bool fuse) {
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
      case NodeKind::custom_gradient: throw Error("[plan] a custom_gradient node reached lowering");  // dropped above
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
  const int xent_pairs = merge_xent_pairs(g, steps_);
  const int bias_grads = merge_bias_grads(g, steps_);
  stats_.batched_groups = detail_plan::batch_gpu_groups(g, steps_);
  // Buffers: values whose storage the plan owns get a planned buffer, reused by liveness.
  std::vector<MemoryPlan::StepUse> uses;
  for (const Step& s : steps_) {
    MemoryPlan::StepUse u;
    u.in = s.head_in;
    u.in.insert(u.in.end(), s.in.begin(), s.in.end());
    if (s.head_out >= 0) u.first_out = {s.head_out};
    u.out = s.kind == StepKind::kernel || s.kind == StepKind::fused ? s.out : std::vector<int>{};
    u.views = s.kind == StepKind::view;
    // (not a group reading a window: an output of the window's parent's shape may not take its
    // buffer; nor one forming a product: an element's product reads a whole row of A; nor one
    // writing through windows: an element lands elsewhere than where its inputs are read)
    // (nor a batch: one group's threads may still read what another's write)
    const FusedProgram* fp = s.kind != StepKind::fused || s.cuda_batch ? nullptr : s.gpu ? &s.cuda_fused->program() : &s.fused->program;
    const bool across = s.cuda_batch != nullptr || (fp != nullptr && (fp->any_window() || fp->any_out_window() || fp->any_product() ||
                                                                     (!s.gpu && !s.fused->products.empty())));
    u.in_place_ok = (s.kind == StepKind::fused && !across) ||
                    (s.kind == StepKind::kernel && (s.fns->elementwise_unary || s.fns->elementwise_binary));
    // A GPU reduction's rows, and a cuBLASLt epilogue's product, are written while inputs are read.
    u.last_out_apart = s.kind == StepKind::fused && s.gpu && !s.cuda_batch &&
                       (s.cuda_fused->program().reduction.has_value() || s.bias >= 0);
    if (s.kind == StepKind::kernel && g.nodes[s.node].op == ops::OpId::Concat) {  // pieces one after another?
      const Shape& os = g.values[s.out[0]].shape;
      const int ax = static_cast<int>(s.attrs.axis < 0 ? s.attrs.axis + os.rank() : s.attrs.axis);
      u.concat = true;
      for (int k = 0; k < ax; ++k) u.concat = u.concat && os[k] == 1;
    }
    uses.push_back(std::move(u));
  }
  mem_ = plan_memory(g, uses);
  // Concats with pieces in place copy the rest, or nothing (then they are dropped).
  for (std::size_t i = steps_.size(); i-- > 0;) {
    Step& s = steps_[i];
    if (!uses[i].concat) continue;
    const int c = s.out[0];
    bool any = false;
    std::int64_t at = 0;
    for (std::size_t k = 0; k < s.in.size(); ++k) {
      const Value& p = g.values[s.in[k]];
      if (mem_.placed_in[s.in[k]] == c) any = true;
      else if (p.shape.numel() > 0) s.rest.emplace_back(static_cast<int>(k), at);
      at += detail_mem::bytes_of(p);
    }
    if (!any) {
      s.rest.clear();
    } else if (s.rest.empty()) {
      steps_.erase(steps_.begin() + static_cast<std::ptrdiff_t>(i));
      ++stats_.concats_dropped;
    }
  }
  for (int c : mem_.placed_in) stats_.pieces_in_place += c >= 0;
  chains_ = detail_plan::find_row_chains(g, steps_);
  if (!chains_.empty()) chain_at_.assign(steps_.size(), -1);
  for (std::size_t c = 0; c < chains_.size(); ++c) chain_at_[chains_[c].first] = static_cast<int>(c);
  stats_.row_chains = static_cast<int>(chains_.size());
  stats_.steps = static_cast<int>(steps_.size());
  for (const Step& s : steps_) {  // (a GPU group with a matmul head is one cuBLASLt call)
    stats_.kernels += (s.kind == StepKind::kernel || s.kind == StepKind::fused) + (s.head_fns != nullptr && !s.gpu) +
                      (s.cuda_fused != nullptr && s.cuda_fused->launches() == 2);
    stats_.specialized += s.fused != nullptr && s.fused->special != nullptr;
  }
  stats_.fused_groups = static_cast<int>(groups_.groups.size());
  stats_.epilogues = bias_grads;
  stats_.losses_with_gradient = xent_pairs;
  for (const FusionGroup& fg : groups_.groups) {
    stats_.fused_nodes += static_cast<int>(fg.nodes.size()) + (fg.head >= 0);
    stats_.epilogues += fg.head >= 0;
    stats_.fused_reductions += fg.reduce >= 0;
    stats_.fused_concats += static_cast<int>(fg.concats.size());
    for (const FusedProduct& q : fg.program.products) stats_.fused_products += q.operand;
  }
  stats_.peak_bytes = mem_.total_bytes();
  stats_.intermediate_bytes = g.intermediate_bytes();
  stats_.buffers = static_cast<int>(mem_.buffer_bytes.size());
  graph_obstacle_ = find_graph_obstacle(graph_device_);
  if (graph_obstacle_.empty()) {
    stats_.cuda_graph_copy_bytes = graph_copy_bytes();
    stats_.cuda_graph_launches = launches_per_run();
    graph_costly_ = graph_cost_obstacle();
  }
  on_gpu_ = std::any_of(g_->values.begin(), g_->values.end(), [](const Value& v) { return v.device.is_cuda(); });
}

STAGECRAFT_COMPILED_INLINE std::unique_ptr<Plan::RunState> Plan::make_state() const {
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
    if (mem_.buffer_of[v] >= 0) {
      const auto& buf = st->buffers[mem_.buffer_of[v]];
      if (mem_.placed_in[v] < 0) impl->storage = buf;
      else  // a piece written in its place in a concat's buffer (which the state keeps)
        impl->storage = stagecraft::detail::Storage::borrow(static_cast<std::byte*>(buf->data()) + mem_.offset_of[v],
                                                            static_cast<std::size_t>(impl->shape.numel()) * itemsize(impl->dtype),
                                                            impl->device);
    }
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
#endif  // STAGECRAFT_DEFINE_COMPILED

namespace detail_plan {
/// Rethrows a kernel's error (same kind) with the user's line of the node that raised it, when
/// the message does not name a line yet.
[[noreturn]] STAGECRAFT_COMPILED_INLINE void rethrow_at(const Error& e, const SrcLoc& loc);

/// Rethrows an error a CUDA hook raised naming `here` (the plan's own line, the hooks take a
/// std::source_location) without that line, so that rethrow_at names the node's.
[[noreturn]] STAGECRAFT_COMPILED_INLINE void rethrow_unlocated(const Error& e, const std::source_location& here);

/// A new handle over a run value's current storage (what leaves the plan: results, assigned
/// variable values, host_fn arguments).
STAGECRAFT_COMPILED_INLINE Tensor detach(const Tensor& slot);
#if STAGECRAFT_DEFINE_COMPILED
[[noreturn]] STAGECRAFT_COMPILED_INLINE void rethrow_at(const Error& e, const SrcLoc& loc) {
  std::string m = e.what();
  const std::string at = detail_ir::loc_text(loc);
  if (!at.empty() && !stagecraft::detail::names_line(m)) m += " at " + at + " (while running a staged function)";
  stagecraft::detail::rethrow_as(e, m);
}

[[noreturn]] STAGECRAFT_COMPILED_INLINE void rethrow_unlocated(const Error& e, const std::source_location& here) {
  std::string m = e.what();
  const std::string suffix = " at " + stagecraft::detail::where(here);
  if (m.size() >= suffix.size() && m.compare(m.size() - suffix.size(), suffix.size(), suffix) == 0)
    m.erase(m.size() - suffix.size());
  stagecraft::detail::rethrow_as(e, m);
}

STAGECRAFT_COMPILED_INLINE Tensor detach(const Tensor& slot) {
  auto* impl = new stagecraft::detail::TensorImpl();
  impl->shape = slot.shape();
  impl->dtype = slot.dtype();
  impl->device = slot.device();
  impl->storage = slot.impl()->storage;
  return Tensor(stagecraft::detail::Ref<stagecraft::detail::TensorImpl>::adopt(impl));
}
#endif  // STAGECRAFT_DEFINE_COMPILED
inline void rebind(const Tensor& slot, const Tensor& src) { slot.impl()->storage = src.impl()->storage; }
/// A new tensor of slot's shape, dtype and device with storage of its own (contents unset).
STAGECRAFT_COMPILED_INLINE Tensor new_like(const Tensor& slot);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE Tensor new_like(const Tensor& slot) {
  return stagecraft::detail::empty_tensor(slot.shape(), slot.dtype(), slot.device(), "cuda graph");
}
#endif  // STAGECRAFT_DEFINE_COMPILED
}  // namespace detail_plan

#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::vector<Tensor> Plan::run(std::span<const Tensor> args) const {
  if (SC_UNLIKELY(graph_device_ >= 0) && graph_obstacle_.empty()) {
    const cuda::GraphPolicy p = cuda::graph_policy();
    if (p == cuda::GraphPolicy::always || (p == cuda::GraphPolicy::when_cheaper && graph_costly_.empty()))
      if (auto out = run_graph(args)) return std::move(*out);
  }
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

STAGECRAFT_COMPILED_INLINE void Plan::run_steps(RunState& st, std::span<const Tensor> args) const {
  const Graph& g = *g_;
  for (std::size_t i = 0; i < g.inputs.size(); ++i) detail_plan::rebind(st.vals[g.inputs[i]], args[i]);
  const bool timed = plan_host_timing();
  std::vector<std::int64_t> ns(timed ? steps_.size() : 0);
  for (std::size_t i = 0; i < steps_.size(); ++i) {
    const auto t0 = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    const std::size_t at = i;
    try {
      if (SC_UNLIKELY(!chain_at_.empty()) && chain_at_[i] >= 0 && !st.capture) {
        const detail_plan::RowChain& c = chains_[static_cast<std::size_t>(chain_at_[i])];
        run_chain(c, st);
        i = c.last;  // (its time is its first step's)
      } else {
        run_step(steps_[i], i, st);
      }
    } catch (const Error& e) {
      detail_plan::rethrow_at(e, g.nodes[steps_[at].node].loc);
    }
    if (timed) ns[at] = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  }
  if (!timed) return;
  std::lock_guard<std::mutex> lock(mu_);
  host_ns_.resize(steps_.size());
  for (std::size_t i = 0; i < ns.size(); ++i) host_ns_[i] += ns[i];
  ++host_runs_;
}

STAGECRAFT_COMPILED_INLINE void Plan::run_chain(const detail_plan::RowChain& c, RunState& st) const {
  for (std::size_t i = c.first; i <= c.last; ++i)
    for (int v : steps_[i].out)
      if (mem_.buffer_of[v] < 0) {
        const Tensor& t = st.vals[v];
        t.impl()->storage = stagecraft::detail::Storage::allocate(t.nbytes(), t.device());
      }
  if (detail_plan::run_row_chain(c, st.ins, st.outs, st.vals)) return;
  for (std::size_t i = c.first; i <= c.last; ++i) run_step(steps_[i], i, st);
}

STAGECRAFT_COMPILED_INLINE std::vector<double> Plan::host_times() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<double> us;
  for (const std::int64_t t : host_ns_) us.push_back(static_cast<double>(t) / 1e3 / static_cast<double>(host_runs_));
  return us;
}

STAGECRAFT_COMPILED_INLINE void Plan::release(RunState& st) const {
  // Drop what the plan does not own, so it keeps no user tensor or old variable value alive.
  for (std::size_t v = 0; v < st.vals.size(); ++v)
    if (mem_.buffer_of[v] < 0 && g_->nodes[g_->values[v].node].kind != NodeKind::constant)
      st.vals[v].impl()->storage = {};
}
#endif  // STAGECRAFT_DEFINE_COMPILED

namespace detail_plan {
/// A cond node's inputs after the predicate: then-branch captures (attrs.i0 of them), then
/// else-branch captures; branch b's arguments.
STAGECRAFT_COMPILED_INLINE std::vector<Tensor> select_branch_args(const std::vector<Tensor>& args, const Node& n,
                                                                  int b);

/// Runs a while node: loop variables, then cond captures (attrs.i0), then body captures.
STAGECRAFT_COMPILED_INLINE std::int64_t run_while(const Plan& cond, const Plan& body, const Node& n,
                                                  std::vector<Tensor>& vars, const std::vector<Tensor>& caps);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::vector<Tensor> select_branch_args(const std::vector<Tensor>& args, const Node& n,
                                                                  int b) {
  const auto k = static_cast<std::ptrdiff_t>(n.attrs.i0);
  if (b == 0) return {args.begin(), args.begin() + k};
  return {args.begin() + k, args.end()};
}

STAGECRAFT_COMPILED_INLINE std::int64_t run_while(const Plan& cond, const Plan& body, const Node& n,
                                                  std::vector<Tensor>& vars, const std::vector<Tensor>& caps) {
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
#endif  // STAGECRAFT_DEFINE_COMPILED
}  // namespace detail_plan

#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE void Plan::copy_rest(const Step& s, std::size_t i, RunState& st) const {
  const Tensor& out = st.vals[s.out[0]];
  auto* base = static_cast<std::byte*>(out.raw_data());
  if (!s.gpu) {
    for (const auto& [k, at] : s.rest) {
      const Tensor& p = st.ins[i][static_cast<std::size_t>(k)];
      std::memcpy(base + at, p.raw_data(), p.nbytes());
    }
    return;
  }
  std::vector<backend::cuda::abi::ConcatPiece> pieces;  // each one row: the pieces are contiguous
  for (const auto& [k, at] : s.rest) {
    const Tensor& p = st.ins[i][static_cast<std::size_t>(k)];
    pieces.push_back({p.raw_data(), base + at, 1, p.numel(), p.numel()});
  }
  const Node& n = g_->nodes[s.node];
  const stagecraft::detail::LocOverride where(n.loc);
  const std::source_location here = std::source_location::current();
  try {
    backend::cuda::concat(pieces, out.dtype(), out.device(), ops::op_info(n.op).name, here);
  } catch (const Error& e) {
    detail_plan::rethrow_unlocated(e, here);
  }
}

STAGECRAFT_COMPILED_INLINE void Plan::run_step(const Step& s, std::size_t i, RunState& st) const {
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
      if (!s.rest.empty()) {
        copy_rest(s, i, st);
        break;
      }
      if (SC_UNLIKELY(s.gpu)) {
        if (s.fns->cuda == nullptr)
          stagecraft::detail::fail_at<DeviceError>(ops::op_info(n.op).name, n.loc.file, n.loc.line, "has no kernel for ",
                                                   g.values[s.out[0]].device.str(), " in this build");
        const stagecraft::detail::LocOverride at(n.loc);  // what a kernel reports later names the node's line
        const std::source_location here = std::source_location::current();
        try {
          if (s.xent_both) {
            backend::cuda::softmax_cross_entropy_both(st.ins[i][2], st.ins[i][0], st.ins[i][1], st.vals[s.out[0]],
                                                      st.vals[s.out[1]], "cross_entropy", here);
          } else if (s.bgrad_fns == nullptr) {
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
          if (s.cuda_batch) {
            s.cuda_batch->run(st.ins[i], st.outs[i], here);
            break;
          }
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
      const std::vector<Tensor> res = n.host->run(args, n.loc);
      for (std::size_t k = 0; k < res.size(); ++k) detail_plan::rebind(st.vals[s.out[k]], res[k]);
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
      if (s.out.size() > vars.size()) {  // the count, made on the device the graph says (not a scope's)
        const Device d = g.values[s.out.back()].device;
        Tensor c = stagecraft::detail::empty_tensor(Shape{}, DType::i64, Device::cpu());
        *static_cast<std::int64_t*>(c.raw_data()) = count;
        if (!d.is_cpu()) c = stagecraft::detail::device_copy(c, d, "while_loop", std::source_location::current());
        detail_plan::rebind(st.vals[s.out.back()], c);
      }
      break;
    }
  }
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph

#include "plan_cuda_graph.hpp"  // the CUDA-graph replay of plans
#include "plan_listing.hpp"     // Plan::str()
