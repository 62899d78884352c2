// The steps of the scans (cumsum, cumprod, logcumsumexp, cummax, cummin, cumargmax, cumargmin,
// linear_scan): a line's running state, how an element becomes one and how two states join. One
// definition that the CPU (ops/scan.hpp), the GPU's kernels (kernels/reduce.cu) and the emulator
// run, so the three agree on every rule (NaN, ties, wrapping, the first element).
#pragma once
#include <cstdint>
#include <limits>
#include <type_traits>

#include "rules.hpp"

namespace stagecraft::scan_steps {

/// The rule of a scan over one value per element (abi::ScanRule names the same five).
enum class Rule : int { sum = 0, prod = 1, logsumexp = 2, max = 3, min = 4 };

/// log(e^a + e^b) without overflow: the larger plus log1p(e^-|a - b|). Equal values (two
/// infinities of one sign too) give a + log 2, -inf with -inf gives -inf; a NaN in either gives NaN.
template <class T>
SC_HOST_DEVICE T log_add_exp(T a, T b) {
  using rules::math::exp, rules::math::log1p;
  if (a == b) return a + T(0.693147180559945309417232121458176568);
  const bool a_big = a > b;  // false with a NaN: then d is NaN and so is the result
  const T big = a_big ? a : b, d = a_big ? b - a : a - b;
  return big + log1p(exp(d));
}

/// Join(acc, x) of a rule: associative, with an identity that joins as a no-op.
template <Rule R>
struct Join;
template <>
struct Join<Rule::sum> {  // integers wrap (as sum's adds)
  template <class T> SC_HOST_DEVICE static T f(T acc, T x) { return rules::Add::f(acc, x); }
  template <class T> SC_HOST_DEVICE static T identity() { return T(0); }
};
template <>
struct Join<Rule::prod> {  // integers wrap
  template <class T> SC_HOST_DEVICE static T f(T acc, T x) { return rules::Mul::f(acc, x); }
  template <class T> SC_HOST_DEVICE static T identity() { return T(1); }
};
template <>
struct Join<Rule::logsumexp> {
  template <class T> SC_HOST_DEVICE static T f(T acc, T x) { return log_add_exp(acc, x); }
  template <class T> SC_HOST_DEVICE static T identity() { return -std::numeric_limits<T>::infinity(); }
};
// max and min: maximum's and minimum's rule with the new element first (as the reductions), so a
// NaN stays, written as a plain max and then the NaN test: the test is off the running value's
// chain (one maxss and a blend a step on x86, where `(x > acc || x != x) ? x : acc` took 4.5x).
template <>
struct Join<Rule::max> {
  template <class T> SC_HOST_DEVICE static T f(T acc, T x) {
    const T m = x > acc ? x : acc;
    return rules::math::isnan(x) ? x : m;
  }
  template <class T> SC_HOST_DEVICE static T identity() {
    if constexpr (std::is_floating_point_v<T>) return -std::numeric_limits<T>::infinity();
    else return std::numeric_limits<T>::lowest();
  }
};
template <>
struct Join<Rule::min> {
  template <class T> SC_HOST_DEVICE static T f(T acc, T x) {
    const T m = x < acc ? x : acc;
    return rules::math::isnan(x) ? x : m;
  }
  template <class T> SC_HOST_DEVICE static T identity() {
    if constexpr (std::is_floating_point_v<T>) return std::numeric_limits<T>::infinity();
    else return std::numeric_limits<T>::max();
  }
};

/// A running value: cumsum, cumprod, logcumsumexp, cummax, cummin.
template <class T, Rule R>
struct Values {
  using State = T;
  using Out = T;
  const T* x;
  SC_HOST_DEVICE State element(std::int64_t at, std::int64_t) const { return x[at]; }
  SC_HOST_DEVICE static State join(const State& acc, const State& e) { return Join<R>::f(acc, e); }
  SC_HOST_DEVICE static Out out(const State& s) { return s; }
  SC_HOST_DEVICE static State identity() { return Join<R>::template identity<T>(); }
};

/// linear_scan: h[k] = a[k] * h[k-1] + b[k]. A state is the map h -> a * h + b of a run of
/// elements; maps compose (a1, b1) then (a2, b2) = (a1 a2, a2 b1 + b2), so a block can scan them
/// in a tree. The first element's map is applied to nothing: h = b there (a is not read).
template <class T>
struct Linear {
  struct State {
    T a, h;
  };
  using Out = T;
  const T* a;
  const T* b;
  SC_HOST_DEVICE State element(std::int64_t at, std::int64_t) const { return {a[at], b[at]}; }
  SC_HOST_DEVICE static State join(const State& l, const State& r) {
    return {rules::Mul::f(l.a, r.a), rules::Add::f(rules::Mul::f(r.a, l.h), r.h)};
  }
  SC_HOST_DEVICE static Out out(const State& s) { return s.h; }
  SC_HOST_DEVICE static State identity() { return {T(1), T(0)}; }
};

/// linear_scan on the CPU, one line (or one block of lines) in order: the state is h alone and a
/// step reads a where it lies (`next`), h = a * h + b, the multiply and add of Linear's join
/// without its product of a (which only a tree of joins needs). Its numbers are Linear's run in order.
template <class T>
struct LinearInOrder {
  using State = T;
  using Out = T;
  const T* a;
  const T* b;
  SC_HOST_DEVICE State element(std::int64_t at, std::int64_t) const { return b[at]; }
  SC_HOST_DEVICE State next(const State& h, std::int64_t at, std::int64_t) const {
    return rules::Add::f(rules::Mul::f(a[at], h), b[at]);
  }
  SC_HOST_DEVICE static Out out(const State& s) { return s; }
  SC_HOST_DEVICE static State identity() { return T(0); }
};

/// cumargmax, cumargmin: the index (along the axis) where the running extreme was first reached,
/// in scan order. A NaN beats every number and keeps the first NaN's index (argmax's rule); equal
/// values keep the earlier index, so x at the index is the running value of cummax and cummin.
template <class T, bool IsMax>
struct Arg {
  struct State {
    T v;
    std::int64_t i;  ///< -1: the identity (no element yet)
  };
  using Out = std::int64_t;
  const T* x;
  SC_HOST_DEVICE State element(std::int64_t at, std::int64_t k) const { return {x[at], k}; }
  SC_HOST_DEVICE static bool beats(T r, T l) {
    using rules::math::isnan;
    if (isnan(r)) return !isnan(l);
    return IsMax ? r > l : r < l;
  }
  SC_HOST_DEVICE static State join(const State& l, const State& r) {
    if (l.i < 0) return r;
    if (r.i < 0) return l;
    return beats(r.v, l.v) ? r : l;
  }
  SC_HOST_DEVICE static Out out(const State& s) { return s.i; }
  SC_HOST_DEVICE static State identity() { return {T(0), -1}; }
};

}  // namespace stagecraft::scan_steps
