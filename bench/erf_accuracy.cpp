// sc::erf on f32 against erfl (long double) for every float from 0 to 4.5 (about 1.08e9 inputs),
// the negative ones by oddness (checked exactly), and a sample of the rest of the range (where
// erf is +-1). Prints the largest error in eps relative (what test/conformance allows: 4) and in
// ulps of the result, with where each occurs. Not a test: it takes about a minute on 2 cores.
//   build/release/bench/erf_accuracy
#include <stagecraft/stagecraft.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

namespace {
struct Worst {
  double err = 0;
  float at = 0;
};
}  // namespace

int main() {
  constexpr std::int64_t chunk = std::int64_t{1} << 22;
  const std::uint32_t last = std::bit_cast<std::uint32_t>(4.5f);
  Worst eps_worst, ulp_worst;
  std::int64_t checked = 0, odd_failures = 0, over_one = 0;
  std::vector<float> xs;
  for (std::uint64_t b0 = 0; b0 <= last; b0 += chunk) {
    xs.clear();
    for (std::uint64_t b = b0; b < b0 + chunk && b <= last; ++b) xs.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(b)));
    const sc::Tensor x = sc::tensor(xs);
    const std::vector<float> y = sc::erf(x).to_vector<float>(), yn = sc::erf(-x).to_vector<float>();
    const auto n = static_cast<std::int64_t>(xs.size());
    double e_max = 0, u_max = 0;
    float e_at = 0, u_at = 0;
#pragma omp parallel
    {
      double le = 0, lu = 0;
      float lea = 0, lua = 0;
#pragma omp for nowait
      for (std::int64_t i = 0; i < n; ++i) {
        const long double want = erfl(static_cast<long double>(xs[static_cast<std::size_t>(i)]));
        const long double got = y[static_cast<std::size_t>(i)], diff = std::fabs(got - want);
        const double e = static_cast<double>(diff / (std::fabs(want) * std::numeric_limits<float>::epsilon() +
                                                     std::numeric_limits<float>::denorm_min()));
        const float r = static_cast<float>(want);
        const float ulp = std::nextafter(r, std::numeric_limits<float>::infinity()) - r;
        const double u = static_cast<double>(diff / ulp);
        if (e > le) le = e, lea = xs[static_cast<std::size_t>(i)];
        if (u > lu) lu = u, lua = xs[static_cast<std::size_t>(i)];
      }
#pragma omp critical
      {
        if (le > e_max) e_max = le, e_at = lea;
        if (lu > u_max) u_max = lu, u_at = lua;
      }
    }
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      if (std::bit_cast<std::uint32_t>(yn[k]) != (std::bit_cast<std::uint32_t>(y[k]) ^ 0x80000000u)) ++odd_failures;
      if (std::fabs(y[k]) > 1.f) ++over_one;
    }
    if (e_max > eps_worst.err) eps_worst = {e_max, e_at};
    if (u_max > ulp_worst.err) ulp_worst = {u_max, u_at};
    checked += n;
  }
  // beyond 4.5 (every 4099th float, to infinity): exactly 1
  std::int64_t not_one = 0;
  xs.clear();
  for (std::uint64_t b = last; b <= std::bit_cast<std::uint32_t>(std::numeric_limits<float>::infinity()); b += 4099)
    xs.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(b)));
  xs.push_back(std::numeric_limits<float>::infinity());
  for (const float v : sc::erf(sc::tensor(xs)).to_vector<float>()) not_one += v != 1.f;
  std::printf("inputs 0..4.5: %lld floats; max error %.3f eps relative (at %.9g), %.3f ulps (at %.9g)\n",
              static_cast<long long>(checked), eps_worst.err, static_cast<double>(eps_worst.at), ulp_worst.err,
              static_cast<double>(ulp_worst.at));
  std::printf("erf(-x) != -erf(x): %lld; |erf| > 1: %lld; beyond 4.5 not 1: %lld of %zu\n",
              static_cast<long long>(odd_failures), static_cast<long long>(over_one), static_cast<long long>(not_one),
              xs.size());
  return odd_failures + over_one + not_one == 0 ? 0 : 1;
}
