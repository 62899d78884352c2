// nn::batch_norm and nn::BatchNorm against per-channel loops in f64 ([N, C] and [N, C, H, W]),
// the running statistics as PyTorch moves them, evaluation mode, finite-difference gradients,
// eager against traced (the running statistics assigned at every traced call), checkpoints'
// variables, and the errors of misuse.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>
#include <stagecraft/nn/layers.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "testing.hpp"

namespace {

using sctest::check_close;
using sctest::error_of;
using Vec = std::vector<double>;

/// Per-channel statistics of x [N, C, S...] (S = the product of the trailing dims), in f64 loops.
struct Stats {
  Vec mean, var;  // population variance
};
Stats stats_of(const Vec& x, std::int64_t n, std::int64_t c, std::int64_t s) {
  Stats st{Vec(static_cast<std::size_t>(c), 0.0), Vec(static_cast<std::size_t>(c), 0.0)};
  for (std::int64_t ch = 0; ch < c; ++ch) {
    double sum = 0;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t k = 0; k < s; ++k) sum += x[static_cast<std::size_t>((i * c + ch) * s + k)];
    const double m = sum / static_cast<double>(n * s);
    double sq = 0;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t k = 0; k < s; ++k) {
        const double d = x[static_cast<std::size_t>((i * c + ch) * s + k)] - m;
        sq += d * d;
      }
    st.mean[static_cast<std::size_t>(ch)] = m;
    st.var[static_cast<std::size_t>(ch)] = sq / static_cast<double>(n * s);
  }
  return st;
}

/// (x - mean[c]) / sqrt(var[c] + eps) * gamma[c] + beta[c], elementwise in loops.
Vec normalized(const Vec& x, std::int64_t n, std::int64_t c, std::int64_t s, const Vec& mean, const Vec& var,
               const Vec& gamma, const Vec& beta, double eps) {
  Vec y(x.size());
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t ch = 0; ch < c; ++ch)
      for (std::int64_t k = 0; k < s; ++k) {
        const auto at = static_cast<std::size_t>((i * c + ch) * s + k);
        const auto cc = static_cast<std::size_t>(ch);
        y[at] = (x[at] - mean[cc]) / std::sqrt(var[cc] + eps) * gamma[cc] + beta[cc];
      }
  return y;
}

}  // namespace

TEST_CASE("BatchNorm: training normalizes by the batch and moves the running statistics", "[nn][batch_norm]") {
  for (const sc::Shape& shape : {sc::Shape{6, 3}, sc::Shape{4, 3, 5, 2}}) {
    INFO("x " << sctest::str(shape));
    const std::int64_t n = shape[0], c = shape[1], s = shape.numel() / (n * c);
    sc::nn::BatchNorm bn(c, 0.2, 1e-3, sc::f64);
    bn.gamma.assign(sc::tensor({1.5, 0.5, -2.0}));
    bn.beta.assign(sc::tensor({0.1, -0.2, 0.3}));
    Vec run_mean(3, 0.0), run_var(3, 1.0);
    for (int step = 0; step < 2; ++step) {
      const sc::Tensor x = sctest::uniform_tensor(shape, 60 + static_cast<std::uint64_t>(step), -3, 5);
      const Vec xv = x.to_vector<double>();
      const Stats st = stats_of(xv, n, c, s);
      const sc::Tensor y = bn(x);
      check_close(y.to_vector<double>(), normalized(xv, n, c, s, st.mean, st.var, {1.5, 0.5, -2.0}, {0.1, -0.2, 0.3}, 1e-3),
                  1e-12);
      const double count = static_cast<double>(n * s);
      for (std::size_t k = 0; k < 3; ++k) {
        run_mean[k] = 0.8 * run_mean[k] + 0.2 * st.mean[k];
        run_var[k] = 0.8 * run_var[k] + 0.2 * st.var[k] * count / (count - 1);  // unbiased, as PyTorch
      }
      check_close(bn.moving_mean.value().to_vector<double>(), run_mean, 1e-12);
      check_close(bn.moving_variance.value().to_vector<double>(), run_var, 1e-12);
    }
    // Evaluation: the running statistics, which stay as they are.
    bn.eval();
    const sc::Tensor x = sctest::uniform_tensor(shape, 70, -1, 1);
    check_close(bn(x).to_vector<double>(),
                normalized(x.to_vector<double>(), n, c, s, run_mean, run_var, {1.5, 0.5, -2.0}, {0.1, -0.2, 0.3}, 1e-3),
                1e-12);
    check_close(bn.moving_mean.value().to_vector<double>(), run_mean, 1e-12);
    CHECK(!bn.training());
    check_close(bn(x, true).to_vector<double>(), sc::nn::batch_norm(x, bn.gamma, bn.beta, 1e-3).to_vector<double>(), 1e-14);
  }
}

