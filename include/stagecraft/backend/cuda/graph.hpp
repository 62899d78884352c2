// Whether staged plans on a GPU are replayed as CUDA graphs (graph/plan.hpp does the capture and
// the replay; kernels/graph.cu the CUDA side).
#pragma once
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace stagecraft::cuda {
namespace detail {
/// -1: not set yet (read the environment), 0: off, 1: on.
inline std::atomic<int>& graphs_setting() {
  static std::atomic<int> s{-1};
  return s;
}
}  // namespace detail

/// True when a staged function's plan that runs wholly on one GPU is captured as a CUDA graph on
/// its second call and replayed from then on (one launch per call instead of one per kernel).
/// Off by default; on with set_graphs(true) or the environment variable STAGECRAFT_CUDA_GRAPHS=1.
inline bool graphs_enabled() {
  int s = detail::graphs_setting().load(std::memory_order_relaxed);
  if (s < 0) {
    const char* e = std::getenv("STAGECRAFT_CUDA_GRAPHS");  // NOLINT(concurrency-mt-unsafe): read once
    s = e != nullptr && std::strcmp(e, "1") == 0 ? 1 : 0;
    int expected = -1;
    detail::graphs_setting().compare_exchange_strong(expected, s);
    s = detail::graphs_setting().load(std::memory_order_relaxed);
  }
  return s == 1;
}

/// Turns CUDA-graph replay of staged plans on or off for the process (plans already captured keep
/// their graphs, and use them again when it is turned back on).
inline void set_graphs(bool on) { detail::graphs_setting().store(on ? 1 : 0, std::memory_order_relaxed); }

}  // namespace stagecraft::cuda
