// nn::GRUCell against a plain-loop reference (f32, f64), its gradients (inputs by
// check_gradients, variables by finite differences through assign), its eager staged step (the
// same values and gradients as its ops one by one, one tape entry per step, second derivatives),
// traced and eager runs agreeing, checkpoints, and every error path.
#include <catch2/catch.hpp>
#include <stagecraft/nn/layers.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "testing.hpp"

namespace {

using sctest::check_close;
using sctest::error_of;
using sctest::randn;

std::string at_line(int line) { return "test_gru.cpp:" + std::to_string(line); }

sc::Tensor make(const std::vector<double>& v, sc::Shape s, sc::DType d) { return sc::tensor(v, s).astype(d); }

/// Sets sc::nn::gru_cell_staging() for the scope.
struct StagingScope {
  bool was = sc::nn::gru_cell_staging();
  explicit StagingScope(bool on) { sc::nn::gru_cell_staging() = on; }
  ~StagingScope() { sc::nn::gru_cell_staging() = was; }
  StagingScope(const StagingScope&) = delete;
  StagingScope& operator=(const StagingScope&) = delete;
};

/// Gives the cell's biases random values (they start at zero, which would hide a swapped bias).
void randomize_biases(sc::nn::GRUCell& cell, unsigned seed) {
  cell.bias.assign(make(randn(cell.bias.numel(), seed, 0.5), cell.bias.shape(), cell.bias.dtype()));
  cell.recurrent_bias.assign(
      make(randn(cell.recurrent_bias.numel(), seed + 1, 0.5), cell.recurrent_bias.shape(), cell.bias.dtype()));
}

double sigm(double v) { return 1 / (1 + std::exp(-v)); }

/// One GRU step by loops, written from the equations: gate blocks z, r, n of `hid` columns; the
/// reset gate scales the recurrent product (with its bias) of n.
std::vector<double> gru_reference(const std::vector<double>& x, const std::vector<double>& h,
                                  const std::vector<double>& K, const std::vector<double>& U,
                                  const std::vector<double>& b, const std::vector<double>& rb, std::int64_t N,
                                  std::int64_t in, std::int64_t hid) {
  std::vector<double> out(static_cast<std::size_t>(N * hid));
  const std::int64_t cols = 3 * hid;
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t j = 0; j < hid; ++j) {
      double xs[3], hs[3];
      for (int g = 0; g < 3; ++g) {
        const std::int64_t col = g * hid + j;
        xs[g] = b[col];
        for (std::int64_t i = 0; i < in; ++i) xs[g] += x[n * in + i] * K[i * cols + col];
        hs[g] = rb[col];
        for (std::int64_t k = 0; k < hid; ++k) hs[g] += h[n * hid + k] * U[k * cols + col];
      }
      const double z = sigm(xs[0] + hs[0]), r = sigm(xs[1] + hs[1]), cand = std::tanh(xs[2] + r * hs[2]);
      out[n * hid + j] = z * h[n * hid + j] + (1 - z) * cand;
    }
  }
  return out;
}

std::vector<double> values_of(const sc::Variable& v) { return v.value().to_vector<double>(); }

/// `xs.size()` steps from the zero state under a tape: {loss, d kernel, d recurrent, d bias,
/// d recurrent bias, d x0}; `entries` gets the tape's entry count after the steps.
std::vector<sc::Tensor> run(const sc::nn::GRUCell& cell, const std::vector<sc::Tensor>& xs, bool staging,
                            std::size_t* entries) {
  const StagingScope mode(staging);
  sc::GradientTape tape;
  tape.watch(xs[0]);
  sc::Tensor h = cell.initial_state(xs[0].shape()[0]);
  for (const sc::Tensor& x : xs) h = cell(x, h);
  *entries = tape.size();
  const sc::Tensor loss = sc::sum(h * h * h);
  std::vector<sc::Tensor> r = tape.gradient(
      loss, std::vector<sc::Tensor>{cell.kernel, cell.recurrent_kernel, cell.bias, cell.recurrent_bias, xs[0]});
  r.insert(r.begin(), loss);
  return r;
}

void check_tensors_close(const sc::Tensor& a, const sc::Tensor& b, double tol) {
  REQUIRE(a.shape() == b.shape());
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("element " << i << ": " << x[i] << " vs " << y[i]);
    CHECK(std::abs(x[i] - y[i]) <= tol * (1 + std::abs(y[i])));
  }
}

}  // namespace

