// Helpers of the GPU tests: run a function on CPU inputs and on their GPU copies, compare results.
#pragma once
#include "testing.hpp"

#if defined(STAGECRAFT_CUDA_EMULATOR)
#include "emulator/emu.hpp"
#endif

#include <cmath>
#include <functional>
#include <utility>
#include <vector>

namespace sctest::cuda {

using Fn = std::function<sc::Tensor(const std::vector<sc::Tensor>&)>;
inline const sc::Device gpu = sc::Device::cuda(0);

/// Values of `got` (from the GPU) against `want` (CPU): equal within tol (absolute or relative), NaN
/// where NaN, the same infinity where infinite.
inline void check_same(const sc::Tensor& got, const sc::Tensor& want, double tol) {
  REQUIRE(got.device() == gpu);
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.dtype() == want.dtype());
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  for (std::size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i << ": gpu " << g[i] << ", cpu " << w[i]);
    if (std::isnan(w[i])) CHECK(std::isnan(g[i]));
    else if (std::isinf(w[i])) CHECK(g[i] == w[i]);
    else CHECK(g[i] == Approx(w[i]).margin(tol).epsilon(tol));
  }
}

/// Each result of a GPU run against the CPU run's, in order (check_same each).
inline void check_all_same(const std::vector<sc::Tensor>& got, const std::vector<sc::Tensor>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (std::size_t k = 0; k < want.size(); ++k) {
    INFO("result " << k);
    check_same(got[k], want[k], tol);
  }
}

/// run(device, traced) -> results: on the GPU, eager and traced, equal to the CPU's eager run.
template <class Run>
void same_on_gpu_eager_and_traced(const Run& run, double tol) {
  const std::vector<sc::Tensor> want = run(sc::Device::cpu(), false);
  for (const bool traced : {false, true}) {
    INFO((traced ? "traced" : "eager"));
    check_all_same(run(gpu, traced), want, tol);
  }
}

/// Sets the CUDA-graph policy for a scope, and back to what it was.
struct GraphPolicyScope {
  sc::cuda::GraphPolicy was = sc::cuda::graph_policy();
  explicit GraphPolicyScope(sc::cuda::GraphPolicy p) { sc::cuda::set_graph_policy(p); }
  ~GraphPolicyScope() { sc::cuda::set_graph_policy(was); }
  GraphPolicyScope(const GraphPolicyScope&) = delete;
  GraphPolicyScope& operator=(const GraphPolicyScope&) = delete;
};

/// Sets eager batching (sc::cuda::eager_batching) for a scope, and back to what it was.
struct BatchingScope {
  bool was = sc::cuda::eager_batching();
  explicit BatchingScope(bool on) { sc::cuda::set_eager_batching(on); }
  ~BatchingScope() { sc::cuda::set_eager_batching(was); }
  BatchingScope(const BatchingScope&) = delete;
  BatchingScope& operator=(const BatchingScope&) = delete;
};

/// What the host asked of the GPU while some code ran, as the CUDA emulator counts it; -1 each
/// on a real GPU, which does not count.
struct Launches {
  std::int64_t kernels = -1, copies = -1, graphs = -1;
};
template <class F>
Launches counted(F&& f) {
#if defined(STAGECRAFT_CUDA_EMULATOR)
  // (small ops queued before f are launched first, and the ones f queued are launched: counted)
  sc::cuda::flush();
  const auto before = sc::cuda::emu::counts();
  f();
  sc::cuda::flush();
  const auto after = sc::cuda::emu::counts();
  return {after.kernels - before.kernels, after.copies - before.copies, after.graph_launches - before.graph_launches};
#else
  // The same flushes, so that a test's batch counts (sc::cuda::batch_stats) read alike on both.
  sc::cuda::flush();
  f();
  sc::cuda::flush();
  return {};
#endif
}

/// Kernels and copies the host asked of the GPU while f ran (counted()'s first two).
template <class F>
std::pair<std::int64_t, std::int64_t> launches_of(F&& f) {
  const Launches n = counted(std::forward<F>(f));
  return {n.kernels, n.copies};
}

/// f on CPU inputs, and on their copies on the GPU, give the same tensor.
inline void same_on_gpu(const Fn& f, const std::vector<sc::Tensor>& in, double tol) {
  std::vector<sc::Tensor> on_gpu;
  for (const sc::Tensor& t : in) on_gpu.push_back(t.to(gpu));
  check_same(f(on_gpu), f(in), tol);
}

/// Test values of dtype d and shape s: small integers for integer dtypes, [-2, 2) otherwise.
inline sc::Tensor values(sc::Shape s, sc::DType d, std::uint64_t seed) {
  const sc::Tensor x = sctest::uniform_tensor(s, seed, -2.0, 2.0);
  return sc::is_floating(d) ? x.astype(d) : (x * 3).astype(d);
}
/// RAII: GPU convolutions run as `a` while alive (the process-wide setting is restored after).
class ConvAlgorithmScope {
 public:
  explicit ConvAlgorithmScope(sc::cuda::ConvAlgorithm a) : saved_(sc::cuda::conv_algorithm()) {
    sc::cuda::set_conv_algorithm(a);
  }
  ~ConvAlgorithmScope() { sc::cuda::set_conv_algorithm(saved_); }
  ConvAlgorithmScope(const ConvAlgorithmScope&) = delete;
  ConvAlgorithmScope& operator=(const ConvAlgorithmScope&) = delete;

 private:
  sc::cuda::ConvAlgorithm saved_;
};
inline const char* algorithm_name(sc::cuda::ConvAlgorithm a) {
  return a == sc::cuda::ConvAlgorithm::cudnn ? "cudnn" : "im2col";
}

inline double tol_of(sc::DType d) { return d == sc::f32 ? 2e-6 : d == sc::f64 ? 1e-13 : 0.0; }

}  // namespace sctest::cuda
