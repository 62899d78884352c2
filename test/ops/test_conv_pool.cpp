// conv2d, im2col/col2im and the pools against direct loops: dtypes, strides, padding,
// non-square images and kernels, empty batches, the adjoint identity, and every error path.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "testing.hpp"

namespace {

/// Small integers in [-6, 6] (quarters of them for floats): exact in every dtype.
template <class T>
std::vector<T> random_values(std::int64_t n, unsigned seed) {
  return sctest::small_values<T>(n, seed, 6, 4);
}

template <class T>
sc::Tensor random_tensor(sc::Shape s, unsigned seed) {
  return sc::tensor(random_values<T>(s.numel(), seed), s);
}

struct ConvCase {
  std::int64_t N, C, H, W, O, kh, kw, stride, pad;
};

/// The textbook 7-loop convolution (cross-correlation), zero padding, in double.
std::vector<double> conv_reference(const std::vector<double>& x, const std::vector<double>& w, const ConvCase& c,
                                   std::int64_t& Ho, std::int64_t& Wo) {
  Ho = (c.H + 2 * c.pad - c.kh) / c.stride + 1;
  Wo = (c.W + 2 * c.pad - c.kw) / c.stride + 1;
  std::vector<double> y(static_cast<std::size_t>(c.N * c.O * Ho * Wo), 0.0);
  for (std::int64_t n = 0; n < c.N; ++n)
    for (std::int64_t o = 0; o < c.O; ++o)
      for (std::int64_t oy = 0; oy < Ho; ++oy)
        for (std::int64_t ox = 0; ox < Wo; ++ox) {
          double s = 0;
          for (std::int64_t ch = 0; ch < c.C; ++ch)
            for (std::int64_t i = 0; i < c.kh; ++i)
              for (std::int64_t j = 0; j < c.kw; ++j) {
                const std::int64_t iy = oy * c.stride - c.pad + i, ix = ox * c.stride - c.pad + j;
                if (iy < 0 || iy >= c.H || ix < 0 || ix >= c.W) continue;
                s += x[((n * c.C + ch) * c.H + iy) * c.W + ix] * w[((o * c.C + ch) * c.kh + i) * c.kw + j];
              }
          y[((n * c.O + o) * Ho + oy) * Wo + ox] = s;
        }
  return y;
}

const std::vector<ConvCase> conv_cases = {
    {2, 3, 5, 5, 4, 3, 3, 1, 0},  {2, 3, 5, 5, 4, 3, 3, 1, 1},  {1, 2, 7, 6, 3, 3, 3, 2, 1},
    {3, 1, 8, 5, 2, 2, 2, 2, 0},  {2, 4, 6, 9, 5, 1, 1, 1, 0},  {2, 4, 6, 9, 5, 1, 1, 2, 0},
    {1, 3, 6, 6, 2, 1, 1, 1, 2},  {2, 2, 5, 7, 3, 3, 3, 2, 2},  {1, 1, 4, 4, 1, 4, 4, 1, 0},
    {2, 3, 4, 4, 2, 5, 5, 1, 1},  {0, 3, 5, 5, 2, 3, 3, 1, 1},  {2, 3, 9, 7, 3, 2, 3, 1, 1},
    {1, 2, 10, 11, 2, 3, 2, 3, 2}, {4, 8, 12, 12, 16, 3, 3, 1, 1}, {2, 1, 28, 28, 1, 5, 5, 1, 2},
};

template <class T>
void check_conv(const ConvCase& c, unsigned seed) {
  const sc::Shape xs{c.N, c.C, c.H, c.W}, ws{c.O, c.C, c.kh, c.kw};
  const auto xv = random_values<T>(xs.numel(), seed), wv = random_values<T>(ws.numel(), seed + 1);
  const sc::Tensor y = sc::nn::conv2d(sc::tensor(xv, xs), sc::tensor(wv, ws), c.stride, c.pad);
  std::int64_t Ho, Wo;
  const auto want = conv_reference({xv.begin(), xv.end()}, {wv.begin(), wv.end()}, c, Ho, Wo);
  INFO("x " << xs << " w " << ws << " stride " << c.stride << " padding " << c.pad << " " << sc::name(y.dtype()));
  REQUIRE(y.dtype() == sc::dtype_of<T>());
  REQUIRE(y.shape() == sc::Shape{c.N, c.O, Ho, Wo});
  const auto got = y.to_vector<double>();
  for (std::size_t i = 0; i < got.size(); ++i) {
    if constexpr (std::is_floating_point_v<T>) REQUIRE(got[i] == Approx(want[i]).margin(1e-4));
    else REQUIRE(got[i] == want[i]);
  }
}

/// conv2d's two gradients by the same seven loops, scattering instead of gathering: dx sums
/// g * w over every (output, kernel tap) that reads a pixel, dw sums g * x over the batch.
void conv_grads_reference(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& g,
                          const ConvCase& c, std::vector<double>& dx, std::vector<double>& dw) {
  const std::int64_t Ho = (c.H + 2 * c.pad - c.kh) / c.stride + 1, Wo = (c.W + 2 * c.pad - c.kw) / c.stride + 1;
  dx.assign(static_cast<std::size_t>(c.N * c.C * c.H * c.W), 0.0);
  dw.assign(static_cast<std::size_t>(c.O * c.C * c.kh * c.kw), 0.0);
  for (std::int64_t n = 0; n < c.N; ++n)
    for (std::int64_t o = 0; o < c.O; ++o)
      for (std::int64_t oy = 0; oy < Ho; ++oy)
        for (std::int64_t ox = 0; ox < Wo; ++ox) {
          const double gv = g[((n * c.O + o) * Ho + oy) * Wo + ox];
          for (std::int64_t ch = 0; ch < c.C; ++ch)
            for (std::int64_t i = 0; i < c.kh; ++i)
              for (std::int64_t j = 0; j < c.kw; ++j) {
                const std::int64_t iy = oy * c.stride - c.pad + i, ix = ox * c.stride - c.pad + j;
                if (iy < 0 || iy >= c.H || ix < 0 || ix >= c.W) continue;
                const std::int64_t xi = ((n * c.C + ch) * c.H + iy) * c.W + ix;
                const std::int64_t wi = ((o * c.C + ch) * c.kh + i) * c.kw + j;
                dx[xi] += gv * w[wi];
                dw[wi] += gv * x[xi];
              }
        }
}

/// conv2d_grad_input and conv2d_grad_filter against the loops, and the tape's gradient of
/// conv2d (which must be these ops) against the same numbers.
template <class T>
void check_conv_grads(const ConvCase& c, unsigned seed) {
  const sc::Shape xs{c.N, c.C, c.H, c.W}, ws{c.O, c.C, c.kh, c.kw};
  const std::int64_t Ho = (c.H + 2 * c.pad - c.kh) / c.stride + 1, Wo = (c.W + 2 * c.pad - c.kw) / c.stride + 1;
  const sc::Shape gs{c.N, c.O, Ho, Wo};
  const auto xv = random_values<T>(xs.numel(), seed), wv = random_values<T>(ws.numel(), seed + 1);
  const auto gv = random_values<T>(gs.numel(), seed + 2);
  std::vector<double> want_dx, want_dw;
  conv_grads_reference({xv.begin(), xv.end()}, {wv.begin(), wv.end()}, {gv.begin(), gv.end()}, c, want_dx, want_dw);
  const sc::Tensor x = sc::tensor(xv, xs), w = sc::tensor(wv, ws), g = sc::tensor(gv, gs);
  INFO("x " << xs << " w " << ws << " stride " << c.stride << " padding " << c.pad << " " << sc::name(x.dtype()));
  const sc::Tensor dx = sc::nn::conv2d_grad_input(g, w, xs, c.stride, c.pad);
  const sc::Tensor dw = sc::nn::conv2d_grad_filter(x, g, ws, c.stride, c.pad);
  REQUIRE(dx.shape() == xs);
  REQUIRE(dw.shape() == ws);
  REQUIRE(dx.dtype() == sc::dtype_of<T>());
  // Small integers (quarters for floats): every product and sum is exact, in any order.
  CHECK(dx.to_vector<double>() == want_dx);
  CHECK(dw.to_vector<double>() == want_dw);
  if constexpr (std::is_floating_point_v<T>) {
    sc::GradientTape tape;
    tape.watch(x);
    tape.watch(w);
    const auto grads = tape.gradient(sc::sum(sc::nn::conv2d(x, w, c.stride, c.pad) * g), {x, w});
    CHECK(grads[0].to_vector<double>() == want_dx);
    CHECK(grads[1].to_vector<double>() == want_dw);
  }
}

/// <a, b> over all elements, in double.
double dot(const sc::Tensor& a, const sc::Tensor& b) {
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  REQUIRE(va.size() == vb.size());
  double s = 0;
  for (std::size_t i = 0; i < va.size(); ++i) s += va[i] * vb[i];
  return s;
}

std::string at(int line) { return "at test_conv_pool.cpp:" + std::to_string(line); }

}  // namespace

