// sc::function: eager == traced for plain functions, variables by reference and assigned inside,
// training steps with a tape inside, retrace counting and notices, misuse errors, threads.
#include <catch2/catch.hpp>

#include <stagecraft/stagecraft.hpp>
#include <stagecraft/graph/function.hpp>

#include <atomic>
#include <cmath>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "function_testing.hpp"
#include "testing.hpp"

namespace {

using sctest::error_of;

using sctest::function::check_same;

/// Captures retrace notices for the test's lifetime.
struct LogCapture {
  std::vector<std::string> lines;
  std::function<void(const std::string&)> saved = sc::staging_log();
  LogCapture() {
    sc::staging_log() = [this](const std::string& s) { lines.push_back(s); };
  }
  ~LogCapture() { sc::staging_log() = saved; }
};

}  // namespace

TEST_CASE("function: traced results equal eager ones", "[function]") {
  auto body = [](sc::Tensor x, sc::Tensor y) { return sc::tanh(x * y) + 2.f * x - sc::sum(y, {0}); };
  auto f = sc::function(body);
  const sc::Tensor x = sc::random::normal({4, 3}, 1), y = sc::random::normal({4, 3}, 2);
  check_same(f(x, y), body(x, y));
  CHECK(f.trace_count() == 1);
  const sc::Tensor x2 = sc::random::normal({4, 3}, 3);
  check_same(f(x2, y), body(x2, y));
  CHECK(f.trace_count() == 1);  // same signature: no retrace
}

TEST_CASE("function: retraces on a new signature and says why", "[function]") {
  LogCapture log;
  const int made_line = __LINE__ + 1;
  auto f = sc::function([](sc::Tensor x, int k) { return x * static_cast<float>(k); }, "scale");
  f(sc::ones({2, 3}), 2);
  f(sc::ones({2, 3}), 2);
  CHECK(f.trace_count() == 1);
  const int call_line = __LINE__ + 1;
  f(sc::ones({4, 3}), 2);
  CHECK(f.trace_count() == 2);
  REQUIRE(log.lines.size() == 1);
  // which call retraced: its line ends the notice
  CHECK_THAT(log.lines[0], Catch::Contains("retracing 'scale' (trace 2): argument 0 changed from f32[2, 3] to "
                                           "f32[4, 3] at test_function.cpp:" + std::to_string(call_line)));
  check_same(f(sc::ones({2, 3}), 3), sc::full({2, 3}, 3.f));
  CHECK(f.trace_count() == 3);
  CHECK_THAT(log.lines[1], Catch::Contains("argument 1 changed from 2 to 3"));
  f.set_retrace_warning(4);
  f(sc::ones({2, 3}, sc::f64), 3);
  CHECK(f.trace_count() == 4);
  CHECK_THAT(log.lines.back(), Catch::Contains("'scale' (made at test_function.cpp:" + std::to_string(made_line) +
                                              ") has been traced 4 times"));
  // a call whose first argument is not a Tensor names the line that made the function
  auto g = sc::function([](int k, sc::Tensor x) { return x * static_cast<float>(k); }, "scale2");
  const int g_line = __LINE__ - 1;
  g(1, sc::ones({2}));
  g(2, sc::ones({2}));
  CHECK_THAT(log.lines.back(), Catch::Contains("argument 0 changed from 1 to 2 at test_function.cpp:" +
                                              std::to_string(g_line)));
}

