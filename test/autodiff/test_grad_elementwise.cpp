// Gradients of the elementwise and reduction ops against central differences (first and second order).
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "testing.hpp"

namespace {

using sc::Shape;
using sc::Tensor;
using sctest::check_rows;
using sctest::Fn;
using sctest::Row;
using sctest::second;
using sctest::str;

// An f64 tensor of values in [lo, hi); with min_abs > 0 every |value| is at least min_abs and
// the sign is random (keeps relu/abs/div away from their kink or pole at 0).
Tensor vals(Shape s, std::uint64_t seed, double lo = -2, double hi = 2, double min_abs = 0) {
  return sctest::uniform_tensor(s, seed, lo, hi, min_abs);
}
// Positive values in [lo, hi) (log, sqrt, pow's base).
Tensor pos(Shape s, std::uint64_t seed, double lo = 0.3, double hi = 2) { return vals(s, seed, lo, hi); }

// Input shape pairs that broadcast in every way: equal, row vector, outer product, scalar.
const std::vector<std::pair<Shape, Shape>> kPairs = {
    {{2, 3}, {2, 3}}, {{2, 3}, {3}}, {{2, 1}, {1, 3}}, {{}, {2, 3}}, {{2, 3}, {}}, {{4, 1, 3}, {2, 1}}};

}  // namespace

TEST_CASE("unary ops: gradients match central differences", "[autodiff][grad]") {
  const Shape s{2, 3};
  auto u = [](Tensor (*op)(const Tensor&, std::source_location)) {
    return [op](const std::vector<Tensor>& x) { return op(x[0], std::source_location::current()); };
  };
  check_rows({
      {"neg", u(sc::neg), {vals(s, 1)}},
      {"abs", u(sc::abs), {vals(s, 2, 0, 2, 0.1)}},
      {"square", u(sc::square), {vals(s, 3)}},
      {"relu", u(sc::relu), {vals(s, 4, 0, 2, 0.1)}},
      {"exp", u(sc::exp), {vals(s, 5)}},
      {"log", u(sc::log), {pos(s, 6)}},
      {"sqrt", u(sc::sqrt), {pos(s, 7)}},
      {"tanh", u(sc::tanh), {vals(s, 8)}},
      {"sigmoid", u(sc::sigmoid), {vals(s, 9, -4, 4)}},
      {"sin", u(sc::sin), {vals(s, 10, -3, 3)}},
      {"cos", u(sc::cos), {vals(s, 11, -3, 3)}},
      {"log1p", u(sc::log1p), {pos(s, 15)}},
      {"log1p near -1", u(sc::log1p), {vals(s, 16, -0.9, -0.5)}},
      {"expm1", u(sc::expm1), {vals(s, 17)}},
      {"erf", u(sc::erf), {vals(s, 18, -2, 2)}},
      {"operator-", [](const std::vector<Tensor>& x) { return -x[0]; }, {vals(s, 12)}},
      {"exp rank 0", u(sc::exp), {vals({}, 13)}},
      {"tanh size-1 dims", u(sc::tanh), {vals({1, 3, 1}, 14)}},
  });
}

