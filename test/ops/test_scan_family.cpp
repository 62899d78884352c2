// cumprod, logcumsumexp, cummax, cummin, cumargmax, cumargmin, linear_scan: hand-worked values,
// every axis, flag and dtype against plain loops written here (long double), threads, the rules at
// NaN, infinities, zeros and ties, gradients by central differences (first and second order, zeros
// in cumprod, -inf in logcumsumexp), traced equal to eager, and errors.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "testing.hpp"

using sctest::error_of;
using sctest::uniform_tensor;

namespace {

constexpr double inf = std::numeric_limits<double>::infinity();
constexpr double qnan = std::numeric_limits<double>::quiet_NaN();

/// The lines of shape s around axis: outer, n, inner.
struct Lines {
  std::int64_t outer = 1, n = 1, inner = 1;
  Lines(const sc::Shape& s, int axis) {
    const int ax = axis < 0 ? axis + s.rank() : axis;
    for (int d = 0; d < ax; ++d) outer *= s[d];
    n = s[ax];
    for (int d = ax + 1; d < s.rank(); ++d) inner *= s[d];
  }
  std::size_t at(std::int64_t o, std::int64_t k, std::int64_t i) const {
    return static_cast<std::size_t>((o * n + k) * inner + i);
  }
};

/// A running value by a plain loop in long double: step(acc, x) after the first element (which
/// starts acc), `start` written first when exclusive.
std::vector<double> loop_scan(const std::vector<double>& x, const sc::Shape& s, int axis, bool exclusive, bool reverse,
                              long double start, const std::function<long double(long double, long double)>& step) {
  const Lines l(s, axis);
  std::vector<double> y(x.size());
  for (std::int64_t o = 0; o < l.outer; ++o)
    for (std::int64_t i = 0; i < l.inner; ++i) {
      long double acc = start;
      for (std::int64_t j = 0; j < l.n; ++j) {
        const std::size_t at = l.at(o, reverse ? l.n - 1 - j : j, i);
        if (exclusive) y[at] = static_cast<double>(acc);
        acc = j == 0 ? static_cast<long double>(x[at]) : step(acc, x[at]);
        if (!exclusive) y[at] = static_cast<double>(acc);
      }
    }
  return y;
}

long double ld_logaddexp(long double a, long double b) {
  if (std::isnan(a) || std::isnan(b)) return NAN;
  if (a == -INFINITY) return b;
  if (b == -INFINITY) return a;
  if (a == INFINITY || b == INFINITY) return INFINITY;
  const long double m = std::max(a, b);
  return m + std::log(std::exp(a - m) + std::exp(b - m));
}

/// |got - want| <= tol * max(1, |want|) elementwise, NaN matching NaN and infinities equal.
bool close(const std::vector<double>& got, const std::vector<double>& want, double tol, std::string& why) {
  if (got.size() != want.size()) return why = "size", false;
  for (std::size_t k = 0; k < got.size(); ++k) {
    const double g = got[k], w = want[k];
    if (std::isnan(w) ? std::isnan(g) : (std::isinf(w) ? g == w : std::fabs(g - w) <= tol * std::max(1.0, std::fabs(w))))
      continue;
    why = "element " + std::to_string(k) + ": got " + std::to_string(g) + ", want " + std::to_string(w);
    return false;
  }
  return true;
}

}  // namespace

