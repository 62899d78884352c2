// The emulator's elementwise, layout, reduction and sorting kernels: kernels/elementwise.cu (unary,
// binary, where, cast, fill), layout.cu (strided_copy, concat, one_hot), reduce.cu, scan.cu, gather.cu's
// check_range and sort.cu, on the host. Each call is one launch (a closure: it may run later, at
// every launch of a captured graph, so it holds copies of what it reads) calling the same rules
// (ops/rules.hpp) on scalars, taking the dtypes and giving the statuses of the .cu files (one
// exception, for inputs dispatch never sends: bool_unary below).
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "../batch_elements.cuh"
#include "emu.hpp"
#include "stagecraft/ops/rules.hpp"
#include "stagecraft/ops/scan_steps.hpp"

namespace stagecraft::cuda::emu {
namespace {

// Which dtypes each rule takes, as elementwise.cu: floating rules f32/f64 only, arithmetic ones
// no bool, rules whose result is bool every dtype (anything else: not_supported, as the GPU's);
// batch_elements.cuh's table. A rule's result type is asked of i32 operands, where the .cu asks
// of T's: on bool every rule returns bool (V = bool), so there arithmetic rules take bool too,
// which dispatch never sends (ops/elementwise_rules.hpp). Here those give not_supported, and the
// host has no bool instances of them (the exp of a bool, a bool divided by false: a trap on x86).
namespace kb = cuda::kernels::batch;
template <class R>
constexpr bool bool_unary = kb::unary_gives_bool<R>;
template <class R>
constexpr bool bool_binary = kb::binary_gives_bool<R>;

template <class R, class T>
constexpr bool accepts() {
  return kb::takes<R, T>();
}

// ---- elementwise -------------------------------------------------------------------------------

template <class R, class T, class Out>
Status unary_as(const void* x, void* y, const Geometry& g, Stream s) {
  const auto* xd = static_cast<const T*>(x);
  auto* yd = static_cast<Out*>(y);
  return launch(s, [xd, yd, g] {
    const T* xh = host(xd);
    Out* yh = host(yd);
    for (std::int64_t i = 0; i < g.numel; ++i) yh[i] = static_cast<Out>(R::f(xh[g.contiguous ? i : offset_of(g, 0, i)]));
  });
}

template <class R>
Status run_unary(DT dt, const void* x, void* y, const Geometry& g, Stream s) {
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (bool_unary<R>) return unary_as<R, T, bool>(x, y, g, s);
    else if constexpr (accepts<R, T>()) return unary_as<R, T, T>(x, y, g, s);
    else return abi::not_supported;
  });
}

// The .cu's flat kernels (dense operands, or one a single value) read what offset_of reads for
// those geometries, so one strided loop stands for both.
template <class R, class T, class Out>
Status binary_as(const void* a, const void* b, void* y, const Geometry& g, Stream s) {
  const auto* ad = static_cast<const T*>(a);
  const auto* bd = static_cast<const T*>(b);
  auto* yd = static_cast<Out*>(y);
  return launch(s, [ad, bd, yd, g] {
    const T* ah = host(ad);
    const T* bh = host(bd);
    Out* yh = host(yd);
    for (std::int64_t i = 0; i < g.numel; ++i) {
      const std::int64_t oa = g.contiguous ? i : offset_of(g, 0, i), ob = g.contiguous ? i : offset_of(g, 1, i);
      yh[i] = static_cast<Out>(R::f(ah[oa], bh[ob]));
    }
  });
}

template <class R>
Status run_binary(DT dt, const void* a, const void* b, void* y, const Geometry& g, Stream s) {
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (bool_binary<R>) return binary_as<R, T, bool>(a, b, y, g, s);
    else if constexpr (accepts<R, T>()) return binary_as<R, T, T>(a, b, y, g, s);
    else return abi::not_supported;
  });
}

// ---- layout ------------------------------------------------------------------------------------

