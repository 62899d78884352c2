// The work of an eager batch (kernels/batch.cu): one queued op's elements, for the GPU and for the
// host. batch.cu's kernel runs each op of a batch with a block's threads, one op after another;
// the CUDA emulator (kernels/emulator/runtime.cpp) and test_cuda_batch_elements call the same
// functions in plain loops, so the rules and dtypes a GPU batch applies are checked without a GPU.
// The ops and dtypes taken are the ones elementwise.cu takes for dispatch's inputs; anything else is
// refused (run_op gives false) and its caller launches it alone.
#pragma once
#include <cstdint>
#include <type_traits>

#include "stagecraft/backend/cuda/abi.hpp"
#include "stagecraft/ops/rules.hpp"

#if defined(__CUDACC__)
#define SC_BATCH_HD __host__ __device__ inline
#else
#define SC_BATCH_HD inline
#endif

namespace stagecraft::cuda::kernels::batch {

using abi::BatchGeometry;
using abi::BatchOp;
using abi::DT;

// Which dtypes a rule takes (the table elementwise.cu's kernels and the emulator's use too):
// floating rules f32/f64 only, arithmetic ones no bool, rules whose result is bool (comparisons,
// logical ops) every dtype. Their result type is asked of i32
// operands: on bool every rule's result is bool, and the host must not instantiate the
// arithmetic ones on bool (dividing by false traps on x86).
template <class R> constexpr bool floating_only = false;
template <> constexpr bool floating_only<rules::Exp> = true;
template <> constexpr bool floating_only<rules::Log> = true;
template <> constexpr bool floating_only<rules::Sqrt> = true;
template <> constexpr bool floating_only<rules::Tanh> = true;
template <> constexpr bool floating_only<rules::Sigmoid> = true;
template <> constexpr bool floating_only<rules::Sin> = true;
template <> constexpr bool floating_only<rules::Cos> = true;
template <> constexpr bool floating_only<rules::Log1p> = true;
template <> constexpr bool floating_only<rules::Expm1> = true;
template <> constexpr bool floating_only<rules::Erf> = true;
template <> constexpr bool floating_only<rules::Div> = true;

template <class R>
constexpr bool unary_gives_bool = std::is_same_v<decltype(R::f(std::int32_t{})), bool>;
template <class R>
constexpr bool binary_gives_bool = std::is_same_v<decltype(R::f(std::int32_t{}, std::int32_t{})), bool>;

template <class R, class T>
constexpr bool takes() {
  if constexpr (floating_only<R>) return std::is_floating_point_v<T>;
  else return !std::is_same_v<T, bool>;
}

// The statement (...) once with T the C++ type of dt; false for an unknown dt.
#define SC_BATCH_DT_SWITCH(dt, T, ...) \
  switch (dt) {                         \
    case DT::b8: {                      \
      using T = bool;                   \
      __VA_ARGS__;                      \
    }                                   \
    case DT::i32: {                     \
      using T = std::int32_t;           \
      __VA_ARGS__;                      \
    }                                   \
    case DT::i64: {                     \
      using T = std::int64_t;           \
      __VA_ARGS__;                      \
    }                                   \
    case DT::f32: {                     \
      using T = float;                  \
      __VA_ARGS__;                      \
    }                                   \
    case DT::f64: {                     \
      using T = double;                 \
      __VA_ARGS__;                      \
    }                                   \
  }                                     \
  return false

template <class R, class T, class Out, class I>
SC_BATCH_HD void unary_elements(const BatchOp& op, I first, I step) {
  const T* x = static_cast<const T*>(op.a);
  Out* y = static_cast<Out*>(op.y);
  for (I i = first; i < op.n; i += step) y[i] = static_cast<Out>(R::f(x[i]));
}

/// Whether op's geometry follows it in the queue (the kinds that read through strides).
SC_BATCH_HD bool has_geometry(const BatchOp& op) {
  return op.kind == BatchOp::broadcast || op.kind == BatchOp::copy || op.kind == BatchOp::gemm;
}

/// Calls f(op, its geometry or null) for each op of a batch's n slots, in order (a geometry takes
/// the slot after its op). Slot: abi::BatchSlot, const or not.
template <class Slot, class F>
SC_BATCH_HD void for_each_op(Slot* slots, int n, F&& f) {
  for (int k = 0; k < n; ++k) {
    const bool g = has_geometry(slots[k].op);
    f(slots[k].op, g ? &slots[k + 1].geo : nullptr);
    k += g;
  }
}

/// Offset (elements) in operand k of element i of g's shape (row-major).
SC_BATCH_HD std::int32_t offset_in(const BatchGeometry& g, int k, std::int32_t i) {
  std::int32_t off = 0;
  for (int d = g.rank - 1; d >= 0; --d) {
    off += (i % g.shape[d]) * g.strides[k][d];
    i /= g.shape[d];
  }
  return off;
}

/// y = R(a, b): a and b read at i (or 0: their `one` flags), or through g's strides (broadcast).
template <class R, class T, class Out, class I>
SC_BATCH_HD void binary_elements(const BatchOp& op, const BatchGeometry* g, I first, I step) {
  const T* a = static_cast<const T*>(op.a);
  const T* b = static_cast<const T*>(op.b);
  Out* y = static_cast<Out*>(op.y);
  if (g != nullptr) {
    for (I i = first; i < op.n; i += step) {
      const auto j = static_cast<std::int32_t>(i);
      y[i] = static_cast<Out>(R::f(a[offset_in(*g, 0, j)], b[offset_in(*g, 1, j)]));
    }
    return;
  }
  for (I i = first; i < op.n; i += step) y[i] = static_cast<Out>(R::f(a[op.a_one ? 0 : i], b[op.b_one ? 0 : i]));
}

/// Runs op (when `run`) as unary rule R on T; false when R takes no T.
template <class R, class T, class I>
SC_BATCH_HD bool unary_as(const BatchOp& op, I first, I step, bool run) {
  if constexpr (unary_gives_bool<R>) {
    if (run) unary_elements<R, T, bool>(op, first, step);
    return true;
  } else if constexpr (takes<R, T>()) {
    if (run) unary_elements<R, T, T>(op, first, step);
    return true;
  } else {
    return false;
  }
}

template <class R, class T, class I>
SC_BATCH_HD bool binary_as(const BatchOp& op, const BatchGeometry* g, I first, I step, bool run) {
  if constexpr (binary_gives_bool<R>) {
    if (run) binary_elements<R, T, bool>(op, g, first, step);
    return true;
  } else if constexpr (takes<R, T>()) {
    if (run) binary_elements<R, T, T>(op, g, first, step);
    return true;
  } else {
    return false;
  }
}

template <class R, class I>
SC_BATCH_HD bool unary_rule(const BatchOp& op, I first, I step, bool run) {
  SC_BATCH_DT_SWITCH(op.dt, T, return unary_as<R, T>(op, first, step, run));
}

template <class R, class I>
SC_BATCH_HD bool binary_rule(const BatchOp& op, const BatchGeometry* g, I first, I step, bool run) {
  SC_BATCH_DT_SWITCH(op.dt, T, return binary_as<R, T>(op, g, first, step, run));
}

/// y = x converted, as elementwise.cu's cast kernel (rules::Cast).
template <class S, class T, class I>
SC_BATCH_HD bool cast_as(const BatchOp& op, I first, I step, bool run) {
  if (run) {
    const S* x = static_cast<const S*>(op.a);
    T* y = static_cast<T*>(op.y);
    for (I i = first; i < op.n; i += step) y[i] = static_cast<T>(rules::Cast<T>::f(x[i]));
  }
  return true;
}

template <class S, class I>
SC_BATCH_HD bool cast_from(const BatchOp& op, I first, I step, bool run) {
  SC_BATCH_DT_SWITCH(op.out_dt, T, return cast_as<S, T>(op, first, step, run));
}

/// Every element = value converted to T on the host's terms (elementwise.cu's fill converts it
/// before the launch: static_cast as here).
template <class T, class I>
SC_BATCH_HD bool fill_as(const BatchOp& op, I first, I step, bool run) {
  if (run) {
    const T v = static_cast<T>(op.value);
    T* y = static_cast<T*>(op.y);
    for (I i = first; i < op.n; i += step) y[i] = v;
  }
  return true;
}

/// y = c ? a : b (rules::Where), each operand at i or, with its `one` flag, at 0.
template <class T, class I>
SC_BATCH_HD bool select_as(const BatchOp& op, I first, I step, bool run) {
  if (run) {
    const T* a = static_cast<const T*>(op.a);
    const T* b = static_cast<const T*>(op.b);
    T* y = static_cast<T*>(op.y);
    const bool c_one = op.rule != 0;
    for (I i = first; i < op.n; i += step)
      y[i] = rules::Where::f(op.c[c_one ? 0 : i], a[op.a_one ? 0 : i], b[op.b_one ? 0 : i]);
  }
  return true;
}

/// y at g's strides[1] = x at strides[0], as unsigned words of T's size (bits unchanged).
template <class T, class I>
SC_BATCH_HD bool copy_as(const BatchOp& op, const BatchGeometry& g, I first, I step, bool run) {
  using W = std::conditional_t<sizeof(T) == 1, std::uint8_t, std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>;
  if (run) {
    const W* x = static_cast<const W*>(op.a);
    W* y = static_cast<W*>(op.y);
    for (I i = first; i < op.n; i += step) {
      const auto j = static_cast<std::int32_t>(i);
      y[offset_in(g, 1, j)] = x[offset_in(g, 0, j)];
    }
  }
  return true;
}

/// y [M, N] = A B (BatchOp's gemm): one output per thread, its K terms in order; integer sums and
/// products wrap (as gemm.cu's integer kernel), floating ones are a multiply then an add (the
/// kernels are built without contraction: the host's result is the GPU's).
template <class T, class I>
SC_BATCH_HD bool gemm_as(const BatchOp& op, const BatchGeometry& g, I first, I step, bool run) {
  if constexpr (std::is_same_v<T, bool>) {
    return false;
  } else {
    if (!run) return true;
    const T* a = static_cast<const T*>(op.a);
    const T* b = static_cast<const T*>(op.b);
    T* y = static_cast<T*>(op.y);
    const std::int32_t N = g.shape[1], K = g.shape[2];
    for (I o = first; o < op.n; o += step) {
      const auto m = static_cast<std::int32_t>(o) / N, n = static_cast<std::int32_t>(o) % N;
      const T* ar = a + m * g.strides[0][0];
      const T* bc = b + n * g.strides[1][1];
      if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        U acc = 0;
        for (std::int32_t k = 0; k < K; ++k)
          acc = static_cast<U>(acc + static_cast<U>(static_cast<U>(ar[k * g.strides[0][1]]) *
                                                    static_cast<U>(bc[k * g.strides[1][0]])));
        y[o] = static_cast<T>(acc);
      } else {
        T acc = 0;
        for (std::int32_t k = 0; k < K; ++k) {
          const T p = ar[k * g.strides[0][1]] * bc[k * g.strides[1][0]];
          acc = acc + p;
        }
        y[o] = acc;
      }
    }
    return true;
  }
}

