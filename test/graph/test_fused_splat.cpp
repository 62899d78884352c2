// Inputs broadcast along the innermost axis (a row's mean or deviation, [R, 1] over [R, C]) read
// as one value in a tile that lies inside one row (PreparedFused::per_tile_splat) instead of a
// tile gathered from them: which inputs qualify, and the same bits as the gathered run at every
// tile size, row width, rank and thread count, against plain loops for the exact ops. Inputs
// broadcast over rows (a [C] row over [R, C], a window's row) read in place in a tile that lies
// inside one row instead of gathered: against plain loops, copied out and reduced as well.
// (Only the headers it uses: the evaluator must build without the rest of the graph layer.)
#include <catch2/catch.hpp>
#include <stagecraft/backend/cpu/parallel.hpp>
#include <stagecraft/core/creation.hpp>
#include <stagecraft/fwd.hpp>
#include <stagecraft/graph/fused_kernel.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
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

template <class T>
sc::Tensor make(const sc::Shape& s, std::uint64_t seed) {
  sctest::Rng r(seed);
  std::vector<T> v(static_cast<std::size_t>(s.numel()));
  for (T& x : v) x = static_cast<T>(0.25 + 3 * r.uniform());  // positive: divisions stay finite
  return sc::tensor(v, s);
}

/// pf as prepared, but every input gathered: what the evaluator did before reading single values.
g::PreparedFused gathered(g::PreparedFused pf) {
  pf.per_tile_splat.clear();
  for (auto& v : pf.vector_inputs) v.splat = -1;
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
bool same_bits(const sc::Tensor& a, const sc::Tensor& b) {
  const std::vector<T> x = a.to_vector<T>(), y = b.to_vector<T>();
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
}

/// Which inputs pf reads as single values.
std::vector<int> splats(const g::PreparedFused& pf) {
  std::vector<int> s;
  for (const auto& v : pf.vector_inputs)
    if (v.splat >= 0) s.push_back(v.input);
  return s;
}

}  // namespace

TEMPLATE_TEST_CASE("fused: a row-broadcast input is read as one value in a tile inside a row, with the gathered run's bits",
                   "[fused][splat]", float, double) {
  using T = TestType;
  const sc::DType d = sc::dtype_of<T>();
  // inputs x [..., C], m and s one per row, w [C], k one value:
  // c = (x - m) * s; y = tanh(m / c * w + k); outputs y and c, and with a reduction sum(c * c) per row.
  struct Case {
    sc::Shape out, row;  // the output and the shape of m and s
  };
  const std::vector<Case> cases = {
      {{40, 1024}, {40, 1}},  // every tile inside a row (f32: two per row)
      {{37, 700}, {37, 1}},   // tiles inside a row, and tiles across two rows
      {{50, 3}, {50, 1}},     // every tile across rows: gathered always
      {{9, 2000}, {9, 1}},    // a row's last tile partial
      {{4, 6, 300}, {4, 6, 1}},
      {{4, 6, 300}, {4, 1, 1}},  // one value per 1800 elements (axes merged)
  };
  const OpId sub = op("sub"), mul = op("mul"), div = op("div"), add = op("add"), tanh = op("tanh"), sum = op("sum");
  std::uint64_t seed = 7;
  for (const Case& c : cases)
    for (const bool reduce : {false, true})
      for (const std::int64_t tile : {std::int64_t{0}, std::int64_t{7}, std::int64_t{1000}})
        for (const int threads : {1, 2}) {
          const std::int64_t C = c.out[c.out.rank() - 1];
          const std::vector<sc::Shape> shapes = {c.out, c.row, c.row, sc::Shape{C}, sc::Shape{}};
          std::vector<sc::Tensor> in;
          for (const sc::Shape& s : shapes) in.push_back(make<T>(s, ++seed));
          g::FusedProgram p{d, c.out, shapes,
                            {{sub, 0, 1}, {mul, 5, 2}, {div, 1, 6}, {mul, 7, 3}, {add, 8, 4}, {tanh, 9}, {mul, 6, 6}},
                            {10, 6}};
          if (reduce) {
            sc::Shape rows = c.out;
            rows[rows.rank() - 1] = 1;
            p.reduction = g::FusedReduction{sum, 11, C, rows};
          }
          g::PreparedFused pf = g::prepare(p);
          if (tile > 0) pf.tile = tile;
          INFO("output " << c.out << ", m " << c.row << (reduce ? ", reduced" : "") << ", tile " << pf.tile << ", "
                         << threads << " threads");
          CHECK(splats(pf) == std::vector<int>{1, 2});
          CHECK(pf.per_tile_splat.size() == pf.per_tile.size());
          const sctest::ThreadCount on(threads);
          const std::vector<sc::Tensor> got = run(pf, in), want = run(gathered(pf), in);
          REQUIRE(got.size() == want.size());
          for (std::size_t j = 0; j < got.size(); ++j) {
            INFO("output " << j);
            CHECK(same_bits<T>(got[j], want[j]));
          }
          // the centred, scaled values against a plain loop (sub and mul are exact: same bits)
          const std::vector<T> x = in[0].to_vector<T>(), m = in[1].to_vector<T>(), s = in[2].to_vector<T>();
          const std::vector<T> cv = got[1].to_vector<T>();
          const std::int64_t per = c.out.numel() / c.row.numel();  // elements per value of m
          std::int64_t bad = 0;
          for (std::size_t i = 0; i < x.size(); ++i) {
            const std::size_t r = i / static_cast<std::size_t>(per);
            bad += cv[i] != static_cast<T>((x[i] - m[r]) * s[r]);
          }
          CHECK(bad == 0);
        }
}