TEMPLATE_TEST_CASE("conv2d matches a direct convolution", "[conv]", float, double, std::int32_t) {
  unsigned seed = 10;
  for (const auto& c : conv_cases) check_conv<TestType>(c, seed += 2);
}

// Beyond conv_cases: "same" convolutions (stride 1, W == Wo: the kernels' one-copy path) of
// every kernel size, batches that split into several column groups (the last one partial),
// and a layer whose columns alone exceed the group size.
const std::vector<ConvCase> conv_grad_cases = {
    {3, 1, 6, 6, 2, 3, 3, 1, 1},   {2, 2, 5, 7, 3, 5, 5, 1, 2},   {2, 3, 4, 6, 2, 1, 3, 1, 0},
    {2, 2, 6, 5, 3, 3, 1, 1, 0},   {20, 1, 28, 28, 4, 3, 3, 1, 1}, {2, 16, 28, 28, 3, 3, 3, 1, 1},
    {3, 2, 7, 7, 2, 7, 7, 1, 3},   {2, 3, 6, 6, 4, 1, 1, 1, 0},   {0, 2, 5, 5, 3, 3, 3, 1, 1},
    {2, 2, 5, 5, 0, 3, 3, 1, 1},
    // Large enough to run image chunks on several threads: one image per chunk, and chunks of
    // nine images (the last one partial).
    {8, 16, 28, 28, 16, 3, 3, 1, 1}, {24, 1, 28, 28, 32, 3, 3, 1, 1},
};

TEMPLATE_TEST_CASE("conv2d's gradients match direct loops", "[conv][grad]", float, double, std::int32_t,
                   std::int64_t) {
  unsigned seed = 300;
  for (const auto& c : conv_cases) check_conv_grads<TestType>(c, seed += 3);
  for (const auto& c : conv_grad_cases) check_conv_grads<TestType>(c, seed += 3);
  for (const auto& c : conv_grad_cases) check_conv<TestType>(c, seed += 3);
}

TEST_CASE("conv2d and its gradients give the same bits on 1 and 2 threads", "[conv][grad][threads]") {
  const sc::Tensor x = sc::random::uniform({24, 3, 20, 20}, -1, 1, 5), w = sc::random::uniform({16, 3, 3, 3}, -1, 1, 6);
  const sc::Tensor g = sc::random::uniform({24, 16, 20, 20}, -1, 1, 7);
  std::vector<std::vector<float>> runs;
  sctest::at_threads({1, 2}, [&](int) {
    runs.push_back(sc::nn::conv2d(x, w, 1, 1).to_vector<float>());
    runs.push_back(sc::nn::conv2d_grad_input(g, w, x.shape(), 1, 1).to_vector<float>());
    runs.push_back(sc::nn::conv2d_grad_filter(x, g, w.shape(), 1, 1).to_vector<float>());
  });
  CHECK(runs[0] == runs[3]);
  CHECK(runs[1] == runs[4]);
  CHECK(runs[2] == runs[5]);  // one partial sum per chunk of images, whatever the thread count
}

