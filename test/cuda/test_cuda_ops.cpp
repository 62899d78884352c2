// CUDA == CPU for every op with a CUDA kernel (dtypes, broadcasting), copies, random numbers and tape
// gradients. Needs a GPU: gpu_main.cpp skips every test (exit 77) where none is found.
#include "cuda_testing.hpp"

#include <cmath>
#include <sstream>
#include <string>
#include <tuple>

namespace {
using namespace sctest::cuda;

/// Each kind of launch: dense operands, a tensor and one value either way (the flat kernels, more
/// than one block of them too), broadcasts along some axes (the geometry's kernel).
const std::vector<std::pair<sc::Shape, sc::Shape>> broadcast_pairs = {
    {{2, 3}, {2, 3}}, {{2, 3}, {3}}, {{4, 1, 3}, {2, 1}}, {{}, {2, 2}}, {{3, 1, 2, 1, 2, 1, 2, 2}, {2, 1, 2, 2, 1, 2}},
    {{3, 4}, {1, 1}}, {{300, 5}, {}}, {{1}, {70, 9}}, {{129, 3}, {129, 3}}};

}  // namespace

TEST_CASE("cuda: copies round-trip host -> device -> device -> host", "[cuda]") {
  for (const sc::DType d : {sc::boolean, sc::i32, sc::i64, sc::f32, sc::f64}) {
    const sc::Tensor x = values({3, 5}, d, 1);
    const sc::Tensor g = x.to(gpu);
    CHECK(g.device() == gpu);
    const sc::Tensor back = g.to(gpu).to(sc::Device::cpu());
    CHECK(back.to_vector<double>() == x.to_vector<double>());
    CHECK(g.to_vector<double>() == x.to_vector<double>());  // to_vector copies to the host itself
  }
  const sc::Tensor big = sc::random::uniform({1 << 23}, 0, 1, 3);  // above the pinned staging size
  CHECK(big.to(gpu).to_vector<float>() == big.to_vector<float>());
  CHECK(sc::scalar(4.f).to(gpu).item<float>() == 4.f);
  std::ostringstream os;
  os << sc::tensor({1.f, 2.f}).to(gpu);
  CHECK_THAT(os.str(), Catch::Contains("1.") && Catch::Contains("device=cuda:0"));
}

TEST_CASE("cuda: uploads back to back leave no error for the next launch", "[cuda]") {
  // The second upload finds the first's staging buffer still copying (its event not ready): that
  // status must not be left for the next kernel's launch check to report as its own error.
  for (int round = 0; round < 3; ++round) {
    const sc::Tensor x = values({1 << 21}, sc::f32, 80 + round), y = values({1 << 21}, sc::f32, 90 + round);
    const sc::Tensor xg = x.to(gpu), yg = y.to(gpu);  // 8 MiB each: staged through pinned buffers
    check_same(xg + yg, x + y, 0);
  }
}

TEST_CASE("cuda: unary ops == CPU", "[cuda]") {
  using U = sc::Tensor (*)(const sc::Tensor&, std::source_location);
  const std::vector<std::pair<const char*, U>> floating = {
      {"exp", sc::exp}, {"tanh", sc::tanh}, {"sigmoid", sc::sigmoid}, {"sin", sc::sin}, {"cos", sc::cos},
      {"log1p", sc::log1p}, {"expm1", sc::expm1}, {"erf", sc::erf}};
  const std::vector<std::pair<const char*, U>> numeric = {
      {"neg", sc::neg},     {"abs", sc::abs},   {"square", sc::square}, {"relu", sc::relu},
      {"sign", sc::sign},   {"floor", sc::floor}, {"ceil", sc::ceil},   {"round", sc::round}};
  for (const sc::DType d : {sc::i32, sc::i64, sc::f32, sc::f64}) {
    for (const sc::Shape& s : {sc::Shape{}, sc::Shape{7}, sc::Shape{3, 4, 5}, sc::Shape{600}}) {
      for (auto [name, f] : numeric) {
        INFO(name << " " << sc::name(d) << " " << sctest::str(s));
        same_on_gpu([f](const auto& in) { return f(in[0], std::source_location::current()); }, {values(s, d, 2)}, tol_of(d));
      }
      if (!sc::is_floating(d)) continue;
      for (auto [name, f] : floating) {
        INFO(name << " " << sc::name(d));
        same_on_gpu([f](const auto& in) { return f(in[0], std::source_location::current()); }, {values(s, d, 3)}, tol_of(d));
      }
      same_on_gpu([](const auto& in) { return sc::log(sc::abs(in[0]) + 0.5); }, {values(s, d, 4)}, tol_of(d));
      same_on_gpu([](const auto& in) { return sc::sqrt(sc::abs(in[0])); }, {values(s, d, 5)}, tol_of(d));
    }
  }
  for (const sc::DType d : {sc::boolean, sc::i32, sc::f64})
    same_on_gpu([](const auto& in) { return sc::logical_not(in[0]); }, {values({9}, d, 6)}, 0);
}

