// The safetensors reader and writer: layout, round trips, corrupt files, atomic writes.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <stagecraft/stagecraft.hpp>
#include <stagecraft/state/checkpoint.hpp>
#include <stagecraft/state/safetensors.hpp>

#include "checkpoint_testing.hpp"

TEST_CASE("safetensors round trip: every dtype, ranks 0..4, empty tensors", "[safetensors]") {
  TempDir dir;
  const std::vector<sc::Shape> shapes = {{}, {3}, {0}, {2, 3}, {2, 0, 4}, {2, 1, 3}, {1, 2, 3, 4}, {3, 0, 1, 2}};
  const sc::DType dtypes[] = {sc::boolean, sc::i32, sc::i64, sc::f32, sc::f64};
  std::vector<std::pair<std::string, sc::Tensor>> ts;
  for (sc::DType d : dtypes)
    for (std::size_t i = 0; i < shapes.size(); ++i)
      ts.emplace_back(std::string(sc::name(d)) + "/" + std::to_string(i), filled(shapes[i], d));
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "π \"quoted\"\n\\"}};
  const fs::path p = dir / "all.safetensors";
  sc::save_safetensors(p, ts, meta);
  const sc::SafetensorsFile f = sc::load_safetensors(p);
  CHECK(f.metadata == meta);
  REQUIRE(f.tensors.size() == ts.size());
  for (const auto& [name, t] : ts) {
    INFO(name << " " << t.shape());
    REQUIRE(f.tensors.count(name) == 1);
    CHECK(same_bytes(f.tensors.at(name), t));  // bitwise: NaN, -0, denormals survive
  }
  // One file per tensor too (each alone is the whole data section).
  for (const auto& [name, t] : ts) {
    sc::save_safetensors(dir / "one", {{name, t}});
    CHECK(same_bytes(sc::load_safetensors(dir / "one").tensors.at(name), t));
  }
  // No tensors at all: "{}" padded to 8 bytes.
  sc::save_safetensors(dir / "none", {});
  CHECK(read_bytes(dir / "none") == u64le(8) + "{}      ");
  CHECK(sc::load_safetensors(dir / "none").tensors.empty());
}

TEST_CASE("safetensors byte layout of a small known file", "[safetensors]") {
  TempDir dir;
  const fs::path p = dir / "small.safetensors";
  sc::save_safetensors(p,
                       {{"b", sc::tensor({1, -2})}, {"a", sc::scalar(1.5)}, {"c", sc::tensor({true, false, true})},
                        {"e", sc::zeros({0})}},
                       {{"k", "v"}});
  const std::string bytes = read_bytes(p);
  // 8-byte types first, then 4-byte ones by name, then bytes: every tensor starts aligned.
  const std::string json =
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"F64","shape":[],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"I32","shape":[2],"data_offsets":[8,16]},"e":{"dtype":"F32","shape":[0],"data_offsets":[16,16]},)"
      R"("c":{"dtype":"BOOL","shape":[3],"data_offsets":[16,19]}})";
  const std::size_t padded = (json.size() + 7) / 8 * 8;
  REQUIRE(bytes.size() == 8 + padded + 19);
  CHECK(bytes.substr(0, 8) == u64le(padded));
  CHECK((8 + padded) % 8 == 0);
  CHECK(bytes.substr(8, json.size()) == json);
  CHECK(bytes.substr(8 + json.size(), padded - json.size()) == std::string(padded - json.size(), ' '));
  const std::string data("\x00\x00\x00\x00\x00\x00\xf8\x3f"  // 1.5 as f64 LE
                         "\x01\x00\x00\x00\xfe\xff\xff\xff"  // 1, -2 as i32 LE
                         "\x01\x00\x01",                     // true false true
                         19);
  CHECK(bytes.substr(8 + padded) == data);
}

