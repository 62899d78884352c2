#!/usr/bin/env bash
# The CPU quota's thread count in a real control group (backend/cpu/cpu_quota.hpp):
#   cpu_quota_cgroup.sh <cpu_quota_probe>
# Makes a cgroup v1 cpu group (or a cgroup v2 group with the cpu controller), runs the probe in it
# under quotas of 1 and 1.5 CPUs, with and without OMP_NUM_THREADS, then without a quota, and
# removes the group. Exit 77 (skipped) where it cannot: not root, no writable cpu controller,
# fewer than 2 CPUs.
set -uo pipefail
probe=$1
unset OMP_NUM_THREADS  # the runtime's default count is what the quota lowers
skip() { echo "skipped: $*"; exit 77; }
[[ $(id -u) == 0 ]] || skip "not root"
(($(nproc) >= 2)) || skip "one CPU"
base_run=$("$probe") || { echo "FAIL  the probe: $base_run"; exit 1; }
[[ $base_run == quota=none* ]] || skip "this process is already under a quota ($base_run)"
grp="" v2=0
if [[ -w /sys/fs/cgroup/cpu/cgroup.procs || -w /sys/fs/cgroup/cpu,cpuacct/cgroup.procs ]]; then
  base=/sys/fs/cgroup/cpu
  [[ -w $base/cgroup.procs ]] || base=/sys/fs/cgroup/cpu,cpuacct
  grp=$base/stagecraft-quota-test-$$
elif [[ -f /sys/fs/cgroup/cgroup.controllers ]] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
  # v2: a group under the root, whose subtree may enable cpu (the root's processes may stay)
  grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control || echo +cpu > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null ||
    skip "cannot enable the cgroup v2 cpu controller"
  grp=/sys/fs/cgroup/stagecraft-quota-test-$$ v2=1
else
  skip "no cpu controller mounted"
fi
mkdir "$grp" 2>/dev/null || skip "cannot make $grp"
cleanup() { rmdir "$grp" 2>/dev/null; }
trap cleanup EXIT
set_quota() {  # CPUs in hundredths, or "max"
  if ((v2)); then
    if [[ $1 == max ]]; then echo "max 100000" > "$grp/cpu.max"; else echo "$(($1 * 1000)) 100000" > "$grp/cpu.max"; fi
  else
    echo 100000 > "$grp/cpu.cfs_period_us"
    if [[ $1 == max ]]; then echo -1 > "$grp/cpu.cfs_quota_us"; else echo $(($1 * 1000)) > "$grp/cpu.cfs_quota_us"; fi
  fi
}
in_group() { sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$grp" "$@"; }
fail=0
expect() {  # expect <want> <got>
  if [[ $2 == "$1" ]]; then echo "ok    $2"; else echo "FAIL  got '$2', want '$1'"; fail=1; fi
}
n=$(nproc)
set_quota 100
expect "quota=1.00 threads=1 region=1" "$(in_group "$probe")"
set_quota 150
expect "quota=1.50 threads=1 region=1" "$(in_group "$probe")"
expect "quota=1.50 threads=2 region=2" "$(OMP_NUM_THREADS=2 in_group "$probe")"
set_quota max
expect "$base_run" "$(in_group "$probe")"
expect "quota=none threads=$n region=$n" "$base_run"
exit $fail
