// The eager batch's ops that read through a geometry (kernels/batch_elements.cuh: broadcast, copy,
// gemm), which the GPU's batch kernel and the CUDA emulator both run: values against plain loops
// written here, a thread's share giving what one thread gives, the geometries a batch refuses, and
// the host's merging of axes (backend::cuda::batch_geometry).
#include "testing.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "../../kernels/batch_elements.cuh"
#include "stagecraft/backend/cuda/kernels.hpp"

namespace {

namespace abi = sc::cuda::abi;
namespace kb = sc::cuda::kernels::batch;
using abi::BatchGeometry;
using abi::BatchOp;
using abi::DT;

BatchOp op_of(BatchOp::Kind kind, DT dt, const void* a, const void* b, void* y, int n) {
  BatchOp op;
  op.kind = kind;
  op.dt = dt;
  op.a = a;
  op.b = b;
  op.y = y;
  op.n = n;
  return op;
}

BatchGeometry geometry(std::initializer_list<int> shape, std::initializer_list<int> s0, std::initializer_list<int> s1) {
  BatchGeometry g;
  g.rank = static_cast<int>(shape.size());
  int d = 0;
  for (int v : shape) g.shape[d++] = v;
  d = 0;
  for (int v : s0) g.strides[0][d++] = v;
  d = 0;
  for (int v : s1) g.strides[1][d++] = v;
  return g;
}

bool takes(const BatchOp& op, BatchGeometry g) { return kb::takes_op(op, &g); }

/// Runs op as `threads` threads of a block would (thread t: elements t, t + threads, ...).
void run_as_threads(const BatchOp& op, const BatchGeometry& g, int threads) {
  for (int t = 0; t < threads; ++t) REQUIRE(kb::run_op<int>(op, &g, t, threads, true));
}

double value(int i) { return std::sin(0.7 * i + 0.3) * 3.0; }

}  // namespace

TEST_CASE("eager batch elements: broadcasting binary rules against plain loops", "[cuda][batch]") {
  // a [3, 1, 4] op b [5, 1] -> y [3, 5, 4], through the geometry the host builds
  std::vector<double> a(12), b(5);
  for (int i = 0; i < 12; ++i) a[static_cast<std::size_t>(i)] = value(i);
  for (int i = 0; i < 5; ++i) b[static_cast<std::size_t>(i)] = value(i + 40);
  const sc::Shape out{3, 5, 4}, as{3, 1, 4}, bs{5, 1};
  BatchGeometry g;
  REQUIRE(sc::backend::cuda::batch_geometry(sc::backend::cuda::geometry(out, {&as, &bs}), g));
  for (const int threads : {1, 7, 512}) {
    INFO(threads << " threads");
    std::vector<double> y(60, -1.0);
    BatchOp op = op_of(BatchOp::broadcast, DT::f64, a.data(), b.data(), y.data(), 60);
    op.rule = static_cast<std::int8_t>(abi::BinaryRule::Sub);
    run_as_threads(op, g, threads);
    bool lt[60] = {};
    op.rule = static_cast<std::int8_t>(abi::BinaryRule::Less);
    op.y = lt;
    run_as_threads(op, g, threads);
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 5; ++j)
        for (int k = 0; k < 4; ++k) {
          const std::size_t o = static_cast<std::size_t>((i * 5 + j) * 4 + k);
          const double av = a[static_cast<std::size_t>(i * 4 + k)], bv = b[static_cast<std::size_t>(j)];
          CHECK(y[o] == av - bv);
          CHECK(lt[o] == (av < bv));
        }
  }
  // integers wrap as the single kernels' rules do
  const std::int32_t big[2] = {std::numeric_limits<std::int32_t>::max(), 5};
  const std::int32_t one[1] = {1};
  std::int32_t sum[2] = {};
  BatchOp add = op_of(BatchOp::broadcast, DT::i32, big, one, sum, 2);
  add.rule = static_cast<std::int8_t>(abi::BinaryRule::Add);
  run_as_threads(add, geometry({2}, {1}, {0}), 3);
  CHECK(sum[0] == std::numeric_limits<std::int32_t>::min());
  CHECK(sum[1] == 6);
}

