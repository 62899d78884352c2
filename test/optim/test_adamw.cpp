// optim::AdamW against a plain-loop reference in f64; its fused loop against its composite ops,
// bit for bit; eager against traced; weight_decay 0 as Adam; the decay alone on a zero gradient;
// a learning-rate change reaching the decay without a retrace; checkpoint names; errors.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>
#include <stagecraft/optim/adam.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "testing.hpp"

namespace {

using sctest::check_close;
using sctest::error_of;
using Vec = std::vector<double>;

/// The gradient of step t for variable k (n elements): varied signs and sizes.
Vec grad_of(int t, int k, std::size_t n) {
  Vec g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = std::sin(0.7 * double(i + 1) * t + k) * (1.0 + 0.3 * double(i));
  return g;
}

Vec start_of(int k, std::size_t n) {
  Vec w(n);
  for (std::size_t i = 0; i < n; ++i) w[i] = std::cos(1.1 * double(i) + k) * 2.0;
  return w;
}

const std::vector<std::size_t> sizes{5, 12};

/// AdamW in plain loops (Keras's order): w -= w * lr * wd, then Adam's step with bias correction
/// folded into the rate, eps added to the uncorrected sqrt(v).
std::vector<Vec> reference(int steps, double lr, double wd, double b1, double b2, double eps) {
  std::vector<Vec> w, m, v;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    w.push_back(start_of(static_cast<int>(k), sizes[k]));
    m.emplace_back(sizes[k], 0.0);
    v.emplace_back(sizes[k], 0.0);
  }
  for (int t = 1; t <= steps; ++t) {
    const double lr_t = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const Vec g = grad_of(t, static_cast<int>(k), sizes[k]);
      for (std::size_t i = 0; i < sizes[k]; ++i) {
        w[k][i] -= w[k][i] * (lr * wd);
        m[k][i] += (g[i] - m[k][i]) * (1 - b1);
        v[k][i] += (g[i] * g[i] - v[k][i]) * (1 - b2);
        w[k][i] -= m[k][i] * lr_t / (std::sqrt(v[k][i]) + eps);
      }
    }
  }
  return w;
}

enum class Run { fused, composite, traced };

/// The variables after `steps` steps of opt (dtype dt), run as `how`.
std::vector<sc::Tensor> train(sc::optim::Optimizer& opt, int steps, sc::DType dt, Run how) {
  std::vector<sc::Variable> vars;
  for (std::size_t k = 0; k < sizes.size(); ++k)
    vars.emplace_back(sc::cast(sc::tensor(start_of(static_cast<int>(k), sizes[k])), dt), "w" + std::to_string(k));
  auto step = [&](sc::Tensor g0, sc::Tensor g1) { opt.apply({g0, g1}, vars); };
  auto traced = sc::function(step);
  const bool was = sc::optim::fused::enabled;
  sc::optim::fused::enabled = how != Run::composite;
  for (int t = 1; t <= steps; ++t) {
    const sc::Tensor g0 = sc::cast(sc::tensor(grad_of(t, 0, sizes[0])), dt), g1 = sc::cast(sc::tensor(grad_of(t, 1, sizes[1])), dt);
    if (how == Run::traced) traced(g0, g1);
    else step(g0, g1);
  }
  sc::optim::fused::enabled = was;
  if (how == Run::traced) CHECK(traced.trace_count() == 1);
  std::vector<sc::Tensor> out;
  for (const sc::Variable& v : vars) out.push_back(v.value());
  return out;
}

}  // namespace

TEST_CASE("AdamW matches the reference, and its fused, composite and traced runs agree", "[optim][adamw]") {
  const Vec want_flat = [] {
    Vec all;
    for (const Vec& w : reference(4, 0.05, 0.2, 0.9, 0.999, 1e-7)) all.insert(all.end(), w.begin(), w.end());
    return all;
  }();
  for (const sc::DType dt : {sc::f64, sc::f32}) {
    INFO(sc::name(dt));
    std::vector<std::vector<sc::Tensor>> runs;
    for (const Run how : {Run::fused, Run::composite, Run::traced}) {
      sc::optim::AdamW opt(0.05, 0.2);
      runs.push_back(train(opt, 4, dt, how));
    }
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      INFO("variable " << k);
      // The fused loop rounds each operation as the composite ops do.
      CHECK(runs[0][k].to_vector<double>() == runs[1][k].to_vector<double>());
      check_close(runs[2][k].to_vector<double>(), runs[0][k].to_vector<double>(), dt == sc::f32 ? 1e-6 : 1e-14);
    }
    Vec got;
    for (const sc::Tensor& w : runs[0])
      for (double x : w.to_vector<double>()) got.push_back(x);
    check_close(got, want_flat, dt == sc::f32 ? 2e-5 : 1e-12);
  }
}

TEST_CASE("AdamW: weight_decay 0 is Adam bit for bit, and a decay changes the result", "[optim][adamw]") {
  sc::optim::AdamW none(0.05, 0.0);
  sc::optim::Adam adam(0.05);
  const auto a = train(none, 3, sc::f64, Run::fused), b = train(adam, 3, sc::f64, Run::fused);
  for (std::size_t k = 0; k < a.size(); ++k) CHECK(a[k].to_vector<double>() == b[k].to_vector<double>());
  sc::optim::AdamW decayed(0.05, 0.2);
  const auto c = train(decayed, 3, sc::f64, Run::fused);
  CHECK(c[0].to_vector<double>() != b[0].to_vector<double>());
  CHECK(none.name() == "AdamW");
  CHECK(decayed.weight_decay() == 0.2);
}

