// Conformance framework: deterministic inputs per dtype, tensor <-> Ref, comparison, the runner.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <sstream>

#include "conformance.hpp"

namespace conf {

namespace {

// splitmix64: a tiny, well-mixed hash, so element i's value depends only on (seed, i).
std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Uniform in [lo, hi] on a grid of 1/1024, so f32 and f64 hold the same value exactly.
double grid(std::uint64_t h, double lo, double hi) {
  const double steps = (hi - lo) * 1024.0;
  return lo + static_cast<double>((h >> 11) % static_cast<std::uint64_t>(steps + 1)) / 1024.0;
}
std::int64_t int_in(std::uint64_t h, std::int64_t lo, std::int64_t hi) {
  return lo + static_cast<std::int64_t>((h >> 7) % static_cast<std::uint64_t>(hi - lo + 1));
}

double float_value(Gen g, DType d, std::uint64_t h) {
  const unsigned r = static_cast<unsigned>(h % 16);
  const bool is32 = d == sc::f32;
  // A few exact values every generator shares, so small tensors hold zeros and negatives.
  static const double common[4] = {0.0, -1.0, 1.0, -0.5};
  switch (g) {
    case Gen::positive: return grid(h, 1.0 / 16, 8.0);
    case Gen::large: return (r % 2 ? -1e4 : 1e4) + grid(h, -4, 4);
    case Gen::wide: {
      const double big = is32 ? 1e30 : 1e300, tiny = is32 ? 1e-30 : 1e-300;
      const double sign = (h >> 5) & 1 ? -1.0 : 1.0;
      if (r < 4) return common[r];
      if (r < 8) return sign * big * grid(h, 1, 3);
      if (r < 10) return sign * tiny * grid(h, 1, 3);
      return grid(h, -1000, 1000);
    }
    case Gen::special: {
      static const double sp[6] = {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                                   -std::numeric_limits<double>::infinity(), 0.0, -0.0, 2.5};
      if (r < 6) return sp[r];
      return grid(h, -4, 4);
    }
    case Gen::normal:
    case Gen::small:
    case Gen::index: break;
  }
  if (r < 4) return common[r];
  return grid(h, -4, 4);
}

std::int64_t int_value(Gen g, DType d, std::uint64_t h, std::int64_t hi) {
  switch (g) {
    case Gen::index: return int_in(h, 0, hi - 1);
    case Gen::positive: return int_in(h, 1, 20);
    case Gen::small: return int_in(h, -3, 4);
    case Gen::wide: {
      // Big enough to leave i32 (for i64) yet so that sums and products do not overflow.
      const std::int64_t m = d == sc::i32 ? 30000 : 3000000000;
      return h % 8 == 0 ? 0 : int_in(h, -m, m);
    }
    default: return h % 8 == 0 ? 0 : int_in(h, -20, 20);
  }
}

std::string fmt(double v) {
  std::ostringstream os;
  os << std::setprecision(17) << v;
  return os.str();
}

std::string case_header(const OpEntry& e, const Case& c, const std::vector<Ref>& ins) {
  std::ostringstream os;
  os << "op '" << e.op << "' via " << e.api;
  if (!c.note.empty()) os << " [" << c.note << "]";
  os << ", inputs (";
  for (std::size_t i = 0; i < ins.size(); ++i) os << (i ? ", " : "") << sc::name(ins[i].dtype) << str(ins[i].shape);
  os << ")";
  return os.str();
}

}  // namespace

Ref make_input(const In& in, std::uint64_t seed) {
  Ref r = make_ref(Dims(in.shape.begin(), in.shape.end()), in.dtype);
  for (std::int64_t i = 0; i < r.numel(); ++i) {
    const std::uint64_t h = mix(seed ^ mix(static_cast<std::uint64_t>(i)));
    if (!in.values.empty()) r.v[i] = round_to(in.values[static_cast<std::size_t>(i) % in.values.size()], in.dtype);
    else if (sc::is_floating(in.dtype)) r.v[i] = round_to(float_value(in.gen, in.dtype, h), in.dtype);
    else if (sc::is_integral(in.dtype)) r.v[i] = static_cast<double>(int_value(in.gen, in.dtype, h, in.hi));
    else r.v[i] = h % 3 != 0 ? 1.0 : 0.0;
  }
  return r;
}

sc::Tensor to_tensor(const Ref& r) {
  // On the host whatever DeviceScope is active (a CUDA == CPU pass moves it with .to()).
  sc::Tensor t = sc::detail::empty_tensor(sc::Shape(r.shape), r.dtype, sc::Device::cpu());
  sc::visit_dtype(r.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = static_cast<T*>(t.raw_data());
    for (std::int64_t i = 0; i < r.numel(); ++i) p[i] = static_cast<T>(r.v[i]);
  });
  return t;
}

