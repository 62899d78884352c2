// Regression tests for hostile and extreme inputs (issue 9): sizes that overflow, negative extents,
// untrusted files, allocation failures, numerically hard cases, and file modes kept on save.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <stagecraft/stagecraft.hpp>
#include <stagecraft/data/batcher.hpp>
#include <stagecraft/data/idx.hpp>

#include "files.hpp"
#include "testing.hpp"

namespace {
constexpr std::int64_t big = std::int64_t{1} << 62;

/// An IDX file of unsigned bytes with these extents in its header and `payload` bytes after it.
std::string idx_bytes(const std::vector<std::uint32_t>& dims, std::size_t payload) {
  std::string s = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (std::uint32_t d : dims)
    for (int k = 3; k >= 0; --k) s += static_cast<char>((d >> (8 * k)) & 0xff);
  return s + std::string(payload, '\1');
}

/// A safetensors file whose only entry has this shape (as JSON) and these data offsets.
std::string safetensors_bytes(const std::string& shape, std::uint64_t begin, std::uint64_t end, std::size_t data) {
  std::string json = "{\"t\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[" + std::to_string(begin) +
                     "," + std::to_string(end) + "]}}";
  std::string s(8, '\0');
  for (int k = 0; k < 8; ++k) s[static_cast<std::size_t>(k)] = static_cast<char>((json.size() >> (8 * k)) & 0xff);
  return s + json + std::string(data, '\0');
}
}  // namespace

TEST_CASE("shapes whose size overflows are ShapeErrors in every creation path", "[hardening]") {
  CHECK_THROWS_AS(sc::zeros({big + 1}), sc::ShapeError);
  CHECK_THROWS_AS(sc::zeros({std::int64_t{1} << 40, std::int64_t{1} << 40}), sc::ShapeError);
  CHECK_THROWS_AS(sc::ones({std::int64_t{1} << 61}, sc::f64), sc::ShapeError);  // 2^64 bytes
  CHECK_THROWS_AS(sc::full({0, 5, big}, 1.f), sc::ShapeError);  // empty, but its strides overflow
  CHECK_THROWS_WITH(sc::zeros({big + 1}), Catch::Contains("[zeros]") && Catch::Contains("too large"));
  CHECK_THROWS_AS(sc::reshape(sc::zeros({16}), {big + 4, 4}), sc::ShapeError);
  CHECK_THROWS_AS(sc::reshape(sc::zeros({0}), {0, big, 8}), sc::ShapeError);
  CHECK_THROWS_AS(sc::slice(sc::zeros({4}), {1}, {std::numeric_limits<std::int64_t>::max()}), sc::ShapeError);
  float x = 0;
  CHECK_THROWS_AS(sc::from_blob(&x, sc::Shape{big, 4}, sc::f32), sc::ShapeError);
  // what stays valid
  CHECK(sc::zeros({0, 5, 7}).numel() == 0);
  CHECK(sc::reshape(sc::zeros({16}), {4, -1}).shape() == sc::Shape{4, 4});
  CHECK(sc::slice(sc::arange(4), {1}, {-1}).to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 2, 3});
}

TEST_CASE("negative extents are ShapeErrors", "[hardening]") {
  CHECK_THROWS_AS(sc::tensor(std::vector<float>{1, 2, 3, 4}, sc::Shape{-2, -2}), sc::ShapeError);
  CHECK_THROWS_WITH(sc::tensor(std::vector<float>{1, 2, 3, 4}, sc::Shape{-2, -2}),
                    Catch::Contains("[tensor]") && Catch::Contains("negative extent") &&
                        Catch::Contains("test_hardening.cpp"));
  CHECK_THROWS_AS(sc::random::permutation(-5), sc::ShapeError);
  CHECK_THROWS_AS(sc::zeros({3, -1}), sc::ShapeError);
  CHECK_THROWS_AS(sc::eye(-1), sc::ShapeError);
}

TEST_CASE("arange with an infinite or huge count is an error, not an allocation", "[hardening]") {
  CHECK_THROWS_AS(sc::arange(0.0, INFINITY, 1.0, sc::f64), sc::ValueError);
  CHECK_THROWS_AS(sc::arange(0.0, 1.0, NAN, sc::f64), sc::ValueError);
  CHECK_THROWS_AS(sc::arange(0.0, 1e300, 1.0, sc::f64), sc::ShapeError);
  CHECK_THROWS_AS(sc::arange(0.0, 1.0, 1e-300, sc::f64), sc::ShapeError);
  CHECK(sc::arange(0.0, 3.0, 1.0, sc::f64).numel() == 3);
}

