// Conformance table of matmul, im2col / col2im, conv2d, the pools, and the nn composites
// softmax, log_softmax, cross_entropy (large ±1e4 logits, NaN/inf, empty and size-1 extents).
#include <catch2/catch.hpp>

#include <cmath>

#include "conformance.hpp"

namespace conf {
namespace {

/// Dot-product tolerance: 4 ulps of sum |a b| * sqrt(terms) (Ref::scale from the reference).
constexpr Tol dot_tol{4};

std::vector<OpEntry> matmul_entries() {
  RefFn ref = [](const std::vector<Ref>& in, const Params&) { return matmul(in[0], in[1]); };
  OpEntry mm{"matmul", "sc::matmul(a, b)", SC_CALL(sc::matmul(x[0], x[1])), ref, dot_tol, {}, 3u};
  const std::vector<std::vector<sc::Shape>> shapes = {
      {{3, 4}, {4, 5}},        {{1, 4}, {4, 1}},       {{4}, {4, 3}},          {{3, 4}, {4}},
      {{4}, {4}},              {{2, 3, 4}, {4, 5}},    {{2, 3, 4}, {2, 4, 5}}, {{2, 1, 3, 4}, {5, 4, 2}},
      {{3, 4}, {2, 4, 5}},     {{2, 3, 4}, {4}},       {{0, 4}, {4, 3}},       {{3, 0}, {0, 5}},
      {{3, 4}, {4, 0}},        {{0, 3, 4}, {4, 2}},    {{1, 1}, {1, 1}}};
  append(mm.cases, cases(numeric, shapes));
  append(mm.cases, cases(floats, {{{64, 300}, {300, 70}}, {{1, 784}, {784, 256}}, {{3, 33, 65}, {3, 65, 17}}},
                         Gen::normal, {}, "large: BLAS, gemv, batched"));
  append(mm.cases, cases(ints, {{{20, 50}, {50, 30}}}, Gen::normal, {}, "integer GEMM (exact)"));
  append(mm.cases, cases(floats, {{{4, 6}, {6, 5}}}, Gen::special, {}, "NaN and inf"));
  mm.cases.push_back({{{{3, 4}, sc::f32}, {{4, 2}, sc::f64}}, {}, "mixed dtypes promote"});
  mm.cases.push_back({{{{3, 4}, sc::i32}, {{4, 2}, sc::f32}}, {}, "mixed dtypes promote"});
  mm.cases.push_back({{{{3, 4}, sc::i64}, {{4}, sc::i32}}, {}, "mixed dtypes promote"});
  return {mm};
}

/// A convolution-shaped case: x shape, w shape (or kernel kh x kw), stride, padding.
struct ConvGeom {
  sc::Shape x, w;
  std::int64_t stride, pad;
  const char* note;
};
const std::vector<ConvGeom> conv_geoms = {
    {{1, 1, 5, 5}, {1, 1, 3, 3}, 1, 0, ""},
    {{2, 3, 7, 6}, {4, 3, 3, 2}, 1, 1, "non-square kernel"},
    {{2, 3, 8, 8}, {5, 3, 3, 3}, 2, 1, "stride 2"},
    {{2, 3, 9, 7}, {2, 3, 3, 3}, 3, 0, "stride 3, leftover columns"},
    {{1, 2, 5, 5}, {3, 2, 1, 1}, 1, 0, "pointwise"},
    {{1, 2, 6, 6}, {3, 2, 1, 1}, 2, 0, "1x1 strided"},
    {{2, 1, 4, 4}, {1, 1, 4, 4}, 1, 0, "kernel covers the input"},
    {{2, 3, 5, 5}, {2, 3, 3, 3}, 1, 2, "padding 2"},
    {{1, 1, 2, 2}, {1, 1, 3, 3}, 1, 1, "kernel larger than the unpadded input"},
    {{0, 3, 5, 5}, {2, 3, 3, 3}, 1, 1, "empty batch"},
    {{1, 3, 5, 5}, {0, 3, 3, 3}, 1, 1, "no output channels"}};

std::vector<OpEntry> conv_entries() {
  RefFn conv_ref = [](const std::vector<Ref>& in, const Params& p) { return conv2d(in[0], in[1], p.stride, p.pad); };
  OpEntry cv{"conv2d", "sc::nn::conv2d(x, w, stride, padding)", SC_CALL(sc::nn::conv2d(x[0], x[1], p.stride, p.pad)),
             conv_ref, dot_tol, {}, 3u};
  RefFn im2col_ref = [](const std::vector<Ref>& in, const Params& p) {
    return im2col(in[0], p.ints[0], p.ints[1], p.stride, p.pad);
  };
  OpEntry ic{"im2col", "sc::im2col(x, kh, kw, stride, padding)",
             SC_CALL(sc::im2col(x[0], p.ints[0], p.ints[1], p.stride, p.pad)), im2col_ref, exact_rounding, {}, 1u};
  // col2im's input is the columns; p.ints2 holds the image shape it sums back onto.
  RefFn col2im_ref = [](const std::vector<Ref>& in, const Params& p) {
    return col2im(in[0], p.ints2, p.ints[0], p.ints[1], p.stride, p.pad);
  };
  OpEntry ci{"col2im", "sc::col2im(cols, shape, kh, kw, stride, padding)",
             SC_CALL(sc::col2im(x[0], sc::Shape(p.ints2), p.ints[0], p.ints[1], p.stride, p.pad)), col2im_ref,
             Tol{2}, {}, 1u};
  // The two gradient ops: p.ints2 holds the image shape (grad_input's attribute), p.ints the
  // kernel's [kh, kw]; grad_filter's kernel shape comes from the case's geometry below.
  RefFn gi_ref = [](const std::vector<Ref>& in, const Params& p) {
    return conv2d_grad_input(in[0], in[1], p.ints2, p.stride, p.pad);
  };
  OpEntry gi{"conv2d_grad_input", "sc::nn::conv2d_grad_input(g, w, input_shape, stride, padding)",
             SC_CALL(sc::nn::conv2d_grad_input(x[0], x[1], sc::Shape(p.ints2), p.stride, p.pad)), gi_ref, dot_tol, {},
             3u};
  RefFn gf_ref = [](const std::vector<Ref>& in, const Params& p) {
    return conv2d_grad_filter(in[0], in[1], p.ints, p.stride, p.pad);
  };
  OpEntry gf{"conv2d_grad_filter", "sc::nn::conv2d_grad_filter(x, g, kernel_shape, stride, padding)",
             SC_CALL(sc::nn::conv2d_grad_filter(x[0], x[1], sc::Shape(p.ints), p.stride, p.pad)), gf_ref, dot_tol, {},
             3u};
  for (DType d : numeric)
    for (const ConvGeom& g : conv_geoms) {
      const std::int64_t gh = (g.x[2] + 2 * g.pad - g.w[2]) / g.stride + 1, gw = (g.x[3] + 2 * g.pad - g.w[3]) / g.stride + 1;
      const sc::Shape gs{g.x[0], g.w[0], gh, gw};
      Params pi;
      pi.stride = g.stride;
      pi.pad = g.pad;
      pi.ints = {g.w[2], g.w[3]};
      pi.ints2 = g.x.vec();
      gi.cases.push_back({{{gs, d, Gen::normal, 0, {}}, {g.w, d, Gen::normal, 0, {}}}, pi, g.note});
      Params pf = pi;
      pf.ints = g.w.vec();
      gf.cases.push_back({{{g.x, d, Gen::normal, 0, {}}, {gs, d, Gen::normal, 0, {}}}, pf, g.note});
    }
  for (DType d : numeric)
    for (const ConvGeom& g : conv_geoms) {
      Params p;
      p.stride = g.stride;
      p.pad = g.pad;
      p.ints = {g.w[2], g.w[3]};
      p.ints2 = g.x.vec();
      cv.cases.push_back({{{g.x, d, Gen::normal, 0, {}}, {g.w, d, Gen::normal, 0, {}}}, p, g.note});
      ic.cases.push_back({{{g.x, d, Gen::normal, 0, {}}}, p, g.note});
      const std::int64_t oh = (g.x[2] + 2 * g.pad - g.w[2]) / g.stride + 1, ow = (g.x[3] + 2 * g.pad - g.w[3]) / g.stride + 1;
      ci.cases.push_back({{{{g.x[0], g.x[1] * g.w[2] * g.w[3], oh * ow}, d, Gen::normal, 0, {}}}, p, g.note});
    }
  Params big;
  big.stride = 1;
  big.pad = 1;
  big.ints = {3, 3};
  big.ints2 = {4, 16, 28, 28};
  for (DType d : floats) {
    cv.cases.push_back({{{{4, 16, 28, 28}, d}, {{32, 16, 3, 3}, d}}, big, "large"});
    ic.cases.push_back({{{{4, 16, 28, 28}, d}}, big, "large"});
    ci.cases.push_back({{{{4, 16 * 9, 28 * 28}, d}}, big, "large"});
  }
  Params mixed;
  mixed.ints = {3, 3};
  cv.cases.push_back({{{{1, 2, 5, 5}, sc::f32}, {{2, 2, 3, 3}, sc::f64}}, mixed, "mixed dtypes promote"});
  for (DType d : floats) {  // several column groups, the "same" convolution's one-copy path
    Params pi;
    pi.stride = 1;
    pi.pad = 1;
    pi.ints = {3, 3};
    pi.ints2 = {12, 3, 20, 20};
    gi.cases.push_back({{{{12, 8, 20, 20}, d}, {{8, 3, 3, 3}, d}}, pi, "large"});
    Params pf = pi;
    pf.ints = {8, 3, 3, 3};
    gf.cases.push_back({{{{12, 3, 20, 20}, d}, {{12, 8, 20, 20}, d}}, pf, "large"});
  }
  return {cv, gi, gf, ic, ci};
}

std::vector<OpEntry> pool_entries() {
  auto pool_ref = [](bool is_max) {
    return [is_max](const std::vector<Ref>& in, const Params& p) {
      Ref x = in[0];
      if (!is_max) x.dtype = float_of(x.dtype);  // avg_pool2d of integers is f32
      return pool2d(x, p.k, p.stride, is_max);
    };
  };
  OpEntry mp{"max_pool2d", "sc::nn::max_pool2d(x, kernel, stride)", SC_CALL(sc::nn::max_pool2d(x[0], p.k, p.stride)),
             pool_ref(true), exact_rounding, {}, 1u};
  // avg: the window sum times 1/(k*k); scale = sum |x| of the window.
  OpEntry ap{"avg_pool2d", "sc::nn::avg_pool2d(x, kernel, stride)", SC_CALL(sc::nn::avg_pool2d(x[0], p.k, p.stride)),
             pool_ref(false), Tol{2}, {}, 1u};
  struct PoolGeom {
    sc::Shape x;
    std::int64_t k, stride;
    const char* note;
  };
  const std::vector<PoolGeom> geoms = {{{1, 1, 4, 4}, 2, 2, ""},
                                       {{2, 3, 7, 6}, 3, 2, "leftover rows and columns"},
                                       {{2, 3, 5, 5}, 2, 1, "overlapping windows"},
                                       {{1, 2, 4, 4}, 1, 1, "kernel 1"},
                                       {{1, 2, 3, 3}, 3, 3, "one window"},
                                       {{1, 1, 2, 9}, 2, 3, "stride larger than kernel"},
                                       {{0, 3, 4, 4}, 2, 2, "empty batch"},
                                       {{4, 16, 28, 28}, 2, 2, "large"}};
  for (OpEntry* e : {&mp, &ap}) {
    for (DType d : numeric)
      for (const PoolGeom& g : geoms) {
        Params p;
        p.k = g.k;
        p.stride = g.stride;
        e->cases.push_back({{{g.x, d, Gen::normal, 0, {}}}, p, g.note});
      }
    Params p;
    p.k = 2;
    p.stride = 2;
    for (DType d : floats)
      e->cases.push_back({{{{2, 2, 6, 6}, d, Gen::special, 0, {}}}, p, "NaN wins, inf"});
  }
  // max_pool2d_grad (g, x): g at each window's first maximum (or first NaN) of x, summed where
  // windows overlap; scale = sum |g| landing on the element (the order of that sum may differ).
  auto grad_ref = [](const std::vector<Ref>& in, const Params& p) {
    const Ref &g = in[0], &x = in[1];
    const std::int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3], k = p.k, s = p.stride;
    const std::int64_t OH = (H - k) / s + 1, OW = (W - k) / s + 1;
    Ref dx = make_ref(x.shape, x.dtype);
    dx.scale.assign(dx.v.size(), 0.0);
    for (std::int64_t nc = 0; nc < N * C; ++nc)
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          std::int64_t best = -1;
          for (std::int64_t i = 0; i < k; ++i)
            for (std::int64_t j = 0; j < k; ++j) {
              const std::int64_t at = (nc * H + oh * s + i) * W + ow * s + j;
              if (best < 0 || (!std::isnan(x.v[best]) && (std::isnan(x.v[at]) || x.v[at] > x.v[best]))) best = at;
            }
          const double gv = g.v[(nc * OH + oh) * OW + ow];
          dx.v[best] += gv;
          dx.scale[best] += std::fabs(gv);
        }
    for (double& v : dx.v) v = round_to(v, dx.dtype);
    return dx;
  };
  OpEntry mg{"max_pool2d_grad", "sc::nn::max_pool2d_grad(g, x, kernel, stride)",
             SC_CALL(sc::nn::max_pool2d_grad(x[0], x[1], p.k, p.stride)), grad_ref, Tol{2}, {}, 1u};
  for (DType d : numeric)
    for (const PoolGeom& g : geoms) {
      Params p;
      p.k = g.k;
      p.stride = g.stride;
      const sc::Shape gs{g.x[0], g.x[1], (g.x[2] - g.k) / g.stride + 1, (g.x[3] - g.k) / g.stride + 1};
      mg.cases.push_back({{{gs, d, Gen::normal, 0, {}}, {g.x, d, Gen::normal, 0, {}}}, p, g.note});
    }
  for (DType d : floats)
    for (std::int64_t stride : {1, 2}) {
      Params p;
      p.k = 2;
      p.stride = stride;
      const std::int64_t o = stride == 1 ? 5 : 3;
      mg.cases.push_back({{{{2, 2, o, o}, d, Gen::normal, 0, {}}, {{2, 2, 6, 6}, d, Gen::special, 0, {}}}, p,
                          "NaN wins, inf"});
    }
  // Ties: every window all equal (the first element takes g), overlapping windows sharing them.
  for (std::int64_t stride : {1, 2}) {
    Params p;
    p.k = 2;
    p.stride = stride;
    const std::int64_t o = stride == 1 ? 3 : 2;
    mg.cases.push_back(
        {{{{1, 2, o, o}, sc::f32, Gen::normal, 0, {}}, {{1, 2, 4, 4}, sc::f32, Gen::normal, 0, {1, 1, 0, 0}}}, p,
         "ties"});
  }
  return {mp, mg, ap};
}

