// Cost of exp's range-end check (session 28): median time of sc::exp on n f32 elements, one thread.
// Build against two trees and alternate them: see bench/RESULTS.md, "Hot-path changes".
#include <stagecraft/stagecraft.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
int main() {
  sc::set_num_threads(1);
  for (std::int64_t n : {4096, 1 << 20}) {
    const sc::Tensor x = sc::random::uniform({n}, -10.0, 10.0, 1);
    const int reps = n == 4096 ? 2000 : 20;
    std::vector<double> t;
    for (int b = 0; b < 31; ++b) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) { sc::Tensor y = sc::exp(x); (void)y; }
      t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps);
    }
    std::sort(t.begin(), t.end());
    std::printf("n=%lld median %.3f us\n", static_cast<long long>(n), t[15]);
  }
}
