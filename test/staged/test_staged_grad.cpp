// sc::grad<I>: the compile-time derivative of the sum of a compiled function's output equals the
// tape's gradient of the same generic function run eagerly, with broadcasting, for every
// differentiable elementwise op; second order equals nested tapes; both pass a finite-difference
// check in f64.
#include "staged/staged_testing.hpp"

using sc::Tensor;
using sctest::away_from_zero;
using sctest::check_grads;
using sctest::check_same;

namespace {

/// d/d(wrt) of sum(d sum(f(x, y)) / dx) by nested tapes (wrt is x or y).
template <class F>
Tensor nested_second(const F& f, const Tensor& x, const Tensor& y, const Tensor& wrt) {
  sc::GradientTape outer;
  outer.watch(wrt);
  Tensor dx;
  {
    sc::GradientTape inner;
    inner.watch(x);
    dx = inner.gradient(sc::sum(f(x, y)), x);
  }
  return outer.gradient(sc::sum(dx), wrt);
}

}  // namespace

TEST_CASE("grad<I> equals the tape for every differentiable elementwise op", "[staged][grad]") {
  for (sc::DType d : {sc::f32, sc::f64}) {
    for (const auto& [sx, sy] : std::vector<std::pair<sc::Shape, sc::Shape>>{{{9}, {9}}, {{4, 3}, {3}}, {{2, 1}, {1, 5}}}) {
      const Tensor x = away_from_zero(sx, 1, d), y = away_from_zero(sy, 2, d);
      const std::string at = std::string(sc::name(d)) + " " + sctest::str(sx) + " " + sctest::str(sy);
      check_grads([](const auto& a, const auto& b) { return sc::tanh(a * b) + 2.f * a; }, "tanh(x*y) + 2x " + at, x, y);
      check_grads([](const auto& a, const auto& b) { return sc::sigmoid(a) * sc::exp(-b) / (1 + a * a); },
                  "sigmoid, exp, div " + at, x, y);
      check_grads([](const auto& a, const auto& b) { return sc::where(a > b, sc::sqrt(sc::abs(a) + 1), sc::sin(a) * sc::cos(b)); },
                  "where, sqrt, abs, sin, cos " + at, x, y);
      check_grads([](const auto& a, const auto& b) { return sc::maximum(a, b) * sc::minimum(a, 0.5f) + sc::relu(a) - sc::abs(b); },
                  "maximum, minimum, relu " + at, x, y);
      check_grads([](const auto& a, const auto& b) { return sc::pow(sc::abs(a) + 0.5f, b); }, "pow " + at, x, y);
      check_grads([](const auto& a, const auto& b) { return sc::mod(a * 3.f, b) + sc::floor_div(a, b) * a; },
                  "mod, floor_div " + at, x, y);
      check_grads([](const auto& a, const auto& b) { return sc::log(sc::square(a) + 1) * -b - a / b; }, "log, square, neg " + at,
                  x, y);
      check_grads([](const auto& a, const auto& b) { return sc::sum(a * b + sc::tanh(a)); }, "sum at the root " + at, x, y);
      check_grads([](const auto& a, const auto& b) { return sc::sign(a) * b + sc::cast<sc::f64>(a > 0) * a; },
                  "sign and a cast mask " + at, x, y);
    }
  }
}

TEST_CASE("grad<I> of arguments used trivially or not at all", "[staged][grad]") {
  const Tensor x = away_from_zero({2, 3}, 5, sc::f32), y = away_from_zero({3}, 6, sc::f32);
  check_grads([](const auto& a, const auto&) { return a; }, "identity", x, y);
  check_grads([](const auto& a, const auto& b) { return a + b; }, "sum of the arguments (y broadcast)", x, y);
  check_grads([](const auto& a, const auto& b) { return a * 3.f + b * 0; }, "linear", x, y);
  const auto g = sc::compile([](auto a, auto) { return sc::exp(a); });
  const Tensor dy = sc::grad<1>(g)(x, y);
  check_same(dy, sc::zeros({3}), 0.0, "unused argument: zeros");
  // read only where no gradient passes (floor_div, a comparison) under a materialized root: zeros
  // of its shape and dtype, not a weak zero (once an i64 scalar)
  for (sc::DType d : {sc::f32, sc::f64}) {
    const Tensor xd = x.astype(d), yd = y.astype(d);
    check_grads([](const auto& a, const auto&) { return sc::max(0.5 / sc::floor_div(2, a), {-1}); }, "max of floor_div", xd, yd);
    check_grads([](const auto& a, const auto& b) { return sc::sum(sc::where(sc::floor(a) > b, b * 2, sc::square(b)), {-1}); },
                "a sum whose argument 0 is only in a condition", xd, yd);
  }
}

