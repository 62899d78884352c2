// Compile-time staging beyond single ops: graphs mixing elementwise ops with matmul, reductions,
// softmax, conv2d and the scans (materialized operands, reductions fused at the root), shared
// sub-expressions, the graph as a type and its lowering to the runtime IR.
#include <sstream>

#include "staged/staged_testing.hpp"

using sc::Tensor;
using sctest::check_same;
using sctest::check_stages;
using sctest::values;

TEST_CASE("graphs with matmul, reductions, softmax and conv2d equal eager and traced", "[staged][graph]") {
  const Tensor x = values(sc::f32, {6, 5}, 1), w = values(sc::f32, {5, 4}, 2), b = values(sc::f32, {4}, 3);
  check_stages([](const auto& a, const auto& m, const auto& c) { return sc::relu(sc::matmul(a, m) + c); }, 0.0,
               "dense layer", x, w, b);
  check_stages([](const auto& a, const auto& m, const auto& c) { return sc::tanh(sc::matmul(a * 0.5f, m, false, false) - c) * 2; },
               0.0, "matmul of an expression", x, w, b);
  check_stages([](const auto& a, const auto& m) { return sc::matmul(a, m, true, false); }, 0.0, "matmul transposed (root)",
               x, values(sc::f32, {6, 3}, 4));
  check_stages([](const auto& a) { return sc::nn::softmax(a * 2.f) + 1.f; }, 0.0, "softmax in an expression", x);
  check_stages([](const auto& a) { return sc::nn::log_softmax(a, 0); }, 0.0, "log_softmax at the root", x);
  check_stages([](const auto& a) { return sc::exp(a - sc::logsumexp(a, {1}, true)); }, 0.0, "logsumexp", x);
  // the scans: evaluated first, their results read by the fused loop around them
  check_stages([](const auto& a) { return sc::cumsum(a * 2.f, 1) + 1.f; }, 0.0, "cumsum in an expression", x);
  check_stages([](const auto& a) { return sc::cumprod(a * 0.5f + 1.f, 0, true, true); }, 0.0, "cumprod, exclusive reversed", x);
  check_stages([](const auto& a) { return sc::tanh(sc::logcumsumexp(a, -1)) * a; }, 0.0, "logcumsumexp", x);
  check_stages([](const auto& a) { return sc::cummax(a, 1) - sc::cummin(a, 0, true); }, 0.0, "cummax and cummin", x);
  check_stages([](const auto& a, const auto& c) { return sc::linear_scan(sc::sigmoid(a), c * 2.f, 1, false, true); }, 0.0,
               "linear_scan of expressions", x, values(sc::f32, {6, 5}, 9));
  const Tensor img = values(sc::f32, {2, 3, 6, 6}, 5), k = values(sc::f32, {4, 3, 3, 3}, 6);
  check_stages([](const auto& i, const auto& kk) { return sc::relu(sc::nn::conv2d(i * 2.f, kk, 1, 1)); }, 0.0, "conv2d", img, k);
  // reductions at the root reduce while they evaluate, in eager's order: its bits (rows under 4
  // batches, pairwise pieces, rows cut into chunks, a chunk ending inside a batch, one long row)
  for (const Tensor& t : {x, values(sc::f32, {300, 1000}, 7), values(sc::f64, {3, 4, 70000}, 8), values(sc::f32, {7, 17}, 9),
                          values(sc::f64, {1000, 3}, 10), values(sc::f32, {1, 300001}, 11), values(sc::f64, {2, 250007}, 12)}) {
    const std::string s = sctest::str(t.shape());
    check_stages([](const auto& a) { return sc::sum(sc::tanh(a) * a); }, 0.0, "sum of all " + s, t);
    check_stages([](const auto& a) { return sc::sum(a * a + 1, {-1}); }, 0.0, "sum over the last axis " + s, t);
    check_stages([](const auto& a) { return sc::mean(sc::exp(a * 0.1), {-1}, true); }, 0.0, "mean, keepdims " + s, t);
    check_stages([](const auto& a) { return sc::max(sc::sin(a)); }, 0.0, "max of all " + s, t);
    check_stages([](const auto& a) { return sc::sum(sc::cos(a) * 2, {-1}); }, 0.0, "sum of cos over the last axis " + s, t);
    check_stages([](const auto& a) { return sc::min(a * 3, {0}); }, 0.0, "min over the first axis (not fused) " + s, t);
    check_stages([](const auto& a) { return sc::sum(a, {0, 1}); }, 0.0, "sum over leading axes (not fused) " + s, t);
    check_stages([](const auto& a) { return a / sc::sum(sc::exp(a), {-1}, true); }, 0.0, "a reduction inside " + s, t);
    {  // at one thread: the same chunks, the same bits
      const sctest::ThreadCount one(1);
      check_stages([](const auto& a) { return sc::sum(a * 0.5 + 1, {-1}); }, 0.0, "sum over the last axis, 1 thread " + s, t);
    }
  }
  // NaN propagates through a fused max
  const Tensor n = sc::tensor(std::vector<float>{1.f, NAN, 3.f, -1.f}, sc::Shape{2, 2});
  check_stages([](const auto& a) { return sc::max(a + 1, {1}); }, 0.0, "max with NaN", n);
  // reductions of an empty axis and bad axes raise eager's errors
  check_stages([](const auto& a) { return sc::max(a * 2, {1}); }, 0.0, "max over an empty axis", sc::zeros({3, 0}));
  check_stages([](const auto& a) { return sc::sum(a * 2, {5}); }, 0.0, "sum over a bad axis", x);
  check_stages([](const auto& a) { return sc::sum(a * 2, {-1, 1}); }, 0.0, "sum over a repeated axis", x);
  const std::string msg = sctest::error_of<sc::ShapeError>([&] {
    (void)sc::compile([](auto a) { return sc::mean(a * 2, {1, 1}); })(sc::ones({2, 3}));
  });
  CHECK(msg.find("[mean] axis 1 appears twice in axes [1, 1] for shape [2, 3]") == 0);
}

