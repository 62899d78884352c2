// Conformance, traced: every case of every table run again through sc::function (forward, and
// the tape gradient staged inside the function) and compared with the eager run; one trace per
// signature; errors raised by infer() at trace time, data-dependent ones when the plan runs.
#include <catch2/catch.hpp>

#include <stagecraft/autodiff/tape.hpp>
#include <stagecraft/graph/function.hpp>

#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <type_traits>

#include "conformance.hpp"

namespace conf {
namespace {

// Forward results must be bitwise equal to eager ones (same value, same sign of zero, NaN where
// eager has NaN): one op traced runs the same kernel, a composite traced runs the same ops in the
// same order, and a fused group computes every element by the rule the eager loop uses (floating
// tails included: both send them through one padded SIMD batch). The ops listed here may differ in
// the last bits; their traced results are held to the table's tolerance against the reference
// instead. Their cause: a sum that consumes a fused group (graph/passes/fuse.hpp, from
// fusion_min_elements up) adds tile by tile, where the eager sum splits rows pairwise. Measured:
// under 1 ulp.
const std::map<std::string, std::string> inexact_forward = {
    {"softmax", "sub + exp fused with the row sum: the sum adds in another order"},
    {"log_softmax", "sub + exp fused with the row sum: the sum adds in another order"},
    {"logsumexp", "sub + exp fused with the row sum: the sum adds in another order"},
};

/// Gradients: traced vs eager within this tolerance relative to the gradient's largest element.
/// (Elementwise relative error is not the measure: softmax's gradient p (c - sum(c p)) cancels,
/// so a 1-ulp change of p is 25 ulps of a small element.)
double grad_rtol(DType d) { return d == sc::f32 ? 1e-6 : 1e-12; }

/// Summary per entry, printed when SC_CONFORMANCE_TRACED_SUMMARY is set (for reports).
struct Tally {
  int cases = 0, exact = 0, tolerance = 0, failed = 0;
  int grad_cases = 0, grad_exact = 0, grad_failed = 0;
  double max_ulps = 0, grad_max_rel = 0;
  void add(const Tally& o) {
    cases += o.cases, exact += o.exact, tolerance += o.tolerance, failed += o.failed;
    grad_cases += o.grad_cases, grad_exact += o.grad_exact, grad_failed += o.grad_failed;
    max_ulps = std::max(max_ulps, o.max_ulps), grad_max_rel = std::max(grad_max_rel, o.grad_max_rel);
  }
};

std::string fmt(double v) {
  std::ostringstream os;
  os << std::setprecision(17) << v;
  return os.str();
}

/// How a traced tensor differs from the eager one.
struct Diff {
  std::string meta;           ///< undefined, dtype or shape mismatch ("" when they agree)
  std::int64_t differ = 0;    ///< elements not bitwise equal
  std::int64_t nonfinite = 0;  ///< of those, where either is NaN or infinite
  std::int64_t first = -1;    ///< the first differing element
  double got = 0, want = 0;
  double max_ulps = 0;   ///< largest |traced - eager| in ulps of |eager| (finite floats)
  double max_err = 0;    ///< largest |traced - eager| (finite floats)
  double scale = 0;      ///< largest finite |eager|
  bool exact() const { return meta.empty() && differ == 0; }
  double rel() const { return max_err == 0 ? 0.0 : (scale > 0 ? max_err / scale : inf_v); }
  std::string str() const {
    if (!meta.empty()) return meta;
    std::ostringstream os;
    os << differ << " elements differ, first at flat " << first << ": traced " << fmt(got) << ", eager " << fmt(want)
       << " (max " << fmt(max_ulps) << " ulps; max |diff| " << fmt(max_err) << " = " << fmt(rel())
       << " of the largest |eager|";
    if (nonfinite) os << "; " << nonfinite << " differ in NaN or infinity";
    os << ")";
    return os.str();
  }
};

Diff diff(const sc::Tensor& want, const sc::Tensor& got) {
  Diff d;
  if (!got.defined() || !want.defined()) {
    d.meta = std::string("undefined tensor (traced ") + (got.defined() ? "defined" : "undefined") + ", eager " +
             (want.defined() ? "defined" : "undefined") + ")";
    return d;
  }
  if (got.dtype() != want.dtype() || got.shape() != want.shape()) {
    std::ostringstream os;
    os << "traced " << sc::name(got.dtype()) << got.shape() << ", eager " << sc::name(want.dtype()) << want.shape();
    d.meta = os.str();
    return d;
  }
  sc::visit_dtype(want.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const std::vector<T> w = want.to_vector<T>(), g = got.to_vector<T>();
    for (std::size_t i = 0; i < w.size(); ++i) {
      bool same = w[i] == g[i];
      if constexpr (std::is_floating_point_v<T>) {
        same = (std::isnan(w[i]) && std::isnan(g[i])) || (same && std::signbit(w[i]) == std::signbit(g[i]));
        const double wd = static_cast<double>(w[i]), gd = static_cast<double>(g[i]);
        if (std::isfinite(wd)) d.scale = std::max(d.scale, std::fabs(wd));
        if (!same && std::isfinite(wd) && std::isfinite(gd)) {
          const double err = std::fabs(gd - wd);
          const double tiny = static_cast<double>(std::numeric_limits<T>::min());
          const double ulp = static_cast<double>(std::numeric_limits<T>::epsilon()) * std::max(std::fabs(wd), tiny);
          d.max_ulps = std::max(d.max_ulps, err / ulp);
          d.max_err = std::max(d.max_err, err);
        } else if (!same) {
          ++d.nonfinite;
        }
      }
      if (!same && d.differ++ == 0) {
        d.first = static_cast<std::int64_t>(i);
        d.got = static_cast<double>(g[i]);
        d.want = static_cast<double>(w[i]);
      }
    }
  });
  return d;
}

std::vector<sc::Tensor> tensors_of(const std::vector<Ref>& ins) {
  std::vector<sc::Tensor> ts;
  for (const Ref& r : ins) ts.push_back(to_tensor(r));
  return ts;
}

/// The case's inputs drawn with another seed (explicit values stay): the second call has the
/// same signature and new values, so a result that aliased a plan buffer would show.
std::vector<Ref> second_inputs(const Case& c, std::size_t ci) {
  std::vector<Ref> r;
  for (std::size_t i = 0; i < c.in.size(); ++i) r.push_back(make_input(c.in[i], 0x5EC0'0000ull + 131 * ci + i));
  return r;
}

/// The inputs whose gradient is checked: flagged in grad_inputs and of a float dtype.
std::vector<std::size_t> grad_sources(const OpEntry& e, const std::vector<Ref>& ins) {
  std::vector<std::size_t> s;
  for (std::size_t i = 0; i < ins.size() && i < 32; ++i)
    if ((e.grad_inputs >> i & 1u) && sc::is_floating(ins[i].dtype)) s.push_back(i);
  return s;
}

/// One call of the traced function against the eager one: "" when exact or allowed, else why not.
std::string judge_forward(const OpEntry& e, const Case& c, const std::vector<Ref>& ins, const sc::Tensor& want,
                          const sc::Tensor& got, bool& exact, Tally& t) {
  const Diff d = diff(want, got);
  t.max_ulps = std::max(t.max_ulps, d.max_ulps);
  if (d.exact()) return "";
  exact = false;
  if (!d.meta.empty() || !inexact_forward.count(e.op)) return "traced != eager: " + d.str();
  const std::string err = compare(e.ref(ins, c.p), got, e.tol);
  return err.empty() ? "" : "traced != eager (" + d.str() + ") and outside the table's tolerance: " + err;
}

/// Forward: sc::function over the case's tensors (params captured), called twice, vs eager.
void check_forward(const OpEntry& e, const Case& c, std::size_t ci, const std::vector<Ref>& ins,
                   const std::string& name, Tally& t) {
  std::vector<Ref> ins2 = second_inputs(c, ci);
  const std::vector<sc::Tensor> ts = tensors_of(ins);
  std::vector<sc::Tensor> ts2 = tensors_of(ins2);
  sc::Tensor want, want2;
  try {
    want = e.call(ts, c.p);
  } catch (const std::exception&) {
    return;  // the eager table reports it
  }
  try {
    want2 = e.call(ts2, c.p);
  } catch (const std::exception&) {  // the new values are not valid for this op: reuse the first
    ins2 = ins, ts2 = tensors_of(ins), want2 = want;
  }
  ++t.cases;
  auto f = sc::function([&e, &c](const std::vector<sc::Tensor>& x) { return e.call(x, c.p); }, e.op);
  sc::Tensor got, again;
  try {
    got = f(ts);
    again = f(ts2);  // same signature: runs the plan again, no retrace
  } catch (const std::exception& ex) {
    ++t.failed;
    FAIL_CHECK(name << ": traced call threw: " << ex.what());
    return;
  }
  if (f.trace_count() != 1) FAIL_CHECK(name << ": traced " << f.trace_count() << " times for one signature");
  bool exact = true;
  const std::string e1 = judge_forward(e, c, ins, want, got, exact, t);
  const std::string e2 = judge_forward(e, c, ins2, want2, again, exact, t);
  if (e1.empty() && e2.empty()) {
    ++(exact ? t.exact : t.tolerance);
    return;
  }
  ++t.failed;
  if (!e1.empty()) FAIL_CHECK(name << ": " << e1);
  if (!e2.empty()) FAIL_CHECK(name << ": second call (new values): " << e2);
}

/// Gradient: d sum(op(x) * cot) / dx for each float input, by a tape inside sc::function vs eager.
void check_gradient(const OpEntry& e, const Case& c, std::size_t ci, const std::vector<Ref>& ins,
                    const std::string& name, Tally& t) {
  const std::vector<std::size_t> src = grad_sources(e, ins);
  if (src.empty()) return;
  const std::vector<sc::Tensor> ts = tensors_of(ins);
  std::vector<sc::Tensor> ts2 = tensors_of(second_inputs(c, ci));
  sc::Tensor y;
  try {
    y = e.call(ts, c.p);
  } catch (const std::exception&) {
    return;
  }
  if (!sc::is_floating(y.dtype())) return;
  // A fixed cotangent (captured: a constant in the traced graph), so every output element counts.
  const sc::Tensor cot = to_tensor(make_input({y.shape(), y.dtype(), Gen::normal, 0, {}}, 0xC07ull + 7919 * ci));
  auto grads = [&e, &c, &src, &cot](const std::vector<sc::Tensor>& x) {
    sc::GradientTape tape;
    std::vector<sc::Tensor> s;
    for (std::size_t i : src) s.push_back(x[i]);
    tape.watch(s);
    const sc::Tensor loss = sc::sum(e.call(x, c.p) * cot);
    return tape.gradient(loss, s);
  };
  std::vector<sc::Tensor> want, want2;
  try {
    want = grads(ts);
  } catch (const std::exception& ex) {
    FAIL_CHECK(name << ": eager gradient threw: " << ex.what());
    return;
  }
  try {
    want2 = grads(ts2);
  } catch (const std::exception&) {
    ts2 = ts, want2 = want;
  }
  ++t.grad_cases;
  auto f = sc::function(grads, e.op + "_grad");
  std::vector<sc::Tensor> got, again;
  try {
    got = f(ts);
    again = f(ts2);
  } catch (const std::exception& ex) {
    ++t.grad_failed;
    FAIL_CHECK(name << ": traced gradient threw: " << ex.what());
    return;
  }
  if (f.trace_count() != 1) FAIL_CHECK(name << ": gradient traced " << f.trace_count() << " times for one signature");
  if (got.size() != want.size() || again.size() != want.size()) {
    ++t.grad_failed;
    FAIL_CHECK(name << ": traced gradient has " << got.size() << " results, eager " << want.size());
    return;
  }
  bool exact = true, ok = true;
  for (std::size_t k = 0; k < want.size(); ++k)
    for (int call = 0; call < 2; ++call) {
      const Diff d = call == 0 ? diff(want[k], got[k]) : diff(want2[k], again[k]);
      t.grad_max_rel = std::max(t.grad_max_rel, d.rel());
      if (d.exact()) continue;
      exact = false;
      const double rtol = grad_rtol(ins[src[k]].dtype);
      if (d.meta.empty() && d.nonfinite == 0 && d.max_err <= rtol * d.scale) continue;
      ok = false;
      FAIL_CHECK(name << ": " << (call ? "second call (new values): " : "") << "gradient of input " << src[k]
                      << " traced != eager beyond " << rtol << " of its largest element: " << d.str());
    }
  t.grad_exact += exact;
  t.grad_failed += !ok;
}

void check_table_traced(const std::vector<OpEntry>& table, const char* table_name) {
  const bool summary = std::getenv("SC_CONFORMANCE_TRACED_SUMMARY") != nullptr;
  Tally all;
  for (const OpEntry& e : table) {
    INFO("op " << e.op << " via " << e.api << ": " << e.cases.size() << " cases, traced");
    Tally t;
    for (std::size_t ci = 0; ci < e.cases.size(); ++ci) {
      const std::vector<Ref> ins = case_inputs(e, ci);
      const std::string name = describe_case(e, e.cases[ci], ins);
      check_forward(e, e.cases[ci], ci, ins, name, t);
      check_gradient(e, e.cases[ci], ci, ins, name, t);
    }
    CHECK(t.cases > 0);
    if (summary)
      std::cout << "[traced] " << e.op << " via " << e.api << ": " << t.cases << " cases, " << t.exact << " exact, "
                << t.tolerance << " within tolerance (max " << t.max_ulps << " ulps), " << t.failed << " failed; "
                << t.grad_cases << " gradient cases, " << t.grad_exact << " exact (max |diff| " << t.grad_max_rel
                << " of the largest element), " << t.grad_failed << " failed\n";
    all.add(t);
  }
  if (summary)
    std::cout << "[traced] table " << table_name << ": " << table.size() << " entries, " << all.cases << " cases, "
              << all.exact << " exact, " << all.tolerance << " within tolerance (max " << all.max_ulps << " ulps), "
              << all.failed << " failed; " << all.grad_cases << " gradient cases, " << all.grad_exact
              << " exact (max |diff| " << all.grad_max_rel << " of the largest element), " << all.grad_failed
              << " failed\n";
}

// ---- errors ---------------------------------------------------------------------------------

/// A call that must fail the same way traced as eager.
struct ErrorCase {
  const char* what;
  std::vector<In> in;
  Params p;
  CallFn call;
  bool at_trace = true;  ///< raised by infer() while tracing; false: by the kernel when the plan runs
  const char* says = "";  ///< at run time: what both messages start with (the rest differs in detail)
};

/// The most derived sc::Error kind of a thrown exception.
std::string kind_of(const std::exception_ptr& ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const sc::ShapeError&) {
    return "ShapeError";
  } catch (const sc::DTypeError&) {
    return "DTypeError";
  } catch (const sc::ValueError&) {
    return "ValueError";
  } catch (const sc::StagingError&) {
    return "StagingError";
  } catch (const sc::DeviceError&) {
    return "DeviceError";
  } catch (const sc::IOError&) {
    return "IOError";
  } catch (const sc::Error&) {
    return "Error";
  } catch (const std::exception&) {
    return "std::exception";
  }
}

/// The kind and message of what f throws ("" when it throws nothing).
template <class F>
std::pair<std::string, std::string> thrown(F&& f) {
  try {
    f();
  } catch (const std::exception& ex) {
    return {kind_of(std::current_exception()), ex.what()};
  }
  return {"", ""};
}

Params ints_p(std::vector<std::int64_t> a, std::vector<std::int64_t> b = {}) {
  Params p;
  p.ints = std::move(a);
  p.ints2 = std::move(b);
  return p;
}
Params axis_p(std::int64_t axis) {
  Params p;
  p.axis = axis;
  return p;
}
Params pool_p(std::int64_t k, std::int64_t stride, std::int64_t pad = 0) {
  Params p;
  p.k = k;
  p.stride = stride;
  p.pad = pad;
  return p;
}
In f32(sc::Shape s) { return {std::move(s), sc::f32, Gen::normal, 0, {}}; }
In b8(sc::Shape s) { return {std::move(s), sc::boolean, Gen::normal, 0, {}}; }
In idx(sc::Shape s, std::vector<double> v) { return {std::move(s), sc::i64, Gen::normal, 0, std::move(v)}; }

std::vector<ErrorCase> error_cases() {
  return {
      {"bool + bool", {b8({3}), b8({3})}, {}, SC_CALL(x[0] + x[1])},
      {"sc::mul of bools", {b8({2, 3}), b8({3})}, {}, SC_CALL(sc::mul(x[0], x[1]))},
      {"neg of bool", {b8({4})}, {}, SC_CALL(sc::neg(x[0]))},
      {"abs of bool", {b8({4})}, {}, SC_CALL(sc::abs(x[0]))},
      {"add: shapes do not broadcast", {f32({3, 4}), f32({5})}, {}, SC_CALL(x[0] + x[1])},
      {"where: shapes do not broadcast", {b8({3}), f32({4}), f32({})}, {}, SC_CALL(sc::where(x[0], x[1], x[2]))},
      {"matmul [4] x [3, 4]", {f32({4}), f32({3, 4})}, {}, SC_CALL(sc::matmul(x[0], x[1]))},
      {"matmul inner extents", {f32({2, 3}), f32({4, 5})}, {}, SC_CALL(sc::matmul(x[0], x[1]))},
      {"matmul batch extents", {f32({2, 3, 4}), f32({3, 4, 5})}, {}, SC_CALL(sc::matmul(x[0], x[1]))},
      {"reshape to another size", {f32({3, 4})}, ints_p({5}), SC_CALL(sc::reshape(x[0], sc::Shape(p.ints)))},
      {"reshape with two -1", {f32({3, 4})}, ints_p({-1, -1}), SC_CALL(sc::reshape(x[0], sc::Shape(p.ints)))},
      {"transpose: repeated axis", {f32({3, 4})}, ints_p({0, 0}), SC_CALL(sc::transpose(x[0], p.ints))},
      {"transpose: perm of the wrong length", {f32({3, 4})}, ints_p({0, 1, 2}), SC_CALL(sc::transpose(x[0], p.ints))},
      {"broadcast_to an incompatible shape", {f32({3})}, ints_p({4, 2}),
       SC_CALL(sc::broadcast_to(x[0], sc::Shape(p.ints)))},
      {"concat: other extents differ", {f32({2, 3}), f32({2, 4})}, axis_p(0), SC_CALL(sc::concat(x, p.axis))},
      {"concat: axis out of range", {f32({2, 3}), f32({2, 3})}, axis_p(2), SC_CALL(sc::concat(x, p.axis))},
      {"concat: ranks differ", {f32({2, 3}), f32({3})}, axis_p(0), SC_CALL(sc::concat(x, p.axis))},
      {"stack: shapes differ", {f32({3}), f32({4})}, axis_p(0), SC_CALL(sc::stack(x, p.axis))},
      {"slice past the end", {f32({5, 6})}, ints_p({4, 0}, {3, 1}), SC_CALL(sc::slice(x[0], p.ints, p.ints2))},
      {"slice: begin of the wrong rank", {f32({5, 6})}, ints_p({1}, {1}), SC_CALL(sc::slice(x[0], p.ints, p.ints2))},
      {"sum: axis out of range", {f32({3, 4})}, ints_p({2}), SC_CALL(sc::sum(x[0], p.ints))},
      {"max: axis repeated", {f32({3, 4})}, ints_p({1, -1}), SC_CALL(sc::max(x[0], p.ints))},
      {"max over an empty axis", {f32({0, 3})}, ints_p({0}), SC_CALL(sc::max(x[0], p.ints))},
      {"mean: axis out of range", {f32({3, 4})}, ints_p({-3}), SC_CALL(sc::mean(x[0], p.ints))},
      {"argmax: axis out of range", {f32({3, 4})}, axis_p(2), SC_CALL(sc::argmax(x[0], p.axis))},
      {"argmin over an empty axis", {f32({0, 3})}, axis_p(0), SC_CALL(sc::argmin(x[0], p.axis))},
      {"logsumexp: axis out of range", {f32({3, 4})}, ints_p({5}), SC_CALL(sc::logsumexp(x[0], p.ints))},
      {"gather with float indices", {f32({5, 3}), f32({2})}, axis_p(0), SC_CALL(sc::gather(x[0], x[1], p.axis))},
      {"gather from rank 0", {f32({}), idx({1}, {0})}, axis_p(0), SC_CALL(sc::gather(x[0], x[1], p.axis))},
      {"gather: axis out of range", {f32({5, 3}), idx({2}, {0, 1})}, axis_p(2),
       SC_CALL(sc::gather(x[0], x[1], p.axis))},
      {"scatter_add: updates of the wrong shape", {f32({5, 3}), idx({2}, {0, 1}), f32({3, 3})}, axis_p(0),
       SC_CALL(sc::scatter_add(x[0], x[1], x[2], p.axis))},
      {"scatter_add: updates of another dtype", {f32({5, 3}), idx({2}, {0, 1}), idx({2, 3}, {1})}, axis_p(0),
       SC_CALL(sc::scatter_add(x[0], x[1], x[2], p.axis))},
      {"take_along_axis: indices of another rank", {f32({5, 3}), idx({2}, {0, 1})}, axis_p(0),
       SC_CALL(sc::take_along_axis(x[0], x[1], p.axis))},
      {"take_along_axis: float indices", {f32({5, 3}), f32({2, 3})}, axis_p(0),
       SC_CALL(sc::take_along_axis(x[0], x[1], p.axis))},
      {"add_along_axis: updates of the wrong shape", {f32({5, 3}), idx({2, 3}, {0, 1}), f32({3, 3})}, axis_p(0),
       SC_CALL(sc::add_along_axis(x[0], x[1], x[2], p.axis))},
      {"add_along_axis: indices that differ off the axis", {f32({5, 3}), idx({2, 2}, {0, 1}), f32({2, 2})}, axis_p(0),
       SC_CALL(sc::add_along_axis(x[0], x[1], x[2], p.axis))},
      {"one_hot of float indices", {f32({3})}, pool_p(4, 1), SC_CALL(sc::one_hot(x[0], p.k))},
      {"one_hot of negative depth", {idx({3}, {0, 1, 2})}, pool_p(-1, 1), SC_CALL(sc::one_hot(x[0], p.k))},
      {"conv2d: channels differ", {f32({1, 2, 5, 5}), f32({3, 3, 3, 3})}, pool_p(0, 1),
       SC_CALL(sc::nn::conv2d(x[0], x[1], p.stride, p.pad))},
      {"conv2d: kernel larger than the input", {f32({1, 1, 2, 2}), f32({1, 1, 3, 3})}, pool_p(0, 1),
       SC_CALL(sc::nn::conv2d(x[0], x[1], p.stride, p.pad))},
      {"conv2d: rank-3 input", {f32({1, 5, 5}), f32({1, 1, 3, 3})}, pool_p(0, 1),
       SC_CALL(sc::nn::conv2d(x[0], x[1], p.stride, p.pad))},
      {"conv2d: stride 0", {f32({1, 1, 5, 5}), f32({1, 1, 3, 3})}, pool_p(0, 0),
       SC_CALL(sc::nn::conv2d(x[0], x[1], p.stride, p.pad))},
      {"im2col of a rank-3 tensor", {f32({1, 5, 5})}, ints_p({3, 3}),
       SC_CALL(sc::im2col(x[0], p.ints[0], p.ints[1], p.stride, p.pad))},
      {"max_pool2d: kernel larger than the input", {f32({1, 1, 2, 2})}, pool_p(3, 1),
       SC_CALL(sc::nn::max_pool2d(x[0], p.k, p.stride))},
      {"avg_pool2d of a rank-2 tensor", {f32({4, 4})}, pool_p(2, 2), SC_CALL(sc::nn::avg_pool2d(x[0], p.k, p.stride))},
      {"softmax: axis out of range", {f32({3, 4})}, axis_p(2), SC_CALL(sc::nn::softmax(x[0], p.axis))},
      {"log_softmax: axis out of range", {f32({3, 4})}, axis_p(-3), SC_CALL(sc::nn::log_softmax(x[0], p.axis))},
      {"cross_entropy: float labels", {f32({4, 5}), f32({4})}, {}, SC_CALL(sc::nn::cross_entropy(x[0], x[1]))},
      {"cross_entropy: label count differs", {f32({4, 5}), idx({3}, {0})}, {},
       SC_CALL(sc::nn::cross_entropy(x[0], x[1]))},
      {"squeeze: axis of extent 3", {f32({1, 3})}, ints_p({1}), SC_CALL(sc::squeeze(x[0], p.ints))},
      {"expand_dims: axis out of range", {f32({3, 4})}, axis_p(4), SC_CALL(sc::expand_dims(x[0], p.axis))},
      // Data-dependent: only the plan's kernel sees the index values.
      {"gather: index out of range", {f32({5, 3}), idx({2}, {1, 5})}, axis_p(0),
       SC_CALL(sc::gather(x[0], x[1], p.axis)), false, "[gather] index 5 is out of range for"},
      {"gather: negative index out of range", {f32({5, 3}), idx({2}, {-6, 0})}, axis_p(1),
       SC_CALL(sc::gather(x[0], x[1], p.axis)), false, "[gather] index -6 is out of range for"},
      {"scatter_add: index out of range", {f32({5, 3}), idx({2}, {0, 7}), f32({2, 3})}, axis_p(0),
       SC_CALL(sc::scatter_add(x[0], x[1], x[2], p.axis)), false, "[scatter_add] index 7 is out of range for"},
  };
}

}  // namespace
}  // namespace conf

