// Evaluating a staged expression: fill its slots (tensors, materialized operands), infer its
// shape, then run one fused loop over the output; or, where the fused loop does not apply
// (leaves of different dtypes, a tape recording, a trace, a shape or dtype error), run the same
// graph op by op through the eager ops, which gives eager's numbers and eager's errors.
//
// The fused loop: SIMD batches of the shared dtype when every value of the graph is that dtype or
// a mask (uniform<D>), else one element at a time; linear when every slot has the output's layout
// (or is a single element), rows of a collapsed strided walk otherwise; threaded over the output
// for large sizes; streaming stores for outputs too large to stay in cache. A reduction at the
// root reduces while it evaluates: no intermediate tensor.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "../autodiff/tape.hpp"
#include "../core/creation.hpp"
#include "../eager/context.hpp"
#include "../ops/broadcast_to.hpp"
#include "../ops/cast.hpp"
#include "../ops/reduce.hpp"
#include "../ops/where.hpp"
#include "cse.hpp"
#include "expr.hpp"

namespace stagecraft::staging {

/// The arguments of a compiled call (none for sc::eval) and the user's line.
template <int NA>
struct Env {
  std::array<Tensor, NA> args;
  std::source_location loc;
};
/// The tensors the fused loop reads: arguments, leaves, materialized operands.
template <int NS>
struct Slots {
  std::array<Tensor, NS> t;
  Tensor& operator[](int k) { return t[static_cast<std::size_t>(k)]; }
  const Tensor& operator[](int k) const { return t[static_cast<std::size_t>(k)]; }
};

template <int NA, class E>
Tensor run(const E& e, const Env<NA>& env);

// ---- materialized operands ---------------------------------------------------------------

/// A node evaluated on its own (an operand of a materializing op).
template <int NA, class N>
Tensor evaluate(const N& n, const Env<NA>& env) {
  if constexpr (requires { n.t; }) return n.t;
  else return run<NA>(n, env);
}
template <int I, int NA>
Tensor evaluate(const Arg<I>&, const Env<NA>& env) {
  return env.args[I];
}

template <int NA, class M, class... A>
Tensor materialize(const Mat<M, A...>& n, const Env<NA>& env) {
  return std::apply([&](const auto&... a) { return n.m.run(env.loc, evaluate<NA>(a, env)...); }, n.args);
}

// ---- slots -------------------------------------------------------------------------------

template <int S, int NA, int NS, int I>
void fill(const Arg<I>&, const Env<NA>&, Slots<NS>&) {}
template <int S, int NA, int NS>
void fill(const Leaf& n, const Env<NA>&, Slots<NS>& sl) {
  sl[S] = n.t;
}
template <int S, int NA, int NS, class V>
void fill(const Const<V>&, const Env<NA>&, Slots<NS>&) {}
template <int S, int NA, int NS, int K>
void fill(const Int<K>&, const Env<NA>&, Slots<NS>&) {}
template <int S, int NA, int NS, class Op, class A>
void fill(const Map1<Op, A>& n, const Env<NA>& env, Slots<NS>& sl) {
  fill<S>(n.a, env, sl);
}
template <int S, int NA, int NS, class Op, class A, class B>
void fill(const Map2<Op, A, B>& n, const Env<NA>& env, Slots<NS>& sl) {
  fill<S>(n.a, env, sl);
  fill<S + A::slots>(n.b, env, sl);
}
template <int S, int NA, int NS, class Cn, class A, class B>
void fill(const Select<Cn, A, B>& n, const Env<NA>& env, Slots<NS>& sl) {
  fill<S>(n.c, env, sl);
  fill<S + Cn::slots>(n.a, env, sl);
  fill<S + Cn::slots + A::slots>(n.b, env, sl);
}
template <int S, int NA, int NS, DType X, class A>
void fill(const Convert<X, A>& n, const Env<NA>& env, Slots<NS>& sl) {
  fill<S>(n.a, env, sl);
}
template <int S, int NA, int NS, class M, class... A>
void fill(const Mat<M, A...>& n, const Env<NA>& env, Slots<NS>& sl) {
  sl[S] = materialize<NA>(n, env);
}
template <int S, int NA, int NS, int I, class A, class F>
void fill(const GradRoot<I, A, F>& n, const Env<NA>& env, Slots<NS>& sl) {
  fill<S>(n.a, env, sl);
}

/// The slots of expression e: the arguments, then its leaves and materialized operands.
template <int NA, class E>
Slots<NA + E::slots> make_slots(const E& e, const Env<NA>& env) {
  Slots<NA + E::slots> sl;
  for (int k = 0; k < NA; ++k) sl[k] = env.args[k];
  fill<NA>(e, env, sl);
  return sl;
}

// ---- shapes (false where eager would raise: the eager run then raises it) -----------------

template <int S, int NA, int NS, int I>
bool shape_of(const Arg<I>&, const Env<NA>& env, const Slots<NS>&, Shape& out) {
  out = env.args[I].shape();
  return true;
}
template <int S, int NA, int NS>
bool shape_of(const Leaf&, const Env<NA>&, const Slots<NS>& sl, Shape& out) {
  out = sl[S].shape();
  return true;
}
template <int S, int NA, int NS, class N>
  requires(constant_node<N> && N::weak)
bool shape_of(const N&, const Env<NA>&, const Slots<NS>&, Shape& out) {
  out = Shape{};
  return true;
}
template <int S, int NA, int NS, class Op, class A>
bool shape_of(const Map1<Op, A>& n, const Env<NA>& env, const Slots<NS>& sl, Shape& out) {
  return shape_of<S>(n.a, env, sl, out);
}
template <int S, int NA, int NS, class Op, class A, class B>
bool shape_of(const Map2<Op, A, B>& n, const Env<NA>& env, const Slots<NS>& sl, Shape& out) {
  Shape a, b;
  return shape_of<S>(n.a, env, sl, a) && shape_of<S + A::slots>(n.b, env, sl, b) && broadcast_shapes(a, b, out);
}
template <int S, int NA, int NS, class Cn, class A, class B>
bool shape_of(const Select<Cn, A, B>& n, const Env<NA>& env, const Slots<NS>& sl, Shape& out) {
  Shape c, a, b, ab;
  return shape_of<S>(n.c, env, sl, c) && shape_of<S + Cn::slots>(n.a, env, sl, a) &&
         shape_of<S + Cn::slots + A::slots>(n.b, env, sl, b) && broadcast_shapes(a, b, ab) &&
         broadcast_shapes(c, ab, out);
}
template <int S, int NA, int NS, DType X, class A>
bool shape_of(const Convert<X, A>& n, const Env<NA>& env, const Slots<NS>& sl, Shape& out) {
  return shape_of<S>(n.a, env, sl, out);
}
template <int S, int NA, int NS, class M, class... A>
bool shape_of(const Mat<M, A...>&, const Env<NA>&, const Slots<NS>& sl, Shape& out) {
  out = sl[S].shape();
  return true;
}
/// The shape of a node evaluated on its own (a materialized operand is computed for it): the
/// shape a gradient's adjoint has.
template <int NA, class N>
bool own_shape(const N& n, const Env<NA>& env, Shape& out) {
  return shape_of<NA>(n, env, make_slots<NA>(n, env), out);
}

template <int NA, int I, class A, class F>
bool own_shape(const GradRoot<I, A, F>&, const Env<NA>& env, Shape& out) {
  out = env.args[I].shape();
  return true;
}

/// A gradient fuses when its adjoint, which has the differentiated expression's shape, broadcasts
/// up to the argument's shape without summing.
template <int S, int NA, int NS, int I, class A, class F>
bool shape_of(const GradRoot<I, A, F>& n, const Env<NA>& env, const Slots<NS>& sl, Shape& out) {
  Shape a, f, af, b;
  out = env.args[I].shape();
  return shape_of<S>(n.a, env, sl, a) && own_shape<NA>(n.fwd, env, f) && broadcast_shapes(a, f, af) && af == f &&
         broadcast_shapes(f, out, b) && b == out;
}

// ---- the eager path ----------------------------------------------------------------------

template <int S, int NA, int NS, class N>
Tensor eager_of(const N& n, const Env<NA>& env, const Slots<NS>& sl);

/// A weak node as a tensor of dtype d (a scalar, or where the node reads tensors, their shape).
template <int S, int NA, int NS, class N>
Tensor eager_weak(const N& n, const Env<NA>& env, const Slots<NS>& sl, DType d) {
  const auto& loc = env.loc;
  if constexpr (constant_node<N>) {
    return visit_dtype(d, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T v = n.template get<0, DType::f64, T, ScalarLane<true>>(Ctx<1>{}, 0);
      return full(Shape{}, static_cast<double>(v), d, loc);
    });
  } else if constexpr (requires { n.c; }) {  // a weak select: where(cond, k1, k2)
    using Cn = decltype(n.c);
    using A = decltype(n.a);
    return where(eager_of<S>(n.c, env, sl), eager_weak<S + Cn::slots>(n.a, env, sl, d),
                 eager_weak<S + Cn::slots + A::slots>(n.b, env, sl, d), loc);
  } else if constexpr (requires { n.b; }) {
    using A = decltype(n.a);
    using Op = typename N::op_type;
    return detail::dispatch2<Op>(eager_weak<S>(n.a, env, sl, d), eager_weak<S + A::slots>(n.b, env, sl, d), {}, loc);
  } else {
    using Op = typename N::op_type;
    const Tensor x = eager_weak<S>(n.a, env, sl, d);
    return detail::dispatch<Op>({&x, 1}, {}, loc);
  }
}

