// take_along_axis and add_along_axis (ops/along_axis.hpp) against plain loops written here: every
// dtype, every axis of rank 1-3, i32 and negative indices, repeats (accumulating in index order),
// columns wider than the CPU's 256-column blocks, the threads; gradients by central differences,
// traced equal to eager; errors naming the op, the shapes and the user's line.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "testing.hpp"

using sctest::error_of;

namespace {

struct Split {
  std::int64_t outer = 1, n = 1, inner = 1;
};
Split split(const sc::Shape& s, int axis) {
  Split r;
  for (int d = 0; d < axis; ++d) r.outer *= s[d];
  r.n = s[axis];
  for (int d = axis + 1; d < s.rank(); ++d) r.inner *= s[d];
  return r;
}

/// Indices in [-n, n) (negative ones count from the end), long runs of one value when `runs`.
std::vector<std::int64_t> random_indices(std::int64_t count, std::int64_t n, unsigned seed, bool runs) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int64_t> pick(-n, n - 1);
  std::vector<std::int64_t> v(static_cast<std::size_t>(count));
  std::int64_t cur = pick(gen);
  for (auto& e : v) {
    if (!runs || gen() % 8 == 0) cur = pick(gen);
    e = cur;
  }
  return v;
}

/// y[o, m, i] = x[o, idx[o, m, i], i] by three loops.
std::vector<double> take_ref(const std::vector<double>& x, const sc::Shape& xs, const std::vector<std::int64_t>& idx,
                             std::int64_t m, int axis) {
  const Split s = split(xs, axis);
  std::vector<double> y(static_cast<std::size_t>(s.outer * m * s.inner));
  for (std::int64_t o = 0; o < s.outer; ++o)
    for (std::int64_t k = 0; k < m; ++k)
      for (std::int64_t i = 0; i < s.inner; ++i) {
        const std::size_t e = static_cast<std::size_t>((o * m + k) * s.inner + i);
        const std::int64_t j = idx[e] < 0 ? idx[e] + s.n : idx[e];
        y[e] = x[static_cast<std::size_t>((o * s.n + j) * s.inner + i)];
      }
  return y;
}

/// x with u[o, m, i] added at x[o, idx[o, m, i], i], in the order of m.
std::vector<double> add_ref(std::vector<double> x, const sc::Shape& xs, const std::vector<std::int64_t>& idx,
                            const std::vector<double>& u, std::int64_t m, int axis) {
  const Split s = split(xs, axis);
  for (std::int64_t o = 0; o < s.outer; ++o)
    for (std::int64_t k = 0; k < m; ++k)
      for (std::int64_t i = 0; i < s.inner; ++i) {
        const std::size_t e = static_cast<std::size_t>((o * m + k) * s.inner + i);
        const std::int64_t j = idx[e] < 0 ? idx[e] + s.n : idx[e];
        x[static_cast<std::size_t>((o * s.n + j) * s.inner + i)] += u[e];
      }
  return x;
}

sc::Tensor index_tensor(const std::vector<std::int64_t>& v, const sc::Shape& s, sc::DType d) {
  return sc::tensor(v, s).astype(d);
}

}  // namespace

