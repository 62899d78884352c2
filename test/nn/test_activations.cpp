// nn::leaky_relu, elu, silu, gelu, gelu_tanh, softplus, sc::clip and the losses mse_loss and
// binary_cross_entropy_with_logits: against plain loops in double, at the ends of the range, by
// central differences, eager = traced = staged = compiled, and every error path.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "../staged/staged_testing.hpp"
#include "testing.hpp"

namespace {

using sc::Shape;
using sc::Tensor;

// The references, one element at a time in double, written from the definitions.
double ref_leaky(double x, double s) { return x > 0 ? x : s * x; }
double ref_elu(double x, double a) { return x > 0 ? x : a * (std::exp(x) - 1); }
double ref_silu(double x) { return x / (1 + std::exp(-x)); }
double ref_gelu(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double ref_gelu_tanh(double x) {
  const double pi = 3.14159265358979323846;
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / pi) * (x + 0.044715 * x * x * x)));
}
double ref_softplus(double x) { return x > 30 ? x : std::log(1 + std::exp(x)); }  // e^-30 is below f64's ulp of 30

struct Activation {
  const char* name;
  std::function<Tensor(const Tensor&)> eager;
  std::function<double(double)> ref;
};

std::vector<Activation> activations() {
  return {{"leaky_relu", [](const Tensor& x) { return sc::nn::leaky_relu(x, 0.2); }, [](double v) { return ref_leaky(v, 0.2); }},
          {"leaky_relu default", [](const Tensor& x) { return sc::nn::leaky_relu(x); }, [](double v) { return ref_leaky(v, 0.01); }},
          {"elu", [](const Tensor& x) { return sc::nn::elu(x); }, [](double v) { return ref_elu(v, 1.0); }},
          {"elu alpha 0.5", [](const Tensor& x) { return sc::nn::elu(x, 0.5); }, [](double v) { return ref_elu(v, 0.5); }},
          {"silu", [](const Tensor& x) { return sc::nn::silu(x); }, ref_silu},
          {"gelu", [](const Tensor& x) { return sc::nn::gelu(x); }, ref_gelu},
          {"gelu_tanh", [](const Tensor& x) { return sc::nn::gelu_tanh(x); }, ref_gelu_tanh},
          {"softplus", [](const Tensor& x) { return sc::nn::softplus(x); }, ref_softplus}};
}

template <class T>
std::vector<T> spread(std::int64_t n, std::uint64_t seed, double lo, double hi) {
  sctest::Rng r(seed);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& e : v) e = static_cast<T>(lo + (hi - lo) * r.uniform());
  return v;
}

std::string at(int line) { return "at test_activations.cpp:" + std::to_string(line); }

}  // namespace

TEMPLATE_TEST_CASE("activations match loops in double on every shape", "[nn][activations]", float, double) {
  using T = TestType;
  const double tol = std::is_same_v<T, float> ? 2e-6 : 1e-13;
  for (const Activation& a : activations()) {
    for (const Shape& s : {Shape{}, Shape{0}, Shape{37}, Shape{3, 5}, Shape{70001}}) {
      const std::vector<T> v = spread<T>(s.numel(), 7, -8, 8);
      const Tensor y = a.eager(sc::tensor(v, s));
      INFO(a.name << " " << sc::name(sc::dtype_of<T>()) << " " << sctest::str(s));
      REQUIRE(y.shape() == s);
      REQUIRE(y.dtype() == sc::dtype_of<T>());
      const std::vector<double> got = y.to_vector<double>();
      for (std::size_t i = 0; i < got.size(); ++i) {
        const double want = a.ref(static_cast<double>(v[i]));
        INFO("x = " << v[i] << ": got " << got[i] << ", want " << want);
        REQUIRE(std::fabs(got[i] - want) <= tol * (1 + std::fabs(want)));
      }
    }
  }
}

