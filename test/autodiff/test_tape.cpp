// The gradient tape: nesting, persistence, sources, stop_gradient, custom gradients, jacobian/hvp, variables.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <array>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using sc::Tensor;
using Vec = std::vector<double>;

Vec v(const Tensor& t) { return t.to_vector<double>(); }
std::string at_line(int line) { return "test_tape.cpp:" + std::to_string(line); }

}  // namespace

TEST_CASE("TensorFlow Eager's example: nested tapes give the second derivative", "[autodiff][tape]") {
  const Tensor x = sc::scalar(3.f);
  sc::GradientTape outer;
  outer.watch(x);
  Tensor dy;
  {
    sc::GradientTape inner;
    inner.watch(x);
    const Tensor y = x * x;
    dy = inner.gradient(y, x);
  }
  CHECK(dy.item<float>() == 6.f);
  CHECK(outer.gradient(dy, x).item<float>() == 2.f);
}

TEST_CASE("three nested tapes give the third derivative", "[autodiff][tape]") {
  const Tensor x = sc::scalar(2.0);
  sc::GradientTape t3;
  t3.watch(x);
  Tensor d2;
  {
    sc::GradientTape t2;
    t2.watch(x);
    Tensor d1;
    {
      sc::GradientTape t1;
      t1.watch(x);
      d1 = t1.gradient(x * x * x, x);  // 3x^2 = 12
    }
    CHECK(d1.item<double>() == 12);
    d2 = t2.gradient(d1, x);  // 6x = 12
  }
  CHECK(d2.item<double>() == 12);
  CHECK(t3.gradient(d2, x).item<double>() == 6);
  // The same through pow (x^3 with a constant exponent).
  sc::GradientTape o2;
  o2.watch(x);
  Tensor g1;
  {
    sc::GradientTape o1;
    o1.watch(x);
    g1 = o1.gradient(sc::pow(x, 3.0), x);
  }
  CHECK(g1.item<double>() == Approx(12));
  CHECK(o2.gradient(g1, x).item<double>() == Approx(12));
}

TEST_CASE("a non-persistent tape computes one gradient, a persistent one several", "[autodiff][tape]") {
  const Tensor x = sc::tensor({1.0, 2.0});
  {
    sc::GradientTape t(/*persistent=*/true);
    t.watch(x);
    const Tensor y = x * x;
    const Tensor z = y * y;
    CHECK(t.persistent());
    CHECK(v(t.gradient(z, x)) == Vec{4, 32});  // 4x^3
    CHECK(v(t.gradient(y, x)) == Vec{2, 4});
    CHECK(v(t.gradient(z, y)) == Vec{2, 8});  // with respect to an intermediate
    t.reset();                                // forgets everything; records again afterwards
    CHECK(t.size() == 0);
    CHECK(v(t.gradient(z, x)) == Vec{0, 0});
  }
  sc::GradientTape t;
  t.watch(x);
  const Tensor y = x * x;
  CHECK_FALSE(t.persistent());
  CHECK(v(t.gradient(y, x)) == Vec{2, 4});
  const int line = __LINE__ + 1;
  CHECK_THROWS_AS(t.gradient(y, x), sc::ValueError);
  CHECK_THROWS_WITH(t.gradient(y, x), Catch::Contains("[gradient]") && Catch::Contains("persistent") &&
                                          Catch::Contains(at_line(line + 1)));
}

TEST_CASE("vector sources, non-scalar targets, unconnected sources", "[autodiff][tape]") {
  const Tensor a = sc::tensor({1.0, 2.0, 3.0});
  const Tensor b = sc::scalar(0.5);
  const Tensor unused = sc::zeros({2, 2}, sc::f32);
  sc::GradientTape t(/*persistent=*/true);
  t.watch({a, b, unused});
  const Tensor y = a * b + a * a;  // non-scalar: the target is its sum
  const std::vector<Tensor> gs = t.gradient(y, {a, b, unused});
  REQUIRE(gs.size() == 3);
  CHECK(v(gs[0]) == Vec{2.5, 4.5, 6.5});  // b + 2a
  CHECK(v(gs[1]) == Vec{6});              // sum(a), summed back over the broadcast
  CHECK(gs[1].shape() == sc::Shape{});
  // Unconnected: zeros of the source's shape and dtype (also for a never-watched tensor).
  CHECK(gs[2].shape() == sc::Shape{2, 2});
  CHECK(gs[2].dtype() == sc::f32);
  CHECK(gs[2].to_vector<float>() == std::vector<float>{0, 0, 0, 0});
  CHECK(v(t.gradient(y, sc::tensor({7.0}))) == Vec{0});
  // The target itself: d y / d y = 1 (every element).
  CHECK(v(t.gradient(y, y)) == Vec{1, 1, 1});
  // A source that is used twice accumulates both paths.
  CHECK(v(t.gradient(a * a + a, a)) == Vec{3, 5, 7});
}

