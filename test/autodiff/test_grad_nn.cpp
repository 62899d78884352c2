// Gradients of matmul, im2col/col2im, conv2d, the pools and the nn composites against central differences.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "testing.hpp"

namespace {

using sc::Shape;
using sc::Tensor;
using sctest::check_rows;
using sctest::Fn;
using sctest::Row;
using sctest::str;

// An f64 tensor of values in [lo, hi).
Tensor vals(Shape s, std::uint64_t seed, double lo = -1, double hi = 1) {
  return sctest::uniform_tensor(s, seed, lo, hi);
}

// Pairwise distinct values (a shuffled ramp, `step` apart, centred on 0): no pooling window
// has a tie, or two values within a finite-difference step, so max_pool2d is smooth there.
Tensor distinct(Shape s, std::uint64_t seed, double step = 0.05) {
  sctest::Rng r(seed);
  const std::size_t n = static_cast<std::size_t>(s.numel());
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = (static_cast<double>(i) - static_cast<double>(n) / 2) * step;
  for (std::size_t i = n; i > 1; --i) std::swap(v[i - 1], v[static_cast<std::size_t>(r.uniform() * static_cast<double>(i))]);
  return sc::tensor(v, s);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  REQUIRE(x.size() == y.size());
  double m = 0;
  for (std::size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

// The gradient of sum(f(x)^2) w.r.t. input `which`, from an inner tape: as a function of the
// inputs, checking it against finite differences checks second derivatives.
Fn inner_gradient(Fn f, std::size_t which) {
  return [f = std::move(f), which](const std::vector<Tensor>& xs) {
    sc::GradientTape tape;
    tape.watch(xs);
    const Tensor y = sc::sum(sc::square(f(xs)));
    return tape.gradient(y, xs[which]);
  };
}

// Class labels for 3 rows of 4 classes.
Tensor kLabels3() { return sc::tensor(std::vector<std::int64_t>{3, 0, 2}, Shape{3}); }

const Fn kMatmul = [](const std::vector<Tensor>& x) { return sc::matmul(x[0], x[1]); };

}  // namespace

TEST_CASE("matmul: gradients for 2-D, batched, broadcast and 1-D operands", "[autodiff][grad][matmul]") {
  // {a, b}: every case of the NumPy rules, including the two the rule folds or reshapes.
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{3, 4}, {4, 2}},           // plain 2-D
      {{2, 3, 4}, {2, 4, 5}},     // equal batches
      {{2, 1, 3, 4}, {3, 4, 2}},  // batch dims broadcast both ways: [2,1] with [3]
      {{2, 1, 3, 4}, {1, 2, 4, 2}},
      {{3, 4}, {2, 4, 5}},        // one a for the batch (conv2d's weight)
      {{2, 3, 4}, {4, 5}},        // one b for the batch (a dense layer): dB is one folded GEMM
      {{2, 3, 4}, {1, 4, 5}},     // the same with b's batch dim of 1 kept
      {{4}, {4, 3}},              // 1-D on the left
      {{3, 4}, {4}},              // 1-D on the right
      {{4}, {4}},                 // dot product, rank-0 result
      {{4}, {2, 4, 3}},           // 1-D left against a batch
      {{2, 3, 4}, {4}},           // a batch against 1-D right
      {{1, 4}, {4, 1}},           // size-1 matrix dims
  };
  std::vector<Row> rows;
  std::uint64_t seed = 1;
  for (const auto& [sa, sb] : shapes)
    rows.push_back({"matmul " + str(sa) + " x " + str(sb), kMatmul, {vals(sa, ++seed), vals(sb, ++seed)}});
  // f32 operands (the checker promotes them to f64) and mixed dtypes.
  rows.push_back({"matmul f32", kMatmul, {vals({3, 4}, 50).astype(sc::f32), vals({4, 2}, 51).astype(sc::f32)}});
  rows.push_back({"matmul of a product", [](auto& x) { return sc::matmul(sc::matmul(x[0], x[1]), x[0]); },
                  {vals({3, 3}, 52), vals({3, 3}, 53)}});
  check_rows(rows);
}

