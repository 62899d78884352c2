// The elements of an eager batch (kernels/batch_elements.cuh), which the GPU's batch kernel and the
// CUDA emulator both run: which ops and dtypes a batch takes (the ones the single kernels take), the
// values of each rule against plain expressions written here, a thread's share of the elements
// (first, step) giving what one thread gives, and broadcasting of a one-element operand.
#include "testing.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "../../kernels/batch_elements.cuh"

namespace {

namespace abi = sc::cuda::abi;
namespace kb = sc::cuda::kernels::batch;
using abi::BatchOp;
using abi::DT;

BatchOp unary_op(abi::UnaryRule r, DT dt, const void* x, void* y, int n) {
  BatchOp op;
  op.kind = BatchOp::unary;
  op.rule = static_cast<std::int8_t>(r);
  op.dt = dt;
  op.a = x;
  op.y = y;
  op.n = n;
  return op;
}

BatchOp binary_op(abi::BinaryRule r, DT dt, const void* a, const void* b, void* y, int n) {
  BatchOp op = unary_op(abi::UnaryRule::Neg, dt, a, y, n);
  op.kind = BatchOp::binary;
  op.rule = static_cast<std::int8_t>(r);
  op.b = b;
  return op;
}

/// Runs op as `threads` threads of a block would (thread t: elements t, t + threads, ...).
void run_as_threads(const BatchOp& op, int threads) {
  for (int t = 0; t < threads; ++t) REQUIRE(kb::run_op<int>(op, nullptr, t, threads, true));
}

constexpr int n = 37;

std::vector<double> inputs(double scale, double shift) {
  std::vector<double> v(n);
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = scale * std::sin(1.3 * i + shift) + (i % 7 == 0 ? 0.0 : 0.1);
  return v;
}

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

}  // namespace

TEST_CASE("eager batch elements: which ops and dtypes a batch takes", "[cuda][batch]") {
  float x[4] = {}, y[4] = {};
  const DT all[] = {DT::b8, DT::i32, DT::i64, DT::f32, DT::f64};
  for (DT dt : all) {
    const bool floating = dt == DT::f32 || dt == DT::f64;
    INFO("dtype " << static_cast<int>(dt));
    CHECK(kb::takes_op(unary_op(abi::UnaryRule::Exp, dt, x, y, 4)) == floating);
    CHECK(kb::takes_op(unary_op(abi::UnaryRule::Neg, dt, x, y, 4)) == (dt != DT::b8));
    CHECK(kb::takes_op(unary_op(abi::UnaryRule::LogicalNot, dt, x, y, 4)));
    CHECK(kb::takes_op(binary_op(abi::BinaryRule::Add, dt, x, x, y, 4)) == (dt != DT::b8));
    CHECK(kb::takes_op(binary_op(abi::BinaryRule::Div, dt, x, x, y, 4)) == floating);
    CHECK(kb::takes_op(binary_op(abi::BinaryRule::Less, dt, x, x, y, 4)));
    CHECK(kb::takes_op(binary_op(abi::BinaryRule::LogicalOr, dt, x, x, y, 4)));
    for (DT to : all) {
      BatchOp c = unary_op(abi::UnaryRule::Neg, dt, x, y, 4);
      c.kind = BatchOp::cast;
      c.out_dt = to;
      CHECK(kb::takes_op(c));
    }
    BatchOp f = unary_op(abi::UnaryRule::Neg, dt, nullptr, y, 4);
    f.kind = BatchOp::fill;
    CHECK(kb::takes_op(f));
  }
  // sizes: at least one element, at most batch_max_elements; rules and dtypes in range
  CHECK_FALSE(kb::takes_op(unary_op(abi::UnaryRule::Neg, DT::f32, x, y, 0)));
  CHECK(kb::takes_op(unary_op(abi::UnaryRule::Neg, DT::f32, x, y, static_cast<int>(abi::batch_max_elements))));
  CHECK_FALSE(kb::takes_op(unary_op(abi::UnaryRule::Neg, DT::f32, x, y, static_cast<int>(abi::batch_max_elements) + 1)));
  CHECK_FALSE(kb::takes_op(unary_op(abi::UnaryRule::count, DT::f32, x, y, 4)));
  CHECK_FALSE(kb::takes_op(binary_op(abi::BinaryRule::count, DT::f32, x, x, y, 4)));
  CHECK_FALSE(kb::takes_op(unary_op(abi::UnaryRule::Neg, static_cast<DT>(9), x, y, 4)));
}

