// sc::function: eager == traced for plain functions, variables by reference and assigned inside,
// training steps with a tape inside, retrace counting and notices, misuse errors, threads.
#include <catch2/catch.hpp>

#include <map>
#include <stagecraft/stagecraft.hpp>
#include <stagecraft/graph/function.hpp>

#include <atomic>
#include <bit>
#include <cstdint>
#include <cmath>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "testing.hpp"

namespace {

using sctest::error_of;

/// RAII: every elementwise size fused, as a GPU plan fuses (graph::fusion_min_elements() = 1).
struct FuseAll {
  std::int64_t saved = sc::graph::fusion_min_elements();
  FuseAll() { sc::graph::fusion_min_elements() = 1; }
  FuseAll(const FuseAll&) = delete;
  FuseAll& operator=(const FuseAll&) = delete;
  ~FuseAll() { sc::graph::fusion_min_elements() = saved; }
};

/// a and b hold the same f32 values bit for bit (-0.0 and NaN payloads included).
bool same_bits(const sc::Tensor& a, const sc::Tensor& b) {
  const auto x = a.to_vector<float>(), y = b.to_vector<float>();
  bool same = x.size() == y.size();
  for (std::size_t i = 0; same && i < x.size(); ++i)
    same = std::bit_cast<std::uint32_t>(x[i]) == std::bit_cast<std::uint32_t>(y[i]);
  return same;
}

void check_same(const sc::Tensor& a, const sc::Tensor& b, double tol = 0) {
  REQUIRE(a.shape() == b.shape());
  REQUIRE(a.dtype() == b.dtype());
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("element " << i << ": " << x[i] << " vs " << y[i]);
    if (tol == 0) CHECK(x[i] == y[i]);
    else CHECK(std::abs(x[i] - y[i]) <= tol * (1 + std::abs(y[i])));
  }
}

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
  auto f = sc::function([](sc::Tensor x, int k) { return x * static_cast<float>(k); }, "scale");
  f(sc::ones({2, 3}), 2);
  f(sc::ones({2, 3}), 2);
  CHECK(f.trace_count() == 1);
  f(sc::ones({4, 3}), 2);
  CHECK(f.trace_count() == 2);
  REQUIRE(log.lines.size() == 1);
  CHECK_THAT(log.lines[0], Catch::Contains("argument 0 changed from f32[2, 3] to f32[4, 3]"));
  check_same(f(sc::ones({2, 3}), 3), sc::full({2, 3}, 3.f));
  CHECK(f.trace_count() == 3);
  CHECK_THAT(log.lines[1], Catch::Contains("argument 1 changed from 2 to 3"));
  f.set_retrace_warning(4);
  f(sc::ones({2, 3}, sc::f64), 3);
  CHECK(f.trace_count() == 4);
  CHECK_THAT(log.lines.back(), Catch::Contains("traced 4 times"));
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
  CHECK_THAT(error_of<sc::ShapeError>([&] { cf(sc::ones({3})); }), Catch::Contains("argument 0"));
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

TEST_CASE("function: a traced MLP Adam step fused as on a GPU is 28 kernels: one for the loss, one for its gradient",
          "[function][train]") {
  // The example's MLP (784-256-128-10, Adam, batch 128) with every size fused, as a GPU plan fuses:
  // each kernel is a launch there (session 29 measured 238-245 us for 48 kernels on an H100). The
  // loss and its gradient are one op each (no check_range, one_hot, where or log), and relu's
  // gradient one fusible op (no greater or where). A change that adds kernels fails here.
  const FuseAll fuse_all;
  sc::manual_seed(5);
  sc::nn::Dense l1(784, 256), l2(256, 128), l3(128, 10);
  sc::optim::Adam opt(1e-3);
  std::vector<sc::Variable> vars;
  for (const sc::nn::Dense* l : {&l1, &l2, &l3})
    for (const auto& v : l->trainable_variables()) vars.push_back(v);
  auto f = sc::function([&](const sc::Tensor& x, const sc::Tensor& y) {
    sc::GradientTape tape;
    const sc::Tensor loss = sc::nn::cross_entropy(l3(sc::relu(l2(sc::relu(l1(x))))), y);
    opt.apply(tape.gradient(loss, vars), vars);
    return loss;
  });
  const sc::Tensor x = sc::random::uniform({128, 784}, 0.0, 1.0, 11);
  const sc::Tensor y = sc::cast(sc::random::uniform({128}, 0.0, 10.0, 12), sc::i64);
  const float loss = sc::Tensor(f(x, y)).item<float>();
  CHECK(std::isfinite(loss));
  const sc::ConcreteFunction c = f.get_concrete(x, y);
  INFO(c.stats());
  CHECK(c.stats().plan.kernels <= 28);
  std::map<std::string, int> ops;
  for (const sc::graph::Node& n : c.graph().nodes) ++ops[std::string(n.name())];
  CHECK(ops["softmax_cross_entropy"] == 1);
  CHECK(ops["softmax_cross_entropy_grad"] == 1);
  CHECK(ops["relu_grad"] == 2);
  for (const char* gone : {"check_range", "one_hot", "where", "greater", "log"}) {
    INFO(gone);
    CHECK(ops.count(gone) == 0);
  }
}

