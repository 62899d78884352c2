// Gradients of the layout ops (reshape, transpose, broadcast_to, concat, slice, gather,
// scatter_add) against central differences, first and second order; scatter_add's own checks.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "testing.hpp"

namespace {

using sc::Shape;
using sc::Tensor;
using Ints = std::vector<std::int64_t>;
using sctest::check_rows;
using sctest::Fn;
using sctest::Row;
using sctest::second;

// An f64 tensor of values in [-2, 2).
Tensor vals(Shape s, std::uint64_t seed) { return sctest::uniform_tensor(s, seed, -2, 2); }

// An index tensor of the given dtype and shape holding `v`.
Tensor idx(std::vector<std::int64_t> v, Shape s, sc::DType d = sc::i64) {
  return sc::tensor(v, s).astype(d);
}

std::string at_line(int line) { return "test_grad_layout.cpp:" + std::to_string(line); }

// The op's result made nonlinear in its input, so a gradient routed to the wrong element
// cannot pass by symmetry: tanh(y) * y.
Tensor bend(const Tensor& y) { return sc::tanh(y) * y; }

std::vector<double> v(const Tensor& t) { return t.to_vector<double>(); }

}  // namespace

TEST_CASE("reshape and its views: gradients match central differences", "[autodiff][grad][layout]") {
  struct Case {
    Shape from, to;
  };
  const std::vector<Case> cases = {{{2, 3}, {3, 2}},         {{2, 3, 4}, {4, -1}},  {{}, {1, 1}},
                                   {{1}, {}},                {{2, 1, 3}, {6}},      {{2, 1, 2, 3}, {3, 1, 4}},
                                   {{0, 3}, {3, 0}},         {{4}, {2, 1, 2, 1}}};
  std::vector<Row> rows;
  std::uint64_t seed = 1;
  for (const Case& c : cases) {
    const Shape to = c.to;
    rows.push_back({"reshape", [to](auto& x) { return bend(sc::reshape(x[0], to)); }, {vals(c.from, ++seed)}});
  }
  rows.push_back({"expand_dims -1", [](auto& x) { return bend(sc::expand_dims(x[0], -1)); }, {vals({2, 3}, ++seed)}});
  rows.push_back({"squeeze", [](auto& x) { return bend(sc::squeeze(x[0])); }, {vals({1, 3, 1, 2}, ++seed)}});
  rows.push_back({"flatten 1", [](auto& x) { return bend(sc::flatten(x[0], 1)); }, {vals({2, 3, 2}, ++seed)}});
  // The reshape is a view of x: the gradient still flows to x alone, once.
  rows.push_back({"x + reshape(x)", [](auto& x) { return x[0] + sc::reshape(sc::reshape(x[0], {3, 2}), {2, 3}); },
                  {vals({2, 3}, ++seed)}});
  check_rows(rows);
}

TEST_CASE("transpose: gradients match central differences", "[autodiff][grad][layout]") {
  struct Case {
    Shape s;
    Ints perm;
  };
  const std::vector<Case> cases = {{{}, {}},           {{5}, {}},           {{3, 4}, {}},
                                   {{3, 4}, {0, 1}},   {{2, 3, 4}, {2, 0, 1}}, {{2, 3, 4}, {-1, 0, 1}},
                                   {{2, 3, 4}, {0, 2, 1}}, {{2, 3, 4, 2}, {3, 1, 0, 2}}, {{2, 1, 3, 1}, {3, 2, 1, 0}},
                                   {{0, 3}, {}}};
  std::vector<Row> rows;
  std::uint64_t seed = 100;
  for (const Case& c : cases) {
    const Ints perm = c.perm;
    rows.push_back({"transpose", [perm](auto& x) { return bend(sc::transpose(x[0], perm)); }, {vals(c.s, ++seed)}});
  }
  check_rows(rows);
}

TEST_CASE("broadcast_to: gradients sum over the broadcast axes", "[autodiff][grad][layout]") {
  struct Case {
    Shape from, to;
  };
  const std::vector<Case> cases = {{{3}, {4, 3}},        {{4, 1}, {4, 5}},      {{}, {2, 3}},
                                   {{}, {}},             {{1, 1}, {3, 1, 4}},   {{2, 1, 3}, {2, 4, 3}},
                                   {{2, 3}, {2, 3}},     {{3}, {0, 3}},         {{1}, {0}},
                                   {{1, 3, 1, 2}, {2, 1, 3, 4, 2}}};
  std::vector<Row> rows;
  std::uint64_t seed = 200;
  for (const Case& c : cases) {
    const Shape to = c.to;
    rows.push_back({"broadcast_to", [to](auto& x) { return bend(sc::broadcast_to(x[0], to)); }, {vals(c.from, ++seed)}});
  }
  // Hand-checked: each element's gradient counts its copies.
  const Tensor x = sc::tensor({{1.0}, {2.0}});
  sc::GradientTape t;
  t.watch(x);
  const Tensor g = t.gradient(sc::broadcast_to(x, {3, 2, 4}), x);
  CHECK(g.shape() == Shape{2, 1});
  CHECK(v(g) == std::vector<double>{12, 12});
  check_rows(rows);
}

