// The scans (cumsum, cumprod, logcumsumexp, cummax, cummin, cumargmax, cumargmin, linear_scan):
// the steps of ops/scan_steps.hpp, run a thread per line when there are many lines (or short
// ones), else a block per line: CUB's block scan over chunks of block_threads elements joining
// their states in a tree, each chunk's total carried to the next.
#include <cub/block/block_scan.cuh>

#include "common.cuh"
#include "stagecraft/ops/scan_steps.hpp"

namespace stagecraft::cuda::kernels {
namespace {

namespace steps = stagecraft::scan_steps;

/// The position along the axis of step k of a scan (forward or from the end).
__device__ inline std::int64_t scan_pos(std::int64_t k, std::int64_t n, bool reverse) { return reverse ? n - 1 - k : k; }
/// The offset of position pos of line `line` of [outer, n, inner].
__device__ inline std::int64_t scan_at(std::int64_t line, std::int64_t pos, std::int64_t n, std::int64_t inner) {
  const std::int64_t o = line / inner, i = line % inner;
  return (o * n + pos) * inner + i;
}

/// Many lines: a thread each, in order down the axis, the CPU's steps (the first element starts the
/// state; exclusive writes the state before each element). Neighbouring threads read neighbouring
/// inner positions, so the reads of a step coalesce when inner > 1.
template <class S>
__global__ void scan_lines_kernel(S s, typename S::Out* y, std::int64_t lines, std::int64_t n, std::int64_t inner,
                                  bool exclusive, bool reverse) {
  for (std::int64_t line = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; line < lines;
       line += std::int64_t{gridDim.x} * blockDim.x) {
    typename S::State acc = S::identity();
    for (std::int64_t k = 0; k < n; ++k) {
      const std::int64_t pos = scan_pos(k, n, reverse), at = scan_at(line, pos, n, inner);
      const typename S::State e = s.element(at, pos);
      if (exclusive) y[at] = S::out(acc);
      acc = k == 0 ? e : S::join(acc, e);
      if (!exclusive) y[at] = S::out(acc);
    }
  }
}

template <class S>
struct JoinOp {
  __device__ typename S::State operator()(const typename S::State& l, const typename S::State& r) const {
    return S::join(l, r);
  }
};

/// Few long lines: a block each, block_threads elements at a time scanned by CUB, the states of the
/// chunks before carried (the first chunk's stand alone: the identity never joins a real element,
/// so linear_scan's first a is not read and a sum's -0 stays). Lanes past the end hold the identity.
template <class S>
__global__ void scan_block_kernel(S s, typename S::Out* y, std::int64_t lines, std::int64_t n, std::int64_t inner,
                                  bool exclusive, bool reverse) {
  using State = typename S::State;
  using Scan = cub::BlockScan<State, block_threads>;
  __shared__ typename Scan::TempStorage temp;
  for (std::int64_t line = blockIdx.x; line < lines; line += gridDim.x) {
    State carry = S::identity();
    bool carried = false;
    for (std::int64_t base = 0; base < n; base += block_threads) {
      const std::int64_t k = base + threadIdx.x;
      const std::int64_t pos = k < n ? scan_pos(k, n, reverse) : 0;
      const std::int64_t at = k < n ? scan_at(line, pos, n, inner) : 0;
      const State v = k < n ? s.element(at, pos) : S::identity();
      State part, total;
      if (exclusive) Scan(temp).ExclusiveScan(v, part, JoinOp<S>{}, total);  // (lane 0's part: undefined)
      else Scan(temp).InclusiveScan(v, part, JoinOp<S>{}, total);
      if (k < n) {
        const bool first_of_chunk = exclusive && threadIdx.x == 0;
        const State full = first_of_chunk ? carry : carried ? S::join(carry, part) : part;
        y[at] = S::out(full);
      }
      carry = carried ? S::join(carry, total) : total;
      carried = true;
      __syncthreads();  // temp is reused by the next chunk
    }
  }
}

template <class S>
Status launch_scan(const S& s, typename S::Out* y, std::int64_t outer, std::int64_t n, std::int64_t inner,
                   bool exclusive, bool reverse, cudaStream_t st) {
  if (outer == 0 || n == 0 || inner == 0) return cudaSuccess;
  const std::int64_t lines = outer * inner;
  // a thread per line once there are enough lines to fill the GPU, or the lines are short
  if (lines >= 16 * block_threads || n <= 32) {
    scan_lines_kernel<S><<<grid_for(lines), block_threads, 0, st>>>(s, y, lines, n, inner, exclusive, reverse);
  } else {
    const auto blocks = static_cast<unsigned>(lines < 65535 * 8 ? lines : 65535 * 8);
    scan_block_kernel<S><<<blocks, block_threads, 0, st>>>(s, y, lines, n, inner, exclusive, reverse);
  }
  return launched();
}

template <steps::Rule R, class T>
Status launch_values(const void* x, void* y, std::int64_t outer, std::int64_t n, std::int64_t inner, bool exclusive,
                     bool reverse, cudaStream_t st) {
  return launch_scan(steps::Values<T, R>{static_cast<const T*>(x)}, static_cast<T*>(y), outer, n, inner, exclusive,
                     reverse, st);
}

}  // namespace
}  // namespace stagecraft::cuda::kernels

