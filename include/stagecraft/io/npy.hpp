// NumPy .npy files: a strict reader (format 1.0/2.0/3.0, either byte order, Fortran order) and an atomic writer.
#pragma once
#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/shape.hpp"
#include "../core/tensor.hpp"
#include "../state/safetensors.hpp"  // detail::safetensors::AtomicFile, the library's one atomic writer

// Tensors are copied to and from the file's little-endian bytes as they are in memory.
static_assert(std::endian::native == std::endian::little,
              "stagecraft's .npy reader/writer assumes a little-endian host");
static_assert(sizeof(bool) == 1, "stagecraft's .npy reader/writer stores bool as NumPy's one-byte |b1");

namespace stagecraft {

namespace io {
/// Largest .npy header a reader accepts. NumPy's own reader refuses more than 10000 bytes by
/// default; we allow hand-padded 2.0/3.0 headers up to 1 MiB and bound memory beyond that.
inline constexpr std::uint64_t npy_max_header_bytes = std::uint64_t{1} << 20;
}  // namespace io

namespace detail::npy {

inline constexpr std::string_view magic{"\x93NUMPY", 6};

/// Where errors point: the op, the file (or the in-memory buffer's name) and the user's call.
struct Ctx {
  std::string_view op;
  std::string_view what;
  std::source_location loc;
  /// Throws IOError "[op] 'what' is corrupt: ...".
  template <class... Parts>
  [[noreturn]] void corrupt(const Parts&... parts) const {
    fail<IOError>(op, loc, "'", what, "' is corrupt: ", parts...);
  }
};

/// An element type a file may hold: NumPy's kind letter and byte size, and the dtype it loads as.
struct Type {
  char kind;
  int size;
  DType dtype;
};
/// The library's dtypes, read and written as they are, then the integer types that load
/// widened without loss (stagecraft has no 8/16-bit or unsigned dtypes). Nothing else is read:
/// u8 does not fit i64, and f2/c8/strings/objects have no stagecraft dtype.
inline constexpr Type types[] = {{'b', 1, DType::b8},  {'i', 4, DType::i32}, {'i', 8, DType::i64},
                                 {'f', 4, DType::f32}, {'f', 8, DType::f64}, {'i', 1, DType::i32},
                                 {'u', 1, DType::i32}, {'i', 2, DType::i32}, {'u', 2, DType::i32},
                                 {'u', 4, DType::i64}};

/// NumPy's descr of a dtype as written: "|b1", "<i4", "<i8", "<f4", "<f8".
constexpr std::string_view descr(DType d) {
  constexpr std::string_view codes[] = {"|b1", "<i4", "<i8", "<f4", "<f8"};
  return codes[static_cast<int>(d)];
}

/// A parsed and checked header.
struct Header {
  std::string descr;  // as the file spells it, for messages
  Type type{};
  bool big_endian = false;
  bool fortran = false;
  Shape shape;
  std::uint64_t data_bytes = 0;  // numel * the file's itemsize
};


/// A strict parser for the header: a Python dict literal with exactly the keys 'descr' (a
/// string), 'fortran_order' (True/False) and 'shape' (a tuple of non-negative ints). Hand-written
/// because the grammar is tiny; it never recurses, never reads past the header, and names the
/// byte it rejects. Only ASCII is meaningful outside strings, so 3.0's UTF-8 and 1.0/2.0's
/// latin-1 parse alike. Python 2's "3L" extents and escapes in strings are rejected.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const Ctx& c) : s_(text), c_(c) {}

