// sc::ThreadTuner (backend/cpu/thread_tuner.hpp): the counts it tries and the one it keeps, from
// step times given by hand (record), and from real steps whose time depends on the thread count
// they ran on (run).
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <stagecraft/backend/cpu/thread_tuner.hpp>  // not the umbrella: quick to build under the sanitizers
#include <stagecraft/fwd.hpp>

namespace {

/// Feeds the tuner the time `at(threads)` for every step until it settles; returns the counts
/// tried, in order. At most `limit` steps (a tuner that never settles fails the test).
std::vector<int> settle_with(sc::ThreadTuner& t, const std::function<double(int)>& at, int limit = 1000) {
  for (int i = 0; i < limit && !t.settled(); ++i) t.record(at(t.threads()));
  REQUIRE(t.settled());
  std::vector<int> tried;
  for (const auto& trial : t.trials()) tried.push_back(trial.threads);
  return tried;
}

sc::ThreadTuner tuner(int max, int warmup = 2, int trial = 5, double tol = 0.02, double retune = 0,
                      double seconds = 0) {
  sc::ThreadTunerOptions o;
  o.trial_seconds = seconds;
  o.max_threads = max;
  o.warmup_steps = warmup;
  o.trial_steps = trial;
  o.tolerance = tol;
  o.retune_seconds = retune;
  return sc::ThreadTuner(o);
}

}  // namespace

TEST_CASE("thread tuner: fewer threads win when more are slower, midpoints beside the best tried") {
  // 16 threads slower than 8 (held-back vCPUs), 4 slower again: 12 and 6 are tried, 16 again, 8 kept.
  const std::map<int, double> ms = {{16, 10.0}, {8, 8.0}, {4, 9.0}, {12, 8.5}, {6, 8.4}};
  sc::ThreadTuner t = tuner(16);
  CHECK(t.threads() == 16);
  CHECK_FALSE(t.settled());
  const auto tried = settle_with(t, [&](int n) { return ms.at(n) * 1e-3; });
  CHECK(tried == std::vector<int>{16, 8, 4, 12, 6, 16});
  CHECK(t.chosen() == 8);
  CHECK(t.threads() == 8);
  // 2 warm-up steps, 6 trials of 5 timed steps, 5 untimed steps after each change of count.
  CHECK(t.steps() == 2 + 6 * 5 + 5);
  CHECK(t.trials()[1].mean_s == Approx(8e-3));
  CHECK_FALSE(t.trials()[0].stands);  // 16 timed again: the later trial stands
  CHECK(t.trials()[5].stands);
  CHECK(t.summary() == "16 threads 10 ms, 8 threads 8 ms, 4 threads 9 ms, 12 threads 8.5 ms, 6 threads 8.4 ms, "
                       "16 threads 10 ms: 8 threads");
}

TEST_CASE("thread tuner: the largest count stays when every halving is slower") {
  sc::ThreadTuner t = tuner(16);
  const auto tried = settle_with(t, [](int n) { return 1.0 / n; });
  CHECK(tried == std::vector<int>{16, 8, 12});
  CHECK(t.chosen() == 16);
}

TEST_CASE("thread tuner: work that threads do not speed up goes down to one thread") {
  sc::ThreadTuner t = tuner(8);
  const auto tried = settle_with(t, [](int) { return 0.002; });
  CHECK(tried == std::vector<int>{8, 4, 2, 1, 8});
  CHECK(t.chosen() == 1);
}

TEST_CASE("thread tuner: the smallest count within the tolerance of the fastest is kept") {
  const std::map<int, double> ms = {{16, 1.0}, {8, 1.015}, {4, 1.5}, {12, 1.01}, {6, 1.2}};
  sc::ThreadTuner t = tuner(16);
  CHECK(settle_with(t, [&](int n) { return ms.at(n); }) == std::vector<int>{16, 8, 4, 12, 6, 16});
  CHECK(t.chosen() == 8);  // 1.5% slower than 16: within 2%
  sc::ThreadTuner strict = tuner(16, 2, 5, 0.0);
  const auto tried = settle_with(strict, [&](int n) { return ms.at(n); });
  CHECK(tried == std::vector<int>{16, 8, 12});  // 8 is slower: halving stops there
  CHECK(strict.chosen() == 16);
}

TEST_CASE("thread tuner: a count's time is the mean of its steps, slow steps included") {
  // A busy process on one of the CPUs: at 2 threads one step in five waits for it (30 times
  // slower), the others run at full speed; their median would say 2 threads are faster.
  sc::ThreadTuner t = tuner(2, 0, 5);
  int step = 0;
  const auto tried = settle_with(t, [&](int n) { return n == 2 ? (++step % 5 == 0 ? 30.0 : 1.0) : 1.5; });
  CHECK(tried == std::vector<int>{2, 1, 2});
  CHECK(t.trials()[0].mean_s == Approx((4 + 30) / 5.0));
  CHECK(t.chosen() == 1);
}

TEST_CASE("thread tuner: a trial lasts trial_seconds at least") {
  sc::ThreadTuner t = tuner(2, 0, 5, 0.02, 0, 0.05);
  // Steps of 4 ms: 13 of them reach 50 ms; 1 thread then takes 3 ms steps (17 + 1 untimed).
  settle_with(t, [](int n) { return n == 2 ? 0.004 : 0.003; });
  CHECK(t.trials().size() == 3);  // 2, 1, and 2 again (1 leads)
  CHECK(t.steps() == 13 + 1 + 17 + 1 + 13);
  CHECK(t.chosen() == 1);
  // Steps that take no time end a trial at 100 x trial_steps.
  sc::ThreadTuner z = tuner(2, 0, 2, 0.02, 0, 1.0);
  for (int i = 0; i < 200; ++i) z.record(0.0);
  CHECK(z.trials().size() == 1);
}