TEST_CASE("function: a traced LSTM fused as on a GPU: gates read through windows, their gradients one concat, bit for bit",
          "[function][train]") {
  // The four gate slices' gradients are zero-padded and summed: distributed over the pads
  // (graph::distribute_over_concat), each step's sum is one concat of four pieces. 10 steps of the
  // bench's LSTM (32 -> 64, batch 1: its zero pads are fill ops), every size fused as a GPU
  // plan fuses, the slices read through windows. The bench's 50 steps (the kernel's gradient
  // only) went from 953 kernels to 405.
  const FuseAll fuse_all;
  constexpr int steps = 10;
  sc::nn::LSTMCell cell{32, 64, 3};
  std::vector<sc::Tensor> xs;
  for (int t = 0; t < steps; ++t) xs.push_back(sc::random::uniform({1, 32}, -1.0, 1.0, 40 + t));
  const std::vector<sc::Variable> vars = cell.trainable_variables();
  const auto body = [&] {
    sc::GradientTape tape;
    auto state = cell.initial_state(1);
    for (const sc::Tensor& x : xs) state = cell(x, state);
    const sc::Tensor loss = sc::sum(state.first * state.second);
    std::vector<sc::Tensor> r = tape.gradient(loss, vars);
    r.insert(r.begin(), loss);
    return r;
  };
  const std::vector<sc::Tensor> eager = body();
  auto f = sc::function(body);
  const std::vector<sc::Tensor> staged = f();
  REQUIRE(staged.size() == eager.size());
  for (std::size_t k = 0; k < eager.size(); ++k) {
    INFO("result " << k);
    CHECK(same_bits(eager[k], staged[k]));
  }
  const sc::ConcreteFunction c = f.get_concrete();
  INFO(c.stats());
  std::map<std::string, int> ops;
  for (const sc::graph::Node& n : c.graph().nodes) ++ops[std::string(n.name())];
  CHECK(ops["concat"] == steps);
  // the gates are windows of x W and h U per step (read by their fused group: no kernel) and of
  // the bias (four slices for every step); z = x W + h U + b is never made
  CHECK(ops["slice"] == 8 * steps + 4);
  CHECK(c.stats().plan.kernels <= 10 * steps + 10);
}

TEST_CASE("function: slices read only by a fused group are read through windows, no kernel of their own",
          "[function][fusion]") {
  const FuseAll fuse_all;
  const sc::Tensor x = sc::random::uniform({5, 12}, -3.0, 3.0, 71);
  // gates: four column windows of one value, one group, one kernel
  const auto gates = [](const sc::Tensor& z) {
    const auto part = [&](std::int64_t k) { return sc::slice(z, {0, 3 * k}, {-1, 3}); };
    const sc::Tensor c = sc::sigmoid(part(0)) * sc::tanh(part(2)) + sc::sigmoid(part(1));
    return sc::sigmoid(part(3)) * sc::tanh(c);
  };
  auto f = sc::function(gates);
  CHECK(same_bits(sc::Tensor(f(x)), gates(x)));
  const sc::ConcreteFunction c = f.get_concrete(x);
  INFO(c.stats());
  CHECK(c.stats().plan.kernels == 1);
  // a row window broadcast over an output of its parent's shape, the parent dying there: the
  // output must not take the parent's buffer (each row would read a row already overwritten)
  const auto rows = [](const sc::Tensor& v) {
    const sc::Tensor e = sc::exp(v) - 1.f;
    // (transposed after: the group's output is an intermediate the plan places)
    return sc::transpose(sc::slice(e, {2, 0}, {1, -1}) * (v * 2.f) + sc::slice(e, {4, 0}, {1, -1}));
  };
  auto h = sc::function(rows);
  CHECK(same_bits(sc::Tensor(h(x)), rows(x)));
  // a slice also read outside the group stays a kernel (its result is needed there)
  const auto shared = [](const sc::Tensor& v) {
    const sc::Tensor s = sc::slice(v, {0, 2}, {-1, 4});
    return std::vector<sc::Tensor>{sc::exp(s) * s + 1.f, sc::sum(s, {1})};
  };
  auto k = sc::function(shared);
  const std::vector<sc::Tensor> got = k(x), want = shared(x);
  CHECK(same_bits(got[0], want[0]));
  CHECK(same_bits(got[1], want[1]));
  std::map<std::string, int> ops;
  for (const sc::graph::Node& n : k.get_concrete(x).graph().nodes) ++ops[std::string(n.name())];
  CHECK(ops["slice"] == 1);
}

TEST_CASE("function: independent groups of one shape are one group, unless a kernel between needs the first",
          "[function][fusion]") {
  const FuseAll fuse_all;
  const sc::Tensor x = sc::random::uniform({6, 6}, -2.0, 2.0, 81), w = sc::random::uniform({6, 6}, -1.0, 1.0, 82);
  const auto same = [](const std::vector<sc::Tensor>& a, const std::vector<sc::Tensor>& b) {
    bool ok = a.size() == b.size();
    for (std::size_t k = 0; ok && k < a.size(); ++k) ok = same_bits(a[k], b[k]);
    return ok;
  };
  // two chains reading x, neither reading the other: one pass
  const auto siblings = [](const sc::Tensor& v) {
    return std::vector<sc::Tensor>{sc::exp(v) * 2.f, sc::tanh(v) + 1.f, sc::sigmoid(v) - v};
  };
  auto f = sc::function(siblings);
  CHECK(same(f(x), siblings(x)));
  INFO(f.get_concrete(x).stats());
  CHECK(f.get_concrete(x).stats().plan.kernels == 1);
  // the second chain reads a product of the first's result: the first runs before the product
  const auto chained = [&w](const sc::Tensor& v) {
    const sc::Tensor a = sc::exp(v) * 2.f;
    return std::vector<sc::Tensor>{a, (v + 1.f) * sc::matmul(a, w)};
  };
  auto h = sc::function(chained);
  CHECK(same(h(x), chained(x)));
  CHECK(h.get_concrete(x).stats().plan.kernels == 3);
  // on the CPU, updates of variables of one shape stay one group each (an Adam update is then
  // the compiled Adam loop): two assignments, two groups
  sc::Variable va(sc::random::uniform({40, 40}, -1.0, 1.0, 84)), vb(sc::random::uniform({40, 40}, -1.0, 1.0, 85));
  auto upd = sc::function([&](const sc::Tensor& v) {
    va.assign(va * 0.5f + v);
    vb.assign(vb * 0.25f - v);
    return v;
  });
  const sc::Tensor u = sc::random::uniform({40, 40}, -1.0, 1.0, 86);
  const std::vector<float> a0 = va.value().to_vector<float>(), b0 = vb.value().to_vector<float>(), uv = u.to_vector<float>();
  (void)upd(u);
  CHECK(upd.get_concrete(u).stats().plan.kernels == 2);
  const std::vector<float> a1 = va.value().to_vector<float>(), b1 = vb.value().to_vector<float>();
  for (std::size_t i = 0; i < uv.size(); ++i) {
    CHECK(a1[i] == a0[i] * 0.5f + uv[i]);
    CHECK(b1[i] == b0[i] * 0.25f - uv[i]);
  }
  // ... and a traced Adam step over two such layers runs both weights' updates specialized
  sc::graph::fusion_min_elements() = fuse_all.saved;
  sc::manual_seed(4);
  sc::nn::Dense l1(32, 32), l2(32, 32);  // (the weights' updates reach fusion_min_elements)
  sc::optim::Adam opt(0.01);
  std::vector<sc::Variable> vars = l1.trainable_variables();
  for (const auto& v : l2.trainable_variables()) vars.push_back(v);
  auto step = sc::function([&](const sc::Tensor& v) {
    sc::GradientTape tape;
    const sc::Tensor loss = sc::sum(l2(sc::tanh(l1(v))));
    opt.apply(tape.gradient(loss, vars), vars);
    return loss;
  });
  const sc::Tensor in = sc::random::uniform({3, 32}, -1.0, 1.0, 83);
  (void)step(in);
  INFO(step.get_concrete(in).stats());
  CHECK(step.get_concrete(in).stats().plan.specialized == (sc::graph::fused_specializations() ? 2 : 0));
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

TEST_CASE("function: small elementwise chains are not fused (the tile evaluator costs more there)", "[function][fusion]") {
  auto f = sc::function([](sc::Tensor x) { return sc::tanh(x * 2.f + 1.f); });
  CHECK(f.get_concrete(sc::ones({64})).stats().plan.fused_groups == 0);
  CHECK(f.get_concrete(sc::ones({4096})).stats().plan.fused_groups == 1);
  const sc::Tensor x = sc::random::normal({4096}, 9);
  CHECK(f(x).to_vector<float>() == sc::tanh(x * 2.f + 1.f).to_vector<float>());
}

TEST_CASE("function: a matmul's bias and activation run as its epilogue, in the matmul's step", "[function][fusion]") {
  const sc::Tensor w = sc::random::normal({64, 48}, 1), b = sc::random::normal({48}, 2);
  auto layer = [&](const sc::Tensor& x) { return sc::relu(sc::matmul(x, w) + b); };
  auto f = sc::function(layer);
  const sc::Tensor x = sc::random::normal({100, 64}, 3);  // 4800 outputs: fused
  const auto st = f.get_concrete(x).stats();
  CHECK(st.plan.epilogues == 1);
  CHECK(st.plan.fused_groups == 1);
  CHECK(st.plan.steps == 1);    // matmul + add + relu: one step
  CHECK(st.plan.kernels == 2);  // the GEMM and one pass over its result
  check_same(f(x), layer(x));
  // The matmul's result is also needed elsewhere (returned): still one step, kept whole.
  auto g = sc::function([&](const sc::Tensor& in) {
    const sc::Tensor h = sc::matmul(in, w);
    return std::make_tuple(sc::tanh(h + b), h);
  });
  const auto [y, h] = g(x);
  check_same(y, sc::tanh(sc::matmul(x, w) + b));
  check_same(h, sc::matmul(x, w));
  CHECK(g.get_concrete(x).stats().plan.epilogues == 1);
  // Read by another node before the group runs: no epilogue, same numbers.
  auto k = sc::function([&](const sc::Tensor& in) {
    const sc::Tensor m = sc::matmul(in, w);
    const sc::Tensor s = sc::sum(m);             // reads m before the group below
    return sc::exp(-(m + b)) * s;
  });
  check_same(k(x), [&] {
    const sc::Tensor m = sc::matmul(x, w);
    return sc::exp(-(m + b)) * sc::sum(m);
  }(), 1e-6);
}

TEST_CASE("function: a sum, max or min over trailing axes consumes the fused group", "[function][fusion]") {
  const sc::Tensor x = sc::random::normal({64, 300}, 4), y = sc::random::normal({64, 300}, 5);
  auto mse = [](const sc::Tensor& a, const sc::Tensor& b) { return sc::sum(sc::square(a - b) * 0.5f); };
  auto f = sc::function(mse);
  const auto st = f.get_concrete(x, y).stats();
  CHECK(st.plan.fused_reductions == 1);
  CHECK(st.plan.steps == 1);
  check_same(f(x, y), mse(x, y), 1e-6);
  // Row reductions (softmax's max and sum) and a value also used after the reduction.
  auto rows = [](const sc::Tensor& a) {
    const sc::Tensor e = sc::exp(a * 2.f - 1.f);
    return std::make_tuple(sc::max(sc::tanh(a) + 1.f, {-1}), sc::sum(e, {-1}, true), e * 3.f);
  };
  auto g = sc::function(rows);
  const auto [m, s, e3] = g(x);
  const auto [m0, s0, e30] = rows(x);
  check_same(m, m0);  // max: exactly
  check_same(s, s0, 1e-6);
  check_same(e3, e30);
  CHECK(g.get_concrete(x).stats().plan.fused_reductions == 2);
  // Leading axes (a bias gradient's sum over the batch) are not fused, and stay right.
  auto lead = [](const sc::Tensor& a) { return sc::sum(sc::relu(a) * 2.f, {0}); };
  auto h = sc::function(lead);
  CHECK(h.get_concrete(x).stats().plan.fused_reductions == 0);
  check_same(h(x), lead(x), 1e-6);
}