std::vector<OpEntry> softmax_entries() {
  RefFn sm_ref = [](const std::vector<Ref>& in, const Params& p) {
    Ref x = in[0];
    x.dtype = float_of(x.dtype);  // integer inputs become f32
    return softmax(x, p.axis, false);
  };
  RefFn lsm_ref = [](const std::vector<Ref>& in, const Params& p) {
    Ref x = in[0];
    x.dtype = float_of(x.dtype);
    return softmax(x, p.axis, true);
  };
  OpEntry sm{"softmax", "sc::nn::softmax(x, axis)", SC_CALL(sc::nn::softmax(x[0], p.axis)), sm_ref, Tol{8}, {}, 1u};
  OpEntry lsm{"log_softmax", "sc::nn::log_softmax(x, axis)", SC_CALL(sc::nn::log_softmax(x[0], p.axis)), lsm_ref, Tol{8},
              {}, 1u};
  const std::vector<std::pair<sc::Shape, std::int64_t>> geoms = {
      {{5}, 0},  {{5}, -1},   {{3, 4}, -1},    {{3, 4}, 0},     {{3, 4}, 1},       {{2, 3, 4}, 1},
      {{1, 1}, -1}, {{3, 1}, 1}, {{0, 4}, -1}, {{3, 0}, -1},  {{300, 257}, -1}, {{4, 300, 33}, 1}};
  for (OpEntry* e : {&sm, &lsm}) {
    for (DType d : numeric)
      for (const auto& [shape, axis] : geoms) {
        Params p;
        p.axis = axis;
        e->cases.push_back({{{shape, d, Gen::normal, 0, {}}}, p, "axis " + std::to_string(axis)});
      }
    for (DType d : floats) {
      Params p;
      p.axis = -1;
      e->cases.push_back({{{{6, 7}, d, Gen::large, 0, {}}}, p, "logits near ±1e4"});
      e->cases.push_back({{{{3, 3}, d, Gen::normal, 0, {1e4, 1e4 - 1, -1e4, -1e4, -1e4 + 2, -1e4 - 3, 0, 1e4, -1e4}}}, p,
                          "±1e4 rows (no overflow, no 0/0)"});
      e->cases.push_back({{{{2, 3}, d, Gen::normal, 0, {-inf_v, 0, 1, nan_v, 1, 2}}}, p, "-inf masks; NaN row"});
    }
  }
  return {sm, lsm};
}