template <int S, int NA, int NS, class N>
Tensor eager_of(const N& n, const Env<NA>& env, const Slots<NS>& sl) {
  const auto& loc = env.loc;
  if constexpr (requires { N::arg_index; }) {
    return env.args[N::arg_index];
  } else if constexpr (std::is_same_v<N, Leaf> || requires { n.m; }) {
    return sl[S];
  } else if constexpr (requires { N::grad_arg; }) {
    const Tensor& x = env.args[N::grad_arg];
    if constexpr (std::is_same_v<typename N::Adj, Zero>) return zeros(x.shape(), x.dtype(), loc);
    Tensor g;
    if constexpr (N::Adj::weak) g = eager_weak<S>(n.a, env, sl, x.dtype());
    else g = eager_of<S>(n.a, env, sl);
    if (g.dtype() != x.dtype()) g = cast(g, x.dtype(), loc);
    Shape f, full;  // the adjoint has the differentiated expression's shape
    if (!own_shape<NA>(n.fwd, env, f) || !broadcast_shapes(g.shape(), f, full) || !broadcast_shapes(full, x.shape(), full))
      detail::fail<ShapeError>("grad", loc, "gradient of shape ", g.shape(), " for an argument of shape ", x.shape());
    if (full != g.shape()) g = broadcast_to(g, full, loc);
    return detail::sum_to(g, x.shape(), "grad", loc);
  } else if constexpr (requires { n.c; }) {
    using Cn = decltype(n.c);
    using A = decltype(n.a);
    using B = decltype(n.b);
    const Tensor c = eager_of<S>(n.c, env, sl);
    if constexpr (A::weak) {
      const Tensor b = eager_of<S + Cn::slots + A::slots>(n.b, env, sl);
      return where(c, eager_weak<S + Cn::slots>(n.a, env, sl, promote_scalar(b.dtype(), A::skind)), b, loc);
    } else if constexpr (B::weak) {
      const Tensor a = eager_of<S + Cn::slots>(n.a, env, sl);
      return where(c, a, eager_weak<S + Cn::slots + A::slots>(n.b, env, sl, promote_scalar(a.dtype(), B::skind)), loc);
    } else {
      return where(c, eager_of<S + Cn::slots>(n.a, env, sl), eager_of<S + Cn::slots + A::slots>(n.b, env, sl), loc);
    }
  } else if constexpr (requires { N::convert_to; }) {
    return cast(eager_of<S>(n.a, env, sl), N::convert_to, loc);
  } else if constexpr (requires { n.b; }) {
    using Op = typename N::op_type;
    using A = decltype(n.a);
    using B = decltype(n.b);
    if constexpr (A::weak) {
      const Tensor b = eager_of<S + A::slots>(n.b, env, sl);
      return detail::dispatch2<Op>(eager_weak<S>(n.a, env, sl, promote_scalar(b.dtype(), A::skind)), b, {}, loc);
    } else if constexpr (B::weak) {
      const Tensor a = eager_of<S>(n.a, env, sl);
      return detail::dispatch2<Op>(a, eager_weak<S + A::slots>(n.b, env, sl, promote_scalar(a.dtype(), B::skind)), {}, loc);
    } else {
      return detail::dispatch2<Op>(eager_of<S>(n.a, env, sl), eager_of<S + A::slots>(n.b, env, sl), {}, loc);
    }
  } else {
    using Op = typename N::op_type;
    const Tensor x = eager_of<S>(n.a, env, sl);
    return detail::dispatch<Op>({&x, 1}, {}, loc);
  }
}

