// NumPy .npy reader/writer: round trips, NumPy's exact bytes, other writers' files, corrupt files, atomic saves.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <stagecraft/core/creation.hpp>
#include <stagecraft/fwd.hpp>
#include <stagecraft/io/npy.hpp>

#include "files.hpp"
#include "patterns.hpp"
#include "testing.hpp"

namespace fs = std::filesystem;
using Catch::Contains;  // v2's string matcher (test/catch2_v3 maps it for v3)

namespace {

using sctest::error_of;
using sctest::filled;
using sctest::read_bytes;
using sctest::same_bytes;
using sctest::TempDir;
using sctest::write_bytes;

/// An .npy file built by hand: magic, version major.0, the header's length (2 bytes for 1.0,
/// 4 for 2.0 and 3.0, little-endian), the header text exactly as given, then the data.
std::string npy(int major, const std::string& header, const std::string& data) {
  std::string s = std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0';
  for (int k = 0; k < (major == 1 ? 2 : 4); ++k) s += static_cast<char>((header.size() >> (8 * k)) & 0xFF);
  return s + header + data;
}
/// The dict NumPy writes for one array (unpadded).
std::string dict(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") + ", 'shape': " + shape + ", }";
}
/// The IOError message of reading these bytes (named "t.npy").
std::string err(const std::string& bytes) {
  return error_of<sc::IOError>([&] { sc::io::from_npy_bytes(bytes, "t.npy"); });
}
/// The message of a header that is otherwise well-formed: data to match "<f4" (2,) when needed.
std::string header_err(const std::string& header) { return err(npy(1, header, std::string(8, '\0'))); }


}  // namespace

TEST_CASE("npy round trip: every dtype, ranks 0..4, empty tensors", "[npy]") {
  TempDir dir("sc_npy");
  const std::vector<sc::Shape> shapes = {{}, {3}, {0}, {2, 3}, {2, 0, 4}, {2, 1, 3}, {1, 2, 3, 4}, {3, 0, 1, 2}};
  for (sc::DType d : {sc::boolean, sc::i32, sc::i64, sc::f32, sc::f64}) {
    for (const sc::Shape& s : shapes) {
      INFO(sc::name(d) << " " << s);
      const sc::Tensor t = filled(s, d);
      const std::string bytes = sc::io::to_npy_bytes(t);
      CHECK(bytes.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
      CHECK((bytes.size() - t.nbytes()) % 64 == 0);  // the data starts aligned
      CHECK(same_bytes(sc::io::from_npy_bytes(bytes, "mem"), t));  // bitwise: NaN, -0, denormals survive
      sc::io::save_npy(dir / "t.npy", t);
      CHECK(read_bytes(dir / "t.npy") == bytes);
      CHECK(same_bytes(sc::io::load_npy(dir / "t.npy"), t));
    }
  }
  CHECK(dir.files() == std::vector<std::string>{"t.npy"});
}

TEST_CASE("npy writes the bytes NumPy writes", "[npy]") {
  // f32 (2, 3) = 0..5: 59-byte dict + 20 spaces of room to grow + 38 of padding + '\n' = 118 (0x76).
  const std::string d23 = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  const std::string f32_data("\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00\x00\x40"
                             "\x00\x00\x40\x40\x00\x00\x80\x40\x00\x00\xa0\x40", 24);
  const std::string want = std::string("\x93NUMPY\x01\x00\x76\x00", 10) + d23 + std::string(58, ' ') + "\n" + f32_data;
  CHECK(sc::io::to_npy_bytes(sc::tensor({{0.f, 1.f, 2.f}, {3.f, 4.f, 5.f}})) == want);

  // A rank-0 f64: no growth room, 55 + 62 + 1 = 118.
  CHECK(sc::io::to_npy_bytes(sc::scalar(1.5)) ==
        std::string("\x93NUMPY\x01\x00\x76\x00", 10) + "{'descr': '<f8', 'fortran_order': False, 'shape': (), }" +
            std::string(62, ' ') + "\n" + std::string("\x00\x00\x00\x00\x00\x00\xf8\x3f", 8));
  // bool (3,): a 1-tuple keeps its comma; |b1 bytes are 0 and 1.
  CHECK(sc::io::to_npy_bytes(sc::tensor({true, false, true})) ==
        std::string("\x93NUMPY\x01\x00\x76\x00", 10) + "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }" +
            std::string(60, ' ') + "\n" + std::string("\x01\x00\x01", 3));
  // Empty i64 and a rank-4 i32.
  CHECK(sc::io::to_npy_bytes(sc::zeros({0}, sc::i64)) ==
        std::string("\x93NUMPY\x01\x00\x76\x00", 10) + "{'descr': '<i8', 'fortran_order': False, 'shape': (0,), }" +
            std::string(60, ' ') + "\n");
  std::string i32_data;
  for (int i = 0; i < 16; ++i) i32_data += std::string({static_cast<char>(i), '\0', '\0', '\0'});
  CHECK(sc::io::to_npy_bytes(sc::tensor(std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
                                        {2, 2, 2, 2})) ==
        std::string("\x93NUMPY\x01\x00\x76\x00", 10) +
            "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 2, 2, 2), }" + std::string(52, ' ') + "\n" +
            i32_data);
  // (NumPy pads a whole 64 more when 10 + header + 20 + '\n' is already a multiple of 64; for
  // '<f4' that needs a 44-character shape such as (0, 100000000000, 100000000000, 10000000000),
  // which is no longer a valid tensor: more than 2^62 bytes of strides.)
  CHECK_THROWS_AS(sc::zeros({0, 100000000000, 100000000000, 10000000000}), sc::ShapeError);
  // save_npy writes the same bytes.
  TempDir dir("sc_npy");
  sc::io::save_npy(dir / "a.npy", sc::tensor({{0.f, 1.f, 2.f}, {3.f, 4.f, 5.f}}));
  CHECK(read_bytes(dir / "a.npy") == want);
}

TEST_CASE("npy writes format 2.0 when the header needs a 4-byte length", "[npy]") {
  const std::string big = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }" + std::string(70000, ' ');
  const std::string h = sc::detail::npy::wrap_header(big);
  CHECK(h.substr(0, 8) == std::string("\x93NUMPY\x02\x00", 8));
  CHECK(h.size() % 64 == 0);
  const std::size_t len = static_cast<unsigned char>(h[8]) | static_cast<unsigned char>(h[9]) << 8 |
                          static_cast<std::size_t>(static_cast<unsigned char>(h[10])) << 16 |
                          static_cast<std::size_t>(static_cast<unsigned char>(h[11])) << 24;
  CHECK(len == h.size() - 12);
  CHECK(h.back() == '\n');
  const sc::Tensor t = sc::io::from_npy_bytes(h + std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8), "v2");
  CHECK(t.to_vector<float>() == std::vector<float>{1.f, 2.f});
}

