// A row reduction whose elements arrive a run at a time (the fused evaluator's tiles), with the
// bits of reduce_row (reduce.hpp) over the whole row: the same pairwise split of a float sum, and
// in each piece the same SIMD accumulators, fed the same elements, combined in the same order.
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "reduce.hpp"

namespace stagecraft::backend::cpu {

/// reduce_row's split of n elements starting at off: leaf(off, len) -> Out for each piece, in
/// order, the pieces' results added as reduce_row adds them (a float sum halves rows longer than
/// pair_block; every other reduction is one piece).
template <class Rd, class Out, class Leaf>
Out reduce_pairwise(std::int64_t off, std::int64_t n, const Leaf& leaf) {
  if constexpr (Rd::is_sum && std::is_floating_point_v<Out>) {
    if (n > pair_block) {
      const std::int64_t h = n / 2 / 64 * 64;
      const Out left = reduce_pairwise<Rd, Out>(off, h, leaf);
      return left + reduce_pairwise<Rd, Out>(off + h, n - h, leaf);
    }
  }
  return leaf(off, n);
}

/// One piece of reduce_row (the part below its pairwise split) over n elements handed to add() in
/// runs of any length: four SIMD accumulators over whole blocks of 4 batches, one over the whole
/// batches after them, the scalar tail; a run that stops inside a block waits in a buffer. A run
/// that is the whole piece goes to reduce_row itself.
template <class Rd, class T>
class RowLeaf {
  static constexpr std::int64_t W = [] {
    if constexpr (Vectorizable<T>) return static_cast<std::int64_t>(batch<T>::size);
    else return std::int64_t{1};
  }();

 public:
  explicit RowLeaf(std::int64_t n) : n_(n) {
    if constexpr (Vectorizable<T>) {
      if (n >= 4 * W) {
        end4_ = n / (4 * W) * (4 * W);
        end1_ = end4_ + (n - end4_) / W * W;
        phase_ = Phase::four;
      }
    }
  }

  /// The next len elements of the piece, in order.
  void add(const T* x, std::int64_t len) {
    if (i_ == 0 && have_ == 0 && !started_ && len == n_) {  // the whole piece at once
      if (len > 0) acc_ = reduce_row<Rd, T, T>(x, len), started_ = true;
      i_ = len;
      return;
    }
    while (len > 0) {
      if (phase_ == Phase::scalar) {
        for (const T* e = x + len; x < e; ++x) acc_ = started_ ? Rd::combine(acc_, *x) : *x, started_ = true;
        i_ += len;
        return;
      }
      if (have_ == 0) {  // whole blocks straight from the run
        const std::int64_t k = blocks(x, len);
        x += k, len -= k;
        if (k > 0) continue;
      }
      const std::int64_t block = phase_ == Phase::four ? 4 * W : W;  // (part of a block: gathered first)
      const std::int64_t k = std::min(block - have_, len);
      std::copy_n(x, k, buf_ + have_);
      have_ += k, x += k, len -= k;
      if (have_ < block) return;
      have_ = 0;
      blocks(buf_, block);
    }
  }

  /// The reduction, once all n elements were added (a sum of none: 0).
  T result() const { return started_ ? acc_ : T(0); }

 private:
  enum class Phase { four, one, scalar };

  /// Takes the whole blocks of the current phase at the front of x[0, len) (none past its end);
  /// returns how many elements it took. Accumulates in registers, as reduce_row does.
  std::int64_t blocks(const T* x, std::int64_t len) {
    std::int64_t i = 0;
    if constexpr (Vectorizable<T>) {
      using B = batch<T>;
      if (phase_ == Phase::four) {
        const std::int64_t stop = std::min(len / (4 * W) * (4 * W), end4_ - i_);
        if (stop == 0) return 0;
        B a0, a1, a2, a3;
        if (i_ == 0) {
          a0 = B::load_unaligned(x), a1 = B::load_unaligned(x + W);
          a2 = B::load_unaligned(x + 2 * W), a3 = B::load_unaligned(x + 3 * W);
          i = 4 * W;
        } else {
          a0 = a_[0], a1 = a_[1], a2 = a_[2], a3 = a_[3];
        }
        for (; i < stop; i += 4 * W) {
          a0 = Rd::simd(a0, B::load_unaligned(x + i));
          a1 = Rd::simd(a1, B::load_unaligned(x + i + W));
          a2 = Rd::simd(a2, B::load_unaligned(x + i + 2 * W));
          a3 = Rd::simd(a3, B::load_unaligned(x + i + 3 * W));
        }
        i_ += stop;
        if (i_ < end4_) {
          a_[0] = a0, a_[1] = a1, a_[2] = a2, a_[3] = a3;
          return stop;
        }
        a_[0] = Rd::simd(Rd::simd(a0, a1), Rd::simd(a2, a3));
        phase_ = Phase::one;
      } else {
        const std::int64_t stop = std::min(len / W * W, end1_ - i_);
        B a0 = a_[0];
        for (; i < stop; i += W) a0 = Rd::simd(a0, B::load_unaligned(x + i));
        a_[0] = a0;
        i_ += stop;
      }
      if (i_ < end1_) return i;
      alignas(64) T lanes[W];
      a_[0].store_aligned(lanes);
      acc_ = lanes[0];
      for (std::int64_t l = 1; l < W; ++l) acc_ = Rd::combine(acc_, lanes[l]);
      started_ = true;
      phase_ = Phase::scalar;
    }
    (void)x, (void)len;
    return i;
  }

  struct NoBatch {};
  using Acc = std::conditional_t<Vectorizable<T>, batch<T>, NoBatch>;

  std::int64_t n_, i_ = 0, end4_ = 0, end1_ = 0, have_ = 0;
  Phase phase_ = Phase::scalar;
  bool started_ = false;
  T acc_{};
  Acc a_[4]{};
  alignas(64) T buf_[4 * W];
};

/// reduce_row<Rd, T, T> of a row of n elements that fill(b, e, leaf) hands over piece by piece:
/// fill calls leaf.add(ptr, len) with elements [b, e) of the row, in order (any runs).
template <class Rd, class T, class Fill>
T reduce_streamed(std::int64_t n, const Fill& fill) {
  return reduce_pairwise<Rd, T>(0, n, [&](std::int64_t off, std::int64_t len) {
    RowLeaf<Rd, T> leaf(len);
    fill(off, off + len, leaf);
    return leaf.result();
  });
}

}  // namespace stagecraft::backend::cpu
