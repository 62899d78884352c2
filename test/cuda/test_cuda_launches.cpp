// What a traced step costs a GPU in launches: the plan's count (PlanStats::kernels) against the
// launches the host actually makes, counted by the CUDA emulator (kernels/emulator); on a real
// GPU only the plan's count is checked.
#include "cuda_testing.hpp"

#include <vector>

using namespace sctest::cuda;

TEST_CASE("cuda launches: the MLP Adam step's plan launches what its stats count", "[cuda][staged]") {
  // The example's MLP (784-256-128-10, ReLU, Adam) at batch 128, its variables on the GPU: one
  // traced training step, kernel by kernel and as a CUDA graph (one launch).
  const GraphPolicyScope policy(sc::cuda::GraphPolicy::never);
  sc::manual_seed(5);
  const auto dense = [](std::int64_t in, std::int64_t out) {
    const sc::DeviceScope on(gpu);
    return sc::nn::Dense(in, out);
  };
  sc::nn::Dense l1 = dense(784, 256), l2 = dense(256, 128), l3 = dense(128, 10);
  sc::optim::Adam opt(1e-3);
  std::vector<sc::Variable> vars;
  for (const sc::nn::Dense* l : {&l1, &l2, &l3})
    for (const auto& v : l->trainable_variables()) vars.push_back(v);
  const auto body = [&](const sc::Tensor& x, const sc::Tensor& y) {
    sc::GradientTape tape;
    const sc::Tensor loss = sc::nn::cross_entropy(l3(sc::relu(l2(sc::relu(l1(x))))), y);
    opt.apply(tape.gradient(loss, vars), vars);
    return loss;
  };
  auto step = sc::function(body);
  const sc::Tensor x = sc::random::uniform({128, 784}, 0.0, 1.0, 11).to(gpu);
  const sc::Tensor y = sc::cast(sc::random::uniform({128}, 0.0, 10.0, 12), sc::i64).to(gpu);
  step(x, y);  // traced, then run
  const auto st = step.get_concrete(x, y).stats();
  INFO(st);
  const auto [kernels, copies] = launches_of([&] { step(x, y).item<float>(); });
  WARN("MLP Adam step, batch 128, on the GPU: plan " << st.plan.kernels << " kernels; launched " << kernels
                                                     << " kernels and " << copies << " copies");
  CHECK(st.plan.kernels <= 13);  // 13 (session 38: casts read converted, relu_grad(g W^T) one kernel, the loss with its gradient), all counted launches
  if (kernels >= 0) {
    CHECK(kernels == st.plan.kernels);
    CHECK(copies == 0);
  }
  // Replayed as a CUDA graph: the second call captures, later ones launch the graph alone.
  sc::cuda::set_graphs(true);
  step(x, y);
  step(x, y);
  const auto [graph_kernels, graph_copies] = launches_of([&] { step(x, y).item<float>(); });
  sc::cuda::set_graphs(false);
  CHECK(step.get_concrete(x, y).stats().plan.cuda_graph.rfind("replaying", 0) == 0);
  if (graph_kernels >= 0) {
    CHECK(graph_kernels == 0);
    CHECK(graph_copies == 0);
  }
  // The default policy (when_cheaper) replays it too: ~6 MB of copies per call (the batch, the
  // weights and Adam's slots in and out) against 4 MiB for each of its 13 launches.
  sc::cuda::set_graph_policy(sc::cuda::GraphPolicy::when_cheaper);
  auto by_default = sc::function(body);
  by_default(x, y);  // traced, run kernel by kernel
  const auto dst = by_default.get_concrete(x, y).stats();
  CHECK(dst.plan.cuda_graph == "not captured yet");
  std::int64_t weights = 0;
  for (const sc::Variable& v : vars) weights += static_cast<std::int64_t>(v.value().nbytes());
  // the batch in; the weights and Adam's two slots in and out; its step count in and out, the loss out
  const std::int64_t copied = static_cast<std::int64_t>(x.nbytes() + y.nbytes()) + 2 * 3 * weights;
  CHECK(dst.plan.cuda_graph_copy_bytes >= copied);
  CHECK(dst.plan.cuda_graph_copy_bytes <= copied + 64);
  CHECK(dst.plan.cuda_graph_launches == dst.plan.kernels);
  CHECK_THAT(dst.str(), Catch::Contains(" bytes copied per call for "));
  by_default(x, y);  // captured
  const auto [default_kernels, default_copies] = launches_of([&] { by_default(x, y).item<float>(); });
  CHECK(by_default.get_concrete(x, y).stats().plan.cuda_graph.rfind("replaying", 0) == 0);
  if (default_kernels >= 0) CHECK(default_kernels == 0);
  (void)default_copies;
}

