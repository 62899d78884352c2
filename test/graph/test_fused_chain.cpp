// Chains of the fused evaluator (graph/fused_chain.hpp): which runs of instructions become one
// pass with the running value in registers, and that a chained run gives the bits of the same
// program run an instruction at a time (graph::fused_chains() off) at every length around the
// batch, the 4-batch block and the tile, over every dtype, with operands per element, single
// values on either side and splat inputs, in place and reduced; and the exact ops against plain
// loops.
// (Only the headers it uses: the evaluator must build without the rest of the graph layer.)
#include <catch2/catch.hpp>
#include <stagecraft/backend/cpu/parallel.hpp>
#include <stagecraft/core/creation.hpp>
#include <stagecraft/fwd.hpp>
#include <stagecraft/graph/fused_kernel.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "testing.hpp"

namespace {

namespace g = sc::graph;
using sc::ops::OpId;

OpId op(std::string_view name) {
  const sc::ops::OpInfo* info = sc::ops::find_op(name);
  REQUIRE(info != nullptr);
  return info->id;
}

/// Values of T: floats in [0.25, 3.25) (divisions stay finite), integers in [1, 4].
template <class T>
sc::Tensor make(const sc::Shape& s, std::uint64_t seed) {
  sctest::Rng r(seed);
  std::vector<T> v(static_cast<std::size_t>(s.numel()));
  for (T& x : v) {
    if constexpr (std::is_floating_point_v<T>) x = static_cast<T>(0.25 + 3 * r.uniform());
    else x = static_cast<T>(1 + static_cast<int>(r.next() % 4));
  }
  return sc::tensor(v, s);
}

/// v rounded to T where the compiler would keep it in a register (no contraction of a product and a
/// sum into one fused multiply-add, which GCC does by default where the target has FMA).
template <class T>
T rounded(T v) {
  volatile T r = v;
  return r;
}

/// Prepares p with chains on or off.
g::PreparedFused prepared(const g::FusedProgram& p, bool chains) {
  bool& on = g::fused_chains();
  const bool before = on;
  on = chains;
  g::PreparedFused pf = g::prepare(p);
  on = before;
  return pf;
}

std::vector<sc::Tensor> run(const g::PreparedFused& pf, const std::vector<sc::Tensor>& in) {
  std::vector<sc::Tensor> out;
  for (std::size_t j = 0; j < pf.program.outputs.size(); ++j) out.push_back(sc::full(pf.program.out_shape, -7.0, pf.program.dtype));
  if (pf.program.reduction) out.push_back(sc::full(pf.program.reduction->out_shape, -7.0, pf.program.dtype));
  g::run(pf, in, out);
  return out;
}

template <class T>
std::int64_t differing(const sc::Tensor& a, const sc::Tensor& b) {
  const std::vector<T> x = a.to_vector<T>(), y = b.to_vector<T>();
  if (x.size() != y.size()) return -1;
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) bad += std::memcmp(&x[i], &y[i], sizeof(T)) != 0;
  return bad;
}

/// Links of each chain pf's steps run (per_tile), 0 for a plain step.
std::vector<int> chain_lengths(const g::PreparedFused& pf) {
  std::vector<int> n;
  for (const auto& s : pf.per_tile) n.push_back(s.chain < 0 ? 0 : static_cast<int>(pf.chains[static_cast<std::size_t>(s.chain)].links.size()));
  return n;
}

}  // namespace