  Header parse() {
    Header h;
    bool seen[3] = {false, false, false};
    static constexpr std::string_view keys[] = {"descr", "fortran_order", "shape"};
    ws();
    if (!eat('{')) fail_at(i_, "the header is not a dict literal (it does not start with '{')");
    ws();
    while (!at_end() && peek() != '}') {
      const std::size_t at = i_;
      const std::string_view key = string("a key (a quoted string)");
      const auto k = std::find(std::begin(keys), std::end(keys), key) - std::begin(keys);
      if (k == 3) fail_at(at, "unexpected key '", key, "' (expected 'descr', 'fortran_order', 'shape')");
      if (seen[k]) fail_at(at, "the key '", key, "' appears twice");
      seen[k] = true;
      ws();
      expect(':', "':' after a key");
      ws();
      if (k == 0) descr_value(h);
      else if (k == 1) h.fortran = boolean();
      else h.shape = shape();
      ws();
      if (!eat(',')) break;
      ws();
    }
    expect('}', "',' or '}' after a value");
    ws();
    if (!at_end()) fail_at(i_, "unexpected bytes after the closing '}'");
    for (int k = 0; k < 3; ++k)
      if (!seen[k]) c_.corrupt("the header lacks the key '", keys[k], "'");
    // Checked at the tensor's itemsize, which is at least the file's (loads only widen).
    std::uint64_t tensor_bytes = 0;
    if (!stagecraft::detail::shape_bytes(h.shape, static_cast<std::int64_t>(itemsize(h.type.dtype)), tensor_bytes))
      c_.corrupt("shape ", h.shape, " of ", h.descr, " has too many elements or bytes to address (more than 2^62 bytes)");
    h.data_bytes = static_cast<std::uint64_t>(h.shape.numel()) * static_cast<std::uint64_t>(h.type.size);
    return h;
  }

 private:
  template <class... Parts>
  [[noreturn]] void fail_at(std::size_t at, const Parts&... parts) const {
    c_.corrupt("header byte ", at, ": ", parts...);
  }
  bool at_end() const { return i_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[i_]; }
  static bool digit(char c) { return c >= '0' && c <= '9'; }
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
  /// True when the word w is next, not followed by more of an identifier or number.
  bool word(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    const char next = i_ + w.size() < s_.size() ? s_[i_ + w.size()] : ' ';
    if (std::isalnum(static_cast<unsigned char>(next)) || next == '_' || next == '.') return false;
    i_ += w.size();
    return true;
  }