TEST_CASE("safetensors reads files in other writers' style", "[safetensors]") {
  TempDir dir;
  // Unpadded header, __metadata__ last, whitespace and newlines, escapes in names.
  const std::string header =
      "{ \"w\" : {\"shape\": [2], \"dtype\": \"F32\", \"data_offsets\": [0, 8]},\n"
      "  \"a\\\"b\\\\c\\/\\u00e9\\ud83d\\ude00\\t\": {\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[8,16]},\n"
      "  \"z\": {\"dtype\":\"F64\",\"shape\":[0,9],\"data_offsets\":[16,16]},\n"
      "  \"__metadata__\": {\"format\": \"pt\", \"\": \"\"}\r\n}\t";
  const std::string data = w_data + std::string("\x07\x00\x00\x00\x00\x00\x00\x80", 8);
  write_bytes(dir / "x", file_bytes(header, data));
  const auto f = sc::load_safetensors(dir / "x");
  CHECK(f.tensors.at("w").to_vector<float>() == std::vector<float>{1.f, 2.f});
  const std::string odd = "a\"b\\c/\xc3\xa9\xf0\x9f\x98\x80\t";
  REQUIRE(f.tensors.count(odd) == 1);
  CHECK(f.tensors.at(odd).item<std::int64_t>() == std::numeric_limits<std::int64_t>::min() + 7);
  CHECK(f.tensors.at("z").shape() == sc::Shape{0, 9});  // (an empty tensor with an extent of 2^62 or more
                                                        // is refused: test/core/test_hardening.cpp)
  CHECK(f.metadata == std::map<std::string, std::string>{{"format", "pt"}, {"", ""}});
  // Names we write with quotes, backslashes and control characters read back the same.
  sc::save_safetensors(dir / "y", {{odd + "\x01\n", sc::scalar(1.f)}});
  CHECK(sc::load_safetensors(dir / "y").tensors.count(odd + "\x01\n") == 1);
}

TEST_CASE("safetensors: a file truncated anywhere is an IOError", "[safetensors]") {
  TempDir dir;
  const fs::path good = dir / "good";
  sc::save_safetensors(good, {{"x", filled<float>({2, 3})}, {"y", filled<std::int64_t>({4})}}, {{"k", "v"}});
  const std::string bytes = read_bytes(good);
  const std::size_t header_end = 8 + header_length(bytes);
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    INFO("truncated to " << n << " of " << bytes.size() << " bytes");
    write_bytes(dir / "cut", bytes.substr(0, n));
    const char* why = n < 8 ? "fewer than the 8-byte header length"
                      : n < header_end ? "runs past the end of the"
                                       : "past the end of the";
    CHECK_THROWS_MATCHES(sc::load_safetensors(dir / "cut"), sc::IOError, Has(why) && Has("truncated"));
  }
  write_bytes(dir / "long", bytes + "!");
  CHECK_THROWS_MATCHES(sc::load_safetensors(dir / "long"), sc::IOError, Has("trailing bytes"));
}

TEST_CASE("safetensors: header length field out of range", "[safetensors]") {
  TempDir dir;
  const auto load = [&](const std::string& bytes) {
    write_bytes(dir / "f", bytes);
    return sc::load_safetensors(dir / "f");
  };
  CHECK_THROWS_MATCHES(load(u64le(100) + "{}"), sc::IOError, Has("runs past the end of the 10-byte file"));
  CHECK_THROWS_MATCHES(load(u64le(200'000'000) + "{}"), sc::IOError, Has("over the 100000000-byte limit"));
  CHECK_THROWS_MATCHES(load(u64le(~std::uint64_t{0}) + "{}"), sc::IOError, Has("limit"));
  CHECK_THROWS_MATCHES(load(u64le(0)), sc::IOError, Has("start with '{'"));
  CHECK_THROWS_MATCHES(load(""), sc::IOError, Has("0 bytes"));
}

