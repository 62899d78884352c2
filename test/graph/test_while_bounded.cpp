// sc::while_loop with WhileOptions::maximum_iterations: the loop stops at the bound or when its
// condition is false, eagerly (counted in C++, the condition not called past the bound) and
// traced (a counter loop variable), with gradients, saved functions and the errors of misuse.
// The bound is a number or an integer tensor (traced: one trace serves every bound).
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "files.hpp"
#include "testing.hpp"

namespace {

using sctest::error_of;
using Tuple = std::tuple<sc::Tensor, sc::Tensor>;

/// Doubles x and counts rounds while sum(x) < limit, at most `bound` rounds.
Tuple doubling(const sc::Tensor& x, float limit, const sc::IterationBound& bound) {
  return sc::while_loop([limit](sc::Tensor v, sc::Tensor) { return sc::sum(v) < limit; },
                        [](sc::Tensor v, sc::Tensor k) { return std::make_tuple(v * 2.f, k + std::int64_t{1}); },
                        std::make_tuple(x, sc::scalar(std::int64_t{0})), sc::WhileOptions{.maximum_iterations = bound});
}

std::int64_t rounds_of(const Tuple& t) { return std::get<1>(t).item<std::int64_t>(); }

}  // namespace

TEST_CASE("while_loop maximum_iterations: the bound or the condition ends the loop, eager and traced alike",
          "[while][bounded]") {
  const sc::Tensor x = sc::tensor({0.5f, 0.25f});  // sum 0.75: 4 doublings reach 12 >= 10
  for (const bool traced : {false, true}) {
    INFO((traced ? "traced" : "eager"));
    for (const std::int64_t bound : {std::int64_t{0}, std::int64_t{1}, std::int64_t{3}, std::int64_t{4},
                                     std::int64_t{5}, std::int64_t{1000}}) {
      INFO("bound " << bound);
      auto f = sc::function([bound](sc::Tensor in) { return doubling(in, 10.f, bound); });
      const Tuple r = traced ? f(x) : doubling(x, 10.f, bound);
      const std::int64_t want = std::min<std::int64_t>(bound, 4);
      CHECK(rounds_of(r) == want);
      CHECK(std::get<0>(r).to_vector<float>() ==
            std::vector<float>{0.5f * std::ldexp(1.f, static_cast<int>(want)), 0.25f * std::ldexp(1.f, static_cast<int>(want))});
    }
  }
  // One trace serves inputs whose condition ends the loop at different rounds, and the bound.
  auto f = sc::function([](sc::Tensor in) { return doubling(in, 10.f, 3); });
  CHECK(rounds_of(f(sc::tensor({0.5f, 0.25f}))) == 3);
  CHECK(rounds_of(f(sc::tensor({4.f, 2.f}))) == 1);
  CHECK(rounds_of(f(sc::tensor({6.f, 5.f}))) == 0);
  CHECK(f.trace_count() == 1);
}

TEST_CASE("while_loop maximum_iterations: a loop whose condition never ends it stops at the bound", "[while][bounded]") {
  int cond_calls = 0, body_calls = 0;
  const sc::Tensor out = sc::while_loop(
      [&](sc::Tensor) {
        ++cond_calls;
        return sc::scalar(true);
      },
      [&](sc::Tensor v) {
        ++body_calls;
        return v + 1.0;
      },
      sc::scalar(0.0), sc::WhileOptions{.maximum_iterations = 7});
  CHECK(out.item<double>() == 7.0);
  CHECK(body_calls == 7);
  CHECK(cond_calls == 7);  // eagerly not called once the bound is reached
  auto f = sc::function([](sc::Tensor x) {
    return sc::while_loop([](sc::Tensor v) { return v > -1.0; }, [](sc::Tensor v) { return v + 1.0; }, x,
                          sc::WhileOptions{.maximum_iterations = 7});
  });
  CHECK(f(sc::scalar(0.0)).item<double>() == 7.0);
  CHECK(f(sc::scalar(-5.0)).item<double>() == -5.0);  // the condition is false at once
  // A condition returning a one-element float tensor of rank 1, as without a bound.
  auto g = sc::function([](sc::Tensor x) {
    return sc::while_loop([](sc::Tensor v) { return sc::reshape(v < 100.f, {1}); }, [](sc::Tensor v) { return v * 3.f; }, x,
                          sc::WhileOptions{.maximum_iterations = 2});
  });
  CHECK(g(sc::scalar(1.f)).item<float>() == 9.f);
}

