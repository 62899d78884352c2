#!/usr/bin/env bash
# Compile-time benchmark: a one-line user file that includes <stagecraft/stagecraft.hpp>, and a user
# file that also compiles a 16-op staged expression (sc::compile) and its derivative (sc::grad<0>).
# Prints the median of RUNS (default 3) compiles at -O0 and -O2, the preprocessing time and the
# preprocessed line count; then both files again as built against stagecraft::precompiled
# (-DSTAGECRAFT_PRECOMPILED: every op's kernels are extern templates, compiled once in its archive),
# and last with the umbrella header as a precompiled header (what CMake's target_precompile_headers
# does). Flags are those stagecraft::stagecraft gives a user (see a build's compile_commands.json),
# without ccache. Usage: bash bench/compile_time.sh   (CXX=clang++ to switch)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cxx=${CXX:-g++}
runs=${RUNS:-3}
flags=(-std=gnu++20 -fopenmp -DXTENSOR_USE_XSIMD -I"$root/include"
       -isystem /usr/include/x86_64-linux-gnu/openblas-openmp)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo '#include <stagecraft/stagecraft.hpp>' > "$tmp/user.cpp"
cat > "$tmp/staged.cpp" <<'EOF'
#include <stagecraft/stagecraft.hpp>
// 16 ops: mul add tanh sigmoid mul neg exp add div sub gt abs sqrt square where add
sc::Tensor f(const sc::Tensor& x, const sc::Tensor& y) {
  auto g = sc::compile([](auto a, auto b) {
    auto h = sc::tanh(a * b + 0.5f) * sc::sigmoid(a) - b / (1 + sc::exp(-a));
    return sc::where(h > 0, sc::sqrt(sc::abs(h)), sc::square(h)) + a;
  });
  return g(x, y) + sc::grad<0>(g)(x, y);
}
EOF

# Runs "$@" RUNS times; prints the median wall time in seconds and all the runs.
measure() {
  local times=() t0 t1
  for ((i = 0; i < runs; ++i)); do
    t0=$(date +%s%N)
    "$@"
    t1=$(date +%s%N)
    times+=("$(awk -v d=$((t1 - t0)) 'BEGIN { printf "%.2f", d / 1e9 }')")
  done
  local median
  median=$(printf '%s\n' "${times[@]}" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
  echo "median ${median} s   (runs: ${times[*]})"
}

echo "compiler: $($cxx --version | head -1); file: #include <stagecraft/stagecraft.hpp>"
echo "compile -O0:   $(measure "$cxx" "${flags[@]}" -O0 -c "$tmp/user.cpp" -o "$tmp/user.o")"
echo "compile -O2:   $(measure "$cxx" "${flags[@]}" -O2 -c "$tmp/user.cpp" -o "$tmp/user.o")"
echo "preprocess -E: $(measure "$cxx" "${flags[@]}" -E "$tmp/user.cpp" -o "$tmp/user.ii")"
echo "preprocessed lines: $(wc -l < "$tmp/user.ii")"
echo "file: a 16-op sc::compile expression and its sc::grad<0> (see this script)"
echo "compile -O0:   $(measure "$cxx" "${flags[@]}" -O0 -c "$tmp/staged.cpp" -o "$tmp/staged.o")"
echo "compile -O2:   $(measure "$cxx" "${flags[@]}" -O2 -c "$tmp/staged.cpp" -o "$tmp/staged.o")"
echo "with -DSTAGECRAFT_PRECOMPILED (a target linked to stagecraft::precompiled):"
echo "umbrella -O2:  $(measure "$cxx" "${flags[@]}" -DSTAGECRAFT_PRECOMPILED -O2 -c "$tmp/user.cpp" -o "$tmp/user.o")"
echo "staged -O0:    $(measure "$cxx" "${flags[@]}" -DSTAGECRAFT_PRECOMPILED -O0 -c "$tmp/staged.cpp" -o "$tmp/staged.o")"
echo "staged -O2:    $(measure "$cxx" "${flags[@]}" -DSTAGECRAFT_PRECOMPILED -O2 -c "$tmp/staged.cpp" -o "$tmp/staged.o")"
sed 's/sc::compile(/sc::compile<sc::f32>(/' "$tmp/staged.cpp" > "$tmp/staged_f32.cpp"
echo "staged, sc::compile<sc::f32> -O2: $(measure "$cxx" "${flags[@]}" -DSTAGECRAFT_PRECOMPILED -O2 -c "$tmp/staged_f32.cpp" -o "$tmp/staged.o")"
echo "the archive itself (src/precompiled.cpp, once per build) -O2: $(RUNS=1; measure "$cxx" "${flags[@]}" -DSTAGECRAFT_PRECOMPILED -O2 -c "$root/src/precompiled.cpp" -o "$tmp/pre.o")"
echo "with the umbrella as a precompiled header too (built once per target, then read by every file):"
mkdir -p "$tmp/pch"
echo '#include <stagecraft/stagecraft.hpp>' > "$tmp/pch/sc.hpp"
pch=(-DSTAGECRAFT_PRECOMPILED -O2)
echo "the header itself -O2: $(RUNS=1; measure "$cxx" "${flags[@]}" "${pch[@]}" -x c++-header "$tmp/pch/sc.hpp" -o "$tmp/pch/sc.hpp.gch")"
echo "umbrella -O2:  $(measure "$cxx" "${flags[@]}" "${pch[@]}" -Winvalid-pch -include "$tmp/pch/sc.hpp" -c "$tmp/user.cpp" -o "$tmp/user.o")"
echo "staged -O2:    $(measure "$cxx" "${flags[@]}" "${pch[@]}" -Winvalid-pch -include "$tmp/pch/sc.hpp" -c "$tmp/staged.cpp" -o "$tmp/staged.o")"
echo "staged, sc::compile<sc::f32> -O2: $(measure "$cxx" "${flags[@]}" "${pch[@]}" -Winvalid-pch -include "$tmp/pch/sc.hpp" -c "$tmp/staged_f32.cpp" -o "$tmp/staged.o")"
