#!/usr/bin/env python3
"""bench/kernel_trace.py — per-step kernel times from libffn-kernel-trace.so's CSV files
(Note [Kernel trace] in bench/kernel_trace.cpp).

  kernel_trace.py summary TRACE.csv [--marker REGEX] [--skip 20] [--steps 60]
  kernel_trace.py compare A.csv B.csv [--marker REGEX] [--skip 20] [--steps 60] [--top 30]
  kernel_trace.py beside TRACE.csv [--with REGEX] [--top 30]

A step is the time from one launch of the marker kernel (by default the optimizer's last
kernel, ours or PyTorch's fused AdamW) to the next; the first --skip steps (autotuning, the
graph's capture, warm-up) are left out. `summary` prints each kernel's launches, GPU time per
step and time per launch, and how much of the step some kernel was running (the union of
the kernels' intervals); `compare` prints the kernels whose time per step differs most
between two traces (e.g. rank 0 of a 2-GPU run against a 1-GPU run): which kernels get
longer beside the collectives, and the collectives' own kernels. `beside` splits each kernel's
launches (by name and grid; the first fifth of the trace left out) into those that ran more
than half of their time beside a kernel matching --with (default: NCCL's) and the others, and
prints both medians: what running beside it costs each kernel (session 54: the MLP's weight
gradients at half speed beside a bucket's all-reduce).
"""
import argparse
import bisect
import csv
import re
import statistics
import sys
from collections import defaultdict


def load(path, device=None):
    rows = []
    with open(path, newline="") as f:
        r = csv.reader(f)
        next(r)
        for x in r:
            if len(x) < 9:
                continue
            name = ",".join(x[8:])  # demangled names may hold commas
            d = int(x[2])
            if device is not None and d != device:
                continue
            # start, end, device, stream, graph, grid, name
            rows.append((int(x[0]), int(x[1]), d, int(x[3]), int(x[4]), int(x[5]), name))
    rows.sort()
    return rows


def short(name, width=100):
    name = re.sub(r"^void ", "", name)
    return name if len(name) <= width else name[: width - 3] + "..."


def steps(rows, marker, skip, count, gap_ms=1.0):
    """[(t0, t1)]: step windows between the ends of the marker kernel. Launches of it less than
    gap_ms apart are one boundary (an optimizer of several launches), at the last one's end."""
    m = re.compile(marker)
    ends = []
    for s, e, *_rest, n in rows:
        if not m.search(n):
            continue
        if ends and s - ends[-1] < gap_ms * 1e6:
            ends[-1] = max(ends[-1], e)
        else:
            ends.append(e)
    win = list(zip(ends, ends[1:]))[skip: skip + count]
    if not win:
        sys.exit(f"kernel_trace: fewer than {skip + 2} launches of a kernel matching '{marker}'")
    return win


def per_step(rows, win):
    """{name: (launches, ns)} summed over the windows, and the union of intervals per window."""
    acc = defaultdict(lambda: [0, 0])
    busy = []
    i = 0
    for t0, t1 in win:
        while i < len(rows) and rows[i][0] < t0:
            i += 1
        j, cover, last = i, 0, t0
        while j < len(rows) and rows[j][0] < t1:
            s, e, *_rest, n = rows[j]
            acc[n][0] += 1
            acc[n][1] += e - s
            s, e = max(s, last), min(e, t1)
            if e > s:
                cover += e - s
                last = e
            j += 1
        busy.append(cover)
    return acc, busy


def summarize(path, a):
    rows = load(path, a.device)
    win = steps(rows, a.marker, a.skip, a.steps)
    acc, busy = per_step(rows, win)
    n = len(win)
    lens = [(t1 - t0) / 1e6 for t0, t1 in win]
    total = sum(ns for _, ns in acc.values()) / n / 1e6
    print(f"{path}: {n} steps, step median {statistics.median(lens):.3f} ms; kernels {total:.3f} ms "
          f"a step (summed), some kernel running {statistics.median(busy) / 1e6:.3f} ms (median)")
    print(f"{'ms/step':>9} {'launches':>8} {'us/launch':>9}  kernel")
    for name, (k, ns) in sorted(acc.items(), key=lambda x: -x[1][1])[: a.top]:
        print(f"{ns / n / 1e6:9.4f} {k / n:8.1f} {ns / k / 1e3:9.2f}  {short(name)}")
    return acc, n


