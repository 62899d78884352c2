// matmul against a triple-loop reference: dtypes, 1-D operands, batch broadcasting, empty
// and degenerate sizes, promotion, and every error path.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "testing.hpp"

namespace {

/// Small integers in [-5, 5] for integer types (exact sums), thirds of them for floats.
template <class T>
std::vector<T> random_values(std::int64_t n, unsigned seed) {
  return sctest::small_values<T>(n, seed, 5, 3);
}

/// NumPy's matmul written out with plain loops in double: promote 1-D operands, broadcast
/// the batch dims index by index, then drop the promoted axes.
std::vector<double> reference(const std::vector<double>& a, std::vector<std::int64_t> sa,
                              const std::vector<double>& b, std::vector<std::int64_t> sb,
                              std::vector<std::int64_t>& out_shape) {
  const bool av = sa.size() == 1, bv = sb.size() == 1;
  if (av) sa.insert(sa.begin(), 1);
  if (bv) sb.push_back(1);
  const std::int64_t M = sa[sa.size() - 2], K = sa.back(), N = sb.back();
  std::vector<std::int64_t> ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  const std::size_t r = std::max(ba.size(), bb.size());
  ba.insert(ba.begin(), r - ba.size(), 1);
  bb.insert(bb.begin(), r - bb.size(), 1);
  std::vector<std::int64_t> batch(r);
  std::int64_t nb = 1;
  for (std::size_t i = 0; i < r; ++i) nb *= (batch[i] = ba[i] == 1 ? bb[i] : ba[i]);
  std::vector<double> out(static_cast<std::size_t>(nb * M * N), 0.0);
  for (std::int64_t t = 0; t < nb; ++t) {
    std::int64_t rem = t, ia = 0, ib = 0, mul_a = 1, mul_b = 1;
    for (std::size_t d = r; d-- > 0;) {
      const std::int64_t idx = rem % batch[d];
      rem /= batch[d];
      ia += (ba[d] == 1 ? 0 : idx) * mul_a;
      ib += (bb[d] == 1 ? 0 : idx) * mul_b;
      mul_a *= ba[d];
      mul_b *= bb[d];
    }
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (std::int64_t k = 0; k < K; ++k) s += a[(ia * M + m) * K + k] * b[(ib * K + k) * N + n];
        out[(t * M + m) * N + n] = s;
      }
  }
  out_shape = batch;
  if (!av) out_shape.push_back(M);
  if (!bv) out_shape.push_back(N);
  return out;
}

template <class T>
void check_case(const std::vector<std::int64_t>& sa, const std::vector<std::int64_t>& sb, unsigned seed) {
  const sc::Shape shape_a(sa), shape_b(sb);
  const auto va = random_values<T>(shape_a.numel(), seed), vb = random_values<T>(shape_b.numel(), seed + 1);
  const sc::Tensor c = sc::matmul(sc::tensor(va, shape_a), sc::tensor(vb, shape_b));
  std::vector<std::int64_t> want_shape;
  const auto want = reference(std::vector<double>(va.begin(), va.end()), sa, std::vector<double>(vb.begin(), vb.end()),
                              sb, want_shape);
  INFO(shape_a << " x " << shape_b << " as " << sc::name(sc::dtype_of<T>()));
  REQUIRE(c.dtype() == sc::dtype_of<T>());
  REQUIRE(c.shape() == sc::Shape(want_shape));
  const auto got = c.to_vector<double>();
  const std::int64_t K = sa.back();
  const double tol = std::is_same_v<T, float> ? 1e-5 * (K + 1) : 1e-12 * (K + 1);
  for (std::size_t i = 0; i < got.size(); ++i) {
    if constexpr (std::is_floating_point_v<T>) REQUIRE(got[i] == Approx(want[i]).margin(tol));
    else REQUIRE(got[i] == want[i]);
  }
}

