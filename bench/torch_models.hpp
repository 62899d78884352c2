// LibTorch's copies of the Fashion-MNIST models (examples/fashion_mnist_models.hpp), for the rows
// that time LibTorch beside stagecraft (bench_train on the CPU, bench_cuda_torch on a GPU).
// LibTorch only: bench_cuda_torch builds on the GPU machine without stagecraft's headers.
#pragma once
#include <cstdint>

#include <torch/torch.h>

namespace bench {

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

/// The Fashion-MNIST CNN in LibTorch.
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

}  // namespace bench
