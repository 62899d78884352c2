// Which kernels OpenBLAS runs, and a better choice where it fell back to old ones.
//
// OpenBLAS built with runtime dispatch (Debian's, Ubuntu's) picks its kernels ("core") from the
// CPU model when it loads. A release older than the CPU does not know the model and falls back
// to kernels for a 2004 Pentium 4: Debian 12's OpenBLAS 0.3.21 on a Sapphire Rapids Xeon runs
// sgemm 1024^3 at 17 GFLOP/s on one thread instead of 95 with its AVX-512 kernels, and on this
// project's Zen 3 machine the forced fallback (OPENBLAS_CORETYPE=Prescott) is 4x slower than
// the Zen kernels; on an AMD Zen 5 its AVX2 Haswell kernels run at half the speed of its
// AVX-512 ones. Before the library's first product it compares the core with what the CPU
// supports (AVX-512, AVX2 + FMA, AVX) and, when the core is older, switches OpenBLAS to the best
// core it has for that level, through OpenBLAS's own start-up path (OPENBLAS_CORETYPE and its
// exported gotoblas_dynamic_init), exactly as if the user had set the variable.
//
// The user decides first: nothing changes when OPENBLAS_CORETYPE is set, or with
// STAGECRAFT_BLAS_CORE=keep; STAGECRAFT_BLAS_CORE=<name> asks for that core, and
// STAGECRAFT_BLAS_CORE=auto applies the rule even over OPENBLAS_CORETYPE (to reproduce a
// fallback on a machine whose OpenBLAS knows the CPU: OPENBLAS_CORETYPE=Prescott).
#pragma once
#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>

// OpenBLAS's runtime-dispatch entry points (exported, not in its headers). Weak: with a BLAS
// built for one CPU, or another vendor's, they are null and nothing is switched.
extern "C" void gotoblas_dynamic_init(void) __attribute__((weak));
extern "C" void gotoblas_dynamic_quit(void) __attribute__((weak));

namespace stagecraft::backend::cpu {

namespace blas_core_detail {

inline std::string lower(std::string_view s) {
  std::string r(s);
  std::transform(r.begin(), r.end(), r.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return r;
}

/// The x86 vector level an OpenBLAS core's kernels use: 3 AVX-512, 2 AVX2 + FMA, 1 AVX, 0 older
/// (SSE-era cores: Prescott, Core2, Nehalem, Opteron...); -1 for a name it does not know (another
/// architecture, or a newer release's core: left alone).
inline int core_level(std::string_view name) {
  const std::string n = lower(name);
  for (const char* c : {"skylakex", "cooperlake", "sapphirerapids"})
    if (n == c) return 3;
  for (const char* c : {"haswell", "zen"})
    if (n == c) return 2;
  for (const char* c : {"sandybridge", "bulldozer", "piledriver", "steamroller", "excavator"})
    if (n == c) return 1;
  for (const char* c : {"katmai", "coppermine", "northwood", "prescott", "banias", "atom", "core2", "penryn",
                        "dunnington", "nehalem", "opteron", "opteron_sse3", "barcelona", "nano", "bobcat", "unknown"})
    if (n == c) return 0;
  return -1;
}

/// The vector level this CPU (and its OS) supports, as core_level counts.
inline int cpu_level() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return 3;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
  if (__builtin_cpu_supports("avx")) return 1;
#endif
  return 0;
}

inline bool amd_cpu() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  return __builtin_cpu_is("amd");
#else
  return false;
#endif
}

}  // namespace blas_core_detail

/// The kernel set OpenBLAS runs now ("Haswell", "SkylakeX", "Prescott"...).
inline std::string blas_core() {
  const char* n = openblas_get_corename();
  return n != nullptr ? std::string(n) : std::string();
}

/// True when this OpenBLAS can switch its kernels at run time (built with DYNAMIC_ARCH).
inline bool blas_core_switchable() { return gotoblas_dynamic_init != nullptr && gotoblas_dynamic_quit != nullptr; }

