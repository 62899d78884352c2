// Each elementwise op's math, written once: a functor `f` generic over the value type V, which is a
// scalar (float, double, an integer), an xsimd batch, and (next) a staged expression or a CUDA
// value. The eager loops, the fused evaluator and the staged evaluator all call these; an op's
// struct in unary.hpp / binary.hpp derives from its rule and adds only its name, kind and gradient.
//
// Dependency-free on purpose (only <cmath>): the functions a rule calls are found by argument-
// dependent lookup, so a batch finds xsimd's exp/select/isnan in xsimd's namespace, and scalars
// find the forms in rules::math below. Including this header pulls in no SIMD library, no tensor
// and no dispatch. Every function is SC_HOST_DEVICE, so the CUDA kernels (kernels/*.cu) call the
// very same rules; host compilers see no change.
#pragma once
#include <cmath>
#include <type_traits>

#include "../detail/host_device.hpp"

namespace stagecraft::rules {

/// Scalar forms of what the rules call; other value types bring theirs (found by ADL).
namespace math {
using std::cos;
using std::exp;
using std::log;
using std::sin;
using std::sqrt;
using std::tanh;
/// x > y ? x : y: x86's max instruction for scalars (y when either is NaN or on a tie); xsimd's
/// max on batches is that instruction, or a NaN-propagating one elsewhere.
template <class T>
  requires std::is_arithmetic_v<T>
SC_HOST_DEVICE constexpr T max(T x, T y) {
  return x > y ? x : y;
}
/// x < y ? x : y, as max.
template <class T>
  requires std::is_arithmetic_v<T>
SC_HOST_DEVICE constexpr T min(T x, T y) {
  return x < y ? x : y;
}
/// m ? a : b.
template <class T>
  requires std::is_arithmetic_v<T>
SC_HOST_DEVICE constexpr T select(bool m, T a, T b) {
  return m ? a : b;
}
/// x != x for floating x; never for integers.
template <class T>
  requires std::is_arithmetic_v<T>
SC_HOST_DEVICE constexpr bool isnan(T x) {
  if constexpr (std::is_floating_point_v<T>) return x != x;
  else return false;
}
/// |x| for floating x (fabs: +0 for -0).
template <class T>
  requires std::is_floating_point_v<T>
SC_HOST_DEVICE T abs(T x) {
  return std::fabs(x);
}
/// x converted to To (float to integer truncates). Named as xsimd's batch_cast, which batches
/// find by ADL; the backend uses that only where it gives the scalar conversion's numbers. A NaN,
/// an infinity or a value out of To's range gives To's lowest value (C++ leaves it undefined):
/// what x86's conversions give, so the SIMD lanes (cvttps2dq, vcvttpd2qq) agree.
template <class To, class T>
  requires std::is_arithmetic_v<T>
SC_HOST_DEVICE constexpr To batch_cast(T x) {
  if constexpr (std::is_floating_point_v<T> && std::is_integral_v<To> && std::is_signed_v<To>) {
    constexpr To lowest = static_cast<To>(std::make_unsigned_t<To>(1) << (8 * sizeof(To) - 1));
    constexpr T bound = -static_cast<T>(lowest);  // 2^31 or 2^63: exact in float and double
    if (!(x >= -bound && x < bound)) return lowest;
  }
  return static_cast<To>(x);
}
/// Whether V is a signed integer scalar: its +, -, * wrap below (two's complement, as SIMD
/// lanes do) instead of overflowing, which C++ leaves undefined.
template <class V>
inline constexpr bool wraps = std::is_integral_v<V> && std::is_signed_v<V>;
template <class V>
SC_HOST_DEVICE constexpr V wrap_add(V a, V b) {
  if constexpr (wraps<V>)
    return static_cast<V>(static_cast<std::make_unsigned_t<V>>(a) + static_cast<std::make_unsigned_t<V>>(b));
  else return static_cast<V>(a + b);
}
template <class V>
SC_HOST_DEVICE constexpr V wrap_sub(V a, V b) {
  if constexpr (wraps<V>)
    return static_cast<V>(static_cast<std::make_unsigned_t<V>>(a) - static_cast<std::make_unsigned_t<V>>(b));
  else return static_cast<V>(a - b);
}
/// A SIMD batch B<T, A> of signed integers as the same batch type of unsigned ones.
template <class V>
struct unsigned_batch {};
template <template <class, class> class B, class T, class A>
  requires std::is_integral_v<T> && std::is_signed_v<T>
struct unsigned_batch<B<T, A>> {
  using type = B<std::make_unsigned_t<T>, A>;
};
template <class V>
SC_HOST_DEVICE constexpr V wrap_mul(const V& a, const V& b) {
  if constexpr (wraps<V>) {
    return static_cast<V>(static_cast<std::make_unsigned_t<V>>(a) * static_cast<std::make_unsigned_t<V>>(b));
  } else if constexpr (requires { typename unsigned_batch<V>::type; }) {
    // where the target has no vector multiply for the width (int32 before SSE4.1, int64 before
    // AVX-512DQ) the SIMD library multiplies lane by lane in signed arithmetic: go through unsigned
    using U = typename unsigned_batch<V>::type;
    using R = typename V::register_type;  // the same register holds both (a reinterpretation)
    const U p = U(static_cast<R>(a)) * U(static_cast<R>(b));
    return V(static_cast<R>(p));
  } else {
    return static_cast<V>(a * b);
  }
}
}  // namespace math

/// The element type of V: V itself for a scalar, V::value_type for a vector (a SIMD batch).
template <class V>
struct element {
  using type = V;
};
template <class V>
  requires requires { typename V::value_type; }
struct element<V> {
  using type = typename V::value_type;
};
template <class V>
using element_t = typename element<V>::type;

/// What every rule has: `vectorizes` false marks a rule that SIMD batches must not use (the
/// loops then fall back to the scalar form).
struct Rule {
  static constexpr bool vectorizes = true;
};

// ---- unary ---------------------------------------------------------------------------------

/// -x. Floating values are multiplied by -1, which flips the sign bit exactly (-(+0) is -0):
/// SIMD negation in xsimd is 0 - x, which gives +0.
struct Neg : Rule {
  template <class V> SC_HOST_DEVICE static V f(const V& x) {
    if constexpr (std::is_floating_point_v<element_t<V>>) return V(x * V(-1));
    else if constexpr (math::wraps<V>) return math::wrap_sub(V(0), x);
    else return V(-x);
  }
};
struct Abs : Rule {
  template <class V> SC_HOST_DEVICE static V f(const V& x) {
    using math::abs, math::select;
    if constexpr (std::is_floating_point_v<element_t<V>>) return abs(x);
    else if constexpr (math::wraps<V>) return x < V(0) ? math::wrap_sub(V(0), x) : x;  // abs(INT_MIN) = INT_MIN
    else return select(x < V(0), V(-x), x);
  }
};
struct Square : Rule {
  template <class V> SC_HOST_DEVICE static V f(const V& x) { return math::wrap_mul(x, x); }
};
/// x < 0 ? 0 : x keeps NaN as NaN (as PyTorch does).
struct Relu : Rule {
  template <class V> SC_HOST_DEVICE static V f(const V& x) {
    using math::select;
    return select(x < V(0), V(0), x);
  }
};
/// -1, 0 or 1; NaN stays NaN.
struct Sign : Rule {
  template <class V> SC_HOST_DEVICE static V f(const V& x) {
    using math::isnan, math::select;
    const V s = V(select(V(0) < x, V(1), V(0)) - select(x < V(0), V(1), V(0)));
    if constexpr (std::is_floating_point_v<element_t<V>>) return select(isnan(x), x, s);
    else return s;
  }
};
struct Exp : Rule {
  template <class V> SC_HOST_DEVICE static V f(const V& x) {
    using math::exp;
    return exp(x);
  }
};
struct Log : Rule {
  template <class V> SC_HOST_DEVICE static V f(const V& x) {
    using math::log;
    return log(x);
  }
};
struct Sqrt : Rule {
  template <class V> SC_HOST_DEVICE static V f(const V& x) {
    using math::sqrt;
    return sqrt(x);
  }
};
struct Tanh : Rule {
  template <class V> SC_HOST_DEVICE static V f(const V& x) {
    using math::tanh;
    return tanh(x);
  }
};
/// 1 / (1 + e^-x): e^-x overflows to inf for very negative x, giving exactly 0.
struct Sigmoid : Rule {
  template <class V> SC_HOST_DEVICE static V f(const V& x) {
    using math::exp;
    return V(1) / (V(1) + exp(-x));
  }
};
struct Sin : Rule {
  template <class V> SC_HOST_DEVICE static V f(const V& x) {
    using math::sin;
    return sin(x);
  }
};
struct Cos : Rule {
  template <class V> SC_HOST_DEVICE static V f(const V& x) {
    using math::cos;
    return cos(x);
  }
};

// ---- binary --------------------------------------------------------------------------------

struct Add : Rule {
  template <class V> SC_HOST_DEVICE static V f(const V& a, const V& b) {
    if constexpr (math::wraps<V>) return math::wrap_add(a, b);
    else return V(a + b);
  }
};
struct Sub : Rule {
  template <class V> SC_HOST_DEVICE static V f(const V& a, const V& b) {
    if constexpr (math::wraps<V>) return math::wrap_sub(a, b);
    else return V(a - b);
  }
};
struct Mul : Rule {
  template <class V> SC_HOST_DEVICE static V f(const V& a, const V& b) { return math::wrap_mul(a, b); }
};
struct Div : Rule {
  template <class V> SC_HOST_DEVICE static V f(const V& a, const V& b) { return V(a / b); }
};
/// a^b; for integers by repeated squaring (a negative exponent gives 0 unless |a| is 1). Scalars
/// only: xsimd::pow returns 0 for 0^negative (IEEE and std::pow say inf).
struct Pow {
  static constexpr bool vectorizes = false;
  template <class V> SC_HOST_DEVICE static V f(V a, V b) {
    if constexpr (std::is_floating_point_v<V>) {
      return std::pow(a, b);
    } else {
      if (b < 0) return a == 1 ? V(1) : (a == -1 ? ((b & 1) ? V(-1) : V(1)) : V(0));
      V r = 1;
      for (; b; b >>= 1, a = math::wrap_mul(a, a))
        if (b & 1) r = math::wrap_mul(r, a);
      return r;
    }
  }
};
/// Larger of a and b; NaN in either gives NaN (as NumPy's maximum).
struct Maximum : Rule {
  template <class V> SC_HOST_DEVICE static V f(const V& a, const V& b) {
    using math::isnan, math::select;
    if constexpr (std::is_floating_point_v<element_t<V>>) return select((a > b) || isnan(a), a, b);
    else return select(a > b, a, b);
  }
  /// The same result when b is not NaN (a constant, checked once): one compare and one blend
  /// instead of two compares, a mask or and a blend. Ties and signed zeros give b, as f does.
  template <class V> SC_HOST_DEVICE static V f_ordered_b(const V& a, const V& b) {
    using math::select;
    return select(a <= b, b, a);
  }
  /// The same result when b is neither NaN nor zero: one max instruction. max(b, a) gives a when
  /// a is NaN, and on a tie the two are the same value (only zeros tie with a different sign).
  template <class V> SC_HOST_DEVICE static V f_ordered_nonzero_b(const V& a, const V& b) {
    using math::max;
    return max(b, a);
  }
};
/// Smaller of a and b; NaN in either gives NaN (as NumPy's minimum).
struct Minimum : Rule {
  template <class V> SC_HOST_DEVICE static V f(const V& a, const V& b) {
    using math::isnan, math::select;
    if constexpr (std::is_floating_point_v<element_t<V>>) return select((a < b) || isnan(a), a, b);
    else return select(a < b, a, b);
  }
  /// As Maximum::f_ordered_b: f's result when b is not NaN.
  template <class V> SC_HOST_DEVICE static V f_ordered_b(const V& a, const V& b) {
    using math::select;
    return select(a >= b, b, a);
  }
  /// As Maximum::f_ordered_nonzero_b: one min instruction.
  template <class V> SC_HOST_DEVICE static V f_ordered_nonzero_b(const V& a, const V& b) {
    using math::min;
    return min(b, a);
  }
};

// ---- comparisons and logical ops: a bool for scalars, a lane mask for batches ----------------

struct Less : Rule {
  template <class V> SC_HOST_DEVICE static auto f(const V& a, const V& b) { return a < b; }
};
struct LessEqual : Rule {
  template <class V> SC_HOST_DEVICE static auto f(const V& a, const V& b) { return a <= b; }
};
struct Greater : Rule {
  template <class V> SC_HOST_DEVICE static auto f(const V& a, const V& b) { return a > b; }
};
struct GreaterEqual : Rule {
  template <class V> SC_HOST_DEVICE static auto f(const V& a, const V& b) { return a >= b; }
};
struct Equal : Rule {
  template <class V> SC_HOST_DEVICE static auto f(const V& a, const V& b) { return a == b; }
};
/// a != b, true when either is NaN. Written !(a == b): xsimd's != is an ordered compare on AVX
/// (NaN != NaN false there).
struct NotEqual : Rule {
  template <class V> SC_HOST_DEVICE static auto f(const V& a, const V& b) { return !(a == b); }
};
/// Both nonzero (NaN counts as nonzero, as in C++).
struct LogicalAnd : Rule {
  template <class V> SC_HOST_DEVICE static auto f(const V& a, const V& b) { return !(a == V(0)) && !(b == V(0)); }
};
/// Either nonzero.
struct LogicalOr : Rule {
  template <class V> SC_HOST_DEVICE static auto f(const V& a, const V& b) { return !(a == V(0)) || !(b == V(0)); }
};
/// x == 0.
struct LogicalNot : Rule {
  template <class V> SC_HOST_DEVICE static auto f(const V& x) { return x == V(0); }
};

// ---- selection and conversion --------------------------------------------------------------

/// m ? a : b, lane by lane: m is a bool for scalars, a lane mask (of V's lanes) for batches.
struct Where : Rule {
  template <class M, class V> SC_HOST_DEVICE static V f(const M& m, const V& a, const V& b) {
    using math::select;
    return select(m, a, b);
  }
};
/// x as To. To bool means x != 0 (NaN is true, as in C++), so it gives a bool for scalars and a
/// lane mask for batches; to a number it is static_cast (float to integer truncates).
template <class To>
struct Cast : Rule {
  template <class V> SC_HOST_DEVICE static auto f(const V& x) {
    using math::batch_cast;
    if constexpr (std::is_same_v<To, bool>) return !(x == V(0));
    else return batch_cast<To>(x);
  }
};

}  // namespace stagecraft::rules
