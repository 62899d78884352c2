// Tensor creation, item/to_vector, from_blob, reshape sharing, the allocator, printing, random.
#include <algorithm>
#include <array>
#include <atomic>
#include <limits>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include "testing.hpp"

TEST_CASE("nested lists give the right shape and dtype", "[tensor]") {
  auto a = sc::tensor({1.f, 2.f, 3.f});
  CHECK(a.shape() == sc::Shape{3});
  CHECK(a.dtype() == sc::f32);
  auto b = sc::tensor({{1.0, 2.0}, {3.0, 4.0}, {5.0, 6.0}});
  CHECK(b.shape() == sc::Shape{3, 2});
  CHECK(b.dtype() == sc::f64);
  CHECK(b.to_vector<double>() == std::vector<double>{1, 2, 3, 4, 5, 6});
  auto c = sc::tensor({{{1, 2}}, {{3, 4}}});
  CHECK(c.shape() == sc::Shape{2, 1, 2});
  CHECK(c.dtype() == sc::i32);
  auto d = sc::tensor({{{{true}}}});
  CHECK(d.shape() == sc::Shape{1, 1, 1, 1});
  CHECK(d.dtype() == sc::boolean);
  CHECK_THROWS_AS(sc::tensor({{1.f, 2.f}, {3.f}}), sc::ShapeError);
}

TEST_CASE("creation functions", "[tensor]") {
  CHECK(sc::scalar(3.f).rank() == 0);
  CHECK(sc::scalar(3.f).item<float>() == 3.f);
  CHECK(sc::zeros({2, 3}).to_vector<float>() == std::vector<float>(6, 0.f));
  CHECK(sc::ones({2, 3}, sc::f64).dtype() == sc::f64);
  CHECK(sc::full({2}, 7.f).to_vector<float>() == std::vector<float>{7, 7});
  CHECK(sc::arange(4).to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 2, 3});
  CHECK(sc::arange(4).dtype() == sc::i64);
  CHECK(sc::arange(0.f, 1.f, 0.25f).to_vector<float>() == std::vector<float>{0, 0.25f, 0.5f, 0.75f});
  CHECK(sc::eye(3).to_vector<float>() == std::vector<float>{1, 0, 0, 0, 1, 0, 0, 0, 1});
  auto t = sc::tensor(std::vector<float>{1, 2, 3, 4, 5, 6}, sc::Shape{2, 3});
  CHECK(t.shape() == sc::Shape{2, 3});
  CHECK_THROWS_AS(sc::tensor(std::vector<float>{1, 2}, sc::Shape{2, 3}), sc::ShapeError);
  CHECK_THROWS_AS(sc::zeros({-1, 2}), sc::ShapeError);
  CHECK(sc::zeros({0, 3}).numel() == 0);
}

TEST_CASE("item and to_vector convert and check", "[tensor]") {
  auto t = sc::tensor({2.5f});
  CHECK(t.item<double>() == 2.5);
  CHECK(t.item<std::int64_t>() == 2);
  CHECK_THROWS_AS(sc::tensor({1.f, 2.f}).item<float>(), sc::ShapeError);
  CHECK(sc::tensor({1, 2}).to_vector<float>() == std::vector<float>{1.f, 2.f});
  CHECK(t.astype(sc::f64).dtype() == sc::f64);
  CHECK(sc::tensor({1.7f, -1.7f}).astype(sc::i32).to_vector<std::int32_t>() == std::vector<std::int32_t>{1, -1});
  CHECK(sc::tensor({0.f, 2.f}).astype(sc::boolean).to_vector<bool>() == std::vector<bool>{false, true});
  sc::Tensor u;
  CHECK_THROWS_AS(u.item<float>(), sc::ValueError);
}

