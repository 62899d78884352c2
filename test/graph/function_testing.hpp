// Helpers of the sc::function tests (test_function.cpp, test_function_fusion.cpp, and the plan
// counts of cuda/test_cuda_batch.cpp).
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <stagecraft/graph/function.hpp>
#include <stagecraft/stagecraft.hpp>

#include "passes_testing.hpp"
#include "testing.hpp"

namespace sctest::function {

/// a and b have one shape and dtype and equal elements (within tol relative to 1 + |b|, when given).
inline void check_same(const sc::Tensor& a, const sc::Tensor& b, double tol = 0) {
  REQUIRE(a.shape() == b.shape());
  REQUIRE(a.dtype() == b.dtype());
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("element " << i << ": " << x[i] << " vs " << y[i]);
    if (tol == 0) CHECK(x[i] == y[i]);
    else CHECK(std::abs(x[i] - y[i]) <= tol * (1 + std::abs(y[i])));
  }
}

/// a and b hold the same values bit for bit (dtype T: f32 or f64).
template <class T>
bool same_bits(const sc::Tensor& a, const sc::Tensor& b) {
  const auto x = a.to_vector<T>(), y = b.to_vector<T>();
  bool same = x.size() == y.size();
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  for (std::size_t i = 0; same && i < x.size(); ++i) same = std::bit_cast<U>(x[i]) == std::bit_cast<U>(y[i]);
  return same;
}

/// f traced (a fresh sc::function) with a pass switch (sc::graph::rematerialize(), ...) set to `on`
/// and restored after: its plan listing and results.
template <class F, class... A>
std::pair<std::string, std::vector<sc::Tensor>> traced_with(bool& pass, bool on, const F& f, const A&... args) {
  const sctest::passes::Switch<bool> mode(pass, on);
  auto fn = sc::function(f);
  std::vector<sc::Tensor> outs;
  if constexpr (std::is_same_v<decltype(fn(args...)), sc::Tensor>) outs.push_back(fn(args...));
  else std::apply([&](const auto&... o) { (outs.push_back(o), ...); }, fn(args...));
  return {fn.get_concrete(args...).plan().str(), outs};
}

/// A layer_norm training step over rows of `cols`: (a, r, gamma, beta) -> (loss, d loss/d a,
/// d loss/d gamma, d loss/d beta), loss = sum(layer_norm(a, {cols}, gamma, beta) * r).
inline auto layer_norm_step(std::int64_t cols) {
  return [cols](const sc::Tensor& a, const sc::Tensor& r, const sc::Tensor& g, const sc::Tensor& b) {
    sc::GradientTape tape;
    tape.watch(a);
    tape.watch(g);
    tape.watch(b);
    const sc::Tensor loss = sc::sum(sc::nn::layer_norm(a, {cols}, g, b) * r);
    const std::vector<sc::Tensor> gs = tape.gradient(loss, {a, g, b});
    return std::make_tuple(loss, gs[0], gs[1], gs[2]);
  };
}

/// The plan a GPU lowers for c's graph, without a GPU: every value relabelled cuda:0, optimized
/// and lowered with GPU fusion on; nothing runs. Its kernels are its launches there.
inline std::shared_ptr<const sc::graph::Plan> gpu_plan(const sc::ConcreteFunction& c) {
  sc::graph::Graph g = c.graph();
  for (sc::graph::Value& v : g.values) v.device = sc::Device::cuda(0);
  const bool fusion = sc::graph::cuda_fusion();
  sc::graph::cuda_fusion() = true;
  auto plan = std::make_shared<const sc::graph::Plan>(std::make_shared<const sc::graph::Graph>(sc::graph::optimize(g)));
  sc::graph::cuda_fusion() = fusion;
  return plan;
}
inline sc::graph::PlanStats gpu_plan_stats(const sc::ConcreteFunction& c) { return gpu_plan(c)->stats(); }

/// The example's MLP (784-256-128-10, ReLU, Adam) training step at batch 128, traced and called
/// once: its loss, and the concrete function (which keeps the variables it reads).
inline std::pair<sc::Tensor, sc::ConcreteFunction> traced_mlp_adam_step() {
  sc::manual_seed(5);
  sc::nn::Dense l1(784, 256), l2(256, 128), l3(128, 10);
  sc::optim::Adam opt(1e-3);
  std::vector<sc::Variable> vars;
  for (const sc::nn::Dense* l : {&l1, &l2, &l3})
    for (const auto& v : l->trainable_variables()) vars.push_back(v);
  auto f = sc::function([&](const sc::Tensor& x, const sc::Tensor& y) {
    sc::GradientTape tape;
    const sc::Tensor loss = sc::nn::cross_entropy(l3(sc::relu(l2(sc::relu(l1(x))))), y);
    opt.apply(tape.gradient(loss, vars), vars);
    return loss;
  });
  const sc::Tensor x = sc::random::uniform({128, 784}, 0.0, 1.0, 11);
  const sc::Tensor y = sc::cast(sc::random::uniform({128}, 0.0, 10.0, 12), sc::i64);
  const sc::Tensor loss = f(x, y);
  return {loss, f.get_concrete(x, y)};
}

}  // namespace sctest::function
