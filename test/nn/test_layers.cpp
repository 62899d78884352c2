// nn::Dense, Conv2D, LSTMCell against plain-loop references (f32, f64), their gradients
// (inputs by check_gradients, variables by finite differences through assign), the
// initializers' statistics and seeding, and every error path.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>
#include <stagecraft/nn/layers.hpp>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "testing.hpp"

namespace {

using sctest::check_close;
using sctest::check_variable_gradients;
using sctest::error_of;
using sctest::randn;

std::string at_line(int line) { return "test_layers.cpp:" + std::to_string(line); }

sc::Tensor make(const std::vector<double>& v, sc::Shape s, sc::DType d) { return sc::tensor(v, s).astype(d); }

/// Gives a layer's variable random values (biases are zero at first, which would hide bugs).
void randomize(sc::Variable& v, unsigned seed) {
  v.assign(make(randn(v.numel(), seed, 0.5), v.shape(), v.dtype()));
}

/// sum(y * w) for a fixed random w: every output element matters to the checked scalar.
sc::Tensor project(const sc::Tensor& y, unsigned seed) {
  return sc::sum(y * make(randn(y.numel(), seed), y.shape(), y.dtype()));
}

// ---- references ------------------------------------------------------------------------

std::vector<double> dense_reference(const std::vector<double>& x, const std::vector<double>& k,
                                    const std::vector<double>& b, std::int64_t rows, std::int64_t in,
                                    std::int64_t out) {
  std::vector<double> y(static_cast<std::size_t>(rows * out));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t o = 0; o < out; ++o) {
      double s = b[o];
      for (std::int64_t i = 0; i < in; ++i) s += x[r * in + i] * k[i * out + o];
      y[r * out + o] = s;
    }
  return y;
}

std::vector<double> conv_reference(const std::vector<double>& x, const std::vector<double>& w,
                                   const std::vector<double>& b, std::int64_t N, std::int64_t C, std::int64_t H,
                                   std::int64_t W, std::int64_t O, std::int64_t k, std::int64_t s, std::int64_t p) {
  const std::int64_t Ho = (H + 2 * p - k) / s + 1, Wo = (W + 2 * p - k) / s + 1;
  std::vector<double> y(static_cast<std::size_t>(N * O * Ho * Wo));
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < O; ++o)
      for (std::int64_t oy = 0; oy < Ho; ++oy)
        for (std::int64_t ox = 0; ox < Wo; ++ox) {
          double acc = b[o];
          for (std::int64_t c = 0; c < C; ++c)
            for (std::int64_t i = 0; i < k; ++i)
              for (std::int64_t j = 0; j < k; ++j) {
                const std::int64_t iy = oy * s - p + i, ix = ox * s - p + j;
                if (iy >= 0 && iy < H && ix >= 0 && ix < W)
                  acc += x[((n * C + c) * H + iy) * W + ix] * w[((o * C + c) * k + i) * k + j];
              }
          y[((n * O + o) * Ho + oy) * Wo + ox] = acc;
        }
  return y;
}

double sigm(double v) { return 1 / (1 + std::exp(-v)); }

/// One LSTM step by loops: gates i, f, g, o in blocks of `hid` columns.
void lstm_reference(const std::vector<double>& x, const std::vector<double>& h, const std::vector<double>& c,
                    const std::vector<double>& K, const std::vector<double>& U, const std::vector<double>& b,
                    std::int64_t N, std::int64_t in, std::int64_t hid, std::vector<double>& h2,
                    std::vector<double>& c2) {
  h2.assign(static_cast<std::size_t>(N * hid), 0);
  c2.assign(static_cast<std::size_t>(N * hid), 0);
  for (std::int64_t n = 0; n < N; ++n) {
    std::vector<double> z(static_cast<std::size_t>(4 * hid));
    for (std::int64_t col = 0; col < 4 * hid; ++col) {
      double s = b[col];
      for (std::int64_t i = 0; i < in; ++i) s += x[n * in + i] * K[i * 4 * hid + col];
      for (std::int64_t j = 0; j < hid; ++j) s += h[n * hid + j] * U[j * 4 * hid + col];
      z[col] = s;
    }
    for (std::int64_t j = 0; j < hid; ++j) {
      const double ig = sigm(z[j]), fg = sigm(z[hid + j]), gg = std::tanh(z[2 * hid + j]), og = sigm(z[3 * hid + j]);
      const double cn = fg * c[n * hid + j] + ig * gg;
      c2[n * hid + j] = cn;
      h2[n * hid + j] = og * std::tanh(cn);
    }
  }
}

}  // namespace