TEST_CASE("npy reads format 2.0 and 3.0 and other writers' headers", "[npy]") {
  const std::string one_two("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);
  for (int major : {1, 2, 3}) {
    INFO("version " << major);
    CHECK(sc::io::from_npy_bytes(npy(major, dict("<f4", "(2,)") + "\n", one_two), "t").to_vector<float>() ==
          std::vector<float>{1.f, 2.f});
  }
  // Unpadded, no newline, double quotes, other key order, no trailing comma, (2, 1,), tabs.
  const std::string headers[] = {
      "{\"shape\": (2, 1,), \"fortran_order\": False, \"descr\": \"<f4\"}",
      "{'descr':'<f4','fortran_order':False,'shape':(2,1)}",
      " {\t'descr' : '<f4' ,\n 'fortran_order' : False , 'shape' : ( 2 , 1 , ) , }\r\n  ",
  };
  for (const std::string& h : headers) {
    INFO(h);
    const sc::Tensor t = sc::io::from_npy_bytes(npy(1, h, one_two), "t");
    CHECK(t.shape() == sc::Shape{2, 1});
    CHECK(t.to_vector<float>() == std::vector<float>{1.f, 2.f});
  }
  // Large extents of an empty tensor read while its strides stay addressable (2^62 bytes at most,
  // the rule for every tensor); beyond that the file is corrupt.
  CHECK(sc::io::from_npy_bytes(npy(1, dict("<f8", "(0, 1000000000, 1000000)"), ""), "t").shape() ==
        sc::Shape{0, 1000000000, 1000000});
  CHECK_THROWS_AS(sc::io::from_npy_bytes(npy(1, dict("<f8", "(0, 9223372036854775807)"), ""), "t"), sc::IOError);
}

TEST_CASE("npy reads big-endian data and widens small integer types", "[npy]") {
  const auto load = [](const std::string& descr, const std::string& shape, const std::string& data) {
    return sc::io::from_npy_bytes(npy(1, dict(descr, shape), data), descr);
  };
  CHECK(load(">f4", "(2,)", std::string("\x3f\x80\x00\x00\xc0\x00\x00\x00", 8)).to_vector<float>() ==
        std::vector<float>{1.f, -2.f});
  CHECK(load(">f8", "()", std::string("\x3f\xf8\x00\x00\x00\x00\x00\x00", 8)).item<double>() == 1.5);
  CHECK(load(">i4", "(2,)", std::string("\x00\x00\x01\x02\xff\xff\xff\xfe", 8)).to_vector<std::int32_t>() ==
        std::vector<std::int32_t>{258, -2});
  const sc::Tensor i8 = load(">i8", "(1,)", std::string("\x80\x00\x00\x00\x00\x00\x00\x07", 8));
  CHECK(i8.dtype() == sc::i64);
  CHECK(i8.item<std::int64_t>() == std::numeric_limits<std::int64_t>::min() + 7);
  CHECK(load(">b1", "(2,)", std::string("\x01\x00", 2)).to_vector<bool>() == std::vector<bool>{true, false});
  // Widened: every value of the smaller type survives.
  const sc::Tensor u1 = load("|u1", "(3,)", std::string("\x00\x7f\xff", 3));
  CHECK(u1.dtype() == sc::i32);
  CHECK(u1.to_vector<std::int32_t>() == std::vector<std::int32_t>{0, 127, 255});
  CHECK(load("|i1", "(2,)", "\x80\x7f").to_vector<std::int32_t>() == std::vector<std::int32_t>{-128, 127});
  CHECK(load(">u2", "(1,)", "\xff\xfe").to_vector<std::int32_t>() == std::vector<std::int32_t>{65534});
  CHECK(load("<i2", "(1,)", std::string("\x00\x80", 2)).to_vector<std::int32_t>() == std::vector<std::int32_t>{-32768});
  const sc::Tensor u4 = load("<u4", "(1,)", "\xff\xff\xff\xff");
  CHECK(u4.dtype() == sc::i64);
  CHECK(u4.item<std::int64_t>() == 4294967295);
}

TEST_CASE("npy reads fortran_order True into row-major tensors", "[npy]") {
  // np.asfortranarray(np.arange(6).reshape(2, 3)): columns are contiguous.
  std::string data;
  for (int v : {0, 3, 1, 4, 2, 5}) data += std::string({static_cast<char>(v), '\0', '\0', '\0'});
  const sc::Tensor t = sc::io::from_npy_bytes(npy(1, dict("<i4", "(2, 3)", true), data), "f");
  CHECK(t.shape() == sc::Shape{2, 3});
  CHECK(t.to_vector<std::int32_t>() == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5});

  // (2, 3, 4), element (i, j, k) = 12i + 4j + k stored at i + 2j + 6k; big-endian f8 on top.
  std::string f8(24 * 8, '\0');
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) {
        const double v = 12 * i + 4 * j + k;
        char b[8];
        std::memcpy(b, &v, 8);
        std::reverse(b, b + 8);
        std::memcpy(&f8[(i + 2 * j + 6 * k) * 8], b, 8);
      }
  const sc::Tensor t3 = sc::io::from_npy_bytes(npy(1, dict(">f8", "(2, 3, 4)", true), f8), "f");
  std::vector<double> want(24);
  for (int i = 0; i < 24; ++i) want[i] = i;
  CHECK(t3.to_vector<double>() == want);

  // Rank 0 and 1 are the same either way; empty tensors have no data.
  CHECK(sc::io::from_npy_bytes(npy(1, dict("<i4", "(2,)", true), data.substr(0, 8)), "f").to_vector<std::int32_t>() ==
        std::vector<std::int32_t>{0, 3});
  CHECK(sc::io::from_npy_bytes(npy(1, dict("|b1", "()", true), "\x01"), "f").item<bool>());
  CHECK(sc::io::from_npy_bytes(npy(1, dict("<f4", "(0, 3)", true), ""), "f").shape() == sc::Shape{0, 3});

  TempDir dir("sc_npy");  // the file reader takes the same path
  write_bytes(dir / "f.npy", npy(1, dict("<i4", "(2, 3)", true), data));
  CHECK(sc::io::load_npy(dir / "f.npy").to_vector<std::int32_t>() == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5});
}