TEST_CASE("cuda: binary ops == CPU with broadcasting", "[cuda]") {
  const std::vector<std::pair<const char*, Fn>> arithmetic = {
      {"add", [](const auto& in) { return in[0] + in[1]; }},
      {"sub", [](const auto& in) { return in[0] - in[1]; }},
      {"mul", [](const auto& in) { return in[0] * in[1]; }},
      {"maximum", [](const auto& in) { return sc::maximum(in[0], in[1]); }},
      {"minimum", [](const auto& in) { return sc::minimum(in[0], in[1]); }},
      {"pow", [](const auto& in) { return sc::pow(sc::abs(in[0]), in[1]); }},
      {"div", [](const auto& in) { return in[0] / (sc::abs(in[1]) + 1); }},
      {"floor_div", [](const auto& in) { return sc::floor_div(in[0] * 3, sc::abs(in[1]) + 1); }},
      {"mod", [](const auto& in) { return sc::mod(in[0] * 3, sc::abs(in[1]) + 1); }},
      {"mod negative", [](const auto& in) { return sc::mod(in[0], -(sc::abs(in[1]) + 1)); }}};
  const std::vector<std::pair<const char*, Fn>> to_bool = {
      {"less", [](const auto& in) { return in[0] < in[1]; }},
      {"less_equal", [](const auto& in) { return in[0] <= in[1]; }},
      {"greater", [](const auto& in) { return in[0] > in[1]; }},
      {"greater_equal", [](const auto& in) { return in[0] >= in[1]; }},
      {"equal", [](const auto& in) { return in[0] == in[1]; }},
      {"not_equal", [](const auto& in) { return in[0] != in[1]; }},
      {"logical_and", [](const auto& in) { return sc::logical_and(in[0], in[1]); }},
      {"logical_or", [](const auto& in) { return sc::logical_or(in[0], in[1]); }}};
  for (const sc::DType d : {sc::i32, sc::i64, sc::f32, sc::f64}) {
    for (const auto& [sa, sb] : broadcast_pairs) {
      const std::vector<sc::Tensor> in = {values(sa, d, 7), values(sb, d, 8)};
      for (const auto& [name, f] : arithmetic) {
        INFO(name << " " << sc::name(d) << " " << sctest::str(sa) << " " << sctest::str(sb));
        same_on_gpu(f, in, sc::is_floating(d) ? 1e-5 : 0);
      }
      for (const auto& [name, f] : to_bool) {
        INFO(name << " " << sc::name(d));
        same_on_gpu(f, in, 0);
      }
    }
  }
  same_on_gpu([](const auto& in) { return in[0] == in[1]; }, {values({5}, sc::boolean, 9), values({5}, sc::boolean, 10)}, 0);
  same_on_gpu([](const auto& in) { return in[0] * 2.5 + 1; }, {values({4, 4}, sc::f64, 11)}, 0);  // weak scalars
  const sc::Tensor nan = sc::tensor({NAN, 1.f, -2.f});
  same_on_gpu([](const auto& in) { return sc::maximum(in[0], in[1]); }, {nan, sc::tensor({0.f, NAN, 3.f})}, 0);
}

TEST_CASE("cuda: where, cast and fill == CPU", "[cuda]") {
  for (const sc::DType d : {sc::i32, sc::i64, sc::f32, sc::f64}) {
    same_on_gpu([](const auto& in) { return sc::where(in[0] > 0, in[1], in[2]); },
                {values({3, 1}, sc::f32, 12), values({4}, d, 13), values({3, 4}, d, 14)}, 0);
    same_on_gpu([](const auto& in) { return sc::where(in[0], in[1], in[2]); },  // a non-bool condition
                {values({2, 3}, sc::i32, 15), values({2, 3}, d, 16), values({}, d, 17)}, 0);
    for (const sc::DType to : {sc::boolean, sc::i32, sc::i64, sc::f32, sc::f64})
      same_on_gpu([to](const auto& in) { return sc::cast(in[0], to); }, {values({11}, d, 18)}, 0);
  }
  for (const sc::DType d : {sc::boolean, sc::i32, sc::i64, sc::f32, sc::f64}) {
    const sc::Tensor want = sc::detail::fill({2, 5}, 3.0, d);
    sc::DeviceScope on(gpu);
    check_same(sc::detail::fill({2, 5}, 3.0, d), want, 0);
  }
}

TEST_CASE("cuda: sum, max and min over axes == CPU", "[cuda]") {
  const std::vector<std::vector<std::int64_t>> axes = {{}, {0}, {1}, {-1}, {0, 2}, {1, 2}};
  for (const sc::DType d : {sc::boolean, sc::i32, sc::i64, sc::f32, sc::f64}) {
    const sc::Tensor x = values({5, 300, 3}, d, 19);
    for (const auto& ax : axes)
      for (const bool keep : {false, true}) {
        INFO(sc::name(d) << " axes " << ax.size() << " keepdims " << keep);
        // Sums add in another order than the CPU's: f32 agrees to rounding of the partial sums.
        same_on_gpu([&](const auto& in) { return sc::sum(in[0], ax, keep); }, {x}, d == sc::f32 ? 1e-4 : d == sc::f64 ? 1e-12 : 0);
        if (d == sc::boolean) continue;
        same_on_gpu([&](const auto& in) { return sc::max(in[0], ax, keep); }, {x}, 0);
        same_on_gpu([&](const auto& in) { return sc::min(in[0], ax, keep); }, {x}, 0);
      }
  }
  same_on_gpu([](const auto& in) { return sc::max(in[0]); }, {sc::tensor({1.f, NAN, 3.f})}, 0);
  same_on_gpu([](const auto& in) { return sc::sum(in[0], {1}); }, {sc::zeros({3, 0})}, 0);
}

TEST_CASE("cuda: a few long rows, cut in pieces a second kernel combines, reduce as on the CPU", "[cuda]") {
  // A whole tensor of 2^22 (1024 pieces), three rows of 100000 (pieces of 4352, the last shorter),
  // and three strided columns of 100000; small integers tie, so argmax/argmin must keep the first
  // index across pieces.
  for (const sc::DType d : {sc::boolean, sc::i32, sc::i64, sc::f32, sc::f64}) {
    INFO(sc::name(d));
    const double tol = d == sc::f32 ? 1e-4 : d == sc::f64 ? 1e-12 : 0;
    const sc::Tensor whole = values({1 << 22}, d, 31), rows = values({3, 100000}, d, 32), cols = values({100000, 3}, d, 33);
    same_on_gpu([](const auto& in) { return sc::sum(in[0]); }, {whole}, tol);
    same_on_gpu([](const auto& in) { return sc::sum(in[0], {1}); }, {rows}, tol);
    same_on_gpu([](const auto& in) { return sc::sum(in[0], {0}); }, {cols}, tol);
    if (d == sc::boolean) continue;
    same_on_gpu([](const auto& in) { return sc::max(in[0]); }, {whole}, 0);
    same_on_gpu([](const auto& in) { return sc::min(in[0], {1}); }, {rows}, 0);
    same_on_gpu([](const auto& in) { return sc::max(in[0], {0}); }, {cols}, 0);
    same_on_gpu([](const auto& in) { return sc::argmax(in[0], 1); }, {rows}, 0);
    same_on_gpu([](const auto& in) { return sc::argmin(in[0], 0); }, {cols}, 0);
    same_on_gpu([](const auto& in) { return sc::argmax(in[0], 0); }, {whole}, 0);
  }
  // NaN in one piece's middle propagates through max and is argmax's answer.
  std::vector<float> v = values({3, 100000}, sc::f32, 34).to_vector<float>();
  v[50000] = v[2 * 100000 + 99999] = std::nanf("");
  const sc::Tensor x = sc::tensor(v, sc::Shape{3, 100000});
  same_on_gpu([](const auto& in) { return sc::max(in[0], {1}); }, {x}, 0);
  same_on_gpu([](const auto& in) { return sc::argmax(in[0], 1); }, {x}, 0);
  same_on_gpu([](const auto& in) { return sc::argmin(in[0], 1); }, {x}, 0);
}

TEST_CASE("cuda: matmul and batched matmul with transpose flags == CPU", "[cuda]") {
  struct Case { sc::Shape a, b; bool ta, tb; };
  const std::vector<Case> cases = {{{3, 4}, {4, 5}, false, false}, {{4, 3}, {4, 5}, true, false},
                                   {{3, 4}, {5, 4}, false, true},  {{4, 3}, {5, 4}, true, true},
                                   {{2, 3, 4}, {4, 5}, false, false}, {{2, 1, 3, 4}, {3, 4, 5}, false, false},
                                   {{4}, {4, 5}, false, false},    {{2, 3, 4}, {4}, false, false},
                                   {{6, 0}, {0, 2}, false, false}};
  for (const sc::DType d : {sc::i32, sc::i64, sc::f32, sc::f64})
    for (const Case& c : cases) {
      INFO(sctest::str(c.a) << " x " << sctest::str(c.b) << " " << c.ta << c.tb << " " << sc::name(d));
      same_on_gpu([&](const auto& in) { return sc::matmul(in[0], in[1], c.ta, c.tb); },
                  {values(c.a, d, 20), values(c.b, d, 21)}, sc::is_floating(d) ? 1e-5 : 0);
    }
}

TEST_CASE("cuda: a float product with an extent over 2^31 - 1 is a ShapeError naming the operands", "[cuda]") {
  // cuBLAS counts in int. K = 2^31: two 8 GiB operands, refused before anything is queued.
  sc::DeviceScope on(gpu);
  sc::Tensor a, b;
  try {
    a = sc::zeros({1, std::int64_t{1} << 31}, sc::f32);
    b = sc::zeros({std::int64_t{1} << 31, 1}, sc::f32);
  } catch (const sc::DeviceError& e) {  // a device of less than 16 GiB (the emulator's 4 GiB)
    REQUIRE_THAT(e.what(), Catch::Contains("out of memory"));
    WARN("skipped: the two 8 GiB operands do not fit on this device");
    return;
  }
  CHECK_THROWS_AS(sc::matmul(a, b), sc::ShapeError);
  CHECK_THROWS_WITH(sc::matmul(a, b), Catch::Contains("[matmul] inner or column dimension above 2^31 - 1 in "
                                                      "[1, 2147483648] x [2147483648, 1]"));
  // M = 2^31 rows: the shape check lets it through (the CPU splits such a product), cuBLAS cannot.
  const sc::Tensor tall = sc::zeros({std::int64_t{1} << 31, 1}, sc::f32), one = sc::zeros({1, 1}, sc::f32);
  CHECK_THROWS_WITH(sc::matmul(tall, one), Catch::Contains("[matmul] cuBLAS takes matrix extents up to 2^31 - 1: the "
                                                           "product of [2147483648, 1] and [1, 1] on cuda:0"));
  sc::cuda::synchronize();  // nothing was queued that fails
}

TEST_CASE("cuda: random numbers equal the CPU's for the same seed", "[cuda]") {
  for (const sc::DType d : {sc::f32, sc::f64}) {
    const sc::Tensor n = sc::random::normal({1001}, 42, 0.5, 2.0, d);
    const sc::Tensor u = sc::random::uniform({1001}, -1.0, 3.0, 42, d);
    const sc::Tensor u3 = sc::random::uniform({1001}, -1.0, 2.3, 42, d);  // a width whose product rounds
    sc::DeviceScope on(gpu);
    // Uniform is exact arithmetic (no fused multiply-add on either side); normal goes through
    // log/cos/sin, whose last bits may differ in f64 (CUDA's libm is within 1-2 ulp).
    check_same(sc::random::uniform({1001}, -1.0, 3.0, 42, d), u, 0);
    check_same(sc::random::uniform({1001}, -1.0, 2.3, 42, d), u3, 0);
    check_same(sc::random::normal({1001}, 42, 0.5, 2.0, d), n, d == sc::f32 ? 1e-6 : 1e-14);
  }
}

TEST_CASE("cuda: tape gradients of GPU tensors equal the CPU's", "[cuda]") {
  const sc::Tensor x = values({3, 4}, sc::f64, 22), w = values({4, 4}, sc::f64, 23);
  const auto step = [](const sc::Tensor& xx, const sc::Tensor& ww) {
    sc::GradientTape tape;
    tape.watch(xx);
    tape.watch(ww);
    const sc::Tensor y = sc::sum(sc::tanh(sc::matmul(xx, ww)) + sc::maximum(xx, 0.25) * sc::exp(xx * 0.1));
    return tape.gradient(y, std::vector<sc::Tensor>{xx, ww});
  };
  const auto want = step(x, w);
  const auto got = step(x.to(gpu), w.to(gpu));
  REQUIRE(got.size() == 2);
  check_same(got[0], want[0], 1e-12);
  check_same(got[1], want[1], 1e-12);
}

using sctest::cuda::algorithm_name;
using sctest::cuda::ConvAlgorithmScope;

