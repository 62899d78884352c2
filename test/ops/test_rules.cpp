// The elementwise rules (ops/rules.hpp): one generic functor per op, the same numbers on scalars
// and on SIMD batches (special values included), and a header that needs nothing but <cmath>.
#include <stagecraft/ops/rules.hpp>  // first, alone: it must compile without any other header

#include <catch2/catch.hpp>
#include <stagecraft/backend/cpu/elementwise.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "bit_patterns.hpp"
#include "pow_floats.hpp"

namespace {

namespace sc = stagecraft;
namespace r = sc::rules;
template <class T>
using B = sc::backend::cpu::batch<T>;

/// The float specials and a spread of ordinary values.
template <class T>
std::vector<T> specials() {
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> v = {T(0), -T(0), T(1), T(-1), T(0.5), T(-2.25), T(3), inf, -inf, nan, T(1e-30), T(-7e20), T(-0.5), T(2.5), T(-0.3)};
  while (v.size() % B<T>::size) v.push_back(T(0.125) * static_cast<T>(v.size()));
  return v;
}

bool same(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b)); }

/// f on every scalar equals f on the batches holding them, bit for bit (NaN: any NaN).
template <class T, class Rule>
void unary_agrees() {
  const std::vector<T> x = specials<T>();
  for (std::size_t i = 0; i < x.size(); i += B<T>::size) {
    alignas(64) T out[B<T>::size];
    Rule::f(B<T>::load_unaligned(x.data() + i)).store_aligned(out);
    for (std::size_t k = 0; k < B<T>::size; ++k) {
      INFO("x = " << x[i + k] << " (signbit " << std::signbit(static_cast<double>(x[i + k])) << ") rule " << typeid(Rule).name());
      CHECK(same(static_cast<double>(Rule::f(x[i + k])), static_cast<double>(out[k])));
    }
  }
}

template <class T, class Rule>
void binary_agrees() {
  const std::vector<T> x = specials<T>();
  for (std::size_t j = 0; j < x.size(); ++j)
    for (std::size_t i = 0; i < x.size(); i += B<T>::size) {
      alignas(64) T out[B<T>::size];
      Rule::f(B<T>::load_unaligned(x.data() + i), B<T>(x[j])).store_aligned(out);
      for (std::size_t k = 0; k < B<T>::size; ++k) {
        INFO("a = " << x[i + k] << ", b = " << x[j]);
        CHECK(same(static_cast<double>(Rule::f(x[i + k], x[j])), static_cast<double>(out[k])));
      }
    }
}

