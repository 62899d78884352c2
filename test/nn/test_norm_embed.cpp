// sc::var, nn::layer_norm / nn::LayerNorm, nn::dropout / nn::Dropout and nn::Embedding: against
// plain loops, by central differences, traced against eager, and every error path.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include "testing.hpp"

namespace {

using sc::Shape;
using sc::Tensor;

std::string at(int line) { return "at test_norm_embed.cpp:" + std::to_string(line); }

/// Rows of `inner` elements: mean, population variance and the normalized values, in double.
std::vector<double> layer_norm_reference(const std::vector<double>& x, std::int64_t inner, double eps,
                                         const std::vector<double>& gamma, const std::vector<double>& beta) {
  std::vector<double> y(x.size());
  for (std::size_t r = 0; r < x.size() / static_cast<std::size_t>(inner); ++r) {
    const std::size_t o = r * static_cast<std::size_t>(inner);
    double m = 0, v = 0;
    for (std::int64_t k = 0; k < inner; ++k) m += x[o + static_cast<std::size_t>(k)];
    m /= static_cast<double>(inner);
    for (std::int64_t k = 0; k < inner; ++k) v += (x[o + static_cast<std::size_t>(k)] - m) * (x[o + static_cast<std::size_t>(k)] - m);
    v /= static_cast<double>(inner);
    for (std::int64_t k = 0; k < inner; ++k) {
      const auto i = static_cast<std::size_t>(k);
      y[o + i] = (x[o + i] - m) / std::sqrt(v + eps) * gamma[i] + beta[i];
    }
  }
  return y;
}

}  // namespace

TEST_CASE("var: against loops over axes, with a correction, integers, empty axes, gradients", "[nn][var]") {
  const Tensor x = sctest::uniform_tensor({3, 4, 5}, 1, -3, 7);
  const std::vector<double> v = x.to_vector<double>();
  // over axis 1, both corrections
  for (std::int64_t c : {0, 1}) {
    const Tensor got = sc::var(x, {1}, false, c);
    REQUIRE(got.shape() == Shape{3, 5});
    const auto g = got.to_vector<double>();
    for (int i = 0; i < 3; ++i)
      for (int k = 0; k < 5; ++k) {
        double m = 0, s = 0;
        for (int j = 0; j < 4; ++j) m += v[static_cast<std::size_t>((i * 4 + j) * 5 + k)];
        m /= 4;
        for (int j = 0; j < 4; ++j) {
          const double d = v[static_cast<std::size_t>((i * 4 + j) * 5 + k)] - m;
          s += d * d;
        }
        CHECK(g[static_cast<std::size_t>(i * 5 + k)] == Approx(s / static_cast<double>(4 - c)).epsilon(1e-13));
      }
  }
  // all axes, keepdims; a large offset does not cancel (two passes)
  CHECK(sc::var(sc::tensor({1e9 + 1, 1e9 + 3, 1e9 + 5, 1e9 + 7})).item<double>() == 5.0);
  CHECK(sc::var(x, {}, true).shape() == Shape{1, 1, 1});
  CHECK(sc::var(sc::tensor({1, 2, 3, 4})).dtype() == sc::f32);
  CHECK(sc::var(sc::tensor({1, 2, 3, 4})).item<float>() == 1.25f);
  CHECK(std::isnan(sc::var(sc::tensor({2.0}), {}, false, 1).item<double>()));
  CHECK(std::isnan(sc::var(sc::zeros({0})).item<float>()));
  int line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::var(x, {}, false, -1), Catch::Contains("[var] correction must be >= 0, got -1") && Catch::Contains(at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::var(x, {3}), Catch::Contains("[var]") && Catch::Contains(at(line)));
  sctest::check_rows({{"var over axis 1", [](const std::vector<Tensor>& t) { return sc::var(t[0], {1}, false, 1); },
                       {sctest::uniform_tensor({2, 4, 3}, 2, -2, 2)}},
                      {"var of all", [](const std::vector<Tensor>& t) { return sc::var(t[0]); },
                       {sctest::uniform_tensor({3, 3}, 3, -2, 2)}}});
}

