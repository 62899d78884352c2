// Traced functions on the GPU: the plan runs each node's CUDA kernel with GPU buffers, and fused
// elementwise groups run as one generated (NVRTC) kernel each, equal to the same function on the
// CPU and to its eager GPU run; the kernel caches (memory and disk) are exercised too.
#include "cuda/cuda_testing.hpp"
#include "nn/lstm_testing.hpp"

#include <stagecraft/graph/cuda_fused.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>

using sctest::cuda::check_same;
using sctest::cuda::gpu;
using sctest::cuda::values;

namespace {

/// Every element of a equals b's exactly (both on the GPU or both anywhere).
void check_bits(const sc::Tensor& a, const sc::Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  REQUIRE(a.dtype() == b.dtype());
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("element " << i);
    if (std::isnan(y[i])) CHECK(std::isnan(x[i]));
    else CHECK(x[i] == y[i]);
  }
}

/// One SGD step (rate 0.1) of a linear model on mean squared error; returns the loss and
/// relu(prediction) * 2.
std::tuple<sc::Tensor, sc::Tensor> sgd_step(sc::Variable& w, sc::Variable& b, const sc::Tensor& x, const sc::Tensor& y) {
  sc::GradientTape tape;
  const sc::Tensor p = sc::matmul(x, w) + b;
  const sc::Tensor loss = sc::mean(sc::square(p - y));
  std::vector<sc::Variable> vars{w, b};
  const auto g = tape.gradient(loss, vars);
  for (std::size_t i = 0; i < vars.size(); ++i) vars[i].assign_sub(g[i] * 0.1f);
  return {loss, sc::relu(p) * 2.f};
}

}  // namespace

TEST_CASE("cuda staged: a traced function runs on the GPU, fused, equal to the CPU and to eager", "[cuda][staged]") {
  auto body = [](sc::Tensor x, sc::Tensor b) {
    const sc::Tensor h = sc::relu(x * 2.f + b);
    return std::make_tuple(sc::sigmoid(h) * h - sc::tanh(x), sc::sum(h, {1}), sc::maximum(x, b) * x);
  };
  auto f = sc::function(body);
  const sc::Tensor x = values({64, 33}, sc::f32, 1), b = values({33}, sc::f32, 2);
  const sc::Tensor xg = x.to(gpu), bg = b.to(gpu);
  const auto [g0, g1, g2] = f(xg, bg);
  const auto [c0, c1, c2] = f(x, b);
  const auto st = f.get_concrete(xg, bg).stats();
  INFO(st);
  CHECK(st.plan.fused_groups >= 2);
  CHECK(st.plan.fused_reductions == 1);  // the sum ends its group's generated kernel
  check_same(g0, c0, 1e-5);
  check_same(g1, c1, 1e-5);
  check_same(g2, c2, 1e-5);
  // Fused generated kernels against the eager GPU kernels: arithmetic and selections bit for bit.
  const auto [e0, e1, e2] = body(xg, bg);
  check_bits(g2, e2);
  check_same(g0, e0.to(sc::Device::cpu()), 1e-6);
  check_same(g1, e1.to(sc::Device::cpu()), 1e-5);  // the fused sum adds in another order than CUB's
}

TEST_CASE("cuda staged: sums, maxima and minima fused into generated kernels equal the CPU's", "[cuda][staged]") {
  // Rows of 1, 3, 33, 256 and 5000 elements: one thread a row up to a whole block striding; and
  // two rows of 300000, each cut in 69 pieces whose partials a second kernel combines.
  for (const auto& [rows, inner] :
       {std::pair<std::int64_t, std::int64_t>{4000, 1}, {700, 3}, {64, 33}, {9, 256}, {3, 5000}, {2, 300000}}) {
    INFO("[" << rows << ", " << inner << "]");
    auto f = sc::function([](sc::Tensor x, sc::Tensor c) {  // three groups, each ending in its reduction
      return std::make_tuple(sc::sum(sc::square(x * c - 0.5f), {1}), sc::max(x + c, {1}, true),
                             sc::min(sc::exp(x) * c, {1}), sc::tanh(x - c));
    });
    sc::Tensor x = values({rows, inner}, sc::f32, 11), c = values({inner}, sc::f32, 12);
    if (inner == 256) {  // a NaN in one row's middle and another's end
      std::vector<float> v = x.to_vector<float>();
      v[2 * 256 + 100] = v[5 * 256 + 255] = std::nanf("");
      x = sc::tensor(v, x.shape());
    }
    const auto [s, mx, mn, t] = f(x.to(gpu), c.to(gpu));
    const auto [cs, cmx, cmn, ct] = f(x, c);
    INFO(f.get_concrete(x.to(gpu), c.to(gpu)).stats());
    CHECK(f.get_concrete(x.to(gpu), c.to(gpu)).stats().plan.fused_reductions == 3);
    check_same(s, cs, 1e-5);
    check_same(mx, cmx, 1e-6);  // NaN propagates as on the CPU
    check_same(mn, cmn, 1e-6);
    check_same(t, ct, 1e-6);
  }
  // A sum over a whole tensor of 2^22 elements: 1024 pieces, then one block combines them; run
  // twice, so the second call reuses the scratch of the partials.
  auto whole = sc::function([](sc::Tensor x) { return sc::sum(sc::square(x - 0.5f)); });
  const sc::Tensor big = values({1 << 22}, sc::f32, 15);
  const sc::Tensor on_cpu = whole(big), big_gpu = big.to(gpu);
  check_same(whole(big_gpu), on_cpu, 1e-5);
  check_same(whole(big_gpu), on_cpu, 1e-5);
  CHECK(whole.get_concrete(big_gpu).stats().plan.fused_reductions == 1);
  // A reduction's result never takes the buffer of an input its kernel still reads: here exp(b)
  // [n] dies in the group of x [n, n] * exp(b), whose row sums have its shape.
  auto g = sc::function([](sc::Tensor x, sc::Tensor b) { return sc::sum(x * sc::exp(b), {1}) * 2.f; });
  const sc::Tensor x = values({300, 300}, sc::f32, 13), b = values({300}, sc::f32, 14);
  // Rows of 300 terms up to 15 in size that cancel to about 1: float sums in two orders differ by
  // up to ~300 * 15 * 2^-24 = 2.7e-4 (1.5e-5 seen, on the emulator's run of the GPU's order).
  check_same(g(x.to(gpu), b.to(gpu)), g(x, b), 3e-4);
}