std::vector<OpEntry> cross_entropy_entries() {
  RefFn ref = [](const std::vector<Ref>& in, const Params&) { return cross_entropy(in[0], in[1]); };
  OpEntry ce{"cross_entropy", "sc::nn::cross_entropy(logits, labels)", SC_CALL(sc::nn::cross_entropy(x[0], x[1])), ref,
             Tol{8}, {}, 1u};
  for (DType d : floats)
    for (DType l : ints) {
      auto add = [&](sc::Shape logits, Gen g, const char* note) {
        ce.cases.push_back({{{logits, d, g, 0, {}}, {{logits[0]}, l, Gen::index, logits[1], {}}}, {}, note});
      };
      add({4, 5}, Gen::normal, "");
      add({1, 1}, Gen::normal, "one class");
      add({8, 3}, Gen::large, "logits near ±1e4");
      add({256, 10}, Gen::normal, "large batch");
      add({3, 1000}, Gen::normal, "many classes");
    }
  // A -inf logit on another class (a mask) must not turn the loss into NaN.
  ce.cases.push_back({{{{2, 3}, sc::f32, Gen::normal, 0, {-inf_v, 0, 1}}, {{2}, sc::i64, Gen::normal, 0, {2, 1}}}, {},
                      "-inf on an unpicked class"});
  // The op behind it, called directly (its cases: cross_entropy's, and a batch of none: NaN).
  OpEntry op{"softmax_cross_entropy", "sc::detail::softmax_cross_entropy(logits, labels)",
             SC_CALL(sc::detail::softmax_cross_entropy(x[0], x[1], std::source_location::current())), ref, Tol{8}, {},
             1u};
  op.cases = ce.cases;
  op.cases.push_back({{{{0, 4}, sc::f64, Gen::normal, 0, {}}, {{0}, sc::i32, Gen::index, 4, {}}}, {}, "no rows"});
  // Its gradient (g, logits, labels): (softmax(x) - one_hot(label)) * g / N, row by row in double;
  // scale: (p (|x - max| + 2) + [j == label]) |g| / N: softmax's scale for p (exp's argument rounds
  // at |x - max|; the row's sum, in any order, within a few ulps) and the label's 1. With p's
  // scale alone an H200's f64 sums of 1000 classes (a tree, not the CPU's row order) came out
  // 9-11 ulps of it from the CPU's, against a bound of 8.
  RefFn grad_ref = [](const std::vector<Ref>& in, const Params&) {
    const Ref &g = in[0], &x = in[1], &labels = in[2];
    const std::int64_t N = x.shape[0], C = x.shape[1];
    Ref dx = make_ref(x.shape, x.dtype);
    dx.scale.assign(dx.v.size(), 0.0);
    const double s = g.v[0] / static_cast<double>(N);
    for (std::int64_t n = 0; n < N; ++n) {
      double m = -std::numeric_limits<double>::infinity(), sum = 0;
      for (std::int64_t c = 0; c < C; ++c) m = std::max(m, x.v[n * C + c]);
      for (std::int64_t c = 0; c < C; ++c) sum += std::exp(x.v[n * C + c] - m);
      for (std::int64_t c = 0; c < C; ++c) {
        const double p = std::exp(x.v[n * C + c] - m) / sum, y = c == static_cast<std::int64_t>(labels.v[n]) ? 1.0 : 0.0;
        dx.v[n * C + c] = round_to((p - y) * s, dx.dtype);
        dx.scale[n * C + c] = (p * (std::fabs(x.v[n * C + c] - m) + 2) + y) * std::fabs(s);
      }
    }
    return dx;
  };
  OpEntry gr{"softmax_cross_entropy_grad", "sc::detail::softmax_cross_entropy_grad(g, logits, labels)",
             SC_CALL(sc::detail::softmax_cross_entropy_grad(x[0], x[1], x[2])), grad_ref, Tol{8}, {}, 3u};
  for (DType d : floats)
    for (DType l : ints) {
      auto add = [&](sc::Shape logits, Gen gen, const char* note) {
        gr.cases.push_back(
            {{{{}, d, Gen::normal, 0, {}}, {logits, d, gen, 0, {}}, {{logits[0]}, l, Gen::index, logits[1], {}}}, {}, note});
      };
      add({4, 5}, Gen::normal, "");
      add({1, 1}, Gen::normal, "one class");
      add({8, 3}, Gen::large, "logits near ±1e4");
      add({256, 10}, Gen::normal, "large batch");
      add({3, 1000}, Gen::normal, "many classes");
    }
  gr.cases.push_back({{{{}, sc::f32, Gen::normal, 0, {0.5}},
                       {{2, 3}, sc::f32, Gen::normal, 0, {-inf_v, 0, 1}},
                       {{2}, sc::i64, Gen::normal, 0, {2, 1}}},
                      {},
                      "-inf on an unpicked class: its share is 0"});
  return {ce, op, gr};
}

}  // namespace

std::vector<OpEntry> nn_table() {
  std::vector<OpEntry> t;
  for (auto* part : {&matmul_entries, &conv_entries, &pool_entries, &softmax_entries, &cross_entropy_entries})
    for (OpEntry& e : (*part)()) t.push_back(std::move(e));
  return t;
}

}  // namespace conf

TEST_CASE("conformance: matmul", "[conformance][nn]") { conf::check_table(conf::matmul_entries()); }
TEST_CASE("conformance: im2col, col2im, conv2d", "[conformance][nn]") { conf::check_table(conf::conv_entries()); }
TEST_CASE("conformance: pools", "[conformance][nn]") { conf::check_table(conf::pool_entries()); }
TEST_CASE("conformance: softmax, log_softmax", "[conformance][nn]") { conf::check_table(conf::softmax_entries()); }
TEST_CASE("conformance: cross_entropy", "[conformance][nn]") { conf::check_table(conf::cross_entropy_entries()); }