  /// A '...' or "..." literal without escapes (NumPy's headers never need one).
  std::string_view string(std::string_view what) {
    const char q = peek();
    if (q != '\'' && q != '"') fail_at(i_, "expected ", what);
    const std::size_t start = ++i_;
    for (; !at_end() && s_[i_] != q; ++i_)
      if (s_[i_] == '\\' || s_[i_] == '\n') fail_at(i_, "escapes and newlines in strings are not supported");
    if (at_end()) fail_at(start - 1, "unterminated string");
    return s_.substr(start, i_++ - start);
  }
  bool boolean() {
    if (word("True")) return true;
    if (word("False")) return false;
    fail_at(i_, "fortran_order must be True or False");
  }
  /// A non-negative decimal int that fits in int64.
  std::int64_t extent() {
    const std::size_t at = i_;
    const bool negative = eat('-');
    if (!digit(peek())) fail_at(at, "expected an integer extent in the shape");
    if (peek() == '0' && i_ + 1 < s_.size() && digit(s_[i_ + 1])) fail_at(at, "leading zero in an extent");
    std::uint64_t v = 0;
    constexpr auto max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    while (digit(peek())) {
      const auto d = static_cast<std::uint64_t>(s_[i_++] - '0');
      if (v > (max - d) / 10) fail_at(at, "extent is larger than an int64");
      v = v * 10 + d;
    }
    if (std::isalpha(static_cast<unsigned char>(peek())) || peek() == '_' || peek() == '.')
      fail_at(at, "extent is not a plain integer");
    if (negative) fail_at(at, "shape has a negative extent -", v);
    return static_cast<std::int64_t>(v);
  }
  /// "()", "(n,)", "(a, b)" or "(a, b,)": a tuple of at most max_rank extents.
  Shape shape() {
    const std::size_t start = i_;
    if (!eat('(')) fail_at(i_, "shape must be a tuple '(...)'");
    ws();
    Shape s;
    bool comma = false;
    while (!at_end() && peek() != ')') {
      if (s.rank() == max_rank) fail_at(i_, "shape has more than ", max_rank, " extents (stagecraft's max_rank)");
      s.push_back(extent());
      ws();
      comma = eat(',');
      if (!comma) break;
      ws();
    }
    expect(')', "',' or ')' in the shape");
    if (s.rank() == 1 && !comma) fail_at(start, "shape (", s[0], ") is an int, not a tuple (write (", s[0], ",))");
    return s;
  }
  /// '<f4' and friends: byte order ('<', '>'; '|' for one-byte types), kind, size.
  void descr_value(Header& h) {
    const std::size_t at = i_;
    if (peek() == '[') fail_at(at, "descr is a list: structured dtypes are not supported");
    const std::string_view d = string("descr (a quoted string)");
    h.descr = std::string(d);
    const bool well_formed = d.size() >= 3 && std::string_view("<>|=").find(d[0]) != std::string_view::npos &&
                             std::all_of(d.begin() + 2, d.end(), digit) && d[2] != '0' && d.size() <= 5;
    const int size = well_formed ? std::stoi(std::string(d.substr(2))) : 0;
    const Type* t = std::find_if(std::begin(types), std::end(types),
                                 [&](const Type& x) { return well_formed && x.kind == d[1] && x.size == size; });
    if (!well_formed || (t == std::end(types) && std::string_view("biufcmMOSUV").find(d[1]) == std::string_view::npos))
      fail_at(at, "unknown descr '", d, "'");
    if (t == std::end(types))
      fail_at(at, "descr '", d, "' is valid NumPy but has no stagecraft dtype (supported: |b1 <i4 <i8 <f4 <f8, "
                  "and i1 u1 i2 u2 u4, read widened to i32/i64)");
    if (d[0] == '=' || (d[0] == '|' && size != 1))
      fail_at(at, "descr '", d, "' does not name a byte order (expected '<' or '>')");
    h.type = *t;
    h.big_endian = d[0] == '>';
  }

