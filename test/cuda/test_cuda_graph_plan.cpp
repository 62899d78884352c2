// CUDA-graph replay of staged plans, checked without a GPU: which plans can become a graph and
// why the others cannot, the policy and its environment variable, and what stats report.
#include "testing.hpp"
#include "graph_testing.hpp"

#include <stagecraft/graph/plan.hpp>
#include <stagecraft/graph/trace.hpp>

#include <cstdlib>
#include <functional>
#include <memory>
#include <source_location>

namespace {

using Tensors = std::vector<sc::Tensor>;
using sc::graph::Graph;

using sctest::trace;

/// g with every value on `d`, in the bodies of its control flow too.
Graph moved(Graph g, sc::Device d) {
  for (sc::graph::Value& v : g.values) v.device = d;
  for (sc::graph::Node& n : g.nodes)
    for (auto& b : n.bodies) b = std::make_shared<const Graph>(moved(*b, d));
  return g;
}

std::string obstacle(const Graph& g) { return sc::graph::Plan(std::make_shared<const Graph>(g)).cuda_graph_obstacle(); }

/// An elementwise group, a reduction and a matmul, traced on the CPU.
Graph mixed() {
  const sc::TensorSpec x{sc::Shape{16, 8}, sc::f32}, w{sc::Shape{8, 4}, sc::f32};
  return trace({x, w}, [](const Tensors& a) {
    const sc::Tensor h = sc::relu(a[0] * 2.f + 1.f);
    return Tensors{sc::sum(sc::matmul(h, a[1]), {1}), sc::exp(h)};
  });
}

}  // namespace

TEST_CASE("cuda graphs: a plan wholly on one GPU can be replayed, and says why not otherwise", "[cuda][graph]") {
  const Graph cpu = mixed();
  CHECK(obstacle(cpu) == "it runs on the CPU");
  CHECK(sc::graph::Plan(std::make_shared<const Graph>(cpu)).cuda_graph_status().empty());  // nothing to say

  const Graph gpu = moved(cpu, sc::Device::cuda(0));
  if (sc::cuda::built) {
    CHECK(obstacle(gpu).empty());
  } else {
    CHECK_THAT(obstacle(gpu), Catch::Contains("has no CUDA kernel"));  // no kernels in this build
  }

  Graph half = gpu;  // the first input stays on the CPU
  half.values[half.inputs[0]].device = sc::Device::cpu();
  CHECK(obstacle(half) == "it holds cpu values");
  CHECK(sc::graph::Plan(std::make_shared<const Graph>(half)).cuda_graph_status() == "no (it holds cpu values)");

  Graph two = gpu;
  two.values.back().device = sc::Device::cuda(1);
  CHECK(obstacle(two) == "it spans several GPUs");
}

TEST_CASE("cuda graphs: host functions, in a branch too, and a read after an assignment keep a plan off", "[cuda][graph]") {
  if (!sc::cuda::built) {
    WARN("built without CUDA: every GPU plan stops at its first kernel");
    return;
  }
  const sc::TensorSpec x{sc::Shape{4}, sc::f32};
  const Graph host = moved(trace({x}, [](const Tensors& a) {
    const Tensors r = sc::host_fn([](const Tensors& in) { return in; }, {a[0] + 1.f}, {{sc::Shape{4}, sc::f32}});
    return Tensors{r[0] * 2.f};
  }), sc::Device::cuda(0));
  CHECK(obstacle(host) == "it calls a host function");

  // Control flow is recorded as conditional nodes, unless a body could not be a graph itself.
  const Graph host_branch = moved(trace({x}, [](const Tensors& a) {
    return sc::cond(sc::sum(a[0]) > 0.f, [&] { return Tensors{a[0] * 2.f}; }, [&] {
      return sc::host_fn([](const Tensors& in) { return in; }, {a[0] - 1.f}, {{sc::Shape{4}, sc::f32}});
    });
  }), sc::Device::cuda(0));
  CHECK(obstacle(host_branch) == "its cond's false branch: it calls a host function");

  // A variable assigned, then read again (the tracer forwards the assigned value itself, so the
  // second read is added by hand, as a cond or while_loop would re-read it).
  sc::Variable v(sc::zeros({4}), "v");
  Graph g = trace({x}, [&](const Tensors& a) {
    v.assign(v + a[0]);
    return Tensors{a[0] * 3.f};
  });
  g = moved(std::move(g), sc::Device::cuda(0));
  CHECK(obstacle(g).empty());
  std::shared_ptr<sc::detail::VariableState> state;
  for (const sc::graph::Node& n : g.nodes)
    if (n.kind == sc::graph::NodeKind::assign_var) state = n.var;
  REQUIRE(state);
  sc::graph::Node read;
  read.kind = sc::graph::NodeKind::read_var;
  read.var = state;
  g.add_node(std::move(read), {sc::TensorSpec{sc::Shape{4}, sc::f32}}, sc::Device::cuda(0));
  CHECK(obstacle(g) == "it reads variable 'v' after assigning it");
}

