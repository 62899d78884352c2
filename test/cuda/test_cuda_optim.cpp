// The optimizers' fused updates of GPU variables (AdamW's decay in the same kernel), a step's
// updates launched together (optim::fused::GpuUpdates, abi::adam_update / sgd_update over a table
// of variables): the same bits as the composite ops, the CPU's values within rounding, one launch
// per 48 variables of a dtype, and a step's waiting updates dropped, not half-applied, when it is
// left early.
#include "cuda/cuda_testing.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

using namespace sctest::cuda;

namespace {

enum class Opt { adam, sgd, momentum, nesterov, adamw };

std::unique_ptr<sc::optim::Optimizer> make(Opt which) {
  if (which == Opt::adam) return std::make_unique<sc::optim::Adam>(0.01);
  if (which == Opt::adamw) return std::make_unique<sc::optim::AdamW>(0.01, 0.05);
  return std::make_unique<sc::optim::SGD>(0.1, which == Opt::sgd ? 0.0 : 0.9, which == Opt::nesterov);
}

/// Variable k: sizes[k] values of dtypes[k % dtypes.size()].
struct Model {
  std::vector<std::int64_t> sizes;
  std::vector<sc::DType> dtypes;
  sc::DType dtype(std::size_t k) const { return dtypes[k % dtypes.size()]; }
};

/// The variables of m after `steps` steps of `which` on dev (fused updates on or off), each
/// step's gradients fixed values.
std::vector<sc::Tensor> train(Opt which, const Model& m, sc::Device dev, bool fused, int steps = 3) {
  const bool was = sc::optim::fused::enabled;
  sc::optim::fused::enabled = fused;
  std::vector<sc::Variable> vars;
  for (std::size_t k = 0; k < m.sizes.size(); ++k)
    vars.emplace_back(values({m.sizes[k]}, m.dtype(k), 100 + k).to(dev), "w" + std::to_string(k));
  const auto opt = make(which);
  for (int step = 0; step < steps; ++step) {
    std::vector<sc::Tensor> grads;
    for (std::size_t k = 0; k < vars.size(); ++k)
      grads.push_back(values({m.sizes[k]}, m.dtype(k), 1000 * (step + 1) + k).to(dev));
    opt->apply(grads, vars);
  }
  sc::optim::fused::enabled = was;
  std::vector<sc::Tensor> out;
  for (const sc::Variable& v : vars) out.push_back(v.value());
  return out;
}

/// Kernels the second step of Adam over n variables of 5 f32 values launches (-1 on a real GPU).
std::int64_t step_kernels(int n) {
  std::vector<sc::Variable> vars;
  std::vector<sc::Tensor> grads;
  for (int k = 0; k < n; ++k) {
    vars.emplace_back(values({5}, sc::f32, 10 + k).to(gpu));
    grads.push_back(values({5}, sc::f32, 20 + k).to(gpu));
  }
  sc::optim::Adam opt(0.01);
  opt.apply(grads, vars);  // (the first builds the slots)
  return launches_of([&] { opt.apply(grads, vars); }).first;
}

}  // namespace

TEST_CASE("cuda optim: a step's fused updates launched together equal the composite ops and the CPU",
          "[cuda][optim]") {
  // 60 variables (more than one launch holds), of 1 to 530000 elements (past the 2048 blocks a
  // variable gets: a grid-stride loop), all f32, then f32 and f64 by turns (a launch per run of
  // one dtype).
  std::vector<std::int64_t> sizes;
  for (int k = 0; k < 60; ++k) sizes.push_back(std::vector<std::int64_t>{1, 7, 300, 4096, 5000}[k % 5]);
  std::vector<std::int64_t> with_large = sizes;
  with_large[7] = 530000;
  for (const Model& m : {Model{with_large, {sc::f32}}, Model{sizes, {sc::f32, sc::f64}}, Model{{3, 9}, {sc::f64}}})
    for (const Opt which : {Opt::adam, Opt::sgd, Opt::momentum, Opt::nesterov, Opt::adamw}) {
      INFO("optimizer " << static_cast<int>(which) << ", " << m.dtypes.size() << " dtypes, " << m.sizes.size()
                        << " variables");
      const auto fused = train(which, m, gpu, true), composite = train(which, m, gpu, false);
      const auto cpu = train(which, m, sc::Device::cpu(), true);
      for (std::size_t k = 0; k < fused.size(); ++k) {
        INFO("variable " << k);
        REQUIRE(fused[k].device() == gpu);
        CHECK(fused[k].to_vector<double>() == composite[k].to_vector<double>());
        check_same(fused[k], cpu[k], m.dtype(k) == sc::f32 ? 1e-6 : 1e-12);
      }
    }
}

