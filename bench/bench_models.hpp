// Models more than one benchmark executable times: the 50-step LSTM cell with its backward pass
// (bench_staged on the CPU, bench_cuda on a GPU), and LibTorch's copies of the Fashion-MNIST
// models (torch_models.hpp) where LibTorch is built in.
#pragma once
#include <vector>

#include "bench_common.hpp"

#if STAGECRAFT_BENCH_TORCH
#include "torch_models.hpp"  // TorchMLP, TorchCNN
#endif

namespace bench {

/// An LSTM cell 32 -> 64 at batch 1 unrolled over 50 inputs; loss = sum(h_50), with the gradients
/// of the cell's variables. Made where the current DeviceScope says (its inputs on `d`).
constexpr int lstm_steps = 50;
struct LstmModel {
  sc::nn::LSTMCell cell{32, 64};
  std::vector<sc::Tensor> xs;
  explicit LstmModel(sc::Device d = sc::Device::cpu()) {
    for (int t = 0; t < lstm_steps; ++t) xs.push_back(input({1, 32}, 100 + t).to(d));
  }
  /// Forward and backward; returns the loss.
  sc::Tensor step(const std::vector<sc::Variable>& vars) const {
    sc::GradientTape tape;
    auto state = cell.initial_state(1);
    for (const sc::Tensor& x : xs) state = cell(x, state);
    const sc::Tensor loss = sc::sum(state.first);
    const auto g = tape.gradient(loss, vars);
    return loss + (sc::sum(g[0]) + sc::sum(g[1]) + sc::sum(g[2])) * 0.f;  // keeps every gradient alive (and in the staged graph)
  }
};

}  // namespace bench