TEST_CASE("a source the tape does not track gets zeros, never part of its gradient", "[autodiff][tape]") {
  const Tensor x = sc::tensor({1.0, 2.0}), c = sc::tensor({3.0, 4.0});
  sc::GradientTape t(/*persistent=*/true);
  t.watch(x);
  // x * c is recorded (x is watched), c * c is not: following c would give [1, 2], only x's path.
  const Tensor loss = sc::sum(x * c) + sc::sum(c * c);
  const std::vector<Tensor> g = t.gradient(loss, {x, c});
  CHECK(v(g[0]) == Vec{3, 4});
  CHECK(v(g[1]) == Vec{0, 0});
  // Frozen (non-trainable) variables are constants too; trainable ones are tracked.
  sc::Variable frozen(sc::tensor({3.0, 4.0}), "frozen", /*trainable=*/false);
  sc::Variable w(sc::tensor({1.0, 2.0}), "w");
  sc::GradientTape t2;
  const Tensor l2 = sc::sum(w * frozen) + sc::sum(frozen * frozen);
  const std::vector<Tensor> g2 = t2.gradient(l2, std::vector<sc::Variable>{w, frozen});
  CHECK(v(g2[0]) == Vec{3, 4});
  CHECK(v(g2[1]) == Vec{0, 0});
  // Watched, it gets the whole gradient: w + 2 * frozen.
  sc::GradientTape t3;
  t3.watch(frozen);
  const Tensor l3 = sc::sum(w * frozen) + sc::sum(frozen * frozen);
  CHECK(v(t3.gradient(l3, frozen)) == Vec{7, 10});
}

TEST_CASE("output_gradient seeds the backward pass (a vector-Jacobian product)", "[autodiff][tape]") {
  const Tensor x = sc::tensor({1.0, 2.0, 3.0});
  sc::GradientTape t(/*persistent=*/true);
  t.watch(x);
  const Tensor y = x * x;
  CHECK(v(t.gradient(y, x, sc::tensor({1.0, 0.0, -1.0}))) == Vec{2, 0, -6});
  CHECK(v(t.gradient(y, std::vector<Tensor>{x}, sc::tensor({1.f, 1.f, 1.f}))[0]) == Vec{2, 4, 6});  // cast to y's dtype
  const int line = __LINE__ + 1;
  CHECK_THROWS_WITH(t.gradient(y, x, sc::ones({2})), Catch::Contains("[gradient] output_gradient has shape [2], the target has shape [3]") &&
                                                          Catch::Contains(at_line(line)));
}

