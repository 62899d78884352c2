// Helpers of the staged tests: run one generic function eagerly, traced (sc::function), staged
// (sc::stage + sc::eval) and compiled (sc::compile), and compare the four results; compare sc::grad
// with the tape and with finite differences.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "testing.hpp"

namespace sctest {

/// The kind of sc::Error f throws ("" when it returns).
template <class F>
std::string error_kind(F&& f) {
  try {
    f();
  } catch (const sc::ShapeError&) {
    return "ShapeError";
  } catch (const sc::DTypeError&) {
    return "DTypeError";
  } catch (const sc::Error&) {
    return "Error";
  }
  return "";
}

/// The kind (as error_kind names it) and the message of the sc::Error f raises; both empty when
/// it returns.
struct Raised {
  std::string kind, message;
};
template <class F>
Raised raised(F&& f) {
  Raised r;
  r.kind = error_kind([&] {
    try {
      f();
    } catch (const sc::Error& e) {
      r.message = e.what();
      throw;
    }
  });
  return r;
}

/// got == want in shape and dtype, and elementwise: exactly (NaN matching NaN) when tol is 0,
/// else within tol relative to 1 + |want|.
inline void check_same(const sc::Tensor& got, const sc::Tensor& want, double tol, const std::string& what) {
  INFO(what);
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.dtype() == want.dtype());
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  for (std::size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i << ": got " << g[i] << ", want " << w[i]);
    if (std::isnan(w[i])) {
      CHECK(std::isnan(g[i]));
    } else if (tol == 0 || std::isinf(w[i])) {
      CHECK(g[i] == w[i]);
    } else {
      CHECK(std::fabs(g[i] - w[i]) <= tol * (1 + std::fabs(w[i])));
    }
  }
}

/// Runs f on tensors xs four ways (eager, traced, staged, compiled); all four must raise the same
/// error kind, or give the same result: staged and compiled equal eager within tol_staged (0:
/// bit for bit), traced within 1e-6.
template <class F, class... T>
void check_stages(const F& f, double tol_staged, const std::string& what, const T&... xs) {
  std::optional<sc::Tensor> eager;
  const std::string eager_err = error_kind([&] { eager = sc::Tensor(f(xs...)); });
  std::optional<sc::Tensor> staged, compiled, traced;
  const std::string staged_err = error_kind([&] { staged = sc::eval(f(sc::stage(xs)...)); });
  const std::string compiled_err = error_kind([&] { compiled = sc::compile(f)(xs...); });
  const std::string traced_err = error_kind([&] {
    auto fn = sc::function([&f](const T&... ts) { return sc::Tensor(f(ts...)); });
    traced = sc::Tensor(fn(xs...));
  });
  INFO(what);
  CHECK(staged_err == eager_err);
  CHECK(compiled_err == eager_err);
  CHECK(traced_err == eager_err);
  if (!eager) return;
  REQUIRE(staged);
  REQUIRE(compiled);
  REQUIRE(traced);
  check_same(*staged, *eager, tol_staged, what + " (staged)");
  check_same(*compiled, *eager, tol_staged, what + " (compiled)");
  check_same(*traced, *eager, 1e-6, what + " (traced)");
}

/// Test values of dtype d and shape s: integers in [-4, 4] for integer dtypes, x > 0 for bool,
/// else [-3, 3) with a few exact zeros (sign, relu and the comparisons meet their edge).
inline sc::Tensor values(sc::DType d, const sc::Shape& s, std::uint64_t seed) {
  Rng r(seed);
  std::vector<double> v(static_cast<std::size_t>(s.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double u = r.uniform();
    v[i] = i % 7 == 3 ? 0.0 : (sc::is_floating(d) ? -3 + 6 * u : std::floor(-4 + 9 * u));
  }
  const sc::Tensor t = sc::tensor(v, s);
  if (d == sc::boolean) return t > 0;
  return sc::cast(t, d);
}

/// Values in [-2, 2] at least 0.2 from zero (where relu, abs and the like have no kink), in dtype d.
inline sc::Tensor away_from_zero(const sc::Shape& s, std::uint64_t seed, sc::DType d) {
  return sc::cast(uniform_tensor(s, seed, -2, 2, 0.2), d);
}

/// The tape's gradients of sum(f(x, y)) with respect to x and y.
template <class F>
std::vector<sc::Tensor> tape_grads(const F& f, const sc::Tensor& x, const sc::Tensor& y) {
  sc::GradientTape t;
  t.watch(std::vector<sc::Tensor>{x, y});
  const sc::Tensor out = f(x, y);
  return t.gradient(sc::sum(out), std::vector<sc::Tensor>{x, y});
}

/// d sum(f) / dx by central differences, element by element (in f64, returned in the argument's dtype).
template <class F>
sc::Tensor numeric_grad(const F& f, const sc::Tensor& x, const sc::Tensor& y, int which) {
  const sc::Tensor& v = which == 0 ? x : y;
  std::vector<double> base = v.to_vector<double>(), out(base.size());
  const double h = 1e-6;
  for (std::size_t i = 0; i < base.size(); ++i) {
    auto at = [&](double d) {
      std::vector<double> p = base;
      p[i] += d;
      const sc::Tensor t = sc::tensor(p, v.shape());
      const sc::Tensor r = which == 0 ? sc::Tensor(f(t, y)) : sc::Tensor(f(x, t));
      return sc::sum(r).item<double>();
    };
    out[i] = (at(h) - at(-h)) / (2 * h);
  }
  return sc::cast(sc::tensor(out, v.shape()), v.dtype());
}

/// grad<0> and grad<1> of sc::compile(f) equal the tape's gradients of sum(f(x, y)) and, in f64,
/// central differences.
template <class F>
void check_grads(const F& f, const std::string& what, const sc::Tensor& x, const sc::Tensor& y) {
  INFO(what);
  const auto g = sc::compile(f);
  const std::vector<sc::Tensor> want = tape_grads(f, x, y);
  const sc::Tensor dx = sc::grad<0>(g)(x, y), dy = sc::grad<1>(g)(x, y);
  check_same(dx, want[0], 1e-6, what + ": grad<0> vs tape");
  check_same(dy, want[1], 1e-6, what + ": grad<1> vs tape");
  if (x.dtype() == sc::f64) {
    check_same(dx, numeric_grad(f, x, y, 0), 1e-5, what + ": grad<0> vs finite differences");
    check_same(dy, numeric_grad(f, x, y, 1), 1e-5, what + ": grad<1> vs finite differences");
  }
}

}  // namespace sctest