TEST_CASE("shared sub-expressions are bound once and read back", "[staged][cse]") {
  namespace st = sc::staging;
  const auto g = sc::compile([](auto a, auto b) { return sc::tanh(sc::exp(a * b)) + sc::tanh(sc::exp(a * b)) * a; });
  using E = typename decltype(g.expression<2>())::node_type;
  // tanh(exp(a*b)) occurs twice: it and exp(a*b) are shared (a*b, cheap, is recomputed)
  STATIC_REQUIRE(st::frame_slots<E> == 2);
  const Tensor x = values(sc::f32, {1000}, 1), y = values(sc::f32, {1000}, 2);
  check_same(g(x, y), sc::tanh(sc::exp(x * y)) + sc::tanh(sc::exp(x * y)) * x, 1e-6, "bound once");  // t + t * x may fuse into an FMA
  // equal types, different values: two scalars, two tensors
  const Tensor z = values(sc::f32, {1000}, 3);
  check_same(sc::eval(sc::tanh(sc::stage(x) * 2.f) + sc::tanh(sc::stage(x) * 3.f)), sc::tanh(x * 2.f) + sc::tanh(x * 3.f),
             0.0, "same type, different constants");
  check_same(sc::eval(sc::exp(sc::stage(x) * 2.f) - sc::exp(sc::stage(z) * 2.f)), sc::exp(x * 2.f) - sc::exp(z * 2.f), 0.0,
             "same type, different tensors");
  check_same(sc::eval(sc::exp(sc::stage(x) * 2.f) - sc::exp(sc::stage(x) * 2.f)), sc::zeros({1000}), 0.0,
             "same type, same tensor");
  // a derivative reuses its forward nodes: tanh(u) appears in d tanh(u) = 1 - tanh(u)^2
  const auto dg = sc::grad<0>(sc::compile([](auto a, auto b) { return sc::tanh(a * b); }));
  using DE = typename decltype(dg.expression<2>())::node_type;
  STATIC_REQUIRE(st::frame_slots<DE> >= 1);
  check_same(dg(x, y), (1 - sc::tanh(x * y) * sc::tanh(x * y)) * y, 1e-6, "derivative with tanh bound once");
}