TEST_CASE("cuda graphs: when cheaper by default, switched by set_graphs, set_graph_policy or STAGECRAFT_CUDA_GRAPHS",
          "[cuda][graph]") {
  using P = sc::cuda::GraphPolicy;
  const P was = sc::cuda::graph_policy();
  sc::cuda::detail::graphs_setting() = -1;  // not read yet
  ::setenv("STAGECRAFT_CUDA_GRAPHS", "1", 1);
  CHECK(sc::cuda::graph_policy() == P::always);
  ::setenv("STAGECRAFT_CUDA_GRAPHS", "0", 1);
  CHECK(sc::cuda::graph_policy() == P::always);  // read once
  sc::cuda::detail::graphs_setting() = -1;
  CHECK(sc::cuda::graph_policy() == P::never);
  CHECK_FALSE(sc::cuda::graphs_enabled());
  ::setenv("STAGECRAFT_CUDA_GRAPHS", "auto", 1);
  sc::cuda::detail::graphs_setting() = -1;
  CHECK(sc::cuda::graph_policy() == P::when_cheaper);
  ::unsetenv("STAGECRAFT_CUDA_GRAPHS");
  sc::cuda::detail::graphs_setting() = -1;
  CHECK(sc::cuda::graph_policy() == P::when_cheaper);
  CHECK(sc::cuda::graphs_enabled());
  sc::cuda::set_graphs(false);
  CHECK(sc::cuda::graph_policy() == P::never);
  sc::cuda::set_graphs(true);
  CHECK(sc::cuda::graph_policy() == P::always);
  if (sc::cuda::built) {
    const sc::graph::Plan p(std::make_shared<const Graph>(moved(mixed(), sc::Device::cuda(0))));
    CHECK(p.cuda_graph_status() == "not captured yet");
    sc::cuda::set_graph_policy(P::when_cheaper);  // 2 KiB copied per call for 3 launches: cheaper
    CHECK(p.cuda_graph_status() == "not captured yet");
    sc::cuda::set_graphs(false);
    CHECK_THAT(p.cuda_graph_status(), Catch::StartsWith("off"));
  }
  sc::cuda::set_graph_policy(was);
}