TEST_CASE("grad<I> through a where whose condition reads float-only ops of the arguments", "[staged][grad]") {
  // the adjoint where(c, 1, 0) is weak (its branches are constants), its condition not: on integer
  // dtypes (instantiated for every dtype the call could see) log(b) > ... is computed in f32, so the
  // fused loop must not take integer lanes for it (once a compile error inside xsimd's log)
  for (sc::DType d : {sc::f32, sc::f64}) {
    const Tensor x = away_from_zero({4, 3}, 7, d), y = away_from_zero({3}, 8, d);
    check_grads([](const auto& a, const auto& b) { return sc::where(sc::log(sc::abs(b)) > sc::mod(-1.5f, a), a + 1.f, -a); },
                "where(log|y| > mod(-1.5, x), x + 1, -x)", x, y);
    check_grads([](const auto& a, const auto& b) { return sc::where(sc::sqrt(sc::abs(a)) > b, 2.f * a, a * b) * 3.f; },
                "where(sqrt|x| > y, 2x, xy) * 3", x, y);
    // a weak where's branch a weak where of its own, whose condition computes exp
    check_grads([](const auto& a, const auto& b) { return sc::where(-1.5f * b > sc::exp(b), sc::where(b > a, b, b * 2), a); },
                "where(-1.5y > exp(y), where(y > x, y, 2y), x)", x, y);
  }
}

TEST_CASE("grad<I> of a sum at the root checks its axes as the forward sum does", "[staged][grad][errors]") {
  const Tensor x = away_from_zero({2, 3}, 7, sc::f32);
  const auto repeated = sc::compile([](auto a) { return sc::sum(a * a, {1, -1}); });
  const std::string msg = sctest::error_of<sc::ShapeError>([&] { (void)sc::grad<0>(repeated)(x); });
  CHECK(msg.find("[sum] axis -1 appears twice in axes [1, -1] for shape [2, 3]") == 0);
  CHECK(msg.find("test_staged_grad.cpp") != std::string::npos);
  const auto out_of_range = sc::compile([](auto a) { return sc::sum(sc::exp(a), {2}); });
  CHECK_THROWS_AS(sc::grad<0>(out_of_range)(x), sc::ShapeError);
  // valid axes: the root sum changes nothing
  const auto rows = sc::compile([](auto a) { return sc::sum(a * a, {1}); });
  check_same(sc::grad<0>(rows)(x), x * 2.f, 1e-6, "sum over axis 1");
}