TEST_CASE("cuda optim: subnormal moments are stored as zeros, as on the CPU, fused and op by op",
          "[cuda][optim]") {
  // optim/fused.hpp's flush_subnormal: the GPU kernels, the composite ops on the GPU and the CPU
  // give the same bits (moments m * 0.9 that fall below the smallest normal become zeros of their
  // sign; once they stayed subnormal).
  for (const sc::DType dt : {sc::f32, sc::f64}) {
    INFO(sc::name(dt));
    const double normal_min = dt == sc::f32 ? double(std::numeric_limits<float>::min()) : std::numeric_limits<double>::min();
    const std::vector<double> init{normal_min, -normal_min * 1.05, normal_min / 8, 0.5, 0.0, -1e-3};
    const auto run = [&](bool adam, sc::Device dev, bool fused) {
      const bool was = sc::optim::fused::enabled;
      sc::optim::fused::enabled = fused;
      sc::Variable w(sc::ones({6}, dt).to(dev), "w");
      std::unique_ptr<sc::optim::Optimizer> opt;
      if (adam) opt = std::make_unique<sc::optim::Adam>(0.01);
      else opt = std::make_unique<sc::optim::SGD>(0.1, 0.9);
      opt->build({w});
      const sc::Tensor moment = sc::tensor(init).astype(dt).to(dev);
      if (adam) {
        opt->slot(w, "m").assign(moment);
        opt->slot(w, "v").assign(sc::abs(moment));
      } else {
        opt->slot(w, "velocity").assign(moment);
      }
      opt->apply({sc::zeros({6}, dt).to(dev)}, {w});
      sc::optim::fused::enabled = was;
      std::vector<double> out = w.value().to_vector<double>();
      const std::vector<double> first = opt->slot(w, adam ? "m" : "velocity").value().to_vector<double>();
      out.insert(out.end(), first.begin(), first.end());
      return out;
    };
    for (const bool adam : {true, false}) {
      INFO((adam ? "Adam" : "SGD with momentum"));
      const std::vector<double> cpu = run(adam, sc::Device::cpu(), true);
      const auto same_bits = [&](const std::vector<double>& got) {
        REQUIRE(got.size() == cpu.size());
        for (std::size_t i = 0; i < got.size(); ++i) {
          INFO("value " << i << ": " << got[i] << " against the CPU's " << cpu[i]);
          // the weights within rounding (a GPU's pow in Adam's step size may differ in its last
          // bit), the moments bit for bit
          if (i < 6) CHECK(std::fabs(got[i] - cpu[i]) <= 1e-6 * (1 + std::fabs(cpu[i])));
          else CHECK(std::memcmp(&got[i], &cpu[i], sizeof(double)) == 0);
        }
      };
      same_bits(run(adam, gpu, true));
      same_bits(run(adam, gpu, false));
      for (std::size_t i = 6; i < 9; ++i) CHECK(cpu[i] == 0.0);  // the first moment's subnormals
      CHECK(cpu[9] != 0.0);
    }
  }
}

