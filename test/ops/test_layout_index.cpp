// Layout ops, part 2: concat, stack, slice, gather, one_hot, each against a plain-loop
// reference, plus every error path.
#include "layout_testing.hpp"

using lt::expect_error;
using lt::values;

namespace {

/// Inputs joined along ax: the output coordinate on ax picks the input and its coordinate.
std::vector<double> ref_concat(const std::vector<sc::Tensor>& xs, int ax, const sc::Shape& os) {
  std::vector<std::vector<double>> xv;
  for (const sc::Tensor& x : xs) xv.push_back(values(x));
  std::vector<double> out(static_cast<std::size_t>(os.numel()));
  for (std::int64_t i = 0; i < os.numel(); ++i) {
    auto idx = lt::unravel(i, os);
    std::size_t k = 0;
    while (idx[ax] >= xs[k].shape()[ax]) idx[ax] -= xs[k++].shape()[ax];
    out[i] = xv[k][lt::ravel(idx, xs[k].shape())];
  }
  return out;
}

/// out[idx] = x[idx + begin] (begin already resolved to non-negative).
std::vector<double> ref_slice(const std::vector<double>& x, const sc::Shape& xs, const std::vector<std::int64_t>& begin,
                              const sc::Shape& os) {
  std::vector<double> out(static_cast<std::size_t>(os.numel()));
  for (std::int64_t i = 0; i < os.numel(); ++i) {
    auto idx = lt::unravel(i, os);
    for (std::size_t k = 0; k < idx.size(); ++k) idx[k] += begin[k];
    out[i] = x[lt::ravel(idx, xs)];
  }
  return out;
}

/// index_select with plain loops over (outer, index, inner).
std::vector<double> ref_gather(const std::vector<double>& x, const sc::Shape& xs, const std::vector<std::int64_t>& ix, int ax) {
  std::int64_t outer = 1, inner = 1;
  for (int k = 0; k < ax; ++k) outer *= xs[k];
  for (int k = ax + 1; k < xs.rank(); ++k) inner *= xs[k];
  const std::int64_t E = xs[ax];
  std::vector<double> out;
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t j : ix)
      for (std::int64_t i = 0; i < inner; ++i) out.push_back(x[(o * E + (j < 0 ? j + E : j)) * inner + i]);
  return out;
}

/// Integer index tensor of the given shape and dtype.
sc::Tensor indices(const std::vector<std::int64_t>& v, const sc::Shape& s, sc::DType d) {
  return sc::cast(sc::tensor(v, s), d);
}

}  // namespace

// ---- concat and stack ------------------------------------------------------------------------

TEST_CASE("concat matches the loop reference over ranks 1..4, every axis and dtype", "[layout][concat]") {
  const std::vector<sc::Shape> bases = {{4}, {3, 4}, {2, 3, 4}, {2, 1, 3, 2}};
  for (const sc::Shape& base : bases)
    for (int ax = -base.rank(); ax < base.rank(); ++ax)
      for (sc::DType d : lt::all_dtypes) {
        const int a = ax < 0 ? ax + base.rank() : ax;
        std::vector<sc::Tensor> xs;
        sc::Shape os = base;
        os[a] = 0;
        for (std::int64_t ext : {2, 0, 1, 3}) {  // an empty input in the middle is fine
          sc::Shape s = base;
          s[a] = ext;
          xs.push_back(lt::sample(s, d, static_cast<int>(xs.size())));
          os[a] += ext;
        }
        INFO("base " << base << " axis " << ax << " dtype " << d);
        auto y = sc::concat(xs, ax);
        CHECK(y.shape() == os);
        CHECK(y.dtype() == d);
        CHECK(values(y) == ref_concat(xs, a, os));
      }
}