TEST_CASE("other C++ integer types make tensors of the dtype that holds their values", "[tensor]") {
  // long long is int64_t's twin (long on Linux), not the same type: it used to match no overload
  const sc::Tensor ll = sc::tensor({{1LL, -2LL}, {3LL, 4LL}});
  CHECK(ll.dtype() == sc::i64);
  CHECK(ll.shape() == sc::Shape{2, 2});
  CHECK(ll.to_vector<std::int64_t>() == std::vector<std::int64_t>{1, -2, 3, 4});
  // 8- and 16-bit integers fit i32; unsigned and 64-bit integers take i64
  const sc::Tensor pixels = sc::tensor(std::vector<std::uint8_t>{0, 255, 7, 128}, sc::Shape{2, 2});
  CHECK(pixels.dtype() == sc::i32);
  CHECK(pixels.to_vector<std::int32_t>() == std::vector<std::int32_t>{0, 255, 7, 128});
  CHECK(sc::tensor({short{-3}, short{30000}}).to_vector<std::int32_t>() == std::vector<std::int32_t>{-3, 30000});
  CHECK(sc::tensor({4000000000u}).dtype() == sc::i64);
  CHECK(sc::tensor({4000000000u}).item<std::int64_t>() == 4000000000LL);
  CHECK(sc::tensor(std::vector<std::size_t>{1, 2, 3}).to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 2, 3});
  // std::vector<bool> keeps its bits in words: it has no data() to copy from
  CHECK(sc::tensor(std::vector<bool>{true, false, true}).to_vector<bool>() == std::vector<bool>{true, false, true});
  CHECK(sc::tensor(std::vector<bool>{true, false, true}).dtype() == sc::boolean);
  // a 64-bit unsigned value above INT64_MAX fits no dtype
  const std::uint64_t big = std::uint64_t{1} << 63;
  CHECK_THROWS_AS(sc::tensor(std::vector<std::uint64_t>{1, big}), sc::ValueError);
  CHECK_THROWS_AS(sc::tensor({big}), sc::ValueError);
  CHECK_THROWS_AS(sc::scalar(big), sc::ValueError);
  CHECK_THROWS_AS(sc::full({2}, big), sc::ValueError);
  CHECK_THROWS_WITH(sc::scalar(big), Catch::Contains("[scalar]") && Catch::Contains("9223372036854775808") &&
                                         Catch::Contains("test_tensor.cpp"));
  CHECK(sc::tensor(std::vector<std::uint64_t>{big - 1}).item<std::int64_t>() == INT64_MAX);
  CHECK(sc::scalar(7LL).dtype() == sc::i64);
  CHECK(sc::full({2}, 9ULL).to_vector<std::int64_t>() == std::vector<std::int64_t>{9, 9});
  CHECK(sc::full({2}, std::uint8_t{200}).dtype() == sc::i32);
  // read back as any of them: through the element type, then as static_cast converts
  CHECK(sc::tensor({5.75f}).item<long long>() == 5);
  CHECK(sc::tensor({300}).item<std::uint8_t>() == 44);
  CHECK(sc::tensor({1.5, -2.5}).to_vector<long long>() == std::vector<long long>{1, -2});
  CHECK(sc::tensor({true, false}).to_vector<std::size_t>() == std::vector<std::size_t>{1, 0});
  // and a GPU tensor reads back the same way (a copy to the host first)
  if (sc::cuda::is_available()) {
    const sc::Tensor g = ll.to(sc::Device::cuda(0));
    CHECK(g.to_vector<long long>() == std::vector<long long>{1, -2, 3, 4});
    CHECK(sc::sum(g).item<unsigned>() == 6u);
  }
}

TEST_CASE("full with a dtype keeps an integer exact, and zeros and ones name themselves", "[tensor]") {
  // an integer is never rounded through double: 2^53 + 1 is not a double
  const std::int64_t odd = (std::int64_t{1} << 53) + 1;
  CHECK(sc::full({2}, odd, sc::i64).to_vector<std::int64_t>() == std::vector<std::int64_t>{odd, odd});
  CHECK(sc::full({1}, std::numeric_limits<std::int64_t>::min(), sc::i64).item<std::int64_t>() == INT64_MIN);
  CHECK(sc::full({1}, -2147483648LL, sc::i32).item<std::int32_t>() == INT32_MIN);
  CHECK(sc::full({1}, 7u, sc::i32).item<std::int32_t>() == 7);
  CHECK(sc::full({1}, true, sc::i32).item<std::int32_t>() == 1);  // bool and characters are integers too
  CHECK(sc::full({1}, 'a', sc::i64).item<std::int64_t>() == 97);
  CHECK(sc::full({1}, std::uint8_t{200}, sc::f32).item<float>() == 200.f);
  // to a floating dtype as C++ converts it; to bool, nonzero is true
  CHECK(sc::full({1}, odd, sc::f64).item<double>() == static_cast<double>(odd));
  CHECK(sc::full({1}, -5, sc::f32).item<float>() == -5.f);
  CHECK(sc::full({2}, 2, sc::boolean).to_vector<bool>() == std::vector<bool>{true, true});
  CHECK(sc::full({1}, 0, sc::boolean).item<bool>() == false);
  // an integer an integer dtype cannot hold is a DTypeError, as a weak scalar's (not a wrap)
  CHECK_THROWS_AS(sc::full({2}, 3000000000LL, sc::i32), sc::DTypeError);
  CHECK_THROWS_WITH(sc::full({2}, 3000000000LL, sc::i32), Catch::Contains("[full]") &&
                                                              Catch::Contains("3000000000 does not fit i32") &&
                                                              Catch::Contains("test_tensor.cpp"));
  CHECK_THROWS_AS(sc::full({1}, std::numeric_limits<std::uint64_t>::max(), sc::i64), sc::DTypeError);
  // a floating value keeps cast()'s rule (test_hardening.cpp); errors name the function called
  CHECK(sc::full({1}, 2.75, sc::i32).item<std::int32_t>() == 2);
  CHECK_THROWS_WITH(sc::zeros({-1, 2}), Catch::Contains("[zeros] negative extent") && Catch::Contains("test_tensor.cpp"));
  CHECK_THROWS_WITH(sc::ones({-3}, sc::i64), Catch::Contains("[ones] negative extent"));
  CHECK_THROWS_WITH(sc::full({-3}, 1.0, sc::i64), Catch::Contains("[full] negative extent"));
}

TEST_CASE("from_blob is zero-copy over user memory", "[tensor]") {
  std::vector<float> buf{1, 2, 3, 4};
  auto t = sc::from_blob(buf.data(), {2, 2}, sc::f32);
  CHECK(t.raw_data() == buf.data());
  buf[3] = 40;
  CHECK(t.to_vector<float>()[3] == 40);
  auto u = t + 1.f;
  CHECK(u.to_vector<float>() == std::vector<float>{2, 3, 4, 41});
  CHECK(buf[0] == 1);  // inputs are never written
}

TEST_CASE("the caching allocator reuses blocks and counts", "[allocator]") {
  CHECK(sc::detail::CachingAllocator::round(1) == 64);
  CHECK(sc::detail::CachingAllocator::round(65) == 80);
  CHECK(sc::detail::CachingAllocator::round(1000) == 1024);
  CHECK(sc::detail::CachingAllocator::round(1025) == 1280);
  { auto warm = sc::zeros({1000}); }
  const auto before = sc::memory_stats();
  for (int i = 0; i < 10; ++i) { auto t = sc::zeros({1000}); }
  const auto after = sc::memory_stats();
  CHECK(after.allocation_calls == before.allocation_calls);  // all from the cache
  CHECK(after.cache_hits >= before.cache_hits + 10);
  {
    auto big = sc::zeros({1 << 20});
    CHECK(sc::memory_stats().bytes_in_use >= after.bytes_in_use + (4u << 20));
  }
  CHECK(sc::memory_stats().bytes_cached >= (4u << 20));
  sc::empty_cache();
  CHECK(sc::memory_stats().bytes_cached == 0);
}

TEST_CASE("printing is NumPy-like and elides large tensors", "[print]") {
  std::ostringstream os;
  os << sc::tensor({{1.f, 2.5f}, {-3.f, 4.f}});
  CHECK(os.str() == "Tensor([[ 1.0,  2.5],\n        [-3.0,  4.0]], shape=[2, 2], dtype=f32)");
  os.str("");
  os << sc::arange(2000);
  CHECK(os.str() == "Tensor([   0,    1,    2, ..., 1997, 1998, 1999], shape=[2000], dtype=i64)");
  os.str("");
  os << sc::scalar(true);
  CHECK(os.str() == "Tensor(true, shape=[], dtype=bool)");
}

TEST_CASE("the grain scale sets how many threads a parallel loop uses", "[threads]") {
  STATIC_REQUIRE(sc::config::parallel_grain_scale == 64);  // the library's default (test_main sets 1)
  const std::int64_t saved = sc::parallel_grain_scale();
  const sctest::ThreadCount threads(2);
  const auto used = [](std::int64_t n) {
    std::atomic<int> ranges{0};
    sc::backend::cpu::parallel_for(n, sc::backend::cpu::grain_cheap, [&](std::int64_t, std::int64_t) { ++ranges; });
    return ranges.load();
  };
  const std::int64_t n = 4 * sc::backend::cpu::grain_cheap;
  sc::set_parallel_grain_scale(1);
  CHECK(sc::parallel_grain_scale() == 1);
#if SC_HAS_OPENMP
  CHECK(used(n) == 2);
#endif
  sc::set_parallel_grain_scale(64);
  CHECK(used(n) == 1);  // 64 times the work per thread: one thread
#if SC_HAS_OPENMP
  CHECK(used(64 * sc::backend::cpu::grain_cheap) == 2);  // a loop that large still splits
#endif
  sc::set_parallel_grain_scale(0);  // clamped
  CHECK(sc::parallel_grain_scale() == 1);
  sc::set_parallel_grain_scale(saved);
}

