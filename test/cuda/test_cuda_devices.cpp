// Moves between devices as an op (ops/to_device.hpp): gradients flow back across `to` and across
// the copies a DeviceScope or a CPU scalar makes, traced functions move values they computed, and
// the plan, CSE, saved functions and CUDA graphs handle the copy nodes.
#include "cuda_testing.hpp"

#include <filesystem>
#include <string>
#include <vector>

using namespace sctest::cuda;

namespace {

/// The tape's gradient of loss(x) with respect to x, and the loss.
template <class F>
std::pair<sc::Tensor, sc::Tensor> grad_of(const sc::Tensor& x, F&& loss) {
  sc::GradientTape tape;
  tape.watch(x);
  const sc::Tensor l = loss(x);
  return {tape.gradient(l, x), l};
}

void check_close(const sc::Tensor& got, const sc::Tensor& want, double tol) {
  REQUIRE(got.defined());
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.dtype() == want.dtype());
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  for (std::size_t i = 0; i < w.size(); ++i) {
    INFO("element " << i);
    CHECK(g[i] == Approx(w[i]).margin(tol).epsilon(tol));
  }
}

}  // namespace

TEST_CASE("cuda to: gradients flow back across to(), a DeviceScope's copy and a CPU scalar's", "[cuda][autodiff]") {
  for (const sc::DType d : {sc::f32, sc::f64}) {
    INFO(sc::name(d));
    const sc::Tensor x = values({3, 4}, d, 90);
    const double tol = tol_of(d) * 10;
    // The reference: all on the CPU. d/dx sum(exp(x) * x) = exp(x) * (x + 1).
    const sc::Tensor want = sc::exp(x) * (x + 1.0);
    // Explicitly moved, the loss on the GPU: the gradient comes back to the CPU.
    const auto [g1, l1] = grad_of(x, [](const sc::Tensor& a) {
      const sc::Tensor ag = a.to(gpu);
      return sc::sum(sc::exp(ag) * ag);
    });
    CHECK(l1.device() == gpu);
    CHECK(g1.device() == sc::Device::cpu());
    check_close(g1, want, tol);
    // A GPU input moved to the CPU and back: its gradient stays on the GPU.
    const sc::Tensor xg = x.to(gpu);
    const auto [g2, l2] = grad_of(xg, [](const sc::Tensor& a) {
      const sc::Tensor h = a.to(sc::Device::cpu());
      return sc::sum((sc::exp(h) * h).to(gpu));
    });
    CHECK(g2.device() == gpu);
    check_close(g2, want, tol);
    // A DeviceScope sends the op to the GPU: the copy it makes is on the tape.
    const auto [g3, l3] = grad_of(x, [](const sc::Tensor& a) {
      const sc::DeviceScope on(gpu);
      return sc::sum(sc::exp(a) * a);
    });
    CHECK(l3.device() == gpu);
    check_close(g3, want, tol);
    // A rank-0 CPU tensor joining a GPU op: its gradient is the sum over the GPU op, on the CPU.
    const sc::Tensor s = sc::scalar(1.5).astype(d);
    const auto [gs, ls] = grad_of(s, [&](const sc::Tensor& c) { return sc::sum(xg * c); });
    CHECK(gs.device() == sc::Device::cpu());
    check_close(gs, sc::sum(x), tol * 10);
  }
}

TEST_CASE("cuda to: a finite-difference check of a loss computed on both devices", "[cuda][autodiff]") {
  const sc::Tensor x = values({2, 3}, sc::f64, 91);
  const auto f = [](const sc::Tensor& a) {
    const sc::Tensor on_gpu = sc::tanh(a.to(gpu)) * 2.0;
    return sc::sum(on_gpu.to(sc::Device::cpu()) * a);
  };
  const auto [g, l] = grad_of(x, f);
  const auto xs = x.to_vector<double>();
  const auto gs = g.to_vector<double>();
  const double h = 1e-6;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    std::vector<double> up = xs, down = xs;
    up[i] += h;
    down[i] -= h;
    const double fd = (f(sc::tensor(up, x.shape())).item<double>() - f(sc::tensor(down, x.shape())).item<double>()) / (2 * h);
    INFO("element " << i);
    CHECK(gs[i] == Approx(fd).epsilon(1e-7).margin(1e-8));
  }
}