TEST_CASE("cuda staged: a product with a bias (and ReLU) is one cuBLASLt call, equal to the CPU's", "[cuda][staged]") {
  // Two layers: relu(x w + b), then h v^T + c with v stored [10, 32] (read transposed).
  auto f = sc::function([](sc::Tensor x, sc::Tensor w, sc::Tensor b, sc::Tensor v, sc::Tensor c) {
    return sc::matmul(sc::relu(sc::matmul(x, w) + b), v, false, true) + c;
  });
  for (const std::int64_t batch : {1, 64, 1000}) {
    INFO("batch " << batch);
    const std::vector<sc::Tensor> in = {values({batch, 100}, sc::f32, 16), values({100, 32}, sc::f32, 17),
                                        values({32}, sc::f32, 18), values({10, 32}, sc::f32, 19), values({10}, sc::f32, 20)};
    std::vector<sc::Tensor> on_gpu;
    for (const sc::Tensor& t : in) on_gpu.push_back(t.to(gpu));
    const sc::Tensor got = f(on_gpu[0], on_gpu[1], on_gpu[2], on_gpu[3], on_gpu[4]);
    check_same(got, f(in[0], in[1], in[2], in[3], in[4]), 1e-4);
    const auto st = f.get_concrete(on_gpu[0], on_gpu[1], on_gpu[2], on_gpu[3], on_gpu[4]).stats();
    INFO(st);
    CHECK(st.plan.epilogues == 2);
    CHECK(st.plan.kernels == 2);  // a cuBLASLt call a layer
  }
}

TEST_CASE("cuda staged: integer and double programs equal the CPU exactly", "[cuda][staged]") {
  auto f = sc::function([](sc::Tensor x, sc::Tensor y) { return sc::abs(x * x + y) - sc::square(y) * 3; });
  for (sc::DType d : {sc::i32, sc::i64, sc::f64}) {
    INFO(sc::name(d));
    sc::Tensor x = values({16, 128}, d, 3), y = values({128}, d, 4);
    if (d == sc::i32) x = x * 100000;  // products wrap, as they do on the CPU
    const sc::Tensor got = f(x.to(gpu), y.to(gpu));
    check_same(got, f(x, y), d == sc::f64 ? 1e-13 : 0.0);
  }
}

TEST_CASE("cuda staged: an SGD step traced on the GPU updates GPU variables as the CPU's", "[cuda][staged]") {
  sc::Variable wc(values({8, 4}, sc::f32, 5), "w"), bc(values({4}, sc::f32, 6), "b");
  sc::Variable wg(wc.value().to(gpu), "w"), bg(bc.value().to(gpu), "b");
  auto on_cpu = sc::function([&](sc::Tensor x, sc::Tensor y) { return std::get<0>(sgd_step(wc, bc, x, y)); });
  auto on_gpu = sc::function([&](sc::Tensor x, sc::Tensor y) { return std::get<0>(sgd_step(wg, bg, x, y)); });
  const sc::Tensor x = values({16, 8}, sc::f32, 7), y = values({16, 4}, sc::f32, 8);
  const sc::Tensor xg = x.to(gpu), yg = y.to(gpu);
  for (int it = 0; it < 3; ++it) {
    const sc::Tensor lg = on_gpu(xg, yg), lc = on_cpu(x, y);
    check_same(lg, lc, 1e-5);
  }
  check_same(wg.value(), wc.value(), 1e-5);
  check_same(bg.value(), bc.value(), 1e-5);
  CHECK(on_gpu.trace_count() == 1);
}

TEST_CASE("cuda staged: fused kernels are cached in memory and on disk, a corrupt file recompiled", "[cuda][staged]") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "stagecraft_rtc_test";
  std::filesystem::remove_all(dir);
  const std::string saved = sc::cuda::kernel_cache_dir();
  sc::cuda::kernel_cache_dir() = dir.string();
  // A shape no other test uses: a source this process has not compiled.
  const auto body = [](sc::Tensor t) { return sc::exp(t) * 3.f + t; };
  auto f = sc::function(body);
  const sc::Tensor x = values({7, 131}, sc::f32, 9), want = f(x);
  const auto s0 = sc::cuda::fused_kernel_stats();
  check_same(f(x.to(gpu)), want, 1e-6);
  const auto s1 = sc::cuda::fused_kernel_stats();
  CHECK(s1.compiled == s0.compiled + 1);
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path());
  REQUIRE(files.size() == 1);  // no temporary left behind
  // Another function with the same program: the same source, found in memory.
  auto f2 = sc::function(body);
  check_same(f2(x.to(gpu)), want, 1e-6);
  CHECK(sc::cuda::fused_kernel_stats().memory_hits == s1.memory_hits + 1);
  // Forgotten in memory: read back from disk.
  sc::cuda::abi::rtc_forget();
  auto f3 = sc::function(body);
  check_same(f3(x.to(gpu)), want, 1e-6);
  const auto s2 = sc::cuda::fused_kernel_stats();
  CHECK(s2.disk_hits == s1.disk_hits + 1);
  CHECK(s2.compiled == s1.compiled);
  // Truncated: compiled again, the file rewritten whole.
  const auto full = std::filesystem::file_size(files[0]);
  std::filesystem::resize_file(files[0], full / 2);
  sc::cuda::abi::rtc_forget();
  auto f4 = sc::function(body);
  check_same(f4(x.to(gpu)), want, 1e-6);
  CHECK(sc::cuda::fused_kernel_stats().compiled == s2.compiled + 1);
  CHECK(std::filesystem::file_size(files[0]) == full);
  sc::cuda::kernel_cache_dir() = saved;
  std::filesystem::remove_all(dir);
}

TEST_CASE("cuda staged: with GPU fusion off the plan runs every op as its eager kernel", "[cuda][staged]") {
  sc::graph::cuda_fusion() = false;
  auto f = sc::function([](sc::Tensor x) { return sc::sqrt(sc::abs(x) + 1.f) * x; });
  const sc::Tensor x = values({300}, sc::f32, 10);
  const sc::Tensor got = f(x.to(gpu));
  sc::graph::cuda_fusion() = true;
  CHECK(f.get_concrete(x.to(gpu)).stats().plan.fused_groups == 0);
  check_same(got, f(x), 1e-6);
}