TEMPLATE_TEST_CASE("layer_norm matches loops and LayerNorm learns gamma and beta", "[nn][layer_norm]", float, double) {
  using T = TestType;
  const sc::DType d = sc::dtype_of<T>();
  const double tol = std::is_same_v<T, float> ? 2e-5 : 1e-12;
  struct Case {
    Shape x, normalized;
  };
  for (const Case& c : {Case{{4, 7}, {7}}, Case{{2, 3, 5}, {3, 5}}, Case{{6}, {6}}, Case{{2, 1, 9}, {9}}}) {
    const Tensor x = (sctest::uniform_tensor(c.x, 4, -3, 3) * 2 + 5).astype(d);
    const Tensor gamma = sctest::uniform_tensor(c.normalized, 5, 0.5, 1.5).astype(d);
    const Tensor beta = sctest::uniform_tensor(c.normalized, 6, -1, 1).astype(d);
    const std::int64_t inner = c.normalized.numel();
    INFO(sctest::str(c.x) << " over " << sctest::str(c.normalized));
    const auto want = layer_norm_reference(x.to_vector<double>(), inner, 1e-5, gamma.to_vector<double>(), beta.to_vector<double>());
    const Tensor y = sc::nn::layer_norm(x, c.normalized, gamma, beta);
    REQUIRE(y.shape() == c.x);
    REQUIRE(y.dtype() == d);
    sctest::check_close(y.to_vector<double>(), want, tol);
    // no affine: gamma 1, beta 0
    const std::vector<double> ones(static_cast<std::size_t>(inner), 1.0), zeros(static_cast<std::size_t>(inner), 0.0);
    sctest::check_close(sc::nn::layer_norm(x, c.normalized).template to_vector<double>(),
                        layer_norm_reference(x.to_vector<double>(), inner, 1e-5, ones, zeros), tol);
  }
  // the layer: its variables, its result, its gradient flowing to gamma and beta
  sc::nn::LayerNorm ln(5, 1e-5, d);
  const auto vars = ln.trainable_variables();
  REQUIRE(vars.size() == 2);
  CHECK(vars[0].name() == "gamma");
  CHECK(vars[1].name() == "beta");
  const Tensor x = sctest::uniform_tensor({3, 5}, 7, -2, 2).astype(d);
  sctest::check_close(ln(x).to_vector<double>(), sc::nn::layer_norm(x, {5}).to_vector<double>(), 0);
  sc::GradientTape tape;
  const Tensor loss = sc::sum(ln(x) * sc::arange(5).astype(d));
  const auto g = tape.gradient(loss, vars);
  REQUIRE(g.size() == 2);
  CHECK(g[1].to_vector<double>() == std::vector<double>{0, 3, 6, 9, 12});  // d/dbeta: the column weight, 3 rows
}