TEST_CASE("fused: inputs not read as one value: read by a unary op, against each other or a single value, copied out",
          "[fused][splat]") {
  const sc::DType d = sc::DType::f32;
  const sc::Shape out{16, 1024}, row{16, 1};
  const std::vector<sc::Shape> shapes = {out, row, row, sc::Shape{}};
  const OpId sub = op("sub"), mul = op("mul"), add = op("add"), sqrt = op("sqrt"), neg = op("neg");
  struct Case {
    std::string what;
    std::vector<g::FusedInstr> code;
    std::vector<int> outputs, want;  // the program's outputs; the inputs read as single values
  };
  const std::vector<Case> cases = {
      {"m read by sqrt", {{sqrt, 1}, {add, 0, 4}, {sub, 5, 2}}, {6}, {2}},
      {"m - s, then x * that", {{sub, 1, 2}, {mul, 0, 4}}, {5}, {}},
      {"m times the single value k", {{mul, 1, 3}, {add, 0, 4}, {mul, 5, 2}}, {6}, {2}},
      {"m written out as it is", {{sub, 0, 1}, {mul, 4, 2}}, {5, 1}, {2}},
      {"m - m", {{sub, 1, 1}, {add, 0, 4}}, {5}, {}},
      {"x - m, no other reader", {{sub, 0, 1}, {neg, 4}, {mul, 5, 2}}, {6}, {1, 2}},
  };
  std::uint64_t seed = 90;
  for (const Case& c : cases) {
    INFO(c.what);
    const g::FusedProgram p{d, out, shapes, c.code, c.outputs};
    const g::PreparedFused pf = g::prepare(p);
    CHECK(splats(pf) == c.want);
    CHECK(pf.per_tile_splat.empty() == c.want.empty());
    std::vector<sc::Tensor> in;
    for (const sc::Shape& s : shapes) in.push_back(make<float>(s, ++seed));
    const std::vector<sc::Tensor> got = run(pf, in), want = run(gathered(pf), in);
    for (std::size_t j = 0; j < got.size(); ++j) CHECK(same_bits<float>(got[j], want[j]));
  }
}