TEST_CASE("scans: hand-worked values", "[scan]") {
  const sc::Tensor x = sc::tensor({{1.0, 2.0, 0.0, 3.0}, {2.0, -1.0, 4.0, 0.5}});
  CHECK(sc::cumprod(x, 1).to_vector<double>() == std::vector<double>{1, 2, 0, 0, 2, -2, -8, -4});
  CHECK(sc::cumprod(x, 1, true).to_vector<double>() == std::vector<double>{1, 1, 2, 0, 1, 2, -2, -8});
  CHECK(sc::cumprod(x, 1, false, true).to_vector<double>() == std::vector<double>{0, 0, 0, 3, -4, -2, 2, 0.5});
  CHECK(sc::cumprod(x, 0, true, true).to_vector<double>() == std::vector<double>{2, -1, 4, 0.5, 1, 1, 1, 1});
  CHECK(sc::cummax(x, 1).to_vector<double>() == std::vector<double>{1, 2, 2, 3, 2, 2, 4, 4});
  CHECK(sc::cummax(x, 1, true).to_vector<double>() == std::vector<double>{3, 3, 3, 3, 4, 4, 4, 0.5});
  CHECK(sc::cummin(x, -1).to_vector<double>() == std::vector<double>{1, 1, 0, 0, 2, -1, -1, -1});
  CHECK(sc::cummin(x, 0).to_vector<double>() == std::vector<double>{1, 2, 0, 3, 1, -1, 0, 0.5});
  CHECK(sc::cumargmax(x, 1).to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 1, 3, 0, 0, 2, 2});
  CHECK(sc::cumargmin(x, 1, true).to_vector<std::int64_t>() == std::vector<std::int64_t>{2, 2, 2, 3, 1, 1, 3, 3});
  CHECK(sc::cumargmax(x, 1).dtype() == sc::i64);
  // h = 0.5 h + x: 1, 2.5, 1.25, 3.625 | 2, 0, 4, 2.5; exclusive and reversed
  const sc::Tensor half = sc::full({2, 4}, 0.5, sc::f64);
  CHECK(sc::linear_scan(half, x, 1).to_vector<double>() == std::vector<double>{1, 2.5, 1.25, 3.625, 2, 0, 4, 2.5});
  CHECK(sc::linear_scan(half, x, 1, true).to_vector<double>() == std::vector<double>{0, 1, 2.5, 1.25, 0, 2, 0, 4});
  CHECK(sc::linear_scan(half, x, 1, false, true).to_vector<double>() ==
        std::vector<double>{2.375, 2.75, 1.5, 3, 2.5625, 1.125, 4.25, 0.5});
  // a broadcasts: one decay for every line; the first a is never read (h = b there)
  CHECK(sc::linear_scan(sc::tensor({inf, 0.5, 0.5, 0.5}), x, 1).to_vector<double>() ==
        std::vector<double>{1, 2.5, 1.25, 3.625, 2, 0, 4, 2.5});
  const std::vector<double> lse = sc::logcumsumexp(sc::tensor({0.0, 0.0, std::log(2.0)}), 0).to_vector<double>();
  CHECK(lse[0] == 0.0);
  CHECK(lse[1] == Approx(std::log(2.0)).epsilon(1e-15));
  CHECK(lse[2] == Approx(std::log(4.0)).epsilon(1e-15));
  CHECK(sc::logcumsumexp(sc::tensor({1.0, 2.0}), 0, true).to_vector<double>()[0] == -inf);
  // integers: products wrap as mul does; cummax of ints
  const sc::Tensor i = sc::tensor(std::vector<std::int32_t>{65536, 65536, 3, -7});
  CHECK(sc::cumprod(i).to_vector<std::int32_t>() == std::vector<std::int32_t>{65536, 0, 0, 0});
  CHECK(sc::cummax(sc::tensor(std::vector<std::int64_t>{-5, 3, 2, 9})).to_vector<std::int64_t>() ==
        std::vector<std::int64_t>{-5, 3, 3, 9});
  CHECK(sc::cumprod(sc::zeros({0, 3}), 1).shape() == sc::Shape{0, 3});
  CHECK(sc::cumargmin(sc::zeros({3, 0}), 1).shape() == sc::Shape{3, 0});
}