TEST_CASE("concat: each input gets its own slice of the gradient", "[autodiff][grad][layout]") {
  std::vector<Row> rows;
  std::uint64_t seed = 300;
  auto add = [&](const std::string& name, std::vector<Shape> shapes, std::int64_t axis) {
    std::vector<Tensor> xs;
    for (const Shape& s : shapes) xs.push_back(vals(s, ++seed));
    rows.push_back({name, [axis](auto& x) { return bend(sc::concat(x, axis)); }, xs});
  };
  add("axis 0", {{2, 3}, {4, 3}}, 0);
  add("axis 1", {{2, 3}, {2, 5}}, 1);
  add("axis -1", {{2, 3}, {2, 5}}, -1);
  add("three inputs, one empty", {{2, 3}, {0, 3}, {1, 3}}, 0);
  add("middle axis", {{2, 3, 4}, {2, 1, 4}, {2, 2, 4}}, 1);
  add("rank 1", {{3}, {4}}, 0);
  add("one input", {{2, 3}}, 0);
  add("rank 4, axis -2", {{2, 1, 2, 3}, {2, 1, 1, 3}, {2, 1, 3, 3}}, -2);
  add("size-1 extents", {{1, 1}, {1, 1}, {1, 1}}, 1);
  add("empty result", {{0, 2}, {0, 3}}, 1);
  // The same tensor twice: both slices flow back to it.
  rows.push_back({"x twice", [](auto& x) { return bend(sc::concat({x[0], x[1], x[0]}, 0)); },
                  {vals({2, 2}, ++seed), vals({1, 2}, ++seed)}});
  // Mixed dtypes: the f32 input is promoted (a recorded cast); differences see f32 rounding.
  rows.push_back({"three inputs, one promoted from f32",
                  [](auto& x) { return bend(sc::concat({x[0], sc::cast(x[1], sc::f32), x[2]}, 1)); },
                  {vals({2, 2}, ++seed), vals({2, 3}, ++seed), vals({2, 1}, ++seed)},
                  {.eps = 1e-2, .atol = 2e-3, .rtol = 1e-3}});
  check_rows(rows);

  // The promoted input's gradient comes back in its own dtype.
  const Tensor a = sc::tensor({1.f, 2.f}), b = sc::tensor({{3.0, 4.0}});
  sc::GradientTape t;
  t.watch({a, b});
  const Tensor y = sc::concat({sc::reshape(a, {1, 2}), b}, 0) * sc::tensor({{1.0, 2.0}, {3.0, 4.0}});
  const std::vector<Tensor> gs = t.gradient(y, {a, b});
  CHECK(gs[0].dtype() == sc::f32);
  CHECK(v(gs[0]) == std::vector<double>{1, 2});
  CHECK(gs[1].dtype() == sc::f64);
  CHECK(v(gs[1]) == std::vector<double>{3, 4});
}