  std::string_view s_;
  const Ctx& c_;
  std::size_t i_ = 0;
};

/// What the bytes before the header say.
struct Preamble {
  unsigned major = 0;
  std::size_t size = 0;  // 10 for 1.0, 12 for 2.0 and 3.0
  std::uint64_t header_len = 0;
};

/// Checks the magic, version and header length from a file's first bytes (12 suffice) and
/// the file's total length.
inline Preamble parse_preamble(std::string_view b, std::uint64_t total, const Ctx& c) {
  const std::size_t m = std::min(b.size(), magic.size());
  if (b.substr(0, m) != magic.substr(0, m))
    c.corrupt("bad magic: it does not start with \"\\x93NUMPY\" (not an .npy file)");
  if (b.size() < 8) c.corrupt("the file ends inside the magic string and version (", total, " bytes; truncated?)");
  Preamble p;
  p.major = static_cast<unsigned char>(b[6]);
  const unsigned minor = static_cast<unsigned char>(b[7]);
  if (p.major < 1 || p.major > 3 || minor != 0)
    c.corrupt("unknown format version ", p.major, ".", minor, " (this reader knows 1.0, 2.0 and 3.0)");
  p.size = p.major == 1 ? 10 : 12;
  if (b.size() < p.size) c.corrupt("the file ends inside the header length (", total, " bytes; truncated?)");
  for (std::size_t k = p.size; k-- > 8;) p.header_len = (p.header_len << 8) | static_cast<unsigned char>(b[k]);
  if (p.header_len > io::npy_max_header_bytes)
    c.corrupt("the header length ", p.header_len, " is over the ", io::npy_max_header_bytes, "-byte limit");
  if (p.header_len > total - p.size)
    c.corrupt("the header length ", p.header_len, " runs past the end of the ", total, "-byte file (truncated?)");
  return p;
}

/// Checks that the data after the header is exactly what the header's shape needs.
inline void check_data_size(const Header& h, std::uint64_t have, const Ctx& c) {
  if (have < h.data_bytes)
    c.corrupt("the data has ", have, " bytes, but ", h.descr, " ", h.shape, " needs ", h.data_bytes, " (truncated?)");
  if (have > h.data_bytes)
    c.corrupt(have - h.data_bytes, " bytes of trailing data after the ", h.data_bytes, " bytes that ", h.descr, " ",
              h.shape, " needs");
}

/// A bool byte other than 0 or 1 cannot be read as a C++ bool.
inline void check_bools(const void* data, std::uint64_t n, const Ctx& c) {
  const auto* b = static_cast<const unsigned char*>(data);
  for (std::uint64_t i = 0; i < n; ++i)
    if (b[i] > 1) c.corrupt("bool data holds the byte ", int(b[i]), " at element ", i, " (must be 0 or 1)");
}

/// Elements of `size` bytes in Fortran order (first axis fastest), reordered row-major.
inline std::vector<unsigned char> fortran_to_c(const unsigned char* src, const Shape& s, std::size_t size) {
  const std::int64_t n = s.numel();
  const int r = s.rank();
  std::vector<unsigned char> out(static_cast<std::size_t>(n) * size);
  std::array<std::int64_t, max_rank> stride{}, idx{};
  for (int k = 0; k < r; ++k) stride[k] = k == 0 ? 1 : stride[k - 1] * s[k - 1];
  std::int64_t off = 0;  // source element of output element i
  for (std::int64_t i = 0; i < n; ++i) {
    std::memcpy(out.data() + i * size, src + off * static_cast<std::int64_t>(size), size);
    for (int k = r - 1; k >= 0; --k) {  // the output's odometer: last axis fastest
      if (++idx[k] < s[k]) { off += stride[k]; break; }
      off -= (s[k] - 1) * stride[k];
      idx[k] = 0;
    }
  }
  return out;
}

/// Converts n elements stored as S (byte-swapped first when `swap`) to T.
template <class S, class T>
void convert(const unsigned char* src, std::int64_t n, bool swap, void* dst) {
  T* out = static_cast<T*>(dst);
  for (std::int64_t i = 0; i < n; ++i) {
    unsigned char b[sizeof(S)];
    std::memcpy(b, src + i * static_cast<std::int64_t>(sizeof(S)), sizeof(S));
    if (swap) std::reverse(b, b + sizeof(S));
    S v;
    std::memcpy(&v, b, sizeof(S));
    out[i] = static_cast<T>(v);
  }
}
inline void convert(const Type& t, const unsigned char* src, std::int64_t n, bool swap, void* dst) {
  if (t.kind == 'b') return convert<std::uint8_t, bool>(src, n, false, dst);
  if (t.kind == 'f')
    return t.size == 4 ? convert<float, float>(src, n, swap, dst) : convert<double, double>(src, n, swap, dst);
  if (t.kind == 'u') {
    if (t.size == 1) return convert<std::uint8_t, std::int32_t>(src, n, swap, dst);
    if (t.size == 2) return convert<std::uint16_t, std::int32_t>(src, n, swap, dst);
    return convert<std::uint32_t, std::int64_t>(src, n, swap, dst);
  }
  if (t.size == 1) return convert<std::int8_t, std::int32_t>(src, n, swap, dst);
  if (t.size == 2) return convert<std::int16_t, std::int32_t>(src, n, swap, dst);
  if (t.size == 4) return convert<std::int32_t, std::int32_t>(src, n, swap, dst);
  return convert<std::int64_t, std::int64_t>(src, n, swap, dst);
}

/// True when the file's data bytes are the tensor's bytes: no widening, swap or reordering.
inline bool in_place(const Header& h) {
  return static_cast<std::size_t>(h.type.size) == itemsize(h.type.dtype) && (!h.big_endian || h.type.size == 1) &&
         (!h.fortran || h.shape.rank() <= 1);
}

/// The tensor a header describes, from its h.data_bytes data bytes. fortran_order True is
/// read, not rejected: the elements are reordered into stagecraft's row-major layout.
inline Tensor decode(const Header& h, const unsigned char* src, const Ctx& c) {
  if (h.type.dtype == DType::b8) check_bools(src, h.data_bytes, c);
  Tensor t = empty_tensor(h.shape, h.type.dtype, Device::cpu(), c.op, c.loc);
  if (h.data_bytes == 0) return t;
  if (in_place(h)) {
    std::memcpy(t.raw_data(), src, h.data_bytes);
    return t;
  }
  std::vector<unsigned char> reordered;
  if (h.fortran && h.shape.rank() > 1) {
    reordered = fortran_to_c(src, h.shape, static_cast<std::size_t>(h.type.size));
    src = reordered.data();
  }
  convert(h.type, src, h.shape.numel(), h.big_endian, t.raw_data());
  return t;
}

/// The preamble, a header dict and its padding, as NumPy writes them: version 1.0 unless the
/// header needs 2.0's 4-byte length; spaces, then '\n', so the data starts at a multiple of 64
/// (NumPy adds a whole 64 when already aligned; so do we, for byte-identical files).
inline std::string wrap_header(std::string_view dict) {
  const std::size_t hlen = dict.size() + 1;  // with the '\n'
  const bool v1 = 64 - (10 + hlen) % 64 + hlen <= 0xFFFF;
  const std::size_t prefix = v1 ? 10 : 12;
  const std::size_t pad = 64 - (prefix + hlen) % 64;
  const std::uint64_t len = hlen + pad;
  std::string out(magic);
  out += static_cast<char>(v1 ? 1 : 2);
  out += '\0';
  for (std::size_t k = 0; k < prefix - 8; ++k) out += static_cast<char>((len >> (8 * k)) & 0xFF);
  out += dict;
  out.append(pad, ' ');
  out += '\n';
  return out;
}

/// The bytes before a tensor's data: NumPy's dict (keys sorted, repr of the shape) plus the
/// spare spaces current NumPy leaves so the first extent can grow to 21 digits in place.
inline std::string header_bytes(const Tensor& t) {
  std::string shape = "(";
  for (int d = 0; d < t.rank(); ++d) shape += (d ? ", " : "") + std::to_string(t.shape()[d]);
  shape += t.rank() == 1 ? ",)" : ")";
  std::string dict =
      "{'descr': '" + std::string(descr(t.dtype())) + "', 'fortran_order': False, 'shape': " + shape + ", }";
  if (t.rank() > 0) dict.append(21 - std::to_string(t.shape()[0]).size(), ' ');
  return wrap_header(dict);
}

/// from_npy_bytes with the op name errors carry.
inline Tensor from_bytes(std::string_view b, std::string_view op, std::string_view what,
                         const std::source_location& loc) {
  const Ctx c{op, what, loc};
  const Preamble p = parse_preamble(b.substr(0, 12), b.size(), c);
  const Header h = HeaderParser(b.substr(p.size, p.header_len), c).parse();
  const std::string_view data = b.substr(p.size + p.header_len);
  check_data_size(h, data.size(), c);
  return decode(h, reinterpret_cast<const unsigned char*>(data.data()), c);
}

/// load_npy with the op name errors carry: checks the header before reading the data, and
/// reads the data straight into the tensor when no conversion is needed.
inline Tensor load(const std::string& path, std::string_view op, const std::source_location& loc) {
  const Ctx c{op, path, loc};
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    fail<IOError>(op, loc, "'", path, "': cannot read: ", ec.message());
  if (!std::filesystem::exists(st)) fail<IOError>(op, loc, "'", path, "': no such file");
  if (!std::filesystem::is_regular_file(st)) fail<IOError>(op, loc, "'", path, "' is not a regular file");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) {
    const int err = errno;
    fail<IOError>(op, loc, "'", path, "': cannot open: ", std::strerror(err));
  }
  const std::uint64_t size = safetensors::open_file_size(f.get(), op, path, loc);  // of this file, not the path's
  const auto read = [&](void* dst, std::uint64_t n, std::string_view what) {
    if (n > 0 && std::fread(dst, 1, n, f.get()) != n) c.corrupt("the file ends inside ", what, " (truncated?)");
  };
  std::string pre(static_cast<std::size_t>(std::min<std::uint64_t>(size, 12)), '\0');
  read(pre.data(), pre.size(), "the preamble");
  const Preamble p = parse_preamble(pre, size, c);
  if (std::fseek(f.get(), static_cast<long>(p.size), SEEK_SET) != 0) c.corrupt("cannot seek to the header");
  std::string text(static_cast<std::size_t>(p.header_len), '\0');
  read(text.data(), text.size(), "the header");
  const Header h = HeaderParser(text, c).parse();
  check_data_size(h, size - p.size - p.header_len, c);
  if (!in_place(h)) {
    std::vector<unsigned char> buf(static_cast<std::size_t>(h.data_bytes));
    read(buf.data(), buf.size(), "the data");
    return decode(h, buf.data(), c);
  }
  Tensor t = empty_tensor(h.shape, h.type.dtype, Device::cpu(), c.op, c.loc);
  read(t.raw_data(), h.data_bytes, "the data");
  if (h.type.dtype == DType::b8) check_bools(t.raw_data(), h.data_bytes, c);
  return t;
}

}  // namespace detail::npy

