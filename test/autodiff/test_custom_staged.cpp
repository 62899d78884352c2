// Recording control in staged code. sc::custom_gradient: a traced call keeps its rule (the
// staged function's gradient is the rule's, as eagerly; before, it was silently the forward
// ops'), a plan runs the forward ops as if the call were not there (fused across it), a saved
// function runs forward and refuses to differentiate through the rule it could not keep, and a
// forward pass with several results has one rule called once per backward pass.
// GradientTape::StopRecording: values made while paused carry no gradient in staged code either.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "files.hpp"
#include "testing.hpp"

using sc::Tensor;
using sctest::check_close;
using sctest::error_of;

namespace {

std::vector<double> vals(const Tensor& t) { return t.to_vector<double>(); }
std::string at_line(int line) { return "test_custom_staged.cpp:" + std::to_string(line); }

constexpr int clip_line = __LINE__ + 4;  // clip_grad's call of custom_gradient

/// Identity forward, gradient clipped to [-1, 1] (the gradient of the ops would be 1 * g).
Tensor clip_grad(const Tensor& x) {
  return sc::custom_gradient([](const std::vector<Tensor>& xs) { return xs[0] * 1.0; },
                             [](const Tensor& g, const std::vector<Tensor>&, const Tensor&) {
                               return std::vector<Tensor>{sc::minimum(sc::maximum(g, -1.0), 1.0)};
                             },
                             {x});
}

/// exp with its rule written through its result: second derivatives go through y.
Tensor my_exp(const Tensor& x) {
  return sc::custom_gradient([](const std::vector<Tensor>& xs) { return sc::exp(xs[0]); },
                             [](const Tensor& g, const std::vector<Tensor>&, const Tensor& y) {
                               return std::vector<Tensor>{g * y};
                             },
                             {x});
}

/// (sin x * w, cos x * w) with a hand-written rule for both results, counting its calls.
std::vector<Tensor> sincos(const Tensor& x, const Tensor& w, int* calls) {
  return sc::custom_gradient(
      [](const std::vector<Tensor>& xs) {
        return std::vector<Tensor>{sc::sin(xs[0]) * xs[1], sc::cos(xs[0]) * xs[1]};
      },
      [calls](const std::vector<Tensor>& g, const std::vector<Tensor>& xs, const std::vector<Tensor>&) {
        ++*calls;
        const Tensor s = sc::sin(xs[0]), c = sc::cos(xs[0]);
        const Tensor gx = (g[0] * c - g[1] * s) * xs[1];
        const Tensor gw = sc::sum(g[0] * s + g[1] * c);
        return std::vector<Tensor>{gx, gw};
      },
      {x, w});
}

std::vector<Tensor> grads_of(const std::function<Tensor(const Tensor&, const Tensor&)>& loss, const Tensor& x,
                             const Tensor& w) {
  sc::GradientTape tape;
  tape.watch({x, w});
  return tape.gradient(loss(x, w), {x, w});
}

int count_kind(const sc::graph::Graph& g, sc::graph::NodeKind k) {
  int n = 0;
  for (const auto& node : g.nodes) n += node.kind == k;
  return n;
}

}  // namespace

TEST_CASE("custom_gradient in sc::function: the staged gradient is the rule's, as eagerly", "[autodiff][custom][function]") {
  const Tensor x = sc::tensor({1.0, 2.0, 3.0}), scale = sc::tensor({0.5, 5.0, -3.0});
  auto body = [&](const Tensor& in) { return sc::sum(clip_grad(in * 2.0) * scale); };
  auto f = sc::function(body);
  const std::vector<double> want{1.0, 2.0, -2.0};  // 2 * clip(scale)
  {
    sc::GradientTape t;  // one tape: the forward/backward pair
    t.watch(x);
    const Tensor eager = body(x);
    CHECK(vals(t.gradient(eager, x)) == want);
  }
  {
    sc::GradientTape t;
    t.watch(x);
    const Tensor y = f(x);
    CHECK(y.item<double>() == Approx(1.0 + 20.0 - 18.0));
    CHECK(vals(t.gradient(y, x)) == want);
  }
  {
    sc::GradientTape outer;  // nested tapes: the staged backward function
    outer.watch(x);
    sc::GradientTape t;
    t.watch(x);
    CHECK(vals(t.gradient(f(x), x)) == want);
  }
  // The graph keeps the call (for gradients); the plan runs the forward ops alone, fused as
  // they would be without it.
  const sc::ConcreteFunction cf = f.get_concrete(x);
  CHECK(count_kind(cf.graph(), sc::graph::NodeKind::custom_gradient) == 1);
  CHECK(count_kind(cf.plan().graph(), sc::graph::NodeKind::custom_gradient) == 0);
  const sc::ConcreteFunction plain = sc::function([&](const Tensor& in) { return sc::sum((in * 2.0) * 1.0 * scale); }).get_concrete(x);
  CHECK(cf.stats().plan.kernels == plain.stats().plan.kernels);
  CHECK(cf.stats().plan.steps == plain.stats().plan.steps);
}

