// Tests of the graph passes (simplify, fold, cse, dce, the pipeline) and the verifier: printed
// graphs, node counts, the verifier on every result and on broken graphs, and equal results.
#include <catch2/catch.hpp>
#include "graph_testing.hpp"
#include "passes_testing.hpp"
#include <stagecraft/core/creation.hpp>
#include <stagecraft/fwd.hpp>
#include <stagecraft/graph/passes/pipeline.hpp>
#include <stagecraft/graph/plan.hpp>
#include <stagecraft/graph/trace.hpp>
#include <stagecraft/ops/registry.hpp>
#include <stagecraft/state/variable.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <functional>
#include <memory>
#include <random>
#include <source_location>
#include <string>
#include <vector>

namespace {

using sc::graph::Graph;
using sc::graph::Node;
using sc::graph::NodeKind;
using Tensors = std::vector<sc::Tensor>;
using Fn = std::function<Tensors(const Tensors&)>;

using sctest::trace;
using sctest::passes::check_same_bits;
using sctest::passes::count;
using sctest::passes::run;

/// A tensor of the spec's shape and dtype with values from mt19937(seed) in [-2, 2].
sc::Tensor random_arg(const sc::TensorSpec& s, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(-2, 2);
  std::vector<double> v(static_cast<std::size_t>(s.shape.numel()));
  for (double& x : v) x = d(gen);
  return sc::tensor(v, s.shape).astype(s.dtype);
}

/// a and b give the same results on random arguments (within float rounding: a fused kernel
/// may round transcendentals differently from a folded eager one).
void check_same_results(const Graph& a, const Graph& b, unsigned seed = 7) {
  Tensors args;
  for (int v : a.inputs) args.push_back(random_arg({a.values[v].shape, a.values[v].dtype}, seed++));
  const Tensors ra = run(a, args), rb = run(b, args);
  REQUIRE(ra.size() == rb.size());
  for (std::size_t k = 0; k < ra.size(); ++k) {
    REQUIRE(ra[k].shape() == rb[k].shape());
    REQUIRE(ra[k].dtype() == rb[k].dtype());
    const auto x = ra[k].to_vector<double>(), y = rb[k].to_vector<double>();
    for (std::size_t i = 0; i < x.size(); ++i) {
      INFO("result " << k << ", element " << i);
      CHECK(x[i] == Approx(y[i]).epsilon(1e-6).margin(1e-6));
    }
  }
}

const sc::TensorSpec f23{sc::Shape{2, 3}, sc::f32};

}  // namespace

TEST_CASE("simplify removes identity elements", "[passes][simplify]") {
  const Graph g = trace({f23}, [](const Tensors& x) { return Tensors{x[0] * 1.f + -0.f - 0.f}; });
  CHECK(g.num_compute_nodes() == 3);
  const Graph s = sc::graph::dce(sc::graph::simplify(g));
  sc::graph::verify(s, "simplify+dce");
  CHECK(s.num_compute_nodes() == 0);
  CHECK(s.outputs == s.inputs);
  CHECK(s.str() == "graph f(%0: f32[2, 3]) {\n  return %0\n}\n");
  check_same_results(g, s);
}

TEST_CASE("simplify: identities on the left, division, and fills", "[passes][simplify]") {
  const Graph g = trace({f23}, [](const Tensors& x) {
    sc::Tensor y = 1.f * x[0];
    y = -0.f + y;
    y = y / 1.f;
    y = y * sc::detail::fill(sc::Shape{2, 3}, 1.0, sc::f32);  // a fill of ones is one too
    return Tensors{y};
  });
  const Graph s = sc::graph::dce(sc::graph::simplify(g));
  sc::graph::verify(s, "simplify");
  CHECK(s.num_compute_nodes() == 0);
  check_same_results(g, s);
}

TEST_CASE("simplify: identities broadcast or reshaped are identities, zeros keep their sign", "[passes][simplify]") {
  // A tape seeds a function's outputs with broadcast ones (the gradient of sum(y * seed)).
  const sc::Tensor one = sc::tensor({1.f}), minus_zero = sc::tensor({-0.f}), plus_zero = sc::tensor({0.f});
  const Graph g = trace({f23}, [&](const Tensors& x) {
    sc::Tensor y = sc::broadcast_to(sc::reshape(one, {}), {2, 3}) * x[0];
    y = y + sc::reshape(sc::broadcast_to(minus_zero, {6}), {2, 3});
    return Tensors{y, x[0] + sc::broadcast_to(plus_zero, {2, 3})};
  });
  const Graph s = sc::graph::dce(sc::graph::simplify(g));
  sc::graph::verify(s, "simplify");
  CHECK(count(s, "mul") == 0);
  CHECK(count(s, "add") == 1);  // x + (+0.0) stays: it turns -0.0 into +0.0
  check_same_bits(g, s, {sc::tensor(std::vector<float>{-0.f, 0.f, 1.f, -2.f, 3.5f, -0.f}, sc::Shape{2, 3})});
}