TEST_CASE("conv2d's gradient ops: errors name the op and the shapes", "[conv][grad][errors]") {
  const auto g = sc::ones({2, 4, 3, 3}), w = sc::ones({4, 3, 3, 3}), x = sc::ones({2, 3, 5, 5});
  CHECK(sc::nn::conv2d_grad_input(g, w, {2, 3, 5, 5}, 1, 0).shape() == sc::Shape{2, 3, 5, 5});
  // Stride 2: inputs of 7 and 8 rows both give 3 output rows; the attribute says which.
  CHECK(sc::nn::conv2d_grad_input(g, w, {2, 3, 7, 7}, 2, 0).shape() == sc::Shape{2, 3, 7, 7});
  CHECK(sc::nn::conv2d_grad_input(g, w, {2, 3, 8, 8}, 2, 0).shape() == sc::Shape{2, 3, 8, 8});
  CHECK_THROWS_WITH(sc::nn::conv2d_grad_input(g, w, {2, 3, 6, 6}, 1, 0),
                    Catch::Contains("[conv2d_grad_input] g has shape [2, 4, 3, 3] but conv2d of [2, 3, 6, 6] with w "
                                    "[4, 3, 3, 3] (stride 1, padding 0) has shape [2, 4, 4, 4]"));
  CHECK_THROWS_WITH(sc::nn::conv2d_grad_input(g, w, {2, 3, 5}, 1, 0),
                    Catch::Contains("[conv2d_grad_input] the input shape must be [N, C, H, W], got [2, 3, 5]"));
  CHECK_THROWS_WITH(sc::nn::conv2d_grad_input(g, sc::ones({4, 2, 3, 3}), {2, 3, 5, 5}, 1, 0),
                    Catch::Contains("[conv2d_grad_input] input has 3 channels but the kernel expects 2"));
  CHECK_THROWS_AS(sc::nn::conv2d_grad_input(g, w, {2, 3, 5, 5}, 0, 0), sc::ValueError);
  CHECK_THROWS_AS(sc::nn::conv2d_grad_input(sc::ones({2, 4, 3, 3}, sc::boolean), w, {2, 3, 5, 5}, 1, 0),
                  sc::DTypeError);
  CHECK(sc::nn::conv2d_grad_filter(x, g, {4, 3, 3, 3}, 1, 0).shape() == sc::Shape{4, 3, 3, 3});
  CHECK_THROWS_WITH(sc::nn::conv2d_grad_filter(x, g, {4, 3, 2, 2}, 1, 0),
                    Catch::Contains("[conv2d_grad_filter] g has shape [2, 4, 3, 3] but conv2d of [2, 3, 5, 5] with w "
                                    "[4, 3, 2, 2] (stride 1, padding 0) has shape [2, 4, 4, 4]"));
  CHECK_THROWS_WITH(sc::nn::conv2d_grad_filter(x, g, {4, 3, 3}, 1, 0),
                    Catch::Contains("[conv2d_grad_filter] the kernel shape must be [O, C, kH, kW], got [4, 3, 3]"));
  CHECK_THROWS_AS(sc::nn::conv2d_grad_filter(x, g, {4, 3, 3, 3}, 1, -1), sc::ValueError);
  CHECK_THROWS_AS(sc::nn::conv2d_grad_filter(sc::Tensor(), g, {4, 3, 3, 3}, 1, 0), sc::ValueError);
  // Mixed dtypes promote, as conv2d's.
  CHECK(sc::nn::conv2d_grad_filter(x, sc::ones({2, 4, 3, 3}, sc::f64), {4, 3, 3, 3}, 1, 0).dtype() == sc::f64);
}

TEST_CASE("conv2d hand-computed values and dtype promotion", "[conv]") {
  // 3x3 input of 1..9, a 2x2 kernel of ones: window sums.
  const auto x = sc::reshape(sc::arange(1.f, 10.f), {1, 1, 3, 3});
  const auto y = sc::nn::conv2d(x, sc::ones({1, 1, 2, 2}));
  CHECK(y.shape() == sc::Shape{1, 1, 2, 2});
  CHECK(y.to_vector<float>() == std::vector<float>{12, 16, 24, 28});
  // padding 1, stride 2 on the same input: the four corners' windows.
  CHECK(sc::nn::conv2d(x, sc::ones({1, 1, 2, 2}), 2, 1).to_vector<float>() == std::vector<float>{1, 5, 11, 28});
  const auto yi = sc::nn::conv2d(sc::ones({1, 1, 3, 3}, sc::i32), sc::ones({1, 1, 2, 2}, sc::f64));
  CHECK(yi.dtype() == sc::f64);
  CHECK(yi.to_vector<double>() == std::vector<double>{4, 4, 4, 4});
}

