// Layout kernels: strided copies (transpose, slice and broadcast_to move elements from one strided
// view to another; only the element size matters, not the dtype), concat (all its inputs in one
// launch) and one_hot.
#include "common.cuh"

namespace stagecraft::cuda::kernels {
namespace {

template <class W>
__global__ void copy_kernel(const W* x, W* y, Geometry g) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < g.numel;
       i += std::int64_t{gridDim.x} * blockDim.x)
    y[g.contiguous ? i : offset_of(g, 1, i)] = x[g.contiguous ? i : offset_of(g, 0, i)];
}

template <class W>
Status launch(const void* x, void* y, const Geometry& g, cudaStream_t s) {
  copy_kernel<W><<<grid_for(g.numel), block_threads, 0, s>>>(static_cast<const W*>(x), static_cast<W*>(y), g);
  return launched();
}

/// The pieces of one concat launch (by value: the kernel's parameter).
struct ConcatArgs {
  abi::ConcatPiece p[abi::max_concat_pieces];
};

/// Block row blockIdx.y copies piece blockIdx.y: element i of its x goes to row i / row, column
/// i % row of its y.
template <class W>
__global__ void concat_kernel(ConcatArgs a) {
  const abi::ConcatPiece& p = a.p[blockIdx.y];
  const std::int64_t n = p.rows * p.row;
  const W* x = static_cast<const W*>(p.x);
  W* y = static_cast<W*>(p.y);
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t r = i / p.row;
    y[r * p.pitch + (i - r * p.row)] = x[i];
  }
}

/// Row n of y is 1 at ix[n] (when in [0, depth)), 0 elsewhere.
template <class I, class T>
__global__ void one_hot_kernel(const I* ix, T* y, std::int64_t n, std::int64_t depth) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n * depth;
       i += std::int64_t{gridDim.x} * blockDim.x)
    y[i] = static_cast<std::int64_t>(ix[i / depth]) == i % depth ? T(1) : T(0);
}

}  // namespace
}  // namespace stagecraft::cuda::kernels

namespace stagecraft::cuda::abi {
using namespace stagecraft::cuda::kernels;

Status strided_copy(int itemsize, const void* x, void* y, const Geometry& g, Stream s) noexcept {
  if (g.numel == 0) return cudaSuccess;
  const auto st = static_cast<cudaStream_t>(s);
  switch (itemsize) {
    case 1: return launch<std::uint8_t>(x, y, g, st);
    case 4: return launch<std::uint32_t>(x, y, g, st);
    case 8: return launch<std::uint64_t>(x, y, g, st);
  }
  return cudaErrorInvalidValue;
}

Status concat(int itemsize, const ConcatPiece* p, int n, Stream s) noexcept {
  const auto st = static_cast<cudaStream_t>(s);
  for (int at = 0; at < n; at += max_concat_pieces) {
    ConcatArgs a{};
    int k = 0;
    std::int64_t most = 0;  // the largest piece's elements: the grid's width
    for (int j = at; j < n && j < at + max_concat_pieces; ++j) {
      if (p[j].rows * p[j].row == 0) continue;
      a.p[k++] = p[j];
      most = p[j].rows * p[j].row > most ? p[j].rows * p[j].row : most;
    }
    if (k == 0) continue;
    const dim3 grid(grid_for(most), static_cast<unsigned>(k));
    switch (itemsize) {
      case 1: concat_kernel<std::uint8_t><<<grid, block_threads, 0, st>>>(a); break;
      case 4: concat_kernel<std::uint32_t><<<grid, block_threads, 0, st>>>(a); break;
      case 8: concat_kernel<std::uint64_t><<<grid, block_threads, 0, st>>>(a); break;
      default: return cudaErrorInvalidValue;
    }
    if (const Status e = launched()) return e;
  }
  return cudaSuccess;
}

Status one_hot(DT index_dt, DT dt, const void* ix, void* y, std::int64_t n, std::int64_t depth, Stream s) noexcept {
  if (n == 0 || depth == 0) return cudaSuccess;
  const auto st = static_cast<cudaStream_t>(s);
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    if (index_dt == DT::i32)
      one_hot_kernel<<<grid_for(n * depth), block_threads, 0, st>>>(static_cast<const std::int32_t*>(ix), static_cast<T*>(y), n, depth);
    else if (index_dt == DT::i64)
      one_hot_kernel<<<grid_for(n * depth), block_threads, 0, st>>>(static_cast<const std::int64_t*>(ix), static_cast<T*>(y), n, depth);
    else
      return cudaErrorNotSupported;
    return launched();
  });
}

}  // namespace stagecraft::cuda::abi