TEST_CASE("cuda staged: sc::compile on GPU tensors runs its graph as fused generated kernels", "[cuda][staged]") {
  auto g = sc::compile([](auto a, auto b) { return sc::tanh(a * b + 0.5f) * sc::sigmoid(a) - b / (1 + sc::exp(-a)); });
  const sc::Tensor x = values({33, 65}, sc::f32, 11), y = values({65}, sc::f32, 12);
  const auto before = sc::cuda::fused_kernel_stats();
  const sc::Tensor got = g(x.to(gpu), y.to(gpu));
  const auto after = sc::cuda::fused_kernel_stats();
  CHECK(after.compiled + after.memory_hits + after.disk_hits > before.compiled + before.memory_hits + before.disk_hits);
  check_same(got, g(x, y), 1e-5);
  check_same(g(x.to(gpu), y.to(gpu)), g(x, y), 1e-5);  // the kept traced function, run again
  // Under a tape the ops run one by one (the tape records them): the gradient is the CPU's.
  const sc::Tensor xg = x.to(gpu);
  sc::GradientTape tape;
  tape.watch(xg);
  const sc::Tensor dx = tape.gradient(sc::sum(g(xg, y.to(gpu))), xg);
  check_same(dx, sc::grad<0>(g)(x, y), 1e-4);
}

TEST_CASE("cuda staged: 16-byte and one-element generated kernels give the same bits", "[cuda][staged]") {
  auto body = [](sc::Tensor x, sc::Tensor c) { return sc::tanh(x * c + 0.5f) * c - x / (1.f + sc::exp(-x)); };
  for (sc::DType d : {sc::f32, sc::f64}) {
    for (std::int64_t n : {1, 3, 4099, 1 << 16}) {  // tails of every length
      INFO(sc::name(d) << " n " << n);
      const sc::Tensor x = values({n}, d, 13).to(gpu), c = values({n}, d, 14).to(gpu);
      sc::graph::cuda_vector_loads() = true;
      const sc::Tensor v = sc::function(body)(x, c);
      sc::graph::cuda_vector_loads() = false;
      const sc::Tensor one = sc::function(body)(x, c);
      sc::graph::cuda_vector_loads() = true;
      check_bits(v, one);
      check_same(v, body(x.to(sc::Device::cpu()), c.to(sc::Device::cpu())), 1e-5);
    }
  }
}

// ---- CUDA graphs ----------------------------------------------------------------------------

namespace {
/// Turns CUDA graphs on for a scope, and back to what they were. (Every test here leaves the
/// policy as it found it: one process may run them all.)
struct GraphsOn : sctest::cuda::GraphPolicyScope {
  GraphsOn() : GraphPolicyScope(sc::cuda::GraphPolicy::always) {}
};

/// Three calls of plain (kernel by kernel) and of graphed (replayed as a CUDA graph from its
/// second call) on args: every result within tol of want's (the CPU's).
template <class Plain, class Graphed, class... A>
void check_three_calls(Plain& plain, Graphed& graphed, const std::vector<sc::Tensor>& want, double tol, const A&... args) {
  for (int it = 0; it < 3; ++it) {
    const sctest::cuda::GraphPolicyScope kernels(sc::cuda::GraphPolicy::never);  // (restored after each call)
    const std::vector<sc::Tensor> p = plain(args...);
    const GraphsOn on;
    const std::vector<sc::Tensor> g = graphed(args...);
    REQUIRE(p.size() == want.size());
    REQUIRE(g.size() == want.size());
    for (std::size_t r = 0; r < want.size(); ++r) {
      INFO("call " << it << ", result " << r);
      check_same(p[r], want[r], tol);
      check_same(g[r], want[r], tol);
    }
  }
}
}  // namespace

TEST_CASE("cuda graphs: a traced training step replays as one CUDA graph, equal to kernel by kernel", "[cuda][staged][graph]") {
  // The same variables twice: one copy stepped kernel by kernel, one by the replayed graph.
  sc::Variable w1(values({8, 4}, sc::f32, 21).to(gpu), "w"), b1(values({4}, sc::f32, 22).to(gpu), "b");
  sc::Variable w2(w1.value(), "w"), b2(b1.value(), "b");
  auto plain = sc::function([&](sc::Tensor x, sc::Tensor y) { return sgd_step(w1, b1, x, y); });
  auto graphed = sc::function([&](sc::Tensor x, sc::Tensor y) { return sgd_step(w2, b2, x, y); });
  std::vector<sc::Tensor> plain_out, graph_out;
  for (int it = 0; it < 6; ++it) {
    // New inputs at every call: the graph's copy nodes must read this call's tensors.
    const sc::Tensor x = values({16, 8}, sc::f32, 30 + it).to(gpu), y = values({16, 4}, sc::f32, 40 + it).to(gpu);
    const sctest::cuda::GraphPolicyScope kernels(sc::cuda::GraphPolicy::never);  // (restored after each call)
    const auto [l1, p1] = plain(x, y);
    const GraphsOn on;
    const auto [l2, p2] = graphed(x, y);
    plain_out.insert(plain_out.end(), {l1, p1});
    graph_out.insert(graph_out.end(), {l2, p2});
  }
  // Every call's results are its own (later launches wrote into new tensors).
  for (std::size_t i = 0; i < plain_out.size(); ++i) {
    INFO("result " << i);
    check_same(graph_out[i], plain_out[i].to(sc::Device::cpu()), 1e-6);
  }
  check_same(w2.value(), w1.value().to(sc::Device::cpu()), 1e-6);
  check_same(b2.value(), b1.value().to(sc::Device::cpu()), 1e-6);
  const sc::Tensor x0 = values({16, 8}, sc::f32, 30).to(gpu), y0 = values({16, 4}, sc::f32, 40).to(gpu);
  const auto st = graphed.get_concrete(x0, y0).stats();
  INFO(st);
  // The first call warms up, the second captures and launches: five launches in all.
  CHECK(st.plan.cuda_graph == "replaying (5 launches)");
  const sctest::cuda::GraphPolicyScope kernels(sc::cuda::GraphPolicy::never);  // (the status says what the policy does)
  CHECK(plain.get_concrete(x0, y0).stats().plan.cuda_graph.rfind("off", 0) == 0);
}

