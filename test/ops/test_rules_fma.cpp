// mod and floor_div on SIMD batches of floats, which need a fused multiply-add (rules::math::fmod's
// one exact step, math::fnma_fused): this file is built with -march=x86-64-v3 (AVX2 and FMA), from
// the headers alone, so the batch forms that the baseline build leaves out run here. They must
// give the scalar forms' bits (the C library's fmod, exact), batch by batch, whatever the other
// lanes of a batch hold (an infinity, a NaN, a zero divisor or a huge quotient sends a batch lane
// by lane), and eager, traced and compile-time staged runs must agree with a plain loop. And pow on
// floats, whose multiply-adds the compiler fuses here, still the same bits (pow_floats.hpp).
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "bit_patterns.hpp"
#include "pow_floats.hpp"

namespace {

namespace r = sc::rules;
template <class T>
using B = sc::backend::cpu::batch<T>;

bool cpu_runs_this_build() {
#if defined(__AVX512F__)
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#elif defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return true;
#endif
}

template <class T>
bool same(T x, T y) {
  return std::memcmp(&x, &y, sizeof x) == 0 || (std::isnan(x) && std::isnan(y));
}

/// n pairs: random bit patterns, ordinary values (quotients up to 10^5), whole divisors, and now
/// and then a special (inf, NaN, +-0, the extremes) in either operand.
template <class T>
void operands(std::size_t n, std::vector<T>& a, std::vector<T>& b) {
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  sc_test::SplitMix64 next{12345};
  const auto unit = [&] { return next.unit<T>(); };
  const auto bits = [](std::uint64_t u) { return sc_test::SplitMix64::bits_of<T>(static_cast<U>(u)); };
  const T special[] = {std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity(),
                       std::numeric_limits<T>::quiet_NaN(), T(0), -T(0), std::numeric_limits<T>::max(),
                       std::numeric_limits<T>::denorm_min(), -std::numeric_limits<T>::min()};
  a.resize(n);
  b.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    switch (i / 4096 % 3) {  // runs of one kind, so most batches hold one kind only
      case 0: a[i] = bits(next()), b[i] = bits(next() >> (i % 8)); break;
      case 1: a[i] = (unit() - T(0.5)) * T(2000), b[i] = (unit() - T(0.5)) * T(0.02); break;
      default: a[i] = (unit() - T(0.5)) * T(2000), b[i] = std::round((unit() - T(0.5)) * T(20)); break;
    }
    if (next() % 97 == 0) (next() % 2 ? a[i] : b[i]) = special[next() % 8];
  }
}

/// What Python's % and // give on floats, by the C library's fmod (conformance_elementwise.cpp's
/// definitions, written again here as plain loops).
template <class T>
T ref_mod(T a, T b) {
  T m = std::fmod(a, b);
  if (m != T(0)) return (b < T(0)) != (m < T(0)) ? m + b : m;
  return std::copysign(T(0), b);
}
template <class T>
T ref_floor_div(T a, T b) {
  if (b == T(0)) return a / b;
  const T m = std::fmod(a, b);
  T d = (a - m) / b;
  if (m != T(0) && (b < T(0)) != (m < T(0))) d -= T(1);
  if (d == T(0)) return std::copysign(T(0), a / b);
  T q = std::floor(d);
  if (d - q > T(0.5)) q += T(1);
  return q;
}

/// Python's // and % on 32-bit ints, in 64-bit arithmetic: 0 for a zero divisor (NumPy's), and
/// the lowest int over -1 wrapping to itself (remainder 0).
std::int32_t ref_int_floor_div(std::int32_t a, std::int32_t b) {
  if (b == 0) return 0;
  std::int64_t q = std::int64_t{a} / b;
  if (q * b != a && (a < 0) != (b < 0)) --q;
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(q));  // 2^31 wraps
}
std::int32_t ref_int_mod(std::int32_t a, std::int32_t b) {
  if (b == 0) return 0;
  std::int64_t m = std::int64_t{a} % b;
  if (m != 0 && (m < 0) != (b < 0)) m += b;
  return static_cast<std::int32_t>(m);
}