/// Rule::f_ordered_b (for a b known not to be NaN) equals Rule::f, bit for bit, on scalars and
/// batches, for every special a and every non-NaN special b.
template <class T, class Rule>
void ordered_b_agrees() {
  const std::vector<T> x = specials<T>();
  for (std::size_t j = 0; j < x.size(); ++j) {
    if (std::isnan(static_cast<double>(x[j]))) continue;
    for (std::size_t i = 0; i < x.size(); i += B<T>::size) {
      alignas(64) T out[B<T>::size];
      Rule::f_ordered_b(B<T>::load_unaligned(x.data() + i), B<T>(x[j])).store_aligned(out);
      for (std::size_t k = 0; k < B<T>::size; ++k) {
        INFO("a = " << x[i + k] << ", b = " << x[j]);
        CHECK(same(static_cast<double>(Rule::f(x[i + k], x[j])), static_cast<double>(out[k])));
        CHECK(same(static_cast<double>(Rule::f(x[i + k], x[j])), static_cast<double>(Rule::f_ordered_b(x[i + k], x[j]))));
        if (x[j] != T(0)) {  // and the one-instruction form when b is not zero either
          alignas(64) T one[B<T>::size];
          Rule::f_ordered_nonzero_b(B<T>::load_unaligned(x.data() + i), B<T>(x[j])).store_aligned(one);
          CHECK(same(static_cast<double>(Rule::f(x[i + k], x[j])), static_cast<double>(one[k])));
          CHECK(same(static_cast<double>(Rule::f(x[i + k], x[j])),
                     static_cast<double>(Rule::f_ordered_nonzero_b(x[i + k], x[j]))));
        }
      }
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("rules: max/min with a non-NaN b take the short form with the same bits", "[rules]", float, double) {
  ordered_b_agrees<TestType, r::Maximum>();
  ordered_b_agrees<TestType, r::Minimum>();
}

TEMPLATE_TEST_CASE("rules: scalar and SIMD forms agree on special values", "[rules]", float, double) {
  using T = TestType;
  unary_agrees<T, r::Neg>();
  unary_agrees<T, r::Abs>();
  unary_agrees<T, r::Square>();
  unary_agrees<T, r::Relu>();
  unary_agrees<T, r::Sign>();
  unary_agrees<T, r::Floor>();
  unary_agrees<T, r::Ceil>();
  unary_agrees<T, r::Round>();
  binary_agrees<T, r::Add>();
  binary_agrees<T, r::Sub>();
  binary_agrees<T, r::Mul>();
  binary_agrees<T, r::Div>();
  binary_agrees<T, r::Maximum>();
  binary_agrees<T, r::Minimum>();
  binary_agrees<T, r::ReluGrad>();
}

// rules::math::fmod (what mod and floor_div on floats take their remainder from) gives the C
// library's fmod bit for bit: random bit patterns (every exponent gap, subnormals, NaNs and
// infinities), ordinary values with quotients up to 10^5, whole divisors, and the specials.
TEMPLATE_TEST_CASE("rules: math::fmod is the C library's fmod, bit for bit", "[rules]", float, double) {
  using T = TestType;
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  sc_test::SplitMix64 next{0x9e3779b97f4a7c15ull};
  const auto bits = [](U u) { return sc_test::SplitMix64::bits_of<T>(u); };
  const auto unit = [&] { return next.unit<T>(); };
  std::size_t differ = 0, n = 0;
  const auto check = [&](T a, T b) {
    const T got = r::math::fmod(a, b), want = std::fmod(a, b);
    ++n;
    if (std::memcmp(&got, &want, sizeof got) != 0 && !(std::isnan(got) && std::isnan(want))) {
      if (++differ <= 5) UNSCOPED_INFO("fmod(" << a << ", " << b << "): " << got << ", the C library " << want);
    }
  };
  for (int i = 0; i < 200000; ++i) {
    check(bits(static_cast<U>(next())), bits(static_cast<U>(next())));
    check(bits(static_cast<U>(next())), bits(static_cast<U>(next() >> (i % 16 * (sizeof(U) / 2)))));
    check((unit() - T(0.5)) * T(2000), (unit() - T(0.5)) * T(0.02));
    check((unit() - T(0.5)) * T(2000), std::round((unit() - T(0.5)) * T(20)));
  }
  for (const T a : specials<T>())
    for (const T b : specials<T>()) check(a, b);
  for (const T a : {std::numeric_limits<T>::max(), std::numeric_limits<T>::denorm_min(), std::numeric_limits<T>::min()})
    for (const T b : {std::numeric_limits<T>::denorm_min(), std::numeric_limits<T>::min(), T(3), T(-0.1)}) {
      check(a, b);
      check(-a, b);
    }
  INFO(differ << " of " << n << " differ");
  CHECK(differ == 0);
}

// pow's common exponents 2, 1, -1 and 0.5 on batches (a * a, a, 1 / a, sqrt with pow's signs) and
// every other exponent lane by lane: the scalar rule's bits, in batches of one exponent and mixed.
TEMPLATE_TEST_CASE("rules: pow on batches gives the scalar rule's bits, and its common exponents are exact", "[rules]",
                   float, double) {
  using T = TestType;
  STATIC_REQUIRE(r::on_batches<r::Pow, B<T>>);
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  const std::vector<T> x = specials<T>();
  const std::vector<T> exps = {T(2), T(1), T(-1), T(0.5), T(3), T(-2.25), T(0), nan, -T(0.5)};
  constexpr std::size_t W = B<T>::size;
  alignas(64) T out[W], e[W];
  for (std::size_t mixed = 0; mixed <= exps.size(); ++mixed)  // one exponent a batch, then all mixed
    for (std::size_t i = 0; i < x.size(); i += W) {
      for (std::size_t k = 0; k < W; ++k) e[k] = exps[mixed < exps.size() ? mixed : (i + k) % exps.size()];
      r::Pow::f(B<T>::load_unaligned(x.data() + i), B<T>::load_aligned(e)).store_aligned(out);
      for (std::size_t k = 0; k < W; ++k) {
        INFO("a = " << x[i + k] << ", b = " << e[k]);
        CHECK(same(static_cast<double>(r::Pow::f(x[i + k], e[k])), static_cast<double>(out[k])));
      }
    }
  for (const T a : x) {
    INFO("a = " << a);
    CHECK(same(r::Pow::f(a, T(2)), a * a));
    CHECK(same(r::Pow::f(a, T(1)), a));
    CHECK(same(r::Pow::f(a, T(-1)), T(1) / a));
    if (a > T(0) && !std::isinf(a)) CHECK(same(r::Pow::f(a, T(0.5)), std::sqrt(a)));
    else CHECK(same(r::Pow::f(a, T(0.5)), std::pow(a, T(0.5))));  // pow's specials: +0 for -0, +inf for -inf
  }
  CHECK_FALSE(std::signbit(r::Pow::f(-T(0), T(0.5))));
  CHECK(r::Pow::f(-inf, T(0.5)) == inf);
  CHECK(std::isnan(r::Pow::f(T(-4), T(0.5))));
  CHECK(r::Pow::f(T(0), T(-1)) == inf);
  CHECK(r::Pow::f(-T(0), T(-1)) == -inf);
}

// Every other exponent of a float in doubles: the correctly rounded x^y (that of glibc's double pow
// rounded to float) but where x^y lies all but on a midpoint between two floats, never more than
// an ulp from it or from glibc's powf, the IEEE specials of both, and a batch's lanes the scalar's.
TEST_CASE("rules: pow on floats is x^y correctly rounded, and the same bits on batches", "[rules]") {
  const sc_test::PowFloatCounts c = sc_test::check_pow_floats(4 * 4096 * 16);
  INFO(c.not_rounded << " of " << c.pairs << " not correctly rounded");
  CHECK(c.not_rounded <= 4);
  CHECK(c.beyond_one_ulp == 0);
  CHECK(c.batch_differ == 0);
  // the signs of a negative base to whole powers, and the specials around them
  CHECK(r::Pow::f(-2.f, 3.f) == -8.f);
  CHECK(r::Pow::f(-2.f, -3.f) == -0.125f);
  CHECK(r::Pow::f(-2.f, 4.f) == 16.f);
  CHECK(std::isnan(r::Pow::f(-2.f, 2.5f)));
  CHECK(std::signbit(r::Pow::f(-1e30f, -3.f)));  // -0: underflows with the odd power's sign
  CHECK(r::Pow::f(-1e30f, 3.f) == -std::numeric_limits<float>::infinity());
  CHECK(r::Pow::f(2.f, -149.f) == std::numeric_limits<float>::denorm_min());
  CHECK(r::Pow::f(1.f, std::numeric_limits<float>::quiet_NaN()) == 1.f);
  CHECK(r::Pow::f(std::numeric_limits<float>::quiet_NaN(), 0.f) == 1.f);
  CHECK(r::Pow::f(-1.f, -std::numeric_limits<float>::infinity()) == 1.f);
  CHECK(r::Pow::f(3.f, 1e30f) == std::numeric_limits<float>::infinity());
  CHECK(r::Pow::f(-3.f, 1e30f) == std::numeric_limits<float>::infinity());  // a whole, even power
}

TEST_CASE("rules: values of the piecewise rules", "[rules]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK(std::signbit(r::Abs::f(-0.0)) == false);
  CHECK(r::Sign::f(-3.0) == -1.0);
  CHECK(r::Sign::f(0.0) == 0.0);
  CHECK(std::isnan(r::Sign::f(nan)));
  CHECK(r::Sign::f(std::int8_t{-5}) == -1);
  CHECK(r::Sign::f(std::uint8_t{5}) == 1);
  CHECK(std::isnan(r::Relu::f(nan)));
  CHECK(r::Relu::f(-2) == 0);
  CHECK(r::ReluGrad::f(3.0, 0.5) == 3.0);
  CHECK(r::ReluGrad::f(3.0, 0.0) == 0.0);
  CHECK(r::ReluGrad::f(3.0, -0.0) == 0.0);
  CHECK(r::ReluGrad::f(3.0, nan) == 0.0);  // as where(x > 0, g, 0)
  CHECK(std::signbit(r::ReluGrad::f(-0.0, 1.0)));  // g itself where x > 0
  CHECK(r::ReluGrad::f(std::int32_t{-7}, std::int32_t{2}) == -7);
  CHECK(std::isnan(r::Maximum::f(nan, 1.0)));
  CHECK(std::isnan(r::Maximum::f(1.0, nan)));
  CHECK(std::isnan(r::Minimum::f(1.0, nan)));
  CHECK(r::Maximum::f(std::int32_t{-3}, std::int32_t{2}) == 2);
  CHECK(r::Neg::f(std::uint8_t{1}) == 255);  // wraps, as the integer loops do
  CHECK(r::Pow::f(2, 10) == 1024);
  CHECK(r::Pow::f(-1, -3) == -1);
  CHECK(r::Pow::f(3, -1) == 0);
  CHECK(std::isinf(r::Pow::f(0.0, -1.0)));
  CHECK(r::Round::f(2.5) == 2.0);
  CHECK(r::Round::f(-3.5) == -4.0);
  CHECK(std::signbit(r::Round::f(-0.25)));
  CHECK(std::signbit(r::Ceil::f(-0.75)));
  CHECK(r::Floor::f(-0.75) == -1.0);
  CHECK(r::Floor::f(std::int32_t{-9}) == -9);
  CHECK(std::isinf(r::Ceil::f(-std::numeric_limits<double>::infinity())));
  static_assert(!r::Pow::vectorizes && r::Exp::vectorizes);
}

// exp's batches at the ends of the range and log's on subnormal doubles give what the scalar rule
// (the C library) gives, within 2 ulps: xsimd 8 alone gave e^88.5f = inf, e^-100.f = 0 and
// log(2.2e-308) = -745.8 (-708.4 is right).
TEMPLATE_TEST_CASE("rules: exp and log of batches agree with the scalar rule at the ends of the range", "[rules]",
                   float, double) {
  using T = TestType;
  constexpr bool f32 = std::is_same_v<T, float>;
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  const T tiny = std::numeric_limits<T>::denorm_min(), least = std::numeric_limits<T>::min();
  std::vector<T> x = {tiny, T(5) * tiny, least / T(7), least * T(0.999), least, T(0), -T(0), -tiny, nan, inf, -inf, T(0.5)};
  for (const double v : f32 ? std::vector<double>{88.2, 88.4, 88.7, 88.72, 88.8, -87.2, -87.5, -88.5, -95, -103, -104, -120}
                            : std::vector<double>{709.3, 709.5, 709.78, 709.8, -708.3, -708.5, -720, -744.4, -745.2, -746})
    x.push_back(static_cast<T>(v));
  while (x.size() % B<T>::size) x.push_back(T(1));
  auto close = [&](T got, T want) {
    if (std::isnan(want)) return std::isnan(got);
    if (std::isinf(want) || want == T(0)) return got == want;
    return std::abs(got - want) <= T(2) * std::numeric_limits<T>::epsilon() * std::abs(want) + T(2) * tiny;
  };
  for (std::size_t i = 0; i < x.size(); i += B<T>::size) {
    alignas(64) T e[B<T>::size], l[B<T>::size];
    r::Exp::f(B<T>::load_unaligned(x.data() + i)).store_aligned(e);
    r::Log::f(B<T>::load_unaligned(x.data() + i)).store_aligned(l);
    for (std::size_t k = 0; k < B<T>::size; ++k) {
      const T v = x[i + k];
      INFO("x = " << v << ": exp " << e[k] << " (scalar " << r::Exp::f(v) << "), log " << l[k] << " (scalar " << r::Log::f(v) << ")");
      CHECK(close(e[k], r::Exp::f(v)));
      CHECK(close(l[k], r::Log::f(v)));
      CHECK(same(static_cast<double>(r::Exp::f(v)), static_cast<double>(std::exp(v))));  // scalars: the C library
    }
  }
}

/// a^b for integers the long way: b products in unsigned (wrapping) arithmetic; negative b by
/// the rule's definition (1^b = 1, (-1)^b = +-1, 0 for the rest).
template <class T>
T naive_integer_pow(T a, T b) {
  using U = std::make_unsigned_t<T>;
  if (b < 0) return a == 1 ? T(1) : a == -1 ? T(b % 2 == 0 ? 1 : -1) : T(0);
  U r = 1;
  for (T k = 0; k < b; ++k) r = static_cast<U>(r * static_cast<U>(a));
  return static_cast<T>(r);
}

// pow on integer batches (integer_pow): every lane its own exponent, or one exponent a row
// (with_second): the products of the long way, wrapping, for bases and exponents up to both ends.
TEMPLATE_TEST_CASE("rules: integer pow on batches is repeated multiplication, wrapping", "[rules]", std::int32_t,
                   std::int64_t) {
  using T = TestType;
  constexpr std::size_t W = B<T>::size;
  STATIC_REQUIRE(r::on_batches<r::Pow, B<T>>);
  std::vector<T> bases;
  for (int k = -6; k <= 6; ++k) bases.push_back(static_cast<T>(k));
  for (const T v : {std::numeric_limits<T>::max(), std::numeric_limits<T>::min(), T(46341), T(65536), T(-65537),
                    T(1) << (8 * sizeof(T) - 2), static_cast<T>(0x5bd1e995)})
    bases.push_back(v);
  while (bases.size() % W) bases.push_back(static_cast<T>(bases.size()));
  std::vector<T> exps;
  for (int k = -5; k <= 70; ++k) exps.push_back(static_cast<T>(k));
  const T max = std::numeric_limits<T>::max();
  // exponents too long to multiply out: against the scalar rule (itself checked below on 0..70)
  const std::vector<T> long_exps = {max, T(max - 1), T(1000003), std::numeric_limits<T>::min(), T(-max)};
  alignas(64) T out[W], e[W], row[W];
  for (const T a : bases)
    for (const T b : exps) {
      INFO("a = " << +a << ", b = " << +b);
      CHECK(r::Pow::f(a, b) == naive_integer_pow(a, b));
    }
  std::vector<T> all_exps = exps;
  all_exps.insert(all_exps.end(), long_exps.begin(), long_exps.end());
  int lanes = 0, differ = 0;
  for (std::size_t shift = 0; shift < all_exps.size(); ++shift)
    for (std::size_t i = 0; i < bases.size(); i += W) {
      const B<T> a = B<T>::load_unaligned(bases.data() + i);
      for (std::size_t k = 0; k < W; ++k) e[k] = all_exps[(shift + 7 * k) % all_exps.size()];  // mixed lanes
      r::Pow::f(a, B<T>::load_aligned(e)).store_aligned(out);
      const T one_b = all_exps[shift];  // one exponent, as a row's loop takes it
      r::Pow::with_second(one_b, [&](const auto& g) { B<T>(g(a)).store_aligned(row); });
      for (std::size_t k = 0; k < W; ++k) {
        ++lanes;
        differ += out[k] != r::Pow::f(bases[i + k], e[k]);
        differ += row[k] != r::Pow::f(bases[i + k], one_b);
      }
    }
  INFO(differ << " of " << 2 * lanes << " lanes differ from the scalar rule");
  CHECK(differ == 0);
  // long exponents against the long way's pieces: 3^max = 3^(max - 1) 3, and 3^(2^20) is 3 squared 20 times
  using U = std::make_unsigned_t<T>;
  CHECK(r::Pow::f(T(3), max) == static_cast<T>(static_cast<U>(r::Pow::f(T(3), T(max - 1))) * U(3)));
  U squared = 3;
  for (int k = 0; k < 20; ++k) squared = static_cast<U>(squared * squared);
  CHECK(r::Pow::f(T(3), T(1) << 20) == static_cast<T>(squared));
  CHECK(r::Pow::f(T(-1), max) == T(-1));
  CHECK(r::Pow::f(T(-1), std::numeric_limits<T>::min()) == T(1));
  CHECK(r::Pow::f(T(2), T(8 * sizeof(T))) == T(0));  // wraps to 0
}

TEMPLATE_TEST_CASE("rules: integer batches agree with integer scalars", "[rules]", std::int32_t, std::int64_t, std::int8_t) {
  using T = TestType;
  std::vector<T> x;
  for (int k = 0; x.size() < 2 * B<T>::size; ++k) x.push_back(static_cast<T>((k * 37) % 19 - 9));
  for (std::size_t i = 0; i < x.size(); i += B<T>::size) {
    alignas(64) T s[B<T>::size], a[B<T>::size], m[B<T>::size];
    const B<T> v = B<T>::load_unaligned(x.data() + i);
    r::Sign::f(v).store_aligned(s);
    r::Abs::f(v).store_aligned(a);
    r::Maximum::f(v, B<T>(T(1))).store_aligned(m);
    for (std::size_t k = 0; k < B<T>::size; ++k) {
      CHECK(s[k] == r::Sign::f(x[i + k]));
      CHECK(a[k] == r::Abs::f(x[i + k]));
      CHECK(m[k] == r::Maximum::f(x[i + k], T(1)));
    }
  }
}

TEMPLATE_TEST_CASE("rules: comparisons and logical ops give the same truth on scalars and lanes", "[rules]", float,
                   double) {
  using T = TestType;
  const std::vector<T> x = specials<T>();
  auto check = [&](auto rule, const char* name) {
    for (std::size_t j = 0; j < x.size(); ++j)
      for (std::size_t i = 0; i < x.size(); i += B<T>::size) {
        const auto m = decltype(rule)::f(B<T>::load_unaligned(x.data() + i), B<T>(x[j]));
        alignas(64) T lanes[B<T>::size];
        xsimd::select(m, B<T>(T(1)), B<T>(T(0))).store_aligned(lanes);
        for (std::size_t k = 0; k < B<T>::size; ++k) {
          INFO(name << "(" << x[i + k] << ", " << x[j] << ")");
          CHECK((lanes[k] != T(0)) == decltype(rule)::f(x[i + k], x[j]));
        }
      }
  };
  check(r::Less{}, "less");
  check(r::LessEqual{}, "less_equal");
  check(r::Greater{}, "greater");
  check(r::GreaterEqual{}, "greater_equal");
  check(r::Equal{}, "equal");
  check(r::NotEqual{}, "not_equal");
  check(r::LogicalAnd{}, "logical_and");
  check(r::LogicalOr{}, "logical_or");
  const T nan = std::numeric_limits<T>::quiet_NaN();
  CHECK(r::NotEqual::f(nan, nan));
  CHECK(r::LogicalAnd::f(nan, T(1)));
  CHECK(r::LogicalNot::f(T(0)));
  CHECK_FALSE(r::LogicalNot::f(nan));
}

// ---- where and cast rules, and the loops that store lane masks as bools ------------------------

namespace {

namespace cpu = sc::backend::cpu;

/// The loops' view of a rule, as ops::Unary / ops::Binary / ops::CastTo give it.
template <class Rule>
struct Loop : Rule {
  template <class... V>
    requires requires(V... x) { Rule::f(x...); }
  static auto scalar(V... x) {
    return Rule::f(x...);
  }
  template <class... Bs>
    requires requires(const Bs&... x) { Rule::f(x...); }
  static auto simd(const Bs&... x) {
    return Rule::f(x...);
  }
};
template <class To>
struct LoopCast : r::Cast<To> {
  template <class S> static To scalar(S x) { return r::Cast<To>::f(x); }
  template <class Bs>
    requires(std::is_same_v<To, bool> || cpu::exact_batch_cast<typename Bs::value_type, To>)
  static auto simd(const Bs& x) {
    return r::Cast<To>::f(x);
  }
};

/// n values cycling through the specials (NaN, +-0, +-inf, ...), from offset `from`.
template <class T>
std::vector<T> cycle(std::size_t n, std::size_t from) {
  std::vector<T> s;
  if constexpr (std::is_floating_point_v<T>) s = specials<T>();
  else s = {T(0), T(1), T(-1), T(7), T(-100), std::numeric_limits<T>::max(), std::numeric_limits<T>::min(), T(0)};
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = s[(i + from) % s.size()];
  return v;
}

/// Bools written after the n results must stay untouched.
constexpr std::size_t guard = 70;

template <class T, class Rule>
void binary_mask_loop_agrees() {
  constexpr std::int64_t W = B<T>::size;
  const int strides[4][2] = {{1, 1}, {0, 1}, {1, 0}, {0, 0}};
  for (std::int64_t n = 0; n <= 2 * W + 1; ++n)
    for (const auto& s : strides)
      for (std::size_t from = 0; from < 5; ++from) {
        const std::vector<T> a = cycle<T>(static_cast<std::size_t>(n) + 1, from), b = cycle<T>(static_cast<std::size_t>(n) + 1, 3 * from + 1);
        std::vector<unsigned char> y(static_cast<std::size_t>(n) + guard, 0xAB);
        cpu::binary_row<Loop<Rule>, T, bool>(a.data(), b.data(), reinterpret_cast<bool*>(y.data()), n, s[0], s[1]);
        for (std::int64_t i = 0; i < n; ++i) {
          const T ai = a[s[0] ? i : 0], bi = b[s[1] ? i : 0];
          INFO(typeid(Rule).name() << " n " << n << " strides " << s[0] << s[1] << " at " << i << ": " << ai << ", " << bi);
          CHECK(y[i] == (Rule::f(ai, bi) ? 1 : 0));
        }
        for (std::size_t g = static_cast<std::size_t>(n); g < y.size(); ++g) CHECK(y[g] == 0xAB);
      }
}

template <class T, class Rule>
void unary_mask_loop_agrees() {
  constexpr std::int64_t W = B<T>::size;
  for (std::int64_t n = 0; n <= 2 * W + 1; ++n)
    for (std::size_t from = 0; from < 5; ++from) {
      const std::vector<T> x = cycle<T>(static_cast<std::size_t>(n), from);
      std::vector<unsigned char> y(static_cast<std::size_t>(n) + guard, 0xAB);
      cpu::unary_range<Rule, T, bool>(x.data(), reinterpret_cast<bool*>(y.data()), n);
      for (std::int64_t i = 0; i < n; ++i) {
        INFO("n " << n << " at " << i << ": " << x[i]);
        CHECK(y[i] == (Rule::scalar(x[i]) ? 1 : 0));
      }
      for (std::size_t g = static_cast<std::size_t>(n); g < y.size(); ++g) CHECK(y[g] == 0xAB);
    }
}

template <class T>
void select_loop_agrees() {
  constexpr std::int64_t W = B<T>::size;
  for (int s = 0; s < 8; ++s)
    for (std::int64_t n = 0; n <= 2 * W + 1; ++n) {
      const std::int64_t s0 = (s >> 2) & 1, s1 = (s >> 1) & 1, s2 = s & 1;
      std::vector<unsigned char> cb(static_cast<std::size_t>(n) + 1);
      for (std::size_t i = 0; i < cb.size(); ++i) cb[i] = ((i * 7 + static_cast<std::size_t>(n)) % 3) == 0;
      const bool* c = reinterpret_cast<const bool*>(cb.data());
      const std::vector<T> a = cycle<T>(static_cast<std::size_t>(n) + 1, 1), b = cycle<T>(static_cast<std::size_t>(n) + 1, 4);
      std::vector<T> y(static_cast<std::size_t>(n) + guard, T(42));
      cpu::select_row<r::Where>(c, a.data(), b.data(), y.data(), n, s0, s1, s2);
      for (std::int64_t i = 0; i < n; ++i) {
        const T want = r::Where::f(c[s0 * i], a[s1 * i], b[s2 * i]);
        INFO("where n " << n << " strides " << s0 << s1 << s2 << " at " << i << ": want " << want << " got " << y[i]);
        CHECK(same(static_cast<double>(want), static_cast<double>(y[i])));
        if constexpr (std::is_floating_point_v<T>) CHECK(std::signbit(want) == std::signbit(y[i]));
      }
      for (std::size_t g = static_cast<std::size_t>(n); g < y.size(); ++g) CHECK(y[g] == T(42));
    }
}

/// The cast loop from S to To equals static_cast (to bool: x != 0) on every length, tails included.
template <class S, class To>
void cast_loop_agrees(const std::vector<S>& values) {
  constexpr std::int64_t W = B<S>::size;
  for (std::int64_t n = 0; n <= 2 * W + 1; ++n) {
    std::vector<S> x(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = values[i % values.size()];
    using Store = std::conditional_t<std::is_same_v<To, bool>, unsigned char, To>;  // no vector<bool>
    std::vector<Store> y(static_cast<std::size_t>(n) + guard, Store(3));
    cpu::unary_range<LoopCast<To>, S, To>(x.data(), reinterpret_cast<To*>(y.data()), n);
    for (std::int64_t i = 0; i < n; ++i) {
      INFO("cast n " << n << " at " << i << ": " << x[i]);
      if constexpr (std::is_same_v<To, bool>) CHECK(y[i] == (x[i] == S(0) ? 0 : 1));
      else CHECK(same(static_cast<double>(y[i]), static_cast<double>(static_cast<To>(x[i]))));
    }
    for (std::size_t g = static_cast<std::size_t>(n); g < y.size(); ++g) CHECK(y[g] == Store(3));
  }
}

}  // namespace

TEMPLATE_TEST_CASE("rules: where selects the same bits on scalars and lanes", "[rules]", float, double) {
  using T = TestType;
  const std::vector<T> x = specials<T>();
  constexpr std::size_t W = B<T>::size;
  for (std::size_t j = 0; j < x.size(); ++j)
    for (std::size_t i = 0; i < x.size(); i += W) {
      alignas(64) bool m[W];
      for (std::size_t k = 0; k < W; ++k) m[k] = (i + k + j) % 3 != 0;
      alignas(64) T out[W];
      r::Where::f(cpu::mask<T>::load_aligned(m), B<T>::load_unaligned(x.data() + i), B<T>(x[j])).store_aligned(out);
      for (std::size_t k = 0; k < W; ++k) {
        INFO("where(" << m[k] << ", " << x[i + k] << ", " << x[j] << ")");
        const T want = r::Where::f(m[k], x[i + k], x[j]);
        CHECK(same(static_cast<double>(want), static_cast<double>(out[k])));
        CHECK(std::signbit(want) == std::signbit(out[k]));
      }
    }
  CHECK(std::signbit(r::Where::f(true, -T(0), T(0))));
  CHECK(std::isnan(r::Where::f(false, T(1), std::numeric_limits<T>::quiet_NaN())));
}

TEST_CASE("rules: cast converts as static_cast, to bool as x != 0", "[rules]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK(r::Cast<bool>::f(nan));
  CHECK_FALSE(r::Cast<bool>::f(-0.0));
  CHECK(r::Cast<std::int32_t>::f(-2.7f) == -2);
  CHECK(r::Cast<float>::f(true) == 1.f);
  CHECK(r::Cast<double>::f(std::int64_t{1} << 60) == 1152921504606846976.0);
  // Lanes: to bool on specials, int32 <-> float on ordinary values.
  const std::vector<float> x = specials<float>();
  for (std::size_t i = 0; i < x.size(); i += B<float>::size) {
    alignas(64) bool m[B<float>::size];
    cpu::store_mask<float>(m, r::Cast<bool>::f(B<float>::load_unaligned(x.data() + i)));
    for (std::size_t k = 0; k < B<float>::size; ++k) CHECK(m[k] == r::Cast<bool>::f(x[i + k]));
  }
  const B<float> v = B<float>::load_unaligned(cycle<float>(B<float>::size, 11).data()) * B<float>(1e3f);
  alignas(64) float vf[B<float>::size];
  alignas(64) std::int32_t vi[B<float>::size];
  v.store_aligned(vf);
  r::Cast<std::int32_t>::f(v).store_aligned(vi);
  for (std::size_t k = 0; k < B<float>::size; ++k)
    if (std::isfinite(vf[k]) && std::fabs(vf[k]) < 2e9f) CHECK(vi[k] == r::Cast<std::int32_t>::f(vf[k]));
}

TEMPLATE_TEST_CASE("masks: bools to lane masks and back, every partial length", "[rules][masks]", float, double,
                   std::int32_t, std::int64_t) {
  using T = TestType;
  constexpr std::int64_t W = B<T>::size;
  for (int pattern = 0; pattern < 6; ++pattern)
    for (std::int64_t r = 0; r <= W; ++r) {
      alignas(64) bool in[64] = {};
      for (std::int64_t k = 0; k < W; ++k) in[k] = ((k * (pattern + 1)) ^ pattern) % 3 == 0;
      const cpu::mask<T> m = cpu::load_mask<T>(in, r);
      alignas(64) unsigned char out[64 + guard];
      std::memset(out, 0xAB, sizeof out);
      cpu::store_mask<T>(reinterpret_cast<bool*>(out), m, W);
      for (std::int64_t k = 0; k < W; ++k) CHECK(out[k] == (k < r && in[k] ? 1 : 0));
      CHECK(out[W] == 0xAB);
      std::memset(out, 0xAB, sizeof out);
      if (r > 0) cpu::store_mask<T>(reinterpret_cast<bool*>(out), cpu::load_mask<T>(in), r);
      for (std::int64_t k = 0; k < r; ++k) CHECK(out[k] == (in[k] ? 1 : 0));
      for (std::int64_t k = r; k < W + 1; ++k) CHECK(out[k] == 0xAB);
      CHECK(cpu::mask_bits<T>(cpu::load_mask<T>(in)) == [&] {
        std::uint64_t b = 0;
        for (std::int64_t k = 0; k < W; ++k) b |= std::uint64_t{in[k]} << k;
        return b;
      }());
    }
}

TEMPLATE_TEST_CASE("loops: comparisons and logical ops store the scalar rule's bools, every length and stride",
                   "[rules][loops]", float, double, std::int32_t, std::int64_t) {
  using T = TestType;
  STATIC_REQUIRE(cpu::HasMask2<Loop<r::Less>, T>);
  STATIC_REQUIRE(!cpu::HasSimd2<Loop<r::Less>, T>);
  binary_mask_loop_agrees<T, r::Less>();
  binary_mask_loop_agrees<T, r::LessEqual>();
  binary_mask_loop_agrees<T, r::Greater>();
  binary_mask_loop_agrees<T, r::GreaterEqual>();
  binary_mask_loop_agrees<T, r::Equal>();
  binary_mask_loop_agrees<T, r::NotEqual>();
  binary_mask_loop_agrees<T, r::LogicalAnd>();
  binary_mask_loop_agrees<T, r::LogicalOr>();
  unary_mask_loop_agrees<T, Loop<r::LogicalNot>>();
  unary_mask_loop_agrees<T, LoopCast<bool>>();
}

TEMPLATE_TEST_CASE("loops: where selects as the scalar rule, every length and stride", "[rules][loops]", float,
                   double, std::int32_t, std::int64_t) {
  select_loop_agrees<TestType>();
}

TEST_CASE("loops: cast equals static_cast on every length", "[rules][loops]") {
  const std::vector<float> f = {0.f, -0.f, 1.5f, -1.5f, 2.5f, -2.7f, 123456.8f, -16777217.f, 1e9f, -2e9f, 0.49f};
  const std::vector<std::int32_t> i = {0, 1, -1, 16777217, -16777217, 2147483647, -2147483647 - 1, 33554431, 7};
  const std::vector<std::int64_t> l = {0, 1, -1, (std::int64_t{1} << 53) + 1, -(std::int64_t{1} << 60) - 3,
                                       std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min()};
  const std::vector<double> d = {0.0, -0.0, 2.5, -2.5, 9007199254740993.0, -4.6e18, 1e-300, 0.999999};
  STATIC_REQUIRE(cpu::HasConvert<LoopCast<float>, std::int32_t, float> == cpu::exact_batch_cast<std::int32_t, float>);
  cast_loop_agrees<float, std::int32_t>(f);
  cast_loop_agrees<std::int32_t, float>(i);
  cast_loop_agrees<std::int64_t, double>(l);
  cast_loop_agrees<double, std::int64_t>(d);
  cast_loop_agrees<float, double>(f);
  cast_loop_agrees<double, float>(d);
  cast_loop_agrees<std::int32_t, std::int64_t>(i);
  cast_loop_agrees<float, bool>(specials<float>());
  cast_loop_agrees<double, bool>(specials<double>());
  cast_loop_agrees<std::int32_t, bool>(i);
  cast_loop_agrees<std::int64_t, bool>(l);
}
