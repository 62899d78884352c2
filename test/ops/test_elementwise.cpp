// Elementwise ops: broadcasting walks, scalar operands, promotion, error messages.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "testing.hpp"

TEST_CASE("binary broadcasting patterns", "[elementwise]") {
  auto a = sc::tensor({{1.f, 2.f, 3.f}, {4.f, 5.f, 6.f}});
  CHECK((a + sc::tensor({10.f, 20.f, 30.f})).to_vector<float>() == std::vector<float>{11, 22, 33, 14, 25, 36});
  CHECK((a * sc::tensor({{2.f}, {3.f}})).to_vector<float>() == std::vector<float>{2, 4, 6, 12, 15, 18});
  CHECK((sc::tensor({{1.f}, {2.f}}) - sc::tensor({1.f, 2.f, 3.f})).to_vector<float>() ==
        std::vector<float>{0, -1, -2, 1, 0, -1});
  CHECK((2.f - a).to_vector<float>() == std::vector<float>{1, 0, -1, -2, -3, -4});
  CHECK((a / 2).to_vector<float>() == std::vector<float>{0.5, 1, 1.5, 2, 2.5, 3});
}

TEST_CASE("broadcasting ops split long rows over threads: shares that start and end inside rows",
          "[elementwise][threads]") {
  // Threads split the output's elements, not its rows (parallel_row_pieces): few long rows (a
  // scalar broadcast is one) spread too. Each case against a plain loop, at 1 and 2 threads.
  const std::int64_t R = 3, C = 70001;  // odd: shares end inside rows
  const sc::Tensor a = sc::random::uniform({R, C}, -1.0, 1.0, 1), col = sc::random::uniform({R, 1}, -1.0, 1.0, 2);
  const sc::Tensor row = sc::random::uniform({C}, -1.0, 1.0, 3), s = sc::tensor({2.5f});
  const sc::Tensor cond = sc::random::uniform({R, C}, 0.0, 1.0, 4) > 0.5f;
  const auto va = a.to_vector<float>(), vcol = col.to_vector<float>(), vrow = row.to_vector<float>();
  const auto vc = cond.to_vector<bool>();
  sctest::at_threads({1, 2}, [&](int) {
    const auto sub = (a - col).to_vector<float>();            // a strided walk: [R, C] - [R, 1]
    const auto mul = (a * row).to_vector<float>();            // one row repeated: [R, C] * [C]
    const auto outer = (col * row).to_vector<float>();        // both broadcast: [R, 1] * [C]
    const auto fill = sc::broadcast_to(s, {R * C}).to_vector<float>();  // one long row
    const auto cols = sc::broadcast_to(col, {R, C}).to_vector<float>();
    const auto sel = sc::where(cond, col, row).to_vector<float>();
    REQUIRE(sub.size() == static_cast<std::size_t>(R * C));
    int bad = 0;
    for (std::int64_t r = 0; r < R; ++r)
      for (std::int64_t c = 0; c < C; ++c) {
        const std::size_t i = static_cast<std::size_t>(r * C + c);
        bad += sub[i] != va[i] - vcol[r];
        bad += mul[i] != va[i] * vrow[c];
        bad += outer[i] != vcol[r] * vrow[c];
        bad += fill[i] != 2.5f;
        bad += cols[i] != vcol[r];
        bad += sel[i] != (vc[i] ? vcol[r] : vrow[c]);
      }
    CHECK(bad == 0);
  });
}

TEST_CASE("errors name the op, the shapes and the user's line", "[elementwise][errors]") {
  auto a = sc::ones({2, 3});
  auto b = sc::ones({4});
  const int line = __LINE__ + 1;
  CHECK_THROWS_WITH(a + b, Catch::Contains("[add] cannot broadcast shapes [2, 3] and [4] (f32, f32) at test_elementwise.cpp:" + std::to_string(line)));
  CHECK_THROWS_AS(sc::neg(sc::tensor({true})), sc::DTypeError);
  // A C++ integer that fits i32 and i64 tensors alike suggests no conversion to i64 (the hint is for
  // i32 tensors; an i64 or bool tensor was told to convert to the i64 it already is or gets).
  const sc::Tensor l = sc::tensor({std::int64_t{1}});
  const int line2 = __LINE__ + 1;
  CHECK_THROWS_WITH(l + 18446744073709551615ull,
                    Catch::Contains("[add] the integer 18446744073709551615 does not fit i64") &&
                        Catch::Contains("pass a floating-point scalar") && !Catch::Contains(".astype(sc::i64)") &&
                        Catch::Contains("test_elementwise.cpp:" + std::to_string(line2)));
  CHECK_THROWS_WITH(sc::tensor({true}) * 18446744073709551615ull,
                    Catch::Contains("[mul] the integer 18446744073709551615 does not fit i64 (the bool tensor's"));
  CHECK_THROWS_WITH(sc::tensor({1}) + 3000000000LL, Catch::Contains("does not fit the tensor's dtype i32; convert the tensor first (.astype(sc::i64))"));
}