TEST_CASE("eager batch elements: every unary rule on f64 and f32 against plain expressions", "[cuda][batch]") {
  using R = abi::UnaryRule;
  const std::vector<std::pair<R, std::function<double(double)>>> rules = {
      {R::Neg, [](double v) { return -v; }},
      {R::Abs, [](double v) { return std::fabs(v); }},
      {R::Square, [](double v) { return v * v; }},
      {R::Relu, [](double v) { return v > 0 ? v : 0.0; }},
      {R::Sign, [](double v) { return v > 0 ? 1.0 : (v < 0 ? -1.0 : 0.0); }},
      {R::Exp, [](double v) { return std::exp(v); }},
      {R::Log, [](double v) { return std::log(std::fabs(v) + 0.5); }},  // (inputs made positive below)
      {R::Sqrt, [](double v) { return std::sqrt(std::fabs(v) + 0.5); }},
      {R::Tanh, [](double v) { return std::tanh(v); }},
      {R::Sigmoid, sigmoid},
      {R::Sin, [](double v) { return std::sin(v); }},
      {R::Cos, [](double v) { return std::cos(v); }},
      {R::Log1p, [](double v) { return std::log1p(std::fabs(v) + 0.5); }},
      {R::Expm1, [](double v) { return std::expm1(v); }},
      {R::Erf, [](double v) { return std::erf(v); }},
      {R::Floor, [](double v) { return std::floor(v); }},
      {R::Ceil, [](double v) { return std::ceil(v); }},
      {R::Round, [](double v) { return std::nearbyint(v); }},
  };
  const std::vector<double> base = inputs(3.0, 0.2);
  for (const auto& [rule, want] : rules) {
    INFO("rule " << static_cast<int>(rule));
    const bool positive = rule == R::Log || rule == R::Sqrt || rule == R::Log1p;
    std::vector<double> x = base;
    if (positive)
      for (double& v : x) v = std::fabs(v) + 0.5;
    std::vector<float> xf(x.begin(), x.end());
    std::vector<double> y(n, -99.0);
    std::vector<float> yf(n, -99.0f);
    run_as_threads(unary_op(rule, DT::f64, x.data(), y.data(), n), 5);
    run_as_threads(unary_op(rule, DT::f32, xf.data(), yf.data(), n), 3);
    for (int i = 0; i < n; ++i) {
      const double w = want(base[static_cast<std::size_t>(i)]);
      CHECK(y[static_cast<std::size_t>(i)] == Approx(w).epsilon(1e-12).margin(1e-14));
      CHECK(yf[static_cast<std::size_t>(i)] == Approx(w).epsilon(1e-5).margin(1e-6));
    }
  }
  // LogicalNot gives bool
  std::vector<double> x = {0.0, 1.5, -0.0, 2.0};
  bool out[4] = {false, true, false, true};
  run_as_threads(unary_op(R::LogicalNot, DT::f64, x.data(), out, 4), 2);
  CHECK((out[0] && !out[1] && out[2] && !out[3]));
}

