// The 9-op chain as one hand-written loop, the limit for bench_fusion. Its own file so that only
// it is built with -ffast-math (bench/CMakeLists.txt): GCC then vectorises std::tanh/std::exp
// through glibc's vector math (libmvec). No stagecraft header here: inline library code built
// with other flags would break the one-definition rule.
#include <cmath>
#include <cstdint>

namespace bench_fusion {

/// y = tanh(x*a + b)*c - x/(1 + exp(-x)) with a, b, c per element.
void hand_chain9(const float* __restrict x, const float* __restrict a, const float* __restrict b,
                 const float* __restrict c, float* __restrict y, std::int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i] * a[i] + b[i]) * c[i] - x[i] / (1.f + std::exp(-x[i]));
}

/// The same with a, b, c one value each.
void hand_chain9_scalars(const float* __restrict x, float a, float b, float c, float* __restrict y, std::int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i] * a + b) * c - x[i] / (1.f + std::exp(-x[i]));
}

}  // namespace bench_fusion