TEST_CASE("cuda graphs: when cheaper, a plan whose copies outweigh its launches runs kernel by kernel", "[cuda][graph]") {
  if (!sc::cuda::built) {
    WARN("built without CUDA: no plan can be captured");
    return;
  }
  using P = sc::cuda::GraphPolicy;
  const P was = sc::cuda::graph_policy();
  sc::cuda::set_graph_policy(P::when_cheaper);
  // One elementwise kernel over 2 x 2M floats in and 2M out: 24 MiB of copies for one launch.
  const sc::TensorSpec big{sc::Shape{1 << 21}, sc::f32};
  const Graph costly = moved(trace({big, big}, [](const Tensors& a) { return Tensors{a[0] * a[1] + 1.f}; }),
                             sc::Device::cuda(0));
  const sc::graph::Plan p(std::make_shared<const Graph>(costly));
  CHECK(p.cuda_graph_obstacle().empty());  // it could be captured...
  CHECK(p.stats().cuda_graph_copy_bytes == 3 * (std::int64_t{1} << 21) * 4);
  CHECK(p.stats().cuda_graph_launches == 1);
  CHECK(p.cuda_graph_status() ==
        "kernel by kernel (its copies, 24 MiB per call, would cost more than its 1 launches (at most 4 MiB per "
        "launch); cuda::set_graphs(true) captures it)");
  sc::cuda::set_graphs(true);  // ...and is, when asked
  CHECK(p.cuda_graph_status() == "not captured yet");
  // The same kernel over 1M floats: 12 MiB; four such kernels in a chain of matmuls stay under.
  const sc::TensorSpec mid{sc::Shape{1 << 20}, sc::f32};
  const Graph cheap = moved(trace({mid}, [](const Tensors& a) {
                              sc::Tensor x = a[0];
                              for (int i = 0; i < 4; ++i) x = sc::reshape(sc::matmul(sc::reshape(x, {1024, 1024}), sc::reshape(a[0], {1024, 1024})), {1 << 20});
                              return Tensors{x};
                            }),
                            sc::Device::cuda(0));
  sc::cuda::set_graph_policy(P::when_cheaper);
  CHECK(sc::graph::Plan(std::make_shared<const Graph>(cheap)).cuda_graph_status() == "not captured yet");
  sc::cuda::set_graph_policy(was);
}

TEST_CASE("cuda graphs: a CPU function runs as before with graphs on, its stats silent about them", "[cuda][graph]") {
  const sc::cuda::GraphPolicy was = sc::cuda::graph_policy();
  sc::cuda::set_graphs(true);
  auto f = sc::function([](sc::Tensor x) { return sc::exp(x) * 2.f; });
  const sc::Tensor x = sc::tensor(std::vector<float>{0.f, 1.f, -1.f});
  for (int i = 0; i < 3; ++i) {
    const auto got = f(x).to_vector<float>();
    CHECK(got[1] == Approx(2 * std::exp(1.f)));
  }
  const auto st = f.get_concrete(x).stats();
  CHECK(st.plan.cuda_graph.empty());
  CHECK_THAT(st.str(), !Catch::Contains("cuda graph"));
  sc::cuda::set_graph_policy(was);
}

namespace {
/// Graphs with control flow, traced on the CPU (then moved to a GPU).
Graph branched() {
  const sc::TensorSpec x{sc::Shape{4}, sc::f32};
  return trace({x}, [](const Tensors& a) {
    return sc::cond(sc::sum(a[0]) > 0.f, [&] { return Tensors{a[0] * 2.f}; }, [&] { return Tensors{a[0] - 1.f}; });
  });
}
Graph looped() {
  const sc::TensorSpec x{sc::Shape{4}, sc::f32};
  return trace({x}, [](const Tensors& a) {
    // a swap of loop variables, and a cond in the body
    auto [fv, fw] = sc::while_loop([](sc::Tensor v, sc::Tensor) { return sc::sum(v * v) > 1.f; },
                                   [](sc::Tensor v, sc::Tensor w) {
                                     return std::make_tuple(sc::cond(sc::sum(w) > 0.f, [&] { return w * 0.5f; }, [&] { return w; }), v);
                                   },
                                   std::make_tuple(a[0], a[0] + 1.f));
    return Tensors{fv, fw};
  });
}
}  // namespace

