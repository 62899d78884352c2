// Fuzz target: the IDX reader (data/idx.hpp), plain or gzip, then the tensors it makes and a
// Batcher over them.
#include <algorithm>
#include <cstdint>

#include <stagecraft/data/batcher.hpp>
#include <stagecraft/data/idx.hpp>
#include <stagecraft/stagecraft.hpp>

#include "harness.hpp"

namespace sc = stagecraft;

namespace {

/// Touches every element and runs an epoch of batches, so a size the header lies about shows.
void use(const sc::Tensor& images, const sc::Tensor& labels) {
  scfuzz::check(images.shape() == labels.shape(), "images and labels differ in shape");
  const double total = sc::sum(labels.astype(sc::f64)).item<double>();
  scfuzz::check(total >= 0 && total <= 255.0 * static_cast<double>(labels.numel()), "label sum out of range");
  (void)sc::sum(images).item<float>();
  // A Batcher over an empty-extent header such as [2^32-1, 0] would draw a permutation of
  // 4 billion examples: a valid request, but not one a fuzzer should make on every run.
  if (images.rank() == 0 || images.shape()[0] > 4096) return;
  const std::int64_t n = images.shape()[0];
  sc::data::Batcher b(images, labels, 1 + n / 3, /*seed=*/7);
  std::int64_t seen = 0, batches = 0;
  while (auto batch = b.next()) {
    seen += batch->x.shape()[0];
    ++batches;
    (void)sc::sum(batch->x).item<float>();
  }
  scfuzz::check(seen == n && batches == b.batches_per_epoch(), "an epoch did not cover the data once");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = scfuzz::scratch_file(data, size, ".idx");
  scfuzz::expect_only_ioerror("read_idx", [&] {
    const sc::data::IdxFile f = sc::data::read_idx(path);
    std::size_t item = f.type == 0x08 || f.type == 0x09 ? 1 : f.type == 0x0B ? 2 : f.type == 0x0E ? 8 : 4;
    scfuzz::check(f.payload.size() == static_cast<std::size_t>(f.shape.numel()) * item, "payload size != shape");
    if (f.type != 0x08) return;
    use(sc::data::read_idx_tensor(path, false), sc::data::read_idx_tensor(path, true));
  });
  return 0;
}
