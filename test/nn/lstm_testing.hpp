// Helpers of the tests of nn::LSTMCell's staged step (test/nn/test_lstm_staged.cpp on the CPU,
// test/cuda/test_cuda_eager_staged.cpp on a GPU): the staging switch for a scope, and runs of a
// cell under tapes whose results the tests compare with staging on and off.
#pragma once
#include <stagecraft/nn/layers.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cstddef>
#include <memory>
#include <vector>

#include "testing.hpp"

namespace sctest::lstm {

/// Sets sc::nn::lstm_cell_staging() for the scope.
struct StagingScope {
  bool was = stagecraft::nn::lstm_cell_staging();
  explicit StagingScope(bool on) { stagecraft::nn::lstm_cell_staging() = on; }
  ~StagingScope() { stagecraft::nn::lstm_cell_staging() = was; }
  StagingScope(const StagingScope&) = delete;
  StagingScope& operator=(const StagingScope&) = delete;
};

/// A cell made on device d (under a DeviceScope) holding copies of `cell`'s weights.
inline std::unique_ptr<stagecraft::nn::LSTMCell> copy_on(const stagecraft::nn::LSTMCell& cell, stagecraft::Device d) {
  std::unique_ptr<stagecraft::nn::LSTMCell> c;
  {
    const stagecraft::DeviceScope on(d);
    c = std::make_unique<stagecraft::nn::LSTMCell>(cell.input_size(), cell.hidden_size(), 0, cell.kernel.dtype());
  }
  c->kernel.assign(cell.kernel.value().to(d));
  c->recurrent_kernel.assign(cell.recurrent_kernel.value().to(d));
  c->bias.assign(cell.bias.value().to(d));
  return c;
}

/// `xs.size()` steps from the zero state under a tape: {loss, d kernel, d recurrent, d bias, d x0};
/// `entries` (when given) gets the tape's entry count after the steps.
inline std::vector<stagecraft::Tensor> run(const stagecraft::nn::LSTMCell& cell, const std::vector<stagecraft::Tensor>& xs,
                                           std::size_t* entries = nullptr) {
  namespace sc = stagecraft;
  sc::GradientTape tape;
  tape.watch(xs[0]);
  auto state = cell.initial_state(xs[0].shape()[0]);
  for (const sc::Tensor& x : xs) state = cell(x, state);
  if (entries != nullptr) *entries = tape.size();
  const sc::Tensor loss = sc::sum(state.first * state.second);
  std::vector<sc::Tensor> r = tape.gradient(loss, std::vector<sc::Tensor>{cell.kernel, cell.recurrent_kernel, cell.bias, xs[0]});
  r.insert(r.begin(), loss);
  return r;
}

/// Two steps from the zero state on x, with `staging`: {g, h} where g is the gradient of
/// sum(h_2^2) by x and h the gradient of sum(g^2) by x (nested tapes).
inline std::vector<stagecraft::Tensor> second_derivatives(const stagecraft::nn::LSTMCell& cell, const stagecraft::Tensor& x,
                                                          bool staging) {
  namespace sc = stagecraft;
  const StagingScope mode(staging);
  return gradient_and_its_gradient(
      [&](const sc::Tensor& v) {
        auto st = cell(v, cell(v, cell.initial_state(v.shape()[0])));
        return sc::sum(st.first * st.first);
      },
      x);
}

}  // namespace sctest::lstm