TEST_CASE("simplify: a binary op reads a broadcast_to's input where it broadcasts that itself", "[passes][simplify]") {
  const sc::TensorSpec full{sc::Shape{4, 5}, sc::f32}, rows{sc::Shape{4, 1}, sc::f32}, cols{sc::Shape{5}, sc::f32};
  const Graph g = trace({full, rows, cols}, [](const Tensors& x) {
    const sc::Tensor b = sc::broadcast_to(x[1], {4, 5});
    return Tensors{x[0] + b, b - x[0], x[0] * b, b / x[0], sc::maximum(b, x[0]), sc::minimum(x[0], b),
                   b * x[2],                                  // [4, 1] and [5] broadcast to [4, 5] themselves
                   b + sc::broadcast_to(x[2], {4, 5}),         // both operands
                   sc::broadcast_to(x[1], {3, 4, 5}) + x[0],  // x[1] and x[0] make [4, 5], not [3, 4, 5]: kept
                   sc::exp(b)};                               // a unary op: kept
  });
  CHECK(count(g, "broadcast_to") == 3);
  const Graph s = sc::graph::dce(sc::graph::simplify(g));
  sc::graph::verify(s, "simplify");
  INFO(s.str());
  CHECK(count(s, "broadcast_to") == 2);  // exp's and the rank-3 one
  check_same_bits(g, s, {random_arg(full, 1), random_arg(rows, 2), random_arg(cols, 3)});
}

TEST_CASE("simplify keeps x + 0.0 and x - (-0.0), which turn -0.0 into +0.0 as eager does", "[passes][simplify]") {
  const Graph g = trace({f23}, [](const Tensors& x) {
    return Tensors{x[0] + 0.f, 0.f + x[0], x[0] - (-0.f), x[0] + sc::zeros({2, 3}), x[0] + sc::zeros({3}, sc::i32)};
  });
  const Graph s = sc::graph::dce(sc::graph::simplify(g));
  sc::graph::verify(s, "simplify");
  CHECK(count(s, "add") == 4);
  CHECK(count(s, "sub") == 1);
  // an integer zero is one for integers
  const Graph gi = trace({{sc::Shape{3}, sc::i32}}, [](const Tensors& x) { return Tensors{(0 + x[0] + 0) - 0}; });
  CHECK(sc::graph::dce(sc::graph::simplify(gi)).num_compute_nodes() == 0);
  // the simplified graph gives eager's bits: -0.0 + 0.0 is +0.0
  const Graph one = trace({{sc::Shape{3}, sc::f32}}, [](const Tensors& x) { return Tensors{x[0] + 0.f, x[0] - (-0.f)}; });
  const sc::Tensor x = sc::tensor({-0.f, 0.f, -1.f});
  for (const sc::Tensor& r : run(sc::graph::dce(sc::graph::simplify(one)), {x})) {
    const std::vector<float> got = r.to_vector<float>();
    CHECK_FALSE(std::signbit(got[0]));
    CHECK(got[2] == -1.f);
  }
}

TEST_CASE("simplify keeps a broadcast when the identity operand is larger", "[passes][simplify]") {
  const Graph g = trace({{sc::Shape{3}, sc::f32}}, [](const Tensors& x) { return Tensors{x[0] * sc::ones({2, 3})}; });
  const Graph s = sc::graph::dce(sc::graph::simplify(g));
  sc::graph::verify(s, "simplify");
  CHECK(count(s, "mul") == 0);
  CHECK(count(s, "broadcast_to") == 1);
  CHECK(count(s, "const") == 0);
  CHECK(s.values[s.outputs[0]].shape == sc::Shape{2, 3});
  check_same_results(g, s);
}

TEST_CASE("simplify leaves non-identities alone", "[passes][simplify]") {
  const Graph g = trace({f23}, [](const Tensors& x) {
    return Tensors{x[0] * 2.f, x[0] + sc::tensor({0.f, 1.f, 0.f}), 1.f - x[0], 1.f / x[0], x[0] * std::nanf("")};
  });
  const Graph s = sc::graph::simplify(g);
  sc::graph::verify(s, "simplify");
  CHECK(s.str() == g.str());
}