TEST_CASE("while_loop maximum_iterations: a variable the body assigns is assigned once per round run", "[while][bounded][variables]") {
  sc::Variable acc(sc::scalar(0.f), "acc", false);
  auto body = [&](sc::Tensor x) {
    return sc::while_loop([&](sc::Tensor) { return acc < 100.f; },
                          [&](sc::Tensor v) {
                            acc.assign_add(sc::scalar(1.f));
                            return v + acc;
                          },
                          x, sc::WhileOptions{.maximum_iterations = 3});
  };
  auto f = sc::function(body);
  for (const bool traced : {false, true}) {
    INFO((traced ? "traced" : "eager"));
    acc.assign(sc::scalar(0.f));
    CHECK((traced ? f(sc::scalar(0.f)) : body(sc::scalar(0.f))).item<float>() == 1.f + 2.f + 3.f);
    CHECK(acc.value().item<float>() == 3.f);
    acc.assign(sc::scalar(98.5f));  // the condition ends it after two rounds
    CHECK((traced ? f(sc::scalar(0.f)) : body(sc::scalar(0.f))).item<float>() == 99.5f + 100.5f);
    CHECK(acc.value().item<float>() == 100.5f);
  }
  CHECK(f.trace_count() == 1);
}

TEST_CASE("while_loop maximum_iterations: gradients, eager and staged, match x * s^rounds", "[while][bounded][grad]") {
  // y = x * s^k with k = min(bound, rounds the condition allows): dy/dx = s^k, dy/ds = k x s^(k-1).
  auto grads = [](const sc::Tensor& x, const sc::Tensor& s) {
    sc::GradientTape tape;
    tape.watch(x);
    tape.watch(s);
    const sc::Tensor y = sc::while_loop([](sc::Tensor v) { return sc::abs(v) < 1e6; }, [&](sc::Tensor v) { return v * s; }, x,
                                        sc::WhileOptions{.maximum_iterations = 3});
    return tape.gradient(y, std::vector<sc::Tensor>{x, s});
  };
  auto staged = sc::function([&](sc::Tensor x, sc::Tensor s) { return grads(x, s); });
  const sc::Tensor x = sc::scalar(0.7), s = sc::scalar(1.5);
  for (const auto& g : {grads(x, s), staged(x, s)}) {
    CHECK(g[0].item<double>() == Approx(1.5 * 1.5 * 1.5));
    CHECK(g[1].item<double>() == Approx(3 * 0.7 * 1.5 * 1.5));
  }
  // A tape outside the traced call.
  auto f = sc::function([](sc::Tensor in, sc::Tensor scale) {
    return sc::while_loop([](sc::Tensor v) { return sc::abs(v) < 1e6; }, [&](sc::Tensor v) { return v * scale; }, in,
                          sc::WhileOptions{.maximum_iterations = 3});
  });
  sc::GradientTape tape;
  tape.watch(x);
  tape.watch(s);
  const auto g = tape.gradient(f(x, s), std::vector<sc::Tensor>{x, s});
  CHECK(g[0].item<double>() == Approx(1.5 * 1.5 * 1.5));
  CHECK(g[1].item<double>() == Approx(3 * 0.7 * 1.5 * 1.5));
}

TEST_CASE("while_loop maximum_iterations: a saved function keeps the bound", "[while][bounded][serialize]") {
  sctest::TempDir dir("sc_while");
  auto f = sc::function([](sc::Tensor in) { return doubling(in, 10.f, 2); });
  const sc::Tensor x = sc::tensor({0.5f, 0.25f});
  const auto path = (dir.path / "bounded.scg").string();
  f.get_concrete(x).save(path);
  const sc::ConcreteFunction loaded = sc::load_function(path);
  const std::vector<sc::Tensor> r = loaded(x);
  CHECK(r[1].item<std::int64_t>() == 2);
  CHECK(r[0].to_vector<float>() == std::vector<float>{2.f, 1.f});
  CHECK(loaded(sc::tensor({4.f, 2.f}))[1].item<std::int64_t>() == 1);
}

