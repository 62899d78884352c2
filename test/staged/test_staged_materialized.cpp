// The staged forms of the layout ops (reshape, transpose, broadcast_to, expand_dims, squeeze,
// flatten, slice, flip, pad, tile, concat, stack), gather, one_hot, sort, einsum, pooling, layer_norm and the
// losses (staged/materialized.hpp): staged, compiled and traced runs equal eager (bit for bit:
// the op is the eager op, the elementwise rest fused), grad<I> equals the tape and finite
// differences, and one generic CNN runs and trains the same eagerly and compiled.
#include <sstream>

#include "staged/staged_testing.hpp"

using sc::Tensor;
using sctest::away_from_zero;
using sctest::check_grads;
using sctest::check_same;
using sctest::check_stages;
using sctest::values;

namespace {

Tensor labels_of(std::vector<std::int64_t> v) {
  const std::int64_t n = static_cast<std::int64_t>(v.size());
  return sc::tensor(std::move(v), sc::Shape{n});
}

}  // namespace

TEST_CASE("the staged layout ops equal eager and traced", "[staged][materialized]") {
  for (sc::DType d : {sc::f32, sc::f64, sc::i32}) {
    const std::string at = std::string(" ") + std::string(sc::name(d));
    const Tensor x = values(d, {4, 6}, 1), y = values(d, {6, 4}, 2), c = values(d, {2, 3, 4}, 3);
    check_stages([](const auto& a) { return sc::reshape(a * 2, {3, -1}) + 1; }, 0.0, "reshape" + at, x);
    check_stages([](const auto& a, const auto& b) { return sc::transpose(a - 1) * b; }, 0.0, "transpose" + at, x, y);
    check_stages([](const auto& a) { return sc::transpose(a * a, {2, 0, 1}) + 1; }, 0.0,
                 "transpose with a permutation" + at, c);
    check_stages([](const auto& a) { return sc::broadcast_to(a * 3, {2, 4, 6}) - a; }, 0.0, "broadcast_to" + at, x);
    check_stages([](const auto& a) { return sc::squeeze(sc::expand_dims(a + 1, 1), {1}) * a; }, 0.0,
                 "expand_dims and squeeze" + at, x);
    check_stages([](const auto& a) { return sc::flatten(a * 2, 1) + 1; }, 0.0, "flatten" + at, c);
    check_stages([](const auto& a) { return sc::slice(a * 3, {1, 2}, {2, -1}) + 1; }, 0.0, "slice" + at, x);
    check_stages([](const auto& a) { return sc::flip(a - 1, {0, 1}) * a; }, 0.0, "flip" + at, x);
    check_stages([](const auto& a) { return sc::pad(a * 2, {{1, 0}, {0, 2}}, 5) + 1; }, 0.0, "pad" + at, x);
    check_stages([](const auto& a) { return sc::tile(a + 1, {2, 1}) * 2; }, 0.0, "tile" + at, x);
    check_stages([](const auto& a, const auto& b) { return sc::reshape(sc::transpose(a * 2) + b, {-1}); }, 0.0,
                 "a chain of layout ops" + at, x, y);
    const Tensor top = values(d, {2, 6}, 4), side = values(d, {4, 3}, 5);
    check_stages([](const auto& a, const auto& b) { return sc::concat(std::tuple{a * 2, b + 1}, 0) * 2; }, 0.0,
                 "concat along axis 0" + at, x, top);
    check_stages([&side](const auto& a) { return sc::concat(std::tuple{a, side, a * a}, -1) + 1; }, 0.0,
                 "concat of three with a tensor operand" + at, x);
    check_stages([](const auto& a) { return sc::concat(std::tuple{a - 1}, 1); }, 0.0, "concat of one" + at, x);
    check_stages([](const auto& a, const auto& b) { return sc::stack(std::tuple{a, sc::transpose(b) * 2}, 1) + 1; },
                 0.0, "stack along axis 1" + at, x, y);
    check_stages([](const auto& a, const auto& b) { return sc::stack(std::tuple{a + 1, b * 3, a}) - 1; }, 0.0,
                 "stack of three along axis 0" + at, x, x);
  }
  // eager's errors, from every stage
  const Tensor x = values(sc::f32, {4, 6}, 1);
  check_stages([](const auto& a) { return sc::reshape(a * 2, {5, 5}); }, 0.0, "reshape to another size", x);
  check_stages([](const auto& a) { return sc::transpose(a * 2, {0, 0}); }, 0.0, "a bad permutation", x);
  check_stages([](const auto& a) { return sc::slice(a * 2, {3, 0}, {2, 6}); }, 0.0, "a slice past the end", x);
  check_stages([](const auto& a) { return sc::broadcast_to(a, {4, 5}); }, 0.0, "broadcast_to a bad shape", x);
  check_stages([](const auto& a, const auto& b) { return sc::concat(std::tuple{a, b}, 0); }, 0.0,
               "concat of mismatched shapes", x, values(sc::f32, {2, 5}, 2));
  check_stages([](const auto& a, const auto& b) { return sc::stack(std::tuple{a, b * 2}, 0); }, 0.0,
               "stack of different shapes", x, values(sc::f32, {6, 4}, 3));
  check_stages([](const auto& a) { return sc::stack(std::tuple{a, a}, 3); }, 0.0, "stack along a bad axis", x);
}

