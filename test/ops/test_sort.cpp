// topk, argsort, sort and take_along_axis: hand-worked values (ties, NaN, -0, every axis),
// threads against a selection loop written here, gradients by central differences, traced equal
// to eager, errors.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "testing.hpp"

using sctest::error_of;

namespace {
using I64s = std::vector<std::int64_t>;

/// The indices of each line's k best along `axis` by k plain scans (the first of equals kept),
/// a NaN above every number: the order top_k documents, found another way.
I64s select_k(const std::vector<double>& x, const sc::Shape& s, int axis, std::int64_t k, bool largest) {
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= s[d];
  for (int d = axis + 1; d < s.rank(); ++d) inner *= s[d];
  const std::int64_t n = s[axis];
  I64s out(static_cast<std::size_t>(outer * k * inner));
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i) {
      std::vector<bool> taken(static_cast<std::size_t>(n));
      const auto at = [&](std::int64_t j) { return x[static_cast<std::size_t>((o * n + j) * inner + i)]; };
      for (std::int64_t r = 0; r < k; ++r) {
        std::int64_t best = -1;
        for (std::int64_t j = 0; j < n; ++j) {
          if (taken[static_cast<std::size_t>(j)]) continue;
          if (best < 0) {
            best = j;
            continue;
          }
          const double u = at(j), w = at(best);
          const bool ahead = std::isnan(u) || std::isnan(w) ? (largest ? std::isnan(u) && !std::isnan(w)
                                                                       : std::isnan(w) && !std::isnan(u))
                                                            : (largest ? u > w : u < w);
          if (ahead) best = j;
        }
        taken[static_cast<std::size_t>(best)] = true;
        out[static_cast<std::size_t>((o * k + r) * inner + i)] = best;
      }
    }
  return out;
}
}  // namespace

TEST_CASE("topk, argsort, sort: hand-worked values, ties in index order", "[sort]") {
  const sc::Tensor x = sc::tensor({3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0});
  auto [v, i] = sc::topk(x, 3);
  CHECK(v.to_vector<double>() == std::vector<double>{9, 6, 5});
  CHECK(i.dtype() == sc::i64);
  CHECK(i.to_vector<std::int64_t>() == I64s{5, 7, 4});
  const sc::TopK low = sc::topk(x, 3, 0, false);
  CHECK(low.values.to_vector<double>() == std::vector<double>{1, 1, 2});
  CHECK(low.indices.to_vector<std::int64_t>() == I64s{1, 3, 6});  // the tied 1s in index order
  CHECK(sc::argsort(x).to_vector<std::int64_t>() == I64s{1, 3, 6, 0, 2, 4, 7, 5});
  CHECK(sc::argsort(x, 0, true).to_vector<std::int64_t>() == I64s{5, 7, 4, 2, 0, 6, 1, 3});
  CHECK(sc::sort(x).to_vector<double>() == std::vector<double>{1, 1, 2, 3, 4, 5, 6, 9});

  const sc::Tensor m = sc::tensor({{4, 1, 3}, {2, 5, 0}});  // i32
  CHECK(sc::sort(m).dtype() == sc::i32);
  CHECK(sc::sort(m).to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 3, 4, 0, 2, 5});
  CHECK(sc::sort(m, 0, true).to_vector<std::int32_t>() == std::vector<std::int32_t>{4, 5, 3, 2, 1, 0});
  const sc::TopK col = sc::topk(m, 1, 0);
  CHECK(col.values.shape() == sc::Shape{1, 3});
  CHECK(col.indices.to_vector<std::int64_t>() == I64s{0, 1, 0});
  CHECK(sc::topk(m, 2, -1).values.to_vector<std::int32_t>() == std::vector<std::int32_t>{4, 3, 5, 2});
  const sc::Tensor big = sc::tensor(std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::max(), -1,
                                                              std::numeric_limits<std::int64_t>::min(), 0});
  CHECK(sc::argsort(big).to_vector<std::int64_t>() == I64s{2, 1, 3, 0});

  // empty results and inputs
  CHECK(sc::topk(m, 0).values.shape() == sc::Shape{2, 0});
  CHECK(sc::argsort(sc::zeros({0, 3})).shape() == sc::Shape{0, 3});
  CHECK(sc::sort(sc::zeros({3, 0})).shape() == sc::Shape{3, 0});
}

