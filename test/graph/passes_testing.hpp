// Helpers of the graph pass tests (test_passes.cpp, test_passes_products.cpp): node counts, running a
// graph through a plan, and results compared bit for bit.
#pragma once
#include <catch2/catch.hpp>

#include <stagecraft/graph/plan.hpp>

#include <bit>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace sctest::passes {

/// Nodes of g (top level) printed with this name ("exp", "const", "read_var").
inline int count(const stagecraft::graph::Graph& g, std::string_view name) {
  int n = 0;
  for (const stagecraft::graph::Node& x : g.nodes) n += x.name() == name;
  return n;
}

/// g's results on args, through a plan.
inline std::vector<stagecraft::Tensor> run(const stagecraft::graph::Graph& g, const std::vector<stagecraft::Tensor>& args) {
  const stagecraft::graph::Plan p(std::make_shared<const stagecraft::graph::Graph>(g));
  return p.run(args);
}

/// The results of g and o on args, bit for bit (f32 results).
inline void check_same_bits(const stagecraft::graph::Graph& g, const stagecraft::graph::Graph& o,
                            const std::vector<stagecraft::Tensor>& args) {
  const std::vector<stagecraft::Tensor> a = run(g, args), b = run(o, args);
  REQUIRE(a.size() == b.size());
  for (std::size_t k = 0; k < a.size(); ++k) {
    REQUIRE(a[k].shape() == b[k].shape());
    const auto x = a[k].to_vector<float>(), y = b[k].to_vector<float>();
    for (std::size_t i = 0; i < x.size(); ++i) {
      INFO("result " << k << ", element " << i << ": " << x[i] << " and " << y[i]);
      CHECK(std::bit_cast<std::uint32_t>(x[i]) == std::bit_cast<std::uint32_t>(y[i]));
    }
  }
}

}  // namespace sctest::passes