// ---- Dense -------------------------------------------------------------------------------

TEST_CASE("Dense: forward against a loop reference", "[layers][dense]") {
  for (sc::DType dt : {sc::f32, sc::f64}) {
    const double tol = dt == sc::f32 ? 1e-5 : 1e-12;
    sc::nn::Dense d(5, 3, 11, dt);
    CHECK(d.kernel.shape() == sc::Shape{5, 3});
    CHECK(d.bias.shape() == sc::Shape{3});
    CHECK(d.kernel.dtype() == dt);
    CHECK(d.bias.value().to_vector<double>() == std::vector<double>(3, 0.0));
    randomize(d.bias, 3);
    const auto K = d.kernel.value().to_vector<double>(), B = d.bias.value().to_vector<double>();

    for (sc::Shape xs : {sc::Shape{4, 5}, sc::Shape{5}, sc::Shape{2, 3, 5}, sc::Shape{2, 1, 2, 5}, sc::Shape{0, 5}}) {
      INFO("x shape " << xs << " dtype " << sc::name(dt));
      const auto xv = randn(xs.numel(), 7);
      const sc::Tensor y = d(make(xv, xs, dt));
      sc::Shape ys = xs;
      ys[ys.rank() - 1] = 3;
      CHECK(y.shape() == ys);
      CHECK(y.dtype() == dt);
      check_close(y.to_vector<double>(), dense_reference(xv, K, B, xs.numel() / 5, 5, 3), tol);
    }
  }
}

