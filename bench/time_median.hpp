// The median wall time of a few calls, for the timing programs built without Google Benchmark
// (time_broadcast.cpp, time_row_loops.cpp): header-only, so that two trees' headers can be
// compiled with the same one-line command and run alternately.
#pragma once
#include <algorithm>
#include <chrono>
#include <vector>

namespace bench {

/// The median of `calls` calls of f (ms); f returns what it computed, dropped after the clock stops.
template <class F>
double median_ms(F f, int calls) {
  std::vector<double> ms;
  for (int i = 0; i < calls; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto y = f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace bench