TEST_CASE("staged gather, one_hot, sort and einsum equal eager and traced", "[staged][materialized]") {
  const Tensor x = values(sc::f32, {4, 6}, 4), w = values(sc::f32, {6, 3}, 5), v = values(sc::f32, {3, 2}, 6);
  const Tensor idx = sc::tensor(std::vector<std::int64_t>{5, 0, 0, -1, 2}, sc::Shape{5});
  check_stages([](const auto& a, const auto& i) { return sc::gather(a * 2, i, 1) + 1; }, 0.0, "gather along axis 1",
               x, idx);
  check_stages([](const auto& a, const auto& i) { return sc::gather(a, i) * 2; }, 0.0, "gather along axis 0",
               x, sc::tensor(std::vector<std::int64_t>{3, 1}, sc::Shape{2}));
  check_stages([](const auto& a, const auto& i) { return sc::gather(a, i, 1); }, 0.0, "an index out of range", x,
               sc::tensor(std::vector<std::int64_t>{6}, sc::Shape{1}));
  check_stages([](const auto& a, const auto& l) { return sc::one_hot(l, 6) * a; }, 0.0, "one_hot",
               x, labels_of({0, 5, 2, 7}));
  check_stages([](const auto& l) { return sc::one_hot(l + 1, 3, sc::f64) * 2; }, 0.0, "one_hot of an expression",
               labels_of({0, 1, 2, -1}));
  check_stages([](const auto& a) { return sc::sort(a * -1, 1) + 1; }, 0.0, "sort", x);
  check_stages([](const auto& a) { return sc::sort(sc::tanh(a), 0, true); }, 0.0, "sort descending", x);
  check_stages([](const auto& a, const auto& b) { return sc::einsum("ij,jk->ik", a, b * 2) + 1; }, 0.0,
               "einsum of two", x, w);
  check_stages([](const auto& a, const auto& b, const auto& c) { return sc::einsum("ij,jk,kl", sc::exp(a * 0.1f), b, c); },
               0.0, "einsum of three", x, w, v);
  check_stages([&w](const auto& a) { return sc::einsum("ij,jk->ki", a, w); }, 0.0, "einsum with a tensor operand", x);
  check_stages([](const auto& a) { return sc::einsum("ii->i", a); }, 0.0, "einsum of a non-square 'ii'", x);
}

TEST_CASE("staged pooling, layer_norm and the losses equal eager and traced", "[staged][materialized]") {
  for (sc::DType d : {sc::f32, sc::f64}) {
    const std::string at = std::string(" ") + std::string(sc::name(d));
    const Tensor img = values(d, {2, 3, 6, 6}, 7), x = values(d, {4, 6}, 8), y = values(d, {4, 6}, 9);
    const Tensor g = values(d, {6}, 10), b = values(d, {6}, 11);
    check_stages([](const auto& i) { return sc::nn::max_pool2d(sc::relu(i * 2), 2, 2) + 1; }, 0.0, "max_pool2d" + at, img);
    check_stages([](const auto& i) { return sc::nn::avg_pool2d(i - 1, 3, 1) * 2; }, 0.0, "avg_pool2d" + at, img);
    check_stages([](const auto& a) { return sc::nn::layer_norm(a * 2, {6}) + 1; }, 0.0, "layer_norm" + at, x);
    check_stages([](const auto& a, const auto& gg, const auto& bb) { return sc::nn::layer_norm(a, {6}, gg * 2, bb); }, 0.0,
                 "layer_norm with gamma and beta" + at, x, g, b);
    check_stages([](const auto& a, const auto& l) { return sc::nn::cross_entropy(a * 2, l) + 1; }, 0.0,
                 "cross_entropy" + at, x, labels_of({0, 5, 3, 3}));
    check_stages([](const auto& a, const auto& t) { return sc::nn::mse_loss(sc::tanh(a), t); }, 0.0, "mse_loss" + at, x, y);
    check_stages([](const auto& a, const auto& t) { return sc::nn::binary_cross_entropy_with_logits(a, sc::sigmoid(t)); },
                 0.0, "binary_cross_entropy_with_logits" + at, x, y);
  }
  const Tensor x = values(sc::f32, {4, 6}, 8);
  check_stages([](const auto& a, const auto& l) { return sc::nn::cross_entropy(a, l); }, 0.0, "a label out of range", x,
               labels_of({0, 6, 1, 1}));
  check_stages([](const auto& a) { return sc::nn::layer_norm(a, {4}); }, 0.0, "layer_norm of a bad shape", x);
}