// ---- the fused loop ----------------------------------------------------------------------

/// Stores a native value (batch, mask or scalar) to y[0, W) or, in a tail, y[0, r).
template <class L, class R, class V>
SC_ALWAYS_INLINE void store_value(R* y, const V& v, std::int64_t r, bool nt) {
  if constexpr (is_batch<V>) {
    if constexpr (L::tail) backend::cpu::store_partial(y, v, r);
    else if (nt) backend::cpu::store_stream(y, v);
    else v.store_unaligned(y);
  } else if constexpr (is_mask<V>) {
    if constexpr (L::tail) {
      bool t[V::size];
      v.store_unaligned(t);
      for (std::int64_t k = 0; k < r; ++k) y[k] = t[k];
    } else {
      v.store_unaligned(y);
    }
  } else {
    *y = v;
  }
}

template <class C>
inline constexpr int NS_of = 0;
template <int NS, int NF>
inline constexpr int NS_of<Ctx<NS, NF>> = NS;

/// A context for the r (< W) elements from position i on: each slot that streams (stride 1) is
/// copied into a zero-padded batch of pad, so the graph's full-batch code reads them at
/// position 0 (the tail costs no second instantiation of the graph); repeated slots stay.
template <class T, std::int64_t W, bool Dense, class C>
SC_ALWAYS_INLINE C padded_tail(const C& c, std::int64_t i, std::int64_t r, T (*pad)[W]) {
  C tc = c;
  for (int k = 0; k < NS_of<C>; ++k) {
    if (c.p[k] == nullptr || (!Dense && c.s[k] == 0)) continue;
    const T* src = static_cast<const T*>(c.p[k]) + i;
    for (std::int64_t j = 0; j < W; ++j) pad[k][j] = j < r ? src[j] : T(0);
    tc.p[k] = pad[k];
  }
  return tc;
}

