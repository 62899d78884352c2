#!/usr/bin/env python3
"""Sums an Nsight Compute CSV (ncu --csv --metrics gpu__time_duration.sum) per kernel name.

  python3 bench/ncu_summary.py profile.csv [steps]

Prints, largest total first: launches, total and mean GPU time of each kernel (its name cut at the
template arguments), then the totals per step (`steps`: how many steps the profiled range held).
The kernels' summed time against the step's wall time (profile_cuda_steps's step_us) says how much
of a step is the GPU working and how much is launch gaps.
"""
import csv
import sys
from collections import defaultdict


def short(name):
    name = name.strip().replace("(anonymous namespace)::", "").replace("void ", "")
    for cut in ("<", "("):
        if cut in name:
            name = name[: name.index(cut)]
    return name.strip() or "?"


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    steps = int(argv[1]) if len(argv) > 1 else 1
    rows = []
    with open(argv[0], newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints its own lines before the CSV
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "nsecond")
        value = float(r["Metric Value"].replace(",", ""))
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}.get(unit, 1e-3)
        rows.append((short(r.get("Kernel Name", "?")), value * scale))
    if not rows:
        print("no gpu__time_duration rows (was the range empty, or ncu refused?)")
        return 1
    total = defaultdict(float)
    count = defaultdict(int)
    for name, us in rows:
        total[name] += us
        count[name] += 1
    print(f"{'kernel':60} {'launches':>9} {'total us':>10} {'mean us':>9}")
    for name in sorted(total, key=total.get, reverse=True):
        print(f"{name[:60]:60} {count[name] / steps:9.1f} {total[name] / steps:10.1f} {total[name] / count[name]:9.2f}")
    all_us = sum(total.values())
    print(f"per step: {len(rows) / steps:.0f} kernels, {all_us / steps:.1f} us of GPU time")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
