// sc::cond, sc::while_loop and sc::host_fn: eager == traced, one trace serving every path,
// gradients through staged control flow against eager tapes, and the errors of misuse.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "testing.hpp"

namespace {

using sctest::error_of;

void check_close(const sc::Tensor& a, const sc::Tensor& b, double tol = 1e-6) {
  REQUIRE(a.shape() == b.shape());
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("element " << i << ": " << x[i] << " vs " << y[i]);
    CHECK(std::abs(x[i] - y[i]) <= tol * (1 + std::abs(y[i])));
  }
}

sc::Tensor piecewise(const sc::Tensor& x) {
  return sc::cond(sc::sum(x) > 0.f, [&] { return sc::tanh(x) * 3.f; }, [&] { return x * x - 1.f; });
}

/// Collatz-like loop: halves x until its sum drops below a limit, counting steps.
std::tuple<sc::Tensor, sc::Tensor> shrink(const sc::Tensor& x) {
  return sc::while_loop([](sc::Tensor v, sc::Tensor) { return sc::sum(v) > 1.f; },
                        [](sc::Tensor v, sc::Tensor n) { return std::make_tuple(v * 0.5f, n + std::int64_t{1}); },
                        std::make_tuple(x, sc::scalar(std::int64_t{0})));
}

}  // namespace

TEST_CASE("cond: eager picks a branch, traced serves both with one trace", "[cond]") {
  const sc::Tensor pos = sc::tensor({0.5f, 1.f, -0.2f}), neg = sc::tensor({-0.5f, -1.f, 0.2f});
  auto f = sc::function([](sc::Tensor x) { return piecewise(x); });
  check_close(f(pos), sc::tanh(pos) * 3.f);
  check_close(f(neg), neg * neg - 1.f);
  check_close(f(pos), piecewise(pos));
  check_close(f(neg), piecewise(neg));
  CHECK(f.trace_count() == 1);
  const std::string g = f.get_concrete(pos).graph().str();
  CHECK_THAT(g, Catch::Contains("cond("));
  CHECK_THAT(g, Catch::Contains("graph then"));
}

TEST_CASE("cond: branches with different shapes are a StagingError", "[cond][errors]") {
  auto f = sc::function([](sc::Tensor x) {
    return sc::cond(sc::sum(x) > 0.f, [&] { return x; }, [&] { return sc::sum(x); });
  });
  const std::string m = error_of<sc::StagingError>([&] { f(sc::ones({3})); });
  CHECK_THAT(m, Catch::Contains("[cond]"));
  CHECK_THAT(m, Catch::Contains("f32[3]"));
  CHECK_THAT(m, Catch::Contains("test_control_flow.cpp"));
}

TEST_CASE("cond: gradients through a staged cond equal eager ones", "[cond][grad]") {
  auto grad_of = [](const sc::Tensor& x) {
    sc::GradientTape tape;
    tape.watch(x);
    const sc::Tensor y = sc::sum(piecewise(x) * x);
    return tape.gradient(y, x);
  };
  auto staged = sc::function([&](sc::Tensor x) { return grad_of(x); });
  for (const sc::Tensor& x : {sc::tensor({0.5f, 1.f, -0.2f}), sc::tensor({-0.5f, -1.f, 0.2f})}) check_close(staged(x), grad_of(x));
  CHECK(staged.trace_count() == 1);
}

TEST_CASE("cond: variables read and assigned in branches", "[cond][variables]") {
  sc::Variable w(sc::full({2}, 2.f), "w"), hits(sc::scalar(0.f), "hits", false);
  auto f = sc::function([&](sc::Tensor x) {
    return sc::cond(sc::sum(x) > 0.f,
                    [&] {
                      hits.assign_add(sc::scalar(1.f));
                      return x * w;
                    },
                    [&] { return x - w; });
  });
  check_close(f(sc::ones({2})), sc::full({2}, 2.f));
  check_close(f(-sc::ones({2})), sc::full({2}, -3.f));
  w.assign(sc::full({2}, 4.f));
  check_close(f(sc::ones({2})), sc::full({2}, 4.f));
  CHECK(hits.value().item<float>() == 2.f);
}