/// Whether g is one the batch takes for op: its axes and size, offsets below 2^31.
SC_BATCH_HD bool geometry_ok(const BatchOp& op, const BatchGeometry& g) {
  if (op.kind == BatchOp::gemm) {
    if (g.rank != 3 || g.shape[0] < 1 || g.shape[1] < 1 || g.shape[2] < 1) return false;
    const std::int64_t M = g.shape[0], N = g.shape[1], K = g.shape[2];
    if (M * N != op.n || M * N > abi::batch_max_gemm_outputs || M * N * K > abi::batch_max_gemm_work) return false;
    for (int k = 0; k < 2; ++k)
      if (g.strides[k][0] < 0 || g.strides[k][1] < 0) return false;
    return (M - 1) * g.strides[0][0] + (K - 1) * g.strides[0][1] < (std::int64_t{1} << 31) &&
           (K - 1) * g.strides[1][0] + (N - 1) * g.strides[1][1] < (std::int64_t{1} << 31);
  }
  if (g.rank < 1 || g.rank > abi::batch_max_rank || op.n > abi::batch_max_elements) return false;
  std::int64_t n = 1, last[2] = {0, 0};
  for (int d = 0; d < g.rank; ++d) {
    if (g.shape[d] < 1) return false;
    n *= g.shape[d];
    for (int k = 0; k < 2; ++k) {
      if (g.strides[k][d] < 0) return false;
      last[k] += std::int64_t{g.shape[d] - 1} * g.strides[k][d];
    }
  }
  return n == op.n && last[0] < (std::int64_t{1} << 31) && last[1] < (std::int64_t{1} << 31);
}

