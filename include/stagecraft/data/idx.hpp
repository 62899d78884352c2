// IDX files (the MNIST family's format), plain or gzip-compressed (zlib), and Fashion-MNIST.
#pragma once
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <source_location>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <zlib.h>

#include "../core/creation.hpp"
#include "../core/error.hpp"

namespace stagecraft::data {

/// The contents of one IDX file: its element type code, extents and raw big-endian payload.
struct IdxFile {
  std::uint8_t type = 0x08;  ///< 0x08 ubyte, 0x09 byte, 0x0B short, 0x0C int, 0x0D float, 0x0E double
  Shape shape;
  std::vector<std::uint8_t> payload;  ///< numel * element size bytes, as stored (big-endian)
};

namespace detail {

/// Reads a whole file through zlib (which reads plain files unchanged).
inline std::vector<std::uint8_t> read_maybe_gzip(const std::string& path, std::string_view op,
                                                 const std::source_location& loc) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    stagecraft::detail::fail<IOError>(op, loc, "'", path, "': cannot read: ", ec.message());
  if (!std::filesystem::exists(st)) stagecraft::detail::fail<IOError>(op, loc, "'", path, "': no such file");
  if (!std::filesystem::is_regular_file(st))
    stagecraft::detail::fail<IOError>(op, loc, "'", path, "' is not a regular file");
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) stagecraft::detail::fail<IOError>(op, loc, "'", path, "': cannot open: ", std::strerror(errno));
  std::vector<std::uint8_t> out;
  std::uint8_t buf[1 << 16];
  for (;;) {
    const int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      int err = 0;
      const std::string msg = gzerror(f, &err);
      gzclose(f);
      stagecraft::detail::fail<IOError>(op, loc, "'", path, "' is corrupt: bad compressed data: ", msg);
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  // A gzip stream cut short reads as a clean end of file; gzclose reports the bad CRC/length.
  if (gzclose(f) != Z_OK)
    stagecraft::detail::fail<IOError>(op, loc, "'", path, "' is corrupt: a truncated or damaged gzip stream");
  return out;
}

inline std::uint32_t be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}
inline std::size_t idx_item_size(std::uint8_t type) {
  switch (type) {
    case 0x08: case 0x09: return 1;
    case 0x0B: return 2;
    case 0x0C: case 0x0D: return 4;
    case 0x0E: return 8;
    default: return 0;
  }
}

/// True when a tensor of shape s with `item`-byte elements obeys the size rule of every tensor
/// (detail::shape_bytes).
inline bool idx_fits(const Shape& s, std::size_t item) {
  std::uint64_t bytes = 0;
  return stagecraft::detail::shape_bytes(s, static_cast<std::int64_t>(item), bytes);
}

}  // namespace detail

/// Reads an IDX file (".gz" or plain). A missing, truncated or corrupt file is an IOError.
inline IdxFile read_idx(const std::string& path, std::source_location loc = std::source_location::current()) {
  constexpr std::string_view op = "read_idx";
  const auto corrupt = [&](const auto&... parts) {
    stagecraft::detail::fail<IOError>(op, loc, "'", path, "' is corrupt: ", parts...);
  };
  const std::vector<std::uint8_t> bytes = detail::read_maybe_gzip(path, op, loc);
  if (bytes.size() < 4 || bytes[0] != 0 || bytes[1] != 0) corrupt("not an IDX file (bad magic number)");
  IdxFile f;
  f.type = bytes[2];
  const int rank = bytes[3];
  const std::size_t item = detail::idx_item_size(f.type);
  if (item == 0) corrupt("unknown element type ", int(f.type));
  if (rank > max_rank) corrupt("rank ", rank, " is over stagecraft's max_rank ", max_rank);
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(rank);
  if (bytes.size() < header) corrupt("the file ends inside the header (truncated?)");
  for (int d = 0; d < rank; ++d) f.shape.push_back(detail::be32(&bytes[4 + 4 * d]));
  // the extents come from the file: their product may wrap, so it is checked before any use (an
  // empty tensor's other extents count too: [0, 2^32-1, 2^32-1, 2^32-1] is no tensor's shape)
  if (!detail::idx_fits(f.shape, item)) corrupt("its header ", f.shape, " describes more than 2^62 bytes");
  const std::size_t want = static_cast<std::size_t>(f.shape.numel()) * item;
  if (bytes.size() - header != want)
    corrupt("it holds ", bytes.size() - header, " payload bytes, its header ", f.shape, " says ", want);
  f.payload.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return f;
}