TEST_CASE("function: a plain argument's C++ type and sign of zero are part of the signature", "[function]") {
  LogCapture log;
  // A generic lambda: each argument type is another function (here with another result count).
  auto f = sc::function(
      [](sc::Tensor x, auto k) {
        if constexpr (std::is_same_v<decltype(k), bool>) return std::make_tuple(x * 10.f, x);
        else return x * static_cast<float>(k);
      },
      "typed");
  check_same(f(sc::ones({2}), 1), sc::ones({2}));
  const auto r = f(sc::ones({2}), true);  // 1 and true are equal numbers, not the same function
  CHECK(f.trace_count() == 2);
  check_same(std::get<0>(r), sc::full({2}, 10.f));
  check_same(std::get<1>(r), sc::ones({2}));
  CHECK_THAT(log.lines.back(), Catch::Contains("argument 1 changed from 1 (int32) to 1 (bool)"));
  check_same(f(sc::ones({2}), 1.0), sc::ones({2}));
  CHECK(f.trace_count() == 3);
  // 0.0 and -0.0: x / k differs (+inf and -inf)
  auto g = sc::function([](sc::Tensor x, float k) { return x / k; });
  CHECK(g(sc::ones({1}), 0.f).item<float>() == INFINITY);
  CHECK(g(sc::ones({1}), -0.f).item<float>() == -INFINITY);
  CHECK(g.trace_count() == 2);
  CHECK_THAT(log.lines.back(), Catch::Contains("changed from 0 to -0"));
  g(sc::ones({1}), NAN);
  g(sc::ones({1}), NAN);  // a NaN matches itself
  CHECK(g.trace_count() == 3);
  // a long double is compared whole, not as the double it rounds to
  auto h = sc::function([](sc::Tensor x, long double d) { return x * (d > 1.0L ? 2.f : 3.f); });
  CHECK(h(sc::ones({1}), 1.0L).item<float>() == 3.f);
  const long double above = 1.0L + 1e-18L;
  if (static_cast<double>(above) == 1.0 && above > 1.0L) {  // (where long double is wider than double)
    CHECK(h(sc::ones({1}), above).item<float>() == 2.f);
    CHECK(h.trace_count() == 2);
  }
  CHECK(h(sc::ones({1}), 1.0L).item<float>() == 3.f);
  CHECK(h.trace_count() == (static_cast<double>(above) == 1.0 && above > 1.0L ? 2 : 1));
}

TEST_CASE("function: the DeviceScope a call is made under is part of its signature", "[function][retrace]") {
  // A scope decides where ops go, so a trace made under one is not reused outside it (nor the
  // other way round). On the CPU alone: no scope and a CPU scope trace apart, and each is reused.
  LogCapture log;
  auto f = sc::function([](sc::Tensor x) { return x * 2.f; }, "scoped");
  f(sc::ones({2}));
  {
    const sc::DeviceScope on(sc::Device::cpu());
    check_same(f(sc::ones({2})), sc::full({2}, 2.f));
    CHECK(f.trace_count() == 2);
    f(sc::ones({2}));
    CHECK(f.trace_count() == 2);
  }
  f(sc::ones({2}));
  CHECK(f.trace_count() == 2);
  REQUIRE(log.lines.size() == 1);
  CHECK_THAT(log.lines[0], Catch::Contains("retracing 'scoped' (trace 2): the DeviceScope changed from none to cpu"));
  // With an argument changed too, both are named.
  {
    const sc::DeviceScope on(sc::Device::cpu());
    f(sc::ones({3}));
  }
  CHECK_THAT(log.lines.back(), Catch::Contains("argument 0 changed from f32[2] to f32[3]"));
}

TEST_CASE("function: tuple and vector results", "[function]") {
  auto f = sc::function([](sc::Tensor x) { return std::make_tuple(x + 1.f, std::vector<sc::Tensor>{x * 2.f, -x}); });
  auto [a, v] = f(sc::ones({2}));
  check_same(a, sc::full({2}, 2.f));
  REQUIRE(v.size() == 2);
  check_same(v[0], sc::full({2}, 2.f));
  check_same(v[1], sc::full({2}, -1.f));
}

TEST_CASE("function: results stay valid across later calls", "[function]") {
  auto f = sc::function([](sc::Tensor x) { return sc::exp(x) * 2.f + x; });
  const sc::Tensor r1 = f(sc::zeros({1000}));
  const sc::Tensor r2 = f(sc::ones({1000}));
  CHECK(r1.to_vector<float>()[7] == 2.f);
  CHECK(r2.to_vector<float>()[7] == Approx(2 * std::exp(1.f) + 1));
}

TEST_CASE("function: variables are read by reference", "[function][variables]") {
  sc::Variable w(sc::full({3}, 2.f), "w");
  const int line = __LINE__ + 1;
  auto f = sc::function([&](sc::Tensor x) { return x * w; });
  check_same(f(sc::ones({3})), sc::full({3}, 2.f));
  w.assign(sc::full({3}, 5.f));
  check_same(f(sc::ones({3})), sc::full({3}, 5.f));
  CHECK(f.trace_count() == 1);
  // The read (a conversion, which cannot know its caller) carries the line of the op using it.
  std::ostringstream text;
  text << f.get_concrete(sc::ones({3})).traced_graph();
  INFO(text.str());
  CHECK(text.str().find("read_var \"w\"") != std::string::npos);
  CHECK(text.str().find("variable.hpp") == std::string::npos);
  CHECK(text.str().find("test_function.cpp:" + std::to_string(line)) != std::string::npos);
}