TEST_CASE("a failed allocation is a DeviceError, leaks nothing and leaves the peak", "[hardening]") {
  const std::size_t peak = sc::memory_stats().peak_bytes_in_use, in_use = sc::memory_stats().bytes_in_use;
  // 2^61 bytes: a valid shape, more memory than any machine has
  CHECK_THROWS_AS(sc::zeros({std::int64_t{1} << 59}), sc::DeviceError);
  CHECK_THROWS_WITH(sc::zeros({std::int64_t{1} << 59}),
                    Catch::Contains("[zeros] out of memory") && Catch::Contains("[576460752303423488]"));
  CHECK(sc::memory_stats().peak_bytes_in_use == peak);
  CHECK(sc::memory_stats().bytes_in_use == in_use);
  // the allocator itself: a request whose size class would wrap
  CHECK_THROWS_AS(sc::detail::CachingAllocator::instance().allocate(std::numeric_limits<std::size_t>::max()),
                  std::bad_alloc);
  CHECK(sc::detail::CachingAllocator::round(std::size_t{1} << 62) == std::size_t{1} << 62);
  CHECK(sc::sum(sc::zeros({3})).item<float>() == 0.f);  // still works afterwards
}

TEST_CASE("IDX headers whose extents overflow are IOErrors", "[hardening]") {
  sctest::TempDir dir;
  const std::string p = dir / "evil.idx";
  // the product of these extents wraps to a small number in 64 bits
  sctest::write_bytes(p, idx_bytes({32, 3, 2833, 37171, 1824726041u}, 16));
  CHECK_THROWS_AS(sc::data::read_idx(p), sc::IOError);
  CHECK_THROWS_WITH(sc::data::read_idx(p), Catch::Contains("corrupt"));
  sctest::write_bytes(p, idx_bytes({2, 3}, 6));
  CHECK(sc::data::read_idx(p).shape == sc::Shape{2, 3});
  // An empty tensor's other extents count too (found by fuzz/fuzz_idx): no payload, but a shape
  // no tensor may have, which was a ShapeError from read_idx_tensor instead of an IOError.
  sctest::write_bytes(p, idx_bytes({0, 0xffffffffu, 0xffffffffu, 0xffffffffu}, 0));
  CHECK_THROWS_AS(sc::data::read_idx(p), sc::IOError);
  CHECK_THROWS_AS(sc::data::read_idx_tensor(p, false), sc::IOError);
  // 2^62 bytes as unsigned bytes, but 2^64 as f32 and 2^65 as i64
  sctest::write_bytes(p, idx_bytes({0, 1u << 31, 1u << 31}, 0));
  CHECK(sc::data::read_idx(p).shape == sc::Shape{0, std::int64_t{1} << 31, std::int64_t{1} << 31});
  CHECK_THROWS_WITH(sc::data::read_idx_tensor(p, false), Catch::Contains("corrupt") && Catch::Contains("f32"));
  CHECK_THROWS_AS(sc::data::read_idx_tensor(p, true), sc::IOError);
  sctest::write_bytes(p, idx_bytes({0, 5}, 0));  // an ordinary empty file still reads
  CHECK(sc::data::read_idx_tensor(p, true).shape() == sc::Shape{0, 5});
}

TEST_CASE("safetensors entries with overflowing or huge empty shapes are IOErrors", "[hardening]") {
  sctest::TempDir dir;
  const std::string p = dir / "evil.safetensors";
  sctest::write_bytes(p, safetensors_bytes("[0,5,4611686018427387904]", 0, 0, 0));
  CHECK_THROWS_AS(sc::load_safetensors(p), sc::IOError);
  sctest::write_bytes(p, safetensors_bytes("[4294967296,4294967296]", 0, 0, 0));
  CHECK_THROWS_AS(sc::load_safetensors(p), sc::IOError);
  sctest::write_bytes(p, safetensors_bytes("[0,5]", 0, 0, 0));
  CHECK(sc::load_safetensors(p).tensors.at("t").shape() == sc::Shape{0, 5});
}

