// The node types of compile-time staged expressions: the graph of `sc::staged<E>` is its type E.
//
// Every node is a small aggregate holding its children by value (tensors by handle), so an
// expression kept in `auto` owns everything it reads. A node states, as constexpr functions of the
// dtype D that the expression's tensors share at run time:
//   dtype<D>()    its result dtype (the eager promotion rules of core/dtype.hpp, applied per kind);
//   valid<D>()    whether eager would accept it (no arithmetic on bool);
//   uniform<D>()  whether it evaluates on SIMD batches of ctype<D> (every value is D or a mask).
// A *weak* node (a C++ scalar, or ops over scalars only) has no dtype of its own: it takes the
// type its consumer computes in, as eager's weak scalars do.
//
// `get<S, D, V, L>(ctx, i)` is the value at output position i as V (a scalar, an xsimd batch or a
// batch mask), for lanes L (SIMD or scalar, dense or strided, tail or not). S is the first
// context slot of the node's subtree: tensor leaves and materialized values are slots, numbered
// left to right after the compiled function's arguments.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../backend/cpu/simd.hpp"  // xsimd, with GCC 12's AVX-512 intrinsics warnings handled

#include "../backend/cpu/elementwise.hpp"
#include "../core/dtype.hpp"
#include "../core/tensor.hpp"
#include "../ops/binary.hpp"
#include "../ops/unary.hpp"

