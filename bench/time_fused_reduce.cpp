// A traced function's fused row reductions: sum(a * a + b, {-1}) and max(a * b, {-1}) over rows
// short and long, many and few (one row of 4M: the eager kernel's chunks), f32. Per call (us): the
// best and the median of 15 rounds, each round enough calls for 16M elements. Without Google
// Benchmark, so that two trees' headers can be compiled with the same command and run alternately
// (threads: OMP_NUM_THREADS):
//   g++ -std=c++20 -O2 -march=x86-64-v3 -fopenmp -DNDEBUG -I<tree>/include
//       -I/usr/include/x86_64-linux-gnu/openblas-openmp bench/time_fused_reduce.cpp -lopenblas -lz
//   (one command line)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include <stagecraft/stagecraft.hpp>

int main() {
  using Fn = std::function<sc::Tensor(const sc::Tensor&, const sc::Tensor&)>;
  const Fn sum = [](const sc::Tensor& a, const sc::Tensor& b) { return sc::sum(a * a + b, {-1}); };
  const Fn max = [](const sc::Tensor& a, const sc::Tensor& b) { return sc::max(a * b, {-1}); };
  const std::vector<sc::Shape> shapes = {{4096, 1024}, {64, 65536}, {1, 1 << 22}, {65536, 64}, {256, 1000}};
  for (const sc::Shape& s : shapes) {
    const sc::Tensor x = sc::random::normal(s, 1), y = sc::random::normal(s, 2);
    for (const bool is_max : {false, true}) {
      auto staged = sc::function(is_max ? max : sum);
      (void)staged(x, y);
      const std::int64_t calls = std::max<std::int64_t>(1, (std::int64_t{1} << 24) / s.numel());
      std::vector<double> us;
      for (int r = 0; r < 15; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        for (std::int64_t i = 0; i < calls; ++i) (void)staged(x, y);
        const std::chrono::duration<double, std::micro> d = std::chrono::steady_clock::now() - t0;
        us.push_back(d.count() / static_cast<double>(calls));
      }
      std::sort(us.begin(), us.end());
      std::printf("%s [%lld, %lld]: best %.1f us, median %.1f us\n", is_max ? "max" : "sum", static_cast<long long>(s[0]),
                  static_cast<long long>(s[1]), us.front(), us[us.size() / 2]);
    }
  }
}