TEST_CASE("grad<I> through the staged layout, picking, sort, einsum, pooling and loss ops equals the tape",
          "[staged][materialized][grad]") {
  for (sc::DType d : {sc::f32, sc::f64}) {
    const std::string at = std::string(" ") + std::string(sc::name(d));
    const Tensor x = away_from_zero({4, 6}, 21, d), row = away_from_zero({6}, 22, d), col = away_from_zero({4}, 23, d);
    const Tensor y = away_from_zero({4, 6}, 24, d);
    check_grads([](const auto& a, const auto& b) { return sc::tanh(sc::reshape(a * b, {-1})) * 2; }, "reshape" + at, x, row);
    check_grads([](const auto& a, const auto& b) { return sc::transpose(sc::tanh(a)) * b * sc::transpose(a); },
                "transpose" + at, x, col);
    check_grads([](const auto& a, const auto& b) { return sc::broadcast_to(a * b, {3, 4, 6}) * sc::exp(b); },
                "broadcast_to" + at, x, row);
    check_grads([](const auto& a, const auto& b) { return sc::squeeze(sc::expand_dims(a, 0)) * sc::flatten(a * b, 1); },
                "expand_dims, squeeze, flatten" + at, x, row);
    check_grads([](const auto& a, const auto& b) { return sc::slice(a * b, {1, 2}, {2, -1}) * sc::slice(sc::flip(a, {1}), {0, 0}, {2, 4}); },
                "slice" + at, x, y);
    check_grads([](const auto& a, const auto& b) { return sc::pad(sc::tanh(a * b), {{1, 0}, {2, 1}}, 0.5) * 3; },
                "pad" + at, x, row);
    check_grads([](const auto& a, const auto& b) { return sc::tile(a * b, {2, 1}) * sc::tile(a, {1, 2, 1}); },
                "tile" + at, x, row);
    check_grads([](const auto& a, const auto& b) { return sc::concat(std::tuple{a * b, sc::tanh(a), a}, 0) * 2; },
                "concat" + at, x, row);
    check_grads([](const auto& a, const auto& b) { return sc::stack(std::tuple{a, a * b}, 2) * sc::exp(sc::stack(std::tuple{b * a, a}, 2)); },
                "stack" + at, x, row);
    const Tensor idx = sc::tensor(std::vector<std::int64_t>{5, 0, 0, 2, 5}, sc::Shape{5});
    check_grads([&idx](const auto& a, const auto& b) { return sc::gather(a * b, idx, 1) * sc::gather(a, idx, 1); },
                "gather (repeated indices)" + at, x, row);
    const Tensor labels = labels_of({1, 5, 0, 5});
    check_grads([&labels](const auto& a, const auto& b) { return sc::one_hot(labels, 6) * sc::tanh(a * b); },
                "one_hot" + at, x, row);
    check_grads([](const auto& a, const auto& b) { return sc::sort(a * b, 1) * sc::exp(a); }, "sort" + at, x, row);
    check_grads([](const auto& a, const auto& b) { return sc::einsum("ij,j->i", a, b) * sc::einsum("ij,ij->i", a, a); },
                "einsum" + at, x, row);
    check_grads([](const auto& a, const auto& b) { return sc::nn::layer_norm(a * b, {6}, b, b * 2); }, "layer_norm" + at,
                x, row);
    check_grads([&labels](const auto& a, const auto& b) { return sc::nn::cross_entropy(a * b, labels) * 3; },
                "cross_entropy" + at, x, row);
    check_grads([](const auto& a, const auto& b) { return sc::nn::mse_loss(sc::tanh(a), b); }, "mse_loss" + at, x, y);
    check_grads([](const auto& a, const auto& b) { return sc::nn::binary_cross_entropy_with_logits(a, sc::sigmoid(b)); },
                "binary_cross_entropy_with_logits" + at, x, y);
    const Tensor img = away_from_zero({2, 2, 6, 6}, 25, d), scale = away_from_zero({2, 1, 1}, 26, d);
    check_grads([](const auto& i, const auto& s) { return sc::nn::max_pool2d(i * s, 2, 2) * 2; }, "max_pool2d" + at, img,
                scale);
    check_grads([](const auto& i, const auto& s) { return sc::nn::avg_pool2d(sc::tanh(i) * s, 3, 1); }, "avg_pool2d" + at,
                img, scale);
  }
}

