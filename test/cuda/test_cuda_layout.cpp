// CUDA == CPU for the layout ops (transpose, slice, broadcast_to, concat, one_hot; pad, tile, split,
// flip), argmax/argmin, the scans, the composites built on the ops (softmax, logsumexp, cross_entropy, mean),
// and a training step of GPU variables. Needs a GPU: gpu_main.cpp skips every test (exit 77) where none is found.
#include "cuda_testing.hpp"
#include "files.hpp"

#include <limits>
#include <memory>
#include <string>
#include <vector>

using namespace sctest::cuda;

TEST_CASE("cuda: transpose, slice, broadcast_to and concat == CPU", "[cuda]") {
  for (const sc::DType d : {sc::boolean, sc::i32, sc::i64, sc::f32, sc::f64}) {
    INFO(sc::name(d));
    const sc::Tensor x = values({2, 3, 4}, d, 31);
    same_on_gpu([](const auto& in) { return sc::transpose(in[0]); }, {x}, 0);
    same_on_gpu([](const auto& in) { return sc::transpose(in[0], {1, 0, 2}); }, {x}, 0);
    same_on_gpu([](const auto& in) { return sc::slice(in[0], {1, -2, 1}, {1, -1, 2}); }, {x}, 0);
    same_on_gpu([](const auto& in) { return sc::broadcast_to(in[0], {5, 2, 3, 4}); }, {x}, 0);
    same_on_gpu([](const auto& in) { return sc::broadcast_to(in[0], {3, 4}); }, {values({3, 1}, d, 32)}, 0);
    same_on_gpu([](const auto& in) { return sc::concat({in[0], in[1], in[0]}, 1); }, {x, values({2, 1, 4}, d, 33)}, 0);
    same_on_gpu([](const auto& in) { return sc::stack({in[0], in[0]}, -1); }, {x}, 0);
  }
}

TEST_CASE("cuda: pad, tile, split and flip == CPU, with gradients", "[cuda]") {
  for (const sc::DType d : {sc::boolean, sc::i32, sc::i64, sc::f32, sc::f64}) {
    INFO(sc::name(d));
    const sc::Tensor x = values({2, 3, 4}, d, 33);
    same_on_gpu([](const auto& in) { return sc::pad(in[0], {{1, 0}, {0, 2}, {3, 1}}, 1); }, {x}, 0);
    same_on_gpu([](const auto& in) { return sc::tile(in[0], {2, 1, 1, 3}); }, {x}, 0);
    same_on_gpu([](const auto& in) { return sc::split(in[0], {1, 2}, 1)[1]; }, {x}, 0);
    same_on_gpu([](const auto& in) { return sc::flip(in[0], {0, 2}); }, {x}, 0);
  }
  same_on_gpu(
      [](const auto& in) {
        sc::GradientTape tape;
        tape.watch(in[0]);
        const sc::Tensor y = sc::tile(sc::flip(sc::pad(in[0], {{1, 1}, {0, 2}}, 0.5), {1}), {2, 1});
        const std::vector<sc::Tensor> halves = sc::split(y, 2, 0);
        return tape.gradient(sc::sum(halves[0] * y.shape()[0] + halves[1] * halves[1]), in[0]);
      },
      {values({3, 4}, sc::f32, 34)}, 1e-6);
}

TEST_CASE("cuda: cumsum == CPU: a thread per line, a block per line, strided lines, with gradients", "[cuda]") {
  for (const sc::DType d : {sc::i32, sc::i64, sc::f32, sc::f64}) {
    for (const auto& [shape, axis] : std::vector<std::pair<sc::Shape, int>>{
             {{3, 4}, 1}, {{5, 3000}, 1}, {{3000, 3}, 0}, {{8192, 40}, 1}, {{2, 700, 5}, 1}, {{0, 4}, 1}}) {
      INFO(sc::name(d) << " " << shape << " axis " << axis);
      const sc::Tensor x = values(shape, d, 35);
      // f32 lines of 3000 summed in a tree (GPU) and in order (CPU): close, not equal
      const double tol = d == sc::f32 ? 1e-3 : 1e-10;
      for (int flags = 0; flags < 4; ++flags)
        same_on_gpu([&](const auto& in) { return sc::cumsum(in[0], axis, flags & 1, flags >> 1); }, {x}, tol);
    }
  }
  same_on_gpu(
      [](const auto& in) {
        sc::GradientTape tape;
        tape.watch(in[0]);
        return tape.gradient(sc::sum(sc::square(sc::cumsum(in[0], 1, true))), in[0]);
      },
      {values({4, 50}, sc::f64, 36)}, 1e-10);
}

