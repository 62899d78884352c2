// Fused kernels for the GPU, checked without one: the generated source of every fusible op and
// dtype compiles under NVRTC (sm_90), broadcast indices, compile errors with NVRTC's log, and
// traced graphs moved onto a GPU lowering to one generated kernel per group with buffers there.
#include "testing.hpp"
#include "graph_testing.hpp"
#include "cuda/rtc_host_testing.hpp"

#include <stagecraft/graph/cuda_fused.hpp>
#include <stagecraft/graph/plan.hpp>
#include <stagecraft/graph/trace.hpp>

#include <functional>
#include <source_location>

namespace {

using sc::graph::FusedInstr;
using sc::graph::FusedProgram;
using Tensors = std::vector<sc::Tensor>;
namespace cf = sc::graph::detail_cuda_fused;
namespace abi = sc::cuda::abi;

/// One program per dtype with every op that keeps that dtype: unary ops on x [3, 4], binary ops
/// on (x, y) with y [4] broadcast; every result an output.
FusedProgram every_op(sc::DType d) {
  FusedProgram p;
  p.dtype = d;
  p.out_shape = {3, 4};
  p.input_shapes = {{3, 4}, {4}};
  for (int id = 0; id < sc::ops::num_ops; ++id) {
    const auto op = static_cast<sc::ops::OpId>(id);
    if (!sc::graph::fusible(op, d)) continue;
    p.code.push_back(FusedInstr{op, 0, sc::ops::op_info(op).arity == 2 ? 1 : -1});
    p.outputs.push_back(2 + static_cast<int>(p.code.size()) - 1);
  }
  return p;
}

using sctest::trace;

}  // namespace

TEST_CASE("rtc: every fusible op has a rule the generator names", "[cuda][rtc]") {
  for (sc::DType d : {sc::i32, sc::i64, sc::f32, sc::f64}) {
    const FusedProgram p = every_op(d);
    CHECK(p.code.size() >= (sc::is_floating(d) ? 19u : 9u));
    REQUIRE(sc::graph::cuda_fusible(p));
    const std::string src = sc::graph::cuda_source(p);
    for (const FusedInstr& c : p.code)
      CHECK_THAT(src, Catch::Contains("r::" + std::string(cf::rule_names[static_cast<std::size_t>(c.op)]) + "::f("));
  }
  CHECK(cf::rule_names[static_cast<std::size_t>(sc::ops::OpId::Exp)] == "Exp");
  CHECK(cf::rule_names[static_cast<std::size_t>(sc::ops::OpId::Maximum)] == "Maximum");
  CHECK(cf::rule_names[static_cast<std::size_t>(sc::ops::OpId::MatMul)].empty());
}

#if defined(STAGECRAFT_WITH_CUDA)
using sctest::rtc::check_compiles;
#endif

TEST_CASE("rtc: the generated source of every op and dtype compiles under NVRTC", "[cuda][rtc]") {
#if !defined(STAGECRAFT_WITH_CUDA)
  WARN("built without CUDA: no NVRTC to compile with");
#else
  for (sc::DType d : {sc::i32, sc::i64, sc::f32, sc::f64}) {
    for (const bool dense : {false, true}) {  // a broadcast input, or dense ones (the 16-byte kernel too)
      INFO(sc::name(d) << (dense ? " dense" : " broadcast"));
      FusedProgram p = every_op(d);
      if (dense) p.input_shapes = {{3, 4}, {}};
      REQUIRE(sc::graph::cuda_vectorizable(p) == dense);
      const std::string src = sc::graph::cuda_source(p);
      CHECK((src.find("sc_fused_v(") != std::string::npos) == dense);
      check_compiles(src);
    }
  }
  // Row kernels: short rows (several per block, a small tree), long rows (a block each), and
  // rows so long and few that they are cut in pieces (a second kernel combines them).
  for (sc::DType d : {sc::f32, sc::f64}) {
    for (std::int64_t inner : {4, 300, 50000}) {
      INFO(sc::name(d) << " reduction over " << inner);
      FusedProgram p = every_op(d);
      p.out_shape = {3, inner};
      p.input_shapes = {{3, inner}, {inner}};
      p.reduction = sc::graph::FusedReduction{sc::ops::OpId::Max, 4, inner, sc::Shape{3, 1}};
      const std::string src = sc::graph::cuda_source(p);
      CHECK((src.find("sc_fused_r2(") != std::string::npos) == (inner == 50000));
      check_compiles(src);
    }
  }
#endif
}

TEST_CASE("rtc: a source NVRTC rejects returns its log", "[cuda][rtc]") {
#if !defined(STAGECRAFT_WITH_CUDA)
  WARN("built without CUDA: no NVRTC to compile with");
#else
  const char* bad = "#include \"stagecraft/ops/rules.hpp\"\n"
                    "extern \"C\" __global__ void k(float* y) { y[0] = stagecraft::rules::NoSuchRule::f(1.f); }\n";
  char log[4096] = {};
  std::size_t bytes = 0;
  CHECK(abi::rtc_check(bad, 90, &bytes, log, sizeof log) == abi::rtc_compile_error);
  CHECK_THAT(std::string(log), Catch::Contains("NoSuchRule"));
  // An architecture NVRTC does not know compiles to PTX for the newest one below it.
  const char* fine = "extern \"C\" __global__ void k(float* y) { y[0] = 1.f; }\n";
  CHECK(abi::rtc_check(fine, 999, &bytes, log, sizeof log) == 0);
  CHECK(bytes > 0);
#endif
}

