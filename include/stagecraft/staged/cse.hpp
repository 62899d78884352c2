// Common sub-expressions of a staged expression, evaluated once per batch.
//
// A sub-expression type that occurs more than once in the graph (a derivative reuses the forward
// nodes: d tanh(u) = 1 - tanh(u)^2 next to tanh(u) itself) is found at compile time: the
// post-order list of the graph's shareable node types, as a constexpr array of type ids, in which
// a type counted twice or more is shared. The expression is then rewritten: the first occurrence
// to be evaluated becomes Bind<k> (evaluates, keeps the value in frame slot k of the kernel's
// context), the later ones Ref<k> (read slot k). Equal types can hold different values (two
// scalars, two tensors), so each Ref checks once, when the rewrite runs, that its values equal
// the bound occurrence's, and evaluates its own sub-expression otherwise.
//
// Written as constexpr loops over type ids rather than type lists (Boost.Hana did this before):
// the 16-op gradient's list has dozens of entries, and building, de-duplicating and counting
// them as tuple types cost about 3 s of compile time; the array costs next to nothing.
#pragma once
#include <array>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <utility>

#include "expr.hpp"

namespace stagecraft::staging {

/// Bytes of one frame slot: the widest native value (an AVX-512 batch).
inline constexpr std::size_t frame_bytes = 64;

/// Worth sharing: a costly node (a transcendental, a division, a power) with a dtype of its own.
/// Cheap arithmetic is left to be recomputed: sharing it would save less than the frame's store
/// and load, and keeping the candidates few keeps this search quick to compile.
template <class N>
constexpr bool shareable() {
  if constexpr (requires { typename N::op_type; } && requires(const N& n) { n.a; } && !requires(const N& n) { n.m; }) {
    using Op = typename N::op_type;
    if constexpr (N::weak) return false;
    else if constexpr (requires(const N& n) { n.b; })
      return std::is_same_v<Op, ops::Div> || std::is_same_v<Op, ops::Pow> || std::is_same_v<Op, ops::FloorDiv> ||
             std::is_same_v<Op, ops::Mod>;
    else return N::kind == ops::ElementwiseKind::unary_floating;
  } else {
    return false;
  }
}

/// A constant that identifies a type: its name as the compiler prints it (the __PRETTY_FUNCTION__
/// of a function of the type; two names of one length are rarely compared past a short prefix).
/// Not the address of a variable of the type's own: two such addresses do not compare as a
/// constant expression under GCC's -fno-delete-null-pointer-checks, which UBSan's -fsanitize=null
/// turns on.
using TypeId = std::string_view;
template <class T>
constexpr std::string_view pretty_name() {
  return __PRETTY_FUNCTION__;
}
template <class T>
constexpr TypeId type_id() {
  return pretty_name<T>();
}

/// Whether the search stops at N: a leaf, or a materialized operand (one value: its operands are
/// another fused loop's).
template <class N>
constexpr bool cse_leaf() {
  return requires { N::arg_index; } || std::is_same_v<N, Leaf> || requires(const N& n) { n.m; } ||
         !requires(const N& n) { n.a; };
}

/// Number of shareable nodes in N's subtree (the length of its part of the post-order list).
template <class N>
constexpr int shareable_count() {
  constexpr int self = shareable<N>() ? 1 : 0;
  if constexpr (cse_leaf<N>()) return self;
  else if constexpr (requires(const N& n) { n.c; })
    return shareable_count<decltype(N::c)>() + shareable_count<decltype(N::a)>() + shareable_count<decltype(N::b)>() + self;
  else if constexpr (requires(const N& n) { n.b; })
    return shareable_count<decltype(N::a)>() + shareable_count<decltype(N::b)>() + self;
  else return shareable_count<decltype(N::a)>() + self;
}

/// Writes the shareable node types of N's subtree in evaluation order (post-order, operands left
/// to right) to out[k...], advancing k.
template <class N>
constexpr void collect(TypeId* out, int& k) {
  if constexpr (!cse_leaf<N>()) {
    if constexpr (requires(const N& n) { n.c; }) collect<decltype(N::c)>(out, k);
    collect<decltype(N::a)>(out, k);
    if constexpr (requires(const N& n) { n.b; }) collect<decltype(N::b)>(out, k);
  }
  if constexpr (shareable<N>()) out[k++] = type_id<N>();
}

/// The shared sub-expressions of E: list is the post-order list of its shareable types; a type
/// that occurs twice or more gets a frame slot, numbered in the order of first occurrence.
template <class E>
struct CseTable {
  static constexpr int size = shareable_count<E>();
  static constexpr std::array<TypeId, (size > 0 ? size : 1)> list = [] {
    std::array<TypeId, (size > 0 ? size : 1)> a{};
    int k = 0;
    collect<E>(a.data(), k);
    return a;
  }();
  /// The first position of type t in the list (-1 when absent).
  static constexpr int first(TypeId t) {
    for (int i = 0; i < size; ++i)
      if (list[static_cast<std::size_t>(i)] == t) return i;
    return -1;
  }
  /// Whether the type at position i occurs again later.
  static constexpr bool repeated(int i) {
    for (int j = i + 1; j < size; ++j)
      if (list[static_cast<std::size_t>(j)] == list[static_cast<std::size_t>(i)]) return true;
    return false;
  }
  /// Frame slot of type t: the number of shared types whose first occurrence precedes t's (-1
  /// when t is not shared).
  static constexpr int slot(TypeId t) {
    const int f = first(t);
    if (f < 0 || !repeated(f)) return -1;
    int k = 0;
    for (int i = 0; i < f; ++i)
      if (first(list[static_cast<std::size_t>(i)]) == i && repeated(i)) ++k;
    return k;
  }
  static constexpr int slots = [] {
    int k = 0;
    for (int i = 0; i < size; ++i)
      if (first(list[static_cast<std::size_t>(i)]) == i && repeated(i)) ++k;
    return k;
  }();
};

/// Whether two nodes of one type hold the same values (the same scalars, the same tensors).
template <class N>
bool same_values(const N& x, const N& y) {
  if constexpr (is_const<N>) return std::memcmp(&x.v, &y.v, sizeof x.v) == 0;
  else if constexpr (std::is_same_v<N, Leaf>) return x.t.impl() == y.t.impl();
  else if constexpr (requires { x.m; }) return &x == &y;  // materialized: equal only as the same node
  else if constexpr (requires { x.c; }) return same_values(x.c, y.c) && same_values(x.a, y.a) && same_values(x.b, y.b);
  else if constexpr (requires { x.b; }) return same_values(x.a, y.a) && same_values(x.b, y.b);
  else if constexpr (requires { x.a; }) return same_values(x.a, y.a);
  else return true;  // Arg<I>, Int<K>
}

template <class C, class T>
SC_ALWAYS_INLINE void frame_store(const C& c, int k, const T& v) {
  static_assert(sizeof(T) <= frame_bytes);
  std::memcpy(c.frame[k], &v, sizeof(T));
}
template <class T, class C>
SC_ALWAYS_INLINE T frame_load(const C& c, int k) {
  T v;
  std::memcpy(&v, c.frame[k], sizeof(T));
  return v;
}

/// Evaluates m (a rewritten N) and keeps its value in frame slot K.
template <int K, class M>
struct Bind : Node {
  M inner;
  static constexpr int slots = M::slots;
  static constexpr bool weak = false;
  static constexpr bool costly = M::costly;
  template <DType D> static constexpr DType dtype() { return M::template dtype<D>(); }
  template <DType D> static constexpr bool valid() { return M::template valid<D>(); }
  template <DType D> static constexpr bool uniform() { return M::template uniform<D>(); }
  template <int S, DType D, class V, class L, class C>
  SC_ALWAYS_INLINE V get(const C& c, std::int64_t i) const {
    using NV = native_t<L, dtype<D>()>;
    const NV v = inner.template get<S, D, NV, L>(c, i);
    frame_store(c, K, v);
    return to<V>(v);
  }
};

/// Frame slot K, when its values equal the bound occurrence's; else n evaluated here.
template <int K, class N>
struct Ref : Node {
  N n;
  bool cached = true;
  static constexpr int slots = N::slots;
  static constexpr bool weak = false;
  static constexpr bool costly = N::costly;
  template <DType D> static constexpr DType dtype() { return N::template dtype<D>(); }
  template <DType D> static constexpr bool valid() { return N::template valid<D>(); }
  template <DType D> static constexpr bool uniform() { return N::template uniform<D>(); }
  template <int S, DType D, class V, class L, class C>
  SC_ALWAYS_INLINE V get(const C& c, std::int64_t i) const {
    using NV = native_t<L, dtype<D>()>;
    if (SC_LIKELY(cached)) return to<V>(frame_load<NV>(c, K));
    return to<V>(n.template get<S, D, NV, L>(c, i));
  }
};

/// The rewrite. P is the list position of the first shareable node of n's subtree, so a shareable
/// node's own position is P + its subtree's count - 1: the first occurrence of a shared type
/// becomes Bind, the later ones Ref. first[k] is the bound occurrence of slot k, which later
/// occurrences compare their values with (it is rewritten before them: the order is evaluation
/// order).
template <class E>
struct CseRewrite {
  using Table = CseTable<E>;
  const void* first[Table::slots > 0 ? Table::slots : 1] = {};

