// Small eager ops on a GPU queued and launched together (sc::cuda::eager_batching): the same values
// as the CPU's and as one launch per op, at most abi::batch_max_ops ops per launch, and every queued
// op run before what follows it on the device's stream (a larger op reusing its input's memory, a
// copy to the host, a graph launch), also with several threads queueing on one device.
#include "cuda/cuda_testing.hpp"

#include <thread>
#include <vector>

using namespace sctest::cuda;

namespace {

/// 200 small ops of every kind a batch takes (unary, binary dense and with a one-element operand,
/// comparisons, casts, fills), on whatever device x and y are on.
sc::Tensor mixed_chain(sc::Tensor x, const sc::Tensor& y) {
  for (int i = 0; i < 25; ++i) {
    x = sc::tanh(x * 1.5f) + y;                          // 3 ops
    const sc::Tensor m = (x > y).astype(sc::f32);        // 2
    x = sc::maximum(x - m * 0.25f, sc::exp(-sc::abs(y)));  // 6 (minus one: the scalar's copy is kept)
    x = x + sc::ones_like(x) * 0.0f;                     // 3 (a fill)
  }
  return x;
}

}  // namespace

TEST_CASE("cuda eager batch: a chain of small ops equals the CPU's, up to 64 ops a launch", "[cuda][batch]") {
  const BatchingScope on(true);
  const sc::Tensor x = sc::random::uniform({100}, -1.0, 1.0, 41), y = sc::random::uniform({100}, -1.0, 1.0, 42);
  const sc::Tensor xg = x.to(gpu), yg = y.to(gpu);
  sc::Tensor sum_cpu = x, sum_gpu = xg;
  for (int i = 0; i < 200; ++i) sum_cpu = sum_cpu + y;
  const auto before = sc::cuda::batch_stats();
  const auto [kernels, copies] = launches_of([&] {
    for (int i = 0; i < 200; ++i) sum_gpu = sum_gpu + yg;
  });
  const auto after = sc::cuda::batch_stats();
  CHECK(after.ops - before.ops == 200);
  CHECK(after.launches - before.launches == 4);  // 64 + 64 + 64 + the 8 flushed
  if (kernels >= 0) {
    CHECK(kernels == 4);
    CHECK(copies == 0);
  }
  check_same(sum_gpu, sum_cpu, 0);  // the same additions in the same order
  check_same(mixed_chain(xg, yg), mixed_chain(x, y), 2e-6);
}

TEST_CASE("cuda eager batch: off, or ops too large, each op is its own launch with the same values",
          "[cuda][batch]") {
  const sc::Tensor x = sc::random::uniform({100}, -1.0, 1.0, 43), y = sc::random::uniform({100}, -1.0, 1.0, 44);
  const sc::Tensor xg = x.to(gpu), yg = y.to(gpu);
  sc::Tensor batched, alone;
  {
    const BatchingScope on(true);
    batched = mixed_chain(xg, yg);
  }
  {
    const BatchingScope off(false);
    const auto before = sc::cuda::batch_stats();
    const auto [kernels, copies] = launches_of([&] { alone = mixed_chain(xg, yg); });
    CHECK(sc::cuda::batch_stats().ops == before.ops);
    if (kernels >= 0) CHECK(kernels >= 300);
  }
  check_same(batched, mixed_chain(x, y), 2e-6);
  CHECK(batched.to_vector<float>() == alone.to_vector<float>());  // the same kernels' rules
  // A tensor above abi::batch_max_elements: launched alone
  const BatchingScope on(true);
  const sc::Tensor big = sc::random::uniform({sc::cuda::abi::batch_max_elements + 1}, -1.0, 1.0, 45);
  const sc::Tensor bigg = big.to(gpu);
  const auto before = sc::cuda::batch_stats();
  const sc::Tensor r = sc::exp(bigg);
  CHECK(sc::cuda::batch_stats().ops == before.ops);
  check_same(r, sc::exp(big), 2e-6);
}

TEST_CASE("cuda eager batch: queued ops run before a larger op reuses their input's memory", "[cuda][batch]") {
  const BatchingScope on(true);
  const sc::Tensor x = sc::random::uniform({10, 10}, -1.0, 1.0, 46);
  const sc::Tensor wide_left = sc::random::uniform({10, 1000}, -1.0, 1.0, 49).to(gpu);
  const sc::Tensor wide_right = sc::random::uniform({1000, 10}, -1.0, 1.0, 50).to(gpu);
  sc::Tensor b;
  const void* freed = nullptr;
  {
    const sc::Tensor a = x.to(gpu) + 1.0f;  // queued
    b = a * 2.0f;                           // queued: reads a's memory
    freed = a.raw_data();
  }  // a's memory goes back to the allocator's cache, b not yet computed
  // a product too large for a batch (10 x 10 outputs, 10^5 multiply-adds): the queue is launched
  // before it
  const sc::Tensor c = sc::matmul(wide_left, wide_right);
  CHECK(c.raw_data() == freed);  // (c took a's memory: what the test is about)
  check_same(b, (x + 1.0f) * 2.0f, 0);
}

