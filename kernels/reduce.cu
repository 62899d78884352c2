// Reductions (sum, max, min; argmax, argmin along one axis) over any axes: one block per output
// element, CUB's block reduce combining the threads' partials; a few long rows (abi::reduce_split)
// cut in pieces, a block each, whose partials a second kernel combines. The combine steps are the CPU
// reducers' (max/min: the rules; arg: NaN first, then the first index of the extremum). The scans
// are in scan.cu.
#include <cub/block/block_reduce.cuh>

#include "common.cuh"
#include "stagecraft/ops/rules.hpp"

namespace stagecraft::cuda::kernels {
namespace {

struct SumOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {  // wraps, as the CPU's adds do (no signed overflow)
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};
/// NaN propagates: the maximum op's rule, the new element first (as backend/cpu/reduce.hpp).
struct MaxOp {
  template <class T>
  __device__ T operator()(T acc, T x) const { return rules::Maximum::f(x, acc); }
};
struct MinOp {
  template <class T>
  __device__ T operator()(T acc, T x) const { return rules::Minimum::f(x, acc); }
};

/// A candidate of argmax/argmin: its value and its index along the axis.
template <class T>
struct Candidate {
  T value;
  std::int64_t index;
};
static_assert(sizeof(Candidate<double>) <= 16, "abi::reduce_scratch_bytes gives 16 bytes a partial");

/// The CPU's choice (backend/cpu/reduce.hpp arg_reduce): NaN counts as the largest (argmax) or the
/// smallest (argmin), and among equal values the first index wins; commutative, so any order of
/// combining gives that answer.
template <bool IsMax>
struct ArgOp {
  template <class T>
  __device__ Candidate<T> operator()(const Candidate<T>& a, const Candidate<T>& b) const {
    const bool na = rules::math::isnan(a.value), nb = rules::math::isnan(b.value);
    if (na || nb) {
      if (na && nb) return a.index < b.index ? a : b;
      return na ? a : b;
    }
    if (a.value == b.value) return a.index < b.index ? a : b;
    return (IsMax ? a.value > b.value : a.value < b.value) ? a : b;
  }
};

/// A reduction's types: what it reads (In), what its partials are (Acc, also what the second kernel
/// of a cut reduction combines), what it writes (Out), and its combine step.
template <class Op, class In, class Out>
struct ValueReduction {
  using Acc = Out;
  Op op;
  __device__ Acc load(const In* x, std::int64_t at, std::int64_t) const { return static_cast<Acc>(x[at]); }
  __device__ Out result(const Acc& a) const { return a; }
};
template <bool IsMax, class T>
struct ArgReduction {
  using Acc = Candidate<T>;
  ArgOp<IsMax> op;
  __device__ Acc load(const T* x, std::int64_t at, std::int64_t r) const { return Acc{x[at], r}; }
  __device__ std::int64_t result(const Acc& a) const { return a.index; }
};

/// The block's reduction of load(r) for r in [lo, hi) (hi > lo), in thread 0; every thread of the
/// block must call it (it syncs).
template <class R, class Load>
__device__ typename R::Acc block_reduce(const R& red, typename cub::BlockReduce<typename R::Acc, block_threads>::TempStorage& temp,
                                        Load load, std::int64_t lo, std::int64_t hi) {
  using Acc = typename R::Acc;
  Acc acc{};
  std::int64_t r = lo + threadIdx.x;
  if (r < hi) acc = load(r);
  for (r += block_threads; r < hi; r += block_threads) acc = red.op(acc, load(r));
  const std::int64_t n = hi - lo;
  const int valid = n < block_threads ? static_cast<int>(n) : block_threads;
  const Acc total = cub::BlockReduce<Acc, block_threads>(temp).Reduce(acc, red.op, valid);
  __syncthreads();  // temp is reused by the block's next call
  return total;
}

/// One block per output element (a grid-stride loop over them), its whole row; or, with
/// chunks > 1, one block per piece of `chunk` elements of a row, writing the piece's partial to
/// `part` (out_numel * chunks of them) for combine_kernel. The offsets within a row in I (int32
/// where they fit).
template <class R, class In, class Out, class I>
__global__ void reduce_kernel(const In* x, Out* y, typename R::Acc* part, abi::ReduceGeometry g, abi::ReduceSplit split) {
  using Acc = typename R::Acc;
  __shared__ typename cub::BlockReduce<Acc, block_threads>::TempStorage temp;
  const R red;
  const std::int64_t pieces = g.out_numel * split.chunks;
  for (std::int64_t p = blockIdx.x; p < pieces; p += gridDim.x) {
    const std::int64_t o = p / split.chunks, lo = p % split.chunks * split.chunk;
    const std::int64_t hi = g.red_numel - lo < split.chunk ? g.red_numel : lo + split.chunk;
    const std::int64_t base = strided_offset<std::int64_t>(g.kept_rank, g.kept_shape, g.kept_strides, o);
    if (hi <= lo) {  // an empty reduction (the sum of nothing)
      if (threadIdx.x == 0) y[o] = Out{};
      continue;
    }
    const Acc total = block_reduce(red, temp,
                                   [&](std::int64_t r) {
                                     return red.load(x, base + strided_offset<I>(g.red_rank, g.red_shape, g.red_strides, static_cast<I>(r)), r);
                                   },
                                   lo, hi);
    if (threadIdx.x == 0) {
      if (split.chunks > 1) part[p] = total;
      else y[o] = red.result(total);
    }
  }
}

/// The second kernel of a cut reduction: output o combines its chunks partials, in order.
template <class R, class Out>
__global__ void combine_kernel(const typename R::Acc* part, Out* y, std::int64_t out_numel, std::int64_t chunks) {
  using Acc = typename R::Acc;
  __shared__ typename cub::BlockReduce<Acc, block_threads>::TempStorage temp;
  const R red;
  for (std::int64_t o = blockIdx.x; o < out_numel; o += gridDim.x) {
    const Acc total = block_reduce(red, temp, [&](std::int64_t q) { return part[o * chunks + q]; }, 0, chunks);
    if (threadIdx.x == 0) y[o] = red.result(total);
  }
}

unsigned blocks_for(std::int64_t n) { return static_cast<unsigned>(n < 65535 * 8 ? n : 65535 * 8); }

template <class R, class In, class Out>
Status launch_reduction(const void* x, void* y, const abi::ReduceGeometry& g, void* scratch, cudaStream_t s) {
  using Acc = typename R::Acc;
  const abi::ReduceSplit split = abi::reduce_split(g.out_numel, g.red_numel);
  const bool cut = split.chunks > 1;
  if (cut && scratch == nullptr) return cudaErrorInvalidValue;
  auto* part = static_cast<Acc*>(scratch);
  const unsigned blocks = blocks_for(g.out_numel * split.chunks);
  if (max_strided_offset(g.red_rank, g.red_shape, g.red_strides) < (std::int64_t{1} << 30) && g.red_numel < (std::int64_t{1} << 30))
    reduce_kernel<R, In, Out, std::int32_t><<<blocks, block_threads, 0, s>>>(static_cast<const In*>(x), static_cast<Out*>(y),
                                                                            part, g, split);
  else
    reduce_kernel<R, In, Out, std::int64_t><<<blocks, block_threads, 0, s>>>(static_cast<const In*>(x), static_cast<Out*>(y),
                                                                            part, g, split);
  if (!cut) return launched();
  if (const Status st = launched(); st != cudaSuccess) return st;
  combine_kernel<R, Out><<<blocks_for(g.out_numel), block_threads, 0, s>>>(part, static_cast<Out*>(y), g.out_numel,
                                                                           split.chunks);
  return launched();
}

template <class Op>
Status launch(DT dt, const void* x, void* y, const abi::ReduceGeometry& g, void* scratch, cudaStream_t s) {
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {  // a bool sum counts (into i64); max and min are any and all
      if constexpr (std::is_same_v<Op, SumOp>)
        return launch_reduction<ValueReduction<Op, bool, std::int64_t>, bool, std::int64_t>(x, y, g, scratch, s);
      else return launch_reduction<ValueReduction<Op, bool, bool>, bool, bool>(x, y, g, scratch, s);
    } else {
      return launch_reduction<ValueReduction<Op, T, T>, T, T>(x, y, g, scratch, s);
    }
  });
}

template <bool IsMax>
Status launch_arg(DT dt, const void* x, void* y, const abi::ReduceGeometry& g, void* scratch, cudaStream_t s) {
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    return launch_reduction<ArgReduction<IsMax, T>, T, std::int64_t>(x, y, g, scratch, s);
  });
}

}  // namespace
}  // namespace stagecraft::cuda::kernels

namespace stagecraft::cuda::abi {
using namespace stagecraft::cuda::kernels;

Status reduce(ReduceRule r, DT dt, const void* x, void* y, const ReduceGeometry& g, void* scratch, Stream s) noexcept {
  if (g.out_numel == 0) return cudaSuccess;
  const auto st = static_cast<cudaStream_t>(s);
  switch (r) {
    case ReduceRule::sum: return launch<SumOp>(dt, x, y, g, scratch, st);
    case ReduceRule::max: return launch<MaxOp>(dt, x, y, g, scratch, st);
    case ReduceRule::min: return launch<MinOp>(dt, x, y, g, scratch, st);
    case ReduceRule::argmax: return launch_arg<true>(dt, x, y, g, scratch, st);
    case ReduceRule::argmin: return launch_arg<false>(dt, x, y, g, scratch, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace stagecraft::cuda::abi
