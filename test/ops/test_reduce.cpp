// Reductions (sum mean max min logsumexp argmax argmin) against plain-loop references.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>
#include <stagecraft/backend/cpu/reduce_stream.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "testing.hpp"

namespace {

using sc::Shape;
using i64 = std::int64_t;
constexpr double inf = std::numeric_limits<double>::infinity();
constexpr double nan_v = std::numeric_limits<double>::quiet_NaN();

using sctest::Rng;

// A test input: the tensor and its values as doubles (exact for every dtype used here).
struct Input {
  sc::Tensor t;
  std::vector<double> v;
  Shape shape;
  sc::DType dtype;
};

// Values for a dtype: floats in [-10, 10) (or small integers when `ties`), ints in [-20, 20]
// (so no sum wraps), bools 0/1. `nans` puts a NaN at roughly that fraction of float places.
Input make_input(sc::DType d, Shape s, std::uint64_t seed, bool ties = false, double nans = 0) {
  Rng rng(seed);
  const i64 n = s.numel();
  Input in{{}, std::vector<double>(static_cast<std::size_t>(n)), s, d};
  for (auto& x : in.v) {
    if (d == sc::boolean) x = rng.next() % 2;
    else if (d == sc::i32 || d == sc::i64 || ties) x = static_cast<double>(static_cast<i64>(rng.next() % 41) - 20) / (ties ? 5 : 1);
    else x = rng.uniform() * 20 - 10;
    if (ties) x = std::floor(x);
    if (d == sc::f32) x = static_cast<float>(x);
    if (nans > 0 && sc::is_floating(d) && rng.uniform() < nans) x = nan_v;
  }
  if (d == sc::f32) in.t = sc::tensor(std::vector<float>(in.v.begin(), in.v.end()), s);
  else if (d == sc::f64) in.t = sc::tensor(in.v, s);
  else if (d == sc::i64) in.t = sc::tensor(std::vector<i64>(in.v.begin(), in.v.end()), s);
  else in.t = sc::tensor(std::vector<std::int32_t>(in.v.begin(), in.v.end()), s);
  if (d == sc::boolean) in.t = sc::cast(in.t, sc::boolean);
  return in;
}

// The reduced axes as flags ({} = all), the output shape, and each input element's output slot.
struct Plan {
  std::vector<bool> mask;
  Shape out_shape;
  std::vector<i64> slot;
  i64 n_out = 1;
};
Plan plan_of(const Shape& s, const std::vector<i64>& axes, bool keepdims) {
  Plan p;
  const int r = s.rank();
  p.mask.assign(static_cast<std::size_t>(r), axes.empty());
  for (i64 a : axes) p.mask[static_cast<std::size_t>(a < 0 ? a + r : a)] = true;
  for (int i = 0; i < r; ++i) {
    if (!p.mask[i]) p.out_shape.push_back(s[i]), p.n_out *= s[i];
    else if (keepdims) p.out_shape.push_back(1);
  }
  const i64 n = s.numel();
  p.slot.resize(static_cast<std::size_t>(n));
  for (i64 k = 0; k < n; ++k) {
    i64 rem = k, o = 0, mul = 1;
    for (int i = r - 1; i >= 0; --i) {
      const i64 idx = rem % s[i];
      rem /= s[i];
      if (!p.mask[i]) o += idx * mul, mul *= s[i];
    }
    p.slot[static_cast<std::size_t>(k)] = o;
  }
  return p;
}

// Naive reductions, grouped by output slot.
struct Ref {
  std::vector<long double> sum, abs_sum, max, min, lse;
  std::vector<i64> count;
};
Ref reference(const Input& in, const Plan& p) {
  const auto no = static_cast<std::size_t>(p.n_out);
  Ref r{std::vector<long double>(no, 0), std::vector<long double>(no, 0), std::vector<long double>(no, 0),
        std::vector<long double>(no, 0), std::vector<long double>(no, 0), std::vector<i64>(no, 0)};
  for (std::size_t k = 0; k < in.v.size(); ++k) {
    const auto o = static_cast<std::size_t>(p.slot[k]);
    const long double x = in.v[k];
    r.sum[o] += x;
    r.abs_sum[o] += std::fabs(x);
    const bool first = r.count[o] == 0;
    if (first || (!std::isnan(r.max[o]) && (std::isnan(x) || x > r.max[o]))) r.max[o] = x;
    if (first || (!std::isnan(r.min[o]) && (std::isnan(x) || x < r.min[o]))) r.min[o] = x;
    ++r.count[o];
  }
  // logsumexp: shift by the max where it is finite, in long double
  std::vector<long double> acc(no, 0);
  for (std::size_t k = 0; k < in.v.size(); ++k) {
    const auto o = static_cast<std::size_t>(p.slot[k]);
    const long double m = std::isfinite(r.max[o]) ? r.max[o] : 0;
    acc[o] += std::exp(static_cast<long double>(in.v[k]) - m);
  }
  for (std::size_t o = 0; o < no; ++o)
    r.lse[o] = std::log(acc[o]) + (std::isfinite(r.max[o]) && r.count[o] ? r.max[o] : 0);
  return r;
}

std::string describe(const Input& in, const std::vector<i64>& axes, bool keepdims) {
  std::ostringstream os;
  os << sc::name(in.dtype) << " shape " << in.shape << " axes [";
  for (i64 a : axes) os << a << ' ';
  os << "] keepdims " << keepdims;
  return os.str();
}

bool same_value(double got, long double want, double tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - static_cast<double>(want)) <= tol;
}