TEST_CASE("eager batch elements: every binary rule, with one-element operands, against plain expressions",
          "[cuda][batch]") {
  using R = abi::BinaryRule;
  const std::vector<std::pair<R, std::function<double(double, double)>>> rules = {
      {R::Add, [](double a, double b) { return a + b; }},
      {R::Sub, [](double a, double b) { return a - b; }},
      {R::Mul, [](double a, double b) { return a * b; }},
      {R::Div, [](double a, double b) { return a / b; }},
      {R::Pow, [](double a, double b) { return std::pow(std::fabs(a) + 0.5, b); }},  // (a made positive below)
      {R::Maximum, [](double a, double b) { return a > b ? a : b; }},
      {R::Minimum, [](double a, double b) { return a < b ? a : b; }},
      {R::FloorDiv, [](double a, double b) { return std::floor(a / b); }},
      {R::Mod, [](double a, double b) { return a - b * std::floor(a / b); }},
      {R::Less, [](double a, double b) { return a < b ? 1.0 : 0.0; }},
      {R::LessEqual, [](double a, double b) { return a <= b ? 1.0 : 0.0; }},
      {R::Greater, [](double a, double b) { return a > b ? 1.0 : 0.0; }},
      {R::GreaterEqual, [](double a, double b) { return a >= b ? 1.0 : 0.0; }},
      {R::Equal, [](double a, double b) { return a == b ? 1.0 : 0.0; }},
      {R::NotEqual, [](double a, double b) { return a != b ? 1.0 : 0.0; }},
      {R::LogicalAnd, [](double a, double b) { return a != 0 && b != 0 ? 1.0 : 0.0; }},
      {R::LogicalOr, [](double a, double b) { return a != 0 || b != 0 ? 1.0 : 0.0; }},
      {R::ReluGrad, [](double a, double b) { return b > 0 ? a : 0.0; }},  // (the gradient a where the input b > 0)
  };
  const std::vector<double> a0 = inputs(2.0, 0.0), b0 = inputs(1.5, 0.9);
  for (const auto& [rule, want] : rules) {
    for (int shape = 0; shape < 3; ++shape) {  // both dense, a one element, b one element
      INFO("rule " << static_cast<int>(rule) << ", shape case " << shape);
      std::vector<double> a = a0, b = b0;
      if (rule == R::Pow)
        for (double& v : a) v = std::fabs(v) + 0.5;
      const bool gives_bool = rule >= R::Less && rule <= R::LogicalOr;
      std::vector<double> y(n, -99.0);
      bool yb[n] = {};
      BatchOp op = binary_op(rule, DT::f64, a.data(), b.data(), gives_bool ? static_cast<void*>(yb) : y.data(), n);
      op.a_one = shape == 1;
      op.b_one = shape == 2;
      run_as_threads(op, 4);
      for (int i = 0; i < n; ++i) {
        const auto ia = static_cast<std::size_t>(op.a_one ? 0 : i), ib = static_cast<std::size_t>(op.b_one ? 0 : i);
        const double w = want(a0[ia], b0[ib]);
        const double got = gives_bool ? (yb[i] ? 1.0 : 0.0) : y[static_cast<std::size_t>(i)];
        CHECK(got == Approx(w).epsilon(1e-12).margin(1e-14));
      }
    }
  }
}

TEST_CASE("eager batch elements: integer ops wrap, casts and fills as plain conversions", "[cuda][batch]") {
  const std::int32_t big = std::numeric_limits<std::int32_t>::max();
  std::int32_t a[3] = {big, -5, 7}, b[1] = {3}, y[3] = {};
  BatchOp add = binary_op(abi::BinaryRule::Add, DT::i32, a, b, y, 3);
  add.b_one = true;
  run_as_threads(add, 2);
  CHECK(y[0] == std::numeric_limits<std::int32_t>::min() + 2);
  CHECK(y[1] == -2);
  CHECK(y[2] == 10);
  BatchOp mul = binary_op(abi::BinaryRule::Mul, DT::i32, a, b, y, 3);
  mul.b_one = true;
  run_as_threads(mul, 1);
  CHECK(y[1] == -15);

  const double from[5] = {1.75, -2.5, 0.0, 3e9, -0.25};
  std::int64_t to_i64[5] = {};
  bool to_b8[5] = {};
  float to_f32[5] = {};
  BatchOp c = unary_op(abi::UnaryRule::Neg, DT::f64, from, to_i64, 5);
  c.kind = BatchOp::cast;
  c.out_dt = DT::i64;
  run_as_threads(c, 2);
  CHECK((to_i64[0] == 1 && to_i64[1] == -2 && to_i64[2] == 0 && to_i64[3] == 3000000000LL && to_i64[4] == 0));
  c.out_dt = DT::b8;
  c.y = to_b8;
  run_as_threads(c, 3);
  CHECK((to_b8[0] && to_b8[1] && !to_b8[2] && to_b8[3] && to_b8[4]));
  c.out_dt = DT::f32;
  c.y = to_f32;
  run_as_threads(c, 1);
  CHECK((to_f32[0] == 1.75f && to_f32[3] == 3e9f));

  double filled[6] = {};
  BatchOp f = unary_op(abi::UnaryRule::Neg, DT::f64, nullptr, filled, 6);
  f.kind = BatchOp::fill;
  f.value = -0.5;
  run_as_threads(f, 4);
  for (double v : filled) CHECK(v == -0.5);
}