TEST_CASE("cuda to: a traced function moves values it computed, both ways, and its gradients", "[cuda][staged]") {
  const sc::Tensor x = values({4, 5}, sc::f32, 92), w = values({5, 3}, sc::f32, 93);
  // CPU argument, a product on the GPU, a row sum back on the CPU.
  const auto body = [](const sc::Tensor& a, const sc::Tensor& b) {
    const sc::Tensor h = sc::relu(sc::matmul(a.to(gpu), b.to(gpu)));
    return sc::sum(h, {1}).to(sc::Device::cpu()) + 1.f;
  };
  auto f = sc::function(body);
  const sc::Tensor want = body(x, w);  // eager
  CHECK(want.device() == sc::Device::cpu());
  for (int call = 0; call < 3; ++call) {
    const sc::Tensor got = f(x, w);
    CHECK(got.device() == sc::Device::cpu());
    check_close(got, want, 1e-5);  // (the plan's product takes its ReLU as an epilogue)
  }
  const sc::ConcreteFunction c = f.get_concrete(x, w);
  const std::string text = c.graph().str();
  INFO(text);
  // Three copies (two up, one down), each a node of the graph.
  std::size_t copies = 0;
  for (std::size_t at = text.find("= to("); at != std::string::npos; at = text.find("= to(", at + 1)) ++copies;
  CHECK(copies == 3);
  // Values on two devices: the plan runs kernel by kernel and says why it is no CUDA graph.
  CHECK(c.stats().plan.cuda_graph.find("cpu values") != std::string::npos);
  // The tape inside the trace: gradients of the CPU argument through both copies.
  auto grads = sc::function([&](const sc::Tensor& a, const sc::Tensor& b) {
    sc::GradientTape tape;
    tape.watch(a);
    tape.watch(b);
    const sc::Tensor l = sc::sum(body(a, b) * body(a, b));
    return tape.gradient(l, std::vector<sc::Tensor>{a, b});
  });
  sc::GradientTape tape;
  tape.watch(x);
  tape.watch(w);
  const sc::Tensor l = sc::sum(body(x, w) * body(x, w));
  const auto eager = tape.gradient(l, std::vector<sc::Tensor>{x, w});
  const auto traced = grads(x, w);
  for (int k = 0; k < 2; ++k) {
    CHECK(traced[k].device() == sc::Device::cpu());
    check_close(traced[k], eager[k], 1e-5);
  }
}

TEST_CASE("cuda to: copies of one value to one device are one node, to two devices two", "[cuda][staged]") {
  auto f = sc::function([](const sc::Tensor& a) {
    const sc::Tensor b = a * 2.f;
    return sc::sum(b.to(gpu)) + sc::sum(b.to(gpu) * 3.f);
  });
  const sc::Tensor x = values({8}, sc::f32, 94);
  check_close(f(x), sc::sum(x * 2.f) * 4.f, 1e-5);
  const std::string text = f.get_concrete(x).graph().str();
  INFO(text);
  CHECK(text.find("= to(") != std::string::npos);
  CHECK(text.find("= to(", text.find("= to(") + 1) == std::string::npos);  // CSE merged the two
  if (sc::cuda::device_count() < 2) return;
  const sc::Device second = sc::Device::cuda(1);
  auto g = sc::function([&](const sc::Tensor& a) {
    const sc::Tensor b = a * 2.f;
    return b.to(gpu) + 1.f;
  });
  auto h = sc::function([&](const sc::Tensor& a) {
    const sc::Tensor b = a * 2.f;
    return b.to(second) + 1.f;
  });
  const sc::Tensor y0 = g(x), y1 = h(x);
  CHECK(y0.device() == gpu);
  CHECK(y1.device() == second);
  CHECK(y0.to_vector<float>() == y1.to_vector<float>());
  // Device to device inside a trace: a value computed on the first GPU moved to the second.
  auto k = sc::function([&](const sc::Tensor& a) { return sc::exp(a).to(second) * 2.f; });
  const sc::Tensor y2 = k(x.to(gpu));
  CHECK(y2.device() == second);
  check_close(y2, sc::exp(x) * 2.f, 1e-6);
  CHECK(k.get_concrete(x.to(gpu)).stats().plan.cuda_graph.find("several GPUs") != std::string::npos);
}

