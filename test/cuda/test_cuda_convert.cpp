// Inputs converted as a GPU group reads them (FusedProgram::input_dtypes: a cast the fusion pass
// took into the group), checked without a GPU: the generated kernels (one program's, its 16-byte
// form, and programs launched together) compile under NVRTC and, built for the host, compute what
// the CPU evaluator computes on inputs cast first by the eager cast op; the CPU evaluator refuses
// such programs; the fusion pass takes a cast into GPU groups only where nothing else reads it.
#include "testing.hpp"

#include <stagecraft/graph/cuda_fused_batch.hpp>
#include <stagecraft/graph/function.hpp>
#include <stagecraft/stagecraft.hpp>

#include "cuda/rtc_host_testing.hpp"
#include "graph/function_testing.hpp"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace {

using sc::graph::FusedProgram;
using sc::ops::OpId;
using HostBuilt = sctest::rtc::HostBuilt;

/// f64 [5, 7] = x * y + z, then times m; x the register of an i64 [5, 7] input, y of f32 [7]
/// (broadcast), m of bool [5, 1], z a plain f64 []; x's converted register is an output too.
FusedProgram mixed_program() {
  FusedProgram p;
  p.dtype = sc::f64;
  p.out_shape = {5, 7};
  p.input_shapes = {{5, 7}, {7}, {}, {5, 1}};
  p.input_dtypes = {sc::i64, sc::f32, sc::f64, sc::boolean};
  p.code = {{OpId::Mul, 0, 1}, {OpId::Add, 4, 2}, {OpId::Mul, 5, 3}};
  p.outputs = {6, 0};
  return p;
}

/// i32 [12] = x + 1 with x converted from f32: NaN, infinities and values out of range included.
FusedProgram to_int_program() {
  FusedProgram p;
  p.dtype = sc::i32;
  p.out_shape = {12};
  p.input_shapes = {{12}, {}};
  p.input_dtypes = {sc::f32, sc::i32};
  p.code = {{OpId::Add, 0, 1}};
  p.outputs = {2};
  return p;
}

/// f32 [1001] = v * s - w with s converted from an f64 [] (a learning rate): 16-byte accesses
/// allowed, the converted input being one value.
FusedProgram scalar_program() {
  FusedProgram p;
  p.dtype = sc::f32;
  p.out_shape = {1001};
  p.input_shapes = {{1001}, {}, {1001}};
  p.input_dtypes = {sc::f32, sc::f64, sc::f32};
  p.code = {{OpId::Mul, 0, 1}, {OpId::Sub, 3, 2}};
  p.outputs = {4};
  return p;
}

/// Inputs for p of their own dtypes: values of both signs, bools alternating; to_int_program's x
/// gets the values a cast to int must define.
std::vector<sc::Tensor> inputs_of(const FusedProgram& p, std::uint64_t seed) {
  std::vector<sc::Tensor> in;
  for (std::size_t k = 0; k < p.input_shapes.size(); ++k) {
    const sc::Tensor u = sctest::uniform_tensor(p.arg_shape(k), seed + k, -40.0, 40.0);
    const sc::DType d = p.arg_dtype(k);
    in.push_back(d == sc::boolean ? u > 0.0 : u.astype(d));
  }
  if (p.dtype == sc::i32) {
    const float inf = std::numeric_limits<float>::infinity();
    in[0] = sc::tensor(std::vector<float>{std::nanf(""), inf, -inf, 3.7f, -2.5f, 3e9f, -3e9f, 2147483520.f, -2147483648.f,
                                          0.f, -0.f, 1e-30f},
                       sc::Shape{12});
  }
  return in;
}

/// The CPU evaluator's outputs for p over `in`, each converted input cast first by the eager cast op.
std::vector<sc::Tensor> reference(const FusedProgram& p, const std::vector<sc::Tensor>& in) {
  FusedProgram q = p;
  q.input_dtypes.clear();
  std::vector<sc::Tensor> cast_in;
  for (const sc::Tensor& t : in) cast_in.push_back(sc::cast(t, p.dtype));
  std::vector<sc::Tensor> out;
  for (std::size_t t = 0; t < q.num_out_args(); ++t) out.push_back(sc::zeros(q.out_arg_shape(t), q.dtype));
  sc::graph::run_fused(q, cast_in, out);
  return out;
}

