// Chains of the fused evaluator (fused_kernel.hpp): consecutive instructions each of which reads
// the result of the one before, its only reader, run as one pass over a tile with the running
// value in registers, where the tile loop would store every intermediate to its scratch slot and
// load it back in the next instruction's pass. sum(2x + 1) over rows traced made three passes over
// each tile (mul, add, the row sum), a chain makes two.
//
// Numerics are the tile loop's: every link is its op's SIMD rule (Op::simd) over the same lanes of
// the same batches (batches start at the tile's start in both), a tile's last partial batch goes
// through each link zero-padded (the padding lanes set to zero again after every link, as each
// instruction of the tile loop pads its own operands), and nothing contracts a multiply and an
// add of two links into one fused multiply-add (each link's result is pinned to a register). Only
// ops whose SIMD rule is cheap next to a pass over L1 and does not depend on the other lanes are
// links: binary ops and the numeric unary ones (neg, abs, relu, square, sign); a transcendental
// costs many times the load and store it would save. Nor are the ops whose rule is scalar in general
// and has batch forms for some types only (pow, mod, floor_div: rules' `vectorizes` false): those
// forms are long and call out (pow_float_batch, per_lane), and inlined into the links' switch they
// pushed every link's running values out of registers (traced K=16 chains of adds, 1M floats, one
// thread: 918 us against 885 unchained; 468 without them as links).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../backend/cpu/elementwise.hpp"
#include "../ops/registry.hpp"
#include "fused_ops.hpp"

