// Rematerialization in the fusion pass (graph::rematerialize()): a group with a reduction leaves
// a cheap value to the later groups that read it, which compute it again from its inputs instead
// of reading it back (layer_norm's centred values are never stored); the same bits as without
// it, and every case it must leave alone.
#include <catch2/catch.hpp>

#include <bit>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <stagecraft/stagecraft.hpp>

#include "function_testing.hpp"
#include "passes_testing.hpp"
#include "testing.hpp"

namespace {

using sctest::function::check_same;
using sctest::function::same_bits;

/// f traced (a fresh sc::function) with rematerialization on or off: its plan listing and results.
template <class F, class... A>
auto traced(bool on, const F& f, const A&... args) {
  return sctest::function::traced_with(sc::graph::rematerialize(), on, f, args...);
}

}  // namespace

TEMPLATE_TEST_CASE("fusion: layer_norm's variance group leaves x - mean to the normalisation, which computes it again",
                   "[function][fusion][remat]", float, double) {
  using T = TestType;
  const sc::DType d = sc::dtype_of<T>();
  const sc::Tensor x = (sc::random::normal({64, 300}, 4) * 3.f + 1.f).astype(d);
  const sc::Tensor gamma = sc::random::uniform({300}, 0.5, 1.5, 5, d), beta = sc::random::uniform({300}, -1.0, 1.0, 6, d);
  const auto ln = [](const sc::Tensor& a, const sc::Tensor& g, const sc::Tensor& b) {
    return sc::nn::layer_norm(a, {300}, g, b);
  };
  const auto [on_plan, on] = traced(true, ln, x, gamma, beta);
  const auto [off_plan, off] = traced(false, ln, x, gamma, beta);
  INFO(on_plan);
  INFO(off_plan);
  const std::string t = std::string(sc::name(d));
  // on: the variance's group writes only its sum; the last group computes x - mean itself
  CHECK_THAT(on_plan, Catch::Contains("fused sub, square, sum -> " + t + "[64, 1]\n"));
  CHECK_THAT(on_plan, Catch::Contains("fused sub (again), mul, mul, add -> " + t + "[64, 300]\n"));
  // off: the centred values are written and read back
  CHECK_THAT(off_plan, Catch::Contains("fused sub, square, sum -> " + t + "[64, 300], " + t + "[64, 1]\n"));
  CHECK_THAT(off_plan, !Catch::Contains("(again)"));
  CHECK(same_bits<T>(on[0], off[0]));
  check_same(on[0], ln(x, gamma, beta), std::is_same_v<T, float> ? 1e-5 : 1e-12);
}

TEMPLATE_TEST_CASE("fusion: a lone op reading a value left by a reduction's group becomes a group that computes it again",
                   "[function][fusion][remat]", float, double) {
  using T = TestType;
  const sc::DType d = sc::dtype_of<T>();
  const sc::Tensor x = (sc::random::normal({48, 260}, 13) * 2.f - 1.f).astype(d);
  // layer_norm without gamma and beta: its normalisation is one mul, of x - mean by 1 / deviation
  const auto ln = [](const sc::Tensor& a) { return sc::nn::layer_norm(a, {260}); };
  const auto [on_plan, on] = traced(true, ln, x);
  const auto [off_plan, off] = traced(false, ln, x);
  INFO(on_plan);
  INFO(off_plan);
  const std::string t = std::string(sc::name(d));
  CHECK_THAT(on_plan, Catch::Contains("fused sub, square, sum -> " + t + "[48, 1]\n"));
  CHECK_THAT(on_plan, Catch::Contains("fused sub (again), mul -> " + t + "[48, 260]\n"));
  CHECK_THAT(off_plan, Catch::Contains("kernel mul -> " + t + "[48, 260]\n"));
  CHECK(same_bits<T>(on[0], off[0]));
  check_same(on[0], ln(x), std::is_same_v<T, float> ? 1e-5 : 1e-12);
  // two lone readers (siblings: one group) compute it again once
  const auto two = [](const sc::Tensor& a) {
    const sc::Tensor c = a - sc::sum(a, {-1}, true) / 260.f;
    const sc::Tensor s = sc::sum(c * c, {-1}, true) + 1.f;
    return std::make_tuple(c / s, c * s);
  };
  const auto [two_plan, two_on] = traced(true, two, x);
  INFO(two_plan);
  CHECK_THAT(two_plan, Catch::Contains("fused sub, mul, sum -> " + t + "[48, 1]\n"));
  CHECK_THAT(two_plan, Catch::Contains("fused sub (again), mul, div -> " + t + "[48, 260], " + t + "[48, 260]\n"));
  const auto [c0, c1] = two(x);
  check_same(two_on[0], c0, std::is_same_v<T, float> ? 1e-5 : 1e-12);
  check_same(two_on[1], c1, std::is_same_v<T, float> ? 1e-4 : 1e-10);
}

