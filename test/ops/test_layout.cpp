// Layout ops, part 1: reshape (views), expand_dims, squeeze, flatten, transpose, broadcast_to,
// each against a plain-loop reference, plus every error path.
#include <algorithm>
#include <numeric>

#include "layout_testing.hpp"

using lt::expect_error;
using lt::values;

namespace {

/// out[i] = x[j] where out axis k is x axis perm[k].
std::vector<double> ref_transpose(const std::vector<double>& x, const sc::Shape& xs, const std::vector<std::int64_t>& perm) {
  sc::Shape os;
  for (auto p : perm) os.push_back(xs[static_cast<int>(p)]);
  std::vector<double> out(static_cast<std::size_t>(os.numel()));
  for (std::int64_t i = 0; i < os.numel(); ++i) {
    const auto idx = lt::unravel(i, os);
    std::vector<std::int64_t> src(xs.size());
    for (std::size_t k = 0; k < perm.size(); ++k) src[perm[k]] = idx[k];
    out[i] = x[lt::ravel(src, xs)];
  }
  return out;
}

/// out[i] = x at i's index aligned from the right, with size-1 input axes read at 0.
std::vector<double> ref_broadcast(const std::vector<double>& x, const sc::Shape& xs, const sc::Shape& os) {
  std::vector<double> out(static_cast<std::size_t>(os.numel()));
  const int off = os.rank() - xs.rank();
  for (std::int64_t i = 0; i < os.numel(); ++i) {
    const auto idx = lt::unravel(i, os);
    std::vector<std::int64_t> src(xs.size());
    for (int k = 0; k < xs.rank(); ++k) src[k] = xs[k] == 1 ? 0 : idx[k + off];
    out[i] = x[lt::ravel(src, xs)];
  }
  return out;
}

}  // namespace

// ---- reshape ---------------------------------------------------------------------------------

TEST_CASE("reshape is a view that shares storage", "[layout][reshape]") {
  for (sc::DType d : lt::all_dtypes) {
    auto x = lt::sample({2, 3, 4}, d);
    auto y = sc::reshape(x, {4, 6});
    CHECK(y.shape() == sc::Shape{4, 6});
    CHECK(y.dtype() == d);
    CHECK(y.shares_storage_with(x));
    CHECK(y.raw_data() == x.raw_data());
    CHECK(values(y) == values(x));
  }
  // Writing through one handle is visible through the other: the same memory.
  auto x = sc::zeros({2, 3});
  auto y = sc::reshape(x, {6});
  y.data<float>()[4] = 7.f;
  CHECK(x.to_vector<float>() == std::vector<float>{0, 0, 0, 0, 7, 0});
}

TEST_CASE("reshape infers one -1 and handles scalars, size-1 and empty shapes", "[layout][reshape]") {
  auto x = lt::sample({2, 3, 4}, sc::f32);
  CHECK(sc::reshape(x, {-1}).shape() == sc::Shape{24});
  CHECK(sc::reshape(x, {-1, 4}).shape() == sc::Shape{6, 4});
  CHECK(sc::reshape(x, {2, -1, 3}).shape() == sc::Shape{2, 4, 3});
  CHECK(sc::reshape(x, {12, -1}).shape() == sc::Shape{12, 2});
  CHECK(sc::reshape(x, {1, 24, 1}).shape() == sc::Shape{1, 24, 1});
  auto s = sc::scalar(5.0);
  CHECK(sc::reshape(s, {1, 1}).shape() == sc::Shape{1, 1});
  CHECK(sc::reshape(s, {-1}).shape() == sc::Shape{1});
  CHECK(sc::reshape(sc::reshape(s, {1, 1}), {}).rank() == 0);
  CHECK(sc::reshape(sc::reshape(s, {1, 1}), {}).item<double>() == 5.0);
  auto e = sc::zeros({0, 3});
  CHECK(sc::reshape(e, {3, 0}).shape() == sc::Shape{3, 0});
  CHECK(sc::reshape(e, {-1, 3}).shape() == sc::Shape{0, 3});
  CHECK(sc::reshape(e, {-1}).shape() == sc::Shape{0});
  CHECK(sc::reshape(e, {2, 0, 5}).numel() == 0);
}

