// sc::ThreadTuner: how many CPU threads a repeated piece of work (a training step) runs on, chosen
// by timing it. More threads can be slower: a parallel region waits for its slowest thread, and
// threads the machine lends but does not run (a virtual machine's vCPUs the host holds back, a busy
// process beside the training on the same CPUs, two hyperthreads sharing one core's vector units)
// make every region wait. OpenMP's count is fixed when the program starts; the tuner measures the
// work at a few counts and keeps the fastest, so asking for more threads is never much slower than
// asking for fewer (bench/results/threads.md, "Session 57").
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <source_location>
#include <string>
#include <type_traits>
#include <vector>

#include "../../core/error.hpp"
#include "parallel.hpp"

namespace stagecraft {

/// What a ThreadTuner tries; the defaults suit a training step of a millisecond or more.
struct ThreadTunerOptions {
  /// The largest count tried; 0: num_threads() when the tuner is made (OMP_NUM_THREADS, the CPU
  /// quota or set_num_threads).
  int max_threads = 0;
  /// Steps run at the largest count and not timed before the first trial (tracing, first-touch
  /// allocations, caches).
  int warmup_steps = 2;
  /// Timed steps per count, at least; the mean of a trial's steps is the count's time (what a run
  /// of steps costs: a busy neighbour slows some steps 40-fold and leaves others alone, so a
  /// median would miss it). The first step after a change of count is run and not timed (it pays
  /// for the change).
  int trial_steps = 5;
  /// Seconds of timed steps per count, at least (a trial shorter than the scheduler's periods
  /// could fall wholly between a neighbour's turns).
  double trial_seconds = 0.02;
  /// A smaller count is kept when its time is at most this fraction above the fastest: as fast,
  /// and it leaves CPUs to the rest of the machine.
  double tolerance = 0.02;
  /// Seconds of steps at the chosen count before the counts are tried again; 0: never. What the
  /// machine lends changes: a neighbour starts or stops, a virtual machine's host gets busy (on
  /// a 2-vCPU virtual machine, spells of seconds where 2 threads ran no faster than 1 came and
  /// went). A search costs a few trials of trial_seconds, some at slower counts.
  double retune_seconds = 2.0;
};

/// Chooses the thread count of a repeated piece of work by timing it. Each run(step) times one call
/// of step() at the count being tried. Counts go from the largest down by halves while each is
/// within the tolerance of the fastest so far, then the midpoints beside the best, then the largest
/// count once more when a smaller one leads; the tuner settles on the smallest count whose mean
/// step time is within the tolerance of the fastest (a count tried twice: its later trial) and
/// calls set_num_threads with it. A change of count costs (the example's MLP step alternating 1 and 2
/// threads every step ran as slowly at 2 as at 1), so counts are tried in runs of steps. Counts only
/// go through set_num_threads, which is per calling thread: call run() from the thread that runs the
/// steps. Not thread-safe (one tuner per stepping thread).
class ThreadTuner {
 public:
  /// One count tried: its threads, the mean of its timed steps in seconds, and whether it stands
  /// (a count timed again is judged by its later trial).
  struct Trial {
    int threads;
    double mean_s;
    bool stands = true;
  };

  explicit ThreadTuner(ThreadTunerOptions o = {}, const std::source_location& loc = std::source_location::current())
      : o_(o) {
    auto bad = [&](const char* what, auto got) { detail::fail<ValueError>("ThreadTuner", loc, what, ", got ", got); };
    if (o.max_threads < 0) bad("max_threads must be 0 (the current count) or more", o.max_threads);
    if (o.warmup_steps < 0) bad("warmup_steps must be 0 or more", o.warmup_steps);
    if (o.trial_steps < 1) bad("trial_steps must be at least 1", o.trial_steps);
    if (!(o.tolerance >= 0 && o.tolerance < 1)) bad("tolerance must be in [0, 1)", o.tolerance);
    if (!(o.trial_seconds >= 0 && o.trial_seconds <= 3600)) bad("trial_seconds must be in [0, 3600]", o.trial_seconds);
    if (!(o.retune_seconds >= 0 && std::isfinite(o.retune_seconds)))
      bad("retune_seconds must be 0 (never) or more", o.retune_seconds);
    max_ = o.max_threads > 0 ? o.max_threads : num_threads();
    current_ = max_;
    left_ = o.warmup_steps;
    if (max_ == 1) settle();  // nothing to choose
  }

