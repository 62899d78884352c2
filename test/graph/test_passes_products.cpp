// Tests of graph::batch_products (passes/products.hpp) and the slice rules of simplify: small products
// of one right operand stacked into one, sums of products and of column sums batched along their
// inner axis, what must stay apart (a recurrence, an operand read after an assignment, a product
// read twice), the switch that turns it off, and results against plain loops.
#include <catch2/catch.hpp>
#include "graph_testing.hpp"
#include "passes_testing.hpp"
#include <stagecraft/core/creation.hpp>
#include <stagecraft/fwd.hpp>
#include <stagecraft/ops/matmul.hpp>
#include <stagecraft/ops/reduce.hpp>
#include <stagecraft/graph/passes/pipeline.hpp>
#include <stagecraft/graph/plan.hpp>
#include <stagecraft/ops/registry.hpp>
#include <stagecraft/state/variable.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

using sc::graph::Graph;
using sc::graph::Node;
using sc::graph::NodeKind;
using Tensors = std::vector<sc::Tensor>;
using sctest::trace;
using sctest::passes::check_same_bits;
using sctest::passes::count;
using sctest::passes::ramp;
using sctest::passes::run;
using sctest::passes::spec;

/// Row-major [r, c] values of t (rank 2) as doubles.
std::vector<double> values(const sc::Tensor& t) { return t.to_vector<double>(); }

/// op(a) op(b) by plain loops: a is [M, K] (or [K, M] when ta), b [K, N] (or [N, K] when tb).
std::vector<double> product(const sc::Tensor& a, const sc::Tensor& b, bool ta, bool tb) {
  const auto av = values(a), bv = values(b);
  const std::int64_t M = ta ? a.shape()[1] : a.shape()[0], K = ta ? a.shape()[0] : a.shape()[1];
  const std::int64_t N = tb ? b.shape()[0] : b.shape()[1];
  std::vector<double> c(static_cast<std::size_t>(M * N), 0.0);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j)
      for (std::int64_t k = 0; k < K; ++k)
        c[static_cast<std::size_t>(i * N + j)] += av[static_cast<std::size_t>(ta ? k * M + i : i * K + k)] *
                                                  bv[static_cast<std::size_t>(tb ? j * K + k : k * N + j)];
  return c;
}

void check_close(const sc::Tensor& got, const std::vector<double>& want) {
  const auto g = values(got);
  REQUIRE(g.size() == want.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i << ": " << g[i] << " vs " << want[i]);
    CHECK(std::abs(g[i] - want[i]) <= 1e-5 * (1 + std::abs(want[i])));
  }
}

/// RAII: graph::product_batching() set, restored on exit.
struct Batching : sctest::passes::Switch<bool> {
  explicit Batching(bool on) : Switch(sc::graph::product_batching(), on) {}
};

}  // namespace

TEST_CASE("simplify: a slice of a slice is one slice, a slice of all of x is x", "[passes][simplify]") {
  const Graph g = trace({spec(6, 8)}, [](const Tensors& x) {
    const sc::Tensor inner = sc::slice(x[0], {1, 2}, {4, -1});  // rows 1..4, columns 2..7
    return Tensors{sc::slice(inner, {2, 1}, {2, 3}), sc::slice(x[0], {0, 0}, {6, 8}) * 2.f,
                   sc::slice(sc::slice(inner, {0, -2}, {-1, -1}), {1, 0}, {1, 2})};
  });
  const Graph o = sc::graph::optimize(g, nullptr, true);
  INFO(o.str());
  CHECK(count(o, "slice") == 2);
  for (const Node& n : o.nodes)
    if (n.name() == "slice") CHECK(o.nodes[o.values[n.inputs[0]].node].kind == NodeKind::input);
  const sc::Tensor x = ramp(6, 8, 1);
  check_same_bits(g, o, {x});
  const auto xv = values(x), r0 = values(run(o, {x})[0]), r2 = values(run(o, {x})[2]);
  // rows 3..4, columns 3..5 of x; then row 2, columns 6..7
  CHECK(r0 == std::vector<double>{xv[27], xv[28], xv[29], xv[35], xv[36], xv[37]});
  CHECK(r2 == std::vector<double>{xv[22], xv[23]});
}

