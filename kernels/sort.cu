// top_k: the indices of the k largest (or smallest) elements of each line of [outer, n, inner] along
// n, in order. Every element is copied out as a (key, flat position) pair, the key made canonical
// (every NaN the positive quiet NaN, which a radix sort puts above +inf; -0 as +0, equal to it, as
// the CPU compares). Two stable radix sorts (CUB's DeviceRadixSort, which never waits for the
// device, so a CUDA graph can capture it) order them: all pairs by key, then by line, which keeps
// each line's key order; equal keys stay in index order, the CPU's total order. The first k of
// each line are written to [outer, k, inner]. (CUB's segmented sort reads its partition sizes back
// to the host past a few hundred lines: a wait, which a graph capture cannot hold.)
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>

#include "common.cuh"

namespace stagecraft::cuda::kernels {
namespace {

/// The key a line sorts by: NaN one positive quiet NaN, -0 as +0; integers as they are.
template <class T>
__device__ T canonical(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    if (v != v) return static_cast<T>(NAN);
    if (v == T(0)) return T(0);
  }
  return v;
}

/// Element j of line `line` = o * inner + i of x as keys[e] with its flat position e = line * n + j.
template <class T>
__global__ void lines_out_kernel(const T* x, T* keys, std::int64_t* pos, std::int64_t lines, std::int64_t n,
                                 std::int64_t inner) {
  const std::int64_t total = lines * n;
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < total;
       e += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t line = e / n, j = e % n, o = line / inner, i = line % inner;
    keys[e] = canonical(x[(o * n + j) * inner + i]);
    pos[e] = e;
  }
}

/// line_of[e] = the line of flat position pos[e].
__global__ void line_keys_kernel(const std::int64_t* pos, std::int64_t* line_of, std::int64_t total, std::int64_t n) {
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < total;
       e += std::int64_t{gridDim.x} * blockDim.x)
    line_of[e] = pos[e] / n;
}

/// idx[o, j, i] = the index along n of the j-th element of sorted line o * inner + i, for j < k.
__global__ void first_k_kernel(const std::int64_t* sorted, std::int64_t* idx, std::int64_t outer, std::int64_t n,
                               std::int64_t inner, std::int64_t k) {
  const std::int64_t total = outer * k * inner;
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < total;
       e += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t i = e % inner, j = (e / inner) % k, o = e / (inner * k);
    idx[e] = sorted[(o * inner + i) * n + j] % n;
  }
}

/// Where top_k's buffers lie in its scratch, each on a 256-byte boundary.
struct SortScratch {
  std::size_t keys_in = 0, keys_out = 0, pos_a = 0, pos_b = 0, line_a = 0, line_b = 0, temp = 0, temp_bytes = 0,
              total = 0;
};
inline std::size_t align256(std::size_t b) { return (b + 255) / 256 * 256; }

/// The bits the line numbers of `lines` lines take (at least 1).
inline int line_bits(std::int64_t lines) {
  return lines <= 1 ? 1 : static_cast<int>(std::bit_width(static_cast<std::uint64_t>(lines - 1)));
}

/// The buffers' places (everything but CUB's temporary storage, which takes the rest from p.temp on).
template <class T>
void lay_out(std::int64_t lines, std::int64_t n, SortScratch& p) {
  std::size_t at = 0;
  const auto take = [&at](std::size_t bytes) {
    const std::size_t here = at;
    at += align256(bytes);
    return here;
  };
  const auto count = static_cast<std::size_t>(lines * n);
  p.keys_in = take(count * sizeof(T));
  p.keys_out = take(count * sizeof(T));
  p.pos_a = take(count * sizeof(std::int64_t));
  p.pos_b = take(count * sizeof(std::int64_t));
  p.line_a = take(lines > 1 ? count * sizeof(std::int64_t) : 0);
  p.line_b = take(lines > 1 ? count * sizeof(std::int64_t) : 0);
  p.temp = at;
}

/// lay_out plus the temporary storage CUB asks for (its size queries run nothing, but they are not free:
/// only top_k_scratch_bytes makes them; the launch hands CUB whatever follows p.temp, and CUB checks it).
template <class T>
Status plan_scratch(std::int64_t lines, std::int64_t n, SortScratch& p) {
  const std::int64_t items = lines * n;
  std::size_t by_key = 0, by_key_desc = 0, by_line = 0;
  // sizes only (null storage): nothing runs
  using cub::DeviceRadixSort;
  const T* knull = nullptr;
  const std::int64_t* inull = nullptr;
  cudaError_t st = DeviceRadixSort::SortPairs(nullptr, by_key, knull, const_cast<T*>(knull), inull,
                                              const_cast<std::int64_t*>(inull), items);
  if (st == cudaSuccess)
    st = DeviceRadixSort::SortPairsDescending(nullptr, by_key_desc, knull, const_cast<T*>(knull), inull,
                                              const_cast<std::int64_t*>(inull), items);
  if (st == cudaSuccess && lines > 1)
    st = DeviceRadixSort::SortPairs(nullptr, by_line, inull, const_cast<std::int64_t*>(inull), inull,
                                    const_cast<std::int64_t*>(inull), items, 0, line_bits(lines));
  if (st != cudaSuccess) return st;
  lay_out<T>(lines, n, p);
  p.temp_bytes = std::max({by_key, by_key_desc, by_line});
  p.total = p.temp + align256(p.temp_bytes);
  return cudaSuccess;
}