TEST_CASE("Batcher with a huge batch size has one batch", "[hardening]") {
  const sc::Tensor x = sc::zeros({5, 2}), y = sc::zeros({5}, sc::i64);
  sc::data::Batcher b(x, y, std::numeric_limits<std::int64_t>::max());
  CHECK(b.batches_per_epoch() == 1);
  const auto batch = b.next();
  REQUIRE(batch.has_value());
  CHECK(batch->x.shape() == sc::Shape{5, 2});
  CHECK_FALSE(b.next().has_value());
  sc::data::Batcher d(x, y, 2, 0, true, /*drop_last=*/true);
  CHECK(d.batches_per_epoch() == 2);
  CHECK(sc::data::Batcher(x, y, 2).batches_per_epoch() == 3);
}

TEST_CASE("Batcher over billions of empty rows makes no permutation of them", "[hardening]") {
  // An IDX file may claim 4e9 rows of nothing; a permutation of them would be 32 GB.
  const std::int64_t n = 4'000'000'000LL;
  const sc::Tensor x = sc::zeros({n, 0}), y = sc::zeros({n, 3, 0}, sc::i32);
  sc::data::Batcher b(x, y, 1'500'000'000LL, /*seed=*/7);
  CHECK(b.batches_per_epoch() == 3);
  std::vector<std::int64_t> rows;
  while (const auto batch = b.next()) {
    CHECK(batch->x.shape() == sc::Shape{batch->x.shape()[0], 0});
    CHECK(batch->y.shape() == sc::Shape{batch->x.shape()[0], 3, 0});
    rows.push_back(batch->x.shape()[0]);
  }
  CHECK(rows == std::vector<std::int64_t>{1'500'000'000LL, 1'500'000'000LL, 1'000'000'000LL});
  b.start_epoch(1);
  CHECK(b.next().has_value());
  // Rows with elements in either tensor are still shuffled: every row once, not in order.
  sc::data::Batcher c(sc::zeros({6, 0}), sc::arange<std::int64_t>(6), 6, /*seed=*/3);
  std::vector<std::int64_t> got = c.next()->y.to_vector<std::int64_t>();
  CHECK(got != std::vector<std::int64_t>{0, 1, 2, 3, 4, 5});
  std::sort(got.begin(), got.end());
  CHECK(got == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5});
}

TEST_CASE("IDX reader and Batcher errors name the op and the caller's line", "[hardening]") {
  using sctest::error_of;
  const auto at = [](int line) { return "test_hardening.cpp:" + std::to_string(line); };
  sctest::TempDir dir;
  const std::string p = dir / "short.idx";
  sctest::write_bytes(p, idx_bytes({2, 3}, 5));  // one payload byte short
  // These were "[read_idx] ..." with no line at all.
  int line = __LINE__ + 1;
  std::string msg = error_of<sc::IOError>([&] { (void)sc::data::read_idx(p); });
  CHECK_THAT(msg, Catch::Contains("[read_idx]") && Catch::Contains("corrupt") && Catch::Contains("5 payload bytes") &&
                      Catch::Contains(at(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::IOError>([&] { (void)sc::data::read_idx_tensor(p, true); });
  CHECK_THAT(msg, Catch::Contains("[read_idx]") && Catch::Contains(at(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::IOError>([&] { (void)sc::data::read_idx((dir / "none.idx").string()); });
  CHECK_THAT(msg, Catch::Contains("no such file") && Catch::Contains(at(line)));
  // A directory was "corrupt compressed data ... Is a directory".
  line = __LINE__ + 1;
  msg = error_of<sc::IOError>([&] { (void)sc::data::read_idx(dir.path.string()); });
  CHECK_THAT(msg, Catch::Contains("not a regular file") && Catch::Contains(at(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::IOError>([&] { (void)sc::data::load_fashion_mnist(dir.path.string()); });
  CHECK_THAT(msg, Catch::Contains("[load_fashion_mnist] missing") && Catch::Contains(at(line)));
  // An undefined tensor was "[tensor] the tensor is undefined ... at batcher.hpp".
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { sc::data::Batcher b(sc::Tensor(), sc::zeros({5}), 2); });
  CHECK_THAT(msg, Catch::Contains("[Batcher]") && Catch::Contains(at(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { sc::data::Batcher b(sc::zeros({5}), sc::Tensor(), 2); });
  CHECK_THAT(msg, Catch::Contains("[Batcher]") && Catch::Contains(at(line)));
}

TEST_CASE("log_softmax and cross_entropy keep their precision for large logits", "[hardening]") {
  const sc::Tensor x = sc::tensor({1e7f, 1e7f});
  const auto v = sc::nn::log_softmax(x).to_vector<float>();
  CHECK(v[0] == Approx(-std::log(2.0)).epsilon(1e-6));
  CHECK(v[1] == Approx(-std::log(2.0)).epsilon(1e-6));
  const sc::Tensor logits = sc::tensor({{1e7f, 1e7f, 1e7f - 1.f}});
  const double lse = std::log(2.0 + std::exp(-1.0));
  CHECK(sc::nn::cross_entropy(logits, sc::tensor(std::vector<std::int64_t>{0})).item<float>() ==
        Approx(lse).epsilon(1e-5));
  CHECK(sc::nn::cross_entropy(logits, sc::tensor(std::vector<std::int64_t>{2})).item<float>() ==
        Approx(lse + 1.0).epsilon(1e-5));
  // the gradient is still softmax - one_hot
  sc::Tensor z = sc::tensor({{1.f, 2.f, 3.f}});
  sc::GradientTape tape;
  tape.watch(z);
  const sc::Tensor loss = sc::nn::cross_entropy(z, sc::tensor(std::vector<std::int64_t>{1}));
  const auto g = tape.gradient(loss, z).to_vector<float>();
  const double e1 = std::exp(1.0), e2 = std::exp(2.0), e3 = std::exp(3.0), s = e1 + e2 + e3;
  CHECK(g[0] == Approx(e1 / s));
  CHECK(g[1] == Approx(e2 / s - 1.0));
  CHECK(g[2] == Approx(e3 / s));
}

TEST_CASE("saving a checkpoint keeps the file's mode and writes through a symlink", "[hardening]") {
  sctest::TempDir dir;
  const std::string real = dir / "real.safetensors", link = dir / "link.safetensors";
  sc::save_safetensors(real, {{"a", sc::ones({2})}});
  REQUIRE(::chmod(real.c_str(), 0600) == 0);
  std::filesystem::create_symlink("real.safetensors", link);
  sc::save_safetensors(link, {{"a", sc::full({3}, 2.f)}});
  CHECK(std::filesystem::is_symlink(link));
  struct ::stat st {};
  REQUIRE(::stat(real.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  CHECK(sc::load_safetensors(real).tensors.at("a").to_vector<float>() == std::vector<float>{2, 2, 2});
  // the same through sc::Checkpoint
  sc::Variable v(sc::ones({2}), "v");
  sc::Checkpoint ck;
  ck.track("v", v);
  ck.save(link);
  CHECK(std::filesystem::is_symlink(link));
  REQUIRE(::stat(real.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  CHECK(dir.files() == std::vector<std::string>{"link.safetensors", "real.safetensors"});
}

TEST_CASE("undefined tensors and empty variables raise ValueError instead of crashing", "[hardening]") {
  sc::Tensor t;
  CHECK_THROWS_AS(t.shape(), sc::ValueError);
  CHECK_THROWS_AS(t.dtype(), sc::ValueError);
  CHECK_THROWS_AS(t.numel(), sc::ValueError);
  CHECK_THROWS_AS(t.rank(), sc::ValueError);
  CHECK_THROWS_AS(t.device(), sc::ValueError);
  CHECK_THROWS_AS(t + 1.f, sc::ValueError);
  CHECK_THROWS_AS(sc::exp(t), sc::ValueError);
  CHECK(t.raw_data() == nullptr);
  sc::Variable v;
  CHECK_THROWS_AS(v + 1.f, sc::ValueError);
  CHECK_THROWS_AS(v.shape(), sc::ValueError);
  CHECK_THROWS_AS(v.name(), sc::ValueError);
  CHECK_THROWS_WITH(v.value(), Catch::Contains("[Variable]") && Catch::Contains("empty"));
  CHECK_THROWS_AS(v.assign(sc::ones({2})), sc::ValueError);
}

TEST_CASE("undefined tensors, empty variables and failed allocations name the op and the user's line", "[hardening]") {
  const auto here = [](int line) { return "test_hardening.cpp:" + std::to_string(line); };
  sc::Tensor t;
  int line = __LINE__ + 1;
  CHECK_THROWS_WITH(t.shape(), Catch::Contains("[tensor] the tensor is undefined") && Catch::Contains(here(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(t.numel(), Catch::Contains(here(line)));
  sc::Variable v;
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::exp(v), Catch::Contains("[exp] got an undefined tensor") && Catch::Contains("empty sc::Variable") &&
                                     Catch::Contains(here(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(v + 1.f, Catch::Contains(here(line)));
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(1.f * v, Catch::Contains(here(line)));
  // The op that would make the too-large result, at the user's line (not the allocator's).
  const sc::Tensor col = sc::reshape(sc::ones({1 << 19}), {-1, 1}), row = sc::reshape(sc::ones({1 << 19}), {1, -1});
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::matmul(col, row), Catch::Contains("[matmul] out of memory") &&
                                              Catch::Contains("[524288, 524288]") && Catch::Contains(here(line)));
  CHECK_THROWS_AS(sc::matmul(col, row), sc::DeviceError);
  line = __LINE__ + 1;
  CHECK_THROWS_WITH(sc::one_hot(sc::tensor({1}), std::int64_t{1} << 61),
                    Catch::Contains("[one_hot] shape [1, 2305843009213693952] is too large") && Catch::Contains(here(line)));
}

TEST_CASE("integer full and arange are exact beyond 2^53", "[hardening]") {
  constexpr std::int64_t odd = (std::int64_t{1} << 53) + 1;  // not a double
  CHECK(sc::full({2}, odd).to_vector<std::int64_t>() == std::vector<std::int64_t>{odd, odd});
  CHECK(sc::full({1}, std::numeric_limits<std::int64_t>::max()).item<std::int64_t>() ==
        std::numeric_limits<std::int64_t>::max());
  CHECK(sc::arange(odd, odd + 3).to_vector<std::int64_t>() == std::vector<std::int64_t>{odd, odd + 1, odd + 2});
  constexpr std::int64_t lo = std::numeric_limits<std::int64_t>::min(), hi = std::numeric_limits<std::int64_t>::max();
  CHECK(sc::arange(lo, lo + 2).to_vector<std::int64_t>() == std::vector<std::int64_t>{lo, lo + 1});
  CHECK(sc::arange(hi - 2, hi).to_vector<std::int64_t>() == std::vector<std::int64_t>{hi - 2, hi - 1});
  CHECK(sc::arange(hi, hi - 5, std::int64_t{-2}).to_vector<std::int64_t>() == std::vector<std::int64_t>{hi, hi - 2, hi - 4});
  CHECK(sc::arange(std::int64_t{10}, std::int64_t{0}, std::int64_t{-3}).to_vector<std::int64_t>() ==
        std::vector<std::int64_t>{10, 7, 4, 1});
  CHECK(sc::arange(std::int64_t{0}, std::int64_t{5}, std::int64_t{-1}).numel() == 0);
  CHECK(sc::arange(7).to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6});
  CHECK(sc::arange(3).dtype() == sc::i64);
  CHECK_THROWS_AS(sc::arange(std::int64_t{0}, std::int64_t{5}, std::int64_t{0}), sc::ValueError);
  CHECK_THROWS_AS(sc::arange(lo, hi), sc::ShapeError);  // 2^64 elements
}

TEST_CASE("float to integer conversions in full, item and to_vector follow cast's rule", "[hardening]") {
  constexpr std::int32_t lo32 = std::numeric_limits<std::int32_t>::min();
  constexpr std::int64_t lo64 = std::numeric_limits<std::int64_t>::min();
  CHECK(sc::full({3}, NAN, sc::i32).to_vector<std::int32_t>() == std::vector<std::int32_t>{lo32, lo32, lo32});
  CHECK(sc::full({1}, 1e30, sc::i64).item<std::int64_t>() == lo64);
  CHECK(sc::full({1}, -7.9, sc::i32).item<std::int32_t>() == -7);
  const sc::Tensor x = sc::tensor({NAN, INFINITY, -1e20f, 2.5f});
  CHECK(x.to_vector<std::int32_t>() == std::vector<std::int32_t>{lo32, lo32, lo32, 2});
  CHECK(x.to_vector<std::int64_t>() == std::vector<std::int64_t>{lo64, lo64, lo64, 2});
  CHECK(x.to_vector<std::int32_t>() == sc::cast(x, sc::i32).to_vector<std::int32_t>());
  CHECK(sc::tensor({1e20}).item<std::int64_t>() == lo64);
  CHECK(sc::scalar(NAN).item<std::int32_t>() == lo32);
}

TEST_CASE("weak integer scalars that do not fit the tensor's dtype are errors, not wraps", "[hardening]") {
  const sc::Tensor a = sc::tensor(std::vector<std::int32_t>{1, 2});
  CHECK_THROWS_AS(a + 3000000000LL, sc::DTypeError);
  CHECK_THROWS_WITH(a * -3000000000LL, Catch::Contains("[mul] the integer -3000000000") && Catch::Contains("i32") &&
                                           Catch::Contains("test_hardening.cpp"));
  CHECK_THROWS_WITH(sc::maximum(a, 3000000000LL), Catch::Contains("[maximum]"));
  CHECK_THROWS_WITH(sc::where(a > 1, a, 3000000000LL), Catch::Contains("[where]"));
  CHECK((a + 2000000000LL).to_vector<std::int32_t>() == std::vector<std::int32_t>{2000000001, 2000000002});
  CHECK((a + -2147483648LL).to_vector<std::int32_t>() == std::vector<std::int32_t>{-2147483647, -2147483646});
  CHECK_THROWS_AS(a - 2147483648LL, sc::DTypeError);
  CHECK((sc::tensor(std::vector<std::int64_t>{1}) + 3000000000LL).item<std::int64_t>() == 3000000001LL);
}

TEST_CASE("random::uniform refuses ranges that overflow or are not numbers", "[hardening]") {
  CHECK_THROWS_AS(sc::random::uniform({4}, -1e308, 1e308, 1, sc::f64), sc::ValueError);
  CHECK_THROWS_AS(sc::random::uniform({4}, 0.0, NAN, 1), sc::ValueError);
  CHECK_THROWS_AS(sc::random::uniform({4}, NAN, 1.0, 1), sc::ValueError);
  CHECK_THROWS_AS(sc::random::uniform({4}, 0.0, INFINITY, 1), sc::ValueError);
  const auto u = sc::random::uniform({64}, -1e300, 1e300, 1, sc::f64).to_vector<double>();
  for (double v : u) CHECK(std::isfinite(v));
}

TEST_CASE("exp and sigmoid give the same tiny results at every length (no SIMD-body vs tail split)", "[hardening]") {
  for (float v : {-88.5f, -87.5f, -100.f, -103.9f}) {
    const float e1 = sc::exp(sc::tensor({v})).item<float>(), s1 = sc::sigmoid(sc::tensor({v})).item<float>();
    for (std::int64_t n : {3, 8, 16, 17, 33, 1000, 70001}) {
      const auto e = sc::exp(sc::full({n}, v)).to_vector<float>();
      const auto s = sc::sigmoid(sc::full({n}, v)).to_vector<float>();
      for (std::int64_t i : {std::int64_t{0}, n / 2, n - 1}) {
        CHECK(std::memcmp(&e[static_cast<std::size_t>(i)], &e1, sizeof e1) == 0);
        CHECK(std::memcmp(&s[static_cast<std::size_t>(i)], &s1, sizeof s1) == 0);
      }
    }
  }
}

TEST_CASE("signed integer overflow wraps the same in SIMD bodies and scalar tails", "[hardening]") {
  constexpr std::int32_t mx = std::numeric_limits<std::int32_t>::max(), mn = std::numeric_limits<std::int32_t>::min();
  constexpr std::int64_t mx64 = std::numeric_limits<std::int64_t>::max(), mn64 = std::numeric_limits<std::int64_t>::min();
  for (std::int64_t n : {1, 7, 17, 1000}) {
    const sc::Tensor a = sc::full({n}, 0.0, sc::i32) + mx;
    const sc::Tensor lo = sc::full({n}, 0.0, sc::i32) + mn;
    const sc::Tensor a64 = sc::full({n}, 0.0, sc::i64) + mx64, lo64 = sc::full({n}, 0.0, sc::i64) + mn64;
    const auto all = [](const sc::Tensor& t, auto v) {
      for (auto x : t.to_vector<decltype(v)>())
        if (x != v) return false;
      return true;
    };
    CHECK(all(a + 1, mn));
    CHECK(all(lo - 1, mx));
    CHECK(all(a * 2, std::int32_t{-2}));
    CHECK(all(-lo, mn));
    CHECK(all(sc::abs(lo), mn));
    CHECK(all(sc::square(a), std::int32_t{1}));
    CHECK(all(sc::pow(a, sc::full({n}, 2.0, sc::i32)), std::int32_t{1}));
    CHECK(all(a64 + 1, mn64));
    CHECK(all(lo64 * 3, std::int64_t{mn64}));  // -2^63 * 3 = -3 * 2^63 = 2^63 (mod 2^64) = -2^63
    CHECK(all(-lo64, mn64));
  }
}

TEST_CASE("float to integer casts of NaN, infinities and out-of-range values are defined", "[hardening]") {
  const std::vector<float> bad = {NAN, INFINITY, -INFINITY, 3e9f, -3e9f, 1e20f, -1e20f, 2147483648.f};
  for (std::int64_t reps : {1, 3, 100}) {  // scalar and SIMD paths
    std::vector<float> v;
    for (std::int64_t r = 0; r < reps; ++r) v.insert(v.end(), bad.begin(), bad.end());
    const sc::Tensor x = sc::tensor(v);
    for (std::int32_t i : sc::cast(x, sc::i32).to_vector<std::int32_t>()) CHECK(i == std::numeric_limits<std::int32_t>::min());
    for (std::int64_t i : sc::cast(x, sc::i64).to_vector<std::int64_t>()) {
      const bool fits = i == std::int64_t{3000000000} || i == -std::int64_t{3000000000} || i == std::int64_t{2147483648};
      CHECK((i == std::numeric_limits<std::int64_t>::min() || fits));
    }
    const sc::Tensor d = sc::cast(x, sc::f64);
    for (std::int64_t i : sc::cast(d, sc::i64).to_vector<std::int64_t>()) {
      const bool fits = i == std::int64_t{3000000000} || i == -std::int64_t{3000000000} || i == std::int64_t{2147483648};
      CHECK((i == std::numeric_limits<std::int64_t>::min() || fits));
    }
  }
  CHECK(sc::cast(sc::tensor({-2.9f, 2.9f, -2147483648.f}), sc::i32).to_vector<std::int32_t>() ==
        std::vector<std::int32_t>{-2, 2, std::numeric_limits<std::int32_t>::min()});
}

TEST_CASE("a tape destroyed on another thread or out of order leaves nothing dangling", "[hardening][threads]") {
  const sc::Tensor x = sc::tensor({1.0, 2.0, 3.0});
  // Made here, destroyed on another thread: this thread's ops then record on no dead tape (an
  // ASan build reported a use-after-free on the next op before).
  auto far = std::make_unique<sc::GradientTape>();
  far->watch(x);
  (void)(x * x);
  std::thread([&] { far.reset(); }).join();
  const sc::Tensor y = x * x;  // would record on the freed tape
  // Out of order on one thread: the outer tape ends first, the inner one goes on recording.
  auto outer = std::make_unique<sc::GradientTape>();
  auto inner = std::make_unique<sc::GradientTape>();
  outer->watch(x);
  inner->watch(x);
  outer.reset();
  const sc::Tensor z = x * x * x;
  CHECK(inner->gradient(z, x).to_vector<double>() == std::vector<double>{3, 12, 27});
  inner.reset();
  sc::GradientTape after;
  after.watch(x);
  CHECK(after.gradient(x * y, x).to_vector<double>() == std::vector<double>{1, 4, 9});
}

TEST_CASE("a tape used on a thread other than its own is a ValueError", "[hardening][threads]") {
  const sc::Tensor x = sc::tensor({1.0, 2.0});
  sc::GradientTape tape;
  tape.watch(x);
  const sc::Tensor y = x * x;
  std::string message;
  std::thread([&] {
    try {
      (void)tape.gradient(y, x);
    } catch (const sc::ValueError& e) {
      message = e.what();
    }
  }).join();
  CHECK_THAT(message, Catch::Contains("another thread"));
  // The tape is untouched: its own thread differentiates it as usual.
  CHECK(tape.gradient(y, x).to_vector<double>() == std::vector<double>{2, 4});
}

TEST_CASE("reset() or gradient() of a tape from inside its own gradient() is a ValueError", "[hardening]") {
  const sc::Tensor x = sc::tensor({1.0, 2.0});
  sc::GradientTape tape(/*persistent=*/true);
  tape.watch(x);
  bool reset_raised = false, nested_raised = false;
  const sc::Tensor y = sc::custom_gradient(
      [](const std::vector<sc::Tensor>& xs) { return xs[0] * 2.0; },
      [&](const sc::Tensor& g, const std::vector<sc::Tensor>&, const sc::Tensor& out) {
        try {
          tape.reset();
        } catch (const sc::ValueError& e) {
          reset_raised = std::string(e.what()).find("GradientTape::reset") != std::string::npos;
        }
        try {
          (void)tape.gradient(out, x);
        } catch (const sc::ValueError&) {
          nested_raised = true;
        }
        return std::vector<sc::Tensor>{g * 2.0};
      },
      {x});
  CHECK(tape.gradient(y, x).to_vector<double>() == std::vector<double>{2, 2});
  CHECK(reset_raised);
  CHECK(nested_raised);
  // Still usable (persistent), and reset() works once gradient() has returned.
  CHECK(tape.gradient(y, x).to_vector<double>() == std::vector<double>{2, 2});
  tape.reset();
  CHECK(tape.size() == 0);
}

TEST_CASE("DeviceScopes ended out of order or on another thread leave the right device", "[hardening][threads]") {
  // No GPU is needed: a scope only pins the device new tensors would go to.
  REQUIRE(sc::current_device() == sc::Device::cpu());
  auto a = std::make_unique<sc::DeviceScope>(sc::Device::cuda(1));
  auto b = std::make_unique<sc::DeviceScope>(sc::Device::cuda(2));
  a.reset();  // out of order: b stays in force
  CHECK(sc::current_device() == sc::Device::cuda(2));
  b.reset();
  CHECK(sc::current_device() == sc::Device::cpu());
  // Ended on another thread: the owner thread keeps a valid device until its next scope change.
  auto c = std::make_unique<sc::DeviceScope>(sc::Device::cuda(3));
  std::thread([&] { c.reset(); }).join();
  CHECK(sc::current_device() == sc::Device::cuda(3));
  { sc::DeviceScope d(sc::Device::cuda(4)); CHECK(sc::current_device() == sc::Device::cuda(4)); }
  CHECK(sc::current_device() == sc::Device::cpu());
}

TEST_CASE("variables read on two threads while a third assigns them see whole values", "[hardening][threads]") {
  constexpr int n = 256, rounds = 400;
  sc::Variable v(sc::full({n}, 0.0, sc::f32), "v");
  std::atomic<bool> done{false};
  std::atomic<int> torn{0}, reads{0};
  auto reader = [&] {
    while (!done.load()) {
      const sc::Tensor t = v.value();
      const std::vector<float> e = t.to_vector<float>();
      for (float f : e)
        if (f != e[0]) ++torn;
      const sc::Tensor s = sc::sum(v);  // an op reading the variable directly
      if (std::fmod(s.item<float>(), static_cast<float>(n)) != 0.f) ++torn;
      ++reads;
    }
  };
  std::thread r1(reader), r2(reader);
  std::thread w([&] {
    for (int k = 1; k <= rounds; ++k) v.assign(sc::full({n}, static_cast<double>(k), sc::f32));
    for (int k = 0; k < 50 && reads.load() < 20; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    done = true;
  });
  w.join();
  r1.join();
  r2.join();
  CHECK(torn.load() == 0);
  CHECK(reads.load() > 0);
  CHECK(v.value().to_vector<float>()[0] == static_cast<float>(rounds));
}

TEST_CASE("device placement stats: CPU work copies nothing, strict mode lets it run", "[hardening][device]") {
  sc::reset_device_stats();
  sc::set_strict_device_placement(true);
  CHECK(sc::strict_device_placement());
  {
    sc::DeviceScope on(sc::Device::cpu());
    const sc::Tensor y = sc::ones({4, 5}) * 3 + sc::arange(5);
    CHECK(y.device() == sc::Device::cpu());
  }
  sc::set_strict_device_placement(false);
  CHECK_FALSE(sc::strict_device_placement());
  CHECK(sc::device_stats().implicit_copies == 0);
  CHECK(sc::device_stats().implicit_copy_bytes == 0);
  // Without CUDA (or a GPU) a scope on a GPU is still the clear DeviceError, strict or not.
  if (!sc::cuda::is_available()) {
    sc::DeviceScope on(sc::Device::cuda(0));
    CHECK_THROWS_AS(sc::ones({2}) + 1, sc::DeviceError);
    CHECK(sc::device_stats().implicit_copies == 0);
  }
}
