// nn::softmax, log_softmax and cross_entropy against loop references: axes, large values,
// dtypes, a hand-computed loss, and every error path.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

/// softmax (or log_softmax) of a row-major tensor along `axis`, by plain loops in double.
std::vector<double> softmax_reference(const std::vector<double>& x, const sc::Shape& s, int axis, bool log) {
  std::int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= s[i];
  for (int i = axis + 1; i < s.rank(); ++i) inner *= s[i];
  const std::int64_t n = s[axis];
  std::vector<double> y(x.size());
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t in = 0; in < inner; ++in) {
      const auto at = [&](std::int64_t k) { return (o * n + k) * inner + in; };
      double m = -std::numeric_limits<double>::infinity(), z = 0;
      for (std::int64_t k = 0; k < n; ++k) m = std::max(m, x[at(k)]);
      for (std::int64_t k = 0; k < n; ++k) z += std::exp(x[at(k)] - m);
      for (std::int64_t k = 0; k < n; ++k) y[at(k)] = log ? x[at(k)] - m - std::log(z) : std::exp(x[at(k)] - m) / z;
    }
  return y;
}

template <class T>
void check_softmax(const sc::Shape& s, int axis, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d(0.0, 3.0);
  std::vector<T> v(static_cast<std::size_t>(s.numel()));
  for (auto& e : v) e = static_cast<T>(d(gen));
  const sc::Tensor x = sc::tensor(v, s);
  const int pos = axis < 0 ? axis + s.rank() : axis;
  for (bool log : {false, true}) {
    const sc::Tensor y = log ? sc::nn::log_softmax(x, axis) : sc::nn::softmax(x, axis);
    const auto want = softmax_reference({v.begin(), v.end()}, s, pos, log);
    INFO((log ? "log_softmax " : "softmax ") << s << " axis " << axis << " " << sc::name(x.dtype()));
    REQUIRE(y.shape() == s);
    REQUIRE(y.dtype() == x.dtype());
    const auto got = y.to_vector<double>();
    const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
    for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == Approx(want[i]).margin(tol));
  }
}

std::string at(int line) { return "at test_functional.cpp:" + std::to_string(line); }

}  // namespace

TEMPLATE_TEST_CASE("softmax and log_softmax match loops", "[functional]", float, double) {
  unsigned seed = 1;
  check_softmax<TestType>({4, 7}, -1, ++seed);
  check_softmax<TestType>({4, 7}, 0, ++seed);
  check_softmax<TestType>({3, 5, 2}, 1, ++seed);
  check_softmax<TestType>({3, 5, 2}, -3, ++seed);
  check_softmax<TestType>({9}, 0, ++seed);
  check_softmax<TestType>({2, 1}, 1, ++seed);  // a single class: softmax 1, log_softmax 0
  check_softmax<TestType>({0, 4}, 1, ++seed);
  check_softmax<TestType>({64, 1000}, -1, ++seed);
}

TEST_CASE("softmax is stable for large values", "[functional]") {
  const auto x = sc::tensor({{1e4f, 1e4f - 1.f, 0.f}, {-1e4f, -1e4f, -1e4f}, {88.f, 89.f, 90.f}});
  const auto p = sc::nn::softmax(x);
  const auto v = p.to_vector<float>();
  for (float e : v) CHECK(std::isfinite(e));
  const auto rows = sc::sum(p, {1}).to_vector<float>();
  for (float r : rows) CHECK(r == Approx(1.f).epsilon(1e-6));
  CHECK(v[0] == Approx(1.0 / (1.0 + std::exp(-1.0))).epsilon(1e-6));
  CHECK(v[2] == 0.f);
  CHECK(v[3] == Approx(1.f / 3.f));
  const auto lp = sc::nn::log_softmax(x).to_vector<float>();
  for (float e : lp) CHECK(std::isfinite(e));
  CHECK(lp[2] == Approx(-1e4 - std::log1p(std::exp(-1.0))).epsilon(1e-6));  // softmax underflows here
  CHECK(lp[5] == Approx(-std::log(3.0)).margin(1e-3));  // logsumexp is ~1e4 here: f32 spacing 1e-3
}