// ---- reductions ---------------------------------------------------------------------------------
// Output o of a batched reduction reads a at (o / inner) * red * inner + r * inner + o % inner for
// r in [0, red). `lanes` neighbouring threads of a warp (a power of two up to 32, at most red) share
// an output: lane j takes r = j, j + lanes, ... in order, then the lanes combine by a butterfly
// (each with the lane `off` away, off = lanes / 2, ..., 1), and lane 0 writes. The host repeats
// the same steps lane by lane, so the emulator's results are the GPU's bit for bit.

/// Threads of the batch kernel's one block (kernels/batch.cu).
inline constexpr int block_threads = 512;

/// Lanes per output for n outputs of red elements each.
SC_BATCH_HD int reduce_lanes(int n, int red) {
  int l = 1;
  while (l < 32 && l * 2 <= red && n * (l * 2) <= block_threads) l *= 2;
  return l;
}

/// Integer sums wrap (as the CPU's adds and reduce.cu's); max and min are the rules, NaN first.
struct SumStep {
  template <class T>
  SC_BATCH_HD static T f(T acc, T x) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(acc) + static_cast<U>(x)));
    } else {
      return acc + x;
    }
  }
};
struct MaxStep {
  template <class T>
  SC_BATCH_HD static T f(T acc, T x) { return rules::Maximum::f(x, acc); }
};
struct MinStep {
  template <class T>
  SC_BATCH_HD static T f(T acc, T x) { return rules::Minimum::f(x, acc); }
};