TEST_CASE("cuda launches: casts read only by fused groups are read converted there, no launch of their own", "[cuda][staged]") {
  const GraphPolicyScope kernels_only(sc::cuda::GraphPolicy::never);  // the plan kernel by kernel
  // A step count (i64), a mask (bool) and a rate (f64) cast into f32 groups, as an optimizer's and
  // a dropout's arithmetic does: one launch, and the CPU's numbers (the cast op's rule).
  auto f = sc::function([](const sc::Tensor& x, const sc::Tensor& n, const sc::Tensor& m, const sc::Tensor& r) {
    const sc::Tensor lr = sc::cast(r, sc::f32);
    return std::vector<sc::Tensor>{x * sc::cast(n, sc::f32) * sc::cast(m, sc::f32) - lr, sc::exp(sc::reshape(x, {30, 10}) * lr)};
  });
  const sc::Tensor x = sc::random::uniform({300}, -1.0, 1.0, 3), n = sc::tensor(std::vector<std::int64_t>{(1LL << 40) + 3}, sc::Shape{}),
                   m = sc::random::uniform({300}, 0.0, 1.0, 4) > 0.5, r = sc::tensor(std::vector<double>{1e-3 / 3}, sc::Shape{});
  const std::vector<sc::Tensor> want = f(x, n, m, r);
  const sc::Tensor gx = x.to(gpu), gn = n.to(gpu), gm = m.to(gpu), gr = r.to(gpu);
  f(gx, gn, gm, gr);
  const auto st = f.get_concrete(gx, gn, gm, gr).stats();
  INFO(st << f.get_concrete(gx, gn, gm, gr).plan().str());
  CHECK(st.plan.kernels == 1);  // (two groups of different shapes, launched together)
  std::vector<sc::Tensor> got;
  const auto [kernels, copies] = launches_of([&] { got = f(gx, gn, gm, gr); });
  if (kernels >= 0) CHECK(kernels == 1);
  REQUIRE(got.size() == 2);
  for (std::size_t j = 0; j < 2; ++j) {
    const auto g = got[j].to_vector<double>(), w = want[j].to_vector<double>();
    for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == Approx(w[i]).epsilon(1e-6).margin(1e-7));
  }
}

TEST_CASE("cuda launches: a loss and its gradient are one kernel, with the two kernels' numbers", "[cuda][staged]") {
  const GraphPolicyScope kernels_only(sc::cuda::GraphPolicy::never);  // the plan kernel by kernel
  // cross_entropy and its gradient over the same logits and labels: one pass (one launch; two
  // past one block's rows), the loss and the gradient those of the eager ops on the GPU.
  for (const std::int64_t n : {std::int64_t{100}, std::int64_t{8000}}) {  // (8000 x 10 > abi::xent_one_block)
    INFO("batch " << n);
    const sc::Tensor z = sc::random::uniform({n, 10}, -3.0, 3.0, 21).to(gpu);
    const sc::Tensor y = sc::cast(sc::random::uniform({n}, 0.0, 10.0, 22), sc::i64).to(gpu);
    const auto loss_and_grad = [](const sc::Tensor& logits, const sc::Tensor& labels) {
      sc::GradientTape tape;
      tape.watch(logits);
      const sc::Tensor loss = sc::nn::cross_entropy(logits, labels);
      return std::vector<sc::Tensor>{loss, tape.gradient(loss, logits)};
    };
    const std::vector<sc::Tensor> eager = loss_and_grad(z, y);
    auto f = sc::function(loss_and_grad);
    f(z, y);
    const auto st = f.get_concrete(z, y).stats();
    INFO(st << f.get_concrete(z, y).plan().str());
    CHECK(st.plan.losses_with_gradient == 1);
    CHECK(st.plan.kernels == 1);
    std::vector<sc::Tensor> got;
    const auto [kernels, copies] = launches_of([&] { got = f(z, y); });
    if (kernels >= 0) CHECK(kernels == 1);
    CHECK(got[0].item<float>() == eager[0].item<float>());
    const auto g = got[1].to_vector<float>(), w = eager[1].to_vector<float>();
    REQUIRE(g.size() == w.size());
    for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == w[i]);
  }
  // A gradient seeded by something the loss makes (here loss^2's): the two stay apart.
  auto squared = sc::function([](const sc::Tensor& logits, const sc::Tensor& labels) {
    sc::GradientTape tape;
    tape.watch(logits);
    const sc::Tensor loss = sc::nn::cross_entropy(logits, labels);
    return tape.gradient(loss * loss, logits);
  });
  const sc::Tensor z = sc::random::uniform({6, 4}, -1.0, 1.0, 23).to(gpu);
  const sc::Tensor y = sc::tensor(std::vector<std::int64_t>{0, 1, 2, 3, 0, 1}, sc::Shape{6}).to(gpu);
  squared(z, y);
  CHECK(squared.get_concrete(z, y).stats().plan.losses_with_gradient == 0);
  // A bad label: raised once, at the loss's line.
  const sc::Tensor bad = sc::tensor(std::vector<std::int64_t>{0, 1, 7, 3, 0, 1}, sc::Shape{6}).to(gpu);
  auto both = sc::function([](const sc::Tensor& logits, const sc::Tensor& labels) {
    sc::GradientTape tape;
    tape.watch(logits);
    const sc::Tensor loss = sc::nn::cross_entropy(logits, labels);
    return std::vector<sc::Tensor>{loss, tape.gradient(loss, logits)};
  });
  both(z, y);
  REQUIRE(both.get_concrete(z, y).stats().plan.losses_with_gradient == 1);
  both(z, bad);
  CHECK_THROWS_WITH(sc::cuda::synchronize(), Catch::Contains("[cross_entropy] label 7 at index 2 is out of range [0, 4)"));
  CHECK_NOTHROW(sc::cuda::synchronize());  // raised once
}