TEST_CASE("concat promotes dtypes and handles single, empty and large inputs", "[layout][concat]") {
  auto a = sc::tensor({1, 2});
  auto b = sc::tensor({0.5f});
  auto c = sc::concat({a, b}, 0);
  CHECK(c.dtype() == sc::f32);
  CHECK(c.to_vector<float>() == std::vector<float>{1, 2, 0.5f});
  CHECK(sc::concat({sc::tensor({true, false}), sc::tensor({std::int64_t{7}})}, 0).dtype() == sc::i64);
  CHECK(sc::concat({sc::tensor({true, false}), sc::tensor({std::int64_t{7}})}, 0).to_vector<std::int64_t>() ==
        std::vector<std::int64_t>{1, 0, 7});
  CHECK(sc::concat({sc::tensor({1.0}), sc::tensor({2.f})}, -1).dtype() == sc::f64);
  auto one = sc::concat({a}, 0);
  CHECK(one.to_vector<int>() == std::vector<int>{1, 2});
  CHECK(sc::concat({sc::zeros({0, 3}), sc::zeros({0, 3})}, 0).shape() == sc::Shape{0, 3});
  CHECK(sc::concat({sc::zeros({0, 3}), sc::zeros({0, 2})}, 1).shape() == sc::Shape{0, 5});
  std::vector<sc::Tensor> big = {lt::sample({300, 500}, sc::f32, 0), lt::sample({300, 70}, sc::f32, 1),
                                 lt::sample({300, 1}, sc::f32, 2)};
  CHECK(values(sc::concat(big, 1)) == ref_concat(big, 1, {300, 571}));
  std::vector<sc::Tensor> rows = {lt::sample({300, 500}, sc::f64, 0), lt::sample({20, 500}, sc::f64, 1)};
  CHECK(values(sc::concat(rows, 0)) == ref_concat(rows, 0, {320, 500}));
}

TEST_CASE("concat errors name the shapes", "[layout][concat][errors]") {
  auto a = sc::zeros({2, 3});
  expect_error<sc::ValueError>([&] { (void)sc::concat({}, 0); }, {"[concat]", "needs at least one tensor"});
  expect_error<sc::ShapeError>([&] { (void)sc::concat({a, sc::zeros({3, 3})}, 1); }, {"[concat]", "shapes must match except along axis 1", "[2, 3] (tensor 0) and [3, 3] (tensor 1)"});
  expect_error<sc::ShapeError>([&] { (void)sc::concat({a, a, sc::zeros({2, 3, 1})}, 0); }, {"[concat]", "[2, 3] (tensor 0) and [2, 3, 1] (tensor 2)"});
  expect_error<sc::ShapeError>([&] { (void)sc::concat({a, a}, 2); }, {"[concat]", "axis 2 is out of range for rank 2"});
  expect_error<sc::ShapeError>([&] { (void)sc::concat({a, a}, -3); }, {"[concat]", "axis -3 is out of range"});
  expect_error<sc::ShapeError>([&] { (void)sc::concat({sc::scalar(1.f), sc::scalar(2.f)}, 0); }, {"[concat]", "rank-0", "sc::stack"});
  expect_error<sc::ValueError>([&] { (void)sc::concat({a, sc::Tensor{}}, 0); }, {"[concat]", "undefined"});
}

TEST_CASE("stack joins along a new axis", "[layout][stack]") {
  for (sc::DType d : lt::all_dtypes)
    for (std::int64_t ax = -3; ax <= 2; ++ax) {
      std::vector<sc::Tensor> xs = {lt::sample({2, 3}, d, 0), lt::sample({2, 3}, d, 1), lt::sample({2, 3}, d, 2)};
      auto y = sc::stack(xs, ax);
      const int a = static_cast<int>(ax < 0 ? ax + 3 : ax);
      std::vector<std::int64_t> want = {2, 3};
      want.insert(want.begin() + a, 3);
      INFO("axis " << ax << " dtype " << d);
      REQUIRE(y.shape() == sc::Shape(want));
      const auto yv = values(y);
      std::vector<double> ref(yv.size());
      for (std::int64_t i = 0; i < y.numel(); ++i) {  // y[..k..] == xs[k][...]
        auto idx = lt::unravel(i, y.shape());
        const std::int64_t k = idx[a];
        idx.erase(idx.begin() + a);
        ref[i] = values(xs[k])[lt::ravel(idx, {2, 3})];
      }
      CHECK(yv == ref);
    }
  CHECK(sc::stack({sc::scalar(1.f), sc::scalar(2.f)}).to_vector<float>() == std::vector<float>{1, 2});
  CHECK(sc::stack({sc::scalar(1.f), sc::scalar(2.f)}).shape() == sc::Shape{2});
  CHECK(sc::stack({sc::zeros({0, 2})}, 1).shape() == sc::Shape{0, 1, 2});
  expect_error<sc::ValueError>([&] { (void)sc::stack({}); }, {"[stack]", "needs at least one tensor"});
  expect_error<sc::ShapeError>([&] { (void)sc::stack({sc::zeros({2}), sc::zeros({3})}); }, {"[stack]", "same shape", "[2] (tensor 0) and [3] (tensor 1)"});
  expect_error<sc::ShapeError>([&] { (void)sc::stack({sc::zeros({2}), sc::zeros({2})}, 2); }, {"[stack]", "axis 2 is out of range [-2, 1]", "[2]"});
}

