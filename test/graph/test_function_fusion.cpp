// sc::function's plans as a GPU would run them and the CPU's fusion: kernels per traced training
// step (each a launch on a GPU), slices read through windows, sibling groups, epilogues and fused
// reductions; every staged result equal to eager.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <stagecraft/stagecraft.hpp>
#include <stagecraft/graph/function.hpp>

#include "function_testing.hpp"
#include "passes_testing.hpp"
#include "testing.hpp"

namespace {

using sctest::function::check_same;

/// RAII: every elementwise size fused, as a GPU plan fuses (graph::fusion_min_elements() = 1).
struct FuseAll {
  std::int64_t saved = sc::graph::fusion_min_elements();
  FuseAll() { sc::graph::fusion_min_elements() = 1; }
  FuseAll(const FuseAll&) = delete;
  FuseAll& operator=(const FuseAll&) = delete;
  ~FuseAll() { sc::graph::fusion_min_elements() = saved; }
};

/// a and b hold the same f32 values bit for bit (-0.0 and NaN payloads included).
bool same_bits(const sc::Tensor& a, const sc::Tensor& b) {
  const auto x = a.to_vector<float>(), y = b.to_vector<float>();
  bool same = x.size() == y.size();
  for (std::size_t i = 0; same && i < x.size(); ++i)
    same = std::bit_cast<std::uint32_t>(x[i]) == std::bit_cast<std::uint32_t>(y[i]);
  return same;
}

/// The bench's LSTM cell (32 -> 64, batch 1 unless given) run over `steps` inputs; loss = sum(h * c)
/// after the last step. Calling it returns the loss, then the gradients of the cell's three variables.
struct LstmSteps {
  sc::nn::LSTMCell cell{32, 64, 3};
  std::vector<sc::Tensor> xs;
  std::int64_t batch;
  explicit LstmSteps(int steps, std::int64_t n = 1) : batch(n) {
    for (int t = 0; t < steps; ++t) xs.push_back(sc::random::uniform({n, 32}, -1.0, 1.0, 40 + t));
  }
  std::vector<sc::Tensor> operator()() const {
    sc::GradientTape tape;
    auto state = cell.initial_state(batch);
    for (const sc::Tensor& x : xs) state = cell(x, state);
    const sc::Tensor loss = sc::sum(state.first * state.second);
    std::vector<sc::Tensor> r = tape.gradient(loss, cell.trainable_variables());
    r.insert(r.begin(), loss);
    return r;
  }
};

/// How many nodes of each op c's optimized graph has.
std::map<std::string, int> op_counts(const sc::ConcreteFunction& c) {
  std::map<std::string, int> ops;
  for (const sc::graph::Node& n : c.graph().nodes) ++ops[std::string(n.name())];
  return ops;
}

}  // namespace

TEST_CASE("function: a traced MLP Adam step fused as on a GPU is 28 kernels: one for the loss, one for its gradient",
          "[function][train]") {
  // The example's MLP (784-256-128-10, Adam, batch 128) with every size fused, as a GPU plan fuses:
  // each kernel is a launch there (session 29 measured 238-245 us for 48 kernels on an H100). The
  // loss and its gradient are one op each (no check_range, one_hot, where or log), and relu's
  // gradient one fusible op (no greater or where). A change that adds kernels fails here.
  const FuseAll fuse_all;
  const auto [loss, c] = sctest::function::traced_mlp_adam_step();
  CHECK(std::isfinite(loss.item<float>()));
  INFO(c.stats());
  CHECK(c.stats().plan.kernels <= 28);
  std::map<std::string, int> ops;
  for (const sc::graph::Node& n : c.graph().nodes) ++ops[std::string(n.name())];
  CHECK(ops["softmax_cross_entropy"] == 1);
  CHECK(ops["softmax_cross_entropy_grad"] == 1);
  CHECK(ops["relu_grad"] == 2);
  for (const char* gone : {"check_range", "one_hot", "where", "greater", "log"}) {
    INFO(gone);
    CHECK(ops.count(gone) == 0);
  }
}

TEST_CASE("function: a traced LSTM fused as on a GPU: gates read through windows, their gradients one concat, bit for bit",
          "[function][train]") {
  // The four gate slices' gradients are zero-padded and summed: distributed over the pads
  // (graph::distribute_over_concat), each step's sum is one concat of four pieces. 10 steps of the
  // bench's LSTM (32 -> 64, batch 1: its zero pads are fill ops), every size fused as a GPU
  // plan fuses, the slices read through windows. The bench's 50 steps (the kernel's gradient
  // only) went from 953 kernels to 405. Products are not batched here (graph::product_batching:
  // batched sums run in another order): each result is eager's, bit for bit.
  const FuseAll fuse_all;
  const bool batching = sc::graph::product_batching();
  sc::graph::product_batching() = false;
  struct Restore {
    bool on;
    ~Restore() { sc::graph::product_batching() = on; }
  } restore{batching};
  constexpr int steps = 10;
  const LstmSteps lstm(steps);
  const std::vector<sc::Tensor> eager = lstm();
  auto f = sc::function([&] { return lstm(); });
  const std::vector<sc::Tensor> staged = f();
  REQUIRE(staged.size() == eager.size());
  for (std::size_t k = 0; k < eager.size(); ++k) {
    INFO("result " << k);
    CHECK(same_bits(eager[k], staged[k]));
  }
  const sc::ConcreteFunction c = f.get_concrete();
  INFO(c.stats());
  std::map<std::string, int> ops = op_counts(c);
  CHECK(ops["concat"] == steps);
  // the gates are windows of x W and h U per step (read by their fused group: no kernel) and of
  // the bias (four slices for every step); z = x W + h U + b is never made
  CHECK(ops["slice"] == 8 * steps + 4);
  CHECK(c.stats().plan.kernels <= 10 * steps + 10);
}

