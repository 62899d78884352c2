// Where a GPU training step's time goes (issue 8), for bench/gpu_session.sh's `profile` phase:
//   profile_cuda_steps <mlp|cnn|lstm> <eager|staged|graph> [steps]
// Warms up (5 steps), then times 30 steps two ways and prints one line:
//   step_us      the wall time of a step, waiting for the GPU after each (what bench_cuda reports)
//   enqueue_us   the host's time to queue one step (no wait): near step_us, the step is host-bound
// and the plan's statistics (kernels, fused groups) for the staged modes. Then `steps` more steps
// (default 2) between cudaProfilerStart and cudaProfilerStop, for
//   ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv ...
// (bench/ncu_summary.py sums that per kernel). With $SC_PLAN_TIMES set, a staged run also writes
// its plan there, each step with the host's time to run it (graph::plan_host_timing).
// The models are bench_cuda's: the example's MLP and
// CNN Adam steps at batch 128 on random data, the 50-step LSTM cell with its backward at batch 1.
#include <cuda_profiler_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "bench_models.hpp"
#include "fashion_mnist_models.hpp"  // examples/: the model the example trains

namespace {

using Clock = std::chrono::steady_clock;

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

/// Runs `step` as the mode says (sc::function-traced for staged/graph) and reports.
template <class Step, class... A>
int profile(const char* model, const std::string& mode, int steps, Step step, const A&... args) {
  sc::cuda::set_graphs(mode == "graph");
  auto f = sc::function(step);
  const std::function<sc::Tensor()> run = mode == "eager" ? std::function<sc::Tensor()>([&] { return step(args...); })
                                                          : std::function<sc::Tensor()>([&] { return sc::Tensor(f(args...)); });
  for (int i = 0; i < 5; ++i) run();
  sc::cuda::synchronize();
  constexpr int timed = 30;
  double step_us = 0, enqueue_us = 0;
  for (int i = 0; i < timed; ++i) {
    const auto t0 = Clock::now();
    run();
    const auto t1 = Clock::now();
    sc::cuda::synchronize();
    const auto t2 = Clock::now();
    enqueue_us += micros(t1 - t0);
    step_us += micros(t2 - t0);
  }
  std::string plan;
  if (mode != "eager") {
    const sc::FunctionStats s = f.get_concrete(args...).stats();
    plan = " plan_kernels=" + std::to_string(s.plan.kernels) + " fused_groups=" + std::to_string(s.plan.fused_groups) +
           " epilogues=" + std::to_string(s.plan.epilogues) + " graph=\"" + s.plan.cuda_graph + "\"";
  }
  std::printf("%s %s step_us=%.1f enqueue_us=%.1f%s\n", model, mode.c_str(), step_us / timed, enqueue_us / timed,
              plan.c_str());
  std::fflush(stdout);
  // Staged kernel by kernel: the host's time per plan step over 30 more steps (after the timing
  // above, which runs untimed), listed with the plan to the file $SC_PLAN_TIMES.
  if (const char* path = std::getenv("SC_PLAN_TIMES"); path != nullptr && mode == "staged") {
    sc::graph::plan_host_timing() = true;
    for (int i = 0; i < timed; ++i) run();
    sc::cuda::synchronize();
    sc::graph::plan_host_timing() = false;
    if (std::FILE* out = std::fopen(path, "w")) {
      const auto cf = f.get_concrete(args...);
      std::fputs(cf.plan().str().c_str(), out);
      std::fclose(out);
    }
  }
  cudaProfilerStart();
  for (int i = 0; i < steps; ++i) run();
  sc::cuda::synchronize();
  cudaProfilerStop();
  sc::cuda::set_graphs(false);
  return 0;
}

template <class Model>
int adam_step(const char* name, const std::string& mode, int steps) {
  const std::int64_t batch = 128;
  const sc::Tensor x = sc::random::uniform({batch, 28, 28}, 0.0, 1.0, 11);
  const sc::Tensor y = sc::cast(sc::random::uniform({batch}, 0.0, 10.0, 12), sc::i64);
  sc::manual_seed(0);
  Model model;
  sc::optim::Adam opt(1e-3);
  const std::vector<sc::Variable> vars = model.trainable_variables();
  return profile(name, mode, steps,
                 [&](const sc::Tensor& a, const sc::Tensor& b) { return fashion::train_step(model, opt, vars, a, b); }, x, y);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <mlp|cnn|lstm> <eager|staged|graph> [steps]\n", argv[0]);
    return 2;
  }
  if (!sc::cuda::is_available()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  const std::string model = argv[1], mode = argv[2];
  const int steps = argc > 3 ? std::atoi(argv[3]) : 2;
  if (mode != "eager" && mode != "staged" && mode != "graph") {
    std::fprintf(stderr, "mode: eager, staged or graph\n");
    return 2;
  }
  const sc::DeviceScope on(sc::Device::cuda(0));
  if (model == "mlp") return adam_step<fashion::MLP>("mlp", mode, steps);
  if (model == "cnn") return adam_step<fashion::CNN>("cnn", mode, steps);
  if (model == "lstm") {
    sc::manual_seed(1);
    const bench::LstmModel m(sc::Device::cuda(0));
    const auto vars = m.cell.trainable_variables();
    const sc::Tensor dummy = sc::zeros({1});
    return profile("lstm", mode, steps, [&](const sc::Tensor&) { return m.step(vars); }, dummy);
  }
  std::fprintf(stderr, "model: mlp, cnn or lstm\n");
  return 2;
}
