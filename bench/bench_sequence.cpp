// Sequence and selection ops side by side in one run: topk, sort, cumsum, scaled dot-product
// attention, take_along_axis and add_along_axis (f32), each as
//   <op>/stagecraft         the eager call
//   <op>/stagecraft_staged  the same call traced once by sc::function
//   <op>/hand_loop          the limit: plain loops (OpenMP over rows), for attention OpenBLAS's
//                           sgemm per head and a softmax loop
//   <op>/libtorch           LibTorch's call (attention: matmul, softmax, matmul, as 1.13 has no
//                           fused attention in C++)
// Shapes: topk 256 rows of 1000 scores, k = 5 (a classifier's top-5); sort 64 rows of 4096;
// cumsum 512 rows of 1024 along the rows; attention q, k, v [8, 8, 128, 64] (batch, heads, T, D);
// take_along_axis and add_along_axis [512, 1024] with random i64 indices of that shape, along the
// rows (axis 1, "rows") and down the columns (axis 0, "cols"), and add_along_axis along the rows
// with each row's indices sorted ("rows_sorted": a segment sum's ids, runs of about one); its x is
// zero and its result new each time (LibTorch: scatter_add, not in place); gather and scatter_add
// along the rows of [512, 1024] with one list of 1024 random i64 indices for every row ("elements":
// single elements moved; LibTorch's index_select and index_add).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include <cblas.h>

#include "bench_common.hpp"

#include <stagecraft/nn/attention.hpp>

// ---- take_along_axis, add_along_axis -------------------------------------------------------------

const sc::Shape along_shape{512, 1024};
/// Random indices in [0, extent of `axis`) of along_shape; sorted along the axis, a segment sum's
/// ids: runs of about one, some longer.
sc::Tensor along_indices(int axis, bool sorted = false) {
  const sc::Tensor idx =
      sc::floor(sc::random::uniform(along_shape, 0.0, static_cast<double>(along_shape[axis]), 7)).astype(sc::i64);
  return sorted ? sc::sort(idx, axis) : idx;
}
void take_sc(benchmark::State& state, int axis) {
  const sc::Tensor x = bench::input(along_shape, 8), idx = along_indices(axis);
  for (auto _ : state) benchmark::DoNotOptimize(sc::take_along_axis(x, idx, axis).raw_data());
}
void add_sc(benchmark::State& state, int axis, bool sorted = false) {
  const sc::Tensor x = sc::zeros(along_shape), u = bench::input(along_shape, 9), idx = along_indices(axis, sorted);
  for (auto _ : state) benchmark::DoNotOptimize(sc::add_along_axis(x, idx, u, axis).raw_data());
}
/// Rows over threads (axis 1), or row blocks of the result (axis 0): y = x picked per element.
void take_hand(benchmark::State& state, int axis) {
  const std::vector<float> x = bench::input(along_shape, 8).to_vector<float>();
  const std::vector<std::int64_t> idx = along_indices(axis).to_vector<std::int64_t>();
  const std::int64_t rows = along_shape[0], n = along_shape[1];
  std::vector<float> y(x.size());
  for (auto _ : state) {
#pragma omp parallel for
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < n; ++j) {
        const std::size_t e = static_cast<std::size_t>(r * n + j);
        y[e] = axis == 1 ? x[static_cast<std::size_t>(r * n + idx[e])] : x[static_cast<std::size_t>(idx[e] * n + j)];
      }
    benchmark::DoNotOptimize(y.data());
  }
}
/// y = x, then each update added at its index: rows over threads (axis 1), each row copied just
/// before its adds; for axis 0 column blocks over threads, each walking the rows (no two threads
/// write one element).
void add_hand(benchmark::State& state, int axis, bool sorted = false) {
  const std::vector<float> x(static_cast<std::size_t>(along_shape.numel()), 0.f);
  const std::vector<float> u = bench::input(along_shape, 9).to_vector<float>();
  const std::vector<std::int64_t> idx = along_indices(axis, sorted).to_vector<std::int64_t>();
  const std::int64_t rows = along_shape[0], n = along_shape[1];
  std::vector<float> y(x.size());
  for (auto _ : state) {
    if (axis == 1) {
#pragma omp parallel for
      for (std::int64_t r = 0; r < rows; ++r) {
        std::copy(x.begin() + r * n, x.begin() + (r + 1) * n, y.begin() + r * n);  // in cache for the adds
        for (std::int64_t j = 0; j < n; ++j) {
          const std::size_t e = static_cast<std::size_t>(r * n + j);
          y[static_cast<std::size_t>(r * n + idx[e])] += u[e];
        }
      }
    } else {
      std::copy(x.begin(), x.end(), y.begin());
#pragma omp parallel for
      for (std::int64_t c0 = 0; c0 < n; c0 += 64)
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t j = c0; j < std::min(n, c0 + 64); ++j) {
            const std::size_t e = static_cast<std::size_t>(r * n + j);
            y[static_cast<std::size_t>(idx[e] * n + j)] += u[e];
          }
    }
    benchmark::DoNotOptimize(y.data());
  }
}