TEST_CASE("function: slices read only by a fused group are read through windows, no kernel of their own",
          "[function][fusion]") {
  const FuseAll fuse_all;
  const sc::Tensor x = sc::random::uniform({5, 12}, -3.0, 3.0, 71);
  // gates: four column windows of one value, one group, one kernel
  const auto gates = [](const sc::Tensor& z) {
    const auto part = [&](std::int64_t k) { return sc::slice(z, {0, 3 * k}, {-1, 3}); };
    const sc::Tensor c = sc::sigmoid(part(0)) * sc::tanh(part(2)) + sc::sigmoid(part(1));
    return sc::sigmoid(part(3)) * sc::tanh(c);
  };
  auto f = sc::function(gates);
  CHECK(same_bits(sc::Tensor(f(x)), gates(x)));
  const sc::ConcreteFunction c = f.get_concrete(x);
  INFO(c.stats());
  CHECK(c.stats().plan.kernels == 1);
  // a row window broadcast over an output of its parent's shape, the parent dying there: the
  // output must not take the parent's buffer (each row would read a row already overwritten)
  const auto rows = [](const sc::Tensor& v) {
    const sc::Tensor e = sc::exp(v) - 1.f;
    // (transposed after: the group's output is an intermediate the plan places)
    return sc::transpose(sc::slice(e, {2, 0}, {1, -1}) * (v * 2.f) + sc::slice(e, {4, 0}, {1, -1}));
  };
  auto h = sc::function(rows);
  CHECK(same_bits(sc::Tensor(h(x)), rows(x)));
  // a slice also read outside the group stays a kernel (its result is needed there)
  const auto shared = [](const sc::Tensor& v) {
    const sc::Tensor s = sc::slice(v, {0, 2}, {-1, 4});
    return std::vector<sc::Tensor>{sc::exp(s) * s + 1.f, sc::sum(s, {1})};
  };
  auto k = sc::function(shared);
  const std::vector<sc::Tensor> got = k(x), want = shared(x);
  CHECK(same_bits(got[0], want[0]));
  CHECK(same_bits(got[1], want[1]));
  std::map<std::string, int> ops;
  for (const sc::graph::Node& n : k.get_concrete(x).graph().nodes) ++ops[std::string(n.name())];
  CHECK(ops["slice"] == 1);
}

TEST_CASE("function: independent groups of one shape are one group, unless a kernel between needs the first",
          "[function][fusion]") {
  const FuseAll fuse_all;
  const sc::Tensor x = sc::random::uniform({6, 6}, -2.0, 2.0, 81), w = sc::random::uniform({6, 6}, -1.0, 1.0, 82);
  const auto same = [](const std::vector<sc::Tensor>& a, const std::vector<sc::Tensor>& b) {
    bool ok = a.size() == b.size();
    for (std::size_t k = 0; ok && k < a.size(); ++k) ok = same_bits(a[k], b[k]);
    return ok;
  };
  // two chains reading x, neither reading the other: one pass
  const auto siblings = [](const sc::Tensor& v) {
    return std::vector<sc::Tensor>{sc::exp(v) * 2.f, sc::tanh(v) + 1.f, sc::sigmoid(v) - v};
  };
  auto f = sc::function(siblings);
  CHECK(same(f(x), siblings(x)));
  INFO(f.get_concrete(x).stats());
  CHECK(f.get_concrete(x).stats().plan.kernels == 1);
  // the second chain reads a product of the first's result: the first runs before the product
  const auto chained = [&w](const sc::Tensor& v) {
    const sc::Tensor a = sc::exp(v) * 2.f;
    return std::vector<sc::Tensor>{a, (v + 1.f) * sc::matmul(a, w)};
  };
  auto h = sc::function(chained);
  CHECK(same(h(x), chained(x)));
  CHECK(h.get_concrete(x).stats().plan.kernels == 3);
  // on the CPU, updates of variables of one shape stay one group each (an Adam update is then
  // the compiled Adam loop): two assignments, two groups
  sc::Variable va(sc::random::uniform({40, 40}, -1.0, 1.0, 84)), vb(sc::random::uniform({40, 40}, -1.0, 1.0, 85));
  auto upd = sc::function([&](const sc::Tensor& v) {
    va.assign(va * 0.5f + v);
    vb.assign(vb * 0.25f - v);
    return v;
  });
  const sc::Tensor u = sc::random::uniform({40, 40}, -1.0, 1.0, 86);
  const std::vector<float> a0 = va.value().to_vector<float>(), b0 = vb.value().to_vector<float>(), uv = u.to_vector<float>();
  (void)upd(u);
  CHECK(upd.get_concrete(u).stats().plan.kernels == 2);
  const std::vector<float> a1 = va.value().to_vector<float>(), b1 = vb.value().to_vector<float>();
  for (std::size_t i = 0; i < uv.size(); ++i) {
    CHECK(a1[i] == a0[i] * 0.5f + uv[i]);
    CHECK(b1[i] == b0[i] * 0.25f - uv[i]);
  }
  // ... and a traced Adam step over two such layers runs both weights' updates specialized
  sc::graph::fusion_min_elements() = fuse_all.saved;
  sc::manual_seed(4);
  sc::nn::Dense l1(32, 32), l2(32, 32);  // (the weights' updates reach fusion_min_elements)
  sc::optim::Adam opt(0.01);
  std::vector<sc::Variable> vars = l1.trainable_variables();
  for (const auto& v : l2.trainable_variables()) vars.push_back(v);
  auto step = sc::function([&](const sc::Tensor& v) {
    sc::GradientTape tape;
    const sc::Tensor loss = sc::sum(l2(sc::tanh(l1(v))));
    opt.apply(tape.gradient(loss, vars), vars);
    return loss;
  });
  const sc::Tensor in = sc::random::uniform({3, 32}, -1.0, 1.0, 83);
  (void)step(in);
  INFO(step.get_concrete(in).stats());
  CHECK(step.get_concrete(in).stats().plan.specialized == (sc::graph::fused_specializations() ? 2 : 0));
}