TEST_CASE("safetensors: malformed headers are IOErrors naming the problem", "[safetensors]") {
  TempDir dir;
  const std::string w = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const auto with = [](const std::string& field) { return "{\"w\":{" + field + "}}"; };
  const std::string rest = R"("shape":[2],"data_offsets":[0,8])";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "start with '{'"},
      {"[]", "start with '{'"},
      {" ", "found the end of the header"},
      {"{", "header byte 1: syntax error while parsing object key - unexpected end of input"},
      {"{" + w, "unexpected end of input; expected '}'"},
      {"{" + w + "}x", "unexpected bytes after the closing '}'"},
      {"{" + w + "} }", "unexpected bytes"},
      {"{" + w + ",}", "unexpected '}'; expected string literal"},
      {"{w:1}", "header byte 1: syntax error while parsing object key - invalid literal"},
      {"{'w':1}", "invalid literal; expected string literal"},
      {"{\"w\" 1}", "expected ':'"},
      {"{" + w + "," + w + "}", "tensor \"w\" appears twice"},
      {"{\"w", "missing closing quote"},
      {"{\"w\n\":1}", "control character"},
      {"{\"w\\q\":1}",
       "header byte 4: syntax error while parsing object key - invalid string: forbidden character after backslash"},
      {"{\"w\\", "forbidden character after backslash"},
      {"{\"\\udc00\":1}", "surrogate U+DC00..U+DFFF must follow U+D800..U+DBFF"},
      {"{\"\\ud800x\":1}", "surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF"},
      {"{\"\\ud800\\u0041\":1}", "surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF"},
      {"{\"\\u12", "'\\u' must be followed by 4 hex digits"},
      {"{\"\\u12G4\":1}", "'\\u' must be followed by 4 hex digits"},
      {"{\"\xff\":1}", "invalid string: ill-formed UTF-8 byte"},
      {"{\"\xc0\xaf\":1}", "invalid string: ill-formed UTF-8 byte"},
      {"{\"\xed\xa0\x80\":1}", "invalid string: ill-formed UTF-8 byte"},
      {"{\"\xe2\x82\":1}", "invalid string: ill-formed UTF-8 byte"},
      {std::string("{\0}", 3), "header byte 1: a NUL byte"},
      {"{\"w\":[1]}", "tensor \"w\" to be an object"},
      {"{\"w\":{}}", "lacks the field \"dtype\""},
      {with(R"("dtype":"F32","shape":[2])"), "lacks the field \"data_offsets\""},
      {with(R"("dtype":"F32","data_offsets":[0,8])"), "lacks the field \"shape\""},
      {with(R"("dtype":32,)" + rest), "a dtype string"},
      {with(R"("dtype":"F16",)" + rest), "\"F16\" is valid safetensors but not supported"},
      {with(R"("dtype":"BF16",)" + rest), "not supported"},
      {with(R"("dtype":"X32",)" + rest), "unknown dtype \"X32\""},
      {with(R"("dtype":"f32",)" + rest), "unknown dtype \"f32\""},
      {with(R"("dtype":"F32","dtype":"F32",)" + rest), "field \"dtype\" appears twice"},
      {with(R"("dtype":"F32","foo":1,)" + rest), "unknown field \"foo\""},
      {with(R"("dtype":"F32","shape":2,"data_offsets":[0,8])"), "a shape (an array)"},
      {with(R"("dtype":"F32","shape":[-2],"data_offsets":[0,8])"), "a shape is negative"},
      {with(R"("dtype":"F32","shape":[2.0],"data_offsets":[0,8])"), "not an integer"},
      {with(R"("dtype":"F32","shape":[2e0],"data_offsets":[0,8])"), "not an integer"},
      {with(R"("dtype":"F32","shape":[02],"data_offsets":[0,8])"), "unexpected number literal; expected ']'"},
      {with(R"("dtype":"F32","shape":["2"],"data_offsets":[0,8])"), "a shape (an integer)"},
      {with(R"("dtype":"F32","shape":[2,],"data_offsets":[0,8])"), "unexpected ']'"},
      {with(R"("dtype":"F32","shape":[2 3],"data_offsets":[0,8])"),
       "header byte 31 in tensor \"w\": syntax error while parsing array - unexpected number literal; expected ']'"},
      {with(R"("dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,8])"), "too large"},
      {with(R"("dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8])"), "too large"},
      {with(R"("dtype":"F32","shape":[1,1,1,1,1,1,1,1,2],"data_offsets":[0,8])"), "more than 8 items"},
      {with(R"("dtype":"F32","shape":[2],"data_offsets":[0])"), "must hold 2 numbers"},
      {with(R"("dtype":"F32","shape":[2],"data_offsets":[0,4,8])"), "more than 2 items"},
      {with(R"("dtype":"F32","shape":[2],"data_offsets":null)"), "data_offsets (an array)"},
      {"{\"__metadata__\":[]," + w + "}", "\"__metadata__\" to be an object"},
      {"{\"__metadata__\":{\"k\":1}," + w + "}", "a metadata value"},
      {"{\"__metadata__\":{\"k\":{}}," + w + "}", "a metadata value"},
      {"{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}," + w + "}", "metadata key \"k\" appears twice"},
      {"{\"__metadata__\":{},\"__metadata__\":{}," + w + "}", "\"__metadata__\" appears twice"},
      // Valid JSON, but the tensors do not tile the 8-byte data section.
      {with(R"("dtype":"F32","shape":[2],"data_offsets":[0,16])"), "past the end of the 8-byte data section"},
      {with(R"("dtype":"F32","shape":[2],"data_offsets":[8,0])"), "run backwards"},
      {with(R"("dtype":"F32","shape":[3],"data_offsets":[0,8])"), "F32 [3] needs 12 bytes"},
      {with(R"("dtype":"F64","shape":[2],"data_offsets":[0,8])"), "F64 [2] needs 16 bytes"},
      {with(R"("dtype":"BOOL","shape":[4],"data_offsets":[0,4])"), "trailing bytes"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
       "overlap"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})",
       "overlap"},
      {R"({"a":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       "bytes [1, 4) of the data section belong to no tensor"},
      {with(R"("dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8])"), "too large to address"},
      {with(R"("dtype":"F32","shape":[9223372036854775807,2,0],"data_offsets":[0,0])"), "too large to address"},
      {with(R"("dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,8])"), "too large to address"},
  };
  for (const auto& [header, why] : cases) {
    INFO("header: " << header);
    write_bytes(dir / "bad", file_bytes(header, w_data));
    CHECK_THROWS_MATCHES(sc::load_safetensors(dir / "bad"), sc::IOError,
                         Has(why) && Has("'" + (dir / "bad").string() + "' is corrupt") &&
                             Has("test_safetensors.cpp"));
  }
  // A BOOL byte other than 0 or 1 cannot be read as a C++ bool.
  write_bytes(dir / "bool", file_bytes(with(R"("dtype":"BOOL","shape":[8],"data_offsets":[0,8])"), w_data));
  CHECK_THROWS_MATCHES(sc::load_safetensors(dir / "bool"), sc::IOError, Has("holds the byte 128 at element 2"));
}

