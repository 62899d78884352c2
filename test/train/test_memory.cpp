// Memory flatness of eager training: the MLP trained on synthetic data holds the same tensor
// bytes and the same resident set after epoch 5 as after epoch 1 (nothing accumulates per step).
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <catch2/catch.hpp>

#include "fashion_mnist_models.hpp"  // examples/: the model the example trains
#include "testing.hpp"

namespace sc = stagecraft;

namespace {

/// Resident set size of this process in bytes (second field of /proc/self/statm, in pages).
std::size_t rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  REQUIRE(f != nullptr);
  unsigned long size = 0, resident = 0;
  const int got = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  REQUIRE(got == 2);
  return static_cast<std::size_t>(resident) * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

struct Usage {
  std::size_t tensor_bytes, rss;
};

/// Trains a fresh MLP for `epochs` epochs of 4 batches of 64 synthetic images; returns the
/// usage measured after each epoch (between epochs, when only the model, the optimizer and
/// the data are alive). With keep_gradients every step's gradients are kept alive, a leak the
/// check must see.
std::vector<Usage> train(int epochs, bool keep_gradients) {
  constexpr std::int64_t n = 256, batch = 64;
  const sc::Tensor images = sc::random::uniform({n, 28, 28}, 0.0, 1.0, 1);
  const sc::Tensor labels = sc::cast(sc::random::uniform({n}, 0.0, 10.0, 2), sc::i64);
  sc::manual_seed(0);
  fashion::MLP model;
  sc::optim::Adam opt(1e-3);
  const std::vector<sc::Variable> vars = model.trainable_variables();
  std::vector<std::vector<sc::Tensor>> kept;
  std::vector<Usage> out;
  double first_loss = 0, last_loss = 0;
  for (int e = 0; e < epochs; ++e) {
    for (std::int64_t b = 0; b < n; b += batch) {
      const sc::Tensor x = sc::slice(images, {b, 0, 0}, {batch, -1, -1});
      const sc::Tensor y = sc::slice(labels, {b}, {batch});
      sc::Tensor loss;
      {
        sc::GradientTape tape;
        loss = sc::nn::cross_entropy(model(x), y);
        std::vector<sc::Tensor> grads = tape.gradient(loss, vars);
        opt.apply(grads, vars);
        if (keep_gradients) kept.push_back(std::move(grads));
      }
      last_loss = loss.item<double>();
      if (e == 0 && b == 0) first_loss = last_loss;
    }
    out.push_back({sc::memory_stats().bytes_in_use, rss_bytes()});
  }
  CHECK(last_loss < first_loss);  // it did train (memorising 256 examples)
  return out;
}

/// |after / before - 1|.
double rel_change(std::size_t before, std::size_t after) {
  return std::abs(static_cast<double>(after) / static_cast<double>(before) - 1.0);
}

}  // namespace

TEST_CASE("eager MLP training keeps tensor memory and RSS flat from epoch 1 to epoch 5", "[train][memory]") {
  // one thread: flatness does not depend on the thread count, and on a busy shared machine
  // OpenMP's spinning barriers make 2-thread steps 10-50x slower
  const sctest::ThreadCount one(1);
  train(1, false);  // warm the allocator cache, OpenMP and OpenBLAS buffers once
  const std::vector<Usage> u = train(5, false);
  const std::size_t params = 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10;
  INFO("tensor bytes in use after epoch 1: " << u[0].tensor_bytes << ", after epoch 5: " << u[4].tensor_bytes);
  INFO("RSS after epoch 1: " << u[0].rss << ", after epoch 5: " << u[4].rss);
  // Weights and Adam's two slots are alive (3 f32 copies of every parameter), plus the data.
  CHECK(u[0].tensor_bytes >= 3 * 4 * params);
  CHECK(rel_change(u[0].tensor_bytes, u[4].tensor_bytes) <= 0.05);
  CHECK(rel_change(u[0].rss, u[4].rss) <= 0.05);
}

TEST_CASE("the flatness check sees gradients kept alive from step to step", "[train][memory]") {
  const sctest::ThreadCount one(1);  // (one thread: see above)
  const std::vector<Usage> u = train(5, true);
  INFO("tensor bytes in use after epoch 1: " << u[0].tensor_bytes << ", after epoch 5: " << u[4].tensor_bytes);
  // 16 more steps' gradients (one parameter copy each) on top of 4: far beyond 5%.
  CHECK(rel_change(u[0].tensor_bytes, u[4].tensor_bytes) > 0.05);
  CHECK(u[4].tensor_bytes > u[0].tensor_bytes);
}
