// nn::scaled_dot_product_attention and nn::MultiHeadAttention against plain-loop references (f32,
// f64; masks, causal, broadcast batch dims, Tq != Tk), gradients by central differences, traced
// runs equal to eager ones, and every error path.
#include <catch2/catch.hpp>
#include <stagecraft/nn/attention.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "testing.hpp"

namespace {

using sctest::check_close;
using sctest::error_of;
using sctest::randn;

std::string at_line(int line) { return "test_attention.cpp:" + std::to_string(line); }


/// Attention by loops over B independent problems: q [B, Tq, D], k [B, Tk, D], v [B, Tk, Dv],
/// keep(b, i, j) whether query i of problem b may see key j. Softmax written out, a query that
/// sees no key spreading evenly over all of them (the library's documented choice).
template <class Keep>
std::vector<double> attention_reference(const std::vector<double>& q, const std::vector<double>& k,
                                        const std::vector<double>& v, std::int64_t B, std::int64_t Tq, std::int64_t Tk,
                                        std::int64_t D, std::int64_t Dv, double scale, Keep keep) {
  std::vector<double> out(static_cast<std::size_t>(B * Tq * Dv), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < Tq; ++i) {
      std::vector<double> s(static_cast<std::size_t>(Tk));
      bool any = false;
      for (std::int64_t j = 0; j < Tk; ++j) any = any || keep(b, i, j);
      double mx = -INFINITY;
      for (std::int64_t j = 0; j < Tk; ++j) {
        double dot = 0;
        for (std::int64_t c = 0; c < D; ++c) dot += q[(b * Tq + i) * D + c] * k[(b * Tk + j) * D + c];
        s[j] = dot * scale;
        if (keep(b, i, j)) mx = std::max(mx, s[j]);
      }
      double total = 0;
      for (std::int64_t j = 0; j < Tk; ++j) {
        s[j] = !any ? 1.0 : (keep(b, i, j) ? std::exp(s[j] - mx) : 0.0);
        total += s[j];
      }
      for (std::int64_t j = 0; j < Tk; ++j)
        for (std::int64_t c = 0; c < Dv; ++c) out[(b * Tq + i) * Dv + c] += s[j] / total * v[(b * Tk + j) * Dv + c];
    }
  return out;
}

}  // namespace