// Checks sum, max, min, mean and logsumexp of one input over one axis list against Ref.
void check_axis_reductions(const Input& in, const std::vector<i64>& axes, bool keepdims) {
  INFO(describe(in, axes, keepdims));
  const Plan p = plan_of(in.shape, axes, keepdims);
  const Ref ref = reference(in, p);
  const bool fl = sc::is_floating(in.dtype);
  const double eps = in.dtype == sc::f64 ? 1e-13 : 2e-5;

  const sc::Tensor s = sc::sum(in.t, axes, keepdims);
  CHECK(s.shape() == p.out_shape);
  CHECK(s.dtype() == (in.dtype == sc::boolean ? sc::i64 : in.dtype));
  const auto sv = s.to_vector<double>();
  int bad = 0;
  for (std::size_t o = 0; o < sv.size(); ++o) bad += !same_value(sv[o], ref.sum[o], fl ? eps * ref.abs_sum[o] : 0);
  CHECK(bad == 0);

  const sc::Tensor mn = sc::mean(in.t, axes, keepdims);
  CHECK(mn.shape() == p.out_shape);
  CHECK(mn.dtype() == (fl ? in.dtype : sc::f32));
  const auto mv = mn.to_vector<double>();
  bad = 0;
  for (std::size_t o = 0; o < mv.size(); ++o) {
    const long double c = static_cast<long double>(ref.count[o]);
    bad += !same_value(mv[o], c ? ref.sum[o] / c : nan_v, (in.dtype == sc::f64 ? 1e-13 : 2e-5) * (1 + ref.abs_sum[o] / (c ? c : 1)));
  }
  CHECK(bad == 0);

  bool empty_axis = false;  // max/min over an empty axis throw, whatever the output size
  for (int i = 0; i < in.shape.rank(); ++i) empty_axis |= p.mask[i] && in.shape[i] == 0;
  for (const bool is_max : {true, false}) {
    if (empty_axis) {
      CHECK_THROWS_AS(is_max ? sc::max(in.t, axes, keepdims) : sc::min(in.t, axes, keepdims), sc::ValueError);
      continue;
    }
    const sc::Tensor m = is_max ? sc::max(in.t, axes, keepdims) : sc::min(in.t, axes, keepdims);
    CHECK(m.shape() == p.out_shape);
    CHECK(m.dtype() == in.dtype);
    const auto v = m.to_vector<double>();
    bad = 0;
    for (std::size_t o = 0; o < v.size(); ++o) bad += !same_value(v[o], is_max ? ref.max[o] : ref.min[o], 0);
    CHECK(bad == 0);
  }

  const sc::Tensor l = sc::logsumexp(in.t, axes, keepdims);
  CHECK(l.shape() == p.out_shape);
  CHECK(l.dtype() == (fl ? in.dtype : sc::f32));
  const auto lv = l.to_vector<double>();
  bad = 0;
  for (std::size_t o = 0; o < lv.size(); ++o) {
    const long double want = ref.count[o] ? ref.lse[o] : -static_cast<long double>(inf);
    bad += !same_value(lv[o], want, (in.dtype == sc::f64 ? 1e-12 : 1e-5) * (1 + std::fabs(static_cast<double>(want))));
  }
  CHECK(bad == 0);
}

