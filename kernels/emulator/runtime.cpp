// The emulator's runtime (kernels/runtime.cu and kernels/graph.cu on the host): devices, streams,
// tagged device memory with a capacity (so out-of-memory paths run), copies, the fault record,
// and CUDA graphs: a capture records each launch's closure, and a graph launch runs them again,
// its copies in and out re-pointed and its conditional nodes (if, while) evaluated as it goes.
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../batch_elements.cuh"
#include "../batch_queue.hpp"
#include "emu.hpp"

namespace stagecraft::cuda::emu {
namespace {

constexpr int max_devices = 64;

/// STAGECRAFT_EMU_DEVICES (default 1, at most max_devices).
int emulated_devices() {
  static const int n = [] {
    const char* e = std::getenv("STAGECRAFT_EMU_DEVICES");
    const int v = e != nullptr ? std::atoi(e) : 1;
    return v < 0 ? 0 : (v > max_devices ? max_devices : v);
  }();
  return n;
}

/// Bytes each device holds: STAGECRAFT_EMU_MEMORY (default 4 GiB), so that a test can run out.
std::size_t capacity() {
  static const std::size_t n = [] {
    const char* e = std::getenv("STAGECRAFT_EMU_MEMORY");
    return e != nullptr ? static_cast<std::size_t>(std::strtoull(e, nullptr, 10)) : std::size_t{4} << 30;
  }();
  return n;
}

/// A stream: a device's own (capture false), or this thread's capture on the device.
struct StreamObj {
  int device = 0;
  bool capture = false;
};

struct DeviceState {
  std::mutex mu;
  StreamObj stream;
  std::unordered_map<void*, std::size_t> blocks;  // host address -> bytes
  std::size_t in_use = 0;
  abi::Fault* fault = nullptr;  // device pointer, made on first use
  abi::Fault* fault_host = nullptr;  // the same, untagged: LeakSanitizer then sees it held
  abi::Fault found;
  std::atomic<bool> armed{false};
  cuda::kernels::batch::Queue queued;  // small eager ops not yet run (batch_enqueue)
};
DeviceState& state(int device) {
  static DeviceState* states = [] {
    auto* s = new DeviceState[max_devices];  // never freed: used until the process ends
    for (int d = 0; d < max_devices; ++d) s[d].stream.device = d;
    return s;
  }();
  return states[device];
}

Status check_device(int device) { return device < 0 || device >= emulated_devices() ? invalid_device : ok; }

// ---- graphs ---------------------------------------------------------------------------------

/// What a graph launch passes its nodes: the copies in and out of this launch.
struct LaunchCtx {
  const abi::GraphCopy* ins = nullptr;
  const abi::GraphCopy* outs = nullptr;
};
using Node = std::function<void(const LaunchCtx&)>;
/// A recorded sequence: a graph's body, or a conditional node's body.
struct Rec {
  std::vector<Node> nodes;
};
void run(const Rec& r, const LaunchCtx& ctx) {
  for (const Node& n : r.nodes) n(ctx);
}

/// This thread's capture: the device (-1: none), the stream its launches go to, the bodies being
/// recorded (the graph's first, then nested conditional bodies), and what was recorded of it.
thread_local int capture_device = -1;
thread_local StreamObj capture_stream{0, true};
thread_local std::vector<Rec*> capture_stack;
thread_local std::unique_ptr<Rec> capture_root;
thread_local bool capture_armed = false, capture_spoiled = false;
/// The copy nodes recorded: (which, first, n), as kernels/graph.cu's recorded_copies.
struct CopyNode {
  int which = 0, first = 0, n = 0;
};
thread_local std::vector<CopyNode> recorded_copies;

bool capturing(int device) { return device >= 0 && device == capture_device; }

/// Records a node in this thread's capture (the innermost body being recorded).
Status record(Node n) {
  if (capture_stack.empty()) return capture_unmatched;
  try {
    capture_stack.back()->nodes.push_back(std::move(n));
  } catch (const std::bad_alloc&) {
    return memory_allocation;
  }
  return ok;
}

/// A wait for the device inside a capture: CUDA refuses it and spoils the capture.
Status spoil() {
  capture_spoiled = true;
  return capture_unsupported;
}

struct Exec {
  int device = 0;
  std::unique_ptr<Rec> body;
  int n_in = 0, n_out = 0;
};

/// A conditional node while its bodies are recorded; the node itself holds the flag and bodies.
struct Cond {
  int device = 0;
  std::shared_ptr<bool> flag;
  std::shared_ptr<Rec> bodies[2];
  unsigned n_bodies = 0;
  bool in_body = false;
};

/// Reads the scalar at p (device) as a condition: non-zero is true (a NaN too).
bool truth(DT dt, const void* p) {
  bool r = false;
  visit(dt, [&](auto t) -> Status {
    using T = decltype(t);
    r = *host(static_cast<const T*>(p)) != T(0);
    return ok;
  });
  return r;
}

enum class Count { none, reset, increment };

/// Records the node that sets c's condition from p (and resets or counts the iterations).
Status record_condition(const std::shared_ptr<bool>& flag, const void* pred, DT dt, std::int64_t* count, Count c) {
  return record([flag, pred, dt, count, c](const LaunchCtx&) {
    if (count != nullptr && c == Count::reset) *host(count) = 0;
    if (count != nullptr && c == Count::increment) ++*host(count);
    *flag = truth(dt, pred);
  });
}

Status add_conditional(int device, bool is_while, const void* pred, DT dt, std::int64_t* count, abi::CondNode* out) {
  *out = nullptr;
  if (!capturing(device)) return capture_unmatched;
  auto* c = new (std::nothrow) Cond();
  if (c == nullptr) return memory_allocation;
  c->device = device;
  c->flag = std::make_shared<bool>(false);
  c->n_bodies = is_while ? 1 : 2;
  for (unsigned b = 0; b < c->n_bodies; ++b) c->bodies[b] = std::make_shared<Rec>();
  if (const Status e = record_condition(c->flag, pred, dt, count, Count::reset)) {
    delete c;
    return e;
  }
  Status e = ok;
  if (is_while) {
    e = record([flag = c->flag, body = c->bodies[0]](const LaunchCtx& ctx) {
      while (*flag) run(*body, ctx);
    });
  } else {
    e = record([flag = c->flag, yes = c->bodies[0], no = c->bodies[1]](const LaunchCtx& ctx) { run(*flag ? *yes : *no, ctx); });
  }
  if (e != ok) {
    delete c;
    return e;
  }
  *out = c;
  return ok;
}

}  // namespace

namespace {
std::atomic<std::int64_t> kernels_launched{0}, copies_made{0}, graphs_launched{0};

/// Runs f on stream s now, or records it in this thread's capture.
Status enqueue(Stream s, std::function<void()> kernel, bool faults) {
  const auto* so = static_cast<const StreamObj*>(s);
  if (so == nullptr) return invalid_value;
  if (so->capture) {
    if (!capturing(so->device)) return capture_unmatched;
    if (faults) capture_armed = true;
    return record([k = std::move(kernel)](const LaunchCtx&) { k(); });
  }
  kernel();
  if (faults) state(so->device).armed.store(true);
  return ok;
}
}  // namespace

Status launch(Stream s, std::function<void()> kernel, bool faults) {
  kernels_launched.fetch_add(1, std::memory_order_relaxed);
  return enqueue(s, std::move(kernel), faults);
}

Counts counts() noexcept { return {kernels_launched.load(), copies_made.load(), graphs_launched.load()}; }

void report_fault(abi::Fault* f, std::int32_t tag, std::int64_t value, std::int64_t bound) noexcept {
  static std::mutex mu;
  const std::lock_guard<std::mutex> lock(mu);
  abi::Fault* h = host(f);
  if (h->tag != 0) return;
  h->tag = tag;
  h->value = value;
  h->bound = bound;
}

namespace {

namespace batch = cuda::kernels::batch;

/// Runs a batch of the queue of `device` as one launch: batch.cu's ops, by the same functions,
/// in order.
struct LaunchOn {
  int device;
  Status operator()(const abi::BatchSlot* slots, int n) const {
    try {
      std::vector<abi::BatchSlot> own(slots, slots + n);  // (the closure may run later: a copy)
      batch::for_each_op(own.data(), n, [](abi::BatchOp& op, const abi::BatchGeometry*) {
        op.a = host(op.a);
        op.b = host(op.b);
        op.y = host(op.y);
        if (op.kind == abi::BatchOp::select) op.c = host(op.c);
      });
      return launch(&state(device).stream, [own = std::move(own)] {
        const auto run = [](const abi::BatchOp& op, const abi::BatchGeometry* g) {
          batch::run_op<std::int64_t>(op, g, 0, 1, true);
        };
        batch::for_each_op(own.data(), static_cast<int>(own.size()), run);
      });
    } catch (const std::bad_alloc&) {
      return memory_allocation;
    }
  }
};

/// Runs the ops queued on `device`, if any: before anything else uses the device's stream.
Status flush_queued(int device) { return batch::flush(state(device).queued, LaunchOn{device}); }

/// After the device's work (all of it is done here): reads and clears its fault record when a
/// kernel that can write it ran since the last check.
Status collect_fault(int device) {
  DeviceState& d = state(device);
  if (!d.armed.exchange(false)) return ok;
  const std::lock_guard<std::mutex> lock(d.mu);
  if (d.fault == nullptr) return ok;
  abi::Fault* f = host(d.fault);
  if (f->tag == 0) return ok;
  if (d.found.tag == 0) d.found = *f;
  *f = abi::Fault{};
  return abi::device_fault;
}

}  // namespace
}  // namespace stagecraft::cuda::emu

