// Calls with several results (a staged function, cond, while_loop, host_fn) are one tape entry:
// the call's backward pass runs once for all its results, whichever of them the loss used, and
// gives the gradients eager code gives.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <tuple>
#include <vector>

#include "testing.hpp"

namespace {

void check_close(const sc::Tensor& a, const sc::Tensor& b, double tol = 1e-5) {
  REQUIRE(a.shape() == b.shape());
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("element " << i << ": " << x[i] << " vs " << y[i]);
    CHECK(std::abs(x[i] - y[i]) <= tol * (1 + std::abs(y[i])));
  }
}

/// A host_fn that passes its input through and counts how often its gradient runs (once per
/// backward pass of whatever contains it).
struct CountedIdentity {
  int* grads;
  sc::Tensor operator()(const sc::Tensor& x) const {
    auto id = [](const std::vector<sc::Tensor>& in) { return std::vector<sc::Tensor>{in[0] * 1.f}; };
    int* n = grads;
    auto grad = [n](const std::vector<sc::Tensor>&, const std::vector<sc::Tensor>&, const std::vector<sc::Tensor>& g) {
      ++*n;
      return std::vector<sc::Tensor>{g[0]};
    };
    return sc::host_fn(id, {x}, {sc::TensorSpec{x.shape(), x.dtype()}}, grad)[0];
  }
};

/// The nodes of g's graph for which pred holds.
template <class Pred>
int count_nodes(const sc::ConcreteFunction& g, Pred pred) {
  return static_cast<int>(std::count_if(g.graph().nodes.begin(), g.graph().nodes.end(), pred));
}

/// For each set of watched arguments (w, x, both), under one tape (the split backward) and under
/// nested tapes (the backward those use): the staged f's gradients of (x, w) equal body's eager
/// ones, zeros for an unwatched argument. `before` runs before each staged call, `after(want)`
/// after its gradient (bit 0: w watched, bit 1: x).
template <class F, class Body>
void check_wanted_gradients(F& f, Body& body, const sc::Tensor& x, const sc::Tensor& w,
                            const std::function<void()>& before, const std::function<void(int)>& after) {
  for (const bool nested : {false, true}) {
    INFO("nested tapes: " << nested);
    for (int want = 1; want <= 3; ++want) {
      INFO("wanted: " << want);
      std::optional<sc::GradientTape> outer;
      if (nested) outer.emplace();
      sc::GradientTape tape;
      if (want & 1) tape.watch(w);
      if (want & 2) tape.watch(x);
      before();
      const sc::Tensor loss = sc::sum(f(x, w));
      const auto gs = tape.gradient(loss, std::vector<sc::Tensor>{x, w});
      after(want);
      sc::GradientTape te;
      te.watch(x);
      te.watch(w);
      const auto ge = te.gradient(sc::sum(body(x, w)), std::vector<sc::Tensor>{x, w});
      check_close(gs[0], want & 2 ? ge[0] : sc::zeros(x.shape()));
      check_close(gs[1], want & 1 ? ge[1] : sc::zeros(w.shape()));
    }
  }
}

}  // namespace

TEST_CASE("joint gradient: a staged function's results share one tape entry and one backward run",
          "[function][grad][joint]") {
  int grads = 0;
  const CountedIdentity counted{&grads};
  auto body = [&](sc::Tensor x, sc::Tensor w) {
    const sc::Tensor h = counted(sc::tanh(sc::matmul(x, w)));
    return std::make_tuple(sc::exp(h) * 2.f, h * h, sc::sum(h));
  };
  auto f = sc::function(body);
  const sc::Tensor x = sc::random::normal({5, 4}, 3), w = sc::random::normal({4, 3}, 4);
  auto loss_of = [](const sc::Tensor& a, const sc::Tensor& b, const sc::Tensor& c, int used) {
    sc::Tensor loss = sc::sum(a * a);
    if (used > 1) loss = loss + sc::sum(b);
    if (used > 2) loss = loss + c * 3.f;
    return loss;
  };
  for (int used = 1; used <= 3; ++used) {
    INFO("results used: " << used);
    f(x, w);  // (traced once)
    sc::GradientTape ts;
    ts.watch(w);
    auto [a, b, c] = f(x, w);
    CHECK(ts.size() == 1);  // the call, whatever the number of results
    grads = 0;
    const sc::Tensor gs = ts.gradient(loss_of(a, b, c, used), w);
    CHECK(grads == 1);  // the staged backward ran once (it ran once per result before)
    sc::GradientTape te;
    te.watch(w);
    auto [ae, be, ce] = body(x, w);
    check_close(gs, te.gradient(loss_of(ae, be, ce, used), w));
  }
  CHECK(f.trace_count() == 1);
}