/// n int32 pairs: any values, small divisors, and the edges (0, +-1, the extremes) in either.
void int_operands(std::size_t n, std::vector<std::int32_t>& a, std::vector<std::int32_t>& b) {
  sc_test::SplitMix64 next{777};
  const std::int32_t edge[] = {0, 1, -1, 2, -2, std::numeric_limits<std::int32_t>::min(),
                               std::numeric_limits<std::int32_t>::max(), std::numeric_limits<std::int32_t>::min() + 1};
  a.resize(n);
  b.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t u = next();
    a[i] = static_cast<std::int32_t>(static_cast<std::uint32_t>(u >> (u % 29)));
    b[i] = i / 1024 % 2 ? static_cast<std::int32_t>(next() % 41) - 20 : static_cast<std::int32_t>(next() >> (u % 61));
    if (u % 13 == 0) (u % 3 ? b[i] : a[i]) = edge[next() % 8];
  }
}

}  // namespace

TEMPLATE_TEST_CASE("rules on batches: fmod, mod and floor_div give the scalar forms' bits", "[rules][fma]", float,
                   double) {
  using T = TestType;
  if (!cpu_runs_this_build()) {
    WARN("this CPU lacks the instructions of this build (AVX2 and FMA, or AVX-512): nothing to check");
    return;
  }
  STATIC_REQUIRE(r::math::has_fnma_fused);
  STATIC_REQUIRE(r::on_batches<r::Mod, B<T>>);  // the batch forms are what this file checks
  STATIC_REQUIRE(r::on_batches<r::FloorDiv, B<T>>);
  STATIC_REQUIRE(!r::on_batches<r::Mod, B<std::int64_t>>);  // int32: its own test below
  constexpr std::size_t W = B<T>::size;
  std::vector<T> a, b;
  operands<T>(3 * 4096 * 8, a, b);
  std::size_t fmod_differ = 0, mod_differ = 0, div_differ = 0;
  alignas(64) T f[W], m[W], q[W];
  for (std::size_t i = 0; i + W <= a.size(); i += W) {
    const B<T> x = B<T>::load_unaligned(a.data() + i), y = B<T>::load_unaligned(b.data() + i);
    r::math::fmod(x, y).store_aligned(f);
    r::Mod::f(x, y).store_aligned(m);
    r::FloorDiv::f(x, y).store_aligned(q);
    for (std::size_t k = 0; k < W; ++k) {
      const T u = a[i + k], v = b[i + k];
      if (!same(f[k], std::fmod(u, v)) && ++fmod_differ <= 3)
        UNSCOPED_INFO("fmod(" << u << ", " << v << "): lane " << f[k] << ", C library " << std::fmod(u, v));
      if (!same(m[k], r::Mod::f(u, v)) && ++mod_differ <= 3)
        UNSCOPED_INFO("mod(" << u << ", " << v << "): lane " << m[k] << ", scalar " << r::Mod::f(u, v));
      if (!same(q[k], r::FloorDiv::f(u, v)) && ++div_differ <= 3)
        UNSCOPED_INFO("floor_div(" << u << ", " << v << "): lane " << q[k] << ", scalar " << r::FloorDiv::f(u, v));
    }
  }
  CHECK(fmod_differ == 0);
  CHECK(mod_differ == 0);
  CHECK(div_differ == 0);
}

