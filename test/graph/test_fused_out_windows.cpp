// The fused evaluator's outputs written through windows of larger tensors (FusedProgram::
// out_windows, out_args: a concat the fusion pass took into the group), against plain loops:
// concats along every axis, single values and inputs written out, a reduction and products
// beside them, any tile size and thread count; and the programs and tensors it refuses.
#include <catch2/catch.hpp>
#include <stagecraft/backend/cpu/parallel.hpp>
#include <stagecraft/core/creation.hpp>
#include <stagecraft/fwd.hpp>
#include <stagecraft/graph/fused_kernel.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "fused_testing.hpp"
#include "testing.hpp"

namespace {

namespace g = sc::graph;
using sc::ops::OpId;

/// n values of T in [-8, 8) (integers: small, so that products stay exact), from seed.
template <class T>
std::vector<T> some_values(std::int64_t n, std::uint64_t seed) {
  sctest::Rng r(seed);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (T& x : v) x = static_cast<T>(static_cast<int>(r.next() % 1024) - 512) / static_cast<T>(64);
  if constexpr (std::is_integral_v<T>)
    for (T& x : v) x = static_cast<T>(static_cast<int>(r.next() % 17) - 8);
  return v;
}

/// Row-major offset of multi-index idx in shape s.
std::int64_t offset_in(const sc::Shape& s, const std::vector<std::int64_t>& idx) {
  std::int64_t off = 0;
  for (int d = 0; d < s.rank(); ++d) off = off * s[d] + idx[static_cast<std::size_t>(d)];
  return off;
}

/// The multi-index of flat element i of shape s.
std::vector<std::int64_t> index_of(const sc::Shape& s, std::int64_t i) {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(s.rank()));
  for (int d = s.rank() - 1; d >= 0; --d) {
    idx[static_cast<std::size_t>(d)] = i % s[d];
    i /= s[d];
  }
  return idx;
}

/// Writes out-shaped values `v` into `dst` (shape parent) at `begin`, by multi-indices.
template <class T>
void put(std::vector<T>& dst, const sc::Shape& parent, const sc::Shape& out, const sc::Shape& begin, const std::vector<T>& v) {
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    std::vector<std::int64_t> idx = index_of(out, i);
    for (int d = 0; d < out.rank(); ++d) idx[static_cast<std::size_t>(d)] += begin[d];
    dst[static_cast<std::size_t>(offset_in(parent, idx))] = v[static_cast<std::size_t>(i)];
  }
}

/// The parent shape of `pieces` out-shaped windows side by side along `axis`, and piece k's begin.
sc::Shape concat_shape(const sc::Shape& out, int axis, int pieces) {
  sc::Shape s = out;
  s[axis] *= pieces;
  return s;
}
sc::Shape begin_of(const sc::Shape& out, int axis, int k) {
  sc::Shape b;
  for (int d = 0; d < out.rank(); ++d) b.push_back(d == axis ? k * out[d] : 0);
  return b;
}

using sctest::fused::prepare_error;

}  // namespace

