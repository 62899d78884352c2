// Weight initializers (Glorot, He, zeros) drawn from the seeded Philox generator, with seeds
// from the global seed stream (ops/random.hpp, restarted by sc::manual_seed) when given none.
#pragma once
#include <cmath>
#include <cstdint>
#include <optional>
#include <source_location>

#include "../core/creation.hpp"
#include "../core/random.hpp"

namespace stagecraft {
namespace detail {

inline void init_check_float(DType d, std::string_view op, const std::source_location& loc) {
  if (!is_floating(d)) fail<DTypeError>(op, loc, "expects a float dtype, got ", name(d));
}
/// sqrt(scale / n), 0 when the weight is empty (n == 0).
inline double init_root(double scale, double n) { return n > 0 ? std::sqrt(scale / n) : 0.0; }

}  // namespace detail

namespace nn::init {

/// The next seed of the global stream (each call a different one; see sc::manual_seed).
inline std::uint64_t next_seed() {
  stagecraft::detail::SeedStream& s = stagecraft::detail::seed_stream();
  const std::uint64_t k = s.drawn.fetch_add(1);
  return stagecraft::detail::mix_seed(s.base.load() ^ stagecraft::detail::mix_seed(k));
}
/// The k-th sub-seed of `seed`: a layer drawing one seed makes its several tensors from it.
constexpr std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t k) {
  return stagecraft::detail::mix_seed(seed + 0xD1B54A32D192ED03ull * (k + 1));
}

/// Fan-in and fan-out of a weight. Dense kernels are [in, out]; rank >= 3 weights are
/// convolution kernels [out, in, k...] (OIHW) whose fans are multiplied by the window size
/// prod(k...); a rank-1 weight has fan_in = fan_out = its size; rank 0 has 1 and 1.
struct Fans {
  double in = 1, out = 1;
};
/// See Fans.
inline Fans fans(const Shape& s) {
  if (s.rank() == 0) return {};
  if (s.rank() == 1) return {double(s[0]), double(s[0])};
  if (s.rank() == 2) return {double(s[0]), double(s[1])};
  double window = 1;
  for (int i = 2; i < s.rank(); ++i) window *= double(s[i]);
  return {double(s[1]) * window, double(s[0]) * window};
}


/// Uniform on [-l, l] with l = sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio 2010): keeps the
/// activation variance equal in both directions. seed: nullopt draws from the global stream.
inline Tensor glorot_uniform(Shape shape, std::optional<std::uint64_t> seed = std::nullopt, DType d = DType::f32,
                             std::source_location loc = std::source_location::current()) {
  stagecraft::detail::init_check_float(d, "init::glorot_uniform", loc);
  const Fans f = fans(shape);
  const double l = stagecraft::detail::init_root(6.0, f.in + f.out);
  return random::uniform(shape, -l, l, seed ? *seed : next_seed(), d, loc);
}
/// Normal with mean 0 and stddev sqrt(2 / (fan_in + fan_out)) (not truncated).
inline Tensor glorot_normal(Shape shape, std::optional<std::uint64_t> seed = std::nullopt, DType d = DType::f32,
                            std::source_location loc = std::source_location::current()) {
  stagecraft::detail::init_check_float(d, "init::glorot_normal", loc);
  const Fans f = fans(shape);
  const double stddev = stagecraft::detail::init_root(2.0, f.in + f.out);
  return random::normal(shape, seed ? *seed : next_seed(), 0.0, stddev, d, loc);
}
/// Normal with mean 0 and stddev sqrt(2 / fan_in) (He et al. 2015, for ReLU networks; not
/// truncated).
inline Tensor he_normal(Shape shape, std::optional<std::uint64_t> seed = std::nullopt, DType d = DType::f32,
                        std::source_location loc = std::source_location::current()) {
  stagecraft::detail::init_check_float(d, "init::he_normal", loc);
  const double stddev = stagecraft::detail::init_root(2.0, fans(shape).in);
  return random::normal(shape, seed ? *seed : next_seed(), 0.0, stddev, d, loc);
}
/// Uniform on [-l, l] with l = sqrt(6 / fan_in).
inline Tensor he_uniform(Shape shape, std::optional<std::uint64_t> seed = std::nullopt, DType d = DType::f32,
                         std::source_location loc = std::source_location::current()) {
  stagecraft::detail::init_check_float(d, "init::he_uniform", loc);
  const double l = stagecraft::detail::init_root(6.0, fans(shape).in);
  return random::uniform(shape, -l, l, seed ? *seed : next_seed(), d, loc);
}
/// All zeros (biases). Takes no seed and draws none from the global stream.
inline Tensor zeros(Shape shape, DType d = DType::f32, std::source_location loc = std::source_location::current()) {
  return stagecraft::zeros(shape, d, loc);
}

}  // namespace nn::init
}  // namespace stagecraft