TEST_CASE("npy: a truncated or overlong file is an IOError", "[npy]") {
  TempDir dir("sc_npy");
  const std::string bytes = sc::io::to_npy_bytes(filled({2, 3}, sc::f32));
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    INFO("truncated to " << n << " of " << bytes.size() << " bytes");
    const char* why = n < 8 ? "ends inside the magic string and version"
                      : n < 10 ? "ends inside the header length"
                      : n < 128 ? "runs past the end of the"
                                : "needs 24 (truncated?)";
    CHECK_THAT(err(bytes.substr(0, n)), Contains(why) && Contains("truncated") && Contains("'t.npy' is corrupt"));
    write_bytes(dir / "cut.npy", bytes.substr(0, n));
    CHECK_THAT(error_of<sc::IOError>([&] { sc::io::load_npy(dir / "cut.npy"); }),
               Contains(why) && Contains("[load_npy]") && Contains("cut.npy") && Contains("test_npy.cpp"));
  }
  CHECK_THAT(err(bytes + "!!"), Contains("2 bytes of trailing data after the 24 bytes that <f4 [2, 3] needs"));
  write_bytes(dir / "long.npy", bytes + "!");
  CHECK_THAT(error_of<sc::IOError>([&] { sc::io::load_npy(dir / "long.npy"); }), Contains("1 bytes of trailing data"));
}