TEST_CASE("scaled_dot_product_attention: against a loop reference, masked, causal, scaled", "[layers][attention]") {
  const std::int64_t B = 3, Tq = 4, Tk = 6, D = 5, Dv = 3;
  const auto qv = randn(B * Tq * D, 1), kv = randn(B * Tk * D, 2), vv = randn(B * Tk * Dv, 3);
  const auto all = [](std::int64_t, std::int64_t, std::int64_t) { return true; };
  // a padding-style mask [B, 1, Tk]: problem b sees keys j < Tk - b; problem 2 also fully masked on none
  std::vector<bool> pad(static_cast<std::size_t>(B * Tk));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t j = 0; j < Tk; ++j) pad[static_cast<std::size_t>(b * Tk + j)] = j < Tk - 2 * b;
  const auto padded = [&](std::int64_t b, std::int64_t, std::int64_t j) { return pad[static_cast<std::size_t>(b * Tk + j)]; };
  const auto causal = [&](std::int64_t, std::int64_t i, std::int64_t j) { return j <= i + (Tk - Tq); };
  for (const sc::DType dt : {sc::f32, sc::f64}) {
    INFO(sc::name(dt));
    const double tol = dt == sc::f32 ? 2e-5 : 1e-12;
    const sc::Tensor q = sc::tensor(qv, {B, Tq, D}).astype(dt), k = sc::tensor(kv, {B, Tk, D}).astype(dt),
                     v = sc::tensor(vv, {B, Tk, Dv}).astype(dt);
    const sc::Tensor mask = sc::cast(sc::tensor(std::vector<double>(pad.begin(), pad.end()), {B, 1, Tk}), sc::boolean);
    const double s0 = 1 / std::sqrt(double(D));
    const sc::Tensor plain = sc::nn::scaled_dot_product_attention(q, k, v);
    CHECK(plain.shape() == sc::Shape{B, Tq, Dv});
    CHECK(plain.dtype() == dt);
    check_close(plain.to_vector<double>(), attention_reference(qv, kv, vv, B, Tq, Tk, D, Dv, s0, all), tol);
    check_close(sc::nn::scaled_dot_product_attention(q, k, v, {.mask = mask}).to_vector<double>(),
                attention_reference(qv, kv, vv, B, Tq, Tk, D, Dv, s0, padded), tol);
    check_close(sc::nn::scaled_dot_product_attention(q, k, v, {.causal = true, .scale = 0.3}).to_vector<double>(),
                attention_reference(qv, kv, vv, B, Tq, Tk, D, Dv, 0.3, causal), tol);
    check_close(sc::nn::scaled_dot_product_attention(q, k, v, {.mask = mask, .causal = true}).to_vector<double>(),
                attention_reference(qv, kv, vv, B, Tq, Tk, D, Dv, s0,
                                    [&](std::int64_t b, std::int64_t i, std::int64_t j) {
                                      return padded(b, i, j) && causal(b, i, j);
                                    }),
                tol);
    // a query that may see no key attends evenly (no NaN)
    const sc::Tensor none = sc::zeros({Tq, Tk}, sc::boolean);
    const sc::Tensor even = sc::nn::scaled_dot_product_attention(q, k, v, {.mask = none});
    check_close(even.to_vector<double>(),
                attention_reference(qv, kv, vv, B, Tq, Tk, D, Dv, s0, [](auto, auto, auto) { return false; }), tol);
  }
  // broadcast batch dims: one k, v [Tk, D] for every q [B, Tq, D]
  const sc::Tensor q = sc::tensor(qv, {B, Tq, D}), k1 = sc::tensor(kv, {B, Tk, D});
  const sc::Tensor one_k = sc::slice(k1, {0, 0, 0}, {1, -1, -1}), one_v = sc::slice(sc::tensor(vv, {B, Tk, Dv}), {0, 0, 0}, {1, -1, -1});
  const sc::Tensor shared = sc::nn::scaled_dot_product_attention(q, sc::reshape(one_k, {Tk, D}), sc::reshape(one_v, {Tk, Dv}));
  const sc::Tensor tiled = sc::nn::scaled_dot_product_attention(q, sc::broadcast_to(one_k, {B, Tk, D}),
                                                                sc::broadcast_to(one_v, {B, Tk, Dv}));
  check_close(shared.to_vector<double>(), tiled.to_vector<double>(), 1e-6);
  // integer inputs become f32
  CHECK(sc::nn::scaled_dot_product_attention(sc::ones({2, 3}, sc::i32), sc::ones({4, 3}, sc::i32), sc::ones({4, 2}))
            .dtype() == sc::f32);
}

TEST_CASE("scaled_dot_product_attention: gradients of q, k and v by central differences", "[layers][attention][grad]") {
  const sc::Tensor q = sc::tensor(randn(2 * 3 * 4, 5), {2, 3, 4}), k = sc::tensor(randn(2 * 5 * 4, 6), {2, 5, 4}),
                   v = sc::tensor(randn(2 * 5 * 2, 7), {2, 5, 2});
  const sc::Tensor mask = sc::tensor({true, true, false, true, true}).astype(sc::boolean);
  for (const bool causal : {false, true}) {
    INFO((causal ? "causal" : "masked"));
    const auto r = sc::check_gradients(
        [&](const std::vector<sc::Tensor>& x) {
          return sc::nn::scaled_dot_product_attention(x[0], x[1], x[2], {.mask = mask, .causal = causal});
        },
        {q, k, v});
    INFO(r.report);
    CHECK(r.ok);
  }
}