TEST_CASE("layer_norm: gradients, traced, errors", "[nn][layer_norm][grad]") {
  sctest::check_rows({{"layer_norm x, gamma, beta",
                       [](const std::vector<Tensor>& t) { return sc::nn::layer_norm(t[0], {4}, t[1], t[2]); },
                       {sctest::uniform_tensor({3, 4}, 1, -2, 2), sctest::uniform_tensor({4}, 2, 0.5, 1.5),
                        sctest::uniform_tensor({4}, 3, -1, 1)}},
                      {"layer_norm over two axes",
                       [](const std::vector<Tensor>& t) { return sc::nn::layer_norm(t[0], {2, 3}); },
                       {sctest::uniform_tensor({2, 2, 3}, 4, -2, 2)}}});
  const Tensor x = sctest::uniform_tensor({8, 16}, 5, -4, 4).astype(sc::f32);
  auto f = sc::function([](const Tensor& a) { return sc::nn::layer_norm(a, {16}); });
  sctest::check_close(f(x).to_vector<double>(), sc::nn::layer_norm(x, {16}).to_vector<double>(), 1e-6);
  int line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::layer_norm(x, {8}), Catch::Contains("[layer_norm] normalized_shape [8] must be the trailing shape of x") &&
                                                    Catch::Contains("[8, 16]") && Catch::Contains(at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::layer_norm(x, {16}, sc::ones({8})), Catch::Contains("[layer_norm] gamma must have normalized_shape [16], got [8]") &&
                                                                    Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::layer_norm(x, {16}, Tensor(), Tensor(), -1.0), sc::ValueError);
  CHECK_THROWS_AS(sc::nn::layer_norm(x, Shape{}), sc::ShapeError);
  CHECK_THROWS_AS(sc::nn::layer_norm(sc::tensor({true, false}), {2}), sc::DTypeError);
  CHECK_THROWS_AS(sc::nn::LayerNorm(0), sc::ValueError);
  sc::nn::LayerNorm ln(16);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(ln(sc::zeros({2, 8})), Catch::Contains("[layer_norm]") && Catch::Contains(at(line)));
}

TEST_CASE("dropout: the rate of zeros, the scale, fresh masks, seeds, gradients, errors", "[nn][dropout]") {
  const Tensor x = sc::ones({200000});
  sc::random::Generator gen(3);
  const Tensor y = sc::nn::dropout(x, 0.3, gen);
  const auto v = y.to_vector<float>();
  std::int64_t zeros = 0;
  for (float e : v) {
    if (e == 0.f) ++zeros;
    else REQUIRE(e == static_cast<float>(1.0 / 0.7));
  }
  CHECK(static_cast<double>(zeros) / 200000 == Approx(0.3).margin(0.005));
  CHECK(sc::nn::dropout(x, 0.3, gen).to_vector<float>() != v);  // the generator advanced
  sc::random::Generator same(3);
  CHECK(sc::nn::dropout(x, 0.3, same).to_vector<float>() == v);  // the same seed, the same mask
  // rate 0 and 1; integers become f32
  CHECK(sc::nn::dropout(sc::tensor({1.0, 2.0}), 0.0).to_vector<double>() == std::vector<double>{1, 2});
  CHECK(sc::nn::dropout(sc::tensor({1.0, 2.0}), 1.0).to_vector<double>() == std::vector<double>{0, 0});
  CHECK(sc::nn::dropout(sc::tensor({1, 2}), 0.5).dtype() == sc::f32);
  // the gradient is the mask times the scale
  const Tensor w = sctest::uniform_tensor({1000}, 9, 1, 2);
  sc::GradientTape tape;
  tape.watch(w);
  const Tensor out = sc::nn::dropout(w, 0.5, gen);
  const auto gw = tape.gradient(sc::sum(out), w).to_vector<double>();
  const auto o = out.to_vector<double>();
  for (std::size_t k = 0; k < o.size(); ++k) REQUIRE(gw[k] == (o[k] == 0 ? 0.0 : 2.0));
  // traced: a fresh mask at every call
  sc::nn::Dropout drop(0.5, 11);
  auto f = sc::function([&](const Tensor& a) { return drop(a); });
  const auto m1 = f(x).to_vector<float>(), m2 = f(x).to_vector<float>();
  CHECK(m1 != m2);
  CHECK(f.trace_count() == 1);
  drop.eval();
  CHECK(drop(x).to_vector<float>() == x.to_vector<float>());
  CHECK(drop(x, true).to_vector<float>() != x.to_vector<float>());
  // errors
  int line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::dropout(x, 1.5), Catch::Contains("[dropout] rate must be in [0, 1], got 1.5") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::dropout(x, std::nan("")), sc::ValueError);
  CHECK_THROWS_AS(sc::nn::dropout(sc::tensor({true}), 0.5), sc::DTypeError);
  CHECK_THROWS_AS(sc::nn::Dropout(-0.1), sc::ValueError);
  CHECK_THROWS_AS(drop(Tensor()), sc::ValueError);
}