TEST_CASE("cuda optim: one update launch per 48 variables of a step", "[cuda][optim]") {
  const BatchingScope on(true);
  const std::int64_t one = step_kernels(1);
  if (one < 0) return;  // (a real GPU does not count launches)
  const std::int64_t k48 = step_kernels(48), k49 = step_kernels(49), k100 = step_kernels(100);
  WARN("Adam step of 1, 48, 49, 100 variables: " << one << ", " << k48 << ", " << k49 << ", " << k100 << " kernels");
  CHECK(k48 == one);
  CHECK(k49 == one + 1);
  CHECK(k100 == one + 2);
}

TEST_CASE("cuda optim: a step's waiting GPU updates apply at flush, or not at all when it is left early",
          "[cuda][optim]") {
  const sc::Tensor g = values({10}, sc::f32, 3).to(gpu), lr = sc::full({}, 0.01, sc::f32);
  const auto fresh = [] {
    return std::vector<sc::Variable>{sc::Variable(values({10}, sc::f32, 4).to(gpu), "w"),
                                     sc::Variable(sc::zeros({10}).to(gpu), "m"),
                                     sc::Variable(sc::zeros({10}).to(gpu), "v")};
  };
  const auto adam = [&](std::vector<sc::Variable>& s) {
    sc::optim::fused::adam(g, s[0], s[1], s[2], lr, 0.1, 0.001, 1e-7);
  };
  std::vector<sc::Variable> now = fresh();
  adam(now);  // no step open: launched at once
  const std::vector<double> before = fresh()[0].value().to_vector<double>();
  const std::vector<double> after = now[0].value().to_vector<double>();
  REQUIRE(after != before);

  std::vector<sc::Variable> dropped = fresh();
  {
    sc::optim::fused::GpuUpdates step;
    adam(dropped);
    CHECK(dropped[0].value().to_vector<double>() == before);  // waiting
  }  // left without flush (as when a step throws)
  CHECK(dropped[0].value().to_vector<double>() == before);
  CHECK(dropped[1].value().to_vector<double>() == std::vector<double>(10, 0.0));

  std::vector<sc::Variable> flushed = fresh();
  {
    sc::optim::fused::GpuUpdates step;
    adam(flushed);
    step.flush(std::source_location::current());
  }
  CHECK(flushed[0].value().to_vector<double>() == after);
  CHECK(flushed[1].value().to_vector<double>() == now[1].value().to_vector<double>());
  CHECK(flushed[2].value().to_vector<double>() == now[2].value().to_vector<double>());
}

TEST_CASE("cuda optim: a step over CPU and GPU variables by turns updates each where it lives", "[cuda][optim]") {
  // The CPU's updates run at once, the GPU's wait for the step's launch (one per run of GPU
  // variables sharing a rate): the values of an all-CPU run either way.
  for (const Opt which : {Opt::adam, Opt::momentum, Opt::adamw}) {
    INFO("optimizer " << static_cast<int>(which));
    const auto run = [&](bool mixed) {
      std::vector<sc::Variable> vars;
      for (int k = 0; k < 6; ++k)
        vars.emplace_back(values({3 + k}, sc::f32, 300 + k).to(mixed && k % 2 == 0 ? gpu : sc::Device::cpu()));
      const auto opt = make(which);
      for (int step = 0; step < 3; ++step) {
        std::vector<sc::Tensor> grads;
        for (int k = 0; k < 6; ++k) grads.push_back(values({3 + k}, sc::f32, 400 + 10 * step + k).to(vars[k].device()));
        opt->apply(grads, vars);
      }
      std::vector<sc::Tensor> out;
      for (const sc::Variable& v : vars) out.push_back(v.value());
      return out;
    };
    const auto mixed = run(true), cpu = run(false);
    for (std::size_t k = 0; k < mixed.size(); ++k) {
      INFO("variable " << k);
      CHECK(mixed[k].device() == (k % 2 == 0 ? gpu : sc::Device::cpu()));
      const auto got = mixed[k].to_vector<double>(), want = cpu[k].to_vector<double>();
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-6));
    }
  }
}