/// Moves elements as words of their size (the dtype does not matter), as layout.cu's kernels.
template <class W>
Status copy_as(const void* x, void* y, const Geometry& g, Stream s) {
  const auto* xd = static_cast<const W*>(x);
  auto* yd = static_cast<W*>(y);
  return launch(s, [xd, yd, g] {
    const W* xh = host(xd);
    W* yh = host(yd);
    for (std::int64_t i = 0; i < g.numel; ++i)
      yh[g.contiguous ? i : offset_of(g, 1, i)] = xh[g.contiguous ? i : offset_of(g, 0, i)];
  });
}

/// One launch of concat: its pieces (non-empty, copied: the caller's array may be gone when a
/// graph replays it), element i of a piece's x to row i / row, column i % row of its y.
template <class W>
Status concat_as(std::vector<abi::ConcatPiece> pieces, Stream s) {
  return launch(s, [pieces = std::move(pieces)] {
    for (const abi::ConcatPiece& p : pieces) {
      const W* x = host(static_cast<const W*>(p.x));
      W* y = host(static_cast<W*>(p.y));
      for (std::int64_t r = 0; r < p.rows; ++r) std::memcpy(y + r * p.pitch, x + r * p.row, sizeof(W) * p.row);
    }
  });
}

template <class I, class T>
Status one_hot_as(const void* ix, void* y, std::int64_t n, std::int64_t depth, Stream s) {
  const auto* id = static_cast<const I*>(ix);
  auto* yd = static_cast<T*>(y);
  return launch(s, [id, yd, n, depth] {
    const I* ih = host(id);
    T* yh = host(yd);
    // compared as i64 over [0, depth): an index outside (negative included) leaves its row all 0
    for (std::int64_t i = 0; i < n * depth; ++i) yh[i] = static_cast<std::int64_t>(ih[i / depth]) == i % depth ? T(1) : T(0);
  });
}

// ---- reductions --------------------------------------------------------------------------------

/// Integer sums wrap, as the CPU's adds and reduce.cu's SumOp do.
struct SumOp {
  template <class T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};
/// NaN propagates: the maximum rule with the new element first, as reduce.cu's MaxOp.
struct MaxOp {
  template <class T>
  T operator()(T acc, T x) const { return rules::Maximum::f(x, acc); }
};
struct MinOp {
  template <class T>
  T operator()(T acc, T x) const { return rules::Minimum::f(x, acc); }
};

template <class T>
struct Candidate {
  T value;
  std::int64_t index;
};

/// reduce.cu's ArgOp: NaN counts as the largest (argmax) or the smallest (argmin), the first NaN
/// winning; among equal values the first index wins.
template <bool IsMax>
struct ArgOp {
  template <class T>
  Candidate<T> operator()(const Candidate<T>& a, const Candidate<T>& b) const {
    const bool na = rules::math::isnan(a.value), nb = rules::math::isnan(b.value);
    if (na || nb) {
      if (na && nb) return a.index < b.index ? a : b;
      return na ? a : b;
    }
    if (a.value == b.value) return a.index < b.index ? a : b;
    return (IsMax ? a.value > b.value : a.value < b.value) ? a : b;
  }
};

/// What a reduction reads, accumulates and writes (reduce.cu's ValueReduction, ArgReduction).
template <class Op, class In, class Out>
struct ValueReduction {
  using Acc = Out;
  Op op;
  Acc load(const In* x, std::int64_t at, std::int64_t) const { return static_cast<Acc>(x[at]); }
  Out result(const Acc& a) const { return a; }
};
template <bool IsMax, class T>
struct ArgReduction {
  using Acc = Candidate<T>;
  ArgOp<IsMax> op;
  Acc load(const T* x, std::int64_t at, std::int64_t r) const { return Acc{x[at], r}; }
  std::int64_t result(const Acc& a) const { return a.index; }
};