TEST_CASE("joint gradient: under nested tapes a staged function's second derivatives equal eager ones",
          "[function][grad][joint]") {
  auto body = [](sc::Tensor x, sc::Tensor w) {
    const sc::Tensor h = sc::tanh(sc::matmul(x, w));
    return std::make_tuple(h * h, sc::exp(h));
  };
  auto f = sc::function(body);
  const sc::Tensor x = sc::random::normal({3, 4}, 5), w = sc::random::normal({4, 2}, 6);
  auto second = [&](auto&& fn) {
    sc::GradientTape outer;
    outer.watch(w);
    sc::Tensor g;
    {
      sc::GradientTape inner;
      inner.watch(w);
      auto [p, q] = fn(x, w);
      g = inner.gradient(sc::sum(p) + sc::sum(q * q), w);
    }
    return std::make_tuple(g, outer.gradient(sc::sum(g * g), w));
  };
  auto [gs, hs] = second(f);
  auto [ge, he] = second(body);
  check_close(gs, ge);
  check_close(hs, he, 1e-4);
  sc::GradientTape t1, t2;  // two tapes: the whole function's staged backward, one entry on each
  t1.watch(w);
  t2.watch(w);
  f(x, w);
  CHECK(t1.size() == 1);
  CHECK(t2.size() == 1);
}

TEST_CASE("joint gradient: results that are an argument, or one value twice, count once each", "[function][grad][joint]") {
  const sc::Tensor x = sc::tensor({0.5f, -1.5f, 2.f});
  auto f = sc::function([](sc::Tensor v) {
    const sc::Tensor y = v * 2.f;
    return std::make_tuple(v, y, y);
  });
  sc::GradientTape tape;
  tape.watch(x);
  auto [a, b, c] = f(x);
  // d/dv of sum(v) + sum(2v) * 3 + sum(2v)^2 / 2.
  const sc::Tensor loss = sc::sum(a) + sc::sum(b) * 3.f + sc::sum(c) * sc::sum(c) * 0.5f;
  const float s = 2.f * (0.5f - 1.5f + 2.f);
  check_close(tape.gradient(loss, x), sc::full({3}, 1.f + 6.f + 2.f * s));
}

TEST_CASE("joint gradient: a staged while_loop's float results share one entry, its backward loop runs once",
          "[while][grad][joint]") {
  int grads = 0;
  const CountedIdentity counted{&grads};
  const sc::Tensor a = sc::tensor({0.3f, -0.2f});
  std::size_t entries = 0;
  auto grads_of = [&](const sc::Tensor& x, const sc::Tensor& s, bool staged) {
    sc::GradientTape tape;
    tape.watch(x);
    tape.watch(s);
    auto [u, v, n] = sc::while_loop(
        [](sc::Tensor, sc::Tensor, sc::Tensor k) { return k < std::int64_t{3}; },
        [&](sc::Tensor p, sc::Tensor q, sc::Tensor k) {
          return std::make_tuple(sc::tanh(counted(p) * s + a), q * p + 1.f, k + std::int64_t{1});
        },
        std::make_tuple(x, x * 0.5f, sc::scalar(std::int64_t{0})));
    (void)n;
    if (staged) entries = tape.size();
    return tape.gradient(sc::sum(u * u) + sc::sum(v), std::vector<sc::Tensor>{x, s});
  };
  auto staged = sc::function([&](sc::Tensor x, sc::Tensor s) { return grads_of(x, s, true); });
  const sc::Tensor x = sc::tensor({0.7f, -1.1f}), s = sc::tensor({1.3f, 0.9f});
  staged(x, s);  // traced
  grads = 0;
  const auto gt = staged(x, s);
  // One backward loop: 3 rounds, each the host_fn's gradient once (one loop per float result
  // ran it 6 times).
  CHECK(grads == 3);
  CHECK(entries == 2);  // x * 0.5 and the loop
  const auto ge = grads_of(x, s, false);
  check_close(gt[0], ge[0]);
  check_close(gt[1], ge[1]);
}

