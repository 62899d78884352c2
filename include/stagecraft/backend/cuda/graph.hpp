// Whether staged plans on a GPU are replayed as CUDA graphs (graph/plan.hpp does the capture and
// the replay; kernels/graph.cu the CUDA side).
#pragma once
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace stagecraft::cuda {

/// When a staged function's plan that runs wholly on one GPU is captured as a CUDA graph (on its
/// second call) and replayed from then on: one launch per call instead of one per kernel, at the
/// price of copying the call's arguments and variable values into the graph's storage and its
/// results out (a copy kernel each way), and of keeping that storage while the plan lives.
enum class GraphPolicy : int {
  never,         ///< every plan runs kernel by kernel
  when_cheaper,  ///< (the default) a plan whose copies cost less than the launches they save:
                 ///< at most config::cuda_graph_bytes_per_launch copied per kernel it launches
  always,        ///< every plan that can be captured is
};

namespace detail {
/// -1: not set yet (read the environment), else a GraphPolicy.
inline std::atomic<int>& graphs_setting() {
  static std::atomic<int> s{-1};
  return s;
}
}  // namespace detail

/// The process's policy: set_graph_policy's, else the environment variable STAGECRAFT_CUDA_GRAPHS
/// read once ("1": always, "0": never, unset or anything else: when_cheaper).
inline GraphPolicy graph_policy() {
  int s = detail::graphs_setting().load(std::memory_order_relaxed);
  if (s < 0) {
    const char* e = std::getenv("STAGECRAFT_CUDA_GRAPHS");  // NOLINT(concurrency-mt-unsafe): read once
    const GraphPolicy p = e == nullptr              ? GraphPolicy::when_cheaper
                          : std::strcmp(e, "1") == 0 ? GraphPolicy::always
                          : std::strcmp(e, "0") == 0 ? GraphPolicy::never
                                                     : GraphPolicy::when_cheaper;
    int expected = -1;
    detail::graphs_setting().compare_exchange_strong(expected, static_cast<int>(p));
    s = detail::graphs_setting().load(std::memory_order_relaxed);
  }
  return static_cast<GraphPolicy>(s);
}

/// Sets the policy for the process (plans already captured keep their graphs, and use them again
/// whenever the policy lets them).
inline void set_graph_policy(GraphPolicy p) { detail::graphs_setting().store(static_cast<int>(p), std::memory_order_relaxed); }

/// True unless the policy is never.
inline bool graphs_enabled() { return graph_policy() != GraphPolicy::never; }

/// set_graphs(true): always; set_graphs(false): never.
inline void set_graphs(bool on) { set_graph_policy(on ? GraphPolicy::always : GraphPolicy::never); }

}  // namespace stagecraft::cuda