void check_equal(const std::vector<sc::Tensor>& got, const std::vector<sc::Tensor>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t j = 0; j < got.size(); ++j) {
    const auto g = got[j].to_vector<double>(), w = want[j].to_vector<double>();
    REQUIRE(g.size() == w.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      INFO("output " << j << " element " << i << ": " << g[i] << " vs " << w[i]);
      CHECK(g[i] == w[i]);  // (a conversion, then +, * and -: the same bits)
    }
  }
}

/// p's kernel built for the host (and `vector`: its 16-byte kernel) against the reference.
void check_on_host(const FusedProgram& p, bool vector) {
  const HostBuilt k(p);
  INFO(k.error());
  REQUIRE(k.error().empty());
  REQUIRE(k.has_vector_kernel() == vector);
  const std::vector<sc::Tensor> in = inputs_of(p, 17);
  const std::vector<sc::Tensor> want = reference(p, in);
  for (const bool v : {false, vector}) {
    std::vector<sc::Tensor> got;
    for (const sc::Tensor& w : want) got.push_back(sc::full(w.shape(), -12345.0, w.dtype()));  // poisoned
    k.run(in, got, p.out_shape.numel(), v);
    check_equal(got, want);
  }
}


}  // namespace

TEST_CASE("convert: converted inputs are read by the cast's rule, and compile under NVRTC", "[cuda][rtc][convert]") {
  const FusedProgram p = mixed_program();
  CHECK(sc::graph::cuda_fusible(p));
  CHECK_FALSE(sc::graph::cuda_vectorizable(p));  // (a converted input read element by element)
  const std::string src = sc::graph::cuda_source(p);
  CHECK_THAT(src, Catch::Contains("const long long* in0"));
  CHECK_THAT(src, Catch::Contains("const float* in1"));
  CHECK_THAT(src, Catch::Contains("const double* in2"));
  CHECK_THAT(src, Catch::Contains("const bool* in3"));
  CHECK_THAT(src, Catch::Contains("r::Cast<double>::f(in0[i])"));
  CHECK_THAT(src, Catch::Contains("= in2[0];"));  // (not converted)
  const FusedProgram s = scalar_program();
  CHECK(sc::graph::cuda_vectorizable(s));  // (the converted input is one value)
  CHECK_THAT(sc::graph::cuda_source(s), Catch::Contains("r::Cast<float>::f(in1[0])"));
#if defined(STAGECRAFT_WITH_CUDA)
  for (const FusedProgram& q : {p, to_int_program(), s}) sctest::rtc::check_compiles(sc::graph::cuda_source(q));
  sctest::rtc::check_compiles(sc::graph::cuda_batch_source({p, to_int_program(), s}));
#else
  WARN("built without CUDA: no NVRTC to compile with");
#endif
}

TEST_CASE("convert: the generated kernels, built for the host, compute what casting the inputs first does",
          "[cuda][rtc][convert][hostcc]") {
  SECTION("i64, f32 and bool inputs of an f64 program, one written out") { check_on_host(mixed_program(), false); }
  SECTION("f32 to i32: NaN, infinities and out of range as the cast op defines them") { check_on_host(to_int_program(), false); }
  SECTION("an f64 scalar in an f32 program, 16-byte accesses and the tail") { check_on_host(scalar_program(), true); }
  SECTION("launched together") {
    const std::vector<FusedProgram> ps = {mixed_program(), to_int_program(), scalar_program()};
    const HostBuilt k(ps);
    INFO(k.error());
    REQUIRE(k.error().empty());
    std::vector<sc::Tensor> in, got, want;
    for (std::size_t j = 0; j < ps.size(); ++j) {
      const std::vector<sc::Tensor> i = inputs_of(ps[j], 30 + j), w = reference(ps[j], i);
      in.insert(in.end(), i.begin(), i.end());
      want.insert(want.end(), w.begin(), w.end());
    }
    for (const sc::Tensor& w : want) got.push_back(sc::full(w.shape(), -12345.0, w.dtype()));
    k.run(in, got, sc::graph::cuda_batch_starts(ps).back());
    check_equal(got, want);
  }
}

