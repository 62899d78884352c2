// Eager composites of large CPU tensors run as staged functions (nn/composite.hpp): layer_norm,
// softmax, log_softmax and the activations give the values and gradients of their ops run one by
// one (and of plain loops), second derivatives too; small tensors, traces and the switch stay op
// by op; the traces kept are bounded; errors still name the caller's line.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace {

using sc::Shape;
using sc::Tensor;
namespace cd = sc::nn::composite_detail;

using Staging = sc::nn::CompositeStagingScope;

/// Composites of at least 32768 elements stage while alive (the default threshold is 262144,
/// four times that on one thread: the tests' tensors stay small).
struct Threshold : sc::nn::CompositeStagingScope {
  Threshold() : CompositeStagingScope(sc::nn::composite_staging(), sc::num_threads() > 1 ? 32768 : 8192) {}
};

void check_close(const Tensor& a, const Tensor& b, double tol) {
  REQUIRE(a.shape() == b.shape());
  REQUIRE(a.dtype() == b.dtype());
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!(std::abs(x[i] - y[i]) <= tol * (1 + std::abs(y[i])))) {
      if (bad++ < 3) UNSCOPED_INFO("element " << i << ": " << x[i] << " vs " << y[i]);
    }
  CHECK(bad == 0);
}

std::string at(int line) { return std::string("test_composite_staged.cpp:") + std::to_string(line); }

/// A composite of inputs t (t[0] is x) and what it should be.
struct Case {
  std::string name;
  std::function<Tensor(const std::vector<Tensor>&)> f;
  int inputs = 1;
};

std::vector<Case> cases() {
  namespace nn = sc::nn;
  return {
      {"layer_norm, gamma and beta", [](const auto& t) { return nn::layer_norm(t[0], {600}, t[1], t[2]); }, 3},
      {"layer_norm, gamma", [](const auto& t) { return nn::layer_norm(t[0], {600}, t[1]); }, 2},
      {"layer_norm, beta", [](const auto& t) { return nn::layer_norm(t[0], {600}, Tensor(), t[1]); }, 2},
      {"layer_norm, two axes", [](const auto& t) { return nn::layer_norm(t[0], {64, 600}, Tensor(), Tensor(), 1e-3); }},
      {"softmax", [](const auto& t) { return nn::softmax(t[0]); }},
      {"softmax over axis 0", [](const auto& t) { return nn::softmax(t[0], 0); }},
      {"log_softmax", [](const auto& t) { return nn::log_softmax(t[0]); }},
      {"gelu", [](const auto& t) { return nn::gelu(t[0]); }},
      {"gelu_tanh", [](const auto& t) { return nn::gelu_tanh(t[0]); }},
      {"silu", [](const auto& t) { return nn::silu(t[0]); }},
      {"elu", [](const auto& t) { return nn::elu(t[0], 0.7); }},
      {"softplus", [](const auto& t) { return nn::softplus(t[0]); }},
      {"leaky_relu", [](const auto& t) { return nn::leaky_relu(t[0], 0.1); }},
  };
}

/// f's value and the gradients of sum(f * w) with respect to its inputs, staging on or off.
std::vector<Tensor> value_and_grads(const Case& c, const std::vector<Tensor>& in, const Tensor& w, bool staging) {
  const Staging mode(staging);
  sc::GradientTape tape;
  for (const Tensor& t : in) tape.watch(t);
  const Tensor y = c.f(in);
  std::vector<Tensor> r{y};
  for (const Tensor& g : tape.gradient(sc::sum(y * w), in)) r.push_back(g);
  return r;
}

}  // namespace

TEST_CASE("composites of large eager CPU tensors run staged: the values and gradients of their ops",
          "[nn][composite][staged]") {
  const Threshold low;
  for (const sc::DType dt : {sc::f32, sc::f64}) {
    const double tol = dt == sc::f32 ? 2e-5 : 1e-11;
    const Tensor x = (sc::random::normal({64, 600}, 3) * 3 + 1).astype(dt);  // 38400 elements
    const Tensor w = sc::random::normal({64, 600}, 4).astype(dt);
    for (const Case& c : cases()) {
      INFO(c.name << ", " << sc::name(dt));
      std::vector<Tensor> in{x};
      for (int k = 1; k < c.inputs; ++k) in.push_back(sc::random::uniform({600}, 0.5, 1.5, 10 + k).astype(dt));
      const std::uint64_t before = cd::staged_calls();
      const auto staged = value_and_grads(c, in, w, true);
      CHECK(cd::staged_calls() == before + 1);
      const auto by_ops = value_and_grads(c, in, w, false);
      CHECK(cd::staged_calls() == before + 1);
      REQUIRE(staged.size() == by_ops.size());
      for (std::size_t k = 0; k < staged.size(); ++k) {
        INFO((k == 0 ? std::string("value") : "gradient " + std::to_string(k - 1)));
        check_close(staged[k], by_ops[k], tol);
      }
    }
  }
}

