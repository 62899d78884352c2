// softmax_cross_entropy(logits, labels): the mean over the batch of -log_softmax(logits)[i, labels[i]]
// as one op, and its gradient softmax_cross_entropy_grad(g, logits, labels) as another. nn::cross_entropy
// was a composite of ~9 ops (their gradients ~8 more): on a GPU each is a launch, so a training step
// of a small model spent more time in its loss than in its layers. One pass per row here, with the
// numbers log_softmax gives: shift = max(row) (0 when not finite), z = x - shift, the row's value
// z[label] - log(sum(exp(z))); the rows' values summed in double, in row order, for the mean.
// Labels outside [0, C) are a ValueError (the CPU kernel: when a staged plan runs; eager callers
// check concrete labels first) or, on a GPU, a fault raised at the next wait, as check_range's.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../backend/cpu/parallel.hpp"
#include "check_range.hpp"  // range_askers, CheckRange::out_of_range: the error the old check gave
#include "rules.hpp"
// The ops the gradient rules (at the end) are written with.
#include "binary.hpp"
#include "gather.hpp"  // one_hot
#include "reduce.hpp"
#include "unary.hpp"

namespace stagecraft {
namespace ops {

namespace xent {

/// The range_askers row of cross_entropy (its label errors read as the eager check's).
inline Attrs label_range(std::int64_t classes) {
  Attrs a;
  a.i0 = 0;
  a.i1 = classes;
  a.i2 = 1;
  return a;
}

/// Checks logits [N, C] (f32/f64) and labels [N] (i32/i64) for op `op`.
inline void check_inputs(std::string_view op, const Tensor& logits, const Tensor& labels, const std::source_location& loc) {
  require_dtype(is_floating(logits.dtype()), op, logits.dtype(), "f32 or f64 logits", loc);
  if (SC_UNLIKELY(labels.dtype() != DType::i32 && labels.dtype() != DType::i64))
    detail::fail<DTypeError>(op, loc, "expects i32 or i64 class labels, got ", name(labels.dtype()),
                             " (cast them with .astype(sc::i64))");
  if (SC_UNLIKELY(logits.rank() != 2 || labels.rank() != 1))
    detail::fail<ShapeError>(op, loc, "expects logits [N, C] and labels [N], got ", logits.shape(), " and ",
                             labels.shape());
  if (SC_UNLIKELY(logits.shape()[0] != labels.shape()[0]))
    detail::fail<ShapeError>(op, loc, "logits ", logits.shape(), " and labels ", labels.shape(),
                             " disagree on the batch size (", logits.shape()[0], " != ", labels.shape()[0], ")");
}

/// Throws the label error for the first label outside [0, C) (serially: the first is reported).
template <class I>
void check_labels(const I* lab, std::int64_t N, std::int64_t C) {
  for (std::int64_t i = 0; i < N; ++i)
    if (SC_UNLIKELY(lab[i] < 0 || static_cast<std::int64_t>(lab[i]) >= C))
      CheckRange::out_of_range(label_range(C), static_cast<std::int64_t>(lab[i]), i);
}

/// The shift of a row: its maximum (NaN when it holds one), or 0 when that is not finite.
template <class T>
T row_shift(const T* x, std::int64_t C) {
  T m = x[0];
  for (std::int64_t j = 1; j < C; ++j) m = rules::Maximum::f(x[j], m);
  return std::fabs(m) < std::numeric_limits<T>::infinity() ? m : T(0);
}

}  // namespace xent

/// Inputs (logits [N, C] f32/f64, labels [N] i32/i64) → the mean over rows of
/// log(sum(exp(z))) - z[label], z = logits - shift (a scalar of the logits' dtype; NaN when N = 0).
struct SoftmaxCrossEntropy {
  SC_OP_HEAD(SoftmaxCrossEntropy, "softmax_cross_entropy")
  static constexpr int arity = 2;
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a);

  static OutMeta infer(Inputs in, const Attrs&, const std::source_location& loc) {
    xent::check_inputs(name, in[0], in[1], loc);
    return {Shape{}, in[0].dtype()};
  }
  /// On the GPU: a warp per row; a label outside is raised at the next wait.
  static void cuda(Inputs in, Tensor& out, const Attrs&, const std::source_location& loc) {
    backend::cuda::softmax_cross_entropy(in[0], in[1], out, "cross_entropy", loc);
  }
  static void cpu(Inputs in, Tensor& out, const Attrs&) {
    const std::int64_t N = in[0].shape()[0], C = in[0].shape()[1];
    visit_floating(in[0].dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      layout::visit_index(in[1].dtype(), [&](auto itag) {
        using I = typename decltype(itag)::type;
        const T* x = static_cast<const T*>(in[0].raw_data());
        const I* lab = static_cast<const I*>(in[1].raw_data());
        xent::check_labels(lab, N, C);
        std::vector<double> picked(static_cast<std::size_t>(N));
        backend::cpu::parallel_rows(N, 4 * C, backend::cpu::grain_cheap, [&](std::int64_t b, std::int64_t e) {
          for (std::int64_t i = b; i < e; ++i) picked[static_cast<std::size_t>(i)] = row_value(x + i * C, lab[i], C);
        });
        double total = 0;
        for (const double v : picked) total += v;
        *static_cast<T*>(out.raw_data()) = static_cast<T>(-(total / static_cast<double>(N)));
      });
    });
  }

