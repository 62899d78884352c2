// Sequence and selection ops side by side in one run: topk, sort, cumsum and scaled dot-product
// attention (f32), each as
//   <op>/stagecraft         the eager call
//   <op>/stagecraft_staged  the same call traced once by sc::function
//   <op>/hand_loop          the limit: plain loops (OpenMP over rows), for attention OpenBLAS's
//                           sgemm per head and a softmax loop
//   <op>/libtorch           LibTorch's call (attention: matmul, softmax, matmul, as 1.13 has no
//                           fused attention in C++)
// Shapes: topk 256 rows of 1000 scores, k = 5 (a classifier's top-5); sort 64 rows of 4096;
// cumsum 512 rows of 1024 along the rows; attention q, k, v [8, 8, 128, 64] (batch, heads, T, D).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include <cblas.h>

#include "bench_common.hpp"

#include <stagecraft/nn/attention.hpp>

#if STAGECRAFT_BENCH_TORCH
#include <torch/torch.h>
#endif

namespace {

const sc::Shape topk_shape{256, 1000}, sort_shape{64, 4096}, cumsum_shape{512, 1024}, qkv_shape{8, 8, 128, 64};
constexpr std::int64_t top = 5;

// ---- topk ----------------------------------------------------------------------------------------

void topk_sc(benchmark::State& state) {
  const sc::Tensor x = bench::input(topk_shape, 1);
  for (auto _ : state) benchmark::DoNotOptimize(sc::topk(x, top).values.raw_data());
}
void topk_sc_staged(benchmark::State& state) {
  const sc::Tensor x = bench::input(topk_shape, 1);
  auto f = sc::function([](const sc::Tensor& a) {
    const sc::TopK t = sc::topk(a, top);
    return std::vector<sc::Tensor>{t.values, t.indices};
  });
  for (auto _ : state) benchmark::DoNotOptimize(f(x)[0].raw_data());
}
/// Per row: the indices selected (nth_element) and the k first sorted, values and indices written.
void topk_hand(benchmark::State& state) {
  const std::vector<float> x = bench::input(topk_shape, 1).to_vector<float>();
  const std::int64_t rows = topk_shape[0], n = topk_shape[1];
  std::vector<float> values(static_cast<std::size_t>(rows * top));
  std::vector<std::int64_t> indices(static_cast<std::size_t>(rows * top));
  for (auto _ : state) {
#pragma omp parallel
    {
      std::vector<std::int64_t> order(static_cast<std::size_t>(n));
#pragma omp for
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* xr = x.data() + r * n;
        std::iota(order.begin(), order.end(), std::int64_t{0});
        const auto before = [xr](std::int64_t a, std::int64_t b) { return xr[a] > xr[b] || (xr[a] == xr[b] && a < b); };
        std::nth_element(order.begin(), order.begin() + top, order.end(), before);
        std::sort(order.begin(), order.begin() + top, before);
        for (std::int64_t j = 0; j < top; ++j) {
          indices[static_cast<std::size_t>(r * top + j)] = order[static_cast<std::size_t>(j)];
          values[static_cast<std::size_t>(r * top + j)] = xr[order[static_cast<std::size_t>(j)]];
        }
      }
    }
    benchmark::DoNotOptimize(values.data());
    benchmark::DoNotOptimize(indices.data());
  }
}

// ---- sort ----------------------------------------------------------------------------------------

void sort_sc(benchmark::State& state) {
  const sc::Tensor x = bench::input(sort_shape, 2);
  for (auto _ : state) benchmark::DoNotOptimize(sc::sort(x).raw_data());
}
void sort_sc_staged(benchmark::State& state) {
  const sc::Tensor x = bench::input(sort_shape, 2);
  auto f = sc::function([](const sc::Tensor& a) { return sc::sort(a); });
  for (auto _ : state) benchmark::DoNotOptimize(f(x).raw_data());
}
/// Per row: a copy sorted by std::sort (values only: the least a sort can do).
void sort_hand(benchmark::State& state) {
  const std::vector<float> x = bench::input(sort_shape, 2).to_vector<float>();
  const std::int64_t rows = sort_shape[0], n = sort_shape[1];
  std::vector<float> y(x.size());
  for (auto _ : state) {
#pragma omp parallel for
    for (std::int64_t r = 0; r < rows; ++r) {
      std::copy(x.begin() + r * n, x.begin() + (r + 1) * n, y.begin() + r * n);
      std::sort(y.begin() + r * n, y.begin() + (r + 1) * n);
    }
    benchmark::DoNotOptimize(y.data());
  }
}

// ---- cumsum --------------------------------------------------------------------------------------

void cumsum_sc(benchmark::State& state) {
  const sc::Tensor x = bench::input(cumsum_shape, 3);
  for (auto _ : state) benchmark::DoNotOptimize(sc::cumsum(x, 1).raw_data());
}
void cumsum_sc_staged(benchmark::State& state) {
  const sc::Tensor x = bench::input(cumsum_shape, 3);
  auto f = sc::function([](const sc::Tensor& a) { return sc::cumsum(a, 1); });
  for (auto _ : state) benchmark::DoNotOptimize(f(x).raw_data());
}
void cumsum_hand(benchmark::State& state) {
  const std::vector<float> x = bench::input(cumsum_shape, 3).to_vector<float>();
  const std::int64_t rows = cumsum_shape[0], n = cumsum_shape[1];
  std::vector<float> y(x.size());
  for (auto _ : state) {
#pragma omp parallel for
    for (std::int64_t r = 0; r < rows; ++r) {
      float acc = 0;
      for (std::int64_t j = 0; j < n; ++j) y[static_cast<std::size_t>(r * n + j)] = acc += x[static_cast<std::size_t>(r * n + j)];
    }
    benchmark::DoNotOptimize(y.data());
  }
}