TEST_CASE("take_along_axis and add_along_axis equal plain loops: dtypes, axes, i32 and negative indices",
          "[along_axis]") {
  const std::vector<sc::Shape> shapes = {{7}, {5, 6}, {3, 4, 5}, {2, 3, 300}, {600, 3}, {1, 2000}};
  unsigned seed = 1;
  for (const sc::Shape& xs : shapes)
    for (int axis = 0; axis < xs.rank(); ++axis)
      for (const std::int64_t m : {std::int64_t{1}, xs[axis], xs[axis] + 3})
        for (const bool runs : {false, true})
          for (sc::DType d : {sc::f32, sc::f64, sc::i32, sc::i64})
            for (sc::DType id : {sc::i32, sc::i64}) {
              sc::Shape is = xs;
              is[axis] = m;
              INFO("x " << sctest::str(xs) << " axis " << axis << " indices " << sctest::str(is) << " dtype "
                        << sc::name(d) << " index " << sc::name(id) << (runs ? " runs" : ""));
              const std::vector<double> xv = sctest::small_values<double>(xs.numel(), ++seed, 9, 1);
              const std::vector<double> uv = sctest::small_values<double>(is.numel(), ++seed, 9, 1);
              const std::vector<std::int64_t> iv = random_indices(is.numel(), xs[axis], ++seed, runs);
              const sc::Tensor x = sc::tensor(xv, xs).astype(d), u = sc::tensor(uv, is).astype(d);
              const sc::Tensor idx = index_tensor(iv, is, id);
              const sc::Tensor taken = sc::take_along_axis(x, idx, axis);
              CHECK(taken.shape() == is);
              CHECK(taken.dtype() == d);
              CHECK(taken.astype(sc::f64).to_vector<double>() == take_ref(xv, xs, iv, m, axis));
              const sc::Tensor added = sc::add_along_axis(x, idx, u, axis - xs.rank());  // a negative axis
              CHECK(added.shape() == xs);
              CHECK(added.astype(sc::f64).to_vector<double>() == add_ref(xv, xs, iv, uv, m, axis));
            }
}

TEST_CASE("take_along_axis and add_along_axis: lines of in-range indices (the checked paths), some blocks not",
          "[along_axis]") {
  // Long contiguous lines take a path of their own when a block of 256 indices is all in [0, n):
  // read through directly (gathers with AVX-512), added a run at a time where neighbours mostly
  // repeat, in a plain loop otherwise. Kinds: all in range; sorted (runs of about one, the plain
  // loop); long runs (the run loop); in range but for a negative index in every third block (the
  // offsets path beside the direct one, a run of one block crossing into the next).
  const std::int64_t n = 1000;
  unsigned seed = 100;
  for (const std::int64_t m : {std::int64_t{1000}, std::int64_t{1003}, std::int64_t{517}, std::int64_t{13}})
    for (const int kind : {0, 1, 2, 3})
      for (sc::DType id : {sc::i32, sc::i64}) {
        const sc::Shape xs{3, n}, is{3, m};
        std::vector<std::int64_t> iv = random_indices(is.numel(), n, ++seed, kind == 2);
        for (auto& e : iv) e = e < 0 ? e + n : e;
        if (kind == 1)
          for (std::int64_t r = 0; r < 3; ++r) std::sort(iv.begin() + r * m, iv.begin() + (r + 1) * m);
        if (kind == 3)
          for (std::size_t e = 0; e < iv.size(); e += 3 * 256 + 17) iv[e] -= n;
        const sc::Tensor idx = index_tensor(iv, is, id);
        for (sc::DType d : {sc::f32, sc::f64, sc::i32, sc::i64}) {
          INFO("indices " << sctest::str(is) << " kind " << kind << " dtype " << sc::name(d) << " index "
                          << sc::name(id));
          const std::vector<double> xv = sctest::small_values<double>(xs.numel(), ++seed, 9, 1);
          const std::vector<double> uv = sctest::small_values<double>(is.numel(), ++seed, 9, 1);
          const sc::Tensor x = sc::tensor(xv, xs).astype(d), u = sc::tensor(uv, is).astype(d);
          sctest::at_threads({1, 2}, [&](int) {
            CHECK(sc::take_along_axis(x, idx, 1).astype(sc::f64).to_vector<double>() == take_ref(xv, xs, iv, m, 1));
            CHECK(sc::add_along_axis(x, idx, u, 1).astype(sc::f64).to_vector<double>() ==
                  add_ref(xv, xs, iv, uv, m, 1));
          });
        }
        // bool moves single bytes (no gathers)
        const sc::Tensor b = sc::tensor(sctest::small_values<double>(xs.numel(), ++seed, 1, 0), xs) > 0.0;
        const std::vector<double> bv = b.astype(sc::f64).to_vector<double>();
        CHECK(sc::take_along_axis(b, idx, 1).astype(sc::f64).to_vector<double>() == take_ref(bv, xs, iv, m, 1));
      }
  // An index past the end in a later block (the direct path's check), and a second one after it:
  // the first is raised, by both ops and at both thread counts.
  std::vector<std::int64_t> iv(3 * 1000);
  for (std::size_t e = 0; e < iv.size(); ++e) iv[e] = static_cast<std::int64_t>(e * 7 % 1000);
  iv[1700] = 1000;
  iv[2900] = -1001;
  for (sc::DType id : {sc::i32, sc::i64}) {
    const sc::Tensor idx = index_tensor(iv, {3, 1000}, id), x = sc::ones({3, 1000});
    sctest::at_threads({1, 2}, [&](int) {
      CHECK_THAT(error_of<sc::ValueError>([&] { (void)sc::take_along_axis(x, idx, 1); }),
                 Catch::Contains("[take_along_axis] index 1000 is out of range for axis 1 of extent 1000"));
      CHECK_THAT(error_of<sc::ValueError>([&] { (void)sc::add_along_axis(x, idx, x, 1); }),
                 Catch::Contains("[add_along_axis] index 1000 is out of range for axis 1 of extent 1000"));
    });
  }
}