TEST_CASE("matmul: gradients with transpose flags", "[autodiff][grad][matmul]") {
  // Stored shapes: a is [..., K, M] when transposed, b is [..., N, K].
  struct Case {
    Shape a, b;
    bool ta, tb;
  };
  const std::vector<Case> cases = {
      {{4, 3}, {4, 2}, true, false},          {{3, 4}, {2, 4}, false, true},       {{4, 3}, {2, 4}, true, true},
      {{2, 4, 3}, {2, 4, 5}, true, false},    {{2, 3, 4}, {5, 4}, false, true},     {{2, 4, 3}, {5, 4}, true, true},
      {{2, 1, 4, 3}, {3, 5, 4}, true, true},  {{4, 3}, {2, 5, 4}, true, true},      {{4}, {3, 4}, true, true},
      {{4, 3}, {4}, true, true},              {{1, 4}, {1, 4}, false, true},
  };
  std::vector<Row> rows;
  std::uint64_t seed = 70;
  for (const Case& c : cases) {
    const bool ta = c.ta, tb = c.tb;
    rows.push_back({"matmul " + str(c.a) + (ta ? "^T" : "") + " x " + str(c.b) + (tb ? "^T" : ""),
                    [ta, tb](const std::vector<Tensor>& x) { return sc::matmul(x[0], x[1], ta, tb); },
                    {vals(c.a, ++seed), vals(c.b, ++seed)}});
  }
  check_rows(rows);
}

TEST_CASE("matmul: gradients keep each operand's dtype and shape", "[autodiff][grad][matmul]") {
  SECTION("f32 gradients agree with f64 ones") {
    const Tensor a = vals({2, 3, 4}, 60), b = vals({4, 5}, 61);
    const Tensor a32 = a.astype(sc::f32), b32 = b.astype(sc::f32);
    sc::GradientTape t64(true), t32(true);
    t64.watch({a, b});
    t32.watch({a32, b32});
    const Tensor y64 = sc::sum(sc::square(sc::matmul(a, b))), y32 = sc::sum(sc::square(sc::matmul(a32, b32)));
    const auto g64 = t64.gradient(y64, {a, b});
    const auto g32 = t32.gradient(y32, {a32, b32});
    for (int i = 0; i < 2; ++i) {
      CHECK(g32[i].dtype() == sc::f32);
      CHECK(g32[i].shape() == g64[i].shape());
      CHECK(max_abs_diff(g32[i], g64[i]) < 1e-4);
    }
  }
  SECTION("mixed f32 x f64: each gradient in its operand's dtype") {
    const Tensor a = vals({3, 4}, 62).astype(sc::f32), b = vals({4, 2}, 63);
    sc::GradientTape tape;
    tape.watch({a, b});
    const auto g = tape.gradient(sc::matmul(a, b), {a, b});
    CHECK(g[0].dtype() == sc::f32);
    CHECK(g[1].dtype() == sc::f64);
    // d sum(a b)/da[i][k] = sum_n b[k][n]; d/db[k][n] = sum_m a[m][k].
    CHECK(max_abs_diff(g[0], sc::sum(b, {1}, false).astype(sc::f32) * sc::ones({3, 1}, sc::f32)) < 1e-6);
    CHECK(max_abs_diff(g[1], sc::reshape(sc::sum(a.astype(sc::f64), {0}), {4, 1}) * sc::ones({1, 2}, sc::f64)) < 1e-6);
  }
  SECTION("empty inner or outer dimensions give empty or zero gradients") {
    const Tensor a = vals({2, 0}, 64), b = vals({0, 3}, 65);
    sc::GradientTape tape;
    tape.watch({a, b});
    const auto g = tape.gradient(sc::matmul(a, b), {a, b});
    CHECK(g[0].shape() == Shape{2, 0});
    CHECK(g[1].shape() == Shape{0, 3});
    const Tensor c = vals({0, 3}, 66), d = vals({3, 2}, 67);
    sc::GradientTape tape2;
    tape2.watch({c, d});
    const auto h = tape2.gradient(sc::matmul(c, d), {c, d});
    CHECK(h[0].shape() == Shape{0, 3});
    CHECK(h[1].shape() == Shape{3, 2});
    CHECK(max_abs_diff(h[1], sc::zeros({3, 2}, sc::f64)) == 0);
  }
}

