// Tests of a plan's memory (passes/memory.hpp, plan.hpp): a concat's pieces written straight into
// their places in its buffer by the steps that make them (graph::concat_in_place), so that the
// concat copies only what no step writes in place, or nothing; nested concats; what must stay
// apart (a piece that leaves the plan, a piece twice in one concat, a concat whose pieces are
// not one after another); liveness and in-place reuse around placed pieces, checked on random
// programs; results against eager bit for bit and against plain loops.
#include <catch2/catch.hpp>
#include "graph_testing.hpp"
#include "passes_testing.hpp"
#include <stagecraft/core/creation.hpp>
#include <stagecraft/fwd.hpp>
#include <stagecraft/graph/control_flow.hpp>
#include <stagecraft/graph/function.hpp>
#include <stagecraft/graph/passes/pipeline.hpp>
#include <stagecraft/graph/plan.hpp>
#include <stagecraft/ops/concat.hpp>
#include <stagecraft/ops/binary.hpp>
#include <stagecraft/ops/matmul.hpp>
#include <stagecraft/ops/reduce.hpp>
#include <stagecraft/ops/unary.hpp>
#include <stagecraft/ops/registry.hpp>
#include <stagecraft/ops/slice.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

using sc::graph::Graph;
using Tensors = std::vector<sc::Tensor>;
using Fn = std::function<Tensors(const Tensors&)>;
using sctest::trace;

using sctest::passes::ramp;
using sctest::passes::spec;

/// A plan of g, made with concat_in_place() set to `on`.
std::shared_ptr<const sc::graph::Plan> plan(const Graph& g, bool on) {
  const sctest::passes::Switch mode(sc::graph::concat_in_place(), on);
  return std::make_shared<const sc::graph::Plan>(std::make_shared<const Graph>(g));
}

bool same_bits(const sc::Tensor& a, const sc::Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const auto x = a.to_vector<float>(), y = b.to_vector<float>();
  for (std::size_t i = 0; i < x.size(); ++i)
    if (std::bit_cast<std::uint32_t>(x[i]) != std::bit_cast<std::uint32_t>(y[i])) return false;
  return true;
}

/// f's graph run by plans with and without pieces in place: both equal f run eagerly, bit for
/// bit, twice each (the second run reuses the first's buffers). Returns the kernels of each plan.
std::pair<int, int> check_against_eager(const std::vector<sc::TensorSpec>& specs, const Fn& f, const Tensors& args) {
  const Graph g = trace(specs, f);
  const Tensors want = f(args);
  std::pair<int, int> kernels;
  for (const bool on : {true, false}) {
    const auto p = plan(g, on);
    (on ? kernels.first : kernels.second) = p->stats().kernels;
    for (int round = 0; round < 2; ++round) {
      const Tensors got = p->run(args);
      REQUIRE(got.size() == want.size());
      for (std::size_t k = 0; k < want.size(); ++k) {
        INFO("in place " << on << ", round " << round << ", result " << k);
        CHECK(same_bits(got[k], want[k]));
      }
    }
  }
  return kernels;
}