TEST_CASE("joint gradient: a staged cond's results share one entry, an unused result's gradient is zero",
          "[cond][grad][joint]") {
  std::size_t entries = 0;
  auto grads_of = [&](const sc::Tensor& x, bool both, bool staged) {
    sc::GradientTape tape;
    tape.watch(x);
    auto [p, q] = sc::cond(
        sc::sum(x) > 0.f, [&] { return std::make_tuple(sc::tanh(x) * 3.f, x * x); },
        [&] { return std::make_tuple(x * x - 1.f, sc::exp(x)); });
    if (staged) entries = tape.size();
    const sc::Tensor loss = both ? sc::sum(p * q) : sc::sum(q);
    return tape.gradient(loss, x);
  };
  for (const bool both : {true, false}) {
    auto staged = sc::function([&](sc::Tensor x) { return grads_of(x, both, true); });
    for (const sc::Tensor& x : {sc::tensor({0.5f, 1.f, -0.2f}), sc::tensor({-0.5f, -1.f, 0.2f})}) {
      INFO("both results used: " << both << ", sum " << sc::sum(x).item<float>());
      check_close(staged(x), grads_of(x, both, false));
      CHECK(entries == 2);  // the predicate's sum and the cond
    }
  }
}

TEST_CASE("joint gradient: an eager host_fn's gradient runs once, with zeros for the results the loss did not use",
          "[host_fn][grad][joint]") {
  int runs = 0;
  std::vector<float> seen_second;
  auto fwd = [](const std::vector<sc::Tensor>& in) { return std::vector<sc::Tensor>{in[0] * 2.f, in[0] * in[0]}; };
  auto grad = [&](const std::vector<sc::Tensor>& in, const std::vector<sc::Tensor>&, const std::vector<sc::Tensor>& g) {
    ++runs;
    seen_second = g[1].to_vector<float>();
    return std::vector<sc::Tensor>{g[0] * 2.f + g[1] * in[0] * 2.f};
  };
  const sc::Tensor x = sc::tensor({1.f, -2.f});
  const sc::TensorSpec spec{x.shape(), x.dtype()};
  {
    sc::GradientTape tape;
    tape.watch(x);
    const auto ys = sc::host_fn(fwd, {x}, {spec, spec}, grad);
    CHECK(tape.size() == 1);
    check_close(tape.gradient(sc::sum(ys[0]) + sc::sum(ys[1]), x), sc::tensor({2.f + 2.f, 2.f - 4.f}));
    CHECK(runs == 1);
  }
  {
    sc::GradientTape tape;
    tape.watch(x);
    const auto ys = sc::host_fn(fwd, {x}, {spec, spec}, grad);
    check_close(tape.gradient(sc::sum(ys[0] * 3.f), x), sc::full({2}, 6.f));
    CHECK(runs == 2);
    CHECK(seen_second == std::vector<float>{0.f, 0.f});
  }
}

TEST_CASE("host_fn: its function's own ops are not recorded, a result that is its input counts once",
          "[host_fn][grad][joint]") {
  const sc::Tensor x = sc::tensor({1.f, -2.f});
  const sc::TensorSpec spec{x.shape(), x.dtype()};
  auto same = [](const std::vector<sc::Tensor>& in) { return std::vector<sc::Tensor>{in[0]}; };
  auto thrice = [](const std::vector<sc::Tensor>&, const std::vector<sc::Tensor>&, const std::vector<sc::Tensor>& g) {
    return std::vector<sc::Tensor>{g[0] * 3.f};
  };
  auto doubled = [](const std::vector<sc::Tensor>& in) { return std::vector<sc::Tensor>{in[0] * 2.f}; };
  auto grad_of = [&](const sc::graph::HostFn::Fn& fn, const sc::graph::HostFn::Grad& g, bool staged) {
    auto body = [&](sc::Tensor v) {
      sc::GradientTape tape;
      tape.watch(v);
      const sc::Tensor y = sc::host_fn(fn, {v}, {spec}, g)[0];
      return tape.gradient(sc::sum(y), v);
    };
    return staged ? sc::function(body)(x) : body(x);
  };
  for (const bool staged : {false, true}) {
    INFO("staged: " << staged);
    // The rule says 3: the identity fn's result is not x itself to the tape.
    check_close(grad_of(same, thrice, staged), sc::full({2}, 3.f));
    check_close(grad_of(doubled, thrice, staged), sc::full({2}, 3.f));  // the rule, not fn's ops
    check_close(grad_of(doubled, {}, staged), sc::zeros({2}));           // no rule: no gradient
  }
}