namespace stagecraft {

template <class E>
struct staged;

namespace staging {

/// An op's work an element relative to an add's: the CPU loop's grain is grain_cheap / the
/// expression's summed costs (as the traced plans', graph/fused_prepare.hpp), so a chain of cheap
/// ops splits over threads where one add would not. 1 for a cheap op; a transcendental, a division
/// or a rule with no SIMD form costs what its eager loop's grain says (8).
inline constexpr int cheap_cost = 1;
inline constexpr int costly_cost = static_cast<int>(backend::cpu::grain_cheap / backend::cpu::grain_costly);

/// Base of every node type (the concept below checks for it). `cost`: the node's work with its
/// operands' (above); leaves, and nodes whose value is made apart (Mat), cost nothing here.
struct Node {
  static constexpr int cost = 0;
};
template <class N>
concept NodeType = std::is_base_of_v<Node, N>;

template <class>
inline constexpr bool always_false = false;

// ---- lanes and values ----------------------------------------------------------------------

/// SIMD lanes of T: dense (every slot has the output's layout) or strided (slot stride 0 or 1
/// per row); tail: the last partial batch (masked loads).
/// Ordered: what a check before the loop found of the graph's max/min constants: 0 nothing, 1 none
/// is NaN, 2 none is NaN or zero. Those ops then take their rule's short forms
/// (rules::Maximum::f_ordered_b, f_ordered_nonzero_b) with no test inside the loop.
template <class T, bool Dense, bool Tail = false, int Ordered = 0>
struct SimdLane {
  using elem = T;
  using value = xsimd::batch<T>;
  using mask = xsimd::batch_bool<T>;
  static constexpr bool simd = true, dense = Dense, tail = Tail;
  static constexpr int ordered = Ordered;
  static constexpr std::int64_t width = value::size;
};
/// One element at a time (dtype mixes SIMD cannot hold in one register width).
template <bool Dense>
struct ScalarLane {
  static constexpr bool simd = false, dense = Dense, tail = false;
  static constexpr int ordered = 0;
  static constexpr std::int64_t width = 1;
};

template <class L, DType X, bool Simd = L::simd>
struct native_impl {
  using type = ctype_t<X>;
};
template <class L, DType X>
struct native_impl<L, X, true> {
  using type = std::conditional_t<X == DType::b8, typename L::mask, typename L::value>;
};
/// How lanes L hold a value of dtype X.
template <class L, DType X>
using native_t = typename native_impl<L, X>::type;

template <class V>
inline constexpr bool is_batch = false;
template <class T, class A>
inline constexpr bool is_batch<xsimd::batch<T, A>> = true;
template <class V>
inline constexpr bool is_mask = false;
template <class T, class A>
inline constexpr bool is_mask<xsimd::batch_bool<T, A>> = true;

/// An op's floating-point result, rounded where eager rounds it (on its way to memory): without
/// this the compiler may contract one op's product and the next op's sum into one fused
/// multiply-add (GCC does by default where the target has FMA), and the fused loop would differ
/// from eager in the last bit. An empty asm on the register: it emits nothing, and the rule's own
/// math (a polynomial inside exp or tanh) keeps its fused multiply-adds. STAGECRAFT_FUSED_CONTRACT
/// lets the compiler contract across ops (a few percent faster where it does, other last bits).
template <class V>
SC_ALWAYS_INLINE V rounded(V v) {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) && \
    !defined(__CUDA_ARCH__) && !defined(STAGECRAFT_FUSED_CONTRACT)
  if constexpr (is_batch<V>) {
    if constexpr (std::is_floating_point_v<typename V::value_type>) {
      auto r = static_cast<typename V::register_type>(v);
      __asm__("" : "+v"(r));
      return V(r);
    }
  } else if constexpr (std::is_same_v<V, float> || std::is_same_v<V, double>) {
    __asm__("" : "+v"(v));
  }
#endif
  return v;
}

/// x as V: value <-> mask conversions read truth as eager's cast to bool does (NaN is true).
template <class V, class X>
SC_ALWAYS_INLINE V to(const X& x) {
  if constexpr (std::is_same_v<V, X>) return x;
  else if constexpr (is_mask<X> && is_batch<V>) return xsimd::select(x, V(1), V(0));
  else if constexpr (is_batch<X> && is_mask<V>) return !(x == X(0));
  else if constexpr (!is_batch<X> && !is_mask<X> && !is_batch<V> && !is_mask<V>) return static_cast<V>(x);
  else static_assert(always_false<V>, "stagecraft internal: a SIMD value of another width");
}

/// A constant c as V (a scalar, a batch, or a mask of c != 0).
template <class V, class S>
SC_ALWAYS_INLINE V constant(S c) {
  if constexpr (is_mask<V>) return V(c != S(0));
  else if constexpr (is_batch<V>) return V(static_cast<typename V::value_type>(c));
  else return static_cast<V>(c);
}

/// The kernel's view of the slots: base pointers and per-row strides (0 or 1); and NF frame slots, where shared sub-expressions keep their value for the batch (cse.hpp).
template <int NS, int NF = 0>
struct Ctx {
  const void* p[NS > 0 ? NS : 1] = {};
  std::int64_t s[NS > 0 ? NS : 1] = {};
  alignas(64) mutable unsigned char frame[NF > 0 ? NF : 1][64] = {};
};

/// Reads slot k at position i as a native value of lanes L (the slot's dtype is X).
template <int K, DType X, class L, class C>
SC_ALWAYS_INLINE native_t<L, X> load_slot(const C& c, std::int64_t i) {
  using T = ctype_t<X>;
  const T* p = static_cast<const T*>(c.p[K]);
  if constexpr (L::simd) {
    using B = typename L::value;
    if constexpr (!L::dense) {
      if (c.s[K] == 0) return B(p[0]);
    }
    return B::load_unaligned(p + i);
  } else {
    if constexpr (L::dense) return p[i];
    else return p[i * c.s[K]];
  }
}

// ---- op kinds (read from the eager op structs' bases) ---------------------------------------

/// An op's elementwise family, as the registry records it (ops/elementwise_rules.hpp).
using Kind = ops::ElementwiseKind;
template <class Op>
constexpr Kind kind_of() {
  static_assert(ops::unary_family(Op::elementwise_kind) || ops::binary_family(Op::elementwise_kind),
                "stagecraft: not an elementwise op");
  return Op::elementwise_kind;
}
constexpr bool to_bool(Kind k) { return ops::bool_result(k); }
constexpr bool simd_dtype(DType d) { return d != DType::b8; }
constexpr bool is_d_or_bool(DType x, DType d) { return x == d || x == DType::b8; }

/// Runs rule Op on SIMD lanes; a rule that does not vectorize for B (pow; mod on integers) runs
/// lane by lane.
template <class Op, class B, class... Bs>
SC_ALWAYS_INLINE auto apply_rule(const B& x, const Bs&... y) {
  if constexpr (is_batch<B> && !rules::on_batches<Op, B>) {
    return rules::math::per_lane([](auto... v) { return Op::f(v...); }, x, y...);
  } else {
    return Op::f(x, y...);
  }
}

// ---- leaves ------------------------------------------------------------------------------

/// Argument I of a compiled function (context slot I).
template <int I>
struct Arg : Node {
  static constexpr int arg_index = I;
  static constexpr int slots = 0;
  static constexpr bool weak = false;
  static constexpr bool costly = false;
  template <DType D> static constexpr DType dtype() { return D; }
  template <DType D> static constexpr bool valid() { return true; }
  template <DType D> static constexpr bool uniform() { return simd_dtype(D); }
  template <int S, DType D, class V, class L, class C>
  SC_ALWAYS_INLINE V get(const C& c, std::int64_t i) const {
    return to<V>(load_slot<I, D, L>(c, i));
  }
};

/// A tensor held by handle (sc::stage, or a Tensor operand of a staged op): one slot.
struct Leaf : Node {
  Tensor t;
  static constexpr int slots = 1;
  static constexpr bool weak = false;
  static constexpr bool costly = false;
  template <DType D> static constexpr DType dtype() { return D; }
  template <DType D> static constexpr bool valid() { return true; }
  template <DType D> static constexpr bool uniform() { return simd_dtype(D); }
  template <int S, DType D, class V, class L, class C>
  SC_ALWAYS_INLINE V get(const C& c, std::int64_t i) const {
    return to<V>(load_slot<S, D, L>(c, i));
  }
};

/// A C++ scalar: weak, it takes its consumer's dtype (as eager's weak scalars).
template <class S>
struct Const : Node {
  using value_type = S;
  S v{};
  static constexpr int slots = 0;
  static constexpr bool weak = true;
  static constexpr bool costly = false;
  static constexpr ScalarKind skind = scalar_kind<S>();
  template <DType D> static constexpr bool valid() { return true; }
  template <DType D> static constexpr bool uniform() { return true; }
  template <int, DType, class V, class L, class C>
  SC_ALWAYS_INLINE V get(const C&, std::int64_t) const {
    return constant<V>(v);
  }
};

/// A compile-time integer constant (0 and 1 in derivatives: their products and sums simplify
/// away while the gradient expression is built).
template <int K>
struct Int : Node {
  static constexpr int slots = 0;
  static constexpr bool weak = true;
  static constexpr bool costly = false;
  static constexpr ScalarKind skind = ScalarKind::integer;
  template <DType D> static constexpr bool valid() { return true; }
  template <DType D> static constexpr bool uniform() { return true; }
  template <int, DType, class V, class L, class C>
  SC_ALWAYS_INLINE V get(const C&, std::int64_t) const {
    return constant<V>(K);
  }
};
using Zero = Int<0>;

template <class N>
inline constexpr bool is_const = false;
template <class S>
inline constexpr bool is_const<Const<S>> = true;
using One = Int<1>;

// ---- elementwise nodes -------------------------------------------------------------------

/// The dtype two operands compute in under eager's rules (weak operands follow the other).
template <class A, class B, DType D>
constexpr DType common_dtype() {
  if constexpr (A::weak && B::weak) return DType::f32;  // not used: the node is weak itself
  else if constexpr (A::weak) return promote_scalar(B::template dtype<D>(), A::skind);
  else if constexpr (B::weak) return promote_scalar(A::template dtype<D>(), B::skind);
  else return promote(A::template dtype<D>(), B::template dtype<D>());
}
template <class A, class B>
constexpr ScalarKind weak_kind() {
  return A::skind < B::skind ? B::skind : A::skind;
}

/// Op(a) for a unary eager op struct (ops::Tanh, ...), whose rule (rules.hpp) is the math.
template <class Op, class A>
struct Map1 : Node {
  using op_type = Op;
  A a;
  static constexpr Kind kind = kind_of<Op>();
  static constexpr int slots = A::slots;
  static constexpr bool weak = A::weak;
  static constexpr ScalarKind skind = [] {
    if constexpr (A::weak) return to_bool(kind) ? ScalarKind::boolean : A::skind;
    else return ScalarKind::floating;
  }();
  static constexpr bool costly = A::costly || kind == Kind::unary_floating;
  static constexpr int cost = A::cost + (kind == Kind::unary_floating ? costly_cost : cheap_cost);