TEST_CASE("function: a variable reached through a Tensor is still read at each call, a snapshot is a value",
          "[function][variables]") {
  // sc::cond on a variable: the branch is chosen at each call, not fixed at the trace
  sc::Variable flag(sc::scalar(true), "flag", /*trainable=*/false);
  auto f = sc::function([&](sc::Tensor x) { return sc::cond(flag, [&] { return x * 2.f; }, [&] { return x * 3.f; }); });
  CHECK(f(sc::scalar(1.f)).item<float>() == 2.f);
  flag.assign(sc::scalar(false));
  CHECK(f(sc::scalar(1.f)).item<float>() == 3.f);
  CHECK(f.trace_count() == 1);
  // item() of a variable while tracing would fix its value into the graph: an error naming the fix
  sc::Variable s(sc::scalar(2.f), "s");
  auto g = sc::function([&](sc::Tensor x) { return x * s.value().item<float>(); });
  const std::string m = error_of<sc::StagingError>([&] { g(sc::scalar(1.f)); });
  CHECK_THAT(m, Catch::Contains("[item]") && Catch::Contains("sc::cond") && Catch::Contains("test_function.cpp"));
  // so is an `if` on a traced value; a conversion takes no source_location, so the message names
  // the op that made the value and its line (the comparison in the `if`)
  const int if_line = __LINE__ + 2;
  auto branchy = sc::function([](sc::Tensor x) {
    if (sc::sum(x) > 0.f) return x;
    return -x;
  });
  const std::string b = error_of<sc::StagingError>([&] { branchy(sc::tensor({1.f})); });
  const std::string at = "`greater` at test_function.cpp:" + std::to_string(if_line);
  CHECK_THAT(b, Catch::Contains("[bool]") && Catch::Contains(at) && Catch::Contains("sc::cond"));
  // a value taken before the function is a value, as eagerly: it does not follow the variable
  sc::Variable w(sc::scalar(1.f), "w");
  const sc::Tensor snapshot = w.value();
  auto eager = [&](sc::Tensor x) { return x * snapshot + w; };
  auto h = sc::function(eager);
  check_same(h(sc::scalar(1.f)), eager(sc::scalar(1.f)));
  w.assign(sc::scalar(5.f));
  check_same(h(sc::scalar(1.f)), eager(sc::scalar(1.f)));  // 1 * 1 + 5
  CHECK(h(sc::scalar(1.f)).item<float>() == 6.f);
  // a tape inside the function watching a tensor captured from outside differentiates it
  const sc::Tensor c = sc::full({2}, .5f);
  auto body = [&](sc::Tensor x) {
    sc::GradientTape t;
    t.watch(c);
    return t.gradient(sc::sum(c * x * x), c);
  };
  auto traced = sc::function(body);
  check_same(traced(sc::tensor({3.f, -2.f})), body(sc::tensor({3.f, -2.f})));
  check_same(traced(sc::tensor({3.f, -2.f})), sc::tensor({9.f, 4.f}));
}

TEST_CASE("function: a tape outside the call differentiates the variables read inside", "[function][variables][grad]") {
  sc::Variable w(sc::ones({3}), "w");
  sc::Variable frozen(sc::full({3}, 5.f), "frozen", /*trainable=*/false);
  sc::Variable count(sc::zeros({}), "count", /*trainable=*/false);
  auto f = sc::function([&](sc::Tensor x) {
    count.assign_add(sc::scalar(1.f));  // an assigned variable keeps its read
    return sc::sum(w * x * frozen) + sc::sum(w * w);
  });
  auto eager = [&](sc::Tensor x) { return sc::sum(w * x * frozen) + sc::sum(w * w); };
  const sc::Tensor x = sc::tensor({2.f, -1.f, 0.5f});
  for (int step = 0; step < 3; ++step) {
    sc::GradientTape t(/*persistent=*/true);
    const sc::Tensor y = f(x);
    const std::vector<sc::Tensor> g = t.gradient(y, std::vector<sc::Variable>{w, frozen});
    sc::GradientTape te(/*persistent=*/true);
    const sc::Tensor ye = eager(x);
    const std::vector<sc::Tensor> ge = te.gradient(ye, std::vector<sc::Variable>{w, frozen});
    check_same(y, ye, 1e-6);
    check_same(g[0], ge[0], 1e-6);  // x * frozen + 2w
    check_same(g[1], sc::zeros({3}));  // frozen: a constant to the tape, as in eager
    w.assign(w - 0.1f * g[0]);         // the next call reads the new value
  }
  CHECK(f.trace_count() == 1);
  CHECK(count.value().item<float>() == 3.f);
  // Second order through the call: d2/dw2 of sum(w * w) is 2 everywhere.
  sc::GradientTape outer;
  sc::Tensor dw;
  {
    sc::GradientTape inner;
    dw = inner.gradient(f(x), w.value());
  }
  check_same(outer.gradient(dw, w.value()), sc::full({3}, 2.f));
}