TEST_CASE("indices_within: in 0 to e or not, at the ends of the range and of the types", "[along_axis]") {
  using sc::backend::cpu::indices_within;
  const std::int64_t big = std::numeric_limits<std::int64_t>::max(), low = std::numeric_limits<std::int64_t>::min();
  const auto within = [](std::vector<std::int64_t> v, std::int64_t e) {
    std::vector<std::int32_t> v32;
    for (std::int64_t g : v)
      if (g >= std::numeric_limits<std::int32_t>::min() && g <= std::numeric_limits<std::int32_t>::max())
        v32.push_back(static_cast<std::int32_t>(g));
    const bool w = indices_within(v.data(), static_cast<std::int64_t>(v.size()), e);
    // the i32 copy (those that fit) agrees with a plain check of the same values
    bool want32 = true;
    for (std::int32_t g : v32) want32 = want32 && g >= 0 && g < e;
    CHECK(indices_within(v32.data(), static_cast<std::int64_t>(v32.size()), e) == want32);
    return w;
  };
  CHECK(within({}, 0));
  CHECK(within({}, 5));
  CHECK(within({0}, 1));
  CHECK_FALSE(within({1}, 1));
  CHECK_FALSE(within({0}, 0));
  CHECK_FALSE(within({-1}, 5));
  CHECK(within({0, 4, 3, 2}, 5));
  CHECK_FALSE(within({0, 4, 5, 2}, 5));
  CHECK(within({big - 1, 0}, big));
  CHECK_FALSE(within({big}, big));
  CHECK_FALSE(within({low}, big));
  CHECK_FALSE(within({low}, 1));
  CHECK_FALSE(within({big}, 1));
  CHECK_FALSE(within({-big}, big));
  // i32 indices against an axis longer than any i32 (every one that is not negative is within)
  CHECK(within({0, std::numeric_limits<std::int32_t>::max(), 5}, big));
  CHECK(within({std::numeric_limits<std::int32_t>::max()}, std::int64_t{1} << 31));
  CHECK_FALSE(within({std::numeric_limits<std::int32_t>::max()}, std::numeric_limits<std::int32_t>::max()));
  CHECK_FALSE(within({std::numeric_limits<std::int32_t>::min(), 0}, big));
  std::vector<std::int64_t> many(1000, 7);
  CHECK(within(many, 8));
  many[999] = 8;
  CHECK_FALSE(within(many, 8));
  many[999] = -8;
  CHECK_FALSE(within(many, 8));
}

