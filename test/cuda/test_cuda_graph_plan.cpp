// CUDA-graph replay of staged plans, checked without a GPU: which plans can become a graph and
// why the others cannot, the switch and its environment variable, and what stats report.
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

/// g with every value on `d`.
Graph moved(Graph g, sc::Device d) {
  for (sc::graph::Value& v : g.values) v.device = d;
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

TEST_CASE("cuda graphs: host functions, control flow and a read after an assignment keep a plan off", "[cuda][graph]") {
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

  const Graph branch = moved(trace({x}, [](const Tensors& a) {
    return sc::cond(sc::sum(a[0]) > 0.f, [&] { return Tensors{a[0] * 2.f}; }, [&] { return Tensors{a[0] - 1.f}; });
  }), sc::Device::cuda(0));
  CHECK_THAT(obstacle(branch), Catch::StartsWith("it has a cond"));

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

TEST_CASE("cuda graphs: off by default, switched by set_graphs or STAGECRAFT_CUDA_GRAPHS=1", "[cuda][graph]") {
  const bool was = sc::cuda::graphs_enabled();
  sc::cuda::detail::graphs_setting() = -1;  // not read yet
  ::setenv("STAGECRAFT_CUDA_GRAPHS", "1", 1);
  CHECK(sc::cuda::graphs_enabled());
  ::setenv("STAGECRAFT_CUDA_GRAPHS", "0", 1);
  CHECK(sc::cuda::graphs_enabled());  // read once
  sc::cuda::detail::graphs_setting() = -1;
  CHECK_FALSE(sc::cuda::graphs_enabled());
  ::unsetenv("STAGECRAFT_CUDA_GRAPHS");
  sc::cuda::detail::graphs_setting() = -1;
  CHECK_FALSE(sc::cuda::graphs_enabled());
  sc::cuda::set_graphs(true);
  CHECK(sc::cuda::graphs_enabled());
  if (sc::cuda::built) {
    const sc::graph::Plan p(std::make_shared<const Graph>(moved(mixed(), sc::Device::cuda(0))));
    CHECK(p.cuda_graph_status() == "not captured yet");
    sc::cuda::set_graphs(false);
    CHECK_THAT(p.cuda_graph_status(), Catch::StartsWith("off"));
  }
  sc::cuda::set_graphs(was);
}

TEST_CASE("cuda graphs: a CPU function runs as before with graphs on, its stats silent about them", "[cuda][graph]") {
  const bool was = sc::cuda::graphs_enabled();
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
  sc::cuda::set_graphs(was);
}
