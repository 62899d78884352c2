// The safetensors functions that need a JSON library (nlohmann-json): the header's reader and
// writer. Internal: state/safetensors.hpp declares them and includes this file where they are
// compiled (STAGECRAFT_DEFINE_COMPILED, config.hpp): inline in a header-only build, once in
// stagecraft::precompiled's archive. A file built against that archive never parses
// <nlohmann/json.hpp> (1.5-2 s of every file that includes the umbrella header).
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <source_location>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "safetensors.hpp"

namespace stagecraft::detail::safetensors {

// nlohmann's serializer refuses anything but UTF-8, so it is the check.
STAGECRAFT_COMPILED_INLINE bool valid_utf8(std::string_view s) {
  try {
    (void)nlohmann::json(s).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

/// Reads a header: nlohmann's SAX parser does the JSON, and this handler checks the small, fixed
/// schema event by event. A hostile header is refused at its first wrong value (no DOM is built,
/// nothing nests deeper than an array in a tensor), and a key that appears twice at any level is
/// an error (nlohmann's DOM would silently keep the last one).
class HeaderReader final : public nlohmann::json_sax<nlohmann::json> {
 public:
  HeaderReader(std::string_view op, std::string file, const std::source_location& loc)
      : op_(op), file_(std::move(file)), loc_(loc) {}

  /// The parsed header, its entries in file order (not yet checked against the data section).
  Header read(std::string_view json) {
    // nlohmann's lexer takes a NUL byte for the end of its input: "{}\0junk" would parse.
    if (const std::size_t nul = json.find('\0'); nul != json.npos)
      fail("header byte ", nul, ": a NUL byte (JSON text never holds one)");
    // Checked here so a header starting with a byte-order mark (which nlohmann skips) is refused.
    const std::size_t first = json.find_first_not_of(" \t\n\r");
    if (first == json.npos)
      fail("header byte ", json.size(), ": expected the header to start with '{', found the end of the header");
    if (json[first] != '{') fail("header byte ", first, ": expected the header to start with '{'");
    nlohmann::json::sax_parse(json.begin(), json.end(), this);  // strict: only whitespace may follow the '}'
    return std::move(h_);
  }

  /// Throws IOError "[op] 'file' is corrupt: what".
  template <class... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    detail::fail<IOError>(op_, loc_, "'", file_, "' is corrupt: ", parts...);
  }

  // ---- SAX events (nlohmann has checked the syntax of each before it arrives) ----
  bool null() override { return wrong("null"); }
  bool boolean(bool) override { return wrong("a boolean"); }
  bool binary(binary_t&) override { return wrong("binary data"); }
  // Only numbers written with a '-' arrive here ("-0" too: shapes and offsets never have a sign).
  bool number_integer(number_integer_t) override { return bad_item("is negative"); }
  bool number_unsigned(number_unsigned_t v) override {
    if (in_ != In::shape && in_ != In::offsets) return wrong("a number");
    if (items_.size() == max_items()) fail(item_name(), " has more than ", max_items(), " items", where());
    if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return bad_item("is too large");
    items_.push_back(v);
    return true;
  }
  // nlohmann hands on an integer too long for 64 bits as a float; its text tells them apart.
  bool number_float(number_float_t, const string_t& text) override {
    if (text.find_first_of(".eE") != text.npos) return bad_item("is not an integer");
    return bad_item(text.front() == '-' ? "is negative" : "is too large");
  }
  bool string(string_t& s) override {
    if (in_ == In::metadata) {
      h_.metadata.emplace(std::move(key_), std::move(s));
      return true;
    }
    if (in_ != In::tensor || field_ != Field::dtype) return wrong("a string");
    entry_.dtype = dtype(s);
    return true;
  }
  bool start_object(std::size_t) override {
    if (in_ == In::start) in_ = In::root;
    else if (in_ == In::root && key_ == "__metadata__") in_ = In::metadata;
    else if (in_ == In::root) {
      in_ = In::tensor;
      entry_ = Entry{};
      entry_.name = std::move(key_);
      seen_ = {};
    } else return wrong("an object");
    return true;
  }
  bool key(string_t& k) override {
    if (in_ == In::root && k == "__metadata__") {
      if (std::exchange(seen_metadata_, true)) fail("\"__metadata__\" appears twice");
    } else if (in_ == In::root) {
      if (!names_.insert(k).second) fail("tensor \"", k, "\" appears twice");
    } else if (in_ == In::metadata) {
      if (h_.metadata.count(k)) fail("metadata key \"", k, "\" appears twice");
    } else {  // a field of a tensor
      const auto it = std::find(std::begin(field_names), std::end(field_names), k);
      if (it == std::end(field_names)) fail("unknown field \"", k, "\"", where());
      field_ = static_cast<Field>(it - std::begin(field_names));
      if (std::exchange(seen_[static_cast<int>(field_)], true)) fail("field \"", k, "\" appears twice", where());
    }
    key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    if (in_ == In::tensor) {
      for (int f = 0; f < 3; ++f)
        if (!seen_[f]) fail("tensor \"", entry_.name, "\" lacks the field \"", field_names[f], "\"");
      h_.entries.push_back(std::move(entry_));
    }
    in_ = in_ == In::root ? In::end : In::root;
    return true;
  }
  bool start_array(std::size_t) override {
    if (in_ != In::tensor || field_ == Field::dtype) return wrong("an array");
    in_ = field_ == Field::shape ? In::shape : In::offsets;
    items_.clear();
    return true;
  }
  bool end_array() override {
    if (in_ == In::shape) {
      for (std::uint64_t d : items_) entry_.shape.push_back(static_cast<std::int64_t>(d));
    } else {
      if (items_.size() != 2) fail("data_offsets of tensor \"", entry_.name, "\" must hold 2 numbers");
      entry_.begin = items_[0];
      entry_.end = items_[1];
    }
    in_ = In::tensor;
    return true;
  }
  bool parse_error(std::size_t position, const std::string& last_token, const nlohmann::json::exception& e) override {
    const std::size_t byte = position > 0 ? position - 1 : 0;  // position counts the byte it stopped at
    if (in_ == In::end) fail("header byte ", byte, ": unexpected bytes after the closing '}'");
    // nlohmann's words without its "[json.exception...] parse error at line 1, column 7: " prefix
    // and without its echo of the token (megabytes of a long string, or the invalid UTF-8 it refused).
    std::string what = e.what();
    if (const std::size_t at = what.find("syntax error"); at != what.npos) what.erase(0, at);
    const std::string echo = "; last read: '" + last_token + "'";
    if (const std::size_t at = what.find(echo); at != what.npos) what.erase(at, echo.size());
    fail("header byte ", byte, where(), ": ", what);
  }

 private:
  enum class In { start, root, metadata, tensor, shape, offsets, end };  // where the parser is
  enum class Field { dtype, shape, offsets };
  static constexpr std::string_view field_names[] = {"dtype", "shape", "data_offsets"};

  /// " in tensor \"w\"" while inside one, else "".
  std::string where() const {
    return in_ == In::tensor || in_ == In::shape || in_ == In::offsets ? " in tensor \"" + entry_.name + "\"" : "";
  }
  std::string_view item_name() const { return in_ == In::shape ? "a shape" : "data_offsets"; }
  std::size_t max_items() const { return in_ == In::shape ? max_rank : 2; }

  /// A value the schema has no place for here: "expected X, found Y".
  bool wrong(std::string_view found) const {
    const auto expected = [&]() -> std::string {
      switch (in_) {
        case In::root:
          if (key_ == "__metadata__") return "\"__metadata__\" to be an object";
          return "tensor \"" + key_ + "\" to be an object";
        case In::metadata: return "a metadata value (a string) for the key \"" + key_ + "\"";
        case In::tensor:
          if (field_ == Field::dtype) return "a dtype string";
          return field_ == Field::shape ? "a shape (an array)" : "data_offsets (an array)";
        case In::shape: return "a shape (an integer)";
        case In::offsets: return "data_offsets (an integer)";
        default: return "the header to start with '{'";
      }
    };
    fail("expected ", expected(), ", found ", found, where());
  }
  /// A number in a shape or data_offsets that is not a non-negative int64.
  bool bad_item(std::string_view problem) const {
    if (in_ != In::shape && in_ != In::offsets) return wrong("a number");
    fail(item_name(), " ", problem, where());
  }

  DType dtype(const std::string& code) const {
    for (int d = 0; d < num_dtypes; ++d)
      if (code == dtype_code(static_cast<DType>(d))) return static_cast<DType>(d);
    static constexpr std::string_view other[] = {"U8", "I8", "I16", "U16", "F16", "BF16", "U32",
                                                 "U64", "F8_E4M3", "F8_E5M2", "C64"};
    if (std::find(std::begin(other), std::end(other), code) != std::end(other))
      fail("dtype \"", code, "\" is valid safetensors but not supported (use F32 F64 I32 I64 BOOL)", where());
    fail("unknown dtype \"", code, "\"", where());
  }

  std::string_view op_;
  std::string file_;
  std::source_location loc_;
  Header h_;
  In in_ = In::start;
  std::string key_;                               // the last key read
  Field field_ = Field::dtype;                    // the tensor field being read
  Entry entry_;                                   // the tensor being read
  std::array<bool, 3> seen_{};                    // its fields seen so far
  std::vector<std::uint64_t> items_;              // the array being read
  std::set<std::string, std::less<>> names_;      // tensor names seen so far
  bool seen_metadata_ = false;
};

STAGECRAFT_COMPILED_INLINE Header parse_header(std::string_view json, std::uint64_t data_size, std::string_view op,
                           const std::string& file, const std::source_location& loc) {
  HeaderReader p(op, file, loc);
  Header h = p.read(json);
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

STAGECRAFT_COMPILED_INLINE std::string header_json(const std::vector<Entry>& entries,
                                                   const std::map<std::string, std::string>& metadata) {
  // nlohmann escapes the names (quotes, backslashes, control characters) and writes non-ASCII as it is.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const Entry& e : entries)
    header[e.name] = {{"dtype", std::string(dtype_code(e.dtype))},
                      {"shape", e.shape.vec()},
                      {"data_offsets", {e.begin, e.end}}};
  return header.dump();  // compact: no spaces
}

}  // namespace stagecraft::detail::safetensors
