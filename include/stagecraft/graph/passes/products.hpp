// Small products batched into big ones: what an unrolled recurrence makes of its matmuls.
//   a_1 W, a_2 W, ... (no a_k depends on another's product)  ->  slices of concat(a_1, a_2, ...) W
//   op(a_1) op(b_1) + op(a_2) op(b_2) + ...                   ->  op(concat(a_k)) op(concat(b_k))
//   sum(x_1, axis 0) + sum(x_2, axis 0) + ...                 ->  sum(concat(x_k), axis 0)
// A recurrent cell run over T steps multiplies each step's input by the same kernel (T products
// of one row at batch 1: T launches on a GPU, T matrix-vector products on the CPU), and its
// gradient sums T outer products per weight and T column sums for the bias. Batched, each is one
// product, or one reduction, over T times the rows. Not bit for bit: the sums over the rows run in
// the product's own order (which BLAS and cuBLAS choose by size anyway), so the pass runs only
// while graph::product_batching() is on (the default).
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "../../config.hpp"
#include "../ir.hpp"
#include "../op_table.hpp"
#include "compact.hpp"

namespace stagecraft::graph {

/// Whether optimize() batches small products and sums (batch_products): on by default. Off, a
/// traced function's products and sums run one by one, as eagerly (results equal bit for bit).
STAGECRAFT_COMPILED_INLINE bool& product_batching();

namespace detail_products {

/// At most this many products (or sums) become one; longer runs make several.
inline constexpr std::size_t max_batch = 256;
/// A sum of fewer products or column sums than this stays as it is: stacking the operands of two
/// (x W + h U, an RNN's pre-activation) costs a copy of each, as much as the launch it saves.
inline constexpr std::size_t min_terms = 3;
/// Products of more multiply-adds than this stay as they are: they fill the machine already, and
/// batching would only copy their operands.
inline constexpr std::int64_t max_product_macs = std::int64_t{1} << 24;

/// True when node n is a matmul of two matrices (no batch axes, no vectors) into a matrix of the
/// operands' dtype and device.
STAGECRAFT_COMPILED_INLINE bool plain_matmul(const Graph& g, const Node& n);

/// True when node n is a sum over axis 0 alone (keepdims or not) of a value of rank >= 1.
STAGECRAFT_COMPILED_INLINE bool sum_over_rows(const Graph& g, const Node& n);

/// Appends to g a concat along `axis` of values vs (at line loc); returns its value.
STAGECRAFT_COMPILED_INLINE int add_concat(Graph& g, const std::vector<int>& vs, int axis, const SrcLoc& loc);

/// Rewrites one set of row-batchable products of g (the first found: products a_k W of one W and
/// transpose flags, where no a_k depends on another's product); returns false when none is left.
STAGECRAFT_COMPILED_INLINE bool batch_rows_once(const Graph& g, Graph& out);

/// The sums-of-products and sums-of-column-sums rewrite over all of g into out; false (out
/// untouched) when there is nothing to batch.
STAGECRAFT_COMPILED_INLINE bool batch_sums(const Graph& g, Graph& out);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE bool plain_matmul(const Graph& g, const Node& n) {
  if (n.kind != NodeKind::op || n.op != ops::OpId::MatMul || n.inputs.size() != 2 || n.outputs.size() != 1)
    return false;
  const Value &a = g.values[n.inputs[0]], &b = g.values[n.inputs[1]], &y = g.values[n.outputs[0]];
  return a.shape.rank() == 2 && b.shape.rank() == 2 && y.shape.rank() == 2 && a.dtype == y.dtype &&
         b.dtype == y.dtype && a.device == y.device && b.device == y.device && y.shape.numel() > 0;
}

STAGECRAFT_COMPILED_INLINE bool sum_over_rows(const Graph& g, const Node& n) {
  if (n.kind != NodeKind::op || n.op != ops::OpId::Sum || n.inputs.size() != 1 || n.outputs.size() != 1) return false;
  const Value &x = g.values[n.inputs[0]], &y = g.values[n.outputs[0]];
  const int r = x.shape.rank();
  if (r < 1 || x.dtype != y.dtype || x.device != y.device) return false;
  if (n.attrs.ints.empty()) return r == 1;
  return n.attrs.ints.rank() == 1 && (n.attrs.ints[0] == 0 || n.attrs.ints[0] == -r);
}

STAGECRAFT_COMPILED_INLINE int add_concat(Graph& g, const std::vector<int>& vs, int axis, const SrcLoc& loc) {
  const Value& first = g.values[vs[0]];
  Shape shape = first.shape;
  shape[axis] = 0;
  for (int v : vs) shape[axis] += g.values[v].shape[axis];
  const DType dtype = first.dtype;
  const Device dev = first.device;
  Node c;
  c.kind = NodeKind::op;
  c.op = ops::OpId::Concat;
  c.inputs = vs;
  c.attrs.axis = axis;
  c.loc = loc;
  return g.nodes[g.add_node(std::move(c), {{shape, dtype}}, dev)].outputs[0];
}

STAGECRAFT_COMPILED_INLINE bool batch_rows_once(const Graph& g, Graph& out) {
  const int n = static_cast<int>(g.nodes.size());
  // Candidate products, keyed by (W, W's transpose flag), in program order.
  // A repeated product (same operands) is left for cse, not stacked twice.
  std::map<std::pair<int, std::int64_t>, std::vector<int>> sets;
  std::vector<std::pair<int, std::int64_t>> order;
  for (int i = 0; i < n; ++i) {
    const Node& m = g.nodes[i];
    if (!plain_matmul(g, m) || m.attrs.i0 != 0) continue;
    const Value &a = g.values[m.inputs[0]], &y = g.values[m.outputs[0]];
    if (a.shape.numel() > max_product_macs / y.shape[1]) continue;
    const std::pair<int, std::int64_t> key{m.inputs[1], m.attrs.i1};
    std::vector<int>& set = sets[key];
    if (set.empty()) order.push_back(key);
    if (std::none_of(set.begin(), set.end(), [&](int j) { return g.nodes[j].inputs[0] == m.inputs[0]; }))
      set.push_back(i);
  }
  for (const auto& key : order) {
    std::vector<int> members = sets[key];
    if (members.size() < 2) continue;
    // What depends on a product of the set: a member whose left operand does is left alone.
    std::vector<char> dep(n, 0);
    for (int i = members[0]; i < n; ++i) {
      const Node& x = g.nodes[i];
      bool d = std::binary_search(members.begin(), members.end(), i);
      for (int v : x.inputs) d = d || dep[g.values[v].node];
      dep[i] = d;
    }
    std::erase_if(members, [&](int i) { return dep[g.values[g.nodes[i].inputs[0]].node] != 0; });
    // Every left operand is computed where the first member runs: what they need after that point
    // moves before it, so it must be free of effects (no read of a variable assigned in between).
    std::vector<char> need(n, 0);
    for (bool settled = false; !settled && members.size() >= 2;) {
      const int at = members[0];
      std::vector<char> bad(n, 0);
      std::vector<const void*> assigned;
      for (int i = at + 1; i < n; ++i) {
        const Node& x = g.nodes[i];
        bool b = is_side_effect(x) || x.kind == NodeKind::input ||
                 (x.kind == NodeKind::read_var &&
                  std::find(assigned.begin(), assigned.end(), x.var.get()) != assigned.end());
        if (x.kind == NodeKind::assign_var) assigned.push_back(x.var.get());
        for (int v : x.inputs) b = b || (g.values[v].node > at && bad[g.values[v].node]);
        bad[i] = b;
      }
      const std::size_t before = members.size();
      std::erase_if(members, [&](int i) {
        const int p = g.values[g.nodes[i].inputs[0]].node;
        return p > at && bad[p];
      });
      settled = members.size() == before && !members.empty() && members[0] == at;
    }
    if (members.size() < 2) continue;
    if (members.size() > max_batch) members.resize(max_batch);
    const int at = members[0];
    for (int i : members)
      if (const int p = g.values[g.nodes[i].inputs[0]].node; p > at) need[p] = 1;
    for (int i = n - 1; i > at; --i)
      if (need[i])
        for (int v : g.nodes[i].inputs)
          if (g.values[v].node > at) need[g.values[v].node] = 1;
    // Rebuild: nodes before the first member, what the operands need, the batched product, then
    // the rest with each member a slice of it.
    out = Graph{};
    out.name = g.name;
    out.strings = g.strings;
    std::vector<int> new_id(g.values.size(), -1);
    for (int i = 0; i < at; ++i) append_node(out, g, g.nodes[i], new_id);
    for (int i = at + 1; i < n; ++i)
      if (need[i]) {
        Node x = g.nodes[i];
        for (int& v : x.inputs) v = new_id[v];
        append_node(out, g, std::move(x), new_id);
      }
    std::vector<int> lhs;
    for (int i : members) lhs.push_back(new_id[g.nodes[i].inputs[0]]);
    const Node& first = g.nodes[at];
    const int stacked = add_concat(out, lhs, 0, first.loc);
    Node prod = first;
    prod.inputs = {stacked, new_id[first.inputs[1]]};
    prod.outputs.clear();
    const Value& y0 = g.values[first.outputs[0]];
    const Shape yshape{out.values[stacked].shape[0], y0.shape[1]};
    const int y = out.nodes[out.add_node(std::move(prod), {{yshape, y0.dtype}}, y0.device)].outputs[0];
    std::vector<std::int64_t> row(n, -1);
    std::int64_t r = 0;
    for (int i : members) {
      row[i] = r;
      r += g.values[g.nodes[i].inputs[0]].shape[0];
    }
    for (int i = at; i < n; ++i) {
      if (need[i]) continue;
      Node x = g.nodes[i];
      if (row[i] < 0) {
        for (int& v : x.inputs) v = new_id[v];
        append_node(out, g, std::move(x), new_id);
        continue;
      }
      const Value& yi = g.values[x.outputs[0]];
      Node s;
      s.kind = NodeKind::op;
      s.op = ops::OpId::Slice;
      s.inputs = {y};
      s.attrs.ints = {row[i], 0};
      s.attrs.ints2 = yi.shape;
      s.loc = x.loc;
      new_id[x.outputs[0]] = out.nodes[out.add_node(std::move(s), {{yi.shape, yi.dtype}}, yi.device)].outputs[0];
    }
    for (int v : g.inputs) out.inputs.push_back(new_id[v]);
    for (int v : g.outputs) out.outputs.push_back(new_id[v]);
    return true;
  }
  return false;
}

STAGECRAFT_COMPILED_INLINE bool batch_sums(const Graph& g, Graph& out) {
  std::vector<int> uses(g.values.size(), 0);
  std::vector<char> is_output(g.values.size(), 0);
  for (const Node& x : g.nodes)
    for (int v : x.inputs) ++uses[v];
  for (int v : g.outputs) is_output[v] = 1;
  // A plain sum: an add of two operands of its result's shape, dtype and device.
  const auto plain_add = [&](const Node& x) {
    if (x.kind != NodeKind::op || x.op != ops::OpId::Add || x.inputs.size() != 2 || x.outputs.size() != 1) return false;
    const Value& y = g.values[x.outputs[0]];
    for (int v : x.inputs)
      if (g.values[v].shape != y.shape || g.values[v].dtype != y.dtype || g.values[v].device != y.device) return false;
    return true;
  };
  // Read once, by a plain sum, and not a result: part of a larger sum's tree.
  const auto inner = [&](int v) { return uses[v] == 1 && !is_output[v]; };
  std::vector<char> internal(g.nodes.size(), 0);
  for (const Node& x : g.nodes)
    if (plain_add(x))
      for (int v : x.inputs)
        if (inner(v) && plain_add(g.nodes[g.values[v].node])) internal[g.values[v].node] = 1;
  // Each tree's terms (left to right) and its batches: products by transpose flags, column sums by
  // keepdims and row shape; only roots with a batch of min_terms or more are rewritten.
  struct Tree {
    std::vector<int> terms;
    std::vector<std::pair<bool, std::vector<int>>> batches;  ///< (products?, terms), each of min_terms or more
  };
  std::map<std::size_t, Tree> trees;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& x = g.nodes[i];
    if (!plain_add(x) || internal[i]) continue;
    Tree t;
    std::vector<int> stack{x.inputs[1], x.inputs[0]};
    while (!stack.empty()) {
      const int v = stack.back();
      stack.pop_back();
      const Node& p = g.nodes[g.values[v].node];
      if (inner(v) && internal[g.values[v].node]) {
        stack.push_back(p.inputs[1]);
        stack.push_back(p.inputs[0]);
      } else {
        t.terms.push_back(v);
      }
    }
    using Key = std::tuple<int, std::int64_t, std::int64_t, std::vector<std::int64_t>>;
    std::map<Key, std::vector<int>> groups;
    for (int v : t.terms) {
      const Node& p = g.nodes[g.values[v].node];
      if (!inner(v)) continue;
      if (plain_matmul(g, p)) {
        groups[{0, p.attrs.i0, p.attrs.i1, {}}].push_back(v);
      } else if (sum_over_rows(g, p)) {
        const Shape& xs = g.values[p.inputs[0]].shape;
        groups[{1, p.attrs.flag ? 1 : 0, 0, std::vector<std::int64_t>(xs.begin() + 1, xs.end())}].push_back(v);
      }
    }
    for (auto& [key, vs] : groups)
      if (vs.size() >= min_terms) t.batches.emplace_back(std::get<0>(key) == 0, std::move(vs));
    if (!t.batches.empty()) trees.emplace(i, std::move(t));
  }
  if (trees.empty()) return false;
  out = Graph{};
  out.name = g.name;
  out.strings = g.strings;
  std::vector<int> new_id(g.values.size(), -1);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& x = g.nodes[i];
    const auto tree = trees.find(i);
    if (tree == trees.end()) {
      Node m = x;
      for (int& v : m.inputs) v = new_id[v];
      append_node(out, g, std::move(m), new_id);
      continue;
    }
    std::vector<int> parts;  // out's values to add up, in order
    std::vector<char> taken(g.values.size(), 0);
    for (const auto& [products, vs] : tree->second.batches)
      for (std::size_t b = 0; b < vs.size(); b += max_batch) {
        const std::vector<int> chunk(vs.begin() + static_cast<std::ptrdiff_t>(b),
                                     vs.begin() + static_cast<std::ptrdiff_t>(std::min(vs.size(), b + max_batch)));
        if (chunk.size() < 2) continue;  // (a last chunk of one stays a term)
        const Node& p0 = g.nodes[g.values[chunk[0]].node];
        const Value& y = g.values[chunk[0]];
        Node r = p0;
        r.outputs.clear();
        if (products) {  // the operands stacked along their inner axis
          std::vector<int> as, bs;
          for (int v : chunk) {
            const Node& p = g.nodes[g.values[v].node];
            as.push_back(new_id[p.inputs[0]]);
            bs.push_back(new_id[p.inputs[1]]);
          }
          r.inputs = {add_concat(out, as, p0.attrs.i0 != 0 ? 0 : 1, p0.loc),
                      add_concat(out, bs, p0.attrs.i1 != 0 ? 1 : 0, p0.loc)};
        } else {  // column sums: the rows stacked
          std::vector<int> xs;
          for (int v : chunk) xs.push_back(new_id[g.nodes[g.values[v].node].inputs[0]]);
          r.inputs = {add_concat(out, xs, 0, p0.loc)};
        }
        parts.push_back(out.nodes[out.add_node(std::move(r), {{y.shape, y.dtype}}, y.device)].outputs[0]);
        for (int v : chunk) taken[v] = 1;
      }
    for (int v : tree->second.terms)
      if (!taken[v]) parts.push_back(new_id[v]);
    const Value& y = g.values[x.outputs[0]];
    int acc = parts[0];
    for (std::size_t k = 1; k < parts.size(); ++k) {
      Node a = x;
      a.inputs = {acc, parts[k]};
      a.outputs.clear();
      acc = out.nodes[out.add_node(std::move(a), {{y.shape, y.dtype}}, y.device)].outputs[0];
    }
    new_id[x.outputs[0]] = acc;
  }
  for (int v : g.inputs) out.inputs.push_back(new_id[v]);
  for (int v : g.outputs) out.outputs.push_back(new_id[v]);
  return true;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace detail_products

/// The batching pass, pure (a no-op while product_batching() is off). Products a_k W sharing
/// their right operand and its transpose flag, where no a_k is computed from another's product,
/// become one product of the stacked a_k (at the first one's place; what the later a_k need moves
/// there when that is free of effects), each a row slice of it. Sums of three or more products
/// op(a_k) op(b_k) of one pair of transpose flags, each read by that sum alone, become one product
/// of the operands stacked along their inner axis; sums of three or more column sums
/// sum(x_k, axis 0), one sum of the stacked x_k. Products over 2^24 multiply-adds are left alone.
/// optimize() runs it after cse (repeated work is merged before it is stacked). What it bypasses
/// is left for dce.
STAGECRAFT_COMPILED_INLINE Graph batch_products(const Graph& g);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE bool& product_batching() {
  static bool on = true;
  return on;
}

STAGECRAFT_COMPILED_INLINE Graph batch_products(const Graph& g) {
  if (!product_batching()) return g;
  // Rows first (an RNN's x_k W, before x_k W + h U could be read as a sum of products). One set per
  // rewrite (each moves nodes): a bounded number per call, the pipeline's rounds do the rest.
  // (Nothing is copied until something changes.)
  std::optional<Graph> cur;
  for (int k = 0; k < 16; ++k) {
    Graph next;
    if (!detail_products::batch_rows_once(cur ? *cur : g, next)) break;
    cur = std::move(next);
  }
  Graph summed;
  if (detail_products::batch_sums(cur ? *cur : g, summed)) cur = std::move(summed);
  return with_bodies(cur ? std::move(*cur) : g, [](const Graph& b) { return batch_products(b); });
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