TEST_CASE("grad<I> raises the forward's shape and dtype errors, as the tape does", "[staged][grad][errors]") {
  // The tape runs the forward first, so its errors are the forward op's: a broadcast that fails
  // is the op's ShapeError (not a complaint about the gradient's shape), bool arithmetic the op's
  // DTypeError, and an integer result is not differentiable.
  const Tensor x = away_from_zero({2, 3}, 51, sc::f32), y = away_from_zero({4}, 52, sc::f32);
  const auto mul = sc::compile([](auto a, auto b) { return a * b + a; });
  for (const std::string& msg : {sctest::error_of<sc::ShapeError>([&] { (void)sc::grad<0>(mul)(x, y); }),
                                 sctest::error_of<sc::ShapeError>([&] { (void)sc::grad<1>(mul)(x, y); }),
                                 sctest::error_of<sc::ShapeError>([&] { (void)sc::grad<0>(sc::grad<0>(mul))(x, y); })}) {
    CHECK(msg.find("[mul] cannot broadcast shapes [2, 3] and [4]") == 0);
    CHECK(msg.find("test_staged_grad.cpp") != std::string::npos);
  }
  const auto sel = sc::compile([](auto a, auto b) { return sc::where(a > 0, a, b) * 2; });
  CHECK(sctest::error_of<sc::ShapeError>([&] { (void)sc::grad<0>(sel)(x, y); }).find("[where] cannot broadcast") == 0);
  const Tensor m = x > 0, n = sc::slice(x, {0, 0}, {1, 3}) > 1;
  const auto sub = sc::compile([](auto a, auto b) { return a - b; });
  CHECK(sctest::error_of<sc::DTypeError>([&] { (void)sc::grad<0>(sub)(m, n); }).find("[sub] expects numeric dtypes, got bool") == 0);
  const Tensor i = sc::cast(x * 3.f, sc::i32), j = sc::cast(y * 3.f, sc::i32);
  const std::string imsg = sctest::error_of<sc::DTypeError>([&] { (void)sc::grad<0>(sub)(i, sc::slice(i, {0, 0}, {1, 3})); });
  CHECK(imsg.find("[grad] the result has dtype i32; only floating-point results are differentiable") == 0);
  CHECK(imsg.find("test_staged_grad.cpp") != std::string::npos);
  CHECK(sctest::error_kind([&] { (void)sc::grad<1>(mul)(i, j); }) == "ShapeError");
  // an integer or bool argument has no gradient (the tape refuses such a source): once an i32
  // "gradient" of the real derivative, truncated
  const Tensor yi = sc::cast(sc::slice(x, {0, 0}, {1, 3}) * 3.f, sc::i32);
  const auto refused = [](const auto& call, int arg, const std::string& dtype) {
    const std::string msg = sctest::error_of<sc::DTypeError>(call);
    CHECK(msg.find("[grad] argument " + std::to_string(arg) + " has dtype " + dtype +
                   "; gradients exist only for floating-point arguments") == 0);
    CHECK(msg.find("test_staged_grad.cpp") != std::string::npos);
  };
  refused([&] { (void)sc::grad<1>(mul)(x, yi); }, 1, "i32");
  refused([&] { (void)sc::grad<0>(mul)(yi, x); }, 0, "i32");
  refused([&] { (void)sc::grad<0>(sc::grad<1>(mul))(x, yi); }, 1, "i32");
  refused([&] { (void)sc::grad<1>(sc::grad<0>(mul))(x, sc::cast(yi, sc::i64)); }, 1, "i64");
  refused([&] { (void)sc::grad<1>(mul).concrete(x, yi); }, 1, "i32");
  const auto pick = sc::compile([](auto c, auto a) { return sc::where(c, a, a * 2); });
  refused([&] { (void)sc::grad<0>(pick)(m, x); }, 0, "bool");
  check_same(sc::grad<1>(pick)(m, x), 2.f - sc::cast(m, sc::f32), 0.0, "d where(c, a, 2a)/da, c bool");
  check_same(sc::grad<0>(mul)(x, yi), sc::broadcast_to(sc::cast(yi, sc::f32) + 1, {2, 3}), 0.0, "d(a b + a)/da, b i32");
  // valid calls are unchanged
  check_same(sc::grad<0>(sub)(x, sc::slice(x, {0, 0}, {1, 3})), sc::ones({2, 3}), 0.0, "d(a - b)/da");
}

TEST_CASE("second order: grad<0>(grad<0>(g)) equals nested tapes", "[staged][grad]") {
  const Tensor x = away_from_zero({7}, 3, sc::f64), y = away_from_zero({7}, 4, sc::f64);
  auto check2 = [&](auto f, const std::string& what) {
    INFO(what);
    const auto g = sc::compile(f);
    check_same(sc::grad<0>(sc::grad<0>(g))(x, y), nested_second(f, x, y, x), 1e-6, what);
    // d/dy of sum(d/dx): the mixed second derivative
    check_same(sc::grad<1>(sc::grad<0>(g))(x, y), nested_second(f, x, y, y), 1e-6, what + " (mixed)");
  };
  check2([](const auto& a, const auto& b) { return sc::tanh(a * b) + a * a * a; }, "tanh(xy) + x^3");
  check2([](const auto& a, const auto& b) { return sc::sin(a) * sc::exp(b * a) / (a * a + 1); }, "sin, exp, div");
  check2([](const auto& a, const auto& b) { return sc::sigmoid(a) * sc::log(sc::square(b) + a * a); }, "sigmoid, log");
  // third order by composition
  const auto g = sc::compile([](auto a, auto) { return a * a * a * a; });
  const auto d3 = sc::grad<0>(sc::grad<0>(sc::grad<0>(g)));
  std::vector<double> want;
  for (double v : x.to_vector<double>()) want.push_back(24 * v);
  check_same(d3(x, y), sc::tensor(want, x.shape()), 1e-9, "x^4 third derivative");
}