  /// z[label] - log(sum(exp(z))) of one row (exp in T, as exp's op; the sum and log in double).
  template <class T>
  static double row_value(const T* x, std::int64_t label, std::int64_t C) {
    const T shift = xent::row_shift(x, C);
    double s = 0;
    for (std::int64_t j = 0; j < C; ++j) s += static_cast<double>(rules::Exp::f(static_cast<T>(x[j] - shift)));
    return static_cast<double>(static_cast<T>(x[label] - shift)) - rules::Log::f(s);
  }
};

/// Inputs (g [], logits [N, C], labels [N]) → dlogits [N, C] = (softmax(logits) - one_hot(labels)) * g / N,
/// softmax_cross_entropy's gradient (and linear in g). Labels outside [0, C) are its errors too.
struct SoftmaxCrossEntropyGrad {
  SC_OP_HEAD(SoftmaxCrossEntropyGrad, "softmax_cross_entropy_grad")
  static constexpr int arity = 3;
  static std::vector<Tensor> vjp(const Tensor& gg, Inputs in, const Tensor& out, const Attrs& a);

  static OutMeta infer(Inputs in, const Attrs&, const std::source_location& loc) {
    xent::check_inputs(name, in[1], in[2], loc);
    if (SC_UNLIKELY(in[0].rank() != 0))
      detail::fail<ShapeError>(name, loc, "g must be a scalar (the loss's gradient), got shape ", in[0].shape());
    if (SC_UNLIKELY(in[0].dtype() != in[1].dtype()))
      detail::fail<DTypeError>(name, loc, "expects g and logits of one dtype, got ", stagecraft::name(in[0].dtype()),
                               " and ", stagecraft::name(in[1].dtype()));
    return {in[1].shape(), in[1].dtype()};
  }
  static void cuda(Inputs in, Tensor& out, const Attrs&, const std::source_location& loc) {
    backend::cuda::softmax_cross_entropy_grad(in[0], in[1], in[2], out, "cross_entropy", loc);
  }
  static void cpu(Inputs in, Tensor& out, const Attrs&) {
    const std::int64_t N = in[1].shape()[0], C = in[1].shape()[1];
    visit_floating(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      layout::visit_index(in[2].dtype(), [&](auto itag) {
        using I = typename decltype(itag)::type;
        const T* x = static_cast<const T*>(in[1].raw_data());
        const I* lab = static_cast<const I*>(in[2].raw_data());
        T* dx = static_cast<T*>(out.raw_data());
        xent::check_labels(lab, N, C);
        const double scale = static_cast<double>(*static_cast<const T*>(in[0].raw_data())) / static_cast<double>(N);
        backend::cpu::parallel_rows(N, 6 * C, backend::cpu::grain_cheap, [&](std::int64_t b, std::int64_t e) {
          for (std::int64_t i = b; i < e; ++i) row_grad(x + i * C, static_cast<std::int64_t>(lab[i]), C, scale, dx + i * C);
        });
      });
    });
  }

  /// (exp(z) / sum(exp(z)) - [j == label]) * scale for one row (exp in T, stored first in dx).
  template <class T>
  static void row_grad(const T* x, std::int64_t label, std::int64_t C, double scale, T* dx) {
    const T shift = xent::row_shift(x, C);
    double s = 0;
    for (std::int64_t j = 0; j < C; ++j) {
      dx[j] = rules::Exp::f(static_cast<T>(x[j] - shift));
      s += static_cast<double>(dx[j]);
    }
    for (std::int64_t j = 0; j < C; ++j)
      dx[j] = static_cast<T>((static_cast<double>(dx[j]) / s - (j == label ? 1.0 : 0.0)) * scale);
  }
};

}  // namespace ops

namespace detail {
/// The op behind nn::cross_entropy (which checks its arguments and concrete labels first).
inline Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const std::source_location& loc) {
  const Tensor in[2] = {logits, labels};
  return dispatch<ops::SoftmaxCrossEntropy>(in, ops::Attrs{}, loc);
}
/// softmax_cross_entropy's gradient for the loss's gradient g (a scalar).
inline Tensor softmax_cross_entropy_grad(const Tensor& g, const Tensor& logits, const Tensor& labels,
                                         const std::source_location& loc = std::source_location::current()) {
  const Tensor in[3] = {g, logits, labels};
  return dispatch<ops::SoftmaxCrossEntropyGrad>(in, ops::Attrs{}, loc);
}
}  // namespace detail

// The loss is linear in nothing, but its gradient is one op; labels get none.
inline std::vector<Tensor> ops::SoftmaxCrossEntropy::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs&) {
  return {detail::softmax_cross_entropy_grad(g, in[0], in[1]), Tensor()};
}

// With P = softmax(x) by rows, Y = one_hot(labels) and s = g / N, the gradient is (P - Y) s:
// d/dg = sum((P - Y) gg) / N; d/dx = s P (gg - rowsum(P gg)) (the softmax's Jacobian, row by row).
inline std::vector<Tensor> ops::SoftmaxCrossEntropyGrad::vjp(const Tensor& gg, Inputs in, const Tensor&, const Attrs&) {
  const Tensor &g = in[0], &x = in[1], &labels = in[2];
  const std::int64_t N = x.shape()[0], C = x.shape()[1];
  const Tensor p = exp(sub(x, logsumexp(x, {1}, true)));
  const Tensor y = one_hot(labels, C, x.dtype());
  const double inv_n = 1.0 / static_cast<double>(N);
  const Tensor dg = mul(sum(mul(sub(p, y), gg)), inv_n);
  const Tensor pg = mul(p, gg);
  const Tensor dx = mul(sub(pg, mul(p, sum(pg, {1}, true))), mul(g, inv_n));
  return {dg, dx, Tensor()};
}

}  // namespace stagecraft
