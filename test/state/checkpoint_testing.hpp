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

/// A fresh directory, removed with everything in it at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    static int n = 0;  // one counter for both files: an inline function's static
    path = fs::temp_directory_path() / ("sc_ckpt_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path operator/(const std::string& name) const { return path / name; }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

inline std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
inline void write_bytes(const fs::path& p, const std::string& bytes) {
  fs::remove(p);  // a new file, not a truncated one: ext4 flushes truncated files on close (slow)
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
/// Overwrites one byte in place (cheaper than rewriting the file: no truncation to flush).
inline void patch_byte(const fs::path& p, std::size_t pos, char c) {
  std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(static_cast<std::streamoff>(pos));
  f.put(c);
}
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

/// Element i of the test pattern for T (includes extremes and, for floats, NaN/inf/-0).
template <class T>
T pattern(std::int64_t i) {
  if constexpr (std::is_same_v<T, bool>) return i % 3 == 0;
  else if constexpr (std::is_floating_point_v<T>) {
    const T special[] = {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(), T(-0.0),
                         std::numeric_limits<T>::lowest(), std::numeric_limits<T>::denorm_min()};
    return i < 5 ? special[i] : T(i) * T(0.37) - T(3);
  } else {
    return i == 0 ? std::numeric_limits<T>::min() : i == 1 ? std::numeric_limits<T>::max() : T(i * 7919 - 1000);
  }
}
template <class T>
sc::Tensor filled(const sc::Shape& s) {
  sc::Tensor t = sc::detail::empty_tensor(s, sc::dtype_of<T>(), sc::Device::cpu());
  if (t.numel() > 0) {
    T* p = t.data<T>();
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = pattern<T>(i);
  }
  return t;
}
inline sc::Tensor filled(const sc::Shape& s, sc::DType d) {
  switch (d) {
    case sc::DType::b8: return filled<bool>(s);
    case sc::DType::i32: return filled<std::int32_t>(s);
    case sc::DType::i64: return filled<std::int64_t>(s);
    case sc::DType::f32: return filled<float>(s);
    default: return filled<double>(s);
  }
}
inline bool same_bytes(const sc::Tensor& a, const sc::Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

/// The valid base case most corrupt-file tests start from: "w" F32 [2] = {1, 2}.
inline const std::string w_data("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);

}  // namespace sc_ckpt_test
using namespace sc_ckpt_test;
