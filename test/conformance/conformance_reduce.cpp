// Conformance table of the reductions: sum max min argmax argmin cumsum top_k (primitives) and mean,
// logsumexp (composites) over axis lists, keepdims, negative axes, empty and rank-0 inputs; and
// add_n, a sum of tensors.
#include <catch2/catch.hpp>

#include <cmath>

#include "conformance.hpp"

namespace conf {
namespace {

struct AxesCase {
  sc::Shape shape;
  std::vector<std::int64_t> axes;
};

// Every rank from 0 to 4, all / one / several / negative axes, empty inputs, and large
// shapes (threads, SIMD tails, reducing the outer, inner and a middle axis).
const std::vector<AxesCase> axes_cases = {
    {{}, {}},           {{0}, {}},         {{7}, {}},           {{7}, {0}},           {{7}, {-1}},
    {{3, 4}, {}},       {{3, 4}, {0}},     {{3, 4}, {1}},       {{3, 4}, {-1}},       {{3, 4}, {-2, -1}},
    {{2, 3, 4}, {0, 2}}, {{2, 3, 4}, {1}}, {{2, 3, 4}, {-1, 0}}, {{2, 1, 3, 5}, {1, 3}}, {{1, 1}, {0}},
    {{2, 0, 3}, {1}},   {{2, 0, 3}, {0, 2}}, {{0, 3}, {1}},      {{300, 257}, {0}},    {{300, 257}, {1}},
    {{300, 257}, {}},   {{4, 300, 33}, {1}}, {{1000, 3}, {0}},   {{3, 1000}, {-1}}};

/// True when a reduced axis is empty (max/min/argmax have no identity there).
bool reduces_empty(const AxesCase& c) {
  if (c.axes.empty()) return c.shape.numel() == 0;
  for (auto a : c.axes)
    if (c.shape[static_cast<int>(a < 0 ? a + c.shape.rank() : a)] == 0) return true;
  return false;
}

std::vector<Case> reduce_cases(const std::vector<DType>& dtypes, bool allow_empty, Gen gen = Gen::normal) {
  std::vector<Case> out;
  for (DType d : dtypes)
    for (const AxesCase& ac : axes_cases) {
      if (!allow_empty && reduces_empty(ac)) continue;
      for (bool keep : {false, true}) {
        // Large shapes test loops and threads, not dtypes: f32 (both keepdims) and i32 suffice.
        if (ac.shape.numel() > 10000 && d != sc::f32 && (keep || d != sc::i32)) continue;
        Params p;
        p.ints = ac.axes;
        p.keepdims = keep;
        std::string note = "axes " + str(ac.axes) + (keep ? " keepdims" : "");
        out.push_back({{{ac.shape, d, gen, 0, {}}}, p, note});
      }
    }
  return out;
}

/// NaN, infinities, and rows of ±1e4 for the float dtypes.
std::vector<Case> float_edge_cases(bool allow_empty) {
  std::vector<Case> out;
  for (DType d : floats)
    for (Gen g : {Gen::special, Gen::large, Gen::wide})
      for (const AxesCase& ac : {AxesCase{{6, 6}, {1}}, AxesCase{{6, 6}, {0}}, AxesCase{{6, 6}, {}}}) {
        if (!allow_empty && reduces_empty(ac)) continue;
        Params p;
        p.ints = ac.axes;
        out.push_back({{{ac.shape, d, g, 0, {}}}, p, "axes " + str(ac.axes)});
      }
  return out;
}

double sum_of(const std::vector<double>& g) {
  double s = 0;
  for (double v : g) s += v;
  return s;
}
double max_of(const std::vector<double>& g) {
  double m = -inf_v;
  for (double v : g) m = std::isnan(v) || std::isnan(m) ? nan_v : std::max(m, v);
  return m;
}
double min_of(const std::vector<double>& g) {
  double m = inf_v;
  for (double v : g) m = std::isnan(v) || std::isnan(m) ? nan_v : std::min(m, v);
  return m;
}
/// Index of the first largest (is_max) or smallest value; the first NaN wins (NumPy).
double arg_of(const std::vector<double>& g, bool is_max) {
  std::size_t best = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i])) return static_cast<double>(i);
    if (is_max ? g[i] > g[best] : g[i] < g[best]) best = i;
  }
  return static_cast<double>(best);
}
double logsumexp_of(const std::vector<double>& g) {
  const double m = max_of(g);
  if (std::isnan(m) || std::isinf(m)) return m;  // empty or all -inf give -inf; +inf and NaN pass
  double s = 0;
  for (double v : g) s += std::exp(v - m);
  return m + std::log(s);
}

