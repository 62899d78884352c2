// Row chains (graph/plan_rows.hpp): consecutive CPU steps over the same rows run a block of rows
// at a time. Each chain computes the same bits as its steps run one after another (row_chains()
// off), on any thread count, and the steps that may not join one stay apart.
#include <catch2/catch.hpp>

#include <bit>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <stagecraft/stagecraft.hpp>

#include "function_testing.hpp"
#include "passes_testing.hpp"
#include "testing.hpp"

namespace {

using sctest::function::check_same;
using sctest::function::same_bits;

struct Traced {
  std::string plan;
  int chains = 0;
  std::vector<sc::Tensor> outs;
};

/// f traced (a fresh sc::function) with row chains on or off: its listing, chains and results.
template <class F, class... A>
Traced traced(bool on, const F& f, const A&... args) {
  const sctest::passes::Switch<bool> mode(sc::graph::row_chains(), on);
  auto fn = sc::function(f);
  Traced t;
  if constexpr (std::is_same_v<decltype(fn(args...)), sc::Tensor>) t.outs.push_back(fn(args...));
  else std::apply([&](const auto&... o) { (t.outs.push_back(o), ...); }, fn(args...));
  const auto& plan = fn.get_concrete(args...).plan();
  t.plan = plan.str();
  t.chains = plan.stats().row_chains;
  return t;
}

/// Runs f traced with chains on (at 1 and 2 threads) and off: the same bits everywhere; returns
/// the chained run.
template <class T, class F, class... A>
Traced same_with_and_without(const F& f, const A&... args) {
  const Traced off = traced(false, f, args...);
  Traced on;
  sctest::at_threads({1, 2}, [&](int) {
    on = traced(true, f, args...);
    INFO(on.plan);
    REQUIRE(on.outs.size() == off.outs.size());
    for (std::size_t k = 0; k < on.outs.size(); ++k) {
      INFO("output " << k);
      CHECK(same_bits<T>(on.outs[k], off.outs[k]));
    }
  });
  CHECK(off.chains == 0);
  CHECK_THAT(off.plan, !Catch::Contains("rows: steps"));
  return on;
}

}  // namespace

TEMPLATE_TEST_CASE("row chains: a traced layer_norm runs its steps a block of rows at a time, with the same bits",
                   "[function][rows]", float, double) {
  using T = TestType;
  const sc::DType d = sc::dtype_of<T>();
  const sc::Tensor x = (sc::random::normal({300, 257}, 21) * 3.f + 1.f).astype(d);
  const sc::Tensor gamma = sc::random::uniform({257}, 0.5, 1.5, 22, d), beta = sc::random::uniform({257}, -1.0, 1.0, 23, d);
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  {
    const auto ln = [](const sc::Tensor& a) { return sc::nn::layer_norm(a, {257}); };
    const Traced on = same_with_and_without<T>(ln, x);
    INFO(on.plan);
    CHECK(on.chains == 1);
    CHECK_THAT(on.plan, Catch::Contains("rows: steps 0-"));
    check_same(on.outs[0], ln(x), tol);
  }
  {
    const auto ln = [](const sc::Tensor& a, const sc::Tensor& g, const sc::Tensor& b) {
      return sc::nn::layer_norm(a, {257}, g, b);
    };
    const Traced on = same_with_and_without<T>(ln, x, gamma, beta);
    INFO(on.plan);
    CHECK(on.chains == 1);
    check_same(on.outs[0], ln(x, gamma, beta), tol);
  }
  {  // rank 3: the rows are the first two axes
    const sc::Tensor x3 = sc::reshape(x, {20, 15, 257});
    const auto ln = [](const sc::Tensor& a, const sc::Tensor& g, const sc::Tensor& b) {
      return sc::nn::layer_norm(a, {257}, g, b);
    };
    const Traced on = same_with_and_without<T>(ln, x3, gamma, beta);
    INFO(on.plan);
    CHECK(on.chains == 1);
    check_same(on.outs[0], ln(x3, gamma, beta), tol);
  }
}