namespace {

// A sliding-window configuration over an input shape.
struct Win {
  Shape x;
  std::int64_t kh, kw, stride, pad;
  std::string name() const {
    return str(x) + " k" + std::to_string(kh) + "x" + std::to_string(kw) + " s" + std::to_string(stride) + " p" +
           std::to_string(pad);
  }
  Shape cols() const {
    const std::int64_t ho = (x[2] + 2 * pad - kh) / stride + 1, wo = (x[3] + 2 * pad - kw) / stride + 1;
    return Shape{x[0], x[1] * kh * kw, ho * wo};
  }
};

// Strides 1-2, padding 0-1, square and non-square kernels and images, batch 2, channels 1-3.
const std::vector<Win> kWindows = {
    {{2, 3, 5, 6}, 3, 3, 1, 0}, {{2, 3, 5, 6}, 3, 3, 1, 1}, {{2, 3, 5, 6}, 3, 3, 2, 0},
    {{2, 3, 5, 6}, 3, 3, 2, 1}, {{2, 2, 4, 5}, 2, 3, 1, 1}, {{2, 2, 4, 5}, 2, 3, 2, 0},
    {{2, 2, 4, 5}, 1, 1, 1, 0}, {{2, 2, 4, 5}, 1, 1, 2, 1}, {{1, 1, 4, 4}, 4, 4, 1, 0},
};

}  // namespace

TEST_CASE("im2col and col2im: gradients, and the two are adjoint", "[autodiff][grad][conv]") {
  std::vector<Row> rows;
  std::uint64_t seed = 100;
  for (const Win& w : kWindows) {
    rows.push_back({"im2col " + w.name(), [w](auto& x) { return sc::im2col(x[0], w.kh, w.kw, w.stride, w.pad); },
                    {vals(w.x, ++seed)}});
    rows.push_back({"col2im " + w.name(),
                    [w](auto& x) { return sc::col2im(x[0], w.x, w.kh, w.kw, w.stride, w.pad); },
                    {vals(w.cols(), ++seed)}});
  }
  check_rows(rows);
  // <im2col(x), c> == <x, col2im(c)>: what makes each the other's gradient.
  for (const Win& w : kWindows) {
    const Tensor x = vals(w.x, ++seed), c = vals(w.cols(), ++seed);
    const double lhs = sc::sum(sc::im2col(x, w.kh, w.kw, w.stride, w.pad) * c).item<double>();
    const double rhs = sc::sum(x * sc::col2im(c, w.x, w.kh, w.kw, w.stride, w.pad)).item<double>();
    INFO(w.name());
    CHECK(lhs == Approx(rhs).epsilon(1e-12));
  }
}

TEST_CASE("conv2d: gradients w.r.t. input and kernel", "[autodiff][grad][conv]") {
  std::vector<Row> rows;
  std::uint64_t seed = 200;
  for (const Win& w : kWindows) {
    const Shape ks{3, w.x[1], w.kh, w.kw};  // 3 output channels
    rows.push_back({"conv2d " + w.name(),
                    [w](auto& x) { return sc::nn::conv2d(x[0], x[1], w.stride, w.pad); },
                    {vals(w.x, ++seed), vals(ks, ++seed)}});
  }
  check_rows(rows);
}

