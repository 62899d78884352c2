// Saved functions: save/load round trips (bitwise equal results, equal printed graphs, variables
// copied and owned by the loaded function), and every way a file can be wrong (IOError, no crash).
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>
#include <stagecraft/graph/function.hpp>
#if __has_include(<stagecraft/graph/control_flow.hpp>)
#include <stagecraft/graph/control_flow.hpp>
#define SC_TEST_CONTROL_FLOW 1
#endif

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include "files.hpp"
#include "testing.hpp"

namespace fs = std::filesystem;

namespace {

using sctest::error_of;

using sctest::read_bytes;
using sctest::TempDir;
using sctest::write_bytes;

/// Same shape, dtype and bytes.
void check_bitwise(const sc::Tensor& a, const sc::Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  REQUIRE(a.dtype() == b.dtype());
  CHECK(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

/// Saves cf, loads it back and checks: same printed graph, bitwise-equal results on args.
sc::ConcreteFunction round_trip(const sc::ConcreteFunction& cf, const std::vector<sc::Tensor>& args, const TempDir& dir) {
  const std::string path = dir / "f.scg";
  cf.save(path);
  sc::ConcreteFunction g = sc::load_function(path);
  CHECK(g.graph().str() == cf.graph().str());
  const std::vector<sc::Tensor> want = cf.call(args), got = g.call(args);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) check_bitwise(got[i], want[i]);
  // Saving the loaded function gives the same bytes.
  g.save(dir / "again.scg");
  CHECK(read_bytes(dir / "again.scg") == read_bytes(path));
  return g;
}

/// A small function with a variable and a constant, saved to dir/name.
sc::ConcreteFunction small_function() {
  static sc::Variable w(sc::tensor({{0.5f, -1.f}, {2.f, 0.25f}, {1.5f, -0.5f}}), "dense/w");
  auto f = sc::function([](sc::Tensor x) { return sc::tanh(sc::matmul(x, w)) + sc::tensor({1.f, 2.f}); }, "small");
  return f.get_concrete(sc::ones({4, 3}));
}

/// The file's tensors and metadata, after `edit`, written back as a safetensors file.
template <class Edit>
void rewrite(const std::string& path, Edit edit) {
  sc::SafetensorsFile f = sc::load_safetensors(path);
  edit(f);
  std::vector<std::pair<std::string, sc::Tensor>> ts(f.tensors.begin(), f.tensors.end());
  sc::save_safetensors(path, ts, f.metadata);
}
void replace_in_graph(const std::string& path, const std::string& from, const std::string& to) {
  rewrite(path, [&](sc::SafetensorsFile& f) {
    std::string& g = f.metadata.at("graph");
    const auto at = g.find(from);
    REQUIRE(at != std::string::npos);
    g.replace(at, from.size(), to);
  });
}
std::string load_error(const std::string& path) {
  return error_of<sc::IOError>([&] { sc::load_function(path); });
}

}  // namespace

TEST_CASE("save/load: elementwise functions with constants and several results", "[serialize]") {
  TempDir dir("sc_ser");
  const sc::Tensor c = sc::tensor({{1.f, -2.f, 3.f}, {0.5f, 0.f, -0.25f}});
  auto f = sc::function([&](sc::Tensor x, sc::Tensor y) {
    return std::make_tuple(sc::tanh(x * y) + 2.f * x - sc::exp(-y) / (1.f + sc::abs(x)), sc::sqrt(sc::abs(x * c)) - 0.f);
  });
  const sc::Tensor x = sc::random::normal({2, 3}, 1), y = sc::random::normal({2, 3}, 2);
  sc::ConcreteFunction g = round_trip(f.get_concrete(x, y), {x, y}, dir);
  CHECK(g.input_specs() == f.get_concrete(x, y).input_specs());
  // Source lines survive: the printed graph names this file.
  CHECK_THAT(g.graph().str(), Catch::Contains("test_serialize.cpp:"));
  auto [a, b] = f(x, y);
  check_bitwise(g(x, y)[0], a);
  check_bitwise(g(x, y)[1], b);
  // a call that does not match the saved signature names the caller's line
  const int call_line = __LINE__ + 1;
  const auto bad_call = [&] { return g(x, sc::ones({3, 2})); };
  CHECK_THROWS_WITH(bad_call(), Catch::Contains("argument 1") &&
                                    Catch::Contains("test_serialize.cpp:" + std::to_string(call_line)));
  // Other dtypes, and integer/bool values inside.
  auto h = sc::function([](sc::Tensor a1, sc::Tensor k1) {
    return sc::where(a1 > 0.0, a1 * 3.0, sc::cast(k1, sc::f64)) + sc::cast(k1 * std::int64_t{2} < std::int64_t{3}, sc::f64);
  });
  const sc::Tensor xd = sc::random::normal({5}, 3).astype(sc::f64), k = sc::arange(5);
  round_trip(h.get_concrete(xd, k), {xd, k}, dir);
}

TEST_CASE("save/load: matmul, reductions, layout and conv graphs", "[serialize]") {
  TempDir dir("sc_ser");
  auto dense = sc::function([](sc::Tensor a, sc::Tensor b) {
    const sc::Tensor h = sc::relu(sc::matmul(sc::reshape(a, {8, 3}), b));
    return std::make_tuple(sc::sum(h, {1}, true), sc::mean(h), sc::max(sc::transpose(h), {0}), sc::argmax(h, 1),
                           sc::nn::softmax(h, -1), sc::logsumexp(h, {0}));
  });
  const sc::Tensor x = sc::random::normal({4, 6}, 4), w = sc::random::normal({3, 5}, 5);
  round_trip(dense.get_concrete(x, w), {x, w}, dir);

  auto conv = sc::function([](sc::Tensor a, sc::Tensor b) {
    const sc::Tensor y = sc::nn::max_pool2d(sc::relu(sc::nn::conv2d(a, b, 1, 1)), 2, 2);
    const sc::Tensor z = sc::nn::avg_pool2d(sc::nn::conv2d(a, b, 2, 0), 1, 1);
    return std::make_tuple(y, z, sc::concat({sc::slice(y, {0, 1, 0, 0}, {-1, 2, -1, -1}), y}, 1),
                           sc::gather(y, sc::tensor({std::int64_t{1}, std::int64_t{0}}), 1));
  });
  const sc::Tensor xi = sc::random::normal({2, 3, 8, 8}, 6), wi = sc::random::normal({4, 3, 3, 3}, 7);
  round_trip(conv.get_concrete(xi, wi), {xi, wi}, dir);
}

TEST_CASE("save/load: variables are saved by value and owned by the loaded function", "[serialize][variables]") {
  TempDir dir("sc_ser");
  sc::Variable w(sc::random::normal({3, 2}, 8), "w"), b(sc::tensor({0.5f, -0.5f}), "b", /*trainable=*/false);
  sc::Variable w2(sc::ones({3, 2}), "w");  // the same name twice: the file keeps both
  auto f = sc::function([&](sc::Tensor x) {
    const sc::Tensor h = sc::matmul(x, w);
    const sc::Tensor hb = h + b;
    return hb - sc::sum(w2.value());
  });
  const sc::Tensor x = sc::random::normal({4, 3}, 9);
  const sc::Tensor before = f(x);
  sc::ConcreteFunction g = round_trip(f.get_concrete(x), {x}, dir);

  const std::vector<sc::Variable> vs = sc::function_variables(g);
  REQUIRE(vs.size() == 3);
  CHECK(vs[0].name() == "w");
  CHECK(vs[1].name() == "b");
  CHECK(vs[2].name() == "w");
  CHECK(vs[0].trainable());
  CHECK_FALSE(vs[1].trainable());
  check_bitwise(vs[0].value(), w.value());
  CHECK_FALSE(vs[0].same(w));
  CHECK(sc::load_safetensors(dir / "f.scg").tensors.count("w~1") == 1);

  // Changing the original's variables changes the original only, and the other way round.
  w.assign(sc::zeros({3, 2}));
  check_bitwise(g(x), before);
  CHECK_FALSE(std::memcmp(f(x).raw_data(), before.raw_data(), before.nbytes()) == 0);
  sc::Variable lw = vs[0];
  lw.assign(sc::zeros({3, 2}));
  check_bitwise(g(x), f(x));
}

TEST_CASE("save/load: a function that assigns variables updates its own state", "[serialize][variables]") {
  TempDir dir("sc_ser");
  sc::Variable total(sc::zeros({2}), "total", false), calls(sc::scalar(std::int64_t{0}), "calls", false);
  auto f = sc::function([&](sc::Tensor x) {
    total.assign_add(x);
    calls.assign_add(sc::scalar(std::int64_t{1}));
    return total.value() * 2.f;
  });
  const sc::Tensor x = sc::tensor({1.f, -3.f});
  sc::ConcreteFunction cf = f.get_concrete(x);
  cf.save(dir / "f.scg");
  sc::ConcreteFunction g = sc::load_function(dir / "f.scg");
  CHECK(g.graph().str() == cf.graph().str());
  for (int k = 1; k <= 3; ++k) check_bitwise(g(x), sc::tensor({2.f * k, -6.f * k}));
  const std::vector<sc::Variable> vs = sc::function_variables(g);
  REQUIRE(vs.size() == 2);
  check_bitwise(vs[0].value(), sc::tensor({3.f, -9.f}));
  CHECK(vs[1].value().item<std::int64_t>() == 3);
  check_bitwise(total.value(), sc::zeros({2}));  // the original is untouched
  CHECK(calls.value().item<std::int64_t>() == 0);
}

#ifdef SC_TEST_CONTROL_FLOW
TEST_CASE("save/load: cond and while_loop bodies", "[serialize][control]") {
  TempDir dir("sc_ser");
  sc::Variable scale(sc::full({3}, 1.5f), "scale");
  auto f = sc::function([&](sc::Tensor x) {
    const sc::Tensor y = sc::cond(sc::sum(x) > 0.f, [&] { return sc::tanh(x) * scale; }, [&] { return x * x - 1.f; });
    auto [v, n] = sc::while_loop([](sc::Tensor a, sc::Tensor) { return sc::sum(sc::abs(a)) > 1.f; },
                                 [](sc::Tensor a, sc::Tensor k) { return std::make_tuple(a * 0.5f, k + std::int64_t{1}); },
                                 std::make_tuple(y * 4.f, sc::scalar(std::int64_t{0})));
    return std::make_tuple(y, v, n);
  });
  const sc::Tensor pos = sc::tensor({0.5f, 1.f, -0.2f}), neg = sc::tensor({-0.5f, -1.f, 0.2f});
  sc::ConcreteFunction g = round_trip(f.get_concrete(pos), {pos}, dir);
  for (const sc::Tensor& x : {pos, neg}) {
    auto [y, v, n] = f(x);
    check_bitwise(g(x)[0], y);
    check_bitwise(g(x)[1], v);
    check_bitwise(g(x)[2], n);
  }
  CHECK_THAT(g.graph().str(), Catch::Contains("cond(") && Catch::Contains("while("));
}
#endif

TEST_CASE("save: a host_fn cannot be saved, empty functions neither", "[serialize][errors]") {
  TempDir dir("sc_ser");
  auto g = std::make_shared<sc::graph::Graph>();
  sc::graph::Node in;
  in.kind = sc::graph::NodeKind::input;
  g->inputs.push_back(g->out(g->add_node(in, {sc::TensorSpec{{2}, sc::f32}})));
  sc::graph::Node h;
  h.kind = sc::graph::NodeKind::host_fn;
  h.inputs = {0};
  h.loc = sc::graph::SrcLoc::from(std::source_location::current());
  const unsigned line = h.loc.line;
  auto host = std::make_shared<sc::graph::HostFn>();
  host->outputs = {sc::TensorSpec{{2}, sc::f32}};
  host->fn = [](const std::vector<sc::Tensor>& a) { return a; };
  h.host = host;
  g->outputs.push_back(g->out(g->add_node(h, h.host->outputs)));
  sc::ConcreteFunction cf(g, false);
  write_bytes(dir / "f.scg", "old");
  const std::string m = error_of<sc::StagingError>([&] { cf.save(dir / "f.scg"); });
  CHECK_THAT(m, Catch::StartsWith("[save]") && Catch::Contains("host_fn") && Catch::Contains("cannot be saved") &&
                    Catch::Contains("test_serialize.cpp:" + std::to_string(line)));
  CHECK(read_bytes(dir / "f.scg") == "old");
  CHECK(dir.files() == std::vector<std::string>{"f.scg"});
  CHECK_THAT(error_of<sc::ValueError>([&] { sc::ConcreteFunction().save(dir / "e.scg"); }), Catch::Contains("empty"));
}

TEST_CASE("save is atomic", "[serialize][errors]") {
  TempDir dir("sc_ser");
  const sc::ConcreteFunction cf = small_function();
  // Into a missing directory: IOError, nothing created.
  const std::string m = error_of<sc::IOError>([&] { cf.save(dir / "no/such/dir/f.scg"); });
  CHECK_THAT(m, Catch::StartsWith("[save]") && Catch::Contains("no/such/dir/f.scg"));
  CHECK(dir.files().empty());
  // A failure in the middle of the write leaves the existing file untouched and no temporary file.
  cf.save(dir / "f.scg");
  const std::string good = read_bytes(dir / "f.scg");
  sc::detail::safetensors::write_hook = [](std::uint64_t n) {
    if (n > 8) throw std::runtime_error("disk full");
  };
  const std::string m2 = error_of<sc::IOError>([&] { cf.save(dir / "f.scg"); });
  sc::detail::safetensors::write_hook = nullptr;
  CHECK_THAT(m2, Catch::Contains("disk full"));
  CHECK(read_bytes(dir / "f.scg") == good);
  CHECK(dir.files() == std::vector<std::string>{"f.scg"});
}

TEST_CASE("load: missing, truncated and byte-flipped files are IOErrors", "[serialize][errors]") {
  TempDir dir("sc_ser");
  const std::string path = dir / "f.scg";
  CHECK_THAT(load_error(path), Catch::StartsWith("[load_function]") && Catch::Contains("no such file"));
  small_function().save(path);
  const std::string good = read_bytes(path);
  const sc::Tensor x = sc::random::normal({4, 3}, 10);
  const sc::Tensor want = small_function()(x);

  for (std::size_t len : {std::size_t{0}, std::size_t{5}, std::size_t{8}, std::size_t{40}, good.size() / 2,
                          good.size() - 8, good.size() - 1}) {
    INFO("truncated to " << len << " bytes");
    write_bytes(path, good.substr(0, len));
    CHECK_THAT(load_error(path), Catch::Contains(path) && Catch::Contains("corrupt"));
  }
  // Every byte of the header flipped in turn: the load fails with an IOError or, where the
  // flip leaves a valid file (inside a file name, say), gives a function that runs.
  std::uint64_t header = 0;
  for (int k = 7; k >= 0; --k) header = (header << 8) | static_cast<unsigned char>(good[k]);
  int failed = 0, loaded = 0;
  for (std::size_t at = 0; at < 8 + header; ++at) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ (at % 2 ? 0x01 : 0x20));
    write_bytes(path, bad);
    INFO("byte " << at << " flipped: " << bad.substr(0, std::min<std::size_t>(bad.size(), 8 + header)));
    try {
      sc::ConcreteFunction g = sc::load_function(path);
      ++loaded;
      try {
        (void)g(x);
      } catch (const sc::Error&) {  // a valid file of another function: its own errors are fine
      }
    } catch (const sc::IOError& e) {
      ++failed;
      CHECK_THAT(e.what(), Catch::Contains(path));
    }
  }
  CHECK(failed > loaded);
  write_bytes(path, good);
  check_bitwise(sc::load_function(path)(x), want);
}

