// Naive reference evaluator: plain loops over doubles, no part of the library but the DType tag.
#include "reference.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace conf {

using sc::DType;

std::int64_t numel(const Dims& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string str(const Dims& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

Dims unravel(std::int64_t flat, const Dims& shape) {
  Dims idx(shape.size());
  for (std::size_t i = shape.size(); i-- > 0;) {
    idx[i] = shape[i] ? flat % shape[i] : 0;
    flat = shape[i] ? flat / shape[i] : 0;
  }
  return idx;
}

std::int64_t ravel(const Dims& idx, const Dims& shape) {
  std::int64_t flat = 0;
  for (std::size_t i = 0; i < shape.size(); ++i) flat = flat * shape[i] + idx[i];
  return flat;
}

int norm_axis(std::int64_t axis, int rank) { return static_cast<int>(axis < 0 ? axis + rank : axis); }

Ref make_ref(const Dims& shape, DType d) {
  Ref r;
  r.shape = shape;
  r.dtype = d;
  r.v.assign(static_cast<std::size_t>(numel(shape)), 0.0);
  return r;
}

double round_to(double v, DType d) {
  switch (d) {
    case DType::b8: return v != 0 ? 1.0 : 0.0;  // NaN != 0: true
    case DType::i32:
    case DType::i64: return std::trunc(v);
    case DType::f32: return static_cast<double>(static_cast<float>(v));
    case DType::f64: break;
  }
  return v;
}

DType promote2(DType a, DType b) {
  // Row: a, column: b, in the order bool, i32, i64, f32, f64.
  static const DType table[5][5] = {
      {DType::b8, DType::i32, DType::i64, DType::f32, DType::f64},
      {DType::i32, DType::i32, DType::i64, DType::f32, DType::f64},
      {DType::i64, DType::i64, DType::i64, DType::f32, DType::f64},
      {DType::f32, DType::f32, DType::f32, DType::f32, DType::f64},
      {DType::f64, DType::f64, DType::f64, DType::f64, DType::f64},
  };
  return table[static_cast<int>(a)][static_cast<int>(b)];
}

DType float_of(DType d) { return d == DType::f64 ? DType::f64 : DType::f32; }

bool broadcast_dims(const Dims& a, const Dims& b, Dims& out) {
  const std::size_t r = std::max(a.size(), b.size());
  out.assign(r, 1);
  for (std::size_t i = 0; i < r; ++i) {
    // Walk from the right: i-th trailing axis of each.
    const std::int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    const std::int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (da != db && da != 1 && db != 1) return false;
    out[r - 1 - i] = da == 1 ? db : da;
  }
  return true;
}

std::int64_t broadcast_source(const Dims& out_idx, const Dims& in_shape) {
  const std::size_t lead = out_idx.size() - in_shape.size();
  std::int64_t flat = 0;
  for (std::size_t i = 0; i < in_shape.size(); ++i) {
    const std::int64_t j = in_shape[i] == 1 ? 0 : out_idx[lead + i];
    flat = flat * in_shape[i] + j;
  }
  return flat;
}

namespace {
// broadcast_source of flat output position `flat`, without building the multi-index.
std::int64_t source_of(std::int64_t flat, const Dims& out, const Dims& in) {
  std::int64_t src = 0, mult = 1;
  const std::size_t lead = out.size() - in.size();
  for (std::size_t a = out.size(); a-- > lead;) {
    const std::int64_t coord = flat % out[a];
    flat /= out[a];
    const std::int64_t e = in[a - lead];
    src += (e == 1 ? 0 : coord) * mult;
    mult *= e;
  }
  return src;
}
}  // namespace

Ref map1(const Ref& x, DType out, const Fn1& f) {
  Ref y = make_ref(x.shape, out);
  for (std::int64_t i = 0; i < x.numel(); ++i) y.v[i] = round_to(f(x.v[i]), out);
  return y;
}

Ref map2(const Ref& a, const Ref& b, DType in, DType out, const Fn2& f) {
  Dims shape;
  if (!broadcast_dims(a.shape, b.shape, shape)) throw std::logic_error("reference: shapes do not broadcast");
  Ref y = make_ref(shape, out);
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    const double va = round_to(a.v[source_of(i, shape, a.shape)], in);
    const double vb = round_to(b.v[source_of(i, shape, b.shape)], in);
    y.v[i] = round_to(f(va, vb), out);
  }
  return y;
}

Ref select3(const Ref& c, const Ref& a, const Ref& b, DType out) {
  Dims ab, shape;
  if (!broadcast_dims(a.shape, b.shape, ab) || !broadcast_dims(c.shape, ab, shape))
    throw std::logic_error("reference: shapes do not broadcast");
  Ref y = make_ref(shape, out);
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    const bool cond = c.v[source_of(i, shape, c.shape)] != 0;
    y.v[i] = round_to(cond ? a.v[source_of(i, shape, a.shape)] : b.v[source_of(i, shape, b.shape)], out);
  }
  return y;
}