TEST_CASE("cuda to: a symbolic CPU scalar joins a GPU op in a trace, a GPU variable takes a CPU-computed value",
          "[cuda][staged]") {
  const sc::Tensor x = values({6}, sc::f32, 95);
  sc::Variable v(x.to(gpu), "v"), w(x.to(gpu), "w");
  auto step = sc::function([&](const sc::Tensor& a, const sc::Tensor& scale) {
    const sc::Tensor s = sc::sum(scale * scale);        // rank 0, on the CPU
    v.assign(v.value() * s + (a * 0.5f).to(gpu));       // the GPU op reads s; the CPU half is moved
    w.assign(a * s);                                     // computed on the CPU, kept on w's device
    return v.value();
  });
  const sc::Tensor scale = sc::tensor(std::vector<float>{1.f, 0.5f});
  const sc::Tensor want = x * 1.25f + x * 0.5f;
  const sc::Tensor got = step(x, scale);
  CHECK(got.device() == gpu);
  CHECK(v.device() == gpu);
  CHECK(w.device() == gpu);
  check_close(v.value(), want, 1e-6);
  check_close(w.value(), x * 1.25f, 1e-6);
  step(x, scale);
  check_close(v.value(), want * 1.25f + x * 0.5f, 1e-5);
}

TEST_CASE("cuda to: a saved function keeps its copies and their devices", "[cuda][staged]") {
  auto f = sc::function([](const sc::Tensor& a) { return sc::sum(sc::exp(a.to(gpu)), {0}).to(sc::Device::cpu()); });
  const sc::Tensor x = values({3, 2}, sc::f32, 96);
  const sc::Tensor want = f(x);
  const auto path = (std::filesystem::temp_directory_path() / "sc_test_cuda_to_saved.scg").string();
  f.get_concrete(x).save(path);
  const std::string text = f.get_concrete(x).graph().str();
  const sc::ConcreteFunction loaded = sc::load_function(path);
  std::filesystem::remove(path);
  CHECK(loaded.graph().str() == text);
  const sc::Tensor got = loaded(x);
  CHECK(got.device() == sc::Device::cpu());
  CHECK(got.to_vector<float>() == want.to_vector<float>());
}

TEST_CASE("cuda to: item, to_vector and printing read GPU values without taping a copy", "[cuda][autodiff]") {
  const sc::Tensor x = values({4}, sc::f32, 97).to(gpu);
  sc::GradientTape tape;
  tape.watch(x);
  const sc::Tensor l = sc::sum(x * x);
  const float before = l.item<float>();
  (void)x.to_vector<float>();
  const sc::Tensor g = tape.gradient(l, x);
  CHECK(g.device() == gpu);
  check_close(g, x * 2.f, 1e-6);
  CHECK(before == Approx(sc::sum(x * x).item<float>()));
}

TEST_CASE("cuda to: constants moved are folded, round trips and chains of moves are simplified", "[cuda][staged]") {
  const sc::Tensor x = values({3}, sc::f32, 98);
  const sc::Tensor c = sc::tensor(std::vector<float>{1.f, 2.f, 3.f});
  // exp of a CPU constant, moved to the GPU: folded to a GPU constant, so the plan holds no CPU
  // value, copies nothing at each call and can be replayed as a CUDA graph.
  auto f = sc::function([&](const sc::Tensor& a) { return a * sc::exp(c).to(gpu); });
  check_close(f(x.to(gpu)), x * sc::exp(c), 1e-6);
  const sc::ConcreteFunction cf = f.get_concrete(x.to(gpu));
  INFO(cf.graph().str());
  CHECK(cf.graph().str().find("= to(") == std::string::npos);
  CHECK(cf.stats().plan.cuda_graph.find("cpu values") == std::string::npos);
  const sc::Tensor xg = x.to(gpu);
  const GraphPolicyScope kernels_only(sc::cuda::GraphPolicy::never);  // its kernels, not a capture's
  const auto [kernels, copies] = launches_of([&] {
    (void)f(xg);
    sc::cuda::synchronize();
  });
  if (copies >= 0) {
    CHECK(kernels == 1);
    CHECK(copies == 0);
  }
  // A round trip is no copy at all; a chain of moves is one.
  auto g = sc::function([](const sc::Tensor& a) { return sc::exp(a).to(sc::Device::cpu()).to(gpu) * 2.f; });
  check_close(g(x.to(gpu)), sc::exp(x) * 2.f, 1e-6);
  CHECK(g.get_concrete(x.to(gpu)).graph().str().find("= to(") == std::string::npos);
  if (sc::cuda::device_count() < 2) return;
  const sc::Device second = sc::Device::cuda(1);
  auto h = sc::function([&](const sc::Tensor& a) { return sc::exp(a).to(sc::Device::cpu()).to(second) * 2.f; });
  check_close(h(x.to(gpu)), sc::exp(x) * 2.f, 1e-6);
  const std::string text = h.get_concrete(x.to(gpu)).graph().str();
  INFO(text);
  const auto first = text.find("= to(");
  CHECK(first != std::string::npos);
  CHECK(text.find("= to(", first + 1) == std::string::npos);
}

