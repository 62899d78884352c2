// A user's .cu file: nvcc compiles stagecraft.hpp, and sc::compile there makes the expression type
// a templated CUDA kernel (staged/cuda_kernel.hpp). Three tests from one program (one nvcc
// compile of the umbrella header, which takes minutes):
//   `include`: the rules are host functions here (the CPU's SIMD loops instantiate them with
//           xsimd batches, which nvcc must not compile for the GPU), and the eager, traced and
//           compile-time staged paths and a tape give plain loops' numbers (runs without a GPU);
//   `host`: the kernel's per-element program, run on the host, against the CPU's fused loop and
//           against plain loops, for every node kind, four dtypes and broadcasting shapes, and
//           reductions at the root with the kernel's pairwise tree (runs everywhere the CUDA
//           kernels are built, so in CI);
//   `gpu`:  the kernels on a GPU against the CPU (exit 77, skipped, without a GPU).
#include <stagecraft/stagecraft.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

namespace staging = sc::staging;

int failures = 0, checks = 0;

void fail(const std::string& what) {
  ++failures;
  std::printf("FAILED: %s\n", what.c_str());
}

/// got == want: shape, dtype, and values within tol (relative and absolute), NaN where NaN.
void check_same(const std::string& what, const sc::Tensor& got, const sc::Tensor& want, double tol) {
  ++checks;
  if (!got.defined()) return fail(what + ": no result");
  if (!(got.shape() == want.shape())) return fail(what + ": shape " + got.shape().str() + " vs " + want.shape().str());
  if (got.dtype() != want.dtype()) return fail(what + ": dtype differs");
  const std::vector<double> g = got.to(sc::Device::cpu()).to_vector<double>(), w = want.to_vector<double>();
  for (std::size_t i = 0; i < g.size(); ++i) {
    const bool ok = std::isnan(w[i]) ? std::isnan(g[i]) : (g[i] == w[i] || std::fabs(g[i] - w[i]) <= tol * (1 + std::fabs(w[i])));
    if (!ok) {
      char buf[160];
      std::snprintf(buf, sizeof buf, ": element %zu is %.17g, want %.17g", i, g[i], w[i]);
      return fail(what + buf);
    }
  }
}

/// The expression of g over the N tensors of a, evaluated by the kernel's program on the host
/// (vector: as the 16-byte kernel, where it runs; then *vectorized is set).
template <int N, class G>
sc::Tensor program_on_host(const G& g, const std::vector<sc::Tensor>& a, bool vector, bool* vectorized) {
  const auto e = g.template expression<N>();
  staging::Env<N> env;
  for (int k = 0; k < N; ++k) env.args[static_cast<std::size_t>(k)] = a[static_cast<std::size_t>(k)];
  env.loc = std::source_location::current();
  return staging::gpu::run_on_host<N>(e.node, env, vector, vectorized);
}

