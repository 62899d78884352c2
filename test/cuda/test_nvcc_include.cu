// A user's .cu file: nvcc compiles stagecraft.hpp (the rules are host functions here; the CPU's
// SIMD loops instantiate them with xsimd batches, which nvcc must not compile for the GPU), and
// the eager, traced and compile-time staged paths give the CPU's numbers. Runs without a GPU.
#include <stagecraft/stagecraft.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

namespace {

int failures = 0;

void check_close(const char* what, const sc::Tensor& got, const std::vector<float>& want) {
  const std::vector<float> g = got.to_vector<float>();
  bool ok = g.size() == want.size();
  for (std::size_t i = 0; ok && i < g.size(); ++i) ok = std::fabs(g[i] - want[i]) <= 1e-5f * (1.f + std::fabs(want[i]));
  if (!ok) {
    ++failures;
    std::printf("FAILED: %s\n", what);
  }
}

}  // namespace

int main() {
  std::vector<float> xs(1000), ys(1000), want(1000);
  for (int i = 0; i < 1000; ++i) {
    xs[i] = static_cast<float>(i % 17) * 0.25f - 2.f;
    ys[i] = static_cast<float>(i % 5) * 0.5f - 1.f;
    const float h = std::max(xs[i] * 2.f + ys[i], 0.f);  // relu(x * 2 + y)
    want[i] = std::tanh(h) * ys[i] - std::exp(-std::fabs(xs[i]));
  }
  const sc::Tensor x = sc::tensor(xs, sc::Shape{1000}), y = sc::tensor(ys, sc::Shape{1000});
  auto body = [](const auto& a, const auto& b) { return sc::tanh(sc::relu(a * 2.f + b)) * b - sc::exp(-sc::abs(a)); };
  check_close("eager", body(x, y), want);
  auto traced = sc::function([&](sc::Tensor a, sc::Tensor b) { return body(a, b); });
  check_close("sc::function", traced(x, y), want);
  auto compiled = sc::compile(body);
  check_close("sc::compile", compiled(x, y), want);
  // A tape through the same ops: d/dx sum(x * x) = 2x.
  sc::GradientTape tape;
  tape.watch(x);
  const sc::Tensor g = tape.gradient(sc::sum(x * x), x);
  std::vector<float> twice(xs);
  for (float& v : twice) v *= 2.f;
  check_close("gradient", g, twice);
  if (failures == 0) std::printf("nvcc include: eager, sc::function, sc::compile and a tape agree with the loops\n");
  return failures == 0 ? 0 : 1;
}