TEST_CASE("cuda: conv2d, its gradient ops, im2col and col2im == CPU (cuDNN and im2col)", "[cuda][conv]") {
  struct Case { sc::Shape x, w; std::int64_t stride, pad; };
  const std::vector<Case> cases = {{{2, 3, 7, 6}, {4, 3, 3, 2}, 1, 1}, {{2, 3, 8, 8}, {5, 3, 3, 3}, 2, 1},
                                   {{1, 2, 5, 5}, {3, 2, 1, 1}, 1, 0}, {{2, 3, 9, 7}, {2, 3, 3, 3}, 3, 0},
                                   {{4, 16, 28, 28}, {8, 16, 3, 3}, 1, 1}, {{0, 3, 5, 5}, {2, 3, 3, 3}, 1, 1},
                                   {{32, 1, 28, 28}, {8, 1, 5, 5}, 1, 2}};
  if (sc::cuda::cudnn_version() == 0) WARN("cuDNN is not used here: " << sc::cuda::cudnn_status());
  for (const sc::cuda::ConvAlgorithm algo : {sc::cuda::ConvAlgorithm::cudnn, sc::cuda::ConvAlgorithm::im2col})
    for (const sc::DType d : {sc::i32, sc::f32, sc::f64})
      for (const Case& c : cases) {
        INFO("x " << sctest::str(c.x) << " w " << sctest::str(c.w) << " stride " << c.stride << " pad " << c.pad << " "
                  << sc::name(d) << " " << algorithm_name(algo));
        const ConvAlgorithmScope scope(algo);
        sc::cuda::reset_conv_stats();
        const double tol = sc::is_floating(d) ? 1e-4 : 0;
        const std::int64_t ho = (c.x[2] + 2 * c.pad - c.w[2]) / c.stride + 1;
        const std::int64_t wo = (c.x[3] + 2 * c.pad - c.w[3]) / c.stride + 1;
        const sc::Shape gs{c.x[0], c.w[0], ho, wo};
        same_on_gpu([&](const auto& in) { return sc::nn::conv2d(in[0], in[1], c.stride, c.pad); },
                    {values(c.x, d, 30), values(c.w, d, 31)}, tol);
        same_on_gpu([&](const auto& in) { return sc::nn::conv2d_grad_input(in[0], in[1], c.x, c.stride, c.pad); },
                    {values(gs, d, 32), values(c.w, d, 33)}, tol);
        same_on_gpu([&](const auto& in) { return sc::nn::conv2d_grad_filter(in[0], in[1], c.w, c.stride, c.pad); },
                    {values(c.x, d, 34), values(gs, d, 35)}, tol);
        same_on_gpu([&](const auto& in) { return sc::im2col(in[0], c.w[2], c.w[3], c.stride, c.pad); },
                    {values(c.x, d, 36)}, 0);
        const sc::Shape cs{c.x[0], c.x[1] * c.w[2] * c.w[3], ho * wo};
        same_on_gpu([&](const auto& in) { return sc::col2im(in[0], c.x, c.w[2], c.w[3], c.stride, c.pad); },
                    {values(cs, d, 37)}, tol);
        // The three passes went where the setting sends them: cuDNN takes f32 when it is loaded
        // (f64 too, unless its heuristic has no full-precision deterministic algorithm: then im2col).
        const sc::cuda::ConvStats st = sc::cuda::conv_stats();
        const bool cudnn_may = algo == sc::cuda::ConvAlgorithm::cudnn && sc::is_floating(d) && sc::cuda::cudnn_version() > 0;
        CHECK(st.cudnn + st.im2col == (c.x[0] > 0 ? 3 : 0));  // an empty batch runs no pass
        if (!cudnn_may) CHECK(st.cudnn == 0);
        if (cudnn_may && d == sc::f32) CHECK(st.im2col == 0);
        if (cudnn_may && d == sc::f64 && st.im2col > 0) WARN(st.im2col << " of 3 f64 passes fell back to im2col");
      }
}

TEST_CASE("cuda: the pools and max_pool2d's gradient == CPU (ties, NaN)", "[cuda][pool]") {
  struct Case { sc::Shape x; std::int64_t k, stride; };
  const std::vector<Case> cases = {{{2, 3, 8, 8}, 2, 2}, {{2, 3, 7, 6}, 3, 2}, {{1, 2, 5, 5}, 2, 1},
                                   {{1, 1, 2, 9}, 2, 3}, {{32, 8, 28, 28}, 2, 2}, {{0, 2, 4, 4}, 2, 2}};
  for (const sc::DType d : {sc::i32, sc::f32, sc::f64})
    for (const Case& c : cases) {
      INFO("x " << sctest::str(c.x) << " k " << c.k << " stride " << c.stride << " " << sc::name(d));
      // Integers in [-6, 6]: many ties, so the first-maximum rule is exercised.
      const sc::Tensor x = values(c.x, sc::i32, 40).astype(d);
      const std::int64_t ho = (c.x[2] - c.k) / c.stride + 1, wo = (c.x[3] - c.k) / c.stride + 1;
      const sc::Tensor g = values({c.x[0], c.x[1], ho, wo}, d, 41);
      same_on_gpu([&](const auto& in) { return sc::nn::max_pool2d(in[0], c.k, c.stride); }, {x}, 0);
      same_on_gpu([&](const auto& in) { return sc::nn::avg_pool2d(in[0], c.k, c.stride); }, {x}, 1e-6);
      same_on_gpu([&](const auto& in) { return sc::nn::max_pool2d_grad(in[0], in[1], c.k, c.stride); }, {g, x}, 1e-6);
    }
  // NaN wins the forward max and takes the gradient (the first NaN of a window).
  const sc::Tensor xn =
      sc::tensor(std::vector<float>{1.f, NAN, 3.f, NAN, 5.f, 6.f, 7.f, 8.f, 9.f}, sc::Shape{1, 1, 3, 3});
  same_on_gpu([](const auto& in) { return sc::nn::max_pool2d(in[0], 2, 1); }, {xn}, 0);
  same_on_gpu([](const auto& in) { return sc::nn::max_pool2d_grad(in[0], in[1], 2, 1); },
              {sc::ones({1, 1, 2, 2}), xn}, 0);
}