TEMPLATE_TEST_CASE("fused: a row broadcast over rows is read in place in a tile inside a row, against plain loops",
                   "[fused][splat]", float, double) {
  using T = TestType;
  const sc::DType d = sc::dtype_of<T>();
  // inputs x [..., C] and w, a row over x's rows (maybe a window of a larger tensor):
  // y = (x - w) * w; outputs y and w as it is; with a reduction, each row's sum of w
  struct Case {
    sc::Shape out, w;
    g::FusedWindow window;  // w's, if any
  };
  const std::vector<Case> cases = {
      {{40, 1024}, {1024}, {}},           // every tile inside a row (f32: two per row)
      {{37, 700}, {700}, {}},             // tiles inside a row, and tiles across two rows
      {{50, 3}, {3}, {}},                 // every tile across rows: gathered always
      {{4, 6, 300}, {6, 300}, {}},        // runs of 1800 (axes merged)
      {{3, 4, 200}, {3, 1, 200}, {}},     // runs of 200 only
      {{30, 500}, {1, 500}, {{4, 520}, {2, 9}}},  // a window's row
  };
  const OpId sub = op("sub"), mul = op("mul"), sum = op("sum");
  std::uint64_t seed = 300;
  for (const Case& c : cases)
    for (const bool reduce : {false, true})
      for (const std::int64_t tile : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, std::int64_t{700}})
        for (const int threads : {1, 2}) {
          const std::int64_t C = c.out[c.out.rank() - 1];
          const sc::Tensor x = make<T>(c.out, ++seed), w = make<T>(c.window.on() ? c.window.parent : c.w, ++seed);
          g::FusedProgram p{d, c.out, {c.out, c.w}, {{sub, 0, 1}, {mul, 2, 1}}, {3, 1}};
          if (c.window.on()) p.windows = {{}, c.window};
          if (reduce) {
            sc::Shape rows = c.out;
            rows[rows.rank() - 1] = 1;
            p.reduction = g::FusedReduction{sum, 1, C, rows};
          }
          g::PreparedFused pf = g::prepare(p);
          if (tile > 0) pf.tile = tile;
          INFO("output " << c.out << ", w " << c.w << ", tile " << pf.tile << (reduce ? ", reduced, " : ", ") << threads
                         << " threads");
          const sctest::ThreadCount on(threads);
          const std::vector<sc::Tensor> got = run(pf, {x, w});
          REQUIRE(got.size() == (reduce ? 3u : 2u));
          // the row each output element reads: w's element at (its index modulo w's numel, as the
          // broadcast repeats w over the leading axes, with size-1 axes of w repeating their row)
          const std::vector<T> xv = x.to_vector<T>(), wv = w.to_vector<T>(), y = got[0].to_vector<T>();
          const std::vector<T> wo = got[1].to_vector<T>();
          std::vector<T> row_of(static_cast<std::size_t>(c.out.numel()));
          const sc::Shape ws = sc::broadcast_strides(c.w, c.out);
          for (std::int64_t i = 0; i < c.out.numel(); ++i) {
            std::int64_t off = 0, rem = i;
            std::vector<std::int64_t> idx(static_cast<std::size_t>(c.out.rank()));
            for (int k = c.out.rank() - 1; k >= 0; --k)
              idx[static_cast<std::size_t>(k)] = rem % c.out[k], rem /= c.out[k];
            if (c.window.on()) {  // w [1, C] at begin of its parent: element (0, j) is parent (b0, b1 + j)
              off = c.window.begin[0] * c.window.parent[1] + c.window.begin[1] + idx.back();
            } else {
              for (int k = 0; k < c.out.rank(); ++k) off += idx[static_cast<std::size_t>(k)] * ws[k];
            }
            row_of[static_cast<std::size_t>(i)] = wv[static_cast<std::size_t>(off)];
          }
          std::int64_t bad = 0;
          for (std::size_t i = 0; i < xv.size(); ++i) {
            bad += y[i] != static_cast<T>((xv[i] - row_of[i]) * row_of[i]);
            bad += wo[i] != row_of[i];
          }
          CHECK(bad == 0);
          if (!reduce) continue;
          const std::vector<T> sums = got[2].to_vector<T>();
          for (std::size_t r = 0; r < sums.size(); ++r) {
            double want = 0;
            for (std::size_t j = 0; j < static_cast<std::size_t>(C); ++j)
              want += static_cast<double>(row_of[r * static_cast<std::size_t>(C) + j]);
            CHECK(static_cast<double>(sums[r]) == Approx(want).epsilon(1e-5));
          }
        }
}