TEST_CASE("topk, argsort: a NaN above every number, -0 equal to 0, infinities in place", "[sort]") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (const sc::DType d : {sc::f32, sc::f64}) {
    INFO(sc::name(d));
    const sc::Tensor x = sc::tensor({1.0, nan, -inf, inf, -0.0, 0.0, -nan}).astype(d);
    CHECK(sc::argsort(x).to_vector<std::int64_t>() == I64s{2, 4, 5, 0, 3, 1, 6});
    CHECK(sc::argsort(x, 0, true).to_vector<std::int64_t>() == I64s{1, 6, 3, 0, 4, 5, 2});
    CHECK(sc::topk(x, 2, 0, false).indices.to_vector<std::int64_t>() == I64s{2, 4});
    const std::vector<double> top = sc::topk(x, 3).values.to_vector<double>();
    CHECK((std::isnan(top[0]) && std::isnan(top[1]) && top[2] == inf));
    const std::vector<double> zeros = sc::sort(x).to_vector<double>();
    CHECK((zeros[1] == 0 && std::signbit(zeros[1]) && !std::signbit(zeros[2])));  // -0 then 0, as given
  }
}

TEST_CASE("topk: NaN, infinities and signed zeros scattered through long lines equal a selection loop",
          "[sort]") {
  // long enough lines for the blocks that are skipped whole when none is ahead of the k-th
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const std::vector<double> special{nan, -nan, inf, -inf, 0.0, -0.0, 1e300, -1e300};
  for (const auto& [shape, axis] : std::vector<std::pair<sc::Shape, int>>{{{4, 203}, 1}, {{203, 3}, 0}}) {
    std::vector<double> xv = sc::random::normal(shape, 7).to_vector<double>();
    for (std::size_t e = 0; e < xv.size(); e += 11) xv[e] = special[(e / 11) % special.size()];
    for (const sc::DType d : {sc::f32, sc::f64}) {
      const sc::Tensor x = sc::tensor(xv, shape).astype(d);
      const std::vector<double> seen = x.to_vector<double>();  // (1e300 is inf in f32)
      for (const std::int64_t k : {1, 3, 9, 32})
        for (const bool largest : {true, false}) {
          INFO(sc::name(d) << " " << shape << " axis " << axis << " k " << k << (largest ? " largest" : " smallest"));
          CHECK(sc::topk(x, k, axis, largest).indices.to_vector<std::int64_t>() ==
                select_k(seen, shape, axis, k, largest));
        }
    }
  }
}

TEST_CASE("topk over threads, every axis and many ties equals a selection loop", "[sort][threads]") {
  sctest::at_threads({1, 2}, [&](int) {
    for (const auto& [shape, axis] : std::vector<std::pair<sc::Shape, int>>{
             {{3, 5000}, 1}, {{4000, 6}, 0}, {{4000, 6}, 1}, {{5, 300, 7}, 1}, {{2, 3, 4}, 2}, {{9}, 0}}) {
      for (const sc::DType d : {sc::i32, sc::i64, sc::f32, sc::f64}) {
        // few distinct values for integers (ties everywhere), continuous ones for floats
        const sc::Tensor x = sc::is_floating(d) ? sc::random::normal(shape, 41).astype(d)
                                                : (sc::random::uniform(shape, -4.0, 4.0, 42)).astype(d);
        const std::vector<double> xv = x.to_vector<double>();
        const std::int64_t n = shape[axis];
        for (const std::int64_t k : {std::int64_t{1}, n / 3, n})
          for (const bool largest : {true, false}) {
            INFO(sc::name(d) << " " << shape << " axis " << axis << " k " << k
                    << (largest ? " largest" : " smallest"));
            const sc::TopK got = sc::topk(x, k, axis, largest);
            const I64s want = select_k(xv, shape, axis, k, largest);
            CHECK(got.indices.to_vector<std::int64_t>() == want);
            // the values are x's at those indices
            const std::vector<double> vals = got.values.to_vector<double>();
            std::int64_t outer = 1, inner = 1;
            for (int dd = 0; dd < axis; ++dd) outer *= shape[dd];
            for (int dd = axis + 1; dd < shape.rank(); ++dd) inner *= shape[dd];
            std::size_t bad = 0;
            for (std::int64_t e = 0; e < outer * k * inner; ++e) {
              const std::int64_t o = e / (k * inner), i = e % inner;
              bad += vals[static_cast<std::size_t>(e)] !=
                     xv[static_cast<std::size_t>((o * n + want[static_cast<std::size_t>(e)]) * inner + i)];
            }
            CHECK(bad == 0);
          }
      }
    }
  });
}