TEST_CASE("cuda graphs: a cond or while_loop whose bodies can be graphs is recorded as conditional nodes", "[cuda][graph]") {
  if (!sc::cuda::built) {
    WARN("built without CUDA: every GPU plan stops at its first kernel");
    return;
  }
  CHECK(obstacle(moved(branched(), sc::Device::cuda(0))).empty());
  CHECK(obstacle(moved(looped(), sc::Device::cuda(0))).empty());
  CHECK(obstacle(branched()) == "it runs on the CPU");

  // A branch that launches nothing (it passes its input through) is recorded as its copies.
  const sc::TensorSpec x{sc::Shape{4}, sc::f32};
  const Graph pass = moved(trace({x}, [](const Tensors& a) {
    return sc::cond(sc::sum(a[0]) > 0.f, [&] { return Tensors{a[0]}; }, [&] { return Tensors{a[0] - 1.f}; });
  }), sc::Device::cuda(0));
  CHECK(obstacle(pass).empty());

  // Bodies on another GPU than the plan's other values.
  Graph split = moved(branched(), sc::Device::cuda(0));
  for (sc::graph::Node& n : split.nodes)
    if (n.kind == sc::graph::NodeKind::cond) {
      auto body = std::make_shared<Graph>(moved(*n.bodies[1], sc::Device::cuda(1)));
      n.bodies[1] = body;
    }
  CHECK(obstacle(split) == "its cond's false branch: it runs on cuda:1");

  // A variable assigned in a loop's body: a conditional body cannot copy values out per launch.
  sc::Variable v(sc::zeros({4}), "acc");
  const Graph assigning = moved(trace({x}, [&](const Tensors& a) {
    const sc::Tensor r = sc::while_loop([](sc::Tensor u) { return sc::sum(u) < 10.f; }, [&](sc::Tensor u) {
      v.assign(u);
      return u + 1.f;
    }, a[0]);
    return Tensors{r};
  }), sc::Device::cuda(0));
  CHECK(obstacle(assigning) == "its while_loop's body: it assigns variable 'acc'");

  // A body reads a variable through its enclosing graph (a capture). A read_var node in a body (a
  // hand-made or loaded graph) is copied in when the graph starts, as the top level's reads,
  // unless the plan assigned the variable before.
  sc::Variable w(sc::full({4}, 0.5f), "w"), other(sc::full({4}, 0.5f), "other");
  auto loop = [&](const sc::Tensor& u0) {
    return sc::while_loop([](sc::Tensor u) { return sc::sum(u) < 10.f; }, [&](sc::Tensor u) { return u + w; }, u0);
  };
  auto read_in_body = [](Graph g, const std::shared_ptr<sc::detail::VariableState>& var) {
    for (sc::graph::Node& n : g.nodes)
      if (n.kind == sc::graph::NodeKind::while_loop) {
        Graph body = *n.bodies[1];
        sc::graph::Node read;
        read.kind = sc::graph::NodeKind::read_var;
        read.var = var;
        body.add_node(std::move(read), {sc::TensorSpec{sc::Shape{4}, sc::f32}}, sc::Device::cuda(0));
        n.bodies[1] = std::make_shared<const Graph>(std::move(body));
      }
    return g;
  };
  const Graph reads = moved(trace({x}, [&](const Tensors& a) { return Tensors{loop(a[0])}; }), sc::Device::cuda(0));
  CHECK(obstacle(reads).empty());
  std::shared_ptr<sc::detail::VariableState> w_state;
  for (const sc::graph::Node& n : reads.nodes)
    if (n.kind == sc::graph::NodeKind::read_var) w_state = n.var;
  REQUIRE(w_state);
  CHECK(obstacle(read_in_body(reads, w_state)).empty());
  const Graph late = moved(trace({x}, [&](const Tensors& a) {
    other.assign(a[0]);
    return Tensors{loop(a[0])};
  }), sc::Device::cuda(0));
  CHECK(obstacle(late).empty());
  std::shared_ptr<sc::detail::VariableState> assigned;
  for (const sc::graph::Node& n : late.nodes)
    if (n.kind == sc::graph::NodeKind::assign_var) assigned = n.var;
  REQUIRE(assigned);
  CHECK(obstacle(read_in_body(late, assigned)) == "it reads variable 'other' after assigning it");
}
