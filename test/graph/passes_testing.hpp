// Helpers of the graph pass and plan tests (test_passes.cpp, test_passes_products.cpp,
// test_plan_memory.cpp): node counts, running a graph through a plan, results compared bit for bit,
// small exact inputs, and a switch set for a scope.
#pragma once
#include <catch2/catch.hpp>

#include <stagecraft/core/creation.hpp>
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

/// A [rows, cols] f32 spec.
inline stagecraft::TensorSpec spec(std::int64_t r, std::int64_t c) { return {stagecraft::Shape{r, c}, stagecraft::DType::f32}; }

/// A [rows, cols] f32 tensor of values k/7 - 1 (k = seed + 3 i, mod 15): small, exact, all distinct.
inline stagecraft::Tensor ramp(std::int64_t rows, std::int64_t cols, int seed) {
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((seed + 3 * static_cast<int>(i)) % 15) / 7.f - 1.f;
  return stagecraft::tensor(v, stagecraft::Shape{rows, cols});
}

/// RAII: a process-wide switch (graph::product_batching(), graph::concat_in_place(),
/// graph::product_fusion(), ...) set, restored on exit.
template <class T>
class Switch {
 public:
  Switch(T& flag, T value) : flag_(flag), saved_(flag) { flag_ = value; }
  Switch(const Switch&) = delete;
  Switch& operator=(const Switch&) = delete;
  ~Switch() { flag_ = saved_; }

 private:
  T& flag_;
  T saved_;
};

}  // namespace sctest::passes
