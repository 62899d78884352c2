// Gradient checking: tape gradients against central finite differences, in f64.
#pragma once
#include <cmath>
#include <functional>
#include <source_location>
#include <sstream>
#include <string>
#include <vector>

#include "../core/random.hpp"
#include "tape.hpp"

namespace stagecraft {

/// The outcome of check_gradients: the worst error and a readable report of mismatches.
struct GradCheckResult {
  bool ok = true;
  double max_abs_error = 0;  ///< largest |analytic - numeric| over all checked elements
  std::string report;        ///< the first mismatches: input, element, analytic, numeric
  explicit operator bool() const { return ok; }
};

/// Options of check_gradients.
struct GradCheckOptions {
  double eps = 1e-6;    ///< finite-difference step (in f64)
  double atol = 1e-6;   ///< an element passes when |a - n| <= atol + rtol * |n|
  double rtol = 1e-5;
  std::uint64_t seed = 0;  ///< seeds the random projection of the output
};

/// Checks the tape's gradient of f at xs against central differences. The inputs are
/// converted to f64; the scalar checked is sum(f(xs) * w) for a fixed random w, so every
/// output element matters. f may itself use (nested) tapes: check_gradients of a function
/// returning a gradient checks second derivatives.
inline GradCheckResult check_gradients(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                       const std::vector<Tensor>& xs, GradCheckOptions opt = {},
                                       std::source_location loc = std::source_location::current()) {
  std::vector<Tensor> x64;
  for (const Tensor& x : xs) x64.push_back(cast(x, DType::f64, loc));
  Tensor w;
  const auto objective = [&](const std::vector<Tensor>& in) {
    Tensor y = cast(f(in), DType::f64);
    if (!w.defined()) w = random::uniform(y.shape(), 0.5, 1.5, opt.seed, DType::f64);
    return sum(y * w);
  };
  std::vector<Tensor> analytic;
  {
    GradientTape tape;
    tape.watch(x64, loc);
    const Tensor target = objective(x64);
    analytic = tape.gradient(target, x64, loc);  // errors (an op without a rule) name the caller
  }
  GradCheckResult r;
  std::ostringstream os;
  int reported = 0;
  for (std::size_t i = 0; i < x64.size(); ++i) {
    const std::vector<double> base = x64[i].to_vector<double>();
    const std::vector<double> got = analytic[i].to_vector<double>();
    for (std::size_t j = 0; j < base.size(); ++j) {
      std::vector<Tensor> in = x64;
      std::vector<double> v = base;
      v[j] = base[j] + opt.eps;
      in[i] = tensor(v, x64[i].shape());
      const double up = objective(in).item<double>();
      v[j] = base[j] - opt.eps;
      in[i] = tensor(v, x64[i].shape());
      const double down = objective(in).item<double>();
      const double numeric = (up - down) / (2 * opt.eps);
      const double err = std::fabs(got[j] - numeric);
      r.max_abs_error = std::max(r.max_abs_error, err);
      if (!(err <= opt.atol + opt.rtol * std::fabs(numeric))) {
        r.ok = false;
        if (reported++ < 8)
          os << "input " << i << " element " << j << ": analytic " << got[j] << ", numeric " << numeric << "\n";
      }
    }
  }
  r.report = os.str();
  return r;
}

}  // namespace stagecraft