TEST_CASE("the graph is a type, and lowers to the runtime IR", "[staged][graph]") {
  namespace st = sc::staging;
  const auto g = sc::compile([](auto x, auto y) { return sc::tanh(x * y) + 2.f * x; });
  using E = typename decltype(g.expression<2>())::node_type;
  STATIC_REQUIRE(std::is_same_v<E, st::Map2<sc::ops::Add, st::Map1<sc::ops::Tanh, st::Map2<sc::ops::Mul, st::Arg<0>, st::Arg<1>>>,
                                            st::Map2<sc::ops::Mul, st::Const<float>, st::Arg<0>>>>);
  STATIC_REQUIRE(st::node_count<E>::value == 8);  // add tanh mul x y mul 2 x
  const Tensor a = values(sc::f32, {3, 4}, 1), b = values(sc::f32, {4}, 2);
  const sc::graph::Graph ir = g.graph(a, b);
  std::ostringstream os;
  os << ir;
  const std::string text = os.str();
  INFO(text);
  CHECK(text.find("tanh") != std::string::npos);
  CHECK(text.find("mul") != std::string::npos);
  CHECK(text.find("add") != std::string::npos);
  CHECK(ir.inputs.size() == 2);
  CHECK(ir.outputs.size() == 1);
  // graph() without arguments: the latest call's shapes
  CHECK_THROWS_AS(g.graph(), sc::StagingError);
  (void)g(a, b);
  CHECK(g.graph().str() == ir.str());
  CHECK(ir.to_dot().find("digraph") != std::string::npos);
  // the traced form runs and agrees
  check_same(g.concrete(a, b)(a, b), g(a, b), 1e-6, "traced lowering");
}

TEST_CASE("one generic function runs eager, traced and compiled with the same numbers", "[staged][graph]") {
  auto f = [](const auto& x, const auto& w, const auto& b) {
    const auto h = sc::tanh(sc::matmul(x, w) + b);
    return sc::where(h > 0, h * h, -h) - sc::sum(h, {-1}, true) * 0.1f;
  };
  const Tensor x = values(sc::f32, {8, 16}, 1), w = values(sc::f32, {16, 8}, 2), b = values(sc::f32, {8}, 3);
  const Tensor eager = f(x, w, b);
  const Tensor traced = sc::function([&f](const Tensor& a, const Tensor& c, const Tensor& d) { return sc::Tensor(f(a, c, d)); })(x, w, b);
  const Tensor compiled = sc::compile(f)(x, w, b);
  check_same(compiled, eager, 1e-6, "compiled vs eager");
  check_same(traced, eager, 1e-6, "traced vs eager");
}

TEST_CASE("compile<dtypes...> fuses those dtypes only, with the same numbers on every dtype", "[staged][graph]") {
  auto f = [](const auto& x, const auto& y) { return sc::maximum(x * y, y) - sc::sum(x * x, {-1}, true) + 2 * x; };
  auto all = sc::compile(f);
  auto only_f32 = sc::compile<sc::f32>(f);
  auto floats = sc::compile<sc::f32, sc::f64>(f);
  STATIC_REQUIRE(std::is_same_v<decltype(only_f32), sc::Compiled<decltype(f), 1u << static_cast<unsigned>(sc::f32)>>);
  STATIC_REQUIRE(std::is_same_v<decltype(all), sc::Compiled<decltype(f)>>);
  // the set carries over to the derivative
  STATIC_REQUIRE(std::is_same_v<decltype(sc::grad<0>(only_f32)),
                                sc::Compiled<sc::staging::GradFn<0, decltype(f)>, 1u << static_cast<unsigned>(sc::f32)>>);
  for (sc::DType d : {sc::f32, sc::f64, sc::i32, sc::i64}) {
    const Tensor x = values(d, {33, 70}, 11), y = values(d, {70}, 12);
    const Tensor eager = f(x, y);
    INFO(sc::name(d));
    check_same(all(x, y), eager, 1e-5, "compile");
    check_same(only_f32(x, y), eager, 1e-5, "compile<f32>");  // other dtypes: op by op
    check_same(floats(x, y), eager, 1e-5, "compile<f32, f64>");
    if (sc::is_floating(d)) {  // the derivative of an elementwise h, on the fused and unfused dtypes
      auto h = [](const auto& a, const auto& b) { return sc::tanh(a * b) + a * a; };
      const Tensor want = sc::grad<0>(sc::compile(h))(x, y);
      check_same(sc::grad<0>(sc::compile<sc::f32>(h))(x, y), want, 1e-6, "grad<0>(compile<f32>)");
      check_same(sc::grad<0>(sc::compile<sc::f64>(h))(x, y), want, 1e-6, "grad<0>(compile<f64>)");
    }
  }
}