TEST_CASE("fused chains: runs of instructions read only by the next one become one pass", "[fused][chain]") {
  const sc::DType d = sc::f32;
  const sc::Shape out{64, 100};
  const OpId mul = op("mul"), add = op("add"), sub = op("sub"), exp = op("exp"), neg = op("neg"), sum = op("sum"),
             div = op("div"), relu = op("relu"), sin = op("sin"), pow = op("pow"), mod = op("mod"),
             floor_div = op("floor_div");
  struct Case {
    std::string what;
    std::vector<sc::Shape> inputs;
    std::vector<g::FusedInstr> code;
    std::vector<int> outputs;
    int reduced;            // the register reduced over rows, or -1
    std::vector<int> want;  // chain_lengths
  };
  const std::vector<Case> cases = {
      {"x * 2 + 1", {out, {}, {}}, {{mul, 0, 1}, {add, 3, 2}}, {4}, -1, {2}},
      {"sum(x * 2 + 1) (the reduction reads the chain's result)", {out, {}, {}}, {{mul, 0, 1}, {add, 3, 2}}, {}, 4, {2}},
      {"1 - x * y, then / z: the running value on either side", {out, out, {}, out}, {{mul, 0, 1}, {sub, 2, 4}, {div, 5, 3}}, {6}, -1, {3}},
      {"relu(-x) * y: unary links", {out, out}, {{neg, 0}, {relu, 2}, {mul, 3, 1}}, {4}, -1, {3}},
      {"x * 2 written out too: not a link", {out, {}, {}}, {{mul, 0, 1}, {add, 3, 2}}, {4, 3}, -1, {0, 0}},
      {"x * 2 read twice: not a link", {out, {}}, {{mul, 0, 1}, {add, 2, 2}}, {3}, -1, {0, 0}},
      {"x * 2 read by two instructions", {out, {}}, {{mul, 0, 1}, {add, 2, 0}, {sub, 3, 2}}, {4}, -1, {0, 2}},
      {"exp in the middle: transcendentals are passes of their own", {out, {}}, {{mul, 0, 1}, {exp, 2}, {add, 3, 1}, {mul, 4, 0}}, {5}, -1, {0, 0, 2}},
      {"sin (its bits depend on the batch) is no link", {out, {}}, {{mul, 0, 1}, {sin, 2}}, {3}, -1, {0, 0}},
      // pow, mod and floor_div have batch forms for floats, but long ones with calls in them: inlined
      // into the links' switch they pushed every link's running values out of registers (traced K=16
      // chains of adds ran 2x slower than unchained)
      {"pow, mod, floor_div in the middle: passes of their own", {out, out}, {{mul, 0, 1}, {pow, 2, 1}, {add, 3, 1}, {mod, 4, 1}, {mul, 5, 0}, {floor_div, 6, 1}, {add, 7, 0}}, {8}, -1, {0, 0, 0, 0, 0, 0, 0}},
      {"x * 2 reduced too: not a link", {out, {}}, {{mul, 0, 1}, {add, 2, 1}}, {3}, 2, {0, 0}},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    g::FusedProgram p{d, out, c.inputs, c.code, c.outputs};
    if (c.reduced >= 0) p.reduction = g::FusedReduction{sum, c.reduced, 100, {64, 1}};
    CHECK(chain_lengths(g::prepare(p)) == c.want);
    const std::vector<int> none(chain_lengths(prepared(p, false)).size(), 0);
    CHECK(chain_lengths(prepared(p, false)) == none);
  }
  STATIC_REQUIRE(g::detail_fused::chainable<sc::ops::Add, float>());
  STATIC_REQUIRE(g::detail_fused::chainable<sc::ops::Div, double>());
  STATIC_REQUIRE(!g::detail_fused::chainable<sc::ops::Pow, float>());
  STATIC_REQUIRE(!g::detail_fused::chainable<sc::ops::Mod, float>());
  STATIC_REQUIRE(!g::detail_fused::chainable<sc::ops::FloorDiv, std::int32_t>());
  // 20 adds in a row: chains of at most max_links
  g::FusedProgram p{d, out, {out, {}}, {}, {}};
  for (int k = 0; k < 20; ++k) p.code.push_back({add, k == 0 ? 0 : 1 + k, 1});
  p.outputs = {21};
  CHECK(chain_lengths(g::prepare(p)) == std::vector<int>{g::detail_fused::max_links, 4});
}