TEST_CASE("convert: the CPU evaluator refuses converted inputs, and bad input dtypes are named", "[cuda][rtc][convert]") {
  CHECK_THROWS_WITH(sc::graph::prepare(mixed_program()), Catch::Contains("generated GPU kernels only"));
  FusedProgram p = mixed_program();
  p.input_dtypes.pop_back();
  CHECK_THROWS_WITH(sc::graph::cuda_source(p), Catch::Contains("3 input dtypes for 4 inputs"));
  FusedProgram q;  // a product's slot converted
  q.dtype = sc::f32;
  q.out_shape = {4, 6};
  q.input_shapes = {{4, 6}, {3, 6}};
  q.products = {{{4, 3}, 1, false, false, false}, {{}, -1, false, false, true}};
  q.input_dtypes = {sc::f64, sc::f32};
  q.code = {{OpId::Neg, 0}};
  q.outputs = {2};
  CHECK_THROWS_WITH(sc::graph::cuda_source(q), Catch::Contains("input 0 is converted from f64 and is a product"));
  // Programs over the same dtypes alone are untouched: an input_dtypes naming only the program's
  // dtype converts nothing.
  FusedProgram same = scalar_program();
  same.input_dtypes = {sc::f32, sc::f32, sc::f32};
  CHECK_FALSE(same.any_converted());
  CHECK_NOTHROW(sc::graph::prepare(same));
}

namespace {
/// The plan a GPU lowers for f traced over `args`, with its listing in the test's output.
std::shared_ptr<const sc::graph::Plan> gpu_plan_of(const std::function<sc::Tensor(const sc::Tensor&, const sc::Tensor&)>& f,
                                                   const sc::Tensor& a, const sc::Tensor& b) {
  auto fn = sc::function(f);
  fn(a, b);
  auto plan = sctest::function::gpu_plan(fn.get_concrete(a, b));
  UNSCOPED_INFO(plan->str());
  return plan;
}
}  // namespace

TEST_CASE("convert: on a GPU a cast read only by fused groups is read converted by each, and never runs", "[cuda][convert]") {
  const sc::Tensor x = sctest::uniform_tensor({1000}, 3, -1.0, 1.0).astype(sc::f32),
                   n = sc::tensor(std::vector<std::int64_t>{7}, sc::Shape{});
  SECTION("one group") {
    auto plan = gpu_plan_of([](const sc::Tensor& a, const sc::Tensor& b) { return a * sc::cast(b, sc::f32) + 1.f; }, x, n);
    CHECK(plan->stats().kernels == 1);
    CHECK_THAT(plan->str(), Catch::Contains("fused cast, mul, add -> f32[1000] cuda:0"));
  }
  SECTION("one op alone: a group of its own, which reads the cast") {
    auto plan = gpu_plan_of([](const sc::Tensor& a, const sc::Tensor& b) { return a * sc::cast(b, sc::f32); }, x, n);
    CHECK(plan->stats().kernels == 1);
    CHECK_THAT(plan->str(), Catch::Contains("fused cast, mul -> f32[1000] cuda:0"));
  }
  SECTION("two groups of different shapes") {
    auto plan = gpu_plan_of(
        [](const sc::Tensor& a, const sc::Tensor& b) {
          const sc::Tensor s = sc::cast(b, sc::f32);
          return sc::concat({sc::exp(a * s), sc::reshape(sc::abs(sc::reshape(a, {10, 100}) - s) * 2.f, {1000})}, 0);
        },
        x, n);
    CHECK(plan->str().find("kernel cast") == std::string::npos);
    CHECK(plan->stats().fused_groups == 2);
    CHECK(plan->stats().kernels == 2);  // (the two groups launched together, and the concat)
  }
  SECTION("read by a kernel too: the cast runs") {
    auto plan = gpu_plan_of(
        [](const sc::Tensor& a, const sc::Tensor& b) {
          const sc::Tensor s = sc::cast(sc::reshape(b, {1, 1}), sc::f32);
          return sc::matmul(sc::reshape(a, {1000, 1}), s) + s * 2.f;
        },
        x, n);
    CHECK_THAT(plan->str(), Catch::Contains("kernel cast -> f32[1, 1] cuda:0"));
  }
  SECTION("a result of the function: the cast runs") {
    auto fn = sc::function([](const sc::Tensor& a, const sc::Tensor& b) {
      const sc::Tensor s = sc::cast(b, sc::f32);
      return std::vector<sc::Tensor>{a * s + 1.f, s};
    });
    fn(x, n);
    auto plan = sctest::function::gpu_plan(fn.get_concrete(x, n));
    INFO(plan->str());
    CHECK_THAT(plan->str(), Catch::Contains("kernel cast -> f32[] cuda:0"));
  }
}