TEST_CASE("function: small elementwise chains are not fused (the tile evaluator costs more there)", "[function][fusion]") {
  auto f = sc::function([](sc::Tensor x) { return sc::tanh(x * 2.f + 1.f); });
  CHECK(f.get_concrete(sc::ones({64})).stats().plan.fused_groups == 0);
  CHECK(f.get_concrete(sc::ones({4096})).stats().plan.fused_groups == 1);
  const sc::Tensor x = sc::random::normal({4096}, 9);
  CHECK(f(x).to_vector<float>() == sc::tanh(x * 2.f + 1.f).to_vector<float>());
}

TEST_CASE("function: a matmul's bias and activation run as its epilogue, in the matmul's step", "[function][fusion]") {
  const sc::Tensor w = sc::random::normal({64, 48}, 1), b = sc::random::normal({48}, 2);
  auto layer = [&](const sc::Tensor& x) { return sc::relu(sc::matmul(x, w) + b); };
  auto f = sc::function(layer);
  const sc::Tensor x = sc::random::normal({100, 64}, 3);  // 4800 outputs: fused
  const auto st = f.get_concrete(x).stats();
  CHECK(st.plan.epilogues == 1);
  CHECK(st.plan.fused_groups == 1);
  CHECK(st.plan.steps == 1);    // matmul + add + relu: one step
  CHECK(st.plan.kernels == 2);  // the GEMM and one pass over its result
  check_same(f(x), layer(x));
  // The matmul's result is also needed elsewhere (returned): still one step, kept whole.
  auto g = sc::function([&](const sc::Tensor& in) {
    const sc::Tensor h = sc::matmul(in, w);
    return std::make_tuple(sc::tanh(h + b), h);
  });
  const auto [y, h] = g(x);
  check_same(y, sc::tanh(sc::matmul(x, w) + b));
  check_same(h, sc::matmul(x, w));
  CHECK(g.get_concrete(x).stats().plan.epilogues == 1);
  // Read by another node before the group runs: no epilogue, same numbers.
  auto k = sc::function([&](const sc::Tensor& in) {
    const sc::Tensor m = sc::matmul(in, w);
    const sc::Tensor s = sc::sum(m);             // reads m before the group below
    return sc::exp(-(m + b)) * s;
  });
  check_same(k(x), [&] {
    const sc::Tensor m = sc::matmul(x, w);
    return sc::exp(-(m + b)) * sc::sum(m);
  }(), 1e-6);
}

TEST_CASE("function: a sum, max or min over trailing axes consumes the fused group", "[function][fusion]") {
  const sc::Tensor x = sc::random::normal({64, 300}, 4), y = sc::random::normal({64, 300}, 5);
  auto mse = [](const sc::Tensor& a, const sc::Tensor& b) { return sc::sum(sc::square(a - b) * 0.5f); };
  auto f = sc::function(mse);
  const auto st = f.get_concrete(x, y).stats();
  CHECK(st.plan.fused_reductions == 1);
  CHECK(st.plan.steps == 1);
  check_same(f(x, y), mse(x, y), 1e-6);
  // Row reductions (softmax's max and sum) and a value also used after the reduction.
  auto rows = [](const sc::Tensor& a) {
    const sc::Tensor e = sc::exp(a * 2.f - 1.f);
    return std::make_tuple(sc::max(sc::tanh(a) + 1.f, {-1}), sc::sum(e, {-1}, true), e * 3.f);
  };
  auto g = sc::function(rows);
  const auto [m, s, e3] = g(x);
  const auto [m0, s0, e30] = rows(x);
  check_same(m, m0);  // max: exactly
  check_same(s, s0, 1e-6);
  check_same(e3, e30);
  CHECK(g.get_concrete(x).stats().plan.fused_reductions == 2);
  // Leading axes (a bias gradient's sum over the batch): fused on the CPU too
  // (graph::column_reductions(), test_fused_columns.cpp), the eager sum's bits.
  auto lead = [](const sc::Tensor& a) { return sc::sum(sc::relu(a) * 2.f, {0}); };
  auto h = sc::function(lead);
  CHECK(h.get_concrete(x).stats().plan.fused_reductions == 1);
  check_same(h(x), lead(x));
}

