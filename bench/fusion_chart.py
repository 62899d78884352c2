#!/usr/bin/env python3
"""Chart and table of bench_fusion_chains (the kernel-fusion suite of issue #7).

Usage:
  for t in 1 2; do
    STAGECRAFT_BENCH_THREADS=$t OMP_NUM_THREADS=$t build/release/bench/bench_fusion_chains \\
      --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true \\
      --benchmark_report_aggregates_only=true --benchmark_out=chains_t$t.json --benchmark_out_format=json
  done
  python3 bench/fusion_chart.py chains_t1.json chains_t2.json -o fusion_chains.svg

Reads Google Benchmark JSON files (one per thread count; the count comes from the report's
"threads" context), takes the median over repetitions (the "median" aggregates, or the median of
the raw repetitions when those are in the file), writes an SVG of GB/s per chain length (one panel
per thread count and size, one series per variant, the copy's bandwidth as a dashed line), and
prints a markdown table of time, GB/s and speed relative to the hand loop (hand's time / the
row's time: above 1 is faster than hand). Plain Python, no plotting library.
"""
import argparse
import json
import re
import statistics
import sys
from collections import defaultdict

VARIANTS = ["eager", "traced", "traced_unchained", "compiled", "xtensor", "hand", "hand_1t"]
COLORS = {"eager": "#d62728", "traced": "#ff7f0e", "traced_unchained": "#e377c2", "compiled": "#2ca02c", "xtensor": "#1f77b4",
          "hand": "#000000", "hand_1t": "#7f7f7f", "copy": "#9467bd"}
NAME = re.compile(r"^fusion_chains/(?P<n>[^/]+)/(?:K(?P<k>\d+)/(?P<v>[a-z_0-9]+)|(?P<copy>copy))(?:/real_time)?$")
TO_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def size_of(label):
    """'16M' -> 16 * 2**20, '4096' -> 4096."""
    return int(label[:-1]) << 20 if label.endswith("M") else int(label)


def load(paths):
    """{(threads, n_label): {(k or None, variant): (seconds, GB/s)}} from the medians of each file."""
    data = defaultdict(dict)
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        threads = int(report.get("context", {}).get("threads", 0))
        raw, medians = defaultdict(list), {}
        for b in report.get("benchmarks", []):
            if b.get("error_occurred"):
                continue
            m = NAME.match(b.get("run_name", b["name"]))
            if not m:
                continue
            key = (m["n"], None if m["copy"] else int(m["k"]), "copy" if m["copy"] else m["v"])
            gbs = b.get("GB/s")  # the counter's raw value: bytes per second
            sample = (b["real_time"] * TO_SECONDS[b.get("time_unit", "ns")], gbs / 1e9 if gbs is not None else None)
            if b.get("run_type") == "aggregate":
                if b.get("aggregate_name") == "median":
                    medians[key] = sample
            else:
                raw[key].append(sample)
        for key in set(raw) | set(medians):
            if raw[key]:  # the repetitions themselves are here: take their median
                t = statistics.median(s[0] for s in raw[key])
                g = [s[1] for s in raw[key] if s[1] is not None]
                sample = (t, statistics.median(g) if g else None)
            else:
                sample = medians[key]
            n_label, k, v = key
            data[(threads, n_label)][(k, v)] = sample
    return data


def fmt_time(s):
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def table(data):
    lines = []
    for (threads, n_label) in sorted(data, key=lambda p: (p[0], size_of(p[1]))):
        rows = data[(threads, n_label)]
        variants = [v for v in VARIANTS if any(key[1] == v for key in rows)]
        copy = rows.get((None, "copy"))
        lines.append(f"\n**n = {n_label}, threads = {threads}**" +
                     (f" (copy: {fmt_time(copy[0])}, {copy[1]:.1f} GB/s)" if copy and copy[1] else "") + "\n")
        lines.append("| K | " + " | ".join(variants) + " |")
        lines.append("|---|" + "---|" * len(variants))
        for k in sorted({key[0] for key in rows if key[0] is not None}):
            hand = rows.get((k, "hand"))
            cells = []
            for v in variants:
                r = rows.get((k, v))
                if not r:
                    cells.append("")
                    continue
                cell = fmt_time(r[0]) + (f", {r[1]:.1f} GB/s" if r[1] is not None else "")
                if hand and v != "hand":
                    cell += f", {hand[0] / r[0]:.2f}x"
                cells.append(cell)
            lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines.append("\nCells: median time, GB/s (10^9 bytes/s: 12 bytes per element, 8 for the copy), and speed "
                 "relative to `hand` (hand's time / this time; above 1 = faster than hand).")
    return "\n".join(lines)


