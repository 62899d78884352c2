// Helpers of the safetensors and Checkpoint tests (test_safetensors.cpp, test_checkpoint.cpp).
#pragma once
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

#include "files.hpp"
#include "patterns.hpp"

namespace fs = std::filesystem;

namespace sc_ckpt_test {

/// Matches an exception whose what() contains every `has` fragment and no `lacks` fragment;
/// Has("a") && Has("b") and !Has("c") combine them.
class Says : public Catch::MatcherBase<std::exception> {
 public:
  std::vector<std::string> has, lacks;
  bool match(const std::exception& e) const override {
    const std::string w = e.what();
    for (const auto& h : has)
      if (w.find(h) == std::string::npos) return false;
    for (const auto& l : lacks)
      if (w.find(l) != std::string::npos) return false;
    return true;
  }
  std::string describe() const override {
    std::string d = "has a message";
    for (const auto& h : has) d += " containing \"" + h + "\"";
    for (const auto& l : lacks) d += " without \"" + l + "\"";
    return d;
  }
  friend Says operator&&(Says a, const Says& b) {
    a.has.insert(a.has.end(), b.has.begin(), b.has.end());
    a.lacks.insert(a.lacks.end(), b.lacks.begin(), b.lacks.end());
    return a;
  }
  friend Says operator!(Says a) {
    std::swap(a.has, a.lacks);
    return a;
  }
};
inline Says Has(std::string fragment) {
  Says s;
  s.has.push_back(std::move(fragment));
  return s;
}

using sctest::patch_byte;
using sctest::read_bytes;
using sctest::TempDir;
using sctest::write_bytes;

/// The 8-byte little-endian length, written byte by byte (independent of the writer under test).
inline std::string u64le(std::uint64_t n) {
  std::string s(8, '\0');
  for (int k = 0; k < 8; ++k) s[k] = static_cast<char>((n >> (8 * k)) & 0xFF);
  return s;
}
/// The header length a file's first 8 bytes give.
inline std::size_t header_length(const std::string& bytes) {
  std::uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | static_cast<unsigned char>(bytes[k]);
  return static_cast<std::size_t>(n);
}
/// A whole file from a header text (not padded) and the data section.
inline std::string file_bytes(const std::string& header, const std::string& data) { return u64le(header.size()) + header + data; }

using sctest::filled;
using sctest::same_bytes;
/// A tensor of shape s holding the test pattern of T.
template <class T>
sc::Tensor filled(const sc::Shape& s) {
  return sctest::filled(s, sc::dtype_of<T>());
}

/// The valid base case most corrupt-file tests start from: "w" F32 [2] = {1, 2}.
inline const std::string w_data("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);

}  // namespace sc_ckpt_test
using namespace sc_ckpt_test;
