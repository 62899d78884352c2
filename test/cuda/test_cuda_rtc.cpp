// Fused kernels for the GPU, checked without one: the generated source of every fusible op and
// dtype compiles under NVRTC (sm_90), broadcast indices, compile errors with NVRTC's log, and
// traced graphs moved onto a GPU lowering to one generated kernel per group with buffers there.
#include "testing.hpp"
#include "graph_testing.hpp"

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
      char log[8192] = {};
      std::size_t bytes = 0;
      const abi::Status s = abi::rtc_check(src.c_str(), 90, &bytes, log, sizeof log);
      INFO(log);
      INFO(src);
      REQUIRE(s == 0);
      CHECK(bytes > 1000);
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

TEST_CASE("rtc: programs with a reduction stay on the CPU evaluator", "[cuda][rtc]") {
  FusedProgram p = every_op(sc::f32);
  p.reduction = sc::graph::FusedReduction{sc::ops::OpId::Sum, 2, 4, sc::Shape{3}};
  CHECK_FALSE(sc::graph::cuda_fusible(p));
  CHECK_THROWS_AS(sc::graph::cuda_source(p), sc::ValueError);
}

TEST_CASE("rtc: a traced graph on a GPU lowers to generated kernels and GPU buffers", "[cuda][rtc]") {
  using sc::graph::Graph;
  const sc::TensorSpec x{sc::Shape{64, 32}, sc::f32}, b{sc::Shape{32}, sc::f32};
  Graph g = trace({x, b}, [](const Tensors& a) {
    const sc::Tensor h = sc::relu(a[0] * 2.f + a[1]);                   // one group
    const sc::Tensor s = sc::sum(h, {1});                                // a reduction: its own kernel on a GPU
    return Tensors{sc::exp(s) - 1.f, sc::sigmoid(h) * h};                // two more groups
  });
  const Graph on_cpu = g;
  for (sc::graph::Value& v : g.values) v.device = sc::Device::cuda(0);
  sc::graph::cuda_fusion() = true;  // off by default in builds without CUDA (no GPU graph exists there)
  const auto cpu_groups = sc::graph::find_fusion_groups(on_cpu);
  const auto gpu_groups = sc::graph::find_fusion_groups(g);
  REQUIRE(gpu_groups.groups.size() >= 2);
  for (const auto& fg : gpu_groups.groups) {
    CHECK(fg.reduce < 0);  // the CPU evaluator's reductions are not generated
    CHECK(fg.head < 0);
    CHECK(sc::graph::cuda_fusible(fg.program));
  }
  bool cpu_reduces = false;
  for (const auto& fg : cpu_groups.groups) cpu_reduces |= fg.reduce >= 0;
  CHECK(cpu_reduces);

  const auto shared = std::make_shared<const Graph>(g);
  const sc::graph::Plan plan(shared);
  CHECK(plan.stats().fused_groups == static_cast<int>(gpu_groups.groups.size()));
  CHECK(plan.stats().epilogues == 0);
  CHECK(plan.stats().fused_reductions == 0);

  // With GPU fusion off, no group forms on the GPU.
  sc::graph::cuda_fusion() = false;
  CHECK(sc::graph::find_fusion_groups(g).groups.empty());
  sc::graph::cuda_fusion() = sc::cuda::built;
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
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace {

/// The generated source of p, built as a shared library by the host compiler; its sc_run runs the
/// kernel over every element (one block of 256 threads, each striding).
class HostBuilt {
 public:
  explicit HostBuilt(const FusedProgram& p) {
    dir_ = std::filesystem::temp_directory_path() / ("sc_rtc_host_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    std::filesystem::create_directories(dir_);
    const std::string T = cf::c_type(p.dtype);
    std::string src =
        "#define __global__\n"
        "struct sc_dim3 { unsigned x; };\n"
        "static sc_dim3 blockIdx{0}, threadIdx{0}, blockDim{256}, gridDim{1};\n"
        "struct alignas(16) float4 { float x, y, z, w; };\n"
        "struct alignas(16) int4 { int x, y, z, w; };\n"
        "struct alignas(16) double2 { double x, y; };\n"
        "struct alignas(16) longlong2 { long long x, y; };\n" +
        sc::graph::cuda_source(p);
    std::string call;
    for (std::size_t k = 0; k < p.input_shapes.size(); ++k) call += "(const " + T + "*)in[" + std::to_string(k) + "], ";
    for (std::size_t j = 0; j < p.outputs.size(); ++j) call += "(" + T + "*)out[" + std::to_string(j) + "], ";
    call += "n);\n}\n";
    const char* loop = "(const void* const* in, void* const* out, long long n) {\n"
                       "  for (threadIdx.x = 0; threadIdx.x < blockDim.x; ++threadIdx.x)\n    ";
    src += std::string("extern \"C\" void sc_run") + loop + "sc_fused(" + call;
    if (sc::graph::cuda_vectorizable(p)) src += std::string("extern \"C\" void sc_run_v") + loop + "sc_fused_v(" + call;
    std::ofstream(dir_ / "k.cpp") << src;
    const std::string cmd = std::string(SC_TEST_CXX) + " -std=c++20 -O1 -shared -fPIC -w -I" + SC_TEST_INCLUDE + " " +
                            (dir_ / "k.cpp").string() + " -o " + (dir_ / "k.so").string() + " 2>" + (dir_ / "log").string();
    if (std::system(cmd.c_str()) != 0) {
      std::ifstream log(dir_ / "log");
      error_ = std::string(std::istreambuf_iterator<char>(log), {}) + "\nsource:\n" + src;
      return;
    }
    lib_ = ::dlopen((dir_ / "k.so").c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib_ != nullptr) run_ = reinterpret_cast<Run>(::dlsym(lib_, "sc_run"));
    if (lib_ != nullptr) run_v_ = reinterpret_cast<Run>(::dlsym(lib_, "sc_run_v"));
    if (run_ == nullptr) error_ = "dlopen/dlsym failed";
  }
  ~HostBuilt() {
    if (lib_ != nullptr) ::dlclose(lib_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  HostBuilt(const HostBuilt&) = delete;
  HostBuilt& operator=(const HostBuilt&) = delete;
  const std::string& error() const { return error_; }
  bool has_vector_kernel() const { return run_v_ != nullptr; }
  /// Runs sc_fused, or sc_fused_v (16-byte accesses) when `vector`.
  void run(const std::vector<sc::Tensor>& in, std::vector<sc::Tensor>& out, std::int64_t n, bool vector = false) const {
    std::vector<const void*> pi;
    std::vector<void*> po;
    for (const sc::Tensor& t : in) pi.push_back(t.raw_data());
    for (sc::Tensor& t : out) po.push_back(t.raw_data());
    (vector ? run_v_ : run_)(pi.data(), po.data(), n);
  }

 private:
  using Run = void (*)(const void* const*, void* const*, long long);
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::filesystem::path dir_;
  void* lib_ = nullptr;
  Run run_ = nullptr;
  Run run_v_ = nullptr;
  std::string error_;
};

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


/// p run by the host-built kernel (vector: sc_fused_v) against graph::run_fused.
void check_against_cpu(const FusedProgram& p, const HostBuilt& k, bool vector) {
  const sc::DType d = p.dtype;
  {
    std::vector<sc::Tensor> in;
    for (std::size_t i = 0; i < p.input_shapes.size(); ++i) {
      const sc::Tensor u = sctest::uniform_tensor(p.input_shapes[i], 40 + i, 0.5, 2.0);  // positive: log, sqrt, div
      in.push_back(sc::is_floating(d) ? u.astype(d) : (u * 3).astype(d));
    }
    std::vector<sc::Tensor> want, got;
    for (std::size_t j = 0; j < p.outputs.size(); ++j) {
      want.push_back(sc::zeros(p.out_shape, d));
      got.push_back(sc::full(p.out_shape, -12345.0, d));  // poisoned: every element must be written
    }
    sc::graph::run_fused(p, in, want);
    k.run(in, got, p.out_shape.numel(), vector);
    for (std::size_t j = 0; j < got.size(); ++j) {
      const auto g = got[j].to_vector<double>(), w = want[j].to_vector<double>();
      for (std::size_t i = 0; i < g.size(); ++i) {
        INFO("output " << j << " element " << i);
        if (std::isnan(w[i])) CHECK(std::isnan(g[i]));
        else CHECK(g[i] == Approx(w[i]).epsilon(d == sc::f32 ? 1e-5 : 1e-12).margin(d == sc::f32 ? 1e-6 : 1e-12));
      }
    }
  }
}

}  // namespace

TEST_CASE("rtc: the generated kernel, built for the host, computes what the CPU evaluator does", "[cuda][rtc]") {
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

TEST_CASE("rtc: the 16-byte kernel, built for the host, computes the same, tail included", "[cuda][rtc]") {
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
#endif
