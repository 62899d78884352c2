// Conformance entries of the scans beside cumsum (conformance_reduce.cpp): cumprod, logcumsumexp,
// cummax, cummin, cumargmax, cumargmin and linear_scan, each by a plain loop down every line in
// long double (integer products wrapping), every axis, exclusive and reversed where offered; short
// and long lines, few and many (a GPU takes a block or a thread per line). Part of reduce_table().
#include <cmath>
#include <cstdint>
#include <functional>

#include <stagecraft/ops/scan.hpp>

#include "conformance.hpp"

namespace conf {
namespace {

struct LineSplit {
  std::int64_t outer = 1, n = 1, inner = 1;
  LineSplit(const Dims& shape, std::int64_t axis) {
    const auto rank = static_cast<std::int64_t>(shape.size());
    const std::int64_t ax = axis < 0 ? axis + rank : axis;
    for (std::int64_t d = 0; d < ax; ++d) outer *= shape[static_cast<std::size_t>(d)];
    n = shape[static_cast<std::size_t>(ax)];
    for (std::int64_t d = ax + 1; d < rank; ++d) inner *= shape[static_cast<std::size_t>(d)];
  }
};

/// Walks every line of x along p.axis (p.pad: from the end) calling visit(at, s) for step s at
/// flat offset at, after begin() at each line's start.
void for_lines(const Dims& shape, const Params& p, const std::function<void()>& begin,
               const std::function<void(std::size_t, std::int64_t, std::int64_t)>& visit) {
  const LineSplit l(shape, p.axis);
  for (std::int64_t o = 0; o < l.outer; ++o)
    for (std::int64_t i = 0; i < l.inner; ++i) {
      begin();
      for (std::int64_t s = 0; s < l.n; ++s) {
        const std::int64_t k = p.pad != 0 ? l.n - 1 - s : s;
        visit(static_cast<std::size_t>((o * l.n + k) * l.inner + i), s, k);
      }
    }
}

long double ref_logaddexp(long double a, long double b) {
  if (std::isnan(a) || std::isnan(b)) return NAN;
  if (a == -INFINITY) return b;
  if (b == -INFINITY) return a;
  if (a == INFINITY || b == INFINITY) return INFINITY;
  const long double m = a > b ? a : b;
  return m + std::log(std::exp(a - m) + std::exp(b - m));
}

/// An integer product that wraps in d's width (two's complement), as the library's.
double wrap_mul(double acc, double x, DType d) {
  const auto a = static_cast<std::uint64_t>(static_cast<std::int64_t>(acc));
  const auto b = static_cast<std::uint64_t>(static_cast<std::int64_t>(x));
  if (d == sc::i32)
    return static_cast<double>(static_cast<std::int32_t>(static_cast<std::uint32_t>(a) * static_cast<std::uint32_t>(b)));
  return static_cast<double>(static_cast<std::int64_t>(a * b));
}

const std::vector<std::pair<sc::Shape, std::int64_t>> line_shapes = {
    {{7}, 0},      {{3, 4}, 0},     {{3, 4}, 1},      {{3, 4}, -1},  {{2, 3, 4}, 1}, {{2, 3, 4}, -3}, {{0, 3}, 1},
    {{3, 0}, 1},   {{5, 300}, 1},   {{300, 257}, 0},  {{2000, 3}, 0}, {{8192, 40}, 1}, {{1, 1}, 0}};

std::string flags_note(const Params& p) {
  return "axis " + std::to_string(p.axis) + (p.k ? ", exclusive" : "") + (p.pad ? ", reverse" : "");
}

/// Cases over line_shapes for dtypes ds, the flags exclusive (when offered) and reverse.
void add_cases(OpEntry& e, const std::vector<DType>& ds, bool exclusive, const std::vector<In>& extra_inputs,
               const In& first) {
  for (DType d : ds)
    for (const auto& [shape, axis] : line_shapes)
      for (int flags = 0; flags < 4; ++flags) {
        if ((flags & 1) && !exclusive) continue;
        if (flags != 0 && shape.numel() > 4000 && d != sc::f32) continue;  // (the large ones: f32 enough)
        Params p;
        p.axis = axis;
        p.k = flags & 1;
        p.pad = flags >> 1;
        Case c;
        In x = first;
        x.shape = shape;
        x.dtype = d;
        c.in.push_back(x);
        for (In more : extra_inputs) {
          more.shape = shape;
          more.dtype = d;
          c.in.push_back(more);
        }
        c.p = p;
        c.note = flags_note(p);
        e.cases.push_back(c);
      }
}

}  // namespace

std::vector<OpEntry> scan_entries() {

  // cumprod: the product in long double (integers wrap in their width); its error grows with the
  // line: (k + 1) ulps of |y| at step k. Values near 1 keep long lines finite; a second set has
  // zeros, a third NaN and infinities.
  RefFn cumprod_ref = [](const std::vector<Ref>& in, const Params& p) {
    const Ref& x = in[0];
    Ref y = make_ref(x.shape, x.dtype);
    y.scale.assign(y.v.size(), 0.0);
    const bool integral = !sc::is_floating(x.dtype);
    long double acc = 1;
    for_lines(x.shape, p, [&] { acc = 1; }, [&](std::size_t at, std::int64_t s, std::int64_t) {
      if (p.k != 0) y.v[at] = round_to(static_cast<double>(acc), x.dtype);
      const double before = std::fabs(static_cast<double>(acc));
      acc = s == 0 ? x.v[at] : integral ? wrap_mul(static_cast<double>(acc), x.v[at], x.dtype) : acc * x.v[at];
      if (p.k == 0) y.v[at] = round_to(static_cast<double>(acc), x.dtype);
      y.scale[at] = (p.k != 0 ? before : std::fabs(y.v[at])) * static_cast<double>(s + 1);
    });
    return y;
  };
  OpEntry cp{"cumprod", "sc::cumprod(x, axis, exclusive, reverse)",
             SC_CALL(sc::cumprod(x[0], p.axis, p.k != 0, p.pad != 0)), cumprod_ref, Tol{2}, {}, 1u};
  In near_one{{}, sc::f32, Gen::normal, 0, {0.9, 1.25, -1.1, 0.8, 1.05, -0.95, 1.2, 0.85}};
  add_cases(cp, floats, true, {}, near_one);
  add_cases(cp, {sc::i32, sc::i64}, true, {}, In{{}, sc::i32, Gen::small});
  for (DType d : floats) {
    Params p;
    p.axis = 1;
    cp.cases.push_back({{{{6, 6}, d, Gen::special, 0, {}}}, p, "NaN, inf and zeros"});
    cp.cases.push_back({{{{4, 9}, d, Gen::normal, 0, {1.5, 0.0, -2.0, 0.5, 0.0, 1.0, 3.0, -0.5, 2.0}}}, p, "zeros"});
  }

  // logcumsumexp: log-add-exp in long double; the error of step k is about (k + 1) ulps of the
  // largest |y| so far plus 1 (each step rounds a log1p and a sum).
  RefFn lcse_ref = [](const std::vector<Ref>& in, const Params& p) {
    const Ref& x = in[0];
    Ref y = make_ref(x.shape, x.dtype);
    y.scale.assign(y.v.size(), 0.0);
    long double acc = -INFINITY;
    double big = 0;
    for_lines(x.shape, p, [&] { acc = -INFINITY, big = 0; }, [&](std::size_t at, std::int64_t s, std::int64_t) {
      if (p.k != 0) y.v[at] = round_to(static_cast<double>(acc), x.dtype);
      acc = s == 0 ? static_cast<long double>(x.v[at]) : ref_logaddexp(acc, x.v[at]);
      if (p.k == 0) y.v[at] = round_to(static_cast<double>(acc), x.dtype);
      if (std::isfinite(static_cast<double>(acc))) big = std::max(big, std::fabs(static_cast<double>(acc)));
      y.scale[at] = (big + 1) * static_cast<double>(s + 1);
    });
    return y;
  };
  OpEntry lcse{"logcumsumexp", "sc::logcumsumexp(x, axis, exclusive, reverse)",
               SC_CALL(sc::logcumsumexp(x[0], p.axis, p.k != 0, p.pad != 0)), lcse_ref, Tol{4}, {}, 1u};
  // its gradient reads e^(x - y): the CPU's batched forward and the GPU's one log_add_exp a step,
  // both correct, differ in y's last bit, which moves the gradient by about |y| ulps (a relative
  // 6e-4 at the f32 "large" case's |y| ~ 1e4)
  lcse.grad_ulps_of_result = 8;
  add_cases(lcse, floats, true, {}, In{{}, sc::f32, Gen::normal});
  for (DType d : floats)
    for (const Gen g : {Gen::special, Gen::large, Gen::wide}) {
      Params p;
      p.axis = 1;
      lcse.cases.push_back({{{{6, 40}, d, g, 0, {}}}, p, "special, large and wide values"});
    }

  // cummax, cummin: the running extreme, a NaN propagating from where it is met (exact).
  const auto extreme_ref = [](bool is_max) {
    return [is_max](const std::vector<Ref>& in, const Params& p) {
      const Ref& x = in[0];
      Ref y = make_ref(x.shape, x.dtype);
      double acc = 0;
      for_lines(x.shape, p, [] {}, [&](std::size_t at, std::int64_t s, std::int64_t) {
        const double v = x.v[at];
        if (s == 0 || (!std::isnan(acc) && (std::isnan(v) || (is_max ? v > acc : v < acc)))) acc = v;
        y.v[at] = acc;
      });
      return y;
    };
  };
  OpEntry cmax{"cummax", "sc::cummax(x, axis, reverse)", SC_CALL(sc::cummax(x[0], p.axis, p.pad != 0)),
               extreme_ref(true), exact_rounding, {}, 1u};
  OpEntry cmin{"cummin", "sc::cummin(x, axis, reverse)", SC_CALL(sc::cummin(x[0], p.axis, p.pad != 0)),
               extreme_ref(false), exact_rounding, {}, 1u};
  // cumargmax, cumargmin: where the extreme was first reached; a NaN beats every number and the
  // first NaN stays.
  const auto arg_ref = [](bool is_max) {
    return [is_max](const std::vector<Ref>& in, const Params& p) {
      const Ref& x = in[0];
      Ref y = make_ref(x.shape, sc::i64);
      double best = 0;
      std::int64_t at_best = -1;
      for_lines(x.shape, p, [&] { at_best = -1; }, [&](std::size_t at, std::int64_t s, std::int64_t k) {
        const double v = x.v[at];
        const bool beats = std::isnan(v) ? !std::isnan(best) : (is_max ? v > best : v < best);
        if (s == 0 || beats) best = v, at_best = k;
        y.v[at] = static_cast<double>(at_best);
      });
      return y;
    };
  };
  OpEntry amax{"cumargmax", "sc::cumargmax(x, axis, reverse)", SC_CALL(sc::cumargmax(x[0], p.axis, p.pad != 0)),
               arg_ref(true), exact_rounding, {}, 0u};
  OpEntry amin{"cumargmin", "sc::cumargmin(x, axis, reverse)", SC_CALL(sc::cumargmin(x[0], p.axis, p.pad != 0)),
               arg_ref(false), exact_rounding, {}, 0u};
  for (OpEntry* e : {&cmax, &cmin, &amax, &amin}) {
    add_cases(*e, numeric, false, {}, In{{}, sc::f32, Gen::normal});
    for (DType d : floats) {
      Params p;
      p.axis = 1;
      e->cases.push_back({{{{6, 6}, d, Gen::special, 0, {}}}, p, "NaN, inf and signed zeros"});
      p.pad = 1;
      e->cases.push_back({{{{6, 6}, d, Gen::special, 0, {}}}, p, "NaN, inf and signed zeros, reverse"});
    }
  }

  // linear_scan: h = a h + b in long double; the error of step k is about (k + 1) ulps of the
  // magnitude m[k] = |a[k]| m[k-1] + |b[k]|. a from a set with |a| mostly below 1 (a decay), a 0
  // (a reset) and one above.
  RefFn linear_ref = [](const std::vector<Ref>& in, const Params& p) {
    const Ref& a = in[0];
    const Ref& b = in[1];
    Ref y = make_ref(a.shape, a.dtype);
    y.scale.assign(y.v.size(), 0.0);
    long double h = 0, mag = 0;
    for_lines(a.shape, p, [&] { h = 0, mag = 0; }, [&](std::size_t at, std::int64_t s, std::int64_t) {
      if (p.k != 0) {  // the h before, and its magnitude
        y.v[at] = round_to(static_cast<double>(h), a.dtype);
        y.scale[at] = static_cast<double>(mag) * static_cast<double>(s + 1);
      }
      h = s == 0 ? static_cast<long double>(b.v[at]) : a.v[at] * h + b.v[at];
      mag = s == 0 ? std::fabs(b.v[at]) : std::fabs(a.v[at]) * mag + std::fabs(b.v[at]);
      if (p.k == 0) {
        y.v[at] = round_to(static_cast<double>(h), a.dtype);
        y.scale[at] = static_cast<double>(mag) * static_cast<double>(s + 1);
      }
    });
    return y;
  };
  OpEntry lin{"linear_scan", "sc::linear_scan(a, b, axis, exclusive, reverse)",
              SC_CALL(sc::linear_scan(x[0], x[1], p.axis, p.k != 0, p.pad != 0)), linear_ref, Tol{2}, {}, 3u};
  add_cases(lin, floats, true, {In{{}, sc::f32, Gen::normal}},
            In{{}, sc::f32, Gen::normal, 0, {0.9, -0.5, 0.99, 0.3, -1.0, 0.75, 0.0, 1.1, 0.6}});

  return {cp, lcse, cmax, cmin, amax, amin, lin};
}

}  // namespace conf