TEST_CASE("compound assignment takes a tensor or a number, as the binary operator would", "[elementwise]") {
  sc::Tensor x = sc::tensor({1.f, 2.f, 4.f});
  const sc::Tensor before = x;
  x += 1.5;  // a double next to f32: f32, as x + 1.5
  CHECK(x.dtype() == sc::f32);
  CHECK(x.to_vector<float>() == std::vector<float>{2.5f, 3.5f, 5.5f});
  CHECK(before.to_vector<float>() == std::vector<float>{1, 2, 4});  // rebinds the handle, never writes through it
  x *= 2;
  x -= 0.5f;
  x /= 2.0;
  CHECK(x.to_vector<float>() == std::vector<float>{2.25f, 3.25f, 5.25f});
  x += sc::tensor({1.f, 1.f, 1.f});
  CHECK(x.to_vector<float>() == std::vector<float>{3.25f, 4.25f, 6.25f});

  // Each number keeps its C++ type to the weak-scalar rule: the dtypes and values of t op v.
  sc::Tensor i = sc::tensor({1, 2, 3});
  i += 2;
  CHECK(i.dtype() == sc::i32);
  CHECK(i.to_vector<std::int32_t>() == std::vector<std::int32_t>{3, 4, 5});
  i *= 1.5;
  CHECK(i.dtype() == (sc::tensor({1}) * 1.5).dtype());
  CHECK(i.to_vector<float>() == std::vector<float>{4.5f, 6.f, 7.5f});
  sc::Tensor l = sc::tensor({std::int64_t{5}});
  l -= 3u;
  l *= static_cast<unsigned char>(200);
  CHECK(l.dtype() == sc::i64);
  CHECK(l.item<std::int64_t>() == 400);
  sc::Tensor m = sc::tensor({true, false});
  m += 1;  // bool tensor + 1: i64
  CHECK(m.dtype() == sc::i64);
  CHECK(m.to_vector<std::int64_t>() == std::vector<std::int64_t>{2, 1});
  sc::Tensor d = sc::tensor({1.0});
  d += 0.1L;  // a long double: rounded once, to the f64 it joins
  CHECK(d.item<double>() == (sc::tensor({1.0}) + 0.1L).item<double>());
  sc::Tensor f = sc::tensor({1.f});
  f += 0.1000000000000000055511151231257827L;
  CHECK(f.item<float>() == (sc::tensor({1.f}) + 0.1000000000000000055511151231257827L).item<float>());

  // An integer that does not fit the tensor's dtype: the operator's error, at the user's line.
  sc::Tensor small = sc::tensor({1});
  const int line = __LINE__ + 1;
  CHECK_THROWS_WITH(small += 3000000000LL,
                    Catch::Contains("[add] the integer 3000000000 does not fit the tensor's dtype i32") &&
                        Catch::Contains("test_elementwise.cpp:" + std::to_string(line)));
  CHECK_THROWS_AS(small *= 3000000000LL, sc::DTypeError);
  CHECK(small.to_vector<std::int32_t>() == std::vector<std::int32_t>{1});  // a failed assignment leaves it

  // Traced: the same values as eager.
  auto step = [](const sc::Tensor& a) {
    sc::Tensor y = a;
    y *= 3;
    y += 0.25;
    y /= a;
    return y;
  };
  const sc::Tensor a = sc::tensor({1.f, 2.f, -4.f});
  CHECK(sc::function(step)(a).to_vector<float>() == step(a).to_vector<float>());
}

TEST_CASE("maximum and minimum propagate NaN in the SIMD part of a row too", "[elementwise]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a(37, nan), b(37, 2.f);
  a[5] = 1.f;  // one ordinary lane
  for (auto op : {+[](const sc::Tensor& x, const sc::Tensor& y) { return sc::maximum(x, y); },
                  +[](const sc::Tensor& x, const sc::Tensor& y) { return sc::minimum(x, y); }}) {
    const auto r1 = op(sc::tensor(a), sc::tensor(b)).to_vector<float>();
    const auto r2 = op(sc::tensor(b), sc::tensor(a)).to_vector<float>();
    for (int i = 0; i < 37; ++i) {
      if (i == 5) continue;
      CHECK(std::isnan(r1[i]));
      CHECK(std::isnan(r2[i]));
    }
  }
  CHECK(sc::maximum(sc::tensor(a), sc::tensor(b)).to_vector<float>()[5] == 2.f);
  CHECK(sc::minimum(sc::tensor(a), sc::tensor(b)).to_vector<float>()[5] == 1.f);
}

// maximum and minimum against one value take their rules' short forms for the row (with_second:
// one max/min instruction where the value is neither NaN nor zero, one compare and blend where it
// is a zero): the bits of the full rule, NaN of either sign, zeros of either sign and ties included.
TEMPLATE_TEST_CASE("maximum and minimum against one value: NaN, zeros of either sign, ties, every length", "[elementwise]",
                   float, double) {
  using T = TestType;
  const T nan = std::numeric_limits<T>::quiet_NaN(), inf = std::numeric_limits<T>::infinity();
  const std::vector<T> special = {nan, -nan, T(0), -T(0), T(1.5), T(-2), inf, -inf};
  const auto mx = [](T a, T b) { return (a > b || a != a) ? a : b; };  // NaN in either gives NaN, a tie b
  const auto mn = [](T a, T b) { return (a < b || a != a) ? a : b; };
  const auto same = [](const std::vector<T>& got, const std::vector<T>& want) {
    return got.size() == want.size() && std::memcmp(got.data(), want.data(), got.size() * sizeof(T)) == 0;
  };
  sctest::Rng r(5);
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{3}, std::int64_t{8}, std::int64_t{17}, std::int64_t{33},
                               std::int64_t{40}, std::int64_t{1000}}) {
    std::vector<T> x(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = r.next() % 3 == 0 ? static_cast<T>(4 * r.uniform() - 2) : special[(i / (1 + i % 3)) % special.size()];
    const sc::Tensor tx = sc::tensor(x);
    for (const T s : special) {
      INFO("n = " << n << ", the value " << s << " (sign " << std::signbit(s) << ")");
      std::vector<T> max_xs(x.size()), max_sx(x.size()), min_xs(x.size()), min_sx(x.size());
      for (std::size_t i = 0; i < x.size(); ++i)
        max_xs[i] = mx(x[i], s), max_sx[i] = mx(s, x[i]), min_xs[i] = mn(x[i], s), min_sx[i] = mn(s, x[i]);
      const sc::Tensor one = sc::tensor(std::vector<T>{s});  // [1], broadcast
      CHECK(same(sc::maximum(tx, s).template to_vector<T>(), max_xs));
      CHECK(same(sc::maximum(tx, one).template to_vector<T>(), max_xs));
      CHECK(same(sc::maximum(s, tx).template to_vector<T>(), max_sx));
      CHECK(same(sc::maximum(one, tx).template to_vector<T>(), max_sx));
      CHECK(same(sc::minimum(tx, s).template to_vector<T>(), min_xs));
      CHECK(same(sc::minimum(tx, one).template to_vector<T>(), min_xs));
      CHECK(same(sc::minimum(s, tx).template to_vector<T>(), min_sx));
      CHECK(same(sc::minimum(one, tx).template to_vector<T>(), min_sx));
      if (n == 1000) {  // traced: the fused evaluator's chains against one value
        const auto f = sc::function([](const sc::Tensor& a, const sc::Tensor& k) { return sc::minimum(k, sc::maximum(a * 1, k)); });
        std::vector<T> want(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) want[i] = mn(s, mx(x[i], s));
        CHECK(same(f(tx, sc::scalar(s)).template to_vector<T>(), want));
      }
    }
  }
}

