// CUDA graphs of staged plans: one capture of the copies that bring a call's arguments in, the
// plan's kernels, and the copies that carry its results out. The copies are graph nodes whose
// pointers each launch replaces, so a call costs one graph launch however many tensors it moves.
// (One capture rather than a child graph between copy nodes: a library that allocates in stream
// order while captured, as cuBLAS does, leaves memory nodes, which a child graph may not hold.)
#include <new>
#include <vector>

#include "common.cuh"

namespace stagecraft::cuda::kernels {
namespace {

struct Exec {
  int device = 0;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<cudaGraphNode_t> ins, outs;
};

/// The memcpy node of g that writes dst (found among `nodes`, each taken once).
Status find_copies(const std::vector<cudaGraphNode_t>& nodes, std::vector<char>& taken, const abi::GraphCopy* c, int n,
                   std::vector<cudaGraphNode_t>& out) {
  for (int i = 0; i < n; ++i) {
    cudaGraphNode_t found = nullptr;
    for (std::size_t k = 0; k < nodes.size() && !found; ++k) {
      cudaGraphNodeType type{};
      if (taken[k] || cudaGraphNodeGetType(nodes[k], &type) != cudaSuccess || type != cudaGraphNodeTypeMemcpy) continue;
      cudaMemcpy3DParms p{};
      if (cudaGraphMemcpyNodeGetParams(nodes[k], &p) != cudaSuccess) continue;
      if (p.dstPtr.ptr == c[i].dst && p.srcPtr.ptr == c[i].src) {
        taken[k] = 1;
        found = nodes[k];
      }
    }
    if (!found) return cudaErrorGraphExecUpdateFailure;  // the capture did not record the copy
    out.push_back(found);
  }
  return cudaSuccess;
}

Status set_copies(cudaGraphExec_t x, const std::vector<cudaGraphNode_t>& nodes, const abi::GraphCopy* c, int n) {
  if (static_cast<std::size_t>(n) != nodes.size()) return cudaErrorInvalidValue;
  for (int i = 0; i < n; ++i)
    if (const auto e = cudaGraphExecMemcpyNodeSetParams1D(x, nodes[i], c[i].dst, c[i].src, c[i].bytes,
                                                          cudaMemcpyDeviceToDevice))
      return e;
  return cudaSuccess;
}

// ---- conditional nodes ----------------------------------------------------------------------

/// A conditional node while its bodies are recorded.
struct Cond {
  int device = 0;
  cudaGraphConditionalHandle handle{};
  cudaGraph_t bodies[2] = {};
  unsigned n_bodies = 0;
  cudaStream_t outer = nullptr;  ///< where launches went before the body being recorded
  cudaStream_t body = nullptr;   ///< the body being recorded (null: none)
};

/// How deep this thread's body captures are nested (each depth records on its own stream).
thread_local int body_depth = 0;

enum class Count : int { none, reset, increment };

/// Sets the node's condition from the scalar at p, non-zero meaning true (a NaN too, as
/// Tensor::item<bool>() reads it), and resets or increments the iteration count.
template <class T>
__global__ void set_condition_kernel(cudaGraphConditionalHandle h, const T* p, std::int64_t* count, Count c) {
  if (count && c == Count::reset) *count = 0;
  if (count && c == Count::increment) ++*count;
  cudaGraphSetConditional(h, *p != T(0) ? 1u : 0u);
}

Status set_condition(cudaStream_t s, cudaGraphConditionalHandle h, const void* p, DT dt, std::int64_t* count, Count c) {
  return visit(dt, [&](auto t) -> Status {
    using T = decltype(t);
    set_condition_kernel<T><<<1, 1, 0, s>>>(h, static_cast<const T*>(p), count, c);
    return launched();
  });
}

/// Adds a conditional node of `type` after what the capture recorded so far, its condition set
/// from p by a kernel just before it.
Status add_conditional(int device, cudaGraphConditionalNodeType type, unsigned size, const void* p, DT dt,
                       std::int64_t* count, abi::CondNode* out) {
  *out = nullptr;
  const cudaStream_t s = capture_stream_of(device);
  if (!s) return cudaErrorStreamCaptureUnmatched;
  cudaStreamCaptureStatus status{};
  cudaGraph_t graph = nullptr;
  if (const auto e = cudaStreamGetCaptureInfo(s, &status, nullptr, &graph)) return e;
  if (status != cudaStreamCaptureStatusActive || !graph) return cudaErrorStreamCaptureInvalidated;
  cudaGraphConditionalHandle h{};
  if (const auto e = cudaGraphConditionalHandleCreate(&h, graph, 0, 0)) return e;
  if (const Status e = set_condition(s, h, p, dt, count, Count::reset)) return e;
  const cudaGraphNode_t* deps = nullptr;
  std::size_t n_deps = 0;
  if (const auto e = cudaStreamGetCaptureInfo(s, &status, nullptr, &graph, &deps, nullptr, &n_deps)) return e;
  cudaGraphNodeParams params{};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = h;
  params.conditional.type = type;
  params.conditional.size = size;
  cudaGraphNode_t node = nullptr;
  if (const auto e = cudaGraphAddNode(&node, graph, deps, nullptr, n_deps, &params)) return e;
  // What the capture records next follows the node.
  if (const auto e = cudaStreamUpdateCaptureDependencies(s, &node, nullptr, 1, cudaStreamSetCaptureDependencies))
    return e;
  Cond* c = new (std::nothrow) Cond();
  if (!c) return cudaErrorMemoryAllocation;
  c->device = device;
  c->handle = h;
  c->n_bodies = size;
  for (unsigned b = 0; b < size; ++b) c->bodies[b] = params.conditional.phGraph_out[b];
  *out = c;
  return cudaSuccess;
}

void destroy(Exec* x) {
  if (x->exec) cudaGraphExecDestroy(x->exec);
  if (x->graph) cudaGraphDestroy(x->graph);
  delete x;
}

}  // namespace
}  // namespace stagecraft::cuda::kernels

