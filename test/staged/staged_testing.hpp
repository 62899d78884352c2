// Helpers of the staged tests: run one generic function eagerly, traced (sc::function), staged
// (sc::stage + sc::eval) and compiled (sc::compile), and compare the four results.
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

}  // namespace sctest