TEST_CASE("softmax of integers gives f32", "[functional]") {
  const auto p = sc::nn::softmax(sc::tensor({0, 0}));
  CHECK(p.dtype() == sc::f32);
  CHECK(p.to_vector<float>() == std::vector<float>{0.5f, 0.5f});
  CHECK(sc::nn::log_softmax(sc::tensor({std::int64_t{1}, std::int64_t{1}})).dtype() == sc::f32);
}

TEST_CASE("cross_entropy against a hand-computed value", "[functional]") {
  const auto logits = sc::tensor({{1.f, 2.f, 3.f}, {1.f, 1.f, 1.f}});
  // row 0: log(e + e^2 + e^3) - 3; row 1: log(3).
  const double want = (std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0 + std::log(3.0)) / 2.0;
  const auto loss = sc::nn::cross_entropy(logits, sc::tensor({std::int64_t{2}, std::int64_t{0}}));
  CHECK(loss.shape() == sc::Shape{});
  CHECK(loss.dtype() == sc::f32);
  CHECK(loss.item<double>() == Approx(want).epsilon(1e-6));
  // i32 labels, f64 logits
  const auto l64 = sc::nn::cross_entropy(logits.astype(sc::f64), sc::tensor({2, 0}));
  CHECK(l64.dtype() == sc::f64);
  CHECK(l64.item<double>() == Approx(want).epsilon(1e-12));
  // Large logits do not overflow; a -inf logit on another class (a mask) stays finite.
  CHECK(sc::nn::cross_entropy(sc::tensor({{1e4f, 0.f}}), sc::tensor({0})).item<float>() == Approx(0.f).margin(1e-6));
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(sc::nn::cross_entropy(sc::tensor({{0.f, 0.f, -inf}}), sc::tensor({1})).item<float>() ==
        Approx(std::log(2.0)));
}

TEST_CASE("softmax and cross_entropy errors", "[functional][errors]") {
  int line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::softmax(sc::ones({2, 3}), 2),
                    Catch::Contains("[softmax] axis 2 is out of range for rank 2") && Catch::Contains(at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::log_softmax(sc::scalar(1.f)),
                    Catch::Contains("[log_softmax] axis -1 is out of range for rank 0") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::log_softmax(sc::ones({2}), -2), sc::ShapeError);

  const auto logits = sc::ones({4, 3});
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::cross_entropy(logits, sc::zeros({4})),
                    Catch::Contains("[cross_entropy] expects i32 or i64 class labels, got f32") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::cross_entropy(logits, sc::zeros({4})), sc::DTypeError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::cross_entropy(sc::ones({4, 3}, sc::i32), sc::zeros({4}, sc::i64)),
                    Catch::Contains("[cross_entropy] expects f32 or f64 logits, got i32") && Catch::Contains(at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::cross_entropy(logits, sc::zeros({5}, sc::i64)),
                    Catch::Contains("[cross_entropy] logits [4, 3] and labels [5] disagree on the batch size (4 != 5)") &&
                        Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::cross_entropy(logits, sc::zeros({5}, sc::i64)), sc::ShapeError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::cross_entropy(sc::ones({4}), sc::zeros({4}, sc::i64)),
                    Catch::Contains("[cross_entropy] expects logits [N, C] and labels [N], got [4] and [4]") &&
                        Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::cross_entropy(logits, sc::zeros({4, 1}, sc::i64)), sc::ShapeError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::cross_entropy(logits, sc::tensor({0, 3, 1, 2})),
                    Catch::Contains("[cross_entropy] label 3 at index 1 is out of range [0, 3)") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::cross_entropy(logits, sc::tensor({0, 3, 1, 2})), sc::ValueError);
  CHECK_THROWS_WITH(sc::nn::cross_entropy(logits, sc::tensor({std::int64_t{0}, std::int64_t{0}, std::int64_t{-1},
                                                              std::int64_t{0}})),
                    Catch::Contains("label -1 at index 2 is out of range [0, 3)"));
  CHECK_THROWS_AS(sc::nn::cross_entropy(sc::Tensor(), sc::tensor({0})), sc::ValueError);
}