namespace stagecraft::cuda::abi {
using namespace stagecraft::cuda::kernels;

void graph_body_destroy(GraphBody body) noexcept {
  if (body) cudaGraphDestroy(static_cast<cudaGraph_t>(body));
}

Status graph_instantiate(int device, GraphBody body, const GraphCopy* ins, int n_in, const GraphCopy* outs, int n_out,
                         GraphExec* out) noexcept {
  *out = nullptr;
  Exec* x = new (std::nothrow) Exec();
  if (!x) {
    graph_body_destroy(body);
    return cudaErrorMemoryAllocation;
  }
  x->device = device;
  x->graph = static_cast<cudaGraph_t>(body);  // kept: the copy nodes' handles belong to it
  const auto fail = [&](Status e) {
    destroy(x);
    cudaGetLastError();
    return e;
  };
  try {
    cudaStream_t s = nullptr;  // makes the device current
    if (const Status e = main_stream(device, &s)) return fail(e);
    std::size_t count = 0;
    if (const auto e = cudaGraphGetNodes(x->graph, nullptr, &count)) return fail(e);
    std::vector<cudaGraphNode_t> nodes(count);
    if (const auto e = cudaGraphGetNodes(x->graph, nodes.data(), &count)) return fail(e);
    std::vector<char> taken(count, 0);
    if (const Status e = find_copies(nodes, taken, ins, n_in, x->ins)) return fail(e);
    if (const Status e = find_copies(nodes, taken, outs, n_out, x->outs)) return fail(e);
    if (const auto e = cudaGraphInstantiate(&x->exec, x->graph, 0)) return fail(e);
  } catch (const std::bad_alloc&) {
    return fail(cudaErrorMemoryAllocation);
  }
  *out = x;
  return cudaSuccess;
}

Status graph_launch(GraphExec g, const GraphCopy* ins, int n_in, const GraphCopy* outs, int n_out, bool arm) noexcept {
  auto* x = static_cast<Exec*>(g);
  cudaStream_t s = nullptr;
  if (const Status e = main_stream(x->device, &s)) return e;
  if (const Status e = set_copies(x->exec, x->ins, ins, n_in)) return e;
  if (const Status e = set_copies(x->exec, x->outs, outs, n_out)) return e;
  if (const auto e = cudaGraphLaunch(x->exec, s)) return e;
  if (arm) arm_fault_check(x->device);
  return cudaSuccess;
}

void graph_destroy(GraphExec g) noexcept {
  if (g) destroy(static_cast<Exec*>(g));
}

Status capture_if(int device, const void* pred, DT dt, CondNode* out) noexcept {
  return add_conditional(device, cudaGraphCondTypeIf, 2, pred, dt, nullptr, out);
}

Status capture_while(int device, const void* pred, DT dt, std::int64_t* count, CondNode* out) noexcept {
  return add_conditional(device, cudaGraphCondTypeWhile, 1, pred, dt, count, out);
}

Status capture_while_next(CondNode node, const void* pred, DT dt, std::int64_t* count) noexcept {
  auto* c = static_cast<Cond*>(node);
  if (!c || !c->body) return cudaErrorIllegalState;
  return set_condition(c->body, c->handle, pred, dt, count, Count::increment);
}

Status capture_body_begin(CondNode node, int body) noexcept {
  auto* c = static_cast<Cond*>(node);
  if (!c || c->body || body < 0 || static_cast<unsigned>(body) >= c->n_bodies) return cudaErrorIllegalState;
  const cudaStream_t outer = capture_stream_of(c->device);
  if (!outer) return cudaErrorStreamCaptureUnmatched;
  cudaStream_t s = nullptr;
  if (const Status e = body_stream(c->device, body_depth + 1, &s)) return e;
  if (const auto e = cudaStreamBeginCaptureToGraph(s, c->bodies[body], nullptr, nullptr, 0, cudaStreamCaptureModeRelaxed))
    return e;
  ++body_depth;
  c->outer = outer;
  c->body = s;
  redirect_capture(s);
  return cudaSuccess;
}

Status capture_body_end(CondNode node) noexcept {
  auto* c = static_cast<Cond*>(node);
  if (!c || !c->body) return cudaErrorIllegalState;
  cudaGraph_t g = nullptr;  // the body's graph itself (the node owns it)
  auto e = cudaStreamEndCapture(c->body, &g);
  redirect_capture(c->outer);
  c->body = nullptr;
  --body_depth;
  // A body that recorded nothing (a branch of empty results) holds one empty node.
  std::size_t count = 0;
  if (e == cudaSuccess && g && (e = cudaGraphGetNodes(g, nullptr, &count)) == cudaSuccess && count == 0) {
    cudaGraphNode_t empty = nullptr;
    e = cudaGraphAddEmptyNode(&empty, g, nullptr, 0);
  }
  return e;
}

void capture_cond_free(CondNode node) noexcept {
  auto* c = static_cast<Cond*>(node);
  if (!c) return;
  if (c->body) {
    (void)capture_body_end(node);
    cudaGetLastError();
  }
  delete c;
}

}  // namespace stagecraft::cuda::abi
