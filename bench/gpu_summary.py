#!/usr/bin/env python3
"""Issue 8's GPU goals from one session's Google Benchmark JSON files (bench_cuda and
bench_cuda_torch, run one after the other on the same GPU by bench/gpu_session.sh): every row's
median, then each goal with its ratio. A row that did not run reads n/a.

  python3 bench/gpu_summary.py OUT/bench_cuda.json OUT/bench_cuda_torch.json
"""
import json
import sys

UNIT = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def medians(paths):
    """{row name without /real_time: the median's fields}; time in seconds under 'secs'."""
    rows = {}
    for path in paths:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            print(f"({path}: {e})")
            continue
        for b in doc.get("benchmarks", []):
            if b.get("aggregate_name", "median") != "median" or b.get("error_occurred"):
                continue
            name = b.get("run_name", b["name"]).replace("/real_time", "")
            b["secs"] = b["real_time"] * UNIT.get(b.get("time_unit", "ns"), 1e-9)
            rows[name] = b
    return rows


def main(paths):
    rows = medians(paths)
    if not rows:
        print("gpu_summary: no rows")
        return 1
    print(f"{'row (median)':58} {'time':>12} {'GB/s':>9} {'other':>s}")
    for name in sorted(rows):
        b = rows[name]
        gbs = b.get("bytes_per_second", 0) / 1e9
        other = []
        for k in ("TFLOP/s", "examples/s", "items_per_second", "fused_groups", "fused_reductions"):
            if k in b:
                other.append(f"{k}={b[k]:.4g}")
        if b.get("label"):
            other.append(b["label"])
        print(f"{name:58} {b['secs'] * 1e6:10.1f}us {gbs:9.1f} {' '.join(other)}")

    def get(name, field="secs"):
        b = rows.get(name)
        return None if b is None or field not in b else b[field]

    def show(what, value, goal, ok):
        mark = "n/a" if value is None else "" if goal == "-" else ("met" if ok(value) else "NOT met")
        text = "n/a" if value is None else value
        print(f"  {what:68} {text:>9}  goal {goal:10} {mark}")

    big = 1 << 28
    print("\nIssue 8 goals (this GPU; ratios within this one run)")
    add = get("cuda/small_add/stagecraft", "items_per_second")
    tadd = get("cuda/small_add/libtorch", "items_per_second")
    uadd = get("cuda/small_add/stagecraft_unbatched", "items_per_second")
    show("eager small op, us per op (stagecraft, batched launches)", add and f"{1e6 / add:.2f}", "<= 3 us",
         lambda v: float(v) <= 3)
    show("eager small op, us per launch (stagecraft, unbatched)", uadd and f"{1e6 / uadd:.2f}", "-", lambda v: True)
    show("eager small op, us per launch (LibTorch)", tadd and f"{1e6 / tadd:.2f}", "-", lambda v: True)
    # Where the eager op's time goes (bench_cuda_launch.cu): the launch floor, the abi kernel alone
    # (no dispatch or allocation), the allocator, cudaGetLastError.
    for label, name in (("  floor: empty kernel launch", "cuda/launch/empty_kernel/param280:0"),
                        ("  floor: empty kernel, 280-byte parameter", "cuda/launch/empty_kernel/param280:1"),
                        ("  the add kernel through the abi (no dispatch, no allocation)", "cuda/launch/abi_add"),
                        ("  caching allocator: allocate + free (host)", "cuda/launch/alloc_free_cached"),
                        ("  cudaGetLastError (host)", "cuda/launch/get_last_error")):
        r = get(name, "items_per_second")
        show(f"{label}, us", r and f"{1e6 / r:.2f}", "-", lambda v: True)
    copy = get("cuda/copy_d2d/256M", "bytes_per_second")
    show("device-to-device copy, TB/s", copy and f"{copy / 1e12:.2f}", "-", lambda v: True)
    for label, name in (("9-op chain traced (vec16)", f"cuda/chain9/staged/n:{big}/vec16:1"),
                        ("9-op chain sc::compile under nvcc (vec16)", f"cuda/chain9/compiled_nvcc/n:{big}/vec16:1"),
                        ("9-op chain eager", f"cuda/chain9/eager/{big}"),
                        ("9-op chain LibTorch eager", f"cuda/chain9/libtorch/{big}")):
        bw = get(name, "bytes_per_second")
        frac = bw / copy if bw and copy else None
        goal = ">= 0.92" if "eager" not in label else "-"
        show(f"{label}, share of the copy's bandwidth", frac and f"{frac:.3f}", goal,
             lambda v, g=goal: g == "-" or float(v) >= 0.92)
    mm, cub = get("cuda/matmul/8192/stagecraft", "TFLOP/s"), get("cuda/matmul/8192/cublas", "TFLOP/s")
    show("matmul 8192^3 f32, stagecraft / cuBLAS", mm and cub and f"{mm / cub:.3f}", ">= 0.95", lambda v: float(v) >= 0.95)
    show("matmul 8192^3 f32, stagecraft TFLOP/s", mm and f"{mm:.1f}", "-", lambda v: True)
    for mode, label, goal in ((0, "eager", 430), (1, "staged kernel by kernel", 150), (2, "staged as a CUDA graph", 150),
                              (3, "staged, default graph policy", 150)):
        t = get(f"cuda/mlp_adam/batch128/mode:{mode}")
        show(f"MLP Adam step batch 128, {label}, us", t and f"{t * 1e6:.0f}", f"<= {goal} us", lambda v, g=goal: float(v) <= g)
    t = get("cuda/mlp_adam/batch128/libtorch")
    show("MLP Adam step batch 128, LibTorch eager, us", t and f"{t * 1e6:.0f}", "-", lambda v: True)
    torch_lstm = get("cuda/lstm50/libtorch")
    for mode, label in ((1, "staged kernel by kernel"), (2, "staged as a CUDA graph"), (3, "staged, default graph policy")):
        t = get(f"cuda/lstm50/mode:{mode}")
        show(f"LSTM 50 steps, LibTorch eager / stagecraft {label}", t and torch_lstm and f"{torch_lstm / t:.1f}x",
             ">= 10x", lambda v: float(v[:-1]) >= 10)
    for mode, label in ((0, "eager, cell staged"), (4, "eager, cell op by op, batched"),
                        (5, "eager, cell op by op, a launch per op")):
        t = get(f"cuda/lstm50/mode:{mode}")
        show(f"LSTM 50 steps, LibTorch eager / stagecraft {label}", t and torch_lstm and f"{torch_lstm / t:.1f}x", "-",
             lambda v: True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