TEST_CASE("function: a tape outside the call sees a variable's assignments as eager does", "[function][variables][grad]") {
  SECTION("no gradient flows from a read after an assignment into the assigned expression") {
    // Eagerly, an assignment stores the value under a fresh identity no tape recorded.
    auto run = [](bool traced) {
      sc::Variable w(sc::full({2}, 2.f), "w");
      sc::Variable s(sc::zeros({2}), "s", /*trainable=*/false);
      auto body = [&](const sc::Tensor& x) {
        s.assign(w * x);
        return sc::sum(s * 2.f);
      };
      auto f = sc::function(body);
      sc::GradientTape t;
      const sc::Tensor y = traced ? sc::Tensor(f(sc::full({2}, 3.f))) : body(sc::full({2}, 3.f));
      CHECK(y.item<float>() == 24.f);
      return t.gradient(y, w);
    };
    check_same(run(true), run(false));
    check_same(run(true), sc::zeros({2}));
  }
  SECTION("reads before, between and after assignments") {
    // The gradient with respect to the variable is that of the reads of its final value; the
    // value it had before the call keeps the gradient of the reads before the first assignment.
    sc::Variable v(sc::tensor({2.f, -1.f}), "v");
    sc::Variable steps(sc::zeros({}, sc::DType::i64), "steps");
    auto body = [&](const sc::Tensor& x) {
      const sc::Tensor a = sc::sum(v * x);
      v.assign(v * 1.5f);
      const sc::Tensor b = sc::sum(v * v * x);
      v.assign(v + 1.f);
      steps.assign(steps + std::int64_t{1});
      return a + b + sc::sum(sc::exp(v) * x) + sc::cast(steps, sc::DType::f32);
    };
    auto f = sc::function(body);
    const sc::Tensor x = sc::tensor({0.5f, 2.f});
    for (int call = 0; call < 2; ++call) {
      const sc::Tensor start = v.value(), steps_start = steps.value();
      std::vector<sc::Tensor> traced, eager;
      for (bool staged : {true, false}) {
        if (!staged) {  // the eager run starts where the traced one did
          v.assign(start);
          steps.assign(steps_start);
        }
        const sc::Tensor old = v.value();
        sc::GradientTape tape(/*persistent=*/true);
        tape.watch(x);
        const sc::Tensor y = staged ? sc::Tensor(f(x)) : body(x);
        auto& out = staged ? traced : eager;
        out = {y, tape.gradient(y, v), tape.gradient(y, old), tape.gradient(y, x), v.value()};
      }
      for (std::size_t k = 0; k < traced.size(); ++k) {
        INFO("result " << k << " of call " << call);
        check_same(traced[k], eager[k], 1e-6);
      }
      check_same(traced[1], sc::exp(traced[4]) * x, 1e-6);  // d/dv of the final reads only
      check_same(traced[2], x, 1e-6);                        // the reads before the first assignment
    }
    CHECK(f.trace_count() == 1);
    CHECK(steps.value().item<std::int64_t>() == 2);
  }
  SECTION("under two tapes") {
    sc::Variable v(sc::tensor({0.5f}), "v");
    auto body = [&](const sc::Tensor& x) {
      v.assign(v * 2.f);
      return sc::sum(v * v * x);
    };
    auto f = sc::function(body);
    const sc::Tensor x = sc::tensor({3.f});
    sc::GradientTape outer, inner;
    const sc::Tensor y = f(x);
    check_same(inner.gradient(y, v), sc::tensor({6.f}), 1e-6);  // 2 v x at v = 1
    check_same(outer.gradient(y, v), sc::tensor({6.f}), 1e-6);
  }
}