TEST_CASE("safetensors: keys that appear twice are refused at every level", "[safetensors]") {
  // A JSON DOM keeps the last of two equal keys: each file below would then load as a valid file.
  TempDir dir;
  const std::string w = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)" + w + "}", "tensor \"w\" appears twice"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4],"data_offsets":[0,8]}})",
       "field \"data_offsets\" appears twice in tensor \"w\""},
      {R"({"w":{"dtype":"I64","shape":[2],"dtype":"F32","data_offsets":[0,8]}})", "field \"dtype\" appears twice"},
      {R"({"w":{"shape":[3],"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "field \"shape\" appears twice"},
      {R"({"__metadata__":{"k":"a","j":"b","k":"a"},)" + w + "}", "metadata key \"k\" appears twice"},
      {R"({"__metadata__":{},)" + w + R"(,"__metadata__":{"k":"v"}})", "\"__metadata__\" appears twice"},
      // Keys are compared after unescaping: "\u0077" is "w", "\u005f_metadata__" is "__metadata__".
      {"{" + w + R"(,"\u0077":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "tensor \"w\" appears twice"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"\u0073hape":[2]}})", "field \"shape\" appears twice"},
      {R"({"__metadata__":{},"\u005f_metadata__":{},)" + w + "}", "\"__metadata__\" appears twice"},
      {R"({"__metadata__":{"\u00e9":"a","é":"b"},)" + w + "}", "metadata key \"é\" appears twice"},
  };
  for (const auto& [header, why] : cases) {
    INFO("header: " << header);
    write_bytes(dir / "bad", file_bytes(header, w_data));
    CHECK_THROWS_MATCHES(sc::load_safetensors(dir / "bad"), sc::IOError, Has(why) && Has("is corrupt"));
  }
  // The same keys once each load.
  write_bytes(dir / "good", file_bytes(R"({"\u005f_metadata__":{"\u00e9":"a"},"\u0077":{"dtype":"F32","shape":[2],)"
                                       R"("data_offsets":[0,8]}})",
                                       w_data));
  const auto f = sc::load_safetensors(dir / "good");
  CHECK(f.metadata == std::map<std::string, std::string>{{"é", "a"}});
  CHECK(f.tensors.at("w").to_vector<float>() == std::vector<float>{1.f, 2.f});
}