TEST_CASE("max_pool2d and avg_pool2d: gradients", "[autodiff][grad][pool]") {
  // {x, kernel, stride}: disjoint windows, overlapping ones, gaps and unread edge rows/columns.
  struct Pool {
    Shape x;
    std::int64_t k, s;
  };
  const std::vector<Pool> pools = {{{2, 3, 4, 6}, 2, 2}, {{2, 2, 5, 4}, 3, 1}, {{2, 2, 7, 6}, 2, 3},
                                   {{1, 2, 5, 5}, 2, 2}, {{2, 1, 3, 3}, 3, 3}, {{1, 1, 1, 1}, 1, 1}};
  std::vector<Row> rows;
  std::uint64_t seed = 300;
  for (const Pool& p : pools) {
    const std::string cfg = " " + str(p.x) + " k" + std::to_string(p.k) + " s" + std::to_string(p.s);
    rows.push_back({"max_pool2d" + cfg, [p](auto& x) { return sc::nn::max_pool2d(x[0], p.k, p.s); },
                    {distinct(p.x, ++seed)}});
    rows.push_back({"max_pool2d_grad" + cfg,
                    [p](auto& x) { return sc::nn::max_pool2d_grad(x[0], x[1], p.k, p.s); },
                    {vals(sc::nn::max_pool2d(sc::zeros(p.x), p.k, p.s).shape(), ++seed), distinct(p.x, ++seed)}});
    rows.push_back({"avg_pool2d" + cfg, [p](auto& x) { return sc::nn::avg_pool2d(x[0], p.k, p.s); },
                    {vals(p.x, ++seed)}});
  }
  check_rows(rows);
}

TEST_CASE("max_pool2d: the first of ties takes the gradient, a NaN wins", "[autodiff][grad][pool]") {
  // Window 0 is all 1s (4 ties); window 1 has two 5s; window 2 one max; window 3 a NaN. As
  // TensorFlow and PyTorch: the whole of g goes to one element, the first maximum in row-major
  // order, or the first NaN (the element the forward pass returns).
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor x = sc::tensor(std::vector<double>{1, 1, 5, 0, 2, 5, nan, 3,  //
                                                  1, 1, 4, 5, 2, 9, 7, 3},
                              Shape{1, 1, 2, 8});
  const Tensor x32 = x.astype(sc::f32);
  for (const Tensor& in : {x, x32}) {
    sc::GradientTape tape;
    tape.watch(in);
    const Tensor y = sc::nn::max_pool2d(in, 2, 2);
    const Tensor w = sc::tensor(std::vector<double>{1, 2, 3, 4}, Shape{1, 1, 1, 4}).astype(in.dtype());
    const Tensor g = tape.gradient(y * w, in);
    CHECK(g.dtype() == in.dtype());
    const std::vector<double> want{1, 0, 2, 0, 0, 0, 4, 0,  //
                                   0, 0, 0, 0, 0, 3, 0, 0};
    CHECK(g.to_vector<double>() == want);
  }
  // Overlapping windows (stride 1): two sharing a maximum add their gradients there; a NaN
  // takes its window's; all-equal windows give theirs to their own top-left element.
  const Tensor o = sc::tensor(std::vector<double>{0, 9, 0, nan,  //
                                                  2, 2, 2, 1,    //
                                                  2, 2, 2, 1},
                              Shape{1, 1, 3, 4});
  sc::GradientTape tape;
  tape.watch(o);
  const Tensor g = tape.gradient(sc::nn::max_pool2d(o, 2, 1), o);
  const std::vector<double> want{0, 2, 0, 1,  //
                                 1, 1, 1, 0,  //
                                 0, 0, 0, 0};
  CHECK(g.to_vector<double>() == want);
}

TEST_CASE("conv2d and the pools: an empty batch gives empty or zero gradients", "[autodiff][grad][conv]") {
  const Tensor x = vals({0, 2, 5, 4}, 350), w = vals({3, 2, 3, 3}, 351);
  for (int s : {1, 2}) {
    sc::GradientTape tape;
    tape.watch({x, w});
    const Tensor y = sc::nn::conv2d(x, w, s, 1);
    CHECK(y.shape() == Shape{0, 3, s == 1 ? 5 : 3, s == 1 ? 4 : 2});
    const auto g = tape.gradient(y, {x, w});
    CHECK(g[0].shape() == x.shape());
    CHECK(g[1].shape() == w.shape());
    CHECK(max_abs_diff(g[1], sc::zeros(w.shape(), sc::f64)) == 0);
  }
  for (bool is_max : {true, false}) {
    sc::GradientTape tape;
    tape.watch(x);
    const Tensor y = is_max ? sc::nn::max_pool2d(x, 2, 1) : sc::nn::avg_pool2d(x, 2, 1);
    CHECK(tape.gradient(y, x).shape() == x.shape());
  }
}

