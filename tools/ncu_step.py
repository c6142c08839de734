"""tools/ncu_step.py — per-kernel GPU time of ffn-train's steps from `ncu --csv --page raw
--metrics gpu__time_duration.sum` output (tools/gpu-check ncustep writes it): the kernels
after the 3rd step's optimizer decision (decide_kernel, one per step) up to the last one,
summed by name and divided by the steps covered. With --graphs (output of ncu
--graph-profiling graph): each CUDA graph replay's time, in ms.

    python3 tools/ncu_step.py ncu.csv
    python3 tools/ncu_step.py --graphs ncu_graph.csv
"""
import csv, re, sys
from collections import defaultdict
graphs = sys.argv[1] == "--graphs"
rows = list(csv.reader(open(sys.argv[-1])))
hdr = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
h = rows[hdr]
name_i, t_i = h.index("Kernel Name"), h.index("gpu__time_duration.sum")
ks = []
for r in rows[hdr + 2:]:
    if len(r) <= t_i: continue
    try: ks.append((r[name_i], float(r[t_i].replace(",", ""))))
    except ValueError: pass
if graphs:
    print(" ".join(f"{t / 1e6:.2f}" for n, t in ks if n == "graph"))
    sys.exit(0)
marks = [i for i, (n, _) in enumerate(ks) if "decide_kernel" in n]
a, b = marks[2], marks[-1]
steps = len(marks) - 3
unit = 1e-6  # ns -> ms (the units row says ns)
def short(n):
    n = n.replace("<unnamed>::", "").replace("(anonymous namespace)::", "")
    n = re.sub(r"^void ", "", n)
    base = re.sub(r"[<(].*", "", n).split("::")[-1]
    args = re.match(r"[^<(]*<([^>]*)>", n)
    return (base + ("<" + args.group(1)[:40] + ">" if args else ""))[:70]
agg = defaultdict(float); cnt = defaultdict(int)
for n, t in ks[a + 1:b + 1]:
    agg[short(n)] += t * unit / steps; cnt[short(n)] += 1
total = sum(agg.values())
print(f"steps {steps}, kernels per step {sum(cnt.values()) / steps:.0f}, GPU time per step {total:.2f} ms")
for n, t in sorted(agg.items(), key=lambda x: -x[1])[:40]:
    print(f"{t:8.3f} ms  {cnt[n] / steps:6.1f}/step  {n}")