// Comparisons, logical ops, where and cast run their SIMD rules (lane masks stored as bools, bool
// masks read as lanes); results equal the scalar rule at every length (tails) and broadcast form.
static_assert(sc::backend::cpu::HasMask2<sc::ops::Less, float> && sc::backend::cpu::HasMask2<sc::ops::LogicalOr, std::int64_t>);
static_assert(sc::backend::cpu::HasMask1<sc::ops::LogicalNot, double> && sc::backend::cpu::HasMask1<sc::ops::CastTo<bool>, std::int32_t>);
static_assert(!sc::backend::cpu::HasMask2<sc::ops::Less, bool> && !sc::backend::cpu::HasSimd2<sc::ops::Equal, float>);
static_assert(sc::backend::cpu::HasConvert<sc::ops::CastTo<float>, std::int32_t, float> ==
              sc::backend::cpu::exact_batch_cast<std::int32_t, float>);

TEMPLATE_TEST_CASE("comparisons, logical ops, where and cast agree with the scalar rules at every length", "[elementwise]",
                   float, double, std::int32_t, std::int64_t) {
  using T = TestType;
  const T nan = std::is_floating_point_v<T> ? std::numeric_limits<T>::quiet_NaN() : T(0);
  const std::vector<T> pool = {T(0), T(1), nan, T(-1), -T(0), T(2), T(1), nan, T(-3), T(0), T(5)};
  for (std::int64_t n = 1; n <= 40; ++n) {
    std::vector<T> a(n), b(n);
    for (std::int64_t i = 0; i < n; ++i) a[i] = pool[i % pool.size()], b[i] = pool[(3 * i + 1) % pool.size()];
    const sc::Tensor ta = sc::tensor(a), tb = sc::tensor(b), t1 = sc::tensor(std::vector<T>{b[0]});
    auto check = [&](auto rule, const sc::Tensor& got, const char* what) {
      const std::vector<bool> v = got.to_vector<bool>();
      for (std::int64_t i = 0; i < n; ++i) {
        INFO(what << " n " << n << " at " << i << ": " << a[i] << ", " << b[i]);
        CHECK(v[i] == decltype(rule)::f(a[i], b[i]));
      }
    };
    check(sc::rules::Less{}, sc::less(ta, tb), "less");
    check(sc::rules::GreaterEqual{}, ta >= tb, "greater_equal");
    check(sc::rules::NotEqual{}, ta != tb, "not_equal");
    check(sc::rules::Equal{}, sc::equal(ta, tb), "equal");
    check(sc::rules::LogicalAnd{}, sc::logical_and(ta, tb), "logical_and");
    check(sc::rules::LogicalOr{}, sc::logical_or(ta, tb), "logical_or");
    // One operand a single element, on either side, and a row broadcast over two rows.
    const std::vector<bool> lt1 = sc::less(ta, t1).to_vector<bool>(), gt1 = sc::greater(t1, ta).to_vector<bool>();
    const std::vector<bool> rows = sc::less_equal(sc::tensor(a, {1, n}), sc::tensor(std::vector<T>(2 * n, b[0]), {2, n}))
                                       .template to_vector<bool>();
    const std::vector<bool> lnot = sc::logical_not(ta).to_vector<bool>(), cb = sc::cast(ta, sc::boolean).to_vector<bool>();
    const sc::Tensor cond = sc::less(ta, tb);
    const std::vector<T> w = sc::where(cond, ta, tb).template to_vector<T>();
    const std::vector<T> w1 = sc::where(cond, ta, t1).template to_vector<T>();
    const std::vector<bool> cv = cond.to_vector<bool>();
    for (std::int64_t i = 0; i < n; ++i) {
      INFO("n " << n << " at " << i << ": " << a[i] << ", " << b[i]);
      CHECK(lt1[i] == sc::rules::Less::f(a[i], b[0]));
      CHECK(gt1[i] == sc::rules::Greater::f(b[0], a[i]));
      CHECK(rows[i] == sc::rules::LessEqual::f(a[i], b[0]));
      CHECK(rows[n + i] == sc::rules::LessEqual::f(a[i], b[0]));
      CHECK(lnot[i] == sc::rules::LogicalNot::f(a[i]));
      CHECK(cb[i] == sc::rules::Cast<bool>::f(a[i]));
      const T want = cv[i] ? a[i] : b[i], want1 = cv[i] ? a[i] : b[0];
      CHECK(std::memcmp(&w[i], &want, sizeof(T)) == 0);  // bit for bit: -0 and NaN payloads kept
      CHECK(std::memcmp(&w1[i], &want1, sizeof(T)) == 0);
    }
  }
}