TEST_CASE("load: wrong format, wrong version and bad graph text are IOErrors", "[serialize][errors]") {
  TempDir dir("sc_ser");
  const std::string path = dir / "f.scg";
  const auto fresh = [&] { small_function().save(path); };
  const auto check = [&](const std::string& fragment) {
    const std::string m = load_error(path);
    CHECK_THAT(m, Catch::StartsWith("[load_function] '" + path + "'") && Catch::Contains(fragment));
  };
  SECTION("a checkpoint is not a saved function") {
    sc::Variable v(sc::ones({2}), "v");
    sc::Checkpoint ck;
    ck.track("v", v);
    ck.save(path);
    check("is not a saved function (format \"stagecraft.checkpoint\"");
  }
  SECTION("no format") {
    sc::save_safetensors(path, {{"x", sc::ones({2})}});
    check("is not a saved function");
  }
  SECTION("version 999") {
    fresh();
    rewrite(path, [](sc::SafetensorsFile& f) { f.metadata["version"] = "999"; });
    check("has format version 999; this build reads version 1");
  }
  SECTION("no graph") {
    fresh();
    rewrite(path, [](sc::SafetensorsFile& f) { f.metadata.erase("graph"); });
    check("no \"graph\"");
  }
  SECTION("unknown op") {
    fresh();
    replace_in_graph(path, "op=tanh", "op=frobnicate");
    check("unknown op \"frobnicate\"");
  }
  SECTION("missing tensor") {
    fresh();
    rewrite(path, [](sc::SafetensorsFile& f) { f.tensors.erase("dense/w"); });
    check("tensor \"dense/w\" is missing");
  }
  SECTION("unused tensor") {
    fresh();
    rewrite(path, [](sc::SafetensorsFile& f) { f.tensors.emplace("extra", sc::ones({1})); });
    check("tensor \"extra\" is not used");
  }
  SECTION("a tensor whose shape does not match") {
    fresh();
    rewrite(path, [](sc::SafetensorsFile& f) { f.tensors.at("dense/w") = sc::ones({2, 2}); });
    check("tensor \"dense/w\" is f32[2, 2], the graph expects f32[3, 2]");
  }
  SECTION("value id out of range") {
    fresh();
    replace_in_graph(path, "in=[0,1]", "in=[0,99]");
    check("out of range");
  }
  SECTION("a value defined twice") {
    fresh();
    replace_in_graph(path, "out=[1]", "out=[0]");
    check("defined twice");
  }
  SECTION("a value whose shape does not fit its op") {
    fresh();
    replace_in_graph(path, "value id=2 dtype=f32 shape=[4,2]", "value id=2 dtype=f32 shape=[4,5]");
    check("the graph is invalid");
  }
  SECTION("garbage text") {
    fresh();
    replace_in_graph(path, "graph name=", "grph name=");
    check("graph line");
    fresh();
    replace_in_graph(path, "end", "end extra=1");
    check("expected \"end\"");
    fresh();
    rewrite(path, [](sc::SafetensorsFile& f) { f.metadata["graph"] += "node id=9\n"; });
    check("unexpected text after the graph's end");
    fresh();
    replace_in_graph(path, "path=\"", "path=\"\\q");
    check("bad escape");
  }
}