TEST_CASE("products: products of one right operand are one product of the stacked rows", "[passes][products]") {
  const Batching on(true);
  for (const bool tb : {false, true}) {
    INFO("right operand transposed: " << tb);
    const std::vector<std::int64_t> rows{1, 2, 3, 1};
    std::vector<sc::TensorSpec> specs{tb ? spec(5, 8) : spec(8, 5)};
    for (std::int64_t r : rows) specs.push_back(spec(r, 8));
    const Graph g = trace(specs, [&](const Tensors& x) {
      Tensors r;
      for (std::size_t k = 1; k < x.size(); ++k) r.push_back(sc::tanh(sc::matmul(x[k], x[0], false, tb)));
      return r;
    });
    CHECK(count(g, "matmul") == 4);
    const Graph o = sc::graph::optimize(g, nullptr, true);
    INFO(o.str());
    CHECK(count(o, "matmul") == 1);
    CHECK(count(o, "concat") == 1);
    Tensors args{ramp(tb ? 5 : 8, tb ? 8 : 5, 0)};
    for (std::size_t k = 0; k < rows.size(); ++k) args.push_back(ramp(rows[k], 8, static_cast<int>(k) + 2));
    const Tensors got = run(o, args);
    for (std::size_t k = 0; k < rows.size(); ++k) {
      std::vector<double> want = product(args[k + 1], args[0], false, tb);
      for (double& v : want) v = std::tanh(v);
      check_close(got[k], want);
    }
  }
}

TEST_CASE("products: a recurrence's products stay apart, its inputs' products are batched", "[passes][products]") {
  const Batching on(true);
  // h' = tanh(x_k W + h W): every x_k W and h_0 W batch, the later h W depend on each other
  constexpr int steps = 4;
  std::vector<sc::TensorSpec> specs{spec(6, 6), spec(2, 6)};
  for (int k = 0; k < steps; ++k) specs.push_back(spec(2, 6));
  const auto rnn = [](const Tensors& x) {
    sc::Tensor h = x[1];
    for (std::size_t k = 2; k < x.size(); ++k) h = sc::tanh(sc::matmul(x[k], x[0]) + sc::matmul(h, x[0]));
    return Tensors{h};
  };
  const Graph g = trace(specs, rnn);
  CHECK(count(g, "matmul") == 2 * steps);
  const Graph o = sc::graph::optimize(g, nullptr, true);
  INFO(o.str());
  CHECK(count(o, "matmul") == 1 + (steps - 1));
  Tensors args;
  for (std::size_t k = 0; k < specs.size(); ++k) args.push_back(ramp(specs[k].shape[0], 6, static_cast<int>(k)));
  const auto want = values(run(g, args)[0]), got = values(run(o, args)[0]);
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(std::abs(got[i] - want[i]) <= 1e-5);
  // a pure chain (no inputs of their own): nothing to batch, bit for bit
  const Graph chain = trace({spec(6, 6), spec(2, 6)}, [](const Tensors& x) {
    sc::Tensor h = x[1];
    for (int k = 0; k < steps; ++k) h = sc::tanh(sc::matmul(h, x[0]));
    return Tensors{h};
  });
  const Graph oc = sc::graph::optimize(chain, nullptr, true);
  CHECK(count(oc, "matmul") == steps);
  check_same_bits(chain, oc, {args[0], args[1]});
}

TEST_CASE("products: an operand is not moved before an assignment it reads after", "[passes][products]") {
  const Batching on(true);
  sc::Variable v(sc::zeros({2, 3}), "v");
  // m1 = x W; v = 2 x; m2 = read(v) W; m3 = y W (y an input: it moves); results m1, m2, m3
  Graph g = trace({spec(2, 3), spec(3, 4), spec(2, 3)}, [](const Tensors& x) { return Tensors{sc::matmul(x[0], x[1])}; });
  const int x = g.inputs[0], w = g.inputs[1], y = g.inputs[2];
  const auto op = [&](sc::ops::OpId id, std::vector<int> in, sc::Shape shape) {
    Node n;
    n.kind = NodeKind::op;
    n.op = id;
    n.inputs = std::move(in);
    return g.out(g.add_node(std::move(n), {{shape, sc::f32}}));
  };
  const int twice = op(sc::ops::OpId::Add, {x, x}, {2, 3});
  Node as;
  as.kind = NodeKind::assign_var;
  as.var = v.state();
  as.inputs = {twice};
  g.add_node(std::move(as), {});
  Node rd;
  rd.kind = NodeKind::read_var;
  rd.var = v.state();
  const int r = g.out(g.add_node(std::move(rd), {{sc::Shape{2, 3}, sc::f32}}));
  g.outputs.push_back(op(sc::ops::OpId::MatMul, {r, w}, {2, 4}));
  g.outputs.push_back(op(sc::ops::OpId::MatMul, {y, w}, {2, 4}));
  sc::graph::verify(g, "hand-made");
  const Graph o = sc::graph::optimize(g, nullptr, true);
  INFO(o.str());
  CHECK(count(o, "matmul") == 2);  // x W with y W; the read of v stays after the assignment
  const Tensors args{ramp(2, 3, 1), ramp(3, 4, 2), ramp(2, 3, 3)};
  const Tensors got = run(o, args);
  check_close(got[0], product(args[0], args[1], false, false));
  check_close(got[1], product(args[0] + args[0], args[1], false, false));
  check_close(got[2], product(args[2], args[1], false, false));
}