TEST_CASE("activations at the ends of the range: no overflow, no lost digits, NaN stays NaN", "[nn][activations]") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const Tensor x = sc::tensor({-1000.0, -100.0, -40.0, -1e-9, 0.0, 1e-9, 40.0, 100.0, 1000.0, nan, inf, -inf});
  const auto v = [](const Tensor& t) { return t.to_vector<double>(); };
  // softplus: x itself far right, e^x far left (log(1 + e^x) would give 0 there), log 2 at 0
  const auto sp = v(sc::nn::softplus(x));
  CHECK(sp[0] == 0.0);
  CHECK(sp[1] == Approx(std::exp(-100.0)).epsilon(1e-14));
  CHECK(sp[2] == Approx(std::exp(-40.0)).epsilon(1e-14));
  CHECK(sp[4] == Approx(std::log(2.0)).epsilon(1e-15));
  CHECK(sp[7] == 100.0);
  CHECK(sp[8] == 1000.0);
  CHECK(std::isnan(sp[9]));
  CHECK(sp[10] == inf);
  CHECK(sp[11] == 0.0);
  // elu: the negative branch by expm1 (exact near 0), no inf from the unused branch far right
  const auto el = v(sc::nn::elu(x));
  CHECK(el[0] == -1.0);
  CHECK(el[3] == Approx(std::expm1(-1e-9)).epsilon(1e-15));
  CHECK(el[8] == 1000.0);
  CHECK(std::isnan(el[9]));
  CHECK(el[11] == -1.0);
  // gelu: 0 far left, x far right, NaN kept
  for (const auto& g : {v(sc::nn::gelu(x)), v(sc::nn::gelu_tanh(x))}) {
    CHECK(g[0] == 0.0);
    CHECK(g[8] == 1000.0);
    CHECK(g[4] == 0.0);
    CHECK(std::isnan(g[9]));
  }
  CHECK(std::isnan(v(sc::nn::leaky_relu(x))[9]));
  CHECK(v(sc::nn::leaky_relu(x))[0] == -10.0);
  // f32: softplus(-100) is e^-100 = 3.7e-44, a subnormal, not 0
  CHECK(sc::nn::softplus(sc::scalar(-100.f)).item<float>() > 0.f);
  // the two gelu forms stay within 5e-4 of each other
  const Tensor r = sc::arange(-6.0, 6.0, 0.01);
  CHECK(sc::max(sc::abs(sc::nn::gelu(r) - sc::nn::gelu_tanh(r))).item<double>() < 5e-4);
}