TEST_CASE("save/load: the text is readable and stable", "[serialize]") {
  TempDir dir("sc_ser");
  small_function().save(dir / "f.scg");
  const sc::SafetensorsFile f = sc::load_safetensors(dir / "f.scg");
  CHECK(f.metadata.at("format") == "stagecraft.function");
  CHECK(f.metadata.at("version") == "1");
  const std::string& g = f.metadata.at("graph");
  CHECK_THAT(g, Catch::StartsWith("file id=0 path=\"") && Catch::Contains("test_serialize.cpp\"\n"));
  // This file's id: the `file id=K path="...test_serialize.cpp"` line.
  const std::size_t line = g.rfind("file id=", g.find("test_serialize.cpp\""));
  const std::string k = g.substr(line + 8, g.find(' ', line + 8) - line - 8);
  CHECK_THAT(g, Catch::Contains("var id=0 name=\"dense/w\" trainable=1 dtype=f32 shape=[3,2] device=cpu tensor=\"dense/w\"\n"));
  CHECK_THAT(g, Catch::Contains("graph name=\"small\" values="));
  CHECK_THAT(g, Catch::Contains(" kind=op op=matmul in=[0,1] out=[2] loc=" + k + ":"));
  CHECK(f.tensors.size() == 2);  // the variable and the constant
}

