// sc::compile under nvcc: the staged expression's type becomes one templated CUDA kernel, compiled
// with the user's file (no NVRTC, no trace). Included by staged.hpp only where nvcc compiles a
// user's file and stagecraft has its CUDA kernels; a host compiler can include it to run the same
// per-element program on the CPU (`run_on_host`, what the tests compare with the fused loop).
//
// The expression E is lowered to a device program: a tree of small trivially copyable nodes that
// keeps only what the kernel needs (slot numbers, the constants' values, each op's rule), with the
// dtype rules read from E's own nodes at compile time, so the kernel computes in the types the
// CPU's scalar loop does. Each op's math is its rules.hpp functor: on the GPU the device copy of
// the rules (stagecraft::device_rules, compiled by nvcc for scalars), on the host the rules
// themselves. Slots (arguments, leaves, materialized operands) are read with broadcasting: each
// is dense in the output's order, a single element, or strided over the output's axes.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <tuple>
#include <type_traits>
#include <source_location>

#include "../backend/cuda/abi.hpp"
#include "../backend/cuda/runtime.hpp"
#include "../core/dtype.hpp"
#include "../core/shape.hpp"
#include "../core/tensor.hpp"
#include "../ops/binary.hpp"
#include "../ops/rules.hpp"
#include "eval.hpp"
#include "expr.hpp"

#if defined(__CUDACC__)
#define SC_GPU_FN __host__ __device__ __forceinline__
#define SC_GPU_UNROLL _Pragma("unroll")
#else
#define SC_GPU_FN inline
#define SC_GPU_UNROLL
#endif