TEST_CASE("softmax, log_softmax, logsumexp and cross_entropy: gradients", "[autodiff][grad][nn]") {
  const Tensor labels = sc::tensor(std::vector<std::int64_t>{2, 0, 3}, Shape{3});
  const Tensor labels32 = labels.astype(sc::i32);
  check_rows({
      {"softmax [3,4]", [](auto& x) { return sc::nn::softmax(x[0]); }, {vals({3, 4}, 400, -3, 3)}},
      {"softmax [2,3,4] axis 1", [](auto& x) { return sc::nn::softmax(x[0], 1); }, {vals({2, 3, 4}, 401, -3, 3)}},
      {"softmax axis 0", [](auto& x) { return sc::nn::softmax(x[0], 0); }, {vals({3, 2}, 402, -3, 3)}},
      {"softmax large values", [](auto& x) { return sc::nn::softmax(x[0]); }, {vals({2, 3}, 403, 500, 503)}},
      {"log_softmax [3,4]", [](auto& x) { return sc::nn::log_softmax(x[0]); }, {vals({3, 4}, 404, -3, 3)}},
      {"log_softmax axis -2", [](auto& x) { return sc::nn::log_softmax(x[0], -2); }, {vals({2, 3, 4}, 405, -3, 3)}},
      {"logsumexp all", [](auto& x) { return sc::logsumexp(x[0]); }, {vals({3, 4}, 406, -3, 3)}},
      {"logsumexp axis 1", [](auto& x) { return sc::logsumexp(x[0], {1}); }, {vals({3, 4}, 407, -3, 3)}},
      {"logsumexp axes 0,2 keepdims", [](auto& x) { return sc::logsumexp(x[0], {0, 2}, true); },
       {vals({2, 3, 4}, 408, -3, 3)}},
      {"cross_entropy i64 labels", [labels](auto& x) { return sc::nn::cross_entropy(x[0], labels); },
       {vals({3, 5}, 409, -3, 3)}},
      {"cross_entropy i32 labels", [labels32](auto& x) { return sc::nn::cross_entropy(x[0], labels32); },
       {vals({3, 4}, 410, -3, 3)}},
  });
}

