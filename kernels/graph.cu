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

}  // namespace stagecraft::cuda::abi
