// A fused elementwise group (graph/fused_kernel.hpp): the 9-op chain tanh(x*a + b)*c - x/(1 + exp(-x))
// through the blocked evaluator vs our eager ops one by one vs one hand-written loop (-O3
// -ffast-math, bench_fusion_hand.cpp) and the same loop on xsimd batches with the ops' own math;
// a, b, c as tensors (5 buffers of memory traffic) or as scalars; and a sweep of the tile size.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <xsimd/xsimd.hpp>

#include <stagecraft/graph/fused_kernel.hpp>

#include "bench_common.hpp"

namespace bench_fusion {
void hand_chain9(const float* x, const float* a, const float* b, const float* c, float* y, std::int64_t n);
void hand_chain9_scalars(const float* x, float a, float b, float c, float* y, std::int64_t n);
}  // namespace bench_fusion

namespace {

namespace g = sc::graph;
constexpr std::int64_t n_big = std::int64_t{1} << 24;  // 16M floats, 64 MiB per buffer
constexpr float a_s = 0.75f, b_s = 0.25f, c_s = 1.5f;   // the scalar variant's constants

enum class Abc { tensors, scalars };

/// n floats in [-2, 2) from a fixed xorshift stream (here rather than bench::input, so these
/// figures do not move when the library's random ops change).
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
  sc::Tensor x, a, b, c, out;
  explicit Buffers(std::int64_t len)
      : n(len), x(input(len, 1)), a(input(len, 2)), b(input(len, 3)), c(input(len, 4)), out(sc::zeros({len})) {}
  static const float* p(const sc::Tensor& t) { return static_cast<const float*>(t.raw_data()); }
};
Buffers& buffers(std::int64_t n) {
  static std::map<std::int64_t, Buffers> all;
  return all.try_emplace(n, n).first->second;
}

/// registers: x=0 a=1 b=2 c=3 one=4; mul add tanh mul neg exp add div sub; the result is 13.
g::FusedProgram chain9(std::int64_t n, Abc k) {
  namespace o = sc::ops;
  const sc::Shape abc = k == Abc::tensors ? sc::Shape{n} : sc::Shape{};
  return {sc::f32, {n}, {{n}, abc, abc, abc, {}},
          {{o::Mul::id, 0, 1}, {o::Add::id, 5, 2}, {o::Tanh::id, 6}, {o::Mul::id, 7, 3}, {o::Neg::id, 0},
           {o::Exp::id, 9}, {o::Add::id, 4, 10}, {o::Div::id, 0, 11}, {o::Sub::id, 8, 12}},
          {13}};
}
std::vector<sc::Tensor> chain9_inputs(const Buffers& buf, Abc k) {
  if (k == Abc::tensors) return {buf.x, buf.a, buf.b, buf.c, sc::scalar(1.f)};
  return {buf.x, sc::scalar(a_s), sc::scalar(b_s), sc::scalar(c_s), sc::scalar(1.f)};
}

void count(benchmark::State& state, std::int64_t n, Abc k) {
  const std::int64_t buffers_moved = k == Abc::tensors ? 5 : 2;
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * buffers_moved * std::int64_t{sizeof(float)});
}

// ---- the evaluator, with the program prepared once (as a plan caches it); tile 0: the default
void fused(benchmark::State& state, std::int64_t n, Abc k, std::int64_t tile) {
  Buffers& buf = buffers(n);
  g::PreparedFused pf = g::prepare(chain9(n, k));
  if (tile > 0) pf.tile = tile;
  const std::vector<sc::Tensor> in = chain9_inputs(buf, k);
  std::vector<sc::Tensor> out = {buf.out};
  for (auto _ : state) {
    g::run(pf, in, out);
    benchmark::ClobberMemory();
  }
  count(state, n, k);
}
// ... and through run_fused, which prepares on every call.
void fused_unprepared(benchmark::State& state, std::int64_t n, Abc k) {
  Buffers& buf = buffers(n);
  const g::FusedProgram p = chain9(n, k);
  const std::vector<sc::Tensor> in = chain9_inputs(buf, k);
  std::vector<sc::Tensor> out = {buf.out};
  for (auto _ : state) {
    g::run_fused(p, in, out);
    benchmark::ClobberMemory();
  }
  count(state, n, k);
}