TEST_CASE("gradients exist only for floating targets and sources", "[autodiff][tape][errors]") {
  const Tensor x = sc::tensor({1.0, 2.0});
  const Tensor i = sc::tensor({std::int64_t{1}, std::int64_t{2}});
  sc::GradientTape t(/*persistent=*/true);
  t.watch(x);
  const Tensor counts = sc::argmax(x * 2.0, 0);
  int line = __LINE__ + 1;
  CHECK_THROWS_AS(t.gradient(counts, x), sc::DTypeError);
  CHECK_THROWS_WITH(t.gradient(counts, x), Catch::Contains("[gradient] the target has dtype i64") &&
                                               Catch::Contains(at_line(line + 1)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(t.gradient(x * 2.0, i), Catch::Contains("[gradient] a source has dtype i64") &&
                                                Catch::Contains(at_line(line)));
  CHECK_THROWS_AS(t.gradient(x, Tensor()), sc::ValueError);
  CHECK_THROWS_AS(t.watch(Tensor()), sc::ValueError);
}

TEST_CASE("stop_gradient and stop_recording cut the tape", "[autodiff][tape]") {
  const Tensor x = sc::tensor({1.0, 2.0, 3.0});
  sc::GradientTape t(/*persistent=*/true);
  t.watch(x);
  // x * stop_gradient(x): only the first factor is differentiated.
  const Tensor y = x * sc::stop_gradient(x);
  CHECK(v(y) == Vec{1, 4, 9});
  CHECK(v(t.gradient(y, x)) == Vec{1, 2, 3});
  CHECK(v(t.gradient(sc::stop_gradient(x * x), x)) == Vec{0, 0, 0});
  const std::size_t before = t.size();
  Tensor quiet;
  {
    auto guard = t.stop_recording();  // values as usual, nothing recorded on any tape
    quiet = sc::exp(x) * x;
    CHECK(t.size() == before);
  }
  CHECK(v(quiet)[0] == Approx(std::exp(1.0)));
  CHECK(v(t.gradient(quiet, x)) == Vec{0, 0, 0});
  const Tensor loud = x * 2.0;  // recording again after the guard
  CHECK(t.size() == before + 1);
  CHECK(v(t.gradient(loud, x)) == Vec{2, 2, 2});
}

TEST_CASE("custom_gradient replaces the rule, also at second order", "[autodiff][tape][custom]") {
  // Identity forward, clipped backward (gradient clipping).
  const auto clip = [](const Tensor& in) {
    return sc::custom_gradient([](const std::vector<Tensor>& xs) { return xs[0] * 1.0; },
                               [](const Tensor& g, const std::vector<Tensor>&, const Tensor&) {
                                 return std::vector<Tensor>{sc::minimum(sc::maximum(g, -1.0), 1.0)};
                               },
                               {in});
  };
  const Tensor x = sc::tensor({1.0, 2.0, 3.0});
  {
    sc::GradientTape t;
    t.watch(x);
    const Tensor y = clip(x);
    CHECK(v(y) == Vec{1, 2, 3});
    CHECK(v(t.gradient(y * sc::tensor({0.5, 5.0, -3.0}), x)) == Vec{0.5, 1, -1});
  }
  // exp with its rule written in terms of the result y: second order goes through y.
  const auto my_exp = [](const Tensor& in) {
    return sc::custom_gradient([](const std::vector<Tensor>& xs) { return sc::exp(xs[0]); },
                               [](const Tensor& g, const std::vector<Tensor>&, const Tensor& y) {
                                 return std::vector<Tensor>{g * y};
                               },
                               {in});
  };
  const Tensor s = sc::scalar(0.5);
  sc::GradientTape outer;
  outer.watch(s);
  Tensor d1;
  {
    sc::GradientTape inner;
    inner.watch(s);
    d1 = inner.gradient(my_exp(s * 2.0), s);  // 2 e^(2s)
  }
  CHECK(d1.item<double>() == Approx(2 * std::exp(1.0)));
  CHECK(outer.gradient(d1, s).item<double>() == Approx(4 * std::exp(1.0)));
  // Two inputs; the forward's own ops are not recorded.
  const Tensor a = sc::tensor({2.0}), b = sc::tensor({3.0});
  sc::GradientTape t2;
  t2.watch({a, b});
  const Tensor prod = sc::custom_gradient([](const std::vector<Tensor>& xs) { return xs[0] * xs[1]; },
                                          [](const Tensor& g, const std::vector<Tensor>& xs, const Tensor&) {
                                            return std::vector<Tensor>{g * xs[1] * 10.0, Tensor()};  // none for b
                                          },
                                          {a, b});
  CHECK(t2.size() == 1);
  const auto gs = t2.gradient(prod, {a, b});
  CHECK(v(gs[0]) == Vec{30});
  CHECK(v(gs[1]) == Vec{0});
}

TEST_CASE("a gradient rule returning the wrong count or shape is reported", "[autodiff][tape][errors]") {
  const Tensor x = sc::tensor({1.0, 2.0});
  auto rule = [](std::vector<Tensor> out) {
    return [out](const Tensor&, const std::vector<Tensor>&, const Tensor&) { return out; };
  };
  {
    sc::GradientTape t;
    t.watch(x);
    const int line = __LINE__ + 1;
    const Tensor y = sc::custom_gradient([](auto& xs) { return xs[0]; }, rule({x, x}), {x});
    CHECK_THROWS_WITH(t.gradient(y, x), Catch::Contains("[custom_gradient] gradient rule returned 2 gradients for 1 inputs") &&
                                            Catch::Contains(at_line(line)));
  }
  {
    sc::GradientTape t;
    t.watch(x);
    const Tensor y = sc::custom_gradient([](auto& xs) { return xs[0]; }, rule({x, x}), {x});
    CHECK_THROWS_AS(t.gradient(y, x), sc::ValueError);
  }
  {
    sc::GradientTape t;
    t.watch(x);
    const Tensor y = sc::custom_gradient([](auto& xs) { return xs[0]; }, rule({sc::ones({3}, sc::f64)}), {x});
    CHECK_THROWS_AS(t.gradient(y, x), sc::ShapeError);
  }
  sc::GradientTape t;
  t.watch(x);
  const Tensor y = sc::custom_gradient([](auto& xs) { return xs[0]; }, rule({sc::ones({3}, sc::f64)}), {x});
  CHECK_THROWS_WITH(t.gradient(y, x), Catch::Contains("[custom_gradient] gradient rule returned shape [3] for an input of shape [2]"));
}

TEST_CASE("custom_gradient: a trainable variable its forward pass reads must be one of its inputs", "[autodiff][tape][custom]") {
  sc::Variable w(sc::tensor({2.0, 3.0}), "w");
  const Tensor x = sc::tensor({1.0, 1.0});
  auto pass_on = [](const Tensor& g, const std::vector<Tensor>&, const Tensor&) { return std::vector<Tensor>{g}; };
  auto scale = [&w](const std::vector<Tensor>& xs) { return xs[0] * w; };
  {  // Read by the forward pass only: the tape would give w no gradient, so the call raises.
    sc::GradientTape t;
    t.watch(x);
    const int line = __LINE__ + 1;
    CHECK_THROWS_WITH(sc::custom_gradient(scale, pass_on, {x}),
                      Catch::Contains("[custom_gradient] the forward function read trainable variable 'w', which is not "
                                      "one of the inputs") && Catch::Contains(at_line(line)));
    CHECK_THROWS_AS(sc::custom_gradient(scale, pass_on, {x}), sc::ValueError);
  }
  {  // Passed in: the rule's gradient reaches it.
    sc::GradientTape t;
    const Tensor y = sc::custom_gradient(
        [](const std::vector<Tensor>& xs) { return xs[0] * xs[1]; },
        [](const Tensor& g, const std::vector<Tensor>& xs, const Tensor&) { return std::vector<Tensor>{g * xs[1], g * xs[0] * 10.0}; },
        {x, w.value()});
    CHECK(t.gradient(sc::sum(y), std::vector<sc::Variable>{w})[0].to_vector<double>() == Vec{10, 10});
  }
  // No tape recording, a read the user paused, a variable that is not trainable: nothing to lose.
  CHECK(sc::custom_gradient(scale, pass_on, {x}).to_vector<double>() == Vec{2, 3});
  sc::GradientTape t;
  t.watch(x);
  {
    sc::GradientTape::StopRecording paused;
    CHECK_NOTHROW(sc::custom_gradient(scale, pass_on, {x}));
  }
  CHECK_NOTHROW(sc::custom_gradient(
      [&w](const std::vector<Tensor>& xs) {
        sc::GradientTape::StopRecording constant;
        return xs[0] * w;
      },
      pass_on, {x}));
  sc::Variable c(sc::tensor({2.0, 3.0}), "c", /*trainable=*/false);
  const Tensor y = sc::custom_gradient([&c](const std::vector<Tensor>& xs) { return xs[0] * c; }, pass_on, {x});
  CHECK(t.gradient(sc::sum(y), x).to_vector<double>() == Vec{1, 1});
}

TEST_CASE("jacobian and hvp against hand-computed derivatives", "[autodiff][tape]") {
  // f(x) = x * sum(x): J_ij = delta_ij * S + x_i.
  const Tensor x = sc::tensor({1.0, 2.0, 4.0});
  const Tensor j = sc::jacobian([](const Tensor& z) { return z * sc::sum(z); }, x);
  CHECK(j.shape() == sc::Shape{3, 3});
  CHECK(v(j) == Vec{8, 1, 1, 2, 9, 2, 4, 4, 11});
  // A [2,2] result of a [2] input: shape y + x.
  const Tensor j2 = sc::jacobian([](const Tensor& z) { return sc::where(sc::tensor({{true, false}, {false, true}}), z * z, z); },
                                 sc::tensor({3.0, 5.0}));
  CHECK(j2.shape() == sc::Shape{2, 2, 2});
  CHECK(v(j2) == Vec{6, 0, 0, 1, 1, 0, 0, 10});
  // f(x) = sum(x^3) + sum(x)^2: H = diag(6x) + 2, so Hv = 6 x v + 2 sum(v).
  const Tensor vv = sc::tensor({1.0, -1.0, 0.5});
  const Tensor hv = sc::hvp([](const Tensor& z) { const Tensor s = sc::sum(z); return sc::sum(z * z * z) + s * s; }, x, vv);
  CHECK(v(hv) == Vec{6 + 1, -12 + 1, 12 + 1});
  // hvp built from jacobian: the Jacobian of the gradient is the Hessian (diag(6x) + 2).
  const Tensor h = sc::jacobian([](const Tensor& z) {
    sc::GradientTape inner;
    inner.watch(z);
    const Tensor s = sc::sum(z);
    return inner.gradient(sc::sum(z * z * z) + s * s, z);
  }, x);
  CHECK(v(h) == Vec{8, 2, 2, 2, 14, 2, 2, 2, 26});
  // jacobian under an outer tape is differentiable once the layout ops it assembles with
  // (reshape, concat) have gradient rules: d/dx sum(J(x^3)) = d/dx sum(3x^2) = 6x.
  if constexpr (sc::ops::HasVjp<sc::ops::Reshape> && sc::ops::HasVjp<sc::ops::Concat>) {
    sc::GradientTape outer;
    outer.watch(x);
    const Tensor jj = sc::jacobian([](const Tensor& z) { return z * z * z; }, x);
    CHECK(v(outer.gradient(jj, x)) == Vec{6, 12, 24});
  }
  const int line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::hvp([](const Tensor& z) { return sc::sum(z); }, x, sc::ones({2}, sc::f64)),
                    Catch::Contains("[hvp] v has shape [2], x has shape [3]") && Catch::Contains(at_line(line)));
}

TEST_CASE("trainable variables are watched automatically", "[autodiff][tape][variable]") {
  sc::Variable w(sc::tensor({1.0, 2.0}), "w");
  sc::Variable b(sc::scalar(0.5), "b");
  sc::Variable frozen(sc::tensor({3.0, 3.0}), "frozen", /*trainable=*/false);
  const Tensor x = sc::tensor({10.0, 20.0});
  sc::GradientTape t(/*persistent=*/true);
  const Tensor loss = sc::sum(w * x * frozen + b);  // no watch() call
  const std::vector<Tensor> gs = t.gradient(loss, std::vector<sc::Variable>{w, b, frozen});
  REQUIRE(gs.size() == 3);
  CHECK(v(gs[0]) == Vec{30, 60});
  CHECK(v(gs[1]) == Vec{2});
  // Not trainable, so not watched: a constant to the tape (as in TensorFlow), although it is
  // an input of an op recorded for w; ops on it alone were never recorded, so following it
  // would give part of a gradient.
  CHECK(v(gs[2]) == Vec{0, 0});
  CHECK(v(t.gradient(loss, w)) == Vec{30, 60});
  // Used only with unwatched tensors, its ops are not recorded: no gradient.
  const std::size_t before = t.size();
  const Tensor alone = sc::sum(frozen * x);
  CHECK(t.size() == before);
  CHECK(v(t.gradient(alone, std::vector<sc::Variable>{frozen, w})[0]) == Vec{0, 0});
}

TEST_CASE("a variable's value outliving it, or replaced, is a plain tensor", "[autodiff][tape][variable]") {
  Tensor kept, old;
  {
    sc::Variable w(sc::tensor({1.0, 2.0}), "w");
    old = w.value();
    w.assign(sc::tensor({3.0, 4.0}));
    kept = w.value();
  }
  sc::GradientTape t;  // neither is watched now (the variable is gone; it must not be read)
  const Tensor y = kept * old;
  CHECK(t.size() == 0);
  CHECK(v(y) == Vec{3, 8});
}

TEST_CASE("variable assignments are not recorded, a wrong shape is a ShapeError", "[autodiff][tape][variable]") {
  sc::Variable w(sc::tensor({1.0, 2.0}), "w");
  sc::GradientTape t(/*persistent=*/true);
  const Tensor y = w * 3.0;
  const std::size_t recorded = t.size();
  CHECK(recorded == 1);
  w.assign(sc::tensor({5.f, 6.f}));  // converted to the variable's dtype
  CHECK(w.dtype() == sc::f64);
  w.assign_add(sc::tensor({1.0, 1.0}));
  w.assign_sub(sc::tensor({0.5, 0.5}));
  CHECK(v(w.value()) == Vec{5.5, 6.5});
  CHECK(t.size() == recorded);
  // The gradient is with respect to the current value, which y does not use.
  CHECK(v(t.gradient(y, std::vector<sc::Variable>{w})[0]) == Vec{0, 0});
  CHECK(v(t.gradient(w * w, w)) == Vec{11, 13});
  int line = __LINE__ + 1;
  CHECK_THROWS_WITH(w.assign(sc::ones({3}, sc::f64)), Catch::Contains("[Variable::assign] variable 'w' has shape [2], the value has shape [3]") &&
                                                          Catch::Contains(at_line(line)));
  CHECK_THROWS_AS(w.assign_add(sc::ones({2, 1}, sc::f64)), sc::ShapeError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(w.assign_sub(sc::ones({1}, sc::f64)), Catch::Contains("[Variable::assign_sub]") && Catch::Contains(at_line(line)));
  CHECK(v(w.value()) == Vec{5.5, 6.5});  // unchanged by the failed calls
}

TEST_CASE("a non-persistent tape lets go of its tensors after gradient()", "[autodiff][tape][memory]") {
  const Tensor x = sc::tensor({1.0, 2.0});
  const long base = x.use_count();
  {
    sc::GradientTape t;
    t.watch(x);
    Tensor y = sc::exp(x * x);
    CHECK(x.use_count() > base);  // held by the tape
    const Tensor g = t.gradient(y, x);
    CHECK(x.use_count() == base);  // released by gradient()
    CHECK(t.size() == 0);
    // A used non-persistent tape records nothing more (it could never use it).
    y = y * x;
    CHECK(t.size() == 0);
    CHECK(x.use_count() == base);
  }
  {
    sc::GradientTape t(/*persistent=*/true);
    t.watch(x);
    const Tensor g = t.gradient(x * x, x);
    CHECK(x.use_count() > base);  // a persistent tape keeps its record until reset or destroyed
    t.reset();
    CHECK(x.use_count() == base);
  }
  CHECK(x.use_count() == base);
}

TEST_CASE("ops record only while a tape watches their inputs", "[autodiff][tape]") {
  const Tensor x = sc::tensor({1.0, 2.0});
  (void)(x * x);  // no tape at all: nothing to record into
  CHECK(sc::detail::context().tapes == nullptr);
  {
    sc::GradientTape t;
    CHECK(sc::detail::context().tapes != nullptr);
    const Tensor y = sc::exp(x) + x;  // x not watched
    CHECK(t.size() == 0);
    t.watch(x);
    const Tensor z = sc::exp(x) + y;  // exp records, add records (one input watched)
    CHECK(t.size() == 2);
    sc::GradientTape inner;  // a nested tape watches nothing: records nothing
    const Tensor w = z * 2.0;
    CHECK(inner.size() == 0);
    CHECK(t.size() == 3);
  }
  CHECK(sc::detail::context().tapes == nullptr);
  // A tape created while recording is stopped records nothing either.
  sc::GradientTape outer;
  {
    auto guard = outer.stop_recording();
    sc::GradientTape t;
    t.watch(x);
    (void)sc::exp(x);
    CHECK(t.size() == 0);
  }
}

TEST_CASE("assign_add and assign_sub keep the variable's dtype", "[state][variable]") {
  sc::Variable w(sc::zeros({2}), "w");
  w.assign_add(sc::ones({2}, sc::f64));
  w.assign_sub(sc::full({2}, 0.25, sc::f64));
  CHECK(w.dtype() == sc::f32);
  CHECK(w.value().to_vector<float>() == std::vector<float>{0.75f, 0.75f});
}

TEST_CASE("gradient rules skip the gradients of inputs that lead to no source", "[autodiff][tape][wanted]") {
  // Rule level: each selective rule leaves the unwanted gradient undefined and computes the
  // wanted one exactly as before.
  const Tensor a = sc::random::normal({3, 4}, 7), b = sc::random::normal({4, 5}, 8);
  const Tensor y = sc::matmul(a, b);
  const Tensor g = sc::random::normal({3, 5}, 9);
  const std::array<Tensor, 2> in{a, b};
  const auto all = sc::ops::MatMul::vjp(g, in, y, {});
  const auto only_b = sc::ops::MatMul::vjp(g, in, y, {}, sc::ops::Wanted::only(1));
  const auto only_a = sc::ops::MatMul::vjp(g, in, y, {}, sc::ops::Wanted::only(0));
  REQUIRE(all[0].defined());
  REQUIRE(all[1].defined());
  CHECK_FALSE(only_b[0].defined());
  CHECK_FALSE(only_a[1].defined());
  CHECK(v(only_b[1]) == v(all[1]));
  CHECK(v(only_a[0]) == v(all[0]));
  const auto mul_b = sc::ops::Mul::vjp(g, std::array<Tensor, 2>{g, g}, g * g, {}, sc::ops::Wanted::only(1));
  CHECK_FALSE(mul_b[0].defined());
  CHECK(v(mul_b[1]) == v(g * g));
  const Tensor c = g > 0;
  const auto where_a = sc::ops::Where::vjp(g, std::array<Tensor, 3>{c, g, g}, g, {}, sc::ops::Wanted::only(1));
  CHECK_FALSE(where_a[2].defined());
  CHECK(v(where_a[1]) == v(sc::where(c, g, 0)));

  // Tape level: an outer tape records the ops the inner gradient() runs. Asked for w alone, the
  // inner tape does not compute dx = G w^T (x leads to no source), so the outer tape sees one
  // op fewer than when x's gradient is asked too, and the gradient of w is the same.
  const Tensor x = sc::random::normal({2, 3}, 10);
  const Tensor w = sc::random::normal({3, 4}, 11);
  auto run = [&](bool want_x) {
    sc::GradientTape outer(/*persistent=*/true);
    outer.watch(w);
    Tensor gw;
    {
      sc::GradientTape inner;
      inner.watch(w);
      inner.watch(x);
      const Tensor loss = sc::sum(sc::square(sc::matmul(x, w)));
      gw = want_x ? inner.gradient(loss, std::vector<Tensor>{w, x})[0] : inner.gradient(loss, w);
    }
    return std::pair{outer.size(), v(gw)};
  };
  const auto [n_skip, gw_skip] = run(false);
  const auto [n_all, gw_all] = run(true);
  CHECK(n_skip + 1 == n_all);
  CHECK(gw_skip == gw_all);
}

TEMPLATE_TEST_CASE("a value used many times: its gradient's contributions added in the backward sweep's order",
                   "[autodiff][tape]", float, double) {
  // loss = sum(w * c_0) + ... + sum(w * c_99): w's gradient is c_99 + c_98 + ... + c_0, added in
  // the order the backward sweep reaches them (the last use first; on a GPU by add_n, 32 at a
  // time, with the same bits: test_cuda_eager_batch). A plain loop is the reference.
  const sc::DType d = std::is_same_v<TestType, float> ? sc::f32 : sc::f64;
  constexpr int uses = 100;
  const sc::Tensor w0 = sc::random::uniform({5, 7}, -1.0, 1.0, 1, d);
  std::vector<sc::Tensor> c;
  for (int k = 0; k < uses; ++k) c.push_back(sc::random::uniform({5, 7}, -1.0, 1.0, 100 + k, d));
  const auto grad = [&](const sc::Tensor& w) {
    sc::GradientTape tape;
    tape.watch(w);
    sc::Tensor loss = sc::sum(w * c[0]);
    for (int k = 1; k < uses; ++k) loss = loss + sc::sum(w * c[k]);
    return tape.gradient(loss, w);
  };
  const sc::Tensor got = grad(w0);
  std::vector<TestType> want = c[uses - 1].to_vector<TestType>();
  for (int k = uses - 2; k >= 0; --k) {
    const std::vector<TestType> ck = c[k].to_vector<TestType>();
    for (std::size_t i = 0; i < want.size(); ++i) want[i] = want[i] + ck[i];
  }
  CHECK(got.to_vector<TestType>() == want);
  // Traced, the backward pass keeps its chain of adds (fused with their neighbours): same values.
  auto traced = sc::function([&](const sc::Tensor& w) { return grad(w); });
  const sc::Tensor staged_grad = traced(w0);
  const std::vector<double> staged = staged_grad.to_vector<double>();
  const std::vector<double> eager = got.to_vector<double>();
  REQUIRE(staged.size() == eager.size());
  for (std::size_t i = 0; i < eager.size(); ++i) CHECK(staged[i] == Approx(eager[i]).epsilon(1e-6));
}

TEST_CASE("add_n: one shape, numeric dtypes, a list of at least one tensor", "[autodiff][ops]") {
  const sc::Tensor a = sc::ones({2, 3}), b = sc::ones({3});
  CHECK_THROWS_AS(sc::add_n({}), sc::ValueError);
  CHECK_THROWS_WITH(sc::add_n({}), Catch::Contains("[add_n] needs at least one tensor"));
  const int line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::add_n({a, a, b}), Catch::Contains("[add_n] all tensors must have the same shape, got [2, 3] "
                                                          "(tensor 0) and [3] (tensor 2)") &&
                                              Catch::Contains(at_line(line)));
  CHECK_THROWS_AS(sc::add_n({a, b}), sc::ShapeError);
  const sc::Tensor m = a > 0.5f;
  CHECK_THROWS_AS(sc::add_n({m, m}), sc::DTypeError);
  CHECK_THROWS_WITH(sc::add_n({m, m}), Catch::Contains("[add_n] expects numeric dtypes, got bool"));
  // its gradient: the output's gradient to every input
  const sc::Tensor x = sc::scalar(2.0), y = sc::scalar(5.0);
  sc::GradientTape tape;
  tape.watch(x);
  tape.watch(y);
  const auto g = tape.gradient(sc::add_n({x, y, x}) * 3.0, std::vector<sc::Tensor>{x, y});
  CHECK(g[0].item<double>() == 6.0);
  CHECK(g[1].item<double>() == 3.0);
}

TEST_CASE("a sum's gradient reaches elementwise rules unbroadcast, every source whole", "[autodiff][tape][memory]") {
  // x [4, 3]: sum over everything, over rows, over columns (kept and not), into mul, add, sub,
  // div, and into rules that need the full shape (exp, reshape); the reference is by hand.
  const Tensor x = sc::tensor(Vec{0.5, -1, 2, 1.5, 0.25, -2, 3, 1, -0.5, 2, -1.5, 0.75}, {4, 3});
  const Tensor r = sc::tensor(Vec{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {4, 3});
  auto grad = [&](auto loss) {
    sc::GradientTape t;
    t.watch(x);
    return t.gradient(loss(x), x);
  };
  auto check = [](const Tensor& g, const Vec& want) {
    REQUIRE(g.shape() == sc::Shape{4, 3});
    CHECK(v(g) == want);
  };
  const Vec rv = v(r);
  Vec ones(12, 1.0), twos(12, 2.0), exps, inv;
  for (double e : v(x)) exps.push_back(std::exp(e));
  for (double e : rv) inv.push_back(1.0 / e);
  check(grad([&](const Tensor& a) { return sc::sum(a * r); }), rv);
  check(grad([&](const Tensor& a) { return sc::sum(a); }), ones);  // the source itself
  check(grad([&](const Tensor& a) { return sc::sum(a / r); }), inv);
  check(grad([&](const Tensor& a) { return sc::sum(sc::sum(a + a, {0})); }), twos);
  check(grad([&](const Tensor& a) { return sc::sum(sc::sum(a - r, {1}, true) * 2.0); }), twos);
  const Vec ge = v(grad([&](const Tensor& a) { return sc::sum(sc::exp(a)); }));  // exp: to an ulp
  REQUIRE(ge.size() == exps.size());
  for (std::size_t i = 0; i < ge.size(); ++i) CHECK(ge[i] == Approx(exps[i]).epsilon(1e-15));
  check(grad([&](const Tensor& a) { return sc::sum(sc::reshape(a, {12})); }), ones);
  // Contributions of both kinds added: sum(x) (unbroadcast) + sum(x * r) (whole).
  Vec both;
  for (double e : rv) both.push_back(1 + e);
  check(grad([&](const Tensor& a) { return sc::sum(a) + sc::sum(a * r); }), both);
  // Into an input the op broadcast: its gradient is the sum over the broadcast axes, 4 rows
  // here (the unbroadcast value counted once per row, not once).
  {
    const Tensor row = sc::tensor(Vec{1, 2, 3}, {1, 3}), col = sc::tensor(Vec{1, 2, 3, 4}, {4, 1});
    sc::GradientTape t(/*persistent=*/true);
    t.watch(row);
    t.watch(col);
    CHECK(v(t.gradient(sc::sum(row + x), row)) == Vec{4, 4, 4});
    CHECK(v(t.gradient(sc::sum(x - col), col)) == Vec{-3, -3, -3, -3});
    CHECK(v(t.gradient(sc::sum(row * r), row)) == Vec{22, 26, 30});
    CHECK(v(t.gradient(sc::sum(sc::sum(x * col, {1}, true) * 3.0), col)) == Vec{4.5, -0.75, 10.5, 3.75});
    CHECK(t.gradient(row + x, row).shape() == sc::Shape{1, 3});  // a non-scalar target
    CHECK(v(t.gradient(row + x, row)) == Vec{4, 4, 4});
  }
  // A non-scalar target's seed of ones, into mul and straight to the source.
  {
    sc::GradientTape t(/*persistent=*/true);
    t.watch(x);
    const Tensor y = x * r;
    check(t.gradient(y, x), rv);
    check(t.gradient(x, x), ones);
  }
  // Second order through the unbroadcast gradient: d/dx sum(d/dx sum(x^2 * r)) = 2r.
  {
    sc::GradientTape outer;
    outer.watch(x);
    sc::GradientTape inner;
    inner.watch(x);
    const Tensor g = inner.gradient(sc::sum(x * x * r), x);
    Vec two_r;
    for (double e : rv) two_r.push_back(2 * e);
    check(outer.gradient(sc::sum(g), x), two_r);
  }

  // No tensor of copies of the sum's gradient: the backward of sum(x * r) allocates only x's
  // gradient (the broadcast of the ones was a second one, 4 MB here).
  const Tensor big = sc::random::normal({1024, 1024}, 3), rb = sc::random::normal({1024, 1024}, 4);
  sc::GradientTape t;
  t.watch(big);
  const Tensor loss = sc::sum(big * rb);
  sc::reset_peak_memory();
  const std::int64_t before = static_cast<std::int64_t>(sc::memory_stats().bytes_in_use);
  const Tensor g = t.gradient(loss, big);
  const std::int64_t above = static_cast<std::int64_t>(sc::memory_stats().peak_bytes_in_use) - before;
  CHECK(above <= static_cast<std::int64_t>(g.nbytes()) + 4096);
  CHECK(v(g) == v(rb));
}

TEST_CASE("sub's second input, broadcast by the op: its gradient is summed down, then negated",
          "[autodiff][tape][memory]") {
  const Tensor x = sc::random::normal({1024, 1024}, 5), r = sc::random::normal({1024, 1024}, 6);
  const Tensor col = sc::random::normal({1024, 1}, 7), row = sc::random::normal({1024}, 8);
  // the bits of -(the sum of r over the broadcast axes): negation commutes with the sum's rounding
  {
    sc::GradientTape t(/*persistent=*/true);
    t.watch(col);
    t.watch(row);
    t.watch(x);
    const Tensor loss = sc::sum((x - col) * r);
    CHECK(v(t.gradient(loss, col)) == v(sc::neg(sc::sum(r, {1}, true))));
    CHECK(v(t.gradient(sc::sum((x - row) * r), row)) == v(sc::neg(sc::sum(r, {0}))));
    CHECK(v(t.gradient(sc::sum((x - x * 2.f) * r), x)) == v(sc::neg(r)));  // not broadcast: -g
    CHECK(v(t.gradient(loss, x)) == v(r));
  }
  // no full-size negation: the backward allocates the product's gradient (4 MB) and col's, not a
  // negated copy of it (4 MB more)
  {
    sc::GradientTape t;
    t.watch(col);
    const Tensor loss = sc::sum((x - col) * r);
    sc::reset_peak_memory();
    const std::int64_t before = static_cast<std::int64_t>(sc::memory_stats().bytes_in_use);
    const Tensor g = t.gradient(loss, col);
    const std::int64_t above = static_cast<std::int64_t>(sc::memory_stats().peak_bytes_in_use) - before;
    CHECK(above <= static_cast<std::int64_t>(x.nbytes()) + 65536);
  }
  // traced: the gradient's graph negates [64, 1], not [64, 33]; second order still flows
  const Tensor xs = sc::random::normal({64, 33}, 9), rs = sc::random::normal({64, 33}, 10);
  const Tensor cs = sc::random::normal({64, 1}, 11);
  auto f = sc::function([](const Tensor& a, const Tensor& c, const Tensor& q) {
    sc::GradientTape t;
    t.watch(c);
    return t.gradient(sc::sum((a - c) * q), c);
  });
  CHECK(v(f(xs, cs, rs)) == v(sc::neg(sc::sum(rs, {1}, true))));
  const sc::graph::Graph& gr = f.get_concrete(xs, cs, rs).graph();
  int negs = 0;
  for (const sc::graph::Node& n : gr.nodes)
    if (n.kind == sc::graph::NodeKind::op && n.op == sc::ops::OpId::Neg) {
      ++negs;
      CHECK(gr.values[n.outputs[0]].shape == sc::Shape{64, 1});
    }
  CHECK(negs == 1);
  sc::GradientTape outer;
  outer.watch(cs);
  sc::GradientTape inner;
  inner.watch(cs);
  const Tensor gc = inner.gradient(sc::sum((xs - cs) * (xs - cs)), cs);  // -2 (x - c) summed over rows
  CHECK(v(outer.gradient(sc::sum(gc), cs)) == Vec(64, 2.0 * 33));
}
