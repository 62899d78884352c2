#!/usr/bin/env bash
# One call on a lent GPU machine (issue 8): build the CUDA targets, run every GPU test (the `cuda`
# label: ops, gradients, layouts, traced functions with generated kernels, the Fashion-MNIST CPU ==
# GPU check) and the GPU benchmarks, writing full logs under $OUT and a short table last.
# On this machine first: bash ../shared/device/prepare-carry.sh; then run, carrying `.device`:
#   source .device/setup.sh && bash bench/gpu_session.sh [tests|bench|all]
# Torch_DIR (PyTorch's LibTorch, found from python3 when unset) adds LibTorch's GPU rows.
set -uo pipefail
what=${1:-all}
out=${OUT:-/tmp/stagecraft-gpu}
mkdir -p "$out"
jobs=$(nproc)
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv > "$out/gpu.txt" 2>&1 || true
cat "$out/gpu.txt"

# cuDNN (the convolutions; optional, loaded at run time): where the toolkit has none, PyTorch's
# wheel (nvidia-cudnn) has the header and the library; CUDNN_ROOT lets the configure find both.
if [[ -z ${CUDNN_ROOT:-} ]]; then
  cudnn_root=$(python3 -c "import nvidia.cudnn as m; print(list(m.__path__)[0])" 2>/dev/null)
  [[ -n $cudnn_root && -f $cudnn_root/include/cudnn.h ]] && export CUDNN_ROOT=$cudnn_root
fi
echo "CUDNN_ROOT=${CUDNN_ROOT:-(the toolkit's)}" | tee "$out/cudnn.txt"

# Tests: the test preset (-Werror, assertions), CUDA on.
if [[ $what == all || $what == tests ]]; then
  cmake --preset test -B build/gpu -DSTAGECRAFT_CUDA=ON ${SC_DEVICE_CMAKE_ARGS:-} > "$out/configure-test.log" 2>&1 ||
    { tail -30 "$out/configure-test.log"; exit 1; }
  cmake --build build/gpu -j "$jobs" --target test_cuda_host test_cuda_ops test_nvcc_staged fashion_mnist \
    > "$out/build-test.log" 2>&1 || { grep -m20 -B2 -A8 "error" "$out/build-test.log"; exit 1; }
  ctest --test-dir build/gpu -L cuda --output-on-failure -j 4 > "$out/ctest-cuda.log" 2>&1
  echo "ctest -L cuda: exit $?"
  grep -E "tests passed|tests failed|Failed|SKIPPED|\*\*\*" "$out/ctest-cuda.log" | tail -25
fi

# Benchmarks: the release preset, CUDA on, LibTorch from the machine's PyTorch when there is one.
if [[ $what == all || $what == bench ]]; then
  torch_dir=${Torch_DIR:-$(python3 -c "import torch.utils; print(torch.utils.cmake_prefix_path)" 2>/dev/null)/Torch}
  cmake --preset release -B build/gpu-release -DSTAGECRAFT_CUDA=ON ${SC_DEVICE_CMAKE_ARGS:-} \
    ${torch_dir:+-DTorch_DIR=$torch_dir} > "$out/configure-bench.log" 2>&1 || { tail -30 "$out/configure-bench.log"; exit 1; }
  cmake --build build/gpu-release -j "$jobs" --target bench_cuda > "$out/build-bench.log" 2>&1 ||
    { grep -m20 -B2 -A8 "error" "$out/build-bench.log"; exit 1; }
  build/gpu-release/bench/bench_cuda --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
    --benchmark_out="$out/bench_cuda.json" --benchmark_out_format=json > "$out/bench_cuda.txt" 2>&1
  grep -E "_median|^cuda" "$out/bench_cuda.txt" | grep -v "_mean\|_stddev\|_cv" | tail -30
fi