TEST_CASE("reshape errors name both shapes and the caller's line", "[layout][reshape][errors]") {
  auto x = sc::zeros({2, 3});
  expect_error<sc::ShapeError>([&] { (void)sc::reshape(x, {4, 2}); }, {"[reshape]", "cannot reshape [2, 3] (6 elements) into [4, 2] (8 elements)"});
  expect_error<sc::ShapeError>([&] { (void)sc::reshape(x, {4, -1}); }, {"[reshape]", "[2, 3]", "[4, -1]"});
  expect_error<sc::ShapeError>([&] { (void)sc::reshape(x, {-1, -1}); }, {"[reshape]", "only one -1", "[-1, -1]", "[2, 3]"});
  expect_error<sc::ShapeError>([&] { (void)sc::reshape(x, {-2, -3}); }, {"[reshape]", "negative extent", "[-2, -3]", "[2, 3]"});
  expect_error<sc::ShapeError>([&] { (void)sc::reshape(sc::zeros({0, 3}), {0, -1}); }, {"[reshape]", "ambiguous", "[0, 3]", "[0, -1]"});
  expect_error<sc::ValueError>([&] { (void)sc::reshape(sc::Tensor{}, {1}); }, {"[reshape]", "undefined"});
}

TEST_CASE("expand_dims inserts a size-1 axis at every position, negative included", "[layout][reshape]") {
  for (const sc::Shape& s : lt::sample_shapes) {
    auto x = lt::sample(s, sc::i32);
    const int r = s.rank();
    for (std::int64_t ax = -r - 1; ax <= r; ++ax) {
      auto y = sc::expand_dims(x, ax);
      const int at = static_cast<int>(ax < 0 ? ax + r + 1 : ax);
      std::vector<std::int64_t> want = s.vec();
      want.insert(want.begin() + at, 1);
      CHECK(y.shape() == sc::Shape(want));
      CHECK(y.shares_storage_with(x));
      CHECK(values(y) == values(x));
    }
  }
  auto x = sc::zeros({2, 3});
  expect_error<sc::ShapeError>([&] { (void)sc::expand_dims(x, 3); }, {"[expand_dims]", "axis 3 is out of range [-3, 2]", "[2, 3]"});
  expect_error<sc::ShapeError>([&] { (void)sc::expand_dims(x, -4); }, {"[expand_dims]", "axis -4", "[2, 3]"});
  expect_error<sc::ShapeError>([&] { (void)sc::expand_dims(sc::zeros({1, 1, 1, 1, 1, 1, 1, 1}), 0); }, {"[expand_dims]", "maximum rank 8"});
}

TEST_CASE("squeeze drops all or the listed size-1 axes", "[layout][reshape]") {
  auto x = lt::sample({1, 3, 1, 2, 1}, sc::f64);
  CHECK(sc::squeeze(x).shape() == sc::Shape{3, 2});
  CHECK(sc::squeeze(x, {0}).shape() == sc::Shape{3, 1, 2, 1});
  CHECK(sc::squeeze(x, {-1, 2}).shape() == sc::Shape{1, 3, 2});
  CHECK(sc::squeeze(x).shares_storage_with(x));
  CHECK(values(sc::squeeze(x)) == values(x));
  CHECK(sc::squeeze(sc::zeros({1, 1})).rank() == 0);
  CHECK(sc::squeeze(sc::scalar(1)).rank() == 0);
  CHECK(sc::squeeze(sc::zeros({0, 1})).shape() == sc::Shape{0});
  CHECK(sc::squeeze(sc::zeros({2, 3})).shape() == sc::Shape{2, 3});
  expect_error<sc::ShapeError>([&] { (void)sc::squeeze(x, {1}); }, {"[squeeze]", "cannot squeeze axis 1 of shape [1, 3, 1, 2, 1]", "extent is 3"});
  expect_error<sc::ShapeError>([&] { (void)sc::squeeze(x, {5}); }, {"[squeeze]", "axis 5 is out of range for rank 5"});
  expect_error<sc::ShapeError>([&] { (void)sc::squeeze(x, {0, -5}); }, {"[squeeze]", "listed twice", "[0, -5]"});
}

