// Saved functions: ConcreteFunction::save writes the optimized graph (a line-based text form) with
// its constants and variable values as one safetensors file; sc::load_function reads it back.
#pragma once
#include <bit>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <source_location>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../state/safetensors.hpp"
#include "../state/variable.hpp"
#include "function.hpp"
#include "host_fn.hpp"
#include "ir.hpp"
#include "passes/verify.hpp"

namespace stagecraft {

/// The `format` metadata of a saved function, and the version this build writes and reads.
inline constexpr std::string_view function_format = "stagecraft.function";
inline constexpr int function_format_version = 1;

// A new Attrs field must be written and read below, or saved functions silently lose it.
static_assert(sizeof(ops::Attrs) == 200, "ops::Attrs changed: save and load its new fields in graph/serialize.hpp");

namespace graph::detail_ser {

// The graph text: one record a line, `kind key=value ...`; a value is a bare token or a quoted
// string. Hand-written rather than JSON: a dozen record kinds need no JSON library (~25k lines)
// in the umbrella header, and the text stays diffable. Example:
//   file id=0 path="/src/model.cpp"
//   var id=0 name="w" trainable=1 dtype=f32 shape=[3,2] device=cpu tensor="w"
//   graph name="f" values=3 nodes=3 inputs=[0] outputs=[2]
//     value id=0 dtype=f32 shape=[4,3] device=cpu
//     node id=0 kind=input index=0 in=[] out=[0] loc=0:12
//     node id=2 kind=op op=matmul in=[0,1] out=[2] loc=0:13
//     ... (cond/while nodes: bodies=2, then two nested graph ... end blocks)
//   end
inline constexpr int max_depth = 64;  // nesting of bodies; bounds the reader's recursion

/// A quoted string: printable ASCII as is, `"` and `\` escaped, every other byte as \xHH.
STAGECRAFT_COMPILED_INLINE std::string quote(std::string_view s);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::string quote(std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') out += '\\', out += ch;
    else if (c >= 0x20 && c < 0x7f) out += ch;
    else out += "\\x", out += hex[c >> 4], out += hex[c & 15];
  }
  return out + "\"";
}
#endif  // STAGECRAFT_DEFINE_COMPILED

template <class Ints>
std::string list(const Ints& xs) {
  // Appended piece by piece: GCC 12 at -O3 warns (-Wrestrict, a false positive) on
  // `const char* + std::string&&` inlined here.
  std::string s = "[";
  for (auto x : xs) {
    if (s.size() > 1) s += ',';
    s += std::to_string(x);
  }
  s += ']';
  return s;
}

STAGECRAFT_COMPILED_INLINE std::string number(double x);

/// Every Attrs field that differs from its default (doubles compared bitwise: -0.0 survives).
STAGECRAFT_COMPILED_INLINE std::string attrs_text(const ops::Attrs& a);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::string number(double x) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);  // shortest text that reads back exactly
  return std::string(buf, r.ptr);
}

