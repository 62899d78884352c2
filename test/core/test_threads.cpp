// The default thread count under a CPU quota (backend/cpu/cpu_quota.hpp): the control-group files
// parsed from fake trees, the rounding to whole CPUs, and what the program sets winning over the
// quota. test/core/cpu_quota_cgroup.sh checks the same in a real control group where it may.
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include <catch2/catch.hpp>
#include <stagecraft/backend/cpu/parallel.hpp>  // not the umbrella: quick to build under the sanitizers
#include <stagecraft/fwd.hpp>

#include "files.hpp"

namespace {
namespace q = sc::backend::cpu::quota_detail;

void write(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

// mountinfo lines as the kernel writes them (an optional field, then "-", type, source, options).
const std::string v2_line = "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
const std::string v1_line = "35 30 0:31 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw shared:9 - cgroup cgroup rw,cpu,cpuacct\n";
const std::string other_lines =
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "36 30 0:32 / /sys/fs/cgroup/memory rw shared:10 - cgroup cgroup rw,memory\n"
    "37 30 0:33 / /sys/fs/cgroup/cpuset rw shared:11 - cgroup cgroup rw,cpuset\n";
}  // namespace

TEST_CASE("cgroup mounts: cgroup2 and the v1 cpu controller, escapes undone, others skipped") {
  const auto m = q::cgroup_mounts(other_lines + v2_line + v1_line +
                                  "40 30 0:40 / /mnt/my\\040groups rw - cgroup2 none rw\n" + "garbage line\n");
  REQUIRE(m.size() == 3);
  CHECK(m[0].v2);
  CHECK(m[0].root == "/");
  CHECK(m[0].point == "/sys/fs/cgroup");
  CHECK_FALSE(m[1].v2);
  CHECK(m[1].root == "/docker/abc");
  CHECK(m[1].point == "/sys/fs/cgroup/cpu,cpuacct");
  CHECK(m[2].point == "/mnt/my groups");  // cpuset is not cpu: skipped
}

TEST_CASE("cpu quota from cgroup v2: the smallest cpu.max along the group's path") {
  sctest::TempDir d("sc_quota");
  const std::string root = d.path.string();
  write(d / "sys/fs/cgroup/cpu.max", "max 100000\n");
  write(d / "sys/fs/cgroup/kubepods/cpu.max", "400000 100000\n");
  write(d / "sys/fs/cgroup/kubepods/pod1/cpu.max", "250000 100000\n");
  write(d / "sys/fs/cgroup/kubepods/pod1/c1/cpu.max", "max 100000\n");
  const auto got = q::quota_from("0::/kubepods/pod1/c1\n", v2_line, root);
  REQUIRE(got);
  CHECK(*got == 2.5);
  // the group's own limit when it is the smallest; none anywhere: no quota
  write(d / "sys/fs/cgroup/kubepods/pod1/c1/cpu.max", "50000 100000\n");
  CHECK(q::quota_from("0::/kubepods/pod1/c1\n", v2_line, root) == 0.5);
  CHECK_FALSE(q::quota_from("0::/\n", v2_line, root));
  CHECK_FALSE(q::quota_from("0::/elsewhere\n", v2_line, root));
  // a v1 line names no cgroup2 group; no mount: nothing read
  CHECK_FALSE(q::quota_from("4:cpu,cpuacct:/kubepods/pod1/c1\n", v2_line, root));
  CHECK_FALSE(q::quota_from("0::/kubepods/pod1/c1\n", other_lines, root));
}

TEST_CASE("cpu quota from cgroup v1: CFS quota over period, under the mount's root") {
  sctest::TempDir d("sc_quota");
  const std::string root = d.path.string();
  const auto dir = d / "sys/fs/cgroup/cpu,cpuacct";
  write(dir / "cpu.cfs_quota_us", "150000\n");
  write(dir / "cpu.cfs_period_us", "100000\n");
  // the container's group is the mount's root: the mount point itself
  CHECK(q::quota_from("12:cpu,cpuacct:/docker/abc\n", v1_line, root) == 1.5);
  // a group below it, with its own (larger) limit: the smaller one counts
  write(dir / "sub/cpu.cfs_quota_us", "300000\n");
  write(dir / "sub/cpu.cfs_period_us", "100000\n");
  CHECK(q::quota_from("12:cpu,cpuacct:/docker/abc/sub\n", v1_line, root) == 1.5);
  // -1 is no limit; a path outside the mount's root is not under it
  write(dir / "cpu.cfs_quota_us", "-1\n");
  CHECK(q::quota_from("12:cpu,cpuacct:/docker/abc/sub\n", v1_line, root) == 3.0);
  CHECK_FALSE(q::quota_from("12:cpu,cpuacct:/docker/abc\n", v1_line, root));
  CHECK_FALSE(q::quota_from("12:cpu,cpuacct:/other\n", v1_line, root));
  // the memory controller's line is not the cpu controller's
  CHECK_FALSE(q::quota_from("9:memory:/docker/abc/sub\n", v1_line, root));
}

TEST_CASE("cpu quota: v1 and v2 both mounted, the smaller, and unreadable or malformed files are no limit") {
  sctest::TempDir d("sc_quota");
  const std::string root = d.path.string();
  write(d / "sys/fs/cgroup/g/cpu.max", "300000 100000\n");
  write(d / "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "200000\n");
  write(d / "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  const std::string self = "12:cpu,cpuacct:/docker/abc\n0::/g\n";
  CHECK(q::quota_from(self, v2_line + v1_line, root) == 2.0);
  for (const std::string bad : {"", "garbage", "max", "100000", "abc 100000", "0 100000", "100000 0", "-5 100000"}) {
    write(d / "sys/fs/cgroup/g/cpu.max", bad);
    CAPTURE(bad);
    CHECK_FALSE(q::quota_from("0::/g\n", v2_line, root));
  }
  CHECK_FALSE(q::quota_from("no colons here\n::\n", v2_line, root));
}

TEST_CASE("threads for a quota: its whole CPUs, at least one") {
  using sc::backend::cpu::threads_for_quota;
  CHECK(threads_for_quota(0.01) == 1);
  CHECK(threads_for_quota(0.5) == 1);
  CHECK(threads_for_quota(1.0) == 1);
  CHECK(threads_for_quota(1.5) == 1);  // measured: a second thread on 1.2-1.5 CPUs is slower
  CHECK(threads_for_quota(1.999) == 1);
  CHECK(threads_for_quota(2.0) == 2);
  CHECK(threads_for_quota(2.5) == 2);
  CHECK(threads_for_quota(64.0) == 64);
  CHECK(threads_for_quota(1e300) == 1 << 20);
}

TEST_CASE("the default thread count: the runtime's, lowered only to the quota, and set_num_threads wins") {
  // A fresh thread starts from OpenMP's default count, whatever the test runner set on this one.
  int fresh = 0, after_set = 0, runtime_default = 0;
  std::thread([&] {
#if SC_HAS_OPENMP
    runtime_default = omp_get_max_threads();
#else
    runtime_default = 1;
#endif
    fresh = sc::num_threads();
    sc::set_num_threads(1);
    after_set = sc::num_threads();
  }).join();
  const int cap = sc::detail::quota_thread_cap();
  const bool lowered = cap > 0 && runtime_default > cap && runtime_default == sc::backend::cpu::affinity_cpus();
  CHECK(fresh == (lowered ? cap : runtime_default));
  CHECK(after_set == 1);
  if (std::getenv("OMP_NUM_THREADS") != nullptr) CHECK(cap == 0);  // the user's count is never lowered
  const auto quota = sc::cpu_quota();
  if (!quota) CHECK(cap == 0);
  if (quota && std::getenv("OMP_NUM_THREADS") == nullptr) CHECK(cap == sc::backend::cpu::threads_for_quota(*quota));
  // set_num_threads settles the thread: the quota does not lower a count chosen afterwards either
  std::thread([&] {
    sc::set_num_threads(3);
    after_set = sc::num_threads();
  }).join();
#if SC_HAS_OPENMP
  CHECK(after_set == 3);
#endif
}