TEST_CASE("gather and scatter_add of single elements (inner extent 1): the checked paths", "[along_axis][gather]") {
  // gather and scatter_add share the along-axis kernels' block check and their add_line_block
  // where they move single elements: one index list for every line of x [outer, n] along axis 1.
  const std::int64_t n = 1000;
  unsigned seed = 300;
  for (const std::int64_t outer : {std::int64_t{1}, std::int64_t{3}})
    for (const std::int64_t m : {std::int64_t{1000}, std::int64_t{1003}, std::int64_t{13}})
      for (const int kind : {0, 1, 2, 3})
        for (sc::DType id : {sc::i32, sc::i64}) {
          std::vector<std::int64_t> iv = random_indices(m, n, ++seed, kind == 2);
          for (auto& e : iv) e = e < 0 ? e + n : e;
          if (kind == 1) std::sort(iv.begin(), iv.end());
          if (kind == 3)
            for (std::size_t e = 0; e < iv.size(); e += 2 * 256 + 5) iv[e] -= n;
          const sc::Tensor idx = index_tensor(iv, {m}, id);
          for (sc::DType d : {sc::f32, sc::f64, sc::i32, sc::i64}) {
            INFO("outer " << outer << " indices " << m << " kind " << kind << " dtype " << sc::name(d) << " index "
                          << sc::name(id));
            const std::vector<double> xv = sctest::small_values<double>(outer * n, ++seed, 9, 1);
            const std::vector<double> uv = sctest::small_values<double>(outer * m, ++seed, 9, 1);
            std::vector<double> want_take, want_add = xv;
            for (std::int64_t o = 0; o < outer; ++o)
              for (std::int64_t k = 0; k < m; ++k) {
                const std::int64_t j = iv[static_cast<std::size_t>(k)] < 0 ? iv[static_cast<std::size_t>(k)] + n
                                                                            : iv[static_cast<std::size_t>(k)];
                want_take.push_back(xv[static_cast<std::size_t>(o * n + j)]);
                want_add[static_cast<std::size_t>(o * n + j)] += uv[static_cast<std::size_t>(o * m + k)];
              }
            const sc::Tensor x = sc::tensor(xv, {outer, n}).astype(d), u = sc::tensor(uv, {outer, m}).astype(d);
            sctest::at_threads({1, 2}, [&](int) {
              CHECK(sc::gather(x, idx, 1).astype(sc::f64).to_vector<double>() == want_take);
              CHECK(sc::scatter_add(x, idx, u, 1).astype(sc::f64).to_vector<double>() == want_add);
            });
          }
        }
  std::vector<std::int64_t> iv(2000);
  for (std::size_t e = 0; e < iv.size(); ++e) iv[e] = static_cast<std::int64_t>(e * 7 % 1000);
  iv[900] = 1000;
  CHECK_THAT(error_of<sc::ValueError>([&] { (void)sc::gather(sc::ones({2, 1000}), sc::tensor(iv), 1); }),
             Catch::Contains("[gather] index 1000 is out of range for axis 1 of extent 1000"));
}