TEST_CASE("while_loop maximum_iterations: misuse is reported at the user's line", "[while][bounded][errors]") {
  const sc::Tensor x = sc::scalar(1.f);
  auto body = [](sc::Tensor v) { return v + 1.f; };
  auto cond = [](sc::Tensor v) { return v < 5.f; };
  int line = __LINE__ + 1;
  std::string m = error_of<sc::ValueError>([&] { sc::while_loop(cond, body, x, sc::WhileOptions{.maximum_iterations = -1}); });
  CHECK_THAT(m, Catch::Contains("[while_loop] maximum_iterations must be >= 0, got -1") &&
                    Catch::Contains("test_while_bounded.cpp:" + std::to_string(line)));
  // Traced: the messages count the user's loop variables, not the bound's counter.
  auto pair = sc::function([](sc::Tensor a) {
    return sc::while_loop([](sc::Tensor v, sc::Tensor) { return sc::sum(v) < 5.f; },
                          [](sc::Tensor v, sc::Tensor w) { return std::make_tuple(sc::sum(v, {0}, true), w); },
                          std::make_tuple(a, a), sc::WhileOptions{.maximum_iterations = 3});
  });
  m = error_of<sc::StagingError>([&] { pair(sc::ones({3, 2})); });
  CHECK_THAT(m, Catch::Contains("loop variable 0 enters as"));
  auto bad_cond = sc::function([](sc::Tensor a) {
    return sc::while_loop([](sc::Tensor v) { return v < 5.f; }, [](sc::Tensor v) { return v + 1.f; }, a,
                          sc::WhileOptions{.maximum_iterations = 3});
  });
  m = error_of<sc::ShapeError>([&] { bad_cond(sc::ones({2})); });
  CHECK_THAT(m, Catch::Contains("cond_fn must return a one-element tensor, got shape [2]"));
}

TEST_CASE("while_loop maximum_iterations: a tensor bound, eager and traced, one trace for every bound",
          "[while][bounded][tensor]") {
  const sc::Tensor x = sc::tensor({0.5f, 0.25f});  // the condition allows 4 rounds
  auto f = sc::function([](sc::Tensor in, sc::Tensor n) { return doubling(in, 10.f, n); });
  for (const std::int64_t bound : {std::int64_t{0}, std::int64_t{1}, std::int64_t{3}, std::int64_t{4}, std::int64_t{9}}) {
    INFO("bound " << bound);
    const std::int64_t want = std::min<std::int64_t>(bound, 4);
    const auto as_i32 = static_cast<std::int32_t>(bound);
    CHECK(rounds_of(doubling(x, 10.f, sc::scalar(bound))) == want);
    CHECK(rounds_of(doubling(x, 10.f, sc::tensor({as_i32}))) == want);  // i32, one element of rank 1
    CHECK(rounds_of(f(x, sc::scalar(bound))) == want);
    const Tuple r = f(x, sc::scalar(bound));
    CHECK(std::get<0>(r).to_vector<float>() == std::get<0>(doubling(x, 10.f, bound)).to_vector<float>());
  }
  CHECK(f.trace_count() == 1);
  CHECK(rounds_of(f(x, sc::tensor({std::int32_t{2}}))) == 2);  // a new signature: a second trace
  CHECK(f.trace_count() == 2);
  // A concrete tensor captured by a traced function is read when the loop is traced.
  const sc::Tensor two = sc::scalar(std::int64_t{2});
  auto g = sc::function([&](sc::Tensor in) { return doubling(in, 10.f, two); });
  CHECK(rounds_of(g(x)) == 2);
}

TEST_CASE("while_loop maximum_iterations: a Variable bound is read by reference in a traced function",
          "[while][bounded][tensor][variables]") {
  sc::Variable limit(sc::scalar(std::int64_t{1}), "limit", false);
  const sc::Tensor x = sc::tensor({0.5f, 0.25f});
  CHECK(rounds_of(doubling(x, 10.f, limit)) == 1);  // eager
  auto f = sc::function([&](sc::Tensor in) { return doubling(in, 10.f, limit); });
  CHECK(rounds_of(f(x)) == 1);
  limit.assign(sc::scalar(std::int64_t{3}));
  CHECK(rounds_of(f(x)) == 3);  // no retrace: the bound is a value of the graph
  limit.assign(sc::scalar(std::int64_t{100}));
  CHECK(rounds_of(f(x)) == 4);  // the condition ends it
  CHECK(f.trace_count() == 1);
}