namespace stagecraft::cuda::abi {
using namespace stagecraft::cuda::kernels;

Status scan(ScanRule r, DT dt, const void* x, void* y, std::int64_t outer, std::int64_t n, std::int64_t inner,
            bool exclusive, bool reverse, Stream s) noexcept {
  const auto st = static_cast<cudaStream_t>(s);
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      return cudaErrorInvalidValue;
    } else {
      switch (r) {
        case ScanRule::sum: return launch_values<steps::Rule::sum, T>(x, y, outer, n, inner, exclusive, reverse, st);
        case ScanRule::prod: return launch_values<steps::Rule::prod, T>(x, y, outer, n, inner, exclusive, reverse, st);
        case ScanRule::logsumexp:
          if constexpr (std::is_floating_point_v<T>)
            return launch_values<steps::Rule::logsumexp, T>(x, y, outer, n, inner, exclusive, reverse, st);
          else return cudaErrorInvalidValue;
        case ScanRule::max: return launch_values<steps::Rule::max, T>(x, y, outer, n, inner, exclusive, reverse, st);
        case ScanRule::min: return launch_values<steps::Rule::min, T>(x, y, outer, n, inner, exclusive, reverse, st);
      }
      return cudaErrorInvalidValue;
    }
  });
}

Status linear_scan(DT dt, const void* a, const void* b, void* y, std::int64_t outer, std::int64_t n,
                   std::int64_t inner, bool exclusive, bool reverse, Stream s) noexcept {
  const auto st = static_cast<cudaStream_t>(s);
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>)
      return launch_scan(steps::Linear<T>{static_cast<const T*>(a), static_cast<const T*>(b)}, static_cast<T*>(y),
                         outer, n, inner, exclusive, reverse, st);
    else return cudaErrorInvalidValue;
  });
}

Status cum_arg(bool is_max, DT dt, const void* x, std::int64_t* idx, std::int64_t outer, std::int64_t n,
               std::int64_t inner, bool reverse, Stream s) noexcept {
  const auto st = static_cast<cudaStream_t>(s);
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      return cudaErrorInvalidValue;
    } else {
      const auto* xs = static_cast<const T*>(x);
      if (is_max) return launch_scan(steps::Arg<T, true>{xs}, idx, outer, n, inner, false, reverse, st);
      return launch_scan(steps::Arg<T, false>{xs}, idx, outer, n, inner, false, reverse, st);
    }
  });
}

}  // namespace stagecraft::cuda::abi
