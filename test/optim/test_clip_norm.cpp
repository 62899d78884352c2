// Gradient clipping by norm (sc::clip_by_norm, sc::global_norm, sc::clip_by_global_norm) against
// plain-loop references in f64, across dtypes and axes; finite-difference gradients; eager and
// traced runs agreeing (a clipped training step included); every error path.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>
#include <stagecraft/optim/sgd.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "testing.hpp"

namespace {

using sctest::check_close;
using sctest::error_of;
using Vec = std::vector<double>;

std::string at_line(int line) { return "test_clip_norm.cpp:" + std::to_string(line); }

/// The reference: v rescaled so its L2 norm is at most c (loops in f64).
Vec clipped_ref(const Vec& v, double c) {
  double ss = 0;
  for (double x : v) ss += x * x;
  const double n = std::sqrt(ss);
  Vec out = v;
  if (n > c)
    for (double& x : out) x = x * c / n;
  return out;
}

Vec values_of(const sc::Tensor& t) { return sc::cast(t, sc::f64).to_vector<double>(); }

}  // namespace

TEST_CASE("clip_by_norm: whole tensors above, below and at zero norm, f32 and f64", "[clip_norm]") {
  for (const sc::DType dt : {sc::f32, sc::f64}) {
    for (const double scale : {0.0, 0.01, 1.0, 30.0}) {
      INFO(sc::name(dt) << " scale " << scale);
      const sc::Tensor t = sc::cast(sctest::uniform_tensor({3, 5}, 7, -1, 1) * scale, dt);
      const double tol = dt == sc::f32 ? 1e-6 : 1e-14;
      for (const double c : {0.5, 2.0, 100.0}) {
        const sc::Tensor r = sc::clip_by_norm(t, c);
        CHECK(r.dtype() == dt);
        CHECK(r.shape() == t.shape());
        check_close(values_of(r), clipped_ref(values_of(t), c), tol);
      }
    }
  }
}

TEST_CASE("clip_by_norm: over axes each slice is clipped on its own", "[clip_norm]") {
  // Rows: one over the bound, one under, one zero. Columns: norms over axis 0.
  const sc::Tensor t = sc::tensor({{3.0, 4.0, 0.0, 12.0}, {0.1, 0.2, 0.0, 0.3}, {0.0, 0.0, 0.0, 0.0}});
  const Vec flat = values_of(t);
  const sc::Tensor rows = sc::clip_by_norm(t, 1.0, {1});
  for (int i = 0; i < 3; ++i) {
    const Vec row(flat.begin() + 4 * i, flat.begin() + 4 * i + 4);
    const Vec got = values_of(sc::slice(rows, {i, 0}, {1, 4}));
    INFO("row " << i);
    check_close(got, clipped_ref(row, 1.0), 1e-14);
  }
  const sc::Tensor cols = sc::clip_by_norm(t, 1.0, {0});
  for (int j = 0; j < 4; ++j) {
    const Vec col{flat[static_cast<std::size_t>(j)], flat[static_cast<std::size_t>(4 + j)], flat[static_cast<std::size_t>(8 + j)]};
    INFO("column " << j);
    check_close(values_of(sc::slice(cols, {0, j}, {3, 1})), clipped_ref(col, 1.0), 1e-14);
  }
  // Negative axes, and a 3-D tensor over its last two axes.
  check_close(values_of(sc::clip_by_norm(t, 1.0, {-1})), values_of(rows), 0);
  const sc::Tensor cube = sctest::uniform_tensor({2, 3, 4}, 11, -2, 2);
  const sc::Tensor per_batch = sc::clip_by_norm(cube, 1.5, {1, 2});
  const Vec c = values_of(cube);
  for (int b = 0; b < 2; ++b) {
    const Vec part(c.begin() + 12 * b, c.begin() + 12 * b + 12);
    check_close(values_of(sc::slice(per_batch, {b, 0, 0}, {1, 3, 4})), clipped_ref(part, 1.5), 1e-14);
  }
}