/// Random program `seed`: rows [1, 4] made by unary and binary steps from two arguments, concats of
/// 2-4 of them (repeats allowed) along rows or, at [1, 4k], along columns, concats of concats,
/// steps on the concats (broadcasting rows over them); its results a few of everything.
Fn random_concat_program(unsigned seed) {
  return [seed](const Tensors& x) {
    std::mt19937 r(seed);
    auto choose = [&](std::size_t n) { return static_cast<std::size_t>(r() % n); };
    Tensors rows{x[0], x[1]}, joined;
    for (int step = 0; step < 24; ++step) {
      switch (choose(6)) {
        case 0: rows.push_back(sc::sin(rows[choose(rows.size())])); break;
        case 1: rows.push_back(rows[choose(rows.size())] * 0.75f + rows[choose(rows.size())]); break;
        case 2: rows.push_back(sc::tanh(rows[choose(rows.size())])); break;
        case 3:
        case 4: {
          Tensors parts;
          const std::size_t n = 2 + choose(3);
          for (std::size_t k = 0; k < n; ++k) parts.push_back(rows[choose(rows.size())]);
          joined.push_back(sc::concat(parts, choose(2) == 0 ? 0 : 1));
          break;
        }
        default: {
          if (joined.empty()) break;
          const sc::Tensor j = joined[choose(joined.size())];  // (a copy: push_back moves the vector)
          const std::size_t how = choose(3);
          if (how == 0) {
            joined.push_back(sc::exp(j * 0.1f) - j);
          } else if (how == 1 && j.shape()[1] == 4) {
            joined.push_back(j + rows[choose(rows.size())]);  // a row broadcast over the concat
          } else {
            const sc::Tensor k = joined[choose(joined.size())];
            if (k.shape()[1] == j.shape()[1]) joined.push_back(sc::concat({j, k}, 0));
          }
        }
      }
    }
    Tensors out;
    for (std::size_t k = 0; k < 3; ++k) out.push_back(rows[choose(rows.size())] * 2.f);
    for (const sc::Tensor& j : joined)
      if (choose(3) == 0) out.push_back(sc::sum(j));
    if (!joined.empty()) out.push_back(joined.back());
    return out;
  };
}

}  // namespace

TEST_CASE("memory: a concat's pieces are written in their places, and the concat is dropped", "[plan][memory]") {
  // c = [exp(x); tanh(y)] along rows: exp and tanh write their rows of c, no step copies them.
  const Fn f = [](const Tensors& x) {
    const sc::Tensor c = sc::concat({sc::exp(x[0]), sc::tanh(x[1])}, 0);
    return Tensors{c * 2.f};
  };
  const Tensors args{ramp(1, 4, 1), ramp(2, 4, 2)};
  const auto [on, off] = check_against_eager({spec(1, 4), spec(2, 4)}, f, args);
  CHECK(on == off - 1);
  CHECK(on == 3);
  const auto st = plan(trace({spec(1, 4), spec(2, 4)}, f), true)->stats();
  CHECK(st.pieces_in_place == 2);
  CHECK(st.concats_dropped == 1);
  // and against plain loops: rows exp(x), then tanh(y), doubled (the library's exp and tanh are
  // its own, within an ulp or two of std's)
  const auto x = args[0].to_vector<float>(), y = args[1].to_vector<float>();
  const auto got = plan(trace({spec(1, 4), spec(2, 4)}, f), true)->run(args)[0].to_vector<float>();
  REQUIRE(got.size() == 12);
  for (std::size_t i = 0; i < 4; ++i) CHECK(got[i] == Approx(std::exp(x[i]) * 2.f).epsilon(1e-6));
  for (std::size_t i = 0; i < 8; ++i) CHECK(got[4 + i] == Approx(std::tanh(y[i]) * 2.f).epsilon(1e-6));
}

TEST_CASE("memory: along a later axis after extents of 1 the pieces are one after another too", "[plan][memory]") {
  // [1, 3] and [1, 5] along axis 1: contiguous; [2, 3] and [2, 5] along axis 1 are not (rows interleave).
  const Fn one = [](const Tensors& x) { return Tensors{sc::concat({sc::exp(x[0]), sc::sin(x[1])}, 1) + 1.f}; };
  const auto [on1, off1] = check_against_eager({spec(1, 3), spec(1, 5)}, one, {ramp(1, 3, 3), ramp(1, 5, 4)});
  CHECK(on1 == off1 - 1);
  const Fn two = [](const Tensors& x) { return Tensors{sc::concat({sc::exp(x[0]), sc::sin(x[1])}, 1) + 1.f}; };
  const auto [on2, off2] = check_against_eager({spec(2, 3), spec(2, 5)}, two, {ramp(2, 3, 3), ramp(2, 5, 4)});
  CHECK(on2 == off2);
}