TEMPLATE_TEST_CASE("fused chains: the bits of the program run an instruction at a time, at every length", "[fused][chain]",
                   float, double, std::int32_t, std::int64_t) {
  using T = TestType;
  const sc::DType d = sc::dtype_of<T>();
  constexpr std::int64_t W = sc::backend::cpu::batch<T>::size;
  const OpId mul = op("mul"), add = op("add"), sub = op("sub"), neg = op("neg"), abs = op("abs"), maximum = op("maximum"),
             minimum = op("minimum"), square = op("square"), div = op("div"), sum = op("sum");
  const bool floating = std::is_floating_point_v<T>;
  // inputs x, y (per element), k, h (single values); ((k - x * y) max h) / k, squared, minus y, min of x:
  // operands per element and single values, the running value first and second
  std::vector<g::FusedInstr> code = {{mul, 0, 1}, {sub, 2, 4}, {maximum, 5, 3}, {floating ? div : add, 6, 2},
                                     {square, 7}, {sub, 8, 1}, {minimum, 0, 9}, {neg, 10}, {abs, 11}};
  // one chain over inputs read in place: the long tile (chain_tile_bytes), tested at its ends and
  // at the default tile's
  const std::int64_t tile = prepared(g::FusedProgram{d, {7}, {{7}, {7}, {}, {}}, code, {12}}, true).tile;
  const std::int64_t short_tile = g::detail_fused::tile_elems<T>;
  CHECK(tile == g::detail_fused::chain_tile_bytes / static_cast<std::int64_t>(sizeof(T)));
  // a broadcast input is gathered into a scratch tile: the short tile then
  CHECK(prepared(g::FusedProgram{d, {2, 7}, {{2, 7}, {7}, {}, {}}, code, {12}}, true).tile < tile);
  for (const std::int64_t n : {std::int64_t{1}, W - 1, W, W + 1, 4 * W - 1, 4 * W, 4 * W + 1, 5 * W + 3, short_tile - 1,
                               short_tile + 1, tile - 1, tile + 1, 2 * tile, 2 * tile + 5, std::int64_t{100003}})
    for (const bool reduce : {false, true})
      for (const bool in_place : {false, true}) {
        if (reduce && !floating) continue;  // (reductions run over floating dtypes)
        INFO("n = " << n << (reduce ? ", reduced" : "") << (in_place ? ", written over x" : ""));
        const sc::Shape out{n};
        g::FusedProgram p{d, out, {out, out, {}, {}}, code, {12}};
        if (reduce) p.reduction = g::FusedReduction{sum, 12, n, {1}};
        const g::PreparedFused on = prepared(p, true), off = prepared(p, false);
        if (n > 1) CHECK(chain_lengths(on) == std::vector<int>{9});
        const std::vector<sc::Tensor> in = {make<T>(out, 1), make<T>(out, 2), make<T>({}, 3), make<T>({}, 4)};
        std::vector<sc::Tensor> got, want = run(off, in);
        if (in_place) {  // the output written over x
          std::vector<sc::Tensor> own = in;
          own[0] = sc::tensor(in[0].to_vector<T>(), out);
          got.resize(reduce ? 2 : 1);
          got[0] = own[0];
          if (reduce) got[1] = sc::full({1}, -7.0, d);
          g::run(on, own, got);
        } else {
          got = run(on, in);
        }
        REQUIRE(got.size() == want.size());
        for (std::size_t j = 0; j < got.size(); ++j) CHECK(differing<T>(got[j], want[j]) == 0);
        // the exact ops (every op but the division) against a plain loop
        if (!floating) {
          const std::vector<T> x = in[0].to_vector<T>(), y = in[1].to_vector<T>(), r = got[0].to_vector<T>();
          const T k = in[2].item<T>(), h = in[3].item<T>();
          std::int64_t bad = 0;
          for (std::size_t i = 0; i < x.size(); ++i) {
            const T m = std::max<T>(static_cast<T>(k - x[i] * y[i]), h);
            const T s = static_cast<T>(static_cast<T>(m + k) * static_cast<T>(m + k)) - y[i];
            const T v = std::min<T>(x[i], s);
            bad += r[i] != (v < 0 ? static_cast<T>(-v) : v);  // abs(neg(v)) = |v|
          }
          CHECK(bad == 0);
        }
      }
}