TEST_CASE("products: a sum of products is one product over the stacked inner axis", "[passes][products]") {
  const Batching on(true);
  const std::vector<std::int64_t> inner{1, 3, 1, 2, 1};
  for (const auto& [ta, tb] : {std::pair{true, false}, std::pair{false, true}, std::pair{false, false}}) {
    INFO("flags " << ta << tb);
    std::vector<sc::TensorSpec> specs;
    for (std::int64_t k : inner) {
      specs.push_back(ta ? spec(k, 4) : spec(4, k));
      specs.push_back(tb ? spec(6, k) : spec(k, 6));
    }
    specs.push_back(spec(4, 6));
    const Graph g = trace(specs, [&](const Tensors& x) {
      sc::Tensor s = sc::matmul(x[0], x[1], ta, tb);
      for (std::size_t k = 1; k < inner.size(); ++k) s = s + sc::matmul(x[2 * k], x[2 * k + 1], ta, tb);
      return Tensors{s + x.back(), sc::matmul(x[0], x[1], ta, tb) + sc::matmul(x[2], x[3], ta, tb)};
    });
    const Graph o = sc::graph::optimize(g, nullptr, true);
    INFO(o.str());
    // cse first: the first sum is (p0 + p1) + p2 + p3 + p4 + bias with p0 + p1 the second result,
    // read twice: p2..p4 become one product; p0 + p1 stays two products and an add
    CHECK(count(o, "matmul") == 3);
    CHECK(count(o, "add") == 3);
    Tensors args;
    for (std::size_t k = 0; k < specs.size(); ++k)
      args.push_back(ramp(specs[k].shape[0], specs[k].shape[1], static_cast<int>(k)));
    std::vector<double> want(24, 0.0), two(24, 0.0);
    for (std::size_t k = 0; k < inner.size(); ++k) {
      const auto p = product(args[2 * k], args[2 * k + 1], ta, tb);
      for (std::size_t i = 0; i < want.size(); ++i) want[i] += p[i];
      if (k < 2)
        for (std::size_t i = 0; i < two.size(); ++i) two[i] += p[i];
    }
    const auto bias = values(args.back());
    for (std::size_t i = 0; i < want.size(); ++i) want[i] += bias[i];
    const Tensors got = run(o, args);
    check_close(got[0], want);
    check_close(got[1], two);
  }
}

TEST_CASE("products: a product read elsewhere is not batched, a sum of column sums is one sum", "[passes][products]") {
  const Batching on(true);
  std::vector<sc::TensorSpec> specs;
  for (std::int64_t r : {1, 2, 3, 1}) specs.push_back(spec(r, 5));
  const Graph g = trace(specs, [](const Tensors& x) {
    sc::Tensor s = sc::sum(x[0], {0});
    for (std::size_t k = 1; k < x.size(); ++k) s = s + sc::sum(x[k], {0});
    const sc::Tensor p0 = sc::matmul(x[0], x[0], true, false), p1 = sc::matmul(x[3], x[3], true, false);
    const sc::Tensor p2 = sc::matmul(x[2], x[2], true, false);
    return Tensors{s, p0 + p1 + p2 + p2 * 0.5f};  // p2 is read twice: it stays a product of its own
  });
  const Graph o = sc::graph::optimize(g, nullptr, true);
  INFO(o.str());
  CHECK(count(o, "sum") == 1);
  CHECK(count(o, "matmul") == 3);  // p0 + p1 is a sum of two products only
  Tensors args;
  for (std::size_t k = 0; k < specs.size(); ++k) args.push_back(ramp(specs[k].shape[0], 5, static_cast<int>(k) + 4));
  std::vector<double> want(5, 0.0);
  for (const sc::Tensor& a : args) {
    const auto v = values(a);
    for (std::size_t i = 0; i < v.size(); ++i) want[i % 5] += v[i];
  }
  check_close(run(o, args)[0], want);
  const Tensors ref = run(g, args);
  check_close(run(o, args)[1], values(ref[1]));
}