/// a and b (f32 or f64) hold the same values bit for bit.
bool same_bits_any(const sc::Tensor& a, const sc::Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  if (a.dtype() == sc::f32) return same_bits(a, b);
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  for (std::size_t i = 0; i < x.size(); ++i)
    if (std::bit_cast<std::uint64_t>(x[i]) != std::bit_cast<std::uint64_t>(y[i])) return false;
  return true;
}

TEST_CASE("fused: a sum, mean or max of a fused group gives the eager reduction's bits, long rows cut alike",
          "[function][fusion]") {
  FuseAll fuse;
  // Rows short and long, many and few (few long rows: the eager kernel cuts them into chunks),
  // lengths off every batch and pair_block boundary; f32 and f64; 1 and 2 threads.
  const std::vector<sc::Shape> shapes = {{64, 300}, {1000, 77}, {4, 5000}, {2, 3, 1029}, {3, 1 << 17}, {1, 250001}};
  auto sq = [](const sc::Tensor& a, const sc::Tensor& b) { return sc::sum(a * a + b, {-1}); };
  auto mean = [](const sc::Tensor& a, const sc::Tensor& b) { return sc::mean(a * b - 0.25, {-1}, true); };
  auto mx = [](const sc::Tensor& a, const sc::Tensor& b) { return sc::max(sc::tanh(a) * b, {-1}); };
  auto all = [](const sc::Tensor& a, const sc::Tensor& b) { return sc::sum(sc::square(a - b) * 0.5); };
  auto wave = [](const sc::Tensor& a, const sc::Tensor& b) { return sc::sum(sc::sin(a) * b, {-1}); };
  for (const sc::DType d : {sc::f32, sc::f64}) {
    for (const sc::Shape& s : shapes) {
      const sc::Tensor x = sc::random::normal(s, 7, 0.0, 1.0, d), y = sc::random::normal(s, 8, 0.0, 1.0, d);
      sctest::at_threads({1, 2}, [&](int) {
        int k = 0;
        using Fn = std::function<sc::Tensor(const sc::Tensor&, const sc::Tensor&)>;
        for (const Fn& f : std::vector<Fn>{sq, mean, mx, all, wave}) {
          auto staged = sc::function(f);
          INFO("shape " << s << ", dtype " << d << ", function " << k++);
          CHECK(staged.get_concrete(x, y).stats().plan.fused_reductions == 1);
          CHECK(same_bits_any(staged(x, y), f(x, y)));
        }
      });
    }
  }
}

TEST_CASE("function: a traced LSTM's products are batched: one for all inputs, one per weight gradient",
          "[function][train]") {
  // graph::batch_products: the 10 inputs' x W are one product of the stacked inputs, the kernels'
  // gradients (10 outer products each) one product each, the bias gradient one column sum; the
  // recurrent h U and its gradient stay one per step. Every gradient of the cell, as LibTorch's
  // backward computes them. Within float rounding of eager (sums in another order).
  const FuseAll fuse_all;
  REQUIRE(sc::graph::product_batching());
  constexpr int steps = 10;
  const LstmSteps lstm(steps);
  const std::vector<sc::Tensor> eager = lstm();
  auto f = sc::function([&] { return lstm(); });
  const std::vector<sc::Tensor> staged = f();
  REQUIRE(staged.size() == eager.size());
  for (std::size_t k = 0; k < eager.size(); ++k) {
    INFO("result " << k);
    check_same(staged[k], eager[k], 1e-5);
  }
  const sc::ConcreteFunction c = f.get_concrete();
  INFO(c.stats());
  std::map<std::string, int> ops = op_counts(c);
  // x W once, h U per step, dz U^T per step but the first, dW and dU once each (49 unbatched)
  CHECK(ops["matmul"] == 1 + steps + (steps - 1) + 2);
  CHECK(ops["sum"] == 2);  // the loss and the bias gradient (11 unbatched)
  CHECK(c.stats().plan.kernels <= 6 * steps);  // 96 unbatched
}