TEST_CASE("cuda eager batch: queued ops run before a copy to the host, an item and a graph launch",
          "[cuda][batch][staged]") {
  const BatchingScope on(true);
  const GraphPolicyScope graphs(sc::cuda::GraphPolicy::always);
  const sc::Tensor x = sc::random::uniform({8}, -1.0, 1.0, 48);
  const sc::Tensor xg = x.to(gpu);
  const sc::Tensor q = sc::square(xg) - 0.5f;  // queued
  CHECK(q.to_vector<float>() == (sc::square(x) - 0.5f).to_vector<float>());
  CHECK(sc::sum(sc::square(xg)).item<float>() == Approx(sc::sum(sc::square(x)).item<float>()).epsilon(1e-6));
  auto f = sc::function([](const sc::Tensor& t) { return sc::tanh(t) * 3.0f + t; });
  for (int call = 0; call < 4; ++call) {  // (captured at the second call, replayed from the third)
    const sc::Tensor arg = xg * static_cast<float>(call + 1) - 0.25f;  // queued, read by the graph
    const sc::Tensor want = f(x * static_cast<float>(call + 1) - 0.25f);
    check_same(f(arg), want, 2e-6);
  }
}

TEST_CASE("cuda eager batch: threads queueing on one device each get their own chain's values", "[cuda][batch]") {
  const BatchingScope on(true);
  constexpr int threads = 4;
  std::vector<sc::Tensor> xs, ys, got(threads);
  for (int t = 0; t < threads; ++t) {
    xs.push_back(sc::random::uniform({50 + t}, -1.0, 1.0, 50 + static_cast<std::uint64_t>(t)));
    ys.push_back(sc::random::uniform({50 + t}, -1.0, 1.0, 60 + static_cast<std::uint64_t>(t)));
  }
  std::vector<sc::Tensor> xg, yg;
  for (int t = 0; t < threads; ++t) {
    xg.push_back(xs[static_cast<std::size_t>(t)].to(gpu));
    yg.push_back(ys[static_cast<std::size_t>(t)].to(gpu));
  }
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      const auto k = static_cast<std::size_t>(t);
      sc::Tensor r = xg[k];
      for (int round = 0; round < 4; ++round) r = mixed_chain(r, yg[k]);
      got[k] = r;
    });
  for (std::thread& th : pool) th.join();
  for (int t = 0; t < threads; ++t) {
    const auto k = static_cast<std::size_t>(t);
    sc::Tensor want = xs[k];
    for (int round = 0; round < 4; ++round) want = mixed_chain(want, ys[k]);
    check_same(got[k], want, 1e-5);
  }
}

namespace {

/// Broadcasting ops, slices, a transpose, a concat and small products (plain, with transpose
/// flags, on integers): every kind of op a batch takes through a geometry, on x's device.
std::vector<sc::Tensor> layout_chain(const sc::Tensor& x, const sc::Tensor& bias, const sc::Tensor& w,
                                     const sc::Tensor& w16, const sc::Tensor& ints) {
  const sc::Tensor h = sc::tanh(x + bias);                                                // [8, 16] + [16]
  const sc::Tensor column = sc::reshape(sc::slice(bias, {0}, {8}), {8, 1});                // [8, 1]
  const sc::Tensor scaled = h * column - sc::reshape(sc::slice(h, {0, 3}, {1, 1}), {});   // [8, 16] * [8, 1]
  const sc::Tensor window = sc::slice(scaled, {1, 2}, {6, 5});                             // [6, 5] of [8, 16]
  const sc::Tensor t = sc::transpose(window);                                              // [5, 6]
  const sc::Tensor joined = sc::concat({t, t * 2.0f, sc::slice(h, {0, 0}, {5, 3})}, 1);   // [5, 15]
  const sc::Tensor p = sc::matmul(h, w16);                      // [8, 12], K = 16
  const sc::Tensor pt = sc::matmul(h, w, true, false);          // h^T [16, 8] w [8, 12]
  const sc::Tensor pn = sc::matmul(p, w, false, true);          // p [8, 12] w^T [12, 8]
  const sc::Tensor pi = sc::matmul(ints, sc::transpose(ints));  // i32 [4, 3] [3, 4]
  return {scaled, window, t, joined, p, pt, pn, pi};
}

}  // namespace