/// Every output combines its row as reduce_kernel's block does: 256 threads each combine the
/// elements r = t, t + 256, ... in order, then their partials pairwise (CUB's tree differs in
/// detail; the order of a cut row's pieces is not kept). So a float sum rounds about as on the GPU,
/// not as one long running sum would (1e-4 off over 77,000 f32 terms). The rules' answers (NaN,
/// ties, wrap) are the same. An empty row gives Out{}, as reduce_kernel.
template <class R, class In, class Out>
Status reduce_as(const void* x, void* y, const abi::ReduceGeometry& g, void* scratch, Stream s) {
  // the kernel's own check: a cut reduction needs its scratch (here unused, but the caller's
  // mistake shows without a GPU)
  if (abi::reduce_split(g.out_numel, g.red_numel).chunks > 1 && scratch == nullptr) return invalid_value;
  const auto* xd = static_cast<const In*>(x);
  auto* yd = static_cast<Out*>(y);
  return launch(s, [xd, yd, g] {
    const In* xh = host(xd);
    Out* yh = host(yd);
    const R red{};
    for (std::int64_t o = 0; o < g.out_numel; ++o) {
      if (g.red_numel <= 0) {
        yh[o] = Out{};
        continue;
      }
      const std::int64_t base = strided_offset(g.kept_rank, g.kept_shape, g.kept_strides, o);
      const auto at = [&](std::int64_t r) { return base + strided_offset(g.red_rank, g.red_shape, g.red_strides, r); };
      constexpr std::int64_t threads = 256;
      typename R::Acc part[threads];
      const std::int64_t used = g.red_numel < threads ? g.red_numel : threads;
      for (std::int64_t t = 0; t < used; ++t) {
        part[t] = red.load(xh, at(t), t);
        for (std::int64_t r = t + threads; r < g.red_numel; r += threads) part[t] = red.op(part[t], red.load(xh, at(r), r));
      }
      for (std::int64_t w = threads / 2; w > 0; w /= 2)
        for (std::int64_t t = 0; t < w && t + w < used; ++t) part[t] = red.op(part[t], part[t + w]);
      yh[o] = red.result(part[0]);
    }
  });
}

template <class Op>
Status run_reduce(DT dt, const void* x, void* y, const abi::ReduceGeometry& g, void* scratch, Stream s) {
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {  // a bool sum counts (into i64); max and min are any and all
      if constexpr (std::is_same_v<Op, SumOp>)
        return reduce_as<ValueReduction<Op, bool, std::int64_t>, bool, std::int64_t>(x, y, g, scratch, s);
      else return reduce_as<ValueReduction<Op, bool, bool>, bool, bool>(x, y, g, scratch, s);
    } else {
      return reduce_as<ValueReduction<Op, T, T>, T, T>(x, y, g, scratch, s);
    }
  });
}

template <bool IsMax>
Status run_arg(DT dt, const void* x, void* y, const abi::ReduceGeometry& g, void* scratch, Stream s) {
  return visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    return reduce_as<ArgReduction<IsMax, T>, T, std::int64_t>(x, y, g, scratch, s);
  });
}

// ---- scans ---------------------------------------------------------------------------------------

/// Each line of [outer, n, inner] in order along n by scan_steps' steps (scan.cu's thread per line;
/// its block scan joins a long line's chunks in a tree, which this matches to rounding). `make`
/// builds the steps over host pointers when the launch runs.
template <class Make, class Out>
Status scan_as(Make make, Out* y, std::int64_t outer, std::int64_t n, std::int64_t inner, bool exclusive, bool reverse,
               Stream s) {
  return launch(s, [make, y, outer, n, inner, exclusive, reverse] {
    const auto steps = make();
    using S = std::remove_const_t<decltype(steps)>;
    Out* yh = host(y);
    for (std::int64_t line = 0; line < outer * inner; ++line) {
      const std::int64_t o = line / inner, i = line % inner;
      typename S::State acc = S::identity();
      for (std::int64_t k = 0; k < n; ++k) {
        const std::int64_t pos = reverse ? n - 1 - k : k, at = (o * n + pos) * inner + i;
        const typename S::State e = steps.element(at, pos);
        if (exclusive) yh[at] = S::out(acc);
        acc = k == 0 ? e : S::join(acc, e);
        if (!exclusive) yh[at] = S::out(acc);
      }
    }
  });
}