TEST_CASE("function: assignments run at every call, in program order", "[function][variables]") {
  sc::Variable counter(sc::scalar(0.f), "counter", false);
  auto f = sc::function([&](sc::Tensor x) {
    sc::Tensor before = counter.value();
    counter.assign_add(x);
    sc::Tensor after = counter.value();
    counter.assign(after * 2.f);
    return std::make_tuple(before, after, counter.value());
  });
  auto [b1, a1, c1] = f(sc::scalar(1.f));
  CHECK(b1.item<float>() == 0.f);
  CHECK(a1.item<float>() == 1.f);
  CHECK(c1.item<float>() == 2.f);
  CHECK(counter.value().item<float>() == 2.f);
  auto [b2, a2, c2] = f(sc::scalar(1.f));
  CHECK(b2.item<float>() == 2.f);
  CHECK(a2.item<float>() == 3.f);
  CHECK(c2.item<float>() == 6.f);
  CHECK(counter.value().item<float>() == 6.f);
  CHECK(b1.item<float>() == 0.f);  // earlier results unchanged
}

TEST_CASE("function: a training step with a tape inside matches eager steps", "[function][train]") {
  auto make = [](sc::Variable& w1, sc::Variable& b1, sc::Variable& w2) {
    w1 = sc::Variable(sc::random::normal({8, 16}, 5, 0, 0.3), "w1");
    b1 = sc::Variable(sc::zeros({16}), "b1");
    w2 = sc::Variable(sc::random::normal({16, 4}, 6, 0, 0.3), "w2");
  };
  sc::Variable ew1, eb1, ew2, tw1, tb1, tw2;
  make(ew1, eb1, ew2);
  make(tw1, tb1, tw2);
  auto step = [](sc::Variable& w1, sc::Variable& b1, sc::Variable& w2, const sc::Tensor& x, const sc::Tensor& y) {
    sc::GradientTape tape;
    sc::Tensor h = sc::relu(sc::matmul(x, w1) + b1);
    sc::Tensor loss = sc::nn::cross_entropy(sc::matmul(h, w2), y);
    std::vector<sc::Variable> vars{w1, b1, w2};
    auto g = tape.gradient(loss, vars);
    for (std::size_t i = 0; i < vars.size(); ++i) vars[i].assign_sub(g[i] * 0.1f);
    return loss;
  };
  auto staged = sc::function([&](sc::Tensor x, sc::Tensor y) { return step(tw1, tb1, tw2, x, y); });
  for (int s = 0; s < 4; ++s) {
    const sc::Tensor x = sc::random::normal({5, 8}, 100 + s);
    const sc::Tensor y = sc::tensor(std::vector<std::int64_t>{0, 1, 2, 3, s % 4}, sc::Shape{5});
    const sc::Tensor le = step(ew1, eb1, ew2, x, y);
    const sc::Tensor lt = staged(x, y);
    check_same(lt, le, 1e-6);
  }
  check_same(tw1.value(), ew1.value(), 1e-5);
  check_same(tb1.value(), eb1.value(), 1e-5);
  check_same(tw2.value(), ew2.value(), 1e-5);
  CHECK(staged.trace_count() == 1);
}

TEST_CASE("function: misuse is a StagingError naming the fix", "[function][errors]") {
  sc::Tensor leaked;
  auto f = sc::function([&](sc::Tensor x) {
    leaked = x * 2.f;
    return x;
  });
  f(sc::ones({2}));
  const std::string m = error_of<sc::StagingError>([&] { (void)(leaked + 1.f); });
  CHECK_THAT(m, Catch::Contains("escaped"));
  CHECK_THAT(m, Catch::Contains("test_function.cpp"));

  auto g = sc::function([](sc::Tensor x) { return x * x.item<float>(); });
  const std::string m2 = error_of<sc::StagingError>([&] { g(sc::ones({2})); });
  CHECK_THAT(m2, Catch::Contains("sc::cond"));
  CHECK_THAT(m2, Catch::Contains("test_function.cpp"));

  auto h = sc::function([](sc::Tensor x) {
    if (x.numel() > 0 && bool(sc::sum(x) > 0.f)) return x;
    return -x;
  });
  CHECK_THAT(error_of<sc::StagingError>([&] { h(sc::ones({2})); }), Catch::Contains("sc::cond"));

  auto d = sc::function([](sc::Tensor x) { return x * x.data<float>()[0]; });
  const std::string m3 = error_of<sc::StagingError>([&] { d(sc::ones({2})); });
  CHECK_THAT(m3, Catch::Contains("[data] a symbolic tensor") && Catch::Contains("test_function.cpp"));
}

