// The creation ops: fill (every dtype and shape, its use in gradient rules) and random_normal /
// random_uniform (the values of the seeded calls before they became ops, the generators,
// sc::manual_seed, concurrent draws, errors).
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "testing.hpp"

namespace {

using sc::Shape;
using sc::Tensor;
using sctest::error_of;

std::vector<double> v(const Tensor& t) { return t.to_vector<double>(); }

}  // namespace

TEST_CASE("fill: every dtype and shape, rank 0 and empty included", "[fill]") {
  for (sc::DType d : {sc::boolean, sc::i32, sc::i64, sc::f32, sc::f64})
    for (const Shape& s : {Shape{}, Shape{0}, Shape{3}, Shape{2, 0, 4}, Shape{2, 3}, Shape{4, 1, 2, 3}, Shape{1000, 7}})
      for (double value : {0.0, 1.0, -3.0, 2.5}) {
        INFO(sc::name(d) << " " << sctest::str(s) << " value " << value);
        const Tensor t = sc::detail::fill(s, value, d);
        CHECK(t.dtype() == d);
        CHECK(t.shape() == s);
        CHECK(t.device() == sc::Device::cpu());
        CHECK(!t.is_symbolic());
        const double want = d == sc::boolean ? (value != 0 ? 1.0 : 0.0) : sc::is_integral(d) ? std::trunc(value) : value;
        const std::vector<double> got = v(t);
        REQUIRE(static_cast<std::int64_t>(got.size()) == s.numel());
        CHECK(std::all_of(got.begin(), got.end(), [&](double x) { return x == want; }));
        // The same values as the concrete creation function it stands in for.
        CHECK(got == v(sc::full(s, value, d)));
      }
  CHECK(std::isnan(sc::detail::fill({2}, std::nan(""), sc::f32).to_vector<float>()[1]));
  // A value an integer dtype cannot hold (NaN, infinities, out of range) gives its lowest value, as
  // cast() and full() do (README); fill and arange converted with static_cast, which is undefined.
  const double inf = std::numeric_limits<double>::infinity();
  const std::int32_t lo32 = std::numeric_limits<std::int32_t>::min();
  const std::int64_t lo64 = std::numeric_limits<std::int64_t>::min();
  for (double value : {std::nan(""), inf, -inf, 3e9, -3e9, 1e300}) {
    INFO("value " << value);
    CHECK(sc::detail::fill({3}, value, sc::i32).to_vector<std::int32_t>() == std::vector<std::int32_t>(3, lo32));
    CHECK(sc::full({3}, value, sc::i32).to_vector<std::int32_t>() == std::vector<std::int32_t>(3, lo32));
  }
  for (double value : {std::nan(""), inf, 1e19, -1e19})
    CHECK(sc::detail::fill({2}, value, sc::i64).to_vector<std::int64_t>() == std::vector<std::int64_t>(2, lo64));
  CHECK(sc::arange(0.0, 6e9, 1.5e9, sc::i32).to_vector<std::int32_t>() ==
        std::vector<std::int32_t>{0, 1500000000, lo32, lo32});
  CHECK(sc::arange(-2e19, 0.0, 1e19, sc::i64).to_vector<std::int64_t>() == std::vector<std::int64_t>{lo64, lo64});
  CHECK(sc::detail::fill({}, -std::numeric_limits<double>::infinity(), sc::f64).item<double>() ==
        -std::numeric_limits<double>::infinity());
}

TEST_CASE("fill: a negative extent names the op and the caller's line", "[fill]") {
  const std::string msg = error_of<sc::ShapeError>([] { sc::detail::fill({2, -1}, 0.0, sc::f32); });
  CHECK(msg.find("[fill]") != std::string::npos);
  CHECK(msg.find("test_fill_random.cpp") != std::string::npos);
}

TEST_CASE("fill: the tape's seed and the zeros of unconnected sources", "[fill][autodiff]") {
  const Tensor x = sc::tensor({1.0, 2.0, 3.0});
  const Tensor unused = sc::tensor({{1.f, 2.f}, {3.f, 4.f}});
  sc::GradientTape tape(/*persistent=*/true);
  tape.watch(x);
  tape.watch(unused);
  const Tensor y = sc::square(x);
  CHECK(v(tape.gradient(y, x)) == std::vector<double>{2, 4, 6});  // seeded with ones of y's shape
  const Tensor z = tape.gradient(y, unused);
  CHECK(z.dtype() == sc::f32);
  CHECK(z.shape() == Shape{2, 2});
  CHECK(v(z) == std::vector<double>(4, 0.0));
}

