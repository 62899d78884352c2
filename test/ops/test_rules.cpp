// The elementwise rules (ops/rules.hpp): one generic functor per op, the same numbers on scalars
// and on SIMD batches (special values included), and a header that needs nothing but <cmath>.
#include <stagecraft/ops/rules.hpp>  // first, alone: it must compile without any other header

#include <catch2/catch.hpp>
#include <stagecraft/backend/cpu/elementwise.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <typeinfo>
#include <vector>

namespace {

namespace sc = stagecraft;
namespace r = sc::rules;
template <class T>
using B = sc::backend::cpu::batch<T>;

/// The float specials and a spread of ordinary values.
template <class T>
std::vector<T> specials() {
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> v = {T(0), -T(0), T(1), T(-1), T(0.5), T(-2.25), T(3), inf, -inf, nan, T(1e-30), T(-7e20)};
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

}  // namespace

TEMPLATE_TEST_CASE("rules: scalar and SIMD forms agree on special values", "[rules]", float, double) {
  using T = TestType;
  unary_agrees<T, r::Neg>();
  unary_agrees<T, r::Abs>();
  unary_agrees<T, r::Square>();
  unary_agrees<T, r::Relu>();
  unary_agrees<T, r::Sign>();
  binary_agrees<T, r::Add>();
  binary_agrees<T, r::Sub>();
  binary_agrees<T, r::Mul>();
  binary_agrees<T, r::Div>();
  binary_agrees<T, r::Maximum>();
  binary_agrees<T, r::Minimum>();
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
  CHECK(std::isnan(r::Maximum::f(nan, 1.0)));
  CHECK(std::isnan(r::Maximum::f(1.0, nan)));
  CHECK(std::isnan(r::Minimum::f(1.0, nan)));
  CHECK(r::Maximum::f(std::int32_t{-3}, std::int32_t{2}) == 2);
  CHECK(r::Neg::f(std::uint8_t{1}) == 255);  // wraps, as the integer loops do
  CHECK(r::Pow::f(2, 10) == 1024);
  CHECK(r::Pow::f(-1, -3) == -1);
  CHECK(r::Pow::f(3, -1) == 0);
  CHECK(std::isinf(r::Pow::f(0.0, -1.0)));
  static_assert(!r::Pow::vectorizes && r::Exp::vectorizes);
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