  template <DType D> static constexpr DType compute() {
    const DType d = A::template dtype<D>();
    return kind == Kind::unary_floating && !is_floating(d) ? DType::f32 : d;
  }
  template <DType D> static constexpr DType dtype() { return to_bool(kind) ? DType::b8 : compute<D>(); }
  // a weak node's operand may still hold a tensor's values (a weak where's condition)
  template <DType D> static constexpr bool valid() {
    if constexpr (weak) return A::template valid<D>();
    else return A::template valid<D>() && !(kind == Kind::unary_numeric && compute<D>() == DType::b8);
  }
  template <DType D> static constexpr bool uniform() {
    if constexpr (weak) return A::template uniform<D>();
    else return A::template uniform<D>() && compute<D>() == D;
  }

  template <int S, DType D, class V, class L, class C>
  SC_ALWAYS_INLINE V get(const C& c, std::int64_t i) const {
    if constexpr (weak) {
      return to<V>(Op::f(a.template get<S, D, V, L>(c, i)));
    } else {
      using CV = native_t<L, compute<D>()>;
      return to<V>(rounded(apply_rule<Op>(a.template get<S, D, CV, L>(c, i))));
    }
  }
};

/// Op(a, b) for a binary eager op struct, with eager's promotion and weak scalars.
template <class Op, class A, class B>
struct Map2 : Node {
  using op_type = Op;
  A a;
  B b;
  static constexpr Kind kind = kind_of<Op>();
  static constexpr int slots = A::slots + B::slots;
  static constexpr bool weak = A::weak && B::weak;
  static constexpr ScalarKind skind = [] {
    if constexpr (weak) return to_bool(kind) ? ScalarKind::boolean : weak_kind<A, B>();
    else return ScalarKind::floating;
  }();
  static constexpr bool costly = A::costly || B::costly || !Op::vectorizes;
  static constexpr int cost =
      A::cost + B::cost + (kind == Kind::floating || !Op::vectorizes ? costly_cost : cheap_cost);