TEST_CASE("fill: the gradient rules written with it (sum, gather, slice) give the same values", "[fill][autodiff]") {
  const Tensor x = sctest::uniform_tensor({3, 4, 2}, 5, -1, 1);
  sc::GradientTape tape(/*persistent=*/true);
  tape.watch(x);
  // sum over a middle axis without keepdims: the gradient is broadcast back (was * ones).
  const Tensor s = sc::sum(x, {1});
  CHECK(v(tape.gradient(s, x)) == std::vector<double>(24, 1.0));
  const Tensor s_all = sc::sum(x * 2.0);
  CHECK(v(tape.gradient(s_all, x)) == std::vector<double>(24, 2.0));
  // gather: picked rows accumulate into zeros.
  const Tensor g = sc::gather(x, sc::tensor({2, 0, 2}), 0);
  std::vector<double> want(24, 0.0);
  for (int i = 0; i < 8; ++i) {
    want[i] = 1;
    want[16 + i] = 2;
  }
  CHECK(v(tape.gradient(g, x)) == want);
  // slice: the box gets the gradient, zero blocks around it.
  const Tensor sl = sc::slice(x, {1, 1, 0}, {1, 2, -1});
  std::vector<double> box(24, 0.0);
  for (int j = 1; j < 3; ++j)
    for (int k = 0; k < 2; ++k) box[8 + j * 2 + k] = 1;
  CHECK(v(tape.gradient(sl, x)) == box);
}

// Values of the seeded calls computed with the implementation before random numbers became ops
// (host loops in core/random.hpp), Release with -march=native. f32 values are exact; f64 ones
// are within 2 ulps (whether the compiler fuses a multiply-add depends on the flags).
TEST_CASE("random: seeded calls give the values they gave before they were ops", "[random]") {
  CHECK(sc::random::normal({5}, 42).to_vector<float>() ==
        std::vector<float>{-0.97018981f, 0.19401896f, -1.23562074f, 1.92392671f, -0.07318151f});
  CHECK(sc::random::normal({3}).to_vector<float>() == std::vector<float>{0.991137683f, -0.92466259f, -0.617608964f});
  CHECK(sc::random::uniform({6}, -2.0, 3.0, 1).to_vector<float>() ==
        std::vector<float>{2.45129585f, 2.47342348f, 0.928629756f, 1.55634034f, 1.35999131f, 2.37055969f});
  const auto big = sc::random::normal({100001}, 9).to_vector<float>();
  CHECK(big[99999] == 0.592708588f);
  CHECK(big[100000] == -0.87115562f);  // the last block is partial
  CHECK(big[12345] == -0.570529819f);
  auto close = [](const std::vector<double>& got, const std::vector<double>& want) {
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i)
      CHECK(std::fabs(got[i] - want[i]) <= 2 * std::numeric_limits<double>::epsilon() * std::fabs(want[i]));
  };
  const Tensor n64 = sc::random::normal({2, 3}, 7, 1.0, 2.0, sc::f64);
  CHECK(n64.dtype() == sc::f64);
  CHECK(n64.shape() == Shape{2, 3});
  close(v(n64), {1.0005831352811221, 0.39030602772589784, 4.5775146986602557, 3.1357449430270359, 1.7528070232775259,
                 -1.5740234390013343});
  close(v(sc::random::uniform({5}, 0.0, 1.0, 0xDEADBEEFCAFEull, sc::f64)),
        {0.67764971987344325, 0.86405189125798643, 0.70956021826714277, 0.85387385683134198, 0.54924958758056164});
  CHECK(sc::random::permutation(8, 3).to_vector<std::int64_t>() == std::vector<std::int64_t>{7, 4, 5, 1, 2, 3, 0, 6});
}

TEST_CASE("random: f64 uniform and normal are the same bits whatever the build's fused multiply-add", "[random]") {
  // lo + (hi - lo) * u with the product rounded first: a build with FMA (-march=x86-64-v3 or
  // native, and nvcc by default) gave other last bits when hi - lo is not a power of two.
  CHECK(v(sc::random::uniform({3}, -1.0, 2.3, 42, sc::f64)) ==
        std::vector<double>{1.0227676075650378, 0.54633551004808378, -0.75833526670467111});
  // normal: mean + (stddev r) cos(theta) likewise (1363 of 8000 samples differed)
  const std::vector<double> n = v(sc::random::normal({4000}, 7, 0.3, 1.7, sc::f64));
  CHECK(n[0] == 0.3004956649889538);
  CHECK(n[1] == -0.21823987643298687);
  CHECK(n[3999] == 3.4662818018790742);
}