TEST_CASE("composites run staged: layer_norm and softmax against plain loops", "[nn][composite][staged]") {
  const Threshold low;
  const std::int64_t rows = 40, cols = 1000;
  const Tensor x = sc::random::normal({rows, cols}, 8).astype(sc::f64) * 4 + 2;
  const Tensor gamma = sc::random::uniform({cols}, 0.5, 1.5, 9).astype(sc::f64);
  const Tensor beta = sc::random::normal({cols}, 10).astype(sc::f64);
  const std::uint64_t before = cd::staged_calls();
  const auto ln = sc::nn::layer_norm(x, {cols}, gamma, beta).to_vector<double>();
  const auto sm = sc::nn::softmax(x).to_vector<double>();
  const auto ls = sc::nn::log_softmax(x).to_vector<double>();
  CHECK(cd::staged_calls() == before + 3);
  const auto xv = x.to_vector<double>(), gv = gamma.to_vector<double>(), bv = beta.to_vector<double>();
  for (std::int64_t r = 0; r < rows; ++r) {
    const double* row = xv.data() + r * cols;
    double mean = 0, var = 0, mx = row[0], se = 0;
    for (std::int64_t c = 0; c < cols; ++c) mean += row[c], mx = std::max(mx, row[c]);
    mean /= static_cast<double>(cols);
    for (std::int64_t c = 0; c < cols; ++c) var += (row[c] - mean) * (row[c] - mean), se += std::exp(row[c] - mx);
    var /= static_cast<double>(cols);
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::size_t i = static_cast<std::size_t>(r * cols + c);
      INFO("row " << r << ", column " << c);
      const double want_ln = (row[c] - mean) / std::sqrt(var + 1e-5) * gv[static_cast<std::size_t>(c)] + bv[static_cast<std::size_t>(c)];
      REQUIRE(std::abs(ln[i] - want_ln) <= 1e-12 * (1 + std::abs(want_ln)));
      REQUIRE(std::abs(sm[i] - std::exp(row[c] - mx) / se) <= 1e-14);
      REQUIRE(std::abs(ls[i] - (row[c] - mx - std::log(se))) <= 1e-12 * (1 + std::abs(ls[i])));
    }
  }
}

TEST_CASE("composites run staged: second derivatives equal those of their ops", "[nn][composite][staged][grad]") {
  const Threshold low;
  const Tensor x = sc::random::normal({40, 1000}, 12).astype(sc::f64);
  const auto second = [&](bool staging, const std::function<Tensor(const Tensor&)>& f) {
    const Staging mode(staging);
    sc::GradientTape outer;
    outer.watch(x);
    Tensor gx;
    {
      sc::GradientTape inner;
      inner.watch(x);
      gx = inner.gradient(sc::sum(f(x) * x), x);
    }
    return outer.gradient(sc::sum(gx * gx), x);
  };
  for (const auto& [name, f] : std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>>{
           {"softplus", [](const Tensor& t) { return sc::nn::softplus(t); }},
           {"softmax", [](const Tensor& t) { return sc::nn::softmax(t); }},
           {"layer_norm", [](const Tensor& t) { return sc::nn::layer_norm(t, {1000}); }}}) {
    INFO(name);
    check_close(second(true, f), second(false, f), 1e-10);
  }
}

TEST_CASE("composites run staged: LayerNorm's variables get their gradients", "[nn][composite][staged]") {
  const Threshold low;
  sc::nn::LayerNorm ln(512);
  ln.gamma.assign(sc::random::uniform({512}, 0.5, 1.5, 13));
  const Tensor x = sc::random::normal({96, 512}, 14);
  const Tensor w = sc::random::normal({96, 512}, 15);
  const auto run = [&](bool staging) {
    const Staging mode(staging);
    sc::GradientTape tape;
    const Tensor loss = sc::sum(ln(x) * w);
    return tape.gradient(loss, ln.trainable_variables());
  };
  const std::uint64_t before = cd::staged_calls();
  const auto staged = run(true);
  CHECK(cd::staged_calls() == before + 1);
  const auto by_ops = run(false);
  REQUIRE(staged.size() == 2);
  for (std::size_t k = 0; k < 2; ++k) check_close(staged[k], by_ops[k], 2e-5);
}