TEMPLATE_TEST_CASE("outputs written through windows of one tensor (a concat taken into the group) equal plain loops",
                   "[fused][out_window]", float, double, std::int32_t, std::int64_t) {
  using T = TestType;
  const sc::DType d = sc::dtype_of<T>();
  // Registers: 0 a [out], 1 b [out], 2 c [1, ..., last] (broadcast), 3 s [] (one value);
  // 4 = a + b, 5 = 4 * c, 6 = s * s (one value), 7 = neg(5).
  // Tensor 0 (a concat of four along `axis`): a + b, (a + b) * c, s * s, and the input a itself;
  // tensor 1: neg((a + b) * c), whole.
  for (const sc::Shape& out : {sc::Shape{37, 45}, sc::Shape{3, 5, 7}, sc::Shape{1, 300}, sc::Shape{2000}})
    for (int axis = 0; axis < out.rank(); ++axis) {
      INFO("out " << out.str() << " concat axis " << axis << " " << sc::name(d));
      sc::Shape cs;
      for (int k = 0; k < out.rank(); ++k) cs.push_back(k + 1 == out.rank() ? out[k] : 1);
      g::FusedProgram p{d, out, {out, out, cs, {}}, {{OpId::Add, 0, 1}, {OpId::Mul, 4, 2}, {OpId::Mul, 3, 3}, {OpId::Neg, 5}},
                        {4, 5, 6, 0, 7}};
      const sc::Shape parent = concat_shape(out, axis, 4);
      for (int k = 0; k < 4; ++k) p.out_windows.push_back({parent, begin_of(out, axis, k)});
      p.out_windows.emplace_back();
      p.out_args = {0, 0, 0, 0, 1};
      REQUIRE(prepare_error(p) == "no error");
      REQUIRE(p.num_out_args() == 2);
      REQUIRE(p.out_arg_shape(0) == parent);
      const std::int64_t n = out.numel();
      const auto a = some_values<T>(n, 1), b = some_values<T>(n, 2), c = some_values<T>(cs.numel(), 3),
                 s = some_values<T>(1, 4);
      std::vector<T> sum(static_cast<std::size_t>(n)), prod(sum.size()), sq(sum.size(), static_cast<T>(s[0] * s[0])),
          neg(sum.size());
      for (std::int64_t i = 0; i < n; ++i) {
        const auto u = static_cast<std::size_t>(i);
        sum[u] = static_cast<T>(a[u] + b[u]);
        prod[u] = static_cast<T>(sum[u] * c[static_cast<std::size_t>(i % cs.numel())]);
        neg[u] = static_cast<T>(-prod[u]);
      }
      std::vector<T> want(static_cast<std::size_t>(parent.numel()));
      put(want, parent, out, begin_of(out, axis, 0), sum);
      put(want, parent, out, begin_of(out, axis, 1), prod);
      put(want, parent, out, begin_of(out, axis, 2), sq);
      put(want, parent, out, begin_of(out, axis, 3), a);
      const std::vector<sc::Tensor> in = {sc::tensor(a, out), sc::tensor(b, out), sc::tensor(c, cs), sc::tensor(s, sc::Shape{})};
      for (std::int64_t tile : {std::int64_t{0}, std::int64_t{16}, std::int64_t{5}, std::int64_t{1}})
        for (int threads : {1, sc::num_threads()}) {
          INFO("tile " << tile << " threads " << threads);
          g::PreparedFused pf = g::prepare(p);
          if (tile > 0) pf.tile = tile;
          std::vector<sc::Tensor> o = {sc::full(parent, -99.0, d), sc::full(out, -99.0, d)};
          const sctest::ThreadCount scope(threads);
          g::run(pf, in, o);
          CHECK(o[0].to_vector<T>() == want);
          CHECK(o[1].to_vector<T>() == neg);
        }
    }
}

TEST_CASE("windowed outputs beside a reduction and formed products", "[fused][out_window][reduce][product]") {
  // x = A B (a formed product [R, C], A [R, K], B [K, C]); y = x * w (w [C]); tensor 0 = concat of
  // x and y along axis 1, tensor 1 = each row of y summed.
  constexpr std::int64_t R = 19, K = 7, C = 130;
  const auto a = some_values<double>(R * K, 5), b = some_values<double>(K * C, 6), w = some_values<double>(C, 7);
  g::FusedProgram p{sc::f64, {R, C}, {{R, C}, {C}, {K, C}}, {{OpId::Mul, 0, 1}}, {0, 3}};
  p.products = {{{R, K}, 2, false, false, false}, {}, {{}, -1, false, false, true}};
  p.out_windows = {{{R, 2 * C}, {0, 0}}, {{R, 2 * C}, {0, C}}};
  p.out_args = {0, 0};
  p.reduction = g::FusedReduction{OpId::Sum, 3, C, sc::Shape{R}};
  std::vector<double> want(static_cast<std::size_t>(2 * R * C)), rows(static_cast<std::size_t>(R), 0.0);
  for (std::int64_t i = 0; i < R; ++i)
    for (std::int64_t j = 0; j < C; ++j) {
      double x = 0;
      for (std::int64_t t = 0; t < K; ++t) x += a[static_cast<std::size_t>(i * K + t)] * b[static_cast<std::size_t>(t * C + j)];
      const double y = x * w[static_cast<std::size_t>(j)];
      want[static_cast<std::size_t>(i * 2 * C + j)] = x;
      want[static_cast<std::size_t>(i * 2 * C + C + j)] = y;
      rows[static_cast<std::size_t>(i)] += y;
    }
  std::vector<sc::Tensor> o = {sc::full({R, 2 * C}, -99.0, sc::f64), sc::zeros({R}, sc::f64)};
  g::run_fused(p, std::vector<sc::Tensor>{sc::tensor(a, sc::Shape{R, K}), sc::tensor(w, sc::Shape{C}), sc::tensor(b, sc::Shape{K, C})}, o);
  const auto got = o[0].to_vector<double>(), sums = o[1].to_vector<double>();
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i);
    CHECK(got[i] == Approx(want[i]).epsilon(1e-12).margin(1e-12));
  }
  for (std::size_t i = 0; i < rows.size(); ++i) CHECK(sums[i] == Approx(rows[i]).epsilon(1e-12).margin(1e-12));
}

