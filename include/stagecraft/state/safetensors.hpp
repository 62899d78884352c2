// safetensors: reader and writer of the safetensors file format (strict checks, atomic writes).
#pragma once
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <source_location>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/error.hpp"
#include "../core/tensor.hpp"

// The format stores little-endian data and we copy tensor bytes as they are in memory.
static_assert(std::endian::native == std::endian::little,
              "stagecraft's safetensors reader/writer assumes a little-endian host");

namespace stagecraft {

/// What a safetensors file holds: its tensors by name (sorted) and its string metadata.
struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

/// Largest header a reader accepts (the limit of the reference implementation).
inline constexpr std::uint64_t safetensors_max_header_bytes = 100'000'000;

namespace detail::safetensors {

/// Called after each chunk a writer writes, with the bytes written so far. Empty by default;
/// tests set it to simulate a failure (throw) or a crash (_exit) in the middle of a save.
inline thread_local std::function<void(std::uint64_t)> write_hook;

/// The format's dtype code ("F32", "BOOL", ...).
constexpr std::string_view dtype_code(DType d) {
  constexpr std::string_view codes[] = {"BOOL", "I32", "I64", "F32", "F64"};
  return codes[static_cast<int>(d)];
}

/// One tensor as the header describes it.
struct Entry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  std::uint64_t begin = 0, end = 0;
};

/// A parsed and validated header.
struct Header {
  std::vector<Entry> entries;  // sorted by data offset
  std::map<std::string, std::string> metadata;
};

/// Bytes of numel(shape) * itemsize, or false when the shape is not one a tensor may have
/// (detail::shape_bytes: the extents of an empty tensor count too, so [0, 5, 2^62] is refused: its
/// strides would overflow).
inline bool checked_nbytes(const Shape& s, DType d, std::uint64_t& out) {
  return stagecraft::detail::shape_bytes(s, static_cast<std::int64_t>(itemsize(d)), out);
}

/// True when s is valid UTF-8 (JSON text must be).
STAGECRAFT_COMPILED_INLINE bool valid_utf8(std::string_view s);

/// Parses a header and checks that its tensors tile a data section of data_size bytes
/// exactly: each in range, sized by dtype * shape, no overlap, no gap, nothing left over.
/// Errors are IOError "[op] 'file' is corrupt: what".
STAGECRAFT_COMPILED_INLINE Header parse_header(std::string_view json, std::uint64_t data_size, std::string_view op,
                                               const std::string& file, const std::source_location& loc);

/// The header's JSON text for entries (written in their order, after the metadata), compact.
STAGECRAFT_COMPILED_INLINE std::string header_json(const std::vector<Entry>& entries,
                                                   const std::map<std::string, std::string>& metadata);

/// A file written under a temporary name beside its target and renamed over the target
/// only by commit(); destroyed before commit(), it removes the temporary file. A symlink is
/// written through (the file it names is replaced, the link stays), and a file that exists
/// keeps its permission bits (a 0600 checkpoint stays 0600).
class AtomicFile {
 public:
  AtomicFile(std::filesystem::path target, std::string_view op, const std::source_location& loc)
      : target_(through_links(std::move(target))), op_(op), loc_(loc) {
    static std::atomic<unsigned> counter{0};  // distinct names for threads of one process
    // A name already taken is skipped: the leftover of a run that crashed mid-save with this pid (a
    // container's job restarts with the same pid, and its first save would fail at every restart),
    // or a process with this pid in another PID namespace writing beside the same target.
    for (int tries = 0;; ++tries) {
      tmp_ = target_;
      tmp_ += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
      fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ >= 0 || errno != EEXIST || tries == max_name_tries) break;
    }
    if (fd_ < 0) fail_errno("cannot create the temporary file");
    struct ::stat st {};
    if (::stat(target_.c_str(), &st) == 0 && ::fchmod(fd_, st.st_mode & 07777) != 0)
      fail_errno("cannot give the temporary file the target's mode");
  }
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, std::size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t k = ::write(fd_, p, std::min<std::size_t>(n, std::size_t{1} << 30));
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) fail_errno("writing failed");
      p += k;
      n -= static_cast<std::size_t>(k);
      written_ += static_cast<std::uint64_t>(k);
    }
    if (write_hook) {
      try {
        write_hook(written_);
      } catch (const std::exception& e) {
        fail("writing failed: ", e.what());
      }
    }
  }
  /// Flushes the data to disk, then renames the file over the target.
  void commit() {
    if (::fsync(fd_) != 0) fail_errno("fsync failed");
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) fail_errno("closing failed");
    std::error_code ec;
    std::filesystem::rename(tmp_, target_, ec);
    if (ec) fail("cannot rename the temporary file over it: ", ec.message());
    committed_ = true;
    // Make the rename itself durable; best effort (some filesystems refuse to fsync a directory).
    const std::filesystem::path dir = target_.has_parent_path() ? target_.parent_path() : ".";
    if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
      (void)::fsync(dfd);
      ::close(dfd);
    }
  }

 private:
  /// The file a chain of symlinks ends at (p itself when it is not a link).
  static std::filesystem::path through_links(std::filesystem::path p) {
    std::error_code ec;
    for (int hops = 0; hops < 40 && std::filesystem::is_symlink(p, ec); ++hops) {
      const std::filesystem::path t = std::filesystem::read_symlink(p, ec);
      if (ec) break;
      p = t.is_absolute() ? t : p.parent_path() / t;
    }
    return p;
  }
  template <class... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    detail::fail<IOError>(op_, loc_, "cannot write '", target_.string(), "': ", parts...);
  }
  [[noreturn]] void fail_errno(std::string_view what) const {
    const int err = errno;
    fail(what, " (", tmp_.string(), "): ", std::strerror(err));
  }

  static constexpr int max_name_tries = 1000;  // temporary names tried before giving up

  std::filesystem::path target_, tmp_;
  std::string_view op_;
  std::source_location loc_;
  int fd_ = -1;
  std::uint64_t written_ = 0;
  bool committed_ = false;
};

