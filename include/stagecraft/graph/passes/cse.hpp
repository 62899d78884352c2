// Common-subexpression elimination: equal op calls, equal small constants and repeated reads
// of a variable (with no assignment between) become one node.
#pragma once
#include <bit>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "../ir.hpp"
#include "compact.hpp"

namespace stagecraft::graph {

/// Constants up to this many elements are compared by their bytes; larger ones are one only
/// when they are the same tensor (or share storage with the same shape and dtype).
inline constexpr std::int64_t cse_max_compared_elements = 64;

namespace detail_cse {

/// Attrs equality in which a scalar is compared by its bits (0.0 and -0.0 differ; NaN never
/// matches through operator==, so such nodes are simply kept apart).
STAGECRAFT_COMPILED_INLINE bool same_attrs(const ops::Attrs& a, const ops::Attrs& b);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE bool same_attrs(const ops::Attrs& a, const ops::Attrs& b) {
  return a == b && std::bit_cast<std::uint64_t>(a.scalar) == std::bit_cast<std::uint64_t>(b.scalar) &&
         std::bit_cast<std::uint64_t>(a.scalar2) == std::bit_cast<std::uint64_t>(b.scalar2);
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// Folds v into the hash h (boost::hash_combine's mixing).
inline void mix(std::size_t& h, std::size_t v) { h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2); }

/// h with a shape's rank and extents mixed in.
STAGECRAFT_COMPILED_INLINE std::size_t hash_shape(std::size_t h, const Shape& s);

/// True when two constants hold the same elements (see cse_max_compared_elements).
STAGECRAFT_COMPILED_INLINE bool same_constant(const Tensor& a, const Tensor& b);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::size_t hash_shape(std::size_t h, const Shape& s) {
  mix(h, static_cast<std::size_t>(s.rank()));
  for (std::int64_t d : s) mix(h, static_cast<std::size_t>(d));
  return h;
}

STAGECRAFT_COMPILED_INLINE bool same_constant(const Tensor& a, const Tensor& b) {
  if (a.same(b)) return true;
  if (a.dtype() != b.dtype() || a.shape() != b.shape() || a.device() != b.device()) return false;
  if (a.shares_storage_with(b)) return true;  // tensors are contiguous views from the start of storage
  if (a.numel() > cse_max_compared_elements || !a.device().is_cpu()) return false;
  return a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// What a body may change: the variables it assigns, or everything (it calls host code).
struct Effects {
  std::unordered_set<const detail::VariableState*> vars;
  bool host = false;
};

/// Adds what g and its nested bodies may change to e.
STAGECRAFT_COMPILED_INLINE void collect_effects(const Graph& g, Effects& e);

/// The key an op or constant node is bucketed under (equal nodes share it).
STAGECRAFT_COMPILED_INLINE std::size_t node_key(const Node& n, const std::vector<int>& replace);

/// True when node b computes what node a computes (both op or both constant nodes).
STAGECRAFT_COMPILED_INLINE bool same_node(const Graph& g, const Node& a, const Node& b,
                                          const std::vector<int>& replace);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE void collect_effects(const Graph& g, Effects& e) {
  for (const Node& n : g.nodes) {
    if (n.kind == NodeKind::assign_var) e.vars.insert(n.var.get());
    if (n.kind == NodeKind::host_fn) e.host = true;
    for (const auto& b : n.bodies)
      if (b) collect_effects(*b, e);
  }
}

STAGECRAFT_COMPILED_INLINE std::size_t node_key(const Node& n, const std::vector<int>& replace) {
  std::size_t h = static_cast<std::size_t>(n.kind);
  if (n.kind == NodeKind::op) {
    mix(h, static_cast<std::size_t>(n.op));
    for (int v : n.inputs) mix(h, static_cast<std::size_t>(resolve_value(replace, v)));
    h = hash_shape(h, n.attrs.ints);
    mix(h, static_cast<std::size_t>(n.attrs.dtype));
  } else {
    const Tensor& t = n.constant;
    mix(h, static_cast<std::size_t>(t.dtype()));
    h = hash_shape(h, t.shape());
    if (t.numel() <= cse_max_compared_elements && t.device().is_cpu() && t.nbytes() > 0)
      mix(h, std::hash<std::string_view>{}({static_cast<const char*>(t.raw_data()), t.nbytes()}));
  }
  return h;  // devices are compared by same_node
}

STAGECRAFT_COMPILED_INLINE bool same_node(const Graph& g, const Node& a, const Node& b,
                                          const std::vector<int>& replace) {
  if (a.kind != b.kind || a.outputs.size() != b.outputs.size()) return false;
  for (std::size_t k = 0; k < a.outputs.size(); ++k) {
    const Value& x = g.values[a.outputs[k]];
    const Value& y = g.values[b.outputs[k]];
    if (x.shape != y.shape || x.dtype != y.dtype || x.device != y.device) return false;
  }
  if (a.kind == NodeKind::constant) return same_constant(a.constant, b.constant);
  if (a.op != b.op || a.inputs.size() != b.inputs.size() || !same_attrs(a.attrs, b.attrs)) return false;
  for (std::size_t k = 0; k < a.inputs.size(); ++k)
    if (resolve_value(replace, a.inputs[k]) != resolve_value(replace, b.inputs[k])) return false;
  return true;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace detail_cse

/// Common-subexpression elimination, pure and in program order (the first node of a class
/// stays, with its source line):
///  - op nodes with the same op, the same input values (after earlier merges) and equal attrs
///    are one. Ops are deterministic functions of their inputs and attrs: random_normal and
///    random_uniform take their (key, offset) state as an input, so equal inputs mean equal
///    samples and merging them is correct (there is no stateful-op marker to check);
///  - constants with the same dtype, shape, device and bytes (small ones) are one;
///  - read_var nodes of one variable are one while no assign_var of it, no cond/while body
///    assigning it and no host_fn (which may run any code) comes between them.
/// Side-effect nodes are never merged. Bodies of cond/while nodes are processed on their own.
STAGECRAFT_COMPILED_INLINE Graph cse(const Graph& g);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE Graph cse(const Graph& g) {
  std::vector<char> keep(g.nodes.size(), 1);
  std::vector<int> replace(g.values.size(), -1);
  std::unordered_map<std::size_t, std::vector<int>> buckets;
  std::unordered_map<const detail::VariableState*, int> last_read;  // variable -> its read_var value
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    switch (n.kind) {
      case NodeKind::op:
      case NodeKind::constant: {
        if (n.outputs.empty()) break;
        auto& bucket = buckets[detail_cse::node_key(n, replace)];
        bool merged = false;
        for (int j : bucket) {
          if (!detail_cse::same_node(g, g.nodes[j], n, replace)) continue;
          for (std::size_t k = 0; k < n.outputs.size(); ++k) replace[n.outputs[k]] = g.nodes[j].outputs[k];
          keep[i] = 0;
          merged = true;
          break;
        }
        if (!merged) bucket.push_back(static_cast<int>(i));
        break;
      }
      case NodeKind::read_var: {
        auto [it, fresh] = last_read.try_emplace(n.var.get(), n.outputs[0]);
        if (!fresh) {
          replace[n.outputs[0]] = it->second;
          keep[i] = 0;
        }
        break;
      }
      case NodeKind::assign_var: last_read.erase(n.var.get()); break;
      case NodeKind::host_fn: last_read.clear(); break;
      case NodeKind::cond:
      case NodeKind::while_loop: {
        detail_cse::Effects e;
        for (const auto& b : n.bodies)
          if (b) detail_cse::collect_effects(*b, e);
        if (e.host) last_read.clear();
        for (const detail::VariableState* v : e.vars) last_read.erase(v);
        break;
      }
      case NodeKind::input:
      case NodeKind::custom_gradient: break;  // (each call keeps its own rule)
    }
  }
  return with_bodies(compact(g, keep, replace), [](const Graph& b) { return cse(b); });
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