TEST_CASE("cuda eager batch: broadcasts, slices, transposes, concats and small products are queued too",
          "[cuda][batch]") {
  const sc::Tensor x = sc::random::uniform({8, 16}, -1.0, 1.0, 70), bias = sc::random::uniform({16}, -1.0, 1.0, 71);
  const sc::Tensor w = sc::random::uniform({8, 12}, -1.0, 1.0, 72);
  const sc::Tensor w16 = sc::random::uniform({16, 12}, -1.0, 1.0, 73);
  const sc::Tensor ints =
      sc::reshape(sc::tensor(std::vector<std::int32_t>{1, -2, 3, 40000, 5, -6, 7, 8, 9, 10, 11, 12}), {4, 3});
  const auto want = layout_chain(x, bias, w, w16, ints);
  auto on_gpu = [&] { return layout_chain(x.to(gpu), bias.to(gpu), w.to(gpu), w16.to(gpu), ints.to(gpu)); };
  std::vector<sc::Tensor> got, alone;
  const BatchingScope on(true);
  const auto before = sc::cuda::batch_stats();
  const auto [kernels, copies] = launches_of([&] { got = on_gpu(); });
  const auto after = sc::cuda::batch_stats();
  // every op above was queued: none launched alone
  CHECK(after.ops - before.ops >= 15);
  if (kernels >= 0) CHECK(kernels == after.launches - before.launches);
  {
    const BatchingScope off(false);
    alone = on_gpu();
  }
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("result " << i);
    CHECK(got[i].shape() == want[i].shape());
    check_same(got[i], want[i], want[i].dtype() == sc::i32 ? 0.0 : 2e-6);
    check_same(alone[i], want[i], want[i].dtype() == sc::i32 ? 0.0 : 2e-6);
  }
}

TEST_CASE("cuda eager batch: a small recurrent step with its gradient, CPU values, few launches", "[cuda][batch]") {
  // an Elman cell written op by op (a user's own RNN): products, a broadcast bias, slices of the
  // state, a concat; 6 steps and the gradient of every weight
  const sc::Tensor xs = sc::random::uniform({6, 1, 5}, -1.0, 1.0, 80);
  const sc::Tensor w0 = sc::random::uniform({5, 16}, -0.5, 0.5, 81), u0 = sc::random::uniform({16, 16}, -0.5, 0.5, 82);
  const sc::Tensor b0 = sc::random::uniform({16}, -0.5, 0.5, 83);
  auto grads = [&](sc::Device d) {
    sc::Variable w(w0.to(d)), u(u0.to(d)), b(b0.to(d));
    const sc::Tensor x = xs.to(d);
    sc::GradientTape tape;
    sc::Tensor h = sc::zeros({1, 16}).to(d), loss = sc::zeros({}).to(d);
    for (std::int64_t t = 0; t < 6; ++t) {
      const sc::Tensor xt = sc::reshape(sc::slice(x, {t, 0, 0}, {1, 1, 5}), {1, 5});
      const sc::Tensor z = sc::matmul(xt, w) + sc::matmul(h, u) + b;
      const sc::Tensor halves = sc::concat({sc::tanh(sc::slice(z, {0, 0}, {1, 8})), sc::sigmoid(sc::slice(z, {0, 8}, {1, 8}))}, 1);
      h = halves;
      loss = loss + sc::sum(sc::square(h));
    }
    const auto g = tape.gradient(loss, {w, u, b});
    return std::vector<sc::Tensor>{loss, g[0], g[1], g[2]};
  };
  const auto want = grads(sc::Device::cpu());
  const BatchingScope on(true);
  grads(gpu);  // (warm: the allocator's first blocks)
  std::vector<sc::Tensor> got, alone;
  const auto [kernels, copies] = launches_of([&] {
    got = grads(gpu);
    for (auto& t : got) t.to_vector<float>();
  });
  Launches unbatched{};
  {
    const BatchingScope off(false);
    unbatched = counted([&] {
      alone = grads(gpu);
      for (auto& t : alone) t.to_vector<float>();
    });
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    check_same(got[i], want[i], 1e-5);
    check_same(alone[i], want[i], 1e-5);
  }
  if (kernels >= 0) {
    INFO(kernels << " kernels batched, " << unbatched.kernels << " a launch per op");
    CHECK(kernels <= 8);
    CHECK(unbatched.kernels >= 150);
  }
}