TEST_CASE("fusion: the gradient of a traced layer_norm has the same bits with and without rematerialization",
          "[function][fusion][remat]") {
  const sc::Tensor x = sc::random::normal({32, 257}, 7), w = sc::random::normal({32, 257}, 8);
  const sc::Tensor gamma = sc::random::uniform({257}, 0.5, 1.5, 9), beta = sc::random::uniform({257}, -1.0, 1.0, 10);
  const auto step = sctest::function::layer_norm_step(257);
  const auto [on_plan, on] = traced(true, step, x, w, gamma, beta);
  const auto [off_plan, off] = traced(false, step, x, w, gamma, beta);
  INFO(on_plan);
  CHECK_THAT(on_plan, Catch::Contains("(again)"));
  REQUIRE(on.size() == 4);
  for (std::size_t k = 0; k < on.size(); ++k) {
    INFO("output " << k);
    CHECK(same_bits<float>(on[k], off[k]));
  }
  const auto [l, gx, gg, gb] = step(x, w, gamma, beta);  // eager
  check_same(on[0], l, 1e-4);
  check_same(on[1], gx, 1e-5);
  check_same(on[2], gg, 1e-4);
  check_same(on[3], gb, 1e-4);
}

TEST_CASE("fusion: values that are results, costly to compute, or made of two large inputs are not computed twice",
          "[function][fusion][remat]") {
  const sc::Tensor x = sc::random::normal({64, 300}, 11), y = sc::random::normal({64, 300}, 12);
  const auto mean_of = [](const sc::Tensor& a) { return sc::sum(a, {-1}, true) / 300.f; };
  // a result of the function: written once anyway
  const auto result = [&](const sc::Tensor& a) {
    const sc::Tensor c = a - mean_of(a);
    return std::make_tuple(c, c / sc::sqrt(sc::sum(c * c, {-1}, true) + 1.f));
  };
  // softmax: exp is not recomputed (a transcendental costs more than reading its value back)
  const auto softmax = [](const sc::Tensor& a) {
    const sc::Tensor e = sc::exp(a - sc::max(a, {-1}, true));
    return e / sc::sum(e, {-1}, true);
  };
  // x - y: recomputing it would read two large tensors where one is read now
  const auto two = [](const sc::Tensor& a, const sc::Tensor& b) {
    const sc::Tensor c = a - b;
    return c / sc::sqrt(sc::sum(c * c, {-1}, true) + 1.f);
  };
  {
    const auto [plan, outs] = traced(true, result, x);
    INFO(plan);
    CHECK_THAT(plan, !Catch::Contains("(again)"));
    const auto [c, n] = result(x);
    check_same(outs[0], c, 1e-6);
    check_same(outs[1], n, 1e-5);
  }
  {
    const auto [plan, outs] = traced(true, softmax, x);
    INFO(plan);
    CHECK_THAT(plan, !Catch::Contains("(again)"));
    check_same(outs[0], softmax(x), 1e-6);
  }
  {
    const auto [plan, outs] = traced(true, two, x, y);
    INFO(plan);
    CHECK_THAT(plan, !Catch::Contains("(again)"));
    check_same(outs[0], two(x, y), 1e-5);
  }
}

