// Shared shape/dtype rules and kernels of the elementwise families (the op structs derive
// from these; each op then only states its name and scalar/SIMD rule).
#pragma once
#include "../backend/cpu/elementwise.hpp"
#include "op.hpp"
#include "rules.hpp"

namespace stagecraft::ops {

/// Which elementwise family an op belongs to, as the registry records it (OpInfo::elementwise):
/// the Unary and Binary kinds below, where, cast, or none (not elementwise).
enum class ElementwiseKind : std::uint8_t {
  none,
  unary_floating,   ///< Unary, UnaryKind::floating
  unary_numeric,    ///< Unary, UnaryKind::numeric
  predicate,        ///< Unary, UnaryKind::predicate (bool out)
  arithmetic,       ///< Binary, BinaryKind::arithmetic
  floating,         ///< Binary, BinaryKind::floating
  compare,          ///< Binary, BinaryKind::compare (bool out)
  logical,          ///< Binary, BinaryKind::logical (bool out)
  where,            ///< where(cond, a, b)
  cast              ///< cast(x, dtype)
};
/// An op of the Unary family (one input, output of its shape; kernels from its rule).
constexpr bool unary_family(ElementwiseKind k) {
  return k == ElementwiseKind::unary_floating || k == ElementwiseKind::unary_numeric ||
         k == ElementwiseKind::predicate;
}
/// An op of the Binary family (two broadcasting inputs; kernels from its rule).
constexpr bool binary_family(ElementwiseKind k) {
  return k >= ElementwiseKind::arithmetic && k <= ElementwiseKind::logical;
}
/// An elementwise op whose result is bool whatever its inputs (no gradient flows through it).
constexpr bool bool_result(ElementwiseKind k) {
  return k == ElementwiseKind::predicate || k == ElementwiseKind::compare || k == ElementwiseKind::logical;
}

/// What a unary op accepts and returns.
enum class UnaryKind {
  floating,  ///< float in, same float out (ints are promoted to f32 by dispatch)
  numeric,   ///< int or float in, same out (bool rejected)
  predicate  ///< any dtype in, bool out
};

/// Whether Op's rule may run on SIMD batches B (rules::on_batches: Rule::vectorizes, or batches of
/// floats for a rule that says vectorizes_floats). Written over B too, so the constraint is
/// checked when simd() is called, not when Unary<Op> is instantiated while Op is still incomplete
/// (nvcc's front end checks a constraint that names only the class's parameters that early).
template <class Op, class B>
inline constexpr bool vectorizes_for = rules::on_batches<Op, B>;

/// The scalar and SIMD forms of an op whose math is a rule (rules.hpp): both call Op::f, so an
/// op's math is written once. SIMD only where the rule allows it (Rule::vectorizes); a
/// predicate's SIMD form gives a lane mask (the loops store it as bools).
template <class Op, UnaryKind K>
struct Unary {
  static constexpr int arity = 1;
  /// Every unary rule is elementwise in g (g times a function of x or the result): it takes a
  /// gradient that broadcasts to the output's (ops::TakesBroadcastGrad; the tape's form).
  static constexpr bool vjp_takes_broadcast_grad = true;
  static constexpr ElementwiseKind elementwise_kind = K == UnaryKind::floating  ? ElementwiseKind::unary_floating
                                                      : K == UnaryKind::numeric ? ElementwiseKind::unary_numeric
                                                                                : ElementwiseKind::predicate;
  template <class T>
    requires requires(T x) { Op::f(x); }
  static std::conditional_t<K == UnaryKind::predicate, bool, T> scalar(T x) {
    return Op::f(x);
  }
  template <class B>
    requires(vectorizes_for<Op, B>)
  static auto simd(const B& x) {
    if constexpr (K == UnaryKind::predicate) return Op::f(x);
    else return B(Op::f(x));
  }
  static constexpr bool float_inputs = K == UnaryKind::floating;
  static constexpr bool differentiable = K != UnaryKind::predicate;

  static OutMeta infer(Inputs in, const Attrs&, const std::source_location& loc) {
    const DType d = in[0].dtype();
    if constexpr (K == UnaryKind::numeric) require_dtype(!is_bool(d), Op::name, d, "a numeric dtype", loc);
    return {in[0].shape(), K == UnaryKind::predicate ? DType::b8 : d};
  }
  static void cpu(Inputs in, Tensor& out, const Attrs&) {
    visit_dtype(in[0].dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (K == UnaryKind::predicate) {
        backend::cpu::unary_loop<Op, T, bool>(static_cast<const T*>(in[0].raw_data()),
                                                static_cast<bool*>(out.raw_data()), out.numel(), grain());
      } else if constexpr (K == UnaryKind::floating ? std::is_floating_point_v<T> : !std::is_same_v<T, bool>) {
        backend::cpu::unary_loop<Op, T, T>(static_cast<const T*>(in[0].raw_data()),
                                           static_cast<T*>(out.raw_data()), out.numel(), grain());
      }
    });
  }
  static void cuda(Inputs in, Tensor& out, const Attrs&, const std::source_location& loc) {
    backend::cuda::unary<Op>(in, out, loc);
  }
  /// A costly grain for transcendentals and for rules with no SIMD form (a scalar call an element).
  static constexpr std::int64_t grain() {
    return K == UnaryKind::floating || !Op::vectorizes ? backend::cpu::grain_costly : backend::cpu::grain_cheap;
  }
};