TEST_CASE("custom_gradient in a function called from another traced function keeps its rule", "[autodiff][custom][function]") {
  auto inner = sc::function([](const Tensor& in) { return clip_grad(in * 3.0); });
  auto outer = sc::function([&](const Tensor& in) { return sc::sum(Tensor(inner(in)) * 5.0); });
  const Tensor x = sc::tensor({1.0, -2.0});
  sc::GradientTape t;
  t.watch(x);
  CHECK(vals(t.gradient(outer(x), x)) == std::vector<double>{3, 3});  // clip(5) * 3; the ops' would be 15
}

TEST_CASE("custom_gradient in sc::function: second derivatives through a rule written with its result", "[autodiff][custom][function]") {
  auto f = sc::function([](const Tensor& s) { return my_exp(s * 2.0); });
  const Tensor s = sc::scalar(0.5);
  sc::GradientTape outer;
  outer.watch(s);
  Tensor d1;
  {
    sc::GradientTape inner;
    inner.watch(s);
    d1 = inner.gradient(f(s), s);  // 2 e^(2s)
  }
  CHECK(d1.item<double>() == Approx(2 * std::exp(1.0)));
  CHECK(outer.gradient(d1, s).item<double>() == Approx(4 * std::exp(1.0)));
  // A gradient taken inside the traced function runs the rule inside the trace.
  auto grad_inside = sc::function([](const Tensor& in) {
    sc::GradientTape t;
    t.watch(in);
    return t.gradient(my_exp(in * 3.0), in);
  });
  CHECK(grad_inside(s).item<double>() == Approx(3 * std::exp(1.5)));
}

TEST_CASE("custom_gradient with several results: one rule call per backward pass, zeros for unused results", "[autodiff][custom]") {
  const Tensor x = sc::tensor({0.3, -1.2, 2.0}), w = sc::scalar(1.5);
  for (int used = 0; used < 3; ++used) {
    INFO("results used: " << used);
    int calls = 0;
    auto loss = [&](const Tensor& a, const Tensor& b) {
      const auto r = sincos(a, b, &calls);
      if (used == 0) return sc::sum(r[0] * r[0]);
      if (used == 1) return sc::sum(r[1]);
      return sc::sum(r[0] * r[0]) + sc::sum(r[1]);
    };
    const auto g = grads_of(loss, x, w);
    CHECK(calls == 1);
    // The reference: the same loss through the ops.
    auto ops_loss = [&](const Tensor& a, const Tensor& b) {
      const Tensor r0 = sc::sin(a) * b, r1 = sc::cos(a) * b;
      if (used == 0) return sc::sum(r0 * r0);
      if (used == 1) return sc::sum(r1);
      return sc::sum(r0 * r0) + sc::sum(r1);
    };
    const auto want = grads_of(ops_loss, x, w);
    check_close(vals(g[0]), vals(want[0]), 1e-12);
    check_close(vals(g[1]), vals(want[1]), 1e-12);
  }
  // Finite differences, and the results' values.
  int calls = 0;
  const auto r = sincos(x, w, &calls);
  check_close(vals(r[0]), vals(sc::sin(x) * w), 0);
  const auto check = sc::check_gradients(
      [&](const std::vector<Tensor>& in) {
        const auto s = sincos(in[0], in[1], &calls);
        return s[0] * 2.0 + s[1];
      },
      {x, w});
  CHECK(check.ok);
  INFO(check.report);
}