  /// Runs step() at the count being tried (or the chosen one), times it and returns its result.
  template <class F>
  std::invoke_result_t<F&> run(F&& step) {
    if (applied_ != current_) {
      set_num_threads(current_);
      applied_ = current_;
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto secs = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    if constexpr (std::is_void_v<std::invoke_result_t<F&>>) {
      step();
      record(secs());
    } else {
      std::invoke_result_t<F&> r = step();
      record(secs());
      return r;
    }
  }

  /// Counts one step of `seconds` run at threads(); run() calls it. Callers that time their steps
  /// themselves run each at threads() (set_num_threads) and record its time.
  void record(double seconds, const std::source_location& loc = std::source_location::current()) {
    if (!(seconds >= 0) || !std::isfinite(seconds))
      detail::fail<ValueError>("ThreadTuner", loc, "a step's time must be finite and not negative, got ", seconds);
    ++steps_;
    if (settled_) {
      since_settled_ += seconds;
      if (o_.retune_seconds > 0 && since_settled_ >= o_.retune_seconds) restart();
      return;
    }
    if (left_ > 0) {  // warm-up, or the step after a change of count
      --left_;
      return;
    }
    sum_ += seconds;
    ++timed_;
    // Enough steps and enough time; a trial of steps too quick to time ends at 100 x trial_steps.
    if (timed_ < o_.trial_steps || (sum_ < o_.trial_seconds && timed_ < 100LL * o_.trial_steps)) return;
    for (Trial& t : trials_)
      if (t.threads == current_) t.stands = false;
    trials_.push_back({current_, sum_ / static_cast<double>(timed_)});
    sum_ = 0;
    timed_ = 0;
    const int next = next_count();
    if (next == 0) {
      settle();
    } else {
      current_ = next;
      left_ = 1;
    }
  }

  /// The count the next step runs on.
  int threads() const { return current_; }
  /// The largest count tried.
  int max_threads() const { return max_; }
  /// Whether the tuner has chosen (and is not trying counts again).
  bool settled() const { return settled_; }
  /// The chosen count; 0 until settled the first time.
  int chosen() const { return chosen_; }
  /// Steps counted so far (warm-up and trials included).
  std::int64_t steps() const { return steps_; }
  /// The counts tried since the last (re)start, in order.
  const std::vector<Trial>& trials() const { return trials_; }
  /// "16 threads 1.23 ms, 8 threads 1.01 ms, 12 threads 1.10 ms: 8 threads", or "trying 8 threads".
  std::string summary() const {
    std::string s;
    char buf[64];
    for (const Trial& t : trials_) {
      std::snprintf(buf, sizeof buf, "%s%d threads %.3g ms", s.empty() ? "" : ", ", t.threads, t.mean_s * 1e3);
      s += buf;
    }
    std::snprintf(buf, sizeof buf, "%s%s%d threads", s.empty() ? "" : ": ", settled_ ? "" : "trying ", current_);
    return s + buf;
  }

 private:
  const Trial* find(int threads) const {
    for (const Trial& t : trials_)
      if (t.threads == threads) return &t;
    return nullptr;
  }
  double fastest() const {
    double f = trials_.back().mean_s;
    for (const Trial& t : trials_)
      if (t.stands) f = std::min(f, t.mean_s);
    return f;
  }
  /// The smallest count whose standing time is within the tolerance of the fastest.
  int best() const {
    const double limit = fastest() * (1 + o_.tolerance);
    int b = max_;
    for (const Trial& t : trials_)
      if (t.stands && t.mean_s <= limit) b = std::min(b, t.threads);
    return b;
  }
  /// The next count to try after the last trial; 0 when done. Halving goes on while the last count
  /// is within the tolerance of the fastest so far; then, once, the midpoints between the best and
  /// the counts halving tried on either side of it, larger side first; then the largest again when
  /// a smaller count leads.
  int next_count() {
    const Trial& last = trials_.back();
    if (halving_) {
      if (last.threads > 1 && last.mean_s <= fastest() * (1 + o_.tolerance)) return last.threads / 2;
      halving_ = false;
      const int b = best();
      int above = 0, below = 0;  // the nearest tried counts on either side of b
      for (const Trial& t : trials_) {
        if (t.threads > b && (above == 0 || t.threads < above)) above = t.threads;
        if (t.threads < b && t.threads > below) below = t.threads;
      }
      for (const int side : {below, above})  // popped from the back: above first
        if (const int mid = (b + side) / 2; side > 0 && mid != b && mid != side) refine_.push_back(mid);
    }
    while (!refine_.empty()) {
      const int mid = refine_.back();
      refine_.pop_back();
      if (find(mid) == nullptr) return mid;
    }
    // Before settling below the largest count, the largest is timed once more and its later trial
    // stands: the first trial comes first and meets what slows a program's first steps (pages
    // touched the first time, a spell of the machine).
    if (!confirmed_ && best() != max_) {
      confirmed_ = true;
      return max_;
    }
    return 0;
  }
  void settle() {
    if (!trials_.empty()) current_ = best();
    chosen_ = current_;
    settled_ = true;
    since_settled_ = 0;
  }
  void restart() {
    settled_ = false;
    halving_ = true;
    confirmed_ = false;
    trials_.clear();
    sum_ = 0;
    timed_ = 0;
    refine_.clear();
    left_ = current_ != max_ ? 1 : 0;
    current_ = max_;
  }

  ThreadTunerOptions o_;
  int max_ = 1, current_ = 1, chosen_ = 0, applied_ = 0, left_ = 0;
  bool settled_ = false, halving_ = true, confirmed_ = false;
  std::int64_t steps_ = 0, timed_ = 0;
  double sum_ = 0, since_settled_ = 0;  // the current trial's timed seconds; seconds since settling
  std::vector<Trial> trials_;
  std::vector<int> refine_;  // midpoints still to try
};

}  // namespace stagecraft
