// The Fashion-MNIST models (MLP, CNN) and one eager training step, shared by the example,
// the training benchmarks and the memory test so all three time and check the same code.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include <stagecraft/stagecraft.hpp>
#include <stagecraft/nn/layers.hpp>
#include <stagecraft/optim/adam.hpp>
#include <stagecraft/state/module.hpp>

namespace fashion {

namespace sc = stagecraft;

/// 784-256-128-10 with ReLU. Takes images [N, 28, 28] (or [N, 784]) and returns logits [N, 10].
struct MLP : sc::Module {
  sc::nn::Dense l1{784, 256}, l2{256, 128}, l3{128, 10};
  MLP() { add({{"l1", l1}, {"l2", l2}, {"l3", l3}}); }
  sc::Tensor operator()(const sc::Tensor& images) const {
    const sc::Tensor x = sc::reshape(images, {images.shape()[0], 784});
    return l3(sc::relu(l2(sc::relu(l1(x)))));
  }
};

/// conv(1→32, 3, pad 1)-relu-maxpool2-conv(32→64, 3, pad 1)-relu-maxpool2-dense(64·7·7→128)
/// -relu-dense(→10). Takes images [N, 28, 28] (or [N, 1, 28, 28]) and returns logits [N, 10].
struct CNN : sc::Module {
  sc::nn::Conv2D c1{1, 32, 3, 1, 1}, c2{32, 64, 3, 1, 1};
  sc::nn::Dense d1{64 * 7 * 7, 128}, d2{128, 10};
  CNN() { add({{"conv1", c1}, {"conv2", c2}, {"dense1", d1}, {"dense2", d2}}); }
  sc::Tensor operator()(const sc::Tensor& images) const {
    const std::int64_t n = images.shape()[0];
    sc::Tensor x = sc::reshape(images, {n, 1, 28, 28});
    x = sc::nn::max_pool2d(sc::relu(c1(x)), 2, 2);  // [N, 32, 14, 14]
    x = sc::nn::max_pool2d(sc::relu(c2(x)), 2, 2);  // [N, 64, 7, 7]
    x = sc::reshape(x, {n, 64 * 7 * 7});
    return d2(sc::relu(d1(x)));
  }
};

/// One eager training step: forward under a tape, cross-entropy, gradients, optimizer update.
/// Returns the batch's mean loss (a scalar tensor; reading it is the caller's choice).
template <class Model, class Opt>
sc::Tensor train_step(const Model& model, Opt& opt, const std::vector<sc::Variable>& vars, const sc::Tensor& x,
                      const sc::Tensor& y) {
  sc::Tensor loss;
  std::vector<sc::Tensor> grads;
  {
    sc::GradientTape tape;
    loss = sc::nn::cross_entropy(model(x), y);
    grads = tape.gradient(loss, vars);
  }
  opt.apply(grads, vars);
  return loss;
}

/// Number of correct predictions (argmax of the logits == label) over a whole set, evaluated
/// in batches of `batch` so memory stays bounded.
template <class Model>
std::int64_t count_correct(const Model& model, const sc::Tensor& images, const sc::Tensor& labels,
                           std::int64_t batch = 1000) {
  const std::int64_t n = images.shape()[0];
  std::int64_t correct = 0;
  for (std::int64_t begin = 0; begin < n; begin += batch) {
    const std::int64_t len = std::min(batch, n - begin);
    std::vector<std::int64_t> b(static_cast<std::size_t>(images.rank()), 0), sz(b.size(), -1);
    b[0] = begin;
    sz[0] = len;
    const sc::Tensor x = sc::slice(images, b, sz);
    const sc::Tensor y = sc::slice(labels, {begin}, {len});
    const sc::Tensor hits = sc::equal(sc::argmax(model(x), 1), y);
    correct += sc::sum(hits.astype(sc::i64)).item<std::int64_t>();
  }
  return correct;
}

}  // namespace fashion