TEST_CASE("sc::mod and sc::floor_div on batches: eager, traced and staged agree with plain loops", "[rules][fma]") {
  if (!cpu_runs_this_build()) {
    WARN("this CPU lacks the instructions of this build (AVX2 and FMA, or AVX-512): nothing to check");
    return;
  }
  const auto run = [](auto tag) {
    using T = decltype(tag);
    const sc::DType d = std::is_same_v<T, float> ? sc::f32 : sc::f64;
    std::vector<T> av, bv;
    operands<T>(257 * 65, av, bv);
    const sc::Tensor x = sc::reshape(sc::tensor(av), {257, 65}), y = sc::reshape(sc::tensor(bv), {257, 65});
    const sc::Tensor row = sc::slice(y, {5, 0}, {1, 65}), col = sc::slice(y, {0, 7}, {257, 1});  // broadcasting
    REQUIRE(x.dtype() == d);
    const auto traced_mod = sc::function([](const sc::Tensor& p, const sc::Tensor& s) { return sc::mod(p, s); });
    const auto traced_div = sc::function([](const sc::Tensor& p, const sc::Tensor& s) { return sc::floor_div(p, s); });
    const auto staged_mod = sc::compile([](auto p, auto s) { return sc::mod(p, s); });
    const auto staged_div = sc::compile([](auto p, auto s) { return sc::floor_div(p, s); });
    for (const sc::Tensor& z : {y, row, col}) {
      const std::vector<T> xs = x.to_vector<T>(), zs = sc::broadcast_to(z, x.shape()).to_vector<T>();
      const std::vector<T> m = sc::mod(x, z).to_vector<T>(), q = sc::floor_div(x, z).to_vector<T>();
      const sc::Tensor tmt = traced_mod(x, z), tqt = traced_div(x, z), smt = staged_mod(x, z), sqt = staged_div(x, z);
      const std::vector<T> tm = tmt.to_vector<T>(), tq = tqt.to_vector<T>(), sm = smt.to_vector<T>(), sq = sqt.to_vector<T>();
      std::size_t differ = 0;
      for (std::size_t i = 0; i < xs.size(); ++i) {
        const T wm = ref_mod(xs[i], zs[i]), wq = ref_floor_div(xs[i], zs[i]);
        const bool ok = same(m[i], wm) && same(q[i], wq) && same(tm[i], wm) && same(tq[i], wq) && same(sm[i], wm) &&
                        same(sq[i], wq);
        if (!ok && ++differ <= 3)
          UNSCOPED_INFO(sc::name(d) << " " << xs[i] << " % " << zs[i] << ": eager " << m[i] << " traced " << tm[i]
                                    << " staged " << sm[i] << ", loop " << wm << "; // eager " << q[i] << " traced "
                                    << tq[i] << " staged " << sq[i] << ", loop " << wq);
      }
      INFO(sc::name(d) << " against a divisor of shape " << z.shape());
      CHECK(differ == 0);
    }
  };
  run(float{});
  run(double{});
}

// pow on floats in doubles (rules.inc's pow_in_double) where the compiler fuses its multiply-adds:
// the scalar and batch forms must still give the same bits, and x^y correctly rounded.
TEST_CASE("rules on batches: pow on floats gives the scalar form's bits under FMA", "[rules][fma]") {
  if (!cpu_runs_this_build()) {
    WARN("this CPU lacks the instructions of this build (AVX2 and FMA, or AVX-512): nothing to check");
    return;
  }
  const sc_test::PowFloatCounts c = sc_test::check_pow_floats(4 * 4096 * 8);
  INFO(c.not_rounded << " of " << c.pairs << " not correctly rounded");
  CHECK(c.not_rounded <= 4);
  CHECK(c.beyond_one_ulp == 0);
  CHECK(c.batch_differ == 0);
}