Ref from_tensor(const sc::Tensor& t) {
  Ref r;
  r.shape = t.shape().vec();
  r.dtype = t.dtype();
  r.v = t.to_vector<double>();
  return r;
}

std::string compare(const Ref& want, const sc::Tensor& got_t, Tol tol) {
  std::ostringstream os;
  if (!got_t.defined()) return "result is an undefined tensor";
  const Ref got = from_tensor(got_t);
  if (got.dtype != want.dtype)
    os << "dtype: got " << sc::name(got.dtype) << ", want " << sc::name(want.dtype) << "; ";
  if (got.shape != want.shape) os << "shape: got " << str(got.shape) << ", want " << str(want.shape) << "; ";
  if (!os.str().empty()) return os.str();
  const bool is_float = sc::is_floating(want.dtype);
  const double eps = want.dtype == sc::f32 ? std::numeric_limits<float>::epsilon() : std::numeric_limits<double>::epsilon();
  const double tiny = want.dtype == sc::f32 ? std::numeric_limits<float>::min() : std::numeric_limits<double>::min();
  std::int64_t bad = 0, first = -1;
  double first_bound = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const double w = round_to(want.v[i], want.dtype), g = got.v[i];
    bool ok;
    double bound = 0;
    if (!is_float) ok = g == w;
    else if (std::isnan(w)) ok = std::isnan(g);
    else if (std::isinf(w) || std::isinf(g) || std::isnan(g)) ok = g == w;
    else {
      const double s = want.scale.empty() ? 0.0 : want.scale[i];
      bound = tol.ulps * eps * std::max(std::fabs(w), s) + tol.ulps * tiny;
      ok = std::fabs(g - w) <= bound;
    }
    if (!ok && bad++ == 0) {
      first = i;
      first_bound = bound;
    }
  }
  if (!bad) return "";
  const double w = round_to(want.v[first], want.dtype), g = got.v[first];
  os << "out " << sc::name(want.dtype) << str(want.shape) << ": first mismatch at " << str(unravel(first, want.shape))
     << " (flat " << first << "): got " << fmt(g) << ", want " << fmt(w);
  if (is_float && std::isfinite(w) && std::isfinite(g))
    os << " (|diff| " << fmt(std::fabs(g - w)) << " > bound " << fmt(first_bound) << " = " << tol.ulps << " ulps)";
  os << "; " << bad << " of " << want.numel() << " elements differ";
  return os.str();
}

std::vector<Ref> case_inputs(const OpEntry& e, std::size_t ci) {
  std::uint64_t op_seed = 1469598103934665603ull;  // FNV-1a of the op name: stable across platforms
  for (char ch : e.op) op_seed = (op_seed ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  std::vector<Ref> ins;
  const Case& c = e.cases[ci];
  for (std::size_t ii = 0; ii < c.in.size(); ++ii) ins.push_back(make_input(c.in[ii], mix(op_seed + 1000 * ci + ii)));
  return ins;
}

std::string describe_case(const OpEntry& e, const Case& c, const std::vector<Ref>& ins) {
  return case_header(e, c, ins);
}

std::vector<std::string> run_entry(const OpEntry& e) {
  std::vector<std::string> errors;
  for (std::size_t ci = 0; ci < e.cases.size(); ++ci) {
    const Case& c = e.cases[ci];
    const std::vector<Ref> ins = case_inputs(e, ci);
    std::vector<sc::Tensor> ts;
    for (const Ref& r : ins) ts.push_back(to_tensor(r));
    std::string err;
    try {
      const Ref want = e.ref(ins, c.p);
      err = compare(want, e.call(ts, c.p), e.tol);
    } catch (const std::exception& ex) {
      err = std::string("threw: ") + ex.what();
    }
    if (!err.empty()) errors.push_back(case_header(e, c, ins) + ": " + err);
  }
  return errors;
}

void check_table(const std::vector<OpEntry>& table) {
  for (const OpEntry& e : table) {
    INFO("op " << e.op << " via " << e.api << ": " << e.cases.size() << " cases");
    CHECK(!e.cases.empty());
    for (const std::string& msg : run_entry(e)) FAIL_CHECK(msg);
  }
}

std::vector<Case> cases(const std::vector<DType>& dtypes, const std::vector<std::vector<sc::Shape>>& shapes, Gen gen,
                        Params p, const std::string& note) {
  std::vector<Case> out;
  for (DType d : dtypes)
    for (const auto& set : shapes) {
      Case c;
      for (const sc::Shape& s : set) c.in.push_back({s, d, gen, 0, {}});
      c.p = p;
      c.note = note;
      out.push_back(c);
    }
  return out;
}

void append(std::vector<Case>& a, const std::vector<Case>& b) { a.insert(a.end(), b.begin(), b.end()); }

}  // namespace conf