namespace {
// Which axes are reduced (empty list = all), and the output shape with or without them.
std::vector<bool> reduced_mask(const Dims& shape, const Dims& axes) {
  const int r = static_cast<int>(shape.size());
  std::vector<bool> m(shape.size(), axes.empty());
  for (auto a : axes) m[norm_axis(a, r)] = true;
  return m;
}
// Groups of input values per output element, each group in row-major order.
std::vector<std::vector<double>> groups_of(const Ref& x, const std::vector<bool>& mask, Dims& kept) {
  kept.clear();
  for (std::size_t i = 0; i < x.shape.size(); ++i)
    if (!mask[i]) kept.push_back(x.shape[i]);
  std::vector<std::vector<double>> g(static_cast<std::size_t>(numel(kept)));
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    // The output position: the kept coordinates of i, in row-major order (no allocation).
    std::int64_t rem = i, out = 0, mult = 1;
    for (std::size_t a = x.shape.size(); a-- > 0;) {
      const std::int64_t coord = rem % x.shape[a];
      rem /= x.shape[a];
      if (!mask[a]) {
        out += coord * mult;
        mult *= x.shape[a];
      }
    }
    g[out].push_back(x.v[i]);
  }
  return g;
}
}  // namespace

Ref reduce(const Ref& x, Dims axes, bool keepdims, DType out,
           const std::function<double(const std::vector<double>&)>& f) {
  const auto mask = reduced_mask(x.shape, axes);
  Dims kept;
  const auto groups = groups_of(x, mask, kept);
  Dims shape;
  for (std::size_t i = 0; i < x.shape.size(); ++i)
    if (!mask[i]) shape.push_back(x.shape[i]);
    else if (keepdims) shape.push_back(1);
  Ref y = make_ref(shape, out);
  for (std::size_t i = 0; i < groups.size(); ++i) y.v[i] = round_to(f(groups[i]), out);
  return y;
}

std::vector<double> reduce_abs_sum(const Ref& x, Dims axes) {
  Dims kept;
  const auto groups = groups_of(x, reduced_mask(x.shape, axes), kept);
  std::vector<double> s;
  for (const auto& g : groups) {
    double t = 0;
    for (double v : g) t += std::fabs(v);
    s.push_back(t);
  }
  return s;
}

Ref transpose(const Ref& x, Dims perm) {
  const int r = static_cast<int>(x.shape.size());
  if (perm.empty())
    for (int i = r - 1; i >= 0; --i) perm.push_back(i);
  Dims shape(r);
  for (int i = 0; i < r; ++i) shape[i] = x.shape[norm_axis(perm[i], r)];
  Ref y = make_ref(shape, x.dtype);
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    const Dims oi = unravel(i, shape);
    Dims ii(r);
    for (int a = 0; a < r; ++a) ii[norm_axis(perm[a], r)] = oi[a];
    y.v[i] = x.v[ravel(ii, x.shape)];
  }
  return y;
}

Ref reshape(const Ref& x, Dims shape) {
  std::int64_t known = 1, hole = -1;
  for (std::size_t i = 0; i < shape.size(); ++i)
    if (shape[i] == -1) hole = static_cast<std::int64_t>(i);
    else known *= shape[i];
  if (hole >= 0) shape[hole] = known ? x.numel() / known : 0;
  Ref y = x;
  y.shape = shape;
  return y;
}