TEST_CASE("cuda graphs: a traced convolution step with its gradients (cuDNN and im2col) replays as one graph, "
          "equal to the CPU", "[cuda][staged][graph][conv]") {
  const sc::Tensor x = values({8, 3, 12, 12}, sc::f32, 60), w = values({6, 3, 3, 3}, sc::f32, 61);
  const auto step = [](const sc::Tensor& xx, const sc::Tensor& ww) {
    sc::GradientTape tape;
    tape.watch(xx);
    tape.watch(ww);
    const sc::Tensor y = sc::sum(sc::nn::max_pool2d(sc::relu(sc::nn::conv2d(xx, ww, 1, 1)), 2, 2));
    const std::vector<sc::Tensor> g = tape.gradient(y, std::vector<sc::Tensor>{xx, ww});
    return std::make_tuple(y, g[0], g[1]);
  };
  const auto [y_cpu, dx_cpu, dw_cpu] = step(x, w);
  const sc::Tensor xg = x.to(gpu), wg = w.to(gpu);
  for (const sc::cuda::ConvAlgorithm algo : {sc::cuda::ConvAlgorithm::cudnn, sc::cuda::ConvAlgorithm::im2col}) {
    INFO(sctest::cuda::algorithm_name(algo));
    const sctest::cuda::ConvAlgorithmScope scope(algo);
    const GraphsOn on;
    auto f = sc::function(step);
    for (int it = 0; it < 3; ++it) {  // warm-up, capture and launch, replay
      const auto [y, dx, dw] = f(xg, wg);
      check_same(y, y_cpu, 1e-4);
      check_same(dx, dx_cpu, 1e-4);
      check_same(dw, dw_cpu, 1e-4);
    }
    const auto st = f.get_concrete(xg, wg).stats();
    INFO(st);
    CHECK(st.plan.cuda_graph.rfind("replaying", 0) == 0);
  }
}

TEST_CASE("cuda graphs: a variable assigned between calls is read afresh by the graph", "[cuda][staged][graph]") {
  const GraphsOn on;
  sc::Variable v(sc::full({5}, 1.f).to(gpu), "v");
  auto f = sc::function([&](sc::Tensor x) { return sc::exp(v * x) + v; });
  const sc::Tensor x = values({5}, sc::f32, 50).to(gpu);
  for (int it = 0; it < 4; ++it) {
    v.assign(sc::full({5}, 0.5f * static_cast<float>(it)).to(gpu));
    const sc::Tensor want = sc::exp(v.value() * x) + v.value();  // eager, on the GPU
    check_same(f(x), want.to(sc::Device::cpu()), 1e-6);
  }
  CHECK(f.get_concrete(x).stats().plan.cuda_graph == "replaying (3 launches)");
  // A variable's shape is fixed: a value of another shape is refused at the assignment, and the
  // graph goes on replaying with the value it had.
  CHECK_THROWS_WITH(v.assign(sc::full({6}, 1.f).to(gpu)), Catch::Contains("variable 'v' has shape [5], the value has "
                                                                          "shape [6]"));
  check_same(f(x), (sc::exp(v.value() * x) + v.value()).to(sc::Device::cpu()), 1e-6);
}

TEST_CASE("cuda graphs: 40 variables (two copy kernels each way) and sliced arguments copy in and out", "[cuda][staged][graph]") {
  // A graph's copies in and out are kernels of up to 32 tensors each: 40 variables read and
  // assigned need two each way. The arguments are slices (at offsets of 4 bytes and of 3 bools,
  // where the copy kernel takes its word and byte paths if slices are views).
  const GraphsOn on;
  std::vector<sc::Variable> vars, twins;
  for (int i = 0; i < 40; ++i) {
    const sc::Tensor init = values({3 + i % 5}, sc::f32, 70 + i).to(gpu);
    vars.emplace_back(init, "v" + std::to_string(i));
    twins.emplace_back(init, "t" + std::to_string(i));
  }
  auto update = [](std::vector<sc::Variable>& vs, const sc::Tensor& a, const sc::Tensor& c) {
    const sc::Tensor shift = sc::sum(a) * 0.25f + sc::sum(sc::cast(c, sc::f32));
    sc::Tensor total = shift * 0.f;
    for (sc::Variable& v : vs) {
      const sc::Tensor next = v.value() * 0.5f + shift;
      v.assign(next);
      total = total + sc::sum(next);
    }
    return total;
  };
  auto f = sc::function([&](sc::Tensor a, sc::Tensor c) { return update(vars, a, c); });
  for (int it = 0; it < 4; ++it) {
    const sc::Tensor a = sc::slice(values({11}, sc::f32, 91 + it).to(gpu), {1}, {8});
    const sc::Tensor c = sc::slice((values({16}, sc::f32, 95 + it) > 0.f).to(gpu), {3}, {13});
    sc::Tensor want;
    {
      const sctest::cuda::GraphPolicyScope kernels(sc::cuda::GraphPolicy::never);
      want = update(twins, a, c);
    }
    check_same(f(a, c), want.to(sc::Device::cpu()), 1e-5);
  }
  for (std::size_t i = 0; i < vars.size(); ++i) {
    INFO("variable " << i);
    check_same(vars[i].value(), twins[i].value().to(sc::Device::cpu()), 1e-6);
  }
  const sc::Tensor a0 = sc::slice(values({11}, sc::f32, 91).to(gpu), {1}, {8});
  const sc::Tensor c0 = sc::slice((values({16}, sc::f32, 95) > 0.f).to(gpu), {3}, {13});
  const auto st = f.get_concrete(a0, c0).stats();
  INFO(st);
  CHECK(st.plan.cuda_graph == "replaying (3 launches)");
}

TEST_CASE("cuda graphs: random numbers drawn in a replayed graph follow each call's state", "[cuda][staged][graph]") {
  // The Philox state is device memory the kernel reads when it runs, so a replay draws from the
  // state of its own call.
  auto draw = [](sc::Tensor x, sc::Tensor state) {
    return x + sc::detail::random_uniform(state, {64}, 0.0, 1.0, sc::f32, std::source_location::current());
  };
  auto plain = sc::function(draw);
  auto graphed = sc::function(draw);
  const sc::Tensor x = sc::zeros({64}).to(gpu);
  std::vector<sc::Tensor> a, b;
  for (int i = 0; i < 4; ++i) {
    const sc::Tensor state = sc::detail::random_state(7, static_cast<std::uint64_t>(i) * 100).to(gpu);
    const sctest::cuda::GraphPolicyScope kernels(sc::cuda::GraphPolicy::never);  // (restored after each call)
    a.push_back(plain(x, state));
    const GraphsOn on;
    b.push_back(graphed(x, state));
  }
  for (int i = 0; i < 4; ++i) check_same(b[i], a[i].to(sc::Device::cpu()), 0.0);
  CHECK(a[2].to_vector<float>() != a[3].to_vector<float>());  // different states, different numbers
  const sc::Tensor s0 = sc::detail::random_state(7).to(gpu);
  CHECK(graphed.get_concrete(x, s0).stats().plan.cuda_graph == "replaying (3 launches)");
}

