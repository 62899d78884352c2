// pad, tile, split and flip (ops/arrange.hpp) on every dtype and sample shape against plain-loop
// references, their gradients by central differences, traced runs equal to eager ones, and every
// error path.
#include "layout_testing.hpp"

#include <stagecraft/autodiff/gradcheck.hpp>
#include <stagecraft/graph/function.hpp>
#include <stagecraft/ops/arrange.hpp>

using lt::expect_error;
using lt::values;

namespace {

/// out[idx] = x[idx - before] inside the original box, `fill` outside it.
std::vector<double> ref_pad(const sc::Tensor& x, const std::vector<std::pair<std::int64_t, std::int64_t>>& pads,
                            double fill, sc::Shape& os) {
  os = x.shape();
  for (int d = 0; d < os.rank(); ++d) os[d] += pads[d].first + pads[d].second;
  const std::vector<double> xv = values(x);
  std::vector<double> out(static_cast<std::size_t>(os.numel()));
  for (std::int64_t i = 0; i < os.numel(); ++i) {
    auto idx = lt::unravel(i, os);
    bool inside = true;
    for (int d = 0; d < os.rank(); ++d) {
      idx[d] -= pads[d].first;
      inside = inside && idx[d] >= 0 && idx[d] < x.shape()[d];
    }
    out[i] = inside ? xv[lt::ravel(idx, x.shape())] : fill;
  }
  return out;
}

/// out[idx] = x[idx mod extent], x's shape padded with leading 1s to reps' length.
std::vector<double> ref_tile(const sc::Tensor& x, const std::vector<std::int64_t>& reps, sc::Shape& os) {
  sc::Shape xs;
  for (std::size_t d = 0; d < reps.size() - x.shape().size(); ++d) xs.push_back(1);
  for (int d = 0; d < x.rank(); ++d) xs.push_back(x.shape()[d]);
  os = {};
  for (int d = 0; d < xs.rank(); ++d) os.push_back(xs[d] * reps[d]);
  const std::vector<double> xv = values(x);
  std::vector<double> out(static_cast<std::size_t>(os.numel()));
  for (std::int64_t i = 0; i < os.numel(); ++i) {
    auto idx = lt::unravel(i, os);
    for (int d = 0; d < os.rank(); ++d) idx[d] %= xs[d];
    out[i] = xv[lt::ravel(idx, xs)];
  }
  return out;
}

}  // namespace

TEST_CASE("pad: every dtype and shape against a loop reference", "[layout][arrange]") {
  for (const sc::DType d : lt::all_dtypes)
    for (const sc::Shape& s : lt::sample_shapes) {
      const sc::Tensor x = lt::sample(s, d, 1);
      std::vector<std::pair<std::int64_t, std::int64_t>> pads;
      for (int k = 0; k < s.rank(); ++k) pads.push_back({k % 3, (k + 1) % 2 * 2});
      INFO(sc::name(d) << " " << s);
      sc::Shape os;
      const std::vector<double> want = ref_pad(x, pads, d == sc::boolean ? 1 : 7, os);
      const sc::Tensor y = sc::pad(x, pads, 7);
      CHECK(y.dtype() == d);
      CHECK(y.shape() == os);
      CHECK(values(y) == want);
    }
  // the default value is 0; a float value into an integer tensor converts as cast() does
  CHECK(values(sc::pad(sc::tensor({1.f, 2.f}), {{1, 2}})) == std::vector<double>{0, 1, 2, 0, 0});
  CHECK(values(sc::pad(sc::tensor({3, 4}), {{0, 1}}, -2.75)) == std::vector<double>{3, 4, -2});
}

TEST_CASE("tile: every dtype and shape against a loop reference, extra leading axes", "[layout][arrange]") {
  for (const sc::DType d : lt::all_dtypes)
    for (const sc::Shape& s : lt::sample_shapes)
      for (const int extra : {0, 1}) {
        const sc::Tensor x = lt::sample(s, d, 2);
        std::vector<std::int64_t> reps;
        for (int k = 0; k < s.rank() + extra; ++k) reps.push_back(k % 3 + 1);
        INFO(sc::name(d) << " " << s << " extra " << extra);
        sc::Shape os;
        const std::vector<double> want = ref_tile(x, reps, os);
        const sc::Tensor y = sc::tile(x, reps);
        CHECK(y.dtype() == d);
        CHECK(y.shape() == os);
        CHECK(values(y) == want);
      }
  CHECK(sc::tile(sc::tensor({1, 2}), {0}).shape() == sc::Shape{0});
  CHECK(values(sc::tile(sc::tensor({{1, 2}}), {2, 2})) == std::vector<double>{1, 2, 1, 2, 1, 2, 1, 2});
}

