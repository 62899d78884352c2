// The timed loop of the GPU model rows, shared by bench_cuda (stagecraft) and bench_cuda_torch
// (LibTorch, built without stagecraft's headers): Google Benchmark only.
#pragma once
#include <benchmark/benchmark.h>

namespace bench {

/// Three untimed steps, then `step` timed, each iteration waiting for the GPU with `sync`.
template <class Step, class Sync>
void timed(benchmark::State& state, Step&& step, Sync&& sync) {
  for (int i = 0; i < 3; ++i) benchmark::DoNotOptimize(step());
  sync();
  for (auto _ : state) {
    benchmark::DoNotOptimize(step());
    sync();
  }
}

}  // namespace bench
