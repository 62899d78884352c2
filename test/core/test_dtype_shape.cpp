// DType promotion table, weak scalars, Shape and the broadcasting rule.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

using sc::DType;

TEST_CASE("promotion follows the documented table", "[dtype]") {
  const DType order[] = {sc::boolean, sc::i32, sc::i64, sc::f32, sc::f64};
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 5; ++j) CHECK(sc::promote(order[i], order[j]) == order[std::max(i, j)]);
  CHECK(sc::promote(sc::i64, sc::f32) == sc::f32);
}

TEST_CASE("weak scalars take the tensor's dtype of the same kind", "[dtype]") {
  CHECK(sc::promote_scalar(sc::i64, sc::ScalarKind::integer) == sc::i64);
  CHECK(sc::promote_scalar(sc::f64, sc::ScalarKind::floating) == sc::f64);
  CHECK(sc::promote_scalar(sc::f32, sc::ScalarKind::integer) == sc::f32);
  CHECK(sc::promote_scalar(sc::i32, sc::ScalarKind::floating) == sc::f32);
  CHECK(sc::promote_scalar(sc::boolean, sc::ScalarKind::integer) == sc::i64);
  CHECK((sc::arange(3) + 1).dtype() == sc::i64);
  CHECK((sc::ones({2}, sc::f64) * 0.5f).dtype() == sc::f64);
  CHECK((sc::ones({2}, sc::i32) * 0.5).dtype() == sc::f32);
}

TEST_CASE("shape basics", "[shape]") {
  sc::Shape s{2, 3, 4};
  CHECK(s.rank() == 3);
  CHECK(s.numel() == 24);
  CHECK(s.str() == "[2, 3, 4]");
  CHECK(sc::Shape{}.numel() == 1);
  CHECK(sc::contiguous_strides(s) == sc::Shape{12, 4, 1});
  CHECK_THROWS_AS(sc::Shape({1, 1, 1, 1, 1, 1, 1, 1, 1}), sc::ShapeError);
}

TEST_CASE("the broadcasting rule", "[shape]") {
  sc::Shape out;
  CHECK(sc::broadcast_shapes({2, 3}, {3}, out));
  CHECK(out == sc::Shape{2, 3});
  CHECK(sc::broadcast_shapes({4, 1, 5}, {3, 1}, out));
  CHECK(out == sc::Shape{4, 3, 5});
  CHECK(sc::broadcast_shapes({}, {2, 2}, out));
  CHECK(out == sc::Shape{2, 2});
  CHECK(sc::broadcast_shapes({0, 3}, {1, 3}, out));
  CHECK(out == sc::Shape{0, 3});
  CHECK_FALSE(sc::broadcast_shapes({2, 3}, {4}, out));
  CHECK_FALSE(sc::broadcast_shapes({2, 3}, {3, 3}, out));
  CHECK(sc::broadcast_strides({3, 1}, {4, 3, 5}) == sc::Shape{0, 1, 0});
}

TEST_CASE("normalize_axis accepts negative axes and rejects out of range", "[shape]") {
  const auto here = std::source_location::current();
  CHECK(sc::normalize_axis(-1, 3, "op", here) == 2);
  CHECK(sc::normalize_axis(0, 3, "op", here) == 0);
  CHECK_THROWS_AS(sc::normalize_axis(3, 3, "op", here), sc::ShapeError);
  CHECK_THROWS_AS(sc::normalize_axis(-4, 3, "op", here), sc::ShapeError);
  CHECK_THROWS_WITH(sc::normalize_axis(5, 2, "sum", here),
                    Catch::Contains("[sum] axis 5 is out of range for rank 2") &&
                        Catch::Contains("test_dtype_shape.cpp:"));
}
