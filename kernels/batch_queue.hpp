// A device's queue of small eager ops (abi::batch_enqueue), shared by the kernel library's runtime
// (kernels/runtime.cu) and the CUDA emulator's (kernels/emulator/runtime.cpp): each gives the
// launch that runs a batch, and launches the queue (flush) before it puts anything else on the
// device's stream, which keeps the stream's order.
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>

#include "stagecraft/backend/cuda/abi.hpp"

namespace stagecraft::cuda::kernels::batch {

struct Queue {
  std::mutex mu;
  std::atomic<int> count{0};  // slots used; read without the lock by flush's quick test
  abi::BatchSlot slots[abi::batch_max_ops];
};

/// The counters of abi::batch_stats (all devices).
struct Counters {
  std::atomic<std::int64_t> ops{0}, batches{0};
};
inline Counters& counters() {
  static Counters c;
  return c;
}

/// Launches q's ops with launch(slots, n), emptying q (dropped if the launch fails: its status says
/// so to the caller); the caller holds q.mu. The count drops to 0 only once the launch is queued:
/// a flush on another thread that finds q empty without the lock may then queue its own work
/// after it (a count dropped first would let that work go on the stream before the batch).
template <class Launch>
abi::Status launch_locked(Queue& q, Launch&& launch) {
  const int n = q.count.load(std::memory_order_relaxed);
  if (n == 0) return 0;
  counters().batches.fetch_add(1, std::memory_order_relaxed);
  const abi::Status s = launch(static_cast<const abi::BatchSlot*>(q.slots), n);
  q.count.store(0, std::memory_order_release);
  return s;
}

/// Launches what q holds, if anything (one atomic load when it is empty).
template <class Launch>
abi::Status flush(Queue& q, Launch&& launch) {
  if (q.count.load(std::memory_order_acquire) == 0) return 0;
  const std::lock_guard<std::mutex> lock(q.mu);
  return launch_locked(q, launch);
}

/// Appends op (and its geometry g, when it has one: the next slot) to q, launching the batch
/// first when they do not fit and after when it is full.
template <class Launch>
abi::Status push(Queue& q, const abi::BatchOp& op, const abi::BatchGeometry* g, Launch&& launch) {
  const std::lock_guard<std::mutex> lock(q.mu);
  const int need = g != nullptr ? 2 : 1;
  if (q.count.load(std::memory_order_relaxed) + need > abi::batch_max_ops)
    if (const abi::Status s = launch_locked(q, launch)) return s;
  const int n = q.count.load(std::memory_order_relaxed);
  q.slots[n].op = op;
  if (g != nullptr) q.slots[n + 1].geo = *g;
  q.count.store(n + need, std::memory_order_release);
  counters().ops.fetch_add(1, std::memory_order_relaxed);
  return n + need == abi::batch_max_ops ? launch_locked(q, launch) : 0;
}

inline abi::BatchStats stats() noexcept {
  return {counters().ops.load(std::memory_order_relaxed), counters().batches.load(std::memory_order_relaxed)};
}

}  // namespace stagecraft::cuda::kernels::batch
