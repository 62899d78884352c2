#!/usr/bin/env python3
"""Markdown tables from bench_blas_libs JSON runs (--benchmark_out, with repetitions).

usage: blas_libs_table.py RUN.json [RUN.json ...]
       blas_libs_table.py LABEL=RUN.json LABEL=RUN.json ...   (one column per run and back end:
       the same binary under different settings, e.g. OPENBLAS_CORETYPE=Prescott)

For each case and back end: the median GFLOP/s of each run, shown as their mean with the
spread between runs (half the max-min range, in %), then the ratio of each back end to
what stagecraft calls (OpenBLAS sgemv at M=1, sgemm otherwise; > 1 = faster than it).
"""
import json
import re
import sys
from collections import defaultdict

ORDER = ["openblas", "openblas_sgemv", "hand_gemv", "blis", "onednn", "libxsmm", "libxsmm_jit"]
NAME = re.compile(r"gemm/([^/]+)/(\w\w)/M:(\d+)/K:(\d+)/N:(\d+)/([^/]+)")


def load(paths):
    runs = defaultdict(list)  # (case, backend) -> [median GFLOP/s per run]
    cases = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for b in data["benchmarks"]:
            if b.get("aggregate_name") != "median" or "FLOPS" not in b:
                continue
            m = NAME.match(b["run_name"])
            backend, layout, mm, kk, nn, label = m.groups()
            case = (label, layout, int(mm), int(kk), int(nn))
            if case not in cases:
                cases.append(case)
            runs[case, backend].append(b["FLOPS"] / 1e9)
    return cases, runs


def main(paths):
    cases, runs = load(paths)
    backends = [b for b in ORDER if any((c, b) in runs for c in cases)]
    mean = lambda v: sum(v) / len(v)
    head = "| case | layout | M K N | " + " | ".join(backends) + " |"
    rule = "|---|---|---|" + "---|" * len(backends)
    print("GFLOP/s (mean of the runs' medians, ±half the range between runs)\n")
    print(head + "\n" + rule)
    for c in cases:
        cells = []
        for b in backends:
            v = runs.get((c, b))
            cells.append(f"{mean(v):.1f} ±{50 * (max(v) - min(v)) / mean(v):.0f}%" if v else "")
        print(f"| {c[0]} | {c[1]} | {c[2]} {c[3]} {c[4]} | " + " | ".join(cells) + " |")
    print("\nRatio to what stagecraft calls (OpenBLAS sgemv at M=1, sgemm otherwise)\n")
    print(head + "\n" + rule)
    for c in cases:
        base = runs.get((c, "openblas_sgemv")) or runs.get((c, "openblas"))
        cells = []
        for b in backends:
            v = runs.get((c, b))
            cells.append(f"{mean(v) / mean(base):.2f}" if v and base else "")
        print(f"| {c[0]} | {c[1]} | {c[2]} {c[3]} {c[4]} | " + " | ".join(cells) + " |")


def columns(pairs):
    loaded = [(label, *load([path])) for label, path in (p.split("=", 1) for p in pairs)]
    cases = loaded[0][1]
    backends = [b for b in ORDER if all(any((c, b) in runs for c in cases) for _, _, runs in loaded)]
    cols = [(b, label, runs) for b in backends for label, _, runs in loaded]
    print("| case | layout | M K N | " + " | ".join(f"{b} {label}" for b, label, _ in cols) + " |")
    print("|---|---|---|" + "---|" * len(cols))
    for c in cases:
        cells = [f"{runs[c, b][0]:.1f}" if (c, b) in runs else "" for b, _, runs in cols]
        print(f"| {c[0]} | {c[1]} | {c[2]} {c[3]} {c[4]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if all("=" in a for a in sys.argv[1:]):
        columns(sys.argv[1:])
    else:
        main(sys.argv[1:])