TEST_CASE("im2col layout and the col2im adjoint identity", "[conv][im2col]") {
  const auto x = sc::reshape(sc::arange(1.f, 10.f), {1, 1, 3, 3});
  const auto cols = sc::im2col(x, 2, 2, 1, 0);
  CHECK(cols.shape() == sc::Shape{1, 4, 4});
  // Rows are kernel offsets (i, j); columns are windows (oy, ox).
  CHECK(cols.to_vector<float>() == std::vector<float>{1, 2, 4, 5, 2, 3, 5, 6, 4, 5, 7, 8, 5, 6, 8, 9});
  const auto padded = sc::im2col(sc::ones({1, 1, 2, 2}), 3, 3, 1, 1);
  CHECK(padded.shape() == sc::Shape{1, 9, 4});
  CHECK(sc::sum(padded).item<float>() == 16.f);  // each pixel lands in 4 windows, padding is 0

  // <im2col(x), y> == <x, col2im(y)> for random x and y: col2im is im2col's transpose.
  struct Case { std::int64_t N, C, H, W, kh, kw, s, p; };
  const std::vector<Case> cases = {{2, 3, 5, 5, 3, 3, 1, 0}, {2, 3, 5, 5, 3, 3, 1, 1}, {1, 2, 7, 6, 3, 3, 2, 1},
                                   {2, 2, 8, 9, 2, 3, 3, 2}, {1, 1, 6, 6, 1, 1, 4, 0}, {3, 2, 5, 4, 4, 2, 1, 2},
                                   {0, 2, 5, 5, 3, 3, 1, 1}};
  unsigned seed = 100;
  for (const Case& c : cases) {
    INFO("N C H W = " << c.N << " " << c.C << " " << c.H << " " << c.W << " kernel " << c.kh << "x" << c.kw
                      << " stride " << c.s << " padding " << c.p);
    const sc::Shape xs{c.N, c.C, c.H, c.W};
    const auto xr = random_tensor<double>(xs, ++seed);
    const auto colr = sc::im2col(xr, c.kh, c.kw, c.s, c.p);
    const auto yr = random_tensor<double>(colr.shape(), ++seed);
    const auto back = sc::col2im(yr, xs, c.kh, c.kw, c.s, c.p);
    REQUIRE(back.shape() == xs);
    CHECK(dot(colr, yr) == Approx(dot(xr, back)).margin(1e-9));
    // integers: exact
    const auto xi = random_tensor<std::int64_t>(xs, ++seed);
    const auto yi = random_tensor<std::int64_t>(colr.shape(), ++seed);
    CHECK(dot(sc::im2col(xi, c.kh, c.kw, c.s, c.p), yi) == dot(xi, sc::col2im(yi, xs, c.kh, c.kw, c.s, c.p)));
  }
  // col2im sums overlapping windows: ones through 2x2 windows over 3x3 count the windows.
  CHECK(sc::col2im(sc::ones({1, 4, 4}), {1, 1, 3, 3}, 2, 2, 1, 0).to_vector<float>() ==
        std::vector<float>{1, 2, 1, 2, 4, 2, 1, 2, 1});
}

namespace {

/// Direct max / mean over kernel x kernel windows, in double.
std::vector<double> pool_reference(const std::vector<double>& x, sc::Shape s, std::int64_t k, std::int64_t stride,
                                   bool is_max, sc::Shape& out) {
  const std::int64_t N = s[0], C = s[1], H = s[2], W = s[3];
  const std::int64_t Ho = (H - k) / stride + 1, Wo = (W - k) / stride + 1;
  out = sc::Shape{N, C, Ho, Wo};
  std::vector<double> y;
  for (std::int64_t nc = 0; nc < N * C; ++nc)
    for (std::int64_t oy = 0; oy < Ho; ++oy)
      for (std::int64_t ox = 0; ox < Wo; ++ox) {
        double acc = is_max ? -std::numeric_limits<double>::infinity() : 0.0;
        for (std::int64_t i = 0; i < k; ++i)
          for (std::int64_t j = 0; j < k; ++j) {
            const double v = x[(nc * H + oy * stride + i) * W + ox * stride + j];
            acc = is_max ? std::max(acc, v) : acc + v;
          }
        y.push_back(is_max ? acc : acc / static_cast<double>(k * k));
      }
  return y;
}

template <class T>
void check_pools(sc::Shape s, std::int64_t k, std::int64_t stride, unsigned seed) {
  const auto xv = random_values<T>(s.numel(), seed);
  const sc::Tensor x = sc::tensor(xv, s);
  for (bool is_max : {true, false}) {
    sc::Shape want_shape;
    const auto want = pool_reference({xv.begin(), xv.end()}, s, k, stride, is_max, want_shape);
    const sc::Tensor y = is_max ? sc::nn::max_pool2d(x, k, stride) : sc::nn::avg_pool2d(x, k, stride);
    INFO((is_max ? "max" : "avg") << " x " << s << " kernel " << k << " stride " << stride << " " << sc::name(x.dtype()));
    REQUIRE(y.shape() == want_shape);
    REQUIRE(y.dtype() == (is_max || std::is_floating_point_v<T> ? x.dtype() : sc::f32));
    const auto got = y.to_vector<double>();
    for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == Approx(want[i]).margin(1e-6));
  }
}

}  // namespace

TEMPLATE_TEST_CASE("pools match direct loops", "[pool]", float, double, std::int32_t) {
  unsigned seed = 200;
  check_pools<TestType>({2, 3, 6, 6}, 2, 2, ++seed);
  check_pools<TestType>({2, 3, 7, 5}, 2, 2, ++seed);  // non-square, floor drops the last row
  check_pools<TestType>({1, 2, 7, 9}, 3, 2, ++seed);  // overlapping windows
  check_pools<TestType>({1, 2, 8, 8}, 2, 3, ++seed);  // gaps between windows
  check_pools<TestType>({3, 1, 5, 5}, 1, 1, ++seed);
  check_pools<TestType>({1, 1, 4, 6}, 4, 1, ++seed);
  check_pools<TestType>({0, 3, 4, 4}, 2, 2, ++seed);  // empty batch
  check_pools<TestType>({8, 16, 28, 28}, 2, 2, ++seed);  // large enough to thread
}

