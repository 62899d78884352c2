// Eager composites of large CPU tensors run staged. nn::layer_norm, softmax, log_softmax and the
// activations (gelu, gelu_tanh, silu, elu, softplus) are written with other ops; eager, each of
// those ops is a pass over the tensor (layer_norm: about nine), while traced the fusion pass runs
// them as one or two. So an eager call on a large tensor runs the composite's ops as a staged
// function (graph/function.hpp): traced once per shape, dtype and parameters, then its plan; under
// a GradientTape the call is differentiable as any sc::function call (its backward staged too).
// The values are those of the same ops traced (the eager ones' up to the order of a reduction's
// additions). Small tensors, calls inside a trace, tensors on a GPU or under another DeviceScope
// run op by op as before.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <source_location>
#include <utility>
#include <vector>

#include "../backend/cpu/parallel.hpp"
#include "../core/device.hpp"
#include "../graph/function.hpp"

namespace stagecraft::nn {

/// Whether eager composites of large CPU tensors run staged (default true; false: op by op). The
/// setting is the process's; reading and assigning it from several threads is safe.
inline std::atomic<bool>& composite_staging() {
  static std::atomic<bool> on{true};
  return on;
}
/// The fewest elements of a composite's input for it to run staged with several threads (default
/// 262144, 1 MiB of f32; with one thread (num_threads()) four times that; 0: every size). Below it
/// the ops' passes stay in the L2 cache and run about as fast as the staged plan, or faster:
/// measured with bench/composite_threshold.cpp on a 16-core Xeon (16 threads: 0.5-1.2x at
/// 4096-65536 elements, 1.5-2.4x at 262144, 4-24x from 1M; 1 thread: 0.7-1.6x at 262144,
/// 0.95-2.6x from 1M).
inline std::atomic<std::int64_t>& composite_staging_min_elements() {
  static std::atomic<std::int64_t> n{262144};
  return n;
}

/// While alive, eager composites run staged or not (`on`) and, when given, from `min_elements`
/// elements; the settings before it come back when it is destroyed. The settings are the
/// process's, so scopes on several threads at once restore in no defined order.
class CompositeStagingScope {
 public:
  explicit CompositeStagingScope(bool on, std::optional<std::int64_t> min_elements = std::nullopt)
      : was_on_(composite_staging()), was_min_(composite_staging_min_elements()) {
    composite_staging() = on;
    if (min_elements) composite_staging_min_elements() = *min_elements;
  }
  ~CompositeStagingScope() {
    composite_staging() = was_on_;
    composite_staging_min_elements() = was_min_;
  }
  CompositeStagingScope(const CompositeStagingScope&) = delete;
  CompositeStagingScope& operator=(const CompositeStagingScope&) = delete;

 private:
  bool was_on_;
  std::int64_t was_min_;
};

namespace composite_detail {
/// Traces kept per composite and parameters (distinct shapes and dtypes; default 8); calls with
/// another shape after that run op by op, so a program of many shapes holds at most this many
/// plans. Read when a composite's staged function is made.
inline int& max_traces() {
  static int n = 8;
  return n;
}
/// Parameter sets kept per composite (eps, axis, alpha...); others run op by op.
inline constexpr std::size_t max_bodies = 16;

/// Staged calls made, for tests.
inline std::atomic<std::uint64_t>& staged_calls() {
  static std::atomic<std::uint64_t> n{0};
  return n;
}

/// Whether this eager call may run staged: staging on, no trace under way, every tensor given
/// concrete and on the CPU, no DeviceScope elsewhere, and x at least the threshold (four times it
/// on one thread).
template <class... T>
bool eligible(const Tensor& x, const T&... rest) {
  if (!composite_staging() || stagecraft::detail::context().trace != nullptr) return false;
  const std::int64_t min = composite_staging_min_elements() * (num_threads() > 1 ? 1 : 4);
  if (x.is_symbolic() || x.shape().numel() < min) return false;
  for (const Tensor* t : {&x, &rest...})
    if (t->is_symbolic() || !t->device().is_cpu()) return false;
  const Device* scoped = stagecraft::detail::scoped_device();
  return scoped == nullptr || scoped->is_cpu();
}

/// The staged functions of one composite, one per parameter set. Never destroyed: plans may be
/// released at exit after the allocators they return memory to.
template <class Body>
struct Cache {
  std::mutex mu;
  std::vector<std::pair<Body, Function<Body>>> fns;
};
template <class Body>
Cache<Body>& cache() {
  static auto* c = new Cache<Body>();
  return *c;
}

/// body(x, rest...) through body's staged function, or nullopt where the call is not eligible
/// or the composite's cache is full (the caller then runs the ops itself). `body` compares equal
/// to another of the same parameters; its call returns one Tensor.
template <class Body, class... T>
std::optional<Tensor> run(const Body& body, const char* name, const std::source_location& loc, const Tensor& x,
                          const T&... rest) {
  if (!eligible(x, rest...)) return std::nullopt;
  Cache<Body>& c = cache<Body>();
  std::optional<Function<Body>> f;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    for (auto& [b, fn] : c.fns)
      if (b == body) {
        f = fn;
        break;
      }
    if (!f) {
      if (c.fns.size() >= max_bodies) return std::nullopt;
      f.emplace(body, name);
      f->set_retrace_log(false);  // a trace per shape is expected
      f->set_max_traces(max_traces());
      c.fns.emplace_back(body, *f);
    }
  }
  ++staged_calls();
  return (*f)(Operand(x, loc), rest...);
}

}  // namespace composite_detail

}  // namespace stagecraft::nn