def nice_max(v):
    """A round axis maximum at or above v."""
    if v <= 0:
        return 1.0
    p = 10 ** (len(str(int(v))) - 1) if v >= 1 else 0.1
    for m in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * p >= v:
            return m * p
    return 10 * p


def svg(data):
    panels = sorted(data, key=lambda p: (p[0], size_of(p[1])))
    thread_counts = sorted({p[0] for p in panels})
    sizes = sorted({p[1] for p in panels}, key=size_of)
    pw, ph, ml, mr, mt, mb = 420, 300, 60, 20, 40, 45  # panel size and its margins
    width = pw * len(sizes)
    # Legend: the variants present anywhere, then the copy line; wrapped to the chart's width.
    present = [v for v in VARIANTS if any((k, v) in data[p] for p in panels for k in (2, 4, 8, 16))]
    items, x, y = [], 10, 20
    for v in present + ["copy"]:
        w = 40 + 8 * len(v)
        if x + w > width and x > 10:
            x, y = 10, y + 20
        items.append((v, x, y))
        x += w
    legend_h = y + 20
    height = ph * len(thread_counts) + legend_h
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    for v, x, y in items:
        dash = ' stroke-dasharray="6,4"' if v == "copy" else ""
        out.append(f'<line x1="{x}" y1="{y}" x2="{x + 24}" y2="{y}" stroke="{COLORS[v]}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{x + 30}" y="{y + 4}">{v}</text>')
    for (threads, n_label) in panels:
        rows = data[(threads, n_label)]
        ox = pw * sizes.index(n_label)
        oy = legend_h + ph * thread_counts.index(threads)
        x0, y0, x1, y1 = ox + ml, oy + ph - mb, ox + pw - mr, oy + mt  # plot area corners
        ks = sorted({key[0] for key in rows if key[0] is not None})
        copy = rows.get((None, "copy"))
        top = nice_max(max([r[1] or 0 for r in rows.values()] + [1]) * 1.05)
        sx = lambda i: x0 + (x1 - x0) * (i + 0.5) / max(len(ks), 1)
        sy = lambda g: y0 - (y0 - y1) * g / top
        out.append(f'<text x="{ox + pw / 2}" y="{oy + mt - 12}" text-anchor="middle" font-weight="bold">'
                   f'n = {n_label}, {threads} thread{"s" if threads != 1 else ""}</text>')
        for j in range(6):  # horizontal grid with labels
            g = top * j / 5
            out.append(f'<line x1="{x0}" y1="{sy(g):.1f}" x2="{x1}" y2="{sy(g):.1f}" stroke="#ddd"/>')
            out.append(f'<text x="{x0 - 6}" y="{sy(g) + 4:.1f}" text-anchor="end">{g:g}</text>')
        out.append(f'<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="black"/>')
        out.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>')
        for i, k in enumerate(ks):
            out.append(f'<text x="{sx(i):.1f}" y="{y0 + 16}" text-anchor="middle">{k}</text>')
        out.append(f'<text x="{(x0 + x1) / 2}" y="{y0 + 34}" text-anchor="middle">ops in the chain (K)</text>')
        out.append(f'<text x="{ox + 16}" y="{(y0 + y1) / 2}" text-anchor="middle" '
                   f'transform="rotate(-90 {ox + 16} {(y0 + y1) / 2})">GB/s</text>')
        if copy and copy[1]:
            out.append(f'<line x1="{x0}" y1="{sy(copy[1]):.1f}" x2="{x1}" y2="{sy(copy[1]):.1f}" '
                       f'stroke="{COLORS["copy"]}" stroke-width="1.5" stroke-dasharray="6,4"/>')
            out.append(f'<text x="{x0 + 4}" y="{sy(copy[1]) - 5:.1f}" fill="{COLORS["copy"]}" stroke="white" '
                       f'stroke-width="3" paint-order="stroke">'
                       f'copy {copy[1]:.0f} GB/s</text>')
        for v in present:
            pts = [(sx(i), sy(rows[(k, v)][1])) for i, k in enumerate(ks) if (k, v) in rows and rows[(k, v)][1]]
            if not pts:
                continue
            out.append(f'<polyline fill="none" stroke="{COLORS[v]}" stroke-width="2" points="' +
                       " ".join(f"{px:.1f},{py:.1f}" for px, py in pts) + '"/>')
            out += [f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{COLORS[v]}"/>' for px, py in pts]
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", nargs="+", help="Google Benchmark JSON output of bench_fusion_chains")
    ap.add_argument("-o", "--out", default="fusion_chains.svg", help="SVG to write (default: fusion_chains.svg)")
    args = ap.parse_args()
    data = load(args.json)
    if not data:
        sys.exit("fusion_chart.py: no fusion_chains/... rows in " + ", ".join(args.json))
    with open(args.out, "w") as f:
        f.write(svg(data))
    print(table(data))
    print(f"\nchart: {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