// Every axis subset of the shape, in order, and again with negative axes in reverse order.
std::vector<std::vector<i64>> axis_lists(int rank) {
  std::vector<std::vector<i64>> out{{}};
  for (unsigned bits = 1; bits < (1u << rank); ++bits) {
    std::vector<i64> pos, neg;
    for (int i = 0; i < rank; ++i)
      if (bits & (1u << i)) pos.push_back(i);
    for (auto it = pos.rbegin(); it != pos.rend(); ++it) neg.push_back(*it % 2 ? *it - rank : *it);
    out.push_back(pos);
    out.push_back(neg);
  }
  return out;
}

// Naive argmax/argmin: outer, R, inner loops; first occurrence wins; a NaN counts as extreme.
std::vector<i64> ref_arg(const Input& in, int axis, bool is_max) {
  const Shape& s = in.shape;
  if (s.rank() == 0) return {0};
  i64 outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= s[i];
  for (int i = axis + 1; i < s.rank(); ++i) inner *= s[i];
  std::vector<i64> out;
  for (i64 o = 0; o < outer; ++o)
    for (i64 i = 0; i < inner; ++i) {
      i64 best = 0;
      for (i64 r = 0; r < s[axis]; ++r) {
        const double v = in.v[static_cast<std::size_t>((o * s[axis] + r) * inner + i)];
        const double b = in.v[static_cast<std::size_t>((o * s[axis] + best) * inner + i)];
        if (std::isnan(b)) break;
        if (std::isnan(v) || (is_max ? v > b : v < b)) best = r;
      }
      out.push_back(best);
    }
  return out;
}

void check_arg(const Input& in, i64 axis) {
  const int r = in.shape.rank();
  const int k = r == 0 ? 0 : static_cast<int>(axis < 0 ? axis + r : axis);
  INFO(sc::name(in.dtype) << " shape " << in.shape << " axis " << axis);
  for (const bool is_max : {true, false}) {
    const sc::Tensor a = is_max ? sc::argmax(in.t, axis) : sc::argmin(in.t, axis);
    CHECK(a.dtype() == sc::i64);
    Shape want;
    for (int i = 0; i < r; ++i)
      if (i != k) want.push_back(in.shape[i]);
    CHECK(a.shape() == want);
    CHECK(a.to_vector<i64>() == ref_arg(in, k, is_max));
  }
}

const sc::DType all_dtypes[] = {sc::f32, sc::f64, sc::i32, sc::i64, sc::boolean};

}  // namespace

TEST_CASE("axis reductions match plain loops over shapes, axes and dtypes", "[reduce]") {
  const Shape shapes[] = {{}, {1}, {7}, {3, 4}, {1, 1}, {2, 3, 4}, {2, 1, 5}, {0}, {0, 3}, {3, 0}, {4, 0, 2},
                          {2, 3, 4, 5}, {5, 1, 1, 6}, {33, 65}, {3, 300}, {300, 3}, {2, 3, 2, 3, 2}};
  std::uint64_t seed = 1;
  for (const Shape& s : shapes)
    for (const sc::DType d : all_dtypes) {
      const Input in = make_input(d, s, ++seed);
      for (const auto& axes : axis_lists(s.rank()))
        for (const bool keepdims : {false, true}) check_axis_reductions(in, axes, keepdims);
    }
}

