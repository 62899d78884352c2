// Elementwise kernels: unary and binary rules (ops/rules.hpp, called as they are on the CPU),
// where, cast and fill, over strided and broadcast operands.
#include "batch_elements.cuh"
#include "common.cuh"
#include "stagecraft/ops/rules.hpp"

namespace stagecraft::cuda::kernels {
namespace {

// Which dtypes each rule is instantiated for: the ones dispatch can send it (floating rules f32/f64
// only, arithmetic ones no bool, predicates every dtype): batch_elements.cuh's table, which the
// batches of small ops and the emulator use too.
/// A rule whose result is bool (comparisons, logical ops): the only ones that take bool inputs.
template <class R, class T, class... Args>
constexpr bool bool_rule = std::is_same_v<decltype(R::f(T{}, Args{}...)), bool>;

template <class R, class T>
constexpr bool accepts() {
  return batch::takes<R, T>();
}

template <class R, class T, class Out>
__global__ void unary_kernel(const T* x, Out* y, Geometry g) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < g.numel;
       i += std::int64_t{gridDim.x} * blockDim.x)
    y[i] = static_cast<Out>(R::f(x[g.contiguous ? i : offset_of(g, 0, i)]));
}

template <class R, class T, class Out>
__global__ void binary_kernel(const T* a, const T* b, Out* y, Geometry g) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < g.numel;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t oa = g.contiguous ? i : offset_of(g, 0, i), ob = g.contiguous ? i : offset_of(g, 1, i);
    y[i] = static_cast<Out>(R::f(a[oa], b[ob]));
  }
}

/// How the flat kernels read their operands: each per element (the output's shape, dense), or one
/// of them a single value broadcast (a tensor and a scalar).
enum class Flat : int { both, a_one, b_one, none };

/// Which Flat case g is for a binary op (none: strided or broadcast along some axes).
inline Flat flat_case(const Geometry& g) {
  if (g.contiguous) return Flat::both;
  bool dense[2] = {true, true}, one[2] = {true, true};
  std::int64_t stride = 1;
  for (int d = g.rank - 1; d >= 0; --d) {
    for (int k = 0; k < 2; ++k) {
      dense[k] = dense[k] && (g.shape[d] == 1 || g.strides[k][d] == stride);
      one[k] = one[k] && (g.shape[d] == 1 || g.strides[k][d] == 0);
    }
    stride *= g.shape[d];
  }
  if (one[0] && dense[1]) return Flat::a_one;
  if (dense[0] && one[1]) return Flat::b_one;
  return Flat::none;
}

// The common cases without the geometry: a launch's parameters are 32 bytes instead of ~300
// (an eager op on a small tensor is bound by the launch).
template <class R, class T, class Out>
__global__ void unary_flat_kernel(const T* x, Out* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += std::int64_t{gridDim.x} * blockDim.x)
    y[i] = static_cast<Out>(R::f(x[i]));
}

template <class R, class T, class Out>
__global__ void binary_flat_kernel(const T* a, const T* b, Out* y, std::int64_t n, Flat mode) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += std::int64_t{gridDim.x} * blockDim.x)
    y[i] = static_cast<Out>(R::f(a[mode == Flat::a_one ? 0 : i], b[mode == Flat::b_one ? 0 : i]));
}

template <class T>
__global__ void where_kernel(const bool* c, const T* a, const T* b, T* y, Geometry g) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < g.numel;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const bool m = c[g.contiguous ? i : offset_of(g, 0, i)];
    y[i] = rules::Where::f(m, a[g.contiguous ? i : offset_of(g, 1, i)], b[g.contiguous ? i : offset_of(g, 2, i)]);
  }
}

template <class S, class T>
__global__ void cast_kernel(const S* x, T* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += std::int64_t{gridDim.x} * blockDim.x)
    y[i] = static_cast<T>(rules::Cast<T>::f(x[i]));
}

template <class T>
__global__ void fill_kernel(T v, T* y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += std::int64_t{gridDim.x} * blockDim.x)
    y[i] = v;
}

/// add_n's inputs as its launch's parameter.
struct AddNParams {
  const void* x[abi::add_n_max_inputs];
  int n;
};

template <class T>
__global__ void add_n_kernel(const __grid_constant__ AddNParams p, T* y, std::int64_t numel) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < numel;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    T acc = static_cast<const T*>(p.x[0])[i];
    for (int k = 1; k < p.n; ++k) acc = rules::Add::f(acc, static_cast<const T*>(p.x[k])[i]);
    y[i] = acc;
  }
}