TEST_CASE("global_norm and clip_by_global_norm against the reference", "[clip_norm]") {
  const sc::Tensor a = sctest::uniform_tensor({4, 3}, 21, -1, 1);
  const sc::Tensor b = sc::cast(sctest::uniform_tensor({5}, 22, -3, 3), sc::f32);
  const sc::Tensor c = sctest::uniform_tensor({}, 23, -2, 2);
  Vec all = values_of(a);
  for (double x : values_of(b)) all.push_back(x);
  for (double x : values_of(c)) all.push_back(x);
  double ss = 0;
  for (double x : all) ss += x * x;
  const double norm = std::sqrt(ss);
  // b's squares are summed in f32: the norm is within f32 rounding of the f64 reference.
  const sc::Tensor g = sc::global_norm({a, b, sc::Tensor(), c});  // an undefined entry is skipped
  CHECK(g.dtype() == sc::f64);  // f32 and f64 mixed
  CHECK(g.rank() == 0);
  CHECK(g.item<double>() == Approx(norm).epsilon(1e-6));
  double ss_f64 = 0;  // a and c alone: all f64
  for (const sc::Tensor& t : {a, c})
    for (double x : values_of(t)) ss_f64 += x * x;
  CHECK(sc::global_norm({a, c}).item<double>() == Approx(std::sqrt(ss_f64)).epsilon(1e-14));
  CHECK(sc::global_norm({b}).dtype() == sc::f32);

  for (const double clip : {norm / 3, norm * 2}) {
    INFO("clip " << clip << " norm " << norm);
    auto [clipped, n] = sc::clip_by_global_norm({a, b, sc::Tensor(), c}, clip);
    REQUIRE(clipped.size() == 4);
    CHECK(!clipped[2].defined());
    CHECK(n.item<double>() == Approx(norm).epsilon(1e-6));
    const double s = clip / std::max(norm, clip);
    const std::vector<sc::Tensor> ins{a, b, c};
    const std::vector<sc::Tensor> outs{clipped[0], clipped[1], clipped[3]};
    for (std::size_t k = 0; k < ins.size(); ++k) {
      INFO("tensor " << k);
      CHECK(outs[k].dtype() == ins[k].dtype());
      Vec want = values_of(ins[k]);
      for (double& x : want) x *= s;
      check_close(values_of(outs[k]), want, 1e-6);
    }
    if (clip > norm) {  // within the bound: unchanged, bit for bit
      CHECK(clipped[0].to_vector<double>() == a.to_vector<double>());
      CHECK(clipped[1].to_vector<float>() == b.to_vector<float>());
    } else {
      CHECK(sc::global_norm(clipped).item<double>() == Approx(clip).epsilon(1e-6));
    }
  }
  // All zero: unchanged, norm 0.
  auto [zeros, zn] = sc::clip_by_global_norm({sc::zeros({3})}, 1.0);
  CHECK(zn.item<float>() == 0.f);
  CHECK(zeros[0].to_vector<float>() == std::vector<float>{0.f, 0.f, 0.f});
}

TEST_CASE("clip_by_global_norm: an inf or NaN norm makes every result NaN", "[clip_norm]") {
  for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    INFO("bad " << bad);
    auto [out, n] = sc::clip_by_global_norm({sc::tensor({1.f, bad}), sc::tensor({2.0, 3.0})}, 1.0);
    CHECK(!std::isfinite(n.item<double>()));
    for (const sc::Tensor& t : out)
      for (double x : values_of(t)) CHECK(std::isnan(x));
  }
}

TEST_CASE("clip_by_norm and clip_by_global_norm: gradients match finite differences", "[clip_norm][grad]") {
  using sctest::Row;
  const sc::Tensor big = sctest::uniform_tensor({2, 3}, 31, -2, 2, 0.2);  // norms well above 1
  const sc::Tensor small = sctest::uniform_tensor({2, 3}, 32, -0.1, 0.1, 0.01);
  sctest::check_rows({
      {"clip_by_norm, clipped", [](const auto& x) { return sc::clip_by_norm(x[0], 1.0); }, {big}},
      {"clip_by_norm, within", [](const auto& x) { return sc::clip_by_norm(x[0], 1.0); }, {small}},
      {"clip_by_norm, rows", [](const auto& x) { return sc::clip_by_norm(x[0], 1.0, {1}); }, {big}},
      {"global_norm", [](const auto& x) { return sc::global_norm({x[0], x[1]}); }, {big, small}},
      {"clip_by_global_norm, first",
       [](const auto& x) { return sc::clip_by_global_norm({x[0], x[1]}, 1.0).first[0]; }, {big, small}},
      {"clip_by_global_norm, second",
       [](const auto& x) { return sc::clip_by_global_norm({x[0], x[1]}, 1.0).first[1]; }, {big, small}},
      {"clip_by_global_norm, the norm",
       [](const auto& x) { return sc::clip_by_global_norm({x[0], x[1]}, 1.0).second; }, {big, small}},
  });
  // At zero the gradient is finite: the identity (the norm is within any bound).
  const sc::Tensor z = sc::zeros({4}, sc::f64);
  sc::GradientTape tape;
  tape.watch(z);
  const sc::Tensor g = tape.gradient(sc::clip_by_norm(z, 1.0), z);
  CHECK(g.to_vector<double>() == Vec{1, 1, 1, 1});
}