TEST_CASE("large reductions take the threaded, split and multi-step paths correctly", "[reduce]") {
  struct Big { Shape shape; std::vector<i64> axes; };
  const Big cases[] = {
      {{1 << 18}, {}},            // one long row: split into chunks, partials reduced again
      {{3, 70000}, {1}},          // few long rows: split
      {{70000, 3}, {0}},          // a long column reduction with a tiny inner: split across rows
      {{40, 3000}, {0}},          // columns with inner > tile
      {{600, 300}, {1}},          // many rows: threads over rows
      {{600, 300}, {0}},          // many columns
      {{2, 50000, 2}, {0, 2}},    // non-adjacent axes: two steps
      {{30, 40, 50}, {0, 2}},
      {{8, 9, 10, 11}, {-3, -1}},
      {{8, 9, 10, 11}, {0, 2, 3}},
  };
  std::uint64_t seed = 100;
  for (const Big& c : cases)
    for (const sc::DType d : {sc::f32, sc::f64, sc::i32, sc::i64}) {
      const Input in = make_input(d, c.shape, ++seed);
      check_axis_reductions(in, c.axes, false);
    }
  const Input b = make_input(sc::boolean, {3, 70000}, 7);
  check_axis_reductions(b, {1}, true);
}

TEST_CASE("float sums are accurate and do not depend on the thread count", "[reduce]") {
  const sc::Tensor ones = sc::ones({1 << 24});
  CHECK(sc::sum(ones).item<float>() == 16777216.f);
  CHECK(sc::mean(ones).item<float>() == 1.f);
  // 2^20 copies of 0.1f: sequential f32 summation is off by about 1e-2 relative here.
  const sc::Tensor tenth = sc::full({1 << 20}, 0.1f);
  const double want = static_cast<double>(0.1f) * (1 << 20);
  CHECK(std::fabs(sc::sum(tenth).item<float>() - want) <= 1e-6 * want);
  CHECK(std::fabs(sc::sum(sc::full({1 << 20, 2}, 0.1f), {0}).to_vector<float>()[1] - want) <= 1e-6 * want);

  const Input in = make_input(sc::f32, {5, 1 << 17}, 11);
  std::vector<std::vector<float>> rows, cols;
  sctest::at_threads({1, 2}, [&](int) {
    rows.push_back(sc::sum(in.t, {1}).to_vector<float>());
    cols.push_back(sc::sum(in.t, {0}).to_vector<float>());
  });
  CHECK(rows[0] == rows[1]);
  CHECK(cols[0] == cols[1]);
}

TEST_CASE("sum and mean dtypes: bool counts as i64, ints keep theirs and wrap, mean of ints is f32", "[reduce]") {
  const sc::Tensor mask = sc::tensor({true, false, true, true});
  CHECK(sc::sum(mask).dtype() == sc::i64);
  CHECK(sc::sum(mask).item<i64>() == 3);
  CHECK(sc::mean(mask).dtype() == sc::f32);
  CHECK(sc::mean(mask).item<float>() == 0.75f);
  const sc::Tensor big = sc::tensor({1 << 30, 1 << 30, 1 << 30});
  CHECK(sc::sum(big).dtype() == sc::i32);
  CHECK(sc::sum(big).item<std::int32_t>() == -(1 << 30));  // 3 * 2^30 wraps modulo 2^32
  CHECK(sc::mean(big).item<float>() == static_cast<float>(1 << 30));  // mean sums in f64: no wrap
  CHECK(sc::sum(sc::tensor({std::int64_t{1} << 40, std::int64_t{1} << 40})).item<i64>() == std::int64_t{1} << 41);
  CHECK(sc::max(mask).item<bool>());
  CHECK_FALSE(sc::min(mask).item<bool>());
}