TEST_CASE("slice: the gradient is padded back with zeros", "[autodiff][grad][layout]") {
  struct Case {
    Shape s;
    Ints begin, size;
    std::string note;
  };
  const std::vector<Case> cases = {
      {{5, 6}, {1, 2}, {3, -1}, "size -1 to the end"},
      {{5, 6}, {-2, 0}, {2, 6}, "negative begin"},
      {{5, 6}, {-4, -3}, {-1, 2}, "negative begin, size -1"},
      {{5, 6}, {0, 0}, {5, 6}, "everything"},
      {{5, 6}, {2, 3}, {0, 2}, "empty box"},
      {{5, 6}, {4, 5}, {1, 1}, "last element"},
      {{}, {}, {}, "rank 0"},
      {{7}, {2}, {3}, "rank 1, both sides"},
      {{2, 3, 4}, {0, 1, 1}, {-1, 2, 3}, "rank 3"},
      {{2, 3, 4}, {1, -1, -4}, {1, 1, -1}, "rank 3, negative"},
      {{2, 3, 1, 4}, {1, 0, 0, 1}, {1, -1, 1, 2}, "rank 4, size-1 axis"},
      {{0, 3}, {0, 1}, {0, 2}, "empty input"}};
  std::vector<Row> rows;
  std::uint64_t seed = 400;
  for (const Case& c : cases) {
    const Ints b = c.begin, s = c.size;
    rows.push_back({"slice " + c.note, [b, s](auto& x) { return bend(sc::slice(x[0], b, s)); }, {vals(c.s, ++seed)}});
  }
  // Overlapping slices of one tensor: their gradients add up.
  rows.push_back({"overlapping slices",
                  [](auto& x) { return bend(sc::slice(x[0], {0, 1}, {2, 3}) * sc::slice(x[0], {1, 0}, {2, 3})); },
                  {vals({3, 4}, ++seed)}});
  check_rows(rows);

  const Tensor x = sc::tensor({{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}});
  sc::GradientTape t;
  t.watch(x);
  const Tensor g = t.gradient(sc::slice(x, {1, -2}, {1, -1}) * sc::tensor({{10.0, 20.0}}), x);
  CHECK(g.shape() == Shape{2, 3});
  CHECK(v(g) == std::vector<double>{0, 0, 0, 0, 10, 20});
}

TEST_CASE("gather: duplicate indices accumulate, indices get no gradient", "[autodiff][grad][layout]") {
  struct Case {
    Shape xs;
    std::vector<std::int64_t> ix;
    Shape is;
    std::int64_t axis;
    std::string note;
  };
  const std::vector<Case> cases = {
      {{5, 3}, {4, 0, 2, 2}, {4}, 0, "axis 0, repeated index"},
      {{5, 3}, {-1, 1, -1, 4, 0}, {5}, 0, "axis 0, negative indices repeat a positive one"},
      {{5, 3}, {2, 0, 1, 1}, {2, 2}, 1, "2-D indices"},
      {{5, 3}, {-1, -3, 0, 2}, {4}, -1, "negative axis and indices"},
      {{6}, {-2}, {}, 0, "rank-0 index drops the axis"},
      {{2, 3, 4}, {0, 2, 1, -1, -2, 0}, {6}, 1, "middle axis, repeats"},
      {{2, 3, 4}, {1, 1, 0, 1}, {2, 2}, -2, "middle axis, 2-D indices"},
      {{2, 2, 3, 2}, {2, 0, 2}, {3}, 2, "rank 4"},
      {{1, 4}, {0, 0, 0}, {3}, 0, "size-1 axis, all the same"},
      {{5, 3}, {}, {0}, 0, "no indices"},
      {{0, 3}, {2, 0}, {2}, 1, "empty input rows"}};
  std::vector<Row> rows;
  std::uint64_t seed = 500;
  for (const Case& c : cases)
    for (sc::DType d : {sc::i32, sc::i64}) {
      const Tensor ix = idx(c.ix, c.is, d);
      const std::int64_t axis = c.axis;
      rows.push_back({"gather " + c.note + (d == sc::i32 ? " (i32)" : " (i64)"),
                      [ix, axis](auto& x) { return bend(sc::gather(x[0], ix, axis)); }, {vals(c.xs, ++seed)}});
    }
  check_rows(rows);

  // Hand-checked: every pick adds one; the index tensor's gradient slot is empty.
  const Tensor x = sc::tensor({1.f, 2.f, 3.f, 4.f, 5.f});
  sc::GradientTape t;
  t.watch(x);
  const Tensor g = t.gradient(sc::gather(x, idx({1, 1, 3, -1, 1}, {5}), 0), x);
  CHECK(g.dtype() == sc::f32);
  CHECK(v(g) == std::vector<double>{0, 3, 0, 1, 1});
}

