// safetensors: reader and writer of the safetensors file format (strict checks, atomic writes).
#pragma once
#include <algorithm>
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
/// (detail::checked_numel's rule: the extents of an empty tensor count too, so [0, 5, 2^62] is
/// refused: its strides would overflow).
inline bool checked_nbytes(const Shape& s, DType d, std::uint64_t& out) {
  std::int64_t n = 1, extent_bytes = static_cast<std::int64_t>(itemsize(d));
  for (std::int64_t e : s) {
    if (e < 0) return false;
    if (e != 0 && (__builtin_mul_overflow(extent_bytes, e, &extent_bytes) || extent_bytes > max_tensor_bytes))
      return false;
    n *= e;
  }
  const std::int64_t bytes = n * static_cast<std::int64_t>(itemsize(d));
  out = static_cast<std::uint64_t>(bytes);
  return true;
}

/// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is invalid (overlong
/// forms, surrogates and code points above U+10FFFF are invalid, as in RFC 3629).
inline std::size_t utf8_length(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned c = b(i);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) { n = 3; lo = c == 0xE0 ? 0xA0 : 0x80; hi = c == 0xED ? 0x9F : 0xBF; }
  else if (c >= 0xF0 && c <= 0xF4) { n = 4; lo = c == 0xF0 ? 0x90 : 0x80; hi = c == 0xF4 ? 0x8F : 0xBF; }
  else return 0;
  if (s.size() - i < n) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  return n;
}
/// True when s is valid UTF-8 (JSON text must be).
inline bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

/// A strict parser for the header's small, fixed JSON schema. Hand-written because the
/// schema is tiny and a general JSON library (~25k lines) would sit in the umbrella header.
/// It never recurses on input, never reads past the header, and names the byte it rejects.
class HeaderParser {
 public:
  HeaderParser(std::string_view json, std::string_view op, std::string file, const std::source_location& loc)
      : s_(json), op_(op), file_(std::move(file)), loc_(loc) {}

  Header parse() {
    Header h;
    std::set<std::string, std::less<>> names;
    bool seen_metadata = false;
    ws();
    expect('{', "the header to start with '{'");
    ws();
    if (!eat('}')) {
      for (;;) {
        ws();
        const std::size_t key_at = i_;
        std::string key = string("a tensor name");
        ws();
        expect(':', "':' after a key");
        ws();
        if (key == "__metadata__") {
          if (seen_metadata) fail_at(key_at, "\"__metadata__\" appears twice");
          seen_metadata = true;
          h.metadata = metadata();
        } else {
          if (names.count(key)) fail_at(key_at, "tensor \"", key, "\" appears twice");
          names.insert(key);
          h.entries.push_back(entry(std::move(key)));
        }
        ws();
        if (eat(',')) continue;
        expect('}', "',' or '}' after a header entry");
        break;
      }
    }
    ws();  // writers pad the header with spaces
    if (i_ != s_.size()) fail_at(i_, "unexpected bytes after the closing '}'");
    return h;
  }

