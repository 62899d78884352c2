// Memory planning: gives every intermediate a buffer, reusing buffers whose values are dead
// (liveness over the plan's steps) and writing elementwise results in place of a dying input.
// A concat's pieces are written straight into their places in its buffer where they can be
// (concat_in_place()), so that the concat copies nothing.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "../ir.hpp"
#include "../op_table.hpp"

namespace stagecraft::graph {

/// Buffers and which value lives in which.
struct MemoryPlan {
  /// What one step reads and writes (the plan's view of it).
  struct StepUse {
    std::vector<int> in;
    std::vector<int> out;     ///< values it writes into planned memory (empty: none)
    std::vector<int> first_out;  ///< values it writes first and then reads itself (a fused group's matmul head)
    bool views = false;       ///< its output shares the storage of in[0]
    bool in_place_ok = false; ///< elementwise: an output may reuse a dying same-size input's buffer
    bool last_out_apart = false;  ///< its last output never takes an input's buffer (a GPU reduction's result)
    /// A concat whose inputs lie one after another in its output (every extent before its axis
    /// is 1): a piece another step writes may be written in its place (see placed_in).
    bool concat = false;
  };
  std::vector<int> buffer_of;              ///< per value: its buffer, -1 when not planned
  std::vector<std::int64_t> offset_of;     ///< per value: its first byte in its buffer (non-zero for a placed piece)
  /// Per value: the concat whose buffer it is written into, in its place, by the step that makes
  /// it (so the concat need not copy it), or -1. A placed value may itself be a concat placed in
  /// another; offset_of is then from the outermost buffer's start.
  std::vector<int> placed_in;
  std::vector<std::int64_t> buffer_bytes;  ///< per buffer: its size
  std::vector<Device> buffer_device;       ///< per buffer: where it lives (its values' device)
  std::int64_t total_bytes() const {
    std::int64_t t = 0;
    for (std::int64_t b : buffer_bytes) t += b;
    return t;
  }
};

namespace detail_mem {
inline std::int64_t bytes_of(const Value& v) { return v.shape.numel() * static_cast<std::int64_t>(itemsize(v.dtype)); }
inline std::int64_t rounded(std::int64_t b) { return (b + 63) / 64 * 64; }
}  // namespace detail_mem

/// Whether plan_memory writes a concat's pieces in their places in its buffer: on by default. Off,
/// every concat copies its pieces (results are equal bit for bit either way).
STAGECRAFT_COMPILED_INLINE bool& concat_in_place();

/// Plans buffers for the values steps write. A value that leaves the plan (a result, a value
/// assigned to a variable, an argument of a host function or a control-flow body), or whose
/// view does, is not planned: it gets fresh storage at every run.
STAGECRAFT_COMPILED_INLINE MemoryPlan plan_memory(const Graph& g, const std::vector<MemoryPlan::StepUse>& steps);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE bool& concat_in_place() {
  static bool on = true;
  return on;
}

STAGECRAFT_COMPILED_INLINE MemoryPlan plan_memory(const Graph& g, const std::vector<MemoryPlan::StepUse>& steps) {
  const std::size_t nv = g.values.size();
  MemoryPlan mp;
  mp.buffer_of.assign(nv, -1);
  // The value whose storage each value shares (itself unless it is a view's output).
  std::vector<int> root(nv);
  for (std::size_t v = 0; v < nv; ++v) root[v] = static_cast<int>(v);
  std::vector<char> escapes(nv, 0);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.kind == NodeKind::op && !n.outputs.empty() && !fns(n.op).cpu)  // a view
      root[n.outputs[0]] = root[n.inputs[0]];
    const bool leaves = n.kind == NodeKind::assign_var || n.kind == NodeKind::host_fn ||
                        n.kind == NodeKind::cond || n.kind == NodeKind::while_loop;
    if (leaves)
      for (int v : n.inputs) escapes[root[v]] = 1;
  }
  for (int v : g.outputs) escapes[root[v]] = 1;
  // Pieces placed in a concat's buffer: each written once, by a step into planned memory, and
  // leaving nothing. Later concats first, so that a concat placed in a later one is known as a
  // piece before its own pieces are placed in it.
  mp.placed_in.assign(nv, -1);
  mp.offset_of.assign(nv, 0);
  std::vector<int> writer(nv, -1);  // the step writing each value through `out`
  for (std::size_t i = 0; i < steps.size(); ++i)
    for (int o : steps[i].out) writer[o] = static_cast<int>(i);
  for (std::size_t i = steps.size(); concat_in_place() && i-- > 0;) {
    const auto& s = steps[i];
    if (!s.concat || s.out.size() != 1) continue;
    const int c = s.out[0];
    if (escapes[c] || root[c] != c) continue;
    std::int64_t at = 0;
    for (int p : s.in) {
      const Value& pv = g.values[p];
      const bool once = std::count(s.in.begin(), s.in.end(), p) == 1;
      if (pv.shape.numel() > 0 && once && writer[p] >= 0 && writer[p] < static_cast<int>(i) && root[p] == p &&
          !escapes[p] && mp.placed_in[p] < 0 && pv.dtype == g.values[c].dtype && pv.device == g.values[c].device) {
        mp.placed_in[p] = c;
        mp.offset_of[p] = at;
      }
      at += detail_mem::bytes_of(pv);
    }
  }
  // Each value's storage root: its view source's, then the outermost concat that is placed in,
  // and its offset there (the offsets along the chain added).
  const std::vector<std::int64_t> own = mp.offset_of;
  std::vector<char> has_pieces(nv, 0);  // a root some placed value is written into
  for (std::size_t v = 0; v < nv; ++v) {
    if (mp.placed_in[v] < 0) continue;
    std::int64_t off = own[v];
    int r = mp.placed_in[v];
    for (; mp.placed_in[r] >= 0; r = mp.placed_in[r]) off += own[r];
    mp.offset_of[v] = off;
    has_pieces[r] = 1;
  }
  for (std::size_t v = 0; v < nv; ++v) {
    int r = root[v];
    while (mp.placed_in[r] >= 0) r = mp.placed_in[r];
    root[v] = r;
  }
  // Last step reading each storage root.
  std::vector<int> last(nv, -1);
  for (std::size_t i = 0; i < steps.size(); ++i)
    for (int v : steps[i].in) last[root[v]] = std::max(last[root[v]], static_cast<int>(i));
  std::vector<int> free_list;  // buffers free now
  auto release = [&](int b) { free_list.push_back(b); };
  // A buffer of `need` bytes on dev: best fit among free buffers there, else the largest grown, else a new one.
  auto fresh_buffer = [&](std::int64_t need, Device dev) {
    int best = -1;
    for (std::size_t k = 0; k < free_list.size(); ++k) {
      const int c = free_list[k];
      if (mp.buffer_device[c] != dev) continue;
      const bool fits = mp.buffer_bytes[c] >= need;
      if (best < 0) best = static_cast<int>(k);
      else {
        const int bb = free_list[best];
        const bool best_fits = mp.buffer_bytes[bb] >= need;
        if (fits && (!best_fits || mp.buffer_bytes[c] < mp.buffer_bytes[bb])) best = static_cast<int>(k);
        else if (!fits && !best_fits && mp.buffer_bytes[c] > mp.buffer_bytes[bb]) best = static_cast<int>(k);
      }
    }
    if (best >= 0) {
      const int b = free_list[best];
      free_list.erase(free_list.begin() + best);
      mp.buffer_bytes[b] = std::max(mp.buffer_bytes[b], need);
      return b;
    }
    mp.buffer_bytes.push_back(need);
    mp.buffer_device.push_back(dev);
    return static_cast<int>(mp.buffer_bytes.size()) - 1;
  };
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const auto& s = steps[i];
    // Written first, read by the rest of the step: a buffer now, and then like any input.
    for (int o : s.first_out)
      if (!escapes[o])
        mp.buffer_of[o] = fresh_buffer(detail_mem::rounded(detail_mem::bytes_of(g.values[o])), g.values[o].device);
    std::vector<int> dying;  // planned roots whose last read is this step
    for (int v : s.in) {
      const int r = root[v];
      if (last[r] == static_cast<int>(i) && mp.buffer_of[r] >= 0 &&
          std::find(dying.begin(), dying.end(), r) == dying.end())
        dying.push_back(r);
    }
    std::vector<int> taken;  // dying inputs whose buffer an output took in place
    for (std::size_t k = 0; k < s.out.size(); ++k) {
      const int o = s.out[k];
      if (escapes[o]) continue;
      if (root[o] != o || has_pieces[o]) {  // a placed piece, or a concat with pieces in place
        // (its outermost concat's buffer, taken by whichever of them is written first, and
        // released when nothing reads any of them any more)
        const int r = root[o];
        if (mp.buffer_of[r] < 0)
          mp.buffer_of[r] = fresh_buffer(detail_mem::rounded(detail_mem::bytes_of(g.values[r])), g.values[r].device);
        mp.buffer_of[o] = mp.buffer_of[r];
        continue;
      }
      const std::int64_t need = detail_mem::rounded(detail_mem::bytes_of(g.values[o]));
      int b = -1;
      if (s.in_place_ok && !(s.last_out_apart && k + 1 == s.out.size()))
        for (int r : dying)  // (not a concat's buffer with pieces in place: an input may be one of them)
          if (!has_pieces[r] && std::find(taken.begin(), taken.end(), r) == taken.end() &&
              detail_mem::bytes_of(g.values[r]) == detail_mem::bytes_of(g.values[o]) &&
              g.values[r].shape == g.values[o].shape && g.values[r].device == g.values[o].device) {
            b = mp.buffer_of[r];
            taken.push_back(r);
            break;
          }
      if (b < 0) b = fresh_buffer(need, g.values[o].device);
      mp.buffer_of[o] = b;
      if (last[o] < 0) release(b);  // never read (a dead result): free at once
    }
    for (int r : dying)
      if (std::find(taken.begin(), taken.end(), r) == taken.end()) release(mp.buffer_of[r]);
  }
  return mp;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
