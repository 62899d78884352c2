// The per-op kernels of the fused evaluator (fused_kernel.hpp): for each elementwise op that keeps
// its dtype, its SIMD rule (or scalar rule) over a run of elements, in each operand mode, in a
// table built from STAGECRAFT_OP_LIST, and fusible(), which says which ops a program may hold.
#pragma once
#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "../backend/cpu/elementwise.hpp"
#include "../ops/registry.hpp"

namespace stagecraft::graph {

namespace detail_fused {

using backend::cpu::batch;

/// A kernel: y[i] = op(a[i], b[i]) for i < n (b unused by unary ops); a and y may be the same buffer.
template <class T>
using Kernel = void (*)(const T* a, const T* b, T* y, std::int64_t n);

/// How an instruction's operands arrive. vv: both per element (unary: its one operand); sv / vs:
/// the first / second operand is one value (a pointer to it), read by every element; scalar: the
/// scalar rule over per-element operands (single-element registers, computed once per run).
enum Mode : int { vv = 0, sv = 1, vs = 2, scalar = 3, num_modes = 4 };

// The elementwise family an op derives from, found by deduction (nothing to declare per op).
template <class Op, ops::UnaryKind K>
std::integral_constant<ops::UnaryKind, K> unary_kind_of(const ops::Unary<Op, K>*);
template <class Op, ops::BinaryKind K>
std::integral_constant<ops::BinaryKind, K> binary_kind_of(const ops::Binary<Op, K>*);

template <class Op>
concept UnaryOp = requires(const Op* p) { unary_kind_of(p); };
template <class Op>
concept BinaryOp = requires(const Op* p) { binary_kind_of(p); };

/// Op keeps dtype T: an elementwise unary/binary op whose result has its inputs' dtype T (not
/// predicates, comparisons or logical ops; floating-only ops only for floating T), with a scalar
/// rule of T (so its eager kernel is the Unary/Binary loop over Op::scalar / Op::simd).
template <class Op, class T>
constexpr bool keeps_dtype() {
  if constexpr (std::is_same_v<T, bool> || !std::is_arithmetic_v<T>) {
    return false;
  } else if constexpr (UnaryOp<Op>) {
    constexpr ops::UnaryKind k = decltype(unary_kind_of(std::declval<const Op*>()))::value;
    return k != ops::UnaryKind::predicate && (k == ops::UnaryKind::numeric || std::is_floating_point_v<T>) &&
           requires(T x) { { Op::scalar(x) } -> std::same_as<T>; };
  } else if constexpr (BinaryOp<Op>) {
    constexpr ops::BinaryKind k = decltype(binary_kind_of(std::declval<const Op*>()))::value;
    return (k == ops::BinaryKind::arithmetic || (k == ops::BinaryKind::floating && std::is_floating_point_v<T>)) &&
           requires(T x) { { Op::scalar(x, x) } -> std::same_as<T>; };
  } else {
    return false;
  }
}

/// The op's SIMD rule is used for T exactly when the eager loop uses it.
template <class Op, class T>
constexpr bool has_simd() {
  if constexpr (Op::arity == 1) return backend::cpu::HasSimd1<Op, T>;
  else return backend::cpu::HasSimd2<Op, T>;
}

/// One SIMD step at a[i], b[i] (va / vb: the broadcast single value in modes sv / vs).
template <class Op, class T, int M>
SC_ALWAYS_INLINE batch<T> simd_at(const T* a, const T* b, std::int64_t i, const batch<T>& va, const batch<T>& vb) {
  using B = batch<T>;
  if constexpr (Op::arity == 1) {
    return B(Op::simd(B::load_unaligned(a + i)));
  } else {
    return B(Op::simd(M == sv ? va : B::load_unaligned(a + i), M == vs ? vb : B::load_unaligned(b + i)));
  }
}

/// The SIMD rule over n elements; the last partial batch goes through one zero-padded batch.
template <class Op, class T, int M>
void simd_kernel(const T* a, const T* b, T* y, std::int64_t n) {
  using B = batch<T>;
  constexpr std::int64_t W = B::size;
  // Single values are read once, before any store (y may be any buffer).
  const B va = M == sv ? B(a[0]) : B(T(0)), vb = M == vs ? B(b[0]) : B(T(0));
  std::int64_t i = 0;
  for (; i + W <= n; i += W) simd_at<Op, T, M>(a, b, i, va, vb).store_unaligned(y + i);
  if (i < n) {
    alignas(sizeof(B)) T ta[W] = {}, tb[W] = {}, ty[W];
    const std::int64_t r = n - i;
    if constexpr (M != sv) std::copy_n(a + i, r, ta);
    if constexpr (Op::arity == 2 && M != vs) std::copy_n(b + i, r, tb);
    simd_at<Op, T, M>(ta, tb, 0, va, vb).store_aligned(ty);
    std::copy_n(ty, r, y + i);
  }
}

/// The scalar rule over n elements (ops without a SIMD rule for T, and single-element registers).
template <class Op, class T, int M>
void scalar_kernel(const T* a, const T* b, T* y, std::int64_t n) {
  if constexpr (Op::arity == 1) {
    for (std::int64_t i = 0; i < n; ++i) y[i] = Op::scalar(a[i]);
  } else {
    const T ca = M == sv ? a[0] : T(0), cb = M == vs ? b[0] : T(0);
    for (std::int64_t i = 0; i < n; ++i) y[i] = Op::scalar(M == sv ? ca : a[i], M == vs ? cb : b[i]);
  }
}

/// Everything the evaluator needs of one (op, dtype): a kernel per mode (null: not available),
/// the op's relative cost (for the parallel grain), and whether its SIMD bits depend on the other
/// lanes of the batch (Op::batch_dependent: sin, cos).
template <class T>
struct OpKernels {
  std::array<Kernel<T>, num_modes> k{};
  int cost = 1;
  bool batch_dependent = false;
};

template <class Op, class T, int M>
constexpr Kernel<T> pick() {
  if constexpr (M != scalar && has_simd<Op, T>()) return &simd_kernel<Op, T, M>;
  // Single values of a floating type go through one padded batch, as the eager loop's tail does.
  else if constexpr (M == scalar && has_simd<Op, T>() && backend::cpu::padded_tail<T, T>) return &simd_kernel<Op, T, vv>;
  else return &scalar_kernel<Op, T, M>;
}

template <class Op, class T>
constexpr OpKernels<T> kernels_of() {
  OpKernels<T> r;
  if constexpr (keeps_dtype<Op, T>()) {
    r.k[vv] = pick<Op, T, vv>();
    r.k[scalar] = pick<Op, T, scalar>();
    if constexpr (Op::arity == 2) {
      r.k[sv] = pick<Op, T, sv>();
      r.k[vs] = pick<Op, T, vs>();
    }
    std::int64_t grain = Op::grain();
    if constexpr (requires { Op::template grain_of<T>(); }) grain = Op::template grain_of<T>();
    r.cost = static_cast<int>(std::max<std::int64_t>(1, backend::cpu::grain_cheap / grain));
    if constexpr (requires { Op::batch_dependent; }) r.batch_dependent = Op::batch_dependent && has_simd<Op, T>();
  }
  return r;
}

/// Every op's kernels over T, in op-list order (all null for ops that cannot be instructions).
template <class T>
inline constexpr std::array<OpKernels<T>, ops::num_ops> kernel_table = {{
#define STAGECRAFT_FUSED_KERNELS(S) kernels_of<ops::S, T>(),
    STAGECRAFT_OP_LIST(STAGECRAFT_FUSED_KERNELS)
#undef STAGECRAFT_FUSED_KERNELS
}};

template <class T>
constexpr const OpKernels<T>& kernels(ops::OpId op) {
  return kernel_table<T>[static_cast<std::size_t>(op)];
}

}  // namespace detail_fused

/// True when `op` can be an instruction of a program over dtype d: an elementwise unary or binary op
/// whose inputs and output all have dtype d (arithmetic/floating kinds; not comparisons or logical ops,
/// which change the dtype; not where/cast).
STAGECRAFT_COMPILED_INLINE bool fusible(ops::OpId op, DType d);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE bool fusible(ops::OpId op, DType d) {
  if (static_cast<int>(op) >= ops::num_ops) return false;
  return visit_dtype(d, [&](auto tag) {
    return detail_fused::kernels<typename decltype(tag)::type>(op).k[detail_fused::vv] != nullptr;
  });
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
