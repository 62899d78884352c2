// Tensors for file round trips: every dtype filled with a pattern that includes its extremes
// and, for floats, NaN, infinity, -0 and a denormal; and a byte-exact comparison.
#pragma once
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include <stagecraft/core/creation.hpp>
#include <stagecraft/core/tensor.hpp>

namespace sctest {

/// Element i of the test pattern for T.
template <class T>
T pattern(std::int64_t i) {
  if constexpr (std::is_same_v<T, bool>) return i % 3 == 0;
  else if constexpr (std::is_floating_point_v<T>) {
    const T special[] = {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(), T(-0.0),
                         std::numeric_limits<T>::lowest(), std::numeric_limits<T>::denorm_min()};
    return i < 5 ? special[i] : T(i) * T(0.37) - T(3);
  } else {
    return i == 0 ? std::numeric_limits<T>::min() : i == 1 ? std::numeric_limits<T>::max() : T(i * 7919 - 1000);
  }
}
/// A CPU tensor of shape s and dtype d holding the pattern.
inline sc::Tensor filled(const sc::Shape& s, sc::DType d) {
  sc::Tensor t = sc::detail::empty_tensor(s, d, sc::Device::cpu());
  sc::visit_dtype(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto* p = static_cast<T*>(t.raw_data());
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = pattern<T>(i);
  });
  return t;
}
/// The same dtype, shape and bytes (NaN equals NaN).
inline bool same_bytes(const sc::Tensor& a, const sc::Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

}  // namespace sctest