TEST_CASE("a line's indices checked as they add: negative and bad ones inside runs and at block edges",
          "[along_axis][gather]") {
  // add_along_axis and scatter_add along a line add through an index directly while it is in
  // [0, n), and from the first that is not (negative, or bad) through offsets for the rest of its
  // block of 256; inside a run of equal indices, summed in a register, as in a plain loop. The
  // reference adds in index order in T, so a changed order shows in the f32 bits.
  const std::int64_t n = 300, m = 1100;
  std::vector<std::int64_t> runs(m), plain(m);
  for (std::int64_t k = 0; k < m; ++k) {
    runs[static_cast<std::size_t>(k)] = (k / 40 * 37) % n;  // runs of 40
    plain[static_cast<std::size_t>(k)] = (k * 131 + 7) % n;
  }
  // the same place counted from the end: in the middle of runs, first and last of a block, at a
  // run's start, and in the last partial block
  for (std::int64_t k : {std::int64_t{5}, std::int64_t{256}, std::int64_t{511}, std::int64_t{520},
                         std::int64_t{800}, std::int64_t{801}, std::int64_t{1099}}) {
    runs[static_cast<std::size_t>(k)] -= n;
    plain[static_cast<std::size_t>(k)] -= n;
  }
  std::vector<float> uv(m);
  for (std::int64_t k = 0; k < m; ++k) uv[static_cast<std::size_t>(k)] = k % 3 == 0 ? 1e8f : (k % 3 == 1 ? 0.1f : -1e8f);
  for (const auto* iv : {&runs, &plain})
    for (sc::DType id : {sc::i32, sc::i64}) {
      std::vector<float> want(n, 0.5f);
      for (std::int64_t k = 0; k < m; ++k) {
        const std::int64_t g = (*iv)[static_cast<std::size_t>(k)];
        float& y = want[static_cast<std::size_t>(g < 0 ? g + n : g)];
        y = y + uv[static_cast<std::size_t>(k)];
      }
      const sc::Tensor x = sc::full({1, n}, 0.5f), u = sc::tensor(uv, {1, m});
      INFO((iv == &runs ? "runs" : "plain") << " index " << sc::name(id));
      CHECK(sc::add_along_axis(x, index_tensor(*iv, {1, m}, id), u, 1).to_vector<float>() == want);
      CHECK(sc::scatter_add(x, index_tensor(*iv, {m}, id), u, 1).to_vector<float>() == want);
      // a bad index inside a run, after a negative one in the same block: the first bad one named
      std::vector<std::int64_t> bad = *iv;
      bad[530] = n;
      bad[700] = -n - 1;
      CHECK_THAT(error_of<sc::ValueError>([&] { (void)sc::add_along_axis(x, index_tensor(bad, {1, m}, id), u, 1); }),
                 Catch::Contains("[add_along_axis] index 300 is out of range for axis 1 of extent 300"));
      CHECK_THAT(error_of<sc::ValueError>([&] { (void)sc::scatter_add(x, index_tensor(bad, {m}, id), u, 1); }),
                 Catch::Contains("[scatter_add] index 300 is out of range for axis 1 of extent 300"));
    }
}

TEST_CASE("add_along_axis sums repeats in index order, and bool take_along_axis moves bytes", "[along_axis]") {
  // 0.1 + 1e8 - 1e8 depends on the order: index order gives 0 exactly for the f32 column
  const sc::Tensor x = sc::zeros({2, 3});
  const sc::Tensor idx = sc::tensor({{1, 1, 1}, {0, 2, 0}}).astype(sc::i64);
  const sc::Tensor u = sc::tensor({{1e8f, 0.1f, -1e8f}, {1.f, 2.f, 3.f}});
  CHECK(sc::add_along_axis(x, idx, u, 1).to_vector<float>() == std::vector<float>{0, (1e8f + 0.1f) - 1e8f, 0, 4, 0, 2});
  const sc::Tensor b = sc::tensor({{true, false}, {false, true}});
  CHECK(sc::take_along_axis(b, sc::tensor({{1, 1, 0}, {1, 0, 0}}), 1).astype(sc::i32).to_vector<std::int32_t>() ==
        std::vector<std::int32_t>{0, 0, 1, 1, 0, 0});
  // empty pieces
  CHECK(sc::add_along_axis(x, sc::zeros({2, 0}, sc::i64), sc::zeros({2, 0}), 1).to_vector<float>() ==
        std::vector<float>(6, 0.f));
  CHECK(sc::take_along_axis(sc::zeros({0, 3}), sc::zeros({0, 2}, sc::i32), 1).shape() == sc::Shape{0, 2});
}

TEST_CASE("take_along_axis and add_along_axis: gradients by central differences, traced equal to eager",
          "[along_axis][grad]") {
  const sc::Tensor x = sc::random::normal({4, 5}, 31).astype(sc::f64);
  const sc::Tensor u = sc::random::normal({4, 3}, 32).astype(sc::f64);
  const sc::Tensor w = sc::random::normal({4, 5}, 33).astype(sc::f64);
  const sc::Tensor idx = sc::tensor({{0, 4, 0}, {2, 2, 2}, {-1, 1, 3}, {1, 0, -5}}).astype(sc::i64);
  const auto f = [&](const std::vector<sc::Tensor>& in) {
    return sc::add_along_axis(in[0] * in[0], idx, sc::tanh(in[1]), 1) * w + sc::sum(sc::take_along_axis(in[0], idx, 1));
  };
  const auto r = sc::check_gradients(f, {x, u});
  INFO(r.report);
  CHECK(r.ok);
  auto traced = sc::function([&](const sc::Tensor& a, const sc::Tensor& b) { return f({a, b}); });
  CHECK(traced(x, u).to_vector<double>() == f({x, u}).to_vector<double>());
  // along axis 0, f32
  const sc::Tensor x0 = sc::random::normal({3, 4}, 34);
  const sc::Tensor i0 = sc::tensor({{2, 0, 0, 1}, {2, 2, 1, 0}});
  const auto r0 = sc::check_gradients(
      [&](const std::vector<sc::Tensor>& in) { return sc::exp(sc::take_along_axis(in[0], i0, 0) * 0.5f); },
      {x0.astype(sc::f64)});
  INFO(r0.report);
  CHECK(r0.ok);
}

