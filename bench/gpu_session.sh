#!/usr/bin/env bash
# One call on a lent GPU machine (issues 8 and 9), over the kit bench/gpu_kit.sh packed here:
#   here:  bash bench/gpu_kit.sh                   (builds and packs ./.gpukit; ~7 min on 2 cores)
#   there: bash bench/gpu_session.sh [tests] [bench] [scaling] [examples]   (carry [".gpukit"])
# tests     every GPU test (ctest -L cuda, without the host-only ones CI runs): ops and gradients
#           against the CPU, layouts, traced functions with generated kernels, CUDA graphs, the
#           templated sc::compile kernel, the example's CPU == GPU training check (both models,
#           eager, staged and graph)
# bench     bench_cuda (prebuilt), then bench_cuda_torch (compiled here against this machine's
#           PyTorch while the tests run) on the same GPU; summary.txt: every median, the goals
# scaling   issue 9's table: the example's MLP on the CPU at 1-16 threads beside PyTorch's copy
# examples  fashion_mnist on all 60000 images, CPU and --device cuda (eager, graph)
# debug     backtraces of crashing GPU tests ($SC_DEBUG_TESTS) and the example's whole output
# threads   the example at 16 threads under OpenMP/OpenBLAS settings (issue 9's scaling)
# alternate the example at 8, 12 and 16 threads in turn, $SC_ALTERNATE_ROUNDS rounds (default 7),
#           with each count's median: a drop from 8 to 16 told from this machine's noise (~40 s)
# profile   each model's step (mlp, lstm, cnn; $SC_PROFILE_MODELS) eager, staged and as a graph: its
#           wall time against its host enqueue time, and Nsight Compute's time per kernel
#           (profile.txt; bench/ncu_summary.py)
# No argument: all four, in that order. The session has 15 minutes of device time in all and one
# call at most 10: each phase starts only if its usual time fits in $SC_BUDGET seconds (default
# 540) from the start. Results under $OUT (at most 8 files come back): ctest-cuda.log,
# summary.txt, scaling.txt, examples.log, the two JSON files, and aux.tgz with the rest.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/stagecraft-gpu}
aux=/tmp/stagecraft-gpu-aux
mkdir -p "$out" "$aux"
phases=" $* "
[[ -z ${*:-} ]] && phases=" tests bench scaling examples "
has() { [[ $phases == *" $1 "* ]]; }
t0=$SECONDS
budget=${SC_BUDGET:-540}
stamp() { echo "[$((SECONDS - t0)) s] $*"; }
# fits <seconds>: true when that much time is left in the budget (else says so).
fits() {
  local left=$((budget - (SECONDS - t0)))
  ((left >= $1)) && return 0
  stamp "skipped: needs ~$1 s, $left s left of $budget"
  return 1
}
finish() { tar -czf "$out/aux.tgz" -C "$aux" . 2>/dev/null; stamp "done"; }
trap finish EXIT

kit=$PWD/.gpukit
if [[ ! -f $kit/kit.tar.xz ]]; then
  echo "gpu_session: no .gpukit/kit.tar.xz: run 'bash bench/gpu_kit.sh' on the build machine and carry .gpukit" >&2
  exit 1
fi
x=$kit/x
build=$x/build/kit
if [[ ! -f $x/unpacked ]]; then
  rm -rf "$x" && mkdir -p "$x" && tar -xJf "$kit/kit.tar.xz" -C "$x" || exit 1
  # CTest's files name the build machine's paths: the build tree is now under .gpukit/x, the
  # sources here.
  old=$(cat "$x/build_root.txt")
  find "$build" -name '*.cmake' -print0 | xargs -0 sed -i -e "s|$old/build/kit|@SC_BUILD@|g" \
    -e "s|$old/|@SC_SRC@/|g" -e "s|$old\"|@SC_SRC@\"|g" -e "s|@SC_BUILD@|$build|g" -e "s|@SC_SRC@|$PWD|g"
  touch "$x/unpacked"