namespace stagecraft::graph {

/// Whether prepare() forms chains (default true). Off, every instruction is a pass of its own (for
/// comparisons); programs prepared before keep what they have.
inline bool& fused_chains() {
  static bool on = true;
  return on;
}

namespace detail_fused {

/// Links in one chain at most (a longer run of instructions makes several chains).
inline constexpr int max_links = 16;

/// One instruction of a chain over the running value v: op(v) (unary), op(v, o) or op(o, v) (binary),
/// o its operand, read per element or as one value.
struct Link {
  enum Form : std::uint8_t { unary, first, second };  ///< v's place among the op's operands
  ops::OpId op{};
  Form form = unary;
  bool single = false;  ///< o is one value (a single-valued register, or a splat input of the tile)
  int other = -1;       ///< o's register, or -2 - k for the tile's k-th splat input (as Step's operands)
};
/// A run of links: the running value starts as register `head`; the last link's result is the
/// step's y.
struct Chain {
  int head = -1;
  std::vector<Link> links;
};

/// Whether Op may be a link over T (see the header's comment).
template <class Op, class T>
constexpr bool chainable() {
  // (has_simd only where the op keeps the dtype: asking deduces the SIMD rule's return type)
  if constexpr (!keeps_dtype<Op, T>()) {
    return false;
  } else if constexpr (!has_simd<Op, T>() || !Op::vectorizes) {
    return false;
  } else {
    bool batch_dependent = false;
    if constexpr (requires { Op::batch_dependent; }) batch_dependent = Op::batch_dependent;
    if constexpr (UnaryOp<Op>)
      return !batch_dependent && decltype(unary_kind_of(std::declval<const Op*>()))::value == ops::UnaryKind::numeric;
    else
      return !batch_dependent;
  }
}

/// Every op's chainable<Op, T>(), in op-list order.
template <class T>
inline constexpr std::array<bool, ops::num_ops> chainable_table = {{
#define STAGECRAFT_CHAINABLE(S) chainable<ops::S, T>(),
    STAGECRAFT_OP_LIST(STAGECRAFT_CHAINABLE)
#undef STAGECRAFT_CHAINABLE
}};
template <class T>
constexpr bool chainable(ops::OpId op) {
  return chainable_table<T>[static_cast<std::size_t>(op)];
}

/// Keeps v as computed, in a register: the compiler may not fuse the op that made it with the next
/// link's op (a multiply and an add into one FMA would change the rounding). GCC 12 contracts within
/// a basic block only, and each link is a case of the switch below, so this guards the links' code
/// against a change that would put two ops in one block (test_staged_fma checks traced chains).
template <class T>
SC_ALWAYS_INLINE void pin(batch<T>& v) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  auto r = static_cast<typename batch<T>::register_type>(v);
  __asm__("" : "+v"(r));
  v = batch<T>(r);
#elif defined(__GNUC__) && defined(__aarch64__)
  auto r = static_cast<typename batch<T>::register_type>(v);
  __asm__("" : "+w"(r));
  v = batch<T>(r);
#else
  (void)v;
#endif
}

/// One link of op Op over the U batches of running values v at element i, its operand per element
/// at o (batch u at o + i + u * W; null for unary links) or the value `one`.
template <class Op, class T, int U>
SC_ALWAYS_INLINE void apply_link(const Link& l, const T* o, std::int64_t i, const batch<T>& one, batch<T> (&v)[U]) {
  using B = batch<T>;
  constexpr std::int64_t W = B::size;
  if constexpr (Op::arity == 1) {
    for (int u = 0; u < U; ++u) v[u] = B(Op::simd(v[u]));
  } else {
    B w[U];
    if (l.single)
      for (int u = 0; u < U; ++u) w[u] = one;
    else
      for (int u = 0; u < U; ++u) w[u] = B::load_unaligned(o + i + u * W);
    if (l.form == Link::first)
      for (int u = 0; u < U; ++u) v[u] = B(Op::simd(v[u], w[u]));
    else
      for (int u = 0; u < U; ++u) v[u] = B(Op::simd(w[u], v[u]));
  }
  for (int u = 0; u < U; ++u) pin<T>(v[u]);
}

/// The link l over U batches: a switch over the op list (a chain holds chainable ops only).
template <class T, int U>
SC_ALWAYS_INLINE void apply_link(const Link& l, const T* o, std::int64_t i, const batch<T>& one, batch<T> (&v)[U]) {
  switch (l.op) {
#define STAGECRAFT_CHAIN_CASE(S)                                                \
  case ops::OpId::S:                                                            \
    if constexpr (chainable<ops::S, T>()) apply_link<ops::S, T, U>(l, o, i, one, v); \
    return;
    STAGECRAFT_OP_LIST(STAGECRAFT_CHAIN_CASE)
#undef STAGECRAFT_CHAIN_CASE
    default: return;
  }
}

/// y[0, n) = the chain's links applied in turn to head[0, n), links[l]'s operand at others[l]
/// (one value when the link is single; null when unary). y may be head or an operand (each batch is read before it
/// is written).
template <class T>
void run_chain(const Link* links, int nlinks, const T* const* others, const T* head, T* y, std::int64_t n) {
  using B = batch<T>;
  constexpr std::int64_t W = B::size;
  // batches per pass through the links, the running values in registers (8 chained ops over 1M floats,
  // 1 thread: AVX2 660 -> 355 us from 4 to 8, AVX-512 290-356 -> 245 us)
  constexpr int U = 8;
  B one[max_links];
  for (int l = 0; l < nlinks; ++l) one[l] = links[l].single ? B(*others[l]) : B(T(0));
  std::int64_t i = 0;
  for (; i + U * W <= n; i += U * W) {
    B v[U];
    for (int u = 0; u < U; ++u) v[u] = B::load_unaligned(head + i + u * W);
    for (int l = 0; l < nlinks; ++l) apply_link<T, U>(links[l], others[l], i, one[l], v);
    for (int u = 0; u < U; ++u) v[u].store_unaligned(y + i + u * W);
  }
  for (; i + W <= n; i += W) {
    B v[1] = {B::load_unaligned(head + i)};
    for (int l = 0; l < nlinks; ++l) apply_link<T, 1>(links[l], others[l], i, one[l], v);
    v[0].store_unaligned(y + i);
  }
  if (i < n) {  // the last partial batch: every link's operands zero-padded, as simd_kernel pads them
    const std::int64_t r = n - i;
    alignas(sizeof(B)) T t[W] = {}, o[W] = {};
    std::copy_n(head + i, r, t);
    B v[1] = {B::load_aligned(t)};
    for (int l = 0; l < nlinks; ++l) {
      if (links[l].form != Link::unary && !links[l].single) std::copy_n(others[l] + i, r, o);
      apply_link<T, 1>(links[l], o, 0, one[l], v);
      v[0].store_aligned(t);
      std::fill(t + r, t + W, T(0));
      v[0] = B::load_aligned(t);
    }
    std::copy_n(t, r, y + i);
  }
}

}  // namespace detail_fused

}  // namespace stagecraft::graph