/// Lane j's partial of output o.
template <class Step, class In, class Out>
SC_BATCH_HD Out lane_partial(const BatchOp& op, int o, int j, int lanes) {
  const In* x = static_cast<const In*>(op.a);
  const std::int64_t base = std::int64_t{o / op.inner} * op.red * op.inner + o % op.inner;
  Out acc = static_cast<Out>(x[base + std::int64_t{j} * op.inner]);
  for (int r = j + lanes; r < op.red; r += lanes) acc = Step::f(acc, static_cast<Out>(x[base + std::int64_t{r} * op.inner]));
  return acc;
}

#if defined(__CUDACC__)
template <class T>
__device__ T shuffle_xor(T v, int off) {
  if constexpr (std::is_same_v<T, bool>) return __shfl_xor_sync(0xffffffffu, static_cast<int>(v), off) != 0;
  else return __shfl_xor_sync(0xffffffffu, v, off);
}
#endif

template <class Step, class In, class Out>
SC_BATCH_HD void reduce_elements(const BatchOp& op, int first) {
  Out* y = static_cast<Out*>(op.y);
  const int lanes = reduce_lanes(op.n, op.red);
#if defined(__CUDA_ARCH__)
  // every thread runs as many rounds (the shuffles need the whole warp); a group of lanes is all
  // active or all idle
  const int per_round = block_threads / lanes, lane = first % lanes, slot = first / lanes;
  for (int base = 0; base < op.n; base += per_round) {
    const int o = base + slot;
    Out acc{};
    if (o < op.n) acc = lane_partial<Step, In, Out>(op, o, lane, lanes);
    for (int off = lanes / 2; off > 0; off /= 2) acc = Step::f(acc, shuffle_xor(acc, off));
    if (o < op.n && lane == 0) y[o] = acc;
  }
#else
  if (first != 0) return;  // (the host's one thread does every output)
  for (int o = 0; o < op.n; ++o) {
    Out acc[32];
    for (int j = 0; j < lanes; ++j) acc[j] = lane_partial<Step, In, Out>(op, o, j, lanes);
    for (int off = lanes / 2; off > 0; off /= 2) {
      Out next[32];
      for (int j = 0; j < lanes; ++j) next[j] = Step::f(acc[j], acc[j ^ off]);
      for (int j = 0; j < lanes; ++j) acc[j] = next[j];
    }
    y[o] = acc[0];
  }
#endif
}

