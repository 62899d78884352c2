// Writes the seed inputs of the fuzz targets: small valid files made by the library's writers
// (or by hand where it has none: IDX) and hand-made corrupt ones from the readers' test suites.
// Usage: fuzz_make_seeds OUT_DIR  (writes OUT_DIR/idx, OUT_DIR/safetensors, OUT_DIR/npy, OUT_DIR/function)
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <zlib.h>

#include <stagecraft/stagecraft.hpp>
#include <stagecraft/io/npy.hpp>
#include <stagecraft/state/safetensors.hpp>

namespace sc = stagecraft;
namespace fs = std::filesystem;

namespace {

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
std::string gzip(const std::string& bytes) {
  const std::string tmp = fs::temp_directory_path() / "stagecraft_seed.gz";
  gzFile f = gzopen(tmp.c_str(), "wb9");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
  std::string out = read(tmp);
  fs::remove(tmp);
  return out;
}

// ---- IDX: magic 00 00 type rank, big-endian u32 extents, payload ----
std::string idx(std::uint8_t type, const std::vector<std::uint32_t>& dims, std::size_t payload, char fill = '\x07') {
  std::string s = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (std::uint32_t d : dims)
    for (int k = 3; k >= 0; --k) s += static_cast<char>((d >> (8 * k)) & 0xff);
  return s + std::string(payload, fill);
}

void idx_seeds(const fs::path& dir) {
  write(dir / "u8_2x3", idx(0x08, {2, 3}, 6));
  write(dir / "u8_labels_5", idx(0x08, {5}, 5, '\x09'));
  write(dir / "u8_rank0", idx(0x08, {}, 1));
  write(dir / "u8_3x2x2.gz", gzip(idx(0x08, {3, 2, 2}, 12, '\xff')));
  write(dir / "u8_empty_0x5", idx(0x08, {0, 5}, 0));
  write(dir / "i8_4", idx(0x09, {4}, 4));
  write(dir / "i16_2x2", idx(0x0B, {2, 2}, 8));
  write(dir / "i32_3", idx(0x0C, {3}, 12));
  write(dir / "f32_2", idx(0x0D, {2}, 8));
  write(dir / "f64_1x1", idx(0x0E, {1, 1}, 8));
  // corrupt
  write(dir / "bad_magic", std::string("\x01\x00\x08\x01\x00\x00\x00\x01\x05", 9));
  write(dir / "bad_type", idx(0x0A, {1}, 1));
  write(dir / "bad_rank9", idx(0x08, {1, 1, 1, 1, 1, 1, 1, 1, 1}, 1));
  write(dir / "truncated_header", idx(0x08, {2, 3}, 0).substr(0, 9));
  write(dir / "short_payload", idx(0x08, {2, 3}, 5));
  write(dir / "long_payload", idx(0x08, {2, 3}, 7));
  write(dir / "wrapping_extents", idx(0x08, {32, 3, 2833, 37171, 1824726041u}, 16));
  write(dir / "huge_empty", idx(0x08, {0, 0xffffffffu, 0xffffffffu, 0xffffffffu}, 0));
  write(dir / "truncated.gz", gzip(idx(0x08, {4, 4}, 16)).substr(0, 30));
}

// ---- safetensors ----
std::string u64le(std::uint64_t v) {
  std::string s(8, '\0');
  for (int k = 0; k < 8; ++k) s[static_cast<std::size_t>(k)] = static_cast<char>((v >> (8 * k)) & 0xff);
  return s;
}
std::string st(const std::string& header, const std::string& data) { return u64le(header.size()) + header + data; }

void safetensors_seeds(const fs::path& dir) {
  sc::save_safetensors(dir / "every_dtype",
                       {{"f32", sc::tensor({1.f, 2.f, 3.f})},
                        {"f64", sc::tensor(std::vector<double>{1.5, -2}, sc::Shape{2, 1})},
                        {"i32", sc::tensor(std::vector<std::int32_t>{7}, sc::Shape{1, 1, 1})},
                        {"i64", sc::scalar(std::int64_t{-9})},
                        {"b8", sc::tensor({1.f, 0.f}) > 0.5f}},
                       {{"format", "pt"}});
  sc::save_safetensors(dir / "rank4_and_empty",
                       {{"r4", sc::ones({1, 2, 1, 2})}, {"empty", sc::zeros({0, 5})}, {"odd \"name\"\n\\", sc::scalar(1.f)}});
  sc::save_safetensors(dir / "nothing", {});
  const std::string w_data("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);
  write(dir / "other_writer_style",
        st("{ \"w\" : {\"shape\": [2], \"dtype\": \"F32\", \"data_offsets\": [0, 8]},\n"
           "  \"a\\\"b\\\\c\\/\\u00e9\\ud83d\\ude00\\t\": {\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[8,16]},\n"
           "  \"z\": {\"dtype\":\"F64\",\"shape\":[0,9],\"data_offsets\":[16,16]},\n"
           "  \"__metadata__\": {\"format\": \"pt\", \"\": \"\"}\r\n}\t",
           w_data + std::string("\x07\x00\x00\x00\x00\x00\x00\x80", 8)));
  // corrupt
  write(dir / "header_too_long", u64le(100) + "{}");
  write(dir / "header_over_limit", u64le(200'000'000) + "{}");
  write(dir / "short", std::string("\x02\x00\x00", 3));
  write(dir / "duplicate", st(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", w_data));
  write(dir / "overlap", st(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})", w_data));
  write(dir / "gap", st(R"({"a":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", w_data));
  write(dir / "bad_bool", st(R"({"w":{"dtype":"BOOL","shape":[8],"data_offsets":[0,8]}})", w_data));
  write(dir / "huge_empty", st(R"({"t":{"dtype":"F32","shape":[0,5,4611686018427387904],"data_offsets":[0,0]}})", ""));
  write(dir / "too_large", st(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", ""));
  write(dir / "bad_escape", st("{\"\\ud800\\u0041\":1}", w_data));
  write(dir / "bad_utf8", st("{\"\xed\xa0\x80\":1}", w_data));
  write(dir / "metadata_not_string", st(R"({"__metadata__":{"k":1},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", w_data));
  write(dir / "f16", st(R"({"w":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}})", w_data));
  write(dir / "number_forms", st(R"({"w":{"dtype":"F32","shape":[2e0],"data_offsets":[0,8]}})", w_data));
}

// ---- npy ----
std::string npy(int major, const std::string& header, const std::string& data) {
  std::string s("\x93NUMPY", 6);
  s += static_cast<char>(major);
  s += '\0';
  const std::size_t n = header.size();
  if (major == 1) {
    s += static_cast<char>(n & 0xff);
    s += static_cast<char>(n >> 8);
  } else {
    for (int k = 0; k < 4; ++k) s += static_cast<char>((n >> (8 * k)) & 0xff);
  }
  return s + header + data;
}
std::string dict(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") + ", 'shape': " + shape + ", }";
}

void npy_seeds(const fs::path& dir) {
  write(dir / "f32", sc::io::to_npy_bytes(sc::tensor({1.f, 2.f, 3.f})));
  write(dir / "f64_2x2", sc::io::to_npy_bytes(sc::tensor(std::vector<double>{1, 2, 3, 4}, sc::Shape{2, 2})));
  write(dir / "i32_rank0", sc::io::to_npy_bytes(sc::scalar(std::int32_t{5})));
  write(dir / "i64_empty", sc::io::to_npy_bytes(sc::zeros({0, 3}, sc::i64)));
  write(dir / "b8", sc::io::to_npy_bytes(sc::tensor({1.f, 0.f, 1.f}) > 0.5f));
  const std::string one_two("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);
  write(dir / "v2", npy(2, dict("<f4", "(2,)") + "\n", one_two));
  write(dir / "v3", npy(3, dict("<f4", "(2,)") + "\n", one_two));
  write(dir / "other_style", npy(1, " {\t'descr' : '<f4' ,\n 'fortran_order' : False , 'shape' : ( 2 , 1 , ) , }\r\n  ", one_two));
  write(dir / "big_endian_f8", npy(1, dict(">f8", "()"), std::string("\x3f\xf8\x00\x00\x00\x00\x00\x00", 8)));
  write(dir / "u1", npy(1, dict("|u1", "(3,)"), std::string("\x00\x7f\xff", 3)));
  write(dir / "i2", npy(1, dict("<i2", "(1,)"), std::string("\x00\x80", 2)));
  write(dir / "u4", npy(1, dict("<u4", "(1,)"), "\xff\xff\xff\xff"));
  std::string data;
  for (int v : {0, 3, 1, 4, 2, 5}) data += std::string({static_cast<char>(v), '\0', '\0', '\0'});
  write(dir / "fortran_2x3", npy(1, dict("<i4", "(2, 3)", true), data));
  write(dir / "huge_empty_ok", npy(1, dict("<f8", "(0, 1000000000, 1000000)"), ""));
  // corrupt
  write(dir / "huge_empty_bad", npy(1, dict("<f8", "(0, 9223372036854775807)"), ""));
  write(dir / "bad_bool", npy(1, dict("|b1", "(2,)"), "\x01\x02"));
  write(dir / "truncated", sc::io::to_npy_bytes(sc::tensor({1.f, 2.f})).substr(0, 70));
  write(dir / "bad_version", npy(4, dict("<f4", "(2,)"), one_two));
  write(dir / "header_len_past_end", npy(1, dict("<f4", "(2,)"), one_two).substr(0, 20));
  write(dir / "bad_descr", npy(1, dict("<c8", "(1,)"), one_two));
  write(dir / "missing_key", npy(1, "{'descr': '<f4', 'shape': (2,)}", one_two));
  write(dir / "long_int", npy(1, dict("<f4", "(2L,)"), one_two));
}

// ---- saved functions (sc::load_function) ----
// fuzz_function's input: the graph's text, as a saved function's metadata holds it.
void function_seeds(const fs::path& dir) {
  const auto save = [&](const char* name, const sc::ConcreteFunction& cf) {
    const fs::path tmp = fs::temp_directory_path() / "stagecraft_seed.function";
    cf.save(tmp.string());
    write(dir / name, sc::load_safetensors(tmp).metadata.at("graph"));
    fs::remove(tmp);
  };
  static sc::Variable w(sc::tensor({{0.5f, -1.f}, {2.f, 0.25f}, {1.5f, -0.5f}}), "dense/w");
  static sc::Variable b(sc::tensor({0.1f, -0.2f}), "dense/b");
  static sc::Variable steps(sc::scalar(std::int64_t{0}), "steps", false);
  const sc::Tensor x43 = sc::random::uniform({4, 3}, -1.0, 1.0, 1);
  save("dense", sc::function([](sc::Tensor x) { return sc::relu(sc::matmul(x, w) + b); }, "dense").get_concrete(x43));
  save("train_step", sc::function([](sc::Tensor x, sc::Tensor y) {
                       sc::GradientTape tape;
                       const sc::Tensor loss = sc::nn::cross_entropy(sc::matmul(x, w) + b, y);
                       const auto g = tape.gradient(loss, std::vector<sc::Variable>{w, b});
                       w.assign_sub(g[0] * 0.1f);
                       b.assign_sub(g[1] * 0.1f);
                       steps.assign_add(sc::scalar(std::int64_t{1}));
                       return loss;
                     }, "train_step").get_concrete(x43, sc::tensor(std::vector<std::int64_t>{0, 1, 1, 0})));
  save("cond", sc::function([](sc::Tensor x) {
                 return sc::cond(sc::sum(x) > 0.f, [&] { return sc::exp(x); }, [&] { return -x * 2.f; });
               }, "cond").get_concrete(x43));
  save("while", sc::function([](sc::Tensor x) {
                  return std::get<1>(sc::while_loop([](sc::Tensor i, sc::Tensor) { return i < 5; },
                                                    [](sc::Tensor i, sc::Tensor v) { return std::make_tuple(i + 1, v * 0.5f + 1.f); },
                                                    std::make_tuple(sc::scalar(std::int64_t{0}), x)));
                }, "while").get_concrete(x43));
  save("layout", sc::function([](sc::Tensor x, sc::Tensor idx) {
                   const sc::Tensor t = sc::transpose(sc::reshape(x, {2, 6}));
                   const sc::Tensor c = sc::concat({sc::slice(t, {1, 0}, {3, -1}), sc::gather(t, idx)}, 0);
                   return sc::stack({sc::max(c, {0}), sc::argmax(c, 0).astype(sc::f32)}) + sc::sum(sc::one_hot(idx, 2, sc::f32));
                 }, "layout").get_concrete(x43, sc::tensor(std::vector<std::int64_t>{1, 0, 3})));
  save("conv", sc::function([](sc::Tensor img, sc::Tensor k) {
                 return sc::nn::max_pool2d(sc::nn::conv2d(img, k, 1, 1), 2, 2) + sc::nn::avg_pool2d(img, 2, 2);
               }, "conv").get_concrete(sc::random::uniform({1, 1, 4, 4}, 0.0, 1.0, 2), sc::random::uniform({1, 1, 3, 3}, -1.0, 1.0, 3)));
  save("ints_and_bools", sc::function([](sc::Tensor a, sc::Tensor m) {
                           return sc::where(m, a * 3 - 1, sc::sum(a, {0}, true)) / 2;
                         }, "ints").get_concrete(sc::tensor(std::vector<std::int32_t>{1, -2, 3, 4}, sc::Shape{2, 2}),
                                                 sc::tensor({1.f, 0.f}) > 0.5f));
  // corrupt: a truncated graph, an input index out of range
  const std::string dense = read(dir / "dense");
  write(dir / "truncated_dense", dense.substr(0, dense.size() * 2 / 3));
  std::string bad = dense;
  bad.replace(bad.find("in=[0,"), 6, "in=[9,");
  write(dir / "bad_input_index", bad);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  for (const char* t : {"idx", "safetensors", "npy", "function"}) fs::create_directories(out / t);
  idx_seeds(out / "idx");
  safetensors_seeds(out / "safetensors");
  npy_seeds(out / "npy");
  function_seeds(out / "function");
  return 0;
}