TEST_CASE("simplify: neg, reshape, transpose and cast chains", "[passes][simplify]") {
  const sc::TensorSpec f234{sc::Shape{2, 3, 4}, sc::f32};
  SECTION("neg(neg(x)) and neg(neg(neg(x)))") {
    const Graph g = trace({f23}, [](const Tensors& x) { return Tensors{-(-x[0]), -(-(-x[0]))}; });
    const Graph s = sc::graph::optimize(g, nullptr, true);
    CHECK(count(s, "neg") == 1);
    CHECK(s.outputs[0] == s.inputs[0]);
    check_same_results(g, s);
  }
  SECTION("reshape(reshape(x)) is one reshape, or x") {
    const Graph g = trace({f234}, [](const Tensors& x) {
      return Tensors{sc::reshape(sc::reshape(x[0], {6, 4}), {-1, 2}), sc::reshape(sc::reshape(x[0], {24}), {2, 3, 4}),
                     sc::reshape(x[0], {2, 3, 4})};
    });
    const Graph s = sc::graph::dce(sc::graph::simplify(g));
    sc::graph::verify(s, "simplify");
    CHECK(count(s, "reshape") == 1);
    CHECK(s.str().find("reshape(%0) {ints=[12, 2]}") != std::string::npos);
    CHECK(s.outputs[1] == s.inputs[0]);
    CHECK(s.outputs[2] == s.inputs[0]);
    check_same_results(g, s);
  }
  SECTION("transpose(transpose(x)) composes, or vanishes") {
    const Graph g = trace({f234}, [](const Tensors& x) {
      const sc::Tensor t = sc::transpose(x[0], {1, 2, 0});
      return Tensors{sc::transpose(t, {1, 2, 0}), sc::transpose(t, {2, 0, 1}), sc::transpose(x[0], {0, 1, 2}),
                     sc::transpose(sc::transpose(x[0]), {-1, -2, -3})};
    });
    const Graph s = sc::graph::dce(sc::graph::simplify(g));
    sc::graph::verify(s, "simplify");
    CHECK(count(s, "transpose") == 1);
    CHECK(s.str().find("transpose(%0) {ints=[2, 0, 1]}") != std::string::npos);
    CHECK(s.outputs[1] == s.inputs[0]);
    CHECK(s.outputs[2] == s.inputs[0]);
    CHECK(s.outputs[3] == s.inputs[0]);
    check_same_results(g, s);
  }
  SECTION("a transpose of the last two axes folds into the matmul reading it") {
    const sc::TensorSpec f34{sc::Shape{3, 4}, sc::f32}, f243{sc::Shape{2, 4, 3}, sc::f32};
    const Graph g = trace({f34, f34, f234, f243}, [](const Tensors& x) {
      return Tensors{sc::matmul(sc::transpose(x[0]), x[1]),                          // a^T b
                     sc::matmul(x[0], sc::transpose(x[1])),                          // a b^T
                     sc::matmul(sc::transpose(x[0]), sc::transpose(x[1]), true, false),  // a's flag flips back
                     sc::matmul(sc::transpose(x[2], {0, 2, 1}), sc::transpose(x[3], {0, 2, 1})),
                     sc::matmul(sc::transpose(x[2], {1, 0, 2}), sc::transpose(x[0]))};  // first kept
    });
    const Graph s = sc::graph::dce(sc::graph::simplify(g));
    sc::graph::verify(s, "simplify");
    CHECK(count(s, "transpose") == 1);
    CHECK(count(s, "matmul") == 5);
    const std::string text = s.str();
    CHECK(text.find("matmul(%0, %1) {i0=1}") != std::string::npos);
    CHECK(text.find("matmul(%0, %1) {i1=1}") != std::string::npos);
    CHECK(text.find("i0=0") == std::string::npos);
    CHECK(text.find("matmul(%2, %3) {i0=1, i1=1}") != std::string::npos);
    check_same_results(g, s);
  }
  SECTION("cast and broadcast_to that change nothing") {
    const Graph g = trace({f23}, [](const Tensors& x) {
      sc::ops::Attrs a;
      a.dtype = sc::f32;
      const sc::Tensor c = sc::detail::dispatch<sc::ops::Cast>({&x[0], 1}, a, std::source_location::current());
      return Tensors{sc::broadcast_to(c, {2, 3}), sc::cast(x[0], sc::f64)};
    });
    CHECK(count(g, "cast") == 2);
    const Graph s = sc::graph::dce(sc::graph::simplify(g));
    CHECK(count(s, "cast") == 1);
    CHECK(count(s, "broadcast_to") == 0);
    CHECK(s.outputs[0] == s.inputs[0]);
    check_same_results(g, s);
  }
}

TEST_CASE("fold runs constant subgraphs now", "[passes][fold]") {
  const Graph g = trace({{sc::Shape{3}, sc::f32}}, [](const Tensors& x) {
    const sc::Tensor c = sc::tensor({1.f, 2.f, 3.f});
    return Tensors{x[0] + sc::exp(c) * 2.f};
  });
  CHECK(g.num_compute_nodes() == 3);
  const Graph f = sc::graph::fold(g);
  sc::graph::verify(f, "fold");
  CHECK(f.num_compute_nodes() == 1);
  const Graph d = sc::graph::dce(f);
  CHECK(count(d, "const") == 1);
  CHECK(d.str().find("const <3 values>") != std::string::npos);
  check_same_results(g, d);
  // Folding happened outside the trace: no trace is left active, and it leaks no node.
  CHECK(sc::detail::context().trace == nullptr);
}

TEST_CASE("fold keeps large fills and expanding ops as ops", "[passes][fold]") {
  const sc::TensorSpec big{sc::Shape{128, 128}, sc::f32};
  const Graph g = trace({big, f23}, [](const Tensors& x) {
    return Tensors{x[0] + sc::detail::fill(sc::Shape{128, 128}, 2.0, sc::f32),  // expanding: stays a fill
                   x[1] + sc::detail::fill(sc::Shape{2, 3}, 3.0, sc::f32),      // small: a constant
                   x[0] - sc::broadcast_to(sc::scalar(1.f), {128, 128}),        // expanding: stays
                   x[1] + sc::sum(sc::transpose(sc::ones({300, 300})))};        // too big to fold
  });
  const Graph f = sc::graph::dce(sc::graph::fold(g));
  sc::graph::verify(f, "fold");
  CHECK(count(f, "fill") == 1);
  CHECK(count(f, "broadcast_to") == 1);
  CHECK(count(f, "transpose") == 1);
  CHECK(count(f, "sum") == 1);
  CHECK(f.str().find("const <6 values>") != std::string::npos);
  check_same_results(g, f);
}

TEST_CASE("fold leaves a failing op for run time", "[passes][fold]") {
  Graph g = trace({f23}, [](const Tensors& x) {
    return Tensors{x[0], sc::gather(sc::tensor({1.f, 2.f}), sc::tensor({std::int64_t{1}}))};
  });
  for (Node& n : g.nodes)  // an index the trace did not see: out of range
    if (n.kind == NodeKind::constant && n.constant.dtype() == sc::i64) n.constant = sc::tensor({std::int64_t{5}});
  const Graph f = sc::graph::fold(g);
  sc::graph::verify(f, "fold");
  CHECK(count(f, "gather") == 1);
}