namespace {
/// A cond whose branch the data picks, a while_loop whose rounds the data count (5 to 17 in the
/// test's 8 calls) and whose body
/// swaps two loop variables (a result in another variable's storage), and a while_loop with a
/// cond inside its body: every decision made on the GPU when replayed as one graph.
std::tuple<sc::Tensor, sc::Tensor, sc::Tensor, sc::Tensor, sc::Tensor> controlled(sc::Tensor x, sc::Tensor y) {
  const sc::Tensor a = sc::cond(sc::sum(x) > 0.f, [&] { return sc::tanh(x) * 3.f + y; }, [&] { return x * x - 1.f; });
  auto [fv, fw, fn] = sc::while_loop([](sc::Tensor v, sc::Tensor, sc::Tensor) { return sc::sum(v * v) > 1.f; },
                                     [](sc::Tensor v, sc::Tensor w, sc::Tensor n) { return std::make_tuple(w * 0.5f, v, n + 1.f); },
                                     std::make_tuple(a, a * 0.5f, sc::sum(x) * 0.f));  // a's size sets the rounds
  const sc::Tensor fz = sc::while_loop(
      [](sc::Tensor z) { return sc::max(z) > 0.1f; },
      [](sc::Tensor z) { return sc::cond(sc::sum(z) > 4.f, [&] { return z * 0.5f; }, [&] { return z - 0.3f; }); },
      sc::abs(x));
  return {a, fv, fw, fn, fz};
}
}  // namespace

TEST_CASE("cuda graphs: a plan with cond and while_loop replays as one graph, branches and rounds chosen on the GPU",
          "[cuda][staged][graph]") {
  auto plain = sc::function(controlled);
  auto graphed = sc::function(controlled);
  std::vector<sc::Tensor> want, got;
  std::vector<float> rounds;
  for (int it = 0; it < 8; ++it) {
    // Both signs of sum(x), and scales that change the number of rounds.
    const float scale = (it % 2 == 0 ? 1.f : -1.f) * static_cast<float>(1 + it);
    const sc::Tensor x = (values({6, 5}, sc::f32, 60 + it) * scale).to(gpu), y = values({6, 5}, sc::f32, 70 + it).to(gpu);
    const sctest::cuda::GraphPolicyScope kernels(sc::cuda::GraphPolicy::never);  // (restored after each call)
    const auto p = plain(x, y);
    const GraphsOn on;
    const auto g = graphed(x, y);
    const auto c = controlled(x.to(sc::Device::cpu()), y.to(sc::Device::cpu()));  // eager, on the CPU
    std::apply([&](const auto&... t) { (want.push_back(t), ...); }, p);
    std::apply([&](const auto&... t) { (got.push_back(t), ...); }, g);
    check_same(std::get<0>(g), std::get<0>(c), 1e-5);
    check_same(std::get<3>(g), std::get<3>(c), 0.0);  // the same number of rounds as the CPU
    check_same(std::get<4>(g), std::get<4>(c), 1e-5);
    rounds.push_back(std::get<3>(c).item<float>());
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("result " << i);
    check_same(got[i], want[i].to(sc::Device::cpu()), 1e-6);
  }
  CHECK(std::set<float>(rounds.begin(), rounds.end()).size() > 2);  // the data chose the rounds
  const sc::Tensor x0 = values({6, 5}, sc::f32, 60).to(gpu), y0 = values({6, 5}, sc::f32, 70).to(gpu);
  const auto st = graphed.get_concrete(x0, y0).stats();
  INFO(st);
  CHECK(st.plan.cuda_graph == "replaying (7 launches)");
}

TEST_CASE("cuda graphs: a while_loop bounded by maximum_iterations stops at the bound on the GPU as on the CPU",
          "[cuda][staged][graph]") {
  // Halving until max(|z|) < limit, at most 4 rounds: the data or the bound ends the loop.
  auto body = [](sc::Tensor x, sc::Tensor limit) {
    auto [z, n] = sc::while_loop([&](sc::Tensor v, sc::Tensor) { return sc::max(sc::abs(v)) > limit; },
                                 [](sc::Tensor v, sc::Tensor k) { return std::make_tuple(v * 0.5f, k + 1.f); },
                                 std::make_tuple(x, sc::sum(x) * 0.f), sc::WhileOptions{.maximum_iterations = 4});
    return std::vector<sc::Tensor>{z, n};
  };
  auto plain = sc::function(body);
  auto graphed = sc::function(body);
  const sc::Tensor x = values({6, 5}, sc::f32, 80) * 8.f;
  for (const float limit : {0.01f, 1.f, 100.f}) {  // 4 rounds (the bound), fewer, none
    INFO("limit " << limit);
    const sc::Tensor l = sc::scalar(limit);
    const std::vector<sc::Tensor> want = body(x, l);  // eager, on the CPU
    check_three_calls(plain, graphed, want, 0.0, x.to(gpu), l.to(gpu));
  }
  CHECK(body(x, sc::scalar(0.01f))[1].item<float>() == 4.f);
  // The bound as a traced tensor on the GPU: one trace (and one captured graph) for every bound.
  auto by_tensor = [](sc::Tensor in, sc::Tensor limit, sc::Tensor n) {
    auto [z, k] = sc::while_loop([&](sc::Tensor v, sc::Tensor) { return sc::max(sc::abs(v)) > limit; },
                                 [](sc::Tensor v, sc::Tensor r) { return std::make_tuple(v * 0.5f, r + 1.f); },
                                 std::make_tuple(in, sc::sum(in) * 0.f), sc::WhileOptions{.maximum_iterations = n});
    return std::vector<sc::Tensor>{z, k};
  };
  auto plain_t = sc::function(by_tensor), graphed_t = sc::function(by_tensor);
  for (const std::int64_t n : {std::int64_t{0}, std::int64_t{2}, std::int64_t{9}}) {
    const std::vector<sc::Tensor> want = by_tensor(x, sc::scalar(0.01f), sc::scalar(n));
    check_three_calls(plain_t, graphed_t, want, 0.0, x.to(gpu), sc::scalar(0.01f).to(gpu), sc::scalar(n).to(gpu));
  }
  CHECK(plain_t.trace_count() == 1);
  CHECK(plain_t(x.to(gpu), sc::scalar(0.01f).to(gpu), sc::scalar(std::int64_t{3}))[1].item<float>() == 3.f);  // bound on the CPU
}

