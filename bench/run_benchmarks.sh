#!/usr/bin/env bash
# Runs every built benchmark with the settings RESULTS.md quotes (5 repetitions, medians),
# each one started at a quiet moment, then prints the summary table (summarize.py).
#   bash bench/run_benchmarks.sh [build-dir] [out-dir]      e.g. build/bench build/bench/results
# Env: STAGECRAFT_BENCH_THREADS (default 2), QUIET_IDLE (idle % to wait for, default 85),
#      QUIET_WAIT_S (longest wait per binary, default 120), BENCH_FILTER (a --benchmark_filter),
#      BENCH_NICE (default -15 when run as root, else 0).
# Why the priority: on a 2-core machine shared with builds, Linux's autogroup scheduling
# gives each session an equal share, so a benchmark's second thread barely ran (2 threads
# were no faster than 1 even on a pure compute loop) and OpenMP's spin-waiting made every
# parallel region cost ~12 ms. Each benchmark therefore runs in its own session whose
# autogroup (and process) nice is BENCH_NICE; a parallel region then costs ~1.3 us again.
# It applies to every library in the binary alike.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build/bench}
out=${2:-$build/results}
mkdir -p "$out"

# Percentage of CPU time idle over the next 2 seconds (from /proc/stat).
idle_pct() {
  local a b
  read -r -a a < <(grep '^cpu ' /proc/stat)
  sleep 2
  read -r -a b < <(grep '^cpu ' /proc/stat)
  local total=0 i
  for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
  echo $(( (100 * (b[4] - a[4] + b[5] - a[5])) / (total > 0 ? total : 1) ))
}
wait_quiet() {
  local start=$SECONDS idle
  while :; do
    idle=$(idle_pct)
    if (( idle >= ${QUIET_IDLE:-85} )); then echo "[run_benchmarks] cpu idle ${idle}%: running $1"; return; fi
    if (( SECONDS - start > ${QUIET_WAIT_S:-120} )); then
      echo "[run_benchmarks] warning: cpu only ${idle}% idle after ${QUIET_WAIT_S:-120}s; running $1 anyway"; return
    fi
  done
}

nice_level=${BENCH_NICE:-$([[ $(id -u) == 0 ]] && echo -15 || echo 0)}
echo "[run_benchmarks] nice=$nice_level threads=${STAGECRAFT_BENCH_THREADS:-2} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-default}"

# Runs "$@" in a new session whose autogroup has nice_level (when the kernel allows it).
prioritised() {
  # shellcheck disable=SC2016
  setsid -w bash -c 'echo "$0" > /proc/self/autogroup 2>/dev/null || true; exec nice -n "$0" "$@"' "$nice_level" "$@"
}

for b in bench_dispatch bench_elementwise bench_matmul bench_conv bench_reduce; do
  exe=$build/bench/$b
  if [[ ! -x $exe ]]; then echo "[run_benchmarks] $b not built: skipped"; continue; fi
  wait_quiet "$b"
  prioritised "$exe" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
    ${BENCH_FILTER:+--benchmark_filter="$BENCH_FILTER"} \
    --benchmark_out="$out/$b.json" --benchmark_out_format=json | tee "$out/$b.txt"
done
python3 "$here/summarize.py" "$out"/*.json