TEST_CASE("function: a traced LSTM's gate gradients are written in place: no concat copies them", "[function][train]") {
  // graph::concat_in_place: each backward step's four gate gradients are written by their group
  // straight into their places in the step's dz, and each dz into its rows of the stacked dz the
  // weight gradients' products read (batch 1: the pieces lie one after another). The stacked h
  // keeps its concat for h_0 (a constant) alone. Results equal bit for bit with and without.
  // With graph::concat_fusion (the default) the group writes each step's dz itself (through
  // windows: at batch 1 they too lie one after another): the same kernels, placed the other way.
  const FuseAll fuse_all;
  constexpr int steps = 10;
  const LstmSteps lstm(steps);
  std::vector<sc::Tensor> first;
  int kernels_in_place = -1;
  for (const bool fused : {false, true}) {
    INFO("concat fusion " << fused);
    const sctest::passes::Switch fusion(sc::graph::concat_fusion(), fused);
    std::vector<sc::Tensor> with, without;
    int kernels_with = 0, kernels_without = 0;
    for (const bool on : {true, false}) {
      const sctest::passes::Switch in_place(sc::graph::concat_in_place(), on);
      auto f = sc::function([&] { return lstm(); });
      (on ? with : without) = f();
      (on ? kernels_with : kernels_without) = f.get_concrete().stats().plan.kernels;
      CHECK(f.get_concrete().stats().plan.fused_concats == (fused ? steps : 0));
    }
    REQUIRE(with.size() == without.size());
    if (first.empty()) first = with;
    for (std::size_t k = 0; k < with.size(); ++k) {
      INFO("result " << k);
      CHECK(same_bits(with[k], without[k]));
      CHECK(same_bits(with[k], first[k]));
    }
    INFO(kernels_with << " kernels in place, " << kernels_without << " without");
    CHECK(kernels_with == kernels_without - (fused ? 1 : steps + 1));
    if (kernels_in_place < 0) kernels_in_place = kernels_with;
    CHECK(kernels_with == kernels_in_place);
  }
}

TEST_CASE("function: a two-layer LSTM's products are batched across layers, its input gradient too", "[function][train]") {
  // Layer 2 reads layer 1's outputs: its 12 input products do not depend on each other and are one
  // product; so are the input gradients of both layers (dz W^T), which do not feed each other. A
  // persistent tape asked twice (variables, then the input) records the backward twice: cse merges
  // the copies before their products are stacked. 142 products and 254 kernels unbatched.
  const FuseAll fuse_all;
  constexpr int steps = 12;
  sc::nn::LSTMCell c1{8, 16, 3}, c2{16, 16, 4};
  std::vector<sc::Variable> vars = c1.trainable_variables();
  for (const sc::Variable& v : c2.trainable_variables()) vars.push_back(v);
  const auto body = [&](const sc::Tensor& x) {
    sc::GradientTape tape(/*persistent=*/true);
    tape.watch(x);
    auto s1 = c1.initial_state(2), s2 = c2.initial_state(2);
    for (int t = 0; t < steps; ++t) {
      s1 = c1(sc::reshape(sc::slice(x, {t, 0, 0}, {1, -1, -1}), {2, 8}), s1);
      s2 = c2(s1.first, s2);
    }
    const sc::Tensor loss = sc::sum(s2.first * s2.second);
    std::vector<sc::Tensor> r = tape.gradient(loss, vars);
    r.push_back(tape.gradient(loss, x));
    r.insert(r.begin(), loss);
    return r;
  };
  const sc::Tensor x = sc::random::uniform({steps, 2, 8}, -1.0, 1.0, 7);
  const std::vector<sc::Tensor> eager = body(x);
  auto f = sc::function(body);
  const std::vector<sc::Tensor> staged = f(x);
  REQUIRE(staged.size() == eager.size());
  for (std::size_t k = 0; k < eager.size(); ++k) {
    INFO("result " << k);
    check_same(staged[k], eager[k], 1e-5);
  }
  const sc::ConcreteFunction c = f.get_concrete(x);
  INFO(c.stats());
  // per layer: x W once, h U per step, dz U^T per step but the first, dz W^T once, dW and dU once
  CHECK(op_counts(c)["matmul"] == 2 * (1 + steps + (steps - 1) + 1 + 2));
  CHECK(c.stats().plan.kernels <= 190);
}

TEST_CASE("function: an LSTM's recurrent products are formed in the groups that read them, bit for bit",
          "[function][train][product]") {
  // graph::product_fusion: each step's h U (forward) and dz U^T (backward) formed by the group
  // that reads it instead of a kernel of its own (on a GPU by default; here everywhere, for tests:
  // the CPU group forms it by the eager matmul's BLAS call before its tiles, so bits are kept).
  // Every step but the first backward one (dh_0 is not needed): 2 * steps - 1 products.
  const FuseAll fuse_all;
  constexpr int steps = 10;
  const LstmSteps lstm(steps);
  std::vector<sc::Tensor> with, without;
  int kernels_with = 0, kernels_without = 0, formed = -1;
  for (const bool on : {true, false}) {
    const sctest::passes::Switch mode(sc::graph::product_fusion(),
                                      on ? sc::graph::ProductFusion::everywhere : sc::graph::ProductFusion::off);
    auto f = sc::function([&] { return lstm(); });
    (on ? with : without) = f();
    const sc::graph::PlanStats st = f.get_concrete().stats().plan;
    (on ? kernels_with : kernels_without) = st.kernels;
    if (on) formed = st.fused_products;
    else CHECK(st.fused_products == 0);
  }
  REQUIRE(with.size() == without.size());
  for (std::size_t k = 0; k < with.size(); ++k) {
    INFO("result " << k);
    CHECK(same_bits(with[k], without[k]));
  }
  INFO(kernels_with << " kernels with products formed, " << kernels_without << " without");
  CHECK(formed == 2 * steps - 1);
  CHECK(kernels_with == kernels_without - (2 * steps - 1));
}