  template <DType D> static constexpr DType compute() {
    const DType d = common_dtype<A, B, D>();
    return kind == Kind::floating && !is_floating(d) ? DType::f32 : d;
  }
  template <DType D> static constexpr DType dtype() { return to_bool(kind) ? DType::b8 : compute<D>(); }
  template <DType D> static constexpr bool valid() {
    if constexpr (weak) return A::template valid<D>() && B::template valid<D>();
    else
      return A::template valid<D>() && B::template valid<D>() &&
             !(kind == Kind::arithmetic && compute<D>() == DType::b8);
  }
  template <DType D> static constexpr bool uniform() {
    if constexpr (weak) return A::template uniform<D>() && B::template uniform<D>();
    else return A::template uniform<D>() && B::template uniform<D>() && compute<D>() == D;
  }

  template <int S, DType D, class V, class L, class C>
  SC_ALWAYS_INLINE V get(const C& c, std::int64_t i) const {
    // operands in order, as separate statements: a shared sub-expression is bound by the first
    // occurrence evaluated (cse.hpp), so the order must be the one the rewrite assumed
    if constexpr (weak) {
      const V x = a.template get<S, D, V, L>(c, i);
      const V y = b.template get<S + A::slots, D, V, L>(c, i);
      return to<V>(Op::f(x, y));
    } else {
      using CV = native_t<L, compute<D>()>;
      if constexpr (ordered_constant_form<CV> && L::ordered > 0) {
        // max/min with a constant checked before the loop: the rule's short forms
        const CV x = a.template get<S, D, CV, L>(c, i), k = b.template get<S + A::slots, D, CV, L>(c, i);
        if constexpr (L::ordered == 2) return to<V>(CV(Op::f_ordered_nonzero_b(x, k)));
        else return to<V>(CV(Op::f_ordered_b(x, k)));
      } else {
        const CV x = a.template get<S, D, CV, L>(c, i);
        const CV y = b.template get<S + A::slots, D, CV, L>(c, i);
        return to<V>(rounded(apply_rule<Op>(x, y)));
      }
    }
  }

