// The part of staged evaluation that the fused loop (eval.hpp) and the op-by-op path share: the
// call's environment and slots, materialized operands, shape inference, the check of C++ integer
// constants against the dtype that reads them, and the op-by-op (eager) path itself, which gives
// eager's numbers and eager's errors where the fused loop does not apply.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "../autodiff/tape.hpp"
#include "../core/creation.hpp"
#include "../eager/context.hpp"
#include "../ops/broadcast_to.hpp"
#include "../ops/cast.hpp"
#include "../ops/fill.hpp"
#include "../ops/reduce.hpp"
#include "../ops/where.hpp"
#include "cse.hpp"
#include "expr.hpp"

namespace stagecraft::staging {

/// The dtypes the fused loop is instantiated for, one bit per DType (sc::compile<sc::f32>(f)
/// narrows it: tensors of other dtypes run op by op, with the same numbers).
inline constexpr unsigned all_dtypes = (1u << (static_cast<unsigned>(DType::f64) + 1)) - 1;
constexpr bool fuses(unsigned ds, DType d) { return (ds >> static_cast<unsigned>(d)) & 1u; }
/// A bit of the dtype set beside the dtypes: the file was compiled by nvcc with stagecraft's CUDA
/// kernels, so a graph of GPU tensors runs as one templated kernel (staged/cuda_kernel.hpp).
/// Part of the type, so a .cu and a .cpp file never share an instantiation that differs.
inline constexpr unsigned nvcc_kernels = 1u << 31;
/// The set a staged call gets in this file: all dtypes, and nvcc_kernels under nvcc. (Internal
/// linkage: its value depends on the compiler of the file.)
#if defined(__CUDACC__) && defined(STAGECRAFT_WITH_CUDA) && !defined(STAGECRAFT_KERNELS)
static constexpr unsigned this_file_kernels = nvcc_kernels;
#else
static constexpr unsigned this_file_kernels = 0;
#endif
static constexpr unsigned default_set = all_dtypes | this_file_kernels;

/// The arguments of a compiled call (none for sc::eval) and the user's line; DS: the fused dtypes.
template <int NA, unsigned DS = default_set>
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

template <int NA, class E, unsigned DS>
Tensor run(const E& e, const Env<NA, DS>& env);

// ---- materialized operands ---------------------------------------------------------------

/// A node evaluated on its own (an operand of a materializing op).
template <int NA, class N, unsigned DS>
Tensor evaluate(const N& n, const Env<NA, DS>& env) {
  if constexpr (requires { n.t; }) return n.t;
  else return run<NA>(n, env);
}
template <int I, int NA, unsigned DS>
Tensor evaluate(const Arg<I>&, const Env<NA, DS>& env) {
  return env.args[I];
}

template <int NA, class M, class... A, unsigned DS>
Tensor materialize(const Mat<M, A...>& n, const Env<NA, DS>& env) {
  return std::apply([&](const auto&... a) { return n.m.run(env.loc, evaluate<NA>(a, env)...); }, n.args);
}

// ---- slots -------------------------------------------------------------------------------

template <int S, int NA, int NS, int I, unsigned DS>
void fill(const Arg<I>&, const Env<NA, DS>&, Slots<NS>&) {}
template <int S, int NA, int NS, unsigned DS>
void fill(const Leaf& n, const Env<NA, DS>&, Slots<NS>& sl) {
  sl[S] = n.t;
}
template <int S, int NA, int NS, class V, unsigned DS>
void fill(const Const<V>&, const Env<NA, DS>&, Slots<NS>&) {}
template <int S, int NA, int NS, int K, unsigned DS>
void fill(const Int<K>&, const Env<NA, DS>&, Slots<NS>&) {}
template <int S, int NA, int NS, class Op, class A, unsigned DS>
void fill(const Map1<Op, A>& n, const Env<NA, DS>& env, Slots<NS>& sl) {
  fill<S>(n.a, env, sl);
}
template <int S, int NA, int NS, class Op, class A, class B, unsigned DS>
void fill(const Map2<Op, A, B>& n, const Env<NA, DS>& env, Slots<NS>& sl) {
  fill<S>(n.a, env, sl);
  fill<S + A::slots>(n.b, env, sl);
}
template <int S, int NA, int NS, class Cn, class A, class B, unsigned DS>
void fill(const Select<Cn, A, B>& n, const Env<NA, DS>& env, Slots<NS>& sl) {
  fill<S>(n.c, env, sl);
  fill<S + Cn::slots>(n.a, env, sl);
  fill<S + Cn::slots + A::slots>(n.b, env, sl);
}
template <int S, int NA, int NS, DType X, class A, unsigned DS>
void fill(const Convert<X, A>& n, const Env<NA, DS>& env, Slots<NS>& sl) {
  fill<S>(n.a, env, sl);
}
template <int S, int NA, int NS, class M, class... A, unsigned DS>
void fill(const Mat<M, A...>& n, const Env<NA, DS>& env, Slots<NS>& sl) {
  sl[S] = materialize<NA>(n, env);
}
template <int S, int NA, int NS, int I, class A, class F, unsigned DS>
void fill(const GradRoot<I, A, F>& n, const Env<NA, DS>& env, Slots<NS>& sl) {
  fill<S>(n.a, env, sl);
}

/// The slots of expression e: the arguments, then its leaves and materialized operands.
template <int NA, class E, unsigned DS>
Slots<NA + E::slots> make_slots(const E& e, const Env<NA, DS>& env) {
  Slots<NA + E::slots> sl;
  for (int k = 0; k < NA; ++k) sl[k] = env.args[k];
  fill<NA>(e, env, sl);
  return sl;
}

// ---- shapes (false where eager would raise: the eager run then raises it) -----------------

template <int S, int NA, int NS, int I, unsigned DS>
bool shape_of(const Arg<I>&, const Env<NA, DS>& env, const Slots<NS>&, Shape& out) {
  out = env.args[I].shape();
  return true;
}
template <int S, int NA, int NS, unsigned DS>
bool shape_of(const Leaf&, const Env<NA, DS>&, const Slots<NS>& sl, Shape& out) {
  out = sl[S].shape();
  return true;
}
template <int S, int NA, int NS, class N, unsigned DS>
  requires(constant_node<N> && N::weak)
bool shape_of(const N&, const Env<NA, DS>&, const Slots<NS>&, Shape& out) {
  out = Shape{};
  return true;
}
template <int S, int NA, int NS, class Op, class A, unsigned DS>
bool shape_of(const Map1<Op, A>& n, const Env<NA, DS>& env, const Slots<NS>& sl, Shape& out) {
  return shape_of<S>(n.a, env, sl, out);
}
template <int S, int NA, int NS, class Op, class A, class B, unsigned DS>
bool shape_of(const Map2<Op, A, B>& n, const Env<NA, DS>& env, const Slots<NS>& sl, Shape& out) {
  Shape a, b;
  return shape_of<S>(n.a, env, sl, a) && shape_of<S + A::slots>(n.b, env, sl, b) && broadcast_shapes(a, b, out);
}
template <int S, int NA, int NS, class Cn, class A, class B, unsigned DS>
bool shape_of(const Select<Cn, A, B>& n, const Env<NA, DS>& env, const Slots<NS>& sl, Shape& out) {
  Shape c, a, b, ab;
  return shape_of<S>(n.c, env, sl, c) && shape_of<S + Cn::slots>(n.a, env, sl, a) &&
         shape_of<S + Cn::slots + A::slots>(n.b, env, sl, b) && broadcast_shapes(a, b, ab) &&
         broadcast_shapes(c, ab, out);
}
template <int S, int NA, int NS, DType X, class A, unsigned DS>
bool shape_of(const Convert<X, A>& n, const Env<NA, DS>& env, const Slots<NS>& sl, Shape& out) {
  return shape_of<S>(n.a, env, sl, out);
}
template <int S, int NA, int NS, class M, class... A, unsigned DS>
bool shape_of(const Mat<M, A...>&, const Env<NA, DS>&, const Slots<NS>& sl, Shape& out) {
  out = sl[S].shape();
  return true;
}
/// The shape of a node evaluated on its own (a materialized operand is computed for it): the
/// shape a gradient's adjoint has.
template <int NA, class N, unsigned DS>
bool own_shape(const N& n, const Env<NA, DS>& env, Shape& out) {
  return shape_of<NA>(n, env, make_slots<NA>(n, env), out);
}

template <int NA, int I, class A, class F, unsigned DS>
bool own_shape(const GradRoot<I, A, F>&, const Env<NA, DS>& env, Shape& out) {
  out = env.args[I].shape();
  return true;
}

/// A gradient fuses when its adjoint, which has the differentiated expression's shape, broadcasts
/// up to the argument's shape without summing.
template <int S, int NA, int NS, int I, class A, class F, unsigned DS>
bool shape_of(const GradRoot<I, A, F>& n, const Env<NA, DS>& env, const Slots<NS>& sl, Shape& out) {
  Shape a, f, af, b;
  out = env.args[I].shape();
  return shape_of<S>(n.a, env, sl, a) && own_shape<NA>(n.fwd, env, f) && broadcast_shapes(a, f, af) && af == f &&
         broadcast_shapes(f, out, b) && b == out;
}

// ---- integer constants (eager's weak-scalar rule: one that does not fit its dtype raises) ---

/// Whether the graph's fused region holds a C++ integer constant (only those can fail to fit).
template <class N>
constexpr bool has_int_const() {
  if constexpr (is_const<N>) return std::is_integral_v<typename N::value_type> && !std::is_same_v<typename N::value_type, bool>;
  else if constexpr (requires(const N& n) { n.m; }) return false;  // its operands are checked when evaluated
  else if constexpr (requires(const N& n) { n.c; })
    return has_int_const<decltype(N::c)>() || has_int_const<decltype(N::a)>() || has_int_const<decltype(N::b)>();
  else if constexpr (requires(const N& n) { n.b; }) return has_int_const<decltype(N::a)>() || has_int_const<decltype(N::b)>();
  else if constexpr (requires(const N& n) { n.a; }) return has_int_const<decltype(N::a)>();
  else return false;
}

/// Integer v read as dtype d: a DTypeError where it would wrap, as eager's weak scalars
/// (detail::weak_scalar) raise; op: the op that reads it.
template <class V>
void check_fits(V v, DType d, std::string_view op, const std::source_location& loc) {
  visit_dtype(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      const T t = static_cast<T>(v);
      if (SC_UNLIKELY(static_cast<V>(t) != v || (t < T(0)) != (v < V(0))))
        detail::integer_misfit(op, loc, v, d, d);
    }
  });
}