  template <int P, class N>
  auto go(const N& n) {
    constexpr int k = shareable<N>() ? Table::slot(type_id<N>()) : -1;
    if constexpr (k >= 0 && P + shareable_count<N>() - 1 != Table::first(type_id<N>())) {
      return Ref<k, N>{{}, n, same_values(n, *static_cast<const N*>(first[k]))};
    } else {
      auto m = children<P>(n);
      if constexpr (k >= 0) {
        first[k] = &n;
        return Bind<k, decltype(m)>{{}, m};
      } else {
        return m;
      }
    }
  }

  template <int P, class N>
  auto children(const N& n) {
    if constexpr (cse_leaf<N>()) {
      return n;
    } else if constexpr (requires { n.c; }) {
      constexpr int pa = P + shareable_count<decltype(N::c)>();
      constexpr int pb = pa + shareable_count<decltype(N::a)>();
      auto c = go<P>(n.c);
      auto a = go<pa>(n.a);
      auto b = go<pb>(n.b);
      using R = typename rebind3<N, decltype(c), decltype(a), decltype(b)>::type;
      return R{{}, c, a, b};
    } else if constexpr (requires { n.b; }) {
      auto a = go<P>(n.a);
      auto b = go<P + shareable_count<decltype(N::a)>()>(n.b);
      using R = typename rebind2<N, decltype(a), decltype(b)>::type;
      return R{{}, a, b};
    } else if constexpr (requires { n.fwd; }) {
      auto a = go<P>(n.a);
      using R = typename rebind1<N, decltype(a)>::type;
      return R{{}, a, n.fwd};
    } else {
      auto a = go<P>(n.a);
      using R = typename rebind1<N, decltype(a)>::type;
      return R{{}, a};
    }
  }