  /// Throws IOError "[op] 'file' is corrupt: what".
  template <class... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    detail::fail<IOError>(op_, loc_, "'", file_, "' is corrupt: ", parts...);
  }

 private:
  template <class... Parts>
  [[noreturn]] void fail_at(std::size_t at, const Parts&... parts) const {
    fail("header byte ", at, ": ", parts...);
  }
  bool at_end() const { return i_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[i_]; }
  void ws() {
    while (!at_end() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    if (at_end() || s_[i_] != c) return false;
    ++i_;
    return true;
  }
  void expect(char c, std::string_view what) {
    if (!eat(c)) fail_at(i_, "expected ", what, at_end() ? ", found the end of the header" : "");
  }

  std::string string(std::string_view what) {
    if (!eat('"')) fail_at(i_, "expected ", what, " (a string)");
    std::string out;
    for (;;) {
      if (at_end()) fail_at(i_, "unterminated string");
      const char c = s_[i_];
      if (c == '"') { ++i_; return out; }
      if (static_cast<unsigned char>(c) < 0x20) fail_at(i_, "control character in a string");
      if (c == '\\') { escape(out); continue; }
      const std::size_t n = utf8_length(s_, i_);
      if (n == 0) fail_at(i_, "invalid UTF-8");
      out.append(s_.substr(i_, n));
      i_ += n;
    }
  }
  unsigned hex4() {
    if (s_.size() - i_ < 4) fail_at(i_, "truncated \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
      else fail_at(i_ - 1, "bad hex digit in a \\u escape");
    }
    return v;
  }
  void escape(std::string& out) {
    const std::size_t at = i_++;
    if (at_end()) fail_at(at, "unterminated escape");
    const char c = s_[i_++];
    switch (c) {
      case '"': out += '"'; return;
      case '\\': out += '\\'; return;
      case '/': out += '/'; return;
      case 'b': out += '\b'; return;
      case 'f': out += '\f'; return;
      case 'n': out += '\n'; return;
      case 'r': out += '\r'; return;
      case 't': out += '\t'; return;
      case 'u': break;
      default: fail_at(at, "unknown escape '\\", c, "'");
    }
    unsigned cp = hex4();
    if (cp >= 0xDC00 && cp <= 0xDFFF) fail_at(at, "lone low surrogate in a \\u escape");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (s_.substr(i_, 2) != "\\u") fail_at(at, "high surrogate without its low half");
      i_ += 2;
      const unsigned low = hex4();
      if (low < 0xDC00 || low > 0xDFFF) fail_at(at, "high surrogate without its low half");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    const auto put = [&](unsigned v) { out += static_cast<char>(v); };
    if (cp < 0x80) put(cp);
    else if (cp < 0x800) { put(0xC0 | (cp >> 6)); put(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) { put(0xE0 | (cp >> 12)); put(0x80 | ((cp >> 6) & 0x3F)); put(0x80 | (cp & 0x3F)); }
    else { put(0xF0 | (cp >> 18)); put(0x80 | ((cp >> 12) & 0x3F)); put(0x80 | ((cp >> 6) & 0x3F)); put(0x80 | (cp & 0x3F)); }
  }

  /// A non-negative JSON integer that fits in int64 (shapes and offsets are nothing else).
  std::uint64_t integer(std::string_view what) {
    const std::size_t at = i_;
    if (peek() == '-') fail_at(at, what, " is negative");
    if (peek() < '0' || peek() > '9') fail_at(at, "expected ", what, " (an integer)");
    if (peek() == '0' && i_ + 1 < s_.size() && s_[i_ + 1] >= '0' && s_[i_ + 1] <= '9')
      fail_at(at, "leading zero in a number");
    std::uint64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      const auto d = static_cast<std::uint64_t>(s_[i_++] - '0');
      if (v > (static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) - d) / 10)
        fail_at(at, what, " is too large");
      v = v * 10 + d;
    }
    if (peek() == '.' || peek() == 'e' || peek() == 'E') fail_at(at, what, " is not an integer");
    return v;
  }
  /// "[int, ...]" with at most max_items items.
  std::vector<std::uint64_t> int_array(std::string_view what, std::size_t max_items) {
    std::vector<std::uint64_t> v;
    expect('[', std::string(what) + " (an array)");
    ws();
    if (eat(']')) return v;
    for (;;) {
      ws();
      if (v.size() == max_items) fail_at(i_, what, " has more than ", max_items, " items");
      v.push_back(integer(what));
      ws();
      if (eat(',')) continue;
      expect(']', "',' or ']' in " + std::string(what));
      return v;
    }
  }

  std::map<std::string, std::string> metadata() {
    std::map<std::string, std::string> m;
    expect('{', "\"__metadata__\" to be an object");
    ws();
    if (eat('}')) return m;
    for (;;) {
      ws();
      const std::size_t at = i_;
      std::string key = string("a metadata key");
      ws();
      expect(':', "':' after a metadata key");
      ws();
      std::string value = string("a metadata value");
      if (!m.emplace(std::move(key), std::move(value)).second) fail_at(at, "metadata key appears twice");
      ws();
      if (eat(',')) continue;
      expect('}', "',' or '}' in \"__metadata__\"");
      return m;
    }
  }

  Entry entry(std::string name) {
    Entry e;
    e.name = std::move(name);
    const std::size_t start = i_;
    bool has_dtype = false, has_shape = false, has_offsets = false;
    expect('{', "tensor \"" + e.name + "\" to be an object");
    ws();
    if (!eat('}')) {
      for (;;) {
        ws();
        const std::size_t at = i_;
        const std::string field = string("a field name");
        ws();
        expect(':', "':' after a field name");
        ws();
        bool* seen = nullptr;
        if (field == "dtype") {
          seen = &has_dtype;
          const std::size_t dat = i_;
          e.dtype = dtype(string("a dtype string"), dat);
        } else if (field == "shape") {
          seen = &has_shape;
          for (std::uint64_t d : int_array("a shape", max_rank)) e.shape.push_back(static_cast<std::int64_t>(d));
        } else if (field == "data_offsets") {
          seen = &has_offsets;
          const std::size_t oat = i_;
          auto o = int_array("data_offsets", 2);
          if (o.size() != 2) fail_at(oat, "data_offsets of tensor \"", e.name, "\" must hold 2 numbers");
          e.begin = o[0];
          e.end = o[1];
        } else {
          fail_at(at, "unknown field \"", field, "\" in tensor \"", e.name, "\"");
        }
        if (*seen) fail_at(at, "field \"", field, "\" appears twice in tensor \"", e.name, "\"");
        *seen = true;
        ws();
        if (eat(',')) continue;
        expect('}', "',' or '}' in tensor \"" + e.name + "\"");
        break;
      }
    }
    if (!has_dtype || !has_shape || !has_offsets)
      fail_at(start, "tensor \"", e.name, "\" lacks the field \"",
              !has_dtype ? "dtype" : !has_shape ? "shape" : "data_offsets", "\"");
    return e;
  }

  DType dtype(const std::string& code, std::size_t at) const {
    for (int d = 0; d < num_dtypes; ++d)
      if (code == dtype_code(static_cast<DType>(d))) return static_cast<DType>(d);
    static constexpr std::string_view other[] = {"U8", "I8", "I16", "U16", "F16", "BF16", "U32",
                                                 "U64", "F8_E4M3", "F8_E5M2", "C64"};
    if (std::find(std::begin(other), std::end(other), code) != std::end(other))
      fail_at(at, "dtype \"", code, "\" is valid safetensors but not supported (use F32 F64 I32 I64 BOOL)");
    fail_at(at, "unknown dtype \"", code, "\"");
  }

  std::string_view s_;
  std::string_view op_;
  std::string file_;
  std::source_location loc_;
  std::size_t i_ = 0;
};

