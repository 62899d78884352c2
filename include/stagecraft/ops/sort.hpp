// Sorting along an axis: the op top_k (the indices of the k largest or smallest entries of each
// line, in order), and on it topk, argsort and sort; take_along_axis (ops/along_axis.hpp) picks x's
// entries by such indices, and carries the gradient of the sorted values back to x.
#pragma once
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <source_location>
#include <type_traits>
#include <utility>
#include <vector>

#include "../backend/cpu/parallel.hpp"
#include "../eager/dispatch.hpp"
#include "along_axis.hpp"
#include "binary.hpp"
#include "check_range.hpp"
#include "gather.hpp"
#include "reshape.hpp"
#include "where.hpp"

namespace stagecraft {
namespace ops {

/// The order top_k sorts by, as unsigned keys compared ascending: descending (largest) or
/// ascending values, a NaN above every number (first when descending, last when ascending, as
/// PyTorch's sort), -0 equal to +0; packed with the index, equal keys fall in index order (a total
/// order: the result never depends on the algorithm or the threads). 4-byte values pack with a
/// 32-bit index into one 64-bit integer (lines up to 2^32); 8-byte ones pair with it.
template <class T>
struct OrderKey {
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  static constexpr U sign = U{1} << (8 * sizeof(T) - 1);
  static constexpr bool packs = sizeof(T) == 4;
  using Packed = std::conditional_t<packs, std::uint64_t, std::pair<std::uint64_t, std::int64_t>>;

  /// v's key ascending: floats by their bits (negatives flipped, positives with the sign bit
  /// set), a NaN the largest key; integers with the sign bit flipped. Plain integer arithmetic, no
  /// branches (the signs of a line are random), so a loop of them vectorizes.
  static U bits(T v) {
    if constexpr (std::is_floating_point_v<T>) {
      using S = std::make_signed_t<U>;
      const T c = v + T(0);  // -0 as +0
      S s;
      std::memcpy(&s, &c, sizeof s);
      U u = static_cast<U>(s) ^ (static_cast<U>(s >> (8 * sizeof(T) - 1)) | sign);  // (C++20: >> is arithmetic)
      return u | static_cast<U>(U{0} - static_cast<U>(v != v));
    } else {
      return static_cast<U>(static_cast<U>(v) ^ sign);
    }
  }
  /// What a key is xor-ed with: all ones when the largest come first.
  static U flip(bool largest) { return largest ? static_cast<U>(~U{0}) : U{0}; }
  /// v's key in the order asked for.
  static U of(T v, bool largest) { return static_cast<U>(bits(v) ^ flip(largest)); }
  static Packed pack(T v, std::int64_t j, bool largest) {
    if constexpr (packs) return (std::uint64_t{of(v, largest)} << 32) | static_cast<std::uint64_t>(j);
    else return {of(v, largest), j};
  }
  static U key(const Packed& p) {
    if constexpr (packs) return static_cast<U>(p >> 32);
    else return p.first;
  }
  static std::int64_t index(const Packed& p) {
    if constexpr (packs) return static_cast<std::int64_t>(p & 0xFFFFFFFFu);
    else return p.second;
  }
};

/// The indices (i64) of the k largest (attrs.flag) or smallest entries of each line of x along
/// attrs.axis, in that order (attrs.i0 = k): out has x's shape with k along the axis. Numeric
/// dtypes; k in [0, extent]. Not differentiable: the values' gradient flows through
/// take_along_axis (topk, sort).
struct TopKIndices {
  SC_OP_HEAD(TopKIndices, "top_k")
  static constexpr int arity = 1;
  static constexpr bool differentiable = false;

  static OutMeta infer(Inputs in, const Attrs& a, const std::source_location& loc) {
    const Tensor& x = in[0];
    require_dtype(!is_bool(x.dtype()), name, x.dtype(), "numeric dtypes", loc);
    if (x.rank() == 0)
      detail::fail<ShapeError>(name, loc, "needs a tensor of rank >= 1 (an axis to sort along), got shape ", x.shape());
    const int ax = normalize_axis(a.axis, x.rank(), name, loc);
    if (SC_UNLIKELY(a.i0 < 0 || a.i0 > x.shape()[ax]))
      detail::fail<ValueError>(name, loc, "k = ", a.i0, " is outside [0, ", x.shape()[ax], "] for axis ", a.axis,
                               " of shape ", x.shape());
    if (SC_UNLIKELY(x.shape()[ax] > std::int64_t{0xFFFFFFFF}))
      detail::fail<ShapeError>(name, loc, "sorts lines of up to 2^32 - 1 elements, got ", x.shape()[ax], " along axis ",
                               a.axis, " of shape ", x.shape());
    Shape s = x.shape();
    s[ax] = a.i0;
    return {s, DType::i64};
  }

  /// A sort of every line on the device (CUB's segmented stable radix sort), the first k kept.
  static void cuda(Inputs in, Tensor& out, const Attrs& a, const std::source_location& loc) {
    const AxisSplit sp = axis_split(in[0].shape(), a.axis);
    backend::cuda::top_k(in[0], out, sp.outer, sp.n, sp.inner, a.i0, a.flag, name, loc);
  }