TEST_CASE("cuda: a conv -> relu -> max-pool step's tape gradients equal the CPU's", "[cuda][conv]") {
  const sc::Tensor x = values({4, 2, 10, 10}, sc::f64, 50), w = values({3, 2, 3, 3}, sc::f64, 51);
  const auto step = [](const sc::Tensor& xx, const sc::Tensor& ww) {
    sc::GradientTape tape;
    tape.watch(xx);
    tape.watch(ww);
    const sc::Tensor y = sc::sum(sc::nn::max_pool2d(sc::relu(sc::nn::conv2d(xx, ww, 1, 1)), 2, 2));
    return tape.gradient(y, std::vector<sc::Tensor>{xx, ww});
  };
  const auto want = step(x, w);
  for (const sc::cuda::ConvAlgorithm algo : {sc::cuda::ConvAlgorithm::cudnn, sc::cuda::ConvAlgorithm::im2col}) {
    INFO(algorithm_name(algo));
    const ConvAlgorithmScope scope(algo);
    const auto got = step(x.to(gpu), w.to(gpu));
    REQUIRE(got.size() == 2);
    check_same(got[0], want[0], 1e-10);
    check_same(got[1], want[1], 1e-10);
  }
}

TEST_CASE("cuda: a rank-0 CPU tensor joins a GPU op as a number would, other mixes are DeviceErrors", "[cuda]") {
  const sc::Tensor x = values({3, 4}, sc::f32, 71);
  const sc::Tensor xg = x.to(gpu);
  sc::reset_device_stats();
  const sc::Tensor two = sc::scalar(2.0f);  // on the CPU
  check_same(xg * two, x * two, 0);
  check_same(two - xg, two - x, 0);
  check_same(sc::where(xg > 0, xg, two), sc::where(x > 0, x, two), 0);
  CHECK(sc::device_stats().implicit_copies == 0);  // as a C++ number's, not counted
  sc::set_strict_device_placement(true);
  CHECK_NOTHROW(xg * two);
  sc::set_strict_device_placement(false);
  // Any other tensor stays where it is: an error naming both devices and the line.
  const sc::Tensor row = values({4}, sc::f32, 72);
  const int line = __LINE__ + 1;
  CHECK_THROWS_WITH(xg + row, Catch::Contains("[add] inputs are on different devices (cuda:0 and cpu)") &&
                                  Catch::Contains("test_cuda_ops.cpp:" + std::to_string(line)));
  CHECK_THROWS_AS(row + xg, sc::DeviceError);
  // An eager sc::cond reads a GPU predicate back; a Variable can start on the GPU and stays there.
  const sc::Tensor r = sc::cond(sc::sum(xg) > -1000.f, [&] { return xg * 3.f; }, [&] { return xg; });
  check_same(r, x * 3.f, 0);
  sc::Variable v(xg, "v");
  CHECK(v.device() == gpu);
  check_same(v.value(), x, 0);
}

TEST_CASE("cuda: a traced graph with GPU constants prints without reading them back", "[cuda]") {
  auto f = sc::function([](sc::Tensor a) { return a * 2.f + 1.f; });
  const sc::Tensor x = values({6}, sc::f32, 73);
  const sc::Tensor y = f(x.to(gpu));
  check_same(y, x * 2.f + 1.f, 0);
  const std::string text = f.get_concrete(x.to(gpu)).graph().str();
  INFO(text);
  CHECK(text.find("value on cuda:0>") != std::string::npos);
}