TEST_CASE("function: a concrete function called inside another one is inlined", "[function]") {
  sc::Variable w(sc::full({3}, 2.f), "w");
  auto inner = sc::function([&](sc::Tensor x) { return sc::tanh(x) * w; });
  const sc::ConcreteFunction cf = inner.get_concrete(sc::ones({3}));
  auto outer = sc::function([&](sc::Tensor x) {
    sc::Tensor y = cf(x * 2.f);  // symbolic argument: the graph is inlined here
    return y + 1.f;
  });
  const sc::Tensor x = sc::tensor({0.5f, -1.f, 2.f});
  check_same(outer(x), sc::tanh(x * 2.f) * w + 1.f, 1e-6);
  w.assign(sc::full({3}, -1.f));  // the inlined graph reads the variable by reference too
  check_same(outer(x), sc::tanh(x * 2.f) * w + 1.f, 1e-6);
  CHECK(outer.trace_count() == 1);
  // outside a trace, a wrong signature is still an error
  CHECK_THROWS_AS(cf(sc::ones({4})), sc::ShapeError);
}

TEST_CASE("function: variables may be created on the first trace only", "[function][variables]") {
  std::vector<sc::Variable> made;
  auto f = sc::function([&](sc::Tensor x) {
    made.emplace_back(sc::zeros(x.shape()), "v");
    return x + made.back();
  });
  f(sc::ones({2}));
  CHECK(made.size() == 1);
  const std::string m = error_of<sc::StagingError>([&] { f(sc::ones({3})); });
  CHECK_THAT(m, Catch::Contains("sc::init_scope"));

  std::vector<sc::Variable> lifted;
  auto g = sc::function([&](sc::Tensor x) {
    if (lifted.empty()) {
      sc::init_scope lift;
      lifted.emplace_back(sc::full(x.shape(), 3.f), "v");
    }
    return x * lifted.back();
  });
  check_same(g(sc::ones({2})), sc::full({2}, 3.f));
}

TEST_CASE("function: the graph prints with the user's lines", "[function][graph]") {
  auto f = sc::function([](sc::Tensor x) { return sc::exp(x) + 1.f; }, "expp1");
  auto cf = f.get_concrete(sc::ones({2, 2}));
  const std::string text = cf.graph().str();
  CHECK_THAT(text, Catch::Contains("graph expp1(%0: f32[2, 2])"));
  CHECK_THAT(text, Catch::Contains("exp(%0)"));
  CHECK_THAT(text, Catch::Contains("test_function.cpp:"));
  CHECK_THAT(cf.graph().to_dot(), Catch::Contains("digraph"));
  check_same(cf(sc::ones({2, 2})), sc::exp(sc::ones({2, 2})) + 1.f);
  // a wrong argument names the caller's line (the first argument carries it), not the library's
  const int call_line = __LINE__ + 1;
  const std::string m = error_of<sc::ShapeError>([&] { cf(sc::ones({3})); });
  CHECK_THAT(m, Catch::Contains("argument 0") && Catch::Contains("test_function.cpp:" + std::to_string(call_line)));
  // as with a variable first (an Operand reads it once), and for a function of two arguments
  auto two = sc::function([](sc::Tensor x, sc::Tensor y) { return x * y; });
  const sc::ConcreteFunction cf2 = two.get_concrete(sc::ones({2}), sc::ones({2}));
  sc::Variable v(sc::ones({2}), "v");
  check_same(cf2(v, sc::full({2}, 3.f)), sc::full({2}, 3.f));
  const int call_line2 = __LINE__ + 1;
  const std::string m2 = error_of<sc::ShapeError>([&] { cf2(v, sc::ones({5})); });
  CHECK_THAT(m2, Catch::Contains("argument 1") && Catch::Contains("test_function.cpp:" + std::to_string(call_line2)));
  CHECK_THAT(m2, !Catch::Contains("function.hpp"));
}

