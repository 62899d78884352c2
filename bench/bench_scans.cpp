// The scans side by side in one run (f32, 512 lines of 1024): cumsum, cumprod, logcumsumexp,
// cummax, cumargmax and linear_scan along contiguous rows (a line per thread range) and along axis 0
// of the transpose ([1024, 512]: strided lines stepped together, a vector loop), and the gradients
// of cumprod, logcumsumexp and cummax. Each as
//   <op>/<layout>/stagecraft  the eager call (gradient rows: a tape, the forward and the gradient)
//   <op>/<layout>/hand_loop   the limit: plain loops, OpenMP over lines (forward rows only)
//   <op>/<layout>/libtorch    LibTorch's call (no linear_scan there; cummax also gives indices;
//                             gradient rows: autograd)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "bench_common.hpp"

#if STAGECRAFT_BENCH_TORCH
#include <torch/torch.h>
#endif

namespace {

constexpr std::int64_t lines = 512, len = 1024;
const sc::Shape rows_shape{lines, len}, cols_shape{len, lines};

/// Inputs near 1 (cumprod stays finite along 1024) and decays in (0, 1) for linear_scan.
sc::Tensor near_one(const sc::Shape& s) { return bench::input(s, 3) * 0.01f + 1.f; }
sc::Tensor decay(const sc::Shape& s) { return bench::input(s, 4) * 0.2f + 0.5f; }

enum class Op { cumsum, cumprod, logcumsumexp, cummax, cumargmax, linear_scan };

sc::Tensor run_sc(Op op, const sc::Tensor& x, const sc::Tensor& a, int axis) {
  switch (op) {
    case Op::cumsum: return sc::cumsum(x, axis);
    case Op::cumprod: return sc::cumprod(x, axis);
    case Op::logcumsumexp: return sc::logcumsumexp(x, axis);
    case Op::cummax: return sc::cummax(x, axis);
    case Op::cumargmax: return sc::cumargmax(x, axis);
    case Op::linear_scan: return sc::linear_scan(a, x, axis);
  }
  return {};
}

void scan_sc(benchmark::State& state, Op op, bool rows) {
  const sc::Shape& s = rows ? rows_shape : cols_shape;
  const sc::Tensor x = near_one(s), a = decay(s);
  for (auto _ : state) benchmark::DoNotOptimize(run_sc(op, x, a, rows ? 1 : 0).raw_data());
}

/// One step of each op by hand (acc, x, a) -> acc.
float step(Op op, float acc, float x, float a) {
  switch (op) {
    case Op::cumsum: return acc + x;
    case Op::cumprod: return acc * x;
    case Op::logcumsumexp: {
      const float big = std::max(acc, x), small = std::min(acc, x);
      return big + std::log1p(std::exp(small - big));
    }
    case Op::cummax: return std::max(acc, x);
    case Op::cumargmax: break;  // cumargmax_hand
    case Op::linear_scan: return a * acc + x;
  }
  return acc;
}

template <Op O>
void scan_hand(benchmark::State& state, bool rows) {
  const sc::Shape& s = rows ? rows_shape : cols_shape;
  const std::vector<float> x = near_one(s).to_vector<float>(), a = decay(s).to_vector<float>();
  std::vector<float> y(x.size());
  for (auto _ : state) {
    if (rows) {
#pragma omp parallel for
      for (std::int64_t r = 0; r < lines; ++r) {
        const std::size_t base = static_cast<std::size_t>(r * len);
        float acc = x[base];
        y[base] = acc;
        for (std::size_t j = 1; j < static_cast<std::size_t>(len); ++j) y[base + j] = acc = step(O, acc, x[base + j], a[base + j]);
      }
    } else {  // lines down axis 0: a row of states at a time, blocks of 64 columns per thread
#pragma omp parallel for
      for (std::int64_t c0 = 0; c0 < lines; c0 += 64) {
        const std::size_t c1 = static_cast<std::size_t>(std::min<std::int64_t>(lines, c0 + 64));
        for (std::size_t c = static_cast<std::size_t>(c0); c < c1; ++c) y[c] = x[c];
        for (std::size_t k = 1; k < static_cast<std::size_t>(len); ++k) {
          const std::size_t row = k * static_cast<std::size_t>(lines), prev = row - static_cast<std::size_t>(lines);
          for (std::size_t c = static_cast<std::size_t>(c0); c < c1; ++c) y[row + c] = step(O, y[prev + c], x[row + c], a[row + c]);
        }
      }
    }
    benchmark::DoNotOptimize(y.data());
  }
}

/// cumargmax by hand: the running maximum and its index (the first where it was reached).
void cumargmax_hand(benchmark::State& state, bool rows) {
  const sc::Shape& s = rows ? rows_shape : cols_shape;
  const std::vector<float> x = near_one(s).to_vector<float>();
  std::vector<std::int64_t> y(x.size());
  for (auto _ : state) {
    if (rows) {
#pragma omp parallel for
      for (std::int64_t r = 0; r < lines; ++r) {
        const std::size_t base = static_cast<std::size_t>(r * len);
        float best = x[base];
        std::int64_t at = 0;
        y[base] = 0;
        for (std::int64_t j = 1; j < len; ++j) {
          const float v = x[base + static_cast<std::size_t>(j)];
          if (v > best) best = v, at = j;
          y[base + static_cast<std::size_t>(j)] = at;
        }
      }
    } else {  // blocks of 64 columns, their best values and indices in two arrays
#pragma omp parallel for
      for (std::int64_t c0 = 0; c0 < lines; c0 += 64) {
        float best[64];
        std::int64_t at[64];
        const std::int64_t w = std::min<std::int64_t>(64, lines - c0);
        for (std::int64_t c = 0; c < w; ++c) best[c] = x[static_cast<std::size_t>(c0 + c)], at[c] = 0;
        for (std::int64_t c = 0; c < w; ++c) y[static_cast<std::size_t>(c0 + c)] = 0;
        for (std::int64_t k = 1; k < len; ++k) {
          const std::size_t row = static_cast<std::size_t>(k * lines + c0);
          for (std::int64_t c = 0; c < w; ++c) {
            const float v = x[row + static_cast<std::size_t>(c)];
            const bool up = v > best[c];
            best[c] = up ? v : best[c];
            at[c] = up ? k : at[c];
            y[row + static_cast<std::size_t>(c)] = at[c];
          }
        }
      }
    }
    benchmark::DoNotOptimize(y.data());
  }
}

void grad_sc(benchmark::State& state, Op op) {
  const sc::Tensor x = near_one(rows_shape);
  for (auto _ : state) {
    sc::GradientTape tape;
    tape.watch(x);
    const sc::Tensor y = run_sc(op, x, x, 1);
    benchmark::DoNotOptimize(tape.gradient(sc::sum(y), x).raw_data());
  }
}

#if STAGECRAFT_BENCH_TORCH
at::Tensor run_torch(Op op, const at::Tensor& x, int axis) {
  switch (op) {
    case Op::cumsum: return torch::cumsum(x, axis);
    case Op::cumprod: return torch::cumprod(x, axis);
    case Op::logcumsumexp: return torch::logcumsumexp(x, axis);
    case Op::cummax: return std::get<0>(torch::cummax(x, axis));
    case Op::cumargmax: return std::get<1>(torch::cummax(x, axis));
    case Op::linear_scan: break;
  }
  return {};
}
void scan_torch(benchmark::State& state, Op op, bool rows) {
  const at::Tensor x = bench::as_torch(near_one(rows ? rows_shape : cols_shape));
  for (auto _ : state) benchmark::DoNotOptimize(run_torch(op, x, rows ? 1 : 0).data_ptr());
}
void grad_torch(benchmark::State& state, Op op) {
  const at::Tensor x0 = bench::as_torch(near_one(rows_shape));
  for (auto _ : state) {
    const at::Tensor x = x0.detach().requires_grad_(true);
    run_torch(op, x, 1).sum().backward();
    benchmark::DoNotOptimize(x.grad().data_ptr());
  }
}
#endif

#define SC_SCAN_ROWS(name, op)                                                                             \
  void name##_hand(benchmark::State& state, bool rows) { scan_hand<op>(state, rows); }                     \
  BENCHMARK_CAPTURE(scan_sc, name##_rows, op, true)->Name(#name "/rows/stagecraft")->UseRealTime();        \
  BENCHMARK_CAPTURE(name##_hand, rows, true)->Name(#name "/rows/hand_loop")->UseRealTime();                \
  BENCHMARK_CAPTURE(scan_sc, name##_cols, op, false)->Name(#name "/cols/stagecraft")->UseRealTime();       \
  BENCHMARK_CAPTURE(name##_hand, cols, false)->Name(#name "/cols/hand_loop")->UseRealTime();
SC_SCAN_ROWS(cumsum, Op::cumsum)
SC_SCAN_ROWS(cumprod, Op::cumprod)
SC_SCAN_ROWS(logcumsumexp, Op::logcumsumexp)
SC_SCAN_ROWS(cummax, Op::cummax)
BENCHMARK_CAPTURE(scan_sc, cumargmax_rows, Op::cumargmax, true)->Name("cumargmax/rows/stagecraft")->UseRealTime();
BENCHMARK_CAPTURE(cumargmax_hand, rows, true)->Name("cumargmax/rows/hand_loop")->UseRealTime();
BENCHMARK_CAPTURE(scan_sc, cumargmax_cols, Op::cumargmax, false)->Name("cumargmax/cols/stagecraft")->UseRealTime();
BENCHMARK_CAPTURE(cumargmax_hand, cols, false)->Name("cumargmax/cols/hand_loop")->UseRealTime();
SC_SCAN_ROWS(linear_scan, Op::linear_scan)
BENCHMARK_CAPTURE(grad_sc, cumprod, Op::cumprod)->Name("cumprod/grad/stagecraft")->UseRealTime();
BENCHMARK_CAPTURE(grad_sc, logcumsumexp, Op::logcumsumexp)->Name("logcumsumexp/grad/stagecraft")->UseRealTime();
BENCHMARK_CAPTURE(grad_sc, cummax, Op::cummax)->Name("cummax/grad/stagecraft")->UseRealTime();
#if STAGECRAFT_BENCH_TORCH
#define SC_SCAN_TORCH(name, op)                                                                        \
  BENCHMARK_CAPTURE(scan_torch, name##_rows_t, op, true)->Name(#name "/rows/libtorch")->UseRealTime(); \
  BENCHMARK_CAPTURE(scan_torch, name##_cols_t, op, false)->Name(#name "/cols/libtorch")->UseRealTime();
SC_SCAN_TORCH(cumsum, Op::cumsum)
SC_SCAN_TORCH(cumprod, Op::cumprod)
SC_SCAN_TORCH(logcumsumexp, Op::logcumsumexp)
SC_SCAN_TORCH(cummax, Op::cummax)
SC_SCAN_TORCH(cumargmax, Op::cumargmax)
BENCHMARK_CAPTURE(grad_torch, cumprod, Op::cumprod)->Name("cumprod/grad/libtorch")->UseRealTime();
BENCHMARK_CAPTURE(grad_torch, logcumsumexp, Op::logcumsumexp)->Name("logcumsumexp/grad/libtorch")->UseRealTime();
BENCHMARK_CAPTURE(grad_torch, cummax, Op::cummax)->Name("cummax/grad/libtorch")->UseRealTime();
#endif

}  // namespace

STAGECRAFT_BENCH_MAIN()