const std::vector<std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>> cases = {
    {{3, 4}, {4, 5}},          {{1, 784}, {784, 256}},    {{5}, {5, 3}},           {{4, 5}, {5}},
    {{5}, {5}},                {{2, 3, 4}, {4, 5}},       {{2, 1, 3, 4}, {3, 4, 2}}, {{3, 4}, {2, 4, 5}},
    {{2, 3, 4}, {4}},          {{7}, {2, 7, 3}},          {{1, 1, 4}, {1, 4, 1}},   {{2, 3, 4}, {1, 4, 6}},
    {{64, 300}, {300, 129}},   {{3, 1, 2}, {2, 1}},       {{2, 2, 1, 6}, {2, 6, 3}}, {{1, 9}, {4, 9, 2}},
    {{3, 0}, {0, 4}},          {{0, 3, 4}, {4, 5}},       {{0, 4}, {4, 5}},        {{3, 4}, {4, 0}},
    {{2, 0, 4}, {2, 4, 3}},    {{0}, {0}},                {{1, 2, 5}, {0, 5, 2}},
    // one row below the BLAS threshold (the SIMD row loop): several batches of N, masked ends
    {{1, 20}, {20, 30}},       {{3, 1, 7}, {7, 33}},      {{1, 2}, {2, 10}},
};

}  // namespace

TEMPLATE_TEST_CASE("matmul matches a triple loop", "[matmul]", float, double, std::int32_t, std::int64_t) {
  unsigned seed = 1;
  for (const auto& [sa, sb] : cases) check_case<TestType>(sa, sb, seed += 2);
}