TEST_CASE("function: several threads call one function", "[function][threads]") {
  sc::Variable w(sc::full({64}, 0.5f), "w");
  auto f = sc::function([&](sc::Tensor x) { return sc::tanh(x * w) + x; });
  std::vector<sc::Tensor> inputs;
  std::vector<std::vector<float>> expect;
  for (int t = 0; t < 4; ++t) {
    inputs.push_back(sc::random::normal({64}, 50 + t));
    expect.push_back((sc::tanh(inputs.back() * w.value()) + inputs.back()).to_vector<float>());
  }
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int k = 0; k < 200; ++k)
        if (f(inputs[t]).to_vector<float>() != expect[t]) ++bad;
    });
  for (auto& th : threads) th.join();
  CHECK(bad == 0);
  CHECK(f.trace_count() == 1);
}

TEST_CASE("function: a bad label in a staged step is an error naming the user's line", "[function][errors]") {
  const int line = __LINE__ + 1;
  auto f = sc::function([](sc::Tensor logits, sc::Tensor labels) { return sc::nn::cross_entropy(logits, labels); });
  const sc::Tensor logits = sc::zeros({2, 3});
  CHECK(f(logits, sc::tensor(std::vector<std::int64_t>{0, 2}, sc::Shape{2})).item<float>() == Approx(std::log(3.f)));
  const sc::Tensor bad = sc::tensor(std::vector<std::int64_t>{0, 7}, sc::Shape{2});
  const std::string m = error_of<sc::ValueError>([&] { f(logits, bad); });
  // The op that asked for the check, as eager says it (it named the internal check_range op).
  const std::string eager = error_of<sc::ValueError>([&] { (void)sc::nn::cross_entropy(logits, bad); });
  CHECK_THAT(eager, Catch::Contains("[cross_entropy] label 7 at index 1 is out of range [0, 3)"));
  CHECK_THAT(m, Catch::Contains("[cross_entropy] label 7 at index 1 is out of range [0, 3) at test_function.cpp:" +
                                std::to_string(line)));
  CHECK_THAT(m, !Catch::Contains("check_range"));
  // The loss is one op that checks its labels itself (no separate check_range node).
  const std::string text = f.get_concrete(logits, bad).graph().str();
  CHECK_THAT(text, Catch::Contains("softmax_cross_entropy(") && !Catch::Contains("check_range("));
  // An asker is an attribute, so the graph's text form keeps it.
  auto h = sc::function([](sc::Tensor x) { return sc::detail::check_range(x, 0, 3, std::source_location::current(), "cross_entropy"); });
  CHECK_THAT(h.get_concrete(bad).graph().str(), Catch::Contains("check_range(") && Catch::Contains("i1=3, i2=1"));
  CHECK_THAT(error_of<sc::ValueError>([&] { h(bad); }), Catch::Contains("[cross_entropy] label 7 at index 1 is out of range [0, 3)"));
  // check_range on its own still names itself.
  auto g = sc::function([](sc::Tensor x) { return sc::detail::check_range(x, 0, 3); });
  CHECK_THAT(error_of<sc::ValueError>([&] { g(bad); }),
             Catch::Contains("[check_range] value 7 at index 1 is out of range [0, 3) at test_function.cpp:"));
  const auto here = std::source_location::current();
  CHECK_THAT(error_of<sc::ValueError>([&] { (void)sc::detail::check_range(bad, 0, 3, here, "x"); }),
             Catch::Contains("[check_range] no range check is registered for op 'x'"));
}

