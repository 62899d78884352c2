// Plan::str(), a part of plan.hpp (included at its end): the plan's steps, one line each, for
// people who count launches and want to see what was fused with what.
#pragma once
#include <iomanip>
#include <sstream>

#include "plan.hpp"

namespace stagecraft::graph {

#if STAGECRAFT_DEFINE_COMPILED
namespace detail_plan {

/// "f32[128,256] cuda:0" for value v.
inline std::string value_text(const Graph& g, int v) {
  const Value& x = g.values[v];
  std::string s = std::string(name(x.dtype)) + x.shape.str();
  if (x.device.is_cuda()) s += " " + x.device.str();
  return s;
}

/// The ops of a fused group in program order ("matmul -> add, relu, sum"): its head first, then
/// the ops it computes again rather than read ("sub (again), div, mul").
inline std::string group_text(const Graph& g, const FusionGroup& fg) {
  std::string s;
  if (fg.head >= 0) s = std::string(g.nodes[fg.head].name()) + " ->";
  bool first = true;
  const auto put = [&](int n, const char* note) {
    s += first ? (s.empty() ? "" : " ") : ", ";
    s += g.nodes[n].name();
    s += note;
    first = false;
  };
  for (int n : fg.recomputed) put(n, " (again)");
  for (int n : fg.nodes) put(n, "");
  return s;
}

}  // namespace detail_plan

STAGECRAFT_COMPILED_INLINE std::string Plan::str(int indent) const {
  const Graph& g = *g_;
  const std::string pad(static_cast<std::size_t>(indent), ' ');
  std::ostringstream os;
  const auto outs = [&](const Step& s) {
    std::string t;
    for (std::size_t k = 0; k < s.out.size(); ++k) t += (k ? ", " : "") + detail_plan::value_text(g, s.out[k]);
    return t;
  };
  // Fused groups by the values they write (a batch writes several groups' values).
  const auto groups_of = [&](const Step& s) {
    std::vector<int> gs;
    for (int v : s.out) {
      const int n = g.values[v].node;
      const int grp = n >= 0 ? groups_.group_of[n] : -1;
      if (grp >= 0 && std::find(gs.begin(), gs.end(), grp) == gs.end()) gs.push_back(grp);
    }
    return gs;
  };
  const std::vector<double> us = host_times();
  for (std::size_t i = 0; i < steps_.size(); ++i) {
    const Step& s = steps_[i];
    os << pad << i << ". ";
    if (i < us.size()) os << "[" << std::fixed << std::setprecision(1) << us[i] << std::defaultfloat << " us] ";
    switch (s.kind) {
      case StepKind::kernel:
        os << "kernel " << g.nodes[s.node].name();
        if (s.bgrad_fns != nullptr) os << " + its bias gradient (cuBLASLt epilogue)";
        if (s.xent_both) os << " + its gradient (one pass)";
        if (!s.rest.empty()) os << " (" << s.rest.size() << " of " << s.in.size() << " pieces copied)";
        os << " -> " << outs(s) << "\n";
        break;
      case StepKind::view: os << "view " << g.nodes[s.node].name() << " -> " << outs(s) << "\n"; break;
      case StepKind::read_var: os << "read variable -> " << outs(s) << "\n"; break;
      case StepKind::assign_var: os << "assign variable <- " << detail_plan::value_text(g, s.in[0]) << "\n"; break;
      case StepKind::host_fn: os << "host function -> " << outs(s) << "\n"; break;
      case StepKind::fused: {
        const std::vector<int> gs = groups_of(s);
        if (s.cuda_batch) {
          os << "fused batch of " << s.cuda_batch->programs().size() << " groups (one kernel):\n";
          for (int grp : gs)
            os << pad << "     " << detail_plan::group_text(g, groups_.groups[grp]) << " -> "
               << groups_.groups[grp].program.dtype << groups_.groups[grp].program.out_shape << "\n";
          break;
        }
        os << "fused";
        if (s.head_fns != nullptr) os << (s.gpu ? " (one cuBLASLt call" + std::string(s.relu ? ", ReLU epilogue)" : ")") : " (2 kernels)");
        os << " " << (gs.empty() ? std::string("?") : detail_plan::group_text(g, groups_.groups[gs[0]]));
        if (s.fused != nullptr && s.fused->special != nullptr) os << " [specialized]";
        if (s.cuda_fused != nullptr && s.cuda_fused->lanes() > 1) os << " [" << s.cuda_fused->lanes() << " threads per element]";
        os << " -> " << outs(s) << "\n";
        break;
      }
      case StepKind::cond:
      case StepKind::while_loop:
        os << (s.kind == StepKind::cond ? "cond" : "while") << " -> " << outs(s) << "\n";
        for (int b = 0; b < 2; ++b) {
          os << pad << "   " << (s.kind == StepKind::cond ? (b ? "else:" : "then:") : (b ? "body:" : "condition:")) << "\n";
          os << s.sub[b]->str(indent + 5);
        }
        break;
    }
  }
  for (const detail_plan::RowChain& c : chains_) {
    os << pad << "rows: steps " << c.first << "-" << c.last << " run " << c.block << " of " << c.rows << " rows at a time";
    if (c.chunk > 0) os << ", by chunks of " << c.chunk << " (column reductions)";
    os << "\n";
  }
  return os.str();
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