TEST_CASE("while_loop: eager and traced agree, the count depends on data", "[while]") {
  auto f = sc::function([](sc::Tensor x) { return shrink(x); });
  for (float start : {3.f, 40.f, 0.5f}) {
    const sc::Tensor x = sc::full({4}, start);
    auto [ve, ne] = shrink(x);
    auto [vt, nt] = f(x);
    check_close(vt, ve);
    CHECK(nt.item<std::int64_t>() == ne.item<std::int64_t>());
  }
  CHECK(f.trace_count() == 1);
}

TEST_CASE("while_loop: a variable the loop assigns is read afresh at every round, by cond and body", "[while][variables]") {
  sc::Variable acc(sc::scalar(0.f), "acc", false), k(sc::scalar(std::int64_t{0}), "k", false);
  sc::Variable w(sc::scalar(2.f), "w");  // read in the loop, never assigned: one read per call
  auto body = [&](sc::Tensor x) {
    // the body reads acc (assign_add) after its own assignment of the round before
    sc::Tensor i = sc::while_loop([](sc::Tensor n) { return n < 4; },
                                  [&](sc::Tensor n) {
                                    acc.assign_add(sc::scalar(1.f));
                                    return n + std::int64_t{1};
                                  },
                                  sc::scalar(std::int64_t{0}));
    // the condition reads k, which only the body assigns: `while (k < 3) { k += 1; y *= w; }`
    sc::Tensor y = sc::while_loop([&](sc::Tensor) { return k < std::int64_t{3}; },
                                  [&](sc::Tensor v) {
                                    k.assign_add(sc::scalar(std::int64_t{1}));
                                    return v * w;
                                  },
                                  x);
    return std::make_tuple(y + acc, i);
  };
  auto f = sc::function(body);
  for (const bool traced : {false, true}) {
    INFO((traced ? "traced" : "eager"));
    acc.assign(sc::scalar(0.f));
    k.assign(sc::scalar(std::int64_t{0}));
    auto [y, i] = traced ? f(sc::scalar(1.f)) : body(sc::scalar(1.f));
    CHECK(acc.value().item<float>() == 4.f);
    CHECK(i.item<std::int64_t>() == 4);
    CHECK(k.value().item<std::int64_t>() == 3);
    CHECK(y.item<float>() == 8.f + 4.f);  // three rounds of * 2
    k.assign(sc::scalar(std::int64_t{1}));  // two rounds from here; acc goes on from 4
    auto [y2, i2] = traced ? f(sc::scalar(1.f)) : body(sc::scalar(1.f));
    CHECK(acc.value().item<float>() == 8.f);
    CHECK(k.value().item<std::int64_t>() == 3);
    CHECK(y2.item<float>() == 4.f + 8.f);
  }
  CHECK(f.trace_count() == 1);
}

TEST_CASE("while_loop: gradients through a staged loop equal eager ones", "[while][grad]") {
  const sc::Tensor a = sc::tensor({0.3f, -0.2f});
  auto grads = [&](const sc::Tensor& x, const sc::Tensor& scale) {
    sc::GradientTape tape;
    tape.watch(x);
    tape.watch(scale);
    auto [fin, count] = sc::while_loop([](sc::Tensor, sc::Tensor n) { return n < std::int64_t{3}; },
                                 [&](sc::Tensor v, sc::Tensor n) { return std::make_tuple(sc::tanh(v * scale + a), n + std::int64_t{1}); },
                                 std::make_tuple(x, sc::scalar(std::int64_t{0})));
    (void)count;
    const sc::Tensor loss = sc::sum(fin * fin);
    return tape.gradient(loss, std::vector<sc::Tensor>{x, scale});
  };
  auto staged = sc::function([&](sc::Tensor x, sc::Tensor s) { return grads(x, s); });
  const sc::Tensor x = sc::tensor({0.7f, -1.1f}), s = sc::tensor({1.3f, 0.9f});
  const auto ge = grads(x, s), gt = staged(x, s);
  check_close(gt[0], ge[0], 1e-5);
  check_close(gt[1], ge[1], 1e-5);
}

