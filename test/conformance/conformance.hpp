// The conformance table's types: one OpEntry per (op, public API form), its cases, tolerances.
//
// An entry says how to build inputs (Case::in: shape, dtype, value generator), how to call the
// op through the public API (OpEntry::call) and how to compute the answer independently
// (OpEntry::ref, plain loops in reference.hpp). run_entry() checks call == ref;
// conformance_traced.cpp wraps `call` in sc::function (traced == eager, forward and the tape
// gradient of the grad_inputs); later issues walk the same table for finite-difference
// gradients, staged == eager, and CUDA == CPU (run `call` under a DeviceScope).
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

// The op headers themselves (not the umbrella): the suite needs only the ops and creation.
#include <stagecraft/core/creation.hpp>
#include <stagecraft/ops/add_n.hpp>
#include <stagecraft/ops/binary.hpp>
#include <stagecraft/ops/broadcast_to.hpp>
#include <stagecraft/ops/cast.hpp>
#include <stagecraft/ops/concat.hpp>
#include <stagecraft/ops/conv.hpp>
#include <stagecraft/ops/fill.hpp>
#include <stagecraft/ops/gather.hpp>
#include <stagecraft/ops/matmul.hpp>
#include <stagecraft/ops/pool.hpp>
#include <stagecraft/ops/random.hpp>
#include <stagecraft/ops/reduce.hpp>
#include <stagecraft/ops/reshape.hpp>
#include <stagecraft/ops/slice.hpp>
#include <stagecraft/ops/stop_gradient.hpp>
#include <stagecraft/ops/transpose.hpp>
#include <stagecraft/ops/unary.hpp>
#include <stagecraft/ops/where.hpp>
// Last: it opens stagecraft::nn::detail, which hides stagecraft::detail from ops/conv.hpp's
// nn::conv2d when included before it (reported to the lead).
#include <stagecraft/nn/functional.hpp>

#include "reference.hpp"