// exp near the ends of its range and log of subnormal doubles, at lengths that put values both in
// whole SIMD batches and in the padded tail: the C library's scalar functions are the reference
// (xsimd 8 gave inf for e^88.5f, 0 for subnormal results, and log(2.2e-308) = -745.8).
TEMPLATE_TEST_CASE("exp and log keep finite results at the ends of the range", "[elementwise]", float, double) {
  using T = TestType;
  constexpr bool f32 = std::is_same_v<T, float>;
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  const std::vector<T> ex = f32 ? std::vector<T>{T(88.5), T(88.72), T(88.4), T(-87.5), T(-90), T(-100), T(-103), T(87.5),
                                                 T(1), T(0), inf, -inf, nan, T(89), T(-110), T(-88.5)}
                                : std::vector<T>{T(709.5), T(709.78), T(709.44), T(-708.5), T(-720), T(-740), T(-744),
                                                 T(708.5), T(1), T(0), inf, -inf, nan, T(710), T(-746), T(-708.8)};
  const T tiny = std::numeric_limits<T>::denorm_min(), least = std::numeric_limits<T>::min();
  const std::vector<T> lx = {tiny, T(3) * tiny, least / T(3), least * T(0.99), least, T(0), -T(0), -tiny, T(2), nan, inf};
  auto close = [tiny](T got, T want) {  // within 2 ulps, or 2 steps of the subnormal spacing
    if (std::isnan(want)) return std::isnan(got);
    if (std::isinf(want) || want == T(0)) return got == want;
    return std::abs(got - want) <= T(2) * std::numeric_limits<T>::epsilon() * std::abs(want) + T(2) * tiny;
  };
  for (const std::int64_t n : {1, 7, 16, 17, 37, 67}) {
    std::vector<T> x(static_cast<std::size_t>(n)), y(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) x[i] = ex[(i * 5) % ex.size()], y[i] = lx[(i * 3) % lx.size()];
    const std::vector<T> e = sc::exp(sc::tensor(x)).template to_vector<T>();
    const std::vector<T> l = sc::log(sc::tensor(y)).template to_vector<T>();
    for (std::int64_t i = 0; i < n; ++i) {
      INFO("n = " << n << ", exp(" << x[i] << ") = " << e[i] << ", want " << std::exp(x[i]));
      CHECK(close(e[i], std::exp(x[i])));
      INFO("log(" << y[i] << ") = " << l[i] << ", want " << std::log(y[i]));
      CHECK(close(l[i], std::log(y[i])));
    }
  }
  // the same through sigmoid, whose e^-x is the same exp: sigmoid(-88.5f) is e^-88.5 / (1 + ...), not 0
  const T s = sc::sigmoid(sc::tensor(std::vector<T>(5, f32 ? T(-88) : T(-708.5)))).template to_vector<T>()[0];
  CHECK(close(s, T(1) / (T(1) + std::exp(f32 ? T(88) : T(708.5)))));
}

// log1p, expm1 and erf: special values and values near 0 where the plain forms lose digits, at
// every position of a row (the SIMD body and the scalar tail), against <cmath> in double.
TEMPLATE_TEST_CASE("log1p, expm1 and erf: special values and tiny arguments in every lane", "[elementwise]", float, double) {
  using T = TestType;
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  const std::vector<T> special{T(0), T(-0.0), T(1e-30), T(-1e-30), T(1e-7), T(-1e-7), T(3e-4), T(-1), T(-2),
                               T(0.5), T(-0.5), T(5), T(-5), T(30), T(-30), T(80), T(700), inf, -inf, nan};
  struct Case {
    const char* name;
    sc::Tensor (*op)(const sc::Tensor&, std::source_location);
    double (*ref)(double);
  };
  const Case cases[] = {{"log1p", sc::log1p, [](double v) { return std::log1p(v); }},
                        {"expm1", sc::expm1, [](double v) { return std::expm1(v); }},
                        {"erf", sc::erf, [](double v) { return std::erf(v); }}};
  const double tol = std::is_same_v<T, float> ? 5e-7 : 1e-13;  // SIMD forms within a few ulp (erf f64: ~70)
  for (const Case& c : cases) {
    // each special value at every position of a 37-long row
    for (std::size_t pos = 0; pos < 37; pos += 5) {
      for (const T v : special) {
        std::vector<T> row(37, T(0.25));
        row[pos] = v;
        const std::vector<T> got = c.op(sc::tensor(row), std::source_location::current()).template to_vector<T>();
        const double want = static_cast<T>(c.ref(static_cast<double>(v)));
        INFO(c.name << "(" << v << ") at " << pos << ": " << got[pos] << " vs " << want);
        if (std::isnan(want)) {
          CHECK(std::isnan(got[pos]));
        } else if (std::isinf(want) || want == 0) {
          CHECK(static_cast<double>(got[pos]) == want);
          CHECK(std::signbit(got[pos]) == std::signbit(want));
        } else {
          CHECK(std::fabs(got[pos] - want) <= tol * std::fabs(want));
        }
        CHECK(static_cast<double>(got[(pos + 1) % 37]) == Approx(static_cast<T>(c.ref(0.25))).epsilon(tol));
      }
    }
  }
  // where the plain forms cancel: log(1 + 1e-10) is 0 in f32 and 1 + 1e-10 rounds in f64
  CHECK(sc::log1p(sc::scalar(T(1e-10))).template item<T>() == Approx(std::log1p(T(1e-10))).epsilon(tol));
  CHECK(sc::expm1(sc::scalar(T(1e-10))).template item<T>() == Approx(std::expm1(T(1e-10))).epsilon(tol));
  CHECK(sc::log1p(sc::scalar(T(1e-10))).template item<T>() != T(0));
}