TEST_CASE("row chains: softmax, log_softmax and a layer_norm's gradient keep their bits", "[function][rows]") {
  const sc::Tensor x = sc::random::normal({513, 130}, 24) * 4.f;
  {
    const auto f = [](const sc::Tensor& a) { return sc::nn::softmax(a, -1); };
    const Traced on = same_with_and_without<float>(f, x);
    INFO(on.plan);
    CHECK(on.chains >= 1);
    check_same(on.outs[0], f(x), 1e-6);
  }
  {
    const auto f = [](const sc::Tensor& a) { return sc::nn::log_softmax(a, -1); };
    const Traced on = same_with_and_without<float>(f, x);
    check_same(on.outs[0], f(x), 1e-5);
  }
  {  // rows longer than a reduction's chunk: each row's chunks combined in the same order
    const sc::Tensor wide = sc::random::normal({64, 20000}, 31) * 4.f;
    const auto f = [](const sc::Tensor& a) { return sc::nn::softmax(a, -1); };
    const Traced on = same_with_and_without<float>(f, wide);
    INFO(on.plan);
    CHECK(on.chains == 1);
    check_same(on.outs[0], f(wide), 1e-6);
  }
  const sc::Tensor w = sc::random::normal({513, 130}, 25);
  const sc::Tensor gamma = sc::random::uniform({130}, 0.5, 1.5, 26), beta = sc::random::uniform({130}, -1.0, 1.0, 27);
  const auto step = [](const sc::Tensor& a, const sc::Tensor& r, const sc::Tensor& g, const sc::Tensor& b) {
    sc::GradientTape tape;
    tape.watch(a);
    tape.watch(g);
    tape.watch(b);
    const sc::Tensor loss = sc::sum(sc::nn::layer_norm(a, {130}, g, b) * r);
    const std::vector<sc::Tensor> gs = tape.gradient(loss, {a, g, b});
    return std::make_tuple(loss, gs[0], gs[1], gs[2]);
  };
  const Traced on = same_with_and_without<float>(step, x, w, gamma, beta);
  INFO(on.plan);
  CHECK(on.chains >= 1);
  const auto [l, gx, gg, gb] = step(x, w, gamma, beta);
  check_same(on.outs[0], l, 1e-3);
  check_same(on.outs[1], gx, 1e-4);
  check_same(on.outs[2], gg, 1e-3);
  check_same(on.outs[3], gb, 1e-3);
}

TEST_CASE("row chains: steps that do not work row by row, small plans and inexact kernels stay apart",
          "[function][rows]") {
  const sc::Tensor x = sc::random::normal({400, 160}, 28);
  {  // a column sum between two row steps: it reads every row
    const auto f = [](const sc::Tensor& a) {
      const sc::Tensor c = a - sc::sum(a, {-1}, true) / 160.f;
      const sc::Tensor col = sc::sum(c * c, {0}, true);
      return c / (col + 1.f);
    };
    const Traced on = same_with_and_without<float>(f, x);
    INFO(on.plan);
    CHECK(on.chains == 1);
    // (the column sum, fused with c * c in step 2, joins it; the last step, which reads the sum,
    // does not, and computes c again)
    CHECK_THAT(on.plan, Catch::Contains("2. fused sub, mul, sum -> f32[1, 160]\n"));
    CHECK_THAT(on.plan, Catch::Contains("rows: steps 0-2 run"));
    check_same(on.outs[0], f(x), 1e-5);
  }
  {  // below row_chain_min_elements: no chain
    const sc::Tensor small = sc::random::normal({64, 100}, 29);
    const auto ln = [](const sc::Tensor& a) { return sc::nn::layer_norm(a, {100}); };
    const Traced on = traced(true, ln, small);
    INFO(on.plan);
    CHECK(on.chains == 0);
    CHECK_THAT(on.plan, !Catch::Contains("rows: steps"));
  }
  {  // a kernel whose bits depend on its batching (sin alone, not in a group) ends a chain
    const auto f = [](const sc::Tensor& a) {
      const sc::Tensor m = sc::sum(a, {-1}, true);
      return sc::sin(m) * a;
    };
    const Traced on = same_with_and_without<float>(f, x);
    INFO(on.plan);
    CHECK_THAT(on.plan, Catch::Contains("kernel sin"));
    CHECK(on.chains == 0);
    check_same(on.outs[0], f(x), 1e-5);
  }
  {  // integers: no chain
    const sc::Tensor xi = (sc::random::normal({400, 160}, 30) * 50.f).astype(sc::DType::i32);
    const auto f = [](const sc::Tensor& a) { return a - sc::max(a, {-1}, true); };
    const Traced on = traced(true, f, xi);
    CHECK(on.chains == 0);
    CHECK(on.outs[0].to_vector<std::int32_t>() == f(xi).to_vector<std::int32_t>());
  }
}