TEST_CASE("cse merges equal ops and constants", "[passes][cse]") {
  const Graph g = trace({f23}, [](const Tensors& x) {
    const sc::Tensor a = sc::exp(x[0]), b = sc::exp(x[0]);
    return Tensors{(a + b) + (x[0] * 2.f + x[0] * 2.f), sc::sum(a, {1}), sc::sum(b, {0})};
  });
  const Graph c = sc::graph::dce(sc::graph::cse(g));
  sc::graph::verify(c, "cse");
  CHECK(count(c, "exp") == 1);
  CHECK(count(c, "mul") == 1);
  CHECK(count(c, "const") == 1);
  CHECK(count(c, "sum") == 2);  // different attrs: kept apart
  check_same_results(g, c);
}

TEST_CASE("cse keeps constants that differ, even in the sign of zero", "[passes][cse]") {
  const Graph g = trace({f23}, [](const Tensors& x) { return Tensors{x[0] * 0.f, x[0] * -0.f, x[0] * 0.f}; });
  const Graph c = sc::graph::dce(sc::graph::cse(g));
  CHECK(count(c, "const") == 2);
  CHECK(count(c, "mul") == 2);
  CHECK(c.outputs[0] == c.outputs[2]);
  check_same_results(g, c);
}

TEST_CASE("cse merges reads of a variable only when nothing assigns it between", "[passes][cse]") {
  sc::Variable v(sc::ones({2, 3}), "v");
  sc::Variable w(sc::ones({2, 3}), "w");
  Graph g = trace({f23}, [&](const Tensors& x) {
    w.assign(x[0] + v);
    return Tensors{v.value() * x[0]};
  });
  // The tracer reads each variable once; add second reads of v and w by hand, around an assign.
  auto read = [&](const sc::Variable& var) {
    Node n;
    n.kind = NodeKind::read_var;
    n.var = var.state();
    return g.out(g.add_node(std::move(n), {{var.shape(), var.dtype()}}));
  };
  const int v2 = read(v), w2 = read(w);
  Node as;
  as.kind = NodeKind::assign_var;
  as.var = w.state();
  as.inputs = {v2};
  g.add_node(std::move(as), {});
  const int w3 = read(w);
  g.outputs.push_back(v2);
  g.outputs.push_back(w2);
  g.outputs.push_back(w3);
  sc::graph::verify(g, "hand-made");
  CHECK(count(g, "read_var") == 5);  // the trace's reads of v and w (before assigning it), and ours
  const Graph c = sc::graph::dce(sc::graph::cse(g));
  sc::graph::verify(c, "cse");
  CHECK(count(c, "read_var") == 3);  // v once; w between the assignments and after them
  CHECK(count(c, "assign_var") == 2);
  const Node& mul = c.nodes[c.values[c.outputs[0]].node];
  CHECK(std::find(mul.inputs.begin(), mul.inputs.end(), c.outputs[1]) != mul.inputs.end());  // one read of v
  CHECK(c.outputs[2] != c.outputs[3]);
}

TEST_CASE("dce drops what feeds nothing, keeps side effects", "[passes][dce]") {
  sc::Variable v(sc::zeros({2, 3}), "v");
  sc::Variable u(sc::zeros({2, 3}), "u");
  const Graph g = trace({f23}, [&](const Tensors& x) {
    (void)sc::exp(x[0]);                    // dead
    (void)(u.value() + 1.f);                // dead, and so is the read of u
    v.assign(x[0] * 3.f);                   // a side effect: kept with its inputs
    return Tensors{sc::tanh(x[0])};
  });
  const Graph d = sc::graph::dce(g);
  sc::graph::verify(d, "dce");
  CHECK(count(d, "exp") == 0);
  CHECK(count(d, "add") == 0);
  CHECK(count(d, "assign_var") == 1);
  CHECK(count(d, "mul") == 1);
  CHECK(count(d, "tanh") == 1);
  for (const Node& n : d.nodes)
    if (n.kind == NodeKind::read_var) CHECK(n.var.get() != u.state().get());
  CHECK(d.inputs.size() == 1);
}

TEST_CASE("dce keeps unused arguments", "[passes][dce]") {
  const Graph g = trace({f23, f23}, [](const Tensors& x) { return Tensors{x[1]}; });
  const Graph d = sc::graph::dce(g);
  sc::graph::verify(d, "dce");
  CHECK(d.inputs.size() == 2);
  CHECK(d.outputs[0] == d.inputs[1]);
}

namespace {

/// A cond node on (pred, x) whose branches compute then_fn(x) and else_fn(x) (x captured by each).
Graph with_cond(const Fn& then_fn, const Fn& else_fn) {
  const Graph then_g = trace({f23}, then_fn, "then"), else_g = trace({f23}, else_fn, "else");
  Graph g;
  sc::graph::GraphBuilder b;
  {
    sc::graph::TraceScope s(b);
    const sc::Tensor p = b.add_input({sc::Shape{}, sc::boolean}, sc::Device::cpu());
    const sc::Tensor x = b.add_input(f23, sc::Device::cpu());
    b.set_outputs({p, x}, std::source_location::current());
  }
  g = b.graph;
  const int x = g.inputs[1];
  Node n;
  n.kind = NodeKind::cond;
  n.inputs = {g.inputs[0], x, x};
  n.attrs.i0 = 1;
  n.bodies = {std::make_shared<const Graph>(then_g), std::make_shared<const Graph>(else_g)};
  const int id = g.add_node(std::move(n), {f23});
  g.outputs = {g.out(id)};
  return g;
}

}  // namespace

