// Counter-based random numbers (Philox4x32-10) as ops: random_normal and random_uniform read a
// (key, offset) state tensor, so a trace records a node instead of freezing host-made numbers
// into the graph. Also the generators (a per-process one behind sc::manual_seed) and
// random::permutation. Element i depends only on (key, offset, i): the same numbers whatever
// the thread count or the order of generation.
//
// Seeds and streams (a choice kept for source compatibility):
//   random::normal(shape, seed = 0, ...)   the state is the constant {seed, 0}: the same numbers
//                                          at every call, eager and traced alike; omitting the
//                                          seed means seed 0, as it always has.
//   random::normal(shape, gen, ...)        draws from a Generator and advances it: fresh numbers
//                                          at every call; random::default_generator() is the
//                                          per-process stream that sc::manual_seed restarts.
#pragma once
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <numbers>
#include <source_location>
#include <utility>

#include "../backend/cpu/parallel.hpp"
#include "../core/creation.hpp"
#include "../detail/philox.hpp"
#include "../eager/dispatch.hpp"
#include "../state/variable.hpp"  // a generator's state is a Variable (read by reference when traced)

namespace stagecraft {
namespace detail {

/// Philox blocks (4 values each) a draw of n values uses: how far it advances a generator.
constexpr std::int64_t random_blocks(std::int64_t n) { return (n + 3) / 4; }

/// The state tensor of key `seed` at block `offset`: i64 [2] {key, offset}, the unsigned values'
/// bits held as signed integers (there is no u64 dtype).
inline Tensor random_state(std::uint64_t seed, std::uint64_t offset = 0) {
  return make_host<std::int64_t>(Shape{2}, [&](std::int64_t* p) {
    p[0] = static_cast<std::int64_t>(seed);
    p[1] = static_cast<std::int64_t>(offset);
  });
}

/// Fills `out` (f32 or f64) from the stream of state tensor `state`: block b is Philox(key,
/// offset + b), and gen(words, v) turns its four words into four values of out's type.
template <class Gen>
void philox_fill(const Tensor& state, Tensor& out, Gen&& gen) {
  const auto* s = static_cast<const std::int64_t*>(state.raw_data());
  const auto key = static_cast<std::uint64_t>(s[0]), offset = static_cast<std::uint64_t>(s[1]);
  visit_floating(out.dtype(), [&](auto tag) {
    using F = typename decltype(tag)::type;
    F* p = static_cast<F*>(out.raw_data());
    const std::int64_t n = out.numel();
    backend::cpu::parallel_for(random_blocks(n), 4096, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t blk = b; blk < e; ++blk) {
        F v[4];
        gen(random_block(key, offset + static_cast<std::uint64_t>(blk)), v);
        for (int k = 0; k < 4 && blk * 4 + k < n; ++k) p[blk * 4 + k] = v[k];
      }
    });
  });
}

/// What both random ops and their public forms check: a non-negative shape, a float dtype.
inline void check_random(const Shape& shape, DType d, std::string_view op, const std::source_location& loc) {
  check_shape(shape, op, loc);
  ops::require_dtype(is_floating(d), op, d, "a float dtype", loc);
}
/// uniform's range check.
inline void check_range(double lo, double hi, std::string_view op, const std::source_location& loc) {
  if (SC_UNLIKELY(!(lo <= hi))) fail<ValueError>(op, loc, "needs lo <= hi, got ", lo, " and ", hi);
  if (SC_UNLIKELY(!std::isfinite(hi - lo)))  // also an infinite or NaN bound
    fail<ValueError>(op, loc, "needs a finite range, got [", lo, ", ", hi, ")");
}

/// normal's parameters: a finite mean and a finite stddev >= 0 (0: every sample is the mean).
inline void check_normal(double mean, double stddev, std::string_view op, const std::source_location& loc) {
  if (SC_UNLIKELY(!(stddev >= 0))) fail<ValueError>(op, loc, "needs stddev >= 0, got ", stddev);
  if (SC_UNLIKELY(!std::isfinite(mean) || !std::isfinite(stddev)))
    fail<ValueError>(op, loc, "needs a finite mean and stddev, got mean ", mean, " and stddev ", stddev);
}

}  // namespace detail