STAGECRAFT_COMPILED_INLINE std::string attrs_text(const ops::Attrs& a) {
  const ops::Attrs d{};
  std::string s;
  const auto differs = [](double x, double y) { return std::bit_cast<std::uint64_t>(x) != std::bit_cast<std::uint64_t>(y); };
  if (a.ints != d.ints) s += " ints=" + list(a.ints);
  if (a.ints2 != d.ints2) s += " ints2=" + list(a.ints2);
  if (a.axis != d.axis) s += " axis=" + std::to_string(a.axis);
  if (a.i0 != d.i0) s += " i0=" + std::to_string(a.i0);
  if (a.i1 != d.i1) s += " i1=" + std::to_string(a.i1);
  if (a.i2 != d.i2) s += " i2=" + std::to_string(a.i2);
  if (differs(a.scalar, d.scalar)) s += " scalar=" + number(a.scalar);
  if (differs(a.scalar2, d.scalar2)) s += " scalar2=" + number(a.scalar2);
  if (a.dtype != d.dtype) s += " dtype=" + std::string(name(a.dtype));
  if (a.flag != d.flag) s += " flag=1";
  return s;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// Writes a graph's text and collects the tensors it names (constants, variable values).
class Writer {
 public:
  explicit Writer(const std::source_location& loc) : loc_(loc) {}

  std::string text(const Graph& g) {
    std::string body;
    graph(body, g, "", 0);
    std::string head;
    for (std::size_t i = 0; i < files_.size(); ++i)
      head += "file id=" + std::to_string(i) + " path=" + quote(files_[i]) + "\n";
    head += vars_text_;
    return head + body;
  }
  std::vector<std::pair<std::string, Tensor>> tensors;

 private:
  void graph(std::string& out, const Graph& g, const std::string& ind, int depth) {
    if (depth >= max_depth)
      stagecraft::detail::fail<ValueError>("save", loc_, "bodies nest more than ", max_depth, " deep");
    out += ind + "graph name=" + quote(g.name) + " values=" + std::to_string(g.values.size()) +
           " nodes=" + std::to_string(g.nodes.size()) + " inputs=" + list(g.inputs) + " outputs=" + list(g.outputs) + "\n";
    for (std::size_t v = 0; v < g.values.size(); ++v) {
      const Value& x = g.values[v];
      out += ind + "  value id=" + std::to_string(v) + " dtype=" + std::string(name(x.dtype)) + " shape=" +
             list(x.shape) + " device=" + x.device.str() + "\n";
    }
    for (std::size_t i = 0; i < g.nodes.size(); ++i) node(out, g, g.nodes[i], static_cast<int>(i), ind + "  ", depth);
    out += ind + "end\n";
  }

  void node(std::string& out, const Graph& g, const Node& n, int i, const std::string& ind, int depth) {
    const char* file = n.loc.file ? n.loc.file : "";
    if (n.kind == NodeKind::host_fn)
      stagecraft::detail::fail_at<StagingError>(
          "save", file, n.loc.line, "node ", i, " of '", g.name, "' is a host_fn (arbitrary C++ code), which cannot be "
          "saved: a saved function runs without the program that made it. Save a function without the host_fn");
    out += ind + "node id=" + std::to_string(i) + " kind=" + kind_name(n.kind);
    if (n.kind == NodeKind::op) out += " op=" + std::string(ops::op_info(n.op).name);
    if (n.kind == NodeKind::input) out += " index=" + std::to_string(n.index);
    if (n.kind == NodeKind::constant) {
      const std::string t = unique("const/" + std::to_string(num_consts_++));
      tensors.emplace_back(t, n.constant);
      out += " tensor=" + quote(t);
    }
    if (n.var) out += " var=" + std::to_string(var_id(n.var));
    if (n.num_loop_vars != 0) out += " loop_vars=" + std::to_string(n.num_loop_vars);
    out += " in=" + list(n.inputs) + " out=" + list(n.outputs) + attrs_text(n.attrs);
    if (file[0] != '\0' || n.loc.line != 0) out += " loc=" + std::to_string(file_id(file)) + ":" + std::to_string(n.loc.line);
    if (!n.bodies.empty()) out += " bodies=" + std::to_string(n.bodies.size());
    out += "\n";
    for (const auto& b : n.bodies) {
      if (!b) stagecraft::detail::fail<ValueError>("save", loc_, "node ", i, " of '", g.name, "' has an empty body");
      graph(out, *b, ind + "  ", depth + 1);
    }
  }

  std::string unique(const std::string& base) {
    std::string s = base.empty() ? "variable" : base;
    for (int k = 1; names_.count(s); ++k) s = (base.empty() ? "variable" : base) + "~" + std::to_string(k);
    names_.insert(s);
    return s;
  }

  int file_id(const char* f) {
    auto [it, added] = file_ids_.emplace(f, static_cast<int>(files_.size()));
    if (added) files_.push_back(f);
    return it->second;
  }

  int var_id(const std::shared_ptr<stagecraft::detail::VariableState>& v) {
    auto [it, added] = var_ids_.emplace(v.get(), static_cast<int>(var_ids_.size()));
    if (!added) return it->second;
    Tensor value;
    {
      std::lock_guard<std::mutex> lock(v->mu);  // a plan on another thread may assign it
      value = v->value;
    }
    const std::string t = unique(v->name);
    tensors.emplace_back(t, value);
    vars_text_ += "var id=" + std::to_string(it->second) + " name=" + quote(v->name) + " trainable=" +
                  (v->trainable ? "1" : "0") + " dtype=" + std::string(name(value.dtype())) + " shape=" +
                  list(value.shape()) + " device=" + value.device().str() + " tensor=" + quote(t) + "\n";
    return it->second;
  }

  std::source_location loc_;
  std::vector<std::string> files_;
  std::map<std::string, int> file_ids_;
  std::map<const void*, int> var_ids_;
  std::string vars_text_;
  std::set<std::string> names_;
  int num_consts_ = 0;
};

/// One parsed line: its kind and key=value fields (each must be used once by the reader).
struct Record {
  int line = 0;
  std::string kind;
  std::vector<std::pair<std::string, std::string>> fields;
  std::vector<char> used;
};

/// Reads a graph's text strictly: every line, field, id and count is checked; the first error
/// is an IOError naming the file, the text line and what is wrong.
class Reader {
 public:
  Reader(std::string_view text, const std::string& file, std::map<std::string, Tensor>& tensors,
         const std::source_location& loc)
      : file_(file), tensors_(tensors), loc_(loc), strings_(std::make_shared<std::vector<std::unique_ptr<std::string>>>()) {
    for (std::size_t b = 0; b <= text.size();) {
      std::size_t e = text.find('\n', b);
      if (e == std::string_view::npos) e = text.size();
      lines_.push_back(text.substr(b, e - b));
      b = e + 1;
    }
  }

  Graph read() {
    Record r = next("a file, var or graph line");
    for (; r.kind == "file"; r = next("a var or graph line")) {
      expect_id(r, strings_->size());
      strings_->push_back(std::make_unique<std::string>(text(r, "path")));
      finish(r);
    }
    for (; r.kind == "var"; r = next("a graph line")) read_var(r);
    Graph g = read_graph(r, 0);
    skip_blank();
    if (pos_ < lines_.size()) fail(static_cast<int>(pos_ + 1), "unexpected text after the graph's end");
    for (const auto& kv : tensors_)
      if (!used_tensors_.count(kv.first)) corrupt("tensor \"", kv.first, "\" is not used by the graph");
    return g;
  }

  template <class... Parts>
  [[noreturn]] void corrupt(const Parts&... parts) const {
    stagecraft::detail::fail<IOError>("load_function", loc_, "'", file_, "' is corrupt: ", parts...);
  }

 private:
  template <class... Parts>
  [[noreturn]] void fail(int line, const Parts&... parts) const {
    corrupt("graph line ", line, ": ", parts...);
  }

  void skip_blank() {
    while (pos_ < lines_.size() && lines_[pos_].find_first_not_of(' ') == std::string_view::npos) ++pos_;
  }

  /// The next non-blank line, parsed.
  Record next(std::string_view expected) {
    skip_blank();
    if (pos_ >= lines_.size()) corrupt("the graph text ends where ", expected, " should be");
    Record r;
    r.line = static_cast<int>(pos_ + 1);
    std::string_view s = lines_[pos_++];
    std::size_t i = s.find_first_not_of(' ');
    const auto word_end = [&](std::size_t from) { return std::min(s.find_first_of(" =\"", from), s.size()); };
    std::size_t e = word_end(i);
    r.kind = std::string(s.substr(i, e - i));
    for (i = e; (i = s.find_first_not_of(' ', i)) != std::string_view::npos;) {
      e = word_end(i);
      std::string key(s.substr(i, e - i));
      if (key.empty() || e >= s.size() || s[e] != '=') fail(r.line, "expected key=value at column ", i + 1);
      for (const auto& f : r.fields)
        if (f.first == key) fail(r.line, "field \"", key, "\" appears twice");
      i = e + 1;
      std::string value;
      if (i < s.size() && s[i] == '"') i = unquote(s, i, value, r.line);
      else {
        e = std::min(s.find(' ', i), s.size());
        value = std::string(s.substr(i, e - i));
        if (value.find('"') != std::string::npos) fail(r.line, "stray '\"' in the value of \"", key, "\"");
        i = e;
      }
      if (i < s.size() && s[i] != ' ') fail(r.line, "expected a space after the value of \"", key, "\"");
      r.fields.emplace_back(std::move(key), std::move(value));
    }
    r.used.assign(r.fields.size(), 0);
    return r;
  }

  std::size_t unquote(std::string_view s, std::size_t i, std::string& out, int line) const {
    const auto hex = [&](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      fail(line, "bad \\x escape");
    };
    for (++i; i < s.size(); ++i) {
      const char c = s[i];
      if (c == '"') return i + 1;
      if (c != '\\') { out += c; continue; }
      if (i + 1 < s.size() && (s[i + 1] == '"' || s[i + 1] == '\\')) { out += s[++i]; continue; }
      if (i + 3 >= s.size() || s[i + 1] != 'x') fail(line, "bad escape in a string");
      out += static_cast<char>(hex(s[i + 2]) * 16 + hex(s[i + 3]));
      i += 3;
    }
    fail(line, "unterminated string");
  }

  const std::string* find(Record& r, std::string_view key) const {
    for (std::size_t k = 0; k < r.fields.size(); ++k)
      if (r.fields[k].first == key) {
        r.used[k] = 1;
        return &r.fields[k].second;
      }
    return nullptr;
  }
  const std::string& text(Record& r, std::string_view key) const {
    const std::string* v = find(r, key);
    if (!v) fail(r.line, "\"", r.kind, "\" lacks the field \"", key, "\"");
    return *v;
  }
  std::int64_t integer(Record& r, std::string_view key, std::int64_t lo, std::int64_t hi) const {
    return parse_int(r, key, text(r, key), lo, hi);
  }
  std::int64_t parse_int(const Record& r, std::string_view key, std::string_view s, std::int64_t lo, std::int64_t hi) const {
    std::int64_t x = 0;
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
    if (ec != std::errc{} || p != s.data() + s.size() || s.empty()) fail(r.line, "\"", key, "\" is not an integer: ", s);
    if (x < lo || x > hi) fail(r.line, "\"", key, "\" is ", x, ", out of range [", lo, ", ", hi, "]");
    return x;
  }
  std::vector<std::int64_t> ints(Record& r, std::string_view key, std::int64_t lo, std::int64_t hi) const {
    const std::string& s = text(r, key);
    if (s.size() < 2 || s.front() != '[' || s.back() != ']') fail(r.line, "\"", key, "\" is not a list: ", s);
    std::vector<std::int64_t> out;
    const std::string_view body = std::string_view(s).substr(1, s.size() - 2);
    for (std::size_t b = 0; !body.empty() && b <= body.size();) {
      const std::size_t e = std::min(body.find(',', b), body.size());
      out.push_back(parse_int(r, key, body.substr(b, e - b), lo, hi));
      b = e + 1;
    }
    return out;
  }
  std::vector<int> ids(Record& r, std::string_view key, std::size_t n) const {
    std::vector<int> out;
    for (std::int64_t x : ints(r, key, 0, static_cast<std::int64_t>(n) - 1)) out.push_back(static_cast<int>(x));
    return out;
  }
  Shape shape(Record& r, std::string_view key, std::int64_t lo) const {
    const std::vector<std::int64_t> v = ints(r, key, lo, std::numeric_limits<std::int64_t>::max());
    if (v.size() > static_cast<std::size_t>(max_rank)) fail(r.line, "\"", key, "\" has more than ", max_rank, " entries");
    return Shape(v);
  }
  DType dtype(Record& r, std::string_view key) const {
    const std::string& s = text(r, key);
    for (int d = 0; d < num_dtypes; ++d)
      if (s == name(static_cast<DType>(d))) return static_cast<DType>(d);
    fail(r.line, "unknown dtype \"", s, "\"");
  }
  Device device(Record& r) const {
    const std::string& s = text(r, "device");
    if (s == "cpu") return Device::cpu();
    if (s.rfind("cuda:", 0) == 0) return Device::cuda(static_cast<int>(parse_int(r, "device", std::string_view(s).substr(5), 0, 32767)));
    fail(r.line, "unknown device \"", s, "\"");
  }
  /// A value's shape and dtype: dims >= 0 and a byte size that fits in int64.
  Shape value_shape(Record& r, DType d) const {
    Shape s = shape(r, "shape", 0);
    std::uint64_t bytes = 0;
    if (!stagecraft::detail::safetensors::checked_nbytes(s, d, bytes)) fail(r.line, "shape ", s, " is too large");
    return s;
  }
  void expect_id(Record& r, std::size_t want) const {
    if (integer(r, "id", 0, std::numeric_limits<std::int32_t>::max()) != static_cast<std::int64_t>(want))
      fail(r.line, "\"", r.kind, "\" id ", text(r, "id"), " is out of order (expected ", want, ")");
  }
  void finish(const Record& r) const {
    for (std::size_t k = 0; k < r.fields.size(); ++k)
      if (!r.used[k]) fail(r.line, "unknown field \"", r.fields[k].first, "\" in a \"", r.kind, "\" line");
  }

  /// A saved tensor, moved to `dev`; it must have the given shape and dtype.
  Tensor tensor(Record& r, const Shape& s, DType d, Device dev) {
    const std::string& key = text(r, "tensor");
    auto it = tensors_.find(key);
    if (it == tensors_.end()) fail(r.line, "tensor \"", key, "\" is missing from the file");
    used_tensors_.insert(key);
    const Tensor& t = it->second;
    if (t.shape() != s || t.dtype() != d)
      fail(r.line, "tensor \"", key, "\" is ", name(t.dtype()), t.shape(), ", the graph expects ", name(d), s);
    if (dev.is_cpu()) return t;
    try {
      return stagecraft::detail::device_copy(t, dev, "load", std::source_location::current());
    } catch (const Error& e) {
      fail(r.line, "tensor \"", key, "\" cannot be placed on ", dev.str(), ": ", e.what());
    }
  }

  void read_var(Record& r) {
    expect_id(r, vars_.size());
    auto v = std::make_shared<stagecraft::detail::VariableState>();
    v->name = text(r, "name");
    v->trainable = integer(r, "trainable", 0, 1) != 0;
    const DType d = dtype(r, "dtype");
    const Shape s = value_shape(r, d);
    v->set(tensor(r, s, d, device(r)));
    finish(r);
    vars_.push_back(std::move(v));
  }

  Graph read_graph(Record& r, int depth) {
    if (r.kind != "graph") fail(r.line, "expected a graph line, found \"", r.kind, "\"");
    if (depth >= max_depth) fail(r.line, "bodies nest more than ", max_depth, " deep");
    Graph g;
    g.strings = strings_;
    g.name = text(r, "name");
    const auto room = static_cast<std::int64_t>(lines_.size() - pos_);  // each value and node takes a line
    const auto nv = static_cast<std::size_t>(integer(r, "values", 0, std::min<std::int64_t>(room, INT32_MAX)));
    const auto nn = static_cast<std::size_t>(integer(r, "nodes", 0, std::min<std::int64_t>(room, INT32_MAX)));
    g.inputs = ids(r, "inputs", nv);
    g.outputs = ids(r, "outputs", nv);
    finish(r);
    g.values.reserve(nv);
    for (std::size_t v = 0; v < nv; ++v) {
      Record x = next("a value line");
      if (x.kind != "value") fail(x.line, "expected a value line, found \"", x.kind, "\"");
      expect_id(x, v);
      Value val;
      val.dtype = dtype(x, "dtype");
      val.shape = value_shape(x, val.dtype);
      val.device = device(x);
      finish(x);
      g.values.push_back(val);
    }
    for (std::size_t i = 0; i < nn; ++i) {
      Record x = next("a node line");
      if (x.kind != "node") fail(x.line, "expected a node line, found \"", x.kind, "\"");
      g.nodes.push_back(read_node(x, g, i, depth));
    }
    for (std::size_t v = 0; v < nv; ++v)
      if (g.values[v].node < 0) corrupt("in graph '", g.name, "', value %", v, " is defined by no node");
    Record e = next("the graph's end");
    if (e.kind != "end" || !e.fields.empty()) fail(e.line, "expected \"end\" after the nodes of graph '", g.name, "'");
    return g;
  }

  Node read_node(Record& r, Graph& g, std::size_t i, int depth) {
    expect_id(r, i);
    Node n;
    const std::string& kind = text(r, "kind");
    int k = 0;
    constexpr int last = static_cast<int>(NodeKind::custom_gradient);
    while (k <= last && kind != kind_name(static_cast<NodeKind>(k))) ++k;
    if (k > last) fail(r.line, "unknown node kind \"", kind, "\"");
    n.kind = static_cast<NodeKind>(k);
    if (n.kind == NodeKind::host_fn) fail(r.line, "a host_fn node cannot be loaded (it holds C++ code)");
    n.inputs = ids(r, "in", g.values.size());
    n.outputs = ids(r, "out", g.values.size());
    for (int v : n.outputs) {
      if (g.values[v].node >= 0) fail(r.line, "value %", v, " is defined twice (nodes ", g.values[v].node, " and ", i, ")");
      g.values[v].node = static_cast<int>(i);
    }
    if (n.kind == NodeKind::op) {
      const std::string& op = text(r, "op");
      const ops::OpInfo* info = ops::find_op(op);
      if (!info) fail(r.line, "unknown op \"", op, "\" (not in this build's op list)");
      n.op = info->id;
    }
    if (n.kind == NodeKind::input) n.index = static_cast<int>(integer(r, "index", 0, INT32_MAX));
    if (n.kind == NodeKind::constant) {
      if (n.outputs.size() != 1) fail(r.line, "a constant has one output");
      const Value& v = g.values[n.outputs[0]];
      n.constant = tensor(r, v.shape, v.dtype, v.device);
    }
    if (n.kind == NodeKind::read_var || n.kind == NodeKind::assign_var) read_var_use(r, g, n);
    if (find(r, "loop_vars")) n.num_loop_vars = static_cast<int>(integer(r, "loop_vars", 0, INT32_MAX));
    read_attrs(r, n.attrs);
    if (const std::string* l = find(r, "loc")) {
      const std::size_t colon = l->find(':');
      if (colon == std::string::npos) fail(r.line, "\"loc\" is not file:line");
      const auto f = parse_int(r, "loc", std::string_view(*l).substr(0, colon), 0, static_cast<std::int64_t>(strings_->size()) - 1);
      n.loc.file = (*strings_)[static_cast<std::size_t>(f)]->c_str();
      n.loc.line = static_cast<std::uint32_t>(parse_int(r, "loc", std::string_view(*l).substr(colon + 1), 0, UINT32_MAX));
    }
    if (n.kind == NodeKind::custom_gradient) n.custom = unsaved_rule(n.loc);
    const std::int64_t nb = find(r, "bodies") ? integer(r, "bodies", 0, 2) : 0;
    finish(r);
    for (std::int64_t b = 0; b < nb; ++b) {
      Record x = next("a body's graph line");
      n.bodies.push_back(std::make_shared<const Graph>(read_graph(x, depth + 1)));
    }
    // Traces make bool predicates; the verifier checks the rest of cond and while nodes.
    const bool cond_pred = n.kind == NodeKind::cond && !n.inputs.empty() && g.values[n.inputs[0]].dtype != DType::b8;
    const bool while_pred = n.kind == NodeKind::while_loop && nb > 0 && n.bodies[0]->outputs.size() == 1 &&
                            n.bodies[0]->values[n.bodies[0]->outputs[0]].dtype != DType::b8;
    if (cond_pred || while_pred) fail(r.line, "the ", kind, " node's predicate is not bool");
    return n;
  }

  /// A loaded custom_gradient node's rule: the user's rule is C++ code, which a file cannot hold,
  /// so running the gradient through it is an error naming the line that called custom_gradient.
  /// The error comes from a host_fn of the output gradients, so it is raised when the gradient
  /// runs, also where the gradient was staged ahead (a single tape stages a call's backward half
  /// at the call).
  static std::shared_ptr<const stagecraft::detail::CustomRule> unsaved_rule(const SrcLoc& at) {
    auto rule = std::make_shared<stagecraft::detail::CustomRule>();
    rule->backward = [file = std::string(at.file != nullptr ? at.file : ""), line = at.line](
                         const std::vector<Tensor>& grads, const std::vector<Tensor>& xs, const std::vector<Tensor>&) {
      auto refuse = [file, line](const std::vector<Tensor>&) -> std::vector<Tensor> {
        stagecraft::detail::fail_at<StagingError>("custom_gradient", file.c_str(), line,
                                                  "this call's gradient rule is C++ code, which a saved function does "
                                                  "not keep: differentiate the function in the program that defines it");
      };
      std::vector<Tensor> given;
      for (const Tensor& g : grads)
        if (g.defined()) given.push_back(g);
      auto h = std::make_shared<graph::HostFn>();
      h->fn = refuse;
      h->pure = true;  // (dropped where no gradient through it is wanted)
      for (const Tensor& x : xs) h->outputs.push_back({x.shape(), x.dtype()});
      std::vector<Tensor> gs = graph::detail_host::call(h, given, std::source_location::current());
      for (std::size_t k = 0; k < xs.size(); ++k)
        if (!is_floating(xs[k].dtype())) gs[k] = Tensor();
      return gs;
    };
    return rule;
  }

  /// read_var/assign_var: the variable, whose saved value must have the type the node moves.
  void read_var_use(Record& r, const Graph& g, Node& n) {
    n.var = vars_[static_cast<std::size_t>(integer(r, "var", 0, static_cast<std::int64_t>(vars_.size()) - 1))];
    const bool read = n.kind == NodeKind::read_var;
    const std::vector<int>& vs = read ? n.outputs : n.inputs;
    if (vs.size() != 1) fail(r.line, read ? "a read_var has one output" : "an assign_var has one input");
    const Value& v = g.values[vs[0]];
    const Tensor t = n.var->get();
    if (v.shape != t.shape() || v.dtype != t.dtype())
      fail(r.line, "variable '", n.var->name, "' is ", name(t.dtype()), t.shape(), ", the node ",
           read ? "reads " : "assigns ", name(v.dtype), v.shape);
  }

  void read_attrs(Record& r, ops::Attrs& a) const {
    constexpr std::int64_t lo = std::numeric_limits<std::int64_t>::min(), hi = std::numeric_limits<std::int64_t>::max();
    if (find(r, "ints")) a.ints = shape(r, "ints", lo);
    if (find(r, "ints2")) a.ints2 = shape(r, "ints2", lo);
    if (find(r, "axis")) a.axis = integer(r, "axis", lo, hi);
    if (find(r, "i0")) a.i0 = integer(r, "i0", lo, hi);
    if (find(r, "i1")) a.i1 = integer(r, "i1", lo, hi);
    if (find(r, "i2")) a.i2 = integer(r, "i2", lo, hi);
    if (find(r, "scalar")) a.scalar = real(r, "scalar");
    if (find(r, "scalar2")) a.scalar2 = real(r, "scalar2");
    if (find(r, "dtype")) a.dtype = dtype(r, "dtype");
    if (find(r, "flag")) a.flag = integer(r, "flag", 0, 1) != 0;
  }
  double real(Record& r, std::string_view key) const {
    const std::string& s = text(r, key);
    double x = 0;
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
    if (ec != std::errc{} || p != s.data() + s.size() || s.empty()) fail(r.line, "\"", key, "\" is not a number: ", s);
    return x;
  }

  const std::string& file_;
  std::map<std::string, Tensor>& tensors_;
  std::source_location loc_;
  std::shared_ptr<std::vector<std::unique_ptr<std::string>>> strings_;
  std::vector<std::string_view> lines_;
  std::size_t pos_ = 0;
  std::vector<std::shared_ptr<stagecraft::detail::VariableState>> vars_;
  std::set<std::string> used_tensors_;
};

/// The graph text of a file's metadata, once its format and version are checked.
STAGECRAFT_COMPILED_INLINE const std::string& graph_text(const std::map<std::string, std::string>& metadata,
                                                         const std::string& path, const std::source_location& loc);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE const std::string& graph_text(const std::map<std::string, std::string>& metadata,
                                                         const std::string& path, const std::source_location& loc) {
  const auto fail = [&](const auto&... parts) {
    stagecraft::detail::fail<IOError>("load_function", loc, "'", path, "' ", parts...);
  };
  const auto format = metadata.find("format"), version = metadata.find("version"), text = metadata.find("graph");
  if (format == metadata.end()) fail("is not a saved function (its metadata has no \"format\")");
  if (format->second != function_format)
    fail("is not a saved function (format \"", format->second, "\", expected \"", function_format, "\")");
  if (version == metadata.end()) fail("is corrupt: its metadata has no \"version\"");
  if (version->second != std::to_string(function_format_version))
    fail("has format version ", version->second, "; this build reads version ", function_format_version);
  if (text == metadata.end()) fail("is corrupt: its metadata has no \"graph\"");
  return text->second;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace graph::detail_ser

/// Reads a function written by ConcreteFunction::save; it runs without the code that made it and
/// owns fresh copies of the saved variables (see function_variables). A missing, truncated,
/// corrupt, wrong-format or wrong-version file is an IOError naming the file and what is wrong.
STAGECRAFT_COMPILED_INLINE ConcreteFunction load_function(const std::string& path,
                                                          std::source_location loc = std::source_location::current());

/// The variables a concrete function reads or assigns (a loaded function's own copies), in
/// order of first use, bodies included.
STAGECRAFT_COMPILED_INLINE std::vector<Variable> function_variables(const ConcreteFunction& cf);
#if STAGECRAFT_DEFINE_COMPILED
/// Writes the optimized graph, its constants and the current values of the variables it reads
/// to one safetensors file (metadata: format "stagecraft.function", version, the graph text).
/// Atomic: a failed save leaves an existing file untouched. A graph holding a host_fn cannot
/// be saved (StagingError naming the node's line).
STAGECRAFT_COMPILED_INLINE void ConcreteFunction::save(const std::string& path, std::source_location loc) const {
  if (!impl_) stagecraft::detail::fail<ValueError>("save", loc, "the ConcreteFunction is empty (default-constructed)");
  graph::detail_ser::Writer w(loc);
  const std::string text = w.text(graph());
  const std::map<std::string, std::string> metadata{{"format", std::string(function_format)},
                                                    {"version", std::to_string(function_format_version)},
                                                    {"graph", text}};
  stagecraft::detail::safetensors::save(path, w.tensors, metadata, "save", loc);
}

STAGECRAFT_COMPILED_INLINE ConcreteFunction load_function(const std::string& path, std::source_location loc) {
  SafetensorsFile f = stagecraft::detail::safetensors::load(path, "load_function", loc);
  const std::string& text = graph::detail_ser::graph_text(f.metadata, path, loc);
  graph::detail_ser::Reader reader(text, path, f.tensors, loc);
  try {
    auto g = std::make_shared<const graph::Graph>(reader.read());
    graph::verify(*g, "load_function");
    return ConcreteFunction(std::move(g), /*optimize=*/false);
  } catch (const IOError&) {
    throw;
  } catch (const Error& e) {  // the verifier, or an op rejecting the graph's shapes while lowering
    std::string_view what = e.what();
    if (constexpr std::string_view v = "[verify] after load_function: "; what.starts_with(v)) what.remove_prefix(v.size());
    reader.corrupt("the graph is invalid: ", what);
  }
}

STAGECRAFT_COMPILED_INLINE std::vector<Variable> function_variables(const ConcreteFunction& cf) {
  std::vector<Variable> out;
  std::set<const void*> seen;
  const auto walk = [&](const auto& self, const graph::Graph& g) -> void {
    for (const graph::Node& n : g.nodes) {
      if (n.var && seen.insert(n.var.get()).second) out.push_back(Variable::from_state(n.var));
      for (const auto& b : n.bodies) self(self, *b);
    }
  };
  if (cf.defined()) walk(walk, cf.graph());
  return out;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft
