// GPU model rows of bench_cuda (issue 8), side by side in one run: the Fashion-MNIST MLP's Adam
// step at batch 128 and the 50-step LSTM cell with its backward pass at batch 1, each eager,
// staged (kernel by kernel), staged and replayed as a CUDA graph (LibTorch eager on the same GPU:
// bench_cuda_torch.cpp, same row names with /libtorch). Each timed iteration ends with a
// synchronize: a row is the GPU's time per step.
// And a loop whose number of rounds the data decide (100 rounds of a small update, tested on the
// GPU each round): eager and staged wait for the GPU at every test; replayed as a CUDA graph, the
// while_loop is a conditional node and the host does not wait.
// And the convolutions, cuDNN against the im2col kernels + cuBLAS (sc::cuda::ConvAlgorithm): the
// Fashion-MNIST CNN's Adam step at batch 128, and its second layer's three passes (conv2d, its
// input and its kernel gradient) alone (LibTorch's, cuDNN: bench_cuda_torch.cpp).
//   cuda/mlp_adam/batch128/mode:<m>, cuda/lstm50/mode:<m>, cuda/while100/mode:<m> (0 eager,
//   1 staged kernel by kernel, 2 staged + graph always, 3 staged under the library's default
//   graph policy: the MLP and LSTM only; the LSTM's 4 and 5: eager with the cell's ops one by one,
//   small ops batched (sc::cuda::eager_batching) or a launch each), .../libtorch
//   cuda/cnn_adam/batch128/algo:<a>/mode:<m>, cuda/conv2d/32x14x14_to_64/algo:<a> (0 cuDNN,
//   1 im2col), .../libtorch
#include "bench_models.hpp"
#include "bench_timed.hpp"
#include "fashion_mnist_models.hpp"  // examples/: the model the example trains

namespace {

const sc::Device gpu = sc::Device::cuda(0);

enum Mode : int { eager = 0, staged = 1, staged_graph = 2, staged_default = 3, ops_batched = 4, ops_unbatched = 5 };

using bench::timed;
void sc_sync() { sc::cuda::synchronize(); }

/// Times `mode` of one model's step(args...): eager, or traced by sc::function (CUDA graphs off
/// for staged, always for staged_graph, the default policy for staged_default); the row's label is
/// note() and how the staged plan ran.
template <class Note, class Step, class... A>
void sc_modes(benchmark::State& state, Mode mode, Note note, Step step, const A&... args) {
  const sc::cuda::GraphPolicy was = sc::cuda::graph_policy();
  if (mode != staged_default) sc::cuda::set_graphs(mode == staged_graph);
  auto f = sc::function(step);
  if (mode == eager) timed(state, [&] { return step(args...); }, sc_sync);
  else timed(state, [&] { return sc::Tensor(f(args...)); }, sc_sync);
  std::string label = note();
  if (mode != eager) label += (label.empty() ? "graph: " : "; graph: ") + f.get_concrete(args...).stats().plan.cuda_graph;
  state.SetLabel(label);
  sc::cuda::set_graph_policy(was);
}
std::string no_note() { return {}; }

bool need_gpu(benchmark::State& state) {
  if (!sc::cuda::is_available()) state.SkipWithError("no CUDA device");
  return sc::cuda::is_available();
}

/// A Fashion-MNIST model's Adam step (examples/fashion_mnist_models.hpp) at batch `batch` on random
/// images and labels, in `mode`.
template <class Model, class Note>
void sc_adam_step(benchmark::State& state, std::int64_t batch, Mode mode, Note note) {
  const sc::DeviceScope on(gpu);
  const sc::Tensor x = sc::random::uniform({batch, 28, 28}, 0.0, 1.0, 11);
  const sc::Tensor y = sc::cast(sc::random::uniform({batch}, 0.0, 10.0, 12), sc::i64);
  sc::manual_seed(0);
  Model model;
  sc::optim::Adam opt(1e-3);
  const std::vector<sc::Variable> vars = model.trainable_variables();
  sc_modes(state, mode, note,
           [&](const sc::Tensor& a, const sc::Tensor& b) { return fashion::train_step(model, opt, vars, a, b); }, x, y);
  state.counters["examples/s"] = benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
}

constexpr std::int64_t mlp_batch = 128;

void mlp_step(benchmark::State& state) {
  if (need_gpu(state)) sc_adam_step<fashion::MLP>(state, mlp_batch, static_cast<Mode>(state.range(0)), no_note);
}
BENCHMARK(mlp_step)->Name("cuda/mlp_adam/batch128")->ArgName("mode")->Arg(eager)->Arg(staged)->Arg(staged_graph)->Arg(staged_default)
    ->UseRealTime()->Unit(benchmark::kMicrosecond);

void lstm(benchmark::State& state) {
  if (!need_gpu(state)) return;
  const sc::DeviceScope on(gpu);
  sc::manual_seed(1);
  const bench::LstmModel m(gpu);
  const auto vars = m.cell.trainable_variables();
  const Mode mode = static_cast<Mode>(state.range(0));
  if (mode == ops_batched || mode == ops_unbatched) {
    // eager, the cell's ops one by one (as a user's own cell runs), the small ones batched or not
    const bool staging = sc::nn::lstm_cell_staging(), batching = sc::cuda::eager_batching();
    sc::nn::lstm_cell_staging() = false;
    sc::cuda::set_eager_batching(mode == ops_batched);
    timed(state, [&] { return m.step(vars); }, sc_sync);
    sc::nn::lstm_cell_staging() = staging;
    sc::cuda::set_eager_batching(batching);
    state.SetLabel(mode == ops_batched ? "cell op by op, eager batches" : "cell op by op, a launch per op");
    return;
  }
  const sc::Tensor dummy = sc::zeros({1});
  sc_modes(state, mode, no_note, [&](const sc::Tensor&) { return m.step(vars); }, dummy);
}
BENCHMARK(lstm)->Name("cuda/lstm50")->ArgName("mode")->Arg(eager)->Arg(staged)->Arg(staged_graph)->Arg(staged_default)
    ->Arg(ops_batched)->Arg(ops_unbatched)->UseRealTime()->Unit(benchmark::kMicrosecond);

constexpr int while_rounds = 100;

/// x <- 0.9 x + 0.1 tanh(x) over [64, 64] while the round counter n (a GPU scalar) is below 100.
std::tuple<sc::Tensor, sc::Tensor> rounds(const sc::Tensor& x, const sc::Tensor& n) {
  return sc::while_loop([](const sc::Tensor&, const sc::Tensor& k) { return k < static_cast<float>(while_rounds); },
                        [](const sc::Tensor& v, const sc::Tensor& k) { return std::make_tuple(v * 0.9f + sc::tanh(v) * 0.1f, k + 1.f); },
                        std::make_tuple(x, n));
}

void while_loop(benchmark::State& state) {
  if (!need_gpu(state)) return;
  const sc::DeviceScope on(gpu);
  const sc::Tensor x = sc::random::uniform({64, 64}, -1.0, 1.0, 13), n = sc::zeros({});
  sc_modes(state, static_cast<Mode>(state.range(0)), no_note,
           [](const sc::Tensor& a, const sc::Tensor& k) { return std::get<0>(rounds(a, k)); }, x, n);
}
BENCHMARK(while_loop)->Name("cuda/while100")->ArgName("mode")->Arg(eager)->Arg(staged)->Arg(staged_graph)
    ->UseRealTime()->Unit(benchmark::kMicrosecond);

/// The label part naming where a row's convolutions ran (and the setting restored after).
class ConvRow {
 public:
  explicit ConvRow(std::int64_t algo) : saved_(sc::cuda::conv_algorithm()) {
    sc::cuda::set_conv_algorithm(algo == 0 ? sc::cuda::ConvAlgorithm::cudnn : sc::cuda::ConvAlgorithm::im2col);
    sc::cuda::reset_conv_stats();
  }
  ~ConvRow() { sc::cuda::set_conv_algorithm(saved_); }
  ConvRow(const ConvRow&) = delete;
  ConvRow& operator=(const ConvRow&) = delete;
  /// "cudnn 97%" of the passes queued so far (those of a CUDA graph's capture only once).
  static std::string label() {
    const sc::cuda::ConvStats st = sc::cuda::conv_stats();
    const std::int64_t n = st.cudnn + st.im2col;
    return "cudnn passes " + std::to_string(n ? 100 * st.cudnn / n : 0) + "% (" + sc::cuda::cudnn_status() + ")";
  }