TEST_CASE("memory: pieces no step makes are copied by the concat, the rest written in place", "[plan][memory]") {
  // An argument, a constant and a piece twice stay with the concat; exp(y) is written in place.
  const sc::Tensor k = ramp(1, 4, 9);
  const Fn f = [&](const Tensors& x) {
    const sc::Tensor e = sc::exp(x[1]), s = sc::sin(x[1]);
    return Tensors{sc::concat({x[0], e, k, s, s}, 0) * 3.f};
  };
  const auto [on, off] = check_against_eager({spec(1, 4), spec(1, 4)}, f, {ramp(1, 4, 5), ramp(1, 4, 6)});
  CHECK(on == off);  // (the concat still copies three of its pieces)
  const auto st = plan(trace({spec(1, 4), spec(1, 4)}, f), true)->stats();
  CHECK(st.pieces_in_place == 1);
  CHECK(st.concats_dropped == 0);
}

TEST_CASE("memory: nested concats: the inner one's pieces are written into the outer one's buffer", "[plan][memory]") {
  const Fn f = [](const Tensors& x) {
    const sc::Tensor inner = sc::concat({sc::exp(x[0]), sc::cos(x[1])}, 1);  // [1, 8]
    const sc::Tensor outer = sc::concat({sc::tanh(x[2]), inner, sc::sin(x[2])}, 0);  // [3, 8]
    return Tensors{outer * 0.5f, sc::sum(inner)};  // inner read again after the outer is made
  };
  const auto [on, off] =
      check_against_eager({spec(1, 4), spec(1, 4), spec(1, 8)}, f, {ramp(1, 4, 1), ramp(1, 4, 2), ramp(1, 8, 3)});
  CHECK(on == off - 2);
  const auto st = plan(trace({spec(1, 4), spec(1, 4), spec(1, 8)}, f), true)->stats();
  CHECK(st.pieces_in_place == 5);  // exp and cos in inner; tanh, inner and sin in outer
  CHECK(st.concats_dropped == 2);
  // and sc::function's stats print them
  auto traced = sc::function([&](const sc::Tensor& a, const sc::Tensor& b, const sc::Tensor& c) { return f({a, b, c}); });
  const sc::Tensor a = ramp(1, 4, 1), b = ramp(1, 4, 2), c = ramp(1, 8, 3);
  (void)traced(a, b, c);
  const std::string printed = traced.get_concrete(a, b, c).stats().str();
  INFO(printed);
  CHECK(printed.find("concat pieces written in place") != std::string::npos);
}

TEST_CASE("memory: a piece that leaves the plan, or a concat that does, keeps its own storage", "[plan][memory]") {
  // e is a result: it must outlive the plan's buffers, so the concat copies it (t is written in
  // place); d is a result: it has storage of its own at every run, its pieces are copied into it.
  const Fn f = [](const Tensors& x) {
    const sc::Tensor e = sc::exp(x[0]), t = sc::tanh(x[0]);
    const sc::Tensor c = sc::concat({e, t}, 0), d = sc::concat({sc::sin(x[0]), sc::cos(x[0])}, 0);
    return Tensors{e, c * 2.f, d};
  };
  const Graph g = trace({spec(1, 6)}, f);
  const auto p = plan(g, true);
  const Tensors a = p->run(Tensors{ramp(1, 6, 1)});
  const Tensors b = p->run(Tensors{ramp(1, 6, 4)});  // a later run must not touch the first's results
  const Tensors want_a = f({ramp(1, 6, 1)}), want_b = f({ramp(1, 6, 4)});
  for (std::size_t k = 0; k < a.size(); ++k) {
    INFO("result " << k);
    CHECK(same_bits(a[k], want_a[k]));
    CHECK(same_bits(b[k], want_b[k]));
  }
  CHECK(p->stats().kernels == plan(g, false)->stats().kernels);
}

TEST_CASE("memory: an elementwise step reading a piece never writes over the concat's buffer", "[plan][memory]") {
  // c + e broadcasts e's row over c, reading both for the last time: its result may not take c's
  // buffer in place (writing c's first row would change e, which is that row).
  const Fn f = [](const Tensors& x) {
    const sc::Tensor e = sc::exp(x[1]);
    const sc::Tensor c = sc::concat({e, sc::sin(x[0])}, 0);  // [3, 4]: e, then sin(x)'s rows
    return Tensors{sc::tanh(c + e)};
  };
  (void)check_against_eager({spec(2, 4), spec(1, 4)}, f, {ramp(2, 4, 1), ramp(1, 4, 2)});
}

