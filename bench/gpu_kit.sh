#!/usr/bin/env bash
# Here, before a lent GPU machine is used (issue 8): builds the GPU tests, the example and bench_cuda
# on this machine and packs them into ./.gpukit (git-ignored) with the libraries and data they need
# there, so the machine's few minutes go to running, not compiling (test_nvcc_staged.cu alone is
# minutes of nvcc). Then one call there, carrying `.gpukit`:
#   bash bench/gpu_session.sh [tests] [examples] [bench] [scaling]     (no argument: all four)
# The binaries are built for x86-64-v3 (AVX2, which the lent Xeon has) and CUDA sm_90 (H100/H200),
# release flags; the LibTorch rows (bench_cuda_torch.cpp) are compiled there against its PyTorch.
# The device tool sends at most 64 MiB (the working tree and what is carried): this script says
# what it packed and stops if that would not fit.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=build/kit
kit=.gpukit
targets=(test_cuda_ops test_cuda_conformance test_nvcc_staged fashion_mnist bench_cuda profile_cuda_steps)

if [[ ! -f $build/CMakeCache.txt ]]; then
  # the .cu files' host code gets the same -march as the C++ (inline functions built both ways)
  cmake --preset release -B "$build" -DSTAGECRAFT_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3 \
    -DCMAKE_CUDA_FLAGS=-Xcompiler=-march=x86-64-v3 \
    -DSTAGECRAFT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > /dev/null
fi
cmake --build "$build" --target "${targets[@]}"

rm -rf "$kit" && mkdir -p "$kit/stage/lib" "$kit/stage/include"
# The binaries, stripped, at their build-tree paths; the CTest files that name them (and the test
# lists catch_discover_tests wrote) so that `ctest -L cuda` runs there as here.
for t in test/cuda/test_cuda_ops test/cuda/test_cuda_conformance test/cuda/test_nvcc_staged examples/fashion_mnist bench/bench_cuda bench/profile_cuda_steps; do
  mkdir -p "$kit/stage/$build/$(dirname "$t")"
  strip --strip-debug -o "$kit/stage/$build/$t" "$build/$t"  # symbols kept: a backtrace there names functions
done
(cd "$build" && find . -name CTestTestfile.cmake -o -name '*_tests*.cmake' -o -name '*_include*.cmake') |
  while read -r f; do mkdir -p "$kit/stage/$build/$(dirname "$f")" && cp "$build/$f" "$kit/stage/$build/$f"; done
# test_cuda_host needs no GPU and CI runs it: not in the kit, its test list emptied.
for f in "$kit/stage/$build"/test/cuda/test_cuda_host*_include*.cmake; do echo "# test_cuda_host: CI runs it" > "$f"; done
echo "$root" > "$kit/stage/build_root.txt"

# Runtime libraries the lent machine lacks, under their sonames: Debian's OpenBLAS (OpenMP build)
# with its Fortran runtime, and Google Benchmark (with its headers, for bench_cuda_torch).
ldd "$build/examples/fashion_mnist" "$build/bench/bench_cuda" |
  awk '$2 == "=>" && $1 ~ /^lib(openblas|gfortran|quadmath|benchmark)\./ {print $1, $3}' | sort -u |
  while read -r soname path; do cp -L "$path" "$kit/stage/lib/$soname"; done
ln -sf "$(cd "$kit/stage/lib" && ls libbenchmark.so.* | head -1)" "$kit/stage/lib/libbenchmark.so"
cp -r /usr/include/benchmark "$kit/stage/include/"
(cd "$kit/stage" && tar -cf - . | xz -T2 -9 > ../kit.tar.xz)
rm -rf "$kit/stage"

# The data, as shipped (already compressed).
mkdir -p "$kit/fashion-mnist"
cp /usr/share/datasets/fashion-mnist/*.gz "$kit/fashion-mnist/" 2>/dev/null ||
  echo "gpu_kit: no Fashion-MNIST here (apt-get install dataset-fashion-mnist): the example will have no data there"

kit_mb=$(du -sm "$kit" | cut -f1)
tree_mb=$(git ls-files -z | xargs -0 du -cm 2>/dev/null | tail -1 | cut -f1)
echo "gpu_kit: $kit holds ${kit_mb} MiB (the kit $(du -h "$kit/kit.tar.xz" | cut -f1)); working tree ~${tree_mb} MiB; limit 64"
if ((kit_mb + tree_mb > 62)); then
  echo "gpu_kit: too large to send with the working tree" >&2
  exit 1
fi
echo "gpu_kit: now, on the lent machine, with carry [\".gpukit\"]: bash bench/gpu_session.sh"