TEST_CASE("scatter_add: values, gradients for x and updates", "[autodiff][grad][layout]") {
  // Values against a loop: x[:, j, :] += updates[:, n, :] for j = indices[n].
  const Tensor x = vals({2, 4, 3}, 600), u = vals({2, 5, 3}, 601);
  const std::vector<std::int64_t> ix = {3, -1, 0, 3, 1};
  for (sc::DType d : {sc::i32, sc::i64}) {
    const Tensor y = sc::scatter_add(x, idx(ix, {5}, d), u, 1);
    CHECK(y.shape() == Shape{2, 4, 3});
    std::vector<double> want = v(x);
    const std::vector<double> uv = v(u);
    for (int o = 0; o < 2; ++o)
      for (int n = 0; n < 5; ++n) {
        const std::int64_t j = ix[n] < 0 ? ix[n] + 4 : ix[n];
        for (int i = 0; i < 3; ++i) want[(o * 4 + j) * 3 + i] += uv[(o * 5 + n) * 3 + i];
      }
    const std::vector<double> got = v(y);
    REQUIRE(got.size() == want.size());
    for (std::size_t k = 0; k < got.size(); ++k) CHECK(got[k] == Approx(want[k]).epsilon(1e-14));
  }
  CHECK(v(sc::scatter_add(sc::tensor({1, 2, 3}), idx({2, 2, 0}, {3}), sc::tensor({10, 20, 30}))) ==
        std::vector<double>{31, 2, 33});

  std::vector<Row> rows;
  const Tensor i1 = idx({3, -1, 0, 3, 1}, {5}), i2 = idx({1, 0, 1, 1}, {2, 2});
  rows.push_back({"axis 1, repeats", [i1](auto& a) { return bend(sc::scatter_add(a[0], i1, a[1], 1)); },
                  {vals({2, 4, 3}, 602), vals({2, 5, 3}, 603)}});
  rows.push_back({"axis 0, 2-D indices", [i2](auto& a) { return bend(sc::scatter_add(a[0], i2, a[1])); },
                  {vals({2, 3}, 604), vals({2, 2, 3}, 605)}});
  rows.push_back({"axis -1", [i1](auto& a) { return bend(sc::scatter_add(a[0], i1, a[1], -1)); },
                  {vals({3, 4}, 606), vals({3, 5}, 607)}});
  check_rows(rows);
}

// The message of the sc::Error that f throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const sc::Error& e) {
    return e.what();
  }
  return "";
}
// The call's error names scatter_add, contains `what`, and points at this line.
#define CHECK_SCATTER_ERROR(call, what)                                                            \
  do {                                                                                           \
    const int line_ = __LINE__;                                                                  \
    CHECK_THAT(error_of([&] { (void)(call); }),                                                  \
               Catch::Contains("[scatter_add]") && Catch::Contains(what) && Catch::Contains(at_line(line_))); \
  } while (0)

TEST_CASE("scatter_add: every error names the op, the shapes and the caller's line", "[autodiff][layout][errors]") {
  const Tensor x = sc::zeros({4, 3}), u = sc::ones({2, 3}), i = idx({0, 3}, {2});
  CHECK_THROWS_AS(sc::scatter_add(x, sc::tensor({0.f, 1.f}), u), sc::DTypeError);
  CHECK_SCATTER_ERROR(sc::scatter_add(x, sc::tensor({0.f, 1.f}), u), "expects i32 or i64 indices, got f32");
  CHECK_THROWS_AS(sc::scatter_add(x, i, sc::ones({2, 3}, sc::f64)), sc::DTypeError);
  CHECK_SCATTER_ERROR(sc::scatter_add(x, i, sc::ones({2, 3}, sc::f64)), "updates have dtype f64, x has dtype f32");
  CHECK_SCATTER_ERROR(sc::scatter_add(sc::zeros({4}, sc::boolean), i, sc::zeros({2}, sc::boolean)),
                      "expects a numeric x, got bool");
  CHECK_THROWS_AS(sc::scatter_add(sc::scalar(1.f), i, u), sc::ShapeError);
  CHECK_SCATTER_ERROR(sc::scatter_add(sc::scalar(1.f), i, u), "cannot scatter into a rank-0 tensor (shape [])");
  CHECK_SCATTER_ERROR(sc::scatter_add(x, i, u, 2), "axis 2 is out of range for rank 2");
  CHECK_THROWS_AS(sc::scatter_add(x, i, sc::ones({3, 3})), sc::ShapeError);
  CHECK_SCATTER_ERROR(sc::scatter_add(x, i, sc::ones({3, 3})),
                      "updates of shape [3, 3] do not fit x of shape [4, 3] with indices of shape [2] along axis 0");
  CHECK_SCATTER_ERROR(sc::scatter_add(x, i, sc::ones({2, 3, 1})), "updates of shape [2, 3, 1] do not fit");
  CHECK_SCATTER_ERROR(sc::scatter_add(x, i, u, 1), "updates of shape [2, 3] do not fit x of shape [4, 3]");
  CHECK_SCATTER_ERROR(sc::scatter_add(x, idx({0, 1, 1, 0}, {2, 2}), u), "with indices of shape [2, 2]");
  CHECK_THROWS_AS(sc::scatter_add(x, idx({0, 4}, {2}), u), sc::ValueError);
  CHECK_SCATTER_ERROR(sc::scatter_add(x, idx({0, 4}, {2}), u), "index 4 is out of range for axis 0 of extent 4 (shape [4, 3])");
  CHECK_SCATTER_ERROR(sc::scatter_add(x, idx({0, -5}, {2}, sc::i32), u), "index -5 is out of range for axis 0 of extent 4");
  // Undefined inputs are caught by dispatch, as for every op.
  CHECK_SCATTER_ERROR(sc::scatter_add(x, i, Tensor()), "got an undefined tensor");
}