/// What a binary op accepts and returns.
enum class BinaryKind {
  arithmetic,  ///< numeric in (common dtype), same out; bool rejected
  floating,    ///< float in (ints promoted to f32), same out
  compare,     ///< any dtype in (common dtype), bool out
  logical      ///< any dtype in (read as truth values), bool out
};

/// The broadcast shape of two inputs, or a ShapeError naming the op, shapes and dtypes.
inline Shape broadcast_or_throw(const Tensor& a, const Tensor& b, std::string_view op,
                                const std::source_location& loc) {
  Shape out;
  if (SC_UNLIKELY(!broadcast_shapes(a.shape(), b.shape(), out)))
    detail::fail<ShapeError>(op, loc, "cannot broadcast shapes ", a.shape(), " and ", b.shape(),
                             " (", name(a.dtype()), ", ", name(b.dtype()), ")");
  return out;
}

/// As Unary, for two inputs; a comparison's or logical op's SIMD form gives a lane mask.
template <class Op, BinaryKind K>
struct Binary {
  static constexpr int arity = 2;
  /// Every binary rule is elementwise in g (g selected or times a function of the inputs): it
  /// takes a gradient that broadcasts to the output's (ops::TakesBroadcastGrad; the tape's form).
  static constexpr bool vjp_takes_broadcast_grad = true;
  static constexpr ElementwiseKind elementwise_kind = K == BinaryKind::arithmetic ? ElementwiseKind::arithmetic
                                                      : K == BinaryKind::floating ? ElementwiseKind::floating
                                                      : K == BinaryKind::compare  ? ElementwiseKind::compare
                                                                                  : ElementwiseKind::logical;
  template <class T>
    requires requires(T x) { Op::f(x, x); }
  static std::conditional_t<K == BinaryKind::compare || K == BinaryKind::logical, bool, T> scalar(T a, T b) {
    return Op::f(a, b);
  }
  template <class B>
    requires(vectorizes_for<Op, B>)
  static auto simd(const B& a, const B& b) {
    if constexpr (K == BinaryKind::compare || K == BinaryKind::logical) return Op::f(a, b);
    else return B(Op::f(a, b));
  }
  static constexpr int promote_from = 0;
  static constexpr bool float_inputs = K == BinaryKind::floating;
  static constexpr bool differentiable = K == BinaryKind::arithmetic || K == BinaryKind::floating;

  static OutMeta infer(Inputs in, const Attrs&, const std::source_location& loc) {
    const DType d = in[0].dtype();
    if constexpr (K == BinaryKind::arithmetic) require_dtype(!is_bool(d), Op::name, d, "numeric dtypes", loc);
    const bool to_bool = K == BinaryKind::compare || K == BinaryKind::logical;
    return {broadcast_or_throw(in[0], in[1], Op::name, loc), to_bool ? DType::b8 : d};
  }
  static void cpu(Inputs in, Tensor& out, const Attrs&) {
    visit_dtype(in[0].dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (K == BinaryKind::compare || K == BinaryKind::logical) {
        backend::cpu::binary_loop<Op, T, bool>(in[0], in[1], out, backend::cpu::grain_cheap);
      } else if constexpr (K == BinaryKind::floating ? std::is_floating_point_v<T> : !std::is_same_v<T, bool>) {
        backend::cpu::binary_loop<Op, T, T>(in[0], in[1], out, Op::template cpu_grain<T>(in));
      }
    });
  }
  static void cuda(Inputs in, Tensor& out, const Attrs&, const std::source_location& loc) {
    backend::cuda::binary<Op>(in, out, loc);
  }
  /// The CPU loop's grain over dtype T, known from the op alone: grain(), or grain_heavy where the
  /// rule has no SIMD form for T and goes a lane at a time through a scalar of several ns
  /// (floor_div and mod on 64-bit ints, an integer division a lane; float mod without fused FMA,
  /// fmod). The fused plans' op costs read it too (graph/fused_ops.hpp).
  template <class T> static constexpr std::int64_t grain_of() {
    if constexpr (!Op::vectorizes && !backend::cpu::HasSimd2<Op, T>) return backend::cpu::grain_heavy;
    else return grain();
  }
  /// The grain of the CPU loop over these inputs of dtype T: grain_of<T>() unless the op knows
  /// better from the inputs themselves (pow, from its exponent).
  template <class T> static std::int64_t cpu_grain(Inputs) { return grain_of<T>(); }
  /// A costly grain for division and for rules with no SIMD form (pow, floor_div, mod: a libm call
  /// or an integer division an element, 2-40 ns where add's vector loop takes a fraction of one).
  static constexpr std::int64_t grain() {
    return K == BinaryKind::floating || !Op::vectorizes ? backend::cpu::grain_costly : backend::cpu::grain_cheap;
  }
};

}  // namespace stagecraft::ops