TEST_CASE("cuda: two devices: copies between them, ops on the second, a scope moving inputs over", "[cuda]") {
  // Runs where two GPUs are found (the emulator's test preset has two: STAGECRAFT_EMU_DEVICES=2).
  if (sc::cuda::device_count() < 2) {
    WARN("skipped: one CUDA device");
    return;
  }
  const sc::Device second = sc::Device::cuda(1);
  const sc::Tensor a = values({5, 7}, sc::f32, 75), b = values({7}, sc::f32, 76);
  const sc::Tensor a1 = a.to(gpu).to(second), b1 = b.to(second);  // device to device, then host to device
  CHECK(a1.device() == second);
  const sc::Tensor y = sc::exp(a1) * b1 - sc::sum(a1, {1}, true);
  CHECK(y.device() == second);
  const auto close = [](const sc::Tensor& got, const sc::Tensor& want) {
    const auto g = got.to_vector<float>(), w = want.to_vector<float>();
    for (std::size_t i = 0; i < w.size(); ++i) CHECK(g[i] == Approx(w[i]).margin(1e-5));
  };
  close(y, sc::exp(a) * b - sc::sum(a, {1}, true));
  // Inputs on cuda:0 and cuda:1 meet only where a scope says where the op goes.
  CHECK_THROWS_AS(a.to(gpu) + b1, sc::DeviceError);
  const sc::Tensor a0 = a.to(gpu), sum = a + b;
  sc::reset_device_stats();
  sc::Tensor z;
  {
    sc::DeviceScope on(second);
    z = a0 + b1;  // cuda:0's input copied over, counted
  }
  CHECK(sc::device_stats().implicit_copies == 1);
  CHECK(z.device() == second);
  CHECK(z.to_vector<float>() == sum.to_vector<float>());
  // Traced on the second device: its plan and buffers there.
  auto f = sc::function([](const sc::Tensor& x, const sc::Tensor& c) { return sc::tanh(x * c) + 1.f; });
  const sc::Tensor t = f(a1, b1);
  CHECK(t.device() == second);
  close(t, f(a, b));
}

TEST_CASE("cuda: implicit copies are counted, and strict placement makes them errors", "[cuda]") {
  const sc::Tensor host = values({3, 4}, sc::f32, 70);
  sc::reset_device_stats();
  {
    sc::DeviceScope on(gpu);
    const sc::Tensor y = host + host;  // the op goes to the GPU: both inputs are copied
    CHECK(y.device() == gpu);
  }
  CHECK(sc::device_stats().implicit_copies == 2);
  CHECK(sc::device_stats().implicit_copy_bytes == 2 * 12 * 4);
  const sc::Tensor dev = host.to(gpu);  // asked for: not counted
  CHECK(sc::device_stats().implicit_copies == 2);
  sc::set_strict_device_placement(true);
  {
    sc::DeviceScope on(gpu);
    CHECK_NOTHROW(dev * 2);  // already there
    const int line = __LINE__ + 1;
    CHECK_THROWS_WITH(host * 2, Catch::Contains("[mul] would copy an input of shape [3, 4] from cpu to cuda:0") &&
                                    Catch::Contains("test_cuda_ops.cpp:" + std::to_string(line)));
  }
  sc::set_strict_device_placement(false);
  CHECK(sc::device_stats().implicit_copies == 2);
  // A variable keeps its device: a value from elsewhere is copied there, counted like an op's.
  sc::Variable v(dev, "v");
  v.assign(host * 3.f);
  CHECK(v.device() == gpu);
  CHECK(sc::device_stats().implicit_copies == 3);
  check_same(v.value(), host * 3.f, 0);
  sc::set_strict_device_placement(true);
  const int vline = __LINE__ + 1;
  CHECK_THROWS_WITH(v.assign(host), Catch::Contains("[Variable::assign] would copy an input of shape [3, 4] from cpu "
                                                    "to cuda:0 (the variable lives there)") &&
                                        Catch::Contains("test_cuda_ops.cpp:" + std::to_string(vline)));
  sc::set_strict_device_placement(false);
  check_same(v.value(), host * 3.f, 0);  // unchanged
  sc::reset_device_stats();
  CHECK(sc::device_stats().implicit_copies == 0);
}