TEST_CASE("invalid output windows and tensors are named errors", "[fused][out_window][errors]") {
  // out [4, 6]: a + b and a * b side by side in tensor 0 [4, 12]
  g::FusedProgram p{sc::f32, {4, 6}, {{4, 6}, {4, 6}}, {{OpId::Add, 0, 1}, {OpId::Mul, 0, 1}}, {2, 3}};
  p.out_windows = {{{4, 12}, {0, 0}}, {{4, 12}, {0, 6}}};
  p.out_args = {0, 0};
  REQUIRE(prepare_error(p) == "no error");
  g::FusedProgram q = p;
  q.out_windows[1].begin = {0, 3};
  CHECK_THAT(prepare_error(q), Catch::Contains("output 1's window at [0, 3] overlaps output 0's at [0, 0]"));
  q = p;
  q.out_windows[1].begin = {0, 7};
  CHECK_THAT(prepare_error(q), Catch::Contains("output 1 of shape [4, 6] is not a window of [4, 12] at [0, 7]"));
  q = p;
  q.out_windows[1].parent = {8, 6};
  q.out_windows[1].begin = {4, 0};
  CHECK_THAT(prepare_error(q), Catch::Contains("writes a window of [8, 6] into output tensor 0 of shape [4, 12]"));
  q = p;
  q.out_windows[0].parent = q.out_windows[1].parent = {4, 18};
  CHECK_THAT(prepare_error(q), Catch::Contains("output tensor 0 of shape [4, 18] is not covered"));
  q = p;
  q.out_windows.pop_back();
  CHECK_THAT(prepare_error(q), Catch::Contains("1 output windows for 2 outputs"));
  q = p;
  q.out_args = {0, 2};
  CHECK_THAT(prepare_error(q), Catch::Contains("output tensor 1 is written by no output"));
  q = p;
  q.out_windows[1] = {};
  CHECK_THAT(prepare_error(q), Catch::Contains("output tensor 0 is written whole by an output and by another output too"));
  q = p;
  q.out_args = {0, -1};
  CHECK_THAT(prepare_error(q), Catch::Contains("output 1 names output tensor -1"));
  // The tensors: one [4, 12] tensor (not two [4, 6]); no input may share its memory.
  const sc::Tensor x = sc::ones({4, 6}), y = sc::ones({4, 6});
  std::vector<sc::Tensor> two = {sc::zeros({4, 6}), sc::zeros({4, 6})};
  CHECK_THROWS_WITH(g::run_fused(p, std::vector<sc::Tensor>{x, y}, two), Catch::Contains("takes 2 inputs and 1 outputs, got 2 and 2"));
  std::vector<sc::Tensor> wrong = {sc::zeros({4, 6})};
  CHECK_THROWS_WITH(g::run_fused(p, std::vector<sc::Tensor>{x, y}, wrong),
                    Catch::Contains("output 0 has shape [4, 6], the program expects [4, 12]"));
  std::vector<sc::Tensor> one = {sc::zeros({4, 12})};
  CHECK_NOTHROW(g::run_fused(p, std::vector<sc::Tensor>{x, y}, one));
  CHECK(one[0].to_vector<float>() == std::vector<float>{2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1,
                                                        2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1});
  // an input viewing the output tensor's second row: refused before anything is written
  const sc::Tensor inside = sc::from_blob(static_cast<float*>(one[0].raw_data()) + 12, sc::Shape{4, 6});
  CHECK_THROWS_WITH(g::run_fused(p, std::vector<sc::Tensor>{x, inside}, one),
                    Catch::Contains("input 1 shares memory with an output tensor written through windows"));
}