/// An unsigned-byte IDX file as a tensor: f32 scaled by `scale` (images: 1/255), or i64
/// (labels) when as_labels is set.
inline Tensor read_idx_tensor(const std::string& path, bool as_labels, float scale = 1.f / 255.f,
                              std::source_location loc = std::source_location::current()) {
  const IdxFile f = read_idx(path, loc);
  if (f.type != 0x08)
    stagecraft::detail::fail<IOError>("read_idx", loc, "'", path, "' is not an unsigned-byte IDX file (type ",
                                      int(f.type), ")");
  if (!detail::idx_fits(f.shape, as_labels ? sizeof(std::int64_t) : sizeof(float)))
    stagecraft::detail::fail<IOError>("read_idx", loc, "'", path, "' is corrupt: its header ", f.shape,
                                      " describes more than 2^62 bytes as ", as_labels ? "i64" : "f32");
  if (as_labels) {
    std::vector<std::int64_t> v(f.payload.begin(), f.payload.end());
    return tensor(v, f.shape, loc);
  }
  std::vector<float> v(f.payload.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(f.payload[i]) * scale;
  return tensor(v, f.shape, loc);
}

/// Fashion-MNIST: images f32 [N, 28, 28] in [0, 1] and labels i64 [N].
struct Dataset {
  Tensor train_images, train_labels, test_images, test_labels;
};

/// Where Debian's dataset-fashion-mnist package puts the files.
inline const char* default_fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";

/// Loads Fashion-MNIST from `dir` (the four *-ubyte.gz files). Missing files raise IOError
/// with the package to install.
inline Dataset load_fashion_mnist(const std::string& dir = default_fashion_mnist_dir,
                                  std::source_location loc = std::source_location::current()) {
  constexpr std::string_view op = "load_fashion_mnist";
  const auto file = [&](const char* name) {
    const std::string p = dir + "/" + name;
    if (!std::filesystem::exists(p))
      stagecraft::detail::fail<IOError>(op, loc, "missing ", p, ": install the data with `apt-get install "
                                        "dataset-fashion-mnist` (or bash cmake/install-deps.sh)");
    return p;
  };
  Dataset d;
  d.train_images = read_idx_tensor(file("train-images-idx3-ubyte.gz"), false, 1.f / 255.f, loc);
  d.train_labels = read_idx_tensor(file("train-labels-idx1-ubyte.gz"), true, 1.f / 255.f, loc);
  d.test_images = read_idx_tensor(file("t10k-images-idx3-ubyte.gz"), false, 1.f / 255.f, loc);
  d.test_labels = read_idx_tensor(file("t10k-labels-idx1-ubyte.gz"), true, 1.f / 255.f, loc);
  const auto count = [](const Tensor& t) { return t.rank() == 0 ? std::int64_t{-1} : t.shape()[0]; };
  if (count(d.train_images) != count(d.train_labels) || count(d.test_images) != count(d.test_labels))
    stagecraft::detail::fail<IOError>(op, loc, "image and label counts differ in ", dir, " (train ",
                                      d.train_images.shape(), " and ", d.train_labels.shape(), ", test ",
                                      d.test_images.shape(), " and ", d.test_labels.shape(), ")");
  return d;
}

}  // namespace stagecraft::data