namespace stagecraft::cuda::abi {
using namespace stagecraft::cuda::emu;

int device_count() noexcept { return emulated_devices(); }

const char* error_string(Status s) noexcept {
  switch (s) {
    case ok: return "no error";
    case invalid_value: return "invalid argument";
    case memory_allocation: return "out of memory";
    case invalid_device: return "invalid device ordinal";
    case rtc_compile_error: return "device kernel image is invalid";
    case illegal_state: return "the operation cannot be performed in the present state";
    case not_supported: return "operation not supported";
    case capture_unsupported: return "operation not permitted when stream is capturing";
    case capture_invalidated: return "operation failed due to a previous error during capture";
    case capture_unmatched: return "capture was not initiated in this stream";
    case graph_update_failure: return "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update";
    case device_fault: return "a kernel recorded a bad index";
    default: return "unknown error";
  }
}

bool is_out_of_memory(Status s) noexcept { return s == memory_allocation; }

Status stream(int device, Stream* out) noexcept {
  if (const Status e = check_device(device)) return e;
  if (const Status e = flush_queued(device)) return e;
  if (capturing(device)) {
    capture_stream.device = device;
    *out = &capture_stream;
  } else {
    *out = &state(device).stream;
  }
  return ok;
}

Status synchronize(int device) noexcept {
  if (const Status e = check_device(device)) return e;
  if (capturing(device)) return spoil();
  if (const Status e = flush_queued(device)) return e;
  return collect_fault(device);
}

Status last_error() noexcept { return ok; }

Status malloc_async(int device, std::size_t n, void** p) noexcept {
  *p = nullptr;
  if (const Status e = check_device(device)) return e;
  DeviceState& d = state(device);
  const std::lock_guard<std::mutex> lock(d.mu);
  const std::size_t bytes = n == 0 ? 256 : (n + 255) / 256 * 256;
  if (bytes < n || bytes > capacity() - d.in_use) return memory_allocation;
  void* h = std::aligned_alloc(256, bytes);
  if (h == nullptr) return memory_allocation;
  try {
    d.blocks.emplace(h, bytes);
  } catch (const std::bad_alloc&) {
    std::free(h);
    return memory_allocation;
  }
  d.in_use += bytes;
  *p = device_ptr(h);
  return ok;
}

Status free_async(int device, void* p) noexcept {
  if (const Status e = check_device(device)) return e;
  if (p == nullptr) return ok;
  if (const Status e = flush_queued(device)) return e;
  DeviceState& d = state(device);
  const std::lock_guard<std::mutex> lock(d.mu);
  void* h = host(p);
  const auto it = d.blocks.find(h);
  if (!is_device_ptr(p) || it == d.blocks.end()) return invalid_value;  // not a block of this device
  d.in_use -= it->second;
  d.blocks.erase(it);
  std::free(h);
  return ok;
}

Status trim_pool(int device) noexcept { return synchronize(device); }

Status copy_h2d(int device, void* dst, const void* src, std::size_t n) noexcept {
  if (n == 0) return ok;
  if (const Status e = check_device(device)) return e;
  if (!is_device_ptr(dst) || is_device_ptr(src)) return invalid_value;
  if (const Status e = flush_queued(device)) return e;
  copies_made.fetch_add(1, std::memory_order_relaxed);
  if (capturing(device)) {  // recorded: the graph copies the bytes as they were (a staging buffer's)
    try {
      auto bytes = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                                static_cast<const unsigned char*>(src) + n);
      return record([dst, bytes](const LaunchCtx&) { std::memcpy(host(dst), bytes->data(), bytes->size()); });
    } catch (const std::bad_alloc&) {
      return memory_allocation;
    }
  }
  std::memcpy(host(dst), src, n);
  return ok;
}

