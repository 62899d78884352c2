// Models more than one benchmark executable times: the 50-step LSTM cell with its backward pass
// (bench_staged on the CPU, bench_cuda on a GPU) and LibTorch's copy of the Fashion-MNIST MLP
// (bench_train, bench_cuda).
#pragma once
#include <vector>

#include "bench_common.hpp"

#if STAGECRAFT_BENCH_TORCH
#include <torch/torch.h>
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
    return loss + sc::sum(g[0]) * 0.f;  // keeps every gradient alive (and in the staged graph)
  }
};

#if STAGECRAFT_BENCH_TORCH
/// The Fashion-MNIST MLP in LibTorch: 784-256-128-10, ReLU.
struct TorchMLP : torch::nn::Module {
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr};
  TorchMLP() {
    l1 = register_module("l1", torch::nn::Linear(784, 256));
    l2 = register_module("l2", torch::nn::Linear(256, 128));
    l3 = register_module("l3", torch::nn::Linear(128, 10));
  }
  torch::Tensor forward(const torch::Tensor& images) {
    const torch::Tensor x = images.reshape({images.size(0), 784});
    return l3(torch::relu(l2(torch::relu(l1(x)))));
  }
};

/// The Fashion-MNIST CNN (examples/fashion_mnist_models.hpp) in LibTorch.
struct TorchCNN : torch::nn::Module {
  torch::nn::Conv2d c1{nullptr}, c2{nullptr};
  torch::nn::Linear d1{nullptr}, d2{nullptr};
  TorchCNN() {
    c1 = register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).padding(1)));
    c2 = register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)));
    d1 = register_module("d1", torch::nn::Linear(64 * 7 * 7, 128));
    d2 = register_module("d2", torch::nn::Linear(128, 10));
  }
  torch::Tensor forward(const torch::Tensor& images) {
    const std::int64_t n = images.size(0);
    torch::Tensor x = images.reshape({n, 1, 28, 28});
    x = torch::max_pool2d(torch::relu(c1(x)), 2, 2);
    x = torch::max_pool2d(torch::relu(c2(x)), 2, 2);
    x = x.reshape({n, 64 * 7 * 7});
    return d2(torch::relu(d1(x)));
  }
};
#endif

}  // namespace bench