TEST_CASE("safetensors: valid JSON of the wrong shape or types is an IOError", "[safetensors]") {
  TempDir dir;
  const std::string w = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const auto with = [](const std::string& field) { return "{\"w\":{" + field + "}}"; };
  const std::string rest = R"("shape":[2],"data_offsets":[0,8])";
  const std::string dtype = R"("dtype":"F32",)";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"\"w\"", "start with '{'"},
      {"null", "start with '{'"},
      {"\xef\xbb\xbf{}", "start with '{'"},  // a byte-order mark (nlohmann would skip it)
      {R"({"w":"F32"})", "expected tensor \"w\" to be an object, found a string"},
      {R"({"w":null})", "tensor \"w\" to be an object, found null"},
      {R"({"w":7})", "tensor \"w\" to be an object, found a number"},
      {R"({"w":true})", "tensor \"w\" to be an object, found a boolean"},
      {with(R"("dtype":null,)" + rest), "expected a dtype string, found null in tensor \"w\""},
      {with(R"("dtype":true,)" + rest), "a dtype string, found a boolean"},
      {with(R"("dtype":["F32"],)" + rest), "a dtype string, found an array"},
      {with(R"("dtype":{"F32":1},)" + rest), "a dtype string, found an object"},
      {with(dtype + R"("shape":{},"data_offsets":[0,8])"), "a shape (an array), found an object"},
      {with(dtype + R"("shape":"2","data_offsets":[0,8])"), "a shape (an array), found a string"},
      {with(dtype + R"("shape":[[2]],"data_offsets":[0,8])"), "a shape (an integer), found an array"},
      {with(dtype + R"("shape":[{}],"data_offsets":[0,8])"), "a shape (an integer), found an object"},
      {with(dtype + R"("shape":[true],"data_offsets":[0,8])"), "a shape (an integer), found a boolean"},
      {with(dtype + R"("shape":[null],"data_offsets":[0,8])"), "a shape (an integer), found null"},
      {with(dtype + R"("shape":[2],"data_offsets":{"begin":0,"end":8})"), "data_offsets (an array), found an object"},
      {with(dtype + R"("shape":[2],"data_offsets":[0,"8"])"), "data_offsets (an integer), found a string"},
      {with(dtype + R"("shape":[2],"data_offsets":[0,8.5])"), "data_offsets is not an integer in tensor \"w\""},
      {with(dtype + R"("shape":[2],"data_offsets":[0,8e0])"), "data_offsets is not an integer"},
      {with(dtype + R"("shape":[2],"data_offsets":[-0,8])"), "data_offsets is negative"},
      {with(dtype + R"("shape":[2],"data_offsets":[0,[8]])"), "data_offsets (an integer), found an array"},
      {with(dtype + R"("shape":[2],"data_offsets":[])"), "must hold 2 numbers"},
      {with(dtype + R"("shape":[-0],"data_offsets":[0,8])"), "a shape is negative"},
      {with(dtype + R"("shape":[-99999999999999999999],"data_offsets":[0,8])"), "a shape is negative"},
      {with(dtype + R"("shape":[18446744073709551615],"data_offsets":[0,8])"), "a shape is too large"},
      {with(dtype + R"("shape":[18446744073709551616],"data_offsets":[0,8])"), "a shape is too large"},
      {with(dtype + R"("shape":[2],"data_offsets":[0,9223372036854775808])"), "data_offsets is too large"},
      {with(dtype + R"("shape":[2],"data_offsets":[0,8],"extra":null)"), "unknown field \"extra\" in tensor \"w\""},
      {R"({"__metadata__":"pt",)" + w + "}", "expected \"__metadata__\" to be an object, found a string"},
      {R"({"__metadata__":null,)" + w + "}", "\"__metadata__\" to be an object, found null"},
      {R"({"__metadata__":{"k":null},)" + w + "}", "a metadata value (a string) for the key \"k\", found null"},
      {R"({"__metadata__":{"k":["v"]},)" + w + "}", "for the key \"k\", found an array"},
      {R"({"__metadata__":{"k":false},)" + w + "}", "for the key \"k\", found a boolean"},
      {R"({"__metadata__":{"k":1.5},)" + w + "}", "for the key \"k\", found a number"},
      {R"({"__metadata__":{"k":-1},)" + w + "}", "for the key \"k\", found a number"},
      // Only spaces, tabs and newlines may follow the '}'; nlohmann's lexer stops at a NUL byte, so
      // without a check of its own a reader would take what follows the NUL for padding.
      {"{" + w + "}  {}", "unexpected bytes after the closing '}'"},
      {"{" + w + "}]", "unexpected bytes after the closing '}'"},
      {"{" + w + std::string("}\0junk", 6), "a NUL byte"},
      {"{" + w + std::string("}  \0", 4), "a NUL byte"},
      {"{" + w + std::string("}\f", 2), "unexpected bytes after the closing '}'"},
      {"{" + w + "}/*c*/", "unexpected bytes after the closing '}'"},  // no comments
      {"{" + w + ",/*c*/\"x\":1}", "invalid literal"},
  };
  for (const auto& [header, why] : cases) {
    INFO("header: " << header);
    write_bytes(dir / "bad", file_bytes(header, w_data));
    CHECK_THROWS_MATCHES(sc::load_safetensors(dir / "bad"), sc::IOError,
                         Has(why) && Has("'" + (dir / "bad").string() + "' is corrupt") && Has("test_safetensors.cpp"));
  }
  // Deep nesting is refused at its first bracket, not parsed (nor recursed into) to its end.
  const std::string deep(1'000'000, '[');
  for (const std::string& header :
       {"{\"w\":" + deep, R"({"__metadata__":{"k":)" + deep, with(dtype + "\"shape\":[" + deep)}) {
    write_bytes(dir / "deep", file_bytes(header, w_data));
    CHECK_THROWS_MATCHES(sc::load_safetensors(dir / "deep"), sc::IOError, Has("found an array"));
  }
  // Whitespace of every kind JSON allows, before and after, is fine.
  write_bytes(dir / "ws", file_bytes(" \t\r\n{" + w + "}\n\t\r ", w_data));
  CHECK(sc::load_safetensors(dir / "ws").tensors.at("w").to_vector<float>() == std::vector<float>{1.f, 2.f});
}

