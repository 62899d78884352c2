// CUDA graphs of staged plans: one capture of the copies that bring a call's arguments in, the
// plan's kernels, and the copies that carry its results out. The copies are kernels whose
// pointers each launch replaces, so a call costs one graph launch however many tensors it moves.
// (One capture rather than a child graph between copy nodes: a library that allocates in stream
// order while captured, as cuBLAS does, leaves memory nodes, which a child graph may not hold.)
// A copy kernel moves up to copy_list_max tensors (a block row each): a training step's ~20
// variables come in with one node and leave with another, where a memcpy node each cost a node's
// latency and a host call per launch to re-point it.
#include <cstdint>
#include <new>
#include <vector>

#include "common.cuh"

namespace stagecraft::cuda::kernels {
namespace {

constexpr int copy_list_max = 32;

/// The copies of one copy kernel, passed by value (its node's parameters: replaced per launch).
struct CopyList {
  int n = 0;
  void* dst[copy_list_max] = {};
  const void* src[copy_list_max] = {};
  std::size_t bytes[copy_list_max] = {};
};

/// n / sizeof(W) words of type W from s to d, the grid's threads striding over them.
template <class W>
__device__ void copy_words(void* d, const void* s, std::size_t n, std::size_t first, std::size_t step) {
  auto* dw = static_cast<W*>(d);
  const auto* sw = static_cast<const W*>(s);
  for (std::size_t i = first; i < n / sizeof(W); i += step) dw[i] = sw[i];
}

/// Copy k = blockIdx.y of the list, blocks along x striding over its bytes: 16 at a time when
/// both ends and the size allow (the allocator's blocks do), else 4, else byte by byte.
__global__ void copy_list_kernel(CopyList l) {
  const int k = blockIdx.y;
  if (k >= l.n) return;
  const std::size_t n = l.bytes[k];
  const std::size_t first = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x, step = std::size_t{gridDim.x} * blockDim.x;
  const auto bits = reinterpret_cast<std::uintptr_t>(l.dst[k]) | reinterpret_cast<std::uintptr_t>(l.src[k]) | n;
  if ((bits & 15u) == 0) copy_words<uint4>(l.dst[k], l.src[k], n, first, step);
  else if ((bits & 3u) == 0) copy_words<unsigned>(l.dst[k], l.src[k], n, first, step);
  else copy_words<unsigned char>(l.dst[k], l.src[k], n, first, step);
}

/// A copy kernel's node and the launch shape it was captured with.
struct CopyNode {
  cudaGraphNode_t node = nullptr;
  int which = 0;  ///< 0: copies in, 1: copies out
  int first = 0;  ///< index of its first copy
  int n = 0;
  dim3 grid, block;
};

/// The copy kernels this thread's capture recorded (capture_copies(.., 0, ..) starts anew).
thread_local std::vector<CopyNode> recorded_copies;

struct Exec {
  int device = 0;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<CopyNode> copies;
  int n_in = 0, n_out = 0;
};

/// Points the copy kernels of x at this launch's tensors (as many copies, of the same sizes, as captured).
Status set_copies(Exec& x, const abi::GraphCopy* ins, int n_in, const abi::GraphCopy* outs, int n_out) {
  if (n_in != x.n_in || n_out != x.n_out) return cudaErrorInvalidValue;
  for (const CopyNode& c : x.copies) {
    const abi::GraphCopy* from = (c.which == 0 ? ins : outs) + c.first;
    CopyList l;
    l.n = c.n;
    for (int i = 0; i < c.n; ++i) {
      l.dst[i] = from[i].dst;
      l.src[i] = from[i].src;
      l.bytes[i] = from[i].bytes;
    }
    void* args[] = {&l};
    cudaKernelNodeParams p{};
    p.func = reinterpret_cast<void*>(&copy_list_kernel);
    p.gridDim = c.grid;
    p.blockDim = c.block;
    p.kernelParams = args;
    if (const auto e = cudaGraphExecKernelNodeSetParams(x.exec, c.node, &p)) return e;
  }
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

Status capture_copies(int device, int which, const GraphCopy* c, int n) noexcept {
  if (which == 0) recorded_copies.clear();
  const cudaStream_t s = capture_stream_of(device);
  if (!s) return cudaErrorStreamCaptureUnmatched;
  for (int first = 0; first < n; first += copy_list_max) {
    CopyList l;
    l.n = n - first < copy_list_max ? n - first : copy_list_max;
    std::size_t most = 0;
    for (int i = 0; i < l.n; ++i) {
      l.dst[i] = c[first + i].dst;
      l.src[i] = c[first + i].src;
      l.bytes[i] = c[first + i].bytes;
      most = l.bytes[i] > most ? l.bytes[i] : most;
    }
    // Enough blocks that each thread moves a few 16-byte words of the largest copy (the sizes
    // are the graph's: the same at every launch).
    const std::size_t per_block = std::size_t{block_threads} * 16 * 4;
    const std::size_t bx = (most + per_block - 1) / per_block;
    const dim3 grid(static_cast<unsigned>(bx < 1 ? 1 : (bx > 1024 ? 1024 : bx)), static_cast<unsigned>(l.n)), block(block_threads);
    copy_list_kernel<<<grid, block, 0, s>>>(l);
    if (const Status e = launched()) return e;
    // The node just recorded: the one the capture's next launch would depend on.
    cudaStreamCaptureStatus status{};
    cudaGraph_t graph = nullptr;
    const cudaGraphNode_t* deps = nullptr;
    std::size_t n_deps = 0;
    if (const auto e = cudaStreamGetCaptureInfo(s, &status, nullptr, &graph, &deps, nullptr, &n_deps)) return e;
    if (status != cudaStreamCaptureStatusActive || n_deps != 1) return cudaErrorStreamCaptureInvalidated;
    try {
      recorded_copies.push_back({deps[0], which, first, l.n, grid, block});
    } catch (const std::bad_alloc&) {
      return cudaErrorMemoryAllocation;
    }
  }
  return cudaSuccess;
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
    x->copies = std::move(recorded_copies);
    recorded_copies.clear();
    x->n_in = n_in;
    x->n_out = n_out;
    int covered[2] = {0, 0};  // the capture recorded a kernel for every copy, in order
    for (const CopyNode& c : x->copies) {
      if (c.first != covered[c.which]) return fail(cudaErrorGraphExecUpdateFailure);
      covered[c.which] += c.n;
    }
    if (covered[0] != n_in || covered[1] != n_out) return fail(cudaErrorGraphExecUpdateFailure);
    (void)ins, (void)outs;
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
  if (const Status e = set_copies(*x, ins, n_in, outs, n_out)) return e;
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