TEST_CASE("max_pool2d propagates NaN and handles -inf", "[pool]") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const auto x = sc::tensor(std::vector<float>{1, nan, 3, 4, -inf, -inf, -inf, -inf}, {1, 2, 2, 2});
  const auto y = sc::nn::max_pool2d(x, 2, 2).to_vector<float>();
  CHECK(std::isnan(y[0]));
  CHECK(y[1] == -inf);
  CHECK(sc::nn::avg_pool2d(sc::reshape(sc::arange(1.f, 17.f), {1, 1, 4, 4}), 2, 2).to_vector<float>() ==
        std::vector<float>{3.5f, 5.5f, 11.5f, 13.5f});
  // Wide rows take the SIMD path: NaN in the top row, the bottom row, and the vector tail.
  for (std::int64_t at_col : {0, 9, 17, 30, 33}) {
    for (std::int64_t at_row : {0, 1}) {
      std::vector<double> v(2 * 34);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i % 7);
      v[static_cast<std::size_t>(at_row * 34 + at_col)] = std::numeric_limits<double>::quiet_NaN();
      const auto m = sc::nn::max_pool2d(sc::tensor(v, {1, 1, 2, 34}), 2, 2).to_vector<double>();
      INFO("NaN at row " << at_row << " column " << at_col);
      for (std::size_t ox = 0; ox < m.size(); ++ox)
        CHECK(std::isnan(m[ox]) == (static_cast<std::int64_t>(ox) == at_col / 2));
    }
  }
}

namespace {

/// max_pool2d's gradient by plain loops: g at each window's first maximum (row-major) or first
/// NaN, summed over overlapping windows, in double.
std::vector<double> pool_grad_reference(const std::vector<double>& g, const std::vector<double>& x, sc::Shape s,
                                        std::int64_t k, std::int64_t stride) {
  const std::int64_t H = s[2], W = s[3], Ho = (H - k) / stride + 1, Wo = (W - k) / stride + 1;
  std::vector<double> dx(x.size(), 0.0);
  for (std::int64_t nc = 0; nc < s[0] * s[1]; ++nc)
    for (std::int64_t oy = 0; oy < Ho; ++oy)
      for (std::int64_t ox = 0; ox < Wo; ++ox) {
        std::size_t best = 0;
        bool first = true;
        for (std::int64_t i = 0; i < k; ++i)
          for (std::int64_t j = 0; j < k; ++j) {
            const auto at = static_cast<std::size_t>((nc * H + oy * stride + i) * W + ox * stride + j);
            if (first || (!std::isnan(x[best]) && (std::isnan(x[at]) || x[at] > x[best]))) best = at;
            first = false;
          }
        dx[best] += g[static_cast<std::size_t>((nc * Ho + oy) * Wo + ox)];
      }
  return dx;
}

template <class T>
void check_pool_grad(sc::Shape s, std::int64_t k, std::int64_t stride, unsigned seed, double nan_every = 0) {
  auto xv = random_values<T>(s.numel(), seed);  // small integers: many ties
  if constexpr (std::is_floating_point_v<T>)
    if (nan_every > 0)
      for (std::size_t i = 0; i < xv.size(); i += static_cast<std::size_t>(nan_every))
        xv[i] = std::numeric_limits<T>::quiet_NaN();
  const sc::Tensor x = sc::tensor(xv, s);
  const sc::Shape gs{s[0], s[1], (s[2] - k) / stride + 1, (s[3] - k) / stride + 1};
  const auto gv = random_values<T>(gs.numel(), seed + 1000);
  const sc::Tensor g = sc::tensor(gv, gs);
  INFO("max_pool2d_grad x " << s << " kernel " << k << " stride " << stride << " " << sc::name(x.dtype()));
  const auto want = pool_grad_reference({gv.begin(), gv.end()}, {xv.begin(), xv.end()}, s, k, stride);
  const sc::Tensor dx = sc::nn::max_pool2d_grad(g, x, k, stride);
  REQUIRE(dx.shape() == s);
  REQUIRE(dx.dtype() == x.dtype());
  CHECK(dx.to_vector<double>() == want);  // small integers: every sum is exact
  // The tape's gradient of max_pool2d is this op; traced, the same numbers.
  if constexpr (std::is_floating_point_v<T>) {
    sc::GradientTape tape;
    tape.watch(x);
    CHECK(tape.gradient(sc::nn::max_pool2d(x, k, stride) * g, x).to_vector<double>() == want);
  }
  auto f = sc::function([k, stride](sc::Tensor a, sc::Tensor b) { return sc::nn::max_pool2d_grad(a, b, k, stride); });
  const sc::Tensor traced = f(g, x);
  CHECK(traced.to_vector<double>() == want);
}

}  // namespace

TEMPLATE_TEST_CASE("max_pool2d_grad matches direct loops", "[pool][grad]", float, double, std::int32_t) {
  unsigned seed = 700;
  check_pool_grad<TestType>({2, 3, 6, 6}, 2, 2, ++seed);
  check_pool_grad<TestType>({2, 3, 7, 5}, 2, 2, ++seed);  // floor drops the last row
  check_pool_grad<TestType>({1, 2, 7, 9}, 3, 2, ++seed);  // overlapping windows accumulate
  check_pool_grad<TestType>({1, 2, 6, 6}, 2, 1, ++seed);  // stride 1: every inner element in 4 windows
  check_pool_grad<TestType>({1, 2, 8, 8}, 2, 3, ++seed);  // gaps between windows: zeros there
  check_pool_grad<TestType>({3, 1, 5, 5}, 1, 1, ++seed);
  check_pool_grad<TestType>({1, 1, 4, 6}, 4, 1, ++seed);
  check_pool_grad<TestType>({0, 3, 4, 4}, 2, 2, ++seed);  // empty batch
  check_pool_grad<TestType>({8, 16, 28, 28}, 2, 2, ++seed);  // large enough to thread
  check_pool_grad<TestType>({2, 3, 6, 6}, 2, 1, ++seed, 7);  // NaN every 7th element (floats)
  check_pool_grad<TestType>({2, 3, 9, 9}, 3, 2, ++seed, 5);
}