TEST_CASE("cuda: cumprod, logcumsumexp, cummax, cummin, cumargmax, cumargmin, linear_scan == CPU, with gradients",
          "[cuda][scan]") {
  for (const sc::DType d : {sc::i32, sc::i64, sc::f32, sc::f64}) {
    for (const auto& [shape, axis] : std::vector<std::pair<sc::Shape, int>>{
             {{3, 4}, 1}, {{5, 3000}, 1}, {{3000, 3}, 0}, {{8192, 40}, 1}, {{2, 700, 5}, 1}, {{0, 4}, 1}}) {
      INFO(sc::name(d) << " " << shape << " axis " << axis);
      const sc::Tensor x = values(shape, d, 38);  // integers: many ties
      // long f32 lines joined in a tree (GPU) and in order (CPU): close, not equal
      const double tol = d == sc::f32 ? 1e-3 : 1e-9;
      for (const bool rev : {false, true}) {
        same_on_gpu([&](const auto& in) { return sc::cummax(in[0], axis, rev); }, {x}, 0);
        same_on_gpu([&](const auto& in) { return sc::cummin(in[0], axis, rev); }, {x}, 0);
        same_on_gpu([&](const auto& in) { return sc::cumargmax(in[0], axis, rev); }, {x}, 0);
        same_on_gpu([&](const auto& in) { return sc::cumargmin(in[0], axis, rev); }, {x}, 0);
      }
      if (!sc::is_floating(d)) {  // products of small integers wrap alike
        same_on_gpu([&](const auto& in) { return sc::cumprod(in[0], axis); }, {x}, 0);
        continue;
      }
      // products of values near 1 stay finite along lines of 3000
      const sc::Tensor near_one = (x * 0.01 + 1.0).astype(d);
      const sc::Tensor decay = (x * 0.2 + 0.5).astype(d);  // in [0.1, 0.9)
      for (int flags = 0; flags < 4; ++flags) {
        const bool ex = flags & 1, rev = flags >> 1;
        same_on_gpu([&](const auto& in) { return sc::cumprod(in[0], axis, ex, rev); }, {near_one}, tol);
        same_on_gpu([&](const auto& in) { return sc::logcumsumexp(in[0], axis, ex, rev); }, {x}, tol);
        same_on_gpu([&](const auto& in) { return sc::linear_scan(in[0], in[1], axis, ex, rev); }, {decay, x}, tol);
      }
    }
  }
  // NaN and infinities by the same rules
  constexpr double inf = std::numeric_limits<double>::infinity();
  const sc::Tensor special = sc::tensor(
      std::vector<double>{1.0, std::numeric_limits<double>::quiet_NaN(), 3.0, -inf, inf, 0.0, -0.0, 2.0}, sc::Shape{2, 4});
  for (const int axis : {0, 1}) {
    same_on_gpu([&](const auto& in) { return sc::cumargmax(in[0], axis); }, {special}, 0);
    same_on_gpu([&](const auto& in) { return sc::cummin(in[0], axis, true); }, {special}, 0);
    same_on_gpu([&](const auto& in) { return sc::logcumsumexp(in[0], axis); }, {special}, 0);
  }
  // gradients (the rules are made of ops: linear_scan runs the reversed scans on the GPU)
  same_on_gpu(
      [](const auto& in) {
        sc::GradientTape tape;
        tape.watch(in[0]);
        tape.watch(in[1]);
        const sc::Tensor y = sc::cumprod(in[0], 1) + sc::exp(sc::logcumsumexp(in[1], 1, true)) + sc::cummax(in[1], 1) +
                             sc::linear_scan(in[0], in[1], 1, false, true);
        const std::vector<sc::Tensor> g = tape.gradient(sc::sum(sc::square(y)), {in[0], in[1]});
        return g[0] + g[1];
      },
      {(values({4, 300}, sc::f64, 39) * 0.2 + 0.5), values({4, 300}, sc::f64, 40)}, 1e-9);
}