TEST_CASE("one generic CNN runs eager, traced and compiled, and trains the same", "[staged][materialized][grad]") {
  // conv2d, relu, max_pool2d, flatten, matmul and cross_entropy, written once
  const auto loss = [](const auto& x, const auto& w1, const auto& w2, const auto& labels) {
    const auto h = sc::nn::max_pool2d(sc::relu(sc::nn::conv2d(x, w1, 1, 1)), 2, 2);
    return sc::nn::cross_entropy(sc::matmul(sc::flatten(h, 1), w2), labels);
  };
  const Tensor x = sctest::uniform_tensor({6, 1, 8, 8}, 31, -1, 1);
  const Tensor labels = labels_of({0, 4, 2, 1, 3, 4});
  Tensor w1 = sctest::uniform_tensor({3, 1, 3, 3}, 32, -0.5, 0.5), w2 = sctest::uniform_tensor({48, 5}, 33, -0.2, 0.2);
  check_stages(loss, 0.0, "the CNN's loss", x, w1, w2, labels);

  const auto g = sc::compile(loss);
  const auto d1 = sc::grad<1>(g);
  const auto d2 = sc::grad<2>(g);
  {
    sc::GradientTape tape;
    tape.watch(std::vector<Tensor>{w1, w2});
    const std::vector<Tensor> want = tape.gradient(loss(x, w1, w2, labels), std::vector<Tensor>{w1, w2});
    check_same(d1(x, w1, w2, labels), want[0], 1e-6, "grad<1> (conv kernel) vs tape");
    check_same(d2(x, w1, w2, labels), want[1], 1e-6, "grad<2> (dense weights) vs tape");
  }
  // 30 SGD steps with the compiled gradients and with the tape's, from the same start: the same
  // weights, and the loss falls
  Tensor e1 = w1, e2 = w2;
  const float first = g(x, w1, w2, labels).item<float>();
  for (int step = 0; step < 30; ++step) {
    const Tensor g1 = d1(x, w1, w2, labels), g2 = d2(x, w1, w2, labels);
    w1 = w1 - 0.5f * g1;
    w2 = w2 - 0.5f * g2;
    sc::GradientTape tape;
    tape.watch(std::vector<Tensor>{e1, e2});
    const std::vector<Tensor> ge = tape.gradient(loss(x, e1, e2, labels), std::vector<Tensor>{e1, e2});
    e1 = e1 - 0.5f * ge[0];
    e2 = e2 - 0.5f * ge[1];
  }
  check_same(w1, e1, 1e-5, "conv kernel after 30 steps");
  check_same(w2, e2, 1e-5, "dense weights after 30 steps");
  const float last = g(x, w1, w2, labels).item<float>();
  INFO("loss " << first << " -> " << last);
  CHECK(last < 0.5f * first);

  // its lowered graph names the ops
  std::ostringstream os;
  os << g.graph(x, w1, w2, labels);
  for (const char* op : {"conv2d", "max_pool2d", "matmul"}) {
    INFO(op << " in:\n" << os.str());
    CHECK(os.str().find(op) != std::string::npos);
  }
}

TEST_CASE("a staged layout op's error names the op, the shapes and the line that called it", "[staged][materialized][errors]") {
  const int line = __LINE__ + 2;
  const auto g = sc::compile([](auto a) { return sc::reshape(sc::tanh(a), {5, 5}); });
  const std::string msg = sctest::error_of<sc::ShapeError>([&] { (void)g(sc::ones({2, 3})); });
  INFO(msg);
  CHECK(msg.find("[reshape]") == 0);
  CHECK(msg.find("[2, 3]") != std::string::npos);
  CHECK(msg.find("test_staged_materialized.cpp:" + std::to_string(line)) != std::string::npos);
  // an expression kept in `auto` holds its attributes and tensors: nothing dangles
  auto e = [] {
    const Tensor t = sc::arange(6);
    return sc::transpose(sc::reshape(sc::stage(t) * 2, {2, 3}), {1, 0});
  }();
  check_same(sc::eval(e), sc::tensor(std::vector<std::int64_t>{0, 6, 2, 8, 4, 10}, sc::Shape{3, 2}), 0.0, "kept in auto");
}
