// nn::LSTMCell's eager step run as a staged function of its own (lstm_cell_staging, on by default)
// on the CPU: the same values and gradients as its ops run one by one, one tape entry per step,
// second derivatives, and the cases that stay op by op.
#include <catch2/catch.hpp>
#include <stagecraft/nn/layers.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "nn/lstm_testing.hpp"

namespace {

using sctest::lstm::StagingScope;

void check_close(const sc::Tensor& a, const sc::Tensor& b, double tol) {
  REQUIRE(a.shape() == b.shape());
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("element " << i << ": " << x[i] << " vs " << y[i]);
    CHECK(std::abs(x[i] - y[i]) <= tol * (1 + std::abs(y[i])));
  }
}

/// The run of lstm_testing.hpp with `staging`.
std::vector<sc::Tensor> lstm_run(const sc::nn::LSTMCell& cell, const std::vector<sc::Tensor>& xs, bool staging,
                                 std::size_t* entries) {
  const StagingScope mode(staging);
  return sctest::lstm::run(cell, xs, entries);
}

}  // namespace

TEST_CASE("LSTMCell staged on the CPU: values and gradients equal its ops run one by one", "[layers][lstm][staged]") {
  for (const sc::DType dt : {sc::f32, sc::f64}) {
    for (const std::int64_t batch : {1, 4}) {
      INFO(sc::name(dt) << ", batch " << batch);
      const double tol = dt == sc::f32 ? 1e-5 : 1e-12;
      sc::nn::LSTMCell cell(5, 6, 21, dt);
      std::vector<sc::Tensor> xs;
      for (int t = 0; t < 7; ++t) xs.push_back(sc::random::normal({batch, 5}, 300 + t).astype(dt));
      std::size_t staged_entries = 0, op_entries = 0;
      const auto staged = lstm_run(cell, xs, true, &staged_entries), by_ops = lstm_run(cell, xs, false, &op_entries);
      REQUIRE(staged.size() == by_ops.size());
      for (std::size_t k = 0; k < staged.size(); ++k) {
        INFO("result " << k);
        CHECK(staged[k].dtype() == dt);
        check_close(staged[k], by_ops[k], tol);
      }
      CHECK(staged_entries == xs.size());  // one entry per step: h and c's gradients run together
      CHECK(op_entries > 10 * xs.size());
    }
  }
}

TEST_CASE("LSTMCell staged on the CPU: second derivatives equal those of its ops", "[layers][lstm][staged][grad]") {
  sc::nn::LSTMCell cell(3, 4, 2, sc::f64);
  const sc::Tensor x = sc::random::normal({2, 3}, 11).astype(sc::f64);
  const auto staged = sctest::lstm::second_derivatives(cell, x, true), by_ops = sctest::lstm::second_derivatives(cell, x, false);
  check_close(staged[0], by_ops[0], 1e-12);
  check_close(staged[1], by_ops[1], 1e-10);
}

TEST_CASE("LSTMCell staged on the CPU: another dtype, a scope elsewhere or an outer trace run op by op",
          "[layers][lstm][staged]") {
  const StagingScope on(true);
  sc::nn::LSTMCell cell(3, 4, 1);
  const sc::Tensor x = sc::random::normal({2, 3}, 5);
  const auto st = cell.initial_state(2);
  // An f64 input promotes as the ops do, staging or not.
  const auto promoted = [&](bool staging) {
    const StagingScope mode(staging);
    return cell(x.astype(sc::f64), st).first;
  };
  const sc::Tensor p = promoted(true);
  CHECK(p.dtype() == sc::f64);
  check_close(p, promoted(false), 1e-12);
  // Traced: the step's ops join the outer graph, no inner function.
  auto f = sc::function([&](const sc::Tensor& a) { return cell(a, cell.initial_state(2)).first; });
  check_close(f(x), cell(x, st).first, 1e-6);
  CHECK(f.get_concrete(x).graph().str().find("LSTMCell") == std::string::npos);
  // A tape sees the staged step as one call.
  sc::GradientTape tape;
  tape.watch(x);
  (void)cell(x, st);
  CHECK(tape.size() == 1);
}
