// Fuzz target: saved functions (sc::load_function, graph/serialize.hpp). The input is the graph's
// text, the part of a saved function a mutation of the whole file seldom reaches intact (the
// safetensors container around it has its own target, fuzz_safetensors): the harness writes it
// into a saved function's metadata beside the tensors its lines name (a `var` line's dtype and
// shape, a `const` node's value's), so that the reader gets past the container.
//
// A bad graph must be an IOError. A graph that loads must run: called on arguments of its input
// specs, and differentiated by a tape when it takes floats. A loaded graph passed the verifier,
// but its values can still fail an op's own run-time checks (a gather index out of range), so a
// call may raise any sc::Error; nothing else.
#include <charconv>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <stagecraft/stagecraft.hpp>

#include "harness.hpp"

namespace sc = stagecraft;

namespace {

/// The value of `key=` in a graph line (up to the next space), or empty.
std::string_view field(std::string_view line, std::string_view key) {
  for (std::size_t at = line.find(key); at != std::string_view::npos; at = line.find(key, at + 1)) {
    if (at > 0 && line[at - 1] != ' ') continue;
    std::string_view v = line.substr(at + key.size());
    return v.substr(0, v.find(' '));
  }
  return {};
}

/// A tensor of the dtype and shape of a line (`dtype=f32 shape=[3,2]`), of at most 4096 elements;
/// false when the line has none.
bool tensor_of(std::string_view dtype, std::string_view shape, std::uint64_t seed, sc::Tensor& out) {
  const std::map<std::string_view, sc::DType> dtypes = {
      {"b8", sc::boolean}, {"i32", sc::i32}, {"i64", sc::i64}, {"f32", sc::f32}, {"f64", sc::f64}};
  const auto d = dtypes.find(dtype);
  if (d == dtypes.end() || shape.size() < 2 || shape.front() != '[' || shape.back() != ']') return false;
  std::vector<std::int64_t> dims;
  std::int64_t n = 1;
  for (std::string_view rest = shape.substr(1, shape.size() - 2); !rest.empty();) {
    std::int64_t x = 0;
    const auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), x);
    if (ec != std::errc{} || x < 0 || x > 4096 || dims.size() == 8) return false;
    dims.push_back(x);
    n *= x;
    if (n > 4096) return false;
    rest.remove_prefix(static_cast<std::size_t>(p - rest.data()));
    if (!rest.empty() && rest.front() == ',') rest.remove_prefix(1);
    else if (!rest.empty()) return false;
  }
  const sc::Tensor u = sc::random::uniform(sc::Shape(dims), -1.0, 1.0, seed);
  out = d->second == sc::f32 || d->second == sc::f64 ? u.astype(d->second) : (u > 0.f).astype(d->second);
  return true;
}

/// The tensors the graph text names: `tensor="NAME"` on var lines (their own dtype and shape) and
/// const node lines (their output value's, in the graph they are in: a body's value ids are its
/// own). Names with escapes are left out.
std::vector<std::pair<std::string, sc::Tensor>> named_tensors(std::string_view text) {
  std::vector<std::map<std::string_view, std::string_view>> values(1);  // per open graph: value id -> line
  std::map<std::string, sc::Tensor> out;
  std::uint64_t seed = 1;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view l = text.substr(at, end - at);
    at = end + 1;
    const std::string_view kind = l.substr(l.find_first_not_of(' ') == std::string_view::npos ? l.size() : l.find_first_not_of(' '));
    if (kind.starts_with("graph ")) values.emplace_back();
    else if (kind == "end" && values.size() > 1) values.pop_back();
    else if (kind.starts_with("value ")) values.back()[field(l, "id=")] = l;
    std::string_view name = field(l, "tensor=");
    if (name.size() < 2 || name.front() != '"' || name.back() != '"' || name.find('\\') != std::string_view::npos) continue;
    name = name.substr(1, name.size() - 2);
    std::string_view typed = l;
    if (field(l, "dtype=").empty()) {  // a const node: its output value's line
      const std::string_view o = field(l, "out=");
      if (o.size() < 3) continue;
      const auto v = values.back().find(o.substr(1, o.size() - 2));
      if (v == values.back().end()) continue;
      typed = v->second;
    }
    sc::Tensor t;
    if (tensor_of(field(typed, "dtype="), field(typed, "shape="), seed++, t)) out.emplace(std::string(name), t);
  }
  return {out.begin(), out.end()};
}

/// Arguments of the given specs (floats in [-1, 1], bools, 0/1 integers: valid indices for a
/// gather); false when they are too large to make (the call is skipped).
bool make_args(const std::vector<sc::TensorSpec>& specs, std::vector<sc::Tensor>& args) {
  std::int64_t total = 0;
  for (const sc::TensorSpec& s : specs) {
    total += s.shape.numel();
    if (s.shape.numel() > (1 << 16) || total > (1 << 18)) return false;
  }
  std::uint64_t seed = 100;
  for (const sc::TensorSpec& s : specs) {
    const sc::Tensor u = sc::random::uniform(s.shape, -1.0, 1.0, seed++);
    args.push_back(s.dtype == sc::f32 || s.dtype == sc::f64 ? u.astype(s.dtype) : (u > 0.f).astype(s.dtype));
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string path = scfuzz::scratch_file(nullptr, 0, ".stagecraft");
  try {  // (text the container cannot hold, such as bytes that are not UTF-8, is not a graph)
    sc::save_safetensors(path, named_tensors(text),
                         {{"format", std::string(sc::function_format)},
                          {"version", std::to_string(sc::function_format_version)},
                          {"graph", text}});
  } catch (const sc::Error&) {
    return 0;
  }
  sc::ConcreteFunction f;
  scfuzz::expect_only_ioerror("load_function", [&] { f = sc::load_function(path); });
  if (!f.defined()) return 0;
  std::vector<sc::Tensor> args;
  if (!make_args(f.input_specs(), args)) return 0;
  scfuzz::expect_only<sc::Error>("calling a loaded function", "sc::Error", [&] {
    for (const sc::Tensor& t : f.call(args)) (void)sc::sum(t.astype(sc::f64)).item<double>();  // reads every element
  });
  std::vector<sc::Tensor> floats;
  for (const sc::Tensor& a : args)
    if (a.dtype() == sc::f32 || a.dtype() == sc::f64) floats.push_back(a);
  if (floats.empty()) return 0;
  scfuzz::expect_only<sc::Error>("differentiating a loaded function", "sc::Error", [&] {
    sc::GradientTape tape;
    for (const sc::Tensor& a : floats) tape.watch(a);
    sc::Tensor loss = sc::zeros({}, sc::f64);
    for (const sc::Tensor& t : f.call(args))
      if (t.dtype() == sc::f32 || t.dtype() == sc::f64) loss = loss + sc::sum(t.astype(sc::f64));
    for (const sc::Tensor& g : tape.gradient(loss, floats))
      if (g.defined()) (void)sc::sum(g.astype(sc::f64)).item<double>();
  });
  return 0;
}