TEST_CASE("custom_gradient with several results in sc::function, under cond, and with an integer result", "[autodiff][custom][function]") {
  const Tensor x = sc::tensor({0.3, -1.2, 2.0}), w = sc::scalar(1.5);
  int calls = 0;
  auto body = [&](const Tensor& a, const Tensor& b) {
    const auto r = sincos(a, b, &calls);
    return sc::sum(r[0] * r[0]) + sc::sum(r[1]) * 3.0;
  };
  auto f = sc::function(body);
  const auto want = grads_of(body, x, w);
  for (int tapes = 1; tapes <= 2; ++tapes) {
    INFO("tapes: " << tapes);
    std::vector<Tensor> got;
    if (tapes == 1) {
      got = grads_of([&](const Tensor& a, const Tensor& b) { return f(a, b); }, x, w);
    } else {
      sc::GradientTape outer;
      outer.watch({x, w});
      got = grads_of([&](const Tensor& a, const Tensor& b) { return f(a, b); }, x, w);
    }
    check_close(vals(got[0]), vals(want[0]), 1e-12);
    check_close(vals(got[1]), vals(want[1]), 1e-12);
  }
  // Inside a cond branch (its gradient replays the branch).
  auto g = sc::function([](const Tensor& a, const Tensor& p) {
    return sc::cond(p, [&] { return clip_grad(a) * 4.0; }, [&] { return a * 4.0; });
  });
  sc::GradientTape t;
  t.watch(x);
  CHECK(vals(t.gradient(sc::sum(g(x, sc::scalar(true))), x)) == std::vector<double>{1, 1, 1});
  // An integer result carries no gradient: the rule gets an undefined one for it.
  sc::GradientTape t2;
  t2.watch(x);
  const auto m = sc::function([](const Tensor& a) {
    const auto r = sc::custom_gradient(
        [](const std::vector<Tensor>& xs) { return std::vector<Tensor>{xs[0] * 2.0, sc::cast(xs[0], sc::i64)}; },
        [](const std::vector<Tensor>& gs, const std::vector<Tensor>&, const std::vector<Tensor>&) {
          return std::vector<Tensor>{gs[0] * 10.0};
        },
        {a});
    return std::make_tuple(r[0], r[1]);
  });
  const auto [m0, m1] = m(x);
  CHECK(vals(t2.gradient(sc::sum(m0), x)) == std::vector<double>{10, 10, 10});
  CHECK(m1.dtype() == sc::i64);
  bool undefined_int = false;
  sc::GradientTape t3;
  t3.watch(x);
  const auto again = sc::custom_gradient(
      [](const std::vector<Tensor>& xs) { return std::vector<Tensor>{xs[0] * 2.0, sc::cast(xs[0], sc::i64)}; },
      [&](const std::vector<Tensor>& gs, const std::vector<Tensor>&, const std::vector<Tensor>&) {
        undefined_int = !gs[1].defined();
        return std::vector<Tensor>{gs[0] * 2.0};
      },
      {x});
  CHECK(vals(t3.gradient(sc::sum(again[0]), x)) == std::vector<double>{2, 2, 2});
  CHECK(undefined_int);
}

TEST_CASE("custom_gradient: a saved function runs forward and refuses the gradient it could not keep", "[autodiff][custom][serialize]") {
  sctest::TempDir dir;
  const Tensor x = sc::tensor({1.0, -2.0});
  auto f = sc::function([](const Tensor& in) { return clip_grad(in) * 3.0 + 1.0; });
  const sc::ConcreteFunction cf = f.get_concrete(x);
  const auto path = (dir.path / "clip.scg").string();
  cf.save(path);
  const sc::ConcreteFunction loaded = sc::load_function(path);
  CHECK(vals(loaded(x)[0]) == std::vector<double>{4, -5});
  sc::GradientTape t;
  t.watch(x);
  const Tensor y = sc::sum(loaded(x)[0]);
  const std::string msg = error_of<sc::StagingError>([&] { (void)t.gradient(y, x); });
  CHECK_THAT(msg, Catch::Contains("[custom_gradient]") && Catch::Contains("saved function does not keep") &&
                      Catch::Contains(at_line(clip_line)));
}

