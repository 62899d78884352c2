// Elementwise ops: broadcasting walks, scalar operands, promotion, error messages.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

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
  const int threads = sc::num_threads();
  for (const int n : {1, 2}) {
    sc::set_num_threads(n);
    INFO(n << " threads");
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
  }
  sc::set_num_threads(threads);
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
