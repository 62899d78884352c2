// Plan's CUDA-graph replay (a part of plan.hpp, included at its end): which plans can become a
// graph, their capture (control flow as conditional nodes) and their launches.
#pragma once
#include <iomanip>
#include <sstream>

#include "plan.hpp"

namespace stagecraft::graph {

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

#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::string Plan::find_graph_obstacle(int& device) const {
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

STAGECRAFT_COMPILED_INLINE std::string Plan::body_obstacle(int device) const {
  // A body that launches nothing (it passes values through) is recorded as its copies.
  if (!graph_obstacle_.empty() && graph_obstacle_ != "it launches no kernel") return graph_obstacle_;
  if (graph_device_ != device) return "it runs on " + (graph_device_ < 0 ? std::string("no device") : Device::cuda(graph_device_).str());
  // A variable's new value leaves a graph by a copy after the launch, where a body may have
  // assigned it any number of times.
  for (const Step& s : steps_)
    if (s.kind == StepKind::assign_var) return "it assigns variable '" + g_->nodes[s.node].var->name + "'";
  return "";
}

STAGECRAFT_COMPILED_INLINE void Plan::variable_reads(std::vector<Read>& out, bool own) const {
  for (const Step& s : steps_) {
    if (own && s.kind == StepKind::read_var) out.push_back({&g_->nodes[s.node], &g_->values[s.out[0]]});
    if (s.kind == StepKind::cond || s.kind == StepKind::while_loop)
      for (int b = 0; b < 2; ++b) s.sub[b]->variable_reads(out, true);
  }
}

STAGECRAFT_COMPILED_INLINE std::int64_t Plan::launches_per_run() const {
  std::int64_t n = stats_.kernels;
  for (const Step& s : steps_)
    if (s.kind == StepKind::cond || s.kind == StepKind::while_loop)
      n += 1 + s.sub[0]->launches_per_run() + s.sub[1]->launches_per_run();  // (+ the condition's kernel)
  return n;
}

STAGECRAFT_COMPILED_INLINE std::vector<int> Plan::graph_escapes() const {
  const Graph& g = *g_;
  std::vector<int> outs;
  auto escape = [&](int v) {
    if (g.nodes[g.values[v].node].kind == NodeKind::constant) return;
    if (std::find(outs.begin(), outs.end(), v) == outs.end()) outs.push_back(v);
  };
  for (int v : g.outputs) escape(v);
  for (const Step& s : steps_)
    if (s.kind == StepKind::assign_var) escape(s.in[0]);
  return outs;
}

STAGECRAFT_COMPILED_INLINE std::int64_t Plan::graph_copy_bytes() const {
  const Graph& g = *g_;
  auto bytes = [](const Value& v) { return v.shape.numel() * static_cast<std::int64_t>(itemsize(v.dtype)); };
  std::int64_t n = 0;
  for (int v : g.inputs) n += bytes(g.values[v]);
  std::vector<Read> reads;
  variable_reads(reads, true);
  for (const Read& r : reads) n += bytes(*r.value);
  for (int v : graph_escapes()) n += bytes(g.values[v]);
  return n;
}

STAGECRAFT_COMPILED_INLINE std::string Plan::graph_cost_obstacle() const {
  const std::int64_t launches = stats_.cuda_graph_launches, bytes = stats_.cuda_graph_copy_bytes;
  if (bytes <= launches * config::cuda_graph_bytes_per_launch) return "";
  auto mib = [](std::int64_t b) {
    std::ostringstream os;
    os << std::setprecision(3) << static_cast<double>(b) / double(1 << 20) << " MiB";
    return os.str();
  };
  return "its copies, " + mib(bytes) + " per call, would cost more than its " + std::to_string(launches) +
         " launches (at most " + mib(config::cuda_graph_bytes_per_launch) + " per launch)";
}

STAGECRAFT_COMPILED_INLINE std::string Plan::cuda_graph_status() const {
  if (!on_gpu_) return "";  // nothing to say
  if (!graph_obstacle_.empty()) return "no (" + graph_obstacle_ + ")";
  std::lock_guard<std::mutex> lock(graph_mu_);
  if (!graph_failure_.empty()) return "capture failed (" + graph_failure_ + "): runs kernel by kernel";
  if (graph_) return "replaying (" + std::to_string(graph_launches_) + " launches)";
  switch (cuda::graph_policy()) {
    case cuda::GraphPolicy::never: return "off (cuda::set_graphs(true) turns it on)";
    case cuda::GraphPolicy::when_cheaper:
      if (!graph_costly_.empty()) return "kernel by kernel (" + graph_costly_ + "; cuda::set_graphs(true) captures it)";
      break;
    case cuda::GraphPolicy::always: break;
  }
  return "not captured yet";
}
#endif  // STAGECRAFT_DEFINE_COMPILED

namespace detail_plan {
/// v may stand for the value `want` of read_var node n.
STAGECRAFT_COMPILED_INLINE void check_read(const Node& n, const Value& want, const Tensor& v);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE void check_read(const Node& n, const Value& want, const Tensor& v) {
  if (SC_UNLIKELY(v.shape() != want.shape || v.dtype() != want.dtype))
    stagecraft::detail::fail_at<StagingError>("read_var", n.loc.file, n.loc.line, "variable '", n.var->name,
                                              "' changed shape or dtype since it was traced");
  if (SC_UNLIKELY(v.device() != want.device))
    stagecraft::detail::fail_at<DeviceError>("read_var", n.loc.file, n.loc.line, "variable '", n.var->name, "' moved to ",
                                             v.device().str(), " since it was traced on ", want.device.str());
}
#endif  // STAGECRAFT_DEFINE_COMPILED
}  // namespace detail_plan

#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::optional<std::vector<Tensor>> Plan::run_graph(std::span<const Tensor> args) const {
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
#endif  // STAGECRAFT_DEFINE_COMPILED


/// One call's copies (this call's arguments and variable values in, new result tensors out).
struct Plan::GraphCall {
  std::vector<cuda::abi::GraphCopy> in, out;
  std::vector<Tensor> keep;   ///< the variables' values read, alive until the launch is queued
  std::vector<Tensor> fresh;  ///< by value: the new tensor of each value copied out
};

#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE Plan::GraphCall Plan::graph_call(GraphRun& gr, std::span<const Tensor> args) const {
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

STAGECRAFT_COMPILED_INLINE std::shared_ptr<Plan::GraphRun> Plan::capture(std::span<const Tensor> args) const {
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
  for (int v : graph_escapes())
    if (st.vals[v].nbytes() > 0) gr->outs.push_back(v);

  // The capture records this call's copies (their pointers are replaced at every launch).
  const GraphCall c = graph_call(*gr, args);
  cuda::detail::check(cuda::abi::capture_begin(graph_device_), dev, "cuda graph", here);
  cuda::abi::GraphBody body = nullptr;
  bool armed = false;
  try {
    const cuda::detail::CaptureScope hold(gr->hold, graph_device_);
    cuda::detail::check(cuda::abi::capture_copies(graph_device_, 0, c.in.data(), static_cast<int>(c.in.size())), dev,
                        "cuda graph", here);
    for (std::size_t i = 0; i < steps_.size(); ++i) run_step(steps_[i], i, st);
    cuda::detail::check(cuda::abi::capture_copies(graph_device_, 1, c.out.data(), static_cast<int>(c.out.size())), dev,
                        "cuda graph", here);
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

STAGECRAFT_COMPILED_INLINE void Plan::fix_storage(RunState& st, Device dev, bool inputs) const {
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

STAGECRAFT_COMPILED_INLINE std::unique_ptr<Plan::RunState> Plan::capture_body(std::span<const Tensor> args,
                                                                              const RunState& parent) const {
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
STAGECRAFT_COMPILED_INLINE void Plan::capture_control(const Step& s, RunState& st) const {
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

STAGECRAFT_COMPILED_INLINE std::vector<Tensor> Plan::launch(GraphRun& gr, std::span<const Tensor> args) const {
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
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