template <class R>
Status launch_unary(DT dt, const void* x, void* y, const Geometry& g, cudaStream_t s) {
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (bool_rule<R, T>) {
      if (g.contiguous)
        unary_flat_kernel<R, T, bool><<<grid_for(g.numel), block_threads, 0, s>>>(static_cast<const T*>(x),
                                                                                   static_cast<bool*>(y), g.numel);
      else
        unary_kernel<R, T, bool><<<grid_for(g.numel), block_threads, 0, s>>>(static_cast<const T*>(x),
                                                                              static_cast<bool*>(y), g);
      return launched();
    } else if constexpr (accepts<R, T>()) {
      if (g.contiguous)
        unary_flat_kernel<R, T, T><<<grid_for(g.numel), block_threads, 0, s>>>(static_cast<const T*>(x),
                                                                                static_cast<T*>(y), g.numel);
      else
        unary_kernel<R, T, T><<<grid_for(g.numel), block_threads, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), g);
      return launched();
    } else {
      return cudaErrorNotSupported;
    }
  });
}

template <class R>
Status launch_binary(DT dt, const void* a, const void* b, void* y, const Geometry& g, cudaStream_t s) {
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    const Flat mode = flat_case(g);
    if constexpr (bool_rule<R, T, T>) {
      if (mode != Flat::none)
        binary_flat_kernel<R, T, bool><<<grid_for(g.numel), block_threads, 0, s>>>(
            static_cast<const T*>(a), static_cast<const T*>(b), static_cast<bool*>(y), g.numel, mode);
      else
        binary_kernel<R, T, bool><<<grid_for(g.numel), block_threads, 0, s>>>(
            static_cast<const T*>(a), static_cast<const T*>(b), static_cast<bool*>(y), g);
      return launched();
    } else if constexpr (accepts<R, T>()) {
      if (mode != Flat::none)
        binary_flat_kernel<R, T, T><<<grid_for(g.numel), block_threads, 0, s>>>(
            static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y), g.numel, mode);
      else
        binary_kernel<R, T, T><<<grid_for(g.numel), block_threads, 0, s>>>(
            static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y), g);
      return launched();
    } else {
      return cudaErrorNotSupported;
    }
  });
}

}  // namespace
}  // namespace stagecraft::cuda::kernels

namespace stagecraft::cuda::abi {
using namespace stagecraft::cuda::kernels;

Status unary(UnaryRule r, DT dt, const void* x, void* y, const Geometry& g, Stream s) noexcept {
  if (g.numel == 0) return cudaSuccess;
  const auto st = static_cast<cudaStream_t>(s);
  switch (r) {
#define SC_CASE(R) \
  case UnaryRule::R: return launch_unary<rules::R>(dt, x, y, g, st);
    SC_CUDA_UNARY_RULES(SC_CASE)
#undef SC_CASE
    default: return cudaErrorInvalidValue;
  }
}

Status binary(BinaryRule r, DT dt, const void* a, const void* b, void* y, const Geometry& g, Stream s) noexcept {
  if (g.numel == 0) return cudaSuccess;
  const auto st = static_cast<cudaStream_t>(s);
  switch (r) {
#define SC_CASE(R) \
  case BinaryRule::R: return launch_binary<rules::R>(dt, a, b, y, g, st);
    SC_CUDA_BINARY_RULES(SC_CASE)
#undef SC_CASE
    default: return cudaErrorInvalidValue;
  }
}

Status add_n(DT dt, const void* const* x, int n, void* y, std::int64_t numel, Stream s) noexcept {
  if (n < 1 || n > add_n_max_inputs || dt == DT::b8) return cudaErrorInvalidValue;
  if (numel == 0) return cudaSuccess;
  AddNParams p;
  for (int k = 0; k < n; ++k) p.x[k] = x[k];
  p.n = n;
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      return cudaErrorInvalidValue;
    } else {
      add_n_kernel<T><<<grid_for(numel), block_threads, 0, static_cast<cudaStream_t>(s)>>>(p, static_cast<T*>(y), numel);
      return launched();
    }
  });
}

Status where(DT dt, const bool* c, const void* a, const void* b, void* y, const Geometry& g, Stream s) noexcept {
  if (g.numel == 0) return cudaSuccess;
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    where_kernel<T><<<grid_for(g.numel), block_threads, 0, static_cast<cudaStream_t>(s)>>>(
        c, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y), g);
    return launched();
  });
}

Status cast(DT from, DT to, const void* x, void* y, std::int64_t n, Stream s) noexcept {
  if (n == 0) return cudaSuccess;
  return visit(from, [&](auto from_tag) -> Status {
    using S = decltype(from_tag);
    return visit(to, [&](auto to_tag) -> Status {
      using T = decltype(to_tag);
      cast_kernel<S, T><<<grid_for(n), block_threads, 0, static_cast<cudaStream_t>(s)>>>(static_cast<const S*>(x),
                                                                                           static_cast<T*>(y), n);
      return launched();
    });
  });
}

Status fill(DT dt, double value, void* y, std::int64_t n, Stream s) noexcept {
  if (n == 0) return cudaSuccess;
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    fill_kernel<T><<<grid_for(n), block_threads, 0, static_cast<cudaStream_t>(s)>>>(static_cast<T>(value),
                                                                                    static_cast<T*>(y), n);
    return launched();
  });
}

}  // namespace stagecraft::cuda::abi
