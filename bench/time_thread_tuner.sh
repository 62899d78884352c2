#!/usr/bin/env bash
# The example's MLP epoch (60000 images) at exactly 2 threads, exactly 1, and tuned (--threads auto,
# sc::ThreadTuner), in turn for <rounds> rounds; with `busy`, beside a busy loop pinned to CPU 1
# (another process on the same CPUs). bench/results/threads.md "Session 57" has the figures.
# usage: bash bench/time_thread_tuner.sh build/release/examples/fashion_mnist <rounds> [busy]
set -uo pipefail
fm=$1 rounds=$2 busy=${3:-}
err=$(mktemp)
bp=
trap '[[ -n $bp ]] && kill $bp; rm -f "$err"' EXIT
if [[ -n $busy ]]; then taskset -c 1 sh -c 'while :; do :; done' & bp=$!; fi
for ((k = 1; k <= rounds; ++k)); do
  line="round $k:"
  for t in 2 1 auto; do
    out=$(OMP_NUM_THREADS=2 "$fm" --epochs 1 --threads $t 2>"$err")
    e=$(grep -o "examples_per_sec=[0-9]*" <<< "$out" | cut -d= -f2)
    line+=" $t=$e"
    [[ $t == auto ]] && line+=" ($(grep -o 'threads tuned: .*' "$err" | sed 's/threads tuned: //'))"
  done
  echo "$line"
done