TEST_CASE("while_loop and cond: computing a gradient assigns no variable again", "[while][cond][variables][grad]") {
  // A gradient recomputes the rounds (and branches) it needs without side effects, from the
  // values the variables had before the loop; the counters move once per call.
  sc::Variable count(sc::zeros({}), "count", /*trainable=*/false);
  sc::Variable flips(sc::zeros({}), "flips", /*trainable=*/false);
  sc::Variable w(sc::tensor({2.f}), "w");
  auto body = [&](const sc::Tensor& x) {
    auto [n, a] = sc::while_loop([](const sc::Tensor& j, const sc::Tensor&) { return j < std::int64_t{3}; },
                                 [&](const sc::Tensor& j, const sc::Tensor& p) {
                                   count.assign(count + 1.f);
                                   return std::make_tuple(j + std::int64_t{1}, p * w);
                                 },
                                 std::make_tuple(sc::zeros({}, sc::DType::i64), x));
    (void)n;
    const sc::Tensor b = sc::cond(sc::sum(a) > 0.f, [&] { flips.assign(flips + 1.f); return a * 2.f; }, [&] { return a; });
    return sc::sum(b);
  };
  SECTION("a tape inside the function") {
    auto f = sc::function([&](const sc::Tensor& x) {
      sc::GradientTape t;
      return t.gradient(body(x), w);
    });
    for (int call = 1; call <= 2; ++call) {
      check_close(f(sc::tensor({3.f})), sc::tensor({2.f * 3.f * 3.f * 4.f}));  // d/dw 2 x w^3
      CHECK(count.value().item<float>() == 3.f * static_cast<float>(call));
      CHECK(flips.value().item<float>() == static_cast<float>(call));
    }
  }
  SECTION("two tapes outside the call (the backward pass recomputes the forward one)") {
    auto f = sc::function(body);
    sc::GradientTape outer, inner;
    const sc::Tensor y = f(sc::tensor({3.f}));
    check_close(inner.gradient(y, w), sc::tensor({72.f}));
    check_close(outer.gradient(y, w), sc::tensor({72.f}));
    CHECK(count.value().item<float>() == 3.f);
    CHECK(flips.value().item<float>() == 1.f);
  }
}

namespace {
/// Runs make(v, k, x) under a persistent tape (and an outer one), traced (sc::function) or
/// eagerly, from v = [1, -0.5] and k = k0; returns y, the gradients of y with respect to v (its
/// value after the run), to v's value before it and to x, then v's and k's values after.
template <class Make>
std::vector<sc::Tensor> run_under_tapes(bool traced, bool two_tapes, std::int64_t k0, Make make) {
  sc::Variable v(sc::tensor({1.f, -0.5f}), "v");
  sc::Variable k(sc::scalar(k0), "k", /*trainable=*/false);
  const sc::Tensor x = sc::tensor({3.f, -2.f});
  auto body = [&](const sc::Tensor& xx) { return make(v, k, xx); };
  auto f = sc::function(body);
  const sc::Tensor old = v.value();
  sc::GradientTape outer;
  sc::GradientTape tape(/*persistent=*/true);
  tape.watch(x);
  if (two_tapes) outer.watch(x);
  const sc::Tensor y = traced ? sc::Tensor(f(x)) : body(x);
  return {y, tape.gradient(y, v), tape.gradient(y, old), tape.gradient(y, x), v.value(), k.value()};
}

template <class Make>
void check_traced_as_eager(std::int64_t k0, Make make) {
  for (bool two : {false, true}) {
    const auto e = run_under_tapes(false, two, k0, make), t = run_under_tapes(true, two, k0, make);
    const char* what[] = {"y", "d/dv (after)", "d/dv (before)", "d/dx", "v", "k"};
    for (std::size_t i = 0; i < e.size(); ++i) {
      INFO(what[i] << (two ? ", two tapes" : ", one tape"));
      check_close(t[i], e[i], 1e-5);
    }
  }
}

sc::Tensor one_more(const sc::Variable& k) { return k + std::int64_t{1}; }
}  // namespace