TEST_CASE("custom_gradient in sc::function: a trainable variable the forward pass reads must be an input", "[autodiff][custom][function]") {
  // Before, the staged gradient silently gave w none: the rule cannot, and the forward ops are not recorded.
  sc::Variable w(sc::tensor({2.0, 3.0}), "w");
  const Tensor x = sc::tensor({1.0, 1.0});
  auto pass_on = [](const Tensor& g, const std::vector<Tensor>&, const Tensor&) { return std::vector<Tensor>{g}; };
  const int line = __LINE__ + 2;
  auto f = sc::function([&](const Tensor& in) {
    return sc::sum(sc::custom_gradient([&w](const std::vector<Tensor>& xs) { return xs[0] * w; }, pass_on, {in}));
  });
  CHECK(f(x).item<double>() == 5.0);  // forward alone: nothing is lost
  {
    sc::GradientTape t;
    t.watch(x);
    const std::string msg = error_of<sc::ValueError>([&] { (void)t.gradient(f(x), x); });
    CHECK_THAT(msg, Catch::Contains("[custom_gradient] the forward function read trainable variable 'w', which is not "
                                    "one of the inputs") && Catch::Contains(at_line(line)));
  }
  // Passed in (read inside the trace, outside the forward function): the rule's gradient reaches it.
  auto g = sc::function([&](const Tensor& in) {
    return sc::sum(sc::custom_gradient(
        [](const std::vector<Tensor>& xs) { return xs[0] * xs[1]; },
        [](const Tensor& gy, const std::vector<Tensor>& xs, const Tensor&) { return std::vector<Tensor>{gy * xs[1], gy * xs[0] * 10.0}; },
        {in, w.value()}));
  });
  {
    sc::GradientTape t;
    CHECK(vals(t.gradient(g(x), std::vector<sc::Variable>{w})[0]) == std::vector<double>{10, 10});
  }
  // A read the user paused inside the forward function, or a variable that is not trainable.
  sc::Variable c(sc::tensor({2.0, 3.0}), "c", /*trainable=*/false);
  auto h = sc::function([&](const Tensor& in) {
    const Tensor a = sc::custom_gradient(
        [&w](const std::vector<Tensor>& xs) {
          sc::GradientTape::StopRecording constant;
          return xs[0] * w;
        },
        pass_on, {in});
    return sc::sum(a + sc::custom_gradient([&c](const std::vector<Tensor>& xs) { return xs[0] * c; }, pass_on, {in}));
  });
  sc::GradientTape t;
  t.watch(x);
  CHECK(vals(t.gradient(h(x), x)) == std::vector<double>{2, 2});
}

TEST_CASE("custom_gradient: bad forward or backward functions are reported", "[autodiff][custom][errors]") {
  const Tensor x = sc::tensor({1.0});
  const int line = __LINE__ + 1;
  const std::string empty = error_of<sc::ValueError>([&] { sc::custom_gradient(nullptr, sc::CustomBackward{}, {x}); });
  CHECK_THAT(empty, Catch::Contains("[custom_gradient]") && Catch::Contains("empty") && Catch::Contains(at_line(line)));
  const std::string none = error_of<sc::ValueError>([&] {
    sc::custom_gradient([](const std::vector<Tensor>&) { return std::vector<Tensor>{}; },
                        [](const std::vector<Tensor>&, const std::vector<Tensor>&, const std::vector<Tensor>&) {
                          return std::vector<Tensor>{};
                        },
                        {x});
  });
  CHECK_THAT(none, Catch::Contains("returned no tensors"));
  // A rule returning the wrong count, staged: reported when the gradient is taken.
  auto f = sc::function([](const Tensor& in) {
    return sc::custom_gradient([](const std::vector<Tensor>& xs) { return xs[0] * 2.0; },
                               [](const Tensor& g, const std::vector<Tensor>&, const Tensor&) {
                                 return std::vector<Tensor>{g, g};
                               },
                               {in});
  });
  const int rule_line = __LINE__ - 6;  // the custom_gradient call above
  sc::GradientTape t;
  t.watch(x);
  // (a single tape stages the call's backward half at the call, which runs the rule)
  CHECK_THAT(error_of<sc::ValueError>([&] { (void)t.gradient(f(x), x); }),
             Catch::Contains("[custom_gradient] gradient rule returned 2 gradients for 1 inputs") &&
                 Catch::Contains(at_line(rule_line)));
  // A symbolic tensor that escaped its trace.
  Tensor escaped;
  auto leak = sc::function([&](const Tensor& in) {
    escaped = in * 2.0;
    return in;
  });
  leak(x);
  CHECK_THAT(error_of<sc::StagingError>([&] { (void)clip_grad(escaped); }), Catch::Contains("escaped"));
}

