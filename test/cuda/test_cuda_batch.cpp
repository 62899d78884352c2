// Fused groups launched together on a GPU (graph/cuda_fused_batch.hpp), checked without one: the
// batch kernel's source compiles under NVRTC and, built for the host, computes what the CPU
// evaluator computes for each of its programs; programs it cannot take are named; the plan a GPU
// lowers launches an optimizer's updates of every variable as one kernel.
#include "testing.hpp"

#include <stagecraft/graph/cuda_fused_batch.hpp>
#include <stagecraft/graph/function.hpp>
#include <stagecraft/stagecraft.hpp>

#include "cuda/rtc_host_testing.hpp"
#include "graph/function_testing.hpp"

#include <cmath>
#include <string>
#include <vector>

namespace {

using sc::graph::FusedProgram;
using sc::ops::OpId;

/// The programs of the tests: different dtypes, shapes, broadcasting, windows in and out, one
/// element, more elements than a block of threads, and a product formed in the kernel.
std::vector<FusedProgram> mixed_programs() {
  std::vector<FusedProgram> ps;
  FusedProgram a;  // f32 [3, 4, 5] = x [3, 1, 5] * y [4, 1] + s [], and its max with x
  a.dtype = sc::f32;
  a.out_shape = {3, 4, 5};
  a.input_shapes = {{3, 1, 5}, {4, 1}, {}};
  a.code = {{OpId::Mul, 0, 1}, {OpId::Add, 3, 2}, {OpId::Maximum, 4, 0}};
  a.outputs = {4, 5};
  ps.push_back(a);
  FusedProgram b;  // i64 [7] = a - b, and its negation
  b.dtype = sc::i64;
  b.out_shape = {7};
  b.input_shapes = {{7}, {7}};
  b.code = {{OpId::Sub, 0, 1}, {OpId::Neg, 2}};
  b.outputs = {3, 2};
  ps.push_back(b);
  FusedProgram c;  // f64 [6, 9]: a window of [8, 12] at (1, 2) times z [9], and z's square, side by side in [6, 18]
  c.dtype = sc::f64;
  c.out_shape = {6, 9};
  c.input_shapes = {{6, 9}, {9}};
  c.windows = {{{8, 12}, {1, 2}}, {}};
  c.code = {{OpId::Mul, 0, 1}, {OpId::Mul, 1, 1}};
  c.outputs = {2, 3};
  c.out_windows = {{{6, 18}, {0, 0}}, {{6, 18}, {0, 9}}};
  c.out_args = {0, 0};
  ps.push_back(c);
  FusedProgram d;  // f32 [1] = u + u
  d.dtype = sc::f32;
  d.out_shape = {1};
  d.input_shapes = {{1}};
  d.code = {{OpId::Add, 0, 0}};
  d.outputs = {1};
  ps.push_back(d);
  FusedProgram e;  // f32 [1000] = v * 3 - w
  e.dtype = sc::f32;
  e.out_shape = {1000};
  e.input_shapes = {{1000}, {}, {1000}};
  e.code = {{OpId::Mul, 0, 1}, {OpId::Sub, 3, 2}};
  e.outputs = {4};
  ps.push_back(e);
  FusedProgram f;  // f32 [4, 6] = A [4, 3] B [3, 6] (formed in the kernel) + z [6]
  f.dtype = sc::f32;
  f.out_shape = {4, 6};
  f.input_shapes = {{4, 6}, {6}, {3, 6}};
  f.products = {{{4, 3}, 2, false, false, false}, {}, {{}, -1, false, false, true}};
  f.code = {{OpId::Add, 0, 1}};
  f.outputs = {3};
  ps.push_back(f);
  return ps;
}

}  // namespace

TEST_CASE("batch: programs launched together, built for the host, compute what the CPU evaluator does",
          "[cuda][rtc][batch][hostcc]") {
  const std::vector<FusedProgram> ps = mixed_programs();
  for (const FusedProgram& p : ps) REQUIRE(sc::graph::cuda_batchable(p));
  const std::vector<std::int64_t> starts = sc::graph::cuda_batch_starts(ps);
  REQUIRE(starts.size() == ps.size() + 1);
  for (std::size_t k = 0; k < ps.size(); ++k) {
    CHECK(starts[k] % 32 == 0);  // (no warp computes two programs)
    CHECK(starts[k + 1] >= starts[k] + ps[k].out_shape.numel());
  }
  const std::string src = sc::graph::cuda_batch_source(ps);
  CHECK_THAT(src, Catch::Contains("sc_fused_batch(const float* in0_0, const float* in0_1, const float* in0_2, float* out0_0, float* out0_1, "));
  CHECK_THAT(src, Catch::Contains("double* out2_0, const float* in3_0"));
  CHECK_THAT(src, Catch::Contains("out2_0[9LL + (i % 9LL) + ((i / 9LL) % 6LL) * 18LL] = r3"));
  CHECK_THAT(src, Catch::Contains("float sc_dot5_0(const float* a, const float* b, long long q)"));
  CHECK_THAT(src, Catch::Contains("sc_dot5_0(in5_0, in5_2, i)"));
#if defined(STAGECRAFT_WITH_CUDA)
  sctest::rtc::check_compiles(src);
#endif
#if defined(SC_TEST_CXX) && defined(SC_TEST_INCLUDE)
  std::vector<sc::Tensor> in, want, got;
  std::vector<std::vector<sc::Tensor>> each_in(ps.size()), each_want(ps.size());
  for (std::size_t k = 0; k < ps.size(); ++k) {
    const FusedProgram& p = ps[k];
    for (std::size_t i = 0; i < p.input_shapes.size(); ++i) {
      const sc::Tensor u = sctest::uniform_tensor(p.arg_shape(i), 60 + 10 * k + i, -4.0, 4.0);
      each_in[k].push_back(u.astype(p.dtype));  // (integers: truncated)
      in.push_back(each_in[k].back());
    }
    for (std::size_t t = 0; t < p.num_out_args(); ++t) {
      each_want[k].push_back(sc::zeros(p.out_arg_shape(t), p.dtype));
      got.push_back(sc::full(p.out_arg_shape(t), -12345.0, p.dtype));  // poisoned: every element must be written
    }
    sc::graph::run_fused(p, each_in[k], each_want[k]);
    want.insert(want.end(), each_want[k].begin(), each_want[k].end());
  }
  const sctest::rtc::HostBuilt kernel(ps);
  INFO(kernel.error());
  REQUIRE(kernel.error().empty());
  kernel.run(in, got, starts.back());
  REQUIRE(got.size() == want.size());
  for (std::size_t j = 0; j < got.size(); ++j) {
    const auto g = got[j].to_vector<double>(), w = want[j].to_vector<double>();
    for (std::size_t i = 0; i < g.size(); ++i) {
      INFO("output tensor " << j << " element " << i);
      CHECK(g[i] == Approx(w[i]).epsilon(1e-5).margin(1e-5));  // (a product's sums in another order)
    }
  }
#endif
}

