// Evaluating a staged expression: fill its slots (tensors, materialized operands), infer its
// shape, then run one fused loop over the output; or, where the fused loop does not apply
// (leaves of different dtypes, a tape recording, a trace, a shape or dtype error), run the same
// graph op by op through the eager ops, which gives eager's numbers and eager's errors.
//
// The fused loop: SIMD batches of the shared dtype when every value of the graph is that dtype or
// a mask (uniform<D>), else one element at a time (where no floating unary op's scalar math
// would differ from eager's SIMD rule: such graphs run op by op); linear when every slot has the output's layout
// (or is a single element), rows of a collapsed strided walk otherwise; threaded over the output
// for large sizes; streaming stores for outputs too large to stay in cache. A reduction at the
// root reduces while it evaluates: no intermediate tensor.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "../autodiff/tape.hpp"
#include "../backend/cpu/reduce_stream.hpp"
#include "../core/creation.hpp"
#include "../eager/context.hpp"
#include "../ops/broadcast_to.hpp"
#include "../ops/cast.hpp"
#include "../ops/reduce.hpp"
#include "../ops/where.hpp"
#include "eval_eager.hpp"

namespace stagecraft::staging {

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

/// y[0, n) of expression e over SIMD or scalar lanes L, every slot advancing one element per
/// position (the Walker below gives each segment that form); nt: streaming stores.
template <class L, int S, DType D, class E, class C, class R>
SC_ALWAYS_INLINE void range(const E& e, C& c, R* y, std::int64_t n, bool nt) {
  constexpr DType OD = E::template dtype<D>();
  if constexpr (L::simd) {
    using T = typename L::elem;
    using V = native_t<L, OD>;
    constexpr std::int64_t W = L::width;
    std::int64_t i = 0;
    for (; i + W <= n; i += W) store_value<L>(y + i, e.template get<S, D, V, L>(c, i), W, nt);
    if (i < n) {
      // the last partial batch: the same instantiation of the graph, on zero-padded copies
      alignas(64) T pad[NS_of<C> > 0 ? NS_of<C> : 1][W];
      C tc = padded_tail<T, W, true>(c, i, n - i, pad);
      using LT = SimdLane<T, true, true, L::ordered>;
      store_value<LT>(y + i, e.template get<S, D, V, L>(tc, 0), n - i, false);
    }
  } else {
    for (std::int64_t i = 0; i < n; ++i) y[i] = e.template get<S, D, R, L>(c, i);
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

/// Whether a node of the graph's fused region satisfies P; a materialized operand (computed by
/// the eager op, not walked) counts as `at_mat`.
template <template <class> class P, class N, bool at_mat = false>
constexpr bool any_node() {
  if constexpr (requires(const N& n) { n.m; }) return at_mat;
  else if constexpr (P<N>::value) return true;
  else if constexpr (requires(const N& n) { n.c; })
    return any_node<P, decltype(N::c), at_mat>() || any_node<P, decltype(N::a), at_mat>() ||
           any_node<P, decltype(N::b), at_mat>();
  else if constexpr (requires(const N& n) { n.b; })
    return any_node<P, decltype(N::a), at_mat>() || any_node<P, decltype(N::b), at_mat>();
  else if constexpr (requires(const N& n) { n.a; }) return any_node<P, decltype(N::a), at_mat>();
  else return false;
}
template <class N>
struct no_node : std::false_type {};
/// A floating unary op (exp, tanh, sin, ...) on a value that is not a constant. Outside SIMD lanes
/// it would run its scalar math, which differs from the SIMD rule eager runs in the last bit:
/// graphs that are not SIMD (integer or bool tensors) and hold one run op by op.
template <class N>
struct floating_unary_node : std::false_type {};
template <class Op, class A>
struct floating_unary_node<Map1<Op, A>> : std::bool_constant<Map1<Op, A>::kind == Kind::unary_floating && !A::weak> {};
/// An op whose SIMD bits depend on the batch's other lanes (Op::batch_dependent: sin, cos): a
/// strided walk or a reduction's rows batch other elements together than eager's flat loop.
template <class N>
struct batch_dependent_node : std::false_type {};
template <class N>
  requires requires { N::op_type::batch_dependent; }
struct batch_dependent_node<N> : std::bool_constant<!N::weak> {};

/// The parallel grain of an expression of summed cost C (expr.hpp's Node::cost): grain_cheap / C,
/// down to the heavy grain, as the traced plans' (graph/fused_prepare.hpp). A chain of sixteen adds
/// over 1M floats takes two threads, where one add's grain kept it on one.
template <int C>
constexpr std::int64_t grain_for() {
  return std::max<std::int64_t>(backend::cpu::grain_heavy, backend::cpu::grain_cheap / std::max(1, C));
}

/// Elements per segment of a broadcasting walk.
inline constexpr std::int64_t walk_segment = 256;

/// Cuts one thread's share of the output into segments in which every slot advances one element
/// per position, so a single (dense) instantiation of the graph serves every layout: a slot that
/// repeats one element along a segment (a size-1 slot, or stride 0 on the innermost axis) is read
/// from a buffer of walk_segment copies of that element, refilled only when the element changes.
/// Segments come from [b, end) of the output (dense and linear layouts) or from rows [b, end) of
/// a broadcasting plan (strided).
template <int NS, class T>
class Walker {
 public:
  Walker(const void* const* base, const std::int64_t* step, const Used<NS>& used, std::int64_t b,
         std::int64_t end, const backend::cpu::StridedPlan<NS>* plan)
      : plan_(plan), pos_(b) {
    for (int k = 0; k < NS; ++k) {
      base_[k] = static_cast<const T*>(base[k]);
      used_[k] = used[k];
      step_[k] = step[k];
    }
    if (plan_ == nullptr) {
      for (int k = 0; k < NS; ++k) off_[k] = step_[k] * b;
      row_left_ = end - b;
    } else {
      const int r = plan_->shape.rank();
      len_ = plan_->shape[r - 1];
      for (int k = 0; k < NS; ++k) step_[k] = plan_->strides[k][r - 1];
      std::int64_t rem = b;  // unravel row b over the outer axes
      for (int d = r - 2; d >= 0; --d) {
        idx_[d] = rem % plan_->shape[d];
        rem /= plan_->shape[d];
      }
      for (int k = 0; k < NS; ++k) {
        off_[k] = 0;
        for (int d = 0; d < r - 1; ++d) off_[k] += idx_[d] * plan_->strides[k][d];
      }
      rows_left_ = end - b;
      row_left_ = rows_left_ > 0 ? len_ : 0;
      pos_ = b * len_;  // output position of the row's start
    }
    for (int k = 0; k < NS; ++k) split_ |= used_[k] && step_[k] == 0;
  }

  /// The next segment: sets p[k] to where slot k's elements are, returns the segment's length
  /// (0 when done) and its output offset in o.
  std::int64_t next(const void** p, std::int64_t& o) {
    if (row_left_ == 0 && !next_row()) return 0;
    const std::int64_t len = split_ ? std::min(row_left_, walk_segment) : row_left_;
    for (int k = 0; k < NS; ++k) {
      if (!used_[k]) continue;
      if (step_[k] != 0) {
        p[k] = base_[k] + off_[k];
        off_[k] += len;
      } else {
        const T v = base_[k][off_[k]];
        if (!filled_[k] || !same(last_[k], v)) {
          std::fill_n(buf_[k], walk_segment, v);
          last_[k] = v;
          filled_[k] = true;
        }
        p[k] = buf_[k];
      }
    }
    o = pos_;
    pos_ += len;
    row_left_ -= len;
    return len;
  }

 private:
  // Advances to the next row of the plan (the odometer of backend::cpu::for_each_row).
  bool next_row() {
    if (plan_ == nullptr || --rows_left_ <= 0) return false;
    const int r = plan_->shape.rank();
    for (int k = 0; k < NS; ++k) off_[k] -= len_ * step_[k];  // back to the row's start
    for (int d = r - 2; d >= 0; --d) {
      ++idx_[d];
      for (int k = 0; k < NS; ++k) off_[k] += plan_->strides[k][d];
      if (idx_[d] < plan_->shape[d]) break;
      for (int k = 0; k < NS; ++k) off_[k] -= idx_[d] * plan_->strides[k][d];
      idx_[d] = 0;
    }
    row_left_ = len_;
    return true;
  }
  static bool same(const T& a, const T& b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }

  const backend::cpu::StridedPlan<NS>* plan_;
  const T* base_[NS > 0 ? NS : 1] = {};
  std::int64_t step_[NS > 0 ? NS : 1] = {};
  std::int64_t off_[NS > 0 ? NS : 1] = {};
  bool used_[NS > 0 ? NS : 1] = {};
  bool filled_[NS > 0 ? NS : 1] = {};
  T last_[NS > 0 ? NS : 1] = {};
  std::int64_t idx_[max_rank] = {};
  std::int64_t pos_ = 0, row_left_ = 0, rows_left_ = 0, len_ = 0;
  bool split_ = false;
  alignas(64) T buf_[NS > 0 ? NS : 1][walk_segment];
};

/// One thread's share of the fused loop: the graph's one instantiation for dtype D and lanes L,
/// run over the walker's segments. Its own copies of the expression and the context keep the
/// graph's constants and frame provably apart from the output, so they stay in registers.
template <class L, int S, DType D, class T, class E, class C, class R>
SC_NOINLINE void fused_share(const E& shared, const C& c0, R* y, Walker<NS_of<C>, T>& walk, bool nt) {
  const E e = shared;
  C c = c0;
  std::int64_t o = 0;
  while (const std::int64_t len = walk.next(c.p, o)) range<L, S, D>(e, c, y + o, len, nt);
  if (nt) backend::cpu::stream_fence();
}

template <DType D, int NA, class E, int NS = NA + E::slots>
Tensor fused(const E& e, const Slots<NS>& sl, const Used<NS>& used, const Shape& shape) {
  constexpr DType OD = E::template dtype<D>();
  using R = ctype_t<OD>;
  using T = ctype_t<D>;  // every slot's dtype
  const std::int64_t n = shape.numel();
  const Layout lay = layout_of<NS>(sl, used, n);
  if constexpr (any_node<batch_dependent_node, E>()) {
    if (lay == Layout::strided && n > 0) return Tensor();  // rows batch unlike eager: op by op
  }
  Tensor out = detail::empty_tensor(shape, OD, Device::cpu());
  if (n == 0) return out;
  R* y = static_cast<R*>(out.raw_data());
  // shared sub-expressions bound once per batch (cse.hpp); the kernel runs the rewritten graph
  const auto shared = cse(e);
  Ctx<NS, frame_slots<E>> c;
  const void* base[NS > 0 ? NS : 1] = {};
  std::int64_t step[NS > 0 ? NS : 1] = {};
  for (int k = 0; k < NS; ++k) {
    base[k] = used[k] ? sl[k].raw_data() : nullptr;
    step[k] = used[k] && sl[k].numel() == n ? 1 : 0;
  }
  const std::int64_t grain = grain_for<E::cost>();
  std::int64_t units = n, len = 1;  // units: elements, or (strided) rows of len elements
  backend::cpu::StridedPlan<NS> plan;
  if (lay == Layout::strided) {  // rows of the collapsed broadcasting walk
    std::array<Shape, NS> shapes;
    const Shape* ins[NS];
    for (int k = 0; k < NS; ++k) {
      shapes[k] = used[k] ? sl[k].shape() : shape;
      ins[k] = &shapes[k];
    }
    plan = backend::cpu::collapse<NS>(shape, ins);
    len = plan.shape[plan.shape.rank() - 1];
    units = n / len;
  }
  constexpr bool simd = E::template uniform<D>() && simd_dtype(D);
  const bool nt = simd && lay == Layout::dense && backend::cpu::stream_output(y, n);
  auto loop = [&](auto ordered) {
    constexpr int O = decltype(ordered)::value;
    using L = std::conditional_t<simd, SimdLane<T, true, false, O>, ScalarLane<true>>;
    auto body = [&](std::int64_t b, std::int64_t end) {
      Walker<NS, T> walk(base, step, used, b, end, lay == Layout::strided ? &plan : nullptr);
      fused_share<L, NA, D>(shared, c, y, walk, nt);
    };
    // elements go in ranges of whole vectors (parallel_for); rows by their elements (parallel_rows)
    if (lay == Layout::strided) backend::cpu::parallel_rows(units, len, grain, body);
    else backend::cpu::parallel_for(units, grain, body);
  };
  // a loop without NaN tests for max/min constants, where none is NaN (checked here, once)
  if constexpr (simd && has_minmax_const<E>()) {
    switch (minmax_consts_ordered<T>(e)) {
      case 2: loop(std::integral_constant<int, 2>{}); break;
      case 1: loop(std::integral_constant<int, 1>{}); break;
      default: loop(std::integral_constant<int, 0>{});
    }
  } else {
    loop(std::integral_constant<int, 0>{});
  }
  return out;
}

/// Whether a fused loop may run here: no tape recording (it would not see the ops), no trace
/// (the eager ops stage themselves into it), every slot a concrete tensor of one dtype on one
/// device, a CPU (cuda false) or a GPU (cuda true); d and dev are theirs.
template <int NS>
bool fusable_on(const Slots<NS>& sl, const Used<NS>& used, bool cuda, DType& d, Device& dev) {
  const detail::Context& ctx = detail::context();
  if (ctx.tapes != nullptr || ctx.trace != nullptr) return false;
  bool have = false;
  for (int k = 0; k < NS; ++k) {
    if (!used[k]) continue;
    const Tensor& t = sl[k];
    if (!t.defined() || t.is_symbolic() || t.device().is_cuda() != cuda) return false;
    if (!have) d = t.dtype(), dev = t.device(), have = true;
    else if (t.dtype() != d || t.device() != dev) return false;
  }
  return have;
}
/// fusable_on for the CPU's fused loop.
template <int NS>
bool fusable(const Slots<NS>& sl, const Used<NS>& used, DType& d) {
  Device dev = Device::cpu();
  return fusable_on<NS>(sl, used, false, d, dev);
}

/// The expression as one templated CUDA kernel (staged/cuda_kernel.hpp, defined where nvcc
/// compiles the file): eval's GPU counterpart of fused().
template <DType D, int NA, class E, int NS>
Tensor fused_cuda(const E& e, const Slots<NS>& sl, const Used<NS>& used, const Shape& shape, Device dev,
                  const std::source_location& loc);

template <int NA, class E, unsigned DS>
Tensor run_elementwise(const E& e, const Env<NA, DS>& env) {
  constexpr int NS = NA + E::slots;
  const Slots<NS> sl = make_slots<NA>(e, env);
  if constexpr (E::weak) {
    // no tensor fixes the dtype (a gradient's adjoint such as where(x > 0, 0.25f, 0) evaluated on
    // its own): the scalars' own dtype, as eager gives where(x > 0, 0.25f, 0)
    return eager_weak<NA>(e, env, sl, promote_scalar(DType::b8, E::skind), "compile");
  } else {
    constexpr Used<NS> used = used_slots<NA, E>();
    // the fused loop on the CPU, or (in a file nvcc compiles) the templated kernel on a GPU
    constexpr bool gpu = (DS & nvcc_kernels) != 0;
    DType d{};
    Device dev = Device::cpu();
    Shape shape;
    if ((fusable<NS>(sl, used, d) || (gpu && fusable_on<NS>(sl, used, true, d, dev))) &&
        shape_of<NA>(e, env, sl, shape)) {
      Tensor out;
      visit_dtype(d, [&](auto tag) {
        constexpr DType D = dtype_of<typename decltype(tag)::type>();
        if constexpr (fuses(DS, D) && E::template valid<D>()) {
          check_constants<D>(e, E::template dtype<D>(), "compile", env.loc);
          if constexpr (gpu) {
            if (dev.is_cuda()) {
              out = fused_cuda<D, NA>(e, sl, used, shape, dev, env.loc);
              return;
            }
          }
          // SIMD lanes, or one element at a time where the scalar math gives eager's bits
          if constexpr ((E::template uniform<D>() && simd_dtype(D)) || !any_node<floating_unary_node, E>())
            out = fused<D, NA>(e, sl, used, shape);
        }
      });
      if (out.defined()) return out;
    }
    return eager_of<NA>(e, env, sl);
  }
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

/// Whether op reduces trailing axes of `shape` only (then: the elements per output, `inner`, and
/// the output's shape); false also for an empty input or axes eager would refuse (out of range,
/// repeated: the eager op then raises it).
template <ReduceKind K>
bool trailing_reduction(const ReduceOp<K>& op, const Shape& shape, std::int64_t& inner, Shape& oshape) {
  const int rank = shape.rank();
  std::vector<char> reduced(static_cast<std::size_t>(rank), op.axes.empty() ? 1 : 0);
  for (std::int64_t ax : op.axes) {
    if (ax < -rank || ax >= rank) return false;  // eager raises it
    char& r = reduced[static_cast<std::size_t>(ax < 0 ? ax + rank : ax)];
    if (r) return false;  // a repeated axis: eager raises it
    r = 1;
  }
  int first = rank;  // reduced axes must be the trailing ones
  while (first > 0 && reduced[static_cast<std::size_t>(first - 1)]) --first;
  for (int k = 0; k < first; ++k)
    if (reduced[static_cast<std::size_t>(k)]) return false;
  inner = 1;
  for (int k = first; k < rank; ++k) inner *= shape[k];
  if (inner == 0 || shape.numel() == 0) return false;
  oshape = Shape{};
  for (int k = 0; k < rank; ++k)
    if (k < first) oshape.push_back(shape[k]);
    else if (op.keepdims) oshape.push_back(1);
  return true;
}

/// The GPU counterpart of fused_reduce: one templated CUDA kernel (staged/cuda_kernel.hpp,
/// defined where nvcc compiles the file); false where it does not apply.
template <int NA, ReduceKind K, class A, unsigned DS>
bool fused_reduce_cuda(const ReduceOp<K>& op, const A& a, const Env<NA, DS>& env, Tensor& out);

/// A reduction K of expression a over trailing axes, where the slots are concrete tensors of one
/// floating dtype on a GPU (cuda) or the CPU: returns run(D, slots, used, a's shape, inner, output
/// shape, device) for the expression's dtype D (run says whether it reduced); false where it does
/// not apply. The CPU's fused_reduce, the GPU's kernel and its host emulation start here.
template <int NA, ReduceKind K, class A, unsigned DS, class Run>
bool reduce_with(const ReduceOp<K>& op, const A& a, const Env<NA, DS>& env, bool cuda, Run&& run) {
  constexpr int NS = NA + A::slots;
  const Slots<NS> sl = make_slots<NA>(a, env);
  constexpr Used<NS> used = used_slots<NA, A>();
  DType d{};
  Device dev = Device::cpu();
  Shape shape;
  if (!fusable_on<NS>(sl, used, cuda, d, dev) || !is_floating(d) || !shape_of<NA>(a, env, sl, shape)) return false;
  std::int64_t inner = 0;
  Shape oshape;
  if (!trailing_reduction(op, shape, inner, oshape)) return false;
  bool done = false;
  visit_floating(d, [&](auto tag) {
    constexpr DType D = dtype_of<typename decltype(tag)::type>();
    if constexpr (fuses(DS, D) && A::template valid<D>() && A::template dtype<D>() == D) {
      check_constants<D>(a, D, "compile", env.loc);
      done = run(std::integral_constant<DType, D>{}, sl, used, shape, inner, oshape, dev);
    }
  });
  return done;
}

/// Reduces a floating expression over its trailing axes while evaluating it, in the eager
/// reduction's order, so the results are its bits (as the traced plan's fused reductions): rows
/// cut into the same chunks (chunk_rows, from the shape only: the same figures on any thread
/// count), each reduced as reduce_row reduces (a float sum split pairwise; in each piece four SIMD
/// accumulators over blocks of 4 batches, one over the whole batches after them, the lanes in
/// order, a scalar tail; a piece under 4 batches element by element) from the expression's
/// batches in registers, and the chunks' results reduced by the kernel's second step. False where
/// this does not apply (the caller then evaluates the operand and reduces it).
template <int NA, ReduceKind K, class A, unsigned DS>
bool fused_reduce(const ReduceOp<K>& op, const A& a, const Env<NA, DS>& env, Tensor& out) {
  constexpr int NS = NA + A::slots;
  return reduce_with<NA>(op, a, env, false, [&](auto dc, const Slots<NS>& sl, const Used<NS>& used, const Shape& shape,
                                                std::int64_t inner, const Shape& oshape, Device) {
    constexpr DType D = decltype(dc)::value;
    if constexpr (!A::template uniform<D>()) {
      return false;
    } else {
      namespace cpu = backend::cpu;
      using T = ctype_t<D>;
      using Rd = std::conditional_t<K == ReduceKind::max, cpu::MaxReducer,
                                    std::conditional_t<K == ReduceKind::min, cpu::MinReducer, cpu::SumReducer>>;
      const std::int64_t n = shape.numel();
      if (layout_of<NS>(sl, used, n) == Layout::strided) return false;
      using L = SimdLane<T, false>;
      using B = xsimd::batch<T>;
      constexpr std::int64_t W = B::size;
      const std::int64_t outer = n / inner, per = cpu::chunk_rows(outer, inner, 1), chunks = (inner + per - 1) / per;
      // batches that do not start on a multiple of W batch other elements together than eager's
      // flat loop (sin and cos): rows and chunks must start on one (the pairwise pieces do)
      if constexpr (any_node<batch_dependent_node, A>()) {
        if (inner % W != 0 || (chunks > 1 && per % W != 0)) return false;
      }
      const auto shared = cse(a);
      using X = std::remove_cvref_t<decltype(shared)>;
      Ctx<NS, frame_slots<A>> c;
      for (int k = 0; k < NS; ++k) {
        c.p[k] = used[k] ? sl[k].raw_data() : nullptr;
        c.s[k] = used[k] && sl[k].numel() == n ? 1 : 0;
      }
      const std::int64_t tasks = outer * chunks;
      std::vector<T> part(static_cast<std::size_t>(tasks));
      // a reduction of an expression does its work and the reduction's (as the traced plan's fused
      // reductions count it): a plain argument's the cheap grain, an expression's one more op
      constexpr bool plain = requires { A::arg_index; } || std::is_same_v<A, Leaf>;
      constexpr std::int64_t grain = grain_for<plain ? 0 : A::cost + cheap_cost>();
      cpu::parallel_rows(tasks, std::min(per, inner), grain, [&](std::int64_t tb, std::int64_t te) {
        auto cc = c;
        const X local = shared;
        const auto at = [&](std::int64_t i) { return B(local.template get<NA, D, B, L>(cc, i)); };
        // elements [i, i + r) of the expression, r <= W, into lanes (a partial batch zero-padded)
        const auto values = [&](std::int64_t i, std::int64_t r, T* lanes) {
          if (r == W) {
            at(i).store_aligned(lanes);
          } else {
            alignas(64) T pad[NS > 0 ? NS : 1][W];
            const auto tc = padded_tail<T, W, false>(cc, i, r, pad);
            B(local.template get<NA, D, B, L>(tc, 0)).store_aligned(lanes);
          }
        };
        // reduce_row<Rd, T, T> over elements [b, b + m) of the expression, m >= 1
        const auto leaf = [&](std::int64_t b, std::int64_t m) {
          alignas(64) T lanes[W];
          std::int64_t i = 0;
          T acc{};
          if (m >= 4 * W) {
            B a0 = at(b), a1 = at(b + W), a2 = at(b + 2 * W), a3 = at(b + 3 * W);
            for (i = 4 * W; i + 4 * W <= m; i += 4 * W) {
              a0 = Rd::simd(a0, at(b + i));
              a1 = Rd::simd(a1, at(b + i + W));
              a2 = Rd::simd(a2, at(b + i + 2 * W));
              a3 = Rd::simd(a3, at(b + i + 3 * W));
            }
            a0 = Rd::simd(Rd::simd(a0, a1), Rd::simd(a2, a3));
            for (; i + W <= m; i += W) a0 = Rd::simd(a0, at(b + i));
            a0.store_aligned(lanes);
            acc = lanes[0];
            for (std::int64_t l = 1; l < W; ++l) acc = Rd::combine(acc, lanes[l]);
          } else {  // element by element: the first batch's values, then the tail from W
            const std::int64_t r = std::min(W, m);
            values(b, r, lanes);
            acc = lanes[0];
            for (i = 1; i < r; ++i) acc = Rd::combine(acc, lanes[i]);
          }
          while (i < m) {  // the scalar tail, a batch of values at a time
            const std::int64_t k0 = i / W * W, r = std::min(W, m - k0);
            values(b + k0, r, lanes);
            for (; i < k0 + r; ++i) acc = Rd::combine(acc, lanes[i - k0]);
          }
          return acc;
        };
        for (std::int64_t t = tb; t < te; ++t) {
          const std::int64_t row = t / chunks, k0 = (t % chunks) * per;
          part[static_cast<std::size_t>(t)] = cpu::reduce_pairwise<Rd, T>(row * inner + k0, std::min(per, inner - k0), leaf);
        }
      });
      out = detail::empty_tensor(oshape, D, Device::cpu());
      T* y = static_cast<T*>(out.raw_data());
      if (chunks > 1) cpu::reduce3<Rd, T, T>(part.data(), y, outer, chunks, 1, false);
      else std::copy_n(part.data(), outer, y);
      if constexpr (K == ReduceKind::mean)
        for (std::int64_t row = 0; row < outer; ++row) y[row] = y[row] / static_cast<T>(static_cast<double>(inner));
      return true;
    }
  });
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
template <int NA, class E, unsigned DS>
Tensor run(const E& e, const Env<NA, DS>& env) {
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
        if constexpr ((DS & nvcc_kernels) != 0) {
          if (fused_reduce_cuda<NA>(e.m, a, env, out)) return out;
        }
      }
    }
    return materialize<NA>(e, env);
  } else {
    return run_elementwise<NA>(e, env);
  }
}

}  // namespace stagecraft::staging