TEST_CASE("rtc: broadcast indices drop size-1 axes and merge neighbours", "[cuda][rtc]") {
  CHECK(cf::index_expr({3, 4}, {3, 4}) == "i");
  CHECK(cf::index_expr({}, {3, 4}) == "0");
  CHECK(cf::index_expr({1, 1}, {3, 4}) == "0");
  CHECK(cf::index_expr({4}, {3, 4}) == "(i % 4LL)");
  CHECK(cf::index_expr({3, 1}, {3, 4}) == "(i / 4LL)");
  CHECK(cf::index_expr({2, 1, 5}, {2, 3, 5}) == "(i % 5LL) + (i / 15LL) * 5LL");
  CHECK(cf::index_expr({3, 5}, {2, 3, 5}) == "(i % 15LL)");                   // two axes merged
  CHECK(cf::index_expr({1, 3, 1}, {2, 3, 5}) == "((i / 5LL) % 3LL)");
  CHECK(cf::index_expr({2, 1, 5}, {2, 1, 5}) == "i");
  CHECK(cf::index_expr({1, 5}, {2, 1, 5}) == "(i % 5LL)");  // the size-1 axis dropped
}

TEST_CASE("rtc: floating sum, max and min reductions get a row kernel, others cannot be generated", "[cuda][rtc]") {
  for (sc::DType d : {sc::f32, sc::f64}) {
    for (sc::ops::OpId op : {sc::ops::OpId::Sum, sc::ops::OpId::Max, sc::ops::OpId::Min}) {
      FusedProgram p = every_op(d);
      p.reduction = sc::graph::FusedReduction{op, 5, 4, sc::Shape{3}};
      REQUIRE(sc::graph::cuda_fusible(p));
      CHECK_FALSE(sc::graph::cuda_vectorizable(p));
      const std::string src = sc::graph::cuda_source(p);
      CHECK_THAT(src, Catch::Contains("sc_fused_r(") && Catch::Contains(std::string(cf::c_type(d)) + "* red, long long n"));
      CHECK(src.find("sc_fused(") == std::string::npos);
      CHECK_THAT(src, Catch::Contains(op == sc::ops::OpId::Sum   ? "r::Add::f(acc, r5)"
                                      : op == sc::ops::OpId::Max ? "r::Maximum::f(r5, acc)"
                                                                 : "r::Minimum::f(r5, acc)"));
    }
  }
  FusedProgram p = every_op(sc::i32);  // integer reductions stay eager, as on the CPU
  p.reduction = sc::graph::FusedReduction{sc::ops::OpId::Sum, 2, 4, sc::Shape{3}};
  CHECK_FALSE(sc::graph::cuda_fusible(p));
  CHECK_THROWS_AS(sc::graph::cuda_source(p), sc::ValueError);
  p = every_op(sc::f32);
  p.reduction = sc::graph::FusedReduction{sc::ops::OpId::ArgMax, 2, 4, sc::Shape{3}};
  CHECK_FALSE(sc::graph::cuda_fusible(p));
  // Threads per row: a power of two covering the row, at most a block.
  CHECK(cf::reduce_threads_per_row(1) == 1);
  CHECK(cf::reduce_threads_per_row(10) == 16);
  CHECK(cf::reduce_threads_per_row(256) == 256);
  CHECK(cf::reduce_threads_per_row(1 << 20) == 256);
}

TEST_CASE("rtc: a few long rows are cut in pieces that keep the GPU busy, none empty, eager and fused alike", "[cuda][rtc]") {
  struct Case {
    std::int64_t rows, inner, chunks, chunk;
  };
  for (const Case& c : {Case{1, 1LL << 28, 1024, 1LL << 18},  // a whole-tensor sum: 1024 blocks
                        Case{2, 20000, 4, 5120},               // pieces of 16 elements a thread at least,
                        Case{1, 70001, 17, 4352},              // a multiple of 256: the last piece shorter
                        Case{3, 9000, 2, 4608},
                        Case{1, 8191, 1, 8191},     // too short to cut
                        Case{1024, 1 << 20, 1, 1 << 20},  // rows enough for the GPU
                        Case{600, 1 << 20, 2, 1 << 19},
                        Case{5, 0, 1, 0}}) {
    INFO("[" << c.rows << ", " << c.inner << "]");
    FusedProgram p;
    p.dtype = sc::f32;
    p.out_shape = {c.rows, c.inner};
    p.input_shapes = {p.out_shape};
    p.reduction = sc::graph::FusedReduction{sc::ops::OpId::Sum, 0, c.inner, sc::Shape{c.rows}};
    const cf::ReductionSplit s = sc::graph::cuda_reduction_split(p);
    CHECK(s.chunks == c.chunks);
    CHECK(s.chunk == c.chunk);
    if (s.chunks > 1) {
      CHECK(s.chunk % 256 == 0);
      CHECK((s.chunks - 1) * s.chunk < c.inner);  // the last piece has elements
      CHECK(s.chunks * s.chunk >= c.inner);        // and the pieces cover the row
      CHECK(s.chunk >= abi::split_min_piece);
      CHECK(c.rows * s.chunks <= abi::split_pieces + c.rows);
    }
    // The eager reductions cut alike, their scratch holding a 16-byte partial per piece.
    abi::ReduceGeometry g;
    g.out_numel = c.rows;
    g.red_numel = c.inner;
    CHECK(abi::reduce_scratch_bytes(g) == (s.chunks > 1 ? c.rows * s.chunks * 16 : 0));
  }
}

