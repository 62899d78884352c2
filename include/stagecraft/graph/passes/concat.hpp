// Elementwise ops distributed over concats split alike, and slices moved before elementwise ops:
//   op(concat(a0, a1), concat(b0, b1)) -> concat(op(a0, b0), op(a1, b1))
//   slice(op(a, b)) -> op(slice(a), slice(b))   (when only slices read op's result, and they fuse)
// A gradient flowing into slices of one value (an LSTM's four gates, attention heads) is, per
// slice, a concat of zeros around the slice's gradient, summed with the others: k concats and
// k - 1 adds of the whole value. Distributed, the sum is one concat of k pieces, each an add of
// a piece with zeros (which the fusion pass joins to the piece's own elementwise group). Forward,
// the gates are slices of z = x W + h U + b: moved before the sums, each gate's group reads its
// windows of the two products and the bias (fuse.hpp), and z is never made. Exact: each element
// is the same op of the same operands as before.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "../../core/creation.hpp"
#include "../../ops/cast.hpp"
#include "../ir.hpp"
#include "../op_table.hpp"
#include "../trace.hpp"
#include "compact.hpp"
#include "fold.hpp"
#include "fuse.hpp"
#include "../../ops/slice.hpp"

namespace stagecraft::graph {

namespace detail_concat {

/// No rewrite makes a concat of more pieces than this.
inline constexpr std::size_t max_pieces = 64;

/// One input of a concat: its value and its extent [begin, end) along the concat's axis.
struct Piece {
  int value = -1;
  std::int64_t begin = 0, end = 0;
};

/// The axis (normalized) and pieces of concat node c in graph g, or an empty list when c is not
/// a concat.
STAGECRAFT_COMPILED_INLINE std::vector<Piece> pieces_of(const Graph& g, const Node& c, int& axis);

/// The part [b, e) along `axis` of piece p of graph g as a value of g: p itself when it is
/// exactly that part, else a new node appended to g (a constant's part, sliced now, or a fill of
/// the part's shape); -1 when p is computed (it would take a slice op to split it).
STAGECRAFT_COMPILED_INLINE int part_of(Graph& g, const Piece& p, int axis, std::int64_t b, std::int64_t e);
/// When values xa and xb of g are both fills: a new fill node (of `shape`, dtype and device) holding
/// op n's result on their two values, computed now; else -1. (Fills too large to fold stay ops;
/// a sum of zero fills must not become a kernel.)
STAGECRAFT_COMPILED_INLINE int fill_op(Graph& g, const Node& n, int xa, int xb, const Shape& shape, DType dtype,
                                       Device dev);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE int fill_op(Graph& g, const Node& n, int xa, int xb, const Shape& shape, DType dtype,
                                       Device dev) {
  const Node &fa = g.nodes[g.values[xa].node], &fb = g.nodes[g.values[xb].node];
  const auto is_fill = [](const Node& f) { return f.kind == NodeKind::op && f.op == ops::OpId::Fill; };
  if (!is_fill(fa) || !is_fill(fb)) return -1;
  double value = 0;
  {
    const detail_fold::EagerScope eager;
    try {
      const std::vector<Tensor> args{full(Shape{}, fa.attrs.scalar, fa.attrs.dtype), full(Shape{}, fb.attrs.scalar, fb.attrs.dtype)};
      const Tensor t = call_op(n.op, args, n.attrs, n.loc);
      if (t.dtype() != dtype || t.numel() != 1) return -1;
      value = cast(t, f64).item<double>();
    } catch (const Error&) {
      return -1;
    }
  }
  Node f = fa;
  f.outputs.clear();
  f.attrs.ints = shape;
  f.attrs.scalar = value;
  f.attrs.dtype = dtype;
  f.loc = n.loc;
  return g.nodes[g.add_node(std::move(f), {{shape, dtype}}, dev)].outputs[0];
}

STAGECRAFT_COMPILED_INLINE std::vector<Piece> pieces_of(const Graph& g, const Node& c, int& axis) {
  std::vector<Piece> ps;
  if (c.kind != NodeKind::op || c.op != ops::OpId::Concat || c.outputs.size() != 1) return ps;
  const int rank = g.values[c.outputs[0]].shape.rank();
  axis = static_cast<int>(c.attrs.axis < 0 ? c.attrs.axis + rank : c.attrs.axis);
  if (axis < 0 || axis >= rank) return {};
  std::int64_t at = 0;
  for (int v : c.inputs) {
    const std::int64_t n = g.values[v].shape[axis];
    if (n > 0) ps.push_back({v, at, at + n});
    at += n;
  }
  return ps;
}

STAGECRAFT_COMPILED_INLINE int part_of(Graph& g, const Piece& p, int axis, std::int64_t b, std::int64_t e) {
  if (b == p.begin && e == p.end) return p.value;
  const Value& v = g.values[p.value];
  Shape shape = v.shape;
  shape[axis] = e - b;
  const Node& src = g.nodes[v.node];
  const Device dev = v.device;
  const DType dtype = v.dtype;
  if (src.kind == NodeKind::op && src.op == ops::OpId::Fill) {
    Node f = src;
    f.outputs.clear();
    f.attrs.ints = shape;
    return g.nodes[g.add_node(std::move(f), {{shape, dtype}}, dev)].outputs[0];
  }
  if (src.kind != NodeKind::constant || !src.constant.device().is_cpu()) return -1;
  ops::Attrs a;
  for (int k = 0; k < shape.rank(); ++k) a.ints.push_back(k == axis ? b - p.begin : 0);
  a.ints2 = shape;
  Tensor t;
  {
    const detail_fold::EagerScope eager;
    try {
      const std::vector<Tensor> args{src.constant};
      t = call_op(ops::OpId::Slice, args, a, src.loc);
    } catch (const Error&) {
      return -1;
    }
  }
  Node k;
  k.kind = NodeKind::constant;
  k.constant = std::move(t);
  k.loc = src.loc;
  return g.nodes[g.add_node(std::move(k), {{shape, dtype}}, dev)].outputs[0];
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// The part of operand x of an elementwise op (broadcast to the op's result shape `y`) that the
/// window [begin, begin + size) of the result reads: x itself when that is all of x, else a new
/// slice node appended to g (at line `loc`). Axes x broadcasts over are taken whole.
STAGECRAFT_COMPILED_INLINE int operand_window(Graph& g, int x, const Shape& y, const Shape& begin, const Shape& size,
                                              const SrcLoc& loc);

/// True when a slice of a value of `shape` on `dev` will be read by a fused group through a window
/// (fuse.hpp): on a GPU always, on the CPU when its elements reach fusion_min_elements().
STAGECRAFT_COMPILED_INLINE bool fuses(const Shape& shape, Device dev);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE int operand_window(Graph& g, int x, const Shape& y, const Shape& begin, const Shape& size,
                                              const SrcLoc& loc) {
  const Value& xv = g.values[x];
  const Shape xs = xv.shape;
  const DType dt = xv.dtype;
  const Device dev = xv.device;
  Node n;
  n.kind = NodeKind::op;
  n.op = ops::OpId::Slice;
  n.inputs = {x};
  n.loc = loc;
  Shape out;
  bool whole = true;
  for (int j = 0; j < xs.rank(); ++j) {
    const int d = j + (y.rank() - xs.rank());
    const bool broadcast = xs[j] == 1 && y[d] != 1;
    const std::int64_t b = broadcast ? 0 : begin[d], n_j = broadcast ? 1 : size[d];
    n.attrs.ints.push_back(b);
    n.attrs.ints2.push_back(n_j);
    out.push_back(n_j);
    whole = whole && b == 0 && n_j == xs[j];
  }
  if (whole) return x;
  return g.nodes[g.add_node(std::move(n), {{out, dt}}, dev)].outputs[0];
}

STAGECRAFT_COMPILED_INLINE bool fuses(const Shape& shape, Device dev) {
  if (dev.is_cuda()) return cuda_fusion();
  return dev.is_cpu() && shape.numel() >= fusion_min_elements();
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace detail_concat

/// The distribution pass, pure: an elementwise binary op node whose two operands are concats
/// along the same axis, each read by it alone, of its own shape (no broadcasting) and device,
/// becomes a concat of the op over the pieces. Where the two concats' pieces end at different
/// places, constant and fill pieces are split (computed ones never are: the node is then kept).
/// And a slice of an elementwise op's result that only slices read becomes the op over the
/// operands' matching windows, where the slice will be read by a fused group (detail_concat::fuses).
/// The concats and ops it bypasses are left for dce.
STAGECRAFT_COMPILED_INLINE Graph distribute_over_concat(const Graph& g);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE Graph distribute_over_concat(const Graph& g) {
  namespace dc = detail_concat;
  std::vector<int> uses(g.values.size(), 0);
  std::vector<char> only_sliced(g.values.size(), 1);  // read by slices alone
  for (const Node& n : g.nodes)
    for (int v : n.inputs) {
      ++uses[v];
      only_sliced[v] = only_sliced[v] && n.kind == NodeKind::op && n.op == ops::OpId::Slice;
    }
  for (int v : g.outputs) {
    uses[v] += 2;  // a result is read outside: never bypassed
    only_sliced[v] = 0;
  }
  Graph out;
  out.name = g.name;
  out.strings = g.strings;
  std::vector<int> new_id(g.values.size(), -1);
  for (const Node& n : g.nodes) {
    Node m = n;
    for (int& v : m.inputs) v = new_id[v];
    const bool candidate = n.kind == NodeKind::op && n.outputs.size() == 1 && n.inputs.size() == 2 &&
                           fns(n.op).elementwise_binary && n.inputs[0] != n.inputs[1] && uses[n.inputs[0]] == 1 &&
                           uses[n.inputs[1]] == 1;
    int made = -1;  // the concat (or op) standing for n's output, when rewritten
    if (n.kind == NodeKind::op && n.op == ops::OpId::Slice && n.inputs.size() == 1 && n.outputs.size() == 1 &&
        only_sliced[n.inputs[0]]) {
      // slice(op(a, b)) -> op(slice(a), slice(b)): the op's result is only ever sliced
      const Value& y = out.values[m.inputs[0]];
      const Node& p = out.nodes[y.node];
      const Value& sv = g.values[n.outputs[0]];
      const bool elementwise = p.kind == NodeKind::op && p.outputs.size() == 1 &&
                               (fns(p.op).elementwise_unary || fns(p.op).elementwise_binary);
      if (elementwise && y.device == sv.device && dc::fuses(sv.shape, sv.device)) {
        const Shape ys = y.shape;
        Shape begin;
        for (int d = 0; d < ys.rank(); ++d) begin.push_back(ops::Slice::start(ys, n.attrs, d));
        Node op = p;
        op.outputs.clear();
        for (int& v : op.inputs) v = dc::operand_window(out, v, ys, begin, sv.shape, n.loc);
        made = out.nodes[out.add_node(std::move(op), {{sv.shape, sv.dtype}}, sv.device)].outputs[0];
      }
    }
    if (candidate) {
      const Value& y = g.values[n.outputs[0]];
      const Value &a = out.values[m.inputs[0]], &b = out.values[m.inputs[1]];
      int axa = -1, axb = -1;
      const std::vector<dc::Piece> pa = dc::pieces_of(out, out.nodes[a.node], axa),
                                   pb = dc::pieces_of(out, out.nodes[b.node], axb);
      const bool fits = !pa.empty() && !pb.empty() && axa == axb && a.shape == y.shape && b.shape == y.shape &&
                        a.dtype == b.dtype && a.device == y.device && b.device == y.device;
      if (fits) {
        std::vector<std::int64_t> cuts;  // every piece's end, in order: the parts' ends
        for (const dc::Piece& p : pa) cuts.push_back(p.end);
        for (const dc::Piece& p : pb) cuts.push_back(p.end);
        std::sort(cuts.begin(), cuts.end());
        cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
        const std::size_t nodes_before = out.nodes.size(), values_before = out.values.size();
        std::vector<int> parts;
        std::size_t ia = 0, ib = 0;
        std::int64_t at = 0;
        bool ok = cuts.size() <= dc::max_pieces;
        for (std::size_t k = 0; ok && k < cuts.size(); ++k) {
          const std::int64_t e = cuts[k];
          while (pa[ia].end <= at) ++ia;
          while (pb[ib].end <= at) ++ib;
          const int xa = dc::part_of(out, pa[ia], axa, at, e), xb = dc::part_of(out, pb[ib], axa, at, e);
          if (xa < 0 || xb < 0) {
            ok = false;
            break;
          }
          Shape shape = y.shape;
          shape[axa] = e - at;
          int part = dc::fill_op(out, n, xa, xb, shape, y.dtype, y.device);
          if (part < 0) {
            Node op = n;
            op.inputs = {xa, xb};
            op.outputs.clear();
            part = out.nodes[out.add_node(std::move(op), {{shape, y.dtype}}, y.device)].outputs[0];
          }
          parts.push_back(part);
          at = e;
        }
        if (ok) {
          Node c;
          c.kind = NodeKind::op;
          c.op = ops::OpId::Concat;
          c.inputs = std::move(parts);
          c.attrs.axis = axa;
          c.loc = n.loc;
          made = out.nodes[out.add_node(std::move(c), {{y.shape, y.dtype}}, y.device)].outputs[0];
        } else {  // a computed piece would need splitting: drop what was made, keep the node
          out.nodes.resize(nodes_before);
          out.values.resize(values_before);
        }
      }
    }
    if (made >= 0) new_id[n.outputs[0]] = made;
    else append_node(out, g, std::move(m), new_id);
  }
  out.inputs.reserve(g.inputs.size());
  for (int v : g.inputs) out.inputs.push_back(new_id[v]);
  out.outputs.reserve(g.outputs.size());
  for (int v : g.outputs) out.outputs.push_back(new_id[v]);
  return with_bodies(std::move(out), [](const Graph& b) { return distribute_over_concat(b); });
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