/// y[b, e) of expression e over SIMD or scalar lanes L (positions relative to the slots' bases);
/// NT: streaming stores. Callers pass a copy of the expression local to their thread: its
/// constants then provably do not alias the output, and stay in registers across the loop.
template <class L, int S, DType D, bool NT, class E, class C, class R>
SC_ALWAYS_INLINE void range(const E& e, C& c, R* y, std::int64_t b, std::int64_t end) {
  constexpr DType OD = E::template dtype<D>();
  if constexpr (L::simd) {
    using T = typename L::elem;
    using V = native_t<L, OD>;
    constexpr std::int64_t W = L::width;
    std::int64_t i = b;
    for (; i + W <= end; i += W) store_value<L>(y + i, e.template get<S, D, V, L>(c, i), W, NT);
    if constexpr (NT) backend::cpu::stream_fence();
    if (i < end) {
      // the last partial batch: the same instantiation of the graph, on zero-padded copies
      alignas(64) T pad[NS_of<C> > 0 ? NS_of<C> : 1][W];
      C tc = padded_tail<T, W, L::dense>(c, i, end - i, pad);
      using LT = SimdLane<T, L::dense, true, L::ordered>;
      store_value<LT>(y + i, e.template get<S, D, V, L>(tc, 0), end - i, false);
    }
  } else {
    for (std::int64_t i = b; i < end; ++i) y[i] = e.template get<S, D, R, L>(c, i);
  }
}

/// The slots the fused loop reads: every non-argument slot, and the arguments the graph reads
/// outside materialized operands.
template <int NS>
struct Used {
  bool u[NS > 0 ? NS : 1] = {};
  constexpr bool operator[](int k) const { return u[k]; }
};
template <int NA, class E>
constexpr Used<NA + E::slots> used_slots() {
  Used<NA + E::slots> u{};
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((u.u[I] = reads_arg<I, E>::value), ...);
  }(std::make_integer_sequence<int, NA>{});
  for (int k = NA; k < NA + E::slots; ++k) u.u[k] = true;
  return u;
}

/// How the slots' layouts relate to the output.
enum class Layout { dense, linear, strided };