TEST_CASE("memory: random programs of pieces, concats and elementwise steps equal eager", "[plan][memory]") {
  // random_concat_program's programs. Buffers are reused by liveness and in place, so a piece
  // written over a live value shows here.
  std::mt19937 rng(7);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  for (int prog = 0; prog < 60; ++prog) {
    const unsigned seed = rng();
    const Fn f = random_concat_program(seed);
    INFO("program " << prog << " (seed " << seed << ")");
    (void)check_against_eager({spec(1, 4), spec(1, 4)}, f, {ramp(1, 4, static_cast<int>(pick(15))), ramp(1, 4, 5)});
  }
}

TEST_CASE("memory: the random programs fused, their concats written by their groups, equal eager", "[plan][memory][concat]") {
  // Every size fused (graph::fusion_min_elements() = 1): a concat of one group's rows is written
  // by the group through windows (graph::concat_fusion), and is then itself a piece placed in a
  // later concat's buffer, or not; with and without concat fusion.
  const sctest::passes::Switch<std::int64_t> all(sc::graph::fusion_min_elements(), 1);
  std::mt19937 rng(11);
  int written = 0;
  for (int prog = 0; prog < 60; ++prog) {
    const unsigned seed = rng();
    const Fn f = random_concat_program(seed);
    for (const bool on : {true, false}) {
      INFO("program " << prog << " (seed " << seed << "), concat fusion " << on);
      const sctest::passes::Switch fusion(sc::graph::concat_fusion(), on);
      (void)check_against_eager({spec(1, 4), spec(1, 4)}, f, {ramp(1, 4, prog % 15), ramp(1, 4, 5)});
      if (on) written += std::make_shared<const sc::graph::Plan>(std::make_shared<const Graph>(trace({spec(1, 4), spec(1, 4)}, f)))
                             ->stats().fused_concats;
    }
  }
  INFO(written << " concats written by their groups");
  CHECK(written >= 30);
}

TEST_CASE("memory: an optimized graph's concats of fused groups are written in place", "[plan][memory]") {
  // Fused groups write their outputs through the same storage: the concat of two groups' results.
  const std::int64_t saved = sc::graph::fusion_min_elements();
  sc::graph::fusion_min_elements() = 1;
  struct Restore {
    std::int64_t v;
    ~Restore() { sc::graph::fusion_min_elements() = v; }
  } restore{saved};
  const Fn f = [](const Tensors& x) {
    const sc::Tensor a = sc::tanh(x[0] * 2.f + 1.f), b = sc::sin(x[1]) * sc::cos(x[1]);
    return Tensors{sc::matmul(sc::concat({a, b}, 0), x[2])};
  };
  const Graph g = sc::graph::optimize(trace({spec(1, 8), spec(3, 8), spec(8, 2)}, f), nullptr, true);
  const Tensors args{ramp(1, 8, 1), ramp(3, 8, 2), ramp(8, 2, 3)};
  const Tensors want = f(args);
  const auto on = plan(g, true), off = plan(g, false);
  CHECK(on->stats().kernels == off->stats().kernels - 1);
  CHECK(same_bits(on->run(args)[0], want[0]));
  CHECK(same_bits(off->run(args)[0], want[0]));
}

TEST_CASE("memory: pieces in place inside a while_loop's body and a cond's branches (their own plans)",
          "[plan][memory][while]") {
  // Each body is a plan of its own: its concat is dropped there, while what leaves the body (its
  // results) keeps storage of its own. Traced == eager bit for bit, three calls.
  const auto body = [](const sc::Tensor& x) {
    const sc::Tensor r = sc::while_loop(
        [](sc::Tensor v) { return sc::sum(v) < 40.f; },
        [](sc::Tensor v) {
          // grows by a quarter and up to 1 per element a round: a few rounds to 40
          const sc::Tensor c = sc::concat({sc::exp(sc::log(v + 1.f) + 0.25f) - 1.f, sc::abs(sc::sin(v))}, 0);  // [2, 4]
          return sc::slice(c, {0, 0}, {1, 4}) + sc::slice(c, {1, 0}, {1, 4});
        },
        x);
    return sc::cond(sc::sum(r) > 0.f, [&] { return sc::concat({sc::tanh(r), sc::cos(r)}, 1) * 3.f; },
                    [&] { return sc::concat({r, r}, 1); });
  };
  auto f = sc::function(body);
  for (int seed = 1; seed <= 3; ++seed) {
    const sc::Tensor x = ramp(1, 4, seed) + 1.f;
    INFO("call " << seed);
    CHECK(same_bits(sc::Tensor(f(x)), body(x)));
  }
}