TEST_CASE("split_forward_backward: values made from constants are made again by the backward half, not kept",
          "[function][grad][split]") {
  // Joint graph of y = x[:, 1:3] * m * k, m a random mask, k a constant broadcast, reshaped and
  // cast: (x, seed) -> (y, dx), dx the slice's gradient, seed * m * k padded with zero fills.
  sc::graph::GraphBuilder b("joint", false);
  {
    sc::graph::TraceScope s(b);
    const sc::Tensor x = b.add_input({sc::Shape{2, 4}, sc::f32}, sc::Device::cpu());
    const sc::Tensor seed = b.add_input({sc::Shape{2, 2}, sc::f32}, sc::Device::cpu());
    sc::GradientTape tape;
    tape.watch(x);
    const sc::Tensor m = sc::cast(sc::random::uniform({2, 2}, 0.0, 1.0, 7) > 0.3f, sc::f32);
    const sc::Tensor k = sc::cast(sc::reshape(sc::broadcast_to(sc::tensor({2.0}), {4}), {2, 2}), sc::f32);
    const sc::Tensor y = sc::slice(x, {0, 1}, {-1, 2}) * m * k;
    b.set_outputs({y, tape.gradient(y, x, seed)}, std::source_location::current());
  }
  const sc::graph::SplitGraphs p = sc::graph::split_forward_backward(b.graph, 1, 1);
  sc::graph::verify(p.forward, "split");
  sc::graph::verify(p.backward, "split");
  CHECK(p.num_residuals == 1);  // the mask (random: kept); the zeros and k are made again
  auto fills = [](const sc::graph::Graph& g) {
    int n = 0;
    for (const sc::graph::Node& node : g.nodes) n += node.kind == sc::graph::NodeKind::op && node.op == sc::ops::OpId::Fill;
    return n;
  };
  CHECK(fills(p.backward) >= 1);  // (the slice gradient's zeros)
  const sc::Tensor x = sc::reshape(sc::arange(8.f), {2, 4}), seed = sc::tensor(std::vector<float>{1.f, -2.f, 3.f, 0.5f}, sc::Shape{2, 2});
  const auto fo = sc::graph::Plan(std::make_shared<const sc::graph::Graph>(p.forward)).run(std::vector<sc::Tensor>{x});
  const auto bo = sc::graph::Plan(std::make_shared<const sc::graph::Graph>(p.backward)).run(std::vector<sc::Tensor>{fo[1], seed});
  const auto mask = fo[1].to_vector<float>(), sd = seed.to_vector<float>(), dx = bo[0].to_vector<float>();
  REQUIRE(dx.size() == 8);
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 4; ++c) {
      const float want = c == 0 || c == 3 ? 0.f : sd[r * 2 + c - 1] * mask[r * 2 + c - 1] * 2.f;
      CHECK(dx[r * 4 + c] == want);
    }
}