TEST_CASE("products: off, nothing is batched and results are eager's bits", "[passes][products]") {
  std::vector<sc::TensorSpec> specs{spec(8, 5)};
  for (int k = 0; k < 4; ++k) specs.push_back(spec(3, 8));
  const auto f = [](const Tensors& x) {
    sc::Tensor s = sc::matmul(x[1], x[0]);
    for (std::size_t k = 2; k < x.size(); ++k) s = s + sc::matmul(x[k], x[0]);
    sc::Tensor t = sc::matmul(x[1], x[1], true, false);
    for (std::size_t k = 2; k < x.size(); ++k) t = t + sc::matmul(x[k], x[k], true, false);
    return Tensors{s, t};
  };
  const Graph g = trace(specs, f);
  Tensors args;
  for (std::size_t k = 0; k < specs.size(); ++k) args.push_back(ramp(specs[k].shape[0], specs[k].shape[1], static_cast<int>(k)));
  {
    const Batching off(false);
    const Graph o = sc::graph::optimize(g, nullptr, true);
    CHECK(count(o, "matmul") == 8);
    check_same_bits(g, o, args);
  }
  const Batching on(true);
  const Graph o = sc::graph::optimize(g, nullptr, true);
  INFO(o.str());
  CHECK(count(o, "matmul") == 2);  // the four x_k W rows, and the four x_k^T x_k
  const Tensors want = run(g, args), got = run(o, args);
  for (std::size_t k = 0; k < 2; ++k) check_close(got[k], values(want[k]));
}

TEST_CASE("products: integer products and column sums are batched, and exact", "[passes][products]") {
  // Integer sums do not depend on their order: batched, the results are the unbatched ones exactly.
  const Batching on(true);
  std::vector<sc::TensorSpec> specs{{sc::Shape{6, 4}, sc::i32}};
  for (std::int64_t r : {1, 2, 3, 2}) specs.push_back({sc::Shape{r, 6}, sc::i32});
  const auto f = [](const Tensors& x) {
    Tensors r;
    sc::Tensor s = sc::matmul(x[1], x[1], true, false), c = sc::sum(x[1], {0});
    for (std::size_t k = 1; k < x.size(); ++k) {
      r.push_back(sc::matmul(x[k], x[0]));
      if (k > 1) s = s + sc::matmul(x[k], x[k], true, false), c = c + sc::sum(x[k], {0});
    }
    r.push_back(s);
    r.push_back(c);
    return r;
  };
  const Graph g = trace(specs, f);
  const Graph o = sc::graph::optimize(g, nullptr, true);
  INFO(o.str());
  CHECK(count(o, "matmul") == 2);
  CHECK(count(o, "sum") == 1);
  Tensors args;
  for (std::size_t k = 0; k < specs.size(); ++k)
    args.push_back(sc::cast(ramp(specs[k].shape[0], specs[k].shape[1], static_cast<int>(k)) * 7.f, sc::i32));
  const Tensors want = run(g, args), got = run(o, args);
  REQUIRE(want.size() == got.size());
  for (std::size_t k = 0; k < want.size(); ++k) CHECK(got[k].to_vector<std::int32_t>() == want[k].to_vector<std::int32_t>());
}

TEST_CASE("products: repeated computations are merged before their products are stacked", "[passes][products]") {
  // Two tapes' worth of the same work (as a persistent tape's second gradient call makes): cse runs
  // first, so the stacked product holds each row once.
  const Batching on(true);
  std::vector<sc::TensorSpec> specs{spec(8, 5)};
  for (int k = 0; k < 4; ++k) specs.push_back(spec(2, 8));
  const Graph g = trace(specs, [](const Tensors& x) {
    Tensors r;
    for (int copy = 0; copy < 2; ++copy)
      for (std::size_t k = 1; k < x.size(); ++k) r.push_back(sc::matmul(sc::tanh(x[k]), x[0]));
    return r;
  });
  CHECK(count(g, "matmul") == 8);
  const Graph o = sc::graph::optimize(g, nullptr, true);
  INFO(o.str());
  REQUIRE(count(o, "matmul") == 1);
  CHECK(count(o, "tanh") == 4);
  for (const Node& n : o.nodes)
    if (n.name() == "matmul") CHECK(o.values[n.outputs[0]].shape == sc::Shape{8, 5});
}