TEST_CASE("parallel_rows splits whole rows by their work, without parallel_for's 64-unit floor", "[threads]") {
  const std::int64_t saved = sc::parallel_grain_scale();
  const sctest::ThreadCount threads(4);
  const std::int64_t g = sc::backend::cpu::grain_cheap;
  // The ranges f was given, in order of their start.
  const auto ranges = [g](std::int64_t rows, std::int64_t work) {
    std::mutex m;
    std::vector<std::pair<std::int64_t, std::int64_t>> got;
    sc::backend::cpu::parallel_rows(rows, work, g, [&](std::int64_t b, std::int64_t e) {
      const std::lock_guard<std::mutex> lock(m);
      got.emplace_back(b, e);
    });
    std::sort(got.begin(), got.end());
    return got;
  };
  // Every row once, in contiguous ranges.
  const auto covers = [](const std::vector<std::pair<std::int64_t, std::int64_t>>& got, std::int64_t rows) {
    std::int64_t next = 0;
    for (const auto& [b, e] : got) {
      if (b != next || e <= b) return false;
      next = e;
    }
    return next == rows;
  };
  sc::set_parallel_grain_scale(1);
  const auto wide = ranges(10, 100000);  // 10 rows of 100K elements
  CHECK(covers(wide, 10));
#if SC_HAS_OPENMP
  CHECK(wide.size() == 4);  // spread evenly: 3, 3, 2, 2 rows
  CHECK(wide.front() == std::pair<std::int64_t, std::int64_t>{0, 3});
  CHECK(wide.back() == std::pair<std::int64_t, std::int64_t>{8, 10});
  std::atomic<int> old{0};  // what parallel_for makes of the same loop: one range
  sc::backend::cpu::parallel_for(10, std::max<std::int64_t>(1, g / 100000), [&](std::int64_t, std::int64_t) { ++old; });
  CHECK(old.load() == 1);
  CHECK(ranges(3, g).size() == 3);                // no more threads than rows
  CHECK(ranges(1000, g / 200).size() == 4);      // narrow rows: as many as the elements allow
#endif
  CHECK(ranges(10, g / 20).size() == 1);  // under the grain: serial
  CHECK(ranges(1, std::int64_t{1} << 40).size() == 1);
  CHECK(covers(ranges(7, 0), 7));          // rows of no work count as one element
  // A total that overflows int64 saturates.
  CHECK(covers(ranges(3, std::int64_t{1} << 62), 3));
  sc::set_parallel_grain_scale(64);  // the default: a thread takes at least 64 * g / 2 elements
  CHECK(ranges(10, 100000).size() == 1);
#if SC_HAS_OPENMP
  CHECK(ranges(10, 800000).size() == 4);
  CHECK(ranges(2, 32 * g).size() == 2);
#endif
  sc::set_parallel_grain_scale(saved);
}

TEST_CASE("the BLAS thread cap gives a small product fewer threads, then restores the count", "[threads]") {
  STATIC_REQUIRE(sc::config::blas_thread_flops == 0);  // off by default
  const sctest::ThreadCount threads(4);
  const std::int64_t saved = sc::blas_thread_flops();
  sc::set_blas_thread_flops(1000);
  {
    const sc::backend::cpu::BlasThreadCap cap(2500);  // 2.5 threads' worth of work: 2
#if SC_HAS_OPENMP
    CHECK(sc::num_threads() == 2);
#endif
  }
  CHECK(sc::num_threads() == 4);
  {
    const sc::backend::cpu::BlasThreadCap cap(10);  // less than one thread's worth: 1
#if SC_HAS_OPENMP
    CHECK(sc::num_threads() == 1);
#endif
  }
  {
    const sc::backend::cpu::BlasThreadCap cap(1e9);  // plenty: all four
    CHECK(sc::num_threads() == 4);
  }
  CHECK(sc::num_threads() == 4);
  // Products under the cap give the same numbers (each element's sum is one thread's either way).
  const sc::Tensor a = sc::random::uniform({64, 48}, -1.0, 1.0, 5), b = sc::random::uniform({48, 40}, -1.0, 1.0, 6);
  sc::set_blas_thread_flops(0);
  const std::vector<float> free_run = sc::matmul(a, b).to_vector<float>();
  sc::set_blas_thread_flops(100000);
  CHECK(sc::matmul(a, b).to_vector<float>() == free_run);
  CHECK(sc::num_threads() == 4);
  sc::set_blas_thread_flops(-5);  // clamped: off
  CHECK(sc::blas_thread_flops() == 0);
  sc::set_blas_thread_flops(saved);
}