TEST_CASE("cuda: topk, argsort, sort and take_along_axis == CPU: one line, many, strided, NaN, with gradients",
          "[cuda][sort]") {
  for (const sc::DType d : {sc::i32, sc::i64, sc::f32, sc::f64})
    for (const auto& [shape, axis] : std::vector<std::pair<sc::Shape, int>>{
             {{9}, 0}, {{3, 4}, 1}, {{5, 3000}, 1}, {{3000, 7}, 0}, {{2000, 40}, 1}, {{2, 700, 5}, 1}, {{0, 4}, 1}}) {
      INFO(sc::name(d) << " " << shape << " axis " << axis);
      const sc::Tensor x = values(shape, d, 37);  // integers: many ties
      const std::int64_t n = shape[axis];
      for (const std::int64_t k : {std::int64_t{0}, std::int64_t{1}, n / 2, n})
        for (const bool largest : {true, false}) {
          same_on_gpu([&](const auto& in) { return sc::topk(in[0], k, axis, largest).indices; }, {x}, 0);
          same_on_gpu([&](const auto& in) { return sc::topk(in[0], k, axis, largest).values; }, {x}, 0);
        }
      same_on_gpu([&](const auto& in) { return sc::sort(in[0], axis, true); }, {x}, 0);
    }
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (const sc::DType d : {sc::f32, sc::f64}) {
    const sc::Tensor special = sc::tensor({1.0, nan, -inf, inf, -0.0, 0.0, -nan, 2.0}).astype(d);
    for (const bool descending : {false, true})
      same_on_gpu([&](const auto& in) { return sc::argsort(in[0], 0, descending); }, {special}, 0);
  }
  // gradients, eager and traced (a CUDA graph holds the sorts: they never wait for the device)
  const sc::Tensor x = values({6, 50}, sc::f64, 38);
  const auto grad = [](const sc::Tensor& a) {
    sc::GradientTape tape;
    tape.watch(a);
    const sc::TopK top = sc::topk(a, 5, 1);
    return std::vector<sc::Tensor>{top.indices, tape.gradient(sc::sum(sc::square(top.values)), a)};
  };
  same_on_gpu_eager_and_traced(
      [&](sc::Device dev, bool traced) {
        auto f = sc::function(grad);
        return traced ? f(x.to(dev)) : grad(x.to(dev));
      },
      1e-12);
  same_on_gpu(
      [](const auto& in) { return sc::take_along_axis(in[0], sc::argsort(in[0], 0, true), 0); }, {x}, 0);
}

TEST_CASE("cuda: einsum == CPU: contractions, batches, diagonals, chains, broadcasting, with gradients", "[cuda][einsum]") {
  for (const sc::DType d : {sc::f32, sc::f64})
    for (const auto& [eq, shapes] : std::vector<std::pair<std::string, std::vector<sc::Shape>>>{
             {"ij,kj->ik", {{30, 40}, {20, 40}}},
             {"bhqd,bhkd->bhqk", {{2, 3, 16, 8}, {2, 3, 12, 8}}},
             {"ab,bc,ca->", {{5, 6}, {6, 7}, {7, 5}}},
             {"iji->j", {{6, 4, 6}}},
             {"...ij,...jk->...ik", {{2, 1, 3, 4}, {5, 4, 6}}}}) {
      INFO(sc::name(d) << " '" << eq << "'");
      std::vector<sc::Tensor> in;
      for (std::size_t k = 0; k < shapes.size(); ++k) in.push_back(values(shapes[k], d, 50 + k));
      const double tol = d == sc::f32 ? 1e-4 : 1e-12;
      same_on_gpu([&](const auto& xs) { return sc::einsum(eq, xs); }, in, tol);
      same_on_gpu(
          [&](const auto& xs) {
            sc::GradientTape tape;
            tape.watch(xs[0]);
            return tape.gradient(sc::sum(sc::square(sc::einsum(eq, xs))), xs[0]);
          },
          in, tol);
    }
}

TEST_CASE("cuda: a concat of many pieces (several launches), empty ones, along each axis == CPU", "[cuda]") {
  // One launch copies up to 32 pieces (abi::max_concat_pieces): 70 pieces take three; every fifth
  // is empty along the axis. Then a large one (a grid-stride loop over rows of different widths).
  for (const sc::DType d : {sc::boolean, sc::i32, sc::f32, sc::f64}) {
    for (int axis = 0; axis < 3; ++axis) {
      INFO(sc::name(d) << ", axis " << axis);
      std::vector<sc::Tensor> parts;
      for (int k = 0; k < 70; ++k) {
        sc::Shape s{3, 2, 4};
        s[axis] = k % 5;
        parts.push_back(values(s, d, 200 + static_cast<std::uint64_t>(k)));
      }
      same_on_gpu([axis](const auto& in) { return sc::concat(std::vector<sc::Tensor>(in.begin(), in.end()), axis); }, parts, 0);
    }
  }
  same_on_gpu([](const auto& in) { return sc::concat({in[0], in[1], in[0]}, 1); },
              {values({3000, 301}, sc::f32, 300), values({3000, 7}, sc::f32, 301)}, 0);
}

