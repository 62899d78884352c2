// Random operands for the bit-for-bit tests of floating rules (test/ops/test_rules*.cpp): a small
// fixed generator (splitmix64), any bit pattern of a float type (every exponent, subnormals, NaNs
// and infinities), and uniform values in [0, 1). Header-only and stagecraft-free.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace sc_test {

struct SplitMix64 {
  std::uint64_t state;
  std::uint64_t operator()() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// The low bits of the next number as a T (float: 32, double: 64).
  template <class T>
  T bits() {
    using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    return bits_of<T>(static_cast<U>((*this)()));
  }
  template <class T, class U>
  static T bits_of(U u) {
    static_assert(sizeof(T) == sizeof(U));
    T t;
    std::memcpy(&t, &u, sizeof t);
    return t;
  }
  /// Uniform in [0, 1).
  template <class T>
  T unit() {
    return static_cast<T>(static_cast<double>((*this)() >> 11) * 0x1p-53);
  }
};

}  // namespace sc_test