namespace ops {

/// The random ops' input: the state (key, offset) as i64 [2].
inline void check_random_state(const Tensor& s, std::string_view op, const std::source_location& loc) {
  require_dtype(s.dtype() == DType::i64, op, s.dtype(), "an i64 state tensor (key, offset)", loc);
  if (SC_UNLIKELY(s.shape() != Shape{2}))
    detail::fail<ShapeError>(op, loc, "expects a state tensor of shape [2] (key, offset), got ", s.shape());
}

/// Normal samples (Box–Muller over Philox). Input: the state (i64 [2]: key, counter offset).
/// Reads attrs.ints (shape), attrs.dtype (f32 or f64), attrs.scalar (mean), attrs.scalar2
/// (stddev). No gradient (the state is integer, the parameters are attributes).
struct RandomNormal {
  SC_OP_HEAD(RandomNormal, "random_normal")
  static constexpr int arity = 1;
  static constexpr bool differentiable = false;

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    check_random_state(in[0], name, loc);
    detail::check_random(a.ints, a.dtype, name, loc);
    return {a.ints, a.dtype};
  }
  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    backend::cuda::philox(true, in[0], out, a.scalar, a.scalar2, name, loc);
  }
  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    const double mean = a.scalar, stddev = a.scalar2;
    detail::philox_fill(in[0], out, [&]<class F>(const std::array<std::uint32_t, 4>& w, F* v) {
      detail::normal4(w, mean, stddev, v);
    });
  }
};

/// Uniform samples in [lo, hi) (lo when lo == hi). Input: the state (i64 [2]). Reads attrs.ints
/// (shape), attrs.dtype (f32 or f64), attrs.scalar (lo), attrs.scalar2 (hi). No gradient.
struct RandomUniform {
  SC_OP_HEAD(RandomUniform, "random_uniform")
  static constexpr int arity = 1;
  static constexpr bool differentiable = false;

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    check_random_state(in[0], name, loc);
    detail::check_random(a.ints, a.dtype, name, loc);
    detail::check_range(a.scalar, a.scalar2, name, loc);
    return {a.ints, a.dtype};
  }
  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    backend::cuda::philox(false, in[0], out, a.scalar, a.scalar2, name, loc);
  }
  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    const double lo = a.scalar, hi = a.scalar2;
    detail::philox_fill(in[0], out, [&]<class F>(const std::array<std::uint32_t, 4>& w, F* v) {
      detail::uniform4(w, lo, hi, v);
    });
  }
};

}  // namespace ops

namespace detail {

/// Normal samples from the stream of `state` (i64 [2]: key, offset), through the op.
inline Tensor random_normal(const Tensor& state, Shape shape, double mean, double stddev, DType d,
                            const std::source_location& loc = std::source_location::current()) {
  ops::Attrs a;
  a.ints = std::move(shape);
  a.scalar = mean;
  a.scalar2 = stddev;
  a.dtype = d;
  return dispatch<ops::RandomNormal>({&state, 1}, a, loc);
}
/// Uniform samples in [lo, hi) from the stream of `state` (i64 [2]: key, offset), through the op.
inline Tensor random_uniform(const Tensor& state, Shape shape, double lo, double hi, DType d,
                             const std::source_location& loc = std::source_location::current()) {
  ops::Attrs a;
  a.ints = std::move(shape);
  a.scalar = lo;
  a.scalar2 = hi;
  a.dtype = d;
  return dispatch<ops::RandomUniform>({&state, 1}, a, loc);
}

/// RAII: no trace is active on this thread while alive, for state made once per process
/// whichever call (traced or not) first needs it (what sc::init_scope does; graph/ is not
/// included here).
class OutsideTrace {
 public:
  OutsideTrace() : saved_(std::exchange(context().trace, nullptr)) {}
  ~OutsideTrace() { context().trace = saved_; }
  OutsideTrace(const OutsideTrace&) = delete;
  OutsideTrace& operator=(const OutsideTrace&) = delete;

 private:
  TraceState* saved_;
};

/// SplitMix64's finaliser: turns nearby integers into unrelated 64-bit seeds.
constexpr std::uint64_t mix_seed(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// The process-wide seed stream layers and initializers draw their seeds from when given none
/// (nn::init::next_seed): a base seed and how many seeds were drawn since.
struct SeedStream {
  std::atomic<std::uint64_t> base{0};
  std::atomic<std::uint64_t> drawn{0};
};
inline SeedStream& seed_stream() {
  static SeedStream s;
  return s;
}

}  // namespace detail

namespace random {

/// A stream of Philox blocks. Its state (key, offset) is an i64 [2] sc::Variable (not trainable);
/// each draw reads it, runs the op on it, then advances the offset by the blocks the draw used
/// (an add on the state, then an assignment: traced, all three are part of the graph, so every
/// call of a traced function draws fresh numbers). Draws are serialised by a mutex: threads
/// sharing a generator get disjoint blocks.
class Generator {
 public:
  /// A stream starting at block 0 of key `seed`.
  explicit Generator(std::uint64_t seed = 0, std::source_location loc = std::source_location::current())
      : state_(detail::random_state(seed), "random/generator_state", /*trainable=*/false, loc) {}
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  /// Restarts the stream at block 0 of key `seed` (inside a traced function: at every call).
  void manual_seed(std::uint64_t seed, std::source_location loc = std::source_location::current()) {
    const std::lock_guard<std::mutex> lock(mu_);
    state_.assign(detail::random_state(seed), loc);
  }
  /// The state variable (i64 [2]: key, offset), for checkpoints and the graph layer. Reading
  /// or assigning it directly bypasses the generator's lock.
  const Variable& state() const { return state_; }

