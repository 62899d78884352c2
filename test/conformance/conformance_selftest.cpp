// The suite checks itself: the naive reference against hand-computed values, and the
// comparison and runner against deliberately wrong answers (so a broken harness cannot pass).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "conformance.hpp"

namespace {

conf::Ref ref_of(conf::Dims shape, std::vector<double> v, sc::DType d = sc::f64) {
  conf::Ref r;
  r.shape = std::move(shape);
  r.v = std::move(v);
  r.dtype = d;
  return r;
}

}  // namespace

TEST_CASE("conformance self-test: reference against hand values", "[conformance][selftest]") {
  using conf::Ref;
  const Ref col = ref_of({2, 1}, {10, 20}), row = ref_of({3}, {1, 2, 3});
  const Ref sum = conf::map2(col, row, sc::f64, sc::f64, [](double a, double b) { return a + b; });
  CHECK(sum.shape == conf::Dims{2, 3});
  CHECK(sum.v == std::vector<double>{11, 12, 13, 21, 22, 23});
  const Ref m = ref_of({2, 3}, {1, 2, 3, 4, 5, 6});
  CHECK(conf::reduce(m, {-1}, true, sc::f64, [](const std::vector<double>& g) { return g[0] + g[1] + g[2]; }).v ==
        std::vector<double>{6, 15});
  CHECK(conf::transpose(m, {}).v == std::vector<double>{1, 4, 2, 5, 3, 6});
  CHECK(conf::matmul(m, ref_of({3}, {1, 0, -1})).v == std::vector<double>{-2, -2});
  CHECK(conf::slice(m, {-1, 1}, {1, -1}).v == std::vector<double>{5, 6});
  CHECK(conf::gather(m, ref_of({2}, {-1, 0}, sc::i64), 1).v == std::vector<double>{3, 1, 6, 4});
  CHECK(conf::concat({m, ref_of({1, 3}, {7, 8, 9}, sc::i32)}, 0).v.back() == 9);
  // 3x3 image, 2x2 kernel of ones, padding 1, stride 2: corners of the padded sums.
  const Ref img = ref_of({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9}), ker = ref_of({1, 1, 2, 2}, {1, 1, 1, 1});
  CHECK(conf::conv2d(img, ker, 2, 1).v == std::vector<double>{1, 5, 11, 28});
  CHECK(conf::pool2d(img, 2, 1, true).v == std::vector<double>{5, 6, 8, 9});
  const Ref sm = conf::softmax(ref_of({2}, {0, std::log(3.0)}), 0, false);
  CHECK(sm.v[0] == Approx(0.25));
  CHECK(conf::round_to(2.9, sc::i32) == 2);
  CHECK(conf::round_to(-2.9, sc::i64) == -2);
  CHECK(conf::round_to(0.1, sc::f32) == static_cast<double>(0.1f));
  CHECK(conf::promote2(sc::i64, sc::f32) == sc::f32);
}

TEST_CASE("conformance self-test: inputs are deterministic and cover the edges", "[conformance][selftest]") {
  const conf::In normal{{64}, sc::f32, conf::Gen::normal, 0, {}};
  CHECK(conf::make_input(normal, 1).v == conf::make_input(normal, 1).v);
  CHECK(conf::make_input(normal, 1).v != conf::make_input(normal, 2).v);
  auto count = [](const conf::Ref& r, auto pred) { return std::count_if(r.v.begin(), r.v.end(), pred); };
  const conf::Ref n = conf::make_input(normal, 3);
  CHECK(count(n, [](double v) { return v == 0; }) > 0);
  CHECK(count(n, [](double v) { return v < 0; }) > 0);
  const conf::Ref sp = conf::make_input({{64}, sc::f64, conf::Gen::special, 0, {}}, 3);
  CHECK(count(sp, [](double v) { return std::isnan(v); }) > 0);
  CHECK(count(sp, [](double v) { return std::isinf(v) && v < 0; }) > 0);
  const conf::Ref wide = conf::make_input({{64}, sc::f32, conf::Gen::wide, 0, {}}, 3);
  CHECK(count(wide, [](double v) { return std::fabs(v) >= 1e30; }) > 0);
  const conf::Ref idx = conf::make_input({{64}, sc::i32, conf::Gen::index, 5, {}}, 3);
  CHECK(count(idx, [](double v) { return v < 0 || v >= 5; }) == 0);
  const conf::Ref b = conf::make_input({{64}, sc::boolean, conf::Gen::normal, 0, {}}, 3);
  CHECK(count(b, [](double v) { return v == 1; }) > 0);
  CHECK(count(b, [](double v) { return v == 0; }) > 0);
}

TEST_CASE("conformance self-test: comparison fails when it should", "[conformance][selftest]") {
  const conf::Ref want = ref_of({2, 2}, {1, 2, 3, std::numeric_limits<double>::quiet_NaN()}, sc::f32);
  const sc::Tensor same = sc::tensor(std::vector<float>{1, 2, 3, std::nanf("")}, {2, 2});
  CHECK(conf::compare(want, same, conf::exact_rounding).empty());
  const sc::Tensor off = sc::tensor(std::vector<float>{1, 2, 3.001f, std::nanf("")}, {2, 2});
  const std::string msg = conf::compare(want, off, conf::exact_rounding);
  CHECK_THAT(msg, Catch::Contains("first mismatch at [1, 0]") && Catch::Contains("got 3.0009999") &&
                      Catch::Contains("want 3") && Catch::Contains("1 of 4"));
  const sc::Tensor not_nan = sc::tensor(std::vector<float>{1, 2, 3, 4}, {2, 2});
  CHECK_THAT(conf::compare(want, not_nan, conf::exact_rounding), Catch::Contains("want nan"));
  CHECK_THAT(conf::compare(want, sc::tensor(std::vector<double>{1, 2, 3, 4}, {2, 2}), conf::exact_rounding),
             Catch::Contains("dtype: got f64, want f32"));
  CHECK_THAT(conf::compare(want, sc::tensor(std::vector<float>{1, 2, 3, 4}), conf::exact_rounding),
             Catch::Contains("shape: got [4], want [2, 2]"));
  // Integers are exact whatever the tolerance.
  const conf::Ref ints = ref_of({2}, {5, 6}, sc::i64);
  CHECK_FALSE(conf::compare(ints, sc::tensor(std::vector<std::int64_t>{5, 7}), conf::Tol{1e9}).empty());
}

TEST_CASE("conformance self-test: the runner reports a wrong reference", "[conformance][selftest]") {
  conf::OpEntry e{"add", "sc::add", [](const std::vector<sc::Tensor>& x, const conf::Params&) { return sc::add(x[0], x[1]); },
                  [](const std::vector<conf::Ref>& in, const conf::Params&) {
                    return conf::map2(in[0], in[1], in[0].dtype, in[0].dtype, [](double a, double b) { return a - b; });
                  },
                  conf::exact_rounding, conf::cases({sc::i32}, {{{3, 4}, {4}}}, conf::Gen::positive, {}, "wrong on purpose"), 3u};
  const auto errors = conf::run_entry(e);
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0], Catch::Contains("op 'add' via sc::add [wrong on purpose], inputs (i32[3, 4], i32[4])") &&
                            Catch::Contains("first mismatch at [0, 0]"));
  e.call = [](const std::vector<sc::Tensor>& x, const conf::Params&) { return sc::matmul(x[1], x[0]); };  // [4] x [3, 4] throws
  CHECK_THAT(conf::run_entry(e).at(0), Catch::Contains("threw: [matmul]"));
}