TEST_CASE("batch_norm: f32 against the f64 reference, and integers become f32", "[nn][batch_norm]") {
  const sc::Tensor x = sc::cast(sctest::uniform_tensor({8, 4, 3, 3}, 80, -2, 2), sc::f32);
  const Stats st = stats_of(sc::cast(x, sc::f64).to_vector<double>(), 8, 4, 9);
  const Vec want = normalized(sc::cast(x, sc::f64).to_vector<double>(), 8, 4, 9, st.mean, st.var, Vec(4, 1.0), Vec(4, 0.0), 1e-5);
  const sc::Tensor y = sc::nn::batch_norm(x);
  CHECK(y.dtype() == sc::f32);
  check_close(sc::cast(y, sc::f64).to_vector<double>(), want, 2e-5);
  CHECK(sc::nn::batch_norm(sc::tensor({{1, 2}, {3, 6}})).dtype() == sc::f32);
}

TEST_CASE("batch_norm: gradients match finite differences through the batch statistics", "[nn][batch_norm][grad]") {
  const sc::Tensor x = sctest::uniform_tensor({3, 2, 2, 2}, 90, -2, 2);
  const sc::Tensor g = sctest::uniform_tensor({2}, 91, 0.5, 1.5), b = sctest::uniform_tensor({2}, 92, -1, 1);
  sctest::check_rows({
      {"x, gamma, beta", [](const auto& in) { return sc::nn::batch_norm(in[0], in[1], in[2]); }, {x, g, b}},
      {"x alone, [N, C]", [](const auto& in) { return sc::nn::batch_norm(in[0]); }, {sctest::uniform_tensor({5, 3}, 93, -1, 1)}},
  });
  // The layer's gradient reaches gamma and beta only (the running statistics are not trainable).
  sc::nn::BatchNorm bn(2, 0.1, 1e-5, sc::f64);
  CHECK(bn.trainable_variables().size() == 2);
  CHECK(bn.variables().size() == 4);
  sc::GradientTape tape;
  const sc::Tensor loss = sc::sum(sc::square(bn(x)));
  const auto grads = tape.gradient(loss, bn.trainable_variables());
  REQUIRE(grads.size() == 2);
  CHECK(grads[0].shape() == sc::Shape{2});
}

