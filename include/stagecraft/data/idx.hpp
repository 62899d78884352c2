// IDX files (the MNIST family's format), plain or gzip-compressed (zlib), and Fashion-MNIST.
#pragma once
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
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
inline std::vector<std::uint8_t> read_maybe_gzip(const std::string& path) {
  if (!std::filesystem::exists(path)) throw IOError("[read_idx] no such file: " + path);
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw IOError("[read_idx] cannot open " + path);
  std::vector<std::uint8_t> out;
  std::uint8_t buf[1 << 16];
  for (;;) {
    const int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      int err = 0;
      const std::string msg = gzerror(f, &err);
      gzclose(f);
      throw IOError("[read_idx] corrupt compressed data in " + path + ": " + msg);
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  // A gzip stream cut short reads as a clean end of file; gzclose reports the bad CRC/length.
  if (gzclose(f) != Z_OK) throw IOError("[read_idx] truncated or corrupt gzip file " + path);
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
inline IdxFile read_idx(const std::string& path) {
  const std::vector<std::uint8_t> bytes = detail::read_maybe_gzip(path);
  if (bytes.size() < 4 || bytes[0] != 0 || bytes[1] != 0)
    throw IOError("[read_idx] " + path + " is not an IDX file (bad magic number)");
  IdxFile f;
  f.type = bytes[2];
  const int rank = bytes[3];
  const std::size_t item = detail::idx_item_size(f.type);
  if (item == 0) throw IOError("[read_idx] " + path + " has unknown element type " + std::to_string(f.type));
  if (rank > max_rank) throw IOError("[read_idx] " + path + " has rank " + std::to_string(rank));
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(rank);
  if (bytes.size() < header) throw IOError("[read_idx] " + path + " is truncated (header)");
  for (int d = 0; d < rank; ++d) f.shape.push_back(detail::be32(&bytes[4 + 4 * d]));
  // the extents come from the file: their product may wrap, so it is checked before any use (an
  // empty tensor's other extents count too: [0, 2^32-1, 2^32-1, 2^32-1] is no tensor's shape)
  if (!detail::idx_fits(f.shape, item))
    throw IOError("[read_idx] " + path + " is corrupt: its header " + f.shape.str() + " describes more than 2^62 bytes");
  const std::size_t want = static_cast<std::size_t>(f.shape.numel()) * item;
  if (bytes.size() - header != want)
    throw IOError("[read_idx] " + path + " holds " + std::to_string(bytes.size() - header) +
                  " payload bytes, its header " + f.shape.str() + " says " + std::to_string(want));
  f.payload.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return f;
}

/// An unsigned-byte IDX file as a tensor: f32 scaled by `scale` (images: 1/255), or i64
/// (labels) when as_labels is set.
inline Tensor read_idx_tensor(const std::string& path, bool as_labels, float scale = 1.f / 255.f) {
  const IdxFile f = read_idx(path);
  if (f.type != 0x08) throw IOError("[read_idx] " + path + " is not an unsigned-byte IDX file");
  if (!detail::idx_fits(f.shape, as_labels ? sizeof(std::int64_t) : sizeof(float)))
    throw IOError("[read_idx] " + path + " is corrupt: its header " + f.shape.str() + " describes more than 2^62 bytes as " +
                  (as_labels ? "i64" : "f32"));
  if (as_labels) {
    std::vector<std::int64_t> v(f.payload.begin(), f.payload.end());
    return tensor(v, f.shape);
  }
  std::vector<float> v(f.payload.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(f.payload[i]) * scale;
  return tensor(v, f.shape);
}

/// Fashion-MNIST: images f32 [N, 28, 28] in [0, 1] and labels i64 [N].
struct Dataset {
  Tensor train_images, train_labels, test_images, test_labels;
};

/// Where Debian's dataset-fashion-mnist package puts the files.
inline const char* default_fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";

/// Loads Fashion-MNIST from `dir` (the four *-ubyte.gz files). Missing files raise IOError
/// with the package to install.
inline Dataset load_fashion_mnist(const std::string& dir = default_fashion_mnist_dir) {
  const auto file = [&](const char* name) {
    const std::string p = dir + "/" + name;
    if (!std::filesystem::exists(p))
      throw IOError("[load_fashion_mnist] missing " + p +
                    ": install the data with `apt-get install dataset-fashion-mnist` (or bash cmake/install-deps.sh)");
    return p;
  };
  Dataset d;
  d.train_images = read_idx_tensor(file("train-images-idx3-ubyte.gz"), false);
  d.train_labels = read_idx_tensor(file("train-labels-idx1-ubyte.gz"), true);
  d.test_images = read_idx_tensor(file("t10k-images-idx3-ubyte.gz"), false);
  d.test_labels = read_idx_tensor(file("t10k-labels-idx1-ubyte.gz"), true);
  if (d.train_images.shape()[0] != d.train_labels.shape()[0] || d.test_images.shape()[0] != d.test_labels.shape()[0])
    throw IOError("[load_fashion_mnist] image and label counts differ in " + dir);
  return d;
}

}  // namespace stagecraft::data