TEST_CASE("binary ops: gradients match central differences under broadcasting", "[autodiff][grad]") {
  std::vector<Row> rows;
  std::uint64_t seed = 100;
  for (const auto& [sa, sb] : kPairs) {
    const std::string shapes = " " + str(sa) + " with " + str(sb);
    const Tensor a = vals(sa, ++seed), b = vals(sb, ++seed);
    // maximum/minimum: |a| >= 0.5 > 0.3 > |b|, so they are never within 0.2 (no ties), and
    // each side wins somewhere.
    const Tensor a_far = vals(sa, ++seed, 0, 2, 0.5), b_near = vals(sb, ++seed, -0.3, 0.3);
    rows.push_back({"add" + shapes, [](auto& x) { return x[0] + x[1]; }, {a, b}});
    rows.push_back({"sub" + shapes, [](auto& x) { return x[0] - x[1]; }, {a, b}});
    rows.push_back({"mul" + shapes, [](auto& x) { return x[0] * x[1]; }, {a, b}});
    rows.push_back({"div" + shapes, [](auto& x) { return x[0] / x[1]; }, {a, vals(sb, ++seed, 0.5, 2, 0.5)}});
    rows.push_back({"pow" + shapes, [](auto& x) { return sc::pow(x[0], x[1]); }, {pos(sa, ++seed), b}});
    rows.push_back({"maximum" + shapes, [](auto& x) { return sc::maximum(x[0], x[1]); }, {a_far, b_near}});
    rows.push_back({"minimum" + shapes, [](auto& x) { return sc::minimum(x[0], x[1]); }, {a_far, b_near}});
    // mod: quotients in (2, 3) and (-3, -2), away from the jumps at whole quotients (d/db = -2 or 3)
    const Tensor num = vals(sa, ++seed, 0.1, 0.8, 2.1), den = vals(sb, ++seed, 1.0, 1.04);
    rows.push_back({"mod" + shapes, [](auto& x) { return sc::mod(x[0], x[1]); }, {num, den}});
    rows.push_back({"mod (negative divisor)" + shapes, [](auto& x) { return sc::mod(x[0], -x[1]); }, {num, den}});
    rows.push_back({"minimum (b first)" + shapes, [](auto& x) { return sc::minimum(x[1], x[0]); }, {a_far, b_near}});
  }
  // Weak C++ scalars on either side (constants: only the tensor gets a gradient).
  const Tensor x = vals({2, 3}, 200, 0.5, 2);
  rows.push_back({"x * 2.5", [](auto& v) { return v[0] * 2.5; }, {x}});
  rows.push_back({"3 - x", [](auto& v) { return 3 - v[0]; }, {x}});
  rows.push_back({"1 / x", [](auto& v) { return 1.0 / v[0]; }, {x}});
  rows.push_back({"pow(x, 3)", [](auto& v) { return sc::pow(v[0], 3.0); }, {x}});
  rows.push_back({"pow(2, x)", [](auto& v) { return sc::pow(2.0, v[0]); }, {x}});
  rows.push_back({"maximum(x, 0)", [](auto& v) { return sc::maximum(v[0], 0.0); }, {vals({2, 3}, 201, 0, 2, 0.1)}});
  rows.push_back({"minimum(x, 0)", [](auto& v) { return sc::minimum(v[0], 0.0); }, {vals({2, 3}, 202, 0, 2, 0.1)}});
  check_rows(rows);
}

TEST_CASE("where and cast: gradients match central differences", "[autodiff][grad]") {
  const Tensor cond = sc::tensor({{true, false, true}, {false, false, true}});
  const Tensor cond_row = sc::tensor({true, false, true});
  check_rows({
      {"where [2,3] [2,3] [2,3]", [cond](auto& x) { return sc::where(cond, x[0], x[1]); }, {vals({2, 3}, 1), vals({2, 3}, 2)}},
      {"where [2,3] [3] [2,1]", [cond](auto& x) { return sc::where(cond, x[0], x[1]); }, {vals({3}, 3), vals({2, 1}, 4)}},
      {"where [3] [2,1] []", [cond_row](auto& x) { return sc::where(cond_row, x[0], x[1]); }, {vals({2, 1}, 5), vals({}, 6)}},
      {"where with a scalar branch", [cond](auto& x) { return sc::where(cond, x[0], 0.5); }, {vals({2, 3}, 7)}},
      {"where on a float condition", [](auto& x) { return sc::where(x[0] > 0, x[0] * x[1], x[1]); },
       {vals({2, 3}, 8, 0, 2, 0.1), vals({2, 3}, 9)}},
      // Through f32: the differences see f32 rounding, so a larger step and tolerance.
      {"cast f64 -> f32", [](auto& x) { return sc::cast(x[0] * x[0], sc::f32) * 2.f; }, {vals({2, 3}, 10)},
       {.eps = 1e-2, .atol = 2e-3, .rtol = 1e-3}},
      {"cast f32 -> f64 (promotion in mul)", [](auto& x) { return sc::cast(x[0], sc::f32) * x[1]; },
       {vals({2, 3}, 11), vals({3}, 12)}, {.eps = 1e-2, .atol = 2e-3, .rtol = 1e-3}},
  });
}