TEST_CASE("rtc: a traced graph on a GPU lowers to generated kernels and GPU buffers", "[cuda][rtc]") {
  using sc::graph::Graph;
  const sc::TensorSpec x{sc::Shape{64, 32}, sc::f32}, b{sc::Shape{32}, sc::f32};
  Graph g = trace({x, b}, [](const Tensors& a) {
    const sc::Tensor h = sc::relu(a[0] * 2.f + a[1]);                   // one group
    const sc::Tensor s = sc::sum(h, {1});                                // ... which the sum ends
    return Tensors{sc::exp(s) - 1.f, sc::sigmoid(h) * h};                // two more groups
  });
  const Graph on_cpu = g;
  for (sc::graph::Value& v : g.values) v.device = sc::Device::cuda(0);
  sc::graph::cuda_fusion() = true;  // off by default in builds without CUDA (no GPU graph exists there)
  const auto cpu_groups = sc::graph::find_fusion_groups(on_cpu);
  const auto gpu_groups = sc::graph::find_fusion_groups(g);
  REQUIRE(gpu_groups.groups.size() >= 2);
  int gpu_reduces = 0;
  for (const auto& fg : gpu_groups.groups) {
    gpu_reduces += fg.reduce >= 0;  // the sum runs in its group's generated kernel
    CHECK(fg.head < 0);             // no matmul here
    CHECK(sc::graph::cuda_fusible(fg.program));
  }
  CHECK(gpu_reduces == 1);
  int cpu_reduces = 0;
  for (const auto& fg : cpu_groups.groups) cpu_reduces += fg.reduce >= 0;
  CHECK(cpu_reduces == 1);

  const auto shared = std::make_shared<const Graph>(g);
  const sc::graph::Plan plan(shared);
  CHECK(plan.stats().fused_groups == static_cast<int>(gpu_groups.groups.size()));
  CHECK(plan.stats().epilogues == 0);
  CHECK(plan.stats().fused_reductions == 1);

  // With GPU fusion off, no group forms on the GPU.
  sc::graph::cuda_fusion() = false;
  CHECK(sc::graph::find_fusion_groups(g).groups.empty());
  sc::graph::cuda_fusion() = sc::cuda::built;
}

TEST_CASE("rtc: on a GPU, a matmul heads only a bias (and ReLU) group: one cuBLASLt call", "[cuda][rtc]") {
  using sc::graph::Graph;
  using Fn = std::function<Tensors(const Tensors&)>;
  // x [8, 16] (or x^T stored [16, 8]), w [16, 4], b [4]: which layers take the epilogue.
  struct Case {
    const char* what;
    Fn f;
    int heads;
    bool relu;
  };
  const sc::TensorSpec x{sc::Shape{8, 16}, sc::f32}, w{sc::Shape{16, 4}, sc::f32}, b{sc::Shape{4}, sc::f32};
  const std::vector<Case> cases = {
      {"relu(x w + b)", [](const Tensors& a) { return Tensors{sc::relu(sc::matmul(a[0], a[1]) + a[2])}; }, 1, true},
      {"b + x w", [](const Tensors& a) { return Tensors{a[2] + sc::matmul(a[0], a[1])}; }, 1, false},
      {"x w^T + b, w stored [4, 16]",
       [](const Tensors& a) { return Tensors{sc::matmul(a[0], sc::transpose(a[1]), false, true) + a[2]}; }, 1, false},
      {"b [1, 4]", [](const Tensors& a) { return Tensors{sc::relu(sc::matmul(a[0], a[1]) + sc::reshape(a[2], {1, 4}))}; }, 1, true},
      {"the product read again",
       [](const Tensors& a) {
         const sc::Tensor p = sc::matmul(a[0], a[1]);
         return Tensors{sc::relu(p + a[2]), p};
       },
       0, false},
      {"the sum read again",
       [](const Tensors& a) {
         const sc::Tensor s = sc::matmul(a[0], a[1]) + a[2];
         return Tensors{sc::relu(s), s};
       },
       0, false},
      {"tanh, not relu", [](const Tensors& a) { return Tensors{sc::tanh(sc::matmul(a[0], a[1]) + a[2])}; }, 0, false},
      {"a bias over columns", [](const Tensors& a) { return Tensors{sc::matmul(a[0], a[1]) + sc::slice(a[0], {0, 0}, {8, 1})}; }, 0, false},
      {"times, not plus", [](const Tensors& a) { return Tensors{sc::matmul(a[0], a[1]) * a[2]}; }, 0, false},
  };
  sc::graph::cuda_fusion() = true;
  for (const Case& c : cases) {
    INFO(c.what);
    Graph g = trace({x, w, b}, c.f);
    for (sc::graph::Value& v : g.values) v.device = sc::Device::cuda(0);
    const auto groups = sc::graph::find_fusion_groups(g);
    int heads = 0;
    for (const auto& fg : groups.groups) heads += fg.head >= 0;
    CHECK(heads == c.heads);
    const sc::graph::Plan plan(std::make_shared<const Graph>(g));
    CHECK(plan.stats().epilogues == c.heads);
    if (c.heads == 1) CHECK(plan.cuda_graph_obstacle().empty());  // an epilogue step can be captured
  }
  // f64 products, and batched ones, stay apart.
  for (const auto& [d, batched] : {std::pair{sc::f64, false}, std::pair{sc::f32, true}}) {
    INFO(sc::name(d) << (batched ? " batched" : ""));
    const sc::Shape xs = batched ? sc::Shape{2, 8, 16} : sc::Shape{8, 16}, ws = batched ? sc::Shape{2, 16, 4} : sc::Shape{16, 4};
    Graph g = trace({{xs, d}, {ws, d}, {sc::Shape{4}, d}},
                    [](const Tensors& a) { return Tensors{sc::relu(sc::matmul(a[0], a[1]) + a[2])}; });
    for (sc::graph::Value& v : g.values) v.device = sc::Device::cuda(0);
    for (const auto& fg : sc::graph::find_fusion_groups(g).groups) CHECK(fg.head < 0);
  }
  sc::graph::cuda_fusion() = sc::cuda::built;
}