TEST_CASE("Dense: errors", "[layers][dense][errors]") {
  sc::nn::Dense d(4, 2, 1);
  int line = __LINE__ + 1;
  std::string msg = error_of<sc::ShapeError>([&] { (void)d(sc::ones({3, 5})); });
  CHECK_THAT(msg, Catch::Contains("[Dense]") && Catch::Contains("[..., 4]") && Catch::Contains("[3, 5]") &&
                      Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ShapeError>([&] { (void)d(sc::scalar(1.f)); });
  CHECK_THAT(msg, Catch::Contains("[Dense]") && Catch::Contains("[]") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { (void)d(sc::Tensor()); });
  CHECK_THAT(msg, Catch::Contains("[Dense]") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { sc::nn::Dense bad(0, 3); });
  CHECK_THAT(msg, Catch::Contains("[Dense]") && Catch::Contains("in >= 1") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::DTypeError>([&] { sc::nn::Dense bad(2, 3, 1, sc::i32); });
  CHECK_THAT(msg, Catch::Contains("[init::glorot_uniform]") && Catch::Contains("i32") &&
                      Catch::Contains(at_line(line)));
}

TEST_CASE("layers made inside a traced function are refused at the user's line", "[layers][errors]") {
  // Their variables' StagingError named dense.hpp / conv.hpp / lstm.hpp instead.
  int line = 0;
  auto dense = sc::function([&](sc::Tensor x) {
    line = __LINE__ + 1;
    sc::nn::Dense d(3, 2, 1);
    return d(x);
  });
  std::string msg = error_of<sc::StagingError>([&] { (void)dense(sc::ones({2, 3})); });
  CHECK_THAT(msg, Catch::Contains("'kernel'") && Catch::Contains("init_scope") && Catch::Contains(at_line(line)));
  auto conv = sc::function([&](sc::Tensor x) {
    line = __LINE__ + 1;
    sc::nn::Conv2D c(1, 2, 3, 1, 1, 1);
    return c(x);
  });
  msg = error_of<sc::StagingError>([&] { (void)conv(sc::ones({1, 1, 4, 4})); });
  CHECK_THAT(msg, Catch::Contains("'kernel'") && Catch::Contains(at_line(line)));
  auto lstm = sc::function([&](sc::Tensor x) {
    line = __LINE__ + 1;
    sc::nn::LSTMCell l(3, 2, 1);
    return l(x, l.initial_state(2)).first;
  });
  msg = error_of<sc::StagingError>([&] { (void)lstm(sc::ones({2, 3})); });
  CHECK_THAT(msg, Catch::Contains("'kernel'") && Catch::Contains(at_line(line)));
}

TEST_CASE("Dense: gradients", "[layers][dense][grad]") {
  sc::nn::Dense d(3, 2, 5, sc::f64);
  randomize(d.bias, 1);
  const sc::Tensor x3 = make(randn(12, 3), {4, 3}, sc::f64);
  const auto r = sc::check_gradients([&](const std::vector<sc::Tensor>& xs) { return d(xs[0]); }, {x3});
  INFO(r.report);
  CHECK(r.ok);
  const sc::Tensor xr = make(randn(18, 4), {2, 3, 3}, sc::f64);  // rank 3: the flattened path
  check_variable_gradients([&] { return project(d(xr), 9); }, d.trainable_variables());
  check_variable_gradients([&] { return project(d(x3), 8); }, d.trainable_variables());
}

// ---- Conv2D ------------------------------------------------------------------------------

TEST_CASE("Conv2D: forward against a loop reference", "[layers][conv]") {
  struct Case { std::int64_t N, C, H, W, O, k, s, p; };
  for (sc::DType dt : {sc::f32, sc::f64}) {
    const double tol = dt == sc::f32 ? 1e-4 : 1e-12;
    for (const Case c : {Case{2, 3, 6, 5, 4, 3, 1, 0}, Case{1, 2, 7, 7, 3, 3, 2, 1}, Case{2, 1, 4, 4, 2, 1, 1, 0},
                         Case{1, 2, 5, 6, 2, 2, 1, 2}, Case{0, 2, 4, 4, 2, 3, 1, 1}}) {
      INFO("case N" << c.N << " C" << c.C << " H" << c.H << " W" << c.W << " O" << c.O << " k" << c.k << " s"
                    << c.s << " p" << c.p << " " << sc::name(dt));
      sc::nn::Conv2D conv(c.C, c.O, c.k, c.s, c.p, 21, dt);
      CHECK(conv.kernel.shape() == sc::Shape{c.O, c.C, c.k, c.k});
      CHECK(conv.bias.shape() == sc::Shape{c.O});
      randomize(conv.bias, 4);
      const auto xv = randn(c.N * c.C * c.H * c.W, 5);
      const sc::Tensor y = conv(make(xv, {c.N, c.C, c.H, c.W}, dt));
      const std::int64_t Ho = (c.H + 2 * c.p - c.k) / c.s + 1, Wo = (c.W + 2 * c.p - c.k) / c.s + 1;
      CHECK(y.shape() == sc::Shape{c.N, c.O, Ho, Wo});
      CHECK(y.dtype() == dt);
      const auto want = conv_reference(xv, conv.kernel.value().to_vector<double>(),
                                       conv.bias.value().to_vector<double>(), c.N, c.C, c.H, c.W, c.O, c.k, c.s, c.p);
      check_close(y.to_vector<double>(), want, tol);
    }
  }
}

TEST_CASE("Conv2D: errors", "[layers][conv][errors]") {
  sc::nn::Conv2D conv(3, 2, 3);
  int line = __LINE__ + 1;
  std::string msg = error_of<sc::ShapeError>([&] { (void)conv(sc::ones({1, 2, 5, 5})); });
  CHECK_THAT(msg, Catch::Contains("[Conv2D]") && Catch::Contains("[N, 3, H, W]") && Catch::Contains("[1, 2, 5, 5]") &&
                      Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ShapeError>([&] { (void)conv(sc::ones({3, 5, 5})); });
  CHECK_THAT(msg, Catch::Contains("[Conv2D]") && Catch::Contains("[3, 5, 5]") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;  // the window does not fit: conv2d's own error, still at the user's line
  msg = error_of<sc::ShapeError>([&] { (void)conv(sc::ones({1, 3, 2, 2})); });
  CHECK_THAT(msg, Catch::Contains("[conv2d]") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { sc::nn::Conv2D bad(3, 2, 0); });
  CHECK_THAT(msg, Catch::Contains("[Conv2D]") && Catch::Contains("kernel >= 1") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { sc::nn::Conv2D bad(3, 2, 3, 0); });
  CHECK_THAT(msg, Catch::Contains("stride >= 1") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { sc::nn::Conv2D bad(3, 2, 3, 1, -1); });
  CHECK_THAT(msg, Catch::Contains("padding >= 0") && Catch::Contains(at_line(line)));
}

TEST_CASE("Conv2D: gradients", "[layers][conv][grad]") {
  sc::nn::Conv2D conv(2, 3, 3, 2, 1, 8, sc::f64);
  randomize(conv.bias, 2);
  const sc::Tensor x = make(randn(2 * 2 * 5 * 4, 3), {2, 2, 5, 4}, sc::f64);
  const auto r = sc::check_gradients([&](const std::vector<sc::Tensor>& xs) { return conv(xs[0]); }, {x});
  INFO(r.report);
  CHECK(r.ok);
  check_variable_gradients([&] { return project(conv(x), 6); }, conv.trainable_variables());
}

// ---- LSTMCell ----------------------------------------------------------------------------

TEST_CASE("LSTMCell: forward against a loop reference", "[layers][lstm]") {
  for (sc::DType dt : {sc::f32, sc::f64}) {
    const double tol = dt == sc::f32 ? 1e-5 : 1e-12;
    const std::int64_t N = 3, in = 4, hid = 5;
    sc::nn::LSTMCell cell(in, hid, 13, dt);
    CHECK(cell.kernel.shape() == sc::Shape{in, 4 * hid});
    CHECK(cell.recurrent_kernel.shape() == sc::Shape{hid, 4 * hid});
    std::vector<double> want_bias(4 * hid, 0.0);
    for (std::int64_t j = hid; j < 2 * hid; ++j) want_bias[j] = 1.0;  // forget gate
    CHECK(cell.bias.value().to_vector<double>() == want_bias);
    CHECK(cell.kernel.value().to_vector<double>() != cell.recurrent_kernel.value().to_vector<double>());

    const auto [h0, c0] = cell.initial_state(N);
    CHECK(h0.shape() == sc::Shape{N, hid});
    CHECK(c0.dtype() == dt);
    CHECK(c0.to_vector<double>() == std::vector<double>(N * hid, 0.0));

    randomize(cell.bias, 6);
    const auto xv = randn(N * in, 1), hv = randn(N * hid, 2, 0.5), cv = randn(N * hid, 3);
    const auto [h1, c1] = cell(make(xv, {N, in}, dt), {make(hv, {N, hid}, dt), make(cv, {N, hid}, dt)});
    std::vector<double> hw, cw;
    lstm_reference(xv, hv, cv, cell.kernel.value().to_vector<double>(),
                   cell.recurrent_kernel.value().to_vector<double>(), cell.bias.value().to_vector<double>(), N, in,
                   hid, hw, cw);
    CHECK(h1.shape() == sc::Shape{N, hid});
    CHECK(h1.dtype() == dt);
    check_close(h1.to_vector<double>(), hw, tol);
    check_close(c1.to_vector<double>(), cw, tol);

    // Two steps from the zero state: the second step reads the first's (h, c).
    auto st = cell(make(xv, {N, in}, dt), cell.initial_state(N));
    st = cell(make(xv, {N, in}, dt), st);
    std::vector<double> ha, ca, hb, cb;
    lstm_reference(xv, std::vector<double>(N * hid, 0), std::vector<double>(N * hid, 0),
                   cell.kernel.value().to_vector<double>(), cell.recurrent_kernel.value().to_vector<double>(),
                   cell.bias.value().to_vector<double>(), N, in, hid, ha, ca);
    lstm_reference(xv, ha, ca, cell.kernel.value().to_vector<double>(),
                   cell.recurrent_kernel.value().to_vector<double>(), cell.bias.value().to_vector<double>(), N, in,
                   hid, hb, cb);
    check_close(st.first.to_vector<double>(), hb, tol);
    check_close(st.second.to_vector<double>(), cb, tol);
  }
  sc::nn::LSTMCell cell(2, 3, 1);
  const auto [h, c] = cell(sc::ones({0, 2}), cell.initial_state(0));  // an empty batch
  CHECK(h.shape() == sc::Shape{0, 3});
  CHECK(c.shape() == sc::Shape{0, 3});
}

TEST_CASE("LSTMCell: errors", "[layers][lstm][errors]") {
  sc::nn::LSTMCell cell(4, 3, 1);
  const auto st = cell.initial_state(2);
  int line = __LINE__ + 1;
  std::string msg = error_of<sc::ShapeError>([&] { (void)cell(sc::ones({2, 5}), st); });
  CHECK_THAT(msg, Catch::Contains("[LSTMCell]") && Catch::Contains("[N, 4]") && Catch::Contains("[2, 5]") &&
                      Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ShapeError>([&] { (void)cell(sc::ones({3, 4}), st); });
  CHECK_THAT(msg, Catch::Contains("[LSTMCell]") && Catch::Contains("[3, 3]") && Catch::Contains("h [2, 3]") &&
                      Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ShapeError>([&] { (void)cell(sc::ones({2, 4}), {st.first, sc::ones({2, 4})}); });
  CHECK_THAT(msg, Catch::Contains("c [2, 4]") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { (void)cell(sc::ones({2, 4}), {sc::Tensor(), st.second}); });
  CHECK_THAT(msg, Catch::Contains("[LSTMCell]") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { (void)cell.initial_state(-1); });
  CHECK_THAT(msg, Catch::Contains("[LSTMCell::initial_state]") && Catch::Contains("-1") &&
                      Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { sc::nn::LSTMCell bad(3, 0); });
  CHECK_THAT(msg, Catch::Contains("[LSTMCell]") && Catch::Contains("hidden >= 1") && Catch::Contains(at_line(line)));
  // 4 * hidden overflowed int64 (undefined behaviour), then a wrapped shape reached random::uniform.
  for (const std::int64_t hidden : {std::int64_t{1} << 62, (std::int64_t{1} << 61) + 1}) {
    line = __LINE__ + 1;
    msg = error_of<sc::ShapeError>([&] { sc::nn::LSTMCell bad(1, hidden, 1); });
    CHECK_THAT(msg, Catch::Contains("[LSTMCell]") && Catch::Contains("4 * hidden") && Catch::Contains(at_line(line)));
  }
}

TEST_CASE("LSTMCell: gradients", "[layers][lstm][grad]") {
  const std::int64_t N = 2, in = 3, hid = 2;
  sc::nn::LSTMCell cell(in, hid, 4, sc::f64);
  randomize(cell.bias, 9);
  const sc::Tensor x = make(randn(N * in, 1), {N, in}, sc::f64);
  const sc::Tensor h = make(randn(N * hid, 2, 0.5), {N, hid}, sc::f64);
  const sc::Tensor c = make(randn(N * hid, 3), {N, hid}, sc::f64);
  const auto step = [&](const std::vector<sc::Tensor>& xs) {
    const auto [h1, c1] = cell(xs[0], {xs[1], xs[2]});
    return sc::concat({h1, c1}, 1);
  };
  const auto r = sc::check_gradients(step, {x, h, c});
  INFO(r.report);
  CHECK(r.ok);
  // Two steps, so the recurrent kernel is reached through the first step's h too.
  check_variable_gradients(
      [&] {
        const auto s1 = cell(x, {h, c});
        const auto s2 = cell(x, s1);
        return project(sc::concat({s2.first, s2.second}, 1), 5);
      },
      cell.trainable_variables());
}

// ---- initializers and seeding ---------------------------------------------------------------

TEST_CASE("init: fans of dense and OIHW kernels", "[init]") {
  using sc::nn::init::fans;
  CHECK(fans({784, 256}).in == 784);
  CHECK(fans({784, 256}).out == 256);
  CHECK(fans({64, 32, 3, 5}).in == 32 * 15);
  CHECK(fans({64, 32, 3, 5}).out == 64 * 15);
  CHECK(fans({8, 4, 3}).in == 12);
  CHECK(fans({7}).in == 7);
  CHECK(fans({7}).out == 7);
  CHECK(fans({}).in == 1);
}

TEST_CASE("init: statistics match the theory", "[init]") {
  struct Row {
    const char* name;
    std::function<sc::Tensor(sc::Shape, std::uint64_t, sc::DType)> f;
    sc::Shape shape;
    double variance;  // what theory says
    double bound;     // |x| <= bound for the uniform ones, 0 = unbounded
  };
  using namespace sc::nn::init;
  const auto gu = [](sc::Shape s, std::uint64_t k, sc::DType d) { return glorot_uniform(s, k, d); };
  const auto gn = [](sc::Shape s, std::uint64_t k, sc::DType d) { return glorot_normal(s, k, d); };
  const auto hn = [](sc::Shape s, std::uint64_t k, sc::DType d) { return he_normal(s, k, d); };
  const auto hu = [](sc::Shape s, std::uint64_t k, sc::DType d) { return he_uniform(s, k, d); };
  const std::vector<Row> rows = {
      {"glorot_uniform", gu, {300, 200}, 2.0 / 500, std::sqrt(6.0 / 500)},
      {"glorot_normal", gn, {300, 200}, 2.0 / 500, 0},
      {"he_normal", hn, {64, 32, 3, 3}, 2.0 / 288, 0},
      {"he_uniform", hu, {64, 32, 3, 3}, 2.0 / 288, std::sqrt(6.0 / 288)},
      {"glorot_uniform conv", gu, {64, 32, 3, 3}, 2.0 / (288 + 576), std::sqrt(6.0 / 864)},
  };
  for (const Row& r : rows)
    for (sc::DType dt : {sc::f32, sc::f64}) {
      INFO(r.name << " " << sc::name(dt));
      const sc::Tensor t = r.f(r.shape, 42, dt);
      CHECK(t.shape() == r.shape);
      CHECK(t.dtype() == dt);
      const auto v = t.to_vector<double>();
      double mean = 0, sq = 0, amax = 0;
      for (double e : v) {
        mean += e;
        amax = std::max(amax, std::abs(e));
      }
      mean /= double(v.size());
      for (double e : v) sq += (e - mean) * (e - mean);
      const double var = sq / double(v.size() - 1);
      const double sd = std::sqrt(r.variance);
      CHECK(std::abs(mean) < 4 * sd / std::sqrt(double(v.size())));  // 4 standard errors
      CHECK(var == Approx(r.variance).epsilon(0.03));
      if (r.bound > 0) CHECK(amax <= r.bound);
      if (r.bound > 0) CHECK(amax > 0.99 * r.bound);  // the whole interval is used
      if (r.bound == 0) CHECK(amax > 3 * sd);         // a normal has tails
      CHECK(r.f(r.shape, 42, dt).to_vector<double>() == v);   // same seed, same values
      CHECK(r.f(r.shape, 43, dt).to_vector<double>() != v);   // another seed, other values
    }
  CHECK(sc::nn::init::zeros({3, 2}, sc::f64).to_vector<double>() == std::vector<double>(6, 0.0));
  CHECK(sc::nn::init::zeros({3, 2}).dtype() == sc::f32);
  CHECK(glorot_uniform({0, 4}, 1).numel() == 0);  // empty weights are fine
}

TEST_CASE("init: the global seed stream", "[init][seed]") {
  using namespace sc::nn::init;
  sc::manual_seed(5);
  const auto a1 = glorot_uniform({10, 10}).to_vector<float>();
  const auto a2 = glorot_uniform({10, 10}).to_vector<float>();
  CHECK(a1 != a2);  // successive draws differ
  sc::manual_seed(5);
  CHECK(glorot_uniform({10, 10}).to_vector<float>() == a1);
  CHECK(glorot_uniform({10, 10}).to_vector<float>() == a2);
  sc::manual_seed(6);
  CHECK(glorot_uniform({10, 10}).to_vector<float>() != a1);

  // An explicit seed ignores the stream and leaves it where it was.
  sc::manual_seed(5);
  sc::nn::Dense explicit_a(4, 4, 77);
  sc::nn::Dense drawn(4, 4);
  sc::manual_seed(5);
  sc::nn::Dense drawn_again(4, 4);
  sc::nn::Dense explicit_b(4, 4, 77);
  CHECK(explicit_a.kernel.value().to_vector<float>() == explicit_b.kernel.value().to_vector<float>());
  CHECK(drawn.kernel.value().to_vector<float>() == drawn_again.kernel.value().to_vector<float>());
  CHECK(drawn.kernel.value().to_vector<float>() != explicit_a.kernel.value().to_vector<float>());
  // Each layer consumes exactly one seed of the stream, whatever its kind.
  sc::manual_seed(9);
  sc::nn::LSTMCell l1(3, 2);
  sc::nn::Dense d1(3, 2);
  sc::manual_seed(9);
  sc::nn::Conv2D c2(1, 1, 1);
  sc::nn::Dense d2(3, 2);
  CHECK(d1.kernel.value().to_vector<float>() == d2.kernel.value().to_vector<float>());

  const std::string msg = error_of<sc::DTypeError>([] { (void)he_normal({2, 2}, 1, sc::i64); });
  CHECK_THAT(msg, Catch::Contains("[init::he_normal]") && Catch::Contains("i64") && Catch::Contains("test_layers.cpp"));
}
