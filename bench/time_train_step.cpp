// Wall time of the Fashion-MNIST models' training step (examples/fashion_mnist_models.hpp), eager
// and traced by sc::function, on one thread: 7 rounds of 50 steps (CNN: 10), median and best round
// per step. Without Google Benchmark, so that two trees' headers (old and new) can be compiled with
// the same command and run alternately:
//   g++ -std=c++20 -O2 -march=x86-64-v3 -fopenmp -DNDEBUG -I<tree>/include -Iexamples
//       -I/usr/include/x86_64-linux-gnu/openblas-openmp bench/time_train_step.cpp -lopenblas -lz
//   (one command line)
//   ./a.out [batch=128] [mlp|cnn|lstm]      (SC_THREADS=n: n threads instead of one)
// lstm: bench_models.hpp's 50-step LSTM cell 32 -> 64 with its backward pass (`./a.out 1 lstm`
// is bench_staged's row at batch 1), then the kernels of its plan fused as on a GPU, and of the
// plan a GPU lowers (the graph relabelled cuda:0; with and without graph::product_fusion).
// layer_norm: the gradients of sum(layer_norm(x, gamma, beta) * r) over [batch, 1024] (`./a.out
// 4096 layer_norm` is bench_activations' layer_norm_grad), and the step's memory high-water mark
// above what lives across steps: eager, the layer_norm is a staged call under the tape (its
// forward keeps residuals for its backward, graph/split.hpp).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <stagecraft/stagecraft.hpp>

#include "fashion_mnist_models.hpp"

namespace {

/// 7 rounds of `per_round` calls of step(args...) eager, then traced by sc::function; prints the
/// median and best round per call (and, with `peak`, the memory high-water mark above what lived
/// before the rounds).
template <class Step, class... A>
void time_rounds(const char* model, int batch, int per_round, Step step, const A&... args) {
  auto traced = sc::function(step);
  for (int staged = 0; staged < 2; ++staged) {
    (void)sc::Tensor(staged ? sc::Tensor(traced(args...)) : sc::Tensor(step(args...))).item<float>();
    sc::reset_peak_memory();
    const std::size_t live = sc::memory_stats().bytes_in_use;
    std::vector<double> ms;
    for (int r = 0; r < 7; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < per_round; ++i) (void)sc::Tensor(staged ? sc::Tensor(traced(args...)) : sc::Tensor(step(args...))).item<float>();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / per_round);
    }
    std::sort(ms.begin(), ms.end());
    std::printf("%s %s batch %d: %.3f ms (best %.3f), peak %.1f MB above live\n", model, staged ? "staged" : "eager",
                batch, ms[3], ms[0], static_cast<double>(sc::memory_stats().peak_bytes_in_use - live) / 1e6);
  }
}

}  // namespace

int main(int argc, char** argv) {
  sc::set_num_threads(std::getenv("SC_THREADS") != nullptr ? std::atoi(std::getenv("SC_THREADS")) : 1);
  const int batch = argc > 1 ? std::atoi(argv[1]) : 128;
  const std::string model = argc > 2 ? argv[2] : "mlp";
  if (model == "lstm") {
    sc::nn::LSTMCell cell{32, 64, 7};
    std::vector<sc::Tensor> xs;
    for (int t = 0; t < 50; ++t) xs.push_back(sc::random::uniform({batch, 32}, -1.0, 1.0, 100 + t));
    const auto vars = cell.trainable_variables();
    const auto step = [&] {
      sc::GradientTape tape;
      auto state = cell.initial_state(batch);
      for (const sc::Tensor& x : xs) state = cell(x, state);
      const sc::Tensor loss = sc::sum(state.first);
      const auto g = tape.gradient(loss, vars);
      return loss + (sc::sum(g[0]) + sc::sum(g[1]) + sc::sum(g[2])) * 0.f;
    };
    time_rounds("lstm", batch, 20, step);
    // The plan's kernels with every size fused, as a GPU plan fuses (each a launch there).
    sc::graph::fusion_min_elements() = 1;
    auto traced = sc::function(step);
    (void)traced();
    std::printf("lstm plan fused as on a GPU: %d kernels\n", traced.get_concrete().stats().plan.kernels);
    // The plan a GPU lowers, without one: the traced graph relabelled cuda:0, optimized and
    // lowered as for a GPU (nothing runs), with and without products formed in their groups.
    sc::graph::Graph g = traced.get_concrete().graph();
    for (sc::graph::Value& v : g.values) v.device = sc::Device::cuda(0);
    sc::graph::cuda_fusion() = true;
    for (const auto mode : {sc::graph::ProductFusion::gpu, sc::graph::ProductFusion::off}) {
      sc::graph::product_fusion() = mode;
      const sc::graph::PlanStats st = sc::graph::Plan(std::make_shared<const sc::graph::Graph>(sc::graph::optimize(g))).stats();
      std::printf("lstm plan lowered for a GPU%s: %d kernels (%d products formed in groups)\n",
                  mode == sc::graph::ProductFusion::off ? ", products apart" : "", st.kernels, st.fused_products);
    }
    return 0;
  }
  if (model == "layer_norm") {
    const std::int64_t cols = 1024;
    const sc::Tensor x = sc::random::uniform({batch, cols}, -1.0, 1.0, 1), r = sc::random::uniform({batch, cols}, -1.0, 1.0, 3);
    const sc::Tensor gamma = sc::random::uniform({cols}, 0.5, 1.5, 4), beta = sc::random::uniform({cols}, -1.0, 1.0, 5);
    time_rounds("layer_norm", batch, 10, [&](const sc::Tensor& a) {
      sc::GradientTape tape;
      tape.watch({a, gamma, beta});
      const sc::Tensor loss = sc::sum(sc::nn::layer_norm(a, {cols}, gamma, beta) * r);
      const auto g = tape.gradient(loss, {a, gamma, beta});
      return loss + (sc::sum(g[0]) + sc::sum(g[1]) + sc::sum(g[2])) * 0.f;
    }, x);
    return 0;
  }
  const bool cnn = model == "cnn";
  const sc::Tensor x = sc::random::uniform({batch, 28, 28}, 0.0, 1.0, 11);
  const sc::Tensor y = sc::cast(sc::random::uniform({batch}, 0.0, 10.0, 12), sc::i64);
  fashion::MLP mlp;
  fashion::CNN conv;
  sc::optim::Adam opt(1e-3);
  const auto vars = cnn ? conv.trainable_variables() : mlp.trainable_variables();
  time_rounds(cnn ? "cnn" : "mlp", batch, cnn ? 10 : 50, [&](const sc::Tensor& a, const sc::Tensor& b) {
    return cnn ? fashion::train_step(conv, opt, vars, a, b) : fashion::train_step(mlp, opt, vars, a, b);
  }, x, y);
  return 0;
}