TEST_CASE("function: an LSTM step lowered for a GPU (without one) is about two kernels per step", "[function][train][product]") {
  // The traced step's graph with every value relabelled cuda:0, optimized and lowered as a GPU's
  // plan (nothing runs): per step the gates' group with h U formed in it, and the gradients' group
  // with dz U^T; the rest is the batched products, the bias gradient and the loss.
  constexpr int steps = 10;
  const LstmSteps lstm(steps);
  auto f = sc::function([&] { return lstm(); });
  const sc::graph::PlanStats with = sctest::function::gpu_plan_stats(f.get_concrete());
  sc::graph::PlanStats without;
  {
    const sctest::passes::Switch off(sc::graph::product_fusion(), sc::graph::ProductFusion::off);
    without = sctest::function::gpu_plan_stats(f.get_concrete());
  }
  INFO(with.kernels << " kernels with products formed, " << without.kernels << " without");
  CHECK(with.fused_products == 2 * steps - 1);
  CHECK(without.fused_products == 0);
  // (less one: the last step's group, which ends in the loss's sum, forms its elements with a
  // warp's lanes and reduces them in a second kernel; cuda_product_lanes)
  CHECK(with.kernels == without.kernels - (2 * steps - 1) + 1);
  CHECK(with.kernels <= 2 * steps + 8);  // (the bias slices are windows of each step's group)
}

TEST_CASE("function: a product read outside its group, too large, or on the CPU by default stays a kernel",
          "[function][fusion][product]") {
  // x u is [1, 16], broadcast over c's 8 rows in the group (so not the group's CPU matmul head,
  // which takes a product of the group's own shape): 8 * 16 elements of 16 terms, 2048 multiply-adds.
  const FuseAll fuse_all;
  const sc::Tensor x = sc::random::uniform({1, 16}, -1.0, 1.0, 5), u = sc::random::uniform({16, 16}, -1.0, 1.0, 6),
                   c = sc::random::uniform({8, 16}, -1.0, 1.0, 7);
  const auto one = [](const sc::Tensor& a, const sc::Tensor& b, const sc::Tensor& d) {
    return sc::tanh(sc::matmul(a, b) + d) * 2.f;
  };
  const auto both = [](const sc::Tensor& a, const sc::Tensor& b, const sc::Tensor& d) {
    const sc::Tensor p = sc::matmul(a, b);
    return std::vector<sc::Tensor>{sc::tanh(p + d) * 2.f, p};
  };
  const auto products = [&](auto fn) {
    auto f = sc::function(fn);
    (void)f(x, u, c);
    return f.get_concrete(x, u, c).stats().plan.fused_products;
  };
  CHECK(products(one) == 0);  // the CPU by default (ProductFusion::gpu)
  const sctest::passes::Switch mode(sc::graph::product_fusion(), sc::graph::ProductFusion::everywhere);
  auto f = sc::function(one);
  CHECK(same_bits(sc::Tensor(f(x, u, c)), one(x, u, c)));
  CHECK(f.get_concrete(x, u, c).stats().plan.fused_products == 1);
  CHECK(f.get_concrete(x, u, c).stats().plan.kernels == 1);
  CHECK(products(both) == 0);  // its result leaves the plan
  // p = x u read by the group and also the operand of q = p u formed in it: p must be made first
  const auto chain = [](const sc::Tensor& a, const sc::Tensor& b, const sc::Tensor& d) {
    const sc::Tensor p = sc::matmul(a, b);
    return sc::tanh(sc::matmul(p, b) + d) * p;
  };
  auto fc = sc::function(chain);
  CHECK(same_bits(sc::Tensor(fc(x, u, c)), chain(x, u, c)));
  CHECK(fc.get_concrete(x, u, c).stats().plan.fused_products == 1);
  const sctest::passes::Switch limit(sc::graph::product_fusion_max_macs(), std::int64_t{8 * 16 * 16 - 1});
  CHECK(products(one) == 0);  // one multiply-add over the limit
}

TEST_CASE("function: a slice read by several groups is read through a window by each and never runs", "[function][fusion]") {
  // s = v[4:20] is read by two groups of other shapes (so not siblings): each reads its window of
  // v, and the slice is no step of the plan. Returned as well, the slice stays (it leaves the plan).
  const FuseAll fuse_all;
  const sc::Tensor v = sc::random::uniform({32}, -1.0, 1.0, 8), y = sc::random::uniform({8, 16}, -1.0, 1.0, 9),
                   z = sc::random::uniform({4, 16}, -1.0, 1.0, 10);
  const auto two = [](const sc::Tensor& a, const sc::Tensor& b, const sc::Tensor& c) {
    const sc::Tensor s = sc::slice(a, {4}, {16});
    return std::vector<sc::Tensor>{sc::exp(b + s) * 2.f, sc::sin(c - s) * 3.f};
  };
  const auto kept = [&](const sc::Tensor& a, const sc::Tensor& b, const sc::Tensor& c) {
    std::vector<sc::Tensor> r = two(a, b, c);
    r.push_back(sc::slice(a, {4}, {16}));
    return r;
  };
  auto f = sc::function(two);
  const std::vector<sc::Tensor> got = f(v, y, z), want = two(v, y, z);
  for (std::size_t k = 0; k < want.size(); ++k) CHECK(same_bits(got[k], want[k]));
  const sc::graph::PlanStats st = f.get_concrete(v, y, z).stats().plan;
  auto g = sc::function(kept);
  const std::vector<sc::Tensor> got2 = g(v, y, z), want2 = kept(v, y, z);
  for (std::size_t k = 0; k < want2.size(); ++k) CHECK(same_bits(got2[k], want2[k]));
  const sc::graph::PlanStats st2 = g.get_concrete(v, y, z).stats().plan;
  INFO(st.steps << " steps, " << st2.steps << " with the slice returned");
  CHECK(st.fused_groups == 2);
  CHECK(st.steps == 2);
  CHECK(st2.steps == 3);
}