namespace {

/// x (row-major, shape s) with its last two axes swapped by index arithmetic; s is updated.
std::vector<double> swap_last_two(const std::vector<double>& x, std::vector<std::int64_t>& s) {
  const std::size_t r = s.size();
  const std::int64_t R = s[r - 2], C = s[r - 1], mats = static_cast<std::int64_t>(x.size()) / std::max<std::int64_t>(1, R * C);
  std::vector<double> y(x.size());
  for (std::int64_t t = 0; t < mats; ++t)
    for (std::int64_t i = 0; i < R; ++i)
      for (std::int64_t j = 0; j < C; ++j) y[static_cast<std::size_t>(t * R * C + j * R + i)] = x[static_cast<std::size_t>(t * R * C + i * C + j)];
  std::swap(s[r - 2], s[r - 1]);
  return y;
}

/// matmul(a, b, ta, tb) on operands stored transposed (shapes sa, sb as stored) against the
/// triple loop on explicitly transposed copies.
template <class T>
void check_flags(std::vector<std::int64_t> sa, std::vector<std::int64_t> sb, bool ta, bool tb, unsigned seed) {
  const sc::Shape shape_a(sa), shape_b(sb);
  const auto va = random_values<T>(shape_a.numel(), seed), vb = random_values<T>(shape_b.numel(), seed + 1);
  const sc::Tensor c = sc::matmul(sc::tensor(va, shape_a), sc::tensor(vb, shape_b), ta, tb);
  std::vector<double> da(va.begin(), va.end()), db(vb.begin(), vb.end());
  if (ta && sa.size() >= 2) da = swap_last_two(da, sa);
  if (tb && sb.size() >= 2) db = swap_last_two(db, sb);
  std::vector<std::int64_t> want_shape;
  const auto want = reference(da, sa, db, sb, want_shape);
  INFO(shape_a << (ta ? "^T" : "") << " x " << shape_b << (tb ? "^T" : "") << " as " << sc::name(sc::dtype_of<T>()));
  REQUIRE(c.dtype() == sc::dtype_of<T>());
  REQUIRE(c.shape() == sc::Shape(want_shape));
  const auto got = c.to_vector<double>();
  const double tol = std::is_same_v<T, float> ? 1e-5 * (sa.back() + 1) : 1e-12 * (sa.back() + 1);
  for (std::size_t i = 0; i < got.size(); ++i) {
    if constexpr (std::is_floating_point_v<T>) REQUIRE(got[i] == Approx(want[i]).margin(tol));
    else REQUIRE(got[i] == want[i]);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("matmul with transpose flags matches the triple loop on transposed copies", "[matmul]", float,
                   double, std::int32_t, std::int64_t) {
  // Stored shapes: with ta, a is [..., K, M]; with tb, b is [..., N, K]. Sizes cover the plain
  // loop (tiny), gemv (one row or column), GEMM, batches folded or not, and 1-D operands
  // (flags ignored).
  struct Case {
    std::vector<std::int64_t> a, b;
    bool ta, tb;
  };
  const std::vector<Case> flag_cases = {
      {{4, 3}, {4, 5}, true, false},      {{3, 4}, {5, 4}, false, true},      {{4, 3}, {5, 4}, true, true},
      {{300, 64}, {300, 129}, true, false}, {{64, 300}, {129, 300}, false, true}, {{300, 64}, {129, 300}, true, true},
      {{1, 784}, {256, 784}, false, true}, {{784, 1}, {784, 256}, true, false}, {{70, 90}, {1, 90}, false, true},
      {{90, 70}, {90, 1}, true, false},   {{2, 4, 3}, {4, 5}, true, false},    {{2, 3, 4}, {5, 4}, false, true},
      {{2, 3, 4}, {2, 5, 4}, false, true}, {{2, 1, 4, 3}, {3, 5, 4}, true, true}, {{5}, {6, 5}, true, true},
      {{6, 5}, {5}, false, true},          {{0, 3}, {0, 4}, true, false},       {{3, 0}, {4, 0}, false, true},
      {{1, 40}, {50, 40}, false, true},    {{40, 1}, {50, 40}, true, true},     {{20, 1}, {20, 30}, true, false},
      {{1, 10}, {2, 10}, false, true},
  };
  unsigned seed = 100;
  for (const Case& c : flag_cases) check_flags<TestType>(c.a, c.b, c.ta, c.tb, seed += 2);
}

TEST_CASE("matmul transpose flags: errors name the transposed operand", "[matmul][errors]") {
  CHECK_THROWS_WITH(sc::matmul(sc::ones({2, 3}), sc::ones({2, 3}), false, false),
                    Catch::Contains("[matmul] inner dimensions do not match: [2, 3] x [2, 3] (3 != 2)"));
  CHECK(sc::matmul(sc::ones({2, 3}), sc::ones({2, 3}), true, false).shape() == sc::Shape{3, 3});
  CHECK(sc::matmul(sc::ones({2, 3}), sc::ones({2, 3}), false, true).shape() == sc::Shape{2, 2});
  CHECK_THROWS_WITH(sc::matmul(sc::ones({2, 3}), sc::ones({2, 3}), true, true),
                    Catch::Contains("[matmul] inner dimensions do not match: [2, 3]^T x [2, 3]^T (2 != 3)"));
  CHECK_THROWS_AS(sc::matmul(sc::ones({2, 3}), sc::ones({2, 3}), true, true), sc::ShapeError);
}

TEST_CASE("matmul shapes of 1-D operands and batch broadcasting", "[matmul]") {
  CHECK(sc::matmul(sc::ones({4}), sc::ones({4})).shape() == sc::Shape{});
  CHECK(sc::matmul(sc::ones({4}), sc::ones({4})).item<float>() == 4.f);
  CHECK(sc::matmul(sc::ones({2, 1, 3, 4}), sc::ones({5, 4, 6})).shape() == sc::Shape{2, 5, 3, 6});
  CHECK(sc::matmul(sc::ones({6, 4}), sc::ones({4})).shape() == sc::Shape{6});
  CHECK(sc::matmul(sc::ones({3, 0}), sc::ones({0, 2})).to_vector<float>() == std::vector<float>(6, 0.f));
}

TEST_CASE("matmul hand-computed values", "[matmul]") {
  const auto a = sc::tensor({{1.f, 2.f}, {3.f, 4.f}});
  const auto b = sc::tensor({{5.f, 6.f}, {7.f, 8.f}});
  CHECK(sc::matmul(a, b).to_vector<float>() == std::vector<float>{19, 22, 43, 50});
  CHECK(sc::matmul(sc::tensor({1.f, 1.f}), b).to_vector<float>() == std::vector<float>{12, 14});  // gemv path
  CHECK(sc::matmul(a, sc::tensor({1.f, -1.f})).to_vector<float>() == std::vector<float>{-1, -1});
  // Integer products wrap like NumPy's instead of being undefined.
  const auto big = sc::tensor({std::int32_t{1} << 30, std::int32_t{1} << 30});
  CHECK(sc::matmul(big, sc::tensor({std::int32_t{2}, std::int32_t{2}})).item<std::int32_t>() == 0);
}

TEST_CASE("matmul promotes mixed dtypes", "[matmul]") {
  const auto i = sc::tensor({{1, 2}, {3, 4}});
  const auto f = sc::tensor({{0.5f, 0.f}, {0.f, 0.5f}});
  const auto c = sc::matmul(i, f);
  CHECK(c.dtype() == sc::f32);
  CHECK(c.to_vector<float>() == std::vector<float>{0.5f, 1.f, 1.5f, 2.f});
  CHECK(sc::matmul(f, sc::eye(2, sc::f64)).dtype() == sc::f64);
  CHECK(sc::matmul(i, sc::eye(2, sc::i64)).dtype() == sc::i64);
}

TEST_CASE("matmul errors name the op, the shapes and the user's line", "[matmul][errors]") {
  const auto at = [](int line) { return "at test_matmul.cpp:" + std::to_string(line); };
  int line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::matmul(sc::ones({2, 3}), sc::ones({4, 5})),
                    Catch::Contains("[matmul] inner dimensions do not match: [2, 3] x [4, 5] (3 != 4)") &&
                        Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::matmul(sc::ones({2, 3}), sc::ones({4, 5})), sc::ShapeError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::matmul(sc::ones({3}), sc::ones({4})),
                    Catch::Contains("[matmul] inner dimensions do not match: [3] x [4]") && Catch::Contains(at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::matmul(sc::ones({2, 3, 4}), sc::ones({5, 4, 6})),
                    Catch::Contains("[matmul] batch dimensions do not broadcast: [2, 3, 4] x [5, 4, 6]") &&
                        Catch::Contains(at(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::matmul(sc::scalar(2.f), sc::ones({2})),
                    Catch::Contains("[matmul] needs operands of rank >= 1, got shapes [] and [2]") &&
                        Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::matmul(sc::scalar(2.f), sc::ones({2})), sc::ShapeError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::matmul(sc::tensor({true, false}), sc::ones({2})),
                    Catch::Contains("[matmul] expects numeric operands, got bool and f32") && Catch::Contains(at(line)));
  CHECK_THROWS_AS(sc::matmul(sc::ones({2}), sc::tensor({true, false})), sc::DTypeError);
  CHECK_THROWS_AS(sc::matmul(sc::Tensor(), sc::ones({2})), sc::ValueError);
}

TEST_CASE("OpenBLAS's own thread pool is held to the CPU quota, only where the user set no count", "[matmul][blas]") {
  namespace cpu = sc::backend::cpu;
  // pthreads build, 64 threads, a quota of 2: lowered to 2
  CHECK(cpu::blas_pool_threads_for_quota(OPENBLAS_THREAD, 64, 2, false) == 2);
  // already within the quota, no quota, a count in the environment: left alone
  CHECK(cpu::blas_pool_threads_for_quota(OPENBLAS_THREAD, 2, 2, false) == 0);
  CHECK(cpu::blas_pool_threads_for_quota(OPENBLAS_THREAD, 64, 0, false) == 0);
  CHECK(cpu::blas_pool_threads_for_quota(OPENBLAS_THREAD, 64, 2, true) == 0);
  // the OpenMP build follows OpenMP's count (settled per thread); the serial build has no pool
  CHECK(cpu::blas_pool_threads_for_quota(OPENBLAS_OPENMP, 64, 2, false) == 0);
  CHECK(cpu::blas_pool_threads_for_quota(OPENBLAS_SEQUENTIAL, 64, 2, false) == 0);
}

TEST_CASE("an OpenBLAS that fell back to older kernels is switched to the CPU's best core", "[matmul][blas]") {
  namespace cpu = sc::backend::cpu;
  // The rule, case by case: a core below the CPU's vector level is replaced by the best one for
  // that level; a core of its level, unknown names and the user's own choices are kept.
  CHECK(cpu::blas_core_to_use("Prescott", 3, false, nullptr, nullptr) == "SkylakeX");
  CHECK(cpu::blas_core_to_use("Prescott", 2, false, nullptr, nullptr) == "Haswell");
  CHECK(cpu::blas_core_to_use("Core2", 2, true, nullptr, nullptr) == "Zen");
  CHECK(cpu::blas_core_to_use("Nehalem", 1, false, nullptr, nullptr) == "Sandybridge");
  CHECK(cpu::blas_core_to_use("Prescott", 0, false, nullptr, nullptr).empty());
  // AVX2 kernels on an AVX-512 CPU (0.3.21's Haswell on a Zen 5) are a fallback too
  CHECK(cpu::blas_core_to_use("Zen", 3, true, nullptr, nullptr) == "SkylakeX");
  CHECK(cpu::blas_core_to_use("Haswell", 3, true, nullptr, nullptr) == "SkylakeX");
  CHECK(cpu::blas_core_to_use("Haswell", 3, false, nullptr, nullptr) == "SkylakeX");
  CHECK(cpu::blas_core_to_use("Cooperlake", 3, true, nullptr, nullptr).empty());
  CHECK(cpu::blas_core_to_use("Haswell", 3, true, "keep", nullptr).empty());
  CHECK(cpu::blas_core_to_use("Haswell", 3, true, nullptr, "Haswell").empty());
  CHECK(cpu::blas_core_to_use("Haswell", 2, false, nullptr, nullptr).empty());
  CHECK(cpu::blas_core_to_use("SkylakeX", 3, false, nullptr, nullptr).empty());
  CHECK(cpu::blas_core_to_use("NeoverseN1", 3, false, nullptr, nullptr).empty());
  CHECK(cpu::blas_core_to_use("Prescott", 3, false, nullptr, "Prescott").empty());
  CHECK(cpu::blas_core_to_use("Prescott", 3, false, "keep", nullptr).empty());
  CHECK(cpu::blas_core_to_use("Zen", 3, false, "Haswell", nullptr) == "Haswell");
  CHECK(cpu::blas_core_to_use("Prescott", 2, true, "auto", "Prescott") == "Zen");
  CHECK(cpu::blas_core_to_use("Zen", 2, true, "auto", nullptr).empty());

  // The switch itself, on this machine: reproduce an OpenBLAS that does not know the CPU, then
  // apply the rule. Products are right before, under and after the fallback.
  sc::ensure_blas_core();
  const std::string start = sc::blas_core();
  const std::string best = cpu::best_blas_core();
  if (!cpu::blas_core_switchable() || cpu::cpu_vector_level() < 2) {
    WARN("this OpenBLAS cannot switch cores, or the CPU has no AVX2: only the rule is tested");
    return;
  }
  // what the library chose before its first product: never a core below the CPU's level
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr && std::getenv("STAGECRAFT_BLAS_CORE") == nullptr) {
    INFO("OpenBLAS core " << start << ", CPU vector level " << cpu::cpu_vector_level());
    CHECK_FALSE(cpu::blas_core_is_fallback());
    const int level = cpu::blas_core_detail::core_level(start);
    if (level >= 0) CHECK(level >= std::min(cpu::cpu_vector_level(), 3));
  }
  const sc::Tensor a = sc::random::normal({67, 45}, 1, 0.0, 1.0, sc::f64), b = sc::random::normal({45, 71}, 2, 0.0, 1.0, sc::f64);
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  auto check_product = [&] {
    const std::vector<double> c = sc::matmul(a, b).to_vector<double>();
    double worst = 0;
    for (int i = 0; i < 67; ++i)
      for (int j = 0; j < 71; ++j) {
        double ref = 0;
        for (int k = 0; k < 45; ++k) ref += av[static_cast<std::size_t>(i * 45 + k)] * bv[static_cast<std::size_t>(k * 71 + j)];
        worst = std::max(worst, std::abs(c[static_cast<std::size_t>(i * 71 + j)] - ref));
      }
    return worst;
  };
  CHECK(check_product() < 1e-12);
  // SSE-era kernels, and on an AVX-512 CPU AVX2 ones too
  std::vector<std::string> fallbacks{"Prescott"};
  if (cpu::cpu_vector_level() >= 3) fallbacks.push_back("Haswell");
  for (const std::string& old : fallbacks) {
    INFO("fallback " << old);
    REQUIRE(sc::set_blas_core(old));
    CHECK(cpu::blas_core_is_fallback());
    CHECK(check_product() < 1e-12);
    const std::string target = cpu::blas_core_to_use(sc::blas_core(), cpu::cpu_vector_level(), best == "Zen", nullptr, nullptr);
    CHECK(target == best);
    REQUIRE(sc::set_blas_core(target));
    CHECK_FALSE(cpu::blas_core_is_fallback());
    CHECK(check_product() < 1e-12);
  }
  sc::set_blas_core(start);
  CHECK(sc::blas_core() == start);
}