TEST_CASE("cuda eager batch: a large value's gradient contributions are summed by add_n, 32 a launch",
          "[cuda][batch]") {
  // w ([70, 70]: above the batches' 4096 elements) used 100 times: its 100 contributions, an add
  // each before, are summed by add_n in runs of 32 (4 launches), with the CPU's bits.
  const sc::Tensor w0 = sc::random::uniform({70, 70}, -1.0, 1.0, 7);
  std::vector<sc::Tensor> c;
  for (int k = 0; k < 100; ++k) c.push_back(sc::random::uniform({70, 70}, -1.0, 1.0, 200 + k));
  const auto grad = [&](sc::Device d, Launches* n) {
    const sc::Tensor w = w0.to(d);
    std::vector<sc::Tensor> cd;
    for (const sc::Tensor& t : c) cd.push_back(t.to(d));
    sc::GradientTape tape;
    tape.watch(w);
    sc::Tensor y = w * cd[0];
    for (std::size_t k = 1; k < cd.size(); ++k) y = y + w * cd[k];  // w * c_k: a contribution of c_k
    const sc::Tensor loss = sc::sum(y);
    sc::Tensor g;
    const Launches counts = counted([&] { g = tape.gradient(loss, w); });
    if (n != nullptr) *n = counts;
    return g;
  };
  Launches n;
  const sc::Tensor got = grad(gpu, &n);
  check_same(got, grad(sc::Device::cpu(), nullptr), 0);
  if (n.kernels >= 0) {
    INFO(n.kernels << " kernels");
    CHECK(n.kernels <= 110);  // the seed, its broadcast, 100 products (the vjps), 4 add_n (99 adds before)
  }
}

TEST_CASE("cuda eager batch: where selects are queued, with the CPU's values", "[cuda][batch]") {
  // where over each dtype, scalars on either side, a non-bool condition (its cast queued too), and
  // maximum's gradient (wheres inside): every op queued, none launched alone; a broadcasting where
  // ([4, 1] condition over [4, 5]) still launches its own kernel.
  const sc::Tensor x = sc::random::uniform({40}, -1.0, 1.0, 90), y = sc::random::uniform({40}, -1.0, 1.0, 91);
  const sc::Tensor ix = sc::cast(x * 100.f, sc::i64), iy = sc::cast(y * 100.f, sc::i32);
  const auto selects = [](const sc::Tensor& a, const sc::Tensor& b, const sc::Tensor& ia, const sc::Tensor& ib) {
    const sc::Tensor m = a > b;
    return std::vector<sc::Tensor>{sc::where(m, a, b),           sc::where(m, a, 0.5f),
                                   sc::where(m, -1.f, b),        sc::where(m, ia, ib),
                                   sc::where(ib, a.astype(sc::f64), 2.0),  // an i32 condition
                                   sc::where(sc::max(a) > 0.5f, a, b),  // a one-element condition
                                   sc::where(m, m, b > 0.f)};
  };
  const auto want = selects(x, y, ix, iy);
  const sc::Tensor xg = x.to(gpu), yg = y.to(gpu), ixg = ix.to(gpu), iyg = iy.to(gpu);
  const BatchingScope on(true);
  std::vector<sc::Tensor> got;
  const auto before = sc::cuda::batch_stats();
  const auto [kernels, copies] = launches_of([&] { got = selects(xg, yg, ixg, iyg); });
  const auto after = sc::cuda::batch_stats();
  if (kernels >= 0) CHECK(kernels == after.launches - before.launches);  // nothing launched alone
  CHECK(after.ops - before.ops >= 12);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("result " << i);
    CHECK(got[i].dtype() == want[i].dtype());
    check_same(got[i], want[i], 0);
  }
  // maximum's gradient (its ties split) and a broadcasting where
  const sc::Tensor a = sc::cast(sc::cast(x * 4.f, sc::i32), sc::f32), b = sc::cast(sc::cast(y * 4.f, sc::i32), sc::f32);
  const auto grads = [](const sc::Tensor& p, const sc::Tensor& q) {
    sc::GradientTape tape;
    tape.watch(p);
    tape.watch(q);
    const sc::Tensor loss = sc::sum(sc::maximum(p, q) * p);
    auto g = tape.gradient(loss, std::vector<sc::Tensor>{p, q});
    g.push_back(sc::where(sc::reshape(p, {4, 10}) > 0.f, sc::reshape(q, {4, 10}), sc::reshape(p, {4, 10})));
    g.push_back(sc::where(sc::slice(sc::reshape(p, {4, 10}), {0, 0}, {4, 1}) > 0.f, sc::reshape(q, {4, 10}), 7.f));
    return g;
  };
  const auto want_g = grads(a, b);
  const auto got_g = grads(a.to(gpu), b.to(gpu));
  for (std::size_t i = 0; i < got_g.size(); ++i) {
    INFO("gradient result " << i);
    check_same(got_g[i], want_g[i], 0);
  }
}
