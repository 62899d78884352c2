// nn::TransformerEncoderLayer: in evaluation mode it equals its definition written with its own
// (separately tested) parts, post-norm and pre-norm, relu and gelu; dropout in training mode;
// variable gradients by central differences; a traced training step equal to the eager one;
// errors.
#include <catch2/catch.hpp>
#include <stagecraft/nn/layers.hpp>
#include <stagecraft/stagecraft.hpp>

#include <string>
#include <vector>

#include "testing.hpp"

namespace {

using sctest::check_close;
using sctest::error_of;

std::vector<double> flat(const sc::Tensor& t) { return t.to_vector<double>(); }

/// Gives every trainable variable distinct values (biases and norms start at 0 and 1).
void randomize(sc::Module& m, std::uint64_t seed) {
  for (sc::Variable& v : m.trainable_variables())
    v.assign((sc::random::normal(v.shape(), ++seed) * 0.3).astype(v.dtype()));
}

}  // namespace

TEST_CASE("TransformerEncoderLayer: evaluation equals its definition, post-norm and pre-norm", "[layers][transformer]") {
  for (const bool norm_first : {false, true})
    for (const bool gelu : {false, true}) {
      INFO((norm_first ? "pre-norm" : "post-norm") << (gelu ? ", gelu" : ", relu"));
      sc::nn::TransformerEncoderLayer layer(8, 2, {.ff_dim = 16, .dropout = 0.3, .norm_first = norm_first, .gelu = gelu},
                                            7, sc::f64);
      randomize(layer, 100);
      layer.eval();
      CHECK_FALSE(layer.training());
      const sc::Tensor x = sc::random::normal({3, 5, 8}, 1).astype(sc::f64);
      const sc::nn::AttentionOptions causal{.causal = true};
      const auto ff = [&](const sc::Tensor& h) {
        const sc::Tensor a = layer.linear1(h);
        return layer.linear2(gelu ? sc::nn::gelu(a) : sc::relu(a));
      };
      sc::Tensor want;
      if (norm_first) {
        const sc::Tensor y = x + layer.self_attention(layer.norm1(x), causal);
        want = y + ff(layer.norm2(y));
      } else {
        const sc::Tensor y = layer.norm1(x + layer.self_attention(x, causal));
        want = layer.norm2(y + ff(y));
      }
      const sc::Tensor got = layer(x, causal);
      CHECK(got.shape() == sc::Shape{3, 5, 8});
      check_close(flat(got), flat(want), 1e-12);
    }
}

TEST_CASE("TransformerEncoderLayer: variables, dropout in training, gradients, traced steps", "[layers][transformer]") {
  sc::nn::TransformerEncoderLayer layer(4, 2, {.ff_dim = 6, .dropout = 0.5}, 3, sc::f64);
  randomize(layer, 200);
  const auto names = layer.named_variables();
  std::vector<std::string> trainable;
  for (const auto& [name, v] : names)
    if (v.trainable()) trainable.push_back(name);
  CHECK(trainable.size() == 16);
  CHECK(trainable.front() == "self_attention/query/kernel");
  CHECK(trainable.back() == "norm2/beta");
  CHECK(names.size() == 19);  // and the three dropouts' generator states
  const sc::Tensor x = sc::random::normal({2, 3, 4}, 2).astype(sc::f64);
  // training: dropout masks differ from step to step and from evaluation
  CHECK(layer.training());
  const auto a = flat(layer(x)), b = flat(layer(x));
  layer.eval();
  const auto e = flat(layer(x));
  CHECK(a != b);
  CHECK(a != e);
  CHECK(flat(layer(x)) == e);
  // variable gradients by central differences (evaluation: no masks), through the causal mask
  const sc::Tensor w = sc::random::normal({2, 3, 4}, 3).astype(sc::f64);
  sctest::check_variable_gradients([&] { return sc::sum(layer(x, {.causal = true}) * w); },
                                   layer.trainable_variables(), 1e-7, 1e-6);
}

TEST_CASE("TransformerEncoderLayer: a traced Adam step equals the eager one and training lowers the loss",
          "[layers][transformer]") {
  const auto run = [](bool traced) {
    sc::nn::TransformerEncoderLayer layer(8, 4, {.ff_dim = 16, .dropout = 0.1, .norm_first = true}, 11);
    sc::optim::Adam opt(1e-2);
    const sc::Tensor x = sc::random::normal({4, 6, 8}, 5), target = sc::random::normal({4, 6, 8}, 6);
    auto step = [&](const sc::Tensor& in) {
      sc::GradientTape tape;
      const sc::Tensor l = sc::mean(sc::square(layer(in, {.causal = true}) - target));
      opt.apply(tape.gradient(l, layer.trainable_variables()), layer.trainable_variables());
      return l;
    };
    auto f = sc::function(step);
    std::vector<float> losses;
    for (int i = 0; i < 30; ++i) losses.push_back((traced ? f(x) : step(x)).item<float>());
    return losses;
  };
  const auto eager = run(false), traced = run(true);
  for (std::size_t i = 0; i < eager.size(); ++i) CHECK(traced[i] == Approx(eager[i]).epsilon(1e-4));
  CHECK(eager.back() < 0.7f * eager.front());
}

TEST_CASE("TransformerEncoderLayer: errors", "[layers][transformer][errors]") {
  std::string msg = error_of<sc::ValueError>([] { sc::nn::TransformerEncoderLayer bad(8, 2, {.ff_dim = 0}); });
  CHECK_THAT(msg, Catch::Contains("[TransformerEncoderLayer]") && Catch::Contains("ff_dim"));
  msg = error_of<sc::ValueError>([] { sc::nn::TransformerEncoderLayer bad(8, 3); });
  CHECK_THAT(msg, Catch::Contains("multiple of heads"));
  msg = error_of<sc::ValueError>([] { sc::nn::TransformerEncoderLayer bad(8, 2, {.dropout = 1.5}); });
  CHECK_THAT(msg, Catch::Contains("[Dropout]"));
  sc::nn::TransformerEncoderLayer layer(8, 2, {.ff_dim = 4}, 1);
  msg = error_of<sc::ShapeError>([&] { (void)layer(sc::ones({2, 3, 6})); });
  CHECK_THAT(msg, Catch::Contains("[MultiHeadAttention]") && Catch::Contains("[2, 3, 6]") &&
                      Catch::Contains("test_transformer.cpp"));
}
