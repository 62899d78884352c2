// The driver every fuzz target shares: the target defines LLVMFuzzerTestOneInput; built with
// AFL++ it runs in persistent shared-memory mode, built with a plain compiler it replays the
// files and directories named on its command line (what CTest does with fuzz/corpus/).
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <stagecraft/core/error.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace scfuzz {

/// Runs body; an exception of type Accepted (named `accepted` in the message) is an accepted
/// answer, any other exception is a bug, so it aborts (a crash to AFL, a failed test to CTest)
/// after saying what.
template <class Accepted, class F>
void expect_only(const char* what, const char* accepted, F&& body) {
  try {
    body();
  } catch (const Accepted&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[fuzz] %s threw something other than %s: %s\n", what, accepted, e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "[fuzz] %s threw a non-std exception\n", what);
    std::abort();
  }
}

/// Runs one read of untrusted bytes: IOError is the documented answer to a bad file.
template <class F>
void expect_only_ioerror(const char* what, F&& body) {
  expect_only<stagecraft::IOError>(what, "IOError", std::forward<F>(body));
}

/// Fails (aborts) when a read that succeeded breaks an invariant of its result.
inline void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "[fuzz] invariant broken: %s\n", what);
    std::abort();
  }
}

/// A per-process file holding `data`, for readers that take a path (in /dev/shm when there is
/// one, so the fuzzer does not write to disk on every run).
inline std::string scratch_file(const std::uint8_t* data, std::size_t size, const char* suffix) {
  static const std::string path = [&] {
    const std::filesystem::path dir =
        std::filesystem::is_directory("/dev/shm") ? std::filesystem::path("/dev/shm") : std::filesystem::temp_directory_path();
    return (dir / ("stagecraft_fuzz_" + std::to_string(::getpid()) + suffix)).string();
  }();
  static const bool removed_at_exit = [] { return std::atexit([] { std::filesystem::remove(path); }) == 0; }();
  (void)removed_at_exit;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  check(f != nullptr, "cannot create the scratch file");
  check(size == 0 || std::fwrite(data, 1, size, f) == size, "cannot write the scratch file");
  std::fclose(f);
  return path;
}

/// Replays one file; returns false when it cannot be read.
inline bool replay(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return false;
  const std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::fprintf(stderr, "%s (%zu bytes)\n", p.c_str(), bytes.size());
  LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  return true;
}

}  // namespace scfuzz

#ifdef __AFL_FUZZ_TESTCASE_LEN
__AFL_FUZZ_INIT();
// AFL++ persistent mode: the test case arrives in shared memory, 10000 runs per fork.
int main() {
  __AFL_INIT();
  const unsigned char* buf = __AFL_FUZZ_TESTCASE_BUF;
  while (__AFL_LOOP(10000)) LLVMFuzzerTestOneInput(buf, static_cast<std::size_t>(__AFL_FUZZ_TESTCASE_LEN));
  return 0;
}
#else
// Regression driver: every file named, and every file under every directory named (sorted).
int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
    return 2;
  }
  std::size_t n = 0;
  for (int i = 1; i < argc; ++i) {
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(argv[i])) {
      for (const auto& e : std::filesystem::recursive_directory_iterator(argv[i]))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());
    } else {
      files.emplace_back(argv[i]);
    }
    for (const auto& f : files) {
      if (!scfuzz::replay(f)) {
        std::fprintf(stderr, "cannot read %s\n", f.c_str());
        return 2;
      }
      ++n;
    }
  }
  std::fprintf(stderr, "%zu inputs, no failure\n", n);
  return n > 0 ? 0 : 2;
}
#endif