TEST_CASE("random: an explicit seed gives the same numbers at every call, the state offset shifts the stream", "[random]") {
  CHECK(v(sc::random::normal({64}, 5)) == v(sc::random::normal({64}, 5)));
  CHECK(v(sc::random::uniform({64}, 0.0, 1.0, 5)) == v(sc::random::uniform({64}, 0.0, 1.0, 5)));
  // Block b of a draw at offset o is block o + b of the stream from offset 0.
  const std::vector<double> all = v(sc::random::normal({40}, 17, 0.0, 1.0, sc::f64));
  const std::vector<double> tail =
      v(sc::detail::random_normal(sc::detail::random_state(17, 3), {28}, 0.0, 1.0, sc::f64));
  CHECK(tail == std::vector<double>(all.begin() + 12, all.end()));
  // Empty and rank-0 draws.
  CHECK(sc::random::normal({0, 3}, 1).numel() == 0);
  CHECK(sc::random::uniform({}, 0.0, 1.0, 1).shape() == Shape{});
}

TEST_CASE("random: f32 uniform never returns hi, even when hi is within an f32 ulp", "[random]") {
  const double lo = 1.0, hi = 1.0000001;  // f32(hi) is the float right after 1
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    const auto u = sc::random::uniform({4000}, lo, hi, seed).to_vector<float>();
    CHECK(std::all_of(u.begin(), u.end(), [&](float x) { return x >= 1.0f && x < static_cast<float>(hi); }));
  }
  const auto same = sc::random::uniform({9}, 2.0, 2.0, 4).to_vector<float>();
  CHECK(std::all_of(same.begin(), same.end(), [](float x) { return x == 2.0f; }));
}

TEST_CASE("random: the global generator draws fresh numbers and repeats after manual_seed", "[random][generator]") {
  sc::random::Generator& gen = sc::random::default_generator();
  sc::manual_seed(1234);
  const std::vector<double> a = v(sc::random::normal({10}, gen));
  const std::vector<double> b = v(sc::random::normal({10}, gen));
  const std::vector<double> c = v(sc::random::uniform({7}, -1.0, 1.0, gen, sc::f64));
  CHECK(a != b);
  // The first draw after manual_seed(s) is the seeded call with s; the next continues the stream.
  CHECK(a == v(sc::random::normal({10}, 1234)));
  CHECK(b == v(sc::detail::random_normal(sc::detail::random_state(1234, 3), {10}, 0.0, 1.0, sc::f32)));
  // The state is (key, offset): 3 + 3 + 2 blocks drawn.
  CHECK(gen.state().value().to_vector<std::int64_t>() == std::vector<std::int64_t>{1234, 8});
  CHECK(!gen.state().trainable());
  sc::manual_seed(1234);
  CHECK(v(sc::random::normal({10}, gen)) == a);
  CHECK(v(sc::random::normal({10}, gen)) == b);
  CHECK(v(sc::random::uniform({7}, -1.0, 1.0, gen, sc::f64)) == c);
  sc::manual_seed(1235);
  CHECK(v(sc::random::normal({10}, gen)) != a);
  // manual_seed also restarts the seed stream layers draw from.
  sc::manual_seed(77);
  const std::uint64_t s1 = sc::nn::init::next_seed();
  sc::manual_seed(77);
  CHECK(sc::nn::init::next_seed() == s1);
}

TEST_CASE("random: a generator of one's own is independent of the global one", "[random][generator]") {
  sc::random::Generator mine(99);
  sc::manual_seed(99);
  const std::vector<double> m1 = v(sc::random::uniform({5}, 0.0, 1.0, mine));
  CHECK(m1 == v(sc::random::uniform({5}, 0.0, 1.0, 99)));
  CHECK(v(sc::random::uniform({5}, 0.0, 1.0, sc::random::default_generator())) == m1);  // untouched by mine
  CHECK(v(sc::random::uniform({5}, 0.0, 1.0, mine)) != m1);
  mine.manual_seed(99);
  CHECK(v(sc::random::uniform({5}, 0.0, 1.0, mine)) == m1);
  // An empty draw uses no blocks.
  const auto before = mine.state().value().to_vector<std::int64_t>();
  CHECK(sc::random::normal({0}, mine).numel() == 0);
  CHECK(mine.state().value().to_vector<std::int64_t>() == before);
}