TEST_CASE("cuda to: a traced function called under a DeviceScope runs where eager code would", "[cuda][staged]") {
  const sc::Tensor x = values({4}, sc::f32, 99);
  auto f = sc::function([](const sc::Tensor& a) { return a * 2.f + 1.f; });
  CHECK(f(x).device() == sc::Device::cpu());
  {
    const sc::DeviceScope on(gpu);
    const sc::Tensor y = f(x);  // retraced: the argument moved over by a node, the ops on the GPU
    CHECK(y.device() == gpu);
    CHECK(y.device() == (x * 2.f + 1.f).device());
    check_close(y, x * 2.f + 1.f, 0);
  }
  CHECK(f.trace_count() == 2);
  CHECK(f(x).device() == sc::Device::cpu());  // outside the scope: the first trace again
  CHECK(f.trace_count() == 2);
}

TEST_CASE("cuda to: host_fn's function gets GPU inputs on the host, and gradients go back to the GPU",
          "[cuda][staged][autodiff]") {
  // fn reads its inputs' bytes on the host (as host_fn promises it may): 2x, with gradient 2g.
  const auto fn = [](const std::vector<sc::Tensor>& a) {
    REQUIRE(a[0].device() == sc::Device::cpu());
    const float* p = static_cast<const float*>(a[0].raw_data());
    std::vector<float> v(p, p + a[0].numel());
    for (float& e : v) e *= 2.f;
    return std::vector<sc::Tensor>{sc::tensor(v, a[0].shape())};
  };
  const auto grad = [](const std::vector<sc::Tensor>&, const std::vector<sc::Tensor>&,
                       const std::vector<sc::Tensor>& g) { return std::vector<sc::Tensor>{g[0] * 2.f}; };
  const std::vector<sc::TensorSpec> spec = {{sc::Shape{4}, sc::f32}};
  const sc::Tensor x = values({4}, sc::f32, 100);
  const sc::Tensor xg = x.to(gpu);
  // Eager: the result on the CPU, the gradient of a GPU loss back on the GPU input.
  const auto [g, l] = grad_of(xg, [&](const sc::Tensor& a) {
    const sc::Tensor h = sc::host_fn(fn, {a}, spec, grad)[0];
    CHECK(h.device() == sc::Device::cpu());
    return sc::sum(h.to(gpu) * a);  // d/da sum(2a * a) = 4a
  });
  CHECK(g.device() == gpu);
  check_close(g, x * 4.f, 1e-6);
  // Traced: the same, twice (the plan's host_fn step gets host tensors at every call).
  auto f = sc::function([&](const sc::Tensor& a) {
    sc::GradientTape tape;
    tape.watch(a);
    const sc::Tensor loss = sc::sum(sc::host_fn(fn, {sc::exp(a)}, spec, grad)[0].to(gpu));
    return tape.gradient(loss, a);  // 2 exp(a)
  });
  for (int call = 0; call < 2; ++call) {
    const sc::Tensor t = f(xg);
    CHECK(t.device() == gpu);
    check_close(t, sc::exp(x) * 2.f, 1e-5);
  }
  // A function that makes its output on the GPU: the result still comes back on the host.
  const auto on_gpu = [](const std::vector<sc::Tensor>& a) { return std::vector<sc::Tensor>{a[0].to(gpu) + 1.f}; };
  const sc::Tensor r = sc::host_fn(on_gpu, {x}, spec)[0];
  CHECK(r.device() == sc::Device::cpu());
  check_close(r, x + 1.f, 0);
  auto k = sc::function([&](const sc::Tensor& a) { return sc::host_fn(on_gpu, {a}, spec)[0] * 2.f; });
  const sc::Tensor r2 = k(x);
  CHECK(r2.device() == sc::Device::cpu());
  check_close(r2, (x + 1.f) * 2.f, 0);
}