/// Checks each integer constant of n's fused region against the dtype it is read in, for the
/// graph's dtype D: a weak node is read in `as` (its consumer's dtype), any other computes in
/// its own; op names the reader.
template <DType D, class N>
void check_constants(const N& n, DType as, std::string_view op, const std::source_location& loc) {
  if constexpr (!has_int_const<N>()) {
    return;
  } else if constexpr (is_const<N>) {
    check_fits(n.v, as, op, loc);
  } else if constexpr (requires { N::grad_arg; }) {
    check_constants<D>(n.a, D, "grad", loc);
  } else if constexpr (requires { N::convert_to; }) {
    check_constants<D>(n.a, N::convert_to, "cast", loc);
  } else if constexpr (requires { n.c; }) {
    const DType t = N::weak ? as : N::template dtype<D>();
    check_constants<D>(n.c, t, "where", loc);
    check_constants<D>(n.a, t, "where", loc);
    check_constants<D>(n.b, t, "where", loc);
  } else {
    const DType t = N::weak ? as : N::template compute<D>();
    check_constants<D>(n.a, t, N::op_type::name, loc);
    if constexpr (requires { n.b; }) check_constants<D>(n.b, t, N::op_type::name, loc);
  }
}

// ---- the eager path ----------------------------------------------------------------------