TEST_CASE("MultiHeadAttention: against a loop reference per head, self and cross attention", "[layers][attention]") {
  const std::int64_t N = 2, Tq = 3, Tk = 5, E = 6, H = 3, D = 2;
  for (const sc::DType dt : {sc::f32, sc::f64}) {
    INFO(sc::name(dt));
    const double tol = dt == sc::f32 ? 2e-5 : 1e-12;
    sc::nn::MultiHeadAttention mha(E, H, 11, dt);
    CHECK(mha.embed_dim() == E);
    CHECK(mha.heads() == H);
    auto names = mha.named_variables();
    REQUIRE(names.size() == 8);
    CHECK(names[0].first == "query/kernel");
    CHECK(names[7].first == "output/bias");
    unsigned seed = 40;
    for (auto& [name, var] : names)  // biases start at zero: give every variable its own values
      var.assign(sc::tensor(randn(var.numel(), ++seed, 0.4), var.shape()).astype(dt));
    const auto xq = randn(N * Tq * E, 21), xk = randn(N * Tk * E, 22), xv = randn(N * Tk * E, 23);
    // projections by loops: y [rows, E] = x [rows, E] W + b
    const auto project = [&](const std::vector<double>& x, const sc::nn::Dense& l, std::int64_t rows) {
      const auto w = l.kernel.value().to_vector<double>(), b = l.bias.value().to_vector<double>();
      std::vector<double> y(static_cast<std::size_t>(rows * E));
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t o = 0; o < E; ++o) {
          double s = b[o];
          for (std::int64_t i = 0; i < E; ++i) s += x[r * E + i] * w[i * E + o];
          y[r * E + o] = s;
        }
      return y;
    };
    // head h of [N, T, E]: columns h*D .. h*D+D-1 → [N, T, D]
    const auto head = [&](const std::vector<double>& x, std::int64_t T, std::int64_t h) {
      std::vector<double> y(static_cast<std::size_t>(N * T * D));
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t t = 0; t < T; ++t)
          for (std::int64_t c = 0; c < D; ++c) y[(n * T + t) * D + c] = x[(n * T + t) * E + h * D + c];
      return y;
    };
    const auto reference = [&](const std::vector<double>& a, const std::vector<double>& b, const std::vector<double>& c,
                               std::int64_t Ta, std::int64_t Tb, bool causal) {
      const auto pq = project(a, mha.query, N * Ta), pk = project(b, mha.key, N * Tb), pv = project(c, mha.value, N * Tb);
      std::vector<double> joined(static_cast<std::size_t>(N * Ta * E));
      for (std::int64_t h = 0; h < H; ++h) {
        const auto o = attention_reference(head(pq, Ta, h), head(pk, Tb, h), head(pv, Tb, h), N, Ta, Tb, D, D,
                                           1 / std::sqrt(double(D)),
                                           [&](auto, std::int64_t i, std::int64_t j) { return !causal || j <= i + (Tb - Ta); });
        for (std::int64_t n = 0; n < N; ++n)
          for (std::int64_t t = 0; t < Ta; ++t)
            for (std::int64_t d = 0; d < D; ++d) joined[(n * Ta + t) * E + h * D + d] = o[(n * Ta + t) * D + d];
      }
      return project(joined, mha.output, N * Ta);
    };
    const sc::Tensor q = sc::tensor(xq, {N, Tq, E}).astype(dt), k = sc::tensor(xk, {N, Tk, E}).astype(dt),
                     v = sc::tensor(xv, {N, Tk, E}).astype(dt);
    const sc::Tensor cross = mha(q, k, v);
    CHECK(cross.shape() == sc::Shape{N, Tq, E});
    CHECK(cross.dtype() == dt);
    check_close(cross.to_vector<double>(), reference(xq, xk, xv, Tq, Tk, false), tol);
    check_close(mha(q, k, v, {.causal = true}).to_vector<double>(), reference(xq, xk, xv, Tq, Tk, true), tol);
    check_close(mha(k, {.causal = true}).to_vector<double>(), reference(xk, xk, xk, Tk, Tk, true), tol);
    // a mask [N, Tq, Tk] applies to every head: the causal one, spelled out
    const sc::Tensor spelled = sc::broadcast_to(sc::reshape(sc::tensor({true, true, true, false, false, true, true, true,
                                                                         true, false, true, true, true, true, true}),
                                                            {1, Tq, Tk}),
                                                {N, Tq, Tk});
    check_close(mha(q, k, v, {.mask = spelled}).to_vector<double>(), reference(xq, xk, xv, Tq, Tk, true), tol);
  }
}

