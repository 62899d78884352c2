// matmul: NumPy semantics (1-D promotion, broadcast batch dims) on OpenBLAS.
#pragma once
#include <array>
#include <climits>
#include <numeric>
#include <vector>

#include "../backend/cpu/blas.hpp"
#include "../eager/dispatch.hpp"
#include "cast.hpp"  // dispatch converts mixed dtypes through cast
#include "reduce.hpp"     // sum: the gradient over broadcast batch dims
#include "reshape.hpp"
#include "transpose.hpp"  // the gradient's transposed operands

namespace stagecraft {
namespace ops {

/// How a matmul call lines up: [batch..., M, K] x [batch..., K, N] after 1-D promotion.
struct MatMulGeometry {
  std::int64_t M = 1, K = 1, N = 1;
  Shape a_batch, b_batch, batch;  ///< each operand's batch dims and their broadcast
  bool a_vec = false, b_vec = false;
};

/// a @ b. 1-D operands are promoted ([K] → [1,K] on the left, [K,1] on the right) and the
/// added axis removed from the result; batch dims broadcast. No attributes.
struct MatMul {
  SC_OP_HEAD(MatMul, "matmul")
  static constexpr int arity = 2;
  static constexpr int promote_from = 0;
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);

  /// The geometry of a @ b, or a ShapeError naming both shapes.
  static MatMulGeometry geometry(const Shape& a, const Shape& b, const std::source_location& loc) {
    if (SC_UNLIKELY(a.rank() == 0 || b.rank() == 0))
      detail::fail<ShapeError>(name, loc, "needs operands of rank >= 1, got shapes ", a, " and ", b);
    MatMulGeometry g;
    g.a_vec = a.rank() == 1;
    g.b_vec = b.rank() == 1;
    g.M = g.a_vec ? 1 : a[a.rank() - 2];
    g.K = a.back();
    const std::int64_t kb = g.b_vec ? b[0] : b[b.rank() - 2];
    g.N = g.b_vec ? 1 : b.back();
    if (SC_UNLIKELY(g.K != kb))
      detail::fail<ShapeError>(name, loc, "inner dimensions do not match: ", a, " x ", b, " (", g.K, " != ", kb, ")");
    g.a_batch = Shape(a.begin(), a.end() - (g.a_vec ? 1 : 2));
    g.b_batch = Shape(b.begin(), b.end() - (g.b_vec ? 1 : 2));
    if (SC_UNLIKELY(!broadcast_shapes(g.a_batch, g.b_batch, g.batch)))
      detail::fail<ShapeError>(name, loc, "batch dimensions do not broadcast: ", a, " x ", b);
    if (SC_UNLIKELY(g.K > INT_MAX || g.N > INT_MAX))  // BLAS takes 32-bit sizes
      detail::fail<ShapeError>(name, loc, "inner or column dimension above 2^31 in ", a, " x ", b);
    return g;
  }

  static OutMeta infer(Inputs in, const Attrs&, const std::source_location& loc) {
    require_dtype(!is_bool(in[0].dtype()), name, in[0].dtype(), "numeric operands", loc);
    const MatMulGeometry g = geometry(in[0].shape(), in[1].shape(), loc);
    Shape out = g.batch;
    if (!g.a_vec) out.push_back(g.M);
    if (!g.b_vec) out.push_back(g.N);
    return {out, in[0].dtype()};
  }

  static void cpu(Inputs in, Tensor& out, const Attrs&) {
    if (out.numel() == 0) return;
    const MatMulGeometry g = geometry(in[0].shape(), in[1].shape(), std::source_location::current());
    visit_numeric(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* A = static_cast<const T*>(in[0].raw_data());
      const T* B = static_cast<const T*>(in[1].raw_data());
      T* C = static_cast<T*>(out.raw_data());
      if (g.b_batch.numel() == 1) {
        // b is one matrix: [..., M, K] x [K, N] is one GEMM [(...)*M, K] x [K, N]; with
        // (...)*M == 1 it becomes a gemv.
        backend::cpu::matmul_2d(g.a_batch.numel() * g.M, g.N, g.K, A, B, C);
        return;
      }
      batched(g, A, B, C);
    });
  }

 private:
  /// One product per broadcast batch index. OpenBLAS threads each product, so the loop
  /// itself stays serial (nesting OpenMP around BLAS would oversubscribe the cores).
  template <class T>
  static void batched(const MatMulGeometry& g, const T* A, const T* B, T* C) {
    const int r = g.batch.rank();
    const Shape sa = broadcast_strides(g.a_batch, g.batch), sb = broadcast_strides(g.b_batch, g.batch);
    const std::int64_t a_mat = g.M * g.K, b_mat = g.K * g.N, c_mat = g.M * g.N, nb = g.batch.numel();
    std::array<std::int64_t, max_rank> idx{};
    std::int64_t oa = 0, ob = 0;
    for (std::int64_t t = 0; t < nb; ++t) {
      backend::cpu::matmul_2d(g.M, g.N, g.K, A + oa * a_mat, B + ob * b_mat, C + t * c_mat);
      for (int d = r - 1; d >= 0; --d) {  // odometer step over the batch index
        oa += sa[d];
        ob += sb[d];
        if (++idx[d] < g.batch[d]) break;
        oa -= sa[d] * g.batch[d];
        ob -= sb[d] * g.batch[d];
        idx[d] = 0;
      }
    }
  }
};

}  // namespace ops