TEST_CASE("cuda graphs: two threads capture their plans at the same time, each replaying its own graph",
          "[cuda][staged][graph]") {
  // The capture streams (and the conditional bodies' streams) are per thread: a stream shared by
  // the device's threads made the second capture fail and its plan run kernel by kernel for good.
  const GraphsOn on;
  constexpr int threads = 2, calls = 6;
  std::vector<std::vector<std::tuple<sc::Tensor, sc::Tensor, sc::Tensor, sc::Tensor, sc::Tensor>>> got(threads);
  std::vector<std::string> status(threads), failure(threads);
  std::atomic<int> ready{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      try {
        auto f = sc::function(controlled);
        const sc::Tensor x = values({6, 5}, sc::f32, 90 + t).to(gpu), y = values({6, 5}, sc::f32, 95 + t).to(gpu);
        ready.fetch_add(1);
        while (ready.load() < threads) std::this_thread::yield();  // both capture at the second call
        for (int c = 0; c < calls; ++c) got[t].push_back(f(x, y));
        status[t] = f.get_concrete(x, y).stats().plan.cuda_graph;
      } catch (const std::exception& e) {
        failure[t] = e.what();
      }
    });
  for (std::thread& th : pool) th.join();
  for (int t = 0; t < threads; ++t) {
    INFO("thread " << t << ": " << failure[t]);
    REQUIRE(failure[t].empty());
    CHECK(status[t] == "replaying (" + std::to_string(calls - 1) + " launches)");
    const sc::Tensor x = values({6, 5}, sc::f32, 90 + t), y = values({6, 5}, sc::f32, 95 + t);
    const auto want = controlled(x, y);  // eager, on the CPU
    for (const auto& r : got[t]) {
      check_same(std::get<0>(r), std::get<0>(want), 1e-5);
      check_same(std::get<3>(r), std::get<3>(want), 0.0);
      check_same(std::get<4>(r), std::get<4>(want), 1e-5);
    }
  }
}

TEST_CASE("cuda staged: a dense layer's weight and bias gradients from one cuBLASLt call equal the CPU's",
          "[cuda][staged]") {
  auto grads = [](sc::Tensor x, sc::Tensor w, sc::Tensor b) {
    sc::GradientTape tape;
    tape.watch(w);
    tape.watch(b);
    const sc::Tensor loss = sc::sum(sc::tanh(sc::matmul(x, w) + b));
    const auto g = tape.gradient(loss, std::vector<sc::Tensor>{w, b});
    return std::make_tuple(g[0], g[1]);
  };
  auto f = sc::function(grads);
  for (const std::int64_t batch : {1, 64, 1000}) {
    INFO("batch " << batch);
    const sc::Tensor x = values({batch, 48}, sc::f32, 80), w = values({48, 20}, sc::f32, 81) * 0.2f,
                     b = values({20}, sc::f32, 82);
    const auto [dw, db] = f(x.to(gpu), w.to(gpu), b.to(gpu));
    const auto [cw, cb] = grads(x, w, b);  // eager, on the CPU
    check_same(dw, cw, 1e-4);
    check_same(db, cb, 1e-4);
    const auto st = f.get_concrete(x.to(gpu), w.to(gpu), b.to(gpu)).stats();
    INFO(st);
    CHECK(st.plan.epilogues == 1);
  }
}

TEST_CASE("cuda graphs: a traced LSTM step with all its gradients equals the CPU's, kernel by kernel and replayed",
          "[cuda][staged][graph]") {
  // The bench's model at 20 steps: the inputs' products and the weight gradients batched
  // (graph::batch_products), the gates read through windows of the stacked product, sibling groups.
  constexpr int steps = 20;
  sc::nn::LSTMCell cell{32, 64, 3};
  const std::unique_ptr<sc::nn::LSTMCell> gcell = sctest::lstm::copy_on(cell, gpu);
  std::vector<sc::Tensor> xs, gxs;
  for (int t = 0; t < steps; ++t) {
    xs.push_back(values({1, 32}, sc::f32, 600 + t));
    gxs.push_back(xs.back().to(gpu));
  }
  const auto body = [](const sc::nn::LSTMCell& c, const std::vector<sc::Tensor>& in, sc::Device d) {
    sc::GradientTape tape;
    auto state = c.initial_state(1);
    state = {state.first.to(d), state.second.to(d)};
    for (const sc::Tensor& x : in) state = c(x, state);
    const sc::Tensor loss = sc::sum(state.first * state.second);
    std::vector<sc::Tensor> r = tape.gradient(loss, c.trainable_variables());
    r.insert(r.begin(), loss);
    return r;
  };
  const std::vector<sc::Tensor> want = body(cell, xs, sc::Device::cpu());  // eager, on the CPU
  auto plain = sc::function([&] { return body(*gcell, gxs, gpu); });
  auto graphed = sc::function([&] { return body(*gcell, gxs, gpu); });
  for (int it = 0; it < 3; ++it) {
    const sctest::cuda::GraphPolicyScope kernels(sc::cuda::GraphPolicy::never);  // (restored after each call)
    const std::vector<sc::Tensor> p = plain();
    const GraphsOn on;
    const std::vector<sc::Tensor> g = graphed();
    REQUIRE(p.size() == want.size());
    REQUIRE(g.size() == want.size());
    for (std::size_t k = 0; k < want.size(); ++k) {
      INFO("call " << it << ", result " << k);
      check_same(p[k], want[k], 1e-4);
      check_same(g[k], want[k], 1e-4);
    }
  }
  const auto st = graphed.get_concrete().stats();
  INFO(st);
  // each step's recurrent product formed in its gates' group, forward and backward (graph::product_fusion)
  CHECK(st.plan.fused_products == 2 * steps - 1);
  CHECK(st.plan.kernels <= 3 * steps + 10);
  // 64 elements of 64- and 256-term products each: a warp per element (cuda_product_lanes)
  CHECK_THAT(graphed.get_concrete().plan().str(), Catch::Contains("[32 threads per element]"));
  CHECK(st.plan.cuda_graph.rfind("replaying", 0) == 0);
  // Kernel by kernel, the launches are the plan's kernels (counted where the emulator runs it).
  const auto [kernels, copies] = sctest::cuda::launches_of([&] { plain()[0].item<float>(); });
  if (kernels >= 0) {
    CHECK(kernels == plain.get_concrete().stats().plan.kernels);
    CHECK(copies == 0);
  }
}