  template <class N, class A> struct rebind1;
  template <class Op, class A0, class A> struct rebind1<Map1<Op, A0>, A> { using type = Map1<Op, A>; };
  template <DType X, class A0, class A> struct rebind1<Convert<X, A0>, A> { using type = Convert<X, A>; };
  template <int I, class A0, class F, class A> struct rebind1<GradRoot<I, A0, F>, A> { using type = GradRoot<I, A, F>; };
  template <class N, class A, class B> struct rebind2;
  template <class Op, class A0, class B0, class A, class B> struct rebind2<Map2<Op, A0, B0>, A, B> { using type = Map2<Op, A, B>; };
  template <class N, class C, class A, class B> struct rebind3;
  template <class C0, class A0, class B0, class C, class A, class B> struct rebind3<Select<C0, A0, B0>, C, A, B> {
    using type = Select<C, A, B>;
  };
};

/// E with its shared sub-expressions bound once (E itself when there are none), and the number
/// of frame slots the kernel's context needs.
template <class E>
auto cse(const E& e) {
#ifdef STAGECRAFT_NO_CSE
  return e;
#else
  if constexpr (CseTable<E>::slots == 0) {
    return e;
  } else {
    CseRewrite<E> r;
    return r.template go<0>(e);
  }
#endif
}
#ifdef STAGECRAFT_NO_CSE
template <class E>
inline constexpr int frame_slots = 0;
#else
template <class E>
inline constexpr int frame_slots = CseTable<E>::slots;
#endif

}  // namespace stagecraft::staging