/// Matrix product with NumPy's semantics: [..., M, K] x [..., K, N] → [..., M, N] with the
/// batch dims broadcast; a 1-D operand is a row vector on the left, a column on the right
/// (its axis is dropped from the result). Dtypes are promoted to a common one; bool
/// operands are rejected (DTypeError); an inner-dimension mismatch is a ShapeError.
inline Tensor matmul(const Tensor& a, const Tensor& b, std::source_location loc = std::source_location::current()) {
  detail::require_defined(a, ops::MatMul::name, loc);
  detail::require_defined(b, ops::MatMul::name, loc);
  // Checked before promotion, which would quietly turn a bool mask into 0/1 numbers.
  if (SC_UNLIKELY(is_bool(a.dtype()) || is_bool(b.dtype())))
    detail::fail<DTypeError>(ops::MatMul::name, loc, "expects numeric operands, got ", name(a.dtype()), " and ",
                             name(b.dtype()), " (shapes ", a.shape(), " and ", b.shape(), ")");
  return detail::dispatch2<ops::MatMul>(a, b, {}, loc);
}

namespace detail {

/// x with its last two axes swapped (a copy; rank >= 2).
inline Tensor swap_last_axes(const Tensor& x) {
  const int r = x.rank();
  if (r == 2) return transpose(x);
  std::vector<std::int64_t> perm(static_cast<std::size_t>(r));
  std::iota(perm.begin(), perm.end(), std::int64_t{0});
  std::swap(perm[static_cast<std::size_t>(r - 1)], perm[static_cast<std::size_t>(r - 2)]);
  return transpose(x, perm);
}

/// d, an operand's gradient of shape batch + [rows, cols], summed over the batch axes the
/// operand (batch dims `own`) was broadcast along, then reshaped to the operand's `shape`
/// (which drops the axis a 1-D operand was promoted with). Done here rather than left to the
/// tape's sum_to, which cannot tell a promoted axis from a batch axis.
inline Tensor sum_to_operand(const Tensor& d, const Shape& own, const Shape& batch, const Shape& shape) {
  const int lead = batch.rank() - own.rank();
  Tensor s = d;
  if (lead > 0) {
    std::vector<std::int64_t> axes(static_cast<std::size_t>(lead));
    std::iota(axes.begin(), axes.end(), std::int64_t{0});
    s = sum(s, axes);
  }
  std::vector<std::int64_t> ones_axes;
  for (int i = 0; i < own.rank(); ++i)
    if (own[i] == 1 && batch[lead + i] != 1) ones_axes.push_back(i);
  if (!ones_axes.empty()) s = sum(s, ones_axes, true);
  return s.shape() == shape ? s : reshape(s, shape);
}

}  // namespace detail

// dA = G B^T and dB = A^T G on the 1-D-promoted operands, with G the output gradient as
// [batch..., M, N]; each summed over the batch dims its operand was broadcast along. Only
// public ops, so an outer tape records this rule (second derivatives) and a trace stages it.
inline std::vector<Tensor> ops::MatMul::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs&) {
  const Tensor& a = in[0];
  const Tensor& b = in[1];
  const MatMulGeometry geo = geometry(a.shape(), b.shape(), std::source_location::current());
  const Tensor A = geo.a_vec ? reshape(a, Shape{1, geo.K}) : a;
  const Tensor B = geo.b_vec ? reshape(b, Shape{geo.K, 1}) : b;
  Shape gs = geo.batch;
  gs.push_back(geo.M);
  gs.push_back(geo.N);
  const Tensor G = g.shape() == gs ? g : reshape(g, gs);
  Tensor da = detail::sum_to_operand(matmul(G, detail::swap_last_axes(B)), geo.a_batch, geo.batch, a.shape());
  Tensor db;
  if (geo.b_batch.numel() == 1 && geo.batch.rank() > 0) {
    // One b shared by the whole batch (a dense layer on [..., K]): the batch folds into
    // the rows, so dB is one GEMM [K, rows] x [rows, N] instead of a product per batch
    // index and a sum.
    const std::int64_t rows = geo.batch.numel() * geo.M;
    db = matmul(transpose(reshape(A, Shape{rows, geo.K})), reshape(G, Shape{rows, geo.N}));
    if (db.shape() != b.shape()) db = reshape(db, b.shape());
  } else {
    db = detail::sum_to_operand(matmul(detail::swap_last_axes(A), G), geo.b_batch, geo.batch, b.shape());
  }
  return {std::move(da), std::move(db)};
}

}  // namespace stagecraft