TEST_CASE("scans: the rules at NaN, infinities, zeros and ties", "[scan]") {
  // logcumsumexp: no overflow, -inf entries take no part, +inf stays, NaN propagates
  const std::vector<double> big = sc::logcumsumexp(sc::tensor({1e7, 1e7, -1e7}), 0).to_vector<double>();
  CHECK(big[1] == Approx(1e7 + std::log(2.0)).epsilon(1e-15));
  CHECK(big[2] == big[1]);
  CHECK(sc::logcumsumexp(sc::tensor({-inf, -inf, 1.0, -inf}), 0).to_vector<double>() ==
        std::vector<double>{-inf, -inf, 1.0, 1.0});
  CHECK(sc::logcumsumexp(sc::tensor({1.0, inf, 2.0}), 0).to_vector<double>() == std::vector<double>{1, inf, inf});
  const std::vector<double> n = sc::logcumsumexp(sc::tensor({1.0, qnan, 2.0}), 0).to_vector<double>();
  CHECK((n[0] == 1.0 && std::isnan(n[1]) && std::isnan(n[2])));
  // cummax: a NaN propagates; its index is the first NaN's; ties keep the first index
  const sc::Tensor t = sc::tensor({1.0, 3.0, 3.0, qnan, 5.0, qnan});
  const std::vector<double> m = sc::cummax(t, 0).to_vector<double>();
  CHECK((m[0] == 1 && m[1] == 3 && m[2] == 3 && std::isnan(m[3]) && std::isnan(m[4]) && std::isnan(m[5])));
  CHECK(sc::cumargmax(t, 0).to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 1, 3, 3, 3});
  CHECK(sc::cumargmin(t, 0).to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 0, 0, 3, 3, 3});
  CHECK(sc::cumargmax(t, 0, true).to_vector<std::int64_t>() == std::vector<std::int64_t>{5, 5, 5, 5, 5, 5});
  CHECK(sc::cumargmax(sc::tensor({2.0, 2.0, 1.0}), 0, true).to_vector<std::int64_t>() ==
        std::vector<std::int64_t>{1, 1, 2});
  // x at cumargmax is cummax, bit for bit (signed zeros too)
  const sc::Tensor z = sc::tensor({0.0, -0.0, -1.0, 0.0});
  const std::vector<double> zm = sc::cummax(z, 0).to_vector<double>();
  const std::vector<std::int64_t> zi = sc::cumargmax(z, 0).to_vector<std::int64_t>();
  const std::vector<double> zv = z.to_vector<double>();
  for (std::size_t k = 0; k < zm.size(); ++k) CHECK(std::signbit(zm[k]) == std::signbit(zv[static_cast<std::size_t>(zi[k])]));
  // cumprod: -0 kept as the first element (not 1 * -0 = -0 either way), inf * 0 = NaN
  CHECK(std::signbit(sc::cumprod(sc::tensor({-0.0, 2.0}), 0).to_vector<double>()[0]));
  CHECK(std::isnan(sc::cumprod(sc::tensor({inf, 0.0}), 0).to_vector<double>()[1]));
}