/// The core this CPU should run: "SkylakeX" with AVX-512, "Haswell" (Intel) or "Zen" (AMD) with
/// AVX2 + FMA, "Sandybridge" with AVX; "" on older or non-x86 CPUs.
inline std::string best_blas_core() {
  switch (blas_core_detail::cpu_level()) {
    case 3: return "SkylakeX";
    case 2: return blas_core_detail::amd_cpu() ? "Zen" : "Haswell";
    case 1: return "Sandybridge";
    default: return "";
  }
}

/// True when OpenBLAS runs kernels of a lower vector level than the CPU has: a release that does
/// not know this CPU fell back to SSE-era kernels (Debian 12's on a Sapphire Rapids Xeon), or to
/// AVX2 ones on an AVX-512 CPU. On an AMD Zen 5 (family 26) its SkylakeX kernels ran sgemm
/// 1024^3 at 204 GFLOP/s on one thread against the Haswell kernels' 101 (both forced through
/// OPENBLAS_CORETYPE; 0.3.21 itself picks Cooperlake there, 187). OpenBLAS's own rule for the
/// AVX-512 Zen it knows is the same: the Intel AVX-512 kernels.
inline bool blas_core_is_fallback() {
  const int have = blas_core_detail::core_level(blas_core());
  return have >= 0 && have < blas_core_detail::cpu_level();
}

/// The CPU's vector level as core levels count it (3 AVX-512, 2 AVX2 + FMA, 1 AVX, 0 older).
inline int cpu_vector_level() { return blas_core_detail::cpu_level(); }

/// Switches OpenBLAS to `core` (a name OPENBLAS_CORETYPE accepts) through its start-up path;
/// returns whether it now runs that core. Only while no BLAS call runs: the library calls it
/// before its first product; call it yourself before starting threads that use BLAS.
inline bool set_blas_core(const std::string& core) {
  if (!blas_core_switchable() || core.empty()) return false;
  static std::mutex mu;
  const std::lock_guard<std::mutex> lock(mu);
  const char* old = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved = old != nullptr ? old : "";
  ::setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  if (old != nullptr) ::setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  else ::unsetenv("OPENBLAS_CORETYPE");
  return blas_core_detail::lower(blas_core()) == blas_core_detail::lower(core);
}

/// What ensure_blas_core() did: the core before and after (equal when nothing changed).
struct BlasCoreChoice {
  std::string before, after;
  bool switched() const { return before != after; }
};

/// The rule in this file's header as a pure function: the core to switch to, or "" to keep
/// `current`. user_choice is STAGECRAFT_BLAS_CORE (null: unset), openblas_env OPENBLAS_CORETYPE.
inline std::string blas_core_to_use(std::string_view current, int cpu_level, bool amd, const char* user_choice,
                                    const char* openblas_env) {
  const std::string_view user = user_choice != nullptr ? user_choice : "";
  // "auto" applies the rule even to a core set through OPENBLAS_CORETYPE (to reproduce a
  // fallback: OPENBLAS_CORETYPE=Prescott STAGECRAFT_BLAS_CORE=auto).
  if (openblas_env != nullptr && user != "auto") return "";  // the user chose through OpenBLAS itself
  if (user == "keep") return "";
  if (!user.empty() && user != "auto") return std::string(user);
  const int have = blas_core_detail::core_level(current);
  if (have < 0 || have >= cpu_level) return "";
  switch (cpu_level) {
    case 3: return "SkylakeX";
    case 2: return amd ? "Zen" : "Haswell";
    default: return "Sandybridge";
  }
}

/// Applies the rule once per process (later calls return the first answer). The library calls
/// it before its first BLAS product.
inline const BlasCoreChoice& ensure_blas_core() {
  static const BlasCoreChoice choice = [] {
    BlasCoreChoice c;
    c.before = blas_core();
    const std::string target = blas_core_to_use(c.before, blas_core_detail::cpu_level(), blas_core_detail::amd_cpu(),
                                                std::getenv("STAGECRAFT_BLAS_CORE"), std::getenv("OPENBLAS_CORETYPE"));
    if (!target.empty()) set_blas_core(target);
    c.after = blas_core();
    return c;
  }();
  return choice;
}

}  // namespace stagecraft::backend::cpu

namespace stagecraft {
using backend::cpu::blas_core;
using backend::cpu::ensure_blas_core;
using backend::cpu::set_blas_core;
}  // namespace stagecraft
