// Kernels compiled at run time: NVRTC compiles a generated source (a traced function's fused
// elementwise group) against the elementwise rules the library embeds, the runtime loads it
// (cudaLibrary, no driver API), and both caches keep it: in memory by the whole source, and on
// disk by a hash of it, checked against the full key when read back.
#include <nvrtc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common.cuh"
#include "rtc_headers.inc"  // rtc_header_names, rtc_header_texts (generated at build time)

namespace stagecraft::cuda::kernels {
namespace {

constexpr int num_headers = static_cast<int>(sizeof(rtc_header_names) / sizeof(rtc_header_names[0]));

void put_log(char* log, std::size_t n, const std::string& m) {
  if (log != nullptr && n > 0) std::snprintf(log, n, "%s", m.c_str());
}

std::uint64_t fnv1a(std::string_view s, std::uint64_t h = 14695981039346656037ull) {
  for (const unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

/// NVRTC's options besides the architecture. No contraction of a * b + c into one rounding: each
/// rule rounds as its eager kernel does.
constexpr const char* compile_options[] = {"--std=c++20", "--fmad=false"};
constexpr int num_options = static_cast<int>(sizeof(compile_options) / sizeof(compile_options[0]));

/// What every compiled kernel depends on besides its source: NVRTC's version, the options and
/// the embedded headers' text (a new library version never reads an old cache file as its own).
const std::string& key_prefix() {
  static const std::string prefix = [] {
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    std::uint64_t h = 0;
    for (int i = 0; i < num_headers; ++i) h = fnv1a(rtc_header_texts[i], fnv1a(rtc_header_names[i], h));
    char buf[96];
    std::snprintf(buf, sizeof buf, "nvrtc %d.%d headers %016llx options", major, minor, static_cast<unsigned long long>(h));
    std::string p = buf;
    for (const char* o : compile_options) p.append(" ").append(o);
    return p + "\n";
  }();
  return prefix;
}

/// source compiled for sm_<arch>: a cubin when NVRTC knows the architecture, else PTX for the
/// newest one it knows below it (the driver compiles that for the GPU when loading it).
Status compile(const char* source, int arch, std::string& code, std::string& err) {
  int num = 0;
  if (nvrtcGetNumSupportedArchs(&num) != NVRTC_SUCCESS || num <= 0) {
    err = "NVRTC lists no GPU architectures";
    return rtc_compile_error;
  }
  std::vector<int> archs(static_cast<std::size_t>(num));
  nvrtcGetSupportedArchs(archs.data());
  const bool exact = std::find(archs.begin(), archs.end(), arch) != archs.end();
  int target = archs.front();
  for (int a : archs)
    if (a <= arch) target = std::max(target, a);
  const std::string arch_opt = (exact ? "-arch=sm_" : "-arch=compute_") + std::to_string(exact ? arch : target);
  nvrtcProgram p = nullptr;
  if (const nvrtcResult r = nvrtcCreateProgram(&p, source, "stagecraft_rtc.cu", num_headers, rtc_header_texts,
                                               rtc_header_names);
      r != NVRTC_SUCCESS) {
    err = nvrtcGetErrorString(r);
    return rtc_compile_error;
  }
  const char* opts[num_options + 1] = {arch_opt.c_str()};
  for (int i = 0; i < num_options; ++i) opts[i + 1] = compile_options[i];
  const nvrtcResult r = nvrtcCompileProgram(p, num_options + 1, opts);
  if (r != NVRTC_SUCCESS) {
    std::size_t n = 0;
    nvrtcGetProgramLogSize(p, &n);
    std::string log(n, '\0');
    if (n > 0) nvrtcGetProgramLog(p, log.data());
    while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    err = std::string(nvrtcGetErrorString(r)) + ": " + log;
    nvrtcDestroyProgram(&p);
    return rtc_compile_error;
  }
  std::size_t n = 0;
  if (exact) {
    nvrtcGetCUBINSize(p, &n);
    code.assign(n, '\0');
    nvrtcGetCUBIN(p, code.data());
  } else {
    nvrtcGetPTXSize(p, &n);  // with its terminating NUL, which the loader needs
    code.assign(n, '\0');
    nvrtcGetPTX(p, code.data());
  }
  nvrtcDestroyProgram(&p);
  return cudaSuccess;
}

// ---- the on-disk cache: "SCRTC001", key size, code size (u64 each), key, code ----------------

constexpr char magic[8] = {'S', 'C', 'R', 'T', 'C', '0', '0', '1'};
constexpr std::uint64_t max_cached_bytes = std::uint64_t{1} << 30;

std::filesystem::path cache_file(const char* dir, const std::string& key, int arch) {
  char name[64];
  std::snprintf(name, sizeof name, "%016llx-sm%d.bin", static_cast<unsigned long long>(fnv1a(key)), arch);
  return std::filesystem::path(dir) / name;
}

/// The code cached for key, or false (no file, another key, a short or corrupt file).
bool read_cached(const std::filesystem::path& f, const std::string& key, std::string& code) {
  std::ifstream in(f, std::ios::binary);
  if (!in) return false;
  char m[8];
  std::uint64_t nk = 0, nc = 0;
  if (!in.read(m, 8) || std::memcmp(m, magic, 8) != 0) return false;
  if (!in.read(reinterpret_cast<char*>(&nk), 8) || !in.read(reinterpret_cast<char*>(&nc), 8)) return false;
  if (nk != key.size() || nc == 0 || nc > max_cached_bytes) return false;
  std::string k(nk, '\0');
  if (!in.read(k.data(), static_cast<std::streamsize>(nk)) || k != key) return false;
  code.assign(nc, '\0');
  if (!in.read(code.data(), static_cast<std::streamsize>(nc))) return false;
  return in.peek() == std::char_traits<char>::eof();  // nothing after the code
}

/// Writes the cache file through a temporary in the same directory, renamed over the old one
/// (readers see the old file or the new one, never half of one). Failures only lose the cache.
void write_cached(const std::filesystem::path& f, const std::string& key, const std::string& code) {
  std::error_code ec;
  std::filesystem::create_directories(f.parent_path(), ec);
  static std::atomic<unsigned> counter{0};
  const std::filesystem::path tmp =
      f.string() + ".tmp." + std::to_string(static_cast<long>(::getpid())) + "." + std::to_string(counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return;
    const std::uint64_t nk = key.size(), nc = code.size();
    out.write(magic, 8);
    out.write(reinterpret_cast<const char*>(&nk), 8);
    out.write(reinterpret_cast<const char*>(&nc), 8);
    out.write(key.data(), static_cast<std::streamsize>(nk));
    out.write(code.data(), static_cast<std::streamsize>(nc));
    out.flush();
    if (!out) {
      out.close();
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, f, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

struct Cache {
  std::mutex mu;
  std::unordered_map<std::string, cudaLibrary_t> libraries;  // by key: arch + key prefix + source
  std::unordered_map<std::string, cudaKernel_t> kernels;     // by key + NUL + kernel name
  std::atomic<std::int64_t> compiled{0}, memory_hits{0}, disk_hits{0};
};
Cache& cache() {
  static Cache c;
  return c;
}

/// Loads code (kept for the process's lifetime, as its kernels are) and checks it has `name`.
Status load(const std::string& code, const char* name, cudaLibrary_t* lib, cudaKernel_t* out) {
  if (const auto e = cudaLibraryLoadData(lib, code.data(), nullptr, nullptr, 0, nullptr, nullptr, 0)) return e;
  if (const auto e = cudaLibraryGetKernel(out, *lib, name)) {
    cudaLibraryUnload(*lib);
    *lib = nullptr;
    return e;
  }
  return cudaSuccess;
}

}  // namespace
}  // namespace stagecraft::cuda::kernels

namespace stagecraft::cuda::abi {
using namespace stagecraft::cuda::kernels;

Status rtc_kernel(int device, const char* source, const char* name, const char* cache_dir, RtcKernel* out, char* log,
                  std::size_t log_size) noexcept {
  try {
    int major = 0, minor = 0;
    if (const auto e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)) return e;
    if (const auto e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device)) return e;
    const int arch = major * 10 + minor;
    const std::string key = "sm" + std::to_string(arch) + " " + key_prefix() + source;
    const std::string kernel_key = key + '\0' + name;
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mu);
    if (const auto it = c.kernels.find(kernel_key); it != c.kernels.end()) {
      ++c.memory_hits;
      *out = reinterpret_cast<RtcKernel>(it->second);
      return cudaSuccess;
    }
    cudaKernel_t k = nullptr;
    if (const auto it = c.libraries.find(key); it != c.libraries.end()) {  // another kernel of a loaded source
      if (const auto e = cudaLibraryGetKernel(&k, it->second, name)) return e;
      ++c.memory_hits;
    } else {
      const bool use_disk = cache_dir != nullptr && cache_dir[0] != '\0';
      const std::filesystem::path file = use_disk ? cache_file(cache_dir, key, arch) : std::filesystem::path();
      std::string code;
      cudaLibrary_t lib = nullptr;
      if (use_disk && read_cached(file, key, code) && load(code, name, &lib, &k) == cudaSuccess) {
        ++c.disk_hits;
      } else {
        cudaGetLastError();  // a failed load of a cached file is not the caller's error
        std::string err;
        if (const Status s = compile(source, arch, code, err)) {
          put_log(log, log_size, err);
          return s;
        }
        ++c.compiled;
        if (const auto e = load(code, name, &lib, &k)) return e;
        if (use_disk) write_cached(file, key, code);
      }
      c.libraries.emplace(key, lib);
    }
    c.kernels.emplace(kernel_key, k);
    *out = reinterpret_cast<RtcKernel>(k);
    return cudaSuccess;
  } catch (const std::exception& e) {  // allocation failures in the caches
    put_log(log, log_size, e.what());
    return cudaErrorMemoryAllocation;
  }
}

Status rtc_check(const char* source, int arch, std::size_t* cubin_bytes, char* log, std::size_t log_size) noexcept {
  try {
    std::string code, err;
    if (const Status s = compile(source, arch, code, err)) {
      put_log(log, log_size, err);
      return s;
    }
    *cubin_bytes = code.size();
    return cudaSuccess;
  } catch (const std::exception& e) {
    put_log(log, log_size, e.what());
    return cudaErrorMemoryAllocation;
  }
}

Status rtc_launch(RtcKernel k, void** args, std::int64_t n, Stream s) noexcept {
  if (n <= 0) return cudaSuccess;
  return cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3(grid_for(n)), dim3(block_threads), args, 0,
                          static_cast<cudaStream_t>(s));
}

void rtc_forget() noexcept {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.kernels.clear();
  c.libraries.clear();
}

RtcStats rtc_stats() noexcept {
  Cache& c = cache();
  return {c.compiled.load(), c.memory_hits.load(), c.disk_hits.load()};
}

}  // namespace stagecraft::cuda::abi