TEST_CASE("pow with a scalar or a tensor exponent: first and second derivatives", "[staged][grad]") {
  // A C++ scalar exponent is a weak constant: the rule's where(b == 0, 0, ...) has a constant
  // condition, computed in the branches' type (on the fused loop and the op-by-op path alike).
  for (sc::DType d : {sc::f32, sc::f64}) {
    const Tensor x = away_from_zero({4, 3}, 31, d), y = away_from_zero({3}, 32, d);
    const std::string at = std::string(" ") + std::string(sc::name(d));
    check_grads([](const auto& a, const auto& b) { return sc::pow(a, 3.f) * b + sc::pow(b, 2); }, "pow(x, 3.f), pow(y, 2)" + at,
                x, y);
    check_grads([](const auto& a, const auto& b) { return sc::pow(sc::abs(a) + 0.5f, 1.5) - sc::pow(a * b, 0); },
                "pow(|x| + 0.5, 1.5), pow(xy, 0)" + at, x, y);
  }
  const Tensor x = away_from_zero({7}, 33, sc::f64), y = away_from_zero({7}, 34, sc::f64);
  auto check2 = [&](auto f, const std::string& what) {
    INFO(what);
    const auto g = sc::compile(f);
    check_same(sc::grad<0>(sc::grad<0>(g))(x, y), nested_second(f, x, y, x), 1e-9, what);
    check_same(sc::grad<1>(sc::grad<0>(g))(x, y), nested_second(f, x, y, y), 1e-9, what + " (mixed)");
  };
  check2([](const auto& a, const auto& b) { return sc::pow(a, 3.f) * b + sc::pow(a, 1); }, "pow(x, 3.f) * y + pow(x, 1)");
  check2([](const auto& a, const auto& b) { return sc::pow(sc::abs(a) + 0.5f, b); }, "pow(|x| + 0.5, y)");
  // the exponent 0 and 1 at x = 0: the derivatives are exactly 0 (where eager's rule puts them)
  const Tensor z = sc::zeros({3}, sc::f32);
  const auto p1 = sc::compile([](auto a) { return sc::pow(a, 1); });
  check_same(sc::grad<0>(sc::compile([](auto a) { return sc::pow(a, 0.f); }))(z), sc::zeros({3}), 0.0, "d/dx x^0 at 0");
  check_same(sc::grad<0>(p1)(z), sc::ones({3}), 0.0, "d/dx x^1 at 0");
  check_same(sc::grad<0>(sc::grad<0>(p1))(z), sc::zeros({3}), 0.0, "d2/dx2 x^1 at 0");
}

TEST_CASE("the gradient with respect to an argument has its dtype", "[staged][grad]") {
  // The fused loop runs only where the argument's dtype is the graph's; otherwise the op-by-op
  // path casts, as the tape does.
  const Tensor x = away_from_zero({2, 3}, 41, sc::f32), yi = sc::tensor(std::vector<std::int32_t>{3, -4, 5}, sc::Shape{3});
  const auto mul = sc::compile([](auto a, auto b) { return a * b; });
  check_same(sc::grad<0>(mul)(x, yi), sc::broadcast_to(sc::cast(yi, sc::f32), {2, 3}), 0.0, "d(x y)/dx, x f32, y i32");
  const Tensor x64 = sc::cast(x, sc::f64), y32 = away_from_zero({3}, 42, sc::f32);
  check_grads([](const auto& a, const auto& b) { return a * b; }, "x f64, y f32", x64, y32);
  check_grads([](const auto& a, const auto& b) { return sc::tanh(a) * b + sc::sum(a * b, {-1}, true); },
              "a reduction inside, x f32, y f64", x, sc::cast(y32, sc::f64));
  const Tensor d2 = sc::grad<0>(sc::grad<0>(sc::compile([](auto a, auto b) { return a * a * b; })))(x, sc::cast(y32, sc::f64));
  check_same(d2, sc::broadcast_to(sc::cast(2 * y32, sc::f32), {2, 3}), 1e-6, "second order, x f32, y f64");
}