// NaNs come out of log1p, expm1 and erf as they went in, sign included, at every position of a row
// (xsimd's forms flip some NaN signs where <cmath>'s keep them: eager and fused loops would differ).
TEMPLATE_TEST_CASE("log1p, expm1 and erf pass a NaN through with its sign", "[elementwise]", float, double) {
  using T = TestType;
  const T nan = std::numeric_limits<T>::quiet_NaN();
  for (const T v : {nan, -nan}) {
    const std::vector<T> row(37, v);
    for (auto op : {+[](const sc::Tensor& x) { return sc::log1p(x); }, +[](const sc::Tensor& x) { return sc::expm1(x); },
                    +[](const sc::Tensor& x) { return sc::erf(x); }})
      for (const T y : op(sc::tensor(row)).template to_vector<T>()) {
        CHECK(std::isnan(y));
        CHECK(std::signbit(y) == std::signbit(v));
      }
  }
}

// erf on f32 batches is a rational function of its own (rules.inc, erf_f32): within 4 eps relative
// of erf, the conformance tables' bound for transcendentals (bench/erf_accuracy.cpp checks every
// float: 2.65 with FMA, 3.34 on SSE2), at every 997th float up to 4.5 against <cmath> in double,
// exactly odd, never beyond +-1, and exactly +-1 where erf rounds to it.
TEST_CASE("erf on f32 is within 4 eps of erf, odd, and exactly +-1 from 3.9192059 on", "[elementwise]") {
  std::vector<float> xs;
  for (std::uint32_t b = 0; b <= std::bit_cast<std::uint32_t>(4.5f); b += 997) xs.push_back(std::bit_cast<float>(b));
  for (const float v : {1e-30f, 1e-7f, 0.5f, 1.f, 2.f, 3.f, 3.6063316f, 3.9192057f, 3.9192059f, 3.92f, 4.f, 10.f, 1e30f})
    xs.push_back(v);
  xs.push_back(std::numeric_limits<float>::denorm_min());
  xs.push_back(std::numeric_limits<float>::infinity());
  const sc::Tensor x = sc::tensor(xs);
  const std::vector<float> y = sc::erf(x).to_vector<float>(), yn = sc::erf(-x).to_vector<float>();
  const double eps = std::numeric_limits<float>::epsilon();
  int bad = 0;
  for (std::size_t i = 0; i < xs.size() && bad < 10; ++i) {
    const double want = std::erf(static_cast<double>(xs[i]));
    INFO("erf(" << xs[i] << ") = " << y[i] << ", want " << want << ", erf(-x) = " << yn[i]);
    const bool ok = std::fabs(y[i] - want) <= 4 * eps * std::fabs(want) + std::numeric_limits<float>::denorm_min() &&
                    std::bit_cast<std::uint32_t>(yn[i]) == (std::bit_cast<std::uint32_t>(y[i]) ^ 0x80000000u) &&
                    std::fabs(y[i]) <= 1.f && (xs[i] < 3.9192059f || y[i] == 1.f);
    CHECK(ok);
    bad += !ok;
  }
  CHECK(sc::erf(sc::scalar(-0.f)).item<float>() == 0.f);
  CHECK(std::signbit(sc::erf(sc::tensor(std::vector<float>(19, -0.f))).to_vector<float>()[17]));
}

// floor, ceil and round: against <cmath> (round: nearbyint, halves to even) at every position of a
// row (the SIMD body and the scalar tail), zeros with the right sign and NaNs passed through.
TEMPLATE_TEST_CASE("floor, ceil and round: halves, zeros, large values and NaNs in every lane", "[elementwise]", float,
                   double) {
  using T = TestType;
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  const T big = std::is_same_v<T, float> ? T(8388609) : T(4503599627370497.0);  // 2^23 + 1, 2^52 + 1: integers
  const std::vector<T> special{T(0),    T(-0.0), T(0.5),  T(-0.5), T(1.5),   T(-1.5),  T(2.5),   T(-2.5), T(0.49999997),
                               T(-0.3), T(0.3),  T(1e-30), T(-1e-30), T(7.75), T(-7.25), T(1e20), T(-1e20), big, -big,
                               T(4194303.5), inf, -inf, nan, -nan};
  struct Case {
    const char* name;
    sc::Tensor (*op)(const sc::Tensor&, std::source_location);
    double (*ref)(double);
  };
  const Case cases[] = {{"floor", sc::floor, [](double v) { return std::floor(v); }},
                        {"ceil", sc::ceil, [](double v) { return std::ceil(v); }},
                        {"round", sc::round, [](double v) { return std::nearbyint(v); }}};
  for (const Case& c : cases) {
    for (std::size_t pos = 0; pos < 37; pos += 3) {
      for (const T v : special) {
        std::vector<T> row(37, T(-3.5));
        row[pos] = v;
        const sc::Tensor got_t = c.op(sc::tensor(row), std::source_location::current());
        REQUIRE(got_t.dtype() == sc::dtype_of<T>());
        const std::vector<T> got = got_t.template to_vector<T>();
        const T want = static_cast<T>(c.ref(static_cast<double>(v)));
        INFO(c.name << "(" << v << ") at " << pos << ": " << got[pos] << " vs " << want);
        if (std::isnan(v)) {
          CHECK(std::isnan(got[pos]));
          CHECK(std::signbit(got[pos]) == std::signbit(v));
        } else {
          CHECK(got[pos] == want);
          CHECK(std::signbit(got[pos]) == std::signbit(want));
        }
        CHECK(got[(pos + 1) % 37] == static_cast<T>(c.ref(-3.5)));
      }
    }
  }
  // round halves to even (NumPy, TensorFlow and PyTorch agree; std::round would give 1, 3, -3)
  CHECK(sc::round(sc::tensor(std::vector<T>{T(0.5), T(2.5), T(-2.5), T(3.5)})).template to_vector<T>() ==
        std::vector<T>{0, 2, -2, 4});
}

