// cast(x, dtype): elementwise conversion between dtypes (to bool means x != 0).
#pragma once
#include <vector>

#include "../eager/dispatch.hpp"
#include "elementwise_rules.hpp"

namespace stagecraft {
namespace ops {

/// Cast's kernel to To: rules::Cast<To> as a scalar form and, where the backend's batch
/// conversion gives the scalar numbers (to bool: a lane mask, x != 0; int32 <-> float), a SIMD form.
template <class To>
struct CastTo : rules::Cast<To> {
  template <class S>
  static To scalar(S x) {
    return rules::Cast<To>::f(x);
  }
  template <class B>
    requires(std::is_same_v<To, bool> || backend::cpu::exact_batch_cast<typename B::value_type, To>)
  static auto simd(const B& x) {
    return rules::Cast<To>::f(x);
  }
};

/// Reads attrs.dtype (the target).
struct Cast {
  SC_OP_HEAD(Cast, "cast")
  static constexpr int arity = 1;
  static constexpr ElementwiseKind elementwise_kind = ElementwiseKind::cast;
  static constexpr bool vjp_takes_broadcast_grad = true;  // g converted elementwise

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location&) {
    return {in[0].shape(), a.dtype};
  }
  /// The gradient converted back to the input's dtype. Only between floating dtypes: a cast
  /// to or from an integer or bool carries no gradient (as TF), so integer code (indices,
  /// counts) never receives a truncated one.
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs&) {
    if (!is_floating(in[0].dtype()) || !is_floating(out.dtype())) return {Tensor()};
    return {detail::cast_to(g, in[0].dtype(), std::source_location::current())};
  }
  static void cuda(Inputs in, Tensor& out, const Attrs&, const std::source_location& loc) {
    backend::cuda::cast(in[0], out, name, loc);
  }
  static void cpu(Inputs in, Tensor& out, const Attrs&) {
    const std::int64_t n = out.numel();
    visit_dtype(in[0].dtype(), [&](auto from) {
      using S = typename decltype(from)::type;
      visit_dtype(out.dtype(), [&](auto to) {
        using T = typename decltype(to)::type;
        backend::cpu::unary_loop<CastTo<T>, S, T>(static_cast<const S*>(in[0].raw_data()),
                                                   static_cast<T*>(out.raw_data()), n, backend::cpu::grain_cheap);
      });
    });
  }
};

}  // namespace ops

/// x converted to dtype d (the same tensor when it already has d). Float to int truncates.
inline Tensor cast(const Tensor& x, DType d, std::source_location loc = std::source_location::current()) {
  detail::require_defined(x, "cast", loc);
  if (x.dtype() == d) return x;
  ops::Attrs a;
  a.dtype = d;
  return detail::dispatch<ops::Cast>({&x, 1}, a, loc);
}

inline Tensor detail::cast_to(const Tensor& t, DType d, const std::source_location& loc) { return cast(t, d, loc); }

inline Tensor Tensor::astype(DType d, std::source_location loc) const { return cast(*this, d, loc); }

}  // namespace stagecraft