namespace io {

/// The bytes of an .npy file (format 1.0, as NumPy writes it, byte for byte) holding a
/// concrete CPU tensor. Symbolic or non-CPU tensors throw (StagingError, DeviceError).
inline std::string to_npy_bytes(const Tensor& t, std::source_location loc = std::source_location::current()) {
  detail::require_concrete(t, "to_npy_bytes", loc);
  std::string out = detail::npy::header_bytes(t);
  if (t.nbytes() > 0) out.append(static_cast<const char*>(t.raw_data()), t.nbytes());
  return out;
}

/// Parses the bytes of an .npy file; `what` names them in errors (as a path would). Reads
/// format 1.0, 2.0 and 3.0; descr |b1 <i4 <i8 <f4 <f8 (or '>' big-endian, converted), and the
/// integer types i1 u1 i2 u2 (as i32) and u4 (as i64); fortran_order True is reordered into
/// row-major. Anything malformed is an IOError saying what is wrong.
inline Tensor from_npy_bytes(std::string_view bytes, std::string_view what,
                             std::source_location loc = std::source_location::current()) {
  return detail::npy::from_bytes(bytes, "from_npy_bytes", what, loc);
}

/// Reads an .npy file (see from_npy_bytes for what is accepted) into a CPU tensor. A missing,
/// truncated or malformed file is an IOError naming the file and what is wrong.
inline Tensor load_npy(const std::string& path, std::source_location loc = std::source_location::current()) {
  return detail::npy::load(path, "load_npy", loc);
}

/// Writes a concrete CPU tensor to an .npy file that NumPy reads (np.load). The write is atomic:
/// a temporary file beside `path`, flushed to disk, then renamed over it; on failure the old
/// file is untouched and IOError is thrown.
inline void save_npy(const std::string& path, const Tensor& t,
                     std::source_location loc = std::source_location::current()) {
  detail::require_concrete(t, "save_npy", loc);
  const std::string header = detail::npy::header_bytes(t);
  detail::safetensors::AtomicFile f(path, "save_npy", loc);
  f.write(header.data(), header.size());
  if (t.nbytes() > 0) f.write(t.raw_data(), t.nbytes());
  f.commit();
}

}  // namespace io
}  // namespace stagecraft