/// Values of dtype d in [-2, 2) (small integers in [-6, 6) for integer dtypes), from seed.
sc::Tensor values(sc::Shape s, sc::DType d, std::uint64_t seed) {
  std::uint64_t r = seed * 0x9E3779B97F4A7C15ull + 1;
  std::vector<double> v(static_cast<std::size_t>(s.numel()));
  for (double& x : v) {
    r ^= r >> 12, r ^= r << 25, r ^= r >> 27;
    x = -2.0 + 4.0 * static_cast<double>((r * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
  }
  const sc::Tensor x = sc::tensor(v, s);
  return sc::is_floating(d) ? x.astype(d) : (x * 3.0).astype(d);
}
double tol_of(sc::DType d) { return d == sc::f32 ? 1e-6 : d == sc::f64 ? 1e-14 : 0.0; }

/// One case: a compiled function and its arguments; `loop` (optional) the plain-loop result.
struct Case {
  std::string name;
  std::function<sc::Tensor(const std::vector<sc::Tensor>&)> compiled;  // g(args...) on any device
  std::function<sc::Tensor(const std::vector<sc::Tensor>&, bool, bool*)> program;  // the program on the host
  std::vector<sc::Tensor> args;
  double tol;
};

template <class G>
Case make_case(std::string name, G g, std::vector<sc::Tensor> args, double tol) {
  Case c{std::move(name), {}, {}, std::move(args), tol};
  c.compiled = [g](const std::vector<sc::Tensor>& a) -> sc::Tensor {
    if constexpr (G::template takes<1>()) {
      if (a.size() == 1) return g(a[0]);
    }
    if constexpr (G::template takes<2>()) {
      if (a.size() == 2) return g(a[0], a[1]);
    }
    if constexpr (G::template takes<3>()) {
      if (a.size() == 3) return g(a[0], a[1], a[2]);
    }
    return sc::Tensor();
  };
  c.program = [g](const std::vector<sc::Tensor>& a, bool vector, bool* vectorized) -> sc::Tensor {
    if constexpr (G::template takes<1>()) {
      if (a.size() == 1) return program_on_host<1>(g, a, vector, vectorized);
    }
    if constexpr (G::template takes<2>()) {
      if (a.size() == 2) return program_on_host<2>(g, a, vector, vectorized);
    }
    if constexpr (G::template takes<3>()) {
      if (a.size() == 3) return program_on_host<3>(g, a, vector, vectorized);
    }
    return sc::Tensor();
  };
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  auto chain = sc::compile([](const auto& a, const auto& b) { return sc::tanh(sc::relu(a * 2.f + b)) * b - sc::exp(-sc::abs(a)); });
  for (sc::DType d : {sc::f32, sc::f64}) {
    const std::string dn = std::string(sc::name(d));
    out.push_back(make_case("chain " + dn + " [4,5] [4,5]", chain, {values({4, 5}, d, 1), values({4, 5}, d, 2)}, tol_of(d)));
    out.push_back(make_case("chain " + dn + " [4,5] [5]", chain, {values({4, 5}, d, 3), values({5}, d, 4)}, tol_of(d)));
    out.push_back(make_case("chain " + dn + " [3,1,4] [5,4]", chain, {values({3, 1, 4}, d, 5), values({5, 4}, d, 6)}, tol_of(d)));
    out.push_back(make_case("chain " + dn + " [] [6]", chain, {values({}, d, 7), values({6}, d, 8)}, tol_of(d)));
    // dense: the 16-byte kernel, with a tail of 3 (f32) or 1 (f64) elements; a single-element slot
    out.push_back(make_case("chain " + dn + " [7,9] [7,9]", chain, {values({7, 9}, d, 40), values({7, 9}, d, 41)}, tol_of(d)));
    out.push_back(make_case("chain " + dn + " [1] [7,9]", chain, {values({1}, d, 42), values({7, 9}, d, 43)}, tol_of(d)));
  }
  // integers: wrapping arithmetic, max/min, pow, comparisons to bool, weak scalars
  auto ints = sc::compile([](const auto& a, const auto& b) { return sc::maximum(a * b + 3, sc::minimum(a, b)) - sc::pow(a, 2); });
  auto cmp = sc::compile([](const auto& a, const auto& b) { return (a > b) || (a == 1); });
  for (sc::DType d : {sc::i32, sc::i64}) {
    const std::string dn = std::string(sc::name(d));
    out.push_back(make_case("ints " + dn + " [2,3,4] [3,1]", ints, {values({2, 3, 4}, d, 9), values({3, 1}, d, 10)}, 0));
    out.push_back(make_case("compare " + dn + " [7] [7]", cmp, {values({7}, d, 11), values({7}, d, 12)}, 0));
  }
  out.push_back(make_case("compare f32 [2,6] [1]", cmp, {values({2, 6}, sc::f32, 13), values({1}, sc::f32, 14)}, 0));
  // where with a weak branch, casts both ways, sign and sqrt of negatives (NaN)
  auto sel = sc::compile([](const auto& a, const auto& b) { return sc::where(a > 0, a, b * 0.5f) + sc::sqrt(a); });
  out.push_back(make_case("where f32 [5,4] [4]", sel, {values({5, 4}, sc::f32, 15), values({4}, sc::f32, 16)}, 1e-6));
  auto casts = sc::compile([](const auto& a) { return sc::cast<sc::f32>(sc::cast<sc::i32>(a * 3.f)) + sc::sign(a); });
  out.push_back(make_case("cast f64 [9]", casts, {values({9}, sc::f64, 17)}, 0));
  auto logic = sc::compile([](const auto& a, const auto& b) { return sc::logical_not(a) && (b != 0); });
  out.push_back(make_case("logic b8 [8] [8]", logic, {values({8}, sc::i32, 18).astype(sc::boolean), values({8}, sc::i32, 19).astype(sc::boolean)}, 0));
  // a materialized operand (matmul), a tensor leaf, three arguments
  const sc::Tensor leaf = values({3}, sc::f32, 20);
  auto mat = sc::compile([leaf](const auto& a, const auto& b, const auto& c) {
    return sc::sigmoid(sc::matmul(a, b) + c) * sc::stage(leaf);
  });
  out.push_back(make_case("matmul + leaf f32", mat, {values({2, 4}, sc::f32, 21), values({4, 3}, sc::f32, 22), values({3}, sc::f32, 23)}, 1e-6));
  // a gradient's root: d/da sum(tanh(a) * b + a^2)
  auto f = sc::compile([](const auto& a, const auto& b) { return sc::tanh(a) * b + sc::square(a); });
  auto df = sc::grad<0>(f);
  out.push_back(make_case("grad f32 [4,3] [4,3]", df, {values({4, 3}, sc::f32, 24), values({4, 3}, sc::f32, 25)}, 1e-6));
  out.push_back(make_case("grad f64 [6] [6]", df, {values({6}, sc::f64, 26), values({6}, sc::f64, 27)}, 1e-14));
  // reductions at the root over trailing axes: one block per output row (NaN propagates in max)
  auto total = sc::compile([](const auto& a, const auto& b) { return sc::sum(sc::tanh(a * b) + a); });
  out.push_back(make_case("sum f32 [40,50] [50]", total, {values({40, 50}, sc::f32, 28), values({50}, sc::f32, 29)}, 1e-5));
  auto avg = sc::compile([](const auto& a, const auto& b) { return sc::mean(sc::exp(a) - b, {-1}, true); });
  out.push_back(make_case("mean f64 [3,1,300] [5,300]", avg, {values({3, 1, 300}, sc::f64, 30), values({5, 300}, sc::f64, 31)}, 1e-13));
  auto top = sc::compile([](const auto& a) { return sc::max(sc::sqrt(a) * 2.f, {1, 2}); });
  out.push_back(make_case("max f32 [2,3,4] (NaN)", top, {values({2, 3, 4}, sc::f32, 32)}, 0));
  auto top_pos = sc::compile([](const auto& a) { return sc::max(sc::abs(a) * 2.f, {1, 2}); });
  out.push_back(make_case("max f32 [6,3,90]", top_pos, {values({6, 3, 90}, sc::f32, 33)}, 0));
  auto bottom = sc::compile([](const auto& a, const auto& b) { return sc::min(a * b - 1.0, {-1}); });
  out.push_back(make_case("min f64 [7,600] [600]", bottom, {values({7, 600}, sc::f64, 34), values({600}, sc::f64, 35)}, 0));
  return out;
}

const Case& named(const std::vector<Case>& all, const std::string& name) {
  for (const Case& c : all)
    if (c.name == name) return c;
  std::printf("no case %s\n", name.c_str());
  std::abort();
}

/// The host run of the kernel's program against the CPU's fused loop, and three cases against plain loops.
void host_tests() {
  const std::vector<Case> all = cases();
  int vectorized_cases = 0;
  for (const Case& c : all) {
    const sc::Tensor want = c.compiled(c.args);
    check_same("program vs fused: " + c.name, c.program(c.args, false, nullptr), want, c.tol);
    // The 16-byte kernel's steps: wherever no argument is strided (broadcast over an axis).
    bool vectorized = false, strided = false;
    const sc::Tensor v = c.program(c.args, true, &vectorized);
    for (const sc::Tensor& a : c.args) strided = strided || (a.numel() != 1 && a.numel() != want.numel());
    const bool root_reduces = want.numel() < c.args[0].numel();
    ++checks;
    if (vectorized == (strided || root_reduces)) fail("16-byte program: " + c.name + (vectorized ? " ran" : " did not run"));
    vectorized_cases += vectorized;
    check_same("16-byte program vs fused: " + c.name, v, want, c.tol);
  }
  ++checks;
  if (vectorized_cases < 8) fail("16-byte program: only " + std::to_string(vectorized_cases) + " cases ran it");
  // plain loops: the broadcasting chain [3,1,4] x [5,4] in f64, and the integer case
  {
    const sc::Tensor a = values({3, 1, 4}, sc::f64, 5), b = values({5, 4}, sc::f64, 6);
    const auto av = a.to_vector<double>(), bv = b.to_vector<double>();
    std::vector<double> want;
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 5; ++j)
        for (int k = 0; k < 4; ++k) {
          const double x = av[i * 4 + k], y = bv[j * 4 + k];
          want.push_back(std::tanh(std::max(x * 2 + y, 0.0)) * y - std::exp(-std::fabs(x)));
        }
    const Case& c = named(all, "chain f64 [3,1,4] [5,4]");
    check_same("program vs loop: " + c.name, c.program(c.args, false, nullptr), sc::tensor(want, sc::Shape{3, 5, 4}), 1e-14);
  }
  {
    const sc::Tensor a = values({2, 3, 4}, sc::i32, 9), b = values({3, 1}, sc::i32, 10);
    const auto av = a.to_vector<std::int32_t>(), bv = b.to_vector<std::int32_t>();
    std::vector<std::int32_t> want;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 4; ++k) {
          const std::int32_t x = av[(i * 3 + j) * 4 + k], y = bv[j];
          want.push_back(std::max(x * y + 3, std::min(x, y)) - x * x);
        }
    const Case& c = named(all, "ints i32 [2,3,4] [3,1]");
    check_same("program vs loop: " + c.name, c.program(c.args, false, nullptr), sc::tensor(want, sc::Shape{2, 3, 4}), 0);
  }
  {
    const Case& c = named(all, "mean f64 [3,1,300] [5,300]");
    const auto av = c.args[0].to_vector<double>(), bv = c.args[1].to_vector<double>();
    std::vector<double> want;
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 5; ++j) {
        double s = 0;
        for (int k = 0; k < 300; ++k) s += std::exp(av[i * 300 + k]) - bv[j * 300 + k];
        want.push_back(s / 300);
      }
    check_same("program vs loop: " + c.name, c.program(c.args, false, nullptr), sc::tensor(want, sc::Shape{3, 5, 1}), 1e-13);
  }
}