TEST_CASE("rank-0 inputs and size-1 axes", "[reduce]") {
  const sc::Tensor s = sc::scalar(3.5f);
  for (const bool keep : {false, true}) {
    CHECK(sc::sum(s, {}, keep).shape() == Shape{});
    CHECK(sc::sum(s, {}, keep).item<float>() == 3.5f);
    CHECK(sc::max(s, {}, keep).item<float>() == 3.5f);
    CHECK(sc::min(s, {}, keep).item<float>() == 3.5f);
    CHECK(sc::mean(s, {}, keep).item<float>() == 3.5f);
    CHECK(sc::logsumexp(s, {}, keep).item<float>() == 3.5f);
  }
  CHECK(sc::argmax(s, 0).item<i64>() == 0);
  CHECK(sc::argmin(s, -1).shape() == Shape{});
  CHECK(sc::sum(sc::scalar(true)).item<i64>() == 1);
  const sc::Tensor col = sc::tensor({{1.f}, {2.f}, {3.f}});
  CHECK(sc::sum(col, {1}).shape() == Shape{3});
  CHECK(sc::sum(col, {1}, true).to_vector<float>() == std::vector<float>{1, 2, 3});
  CHECK(sc::max(col, {-1}).to_vector<float>() == std::vector<float>{1, 2, 3});
}

TEST_CASE("sum over an empty axis is 0, mean NaN, logsumexp -inf", "[reduce]") {
  const sc::Tensor e = sc::zeros({3, 0});
  CHECK(sc::sum(e, {1}).to_vector<float>() == std::vector<float>{0, 0, 0});
  CHECK(sc::sum(e).item<float>() == 0.f);
  CHECK(sc::sum(sc::zeros({0}, sc::i32)).item<std::int32_t>() == 0);
  CHECK(sc::sum(e, {0}).shape() == Shape{0});
  CHECK(std::isnan(sc::mean(e, {1}).to_vector<float>()[0]));
  CHECK(sc::logsumexp(e, {1}).to_vector<float>()[2] == -std::numeric_limits<float>::infinity());
  CHECK(sc::max(e, {0}).shape() == Shape{0});  // nothing to reduce into: no error
}

TEST_CASE("NaN propagates through max and min, argmax and argmin pick the first NaN", "[reduce]") {
  const float n = std::numeric_limits<float>::quiet_NaN();
  for (const i64 len : {5, 200}) {  // scalar path and SIMD path
    std::vector<float> v(static_cast<std::size_t>(len), 1.f);
    v[2] = 9.f;
    v[static_cast<std::size_t>(len - 2)] = n;
    v[static_cast<std::size_t>(len - 1)] = n;
    const sc::Tensor t = sc::tensor(v);
    CHECK(std::isnan(sc::max(t).item<float>()));
    CHECK(std::isnan(sc::min(t).item<float>()));
    CHECK(std::isnan(sc::sum(t).item<float>()));
    CHECK(std::isnan(sc::logsumexp(t).item<float>()));
    CHECK(sc::argmax(t, 0).item<i64>() == len - 2);
    CHECK(sc::argmin(t, 0).item<i64>() == len - 2);
  }
  const sc::Tensor m = sc::tensor({{1.f, n, 3.f}, {n, 5.f, 0.f}});
  const auto mx = sc::max(m, {0}).to_vector<float>();
  CHECK((std::isnan(mx[0]) && std::isnan(mx[1]) && mx[2] == 3.f));
  CHECK(sc::argmax(m, 0).to_vector<i64>() == std::vector<i64>{1, 0, 0});
  CHECK(sc::argmin(m, 1).to_vector<i64>() == std::vector<i64>{1, 0});
  // NaN anywhere in a two-step reduction still wins
  const auto two = sc::max(sc::tensor({{{1.f, 2.f}, {3.f, n}}, {{0.f, 1.f}, {2.f, 3.f}}}), {0, 2}).to_vector<float>();
  CHECK((two[0] == 2.f && std::isnan(two[1])));
}

