// Helpers shared by the unit tests: seeded test values, the thrown error's message, thread counts
// for a scope, closeness checks, and tables of gradient checks. Each test file names what it uses
// (using sctest::...).
#pragma once
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace sctest {

/// Deterministic pseudo-random numbers (xorshift64*), independent of the library.
struct Rng {
  std::uint64_t s;
  explicit Rng(std::uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  std::uint64_t next() {
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    return s * 2685821657736338717ull;
  }
  /// A double in [0, 1) (53 random bits).
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
};

/// An f64 tensor of shape s with values in [lo, hi) from Rng(seed); with min_abs > 0 every
/// |value| is at least min_abs and the sign is random (keeps a kink or pole at 0 away).
inline sc::Tensor uniform_tensor(sc::Shape s, std::uint64_t seed, double lo, double hi, double min_abs = 0) {
  Rng r(seed);
  std::vector<double> v(static_cast<std::size_t>(s.numel()));
  for (double& x : v) {
    x = lo + (hi - lo) * r.uniform();
    if (min_abs > 0) x = (r.uniform() < 0.5 ? -1 : 1) * (min_abs + std::fabs(x));
  }
  return sc::tensor(v, s);
}

/// n values of T from mt19937(seed): integers in [-range, range] (exact sums) for integer T,
/// those integers divided by `div` for floating T.
template <class T>
std::vector<T> small_values(std::int64_t n, unsigned seed, int range, int div) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(-range, range);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = std::is_floating_point_v<T> ? static_cast<T>(d(gen)) / T(div) : static_cast<T>(d(gen));
  return v;
}

/// The message of the E that f throws (the test fails when it throws nothing).
template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("expected an exception");
  return "";
}

/// The library's thread count set for a scope, the caller's restored on leaving it (a failed
/// REQUIRE's exception included, so that one failure does not change the tests after it).
class ThreadCount {
 public:
  explicit ThreadCount(int n) : before_(sc::num_threads()) { sc::set_num_threads(n); }
  ~ThreadCount() { sc::set_num_threads(before_); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int before_;
};

/// fn(t) at each thread count t of counts in turn (a ThreadCount each, INFO naming it).
template <class F>
void at_threads(std::initializer_list<int> counts, F&& fn) {
  for (const int t : counts) {
    const ThreadCount scope(t);
    INFO(t << " threads");
    fn(t);
  }
}

/// Checks got against want element by element, within tol (absolute and relative).
/// n normal values (mean 0, standard deviation `scale`) from std::mt19937(seed).
inline std::vector<double> randn(std::int64_t n, unsigned seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = d(gen);
  return v;
}

/// Tape gradients of loss() with respect to vars against central differences, perturbing each
/// variable element through assign (so a layer's real code path is differentiated); each
/// gradient within `margin` absolute or `rel` relative of the difference quotient.
inline void check_variable_gradients(const std::function<sc::Tensor()>& loss, std::vector<sc::Variable> vars,
                                     double margin = 1e-6, double rel = 1e-5) {
  std::vector<sc::Tensor> grads;
  {
    sc::GradientTape tape;
    const sc::Tensor l = loss();
    grads = tape.gradient(l, vars);
  }
  const double eps = 1e-6;
  for (std::size_t k = 0; k < vars.size(); ++k) {
    const sc::Tensor base = vars[k].value();
    const std::vector<double> b = base.to_vector<double>(), g = grads[k].to_vector<double>();
    for (std::size_t j = 0; j < b.size(); ++j) {
      std::vector<double> v = b;
      v[j] = b[j] + eps;
      vars[k].assign(sc::tensor(v, base.shape()));
      const double up = loss().item<double>();
      v[j] = b[j] - eps;
      vars[k].assign(sc::tensor(v, base.shape()));
      const double down = loss().item<double>();
      vars[k].assign(base);
      INFO("variable " << k << " ('" << vars[k].name() << "') element " << j);
      CHECK(g[j] == Approx((up - down) / (2 * eps)).margin(margin).epsilon(rel));
    }
  }
}

inline void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(got[i] == Approx(want[i]).margin(tol).epsilon(tol));
  }
}

/// "[2,3]": a shape in a test label.
inline std::string str(const sc::Shape& s) {
  std::string out = "[";
  for (int i = 0; i < s.rank(); ++i) {
    if (i) out += ',';
    out += std::to_string(s[i]);
  }
  return out + "]";
}

/// A function of some tensors, as check_gradients takes it.
using Fn = std::function<sc::Tensor(const std::vector<sc::Tensor>&)>;

/// One row of a gradient table: a function of the inputs and where to check it.
struct Row {
  std::string name;
  Fn f;
  std::vector<sc::Tensor> xs;
  sc::GradCheckOptions opt{};
};

/// check_gradients on every row; a failing row prints its name, worst error and report.
inline void check_rows(const std::vector<Row>& rows) {
  for (const Row& row : rows) {
    const sc::GradCheckResult r = sc::check_gradients(row.f, row.xs, row.opt);
    INFO(row.name << " (max error " << r.max_abs_error << ")\n" << r.report);
    CHECK(r.ok);
  }
}

/// f(xs) returns an inner tape's gradient with respect to xs[0], so check_gradients of it
/// differentiates a gradient (checks second derivatives).
inline Fn second(Fn g) {
  return [g](const std::vector<sc::Tensor>& xs) {
    sc::GradientTape inner;
    inner.watch(xs);
    return inner.gradient(g(xs), xs[0]);
  };
}

/// {g, h} at x: g the gradient of loss(x) by x (an inner tape), h the gradient of sum(g * g) by
/// x (an outer tape over the inner one): second derivatives through whatever loss runs.
inline std::vector<sc::Tensor> gradient_and_its_gradient(const std::function<sc::Tensor(const sc::Tensor&)>& loss,
                                                         const sc::Tensor& x) {
  sc::GradientTape outer;
  outer.watch(x);
  sc::Tensor g;
  {
    sc::GradientTape inner;
    inner.watch(x);
    g = inner.gradient(loss(x), std::vector<sc::Tensor>{x})[0];
  }
  return {g, outer.gradient(sc::sum(g * g), std::vector<sc::Tensor>{x})[0]};
}

}  // namespace sctest