template <scan_steps::Rule R, class T>
Status values_as(const void* x, void* y, std::int64_t outer, std::int64_t n, std::int64_t inner, bool exclusive,
                 bool reverse, Stream s) {
  const auto* xd = static_cast<const T*>(x);
  return scan_as([xd] { return scan_steps::Values<T, R>{host(xd)}; }, static_cast<T*>(y), outer, n, inner, exclusive,
                 reverse, s);
}

// ---- top_k ---------------------------------------------------------------------------------------

/// The scratch sort.cu asks for, less the CUB sorts' own storage: two copies of the keys, and two
/// each of the positions and the line numbers (i64).
std::int64_t top_k_scratch(DT dt, std::int64_t lines, std::int64_t n) {
  const std::int64_t item = dt == DT::f32 || dt == DT::i32 ? 4 : 8;
  return lines * n * (2 * item + 32);
}

/// The unsigned key a radix sort orders T by, as CUB's: integers with the sign bit flipped,
/// floats with all bits flipped when negative and the sign bit set otherwise, after sort.cu's
/// canonical keys (every NaN the positive quiet one, above +inf; -0 as +0).
template <class T>
auto radix_key(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    constexpr U sign = U{1} << (8 * sizeof(T) - 1);
    const T c = v != v ? std::numeric_limits<T>::quiet_NaN() : (v == T(0) ? T(0) : v);
    U u;
    std::memcpy(&u, &c, sizeof u);
    return (u & sign) != 0 ? static_cast<U>(~u) : static_cast<U>(u | sign);
  } else {
    using U = std::make_unsigned_t<T>;
    return static_cast<U>(static_cast<U>(v) ^ (U{1} << (8 * sizeof(T) - 1)));
  }
}

/// Each line of [outer, n, inner] stable-sorted by radix key, the first k indices kept (sort.cu's
/// two radix sorts of all lines, by another road).
template <class T>
Status top_k_as(const void* x, std::int64_t* idx, std::int64_t outer, std::int64_t n, std::int64_t inner,
                std::int64_t k, bool largest, Stream s) {
  const auto* xd = static_cast<const T*>(x);
  return launch(s, [xd, idx, outer, n, inner, k, largest] {
    const T* xh = host(xd);
    std::int64_t* yh = host(idx);
    std::vector<std::int64_t> order(static_cast<std::size_t>(n));
    for (std::int64_t line = 0; line < outer * inner; ++line) {
      const std::int64_t o = line / inner, i = line % inner;
      const auto key = [&](std::int64_t j) { return radix_key(xh[(o * n + j) * inner + i]); };
      for (std::int64_t j = 0; j < n; ++j) order[static_cast<std::size_t>(j)] = j;
      std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
        return largest ? key(a) > key(b) : key(a) < key(b);
      });
      for (std::int64_t j = 0; j < k; ++j) yh[(o * k + j) * inner + i] = order[static_cast<std::size_t>(j)];
    }
  });
}

// ---- check_range -------------------------------------------------------------------------------

template <class I>
Status check_range_as(const void* x, void* y, std::int64_t n, std::int64_t lo, std::int64_t hi, abi::Fault* fault,
                      std::int32_t tag, Stream s) {
  const auto* xd = static_cast<const I*>(x);
  auto* yd = static_cast<I*>(y);
  return launch(
      s,
      [xd, yd, n, lo, hi, fault, tag] {
        const I* xh = host(xd);
        I* yh = host(yd);
        for (std::int64_t e = 0; e < n; ++e) {
          const I v = xh[e];
          yh[e] = v;  // copied all the same
          // the record's value is the element, its bound the element's index (gather.cu's kernel);
          // report_fault takes the device pointer and keeps the first
          if (static_cast<std::int64_t>(v) < lo || static_cast<std::int64_t>(v) >= hi)
            report_fault(fault, tag, static_cast<std::int64_t>(v), e);
        }
      },
      true);
}

template <class F>
Status visit_index(DT index_dt, F&& f) {
  if (index_dt == DT::i32) return f(std::int32_t{});
  if (index_dt == DT::i64) return f(std::int64_t{});
  return abi::not_supported;
}

}  // namespace
}  // namespace stagecraft::cuda::emu

