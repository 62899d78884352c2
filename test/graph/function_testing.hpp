// Helpers of the sc::function tests (test_function.cpp, test_function_fusion.cpp).
#pragma once
#include <cmath>

#include "testing.hpp"

namespace sctest::function {

/// a and b have one shape and dtype and equal elements (within tol relative to 1 + |b|, when given).
inline void check_same(const sc::Tensor& a, const sc::Tensor& b, double tol = 0) {
  REQUIRE(a.shape() == b.shape());
  REQUIRE(a.dtype() == b.dtype());
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("element " << i << ": " << x[i] << " vs " << y[i]);
    if (tol == 0) CHECK(x[i] == y[i]);
    else CHECK(std::abs(x[i] - y[i]) <= tol * (1 + std::abs(y[i])));
  }
}

}  // namespace sctest::function