TEST_CASE("eager batch elements: selects of every dtype, one-element operands, against plain expressions",
          "[cuda][batch]") {
  // y = c ? a : b for a, b and y of each dtype; c, a, b each full or of one element
  bool cs[n];
  for (int i = 0; i < n; ++i) cs[i] = i % 3 != 1;
  const auto check_dtype = [&](auto tag, DT dt) {
    using T = decltype(tag);
    std::vector<T> a(n), b(n), y(n);
    for (int i = 0; i < n; ++i) {
      a[static_cast<std::size_t>(i)] = static_cast<T>(i % 2 == 0);
      b[static_cast<std::size_t>(i)] = static_cast<T>(i % 5 == 0);
      if constexpr (sizeof(T) > 1) {
        a[static_cast<std::size_t>(i)] = static_cast<T>(i * 3 - 40);
        b[static_cast<std::size_t>(i)] = static_cast<T>(1000 - i);
      }
    }
    for (const int ones : {0, 1, 2, 4, 7}) {  // bits: c, a, b of one element
      INFO("dtype " << static_cast<int>(dt) << ", one-element operands " << ones);
      BatchOp op = unary_op(abi::UnaryRule::Neg, dt, a.data(), reinterpret_cast<void*>(y.data()), n);
      op.kind = BatchOp::select;
      op.b = b.data();
      op.c = cs;
      op.rule = (ones & 1) != 0 ? 1 : 0;
      op.a_one = (ones & 2) != 0;
      op.b_one = (ones & 4) != 0;
      REQUIRE(kb::takes_op(op));
      std::fill(y.begin(), y.end(), T{});
      run_as_threads(op, ones + 1);
      for (int i = 0; i < n; ++i) {
        const bool m = cs[op.rule != 0 ? 0 : i];
        const T want = m ? a[static_cast<std::size_t>(op.a_one ? 0 : i)] : b[static_cast<std::size_t>(op.b_one ? 0 : i)];
        CHECK(y[static_cast<std::size_t>(i)] == want);
      }
    }
  };
  check_dtype(std::uint8_t{}, DT::b8);  // (bool's bytes; std::vector<bool> has no data())
  check_dtype(std::int32_t{}, DT::i32);
  check_dtype(std::int64_t{}, DT::i64);
  check_dtype(float{}, DT::f32);
  check_dtype(double{}, DT::f64);
  // NaN and signed zeros pass through unchanged
  const double a[2] = {std::numeric_limits<double>::quiet_NaN(), -0.0}, b[2] = {1.0, 2.0};
  const bool m[2] = {true, true};
  double y[2] = {};
  BatchOp op = unary_op(abi::UnaryRule::Neg, DT::f64, a, y, 2);
  op.kind = BatchOp::select;
  op.b = b;
  op.c = m;
  run_as_threads(op, 1);
  CHECK(std::isnan(y[0]));
  CHECK((y[1] == 0.0 && std::signbit(y[1])));
  // refused: a condition flag other than 0 or 1, sizes outside [1, batch_max_elements]
  op.rule = 2;
  CHECK_FALSE(kb::takes_op(op));
  op.rule = 0;
  op.n = 0;
  CHECK_FALSE(kb::takes_op(op));
  op.n = static_cast<int>(abi::batch_max_elements) + 1;
  CHECK_FALSE(kb::takes_op(op));
}

namespace {

BatchOp reduce_op(abi::ReduceRule r, DT dt, const void* x, void* y, int outer, int red, int inner) {
  BatchOp op = unary_op(abi::UnaryRule::Neg, dt, x, y, outer * inner);
  op.kind = BatchOp::reduce;
  op.rule = static_cast<std::int8_t>(r);
  op.red = red;
  op.inner = inner;
  return op;
}

/// x [outer, red, inner] reduced over its middle axis by plain loops, in double: the sum, max or min.
std::vector<double> reduced(const std::vector<double>& x, abi::ReduceRule r, int outer, int red, int inner) {
  std::vector<double> y;
  for (int o = 0; o < outer; ++o)
    for (int i = 0; i < inner; ++i) {
      double acc = r == abi::ReduceRule::sum ? 0.0 : x[static_cast<std::size_t>(o * red * inner + i)];
      for (int k = 0; k < red; ++k) {
        const double v = x[static_cast<std::size_t>((o * red + k) * inner + i)];
        acc = r == abi::ReduceRule::sum ? acc + v : (r == abi::ReduceRule::max ? std::max(acc, v) : std::min(acc, v));
      }
      y.push_back(acc);
    }
  return y;
}

}  // namespace