TEST_CASE("row chains: reductions over the leading axes join a chain chunk by chunk, with the same bits",
          "[function][rows]") {
  // [rows, cols]: the backend cuts the rows into chunks of 3 (513 x 130), 12 with a last chunk of
  // one row and rows of an odd length (3001 x 67), 79 with a last of 13, each chunk's sum added in
  // pairwise halves of at most 64 rows (20000 x 64)
  for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{513, 130}, {3001, 67}, {20000, 64}}) {
    INFO(rows << " x " << cols);
    const sc::Tensor x = sc::random::normal({rows, cols}, 40) * 3.f, w = sc::random::normal({rows, cols}, 41);
    const float n = static_cast<float>(cols);
    const auto f = [n](const sc::Tensor& a, const sc::Tensor& r) {
      const sc::Tensor s0 = sc::sum(r, {0});             // a kernel's sum of an input
      const sc::Tensor c = a - sc::sum(a, {-1}, true) / n;  // rows
      const sc::Tensor s1 = sc::sum(c * r, {0}, true);   // a fused group's sum
      const sc::Tensor hi = sc::max(c * 2.f, {0});       // a maximum and a minimum
      const sc::Tensor lo = sc::min(a * r, {0});
      return std::make_tuple(c * r, s0, s1, hi, lo);
    };
    const Traced on = same_with_and_without<float>(f, x, w);
    INFO(on.plan);
    CHECK(on.chains >= 1);
    CHECK_THAT(on.plan, Catch::Contains("(column reductions)"));
    const auto [y, s0, s1, hi, lo] = f(x, w);
    check_same(on.outs[0], y, 1e-6);
    check_same(on.outs[1], s0, 1e-3);
    check_same(on.outs[2], s1, 1e-3);
    check_same(on.outs[3], hi, 0);
    check_same(on.outs[4], lo, 0);
  }
  {  // doubles, rank 3 (the leading axes are two), and the gradient of a bias and a gamma
    const sc::Tensor x = sc::random::normal({40, 150, 67}, 42).astype(sc::DType::f64),
                     r = sc::random::normal({40, 150, 67}, 43).astype(sc::DType::f64);
    const auto f = [](const sc::Tensor& a, const sc::Tensor& g) {
      const sc::Tensor c = a - sc::mean(a, {-1}, true);
      return std::make_tuple(c, sc::sum(g, {0, 1}), sc::sum(g * c, {0, 1}, true));
    };
    const Traced on = same_with_and_without<double>(f, x, r);
    INFO(on.plan);
    CHECK_THAT(on.plan, Catch::Contains("(column reductions)"));
    const auto [c, sb, sg] = f(x, r);
    check_same(on.outs[1], sb, 1e-10);
    check_same(on.outs[2], sg, 1e-10);
  }
  {  // too few chunks (very wide rows): the column sum stays a step of its own
    const sc::Tensor x = sc::random::normal({16, 40000}, 44), w = sc::random::normal({16, 40000}, 45);
    const auto f = [](const sc::Tensor& a, const sc::Tensor& r) {
      return std::make_tuple(a - sc::max(a, {-1}, true), sc::sum(a * r, {0}));
    };
    const Traced on = same_with_and_without<float>(f, x, w);
    INFO(on.plan);
    CHECK_THAT(on.plan, !Catch::Contains("(column reductions)"));
  }
}
