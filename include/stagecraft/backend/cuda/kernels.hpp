// The ops' CUDA hooks: each builds the kernel's geometry from its tensors and calls the compiled
// kernel (abi.hpp) on the output's device stream. Launches are asynchronous; a failed one is a
// DeviceError naming the op and the user's line.
#pragma once
#include <algorithm>
#include <initializer_list>
#include <limits>
#include <source_location>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../../core/tensor.hpp"
#include "../../ops/rules.hpp"
#include "abi.hpp"
#include "runtime.hpp"

namespace stagecraft::backend::cuda {

namespace abi = stagecraft::cuda::abi;
using stagecraft::cuda::detail::check;
using stagecraft::cuda::detail::stream;

inline abi::DT dt(DType d) { return static_cast<abi::DT>(d); }

/// Operands of the given shapes read over a contiguous output of shape `out` (NumPy
/// broadcasting: operands align at the last axis, size-1 and missing axes get stride 0).
inline abi::Geometry geometry(const Shape& out, std::initializer_list<const Shape*> operands) {
  abi::Geometry g;
  g.rank = out.rank();
  g.numel = out.numel();
  g.contiguous = true;
  for (int d = 0; d < g.rank; ++d) g.shape[d] = out[d];
  int k = 0;
  for (const Shape* s : operands) {
    g.contiguous = g.contiguous && *s == out;
    std::int64_t stride = 1;
    for (int d = s->rank() - 1, o = g.rank - 1; d >= 0; --d, --o) {
      g.strides[k][o] = (*s)[d] == 1 ? 0 : stride;
      stride *= (*s)[d];
    }
    ++k;
  }
  return g;
}

/// g's first two operands as a batch's geometry (abi::BatchGeometry): size-1 axes dropped,
/// neighbouring axes merged where both operands allow; false when more than abi::batch_max_rank
/// axes remain or a value does not fit 31 bits (the op then launches its own kernel).
inline bool batch_geometry(const abi::Geometry& g, abi::BatchGeometry& out) {
  constexpr std::int64_t most = std::numeric_limits<std::int32_t>::max();
  std::int64_t shape[max_rank], st[2][max_rank];
  int rank = 0;
  for (int d = 0; d < g.rank; ++d) {
    if (g.shape[d] == 1) continue;
    if (rank > 0 && st[0][rank - 1] == g.strides[0][d] * g.shape[d] && st[1][rank - 1] == g.strides[1][d] * g.shape[d]) {
      shape[rank - 1] *= g.shape[d];
      st[0][rank - 1] = g.strides[0][d];
      st[1][rank - 1] = g.strides[1][d];
      continue;
    }
    shape[rank] = g.shape[d];
    st[0][rank] = g.strides[0][d];
    st[1][rank] = g.strides[1][d];
    ++rank;
  }
  if (rank == 0) {  // one element
    shape[0] = 1;
    st[0][0] = st[1][0] = 0;
    rank = 1;
  }
  if (rank > abi::batch_max_rank) return false;
  out.rank = rank;
  for (int d = 0; d < rank; ++d) {
    if (shape[d] > most || st[0][d] < 0 || st[0][d] > most || st[1][d] < 0 || st[1][d] > most) return false;
    out.shape[d] = static_cast<std::int32_t>(shape[d]);
    out.strides[0][d] = static_cast<std::int32_t>(st[0][d]);
    out.strides[1][d] = static_cast<std::int32_t>(st[1][d]);
  }
  return true;
}

/// The abi enumerator of an op deriving from one of the listed rules (count when none).
template <class Op>
constexpr abi::UnaryRule unary_rule() {
#define SC_MATCH(R) \
  if constexpr (std::is_base_of_v<rules::R, Op>) return abi::UnaryRule::R;
  SC_CUDA_UNARY_RULES(SC_MATCH)
#undef SC_MATCH
  return abi::UnaryRule::count;
}
template <class Op>
constexpr abi::BinaryRule binary_rule() {
#define SC_MATCH(R) \
  if constexpr (std::is_base_of_v<rules::R, Op>) return abi::BinaryRule::R;
  SC_CUDA_BINARY_RULES(SC_MATCH)
#undef SC_MATCH
  return abi::BinaryRule::count;
}

/// out = Op(in[0]) elementwise.
template <class Op>
void unary(std::span<const Tensor> in, Tensor& out, const std::source_location& loc) {
  static_assert(unary_rule<Op>() != abi::UnaryRule::count, "stagecraft: this unary rule has no CUDA kernel");
  const Device d = out.device();
  if (in[0].shape() == out.shape()) {
    abi::BatchOp b;
    b.kind = abi::BatchOp::unary;
    b.rule = static_cast<std::int8_t>(unary_rule<Op>());
    b.dt = dt(in[0].dtype());
    b.a = in[0].raw_data();
    b.y = out.raw_data();
    if (stagecraft::cuda::detail::enqueue_small(d, b, out.numel(), Op::name, loc)) return;
  }
  check(abi::unary(unary_rule<Op>(), dt(in[0].dtype()), in[0].raw_data(), out.raw_data(),
                   geometry(out.shape(), {&in[0].shape()}), stream(d, Op::name, loc)),
        d, Op::name, loc);
}

/// out = Op(in[0], in[1]) with broadcasting.
template <class Op>
void binary(std::span<const Tensor> in, Tensor& out, const std::source_location& loc) {
  static_assert(binary_rule<Op>() != abi::BinaryRule::count, "stagecraft: this binary rule has no CUDA kernel");
  const Device d = out.device();
  const bool a_one = in[0].numel() == 1, b_one = in[1].numel() == 1;
  // (made only when needed: a flat batched op, the common small case, reads no geometry)
  const auto g = [&] { return geometry(out.shape(), {&in[0].shape(), &in[1].shape()}); };
  if (out.numel() <= abi::batch_max_elements) {
    abi::BatchOp b;
    b.kind = abi::BatchOp::binary;
    b.rule = static_cast<std::int8_t>(binary_rule<Op>());
    b.dt = dt(in[0].dtype());
    b.a_one = a_one;
    b.b_one = b_one;
    b.a = in[0].raw_data();
    b.b = in[1].raw_data();
    b.y = out.raw_data();
    // same shapes (or one element): flat; broadcasting: read through the strides
    abi::BatchGeometry bg;
    const bool flat = (a_one || in[0].shape() == out.shape()) && (b_one || in[1].shape() == out.shape());
    if (!flat) b.kind = abi::BatchOp::broadcast;
    if ((flat || batch_geometry(g(), bg)) &&
        stagecraft::cuda::detail::enqueue_small(d, b, out.numel(), Op::name, loc, flat ? nullptr : &bg))
      return;
  }
  check(abi::binary(binary_rule<Op>(), dt(in[0].dtype()), in[0].raw_data(), in[1].raw_data(), out.raw_data(), g(),
                    stream(d, Op::name, loc)),
        d, Op::name, loc);
}

/// out = c ? a : b with broadcasting; c must be bool.
inline void where(const Tensor& c, const Tensor& a, const Tensor& b, Tensor& out, std::string_view op,
                  const std::source_location& loc) {
  const Device d = out.device();
  // small, each operand of out's shape or one element: a select that joins the batch
  const auto flat = [&](const Tensor& t) { return t.numel() == 1 || t.shape() == out.shape(); };
  if (out.numel() <= abi::batch_max_elements && flat(c) && flat(a) && flat(b)) {
    abi::BatchOp s;
    s.kind = abi::BatchOp::select;
    s.rule = c.numel() == 1 ? 1 : 0;
    s.dt = dt(out.dtype());
    s.a_one = a.numel() == 1;
    s.b_one = b.numel() == 1;
    s.c = static_cast<const bool*>(c.raw_data());
    s.a = a.raw_data();
    s.b = b.raw_data();
    s.y = out.raw_data();
    if (stagecraft::cuda::detail::enqueue_small(d, s, out.numel(), op, loc)) return;
  }
  check(abi::where(dt(out.dtype()), static_cast<const bool*>(c.raw_data()), a.raw_data(), b.raw_data(), out.raw_data(),
                   geometry(out.shape(), {&c.shape(), &a.shape(), &b.shape()}), stream(d, op, loc)),
        d, op, loc);
}

/// out = ((in[0] + in[1]) + in[2]) + ... (one shape and dtype, AddOp the add op): when small and
/// eager batching is on, adds into out that join the batch; else abi::add_n_max_inputs inputs a
/// launch, each launch after the first adding to out.
template <class AddOp>
void add_n(std::span<const Tensor> in, Tensor& out, const std::source_location& loc) {
  const Device d = out.device();
  if (in.size() >= 2 && out.numel() <= abi::batch_max_elements && stagecraft::cuda::eager_batching()) {
    binary<AddOp>(in.first(2), out, loc);
    for (std::size_t k = 2; k < in.size(); ++k) {
      const Tensor pair[2] = {out, in[k]};
      binary<AddOp>(pair, out, loc);
    }
    return;
  }
  std::vector<const void*> x;
  x.reserve(in.size());
  for (const Tensor& t : in) x.push_back(t.raw_data());
  const auto launch = [&](const void* const* first, std::size_t n) {
    check(abi::add_n(dt(out.dtype()), first, static_cast<int>(n), out.raw_data(), out.numel(),
                     stream(d, "add_n", loc)),
          d, "add_n", loc);
  };
  std::size_t done = std::min<std::size_t>(abi::add_n_max_inputs, x.size());
  launch(x.data(), done);
  while (done < x.size()) {  // out so far, then the next inputs
    const std::size_t n = std::min<std::size_t>(abi::add_n_max_inputs - 1, x.size() - done);
    x[done - 1] = out.raw_data();
    launch(x.data() + done - 1, n + 1);
    done += n;
  }
}

/// Queues the copy of g's view of src into its view of dst (abi::BatchOp::copy) when it is small;
/// false when it must launch its own kernel.
inline bool batched_copy(const void* src, void* dst, const abi::Geometry& g, DType d, Device dev, std::string_view op,
                         const std::source_location& loc) {
  abi::BatchGeometry bg;
  if (g.numel > abi::batch_max_elements || !batch_geometry(g, bg)) return false;
  abi::BatchOp b;
  b.kind = abi::BatchOp::copy;
  b.dt = dt(d);
  b.a = src;
  b.y = dst;
  return stagecraft::cuda::detail::enqueue_small(dev, b, g.numel, op, loc, &bg);
}

/// Copies the view of src (shape, src_strides in elements) into the view of dst (dst_strides).
inline void strided_copy(const void* src, const Shape& shape, const Shape& src_strides, void* dst,
                         const Shape& dst_strides, DType d, Device dev, std::string_view op,
                         const std::source_location& loc) {
  abi::Geometry g;
  g.rank = shape.rank();
  g.numel = shape.numel();
  const Shape dense = contiguous_strides(shape);
  g.contiguous = src_strides == dense && dst_strides == dense;
  for (int k = 0; k < g.rank; ++k) {
    g.shape[k] = shape[k];
    g.strides[0][k] = src_strides[k];
    g.strides[1][k] = dst_strides[k];
  }
  if (batched_copy(src, dst, g, d, dev, op, loc)) return;
  check(abi::strided_copy(static_cast<int>(itemsize(d)), src, dst, g, stream(dev, op, loc)), dev, op, loc);
}

/// Copies the pieces of a concat into their places (one launch per abi::max_concat_pieces). The
/// plan calls it directly: without CUDA it raises DeviceError instead of referring to the kernels.
inline void concat(std::span<const abi::ConcatPiece> pieces, DType d, Device dev, std::string_view op,
                   const std::source_location& loc) {
#if defined(STAGECRAFT_WITH_CUDA)
  if (stagecraft::cuda::eager_batching()) {
    // small pieces join the batch as copies (rows of `row` elements to rows `pitch` apart); the
    // others keep the concat kernel
    std::vector<abi::ConcatPiece> rest;
    for (const abi::ConcatPiece& p : pieces) {
      const std::int64_t n = p.rows * p.row;
      if (n == 0) continue;
      abi::Geometry g;
      g.rank = 2;
      g.numel = n;
      g.shape[0] = p.rows;
      g.shape[1] = p.row;
      g.strides[0][0] = p.row;
      g.strides[0][1] = g.strides[1][1] = 1;
      g.strides[1][0] = p.pitch;
      if (!batched_copy(p.x, p.y, g, d, dev, op, loc)) rest.push_back(p);
    }
    if (!rest.empty())
      check(abi::concat(static_cast<int>(itemsize(d)), rest.data(), static_cast<int>(rest.size()), stream(dev, op, loc)),
            dev, op, loc);
    return;
  }
  check(abi::concat(static_cast<int>(itemsize(d)), pieces.data(), static_cast<int>(pieces.size()), stream(dev, op, loc)),
        dev, op, loc);
#else
  (void)pieces, (void)d;
  stagecraft::detail::fail<DeviceError>(op, loc, "has no kernel for ", dev.str(), " in this build");
#endif
}

/// out [n..., depth] = one_hot(indices).
inline void one_hot(const Tensor& idx, Tensor& out, std::int64_t depth, std::string_view op,
                    const std::source_location& loc) {
  const Device d = out.device();
  check(abi::one_hot(dt(idx.dtype()), dt(out.dtype()), idx.raw_data(), out.raw_data(), idx.numel(), depth,
                     stream(d, op, loc)),
        d, op, loc);
}

/// out = the running values of x as [outer, n, inner] along n by rule r (ops::ValueScan).
inline void scan(abi::ScanRule r, const Tensor& x, Tensor& out, std::int64_t outer, std::int64_t n, std::int64_t inner,
                 bool exclusive, bool reverse, std::string_view op, const std::source_location& loc) {
  const Device d = out.device();
  check(abi::scan(r, dt(x.dtype()), x.raw_data(), out.raw_data(), outer, n, inner, exclusive, reverse,
                  stream(d, op, loc)),
        d, op, loc);
}

/// out = the linear recurrence of (a, b) as [outer, n, inner] along n (ops::LinearScan).
inline void linear_scan(const Tensor& a, const Tensor& b, Tensor& out, std::int64_t outer, std::int64_t n,
                        std::int64_t inner, bool exclusive, bool reverse, std::string_view op,
                        const std::source_location& loc) {
  const Device d = out.device();
  check(abi::linear_scan(dt(a.dtype()), a.raw_data(), b.raw_data(), out.raw_data(), outer, n, inner, exclusive,
                         reverse, stream(d, op, loc)),
        d, op, loc);
}

/// out (i64) = where the running maximum or minimum of x was first reached (ops::CumArg).
inline void cum_arg(bool is_max, const Tensor& x, Tensor& out, std::int64_t outer, std::int64_t n, std::int64_t inner,
                    bool reverse, std::string_view op, const std::source_location& loc) {
  const Device d = out.device();
  check(abi::cum_arg(is_max, dt(x.dtype()), x.raw_data(), static_cast<std::int64_t*>(out.raw_data()), outer, n, inner,
                     reverse, stream(d, op, loc)),
        d, op, loc);
}

/// out (i64) = the indices of the k first of each line of x as [outer, n, inner] along n, sorted
/// descending (largest) or ascending (ops::TopKIndices); the sort's scratch freed in stream order.
inline void top_k(const Tensor& x, Tensor& out, std::int64_t outer, std::int64_t n, std::int64_t inner, std::int64_t k,
                  bool largest, std::string_view op, const std::source_location& loc) {
  if (out.numel() == 0) return;
  const Device d = out.device();
  std::int64_t bytes = 0;
  check(abi::top_k_scratch_bytes(dt(x.dtype()), outer * inner, n, &bytes), d, op, loc);
  Tensor scratch;
  if (bytes > 0) scratch = stagecraft::detail::empty_tensor(Shape{(bytes + 7) / 8}, DType::i64, d, op, loc);
  check(abi::top_k(dt(x.dtype()), x.raw_data(), static_cast<std::int64_t*>(out.raw_data()), outer, n, inner, k, largest,
                   bytes > 0 ? scratch.raw_data() : nullptr, bytes, stream(d, op, loc)),
        d, op, loc);
}

/// out = x converted to out's dtype.
inline void cast(const Tensor& x, Tensor& out, std::string_view op, const std::source_location& loc) {
  const Device d = out.device();
  abi::BatchOp b;
  b.kind = abi::BatchOp::cast;
  b.dt = dt(x.dtype());
  b.out_dt = dt(out.dtype());
  b.a = x.raw_data();
  b.y = out.raw_data();
  if (stagecraft::cuda::detail::enqueue_small(d, b, out.numel(), op, loc)) return;
  check(abi::cast(dt(x.dtype()), dt(out.dtype()), x.raw_data(), out.raw_data(), out.numel(), stream(d, op, loc)), d, op,
        loc);
}

/// Every element of out = value.
inline void fill(Tensor& out, double value, std::string_view op, const std::source_location& loc) {
  stagecraft::cuda::detail::fill(out.raw_data(), out.device(), dt(out.dtype()), value, out.numel(), op, loc);
}

/// Queues a small sum, max or min (abi::BatchOp::reduce) when its reduced axes are one run of
/// neighbouring axes (x viewed as [outer, red, inner]); false when it must launch its own kernels.
inline bool batched_reduce(abi::ReduceRule r, const Tensor& x, Tensor& out, const bool* mask, std::string_view op,
                           const std::source_location& loc) {
  const Shape& s = x.shape();
  int first = -1, last = -1;
  for (int i = 0; i < s.rank(); ++i)
    if (mask[i]) {
      if (first < 0) first = i;
      else if (last != i - 1) return false;  // (two runs of axes)
      last = i;
    }
  if (first < 0 || x.numel() == 0 || x.numel() > abi::batch_max_elements) return false;
  std::int64_t red = 1, inner = 1;
  for (int i = first; i <= last; ++i) red *= s[i];
  for (int i = last + 1; i < s.rank(); ++i) inner *= s[i];
  abi::BatchOp b;
  b.kind = abi::BatchOp::reduce;
  b.rule = static_cast<std::int8_t>(r);
  b.dt = dt(x.dtype());
  b.red = static_cast<std::int32_t>(red);
  b.inner = static_cast<std::int32_t>(inner);
  b.a = x.raw_data();
  b.y = out.raw_data();
  return stagecraft::cuda::detail::enqueue_small(out.device(), b, x.numel() / red, op, loc);
}

/// out = x reduced over the axes flagged in `mask` (x contiguous).
inline void reduce(abi::ReduceRule r, const Tensor& x, Tensor& out, const bool* mask, std::string_view op,
                   const std::source_location& loc) {
  abi::ReduceGeometry g;
  const Shape& s = x.shape();
  std::int64_t stride = 1, strides[max_rank] = {};
  for (int i = s.rank() - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= s[i];
  }
  g.out_numel = out.numel();
  g.red_numel = 1;
  for (int i = 0; i < s.rank(); ++i) {
    if (mask[i]) {
      g.red_shape[g.red_rank] = s[i];
      g.red_strides[g.red_rank++] = strides[i];
      g.red_numel *= s[i];
    } else {
      g.kept_shape[g.kept_rank] = s[i];
      g.kept_strides[g.kept_rank++] = strides[i];
    }
  }
  const Device d = out.device();
  if (r != abi::ReduceRule::argmax && r != abi::ReduceRule::argmin && batched_reduce(r, x, out, mask, op, loc)) return;
  // A few long rows are cut in pieces: their partials go to scratch (stream-ordered: it is
  // reused only after the reduction's kernels, and held by a CUDA graph's capture).
  const std::int64_t scratch_bytes = abi::reduce_scratch_bytes(g);
  Tensor scratch;
  if (scratch_bytes > 0) scratch = stagecraft::detail::empty_tensor(Shape{scratch_bytes / 8}, DType::i64, d, op, loc);
  check(abi::reduce(r, dt(x.dtype()), x.raw_data(), out.raw_data(), g, scratch_bytes > 0 ? scratch.raw_data() : nullptr,
                    stream(d, op, loc)),
        d, op, loc);
}

/// Offsets (elements) of each broadcast batch's matrix in an operand with batch dims `mine`, for
/// the broadcast batch dims `all`; a uniform stride when there is one (then `offsets` stays empty).
inline void batch_offsets(const Shape& mine, const Shape& all, std::int64_t matrix, std::int64_t& stride,
                          std::vector<std::int64_t>& offsets) {
  if (mine.numel() == 1) {
    stride = 0;
    return;
  }
  if (mine == all) {
    stride = matrix;
    return;
  }
  const abi::Geometry g = geometry(all, {&mine});
  offsets.resize(static_cast<std::size_t>(all.numel()));
  for (std::int64_t b = 0; b < all.numel(); ++b) {
    std::int64_t i = b, off = 0;
    for (int dd = g.rank - 1; dd >= 0; --dd) {
      off += (i % g.shape[dd]) * g.strides[0][dd];
      i /= g.shape[dd];
    }
    offsets[static_cast<std::size_t>(b)] = off * matrix;
  }
}

/// The op's rank-0 / broadcast-free checks were made by infer(); this only lays out the batches.
inline void gemm(const Tensor& a, const Tensor& b, Tensor& out, std::int64_t M, std::int64_t N, std::int64_t K,
                 bool ta, bool tb, const Shape& a_batch, const Shape& b_batch, const Shape& batch, std::string_view op,
                 const std::source_location& loc) {
  abi::GemmArgs g;
  g.M = M;
  g.N = N;
  g.K = K;
  g.ta = ta;
  g.tb = tb;
  g.batch = batch.numel();
  constexpr std::int64_t int_max = std::numeric_limits<int>::max();
  if (SC_UNLIKELY((M > int_max || N > int_max || K > int_max) && is_floating(out.dtype())))
    stagecraft::detail::fail<ShapeError>(op, loc, "cuBLAS takes matrix extents up to 2^31 - 1: the product of ",
                                         ta ? "[" + std::to_string(K) + ", " + std::to_string(M) + "]^T"
                                            : "[" + std::to_string(M) + ", " + std::to_string(K) + "]",
                                         " and ",
                                         tb ? "[" + std::to_string(N) + ", " + std::to_string(K) + "]^T"
                                            : "[" + std::to_string(K) + ", " + std::to_string(N) + "]",
                                         " on ", out.device().str(), " has a larger one");
  const Device d = out.device();
  if (g.batch == 1 && M * N <= abi::batch_max_gemm_outputs && K >= 1 && M * N * K <= abi::batch_max_gemm_work) {
    // a small product joins the batch: one block's threads an output each (a cuBLAS launch would
    // cost more than its work)
    abi::BatchGeometry bg;
    bg.rank = 3;
    bg.shape[0] = static_cast<std::int32_t>(M);
    bg.shape[1] = static_cast<std::int32_t>(N);
    bg.shape[2] = static_cast<std::int32_t>(K);
    bg.strides[0][0] = static_cast<std::int32_t>(ta ? 1 : K);
    bg.strides[0][1] = static_cast<std::int32_t>(ta ? M : 1);
    bg.strides[1][0] = static_cast<std::int32_t>(tb ? 1 : N);
    bg.strides[1][1] = static_cast<std::int32_t>(tb ? K : 1);
    abi::BatchOp small;
    small.kind = abi::BatchOp::gemm;
    small.dt = dt(out.dtype());
    small.a = a.raw_data();
    small.b = b.raw_data();
    small.y = out.raw_data();
    if (stagecraft::cuda::detail::enqueue_small(d, small, M * N, op, loc, &bg)) return;
  }
  std::vector<std::int64_t> ao, bo;
  batch_offsets(a_batch, batch, M * K, g.a_stride, ao);
  batch_offsets(b_batch, batch, K * N, g.b_stride, bo);
  g.a_offsets = ao.empty() ? nullptr : ao.data();
  g.b_offsets = bo.empty() ? nullptr : bo.data();
  check(abi::gemm(dt(out.dtype()), a.raw_data(), b.raw_data(), out.raw_data(), g, d.index(), stream(d, op, loc)), d, op,
        loc);
}

/// The arguments of one product out [M, N] = op(a) op(b), a [M, K] (or [K, M] when ta).
inline abi::GemmArgs matrix_args(const Tensor& a, const Tensor& out, bool ta, bool tb) {
  abi::GemmArgs g;
  g.M = out.shape()[0];
  g.N = out.shape()[1];
  g.K = a.shape()[ta ? 0 : 1];
  g.ta = ta;
  g.tb = tb;
  return g;
}
/// A cuBLASLt call's status: false for not_supported (nothing was queued), true for success; an
/// error throws.
inline bool lt_done(abi::Status st, Device d, const std::source_location& loc) {
  if (st == abi::not_supported) return false;
  check(st, d, "matmul", loc);
  return true;
}

/// out [M, N] = relu?(op(a) op(b) + bias) in one cuBLASLt call (a, b f32 matrices, read transposed
/// where ta/tb; bias [N] or [1, N]); false, with nothing queued, where cuBLASLt cannot (the caller
/// then runs the product and the sum apart).
/// (The plan calls it and gemm_bgrad directly: without CUDA they compile to `false`, so that a
/// CPU-only program built at -O0 does not refer to the kernels' symbols.)
inline bool gemm_bias(const Tensor& a, const Tensor& b, const Tensor& bias, bool relu, bool ta, bool tb, Tensor& out,
                      const std::source_location& loc) {
#if defined(STAGECRAFT_WITH_CUDA)
  const Device d = out.device();
  return lt_done(abi::gemm_bias(dt(out.dtype()), a.raw_data(), b.raw_data(), bias.raw_data(), out.raw_data(),
                                matrix_args(a, out, ta, tb), relu, d.index(), stream(d, "matmul", loc)),
                 d, loc);
#else
  (void)a, (void)b, (void)bias, (void)relu, (void)ta, (void)tb, (void)out, (void)loc;
  return false;
#endif
}

/// out = op(a) b and bgrad = the column sums of b (a dense layer's weight and bias gradients) in one
/// cuBLASLt call; false (nothing queued) where cuBLASLt cannot (the caller runs the product and the
/// sum instead).
inline bool gemm_bgrad(const Tensor& a, const Tensor& b, bool ta, Tensor& out, Tensor& bgrad, const std::source_location& loc) {
#if defined(STAGECRAFT_WITH_CUDA)
  const Device d = out.device();
  return lt_done(abi::gemm_bgrad(dt(out.dtype()), a.raw_data(), b.raw_data(), out.raw_data(), bgrad.raw_data(),
                                 matrix_args(a, out, ta, false), d.index(), stream(d, "matmul", loc)),
                 d, loc);
#else
  (void)a, (void)b, (void)ta, (void)out, (void)bgrad, (void)loc;
  return false;
#endif
}

/// The device's fault record, and a tag for a launch of `op` that can find a bad value there:
/// `site` (what the caller filled in), with the op and the line (the user's; inside a traced
/// plan, the node's), is kept for the error raised later.
inline abi::Fault* fault_record_for(Device d, stagecraft::cuda::detail::FaultSite site, std::string_view op,
                                    const std::source_location& loc, std::int32_t& tag) {
  abi::Fault* record = nullptr;
  check(abi::fault_record(d.index(), &record), d, op, loc);
  site.op = op;
  const stagecraft::detail::SrcLoc* over = stagecraft::detail::context().loc_override;
  site.file = over ? over->file : loc.file_name();
  site.line = over ? over->line : loc.line();
  tag = stagecraft::cuda::detail::fault_log().record(site);
  return record;
}

/// fault_record_for a launch that can find a bad index along `axis` of a tensor of shape xs.
inline abi::Fault* fault_site(Device d, std::string_view op, const std::source_location& loc, std::int64_t axis,
                              const Shape& xs, std::int32_t& tag) {
  stagecraft::cuda::detail::FaultSite site;
  site.axis = axis;
  site.rank = xs.rank();
  for (int k = 0; k < xs.rank(); ++k) site.dims[k] = xs[k];
  return fault_record_for(d, site, op, loc, tag);
}

/// y = x after checking lo <= x < hi on the GPU, without waiting: a value outside is raised at the
/// next wait, as "[op] <what> v at index i is out of range [lo, hi)" at the user's line (op and
/// what: static names, from ops::range_askers).
inline void check_range(const Tensor& x, Tensor& y, std::int64_t lo, std::int64_t hi, std::string_view op,
                        std::string_view what, const std::source_location& loc) {
  const Device d = y.device();
  stagecraft::cuda::detail::FaultSite site;
  site.what = what;
  site.lo = lo;
  site.hi = hi;
  std::int32_t tag = 0;
  abi::Fault* record = fault_record_for(d, site, op, loc, tag);
  check(abi::check_range(dt(x.dtype()), x.raw_data(), y.raw_data(), x.numel(), lo, hi, record, tag, stream(d, op, loc)),
        d, op, loc);
}

/// The learning-rate operand of the fused optimizer kernels: a device pointer when lr lives on the
/// GPU (read when the kernel runs: no wait), else its value read here.
inline const void* rate_on_device(const Tensor& lr, double& host) {
  if (lr.device().is_cuda()) return lr.raw_data();
  host = lr.dtype() == DType::f32 ? static_cast<double>(*static_cast<const float*>(lr.raw_data()))
                                  : *static_cast<const double*>(lr.raw_data());
  return nullptr;
}

/// Calls launch(first entry, count) for each run of at most abi::update_max_tensors entries of t.
template <class F>
void update_launches(std::span<const abi::UpdateTensor> t, F&& launch) {
  for (std::size_t k = 0; k < t.size(); k += abi::update_max_tensors)
    launch(t.data() + k, static_cast<int>(std::min<std::size_t>(abi::update_max_tensors, t.size() - k)));
}

/// Adam's updates of the variables t (abi::UpdateTensor's order: tensors of dtype d on dev, new
/// buffers out), abi::update_max_tensors to a launch; lr (d, one element) on the GPU or the CPU.
/// With decay defined (AdamW: d of dtype d, one element, on the GPU or the CPU), each w is first w - w decay.
inline void adam_update(std::span<const abi::UpdateTensor> t, DType d, Device dev, const Tensor& lr, double a1,
                        double a2, double eps, const Tensor& decay, std::string_view op, const std::source_location& loc) {
  double host = 0, decay_host = 0;
  const void* rate = rate_on_device(lr, host);
  const void* dec = decay.defined() ? rate_on_device(decay, decay_host) : nullptr;
  update_launches(t, [&](const abi::UpdateTensor* first, int n) {
    check(abi::adam_update(dt(d), first, n, rate, host, a1, a2, eps, decay.defined(), dec, decay_host,
                           stream(dev, op, loc)),
          dev, op, loc);
  });
}

/// SGD's updates of the variables t (abi::UpdateTensor's SGD order), as adam_update's.
inline void sgd_update(std::span<const abi::UpdateTensor> t, DType d, Device dev, const Tensor& lr, double momentum,
                       bool nesterov, std::string_view op, const std::source_location& loc) {
  double host = 0;
  const void* rate = rate_on_device(lr, host);
  update_launches(t, [&](const abi::UpdateTensor* first, int n) {
    check(abi::sgd_update(dt(d), first, n, rate, host, momentum, nesterov, stream(dev, op, loc)), dev, op, loc);
  });
}

/// The fault record of a kernel that checks class labels against [0, classes) (cross_entropy's).
inline abi::Fault* label_fault(Device d, std::int64_t classes, std::string_view op, const std::source_location& loc,
                               std::int32_t& tag) {
  stagecraft::cuda::detail::FaultSite site;
  site.what = "label";
  site.lo = 0;
  site.hi = classes;
  return fault_record_for(d, site, op, loc, tag);
}

/// y (a scalar) = softmax_cross_entropy(x [N, C], labels [N]) on the GPU, without waiting: a label
/// outside [0, C) is raised at the next wait as "[op] label v at index i is out of range [0, C)".
inline void softmax_cross_entropy(const Tensor& x, const Tensor& labels, Tensor& y, std::string_view op,
                                  const std::source_location& loc) {
  const Device d = y.device();
  const std::int64_t N = x.shape()[0], C = x.shape()[1];
  std::int32_t tag = 0;
  abi::Fault* fault = label_fault(d, C, op, loc, tag);
  Tensor scratch;  // the rows' values, for a batch too large for one block (freed in stream order)
  if (N * C > abi::xent_one_block) scratch = stagecraft::detail::empty_tensor(Shape{N}, DType::f64, d, op, loc);
  check(abi::softmax_cross_entropy(dt(x.dtype()), dt(labels.dtype()), x.raw_data(), labels.raw_data(), y.raw_data(), N, C,
                                   scratch.defined() ? static_cast<double*>(scratch.raw_data()) : nullptr, fault, tag,
                                   stream(d, op, loc)),
        d, op, loc);
}

/// dx = softmax_cross_entropy_grad(g, x, labels) on the GPU (labels checked as the forward's).
inline void softmax_cross_entropy_grad(const Tensor& g, const Tensor& x, const Tensor& labels, Tensor& dx,
                                       std::string_view op, const std::source_location& loc) {
  const Device d = dx.device();
  const std::int64_t N = x.shape()[0], C = x.shape()[1];
  if (N == 0 || C == 0) return;
  std::int32_t tag = 0;
  abi::Fault* fault = label_fault(d, C, op, loc, tag);
  check(abi::softmax_cross_entropy_grad(dt(x.dtype()), dt(labels.dtype()), g.raw_data(), x.raw_data(), labels.raw_data(),
                                        dx.raw_data(), N, C, fault, tag, stream(d, op, loc)),
        d, op, loc);
}

/// y = softmax_cross_entropy(x, labels) and dx = softmax_cross_entropy_grad(g, x, labels) in one
/// pass (abi::softmax_cross_entropy_both): a bad label is raised once, as the forward's. (The plan
/// calls it directly: without CUDA it compiles to nothing, as gemm_bias does.)
inline void softmax_cross_entropy_both(const Tensor& g, const Tensor& x, const Tensor& labels, Tensor& y, Tensor& dx,
                                       std::string_view op, const std::source_location& loc) {
#if !defined(STAGECRAFT_WITH_CUDA)
  (void)g, (void)x, (void)labels, (void)y, (void)dx, (void)op, (void)loc;
#else
  const Device d = y.device();
  const std::int64_t N = x.shape()[0], C = x.shape()[1];
  std::int32_t tag = 0;
  abi::Fault* fault = label_fault(d, C, op, loc, tag);
  Tensor scratch;
  if (N * C > abi::xent_one_block) scratch = stagecraft::detail::empty_tensor(Shape{N}, DType::f64, d, op, loc);
  check(abi::softmax_cross_entropy_both(dt(x.dtype()), dt(labels.dtype()), g.raw_data(), x.raw_data(), labels.raw_data(),
                                        y.raw_data(), dx.raw_data(), N, C,
                                        scratch.defined() ? static_cast<double*>(scratch.raw_data()) : nullptr, fault, tag,
                                        stream(d, op, loc)),
        d, op, loc);
#endif
}

/// y = gather of x [outer, E, inner] by idx along the middle axis (infer has checked the shapes;
/// indices on the GPU are checked by the kernel, which records a bad one for the next wait).
inline void gather(const Tensor& x, const Tensor& idx, Tensor& y, std::int64_t outer, std::int64_t E,
                   std::int64_t inner, std::int64_t axis, std::string_view op, const std::source_location& loc) {
  const Device d = y.device();
  std::int32_t tag = 0;
  abi::Fault* fault = fault_site(d, op, loc, axis, x.shape(), tag);
  check(abi::gather(static_cast<int>(itemsize(x.dtype())), dt(idx.dtype()), x.raw_data(), idx.raw_data(), y.raw_data(),
                    outer, E, inner, idx.numel(), fault, tag, stream(d, op, loc)),
        d, op, loc);
}
/// y = x with updates added at idx along the middle axis of [outer, E, inner] (bad indices as gather's).
inline void scatter_add(const Tensor& x, const Tensor& idx, const Tensor& updates, Tensor& y, std::int64_t outer,
                        std::int64_t E, std::int64_t inner, std::int64_t axis, std::string_view op,
                        const std::source_location& loc) {
  const Device d = y.device();
  std::int32_t tag = 0;
  abi::Fault* fault = fault_site(d, op, loc, axis, x.shape(), tag);
  check(abi::scatter_add(dt(x.dtype()), dt(idx.dtype()), x.raw_data(), idx.raw_data(), updates.raw_data(), y.raw_data(),
                         outer, E, inner, idx.numel(), fault, tag, stream(d, op, loc)),
        d, op, loc);
}

/// y [outer, M, inner] = x [outer, E, inner] picked by idx (an index per element) along the middle
/// axis; indices on the GPU are checked by the kernel, which records a bad one for the next wait.
inline void take_along_axis(const Tensor& x, const Tensor& idx, Tensor& y, std::int64_t outer, std::int64_t E,
                            std::int64_t inner, std::int64_t M, std::int64_t axis, std::string_view op,
                            const std::source_location& loc) {
  const Device d = y.device();
  std::int32_t tag = 0;
  abi::Fault* fault = fault_site(d, op, loc, axis, x.shape(), tag);
  check(abi::take_along_axis(static_cast<int>(itemsize(x.dtype())), dt(idx.dtype()), x.raw_data(), idx.raw_data(),
                             y.raw_data(), outer, E, inner, M, fault, tag, stream(d, op, loc)),
        d, op, loc);
}
/// y = x with updates added at idx (an index per update) along the middle axis of [outer, E, inner].
inline void add_along_axis(const Tensor& x, const Tensor& idx, const Tensor& updates, Tensor& y, std::int64_t outer,
                           std::int64_t E, std::int64_t inner, std::int64_t M, std::int64_t axis, std::string_view op,
                           const std::source_location& loc) {
  const Device d = y.device();
  std::int32_t tag = 0;
  abi::Fault* fault = fault_site(d, op, loc, axis, x.shape(), tag);
  check(abi::add_along_axis(dt(x.dtype()), dt(idx.dtype()), x.raw_data(), idx.raw_data(), updates.raw_data(),
                            y.raw_data(), outer, E, inner, M, fault, tag, stream(d, op, loc)),
        d, op, loc);
}

/// cols = im2col(x) over the window g (cols [N, C*kh*kw, Ho*Wo], both on one device).
inline void im2col(const Tensor& x, Tensor& cols, const abi::ConvGeometry& g, std::string_view op,
                   const std::source_location& loc) {
  const Device d = cols.device();
  check(abi::im2col(dt(x.dtype()), x.raw_data(), cols.raw_data(), g, stream(d, op, loc)), d, op, loc);
}
/// x = col2im(cols) over the window g (x overwritten).
inline void col2im(const Tensor& cols, Tensor& x, const abi::ConvGeometry& g, std::string_view op,
                   const std::source_location& loc) {
  const Device d = x.device();
  check(abi::col2im(dt(x.dtype()), cols.raw_data(), x.raw_data(), g, stream(d, op, loc)), d, op, loc);
}
/// out = one pass of conv2d through cuDNN (abi::ConvPass says which; a and b as there) when
/// cuda::conv_algorithm() allows it and cuDNN takes the convolution; false, with nothing queued,
/// when the caller is to run the im2col kernels instead. Counted in cuda::conv_stats().
inline bool cudnn_conv(abi::ConvPass pass, const Tensor& a, const Tensor& b, Tensor& out, const abi::ConvGeometry& g,
                       std::int64_t O, std::string_view op, const std::source_location& loc) {
  stagecraft::cuda::detail::ConvSettings& s = stagecraft::cuda::detail::conv_settings();
  if (stagecraft::cuda::conv_algorithm() == stagecraft::cuda::ConvAlgorithm::cudnn) {
    const Device d = out.device();
    const abi::Status st =
        abi::cudnn_conv(pass, dt(out.dtype()), a.raw_data(), b.raw_data(), out.raw_data(), g, O, d.index(), stream(d, op, loc));
    if (st != abi::not_supported) {
      check(st, d, op, loc);
      s.cudnn.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
  }
  s.im2col.fetch_add(1, std::memory_order_relaxed);
  return false;
}
/// y = max or mean pool of x over the window g.
inline void pool2d(bool is_max, const Tensor& x, Tensor& y, const abi::ConvGeometry& g, std::string_view op,
                   const std::source_location& loc) {
  const Device d = y.device();
  check(abi::pool2d(is_max, dt(x.dtype()), x.raw_data(), y.raw_data(), g, stream(d, op, loc)), d, op, loc);
}
/// dx = max_pool2d's gradient for the output gradient g and the input x over the window geo.
inline void max_pool2d_grad(const Tensor& g, const Tensor& x, Tensor& dx, const abi::ConvGeometry& geo,
                            std::string_view op, const std::source_location& loc) {
  const Device d = dx.device();
  check(abi::max_pool2d_grad(dt(x.dtype()), g.raw_data(), x.raw_data(), dx.raw_data(), geo, stream(d, op, loc)), d, op,
        loc);
}

/// Philox samples into out from the device state tensor (i64 [2]: key, offset).
inline void philox(bool normal, const Tensor& state, Tensor& out, double p0, double p1, std::string_view op,
                   const std::source_location& loc) {
  const Device d = out.device();
  check(abi::philox(normal, dt(out.dtype()), static_cast<const std::int64_t*>(state.raw_data()), p0, p1,
                    out.raw_data(), out.numel(), stream(d, op, loc)),
        d, op, loc);
}

}  // namespace stagecraft::backend::cuda