TEST_CASE("floor, ceil and round: integers unchanged in their dtype, bool rejected, no gradient", "[elementwise]") {
  const sc::Tensor i = sc::tensor(std::vector<std::int32_t>{-7, 0, 5, std::numeric_limits<std::int32_t>::min()});
  const sc::Tensor l = sc::tensor(std::vector<std::int64_t>{-(std::int64_t{1} << 62) - 1, 3});
  for (auto op : {+[](const sc::Tensor& x) { return sc::floor(x); }, +[](const sc::Tensor& x) { return sc::ceil(x); },
                  +[](const sc::Tensor& x) { return sc::round(x); }}) {
    CHECK(op(i).dtype() == sc::i32);
    CHECK(op(i).to_vector<std::int32_t>() == i.to_vector<std::int32_t>());
    CHECK(op(l).to_vector<std::int64_t>() == l.to_vector<std::int64_t>());
  }
  try {
    (void)sc::round(sc::tensor({true, false}));
    FAIL("round accepted bool");
  } catch (const sc::DTypeError& e) {
    CHECK_THAT(e.what(), Catch::Contains("round") && Catch::Contains("bool"));
  }
  // piecewise constant: x * floor(x) has slope floor(x) (floor itself contributes nothing)
  const sc::Tensor x = sc::tensor({1.5, -0.25, 2.75});
  sc::GradientTape t;
  t.watch(x);
  const sc::Tensor y = sc::sum(x * sc::floor(x) + sc::ceil(x) + sc::round(x));
  CHECK(t.gradient(y, x).to_vector<double>() == std::vector<double>{1, -1, 2});
}

// floor_div and mod against Python's // and % (the values below are what Python 3 prints), every
// sign combination at every position of a row, and the identity a == b * (a // b) + a % b.
TEMPLATE_TEST_CASE("floor_div and mod: Python's values, signs, zeros and infinities", "[elementwise]", float, double) {
  using T = TestType;
  const T inf = std::numeric_limits<T>::infinity();
  struct Row {
    T a, b, q, r;
  };
  const Row rows[] = {
      {T(7), T(2), T(3), T(1)},           {T(-7), T(2), T(-4), T(1)},      {T(7), T(-2), T(-4), T(-1)},
      {T(-7), T(-2), T(3), T(-1)},        {T(7.5), T(2), T(3), T(1.5)},    {T(-7.5), T(2), T(-4), T(0.5)},
      {T(-1.5), T(1), T(-2), T(0.5)},     {T(6), T(3), T(2), T(0)},        {T(-6), T(3), T(-2), T(0)},
      {T(6), T(-3), T(-2), T(-0.0)},      {T(0.0), T(-3), T(-0.0), T(-0.0)}, {T(-0.0), T(3), T(-0.0), T(0)},
      {T(1), T(inf), T(0), T(1)},         {T(-1), T(inf), T(-1), inf},     {T(1), -inf, T(-1), -inf},
      {T(0.5), T(0.25), T(2), T(0)},      {T(1e-3), T(3), T(0), T(1e-3)},  {T(-1e-3), T(3), T(-1), T(3) - T(1e-3)},
  };
  for (std::size_t pos = 0; pos < 37; pos += 4) {
    for (const Row& w : rows) {
      std::vector<T> a(37, T(9)), b(37, T(4));
      a[pos] = w.a;
      b[pos] = w.b;
      const std::vector<T> q = sc::floor_div(sc::tensor(a), sc::tensor(b)).template to_vector<T>();
      const std::vector<T> r = sc::mod(sc::tensor(a), sc::tensor(b)).template to_vector<T>();
      INFO(w.a << " // " << w.b << " = " << q[pos] << " (want " << w.q << "), % = " << r[pos] << " (want " << w.r
                << ") at " << pos);
      CHECK(q[pos] == w.q);
      CHECK(std::signbit(q[pos]) == std::signbit(w.q));
      CHECK(r[pos] == w.r);
      CHECK(std::signbit(r[pos]) == std::signbit(w.r));
      CHECK(q[(pos + 1) % 37] == T(2));
      CHECK(r[(pos + 1) % 37] == T(1));
    }
  }
  // a zero divisor: // gives a / b, % gives NaN (NumPy's), as do an infinite a or a NaN
  const std::vector<T> q = sc::floor_div(sc::tensor(std::vector<T>{T(1), T(-1), T(0), inf, T(1)}),
                                         sc::tensor(std::vector<T>{T(0), T(0), T(0), T(2), std::numeric_limits<T>::quiet_NaN()}))
                               .template to_vector<T>();
  CHECK(q[0] == inf);
  CHECK(q[1] == -inf);
  CHECK(std::isnan(q[2]));
  CHECK(std::isnan(q[3]));
  CHECK(std::isnan(q[4]));
  for (const T v : sc::mod(sc::tensor(std::vector<T>{T(1), inf, T(2)}), sc::tensor(std::vector<T>{T(0), T(3), T(0)}))
                       .template to_vector<T>())
    CHECK(std::isnan(v));
  // a == b * (a // b) + a % b on random values (the remainder exact: from fmod), and |a % b| < |b|
  const sc::Tensor x = sc::random::uniform({1000}, -50.0, 50.0, 3, sc::dtype_of<T>());
  std::vector<T> yv = sc::random::uniform({1000}, 0.5, 7.0, 4, sc::dtype_of<T>()).template to_vector<T>();
  for (std::size_t i = 0; i < yv.size(); i += 3) yv[i] = -yv[i];
  const sc::Tensor y = sc::tensor(yv);
  const auto xv = x.template to_vector<T>();
  const auto qv = sc::floor_div(x, y).template to_vector<T>(), rv = sc::mod(x, y).template to_vector<T>();
  for (std::size_t i = 0; i < xv.size(); ++i) {
    INFO(xv[i] << " // " << yv[i]);
    CHECK(qv[i] == std::floor(static_cast<long double>(xv[i]) / yv[i]));
    CHECK(static_cast<long double>(yv[i]) * qv[i] + rv[i] == Approx(static_cast<long double>(xv[i])).margin(1e-5));
    CHECK(std::fabs(rv[i]) < std::fabs(yv[i]));
    CHECK((rv[i] == 0 || std::signbit(rv[i]) == std::signbit(yv[i])));
  }
}

