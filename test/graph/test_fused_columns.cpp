// Column reductions in fused groups (graph::column_reductions()): a sum, max or min over the
// leading axes of a CPU group's value (sum(x * y, {0}): a bias's or LayerNorm gamma's gradient) is
// reduced by the group as it computes the value, never written and read back. Checked against
// plain loops over every shape the evaluator cuts differently (one row, fewer rows than a pairwise
// block, several chunks, more columns than a task's group, rank 3), bit for bit against the
// reduction kernel (the switch off, and eager), with the group's other outputs, sin's
// batch-dependent bits, and the cases that stay kernels (a GPU plan, axes that are not leading).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <stagecraft/stagecraft.hpp>

#include "function_testing.hpp"
#include "passes_testing.hpp"
#include "testing.hpp"

namespace {

using sctest::function::check_same;
using sctest::function::same_bits;

/// f traced (a fresh sc::function) with column reductions on or off: its plan listing and results.
template <class F, class... A>
auto traced(bool on, const F& f, const A&... args) {
  return sctest::function::traced_with(sc::graph::column_reductions(), on, f, args...);
}

enum class Red { sum, max, min };

/// The reduction of v (rows x cols, row-major) over its rows, in long double: plain loops.
std::vector<long double> columns(const std::vector<double>& v, std::int64_t rows, std::int64_t cols, Red r) {
  std::vector<long double> out(static_cast<std::size_t>(cols));
  for (std::int64_t c = 0; c < cols; ++c) {
    long double acc = v[static_cast<std::size_t>(c)];
    for (std::int64_t i = 1; i < rows; ++i) {
      const long double x = v[static_cast<std::size_t>(i * cols + c)];
      acc = r == Red::sum ? acc + x : r == Red::max ? std::max(acc, x) : std::min(acc, x);
    }
    out[static_cast<std::size_t>(c)] = acc;
  }
  return out;
}

/// got equals the plain loops' reduction of x * y + 0.5 over its rows (rows x cols): a sum within
/// a few ulps of the sum of magnitudes, max and min exactly.
void check_columns(const sc::Tensor& got, const sc::Tensor& x, const sc::Tensor& y, std::int64_t rows, std::int64_t cols,
                   Red r) {
  const auto xv = x.to_vector<double>(), yv = y.to_vector<double>();
  const bool f32 = x.dtype() == sc::f32;
  std::vector<double> v(xv.size()), mag(xv.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    // the elementwise value as the dtype rounds it (mul, then add)
    v[i] = f32 ? static_cast<double>(static_cast<float>(static_cast<float>(xv[i] * yv[i]) + 0.5f)) : xv[i] * yv[i] + 0.5;
    mag[i] = std::abs(v[i]);
  }
  const auto want = columns(v, rows, cols, r), scale = columns(mag, rows, cols, Red::sum);
  const auto g = got.to_vector<double>();
  REQUIRE(static_cast<std::int64_t>(g.size()) == cols);
  const double eps = f32 ? 1.2e-7 : 2.3e-16;
  std::int64_t bad = 0;
  for (std::int64_t c = 0; c < cols; ++c) {
    const auto k = static_cast<std::size_t>(c);
    const double tol = r == Red::sum ? 4 * eps * std::log2(static_cast<double>(rows) + 2) * static_cast<double>(scale[k]) : 0;
    if (!(std::abs(g[k] - static_cast<double>(want[k])) <= tol) && bad++ < 3)
      UNSCOPED_INFO("column " << c << ": " << g[k] << " vs " << static_cast<double>(want[k]));
  }
  CHECK(bad == 0);
}

}  // namespace

TEMPLATE_TEST_CASE("fusion: a column sum, max or min of a group's value is reduced by the group, as plain loops give",
                   "[function][fusion][columns]", float, double) {
  using T = TestType;
  const sc::DType d = sc::dtype_of<T>();
  const std::string t = std::string(sc::name(d));
  // one row; fewer rows than a pairwise block; a block and one; several chunks; more columns than a
  // task's group (2048); columns fewer than a batch; rows that cross tiles
  for (const auto& [rows, cols] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {1, 37}, {7, 5}, {64, 64}, {65, 17}, {300, 3}, {1000, 129}, {130, 4100}, {5000, 1}, {4096, 40}}) {
    INFO(rows << " x " << cols << " " << t);
    const sc::Tensor x = sc::random::normal({rows, cols}, 3).astype(d), y = sc::random::uniform({rows, cols}, -2.0, 2.0, 4, d);
    for (const Red r : {Red::sum, Red::max, Red::min}) {
      INFO("reduction " << static_cast<int>(r));
      const auto f = [r](const sc::Tensor& a, const sc::Tensor& b) {
        const sc::Tensor v = a * b + 0.5;
        return r == Red::sum ? sc::sum(v, {0}) : r == Red::max ? sc::max(v, {0}) : sc::min(v, {0});
      };
      const auto [on_plan, on] = traced(true, f, x, y);
      const auto [off_plan, off] = traced(false, f, x, y);
      INFO(on_plan);
      const char* op = r == Red::sum ? "sum" : r == Red::max ? "max" : "min";
      if (rows > 1 && cols > 1 && rows * cols >= sc::graph::fusion_min_elements()) {
        CHECK_THAT(on_plan, Catch::Contains(std::string("fused mul, add, ") + op + " -> " + t + "[" + std::to_string(cols) + "]"));
        CHECK_THAT(off_plan, Catch::Contains(std::string("kernel ") + op));
      }
      check_columns(on[0], x, y, rows, cols, r);
      // each column adds in the reduction kernel's order: its bits
      CHECK(same_bits<T>(on[0], off[0]));
      CHECK(same_bits<T>(on[0], f(x, y)));
    }
  }
}