TEST_CASE("take_along_axis: hand-worked values, negative and i32 indices, repeats, every axis", "[sort]") {
  const sc::Tensor x = sc::tensor({{10.0, 11.0, 12.0}, {20.0, 21.0, 22.0}});
  const sc::Tensor idx = sc::tensor({{2, 0, -1, 1}, {0, 0, -3, 2}});  // i32
  CHECK(sc::take_along_axis(x, idx, 1).to_vector<double>() ==
        std::vector<double>{12, 10, 12, 11, 20, 20, 20, 22});
  const sc::Tensor rows = sc::tensor({{1, 0, 1}}).astype(sc::i64);
  CHECK(sc::take_along_axis(x, rows, 0).to_vector<double>() == std::vector<double>{20, 11, 22});
  CHECK(sc::take_along_axis(x, rows, -2).shape() == sc::Shape{1, 3});
  const sc::Tensor x3 = sc::reshape(sc::arange(0, 24, 1, sc::f64), {2, 3, 4});
  const sc::Tensor mid = sc::tensor({{{2, 2, 0, 1}}, {{0, 1, 2, 2}}});  // [2, 1, 4] along axis 1
  CHECK(sc::take_along_axis(x3, mid, 1).to_vector<double>() == std::vector<double>{8, 9, 2, 7, 12, 17, 22, 23});
  CHECK(sc::take_along_axis(x3, sc::zeros({2, 0, 4}, sc::i64), 1).shape() == sc::Shape{2, 0, 4});
  // it inverts argsort's permutation: sort then take back by the inverse gives x
  const sc::Tensor r = sc::random::normal({4, 9}, 5);
  const sc::Tensor order = sc::argsort(r, 1);
  const sc::Tensor inverse = sc::argsort(order, 1);
  CHECK(sc::take_along_axis(sc::sort(r, 1), inverse, 1).to_vector<float>() == r.to_vector<float>());
}

TEST_CASE("topk, sort, take_along_axis: gradients by central differences, traced equal to eager", "[sort][grad]") {
  const sc::Tensor x = sc::random::normal({3, 7}, 13).astype(sc::f64);  // distinct: no ties to step across
  const sc::Tensor w = sc::random::normal({3, 7}, 14).astype(sc::f64);
  for (const int axis : {0, 1}) {
    INFO("axis " << axis);
    const auto cases = std::vector<std::pair<const char*, std::function<sc::Tensor(const sc::Tensor&)>>>{
        {"topk", [&](const sc::Tensor& a) { return sc::topk(a * a, 2, axis).values; }},
        {"topk smallest", [&](const sc::Tensor& a) { return sc::topk(a, 3, axis, false).values; }},
        {"sort", [&](const sc::Tensor& a) { return sc::sort(a, axis, true) * sc::sort(w, axis); }},
        {"take_along_axis, repeated", [&](const sc::Tensor& a) {
           const sc::Tensor rep = sc::zeros_like(sc::topk(a, 2, axis).indices) + std::int64_t{1};
           return sc::take_along_axis(a, rep, axis) * 3.0;  // one entry, picked twice: 6 per line
         }}};
    for (const auto& [what, f] : cases) {
      INFO(what);
      const auto r = sc::check_gradients([&](const std::vector<sc::Tensor>& in) { return f(in[0]); }, {x});
      INFO(r.report);
      CHECK(r.ok);
      auto traced = sc::function([&](const sc::Tensor& a) { return f(a); });
      CHECK(traced(x).to_vector<double>() == f(x).to_vector<double>());
    }
  }
  // a traced topk's indices and its gradient
  auto g = sc::function([](const sc::Tensor& a) {
    sc::GradientTape t;
    t.watch(a);
    const sc::TopK top = sc::topk(a, 2);
    return std::vector<sc::Tensor>{top.indices, t.gradient(sc::sum(top.values), a)};
  });
  const auto got = g(x);
  CHECK(got[0].to_vector<std::int64_t>() == sc::topk(x, 2).indices.to_vector<std::int64_t>());
  const std::vector<double> grad = got[1].to_vector<double>();
  std::vector<double> want(21, 0.0);
  const I64s top = sc::topk(x, 2).indices.to_vector<std::int64_t>();
  for (std::size_t e = 0; e < top.size(); ++e) want[e / 2 * 7 + static_cast<std::size_t>(top[e])] = 1.0;
  CHECK(grad == want);
}