Ref broadcast_to(const Ref& x, const Dims& shape) {
  Ref y = make_ref(shape, x.dtype);
  for (std::int64_t i = 0; i < y.numel(); ++i) y.v[i] = x.v[source_of(i, shape, x.shape)];
  return y;
}

Ref concat(const std::vector<Ref>& xs, std::int64_t axis) {
  const int r = static_cast<int>(xs[0].shape.size());
  const int ax = norm_axis(axis, r);
  Dims shape = xs[0].shape;
  shape[ax] = 0;
  DType d = xs[0].dtype;
  for (const Ref& x : xs) {
    shape[ax] += x.shape[ax];
    d = promote2(d, x.dtype);
  }
  Ref y = make_ref(shape, d);
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    Dims idx = unravel(i, shape);
    for (const Ref& x : xs) {  // find the input that holds this position along the axis
      if (idx[ax] < x.shape[ax]) {
        y.v[i] = round_to(x.v[ravel(idx, x.shape)], d);
        break;
      }
      idx[ax] -= x.shape[ax];
    }
  }
  return y;
}

Ref add_n(const std::vector<Ref>& xs) {
  DType d = xs[0].dtype;
  for (const Ref& x : xs) d = promote2(d, x.dtype);
  Ref y = make_ref(xs[0].shape, d);
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    double acc = round_to(xs[0].v[i], d);
    for (std::size_t k = 1; k < xs.size(); ++k) acc = round_to(acc + round_to(xs[k].v[i], d), d);
    y.v[i] = acc;
  }
  return y;
}

Ref stack(const std::vector<Ref>& xs, std::int64_t axis) {
  const int ax = norm_axis(axis, static_cast<int>(xs[0].shape.size()) + 1);
  std::vector<Ref> ex;
  for (const Ref& x : xs) {
    Ref e = x;
    e.shape.insert(e.shape.begin() + ax, 1);
    ex.push_back(e);
  }
  return concat(ex, ax);
}

Ref slice(const Ref& x, const Dims& begin, const Dims& size) {
  Dims shape(x.shape.size()), start(x.shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) {
    start[i] = begin[i] < 0 ? begin[i] + x.shape[i] : begin[i];  // negative: from the end
    shape[i] = size[i] == -1 ? x.shape[i] - start[i] : size[i];
  }
  Ref y = make_ref(shape, x.dtype);
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    Dims idx = unravel(i, shape);
    for (std::size_t a = 0; a < idx.size(); ++a) idx[a] += start[a];
    y.v[i] = x.v[ravel(idx, x.shape)];
  }
  return y;
}

Ref gather(const Ref& x, const Ref& idx, std::int64_t axis) {
  const int r = static_cast<int>(x.shape.size());
  const int ax = norm_axis(axis, r);
  Dims shape(x.shape.begin(), x.shape.begin() + ax);
  shape.insert(shape.end(), idx.shape.begin(), idx.shape.end());
  shape.insert(shape.end(), x.shape.begin() + ax + 1, x.shape.end());
  Ref y = make_ref(shape, x.dtype);
  const std::size_t ni = idx.shape.size();
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    const Dims oi = unravel(i, shape);
    Dims ii(oi.begin(), oi.begin() + ax);
    const Dims which(oi.begin() + ax, oi.begin() + ax + static_cast<std::int64_t>(ni));
    const auto k = static_cast<std::int64_t>(idx.v[ravel(which, idx.shape)]);
    ii.push_back(k < 0 ? k + x.shape[ax] : k);  // negative: from the end
    ii.insert(ii.end(), oi.begin() + ax + static_cast<std::int64_t>(ni), oi.end());
    y.v[i] = x.v[ravel(ii, x.shape)];
  }
  return y;
}

Ref one_hot(const Ref& idx, std::int64_t depth, DType d) {
  Dims shape = idx.shape;
  shape.push_back(depth);
  Ref y = make_ref(shape, d);
  for (std::int64_t i = 0; i < idx.numel(); ++i) {
    const auto k = static_cast<std::int64_t>(idx.v[i]);
    if (k >= 0 && k < depth) y.v[i * depth + k] = 1;
  }
  return y;
}