// ---- gather and scatter_add of single elements: one index list for every row ------------------

/// along_shape[1] random i64 indices into a row of along_shape: every row picks the same (index_select).
sc::Tensor row_indices() {
  return sc::floor(sc::random::uniform({along_shape[1]}, 0.0, static_cast<double>(along_shape[1]), 11)).astype(sc::i64);
}
void gather_sc(benchmark::State& state) {
  const sc::Tensor x = bench::input(along_shape, 8), idx = row_indices();
  for (auto _ : state) benchmark::DoNotOptimize(sc::gather(x, idx, 1).raw_data());
}
void scatter_add_sc(benchmark::State& state) {
  const sc::Tensor x = sc::zeros(along_shape), u = bench::input(along_shape, 9), idx = row_indices();
  for (auto _ : state) benchmark::DoNotOptimize(sc::scatter_add(x, idx, u, 1).raw_data());
}
/// Rows over threads: y[r, j] = x[r, idx[j]].
void gather_hand(benchmark::State& state) {
  const std::vector<float> x = bench::input(along_shape, 8).to_vector<float>();
  const std::vector<std::int64_t> idx = row_indices().to_vector<std::int64_t>();
  const std::int64_t rows = along_shape[0], n = along_shape[1];
  std::vector<float> y(x.size());
  for (auto _ : state) {
#pragma omp parallel for
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xr = x.data() + r * n;
      float* yr = y.data() + r * n;
      for (std::int64_t j = 0; j < n; ++j) yr[j] = xr[idx[static_cast<std::size_t>(j)]];
    }
    benchmark::DoNotOptimize(y.data());
  }
}
/// Rows over threads, each copied from x just before its adds: y[r, idx[j]] += u[r, j].
void scatter_add_hand(benchmark::State& state) {
  const std::vector<float> x(static_cast<std::size_t>(along_shape.numel()), 0.f);
  const std::vector<float> u = bench::input(along_shape, 9).to_vector<float>();
  const std::vector<std::int64_t> idx = row_indices().to_vector<std::int64_t>();
  const std::int64_t rows = along_shape[0], n = along_shape[1];
  std::vector<float> y(x.size());
  for (auto _ : state) {
#pragma omp parallel for
    for (std::int64_t r = 0; r < rows; ++r) {
      float* yr = y.data() + r * n;
      std::copy(x.begin() + r * n, x.begin() + (r + 1) * n, yr);
      for (std::int64_t j = 0; j < n; ++j) yr[idx[static_cast<std::size_t>(j)]] += u[static_cast<std::size_t>(r * n + j)];
    }
    benchmark::DoNotOptimize(y.data());
  }
}

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
/// LibTorch's view of an i64 stagecraft tensor (as_torch's, for indices).
at::Tensor as_torch_i64(const sc::Tensor& t) {
  return at::from_blob(t.raw_data(), {t.shape()[0], t.shape()[1]}, at::TensorOptions().dtype(at::kLong));
}
void take_torch(benchmark::State& state, int axis) {
  const sc::Tensor x = bench::input(along_shape, 8), idx = along_indices(axis);
  const at::Tensor tx = bench::as_torch(x), ti = as_torch_i64(idx);
  for (auto _ : state) benchmark::DoNotOptimize(torch::gather(tx, axis, ti).data_ptr());
}
void add_torch(benchmark::State& state, int axis, bool sorted = false) {
  const sc::Tensor x = sc::zeros(along_shape), u = bench::input(along_shape, 9), idx = along_indices(axis, sorted);
  const at::Tensor tx = bench::as_torch(x), tu = bench::as_torch(u), ti = as_torch_i64(idx);
  for (auto _ : state) benchmark::DoNotOptimize(tx.scatter_add(axis, ti, tu).data_ptr());
}
void gather_torch(benchmark::State& state) {
  const sc::Tensor x = bench::input(along_shape, 8), idx = row_indices();
  const at::Tensor tx = bench::as_torch(x), ti = at::from_blob(idx.raw_data(), {idx.numel()}, at::TensorOptions().dtype(at::kLong));
  for (auto _ : state) benchmark::DoNotOptimize(torch::index_select(tx, 1, ti).data_ptr());
}
void scatter_add_torch(benchmark::State& state) {
  const sc::Tensor x = sc::zeros(along_shape), u = bench::input(along_shape, 9), idx = row_indices();
  const at::Tensor tx = bench::as_torch(x), tu = bench::as_torch(u),
                   ti = at::from_blob(idx.raw_data(), {idx.numel()}, at::TensorOptions().dtype(at::kLong));
  for (auto _ : state) benchmark::DoNotOptimize(tx.index_add(1, ti, tu).data_ptr());
}
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

