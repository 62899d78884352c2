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
      BINARY(floor_div), BINARY(mod),
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
  CHECK(binary_ops().size() == 17);
}

TEST_CASE("staged ops on mixed dtypes promote as eager does", "[staged][ops]") {
  const std::pair<sc::DType, sc::DType> pairs[] = {
      {sc::i32, sc::f32}, {sc::f32, sc::f64}, {sc::i32, sc::i64}, {sc::boolean, sc::f32}, {sc::i64, sc::f64}};
  for (const auto& [name, check] : binary_ops())
    for (const auto& [da, db] : pairs) check(values(da, {3, 4}, 5), values(db, {4}, 6), 1e-6);
}


TEST_CASE("staged broadcasting walks: long rows, size-1 operands and splits across threads", "[staged][ops]") {
  // A size-1 operand, or one repeated along the innermost axis, is read from a buffer of copies
  // refilled per segment (eval.hpp's Walker): rows longer than a segment, rows whose repeated
  // value changes, tails, and outputs large enough to split over threads mid-row.
  struct Case {
    sc::Shape a, b, c;
  };
  const Case cases[] = {{{300, 1}, {1, 700}, {300, 700}},
                        {{1}, {100003}, {100003}},
                        {{64, 1, 3000}, {5, 1}, {1}},
                        {{7, 1, 1}, {1, 1, 33}, {7, 6, 33}},
                        {{2000, 1}, {2000, 3}, {1, 3}},
                        {{1, 1}, {1, 1}, {513, 257}}};
  for (sc::DType d : {sc::f32, sc::f64, sc::i32, sc::i64}) {
    for (const Case& k : cases) {
      const Tensor a = values(d, k.a, 7), b = values(d, k.b, 8), c = values(d, k.c, 9);
      const std::string label = std::string(sc::name(d)) + sctest::str(k.a) + sctest::str(k.b) + sctest::str(k.c);
      check_stages([](const auto& x, const auto& y, const auto& z) { return sc::maximum(x * y, z) - x + y * z; },
                   sc::is_floating(d) ? 1e-6 : 0.0, label, a, b, c);
      if (sc::is_floating(d))
        check_stages([](const auto& x, const auto& y, const auto& z) { return sc::where(x > y, sc::tanh(z * x), y - z); },
                     1e-6, label + " where/tanh", a, b, c);
    }
  }
}

TEST_CASE("sin and cos over broadcasting walks and reduced rows give eager's bits", "[staged][ops]") {
  // xsimd reduces a batch's sin and cos arguments by the method its largest |x| needs, so a lane's
  // last bit depends on its neighbours: the rows of a broadcasting walk (3 elements here) or of a
  // reduction batch other elements together than eager's flat loop, and such graphs run op by op.
  for (std::int64_t n : {40, 513}) {
    std::vector<float> va(static_cast<std::size_t>(n * 3)), vb(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < va.size(); ++i) va[i] = i % 11 == 0 ? 1e30f : (i % 7 == 3 ? 3e9f : std::sin(float(i)) * 3);
    for (std::size_t i = 0; i < vb.size(); ++i) vb[i] = i % 5 == 0 ? -1e30f : std::cos(float(i)) * 2;
    const Tensor a32 = sc::tensor(va, sc::Shape{n, 3}), b32 = sc::tensor(vb, sc::Shape{n, 1});
    for (sc::DType d : {sc::f32, sc::f64}) {
      const Tensor a = sc::cast(a32, d), b = sc::cast(b32, d);
      const std::string at = std::string(sc::name(d)) + " n=" + std::to_string(n);
      check_stages([](const auto& x, const auto& y) { return sc::cos(x + y); }, 0.0, "cos(a + b) " + at, a, b);
      check_stages([](const auto& x, const auto& y) { return sc::sin(x) * y; }, 0.0, "sin(a) * b " + at, a, b);
      check_stages([](const auto& x, const auto& y) { return sc::cos(x - y); }, 0.0, "transposed " + at, sc::transpose(a),
                   sc::reshape(b, {1, n}));
      check_stages([](const auto& x, const auto&) { return sc::max(sc::sin(x * 2), {-1}); }, 0.0, "max of sin over rows " + at,
                   a, b);
    }
  }
}