TEST_CASE("eager batch elements: sums, maxima and minima over a middle axis against plain loops", "[cuda][batch]") {
  using RR = abi::ReduceRule;
  // (outer, red, inner): a whole tensor, rows, columns, a middle axis, one element each, many outputs
  const int shapes[][3] = {{1, 37, 1}, {1, 4096, 1}, {5, 64, 1}, {1, 33, 7}, {3, 5, 4}, {40, 2, 1}, {2, 1, 9}, {600, 3, 1}};
  for (const auto& sh : shapes) {
    const int outer = sh[0], red = sh[1], inner = sh[2], n = outer * inner;
    std::vector<double> x(static_cast<std::size_t>(outer * red * inner));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::round(8 * std::sin(0.37 * static_cast<double>(i) + 0.1));
    const std::vector<float> xf(x.begin(), x.end());
    const std::vector<std::int32_t> xi(x.begin(), x.end());
    for (RR r : {RR::sum, RR::max, RR::min}) {
      INFO("outer " << outer << ", red " << red << ", inner " << inner << ", rule " << static_cast<int>(r)
                    << ", lanes " << kb::reduce_lanes(n, red));
      const std::vector<double> want = reduced(x, r, outer, red, inner);
      std::vector<double> y(static_cast<std::size_t>(n), -99);
      std::vector<float> yf(static_cast<std::size_t>(n), -99);
      std::vector<std::int32_t> yi(static_cast<std::size_t>(n), -99);
      REQUIRE(kb::takes_op(reduce_op(r, DT::f64, x.data(), y.data(), outer, red, inner)));
      run_as_threads(reduce_op(r, DT::f64, x.data(), y.data(), outer, red, inner), 3);
      run_as_threads(reduce_op(r, DT::f32, xf.data(), yf.data(), outer, red, inner), 1);
      run_as_threads(reduce_op(r, DT::i32, xi.data(), yi.data(), outer, red, inner), 2);
      for (int o = 0; o < n; ++o) {
        const auto k = static_cast<std::size_t>(o);
        CHECK(y[k] == want[k]);  // small integers: every order of adding gives them exactly
        CHECK(yf[k] == static_cast<float>(want[k]));
        CHECK(yi[k] == static_cast<std::int32_t>(want[k]));
      }
    }
  }
  // bool: the sum counts into i64, max and min are any and all
  const bool bits[6] = {false, true, false, false, false, false};
  std::int64_t count[2] = {-1, -1};
  bool any[2] = {}, all[2] = {true, true};
  run_as_threads(reduce_op(RR::sum, DT::b8, bits, count, 2, 3, 1), 1);
  run_as_threads(reduce_op(RR::max, DT::b8, bits, any, 2, 3, 1), 1);
  run_as_threads(reduce_op(RR::min, DT::b8, bits, all, 2, 3, 1), 1);
  CHECK((count[0] == 1 && count[1] == 0));
  CHECK((any[0] && !any[1]));
  CHECK((!all[0] && !all[1]));
  // NaN wins a max and a min; integer sums wrap
  const double with_nan[4] = {1.0, std::nan(""), 3.0, -2.0};
  double mx = 0, mn = 0;
  run_as_threads(reduce_op(RR::max, DT::f64, with_nan, &mx, 1, 4, 1), 1);
  run_as_threads(reduce_op(RR::min, DT::f64, with_nan, &mn, 1, 4, 1), 1);
  CHECK((std::isnan(mx) && std::isnan(mn)));
  const std::int32_t big[2] = {std::numeric_limits<std::int32_t>::max(), 5};
  std::int32_t wrapped = 0;
  run_as_threads(reduce_op(RR::sum, DT::i32, big, &wrapped, 1, 2, 1), 1);
  CHECK(wrapped == std::numeric_limits<std::int32_t>::min() + 4);
  // refused: more than batch_max_elements read, outputs not whole rows of inner, arg reductions
  float f[4] = {};
  CHECK_FALSE(kb::takes_op(reduce_op(RR::sum, DT::f32, f, f, 2, 4096, 1)));
  BatchOp ragged = reduce_op(RR::sum, DT::f32, f, f, 1, 2, 3);
  ragged.n = 4;
  CHECK_FALSE(kb::takes_op(ragged));
  CHECK_FALSE(kb::takes_op(reduce_op(RR::argmax, DT::f32, f, f, 1, 4, 1)));
  CHECK_FALSE(kb::takes_op(reduce_op(RR::sum, DT::f32, f, f, 1, 0, 1)));
}