TEST_CASE("while_loop: a tape outside the call differentiates a variable the loop assigns", "[while][variables][grad]") {
  // The loop reads and assigns v and k; the function reads v before the loop and after it.
  // Eager and traced agree under one tape and under two, and the gradient assigns nothing.
  auto make = [](sc::Variable& v, sc::Variable& k, const sc::Tensor& xx) {
    const sc::Tensor a = sc::sum(v * xx);
    const sc::Tensor acc = sc::while_loop([&](const sc::Tensor&) { return k < std::int64_t{3}; },
                                          [&](const sc::Tensor& s) {
                                            const sc::Tensor before = sc::sum(sc::square(v));
                                            v.assign(v * 1.5f + 0.25f);
                                            k.assign(k + std::int64_t{1});
                                            return s + before;
                                          },
                                          sc::zeros({}));
    return a + acc + sc::sum(sc::exp(v) * xx);
  };
  check_traced_as_eager(0, make);
  for (bool two : {false, true}) {
    const auto t = run_under_tapes(true, two, 0, make);
    check_close(t[1], sc::exp(t[4]) * sc::tensor({3.f, -2.f}), 1e-5);  // the read after the loop
    CHECK(t[5].item<std::int64_t>() == 3);
  }
}


TEST_CASE("while_loop and cond: a tape outside the call counts the reads after a body's last assignment",
          "[while][cond][variables][grad]") {
  // Eagerly, the reads that follow the last assignment (in the last round, in the branch taken)
  // read the variable's final value: they count in the gradient with respect to it.
  SECTION("a round assigns, then reads") {
    for (std::int64_t k0 : {0, 3}) {  // three rounds, then none (the reads before the loop are final)
      INFO("k starts at " << k0);
      check_traced_as_eager(k0, [](sc::Variable& v, sc::Variable& k, const sc::Tensor& x) {
        const sc::Tensor a = sc::sum(v * x);
        const sc::Tensor acc = sc::while_loop([&](const sc::Tensor&) { return k < std::int64_t{3}; },
                                              [&](const sc::Tensor& s) {
                                                v.assign(v * 1.5f + 0.25f);
                                                k.assign(one_more(k));
                                                return s + sc::sum(sc::square(v) * x);
                                              },
                                              sc::zeros({}));
        return a + acc + sc::sum(sc::exp(v) * x);
      });
    }
  }
  SECTION("a round reads at its start and assigns only in its first round") {
    check_traced_as_eager(0, [](sc::Variable& v, sc::Variable& k, const sc::Tensor& x) {
      return sc::while_loop([&](const sc::Tensor&) { return k < std::int64_t{3}; },
                            [&](const sc::Tensor& s) {
                              const sc::Tensor before = sc::sum(v * v * x);
                              (void)sc::cond(k < std::int64_t{1}, [&] { v.assign(v * 1.5f); return sc::zeros({}); },
                                             [&] { return sc::zeros({}); });
                              k.assign(one_more(k));
                              return s + before;
                            },
                            sc::zeros({}));
    });
  }
  SECTION("a branch assigns, then reads") {
    for (float sign : {1.f, -1.f}) {  // the branch that assigns, then the other
      INFO("sign " << sign);
      check_traced_as_eager(0, [sign](sc::Variable& v, sc::Variable&, const sc::Tensor& x) {
        const sc::Tensor a = sc::sum(v * x);
        const sc::Tensor b = sc::cond(sc::sum(x) * sign > 0.f, [&] { v.assign(v * 2.f); return sc::sum(v * v * x); },
                                      [&] { return sc::sum(v * x); });
        return a + b;
      });
    }
  }
  SECTION("a branch in a round assigns, then reads") {
    check_traced_as_eager(0, [](sc::Variable& v, sc::Variable& k, const sc::Tensor& x) {
      return sc::while_loop([&](const sc::Tensor&) { return k < std::int64_t{3}; },
                            [&](const sc::Tensor& s) {
                              const sc::Tensor r = sc::cond(k != std::int64_t{1},
                                                            [&] { v.assign(v * 0.5f + 1.f); return sc::sum(sc::exp(v) * x); },
                                                            [&] { return sc::sum(v * x); });
                              k.assign(one_more(k));
                              return s + r;
                            },
                            sc::zeros({}));
    });
  }
  SECTION("nested loops assign, then read") {
    check_traced_as_eager(0, [](sc::Variable& v, sc::Variable& k, const sc::Tensor& x) {
      auto [j, acc] = sc::while_loop(
          [](const sc::Tensor& jj, const sc::Tensor&) { return jj < std::int64_t{2}; },
          [&](const sc::Tensor& jj, const sc::Tensor& s) {
            const sc::Tensor inner = sc::while_loop([&](const sc::Tensor&) { return k < (jj + std::int64_t{1}) * std::int64_t{2}; },
                                                    [&](const sc::Tensor& t) {
                                                      v.assign(v * 0.5f + 1.f);
                                                      k.assign(one_more(k));
                                                      return t + sc::sum(v * v * x);
                                                    },
                                                    sc::zeros({}));
            return std::make_tuple(jj + std::int64_t{1}, s + inner + sc::sum(v * x));
          },
          std::make_tuple(sc::zeros({}, sc::DType::i64), sc::zeros({})));
      (void)j;
      return acc;
    });
  }
  SECTION("a loop in a branch assigns, then the branch reads (and a branch in a branch)") {
    for (std::int64_t k0 : {0, 2}) {  // two rounds, then none
      INFO("k starts at " << k0);
      check_traced_as_eager(k0, [](sc::Variable& v, sc::Variable& k, const sc::Tensor& x) {
        return sc::cond(sc::sum(x) > 0.f,
                        [&] {
                          const sc::Tensor acc = sc::while_loop([&](const sc::Tensor&) { return k < std::int64_t{2}; },
                                                                [&](const sc::Tensor& s) {
                                                                  v.assign(v * 1.5f - 0.5f);
                                                                  k.assign(one_more(k));
                                                                  return s + sc::sum(v * v * x);
                                                                },
                                                                sc::zeros({}));
                          const sc::Tensor inner = sc::cond(k > std::int64_t{1}, [&] { v.assign(v * v); return sc::sum(v * x); },
                                                            [&] { return sc::sum(sc::exp(v) * x); });
                          return acc + inner + sc::sum(v * x);
                        },
                        [&] { return sc::sum(v * x); });
      });
    }
  }
  SECTION("an assignment after the loop: no read in it is final") {
    check_traced_as_eager(0, [](sc::Variable& v, sc::Variable& k, const sc::Tensor& x) {
      const sc::Tensor acc = sc::while_loop([&](const sc::Tensor&) { return k < std::int64_t{2}; },
                                            [&](const sc::Tensor& s) {
                                              v.assign(v * 1.5f);
                                              k.assign(one_more(k));
                                              return s + sc::sum(v * x);
                                            },
                                            sc::zeros({}));
      v.assign(v - 1.f);
      return acc + sc::sum(v * v * x);
    });
  }
}