TEST_CASE("AdamW: with a zero gradient only the decay moves the variable", "[optim][adamw]") {
  for (const bool fused : {true, false}) {
    INFO((fused ? "fused" : "composite"));
    const bool was = sc::optim::fused::enabled;
    sc::optim::fused::enabled = fused;
    sc::Variable w(sc::tensor({1.0, -2.0, 0.0, 1e300}), "w");
    sc::optim::AdamW opt(0.1, 0.5);  // w *= (1 - 0.05) each step: Adam's step of a zero gradient is 0
    for (int t = 0; t < 3; ++t) opt.apply({sc::zeros({4}, sc::f64)}, {w});
    sc::optim::fused::enabled = was;
    const Vec got = w.value().to_vector<double>();
    Vec want{1.0, -2.0, 0.0, 1e300};
    for (double& x : want)
      for (int t = 0; t < 3; ++t) x -= x * 0.05;
    CHECK(got == want);
  }
}

TEST_CASE("AdamW in a traced step: a new learning rate reaches the decay without a retrace", "[optim][adamw][staged]") {
  sc::Variable w(sc::tensor({3.0, -1.0}), "w");
  sc::optim::AdamW opt(0.1, 1.0);
  auto step = sc::function([&](sc::Tensor g) { opt.apply({g}, {w}); });
  const sc::Tensor zero = sc::zeros({2}, sc::f64);
  step(zero);  // w *= 0.9
  opt.set_learning_rate(0.5);
  step(zero);  // w *= 0.5
  CHECK(step.trace_count() == 1);
  const Vec got = w.value().to_vector<double>();
  CHECK(got[0] == Approx(3.0 * 0.9 * 0.5).epsilon(1e-15));
  CHECK(got[1] == Approx(-1.0 * 0.9 * 0.5).epsilon(1e-15));
}

TEST_CASE("AdamW: Adam's slots and checkpoint names, and bad hyperparameters reported at the user's line",
          "[optim][adamw][errors]") {
  sc::Variable w(sc::zeros({3}), "kernel");
  sc::optim::AdamW opt;
  CHECK(opt.weight_decay() == 0.004);
  opt.build({w});
  std::vector<std::string> names;
  for (const auto& [n, v] : opt.named_variables()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"iterations", "m/0:kernel", "v/0:kernel"});
  for (const double bad : {-0.1, std::nan(""), double(INFINITY)}) {
    INFO("weight_decay " << bad);
    const int line = __LINE__ + 1;
    const std::string m = error_of<sc::ValueError>([&] { sc::optim::AdamW bad_opt(1e-3, bad); });
    CHECK_THAT(m, Catch::Contains("[AdamW] weight_decay must be finite and >= 0") &&
                      Catch::Contains("test_adamw.cpp:" + std::to_string(line)));
  }
  std::string m = error_of<sc::ValueError>([&] { sc::optim::AdamW bad_opt(1e-3, 0.01, 1.5); });
  CHECK_THAT(m, Catch::Contains("[AdamW] beta1 must be in [0, 1), got 1.5"));
  m = error_of<sc::ValueError>([&] { sc::optim::AdamW bad_opt(1e-3, 0.01, 0.9, 0.999, -1.0); });
  CHECK_THAT(m, Catch::Contains("[AdamW] eps must be finite and >= 0, got -1"));
  m = error_of<sc::ShapeError>([&] { opt.apply({sc::zeros({2})}, {w}); });
  CHECK_THAT(m, Catch::Contains("AdamW::apply"));
}

TEST_CASE("AdamW: a traced step of a big layer runs the one-loop kernel, the eager update's bits", "[optim][adamw][staged]") {
  // Above the fusion threshold the traced update (decay included) is one group, run by the
  // specialized kernel (optim/fused.hpp's adamw_program), equal to the eager fused loop bit for bit;
  // the tile evaluator (specializations off) gives the same bits.
  for (const sc::DType dt : {sc::f32, sc::f64}) {
    INFO(sc::name(dt));
    auto run = [&](bool staged) {
      sc::manual_seed(5);
      sc::Variable w(sc::cast(sc::random::normal({48, 40}, 6), dt), "w");
      sc::optim::AdamW opt(0.01, 0.1);
      const std::vector<sc::Variable> vars{w};
      auto step = [&](const sc::Tensor& x) {
        sc::GradientTape tape;
        const sc::Tensor loss = sc::sum(sc::tanh(sc::matmul(x, w)));
        opt.apply(tape.gradient(loss, vars), vars);
        return loss;
      };
      auto f = sc::function(step);
      for (int s = 0; s < 3; ++s) {
        const sc::Tensor x = sc::cast(sc::random::normal({5, 48}, 60 + static_cast<std::uint64_t>(s)), dt);
        (void)(staged ? f(x) : step(x));
      }
      if (staged && sc::graph::fused_specializations())
        CHECK(f.get_concrete(sc::cast(sc::random::normal({5, 48}, 1), dt)).stats().plan.specialized == 1);
      return w.value().to_vector<double>();
    };
    const Vec eager = run(false);
    CHECK(run(true) == eager);
    const bool was = sc::graph::fused_specializations();
    sc::graph::fused_specializations() = false;
    CHECK(run(true) == eager);
    sc::graph::fused_specializations() = was;
  }
}
