// cumsum: hand-worked values (inclusive, exclusive, reversed, along every axis), integer wrap,
// parallel lines against a loop, gradients by central differences, traced equal to eager, errors.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "testing.hpp"

using sctest::error_of;

TEST_CASE("cumsum: hand-worked values along each axis, exclusive and reversed", "[scan]") {
  const sc::Tensor x = sc::tensor({{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}});
  CHECK(sc::cumsum(x, 1).to_vector<double>() == std::vector<double>{1, 3, 6, 4, 9, 15});
  CHECK(sc::cumsum(x, -1, true).to_vector<double>() == std::vector<double>{0, 1, 3, 0, 4, 9});
  CHECK(sc::cumsum(x, 1, false, true).to_vector<double>() == std::vector<double>{6, 5, 3, 15, 11, 6});
  CHECK(sc::cumsum(x, 1, true, true).to_vector<double>() == std::vector<double>{5, 3, 0, 11, 6, 0});
  CHECK(sc::cumsum(x, 0).to_vector<double>() == std::vector<double>{1, 2, 3, 5, 7, 9});
  CHECK(sc::cumsum(x, 0, true, true).to_vector<double>() == std::vector<double>{4, 5, 6, 0, 0, 0});
  const sc::Tensor i = sc::tensor(std::vector<std::int32_t>{std::numeric_limits<std::int32_t>::max(), 1, 5});
  CHECK(sc::cumsum(i).dtype() == sc::i32);
  CHECK(sc::cumsum(i).to_vector<std::int32_t>() ==
        std::vector<std::int32_t>{std::numeric_limits<std::int32_t>::max(), std::numeric_limits<std::int32_t>::min(),
                                  std::numeric_limits<std::int32_t>::min() + 5});  // wraps, as sum does
  CHECK(sc::cumsum(sc::zeros({0, 4}), 1).shape() == sc::Shape{0, 4});
}

TEST_CASE("cumsum: long and many lines over threads equal a loop in order", "[scan][threads]") {
  sctest::at_threads({1, 2}, [&](int) {
    for (const auto& [shape, axis] : std::vector<std::pair<sc::Shape, int>>{{{3, 70001}, 1}, {{5000, 600}, 0},
                                                                             {{4, 3000, 7}, 1}}) {
      INFO("shape " << shape << " axis " << axis);
      const sc::Tensor x = sc::random::uniform(shape, -1.0, 1.0, 7);
      const std::vector<float> xv = x.to_vector<float>(), got = sc::cumsum(x, axis).to_vector<float>();
      std::int64_t outer = 1, inner = 1;
      for (int d = 0; d < axis; ++d) outer *= shape[d];
      for (int d = axis + 1; d < shape.rank(); ++d) inner *= shape[d];
      const std::int64_t len = shape[axis];
      std::size_t bad = 0;
      for (std::int64_t o = 0; o < outer; ++o)
        for (std::int64_t k = 0; k < inner; ++k) {
          float acc = 0;  // in order, in f32: the CPU's exact numbers
          for (std::int64_t s = 0; s < len; ++s) {
            const auto at = static_cast<std::size_t>((o * len + s) * inner + k);
            acc += xv[at];
            bad += got[at] != acc;
          }
        }
      CHECK(bad == 0);
    }
  });
}

TEST_CASE("cumsum: gradients by central differences, traced equal to eager", "[scan][grad]") {
  const sc::Tensor x = sc::random::normal({3, 4, 2}, 3).astype(sc::f64);
  for (int flags = 0; flags < 4; ++flags)
    for (const int axis : {0, 1, -1}) {
      INFO("axis " << axis << " flags " << flags);
      const auto f = [&](const std::vector<sc::Tensor>& in) {
        return sc::cumsum(in[0] * in[0], axis, flags & 1, flags >> 1);
      };
      const auto r = sc::check_gradients(f, {x});
      INFO(r.report);
      CHECK(r.ok);
      auto traced = sc::function([&](const sc::Tensor& a) { return sc::cumsum(a, axis, flags & 1, flags >> 1); });
      CHECK(traced(x).to_vector<double>() == sc::cumsum(x, axis, flags & 1, flags >> 1).to_vector<double>());
    }
  // second order through a traced gradient
  auto g = sc::function([](const sc::Tensor& a) {
    sc::GradientTape t;
    t.watch(a);
    return t.gradient(sc::sum(sc::cumsum(a * a, 1) * a), a);
  });
  sc::GradientTape t;
  t.watch(x);
  CHECK(g(x).to_vector<double>() == t.gradient(sc::sum(sc::cumsum(x * x, 1) * x), x).to_vector<double>());
}

TEST_CASE("cumsum: errors name the op, the shapes and the user's line", "[scan][errors]") {
  int line = __LINE__ + 1;
  std::string msg = error_of<sc::DTypeError>([] { (void)sc::cumsum(sc::tensor({true, false})); });
  CHECK_THAT(msg, Catch::Contains("[cumsum]") && Catch::Contains("bool") &&
                      Catch::Contains("test_scan.cpp:" + std::to_string(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ShapeError>([] { (void)sc::cumsum(sc::ones({2, 3}), 2); });
  CHECK_THAT(msg, Catch::Contains("[cumsum]") && Catch::Contains("axis 2") &&
                      Catch::Contains("test_scan.cpp:" + std::to_string(line)));
  msg = error_of<sc::ShapeError>([] { (void)sc::cumsum(sc::scalar(1.f)); });
  CHECK_THAT(msg, Catch::Contains("[cumsum]") && Catch::Contains("rank >= 1"));
}
