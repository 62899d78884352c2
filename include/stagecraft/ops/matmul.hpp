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

namespace stagecraft {
namespace ops {

/// How a matmul call lines up: [batch..., M, K] x [batch..., K, N] after 1-D promotion.
struct MatMulGeometry {
  std::int64_t M = 1, K = 1, N = 1;
  Shape a_batch, b_batch, batch;  ///< each operand's batch dims and their broadcast
  bool a_vec = false, b_vec = false;
  bool ta = false, tb = false;    ///< operand stored transposed (its last two axes swapped)
};

/// op(a) @ op(b). 1-D operands are promoted ([K] → [1,K] on the left, [K,1] on the right) and
/// the added axis removed from the result; batch dims broadcast. Attributes: i0 != 0 uses a with
/// its last two axes swapped, i1 != 0 the same for b (BLAS reads the operand transposed: no
/// copy); both are ignored on a 1-D operand.
struct MatMul {
  SC_OP_HEAD(MatMul, "matmul")
  static constexpr int arity = 2;
  static constexpr int promote_from = 0;
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a, Wanted wanted = {});

  /// The geometry of a @ b, or a ShapeError naming both shapes.
  static MatMulGeometry geometry(const Shape& a, const Shape& b, const Attrs& at, const std::source_location& loc) {
    if (SC_UNLIKELY(a.rank() == 0 || b.rank() == 0))
      detail::fail<ShapeError>(name, loc, "needs operands of rank >= 1, got shapes ", a, " and ", b);
    if (SC_UNLIKELY(at.i0 < 0 || at.i0 > 1 || at.i1 < 0 || at.i1 > 1))
      detail::fail<ValueError>(name, loc, "transpose flags must be 0 or 1, got ", at.i0, " and ", at.i1);
    MatMulGeometry g;
    g.a_vec = a.rank() == 1;
    g.b_vec = b.rank() == 1;
    g.ta = at.i0 != 0 && !g.a_vec;
    g.tb = at.i1 != 0 && !g.b_vec;
    const int ra = a.rank(), rb = b.rank();
    g.M = g.a_vec ? 1 : a[ra - (g.ta ? 1 : 2)];
    g.K = g.a_vec ? a[0] : a[ra - (g.ta ? 2 : 1)];
    const std::int64_t kb = g.b_vec ? b[0] : b[rb - (g.tb ? 1 : 2)];
    g.N = g.b_vec ? 1 : b[rb - (g.tb ? 2 : 1)];
    if (SC_UNLIKELY(g.K != kb))
      detail::fail<ShapeError>(name, loc, "inner dimensions do not match: ", a, g.ta ? "^T" : "", " x ", b,
                               g.tb ? "^T" : "", " (", g.K, " != ", kb, ")");
    g.a_batch = Shape(a.begin(), a.end() - (g.a_vec ? 1 : 2));
    g.b_batch = Shape(b.begin(), b.end() - (g.b_vec ? 1 : 2));
    if (SC_UNLIKELY(!broadcast_shapes(g.a_batch, g.b_batch, g.batch)))
      detail::fail<ShapeError>(name, loc, "batch dimensions do not broadcast: ", a, " x ", b);
    if (SC_UNLIKELY(g.K > INT_MAX || g.N > INT_MAX || (g.ta && g.M > INT_MAX)))  // BLAS takes 32-bit sizes
      detail::fail<ShapeError>(name, loc, "inner or column dimension above 2^31 - 1 in ", a, " x ", b,
                               " (BLAS and cuBLAS count in 32-bit int)");
    return g;
  }

  static OutMeta infer(Inputs in, const Attrs& at, const std::source_location& loc) {
    require_dtype(!is_bool(in[0].dtype()), name, in[0].dtype(), "numeric operands", loc);
    const MatMulGeometry g = geometry(in[0].shape(), in[1].shape(), at, loc);
    Shape out = g.batch;
    if (!g.a_vec) out.push_back(g.M);
    if (!g.b_vec) out.push_back(g.N);
    return {out, in[0].dtype()};
  }