TEST_CASE("rtc: on a GPU, a dense layer's weight and bias gradients are one cuBLASLt call (BGRADA)", "[cuda][rtc]") {
  using sc::graph::Graph;
  // loss = sum(tanh(x w + b)): no forward epilogue (tanh), so every epilogue counted is a merge of
  // dW = x^T g with db = sum(g, {0}).
  auto grads = [](sc::DType d, const sc::Shape& bias, bool want_b) {
    const sc::TensorSpec x{sc::Shape{8, 16}, d}, w{sc::Shape{16, 4}, d}, b{bias, d};
    return trace({x, w, b}, [want_b](const Tensors& a) {
      sc::GradientTape tape;
      tape.watch(a[1]);
      tape.watch(a[2]);
      const sc::Tensor loss = sc::sum(sc::tanh(sc::matmul(a[0], a[1]) + a[2]));
      return want_b ? tape.gradient(loss, Tensors{a[1], a[2]}) : tape.gradient(loss, Tensors{a[1]});
    });
  };
  auto epilogues = [](Graph g, sc::Device dev) {
    for (sc::graph::Value& v : g.values) v.device = dev;
    const sc::graph::Plan plan(std::make_shared<const Graph>(g));
    if (dev.is_cuda()) CHECK(plan.cuda_graph_obstacle().empty());  // a merged step can be captured
    return plan.stats().epilogues;
  };
  const sc::Device gpu0 = sc::Device::cuda(0);
  CHECK(epilogues(grads(sc::f32, sc::Shape{4}, true), gpu0) == 1);
  CHECK(epilogues(grads(sc::f32, sc::Shape{1, 4}, true), gpu0) == 1);  // db [1, 4]: a sum keeping dims
  CHECK(epilogues(grads(sc::f32, sc::Shape{4}, true), sc::Device::cpu()) == 0);
  CHECK(epilogues(grads(sc::f64, sc::Shape{4}, true), gpu0) == 0);
  CHECK(epilogues(grads(sc::f32, sc::Shape{4}, false), gpu0) == 0);  // no bias gradient asked
  // One step fewer, and one kernel fewer, than the same plan on f64.
  Graph g32 = grads(sc::f32, sc::Shape{4}, true), g64 = grads(sc::f64, sc::Shape{4}, true);
  for (Graph* g : {&g32, &g64})
    for (sc::graph::Value& v : g->values) v.device = gpu0;
  const sc::graph::Plan p32(std::make_shared<const Graph>(g32)), p64(std::make_shared<const Graph>(g64));
  CHECK(p32.stats().steps == p64.stats().steps - 1);
  CHECK(p32.stats().kernels == p64.stats().kernels - 1);
}

TEST_CASE("rtc: a GPU reduction's result never takes the buffer of an input its kernel reads", "[cuda][rtc]") {
  // sum(x * exp(b), {1}) * 2 with x [300, 300] and b [300]: exp(b) dies in the fused group, and
  // the row sums (an intermediate, so in planned memory) have its shape. Every block of the row kernel reads all of exp(b) while others write
  // their rows' sums, so the two must not share memory (the CPU evaluator keeps partials apart).
  using sc::graph::Graph;
  Graph g = trace({{sc::Shape{300, 300}, sc::f32}, {sc::Shape{300}, sc::f32}},
                  [](const Tensors& a) { return Tensors{sc::sum(a[0] * sc::exp(a[1]), {1}) * 2.f}; });
  for (sc::graph::Value& v : g.values) v.device = sc::Device::cuda(0);
  sc::graph::cuda_fusion() = true;
  const auto groups = sc::graph::find_fusion_groups(g);
  sc::graph::cuda_fusion() = sc::cuda::built;
  REQUIRE(groups.groups.size() == 1);  // (the product by 2 alone is no group)
  const auto& fg = groups.groups[0];
  REQUIRE(fg.reduce >= 0);
  REQUIRE(fg.inputs.size() == 2);
  const int e = fg.inputs[1], r = fg.outputs.back();  // exp(b) and the row sums
  REQUIRE(g.values[e].shape == g.values[r].shape);
  const int exp_node = g.values[e].node;
  for (const bool apart : {false, true}) {
    std::vector<sc::graph::MemoryPlan::StepUse> uses(2);
    uses[0].in = g.nodes[exp_node].inputs;
    uses[0].out = {e};
    uses[0].in_place_ok = true;
    uses[1].in = fg.inputs;
    uses[1].out = fg.outputs;
    uses[1].in_place_ok = true;
    uses[1].last_out_apart = apart;
    const auto mp = sc::graph::plan_memory(g, uses);
    INFO("last_out_apart " << apart);
    REQUIRE(mp.buffer_of[r] >= 0);
    CHECK((mp.buffer_of[r] == mp.buffer_of[e]) == !apart);
  }
}