Ref matmul(const Ref& a_in, const Ref& b_in) {
  // NumPy's 1-D rule: [K] is a row on the left, a column on the right; its axis is dropped.
  Ref a = a_in, b = b_in;
  const bool a_vec = a.shape.size() == 1, b_vec = b.shape.size() == 1;
  if (a_vec) a.shape.insert(a.shape.begin(), 1);
  if (b_vec) b.shape.push_back(1);
  const std::size_t ra = a.shape.size(), rb = b.shape.size();
  const std::int64_t M = a.shape[ra - 2], K = a.shape[ra - 1], N = b.shape[rb - 1];
  const Dims ba(a.shape.begin(), a.shape.end() - 2), bb(b.shape.begin(), b.shape.end() - 2);
  Dims batch;
  if (!broadcast_dims(ba, bb, batch)) throw std::logic_error("reference: batch dims do not broadcast");
  Dims shape = batch;
  shape.push_back(M);
  shape.push_back(N);
  Ref y = make_ref(shape, promote2(a.dtype, b.dtype));
  y.scale.assign(y.v.size(), 0.0);
  for (std::int64_t bi = 0; bi < numel(batch); ++bi) {
    const Dims idx = unravel(bi, batch);
    const std::int64_t oa = broadcast_source(idx, ba) * M * K, ob = broadcast_source(idx, bb) * K * N;
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t n = 0; n < N; ++n) {
        double s = 0, s_abs = 0;
        for (std::int64_t k = 0; k < K; ++k) {
          const double p = a.v[oa + m * K + k] * b.v[ob + k * N + n];
          s += p;
          s_abs += std::fabs(p);
        }
        const std::int64_t o = (bi * M + m) * N + n;
        y.v[o] = round_to(s, y.dtype);
        // A length-K dot product: rounding errors grow like sqrt(K) ulps of sum |a b| (random
        // signs); the worst case, K ulps, would hide indexing bugs in large products.
        y.scale[o] = s_abs * std::sqrt(static_cast<double>(K));
      }
  }
  if (b_vec) y.shape.pop_back();
  if (a_vec) y.shape.erase(y.shape.end() - (b_vec ? 1 : 2));
  return y;
}

Ref conv2d(const Ref& x, const Ref& w, std::int64_t s, std::int64_t p) {
  const std::int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const std::int64_t O = w.shape[0], KH = w.shape[2], KW = w.shape[3];
  const std::int64_t OH = (H + 2 * p - KH) / s + 1, OW = (W + 2 * p - KW) / s + 1;
  Ref y = make_ref({N, O, OH, OW}, promote2(x.dtype, w.dtype));
  y.scale.assign(y.v.size(), 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < O; ++o)
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          double acc = 0, acc_abs = 0;
          for (std::int64_t c = 0; c < C; ++c)
            for (std::int64_t i = 0; i < KH; ++i)
              for (std::int64_t j = 0; j < KW; ++j) {
                const std::int64_t h = oh * s - p + i, ww = ow * s - p + j;
                if (h < 0 || h >= H || ww < 0 || ww >= W) continue;  // zero padding
                const double t = x.v[((n * C + c) * H + h) * W + ww] * w.v[((o * C + c) * KH + i) * KW + j];
                acc += t;
                acc_abs += std::fabs(t);
              }
          const std::int64_t at = ((n * O + o) * OH + oh) * OW + ow;
          y.v[at] = round_to(acc, y.dtype);
          y.scale[at] = acc_abs * std::sqrt(static_cast<double>(C * KH * KW));  // as matmul
        }
  return y;
}