TEST_CASE("while_loop: a body that changes a shape is a StagingError", "[while][errors]") {
  auto f = sc::function([](sc::Tensor x) {
    return sc::while_loop([](sc::Tensor v) { return sc::sum(v) > 1.f; }, [](sc::Tensor v) { return sc::sum(v, {0}, true); }, x);
  });
  const std::string m = error_of<sc::StagingError>([&] { f(sc::ones({3, 2})); });
  CHECK_THAT(m, Catch::Contains("loop variable 0"));
}

TEST_CASE("host_fn: runs at every call, outputs are checked, gradient optional", "[host_fn]") {
  int calls = 0;
  auto twice = [&](const std::vector<sc::Tensor>& in) {
    ++calls;
    return std::vector<sc::Tensor>{in[0] * 2.f};
  };
  auto grad = [](const std::vector<sc::Tensor>&, const std::vector<sc::Tensor>&, const std::vector<sc::Tensor>& og) {
    return std::vector<sc::Tensor>{og[0] * 2.f};
  };
  auto f = sc::function([&](sc::Tensor x) {
    sc::GradientTape tape;
    tape.watch(x);
    sc::Tensor y = sc::host_fn(twice, {x + 1.f}, {sc::TensorSpec{x.shape(), x.dtype()}}, grad)[0];
    sc::Tensor loss = sc::sum(y * y);
    return std::make_tuple(y, tape.gradient(loss, x));
  });
  auto [y, g] = f(sc::ones({3}));
  check_close(y, sc::full({3}, 4.f));
  check_close(g, sc::full({3}, 16.f));  // d/dx (2(x+1))^2 = 8(x+1)
  f(sc::ones({3}));
  CHECK(calls == 2);  // at each call of the plan; tracing does not run it
  auto bad = sc::function([&](sc::Tensor x) { return sc::host_fn(twice, {x}, {sc::TensorSpec{sc::Shape{5}, sc::f32}})[0]; });
  const std::string m = error_of<sc::ValueError>([&] { bad(sc::ones({3})); });
  CHECK_THAT(m, Catch::Contains("[host_fn] output 0 is f32[3], its spec says f32[5]"));
  CHECK_THAT(m, Catch::Contains("test_control_flow.cpp"));  // (the line that called host_fn when traced)
  // Eager, the same checks, naming the caller's line; and a count that breaks the promise.
  const sc::TensorSpec three{sc::Shape{3}, sc::f32};
  const std::string e = error_of<sc::ValueError>([&] { sc::host_fn(twice, {sc::ones({3})}, {sc::TensorSpec{sc::Shape{5}, sc::f32}}); });
  CHECK_THAT(e, Catch::Contains("[host_fn] output 0 is f32[3], its spec says f32[5]"));
  CHECK_THAT(e, Catch::Contains("test_control_flow.cpp"));
  const std::string n = error_of<sc::ValueError>([&] { sc::host_fn(twice, {sc::ones({3})}, {three, three}); });
  CHECK_THAT(n, Catch::Contains("the function returned 1 tensors, its output specs promise 2"));
  auto bad_count = sc::function([&](sc::Tensor x) { return sc::host_fn(twice, {x}, {three, three})[0]; });
  CHECK_THAT(error_of<sc::ValueError>([&] { bad_count(sc::ones({3})); }), Catch::Contains("its output specs promise 2"));
}

