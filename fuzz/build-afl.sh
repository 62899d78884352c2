#!/bin/sh
# Builds the fuzz targets with AFL++ (afl-g++-fast: GCC plugin instrumentation, persistent
# shared-memory mode) and ASan + UBSan, into build/afl (or $1). See fuzz/README.md.
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$src/build/afl}
afl=${AFL_LIB:-/usr/lib/afl}
mkdir -p "$out"

# Debian 12: afl++ 4.04c-4's GCC plugin was built against gcc 12.2.0-14 and a newer gcc-12 refuses
# it; load it through fuzz/afl-gcc-shim.c (AFL_PATH points afl-cc at a copy of $afl with the shim).
if ! echo 'int main() { return 0; }' | afl-g++-fast -x c++ - -o "$out/probe" >/dev/null 2>&1; then
  line=$(strings "$afl/afl-gcc-pass.so" | grep -m1 '^\.\./src/configure ' || true)
  [ -n "$line" ] || { echo "afl-g++-fast does not work and no configure line in $afl/afl-gcc-pass.so" >&2; exit 1; }
  mkdir -p "$out/aflpath"
  for f in "$afl"/*; do ln -sf "$f" "$out/aflpath/$(basename "$f")"; done
  rm -f "$out/aflpath/afl-gcc-pass.so"
  printf '#define AFL_CONFIGURE_LINE "%s"\n#define AFL_GCC_PASS "%s"\n' "$line" "$afl/afl-gcc-pass.so" > "$out/aflpath/shim-config.h"
  gcc -shared -fPIC -O1 -include "$out/aflpath/shim-config.h" "$src/fuzz/afl-gcc-shim.c" -o "$out/aflpath/afl-gcc-pass.so" -ldl
  export AFL_PATH="$out/aflpath"
  echo 'int main() { return 0; }' | afl-g++-fast -x c++ - -o "$out/probe" >/dev/null
  echo "afl-g++-fast works through the plugin shim (AFL_PATH=$AFL_PATH)"
fi
rm -f "$out/probe"

blas=$(pkg-config --cflags openblas 2>/dev/null || echo -I/usr/include/x86_64-linux-gnu/openblas-openmp)
for t in ${TARGETS:-idx safetensors npy function}; do
  echo "building $out/fuzz_$t"
  AFL_USE_ASAN=1 AFL_USE_UBSAN=1 AFL_QUIET=1 afl-g++-fast -std=c++20 -O1 -g -fno-omit-frame-pointer -fopenmp \
    -I"$src/include" $blas "$src/fuzz/fuzz_$t.cpp" -o "$out/fuzz_$t" -lopenblas -lz -pthread
done