template <int NS>
Layout layout_of(const Slots<NS>& sl, const Used<NS>& used, std::int64_t n) {
  Layout l = Layout::dense;
  for (int k = 0; k < NS; ++k) {
    if (!used[k]) continue;
    const std::int64_t m = sl[k].numel();
    if (m == n) continue;
    if (m == 1) l = Layout::linear;
    else return Layout::strided;
  }
  return l;
}

template <DType D, int NA, class E, int NS = NA + E::slots>
Tensor fused(const E& e, const Slots<NS>& sl, const Used<NS>& used, const Shape& shape) {
  constexpr DType OD = E::template dtype<D>();
  using R = ctype_t<OD>;
  Tensor out = detail::empty_tensor(shape, OD, Device::cpu());
  const std::int64_t n = out.numel();
  if (n == 0) return out;
  R* y = static_cast<R*>(out.raw_data());
  // shared sub-expressions bound once per batch (cse.hpp); the kernel runs the rewritten graph
  const auto shared = cse(e);
  using X = std::remove_cvref_t<decltype(shared)>;
  Ctx<NS, frame_slots<E>> c;
  const Layout lay = layout_of<NS>(sl, used, n);
  for (int k = 0; k < NS; ++k) {
    c.p[k] = used[k] ? sl[k].raw_data() : nullptr;
    c.s[k] = used[k] && sl[k].numel() == n ? 1 : 0;
  }
  const std::int64_t grain = E::costly ? backend::cpu::grain_costly : backend::cpu::grain_cheap;
  constexpr bool simd = E::template uniform<D>() && simd_dtype(D);
  using T = std::conditional_t<simd, ctype_t<D>, float>;
  if (lay != Layout::strided) {
    const bool nt = simd && lay == Layout::dense && backend::cpu::stream_output(y, n);
    auto loop = [&](auto ordered) {
      constexpr int O = decltype(ordered)::value;
      backend::cpu::parallel_for(n, grain, [&](std::int64_t b, std::int64_t end) {
        auto cc = c;
        const X local = shared;
        if (lay == Layout::dense) {
          using L = std::conditional_t<simd, SimdLane<T, true, false, O>, ScalarLane<false>>;
          if (nt) range<L, NA, D, true>(local, cc, y, b, end);
          else range<L, NA, D, false>(local, cc, y, b, end);
        } else {
          using L = std::conditional_t<simd, SimdLane<T, false, false, O>, ScalarLane<false>>;
          range<L, NA, D, false>(local, cc, y, b, end);
        }
      });
    };
    // a loop without NaN tests for max/min constants, where none is NaN (checked here, once)
    if constexpr (simd && has_minmax_const<E>()) {
      switch (minmax_consts_ordered(e)) {
        case 2: loop(std::integral_constant<int, 2>{}); break;
        case 1: loop(std::integral_constant<int, 1>{}); break;
        default: loop(std::integral_constant<int, 0>{});
      }
    } else {
      loop(std::integral_constant<int, 0>{});
    }
    return out;
  }
  // Broadcasting: rows of the collapsed walk; each slot's row starts at its own offset.
  std::array<Shape, NS> shapes;
  const Shape* ins[NS];
  for (int k = 0; k < NS; ++k) {
    shapes[k] = used[k] ? sl[k].shape() : shape;
    ins[k] = &shapes[k];
  }
  const backend::cpu::StridedPlan<NS> p = backend::cpu::collapse<NS>(shape, ins);
  const int r = p.shape.rank();
  const std::int64_t len = p.shape[r - 1], rows = n / len;
  for (int k = 0; k < NS; ++k) c.s[k] = p.strides[k][r - 1];
  constexpr std::size_t item = itemsize(D);
  backend::cpu::parallel_for(rows, std::max<std::int64_t>(1, grain / len), [&](std::int64_t rb, std::int64_t re) {
    auto cc = c;
    const X local = shared;
    backend::cpu::for_each_row<NS>(p, rb, re, [&](const std::int64_t* off, std::int64_t o, std::int64_t l) {
      for (int k = 0; k < NS; ++k)
        if (used[k]) cc.p[k] = static_cast<const char*>(c.p[k]) + off[k] * static_cast<std::int64_t>(item);
      using L = std::conditional_t<simd, SimdLane<T, false>, ScalarLane<false>>;
      range<L, NA, D, false>(local, cc, y + o, 0, l);
    });
  });
  return out;
}

