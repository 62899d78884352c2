// Eager GPU code that runs staged pieces: nn::LSTMCell's step as a staged function of its own
// (lstm_cell_staging), against the same cell run op by op and against the CPU, values, gradients
// and launches; and what it leans on: a GPU function with several outputs differentiated through
// one of them (the others' zero gradients made on their GPU), zeros made on a GPU by a fill kernel.
// nn::GRUCell, nn::MultiHeadAttention, nn::TransformerEncoderLayer and nn::BatchNorm on a GPU against
// the CPU.
#include "cuda_testing.hpp"

#include <stagecraft/nn/layers.hpp>

#include "nn/lstm_testing.hpp"

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

using namespace sctest::cuda;

namespace {

using sctest::lstm::StagingScope;

}  // namespace

TEST_CASE("cuda eager: an LSTMCell step runs staged on the GPU, equal to its ops run one by one and to the CPU",
          "[cuda][staged][lstm]") {
  constexpr int steps = 12;
  for (const std::int64_t batch : {1, 5}) {
    INFO("batch " << batch);
    sc::nn::LSTMCell cell{6, 8, 3};
    const std::unique_ptr<sc::nn::LSTMCell> gcell = sctest::lstm::copy_on(cell, gpu);
    std::vector<sc::Tensor> xs, gxs;
    for (int t = 0; t < steps; ++t) {
      xs.push_back(values({batch, 6}, sc::f32, 700 + t));
      gxs.push_back(xs.back().to(gpu));
    }
    const std::vector<sc::Tensor> want = [&] {  // the CPU, op by op
      const StagingScope off(false);
      return sctest::lstm::run(cell, xs);
    }();
    std::vector<sc::Tensor> by_ops, staged;
    Launches ops_launches, staged_launches;
    {
      const StagingScope off(false);
      const BatchingScope alone(false);  // (a launch per op: what staging saves)
      sctest::lstm::run(*gcell, gxs);  // (warm: kernels loaded, the allocator's cache filled)
      ops_launches = counted([&] { by_ops = sctest::lstm::run(*gcell, gxs); });
    }
    {
      const StagingScope on(true);
      const GraphPolicyScope cheaper(sc::cuda::GraphPolicy::when_cheaper);  // (the default; counted below)
      sctest::lstm::run(*gcell, gxs);  // traced, then captured
      sctest::lstm::run(*gcell, gxs);
      staged_launches = counted([&] { staged = sctest::lstm::run(*gcell, gxs); });
    }
    REQUIRE(staged.size() == want.size());
    for (std::size_t k = 0; k < want.size(); ++k) {
      INFO("result " << k);
      check_same(by_ops[k], want[k], 1e-5);
      check_same(staged[k], want[k], 1e-5);
    }
    // A step's ~17 forward and ~40 backward launches become a graph launch forward and one
    // backward (h's and c's gradients together: one tape entry), and the tape's sums.
    if (ops_launches.kernels >= 0) {
      WARN("eager LSTM, " << steps << " steps, batch " << batch << ": " << ops_launches.kernels
                          << " kernels op by op; staged " << staged_launches.kernels << " kernels and "
                          << staged_launches.graphs << " graph launches");
      CHECK(ops_launches.graphs == 0);
      CHECK(staged_launches.graphs == 2 * steps);  // (every plan replayed)
      CHECK((staged_launches.kernels + staged_launches.graphs) * 8 < ops_launches.kernels);
      CHECK(staged_launches.copies == 0);
    }
  }
}

TEST_CASE("cuda eager: an LSTMCell step given a CPU state, another dtype or an outer trace runs op by op as before",
          "[cuda][staged][lstm]") {
  const StagingScope on(true);
  std::unique_ptr<sc::nn::LSTMCell> gcell;
  {
    const sc::DeviceScope on_gpu(gpu);
    gcell = std::make_unique<sc::nn::LSTMCell>(3, 4, 1);
  }
  const sc::Tensor x = values({2, 3}, sc::f32, 5).to(gpu);
  auto st = gcell->initial_state(2);
  const auto [h, c] = (*gcell)(x, st);
  CHECK(h.device() == gpu);
  // A CPU state, an f64 input: what the ops give one by one (an error, a promotion), staging or not.
  const std::pair<sc::Tensor, sc::Tensor> cpu_state{sc::zeros({2, 4}), sc::zeros({2, 4})};
  const auto outcome = [&](const sc::Tensor& in, const std::pair<sc::Tensor, sc::Tensor>& s, bool staging) {
    const StagingScope mode(staging);
    try {
      const sc::Tensor out = (*gcell)(in, s).first;
      return std::string(sc::name(out.dtype())) + " " + out.device().str() + " " +
             std::to_string(out.to_vector<double>()[0]);
    } catch (const sc::Error& e) {
      return std::string("error: ") + e.what();
    }
  };
  CHECK_THAT(outcome(x, cpu_state, true), Catch::StartsWith("error: ") && Catch::Contains("device"));
  CHECK(outcome(x, cpu_state, true) == outcome(x, cpu_state, false));
  CHECK(outcome(x.astype(sc::f64), st, true) == outcome(x.astype(sc::f64), st, false));
  // traced: the step's ops join the outer graph (its gates one fused group), no inner function
  auto f = sc::function([&](const sc::Tensor& a) { return (*gcell)(a, gcell->initial_state(2)).first; });
  check_same(f(x), h, 1e-6);
  CHECK(f.get_concrete(x).graph().str().find("LSTMCell") == std::string::npos);
}