namespace stagecraft::staging::gpu {

// ---- the rules the program calls ----------------------------------------------------------

#if defined(__CUDACC__) && !defined(STAGECRAFT_KERNELS) && !defined(__CUDACC_RTC__)
namespace rule_math = device_rules::math;
using WhereRule = device_rules::Where;
// An op struct derives from its rule (ops::Tanh from rules::Tanh): overload resolution on the base
// picks the device copy of the same rule. Declared only, for decltype.
#define SC_GPU_PICK_RULE(R) device_rules::R pick_rule(const rules::R*);
SC_CUDA_UNARY_RULES(SC_GPU_PICK_RULE)
SC_CUDA_BINARY_RULES(SC_GPU_PICK_RULE)
#undef SC_GPU_PICK_RULE
/// The rule of op Op that device code calls.
template <class Op>
using rule_t = decltype(pick_rule(static_cast<const Op*>(nullptr)));
#else
namespace rule_math = rules::math;
using WhereRule = rules::Where;
template <class Op>
using rule_t = Op;
#endif

/// x as V, as the CPU's scalar loop converts (staging::to): truth for bool; a floating value
/// converted to an integer as rules::math::batch_cast defines it (NaN and out of range give the
/// lowest value, what x86 gives), which the CPU leaves to the instruction.
template <class V, class X>
SC_GPU_FN V conv(X x) {
  if constexpr (std::is_same_v<V, X>) return x;
  else if constexpr (std::is_same_v<V, bool>) return !(x == X(0));
  else return rule_math::batch_cast<V>(x);
}

// ---- geometry --------------------------------------------------------------------------------

inline constexpr int max_rank = cuda::abi::max_rank;
/// How a slot is read: its element i (dense in the output's order), its only element, or at the
/// offset its strides give for the output's coordinates.
enum class Read : unsigned char { dense, single, strided };

/// The slots of the program and the output's shape, as the kernel reads them (by value).
template <int NS, class Idx>
struct Geometry {
  const void* p[NS > 0 ? NS : 1] = {};
  Idx stride[NS > 0 ? NS : 1][max_rank] = {};
  Read read[NS > 0 ? NS : 1] = {};
  Idx shape[max_rank] = {};
  int rank = 0;
  bool strided = false;  ///< some slot is Read::strided
  Idx n = 0;
};

/// The slots at one output position: their base pointers and element offsets.
template <class Idx>
struct At {
  const void* const* p;
  const Idx* off;
  template <int K, DType D>
  SC_GPU_FN ctype_t<D> load() const {
    return static_cast<const ctype_t<D>*>(p[K])[off[K]];
  }
};

/// Whether the elementwise kernel reads and writes 16 bytes per access where it can (default on;
/// off: one element per access, for comparisons). The generated kernels of traced functions have
/// their own switch (graph::cuda_vector_loads).
inline bool& vector_loads() {
  static bool on = true;
  return on;
}

/// Lanes of one 16-byte access to elements of T.
template <class T>
inline constexpr int lanes_v = static_cast<int>(16 / sizeof(T));
/// W elements of T moved as one access (16 bytes for the slots; W * sizeof(T) for the result).
template <class T, int W>
struct alignas(sizeof(T) * W) Chunk {
  T v[W];
};

/// The slots at lane `lane` of W consecutive output elements (the 16-byte kernel): the dense
/// slots' W values loaded beforehand, one access each; a single-element slot read from memory.
template <class T, int NS, int W>
struct LaneAt {
  const T (*vals)[W];
  const void* const* p;
  const Read* read;
  int lane;
  template <int K, DType D>
  SC_GPU_FN T load() const {
    static_assert(std::is_same_v<ctype_t<D>, T>, "stagecraft: every slot of a kernel has the expression's dtype");
    return read[K] == Read::dense ? vals[K][lane] : static_cast<const T*>(p[K])[0];
  }
};

// ---- the device program ----------------------------------------------------------------------

/// The value of node N's compute dtype (and result dtype) for the expression's dtype D: read from
/// the staged node at compile time (a constant, which device code may use).
template <class N, DType D>
inline constexpr DType compute_v = N::template compute<D>();
template <class N, DType D>
inline constexpr DType dtype_v = N::template dtype<D>();

/// Slot K (an argument, a tensor leaf or a materialized operand), of the expression's dtype.
template <int K>
struct PSlot {
  template <DType D, class V, class AtT>
  SC_GPU_FN V get(const AtT& at) const {
    return conv<V>(at.template load<K, D>());
  }
};
/// A C++ scalar (weak: read in its consumer's type V, as staging::constant).
template <class S>
struct PConst {
  S v;
  template <DType D, class V, class AtT>
  SC_GPU_FN V get(const AtT&) const {
    return static_cast<V>(v);
  }
};
/// A compile-time integer.
template <int K>
struct PInt {
  template <DType D, class V, class AtT>
  SC_GPU_FN V get(const AtT&) const {
    return static_cast<V>(K);
  }
};
/// rule(a), N the staged Map1 node (its weak flag and compute dtype).
template <class N, class R, class A>
struct PMap1 {
  A a;
  template <DType D, class V, class AtT>
  SC_GPU_FN V get(const AtT& at) const {
    if constexpr (N::weak) {
      return conv<V>(R::f(a.template get<D, V>(at)));
    } else {
      using CV = ctype_t<compute_v<N, D>>;
      return conv<V>(R::f(a.template get<D, CV>(at)));
    }
  }
};
/// rule(a, b), N the staged Map2 node.
template <class N, class R, class A, class B>
struct PMap2 {
  A a;
  B b;
  template <DType D, class V, class AtT>
  SC_GPU_FN V get(const AtT& at) const {
    if constexpr (N::weak) {
      const V x = a.template get<D, V>(at);
      const V y = b.template get<D, V>(at);
      return conv<V>(R::f(x, y));
    } else {
      using CV = ctype_t<compute_v<N, D>>;
      const CV x = a.template get<D, CV>(at);
      const CV y = b.template get<D, CV>(at);
      return conv<V>(R::f(x, y));
    }
  }
};
/// where(c, a, b), N the staged Select node; a weak condition is computed in the branches' type
/// first, as Select::cond does.
template <class N, class C, class A, class B>
struct PSelect {
  C c;
  A a;
  B b;
  template <DType D, class CV, class AtT>
  SC_GPU_FN bool cond(const AtT& at) const {
    if constexpr (decltype(N::c)::weak) return conv<bool>(c.template get<D, CV>(at));
    else return c.template get<D, bool>(at);
  }
  template <DType D, class V, class AtT>
  SC_GPU_FN V get(const AtT& at) const {
    if constexpr (N::weak) {
      const bool m = cond<D, V>(at);
      const V x = a.template get<D, V>(at);
      const V y = b.template get<D, V>(at);
      return WhereRule::f(m, x, y);
    } else {
      using CV = ctype_t<dtype_v<N, D>>;
      const bool m = cond<D, CV>(at);
      const CV x = a.template get<D, CV>(at);
      const CV y = b.template get<D, CV>(at);
      return conv<V>(WhereRule::f(m, x, y));
    }
  }
};
/// a read as dtype X (cast), or as the expression's dtype (X = D: a gradient's root).
template <DType X, bool AsD, class A>
struct PConvert {
  A a;
  template <DType D, class V, class AtT>
  SC_GPU_FN V get(const AtT& at) const {
    using CV = ctype_t<AsD ? D : X>;
    return conv<V>(a.template get<D, CV>(at));
  }
};

/// lower<N, S>: node N, whose slots start at S, as a device program node (`type`, `make`).
template <class N, int S>
struct lower {
  static_assert(always_false<N>, "stagecraft: sc::compile on the GPU: a node kind the CUDA kernel does not know");
};
template <int I, int S>
struct lower<Arg<I>, S> {
  using type = PSlot<I>;
  static type make(const Arg<I>&) { return {}; }
};
template <int S>
struct lower<Leaf, S> {
  using type = PSlot<S>;
  static type make(const Leaf&) { return {}; }
};
template <class M, class... A, int S>
struct lower<Mat<M, A...>, S> {
  using type = PSlot<S>;
  static type make(const Mat<M, A...>&) { return {}; }
};
template <class V, int S>
struct lower<Const<V>, S> {
  using type = PConst<V>;
  static type make(const Const<V>& n) { return {n.v}; }
};
template <int K, int S>
struct lower<Int<K>, S> {
  using type = PInt<K>;
  static type make(const Int<K>&) { return {}; }
};
template <class Op, class A, int S>
struct lower<Map1<Op, A>, S> {
  using LA = lower<A, S>;
  using type = PMap1<Map1<Op, A>, rule_t<Op>, typename LA::type>;
  static type make(const Map1<Op, A>& n) { return {LA::make(n.a)}; }
};
template <class Op, class A, class B, int S>
struct lower<Map2<Op, A, B>, S> {
  using LA = lower<A, S>;
  using LB = lower<B, S + A::slots>;
  using type = PMap2<Map2<Op, A, B>, rule_t<Op>, typename LA::type, typename LB::type>;
  static type make(const Map2<Op, A, B>& n) { return {LA::make(n.a), LB::make(n.b)}; }
};
template <class Cn, class A, class B, int S>
struct lower<Select<Cn, A, B>, S> {
  using LC = lower<Cn, S>;
  using LA = lower<A, S + Cn::slots>;
  using LB = lower<B, S + Cn::slots + A::slots>;
  using type = PSelect<Select<Cn, A, B>, typename LC::type, typename LA::type, typename LB::type>;
  static type make(const Select<Cn, A, B>& n) { return {LC::make(n.c), LA::make(n.a), LB::make(n.b)}; }
};
template <DType X, class A, int S>
struct lower<Convert<X, A>, S> {
  using LA = lower<A, S>;
  using type = PConvert<X, false, typename LA::type>;
  static type make(const Convert<X, A>& n) { return {LA::make(n.a)}; }
};
template <int I, class A, class F, int S>
struct lower<GradRoot<I, A, F>, S> {
  using LA = lower<A, S>;
  using type = PConvert<DType::b8, true, typename LA::type>;
  static type make(const GradRoot<I, A, F>& n) { return {LA::make(n.a)}; }
};

/// Output element i of program e (result type R, the expression's dtype D).
template <DType D, class R, class P, int NS, class Idx>
SC_GPU_FN R element(const P& e, const Geometry<NS, Idx>& g, Idx i) {
  Idx off[NS > 0 ? NS : 1];
  for (int k = 0; k < NS; ++k) off[k] = g.read[k] == Read::dense ? i : Idx(0);
  if (g.strided) {
    Idx rest = i;
    for (int d = g.rank - 1; d >= 0; --d) {
      const Idx c = rest % g.shape[d];
      rest /= g.shape[d];
      for (int k = 0; k < NS; ++k)
        if (g.read[k] == Read::strided) off[k] += c * g.stride[k][d];
    }
  }
  return e.template get<D, R>(At<Idx>{g.p, off});
}

/// Output elements [v W, v W + W) of program e, W = lanes_v of the expression's type: each dense
/// slot read as one 16-byte access, the W results written as one access. Needs vector_ok(g, y).
template <DType D, class R, class P, int NS, class Idx>
SC_GPU_FN void vector_step(const P& e, const Geometry<NS, Idx>& g, Idx v, R* y) {
  using T = ctype_t<D>;
  constexpr int W = lanes_v<T>;
  T vals[NS > 0 ? NS : 1][W];
  SC_GPU_UNROLL
  for (int k = 0; k < NS; ++k) {
    if (g.read[k] != Read::dense) continue;
    const Chunk<T, W> c = static_cast<const Chunk<T, W>*>(g.p[k])[v];
    SC_GPU_UNROLL
    for (int l = 0; l < W; ++l) vals[k][l] = c.v[l];
  }
  Chunk<R, W> out;
  SC_GPU_UNROLL
  for (int l = 0; l < W; ++l) out.v[l] = e.template get<D, R>(LaneAt<T, NS, W>{vals, g.p, g.read, l});
  reinterpret_cast<Chunk<R, W>*>(y)[v] = out;
}

/// Whether vector_step may run over g into y: on (vector_loads()), no slot strided, every dense
/// slot aligned to 16 bytes and y to its chunk's size.
template <DType D, class R, int NS, class Idx>
bool vector_ok(const Geometry<NS, Idx>& g, const R* y) {
  using T = ctype_t<D>;
  if (!vector_loads() || g.strided) return false;
  if (reinterpret_cast<std::uintptr_t>(y) % alignof(Chunk<R, lanes_v<T>>) != 0) return false;
  for (int k = 0; k < NS; ++k)
    if (g.read[k] == Read::dense && reinterpret_cast<std::uintptr_t>(g.p[k]) % 16 != 0) return false;
  return true;
}

/// The geometry of the used slots over an output of `shape` (slots already broadcast-checked).
template <class Idx, int NS>
Geometry<NS, Idx> geometry(const Slots<NS>& sl, const Used<NS>& used, const Shape& shape) {
  Geometry<NS, Idx> g;
  g.rank = shape.rank();
  g.n = static_cast<Idx>(shape.numel());
  for (int d = 0; d < g.rank; ++d) g.shape[d] = static_cast<Idx>(shape[d]);
  for (int k = 0; k < NS; ++k) {
    g.read[k] = Read::single;
    if (!used[k]) continue;
    const Tensor& t = sl[k];
    g.p[k] = t.raw_data();
    const std::int64_t m = t.numel();
    if (m == shape.numel()) {
      g.read[k] = Read::dense;
    } else if (m != 1) {
      g.read[k] = Read::strided;
      g.strided = true;
      const Shape& s = t.shape();
      std::int64_t step = 1;
      for (int j = s.rank() - 1, d = g.rank - 1; j >= 0; --j, --d) {
        g.stride[k][d] = s[j] == 1 ? Idx(0) : static_cast<Idx>(step);
        step *= s[j];
      }
    }
  }
  return g;
}

/// Threads per block of the kernels (and of the host's emulation of the reduction's tree).
inline constexpr int kernel_block = 256;
/// The most blocks a launch of the kernels has (a grid-stride loop takes the rest).
inline constexpr std::int64_t max_blocks = std::int64_t{1} << 20;

/// True when the kernels over n elements may index with 32-bit integers: every index a thread
/// forms stays below 2^31, the step past the last element of a grid-stride loop (up to a whole
/// grid, max_blocks * kernel_block) included; beyond, i += step would overflow and wrap negative.
constexpr bool index32_fits(std::int64_t n) {
  return n <= std::int64_t{std::numeric_limits<std::int32_t>::max()} - max_blocks * kernel_block;
}

// ---- reductions at the root ----------------------------------------------------------------

template <class T>
inline constexpr T infinity_v = std::numeric_limits<T>::infinity();

/// How two partial results of reduction K combine (max and min propagate NaN, as on the CPU).
template <ReduceKind K, class T>
SC_GPU_FN T combine(T x, T y) {
  if constexpr (K == ReduceKind::max) return rule_t<ops::Maximum>::f(x, y);
  else if constexpr (K == ReduceKind::min) return rule_t<ops::Minimum>::f(x, y);
  else return x + y;
}
template <ReduceKind K, class T>
SC_GPU_FN T reduce_init() {
  if constexpr (K == ReduceKind::max) return -infinity_v<T>;
  else if constexpr (K == ReduceKind::min) return infinity_v<T>;
  else return T(0);
}
/// Thread t's partial of output row `row`: the row's elements t, t + threads, ... (t is a thread
/// of the row's block in the kernel, a loop index in the host's emulation).
template <DType D, ReduceKind K, class P, int NS, class Idx>
SC_GPU_FN ctype_t<D> row_partial(const P& e, const Geometry<NS, Idx>& g, Idx row, Idx inner, int t, int threads) {
  using T = ctype_t<D>;
  T acc = reduce_init<K, T>();
  for (Idx k = static_cast<Idx>(t); k < inner; k += static_cast<Idx>(threads))
    acc = combine<K>(acc, element<D, T>(e, g, row * inner + k));
  return acc;
}
/// The row's result from its combined partials (the mean divides by the row's length).
template <ReduceKind K, class T, class Idx>
SC_GPU_FN T finish(T s, Idx inner) {
  if constexpr (K == ReduceKind::mean) return s / static_cast<T>(inner);
  else return s;
}
/// Output row `row` computed on the host as the kernel computes it: kernel_block partials
/// combined by the same pairwise tree (the same figures, bit for bit, as the GPU's order).
template <DType D, ReduceKind K, class P, int NS, class Idx>
ctype_t<D> reduce_row_on_host(const P& e, const Geometry<NS, Idx>& g, Idx row, Idx inner) {
  using T = ctype_t<D>;
  T part[kernel_block];
  for (int t = 0; t < kernel_block; ++t) part[t] = row_partial<D, K>(e, g, row, inner, t, kernel_block);
  for (int s = kernel_block / 2; s > 0; s >>= 1)
    for (int t = 0; t < s; ++t) part[t] = combine<K>(part[t], part[t + s]);
  return finish<K>(part[0], inner);
}

/// A reduction at the root (sum, mean, max, min over trailing axes) computed on the host as the
/// kernel does; an undefined Tensor where the kernel would not run.
template <int NA, class M, class A, unsigned DS>
Tensor reduce_on_host(const Mat<M, A>& e, const Env<NA, DS>& env) {
  Tensor out;
  const A& a = std::get<0>(e.args);
  if constexpr (!std::is_same_v<A, Leaf> && !requires { A::arg_index; } && !is_materializing<A>) {
    constexpr ReduceKind K = M::kind;
    staging::reduce_with<NA>(e.m, a, env, false,
                    [&](auto dc, const auto& sl, const auto& used, const Shape& shape, std::int64_t inner,
                        const Shape& oshape, Device) {
                      constexpr DType D = decltype(dc)::value;
                      using L = lower<A, NA>;
                      const typename L::type prog = L::make(a);
                      const auto g = geometry<std::int64_t>(sl, used, shape);
                      out = detail::empty_tensor(oshape, D, Device::cpu());
                      auto* y = static_cast<ctype_t<D>*>(out.raw_data());
                      const std::int64_t rows = shape.numel() / inner;
                      for (std::int64_t r = 0; r < rows; ++r) y[r] = reduce_row_on_host<D, K>(prog, g, r, inner);
                      return true;
                    });
  }
  return out;
}

/// Runs program e over every output element on the host: what the kernel computes, one element
/// at a time, or (vector, where vector_ok) as the 16-byte kernel does: W elements a step, then
/// the tail one by one (tests compare both with the fused loop); *vectorized says which ran.
template <DType D, int NA, class E, int NS>
Tensor run_program_on_host(const E& e, const Slots<NS>& sl, const Used<NS>& used, const Shape& shape, bool vector,
                           bool* vectorized) {
  constexpr DType OD = E::template dtype<D>();
  using R = ctype_t<OD>;
  using L = lower<E, NA>;
  const typename L::type prog = L::make(e);
  Tensor out = detail::empty_tensor(shape, OD, Device::cpu());
  const auto g = geometry<std::int64_t>(sl, used, shape);
  R* y = static_cast<R*>(out.raw_data());
  std::int64_t i = 0;
  if (vector && vector_ok<D>(g, y)) {
    constexpr int W = lanes_v<ctype_t<D>>;
    for (std::int64_t v = 0; v < g.n / W; ++v) vector_step<D, R>(prog, g, v, y);
    i = g.n / W * W;
    if (vectorized != nullptr) *vectorized = true;
  }
  for (; i < g.n; ++i) y[i] = element<D, R>(prog, g, i);
  return out;
}

/// Expression e (an elementwise root, or a reduction of one) with the compiled function's
/// arguments in env, evaluated by the device program on the host; an undefined Tensor where the
/// kernel would not run (mixed dtypes or devices, a shape error, a weak root). vector: an
/// elementwise root as the 16-byte kernel computes it, where it would run (then *vectorized is set).
template <int NA, class E, unsigned DS>
Tensor run_on_host(const E& e, const Env<NA, DS>& env, bool vector = false, bool* vectorized = nullptr) {
  if (vectorized != nullptr) *vectorized = false;
  constexpr int NS = NA + E::slots;
  Tensor out;
  if constexpr (reduce_root<E>::value) {
    out = reduce_on_host<NA>(e, env);
  } else if constexpr (!E::weak && !is_materializing<E> && !requires { E::arg_index; } && !std::is_same_v<E, Leaf>) {
    const Slots<NS> sl = make_slots<NA>(e, env);
    constexpr Used<NS> used = used_slots<NA, E>();
    DType d{};
    Shape shape;
    if (fusable<NS>(sl, used, d) && shape_of<NA>(e, env, sl, shape)) {
      visit_dtype(d, [&](auto tag) {
        constexpr DType D = dtype_of<typename decltype(tag)::type>();
        if constexpr (E::template valid<D>()) {
          check_constants<D>(e, E::template dtype<D>(), "compile", env.loc);  // as run_elementwise does
          out = run_program_on_host<D, NA>(e, sl, used, shape, vector, vectorized);
        }
      });
    }
  }
  return out;
}

#if defined(__CUDACC__)

/// One thread per output element (a grid-stride loop past the grid's size).
template <DType D, class R, class P, int NS, class Idx>
__global__ void __launch_bounds__(kernel_block) fused_kernel(const P e, const Geometry<NS, Idx> g, R* __restrict__ y) {
  for (Idx i = static_cast<Idx>(blockIdx.x) * kernel_block + static_cast<Idx>(threadIdx.x); i < g.n;
       i += static_cast<Idx>(gridDim.x) * kernel_block)
    y[i] = element<D, R>(e, g, i);
}

/// W = lanes_v elements per thread and step, 16 bytes per access (vector_step), then the last
/// n % W elements one per thread.
template <DType D, class R, class P, int NS, class Idx>
__global__ void __launch_bounds__(kernel_block) fused_kernel_v(const P e, const Geometry<NS, Idx> g, R* __restrict__ y) {
  constexpr int W = lanes_v<ctype_t<D>>;
  const Idx nv = g.n / W, t = static_cast<Idx>(blockIdx.x) * kernel_block + static_cast<Idx>(threadIdx.x),
            step = static_cast<Idx>(gridDim.x) * kernel_block;
  for (Idx v = t; v < nv; v += step) vector_step<D, R>(e, g, v, y);
  for (Idx i = nv * W + t; i < g.n; i += step) y[i] = element<D, R>(e, g, i);
}

template <DType D, class R, class P, int NS, class Idx>
void launch(const P& prog, const Geometry<NS, Idx>& g, R* y, Device dev, const std::source_location& loc) {
  const cudaStream_t s = static_cast<cudaStream_t>(cuda::detail::stream(dev, "compile", loc));
  const bool vec = vector_ok<D>(g, y);
  const long long work = vec ? static_cast<long long>(g.n) / lanes_v<ctype_t<D>> : static_cast<long long>(g.n);
  const long long blocks = std::clamp<long long>((work + kernel_block - 1) / kernel_block, 1, max_blocks);
  if (vec) fused_kernel_v<D, R, P, NS, Idx><<<static_cast<unsigned>(blocks), kernel_block, 0, s>>>(prog, g, y);
  else fused_kernel<D, R, P, NS, Idx><<<static_cast<unsigned>(blocks), kernel_block, 0, s>>>(prog, g, y);
  cuda::detail::check(static_cast<int>(cudaGetLastError()), dev, "compile", loc);
}

/// One block per output row (a grid-stride loop over rows): each thread's partial, then the
/// pairwise tree in shared memory that reduce_row_on_host repeats on the host.
template <DType D, ReduceKind K, class P, int NS, class Idx>
__global__ void __launch_bounds__(kernel_block)
    reduce_kernel(const P e, const Geometry<NS, Idx> g, Idx rows, Idx inner, ctype_t<D>* __restrict__ y) {
  using T = ctype_t<D>;
  __shared__ T part[kernel_block];
  const int t = static_cast<int>(threadIdx.x);
  for (Idx row = static_cast<Idx>(blockIdx.x); row < rows; row += static_cast<Idx>(gridDim.x)) {
    part[t] = row_partial<D, K>(e, g, row, inner, t, kernel_block);
    __syncthreads();
    for (int s = kernel_block / 2; s > 0; s >>= 1) {
      if (t < s) part[t] = combine<K>(part[t], part[t + s]);
      __syncthreads();
    }
    if (t == 0) y[row] = finish<K>(part[0], inner);
    __syncthreads();
  }
}

template <DType D, ReduceKind K, class P, int NS, class Idx>
void launch_reduce(const P& prog, const Geometry<NS, Idx>& g, std::int64_t rows, std::int64_t inner, ctype_t<D>* y,
                   Device dev, const std::source_location& loc) {
  const cudaStream_t s = static_cast<cudaStream_t>(cuda::detail::stream(dev, "compile", loc));
  const long long blocks = std::min<long long>(rows, max_blocks);
  reduce_kernel<D, K, P, NS, Idx><<<static_cast<unsigned>(blocks), kernel_block, 0, s>>>(
      prog, g, static_cast<Idx>(rows), static_cast<Idx>(inner), y);
  cuda::detail::check(static_cast<int>(cudaGetLastError()), dev, "compile", loc);
}
#endif

}  // namespace stagecraft::staging::gpu