/// save_safetensors with the op name errors carry (Checkpoint::save reuses it).
inline void save(const std::filesystem::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                 const std::map<std::string, std::string>& metadata, std::string_view op,
                 const std::source_location& loc) {
  std::vector<Tensor> host;
  host.reserve(tensors.size());
  std::set<std::string_view> names;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") detail::fail<ValueError>(op, loc, "\"__metadata__\" is reserved and cannot name a tensor");
    if (!valid_utf8(name)) detail::fail<ValueError>(op, loc, "tensor name \"", name, "\" is not valid UTF-8");
    if (!names.insert(name).second) detail::fail<ValueError>(op, loc, "two tensors are named \"", name, "\"");
    detail::require_defined(t, op, loc);
    if (t.is_symbolic())
      detail::fail<StagingError>(op, loc, "tensor \"", name, "\" is symbolic (being traced); save concrete values");
    host.push_back(detail::device_copy(t, Device::cpu(), op, loc));
  }
  for (const auto& [k, v] : metadata)
    if (!valid_utf8(k) || !valid_utf8(v)) detail::fail<ValueError>(op, loc, "metadata entry \"", k, "\" is not valid UTF-8");

  // Widest dtypes first, so every tensor starts at a multiple of its itemsize (readers may
  // map the file and use the data in place); then by name, so the layout is deterministic.
  std::vector<std::size_t> order(tensors.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const std::size_t sa = itemsize(host[a].dtype()), sb = itemsize(host[b].dtype());
    return sa != sb ? sa > sb : tensors[a].first < tensors[b].first;
  });
  // The header in the order of the data section, metadata first.
  std::vector<Entry> entries;
  entries.reserve(order.size());
  std::uint64_t offset = 0;
  for (std::size_t i : order) {
    const Tensor& t = host[i];
    entries.push_back({tensors[i].first, t.dtype(), t.shape(), offset, offset + t.nbytes()});
    offset += t.nbytes();
  }
  std::string json = header_json(entries, metadata);
  json.append((8 - json.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned

  unsigned char len[8];
  for (int k = 0; k < 8; ++k) len[k] = static_cast<unsigned char>(static_cast<std::uint64_t>(json.size()) >> (8 * k));
  AtomicFile f(path, op, loc);
  f.write(len, 8);
  f.write(json.data(), json.size());
  for (std::size_t i : order)
    if (host[i].nbytes() > 0) f.write(host[i].raw_data(), host[i].nbytes());
  f.commit();
}

/// The size of an opened regular file. Taken from the open file, not its path: a save that renames
/// a new file over the path between a stat and the open (atomic writers do, while a reader may be
/// restoring) paired one file's size with the other's bytes, a spurious "corrupt" IOError.
inline std::uint64_t open_file_size(std::FILE* f, std::string_view op, const std::string& file,
                                    const std::source_location& loc) {
  struct ::stat st {};
  if (::fstat(::fileno(f), &st) != 0) {
    const int err = errno;
    detail::fail<IOError>(op, loc, "'", file, "': cannot read its size: ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) detail::fail<IOError>(op, loc, "'", file, "' is not a regular file");
  return static_cast<std::uint64_t>(st.st_size);
}

/// load_safetensors with the op name errors carry (Checkpoint::restore reuses it).
inline SafetensorsFile load(const std::filesystem::path& path, std::string_view op, const std::source_location& loc) {
  const std::string file = path.string();
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    detail::fail<IOError>(op, loc, "'", file, "': cannot read: ", ec.message());
  if (!std::filesystem::exists(st)) detail::fail<IOError>(op, loc, "'", file, "': no such file");
  if (!std::filesystem::is_regular_file(st)) detail::fail<IOError>(op, loc, "'", file, "' is not a regular file");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(file.c_str(), "rb"), &std::fclose);
  if (!f) {
    const int err = errno;
    detail::fail<IOError>(op, loc, "'", file, "': cannot open: ", std::strerror(err));
  }
  const std::uint64_t size = open_file_size(f.get(), op, file, loc);
  const auto corrupt = [&](const auto&... parts) { detail::fail<IOError>(op, loc, "'", file, "' is corrupt: ", parts...); };
  const auto read = [&](void* dst, std::size_t n, std::string_view what) {
    if (n > 0 && std::fread(dst, 1, n, f.get()) != n) corrupt("the file ends inside ", what, " (truncated?)");
  };
  if (size < 8) corrupt("it has ", size, " bytes, fewer than the 8-byte header length (truncated?)");
  unsigned char len[8];
  read(len, 8, "the header length");
  std::uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | len[k];
  if (n > safetensors_max_header_bytes)
    corrupt("the header length ", n, " is over the ", safetensors_max_header_bytes, "-byte limit");
  if (n > size - 8) corrupt("the header length ", n, " runs past the end of the ", size, "-byte file (truncated?)");
  std::string json(static_cast<std::size_t>(n), '\0');
  read(json.data(), json.size(), "the header");
  Header h = parse_header(json, size - 8 - n, op, file, loc);

  SafetensorsFile out;
  out.metadata = std::move(h.metadata);
  for (const Entry& e : h.entries) {  // sorted by offset and contiguous: read in one pass
    Tensor t = detail::empty_tensor(e.shape, e.dtype, Device::cpu(), op, loc);
    read(t.raw_data(), t.nbytes(), "the data of tensor \"" + e.name + "\"");
    if (e.dtype == DType::b8) {  // a bool must be 0 or 1; any other byte is undefined behaviour to read
      const auto* b = static_cast<const unsigned char*>(t.raw_data());
      for (std::size_t i = 0; i < t.nbytes(); ++i)
        if (b[i] > 1) corrupt("BOOL tensor \"", e.name, "\" holds the byte ", int(b[i]), " at element ", i);
    }
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

}  // namespace detail::safetensors

/// Writes tensors (and string metadata) to a safetensors file that other tools (Python's
/// safetensors, Rust's, ...) can read. The write is atomic: a temporary file beside `path`,
/// flushed to disk, then renamed over it; on failure the previous file is untouched and
/// IOError is thrown. Names must be unique and not "__metadata__" (ValueError).
inline void save_safetensors(const std::filesystem::path& path,
                             const std::vector<std::pair<std::string, Tensor>>& tensors,
                             const std::map<std::string, std::string>& metadata = {},
                             std::source_location loc = std::source_location::current()) {
  detail::safetensors::save(path, tensors, metadata, "save_safetensors", loc);
}

/// Reads a safetensors file (dtypes F32 F64 I32 I64 BOOL) into CPU tensors. A missing,
/// truncated or malformed file is an IOError naming the file and what is wrong.
inline SafetensorsFile load_safetensors(const std::filesystem::path& path,
                                        std::source_location loc = std::source_location::current()) {
  return detail::safetensors::load(path, "load_safetensors", loc);
}

}  // namespace stagecraft

#if STAGECRAFT_DEFINE_COMPILED  // else compiled once, in stagecraft::precompiled's archive
#include "safetensors_json.hpp"
#endif