TEST_CASE("cuda graphs: small products formed inside the groups that read them equal the CPU's", "[cuda][staged][graph]") {
  // graph::product_fusion (on a GPU by default). tanh(h u) + h reads h whole while each element's
  // product reads a row of it: the group's output, of h's shape, may not take h's buffer. The
  // four windows of a w^T read one product; a^T v reads A transposed. Kernel by kernel and
  // replayed, three calls each; then with the limit at 0 the products are cuBLAS calls again.
  const auto f = [](const sc::Tensor& x, const sc::Tensor& u, const sc::Tensor& w, const sc::Tensor& v) {
    const sc::Tensor h = sc::sin(x);                                // [4, 16]
    const sc::Tensor a = sc::tanh(sc::matmul(h, u)) + h;            // [4, 16]
    const sc::Tensor z = sc::matmul(a, w, false, true);             // [4, 64]
    auto gate = [&](std::int64_t k) { return sc::slice(z, {0, 16 * k}, {4, 16}); };
    const sc::Tensor g = sc::sigmoid(gate(0)) * sc::tanh(gate(1)) + gate(2) * gate(3);
    const sc::Tensor q = sc::exp(sc::matmul(a, v, true, false) * 0.1f) - 1.f;  // [16, 8]
    return std::vector<sc::Tensor>{g, q};
  };
  const sc::Tensor x = values({4, 16}, sc::f32, 71), u = values({16, 16}, sc::f32, 72), w = values({64, 16}, sc::f32, 73),
                   v = values({4, 8}, sc::f32, 74);
  const std::vector<sc::Tensor> want = f(x, u, w, v);
  const sc::Tensor gx = x.to(gpu), gu = u.to(gpu), gw = w.to(gpu), gv = v.to(gpu);
  auto plain = sc::function(f);
  auto graphed = sc::function(f);
  check_three_calls(plain, graphed, want, 1e-5, gx, gu, gw, gv);
  const auto st = graphed.get_concrete(gx, gu, gw, gv).stats();
  INFO(st);
  CHECK(st.plan.fused_products == 3);
  CHECK(st.plan.cuda_graph.rfind("replaying", 0) == 0);
  const std::int64_t saved = sc::graph::product_fusion_max_macs();
  sc::graph::product_fusion_max_macs() = 0;
  auto separate = sc::function(f);
  const std::vector<sc::Tensor> s = separate(gx, gu, gw, gv);
  sc::graph::product_fusion_max_macs() = saved;
  for (std::size_t r = 0; r < want.size(); ++r) check_same(s[r], want[r], 1e-5);
  const auto sst = separate.get_concrete(gx, gu, gw, gv).stats();
  CHECK(sst.plan.fused_products == 0);
  // Formed: sin, the group of h u, then the gates' and q's groups (independent) in one launch.
  // Apart: sin, then each product and the group reading it (the two groups then depend on them).
  CHECK(st.plan.kernels == 3);
  CHECK(st.plan.batched_groups == 2);
  CHECK(sst.plan.kernels == 7);
}

TEST_CASE("cuda graphs: a concat's pieces written in place (nested, and with pieces it still copies) equal the CPU's",
          "[cuda][staged][graph]") {
  // graph::concat_in_place on the GPU: exp(a) and cos(b) write their places in `inner`, which is
  // placed in `outer`'s rows with tanh(c); the argument a and a constant are copied by their
  // concat (its rest). Kernel by kernel and replayed as a CUDA graph, three calls each. (Without
  // graph::concat_fusion, which would have exp(a) and cos(b)'s group write `inner` itself.)
  const bool fusing = sc::graph::concat_fusion();
  sc::graph::concat_fusion() = false;
  const sc::Tensor k = values({1, 4}, sc::f32, 51);
  const auto f = [](const sc::Tensor& a, const sc::Tensor& b, const sc::Tensor& c, const sc::Tensor& kk) {
    const sc::Tensor inner = sc::concat({sc::exp(a), sc::cos(b)}, 1);  // [1, 8]
    const sc::Tensor outer = sc::concat({sc::tanh(c), inner, sc::sin(c)}, 0);  // [3, 8]
    const sc::Tensor rest = sc::concat({a, sc::exp(b), kk}, 0);  // [3, 4]: a and kk copied
    return std::vector<sc::Tensor>{outer * 0.5f, sc::sum(inner), rest + 1.f};
  };
  const sc::Tensor a = values({1, 4}, sc::f32, 52), b = values({1, 4}, sc::f32, 53), c = values({1, 8}, sc::f32, 54);
  const std::vector<sc::Tensor> want = f(a, b, c, k);
  const sc::Tensor ga = a.to(gpu), gb = b.to(gpu), gc = c.to(gpu), gk = k.to(gpu);
  auto plain = sc::function([&](const sc::Tensor& x, const sc::Tensor& y, const sc::Tensor& z) { return f(x, y, z, gk); });
  auto graphed = sc::function([&](const sc::Tensor& x, const sc::Tensor& y, const sc::Tensor& z) { return f(x, y, z, gk); });
  check_three_calls(plain, graphed, want, 1e-6, ga, gb, gc);
  const auto st = graphed.get_concrete(ga, gb, gc).stats();
  INFO(st);
  CHECK(st.plan.cuda_graph.rfind("replaying", 0) == 0);
  sc::graph::concat_in_place() = false;
  auto copied = sc::function([&](const sc::Tensor& x, const sc::Tensor& y, const sc::Tensor& z) { return f(x, y, z, gk); });
  (void)copied(ga, gb, gc);
  sc::graph::concat_in_place() = true;
  sc::graph::concat_fusion() = fusing;
  CHECK(st.plan.kernels == copied.get_concrete(ga, gb, gc).stats().plan.kernels - 2);
}