Status copy_d2h(int device, void* dst, const void* src, std::size_t n) noexcept {
  if (n == 0) return ok;
  if (const Status e = check_device(device)) return e;
  if (capturing(device)) return spoil();
  if (is_device_ptr(dst) || !is_device_ptr(src)) return invalid_value;
  if (const Status e = flush_queued(device)) return e;
  std::memcpy(dst, host(src), n);
  return collect_fault(device);
}

Status copy_d2d(int dst_device, void* dst, int src_device, const void* src, std::size_t n) noexcept {
  if (n == 0) return ok;
  if (const Status e = check_device(dst_device)) return e;
  if (const Status e = check_device(src_device)) return e;
  if (!is_device_ptr(dst) || !is_device_ptr(src)) return invalid_value;
  if (const Status e = flush_queued(src_device)) return e;
  Stream s = nullptr;
  if (const Status e = stream(dst_device, &s)) return e;
  copies_made.fetch_add(1, std::memory_order_relaxed);
  return enqueue(s, [dst, src, n] { std::memmove(host(dst), host(src), n); }, false);
}

Status fault_record(int device, Fault** out) noexcept {
  if (const Status e = check_device(device)) return e;
  DeviceState& d = state(device);
  {
    const std::lock_guard<std::mutex> lock(d.mu);
    if (d.fault == nullptr) {
      auto* h = static_cast<Fault*>(std::aligned_alloc(256, 256));
      if (h == nullptr) return memory_allocation;
      *h = Fault{};
      d.fault_host = h;
      d.fault = static_cast<Fault*>(device_ptr(h));
    }
    *out = d.fault;
  }
  return ok;
}