TEST_CASE("eager batch elements: strided copies keep every bit and touch nothing else", "[cuda][batch]") {
  // x [6, 7] transposed into a column window [7, 6] of a [7, 10] buffer (rows 10 apart)
  std::vector<float> x(42);
  for (int i = 0; i < 42; ++i) x[static_cast<std::size_t>(i)] = static_cast<float>(value(i));
  x[5] = std::numeric_limits<float>::quiet_NaN();
  for (const int threads : {1, 5, 512}) {
    std::vector<float> y(70, -7.0f);
    run_as_threads(op_of(BatchOp::copy, DT::f32, x.data(), nullptr, y.data() + 2, 42), geometry({7, 6}, {1, 7}, {10, 1}),
                   threads);
    for (int r = 0; r < 7; ++r)
      for (int c = 0; c < 10; ++c) {
        const float got = y[static_cast<std::size_t>(r * 10 + c)];
        if (c < 2 || c >= 8) {
          CHECK(got == -7.0f);
        } else {
          const float want = x[static_cast<std::size_t>((c - 2) * 7 + r)];
          CHECK(std::memcmp(&got, &want, sizeof got) == 0);
        }
      }
  }
  // 1- and 8-byte elements: a NaN's payload and a bool pattern copied as they are
  double d[4] = {1.0, -0.0, 0.0, 2.5};
  const std::uint64_t payload = 0x7ff8000000012345ull;
  std::memcpy(&d[2], &payload, 8);
  double dy[4] = {};
  run_as_threads(op_of(BatchOp::copy, DT::f64, d, nullptr, dy, 4), geometry({4}, {1}, {1}), 2);
  CHECK(std::memcmp(d, dy, sizeof d) == 0);
  const bool bx[6] = {true, false, true, true, false, true};
  bool by[6] = {};
  run_as_threads(op_of(BatchOp::copy, DT::b8, bx, nullptr, by, 6), geometry({2, 3}, {3, 1}, {3, 1}), 4);
  CHECK(std::memcmp(bx, by, sizeof bx) == 0);
}

TEST_CASE("eager batch elements: small products, transposed operands as strides, against plain loops",
          "[cuda][batch]") {
  constexpr int M = 5, N = 7, K = 9;
  std::vector<double> a(M * K), b(K * N);
  for (int i = 0; i < M * K; ++i) a[static_cast<std::size_t>(i)] = value(i);
  for (int i = 0; i < K * N; ++i) b[static_cast<std::size_t>(i)] = value(i + 100);
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      INFO("ta " << ta << " tb " << tb);
      // the operands stored as the flags say: A [K, M] when ta, B [N, K] when tb
      auto A = [&](int m, int k) { return a[static_cast<std::size_t>(ta ? k * M + m : m * K + k)]; };
      auto B = [&](int k, int n) { return b[static_cast<std::size_t>(tb ? n * K + k : k * N + n)]; };
      const BatchGeometry g =
          geometry({M, N, K}, {ta ? 1 : K, ta ? M : 1}, {tb ? 1 : N, tb ? K : 1});
      std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end());
      for (const int threads : {1, 6, 512}) {
        std::vector<double> y(M * N, -1.0);
        std::vector<float> yf(M * N, -1.0f);
        run_as_threads(op_of(BatchOp::gemm, DT::f64, a.data(), b.data(), y.data(), M * N), g, threads);
        run_as_threads(op_of(BatchOp::gemm, DT::f32, af.data(), bf.data(), yf.data(), M * N), g, threads);
        for (int m = 0; m < M; ++m)
          for (int n = 0; n < N; ++n) {
            double want = 0;
            for (int k = 0; k < K; ++k) want += A(m, k) * B(k, n);
            CHECK(y[static_cast<std::size_t>(m * N + n)] == Approx(want).epsilon(1e-13).margin(1e-13));
            CHECK(yf[static_cast<std::size_t>(m * N + n)] == Approx(want).epsilon(1e-5).margin(1e-5));
          }
      }
    }
  // integer products and sums wrap (as gemm.cu's integer kernel)
  const std::int32_t ia[2] = {65536, 3}, ib[2] = {65536, 4};
  std::int32_t iy[1] = {};
  run_as_threads(op_of(BatchOp::gemm, DT::i32, ia, ib, iy, 1), geometry({1, 1, 2}, {2, 1}, {1, 1}), 2);
  CHECK(iy[0] == 12);  // 2^32 wraps to 0, + 12
  const std::int64_t la[3] = {1, 2, 3}, lb[3] = {-4, 5, -6};
  std::int64_t ly[1] = {};
  run_as_threads(op_of(BatchOp::gemm, DT::i64, la, lb, ly, 1), geometry({1, 1, 3}, {3, 1}, {1, 1}), 1);
  CHECK(ly[0] == -12);
}