TEST_CASE("rtc: buffers are shared only between values on the same device", "[cuda][rtc]") {
  using sc::graph::Graph;
  Graph g = trace({{sc::Shape{256}, sc::f32}}, [](const Tensors& a) {
    const sc::Tensor t1 = sc::exp(a[0]);
    const sc::Tensor t2 = sc::log(t1);  // t1 dies here
    const sc::Tensor t3 = sc::sqrt(t2);
    return Tensors{sc::sum(t3)};
  });
  // The second half of the graph on a GPU: t2 and t3 must not reuse t1's CPU buffer.
  bool gpu = false;
  for (sc::graph::Node& n : g.nodes) {
    if (n.kind == sc::graph::NodeKind::op && n.op == sc::ops::OpId::Log) gpu = true;
    if (gpu)
      for (int v : n.outputs) g.values[v].device = sc::Device::cuda(0);
  }
  std::vector<sc::graph::MemoryPlan::StepUse> uses;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const auto& n = g.nodes[i];
    if (n.kind != sc::graph::NodeKind::op) continue;
    sc::graph::MemoryPlan::StepUse u;
    u.in = n.inputs;
    u.out = n.outputs;
    u.in_place_ok = true;
    uses.push_back(u);
  }
  const auto mp = sc::graph::plan_memory(g, uses);
  for (std::size_t v = 0; v < g.values.size(); ++v)
    if (mp.buffer_of[v] >= 0) CHECK(mp.buffer_device[mp.buffer_of[v]] == g.values[v].device);
  int gpu_buffers = 0, cpu_buffers = 0;
  for (const sc::Device& d : mp.buffer_device) (d.is_cuda() ? gpu_buffers : cpu_buffers) += 1;
  CHECK(cpu_buffers >= 1);
  CHECK(gpu_buffers >= 1);
}

// ---- the generated source computes the program: built by the host compiler and run here ----------
//
// The kernel's text is plain C++ around the rules: with __global__ and the thread indices defined
// for the host, the host compiler builds it, one loop plays the grid, and its results must be the
// CPU evaluator's (graph::run_fused). This checks the generator's indices, registers and outputs
// without a GPU.

#if defined(SC_TEST_CXX) && defined(SC_TEST_INCLUDE)
namespace {

using sctest::rtc::HostBuilt;

/// A program over d with broadcasting inputs x [3, 1, 5], y [4, 1], z [5], s [] to out [3, 4, 5]:
/// every op that keeps d, each reading earlier results, several results written out.
FusedProgram broadcast_program(sc::DType d) {
  FusedProgram p;
  p.dtype = d;
  p.out_shape = {3, 4, 5};
  p.input_shapes = {{3, 1, 5}, {4, 1}, {5}, {}};
  int reg = 4;
  for (int id = 0; id < sc::ops::num_ops; ++id) {
    const auto op = static_cast<sc::ops::OpId>(id);
    if (!sc::graph::fusible(op, d)) continue;
    const int k = reg - 4;
    const int a = k % 4, b = reg > 5 ? reg - 1 : (k + 1) % 4;  // inputs first, then chains of results
    const bool unary = sc::ops::op_info(op).arity == 1;
    // unbounded ops (exp, pow, square) on inputs only, so values stay finite
    const bool grows = op == sc::ops::OpId::Exp || op == sc::ops::OpId::Pow || op == sc::ops::OpId::Square ||
                       op == sc::ops::OpId::Log || op == sc::ops::OpId::Sqrt || op == sc::ops::OpId::Div;
    p.code.push_back(FusedInstr{op, grows ? a : (unary ? reg - 1 : a), unary ? -1 : (grows ? (a + 1) % 4 : b)});
    if (k % 3 == 0) p.outputs.push_back(reg);
    ++reg;
  }
  p.outputs.push_back(reg - 1);
  return p;
}


/// p run by the host-built kernel (vector: sc_fused_v) against graph::run_fused, over `in` (by
/// default positive values, for log, sqrt and div). A reduction's result is checked too, to a
/// relative 1e-5 (f32) for a sum, which adds in another order; exactly for max and min.
void check_against_cpu(const FusedProgram& p, const HostBuilt& k, bool vector, std::vector<sc::Tensor> in = {}) {
  const sc::DType d = p.dtype;
  for (std::size_t i = in.size(); i < p.input_shapes.size(); ++i) {
    const sc::Tensor u = sctest::uniform_tensor(p.arg_shape(i), 40 + i, 0.5, 2.0);  // (a window's parent)
    in.push_back(sc::is_floating(d) ? u.astype(d) : (u * 3).astype(d));
  }
  std::vector<sc::Tensor> want, got;
  for (std::size_t t = 0; t < p.num_out_args(); ++t) {
    want.push_back(sc::zeros(p.out_arg_shape(t), d));
    got.push_back(sc::full(p.out_arg_shape(t), -12345.0, d));  // poisoned: every element must be written
  }
  if (p.reduction) {
    want.push_back(sc::zeros(p.reduction->out_shape, d));
    got.push_back(sc::full(p.reduction->out_shape, -12345.0, d));
  }
  sc::graph::run_fused(p, in, want);
  k.run(in, got, p.out_shape.numel(), vector);
  const bool exact_reduction = p.reduction && p.reduction->op != sc::ops::OpId::Sum;
  for (std::size_t j = 0; j < got.size(); ++j) {
    const auto g = got[j].to_vector<double>(), w = want[j].to_vector<double>();
    const bool exact = exact_reduction && j == p.num_out_args();
    for (std::size_t i = 0; i < g.size(); ++i) {
      INFO("output " << j << " element " << i);
      if (std::isnan(w[i])) CHECK(std::isnan(g[i]));
      else if (exact) CHECK(g[i] == w[i]);
      else CHECK(g[i] == Approx(w[i]).epsilon(d == sc::f32 ? 1e-5 : 1e-12).margin(d == sc::f32 ? 1e-6 : 1e-12));
    }
  }
}

/// src (p's generated source) compiled by NVRTC where the build has CUDA, then p's kernel built
/// for the host (with `lanes` threads per element; 0: cuda_product_lanes) and run against the CPU
/// evaluator (one-element accesses).
void compiled_and_run_on_host(const FusedProgram& p, const std::string& src, int lanes = 0) {
#if defined(STAGECRAFT_WITH_CUDA)
  check_compiles(src);
#else
  (void)src;
#endif
  const HostBuilt k(p, lanes);
  INFO(k.error());
  REQUIRE(k.error().empty());
  check_against_cpu(p, k, false);
}

/// x [rows, inner] * y [inner] + z [rows, 1] - s [] reduced by `op` over each row, and its tanh
/// written out (tanh's last bit may differ from the CPU's SIMD tanh; the reduced value may not).
FusedProgram row_program(sc::DType d, std::int64_t rows, std::int64_t inner, sc::ops::OpId op) {
  using sc::ops::OpId;
  FusedProgram p;
  p.dtype = d;
  p.out_shape = {rows, inner};
  p.input_shapes = {{rows, inner}, {inner}, {rows, 1}, {}};
  p.code = {{OpId::Mul, 0, 1}, {OpId::Add, 4, 2}, {OpId::Sub, 5, 3}, {OpId::Tanh, 6}};
  p.outputs = {7};
  p.reduction = sc::graph::FusedReduction{op, 6, inner, sc::Shape{rows}};
  return p;
}

}  // namespace