TEST_CASE("cuda: activations, clip and losses == CPU, with their gradients", "[cuda]") {
  using F = std::function<sc::Tensor(const sc::Tensor&, const sc::Tensor&)>;
  const std::vector<std::pair<const char*, F>> fs = {
      {"leaky_relu", [](const sc::Tensor& x, const sc::Tensor&) { return sc::nn::leaky_relu(x, 0.1); }},
      {"elu", [](const sc::Tensor& x, const sc::Tensor&) { return sc::nn::elu(x); }},
      {"silu", [](const sc::Tensor& x, const sc::Tensor&) { return sc::nn::silu(x); }},
      {"gelu", [](const sc::Tensor& x, const sc::Tensor&) { return sc::nn::gelu(x); }},
      {"gelu_tanh", [](const sc::Tensor& x, const sc::Tensor&) { return sc::nn::gelu_tanh(x); }},
      {"softplus", [](const sc::Tensor& x, const sc::Tensor&) { return sc::nn::softplus(x); }},
      {"clip", [](const sc::Tensor& x, const sc::Tensor&) { return sc::clip(x, -0.5, 0.75); }},
      {"mse_loss", [](const sc::Tensor& x, const sc::Tensor& t) { return sc::nn::mse_loss(x, t); }},
      {"bce", [](const sc::Tensor& x, const sc::Tensor& t) { return sc::nn::binary_cross_entropy_with_logits(x, sc::sigmoid(t)); }},
      {"layer_norm", [](const sc::Tensor& x, const sc::Tensor&) { return sc::nn::layer_norm(x, {x.shape().back()}); }},
      {"var", [](const sc::Tensor& x, const sc::Tensor&) { return sc::var(x, {0}, false, 1); }}};
  for (const sc::DType d : {sc::f32, sc::f64}) {
    for (const sc::Shape& s : {sc::Shape{7}, sc::Shape{600, 3}}) {
      const sc::Tensor x = values(s, d, 5) * 2, t = values(s, d, 6);
      for (const auto& [name, f] : fs) {
        INFO(name << " " << sc::name(d) << " " << sctest::str(s));
        const double tol = d == sc::f32 ? 1e-5 : 1e-12;
        sc::Tensor cpu_y, cpu_g, gpu_y, gpu_g;
        {
          sc::GradientTape tape;
          tape.watch(x);
          cpu_y = f(x, t);
          cpu_g = tape.gradient(sc::sum(cpu_y), x);
        }
        {
          const sc::Tensor xg = x.to(gpu), tg = t.to(gpu);
          sc::GradientTape tape;
          tape.watch(xg);
          gpu_y = f(xg, tg);
          gpu_g = tape.gradient(sc::sum(gpu_y), xg);
          CHECK(gpu_y.device() == gpu);
        }
        check_same(gpu_y, cpu_y, tol);
        check_same(gpu_g, cpu_g, tol);
      }
    }
  }
  // dropout draws its mask on the input's device: zeros and 2x, about half each
  sc::random::Generator gen(4);
  const sc::Tensor x = values({4000}, sc::f32, 8).to(gpu);
  const sc::Tensor y = sc::nn::dropout(x, 0.5, gen);
  CHECK(y.device() == gpu);
  const auto xv = x.to_vector<float>(), yv = y.to_vector<float>();
  int kept = 0;
  for (std::size_t k = 0; k < xv.size(); ++k) {
    if (yv[k] != 0.f) {
      ++kept;
      REQUIRE(yv[k] == xv[k] * 2.f);
    }
  }
  CHECK(kept > 1800);
  CHECK(kept < 2200);
  // traced on the GPU: a fresh mask at every call
  auto f = sc::function([&](const sc::Tensor& a) { return sc::nn::dropout(a, 0.5, gen); });
  const sc::Tensor t1 = f(x), t2 = f(x);
  CHECK(t1.device() == gpu);
  CHECK(t1.to_vector<float>() != t2.to_vector<float>());
  CHECK(f.trace_count() == 1);
}

TEST_CASE("cuda: a traced layer_norm computes x - mean again in its last kernel, == CPU, its gradient too", "[cuda][staged]") {
  const sc::Tensor x = values({96, 130}, sc::f32, 21) * 3, g = values({130}, sc::f32, 22) + 3,
                   b = values({130}, sc::f32, 23);
  const auto step = [](const sc::Tensor& a, const sc::Tensor& ga, const sc::Tensor& be) {
    sc::GradientTape tape;
    tape.watch(a);
    const sc::Tensor y = sc::nn::layer_norm(a, {130}, ga, be);
    const sc::Tensor loss = sc::sum(y * y * 0.5f + y);
    return std::make_tuple(y, tape.gradient(loss, a));
  };
  auto f = sc::function(step);
  const sc::Tensor xg = x.to(gpu), gg = g.to(gpu), bg = b.to(gpu);
  const auto [y, gx] = f(xg, gg, bg);
  CHECK(y.device() == gpu);
  CHECK(gx.device() == gpu);
  const std::string plan = f.get_concrete(xg, gg, bg).plan().str();
  INFO(plan);
  CHECK_THAT(plan, Catch::Contains("sub (again)"));
  const auto [y0, gx0] = step(x, g, b);
  check_same(y, y0, 1e-5);
  check_same(gx, gx0, 1e-4);
}
