// Elementwise fusion: groups chains of same-shape, same-dtype elementwise nodes (with
// broadcasting inputs) into one FusedProgram each, run as one pass over the data; a matmul whose
// result the group reads runs in the same step (its epilogue: bias, activation; CPU only), and a
// sum, max or min over trailing axes of a group's value consumes it tile by tile (never stored
// whole; on a GPU, row by row in the group's generated kernel), on the CPU also one over leading
// axes (a column sum: column_reductions()), and a concat of the group's values
// is written by the group itself, each piece through its window of the concat's result.
#pragma once
#include <algorithm>
#include <vector>

#include "fuse_rules.hpp"  // FusionGroup, the settings, the rules of what joins a group

namespace stagecraft::graph {

/// Finds the fusion groups (two nodes or more). A node joins the group of an input's producer
/// when it has the group's shape and dtype and no node outside the group, placed before it,
/// reads a value of the group (the group runs at its last node), except assignments that can be
/// deferred until after it (see deferrable()); a node reading several such groups joins them all
/// into one when that holds for their union.
STAGECRAFT_COMPILED_INLINE FusionGroups find_fusion_groups(const Graph& g);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE FusionGroups find_fusion_groups(const Graph& g) {
  FusionGroups r(g.nodes.size());
  const auto users = detail_fuse::users_of(g);
  std::vector<std::vector<int>> members;  // tentative groups
  std::vector<int> tentative(g.nodes.size(), -1);
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (!detail_fuse::candidate(g, n)) continue;
    const Value& out = g.values[n.outputs[0]];
    std::vector<int> near;  // the groups of its inputs with its shape, dtype and device
    for (int v : n.inputs) {
      const int grp = tentative[g.values[v].node];
      if (grp < 0 || std::find(near.begin(), near.end(), grp) != near.end()) continue;
      const Value& gv = g.values[g.nodes[members[grp][0]].outputs[0]];
      if (gv.shape == out.shape && gv.dtype == out.dtype && gv.device == out.device) near.push_back(grp);
    }
    // Every reader of group grp's values so far, placed before i, is in a group `inside` accepts
    // (or an assignment that can wait until the group has run).
    const auto readers_in = [&](int grp, auto&& inside) {
      for (int m : members[grp])
        for (int u : users[g.nodes[m].outputs[0]])
          if (u < static_cast<int>(i) && !inside(tentative[u]) && !detail_fuse::deferrable(g, u, static_cast<int>(i)))
            return false;
      return true;
    };
    // A node reading two groups joins them into one where that is safe (Adam's update: the
    // weight's step reads m's group and v's), else it joins the first it can.
    const auto in_near = [&](int t) { return std::find(near.begin(), near.end(), t) != near.end(); };
    int join = -1;
    if (near.size() > 1 && std::all_of(near.begin(), near.end(), [&](int grp) { return readers_in(grp, in_near); })) {
      join = near[0];
      for (std::size_t k = 1; k < near.size(); ++k) {
        for (int m : members[near[k]]) tentative[m] = join;
        members[join].insert(members[join].end(), members[near[k]].begin(), members[near[k]].end());
        members[near[k]].clear();
      }
      std::sort(members[join].begin(), members[join].end());
    }
    for (std::size_t k = 0; join < 0 && k < near.size(); ++k)
      if (readers_in(near[k], [&](int t) { return t == near[k]; })) join = near[k];
    if (join < 0) {
      join = static_cast<int>(members.size());
      members.emplace_back();
    }
    members[join].push_back(static_cast<int>(i));
    tentative[i] = join;
  }
  // Groups emptied by a join are dropped, the others renumbered.
  {
    std::vector<int> renumber(members.size(), -1);
    std::vector<std::vector<int>> kept;
    for (std::size_t k = 0; k < members.size(); ++k)
      if (!members[k].empty()) {
        renumber[k] = static_cast<int>(kept.size());
        kept.push_back(std::move(members[k]));
      }
    for (int& t : tentative)
      if (t >= 0) t = renumber[t];
    members = std::move(kept);
  }
  // Values of each tentative group.
  const auto values_of = [&](int grp) {
    std::vector<int> vs;
    for (int m : members[grp]) vs.push_back(g.nodes[m].outputs[0]);
    return vs;
  };
  // A reduction consumes a group's value when the group can run at the reduction's place.
  std::vector<int> reduce_of(members.size(), -1), head_of(members.size(), -1), last_of(members.size());
  for (std::size_t k = 0; k < members.size(); ++k) last_of[k] = members[k].back();
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (!detail_fuse::reduction_candidate(g, n)) continue;
    const int p = g.values[n.inputs[0]].node, grp = tentative[p];
    if (grp < 0 || reduce_of[grp] >= 0) continue;
    if (!detail_fuse::readers_ok(g, users, tentative, values_of(grp), grp, static_cast<int>(i))) continue;
    reduce_of[grp] = static_cast<int>(i);
    last_of[grp] = static_cast<int>(i);
    tentative[i] = grp;
  }
  // A matmul heads a group that reads its result when nothing outside the group reads that
  // result before the group runs.
  std::vector<char> heads(g.nodes.size(), 0);
  for (std::size_t k = 0; k < members.size(); ++k) {
    const Value& gv = g.values[g.nodes[members[k][0]].outputs[0]];
    if (gv.device.is_cuda()) {  // on a GPU, only as a cuBLASLt epilogue
      const int p = reduce_of[k] < 0 ? detail_fuse::gpu_epilogue_head(g, users, members[k]) : -1;
      if (p >= 0 && !heads[p]) {
        head_of[k] = p;
        heads[p] = 1;
      }
      continue;
    }
    if (product_fusion() == ProductFusion::everywhere) continue;  // (as on a GPU: products formed in groups instead)
    for (int m : members[k]) {
      for (int v : g.nodes[m].inputs) {
        const int p = g.values[v].node;
        if (heads[p] || !detail_fuse::head_candidate(g, g.nodes[p], gv.shape, gv.dtype)) continue;
        if (!detail_fuse::readers_ok(g, users, tentative, {v}, static_cast<int>(k), last_of[k])) continue;
        head_of[k] = p;
        heads[p] = 1;
        break;
      }
      if (head_of[k] >= 0) break;
    }
  }
  // Siblings: a group without a head or a reduction joins the latest earlier one of its shape,
  // dtype and device (also without) where nothing outside the two, placed before the later one's
  // end, reads the earlier one's values: one pass (on a GPU, one launch) instead of two. (An
  // LSTM's backward step computes its gates' gradients in two independent groups.) On the CPU, a
  // group whose value is assigned to a variable stays apart: an optimizer's update of one
  // variable is a group of its own there, run as one compiled loop (fused_special.hpp).
  {
    const auto assigns = [&](int k) {
      if (g.values[g.nodes[members[k][0]].outputs[0]].device.is_cuda()) return false;
      for (int m : members[k])
        for (int u : users[g.nodes[m].outputs[0]])
          if (g.nodes[u].kind == NodeKind::assign_var) return true;
      return false;
    };
    std::vector<int> order;  // groups by their last node
    for (std::size_t k = 0; k < members.size(); ++k)
      if (!members[k].empty() && head_of[k] < 0 && reduce_of[k] < 0 && !assigns(static_cast<int>(k)))
        order.push_back(static_cast<int>(k));
    std::sort(order.begin(), order.end(), [&](int a, int b) { return last_of[a] < last_of[b]; });
    const auto same_type = [&](int a, int b) {
      const Value &va = g.values[g.nodes[members[a][0]].outputs[0]], &vb = g.values[g.nodes[members[b][0]].outputs[0]];
      return va.shape == vb.shape && va.dtype == vb.dtype && va.device == vb.device;
    };
    std::vector<int> open;  // groups still able to take a later sibling
    for (int k : order) {
      int into = -1;
      const int lowest = std::max(0, static_cast<int>(open.size()) - 16);  // (the 16 latest: linear time)
      for (int j = static_cast<int>(open.size()) - 1; j >= lowest && into < 0; --j) {
        const int c = open[j];
        if (!same_type(c, k)) continue;
        bool ok = true;
        for (int m : members[c])
          for (int u : users[g.nodes[m].outputs[0]])
            ok = ok && (u >= last_of[k] || tentative[u] == c || tentative[u] == k ||
                        detail_fuse::deferrable(g, u, last_of[k]));
        if (ok) into = j;
      }
      if (into < 0) {
        open.push_back(k);
        continue;
      }
      const int c = open[into];  // k's nodes join c, which now ends where k did
      for (int m : members[k]) tentative[m] = c;
      members[c].insert(members[c].end(), members[k].begin(), members[k].end());
      std::sort(members[c].begin(), members[c].end());
      members[k].clear();
      last_of[c] = last_of[k];
    }
  }
  std::vector<char> is_output(g.values.size(), 0);
  for (int v : g.outputs) is_output[v] = 1;
  // On a GPU an op alone is a group too where that saves a launch: where it reads a cast it can
  // convert, or a product that only it reads, which it may form (a layer's input gradient times
  // ReLU's mask: relu_grad(g W^T, h)). Elsewhere one op is its eager kernel.
  std::vector<char> single(members.size(), 0);
  for (std::size_t k = 0; k < members.size(); ++k) {
    if (members[k].size() != 1 || head_of[k] >= 0 || reduce_of[k] >= 0) continue;
    const Node& n = g.nodes[members[k][0]];
    if (!g.values[n.outputs[0]].device.is_cuda()) continue;
    for (int v : n.inputs) {
      const int p = g.values[v].node;
      const Node& pn = g.nodes[p];
      bool product = product_fusion() != ProductFusion::off && pn.kind == NodeKind::op && pn.op == ops::OpId::MatMul &&
                     pn.inputs.size() == 2 && users[v].size() == 1 && !is_output[v] && g.values[pn.inputs[0]].shape.rank() == 2;
      if (product) {  // (within absorb_products' limits: else the op stays its eager kernel)
        const std::int64_t inner = g.values[pn.inputs[0]].shape[pn.attrs.i0 != 0 ? 0 : 1];
        product = detail_fuse::small_product(inner, g.values[n.outputs[0]].shape.numel());
      }
      single[k] = single[k] || product || detail_fuse::convertible(g, is_output, p);
    }
  }
  // Rematerialized values: a value of a group with a reduction, made by a cheap op
  // (cheap_to_recompute) from values that exist anyway (arguments, constants, results of other
  // ops or of groups without a reduction; not slices, casts or products a group may absorb) of
  // which at most one is as large as it,
  // and read outside its group only by other groups of its shape (built then, if lone), is not
  // written by its group: each of those groups computes it again from the op's inputs. The reduce-
  // then-normalise pattern (layer_norm: x - mean feeds the variance's sum and, after it, the
  // normalisation) then writes and reads back one tensor less.
  std::vector<char> remat(g.values.size(), 0);
  {
    // (a lone op reading the value becomes a group too: the value computed again, then the op,
    // as layer_norm's normalisation without an affine step)
    const auto builds = [&](int t) { return t >= 0 && !members[t].empty() && head_of[t] < 0; };
    // A value's inputs may be rematerialized values themselves, computed again first (layer_norm's
    // (x - mean) * rstd, which its gamma's gradient reads): up to max_ops ops in all, with at most
    // one input as large as the value among the values the whole computation reads.
    constexpr int max_ops = 3;
    std::vector<int> ops_of(g.values.size(), 0), full_of(g.values.size(), 0);
    for (bool changed = rematerialize(); changed;) {
      changed = false;
      for (std::size_t k = 0; k < members.size(); ++k) {
        if (members[k].empty() || reduce_of[k] < 0 || head_of[k] >= 0) continue;
        for (int m : members[k]) {
          const Node& n = g.nodes[m];
          const int v = n.outputs[0];
          const Value& val = g.values[v];
          if (remat[v] || is_output[v] || !detail_fuse::cheap_to_recompute(n.op)) continue;
          bool ok = true;
          int full = 0, cost = 1;
          for (int w : n.inputs) {
            if (remat[w]) {  // (computed again too, from its own inputs)
              full += g.values[w].shape.numel() >= val.shape.numel() ? full_of[w] : 0;
              cost += ops_of[w];
              continue;
            }
            const int pn = g.values[w].node;
            full += g.values[w].shape.numel() >= val.shape.numel();
            if (pn < 0) continue;
            const Node& pnode = g.nodes[pn];
            // (a group with a reduction may recompute its own values: not those)
            ok = ok && (tentative[pn] < 0 || reduce_of[tentative[pn]] < 0) &&
                 !detail_fuse::windowable(g, users, is_output, pn) && !detail_fuse::convertible(g, is_output, pn) &&
                 !(pnode.kind == NodeKind::op && pnode.op == ops::OpId::MatMul);
          }
          bool read_outside = false;
          for (int u : users[v]) {
            const int t = tentative[u];
            if (t == static_cast<int>(k)) continue;
            read_outside = true;
            const Value* tv = builds(t) ? &g.values[g.nodes[members[t][0]].outputs[0]] : nullptr;
            ok = ok && tv != nullptr && std::find(members[t].begin(), members[t].end(), u) != members[t].end() &&
                 tv->shape == val.shape && tv->dtype == val.dtype && tv->device == val.device;
          }
          if (!(ok && full <= 1 && cost <= max_ops && read_outside)) continue;
          remat[v] = 1, ops_of[v] = cost, full_of[v] = full, changed = true;
          for (int u : users[v])
            if (tentative[u] != static_cast<int>(k)) single[tentative[u]] = 1;
        }
      }
    }
  }
  // Slices read by several groups without a matmul head and by nothing else (an LSTM's bias
  // slices, read by every step's gates): each group reads its window of the sliced value, and the
  // slice never runs (it joins the first group that reads it, where the plan skips it).
  // Likewise on a GPU, casts read by such groups alone (one or several: an optimizer's learning
  // rate, computed in f64 and cast to f32, read by each variable's update): each group reads the
  // cast's input, converted as it reads it, and the cast never runs.
  std::vector<char> shared(g.nodes.size(), 0), converted(g.nodes.size(), 0);
  {
    std::vector<int> built(g.nodes.size(), -1);  // node -> its headless group that will be built
    for (std::size_t k = 0; k < members.size(); ++k)
      if (!members[k].empty() && (members[k].size() >= 2 || reduce_of[k] >= 0 || single[k]) && head_of[k] < 0)
        for (int m : members[k]) built[m] = static_cast<int>(k);
    for (std::size_t sn = 0; sn < g.nodes.size(); ++sn) {
      if (!detail_fuse::windowable(g, users, is_output, static_cast<int>(sn))) continue;
      const std::vector<int>& readers = users[g.nodes[sn].outputs[0]];
      bool all = true, several = false;
      for (int u : readers) {
        all = all && built[u] >= 0;
        several = several || built[u] != built[readers[0]];
      }
      shared[sn] = all && several;
    }
    for (std::size_t cn = 0; cn < g.nodes.size(); ++cn) {
      if (!detail_fuse::convertible(g, is_output, static_cast<int>(cn))) continue;
      const std::vector<int>& readers = users[g.nodes[cn].outputs[0]];
      converted[cn] = !readers.empty() && std::all_of(readers.begin(), readers.end(), [&](int u) { return built[u] >= 0; });
    }
  }
  for (std::size_t k = 0; k < members.size(); ++k) {
    if (members[k].empty()) continue;  // joined a sibling
    const std::vector<int>& ms = members[k];
    if (ms.size() < 2 && head_of[k] < 0 && reduce_of[k] < 0 && !single[k]) continue;
    const int gid = static_cast<int>(r.groups.size());
    FusionGroup fg;
    fg.nodes = ms;
    fg.head = head_of[k];
    fg.reduce = reduce_of[k];
    for (int m : ms) r.group_of[m] = gid;
    const Value& first = g.values[g.nodes[ms[0]].outputs[0]];
    fg.program.dtype = first.dtype;
    fg.program.out_shape = first.shape;
    std::vector<int> reg(g.values.size(), -1);
    // External inputs first (registers 0..k), then one register per instruction. A slice that
    // only this group reads is read through a window of the sliced value instead: no kernel of
    // its own (an LSTM's gates, read from one [N, 4H] product).
    std::vector<int> absorbed;
    const auto take_input = [&](int v) {
      reg[v] = static_cast<int>(fg.inputs.size());
      const int sn = g.values[v].node;
      FusedWindow w;
      if (fg.head < 0 && (shared[sn] || detail_fuse::window_candidate(g, users, is_output, r.group_of, gid, sn))) {
        const Node& sl = g.nodes[sn];
        const Shape& parent = g.values[sl.inputs[0]].shape;
        w.parent = parent;
        for (int d = 0; d < parent.rank(); ++d) w.begin.push_back(ops::Slice::start(parent, sl.attrs, d));
        fg.inputs.push_back(sl.inputs[0]);
        if (r.group_of[sn] < 0) absorbed.push_back(sn);  // (a shared slice joins the first group only)
      } else if (fg.head < 0 && converted[sn]) {
        fg.inputs.push_back(g.nodes[sn].inputs[0]);
        if (r.group_of[sn] < 0) absorbed.push_back(sn);  // (joins the first group that reads it)
      } else {
        fg.inputs.push_back(v);
      }
      fg.program.input_shapes.push_back(g.values[v].shape);
      fg.program.windows.push_back(std::move(w));
      fg.program.input_dtypes.push_back(g.values[fg.inputs.back()].dtype);
    };
    // a rematerialized value: computed here from its inputs (registered below, first), after
    // those of them that are rematerialized too
    const auto recompute = [&](const auto& self, int v) -> void {
      const int pn = g.values[v].node;
      if (std::find(fg.recomputed.begin(), fg.recomputed.end(), pn) != fg.recomputed.end()) return;
      for (int w : g.nodes[pn].inputs) {
        if (remat[w]) self(self, w);
        else if (reg[w] < 0) take_input(w);
      }
      fg.recomputed.push_back(pn);
    };
    for (int m : ms)
      for (int v : g.nodes[m].inputs) {
        const int pn = g.values[v].node;
        if (reg[v] >= 0 || (pn >= 0 && r.group_of[pn] == gid)) continue;
        if (remat[v]) recompute(recompute, v);
        else take_input(v);
      }
    if (!fg.program.any_window()) fg.program.windows.clear();
    if (!fg.program.any_converted()) fg.program.input_dtypes.clear();
    for (int sn : absorbed) {
      r.group_of[sn] = gid;
      fg.nodes.push_back(sn);
    }
    std::sort(fg.nodes.begin(), fg.nodes.end());  // (each slice comes before its readers)
    if (fg.head < 0) detail_fuse::absorb_products(g, users, is_output, r.group_of, gid, fg);
    const int base = static_cast<int>(fg.inputs.size());
    for (int pn : fg.recomputed) {  // (their inputs: input slots or recomputed before them)
      const Node& n = g.nodes[pn];
      fg.program.code.push_back({n.op, reg[n.inputs[0]], n.inputs.size() > 1 ? reg[n.inputs[1]] : -1});
      reg[n.outputs[0]] = base + static_cast<int>(fg.program.code.size()) - 1;
    }
    for (std::size_t j = 0; j < ms.size(); ++j) {
      const Node& n = g.nodes[ms[j]];
      FusedInstr ins{n.op, reg[n.inputs[0]], n.inputs.size() > 1 ? reg[n.inputs[1]] : -1};
      fg.program.code.push_back(ins);
      reg[n.outputs[0]] = base + static_cast<int>(fg.program.code.size()) - 1;
    }
    if (fg.reduce >= 0) {
      const Node& rn = g.nodes[fg.reduce];
      r.group_of[fg.reduce] = gid;
      fg.nodes.push_back(fg.reduce);
      const std::int64_t trailing = detail_fuse::trailing_inner(g, rn);
      fg.program.reduction = FusedReduction{rn.op, reg[rn.inputs[0]], trailing > 0 ? trailing : detail_fuse::leading_kept(g, rn),
                                            g.values[rn.outputs[0]].shape, trailing == 0};
    }
    if (fg.head >= 0) r.group_of[fg.head] = gid;
    // Concats of the group's values after it: the group writes their results (their pieces are
    // then outputs only where something else reads them too).
    fg.concats = detail_fuse::concats_of(g, users, r.group_of, fg, ms, reg, base);
    for (int cn : fg.concats) r.group_of[cn] = gid;
    for (int m : ms) {
      const int v = g.nodes[m].outputs[0];
      bool outside = is_output[v] != 0;
      for (int u : users[v]) outside |= r.group_of[u] != gid && !remat[v];  // (remat: its readers compute it)
      if (outside) {
        fg.outputs.push_back(v);
        fg.program.outputs.push_back(reg[v]);
      }
    }
    detail_fuse::write_concats(g, fg.concats, reg, fg);
    if (fg.outputs.empty() && fg.reduce < 0) {  // dead (a graph not yet through dce): its last value, unread
      fg.outputs.push_back(g.nodes[ms.back()].outputs[0]);
      fg.program.outputs.push_back(reg[fg.outputs.back()]);
    }
    if (fg.reduce >= 0) fg.outputs.push_back(g.nodes[fg.reduce].outputs[0]);
    r.groups.push_back(std::move(fg));
  }
  return r;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