/// Whether the fused loop may run here: no tape recording (it would not see the ops), no trace
/// (the eager ops stage themselves into it), every slot a concrete CPU tensor of one dtype.
template <int NS>
bool fusable(const Slots<NS>& sl, const Used<NS>& used, DType& d) {
  const detail::Context& ctx = detail::context();
  if (ctx.tapes != nullptr || ctx.trace != nullptr) return false;
  bool have = false;
  for (int k = 0; k < NS; ++k) {
    if (!used[k]) continue;
    const Tensor& t = sl[k];
    if (!t.defined() || t.is_symbolic() || !t.device().is_cpu()) return false;
    if (!have) d = t.dtype(), have = true;
    else if (t.dtype() != d) return false;
  }
  return have;
}

template <int NA, class E>
Tensor run_elementwise(const E& e, const Env<NA>& env) {
  constexpr int NS = NA + E::slots;
  const Slots<NS> sl = make_slots<NA>(e, env);
  constexpr Used<NS> used = used_slots<NA, E>();
  DType d{};
  Shape shape;
  if (fusable<NS>(sl, used, d) && shape_of<NA>(e, env, sl, shape)) {
    Tensor out;
    visit_dtype(d, [&](auto tag) {
      constexpr DType D = dtype_of<typename decltype(tag)::type>();
      if constexpr (E::template valid<D>()) out = fused<D, NA>(e, sl, used, shape);
    });
    if (out.defined()) return out;
  }
  return eager_of<NA>(e, env, sl);
}

// ---- reductions at the root --------------------------------------------------------------

enum class ReduceKind { sum, mean, max, min };

/// A reduction's attributes (its axes); run() is the eager op.
template <ReduceKind K>
struct ReduceOp {
  std::vector<std::int64_t> axes;
  bool keepdims = false;
  static constexpr ReduceKind kind = K;
  static constexpr std::string_view name = "reduce";
  Tensor run(const std::source_location& loc, const Tensor& x) const {
    if constexpr (K == ReduceKind::sum) return stagecraft::sum(x, axes, keepdims, loc);
    else if constexpr (K == ReduceKind::mean) return stagecraft::mean(x, axes, keepdims, loc);
    else if constexpr (K == ReduceKind::max) return stagecraft::max(x, axes, keepdims, loc);
    else return stagecraft::min(x, axes, keepdims, loc);
  }
};