TEST_CASE("rtc: the generated kernel, built for the host, computes what the CPU evaluator does", "[cuda][rtc][hostcc]") {
  for (sc::DType d : {sc::f32, sc::f64, sc::i32, sc::i64}) {
    INFO(sc::name(d));
    const FusedProgram p = broadcast_program(d);
    CHECK_FALSE(sc::graph::cuda_vectorizable(p));  // broadcast inputs: one element per access
    const HostBuilt k(p);
    INFO(k.error());
    REQUIRE(k.error().empty());
    check_against_cpu(p, k, false);
  }
}

TEST_CASE("rtc: inputs read through windows (absorbed slices), built for the host, compute what the CPU evaluator does",
          "[cuda][rtc][window][hostcc]") {
  using sc::ops::OpId;
  for (sc::DType d : {sc::f32, sc::f64, sc::i32, sc::i64})
    for (bool reduce : {false, true}) {
      if (reduce && !sc::is_floating(d)) continue;
      INFO(sc::name(d) << (reduce ? ", rows summed" : ""));
      // x: a [7, 9] window of [10, 14] at (2, 3); y [9] plain; z: one row of [4, 11] at (1, 2),
      // broadcast over the rows; s: one element of [3, 3] at (2, 1)
      FusedProgram p = row_program(d, 7, 9, OpId::Sum);
      if (!reduce) p.reduction.reset();
      if (!sc::is_floating(d)) p.code[3] = {OpId::Neg, 6};  // (no tanh for integers)
      p.input_shapes = {{7, 9}, {9}, {1, 9}, {1, 1}};
      p.windows = {{{10, 14}, {2, 3}}, {}, {{4, 11}, {1, 2}}, {{3, 3}, {2, 1}}};
      CHECK_FALSE(sc::graph::cuda_vectorizable(p));
      const std::string src = sc::graph::cuda_source(p);
      CHECK_THAT(src, Catch::Contains("in0[31LL + (i % 9LL) + ((i / 9LL) % 7LL) * 14LL]"));
      CHECK_THAT(src, Catch::Contains("in3[7LL]"));
      compiled_and_run_on_host(p, src);
    }
}

/// x: [7, 9] window at (0, 9) of the product op(A) op(B) of [7, 27] (inner 13); y [9] plain;
/// z: one row of the product at (3, 0), broadcast over the rows; s [] plain; B is input 4. As
/// row_program, its rows summed when `reduce`.
FusedProgram product_program(sc::DType d, bool ta, bool tb, bool reduce) {
  using sc::ops::OpId;
  FusedProgram p = row_program(d, 7, 9, OpId::Sum);
  p.code = {{OpId::Mul, 0, 1}, {OpId::Add, 5, 2}, {OpId::Sub, 6, 3}, {OpId::Tanh, 7}};  // (five inputs)
  p.outputs = {8};
  p.reduction->reg = 7;
  if (!reduce) p.reduction.reset();
  const sc::Shape as = ta ? sc::Shape{13, 7} : sc::Shape{7, 13}, bs = tb ? sc::Shape{27, 13} : sc::Shape{13, 27};
  p.input_shapes = {{7, 9}, {9}, {1, 9}, {}, bs};
  p.windows = {{{7, 27}, {0, 9}}, {}, {{7, 27}, {3, 0}}, {}, {}};
  p.products = {{as, 4, ta, tb, false}, {}, {as, 4, ta, tb, false}, {}, {{}, -1, false, false, true}};
  return p;
}

TEST_CASE("rtc: inputs formed as small products in the kernel, built for the host, compute what the CPU evaluator does",
          "[cuda][rtc][product][hostcc]") {
  for (sc::DType d : {sc::f32, sc::f64})
    for (int flags = 0; flags < 4; ++flags)
      for (bool reduce : {false, true}) {
        const bool ta = (flags & 1) != 0, tb = (flags & 2) != 0;
        INFO(sc::name(d) << " ta " << ta << " tb " << tb << (reduce ? ", rows summed" : ""));
        const FusedProgram p = product_program(d, ta, tb, reduce);
        const std::string src = sc::graph::cuda_source(p, 1);
        CHECK_THAT(src, Catch::Contains("sc_dot0(in0, in4, "));
        CHECK_THAT(src, Catch::Contains("std::fma("));
        CHECK_FALSE(sc::graph::cuda_vectorizable(p));
        compiled_and_run_on_host(p, src, 1);
      }
}

