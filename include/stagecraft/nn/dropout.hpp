// nn::dropout and the nn::Dropout layer: inverted dropout written with other ops (a uniform draw,
// a comparison, where), so it traces (a fresh mask at every call of a traced function: the
// generator's state is a variable of the graph) and runs on every device.
#pragma once
#include <cmath>
#include <cstdint>
#include <optional>
#include <source_location>
#include <string_view>

#include "../core/creation.hpp"
#include "../core/device.hpp"
#include "../ops/binary.hpp"
#include "../ops/random.hpp"
#include "../ops/where.hpp"
#include "../state/module.hpp"
#include "functional.hpp"
#include "init.hpp"

namespace stagecraft::nn {

/// Each element of x zeroed with probability `rate`, the rest scaled by 1 / (1 - rate), so the
/// expectation is x (Srivastava et al. 2014, inverted). The mask is drawn from `gen` (which
/// advances: a fresh mask at every call, traced calls too) on x's device. rate 0 returns x, rate 1
/// zeros; outside [0, 1] (or NaN) is a ValueError. Integers become f32; bool is a DTypeError. The
/// gradient is the same mask and scale.
inline Tensor dropout(const Tensor& x, double rate, random::Generator& gen = random::default_generator(),
                      std::source_location loc = std::source_location::current()) {
  constexpr std::string_view op = "dropout";
  stagecraft::detail::require_defined(x, op, loc);
  ops::require_dtype(!is_bool(x.dtype()), op, x.dtype(), "numeric dtypes", loc);
  if (SC_UNLIKELY(!(rate >= 0 && rate <= 1)))
    stagecraft::detail::fail<ValueError>(op, loc, "rate must be in [0, 1], got ", rate);
  const Tensor xf = functional_detail::as_floating(x, loc);
  if (rate == 0) return xf;
  if (rate == 1) return mul(xf, 0, loc);  // zeros (NaN stays NaN), with gradient 0
  const DeviceScope on(xf.device());
  const Tensor u = random::uniform(xf.shape(), 0.0, 1.0, gen, xf.dtype(), loc);
  return where(greater_equal(u, rate, loc), mul(xf, 1.0 / (1.0 - rate), loc), 0, loc);
}

/// Dropout as a layer: `drop(x)` while training (the default), x itself after `drop.eval()` (or
/// `drop(x, false)`). Its masks come from its own generator, seeded at construction (or from the
/// global seed stream, sc::manual_seed, when no seed is given), so runs repeat. The generator's
/// state is the module's non-trainable variable "generator_state" (i64 [2]: key, offset), so a
/// checkpoint of the model restores the stream of masks too and a resumed run draws the masks
/// the uninterrupted one would have (restore it while no other thread draws from it).
class Dropout : public Module {
 public:
  explicit Dropout(double rate, std::optional<std::uint64_t> seed = std::nullopt,
                   std::source_location loc = std::source_location::current())
      : rate_(rate), gen_(seed ? *seed : init::next_seed(), loc) {
    if (SC_UNLIKELY(!(rate >= 0 && rate <= 1)))
      stagecraft::detail::fail<ValueError>("Dropout", loc, "rate must be in [0, 1], got ", rate);
    add("generator_state", Variable(gen_.state()), loc);  // a second handle of the same variable
  }

  Tensor operator()(const Tensor& x, std::source_location loc = std::source_location::current()) {
    return (*this)(x, training_, loc);
  }
  Tensor operator()(const Tensor& x, bool training, std::source_location loc = std::source_location::current()) {
    if (!training) {
      stagecraft::detail::require_defined(x, "Dropout", loc);
      return x;
    }
    return dropout(x, rate_, gen_, loc);
  }

  /// Training mode (masks drawn) or evaluation mode (the identity).
  void train(bool on = true) { training_ = on; }
  void eval() { training_ = false; }
  bool training() const { return training_; }
  double rate() const { return rate_; }
  random::Generator& generator() { return gen_; }

 private:
  double rate_;
  bool training_ = true;
  random::Generator gen_;
};

}  // namespace stagecraft::nn