template <int S, int NA, int NS, class N, unsigned DS>
Tensor eager_of(const N& n, const Env<NA, DS>& env, const Slots<NS>& sl);
template <int S, int NA, int NS, class N, unsigned DS>
Tensor condition(const N& n, const Env<NA, DS>& env, const Slots<NS>& sl, DType d);

/// A weak node as a tensor of dtype d (a scalar, or where the node reads tensors, their shape);
/// op: the op that reads it (named where an integer constant does not fit d).
template <int S, int NA, int NS, class N, unsigned DS>
Tensor eager_weak(const N& n, const Env<NA, DS>& env, const Slots<NS>& sl, DType d, std::string_view op) {
  const auto& loc = env.loc;
  if constexpr (constant_node<N>) {
    check_constants<DType::f64>(n, d, op, loc);  // every node here is weak: it reads d
    return visit_dtype(d, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T v = n.template get<0, DType::f64, T, ScalarLane<true>>(Ctx<1>{}, 0);
      return full(Shape{}, static_cast<double>(v), d, loc);
    });
  } else if constexpr (requires { n.c; }) {  // a weak select: where(cond, k1, k2)
    using Cn = decltype(n.c);
    using A = decltype(n.a);
    return where(condition<S>(n, env, sl, d), eager_weak<S + Cn::slots>(n.a, env, sl, d, "where"),
                 eager_weak<S + Cn::slots + A::slots>(n.b, env, sl, d, "where"), loc);
  } else if constexpr (requires { n.b; }) {
    using A = decltype(n.a);
    using Op = typename N::op_type;
    return detail::dispatch2<Op>(eager_weak<S>(n.a, env, sl, d, Op::name),
                                 eager_weak<S + A::slots>(n.b, env, sl, d, Op::name), {}, loc);
  } else {
    using Op = typename N::op_type;
    const Tensor x = eager_weak<S>(n.a, env, sl, d, Op::name);
    return detail::dispatch<Op>({&x, 1}, {}, loc);
  }
}