TEST_CASE("function: an Adam step staged equals it eager, each variable's update is one fused group",
          "[function][train]") {
  auto run = [](bool staged) {
    sc::manual_seed(3);
    sc::nn::Dense l1(6, 8), l2(8, 3);
    sc::optim::Adam opt(0.01);
    std::vector<sc::Variable> vars = l1.trainable_variables();
    for (const auto& v : l2.trainable_variables()) vars.push_back(v);
    auto step = [&](const sc::Tensor& x, const sc::Tensor& y) {
      sc::GradientTape tape;
      const sc::Tensor loss = sc::nn::cross_entropy(l2(sc::relu(l1(x))), y);
      opt.apply(tape.gradient(loss, vars), vars);
      return loss;
    };
    auto f = sc::function(step);
    std::vector<float> losses;
    for (int s = 0; s < 3; ++s) {
      const sc::Tensor x = sc::random::normal({4, 6}, 40 + s);
      const sc::Tensor y = sc::tensor(std::vector<std::int64_t>{0, 1, 2, s % 3}, sc::Shape{4});
      losses.push_back((staged ? f(x, y) : step(x, y)).item<float>());
    }
    std::vector<std::vector<float>> w;
    for (const auto& v : vars) w.push_back(v.value().to_vector<float>());
    if (staged) {
      const auto st = f.get_concrete(sc::random::normal({4, 6}, 1), sc::tensor(std::vector<std::int64_t>{0, 1, 2, 0}, sc::Shape{4})).stats();
      CHECK(st.plan.fused_groups >= 4);  // at least one per variable's update (m, v and the weight in one pass)
      // each of the 4 updates is one group, run by the specialized Adam kernel (graph/fused_special.hpp)
      CHECK(st.plan.specialized == (sc::graph::fused_specializations() ? 4 : 0));
    }
    return std::make_pair(losses, w);
  };
  struct FuseSmall {  // the layers here are small: fuse them anyway, to test the fused update
    std::int64_t saved = sc::graph::fusion_min_elements();
    FuseSmall() { sc::graph::fusion_min_elements() = 1; }
    ~FuseSmall() { sc::graph::fusion_min_elements() = saved; }
  } fuse_small;
  const auto [le, we] = run(false);
  const auto [lt, wt] = run(true);
  for (std::size_t i = 0; i < le.size(); ++i) CHECK(lt[i] == Approx(le[i]).epsilon(1e-5));
  for (std::size_t k = 0; k < we.size(); ++k)
    for (std::size_t i = 0; i < we[k].size(); ++i) CHECK(wt[k][i] == Approx(we[k][i]).margin(1e-5));
  // The tile evaluator gives the specialized kernel's bits.
  sc::graph::fused_specializations() = false;
  const auto [lo, wo] = run(true);
  sc::graph::fused_specializations() = true;
  CHECK(lo == lt);
  CHECK(wo == wt);
}

TEST_CASE("function: a traced Adam step of a big layer is as fast a program as eager: one specialized group per weight",
          "[function][train]") {
  // Above fusion_min_elements, with the default settings: the f32 and f64 kernels' updates are
  // one group each, run by the specialized kernel, and equal the eager fused update bit for bit.
  for (const sc::DType dt : {sc::f32, sc::f64}) {
    auto run = [&](bool staged) {
      sc::manual_seed(5);
      sc::Variable w(sc::cast(sc::random::normal({48, 40}, 6), dt), "w");
      sc::optim::Adam opt(0.01);
      const std::vector<sc::Variable> vars{w};
      auto step = [&](const sc::Tensor& x) {
        sc::GradientTape tape;
        const sc::Tensor loss = sc::sum(sc::tanh(sc::matmul(x, w)));
        opt.apply(tape.gradient(loss, vars), vars);
        return loss;
      };
      auto f = sc::function(step);
      for (int s = 0; s < 3; ++s) {
        const sc::Tensor x = sc::cast(sc::random::normal({5, 48}, 60 + s), dt);
        (void)(staged ? f(x) : step(x));
      }
      if (staged) CHECK(f.get_concrete(sc::cast(sc::random::normal({5, 48}, 1), dt)).stats().plan.specialized == 1);
      return w.value().to_vector<double>();
    };
    CHECK(run(true) == run(false));
  }
}

TEST_CASE("function: nested tapes inside a traced function give second derivatives", "[function][grad]") {
  auto second = [](const sc::Tensor& x) {
    sc::GradientTape outer;
    outer.watch(x);
    sc::Tensor dy;
    {
      sc::GradientTape inner;
      inner.watch(x);
      const sc::Tensor y = sc::sum(sc::tanh(x) * x * x);
      dy = inner.gradient(y, x);
    }
    return outer.gradient(sc::sum(dy), x);
  };
  auto f = sc::function(second);
  const sc::Tensor x = sc::tensor({0.3, -1.2, 2.0});
  const auto e = second(x).to_vector<double>(), t = f(x).to_vector<double>();
  for (std::size_t i = 0; i < e.size(); ++i) CHECK(t[i] == Approx(e[i]).epsilon(1e-12));
}