  /// Threads over lines, each line's values turned into OrderKey packs (key and index). A small k
  /// (<= 32) keeps the k first seen so far in order: most elements cost one compare with the k-th.
  /// Otherwise the packs are selected (nth_element) and the k first sorted: O(n + k log k) a line.
  static void cpu(Inputs in, Tensor& out, const Attrs& a) {
    if (out.numel() == 0) return;
    const AxisSplit sp = axis_split(in[0].shape(), a.axis);
    const std::int64_t n = sp.n, inner = sp.inner, k = a.i0;
    const bool largest = a.flag;
    visit_dtype(in[0].dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (!std::is_same_v<T, bool>) {
        using Key = OrderKey<T>;
        using Packed = typename Key::Packed;
        const T* x = static_cast<const T*>(in[0].raw_data());
        auto* y = static_cast<std::int64_t*>(out.raw_data());
        const auto log_k = static_cast<std::int64_t>(std::bit_width(static_cast<std::uint64_t>(k)));
        // (costly work: a key, a compare and a branch per element, several ns, where an add is a fraction)
        backend::cpu::parallel_rows(sp.outer * inner, n * (1 + log_k), backend::cpu::grain_costly,
                                    [&](std::int64_t lb, std::int64_t le) {
          std::vector<Packed> packs;
          for (std::int64_t line = lb; line < le; ++line) {
            const std::int64_t o = line / inner, i = line % inner;
            const T* xl = x + o * n * inner + i;
            std::int64_t* yl = y + o * k * inner + i;
            packs.clear();
            if (k <= 32 && k < n) {
              const auto insert = [&packs](const Packed& p) {
                auto at = packs.end();
                while (at != packs.begin() && p < *(at - 1)) --at;
                packs.insert(at, p);
              };
              for (std::int64_t j = 0; j < k; ++j) insert(Key::pack(xl[j * inner], j, largest));
              Packed last = packs.back();  // the k-th so far: most elements stop at it
              const auto consider = [&](std::int64_t j) {
                const Packed p = Key::pack(xl[j * inner], j, largest);
                if (SC_LIKELY(!(p < last))) return;
                packs.pop_back();
                insert(p);
                last = packs.back();
              };
              std::int64_t j = k;
              {
                // blocks of 16 keys (a vector loop) whose least is not ahead of the k-th: skipped
                // whole (an equal key comes later in the line, so it is behind)
                constexpr std::int64_t block = 16;
                using U = typename Key::U;
                const U flip = Key::flip(largest);
                for (; j + block <= n; j += block) {
                  U least = ~U{0};
                  const T* xb = xl + j * inner;
                  if (inner == 1) {  // contiguous: a vector loop
                    for (std::int64_t b = 0; b < block; ++b) {
                      const U u = static_cast<U>(Key::bits(xb[b]) ^ flip);
                      least = u < least ? u : least;
                    }
                  } else {
                    for (std::int64_t b = 0; b < block; ++b) {
                      const U u = static_cast<U>(Key::bits(xb[b * inner]) ^ flip);
                      least = u < least ? u : least;
                    }
                  }
                  if (SC_LIKELY(least >= Key::key(last))) continue;
                  for (std::int64_t b = 0; b < block; ++b) consider(j + b);
                }
              }
              for (; j < n; ++j) consider(j);
            } else {
              packs.resize(static_cast<std::size_t>(n));
              for (std::int64_t j = 0; j < n; ++j) packs[static_cast<std::size_t>(j)] = Key::pack(xl[j * inner], j, largest);
              const auto first = packs.begin(), kth = first + k;
              if (k < n) std::nth_element(first, kth, packs.end());
              std::sort(first, kth);
            }
            for (std::int64_t r = 0; r < k; ++r) yl[r * inner] = Key::index(packs[static_cast<std::size_t>(r)]);
          }
        });
      }
    });
  }
};

}  // namespace ops

/// topk's result: the k values of each line and their indices (i64) along the axis.
struct TopK {
  Tensor values;
  Tensor indices;
};

/// The k largest (or, largest = false, smallest) entries of each line of x along `axis`, in
/// order, and their indices (PyTorch's topk): both have x's shape with k along the axis. A NaN
/// counts above every number; equal entries keep their order. Numeric dtypes; k in [0, extent].
/// The values are differentiable in x.
inline TopK topk(const Tensor& x, std::int64_t k, std::int64_t axis = -1, bool largest = true,
                 std::source_location loc = std::source_location::current()) {
  ops::Attrs a;
  a.axis = axis;
  a.i0 = k;
  a.flag = largest;
  Tensor idx = detail::dispatch<ops::TopKIndices>({&x, 1}, a, loc);
  Tensor values = take_along_axis(x, idx, axis, loc);
  return {std::move(values), std::move(idx)};
}

/// The indices (i64) that sort each line of x along `axis`, ascending or descending; stable
/// (equal entries keep their order), a NaN above every number.
inline Tensor argsort(const Tensor& x, std::int64_t axis = -1, bool descending = false,
                      std::source_location loc = std::source_location::current()) {
  detail::require_defined(x, "argsort", loc);
  ops::Attrs a;
  a.axis = axis;
  a.i0 = x.rank() == 0 ? 0 : x.shape()[normalize_axis(axis, x.rank(), "argsort", loc)];
  a.flag = descending;
  return detail::dispatch<ops::TopKIndices>({&x, 1}, a, loc);
}

/// x with each line along `axis` sorted, ascending or descending (stable; NaNs last ascending,
/// first descending). Differentiable: the gradient goes back to each entry's place.
inline Tensor sort(const Tensor& x, std::int64_t axis = -1, bool descending = false,
                   std::source_location loc = std::source_location::current()) {
  detail::require_defined(x, "sort", loc);
  const Tensor order = argsort(x, axis, descending, loc);  // (x has rank >= 1 past it)
  return take_along_axis(x, order, axis, loc);
}

}  // namespace stagecraft