  template <class CV>
  static constexpr bool ordered_constant_form =
      (std::is_same_v<Op, ops::Maximum> || std::is_same_v<Op, ops::Minimum>) && is_batch<CV> &&
      std::is_floating_point_v<rules::element_t<CV>> && is_const<B>;
};

/// where(cond, a, b): cond read as truth, a and b promoted together (weak scalars follow). With
/// both branches weak (where(x > 0, 1, 0) in a derivative) the node is weak: it takes its
/// consumer's type, and only the condition has a dtype of its own. A weak condition (b == 0 for
/// a scalar b, in pow's derivative) is computed in the type the branches are, then read as truth:
/// a comparison's operands are values, never masks.
template <class Cn, class A, class B>
struct Select : Node {
  Cn c;
  A a;
  B b;
  static constexpr int slots = Cn::slots + A::slots + B::slots;
  static constexpr bool weak = A::weak && B::weak;
  static constexpr ScalarKind skind = [] {
    if constexpr (weak) return weak_kind<A, B>();
    else return ScalarKind::floating;
  }();
  static constexpr bool costly = Cn::costly || A::costly || B::costly;
  static constexpr int cost = Cn::cost + A::cost + B::cost + cheap_cost;

  template <DType D> static constexpr DType dtype() { return common_dtype<A, B, D>(); }
  template <DType D> static constexpr bool valid() {
    return Cn::template valid<D>() && A::template valid<D>() && B::template valid<D>();
  }
  template <DType D> static constexpr bool cond_uniform() {
    if constexpr (Cn::weak) return Cn::template uniform<D>();
    else return is_d_or_bool(Cn::template dtype<D>(), D) && Cn::template uniform<D>();
  }
  template <DType D> static constexpr bool uniform() {
    // a weak branch may be a where of its own whose condition holds a tensor's values
    if constexpr (weak) return cond_uniform<D>() && A::template uniform<D>() && B::template uniform<D>();
    else return cond_uniform<D>() && A::template uniform<D>() && B::template uniform<D>() && dtype<D>() == D;
  }