TEST_CASE("max_pool2d_grad errors name the op and the shapes", "[pool][grad][errors]") {
  const auto x = sc::ones({1, 2, 4, 4});
  CHECK_THROWS_WITH(sc::nn::max_pool2d_grad(sc::ones({1, 2, 3, 3}), x, 2, 2),
                    Catch::Contains("[max_pool2d_grad] g has shape [1, 2, 3, 3] but max_pool2d of [1, 2, 4, 4] "
                                    "(kernel 2, stride 2) has shape [1, 2, 2, 2]"));
  CHECK_THROWS_AS(sc::nn::max_pool2d_grad(sc::ones({1, 2, 2, 2}, sc::f64), x, 2, 2), sc::DTypeError);
  CHECK_THROWS_AS(sc::nn::max_pool2d_grad(sc::ones({1, 2, 2, 2}), x, 0, 2), sc::ValueError);
  CHECK_THROWS_AS(sc::nn::max_pool2d_grad(sc::ones({2, 2}), sc::ones({4, 4}), 2, 2), sc::ShapeError);
}

TEST_CASE("conv2d errors name the op, the shapes and the user's line", "[conv][errors]") {
  const auto x = sc::ones({2, 3, 5, 5});
  int line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::conv2d(sc::ones({3, 5, 5}), sc::ones({4, 3, 3, 3})),
                    Catch::Contains("[conv2d] expects x as [N, C, H, W] and w as [O, C, kH, kW], got [3, 5, 5] and "
                                    "[4, 3, 3, 3]") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::conv2d(x, sc::ones({4, 3, 3})), sc::ShapeError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::conv2d(x, sc::ones({4, 2, 3, 3})),
                    Catch::Contains("[conv2d] input has 3 channels but the kernel expects 2 (x [2, 3, 5, 5], w "
                                    "[4, 2, 3, 3])") && Catch::Contains(at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::conv2d(x, sc::ones({4, 3, 6, 6})),
                    Catch::Contains("[conv2d] kernel 6x6 is larger than the input [2, 3, 5, 5] padded by 0 (w "
                                    "[4, 3, 6, 6])") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::conv2d(x, sc::ones({4, 3, 6, 6})), sc::ShapeError);
  CHECK_NOTHROW(sc::nn::conv2d(x, sc::ones({4, 3, 6, 6}), 1, 1));  // fits once padded
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::conv2d(x, sc::ones({4, 3, 3, 3}), 0),
                    Catch::Contains("[conv2d] stride must be >= 1, got 0") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::conv2d(x, sc::ones({4, 3, 3, 3}), 0), sc::ValueError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::conv2d(x, sc::ones({4, 3, 3, 3}), 1, -1),
                    Catch::Contains("[conv2d] padding must be >= 0, got -1") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::conv2d(x, sc::ones({4, 3, 3, 3}), 1, -1), sc::ValueError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::conv2d(x, sc::ones({4, 3, 0, 3})),
                    Catch::Contains("[conv2d] kernel must be at least 1x1, got 0x3") && Catch::Contains(at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::conv2d(sc::ones({1, 1, 3, 3}, sc::boolean), sc::ones({1, 1, 2, 2})),
                    Catch::Contains("[conv2d] expects numeric tensors, got bool and f32") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::conv2d(sc::ones({1, 1, 3, 3}, sc::boolean), sc::ones({1, 1, 2, 2})), sc::DTypeError);
}

TEST_CASE("im2col and col2im errors", "[conv][im2col][errors]") {
  int line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::im2col(sc::ones({3, 5, 5}), 3, 3, 1, 0),
                    Catch::Contains("[im2col] expects an input of rank 4 [N, C, H, W], got [3, 5, 5]") &&
                        Catch::Contains(at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::im2col(sc::ones({1, 1, 2, 5}), 3, 3, 1, 0),
                    Catch::Contains("[im2col] kernel 3x3 is larger than the input [1, 1, 2, 5] padded by 0") &&
                        Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::im2col(sc::ones({1, 1, 5, 5}), 3, 3, 0, 0), sc::ValueError);
  CHECK_THROWS_AS(sc::im2col(sc::ones({1, 1, 5, 5}), 3, 3, 1, -2), sc::ValueError);
  CHECK_THROWS_AS(sc::im2col(sc::ones({1, 1, 5, 5}, sc::boolean), 3, 3, 1, 0), sc::DTypeError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::col2im(sc::ones({1, 9, 8}), {1, 1, 5, 5}, 3, 3, 1, 0),
                    Catch::Contains("[col2im] columns have shape [1, 9, 8] but a 3x3 window with stride 1 and "
                                    "padding 0 over [1, 1, 5, 5] needs [1, 9, 9]") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::col2im(sc::ones({1, 9, 9}), {1, 5, 5}, 3, 3, 1, 0), sc::ShapeError);
}

TEST_CASE("pool errors name the op, the shapes and the user's line", "[pool][errors]") {
  int line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::max_pool2d(sc::ones({4, 4}), 2, 2),
                    Catch::Contains("[max_pool2d] expects an input of rank 4 [N, C, H, W], got [4, 4]") &&
                        Catch::Contains(at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::avg_pool2d(sc::ones({1, 1, 3, 5}), 4, 1),
                    Catch::Contains("[avg_pool2d] kernel 4x4 is larger than the input [1, 1, 3, 5] padded by 0") &&
                        Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::avg_pool2d(sc::ones({1, 1, 3, 5}), 4, 1), sc::ShapeError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::max_pool2d(sc::ones({1, 1, 4, 4}), 2, 0),
                    Catch::Contains("[max_pool2d] stride must be >= 1, got 0") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::max_pool2d(sc::ones({1, 1, 4, 4}), 2, 0), sc::ValueError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::avg_pool2d(sc::ones({1, 1, 4, 4}), 0, 1),
                    Catch::Contains("[avg_pool2d] kernel must be >= 1, got 0") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::avg_pool2d(sc::ones({1, 1, 4, 4}), 0, 1), sc::ValueError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::max_pool2d(sc::ones({1, 1, 4, 4}, sc::boolean), 2, 2),
                    Catch::Contains("[max_pool2d] expects a numeric input, got bool") && Catch::Contains(at(line)));
  // avg_pool2d of a bool tensor was promoted to f32 silently (a mask averaged as 0/1 numbers)
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::nn::avg_pool2d(sc::ones({1, 1, 4, 4}, sc::boolean), 2, 2),
                    Catch::Contains("[avg_pool2d] expects a numeric input, got bool") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::avg_pool2d(sc::ones({1, 1, 4, 4}, sc::boolean), 2, 2), sc::DTypeError);
}