TEST_CASE("rtc: an element's products formed by lanes of a warp together, built for the host with real threads, compute "
          "what the CPU evaluator does", "[cuda][rtc][product][hostcc]") {
  // 63 elements, 13 terms: 2 lanes (7 and 6 terms), 8 (a warp's last element past the end), 32
  // (19 lanes without a term); three blocks of 256 threads, so 32 lanes take three passes.
  // With the rows summed: the elements by lanes (the reduced register one more output), then a
  // second kernel reducing them.
  for (sc::DType d : {sc::f32, sc::f64})
    for (int flags = 0; flags < 4; ++flags)
      for (int lanes : {2, 8, 32})
        for (bool reduce : {false, true}) {
          if (d == sc::f64 && lanes != 8) continue;
          if (reduce && flags % 3 != 0) continue;
          const bool ta = (flags & 1) != 0, tb = (flags & 2) != 0;
          INFO(sc::name(d) << " ta " << ta << " tb " << tb << ", " << lanes << " lanes" << (reduce ? ", rows summed" : ""));
          const FusedProgram p = product_program(d, ta, tb, reduce);
          const std::string src = sc::graph::cuda_source(p, lanes);
          CHECK_THAT(src, Catch::Contains("sc_dot0(in0, in4, "));
          CHECK_THAT(src, Catch::Contains("lane)"));
          CHECK_THAT(src, Catch::Contains("__shfl_xor_sync(0xffffffffu, s, " + std::to_string(lanes / 2) + ")"));
          CHECK_THAT(src, Catch::Contains("if (own) out0["));
          if (reduce) CHECK_THAT(src, Catch::Contains("if (own) out1[") && Catch::Contains("sc_fused_r2(const"));
          compiled_and_run_on_host(p, src, lanes);
        }
  CHECK_THROWS_WITH(sc::graph::cuda_source(product_program(sc::f32, false, false, false), 3), Catch::Contains("a power of two up to 32"));
  CHECK_THROWS_WITH(sc::graph::cuda_source(row_program(sc::f32, 7, 9, sc::ops::OpId::Sum), 4),
                    Catch::Contains("[fused] 4 threads per element") && Catch::Contains("1 for a program without products"));
}

TEST_CASE("rtc: lanes per element: a few elements with long products get a warp, many a thread each", "[cuda][rtc][product]") {
  using sc::ops::OpId;
  // One element per output of [m, n] = h [m, k] x U [k, n] + b, as an LSTM step's gates.
  auto step = [](std::int64_t m, std::int64_t k, std::int64_t n) {
    FusedProgram p;
    p.out_shape = {m, n};
    p.input_shapes = {{m, n}, {n}, {k, n}};
    p.products = {{{m, k}, 2, false, false, false}, {}, {{}, -1, false, false, true}};
    p.code = {{OpId::Add, 0, 1}, {OpId::Tanh, 3}};
    p.outputs = {4};
    return p;
  };
  CHECK(sc::graph::cuda_product_lanes(step(1, 64, 256)) == 32);    // an LSTM step at batch 1
  CHECK(sc::graph::cuda_product_lanes(step(1, 256, 64)) == 32);    // its gradient
  CHECK(sc::graph::cuda_product_lanes(step(32, 64, 256)) == 16);   // 8192 elements: 2^17 threads
  CHECK(sc::graph::cuda_product_lanes(step(128, 784, 256)) == 4);  // 32768 elements
  CHECK(sc::graph::cuda_product_lanes(step(512, 784, 256)) == 1);  // a GPU's worth of elements
  CHECK(sc::graph::cuda_product_lanes(step(1, 8, 256)) == 4);      // at least two terms a lane
  CHECK(sc::graph::cuda_product_lanes(step(1, 3, 256)) == 1);
  CHECK(sc::graph::cuda_product_lanes(row_program(sc::f32, 7, 9, OpId::Sum)) == 1);  // no product
  CHECK(sc::graph::cuda_product_lanes(product_program(sc::f32, false, false, true)) == 4);  // (and its rows summed apart)
  const int saved = sc::graph::cuda_max_product_lanes();
  sc::graph::cuda_max_product_lanes() = 8;
  CHECK(sc::graph::cuda_product_lanes(step(1, 64, 256)) == 8);
  sc::graph::cuda_max_product_lanes() = 1;
  CHECK(sc::graph::cuda_product_lanes(step(1, 64, 256)) == 1);
  sc::graph::cuda_max_product_lanes() = saved;
  const FusedProgram p = step(1, 64, 256);
  CHECK_THAT(sc::graph::cuda_source(p), Catch::Contains("f32[1, 256], 32 threads per element"));
}

TEST_CASE("rtc: outputs written through windows of one tensor (an absorbed concat), built for the host, compute what "
          "the CPU evaluator does", "[cuda][rtc][out_window][hostcc]") {
  using sc::ops::OpId;
  for (sc::DType d : {sc::f32, sc::f64, sc::i32, sc::i64})
    for (bool reduce : {false, true}) {
      if (reduce && !sc::is_floating(d)) continue;
      INFO(sc::name(d) << (reduce ? ", rows summed" : ""));
      // [7, 9]: x * y + z - s (register 6) and x * y (register 4) side by side in tensor 0 [7, 18];
      // the last register (tanh, or neg for integers) whole in tensor 1
      FusedProgram p = row_program(d, 7, 9, OpId::Sum);
      if (!reduce) p.reduction.reset();
      if (!sc::is_floating(d)) p.code[3] = {OpId::Neg, 6};
      p.outputs = {6, 4, 7};
      p.out_windows = {{{7, 18}, {0, 9}}, {{7, 18}, {0, 0}}, {}};
      p.out_args = {0, 0, 1};
      CHECK_FALSE(sc::graph::cuda_vectorizable(p));
      const std::string src = sc::graph::cuda_source(p);
      CHECK_THAT(src, Catch::Contains("out0[9LL + (i % 9LL) + ((i / 9LL) % 7LL) * 18LL] = r6"));
      CHECK_THAT(src, Catch::Contains("out1[i] = r7"));
      CHECK_THAT(src, Catch::Contains("float* out1, ") || Catch::Contains("double* out1, ") || Catch::Contains("int* out1, ") ||
                          Catch::Contains("long long* out1, "));
      CHECK_THAT(src, !Catch::Contains("out2"));
      compiled_and_run_on_host(p, src);
    }
}