TEST_CASE("passes reach into cond bodies", "[passes][bodies]") {
  const Graph g = with_cond([](const Tensors& x) { return Tensors{sc::exp(x[0]) * 1.f + sc::exp(x[0])}; },
                            [](const Tensors& x) { return Tensors{-(-x[0]) + (sc::tensor({1.f}) * 2.f)}; });
  sc::graph::verify(g, "hand-made");
  std::vector<sc::graph::PassReport> report;
  const Graph o = sc::graph::optimize(g, &report, true);
  const Node& c = o.nodes[o.values[o.outputs[0]].node];
  REQUIRE(c.kind == NodeKind::cond);
  CHECK(c.bodies[0]->num_compute_nodes() == 2);  // one exp, one add
  CHECK(count(*c.bodies[1], "neg") == 0);
  CHECK(count(*c.bodies[1], "mul") == 0);      // folded
  CHECK(c.bodies[1]->num_compute_nodes() == 1);
  // The original bodies are untouched (passes are pure).
  CHECK(g.nodes.back().bodies[0]->num_compute_nodes() == 4);
  for (bool pred : {true, false}) {
    const Tensors args{sc::scalar(pred), random_arg(f23, 3)};
    const Tensors a = run(g, args), b = run(o, args);
    CHECK(a[0].to_vector<float>() == b[0].to_vector<float>());
  }
}

TEST_CASE("passes reach into while bodies, and verify checks them", "[passes][bodies]") {
  const sc::TensorSpec i32{sc::Shape{}, sc::i32};
  const Graph cond = trace({i32}, [](const Tensors& x) { return Tensors{x[0] < 5}; }, "cond");
  const Graph body = trace({i32}, [](const Tensors& x) { return Tensors{(x[0] * 1 + 0) + 2}; }, "body");
  sc::graph::GraphBuilder b;
  {
    sc::graph::TraceScope s(b);
    b.set_outputs({b.add_input(i32, sc::Device::cpu())}, std::source_location::current());
  }
  Graph g = b.graph;
  Node n;
  n.kind = NodeKind::while_loop;
  n.inputs = {g.inputs[0]};
  n.num_loop_vars = 1;
  n.bodies = {std::make_shared<const Graph>(cond), std::make_shared<const Graph>(body)};
  // Results: the final loop variable, then the iteration count (an i64 scalar).
  g.outputs = {g.out(g.add_node(std::move(n), {i32, sc::TensorSpec{sc::Shape{}, sc::i64}}))};
  sc::graph::verify(g, "hand-made");
  const Graph o = sc::graph::optimize(g, nullptr, true);
  CHECK(o.nodes.back().bodies[1]->num_compute_nodes() == 1);
  const Tensors args{sc::scalar(std::int32_t{0})};
  CHECK(run(o, args)[0].item<int>() == 6);
  CHECK(run(g, args)[0].item<int>() == 6);
  Graph bad = g;
  const Graph two = trace({i32}, [](const Tensors& x) { return Tensors{x[0] < 5, x[0] < 6}; }, "cond");
  bad.nodes.back().bodies[0] = std::make_shared<const Graph>(two);
  CHECK_THROWS_WITH(sc::graph::verify(bad, "p"), Catch::Contains("its cond body must return one single-element"));
  Graph bad2 = g;
  bad2.nodes.back().num_loop_vars = 0;
  CHECK_THROWS_WITH(sc::graph::verify(bad2, "p"), Catch::Contains("(while): cond argument: 0 values, the body has 1"));
}