  static void cuda(Inputs in, Tensor& out, const Attrs& at, const std::source_location& loc) {
    if (out.numel() == 0) return;
    const MatMulGeometry g = geometry(in[0].shape(), in[1].shape(), at, loc);
    backend::cuda::gemm(in[0], in[1], out, g.M, g.N, g.K, g.ta, g.tb, g.a_batch, g.b_batch, g.batch, name, loc);
  }
  static void cpu(Inputs in, Tensor& out, const Attrs& at) {
    if (out.numel() == 0) return;
    const Shape &sa = in[0].shape(), &sb = in[1].shape();
    if (sa.rank() == 2 && sb.rank() == 2) {  // the common case, without the batch geometry (checked by infer)
      const bool ta = at.i0 != 0, tb = at.i1 != 0;
      visit_numeric(out.dtype(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        backend::cpu::matmul_2d(sa[ta ? 1 : 0], sb[tb ? 0 : 1], sa[ta ? 0 : 1], static_cast<const T*>(in[0].raw_data()),
                                static_cast<const T*>(in[1].raw_data()), static_cast<T*>(out.raw_data()), ta, tb);
      });
      return;
    }
    const MatMulGeometry g = geometry(sa, sb, at, std::source_location::current());
    visit_numeric(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* A = static_cast<const T*>(in[0].raw_data());
      const T* B = static_cast<const T*>(in[1].raw_data());
      T* C = static_cast<T*>(out.raw_data());
      if (g.b_batch.numel() == 1 && !g.ta) {
        // b is one matrix: [..., M, K] x [K, N] is one GEMM [(...)*M, K] x [K, N]; with
        // (...)*M == 1 it becomes a gemv.
        backend::cpu::matmul_2d(g.a_batch.numel() * g.M, g.N, g.K, A, B, C, false, g.tb);
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
      backend::cpu::matmul_2d(g.M, g.N, g.K, A + oa * a_mat, B + ob * b_mat, C + t * c_mat, g.ta, g.tb);
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

/// op(a) @ op(b) where op swaps an operand's last two axes when its flag is set (tf.matmul's
/// transpose_a / transpose_b): the product reads the operand transposed, no copy is made.
/// Flags on a 1-D operand change nothing. Otherwise as matmul(a, b).
inline Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b,
                     std::source_location loc = std::source_location::current()) {
  detail::require_defined(a, ops::MatMul::name, loc);
  detail::require_defined(b, ops::MatMul::name, loc);
  // Checked before promotion, which would quietly turn a bool mask into 0/1 numbers.
  if (SC_UNLIKELY(is_bool(a.dtype()) || is_bool(b.dtype())))
    detail::fail<DTypeError>(ops::MatMul::name, loc, "expects numeric operands, got ", name(a.dtype()), " and ",
                             name(b.dtype()), " (shapes ", a.shape(), " and ", b.shape(), ")");
  ops::Attrs at;
  at.i0 = transpose_a ? 1 : 0;
  at.i1 = transpose_b ? 1 : 0;
  return detail::dispatch2<ops::MatMul>(a, b, at, loc);
}

/// Matrix product with NumPy's semantics: [..., M, K] x [..., K, N] → [..., M, N] with the
/// batch dims broadcast; a 1-D operand is a row vector on the left, a column on the right
/// (its axis is dropped from the result). Dtypes are promoted to a common one; bool
/// operands are rejected (DTypeError); an inner-dimension mismatch is a ShapeError.
inline Tensor matmul(const Tensor& a, const Tensor& b, std::source_location loc = std::source_location::current()) {
  return matmul(a, b, false, false, loc);
}

namespace detail {

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

// C = op(A) op(B) on the 1-D-promoted operands, with G the output gradient as [batch..., M, N]:
//   plain:  dA = G B^T,      dB = A^T G
//   ta:     dA = B G^T,      dB = A G
//   tb:     dA = G B,        dB = G^T A
//   ta, tb: dA = B^T G^T,    dB = G^T A^T
// each a matmul with transpose flags (no transposed copies), summed over the batch dims its
// operand was broadcast along, and each only when wanted (the first layer's input images need
// no gradient: a third of an MLP step's GEMM work). Only public ops, so an outer tape records this rule (second
// derivatives) and a trace stages it.
inline std::vector<Tensor> ops::MatMul::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs& at, Wanted wanted) {
  const Tensor& a = in[0];
  const Tensor& b = in[1];
  const MatMulGeometry geo = geometry(a.shape(), b.shape(), at, std::source_location::current());
  const bool ta = geo.ta, tb = geo.tb;
  const Tensor A = geo.a_vec ? reshape(a, Shape{1, geo.K}) : a;
  const Tensor B = geo.b_vec ? reshape(b, Shape{geo.K, 1}) : b;
  Shape gs = geo.batch;
  gs.push_back(geo.M);
  gs.push_back(geo.N);
  const Tensor G = g.shape() == gs ? g : reshape(g, gs);
  Tensor da, db;
  if (wanted[0]) {
    const Tensor da_full = ta ? matmul(B, G, tb, true) : matmul(G, B, false, !tb);
    da = detail::sum_to_operand(da_full, geo.a_batch, geo.batch, a.shape());
  }
  if (!wanted[1]) {
    // nothing: b does not lead to a source (a layer's weights when only the input is asked)
  } else if (geo.b_batch.numel() == 1 && geo.batch.rank() > 0 && !ta) {
    // One b shared by the whole batch (a dense layer on [..., K]): the batch folds into
    // the rows, so dB is one GEMM over them instead of a product per batch index and a sum.
    const std::int64_t rows = geo.batch.numel() * geo.M;
    const Tensor Af = reshape(A, Shape{rows, geo.K}), Gf = reshape(G, Shape{rows, geo.N});
    db = tb ? matmul(Gf, Af, true, false) : matmul(Af, Gf, true, false);
    if (db.shape() != b.shape()) db = reshape(db, b.shape());
  } else {
    const Tensor db_full = tb ? matmul(G, A, true, ta) : matmul(A, G, !ta, false);
    db = detail::sum_to_operand(db_full, geo.b_batch, geo.batch, b.shape());
  }
  return {std::move(da), std::move(db)};
}

}  // namespace stagecraft