TEST_CASE("cuda eager: a GPU function with two outputs differentiated through one of them", "[cuda][staged]") {
  // The other output's zero gradient is made on its device (it was made on the CPU: a ShapeError).
  auto f = sc::function([](const sc::Tensor& a) { return std::vector<sc::Tensor>{sc::exp(a), a * 3.f}; });
  const sc::Tensor x = values({4}, sc::f32, 9);
  for (const sc::Device d : {sc::Device::cpu(), gpu}) {
    INFO(d.str());
    const sc::Tensor xd = x.to(d);
    for (int k = 0; k < 2; ++k) {
      sc::GradientTape tape;
      tape.watch(xd);
      const std::vector<sc::Tensor> out = f(xd);
      const sc::Tensor g = tape.gradient(sc::sum(out[k]), std::vector<sc::Tensor>{xd})[0];
      REQUIRE(g.device() == d);
      const sc::Tensor want = k == 0 ? sc::exp(x) : sc::full({4}, 3.0, sc::f32);
      const auto gv = g.to_vector<float>(), wv = want.to_vector<float>();
      for (std::size_t i = 0; i < wv.size(); ++i) CHECK(gv[i] == Approx(wv[i]).epsilon(1e-6));
    }
  }
}

TEST_CASE("cuda eager: zeros, ones and full on a GPU are a fill kernel each (batched), no copy", "[cuda]") {
  const sc::DeviceScope on_gpu(gpu);
  sc::Tensor z, o, f, big, nan;
  const auto [kernels, copies] = launches_of([&] {
    z = sc::zeros({3, 5}, sc::i64);
    o = sc::ones({7});
    f = sc::full({2, 2}, 2.5, sc::f64);
    big = sc::full({2}, std::int64_t{1} << 60);  // held exactly: a kernel fill through a double
  });
  if (kernels >= 0) {
    CHECK(kernels == (sc::cuda::eager_batching() ? 1 : 4));  // four fills, or one launch of the four
    CHECK(copies == 0);
  }
  CHECK(z.device() == gpu);
  CHECK(z.to_vector<std::int64_t>() == std::vector<std::int64_t>(15, 0));
  CHECK(o.to_vector<float>() == std::vector<float>(7, 1.f));
  CHECK(f.to_vector<double>() == std::vector<double>(4, 2.5));
  CHECK(big.to_vector<std::int64_t>() == std::vector<std::int64_t>(2, std::int64_t{1} << 60));
  // not held exactly by a double: filled on the host and copied
  const std::int64_t odd = (std::int64_t{1} << 60) + 1;
  CHECK(sc::full({3}, odd).to_vector<std::int64_t>() == std::vector<std::int64_t>(3, odd));
  nan = sc::full({2}, std::nan(""), sc::f32);
  CHECK(std::isnan(nan.to_vector<float>()[1]));
  // zeros_like and ones_like keep the tensor's device, whatever the scope
  const sc::Tensor cpu = sc::ones({2}).to(sc::Device::cpu());
  CHECK(sc::zeros_like(cpu).device() == sc::Device::cpu());
  CHECK(sc::ones_like(o).device() == gpu);
}

TEST_CASE("cuda eager: second derivatives through a staged LSTMCell step equal those of its ops", "[cuda][staged][lstm]") {
  std::unique_ptr<sc::nn::LSTMCell> gcell;
  {
    const sc::DeviceScope on_gpu(gpu);
    gcell = std::make_unique<sc::nn::LSTMCell>(3, 4, 2);
  }
  const sc::Tensor x = values({2, 3}, sc::f32, 11).to(gpu);
  const sc::Tensor by_ops = sctest::lstm::second_derivatives(*gcell, x, false)[1],
                   staged = sctest::lstm::second_derivatives(*gcell, x, true)[1];
  REQUIRE(staged.device() == gpu);
  check_same(staged, by_ops.to(sc::Device::cpu()), 1e-5);
}