TEST_CASE("cuda: argmax, argmin and one_hot == CPU", "[cuda]") {
  for (const sc::DType d : {sc::boolean, sc::i32, sc::i64, sc::f32, sc::f64}) {
    INFO(sc::name(d));
    const sc::Tensor x = values({4, 300, 3}, d, 34);  // small integers: ties, where the first index wins
    for (const std::int64_t axis : {0, 1, -1}) {
      same_on_gpu([axis](const auto& in) { return sc::argmax(in[0], axis); }, {x}, 0);
      same_on_gpu([axis](const auto& in) { return sc::argmin(in[0], axis); }, {x}, 0);
    }
  }
  same_on_gpu([](const auto& in) { return sc::argmax(in[0], 0); }, {sc::tensor({1.f, NAN, 3.f, NAN})}, 0);
  same_on_gpu([](const auto& in) { return sc::argmin(in[0], 0); }, {sc::scalar(2.0)}, 0);
  for (const sc::DType idx : {sc::i32, sc::i64})
    for (const sc::DType d : {sc::boolean, sc::f32, sc::i64})
      same_on_gpu([d](const auto& in) { return sc::one_hot(in[0], 5, d); },
                  {sc::tensor(std::vector<std::int64_t>{0, 4, -1, 7, 2}, sc::Shape{5}).astype(idx)}, 0);
}

TEST_CASE("cuda: softmax, log_softmax, logsumexp, mean and cross_entropy == CPU", "[cuda]") {
  for (const sc::DType d : {sc::f32, sc::f64}) {
    const sc::Tensor x = values({6, 10}, d, 35) * 4;
    const double tol = d == sc::f32 ? 1e-5 : 1e-12;
    same_on_gpu([](const auto& in) { return sc::nn::softmax(in[0]); }, {x}, tol);
    same_on_gpu([](const auto& in) { return sc::nn::log_softmax(in[0], 0); }, {x}, tol);
    same_on_gpu([](const auto& in) { return sc::logsumexp(in[0], {1}, true); }, {x}, tol);
    same_on_gpu([](const auto& in) { return sc::mean(in[0], {0}); }, {x}, tol);
    const sc::Tensor labels = sc::tensor(std::vector<std::int64_t>{0, 3, 9, 1, 1, 5}, sc::Shape{6});
    same_on_gpu([](const auto& in) { return sc::nn::cross_entropy(in[0], in[1]); }, {x, labels}, tol);
  }
}

TEST_CASE("cuda: the cross_entropy op and its gradient == CPU: one block, two kernels, many classes", "[cuda]") {
  for (const sc::DType d : {sc::f32, sc::f64})
    for (const sc::DType l : {sc::i32, sc::i64})
      // [128, 10]: the one-block kernel; [9000, 10] (over abi::xent_one_block): rows, then their sum;
      // [5, 1000]: a warp over many classes.
      for (const sc::Shape& s : {sc::Shape{128, 10}, sc::Shape{9000, 10}, sc::Shape{5, 1000}}) {
        INFO(sc::name(d) << " logits " << s << ", " << sc::name(l) << " labels");
        const double tol = d == sc::f32 ? 1e-5 : 1e-12;
        const sc::Tensor x = values(s, d, 40) * 6;
        const sc::Tensor labels = sc::cast(sc::random::uniform({s[0]}, 0.0, static_cast<double>(s[1]), 41), l);
        const sc::Tensor g = sc::full({}, 0.75, d);
        same_on_gpu([](const auto& in) { return sc::nn::cross_entropy(in[0], in[1]); }, {x, labels}, tol);
        same_on_gpu([](const auto& in) { return sc::detail::softmax_cross_entropy_grad(in[0], in[1], in[2]); },
                    {g, x, labels}, tol);
      }
}

TEST_CASE("cuda: gradients through broadcasting, layout ops and cross_entropy == CPU", "[cuda]") {
  const auto grads = [](const std::vector<sc::Tensor>& in) {
    sc::GradientTape tape;
    for (const sc::Tensor& t : in) tape.watch(t);
    const sc::Tensor h = sc::relu(sc::matmul(in[0], in[1]) + in[2]);  // bias broadcast over the batch
    const sc::Tensor logits = sc::concat({sc::slice(h, {0, 0}, {-1, 3}), sc::transpose(in[3])}, 1);
    const sc::Tensor labels = sc::tensor(std::vector<std::int64_t>{0, 2, 4, 1}, sc::Shape{4}).to(in[0].device());
    return tape.gradient(sc::nn::cross_entropy(logits, labels), in);
  };
  const std::vector<sc::Tensor> in = {values({4, 5}, sc::f64, 36), values({5, 6}, sc::f64, 37),
                                      values({6}, sc::f64, 38), values({2, 4}, sc::f64, 39)};
  std::vector<sc::Tensor> on_gpu;
  for (const sc::Tensor& t : in) on_gpu.push_back(t.to(gpu));
  const auto want = grads(in), got = grads(on_gpu);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("input " << i);
    check_same(got[i], want[i], 1e-12);
  }
}