TEST_CASE("convert: the MLP Adam step's plan for a GPU converts its step count and learning rate in its groups",
          "[cuda][convert]") {
  // The step count (i64) cast to f64 for the bias corrections, and the learning rate (f64) cast to
  // f32 for the six updates: both read converted, no cast kernel (17 -> 15 kernels). And the last
  // layer's input gradient g W^T (K = 10), read by ReLU's gradient alone, is formed in its kernel
  // (15 -> 14); the first's (K = 128, 2^22 multiply-adds) stays a cuBLAS call.
  const sc::ConcreteFunction c = sctest::function::traced_mlp_adam_step().second;
  auto plan = sctest::function::gpu_plan(c);
  INFO(plan->str());
  CHECK(plan->stats().kernels <= 13);  // (and the loss with its gradient: 14 -> 13)
  CHECK(plan->str().find("kernel cast") == std::string::npos);
  CHECK_THAT(plan->str(), Catch::Contains("fused cast, pow"));
  CHECK_THAT(plan->str(), Catch::Contains("fused matmul, relu_grad [4 threads per element] -> f32[128, 128]"));  // (K = 10)
  CHECK_THAT(plan->str(), Catch::Contains("kernel matmul -> f32[128, 256]"));
  CHECK_THAT(plan->str(), Catch::Contains("kernel relu_grad -> f32[128, 256]"));  // (its own eager kernel, not a generated one)
  CHECK_THAT(plan->str(), Catch::Contains("kernel softmax_cross_entropy + its gradient (one pass) -> f32[] cuda:0, f32[128, 10] cuda:0"));
  CHECK(plan->stats().losses_with_gradient == 1);
}

TEST_CASE("convert: on a GPU one op alone forms a product only it reads, and not one read elsewhere", "[cuda][product]") {
  const sc::Tensor a = sctest::uniform_tensor({64, 8}, 5, -1.0, 1.0).astype(sc::f32),
                   b = sctest::uniform_tensor({8, 32}, 6, -1.0, 1.0).astype(sc::f32);
  auto alone = gpu_plan_of([](const sc::Tensor& p, const sc::Tensor& q) { return sc::matmul(p, q) * 2.f; }, a, b);
  CHECK(alone->stats().kernels == 1);
  CHECK(alone->stats().fused_products == 1);
  auto fn = sc::function([](const sc::Tensor& p, const sc::Tensor& q) {
    const sc::Tensor y = sc::matmul(p, q);
    return std::vector<sc::Tensor>{y * 2.f, y};  // (the product is a result too)
  });
  fn(a, b);
  auto kept = sctest::function::gpu_plan(fn.get_concrete(a, b));
  INFO(kept->str());
  CHECK(kept->stats().fused_products == 0);
  CHECK_THAT(kept->str(), Catch::Contains("kernel matmul -> f32[64, 32] cuda:0\n1. kernel mul"));
}