Status take_fault(int device, Fault* out) noexcept {
  if (const Status e = check_device(device)) return e;
  DeviceState& d = state(device);
  const std::lock_guard<std::mutex> lock(d.mu);
  *out = d.found;
  d.found = Fault{};
  return ok;
}

// ---- graphs ---------------------------------------------------------------------------------

Status capture_begin(int device) noexcept {
  if (capture_device >= 0) return capture_unsupported;  // one capture per thread
  if (const Status e = check_device(device)) return e;
  if (const Status e = flush_queued(device)) return e;
  auto root = std::unique_ptr<Rec>(new (std::nothrow) Rec());
  if (!root) return memory_allocation;
  capture_root = std::move(root);
  capture_stack.assign(1, capture_root.get());
  capture_device = device;
  capture_armed = false;
  capture_spoiled = false;
  return ok;
}

Status capture_end(int device, GraphBody* body, bool* armed) noexcept {
  *body = nullptr;
  *armed = false;
  if (!capturing(device)) return capture_unmatched;
  capture_device = -1;
  capture_stack.clear();
  std::unique_ptr<Rec> root = std::move(capture_root);
  *armed = capture_armed;
  capture_armed = false;
  if (capture_spoiled) {
    capture_spoiled = false;
    return capture_invalidated;
  }
  *body = root.release();
  return ok;
}

void graph_body_destroy(GraphBody body) noexcept { delete static_cast<Rec*>(body); }

Status capture_copies(int device, int which, const GraphCopy* c, int n) noexcept {
  (void)c;  // the launch's copies are the ones used (graph_launch): only their count is recorded
  if (which == 0) recorded_copies.clear();
  if (!capturing(device)) return capture_unmatched;
  kernels_launched.fetch_add((n + 31) / 32, std::memory_order_relaxed);  // graph.cu: a copy kernel per 32
  if (which != 0 && which != 1) return invalid_value;
  try {
    int before = 0;
    for (const CopyNode& r : recorded_copies)
      if (r.which == which) before += r.n;
    recorded_copies.push_back({which, before, n});
    return record([which, before, n](const LaunchCtx& ctx) {
      const GraphCopy* l = (which == 0 ? ctx.ins : ctx.outs) + before;
      for (int i = 0; i < n; ++i) std::memcpy(host(l[i].dst), host(l[i].src), l[i].bytes);
    });
  } catch (const std::bad_alloc&) {
    return memory_allocation;
  }
}

