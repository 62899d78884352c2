// Training steps (forward, tape, gradients, Adam update) of the Fashion-MNIST models:
// stagecraft eager vs LibTorch 1.13 eager on the same architectures, in one run.
//   train/mlp/<lib>/batch:128, train/mlp/<lib>/batch:1, train/cnn/<lib>/batch:32
#include "bench_models.hpp"

#include "fashion_mnist_models.hpp"  // examples/: the very models the example trains

#if STAGECRAFT_BENCH_TORCH
#include <torch/torch.h>
#endif

namespace {

/// A fixed batch: images in [0, 1) and labels in [0, 10).
struct Batch {
  sc::Tensor x, y;
  explicit Batch(std::int64_t n)
      : x(sc::random::uniform({n, 28, 28}, 0.0, 1.0, 11)),
        y(sc::cast(sc::random::uniform({n}, 0.0, 10.0, 12), sc::i64)) {}
};

template <class Model>
void sc_step(benchmark::State& state) {
  const Batch b(state.range(0));
  sc::manual_seed(0);
  Model model;
  sc::optim::Adam opt(1e-3);
  const std::vector<sc::Variable> vars = model.trainable_variables();
  for (auto _ : state) {
    const sc::Tensor loss = fashion::train_step(model, opt, vars, b.x, b.y);
    benchmark::DoNotOptimize(loss.raw_data());
  }
  state.counters["examples/s"] =
      benchmark::Counter(static_cast<double>(state.range(0)), benchmark::Counter::kIsIterationInvariantRate);
}

/// The same step staged: traced once by sc::function (forward, gradients and Adam in one graph).
template <class Model>
void sc_staged_step(benchmark::State& state) {
  const Batch b(state.range(0));
  sc::manual_seed(0);
  Model model;
  sc::optim::Adam opt(1e-3);
  const std::vector<sc::Variable> vars = model.trainable_variables();
  auto step = sc::function([&](sc::Tensor x, sc::Tensor y) { return fashion::train_step(model, opt, vars, x, y); });
  for (auto _ : state) {
    const sc::Tensor loss = step(b.x, b.y);
    benchmark::DoNotOptimize(loss.raw_data());
  }
  state.counters["examples/s"] =
      benchmark::Counter(static_cast<double>(state.range(0)), benchmark::Counter::kIsIterationInvariantRate);
}

#if STAGECRAFT_BENCH_TORCH
using bench::TorchCNN;
using bench::TorchMLP;

template <class Model>
void torch_step(benchmark::State& state) {
  const Batch b(state.range(0));
  const torch::Tensor x = bench::as_torch(b.x);
  const torch::Tensor y = torch::from_blob(b.y.raw_data(), {state.range(0)}, torch::kLong);
  torch::manual_seed(0);
  Model model;
  torch::optim::Adam opt(model.parameters(), torch::optim::AdamOptions(1e-3));
  for (auto _ : state) {
    opt.zero_grad();
    torch::Tensor loss = torch::nn::functional::cross_entropy(model.forward(x), y);
    loss.backward();
    opt.step();
    benchmark::DoNotOptimize(loss.data_ptr());
  }
  state.counters["examples/s"] =
      benchmark::Counter(static_cast<double>(state.range(0)), benchmark::Counter::kIsIterationInvariantRate);
}
#endif

BENCHMARK(sc_step<fashion::MLP>)->Name("train/mlp/stagecraft")->ArgName("batch")->Arg(128)->Arg(1)->UseRealTime();
BENCHMARK(sc_step<fashion::CNN>)->Name("train/cnn/stagecraft")->ArgName("batch")->Arg(32)->UseRealTime();
BENCHMARK(sc_staged_step<fashion::MLP>)->Name("train/mlp/stagecraft_staged")->ArgName("batch")->Arg(128)->Arg(1)->UseRealTime();
BENCHMARK(sc_staged_step<fashion::CNN>)->Name("train/cnn/stagecraft_staged")->ArgName("batch")->Arg(32)->UseRealTime();
#if STAGECRAFT_BENCH_TORCH
BENCHMARK(torch_step<TorchMLP>)->Name("train/mlp/libtorch")->ArgName("batch")->Arg(128)->Arg(1)->UseRealTime();
BENCHMARK(torch_step<TorchCNN>)->Name("train/cnn/libtorch")->ArgName("batch")->Arg(32)->UseRealTime();
#endif

}  // namespace

STAGECRAFT_BENCH_MAIN()