TEST_CASE("npy: bad magic, versions and header lengths are IOErrors", "[npy]") {
  const std::string good = sc::io::to_npy_bytes(sc::scalar(1.f));
  std::string b = good;
  b[1] = 'n';
  CHECK_THAT(err(b), Contains("bad magic"));
  CHECK_THAT(err("PK\x03\x04"), Contains("bad magic"));
  CHECK_THAT(err(""), Contains("ends inside the magic string") && Contains("0 bytes"));
  b = good;
  b[6] = 4;
  CHECK_THAT(err(b), Contains("unknown format version 4.0"));
  b = good;
  b[7] = 1;
  CHECK_THAT(err(b), Contains("unknown format version 1.1"));
  b = good;
  b[6] = 0;
  CHECK_THAT(err(b), Contains("unknown format version 0.0"));
  b = good;
  b[8] = '\xff';
  b[9] = '\xff';
  CHECK_THAT(err(b), Contains("the header length 65535 runs past the end of the 132-byte file"));
  CHECK_THAT(err(std::string("\x93NUMPY\x02\x00\xff\xff\xff\xff", 12)), Contains("over the 1048576-byte limit"));
  CHECK_THAT(err(std::string("\x93NUMPY\x03\x00\x00\x00\x00", 11)), Contains("ends inside the header length"));
}

TEST_CASE("npy: malformed headers are IOErrors naming the problem", "[npy]") {
  const std::string f2 = "'fortran_order': False, 'shape': (2,)";
  const std::pair<std::string, std::string> cases[] = {
      {"", "not a dict literal"},
      {"[('descr', '<f4')]", "not a dict literal"},
      {"\"{'descr': '<f4'}\"", "not a dict literal"},
      {"{'descr': '<f4', 'shape': (2,)}", "lacks the key 'fortran_order'"},
      {"{'descr': '<f4', 'fortran_order': False}", "lacks the key 'shape'"},
      {"{" + f2 + "}", "lacks the key 'descr'"},
      {"{}", "lacks the key 'descr'"},
      {"{'descr': '<f4', 'descr': '<f4', " + f2 + "}", "the key 'descr' appears twice"},
      {"{'descr': '<f4', 'extra': 1, " + f2 + "}", "unexpected key 'extra'"},
      {"{descr: '<f4', " + f2 + "}", "expected a key"},
      {"{'descr': '<f4' " + f2 + "}", "expected ',' or '}' after a value"},
      {"{'descr': '<f4', " + f2, "found the end of the header"},
      {"{'descr': '<f4', " + f2 + "} x", "unexpected bytes after the closing '}'"},
      {"{'descr': '<f4', " + f2 + std::string("}\0", 2), "unexpected bytes after the closing '}'"},
      {"{'descr' '<f4', " + f2 + "}", "expected ':' after a key"},
      {"{'descr': '<f4", "header byte 10: unterminated string"},
      {"{'descr': 'f4\\n', " + f2 + "}", "escapes and newlines in strings"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", "fortran_order must be True or False"},
      {"{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2,)}", "fortran_order must be True or False"},
      {"{'descr': <f4, " + f2 + "}", "expected descr (a quoted string)"},
      {"{'descr': [('a', '<f4')], " + f2 + "}", "structured dtypes are not supported"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", "shape must be a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2)}", "shape (2) is an int, not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2L,)}", "extent is not a plain integer"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2.0,)}", "extent is not a plain integer"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1_0,)}", "extent is not a plain integer"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (02,)}", "leading zero"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (+2,)}", "expected an integer extent"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,,)}", "expected an integer extent"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2 2)}", "expected ',' or ')' in the shape"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, -1)}", "shape has a negative extent -1"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (9223372036854775808,)}", "larger than an int64"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,)}", "larger than an int64"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1)}",
       "more than 8 extents (stagecraft's max_rank)"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 2147483648)}",
       "shape [4294967296, 2147483648] of <f4 has too many elements or bytes to address"},
      {"{'descr': '<f8', 'fortran_order': False, 'shape': (1152921504606846976,)}", "too many elements or bytes"},
      {"{'descr': '|u1', 'fortran_order': False, 'shape': (3037000500, 3037000500)}", "too many elements or bytes"},
  };
  for (const auto& [header, why] : cases) {
    INFO(header);
    const std::string e = header_err(header);
    CHECK_THAT(e, Contains(why) && Contains("[from_npy_bytes] 't.npy' is corrupt: ") && Contains("test_npy.cpp"));
  }
}

