// The optimization pipeline: simplify, distribute, fold, cse, products, dce, repeated to a fixed point, with the
// verifier between passes in debug builds (or when asked).
#pragma once
#include <string>
#include <vector>

#include "../ir.hpp"
#include "concat.hpp"
#include "cse.hpp"
#include "dce.hpp"
#include "fold.hpp"
#include "products.hpp"
#include "simplify.hpp"
#include "verify.hpp"

namespace stagecraft::graph {

/// Whether optimize() verifies after every pass when not told: in debug builds, or when
/// STAGECRAFT_VERIFY_PASSES is defined.
#if !defined(NDEBUG) || defined(STAGECRAFT_VERIFY_PASSES)
inline constexpr bool verify_passes_by_default = true;
#else
inline constexpr bool verify_passes_by_default = false;
#endif

/// One pass application: its name and the graph's compute nodes (Graph::num_compute_nodes,
/// top level) before and after it.
struct PassReport {
  std::string pass;
  int nodes_before = 0;
  int nodes_after = 0;
};

/// At most this many rounds of the six passes (each round usually settles the graph; a
/// second one catches what a fold or a merge exposed to simplify).
inline constexpr int optimize_max_rounds = 4;

/// The graph optimized: rounds of simplify, distribute (distribute_over_concat), fold, cse, products
/// (batch_products, while product_batching() is on: after cse, so that repeated products are one
/// before they are stacked) and dce
/// (each also on cond/while bodies)
/// until a round changes nothing or optimize_max_rounds have run. Appends one PassReport per
/// pass run to *report when given. With `verify_each` the input and every pass's result are
/// verified (sc::Error "[verify] after <pass>: ..." names the pass that broke the graph).
STAGECRAFT_COMPILED_INLINE Graph optimize(const Graph& g, std::vector<PassReport>* report = nullptr,
                                          bool verify_each = verify_passes_by_default);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE Graph optimize(const Graph& g, std::vector<PassReport>* report, bool verify_each) {
  struct Pass {
    const char* name;
    Graph (*run)(const Graph&);
  };
  static constexpr Pass passes[] = {{"simplify", &simplify}, {"distribute", &distribute_over_concat}, {"fold", &fold}, {"cse", &cse}, {"products", &batch_products}, {"dce", &dce}};
  if (verify_each) verify(g, "trace");
  Graph cur = g;
  std::string before = cur.str();
  for (int round = 0; round < optimize_max_rounds; ++round) {
    for (const Pass& p : passes) {
      const int n0 = cur.num_compute_nodes();
      cur = p.run(cur);
      if (verify_each) verify(cur, p.name);
      if (report) report->push_back({p.name, n0, cur.num_compute_nodes()});
    }
    std::string after = cur.str();
    if (after == before) break;
    before = std::move(after);
  }
  return cur;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
