// Conformance table of the creation ops: fill (every dtype, rank 0, empty, large) and the random
// ops random_normal, random_uniform against an independent Philox4x32-10 (reference.cpp), through
// their state input (keys with the high bit set, offsets that carry into the counter's high
// word) and through the seeded public forms.
#include <catch2/catch.hpp>

#include <cmath>

#include "conformance.hpp"

namespace conf {
namespace {

using Ints = std::vector<std::int64_t>;

const std::vector<sc::Shape> creation_shapes = {{}, {0}, {1}, {5}, {2, 3}, {3, 0, 2}, {2, 1, 3, 2}, {1001}, {300, 257}};

Params creation_p(const sc::Shape& shape, DType d, double a, double b = 0) {
  Params p;
  p.ints = shape.vec();
  p.dtype = d;
  p.scalar = a;
  p.scalar2 = b;
  return p;
}

std::vector<OpEntry> fill_entries() {
  RefFn ref = [](const std::vector<Ref>&, const Params& p) { return filled(p.ints, p.scalar, p.dtype); };
  OpEntry e{"fill", "detail::fill(shape, value, dtype)", SC_CALL(sc::detail::fill(sc::Shape(p.ints), p.scalar, p.dtype)),
            ref, exact_rounding, {}, 0u};
  for (DType d : all_dtypes)
    for (const sc::Shape& s : creation_shapes)
      for (double v : {0.0, 1.0, -2.5, 7.0}) e.cases.push_back({{}, creation_p(s, d, v), "value " + std::to_string(v)});
  for (DType d : floats)
    for (double v : {nan_v, inf_v, -inf_v, 1e-300, 3.4e38}) e.cases.push_back({{}, creation_p({2, 2}, d, v), "special value"});
  e.cases.push_back({{}, creation_p({3}, sc::boolean, nan_v), "NaN to bool is true"});
  return {e};
}

/// A state input (key, offset); keys are the i64 bits of the unsigned key.
In state_in(double key, double offset) { return {{2}, sc::i64, Gen::normal, 0, {key, offset}}; }
std::uint64_t as_u64(double v) { return static_cast<std::uint64_t>(static_cast<std::int64_t>(v)); }

struct StateCase {
  double key, offset;
  const char* note;
};
const std::vector<StateCase> states = {
    {0, 0, "key 0"},
    {42, 0, "seed 42"},
    {7, 5, "offset 5"},
    {-1, 3, "key with every bit set"},
    {4503599627370497.0, 1099511627776.0, "64-bit key and offset"},
    {9, 4294967290.0, "counter carries into its high word mid-draw"},
};

std::vector<OpEntry> random_entries() {
  // normal: through the state input, and through random::normal(shape, seed, ...) (offset 0).
  RefFn normal_ref = [](const std::vector<Ref>& in, const Params& p) {
    return random_normal(as_u64(in[0].v[0]), as_u64(in[0].v[1]), p.ints, p.scalar, p.scalar2, p.dtype);
  };
  OpEntry rn{"random_normal", "detail::random_normal(state, shape, mean, stddev, dtype)",
             SC_CALL(sc::detail::random_normal(x[0], sc::Shape(p.ints), p.scalar, p.scalar2, p.dtype)), normal_ref, Tol{4},
             {}, 0u};
  for (DType d : floats) {
    for (const StateCase& st : states)
      for (const sc::Shape& s : creation_shapes) rn.cases.push_back({{state_in(st.key, st.offset)}, creation_p(s, d, 0, 1), st.note});
    rn.cases.push_back({{state_in(3, 0)}, creation_p({4, 5}, d, -2.5, 0.25), "mean and stddev"});
    rn.cases.push_back({{state_in(3, 0)}, creation_p({7}, d, 1e3, 0), "stddev 0"});
  }
  RefFn normal_seed_ref = [](const std::vector<Ref>&, const Params& p) {
    return random_normal(static_cast<std::uint64_t>(p.k), 0, p.ints, p.scalar, p.scalar2, p.dtype);
  };
  OpEntry rn_seed{"random_normal", "random::normal(shape, seed, mean, stddev, dtype)",
                  SC_CALL(sc::random::normal(sc::Shape(p.ints), static_cast<std::uint64_t>(p.k), p.scalar, p.scalar2, p.dtype)),
                  normal_seed_ref, Tol{4}, {}, 0u};
  for (DType d : floats)
    for (std::int64_t seed : {0, 42, 123456789})
      for (const sc::Shape& s : {sc::Shape{}, sc::Shape{6}, sc::Shape{3, 5}}) {
        Params p = creation_p(s, d, 0.5, 2);
        p.k = seed;
        rn_seed.cases.push_back({{}, p, "seed " + std::to_string(seed)});
      }

  // uniform: the same two forms; lo == hi, and a range narrower than an f32 ulp near 1, where
  // most values round up to hi in f32 and must be clamped below it.
  RefFn uniform_ref = [](const std::vector<Ref>& in, const Params& p) {
    return random_uniform(as_u64(in[0].v[0]), as_u64(in[0].v[1]), p.ints, p.scalar, p.scalar2, p.dtype);
  };
  OpEntry ru{"random_uniform", "detail::random_uniform(state, shape, lo, hi, dtype)",
             SC_CALL(sc::detail::random_uniform(x[0], sc::Shape(p.ints), p.scalar, p.scalar2, p.dtype)), uniform_ref, Tol{2},
             {}, 0u};
  for (DType d : floats) {
    for (const StateCase& st : states)
      for (const sc::Shape& s : creation_shapes) ru.cases.push_back({{state_in(st.key, st.offset)}, creation_p(s, d, 0, 1), st.note});
    ru.cases.push_back({{state_in(11, 2)}, creation_p({4, 5}, d, -2, 3), "[-2, 3)"});
    ru.cases.push_back({{state_in(11, 2)}, creation_p({6}, d, 5, 5), "lo == hi"});
    ru.cases.push_back({{state_in(11, 2)}, creation_p({1000}, d, 1.0, 1.0000001), "range below an f32 ulp: clamped"});
  }
  RefFn uniform_seed_ref = [](const std::vector<Ref>&, const Params& p) {
    return random_uniform(static_cast<std::uint64_t>(p.k), 0, p.ints, p.scalar, p.scalar2, p.dtype);
  };
  OpEntry ru_seed{"random_uniform", "random::uniform(shape, lo, hi, seed, dtype)",
                  SC_CALL(sc::random::uniform(sc::Shape(p.ints), p.scalar, p.scalar2, static_cast<std::uint64_t>(p.k), p.dtype)),
                  uniform_seed_ref, Tol{2}, {}, 0u};
  for (DType d : floats)
    for (std::int64_t seed : {0, 1, 987654321})
      for (const sc::Shape& s : {sc::Shape{}, sc::Shape{6}, sc::Shape{3, 5}}) {
        Params p = creation_p(s, d, -2, 2);
        p.k = seed;
        ru_seed.cases.push_back({{}, p, "seed " + std::to_string(seed)});
      }
  return {rn, rn_seed, ru, ru_seed};
}

}  // namespace

/// check_range: in-range values pass through unchanged (out-of-range ones are an error test in
/// test/graph/test_function.cpp, where a staged cross_entropy meets a bad label).
std::vector<OpEntry> check_range_entries() {
  RefFn ref = [](const std::vector<Ref>& in, const Params&) { return in[0]; };
  OpEntry e{"check_range", "detail::check_range(x, lo, hi)", SC_CALL(sc::detail::check_range(x[0], p.k, p.axis)), ref,
            exact_rounding, {}, 0u};
  for (DType d : {sc::i32, sc::i64})
    for (const sc::Shape& s : {sc::Shape{}, sc::Shape{0}, sc::Shape{7}, sc::Shape{3, 4}}) {
      Params p;
      p.k = 0;
      p.axis = 10;
      e.cases.push_back({{{s, d, Gen::index, 10, {}}}, p, "labels in [0, 10)"});
    }
  return {e};
}

std::vector<OpEntry> creation_table() {
  std::vector<OpEntry> t = fill_entries();
  for (OpEntry& e : check_range_entries()) t.push_back(std::move(e));
  for (OpEntry& e : random_entries()) t.push_back(std::move(e));
  return t;
}

}  // namespace conf

TEST_CASE("conformance: fill", "[conformance][creation]") { conf::check_table(conf::fill_entries()); }
TEST_CASE("conformance: check_range", "[conformance][creation]") { conf::check_table(conf::check_range_entries()); }
TEST_CASE("conformance: random_normal, random_uniform", "[conformance][creation]") {
  conf::check_table(conf::random_entries());
}