// Paddings, strides and kernels near INT64_MAX: the window sizes are checked, not overflowed (UBSan
// reported 2 * padding + H overflowing in Window::make, and ceil(first / stride) in valid_cols).
TEST_CASE("conv2d, im2col and the pools check window sizes that would overflow int64", "[conv][pool][errors]") {
  constexpr std::int64_t big = std::numeric_limits<std::int64_t>::max();
  const auto x = sc::ones({2, 3, 5, 5});
  const auto w = sc::ones({4, 3, 3, 3});
  int line = __LINE__ + 1;
  std::string m = sctest::error_of<sc::ShapeError>([&] { (void)sc::nn::conv2d(x, w, 1, big / 2); });
  CHECK_THAT(m, Catch::Contains("[conv2d] padding 4611686018427387903 on the input [2, 3, 5, 5] overflows int64 "
                                "(w [4, 3, 3, 3])") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::conv2d(x, w, 1, big), sc::ShapeError);
  CHECK_THROWS_AS(sc::nn::conv2d(x, w, big, big), sc::ShapeError);
  // The layer: the error names conv2d at the line that calls the layer.
  sc::nn::Conv2D layer(3, 4, 3, 1, big / 2, 1);
  line = __LINE__ + 1;
  m = sctest::error_of<sc::ShapeError>([&] { (void)layer(x); });
  CHECK_THAT(m, Catch::Contains("[conv2d] padding 4611686018427387903 on the input [2, 3, 5, 5] overflows int64") &&
                    Catch::Contains(at(line)));
  // A padding that fits but gives more windows than a tensor may hold.
  line = __LINE__ + 1;
  m = sctest::error_of<sc::ShapeError>([&] { (void)sc::nn::conv2d(x, w, 1, std::int64_t{1} << 40); });
  CHECK_THAT(m, Catch::Contains("[conv2d] a 3x3 kernel with stride 1 and padding 1099511627776 over the input "
                                "[2, 3, 5, 5] gives 2199023255555x2199023255555 windows of 3 channels: more than "
                                "2^62 window elements an image (w [4, 3, 3, 3])") && Catch::Contains(at(line)));
  // The gradient ops share the check.
  CHECK_THROWS_AS(sc::nn::conv2d_grad_input(sc::ones({2, 4, 1, 1}), w, {2, 3, 5, 5}, 1, big / 2), sc::ShapeError);
  CHECK_THROWS_AS(sc::nn::conv2d_grad_filter(x, sc::ones({2, 4, 1, 1}), {4, 3, 3, 3}, 1, big / 2), sc::ShapeError);
  // So does a traced call, at the user's line.
  auto f = sc::function([&](sc::Tensor a) { return sc::nn::conv2d(a, w, 1, big / 2); });
  line = __LINE__ + 1;
  m = sctest::error_of<sc::ShapeError>([&] { (void)f(x); });
  CHECK_THAT(m, Catch::Contains("[conv2d] padding 4611686018427387903") && Catch::Contains("test_conv_pool.cpp"));

  // A huge stride with a huge padding that fits: one window, all padding (ceil(pad / stride) overflowed).
  const std::int64_t pad = std::int64_t{1} << 61;
  const sc::Tensor y = sc::nn::conv2d(x, w, big, pad);
  CHECK(y.shape() == sc::Shape{2, 4, 1, 1});
  CHECK(y.to_vector<float>() == std::vector<float>(8, 0.f));
  CHECK(sc::im2col(x, 3, 3, big, pad).to_vector<float>() == std::vector<float>(2 * 27, 0.f));
  {
    sc::GradientTape tape;
    tape.watch(x);
    tape.watch(w);
    const auto grads = tape.gradient(sc::sum(sc::nn::conv2d(x, w, big, pad)), {x, w});
    CHECK(grads[0].to_vector<float>() == std::vector<float>(2 * 3 * 5 * 5, 0.f));
    CHECK(grads[1].to_vector<float>() == std::vector<float>(4 * 3 * 3 * 3, 0.f));
  }

  const std::int64_t k31 = std::int64_t{1} << 31;
  line = __LINE__ + 1;
  m = sctest::error_of<sc::ShapeError>([&] { (void)sc::im2col(sc::ones({1, 1, 2, 2}), k31, k31, 1, k31); });
  CHECK_THAT(m, Catch::Contains("[im2col] a 2147483648x2147483648 kernel with stride 1 and padding 2147483648 over "
                                "the input [1, 1, 2, 2]") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::col2im(sc::ones({1, 1, 1}), {1, 1, 2, 2}, 1, 1, 1, big), sc::ShapeError);

  // Pools (no padding): a huge stride is one window per row and column, a huge kernel an error.
  const auto p = sc::reshape(sc::arange(0, 2 * 3 * 25, 1, sc::f32), {2, 3, 5, 5});
  CHECK(sc::nn::max_pool2d(p, 2, big).to_vector<float>() == std::vector<float>{6, 31, 56, 81, 106, 131});
  CHECK(sc::nn::avg_pool2d(p, 5, big).shape() == sc::Shape{2, 3, 1, 1});
  CHECK(sc::nn::max_pool2d_grad(sc::ones({2, 3, 1, 1}), p, 2, big).shape() == p.shape());
  line = __LINE__ + 1;
  m = sctest::error_of<sc::ShapeError>([&] { (void)sc::nn::max_pool2d(p, big, 1); });
  CHECK_THAT(m, Catch::Contains("[max_pool2d] kernel 9223372036854775807x9223372036854775807 is larger than the "
                                "input [2, 3, 5, 5] padded by 0") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::nn::avg_pool2d(p, big, big), sc::ShapeError);
  CHECK_THROWS_AS(sc::nn::max_pool2d_grad(sc::ones({2, 3, 1, 1}), p, big, 1), sc::ShapeError);
}