// ---- slice -----------------------------------------------------------------------------------

TEST_CASE("slice matches the loop reference over ranks 0..4 and dtypes", "[layout][slice]") {
  struct Case { sc::Shape shape; std::vector<std::int64_t> begin, size, resolved; };
  const std::vector<Case> cases = {
      {{}, {}, {}, {}},
      {{5}, {1}, {3}, {1}},
      {{5}, {-2}, {-1}, {3}},        // negative begin counts from the end
      {{5}, {5}, {0}, {5}},          // empty at the end
      {{3, 4}, {1, 0}, {2, -1}, {1, 0}},
      {{3, 4}, {0, 2}, {-1, 1}, {0, 2}},  // one column: a strided gather-like copy
      {{3, 4}, {-3, -4}, {3, 4}, {0, 0}},
      {{2, 3, 4}, {1, 1, 1}, {1, 2, 3}, {1, 1, 1}},
      {{2, 3, 4}, {0, 0, 0}, {2, 0, 4}, {0, 0, 0}},
      {{2, 3, 1, 4}, {0, 1, 0, 1}, {2, 2, 1, 2}, {0, 1, 0, 1}},
      {{2, 3, 1, 4}, {1, -1, -1, -4}, {-1, -1, -1, -1}, {1, 2, 0, 0}},
      {{2, 0, 3}, {1, 0, 1}, {1, 0, 2}, {1, 0, 1}},
  };
  for (const Case& c : cases)
    for (sc::DType d : lt::all_dtypes) {
      INFO("shape " << c.shape << " begin " << sc::Shape(c.begin) << " size " << sc::Shape(c.size) << " dtype " << d);
      auto x = lt::sample(c.shape, d);
      auto y = sc::slice(x, c.begin, c.size);
      sc::Shape os;
      for (int k = 0; k < c.shape.rank(); ++k) os.push_back(c.size[k] == -1 ? c.shape[k] - c.resolved[k] : c.size[k]);
      CHECK(y.shape() == os);
      CHECK(y.dtype() == d);
      CHECK(!y.shares_storage_with(x));
      CHECK(values(y) == ref_slice(values(x), c.shape, c.resolved, os));
    }
}

TEST_CASE("slice of large tensors (row copies, threads, strided columns)", "[layout][slice]") {
  auto x = lt::sample({1000, 700}, sc::f32);
  const auto xv = values(x);
  CHECK(values(sc::slice(x, {10, 5}, {890, 600})) == ref_slice(xv, x.shape(), {10, 5}, {890, 600}));
  CHECK(values(sc::slice(x, {0, 3}, {-1, 1})) == ref_slice(xv, x.shape(), {0, 3}, {1000, 1}));
  CHECK(values(sc::slice(x, {500, 0}, {-1, -1})) == ref_slice(xv, x.shape(), {500, 0}, {500, 700}));
  auto z = lt::sample({4, 300, 200}, sc::i64);
  CHECK(values(sc::slice(z, {1, 0, 50}, {2, -1, 3})) == ref_slice(values(z), z.shape(), {1, 0, 50}, {2, 300, 3}));
}

TEST_CASE("slice errors name the op, the shape, begin and size", "[layout][slice][errors]") {
  auto x = sc::zeros({2, 3});
  expect_error<sc::ShapeError>([&] { (void)sc::slice(x, {0, 2}, {1, 2}); }, {"[slice]", "begin [0, 2] and size [1, 2] are out of range for shape [2, 3] (axis 1)"});
  expect_error<sc::ShapeError>([&] { (void)sc::slice(x, {3, 0}, {0, 1}); }, {"[slice]", "begin [3, 0]", "[2, 3] (axis 0)"});
  expect_error<sc::ShapeError>([&] { (void)sc::slice(x, {-3, 0}, {1, 1}); }, {"[slice]", "begin [-3, 0]", "[2, 3] (axis 0)"});
  expect_error<sc::ShapeError>([&] { (void)sc::slice(x, {0, 0}, {-2, 1}); }, {"[slice]", "size [-2, 1]", "[2, 3] (axis 0)"});
  expect_error<sc::ShapeError>([&] { (void)sc::slice(x, {0}, {1}); }, {"[slice]", "begin [0] and size [1] need one entry per axis of shape [2, 3]"});
  expect_error<sc::ShapeError>([&] { (void)sc::slice(x, {0, 0}, {1}); }, {"[slice]", "size [1]", "[2, 3]"});
  expect_error<sc::ShapeError>([&] { (void)sc::slice(x, std::vector<std::int64_t>(9, 0), {1, 1}); }, {"[slice]", "begin [0, 0, 0, 0, 0, 0, 0, 0, 0] has 9 entries", "[2, 3]"});
}

