// Result dtypes, written out as literal tables: tensor-tensor promotion, weak C++ scalars,
// float-only ops, comparisons; plus the operator forms a user can (or cannot yet) write.
#include <catch2/catch.hpp>

#include <concepts>
#include <type_traits>

#include "conformance.hpp"

namespace {

using sc::DType;
constexpr DType B = sc::boolean, I = sc::i32, L = sc::i64, F = sc::f32, D = sc::f64;
constexpr DType order[5] = {B, I, L, F, D};
constexpr DType X = static_cast<DType>(255);  // "rejected with DTypeError"

sc::Tensor sample(DType d) { return conf::to_tensor(conf::make_input({{2, 3}, d, conf::Gen::positive, 0, {}}, 7)); }

}  // namespace

TEST_CASE("conformance dtypes: tensor op tensor follows the promotion table", "[conformance][dtype]") {
  // Rows: left operand, columns: right operand, both in the order bool, i32, i64, f32, f64.
  const DType add_table[5][5] = {{X, I, L, F, D}, {I, I, L, F, D}, {L, L, L, F, D}, {F, F, F, F, D}, {D, D, D, D, D}};
  // True division computes in floating point: integer (and bool) pairs give f32.
  const DType div_table[5][5] = {{F, F, F, F, D}, {F, F, F, F, D}, {F, F, F, F, D}, {F, F, F, F, D}, {D, D, D, D, D}};
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 5; ++j) {
      const sc::Tensor a = sample(order[i]), b = sample(order[j]);
      INFO(sc::name(order[i]) << " op " << sc::name(order[j]));
      if (add_table[i][j] == X) {
        CHECK_THROWS_AS(a + b, sc::DTypeError);
        CHECK_THROWS_WITH(sc::mul(a, b), Catch::Contains("[mul]") && Catch::Contains("bool"));
      } else {
        CHECK((a + b).dtype() == add_table[i][j]);
        CHECK(sc::maximum(a, b).dtype() == add_table[i][j]);
        CHECK(sc::pow(a, b).dtype() == add_table[i][j]);
      }
      CHECK((a / b).dtype() == div_table[i][j]);
      CHECK((a < b).dtype() == B);
      CHECK(sc::not_equal(a, b).dtype() == B);
      CHECK(sc::logical_and(a, b).dtype() == B);
      CHECK(sc::where(sc::ones({2, 3}, B), a, b).dtype() == std::max(order[i], order[j]));
    }
}

TEST_CASE("conformance dtypes: C++ scalars are weak", "[conformance][dtype]") {
  const sc::Tensor i64 = sc::tensor(std::vector<std::int64_t>{3000000000, -2}, {2});
  const sc::Tensor i32 = sc::tensor(std::vector<std::int32_t>{0, 1}, {2});
  const sc::Tensor f64 = sc::tensor(std::vector<double>{0.1, 1e300}, {2});
  const sc::Tensor f32 = sc::tensor(std::vector<float>{0.25f, 3.f}, {2});
  const sc::Tensor b8 = sc::tensor({true, false});
  // i64 tensor + 1 stays i64 (and keeps values beyond i32).
  CHECK((i64 + 1).dtype() == L);
  CHECK((i64 + 1).to_vector<std::int64_t>() == std::vector<std::int64_t>{3000000001, -1});
  CHECK((1 + i32).dtype() == I);
  // f64 tensor * 0.5f stays f64 (no rounding through f32: 0.1 * 0.5 is exact in f64).
  CHECK((f64 * 0.5f).dtype() == D);
  CHECK((f64 * 0.5f).to_vector<double>() == std::vector<double>{0.05, 5e299});
  CHECK((f32 * 0.5).dtype() == F);  // a double scalar does not widen an f32 tensor
  CHECK((f32 + 1).dtype() == F);
  // A scalar of a higher kind gives that kind's default: i32 * 0.5 is f32, bool + 1 is i64.
  CHECK((i32 * 0.5).dtype() == F);
  CHECK((i32 * 0.5).to_vector<float>() == std::vector<float>{0.f, 0.5f});
  CHECK((i64 - 0.25).dtype() == F);
  CHECK((b8 + 1).dtype() == L);
  CHECK((b8 * 0.5).dtype() == F);
  // Comparisons give bool and compare in the promoted dtype: 0 < 0.5 and 1 < 0.5.
  CHECK((i32 < 0.5).dtype() == B);
  CHECK((i32 < 0.5).to_vector<bool>() == std::vector<bool>{true, false});
  CHECK((2 > f64).to_vector<bool>() == std::vector<bool>{true, false});
  CHECK(sc::where(b8, i32, 0.5).dtype() == F);
  CHECK(sc::where(b8, 7, i64).dtype() == L);
}

TEST_CASE("conformance dtypes: unary result dtypes", "[conformance][dtype]") {
  // exp-like ops compute in floating point; numeric ops keep the dtype; predicates give bool.
  const DType float_ops[5] = {F, F, F, F, D};
  for (int i = 0; i < 5; ++i) {
    const sc::Tensor x = sample(order[i]);
    INFO(sc::name(order[i]));
    CHECK(sc::exp(x).dtype() == float_ops[i]);
    CHECK(sc::sqrt(x).dtype() == float_ops[i]);
    CHECK(sc::sigmoid(x).dtype() == float_ops[i]);
    CHECK(sc::logical_not(x).dtype() == B);
    if (order[i] == B) {
      CHECK_THROWS_WITH(sc::neg(x), Catch::Contains("[neg]") && Catch::Contains("bool"));
      CHECK_THROWS_AS(sc::abs(x), sc::DTypeError);
    } else {
      CHECK(sc::neg(x).dtype() == order[i]);
      CHECK(sc::relu(x).dtype() == order[i]);
      CHECK(sc::square(x).dtype() == order[i]);
    }
  }
}

namespace {
// Regression: these operator forms once lost to the built-in bool operators. `!t` was
// ambiguous between sc::operator!(Operand) and the built-in ! through the explicit operator
// bool (both user-defined conversions); `t || false` and `t && true` picked the built-in
// logical operators (a non-template beat the Scalar templates) and returned a C++ bool.
// The operators now take the tensor exactly (const Tensor&), which wins.
template <class T>
concept NotGivesTensor = requires(const T& t) { { !t } -> std::same_as<sc::Tensor>; };
template <class T>
concept OrScalarGivesTensor = requires(const T& t) { { t || false } -> std::same_as<sc::Tensor>; };
template <class T>
concept AndScalarGivesTensor = requires(const T& t) { { true && t } -> std::same_as<sc::Tensor>; };
}  // namespace

TEST_CASE("conformance dtypes: operator forms of logical ops give tensors", "[conformance][dtype]") {
  CHECK(NotGivesTensor<sc::Tensor>);        // was ambiguous
  CHECK(OrScalarGivesTensor<sc::Tensor>);   // was built-in ||
  CHECK(AndScalarGivesTensor<sc::Tensor>);  // was built-in &&
  // What does work: tensor && tensor, tensor || tensor reach the ops.
  const sc::Tensor a = sc::tensor({true, false, true}), b = sc::tensor({true, true, false});
  CHECK((a && b).to_vector<bool>() == std::vector<bool>{true, false, false});
  CHECK((a || b).to_vector<bool>() == std::vector<bool>{true, true, true});
}
