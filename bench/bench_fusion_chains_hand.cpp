// The limits for bench_fusion_chains: each chain as one hand-written loop over floats, and a
// STREAM-like copy. Its own file, with no stagecraft header, so that its flags stay its own
// (bench/CMakeLists.txt: no -ffast-math, the ops are cheap; -ffinite-math-only -fno-signed-zeros so
// that std::max becomes vmaxps; no loop-to-memcpy rewriting, so the copy is a plain loop of loads
// and stores like STREAM's and like the chains' loops).
#include <algorithm>
#include <cstdint>

namespace bench_fusion_chains {

// The chain of bench_fusion_chains.cpp written out: y = x*w, then the ops cycle through
// + 0.5, * 0.999, max(., -1), - 0.25. std::max(y, -1.f) keeps a NaN y, as sc::maximum does.

/// out = chain<2>(x, w), on nt threads.
void hand_chain2(const float* __restrict x, const float* __restrict w, float* __restrict out, std::int64_t n, int nt) {
#pragma omp parallel for simd schedule(static) num_threads(nt)
  for (std::int64_t i = 0; i < n; ++i) {
    float y = x[i] * w[i];
    y = y + 0.5f;
    out[i] = y;
  }
}

/// out = chain<4>(x, w), on nt threads.
void hand_chain4(const float* __restrict x, const float* __restrict w, float* __restrict out, std::int64_t n, int nt) {
#pragma omp parallel for simd schedule(static) num_threads(nt)
  for (std::int64_t i = 0; i < n; ++i) {
    float y = x[i] * w[i];
    y = y + 0.5f;
    y = y * 0.999f;
    y = std::max(y, -1.f);
    out[i] = y;
  }
}

/// out = chain<8>(x, w), on nt threads.
void hand_chain8(const float* __restrict x, const float* __restrict w, float* __restrict out, std::int64_t n, int nt) {
#pragma omp parallel for simd schedule(static) num_threads(nt)
  for (std::int64_t i = 0; i < n; ++i) {
    float y = x[i] * w[i];
    y = y + 0.5f;
    y = y * 0.999f;
    y = std::max(y, -1.f);
    y = y - 0.25f;
    y = y + 0.5f;
    y = y * 0.999f;
    y = std::max(y, -1.f);
    out[i] = y;
  }
}

/// out = chain<16>(x, w), on nt threads.
void hand_chain16(const float* __restrict x, const float* __restrict w, float* __restrict out, std::int64_t n, int nt) {
#pragma omp parallel for simd schedule(static) num_threads(nt)
  for (std::int64_t i = 0; i < n; ++i) {
    float y = x[i] * w[i];
    y = y + 0.5f;
    y = y * 0.999f;
    y = std::max(y, -1.f);
    y = y - 0.25f;
    y = y + 0.5f;
    y = y * 0.999f;
    y = std::max(y, -1.f);
    y = y - 0.25f;
    y = y + 0.5f;
    y = y * 0.999f;
    y = std::max(y, -1.f);
    y = y - 0.25f;
    y = y + 0.5f;
    y = y * 0.999f;
    y = std::max(y, -1.f);
    out[i] = y;
  }
}

/// out = x, on nt threads: the STREAM copy kernel.
void copy(const float* __restrict x, float* __restrict out, std::int64_t n, int nt) {
#pragma omp parallel for simd schedule(static) num_threads(nt)
  for (std::int64_t i = 0; i < n; ++i) out[i] = x[i];
}

}  // namespace bench_fusion_chains