/// The kernels on the GPU against the CPU: every case, a large input (grid-stride loop, 32-bit
/// indices), and no run-time compilation (the kernels were compiled with this file).
int gpu_tests() {
  if (!sc::cuda::is_available()) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  const sc::Device gpu = sc::Device::cuda(0);
  const auto before = sc::cuda::fused_kernel_stats();
  for (const Case& c : cases()) {
    std::vector<sc::Tensor> on_gpu;
    for (const sc::Tensor& t : c.args) on_gpu.push_back(t.to(gpu));
    if (c.name == "matmul + leaf f32") {  // its leaf is on the CPU: a DeviceError with GPU arguments
      ++checks;
      try {
        c.compiled(on_gpu);
        fail("gpu: a CPU leaf with GPU arguments ran");
      } catch (const sc::DeviceError& e) {
        if (std::string(e.what()).find("different devices (cuda:0 and cpu)") == std::string::npos)
          fail(std::string("gpu: a CPU leaf with GPU arguments: ") + e.what());
      }
      continue;
    }
    const sc::Tensor got = c.compiled(on_gpu);
    if (got.device() != gpu) fail("gpu: " + c.name + ": the result is not on the GPU");
    // transcendental functions differ from the CPU's by a few ulps
    check_same("gpu vs cpu: " + c.name, got, c.compiled(c.args), c.tol == 0 ? 0 : std::max(c.tol, c.tol * 8));
  }
  {  // the same case with its leaf on the GPU
    const sc::Tensor leaf = values({3}, sc::f32, 20);
    const auto mat_with = [](const sc::Tensor& l) {
      return sc::compile([l](const auto& a, const auto& b, const auto& c) { return sc::sigmoid(sc::matmul(a, b) + c) * sc::stage(l); });
    };
    const sc::Tensor a = values({2, 4}, sc::f32, 21), b = values({4, 3}, sc::f32, 22), c = values({3}, sc::f32, 23);
    const sc::Tensor got = mat_with(leaf.to(gpu))(a.to(gpu), b.to(gpu), c.to(gpu));
    if (got.device() != gpu) fail("gpu: matmul + GPU leaf: the result is not on the GPU");
    check_same("gpu vs cpu: matmul + GPU leaf", got, mat_with(leaf)(a, b, c), 8e-6);
  }
  auto chain = sc::compile([](const auto& a, const auto& b) { return sc::tanh(sc::relu(a * 2.f + b)) * b - sc::exp(-sc::abs(a)); });
  const sc::Tensor a = values({1 << 22}, sc::f32, 30), b = values({1 << 22}, sc::f32, 31);
  check_same("gpu vs cpu: chain 4M", chain(a.to(gpu), b.to(gpu)), chain(a, b), 1e-5);
  // The 16-byte kernel against one element per access, bit for bit, with tails and bool results.
  auto cmp = sc::compile([](const auto& x, const auto& y) { return (x > y) || (x == 1); });
  for (const std::int64_t n : {std::int64_t{1} << 22, (std::int64_t{1} << 22) + 3, std::int64_t{5}}) {
    for (sc::DType d : {sc::f32, sc::f64}) {
      const sc::Tensor x = values({n}, d, 50).to(gpu), y = values({n}, d, 51).to(gpu);
      sc::staging::gpu::vector_loads() = false;
      const sc::Tensor one = chain(x, y), one_cmp = cmp(x, y);
      sc::staging::gpu::vector_loads() = true;
      const std::string what = "gpu 16-byte vs one element: " + std::string(sc::name(d)) + " n " + std::to_string(n);
      check_same(what, chain(x, y), one.to(sc::Device::cpu()), 0);
      check_same(what + " (compare)", cmp(x, y), one_cmp.to(sc::Device::cpu()), 0);
    }
  }
  auto total = sc::compile([](const auto& x, const auto& y) { return sc::sum(sc::tanh(x * y) + x, {-1}); });
  const sc::Tensor u = values({64, 1 << 16}, sc::f32, 36), v = values({1 << 16}, sc::f32, 37);
  check_same("gpu vs cpu: row sums [64, 65536]", total(u.to(gpu), v.to(gpu)), total(u, v), 1e-4);
  auto leading = sc::compile([](const auto& x) { return sc::sum(sc::exp(x), {0}); });  // not trailing: eager sum
  check_same("gpu vs cpu: sum over axis 0", leading(u.to(gpu)), leading(u), 1e-5);
  const auto after = sc::cuda::fused_kernel_stats();
  if (after.compiled != before.compiled) fail("gpu: NVRTC compiled a kernel for sc::compile under nvcc");
  // a shape error on the GPU is the eager op's ShapeError
  try {
    (void)chain(values({4}, sc::f32, 32).to(gpu), values({5}, sc::f32, 33).to(gpu));
    fail("gpu: [4] with [5] did not raise");
  } catch (const sc::ShapeError& e) {
    if (std::strstr(e.what(), "test_nvcc_staged.cu") == nullptr) fail(std::string("gpu: the error does not name the file: ") + e.what());
  }
  return 0;
}