TEST_CASE("while_loop maximum_iterations: gradients and saved functions with a tensor bound", "[while][bounded][tensor][grad]") {
  auto f = sc::function([](sc::Tensor in, sc::Tensor scale, sc::Tensor n) {
    sc::GradientTape tape;
    tape.watch(in);
    tape.watch(scale);
    const sc::Tensor y = sc::while_loop([](sc::Tensor v) { return sc::abs(v) < 1e6; }, [&](sc::Tensor v) { return v * scale; },
                                        in, sc::WhileOptions{.maximum_iterations = n});
    const auto g = tape.gradient(y, std::vector<sc::Tensor>{in, scale});
    return std::vector<sc::Tensor>{y, g[0], g[1]};
  });
  const sc::Tensor x = sc::scalar(0.7), s = sc::scalar(1.5);
  for (const std::int64_t k : {std::int64_t{0}, std::int64_t{2}, std::int64_t{5}}) {
    INFO("bound " << k);
    const auto r = f(x, s, sc::scalar(k));
    const double sk = std::pow(1.5, static_cast<double>(k));
    CHECK(r[0].item<double>() == Approx(0.7 * sk));
    CHECK(r[1].item<double>() == Approx(sk));
    CHECK(r[2].item<double>() == Approx(static_cast<double>(k) * 0.7 * sk / 1.5));
  }
  CHECK(f.trace_count() == 1);
  sctest::TempDir dir("sc_while_tensor");
  auto d = sc::function([](sc::Tensor in, sc::Tensor n) { return doubling(in, 10.f, n); });
  const sc::Tensor in = sc::tensor({0.5f, 0.25f});
  const auto path = (dir.path / "bound_tensor.scg").string();
  d.get_concrete(in, sc::scalar(std::int64_t{1})).save(path);
  const sc::ConcreteFunction loaded = sc::load_function(path);
  CHECK(loaded(in, sc::scalar(std::int64_t{3}))[1].item<std::int64_t>() == 3);
  CHECK(loaded(in, sc::scalar(std::int64_t{0}))[1].item<std::int64_t>() == 0);
  CHECK(loaded(in, sc::scalar(std::int64_t{50}))[1].item<std::int64_t>() == 4);
}

TEST_CASE("while_loop maximum_iterations: a bad tensor bound is reported at the user's line", "[while][bounded][tensor][errors]") {
  const sc::Tensor x = sc::tensor({0.5f, 0.25f});
  int line = __LINE__ + 1;
  std::string m = error_of<sc::DTypeError>([&] { doubling(x, 10.f, sc::scalar(3.f)); });
  CHECK_THAT(m, Catch::Contains("[while_loop] maximum_iterations must be an integer tensor, got f32"));
  m = error_of<sc::ShapeError>([&] { doubling(x, 10.f, sc::tensor({std::int64_t{1}, std::int64_t{2}})); });
  CHECK_THAT(m, Catch::Contains("[while_loop] maximum_iterations must be a one-element tensor, got shape [2]"));
  m = error_of<sc::ValueError>([&] { doubling(x, 10.f, sc::scalar(std::int64_t{-2})); });
  CHECK_THAT(m, Catch::Contains("[while_loop] maximum_iterations must be >= 0, got -2"));
  m = error_of<sc::ValueError>([&] { doubling(x, 10.f, sc::Tensor()); });
  CHECK_THAT(m, Catch::Contains("[while_loop]"));
  // Traced, a negative bound fails when the function runs, at the while_loop's line.
  auto f = sc::function([&](sc::Tensor in, sc::Tensor n) {
    line = __LINE__ + 1;
    return sc::while_loop([](sc::Tensor v) { return sc::sum(v) < 10.f; }, [](sc::Tensor v) { return v * 2.f; }, in,
                          sc::WhileOptions{.maximum_iterations = n});
  });
  CHECK(f(x, sc::scalar(std::int64_t{2})).to_vector<float>() == std::vector<float>{2.f, 1.f});
  m = error_of<sc::ValueError>([&] { f(x, sc::scalar(std::int64_t{-1})); });
  CHECK_THAT(m, Catch::Contains("[while_loop] maximum_iterations -1") &&
                    Catch::Contains("test_while_bounded.cpp:" + std::to_string(line)));
  m = error_of<sc::DTypeError>([&] { f(x, sc::scalar(2.0)); });
  CHECK_THAT(m, Catch::Contains("maximum_iterations must be an integer tensor, got f64"));
  // Every node the bound adds (the check, the counter and its increment) carries the user's line.
  std::ostringstream dump;
  dump << f.get_concrete(x, sc::scalar(std::int64_t{2})).graph();
  INFO(dump.str());
  CHECK(dump.str().find("check_range") != std::string::npos);
  CHECK(dump.str().find("control_flow.hpp") == std::string::npos);
}
