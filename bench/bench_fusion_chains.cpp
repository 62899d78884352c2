// The kernel-fusion suite (issue #7): elementwise chains of K = 2, 4, 8, 16 ops over 1M and 16M
// floats, written once as a generic template and run as eager ops, traced (sc::function),
// compile-time staged (sc::compile, when staged/staged.hpp exists), xtensor's own expression, a
// hand-written loop (bench_fusion_chains_hand.cpp), and a STREAM-like copy as the bandwidth line.
// Every chain reads x and w and writes one output: 12 bytes per element (8 for the copy), reported
// as the GB/s counter (10^9 bytes/s). bench/fusion_chart.py turns the JSON into a chart and table.
//   fusion_chains/<n>/K<k>/{eager,traced,traced_unchained,compiled,xtensor,hand,hand_1t}, fusion_chains/<n>/copy
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <omp.h>
#include <xtensor/xadapt.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xnoalias.hpp>

#include <stagecraft/stagecraft.hpp>
#if __has_include(<stagecraft/staged/staged.hpp>)
#include <stagecraft/staged/staged.hpp>
#define BENCH_CHAINS_STAGED 1
#else
#define BENCH_CHAINS_STAGED 0
#endif

#include "bench_common.hpp"

namespace bench_fusion_chains {
void hand_chain2(const float* x, const float* w, float* out, std::int64_t n, int nt);
void hand_chain4(const float* x, const float* w, float* out, std::int64_t n, int nt);
void hand_chain8(const float* x, const float* w, float* out, std::int64_t n, int nt);
void hand_chain16(const float* x, const float* w, float* out, std::int64_t n, int nt);
void copy(const float* x, float* out, std::int64_t n, int nt);

// ---- the chain, once for every kind of operand (sc::Tensor, staged values, xtensor expressions)

using stagecraft::maximum;  // with ADL: sc::maximum for tensors and staged values, xt::maximum for xtensor

/// Step I (I >= 2) of a chain: the ops cycle through + 0.5, * 0.999, max(., -1), - 0.25.
template <int I, class Y>
auto step(Y&& y) {
  if constexpr (I % 4 == 2) return std::forward<Y>(y) + 0.5f;
  else if constexpr (I % 4 == 3) return std::forward<Y>(y) * 0.999f;
  else if constexpr (I % 4 == 0) return maximum(std::forward<Y>(y), -1.f);
  else return std::forward<Y>(y) - 0.25f;
}

/// Steps I..K applied to y. Each step's result has its own type (an expression type grows by one
/// node), so the chain recurses instead of reassigning one variable; rvalues are forwarded so that
/// expression templates that hold their operands by value (xtensor) own every temporary.
template <int I, int K, class Y>
auto steps(Y&& y) {
  if constexpr (I > K) return std::forward<Y>(y);
  else return steps<I + 1, K>(step<I>(std::forward<Y>(y)));
}

/// The K-op chain: x * w, then K - 1 steps.
template <int K, class X, class W>
auto chain(const X& x, const W& w) {
  return steps<2, K>(x * w);
}

}  // namespace bench_fusion_chains

namespace {

namespace bc = bench_fusion_chains;
using shape1 = std::array<std::size_t, 1>;

/// n floats in [-2, 2) from a fixed xorshift stream (bench_fusion.cpp's input()).
sc::Tensor input(std::int64_t n, std::uint64_t seed) {
  sc::Tensor t = sc::zeros({n});
  float* p = static_cast<float*>(t.raw_data());
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::int64_t i = 0; i < n; ++i) {
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    p[i] = -2.f + 4.f * static_cast<float>((s * 2685821657736338717ull) >> 40) * (1.f / 16777216.f);
  }
  return t;
}

// The buffers of one size, shared by every variant.
struct Buffers {
  std::int64_t n;
  sc::Tensor x, w, out;
  explicit Buffers(std::int64_t len) : n(len), x(input(len, 1)), w(input(len, 2)), out(sc::zeros({len})) {}
  static const float* p(const sc::Tensor& t) { return static_cast<const float*>(t.raw_data()); }
  float* po() const { return static_cast<float*>(out.raw_data()); }
};
Buffers& buffers(std::int64_t n) {
  static std::map<std::int64_t, Buffers> all;
  return all.try_emplace(n, n).first->second;
}