TEST_CASE("cuda: an SGD step of GPU variables == the CPU's", "[cuda]") {
  const auto train = [](bool on_gpu) {
    std::optional<sc::DeviceScope> scope;
    if (on_gpu) scope.emplace(gpu);
    sc::nn::Dense layer(8, 4, /*seed=*/7, sc::f64);
    sc::optim::SGD opt(0.1, 0.9);
    const sc::Tensor x = sc::random::normal({16, 8}, 3, 0.0, 1.0, sc::f64);
    const sc::Tensor labels = sc::tensor(std::vector<std::int64_t>(16, 2), sc::Shape{16});
    for (int step = 0; step < 3; ++step) {
      sc::GradientTape tape;
      const sc::Tensor loss = sc::nn::cross_entropy(layer(x), labels);
      opt.apply(tape.gradient(loss, layer.trainable_variables()), layer.trainable_variables());
    }
    return std::vector<sc::Tensor>{layer.kernel.value(), layer.bias.value()};
  };
  const auto want = train(false), got = train(true);
  for (std::size_t i = 0; i < got.size(); ++i) check_same(got[i], want[i], 1e-12);
}

TEST_CASE("cuda: fused optimizer updates (one kernel per variable) equal the composite ops bit for bit", "[cuda]") {
  // Adam, SGD, SGD with momentum and Nesterov's, f32 and f64: the eager GPU update runs one
  // kernel (optim/fused.hpp); with fused updates off, the 3 to 12 ops of the composite. Both must
  // give the same bits, and the CPU's within rounding (same ops, same order).
  enum class Opt { adam, sgd, momentum, nesterov };
  for (const sc::DType d : {sc::f32, sc::f64})
    for (const Opt which : {Opt::adam, Opt::sgd, Opt::momentum, Opt::nesterov}) {
      INFO(sc::name(d) << " optimizer " << static_cast<int>(which));
      const auto train = [&](sc::Device dev, bool fused) {
        const sc::DeviceScope scope(dev);
        const bool was = sc::optim::fused::enabled;
        sc::optim::fused::enabled = fused;
        sc::nn::Dense layer(8, 4, /*seed=*/7, d);
        std::unique_ptr<sc::optim::Optimizer> opt;
        if (which == Opt::adam) opt = std::make_unique<sc::optim::Adam>(0.01);
        else opt = std::make_unique<sc::optim::SGD>(0.1, which == Opt::sgd ? 0.0 : 0.9, which == Opt::nesterov);
        const sc::Tensor x = sc::random::normal({16, 8}, 3, 0.0, 1.0, d);
        const sc::Tensor labels = sc::tensor(std::vector<std::int64_t>{0, 1, 2, 3, 3, 2, 1, 0, 0, 0, 1, 1, 2, 2, 3, 3},
                                             sc::Shape{16});
        for (int step = 0; step < 3; ++step) {
          sc::GradientTape tape;
          const sc::Tensor loss = sc::nn::cross_entropy(layer(x), labels);
          opt->apply(tape.gradient(loss, layer.trainable_variables()), layer.trainable_variables());
        }
        sc::optim::fused::enabled = was;
        return std::vector<sc::Tensor>{layer.kernel.value(), layer.bias.value()};  // where they were trained
      };
      const auto fused = train(gpu, true), composite = train(gpu, false), cpu = train(sc::Device::cpu(), true);
      for (std::size_t i = 0; i < fused.size(); ++i) {
        CHECK(fused[i].to_vector<double>() == composite[i].to_vector<double>());
        check_same(fused[i], cpu[i], d == sc::f32 ? 1e-6 : 1e-12);
      }
    }
}

TEST_CASE("cuda: an optimizer made outside any DeviceScope keeps its state with GPU variables", "[cuda]") {
  // Eager steps: the slots are made on each variable's device and the step counter and the rate
  // move to the first variable's device at the first build (before: CPU slots, and a failed op).
  const auto run = [](sc::Device d) {
    sc::Variable w(values({5, 3}, sc::f32, 81).to(d), "w");
    const std::vector<sc::Variable> vars{w};
    sc::optim::Adam opt(0.05);
    for (int step = 0; step < 3; ++step) {
      sc::GradientTape tape;
      const sc::Tensor loss = sc::sum(sc::square(sc::matmul(values({4, 5}, sc::f32, 82).to(d), w)));
      opt.apply(tape.gradient(loss, vars), vars);
    }
    CHECK(opt.slot(w, "v").device() == d);
    CHECK(opt.iterations_variable().device() == d);
    CHECK(opt.learning_rate_variable().device() == d);
    return w.value();
  };
  const sc::Tensor want = run(sc::Device::cpu());
  check_same(run(gpu), want, 1e-5);
}