Ref conv2d_grad_input(const Ref& g, const Ref& w, const Dims& image, std::int64_t s, std::int64_t p) {
  const std::int64_t N = image[0], C = image[1], H = image[2], W = image[3];
  const std::int64_t O = w.shape[0], KH = w.shape[2], KW = w.shape[3];
  const std::int64_t OH = (H + 2 * p - KH) / s + 1, OW = (W + 2 * p - KW) / s + 1;
  Ref dx = make_ref({N, C, H, W}, promote2(g.dtype, w.dtype));
  std::vector<double> acc(dx.v.size(), 0.0), acc_abs(dx.v.size(), 0.0), terms(dx.v.size(), 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < O; ++o)
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow)
          for (std::int64_t c = 0; c < C; ++c)
            for (std::int64_t i = 0; i < KH; ++i)
              for (std::int64_t j = 0; j < KW; ++j) {
                const std::int64_t h = oh * s - p + i, ww = ow * s - p + j;
                if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                const std::int64_t at = ((n * C + c) * H + h) * W + ww;
                const double t = g.v[((n * O + o) * OH + oh) * OW + ow] * w.v[((o * C + c) * KH + i) * KW + j];
                acc[at] += t;
                acc_abs[at] += std::fabs(t);
                terms[at] += 1;
              }
  dx.scale.assign(dx.v.size(), 0.0);
  for (std::size_t e = 0; e < dx.v.size(); ++e) {
    dx.v[e] = round_to(acc[e], dx.dtype);
    dx.scale[e] = acc_abs[e] * std::sqrt(std::max(1.0, terms[e]));
  }
  return dx;
}

Ref conv2d_grad_filter(const Ref& x, const Ref& g, const Dims& kernel, std::int64_t s, std::int64_t p) {
  const std::int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const std::int64_t O = kernel[0], KH = kernel[2], KW = kernel[3];
  const std::int64_t OH = (H + 2 * p - KH) / s + 1, OW = (W + 2 * p - KW) / s + 1;
  Ref dw = make_ref({O, C, KH, KW}, promote2(x.dtype, g.dtype));
  dw.scale.assign(dw.v.size(), 0.0);
  for (std::int64_t o = 0; o < O; ++o)
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t i = 0; i < KH; ++i)
        for (std::int64_t j = 0; j < KW; ++j) {
          double acc = 0, acc_abs = 0;
          for (std::int64_t n = 0; n < N; ++n)
            for (std::int64_t oh = 0; oh < OH; ++oh)
              for (std::int64_t ow = 0; ow < OW; ++ow) {
                const std::int64_t h = oh * s - p + i, ww = ow * s - p + j;
                if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                const double t = x.v[((n * C + c) * H + h) * W + ww] * g.v[((n * O + o) * OH + oh) * OW + ow];
                acc += t;
                acc_abs += std::fabs(t);
              }
          const std::int64_t at = ((o * C + c) * KH + i) * KW + j;
          dw.v[at] = round_to(acc, dw.dtype);
          dw.scale[at] = acc_abs * std::sqrt(static_cast<double>(std::max<std::int64_t>(1, N * OH * OW)));
        }
  return dw;
}

Ref im2col(const Ref& x, std::int64_t kh, std::int64_t kw, std::int64_t s, std::int64_t p) {
  const std::int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const std::int64_t OH = (H + 2 * p - kh) / s + 1, OW = (W + 2 * p - kw) / s + 1;
  Ref y = make_ref({N, C * kh * kw, OH * OW}, x.dtype);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t i = 0; i < kh; ++i)
        for (std::int64_t j = 0; j < kw; ++j)
          for (std::int64_t oh = 0; oh < OH; ++oh)
            for (std::int64_t ow = 0; ow < OW; ++ow) {
              const std::int64_t h = oh * s - p + i, w = ow * s - p + j;
              const std::int64_t row = (c * kh + i) * kw + j, col = oh * OW + ow;
              const bool in = h >= 0 && h < H && w >= 0 && w < W;
              y.v[(n * C * kh * kw + row) * OH * OW + col] = in ? x.v[((n * C + c) * H + h) * W + w] : 0.0;
            }
  return y;
}

Ref col2im(const Ref& cols, const Dims& image, std::int64_t kh, std::int64_t kw, std::int64_t s, std::int64_t p) {
  const std::int64_t N = image[0], C = image[1], H = image[2], W = image[3];
  const std::int64_t OH = (H + 2 * p - kh) / s + 1, OW = (W + 2 * p - kw) / s + 1;
  Ref y = make_ref(image, cols.dtype);
  y.scale.assign(y.v.size(), 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t i = 0; i < kh; ++i)
        for (std::int64_t j = 0; j < kw; ++j)
          for (std::int64_t oh = 0; oh < OH; ++oh)
            for (std::int64_t ow = 0; ow < OW; ++ow) {
              const std::int64_t h = oh * s - p + i, w = ow * s - p + j;
              if (h < 0 || h >= H || w < 0 || w >= W) continue;
              const double v = cols.v[(n * C * kh * kw + (c * kh + i) * kw + j) * OH * OW + oh * OW + ow];
              y.v[((n * C + c) * H + h) * W + w] += v;
              y.scale[((n * C + c) * H + h) * W + w] += std::fabs(v) * static_cast<double>(kh * kw);
            }
  for (double& v : y.v) v = round_to(v, y.dtype);
  return y;
}