/// Parses a header and checks that its tensors tile a data section of data_size bytes
/// exactly: each in range, sized by dtype * shape, no overlap, no gap, nothing left over.
inline Header parse_header(std::string_view json, std::uint64_t data_size, std::string_view op,
                           const std::string& file, const std::source_location& loc) {
  HeaderParser p(json, op, file, loc);
  Header h = p.parse();
  for (const Entry& e : h.entries) {
    std::uint64_t need = 0;
    if (!checked_nbytes(e.shape, e.dtype, need))
      p.fail("tensor \"", e.name, "\" has shape ", e.shape, ", too large to address");
    if (e.begin > e.end) p.fail("tensor \"", e.name, "\" has data_offsets [", e.begin, ", ", e.end, "] that run backwards");
    if (e.end > data_size)
      p.fail("tensor \"", e.name, "\" has data_offsets [", e.begin, ", ", e.end, "] past the end of the ",
             data_size, "-byte data section (truncated file?)");
    if (e.end - e.begin != need)
      p.fail("tensor \"", e.name, "\" has data_offsets [", e.begin, ", ", e.end, "] (", e.end - e.begin,
             " bytes), but ", dtype_code(e.dtype), " ", e.shape, " needs ", need, " bytes");
  }
  std::sort(h.entries.begin(), h.entries.end(),
            [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  std::uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : h.entries) {
    if (e.begin < pos) p.fail("tensors \"", prev->name, "\" and \"", e.name, "\" overlap in the data section");
    if (e.begin > pos) p.fail("bytes [", pos, ", ", e.begin, ") of the data section belong to no tensor");
    pos = e.end;
    prev = &e;
  }
  if (pos != data_size)
    p.fail("the data section has ", data_size, " bytes, but the tensors end at byte ", pos, " (trailing bytes)");
  return h;
}

/// JSON string literal of s (s must be valid UTF-8; non-ASCII is written as is).
inline std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') { out += '\\'; out += c; }
    else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else out += c;
  }
  return out + "\"";
}

/// A file written under a temporary name beside its target and renamed over the target
/// only by commit(); destroyed before commit(), it removes the temporary file. A symlink is
/// written through (the file it names is replaced, the link stays), and a file that exists
/// keeps its permission bits (a 0600 checkpoint stays 0600).
class AtomicFile {
 public:
  AtomicFile(std::filesystem::path target, std::string_view op, const std::source_location& loc)
      : target_(through_links(std::move(target))), op_(op), loc_(loc) {
    static std::atomic<unsigned> counter{0};  // distinct names for threads of one process
    tmp_ = target_;
    tmp_ += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
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
    host.push_back(t.device().is_cpu() ? t : t.to(Device::cpu(), loc));
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
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    for (auto it = metadata.begin(); it != metadata.end(); ++it)
      json += (it == metadata.begin() ? "" : ",") + quote(it->first) + ":" + quote(it->second);
    json += "}";
  }
  std::uint64_t offset = 0;
  for (std::size_t i : order) {
    const Tensor& t = host[i];
    if (json.size() > 1) json += ",";
    json += quote(tensors[i].first) + ":{\"dtype\":\"" + std::string(dtype_code(t.dtype())) + "\",\"shape\":[";
    for (int d = 0; d < t.rank(); ++d) json += (d ? "," : "") + std::to_string(t.shape()[d]);
    json += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + t.nbytes()) + "]}";
    offset += t.nbytes();
  }
  json += "}";
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

/// load_safetensors with the op name errors carry (Checkpoint::restore reuses it).
inline SafetensorsFile load(const std::filesystem::path& path, std::string_view op, const std::source_location& loc) {
  const std::string file = path.string();
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    detail::fail<IOError>(op, loc, "'", file, "': cannot read: ", ec.message());
  if (!std::filesystem::exists(st)) detail::fail<IOError>(op, loc, "'", file, "': no such file");
  if (!std::filesystem::is_regular_file(st)) detail::fail<IOError>(op, loc, "'", file, "' is not a regular file");
  const std::uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) detail::fail<IOError>(op, loc, "'", file, "': cannot read its size: ", ec.message());
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(file.c_str(), "rb"), &std::fclose);
  if (!f) {
    const int err = errno;
    detail::fail<IOError>(op, loc, "'", file, "': cannot open: ", std::strerror(err));
  }
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
    Tensor t = detail::empty_tensor(e.shape, e.dtype, Device::cpu());
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