TEMPLATE_TEST_CASE("fused chains: splat inputs and broadcast rows as operands, on one thread and two", "[fused][chain]", float,
                   double) {
  using T = TestType;
  const sc::DType d = sc::dtype_of<T>();
  const OpId mul = op("mul"), add = op("add"), sub = op("sub"), sum = op("sum");
  // x [R, C], m and s one per row, w [C]: ((x - m) * s) * w + m, and its row sums
  for (const sc::Shape& out : {sc::Shape{16, 1024}, sc::Shape{37, 700}, sc::Shape{50, 3}})
    for (const bool reduce : {false, true})
      for (const int threads : {1, 2}) {
        const std::int64_t C = out[1];
        const sc::Shape row{out[0], 1};
        g::FusedProgram p{d, out, {out, row, row, {C}}, {{sub, 0, 1}, {mul, 4, 2}, {mul, 5, 3}, {add, 6, 1}}, {7}};
        if (reduce) p.reduction = g::FusedReduction{sum, 7, C, row};
        INFO("output " << out << (reduce ? ", reduced" : "") << ", " << threads << " threads");
        const g::PreparedFused on = prepared(p, true), off = prepared(p, false);
        CHECK(chain_lengths(on) == std::vector<int>{4});
        CHECK(on.per_tile_splat.size() == on.per_tile.size());
        const std::vector<sc::Tensor> in = {make<T>(out, 5), make<T>(row, 6), make<T>(row, 7), make<T>({C}, 8)};
        const sctest::ThreadCount scope(threads);
        const std::vector<sc::Tensor> got = run(on, in), want = run(off, in);
        REQUIRE(got.size() == want.size());
        for (std::size_t j = 0; j < got.size(); ++j) CHECK(differing<T>(got[j], want[j]) == 0);
        // against a plain loop (every op exact but the rounding of each: the same expression in T)
        const std::vector<T> x = in[0].to_vector<T>(), m = in[1].to_vector<T>(), s = in[2].to_vector<T>(),
                             w = in[3].to_vector<T>(), r = got[0].to_vector<T>();
        std::int64_t bad = 0;
        for (std::size_t i = 0; i < x.size(); ++i) {
          const std::size_t rr = i / static_cast<std::size_t>(C), c = i % static_cast<std::size_t>(C);
          const T a = rounded<T>(x[i] - m[rr]), b = rounded<T>(a * s[rr]), e = rounded<T>(b * w[c]);
          bad += r[i] != rounded<T>(e + m[rr]);
        }
        CHECK(bad == 0);
      }
}

TEMPLATE_TEST_CASE("fused chains: maximum and minimum against one value, NaN, zeros of either sign and ties", "[fused][chain]",
                   float, double) {
  using T = TestType;
  const sc::DType d = sc::dtype_of<T>();
  const OpId maximum = op("maximum"), minimum = op("minimum");
  const T nan = std::numeric_limits<T>::quiet_NaN(), inf = std::numeric_limits<T>::infinity();
  // x per element; k, h single values: min(h, max(x, k)), then max(k, .), then min(., h): each
  // op with the running value first and second
  const std::vector<g::FusedInstr> code = {{maximum, 0, 1}, {minimum, 2, 3}, {maximum, 1, 4}, {minimum, 5, 2}};
  const std::vector<T> special = {nan, -nan, T(0), -T(0), T(1.5), T(-2), inf, -inf};
  const std::int64_t n = 1000;
  std::vector<T> x(static_cast<std::size_t>(n));
  sctest::Rng r(11);
  for (std::size_t i = 0; i < x.size(); ++i)  // the special values in runs and alone, between random ones
    x[i] = r.next() % 3 == 0 ? static_cast<T>(4 * r.uniform() - 2) : special[(i / (1 + i % 3)) % special.size()];
  const sc::Shape out{n};
  g::FusedProgram p{d, out, {out, {}, {}}, code, {6}};
  const g::PreparedFused on = prepared(p, true), off = prepared(p, false);
  CHECK(chain_lengths(on) == std::vector<int>{4});
  const auto mx = [](T a, T b) { return (a > b || a != a) ? a : b; };  // NaN in either gives NaN, ties give b
  const auto mn = [](T a, T b) { return (a < b || a != a) ? a : b; };
  for (const T k : special)
    for (const T h : special) {
      INFO("k = " << k << " (sign " << std::signbit(k) << "), h = " << h << " (sign " << std::signbit(h) << ")");
      const std::vector<sc::Tensor> in = {sc::tensor(x, out), sc::scalar(k), sc::scalar(h)};
      const std::vector<sc::Tensor> got = run(on, in), want = run(off, in);
      CHECK(differing<T>(got[0], want[0]) == 0);
      const std::vector<T> g0 = got[0].to_vector<T>();
      std::int64_t bad = 0;
      for (std::size_t i = 0; i < x.size(); ++i) {
        const T e = mn(mx(k, mn(h, mx(x[i], k))), h);
        bad += std::memcmp(&e, &g0[i], sizeof(T)) != 0;
      }
      CHECK(bad == 0);
    }
}
