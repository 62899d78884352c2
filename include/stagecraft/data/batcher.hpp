// A seeded shuffling batcher: epochs of (inputs, labels) minibatches in a reproducible order.
#pragma once
#include <cstdint>
#include <optional>
#include <source_location>
#include <utility>
#include <vector>

#include "../core/random.hpp"
#include "../ops/gather.hpp"
#include "../ops/slice.hpp"

namespace stagecraft::data {

/// One minibatch.
struct Batch {
  Tensor x, y;
};

/// Iterates minibatches of (x, y) along axis 0. Each epoch draws a fresh permutation from
/// (seed, epoch), so a run resumed at epoch k sees exactly the batches it would have seen.
class Batcher {
 public:
  /// x and y must have the same extent along axis 0.
  Batcher(Tensor x, Tensor y, std::int64_t batch_size, std::uint64_t seed = 0, bool shuffle = true,
          bool drop_last = false, std::source_location loc = std::source_location::current())
      : x_(std::move(x)), y_(std::move(y)), batch_(batch_size), seed_(seed), shuffle_(shuffle), drop_last_(drop_last),
        loc_(loc) {
    stagecraft::detail::require_defined(x_, "Batcher", loc);
    stagecraft::detail::require_defined(y_, "Batcher", loc);
    if (x_.rank() == 0 || y_.rank() == 0 || x_.shape()[0] != y_.shape()[0])
      stagecraft::detail::fail<ShapeError>("Batcher", loc, "inputs ", x_.shape(), " and labels ", y_.shape(),
                                           " need the same extent along axis 0");
    if (batch_ <= 0) stagecraft::detail::fail<ValueError>("Batcher", loc, "batch size must be positive, got ", batch_);
    start_epoch(0);
  }

  /// Number of examples.
  std::int64_t size() const { return x_.shape()[0]; }
  /// Batches per epoch.
  std::int64_t batches_per_epoch() const {
    const std::int64_t full = size() / batch_;  // (size + batch - 1) / batch would overflow
    return drop_last_ || size() % batch_ == 0 ? full : full + 1;
  }
  /// Restarts at the beginning of `epoch` (its order depends only on seed and epoch). Rows
  /// without elements (x and y of shape [n, 0, ...]) are all alike: they are sliced in order, and
  /// no permutation of n is made (a file may claim billions of them).
  void start_epoch(std::int64_t epoch) {
    epoch_ = epoch;
    pos_ = 0;
    if (rows_are_empty()) order_ = Tensor();
    else if (shuffle_)
      order_ = random::permutation(size(), seed_ * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(epoch), loc_);
    else order_ = stagecraft::detail::arange_i64(0, size(), 1, loc_);
  }
  std::int64_t epoch() const { return epoch_; }
  /// The next batch of this epoch, or nullopt at its end.
  std::optional<Batch> next() {
    const std::int64_t n = size();
    if (pos_ >= n || (drop_last_ && pos_ + batch_ > n)) return std::nullopt;
    const std::int64_t len = std::min(batch_, n - pos_);
    const std::int64_t at = pos_;
    pos_ += len;
    if (!order_.defined()) return Batch{rows(x_, at, len), rows(y_, at, len)};
    const Tensor idx = slice(order_, {at}, {len});
    return Batch{gather(x_, idx, 0), gather(y_, idx, 0)};
  }

 private:
  bool rows_are_empty() const { return size() > 0 && x_.numel() == 0 && y_.numel() == 0; }
  /// Rows [at, at + len) of t.
  Tensor rows(const Tensor& t, std::int64_t at, std::int64_t len) const {
    std::vector<std::int64_t> begin(static_cast<std::size_t>(t.rank()), 0), extent(t.shape().begin(), t.shape().end());
    begin[0] = at;
    extent[0] = len;
    return slice(t, std::move(begin), std::move(extent), loc_);
  }

  Tensor x_, y_, order_;  // order_ undefined when the rows are empty
  std::int64_t batch_;
  std::uint64_t seed_;
  bool shuffle_, drop_last_;
  std::source_location loc_;  // the constructor's caller, named by the errors of later calls
  std::int64_t epoch_ = 0, pos_ = 0;
};

}  // namespace stagecraft::data