TEST_CASE("MultiHeadAttention: variable gradients by central differences, traced equal to eager",
          "[layers][attention][grad]") {
  sc::nn::MultiHeadAttention mha(4, 2, 3, sc::f64);
  const sc::Tensor x = sc::tensor(randn(2 * 3 * 4, 9), {2, 3, 4}), w = sc::tensor(randn(2 * 3 * 4, 10), {2, 3, 4});
  REQUIRE(mha.trainable_variables().size() == 8);
  sctest::check_variable_gradients([&] { return sc::sum(mha(x, {.causal = true}) * w); }, mha.trainable_variables(),
                                   1e-7, 1e-6);
  // traced: one graph for the attention and its gradient, the same numbers as eager
  auto step = [&](const sc::Tensor& in) {
    sc::GradientTape tape;
    const sc::Tensor l = sc::sum(mha(in, {.causal = true}) * w);
    std::vector<sc::Tensor> out = tape.gradient(l, mha.trainable_variables());
    out.push_back(l);
    return out;
  };
  auto f = sc::function(step);
  const auto traced = f(x), eager = step(x);
  REQUIRE(traced.size() == eager.size());
  for (std::size_t n = 0; n < eager.size(); ++n) check_close(traced[n].to_vector<double>(), eager[n].to_vector<double>(), 1e-12);
}

TEST_CASE("attention errors name the op, the shapes and the user's line", "[layers][attention][errors]") {
  const sc::Tensor q = sc::ones({2, 3, 4}), k = sc::ones({2, 5, 4}), v = sc::ones({2, 5, 2});
  int line = __LINE__ + 1;
  std::string msg = error_of<sc::ShapeError>([&] { (void)sc::nn::scaled_dot_product_attention(q, sc::ones({2, 5, 3}), v); });
  CHECK_THAT(msg, Catch::Contains("[scaled_dot_product_attention]") && Catch::Contains("[2, 5, 3]") &&
                      Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ShapeError>([&] { (void)sc::nn::scaled_dot_product_attention(q, k, sc::ones({2, 4, 2})); });
  CHECK_THAT(msg, Catch::Contains("[2, 4, 2]") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ShapeError>([&] { (void)sc::nn::scaled_dot_product_attention(sc::ones({4}), k, v); });
  CHECK_THAT(msg, Catch::Contains("rank >= 2") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::DTypeError>([&] { (void)sc::nn::scaled_dot_product_attention(q, k, v, {.mask = sc::ones({3, 5})}); });
  CHECK_THAT(msg, Catch::Contains("bool mask") && Catch::Contains("f32") && Catch::Contains(at_line(line)));
  const sc::Tensor wrong_mask = sc::zeros({3, 4}, sc::boolean);
  line = __LINE__ + 1;
  msg = error_of<sc::ShapeError>([&] { (void)sc::nn::scaled_dot_product_attention(q, k, v, {.mask = wrong_mask}); });
  CHECK_THAT(msg, Catch::Contains("[scaled_dot_product_attention]") && Catch::Contains("mask [3, 4]") &&
                      Catch::Contains("[..., 3, 5]") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { sc::nn::MultiHeadAttention bad(6, 4); });
  CHECK_THAT(msg, Catch::Contains("[MultiHeadAttention]") && Catch::Contains("multiple of heads") &&
                      Catch::Contains(at_line(line)));
  sc::nn::MultiHeadAttention mha(4, 2, 1);
  line = __LINE__ + 1;
  msg = error_of<sc::ShapeError>([&] { (void)mha(sc::ones({2, 3, 5})); });
  CHECK_THAT(msg, Catch::Contains("[MultiHeadAttention]") && Catch::Contains("[2, 3, 5]") &&
                      Catch::Contains("embed_dim = 4") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ShapeError>([&] { (void)mha(q, sc::ones({3, 5, 4}), sc::ones({3, 5, 4})); });
  CHECK_THAT(msg, Catch::Contains("[3, 5, 4]") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ShapeError>([&] { (void)mha(q, {.mask = sc::zeros({3}, sc::boolean)}); });
  CHECK_THAT(msg, Catch::Contains("mask") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { (void)mha(sc::Tensor()); });
  CHECK_THAT(msg, Catch::Contains("[MultiHeadAttention]") && Catch::Contains(at_line(line)));
}
