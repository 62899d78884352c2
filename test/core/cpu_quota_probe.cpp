// Prints what the CPU backend makes of this process's CPU quota: "quota=<cpus|none>
// threads=<count> region=<threads a parallel loop ran on>". Run by cpu_quota_cgroup.sh in a
// control group of its making.
#include <cstdio>
#include <mutex>
#include <set>
#include <thread>

#include <stagecraft/backend/cpu/parallel.hpp>
#include <stagecraft/fwd.hpp>

int main() {
  const auto quota = sc::cpu_quota();
  const int threads = sc::num_threads();
  std::set<std::thread::id> seen;
  std::mutex mu;
  sc::set_parallel_grain_scale(1);
  // Enough work per thread that every thread of the region takes a range.
  sc::backend::cpu::parallel_for(std::int64_t{1} << 20, 1024, [&](std::int64_t, std::int64_t) {
    const std::lock_guard<std::mutex> lock(mu);
    seen.insert(std::this_thread::get_id());
  });
  if (quota) std::printf("quota=%.2f threads=%d region=%zu\n", *quota, threads, seen.size());
  else std::printf("quota=none threads=%d region=%zu\n", threads, seen.size());
}