TEST_CASE("cuda launches: an eager GPU op with a C++ number copies the number to the GPU once", "[cuda]") {
  // x * 0.5f on the GPU: the number's device copy is made once and kept; Adam's eager step (its
  // constants 1 - beta^t ...) then makes no copy from the host at all.
  const sc::Tensor x = sc::random::uniform({64}, -1.0, 1.0, 31);
  const sc::Tensor xg = x.to(gpu);
  const double number = 0.123456789;  // (a number no other test uses: its first use copies)
  sc::Tensor first, again;
  const auto [k1, c1] = launches_of([&] { first = xg * number; });
  const auto [k2, c2] = launches_of([&] { again = xg * number; });
  if (c1 >= 0) {
    CHECK(c1 == 1);
    CHECK(c2 == 0);
    CHECK(k2 == 1);
  }
  check_same(first, x * number, 0);
  check_same(again, x * number, 0);
  // Another dtype or value is another copy; the same value in f64 too.
  const auto [k3, c3] = launches_of([&] { sc::sum(xg.astype(sc::f64) * number).item<double>(); });
  if (c3 >= 0) CHECK(c3 >= 1);  // (the f64 number, and the item's copy back)
  // Adam's eager step on GPU variables: no copy from the host after its first step.
  const sc::DeviceScope on(gpu);
  sc::nn::Dense layer(8, 4);
  sc::optim::Adam opt(1e-3);
  const auto vars = layer.trainable_variables();
  const sc::Tensor in = sc::random::uniform({5, 8}, -1.0, 1.0, 32);
  const auto step = [&] {
    sc::GradientTape tape;
    const sc::Tensor loss = sc::sum(layer(in));
    opt.apply(tape.gradient(loss, vars), vars);
  };
  step();
  const auto [k4, c4] = launches_of(step);
  if (c4 >= 0) CHECK(c4 == 0);
}

TEST_CASE("cuda launches: small results of GPU constants are folded at trace time (a tape's seed)", "[cuda][staged]") {
  const GraphPolicyScope kernels_only(sc::cuda::GraphPolicy::never);  // the plan kernel by kernel
  // The gradient's seed (ones like the loss) and a scalar computed from constants: results of a
  // few elements on the GPU, computed once when the graph is optimized, no launch at each call.
  auto f = sc::function([](const sc::Tensor& x) {
    sc::GradientTape tape;
    tape.watch(x);
    const sc::DeviceScope on(x.device());
    const sc::Tensor scale = sc::exp(sc::full({}, 0.5, sc::f32)) * 2.f;  // constants only
    const sc::Tensor y = sc::sum(sc::square(x) * scale);
    return tape.gradient(y, x);
  });
  const sc::Tensor x = values({6, 5}, sc::f32, 31);
  const sc::Tensor want = f(x), gx = x.to(gpu);
  check_same(f(gx), want, 1e-6);
  const sc::ConcreteFunction c = f.get_concrete(gx);
  int ops_on_constants = 0;
  for (const sc::graph::Node& n : c.plan().graph().nodes) {
    if (n.kind != sc::graph::NodeKind::op) continue;
    bool all_constant = true;
    for (int v : n.inputs) all_constant = all_constant && c.plan().graph().nodes[c.plan().graph().values[v].node].kind == sc::graph::NodeKind::constant;
    ops_on_constants += all_constant ? 1 : 0;
  }
  INFO(c.stats());
  CHECK(ops_on_constants == 0);
  const auto [kernels, copies] = launches_of([&] { f(gx).to_vector<float>(); });
  if (kernels >= 0) CHECK(kernels == c.stats().plan.kernels);
  (void)copies;
}