TEST_CASE("npy: unknown and unsupported descrs are IOErrors", "[npy]") {
  const auto descr_err = [](const std::string& d) { return header_err(dict(d, "(2,)")); };
  for (const char* d : {"<x4", "f4", "<f", "<f4x", "<f004", "<f0004", "", "|O"}) {
    INFO(d);
    CHECK_THAT(descr_err(d), Contains("unknown descr '" + std::string(d) + "'"));
  }
  for (const char* d : {"<f2", "<c8", "<u8", "|S5", "<U3", "<M8", "<f16"}) {
    INFO(d);
    CHECK_THAT(descr_err(d), Contains("descr '" + std::string(d) + "' is valid NumPy but has no stagecraft dtype"));
  }
  CHECK_THAT(descr_err("=f4"), Contains("does not name a byte order"));
  CHECK_THAT(descr_err("|f4"), Contains("does not name a byte order"));
}

TEST_CASE("npy: data that does not fit the shape is an IOError", "[npy]") {
  CHECK_THAT(err(npy(1, dict("<f4", "(2, 3)"), std::string(23, '\0'))),
             Contains("the data has 23 bytes, but <f4 [2, 3] needs 24 (truncated?)"));
  CHECK_THAT(err(npy(1, dict("<f4", "(0,)"), "x")), Contains("1 bytes of trailing data after the 0 bytes"));
  CHECK_THAT(err(npy(1, dict("|u1", "(2,)"), "abc")),
             Contains("1 bytes of trailing data after the 2 bytes that |u1 [2]"));
  CHECK_THAT(err(npy(1, dict(">i8", "()"), "1234567")), Contains("but >i8 [] needs 8"));
  // A bool byte other than 0 or 1, in either layout.
  CHECK_THAT(err(npy(1, dict("|b1", "(3,)"), std::string("\x01\x00\x02", 3))),
             Contains("bool data holds the byte 2 at element 2"));
  CHECK_THAT(err(npy(1, dict("|b1", "(2, 2)", true), std::string("\x01\x00\x00\xff", 4))),
             Contains("bool data holds the byte 255 at element 3"));
  TempDir dir("sc_npy");
  write_bytes(dir / "b.npy", npy(1, dict("|b1", "(3,)"), std::string("\x01\x00\x80", 3)));
  CHECK_THAT(error_of<sc::IOError>([&] { sc::io::load_npy(dir / "b.npy"); }), Contains("holds the byte 128"));
}

TEST_CASE("npy: missing files and non-files are IOErrors", "[npy]") {
  TempDir dir("sc_npy");
  CHECK_THAT(error_of<sc::IOError>([&] { sc::io::load_npy(dir / "nope.npy"); }),
             Contains("no such file") && Contains("[load_npy]") && Contains("nope.npy") && Contains("test_npy.cpp"));
  CHECK_THAT(error_of<sc::IOError>([&] { sc::io::load_npy(dir.path.string()); }), Contains("is not a regular file"));
  CHECK_THAT(error_of<sc::IOError>([&] { sc::io::load_npy("/dev/null"); }), Contains("is not a regular file"));
}