TEST_CASE("gradient clipping by norm on the GPU equals the CPU, eager and traced", "[cuda][optim][clip_norm]") {
  for (const sc::DType dt : {sc::f32, sc::f64}) {
    INFO(sc::name(dt));
    const sc::Tensor a = values({33, 7}, dt, 301) * 4.0, b = values({50}, dt, 302);
    auto clip = [](const sc::Tensor& x, const sc::Tensor& y) {
      auto [c, n] = sc::clip_by_global_norm({x, sc::Tensor(), y}, 3.0);
      return std::vector<sc::Tensor>{c[0], c[2], n, sc::clip_by_norm(x, 1.0, {1}), sc::global_norm({y})};
    };
    auto traced = sc::function([&](sc::Tensor x, sc::Tensor y) { return clip(x, y); });
    const std::vector<sc::Tensor> want = clip(a, b);
    for (const auto& got : {clip(a.to(gpu), b.to(gpu)), traced(a.to(gpu), b.to(gpu))}) {
      REQUIRE(got.size() == want.size());
      for (std::size_t k = 0; k < want.size(); ++k) {
        INFO("result " << k);
        check_same(got[k], want[k], tol_of(dt) * 10);
      }
    }
  }
  // Tensors on two devices: the norm is on the first one's, each result on its tensor's.
  const sc::Tensor a = values({4}, sc::f32, 303), b = values({6}, sc::f32, 304);
  auto [mixed, n] = sc::clip_by_global_norm({a.to(gpu), b}, 0.5);
  auto [cpu_only, cpu_n] = sc::clip_by_global_norm({a, b}, 0.5);
  CHECK(n.device() == gpu);
  CHECK(mixed[1].device() == sc::Device::cpu());
  check_same(mixed[0], cpu_only[0], 2e-6);
  check_same(n, cpu_n, 2e-6);
  sctest::check_close(mixed[1].astype(sc::f64).to_vector<double>(), cpu_only[1].astype(sc::f64).to_vector<double>(), 2e-6);
}

TEST_CASE("cuda optim: learning-rate schedules run on the GPU with its variables, eager and traced", "[cuda][optim][schedule]") {
  auto run = [](sc::Device dev, bool traced) {
    sc::Variable w(values({7}, sc::f32, 501).to(dev), "w");
    sc::optim::AdamW adam(1.0, 0.1);
    adam.set_schedule(sc::optim::CosineDecay(0.0, 6, 0.1, 0.05, 2));
    sc::optim::SGD sgd(1.0);
    sgd.set_schedule(sc::optim::PiecewiseConstantDecay({1, 2}, {0.3, 0.2, 0.1}));
    sc::Variable u(values({5}, sc::f64, 502).to(dev), "u");
    auto step = [&](sc::Tensor g, sc::Tensor h) {
      adam.apply({g}, {w});
      sgd.apply({h}, {u});
    };
    auto f = sc::function(step);
    for (int t = 0; t < 5; ++t) {
      const sc::Tensor g = values({7}, sc::f32, 510 + t).to(dev), h = values({5}, sc::f64, 520 + t).to(dev);
      traced ? f(g, h) : step(g, h);
    }
    return std::vector<sc::Tensor>{w.value(), u.value(), sc::scalar(adam.learning_rate()), sc::scalar(sgd.learning_rate())};
  };
  const auto want = run(sc::Device::cpu(), false);
  for (const bool traced : {false, true}) {
    INFO((traced ? "traced" : "eager"));
    const auto got = run(gpu, traced);
    check_same(got[0], want[0], 1e-6);
    check_same(got[1], want[1], 1e-13);
    CHECK(got[2].item<double>() == Approx(want[2].item<double>()).epsilon(1e-14));
    CHECK(got[3].item<double>() == want[3].item<double>());
  }
}