TEST_CASE("load: a to node copies on the host, and one naming no device is an IOError", "[serialize][errors]") {
  // Tracing never makes a copy from the CPU to the CPU (`to` its own device is the tensor itself),
  // so the node is written into the text: the plan runs the op's host copy.
  TempDir dir("sc_ser");
  const std::string path = dir / "f.scg";
  const sc::ConcreteFunction f = small_function();
  f.save(path);
  replace_in_graph(path, "op=tanh", "op=to");
  const sc::Tensor x = sc::ones({4, 3});
  const sc::ConcreteFunction g = sc::load_function(path);
  CHECK(g.graph().str().find("= to(") != std::string::npos);
  const sc::Tensor got = g.call({x})[0];  // tanh(x w) + c became to(x w) + c: a copy
  const sc::Tensor product = sc::matmul(x, sc::tensor({{0.5f, -1.f}, {2.f, 0.25f}, {1.5f, -0.5f}}));
  CHECK(got.to_vector<float>() == (product + sc::tensor({1.f, 2.f})).to_vector<float>());
  // Kind 7 is no device: the file is refused, naming the op.
  rewrite(path, [](sc::SafetensorsFile& file) {
    std::string& text = file.metadata.at("graph");
    const auto at = text.find('\n', text.find("op=to"));
    REQUIRE(at != std::string::npos);
    text.insert(at, " i0=7");
  });
  const std::string m = load_error(path);
  CHECK_THAT(m, Catch::StartsWith("[load_function] '" + path + "'") && Catch::Contains("[to] has no device of kind 7"));
}
