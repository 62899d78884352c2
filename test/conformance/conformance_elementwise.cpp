// Conformance table of the elementwise ops: unary, binary (functions, operators, C++ scalar
// forms), where and cast, over broadcasting patterns, dtypes and NaN/inf/large edge values.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "conformance.hpp"

namespace conf {
namespace {

#define SC_CALL(expr) \
  [](const std::vector<sc::Tensor>& x, const Params& p) -> sc::Tensor { (void)x; (void)p; return expr; }

const double nan_v = std::numeric_limits<double>::quiet_NaN();

// ---- unary --------------------------------------------------------------------------------

/// floating: ints/bool computed as f32; numeric: bool rejected, dtype kept; predicate: bool out.
enum class UK { floating, numeric, predicate };

struct UnarySpec {
  const char* op;
  const char* api;
  CallFn call;
  Fn1 f;
  UK kind;
  Tol tol;
  std::vector<Gen> gens;  // value generators to run (besides normal); special is floats only
};

const std::vector<std::vector<sc::Shape>> unary_shapes = {
    {{}}, {{0}}, {{1}}, {{3, 4}}, {{2, 0, 3}}, {{2, 3, 1, 5}}, {{37}}};

OpEntry unary_entry(const UnarySpec& u) {
  const UK kind = u.kind;
  const Fn1 f = u.f;
  RefFn ref = [kind, f](const std::vector<Ref>& in, const Params&) {
    const DType d = in[0].dtype;
    if (kind == UK::predicate) return map1(in[0], DType::b8, f);
    const DType out = kind == UK::floating ? float_of(d) : d;
    // The op computes in `out`: an int input is converted to it first.
    return map1(in[0], out, [&](double v) { return f(round_to(v, out)); });
  };
  OpEntry e{u.op, u.api, u.call, ref, u.tol, {}, kind == UK::predicate ? 0u : 1u};
  const std::vector<DType>& dts = kind == UK::numeric ? numeric : all_dtypes;
  append(e.cases, cases(dts, unary_shapes, Gen::normal));
  append(e.cases, cases({sc::f32}, {{{300, 257}}}, Gen::normal, {}, "large: SIMD tail and threads"));
  for (Gen g : u.gens) {
    const bool floats_only = g == Gen::special;
    append(e.cases, cases(floats_only ? floats : (kind == UK::numeric ? numeric : floats), {{{5, 7}}, {{}}}, g));
  }
  return e;
}

std::vector<OpEntry> unary_entries() {
  const std::vector<Gen> all{Gen::wide, Gen::special};
  const std::vector<UnarySpec> specs = {
      {"neg", "sc::neg", SC_CALL(sc::neg(x[0])), [](double v) { return -v; }, UK::numeric, exact_rounding, all},
      {"neg", "unary operator-", SC_CALL(-x[0]), [](double v) { return -v; }, UK::numeric, exact_rounding, {}},
      {"abs", "sc::abs", SC_CALL(sc::abs(x[0])), [](double v) { return std::fabs(v); }, UK::numeric, exact_rounding, all},
      {"square", "sc::square", SC_CALL(sc::square(x[0])), [](double v) { return v * v; }, UK::numeric, exact_rounding, all},
      {"relu", "sc::relu", SC_CALL(sc::relu(x[0])), [](double v) { return std::isnan(v) ? v : (v < 0 ? 0.0 : v); },
       UK::numeric, exact_rounding, all},
      {"sign", "sc::sign", SC_CALL(sc::sign(x[0])),
       [](double v) { return std::isnan(v) ? v : (v > 0 ? 1.0 : (v < 0 ? -1.0 : 0.0)); }, UK::numeric, exact_rounding, all},
      {"exp", "sc::exp", SC_CALL(sc::exp(x[0])), [](double v) { return std::exp(v); }, UK::floating, transcendental, all},
      {"log", "sc::log", SC_CALL(sc::log(x[0])), [](double v) { return std::log(v); }, UK::floating, transcendental,
       {Gen::positive, Gen::wide, Gen::special}},
      {"sqrt", "sc::sqrt", SC_CALL(sc::sqrt(x[0])), [](double v) { return std::sqrt(v); }, UK::floating, exact_rounding,
       {Gen::positive, Gen::wide, Gen::special}},
      {"tanh", "sc::tanh", SC_CALL(sc::tanh(x[0])), [](double v) { return std::tanh(v); }, UK::floating, transcendental, all},
      {"sigmoid", "sc::sigmoid", SC_CALL(sc::sigmoid(x[0])), [](double v) { return 1.0 / (1.0 + std::exp(-v)); },
       UK::floating, transcendental, all},
      // sin/cos: no huge arguments (argument reduction at 1e30 is not a contract here).
      {"sin", "sc::sin", SC_CALL(sc::sin(x[0])), [](double v) { return std::sin(v); }, UK::floating, transcendental,
       {Gen::special}},
      {"cos", "sc::cos", SC_CALL(sc::cos(x[0])), [](double v) { return std::cos(v); }, UK::floating, transcendental,
       {Gen::special}},
      {"log1p", "sc::log1p", SC_CALL(sc::log1p(x[0])), [](double v) { return std::log1p(v); }, UK::floating,
       transcendental, all},
      {"expm1", "sc::expm1", SC_CALL(sc::expm1(x[0])), [](double v) { return std::expm1(v); }, UK::floating,
       transcendental, all},
      {"erf", "sc::erf", SC_CALL(sc::erf(x[0])), [](double v) { return std::erf(v); }, UK::floating, transcendental, all},
      {"floor", "sc::floor", SC_CALL(sc::floor(x[0])), [](double v) { return std::floor(v); }, UK::numeric,
       exact_rounding, all},
      {"ceil", "sc::ceil", SC_CALL(sc::ceil(x[0])), [](double v) { return std::ceil(v); }, UK::numeric, exact_rounding,
       all},
      {"round", "sc::round", SC_CALL(sc::round(x[0])), [](double v) { return std::nearbyint(v); }, UK::numeric,
       exact_rounding, all},
      {"logical_not", "sc::logical_not", SC_CALL(sc::logical_not(x[0])), [](double v) { return v == 0 ? 1.0 : 0.0; },
       UK::predicate, exact_rounding, all},
      // operator! is not reachable: `!tensor` is ambiguous (see conformance_dtypes.cpp, library bug).
  };
  std::vector<OpEntry> out;
  for (const auto& s : specs) out.push_back(unary_entry(s));
  return out;
}

// ---- binary -------------------------------------------------------------------------------

/// arithmetic: numeric common dtype; floating: ints as f32; compare/logical: bool out.
enum class BK { arithmetic, floating, compare, logical };

struct BinarySpec {
  const char* op;
  const char* api;
  CallFn call;
  Fn2 f;
  BK kind;
  Tol tol;
  bool full = true;  // false: an alias form (operator), run on fewer cases
};

/// The dtype a binary op computes in, by our own tables.
DType binary_compute_dtype(BK k, DType a, DType b) {
  const DType d = promote2(a, b);
  return k == BK::floating ? float_of(d) : d;
}

RefFn binary_ref(BK kind, Fn2 f) {
  return [kind, f](const std::vector<Ref>& in, const Params&) {
    const DType d = binary_compute_dtype(kind, in[0].dtype, in[1].dtype);
    const bool to_bool = kind == BK::compare || kind == BK::logical;
    return map2(in[0], in[1], d, to_bool ? DType::b8 : d, f);
  };
}

// Same shape, [N,C]+[C], [N,1]+[1,C], rank 0 either side, rank-4 mixed, size-1 and empty.
const std::vector<std::vector<sc::Shape>> binary_shapes = {
    {{3, 4}, {3, 4}}, {{4, 5}, {5}},          {{4, 1}, {1, 5}}, {{}, {3, 4}}, {{3, 4}, {}},
    {{}, {}},         {{2, 1, 4, 1}, {3, 1, 5}}, {{1}, {1}},       {{5}, {1}},   {{1, 1, 3}, {2, 1}},
    {{0, 3}, {3}},    {{0}, {}},              {{2, 0}, {2, 1}}};
const std::vector<std::vector<sc::Shape>> few_shapes = {{{3, 4}, {3, 4}}, {{4, 5}, {5}}, {{}, {3, 4}}, {{2, 1, 4, 1}, {3, 1, 5}}};

std::vector<Case> mixed_dtype_cases(BK kind) {
  std::vector<std::pair<DType, DType>> pairs = {{sc::f32, sc::f64}, {sc::i32, sc::f32}, {sc::i64, sc::i32},
                                                {sc::i64, sc::f64}, {sc::boolean, sc::i32}, {sc::f64, sc::boolean}};
  if (kind != BK::arithmetic) pairs.push_back({sc::boolean, sc::boolean});
  std::vector<Case> out;
  for (auto [a, b] : pairs) out.push_back({{{{4, 5}, a}, {{5}, b}}, {}, "mixed dtypes"});
  return out;
}

OpEntry binary_entry(const BinarySpec& s) {
  const bool to_bool = s.kind == BK::compare || s.kind == BK::logical;
  OpEntry e{s.op, s.api, s.call, binary_ref(s.kind, s.f), s.tol, {}, to_bool ? 0u : 3u};
  const std::vector<DType>& dts = s.kind == BK::arithmetic ? numeric : all_dtypes;
  if (!s.full) {
    append(e.cases, cases(dts, few_shapes));
    return e;
  }
  append(e.cases, cases(dts, binary_shapes));
  append(e.cases, mixed_dtype_cases(s.kind));
  append(e.cases, cases({sc::f32, sc::i32}, {{{300, 257}, {300, 1}}, {{257}, {300, 257}}}, Gen::normal, {},
                        "large: SIMD tail and threads"));
  append(e.cases, cases(numeric, {{{5, 7}, {5, 7}}, {{5, 7}, {7}}}, Gen::wide));
  append(e.cases, cases(floats, {{{6, 6}, {6, 6}}, {{6, 1}, {1, 6}}}, Gen::special));
  return e;
}

double fmax_nan(double a, double b) { return std::isnan(a) || std::isnan(b) ? nan_v : std::max(a, b); }
double fmin_nan(double a, double b) { return std::isnan(a) || std::isnan(b) ? nan_v : std::min(a, b); }
double truth(double v) { return v != 0 ? 1.0 : 0.0; }

/// Python's a // b on floats, from the definition: the floor of the exact quotient (long double
/// holds an f32 or f64 quotient's integer part well enough for these inputs); b == 0 gives a / b
/// (NumPy's), a NaN or an infinite a NaN; an infinite b: 0 or -1 by the signs; a zero quotient
/// signed as a / b.
double py_floor_div(double a, double b) {
  if (b == 0) return a / b;
  if (std::isnan(a) || std::isnan(b) || std::isinf(a)) return nan_v;
  if (std::isinf(b)) return a == 0 || (a < 0) == (b < 0) ? std::copysign(0.0, a / b) : -1.0;
  const long double q = std::floor(static_cast<long double>(a) / static_cast<long double>(b));
  return q == 0 ? std::copysign(0.0, a / b) : static_cast<double>(q);
}
/// Python's a % b on floats: the exact remainder of the truncated quotient (fmod, exact in IEEE
/// arithmetic) moved into b's sign; a zero takes b's sign; b == 0, a NaN or an infinite a give NaN.
double py_mod(double a, double b) {
  if (std::isnan(a) || std::isnan(b) || std::isinf(a) || b == 0) return nan_v;
  if (std::isinf(b)) return a == 0 ? std::copysign(0.0, b) : ((a < 0) == (b < 0) ? a : b);
  const double r = std::fmod(a, b);
  if (r == 0) return std::copysign(0.0, b);
  return (r < 0) != (b < 0) ? r + b : r;
}
/// The integer forms: quotient floored, remainder with b's sign; a zero divisor gives 0.
double int_floor_div(double a, double b) {
  return b == 0 ? 0.0 : static_cast<double>(std::floor(static_cast<long double>(a) / static_cast<long double>(b)));
}
double int_mod(double a, double b) { return b == 0 ? 0.0 : a - b * int_floor_div(a, b); }

/// floor_div or mod in the common dtype, by the float or the integer definition.
RefFn division_ref(Fn2 on_floats, Fn2 on_ints) {
  return [=](const std::vector<Ref>& in, const Params&) {
    const DType d = binary_compute_dtype(BK::arithmetic, in[0].dtype, in[1].dtype);
    return map2(in[0], in[1], d, d, sc::is_floating(d) ? on_floats : on_ints);
  };
}

/// pow on the op's documented integer rule (repeated squaring; b < 0 gives 0 unless |a| = 1).
double int_pow(double a, double b) {
  if (b < 0) return a == 1 ? 1.0 : (a == -1 ? (std::fmod(b, 2) != 0 ? -1.0 : 1.0) : 0.0);
  double r = 1;
  for (int i = 0; i < static_cast<int>(b); ++i) r *= a;
  return r;
}

/// pow in the common dtype. Tolerance scale |a^b| * (1 + |b ln a|): the kernel computes
/// exp(b * log a) (xsimd), whose rounding of b * log a becomes relative error of the result.
Ref pow_reference(const Ref& a, const Ref& b) {
  const DType d = promote2(a.dtype, b.dtype);
  if (!sc::is_floating(d)) return map2(a, b, d, d, int_pow);
  Ref y = map2(a, b, d, d, [](double x, double e) { return std::pow(x, e); });
  y.scale = map2(a, b, d, DType::f64, [](double x, double e) {
              const double s = std::fabs(std::pow(x, e)) * (1 + std::fabs(e * std::log(std::fabs(x))));
              return std::isfinite(s) ? s : 0.0;
            }).v;
  return y;
}

std::vector<OpEntry> binary_entries() {
  auto add = [](double a, double b) { return a + b; };
  auto sub = [](double a, double b) { return a - b; };
  auto mul = [](double a, double b) { return a * b; };
  auto div = [](double a, double b) { return a / b; };
  auto lt = [](double a, double b) { return a < b ? 1.0 : 0.0; };
  auto le = [](double a, double b) { return a <= b ? 1.0 : 0.0; };
  auto gt = [](double a, double b) { return a > b ? 1.0 : 0.0; };
  auto ge = [](double a, double b) { return a >= b ? 1.0 : 0.0; };
  auto eq = [](double a, double b) { return a == b ? 1.0 : 0.0; };
  auto ne = [](double a, double b) { return a != b ? 1.0 : 0.0; };
  auto land = [](double a, double b) { return truth(a) * truth(b); };
  auto lor = [](double a, double b) { return std::max(truth(a), truth(b)); };
  auto relu_grad = [](double g, double x) { return x > 0 ? g : 0.0; };  // a NaN x gives 0
  const BK A = BK::arithmetic, C = BK::compare, L = BK::logical;
  const std::vector<BinarySpec> specs = {
      {"add", "sc::add", SC_CALL(sc::add(x[0], x[1])), add, A, exact_rounding},
      {"add", "operator+", SC_CALL(x[0] + x[1]), add, A, exact_rounding, false},
      {"sub", "sc::sub", SC_CALL(sc::sub(x[0], x[1])), sub, A, exact_rounding},
      {"sub", "operator-", SC_CALL(x[0] - x[1]), sub, A, exact_rounding, false},
      {"mul", "sc::mul", SC_CALL(sc::mul(x[0], x[1])), mul, A, exact_rounding},
      {"mul", "operator*", SC_CALL(x[0] * x[1]), mul, A, exact_rounding, false},
      {"div", "sc::div", SC_CALL(sc::div(x[0], x[1])), div, BK::floating, exact_rounding},
      {"div", "operator/", SC_CALL(x[0] / x[1]), div, BK::floating, exact_rounding, false},
      {"maximum", "sc::maximum", SC_CALL(sc::maximum(x[0], x[1])), fmax_nan, A, exact_rounding},
      {"minimum", "sc::minimum", SC_CALL(sc::minimum(x[0], x[1])), fmin_nan, A, exact_rounding},
      {"relu_grad", "sc::detail::relu_grad", SC_CALL(sc::detail::relu_grad(x[0], x[1])), relu_grad, A, exact_rounding},
      {"less", "sc::less", SC_CALL(sc::less(x[0], x[1])), lt, C, exact_rounding},
      {"less", "operator<", SC_CALL(x[0] < x[1]), lt, C, exact_rounding, false},
      {"less_equal", "sc::less_equal", SC_CALL(sc::less_equal(x[0], x[1])), le, C, exact_rounding},
      {"less_equal", "operator<=", SC_CALL(x[0] <= x[1]), le, C, exact_rounding, false},
      {"greater", "sc::greater", SC_CALL(sc::greater(x[0], x[1])), gt, C, exact_rounding},
      {"greater", "operator>", SC_CALL(x[0] > x[1]), gt, C, exact_rounding, false},
      {"greater_equal", "sc::greater_equal", SC_CALL(sc::greater_equal(x[0], x[1])), ge, C, exact_rounding},
      {"greater_equal", "operator>=", SC_CALL(x[0] >= x[1]), ge, C, exact_rounding, false},
      {"equal", "sc::equal", SC_CALL(sc::equal(x[0], x[1])), eq, C, exact_rounding},
      {"equal", "operator==", SC_CALL(x[0] == x[1]), eq, C, exact_rounding, false},
      {"not_equal", "sc::not_equal", SC_CALL(sc::not_equal(x[0], x[1])), ne, C, exact_rounding},
      {"not_equal", "operator!=", SC_CALL(x[0] != x[1]), ne, C, exact_rounding, false},
      {"logical_and", "sc::logical_and", SC_CALL(sc::logical_and(x[0], x[1])), land, L, exact_rounding},
      {"logical_and", "operator&&", SC_CALL(x[0] && x[1]), land, L, exact_rounding, false},
      {"logical_or", "sc::logical_or", SC_CALL(sc::logical_or(x[0], x[1])), lor, L, exact_rounding},
      {"logical_or", "operator||", SC_CALL(x[0] || x[1]), lor, L, exact_rounding, false},
  };
  std::vector<OpEntry> out;
  for (const auto& s : specs) out.push_back(binary_entry(s));
  // Regression: xsimd's `a != a` is an ordered compare, so the SIMD path of maximum/minimum
  // once dropped a NaN in `a` (the scalar tail was right). NaN in either input must win.
  for (OpEntry& e : out)
    if (e.op == "maximum" || e.op == "minimum")
      for (DType d : floats)
        e.cases.push_back({{{{9}, d, Gen::normal, 0, {nan_v, 1.0, nan_v, -2.0}}, {{9}, d, Gen::normal, 0, {1.0, nan_v, 3.0}}},
                           {}, "NaN in either input gives NaN (SIMD body and tail)"});

  // pow: float bases in (1/16, 8] with any exponent, any base with small integer exponents,
  // negative bases with fractional exponents (NaN), NaN/inf; integer pow by its own rule.
  RefFn pow_ref = [](const std::vector<Ref>& in, const Params&) { return pow_reference(in[0], in[1]); };
  OpEntry pw{"pow", "sc::pow", SC_CALL(sc::pow(x[0], x[1])), pow_ref, transcendental, {}, 3u};
  for (DType d : numeric)
    for (const auto& sh : binary_shapes) pw.cases.push_back({{{sh[0], d, Gen::positive}, {sh[1], d, Gen::small}}, {}, ""});
  for (DType d : floats) {
    pw.cases.push_back({{{{6, 7}, d, Gen::positive}, {{6, 7}, d, Gen::normal}}, {}, "positive base, any exponent"});
    pw.cases.push_back({{{{6, 7}, d, Gen::normal}, {{6, 7}, d, Gen::small}}, {}, "any base, integer exponent"});
    pw.cases.push_back({{{{6, 7}, d, Gen::normal}, {{6, 7}, d, Gen::normal}}, {}, "negative bases give NaN"});
    pw.cases.push_back({{{{6, 7}, d, Gen::special}, {{7}, d, Gen::special}}, {}, ""});
  }
  pw.cases.push_back({{{{4, 5}, sc::f32, Gen::positive}, {{5}, sc::f64, Gen::normal}}, {}, "mixed dtypes"});
  pw.cases.push_back({{{{4, 5}, sc::i32, Gen::positive}, {{5}, sc::i64, Gen::small}}, {}, "mixed dtypes"});
  // Regression (xsimd::pow once gave 0 for 0^negative): IEEE says +inf
  // on the SIMD path (the scalar tail is right). 9 elements: one full f32 vector plus a tail.
  for (DType d : floats)
    pw.cases.push_back({{{{9}, d, Gen::normal, 0, {0.0}}, {{}, d, Gen::normal, 0, {-1.0}}}, {}, "0^-1 is inf"});
  out.push_back(pw);

  // floor_div and mod: the binary cases, and integer zero divisors and mixed signs spelled out.
  const auto division = [&](const char* name, const char* api, CallFn call, RefFn ref) {
    OpEntry e = binary_entry({name, api, std::move(call), {}, BK::arithmetic, exact_rounding});
    e.ref = std::move(ref);
    for (DType d : numeric)
      e.cases.push_back({{{{12}, d, Gen::normal, 0, {7, -7, 7, -7, 0, 5, -1, 6, -6, 1.5, -2.5, 3}},
                          {{12}, d, Gen::normal, 0, {2, 2, -2, -2, 3, 0, 3, 3, -3, 1, 1, 0.5}}},
                         {}, "signs, zero divisors, exact quotients"});
    out.push_back(std::move(e));
  };
  division("floor_div", "sc::floor_div", SC_CALL(sc::floor_div(x[0], x[1])), division_ref(py_floor_div, int_floor_div));
  division("mod", "sc::mod", SC_CALL(sc::mod(x[0], x[1])), division_ref(py_mod, int_mod));
  return out;
}

// ---- C++ scalar operands (weak) -----------------------------------------------------------

/// The weak-scalar rule, written out: a scalar of the tensor's kind or a lower one takes the
/// tensor's dtype; a higher kind gives its default dtype (integer: i64, floating: f32).
DType weak_dtype(DType tensor, int scalar_kind /*0 bool, 1 int, 2 float*/) {
  const int tk = sc::is_floating(tensor) ? 2 : (sc::is_integral(tensor) ? 1 : 0);
  if (scalar_kind <= tk) return tensor;
  return scalar_kind == 2 ? sc::f32 : sc::i64;
}

struct ScalarSpec {
  const char* op;
  const char* api;
  CallFn call;
  Fn2 f;
  BK kind;
  int scalar_kind;
  double value;
  bool scalar_left;
  std::vector<DType> dtypes;
};

OpEntry scalar_entry(const ScalarSpec& s) {
  const ScalarSpec sp = s;
  RefFn ref = [sp](const std::vector<Ref>& in, const Params&) {
    Ref sv = make_ref({}, weak_dtype(in[0].dtype, sp.scalar_kind));
    sv.v[0] = round_to(sp.value, sv.dtype);
    const Ref& a = sp.scalar_left ? sv : in[0];
    const Ref& b = sp.scalar_left ? in[0] : sv;
    return std::string(sp.op) == "pow" ? pow_reference(a, b) : binary_ref(sp.kind, sp.f)({a, b}, {});
  };
  OpEntry e{s.op, s.api, s.call, ref, std::string(s.op) == "pow" ? transcendental : exact_rounding, {}, 1u};
  append(e.cases, cases(s.dtypes, {{{}}, {{3, 4}}, {{0, 2}}}));
  append(e.cases, cases({sc::f32}, {{{300, 257}}}, Gen::normal, {}, "large"));
  return e;
}

std::vector<OpEntry> scalar_entries() {
  const std::vector<DType> num_b{sc::boolean, sc::i32, sc::i64, sc::f32, sc::f64};
  const std::vector<ScalarSpec> specs = {
      {"add", "tensor + 2 (int)", SC_CALL(x[0] + 2), [](double a, double b) { return a + b; }, BK::arithmetic, 1, 2, false, num_b},
      {"add", "sc::add(tensor, 0.5f)", SC_CALL(sc::add(x[0], 0.5f)), [](double a, double b) { return a + b; },
       BK::arithmetic, 2, 0.5, false, num_b},
      {"sub", "2.5 - tensor (double)", SC_CALL(2.5 - x[0]), [](double a, double b) { return a - b; }, BK::arithmetic, 2,
       2.5, true, num_b},
      {"sub", "sc::sub(7, tensor)", SC_CALL(sc::sub(7, x[0])), [](double a, double b) { return a - b; }, BK::arithmetic,
       1, 7, true, numeric},
      {"mul", "tensor * 0.5 (double)", SC_CALL(x[0] * 0.5), [](double a, double b) { return a * b; }, BK::arithmetic, 2,
       0.5, false, num_b},
      {"mul", "3 * tensor (int)", SC_CALL(3 * x[0]), [](double a, double b) { return a * b; }, BK::arithmetic, 1, 3,
       true, numeric},
      {"div", "tensor / 4 (int)", SC_CALL(x[0] / 4), [](double a, double b) { return a / b; }, BK::floating, 1, 4, false,
       num_b},
      {"div", "sc::div(1.5f, tensor)", SC_CALL(sc::div(1.5f, x[0])), [](double a, double b) { return a / b; },
       BK::floating, 2, 1.5, true, numeric},
      {"maximum", "sc::maximum(tensor, 0.25)", SC_CALL(sc::maximum(x[0], 0.25)), fmax_nan, BK::arithmetic, 2, 0.25,
       false, numeric},
      {"minimum", "sc::minimum(-1, tensor)", SC_CALL(sc::minimum(-1, x[0])), fmin_nan, BK::arithmetic, 1, -1, true,
       numeric},
      {"pow", "sc::pow(tensor, 2)", SC_CALL(sc::pow(x[0], 2)), [](double a, double b) { return std::pow(a, b); },
       BK::arithmetic, 1, 2, false, numeric},
      {"less", "tensor < 0.5 (double)", SC_CALL(x[0] < 0.5), [](double a, double b) { return a < b ? 1.0 : 0.0; },
       BK::compare, 2, 0.5, false, num_b},
      {"greater_equal", "1 >= tensor", SC_CALL(1 >= x[0]), [](double a, double b) { return a >= b ? 1.0 : 0.0; },
       BK::compare, 1, 1, true, num_b},
      {"equal", "tensor == 0 (int)", SC_CALL(x[0] == 0), [](double a, double b) { return a == b ? 1.0 : 0.0; },
       BK::compare, 1, 0, false, num_b},
      // Not `tensor || false`: that picks the built-in || (see conformance_dtypes.cpp, library bug).
      {"logical_or", "sc::logical_or(tensor, false)", SC_CALL(sc::logical_or(x[0], false)), [](double a, double b) { return std::max(truth(a), truth(b)); },
       BK::logical, 0, 0, false, num_b},
  };
  std::vector<OpEntry> out;
  for (const auto& s : specs) out.push_back(scalar_entry(s));
  return out;
}

// ---- where and cast -----------------------------------------------------------------------

std::vector<OpEntry> where_cast_entries() {
  RefFn where_ref = [](const std::vector<Ref>& in, const Params&) {
    return select3(in[0], in[1], in[2], promote2(in[1].dtype, in[2].dtype));
  };
  OpEntry w{"where", "sc::where", SC_CALL(sc::where(x[0], x[1], x[2])), where_ref, exact_rounding, {}, 6u};
  const std::vector<std::vector<sc::Shape>> shapes = {
      {{3, 4}, {3, 4}, {3, 4}},  {{3, 4}, {4}, {}},        {{3, 1}, {1, 4}, {3, 4}}, {{}, {2, 3}, {2, 3}},
      {{}, {}, {}},              {{2, 1, 3, 1}, {1, 4, 1, 5}, {4, 3, 5}}, {{0, 3}, {3}, {}}, {{1}, {5}, {1}},
      {{300, 257}, {257}, {300, 1}}};
  for (DType d : all_dtypes)
    for (const auto& sh : shapes)
      w.cases.push_back({{{sh[0], sc::boolean}, {sh[1], d}, {sh[2], d}}, {}, ""});
  for (DType d : floats) w.cases.push_back({{{{4, 4}, sc::boolean}, {{4, 4}, d, Gen::special}, {{4}, d, Gen::special}}, {}, "NaN/inf pass through"});
  w.cases.push_back({{{{3, 4}, sc::f32, Gen::special}, {{3, 4}, sc::f32}, {{4}, sc::f32}}, {}, "f32 condition read as truth (NaN is true)"});
  w.cases.push_back({{{{3, 4}, sc::i64}, {{3, 4}, sc::i32}, {{4}, sc::f64}}, {}, "mixed dtypes"});
  w.cases.push_back({{{{3, 4}, sc::boolean}, {{3, 4}, sc::i32}, {{4}, sc::i64, Gen::wide}}, {}, "mixed dtypes"});

  auto scalar_ref = [](double value, int kind, bool scalar_then) {
    return [=](const std::vector<Ref>& in, const Params&) {
      Ref s = make_ref({}, weak_dtype(in[1].dtype, kind));
      s.v[0] = round_to(value, s.dtype);
      return scalar_then ? select3(in[0], s, in[1], s.dtype) : select3(in[0], in[1], s, s.dtype);
    };
  };
  OpEntry ws{"where", "sc::where(cond, tensor, 0.5)", SC_CALL(sc::where(x[0], x[1], 0.5)), scalar_ref(0.5, 2, false),
             exact_rounding, {}, 2u};
  OpEntry ws2{"where", "sc::where(cond, -3, tensor)", SC_CALL(sc::where(x[0], -3, x[1])), scalar_ref(-3, 1, true),
              exact_rounding, {}, 2u};
  for (DType d : numeric)
    for (OpEntry* e : {&ws, &ws2}) {
      e->cases.push_back({{{{3, 4}, sc::boolean}, {{3, 4}, d}}, {}, ""});
      e->cases.push_back({{{{4}, sc::boolean}, {{3, 1}, d}}, {}, ""});
    }

  RefFn cast_ref = [](const std::vector<Ref>& in, const Params& p) { return map1(in[0], p.dtype, [](double v) { return v; }); };
  OpEntry c{"cast", "sc::cast", SC_CALL(sc::cast(x[0], p.dtype)), cast_ref, exact_rounding, {}, 1u};
  OpEntry as{"cast", "Tensor::astype", SC_CALL(x[0].astype(p.dtype)), cast_ref, exact_rounding, {}, 1u};
  for (DType from : all_dtypes)
    for (DType to : all_dtypes) {
      Params p;
      p.dtype = to;
      const std::string note = std::string(sc::name(from)) + " -> " + std::string(sc::name(to));
      append(c.cases, cases({from}, {{{}}, {{0}}, {{3, 4}}, {{2, 1, 3}}}, Gen::normal, p, note));
      append(as.cases, cases({from}, {{{5}}}, Gen::normal, p, note));
      if (sc::is_floating(from) && !sc::is_integral(to))  // NaN/inf to int is undefined; skip
        append(c.cases, cases({from}, {{{6, 6}}}, Gen::special, p, note + " NaN/inf"));
      if (sc::is_floating(from) && sc::is_floating(to))
        append(c.cases, cases({from}, {{{6, 6}}}, Gen::wide, p, note + " large (f64 -> f32 overflows to inf)"));
      if (sc::is_integral(from) && to != sc::i32)
        append(c.cases, cases({from}, {{{6, 6}}}, Gen::wide, p, note + " large ints"));
    }
  Params to_f32;
  to_f32.dtype = sc::f32;
  c.cases.push_back({{{{300, 257}, sc::f64}}, to_f32, "large f64 -> f32"});
  return {w, ws, ws2, c, as};
}

#undef SC_CALL
}  // namespace

std::vector<OpEntry> elementwise_table() {
  std::vector<OpEntry> t = unary_entries();
  for (auto* part : {&binary_entries, &scalar_entries, &where_cast_entries})
    for (OpEntry& e : (*part)()) t.push_back(std::move(e));
  return t;
}

}  // namespace conf

TEST_CASE("conformance: elementwise unary", "[conformance][elementwise]") { conf::check_table(conf::unary_entries()); }
TEST_CASE("conformance: elementwise binary", "[conformance][elementwise]") { conf::check_table(conf::binary_entries()); }
TEST_CASE("conformance: C++ scalar operands", "[conformance][elementwise]") { conf::check_table(conf::scalar_entries()); }
TEST_CASE("conformance: where and cast", "[conformance][elementwise]") { conf::check_table(conf::where_cast_entries()); }