Ref pool2d(const Ref& x, std::int64_t k, std::int64_t s, bool is_max) {
  const std::int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const std::int64_t OH = (H - k) / s + 1, OW = (W - k) / s + 1;
  Ref y = make_ref({N, C, OH, OW}, x.dtype);
  y.scale.assign(y.v.size(), 0.0);
  for (std::int64_t nc = 0; nc < N * C; ++nc)
    for (std::int64_t oh = 0; oh < OH; ++oh)
      for (std::int64_t ow = 0; ow < OW; ++ow) {
        double acc = is_max ? -std::numeric_limits<double>::infinity() : 0.0, acc_abs = 0;
        for (std::int64_t i = 0; i < k; ++i)
          for (std::int64_t j = 0; j < k; ++j) {
            const double v = x.v[(nc * H + oh * s + i) * W + ow * s + j];
            acc = is_max ? (std::isnan(v) || v > acc ? v : acc) : acc + v;
            acc_abs += std::fabs(v);
          }
        const std::int64_t at = (nc * OH + oh) * OW + ow;
        y.v[at] = round_to(is_max ? acc : acc / static_cast<double>(k * k), y.dtype);
        y.scale[at] = acc_abs;  // averaging: rounding of the k*k-term sum, relative to sum |x| / (k*k) * (k*k)
      }
  return y;
}

Ref softmax(const Ref& x, std::int64_t axis, bool log_form) {
  const int r = static_cast<int>(x.shape.size());
  const int ax = norm_axis(axis, r);
  Ref y = make_ref(x.shape, x.dtype);
  y.scale.assign(y.v.size(), 0.0);
  const std::int64_t len = x.shape[ax];
  std::int64_t inner = 1;
  for (int i = ax + 1; i < r; ++i) inner *= x.shape[i];
  const std::int64_t outer = len ? x.numel() / (len * inner) : 0;
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t in = 0; in < inner; ++in) {
      auto at = [&](std::int64_t j) { return (o * len + j) * inner + in; };
      double m = -std::numeric_limits<double>::infinity(), s = 0;
      for (std::int64_t j = 0; j < len; ++j) m = std::max(m, x.v[at(j)]);
      for (std::int64_t j = 0; j < len; ++j) s += std::exp(x.v[at(j)] - m);
      for (std::int64_t j = 0; j < len; ++j) {
        const double d = x.v[at(j)] - m;
        y.v[at(j)] = round_to(log_form ? d - std::log(s) : std::exp(d) / s, y.dtype);
        // softmax: rounding of x - max and of the sum, which exp turns into relative error.
        // log_softmax: backward-stable error, i.e. ulps of the inputs' own magnitude (x - lse
        // rounds at |x|: 1e-3 absolute for f32 logits near 1e4).
        y.scale[at(j)] = log_form ? std::fabs(x.v[at(j)]) + std::fabs(m) + std::log(s) + 1
                                  : std::fabs(y.v[at(j)]) * (std::fabs(d) + 2);
      }
    }
  return y;
}

Ref cross_entropy(const Ref& logits, const Ref& labels) {
  const std::int64_t N = logits.shape[0], C = logits.shape[1];
  double total = 0, scale = 0;
  for (std::int64_t n = 0; n < N; ++n) {
    double m = -std::numeric_limits<double>::infinity(), s = 0;
    for (std::int64_t c = 0; c < C; ++c) m = std::max(m, logits.v[n * C + c]);
    for (std::int64_t c = 0; c < C; ++c) s += std::exp(logits.v[n * C + c] - m);
    const double picked = logits.v[n * C + static_cast<std::int64_t>(labels.v[n])];
    total += m + std::log(s) - picked;
    scale += std::fabs(picked) + std::fabs(m) + std::log(s) + 1;  // as log_softmax, per row
  }
  Ref y = make_ref({}, logits.dtype);
  y.v[0] = round_to(N ? total / static_cast<double>(N) : std::nan(""), y.dtype);
  y.scale = {N ? scale / static_cast<double>(N) * std::sqrt(static_cast<double>(N * C)) : 0.0};
  return y;
}

