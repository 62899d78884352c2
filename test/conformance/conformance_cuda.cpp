// Conformance on the GPU: every case of every table run again with its inputs on cuda:0 (and the
// call under a DeviceScope, so creation ops go there too), eager and traced by sc::function:
// - the result stays on the GPU and matches the independent reference within the table's
//   tolerance, as the CPU's must;
// - the tape gradient of each float input matches the CPU's within a small fraction of its
//   largest element (a GPU sums in another order).
// Calls the CPU refuses are left to the CPU table. Built into test_cuda_conformance (label cuda):
// skipped without a GPU, run on the lent machine and on the CUDA emulator (kernels/emulator).
#include <catch2/catch.hpp>

#include <stagecraft/autodiff/tape.hpp>
#include <stagecraft/graph/function.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "conformance.hpp"

namespace conf {
namespace {

const sc::Device gpu = sc::Device::cuda(0);

/// Gradients on the GPU against the CPU's, relative to the largest element: reductions (a
/// broadcast's gradient, matmul) add in another order there.
double grad_rtol(DType d) { return d == sc::f32 ? 1e-5 : 1e-12; }

std::vector<sc::Tensor> on(const std::vector<Ref>& ins, sc::Device d) {
  std::vector<sc::Tensor> ts;
  for (const Ref& r : ins) ts.push_back(d.is_cpu() ? to_tensor(r) : to_tensor(r).to(d));
  return ts;
}

/// "" when got (a GPU result) is on the GPU and within the table's tolerance of the reference.
std::string judge(const OpEntry& e, const Case& c, const std::vector<Ref>& ins, const sc::Tensor& got) {
  if (!got.defined()) return "undefined result";
  if (got.device() != gpu) return "result on " + got.device().str() + ", not on the GPU";
  return compare(e.ref(ins, c.p), got.to(sc::Device::cpu()), e.tol);
}

/// The largest |a - b| over finite elements and the largest finite |b|; a mismatch of meta or of
/// NaN/infinity positions as an error message.
std::string grad_diff(const sc::Tensor& got, const sc::Tensor& want, double rtol) {
  if (!got.defined() || !want.defined()) return "undefined gradient";
  if (got.shape() != want.shape() || got.dtype() != want.dtype()) return "gradient shape or dtype differs";
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (std::isfinite(w[i])) scale = std::max(scale, std::fabs(w[i]));
    if (std::isnan(w[i]) != std::isnan(g[i]) || (std::isinf(w[i]) && w[i] != g[i]))
      return "element " + std::to_string(i) + ": GPU " + std::to_string(g[i]) + ", CPU " + std::to_string(w[i]);
    if (std::isfinite(w[i])) err = std::max(err, std::fabs(g[i] - w[i]));
  }
  if (err <= rtol * scale) return "";
  std::ostringstream os;
  os << "max |GPU - CPU| " << err << " > " << rtol << " of the largest element " << scale;
  return os.str();
}

struct Tally {
  int cases = 0, grads = 0;
};

void check_case(const OpEntry& e, std::size_t ci, Tally& t) {
  const Case& c = e.cases[ci];
  const std::vector<Ref> ins = case_inputs(e, ci);
  const std::string name = describe_case(e, c, ins);
  const std::vector<sc::Tensor> cpu = on(ins, sc::Device::cpu());
  sc::Tensor want;
  try {
    want = e.call(cpu, c.p);
  } catch (const std::exception&) {
    return;  // refused on the CPU: the CPU table checks that
  }
  (void)want;
  ++t.cases;
  const std::vector<sc::Tensor> dev = on(ins, gpu);
  const sc::DeviceScope scope(gpu);
  // Eager, then traced (one generated kernel per fused group, the plan's buffers on the GPU).
  try {
    if (const std::string err = judge(e, c, ins, e.call(dev, c.p)); !err.empty()) FAIL_CHECK(name << ": eager GPU: " << err);
  } catch (const std::exception& ex) {
    FAIL_CHECK(name << ": eager GPU call threw: " << ex.what());
  }
  try {
    auto f = sc::function([&e, &c](const std::vector<sc::Tensor>& x) { return e.call(x, c.p); }, e.op);
    if (const std::string err = judge(e, c, ins, f(dev)); !err.empty()) FAIL_CHECK(name << ": traced GPU: " << err);
  } catch (const std::exception& ex) {
    FAIL_CHECK(name << ": traced GPU call threw: " << ex.what());
  }
  // Gradients of the float inputs flagged in grad_inputs: d sum(op(x) * cot) / dx, GPU vs CPU.
  std::vector<std::size_t> src;
  for (std::size_t i = 0; i < ins.size() && i < 32; ++i)
    if ((e.grad_inputs >> i & 1u) && sc::is_floating(ins[i].dtype)) src.push_back(i);
  if (src.empty() || !sc::is_floating(want.dtype())) return;
  const Ref cot_values = make_input({want.shape(), want.dtype(), Gen::normal, 0, {}}, 0xC07ull + 7919 * ci);
  const auto grads = [&](const std::vector<sc::Tensor>& x, const sc::Tensor& cot) {
    sc::GradientTape tape;
    std::vector<sc::Tensor> s;
    for (std::size_t i : src) s.push_back(x[i]);
    tape.watch(s);
    return tape.gradient(sc::sum(e.call(x, c.p) * cot), s);
  };
  // A gradient that reads its output (OpEntry::grad_ulps_of_result) gets that many ulps of the
  // largest finite |y| more.
  double forward_term = 0;
  if (e.grad_ulps_of_result > 0) {
    double big = 0;
    for (const double v : want.to_vector<double>())
      if (std::isfinite(v)) big = std::max(big, std::fabs(v));
    forward_term = e.grad_ulps_of_result * big * (want.dtype() == sc::f32 ? 0x1p-23 : 0x1p-52);
  }
  std::vector<sc::Tensor> gw;
  {
    const sc::DeviceScope host(sc::Device::cpu());
    try {
      gw = grads(cpu, to_tensor(cot_values));
    } catch (const std::exception&) {
      return;
    }
  }
  ++t.grads;
  try {
    const std::vector<sc::Tensor> gg = grads(dev, to_tensor(cot_values).to(gpu));
    REQUIRE(gg.size() == gw.size());
    for (std::size_t k = 0; k < gw.size(); ++k) {
      if (gg[k].defined() && gg[k].device() != gpu) FAIL_CHECK(name << ": gradient " << k << " not on the GPU");
      if (const std::string err = grad_diff(gg[k], gw[k], grad_rtol(ins[src[k]].dtype) + forward_term); !err.empty())
        FAIL_CHECK(name << ": gradient of input " << src[k] << ": " << err);
    }
  } catch (const std::exception& ex) {
    FAIL_CHECK(name << ": GPU gradient threw: " << ex.what());
  }
}

void check_table_cuda(const std::vector<OpEntry>& table) {
  for (const OpEntry& e : table) {
    INFO("op " << e.op << " via " << e.api << ": " << e.cases.size() << " cases, on the GPU");
    Tally t;
    for (std::size_t ci = 0; ci < e.cases.size(); ++ci) check_case(e, ci, t);
    CHECK(t.cases > 0);
  }
}

}  // namespace
}  // namespace conf

TEST_CASE("conformance cuda: elementwise table", "[cuda][conformance]") { conf::check_table_cuda(conf::elementwise_table()); }
TEST_CASE("conformance cuda: reduce table", "[cuda][conformance]") { conf::check_table_cuda(conf::reduce_table()); }
TEST_CASE("conformance cuda: layout table", "[cuda][conformance]") { conf::check_table_cuda(conf::layout_table()); }
TEST_CASE("conformance cuda: nn table", "[cuda][conformance]") { conf::check_table_cuda(conf::nn_table()); }
TEST_CASE("conformance cuda: creation table", "[cuda][conformance]") { conf::check_table_cuda(conf::creation_table()); }
