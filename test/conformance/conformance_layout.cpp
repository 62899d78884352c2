// Conformance table of the layout ops: reshape (and expand_dims, squeeze, flatten on it),
// transpose, broadcast_to, concat, stack, slice, gather, scatter_add, take_along_axis, add_along_axis,
// one_hot — every dtype, rank 0,
// empty and size-1 extents, negative axes and indices, large tiled copies.
#include <catch2/catch.hpp>

#include <cmath>

#include "conformance.hpp"

namespace conf {
namespace {

#define SC_CALL(expr) \
  [](const std::vector<sc::Tensor>& x, const Params& p) -> sc::Tensor { (void)x; (void)p; return expr; }

using Ints = std::vector<std::int64_t>;

/// One case per dtype for each (input shapes, params, note) triple.
struct Variant {
  std::vector<sc::Shape> shapes;
  Params p;
  std::string note;
};
std::vector<Case> variants(const std::vector<DType>& dtypes, const std::vector<Variant>& vs) {
  std::vector<Case> out;
  for (DType d : dtypes)
    for (const Variant& v : vs) {
      Case c;
      for (const sc::Shape& s : v.shapes) c.in.push_back({s, d, Gen::normal, 0, {}});
      c.p = v.p;
      c.note = v.note;
      out.push_back(c);
    }
  return out;
}
Params ints_p(Ints a, Ints b = {}) {
  Params p;
  p.ints = std::move(a);
  p.ints2 = std::move(b);
  return p;
}
Params axis_p(std::int64_t axis) {
  Params p;
  p.axis = axis;
  return p;
}

/// x with updates[..., n, ...] added at x[..., idx[n], ...] along axis, in index order. The error
/// scale is the sum of |terms| times their number (n additions round n times).
Ref scatter_add_ref(const std::vector<Ref>& in, const Params& p) {
  const Ref &x = in[0], &idx = in[1], &upd = in[2];
  const int ax = norm_axis(p.axis, static_cast<int>(x.shape.size()));
  const auto ni = static_cast<std::int64_t>(idx.shape.size());
  Ref y = x;
  std::vector<double> abs_sum(x.v.size()), terms(x.v.size(), 1);
  for (std::size_t i = 0; i < x.v.size(); ++i) abs_sum[i] = std::fabs(x.v[i]);
  for (std::int64_t i = 0; i < upd.numel(); ++i) {
    const Dims ui = unravel(i, upd.shape);
    Dims xi(ui.begin(), ui.begin() + ax);
    const auto k = static_cast<std::int64_t>(idx.v[ravel(Dims(ui.begin() + ax, ui.begin() + ax + ni), idx.shape)]);
    xi.push_back(k < 0 ? k + x.shape[ax] : k);
    xi.insert(xi.end(), ui.begin() + ax + ni, ui.end());
    const auto t = static_cast<std::size_t>(ravel(xi, x.shape));
    y.v[t] += upd.v[i];
    abs_sum[t] += std::fabs(upd.v[i]);
    terms[t] += 1;
  }
  y.scale.resize(y.v.size());
  for (std::size_t i = 0; i < y.v.size(); ++i) y.scale[i] = abs_sum[i] * terms[i];
  return y;
}

/// y[..., m, ...] = x[..., idx[..., m, ...], ...] along axis: an index per element.
Ref take_along_ref(const std::vector<Ref>& in, const Params& p) {
  const Ref &x = in[0], &idx = in[1];
  const int ax = norm_axis(p.axis, static_cast<int>(x.shape.size()));
  Ref y = make_ref(idx.shape, x.dtype);
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    Dims xi = unravel(i, idx.shape);
    const auto k = static_cast<std::int64_t>(idx.v[static_cast<std::size_t>(i)]);
    xi[static_cast<std::size_t>(ax)] = k < 0 ? k + x.shape[ax] : k;
    y.v[static_cast<std::size_t>(i)] = x.v[ravel(xi, x.shape)];
  }
  return y;
}

/// x with updates[..., m, ...] added at x[..., idx[..., m, ...], ...] along axis, in the order of
/// m; the error scale as scatter_add_ref's.
Ref add_along_ref(const std::vector<Ref>& in, const Params& p) {
  const Ref &x = in[0], &idx = in[1], &upd = in[2];
  const int ax = norm_axis(p.axis, static_cast<int>(x.shape.size()));
  Ref y = x;
  std::vector<double> abs_sum(x.v.size()), terms(x.v.size(), 1);
  for (std::size_t i = 0; i < x.v.size(); ++i) abs_sum[i] = std::fabs(x.v[i]);
  for (std::int64_t i = 0; i < upd.numel(); ++i) {
    Dims xi = unravel(i, upd.shape);
    const auto k = static_cast<std::int64_t>(idx.v[static_cast<std::size_t>(i)]);
    xi[static_cast<std::size_t>(ax)] = k < 0 ? k + x.shape[ax] : k;
    const auto t = static_cast<std::size_t>(ravel(xi, x.shape));
    y.v[t] += upd.v[static_cast<std::size_t>(i)];
    abs_sum[t] += std::fabs(upd.v[static_cast<std::size_t>(i)]);
    terms[t] += 1;
  }
  y.scale.resize(y.v.size());
  for (std::size_t i = 0; i < y.v.size(); ++i) y.scale[i] = abs_sum[i] * terms[i];
  return y;
}

std::vector<OpEntry> reshape_family() {
  RefFn reshape_ref = [](const std::vector<Ref>& in, const Params& p) { return reshape(in[0], p.ints); };
  OpEntry rs{"reshape", "sc::reshape(x, shape)", SC_CALL(sc::reshape(x[0], sc::Shape(p.ints))), reshape_ref, exact_rounding,
             variants(all_dtypes, {{{{3, 4}}, ints_p({4, 3}), ""},
                                   {{{3, 4}}, ints_p({12}), ""},
                                   {{{3, 4}}, ints_p({2, -1}), "-1 inferred"},
                                   {{{3, 4}}, ints_p({-1}), "-1 inferred"},
                                   {{{2, 3, 4}}, ints_p({4, 1, 6}), ""},
                                   {{{}}, ints_p({1, 1}), "rank 0 to [1, 1]"},
                                   {{{1}}, ints_p({}), "to rank 0"},
                                   {{{0, 3}}, ints_p({3, 0}), "empty"},
                                   {{{0, 3}}, ints_p({-1, 3}), "empty, -1 inferred as 0"},
                                   {{{300, 257}}, ints_p({257, -1}), "large"}}),
             1u};
  // expand_dims, squeeze and flatten are views written on reshape: same reference.
  auto to_shape = [](const std::vector<Ref>& in, Dims shape) { return reshape(in[0], std::move(shape)); };
  RefFn expand_ref = [to_shape](const std::vector<Ref>& in, const Params& p) {
    Dims s = in[0].shape;
    const int r = static_cast<int>(s.size());
    s.insert(s.begin() + (p.axis < 0 ? p.axis + r + 1 : p.axis), 1);
    return to_shape(in, s);
  };
  OpEntry ed{"expand_dims", "sc::expand_dims(x, axis)", SC_CALL(sc::expand_dims(x[0], p.axis)), expand_ref, exact_rounding,
             variants(all_dtypes, {{{{3, 4}}, axis_p(0), "axis 0"},
                                   {{{3, 4}}, axis_p(1), "axis 1"},
                                   {{{3, 4}}, axis_p(2), "axis 2 (append)"},
                                   {{{3, 4}}, axis_p(-1), "axis -1 (append)"},
                                   {{{3, 4}}, axis_p(-3), "axis -3 (front)"},
                                   {{{}}, axis_p(0), "rank 0"},
                                   {{{}}, axis_p(-1), "rank 0"},
                                   {{{0}}, axis_p(1), "empty"}}),
             1u};
  RefFn squeeze_ref = [to_shape](const std::vector<Ref>& in, const Params& p) {
    Dims s;
    const int r = static_cast<int>(in[0].shape.size());
    for (int i = 0; i < r; ++i) {
      bool listed = p.ints.empty() && in[0].shape[i] == 1;
      for (auto a : p.ints) listed |= norm_axis(a, r) == i;
      if (!listed) s.push_back(in[0].shape[i]);
    }
    return to_shape(in, s);
  };
  OpEntry sq{"squeeze", "sc::squeeze(x, axes)", SC_CALL(sc::squeeze(x[0], p.ints)), squeeze_ref, exact_rounding,
             variants(all_dtypes, {{{{1, 3, 1, 4}}, ints_p({}), "all size-1 axes"},
                                   {{{1, 3, 1, 4}}, ints_p({0}), ""},
                                   {{{1, 3, 1, 4}}, ints_p({-2}), "negative axis"},
                                   {{{1, 3, 1, 4}}, ints_p({0, 2}), ""},
                                   {{{1}}, ints_p({}), "to rank 0"},
                                   {{{}}, ints_p({}), "rank 0"},
                                   {{{3}}, ints_p({}), "nothing to squeeze"},
                                   {{{1, 0}}, ints_p({0}), "empty"}}),
             1u};
  RefFn flatten_ref = [to_shape](const std::vector<Ref>& in, const Params& p) {
    const int r = static_cast<int>(in[0].shape.size());
    if (r == 0) return to_shape(in, {1});
    const int start = norm_axis(p.axis, r);
    Dims s(in[0].shape.begin(), in[0].shape.begin() + start);
    s.push_back(-1);
    return to_shape(in, s);
  };
  OpEntry fl{"flatten", "sc::flatten(x, start_axis)", SC_CALL(sc::flatten(x[0], p.axis)), flatten_ref, exact_rounding,
             variants(all_dtypes, {{{{2, 3, 4}}, axis_p(0), ""},
                                   {{{2, 3, 4}}, axis_p(1), ""},
                                   {{{2, 3, 4}}, axis_p(-1), "negative axis"},
                                   {{{}}, axis_p(0), "rank 0"},
                                   {{{2, 0, 3}}, axis_p(1), "empty"}}),
             1u};
  // stop_gradient: the same values (a view); what it does to gradients is autodiff's to test.
  RefFn identity = [](const std::vector<Ref>& in, const Params&) { return in[0]; };
  OpEntry sg{"stop_gradient", "sc::stop_gradient(x)", SC_CALL(sc::stop_gradient(x[0])), identity, exact_rounding,
             variants(all_dtypes, {{{{}}, {}, "rank 0"}, {{{3, 4}}, {}, ""}, {{{0, 2}}, {}, "empty"}}), 0u};
  // to: the same values moved to the host and back to the input's device. On the CPU both moves
  // are the tensor itself; the GPU pass (conformance_cuda.cpp) copies each way, and its gradient
  // check crosses both copies.
  OpEntry mv{"to", "Tensor::to(device)", SC_CALL(x[0].to(sc::Device::cpu()).to(x[0].device())), identity,
             exact_rounding, variants(all_dtypes, {{{{}}, {}, "rank 0"}, {{{3, 4}}, {}, ""}, {{{0, 2}}, {}, "empty"}}),
             1u};
  return {rs, ed, sq, fl, sg, mv};
}

std::vector<OpEntry> copy_family() {
  RefFn transpose_ref = [](const std::vector<Ref>& in, const Params& p) { return transpose(in[0], p.ints); };
  const std::vector<Variant> perms = {
      {{{}}, ints_p({}), "rank 0"},
      {{{5}}, ints_p({}), "rank 1"},
      {{{3, 4}}, ints_p({}), "default reverses"},
      {{{3, 4}}, ints_p({1, 0}), ""},
      {{{3, 4}}, ints_p({0, 1}), "identity"},
      {{{2, 3, 4}}, ints_p({2, 0, 1}), ""},
      {{{2, 3, 4}}, ints_p({-1, 0, 1}), "negative entries"},
      {{{2, 3, 4}}, ints_p({0, 2, 1}), ""},
      {{{2, 3, 4, 5}}, ints_p({3, 1, 0, 2}), ""},
      {{{2, 1, 3, 1}}, ints_p({3, 2, 1, 0}), "size-1 axes"},
      {{{0, 3}}, ints_p({}), "empty"},
      {{{70, 45}}, ints_p({}), "tiled, partial tiles"},
      {{{4, 33, 65}}, ints_p({0, 2, 1}), "batched tiles"},
      {{{2, 8, 9, 6}}, ints_p({0, 2, 3, 1}), "NCHW to NHWC"}};
  OpEntry tr{"transpose", "sc::transpose(x, perm)", SC_CALL(sc::transpose(x[0], p.ints)), transpose_ref, exact_rounding,
             variants(all_dtypes, perms), 1u};
  append(tr.cases, variants({sc::f32}, {{{{300, 257}}, ints_p({}), "large"}}));
  OpEntry tr_default{"transpose", "sc::transpose(x)", SC_CALL(sc::transpose(x[0])), transpose_ref, exact_rounding,
                     variants(numeric, {{{{3, 4}}, {}, ""}, {{{2, 3, 4}}, {}, ""}}), 1u};

  RefFn bcast_ref = [](const std::vector<Ref>& in, const Params& p) { return broadcast_to(in[0], p.ints); };
  OpEntry bt{"broadcast_to", "sc::broadcast_to(x, shape)", SC_CALL(sc::broadcast_to(x[0], sc::Shape(p.ints))), bcast_ref,
             exact_rounding,
             variants(all_dtypes, {{{{3}}, ints_p({4, 3}), "[C] to [N, C]"},
                                   {{{4, 1}}, ints_p({4, 5}), "[N, 1] to [N, C]"},
                                   {{{}}, ints_p({2, 3}), "rank 0"},
                                   {{{}}, ints_p({}), "rank 0 to rank 0"},
                                   {{{1, 1}}, ints_p({3, 1, 4}), "new leading axis"},
                                   {{{2, 1, 3}}, ints_p({2, 4, 3}), "middle axis"},
                                   {{{2, 3}}, ints_p({2, 3}), "same shape"},
                                   {{{3}}, ints_p({0, 3}), "to empty"},
                                   {{{257}}, ints_p({300, 257}), "large"}}),
             1u};

  RefFn concat_ref = [](const std::vector<Ref>& in, const Params& p) { return concat(in, p.axis); };
  OpEntry cc{"concat", "sc::concat(xs, axis)", SC_CALL(sc::concat(x, p.axis)), concat_ref, exact_rounding,
             variants(all_dtypes, {{{{2, 3}, {4, 3}}, axis_p(0), ""},
                                   {{{2, 3}, {2, 5}}, axis_p(1), ""},
                                   {{{2, 3}, {2, 5}}, axis_p(-1), "negative axis"},
                                   {{{2, 3}, {0, 3}, {1, 3}}, axis_p(0), "an empty input"},
                                   {{{2, 3, 4}, {2, 1, 4}, {2, 2, 4}}, axis_p(1), "middle axis"},
                                   {{{3}, {4}}, axis_p(0), "rank 1"},
                                   {{{2, 3}}, axis_p(0), "one input"},
                                   {{{0, 2}, {0, 3}}, axis_p(1), "empty result"},
                                   {{{100, 257}, {200, 257}}, axis_p(0), "large"},
                                   {{{300, 100}, {300, 157}}, axis_p(1), "large"}}),
             0xFFu};
  cc.cases.push_back({{{{2, 3}, sc::f32}, {{1, 3}, sc::f64}, {{1, 3}, sc::i32}}, axis_p(0), "mixed dtypes promote"});
  cc.cases.push_back({{{{2, 2}, sc::boolean}, {{2, 1}, sc::i64, Gen::wide}}, axis_p(-1), "mixed dtypes promote"});

  RefFn stack_ref = [](const std::vector<Ref>& in, const Params& p) { return stack(in, p.axis); };
  OpEntry st{"stack", "sc::stack(xs, axis)", SC_CALL(sc::stack(x, p.axis)), stack_ref, exact_rounding,
             variants(all_dtypes, {{{{3}, {3}, {3}}, axis_p(0), ""},
                                   {{{3}, {3}, {3}}, axis_p(1), "new last axis"},
                                   {{{3}, {3}, {3}}, axis_p(-1), "negative axis"},
                                   {{{2, 3}, {2, 3}}, axis_p(1), "middle"},
                                   {{{2, 3}, {2, 3}}, axis_p(-3), "negative front"},
                                   {{{}, {}, {}, {}}, axis_p(0), "rank 0 inputs"},
                                   {{{0, 2}, {0, 2}}, axis_p(0), "empty"},
                                   {{{2, 3}}, axis_p(2), "one input"}}),
             0xFFu};
  st.cases.push_back({{{{2, 3}, sc::i32}, {{2, 3}, sc::f64}}, axis_p(0), "mixed dtypes promote"});
  return {tr, tr_default, bt, cc, st};
}

std::vector<OpEntry> index_family() {
  RefFn slice_ref = [](const std::vector<Ref>& in, const Params& p) { return slice(in[0], p.ints, p.ints2); };
  OpEntry sl{"slice", "sc::slice(x, begin, size)", SC_CALL(sc::slice(x[0], p.ints, p.ints2)), slice_ref, exact_rounding,
             variants(all_dtypes, {{{{5, 6}}, ints_p({1, 2}, {3, -1}), "size -1 to the end"},
                                   {{{5, 6}}, ints_p({-2, 0}, {2, 6}), "negative begin"},
                                   {{{5, 6}}, ints_p({0, 0}, {5, 6}), "everything"},
                                   {{{5, 6}}, ints_p({2, 3}, {0, 2}), "empty box"},
                                   {{{5, 6}}, ints_p({4, 5}, {1, 1}), "last element"},
                                   {{{}}, ints_p({}, {}), "rank 0"},
                                   {{{2, 3, 4}}, ints_p({0, 1, 1}, {-1, 2, 3}), ""},
                                   {{{2, 3, 4}}, ints_p({1, -1, -4}, {1, 1, -1}), ""},
                                   {{{0, 3}}, ints_p({0, 1}, {0, 2}), "empty input"},
                                   {{{300, 257}}, ints_p({10, 5}, {200, 250}), "large"}}),
             1u};

  // gather: the index tensor's dtype and values are per case (negative ones count from the end).
  RefFn gather_ref = [](const std::vector<Ref>& in, const Params& p) { return gather(in[0], in[1], p.axis); };
  OpEntry ga{"gather", "sc::gather(x, indices, axis)", SC_CALL(sc::gather(x[0], x[1], p.axis)), gather_ref, exact_rounding, {}, 1u};
  for (DType d : all_dtypes)
    for (DType id : ints) {
      auto add = [&](sc::Shape xs, sc::Shape is, std::int64_t axis, std::vector<double> vals, const char* note) {
        ga.cases.push_back({{{xs, d, Gen::normal, 0, {}}, {is, id, Gen::normal, 0, std::move(vals)}}, axis_p(axis), note});
      };
      add({5, 3}, {4}, 0, {4, 0, 2, 2}, "rows, repeated index");
      add({5, 3}, {2, 2}, 1, {2, 0, 1, 1}, "2-D indices");
      add({5, 3}, {3}, -1, {-1, -3, 0}, "negative axis and indices");
      add({6}, {}, 0, {-2}, "rank-0 index drops the axis");
      add({2, 3, 4}, {5}, 1, {0, 2, 1, -1, -2}, "middle axis");
      add({5, 3}, {0}, 0, {0}, "no indices");
      add({0, 3}, {2}, 1, {2, 0}, "empty input rows");
    }
  ga.cases.push_back({{{{300, 257}, sc::f32}, {{400}, sc::i64, Gen::index, 300, {}}}, axis_p(0), "large"});
  ga.cases.push_back({{{{300, 257}, sc::f64}, {{50}, sc::i32, Gen::index, 257, {}}}, axis_p(1), "large, inner axis"});
  // (over 2^18 elements of a scalar loop: parallel_rows splits them over two threads)
  ga.cases.push_back({{{{300, 257}, sc::f32}, {{1000}, sc::i64, Gen::index, 257, {}}}, axis_p(1), "two threads, inner axis"});

  // scatter_add (gather's adjoint): updates have gather's result shape; repeats accumulate.
  OpEntry sa{"scatter_add", "sc::scatter_add(x, indices, updates, axis)", SC_CALL(sc::scatter_add(x[0], x[1], x[2], p.axis)),
             scatter_add_ref, Tol{1}, {}, 0b101u};
  for (DType d : numeric)
    for (DType id : ints) {
      auto add = [&](sc::Shape xs, sc::Shape is, sc::Shape us, std::int64_t axis, std::vector<double> vals, const char* note) {
        sa.cases.push_back({{{xs, d, Gen::normal, 0, {}}, {is, id, Gen::normal, 0, std::move(vals)}, {us, d, Gen::normal, 0, {}}},
                            axis_p(axis), note});
      };
      add({5, 3}, {4}, {4, 3}, 0, {4, 0, 2, 2}, "rows, repeated index");
      add({5, 3}, {2, 2}, {5, 2, 2}, 1, {2, 0, 1, 1}, "2-D indices");
      add({5, 3}, {4}, {5, 4}, -1, {-1, -3, 0, 2}, "negative axis and indices, -1 repeats 2");
      add({6}, {}, {}, 0, {-2}, "rank-0 index");
      add({2, 3, 4}, {5}, {2, 5, 4}, 1, {0, 2, 1, -1, -2}, "middle axis");
      add({5, 3}, {0}, {0, 3}, 0, {0}, "no indices: x unchanged");
      add({0, 3}, {2}, {0, 2}, 1, {2, 0}, "empty x rows");
    }
  sa.cases.push_back({{{{300, 257}, sc::f32}, {{400}, sc::i64, Gen::index, 300, {}}, {{400, 257}, sc::f32}}, axis_p(0),
                      "large, many repeats"});
  sa.cases.push_back({{{{300, 257}, sc::f64}, {{50}, sc::i32, Gen::index, 257, {}}, {{300, 50}, sc::f64}}, axis_p(1),
                      "large, inner axis"});
  sa.cases.push_back({{{{300, 257}, sc::f32}, {{1000}, sc::i32, Gen::index, 257, {}}, {{300, 1000}, sc::f32}}, axis_p(1),
                      "two threads, inner axis"});

  // take_along_axis and add_along_axis: an index per element, of x's rank and x's extents but
  // along the axis (NumPy's take_along_axis, PyTorch's gather and scatter_add).
  OpEntry ta{"take_along_axis", "sc::take_along_axis(x, indices, axis)", SC_CALL(sc::take_along_axis(x[0], x[1], p.axis)),
             take_along_ref, exact_rounding, {}, 1u};
  for (DType d : all_dtypes)
    for (DType id : ints) {
      auto add = [&](sc::Shape xs, sc::Shape is, std::int64_t axis, std::vector<double> vals, const char* note) {
        ta.cases.push_back({{{xs, d, Gen::normal, 0, {}}, {is, id, Gen::normal, 0, std::move(vals)}}, axis_p(axis), note});
      };
      add({5, 3}, {4, 3}, 0, {4, 0, 2, 2, 2, 1, 0, -1, -5, 3, 3, 3}, "along rows, repeats and negatives");
      add({5, 3}, {5, 2}, -1, {2, 0, 1, 1, -1, -3, 0, 0, 2, 1}, "negative axis");
      add({2, 3, 2}, {2, 4, 2}, 1, {0, 2, 1, 1, 2, 2, -1, 0, 1, 0, 0, 0, 2, -2, 1, 2}, "middle axis");
      add({6}, {3}, 0, {5, -6, 2}, "rank 1");
      add({5, 3}, {5, 0}, 1, {0}, "no indices");
      add({0, 3}, {0, 2}, 1, {0}, "empty x");
    }
  ta.cases.push_back({{{{300, 257}, sc::f32}, {{400, 257}, sc::i64, Gen::index, 300, {}}}, axis_p(0), "large"});
  ta.cases.push_back({{{{300, 257}, sc::f64}, {{300, 50}, sc::i32, Gen::index, 257, {}}}, axis_p(1), "large, rows"});
  ta.cases.push_back({{{{300, 520}, sc::f32}, {{600, 520}, sc::i32, Gen::index, 300, {}}}, axis_p(0), "two threads"});
  ta.cases.push_back({{{{600, 257}, sc::f32}, {{600, 520}, sc::i64, Gen::index, 257, {}}}, axis_p(1), "two threads, rows"});

  OpEntry aa{"add_along_axis", "sc::add_along_axis(x, indices, updates, axis)",
             SC_CALL(sc::add_along_axis(x[0], x[1], x[2], p.axis)), add_along_ref, Tol{1}, {}, 0b101u};
  for (DType d : numeric)
    for (DType id : ints) {
      auto add = [&](sc::Shape xs, sc::Shape is, std::int64_t axis, std::vector<double> vals, const char* note) {
        aa.cases.push_back({{{xs, d, Gen::normal, 0, {}}, {is, id, Gen::normal, 0, std::move(vals)}, {is, d, Gen::normal, 0, {}}},
                            axis_p(axis), note});
      };
      add({5, 3}, {4, 3}, 0, {4, 0, 2, 2, 2, 1, 0, -1, -5, 3, 3, 3}, "along rows, repeats and negatives");
      add({5, 3}, {5, 4}, -1, {2, 0, 1, 1, -1, -3, 0, 0, 2, 1, 1, 1, 0, 0, 0, 0, -1, 2, -1, 2}, "negative axis, repeats");
      add({2, 3, 2}, {2, 4, 2}, 1, {0, 2, 1, 1, 2, 2, -1, 0, 1, 0, 0, 0, 2, -2, 1, 2}, "middle axis");
      add({6}, {3}, 0, {5, -6, 2}, "rank 1");
      add({5, 3}, {5, 0}, 1, {0}, "no indices: x unchanged");
      add({0, 3}, {0, 2}, 1, {0}, "empty x");
    }
  aa.cases.push_back({{{{300, 257}, sc::f32}, {{400, 257}, sc::i64, Gen::index, 300, {}}, {{400, 257}, sc::f32}}, axis_p(0),
                      "large, many repeats"});
  aa.cases.push_back({{{{300, 257}, sc::f64}, {{300, 50}, sc::i32, Gen::index, 257, {}}, {{300, 50}, sc::f64}}, axis_p(1),
                      "large, rows"});
  aa.cases.push_back({{{{300, 520}, sc::f32}, {{600, 520}, sc::i32, Gen::index, 300, {}}, {{600, 520}, sc::f32}}, axis_p(0),
                      "two threads"});
  aa.cases.push_back({{{{600, 257}, sc::f32}, {{600, 520}, sc::i64, Gen::index, 257, {}}, {{600, 520}, sc::f32}}, axis_p(1),
                      "two threads, rows"});

  RefFn onehot_ref = [](const std::vector<Ref>& in, const Params& p) { return one_hot(in[0], p.k, p.dtype); };
  OpEntry oh{"one_hot", "sc::one_hot(indices, depth, dtype)", SC_CALL(sc::one_hot(x[0], p.k, p.dtype)), onehot_ref,
             exact_rounding, {}, 0u};
  for (DType id : ints)
    for (DType out : all_dtypes) {
      auto add = [&](sc::Shape is, std::int64_t depth, std::vector<double> vals, const char* note) {
        Params p;
        p.k = depth;
        p.dtype = out;
        oh.cases.push_back({{{is, id, Gen::normal, 0, std::move(vals)}}, p, note});
      };
      add({5}, 4, {0, 3, 1, 1, 2}, "");
      add({2, 3}, 3, {2, 0, 1, 1, 2, 0}, "2-D indices");
      add({}, 5, {3}, "rank-0 index");
      add({4}, 3, {-1, 3, 7, 0}, "out of range and negative give zero rows");
      add({3}, 0, {0}, "depth 0");
      add({0}, 4, {0}, "no indices");
    }
  OpEntry oh_default{"one_hot", "sc::one_hot(indices, depth)", SC_CALL(sc::one_hot(x[0], p.k)), onehot_ref, exact_rounding, {}, 0u};
  {
    Params p;
    p.k = 6;  // default dtype: f32
    oh_default.cases.push_back({{{{7}, sc::i64, Gen::index, 6, {}}}, p, "default dtype f32"});
  }
  return {sl, ga, sa, ta, aa, oh, oh_default};
}

#undef SC_CALL
}  // namespace

std::vector<OpEntry> layout_table() {
  std::vector<OpEntry> t;
  for (auto* part : {&reshape_family, &copy_family, &index_family})
    for (OpEntry& e : (*part)()) t.push_back(std::move(e));
  return t;
}

}  // namespace conf

TEST_CASE("conformance: reshape, its views, stop_gradient", "[conformance][layout]") { conf::check_table(conf::reshape_family()); }
TEST_CASE("conformance: transpose, broadcast_to, concat, stack", "[conformance][layout]") {
  conf::check_table(conf::copy_family());
}
TEST_CASE("conformance: slice, gather, scatter_add, take_along_axis, add_along_axis, one_hot", "[conformance][layout]") { conf::check_table(conf::index_family()); }