TEST_CASE("safetensors: any UTF-8 name or metadata round-trips, escaped as JSON", "[safetensors]") {
  TempDir dir;
  std::string controls;
  for (char c = 1; c < 0x20; ++c) controls += c;
  const std::vector<std::string> names = {
      "",
      "é",
      "日本語/重み",
      "\xf0\x9f\x98\x80 emoji",
      "e\xcc\x81",                             // e + combining acute: not normalised
      "\xe2\x80\xa8line\xe2\x80\xa9sep",       // U+2028, U+2029
      "\xef\xbf\xbf\xf4\x8f\xbf\xbf",          // U+FFFF, U+10FFFF
      "q\"uote\\back/slash",
      std::string("nul\0inside", 10),
      controls,
      "\x7f del",
      "__metadata__ ",
      "\\u0041",                               // the six characters, not "A"
  };
  std::vector<std::pair<std::string, sc::Tensor>> ts;
  std::map<std::string, std::string> meta;
  for (std::size_t i = 0; i < names.size(); ++i) {
    ts.emplace_back(names[i], sc::full({static_cast<std::int64_t>(i)}, static_cast<float>(i)));
    meta[names[i]] = names[names.size() - 1 - i];
  }
  sc::save_safetensors(dir / "names", ts, meta);
  const std::string bytes = read_bytes(dir / "names");
  const std::string header = bytes.substr(8, header_length(bytes));
  // The header is JSON a general parser reads back to the same strings: control characters are
  // escaped, non-ASCII is written as it is (not as \u escapes).
  CHECK(std::none_of(header.begin(), header.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; }));
  CHECK(header.find("\\u0001\\u0002") != std::string::npos);
  CHECK(header.find(R"("q\"uote\\back/slash")") != std::string::npos);
  CHECK(header.find("日本語/重み") != std::string::npos);
  CHECK(header.find("\\u00e9") == std::string::npos);
  const auto json = nlohmann::json::parse(header);
  CHECK(json.at("__metadata__").get<std::map<std::string, std::string>>() == meta);
  for (const auto& name : names) CHECK(json.contains(name));

  const auto f = sc::load_safetensors(dir / "names");
  CHECK(f.metadata == meta);
  REQUIRE(f.tensors.size() == names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    INFO("name " << i);
    REQUIRE(f.tensors.count(names[i]) == 1);
    CHECK(f.tensors.at(names[i]).to_vector<float>() == std::vector<float>(i, static_cast<float>(i)));
  }
  // A Checkpoint's keys go through the same writer and reader.
  sc::Variable v(sc::full({2}, 3.f), "v");
  struct Named {
    sc::Variable& v;
    std::vector<std::pair<std::string, sc::Variable>> named_variables() const { return {{"çà/\"x\"\n", v}}; }
  } named{v};
  sc::Checkpoint ck;
  ck.track("modèle", named);
  ck.save(dir / "ck");
  CHECK(sc::load_safetensors(dir / "ck").tensors.count("modèle/çà/\"x\"\n") == 1);
  v.assign(sc::zeros({2}));
  ck.restore(dir / "ck");
  CHECK(v.value().to_vector<float>() == std::vector<float>{3.f, 3.f});
}

TEST_CASE("safetensors: missing files and non-files are IOErrors", "[safetensors]") {
  TempDir dir;
  CHECK_THROWS_MATCHES(sc::load_safetensors(dir / "nope"), sc::IOError,
                       Has("no such file") && Has("[load_safetensors]") && Has("test_safetensors.cpp"));
  CHECK_THROWS_MATCHES(sc::load_safetensors(dir.path), sc::IOError, Has("is not a regular file"));
  CHECK_THROWS_MATCHES(sc::load_safetensors("/dev/null"), sc::IOError, Has("is not a regular file"));
}

