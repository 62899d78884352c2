// Staged against eager on the same inputs, alternately, for the ops whose staged plans differ most
// from their eager calls: scaled dot-product attention (q, k, v [8, 8, 128, 64]: the plan fuses the
// scale and the softmax's max into the first product's epilogue) and fused row reductions of
// [1024, 1024] (traced sum(2x + 1) and max(x / 2), compile-time staged sum(2x + 1)). Prints the
// medians and the median of the per-round ratios (staged / eager): on a shared machine the ratio
// of two runs side by side is steadier than either time.
//   cmake --preset release -DSTAGECRAFT_CUDA=OFF && cmake --build build/release --target time_staged_vs_eager
//   build/release/bench/time_staged_vs_eager [rounds]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <stagecraft/nn/attention.hpp>
#include <stagecraft/stagecraft.hpp>

namespace sc = stagecraft;

namespace {

/// Mean microseconds of `calls` calls of f.
template <class F>
double us_of(F&& f, int calls) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) f();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls;
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// `rounds` rounds of (eager, staged), `calls` calls each; one line of medians.
template <class E, class S>
void compare(const std::string& what, E&& eager, S&& staged, int rounds, int calls) {
  eager();
  staged();
  std::vector<double> e, s, r;
  for (int k = 0; k < rounds; ++k) {
    e.push_back(us_of(eager, calls));
    s.push_back(us_of(staged, calls));
    r.push_back(s.back() / e.back());
  }
  std::printf("%-40s eager %8.0f us   staged %8.0f us   staged / eager %.3f (median of %d rounds)\n", what.c_str(),
              median(e), median(s), median(r), rounds);
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 41;
  std::printf("%d threads\n", sc::num_threads());
  const sc::Tensor q = sc::random::normal({8, 8, 128, 64}, 1), k = sc::random::normal({8, 8, 128, 64}, 2),
                   v = sc::random::normal({8, 8, 128, 64}, 3), x = sc::random::normal({1024, 1024}, 4);
  auto attention = sc::function([](const sc::Tensor& a, const sc::Tensor& b, const sc::Tensor& c) {
    return sc::nn::scaled_dot_product_attention(a, b, c);
  });
  compare(
      "attention [8, 8, 128, 64] (traced)", [&] { return sc::nn::scaled_dot_product_attention(q, k, v).raw_data(); },
      [&] { return attention(q, k, v).raw_data(); }, rounds, 5);
  auto sum_traced = sc::function([](const sc::Tensor& a) { return sc::sum(a * 2.f + 1.f, {1}); });
  auto max_traced = sc::function([](const sc::Tensor& a) { return sc::max(a * 0.5f, {1}); });
  auto sum_compiled = sc::compile([](auto a) { return sc::sum(a * 2.f + 1.f, {1}); });
  const auto sum_eager = [&] { return sc::sum(x * 2.f + 1.f, {1}).raw_data(); };
  compare("sum(2x + 1, rows) [1024, 1024] (traced)", sum_eager, [&] { return sum_traced(x).raw_data(); }, rounds, 20);
  compare("sum(2x + 1, rows) [1024, 1024] (compiled)", sum_eager, [&] { return sum_compiled(x).raw_data(); }, rounds,
          20);
  compare(
      "max(x / 2, rows) [1024, 1024] (traced)", [&] { return sc::max(x * 0.5f, {1}).raw_data(); },
      [&] { return max_traced(x).raw_data(); }, rounds, 20);
}