/// The condition of select n whose branches are of dtype d: a weak one computed in d first (as
/// Select::cond does in the fused loop).
template <int S, int NA, int NS, class N, unsigned DS>
Tensor condition(const N& n, const Env<NA, DS>& env, const Slots<NS>& sl, DType d) {
  if constexpr (decltype(n.c)::weak) return eager_weak<S>(n.c, env, sl, d, "where");
  else return eager_of<S>(n.c, env, sl);
}

template <int S, int NA, int NS, class N, unsigned DS>
Tensor eager_of(const N& n, const Env<NA, DS>& env, const Slots<NS>& sl) {
  const auto& loc = env.loc;
  if constexpr (requires { N::arg_index; }) {
    return env.args[N::arg_index];
  } else if constexpr (std::is_same_v<N, Leaf> || requires { n.m; }) {
    return sl[S];
  } else if constexpr (requires { N::grad_arg; }) {
    const Tensor& x = env.args[N::grad_arg];
    if constexpr (std::is_same_v<typename N::Adj, Zero>) return detail::fill_on(x.device(), x.shape(), 0.0, x.dtype(), loc);
    Tensor g;
    if constexpr (N::Adj::weak) g = eager_weak<S>(n.a, env, sl, x.dtype(), "grad");
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
    Tensor c;  // a tensor condition first, as before the branches; a weak one in their dtype d
    if constexpr (!Cn::weak) c = eager_of<S>(n.c, env, sl);
    auto cond = [&](DType d) { return Cn::weak ? condition<S>(n, env, sl, d) : c; };
    if constexpr (A::weak) {
      const Tensor b = eager_of<S + Cn::slots + A::slots>(n.b, env, sl);
      const DType d = promote_scalar(b.dtype(), A::skind);
      return where(cond(d), eager_weak<S + Cn::slots>(n.a, env, sl, d, "where"), b, loc);
    } else if constexpr (B::weak) {
      const Tensor a = eager_of<S + Cn::slots>(n.a, env, sl);
      const DType d = promote_scalar(a.dtype(), B::skind);
      return where(cond(d), a, eager_weak<S + Cn::slots + A::slots>(n.b, env, sl, d, "where"), loc);
    } else {
      const Tensor a = eager_of<S + Cn::slots>(n.a, env, sl), b = eager_of<S + Cn::slots + A::slots>(n.b, env, sl);
      return where(cond(promote(a.dtype(), b.dtype())), a, b, loc);
    }
  } else if constexpr (requires { N::convert_to; }) {
    return cast(eager_of<S>(n.a, env, sl), N::convert_to, loc);
  } else if constexpr (requires { n.b; }) {
    using Op = typename N::op_type;
    using A = decltype(n.a);
    using B = decltype(n.b);
    if constexpr (A::weak) {
      const Tensor b = eager_of<S + A::slots>(n.b, env, sl);
      return detail::dispatch2<Op>(eager_weak<S>(n.a, env, sl, promote_scalar(b.dtype(), A::skind), Op::name), b, {}, loc);
    } else if constexpr (B::weak) {
      const Tensor a = eager_of<S>(n.a, env, sl);
      return detail::dispatch2<Op>(a, eager_weak<S + A::slots>(n.b, env, sl, promote_scalar(a.dtype(), B::skind), Op::name),
                                   {}, loc);
    } else {
      return detail::dispatch2<Op>(eager_of<S>(n.a, env, sl), eager_of<S + A::slots>(n.b, env, sl), {}, loc);
    }
  } else {
    using Op = typename N::op_type;
    const Tensor x = eager_of<S>(n.a, env, sl);
    return detail::dispatch<Op>({&x, 1}, {}, loc);
  }
}

}  // namespace stagecraft::staging