BENCHMARK_CAPTURE(take_sc, rows, 1)->Name("take_along_axis/rows/stagecraft")->UseRealTime();
BENCHMARK_CAPTURE(take_hand, rows, 1)->Name("take_along_axis/rows/hand_loop")->UseRealTime();
BENCHMARK_CAPTURE(take_sc, cols, 0)->Name("take_along_axis/cols/stagecraft")->UseRealTime();
BENCHMARK_CAPTURE(take_hand, cols, 0)->Name("take_along_axis/cols/hand_loop")->UseRealTime();
BENCHMARK_CAPTURE(add_sc, rows, 1)->Name("add_along_axis/rows/stagecraft")->UseRealTime();
BENCHMARK_CAPTURE(add_hand, rows, 1)->Name("add_along_axis/rows/hand_loop")->UseRealTime();
BENCHMARK_CAPTURE(add_sc, rows_sorted, 1, true)->Name("add_along_axis/rows_sorted/stagecraft")->UseRealTime();
BENCHMARK_CAPTURE(add_hand, rows_sorted, 1, true)->Name("add_along_axis/rows_sorted/hand_loop")->UseRealTime();
BENCHMARK_CAPTURE(add_sc, cols, 0)->Name("add_along_axis/cols/stagecraft")->UseRealTime();
BENCHMARK_CAPTURE(add_hand, cols, 0)->Name("add_along_axis/cols/hand_loop")->UseRealTime();
BENCHMARK(gather_sc)->Name("gather/elements/stagecraft")->UseRealTime();
BENCHMARK(gather_hand)->Name("gather/elements/hand_loop")->UseRealTime();
BENCHMARK(scatter_add_sc)->Name("scatter_add/elements/stagecraft")->UseRealTime();
BENCHMARK(scatter_add_hand)->Name("scatter_add/elements/hand_loop")->UseRealTime();
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
BENCHMARK_CAPTURE(take_torch, rows, 1)->Name("take_along_axis/rows/libtorch")->UseRealTime();
BENCHMARK_CAPTURE(take_torch, cols, 0)->Name("take_along_axis/cols/libtorch")->UseRealTime();
BENCHMARK_CAPTURE(add_torch, rows, 1)->Name("add_along_axis/rows/libtorch")->UseRealTime();
BENCHMARK_CAPTURE(add_torch, rows_sorted, 1, true)->Name("add_along_axis/rows_sorted/libtorch")->UseRealTime();
BENCHMARK_CAPTURE(add_torch, cols, 0)->Name("add_along_axis/cols/libtorch")->UseRealTime();
BENCHMARK(gather_torch)->Name("gather/elements/libtorch")->UseRealTime();
BENCHMARK(scatter_add_torch)->Name("scatter_add/elements/libtorch")->UseRealTime();
BENCHMARK(sort_torch)->Name("sort/libtorch")->UseRealTime();
BENCHMARK(cumsum_torch)->Name("cumsum/libtorch")->UseRealTime();
BENCHMARK(attention_torch)->Name("attention/libtorch")->UseRealTime();
#endif

}  // namespace

STAGECRAFT_BENCH_MAIN()