TEST_CASE("activations: integer inputs become f32, and bool, undefined and bad parameters raise", "[nn][activations][errors]") {
  const Tensor i = sc::tensor({-2, 0, 3});
  for (const Activation& a : activations()) {
    INFO(a.name);
    const Tensor y = a.eager(i);
    CHECK(y.dtype() == sc::f32);
    const auto got = y.to_vector<double>();
    CHECK(got[2] == Approx(a.ref(3)).epsilon(1e-6));
    CHECK_THROWS_AS(a.eager(sc::tensor({true, false})), sc::DTypeError);
    CHECK_THROWS_AS(a.eager(Tensor()), sc::ValueError);
  }
  const Tensor b = sc::tensor({true});
  int line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::gelu(b), Catch::Contains("[gelu]") && Catch::Contains("bool") && Catch::Contains(at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::softplus(Tensor()), Catch::Contains("[softplus]") && Catch::Contains(at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::leaky_relu(i, std::nan("")), Catch::Contains("[leaky_relu] negative_slope must be finite") &&
                                                               Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::elu(i, std::numeric_limits<double>::infinity()), sc::ValueError);
}

TEST_CASE("activations: gradients match central differences", "[nn][activations][grad]") {
  const Shape s{3, 4};
  // away from the kinks of leaky_relu and elu at 0 (their one-sided slopes differ there)
  const Tensor x = sctest::uniform_tensor(s, 3, -3, 3, 0.1);
  const auto u = [](std::function<Tensor(const Tensor&)> f) {
    return [f](const std::vector<Tensor>& xs) { return f(xs[0]); };
  };
  std::vector<sctest::Row> rows;
  for (const Activation& a : activations()) rows.push_back({a.name, u(a.eager), {x}});
  rows.push_back({"softplus far out", u([](const Tensor& t) { return sc::nn::softplus(t); }),
                  {sc::tensor({-30.0, -12.0, 12.0, 30.0})}});
  rows.push_back({"softplus''", sctest::second([](const std::vector<Tensor>& t) { return sc::nn::softplus(t[0]); }), {x}});
  rows.push_back({"gelu''", sctest::second([](const std::vector<Tensor>& t) { return sc::nn::gelu(t[0]); }), {x}});
  sctest::check_rows(rows);

  // the gradients' values where a closed form is known: softplus' = sigmoid, leaky_relu' = the slope
  // at 0, elu' finite far right (its unused branch reads min(x, 0), not e^1000)
  const Tensor p = sc::tensor({-2.0, 0.0, 0.5, 1000.0});
  sc::GradientTape tape(true);
  tape.watch(p);
  const Tensor sp = sc::sum(sc::nn::softplus(p)), lr = sc::sum(sc::nn::leaky_relu(p, 0.2)), el = sc::sum(sc::nn::elu(p));
  const auto gs = tape.gradient(sp, p).to_vector<double>();
  const auto sig = sc::sigmoid(p).to_vector<double>();
  for (std::size_t k = 0; k < 4; ++k) CHECK(gs[k] == Approx(sig[k]).epsilon(1e-15));
  CHECK(tape.gradient(lr, p).to_vector<double>() == std::vector<double>{0.2, 0.2, 1, 1});
  const auto ge = tape.gradient(el, p).to_vector<double>();
  CHECK(ge[0] == Approx(std::exp(-2.0)).epsilon(1e-15));
  CHECK(ge[3] == 1.0);
}

TEST_CASE("activations: eager, traced, staged and compiled agree", "[nn][activations][staged]") {
  for (sc::DType d : {sc::f32, sc::f64}) {
    for (const Shape& s : {Shape{37}, Shape{4, 9}, Shape{}}) {
      const Tensor x = sc::cast(sctest::uniform_tensor(s, 5, -5, 5), d);
      const std::string w = std::string(sc::name(d)) + " " + sctest::str(s);
      sctest::check_stages([](const auto& a) { return sc::nn::leaky_relu(a, 0.1); }, 0.0, "leaky_relu " + w, x);
      sctest::check_stages([](const auto& a) { return sc::nn::elu(a, 0.7); }, 0.0, "elu " + w, x);
      sctest::check_stages([](const auto& a) { return sc::nn::silu(a); }, 1e-6, "silu " + w, x);
      sctest::check_stages([](const auto& a) { return sc::nn::gelu(a); }, 1e-6, "gelu " + w, x);
      sctest::check_stages([](const auto& a) { return sc::nn::gelu_tanh(a); }, 1e-6, "gelu_tanh " + w, x);
      sctest::check_stages([](const auto& a) { return sc::nn::softplus(a); }, 1e-6, "softplus " + w, x);
      sctest::check_stages([](const auto& a) { return sc::clip(a, -1.5, 2); }, 0.0, "clip " + w, x);
      sctest::check_stages([](const auto& a) { return sc::nn::gelu(a * 2.f) + sc::nn::softplus(a); }, 1e-6,
                           "a chain " + w, x);
    }
  }
  // sc::grad of a compiled activation equals the tape's gradient
  const Tensor x = sctest::uniform_tensor({16}, 9, -3, 3, 0.1);
  const auto g = sc::compile([](auto a) { return sc::nn::gelu(a) + sc::nn::softplus(a) * sc::nn::elu(a); });
  sc::GradientTape tape;
  tape.watch(x);
  const Tensor y = sc::sum(sc::nn::gelu(x) + sc::nn::softplus(x) * sc::nn::elu(x));
  sctest::check_same(sc::grad<0>(g)(x), tape.gradient(y, x), 1e-12, "grad<0> of a compiled activation chain");
}

TEST_CASE("clip: scalar and tensor bounds against loops, dtypes, NaN, gradients, errors", "[nn][clip]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> v{-3, -1, -0.5, 0, 0.5, 1, 2, 7, nan};
  const auto got = sc::clip(sc::tensor(v), -1, 1).to_vector<double>();
  for (std::size_t k = 0; k + 1 < v.size(); ++k) CHECK(got[k] == std::min(std::max(v[k], -1.0), 1.0));
  CHECK(std::isnan(got.back()));
  // integers stay integers with integer bounds; a float bound makes the result f32
  const Tensor i = sc::tensor({-5, 0, 9});
  CHECK(sc::clip(i, 0, 4).dtype() == sc::i32);
  CHECK(sc::clip(i, 0, 4).to_vector<int>() == std::vector<int>{0, 0, 4});
  CHECK(sc::clip(i, -0.5, 2.5).to_vector<float>() == std::vector<float>{-0.5f, 0.f, 2.5f});
  CHECK(sc::clip(sc::tensor({1.f}), 0.0, 2.0).dtype() == sc::f32);
  // per-column bounds broadcast; where lo > hi the result is hi (NumPy's rule)
  const Tensor m = sc::tensor({{-4.0, 0.0, 4.0}, {1.0, 2.0, 3.0}});
  const Tensor lo = sc::tensor({-1.0, 0.5, 5.0}), hi = sc::tensor({1.0, 1.5, 2.0});
  CHECK(sc::clip(m, lo, hi).to_vector<double>() == std::vector<double>{-1, 0.5, 2, 1, 1.5, 2});
  // gradient: 1 on [lo, hi], ends included; 0 outside; the bounds get the rest
  const Tensor x = sc::tensor({-2.0, -1.0, 0.0, 1.0, 2.0});
  const Tensor tlo = sc::full({5}, -1.0), thi = sc::full({5}, 1.0);
  sc::GradientTape tape(true);
  tape.watch({x, tlo, thi});
  const Tensor y = sc::sum(sc::clip(x, tlo, thi));
  CHECK(tape.gradient(y, x).to_vector<double>() == std::vector<double>{0, 1, 1, 1, 0});
  CHECK(tape.gradient(y, tlo).to_vector<double>() == std::vector<double>{1, 0, 0, 0, 0});
  CHECK(tape.gradient(y, thi).to_vector<double>() == std::vector<double>{0, 0, 0, 0, 1});
  sctest::check_rows({{"clip", [](const std::vector<Tensor>& t) { return sc::clip(t[0], -0.7, 0.9); },
                       {sc::tensor({-1.3, -0.2, 0.4, 1.6})}},
                      {"clip by tensors", [](const std::vector<Tensor>& t) { return sc::clip(t[0], t[1], t[2]); },
                       {sc::tensor({{-1.3, 0.4}, {0.6, 1.6}}), sc::tensor({-1.0, 0.5}), sc::tensor({{1.0}, {1.2}})}}});
  // errors: lo > hi, a NaN bound, an integer bound that does not fit, shapes that do not broadcast
  int line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::clip(x, 2, 1), Catch::Contains("[clip] needs lo <= hi, got lo = 2 and hi = 1") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::clip(x, nan, 1), sc::ValueError);
  CHECK_THROWS_WITH(sc::clip(i, 0, 3000000000LL), Catch::Contains("[clip]") && Catch::Contains("does not fit"));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::clip(m, sc::zeros({4}), hi), Catch::Contains("cannot broadcast") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::clip(Tensor(), 0, 1), sc::ValueError);
}