TEST_CASE("concrete function: differentiable under an eager tape (staged backward)", "[function][grad]") {
  auto body = [](sc::Tensor x, sc::Tensor w) { return sc::sum(sc::tanh(sc::matmul(x, w)) * 2.f); };
  auto f = sc::function(body);
  const sc::Tensor x = sc::random::normal({3, 4}, 7), w = sc::random::normal({4, 2}, 8);
  sc::GradientTape t1, t2;
  t1.watch(w);
  t2.watch(w);
  const sc::Tensor ys = f(x, w);
  const sc::Tensor ye = body(x, w);
  check_close(t1.gradient(ys, w), t2.gradient(ye, w), 1e-5);
}

TEST_CASE("concrete function under one tape: the forward runs once and keeps what the backward needs",
          "[function][grad]") {
  int calls = 0;
  auto count = [&](const std::vector<sc::Tensor>& in) {
    ++calls;
    return std::vector<sc::Tensor>{in[0] * 1.f};
  };
  auto body = [&](sc::Tensor x, sc::Tensor w) {
    const sc::Tensor h = sc::tanh(sc::matmul(x, w));
    const sc::Tensor c = sc::host_fn(count, {h}, {sc::TensorSpec{h.shape(), h.dtype()}},
                                     [](const auto&, const auto&, const auto& g) { return std::vector<sc::Tensor>{g[0]}; })[0];
    return std::make_tuple(sc::sum(c * c), sc::exp(h) * 2.f);
  };
  auto f = sc::function(body);
  const sc::Tensor x = sc::random::normal({5, 4}, 7), w = sc::random::normal({4, 3}, 8);
  f(x, w);  // traced and run once
  calls = 0;
  sc::Tensor ys, ye, zs, ze;
  sc::GradientTape t1;
  t1.watch(w);
  {
    auto [y, z] = f(x, w);
    ys = y, zs = z;
  }
  const sc::Tensor gs = t1.gradient(ys + sc::sum(zs * zs), w);
  CHECK(calls == 1);  // not run again by the backward pass
  sc::GradientTape t2;
  t2.watch(w);
  {
    auto [y, z] = body(x, w);
    ye = y, ze = z;
  }
  const sc::Tensor ge = t2.gradient(ye + sc::sum(ze * ze), w);
  check_close(ys, ye, 1e-6);
  check_close(gs, ge, 1e-5);
  // The pair: forward returns outputs and residuals; backward takes residuals and seeds.
  const sc::ConcreteFunction cf = f.get_concrete(x, w);
  sc::GradientTape t3;
  t3.watch(x);
  const sc::Tensor y3 = cf(x, w)[0];
  check_close(t3.gradient(y3, x), [&] {
    sc::GradientTape t;
    t.watch(x);
    return t.gradient(std::get<0>(body(x, w)), x);
  }(), 1e-5);
}