namespace conf {

using sc::DType;

/// How input values are drawn (deterministic: a hash of op, case, input and element index).
enum class Gen : std::uint8_t {
  normal,    ///< floats in [-4, 4] with exact 0, -1, 1, -0.5 sprinkled in; ints in [-20, 20]; bools mixed
  wide,      ///< floats up to ±1e30 (f32) / ±1e300 (f64) and tiny ±1e-30 / ±1e-300; ints up to ±3e4 (i32) / ±3e9 (i64)
  special,   ///< normal plus NaN, +inf, -inf, 0 and -0 (floats only; ints and bools as normal)
  positive,  ///< floats in (1/16, 8]; ints in [1, 20]
  small,     ///< ints in [-3, 4] (integer pow exponents); floats as normal
  large,     ///< logits near ±1e4 (softmax / logsumexp stability)
  index,     ///< ints in [0, hi): gather indices, class labels
};

/// One input of a case.
struct In {
  sc::Shape shape;
  DType dtype = sc::f32;
  Gen gen = Gen::normal;
  std::int64_t hi = 0;  ///< upper bound (exclusive) for Gen::index
  std::vector<double> values = {};  ///< explicit values (cycled to fill the shape) instead of gen
};

/// Non-tensor arguments of a call (axes, perm, sizes, kernel/stride/padding, target dtype).
struct Params {
  std::vector<std::int64_t> ints;   ///< axes, perm, shape, begin
  std::vector<std::int64_t> ints2;  ///< sizes
  std::int64_t axis = 0;
  std::int64_t k = 0, stride = 1, pad = 0;
  bool keepdims = false;
  DType dtype = sc::f32;  ///< target dtype (cast, one_hot, fill, random)
  double scalar = 0;      ///< a C++ scalar operand; fill value; random mean or lo
  double scalar2 = 0;     ///< random stddev or hi
};

/// One call of an entry: its inputs and arguments, plus a note printed on failure.
struct Case {
  std::vector<In> in;
  Params p;
  std::string note;
};

/// Allowed error, in units of the result dtype's epsilon (ints and bools are always exact):
/// |got - want| <= ulps * eps * max(|want|, scale) + ulps * min_normal, where scale is the
/// reference's condition magnitude for that element (Ref::scale, e.g. sum of |x| for a sum).
struct Tol {
  double ulps = 1;
};
// Tolerance per op (ulps of the result dtype; "of S" means of Ref::scale S, else of |want|):
//   1 ulp (exact_rounding): neg abs square relu sign add sub mul div sqrt maximum minimum,
//     comparisons, logical ops, where, cast, max min argmax argmin, every layout op, im2col,
//     max_pool2d, stop_gradient, fill: IEEE-exact arithmetic or pure data movement.
//   4 ulps of |mean| + |stddev r|: random_normal;  2 ulps of |lo| + |hi - lo|: random_uniform
//     (the same Philox words; only the order of the final multiply-adds may differ).
//   4 ulps (transcendental): exp log tanh sigmoid sin cos (xsimd vector math).
//   4 ulps of |a^b| (1 + |b ln a|): pow (computed as exp(b log a)).
//   2 ulps of sum|x| (log2 n + 1): sum;  4 ulps of that / n: mean;  8 ulps of |max| + n + 1: logsumexp.
//   4 ulps of sum|a b| sqrt(K): matmul, conv2d (K = C kh kw terms).
//   2 ulps of sum|cols| kh kw: col2im;  2 ulps of sum|window|: avg_pool2d.
//   8 ulps: softmax of |p| (|x - max| + 2); log_softmax of |x| + |max| + log(sum) + 1
//     (backward-stable: x - logsumexp rounds at |x|); cross_entropy the same, per row; its
//     gradient of |g| / N (p (|x - max| + 2) + [label]).
inline constexpr Tol exact_rounding{1};   ///< IEEE-exact ops (add, mul, div, sqrt): correctly rounded; 1 ulp slack
inline constexpr Tol transcendental{4};   ///< exp, log, tanh, sin, ... (xsimd vector math is within ~2-3 ulps)

using CallFn = std::function<sc::Tensor(const std::vector<sc::Tensor>&, const Params&)>;
using RefFn = std::function<Ref(const std::vector<Ref>&, const Params&)>;

/// A CallFn from an expression in the inputs x and the params p: SC_CALL(sc::matmul(x[0], x[1])).
#define SC_CALL(expr) \
  [](const std::vector<sc::Tensor>& x, const Params& p) -> sc::Tensor { (void)x; (void)p; return expr; }

/// One row of the table: an op reached through one public API form.
struct OpEntry {
  std::string op;   ///< the registry name (ops::X::name), e.g. "add"; a composite's own name ("mean")
  std::string api;  ///< the public form used, e.g. "operator+" or "sc::add(tensor, scalar)"
  CallFn call;
  RefFn ref;
  Tol tol;
  std::vector<Case> cases;
  /// Bit i set: input i is a float input a gradient check may perturb (used by a later issue).
  std::uint32_t grad_inputs = 0;
  /// The GPU-vs-CPU gradient tolerance grows by this many ulps of the largest finite |result|: for
  /// a gradient that reads its own output through exp (logcumsumexp's e^(x - y)), where two correct
  /// forward passes differing in y's last bit move it by about |y| ulps.
  double grad_ulps_of_result = 0;
};

// ---- inputs and comparison (framework.cpp) ------------------------------------------------

/// The input values of one case input: deterministic for (seed, shape, dtype, gen).
Ref make_input(const In& in, std::uint64_t seed);
/// A concrete CPU tensor holding exactly the values of r.
sc::Tensor to_tensor(const Ref& r);
/// The values of a concrete tensor.
Ref from_tensor(const sc::Tensor& t);
/// "" when got matches want within tol, else what differs (dtype, shape, or the first
/// mismatching index with got vs want and the number of mismatches).
std::string compare(const Ref& want, const sc::Tensor& got, Tol tol);
/// The input values of case ci of e: the same the runner draws (the traced pass reuses them).
std::vector<Ref> case_inputs(const OpEntry& e, std::size_t ci);
/// How a failure names a case: "op 'add' via sc::add [note], inputs (f32[3, 4], f32[4])".
std::string describe_case(const OpEntry& e, const Case& c, const std::vector<Ref>& ins);
/// Runs every case of an entry; returns one message per failing case (empty = all pass).
std::vector<std::string> run_entry(const OpEntry& e);
/// Runs every entry of a table as Catch2 checks (one FAIL_CHECK per failing case).
void check_table(const std::vector<OpEntry>& table);

// ---- building cases -----------------------------------------------------------------------

/// Every shape set in `shapes`, once per dtype in `dtypes`, all inputs of that dtype and gen.
std::vector<Case> cases(const std::vector<DType>& dtypes, const std::vector<std::vector<sc::Shape>>& shapes,
                        Gen gen = Gen::normal, Params p = {}, const std::string& note = "");
/// Appends b to a.
void append(std::vector<Case>& a, const std::vector<Case>& b);

/// NaN and infinity, for explicit case values.
inline const double nan_v = std::numeric_limits<double>::quiet_NaN();
inline const double inf_v = std::numeric_limits<double>::infinity();

inline const std::vector<DType> floats{sc::f32, sc::f64};
inline const std::vector<DType> ints{sc::i32, sc::i64};
inline const std::vector<DType> numeric{sc::i32, sc::i64, sc::f32, sc::f64};
inline const std::vector<DType> all_dtypes{sc::boolean, sc::i32, sc::i64, sc::f32, sc::f64};

// ---- the tables, one per family (one .cpp each) -------------------------------------------

std::vector<OpEntry> elementwise_table();
std::vector<OpEntry> reduce_table();
/// The scans beside cumsum (conformance_scan.cpp), part of reduce_table().
std::vector<OpEntry> scan_entries();
std::vector<OpEntry> layout_table();
std::vector<OpEntry> nn_table();
std::vector<OpEntry> creation_table();

}  // namespace conf