TEST_CASE("GRUCell: forward against a loop reference", "[layers][gru]") {
  for (const bool staging : {true, false}) {
    const StagingScope mode(staging);
    for (sc::DType dt : {sc::f32, sc::f64}) {
      INFO(sc::name(dt) << (staging ? " staged" : " op by op"));
      const double tol = dt == sc::f32 ? 1e-5 : 1e-12;
      const std::int64_t N = 3, in = 4, hid = 5;
      sc::nn::GRUCell cell(in, hid, 13, dt);
      CHECK(cell.kernel.shape() == sc::Shape{in, 3 * hid});
      CHECK(cell.recurrent_kernel.shape() == sc::Shape{hid, 3 * hid});
      CHECK(cell.bias.value().to_vector<double>() == std::vector<double>(3 * hid, 0.0));
      CHECK(cell.recurrent_bias.shape() == sc::Shape{3 * hid});
      CHECK(values_of(cell.kernel) != values_of(cell.recurrent_kernel));
      const sc::Tensor h0 = cell.initial_state(N);
      CHECK(h0.shape() == sc::Shape{N, hid});
      CHECK(h0.dtype() == dt);
      CHECK(h0.to_vector<double>() == std::vector<double>(N * hid, 0.0));

      randomize_biases(cell, 6);
      const auto xv = randn(N * in, 1), hv = randn(N * hid, 2, 0.5);
      const sc::Tensor h1 = cell(make(xv, {N, in}, dt), make(hv, {N, hid}, dt));
      CHECK(h1.shape() == sc::Shape{N, hid});
      CHECK(h1.dtype() == dt);
      const auto K = values_of(cell.kernel), U = values_of(cell.recurrent_kernel), b = values_of(cell.bias),
                 rb = values_of(cell.recurrent_bias);
      check_close(h1.to_vector<double>(), gru_reference(xv, hv, K, U, b, rb, N, in, hid), tol);

      // Two steps from the zero state: the second reads the first's h.
      sc::Tensor h = cell(make(xv, {N, in}, dt), cell.initial_state(N));
      h = cell(make(xv, {N, in}, dt), h);
      const auto ha = gru_reference(xv, std::vector<double>(N * hid, 0.0), K, U, b, rb, N, in, hid);
      check_close(h.to_vector<double>(), gru_reference(xv, ha, K, U, b, rb, N, in, hid), tol);
    }
  }
  sc::nn::GRUCell cell(2, 3, 1);
  CHECK(cell(sc::ones({0, 2}), cell.initial_state(0)).shape() == sc::Shape{0, 3});  // an empty batch
  CHECK(cell.input_size() == 2);
  CHECK(cell.hidden_size() == 3);
}

TEST_CASE("GRUCell: gradients of inputs and variables", "[layers][gru][grad]") {
  const std::int64_t N = 2, in = 3, hid = 2;
  for (const bool staging : {true, false}) {
    INFO((staging ? "staged" : "op by op"));
    const StagingScope mode(staging);
    sc::nn::GRUCell cell(in, hid, 4, sc::f64);
    randomize_biases(cell, 9);
    const sc::Tensor x = make(randn(N * in, 1), {N, in}, sc::f64);
    const sc::Tensor h = make(randn(N * hid, 2, 0.5), {N, hid}, sc::f64);
    const auto r = sc::check_gradients([&](const std::vector<sc::Tensor>& xs) { return cell(xs[0], xs[1]); }, {x, h});
    INFO(r.report);
    CHECK(r.ok);
    // Variables by central differences through assign, over two steps (the recurrent kernel is
    // reached through the first step's h too).
    const sc::Tensor w = make(randn(N * hid, 5), {N, hid}, sc::f64);
    REQUIRE(cell.trainable_variables().size() == 4);
    sctest::check_variable_gradients([&] { return sc::sum(cell(x, cell(x, h)) * w); }, cell.trainable_variables(), 1e-7,
                                     1e-6);
  }
}

TEST_CASE("GRUCell staged on the CPU: values and gradients equal its ops run one by one", "[layers][gru][staged]") {
  for (const sc::DType dt : {sc::f32, sc::f64}) {
    for (const std::int64_t batch : {1, 4}) {
      INFO(sc::name(dt) << ", batch " << batch);
      const double tol = dt == sc::f32 ? 1e-5 : 1e-12;
      sc::nn::GRUCell cell(5, 6, 21, dt);
      randomize_biases(cell, 3);
      std::vector<sc::Tensor> xs;
      for (int t = 0; t < 7; ++t) xs.push_back(sc::random::normal({batch, 5}, 300 + t).astype(dt));
      std::size_t staged_entries = 0, op_entries = 0;
      const auto staged = run(cell, xs, true, &staged_entries), by_ops = run(cell, xs, false, &op_entries);
      REQUIRE(staged.size() == by_ops.size());
      for (std::size_t k = 0; k < staged.size(); ++k) {
        INFO("result " << k);
        CHECK(staged[k].dtype() == dt);
        check_tensors_close(staged[k], by_ops[k], tol);
      }
      CHECK(staged_entries == xs.size());  // one tape entry per step
      CHECK(op_entries > 10 * xs.size());
    }
  }
}

TEST_CASE("GRUCell staged on the CPU: second derivatives equal those of its ops", "[layers][gru][staged][grad]") {
  sc::nn::GRUCell cell(3, 4, 2, sc::f64);
  randomize_biases(cell, 4);
  const sc::Tensor x = sc::random::normal({2, 3}, 11).astype(sc::f64);
  const auto second = [&](bool staging) {
    const StagingScope mode(staging);
    return sctest::gradient_and_its_gradient(
        [&](const sc::Tensor& v) {
          const sc::Tensor h = cell(v, cell(v, cell.initial_state(2)));
          return sc::sum(h * h);
        },
        x);
  };
  const auto staged = second(true), by_ops = second(false);
  check_tensors_close(staged[0], by_ops[0], 1e-12);
  check_tensors_close(staged[1], by_ops[1], 1e-10);
}