TEST_CASE("add_along_axis: errors name the op, the shapes and the user's line", "[along_axis][errors]") {
  const sc::Tensor x = sc::zeros({2, 3});
  const sc::Tensor idx = sc::tensor({{0, 2}, {1, 1}}).astype(sc::i64);
  int line = __LINE__ + 1;
  std::string msg = error_of<sc::ValueError>([&] { (void)sc::add_along_axis(x, sc::tensor({{0, 3}, {1, 1}}), sc::ones({2, 2}), 1); });
  CHECK_THAT(msg, Catch::Contains("[add_along_axis]") && Catch::Contains("index 3") &&
                      Catch::Contains("test_along_axis.cpp:" + std::to_string(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ShapeError>([&] { (void)sc::add_along_axis(x, idx, sc::ones({2, 3}), 1); });
  CHECK_THAT(msg, Catch::Contains("[add_along_axis]") && Catch::Contains("[2, 3]") && Catch::Contains("[2, 2]") &&
                      Catch::Contains("test_along_axis.cpp:" + std::to_string(line)));
  msg = error_of<sc::ShapeError>([&] { (void)sc::add_along_axis(x, sc::zeros({3, 2}, sc::i64), sc::ones({3, 2}), 1); });
  CHECK_THAT(msg, Catch::Contains("[add_along_axis]") && Catch::Contains("except along axis 1"));
  msg = error_of<sc::DTypeError>([&] { (void)sc::add_along_axis(x, idx, sc::ones({2, 2}, sc::f64), 1); });
  CHECK_THAT(msg, Catch::Contains("[add_along_axis]") && Catch::Contains("f64") && Catch::Contains("f32"));
  msg = error_of<sc::DTypeError>([&] { (void)sc::add_along_axis(x, sc::ones({2, 2}), sc::ones({2, 2}), 1); });
  CHECK_THAT(msg, Catch::Contains("[add_along_axis]") && Catch::Contains("indices"));
  msg = error_of<sc::DTypeError>([&] {
    (void)sc::add_along_axis(sc::zeros({2, 3}, sc::boolean), idx, sc::zeros({2, 2}, sc::boolean), 1);
  });
  CHECK_THAT(msg, Catch::Contains("[add_along_axis]") && Catch::Contains("bool"));
  msg = error_of<sc::ShapeError>([&] { (void)sc::add_along_axis(x, idx, sc::ones({2, 2}), 2); });
  CHECK_THAT(msg, Catch::Contains("[add_along_axis]") && Catch::Contains("axis 2"));
  // traced: the indices are checked when the plan runs, nothing written out of bounds
  auto add = sc::function([](const sc::Tensor& a, const sc::Tensor& i, const sc::Tensor& v) {
    return sc::add_along_axis(a, i, v, 1);
  });
  CHECK(add(x, idx, sc::ones({2, 2})).to_vector<float>() == std::vector<float>{1, 0, 1, 0, 2, 0});
  msg = error_of<sc::ValueError>([&] { (void)add(x, sc::tensor({{0, -4}, {1, 1}}), sc::ones({2, 2})); });
  CHECK_THAT(msg, Catch::Contains("[add_along_axis]") && Catch::Contains("index -4"));
}
