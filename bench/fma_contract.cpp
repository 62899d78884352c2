// The cost of sc::compile's bit equality with eager where the compiler would contract a * b + c
// into fused multiply-adds: a transcendental 9-op chain over 4M f32 on one thread, built three
// ways by bench/fma_contract.sh (the default: each op's result rounded as eager does; with
// -DSTAGECRAFT_FUSED_CONTRACT: contracted across ops; with -ffp-contract=off: no FMA at all, not
// even inside exp and tanh). Prints the median of 31 calls in ms.
#include <stagecraft/stagecraft.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace sc = stagecraft;

int main() {
#if SC_HAS_OPENMP
  omp_set_num_threads(1);
#endif
  const std::int64_t n = std::int64_t{1} << 22;
  const sc::Tensor x = sc::random::uniform({n}, -1.0, 1.0, 1), a = sc::random::uniform({n}, -1.0, 1.0, 2),
                   b = sc::random::uniform({n}, -1.0, 1.0, 3), c = sc::random::uniform({n}, -1.0, 1.0, 4);
  const auto g = sc::compile<sc::f32>([](auto x_, auto a_, auto b_, auto c_) {
    return sc::tanh(x_ * a_ + b_) * c_ - x_ / (1 + sc::exp(-x_)) + x_ * a_ * b_ + c_;
  });
  std::vector<double> t;
  for (int r = 0; r < 31; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const sc::Tensor y = g(x, a, b, c);
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  std::printf("%.3f\n", t[t.size() / 2]);
}
