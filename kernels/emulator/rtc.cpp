// The emulator's run-time compiled kernels (kernels/rtc.cu on the host): a generated CUDA source
// is compiled by the host's C++ compiler as a shared library (CUDA's keywords and thread indices
// defined for the host by a prelude), loaded, and launched block by block. A kernel that meets at
// __syncthreads (or shuffles values between threads) runs its block's threads as fibers
// (ucontext), each run up to its next barrier in turn, so every barrier is reached by all threads
// before any goes on, as on a GPU. Cached as
// kernels/rtc.cu caches: in memory by the whole source, and on disk (one file per source).
#include <dlfcn.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <unordered_map>
#include <vector>

#include "emu.hpp"

#ifndef STAGECRAFT_EMU_CXX
#define STAGECRAFT_EMU_CXX "c++"
#endif
#ifndef STAGECRAFT_EMU_INCLUDE
#define STAGECRAFT_EMU_INCLUDE "."
#endif

namespace stagecraft::cuda::emu {
namespace {

namespace fs = std::filesystem;

void put_log(char* log, std::size_t n, const std::string& m) {
  if (log != nullptr && n > 0) std::snprintf(log, n, "%s", m.c_str());
}

std::uint64_t fnv1a(std::string_view s, std::uint64_t h = 14695981039346656037ull) {
  for (const unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string env_or(const char* name, const char* fallback) {
  const char* e = std::getenv(name);
  return e != nullptr && e[0] != '\0' ? e : fallback;
}
/// The compiler and the include directory kernels are built with ($STAGECRAFT_EMU_CXX and
/// $STAGECRAFT_EMU_INCLUDE, else those the library was built with).
const std::string& compiler() {
  static const std::string c = env_or("STAGECRAFT_EMU_CXX", STAGECRAFT_EMU_CXX);
  return c;
}
const std::string& include_dir() {
  static const std::string d = env_or("STAGECRAFT_EMU_INCLUDE", STAGECRAFT_EMU_INCLUDE);
  return d;
}
/// No contraction of a * b + c: each rule rounds apart, as NVRTC's --fmad=false.
constexpr const char* flags = "-std=c++20 -O1 -shared -fPIC -w -ffp-contract=off";

/// CUDA for the host. The thread indices are the library's globals: the launcher below sets the
/// block's, and the fiber scheduler the thread's before each fiber resumes.
constexpr const char* prelude = R"(#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
struct sc_dim3 { unsigned x, y, z; };
extern "C" {
sc_dim3 blockIdx{0, 0, 0}, blockDim{256, 1, 1}, gridDim{1, 1, 1}, threadIdx{0, 0, 0};
}
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(16) double2 { double x, y; };
struct alignas(16) longlong2 { long long x, y; };
static void (*sc_emu_sync)() = nullptr;
static inline void __syncthreads() { sc_emu_sync(); }
// A warp shuffle: every live thread of the block posts its value, all have posted before any
// reads, all have read before the next posts (the threads run as fibers, as for __syncthreads;
// a kernel's lanes that shuffle together reach each shuffle together).
template <class V>
static inline V __shfl_xor_sync(unsigned, V v, int lane_mask) {
  static V posted[1024];
  posted[threadIdx.x] = v;
  sc_emu_sync();
  const V r = posted[threadIdx.x ^ static_cast<unsigned>(lane_mask)];
  sc_emu_sync();
  return r;
}
extern "C" void sc_emu_set_sync(void (*f)()) { sc_emu_sync = f; }
namespace sc_emu {
using Fibers = void (*)(unsigned n, void (*body)(void*), void* arg, unsigned* tid);
template <class A>
A untag(A v) {
  if constexpr (std::is_pointer_v<A>) return reinterpret_cast<A>(reinterpret_cast<std::uintptr_t>(v) & ~(std::uintptr_t{1} << 62));
  else return v;
}
template <class... A, std::size_t... I>
void* pack(void** args, std::index_sequence<I...>) { return new std::tuple<A...>(untag(*static_cast<A*>(args[I]))...); }
template <class... A>
void* pack(void (*)(A...), void** args) { return pack<A...>(args, std::index_sequence_for<A...>{}); }
template <class... A>
void drop(void (*)(A...), void* p) { delete static_cast<std::tuple<A...>*>(p); }
template <class... A>
struct Call {
  void (*k)(A...);
  std::tuple<A...>* t;
  static void body(void* c) { auto* x = static_cast<Call*>(c); std::apply(x->k, *x->t); }
};
template <class... A>
void run(void (*k)(A...), void* p, unsigned grid, unsigned block, Fibers fibers) {
  Call<A...> c{k, static_cast<std::tuple<A...>*>(p)};
  gridDim = {grid, 1, 1};
  blockDim = {block, 1, 1};
  for (unsigned b = 0; b < grid; ++b) {
    blockIdx = {b, 0, 0};
    if (fibers != nullptr) {
      fibers(block, &Call<A...>::body, &c, &threadIdx.x);
    } else {
      for (unsigned t = 0; t < block; ++t) {
        threadIdx = {t, 0, 0};
        Call<A...>::body(&c);
      }
    }
  }
}
}  // namespace sc_emu
)";

/// The launcher functions of kernel `name` (pack its parameters, run it, free the pack).
std::string adapters(const std::string& name) {
  return "extern \"C\" void* sc_emu_pack_" + name + "(void** a) { return sc_emu::pack(&" + name + ", a); }\n" +
         "extern \"C\" void sc_emu_drop_" + name + "(void* p) { sc_emu::drop(&" + name + ", p); }\n" +
         "extern \"C\" void sc_emu_run_" + name + "(void* p, unsigned g, unsigned b, sc_emu::Fibers f) { sc_emu::run(&" +
         name + ", p, g, b, f); }\n";
}

/// The host library's text for a generated source: prelude, source, a launcher per kernel.
std::string library_source(const std::string& source) {
  std::string s = prelude;
  s += "#line 1 \"stagecraft_rtc.cu\"\n";
  s += source;
  s += "\n";
  static const std::regex kernel(R"(extern\s+"C"\s+__global__\s+void\s+([A-Za-z_][A-Za-z0-9_]*)\s*\()");
  for (auto it = std::sregex_iterator(source.begin(), source.end(), kernel); it != std::sregex_iterator(); ++it)
    s += adapters((*it)[1].str());
  return s;
}

/// A private directory for this process's builds and loaded copies (removed at exit).
const fs::path& work_dir() {
  // Never destroyed: the exit handler that removes the directory runs after static destructors.
  static const fs::path* const d = [] {
    auto* p = new fs::path(fs::temp_directory_path() / ("stagecraft_emu_" + std::to_string(static_cast<long>(::getpid()))));
    std::error_code ec;
    fs::create_directories(*p, ec);
    std::atexit([] {
      std::error_code e;
      fs::remove_all(work_dir(), e);
    });
    return p;
  }();
  return *d;
}

std::atomic<unsigned> counter{0};

/// Builds the library of `source` into a new file of work_dir(); its path, or empty and err.
fs::path build(const std::string& source, std::string& err) {
  const std::string stem = "k" + std::to_string(counter++);
  const fs::path dir = work_dir();
  {
    std::ofstream out(dir / (stem + ".cpp"));
    out << library_source(source);
    if (!out) {
      err = "cannot write " + (dir / (stem + ".cpp")).string();
      return {};
    }
  }
  // Built in its directory by relative names: the library's bytes do not depend on where it is.
  const std::string cmd = "cd '" + dir.string() + "' && '" + compiler() + "' " + flags + " -I'" + include_dir() + "' " +
                          stem + ".cpp -o " + stem + ".so 2> " + stem + ".log";
  if (std::system(cmd.c_str()) != 0) {
    std::ifstream log(dir / (stem + ".log"));
    err = std::string(std::istreambuf_iterator<char>(log), {});
    if (err.empty()) err = "the host compiler failed: " + cmd;
    return {};
  }
  return dir / (stem + ".so");
}

/// A loaded library's kernel: its launchers, and whether it meets at __syncthreads.
struct Kernel {
  void* (*pack)(void**) = nullptr;
  void (*drop)(void*) = nullptr;
  void (*run)(void*, unsigned, unsigned, void (*)(unsigned, void (*)(void*), void*, unsigned*)) = nullptr;
  bool barriers = false;
};

// ---- fibers: the threads of a block that meets at barriers ----------------------------------

struct Scheduler {
  std::vector<ucontext_t> ctx;
  std::vector<std::unique_ptr<char[]>> stacks;
  std::vector<char> done;
  ucontext_t main{};
  unsigned current = 0;
  void (*body)(void*) = nullptr;
  void* arg = nullptr;
};
thread_local Scheduler sched;
constexpr std::size_t fiber_stack = 256 * 1024;

void fiber_entry() {
  sched.body(sched.arg);
  sched.done[sched.current] = 1;  // returns to sched.main (uc_link)
}

/// __syncthreads: back to the scheduler, which runs the other threads up to the barrier first.
void fiber_sync() { swapcontext(&sched.ctx[sched.current], &sched.main); }

void run_fibers(unsigned n, void (*body)(void*), void* arg, unsigned* tid) {
  Scheduler& s = sched;
  s.body = body;
  s.arg = arg;
  s.ctx.resize(n);
  s.done.assign(n, 0);
  while (s.stacks.size() < n) s.stacks.push_back(std::make_unique<char[]>(fiber_stack));
  for (unsigned t = 0; t < n; ++t) {
    getcontext(&s.ctx[t]);
    s.ctx[t].uc_stack.ss_sp = s.stacks[t].get();
    s.ctx[t].uc_stack.ss_size = fiber_stack;
    s.ctx[t].uc_link = &s.main;
    makecontext(&s.ctx[t], &fiber_entry, 0);
  }
  for (bool left = true; left;) {
    left = false;
    for (unsigned t = 0; t < n; ++t) {
      if (s.done[t]) continue;
      *tid = t;
      s.current = t;
      swapcontext(&s.main, &s.ctx[t]);
      left = left || !s.done[t];
    }
  }
}

// ---- the caches -----------------------------------------------------------------------------

struct Library {
  void* handle = nullptr;
  bool barriers = false;
};

struct Cache {
  std::mutex mu;
  std::unordered_map<std::string, Library> libraries;  // by key
  std::unordered_map<std::string, Kernel*> kernels;    // by key + NUL + name (never freed)
  std::vector<Kernel*> forgotten;  // rtc_forget's: still valid (a plan may launch them), held here
  std::atomic<std::int64_t> compiled{0}, memory_hits{0}, disk_hits{0};
};
Cache& cache() {
  static Cache* c = new Cache();  // kernels may launch until the process ends
  return *c;
}

/// Loads a private copy of the library built at `file` (the cache's files may be replaced or cut
/// later; a library mapped from a file cut short faults when touched).
bool load(const fs::path& file, const std::string& source, Library& out) {
  const fs::path copy = work_dir() / ("load" + std::to_string(counter++) + ".so");
  std::error_code ec;
  fs::copy_file(file, copy, fs::copy_options::overwrite_existing, ec);
  if (ec) return false;
  void* h = ::dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return false;
  auto set_sync = reinterpret_cast<void (*)(void (*)())>(::dlsym(h, "sc_emu_set_sync"));
  if (set_sync == nullptr) {
    ::dlclose(h);
    return false;
  }
  set_sync(&fiber_sync);
  out.handle = h;
  out.barriers = source.find("__syncthreads") != std::string::npos || source.find("__shfl_") != std::string::npos;
  return true;
}

// ---- the on-disk cache: "SCEMU001", key size, library size, the library's hash (u64 each), key,
// library. Checked whole before the library is loaded: a corrupt file is rebuilt, never mapped.

constexpr char magic[8] = {'S', 'C', 'E', 'M', 'U', '0', '0', '1'};
constexpr std::uint64_t max_cached_bytes = std::uint64_t{1} << 30;

std::string read_all(const fs::path& f) {
  std::ifstream in(f, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// The library cached for key, written to a file of work_dir(), or empty.
fs::path read_cached(const fs::path& f, const std::string& key) {
  const std::string all = read_all(f);
  if (all.size() < 32 || all.compare(0, 8, magic, 8) != 0) return {};
  std::uint64_t nk = 0, nl = 0, h = 0;
  std::memcpy(&nk, all.data() + 8, 8);
  std::memcpy(&nl, all.data() + 16, 8);
  std::memcpy(&h, all.data() + 24, 8);
  if (nk != key.size() || nl == 0 || nl > max_cached_bytes || all.size() != 32 + nk + nl) return {};
  if (all.compare(32, nk, key) != 0) return {};
  const std::string_view lib(all.data() + 32 + nk, nl);
  if (fnv1a(lib) != h) return {};
  const fs::path out = work_dir() / ("cached" + std::to_string(counter++) + ".so");
  std::ofstream o(out, std::ios::binary);
  o.write(lib.data(), static_cast<std::streamsize>(lib.size()));
  return o ? out : fs::path();
}

/// Writes the library at `built` to cache file f through a temporary in f's directory, renamed
/// over the old one (readers see the old file or the new one). Failures only lose the cache.
void write_cached(const fs::path& f, const std::string& key, const fs::path& built) {
  const std::string lib = read_all(built);
  if (lib.empty()) return;
  std::error_code ec;
  fs::create_directories(f.parent_path(), ec);
  const fs::path tmp = f.string() + ".tmp." + std::to_string(static_cast<long>(::getpid())) + "." + std::to_string(counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return;
    const std::uint64_t nk = key.size(), nl = lib.size(), h = fnv1a(lib);
    out.write(magic, 8);
    out.write(reinterpret_cast<const char*>(&nk), 8);
    out.write(reinterpret_cast<const char*>(&nl), 8);
    out.write(reinterpret_cast<const char*>(&h), 8);
    out.write(key.data(), static_cast<std::streamsize>(nk));
    out.write(lib.data(), static_cast<std::streamsize>(nl));
    out.flush();
    if (!out) {
      out.close();
      fs::remove(tmp, ec);
      return;
    }
  }
  fs::rename(tmp, f, ec);
  if (ec) fs::remove(tmp, ec);
}

Kernel* find_kernel(const Library& lib, const char* name) {
  const std::string n = name;
  auto k = std::make_unique<Kernel>();
  k->pack = reinterpret_cast<void* (*)(void**)>(::dlsym(lib.handle, ("sc_emu_pack_" + n).c_str()));
  k->drop = reinterpret_cast<void (*)(void*)>(::dlsym(lib.handle, ("sc_emu_drop_" + n).c_str()));
  k->run = reinterpret_cast<decltype(k->run)>(::dlsym(lib.handle, ("sc_emu_run_" + n).c_str()));
  k->barriers = lib.barriers;
  if (k->pack == nullptr || k->drop == nullptr || k->run == nullptr) return nullptr;
  return k.release();
}

/// What a cached library depends on besides its source: the compiler, its flags, the rules, the prelude.
const std::string& key_prefix() {
  static const std::string p = [] {
    std::string text;
    for (const char* file : {"rules.inc", "rules_pow.inc"}) {
      std::ifstream rules(fs::path(include_dir()) / "stagecraft" / "ops" / file);
      text.append(std::istreambuf_iterator<char>(rules), {});
    }
    return "emu " + compiler() + " " + flags + " rules " + std::to_string(fnv1a(text)) + " prelude " +
           std::to_string(fnv1a(prelude)) + "\n";
  }();
  return p;
}

/// One launch at a time: the libraries' thread indices and shared arrays are globals.
std::mutex& launch_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace
}  // namespace stagecraft::cuda::emu

namespace stagecraft::cuda::abi {
using namespace stagecraft::cuda::emu;

Status rtc_kernel(int device, const char* source, const char* name, const char* cache_dir, RtcKernel* out, char* log,
                  std::size_t log_size) noexcept {
  try {
    if (device < 0 || device >= device_count()) return invalid_device;
    const std::string key = key_prefix() + source;
    const std::string kernel_key = key + '\0' + name;
    Cache& c = cache();
    const std::lock_guard<std::mutex> lock(c.mu);
    if (const auto it = c.kernels.find(kernel_key); it != c.kernels.end()) {
      ++c.memory_hits;
      *out = it->second;
      return ok;
    }
    auto lib = c.libraries.find(key);
    if (lib != c.libraries.end()) {
      ++c.memory_hits;
    } else {
      const bool use_disk = cache_dir != nullptr && cache_dir[0] != '\0';
      char file_name[64];
      std::snprintf(file_name, sizeof file_name, "%016llx-emu.so", static_cast<unsigned long long>(fnv1a(key)));
      const fs::path file = use_disk ? fs::path(cache_dir) / file_name : fs::path();
      Library l;
      std::error_code ec;
      fs::path cached;
      if (use_disk && fs::exists(file, ec) && !(cached = read_cached(file, key)).empty() && load(cached, source, l)) {
        ++c.disk_hits;
      } else {
        std::string err;
        const fs::path built = build(source, err);
        if (built.empty()) {
          put_log(log, log_size, err);
          return rtc_compile_error;
        }
        ++c.compiled;
        if (!load(built, source, l)) {
          put_log(log, log_size, std::string("cannot load ") + built.string() + ": " + ::dlerror());
          return rtc_compile_error;
        }
        if (use_disk) write_cached(file, key, built);
      }
      lib = c.libraries.emplace(key, l).first;
    }
    Kernel* k = find_kernel(lib->second, name);
    if (k == nullptr) {
      put_log(log, log_size, std::string("no kernel named ") + name);
      return invalid_value;  // as cudaLibraryGetKernel's error
    }
    c.kernels.emplace(kernel_key, k);
    *out = k;
    return ok;
  } catch (const std::exception& e) {
    put_log(log, log_size, e.what());
    return memory_allocation;
  }
}

Status rtc_check(const char* source, int arch, std::size_t* cubin_bytes, char* log, std::size_t log_size) noexcept {
  (void)arch;
  try {
    std::string err;
    const fs::path built = build(source, err);
    if (built.empty()) {
      put_log(log, log_size, err);
      return rtc_compile_error;
    }
    std::error_code ec;
    *cubin_bytes = static_cast<std::size_t>(fs::file_size(built, ec));
    return ok;
  } catch (const std::exception& e) {
    put_log(log, log_size, e.what());
    return memory_allocation;
  }
}

Status rtc_launch(RtcKernel k, void** args, std::int64_t n, Stream s) noexcept {
  if (n <= 0) return ok;
  auto* kernel = static_cast<Kernel*>(k);
  if (kernel == nullptr) return invalid_value;
  const std::int64_t b = (n + 255) / 256;  // kernels/common.cuh's grid_for
  const auto grid = static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
  try {
    // The parameters are read now (the caller's variables), the kernel runs now or at each replay.
    std::shared_ptr<void> packed(kernel->pack(args), kernel->drop);
    return launch(s, [kernel, packed, grid] {
      const std::lock_guard<std::mutex> lock(launch_mutex());
      kernel->run(packed.get(), grid, 256, kernel->barriers ? &run_fibers : nullptr);
    });
  } catch (const std::bad_alloc&) {
    return memory_allocation;
  }
}

void rtc_forget() noexcept {
  Cache& c = cache();
  const std::lock_guard<std::mutex> lock(c.mu);
  for (const auto& [key, k] : c.kernels) c.forgotten.push_back(k);
  c.kernels.clear();
  c.libraries.clear();
}

RtcStats rtc_stats() noexcept {
  Cache& c = cache();
  return {c.compiled.load(), c.memory_hits.load(), c.disk_hits.load()};
}

}  // namespace stagecraft::cuda::abi