template <class T>
Status launch_top_k(const void* x, std::int64_t* idx, std::int64_t outer, std::int64_t n, std::int64_t inner,
                    std::int64_t k, bool largest, void* scratch, std::int64_t scratch_bytes, cudaStream_t s) {
  const std::int64_t lines = outer * inner, items = lines * n;
  SortScratch p;
  lay_out<T>(lines, n, p);
  if (scratch == nullptr || scratch_bytes <= static_cast<std::int64_t>(p.temp)) return cudaErrorInvalidValue;
  p.temp_bytes = static_cast<std::size_t>(scratch_bytes) - p.temp;  // CUB fails if this is short
  auto* base = static_cast<std::byte*>(scratch);
  const auto at = [base](std::size_t off) { return base + off; };
  T* keys_in = reinterpret_cast<T*>(at(p.keys_in));
  T* keys_out = reinterpret_cast<T*>(at(p.keys_out));
  auto* pos_a = reinterpret_cast<std::int64_t*>(at(p.pos_a));
  auto* pos_b = reinterpret_cast<std::int64_t*>(at(p.pos_b));
  lines_out_kernel<T><<<grid_for(items), block_threads, 0, s>>>(static_cast<const T*>(x), keys_in, pos_a, lines, n,
                                                                inner);
  if (const Status st = launched(); st != cudaSuccess) return st;
  std::size_t temp_bytes = p.temp_bytes;
  cudaError_t st = largest ? cub::DeviceRadixSort::SortPairsDescending(at(p.temp), temp_bytes, keys_in, keys_out, pos_a,
                                                                       pos_b, items, 0, int{sizeof(T) * 8}, s)
                           : cub::DeviceRadixSort::SortPairs(at(p.temp), temp_bytes, keys_in, keys_out, pos_a, pos_b,
                                                             items, 0, int{sizeof(T) * 8}, s);
  if (st != cudaSuccess) return st;
  const std::int64_t* sorted = pos_b;
  if (lines > 1) {  // then by line, stably: each line's elements in key order
    auto* line_a = reinterpret_cast<std::int64_t*>(at(p.line_a));
    auto* line_b = reinterpret_cast<std::int64_t*>(at(p.line_b));
    line_keys_kernel<<<grid_for(items), block_threads, 0, s>>>(pos_b, line_a, items, n);
    if (const Status ls = launched(); ls != cudaSuccess) return ls;
    temp_bytes = p.temp_bytes;
    st = cub::DeviceRadixSort::SortPairs(at(p.temp), temp_bytes, line_a, line_b, pos_b, pos_a, items, 0,
                                         line_bits(lines), s);
    if (st != cudaSuccess) return st;
    sorted = pos_a;
  }
  first_k_kernel<<<grid_for(outer * k * inner), block_threads, 0, s>>>(sorted, idx, outer, n, inner, k);
  return launched();
}

}  // namespace
}  // namespace stagecraft::cuda::kernels

namespace stagecraft::cuda::abi {
using namespace stagecraft::cuda::kernels;

Status top_k_scratch_bytes(DT dt, std::int64_t lines, std::int64_t n, std::int64_t* bytes) noexcept {
  *bytes = 0;
  if (lines == 0 || n == 0) return cudaSuccess;
  SortScratch p;
  Status st = cudaErrorInvalidValue;
  switch (dt) {
    case DT::i32: st = plan_scratch<std::int32_t>(lines, n, p); break;
    case DT::i64: st = plan_scratch<std::int64_t>(lines, n, p); break;
    case DT::f32: st = plan_scratch<float>(lines, n, p); break;
    case DT::f64: st = plan_scratch<double>(lines, n, p); break;
    default: break;
  }
  if (st == cudaSuccess) *bytes = static_cast<std::int64_t>(p.total);
  return st;
}

Status top_k(DT dt, const void* x, std::int64_t* idx, std::int64_t outer, std::int64_t n, std::int64_t inner,
             std::int64_t k, bool largest, void* scratch, std::int64_t scratch_bytes, Stream s) noexcept {
  if (outer == 0 || inner == 0 || k == 0) return cudaSuccess;
  if (k > n) return cudaErrorInvalidValue;
  const auto st = static_cast<cudaStream_t>(s);
  switch (dt) {
    case DT::i32: return launch_top_k<std::int32_t>(x, idx, outer, n, inner, k, largest, scratch, scratch_bytes, st);
    case DT::i64: return launch_top_k<std::int64_t>(x, idx, outer, n, inner, k, largest, scratch, scratch_bytes, st);
    case DT::f32: return launch_top_k<float>(x, idx, outer, n, inner, k, largest, scratch, scratch_bytes, st);
    case DT::f64: return launch_top_k<double>(x, idx, outer, n, inner, k, largest, scratch, scratch_bytes, st);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace stagecraft::cuda::abi
