// Common sub-expressions of a staged expression, evaluated once per batch.
//
// A sub-expression type that occurs more than once in the graph (a derivative reuses the forward
// nodes: d tanh(u) = 1 - tanh(u)^2 next to tanh(u) itself) is found at compile time with Boost.Hana:
// the post-order list of sub-expression types, de-duplicated, filtered to those counted twice or
// more. The expression is then rewritten: the first occurrence to be evaluated becomes Bind<k>
// (evaluates, keeps the value in frame slot k of the kernel's context), the later ones Ref<k>
// (read slot k). Equal types can hold different values (two scalars, two tensors), so each Ref
// checks once, when the rewrite runs, that its values equal the bound occurrence's, and evaluates
// its own sub-expression otherwise.
#pragma once
#include <cstring>
#include <type_traits>
#include <utility>

#include <boost/hana/append.hpp>
#include <boost/hana/concat.hpp>
#include <boost/hana/contains.hpp>
#include <boost/hana/count.hpp>
#include <boost/hana/filter.hpp>
#include <boost/hana/fold_left.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/size.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>

#include "expr.hpp"

namespace stagecraft::staging {

namespace hana = boost::hana;

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
      return std::is_same_v<Op, ops::Div> || std::is_same_v<Op, ops::Pow>;
    else return N::kind == ops::ElementwiseKind::unary_floating;
  } else {
    return false;
  }
}

/// The shareable sub-expression types of N in evaluation order (post-order, operands left to
/// right). A materialized operand is one value: its operands are another fused loop's.
template <class N>
constexpr auto subexpressions() {
  constexpr auto self = [] {
    if constexpr (shareable<N>()) return hana::make_tuple(hana::type_c<N>);
    else return hana::make_tuple();
  }();
  if constexpr (requires { N::arg_index; } || std::is_same_v<N, Leaf> || requires(const N& n) { n.m; }) {
    return self;
  } else if constexpr (requires(const N& n) { n.c; }) {
    using C = decltype(std::declval<N>().c);
    using A = decltype(std::declval<N>().a);
    using B = decltype(std::declval<N>().b);
    return hana::concat(hana::concat(hana::concat(subexpressions<C>(), subexpressions<A>()), subexpressions<B>()), self);
  } else if constexpr (requires(const N& n) { n.b; }) {
    using A = decltype(std::declval<N>().a);
    using B = decltype(std::declval<N>().b);
    return hana::concat(hana::concat(subexpressions<A>(), subexpressions<B>()), self);
  } else if constexpr (requires(const N& n) { n.a; }) {
    using A = decltype(std::declval<N>().a);
    return hana::concat(subexpressions<A>(), self);
  } else {
    return self;  // constants
  }
}

/// The shared sub-expression types of E, in evaluation order (each before any that contains it).
template <class E>
constexpr auto shared_types() {
  constexpr auto all = subexpressions<E>();
  constexpr auto uniq = hana::fold_left(all, hana::make_tuple(), [](auto acc, auto t) {
    if constexpr (decltype(hana::contains(acc, t))::value) return acc;
    else return hana::append(acc, t);
  });
  return hana::filter(uniq, [](auto t) {
    return hana::bool_c<(decltype(hana::count(subexpressions<E>(), t))::value >= 2)>;
  });
}

template <class Shared, class N>
constexpr int shared_index() {
  int k = -1, pos = 0;
  hana::for_each(Shared{}, [&](auto t) {
    if (k < 0 && std::is_same_v<typename decltype(t)::type, N>) k = pos;
    ++pos;
  });
  return k;
}

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

/// The rewrite: returns {the new node, the types bound so far}. first[k] is the bound (first)
/// occurrence of shared type k, which later occurrences compare their values with.
template <class Shared>
struct CseRewrite {
  const void* first[decltype(hana::size(Shared{}))::value > 0 ? decltype(hana::size(Shared{}))::value : 1] = {};

  template <class N, class Seen>
  auto go(const N& n, Seen seen) {
    constexpr int k = shared_index<Shared, N>();
    if constexpr (k >= 0 && decltype(hana::contains(seen, hana::type_c<N>))::value) {
      return std::pair{Ref<k, N>{{}, n, same_values(n, *static_cast<const N*>(first[k]))}, seen};
    } else {
      auto [m, after] = children(n, seen);
      if constexpr (k >= 0) {
        first[k] = &n;
        return std::pair{Bind<k, decltype(m)>{{}, m}, hana::append(after, hana::type_c<N>)};
      } else {
        return std::pair{m, after};
      }
    }
  }

  template <class N, class Seen>
  auto children(const N& n, Seen seen) {
    if constexpr (requires { n.m; } || requires { N::arg_index; } || std::is_same_v<N, Leaf> || !requires { n.a; }) {
      return std::pair{n, seen};
    } else if constexpr (requires { n.c; }) {
      auto [c, s1] = go(n.c, seen);
      auto [a, s2] = go(n.a, s1);
      auto [b, s3] = go(n.b, s2);
      using R = typename rebind3<N, decltype(c), decltype(a), decltype(b)>::type;
      return std::pair{R{{}, c, a, b}, s3};
    } else if constexpr (requires { n.b; }) {
      auto [a, s1] = go(n.a, seen);
      auto [b, s2] = go(n.b, s1);
      using R = typename rebind2<N, decltype(a), decltype(b)>::type;
      return std::pair{R{{}, a, b}, s2};
    } else if constexpr (requires { n.fwd; }) {
      auto [a, s1] = go(n.a, seen);
      using R = typename rebind1<N, decltype(a)>::type;
      return std::pair{R{{}, a, n.fwd}, s1};
    } else {
      auto [a, s1] = go(n.a, seen);
      using R = typename rebind1<N, decltype(a)>::type;
      return std::pair{R{{}, a}, s1};
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
  using Shared = decltype(shared_types<E>());
  if constexpr (decltype(hana::size(Shared{}))::value == 0) {
    return e;
  } else {
    CseRewrite<Shared> r;
    return r.go(e, hana::make_tuple()).first;
  }
#endif
}
#ifdef STAGECRAFT_NO_CSE
template <class E>
inline constexpr int frame_slots = 0;
#else
template <class E>
inline constexpr int frame_slots = static_cast<int>(decltype(hana::size(decltype(shared_types<E>()){}))::value);
#endif

}  // namespace stagecraft::staging