TEST_CASE("verify rejects broken graphs, naming the pass, node and line", "[passes][verify]") {
  const Graph g = trace({f23}, [](const Tensors& x) { return Tensors{sc::exp(x[0]) + x[0]}; });
  sc::graph::verify(g, "trace");
  auto message = [](const Graph& bad) {
    try {
      sc::graph::verify(bad, "mypass");
    } catch (const sc::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const int add = g.values[g.outputs[0]].node;
  SECTION("a value with the wrong shape") {
    Graph bad = g;
    bad.values[bad.outputs[0]].shape = sc::Shape{3, 2};
    const std::string m = message(bad);
    CHECK(m.find("[verify] after mypass: node " + std::to_string(add) + " (add)") == 0);
    CHECK(m.find("f32[3, 2], but the op gives f32[2, 3]") != std::string::npos);
    CHECK(m.find("test_passes.cpp:") != std::string::npos);
  }
  SECTION("a value with the wrong dtype") {
    Graph bad = g;
    bad.values[bad.outputs[0]].dtype = sc::f64;
    CHECK(message(bad).find("but the op gives f32[2, 3]") != std::string::npos);
  }
  SECTION("an input used before it is defined") {
    Graph bad = g;
    std::swap(bad.nodes[1], bad.nodes[2]);  // add before exp
    for (std::size_t i = 0; i < bad.nodes.size(); ++i)
      for (int v : bad.nodes[i].outputs) bad.values[v].node = static_cast<int>(i);
    CHECK(message(bad).find("before it is defined") != std::string::npos);
  }
  SECTION("a value nobody defines, a result that does not exist") {
    Graph bad = g;
    bad.values.push_back(bad.values[0]);
    CHECK(message(bad).find("is defined by no node") != std::string::npos);
    Graph bad2 = g;
    bad2.outputs = {99};
    CHECK(message(bad2).find("result 0 is %99, which does not exist") != std::string::npos);
  }
  SECTION("a constant that does not match its value") {
    Graph bad = trace({f23}, [](const Tensors& x) { return Tensors{x[0] + sc::tensor({1.f, 2.f, 3.f})}; });
    for (Node& n : bad.nodes)
      if (n.kind == NodeKind::constant) n.constant = sc::tensor({1.f, 2.f});
    CHECK(message(bad).find("(const): holds a f32[2] tensor, but") != std::string::npos);
  }
  SECTION("graph inputs that are not the input nodes") {
    Graph bad = g;
    bad.inputs = {bad.outputs[0]};
    CHECK(message(bad).find("is the graph's input 0 but is not input node 0") != std::string::npos);
  }
  SECTION("an op with the wrong number of inputs, or rejecting its inputs") {
    Graph bad = g;
    bad.nodes[add].inputs.pop_back();
    CHECK(message(bad).find("has 1 inputs, the op takes 2") != std::string::npos);
    Graph bad2 = g;
    bad2.nodes[add].op = sc::ops::OpId::MatMul;
    CHECK(message(bad2).find("its op rejects its inputs: [matmul] inner dimensions") != std::string::npos);
  }
  SECTION("a read_var without its variable, a cond without bodies, nested errors") {
    sc::Variable v(sc::zeros({2, 3}), "v");
    Graph bad = trace({f23}, [&](const Tensors& x) { return Tensors{x[0] + v}; });
    for (Node& n : bad.nodes)
      if (n.kind == NodeKind::read_var) n.var = nullptr;
    CHECK(message(bad).find("(read_var): has no variable") != std::string::npos);
    Graph c = with_cond([](const Tensors& x) { return Tensors{sc::exp(x[0])}; },
                        [](const Tensors& x) { return Tensors{x[0]}; });
    Graph body = *c.nodes.back().bodies[0];
    body.values[body.outputs[0]].shape = sc::Shape{6};
    Graph nested = c;
    nested.nodes.back().bodies[0] = std::make_shared<const Graph>(body);
    const std::string m = message(nested);
    CHECK(m.find("result (then) 0 is f32[2, 3], the body's is f32[6]") != std::string::npos);
    Graph inner_only = body;
    inner_only.outputs = {inner_only.inputs[0]};
    nested.nodes.back().bodies[0] = std::make_shared<const Graph>(inner_only);
    CHECK(message(nested).find("in body 0 of node 2 (cond): node 1 (exp)") != std::string::npos);
    Graph no_body = c;
    no_body.nodes.back().bodies.pop_back();
    CHECK(message(no_body).find("needs two bodies") != std::string::npos);
  }
}

TEST_CASE("compact remaps values and refuses dangling uses", "[passes][compact]") {
  const Graph g = trace({f23}, [](const Tensors& x) { return Tensors{sc::tanh(sc::exp(x[0]))}; });
  std::vector<char> keep(g.nodes.size(), 1);
  keep[1] = 0;  // the exp
  std::vector<int> replace(g.values.size(), -1);
  replace[g.out(1)] = g.inputs[0];
  const Graph c = sc::graph::compact(g, keep, replace);
  sc::graph::verify(c, "compact");
  CHECK(c.str().find("%1 = tanh(%0)") != std::string::npos);
  CHECK(c.nodes.size() == 2);
  CHECK(c.nodes[1].inputs[0] == 0);
  CHECK(c.name == "f");
  CHECK_THROWS_AS(sc::graph::compact(g, keep), sc::Error);  // tanh would read a removed node
}

TEST_CASE("optimize: fixed point, reports, verified results, same numbers", "[passes][pipeline]") {
  const sc::TensorSpec w{sc::Shape{3, 4}, sc::f32};
  const Fn mlp = [](const Tensors& x) {
    const sc::Tensor bias = sc::tensor({0.5f, -1.f, 2.f, 0.f}) * 1.f + 0.f;         // folds
    const sc::Tensor h = sc::matmul(x[0], sc::transpose(sc::transpose(x[1]))) + bias;  // transposes vanish
    const sc::Tensor a = sc::tanh(h) + sc::tanh(h);                                   // cse
    (void)sc::exp(a);                                                                 // dce
    const sc::Tensor r = sc::reshape(sc::reshape(a, {8}), {4, 2});
    return Tensors{sc::sum(-(-r), {1}) * 1.f, sc::reshape(r, {2, 4})};
  };
  const Graph g = trace({f23, w}, mlp);
  std::vector<sc::graph::PassReport> report;
  const Graph o = sc::graph::optimize(g, &report, true);
  REQUIRE(report.size() >= 6);
  CHECK(report[0].pass == "simplify");
  CHECK(report[1].pass == "distribute");
  CHECK(report[4].pass == "products");
  CHECK(report[0].nodes_before == g.num_compute_nodes());
  CHECK(report.back().nodes_after == o.num_compute_nodes());
  CHECK(report.size() % 6 == 0);
  CHECK(count(o, "transpose") == 0);
  CHECK(count(o, "tanh") == 1);
  CHECK(count(o, "exp") == 0);
  CHECK(count(o, "neg") == 0);
  CHECK(count(o, "reshape") == 1);  // reshape(reshape(a, [4, 2]), [2, 4]) is a itself
  CHECK(o.num_compute_nodes() == 6);  // matmul, add, tanh, add, reshape, sum
  // A fixed point: optimizing again changes nothing.
  CHECK(sc::graph::optimize(o, nullptr, true).str() == o.str());
  check_same_results(g, o);
  // Each pass alone is verified and keeps the numbers.
  using Pass = Graph (*)(const Graph&);
  for (Pass p : {Pass{&sc::graph::simplify}, Pass{&sc::graph::distribute_over_concat}, Pass{&sc::graph::batch_products},
                 Pass{&sc::graph::fold}, Pass{&sc::graph::cse}, Pass{&sc::graph::dce}}) {
    const Graph r = p(g);
    sc::graph::verify(r, "one pass");
    check_same_results(g, r, 11);
  }
}

TEST_CASE("optimize keeps random ops deterministic and merges equal draws", "[passes][pipeline]") {
  const Graph g = trace({f23}, [](const Tensors& x) {
    const sc::Tensor state = sc::detail::random_state(42);
    const sc::Tensor a = sc::detail::random_normal(state, {2, 3}, 0, 1, sc::f32);
    const sc::Tensor b = sc::detail::random_normal(state, {2, 3}, 0, 1, sc::f32);
    const sc::Tensor c = sc::detail::random_uniform(state, {2, 3}, 0, 1, sc::f32);
    return Tensors{x[0] + a, x[0] + b, x[0] + c};
  });
  const Graph o = sc::graph::optimize(g, nullptr, true);
  CHECK(o.outputs[0] == o.outputs[1]);
  CHECK(o.outputs[0] != o.outputs[2]);
  check_same_results(g, o);
}

namespace {

/// A [rows, cols] f32 tensor of -0.0, +0.0, NaN, inf and ordinary values, in turn.
sc::Tensor awkward(std::int64_t rows, std::int64_t cols, float scale) {
  const float some[] = {-0.f, 0.f, std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(),
                        1.5f, -2.25f, 1e-40f};
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = some[i % 7] * (i % 7 < 3 ? 1.f : scale);
  return sc::tensor(v, sc::Shape{rows, cols});
}

}  // namespace

TEST_CASE("distribute: a sum of zero-padded pieces is one concat of sums, bit for bit (-0.0 and NaN too)",
          "[passes][distribute]") {
  // Constant zeros are split where the other operand's pieces end; a concat read twice is left.
  for (std::int64_t rows : {2, 20}) {
    INFO("rows " << rows);
    const sc::TensorSpec a{sc::Shape{rows, 1}, sc::f32}, b{sc::Shape{rows, 2}, sc::f32}, c{sc::Shape{rows, 2}, sc::f32};
    const Graph g = trace({a, b, c}, [rows](const Tensors& x) {
      const sc::Tensor pa = sc::concat({x[0], sc::zeros({rows, 4})}, 1);                       // a | 0 0 0 0
      const sc::Tensor pb = sc::concat({sc::zeros({rows, 1}), x[1], sc::zeros({rows, 2})}, 1);  // 0 | b b | 0 0
      const sc::Tensor pc = sc::concat({sc::zeros({rows, 3}), x[2]}, 1);                       // 0 0 0 | c c
      return Tensors{pa + pb + pc, pc * 2.f};
    });
    const Graph o = sc::graph::optimize(g, nullptr, true);
    INFO(o.str());
    // pa + pb: one concat of (a + 0), (0 + b) and the folded 0 + 0; pc is read twice: kept
    CHECK(count(o, "concat") == 2);
    CHECK(count(o, "add") == 3);
    check_same_bits(g, o, {awkward(rows, 1, 1.f), awkward(rows, 2, -3.f), awkward(rows, 2, 0.5f)});
  }
}

TEST_CASE("distribute: the gradient of a value read through slices is one concat, fills split, bit for bit",
          "[passes][distribute]") {
  // As an LSTM's gates: each slice's gradient is padded with zero fills (too large to fold), and
  // the pads are summed; distributed, the sum of the pads is one concat of pieces.
  const sc::TensorSpec xs{sc::Shape{20, 8}, sc::f32};
  const Fn f = [](const Tensors& x) {
    sc::GradientTape tape;
    tape.watch(x[0]);
    const auto part = [&](std::int64_t b, std::int64_t n) { return sc::slice(x[0], {0, b}, {-1, n}); };
    const sc::Tensor loss = sc::sum(sc::sigmoid(part(0, 2)) * sc::tanh(part(2, 2))) + sc::sum(sc::exp(part(4, 1))) +
                            sc::sum(part(5, 3) * part(5, 3));
    return Tensors{tape.gradient(loss, x[0])};
  };
  const Graph g = trace({xs}, f);
  CHECK(count(g, "concat") == 5);  // one pad per slice read (part(5, 3) is read twice)
  CHECK(count(g, "fill") > 0);
  const Graph o = sc::graph::optimize(g, nullptr, true);
  INFO(o.str());
  CHECK(count(o, "concat") == 1);
  const sc::Tensor x = awkward(20, 8, 0.75f);
  check_same_bits(g, o, {x});
  const auto eager = f({x})[0].to_vector<float>(), staged = run(o, {x})[0].to_vector<float>();
  REQUIRE(eager.size() == staged.size());
  for (std::size_t i = 0; i < eager.size(); ++i)
    CHECK(std::bit_cast<std::uint32_t>(eager[i]) == std::bit_cast<std::uint32_t>(staged[i]));
}

TEST_CASE("distribute: leaves a computed piece unsplit, broadcasting operands, and concats read elsewhere",
          "[passes][distribute]") {
  const sc::TensorSpec s22{sc::Shape{2, 2}, sc::f32}, s23{sc::Shape{2, 3}, sc::f32};
  // the pieces end at 2 and 3 along axis 1: x[0] or x[2] would need a slice
  const Graph cut = trace({s22, s23, s23, s22}, [](const Tensors& x) {
    return Tensors{sc::concat({x[0], x[1]}, 1) * sc::concat({x[2], x[3]}, 1)};
  });
  const Graph o1 = sc::graph::optimize(cut, nullptr, true);
  CHECK(count(o1, "concat") == 2);
  CHECK(count(o1, "mul") == 1);
  // along different axes, and with a broadcast operand: nothing to distribute
  const sc::TensorSpec s12{sc::Shape{1, 2}, sc::f32};
  const Graph axes = trace({s22, s22, s12, s12}, [](const Tensors& x) {
    return Tensors{sc::concat({x[0], x[1]}, 0) + sc::reshape(sc::concat({x[0], x[1]}, 1), {4, 2}),
                   sc::concat({x[0], x[1]}, 1) + sc::concat({x[2], x[3]}, 1)};
  });
  const Graph o2 = sc::graph::optimize(axes, nullptr, true);
  CHECK(count(o2, "add") == 2);
  // pieces that line up are distributed whatever the op (here a comparison: bool pieces)
  const Graph cmp = trace({s22, s23, s22, s23}, [](const Tensors& x) {
    return Tensors{sc::concat({x[0], x[1]}, 1) < sc::concat({x[2], x[3]}, 1)};
  });
  const Graph o3 = sc::graph::optimize(cmp, nullptr, true);
  CHECK(count(o3, "concat") == 1);
  CHECK(count(o3, "less") == 2);
  const Tensors args{awkward(2, 2, 1.f), awkward(2, 3, 2.f), awkward(2, 2, -1.f), awkward(2, 3, 0.25f)};
  const auto want = run(cmp, args)[0].to_vector<bool>(), got = run(o3, args)[0].to_vector<bool>();
  CHECK(got == want);
}

TEST_CASE("simplify: (x + 0) + 0 is x + 0, and a first + 0 stays", "[passes][simplify]") {
  const Graph g = trace({f23}, [](const Tensors& x) {
    return Tensors{(x[0] + 0.f) + sc::zeros({2, 3}), 0.f + (0.f + x[0]), (x[0] + 0.f) + -0.f, (x[0] * 2.f) + 0.f};
  });
  const Graph o = sc::graph::optimize(g, nullptr, true);
  INFO(o.str());
  CHECK(count(o, "add") == 3);  // x + 0, 0 + x and (x * 2) + 0
  check_same_bits(g, o, {awkward(2, 3, 1.f)});
}

TEST_CASE("distribute: slices of an elementwise result read by slices alone move before it, where they fuse",
          "[passes][distribute]") {
  struct FuseAt {
    std::int64_t saved = sc::graph::fusion_min_elements();
    explicit FuseAt(std::int64_t n) { sc::graph::fusion_min_elements() = n; }
    ~FuseAt() { sc::graph::fusion_min_elements() = saved; }
  };
  const sc::TensorSpec a{sc::Shape{4, 8}, sc::f32}, bias{sc::Shape{8}, sc::f32};
  // an LSTM's gates: z = x W + b read through slices only (b broadcast over the rows)
  const Fn gates = [](const Tensors& x) {
    const sc::Tensor z = sc::sigmoid(x[0] + x[1]) * 2.f;
    return Tensors{sc::slice(z, {0, 0}, {-1, 4}) * sc::slice(z, {0, 4}, {-1, 4}), sc::slice(z, {1, 2}, {2, 3})};
  };
  const Graph g = trace({a, bias}, gates);
  const Tensors args{awkward(4, 8, 1.5f), sc::reshape(awkward(1, 8, -0.5f), {8})};
  {
    const FuseAt all(1);
    const Graph o = sc::graph::optimize(g, nullptr, true);
    INFO(o.str());
    for (const Node& n : o.nodes)  // every slice reads an input, none a computed [4, 8] value
      if (n.name() == "slice") CHECK(o.nodes[o.values[n.inputs[0]].node].kind == NodeKind::input);
    CHECK(count(o, "sigmoid") == 3);
    check_same_bits(g, o, args);
  }
  {
    const FuseAt none(1 << 20);  // slices too small to fuse on the CPU: each would be a kernel
    const Graph o = sc::graph::optimize(g, nullptr, true);
    CHECK(count(o, "sigmoid") == 1);
    CHECK(count(o, "slice") == 3);
  }
  {
    const FuseAt all(1);  // a result read whole as well is made whole, and sliced
    const Graph h = trace({a, bias}, [](const Tensors& x) {
      const sc::Tensor z = x[0] + x[1];
      return Tensors{sc::slice(z, {0, 0}, {-1, 4}), sc::exp(z)};
    });
    const Graph o = sc::graph::optimize(h, nullptr, true);
    CHECK(count(o, "add") == 1);
    CHECK(count(o, "slice") == 1);
  }
}