TEMPLATE_TEST_CASE("losses: mse and binary cross-entropy with logits match loops", "[nn][losses]", float, double) {
  using T = TestType;
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-13;
  for (const Shape& s : {Shape{1}, Shape{7}, Shape{4, 5}, Shape{3, 2, 6}}) {
    const std::vector<T> p = spread<T>(s.numel(), 11, -6, 6), t = spread<T>(s.numel(), 12, -2, 2);
    std::vector<T> z = spread<T>(s.numel(), 13, 0, 1);
    z[0] = T(1);  // a hard label among the probabilities
    double mse = 0, bce = 0;
    for (std::size_t k = 0; k < p.size(); ++k) {
      const double x = p[k], d = x - t[k], q = 1 / (1 + std::exp(-x));
      mse += d * d;
      bce += -(z[k] * std::log(q) + (1 - z[k]) * std::log(1 - q));
    }
    mse /= static_cast<double>(p.size());
    bce /= static_cast<double>(p.size());
    INFO(sctest::str(s));
    const Tensor m = sc::nn::mse_loss(sc::tensor(p, s), sc::tensor(t, s));
    const Tensor b = sc::nn::binary_cross_entropy_with_logits(sc::tensor(p, s), sc::tensor(z, s));
    CHECK(m.rank() == 0);
    CHECK(m.dtype() == sc::dtype_of<T>());
    CHECK(b.dtype() == sc::dtype_of<T>());
    CHECK(m.item<double>() == Approx(mse).epsilon(tol));
    CHECK(b.item<double>() == Approx(bce).epsilon(tol));
  }
}

