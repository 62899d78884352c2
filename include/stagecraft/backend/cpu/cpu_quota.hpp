// The CPU time a Linux control group lets this process use, and the thread count it implies.
//
// A container started with `docker run --cpus=2` (or a Kubernetes CPU limit, or systemd's
// CPUQuota=) on a 64-core host sees 64 CPUs: OpenMP starts 64 threads, and they share two CPUs'
// worth of time. Every parallel region then waits for threads the kernel has set aside until the
// next period, and a spinning thread spends the quota the others need: the Fashion-MNIST example
// ran 10x slower with 2 threads than with 1 in a group allowed one CPU (bench/results/threads.md, "CPU
// quotas"). So the library's default thread count is at most the quota in whole CPUs (at least
// 1); OMP_NUM_THREADS, sc::set_num_threads or a count the program gave OpenMP itself win over it.
//
// The quota is read from cgroup v2's cpu.max and from cgroup v1's cpu.cfs_quota_us and
// cpu.cfs_period_us, in the process's group and every group above it up to its mount (the
// smallest limit counts), the groups found through /proc/self/cgroup and /proc/self/mountinfo.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

namespace stagecraft::backend::cpu {

namespace quota_detail {

/// A control-group file system mounted at `point`, showing the hierarchy from `root` down.
struct CgroupMount {
  std::string root, point;
  bool v2 = false;
};

/// mountinfo's octal escapes (a space is \040) undone.
inline std::string unescape(std::string_view s) {
  std::string r;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3' && s[i + 2] >= '0' && s[i + 2] <= '7' &&
        s[i + 3] >= '0' && s[i + 3] <= '7') {
      r += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      r += s[i];
    }
  }
  return r;
}

/// Whether comma-separated `list` holds `item`.
inline bool has_item(std::string_view list, std::string_view item) {
  while (!list.empty()) {
    const std::size_t c = list.find(',');
    if (list.substr(0, c) == item) return true;
    if (c == std::string_view::npos) break;
    list.remove_prefix(c + 1);
  }
  return false;
}

/// The cgroup v2 mounts and the v1 mounts of the cpu controller in mountinfo's text.
inline std::vector<CgroupMount> cgroup_mounts(const std::string& mountinfo) {
  std::vector<CgroupMount> out;
  std::istringstream lines(mountinfo);
  std::string line;
  while (std::getline(lines, line)) {
    // id parent major:minor root point options [optional fields...] - fstype source super-options
    std::istringstream f(line);
    std::vector<std::string> w;
    for (std::string s; f >> s;) w.push_back(s);
    const auto dash = std::find(w.begin(), w.end(), "-");
    if (w.size() < 5 || dash == w.end() || w.end() - dash < 2) continue;
    const std::string& type = dash[1];
    const bool v2 = type == "cgroup2";
    if (!v2 && !(type == "cgroup" && w.end() - dash >= 4 && has_item(dash[3], "cpu"))) continue;
    out.push_back({unescape(w[3]), unescape(w[4]), v2});
  }
  return out;
}

/// The whole text of `path`, or nullopt when it cannot be read.
inline std::optional<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// CPUs a group directory's own limit allows (quota / period), or nullopt when it has none.
inline std::optional<double> group_limit(const std::string& dir, bool v2) {
  double quota = -1, period = 0;
  if (v2) {
    const auto t = read_text(dir + "/cpu.max");  // "max 100000" or "<quota> <period>"
    if (!t) return std::nullopt;
    std::istringstream s(*t);
    std::string q;
    if (!(s >> q >> period) || q == "max") return std::nullopt;
    try {
      quota = std::stod(q);
    } catch (...) {
      return std::nullopt;
    }
  } else {
    const auto q = read_text(dir + "/cpu.cfs_quota_us"), p = read_text(dir + "/cpu.cfs_period_us");
    if (!q || !p) return std::nullopt;
    std::istringstream qs(*q), ps(*p);
    if (!(qs >> quota) || !(ps >> period)) return std::nullopt;
  }
  if (!(quota > 0) || !(period > 0)) return std::nullopt;  // -1: no limit
  return quota / period;
}

/// The group's path under a mount that shows the hierarchy from `root`: `path` without that
/// prefix ("" for the mount's top), or nullopt when the path is outside it.
inline std::optional<std::string> under_root(const std::string& path, const std::string& root) {
  if (root == "/" || root.empty()) return path == "/" ? std::string() : path;
  if (path == root) return std::string();
  if (path.size() > root.size() && path.compare(0, root.size(), root) == 0 && path[root.size()] == '/')
    return path.substr(root.size());
  return std::nullopt;
}

/// The smallest limit of the process's groups (from /proc/self/cgroup's text `self_cgroup` and
/// mountinfo's text), each group and those above it to its mount's top; `prefix` goes before every
/// mount point (tests give a directory that stands in for /). nullopt: no limit found.
inline std::optional<double> quota_from(const std::string& self_cgroup, const std::string& mountinfo,
                                        const std::string& prefix = "") {
  const std::vector<CgroupMount> mounts = cgroup_mounts(mountinfo);
  std::optional<double> best;
  std::istringstream lines(self_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    // hierarchy-id:controllers:path (v2: "0::/path")
    const std::size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    const bool v2 = line.compare(0, a, "0") == 0 && controllers.empty();
    if (!v2 && !has_item(controllers, "cpu")) continue;
    for (const CgroupMount& m : mounts) {
      if (m.v2 != v2) continue;
      const std::optional<std::string> rel = under_root(path, m.root);
      if (!rel) continue;
      std::string dir = prefix + m.point + *rel;
      const std::string top = prefix + m.point;
      for (;;) {
        if (const auto lim = group_limit(dir, v2)) best = best ? std::min(*best, *lim) : *lim;
        if (dir.size() <= top.size()) break;
        dir.resize(dir.rfind('/'));
        if (dir.size() < top.size()) break;
      }
    }
  }
  return best;
}

}  // namespace quota_detail

/// CPUs per period this process's control groups allow it (cgroup v2 cpu.max, v1 CFS quota; the
/// smallest along each group's path), or nullopt when unlimited, unknown or not on Linux. Read
/// once per process.
inline std::optional<double> cpu_quota() {
  static const std::optional<double> q = [] {
#if defined(__linux__)
    const auto self = quota_detail::read_text("/proc/self/cgroup");
    const auto mounts = quota_detail::read_text("/proc/self/mountinfo");
    if (!self || !mounts) return std::optional<double>();
    return quota_detail::quota_from(*self, *mounts);
#else
    return std::optional<double>();
#endif
  }();
  return q;
}

/// The threads a quota of `cpus` CPUs allows: its whole CPUs, at least one. A fraction of a CPU
/// more is no thread more: with 1.5 CPUs a second thread waits out part of every period, and
/// each parallel region with it.
inline int threads_for_quota(double cpus) {
  if (!(cpus < 1e6)) return 1 << 20;
  return std::max(1, static_cast<int>(std::floor(cpus + 1e-9)));
}

/// CPUs this process may run on (its affinity mask), at least 1.
inline int affinity_cpus() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return 1;
}

}  // namespace stagecraft::backend::cpu

namespace stagecraft {
using backend::cpu::cpu_quota;
}  // namespace stagecraft
