// Naive reference evaluator for the conformance suite: plain loops over std::vector<double>,
// written independently of the library (own indexing, broadcasting and promotion rules), so a
// bug shared by a kernel and its test cannot hide.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <stagecraft/core/dtype.hpp>  // only the DType tag; none of the library's rules

namespace sc = stagecraft;

namespace conf {

using Dims = std::vector<std::int64_t>;

/// A reference tensor: values in row-major order as doubles, its shape and the dtype the
/// library's result must have. `scale`, when non-empty, is a per-element error scale (e.g.
/// sum of |x| for a sum) used by the comparison instead of |value|.
struct Ref {
  Dims shape;
  std::vector<double> v;
  sc::DType dtype = sc::DType::f32;
  std::vector<double> scale;
  std::int64_t numel() const { return static_cast<std::int64_t>(v.size()); }
};

/// Number of elements of a shape (1 for rank 0).
std::int64_t numel(const Dims& s);
/// "[2, 3]".
std::string str(const Dims& s);
/// Multi-index of a flat row-major position.
Dims unravel(std::int64_t flat, const Dims& shape);
/// Flat row-major position of a multi-index.
std::int64_t ravel(const Dims& idx, const Dims& shape);
/// Axis in [0, rank) from a possibly negative one (the reference trusts its cases).
int norm_axis(std::int64_t axis, int rank);
/// A Ref of the given shape and dtype, zero-filled.
Ref make_ref(const Dims& shape, sc::DType d);
/// The value v stored in dtype d: float rounding for f32, truncation toward 0 for ints,
/// v != 0 for bool (what the library's result must hold exactly, before tolerance).
double round_to(double v, sc::DType d);

// ---- dtype rules, written out as tables (not the library's promote()) ---------------------

/// The common dtype of two tensors (bool < i32 < i64 < f32 < f64).
sc::DType promote2(sc::DType a, sc::DType b);
/// f32 for bool/int dtypes, else d (ops that only compute in floating point).
sc::DType float_of(sc::DType d);

// ---- elementwise with broadcasting --------------------------------------------------------

/// NumPy broadcast shape; false when the shapes do not broadcast.
bool broadcast_dims(const Dims& a, const Dims& b, Dims& out);
/// The flat index of `in` that output multi-index `out_idx` reads under broadcasting.
std::int64_t broadcast_source(const Dims& out_idx, const Dims& in_shape);

using Fn1 = std::function<double(double)>;
using Fn2 = std::function<double(double, double)>;
/// y[i] = f(x[i]) stored as dtype out (values rounded to out).
Ref map1(const Ref& x, sc::DType out, const Fn1& f);
/// y = f(a, b) broadcast; inputs are first rounded to `in` (the dtype the op computes in).
Ref map2(const Ref& a, const Ref& b, sc::DType in, sc::DType out, const Fn2& f);
/// where(c, a, b) broadcast over all three, values of a/b rounded to out.
Ref select3(const Ref& c, const Ref& a, const Ref& b, sc::DType out);

// ---- reductions ----------------------------------------------------------------------------

/// Reduces over `axes` (empty = all; negative allowed): f(values of one group, in order).
/// The group values are in row-major order of the reduced axes.
Ref reduce(const Ref& x, Dims axes, bool keepdims, sc::DType out,
           const std::function<double(const std::vector<double>&)>& f);
/// Per-output sum of |x| over the group (error scale of sums).
std::vector<double> reduce_abs_sum(const Ref& x, Dims axes);

// ---- layout -------------------------------------------------------------------------------

Ref transpose(const Ref& x, Dims perm);
Ref reshape(const Ref& x, Dims shape);  ///< one -1 allowed
Ref broadcast_to(const Ref& x, const Dims& shape);
Ref concat(const std::vector<Ref>& xs, std::int64_t axis);
/// xs (one shape) added left to right in their common dtype, each sum rounded to it.
Ref add_n(const std::vector<Ref>& xs);
Ref stack(const std::vector<Ref>& xs, std::int64_t axis);
Ref slice(const Ref& x, const Dims& begin, const Dims& size);  ///< begin < 0: from the end; size -1: to the end
Ref gather(const Ref& x, const Ref& idx, std::int64_t axis);  ///< idx < 0 counts from the end
Ref one_hot(const Ref& idx, std::int64_t depth, sc::DType d);

// ---- linear algebra, convolution, pooling, nn ---------------------------------------------

/// Batched a[..., M, K] x b[..., K, N], broadcast batch dims, 1-D operands as NumPy;
/// scale = sum |a_ik b_kj| * sqrt(K).
Ref matmul(const Ref& a, const Ref& b);
/// NCHW x OIHW direct convolution; scale = sum of |x w| * sqrt(terms) per output.
Ref conv2d(const Ref& x, const Ref& w, std::int64_t stride, std::int64_t pad);
/// conv2d's gradient w.r.t. x for the output gradient g [N,O,OH,OW]: scatter g * w onto every
/// pixel a window reads, image shape `image`; scale = sum of |g w| * sqrt(terms) per pixel.
Ref conv2d_grad_input(const Ref& g, const Ref& w, const Dims& image, std::int64_t stride, std::int64_t pad);
/// conv2d's gradient w.r.t. w: sum over the batch and windows of g * x, kernel shape `kernel`;
/// scale = sum of |g x| * sqrt(terms) per weight.
Ref conv2d_grad_filter(const Ref& x, const Ref& g, const Dims& kernel, std::int64_t stride, std::int64_t pad);
/// Patches of NCHW x as [N, C*KH*KW, OH*OW] (column index c*KH*KW + i*KW + j).
Ref im2col(const Ref& x, std::int64_t kh, std::int64_t kw, std::int64_t stride, std::int64_t pad);
/// Adds columns [N, C*KH*KW, OH*OW] back into an image of shape [N, C, H, W].
Ref col2im(const Ref& cols, const Dims& image, std::int64_t kh, std::int64_t kw, std::int64_t stride,
           std::int64_t pad);
/// max or mean over k x k windows of NCHW x, no padding.
Ref pool2d(const Ref& x, std::int64_t k, std::int64_t stride, bool is_max);
/// exp(x - max) / sum along axis (and its log when log_form); computed in double.
Ref softmax(const Ref& x, std::int64_t axis, bool log_form);
/// mean over rows of logsumexp(logits[n]) - logits[n, label[n]].
Ref cross_entropy(const Ref& logits, const Ref& labels);

// ---- creation and random numbers ----------------------------------------------------------

/// A tensor of `shape` holding `value` stored in dtype d.
Ref filled(const Dims& shape, double value, sc::DType d);
/// Normal draws as the random_normal op defines them: value 4b + j comes from block b of the
/// Philox4x32-10 stream (key, counter offset + b), words paired by Box–Muller (cos, sin).
/// scale = |mean| + |stddev * radius| (the terms the result adds).
Ref random_normal(std::uint64_t key, std::uint64_t offset, const Dims& shape, double mean, double stddev, sc::DType d);
/// Uniform draws in [lo, hi) as random_uniform defines them: lo + (hi - lo) * word / 2^32, a
/// result that rounds up to hi in d replaced by the next value of d below it. scale = |lo| + |hi - lo|.
Ref random_uniform(std::uint64_t key, std::uint64_t offset, const Dims& shape, double lo, double hi, sc::DType d);

}  // namespace conf