TEST_CASE("arguments of different floating dtypes: the tape's gradients, bit for bit", "[staged][grad]") {
  // each op's adjoint in its result's dtype, as the tape has it: d/dy of x * y + y for x f32 and
  // y f64 is x + 1 in f64 (once x + 1 in f32, widened: 1.1000000238418579 for x = 0.1f, not
  // 1.1000000014901161)
  const Tensor x = away_from_zero({4, 3}, 61, sc::f32), y = sc::cast(away_from_zero({3}, 62, sc::f32), sc::f64) / 3;
  const auto exact = [&](const auto& f, const std::string& what, const Tensor& a, const Tensor& b) {
    const auto g = sc::compile(f);
    const std::vector<Tensor> want = sctest::tape_grads(f, a, b);
    check_same(sc::grad<0>(g)(a, b), want[0], 0.0, what + ": grad<0>");
    check_same(sc::grad<1>(g)(a, b), want[1], 0.0, what + ": grad<1>");
  };
  for (int order = 0; order < 2; ++order) {
    const Tensor& a = order ? y : x;
    const Tensor& b = order ? x : y;
    const std::string at = order ? " (f64, f32)" : " (f32, f64)";
    exact([](const auto& p, const auto& q) { return p * q + q; }, "x y + y" + at, a, b);
    exact([](const auto& p, const auto& q) { return q / p + sc::tanh(q * p) * 0.3f; }, "y / x + tanh(y x) 0.3" + at, a, b);
    exact([](const auto& p, const auto& q) { return sc::sum(sc::exp(p * 0.1f) * q, {-1}); }, "a sum at the root" + at, a, b);
    exact([](const auto& p, const auto& q) { return sc::nn::softmax(p * q, -1) * q; }, "softmax inside" + at, a, b);
    exact([](const auto& p, const auto& q) { return sc::where(sc::floor(p) > 0, q * 2, sc::square(q)); },
          "argument 0 only in a condition" + at, a, b);
  }
  // second order: nested tapes' bits (the inner derivative by its own tape, recorded on the outer)
  const auto f2 = [](const auto& p, const auto& q) { return (sc::sign(p) + p * p) * 1e-3 * (q / (sc::log1p(sc::abs(q)) - 0.5)) + sc::tanh(p * q); };
  for (const auto& [a, b] : {std::pair{x, y}, std::pair{y, x}}) {
    const auto g2 = sc::compile(f2);
    check_same(sc::grad<0>(sc::grad<0>(g2))(a, b), nested_second(f2, a, b, a), 0.0, "second order d/dx d/dx, mixed");
    check_same(sc::grad<1>(sc::grad<0>(g2))(a, b), nested_second(f2, a, b, b), 0.0, "second order d/dy d/dx, mixed");
  }
  // the lowered graph (g.graph, g.concrete) is the tape's too: its traced run has the call's bits
  for (const auto& [a, b] : {std::pair{x, y}, std::pair{y, x}}) {
    const auto gm = sc::grad<1>(sc::compile([](const auto& p, const auto& q) { return p * q + q; }));
    const Tensor called = gm(a, b);
    check_same(gm.concrete(a, b)(a, b), called, 0.0, "traced lowering of a mixed-dtype gradient");
    CHECK(gm.graph().str() == gm.graph(a, b).str());
    const auto gm2 = sc::grad<0>(sc::grad<1>(sc::compile(f2)));
    check_same(gm2.concrete(a, b)(a, b), gm2(a, b), 0.0, "traced lowering of a mixed-dtype second derivative");
  }
  // the same tensor as both arguments: two arguments, each differentiated alone
  const auto g = sc::compile([](const auto& p, const auto& q) { return p * q * q; });
  const Tensor x2 = sc::broadcast_to(y, {4, 3});
  check_same(sc::grad<0>(g)(sc::cast(x2, sc::f32), x2), sc::cast(x2 * x2, sc::f32), 0.0, "d(p q q)/dp");
  // a result that is not floating is refused, naming the line
  const auto cmp = sc::compile([](const auto& p, const auto& q) { return p > q; });
  const std::string msg = sctest::error_of<sc::DTypeError>([&] { (void)sc::grad<0>(cmp)(x, y); });
  CHECK(msg.find("[grad] the result has dtype bool; only floating-point results are differentiable") == 0);
  CHECK(msg.find("test_staged_grad.cpp") != std::string::npos);
}

TEST_CASE("a compiled function runs fused eagerly, traced and under a tape", "[staged][grad]") {
  const Tensor x = away_from_zero({5}, 8, sc::f32), y = away_from_zero({5}, 9, sc::f32);
  const auto g = sc::compile([](auto a, auto b) { return sc::tanh(a) * b; });
  // Under a tape the compiled call records its ops (it runs them one by one), so the tape's
  // gradient flows through it.
  sc::GradientTape t;
  t.watch(x);
  const Tensor out = g(x, y);
  const Tensor dx = t.gradient(sc::sum(out), x);
  check_same(dx, sc::grad<0>(g)(x, y), 1e-6, "tape through a compiled call");
  // Inside sc::function the call is staged into the trace.
  auto f = sc::function([&g](const Tensor& a, const Tensor& b) { return g(a, b) * 2.f; });
  check_same(f(x, y), sc::tanh(x) * y * 2.f, 1e-6, "compiled call inside sc::function");
}