TEST_CASE("composites stay op by op: small tensors, traces, the switch (integer inputs stage as f32)",
          "[nn][composite][staged]") {
  const std::uint64_t before = cd::staged_calls();
  // The default threshold: 262144 elements, 1M on one thread.
  const Tensor mid = sc::random::normal({512, 500}, 1);  // 256000 elements
  (void)sc::nn::gelu(mid);
  (void)sc::nn::layer_norm(mid, {500});
  CHECK(cd::staged_calls() == before);
  const Threshold low;
  const Tensor small = sc::random::normal({10, 1000}, 1);  // under 32768 (8192 on one thread)
  (void)sc::nn::gelu(small);
  (void)sc::nn::layer_norm(small, {1000});
  CHECK(cd::staged_calls() == before);
  const Tensor big = sc::random::normal({100, 400}, 2);
  auto f = sc::function([](const Tensor& a) { return sc::nn::softmax(sc::nn::gelu(a)); });
  const Tensor traced = f(big);
  CHECK(cd::staged_calls() == before);  // inside a trace the ops join the outer graph
  {
    const Staging off(false);
    (void)sc::nn::gelu(big);
    CHECK(cd::staged_calls() == before);
  }
  check_close(traced, sc::nn::softmax(sc::nn::gelu(big)), 1e-6);
  CHECK(cd::staged_calls() == before + 2);
  const Tensor ints = sc::random::uniform({40000}, -3, 4, 5).astype(sc::i32);
  const Tensor y = sc::nn::silu(ints);
  CHECK(y.dtype() == sc::f32);
  CHECK(cd::staged_calls() == before + 3);
  const Staging off(false);
  check_close(y, sc::nn::silu(ints), 1e-6);
}

TEST_CASE("composites run staged: at most max_traces shapes each, then op by op", "[nn][composite][staged]") {
  const Threshold low;
  // elu with an alpha of its own: a staged function no other test traces
  for (std::int64_t n = 0; n < cd::max_traces() + 3; ++n) {
    const Tensor x = sc::random::normal({33000 + n}, static_cast<std::uint64_t>(n));
    const Tensor y = sc::nn::elu(x, 0.25);
    const Staging off(false);
    check_close(y, sc::nn::elu(x, 0.25), 1e-6);
  }
  auto& c = cd::cache<sc::nn::ActivationOps>();
  int traces = -1;
  for (auto& [body, fn] : c.fns)
    if (body == sc::nn::ActivationOps{sc::nn::ActivationOps::elu, 0.25}) traces = fn.trace_count();
  CHECK(traces == cd::max_traces());
}

TEST_CASE("composites run staged: bad input is still the caller's error", "[nn][composite][staged]") {
  const Threshold low;
  const Tensor x = sc::random::normal({64, 600}, 3);
  int line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::layer_norm(x, {600}, sc::ones({599})),
                    Catch::Contains("[layer_norm] gamma must have normalized_shape [600], got [599]") &&
                        Catch::Contains(at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::softmax(x, 2), Catch::Contains("[softmax]") && Catch::Contains(at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::gelu(x > 0), Catch::Contains("[gelu]") && Catch::Contains(at(line)));
}

TEST_CASE("CompositeStagingScope sets the staging settings and restores them, nested", "[nn][composite][staged]") {
  const bool on = sc::nn::composite_staging();
  const std::int64_t min = sc::nn::composite_staging_min_elements();
  {
    const sc::nn::CompositeStagingScope outer(false, 100);
    CHECK_FALSE(sc::nn::composite_staging());
    CHECK(sc::nn::composite_staging_min_elements() == 100);
    {
      const sc::nn::CompositeStagingScope inner(true);  // the threshold stays the outer scope's
      CHECK(sc::nn::composite_staging());
      CHECK(sc::nn::composite_staging_min_elements() == 100);
      sc::nn::composite_staging_min_elements() = 0;  // restored by outer's destructor
    }
    CHECK_FALSE(sc::nn::composite_staging());
    CHECK(sc::nn::composite_staging_min_elements() == 100);
    // off: a large composite runs op by op
    const std::uint64_t before = cd::staged_calls();
    (void)sc::nn::gelu(sc::random::normal({40000}, 9));
    CHECK(cd::staged_calls() == before);
  }
  CHECK(sc::nn::composite_staging() == on);
  CHECK(sc::nn::composite_staging_min_elements() == min);
}