TEST_CASE("split and flip: every dtype against loop references", "[layout][arrange]") {
  for (const sc::DType d : lt::all_dtypes) {
    INFO(sc::name(d));
    const sc::Tensor x = lt::sample({4, 6, 2}, d, 3);
    const std::vector<double> xv = values(x);
    // split axis 1 into 1, 0, 3, 2: piece k holds x[:, off_k : off_k + size_k, :]
    const std::vector<std::int64_t> sizes = {1, 0, 3, 2};
    const std::vector<sc::Tensor> parts = sc::split(x, sizes, -2);
    REQUIRE(parts.size() == 4);
    std::int64_t off = 0;
    for (std::size_t k = 0; k < parts.size(); ++k) {
      CHECK(parts[k].shape() == sc::Shape{4, sizes[k], 2});
      CHECK(parts[k].dtype() == d);
      std::vector<double> want;
      for (std::int64_t i = 0; i < 4; ++i)
        for (std::int64_t j = off; j < off + sizes[k]; ++j)
          for (std::int64_t c = 0; c < 2; ++c) want.push_back(xv[(i * 6 + j) * 2 + c]);
      CHECK(values(parts[k]) == want);
      off += sizes[k];
    }
    const std::vector<sc::Tensor> halves = sc::split(x, 2, 0);
    REQUIRE(halves.size() == 2);
    CHECK(values(sc::concat(halves, 0)) == xv);
    // flip axes 0 and 2: out[i][j][c] = x[3 - i][j][1 - c]
    const sc::Tensor f = sc::flip(x, {0, -1});
    std::vector<double> want;
    for (std::int64_t i = 0; i < 4; ++i)
      for (std::int64_t j = 0; j < 6; ++j)
        for (std::int64_t c = 0; c < 2; ++c) want.push_back(xv[((3 - i) * 6 + j) * 2 + (1 - c)]);
    CHECK(f.dtype() == d);
    CHECK(values(f) == want);
    CHECK(values(sc::flip(x, {})) == xv);
  }
  CHECK(sc::flip(sc::zeros({0, 3}), {0, 1}).shape() == sc::Shape{0, 3});
}

TEST_CASE("pad, tile, split, flip: gradients by central differences, traced equal to eager", "[layout][arrange][grad]") {
  const sc::Tensor x = sc::random::normal({2, 3}, 4).astype(sc::f64);
  const auto f = [&](const sc::Tensor& a) {
    const sc::Tensor p = sc::pad(a, {{1, 0}, {0, 2}}, 0.5);                   // [3, 5]
    const std::vector<sc::Tensor> s = sc::split(sc::flip(p, {1}), {2, 3}, 1);  // [3, 2], [3, 3]
    const sc::Tensor t = sc::tile(s[1] * s[1], {1, 2});                        // [3, 6]
    return sc::concat({sc::tile(s[0], {2, 3}), sc::pad(t, {{0, 3}, {0, 0}})}, 1);  // [6, 6] and [6, 6]
  };
  const auto r = sc::check_gradients([&](const std::vector<sc::Tensor>& in) { return f(in[0]); }, {x});
  INFO(r.report);
  CHECK(r.ok);
  auto traced = sc::function(f);
  CHECK(values(traced(x)) == values(f(x)));
}

TEST_CASE("pad, tile, split, flip: errors name the op, the shapes and the user's line", "[layout][arrange][errors]") {
  const sc::Tensor x = sc::ones({2, 3});
  expect_error<sc::ShapeError>([&] { (void)sc::pad(x, {{1, 1}}); }, {"[pad]", "1 pairs", "[2, 3]"});
  expect_error<sc::ValueError>([&] { (void)sc::pad(x, {{0, 0}, {-1, 0}}); }, {"[pad]", ">= 0", "axis 1"});
  expect_error<sc::ShapeError>([&] { (void)sc::tile(x, {2}); }, {"[tile]", "[2, 3]"});
  expect_error<sc::ValueError>([&] { (void)sc::tile(x, {1, -2}); }, {"[tile]", "-2"});
  expect_error<sc::ShapeError>([&] { (void)sc::tile(x, {std::int64_t{1} << 62, 4}); }, {"[tile]", "overflows"});
  expect_error<sc::ShapeError>([&] { (void)sc::split(x, {1, 1}, 1); }, {"[split]", "add up to 2", "extent 3"});
  expect_error<sc::ShapeError>([&] { (void)sc::split(x, 2, 1); }, {"[split]", "2 equal pieces"});
  expect_error<sc::ShapeError>([&] { (void)sc::split(x, {2}, 2); }, {"[split]", "axis 2"});
  expect_error<sc::ValueError>([&] { (void)sc::flip(x, {1, -1}); }, {"[flip]", "twice"});
  expect_error<sc::ShapeError>([&] { (void)sc::flip(x, {3}); }, {"[flip]", "axis 3"});
}