TEST_CASE("reductions: gradients over axis sets, with and without keepdims", "[autodiff][grad]") {
  const std::vector<std::vector<std::int64_t>> axis_sets = {{}, {0}, {1}, {-1}, {0, 2}, {1, 2}, {2, 0, 1}};
  using Reduce = Tensor (*)(const Tensor&, std::vector<std::int64_t>, bool, std::source_location);
  const std::vector<std::pair<std::string, Reduce>> reductions = {
      {"sum", sc::sum}, {"max", sc::max}, {"min", sc::min}, {"mean", sc::mean}, {"logsumexp", sc::logsumexp}};
  std::vector<Row> rows;
  std::uint64_t seed = 300;
  for (const auto& [name, op] : reductions)
    for (const auto& axes : axis_sets)
      for (bool keep : {false, true}) {
        std::string label = name + " axes {";
        for (auto a : axes) label += std::to_string(a) + ",";
        label += keep ? "} keepdims" : "}";
        // Then a nonlinear use of the result, so a wrong broadcast of g cannot cancel out.
        Fn f = [op, axes, keep](const std::vector<Tensor>& x) {
          const Tensor r = op(x[0], axes, keep, std::source_location::current());
          return r * r;
        };
        rows.push_back({label, f, {vals({2, 3, 4}, ++seed)}});  // continuous values: no ties
      }
  for (const auto& [name, op] : reductions) {
    rows.push_back({name + " of rank 0", [op](auto& x) { return op(x[0], {}, false, std::source_location::current()); },
                    {vals({}, ++seed)}});
    rows.push_back({name + " size-1 axis", [op](auto& x) { return op(x[0], {1}, false, std::source_location::current()); },
                    {vals({3, 1, 2}, ++seed)}});
  }
  check_rows(rows);
}

TEST_CASE("second-order gradients match central differences of the first", "[autodiff][grad][second]") {
  // second(g): an inner tape's gradient as a function, so check_gradients differentiates it.
  const Shape s{2, 3};
  check_rows({
      {"tanh''", second([](auto& x) { return sc::tanh(x[0]); }), {vals(s, 1)}},
      {"sigmoid''", second([](auto& x) { return sc::sigmoid(x[0]); }), {vals(s, 2, -3, 3)}},
      {"exp''", second([](auto& x) { return sc::exp(x[0]); }), {vals(s, 3)}},
      {"log''", second([](auto& x) { return sc::log(x[0]); }), {pos(s, 4)}},
      {"log1p''", second([](auto& x) { return sc::log1p(x[0]); }), {pos(s, 7)}},
      {"expm1''", second([](auto& x) { return sc::expm1(x[0]); }), {vals(s, 8)}},
      {"erf''", second([](auto& x) { return sc::erf(x[0]); }), {vals(s, 9, -2, 2)}},
      {"mul: d/da (a*a*b)", second([](auto& x) { return x[0] * x[0] * x[1]; }), {vals(s, 5), vals({3}, 6)}},
      {"sqrt''", second([](auto& x) { return sc::sqrt(x[0]); }), {pos(s, 7)}},
      {"sin''", second([](auto& x) { return sc::sin(x[0]); }), {vals(s, 8)}},
      {"cos''", second([](auto& x) { return sc::cos(x[0]); }), {vals(s, 9)}},
      {"square''", second([](auto& x) { return sc::square(x[0]) * x[0]; }), {vals(s, 10)}},
      {"div: d/da (a/b)^2", second([](auto& x) { auto q = x[0] / x[1]; return q * q; }),
       {vals(s, 11), vals({2, 1}, 12, 0.5, 2, 0.5)}},
      {"div: d/db (a/b)", second([](auto& x) { return x[1] / x[0]; }), {vals(s, 13, 0.5, 2, 0.5), vals(s, 14)}},
      {"pow: d/da a^b", second([](auto& x) { return sc::pow(x[0], x[1]); }), {pos(s, 15), vals(s, 16)}},
      {"pow: d/db a^b", second([](auto& x) { return sc::pow(x[1], x[0]); }), {vals(s, 17), pos(s, 18)}},
      {"where''", second([](auto& x) { return sc::where(x[1] > 0, x[0] * x[0] * x[0], sc::exp(x[0])); }),
       {vals(s, 19), vals(s, 20, 0, 1, 0.1)}},
      {"sum (keepdims)", second([](auto& x) { auto r = sc::sum(x[0] * x[0], {1}, true); return r * r; }), {vals(s, 21)}},
      {"max (keepdims)", second([](auto& x) { auto r = sc::max(x[0], {0}, true); return r * r * r; }), {vals(s, 22)}},
      {"logsumexp", second([](auto& x) { return sc::logsumexp(x[0], {1}, true); }), {vals(s, 23)}},
      {"mean", second([](auto& x) { auto r = sc::mean(x[0] * x[0]); return r * r; }), {vals(s, 24)}},
      {"maximum", second([](auto& x) { auto r = sc::maximum(x[0], x[1]); return r * r; }),
       {vals(s, 25, 0, 2, 0.5), vals(s, 26, -0.3, 0.3)}},
  });
}