TEST_CASE("eager batch elements: the geometries a batch refuses", "[cuda][batch]") {
  float x[64] = {}, y[64] = {};
  const BatchOp copy = op_of(BatchOp::copy, DT::f32, x, nullptr, y, 6);
  CHECK(kb::takes_op(copy, nullptr) == false);  // a copy needs its geometry
  const BatchGeometry ok = geometry({2, 3}, {3, 1}, {3, 1});
  CHECK(kb::takes_op(copy, &ok));
  BatchOp unary = copy;
  unary.kind = BatchOp::unary;
  CHECK_FALSE(kb::takes_op(unary, &ok));  // a flat op takes none
  CHECK_FALSE(takes(copy, geometry({2, 4}, {4, 1}, {4, 1})));  // 8 != n
  CHECK_FALSE(takes(copy, geometry({2, 3}, {-3, 1}, {3, 1})));  // negative
  // offsets: the last one must stay below 2^31
  CHECK_FALSE(takes(op_of(BatchOp::copy, DT::f32, x, nullptr, y, 9), geometry({3, 3}, {1 << 30, 1}, {3, 1})));
  CHECK(takes(op_of(BatchOp::copy, DT::f32, x, nullptr, y, 2), geometry({2}, {(1 << 30) + 5, 1}, {1})));
  BatchGeometry five = geometry({1, 1, 1, 1}, {0, 0, 0, 0}, {0, 0, 0, 0});
  five.rank = 5;
  CHECK_FALSE(kb::takes_op(op_of(BatchOp::copy, DT::f32, x, nullptr, y, 1), &five));
  const BatchGeometry big = geometry({4097}, {1}, {1});
  CHECK_FALSE(kb::takes_op(op_of(BatchOp::copy, DT::f32, x, nullptr, y, 4097), &big));
  // products: bool, an empty sum, too many outputs or multiply-adds
  const BatchGeometry p = geometry({2, 2, 3}, {3, 1}, {2, 1});
  CHECK(kb::takes_op(op_of(BatchOp::gemm, DT::f32, x, x, y, 4), &p));
  CHECK_FALSE(kb::takes_op(op_of(BatchOp::gemm, DT::b8, x, x, y, 4), &p));
  CHECK_FALSE(takes(op_of(BatchOp::gemm, DT::f32, x, x, y, 4), geometry({2, 2, 0}, {0, 1}, {2, 1})));
  CHECK(takes(op_of(BatchOp::gemm, DT::f32, x, x, y, 128 * 128), geometry({128, 128, 4}, {4, 1}, {128, 1})));
  CHECK_FALSE(takes(op_of(BatchOp::gemm, DT::f32, x, x, y, 128 * 128), geometry({128, 128, 5}, {5, 1}, {128, 1})));
  CHECK_FALSE(takes(op_of(BatchOp::gemm, DT::f32, x, x, y, 129 * 128), geometry({129, 128, 1}, {1, 1}, {128, 1})));
}

TEST_CASE("eager batch geometry: size-1 axes dropped, neighbouring axes merged, at most four", "[cuda][batch]") {
  namespace be = sc::backend::cuda;
  BatchGeometry g;
  // the same dense shape: one axis
  const sc::Shape s{2, 3, 4};
  REQUIRE(be::batch_geometry(be::geometry(s, {&s, &s}), g));
  CHECK(g.rank == 1);
  CHECK(g.shape[0] == 24);
  // a row vector against a matrix's leading axes: [6, 4] with strides {4, 1} and {0, 1}
  const sc::Shape row{4};
  REQUIRE(be::batch_geometry(be::geometry(s, {&s, &row}), g));
  CHECK(g.rank == 2);
  CHECK((g.shape[0] == 6 && g.shape[1] == 4));
  CHECK((g.strides[0][0] == 4 && g.strides[0][1] == 1 && g.strides[1][0] == 0 && g.strides[1][1] == 1));
  // one element: one axis of one
  const sc::Shape one{1, 1};
  REQUIRE(be::batch_geometry(be::geometry(one, {&one, &one}), g));
  CHECK((g.rank == 1 && g.shape[0] == 1));
  // alternating broadcast axes cannot merge: five remain
  const sc::Shape five{2, 2, 2, 2, 2}, p{2, 1, 2, 1, 2}, q{1, 2, 1, 2, 1};
  CHECK_FALSE(be::batch_geometry(be::geometry(five, {&p, &q}), g));
  const sc::Shape four{2, 2, 2, 2}, p4{2, 1, 2, 1}, q4{1, 2, 1, 2};
  CHECK(be::batch_geometry(be::geometry(four, {&p4, &q4}), g));
  CHECK(g.rank == 4);
  // a stride past 31 bits
  sc::cuda::abi::Geometry wide;
  wide.rank = 2;
  wide.shape[0] = wide.shape[1] = 2;
  wide.strides[0][0] = std::int64_t{1} << 31;
  wide.strides[0][1] = 1;
  wide.strides[1][0] = 2;
  wide.strides[1][1] = 1;
  CHECK_FALSE(be::batch_geometry(wide, g));
}