namespace stagecraft::cuda::abi {

Status unary(UnaryRule r, DT dt, const void* x, void* y, const Geometry& g, Stream s) noexcept {
  if (g.numel == 0) return emu::ok;
  switch (r) {
#define SC_CASE(R) \
  case UnaryRule::R: return emu::run_unary<rules::R>(dt, x, y, g, s);
    SC_CUDA_UNARY_RULES(SC_CASE)
#undef SC_CASE
    default: return emu::invalid_value;
  }
}

Status binary(BinaryRule r, DT dt, const void* a, const void* b, void* y, const Geometry& g, Stream s) noexcept {
  if (g.numel == 0) return emu::ok;
  switch (r) {
#define SC_CASE(R) \
  case BinaryRule::R: return emu::run_binary<rules::R>(dt, a, b, y, g, s);
    SC_CUDA_BINARY_RULES(SC_CASE)
#undef SC_CASE
    default: return emu::invalid_value;
  }
}

Status add_n(DT dt, const void* const* x, int n, void* y, std::int64_t numel, Stream s) noexcept {
  if (n < 1 || n > add_n_max_inputs || dt == DT::b8) return emu::invalid_value;
  if (numel == 0) return emu::ok;
  std::array<const void*, add_n_max_inputs> in{};
  std::copy(x, x + n, in.begin());
  return emu::visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    return emu::launch(s, [in, n, y, numel] {
      T* yh = emu::host(static_cast<T*>(y));
      std::array<const T*, add_n_max_inputs> xh{};
      for (int k = 0; k < n; ++k) xh[k] = emu::host(static_cast<const T*>(in[k]));
      for (std::int64_t i = 0; i < numel; ++i) {  // (y may be x[0]: element i read before it is written)
        T acc = xh[0][i];
        for (int k = 1; k < n; ++k) acc = rules::Add::f(acc, xh[k][i]);
        yh[i] = acc;
      }
    });
  });
}

Status where(DT dt, const bool* c, const void* a, const void* b, void* y, const Geometry& g, Stream s) noexcept {
  if (g.numel == 0) return emu::ok;
  return emu::visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    const auto* ad = static_cast<const T*>(a);
    const auto* bd = static_cast<const T*>(b);
    auto* yd = static_cast<T*>(y);
    return emu::launch(s, [c, ad, bd, yd, g] {
      const bool* ch = emu::host(c);
      const T* ah = emu::host(ad);
      const T* bh = emu::host(bd);
      T* yh = emu::host(yd);
      for (std::int64_t i = 0; i < g.numel; ++i) {
        const bool m = ch[g.contiguous ? i : emu::offset_of(g, 0, i)];
        yh[i] = rules::Where::f(m, ah[g.contiguous ? i : emu::offset_of(g, 1, i)],
                                bh[g.contiguous ? i : emu::offset_of(g, 2, i)]);
      }
    });
  });
}

Status cast(DT from, DT to, const void* x, void* y, std::int64_t n, Stream s) noexcept {
  if (n == 0) return emu::ok;
  return emu::visit(from, [&](auto from_tag) -> Status {
    using S = decltype(from_tag);
    return emu::visit(to, [&](auto to_tag) -> Status {
      using T = decltype(to_tag);
      const auto* xd = static_cast<const S*>(x);
      auto* yd = static_cast<T*>(y);
      return emu::launch(s, [xd, yd, n] {
        const S* xh = emu::host(xd);
        T* yh = emu::host(yd);
        for (std::int64_t i = 0; i < n; ++i) yh[i] = static_cast<T>(rules::Cast<T>::f(xh[i]));
      });
    });
  });
}