namespace {

/// Every tile [t0, t0 + len) of `out` (lengths 1, 2, 3, the innermost run's, all of out) reading
/// input `in` (broadcast to out) through the collapsed plan: each(base, plan, t0, len, in_one_run,
/// offset), where in_one_run says whether the tile lies in one run of the plan's innermost axis
/// and offset(i), the reference, unravels position i over out's own axes.
template <class Each>
void for_each_tile(const sc::Shape& in, const sc::Shape& out, const Each& each) {
  const sc::Shape st[1] = {sc::broadcast_strides(in, out)};
  const sc::backend::cpu::StridedPlan<1> plan = sc::backend::cpu::collapse_strides<1>(out, st);
  const std::int64_t n = out.numel();
  const auto offset = [&](std::int64_t i) {
    std::int64_t off = 0;
    for (int d = out.rank() - 1; d >= 0; --d) {
      off += i % out[d] * st[0][d];
      i /= out[d];
    }
    return off;
  };
  const std::int64_t inner = plan.shape[plan.shape.rank() - 1];
  const std::vector<float> buf(static_cast<std::size_t>(in.numel()));
  for (std::int64_t len : {std::int64_t{1}, std::int64_t{2}, std::int64_t{3}, inner, n})
    for (std::int64_t t0 = 0; t0 + len <= n; ++t0) {
      INFO("in " << in.str() << ", out " << out.str() << ", t0 " << t0 << ", len " << len);
      each(buf.data(), plan, t0, len, t0 / inner == (t0 + len - 1) / inner, offset);
    }
}

/// The plan's innermost stride.
std::int64_t inner_stride(const sc::backend::cpu::StridedPlan<1>& plan) {
  return plan.strides[0][plan.shape.rank() - 1];
}

}  // namespace

TEST_CASE("constant_run: the one element a tile of a broadcast input reads, against unravelled indices", "[fused]") {
  const auto check = [](const sc::Shape& in, const sc::Shape& out) {
    for_each_tile(in, out, [](const float* base, const auto& plan, std::int64_t t0, std::int64_t len, bool in_one_run,
                              const auto& offset) {
      const float* got = g::detail_fused::constant_run<float>(base, plan, t0, len);
      const bool one_run = inner_stride(plan) == 0 && in_one_run;
      REQUIRE((got != nullptr) == one_run);
      if (!one_run) return;
      CHECK(got - base == offset(t0));
      for (std::int64_t i = t0; i < t0 + len; ++i) CHECK(offset(i) == offset(t0));
    });
  };
  check(sc::Shape{7, 1}, sc::Shape{7, 9});
  check(sc::Shape{5, 1, 4, 1}, sc::Shape{5, 3, 4, 6});
  check(sc::Shape{1, 3, 1, 1}, sc::Shape{5, 3, 4, 6});
  check(sc::Shape{5, 3, 4, 1}, sc::Shape{5, 3, 4, 6});
  check(sc::Shape{3, 1, 1}, sc::Shape{3, 4, 5});
  check(sc::Shape{1}, sc::Shape{8});
  check(sc::Shape{2, 1, 3, 1}, sc::Shape{2, 5, 3, 4});
}

TEST_CASE("contiguous_run: the row a tile of a broadcast input reads in place, against unravelled indices", "[fused]") {
  // contiguous_run gives a tile in place exactly when its positions are consecutive elements of
  // the input within one run of the plan's innermost axis
  const auto check = [](const sc::Shape& in, const sc::Shape& out) {
    std::int64_t in_place = 0;
    for_each_tile(in, out, [&](const float* base, const auto& plan, std::int64_t t0, std::int64_t len, bool in_one_run,
                               const auto& offset) {
      const float* got = g::detail_fused::contiguous_run<float>(base, plan, t0, len);
      const bool one_run = inner_stride(plan) == 1 && in_one_run;
      REQUIRE((got != nullptr) == one_run);
      if (!one_run) return;
      ++in_place;
      for (std::int64_t i = t0; i < t0 + len; ++i) REQUIRE(got + (i - t0) - base == offset(i));
    });
    return in_place;
  };
  CHECK(check(sc::Shape{9}, sc::Shape{7, 9}) > 0);          // a row over rows (layer_norm's gamma)
  CHECK(check(sc::Shape{4, 6}, sc::Shape{5, 3, 4, 6}) > 0);  // merged axes: runs of 24
  CHECK(check(sc::Shape{3, 1, 6}, sc::Shape{5, 3, 4, 6}) > 0);
  CHECK(check(sc::Shape{1, 1, 4, 6}, sc::Shape{2, 3, 4, 6}) > 0);
  CHECK(check(sc::Shape{7, 1}, sc::Shape{7, 9}) == 0);  // broadcast along the innermost axis: never
  CHECK(check(sc::Shape{3, 1}, sc::Shape{2, 3, 4}) == 0);
}