// ---- gather ----------------------------------------------------------------------------------

TEST_CASE("gather matches index_select over axes, index ranks and dtypes", "[layout][gather]") {
  const std::vector<sc::Shape> shapes = {{5}, {4, 3}, {2, 3, 4}, {2, 3, 1, 4}};
  const std::vector<std::pair<std::vector<std::int64_t>, sc::Shape>> index_sets = {
      {{1}, {}}, {{0, -1, 1, 0}, {4}}, {{-1, 0, 0, 1, -2, 0}, {2, 3}}, {{}, {0}}, {{0, 0}, {1, 2, 1}}};
  for (const sc::Shape& s : shapes)
    for (int ax = -s.rank(); ax < s.rank(); ++ax)
      for (sc::DType d : lt::all_dtypes)
        for (const auto& [iv, is] : index_sets)
          for (sc::DType id : {sc::i32, sc::i64}) {
            const int a = ax < 0 ? ax + s.rank() : ax;
            if (s[a] < 2) continue;  // the index sets use 0, 1, -1, -2
            auto x = lt::sample(s, d);
            auto y = sc::gather(x, indices(iv, is, id), ax);
            sc::Shape os(s.begin(), s.begin() + a);
            for (auto e : is) os.push_back(e);
            for (int k = a + 1; k < s.rank(); ++k) os.push_back(s[k]);
            INFO("shape " << s << " axis " << ax << " dtype " << d << " indices " << is << " " << id);
            CHECK(y.shape() == os);
            CHECK(y.dtype() == d);
            CHECK(values(y) == ref_gather(values(x), s, iv, a));
          }
}

TEST_CASE("gather of large tensors and empty inputs", "[layout][gather]") {
  auto x = lt::sample({1000, 300}, sc::f32);
  std::vector<std::int64_t> iv;
  for (int i = 0; i < 2000; ++i) iv.push_back((i * 7919) % 1000 - (i % 5 == 0 ? 1000 : 0));
  CHECK(values(sc::gather(x, sc::tensor(iv))) == ref_gather(values(x), x.shape(), iv, 0));
  std::vector<std::int64_t> cols(iv.begin(), iv.begin() + 500);
  for (auto& c : cols) c = c % 300;  // C++ % keeps the sign: -299..299, all valid
  CHECK(values(sc::gather(x, sc::tensor(cols), 1)) == ref_gather(values(x), x.shape(), cols, 1));
  CHECK(sc::gather(sc::zeros({0, 3}), sc::tensor({1}), 1).shape() == sc::Shape{0, 1});
  CHECK(sc::gather(sc::zeros({3, 0}), sc::tensor({2, 0}), 0).shape() == sc::Shape{2, 0});
  CHECK(sc::gather(sc::zeros({0}), indices({}, {0}, sc::i64)).shape() == sc::Shape{0});
}

TEST_CASE("gather errors", "[layout][gather][errors]") {
  auto x = sc::zeros({5, 3});
  expect_error<sc::DTypeError>([&] { (void)sc::gather(x, sc::tensor({1.f})); }, {"[gather]", "expects i32 or i64 indices, got f32"});
  expect_error<sc::DTypeError>([&] { (void)sc::gather(x, sc::tensor({true})); }, {"[gather]", "got bool"});
  expect_error<sc::ValueError>([&] { (void)sc::gather(x, sc::tensor({0, 5})); }, {"[gather]", "index 5 is out of range for axis 0 of extent 5", "[5, 3]"});
  expect_error<sc::ValueError>([&] { (void)sc::gather(x, sc::tensor({-4}), -1); }, {"[gather]", "index -4 is out of range for axis -1 of extent 3"});
  expect_error<sc::ValueError>([&] { (void)sc::gather(sc::zeros({0}), sc::tensor({0})); }, {"[gather]", "index 0 is out of range", "extent 0"});
  expect_error<sc::ShapeError>([&] { (void)sc::gather(x, sc::tensor({0}), 2); }, {"[gather]", "axis 2 is out of range for rank 2"});
  expect_error<sc::ShapeError>([&] { (void)sc::gather(sc::scalar(1.f), sc::tensor({0})); }, {"[gather]", "rank-0"});
  expect_error<sc::ShapeError>([&] { (void)sc::gather(sc::zeros({2, 1, 1, 1, 1}), sc::zeros({1, 1, 1, 1, 1}, sc::i64)); }, {"[gather]", "rank above 8"});
  // The kernel guards too (a traced graph runs it without infer's value check), after its
  // parallel loop, so a bad index cannot read out of bounds.
  std::array<sc::Tensor, 2> in{x, sc::tensor({1, 9})};
  sc::Tensor out = sc::zeros({2, 3});
  CHECK_THROWS_WITH(sc::ops::Gather::cpu(in, out, {}), Catch::Contains("[gather] index 9 is out of range"));
}

