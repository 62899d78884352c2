// add_n(xs): the elementwise sum of tensors of one shape in one pass. Gradient tapes sum a
// tensor's gradient contributions with it (a weight used at every step of a recurrence).
#pragma once
#include <algorithm>
#include <cstring>
#include <vector>

#include "../backend/cpu/elementwise.hpp"
#include "../backend/cpu/parallel.hpp"
#include "binary.hpp"
#include "cast.hpp"  // dispatch promotes mixed dtypes through Cast

namespace stagecraft {
namespace ops {

/// The inputs, all of one shape, added left to right: ((x0 + x1) + x2) + ..., each addition the
/// add op's (so the bits of the chain of adds), in one pass over memory. Inputs are promoted to
/// their common dtype first; bool is rejected as by add. One input: a copy of it.
struct AddN {
  SC_OP_HEAD(AddN, "add_n")
  static constexpr int arity = -1;
  static constexpr int promote_from = 0;

  static OutMeta infer(Inputs in, const Attrs&, const std::source_location& loc) {
    if (SC_UNLIKELY(in.empty())) detail::fail<ValueError>(name, loc, "needs at least one tensor, got an empty list");
    const Shape& s0 = in[0].shape();
    for (std::size_t i = 1; i < in.size(); ++i)
      if (SC_UNLIKELY(!(in[i].shape() == s0)))
        detail::fail<ShapeError>(name, loc, "all tensors must have the same shape, got ", s0, " (tensor 0) and ",
                                 in[i].shape(), " (tensor ", i, ")");
    require_dtype(!is_bool(in[0].dtype()), name, in[0].dtype(), "numeric dtypes", loc);
    return {s0, in[0].dtype()};
  }

  /// Each thread's elements in tiles that stay in cache while every input is added to them.
  static void cpu(Inputs in, Tensor& out, const Attrs&) {
    const std::int64_t n = out.numel();
    if (n == 0) return;
    visit_numeric(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* y = static_cast<T*>(out.raw_data());
      auto x = [&](std::size_t k) { return static_cast<const T*>(in[k].raw_data()); };
      if (in.size() == 1) {
        std::memcpy(y, x(0), static_cast<std::size_t>(n) * sizeof(T));
        return;
      }
      const std::int64_t grain = std::max<std::int64_t>(1, backend::cpu::grain_cheap / static_cast<std::int64_t>(in.size()));
      backend::cpu::parallel_for(n, grain, [&](std::int64_t b, std::int64_t e) {
        constexpr std::int64_t tile = 2048;
        for (std::int64_t t = b; t < e; t += tile) {
          const std::int64_t m = std::min(tile, e - t);
          backend::cpu::binary_row<Add, T, T>(x(0) + t, x(1) + t, y + t, m, 1, 1);
          for (std::size_t k = 2; k < in.size(); ++k) add_into(y + t, x(k) + t, m);
        }
      });
    });
  }
  static void cuda(Inputs in, Tensor& out, const Attrs&, const std::source_location& loc) {
    backend::cuda::add_n<Add>(in, out, loc);
  }
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs&) {
    return std::vector<Tensor>(in.size(), g);
  }

 private:
  /// y[i] = add(y[i], x[i]) (y is both an operand and the result: not binary_row's restrict).
  template <class T>
  static void add_into(T* y, const T* x, std::int64_t n) {
    std::int64_t i = 0;
    if constexpr (backend::cpu::HasSimd2<Add, T>) {
      using B = backend::cpu::batch<T>;
      for (; i + static_cast<std::int64_t>(B::size) <= n; i += B::size)
        B(Add::simd(B::load_unaligned(y + i), B::load_unaligned(x + i))).store_unaligned(y + i);
    }
    for (; i < n; ++i) y[i] = Add::scalar(y[i], x[i]);
  }
};

}  // namespace ops

/// The elementwise sum of tensors of one shape, ((xs[0] + xs[1]) + xs[2]) + ..., with the bits
/// of that chain of adds but one pass over memory (one kernel on a GPU). Dtypes are promoted to
/// the common one; shapes must be equal (no broadcasting). An empty list is a ValueError.
inline Tensor add_n(const std::vector<Tensor>& xs, std::source_location loc = std::source_location::current()) {
  return detail::dispatch<ops::AddN>(xs, {}, loc);
}

}  // namespace stagecraft