TEST_CASE("random: threads drawing from the global generator get disjoint blocks", "[random][generator][threads]") {
  constexpr int draws = 200, blocks = 3, per = 4 * blocks;
  sc::manual_seed(31337);
  std::vector<std::vector<double>> got[2];
  auto worker = [&](int t) {
    for (int i = 0; i < draws; ++i)
      got[t].push_back(v(sc::random::uniform({per}, 0.0, 1.0, sc::random::default_generator(), sc::f64)));
  };
  std::thread t0(worker, 0), t1(worker, 1);
  t0.join();
  t1.join();
  // Every draw is one chunk of the stream from offset 0, and together they cover it once.
  const std::vector<double> stream = v(sc::random::uniform({2 * draws * per}, 0.0, 1.0, 31337, sc::f64));
  std::map<double, int> chunk_of_first;
  for (int k = 0; k < 2 * draws; ++k) chunk_of_first[stream[static_cast<std::size_t>(k * per)]] = k;
  std::set<int> seen;
  for (const auto& thread_draws : got)
    for (const std::vector<double>& d : thread_draws) {
      auto it = chunk_of_first.find(d.front());
      REQUIRE(it != chunk_of_first.end());
      CHECK(d == std::vector<double>(stream.begin() + it->second * per, stream.begin() + (it->second + 1) * per));
      CHECK(seen.insert(it->second).second);
    }
  CHECK(static_cast<int>(seen.size()) == 2 * draws);
  CHECK(sc::random::default_generator().state().value().to_vector<std::int64_t>() ==
        std::vector<std::int64_t>{31337, 2 * draws * blocks});
}

TEST_CASE("random: errors name the call", "[random]") {
  CHECK(error_of<sc::DTypeError>([] { sc::random::normal({2}, 1, 0.0, 1.0, sc::i32); }).find("random::normal") !=
        std::string::npos);
  CHECK(error_of<sc::ValueError>([] { sc::random::uniform({2}, 1.0, 0.0, 1); }).find("lo <= hi") != std::string::npos);
  CHECK(error_of<sc::ShapeError>([] { sc::random::uniform({-1}, 0.0, 1.0, 1); }).find("random::uniform") !=
        std::string::npos);
  // normal: a negative, NaN or infinite stddev, or an infinite mean, is an error (NumPy's and
  // PyTorch's rule), not samples of another distribution; stddev 0 gives the mean.
  CHECK(error_of<sc::ValueError>([] { sc::random::normal({2}, 1, 0.0, -1.0); }).find("[random::normal] needs stddev >= 0, got -1") !=
        std::string::npos);
  CHECK_THROWS_AS(sc::random::normal({2}, 1, 0.0, std::nan("")), sc::ValueError);
  CHECK_THROWS_AS(sc::random::normal({2}, 1, 0.0, HUGE_VAL), sc::ValueError);
  CHECK_THROWS_AS(sc::random::normal({2}, 1, -HUGE_VAL, 1.0), sc::ValueError);
  CHECK(sc::random::normal({3}, 1, 2.5, 0.0).to_vector<float>() == std::vector<float>{2.5f, 2.5f, 2.5f});
  // Misuse of the op's state input (the graph layer and direct callers reach it).
  CHECK(error_of<sc::DTypeError>([] { sc::detail::random_normal(sc::tensor({1.f, 2.f}), {2}, 0, 1, sc::f32); })
            .find("[random_normal]") != std::string::npos);
  CHECK(error_of<sc::ShapeError>([] {
          sc::detail::random_uniform(sc::tensor(std::vector<std::int64_t>{1, 2, 3}), {2}, 0, 1, sc::f32);
        }).find("[random_uniform]") != std::string::npos);
  // A failed draw does not advance the generator.
  sc::random::Generator g(3);
  CHECK_THROWS_AS(sc::random::normal({2}, g, 0.0, 1.0, sc::i64), sc::DTypeError);
  CHECK_THROWS_AS(sc::random::normal({2}, g, 0.0, -0.5), sc::ValueError);
  CHECK(g.state().value().to_vector<std::int64_t>() == std::vector<std::int64_t>{3, 0});
}

TEST_CASE("random: draws are not recorded by a tape and need no gradient", "[random][autodiff]") {
  const Tensor x = sc::tensor({1.0, 2.0});
  sc::random::Generator gen(5);
  sc::GradientTape tape;
  tape.watch(x);
  const Tensor y = x * sc::random::normal({2}, gen, 0.0, 1.0, sc::f64);
  CHECK(v(tape.gradient(sc::sum(y), x)) == v(sc::random::normal({2}, 5, 0.0, 1.0, sc::f64)));
}