namespace stagecraft::staging {

#if defined(__CUDACC__)
/// The GPU counterpart of fused() (eval.hpp): the expression as one templated kernel on the
/// slots' device, launched on its stream (asynchronous, as every eager launch).
template <DType D, int NA, class E, int NS>
Tensor fused_cuda(const E& e, const Slots<NS>& sl, const Used<NS>& used, const Shape& shape, Device dev,
                  const std::source_location& loc) {
  constexpr DType OD = E::template dtype<D>();
  using R = ctype_t<OD>;
  using L = gpu::lower<E, NA>;
  const cuda::detail::ScopedCallSite site("compile", loc);
  Tensor out = detail::empty_tensor(shape, OD, dev, "compile", loc);
  const std::int64_t n = out.numel();
  if (n == 0) return out;
  const typename L::type prog = L::make(e);
  R* y = static_cast<R*>(out.raw_data());
  // 32-bit indices where every offset fits (a slot has at most the output's elements)
  if (gpu::index32_fits(n))
    gpu::launch<D>(prog, gpu::geometry<std::int32_t>(sl, used, shape), y, dev, loc);
  else
    gpu::launch<D>(prog, gpu::geometry<std::int64_t>(sl, used, shape), y, dev, loc);
  return out;
}

/// The GPU counterpart of fused_reduce (eval.hpp): a reduction over trailing axes of a floating
/// expression as one templated kernel, one block per output row.
template <int NA, ReduceKind K, class A, unsigned DS>
bool fused_reduce_cuda(const ReduceOp<K>& op, const A& a, const Env<NA, DS>& env, Tensor& out) {
  return staging::reduce_with<NA>(op, a, env, true,
                              [&](auto dc, const auto& sl, const auto& used, const Shape& shape, std::int64_t inner,
                                  const Shape& oshape, Device dev) {
                                constexpr DType D = decltype(dc)::value;
                                using L = gpu::lower<A, NA>;
                                const typename L::type prog = L::make(a);
                                const cuda::detail::ScopedCallSite site("compile", env.loc);
                                out = detail::empty_tensor(oshape, D, dev, "compile", env.loc);
                                auto* y = static_cast<ctype_t<D>*>(out.raw_data());
                                const std::int64_t n = shape.numel(), rows = n / inner;
                                if (gpu::index32_fits(n))
                                  gpu::launch_reduce<D, K>(prog, gpu::geometry<std::int32_t>(sl, used, shape), rows, inner, y,
                                                           dev, env.loc);
                                else
                                  gpu::launch_reduce<D, K>(prog, gpu::geometry<std::int64_t>(sl, used, shape), rows, inner, y,
                                                           dev, env.loc);
                                return true;
                              });
}
#endif

}  // namespace stagecraft::staging
