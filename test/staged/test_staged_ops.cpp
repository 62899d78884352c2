// Compile-time staging, elementwise: every unary, binary, comparison and logical op, where and
// cast, on every dtype, same-shape, broadcasting and with weak scalars, gives the same result
// (or the same error) eager, traced, staged and compiled; same-dtype graphs bit for bit.
#include "staged/staged_testing.hpp"

using sc::Tensor;
using sctest::check_stages;
using sctest::values;

namespace {

const sc::DType all_dtypes[] = {sc::f32, sc::f64, sc::i32, sc::i64, sc::boolean};

#define UNARY(fn) std::pair<const char*, std::function<void(const Tensor&, double)>>{#fn, [](const Tensor& x, double tol) { \
  check_stages([](const auto& a) { return sc::fn(a); }, tol, std::string(#fn) + " " + std::string(sc::name(x.dtype())) + " " + sctest::str(x.shape()), x); }}

}  // namespace

TEST_CASE("staged unary ops equal eager, traced and compiled on every dtype", "[staged][ops]") {
  const std::vector<std::pair<const char*, std::function<void(const Tensor&, double)>>> ops = {
      UNARY(neg), UNARY(abs), UNARY(square), UNARY(relu), UNARY(sign), UNARY(exp), UNARY(log),
      UNARY(sqrt), UNARY(tanh), UNARY(sigmoid), UNARY(sin), UNARY(cos), UNARY(log1p), UNARY(expm1), UNARY(erf),
      UNARY(floor), UNARY(ceil), UNARY(round), UNARY(logical_not)};
  for (const auto& [name, check] : ops) {
    for (sc::DType d : all_dtypes) {
      for (const sc::Shape& s : {sc::Shape{37}, sc::Shape{3, 5}, sc::Shape{}, sc::Shape{0}, sc::Shape{70001}}) {
        const Tensor x = values(d, s, 11);
        // Bit for bit: same-dtype floating graphs run the same SIMD rule as eager; integer and
        // bool inputs of floating ops (computed in f32) run op by op, as one element at a time
        // the scalar math would differ from eager's SIMD rule in the last bit.
        check(x, 0.0);
      }
    }
  }
  CHECK(ops.size() == 19);
}

#undef UNARY

TEST_CASE("floating ops on integer and bool tensors give eager's bits, reduced too", "[staged][ops]") {
  // exp of an integer 20 or 33 and sin/cos of large integers: the last bit of the scalar math
  // differs from eager's SIMD rule (and sin's depends on the other lanes of the batch)
  const Tensor i = sc::tensor(std::vector<std::int32_t>{20, -33, 7, 1000003, -2147483647, 0, 5, 88, 3, 10, 70000, -9, 1}, sc::Shape{13});
  for (const Tensor& x : {i, sc::cast(i, sc::i64), sc::reshape(sc::cast(i, sc::i64), {13, 1})}) {
    const std::string at = std::string(sc::name(x.dtype())) + " " + sctest::str(x.shape());
    check_stages([](const auto& a) { return sc::sin(a) * sc::cos(a * 3) + sc::tanh(a * 0.001f); }, 0.0, "sin, cos, tanh on " + at, x);
    check_stages([](const auto& a) { return sc::exp(a * 0.1f) - sc::log(sc::abs(a) + 1) * sc::sigmoid(a); }, 0.0, "exp, log, sigmoid on " + at, x);
    check_stages([](const auto& a) { return sc::sum(sc::exp(a * 0.25f) * a, {-1}); }, 0.0, "sum of exp on " + at, x);
  }
  check_stages([](const auto& a) { return sc::exp(sc::cast<sc::f64>(a) * 0.3); }, 0.0, "exp of a cast to f64", values(sc::f32, {40}, 3));
  check_stages([](const auto& a) { return sc::sin(a) + 1.5f; }, 0.0, "sin of bool", values(sc::boolean, {21}, 4));
}

TEST_CASE("weak scalars take the tensor's dtype, as eager", "[staged][ops]") {
  for (sc::DType d : {sc::f32, sc::f64, sc::i32, sc::i64}) {
    const Tensor x = values(d, {2, 9}, 8);
    const std::string dn(sc::name(d));
    check_stages([](const auto& a) { return a * 0.5 + 1; }, 1e-6, "a * 0.5 + 1 on " + dn, x);
    check_stages([](const auto& a) { return 2 - a; }, 0.0, "2 - a on " + dn, x);
    check_stages([](const auto& a) { return 3.f / (a + 5); }, 1e-6, "3 / (a + 5) on " + dn, x);
    check_stages([](const auto& a) { return sc::maximum(a, 0) * 2.f; }, 1e-6, "maximum(a, 0) * 2 on " + dn, x);
    check_stages([](const auto& a) { return (a > 0) && (a < 2.5); }, 0.0, "range mask on " + dn, x);
    check_stages([](const auto& a) { return !(a == 1); }, 0.0, "!(a == 1) on " + dn, x);
    check_stages([](const auto& a) { return -a; }, 0.0, "-a on " + dn, x);
    // max/min with a scalar take the rule's short form unless the scalar is NaN
    check_stages([](const auto& a) { return sc::minimum(sc::maximum(a, -1.5f), 2.5) - sc::maximum(a, 0); }, 0.0,
                 "clamp on " + dn, x);
    check_stages([](const auto& a) { return sc::maximum(a * 1, NAN) + sc::minimum(a, -NAN); }, 0.0, "max/min with NaN on " + dn, x);
    check_stages([](const auto& a) { return sc::minimum(sc::maximum(a * 1, -1.5f), 2.5) + 1; }, 0.0,
                 "clamp with nonzero constants on " + dn, x);
  }
  // a bool tensor with an integer scalar becomes i64; with a float scalar f32
  const Tensor m = values(sc::boolean, {7}, 2);
  check_stages([](const auto& a) { return a + 1; }, 0.0, "bool + 1", m);
  check_stages([](const auto& a) { return a * 1.5; }, 0.0, "bool * 1.5", m);
}

TEST_CASE("max and min against a constant that rounds to zero in f32 keep eager's signed zeros", "[staged][ops]") {
  // 1e-50 is not zero as a double but is +0 as f32: the short form chosen before the loop must
  // look at the value the loop compares with (max(+0, -0) is +0 for the rule, -0 for one max
  // instruction with the operands in that order)
  std::vector<float> v(67);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = i % 3 == 0 ? -0.0f : i % 3 == 1 ? 0.0f : static_cast<float>(i) - 30.f;
  const Tensor x = sc::tensor(v, sc::Shape{67});
  const auto f = [](const auto& a) { return sc::maximum(a * 1, 1e-50) + sc::minimum(a * 1, -1e-50) * 2; };
  const Tensor eager = f(x);
  const Tensor staged = sc::eval(f(sc::stage(x)));
  const Tensor compiled = sc::compile(f)(x);
  const Tensor traced = sc::function([&f](const Tensor& t) { return Tensor(f(t)); })(x);
  const std::vector<float> want = eager.to_vector<float>();
  for (const auto& [what, got] : {std::pair{"staged", staged.to_vector<float>()}, std::pair{"compiled", compiled.to_vector<float>()},
                                  std::pair{"traced", traced.to_vector<float>()}}) {
    INFO(what);
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
      CHECK(got[i] == want[i]);
      CHECK(std::signbit(got[i]) == std::signbit(want[i]));
    }
  }
  // the rule's result, written out: max(+-0, +0) is +0, min(+-0, -0) is -0, their sum is +0
  CHECK_FALSE(std::signbit(want[0]));
  CHECK_FALSE(std::signbit(want[1]));
}

TEST_CASE("staged where and cast equal eager", "[staged][ops]") {
  for (sc::DType d : all_dtypes) {
    const std::string dn(sc::name(d));
    const Tensor c = values(sc::boolean, {4, 1}, 1), a = values(d, {4, 6}, 2), b = values(d, {6}, 3);
    check_stages([](const auto& cc, const auto& x, const auto& y) { return sc::where(cc, x, y); }, 0.0,
                 "where " + dn, c, a, b);
    check_stages([](const auto& x, const auto& y) { return sc::where(x > y, x, 0); }, 0.0, "where(x > y, x, 0) " + dn, a,
                 b);
    check_stages([](const auto& x) { return sc::where(x, 2.5, x); }, 0.0, "where(x, 2.5, x) " + dn, a);
    check_stages([](const auto& x) { return sc::cast<sc::f32>(x); }, 0.0, "cast f32 " + dn, a);
    check_stages([](const auto& x) { return sc::cast<sc::i32>(x) * 2; }, 0.0, "cast i32 " + dn, a);
    check_stages([](const auto& x) { return sc::cast<sc::boolean>(x); }, 0.0, "cast bool " + dn, a);
    check_stages([](const auto& x) { return sc::cast<sc::f64>(x) + 0.25; }, 0.0, "cast f64 " + dn, a);
  }
  // a float condition is read as truth (NaN is true)
  const Tensor f = sc::tensor(std::vector<float>{0.f, 1.f, NAN, -2.f, 0.f}, sc::Shape{5});
  check_stages([](const auto& cc) { return sc::where(cc, cc, 7.f); }, 0.0, "where on a float condition", f);
}

TEST_CASE("long staged chains equal eager on SIMD, tail and threaded sizes", "[staged][ops]") {
  for (std::int64_t n : {1, 15, 16, 17, 100, 70000, 300001}) {
    const Tensor x = values(sc::f32, {n}, 21), w = values(sc::f32, {n}, 22);
    check_stages(
        [](const auto& a, const auto& b) {
          const auto h = sc::tanh(a * b + 0.5f) * sc::sigmoid(a) - b / (1 + sc::exp(-a));
          return sc::where(h > 0, sc::sqrt(sc::abs(h)), sc::square(h)) + sc::maximum(a, b) * sc::sin(b);
        },
        // bit for bit: the fused loop rounds each op's result (no contraction across ops)
        0.0, "chain of 16 ops, n=" + std::to_string(n), x, w);
  }
}

// The fused loop's grain is the cheap grain over the expression's summed op costs (1 for an add, 8
// for exp or a division), as the traced plans': a chain of cheap ops splits where one add would not.
TEST_CASE("a staged expression's parallel grain: its ops' costs summed", "[staged][threads]") {
  namespace st = sc::staging;
  namespace cpu = sc::backend::cpu;
  const Tensor x = values(sc::f32, {8}, 1);
  const auto a = sc::stage(x), b = sc::stage(x);
  using Add = decltype(a + b)::node_type;
  using Chain = decltype(sc::maximum((a * b + 0.5f) * 0.999f, -1.f) - 0.25f)::node_type;
  using Exp = decltype(sc::exp(a))::node_type;
  using Mixed = decltype(sc::where(a > 0, a / b, sc::tanh(a)) + 1)::node_type;
  STATIC_REQUIRE(st::Leaf::cost == 0);
  STATIC_REQUIRE(Add::cost == 1);
  STATIC_REQUIRE(Chain::cost == 5);
  STATIC_REQUIRE(Exp::cost == st::costly_cost);
  STATIC_REQUIRE(Mixed::cost == 1 + 8 + 8 + 1 + 1);  // compare, divide, tanh, where, add
  STATIC_REQUIRE(st::grain_for<Add::cost>() == cpu::grain_cheap);
  STATIC_REQUIRE(st::grain_for<Chain::cost>() == cpu::grain_cheap / 5);
  STATIC_REQUIRE(st::grain_for<Exp::cost>() == cpu::grain_costly);
  STATIC_REQUIRE(st::grain_for<1000>() == cpu::grain_heavy);
}

TEST_CASE("an expression kept in auto owns its tensors", "[staged][lifetime]") {
  auto make = [] {
    const Tensor a = sc::ones({1000}) * 3.f;  // dies with this scope; the expression holds a handle
    return sc::tanh(sc::stage(a)) * 2.f + sc::stage(sc::ones({1000}));
  };
  auto e = make();
  const Tensor y = sc::eval(e);
  const Tensor want = sc::tanh(sc::ones({1000}) * 3.f) * 2.f + 1.f;
  sctest::check_same(y, want, 0.0, "expression outliving its inputs");
  const Tensor again = e;  // converting evaluates again, from the same handles
  sctest::check_same(again, want, 0.0, "second evaluation");
}

TEST_CASE("staged errors name the op, the shapes and the user's line", "[staged][errors]") {
  const Tensor a = sc::ones({2, 3}), b = sc::ones({4});
  const std::string msg = sctest::error_of<sc::ShapeError>([&] { (void)sc::eval(sc::stage(a) + b); });
  CHECK(msg.find("add") != std::string::npos);
  CHECK(msg.find("[2, 3]") != std::string::npos);
  CHECK(msg.find("[4]") != std::string::npos);
  CHECK(msg.find("test_staged_ops.cpp") != std::string::npos);
  const Tensor m = sc::ones({3}) > 0;
  const std::string dmsg = sctest::error_of<sc::DTypeError>([&] { (void)sc::eval(sc::stage(m) * m); });
  CHECK(dmsg.find("mul") != std::string::npos);
  CHECK(dmsg.find("bool") != std::string::npos);
  auto g = sc::compile([](auto x, auto y) { return x - y; });
  const std::string cmsg = sctest::error_of<sc::ShapeError>([&] { (void)g(a, b); });
  CHECK(cmsg.find("sub") != std::string::npos);
  CHECK(cmsg.find("test_staged_ops.cpp") != std::string::npos);
  CHECK_THROWS_AS(sc::stage(Tensor()), sc::Error);
}

TEST_CASE("an integer scalar that does not fit the tensor's dtype raises eager's DTypeError", "[staged][errors]") {
  const Tensor i = sc::tensor(std::vector<std::int32_t>{1, -2}, sc::Shape{2});
  sctest::check_stages([](const auto& a) { return a + 3000000000LL; }, 0.0, "i32 + 3e9", i);
  sctest::check_stages([](const auto& a) { return a + 3000000000LL; }, 0.0, "i64 + 3e9 fits", sc::cast(i, sc::i64));
  // the fused loop names the op reading the scalar and the caller's line
  const std::string msg = sctest::error_of<sc::DTypeError>([&] {
    (void)sc::compile([](auto a) { return a * 2 - 3000000000LL; })(i);
  });
  CHECK(msg.find("[sub] the integer 3000000000 does not fit the tensor's dtype i32") == 0);
  CHECK(msg.find("test_staged_ops.cpp") != std::string::npos);
  // too large for i64 too: eager's words, no .astype(sc::i64) hint for an i64 tensor
  const std::string wide = sctest::error_of<sc::DTypeError>([&] {
    (void)sc::compile([](auto a) { return a + 18446744073709551615ull; })(sc::cast(i, sc::i64));
  });
  CHECK(wide.find("[add] the integer 18446744073709551615 does not fit i64") == 0);
  CHECK(wide.find(".astype") == std::string::npos);
  // the op-by-op path (operands of two dtypes), and a cast inside a float expression
  const auto mixed = sc::compile([](auto a, auto b) { return (a + 3000000000LL) * b; });
  CHECK(sctest::error_kind([&] { (void)mixed(i, sc::ones({2})); }) == "DTypeError");
  const auto inner = sc::compile([](auto a) { return sc::sum(sc::cast<sc::f32>(sc::cast<sc::i32>(a) - 3000000000LL)); });
  CHECK(sctest::error_kind([&] { (void)inner(sc::ones({2})); }) == "DTypeError");
}