  /// Returns draw(state) and advances the offset by `blocks`, one step no other thread's draw
  /// can interleave with.
  template <class Draw>
  Tensor next(std::int64_t blocks, Draw&& draw, const std::source_location& loc) {
    const std::lock_guard<std::mutex> lock(mu_);
    Tensor out = draw(state_.value());
    if (blocks > 0) state_.assign_add(detail::random_state(0, static_cast<std::uint64_t>(blocks)), loc);
    return out;
  }

 private:
  std::mutex mu_;
  Variable state_;
};

/// The per-process generator: key 0 at block 0 until sc::manual_seed(s) restarts it at block 0
/// of key s (so its first draw after manual_seed(s) equals the seeded call with seed s).
inline Generator& default_generator() {
  static Generator g = [] {
    const detail::OutsideTrace once;  // made once, whichever thread or trace asks first
    return Generator(0);
  }();
  return g;
}

/// Normal samples (Box–Muller over Philox) from key `seed` at block 0: the same numbers at
/// every call, eager and traced. mean and stddev given; f32 unless d is f64.
inline Tensor normal(Shape shape, std::uint64_t seed = 0, double mean = 0.0, double stddev = 1.0,
                     DType d = DType::f32, std::source_location loc = std::source_location::current()) {
  detail::check_random(shape, d, "random::normal", loc);
  detail::check_normal(mean, stddev, "random::normal", loc);
  return detail::random_normal(detail::random_state(seed), std::move(shape), mean, stddev, d, loc);
}
/// Normal samples drawn from `gen`, which advances: fresh numbers at every call (pass
/// random::default_generator() for the per-process stream).
inline Tensor normal(Shape shape, Generator& gen, double mean = 0.0, double stddev = 1.0, DType d = DType::f32,
                     std::source_location loc = std::source_location::current()) {
  detail::check_random(shape, d, "random::normal", loc);
  detail::check_normal(mean, stddev, "random::normal", loc);
  const std::int64_t blocks = detail::random_blocks(shape.numel());
  return gen.next(blocks, [&](const Tensor& state) { return detail::random_normal(state, shape, mean, stddev, d, loc); },
                  loc);
}
/// Uniform samples in [lo, hi) from key `seed` at block 0: the same numbers at every call,
/// eager and traced; f32 unless d is f64.
inline Tensor uniform(Shape shape, double lo = 0.0, double hi = 1.0, std::uint64_t seed = 0, DType d = DType::f32,
                      std::source_location loc = std::source_location::current()) {
  detail::check_random(shape, d, "random::uniform", loc);
  detail::check_range(lo, hi, "random::uniform", loc);
  return detail::random_uniform(detail::random_state(seed), std::move(shape), lo, hi, d, loc);
}
/// Uniform samples in [lo, hi) drawn from `gen`, which advances: fresh numbers at every call.
inline Tensor uniform(Shape shape, double lo, double hi, Generator& gen, DType d = DType::f32,
                      std::source_location loc = std::source_location::current()) {
  detail::check_random(shape, d, "random::uniform", loc);
  detail::check_range(lo, hi, "random::uniform", loc);
  const std::int64_t blocks = detail::random_blocks(shape.numel());
  return gen.next(blocks, [&](const Tensor& state) { return detail::random_uniform(state, shape, lo, hi, d, loc); },
                  loc);
}
/// A random permutation of 0..n-1 (i64), from a seeded Philox-driven Fisher–Yates shuffle.
/// Made on the host, not by an op: it is an integer shuffle for the data batcher, outside any
/// traced function (traced, it would be a constant: the same order at every call).
inline Tensor permutation(std::int64_t n, std::uint64_t seed = 0,
                          std::source_location loc = std::source_location::current()) {
  if (n < 0) detail::fail<ShapeError>("random::permutation", loc, "n must be non-negative, got ", n);
  return detail::make_host<std::int64_t>(
      Shape{n},
      [&](std::int64_t* p) {
        for (std::int64_t i = 0; i < n; ++i) p[i] = i;
        for (std::int64_t i = n - 1; i > 0; --i) {
          const auto w = detail::random_block(seed, static_cast<std::uint64_t>(i));
          const std::uint64_t r = (std::uint64_t{w[0]} << 32) | w[1];
          std::swap(p[i], p[r % static_cast<std::uint64_t>(i + 1)]);
        }
      },
      "random::permutation", loc);
}

}  // namespace random

/// Restarts both per-process random streams with `seed`: the seed stream that layers and
/// initializers draw from when given no seed (nn::init::next_seed), and
/// random::default_generator(), which restarts at block 0 of key `seed`.
inline void manual_seed(std::uint64_t seed) {
  detail::SeedStream& s = detail::seed_stream();
  s.base.store(seed);
  s.drawn.store(0);
  random::default_generator().manual_seed(seed);
}

}  // namespace stagecraft