TEST_CASE("floor_div and mod on integers: Python's signs, zero divisors, the lowest value, scalars", "[elementwise]") {
  const sc::Tensor a = sc::tensor(std::vector<std::int32_t>{7, -7, 7, -7, 0, 5, -5, 6, -6, 1});
  const sc::Tensor b = sc::tensor(std::vector<std::int32_t>{2, 2, -2, -2, 3, 0, 0, -3, 3, 1});
  CHECK(sc::floor_div(a, b).dtype() == sc::i32);
  CHECK(sc::floor_div(a, b).to_vector<std::int32_t>() == std::vector<std::int32_t>{3, -4, -4, 3, 0, 0, 0, -2, -2, 1});
  CHECK(sc::mod(a, b).to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 1, -1, -1, 0, 0, 0, 0, 0, 0});
  // the lowest value over -1 wraps (C++ leaves it undefined); its remainder is 0
  for (const sc::DType d : {sc::i32, sc::i64}) {
    const sc::Tensor lo = d == sc::i32 ? sc::tensor(std::vector<std::int32_t>{std::numeric_limits<std::int32_t>::min()})
                                       : sc::tensor(std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min()});
    CHECK(sc::floor_div(lo, -1).to_vector<std::int64_t>() == lo.to_vector<std::int64_t>());
    CHECK(sc::mod(lo, -1).to_vector<std::int64_t>() == std::vector<std::int64_t>{0});
    CHECK(sc::mod(lo, 10).to_vector<std::int64_t>() == std::vector<std::int64_t>{d == sc::i32 ? 2 : 2});
  }
  // weak scalars on either side keep the tensor's dtype; broadcasting
  const sc::Tensor m = sc::tensor(std::vector<std::int64_t>{-3, -2, -1, 0, 1, 2, 3}, sc::Shape{7, 1});
  CHECK(sc::mod(m, 3).dtype() == sc::i64);
  CHECK(sc::mod(m, 3).to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 2, 0, 1, 2, 0});
  CHECK(sc::floor_div(10, sc::tensor(std::vector<std::int32_t>{3, -3, 4})).to_vector<std::int32_t>() ==
        std::vector<std::int32_t>{3, -4, 2});
  CHECK(sc::mod(m, sc::tensor(std::vector<std::int64_t>{2, -2})).shape() == sc::Shape{7, 2});
  CHECK(sc::floor_div(sc::tensor({7.f}), 2).dtype() == sc::f32);
  CHECK(sc::mod(sc::tensor(std::vector<std::int32_t>{7}), 2.5).to_vector<float>() == std::vector<float>{2});
  // bool is not a numeric dtype
  CHECK_THROWS_AS(sc::mod(sc::tensor({true}), sc::tensor({true})), sc::DTypeError);
  // gradients: d mod/da = 1, d mod/db = -floor_div(a, b); floor_div has none
  const sc::Tensor x = sc::tensor({5.5, -5.5}), y = sc::tensor({2.0, 2.0});
  sc::GradientTape t(/*persistent=*/true);
  t.watch(x);
  t.watch(y);
  const sc::Tensor r = sc::mod(x, y) + sc::floor_div(x, y);
  CHECK(t.gradient(r, x).to_vector<double>() == std::vector<double>{1, 1});
  CHECK(t.gradient(r, y).to_vector<double>() == std::vector<double>{-2, 3});
}

// pow with one exponent for a whole row (a tensor to a number) takes its path once a row
// (rules::Pow::with_second): at every length (SIMD body and padded tail), with the special values
// in every lane, the scalar rule's bits, and against references written here: a * a, a, 1 / a,
// sqrt with pow's signs, x^3 in double, and the C library's pow in double within an ulp.
static_assert(sc::backend::cpu::FixesSecond<sc::ops::Pow, float> && sc::backend::cpu::FixesSecond<sc::ops::Pow, double>);
static_assert(sc::backend::cpu::FixesSecond<sc::ops::Pow, std::int32_t> && sc::backend::cpu::FixesSecond<sc::ops::Pow, std::int64_t>);
static_assert(!sc::backend::cpu::FixesSecond<sc::ops::Add, float>);
TEMPLATE_TEST_CASE("pow to one exponent: a row's path chosen once, the scalar rule's bits at every length", "[elementwise]",
                   float, double) {
  using T = TestType;
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  const std::vector<T> pool = {T(1.5), T(-2), T(0), -T(0), inf, T(0.3), -inf, nan, T(-0.75), T(7), T(1e-20), T(-3.5), T(2)};
  const std::vector<T> exps = {T(2), T(1), T(-1), T(0.5), T(3), T(2.5), T(-3), T(0), T(-0.5), nan};
  const auto same = [](T x, T y) { return std::memcmp(&x, &y, sizeof(T)) == 0 || (std::isnan(x) && std::isnan(y)); };
  for (const T e : exps)
    for (std::int64_t n = 1; n <= 37; n += (n < 20 ? 1 : 8)) {
      std::vector<T> a(n);
      for (std::int64_t i = 0; i < n; ++i) a[i] = pool[(i * 5 + static_cast<std::int64_t>(n)) % pool.size()];
      const std::vector<T> got = sc::pow(sc::tensor(a), sc::tensor(std::vector<T>{e})).template to_vector<T>();
      // the same row as a 2-row broadcast of the exponent tensor [1, 1]
      const std::vector<T> rows =
          sc::pow(sc::tensor(a, {1, n}), sc::tensor(std::vector<T>{e}, {1, 1})).template to_vector<T>();
      for (std::int64_t i = 0; i < n; ++i) {
        const T x = a[i];
        INFO("pow(" << x << ", " << e << "), n " << n << " at " << i);
        CHECK(same(got[i], sc::rules::Pow::f(x, e)));
        CHECK(same(rows[i], got[i]));
        if (e == T(2)) CHECK(same(got[i], x * x));
        if (e == T(1)) CHECK(same(got[i], x));
        if (e == T(-1)) CHECK(same(got[i], T(1) / x));
        if (e == T(0)) CHECK(got[i] == T(1));  // pow(x, 0) is 1, NaN included
        if (e == T(0.5)) CHECK(same(got[i], x > T(0) && x < inf ? std::sqrt(x) : std::pow(x, e)));
        if (e == T(3) && std::is_same_v<T, float> && std::isfinite(x))
          CHECK(same(got[i], static_cast<T>(double(x) * double(x) * double(x))));
        if (!std::isnan(e) && std::isfinite(x) && x != T(0) && e != T(0.5)) {
          const double want = std::pow(double(x), double(e));
          if (std::isfinite(want) && std::fabs(want) > 1e-30 && std::fabs(want) < 1e30)
            CHECK(std::fabs(double(got[i]) - want) <= std::fabs(want) * double(std::numeric_limits<T>::epsilon()));
          else
            CHECK(same(got[i], static_cast<T>(want)));
        }
        if (std::isnan(e)) CHECK(std::isnan(got[i]) == (x != T(1)));
      }
    }
}