TEST_CASE("grad<I> through matmul, reductions, softmax, logsumexp and conv2d equals the tape", "[staged][grad]") {
  // The materialized ops differentiate by their eager gradient rules (staged/grad.hpp, VjpOp);
  // f64 cases are also checked against finite differences.
  for (sc::DType d : {sc::f32, sc::f64}) {
    const std::string at = std::string(" ") + std::string(sc::name(d));
    const Tensor x = away_from_zero({5, 7}, 11, d), w = away_from_zero({7, 3}, 12, d);
    const Tensor sq = away_from_zero({4, 4}, 13, d), sq2 = away_from_zero({4, 4}, 14, d);
    const Tensor row = away_from_zero({7}, 15, d);
    check_grads([](const auto& a, const auto& b) { return sc::tanh(sc::matmul(a, b)); }, "tanh(matmul)" + at, x, w);
    check_grads([](const auto& a, const auto& b) { return 0.5f * sc::matmul(a, b) + 1; }, "a constant seed" + at, x, w);
    check_grads([](const auto& a, const auto& b) { return sc::matmul(a, b, true, false) * sc::matmul(b, a); },
                "transposed, and an argument in both operands" + at, sq, sq2);
    check_grads([](const auto& a, const auto&) { return sc::matmul(a, a); }, "matmul(x, x)" + at, sq, sq2);
    check_grads([](const auto& a, const auto& b) { return sc::sum(a * a, {-1}, true) * b + sc::mean(sc::exp(a) * b, {0}); },
                "sum and mean inside" + at, x, row);
    check_grads([](const auto& a, const auto& b) { return sc::max(a * b, {-1}, true) - sc::min(a, {0}) * b; },
                "max and min inside" + at, x, row);
    check_grads([](const auto& a, const auto& b) { return sc::nn::softmax(a * b) * a + sc::nn::log_softmax(a - b, 0); },
                "softmax, log_softmax" + at, x, row);
    check_grads([](const auto& a, const auto& b) { return sc::logsumexp(a * b, {-1}, true) * sc::tanh(a); },
                "logsumexp" + at, x, row);
    check_grads([](const auto& a, const auto& b) { return sc::sum(sc::tanh(sc::matmul(a, b)), {0}); },
                "a reduction of a matmul" + at, x, w);
    // the uses of x around and inside a reduction: each region's adjoint has its own shape
    const Tensor x3 = away_from_zero({3, 1, 1}, 18, d);
    check_grads([](const auto& a, const auto& b) { return sc::sum(a, {-1}, true) * b + a; }, "regions" + at, x, x3);
    check_grads([](const auto& a, const auto& b) { return sc::mean(sc::tanh(a) * b, {0}) * a + b; },
                "a reduction over a broadcast" + at, x, x3);
    check_grads([](const auto& a, const auto& b) { return sc::cumprod(a * b, 1) + sc::logcumsumexp(a, 0, false, true); },
                "cumprod, logcumsumexp" + at, x, row);
    check_grads([](const auto& a, const auto& b) { return sc::cummax(a * b, 1) * sc::tanh(a); }, "cummax" + at, x, row);
    check_grads([](const auto& a, const auto& b) { return sc::linear_scan(sc::sigmoid(a), b * a, 1, true); },
                "linear_scan" + at, x, row);
    const Tensor img = away_from_zero({2, 2, 6, 6}, 16, d), k = away_from_zero({3, 2, 3, 3}, 17, d);
    check_grads([](const auto& a, const auto& b) { return sc::relu(sc::nn::conv2d(a, b, 1, 1)) * 0.25f; },
                "conv2d" + at, img, k);
  }
}

TEST_CASE("second order through matmul equals nested tapes", "[staged][grad]") {
  const Tensor x = away_from_zero({3, 4}, 21, sc::f64), w = away_from_zero({4, 2}, 22, sc::f64);
  auto f = [](const auto& a, const auto& b) { return sc::tanh(sc::matmul(a, b)); };
  const auto g = sc::compile(f);
  check_same(sc::grad<0>(sc::grad<0>(g))(x, w), nested_second(f, x, w, x), 1e-9, "d2/dx2 sum tanh(xw)");
}