 private:
  sc::cuda::ConvAlgorithm saved_;
};

constexpr std::int64_t cnn_batch = 128;

void cnn_step(benchmark::State& state) {
  if (!need_gpu(state)) return;
  const ConvRow row(state.range(0));
  sc_adam_step<fashion::CNN>(state, cnn_batch, static_cast<Mode>(state.range(1)), ConvRow::label);
}
BENCHMARK(cnn_step)->Name("cuda/cnn_adam/batch128")->ArgNames({"algo", "mode"})
    ->ArgsProduct({{0, 1}, {eager, staged, staged_graph}})->UseRealTime()->Unit(benchmark::kMicrosecond);

/// The CNN's second layer at batch 128: x [128, 32, 14, 14], w [64, 32, 3, 3], padding 1.
const sc::Shape layer_x{cnn_batch, 32, 14, 14}, layer_w{64, 32, 3, 3}, layer_y{cnn_batch, 64, 14, 14};
/// Floating-point operations of the three passes (2 per multiply-add, each pass one product's worth).
constexpr double layer_flop = 3.0 * 2 * cnn_batch * 64 * 14 * 14 * 32 * 3 * 3;

void conv_layer(benchmark::State& state) {
  if (!need_gpu(state)) return;
  const ConvRow row(state.range(0));
  const sc::DeviceScope on(gpu);
  const sc::Tensor x = sc::random::uniform(layer_x, -1.0, 1.0, 16), w = sc::random::uniform(layer_w, -0.1, 0.1, 17);
  const sc::Tensor g = sc::random::uniform(layer_y, -1.0, 1.0, 18);
  timed(state, [&] {
    return std::make_tuple(sc::nn::conv2d(x, w, 1, 1), sc::nn::conv2d_grad_input(g, w, layer_x, 1, 1),
                           sc::nn::conv2d_grad_filter(x, g, layer_w, 1, 1));
  }, sc_sync);
  state.SetLabel(ConvRow::label());
  state.counters["TFLOP/s"] = benchmark::Counter(layer_flop * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(conv_layer)->Name("cuda/conv2d/32x14x14_to_64")->ArgName("algo")->Arg(0)->Arg(1)
    ->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
