// Learning-rate schedules against their formulas written out in doubles (Keras's definitions),
// an optimizer following one eagerly and traced (one trace for every step), resuming from a
// restored step counter, and the errors of bad parameters.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>
#include <stagecraft/optim/schedules.hpp>
#include <stagecraft/optim/sgd.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "testing.hpp"

namespace {

using sctest::error_of;
namespace opt = sc::optim;

double exponential_ref(std::int64_t step, double initial, double steps, double rate, bool staircase) {
  double p = static_cast<double>(step) / steps;
  if (staircase) p = std::floor(p);
  return initial * std::pow(rate, p);
}

double cosine_ref(double step, double initial, double steps, double alpha) {
  const double frac = std::min(step, steps) / steps;
  return initial * ((1 - alpha) * 0.5 * (1 + std::cos(std::numbers::pi * frac)) + alpha);
}

}  // namespace

TEST_CASE("schedules: ExponentialDecay, CosineDecay and PiecewiseConstantDecay follow their formulas", "[optim][schedule]") {
  const opt::ExponentialDecay smooth(0.1, 10, 0.5), stairs(0.1, 10, 0.5, true);
  const opt::CosineDecay cosine(0.2, 50, 0.1);
  const opt::CosineDecay warm(0.0, 40, 0.0, 1.0, 10);  // 0 -> 1 over 10 steps, then 1 -> 0 over 40
  const opt::PiecewiseConstantDecay pieces({5, 20}, {1.0, 0.5, 0.1});
  for (std::int64_t step : {0, 1, 4, 5, 6, 9, 10, 11, 19, 20, 21, 25, 49, 50, 51, 60, 1000}) {
    INFO("step " << step);
    const double s = static_cast<double>(step);
    CHECK(smooth.at(step) == Approx(exponential_ref(step, 0.1, 10, 0.5, false)).epsilon(1e-14));
    CHECK(stairs.at(step) == Approx(exponential_ref(step, 0.1, 10, 0.5, true)).epsilon(1e-14));
    CHECK(cosine.at(step) == Approx(cosine_ref(s, 0.2, 50, 0.1)).epsilon(1e-14));
    const double warm_want = step < 10 ? s / 10.0 : cosine_ref(s - 10, 1.0, 40, 0.0);
    CHECK(warm.at(step) == Approx(warm_want).epsilon(1e-14).margin(1e-15));
    CHECK(pieces.at(step) == (step <= 5 ? 1.0 : step <= 20 ? 0.5 : 0.1));
  }
  CHECK(cosine.at(50) == Approx(0.2 * 0.1));  // the floor alpha * initial
  CHECK(stairs.at(9) == 0.1);                  // no drop before the 10th step
  CHECK(stairs.at(10) == Approx(0.05));
}

TEST_CASE("schedules: an optimizer's steps use the schedule's rate at step 0, 1, ..., eager and traced",
          "[optim][schedule][staged]") {
  // SGD on w with gradient 1: each step subtracts exactly that step's rate.
  const opt::PiecewiseConstantDecay pieces({1, 3}, {0.5, 0.25, 0.125});
  for (const bool traced : {false, true}) {
    INFO((traced ? "traced" : "eager"));
    sc::Variable w(sc::scalar(10.0), "w");
    opt::SGD sgd(99.0);  // replaced by the schedule
    sgd.set_schedule(pieces);
    REQUIRE(sgd.schedule() != nullptr);
    auto step = [&](sc::Tensor g) { sgd.apply({g}, {w}); };
    auto f = sc::function(step);
    std::vector<double> rates;
    double expect = 10.0;
    for (std::int64_t t = 0; t < 5; ++t) {
      traced ? f(sc::scalar(1.0)) : step(sc::scalar(1.0));
      rates.push_back(sgd.learning_rate());
      expect -= pieces.at(t);
      CHECK(w.value().item<double>() == expect);
    }
    CHECK(rates == std::vector<double>{0.5, 0.5, 0.25, 0.25, 0.125});
    if (traced) CHECK(f.trace_count() == 1);
    // A fixed rate ends the schedule.
    sgd.set_learning_rate(0.01);
    CHECK(sgd.schedule() == nullptr);
    step(sc::scalar(1.0));
    CHECK(w.value().item<double>() == Approx(expect - 0.01));
  }
}