Status graph_instantiate(int device, GraphBody body, const GraphCopy* ins, int n_in, const GraphCopy* outs, int n_out,
                         GraphExec* out) noexcept {
  (void)ins, (void)outs;
  *out = nullptr;
  std::unique_ptr<Rec> root(static_cast<Rec*>(body));
  if (const Status e = check_device(device)) return e;
  int covered[2] = {0, 0};  // the capture recorded every copy, in order
  for (const CopyNode& c : recorded_copies) {
    if (c.first != covered[c.which]) return graph_update_failure;
    covered[c.which] += c.n;
  }
  recorded_copies.clear();
  if (covered[0] != n_in || covered[1] != n_out) return graph_update_failure;
  auto* x = new (std::nothrow) Exec();
  if (x == nullptr) return memory_allocation;
  x->device = device;
  x->body = std::move(root);
  x->n_in = n_in;
  x->n_out = n_out;
  *out = x;
  return ok;
}

Status graph_launch(GraphExec g, const GraphCopy* ins, int n_in, const GraphCopy* outs, int n_out, bool arm) noexcept {
  auto* x = static_cast<Exec*>(g);
  if (x == nullptr || n_in != x->n_in || n_out != x->n_out) return invalid_value;
  if (capturing(x->device)) return capture_unsupported;
  if (const Status e = flush_queued(x->device)) return e;
  graphs_launched.fetch_add(1, std::memory_order_relaxed);
  run(*x->body, LaunchCtx{ins, outs});
  if (arm) state(x->device).armed.store(true);
  return ok;
}

void graph_destroy(GraphExec g) noexcept { delete static_cast<Exec*>(g); }

Status capture_if(int device, const void* pred, DT dt, CondNode* out) noexcept {
  return add_conditional(device, false, pred, dt, nullptr, out);
}

Status capture_while(int device, const void* pred, DT dt, std::int64_t* count, CondNode* out) noexcept {
  return add_conditional(device, true, pred, dt, count, out);
}

Status capture_while_next(CondNode node, const void* pred, DT dt, std::int64_t* count) noexcept {
  auto* c = static_cast<Cond*>(node);
  if (c == nullptr || !c->in_body) return illegal_state;
  return record_condition(c->flag, pred, dt, count, Count::increment);
}

Status capture_body_begin(CondNode node, int body) noexcept {
  auto* c = static_cast<Cond*>(node);
  if (c == nullptr || c->in_body || body < 0 || static_cast<unsigned>(body) >= c->n_bodies) return illegal_state;
  if (!capturing(c->device)) return capture_unmatched;
  try {
    capture_stack.push_back(c->bodies[body].get());
  } catch (const std::bad_alloc&) {
    return memory_allocation;
  }
  c->in_body = true;
  return ok;
}

Status capture_body_end(CondNode node) noexcept {
  auto* c = static_cast<Cond*>(node);
  if (c == nullptr || !c->in_body) return illegal_state;
  c->in_body = false;
  if (capture_stack.size() > 1) capture_stack.pop_back();
  return ok;
}

void capture_cond_free(CondNode node) noexcept {
  auto* c = static_cast<Cond*>(node);
  if (c == nullptr) return;
  if (c->in_body) (void)capture_body_end(node);
  delete c;
}

// ---- eager batches --------------------------------------------------------------------------

Status batch_enqueue(int device, const BatchOp& op, const BatchGeometry* geo) noexcept {
  if (const Status e = check_device(device)) return e;
  if (capturing(device) || !batch::takes_op(op, geo)) return not_supported;
  const bool reads_b = op.kind == BatchOp::binary || op.kind == BatchOp::broadcast || op.kind == BatchOp::gemm ||
                       op.kind == BatchOp::select;
  if (!is_device_ptr(op.y) || (op.kind != BatchOp::fill && !is_device_ptr(op.a)) || (reads_b && !is_device_ptr(op.b)) ||
      (op.kind == BatchOp::select && !is_device_ptr(op.c)))
    return invalid_value;
  return batch::push(state(device).queued, op, geo, LaunchOn{device});
}

Status batch_flush(int device) noexcept {
  if (const Status e = check_device(device)) return e;
  return flush_queued(device);
}

BatchStats batch_stats() noexcept { return batch::stats(); }

}  // namespace stagecraft::cuda::abi