/// The hand-written loop of chain K.
void hand_chain(int k, const Buffers& b, float* out, int nt) {
  const float *x = Buffers::p(b.x), *w = Buffers::p(b.w);
  switch (k) {
    case 2: bc::hand_chain2(x, w, out, b.n, nt); break;
    case 4: bc::hand_chain4(x, w, out, b.n, nt); break;
    case 8: bc::hand_chain8(x, w, out, b.n, nt); break;
    default: bc::hand_chain16(x, w, out, b.n, nt); break;
  }
}

/// Before timing: the variant's result must match the hand loop's (up to rounding: GCC may
/// contract the hand loop's x*w + 0.5 into an FMA). A mismatch skips the row with an error.
bool matches_hand(benchmark::State& state, int k, const Buffers& b, const float* got) {
  std::vector<float> ref(static_cast<std::size_t>(b.n));
  hand_chain(k, b, ref.data(), 1);
  for (std::int64_t i = 0; i < b.n; ++i) {
    const float r = ref[static_cast<std::size_t>(i)];
    if (!(std::fabs(got[i] - r) <= 1e-5f * (1.f + std::fabs(r)))) {
      state.SkipWithError(("result differs from the hand loop at " + std::to_string(i) + ": " + std::to_string(got[i]) +
                           " vs " + std::to_string(r)).c_str());
      return false;
    }
  }
  return true;
}

void count(benchmark::State& state, std::int64_t n, std::int64_t bytes_per_element) {
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(n * bytes_per_element),
                                              benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}

// ---- eager: the template on sc::Tensor, one op at a time (each result from the caching allocator)
template <int K>
void eager(benchmark::State& state, std::int64_t n) {
  const Buffers& b = buffers(n);
  if (!matches_hand(state, K, b, Buffers::p(bc::chain<K>(b.x, b.w)))) return;
  for (auto _ : state) {
    sc::Tensor y = bc::chain<K>(b.x, b.w);
    benchmark::DoNotOptimize(y.raw_data());
    benchmark::ClobberMemory();
  }
  count(state, n, 12);
}

// ---- traced: sc::function of a generic lambda calling the template, traced before the timing;
// `chains` false: its fused group prepared without chains (graph::fused_chains()), each op a pass
// over the tile, as before session 70
template <int K>
void traced(benchmark::State& state, std::int64_t n, bool chains) {
  const Buffers& b = buffers(n);
  auto f = sc::function([](const auto& x, const auto& w) { return bc::chain<K>(x, w); }, "chain" + std::to_string(K));
  const bool before = sc::graph::fused_chains();
  sc::graph::fused_chains() = chains;
  const bool ok = matches_hand(state, K, b, Buffers::p(f(b.x, b.w)));  // (traced and prepared here)
  sc::graph::fused_chains() = before;
  if (!ok) return;
  for (auto _ : state) {
    sc::Tensor y = f(b.x, b.w);
    benchmark::DoNotOptimize(y.raw_data());
    benchmark::ClobberMemory();
  }
  count(state, n, 12);
}

#if BENCH_CHAINS_STAGED
// ---- compiled: compile-time staging, the chain's type is the graph and g(...) one fused loop
template <int K>
void compiled(benchmark::State& state, std::int64_t n) {
  const Buffers& b = buffers(n);
  auto g = sc::compile([](auto x, auto w) { return bc::chain<K>(x, w); });
  {
    const sc::Tensor y = g(b.x, b.w);
    if (!matches_hand(state, K, b, Buffers::p(y))) return;
  }
  for (auto _ : state) {
    sc::Tensor y = g(b.x, b.w);
    benchmark::DoNotOptimize(y.raw_data());
    benchmark::ClobberMemory();
  }
  count(state, n, 12);
}
#endif