TEST_CASE("cuda to: cond and while_loop outputs keep each their own device, and branches must agree on it",
          "[cuda][staged][control]") {
  const sc::Tensor x = values({3}, sc::f32, 101);
  const sc::Tensor xg = x.to(gpu);
  // A loop over a GPU value with a CPU counter: the counter stays on the CPU (as eagerly), and the
  // gradient through the loop comes back to the GPU.
  const auto loop = [](const sc::Tensor& a) {
    return sc::while_loop([](const sc::Tensor&, const sc::Tensor& i) { return i < 3; },
                          [](const sc::Tensor& v, const sc::Tensor& i) { return std::make_tuple(v * v, i + 1); },
                          std::make_tuple(a, sc::scalar<std::int64_t>(0)));
  };
  auto counter = sc::function([&](const sc::Tensor& a) { return std::get<1>(loop(a)) * 10; });
  const sc::Tensor n = counter(xg);
  CHECK(n.device() == sc::Device::cpu());
  CHECK(n.item<std::int64_t>() == 30);
  auto grad = sc::function([&](const sc::Tensor& a) {
    sc::GradientTape tape;
    tape.watch(a);
    return tape.gradient(sc::sum(std::get<0>(loop(a))), a);  // d/da a^8 = 8 a^7
  });
  const sc::Tensor g = grad(xg);
  CHECK(g.device() == gpu);
  check_close(g, x * x * x * x * x * x * x * 8.f, 1e-5);
  // Two outputs of one cond on two devices.
  auto both = sc::function([](const sc::Tensor& a) {
    return sc::cond(sc::sum(a) > 0.f, [&] { return std::make_tuple(a * 2.f, (a * 2.f).to(sc::Device::cpu())); },
                    [&] { return std::make_tuple(a, a.to(sc::Device::cpu())); });
  });
  const auto [on_gpu, on_cpu] = both(xg);
  CHECK(on_gpu.device() == gpu);
  CHECK(on_cpu.device() == sc::Device::cpu());
  check_close(on_cpu, on_gpu, 0);
  // Branches that put an output on two devices, a body that moves a loop variable: named errors.
  auto bad_cond = sc::function([&](const sc::Tensor& a) {
    return sc::cond(sc::sum(a) > 0.f, [&] { return a; }, [&] { return a.to(sc::Device::cpu()); });
  });
  const int line = __LINE__ - 2;
  CHECK_THROWS_WITH(bad_cond(xg), Catch::Contains("[cond] output 0 is on cuda:0 in then_fn but on cpu in else_fn") &&
                                      Catch::Contains("test_cuda_devices.cpp:" + std::to_string(line)));
  auto bad_loop = sc::function([](const sc::Tensor& a) {
    return sc::while_loop([](const sc::Tensor& v) { return sc::sum(v) < 100.f; },
                          [](const sc::Tensor& v) { return (v * 2.f).to(sc::Device::cpu()); }, a);
  });
  CHECK_THROWS_WITH(bad_loop(sc::abs(xg) + 1.f),
                    Catch::Contains("[while_loop] loop variable 0 enters on cuda:0 but body_fn returns it on cpu"));
}