TEST_CASE("split_forward_backward: residuals, seeds and constants land where they belong", "[function][grad]") {
  // Joint graph of y = exp(x) * c: (x, seed) -> (y, dx) with dx = seed * c * exp(x).
  sc::graph::GraphBuilder b("joint", false);
  {
    sc::graph::TraceScope s(b);
    const sc::Tensor x = b.add_input({sc::Shape{3}, sc::f32}, sc::Device::cpu());
    const sc::Tensor seed = b.add_input({sc::Shape{3}, sc::f32}, sc::Device::cpu());
    const sc::Tensor c = sc::tensor({1.f, 2.f, 3.f});
    const sc::Tensor e = sc::exp(x);
    b.set_outputs({e * c, seed * c * e}, std::source_location::current());
  }
  const sc::graph::SplitGraphs p = sc::graph::split_forward_backward(b.graph, 1, 1);
  CHECK(p.num_residuals == 1);  // exp(x); the constant is copied, not passed
  CHECK(p.forward.inputs.size() == 1);
  CHECK(p.forward.outputs.size() == 2);
  CHECK(p.backward.inputs.size() == 2);
  CHECK(p.backward.outputs.size() == 1);
  sc::graph::verify(p.forward, "split");
  sc::graph::verify(p.backward, "split");
  const sc::Tensor x = sc::tensor({0.1f, -0.5f, 2.f}), seed = sc::tensor({1.f, 0.5f, -2.f});
  const auto fo = sc::graph::Plan(std::make_shared<const sc::graph::Graph>(p.forward)).run(std::vector<sc::Tensor>{x});
  const auto bo = sc::graph::Plan(std::make_shared<const sc::graph::Graph>(p.backward)).run(std::vector<sc::Tensor>{fo[1], seed});
  check_close(fo[0], sc::exp(x) * sc::tensor({1.f, 2.f, 3.f}));
  check_close(bo[0], seed * sc::tensor({1.f, 2.f, 3.f}) * sc::exp(x));
}