/// The `include` test (see the top of the file).
int include_test() {
  int bad = 0;
  auto check_close = [&](const char* what, const sc::Tensor& got, const std::vector<float>& want) {
    const std::vector<float> g = got.to_vector<float>();
    bool ok = g.size() == want.size();
    for (std::size_t i = 0; ok && i < g.size(); ++i) ok = std::fabs(g[i] - want[i]) <= 1e-5f * (1.f + std::fabs(want[i]));
    if (!ok) {
      ++bad;
      std::printf("FAILED: %s\n", what);
    }
  };
  std::vector<float> xs(1000), ys(1000), want(1000);
  for (int i = 0; i < 1000; ++i) {
    xs[i] = static_cast<float>(i % 17) * 0.25f - 2.f;
    ys[i] = static_cast<float>(i % 5) * 0.5f - 1.f;
    const float h = std::max(xs[i] * 2.f + ys[i], 0.f);  // relu(x * 2 + y)
    want[i] = std::tanh(h) * ys[i] - std::exp(-std::fabs(xs[i]));
  }
  const sc::Tensor x = sc::tensor(xs, sc::Shape{1000}), y = sc::tensor(ys, sc::Shape{1000});
  auto body = [](const auto& a, const auto& b) { return sc::tanh(sc::relu(a * 2.f + b)) * b - sc::exp(-sc::abs(a)); };
  check_close("eager", body(x, y), want);
  auto traced = sc::function([&](sc::Tensor a, sc::Tensor b) { return body(a, b); });
  check_close("sc::function", traced(x, y), want);
  auto compiled = sc::compile(body);
  check_close("sc::compile", compiled(x, y), want);
  // A tape through the same ops: d/dx sum(x * x) = 2x.
  sc::GradientTape tape;
  tape.watch(x);
  const sc::Tensor g = tape.gradient(sc::sum(x * x), x);
  std::vector<float> twice(xs);
  for (float& v : twice) v *= 2.f;
  check_close("gradient", g, twice);
  if (bad == 0) std::printf("nvcc include: eager, sc::function, sc::compile and a tape agree with the loops\n");
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "host";
  if (mode == "include") return include_test();
  int rc = 0;
  if (mode == "host") host_tests();
  else rc = gpu_tests();
  if (rc != 0) return rc;
  if (failures == 0) std::printf("sc::compile under nvcc (%s): %d checks passed\n", mode.c_str(), checks);
  return failures == 0 ? 0 : 1;
}
