// Test helpers for file I/O: a temporary directory removed at the end of the test, whole-file byte
// reads and writes (for corrupting files on purpose), and reads raced against rewrites.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace sctest {

/// A fresh directory, removed with everything in it at the end of the test.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "sc_test") {
    static int n = 0;
    path = std::filesystem::temp_directory_path() /
           (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::filesystem::path operator/(const std::string& name) const { return path / name; }
  /// The names of the files in it, sorted.
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

/// The whole file.
inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
/// Replaces the file with these bytes (a new file, not a truncated one: ext4 flushes truncated
/// files on close, which is slow).
inline void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::filesystem::remove(p);
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
/// Overwrites one byte in place (cheaper than rewriting the file: no truncation to flush).
inline void patch_byte(const std::filesystem::path& p, std::size_t pos, char c) {
  std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(static_cast<std::streamoff>(pos));
  f.put(c);
}

/// What race_reads() saw: the reads that found something wrong, and the last one's message.
struct RaceResult {
  int errors = 0;
  std::string last;
};
/// Calls write(i) for i = 0, 1, ... on another thread while `reads` calls of read() run here;
/// read() returns an empty string when what it read was whole, else what was wrong.
inline RaceResult race_reads(const std::function<void(int)>& write, const std::function<std::string()>& read,
                             int reads = 2000) {
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; !stop; ++i) write(i);
  });
  RaceResult r;
  for (int k = 0; k < reads; ++k)
    if (std::string what = read(); !what.empty()) {
      ++r.errors;
      r.last = std::move(what);
    }
  stop = true;
  writer.join();
  return r;
}

}  // namespace sctest
