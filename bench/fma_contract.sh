#!/usr/bin/env bash
# Builds bench/fma_contract.cpp three ways for this CPU (-march=native) and runs them alternated,
# ROUNDS times (default 5): rounded (the default), contracted (-DSTAGECRAFT_FUSED_CONTRACT) and
# no FMA at all (-ffp-contract=off). Prints each round's medians and the ratios to 'contracted'.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${ROUNDS:-5}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags=(-std=gnu++20 -O2 -march=native -fopenmp -I"$root/include" -isystem /usr/include/x86_64-linux-gnu/openblas-openmp)
g++ "${flags[@]}" "$root/bench/fma_contract.cpp" -o "$tmp/rounded" -lopenblas -lz &
g++ "${flags[@]}" -DSTAGECRAFT_FUSED_CONTRACT "$root/bench/fma_contract.cpp" -o "$tmp/contracted" -lopenblas -lz &
g++ "${flags[@]}" -ffp-contract=off "$root/bench/fma_contract.cpp" -o "$tmp/nofma" -lopenblas -lz &
wait
echo "9-op chain, 4M f32, one thread, ms (median of 31 calls):  contracted  rounded  no-FMA"
for ((r = 0; r < rounds; ++r)); do
  c=$("$tmp/contracted"); o=$("$tmp/rounded"); f=$("$tmp/nofma")
  awk -v c="$c" -v o="$o" -v f="$f" 'BEGIN { printf "  %s  %s (%.3fx)  %s (%.3fx)\n", c, o, o / c, f, f / c }'
done