TEST_CASE("cuda: a checkpoint saves GPU variables and restores them onto either device", "[cuda][checkpoint]") {
  // A GPU layer and its Adam state after two steps, saved; restored into a CPU copy and into a
  // fresh GPU copy (values moved to each variable's device, which it keeps), bits equal.
  sctest::TempDir dir;
  struct Trained {
    static sc::nn::Dense dense_on(sc::Device d) {
      const sc::DeviceScope on(d);
      return sc::nn::Dense(6, 3, /*seed=*/5);
    }
    sc::nn::Dense layer;
    sc::optim::Adam opt{0.01};
    sc::Checkpoint ck;
    explicit Trained(sc::Device d) : layer(dense_on(d)) {
      ck.track("layer", layer);
      ck.track("opt", opt);
      opt.build(layer.trainable_variables());
    }
    void step(const sc::Tensor& x) {
      sc::GradientTape tape;
      const sc::Tensor loss = sc::sum(sc::square(layer(x)));
      opt.apply(tape.gradient(loss, layer.trainable_variables()), layer.trainable_variables());
    }
    std::vector<std::vector<double>> state() const {
      std::vector<std::vector<double>> r;
      for (const auto& [key, v] : ck.variables()) r.push_back(v.value().to_vector<double>());
      return r;
    }
  };
  Trained on_gpu(gpu);
  const sc::Tensor x = values({4, 6}, sc::f32, 85).to(gpu);
  on_gpu.step(x);
  on_gpu.step(x);
  for (const auto& [key, v] : on_gpu.ck.variables()) {
    INFO(key);
    CHECK(v.device() == gpu);
  }
  on_gpu.ck.save(dir / "ck.safetensors");
  Trained on_cpu(sc::Device::cpu()), again(gpu);
  on_cpu.ck.restore(dir / "ck.safetensors");
  again.ck.restore(dir / "ck.safetensors");
  CHECK(on_cpu.state() == on_gpu.state());
  CHECK(again.state() == on_gpu.state());
  CHECK(on_cpu.layer.kernel.device() == sc::Device::cpu());
  CHECK(again.layer.kernel.device() == gpu);
  CHECK(again.opt.iterations_variable().device() == gpu);
  // Training goes on alike from the restored state.
  on_gpu.step(x);
  again.step(x);
  CHECK(again.state() == on_gpu.state());
}

TEST_CASE("cuda: gather and scatter_add == CPU (negative and duplicate indices)", "[cuda]") {
  for (const sc::DType idx : {sc::i32, sc::i64})
    for (const sc::DType d : {sc::boolean, sc::i32, sc::i64, sc::f32, sc::f64}) {
      INFO(sc::name(d) << " indices " << sc::name(idx));
      const sc::Tensor x = values({4, 6, 3}, d, 60);
      const sc::Tensor ix = sc::tensor(std::vector<std::int64_t>{5, 0, -1, 2, 2, -6, 1}, sc::Shape{7}).astype(idx);
      for (const std::int64_t axis : {0, 1, 2, -1}) {
        const std::int64_t extent = x.shape()[axis < 0 ? axis + 3 : axis];
        // Indices folded into the axis so every one is valid for it.
        const sc::Tensor valid = sc::tensor(std::vector<std::int64_t>{0, extent - 1, -1, 1 % extent, -extent},
                                            sc::Shape{5}).astype(idx);
        same_on_gpu([axis](const auto& in) { return sc::gather(in[0], in[1], axis); }, {x, valid}, 0);
        if (d == sc::boolean) continue;
        sc::Shape us = x.shape();
        us[axis < 0 ? axis + 3 : axis] = 5;
        same_on_gpu([axis](const auto& in) { return sc::scatter_add(in[0], in[1], in[2], axis); },
                    {x, valid, values(us, d, 61)}, sc::is_floating(d) ? 1e-12 : 0);
      }
      same_on_gpu([](const auto& in) { return sc::gather(in[0], in[1], 1); }, {x, ix}, 0);
      same_on_gpu([](const auto& in) { return sc::gather(in[0], in[1], 1); },
                  {x, sc::zeros({2, 3}, idx)}, 0);  // a 2-D index tensor
    }
  // The gradient of gather is scatter_add, on the GPU too.
  const sc::Tensor x = values({5, 4}, sc::f64, 62);
  const sc::Tensor ix = sc::tensor(std::vector<std::int64_t>{4, 1, 1, 0}, sc::Shape{4});
  const auto grad = [](const sc::Tensor& xx, const sc::Tensor& ii) {
    sc::GradientTape tape;
    tape.watch(xx);
    return tape.gradient(sc::sum(sc::square(sc::gather(xx, ii, 0))), xx);
  };
  check_same(grad(x.to(gpu), ix.to(gpu)), grad(x, ix), 1e-12);
}