TEST_CASE("conformance traced: elementwise table", "[conformance][traced]") {
  conf::check_table_traced(conf::elementwise_table(), "elementwise");
}
TEST_CASE("conformance traced: reduce table", "[conformance][traced]") {
  conf::check_table_traced(conf::reduce_table(), "reduce");
}
TEST_CASE("conformance traced: layout table", "[conformance][traced]") {
  conf::check_table_traced(conf::layout_table(), "layout");
}
TEST_CASE("conformance traced: nn table", "[conformance][traced]") { conf::check_table_traced(conf::nn_table(), "nn"); }
TEST_CASE("conformance traced: creation table", "[conformance][traced]") {
  conf::check_table_traced(conf::creation_table(), "creation");
}

TEST_CASE("conformance traced: errors are raised with the eager kind and message", "[conformance][traced][errors]") {
  std::uint64_t seed = 1;
  for (const conf::ErrorCase& ec : conf::error_cases()) {
    INFO(ec.what);
    std::vector<sc::Tensor> ts;
    for (const conf::In& in : ec.in) ts.push_back(conf::to_tensor(conf::make_input(in, seed++)));
    const conf::Params p = ec.p;
    const auto [kind, msg] = conf::thrown([&] { (void)ec.call(ts, p); });
    INFO("eager: " << kind << ": " << msg);
    REQUIRE(!kind.empty());
    CHECK(kind != "std::exception");
    auto f = sc::function([&ec, &p](const std::vector<sc::Tensor>& x) { return ec.call(x, p); });
    const auto [tkind, tmsg] = conf::thrown([&] { (void)f.get_concrete(ts); });
    if (ec.at_trace) {
      INFO("traced, at trace time: " << tkind << ": " << tmsg);
      CHECK(tkind == kind);
      CHECK(tmsg == msg);
      CHECK(f.trace_count() == 0);
    } else {
      INFO("traced, at trace time: " << tkind << ": " << tmsg);
      REQUIRE(tkind.empty());  // the values are not known while tracing
      const auto [rkind, rmsg] = conf::thrown([&] { (void)f(ts); });
      INFO("traced, at run time: " << rkind << ": " << rmsg);
      CHECK(rkind == kind);
      CHECK_THAT(msg, Catch::StartsWith(ec.says));
      // The kernel raises it in both stages: eager dispatch adds the user's line, and the plan the
      // same line with what it was doing.
      CHECK(rmsg == msg + " (while running a staged function)");
      // The failed run leaves the function usable: in-range indices (all 0) of the same signature.
      std::vector<sc::Tensor> ok = ts;
      ok[1] = sc::zeros(ts[1].shape(), ts[1].dtype());
      const conf::Ref want = conf::from_tensor(ec.call(ok, p));
      CHECK(conf::compare(want, f(ok), conf::Tol{0}) == "");
      CHECK(f.trace_count() == 1);
    }
  }
}