TEST_CASE("function: an LSTM's gate gradients at batch 32 are written by their group: a step is two kernels on a GPU",
          "[function][train][concat]") {
  // At batch 32 a step's four gate gradients are not one run of dz's bytes (dz is [32, 256]), so
  // they cannot be placed in it: their concat was a kernel of its own. With graph::concat_fusion
  // the group writes each gradient through its window of dz. Lowered for a GPU (the graph
  // relabelled cuda:0; nothing runs): 10 kernels fewer. Run on the CPU: the bits of the plan
  // without concat fusion, and eager's values (the batched products sum in another order).
  constexpr int steps = 10;
  const LstmSteps lstm(steps, 32);
  const FuseAll fuse_all;
  auto f = sc::function([&] { return lstm(); });
  const std::vector<sc::Tensor> eager = lstm(), staged = f();
  std::vector<sc::Tensor> apart;
  {
    const sctest::passes::Switch off(sc::graph::concat_fusion(), false);
    auto h = sc::function([&] { return lstm(); });
    apart = h();
    CHECK(h.get_concrete().stats().plan.fused_concats == 0);
  }
  for (std::size_t k = 0; k < eager.size(); ++k) {
    INFO("result " << k);
    CHECK(same_bits(apart[k], staged[k]));
    check_same(staged[k], eager[k], 1e-5);
  }
  CHECK(f.get_concrete().stats().plan.fused_concats == steps);
  const sc::graph::PlanStats with = sctest::function::gpu_plan_stats(f.get_concrete());
  sc::graph::PlanStats without;
  {
    const sctest::passes::Switch off(sc::graph::concat_fusion(), false);
    without = sctest::function::gpu_plan_stats(f.get_concrete());
  }
  INFO(with.kernels << " kernels with the concats written by their groups, " << without.kernels << " without");
  CHECK(with.fused_concats == steps);
  CHECK(with.kernels == without.kernels - steps);
  CHECK(with.kernels <= 2 * steps + 10);
}

TEST_CASE("function: a concat of a group's values is written by the group through windows, bit for bit",
          "[function][fusion][concat]") {
  // s = a + b, p = s * w, t = tanh(p): concat({s, t, p}) along each axis is written by the group
  // (no step of its own), also beside a row sum of a piece; a piece read
  // elsewhere too (by a matmul) stays an output as well; a concat with a piece from outside the
  // group stays a kernel.
  const sc::Tensor a = sc::random::uniform({32, 48}, -1.0, 1.0, 1), b = sc::random::uniform({32, 48}, -1.0, 1.0, 2),
                   w = sc::random::uniform({48}, -1.0, 1.0, 3), m = sc::random::uniform({48, 5}, -1.0, 1.0, 4);
  const auto values = [&](const sc::Tensor& x, const sc::Tensor& y) {
    const sc::Tensor s = x + y, p = s * w;
    return std::vector<sc::Tensor>{s, sc::tanh(p), p};
  };
  struct Case {
    const char* what;
    std::function<std::vector<sc::Tensor>(const sc::Tensor&, const sc::Tensor&)> fn;
    int concats;  // written by the group
    int saved = concats;  // kernels fewer (a concat whose pieces are placed in its buffer runs no kernel either way)
  };
  const std::vector<Case> cases = {
      {"along axis 1", [&](const sc::Tensor& x, const sc::Tensor& y) { return std::vector<sc::Tensor>{sc::concat(values(x, y), 1)}; }, 1},
      {"along axis 0", [&](const sc::Tensor& x, const sc::Tensor& y) { return std::vector<sc::Tensor>{sc::concat(values(x, y), 0)}; }, 1},
      {"along axis -1, then read by another group",
       [&](const sc::Tensor& x, const sc::Tensor& y) { return std::vector<sc::Tensor>{sc::exp(sc::concat(values(x, y), -1)) * 2.f}; }, 1},
      {"a piece read by a matmul too",
       [&](const sc::Tensor& x, const sc::Tensor& y) {
         const auto v = values(x, y);
         return std::vector<sc::Tensor>{sc::concat({v[0], v[1]}, 1), sc::matmul(v[0], m)};
       }, 1},
      {"a piece repeated, and a second concat",
       [&](const sc::Tensor& x, const sc::Tensor& y) {
         const auto v = values(x, y);
         return std::vector<sc::Tensor>{sc::concat({v[1], v[1], v[0]}, 0), sc::concat({v[2], v[0]}, 1)};
       }, 2},
      {"nested in a concat with an argument",
       [&](const sc::Tensor& x, const sc::Tensor& y) {
         return std::vector<sc::Tensor>{sc::concat({sc::concat(values(x, y), 0), x}, 0) * 3.f};
       }, 1, 0},
      {"beside a row sum",
       [&](const sc::Tensor& x, const sc::Tensor& y) {
         const auto v = values(x, y);
         return std::vector<sc::Tensor>{sc::concat({v[0], v[1]}, 1), sc::sum(v[1], {1})};
       }, 1},
      {"with a piece from outside the group",
       [&](const sc::Tensor& x, const sc::Tensor& y) {
         const auto v = values(x, y);
         return std::vector<sc::Tensor>{sc::concat({v[0], x}, 1)};
       }, 0},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    std::vector<sc::Tensor> got[2];
    sc::graph::PlanStats st[2];
    for (const bool on : {false, true}) {
      const sctest::passes::Switch fusion(sc::graph::concat_fusion(), on);
      auto f = sc::function(c.fn);
      got[on] = f(a, b);
      st[on] = f.get_concrete(a, b).stats().plan;
    }
    const std::vector<sc::Tensor> want = c.fn(a, b);
    for (std::size_t k = 0; k < want.size(); ++k) {
      INFO("result " << k);
      CHECK(same_bits(got[0][k], want[k]));
      CHECK(same_bits(got[1][k], want[k]));
    }
    INFO(st[1].kernels << " kernels, " << st[0].kernels << " without concat fusion");
    CHECK(st[1].fused_concats == c.concats);
    CHECK(st[0].fused_concats == 0);
    CHECK(st[1].kernels == st[0].kernels - c.saved);
  }
}