TEST_CASE("flatten merges trailing axes", "[layout][reshape]") {
  auto x = lt::sample({2, 3, 4, 5}, sc::i64);
  CHECK(sc::flatten(x).shape() == sc::Shape{120});
  CHECK(sc::flatten(x, 1).shape() == sc::Shape{2, 60});
  CHECK(sc::flatten(x, -1).shape() == sc::Shape{2, 3, 4, 5});
  CHECK(sc::flatten(x, -2).shape() == sc::Shape{2, 3, 20});
  CHECK(sc::flatten(x, 1).shares_storage_with(x));
  CHECK(values(sc::flatten(x, 2)) == values(x));
  CHECK(sc::flatten(sc::scalar(2.f)).shape() == sc::Shape{1});
  CHECK(sc::flatten(sc::zeros({3, 0, 2}), 1).shape() == sc::Shape{3, 0});
  expect_error<sc::ShapeError>([&] { (void)sc::flatten(x, 4); }, {"[flatten]", "axis 4 is out of range for rank 4"});
  expect_error<sc::ShapeError>([&] { (void)sc::flatten(sc::scalar(1.f), 1); }, {"[flatten]", "start_axis 1", "rank-0"});
}

// ---- transpose -------------------------------------------------------------------------------

TEST_CASE("transpose matches the loop reference for every permutation of ranks 0..4", "[layout][transpose]") {
  const std::vector<sc::Shape> shapes = {{}, {4}, {3, 5}, {2, 3, 4}, {2, 3, 4, 5}, {1, 3, 1, 2}, {2, 0, 3}, {3, 1}};
  for (const sc::Shape& s : shapes)
    for (sc::DType d : lt::all_dtypes) {
      auto x = lt::sample(s, d);
      const auto xv = values(x);
      std::vector<std::int64_t> perm(s.size());
      std::iota(perm.begin(), perm.end(), 0);
      do {
        INFO("shape " << s << " dtype " << d << " perm " << sc::Shape(perm));
        auto y = sc::transpose(x, perm);
        CHECK(y.dtype() == d);
        CHECK(y.shape().numel() == s.numel());
        CHECK(!y.shares_storage_with(x));
        CHECK(values(y) == ref_transpose(xv, s, perm));
      } while (std::next_permutation(perm.begin(), perm.end()));
    }
}

TEST_CASE("transpose defaults to reversing the axes and takes negative entries", "[layout][transpose]") {
  auto m = sc::tensor({{1, 2, 3}, {4, 5, 6}});
  CHECK(sc::transpose(m).shape() == sc::Shape{3, 2});
  CHECK(sc::transpose(m).to_vector<int>() == std::vector<int>{1, 4, 2, 5, 3, 6});
  auto x = lt::sample({2, 3, 4}, sc::f32);
  CHECK(values(sc::transpose(x)) == ref_transpose(values(x), x.shape(), {2, 1, 0}));
  CHECK(values(sc::transpose(x, {-1, 0, -2})) == ref_transpose(values(x), x.shape(), {2, 0, 1}));
  CHECK(sc::transpose(sc::scalar(3.0)).item<double>() == 3.0);
  // Rank 8 (the maximum): reversal of [2, 1, 2, 3, 1, 2, 2, 1].
  const sc::Shape s8{2, 1, 2, 3, 1, 2, 2, 1};
  auto z = lt::sample(s8, sc::i64);
  CHECK(values(sc::transpose(z)) == ref_transpose(values(z), s8, {7, 6, 5, 4, 3, 2, 1, 0}));
}

TEST_CASE("transpose of large and batched matrices (tiled, threaded paths)", "[layout][transpose]") {
  // Extents that are not multiples of the tile, and enough tiles for several threads.
  struct Case { sc::Shape shape; std::vector<std::int64_t> perm; };
  const std::vector<Case> cases = {
      {{700, 901}, {1, 0}},
      {{3, 257, 130}, {0, 2, 1}},
      {{40, 33, 70}, {2, 0, 1}},
      {{6, 50, 7, 90}, {0, 3, 2, 1}},
      {{1000, 3}, {1, 0}},
      {{2, 100000}, {1, 0}},
  };
  for (const Case& c : cases)
    for (sc::DType d : {sc::f32, sc::f64, sc::boolean}) {
      INFO("shape " << c.shape << " dtype " << d);
      auto x = lt::sample(c.shape, d);
      CHECK(values(sc::transpose(x, c.perm)) == ref_transpose(values(x), c.shape, c.perm));
    }
  // The identity permutation and a transpose and back give x again.
  auto x = lt::sample({300, 400}, sc::i32);
  CHECK(values(sc::transpose(x, {0, 1})) == values(x));
  CHECK(values(sc::transpose(sc::transpose(x))) == values(x));
}