TEST_CASE("scans: every axis, flag and dtype against plain loops, over threads", "[scan][threads]") {
  const auto prod = [](long double a, long double b) { return a * b; };
  const auto mx = [](long double acc, long double v) { return std::isnan(acc) || !(v > acc) ? acc : v; };
  const auto mn = [](long double acc, long double v) { return std::isnan(acc) || !(v < acc) ? acc : v; };
  sctest::at_threads({1, 2}, [&](int) {
    for (const auto& [shape, axis] : std::vector<std::pair<sc::Shape, int>>{
             {{7}, 0}, {{3, 5}, 1}, {{3, 5}, 0}, {{2, 3, 4}, 1}, {{2, 3, 4}, -1}, {{3, 20001}, 1}, {{3000, 40}, 0},
             {{2, 300, 300}, 1}, {{5, 0}, 1}}) {
      for (int flags = 0; flags < 4; ++flags) {
        const bool ex = flags & 1, rev = flags >> 1;
        INFO("shape " << shape << " axis " << axis << " exclusive " << ex << " reverse " << rev);
        // values near 1 keep long products finite; f64 so the loops' long double rounds alike
        const sc::Tensor x = uniform_tensor(shape, 11, 0.7, 1.4, 0.7);
        const std::vector<double> xv = x.to_vector<double>();
        std::string why;
        CHECK(close(sc::cumprod(x, axis, ex, rev).to_vector<double>(), loop_scan(xv, shape, axis, ex, rev, 1, prod),
                    1e-12, why));
        INFO(why);
        CHECK(close(sc::logcumsumexp(x, axis, ex, rev).to_vector<double>(),
                    loop_scan(xv, shape, axis, ex, rev, -INFINITY, ld_logaddexp), 1e-13, why));
        INFO(why);
        const sc::Tensor a = uniform_tensor(shape, 12, -1.0, 1.0), b = uniform_tensor(shape, 13, -2.0, 2.0);
        // h by hand: (a, b) interleaved through an index
        const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
        const Lines l(shape, axis);
        std::vector<double> h(av.size());
        for (std::int64_t o = 0; o < l.outer; ++o)
          for (std::int64_t i = 0; i < l.inner; ++i) {
            long double acc = 0;
            for (std::int64_t j = 0; j < l.n; ++j) {
              const std::size_t at = l.at(o, rev ? l.n - 1 - j : j, i);
              if (ex) h[at] = static_cast<double>(acc);
              acc = j == 0 ? bv[at] : static_cast<long double>(av[at]) * acc + bv[at];
              if (!ex) h[at] = static_cast<double>(acc);
            }
          }
        CHECK(close(sc::linear_scan(a, b, axis, ex, rev).to_vector<double>(), h, 1e-12, why));
        INFO(why);
        if (ex) continue;
        // cummax/cummin, and their indices, in f32 and i32 too (exact)
        for (const sc::DType d : {sc::f32, sc::f64, sc::i32, sc::i64}) {
          const sc::Tensor v = uniform_tensor(shape, 14, -50, 50).astype(d);  // (integers: many ties)
          const std::vector<double> vv = v.astype(sc::f64).to_vector<double>();
          CHECK(sc::cummax(v, axis, rev).astype(sc::f64).to_vector<double>() == loop_scan(vv, shape, axis, false, rev, 0, mx));
          CHECK(sc::cummin(v, axis, rev).astype(sc::f64).to_vector<double>() == loop_scan(vv, shape, axis, false, rev, 0, mn));
          std::vector<std::int64_t> want(vv.size());
          for (std::int64_t o = 0; o < l.outer; ++o)
            for (std::int64_t i = 0; i < l.inner; ++i) {
              std::int64_t best = -1;
              for (std::int64_t j = 0; j < l.n; ++j) {
                const std::int64_t k = rev ? l.n - 1 - j : j;
                if (best < 0 || vv[l.at(o, k, i)] > vv[l.at(o, best, i)]) best = k;
                want[l.at(o, k, i)] = best;
              }
            }
          CHECK(sc::cumargmax(v, axis, rev).to_vector<std::int64_t>() == want);
        }
      }
    }
  });
}