TEST_CASE("a matrix product split over stagecraft's threads equals plain loops, every layout", "[threads][matmul]") {
  STATIC_REQUIRE(sc::config::blas_split_flops == 0);  // off by default
  const sctest::ThreadCount threads(3);
  const std::int64_t saved = sc::blas_split_flops();
  // (M, N, K): wide (split by columns, a ragged last block), tall (by rows), one block, large
  // (left to OpenBLAS: 4 blocks per thread or more)
  const std::vector<std::array<std::int64_t, 3>> shapes = {{8, 100, 30}, {90, 12, 20}, {5, 20, 7}, {64, 64, 64}};
  for (const std::int64_t per : {std::int64_t{5000}, std::int64_t{20000}, std::int64_t{1} << 40}) {
    sc::set_blas_split_flops(per);
    {  // which products are split (the others go to OpenBLAS whole)
      std::vector<float> a(64 * 64, 1.f), b(64 * 64, 1.f), c(64 * 64);
      const auto split = [&](std::int64_t M, std::int64_t N, std::int64_t K) {
        return sc::backend::cpu::blas_detail::split_gemm(M, N, K, a.data(), K, false, b.data(), N, false, c.data(), N, 0.f);
      };
      INFO("per " << per);
      CHECK(split(8, 100, 30));
      CHECK(split(64, 64, 64) == (per > 20000));
      CHECK(c[0] == (per > 20000 ? 64.f : 30.f));  // (the last product split)
    }
    for (const auto& [M, N, K] : shapes)
      for (const bool ta : {false, true})
        for (const bool tb : {false, true})
          for (const bool ld : {false, true}) {  // matmul_2d, or gemm_ld accumulating into a wider C
            INFO("per " << per << ", M " << M << " N " << N << " K " << K << ", ta " << ta << " tb " << tb << " ld " << ld);
            const std::vector<float> a = sctest::small_values<float>(M * K, 1, 9, 8), b = sctest::small_values<float>(K * N, 2, 9, 8);
            const std::int64_t ldc = ld ? N + 3 : N;
            std::vector<float> c(static_cast<std::size_t>(M * ldc), 0.5f);
            if (ld) sc::backend::cpu::gemm_ld(M, N, K, a.data(), ta ? M : K, ta, b.data(), tb ? K : N, tb, c.data(), ldc, true);
            else sc::backend::cpu::matmul_2d(M, N, K, a.data(), b.data(), c.data(), ta, tb);
            for (std::int64_t m = 0; m < M; ++m)
              for (std::int64_t n = 0; n < N; ++n) {
                double want = ld ? 0.5 : 0.0;
                for (std::int64_t k = 0; k < K; ++k)
                  want += double(a[static_cast<std::size_t>(ta ? k * M + m : m * K + k)]) *
                          double(b[static_cast<std::size_t>(tb ? n * K + k : k * N + n)]);
                REQUIRE(c[static_cast<std::size_t>(m * ldc + n)] == Approx(want).epsilon(1e-5).margin(1e-5));
              }
            if (ld)
              for (std::int64_t m = 0; m < M; ++m)
                for (std::int64_t n = N; n < ldc; ++n) REQUIRE(c[static_cast<std::size_t>(m * ldc + n)] == 0.5f);  // untouched
          }
  }
  CHECK(sc::num_threads() == 3);  // OpenBLAS's and stagecraft's thread count unchanged
  sc::set_blas_split_flops(-1);   // clamped: off
  CHECK(sc::blas_split_flops() == 0);
  sc::set_blas_split_flops(saved);
}

TEST_CASE("random numbers are seeded and thread-count independent", "[random]") {
  auto a = sc::random::normal({1000}, 42);
  auto b = sc::random::normal({1000}, 42);
  CHECK(a.to_vector<float>() == b.to_vector<float>());
  CHECK(a.to_vector<float>() != sc::random::normal({1000}, 43).to_vector<float>());
  std::vector<sc::Tensor> runs;
  sctest::at_threads({1, 2}, [&](int) { runs.push_back(sc::random::normal({100000}, 7)); });
  const sc::Tensor& c = runs[0];
  CHECK(c.to_vector<float>() == runs[1].to_vector<float>());
  const auto v = c.to_vector<float>();
  double mean = 0, var = 0;
  for (float x : v) mean += x;
  mean /= v.size();
  for (float x : v) var += (x - mean) * (x - mean);
  var /= v.size();
  CHECK(std::abs(mean) < 0.02);
  CHECK(std::abs(var - 1.0) < 0.02);
  auto u = sc::random::uniform({10000}, -2.0, 3.0, 1).to_vector<float>();
  for (float x : u) REQUIRE((x >= -2.f && x < 3.f));
}