// ---- xtensor: xt::adapt over the same buffers, xt::noalias(out) = the same template. xtensor is
// serial unless built with XTENSOR_USE_OPENMP for everything; split by hand, one contiguous range
// per thread (the hand loop's schedule(static)), on the library's thread count.
template <int K>
void xtensor_run(const Buffers& b) {
  const std::int64_t n = b.n;
#pragma omp parallel
  {
    const std::int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const std::int64_t chunk = (n + nt - 1) / nt, lo = std::min(n, t * chunk), hi = std::min(n, lo + chunk);
    if (lo < hi) {
      const auto len = static_cast<std::size_t>(hi - lo);
      const auto x = xt::adapt(Buffers::p(b.x) + lo, len, xt::no_ownership(), shape1{len});
      const auto w = xt::adapt(Buffers::p(b.w) + lo, len, xt::no_ownership(), shape1{len});
      auto out = xt::adapt(b.po() + lo, len, xt::no_ownership(), shape1{len});
      xt::noalias(out) = bc::chain<K>(x, w);
    }
  }
}
template <int K>
void xtensor(benchmark::State& state, std::int64_t n) {
  const Buffers& b = buffers(n);
  xtensor_run<K>(b);
  if (!matches_hand(state, K, b, b.po())) return;
  for (auto _ : state) {
    xtensor_run<K>(b);
    benchmark::ClobberMemory();
  }
  count(state, n, 12);
}

// ---- hand: one plain loop into the preallocated output, on nt threads
void hand(benchmark::State& state, std::int64_t n, int k, int nt) {
  const Buffers& b = buffers(n);
  for (auto _ : state) {
    hand_chain(k, b, b.po(), nt);
    benchmark::ClobberMemory();
  }
  count(state, n, 12);
}

// ---- copy: out = x, the bandwidth line (8 bytes per element)
void copy(benchmark::State& state, std::int64_t n) {
  const Buffers& b = buffers(n);
  for (auto _ : state) {
    bc::copy(Buffers::p(b.x), b.po(), n, sc::num_threads());
    benchmark::ClobberMemory();
  }
  count(state, n, 8);
}

std::string size_name(std::int64_t n) { return n >= (1 << 20) ? std::to_string(n >> 20) + "M" : std::to_string(n); }

template <int K>
void register_chain(std::int64_t n) {
  const std::string s = "fusion_chains/" + size_name(n) + "/K" + std::to_string(K) + "/";
  const benchmark::TimeUnit unit = n >= (std::int64_t{1} << 24) ? benchmark::kMillisecond : benchmark::kMicrosecond;
  // sc::num_threads() is read when the row runs: main() applies STAGECRAFT_BENCH_THREADS after registration.
  const auto add = [&](const std::string& v, auto fn, auto... args) {
    benchmark::RegisterBenchmark((s + v).c_str(), fn, args...)->UseRealTime()->Unit(unit);
  };
  add("eager", eager<K>, n);
  add("traced", traced<K>, n, true);
  add("traced_unchained", traced<K>, n, false);
#if BENCH_CHAINS_STAGED
  add("compiled", compiled<K>, n);
#endif
  add("xtensor", xtensor<K>, n);
  benchmark::RegisterBenchmark((s + "hand").c_str(), [n](benchmark::State& st) { hand(st, n, K, sc::num_threads()); })
      ->UseRealTime()
      ->Unit(unit);
  if (bench::threads() > 1) add("hand_1t", hand, n, K, 1);
}

void register_all() {
  // 128K: where a chain's summed op costs, not one op's grain, decide the threads (two threads
  // from 64K elements a thread for K=16)
  for (std::int64_t n : {std::int64_t{1} << 17, std::int64_t{1} << 20, std::int64_t{1} << 24}) {
    benchmark::RegisterBenchmark(("fusion_chains/" + size_name(n) + "/copy").c_str(), copy, n)
        ->UseRealTime()
        ->Unit(n >= (std::int64_t{1} << 24) ? benchmark::kMillisecond : benchmark::kMicrosecond);
    register_chain<2>(n);
    register_chain<4>(n);
    register_chain<8>(n);
    register_chain<16>(n);
  }
}
const bool registered = (register_all(), true);

}  // namespace

STAGECRAFT_BENCH_MAIN()