Status fill(DT dt, double value, void* y, std::int64_t n, Stream s) noexcept {
  if (n == 0) return emu::ok;
  return emu::visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    // elementwise.cu converts on the host with static_cast<T>(value); batch_cast gives the same
    // numbers (x86's: NaN or out of range to the lowest integer) without C++'s undefined behaviour
    const T v = rules::math::batch_cast<T>(value);
    auto* yd = static_cast<T*>(y);
    return emu::launch(s, [v, yd, n] {
      T* yh = emu::host(yd);
      for (std::int64_t i = 0; i < n; ++i) yh[i] = v;
    });
  });
}

Status strided_copy(int itemsize, const void* x, void* y, const Geometry& g, Stream s) noexcept {
  if (g.numel == 0) return emu::ok;
  switch (itemsize) {
    case 1: return emu::copy_as<std::uint8_t>(x, y, g, s);
    case 4: return emu::copy_as<std::uint32_t>(x, y, g, s);
    case 8: return emu::copy_as<std::uint64_t>(x, y, g, s);
  }
  return emu::invalid_value;
}

Status concat(int itemsize, const ConcatPiece* p, int n, Stream s) noexcept {
  // a launch per max_concat_pieces pieces, empty ones left out, as layout.cu (a bad itemsize is
  // only noticed by a launch that has a piece to copy)
  for (int at = 0; at < n; at += max_concat_pieces) {
    std::vector<ConcatPiece> pieces;
    for (int j = at; j < n && j < at + max_concat_pieces; ++j)
      if (p[j].rows * p[j].row != 0) pieces.push_back(p[j]);
    if (pieces.empty()) continue;
    Status e = emu::ok;
    switch (itemsize) {
      case 1: e = emu::concat_as<std::uint8_t>(std::move(pieces), s); break;
      case 4: e = emu::concat_as<std::uint32_t>(std::move(pieces), s); break;
      case 8: e = emu::concat_as<std::uint64_t>(std::move(pieces), s); break;
      default: return emu::invalid_value;
    }
    if (e != emu::ok) return e;
  }
  return emu::ok;
}

Status one_hot(DT index_dt, DT dt, const void* ix, void* y, std::int64_t n, std::int64_t depth, Stream s) noexcept {
  if (n == 0 || depth == 0) return emu::ok;
  return emu::visit(dt, [&](auto tag) -> Status {
    using T = decltype(tag);
    if (index_dt == DT::i32) return emu::one_hot_as<std::int32_t, T>(ix, y, n, depth, s);
    if (index_dt == DT::i64) return emu::one_hot_as<std::int64_t, T>(ix, y, n, depth, s);
    return not_supported;
  });
}

Status reduce(ReduceRule r, DT dt, const void* x, void* y, const ReduceGeometry& g, void* scratch, Stream s) noexcept {
  if (g.out_numel == 0) return emu::ok;
  switch (r) {
    case ReduceRule::sum: return emu::run_reduce<emu::SumOp>(dt, x, y, g, scratch, s);
    case ReduceRule::max: return emu::run_reduce<emu::MaxOp>(dt, x, y, g, scratch, s);
    case ReduceRule::min: return emu::run_reduce<emu::MinOp>(dt, x, y, g, scratch, s);
    case ReduceRule::argmax: return emu::run_arg<true>(dt, x, y, g, scratch, s);
    case ReduceRule::argmin: return emu::run_arg<false>(dt, x, y, g, scratch, s);
  }
  return emu::invalid_value;
}

Status scan(ScanRule r, DT dt, const void* x, void* y, std::int64_t outer, std::int64_t n, std::int64_t inner,
            bool exclusive, bool reverse, Stream s) noexcept {
  if (outer == 0 || n == 0 || inner == 0) return emu::ok;
  const auto run = [&](auto tag) -> Status {
    using T = decltype(tag);
    using scan_steps::Rule;
    switch (r) {
      case ScanRule::sum: return emu::values_as<Rule::sum, T>(x, y, outer, n, inner, exclusive, reverse, s);
      case ScanRule::prod: return emu::values_as<Rule::prod, T>(x, y, outer, n, inner, exclusive, reverse, s);
      case ScanRule::logsumexp:
        if constexpr (std::is_floating_point_v<T>)
          return emu::values_as<Rule::logsumexp, T>(x, y, outer, n, inner, exclusive, reverse, s);
        else return emu::invalid_value;
      case ScanRule::max: return emu::values_as<Rule::max, T>(x, y, outer, n, inner, exclusive, reverse, s);
      case ScanRule::min: return emu::values_as<Rule::min, T>(x, y, outer, n, inner, exclusive, reverse, s);
    }
    return emu::invalid_value;
  };
  return emu::visit(dt, [&](auto tag) -> Status {
    if constexpr (std::is_same_v<decltype(tag), bool>) return emu::invalid_value;
    else return run(tag);
  });
}