TEST_CASE("schedules: Adam follows a cosine schedule, and a restored step counter resumes it", "[optim][schedule]") {
  auto schedule = std::make_shared<const opt::CosineDecay>(0.1, 8);
  sc::Variable w(sc::tensor({1.0, -1.0}), "w");
  opt::Adam adam(1.0);
  adam.set_schedule(schedule);
  for (int t = 0; t < 3; ++t) adam.apply({sc::tensor({0.5, 0.25})}, {w});
  CHECK(adam.learning_rate() == Approx(schedule->at(2)).epsilon(1e-15));
  // Another optimizer with the counter of the first (as a checkpoint restores it).
  opt::Adam resumed(1.0);
  resumed.set_schedule(schedule);
  resumed.build({w});
  sc::Variable counter = resumed.iterations_variable();  // a handle to the same variable
  counter.assign(sc::scalar(std::int64_t{6}));
  resumed.apply({sc::tensor({0.5, 0.25})}, {w});
  CHECK(resumed.learning_rate() == Approx(schedule->at(6)).epsilon(1e-15));
  CHECK(resumed.iterations() == 7);
}

TEST_CASE("schedules: bad parameters are reported at the user's line", "[optim][schedule][errors]") {
  const auto at_line = [](int line) { return "test_schedules.cpp:" + std::to_string(line); };
  int line = __LINE__ + 1;
  std::string m = error_of<sc::ValueError>([&] { opt::ExponentialDecay bad(0.1, 0, 0.5); });
  CHECK_THAT(m, Catch::Contains("[ExponentialDecay] decay_steps must be > 0, got 0") && Catch::Contains(at_line(line)));
  m = error_of<sc::ValueError>([&] { opt::ExponentialDecay bad(0.1, 10, 0.0); });
  CHECK_THAT(m, Catch::Contains("[ExponentialDecay] decay_rate must be finite and > 0, got 0"));
  m = error_of<sc::ValueError>([&] { opt::ExponentialDecay bad(-1.0, 10, 0.5); });
  CHECK_THAT(m, Catch::Contains("initial must be finite and >= 0, got -1"));
  m = error_of<sc::ValueError>([&] { opt::CosineDecay bad(0.1, 10, 1.5); });
  CHECK_THAT(m, Catch::Contains("[CosineDecay] alpha must be <= 1, got 1.5"));
  m = error_of<sc::ValueError>([&] { opt::CosineDecay bad(0.1, 10, 0.0, {}, 5); });
  CHECK_THAT(m, Catch::Contains("warmup_steps must be >= 0 and come with a warmup_target"));
  m = error_of<sc::ValueError>([&] { opt::CosineDecay bad(0.1, -3); });
  CHECK_THAT(m, Catch::Contains("[CosineDecay] decay_steps must be > 0, got -3"));
  line = __LINE__ + 1;
  m = error_of<sc::ValueError>([&] { opt::PiecewiseConstantDecay bad({10, 5}, {1.0, 0.5, 0.1}); });
  CHECK_THAT(m, Catch::Contains("[PiecewiseConstantDecay] boundaries must increase, got 10 then 5") &&
                    Catch::Contains(at_line(line)));
  m = error_of<sc::ValueError>([&] { opt::PiecewiseConstantDecay bad({10}, {1.0}); });
  CHECK_THAT(m, Catch::Contains("needs one more value than boundaries, got 1 values for 1 boundaries"));
  m = error_of<sc::ValueError>([&] { opt::PiecewiseConstantDecay bad({10}, {1.0, std::nan("")}); });
  CHECK_THAT(m, Catch::Contains("each value must be finite and >= 0"));
}