TEST_CASE("split_forward_backward: values cheap ops make from fewer bytes are made again, not kept",
          "[function][grad][split]") {
  // Joint graph of y = layer_norm(x) over rows of 8 with gamma and beta: (x, gamma, beta, seed) ->
  // (y, dx, dgamma, dbeta). x - mean and xhat are [4, 8] like x but made from x and per-row values
  // by subtractions and products, so the backward half makes them again: no [4, 8] residual but x.
  const sc::Shape rows{4, 8};
  sc::graph::GraphBuilder b("joint", false);
  {
    sc::graph::TraceScope s(b);
    const sc::Tensor x = b.add_input({rows, sc::f32}, sc::Device::cpu());
    const sc::Tensor gamma = b.add_input({sc::Shape{8}, sc::f32}, sc::Device::cpu());
    const sc::Tensor beta = b.add_input({sc::Shape{8}, sc::f32}, sc::Device::cpu());
    const sc::Tensor seed = b.add_input({rows, sc::f32}, sc::Device::cpu());
    sc::GradientTape tape;
    tape.watch({x, gamma, beta});
    const sc::Tensor y = sc::nn::layer_norm(x, {8}, gamma, beta);
    std::vector<sc::Tensor> outs = tape.gradient(y, {x, gamma, beta}, seed);
    outs.insert(outs.begin(), y);
    b.set_outputs(outs, std::source_location::current());
  }
  const sc::graph::SplitGraphs p = sc::graph::split_forward_backward(b.graph, 3, 1);
  sc::graph::verify(p.forward, "split");
  sc::graph::verify(p.backward, "split");
  REQUIRE(p.forward.outputs.size() == 1 + static_cast<std::size_t>(p.num_residuals));
  for (int k = 0; k < p.num_residuals; ++k) {
    const int v = p.forward.outputs[1 + k];
    INFO("residual " << k << ": " << p.forward.values[v].shape);
    CHECK((p.forward.values[v].shape != rows || v == p.forward.inputs[0]));
  }
  const sc::Tensor x = sc::random::normal(rows, 11), gamma = sc::random::uniform({8}, 0.5, 1.5, 12),
                   beta = sc::random::normal({8}, 13), seed = sc::random::normal(rows, 14);
  const auto fo = sc::graph::Plan(std::make_shared<const sc::graph::Graph>(p.forward)).run(std::vector<sc::Tensor>{x, gamma, beta});
  std::vector<sc::Tensor> bin(fo.begin() + 1, fo.end());
  bin.push_back(seed);
  const auto bo = sc::graph::Plan(std::make_shared<const sc::graph::Graph>(p.backward)).run(bin);
  REQUIRE(bo.size() == 3);
  // Against the eager gradient of the same function.
  sc::GradientTape tape;
  tape.watch({x, gamma, beta});
  const sc::Tensor y = sc::nn::layer_norm(x, {8}, gamma, beta);
  const std::vector<sc::Tensor> want = tape.gradient(y, {x, gamma, beta}, seed);
  check_close(fo[0], y);
  for (int k = 0; k < 3; ++k) check_close(bo[k], want[k], 1e-4);
}

TEST_CASE("joint gradient: a staged function computes only the gradients a tape wants", "[function][grad][joint]") {
  auto body = [&](sc::Tensor x, sc::Tensor w) { return sc::tanh(sc::matmul(x, w)); };
  auto f = sc::function(body);
  const sc::Tensor x = sc::random::normal({3, 4}, 8), w = sc::random::normal({4, 2}, 9);
  f(x, w);
  // The gradient of w alone does not form x's: the forward product (made again: these take the
  // arguments) and w's, not x's too.
  const sc::ConcreteFunction cf = f.get_concrete(x, w);
  const auto products = [](const sc::ConcreteFunction& g) {
    return count_nodes(g, [](const sc::graph::Node& n) { return n.kind == sc::graph::NodeKind::op && n.op == sc::ops::OpId::MatMul; });
  };
  CHECK(products(cf.gradient_function()) == 3);
  CHECK(products(cf.gradient_function(sc::ops::Wanted::only(1))) == 2);
  CHECK(cf.gradient_function(sc::ops::Wanted::only(1)).graph().outputs.size() == 1);
  check_wanted_gradients(f, body, x, w, [] {}, [](int) {});
}

TEST_CASE("joint gradient: a host_fn's gradient nobody wants is dropped from the staged gradient", "[host_fn][grad][joint]") {
  // The host_fn's gradient rule runs as a host_fn of the backward graph; it only computes values
  // (it is pure), so dead-code elimination drops it where the tape wants no gradient through it.
  int grads = 0;
  const CountedIdentity counted{&grads};
  auto body = [&](sc::Tensor x, sc::Tensor w) { return sc::sum(sc::tanh(counted(x * 2.f)) * w); };
  auto f = sc::function(body);
  const sc::Tensor x = sc::random::normal({3, 4}, 18), w = sc::random::normal({3, 4}, 19);
  f(x, w);
  const sc::ConcreteFunction cf = f.get_concrete(x, w);
  const auto host_fns = [](const sc::ConcreteFunction& g) {
    return count_nodes(g, [](const sc::graph::Node& n) { return n.kind == sc::graph::NodeKind::host_fn; });
  };
  CHECK(host_fns(cf.gradient_function()) == 2);  // the forward's made again, and its gradient
  CHECK(host_fns(cf.gradient_function(sc::ops::Wanted::only(1))) == 1);  // w's: the forward's alone
  check_wanted_gradients(f, body, x, w, [&] { grads = 0; }, [&](int want) { CHECK(grads == (want & 2 ? 1 : 0)); });
}