TEST_CASE("memory: random programs of small products formed in groups, windows and concats equal eager",
          "[plan][memory][product]") {
  // graph::product_fusion everywhere (the CPU forms a product as the eager matmul does, so bits
  // are kept), every size fused: products read whole, through windows, transposed either way, by
  // one group or several, escaping as results, feeding other products and concats; each plan
  // run twice (buffers reused by liveness; groups forming products never take an input's buffer).
  const sctest::passes::Switch fuse_all(sc::graph::fusion_min_elements(), std::int64_t{1});
  const sctest::passes::Switch everywhere(sc::graph::product_fusion(), sc::graph::ProductFusion::everywhere);
  std::mt19937 rng(11);
  int formed = 0;
  for (int prog = 0; prog < 40; ++prog) {
    const unsigned seed = rng();
    const Fn f = [seed](const Tensors& x) {
      std::mt19937 r(seed);
      auto choose = [&](std::size_t n) { return static_cast<std::size_t>(r() % n); };
      const sc::Tensor w = x[1];  // [8, 8]
      Tensors rows{x[0]}, outs;   // [3, 8] each
      auto any = [&] { return rows[choose(rows.size())]; };
      for (int step = 0; step < 16; ++step) {
        switch (choose(7)) {
          case 0: rows.push_back(sc::sin(any()) * 0.5f); break;
          case 1: rows.push_back(any() * 0.75f + any()); break;
          case 2: rows.push_back(sc::tanh(sc::matmul(any(), w, false, choose(2) == 0) * 0.25f) + any()); break;
          case 3: {  // two windows of one product, joined again
            const sc::Tensor p = sc::matmul(any(), w) * 0.125f;
            const sc::Tensor a = sc::slice(p, {0, 0}, {3, 4}), b = sc::slice(p, {0, 4}, {3, 4});
            rows.push_back(sc::concat({sc::sigmoid(a) * b, sc::tanh(b) - a}, 1));
            break;
          }
          case 4: {  // a^T b [8, 8], read by a group, then back to rows
            const sc::Tensor g = sc::exp(sc::matmul(any(), any(), true, false) * 0.05f) - 1.f;
            rows.push_back(sc::matmul(any(), g, false, choose(2) == 0) + any());
            break;
          }
          case 5: {  // one product read by two groups of different shapes
            const sc::Tensor p = sc::matmul(any(), w);
            rows.push_back(sc::cos(p) * 0.5f);
            outs.push_back(sc::sum(sc::slice(p, {0, 0}, {1, 8}) * 2.f));
            break;
          }
          default: outs.push_back(sc::matmul(any(), w) * 1.f);  // escapes through its group's result
        }
      }
      for (std::size_t k = 0; k < 3; ++k) outs.push_back(any() * 2.f);
      if (choose(2) == 0) outs.push_back(sc::matmul(any(), w));  // a product that is a result
      return outs;
    };
    INFO("program " << prog << " (seed " << seed << ")");
    const Graph g = trace({spec(3, 8), spec(8, 8)}, f);
    const Tensors args{ramp(3, 8, static_cast<int>(prog % 7)), ramp(8, 8, 3) * 0.25f};
    const Tensors want = f(args);
    const auto p = std::make_shared<const sc::graph::Plan>(std::make_shared<const Graph>(g));
    formed += p->stats().fused_products;
    for (int round = 0; round < 2; ++round) {
      const Tensors got = p->run(args);
      REQUIRE(got.size() == want.size());
      for (std::size_t k = 0; k < want.size(); ++k) {
        INFO("round " << round << ", result " << k);
        CHECK(same_bits(got[k], want[k]));
      }
    }
  }
  CHECK(formed > 100);
}