TEST_CASE("second order through the layout ops", "[autodiff][grad][second][layout]") {
  const Tensor gi = idx({2, 0, 2, -1}, {4});
  const Tensor si = idx({1, 1, 0}, {3});
  check_rows({
      {"reshape", second([](auto& x) { return sc::tanh(sc::reshape(x[0], {3, 2})) * x[1]; }),
       {vals({2, 3}, 1), vals({3, 2}, 2)}},
      // Two routes to the same permutation of [2, 3, 4]: out[a, b, c] = x[b, c, a].
      {"transpose", second([](auto& x) {
         return sc::tanh(sc::transpose(x[0], {2, 0, 1})) * sc::transpose(sc::transpose(x[0], {1, 0, 2}), {2, 1, 0});
       }),
       {vals({2, 3, 4}, 3)}},
      {"broadcast_to", second([](auto& x) { return sc::tanh(sc::broadcast_to(x[0], {2, 3, 2}) * x[1]); }),
       {vals({3, 1}, 4), vals({2, 3, 2}, 5)}},
      {"concat", second([](auto& x) { auto s = sc::sum(sc::tanh(sc::concat({x[0], x[1]}, -1))); return s * s; }),
       {vals({2, 3}, 6), vals({2, 2}, 7)}},
      {"concat of x with itself", second([](auto& x) { return sc::tanh(sc::concat({x[0], x[0] * x[0]}, 0)); }),
       {vals({2, 3}, 8)}},
      {"slice", second([](auto& x) { return sc::tanh(sc::slice(x[0], {1, -3}, {-1, 2})) * sc::slice(x[0], {0, 0}, {2, 2}); }),
       {vals({3, 4}, 9)}},
      {"gather (repeats)", second([gi](auto& x) { return sc::tanh(sc::gather(x[0], gi, 1)) * sc::gather(x[0], gi, 1); }),
       {vals({2, 3}, 10)}},
      {"gather: d/dx of a function of the gathered rows and y",
       second([gi](auto& x) { return sc::tanh(sc::gather(x[0], gi, 0) * x[1]); }), {vals({3, 2}, 11), vals({4, 2}, 12)}},
      {"scatter_add: d/dx", second([si](auto& x) { return sc::tanh(sc::scatter_add(x[0], si, x[1])) * x[0]; }),
       {vals({2, 2}, 13), vals({3, 2}, 14)}},
      {"scatter_add: d/dupdates",
       second([si](auto& x) { auto y = sc::scatter_add(x[1], si, x[0]); return sc::tanh(y) * y; }),
       {vals({3, 2}, 15), vals({2, 2}, 16)}},
  });
}

TEST_CASE("layout gradients: the rules run under a tape that records them (third order)", "[autodiff][grad][layout]") {
  // f(x) = sum(tanh(slice(gather(x)))): d3/dx3 at a point, through nested tapes, against
  // the closed form tanh''' = -2 (1 - t^2)(1 - 3 t^2) on the element picked twice.
  const Tensor x = sc::tensor({0.3, -0.7, 0.5});
  const Tensor ix = idx({2, 0, 2}, {3});
  sc::GradientTape t3;
  t3.watch(x);
  sc::GradientTape t2;
  t2.watch(x);
  sc::GradientTape t1;
  t1.watch(x);
  const Tensor y = sc::sum(sc::tanh(sc::slice(sc::gather(sc::reshape(x, {1, 3}), ix, 1), {0, 1}, {1, 2})));
  const Tensor g1 = t1.gradient(y, x);
  const Tensor g2 = t2.gradient(g1, x);
  const Tensor g3 = t3.gradient(g2, x);
  // Picked: x[0] once, x[2] once (slice keeps indices 0 and 2 of [2, 0, 2]).
  auto d3 = [](double a) {
    const double t = std::tanh(a);
    return -2 * (1 - t * t) * (1 - 3 * t * t);
  };
  const std::vector<double> got = v(g3);
  CHECK(got[0] == Approx(d3(0.3)));
  CHECK(got[1] == 0);
  CHECK(got[2] == Approx(d3(0.5)));
}