// ---- attention -----------------------------------------------------------------------------------

struct Qkv {
  sc::Tensor q = bench::input(qkv_shape, 4), k = bench::input(qkv_shape, 5), v = bench::input(qkv_shape, 6);
};

void attention_sc(benchmark::State& state) {
  const Qkv in;
  for (auto _ : state) benchmark::DoNotOptimize(sc::nn::scaled_dot_product_attention(in.q, in.k, in.v).raw_data());
}
void attention_sc_staged(benchmark::State& state) {
  const Qkv in;
  auto f = sc::function([](const sc::Tensor& q, const sc::Tensor& k, const sc::Tensor& v) {
    return sc::nn::scaled_dot_product_attention(q, k, v);
  });
  for (auto _ : state) benchmark::DoNotOptimize(f(in.q, in.k, in.v).raw_data());
}
/// Per (batch, head): S = Q K^T / sqrt(D) (sgemm), a row softmax in place, O = S V (sgemm); heads
/// over threads, OpenBLAS single-threaded inside each.
void attention_hand(benchmark::State& state) {
  const Qkv in;
  const std::vector<float> q = in.q.to_vector<float>(), k = in.k.to_vector<float>(), v = in.v.to_vector<float>();
  const int heads = static_cast<int>(qkv_shape[0] * qkv_shape[1]), t = static_cast<int>(qkv_shape[2]),
            d = static_cast<int>(qkv_shape[3]);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<float> out(q.size());
  for (auto _ : state) {
#pragma omp parallel
    {
      std::vector<float> s(static_cast<std::size_t>(t * t));
#pragma omp for
      for (int h = 0; h < heads; ++h) {
        const std::size_t at = static_cast<std::size_t>(h) * static_cast<std::size_t>(t * d);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, d, scale, q.data() + at, d, k.data() + at, d, 0.0f,
                    s.data(), t);
        for (int i = 0; i < t; ++i) {
          float* row = s.data() + static_cast<std::size_t>(i * t);
          const float m = *std::max_element(row, row + t);
          float sum = 0;
          for (int j = 0; j < t; ++j) sum += row[j] = std::exp(row[j] - m);
          for (int j = 0; j < t; ++j) row[j] /= sum;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, d, t, 1.0f, s.data(), t, v.data() + at, d, 0.0f,
                    out.data() + at, d);
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
}

#if STAGECRAFT_BENCH_TORCH
void topk_torch(benchmark::State& state) {
  const sc::Tensor x = bench::input(topk_shape, 1);
  const at::Tensor tx = bench::as_torch(x);
  for (auto _ : state) benchmark::DoNotOptimize(std::get<0>(torch::topk(tx, top, 1)).data_ptr());
}
void sort_torch(benchmark::State& state) {
  const sc::Tensor x = bench::input(sort_shape, 2);
  const at::Tensor tx = bench::as_torch(x);
  for (auto _ : state) benchmark::DoNotOptimize(std::get<0>(torch::sort(tx, 1)).data_ptr());
}
void cumsum_torch(benchmark::State& state) {
  const sc::Tensor x = bench::input(cumsum_shape, 3);
  const at::Tensor tx = bench::as_torch(x);
  for (auto _ : state) benchmark::DoNotOptimize(torch::cumsum(tx, 1).data_ptr());
}
void attention_torch(benchmark::State& state) {
  const Qkv in;
  const at::Tensor q = bench::as_torch(in.q), k = bench::as_torch(in.k), v = bench::as_torch(in.v);
  const double scale = 1.0 / std::sqrt(static_cast<double>(qkv_shape[3]));
  for (auto _ : state)
    benchmark::DoNotOptimize(torch::matmul(torch::softmax(torch::matmul(q, k.transpose(-2, -1)) * scale, -1), v).data_ptr());
}
#endif

BENCHMARK(topk_sc)->Name("topk/stagecraft")->UseRealTime();
BENCHMARK(topk_sc_staged)->Name("topk/stagecraft_staged")->UseRealTime();
BENCHMARK(topk_hand)->Name("topk/hand_loop")->UseRealTime();
BENCHMARK(sort_sc)->Name("sort/stagecraft")->UseRealTime();
BENCHMARK(sort_sc_staged)->Name("sort/stagecraft_staged")->UseRealTime();
BENCHMARK(sort_hand)->Name("sort/hand_loop")->UseRealTime();
BENCHMARK(cumsum_sc)->Name("cumsum/stagecraft")->UseRealTime();
BENCHMARK(cumsum_sc_staged)->Name("cumsum/stagecraft_staged")->UseRealTime();
BENCHMARK(cumsum_hand)->Name("cumsum/hand_loop")->UseRealTime();
BENCHMARK(attention_sc)->Name("attention/stagecraft")->UseRealTime();
BENCHMARK(attention_sc_staged)->Name("attention/stagecraft_staged")->UseRealTime();
BENCHMARK(attention_hand)->Name("attention/hand_loop")->UseRealTime();
#if STAGECRAFT_BENCH_TORCH
BENCHMARK(topk_torch)->Name("topk/libtorch")->UseRealTime();
BENCHMARK(sort_torch)->Name("sort/libtorch")->UseRealTime();
BENCHMARK(cumsum_torch)->Name("cumsum/libtorch")->UseRealTime();
BENCHMARK(attention_torch)->Name("attention/libtorch")->UseRealTime();
#endif

}  // namespace

STAGECRAFT_BENCH_MAIN()