TEST_CASE("safetensors: byte mutations never crash (IOError or a clean load)", "[safetensors]") {
  TempDir dir;
  sc::save_safetensors(dir / "good", {{"x", filled<float>({2, 2})}, {"m", filled<bool>({3})}, {"i", filled<std::int32_t>({})}},
                       {{"k", "v"}});
  const std::string bytes = read_bytes(dir / "good");
  int loaded = 0, rejected = 0;
  write_bytes(dir / "m", bytes);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const auto b = static_cast<unsigned char>(bytes[i]);
    for (unsigned v : {0x00u, 0xFFu, 0x80u, unsigned('"'), unsigned('}'), unsigned(','), unsigned('9'), unsigned(' '),
                       b ^ 1u, (b + 1u) & 0xFFu}) {
      patch_byte(dir / "m", i, static_cast<char>(v));
      try {
        sc::load_safetensors(dir / "m");
        ++loaded;
      } catch (const sc::IOError&) {
        ++rejected;
      }
    }
    patch_byte(dir / "m", i, bytes[i]);
  }
  CHECK(loaded > 0);    // mutations of the data section load
  CHECK(rejected > 0);  // mutations of the header do not
}

TEST_CASE("save_safetensors rejects bad arguments", "[safetensors]") {
  TempDir dir;
  const auto x = sc::scalar(1.f);
  CHECK_THROWS_MATCHES(sc::save_safetensors(dir / "f", {{"a", x}, {"a", x}}), sc::ValueError,
                       Has("two tensors are named \"a\"") && Has("test_safetensors.cpp"));
  CHECK_THROWS_MATCHES(sc::save_safetensors(dir / "f", {{"__metadata__", x}}), sc::ValueError, Has("reserved"));
  CHECK_THROWS_MATCHES(sc::save_safetensors(dir / "f", {{"\xff", x}}), sc::ValueError, Has("not valid UTF-8"));
  CHECK_THROWS_MATCHES(sc::save_safetensors(dir / "f", {{"a", x}}, {{"k", "\xc0"}}), sc::ValueError, Has("UTF-8"));
  CHECK_THROWS_AS(sc::save_safetensors(dir / "f", {{"a", sc::Tensor()}}), sc::ValueError);
  CHECK(dir.files().empty());  // nothing written, not even a temporary file
}

TEST_CASE("safetensors saves are atomic: a failed save leaves the old file intact", "[safetensors][atomic]") {
  TempDir dir;
  const fs::path p = dir / "ck.safetensors";
  sc::save_safetensors(p, {{"old", filled<double>({3})}});
  const std::string old = read_bytes(p);
  const std::vector<std::pair<std::string, sc::Tensor>> big = {{"a", filled<float>({64})}, {"b", filled<std::int64_t>({8})}};

  sc::save_safetensors(dir / "trial", big);
  const std::string trial = read_bytes(dir / "trial");
  fs::remove(dir / "trial");
  const std::uint64_t data_start = 8 + header_length(trial);
  // Fail after the length, after the header, after the first tensor's data, after the last write.
  for (std::uint64_t fail_at : {std::uint64_t{8}, data_start, data_start + 1, std::uint64_t{trial.size()}}) {
    INFO("failing once " << fail_at << " bytes are written");
    sc::detail::safetensors::write_hook = [fail_at](std::uint64_t written) {
      if (written >= fail_at) throw std::runtime_error("simulated disk failure");
    };
    CHECK_THROWS_MATCHES(sc::save_safetensors(p, big), sc::IOError,
                         Has("simulated disk failure") && Has("[save_safetensors]") &&
                             Has("test_safetensors.cpp"));
    sc::detail::safetensors::write_hook = nullptr;
    CHECK(read_bytes(p) == old);
    CHECK(dir.files() == std::vector<std::string>{"ck.safetensors"});  // the temporary file is gone
  }
  // A real failure: the target is a directory, so the final rename fails.
  fs::create_directory(dir / "adir");
  CHECK_THROWS_MATCHES(sc::save_safetensors(dir / "adir", big), sc::IOError, Has("cannot rename"));
  CHECK(dir.files() == std::vector<std::string>{"adir", "ck.safetensors"});
  // And: the directory does not exist.
  CHECK_THROWS_MATCHES(sc::save_safetensors(dir / "no" / "f", big), sc::IOError,
                       Has("cannot create the temporary file") && Has("No such file"));
  // A successful save replaces the file.
  sc::save_safetensors(p, big);
  CHECK(sc::load_safetensors(p).tensors.count("a") == 1);
  CHECK(dir.files() == std::vector<std::string>{"adir", "ck.safetensors"});
}