TEST_CASE("argmax and argmin match plain loops, ties give the first index", "[reduce]") {
  const Shape shapes[] = {{1}, {7}, {3, 4}, {2, 3, 4}, {1, 300}, {300, 1}, {4, 130}, {130, 4}, {3, 700, 2}, {2, 5, 300}};
  std::uint64_t seed = 500;
  for (const Shape& s : shapes)
    for (const sc::DType d : all_dtypes)
      for (const double nans : {0.0, 0.02}) {
        const Input in = make_input(d, s, ++seed, /*ties=*/true, nans);
        for (int a = 0; a < s.rank(); ++a) {
          check_arg(in, a);
          check_arg(in, a - s.rank());
        }
      }
  const Input rows = make_input(sc::f32, {4000, 40}, 3);  // threaded over rows
  check_arg(rows, 1);
  check_arg(rows, 0);
}

TEST_CASE("logsumexp is stable for huge values and all -inf rows", "[reduce]") {
  const float fi = std::numeric_limits<float>::infinity();
  const sc::Tensor h = sc::tensor({{1e30f, 1e30f}, {-1e30f, 0.f}, {-fi, -fi}, {-fi, 2.f}, {fi, 1.f}});
  const auto v = sc::logsumexp(h, {1}).to_vector<float>();
  CHECK(v[0] == Approx(1e30f));
  CHECK(std::isfinite(v[0]));
  CHECK(v[1] == 0.f);
  CHECK(v[2] == -fi);
  CHECK(v[3] == 2.f);
  CHECK(v[4] == fi);
  const sc::Tensor k = sc::logsumexp(h, {1}, true);
  CHECK(k.shape() == Shape{5, 1});
  CHECK(k.to_vector<float>()[2] == -fi);
  const sc::Tensor d = sc::tensor({{1000.0, 1000.0}, {-1000.0, -1000.0}, {-inf, -inf}});
  const auto dv = sc::logsumexp(d, {-1}).to_vector<double>();
  CHECK(dv[0] == Approx(1000.0 + std::log(2.0)).epsilon(1e-15));
  CHECK(dv[1] == Approx(-1000.0 + std::log(2.0)).epsilon(1e-15));
  CHECK(dv[2] == -inf);
  CHECK(sc::logsumexp(d).item<double>() == Approx(1000.0 + std::log(2.0)).epsilon(1e-15));
  CHECK(sc::logsumexp(sc::tensor({1, 2, 3})).dtype() == sc::f32);
}

template <class T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

/// reduce_streamed fed the row in runs of random lengths (at most `most`; 1: one element at a time).
template <class Rd, class T>
T reduce_in_runs(const std::vector<T>& row, std::uint64_t seed, i64 most) {
  Rng rng(seed);
  return sc::backend::cpu::reduce_streamed<Rd, T>(static_cast<i64>(row.size()), [&](i64 b, i64 e, auto& leaf) {
    while (b < e) {
      const i64 k = std::min(e - b, 1 + static_cast<i64>(rng.next() % static_cast<std::uint64_t>(most)));
      leaf.add(row.data() + b, k);
      b += k;
    }
  });
}