TEST_CASE("transpose validates the permutation", "[layout][transpose][errors]") {
  auto x = sc::zeros({2, 3});
  expect_error<sc::ShapeError>([&] { (void)sc::transpose(x, {0}); }, {"[transpose]", "perm [0] has 1 entries", "shape [2, 3] (rank 2)"});
  expect_error<sc::ShapeError>([&] { (void)sc::transpose(x, {0, 0}); }, {"[transpose]", "perm [0, 0] is not a permutation", "[2, 3]", "axis 0 appears twice"});
  expect_error<sc::ShapeError>([&] { (void)sc::transpose(x, {1, -2, 0}); }, {"[transpose]", "has 3 entries"});
  expect_error<sc::ShapeError>([&] { (void)sc::transpose(x, {0, 2}); }, {"[transpose]", "entry 2 is out of range", "[2, 3]"});
  expect_error<sc::ShapeError>([&] { (void)sc::transpose(x, {-3, 0}); }, {"[transpose]", "entry -3 is out of range"});
  expect_error<sc::ShapeError>([&] { (void)sc::transpose(x, {0, 1, 2, 3, 4, 5, 6, 7, 8}); }, {"[transpose]", "perm [0, 1, 2, 3, 4, 5, 6, 7, 8] has 9 entries", "[2, 3]"});
  expect_error<sc::ValueError>([&] { (void)sc::transpose(sc::Tensor{}); }, {"[transpose]", "undefined"});
}

// ---- broadcast_to ----------------------------------------------------------------------------

TEST_CASE("broadcast_to matches the loop reference", "[layout][broadcast_to]") {
  struct Case { sc::Shape from, to; };
  const std::vector<Case> cases = {
      {{}, {}}, {{}, {2, 3}}, {{1}, {4}}, {{3}, {2, 3}}, {{2, 1}, {2, 3}}, {{1, 3, 1}, {4, 3, 5}},
      {{2, 3}, {2, 3}}, {{1}, {0}}, {{0}, {2, 0}}, {{1, 1}, {3, 1, 2}}, {{2, 1, 3}, {2, 2, 4, 3}},
      {{5, 1, 1, 2}, {5, 3, 4, 2}}, {{1, 0}, {3, 0}},
  };
  for (const Case& c : cases)
    for (sc::DType d : lt::all_dtypes) {
      INFO(c.from << " -> " << c.to << " dtype " << d);
      auto x = lt::sample(c.from, d, 1);
      auto y = sc::broadcast_to(x, c.to);
      CHECK(y.shape() == c.to);
      CHECK(y.dtype() == d);
      CHECK(values(y) == ref_broadcast(values(x), c.from, c.to));
    }
}

TEST_CASE("broadcast_to of large tensors (row fill, row copy and threaded paths)", "[layout][broadcast_to]") {
  const std::vector<std::pair<sc::Shape, sc::Shape>> cases = {
      {{1, 1000}, {500, 1000}}, {{1000, 1}, {1000, 500}}, {{300, 1, 200}, {300, 4, 200}}, {{}, {700, 300}}};
  for (const auto& [from, to] : cases) {
    INFO(from << " -> " << to);
    auto x = lt::sample(from, sc::f32);
    CHECK(values(sc::broadcast_to(x, to)) == ref_broadcast(values(x), from, to));
  }
}

TEST_CASE("broadcast_to errors name both shapes", "[layout][broadcast_to][errors]") {
  auto x = sc::zeros({2, 3});
  expect_error<sc::ShapeError>([&] { (void)sc::broadcast_to(x, {2, 4}); }, {"[broadcast_to]", "cannot broadcast shape [2, 3] to [2, 4]"});
  expect_error<sc::ShapeError>([&] { (void)sc::broadcast_to(x, {3}); }, {"[broadcast_to]", "[2, 3] to [3]"});
  expect_error<sc::ShapeError>([&] { (void)sc::broadcast_to(x, {1, 3}); }, {"[broadcast_to]", "[2, 3] to [1, 3]"});
  expect_error<sc::ShapeError>([&] { (void)sc::broadcast_to(sc::zeros({0}), {1}); }, {"[broadcast_to]", "[0] to [1]"});
  expect_error<sc::ShapeError>([&] { (void)sc::broadcast_to(x, {-1, 3}); }, {"[broadcast_to]", "negative extent", "[-1, 3]"});
}