// ---- our eager ops, one by one (each result allocated from the caching allocator)
void eager(benchmark::State& state, std::int64_t n, Abc k) {
  const Buffers& buf = buffers(n);
  const sc::Tensor &x = buf.x, &a = buf.a, &b = buf.b, &c = buf.c;
  for (auto _ : state) {
    sc::Tensor y = k == Abc::tensors ? sc::tanh(x * a + b) * c - x / (1 + sc::exp(-x))
                                     : sc::tanh(x * a_s + b_s) * c_s - x / (1 + sc::exp(-x));
    benchmark::DoNotOptimize(y.raw_data());
    benchmark::ClobberMemory();
  }
  count(state, n, k);
}

// ---- one loop, written as a user would, built with -O3 -ffast-math
void hand(benchmark::State& state, std::int64_t n, Abc k) {
  const Buffers& buf = buffers(n);
  float* y = static_cast<float*>(buf.out.raw_data());
  for (auto _ : state) {
    if (k == Abc::tensors) bench_fusion::hand_chain9(Buffers::p(buf.x), Buffers::p(buf.a), Buffers::p(buf.b), Buffers::p(buf.c), y, n);
    else bench_fusion::hand_chain9_scalars(Buffers::p(buf.x), a_s, b_s, c_s, y, n);
    benchmark::ClobberMemory();
  }
  count(state, n, k);
}

// ---- one loop on xsimd batches with xsimd's tanh/exp, the math of the ops' SIMD rules
void hand_xsimd(benchmark::State& state, std::int64_t n, Abc k) {
  using B = xsimd::batch<float>;
  constexpr std::int64_t W = B::size;
  const Buffers& buf = buffers(n);
  const float *x = Buffers::p(buf.x), *a = Buffers::p(buf.a), *b = Buffers::p(buf.b), *c = Buffers::p(buf.c);
  float* y = static_cast<float*>(buf.out.raw_data());
  const bool t = k == Abc::tensors;
  auto f = [&](std::int64_t i) {
    const B xv = B::load_unaligned(x + i);
    const B av = t ? B::load_unaligned(a + i) : B(a_s), bv = t ? B::load_unaligned(b + i) : B(b_s),
            cv = t ? B::load_unaligned(c + i) : B(c_s);
    return xsimd::tanh(xv * av + bv) * cv - xv / (B(1.f) + xsimd::exp(-xv));
  };
  for (auto _ : state) {
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; i += W) f(i).store_unaligned(y + i);  // n: a multiple of W here
    benchmark::ClobberMemory();
  }
  count(state, n, k);
}

void register_all() {
  for (std::int64_t n : {n_big, std::int64_t{1} << 18})
    for (auto [kname, k] : {std::pair{"tensors", Abc::tensors}, std::pair{"scalars", Abc::scalars}}) {
      const std::string s = std::string(n == n_big ? "fusion_16M" : "fusion_256K") + "/chain9_" + kname + "/";
      benchmark::RegisterBenchmark((s + "fused").c_str(), fused, n, k, std::int64_t{0})->UseRealTime();
      benchmark::RegisterBenchmark((s + "fused_run_fused").c_str(), fused_unprepared, n, k)->UseRealTime();
      benchmark::RegisterBenchmark((s + "eager").c_str(), eager, n, k)->UseRealTime();
      benchmark::RegisterBenchmark((s + "hand_loop_fastmath").c_str(), hand, n, k)->UseRealTime();
      benchmark::RegisterBenchmark((s + "hand_xsimd").c_str(), hand_xsimd, n, k)->UseRealTime();
    }
  // Tile size (elements per register tile) of the evaluator, with a, b, c tensors (5 buffers), and
  // around the default with scalars (3 scratch slots: the tile is doubled, fused_prepare.hpp).
  for (std::int64_t n : {n_big, std::int64_t{1} << 18}) {
    const std::string sweep = n == n_big ? "fusion_tile_sweep_16M" : "fusion_tile_sweep_256K";
    for (std::int64_t tile : {128, 256, 512, 1024, 2048, 4096, 16384})
      benchmark::RegisterBenchmark((sweep + "/chain9_tensors/tile:" + std::to_string(tile)).c_str(), fused, n,
                                   Abc::tensors, tile)
          ->UseRealTime();
    for (std::int64_t tile : {512, 1024, 2048})
      benchmark::RegisterBenchmark((sweep + "/chain9_scalars/tile:" + std::to_string(tile)).c_str(), fused, n,
                                   Abc::scalars, tile)
          ->UseRealTime();
  }
}
const bool registered = (register_all(), true);

}  // namespace

STAGECRAFT_BENCH_MAIN()