TEST_CASE("Dropout: a checkpoint restores the stream of masks", "[nn][dropout][checkpoint]") {
  const Tensor x = sc::ones({64});
  sc::nn::Dropout drop(0.5, 21);
  REQUIRE(drop.trainable_variables().empty());  // nothing for an optimizer
  REQUIRE(drop.named_variables().size() == 1);
  CHECK(drop.named_variables()[0].first == "generator_state");
  (void)drop(x);  // advance past the first mask
  const auto dir = std::filesystem::temp_directory_path() / ("sc_dropout_ck_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  struct Cleanup {
    std::filesystem::path d;
    ~Cleanup() { std::filesystem::remove_all(d); }
  } cleanup{dir};
  sc::Checkpoint ck;
  ck.track("drop", drop);
  ck.save(dir / "ck.safetensors");
  const auto next1 = drop(x).to_vector<float>(), next2 = drop(x).to_vector<float>();
  CHECK(next1 != next2);
  // a fresh layer with another seed, restored: the masks the first one drew after the save
  sc::nn::Dropout other(0.5, 99);
  sc::Checkpoint ck2;
  ck2.track("drop", other);
  ck2.restore(dir / "ck.safetensors");
  CHECK(other(x).to_vector<float>() == next1);
  CHECK(other(x).to_vector<float>() == next2);
  // and the same layer, rewound
  ck.restore(dir / "ck.safetensors");
  CHECK(drop(x).to_vector<float>() == next1);
}

TEST_CASE("Embedding: rows by id, any id shape, gradients that accumulate, errors", "[nn][embedding]") {
  sc::nn::Embedding emb(10, 4, 7);
  const auto table = emb.weight.value().to_vector<float>();
  const Tensor ids = sc::tensor({{3, 0, 9}, {3, 3, 1}});
  const Tensor e = emb(ids);
  REQUIRE(e.shape() == Shape{2, 3, 4});
  const auto got = e.to_vector<float>();
  const std::vector<int> flat{3, 0, 9, 3, 3, 1};
  for (std::size_t i = 0; i < flat.size(); ++i)
    for (std::size_t k = 0; k < 4; ++k) CHECK(got[i * 4 + k] == table[static_cast<std::size_t>(flat[i]) * 4 + k]);
  CHECK(emb(sc::tensor({std::int64_t{5}})).shape() == Shape{1, 4});
  CHECK(emb.trainable_variables()[0].name() == "weight");
  // the gradient of the sum: how often each row was read
  sc::GradientTape tape;
  const Tensor loss = sc::sum(emb(ids));
  const auto g = tape.gradient(loss, emb.trainable_variables())[0].to_vector<float>();
  const std::vector<float> count{1, 1, 0, 3, 0, 0, 0, 0, 0, 1};
  for (std::size_t r = 0; r < 10; ++r)
    for (std::size_t k = 0; k < 4; ++k) CHECK(g[r * 4 + k] == count[r]);
  // traced
  auto f = sc::function([&](const Tensor& i) { return emb(i); });
  CHECK(f(ids).to_vector<float>() == got);
  // errors
  int line = __LINE__ + 1;
  CHECK_THROWS_WITH(emb(sc::tensor({1, 10})), Catch::Contains("[Embedding] id 10 at index 1 of ids [2] is out of range [0, 10)") &&
                                                  Catch::Contains(at(line)));
  CHECK_THROWS_WITH(emb(sc::tensor({-1})), Catch::Contains("[Embedding] id -1"));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(emb(sc::tensor({1.f})), Catch::Contains("[Embedding]") && Catch::Contains("integer ids") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::Embedding(0, 4), sc::ValueError);
  CHECK_THROWS_AS(sc::nn::Embedding(4, 4, 1, sc::i32), sc::DTypeError);
}
