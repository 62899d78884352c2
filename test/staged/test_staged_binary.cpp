// Compile-time staging, binary elementwise ops: arithmetic, comparisons and logical ops on every
// dtype, broadcasting shape and dtype mix, eager == traced == staged == compiled.
#include "staged/staged_testing.hpp"

using sc::Tensor;
using sctest::check_stages;
using sctest::values;

namespace {
const sc::DType all_dtypes[] = {sc::f32, sc::f64, sc::i32, sc::i64, sc::boolean};
}  // namespace

namespace {

using BinaryCheck = std::function<void(const Tensor&, const Tensor&, double)>;
#define BINARY(fn) std::pair<const char*, BinaryCheck>{#fn, [](const Tensor& a, const Tensor& b, double tol) { \
  check_stages([](const auto& x, const auto& y) { return sc::fn(x, y); }, tol, \
               std::string(#fn) + " " + std::string(sc::name(a.dtype())) + sctest::str(a.shape()) + " " + \
                   std::string(sc::name(b.dtype())) + sctest::str(b.shape()), a, b); }}

const std::vector<std::pair<const char*, BinaryCheck>>& binary_ops() {
  static const std::vector<std::pair<const char*, BinaryCheck>> ops = {
      BINARY(add), BINARY(sub), BINARY(mul), BINARY(div), BINARY(pow), BINARY(maximum), BINARY(minimum),
      BINARY(less), BINARY(less_equal), BINARY(greater), BINARY(greater_equal), BINARY(equal),
      BINARY(not_equal), BINARY(logical_and), BINARY(logical_or)};
  return ops;
}
#undef BINARY

}  // namespace

TEST_CASE("staged binary ops equal eager, traced and compiled on every dtype and broadcast", "[staged][ops]") {
  const std::pair<sc::Shape, sc::Shape> shapes[] = {
      {{37}, {37}}, {{2, 1, 5}, {3, 5}}, {{4, 1}, {1, 6}}, {{1}, {37}}, {{}, {3, 2}}, {{5, 3}, {3}},
      {{0, 3}, {3}}, {{2, 3}, {4}},  // the last cannot broadcast: a ShapeError everywhere
      {{40000, 2}, {40000, 2}}};
  for (const auto& [name, check] : binary_ops()) {
    for (sc::DType d : all_dtypes) {
      for (const auto& [sa, sb] : shapes) {
        const Tensor a = values(d, sa, 3), b = values(d, sb, 4);
        check(a, b, sc::is_floating(d) || d == sc::boolean ? 0.0 : 1e-6);
      }
    }
  }
  CHECK(binary_ops().size() == 15);
}

TEST_CASE("staged ops on mixed dtypes promote as eager does", "[staged][ops]") {
  const std::pair<sc::DType, sc::DType> pairs[] = {
      {sc::i32, sc::f32}, {sc::f32, sc::f64}, {sc::i32, sc::i64}, {sc::boolean, sc::f32}, {sc::i64, sc::f64}};
  for (const auto& [name, check] : binary_ops())
    for (const auto& [da, db] : pairs) check(values(da, {3, 4}, 5), values(db, {4}, 6), 1e-6);
}