/// Error scale of a sum: sum of |x| times the depth of a pairwise / blocked summation.
Ref with_sum_scale(Ref y, const Ref& x, const Params& p, double per_element) {
  const auto abs_sum = reduce_abs_sum(x, p.ints);
  const double n = y.numel() ? static_cast<double>(x.numel()) / static_cast<double>(y.numel()) : 0.0;
  y.scale.resize(abs_sum.size());
  for (std::size_t i = 0; i < abs_sum.size(); ++i)
    y.scale[i] = abs_sum[i] * (std::log2(n + 1) + 1) * per_element;
  return y;
}

std::vector<OpEntry> reduce_entries() {
  RefFn sum_ref = [](const std::vector<Ref>& in, const Params& p) {
    const DType d = in[0].dtype == sc::boolean ? sc::i64 : in[0].dtype;  // bool sums count as i64
    return with_sum_scale(reduce(in[0], p.ints, p.keepdims, d, sum_of), in[0], p, 1.0);
  };
  RefFn max_ref = [](const std::vector<Ref>& in, const Params& p) {
    return reduce(in[0], p.ints, p.keepdims, in[0].dtype, max_of);
  };
  RefFn min_ref = [](const std::vector<Ref>& in, const Params& p) {
    return reduce(in[0], p.ints, p.keepdims, in[0].dtype, min_of);
  };
  RefFn mean_ref = [](const std::vector<Ref>& in, const Params& p) {
    const DType d = sc::is_floating(in[0].dtype) ? in[0].dtype : sc::f32;  // ints and bool: f32
    Ref y = reduce(in[0], p.ints, p.keepdims, d, [](const std::vector<double>& g) {
      return g.empty() ? nan_v : sum_of(g) / static_cast<double>(g.size());
    });
    y = with_sum_scale(y, in[0], p, 1.0);
    const double n = y.numel() ? static_cast<double>(in[0].numel()) / static_cast<double>(y.numel()) : 1.0;
    for (double& s : y.scale) s /= std::max(n, 1.0);
    return y;
  };
  RefFn lse_ref = [](const std::vector<Ref>& in, const Params& p) {
    const DType d = sc::is_floating(in[0].dtype) ? in[0].dtype : sc::f32;
    Ref y = reduce(in[0], p.ints, p.keepdims, d, logsumexp_of);
    // Rounding of max + log(sum): relative to |max|, plus the sum's own relative error.
    Ref m = reduce(in[0], p.ints, p.keepdims, sc::f64, max_of);
    const double n = y.numel() ? static_cast<double>(in[0].numel()) / static_cast<double>(y.numel()) : 0.0;
    y.scale.resize(m.v.size());
    for (std::size_t i = 0; i < m.v.size(); ++i) y.scale[i] = (std::isfinite(m.v[i]) ? std::fabs(m.v[i]) : 0) + n + 1;
    return y;
  };

  OpEntry sum{"sum", "sc::sum(x, axes, keepdims)", SC_CALL(sc::sum(x[0], p.ints, p.keepdims)), sum_ref, Tol{2}, {}, 1u};
  append(sum.cases, reduce_cases(all_dtypes, true));
  append(sum.cases, float_edge_cases(true));
  append(sum.cases, reduce_cases({sc::i64}, true, Gen::wide));  // i64 sums beyond i32
  OpEntry sum_default{"sum", "sc::sum(x)", SC_CALL(sc::sum(x[0])), sum_ref, Tol{2}, cases(numeric, {{{}}, {{3, 4}}, {{0}}}), 1u};

  OpEntry mx{"max", "sc::max(x, axes, keepdims)", SC_CALL(sc::max(x[0], p.ints, p.keepdims)), max_ref, exact_rounding, {}, 1u};
  OpEntry mn{"min", "sc::min(x, axes, keepdims)", SC_CALL(sc::min(x[0], p.ints, p.keepdims)), min_ref, exact_rounding, {}, 1u};
  for (OpEntry* e : {&mx, &mn}) {
    append(e->cases, reduce_cases(all_dtypes, false));
    append(e->cases, float_edge_cases(false));
    append(e->cases, reduce_cases({sc::i64}, false, Gen::wide));
    // NaN late in a long row (the SIMD body, not the tail, must propagate it).
    for (DType d : floats) {
      Params p;
      p.ints = {1};
      e->cases.push_back({{{{3, 40}, d, Gen::normal, 0, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, nan_v, 0, 0, 0, 0}}},
                          p, "NaN inside a row"});
    }
  }

  OpEntry mean{"mean", "sc::mean(x, axes, keepdims)", SC_CALL(sc::mean(x[0], p.ints, p.keepdims)), mean_ref, Tol{4}, {}, 1u};
  append(mean.cases, reduce_cases(all_dtypes, true));
  append(mean.cases, float_edge_cases(true));

  OpEntry lse{"logsumexp", "sc::logsumexp(x, axes, keepdims)", SC_CALL(sc::logsumexp(x[0], p.ints, p.keepdims)), lse_ref,
              Tol{8}, {}, 1u};
  append(lse.cases, reduce_cases(numeric, true));
  append(lse.cases, float_edge_cases(true));
  for (DType d : floats) {
    Params p;
    p.ints = {-1};
    lse.cases.push_back({{{{2, 3}, d, Gen::normal, 0, {1e4, 1e4, -1e4, -1e4, -1e4, -1e4 + 1}}}, p, "±1e4 rows"});
    lse.cases.push_back({{{{2, 3}, d, Gen::normal, 0, {-inf_v, -inf_v, -inf_v, inf_v, 1, nan_v}}}, p, "-inf row; inf and NaN"});
  }

  // argmax / argmin over one axis: ties (small ints repeat), NaN (the first wins), rank 0.
  const std::vector<std::pair<sc::Shape, std::int64_t>> arg_shapes = {
      {{7}, 0}, {{7}, -1}, {{3, 4}, 0}, {{3, 4}, 1}, {{3, 4}, -1}, {{2, 3, 4}, 1}, {{2, 3, 4}, -3},
      {{5, 40}, 1}, {{0, 3}, 1}, {{2, 1}, 1}, {{300, 257}, 0}, {{300, 257}, 1}, {{}, 0}, {{}, -1}};
  auto arg_entry = [&](const char* op, const char* api, CallFn call, bool is_max) {
    RefFn ref = [is_max](const std::vector<Ref>& in, const Params& p) {
      return reduce(in[0], in[0].shape.empty() ? Dims{} : Dims{p.axis}, false, sc::i64,
                    [is_max](const std::vector<double>& g) { return arg_of(g, is_max); });
    };
    OpEntry e{op, api, std::move(call), ref, exact_rounding, {}, 0u};
    for (DType d : all_dtypes)
      for (const auto& [shape, axis] : arg_shapes) {
        Params p;
        p.axis = axis;
        e.cases.push_back({{{shape, d, Gen::normal, 0, {}}}, p, "axis " + std::to_string(axis)});
      }
    for (DType d : floats) {
      Params p;
      p.axis = 1;
      e.cases.push_back({{{{6, 6}, d, Gen::special, 0, {}}}, p, "NaN and inf"});
      e.cases.push_back({{{{2, 20}, d, Gen::normal, 0, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, nan_v, 0, nan_v, 99, -99}}},
                         p, "first NaN wins"});
    }
    return e;
  };
  OpEntry am = arg_entry("argmax", "sc::argmax(x, axis)", SC_CALL(sc::argmax(x[0], p.axis)), true);
  OpEntry an = arg_entry("argmin", "sc::argmin(x, axis)", SC_CALL(sc::argmin(x[0], p.axis)), false);
  // add_n: one shape, added in order (exactly the reference's roundings); small and large, 1 to 40
  // inputs (a GPU launch sums 32; small ones join the eager batches as adds).
  RefFn add_n_ref = [](const std::vector<Ref>& in, const Params&) { return add_n(in); };
  OpEntry addn{"add_n", "sc::add_n(xs)", SC_CALL(sc::add_n(x)), add_n_ref, exact_rounding, {}, 0xFFu};
  const auto same = [](sc::Shape s, std::size_t n) { return std::vector<sc::Shape>(n, s); };
  for (const std::vector<sc::Shape>& shapes :
       {same({3, 4}, 2), same({3, 4}, 3), same({}, 3), same({0, 2}, 2), same({5}, 1), same({300, 257}, 5),
        same({7}, 40), same({70, 70}, 40), same({70, 70}, 33)})
    for (DType d : numeric) {
      Case c;
      for (const sc::Shape& s : shapes) c.in.push_back({s, d});
      c.note = std::to_string(shapes.size()) + " inputs";
      addn.cases.push_back(c);
    }
  addn.cases.push_back({{{{2, 3}, sc::i32}, {{2, 3}, sc::f32}, {{2, 3}, sc::f64}}, {}, "mixed dtypes promote"});
  // cumsum: running sums by plain loops in long double, every axis, exclusive and reversed; lines
  // short and long, few and many (a GPU takes a block per line or a thread per line). The error
  // scale of element k is (k + 1) times the sum of |x| up to it (sums in order, or in a tree).
  RefFn cumsum_ref = [](const std::vector<Ref>& in, const Params& p) {
    const Ref& x = in[0];
    Ref y = make_ref(x.shape, x.dtype);
    y.scale.assign(y.v.size(), 0.0);
    const auto rank = static_cast<std::int64_t>(x.shape.size());
    const std::int64_t ax = p.axis < 0 ? p.axis + rank : p.axis;
    std::int64_t outer = 1, n = x.shape[static_cast<std::size_t>(ax)], inner = 1;
    for (std::int64_t d = 0; d < ax; ++d) outer *= x.shape[static_cast<std::size_t>(d)];
    for (std::int64_t d = ax + 1; d < rank; ++d) inner *= x.shape[static_cast<std::size_t>(d)];
    for (std::int64_t o = 0; o < outer; ++o)
      for (std::int64_t i = 0; i < inner; ++i) {
        long double acc = 0, mag = 0;
        for (std::int64_t s = 0; s < n; ++s) {
          const std::int64_t k = p.pad != 0 ? n - 1 - s : s;
          const auto at = static_cast<std::size_t>((o * n + k) * inner + i);
          if (p.k != 0) y.v[at] = round_to(static_cast<double>(acc), x.dtype);
          acc += x.v[at];
          mag += std::fabs(x.v[at]);
          if (p.k == 0) y.v[at] = round_to(static_cast<double>(acc), x.dtype);
          y.scale[at] = static_cast<double>(mag) * static_cast<double>(s + 1);
        }
      }
    return y;
  };
  OpEntry cs{"cumsum", "sc::cumsum(x, axis, exclusive, reverse)", SC_CALL(sc::cumsum(x[0], p.axis, p.k != 0, p.pad != 0)),
             cumsum_ref, Tol{2}, {}, 1u};
  const std::vector<std::pair<sc::Shape, std::int64_t>> scan_shapes = {
      {{7}, 0}, {{3, 4}, 0}, {{3, 4}, 1}, {{3, 4}, -1}, {{2, 3, 4}, 1}, {{2, 3, 4}, -3}, {{0, 3}, 1}, {{3, 0}, 1},
      {{5, 300}, 1}, {{300, 257}, 0}, {{2000, 3}, 0}, {{8192, 40}, 1}, {{1, 1}, 0}};
  for (DType d : numeric)
    for (const auto& [shape, axis] : scan_shapes)
      for (int flags = 0; flags < 4; ++flags) {
        if (flags != 0 && shape.numel() > 4000 && d != sc::f32) continue;  // (the large ones: f32 enough)
        Params p;
        p.axis = axis;
        p.k = flags & 1;
        p.pad = flags >> 1;
        cs.cases.push_back({{{shape, d, Gen::normal, 0, {}}}, p,
                            "axis " + std::to_string(axis) + (p.k ? ", exclusive" : "") + (p.pad ? ", reverse" : "")});
      }
  for (DType d : floats) {
    Params p;
    p.axis = 1;
    cs.cases.push_back({{{{6, 6}, d, Gen::special, 0, {}}}, p, "NaN and inf"});
  }
  // top_k: the indices of each line's k best by plain selection (k scans, the first of equals
  // kept: ties in index order), a NaN above every number, -0 equal to 0; k from 0 to the whole
  // line (argsort), largest and smallest; short and long lines, few and many.
  RefFn top_k_ref = [](const std::vector<Ref>& in, const Params& p) {
    const Ref& x = in[0];
    const auto rank = static_cast<std::int64_t>(x.shape.size());
    const std::int64_t ax = p.axis < 0 ? p.axis + rank : p.axis;
    std::int64_t outer = 1, n = x.shape[static_cast<std::size_t>(ax)], inner = 1;
    for (std::int64_t d = 0; d < ax; ++d) outer *= x.shape[static_cast<std::size_t>(d)];
    for (std::int64_t d = ax + 1; d < rank; ++d) inner *= x.shape[static_cast<std::size_t>(d)];
    Dims shape = x.shape;
    shape[static_cast<std::size_t>(ax)] = p.k;
    Ref y = make_ref(shape, sc::i64);
    const bool largest = p.pad != 0;
    const auto beats = [largest](double u, double w) {  // u strictly ahead of w
      const bool un = std::isnan(u), wn = std::isnan(w);
      if (un || wn) return largest ? un && !wn : wn && !un;
      return largest ? u > w : u < w;
    };
    for (std::int64_t o = 0; o < outer; ++o)
      for (std::int64_t i = 0; i < inner; ++i) {
        std::vector<bool> taken(static_cast<std::size_t>(n), false);
        const auto at = [&](std::int64_t j) { return x.v[static_cast<std::size_t>((o * n + j) * inner + i)]; };
        for (std::int64_t r = 0; r < p.k; ++r) {
          std::int64_t best = -1;
          for (std::int64_t j = 0; j < n; ++j)
            if (!taken[static_cast<std::size_t>(j)] && (best < 0 || beats(at(j), at(best)))) best = j;
          taken[static_cast<std::size_t>(best)] = true;
          y.v[static_cast<std::size_t>((o * p.k + r) * inner + i)] = static_cast<double>(best);
        }
      }
    return y;
  };
  OpEntry tk{"top_k", "sc::topk(x, k, axis, largest).indices",
             SC_CALL(sc::topk(x[0], p.k, p.axis, p.pad != 0).indices), top_k_ref, exact_rounding, {}, 0u};
  const std::vector<std::pair<sc::Shape, std::int64_t>> sort_shapes = {
      {{7}, 0}, {{3, 4}, 0}, {{3, 4}, 1}, {{2, 3, 4}, 1}, {{2, 3, 4}, -1}, {{0, 3}, 1}, {{3, 0}, 1},
      {{1, 1}, 0}, {{40, 33}, 1}, {{600, 9}, 0}, {{3, 700}, -1}};
  for (DType d : numeric)
    for (const auto& [shape, axis] : sort_shapes) {
      const std::int64_t n = shape[static_cast<int>(axis < 0 ? axis + shape.rank() : axis)];
      std::vector<std::int64_t> ks{0, n};
      if (n > 2) ks.insert(ks.end(), {1, n / 2});
      for (const std::int64_t k : ks)
        for (const int largest : {0, 1}) {
          Params p;
          p.axis = axis;
          p.k = k;
          p.pad = largest;
          tk.cases.push_back({{{shape, d, Gen::normal, 0, {}}}, p,
                              "axis " + std::to_string(axis) + ", k " + std::to_string(k) +
                                  (largest ? ", largest" : ", smallest")});
        }
    }
  for (DType d : floats)
    for (const int largest : {0, 1}) {
      Params p;
      p.axis = 1;
      p.k = 6;
      p.pad = largest;
      tk.cases.push_back({{{{6, 6}, d, Gen::special, 0, {}}}, p, "NaN, inf and -0"});
    }
  return {sum, sum_default, mx, mn, mean, lse, am, an, addn, cs, tk};
}

}  // namespace

std::vector<OpEntry> reduce_table() {
  std::vector<OpEntry> all = reduce_entries();
  for (OpEntry& e : scan_entries()) all.push_back(std::move(e));  // (conformance_scan.cpp)
  return all;
}

}  // namespace conf

TEST_CASE("conformance: reductions", "[conformance][reduce]") { conf::check_table(conf::reduce_table()); }