TEST_CASE("cuda: take_along_axis and add_along_axis == CPU (negative and repeated indices, gradients, a bad index)",
          "[cuda]") {
  for (const sc::DType idx : {sc::i32, sc::i64})
    for (const sc::DType d : {sc::boolean, sc::i32, sc::i64, sc::f32, sc::f64})
      for (const auto& [shape, axis] : std::vector<std::pair<sc::Shape, int>>{
               {{9}, 0}, {{4, 6, 3}, 0}, {{4, 6, 3}, 1}, {{4, 6, 3}, -1}, {{3, 700}, 1}, {{600, 5}, 0}}) {
        INFO(sc::name(d) << " indices " << sc::name(idx) << " " << shape << " axis " << axis);
        const sc::Tensor x = values(shape, d, 64);
        const int ax = axis < 0 ? axis + shape.rank() : axis;
        const std::int64_t extent = shape[ax];
        sc::Shape is = shape;
        is[ax] = extent + 2;  // more indices than the axis has: repeats
        // valid indices of every sign: floor(u * 2 extent) - extent, in [-extent, extent)
        const sc::Tensor ix =
            (sc::floor(sc::random::uniform(is, 0.0, 2.0 * static_cast<double>(extent), 65)).astype(sc::i64) - extent)
                .astype(idx);
        same_on_gpu([axis](const auto& in) { return sc::take_along_axis(in[0], in[1], axis); }, {x, ix}, 0);
        if (d == sc::boolean) continue;
        same_on_gpu([axis](const auto& in) { return sc::add_along_axis(in[0], in[1], in[2], axis); },
                    {x, ix, values(is, d, 66)}, sc::is_floating(d) ? 1e-12 : 0);
      }
  // Both gradients, on the GPU too.
  const sc::Tensor x = values({5, 4}, sc::f64, 67), u = values({5, 6}, sc::f64, 68);
  const sc::Tensor ix = sc::tensor(std::vector<std::int64_t>{3, 1, 1, 0, -1, 2}, sc::Shape{1, 6}) * sc::ones({5, 1}, sc::i64);
  const sc::Tensor ix4 = sc::slice(ix, {0, 0}, {5, 4});
  const auto grad = [](const sc::Tensor& xx, const sc::Tensor& uu, const sc::Tensor& ii, const sc::Tensor& i4) {
    sc::GradientTape tape;
    tape.watch({xx, uu});
    const sc::Tensor y = sc::add_along_axis(sc::square(xx), ii, sc::tanh(uu), 1);
    return tape.gradient(sc::sum(sc::square(sc::take_along_axis(y, i4, 1))), {xx, uu});
  };
  const auto on_gpu = grad(x.to(gpu), u.to(gpu), ix.to(gpu), ix4.to(gpu)), on_cpu = grad(x, u, ix, ix4);
  check_same(on_gpu[0], on_cpu[0], 1e-12);
  check_same(on_gpu[1], on_cpu[1], 1e-12);
  // An index out of range: 0 (or the update dropped), raised at the next wait naming the line.
  const sc::Tensor xs = values({2, 3}, sc::f32, 69).to(gpu);
  const sc::Tensor bad = sc::tensor(std::vector<std::int64_t>{0, 3, 1, 1}, sc::Shape{2, 2}).to(gpu);
  int line = __LINE__ + 1;
  const sc::Tensor y = sc::take_along_axis(xs, bad, 1);
  CHECK_THROWS_WITH(y.to_vector<float>(), Catch::Contains("[take_along_axis] index 3 is out of range for axis 1 of extent 3") &&
                                             Catch::Contains("test_cuda_layout.cpp:" + std::to_string(line)));
  line = __LINE__ + 1;
  const sc::Tensor z = sc::add_along_axis(xs, bad, sc::ones({2, 2}).to(gpu), 1);
  CHECK_THROWS_WITH(z.to_vector<float>(), Catch::Contains("[add_along_axis] index 3 is out of range for axis 1 of extent 3") &&
                                             Catch::Contains("test_cuda_layout.cpp:" + std::to_string(line)));
  CHECK_NOTHROW(sc::cuda::synchronize());
}