// ---- GradientTape::StopRecording inside staged code ------------------------------------------

TEST_CASE("StopRecording in sc::function: values made while paused carry no gradient, as eagerly", "[autodiff][function][stop]") {
  // Before: the staged gradient replayed the paused ops as recorded ones (4x, 8x instead of 2x, 4x).
  const Tensor x = sc::tensor({1.0, 2.0, -0.5});
  auto body = [](const Tensor& in) {
    Tensor y;
    {
      sc::GradientTape::StopRecording quiet;
      y = sc::exp(in) * 2.0;
    }
    return sc::sum(y * in);
  };
  auto only_paused = [](const Tensor& in) {  // a result made wholly while paused
    sc::GradientTape::StopRecording quiet;
    return sc::sum(in * in);
  };
  auto in_branch = [](const Tensor& in, const Tensor& p) {
    return sc::cond(
        p,
        [&] {
          Tensor y;
          {
            sc::GradientTape::StopRecording quiet;
            y = in * 3.0;
          }
          return y * in;
        },
        [&] { return in * 3.0; });
  };
  const auto eager_grad = [&](const auto& fn, const auto&... extra) {
    sc::GradientTape t;
    t.watch(x);
    return vals(t.gradient(sc::sum(fn(x, extra...)), x));
  };
  auto f = sc::function(body);
  auto g = sc::function(only_paused);
  auto h = sc::function(in_branch);
  const Tensor yes = sc::scalar(true);
  for (const bool nested : {false, true}) {
    INFO("nested tapes: " << nested);
    std::optional<sc::GradientTape> outer;
    if (nested) outer.emplace();
    check_close(eager_grad(f), eager_grad(body), 1e-12);
    CHECK(eager_grad(g) == std::vector<double>{0, 0, 0});
    CHECK(eager_grad(only_paused) == std::vector<double>{0, 0, 0});
    check_close(eager_grad(h, yes), eager_grad(in_branch, yes), 1e-12);
  }
  const std::vector<double> want = eager_grad(body);
  check_close(want, vals(sc::exp(x) * 2.0), 1e-12);
  // In a while_loop body: a <- (2a) * a with 2a made while paused, three rounds: d/da = 2a per
  // round (x = 1: 2 * 4 * 16).
  auto loop = sc::function([](const Tensor& in) {
    return sc::while_loop([](const Tensor& i, const Tensor&) { return i < 3; },
                          [](const Tensor& i, const Tensor& a) {
                            Tensor b;
                            {
                              sc::GradientTape::StopRecording quiet;
                              b = a * 2.0;
                            }
                            return std::make_tuple(i + 1, b * a);
                          },
                          std::make_tuple(sc::scalar(std::int64_t{0}), in));
  });
  const Tensor x2 = sc::tensor({1.0, 2.0});
  sc::GradientTape t;
  t.watch(x2);
  const auto [rounds, a] = loop(x2);
  CHECK(rounds.item<std::int64_t>() == 3);
  CHECK(vals(t.gradient(sc::sum(a), x2)) == std::vector<double>{128, 16384});
}

TEST_CASE("StopRecording in sc::function: an optimizer step traced inside adds no stop_gradient nodes", "[autodiff][function][stop]") {
  // Its updates are made while paused and only assigned: nothing reads them after the pause.
  sc::Variable w(sc::tensor({0.5, -1.0}), "w");
  sc::optim::SGD opt(0.1, 0.9);
  auto step = sc::function([&](const Tensor& x) {
    sc::GradientTape t;
    const Tensor loss = sc::sum(sc::square(x * w.value()));
    opt.apply(t.gradient(loss, std::vector<sc::Variable>{w}), std::vector<sc::Variable>{w});
    return loss;
  });
  const Tensor x = sc::tensor({1.0, 2.0});
  step(x);
  int stops = 0;
  for (const auto& n : step.get_concrete(x).traced_graph().nodes)
    stops += n.kind == sc::graph::NodeKind::op && n.op == sc::ops::OpId::StopGradient && n.attrs.i0 == 0;
  CHECK(stops == 0);
}