TEST_CASE("second derivatives: matmul, softmax, conv2d and the pools", "[autodiff][grad][order2]") {
  const Fn conv_s1p1 = [](auto& x) { return sc::nn::conv2d(x[0], x[1], 1, 1); };
  const Fn conv_s2p0 = [](auto& x) { return sc::nn::conv2d(x[0], x[1], 2, 0); };
  const Fn conv_1x1 = [](auto& x) { return sc::nn::conv2d(x[0], x[1]); };
  const Fn softmax = [](auto& x) { return sc::nn::softmax(x[0]); };
  const Tensor a = vals({2, 3, 4}, 500), b = vals({4, 2}, 501), v = vals({4}, 502);
  const Tensor img = vals({2, 2, 4, 5}, 503), k3 = vals({2, 2, 3, 3}, 504), k1 = vals({3, 2, 1, 1}, 505);
  check_rows({
      {"d/da matmul [2,3,4]x[4,2]", inner_gradient(kMatmul, 0), {a, b}},
      {"d/db matmul [2,3,4]x[4,2]", inner_gradient(kMatmul, 1), {a, b}},
      {"d/db matmul [4]x[2,4,3]", inner_gradient(kMatmul, 1), {v, vals({2, 4, 3}, 506)}},
      {"d/da matmul [2,3,4]x[4]", inner_gradient(kMatmul, 0), {a, v}},
      {"d/dx softmax", inner_gradient(softmax, 0), {vals({3, 4}, 507, -2, 2)}},
      {"d/dx log_softmax", inner_gradient([](auto& x) { return sc::nn::log_softmax(x[0]); }, 0),
       {vals({3, 4}, 508, -2, 2)}},
      {"d/dx conv2d s1 p1", inner_gradient(conv_s1p1, 0), {img, k3}},
      {"d/dw conv2d s1 p1", inner_gradient(conv_s1p1, 1), {img, k3}},
      {"d/dx conv2d s2 p0", inner_gradient(conv_s2p0, 0), {img, k3}},
      {"d/dw conv2d 1x1", inner_gradient(conv_1x1, 1), {img, k1}},
      {"d/dx max_pool2d", inner_gradient([](auto& x) { return sc::nn::max_pool2d(x[0], 2, 1); }, 0),
       {distinct({2, 2, 4, 5}, 509)}},
      {"d/dx max_pool2d k3 s2", inner_gradient([](auto& x) { return sc::nn::max_pool2d(x[0], 3, 2); }, 0),
       {distinct({2, 2, 7, 6}, 511)}},
      // max_pool2d_grad itself: linear in g (its gradient picks gg at the argmax), none in x.
      {"d/dg max_pool2d_grad k2 s1",
       inner_gradient([](auto& x) { return sc::nn::max_pool2d_grad(x[0], x[1], 2, 1); }, 0),
       {vals({2, 2, 3, 4}, 512), distinct({2, 2, 4, 5}, 513)}},
      {"d/dx avg_pool2d", inner_gradient([](auto& x) { return sc::nn::avg_pool2d(sc::square(x[0]), 2, 2); }, 0),
       {vals({2, 2, 4, 5}, 510)}},
      // cross_entropy is one op whose gradient is another (softmax_cross_entropy_grad): through
      // both, and the gradient op's own gradients w.r.t. g and the logits.
      {"d/dx cross_entropy", inner_gradient([](auto& x) { return sc::nn::cross_entropy(sc::square(x[0]), kLabels3()); }, 0),
       {vals({3, 4}, 514, -2, 2)}},
      {"d/dg softmax_cross_entropy_grad",
       inner_gradient([](auto& x) { return sc::detail::softmax_cross_entropy_grad(x[0], x[1], kLabels3()); }, 0),
       {vals({}, 515, 0.5, 2), vals({3, 4}, 516, -2, 2)}},
      {"d/dx softmax_cross_entropy_grad",
       inner_gradient([](auto& x) { return sc::detail::softmax_cross_entropy_grad(x[0], x[1], kLabels3()); }, 1),
       {vals({}, 517, 0.5, 2), vals({3, 4}, 518, -2, 2)}},
  });
}

TEST_CASE("a tiny CNN: the loss gradient matches finite differences", "[autodiff][grad][nn]") {
  // conv (3x3, pad 1) -> relu -> max_pool 2 -> flatten -> dense -> cross_entropy, w.r.t. the
  // input and both weights.
  const Tensor labels = sc::tensor(std::vector<std::int64_t>{1, 2}, Shape{2});
  const Fn loss = [labels](const std::vector<Tensor>& p) {
    const Tensor h = sc::nn::max_pool2d(sc::relu(sc::nn::conv2d(p[0], p[1], 1, 1)), 2, 2);  // [2,3,3,3]
    const Tensor logits = sc::matmul(sc::reshape(h, {2, 27}), p[2]);                     // [2,3]
    return sc::nn::cross_entropy(logits, labels);
  };
  const std::vector<Tensor> params = {vals({2, 2, 6, 6}, 600), vals({3, 2, 3, 3}, 601), vals({27, 3}, 602)};
  const sc::GradCheckResult r = sc::check_gradients(loss, params);
  INFO("max error " << r.max_abs_error << "\n" << r.report);
  CHECK(r.ok);
  // The same gradients in f32, through a tape, agree with the f64 ones.
  std::vector<Tensor> p32;
  for (const Tensor& p : params) p32.push_back(p.astype(sc::f32));
  sc::GradientTape t64, t32;
  t64.watch(params);
  t32.watch(p32);
  const auto g64 = t64.gradient(loss(params), params);
  const auto g32 = t32.gradient(loss(p32), p32);
  for (std::size_t i = 0; i < params.size(); ++i) {
    CHECK(g32[i].dtype() == sc::f32);
    CHECK(max_abs_diff(g32[i], g64[i]) < 1e-4);
  }
}