/// Runs (when `run`) reduction op over In; false for a rule other than sum, max, min.
template <class In>
SC_BATCH_HD bool reduce_as(const BatchOp& op, int first, bool run) {
  // a bool sum counts into i64; a bool max/min is any/all
  using SumOut = std::conditional_t<std::is_same_v<In, bool>, std::int64_t, In>;
  switch (static_cast<abi::ReduceRule>(op.rule)) {
    case abi::ReduceRule::sum:
      if (run) reduce_elements<SumStep, In, SumOut>(op, first);
      return true;
    case abi::ReduceRule::max:
      if (run) reduce_elements<MaxStep, In, In>(op, first);
      return true;
    case abi::ReduceRule::min:
      if (run) reduce_elements<MinStep, In, In>(op, first);
      return true;
    default: return false;
  }
}

/// A reduction's extents as the batch takes them: n outputs of red >= 1 elements, n a multiple of
/// inner, at most batch_max_elements read.
SC_BATCH_HD bool reduce_shape_ok(const BatchOp& op) {
  return op.red >= 1 && op.inner >= 1 && op.n % op.inner == 0 &&
         std::int64_t{op.n} * op.red <= abi::batch_max_elements;
}

/// Op's elements first, first + step, ... (a thread's share: its index and the block's width on
/// the GPU, 0 and 1 on the host), when `run`; without `run` only whether op is one the batch
/// kernel takes (its rule, dtypes and size). A reduction is the block's together (first is the
/// thread's index; on the host, first 0 does it all).
template <class I>
SC_BATCH_HD bool run_op(const BatchOp& op, const BatchGeometry* g, I first, I step, bool run) {
  const bool wants_geometry = has_geometry(op);
  if (op.n <= 0 || wants_geometry != (g != nullptr)) return false;
  if (wants_geometry ? !geometry_ok(op, *g) : op.n > abi::batch_max_elements) return false;
  switch (op.kind) {
    case BatchOp::copy: {
      SC_BATCH_DT_SWITCH(op.dt, T, return copy_as<T>(op, *g, first, step, run));
    }
    case BatchOp::gemm: {
      SC_BATCH_DT_SWITCH(op.dt, T, return gemm_as<T>(op, *g, first, step, run));
    }
    case BatchOp::reduce: {
      if (!reduce_shape_ok(op)) return false;
      SC_BATCH_DT_SWITCH(op.dt, T, return reduce_as<T>(op, static_cast<int>(first), run));
    }
    case BatchOp::unary:
      switch (static_cast<abi::UnaryRule>(op.rule)) {
#define SC_CASE(R) \
  case abi::UnaryRule::R: return unary_rule<rules::R>(op, first, step, run);
        SC_CUDA_UNARY_RULES(SC_CASE)
#undef SC_CASE
        default: return false;
      }
    case BatchOp::binary:
    case BatchOp::broadcast:
      switch (static_cast<abi::BinaryRule>(op.rule)) {
#define SC_CASE(R) \
  case abi::BinaryRule::R: return binary_rule<rules::R>(op, g, first, step, run);
        SC_CUDA_BINARY_RULES(SC_CASE)
#undef SC_CASE
        default: return false;
      }
    case BatchOp::cast: {
      SC_BATCH_DT_SWITCH(op.dt, S, return cast_from<S>(op, first, step, run));
    }
    case BatchOp::fill: {
      SC_BATCH_DT_SWITCH(op.dt, T, return fill_as<T>(op, first, step, run));
    }
    case BatchOp::select: {
      if (op.rule != 0 && op.rule != 1) return false;
      SC_BATCH_DT_SWITCH(op.dt, T, return select_as<T>(op, first, step, run));
    }
  }
  return false;
}

/// True when the batch kernel takes op (with its geometry g for the kinds that have one).
inline bool takes_op(const BatchOp& op, const BatchGeometry* g = nullptr) { return run_op<int>(op, g, 0, 1, false); }

#undef SC_BATCH_DT_SWITCH

}  // namespace stagecraft::cuda::kernels::batch