TEST_CASE("thread tuner: a slow spell in the first trial does not decide, the largest count is timed again") {
  // The first trial at 4 threads meets a slow spell (pages touched the first time, another
  // process): 2 threads look faster, the second trial at 4 shows its real time.
  sc::ThreadTuner t = tuner(4, 2, 5);
  const auto tried = settle_with(t, [&](int n) {
    if (n == 4 && t.trials().empty()) return 5.0;
    return n == 4 ? 1.0 : n == 3 ? 1.4 : n == 2 ? 1.5 : 3.0;
  });
  CHECK(tried == std::vector<int>{4, 2, 1, 3, 4});
  CHECK(t.chosen() == 4);
  CHECK(t.summary() == "4 threads 5e+03 ms, 2 threads 1.5e+03 ms, 1 threads 3e+03 ms, 3 threads 1.4e+03 ms, "
                       "4 threads 1e+03 ms: 4 threads");
}

TEST_CASE("thread tuner: one thread has nothing to choose, retune_seconds tries the counts again") {
  sc::ThreadTuner one = tuner(1);
  CHECK(one.settled());
  CHECK(one.chosen() == 1);
  one.record(0.5);
  CHECK(one.settled());
  CHECK(one.trials().empty());

  sc::ThreadTuner t = tuner(4, 1, 3, 0.02, 10);
  settle_with(t, [](int n) { return n == 2 ? 1.0 : 2.0; });
  CHECK(t.chosen() == 2);
  for (int i = 0; i < 9; ++i) t.record(1.0);
  CHECK(t.settled());
  t.record(1.0);  // 10 seconds after settling: the counts are tried again, from the largest
  CHECK_FALSE(t.settled());
  CHECK(t.threads() == 4);
  CHECK(t.trials().empty());
  settle_with(t, [](int n) { return n == 4 ? 1.0 : 3.0; });  // the machine changed: 4 is fastest now
  CHECK(t.chosen() == 4);
}

TEST_CASE("thread tuner: bad options and step times are ValueErrors naming the tuner and the line") {
  sc::ThreadTunerOptions o;
  o.trial_steps = 0;
  REQUIRE_THROWS_AS(sc::ThreadTuner(o), sc::ValueError);
  CHECK_THROWS_WITH(sc::ThreadTuner(o), Catch::StartsWith("[ThreadTuner] trial_steps must be at least 1, got 0 at ") &&
                                             Catch::Contains("test_thread_tuner.cpp:"));
  o = {};
  o.tolerance = -0.1;
  CHECK_THROWS_WITH(sc::ThreadTuner(o), Catch::Contains("tolerance must be in [0, 1)"));
  o = {};
  o.max_threads = -3;
  CHECK_THROWS_AS(sc::ThreadTuner(o), sc::ValueError);
  o = {};
  o.warmup_steps = -1;
  CHECK_THROWS_AS(sc::ThreadTuner(o), sc::ValueError);
  o = {};
  o.retune_seconds = -1;
  CHECK_THROWS_AS(sc::ThreadTuner(o), sc::ValueError);
  o = {};
  o.trial_seconds = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(sc::ThreadTuner(o), Catch::Contains("trial_seconds must be in [0, 3600]"));
  sc::ThreadTuner t = tuner(4);
  CHECK_THROWS_WITH(t.record(-1.0), Catch::Contains("[ThreadTuner] a step's time must be finite and not negative"));
  CHECK_THROWS_AS(t.record(std::numeric_limits<double>::quiet_NaN()), sc::ValueError);
  CHECK_THROWS_AS(t.record(std::numeric_limits<double>::infinity()), sc::ValueError);
  CHECK(t.steps() == 0);  // nothing counted
}

#if SC_HAS_OPENMP
TEST_CASE("thread tuner: run() sets the count each step runs on and keeps the faster one") {
  const int before = sc::num_threads();
  for (const int faster : {1, 2}) {
    sc::ThreadTuner t = tuner(2, 0, 3);
    int steps = 0;
    while (!t.settled()) {
      // A step that is slow at the other count (as a held-back thread makes it), and returns a value.
      const int ran_on = t.run([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(sc::num_threads() == faster ? 1 : 30));
        return sc::num_threads();
      });
      // 3 timed steps at 2, one untimed and 3 timed at 1, then (when 1 leads) 1 + 3 at 2 again.
      CHECK(ran_on == (steps < 3 || steps >= 7 ? 2 : 1));
      ++steps;
      REQUIRE(steps < 50);
    }
    CHECK(steps == (faster == 1 ? 11 : 7));
    CHECK(t.chosen() == faster);
    t.run([] {});
    CHECK(sc::num_threads() == faster);
    // A step that throws is not counted, and the error reaches the caller.
    const auto counted = t.steps();
    CHECK_THROWS_AS(t.run([]() -> int { throw std::runtime_error("step failed"); }), std::runtime_error);
    CHECK(t.steps() == counted);
  }
  sc::set_num_threads(before);
}
#endif
