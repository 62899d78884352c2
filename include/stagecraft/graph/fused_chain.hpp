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
//
// A link is one case of a switch over its op and its form together (unary; the running value first
// or second; the operand per element or one value; maximum and minimum against one value that is
// not NaN in their short forms), so each case is straight-line code over the batches, a per-element
// operand folded into the op's instruction. Session 81, 1 thread, 128K floats in cache: traced K=16
// chains 63.6 -> 41.6 us (hand loop 30.4), K=8 35.7 -> 23.0 (19.8).
#pragma once

#include <algorithm>
#include <array>
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

/// A link's op and form together, the key of one switch (every case straight-line code): the
/// running value alone (unary), first or second of a binary op, against an operand read per
/// element or against one value; and for maximum and minimum against one value that is not NaN,
/// their rules' short forms (as compile-time staged code takes them for a constant):
/// lf_single_ordered op(v, s) by f_ordered_b (one compare and a blend instead of two compares, a
/// mask or and a blend), lf_single_plain op(v, s) or op(s, v) by f_ordered_nonzero_b (one max or
/// min instruction) where s is not zero either. Either gives the bits of f: with s not NaN, f(v, s)
/// and f(s, v) can differ only on a tie, and a tie is the same value unless both are zeros.
enum LinkForm : int { lf_unary, lf_first, lf_second, lf_first_single, lf_second_single, lf_single_ordered, lf_single_plain, link_forms };

/// Whether Op has the short forms of a single operand that is not NaN (maximum, minimum) over T.
template <class Op, class T>
constexpr bool has_ordered_forms() {
  if constexpr (!std::is_floating_point_v<T> || !chainable<Op, T>()) return false;
  else return requires(const batch<T>& v) { Op::f_ordered_b(v, v); Op::f_ordered_nonzero_b(v, v); };
}
template <class T>
inline constexpr std::array<bool, ops::num_ops> ordered_forms_table = {{
#define STAGECRAFT_ORDERED_FORMS(S) has_ordered_forms<ops::S, T>(),
    STAGECRAFT_OP_LIST(STAGECRAFT_ORDERED_FORMS)
#undef STAGECRAFT_ORDERED_FORMS
}};

/// l's switch key; s is its one value where l is single.
template <class T>
constexpr int link_code(const Link& l, T s) {
  int f = lf_unary;
  const int level = rules::ordered_level(s);
  if (l.form != Link::unary && l.single && ordered_forms_table<T>[static_cast<std::size_t>(l.op)] && level > 0)
    f = level == 2 ? lf_single_plain : (l.form == Link::first ? lf_single_ordered : lf_second_single);
  else if (l.form == Link::first) f = l.single ? lf_first_single : lf_first;
  else if (l.form == Link::second) f = l.single ? lf_second_single : lf_second;
  return static_cast<int>(l.op) * link_forms + f;
}

/// A link as run_chain walks it: its switch key, its operand per element (the tile's first
/// element) or its one value.
template <class T>
struct LinkRun {
  int code;
  const T* o;
  T s;
};

/// One link of op Op in form F over the U batches of running values v, its operand per element at
/// o (batch u at o + u * W) or the value s.
template <class Op, class T, int F, int U>
SC_ALWAYS_INLINE void apply_link(const T* o, const T& s, batch<T> (&v)[U]) {
  using B = batch<T>;
  constexpr std::int64_t W = B::size;
  if constexpr (F == lf_unary) {
    SC_UNROLL_FULL for (int u = 0; u < U; ++u) v[u] = B(Op::simd(v[u]));
  } else if constexpr (F == lf_first || F == lf_second) {
    SC_UNROLL_FULL for (int u = 0; u < U; ++u) {
      const B w = B::load_unaligned(o + u * W);
      if constexpr (F == lf_first) v[u] = B(Op::simd(v[u], w));
      else v[u] = B(Op::simd(w, v[u]));
    }
  } else {
    const B w(s);
    SC_UNROLL_FULL for (int u = 0; u < U; ++u) {
      if constexpr (F == lf_first_single) v[u] = B(Op::simd(v[u], w));
      else if constexpr (F == lf_second_single) v[u] = B(Op::simd(w, v[u]));
      else if constexpr (F == lf_single_ordered) v[u] = B(Op::f_ordered_b(v[u], w));
      else v[u] = B(Op::f_ordered_nonzero_b(v[u], w));
    }
  }
  SC_UNROLL_FULL for (int u = 0; u < U; ++u) pin<T>(v[u]);
}

