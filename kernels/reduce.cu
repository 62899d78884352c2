// Reductions (sum, max, min; argmax, argmin along one axis) over any axes: one block per output
// element, CUB's block reduce combining the threads' partials. The combine steps are the CPU
// reducers' (max/min: the rules; arg: NaN first, then the first index of the extremum).
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

template <class Op, class In, class Out>
__global__ void reduce_kernel(const In* x, Out* y, abi::ReduceGeometry g) {
  using BlockReduce = cub::BlockReduce<Out, block_threads>;
  __shared__ typename BlockReduce::TempStorage temp;
  const Op op;
  for (std::int64_t o = blockIdx.x; o < g.out_numel; o += gridDim.x) {
    const std::int64_t base = strided_offset(g.kept_rank, g.kept_shape, g.kept_strides, o);
    Out acc{};
    std::int64_t r = threadIdx.x;
    if (r < g.red_numel) acc = static_cast<Out>(x[base + strided_offset(g.red_rank, g.red_shape, g.red_strides, r)]);
    for (r += block_threads; r < g.red_numel; r += block_threads)
      acc = op(acc, static_cast<Out>(x[base + strided_offset(g.red_rank, g.red_shape, g.red_strides, r)]));
    const int valid = g.red_numel < block_threads ? static_cast<int>(g.red_numel) : block_threads;
    const Out total = valid > 0 ? BlockReduce(temp).Reduce(acc, op, valid) : Out{};
    if (threadIdx.x == 0) y[o] = total;
    __syncthreads();  // temp is reused by the next output
  }
}

template <class Op>
Status launch(DT dt, const void* x, void* y, const abi::ReduceGeometry& g, cudaStream_t s) {
  const unsigned grid = static_cast<unsigned>(g.out_numel < 65535 * 8 ? g.out_numel : 65535 * 8);
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      if constexpr (!std::is_same_v<Op, SumOp>) return cudaErrorNotSupported;
      else reduce_kernel<Op, bool, std::int64_t><<<grid, block_threads, 0, s>>>(static_cast<const bool*>(x),
                                                                                  static_cast<std::int64_t*>(y), g);
    } else {
      reduce_kernel<Op, T, T><<<grid, block_threads, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), g);
    }
    return launched();
  });
}

/// A candidate of argmax/argmin: its value and its index along the axis.
template <class T>
struct Candidate {
  T value;
  std::int64_t index;
};
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

template <bool IsMax, class T>
__global__ void arg_reduce_kernel(const T* x, std::int64_t* y, abi::ReduceGeometry g) {
  using C = Candidate<T>;
  using BlockReduce = cub::BlockReduce<C, block_threads>;
  __shared__ typename BlockReduce::TempStorage temp;
  const ArgOp<IsMax> op;
  for (std::int64_t o = blockIdx.x; o < g.out_numel; o += gridDim.x) {
    const std::int64_t base = strided_offset(g.kept_rank, g.kept_shape, g.kept_strides, o);
    C acc{T{}, 0};
    std::int64_t r = threadIdx.x;
    if (r < g.red_numel) acc = C{x[base + strided_offset(g.red_rank, g.red_shape, g.red_strides, r)], r};
    for (r += block_threads; r < g.red_numel; r += block_threads)
      acc = op(acc, C{x[base + strided_offset(g.red_rank, g.red_shape, g.red_strides, r)], r});
    const int valid = g.red_numel < block_threads ? static_cast<int>(g.red_numel) : block_threads;
    const C best = valid > 0 ? BlockReduce(temp).Reduce(acc, op, valid) : C{T{}, 0};
    if (threadIdx.x == 0) y[o] = best.index;
    __syncthreads();
  }
}

template <bool IsMax>
Status launch_arg(DT dt, const void* x, void* y, const abi::ReduceGeometry& g, cudaStream_t s) {
  const unsigned grid = static_cast<unsigned>(g.out_numel < 65535 * 8 ? g.out_numel : 65535 * 8);
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    arg_reduce_kernel<IsMax, T><<<grid, block_threads, 0, s>>>(static_cast<const T*>(x), static_cast<std::int64_t*>(y), g);
    return launched();
  });
}

}  // namespace
}  // namespace stagecraft::cuda::kernels

namespace stagecraft::cuda::abi {
using namespace stagecraft::cuda::kernels;

Status reduce(ReduceRule r, DT dt, const void* x, void* y, const ReduceGeometry& g, Stream s) noexcept {
  if (g.out_numel == 0) return cudaSuccess;
  const auto st = static_cast<cudaStream_t>(s);
  switch (r) {
    case ReduceRule::sum: return launch<SumOp>(dt, x, y, g, st);
    case ReduceRule::max: return launch<MaxOp>(dt, x, y, g, st);
    case ReduceRule::min: return launch<MinOp>(dt, x, y, g, st);
    case ReduceRule::argmax: return launch_arg<true>(dt, x, y, g, st);
    case ReduceRule::argmin: return launch_arg<false>(dt, x, y, g, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace stagecraft::cuda::abi