/// Reduces a floating expression over its trailing axes while evaluating it, in chunks whose
/// partial results combine in a fixed order (the same figures on any thread count). False
/// where this does not apply (the caller then evaluates the operand and reduces it).
template <int NA, ReduceKind K, class A>
bool fused_reduce(const ReduceOp<K>& op, const A& a, const Env<NA>& env, Tensor& out) {
  constexpr int NS = NA + A::slots;
  const Slots<NS> sl = make_slots<NA>(a, env);
  constexpr Used<NS> used = used_slots<NA, A>();
  DType d{};
  Shape shape;
  if (!fusable<NS>(sl, used, d) || !is_floating(d) || !shape_of<NA>(a, env, sl, shape)) return false;
  const int rank = shape.rank();
  std::vector<char> reduced(static_cast<std::size_t>(rank), op.axes.empty() ? 1 : 0);
  for (std::int64_t ax : op.axes) {
    if (ax < -rank || ax >= rank) return false;  // eager raises it
    reduced[static_cast<std::size_t>(ax < 0 ? ax + rank : ax)] = 1;
  }
  int first = rank;  // reduced axes must be the trailing ones
  while (first > 0 && reduced[static_cast<std::size_t>(first - 1)]) --first;
  for (int k = 0; k < first; ++k)
    if (reduced[static_cast<std::size_t>(k)]) return false;
  std::int64_t inner = 1;
  for (int k = first; k < rank; ++k) inner *= shape[k];
  const std::int64_t n = shape.numel();
  if (inner == 0 || n == 0) return false;
  if (layout_of<NS>(sl, used, n) == Layout::strided) return false;
  Shape oshape;
  for (int k = 0; k < rank; ++k)
    if (k < first) oshape.push_back(shape[k]);
    else if (op.keepdims) oshape.push_back(1);
  bool done = false;
  visit_floating(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr DType D = dtype_of<T>();
    if constexpr (A::template valid<D>() && A::template uniform<D>() && A::template dtype<D>() == D) {
      using L = SimdLane<T, false>;
      using B = xsimd::batch<T>;
      constexpr std::int64_t W = B::size;
      constexpr std::int64_t chunk = std::int64_t{1} << 15;
      const std::int64_t outer = n / inner, per_row = (inner + chunk - 1) / chunk, units = outer * per_row;
      constexpr bool is_max = K == ReduceKind::max, is_min = K == ReduceKind::min;
      const T init = is_max ? -std::numeric_limits<T>::infinity()
                            : (is_min ? std::numeric_limits<T>::infinity() : T(0));
      auto combine = [](auto x, auto y) {
        if constexpr (is_max) return decltype(x)(rules::Maximum::f(x, y));
        else if constexpr (is_min) return decltype(x)(rules::Minimum::f(x, y));
        else return decltype(x)(x + y);
      };
      const auto shared = cse(a);
      using X = std::remove_cvref_t<decltype(shared)>;
      Ctx<NS, frame_slots<A>> c;
      for (int k = 0; k < NS; ++k) {
        c.p[k] = used[k] ? sl[k].raw_data() : nullptr;
        c.s[k] = used[k] && sl[k].numel() == n ? 1 : 0;
      }
      std::vector<T> part(static_cast<std::size_t>(units));
      const std::int64_t grain = std::max<std::int64_t>(1, backend::cpu::grain_cheap / std::min(inner, chunk));
      backend::cpu::parallel_for(units, grain, [&](std::int64_t ub, std::int64_t ue) {
        auto cc = c;
        const X local = shared;
        for (std::int64_t u = ub; u < ue; ++u) {
          const std::int64_t row = u / per_row, k0 = (u % per_row) * chunk;
          const std::int64_t b = row * inner + k0, end = row * inner + std::min(inner, k0 + chunk);
          B acc(init);
          std::int64_t i = b;
          for (; i + W <= end; i += W) acc = combine(acc, local.template get<NA, D, B, L>(cc, i));
          alignas(sizeof(B)) T lanes[W];
          acc.store_aligned(lanes);
          T s = lanes[0];
          for (std::int64_t k = 1; k < W; ++k) s = combine(s, lanes[k]);
          if (i < end) {
            alignas(64) T pad[NS > 0 ? NS : 1][W];
            const auto tc = padded_tail<T, W, false>(cc, i, end - i, pad);
            local.template get<NA, D, B, L>(tc, 0).store_aligned(lanes);
            for (std::int64_t k = 0; k < end - i; ++k) s = combine(s, lanes[k]);
          }
          part[static_cast<std::size_t>(u)] = s;
        }
      });
      out = detail::empty_tensor(oshape, D, Device::cpu());
      T* y = static_cast<T*>(out.raw_data());
      for (std::int64_t row = 0; row < outer; ++row) {
        T s = part[static_cast<std::size_t>(row * per_row)];
        for (std::int64_t k = 1; k < per_row; ++k) s = combine(s, part[static_cast<std::size_t>(row * per_row + k)]);
        y[row] = K == ReduceKind::mean ? s / static_cast<T>(inner) : s;
      }
      done = true;
    }
  });
  return done;
}

template <class N>
struct reduce_root : std::false_type {};
template <ReduceKind K, class A>
struct reduce_root<Mat<ReduceOp<K>, A>> : std::true_type {};

template <class N>
inline constexpr bool is_materializing = false;
template <class M, class... A>
inline constexpr bool is_materializing<Mat<M, A...>> = true;

/// Evaluates expression e with the compiled function's arguments in env.
template <int NA, class E>
Tensor run(const E& e, const Env<NA>& env) {
  if constexpr (requires { E::arg_index; }) {
    return env.args[E::arg_index];
  } else if constexpr (std::is_same_v<E, Leaf>) {
    return e.t;
  } else if constexpr (is_materializing<E>) {
    if constexpr (reduce_root<E>::value) {
      const auto& a = std::get<0>(e.args);
      using A = std::remove_cvref_t<decltype(a)>;
      if constexpr (!std::is_same_v<A, Leaf> && !requires { A::arg_index; } && !is_materializing<A>) {
        Tensor out;
        if (fused_reduce<NA>(e.m, a, env, out)) return out;
      }
    }
    return materialize<NA>(e, env);
  } else {
    return run_elementwise<NA>(e, env);
  }
}

}  // namespace stagecraft::staging