  template <int S, DType D, class V, class L, class C>
  SC_ALWAYS_INLINE V get(const C& cx, std::int64_t i) const {
    using M = native_t<L, DType::b8>;
    if constexpr (weak) {
      const M m = cond<S, D, M, V, L>(cx, i);
      const V x = a.template get<S + Cn::slots, D, V, L>(cx, i);
      const V y = b.template get<S + Cn::slots + A::slots, D, V, L>(cx, i);
      return rules::Where::f(m, x, y);
    } else {
      using CV = native_t<L, dtype<D>()>;
      const M m = cond<S, D, M, CV, L>(cx, i);
      const CV x = a.template get<S + Cn::slots, D, CV, L>(cx, i);
      const CV y = b.template get<S + Cn::slots + A::slots, D, CV, L>(cx, i);
      return to<V>(rules::Where::f(m, x, y));
    }
  }
  /// The condition as a mask M; a weak one computed in the branches' type CV first.
  template <int S, DType D, class M, class CV, class L, class C>
  SC_ALWAYS_INLINE M cond(const C& cx, std::int64_t i) const {
    if constexpr (Cn::weak && !is_mask<CV> && !std::is_same_v<CV, bool>) return to<M>(c.template get<S, D, CV, L>(cx, i));
    else return c.template get<S, D, M, L>(cx, i);
  }
};

/// cast(a, X).
template <DType X, class A>
struct Convert : Node {
  static constexpr DType convert_to = X;
  A a;
  static constexpr int slots = A::slots;
  static constexpr bool weak = false;
  static constexpr bool costly = A::costly;
  static constexpr int cost = A::cost + cheap_cost;
  template <DType D> static constexpr DType dtype() { return X; }
  template <DType D> static constexpr bool valid() { return A::template valid<D>(); }
  template <DType D> static constexpr bool uniform() {
    if constexpr (A::weak) return is_d_or_bool(X, D) && A::template uniform<D>();
    else return is_d_or_bool(X, D) && is_d_or_bool(A::template dtype<D>(), D) && A::template uniform<D>();
  }
  template <int S, DType D, class V, class L, class C>
  SC_ALWAYS_INLINE V get(const C& c, std::int64_t i) const {
    return to<V>(a.template get<S, D, native_t<L, X>, L>(c, i));
  }
};

// ---- materializing nodes -----------------------------------------------------------------

/// A non-elementwise op (matmul, a reduction, softmax, conv2d): its operands are evaluated
/// first, the op runs on them, and its result is read by the fused expression around it as a
/// slot. M is the op: a small struct with `name`, its attributes and `Tensor run(Tensors...)`.
template <class M, class... A>
struct Mat : Node {
  using op_type = M;
  M m;
  std::tuple<A...> args;
  static constexpr int slots = 1;
  static constexpr bool weak = false;
  static constexpr bool costly = false;
  template <DType D> static constexpr DType dtype() { return D; }  // checked when the slot is filled
  template <DType D> static constexpr bool valid() { return true; }
  template <DType D> static constexpr bool uniform() { return simd_dtype(D); }
  template <int S, DType D, class V, class L, class C>
  SC_ALWAYS_INLINE V get(const C& c, std::int64_t i) const {
    return to<V>(load_slot<S, D, L>(c, i));
  }
};

/// The root of a gradient: the adjoint expression A in argument I's dtype, summed (or broadcast)
/// to its shape. F is the differentiated expression: the adjoint has its shape (the seed is
/// ones of F's shape), which a constant adjoint cannot tell.
template <int I, class A, class F>
struct GradRoot : Node {
  static constexpr int grad_arg = I;
  using Adj = A;
  A a;
  F fwd;
  static constexpr int slots = A::slots;
  static constexpr bool weak = false;
  static constexpr bool costly = A::costly;
  static constexpr int cost = A::cost;
  // the fused loop counts argument I as read (uses_arg below), so D, every slot's dtype, is its
  // argument's dtype
  template <DType D> static constexpr DType dtype() { return D; }
  template <DType D> static constexpr bool valid() { return A::template valid<D>(); }
  template <DType D> static constexpr bool uniform() {
    if constexpr (A::weak) return simd_dtype(D) && A::template uniform<D>();
    else return A::template uniform<D>() && A::template dtype<D>() == D;
  }
  template <int S, DType D, class V, class L, class C>
  SC_ALWAYS_INLINE V get(const C& c, std::int64_t i) const {
    return to<V>(a.template get<S, D, native_t<L, D>, L>(c, i));
  }
};

// ---- structure ---------------------------------------------------------------------------

/// Whether node N uses argument I: in its own fused loop only (Deep false), or also through a
/// materialized operand (Deep true).
template <int I, class N, bool Deep>
struct uses_arg : std::false_type {};
template <int I, bool Deep>
struct uses_arg<I, Arg<I>, Deep> : std::true_type {};
template <int I, class Op, class A, bool Deep>
struct uses_arg<I, Map1<Op, A>, Deep> : uses_arg<I, A, Deep> {};
template <int I, class Op, class A, class B, bool Deep>
struct uses_arg<I, Map2<Op, A, B>, Deep> : std::bool_constant<uses_arg<I, A, Deep>::value || uses_arg<I, B, Deep>::value> {};
template <int I, class Cn, class A, class B, bool Deep>
struct uses_arg<I, Select<Cn, A, B>, Deep>
    : std::bool_constant<uses_arg<I, Cn, Deep>::value || uses_arg<I, A, Deep>::value || uses_arg<I, B, Deep>::value> {};
template <int I, DType X, class A, bool Deep>
struct uses_arg<I, Convert<X, A>, Deep> : uses_arg<I, A, Deep> {};
// a gradient's root reads its argument's dtype (its result has it), so its fused loop counts
// the argument as read: the loop then runs only where that dtype is the graph's
template <int I, int J, class A, class F>
struct uses_arg<I, GradRoot<J, A, F>, false> : std::bool_constant<I == J || uses_arg<I, A, false>::value> {};
template <int I, int J, class A, class F>
struct uses_arg<I, GradRoot<J, A, F>, true> : uses_arg<I, A, true> {};
template <int I, class M, class... A>
struct uses_arg<I, Mat<M, A...>, true> : std::bool_constant<(uses_arg<I, A, true>::value || ...)> {};

/// Whether node N reads argument I in its own fused loop (not through a materialized operand).
template <int I, class N>
using reads_arg = uses_arg<I, N, false>;
/// Whether node N depends on argument I at all (through materialized operands too).
template <int I, class N>
using depends_on = uses_arg<I, N, true>;

/// Number of compiled-function arguments an expression reads (1 + the highest index).
template <class N>
struct arg_count : std::integral_constant<int, 0> {};
template <int I>
struct arg_count<Arg<I>> : std::integral_constant<int, I + 1> {};
template <class Op, class A>
struct arg_count<Map1<Op, A>> : arg_count<A> {};
template <class Op, class A, class B>
struct arg_count<Map2<Op, A, B>> : std::integral_constant<int, std::max(arg_count<A>::value, arg_count<B>::value)> {};
template <class Cn, class A, class B>
struct arg_count<Select<Cn, A, B>>
    : std::integral_constant<int, std::max({arg_count<Cn>::value, arg_count<A>::value, arg_count<B>::value})> {};
template <DType X, class A>
struct arg_count<Convert<X, A>> : arg_count<A> {};
template <class M, class... A>
struct arg_count<Mat<M, A...>> : std::integral_constant<int, std::max({0, arg_count<A>::value...})> {};
template <int I, class A, class F>
struct arg_count<GradRoot<I, A, F>>
    : std::integral_constant<int, std::max({I + 1, arg_count<A>::value, arg_count<F>::value})> {};

/// Whether the graph has max/min with a constant operand, and whether every such constant is not
/// NaN (then the loop takes their short form: SimdLane's Ordered).
template <class N>
constexpr bool has_minmax_const() {
  if constexpr (requires { typename N::op_type; } && requires(const N& n) { n.b; }) {
    using Op = typename N::op_type;
    using A = decltype(std::declval<N>().a);
    using B = decltype(std::declval<N>().b);
    return ((std::is_same_v<Op, ops::Maximum> || std::is_same_v<Op, ops::Minimum>) && is_const<B>) ||
           has_minmax_const<A>() || has_minmax_const<B>();
  } else if constexpr (requires(const N& n) { n.c; }) {
    return has_minmax_const<decltype(std::declval<N>().c)>() || has_minmax_const<decltype(std::declval<N>().a)>() ||
           has_minmax_const<decltype(std::declval<N>().b)>();
  } else if constexpr (requires(const N& n) { n.a; } && !requires(const N& n) { n.m; }) {
    return has_minmax_const<decltype(std::declval<N>().a)>();
  } else {
    return false;
  }
}
/// 2 when no max/min constant of the graph is NaN or zero as T (the loop's element type: a double
/// 1e-50 is a zero in an f32 loop), 1 when none is NaN, else 0 (rules::ordered_level).
template <class T, class N>
int minmax_consts_ordered(const N& n) {
  if constexpr (!has_minmax_const<N>()) {
    return 2;
  } else if constexpr (requires { typename N::op_type; } && requires { n.b; }) {
    using Op = typename N::op_type;
    using B = decltype(n.b);
    int level = std::min(minmax_consts_ordered<T>(n.a), minmax_consts_ordered<T>(n.b));
    if constexpr ((std::is_same_v<Op, ops::Maximum> || std::is_same_v<Op, ops::Minimum>) && is_const<B>)
      level = std::min(level, rules::ordered_level(static_cast<T>(n.b.v)));
    return level;
  } else if constexpr (requires { n.c; }) {
    return std::min({minmax_consts_ordered<T>(n.c), minmax_consts_ordered<T>(n.a), minmax_consts_ordered<T>(n.b)});
  } else {
    return minmax_consts_ordered<T>(n.a);
  }
}

/// A node that reads no tensor at all (a constant expression of scalars).
template <class N>
inline constexpr bool constant_node = N::slots == 0 && arg_count<N>::value == 0;

/// Number of nodes (the size of the graph the type spells).
template <class N>
struct node_count : std::integral_constant<int, 1> {};
template <class Op, class A>
struct node_count<Map1<Op, A>> : std::integral_constant<int, 1 + node_count<A>::value> {};
template <class Op, class A, class B>
struct node_count<Map2<Op, A, B>> : std::integral_constant<int, 1 + node_count<A>::value + node_count<B>::value> {};
template <class Cn, class A, class B>
struct node_count<Select<Cn, A, B>>
    : std::integral_constant<int, 1 + node_count<Cn>::value + node_count<A>::value + node_count<B>::value> {};
template <DType X, class A>
struct node_count<Convert<X, A>> : std::integral_constant<int, 1 + node_count<A>::value> {};
template <class M, class... A>
struct node_count<Mat<M, A...>> : std::integral_constant<int, 1 + (0 + ... + node_count<A>::value)> {};
template <int I, class A, class F>
struct node_count<GradRoot<I, A, F>> : std::integral_constant<int, 1 + node_count<A>::value> {};

}  // namespace staging
}  // namespace stagecraft