TEST_CASE("second order through reductions that drop inner axes (the gradient reshapes)", "[autodiff][grad][second]") {
  // The rules of sum/max/min put dropped inner axes back with sc::reshape; an outer tape then
  // needs reshape's own rule (written with the layout ops). Here g takes the one input itself.
  auto second = [](std::function<Tensor(const Tensor&)> g) -> Fn {
    return [g](const std::vector<Tensor>& xs) {
      sc::GradientTape inner;
      inner.watch(xs[0]);
      return inner.gradient(g(xs[0]), xs[0]);
    };
  };
  const Shape s{2, 3, 4};
  check_rows({
      {"sum {1}", second([](auto& x) { auto r = sc::sum(x * x, {1}); return r * r; }), {vals(s, 1)}},
      {"max {2}", second([](auto& x) { auto r = sc::max(x, {2}); return r * r * r; }), {vals(s, 2)}},
      {"min {-1, 1}", second([](auto& x) { auto r = sc::min(x, {-1, 1}); return r * r * r; }), {vals(s, 3)}},
      {"mean {1}", second([](auto& x) { auto r = sc::mean(x * x, {1}); return r * r; }), {vals(s, 4)}},
      {"logsumexp {2}", second([](auto& x) { return sc::logsumexp(x, {2}); }), {vals(s, 5)}},
  });
}

TEST_CASE("hand-checked gradient values: ties, kinks and pow's special cases", "[autodiff][grad]") {
  auto grad = [](const Tensor& x, const std::function<Tensor(const Tensor&)>& f) {
    sc::GradientTape t;
    t.watch(x);
    return t.gradient(f(x), x).to_vector<double>();
  };
  const Tensor x = sc::tensor({-1.0, 0.0, 2.0});
  CHECK(grad(x, [](auto& v) { return sc::relu(v); }) == std::vector<double>{0, 0, 1});  // 0 at the kink
  CHECK(grad(x, [](auto& v) { return sc::abs(v); }) == std::vector<double>{-1, 0, 1});
  // maximum/minimum split ties half and half, so maximum(x, x) has derivative 1.
  CHECK(grad(x, [](auto& v) { return sc::maximum(v, v); }) == std::vector<double>{1, 1, 1});
  CHECK(grad(x, [](auto& v) { return sc::maximum(v, 0.0); }) == std::vector<double>{0, 0.5, 1});
  CHECK(grad(x, [](auto& v) { return sc::minimum(v, 0.0); }) == std::vector<double>{1, 0.5, 0});
  // A NaN result's gradient goes to the NaN input (the one the kernel propagated).
  {
    const double nan = std::nan("");
    const Tensor a = sc::tensor({nan, 1.0, 2.0}), b = sc::tensor({0.0, nan, 1.0});
    sc::GradientTape tm;
    tm.watch({a, b});
    const auto gm = tm.gradient(sc::maximum(a, b), {a, b});
    CHECK(gm[0].to_vector<double>() == std::vector<double>{1, 0, 1});
    CHECK(gm[1].to_vector<double>() == std::vector<double>{0, 1, 0});
  }
  // max/min divide the gradient among ties (as TF); NaN results give no gradient.
  const Tensor t = sc::tensor({{1.0, 3.0, 3.0}, {5.0, 2.0, 5.0}});
  CHECK(grad(t, [](auto& v) { return sc::max(v, {1}); }) == std::vector<double>{0, 0.5, 0.5, 0.5, 0, 0.5});
  CHECK(grad(t, [](auto& v) { return sc::max(v); }) == std::vector<double>{0, 0, 0, 0.5, 0, 0.5});
  CHECK(grad(t, [](auto& v) { return sc::min(v, {0}); }) == std::vector<double>{1, 0, 1, 0, 1, 0});
  const double nan = std::nan("");
  CHECK(grad(sc::tensor({1.0, nan}), [](auto& v) { return sc::max(v); }) == std::vector<double>{0, 0});
  // pow: d/da a^0 = 0 even at a = 0 (not 0 * inf); d/db is 0 where a <= 0, never NaN.
  const Tensor b = sc::tensor({0.0, 0.0, 2.0});
  sc::GradientTape tp;
  const Tensor a = sc::tensor({0.0, -2.0, -2.0});
  tp.watch({a, b});
  const auto gs = tp.gradient(sc::pow(a, b), {a, b});
  CHECK(gs[0].to_vector<double>() == std::vector<double>{0, 0, -4});
  CHECK(gs[1].to_vector<double>() == std::vector<double>{0, 0, 0});
  // sqrt at 0: an infinite slope, as the math says.
  CHECK(std::isinf(grad(sc::tensor({0.0}), [](auto& v) { return sc::sqrt(v); })[0]));
}