TEST_CASE("function: a plan lists its steps, one line each, bodies of control flow indented", "[function][fusion]") {
  sc::Variable w(sc::full({64, 64}, 0.01f));
  auto f = sc::function([&](const sc::Tensor& x) {
    const sc::Tensor h = sc::relu(sc::matmul(x, w) + 1.f);  // a matmul heading its group (on the CPU: 2 kernels)
    w.assign(w * 0.5f);
    return sc::cond(sc::sum(h) > 0.f, [&] { return sc::tanh(h) * 3.f; }, [&] { return sc::transpose(h, {1, 0}); });
  });
  const sc::Tensor x = sctest::uniform_tensor({64, 64}, 2, -1.0, 1.0).astype(sc::f32);
  f(x);
  const sc::ConcreteFunction c = f.get_concrete(x);
  const std::string s = c.plan().str();
  INFO(s);
  CHECK_THAT(s, Catch::Contains("read variable -> f32[64, 64]\n"));
  CHECK_THAT(s, Catch::Contains("kernel mul -> f32[64, 64]\n"));
  CHECK_THAT(s, Catch::Contains("assign variable <- f32[64, 64]\n"));
  // (the sum consumes the group: its result is the group's second output)
  CHECK_THAT(s, Catch::Contains("fused (2 kernels) matmul -> add, relu, sum -> f32[64, 64], f32[]\n"));
  CHECK_THAT(s, Catch::Contains("kernel greater -> bool[]\n"));
  CHECK_THAT(s, Catch::Contains("cond -> f32[64, 64]\n   then:\n     0. fused tanh, mul -> f32[64, 64]\n   else:\n     0. kernel transpose"));
  // one line per step at the top level, numbered from 0
  std::size_t top = 0;
  for (std::size_t at = 0; at < s.size(); at = s.find('\n', at) + 1)
    top += s[at] >= '0' && s[at] <= '9';
  CHECK(static_cast<int>(top) == c.stats().plan.steps);
  CHECK(s.rfind("0. ", 0) == 0);
}

TEST_CASE("function: with plan_host_timing on, a plan times each step's host work and lists it", "[function][fusion]") {
  auto f = sc::function([](const sc::Tensor& x) { return sc::sum(sc::tanh(sc::matmul(x, x)) * 2.f); });
  const sc::Tensor x = sctest::uniform_tensor({96, 96}, 3, -1.0, 1.0).astype(sc::f32);
  f(x);
  const sc::ConcreteFunction c = f.get_concrete(x);
  CHECK(c.plan().host_times().empty());  // (off by default: nothing timed)
  CHECK(c.plan().str().find(" us] ") == std::string::npos);
  sc::graph::plan_host_timing() = true;
  for (int i = 0; i < 3; ++i) f(x);
  sc::graph::plan_host_timing() = false;
  f(x);  // (not timed)
  const std::vector<double> us = c.plan().host_times();
  REQUIRE(static_cast<int>(us.size()) == c.stats().plan.steps);
  double total = 0;
  for (double t : us) {
    CHECK(t >= 0);
    total += t;
  }
  CHECK(total > 0);  // (a 96^3 product takes some time)
  const std::string s = c.plan().str();
  INFO(s);
  CHECK(s.rfind("0. [", 0) == 0);
  CHECK_THAT(s, Catch::Contains(" us] fused (2 kernels) matmul -> tanh, mul, sum"));
}