fi
data=/usr/share/datasets/fashion-mnist
mkdir -p "$data" && cp -u "$kit"/fashion-mnist/*.gz "$data"/ 2>/dev/null
# cuDNN from PyTorch's wheel when the toolkit has none (the kernels load it at run time).
nv=$(python3 -c "import nvidia; print(list(nvidia.__path__)[0])" 2>/dev/null)
cudnn_so=$(find ${nv:+"$nv"} /usr/local/cuda/lib64/ /usr/lib/x86_64-linux-gnu/ -maxdepth 4 -name 'libcudnn.so.[0-9]*' 2>/dev/null | sort | head -1)
cudnn_lib=${cudnn_so:+$(dirname "$cudnn_so")}
[[ -n $cudnn_so && -z ${STAGECRAFT_CUDNN:-} ]] && export STAGECRAFT_CUDNN=$cudnn_so
# cuDNN 9's libcudnn.so.9 is a shim that dlopens its sub-libraries (libcudnn_graph, _cnn, ...) by
# name, and LD_LIBRARY_PATH is searched before the shim's own RUNPATH ($ORIGIN): its directory
# comes first, else a toolkit's cuDNN of another version in /usr/local/cuda/lib64 would lend its
# sub-libraries to this shim (a version mismatch: cudnnCreate fails and every conv falls back).
export LD_LIBRARY_PATH=$x/lib${cudnn_lib:+:$cudnn_lib}:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export STAGECRAFT_CACHE_DIR=/tmp/stagecraft-kernel-cache
gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1)
stamp "$gpu; $(nproc) CPUs; cuDNN: ${STAGECRAFT_CUDNN:-none found}" | tee "$aux/machine.txt"
# the CPU's topology (issue 9's 8 -> 16 thread drop: are the 16 vCPUs 16 cores?)
lscpu 2>/dev/null | grep -E "^(Model name|Thread|Core|Socket|NUMA node\(s\)|L3|Flags)" | cut -c1-200 | tee -a "$aux/machine.txt"
fm=$build/examples/fashion_mnist

# LibTorch's rows, compiled in the background while the tests use the GPU.
torch_bin=$x/bench_cuda_torch
if has bench && [[ ! -x $torch_bin ]]; then
  (
    T=$(python3 -c "import torch, os; print(os.path.dirname(torch.__file__))") &&
      abi=$(python3 -c "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))") &&
      cuda_libs=() && { [[ ! -f $T/lib/libtorch_cuda.so ]] || cuda_libs=(-ltorch_cuda -lc10_cuda); } &&
      g++ -O2 -std=c++20 -D_GLIBCXX_USE_CXX11_ABI="$abi" -isystem "$T/include" -isystem "$T/include/torch/csrc/api/include" \
        -isystem "$x/include" bench/bench_cuda_torch.cpp -o "$torch_bin" -L"$T/lib" -Wl,-rpath,"$T/lib" \
        -Wl,--no-as-needed "${cuda_libs[@]}" -ltorch -ltorch_cpu -lc10 -Wl,--as-needed -L"$x/lib" -lbenchmark -lpthread
  ) > "$aux/build-torch.log" 2>&1 &
  torch_build=$!
fi

if has tests && fits 120; then
  stamp "tests: ctest -L cuda -LE unit"
  # SC_CTEST_ARGS: more ctest arguments (-R <regex>: some tests only)
  timeout $((budget - (SECONDS - t0) - 20)) ctest --test-dir "$build" -L cuda -LE unit -j 6 --timeout 300 \
    --output-on-failure ${SC_CTEST_ARGS:-} > "$out/ctest-cuda.log" 2>&1
  stamp "tests: exit $?"
  grep -E "tests passed|tests failed|\(Failed\)|\(SEGFAULT\)|\(Timeout\)|\(Subprocess|\*\*\*|Not Run|Skipped" "$out/ctest-cuda.log" | tail -25
fi

# debug: the GPU tests named in $SC_DEBUG_TESTS (one Catch name per line) under cuda-gdb, a
# backtrace for each crash (the kit keeps the binaries' symbols), and a short run of the example
# on the GPU with its whole output: for a failure `ctest` shows too little of.
if has debug && fits 40; then
  stamp "debug: backtraces"
  while IFS= read -r name; do
    [[ -z $name ]] && continue
    fits 20 || break
    echo "== $name"
    timeout 60 cuda-gdb -q -batch -ex run -ex bt -ex "info threads" --args "$build/test/cuda/test_cuda_ops" "${name//,/\\,}" 2>&1 |
      grep -v "^\[New Thread\|^\[Thread .* exited\|^\[Detaching" | tail -60
  done <<< "${SC_DEBUG_TESTS:-}" > "$out/debug.log" 2>&1
  echo "== fashion_mnist --device cuda --limit 2000" >> "$out/debug.log"
  timeout 60 "$fm" --device cuda --epochs 1 --limit 2000 >> "$out/debug.log" 2>&1
  echo "exit $?" >> "$out/debug.log"
  stamp "debug: done"
fi

if has bench && fits 150; then
  flags=(--benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_min_time=0.1)
  stamp "bench: bench_cuda"
  timeout 200 "$build/bench/bench_cuda" "${flags[@]}" --benchmark_out="$out/bench_cuda.json" \
    --benchmark_out_format=json > "$aux/bench_cuda.txt" 2>&1
  stamp "bench: bench_cuda exit $?"
  if [[ -n ${torch_build:-} ]]; then wait "$torch_build" || { echo "bench_cuda_torch did not build:"; tail -15 "$aux/build-torch.log"; }; fi
  if [[ -x $torch_bin ]] && fits 45; then
    timeout 100 "$torch_bin" "${flags[@]}" --benchmark_out="$out/bench_cuda_torch.json" \
      --benchmark_out_format=json > "$aux/bench_cuda_torch.txt" 2>&1
    stamp "bench: bench_cuda_torch exit $?"
  fi
  { cat "$aux/machine.txt"; python3 bench/gpu_summary.py "$out"/bench_cuda*.json; } | tee "$out/summary.txt"
fi

# profile: where the GPU steps' time goes. profile_cuda_steps prints a step's wall time and the
# host's time to queue it (host-bound when they are close); ncu then times each kernel of two steps.
if has profile && fits 60; then
  stamp "profile: profile_cuda_steps, then ncu per kernel"
  prof=$build/bench/profile_cuda_steps
  {
    for model in ${SC_PROFILE_MODELS:-mlp lstm cnn}; do
      for mode in eager staged graph; do
        fits 25 || break 2
        echo "== $model $mode"
        SC_PLAN_TIMES=$aux/plan-$model-$mode.txt timeout 60 "$prof" "$model" "$mode" 0 2>&1 | tail -3
        if [[ -s $aux/plan-$model-$mode.txt ]]; then  # the plan's steps by the host's time to run them
          echo "host us per step, the plan's top steps (all: aux.tgz plan-$model-$mode.txt):"
          grep -E '^[0-9]+\. \[' "$aux/plan-$model-$mode.txt" | sed -E 's/^([0-9]+)\. \[([0-9.]+) us\] /\2 \1. /' |
            sort -rn | head -12 | cut -c1-150
          grep -oE '^[0-9]+\. \[[0-9.]+' "$aux/plan-$model-$mode.txt" | awk -F'[' '{t += $2} END {printf "total %.1f us\n", t}'
        fi
        timeout 90 ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \
          "$prof" "$model" "$mode" 2 > "$aux/ncu-$model-$mode.csv" 2> "$aux/ncu-$model-$mode.err"
        python3 bench/ncu_summary.py "$aux/ncu-$model-$mode.csv" 2 | head -${SC_PROFILE_ROWS:-25}
      done
    done
  } > "$out/profile.txt" 2>&1
  grep -E "^== |step_us|per step" "$out/profile.txt"
fi

# threads: the example's MLP at 16 threads under OpenMP and OpenBLAS settings (wait policy,
# binding, BLAS threads), beside 1 and 4 threads: where the time goes when more threads are slower.
if has threads && fits 40; then
  stamp "threads: settings at 16 threads"
  ex_s() { grep -o "examples_per_sec=[0-9]*" | cut -d= -f2; }
  {
    # SC_THREADS_VARIANTS: "threads|VAR=value ..." entries, one per line (the default list without it)
    variants=${SC_THREADS_VARIANTS:-"1|
4|
16|
16|OMP_WAIT_POLICY=passive
16|OMP_WAIT_POLICY=active
16|OMP_PROC_BIND=close OMP_PLACES=cores
16|OPENBLAS_NUM_THREADS=1
16|STAGECRAFT_BLAS_CORE=keep
1|STAGECRAFT_BLAS_CORE=keep
8|
16|STAGECRAFT_BLAS_THREAD_FLOPS=16000000
16|STAGECRAFT_BLAS_SPLIT_FLOPS=2000000
16|STAGECRAFT_BLAS_SPLIT_FLOPS=8000000
8|STAGECRAFT_BLAS_SPLIT_FLOPS=4000000"}
    while IFS= read -r v; do
      [[ -z $v ]] && continue
      n=${v%%|*} extra=${v#*|}
      fits 10 || break
      e=$(env OMP_NUM_THREADS=$n $extra timeout 30 "$fm" --epochs 1 --limit 20000 --threads "$n" 2>/dev/null | ex_s)
      printf "%-3s %-50s %s\n" "$n" "${extra:-default}" "${e:--}"
    done <<< "$variants"
  } | tee "$out/threads.txt"
  # The best stagecraft setting at 16 threads (STAGECRAFT_GRAIN_SCALE, STAGECRAFT_BLAS_*_FLOPS)
  # runs the scaling table below when it beats the defaults by 3%.
  base16=$(awk '$1 == 16 && $2 == "default" {print $3}' "$out/threads.txt" | head -1)
  best=$(sort -k3 -n "$out/threads.txt" | awk '$1 == 16 && $2 ~ /^STAGECRAFT_(GRAIN_SCALE|BLAS_THREAD_FLOPS|BLAS_SPLIT_FLOPS)=/ && $3 != "-" {l = $0} END {print l}')
  if [[ -n $best && -n $base16 && $base16 != - ]] && (($(echo "$best" | awk '{print $3}') * 100 > base16 * 103)); then
    SC_SCALING_ENV=$(echo "$best" | awk '{print $2}') && echo "scaling with $SC_SCALING_ENV"
  fi
fi

# alternate: one run per thread count per round, the counts in turn, so a slow spell of the
# machine falls on every count alike; medians of the rounds (issue 9: never slower with more threads).
# "8" is the example's default (--threads auto: a ThreadTuner keeps the fastest count up to 8),
# "8f" exactly 8 threads (--threads 8).
if has alternate && fits 30; then
  stamp "alternate: the example's MLP on 20000 images at 8, 12 and 16 threads in turn, tuned and fixed"
  ex_s() { grep -o "examples_per_sec=[0-9]*" | cut -d= -f2; }
  {
    rounds=${SC_ALTERNATE_ROUNDS:-7}
    counts="8 8f 12 12f 16 16f"
    declare -A runs=()
    for ((k = 1; k <= rounds; ++k)); do
      fits 8 || break
      line="round $k:"
      for c in $counts; do
        n=${c%f}
        ((n > $(nproc))) && continue
        fixed=auto
        [[ $c == *f ]] && fixed=$n
        e=$(env OMP_NUM_THREADS=$n timeout 30 "$fm" --epochs 1 --limit 20000 --threads $fixed 2>/dev/null | ex_s)
        line+=" $c=${e:--}"
        [[ -n $e ]] && runs[$c]+="$e "
      done
      echo "$line"
    done
    for n in $counts; do
      [[ -z ${runs[$n]:-} ]] && continue
      printf "threads %-3s median %s examples/s of %s runs (%s)\n" "$n" \
        "$(tr ' ' '\n' <<< "${runs[$n]}" | sed '/^$/d' | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')" \
        "$(wc -w <<< "${runs[$n]}")" "${runs[$n]% }"
    done
  } | tee "$out/alternate.txt"
fi

if has scaling && fits 60; then
  stamp "scaling: the example's MLP on 30000 images, 1 epoch (eager; staged at 1 and 16), against PyTorch's copy"
  ex_s() { grep -o "examples_per_sec=[0-9]*" | cut -d= -f2; }
  {
    # eager and staged: the example's default (--threads auto, up to n); eager_fixed: --threads n.
    printf "%-8s %-12s %-12s %-12s %-12s %s\n" threads eager_ex/s eager_fixed staged_ex/s pytorch_ex/s "stagecraft's OpenBLAS core, threads tuned"
    for n in 1 2 4 8 16; do
      ((n > $(nproc))) && break
      fits 25 || break
      e=$(env OMP_NUM_THREADS=$n ${SC_SCALING_ENV:-} timeout 60 "$fm" --epochs 1 --limit 30000 2> "$aux/scaling-$n.err" | ex_s)
      f=$(env OMP_NUM_THREADS=$n ${SC_SCALING_ENV:-} timeout 60 "$fm" --epochs 1 --limit 30000 --threads "$n" 2>/dev/null | ex_s)
      s=-
      ((n == 1 || n == 16)) && s=$(env OMP_NUM_THREADS=$n ${SC_SCALING_ENV:-} timeout 60 "$fm" --epochs 1 --limit 30000 --mode staged 2>/dev/null | ex_s)
      p=$(timeout 60 python3 bench/torch_fashion_mnist.py --threads "$n" --epochs 1 --limit 30000 2>&1 | ex_s)
      printf "%-8s %-12s %-12s %-12s %-12s %s, %s\n" "$n" "${e:--}" "${f:--}" "${s:--}" "${p:--}" \
        "$(grep -o "OpenBLAS core [^,]*" "$aux/scaling-$n.err")" "$(grep -o "threads tuned: .*" "$aux/scaling-$n.err")"
    done
    echo "stagecraft's runs with: ${SC_SCALING_ENV:-defaults}"
    python3 -c "import torch; print('PyTorch', torch.__version__, '|', ' '.join(torch.__config__.parallel_info().split()[:12]))" 2>&1
  } | tee "$out/scaling.txt"
fi

if has examples && fits 60; then
  stamp "examples: fashion_mnist, all 60000 training images"
  {
    for run in "mlp cpu eager 3" "mlp cuda eager 3" "mlp cuda graph 3" "cnn cpu eager 1" "cnn cuda graph 1"; do
      read -r model dev mode epochs <<< "$run"
      echo "== fashion_mnist --model $model --device $dev --mode $mode --epochs $epochs"
      fits 20 || break
      OMP_NUM_THREADS=$(nproc) timeout 60 "$fm" --model "$model" --device "$dev" --mode "$mode" --epochs "$epochs" 2>&1 |
        grep -v "^epoch [0-9]*/"
    done
  } > "$out/examples.log" 2>&1
  grep -E "^== |test_accuracy=.*examples_per_sec|cuda graph:|convolutions:|rror" "$out/examples.log"
fi