def compare(pa, pb, a):
    ra, rb = load(pa, a.device), load(pb, a.device)
    wa, wb = steps(ra, a.marker, a.skip, a.steps), steps(rb, a.marker, a.skip, a.steps)
    (ka, ba), (kb, bb) = per_step(ra, wa), per_step(rb, wb)
    na, nb = len(wa), len(wb)
    la = statistics.median([(t1 - t0) / 1e6 for t0, t1 in wa])
    lb = statistics.median([(t1 - t0) / 1e6 for t0, t1 in wb])
    print(f"A {pa}: {na} steps, median {la:.3f} ms, some kernel running {statistics.median(ba) / 1e6:.3f}")
    print(f"B {pb}: {nb} steps, median {lb:.3f} ms, some kernel running {statistics.median(bb) / 1e6:.3f}")
    rows = []
    for name in set(ka) | set(kb):
        x = ka[name][1] / na / 1e6 if name in ka else 0.0
        y = kb[name][1] / nb / 1e6 if name in kb else 0.0
        rows.append((y - x, x, y, name))
    print(f"{'A ms/step':>9} {'B ms/step':>9} {'B - A':>8}  kernel")
    for d, x, y, name in sorted(rows, key=lambda r: -abs(r[0]))[: a.top]:
        print(f"{x:9.4f} {y:9.4f} {d:+8.4f}  {short(name)}")
    print(f"{sum(r[1] for r in rows):9.4f} {sum(r[2] for r in rows):9.4f} "
          f"{sum(r[0] for r in rows):+8.4f}  all kernels (summed; overlapping kernels count twice)")


def beside(path, a):
    rows = load(path, a.device)
    m = re.compile(a.with_)
    other = [(s, e) for s, e, *_rest, n in rows if m.search(n)]
    alone, near = defaultdict(list), defaultdict(list)
    starts = [s for s, _ in other]
    for s, e, *_rest, grid, n in rows[len(rows) // 5:]:
        if m.search(n) or e <= s:
            continue
        i = max(0, bisect.bisect_left(starts, s) - 64)  # the others overlapping [s, e)
        o = 0
        for s2, e2 in other[i:]:
            if s2 >= e:
                break
            o += max(0, min(e, e2) - max(s, s2))
        key = (n, grid)
        (near if o > (e - s) / 2 else alone)[key].append((e - s) / 1e3)
    print(f"{path}: launches alone and beside kernels matching '{a.with_}' (median us)")
    print(f"{'alone':>9} {'n':>5} {'beside':>9} {'n':>5} {'ratio':>6}  kernel")
    keys = sorted(near, key=lambda k: -sum(near[k]))[: a.top]
    for k in keys:
        x = statistics.median(alone[k]) if alone[k] else float("nan")
        y = statistics.median(near[k])
        print(f"{x:9.1f} {len(alone[k]):5d} {y:9.1f} {len(near[k]):5d} {y / x:6.2f}  "
              f"{short(k[0], a.width)} [grid {k[1]}]")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["summary", "compare", "beside"])
    p.add_argument("traces", nargs="+")
    p.add_argument("--marker", default=r"adamw_kernel|FusedAdam",
                   help="regex of the optimizer's kernels (ours: adamw_kernel; PyTorch's fused AdamW: FusedAdam)")
    p.add_argument("--skip", type=int, default=20, help="steps left out at the start")
    p.add_argument("--steps", type=int, default=60, help="steps summed")
    p.add_argument("--device", type=int, default=None, help="only this device's kernels")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--width", type=int, default=100, help="beside: characters of each name")
    p.add_argument("--with", dest="with_", default=r"^nccl",
                   help="beside: regex of the kernels that others run beside (default: NCCL's)")
    a = p.parse_args()
    if a.mode == "summary":
        for t in a.traces:
            summarize(t, a)
    elif a.mode == "beside":
        for t in a.traces:
            beside(t, a)
    else:
        if len(a.traces) != 2:
            p.error("compare takes two traces")
        compare(a.traces[0], a.traces[1], a)


if __name__ == "__main__":
    main()