TEST_CASE("losses: large logits, integer labels, gradients, errors", "[nn][losses][grad]") {
  // |x| = 100: log(sigmoid(-100)) would be log(0) = -inf; the stable form gives 100
  const Tensor x = sc::tensor({100.f, -100.f, 100.f, -100.f});
  const Tensor z = sc::tensor({0.f, 1.f, 1.f, 0.f});
  CHECK(sc::nn::binary_cross_entropy_with_logits(x, z).item<float>() == Approx(50.f));
  // 0/1 labels of an integer or bool dtype take the logits' dtype
  const Tensor l = sc::tensor({0.5, -1.5, 2.0});
  const double want = sc::nn::binary_cross_entropy_with_logits(l, sc::tensor({1.0, 0.0, 1.0})).item<double>();
  CHECK(sc::nn::binary_cross_entropy_with_logits(l, sc::tensor({1, 0, 1})).item<double>() == want);
  CHECK(sc::nn::binary_cross_entropy_with_logits(l, sc::tensor({true, false, true})).item<double>() == want);
  // d/dx bce = (sigmoid(x) - z) / n
  sc::GradientTape tape;
  tape.watch(l);
  const Tensor loss = sc::nn::binary_cross_entropy_with_logits(l, sc::tensor({1.0, 0.0, 1.0}));
  const auto g = tape.gradient(loss, l).to_vector<double>();
  const auto q = sc::sigmoid(l).to_vector<double>();
  const std::vector<double> zz{1, 0, 1};
  for (std::size_t k = 0; k < 3; ++k) CHECK(g[k] == Approx((q[k] - zz[k]) / 3).epsilon(1e-14));
  sctest::check_rows(
      {{"mse_loss", [](const std::vector<Tensor>& t) { return sc::nn::mse_loss(t[0], t[1]); },
        {sctest::uniform_tensor({3, 4}, 1, -2, 2), sctest::uniform_tensor({3, 4}, 2, -2, 2)}},
       {"binary_cross_entropy_with_logits",
        [](const std::vector<Tensor>& t) { return sc::nn::binary_cross_entropy_with_logits(t[0], t[1]); },
        {sctest::uniform_tensor({3, 4}, 3, -4, 4), sctest::uniform_tensor({3, 4}, 4, 0, 1)}}});
  // a loss does not broadcast: [N, 1] against [N] is the classic silent bug
  int line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::mse_loss(sc::zeros({4, 1}), sc::zeros({4})),
                    Catch::Contains("[mse_loss] pred and target must have the same shape") &&
                        Catch::Contains("[4, 1] and [4]") && Catch::Contains(at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::binary_cross_entropy_with_logits(sc::tensor({1, 2}), sc::tensor({1, 0})),
                    Catch::Contains("[binary_cross_entropy_with_logits]") && Catch::Contains("float logits") &&
                        Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::mse_loss(sc::tensor({true}), sc::tensor({1.f})), sc::DTypeError);
  CHECK_THROWS_AS(sc::nn::mse_loss(Tensor(), sc::tensor({1.f})), sc::ValueError);
  // mse of integers is f32
  CHECK(sc::nn::mse_loss(sc::tensor({1, 2}), sc::tensor({3, 2})).item<float>() == 2.f);
}
