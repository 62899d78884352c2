// Elementwise ops: broadcasting walks, scalar operands, promotion, error messages.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

TEST_CASE("binary broadcasting patterns", "[elementwise]") {
  auto a = sc::tensor({{1.f, 2.f, 3.f}, {4.f, 5.f, 6.f}});
  CHECK((a + sc::tensor({10.f, 20.f, 30.f})).to_vector<float>() == std::vector<float>{11, 22, 33, 14, 25, 36});
  CHECK((a * sc::tensor({{2.f}, {3.f}})).to_vector<float>() == std::vector<float>{2, 4, 6, 12, 15, 18});
  CHECK((sc::tensor({{1.f}, {2.f}}) - sc::tensor({1.f, 2.f, 3.f})).to_vector<float>() ==
        std::vector<float>{0, -1, -2, 1, 0, -1});
  CHECK((2.f - a).to_vector<float>() == std::vector<float>{1, 0, -1, -2, -3, -4});
  CHECK((a / 2).to_vector<float>() == std::vector<float>{0.5, 1, 1.5, 2, 2.5, 3});
}

TEST_CASE("errors name the op, the shapes and the user's line", "[elementwise][errors]") {
  auto a = sc::ones({2, 3});
  auto b = sc::ones({4});
  const int line = __LINE__ + 1;
  CHECK_THROWS_WITH(a + b, Catch::Contains("[add] cannot broadcast shapes [2, 3] and [4] (f32, f32) at test_elementwise.cpp:" + std::to_string(line)));
  CHECK_THROWS_AS(sc::neg(sc::tensor({true})), sc::DTypeError);
}

TEST_CASE("maximum and minimum propagate NaN in the SIMD part of a row too", "[elementwise]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a(37, nan), b(37, 2.f);
  a[5] = 1.f;  // one ordinary lane
  for (auto op : {+[](const sc::Tensor& x, const sc::Tensor& y) { return sc::maximum(x, y); },
                  +[](const sc::Tensor& x, const sc::Tensor& y) { return sc::minimum(x, y); }}) {
    const auto r1 = op(sc::tensor(a), sc::tensor(b)).to_vector<float>();
    const auto r2 = op(sc::tensor(b), sc::tensor(a)).to_vector<float>();
    for (int i = 0; i < 37; ++i) {
      if (i == 5) continue;
      CHECK(std::isnan(r1[i]));
      CHECK(std::isnan(r2[i]));
    }
  }
  CHECK(sc::maximum(sc::tensor(a), sc::tensor(b)).to_vector<float>()[5] == 2.f);
  CHECK(sc::minimum(sc::tensor(a), sc::tensor(b)).to_vector<float>()[5] == 1.f);
}