TEST_CASE("cuda to: gradients through GPU control flow start their placeholder zeros on the GPU",
          "[cuda][staged][control][autodiff]") {
  // A loop whose counter and an unconnected variable live on the GPU, and a cond whose untaken
  // branch reads a GPU capture: their gradients' zeros (unconnected inputs, the replay's counter)
  // were made on the CPU and met GPU values ("[mul] inputs are on different devices").
  const sc::Tensor x = values({3}, sc::f32, 102);
  const sc::Tensor xg = x.to(gpu);
  const auto grads = [](const sc::Tensor& a, const sc::Tensor& b) {
    sc::GradientTape tape;
    tape.watch(a);
    tape.watch(b);
    const auto r = sc::while_loop(
        [](const sc::Tensor&, const sc::Tensor& i, const sc::Tensor&) { return i < 3; },
        [](const sc::Tensor& v, const sc::Tensor& i, const sc::Tensor& u) { return std::make_tuple(v * v, i + 1, u + 1.f); },
        std::make_tuple(a, sc::scalar<std::int64_t>(0).to(gpu), b));
    return tape.gradient(sc::sum(std::get<0>(r)), std::vector<sc::Tensor>{a, b});
  };
  auto traced = sc::function(grads);
  const sc::Tensor other = xg + 1.f;  // (not xg itself: its gradient would be xg's)
  for (const auto& g : {grads(xg, other), std::vector<sc::Tensor>(traced(xg, other))}) {
    REQUIRE(g.size() == 2);
    CHECK(g[0].device() == gpu);
    check_close(g[0], x * x * x * x * x * x * x * 8.f, 1e-5);
    if (g[1].defined()) {
      CHECK(g[1].device() == gpu);
      check_close(g[1], x * 0.f, 0);
    }
  }
  auto c = sc::function([](const sc::Tensor& a, const sc::Tensor& b) {
    sc::GradientTape tape;
    tape.watch(a);
    tape.watch(b);
    const sc::Tensor r = sc::cond(sc::sum(a) > -100.f, [&] { return a * 2.f; }, [&] { return b * 3.f; });
    return tape.gradient(sc::sum(r), std::vector<sc::Tensor>{a, b});
  });
  const std::vector<sc::Tensor> g = c(xg, xg * 2.f);
  check_close(g[0], x * 0.f + 2.f, 0);
  CHECK(g[1].device() == gpu);
  check_close(g[1], x * 0.f, 0);
}

TEST_CASE("cuda to: an optimizer step given a gradient on another device than its variable changes nothing",
          "[cuda][optim]") {
  // The device check comes with the other checks, before any change: the step used to fail at
  // its first op on that variable, after the counter and the variables before it had moved.
  sc::Variable w1(sc::ones({3}).to(gpu), "w1"), w2(sc::ones({3}).to(gpu), "w2");
  sc::optim::Adam opt(0.1);
  opt.apply({sc::ones({3}).to(gpu), sc::ones({3}).to(gpu)}, {w1, w2});
  const auto before = w1.value().to_vector<float>();
  const std::int64_t steps = opt.iterations();
  const int line = __LINE__ + 1;
  CHECK_THROWS_WITH(opt.apply({sc::ones({3}).to(gpu), sc::ones({3})}, {w1, w2}),
                    Catch::Contains("gradient 1 is on cpu but variable 1 ('w2') is on cuda:0") &&
                        Catch::Contains("test_cuda_devices.cpp:" + std::to_string(line)));
  CHECK(w1.value().to_vector<float>() == before);
  CHECK(opt.iterations() == steps);
  CHECK_THROWS_AS(opt.apply({sc::ones({3}).to(gpu), sc::ones({3})}, {w1, w2}), sc::DeviceError);
}

TEST_CASE("cuda to: jacobian of a GPU function, and an output gradient on another device than its target",
          "[cuda][autodiff]") {
  const sc::Tensor x = values({3}, sc::f32, 103);
  const auto f = [](const sc::Tensor& a) { return sc::exp(a) * a; };
  // Its seeds were made on the CPU and met the GPU target: "[mul] inputs are on different devices".
  const sc::Tensor j = sc::jacobian(f, x.to(gpu));
  CHECK(j.device() == gpu);
  check_close(j, sc::jacobian(f, x), 1e-6);
  sc::GradientTape tape;
  const sc::Tensor xg = x.to(gpu);
  tape.watch(xg);
  const sc::Tensor y = f(xg);
  const int line = __LINE__ + 1;
  CHECK_THROWS_WITH(tape.gradient(y, xg, sc::ones({3})),
                    Catch::Contains("[gradient] output_gradient is on cpu, the target on cuda:0") &&
                        Catch::Contains("test_cuda_devices.cpp:" + std::to_string(line)));
}

TEST_CASE("cuda to: an LSTM cell made on the GPU starts its state there, with or without a scope", "[cuda][nn]") {
  sc::manual_seed(7);
  sc::nn::LSTMCell cell = [] {
    const sc::DeviceScope on(gpu);
    return sc::nn::LSTMCell(4, 3, 11);
  }();
  const auto state = cell.initial_state(2);  // no scope: it was made on the CPU, and the step failed
  CHECK(state.first.device() == gpu);
  CHECK(state.second.device() == gpu);
  const auto next = cell(values({2, 4}, sc::f32, 104).to(gpu), state);
  CHECK(next.first.device() == gpu);
  const sc::DeviceScope on(sc::Device::cpu());
  CHECK(cell.initial_state(2).first.device() == gpu);
}
