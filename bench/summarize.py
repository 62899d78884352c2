#!/usr/bin/env python3
"""Markdown tables of benchmark medians from Google Benchmark JSON files (run_benchmarks.sh).

Benchmark names hold their library as one path segment (stagecraft, hand_loop, libtorch, ...);
the other segments name the case. For each case: the median time of every library, and
stagecraft's speed relative to each (other's time / stagecraft's time: 1.00 = as fast, > 1 = faster).
Times are real (wall-clock) time for threaded benchmarks (names ending in /real_time), CPU time otherwise.
"""
import json
import sys
from collections import OrderedDict

LIBS = ["stagecraft", "hand_loop", "hand_xsimd", "cblas_sgemm", "cblas_sgemv", "xtensor",
        "libtorch", "libtorch_out", "libtorch_requires_grad"]


def fmt_time(ns):
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def to_ns(t, unit):
    return t * {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[unit]


def main(paths):
    cases = OrderedDict()  # case -> {lib: ns}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for b in data["benchmarks"]:
            if b.get("aggregate_name") != "median":
                continue
            name = b["run_name"]
            real = name.endswith("/real_time")
            parts = [p for p in name.split("/") if p != "real_time"]
            lib = next((p for p in parts if p in LIBS), None)
            if lib is None:
                continue
            case = "/".join(p for p in parts if p != lib)
            t = to_ns(b["real_time"] if real else b["cpu_time"], b["time_unit"])
            cases.setdefault(case, OrderedDict())[lib] = t
    libs = [l for l in LIBS if any(l in v for v in cases.values())]
    print("| case | " + " | ".join(libs) + " |")
    print("|---|" + "---|" * len(libs))
    for case, v in cases.items():
        print(f"| {case} | " + " | ".join(fmt_time(v[l]) if l in v else "" for l in libs) + " |")
    print()
    print("stagecraft's speed relative to each (their time / stagecraft's time; > 1: stagecraft faster)")
    print()
    others = [l for l in libs if l != "stagecraft"]
    print("| case | " + " | ".join(f"vs {l}" for l in others) + " |")
    print("|---|" + "---|" * len(others))
    for case, v in cases.items():
        if "stagecraft" not in v:
            continue
        sc = v["stagecraft"]
        print(f"| {case} | " + " | ".join(f"{v[l] / sc:.2f}" if l in v else "" for l in others) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