// The 2x2 / stride-2 fast paths (forward and gradient) on every window pattern drawn from a few
// values: ties, NaN in any position (two NaNs: the first takes the gradient), infinities; and
// gradients that are themselves infinite or NaN land only where they belong (exactly 0 elsewhere).
TEMPLATE_TEST_CASE("max_pool2d 2x2 fast paths: every window pattern", "[pool][grad]", float, double, std::int32_t,
                   std::int64_t) {
  using T = TestType;
  std::vector<T> vals;
  if constexpr (std::is_floating_point_v<T>)
    vals = {T(1), T(2), std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
            -std::numeric_limits<T>::infinity()};
  else
    vals = {T(1), T(2), T(-3), std::numeric_limits<T>::lowest()};
  const std::size_t V = vals.size(), P = V * V * V * V;
  const std::int64_t W = static_cast<std::int64_t>(2 * P) + 1;  // an odd last column no window reads
  std::vector<T> xv(static_cast<std::size_t>(3 * W), T(7));        // and an odd last row
  for (std::size_t p = 0; p < P; ++p) {
    const std::size_t ia = p % V, ib = p / V % V, ic = p / (V * V) % V, id = p / (V * V * V);
    xv[2 * p] = vals[ia];
    xv[2 * p + 1] = vals[ib];
    xv[static_cast<std::size_t>(W) + 2 * p] = vals[ic];
    xv[static_cast<std::size_t>(W) + 2 * p + 1] = vals[id];
  }
  const sc::Shape s{1, 1, 3, W};
  const sc::Tensor x = sc::tensor(xv, s);
  // Forward: the window's max, NaN when any element is NaN.
  const auto y = sc::nn::max_pool2d(x, 2, 2).to_vector<double>();
  REQUIRE(y.size() == P);
  for (std::size_t p = 0; p < P; ++p) {
    const double a = double(xv[2 * p]), b = double(xv[2 * p + 1]);
    const double c = double(xv[W + 2 * p]), d = double(xv[W + 2 * p + 1]);
    INFO("window " << p << ": " << a << " " << b << " " << c << " " << d);
    if (std::isnan(a) || std::isnan(b) || std::isnan(c) || std::isnan(d)) CHECK(std::isnan(y[p]));
    else CHECK(y[p] == std::max(std::max(a, b), std::max(c, d)));
  }
  // Gradient: ordinary values, then infinite and NaN ones (floats).
  std::vector<std::vector<T>> gs = {sctest::small_values<T>(static_cast<std::int64_t>(P), 77, 6, 4)};
  if constexpr (std::is_floating_point_v<T>) {
    std::vector<T> special(P);
    for (std::size_t p = 0; p < P; ++p)
      special[p] = p % 3 == 0   ? std::numeric_limits<T>::infinity()
                   : p % 3 == 1 ? std::numeric_limits<T>::quiet_NaN()
                                : T(-2);
    gs.push_back(special);
  }
  for (const std::vector<T>& gv : gs) {
    const auto want = pool_grad_reference({gv.begin(), gv.end()}, {xv.begin(), xv.end()}, s, 2, 2);
    const auto got = sc::nn::max_pool2d_grad(sc::tensor(gv, sc::Shape{1, 1, 1, static_cast<std::int64_t>(P)}), x, 2, 2)
                         .template to_vector<double>();
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("pixel " << i << " (window " << (i % W) / 2 << ")");
      if (std::isnan(want[i])) CHECK(std::isnan(got[i]));
      else CHECK(got[i] == want[i]);
    }
  }
}

// Integer sums wrap (two's complement) on every path (README): the scatter-adds of col2im (conv2d's
// input gradient) and of max_pool2d_grad, where overlapping windows meet, overflowed as signed
// integers (undefined; -fsanitize=undefined stopped there).
TEMPLATE_TEST_CASE("integer gradients of conv2d and max_pool2d wrap where overlapping windows sum", "[conv][pool][grad]",
                   std::int32_t, std::int64_t) {
  using T = TestType;
  using U = std::make_unsigned_t<T>;
  const T big = std::numeric_limits<T>::max();
  const T four = static_cast<T>(U(4) * static_cast<U>(big));  // big summed four times, wrapped: -4
  const sc::Tensor g = sc::full(sc::Shape{1, 1, 2, 2}, big);
  for (const std::int64_t pad : {0, 1}) {
    // a 2x2 kernel of ones over 3x3 (padded to 5x5: a 4x4 gradient, every pixel in four windows)
    const sc::Tensor gp = pad == 0 ? g : sc::full(sc::Shape{1, 1, 4, 4}, big);
    const std::vector<T> dx =
        sc::nn::conv2d_grad_input(gp, sc::full(sc::Shape{1, 1, 2, 2}, T(1)), sc::Shape{1, 1, 3, 3}, 1, pad).template to_vector<T>();
    INFO("padding " << pad);
    CHECK(dx[4] == four);  // the centre is in all four windows
    CHECK(dx[0] == (pad == 0 ? big : four));
  }
  const sc::Tensor x = sc::reshape(sc::tensor(std::vector<T>{1, 1, 1, 1, 9, 1, 1, 1, 1}), sc::Shape{1, 1, 3, 3});
  const std::vector<T> dp = sc::nn::max_pool2d_grad(g, x, 2, 1).template to_vector<T>();  // the centre 9 is every window's max
  CHECK(dp[4] == four);
  CHECK(dp[0] == T(0));
}