TEST_CASE("BatchNorm: a traced training step equals the eager one and updates the statistics at every call",
          "[nn][batch_norm][staged]") {
  auto run = [](bool traced) {
    sc::nn::BatchNorm bn(3, 0.1, 1e-5, sc::f64);
    auto step = [&](sc::Tensor x) { return sc::sum(bn(x) * x); };
    auto f = sc::function(step);
    Vec out;
    for (int t = 0; t < 3; ++t) {
      const sc::Tensor x = sctest::uniform_tensor({4, 3, 2}, 100 + static_cast<std::uint64_t>(t), -2, 3);
      out.push_back((traced ? f(x) : step(x)).item<double>());
    }
    if (traced) CHECK(f.trace_count() == 1);
    for (double v : bn.moving_mean.value().to_vector<double>()) out.push_back(v);
    for (double v : bn.moving_variance.value().to_vector<double>()) out.push_back(v);
    bn.eval();
    const sc::Tensor probe = sctest::uniform_tensor({2, 3, 2}, 110, -1, 1);
    for (double v : (traced ? sc::function([&](sc::Tensor p) { return bn(p); })(probe) : bn(probe)).to_vector<double>())
      out.push_back(v);
    return out;
  };
  check_close(run(true), run(false), 1e-12);
  // One function for both modes: the mode as an argument (a trace for each value).
  sc::nn::BatchNorm bn(3, 0.1, 1e-5, sc::f64);
  auto f = sc::function([&](sc::Tensor x, bool training) { return bn(x, training); });
  const sc::Tensor x = sctest::uniform_tensor({4, 3}, 120, -2, 2);
  const sc::Tensor trained = f(x, true);
  check_close(trained.to_vector<double>(), sc::nn::batch_norm(x).to_vector<double>(), 1e-12);
  check_close(f(x, false).to_vector<double>(), bn(x, false).to_vector<double>(), 1e-14);
  CHECK(f.trace_count() == 2);
}

TEST_CASE("BatchNorm: misuse is reported at the user's line", "[nn][batch_norm][errors]") {
  sc::nn::BatchNorm bn(3);
  int line = __LINE__ + 1;
  std::string m = error_of<sc::ShapeError>([&] { bn(sc::ones({4, 5})); });
  CHECK_THAT(m, Catch::Contains("[BatchNorm] expects x of shape [N, 3, ...] (channels on axis 1), got [4, 5]") &&
                    Catch::Contains("test_batch_norm.cpp:" + std::to_string(line)));
  m = error_of<sc::ShapeError>([&] { bn(sc::ones({3})); });
  CHECK_THAT(m, Catch::Contains("[BatchNorm] expects x of shape [N, 3, ...]"));
  line = __LINE__ + 1;
  m = error_of<sc::ValueError>([&] { bn(sc::ones({1, 3})); });
  CHECK_THAT(m, Catch::Contains("[BatchNorm] needs more than one value per channel while training, got x [1, 3]") &&
                    Catch::Contains("test_batch_norm.cpp:" + std::to_string(line)));
  CHECK(bn(sc::ones({1, 3}), false).shape() == sc::Shape{1, 3});  // evaluation takes one example
  m = error_of<sc::ValueError>([&] { sc::nn::BatchNorm bad(3, 1.5); });
  CHECK_THAT(m, Catch::Contains("[BatchNorm] momentum must be in [0, 1], got 1.5"));
  m = error_of<sc::ValueError>([&] { sc::nn::BatchNorm bad(0); });
  CHECK_THAT(m, Catch::Contains("[BatchNorm] needs at least one channel, got 0"));
  m = error_of<sc::ValueError>([&] { sc::nn::BatchNorm bad(3, 0.1, -1.0); });
  CHECK_THAT(m, Catch::Contains("[BatchNorm] eps must be finite and >= 0, got -1"));
  m = error_of<sc::ShapeError>([&] { sc::nn::batch_norm(sc::ones({4, 3}), sc::ones({2})); });
  CHECK_THAT(m, Catch::Contains("[batch_norm] gamma must have shape [3], got [2]"));
  m = error_of<sc::ShapeError>([&] { sc::nn::batch_norm(sc::ones({4})); });
  CHECK_THAT(m, Catch::Contains("[batch_norm] expects x of shape [N, C, ...]"));
  m = error_of<sc::DTypeError>([&] { sc::nn::batch_norm(sc::ones({4, 3}, sc::boolean)); });
  CHECK_THAT(m, Catch::Contains("[batch_norm] expects numeric dtypes, got bool"));
}