TEST_CASE("cuda eager: custom_gradient staged on a GPU gives the rule's gradient, equal to the CPU's, its plan fused as without it",
          "[cuda][staged][custom]") {
  // tanh(a) * 2 with its gradient clipped to [-0.5, 0.5] before the tanh's derivative.
  auto clipped = [](const sc::Tensor& a) {
    return sc::custom_gradient([](const std::vector<sc::Tensor>& xs) { return sc::tanh(xs[0]) * 2.f; },
                               [](const sc::Tensor& g, const std::vector<sc::Tensor>& xs, const sc::Tensor&) {
                                 const sc::Tensor t = sc::tanh(xs[0]);
                                 return std::vector<sc::Tensor>{sc::minimum(sc::maximum(g, -0.5f), 0.5f) * (1.f - t * t) * 2.f};
                               },
                               {a});
  };
  auto body = [&](const sc::Tensor& a, const sc::Tensor& w) { return sc::sum(clipped(a * w) * 3.f - a); };
  auto f = sc::function(body);
  const sc::Tensor x = values({64}, sc::f32, 31), w = values({64}, sc::f32, 32);
  const sc::Tensor xg = x.to(gpu), wg = w.to(gpu);
  const auto grads = [](const auto& fn, const sc::Tensor& a, const sc::Tensor& b) {
    sc::GradientTape tape;
    tape.watch({a, b});
    return tape.gradient(fn(a, b), std::vector<sc::Tensor>{a, b});
  };
  const std::vector<sc::Tensor> want = grads(body, x, w);  // the CPU, eager
  for (const bool nested : {false, true}) {
    INFO("nested tapes: " << nested);
    std::optional<sc::GradientTape> outer;
    if (nested) outer.emplace();
    const std::vector<sc::Tensor> got = grads([&](const sc::Tensor& a, const sc::Tensor& b) { return f(a, b); }, xg, wg);
    check_same(got[0], want[0], 1e-5);
    check_same(got[1], want[1], 1e-5);
  }
  // The plan runs the forward ops alone: as many kernels as the same ops without custom_gradient.
  auto plain = sc::function([](const sc::Tensor& a, const sc::Tensor& b) { return sc::sum(sc::tanh(a * b) * 2.f * 3.f - a); });
  CHECK(f.get_concrete(xg, wg).stats().plan.kernels == plain.get_concrete(xg, wg).stats().plan.kernels);
  check_same(f(xg, wg), plain(x, w), 1e-5);
}

TEST_CASE("cuda: BatchNorm on the GPU equals the CPU, training and evaluation, eager and traced, with gradients",
          "[cuda][staged][batch_norm]") {
  auto run = [](sc::Device dev, bool traced) {
    const sc::DeviceScope on(dev);
    sc::nn::BatchNorm bn(4, 0.1, 1e-5);
    auto step = [&](sc::Tensor x) {
      sc::GradientTape tape;
      tape.watch(x);
      const sc::Tensor loss = sc::sum(sc::square(bn(x)) * x);
      std::vector<sc::Tensor> out = tape.gradient(loss, std::vector<sc::Tensor>{x, bn.gamma, bn.beta});
      out.push_back(loss);
      return out;
    };
    auto f = sc::function(step);
    std::vector<sc::Tensor> out;
    for (int t = 0; t < 2; ++t) {
      const sc::Tensor x = values({3, 4, 5, 2}, sc::f32, 600 + t).to(dev);
      for (const sc::Tensor& r : traced ? f(x) : step(x)) out.push_back(r);
    }
    out.push_back(bn.moving_mean.value());
    out.push_back(bn.moving_variance.value());
    out.push_back(bn(values({2, 4, 3, 3}, sc::f32, 610).to(dev), false));
    return out;
  };
  same_on_gpu_eager_and_traced(run, 2e-5);
}