TEST_CASE("GRUCell: traced steps equal eager ones, other dtypes and outer traces run op by op",
          "[layers][gru][staged]") {
  const StagingScope on(true);
  sc::nn::GRUCell cell(3, 4, 1);
  randomize_biases(cell, 8);
  const sc::Tensor x = sc::random::normal({2, 3}, 5);
  const sc::Tensor h0 = cell.initial_state(2);
  // An f64 input promotes as the ops do, staging or not.
  const auto promoted = [&](bool staging) {
    const StagingScope mode(staging);
    return cell(x.astype(sc::f64), h0);
  };
  const sc::Tensor p = promoted(true);
  CHECK(p.dtype() == sc::f64);
  check_tensors_close(p, promoted(false), 1e-12);
  // Traced: a loop of steps joins the outer graph (no inner function) and equals eager.
  auto f = sc::function([&](const sc::Tensor& a) {
    sc::Tensor h = cell.initial_state(2);
    for (int t = 0; t < 3; ++t) h = cell(a, h);
    return h;
  });
  const sc::Tensor eager = cell(x, cell(x, cell(x, h0)));
  check_tensors_close(f(x), eager, 1e-6);
  CHECK(f.get_concrete(x).graph().str().find("GRUCell") == std::string::npos);
  // A tape sees the staged step as one call.
  sc::GradientTape tape;
  tape.watch(x);
  (void)cell(x, h0);
  CHECK(tape.size() == 1);
}

TEST_CASE("GRUCell: trains, saves and loads its four variables", "[layers][gru]") {
  sc::nn::GRUCell cell(2, 3, 7);
  const auto names = cell.named_variables();
  REQUIRE(names.size() == 4);
  CHECK(names[0].first == "kernel");
  CHECK(names[1].first == "recurrent_kernel");
  CHECK(names[2].first == "bias");
  CHECK(names[3].first == "recurrent_bias");
  // A few SGD steps lower a loss that needs the recurrence (sum of the last h toward a target).
  const sc::Tensor x = sc::random::normal({4, 2}, 2);
  const sc::Tensor target = sc::full({4, 3}, 0.5f);
  sc::optim::SGD opt(0.5);
  const auto loss_of = [&] {
    const sc::Tensor h = cell(x, cell(x, cell.initial_state(4)));
    return sc::mean(sc::square(h - target));
  };
  const float first = loss_of().item<float>();
  for (int i = 0; i < 20; ++i) {
    sc::GradientTape tape;
    const sc::Tensor l = loss_of();
    opt.apply(tape.gradient(l, cell.trainable_variables()), cell.trainable_variables());
  }
  CHECK(loss_of().item<float>() < 0.5f * first);
  // A checkpoint round trip restores the values into a freshly seeded cell.
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("sc_test_gru_" + std::to_string(::getpid()) + ".safetensors");
  sc::Checkpoint save;
  save.track("gru", cell);
  save.save(path);
  sc::nn::GRUCell other(2, 3, 99);
  CHECK(values_of(other.kernel) != values_of(cell.kernel));
  sc::Checkpoint load;
  load.track("gru", other);
  load.restore(path);
  std::filesystem::remove(path);
  check_close(values_of(other.recurrent_bias), values_of(cell.recurrent_bias), 0);
  check_tensors_close(other(x, other.initial_state(4)), cell(x, cell.initial_state(4)), 0);
}

TEST_CASE("GRUCell: errors", "[layers][gru][errors]") {
  sc::nn::GRUCell cell(4, 3, 1);
  const sc::Tensor h = cell.initial_state(2);
  int line = __LINE__ + 1;
  std::string msg = error_of<sc::ShapeError>([&] { (void)cell(sc::ones({2, 5}), h); });
  CHECK_THAT(msg, Catch::Contains("[GRUCell]") && Catch::Contains("[N, 4]") && Catch::Contains("[2, 5]") &&
                      Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ShapeError>([&] { (void)cell(sc::ones({3, 4}), h); });
  CHECK_THAT(msg, Catch::Contains("[GRUCell]") && Catch::Contains("[3, 3]") && Catch::Contains("h [2, 3]") &&
                      Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { (void)cell(sc::ones({2, 4}), sc::Tensor()); });
  CHECK_THAT(msg, Catch::Contains("[GRUCell]") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { (void)cell.initial_state(-1); });
  CHECK_THAT(msg, Catch::Contains("GRUCell::initial_state") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { sc::nn::GRUCell bad(0, 3); });
  CHECK_THAT(msg, Catch::Contains("[GRUCell]") && Catch::Contains("input >= 1") && Catch::Contains(at_line(line)));
  msg = error_of<sc::ShapeError>([&] { sc::nn::GRUCell bad(2, std::int64_t{1} << 62); });
  CHECK_THAT(msg, Catch::Contains("overflow"));
}
