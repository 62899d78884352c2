// nn::GRUCell: one step of a gated recurrent unit layer, in the form cuDNN, Keras (reset_after, its
// default) and PyTorch compute. Eager, the step runs as a staged function of its own, as
// nn::LSTMCell's does (gru_cell_staging()); traced, its ops join the trace.
#pragma once
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <source_location>
#include <vector>

#include "../ops/binary.hpp"
#include "../ops/matmul.hpp"
#include "../ops/slice.hpp"
#include "../ops/unary.hpp"
#include "../graph/function.hpp"
#include "../state/module.hpp"
#include "cell_staging.hpp"
#include "init.hpp"

namespace stagecraft::nn {

/// Whether an eager GRUCell step runs as a staged function (default true): traced once per batch
/// shape, device and dtype, its gates fused, under a tape one gradient call per step; off, each of
/// its ops is dispatched (on a GPU, launched) on its own. Traced code is the same either way. The
/// setting is the process's; reading and assigning it from several threads is safe.
inline std::atomic<bool>& gru_cell_staging() {
  static std::atomic<bool> on{true};
  return on;
}

/// One GRU step (Cho et al. 2014) with the reset gate applied after the recurrent product:
///   a = x @ kernel + bias,   b = h @ recurrent_kernel + recurrent_bias,   each split [z | r | n]
///   z = sigmoid(a_z + b_z),  r = sigmoid(a_r + b_r),  n = tanh(a_n + r * b_n)
///   h' = z * h + (1 - z) * n
/// (Keras's GRU with reset_after=True, its bias's two rows here two variables; PyTorch's GRUCell
/// with its gate blocks in the order r, z, n.) Both kernels start Glorot-uniform, the biases 0.
class GRUCell : public Module {
 public:
  /// seed: the weights' seed; nullopt draws one from the global stream (sc::manual_seed).
  GRUCell(std::int64_t input, std::int64_t hidden, std::optional<std::uint64_t> seed = std::nullopt,
          DType dtype = DType::f32, std::source_location loc = std::source_location::current())
      : in_(input), hid_(hidden), dtype_(dtype) {
    if (input < 1 || hidden < 1)
      stagecraft::detail::fail<ValueError>("GRUCell", loc, "needs input >= 1 and hidden >= 1, got ", input, " and ",
                                           hidden);
    if (hidden > std::numeric_limits<std::int64_t>::max() / 3)
      stagecraft::detail::fail<ShapeError>("GRUCell", loc, "hidden ", hidden, " is too large: the 3 gate blocks of ",
                                           "3 * hidden columns overflow int64");
    const std::uint64_t s = seed ? *seed : init::next_seed();
    kernel = Variable(init::glorot_uniform({input, 3 * hidden}, init::derive_seed(s, 0), dtype, loc), "kernel", true,
                      loc);
    recurrent_kernel = Variable(init::glorot_uniform({hidden, 3 * hidden}, init::derive_seed(s, 1), dtype, loc),
                                "recurrent_kernel", true, loc);
    bias = Variable(stagecraft::zeros({3 * hidden}, dtype, loc), "bias", true, loc);
    recurrent_bias = Variable(stagecraft::zeros({3 * hidden}, dtype, loc), "recurrent_bias", true, loc);
    add({{"kernel", kernel}, {"recurrent_kernel", recurrent_kernel}, {"bias", bias}, {"recurrent_bias", recurrent_bias}},
        loc);
  }

  /// h after one step from input x [N, input] and state h [N, hidden].
  Tensor operator()(const Tensor& x, const Tensor& h, std::source_location loc = std::source_location::current()) const {
    check(x, h, loc);
    const Tensor w = kernel.value(loc), u = recurrent_kernel.value(loc), b = bias.value(loc),
                 rb = recurrent_bias.value(loc);
    if (detail_cell::staged_here(gru_cell_staging(), {&x, &h}, w.device(), dtype_))
      return (*staged_)(x, h, w, u, b, rb);
    return step(x, h, w, u, b, rb, hid_, loc);
  }

  /// The zero state h for a batch of `batch` sequences, in the layer's dtype, on its device.
  Tensor initial_state(std::int64_t batch, std::source_location loc = std::source_location::current()) const {
    if (batch < 0) stagecraft::detail::fail<ValueError>("GRUCell::initial_state", loc, "batch must be >= 0, got ", batch);
    const stagecraft::detail::DevicePin on(kernel.device());  // where the cell lives, whatever the scope
    return stagecraft::zeros({batch, hid_}, dtype_, loc);
  }

  std::int64_t input_size() const { return in_; }
  std::int64_t hidden_size() const { return hid_; }

  Variable kernel;            ///< [input, 3*hidden], gate blocks z, r, n
  Variable recurrent_kernel;  ///< [hidden, 3*hidden]
  Variable bias;              ///< [3*hidden], added to x's product
  Variable recurrent_bias;    ///< [3*hidden], added to h's product (inside the reset gate for n)

 private:
  void check(const Tensor& x, const Tensor& h, const std::source_location& loc) const {
    stagecraft::detail::require_defined(x, "GRUCell", loc);
    stagecraft::detail::require_defined(h, "GRUCell", loc);
    if (SC_UNLIKELY(x.rank() != 2 || x.shape()[1] != in_))
      stagecraft::detail::fail<ShapeError>("GRUCell", loc, "expects x as [N, ", in_, "] (input = ", in_, "), got ",
                                           x.shape());
    const Shape want{x.shape()[0], hid_};
    if (SC_UNLIKELY(h.shape() != want))
      stagecraft::detail::fail<ShapeError>("GRUCell", loc, "expects state h as [N, hidden] = ", want, " for x ",
                                           x.shape(), ", got h ", h.shape());
  }

  /// One step's arithmetic, eager or traced.
  static Tensor step(const Tensor& x, const Tensor& h, const Tensor& w, const Tensor& u, const Tensor& b,
                     const Tensor& rb, std::int64_t hid, const std::source_location& loc) {
    const Tensor a = stagecraft::add(matmul(x, w, loc), b, loc), r_h = stagecraft::add(matmul(h, u, loc), rb, loc);
    const auto gate = [&](const Tensor& t, std::int64_t k) { return slice(t, {0, k * hid}, {-1, hid}, loc); };
    const Tensor z = sigmoid(stagecraft::add(gate(a, 0), gate(r_h, 0), loc), loc);
    const Tensor r = sigmoid(stagecraft::add(gate(a, 1), gate(r_h, 1), loc), loc);
    const Tensor n = tanh(stagecraft::add(gate(a, 2), mul(r, gate(r_h, 2), loc), loc), loc);
    return stagecraft::add(n, mul(z, sub(h, n, loc), loc), loc);  // z * h + (1 - z) * n
  }
  /// The step as the staged function's body: (x, h, kernel, recurrent kernel, bias, recurrent bias).
  struct StagedStep {
    Tensor operator()(const Tensor& x, const Tensor& h, const Tensor& w, const Tensor& u, const Tensor& b,
                      const Tensor& rb) const {
      return step(x, h, w, u, b, rb, u.shape()[0], std::source_location::current());
    }
  };

  std::int64_t in_, hid_;
  DType dtype_;
  /// Shared by copies of the cell (they share its variables).
  std::shared_ptr<Function<StagedStep>> staged_ = detail_cell::staged_step<StagedStep>("GRUCell");
};

}  // namespace stagecraft::nn
