// Helpers shared by the layout-op tests: sample tensors of every dtype, naive index
// arithmetic for the loop references, and an error check that wants the caller's file:line.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

#include <catch2/catch.hpp>
// The layout headers and what the tests build inputs with (not the umbrella header, so these
// tests build while other op families are in progress).
#include <stagecraft/fwd.hpp>
#include <stagecraft/core/creation.hpp>
#include <stagecraft/ops/broadcast_to.hpp>
#include <stagecraft/ops/cast.hpp>
#include <stagecraft/ops/concat.hpp>
#include <stagecraft/ops/gather.hpp>
#include <stagecraft/ops/reshape.hpp>
#include <stagecraft/ops/slice.hpp>
#include <stagecraft/ops/transpose.hpp>

namespace lt {

inline const std::vector<sc::DType> all_dtypes = {sc::boolean, sc::i32, sc::i64, sc::f32, sc::f64};

/// Shapes of rank 0..4 with size-1 axes, plus empty ones.
inline const std::vector<sc::Shape> sample_shapes = {
    {}, {1}, {5}, {3, 4}, {1, 4}, {2, 3, 4}, {3, 1, 2}, {2, 3, 1, 4}, {2, 1, 3, 2}, {0}, {2, 0, 3}, {1, 0}};

/// A tensor of shape s and dtype d with varied values (bools are a 1-in-3 pattern); `seed`
/// shifts the values so two samples differ. Values are small integers: exact in every dtype.
inline sc::Tensor sample(const sc::Shape& s, sc::DType d, int seed = 0) {
  std::vector<double> v(static_cast<std::size_t>(s.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto k = static_cast<long>(i) + 13L * seed;
    v[i] = d == sc::boolean ? static_cast<double>(k % 3 == 0) : static_cast<double>((k * 37) % 97 - 48);
  }
  return sc::cast(sc::tensor(v, s), d);
}

/// Every element as double (exact for the values `sample` makes).
inline std::vector<double> values(const sc::Tensor& t) { return t.to_vector<double>(); }

/// Row-major multi-index of flat position i.
inline std::vector<std::int64_t> unravel(std::int64_t i, const sc::Shape& s) {
  std::vector<std::int64_t> idx(s.size());
  for (int d = s.rank() - 1; d >= 0; --d) {
    idx[d] = i % s[d];
    i /= s[d];
  }
  return idx;
}
/// Flat position of a row-major multi-index.
inline std::int64_t ravel(const std::vector<std::int64_t>& idx, const sc::Shape& s) {
  std::int64_t f = 0;
  for (int d = 0; d < s.rank(); ++d) f = f * s[d] + idx[d];
  return f;
}

/// "file.cpp:line" of a call site, computed here independently of the library's formatting.
inline std::string site(const std::source_location& loc) {
  std::string f = loc.file_name();
  if (auto p = f.find_last_of('/'); p != std::string::npos) f = f.substr(p + 1);
  return f + ":" + std::to_string(loc.line());
}

/// Runs f (a lambda written on the same line as this call) and checks that it throws E whose
/// message contains every part and ends with " at <this file>:<this line>".
template <class E, class F>
void expect_error(F&& f, std::initializer_list<std::string_view> parts,
                  std::source_location here = std::source_location::current()) {
  INFO("error expected from the call at line " << here.line());
  bool threw = false;
  try {
    f();
  } catch (const E& e) {
    threw = true;
    const std::string msg = e.what();
    for (std::string_view p : parts) CHECK_THAT(msg, Catch::Contains(std::string(p)));
    CHECK_THAT(msg, Catch::EndsWith(" at " + site(here)));
  }
  CHECK(threw);
}

}  // namespace lt