TEMPLATE_TEST_CASE("fusion: gamma's gradient computes the normalised values again from x, two ops deep",
                   "[function][fusion][remat]", float, double) {
  using T = TestType;
  const sc::DType d = sc::dtype_of<T>();
  const std::int64_t rows = 96, cols = 130;
  const sc::Tensor x = (sc::random::normal({rows, cols}, 21) * 2.f + 0.5f).astype(d);
  const sc::Tensor r = sc::random::uniform({rows, cols}, -1.0, 1.0, 22, d);
  const sc::Tensor gamma = sc::random::uniform({cols}, 0.5, 1.5, 23, d);
  const sc::Tensor beta = sc::random::uniform({cols}, -1.0, 1.0, 24, d);
  const auto step = sctest::function::layer_norm_step(cols);
  const auto [on_plan, on] = traced(true, step, x, r, gamma, beta);
  const auto [off_plan, off] = traced(false, step, x, r, gamma, beta);
  INFO(on_plan);
  const std::string t = std::string(sc::name(d));
  // xhat = (x - mean) * rstd: the loss's group writes only the loss; gamma's gradient makes xhat
  // again from x (sub, then mul) instead of reading it back
  CHECK_THAT(on_plan, Catch::Contains("fused sub (again), mul, mul, add, mul, sum -> " + t + "[]\n"));
  CHECK_THAT(on_plan, Catch::Contains("sub (again), mul (again), mul, sum -> " + t + "[130]\n"));
  CHECK_THAT(off_plan, !Catch::Contains("(again)"));
  REQUIRE(on.size() == 4);
  for (std::size_t k = 0; k < on.size(); ++k) {
    INFO("output " << k);
    CHECK(same_bits<T>(on[k], off[k]));
  }
  const auto [l, gx, gg, gb] = step(x, r, gamma, beta);  // eager
  const double tol = std::is_same_v<T, float> ? 1e-4 : 1e-10;
  check_same(on[0], l, tol);
  check_same(on[1], gx, tol);
  check_same(on[2], gg, tol);
  check_same(on[3], gb, tol);
}

TEST_CASE("fusion: values computed again stop at three ops and at one large input in all",
          "[function][fusion][remat]") {
  const sc::Tensor x = sc::random::normal({64, 200}, 31), y = sc::random::normal({64, 200}, 32);
  const auto inv = [](const sc::Tensor& v) { return 1.f / (sc::sum(v * v, {-1}, true) + 1.f); };
  // c = x - mean, then three more steps, each a reduction's group reading the last value: c, d
  // and e are computed again (1, 2, 3 ops), f (4 ops) is written by its group
  const auto deep = [&](const sc::Tensor& a) {
    const sc::Tensor c = a - sc::sum(a, {-1}, true) / 200.f;
    const sc::Tensor d = c * inv(c);
    const sc::Tensor e = d * inv(d);
    const sc::Tensor f = e * inv(e);
    return f * inv(f);
  };
  // d = c * y reads a second large tensor: c is computed again, d is not
  const auto two = [&](const sc::Tensor& a, const sc::Tensor& b) {
    const sc::Tensor c = a - sc::sum(a, {-1}, true) / 200.f;
    const sc::Tensor d = c * b * inv(c);
    return d * inv(d);
  };
  {
    const auto [plan, on] = traced(true, deep, x);
    const auto [plan_off, off] = traced(false, deep, x);
    INFO(plan);
    CHECK_THAT(plan,
               Catch::Contains("sub (again), mul (again), mul (again), mul, mul, sum -> f32[64, 200], f32[64, 1]\n"));
    CHECK_THAT(plan, !Catch::Contains("mul (again), mul (again), mul (again)"));
    CHECK(same_bits<float>(on[0], off[0]));
    check_same(on[0], deep(x), 1e-5);
  }
  {
    const auto [plan, on] = traced(true, two, x, y);
    const auto [plan_off, off] = traced(false, two, x, y);
    INFO(plan);
    CHECK_THAT(plan, Catch::Contains("sub (again)"));
    CHECK_THAT(plan, !Catch::Contains("mul (again)"));
    CHECK(same_bits<float>(on[0], off[0]));
    check_same(on[0], two(x, y), 1e-5);
  }
}