Status linear_scan(DT dt, const void* a, const void* b, void* y, std::int64_t outer, std::int64_t n,
                   std::int64_t inner, bool exclusive, bool reverse, Stream s) noexcept {
  if (outer == 0 || n == 0 || inner == 0) return emu::ok;
  const auto run = [&](auto tag) -> Status {
    using T = decltype(tag);
    const auto* ad = static_cast<const T*>(a);
    const auto* bd = static_cast<const T*>(b);
    return emu::scan_as([ad, bd] { return scan_steps::Linear<T>{emu::host(ad), emu::host(bd)}; }, static_cast<T*>(y), outer, n,
                        inner, exclusive, reverse, s);
  };
  switch (dt) {
    case DT::f32: return run(float{});
    case DT::f64: return run(double{});
    default: return emu::invalid_value;
  }
}

Status cum_arg(bool is_max, DT dt, const void* x, std::int64_t* idx, std::int64_t outer, std::int64_t n,
               std::int64_t inner, bool reverse, Stream s) noexcept {
  if (outer == 0 || n == 0 || inner == 0) return emu::ok;
  const auto run = [&](auto tag) -> Status {
    using T = decltype(tag);
    const auto* xd = static_cast<const T*>(x);
    if (is_max)
      return emu::scan_as([xd] { return scan_steps::Arg<T, true>{emu::host(xd)}; }, idx, outer, n, inner, false, reverse, s);
    return emu::scan_as([xd] { return scan_steps::Arg<T, false>{emu::host(xd)}; }, idx, outer, n, inner, false, reverse, s);
  };
  return emu::visit(dt, [&](auto tag) -> Status {
    if constexpr (std::is_same_v<decltype(tag), bool>) return emu::invalid_value;
    else return run(tag);
  });
}

Status top_k_scratch_bytes(DT dt, std::int64_t lines, std::int64_t n, std::int64_t* bytes) noexcept {
  *bytes = lines == 0 || n == 0 ? 0 : emu::top_k_scratch(dt, lines, n);
  return emu::ok;
}

Status top_k(DT dt, const void* x, std::int64_t* idx, std::int64_t outer, std::int64_t n, std::int64_t inner,
             std::int64_t k, bool largest, void* scratch, std::int64_t scratch_bytes, Stream s) noexcept {
  if (outer == 0 || inner == 0 || k == 0) return emu::ok;
  if (k > n || scratch == nullptr || scratch_bytes < emu::top_k_scratch(dt, outer * inner, n)) return emu::invalid_value;
  switch (dt) {
    case DT::i32: return emu::top_k_as<std::int32_t>(x, idx, outer, n, inner, k, largest, s);
    case DT::i64: return emu::top_k_as<std::int64_t>(x, idx, outer, n, inner, k, largest, s);
    case DT::f32: return emu::top_k_as<float>(x, idx, outer, n, inner, k, largest, s);
    case DT::f64: return emu::top_k_as<double>(x, idx, outer, n, inner, k, largest, s);
    default: return emu::invalid_value;
  }
}

Status check_range(DT dt, const void* x, void* y, std::int64_t n, std::int64_t lo, std::int64_t hi, Fault* fault,
                   std::int32_t tag, Stream s) noexcept {
  if (n == 0) return emu::ok;
  return emu::visit_index(dt, [&](auto itag) -> Status {
    using I = decltype(itag);
    return emu::check_range_as<I>(x, y, n, lo, hi, fault, tag, s);
  });
}

}  // namespace stagecraft::cuda::abi