// mod and floor_div on batches of 32-bit ints, in doubles (rules::math::floor_division_batch):
// the scalar rules' numbers and Python's, lane for lane.
TEST_CASE("rules on batches: mod and floor_div on int32 give the scalar forms' numbers", "[rules][fma]") {
  if (!cpu_runs_this_build()) {
    WARN("this CPU lacks the instructions of this build (AVX2 and FMA, or AVX-512): nothing to check");
    return;
  }
  using I = std::int32_t;
  STATIC_REQUIRE(r::on_batches<r::Mod, B<I>>);
  STATIC_REQUIRE(r::on_batches<r::FloorDiv, B<I>>);
  STATIC_REQUIRE(!r::on_batches<r::Mod, B<std::int64_t>>);
  constexpr std::size_t W = B<I>::size;
  std::vector<I> a, b;
  int_operands(1 << 18, a, b);
  std::size_t differ = 0;
  alignas(64) I m[W], q[W];
  for (std::size_t i = 0; i + W <= a.size(); i += W) {
    const B<I> x = B<I>::load_unaligned(a.data() + i), y = B<I>::load_unaligned(b.data() + i);
    r::Mod::f(x, y).store_aligned(m);
    r::FloorDiv::f(x, y).store_aligned(q);
    for (std::size_t k = 0; k < W; ++k) {
      const I u = a[i + k], v = b[i + k];
      const bool ok = m[k] == ref_int_mod(u, v) && q[k] == ref_int_floor_div(u, v) && m[k] == r::Mod::f(u, v) &&
                      q[k] == r::FloorDiv::f(u, v);
      if (!ok && ++differ <= 3)
        UNSCOPED_INFO(u << " % " << v << ": lane " << m[k] << " loop " << ref_int_mod(u, v) << "; // lane " << q[k]
                        << " loop " << ref_int_floor_div(u, v));
    }
  }
  CHECK(differ == 0);
}

TEST_CASE("sc::mod and sc::floor_div on int32: eager, traced and staged agree with plain loops", "[rules][fma]") {
  if (!cpu_runs_this_build()) {
    WARN("this CPU lacks the instructions of this build (AVX2 and FMA, or AVX-512): nothing to check");
    return;
  }
  using I = std::int32_t;
  std::vector<I> av, bv;
  int_operands(257 * 65, av, bv);
  const sc::Tensor x = sc::reshape(sc::tensor(av), {257, 65}), y = sc::reshape(sc::tensor(bv), {257, 65});
  const sc::Tensor row = sc::slice(y, {5, 0}, {1, 65}), col = sc::slice(y, {0, 7}, {257, 1});
  REQUIRE(x.dtype() == sc::i32);
  const auto traced = sc::function([](const sc::Tensor& p, const sc::Tensor& s) {
    return sc::floor_div(p, s) * 3 + sc::mod(p, s);
  });
  const auto staged_mod = sc::compile([](auto p, auto s) { return sc::mod(p, s); });
  const auto staged_div = sc::compile([](auto p, auto s) { return sc::floor_div(p, s); });
  for (const sc::Tensor& z : {y, row, col}) {
    const std::vector<I> xs = x.to_vector<I>(), zs = sc::broadcast_to(z, x.shape()).to_vector<I>();
    const std::vector<I> m = sc::mod(x, z).to_vector<I>(), q = sc::floor_div(x, z).to_vector<I>();
    const sc::Tensor tt = traced(x, z), smt = staged_mod(x, z), sqt = staged_div(x, z);
    const std::vector<I> t = tt.to_vector<I>(), sm = smt.to_vector<I>(), sq = sqt.to_vector<I>();
    std::size_t differ = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const I wm = ref_int_mod(xs[i], zs[i]), wq = ref_int_floor_div(xs[i], zs[i]);
      const I wt = static_cast<I>(static_cast<std::uint32_t>(wq) * 3u + static_cast<std::uint32_t>(wm));  // wraps
      const bool ok = m[i] == wm && q[i] == wq && sm[i] == wm && sq[i] == wq && t[i] == wt;
      if (!ok && ++differ <= 3)
        UNSCOPED_INFO(xs[i] << " % " << zs[i] << ": eager " << m[i] << " staged " << sm[i] << ", loop " << wm
                            << "; // eager " << q[i] << " staged " << sq[i] << ", loop " << wq << "; traced "
                            << t[i] << ", loop " << wt);
    }
    INFO("against a divisor of shape " << z.shape());
    CHECK(differ == 0);
  }
}