TEST_CASE("safetensors saves are atomic: a crash mid-save leaves the old file intact", "[safetensors][atomic]") {
  TempDir dir;
  const fs::path p = dir / "ck.safetensors";
  sc::save_safetensors(p, {{"old", filled<double>({3})}});
  const std::string old = read_bytes(p);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {  // the child dies half-way through writing the data, as in a power cut
    sc::detail::safetensors::write_hook = [](std::uint64_t written) {
      if (written > 64) ::_exit(42);
    };
    try {
      sc::save_safetensors(p, {{"new", filled<float>({1000})}});
    } catch (...) {
    }
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 42);
  CHECK(read_bytes(p) == old);
  CHECK(same_bytes(sc::load_safetensors(p).tensors.at("old"), filled<double>({3})));
  // The crashed writer's partial temporary file is left beside the target, never in its place.
  const auto files = dir.files();
  REQUIRE(files.size() == 2);
  CHECK(files[1].rfind("ck.safetensors.tmp.", 0) == 0);
}

TEST_CASE("safetensors and npy saves skip temporary names a crashed run with the same pid left", "[safetensors][atomic]") {
  TempDir dir;
  const fs::path p = dir / "ck.safetensors";
  // The temporary name of a save, seen from inside it: "ck.safetensors.tmp.<pid>.<n>".
  std::string seen;
  sc::detail::safetensors::write_hook = [&](std::uint64_t) {
    for (const std::string& f : dir.files())
      if (f.find(".tmp.") != std::string::npos) seen = f;
  };
  sc::save_safetensors(p, {{"old", filled<double>({3})}});
  sc::detail::safetensors::write_hook = nullptr;
  REQUIRE(seen.rfind("ck.safetensors.tmp." + std::to_string(::getpid()) + ".", 0) == 0);
  const std::size_t dot = seen.rfind('.');
  const unsigned long next = std::stoul(seen.substr(dot + 1)) + 1;
  // A job restarted with the same pid (a container's) finds its crashed run's leftovers under the
  // names it would take next: every first save failed with "cannot create the temporary file
  // (...): File exists".
  for (unsigned long k = next; k < next + 3; ++k) write_bytes(dir / (seen.substr(0, dot + 1) + std::to_string(k)), "partial");
  sc::save_safetensors(p, {{"new", filled<float>({2})}});
  CHECK(sc::load_safetensors(p).tensors.count("new") == 1);
  // That save took name next + 3; save_npy shares the writer and its numbers.
  const std::string pid_dot = ".tmp." + std::to_string(::getpid()) + ".";
  write_bytes(dir / ("x.npy" + pid_dot + std::to_string(next + 4)), "partial");
  sc::io::save_npy((dir / "x.npy").string(), filled<float>({2}));
  CHECK(same_bytes(sc::io::load_npy((dir / "x.npy").string()), filled<float>({2})));
  CHECK(dir.files().size() == 6);  // the leftovers stay: another process may still own them
}

TEST_CASE("safetensors: a load or restore while saves replace the file reads one whole file", "[safetensors][atomic]") {
  // The reader took the size of the path, then opened it: a save renamed over it in between paired
  // one file's size with the other's bytes, a spurious "corrupt" IOError (a few in 2000 loads here).
  TempDir dir;
  const fs::path p = dir / "ck.safetensors";
  sc::Variable a(filled<float>({4}), "a"), b(filled<double>({500}), "b");
  sc::Checkpoint small, big;
  small.track("a", a);
  big.track("a", a);
  big.track("b", b);
  small.save(p);
  const sctest::RaceResult r = sctest::race_reads([&](int i) { (i % 2 ? big : small).save(p); }, [&]() -> std::string {
    try {
      const sc::SafetensorsFile f = sc::load_safetensors(p);
      if (f.tensors.size() != 1 && f.tensors.size() != 2) return "load: " + std::to_string(f.tensors.size()) + " tensors";
    } catch (const sc::IOError& e) {
      return e.what();
    }
    try {
      small.restore(p);
    } catch (const sc::IOError& e) {  // the big file is a mismatch, reported as such
      if (std::string(e.what()).find("unexpected keys (1): b") == std::string::npos) return e.what();
    }
    return "";
  });
  INFO(r.last);
  CHECK(r.errors == 0);
  CHECK(same_bytes(a.value(), filled<float>({4})));
}

// ---- Checkpoint -------------------------------------------------------------------------