TEST_CASE("topk, argsort, take_along_axis: errors name the op, the shapes and the user's line", "[sort][errors]") {
  int line = __LINE__ + 1;
  std::string msg = error_of<sc::ValueError>([] { (void)sc::topk(sc::ones({2, 3}), 4); });
  CHECK_THAT(msg, Catch::Contains("[top_k]") && Catch::Contains("k = 4") && Catch::Contains("[2, 3]") &&
                      Catch::Contains("test_sort.cpp:" + std::to_string(line)));
  msg = error_of<sc::ValueError>([] { (void)sc::topk(sc::ones({2, 3}), -1); });
  CHECK_THAT(msg, Catch::Contains("[top_k]") && Catch::Contains("k = -1"));
  line = __LINE__ + 1;
  msg = error_of<sc::DTypeError>([] { (void)sc::argsort(sc::tensor({true, false})); });
  CHECK_THAT(msg, Catch::Contains("[top_k]") && Catch::Contains("bool") &&
                      Catch::Contains("test_sort.cpp:" + std::to_string(line)));
  msg = error_of<sc::ShapeError>([] { (void)sc::topk(sc::ones({2, 3}), 1, 2); });
  CHECK_THAT(msg, Catch::Contains("[top_k]") && Catch::Contains("axis 2"));
  msg = error_of<sc::ShapeError>([] { (void)sc::sort(sc::scalar(1.f)); });
  CHECK_THAT(msg, Catch::Contains("[top_k]") && Catch::Contains("rank >= 1"));

  const sc::Tensor x = sc::ones({2, 3});
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { (void)sc::take_along_axis(x, sc::tensor({{0, 3}, {1, 2}}), 1); });
  CHECK_THAT(msg, Catch::Contains("[take_along_axis]") && Catch::Contains("index 3") &&
                      Catch::Contains("test_sort.cpp:" + std::to_string(line)));
  msg = error_of<sc::ValueError>([&] { (void)sc::take_along_axis(x, sc::tensor({{-4}, {0}}), 1); });
  CHECK_THAT(msg, Catch::Contains("[take_along_axis]") && Catch::Contains("index -4"));
  line = __LINE__ + 1;
  msg = error_of<sc::ShapeError>([&] { (void)sc::take_along_axis(x, sc::tensor({{0, 1}}), 1); });
  CHECK_THAT(msg, Catch::Contains("[take_along_axis]") && Catch::Contains("[1, 2]") && Catch::Contains("[2, 3]") &&
                      Catch::Contains("test_sort.cpp:" + std::to_string(line)));
  msg = error_of<sc::ShapeError>([&] { (void)sc::take_along_axis(x, sc::tensor({0, 1}), 1); });
  CHECK_THAT(msg, Catch::Contains("[take_along_axis]"));
  msg = error_of<sc::DTypeError>([&] { (void)sc::take_along_axis(x, sc::ones({2, 3}), 1); });
  CHECK_THAT(msg, Catch::Contains("[take_along_axis]") && Catch::Contains("f32"));
  // traced: the indices are checked when the plan runs
  auto take = sc::function([](const sc::Tensor& a, const sc::Tensor& i) { return sc::take_along_axis(a, i, 1); });
  CHECK(take(x, sc::tensor({{0, -1}, {1, 2}})).to_vector<float>() == std::vector<float>{1, 1, 1, 1});
  msg = error_of<sc::ValueError>([&] { (void)take(x, sc::tensor({{0, 1}, {3, 2}})); });
  CHECK_THAT(msg, Catch::Contains("[take_along_axis]") && Catch::Contains("index 3"));
  msg = error_of<sc::ValueError>([] { (void)sc::take_along_axis(sc::Tensor(), sc::tensor({0}), 0); });
  CHECK_THAT(msg, Catch::Contains("[take_along_axis]"));
  msg = error_of<sc::ValueError>([] { (void)sc::sort(sc::Tensor()); });  // named as called
  CHECK_THAT(msg, Catch::Contains("[sort]") && Catch::Contains("undefined"));
}