TEST_CASE("gradients keep the source dtype and pass through promotion", "[autodiff][grad]") {
  const Tensor x = sc::tensor({1.f, 2.f});                     // f32
  const Tensor w = sc::tensor({0.5, 0.25});                    // f64
  sc::GradientTape t;
  t.watch(x);
  const Tensor y = x * w * x;                                  // promoted: cast(x) is recorded
  CHECK(y.dtype() == sc::f64);
  const Tensor g = t.gradient(y, x);
  CHECK(g.dtype() == sc::f32);
  CHECK(g.to_vector<float>() == std::vector<float>{1.f, 1.f});  // 2 w x
  // Integer inputs of float ops are promoted; only the float source gets a gradient.
  sc::GradientTape t2;
  t2.watch(x);
  const auto gi = t2.gradient(sc::exp(x) * sc::tensor({std::int32_t{2}, std::int32_t{3}}), x).to_vector<float>();
  CHECK(gi[0] == Approx(2 * std::exp(1.f)));
  CHECK(gi[1] == Approx(3 * std::exp(2.f)));
}

TEST_CASE("non-differentiable ops pass no gradient (the result is a constant)", "[autodiff][grad]") {
  const Tensor x = sc::tensor({-1.5, 0.5, 2.5});
  sc::GradientTape t(/*persistent=*/true);
  t.watch(x);
  const std::size_t before = t.size();
  // Comparisons, logical ops, sign, floor/ceil/round, argmax/argmin: piecewise constant, never recorded.
  const Tensor c = (x > 0) && (x < 2);
  const Tensor s = sc::sign(x);
  const Tensor r = sc::floor(x) + sc::ceil(x) + sc::round(x);
  const Tensor am = sc::argmax(x, 0);
  const Tensor eq = x == x;
  CHECK(t.size() == before);
  CHECK(t.gradient(s * 2.0, x).to_vector<double>() == std::vector<double>{0, 0, 0});
  CHECK(t.gradient(r * 2.0, x).to_vector<double>() == std::vector<double>{0, 0, 0});
  CHECK(t.gradient(sc::cast(c, sc::f64), x).to_vector<double>() == std::vector<double>{0, 0, 0});
  CHECK(t.gradient(sc::cast(am, sc::f64) + sc::cast(eq, sc::f64), x).to_vector<double>() ==
        std::vector<double>{0, 0, 0});
  // A cast to an integer dtype is recorded but carries no gradient (no truncated gradient flows).
  const Tensor through_int = sc::cast(sc::cast(x * 3.0, sc::i32), sc::f64);
  CHECK(t.gradient(through_int, x).to_vector<double>() == std::vector<double>{0, 0, 0});
  // Where: the condition gets none; sign's derivative is 0, so x * sign(x) = |x| has slope sign(x).
  CHECK(t.gradient(x * sc::sign(x), x).to_vector<double>() == std::vector<double>{-1, 1, 1});
}

TEST_CASE("check_gradients itself reports a wrong gradient", "[autodiff][grad]") {
  // A custom gradient that is off by a factor of 2: the check must fail and say where.
  const Fn wrong = [](const std::vector<Tensor>& xs) {
    return sc::custom_gradient([](const std::vector<Tensor>& v) { return v[0] * v[0]; },
                               [](const Tensor& g, const std::vector<Tensor>& v, const Tensor&) {
                                 return std::vector<Tensor>{g * v[0]};
                               },
                               xs);
  };
  const sc::GradCheckResult r = sc::check_gradients(wrong, {vals({3}, 1, 0.5, 2)});
  CHECK_FALSE(r.ok);
  CHECK_FALSE(static_cast<bool>(r));
  CHECK(r.max_abs_error > 0.4);
  CHECK_THAT(r.report, Catch::Contains("input 0 element 0: analytic"));
  const sc::GradCheckResult ok = sc::check_gradients([](auto& v) { return v[0] * v[0]; }, {vals({3}, 1)});
  CHECK(ok.ok);
  CHECK(ok.report.empty());
}