// pow to an exponent of no form of its own splits rows of a few thousand elements over threads
// (ops::Pow::cpu_grain, a heavy grain): at 1 and 2 threads, the scalar rule's bits everywhere.
TEST_CASE("pow's heavy grain: threads split a 64K row, every element the scalar rule's", "[elementwise][threads]") {
  const sc::Tensor a = sc::random::uniform({65537}, 0.0, 3.0, 7);
  const auto va = a.to_vector<float>();
  sctest::at_threads({1, 2}, [&](int) {
    for (const float e : {2.5f, -0.75f, 2.f}) {
      const auto got = sc::pow(a, sc::tensor({e})).to_vector<float>();
      const auto mixed = sc::pow(a, sc::tensor(std::vector<float>(va.size(), e))).to_vector<float>();
      int bad = 0;
      for (std::size_t i = 0; i < va.size(); ++i) {
        const float want = sc::rules::Pow::f(va[i], e);
        bad += std::memcmp(&got[i], &want, sizeof want) != 0;
        bad += std::memcmp(&mixed[i], &want, sizeof want) != 0;
      }
      CHECK(bad == 0);
    }
  });
}

// floor_div and mod on int64 (an integer division a lane) take the heavy grain too: a 64K row at
// 1 and 2 threads against Python's floor division and remainder written out here.
TEST_CASE("floor_div and mod on int64 split 64K rows over threads, Python's values", "[elementwise][threads]") {
  const std::int64_t n = 65537;
  std::vector<std::int64_t> a(n), b(n);
  for (std::int64_t i = 0; i < n; ++i) {
    a[i] = (i * 7919) % 20001 - 10000;
    b[i] = (i % 41) - 20;  // zero divisors too: 0 for both
  }
  const sc::Tensor ta = sc::tensor(a), tb = sc::tensor(b);
  sctest::at_threads({1, 2}, [&](int) {
    const auto q = sc::floor_div(ta, tb).to_vector<std::int64_t>(), m = sc::mod(ta, tb).to_vector<std::int64_t>();
    const auto q7 = sc::floor_div(ta, -7).to_vector<std::int64_t>();
    int bad = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t wq = 0, wm = 0;
      if (b[i] != 0) {
        wq = a[i] / b[i];
        if (wq * b[i] != a[i] && ((a[i] < 0) != (b[i] < 0))) --wq;
        wm = a[i] - wq * b[i];
      }
      std::int64_t w7 = a[i] / -7;
      if (w7 * -7 != a[i] && a[i] > 0) --w7;
      bad += q[i] != wq;
      bad += m[i] != wm;
      bad += q7[i] != w7;
    }
    CHECK(bad == 0);
  });
}

// Integer pow on SIMD batches (repeated squaring, each lane its own exponent's bits; one exponent a
// row through its bits once): a costly grain, a 64K row at 1 and 2 threads against products
// written out here (wrapping in uint32, as int32's pow defines), exponent tensors and scalars.
TEST_CASE("integer pow on batches and threads: repeated products, wrapping", "[elementwise][threads]") {
  const std::int64_t n = 65537;
  std::vector<std::int32_t> a(n), b(n);
  for (std::int64_t i = 0; i < n; ++i) {
    a[i] = static_cast<std::int32_t>((i * 7919) % 41) - 20;
    b[i] = static_cast<std::int32_t>(i % 23) - 2;  // -2 and -1 too: 0 unless |a| is 1
  }
  const auto written_out = [](std::int32_t x, std::int32_t e) -> std::int32_t {
    if (e < 0) return x == 1 || (x == -1 && (-e) % 2 == 0) ? 1 : x == -1 ? -1 : 0;
    std::uint32_t p = 1;
    for (std::int32_t k = 0; k < e; ++k) p *= static_cast<std::uint32_t>(x);
    return static_cast<std::int32_t>(p);
  };
  const sc::Tensor ta = sc::tensor(a), tb = sc::tensor(b);
  sctest::at_threads({1, 2}, [&](int) {
    const auto got = sc::pow(ta, tb).to_vector<std::int32_t>();
    int bad = 0;
    for (std::int64_t i = 0; i < n; ++i) bad += got[i] != written_out(a[i], b[i]);
    CHECK(bad == 0);
    for (const std::int32_t e : {7, -3, 0, 1}) {  // one exponent a row: with_second
      INFO("exponent " << e);
      const auto row = sc::pow(ta, sc::full({}, e, sc::i32)).to_vector<std::int32_t>();
      int row_bad = 0;
      for (std::int64_t i = 0; i < n; ++i) row_bad += row[i] != written_out(a[i], e);
      CHECK(row_bad == 0);
    }
  });
}