// Integer sums wrap (two's complement) as add's do (README); scatter_add's accumulation overflowed
// as signed integers (undefined; -fsanitize=undefined stopped there).
TEMPLATE_TEST_CASE("scatter_add: integer sums wrap", "[layout][scatter_add]", std::int32_t, std::int64_t) {
  using T = TestType;
  const T big = std::numeric_limits<T>::max(), low = std::numeric_limits<T>::min();
  const sc::Tensor x = sc::tensor(std::vector<T>{big, T(1)});
  const sc::Tensor idx = sc::tensor(std::vector<std::int64_t>{0, 0, 1, -1});
  const sc::Tensor upd = sc::tensor(std::vector<T>{T(1), T(1), low, T(-2)});
  const std::vector<T> y = sc::scatter_add(x, idx, upd).template to_vector<T>();
  CHECK(y[0] == static_cast<T>(low + 1));   // big + 1 + 1, wrapped
  CHECK(y[1] == static_cast<T>(big));       // 1 + low - 2, wrapped
}

// ---- one_hot ---------------------------------------------------------------------------------

TEST_CASE("one_hot matches the loop reference, out-of-range indices give zero rows", "[layout][one_hot]") {
  const std::vector<std::pair<std::vector<std::int64_t>, sc::Shape>> sets = {
      {{2}, {}}, {{0, 3, 1, 4, -1, 9}, {6}}, {{0, 1, 2, 3, 2, 1}, {2, 3}}, {{}, {0}}, {{1, 1}, {1, 2, 1}}};
  for (const auto& [iv, is] : sets)
    for (std::int64_t depth : {0, 1, 4})
      for (sc::DType d : lt::all_dtypes)
        for (sc::DType id : {sc::i32, sc::i64}) {
          auto y = sc::one_hot(indices(iv, is, id), depth, d);
          sc::Shape os = is;
          os.push_back(depth);
          INFO("indices " << is << " depth " << depth << " dtype " << d);
          CHECK(y.shape() == os);
          CHECK(y.dtype() == d);
          std::vector<double> want;
          for (std::int64_t v : iv)
            for (std::int64_t j = 0; j < depth; ++j) want.push_back(v == j ? 1.0 : 0.0);
          CHECK(values(y) == want);
        }
  CHECK(sc::one_hot(sc::tensor({1, 0}), 2).dtype() == sc::f32);
  std::vector<std::int64_t> big;
  for (int i = 0; i < 100000; ++i) big.push_back(i % 13 - 1);  // -1 and 10, 11 fall outside depth 10
  auto y = sc::one_hot(sc::tensor(big), 10, sc::i32);
  const auto yv = y.to_vector<int>();
  bool ok = true;
  for (std::size_t n = 0; n < big.size(); ++n)
    for (int j = 0; j < 10; ++j) ok = ok && yv[n * 10 + j] == (big[n] == j ? 1 : 0);
  CHECK(ok);
}

TEST_CASE("one_hot errors", "[layout][one_hot][errors]") {
  expect_error<sc::ValueError>([&] { (void)sc::one_hot(sc::tensor({1}), -1); }, {"[one_hot]", "depth must be non-negative, got -1"});
  expect_error<sc::DTypeError>([&] { (void)sc::one_hot(sc::tensor({1.0}), 3); }, {"[one_hot]", "expects i32 or i64 indices, got f64"});
  expect_error<sc::ShapeError>([&] { (void)sc::one_hot(sc::zeros({1, 1, 1, 1, 1, 1, 1, 1}, sc::i32), 3); }, {"[one_hot]", "maximum rank 8"});
}
