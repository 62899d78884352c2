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

sc::ThreadTuner tuner(int max, int warmup = 2, int trial = 5, double tol = 0.02, std::int64_t retune = 0) {
  sc::ThreadTunerOptions o;
  o.max_threads = max;
  o.warmup_steps = warmup;
  o.trial_steps = trial;
  o.tolerance = tol;
  o.retune_every = retune;
  return sc::ThreadTuner(o);
}

}  // namespace

TEST_CASE("thread tuner: fewer threads win when more are slower, midpoints beside the best tried") {
  // 16 threads slower than 8 (held-back vCPUs), 4 slower again: 12 and 6 are tried, 8 kept.
  const std::map<int, double> ms = {{16, 10.0}, {8, 8.0}, {4, 9.0}, {12, 8.5}, {6, 8.4}};
  sc::ThreadTuner t = tuner(16);
  CHECK(t.threads() == 16);
  CHECK_FALSE(t.settled());
  const auto tried = settle_with(t, [&](int n) { return ms.at(n) * 1e-3; });
  CHECK(tried == std::vector<int>{16, 8, 4, 12, 6});
  CHECK(t.chosen() == 8);
  CHECK(t.threads() == 8);
  // 2 warm-up steps, 5 trials of 5 timed steps, 4 untimed steps after each change of count.
  CHECK(t.steps() == 2 + 5 * 5 + 4);
  CHECK(t.trials()[1].median_s == Approx(8e-3));
  CHECK(t.summary() ==
        "16 threads 10 ms, 8 threads 8 ms, 4 threads 9 ms, 12 threads 8.5 ms, 6 threads 8.4 ms: 8 threads");
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
  CHECK(tried == std::vector<int>{8, 4, 2, 1});
  CHECK(t.chosen() == 1);
}

TEST_CASE("thread tuner: the smallest count within the tolerance of the fastest is kept") {
  const std::map<int, double> ms = {{16, 1.0}, {8, 1.015}, {4, 1.5}, {12, 1.01}, {6, 1.2}};
  sc::ThreadTuner t = tuner(16);
  settle_with(t, [&](int n) { return ms.at(n); });
  CHECK(t.chosen() == 8);  // 1.5% slower than 16: within 2%
  sc::ThreadTuner strict = tuner(16, 2, 5, 0.0);
  const auto tried = settle_with(strict, [&](int n) { return ms.at(n); });
  CHECK(tried == std::vector<int>{16, 8, 12});  // 8 is slower: halving stops there
  CHECK(strict.chosen() == 16);
}

TEST_CASE("thread tuner: a count's time is the median of its steps, not spoiled by an outlier") {
  sc::ThreadTuner t = tuner(2, 0, 5);
  int step = 0;
  // Every fifth step of either count is 100 times slower (a page fault storm, a preempted step).
  const auto tried = settle_with(t, [&](int n) { return (++step % 5 == 0 ? 100.0 : 1.0) * (n == 2 ? 1.0 : 1.5); });
  CHECK(tried == std::vector<int>{2, 1});
  CHECK(t.chosen() == 2);
  CHECK(t.trials()[0].median_s == 1.0);
}

TEST_CASE("thread tuner: one thread has nothing to choose, retune_every tries the counts again") {
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
  t.record(1.0);  // the 10th step after settling: the counts are tried again, from the largest
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
  o.retune_every = -1;
  CHECK_THROWS_AS(sc::ThreadTuner(o), sc::ValueError);
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
        std::this_thread::sleep_for(std::chrono::milliseconds(sc::num_threads() == faster ? 1 : 8));
        return sc::num_threads();
      });
      CHECK(ran_on == (steps < 3 ? 2 : 1));  // 3 timed steps at 2, one untimed and 3 timed at 1
      ++steps;
      REQUIRE(steps < 50);
    }
    CHECK(steps == 7);
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