TEST_CASE("npy: byte mutations never crash (IOError or a clean load)", "[npy]") {
  for (const sc::Tensor& t : {filled({2, 2}, sc::f32), filled({3}, sc::boolean), filled({}, sc::i64)}) {
    const std::string good = sc::io::to_npy_bytes(t);
    int loaded = 0, rejected = 0;
    for (std::size_t i = 0; i < good.size(); ++i) {
      const auto b = static_cast<unsigned char>(good[i]);
      for (unsigned v : {0x00u, 0xFFu, 0x80u, unsigned('\''), unsigned('}'), unsigned(','), unsigned(')'),
                         unsigned('9'), unsigned(' '), unsigned('-'), b ^ 1u, (b + 1u) & 0xFFu}) {
        std::string m = good;
        m[i] = static_cast<char>(v);
        try {
          sc::io::from_npy_bytes(m, "m");
          ++loaded;
        } catch (const sc::IOError&) {
          ++rejected;
        }
      }
    }
    CHECK(loaded > 0);    // mutations of the padding and data load
    CHECK(rejected > 0);  // mutations of the preamble and dict do not
  }
}

TEST_CASE("npy saves are atomic: a failed save leaves the old file intact", "[npy][atomic]") {
  TempDir dir("sc_npy");
  const std::string p = dir / "x.npy";
  sc::io::save_npy(p, filled({3}, sc::f64));
  const std::string old = read_bytes(p);
  const sc::Tensor big = filled({64}, sc::f32);
  for (std::uint64_t fail_at : {std::uint64_t{1}, std::uint64_t{128}, std::uint64_t{128 + 256}}) {
    INFO("failing once " << fail_at << " bytes are written");
    sc::detail::safetensors::write_hook = [fail_at](std::uint64_t written) {
      if (written >= fail_at) throw std::runtime_error("simulated disk failure");
    };
    CHECK_THAT(error_of<sc::IOError>([&] { sc::io::save_npy(p, big); }),
               Contains("simulated disk failure") && Contains("[save_npy]") && Contains("test_npy.cpp"));
    sc::detail::safetensors::write_hook = nullptr;
    CHECK(read_bytes(p) == old);
    CHECK(dir.files() == std::vector<std::string>{"x.npy"});  // the temporary file is gone
  }
  // The directory does not exist: nothing is created.
  CHECK_THAT(error_of<sc::IOError>([&] { sc::io::save_npy(dir / "no/x.npy", big); }),
             Contains("cannot create the temporary file") && Contains("No such file"));
  // The target is a directory: the rename fails and the temporary file is removed.
  fs::create_directory(dir.path / "adir");
  CHECK_THAT(error_of<sc::IOError>([&] { sc::io::save_npy(dir / "adir", big); }), Contains("cannot rename"));
  CHECK(dir.files() == std::vector<std::string>{"adir", "x.npy"});
  // A successful save replaces the file and leaves nothing else behind.
  sc::io::save_npy(p, big);
  CHECK(same_bytes(sc::io::load_npy(p), big));
  CHECK(dir.files() == std::vector<std::string>{"adir", "x.npy"});
}

TEST_CASE("npy: a load while saves replace the file reads one whole file", "[npy][atomic]") {
  // The reader took the size of the path, then opened it: a save renamed over it in between paired
  // one file's size with the other's bytes, a spurious "corrupt" IOError (a few in 2000 loads here).
  TempDir dir("sc_npy");
  const std::string p = dir / "x.npy";
  const sc::Tensor small = filled({4}, sc::f32), big = filled({1000}, sc::f32);
  sc::io::save_npy(p, small);
  const sctest::RaceResult r = sctest::race_reads([&](int i) { sc::io::save_npy(p, i % 2 ? big : small); },
                                                  [&]() -> std::string {
                                                    try {
                                                      const sc::Tensor t = sc::io::load_npy(p);
                                                      return same_bytes(t, t.numel() == 4 ? small : big) ? "" : "mixed";
                                                    } catch (const sc::IOError& e) {
                                                      return e.what();
                                                    }
                                                  });
  INFO(r.last);
  CHECK(r.errors == 0);
}

TEST_CASE("npy writers need a defined, concrete tensor", "[npy]") {
  TempDir dir("sc_npy");
  CHECK_THAT(error_of<sc::ValueError>([&] { sc::io::save_npy(dir / "u.npy", sc::Tensor()); }),
             Contains("[save_npy] got an undefined tensor") && Contains("test_npy.cpp"));
  CHECK_THAT(error_of<sc::ValueError>([&] { sc::io::to_npy_bytes(sc::Tensor()); }), Contains("[to_npy_bytes]"));
  CHECK(dir.files().empty());
}