TEST_CASE("scans: gradients by central differences, first and second order", "[scan][grad]") {
  sc::GradCheckOptions opt;
  opt.rtol = 1e-5;
  opt.atol = 1e-6;
  for (int flags = 0; flags < 4; ++flags)
    for (const int axis : {0, 1, -1}) {
      const bool ex = flags & 1, rev = flags >> 1;
      INFO("axis " << axis << " exclusive " << ex << " reverse " << rev);
      // zeros in x (one, two in a line): the rule divides by nothing
      sc::Tensor x = uniform_tensor({3, 4, 2}, 21, 0.5, 1.5, 0.5);
      x = sc::where(sc::tensor({{{1.0, 0.0}, {0.0, 1.0}, {1.0, 1.0}, {1.0, 0.0}},
                                {{1.0, 1.0}, {1.0, 1.0}, {1.0, 1.0}, {1.0, 1.0}},
                                {{0.0, 1.0}, {1.0, 1.0}, {0.0, 1.0}, {1.0, 1.0}}}) == 0.0,
                    0.0, x);
      auto r = sc::check_gradients([&](const std::vector<sc::Tensor>& in) { return sc::cumprod(in[0], axis, ex, rev); },
                                   {x}, opt);
      INFO("cumprod " << r.report);
      CHECK(r.ok);
      r = sc::check_gradients(
          // (through exp: an exclusive scan starts at -inf, which a finite difference cannot take)
          [&](const std::vector<sc::Tensor>& in) { return sc::exp(sc::logcumsumexp(in[0] * 3.0, axis, ex, rev) * 0.25); },
          {uniform_tensor({3, 4, 2}, 22, -3, 3)}, opt);
      INFO("logcumsumexp " << r.report);
      CHECK(r.ok);
      r = sc::check_gradients(
          [&](const std::vector<sc::Tensor>& in) { return sc::linear_scan(in[0], in[1], axis, ex, rev); },
          {uniform_tensor({3, 4, 2}, 23, -1.2, 1.2), uniform_tensor({3, 4, 2}, 24, -2, 2)}, opt);
      INFO("linear_scan " << r.report);
      CHECK(r.ok);
      if (!ex) {  // distinct values: no ties for the differences to straddle
        r = sc::check_gradients(
            [&](const std::vector<sc::Tensor>& in) { return sc::cummax(in[0], axis, rev) + sc::cummin(in[0], axis, rev); },
            {uniform_tensor({3, 4, 2}, 25, -3, 3, 0.01)}, opt);
        INFO("cummax + cummin " << r.report);
        CHECK(r.ok);
      }
      // second order: the gradient's own gradient (the rules are made of differentiable ops)
      r = sc::check_gradients(
          [&](const std::vector<sc::Tensor>& in) {
            sc::GradientTape t;
            t.watch(in[0]);
            t.watch(in[1]);
            const sc::Tensor y = sc::cumprod(in[0], axis, ex, rev) * sc::exp(sc::logcumsumexp(in[0], axis, ex, rev)) +
                                 sc::square(sc::linear_scan(in[0], in[1], axis, ex, rev));
            const std::vector<sc::Tensor> g = t.gradient(sc::sum(y * y), {in[0], in[1]});
            return g[0] + g[1] * 2.0;
          },
          {uniform_tensor({2, 3, 2}, 26, 0.5, 1.2), uniform_tensor({2, 3, 2}, 27, -1, 1)}, opt);
      INFO("second order " << r.report);
      CHECK(r.ok);
    }
}

TEST_CASE("scans: gradients at zeros, -inf and ties are exact", "[scan][grad]") {
  // cumprod of [2, 0, 3]: y = [2, 0, 0]; dy/dx for g = 1: [1 + 0 + 0, 2 + 6, 0]
  sc::Tensor x = sc::tensor({2.0, 0.0, 3.0});
  sc::GradientTape t1;
  t1.watch(x);
  CHECK(t1.gradient(sc::sum(sc::cumprod(x, 0)), x).to_vector<double>() == std::vector<double>{1, 8, 0});
  // two zeros: every gradient past the first zero but the first zero's own... all 0 but x0's 1
  x = sc::tensor({2.0, 0.0, 0.0, 3.0});
  sc::GradientTape t2;
  t2.watch(x);
  CHECK(t2.gradient(sc::sum(sc::cumprod(x, 0)), x).to_vector<double>() == std::vector<double>{1, 2, 0, 0});
  // logcumsumexp with -inf entries: their gradient is 0, no NaN anywhere (second order too)
  x = sc::tensor({-inf, -inf, 0.0, -inf, 1.0});
  sc::GradientTape outer;
  outer.watch(x);
  sc::GradientTape inner;
  inner.watch(x);
  const sc::Tensor y = sc::exp(sc::logcumsumexp(x, 0) * 0.5);  // (finite: y * y would make g -inf itself)
  const sc::Tensor g = inner.gradient(sc::sum(y * y), x);
  const std::vector<double> gv = g.to_vector<double>();
  CHECK(gv[0] == 0.0);
  CHECK(gv[1] == 0.0);
  CHECK(gv[3] == 0.0);
  CHECK(std::isfinite(gv[2]));
  CHECK(std::isfinite(gv[4]));
  for (const double v : outer.gradient(sc::sum(g), x).to_vector<double>()) CHECK(!std::isnan(v));
  // cummax with ties: the gradient goes to the first of the equal values
  x = sc::tensor({1.0, 3.0, 3.0, 2.0});
  sc::GradientTape t3;
  t3.watch(x);
  CHECK(t3.gradient(sc::sum(sc::cummax(x, 0)), x).to_vector<double>() == std::vector<double>{1, 3, 0, 0});
}