TEMPLATE_TEST_CASE("fusion: column reductions over the leading axes of rank 3, kept dims, and the group's other outputs",
                   "[function][fusion][columns]", float, double) {
  using T = TestType;
  const sc::DType d = sc::dtype_of<T>();
  const sc::Tensor x = sc::random::normal({6, 50, 70}, 5).astype(d), y = sc::random::uniform({6, 50, 70}, -1.0, 1.0, 6, d);
  const auto f = [](const sc::Tensor& a, const sc::Tensor& b) {
    const sc::Tensor v = a * b + 0.5;
    return std::make_tuple(sc::sum(v, {0}), v);  // the group writes v and its column sums
  };
  const auto g = [](const sc::Tensor& a, const sc::Tensor& b) { return sc::sum(a * b + 0.5, {1, 0}, true); };
  const auto [plan_f, on_f] = traced(true, f, x, y);
  const auto [plan_g, on_g] = traced(true, g, x, y);
  INFO(plan_f);
  INFO(plan_g);
  const std::string t = std::string(sc::name(d));
  CHECK_THAT(plan_f, Catch::Contains("fused mul, add, sum -> " + t + "[6, 50, 70], " + t + "[50, 70]"));
  CHECK_THAT(plan_g, Catch::Contains("fused mul, add, sum -> " + t + "[1, 1, 70]"));
  const sc::Tensor v = x * y + 0.5;
  check_same(on_f[1], v);  // every element written once, as eager
  CHECK(same_bits<T>(on_f[0], sc::sum(v, {0})));
  check_columns(sc::reshape(on_g[0], {70}), sc::reshape(x, {300, 70}), sc::reshape(y, {300, 70}), 300, 70, Red::sum);
  CHECK(same_bits<T>(on_g[0], sc::sum(v, {0, 1}, true)));
}

TEST_CASE("fusion: a column sum of sin keeps the eager op's bits where rows do not start on a batch",
          "[function][fusion][columns]") {
  // sin's SIMD bits depend on the batch: 10 columns, so the program runs flat (as eager) and the
  // column sum is the reduction kernel's: the eager result bit for bit
  const sc::Tensor x = sc::random::normal({500, 10}, 7) * 4.f;
  const auto f = [](const sc::Tensor& a) { return sc::sum(sc::sin(a) * a, {0}); };
  const auto [plan, on] = traced(true, f, x);
  INFO(plan);
  CHECK_THAT(plan, Catch::Contains("fused sin, mul, sum -> f32[10]"));
  CHECK(same_bits<float>(on[0], sc::sum(sc::sin(x) * x, {0})));
  // 32 columns: rows start on batches, the program runs over them
  const sc::Tensor x32 = sc::random::normal({500, 32}, 8) * 4.f;
  const auto [plan32, on32] = traced(true, f, x32);
  CHECK(same_bits<float>(on32[0], sc::sum(sc::sin(x32) * x32, {0})));
}

TEST_CASE("fusion: reductions over axes that are not leading, and on a GPU, stay as before", "[function][fusion][columns]") {
  const sc::Tensor x = sc::random::normal({20, 30, 40}, 9), y = sc::random::normal({20, 30, 40}, 10);
  // axis 1 alone (neither leading nor trailing): a kernel
  const auto mid = [](const sc::Tensor& a, const sc::Tensor& b) { return sc::sum(a * b, {1}); };
  const auto [plan, on] = traced(true, mid, x, y);
  INFO(plan);
  CHECK_THAT(plan, Catch::Contains("kernel sum"));
  check_same(on[0], sc::sum(x * y, {1}), 2e-5);
  // a GPU plan keeps the column sum a kernel of its own (its generated kernels reduce rows only)
  auto f = sc::function([](const sc::Tensor& a, const sc::Tensor& b) { return sc::sum(a * b + 1.f, {0}); });
  (void)f(x, y);
  const sc::graph::PlanStats cpu = f.get_concrete(x, y).stats().plan;
  CHECK(cpu.fused_reductions == 1);
  CHECK(sctest::function::gpu_plan_stats(f.get_concrete(x, y)).fused_reductions == 0);
}

TEST_CASE("fusion: a traced layer_norm training step with column reductions agrees with the eager step",
          "[function][fusion][columns]") {
  const std::int64_t rows = 256, cols = 96;
  const sc::Tensor x = sc::random::normal({rows, cols}, 11) * 2.f + 1.f, r = sc::random::uniform({rows, cols}, -1.0, 1.0, 12);
  const sc::Tensor gamma = sc::random::uniform({cols}, 0.5, 1.5, 13), beta = sc::random::uniform({cols}, -1.0, 1.0, 14);
  const auto step = sctest::function::layer_norm_step(cols);
  const auto [plan, on] = traced(true, step, x, r, gamma, beta);
  const auto [plan_off, off] = traced(false, step, x, r, gamma, beta);
  INFO(plan);
  // gamma's gradient, sum(r * xhat, {0}): one fused pass instead of a product written and summed
  // (xhat computed again from x: it is never written)
  CHECK_THAT(plan, Catch::Contains("mul, sum -> f32[96]"));
  CHECK_THAT(plan_off, !Catch::Contains("mul, sum -> f32[96]"));
  const auto eager = step(x, r, gamma, beta);
  check_same(on[0], std::get<0>(eager), 1e-4);
  check_same(on[1], std::get<1>(eager), 1e-4);
  check_same(on[2], std::get<2>(eager), 1e-4);
  check_same(on[3], std::get<3>(eager), 1e-4);
  CHECK(same_bits<float>(on[2], off[2]));  // gamma's gradient
}