TEST_CASE("batch: programs that cannot be launched with others are named", "[cuda][rtc][batch]") {
  std::vector<FusedProgram> ps = mixed_programs();
  FusedProgram r = ps[0];  // a row sum consumes it
  r.reduction = sc::graph::FusedReduction{OpId::Sum, 4, 5, sc::Shape{3, 4}};
  CHECK_FALSE(sc::graph::cuda_batchable(r));
  ps.insert(ps.begin() + 1, r);
  CHECK_THROWS_WITH(sc::graph::cuda_batch_source(ps), Catch::Contains("[fused] program 1 cannot be launched with others"));
  const std::int64_t saved = sc::graph::cuda_batch_max_elements();
  sc::graph::cuda_batch_max_elements() = 999;
  CHECK_FALSE(sc::graph::cuda_batchable(mixed_programs()[4]));  // 1000 elements
  CHECK(sc::graph::cuda_batchable(mixed_programs()[2]));
  sc::graph::cuda_batch_max_elements() = saved;
  FusedProgram bad = mixed_programs()[1];
  bad.outputs = {9};
  CHECK_THROWS_WITH(sc::graph::cuda_batch_source({mixed_programs()[0], bad}), Catch::Contains("output register 9 does not exist"));
}

TEST_CASE("batch: a traced Adam step lowered for a GPU launches every variable's update as one kernel", "[cuda][batch]") {
  // The example's MLP (784-256-128-10, Adam, batch 128), its traced graph relabelled cuda:0 and
  // lowered as a GPU's plan (nothing runs): the six updates, each read and assigned in turn, are
  // one launch; the relu layers' products one cuBLASLt call each with their bias and ReLU.
  const sc::ConcreteFunction c = sctest::function::traced_mlp_adam_step().second;
  const sc::graph::PlanStats with = sctest::function::gpu_plan_stats(c);
  sc::graph::cuda_group_batching() = false;
  const sc::graph::PlanStats without = sctest::function::gpu_plan_stats(c);
  sc::graph::cuda_group_batching() = true;
  INFO(with.kernels << " kernels with groups launched together, " << without.kernels << " without");
  CHECK(with.batched_groups == 6);
  CHECK(without.batched_groups == 0);
  CHECK(with.kernels == without.kernels - 5);
  CHECK(with.kernels <= 13);
  CHECK(with.epilogues >= 3);  // (the three layers' products with their bias, two with ReLU, and the bias gradients)
}

TEST_CASE("batch: views between groups run before the batch, or after it when they read its values", "[cuda][batch]") {
  // a's group, a view of a's value (after the batch), a view of the input (before it), and b's
  // group over that view: a and b launched together.
  auto fn = sc::function([](const sc::Tensor& x) {
    const sc::Tensor a = sc::exp(x * 2.f);
    const sc::Tensor a_rows = sc::reshape(a, {30, 10});
    const sc::Tensor b = sc::abs(sc::reshape(x, {10, 30}) - 1.f);
    return std::vector<sc::Tensor>{a_rows, b};
  });
  const sc::Tensor x = sctest::uniform_tensor({300}, 5, -1.0, 1.0).astype(sc::f32);
  fn(x);
  const auto plan = sctest::function::gpu_plan(fn.get_concrete(x));
  const std::string listing = plan->str();
  INFO(listing);
  CHECK(plan->stats().kernels == 1);
  CHECK(plan->stats().batched_groups == 2);
  const auto at = [&](const char* what) { return listing.find(what); };
  REQUIRE(at("fused batch of 2 groups") != std::string::npos);
  CHECK(at("view reshape -> f32[10, 30]") < at("fused batch"));
  CHECK(at("view reshape -> f32[30, 10]") > at("fused batch"));
}