TEST_CASE("cuda graphs: concats written by the group of their pieces, through windows, equal the CPU's",
          "[cuda][staged][graph]") {
  // graph::concat_fusion: s and t side by side along axis 1, and t, s, t along axis 0, are written
  // by the group that makes them (its generated kernel stores each piece at its window's index):
  // one kernel for both concats. Kernel by kernel and replayed, three calls each; with concat
  // fusion off, each concat is a kernel of its own again.
  const auto f = [](const sc::Tensor& x, const sc::Tensor& y, const sc::Tensor& w) {
    const sc::Tensor s = x + y, t = sc::tanh(s) * w;  // [8, 24]
    return std::vector<sc::Tensor>{sc::concat({s, t}, 1), sc::concat({t, s, t}, 0), sc::sum(t, {1})};
  };
  const sc::Tensor x = values({8, 24}, sc::f32, 81), y = values({8, 24}, sc::f32, 82), w = values({24}, sc::f32, 83);
  const std::vector<sc::Tensor> want = f(x, y, w);
  const sc::Tensor gx = x.to(gpu), gy = y.to(gpu), gw = w.to(gpu);
  auto plain = sc::function(f);
  auto graphed = sc::function(f);
  check_three_calls(plain, graphed, want, 1e-6, gx, gy, gw);
  const auto st = graphed.get_concrete(gx, gy, gw).stats();
  INFO(st);
  CHECK(st.plan.fused_concats == 2);
  CHECK(st.plan.cuda_graph.rfind("replaying", 0) == 0);
  sc::graph::concat_fusion() = false;
  auto apart = sc::function(f);
  const std::vector<sc::Tensor> a = apart(gx, gy, gw);
  sc::graph::concat_fusion() = true;
  for (std::size_t r = 0; r < want.size(); ++r) check_same(a[r], want[r], 1e-6);
  CHECK(apart.get_concrete(gx, gy, gw).stats().plan.kernels == st.plan.kernels + 2);
}

TEST_CASE("cuda graphs: an Adam step's updates launched as one kernel equal the CPU's, kernel by kernel and replayed",
          "[cuda][staged][graph]") {
  // graph::cuda_group_batching: the four variables' updates (each read and assigned in turn) are
  // one launch (CudaFusedBatch). Three steps on the CPU, on the GPU kernel by kernel, replayed as a
  // CUDA graph, and with batching off; every loss and variable alike.
  const auto make = [](sc::Device d) {
    return std::vector<sc::Variable>{sc::Variable(values({8, 4}, sc::f32, 91).to(d), "w1"), sc::Variable(values({4}, sc::f32, 92).to(d), "b1"),
                                     sc::Variable(values({4, 3}, sc::f32, 93).to(d), "w2"), sc::Variable(values({3}, sc::f32, 94).to(d), "b2")};
  };
  const auto step = [](std::vector<sc::Variable>& vs, sc::optim::Adam& opt, const sc::Tensor& x, const sc::Tensor& y) {
    sc::GradientTape tape;
    const sc::Tensor h = sc::relu(sc::matmul(x, vs[0]) + vs[1]);
    const sc::Tensor loss = sc::mean(sc::square(sc::matmul(h, vs[2]) + vs[3] - y));
    opt.apply(tape.gradient(loss, vs), vs);
    return loss;
  };
  std::vector<sc::Variable> vc = make(sc::Device::cpu()), vp = make(gpu), vg = make(gpu), vu = make(gpu);
  sc::optim::Adam oc(0.01), op(0.01), og(0.01), ou(0.01);
  auto on_cpu = sc::function([&](const sc::Tensor& x, const sc::Tensor& y) { return step(vc, oc, x, y); });
  auto plain = sc::function([&](const sc::Tensor& x, const sc::Tensor& y) { return step(vp, op, x, y); });
  auto graphed = sc::function([&](const sc::Tensor& x, const sc::Tensor& y) { return step(vg, og, x, y); });
  auto unbatched = sc::function([&](const sc::Tensor& x, const sc::Tensor& y) { return step(vu, ou, x, y); });
  const sc::Tensor x = values({16, 8}, sc::f32, 95), y = values({16, 3}, sc::f32, 96);
  const sc::Tensor xg = x.to(gpu), yg = y.to(gpu);
  for (int it = 0; it < 3; ++it) {
    INFO("step " << it);
    const sc::Tensor lc = on_cpu(x, y);
    const sctest::cuda::GraphPolicyScope kernels(sc::cuda::GraphPolicy::never);  // (restored after each call)
    const sc::Tensor lp = plain(xg, yg);
    sc::graph::cuda_group_batching() = false;
    const sc::Tensor lu = unbatched(xg, yg);
    sc::graph::cuda_group_batching() = true;
    const GraphsOn on;
    const sc::Tensor lg = graphed(xg, yg);
    check_same(lp, lc, 1e-5);
    check_same(lu, lc, 1e-5);
    check_same(lg, lc, 1e-5);
  }
  for (std::size_t k = 0; k < vc.size(); ++k) {
    INFO("variable " << k);
    check_same(vp[k].value(), vc[k].value(), 1e-5);
    check_same(vu[k].value(), vc[k].value(), 1e-5);
    check_same(vg[k].value(), vc[k].value(), 1e-5);
  }
  // Made without a DeviceScope, the optimizers keep their state with the variables (a trace can
  // move nothing between devices): slots, the step counter and the rate on the GPU.
  CHECK(op.slot(vp[0], "m").device() == gpu);
  CHECK(op.iterations_variable().device() == gpu);
  CHECK(op.learning_rate_variable().device() == gpu);
  CHECK(op.iterations_variable().value().item<std::int64_t>() == 3);
  CHECK(oc.iterations_variable().device() == sc::Device::cpu());
  const auto st = plain.get_concrete(xg, yg).stats();
  INFO(st);
  CHECK(st.plan.batched_groups == 4);
  CHECK(unbatched.get_concrete(xg, yg).stats().plan.kernels == st.plan.kernels + 3);
  CHECK(graphed.get_concrete(xg, yg).stats().plan.cuda_graph.rfind("replaying", 0) == 0);
}