TEST_CASE("cuda: an index out of range on the GPU is raised at the next wait, naming the op's line", "[cuda]") {
  const sc::Tensor x = values({5, 3}, sc::f32, 63).to(gpu);
  const sc::Tensor bad = sc::tensor(std::vector<std::int64_t>{1, 7, 0}, sc::Shape{3}).to(gpu);
  const sc::Tensor good = sc::tensor(std::vector<std::int64_t>{4, -5}, sc::Shape{2}).to(gpu);
  // The message's start (a matcher built here would refer to temporaries gone by the check).
  const auto says = [](int line) {
    return "[gather] index 7 is out of range for axis 0 of extent 5 (shape [5, 3]) at test_cuda_layout.cpp:" +
           std::to_string(line);
  };
  const std::string found = "found on cuda:0 by the kernel";
  // Eager: the launch returns (indices on the GPU are not read back); the wait raises.
  const int line = __LINE__ + 1;
  const sc::Tensor y = sc::gather(x, bad, 0);
  CHECK_THROWS_AS(y.to_vector<float>(), sc::ValueError);
  const sc::Tensor y2 = sc::gather(x, bad, 0);
  CHECK_THROWS_WITH(sc::cuda::synchronize(), Catch::Contains(says(line + 2)) && Catch::Contains(found));
  // Raised once: the device and later ops are fine, valid negative indices too.
  CHECK_NOTHROW(sc::cuda::synchronize());
  check_same(sc::gather(x, good, 0), sc::gather(x.to(sc::Device::cpu()), good.to(sc::Device::cpu()), 0), 0);
  // scatter_add drops the update and reports it the same way.
  const int sline = __LINE__ + 1;
  const sc::Tensor z = sc::scatter_add(x, bad, sc::ones({3, 3}).to(gpu), 0);
  CHECK_THROWS_WITH(z.item<float>(),
                    Catch::Contains("[scatter_add] index 7 is out of range for axis 0 of extent 5") &&
                        Catch::Contains("test_cuda_layout.cpp:" + std::to_string(sline)));
  // In a traced function the error names the line inside the function.
  const int tline = __LINE__ + 1;
  auto f = sc::function([](sc::Tensor a, sc::Tensor i) { return sc::gather(a, i, 0) * 2.f; });
  const sc::Tensor t = f(x, bad);
  CHECK_THROWS_WITH(t.to_vector<float>(), Catch::Contains(says(tline)) && Catch::Contains(found));
}

TEST_CASE("cuda: a label out of range on the GPU is raised at the next wait, eager and staged", "[cuda]") {
  const sc::Tensor logits = values({4, 3}, sc::f32, 64).to(gpu);
  const sc::Tensor bad = sc::tensor(std::vector<std::int64_t>{0, 2, 3, 1}, sc::Shape{4}).to(gpu);
  const sc::Tensor good = sc::tensor(std::vector<std::int64_t>{0, 2, 1, 1}, sc::Shape{4});
  const std::string says = "[cross_entropy] label 3 at index 2 is out of range [0, 3) at test_cuda_layout.cpp:";
  // Eager: the labels are not read back; the kernel's check raises at the wait.
  const int line = __LINE__ + 1;
  const sc::Tensor loss = sc::nn::cross_entropy(logits, bad);
  CHECK_THROWS_WITH(loss.item<float>(), Catch::Contains(says + std::to_string(line)) &&
                                            Catch::Contains("found on cuda:0 by the kernel"));
  // Good labels on the GPU: the loss equals the CPU's.
  check_same(sc::nn::cross_entropy(logits, good.to(gpu)), sc::nn::cross_entropy(logits.to(sc::Device::cpu()), good), 1e-6);
  // Staged: the loss op's kernel checks the labels the same way, naming the line inside the function.
  const int tline = __LINE__ + 1;
  auto f = sc::function([](sc::Tensor z, sc::Tensor y) { return sc::nn::cross_entropy(z, y); });
  check_same(f(logits, good.to(gpu)), sc::nn::cross_entropy(logits.to(sc::Device::cpu()), good), 1e-6);
  const sc::Tensor staged = f(logits, bad);
  CHECK_THROWS_WITH(sc::cuda::synchronize(), Catch::Contains(says + std::to_string(tline)));
  CHECK_NOTHROW(sc::cuda::synchronize());  // raised once
}