/// The link r over U batches at element i: one switch over the op list and the forms (a chain
/// holds chainable ops only; a unary op has the unary form alone, a binary op the other four).
template <class T, int U>
SC_ALWAYS_INLINE void apply_link(const LinkRun<T>& r, std::int64_t i, batch<T> (&v)[U]) {
  switch (r.code) {
#define STAGECRAFT_CHAIN_FORM(S, F, when)                                                   \
  case static_cast<int>(ops::OpId::S) * link_forms + F:                                     \
    if constexpr (chainable<ops::S, T>() && (when))                                         \
      apply_link<ops::S, T, F, U>(r.o + (F == lf_first || F == lf_second ? i : 0), r.s, v); \
    return;
#define STAGECRAFT_CHAIN_CASES(S)                                                           \
  STAGECRAFT_CHAIN_FORM(S, lf_unary, ops::S::arity == 1)                                    \
  STAGECRAFT_CHAIN_FORM(S, lf_first, ops::S::arity == 2)                                    \
  STAGECRAFT_CHAIN_FORM(S, lf_second, ops::S::arity == 2)                                   \
  STAGECRAFT_CHAIN_FORM(S, lf_first_single, ops::S::arity == 2)                             \
  STAGECRAFT_CHAIN_FORM(S, lf_second_single, ops::S::arity == 2)                            \
  STAGECRAFT_CHAIN_FORM(S, lf_single_ordered, (has_ordered_forms<ops::S, T>()))             \
  STAGECRAFT_CHAIN_FORM(S, lf_single_plain, (has_ordered_forms<ops::S, T>()))
    STAGECRAFT_OP_LIST(STAGECRAFT_CHAIN_CASES)
#undef STAGECRAFT_CHAIN_CASES
#undef STAGECRAFT_CHAIN_FORM
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
  LinkRun<T> runs[max_links];  // (set as far as used: a tile's call is short, zeroing all would show)
  for (int l = 0; l < nlinks; ++l) {
    const Link& k = links[l];
    const T s = k.single ? *others[l] : T(0);
    runs[l] = {link_code<T>(k, s), k.form != Link::unary && !k.single ? others[l] : nullptr, s};
  }
  std::int64_t i = 0;
  for (; i + U * W <= n; i += U * W) {
    B v[U];
    SC_UNROLL_FULL for (int u = 0; u < U; ++u) v[u] = B::load_unaligned(head + i + u * W);
    for (int l = 0; l < nlinks; ++l) apply_link<T, U>(runs[l], i, v);
    SC_UNROLL_FULL for (int u = 0; u < U; ++u) v[u].store_unaligned(y + i + u * W);
  }
  for (; i + W <= n; i += W) {
    B v[1] = {B::load_unaligned(head + i)};
    for (int l = 0; l < nlinks; ++l) apply_link<T, 1>(runs[l], i, v);
    v[0].store_unaligned(y + i);
  }
  if (i < n) {  // the last partial batch: every link's operands zero-padded, as simd_kernel pads them
    const std::int64_t r = n - i;
    alignas(sizeof(B)) T t[W] = {}, o[W] = {};
    std::copy_n(head + i, r, t);
    B v[1] = {B::load_aligned(t)};
    for (int l = 0; l < nlinks; ++l) {
      LinkRun<T> padded = runs[l];
      if (padded.o) {
        std::copy_n(padded.o + i, r, o);
        padded.o = o;
      }
      apply_link<T, 1>(padded, 0, v);
      v[0].store_aligned(t);
      std::fill(t + r, t + W, T(0));
      v[0] = B::load_aligned(t);
    }
    std::copy_n(t, r, y + i);
  }
}

}  // namespace detail_fused

}  // namespace stagecraft::graph