TEST_CASE("rtc: the 16-byte kernel, built for the host, computes the same, tail included", "[cuda][rtc][hostcc]") {
  for (sc::DType d : {sc::f32, sc::f64, sc::i32, sc::i64}) {
    for (std::int64_t rows : {7, 8, 1}) {  // 63, 72 and 9 elements: tails of 3/1, none, 1/1
      INFO(sc::name(d) << " rows " << rows);
      FusedProgram p = broadcast_program(d);
      p.out_shape = {rows, 9};
      p.input_shapes = {{rows, 9}, {}, {rows, 9}, {1, 1}};  // dense inputs and single values
      REQUIRE(sc::graph::cuda_vectorizable(p));
      const HostBuilt k(p);
      INFO(k.error());
      REQUIRE(k.error().empty());
      REQUIRE(k.has_vector_kernel());
      check_against_cpu(p, k, true);
      check_against_cpu(p, k, false);
    }
  }
}
TEST_CASE("rtc: the row kernel of a reduction, built for the host with real threads, computes what the CPU evaluator does", "[cuda][rtc][hostcc]") {
  using sc::ops::OpId;
  // Rows of 1 (no tree), 3 (4 threads a row, one without an element), 10, 256 (a block a row),
  // 1000 (each thread takes several); enough rows that three blocks stride over them.
  // (Each case is one host compile of ~1 s: every op and shape over f32, two over f64.)
  struct Case {
    sc::DType d;
    OpId op;
    std::int64_t rows, inner;
  };
  std::vector<Case> cases = {{sc::f64, OpId::Sum, 50, 10}, {sc::f64, OpId::Max, 200, 3}};
  for (OpId op : {OpId::Sum, OpId::Max, OpId::Min})
    for (const auto& [rows, inner] : {std::pair<std::int64_t, std::int64_t>{300, 1}, {200, 3}, {50, 10}, {7, 256}, {4, 1000}})
      cases.push_back({sc::f32, op, rows, inner});
  for (const auto& [d, op, rows, inner] : cases) {
    INFO(sc::name(d) << " " << sc::ops::op_info(op).name << " over [" << rows << ", " << inner << "]");
    const FusedProgram p = row_program(d, rows, inner, op);
    REQUIRE(sc::graph::cuda_reduction_split(p).chunks == 1);
    const HostBuilt k(p);
    INFO(k.error());
    REQUIRE(k.error().empty());
    CHECK_FALSE(k.has_vector_kernel());
    std::vector<sc::Tensor> in;
    for (std::size_t i = 0; i < p.input_shapes.size(); ++i)
      in.push_back(sctest::uniform_tensor(p.input_shapes[i], 70 + i, -2.0, 2.0).astype(d));
    check_against_cpu(p, k, false, in);
  }
  // NaN propagates through max and min as on the CPU, wherever it falls in the row.
  for (OpId op : {OpId::Max, OpId::Min}) {
    const FusedProgram p = row_program(sc::f32, 6, 300, op);
    const HostBuilt k(p);
    REQUIRE(k.error().empty());
    std::vector<float> x(6 * 300, 0.25f);
    x[0] = x[300 + 299] = x[600 + 128] = std::nanf("");
    std::vector<sc::Tensor> in = {sc::tensor(x, sc::Shape{6, 300})};
    for (std::size_t i = 1; i < p.input_shapes.size(); ++i)
      in.push_back(sctest::uniform_tensor(p.input_shapes[i], 80 + i, -1.0, 1.0).astype(sc::f32));
    check_against_cpu(p, k, false, in);
  }
}

TEST_CASE("rtc: a reduction cut in pieces, built for the host with real threads, computes what the CPU evaluator does", "[cuda][rtc][hostcc]") {
  using sc::ops::OpId;
  // Few long rows: each cut in pieces whose partials a second kernel combines (4 pieces a row, 17
  // with a last one of 369 elements, 2), the pieces' blocks striding over them.
  struct Case {
    sc::DType d;
    OpId op;
    std::int64_t rows, inner, chunks;
  };
  for (const auto& [d, op, rows, inner, chunks] : {Case{sc::f32, OpId::Sum, 2, 20000, 4}, Case{sc::f32, OpId::Max, 1, 70001, 17},
                                                   Case{sc::f64, OpId::Min, 3, 9000, 2}}) {
    INFO(sc::name(d) << " " << sc::ops::op_info(op).name << " over [" << rows << ", " << inner << "]");
    const FusedProgram p = row_program(d, rows, inner, op);
    REQUIRE(sc::graph::cuda_reduction_split(p).chunks == chunks);
    const HostBuilt k(p);
    INFO(k.error());
    REQUIRE(k.error().empty());
    check_against_cpu(p, k, false);  // positive values: the sums' relative error stays small
    if (op == OpId::Sum) continue;
    // A NaN in one piece's middle and in the last piece's last element propagates as on the CPU.
    std::vector<double> x = sctest::uniform_tensor(p.input_shapes[0], 90, 0.5, 2.0).to_vector<double>();
    x[static_cast<std::size_t>(inner / 2)] = std::nan("");
    x[static_cast<std::size_t>(rows * inner - 1)] = std::nan("");
    check_against_cpu(p, k, false, {sc::tensor(x, p.input_shapes[0]).astype(d)});
  }
}
#endif