TEMPLATE_TEST_CASE("a row reduced from runs (the fused evaluator's tiles) gives reduce_row's bits", "[reduce]", float,
                   double, std::int32_t, std::int64_t) {
  namespace cpu = sc::backend::cpu;
  using T = TestType;
  Rng rng(31);
  for (const i64 n : {0, 1, 3, 7, 15, 16, 17, 31, 63, 64, 65, 100, 1023, 1024, 1025, 2047, 3000, 5000, 70001}) {
    std::vector<T> row(static_cast<std::size_t>(n));
    for (T& v : row) v = static_cast<T>(rng.uniform() * 200 - 100);
    for (const i64 most : {i64{1}, i64{5}, i64{100}, i64{1500}, n + 1}) {
      INFO("n " << n << ", runs of at most " << most);
      const auto seed = static_cast<std::uint64_t>(n * 7 + most);
      const T s = reduce_in_runs<cpu::SumReducer, T>(row, seed, most);
      CHECK(same_bits(s, cpu::reduce_row<cpu::SumReducer, T, T>(row.data(), n)));
      if (n == 0) continue;
      if constexpr (std::is_floating_point_v<T>) {  // a NaN in max and min wins wherever it is
        if (n > 2) row[static_cast<std::size_t>(n / 3)] = std::numeric_limits<T>::quiet_NaN();
      }
      const T mx = reduce_in_runs<cpu::MaxReducer, T>(row, seed, most);
      const T mn = reduce_in_runs<cpu::MinReducer, T>(row, seed, most);
      CHECK(same_bits(mx, cpu::reduce_row<cpu::MaxReducer, T, T>(row.data(), n)));
      CHECK(same_bits(mn, cpu::reduce_row<cpu::MinReducer, T, T>(row.data(), n)));
      if (n > 2) row[static_cast<std::size_t>(n / 3)] = T(1);
    }
  }
}

TEST_CASE("reduction errors name the op, the shape and the user's line", "[reduce][errors]") {
  const sc::Tensor x = sc::ones({2, 3});
  auto at = [](int line) { return " at test_reduce.cpp:" + std::to_string(line); };
  int line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::sum(x, {2}), Catch::Contains("[sum] axis 2 is out of range for rank 2" + at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_AS(sc::sum(x, {-3}), sc::ShapeError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::max(x, {1, -1}), Catch::Contains("[max] axis -1 appears twice in axes [1, -1] for shape [2, 3]" + at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_AS(sc::min(x, {0, 0}), sc::ShapeError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::sum(sc::scalar(1.f), {0}), Catch::Contains("[sum] axis 0 is out of range for rank 0" + at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::mean(x, {5}), Catch::Contains("[mean] axis 5 is out of range for rank 2" + at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::logsumexp(x, {0, 0}), Catch::Contains("[logsumexp] axis 0 appears twice in axes [0, 0] for shape [2, 3]" + at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::sum(x, {0, 1, 0, 1, 0, 1, 0, 1, 0}), Catch::Contains("[sum] got 9 axes for shape [2, 3] of rank 2" + at(line)));

  const sc::Tensor e = sc::zeros({0, 3});
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::max(e, {0}), Catch::Contains("[max] cannot reduce over axis 0 of shape [0, 3]: it is empty and max has no identity" + at(line)));
  CHECK_THROWS_AS(sc::max(e, {0}), sc::ValueError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::min(e), Catch::Contains("[min] cannot reduce over axis 0 of shape [0, 3]: it is empty and min has no identity" + at(line)));
  CHECK_THROWS_AS(sc::min(sc::zeros({0})), sc::ValueError);

  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::argmax(x, 2), Catch::Contains("[argmax] axis 2 is out of range for rank 2" + at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::argmin(x, -3), Catch::Contains("[argmin] axis -3 is out of range for rank 2" + at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::argmax(sc::scalar(1.f), 1), Catch::Contains("[argmax] axis 1 is out of range for rank 1" + at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::argmin(sc::zeros({2, 0}), 1), Catch::Contains("[argmin] cannot take argmin over axis 1 of shape [2, 0]: it is empty" + at(line)));
  CHECK_THROWS_AS(sc::argmax(sc::zeros({0}), 0), sc::ValueError);
  CHECK_NOTHROW(sc::argmax(sc::zeros({0, 2}), 1));  // empty output, non-empty axis

  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::sum(sc::Tensor{}), Catch::Contains("[sum] got an undefined tensor") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::argmax(sc::Tensor{}, 0), sc::ValueError);
  CHECK_THROWS_AS(sc::mean(sc::Tensor{}), sc::ValueError);
}