TEST_CASE("cuda: GRUCell on the GPU equals the CPU, staged and op by op, eager and traced, with gradients",
          "[cuda][staged][gru]") {
  const sc::nn::GRUCell ref(5, 7, 4);  // the weights, copied to each run's cell
  auto run = [&](sc::Device dev, bool staging, bool traced) {
    const bool was = sc::nn::gru_cell_staging();
    sc::nn::gru_cell_staging() = staging;
    const sc::DeviceScope on(dev);
    sc::nn::GRUCell cell(5, 7, 0);
    cell.kernel.assign(ref.kernel.value().to(dev));
    cell.recurrent_kernel.assign(ref.recurrent_kernel.value().to(dev));
    cell.bias.assign(values({21}, sc::f32, 621).to(dev));
    cell.recurrent_bias.assign(values({21}, sc::f32, 620).to(dev));
    auto steps = [&](const sc::Tensor& x0, const sc::Tensor& x1) {
      sc::GradientTape tape;
      tape.watch(x0);
      const sc::Tensor h = cell(x1, cell(x0, cell.initial_state(3)));
      const sc::Tensor loss = sc::sum(h * h * h);
      std::vector<sc::Tensor> out = tape.gradient(
          loss, std::vector<sc::Tensor>{x0, cell.kernel, cell.recurrent_kernel, cell.bias, cell.recurrent_bias});
      out.push_back(h);
      return out;
    };
    auto f = sc::function(steps);
    const sc::Tensor x0 = values({3, 5}, sc::f32, 630).to(dev), x1 = values({3, 5}, sc::f32, 631).to(dev);
    std::vector<sc::Tensor> out = traced ? f(x0, x1) : steps(x0, x1);
    sc::nn::gru_cell_staging() = was;
    return out;
  };
  for (const bool staging : {false, true}) {
    INFO((staging ? "staged" : "op by op"));
    // (the CPU's run: op by op either way)
    same_on_gpu_eager_and_traced(
        [&](sc::Device dev, bool traced) { return run(dev, staging && dev == gpu, traced); }, 2e-5);
  }
}

TEST_CASE("cuda: MultiHeadAttention on the GPU equals the CPU, masked and causal, eager and traced, with gradients",
          "[cuda][staged][attention]") {
  const sc::nn::MultiHeadAttention ref(8, 2, 5);  // the weights, copied to each run's layer
  auto run = [&](sc::Device dev, bool traced) {
    const sc::DeviceScope on(dev);
    sc::nn::MultiHeadAttention mha(8, 2, 0);
    const auto from = ref.named_variables();
    auto to = mha.named_variables();
    for (std::size_t n = 0; n < to.size(); ++n)
      to[n].second.assign((from[n].second.value() + values(from[n].second.shape(), sc::f32, 640 + n) * 0.1f).to(dev));
    const sc::Tensor pad = (values({3, 1, 6}, sc::f32, 650) > -0.8f).to(dev);  // a key padding mask
    auto step = [&](const sc::Tensor& q, const sc::Tensor& kv) {
      sc::GradientTape tape;
      tape.watch(q);
      const sc::Tensor y = mha(q, kv, kv, {.mask = pad, .causal = true}) + sc::sum(mha(kv, {.causal = true}), {1}, true);
      const sc::Tensor loss = sc::sum(y * y);
      std::vector<sc::Tensor> out = tape.gradient(loss, std::vector<sc::Tensor>{q, mha.query.kernel, mha.output.bias});
      out.push_back(y);
      return out;
    };
    auto f = sc::function(step);
    const sc::Tensor q = values({3, 4, 8}, sc::f32, 660).to(dev), kv = values({3, 6, 8}, sc::f32, 661).to(dev);
    return traced ? f(q, kv) : step(q, kv);
  };
  same_on_gpu_eager_and_traced(run, 5e-5);
}

TEST_CASE("cuda: a TransformerEncoderLayer on the GPU equals the CPU in evaluation, eager and traced", "[cuda][attention]") {
  auto run = [](sc::Device dev, bool traced) {
    const sc::DeviceScope on(dev);
    sc::nn::TransformerEncoderLayer layer(8, 2, {.ff_dim = 12, .norm_first = true, .gelu = true}, 9);
    layer.eval();
    std::uint64_t seed = 670;
    for (sc::Variable& v : layer.trainable_variables())  // the same values on both devices (made on the CPU)
      v.assign(values(v.shape(), sc::f32, ++seed).to(dev) * 0.3f);
    auto step = [&](const sc::Tensor& x) {
      sc::GradientTape tape;
      tape.watch(x);
      const sc::Tensor y = layer(x, {.causal = true});
      return std::vector<sc::Tensor>{y, tape.gradient(sc::sum(y * y), x)};
    };
    auto f = sc::function(step);
    const sc::Tensor x = values({2, 5, 8}, sc::f32, 680).to(dev);
    return traced ? f(x) : step(x);
  };
  same_on_gpu_eager_and_traced(run, 5e-5);
}