TEST_CASE("scans: traced and tape-traced equal eager", "[scan][staged]") {
  const sc::Tensor x = uniform_tensor({4, 5}, 31, 0.5, 1.5);
  const sc::Tensor b = uniform_tensor({4, 5}, 32, -1, 1);
  const auto body = [](const sc::Tensor& a, const sc::Tensor& c) {
    return sc::cumprod(a, 1) + sc::exp(sc::logcumsumexp(a, 0, true)) + sc::cummax(c, 1, true) + sc::cummin(c, 0) +
           sc::linear_scan(a * 0.5, c, 1, false, true) + sc::cumargmax(c, 1).astype(sc::f64);
  };
  auto traced = sc::function(body);
  CHECK(traced(x, b).to_vector<double>() == body(x, b).to_vector<double>());
  auto grad = sc::function([&](const sc::Tensor& a, const sc::Tensor& c) {
    sc::GradientTape t;
    t.watch(a);
    t.watch(c);
    const std::vector<sc::Tensor> g = t.gradient(sc::sum(body(a, c) * body(a, c)), {a, c});
    return g[0] + g[1];
  });
  sc::GradientTape t;
  t.watch(x);
  t.watch(b);
  const std::vector<sc::Tensor> g = t.gradient(sc::sum(body(x, b) * body(x, b)), {x, b});
  CHECK(grad(x, b).to_vector<double>() == (g[0] + g[1]).to_vector<double>());
}

TEST_CASE("scans: errors name the op, the shapes and the user's line", "[scan][errors]") {
  int line = __LINE__ + 1;
  std::string msg = error_of<sc::DTypeError>([] { (void)sc::logcumsumexp(sc::tensor(std::vector<std::int32_t>{1, 2})); });
  CHECK_THAT(msg, Catch::Contains("[logcumsumexp]") && Catch::Contains("i32") &&
                      Catch::Contains("test_scan_family.cpp:" + std::to_string(line)));
  msg = error_of<sc::DTypeError>([] { (void)sc::cumprod(sc::tensor({true, false})); });
  CHECK_THAT(msg, Catch::Contains("[cumprod]") && Catch::Contains("bool"));
  msg = error_of<sc::DTypeError>([] { (void)sc::cumargmax(sc::tensor({true, false})); });
  CHECK_THAT(msg, Catch::Contains("[cumargmax]") && Catch::Contains("bool"));
  line = __LINE__ + 1;
  msg = error_of<sc::ShapeError>([] { (void)sc::cummax(sc::ones({2, 3}), -3); });
  CHECK_THAT(msg, Catch::Contains("[cummax]") && Catch::Contains("axis -3") &&
                      Catch::Contains("test_scan_family.cpp:" + std::to_string(line)));
  msg = error_of<sc::ShapeError>([] { (void)sc::cummin(sc::scalar(1.f)); });
  CHECK_THAT(msg, Catch::Contains("[cummin]") && Catch::Contains("rank >= 1"));
  line = __LINE__ + 1;
  msg = error_of<sc::ShapeError>([] { (void)sc::linear_scan(sc::ones({2, 3}), sc::ones({4, 3}), 1); });
  CHECK_THAT(msg, Catch::Contains("[linear_scan]") && Catch::Contains("[2, 3]") && Catch::Contains("[4, 3]") &&
                      Catch::Contains("test_scan_family.cpp:" + std::to_string(line)));
  msg = error_of<sc::DTypeError>([] { (void)sc::linear_scan(sc::ones({2, 3}), sc::ones({2, 3}).astype(sc::f64), 1); });
  CHECK_THAT(msg, Catch::Contains("[linear_scan]") && Catch::Contains("f32") && Catch::Contains("f64"));
  msg = error_of<sc::DTypeError>([] {
    (void)sc::linear_scan(sc::ones({2}).astype(sc::i32), sc::ones({2}).astype(sc::i32));
  });
  CHECK_THAT(msg, Catch::Contains("[linear_scan]") && Catch::Contains("i32"));
  msg = error_of<sc::ValueError>([] { (void)sc::linear_scan(sc::Tensor(), sc::ones({2})); });
  CHECK_THAT(msg, Catch::Contains("[linear_scan]"));
}