Ref filled(const Dims& shape, double value, DType d) {
  Ref r = make_ref(shape, d);
  for (double& v : r.v) v = round_to(value, d);
  return r;
}

namespace {

// Philox4x32-10 (Salmon, Moraes, Dror, Shaw, SC'11; the Random123 reference): a 128-bit counter
// and a 64-bit key; each round multiplies words 0 and 2 by fixed constants, swaps the halves
// and xors in the key, which is bumped by the Weyl constants between rounds.
std::array<std::uint32_t, 4> philox(std::uint64_t counter, std::uint64_t key) {
  std::uint32_t c[4] = {static_cast<std::uint32_t>(counter & 0xFFFFFFFFu), static_cast<std::uint32_t>(counter >> 32), 0, 0};
  std::uint32_t k0 = static_cast<std::uint32_t>(key & 0xFFFFFFFFu), k1 = static_cast<std::uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t a = 0xD2511F53ull * c[0], b = 0xCD9E8D57ull * c[2];
    const std::uint32_t n0 = static_cast<std::uint32_t>(b >> 32) ^ c[1] ^ k0;
    const std::uint32_t n1 = static_cast<std::uint32_t>(b & 0xFFFFFFFFu);
    const std::uint32_t n2 = static_cast<std::uint32_t>(a >> 32) ^ c[3] ^ k1;
    const std::uint32_t n3 = static_cast<std::uint32_t>(a & 0xFFFFFFFFu);
    c[0] = n0, c[1] = n1, c[2] = n2, c[3] = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {c[0], c[1], c[2], c[3]};
}

// The 32-bit word of value i of a draw.
std::uint32_t word(std::uint64_t key, std::uint64_t offset, std::int64_t i) {
  return philox(offset + static_cast<std::uint64_t>(i / 4), key)[static_cast<std::size_t>(i % 4)];
}

}  // namespace

Ref random_normal(std::uint64_t key, std::uint64_t offset, const Dims& shape, double mean, double stddev, DType d) {
  Ref r = make_ref(shape, d);
  r.scale.resize(r.v.size());
  const double two32 = 4294967296.0, two_pi = 6.283185307179586476925286766559;
  for (std::int64_t i = 0; i < r.numel(); ++i) {
    const std::int64_t even = i - i % 2;  // the pair (even, even + 1) shares a radius and an angle
    const double u1 = (word(key, offset, even) + 0.5) / two32, u2 = (word(key, offset, even + 1) + 0.5) / two32;
    const double radius = std::sqrt(-2.0 * std::log(u1)), angle = two_pi * u2;
    const double z = radius * (i % 2 == 0 ? std::cos(angle) : std::sin(angle));
    r.v[static_cast<std::size_t>(i)] = round_to(mean + stddev * z, d);
    r.scale[static_cast<std::size_t>(i)] = std::fabs(mean) + std::fabs(stddev * radius);
  }
  return r;
}

Ref random_uniform(std::uint64_t key, std::uint64_t offset, const Dims& shape, double lo, double hi, DType d) {
  Ref r = make_ref(shape, d);
  r.scale.assign(r.v.size(), std::fabs(lo) + std::fabs(hi - lo));
  const double top = round_to(hi, d), bottom = round_to(lo, d);
  for (std::int64_t i = 0; i < r.numel(); ++i) {
    double v = round_to(lo + (hi - lo) * (word(key, offset, i) / 4294967296.0), d);
    if (v >= top && bottom < top)
      v = d == DType::f32 ? static_cast<double>(std::nextafter(static_cast<float>(top), static_cast<float>(bottom)))
                          : std::nextafter(top, bottom);
    r.v[static_cast<std::size_t>(i)] = v;
  }
  return r;
}

}  // namespace conf