TEST_CASE("clip_by_global_norm: traced equals eager, and a clipped training step agrees", "[clip_norm][staged]") {
  const sc::Tensor a = sctest::uniform_tensor({4, 3}, 41, -3, 3);
  const sc::Tensor b = sctest::uniform_tensor({3}, 42, -3, 3);
  auto eager = [](sc::Tensor x, sc::Tensor y) {
    auto [c, n] = sc::clip_by_global_norm({x, y}, 2.0);
    return std::vector<sc::Tensor>{c[0], c[1], n, sc::clip_by_norm(x, 1.0, {0})};
  };
  auto traced = sc::function(eager);
  const auto want = eager(a, b), got = traced(a, b);
  for (std::size_t k = 0; k < want.size(); ++k) {
    INFO("result " << k);
    check_close(values_of(got[k]), values_of(want[k]), 1e-14);
  }
  // Least squares on w with the gradient clipped to norm 0.1 each step.
  const sc::Tensor x = sctest::uniform_tensor({8, 3}, 43, -1, 1), y = sctest::uniform_tensor({8, 1}, 44, -1, 1);
  auto run = [&](bool staged) {
    sc::Variable w(sc::zeros({3, 1}, sc::f64), "w");
    sc::optim::SGD opt(0.5);
    auto step = [&](sc::Tensor xs, sc::Tensor ys) {
      sc::GradientTape tape;
      const sc::Tensor d = sc::matmul(xs, w) - ys;
      const sc::Tensor loss = sc::mean(d * d);
      auto [g, n] = sc::clip_by_global_norm(tape.gradient(loss, std::vector<sc::Variable>{w}), 0.1);
      opt.apply(g, std::vector<sc::Variable>{w});
      return n;
    };
    auto f = sc::function(step);
    Vec norms;
    for (int i = 0; i < 5; ++i) norms.push_back((staged ? f(x, y) : step(x, y)).item<double>());
    norms.push_back(0);
    for (double v : w.value().to_vector<double>()) norms.push_back(v);
    return norms;
  };
  const Vec e = run(false), s = run(true);
  check_close(s, e, 1e-12);
  // Each step moved w by at most lr * 0.1.
  double moved = 0;
  for (std::size_t k = e.size() - 3; k < e.size(); ++k) moved += e[k] * e[k];
  CHECK(std::sqrt(moved) <= 5 * 0.5 * 0.1 + 1e-12);
}

TEST_CASE("clip_by_norm family: bad input is reported at the user's line", "[clip_norm][errors]") {
  const sc::Tensor t = sc::ones({3});
  int line = __LINE__ + 1;
  std::string m = error_of<sc::DTypeError>([&] { sc::clip_by_norm(sc::ones({3}, sc::i32), 1.0); });
  CHECK_THAT(m, Catch::Contains("[clip_by_norm] expects floating tensors, got i32") && Catch::Contains(at_line(line)));
  for (const double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    INFO("clip_norm " << bad);
    line = __LINE__ + 1;
    m = error_of<sc::ValueError>([&] { sc::clip_by_norm(t, bad); });
    CHECK_THAT(m, Catch::Contains("[clip_by_norm] clip_norm must be finite and > 0") && Catch::Contains(at_line(line)));
    m = error_of<sc::ValueError>([&] { sc::clip_by_global_norm({t}, bad); });
    CHECK_THAT(m, Catch::Contains("[clip_by_global_norm] clip_norm must be finite and > 0"));
  }
  line = __LINE__ + 1;
  m = error_of<sc::ValueError>([&] { sc::global_norm({sc::Tensor(), sc::Tensor()}); });
  CHECK_THAT(m, Catch::Contains("[global_norm] needs at least one defined tensor, got 2 undefined") &&
                    Catch::Contains(at_line(line)));
  m = error_of<sc::ValueError>([&] { sc::global_norm({}); });
  CHECK_THAT(m, Catch::Contains("[global_norm] needs at least one defined tensor"));
  m = error_of<sc::DTypeError>([&] { sc::clip_by_global_norm({t, sc::ones({2}, sc::i64)}, 1.0); });
  CHECK_THAT(m, Catch::Contains("[global_norm] expects floating tensors, got i64"));
  m = error_of<sc::ValueError>([&] { sc::clip_by_norm(sc::Tensor(), 1.0); });
  CHECK_THAT(m, Catch::Contains("[clip_by_norm]"));
  m = error_of<sc::ShapeError>([&] { sc::clip_by_norm(t, 1.0, {3}); });
  CHECK_THAT(m, Catch::Contains("axis"));
}
