#!/usr/bin/env python3
"""bench/compare_torch.py — fused-ffn against PyTorch on the same GPU, in one run.

For each docs/design.md workload (mirrors bench/workloads.h) it times forward+backward of
PyTorch eager, torch.compile and the bare GEMMs of the same shapes (torch.mm into
preallocated outputs: the floor), runs `ffn-bench` for our numbers in the same
invocation, and prints one markdown table plus a JSON file with every number.

Timing: CUDA events after warm-up, the median of at least --iters runs spread over
--window-ms of wall time (both sides; Note [Timing window] in bench/timing.h), random
normal inputs.
Saved bytes: tensors autograd keeps for backward (saved_tensors_hooks), not counting
inputs, parameters or the output.
"""
import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

# name, dtype, m, d, h1 (rows of W1, 0 = none), d_out (rows of W2, 0 = none), gated, act, p_hidden, p_out, bias1, bias2
WORKLOADS = [
    ("welder_fc2", torch.float16, 2048, 16384, 0, 4096, False, "none", 0.5, 0.0, False, True),
    ("ffn_d1024", torch.bfloat16, 16384, 1024, 4096, 1024, False, "tanh", 0.1, 0.1, True, True),
    ("ffn_d4096", torch.bfloat16, 8192, 4096, 16384, 4096, False, "tanh", 0.1, 0.1, True, True),
    ("geglu_d1024", torch.bfloat16, 16384, 1024, 8192, 0, True, "tanh", 0.0, 0.0, True, False),
    ("geglu_d2048", torch.bfloat16, 16384, 2048, 16384, 0, True, "tanh", 0.0, 0.0, True, False),
]


def make(w, dev):
    name, dt, m, d, h1, d_out, gated, act, p1, p2, bias1, bias2 = w
    g = torch.Generator(device=dev).manual_seed(1234)
    hidden = (h1 // 2 if gated else h1) if h1 else d
    rn = lambda *s, std=1.0: (torch.randn(*s, generator=g, device=dev, dtype=torch.float32) * std).to(dt)
    t = {"x": rn(m, d).requires_grad_()}
    if h1:
        t["w1"] = rn(h1, d, std=d ** -0.5).requires_grad_()
        t["b1"] = rn(h1, std=0.1).requires_grad_() if bias1 else None
    if d_out:
        t["w2"] = rn(d_out, hidden, std=hidden ** -0.5).requires_grad_()
        t["b2"] = rn(d_out, std=0.1).requires_grad_() if bias2 else None
    t["dy"] = rn(m, d_out if d_out else hidden)
    return t


def forward_fn(w):
    name, dt, m, d, h1, d_out, gated, act, p1, p2, bias1, bias2 = w

    def fwd(t):
        x = t["x"]
        if name == "welder_fc2":
            h = F.dropout(F.gelu(x.float()).to(x.dtype), p1)
            return F.linear(h, t["w2"], t["b2"])
        z = F.linear(x, t["w1"], t["b1"])
        if gated:
            v, gt = z.chunk(2, dim=-1)
            h = v * F.gelu(gt, approximate="tanh")
        else:
            h = F.gelu(z, approximate="tanh")
        h = F.dropout(h, p1) if p1 > 0 else h
        if not d_out:
            return h
        y = F.linear(h, t["w2"], t["b2"])
        return F.dropout(y, p2) if p2 > 0 else y

    return fwd


WINDOW_MS = 1000.0  # --window-ms


def median_ms(fn, warmup, iters):
    """At least `iters` timed runs spread over WINDOW_MS of wall time, as ffn-bench times (Note
    [Timing window] in bench/timing.h: under the power cap the clock swings for seconds)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    start = time.perf_counter()
    while not times or len(times) < iters or (time.perf_counter() - start) * 1e3 < WINDOW_MS:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def step_fn(fwd, t):
    params = [v for k, v in t.items() if k != "dy" and v is not None]

    def step():
        for p in params:
            p.grad = None
        fwd(t).backward(t["dy"])

    return step


def saved_bytes(fwd, t):
    keep = {v.untyped_storage().data_ptr() for k, v in t.items() if v is not None}
    seen = {}

    def pack(x):
        ptr = x.untyped_storage().data_ptr()
        if ptr not in keep:
            seen[ptr] = x.untyped_storage().nbytes()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        y = fwd(t)
    seen.pop(y.untyped_storage().data_ptr(), None)
    total = sum(seen.values())
    y.backward(t["dy"])
    return total


def gemm_floor_ms(w, t, warmup, iters):
    name, dt, m, d, h1, d_out, gated, act, p1, p2, bias1, bias2 = w
    dev = t["x"].device
    hidden = (h1 // 2 if gated else h1) if h1 else d
    x, dy = t["x"].detach(), t["dy"]
    hd = torch.randn(m, hidden, device=dev, dtype=dt)
    ops = []
    if h1:
        w1 = t["w1"].detach()
        dz = torch.randn(m, h1, device=dev, dtype=dt)
        z, dw1, dx = torch.empty(m, h1, device=dev, dtype=dt), torch.empty_like(w1), torch.empty_like(x)
        ops += [lambda: torch.mm(x, w1.t(), out=z), lambda: torch.mm(dz.t(), x, out=dw1), lambda: torch.mm(dz, w1, out=dx)]
    if d_out:
        w2 = t["w2"].detach()
        y, dhd, dw2 = torch.empty(m, d_out, device=dev, dtype=dt), torch.empty_like(hd), torch.empty_like(w2)
        ops += [lambda: torch.mm(hd, w2.t(), out=y), lambda: torch.mm(dy, w2, out=dhd), lambda: torch.mm(dy.t(), hd, out=dw2)]

    def run():
        for op in ops:
            op()

    return median_ms(run, warmup, iters)


def write_latest(args, rows, device, today):
    """bench/results/latest/ffn.json: one object per workload; floor_ms is our bare GEMMs,
    torch_floor_ms PyTorch's, and the ratios are against the faster of the two."""
    command = " ".join(["python3", "bench/compare_torch.py"] + sys.argv[1:])
    out = []
    for r in rows:
        o = r["ours"] or {}
        if "ms" not in o:
            continue
        floor = min(o["gemm_floor_ms"], r["torch_gemm_floor_ms"])
        e = {"workload": r["workload"], "ours_ms": round(o["ms"], 4),
             "floor_ms": round(o["gemm_floor_ms"], 4),
             "torch_floor_ms": round(r["torch_gemm_floor_ms"], 4),
             "eager_ms": round(r["eager_ms"], 4)}
        if "compile_ms" in r:
            e["compile_ms"] = round(r["compile_ms"], 4)
        e.update({"saved_bytes": o.get("saved_bytes", 0), "device": device, "date": today,
                  "torch": torch.__version__, "command": command, "window_ms": args.window_ms,
                  "ours_over_floor": round(o["ms"] / floor, 3)})
        if "compile_ms" in r:
            e["ours_over_compile"] = round(o["ms"] / r["compile_ms"], 3)
        out.append(e)
    with open(args.latest, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ffn-bench", required=True, help="path to the ffn-bench binary")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--window-ms", type=float, default=1000.0,
                    help="each timed loop runs at least this long, ours and PyTorch's "
                         "(0: exactly --iters runs)")
    ap.add_argument("--json", default=None, help="write all numbers here")
    ap.add_argument("--latest", default=None,
                    help="also write issue 13's record here (bench/results/latest/ffn.json)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--workload", action="append", default=None)
    args = ap.parse_args()
    global WINDOW_MS
    WINDOW_MS = args.window_ms

    dev = torch.device("cuda")
    cmd = [args.ffn_bench, "--iters", str(args.iters), "--warmup", str(args.warmup),
           "--window-ms", str(args.window_ms)]
    for wl in args.workload or []:
        cmd += ["--workload", wl]
    ours = {}
    for line in subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            ours[r["workload"]] = r

    rows = []
    for w in WORKLOADS:
        name = w[0]
        if args.workload and name not in args.workload:
            continue
        torch.manual_seed(0)
        t = make(w, dev)
        fwd = forward_fn(w)
        r = {"workload": name, "ours": ours.get(name)}
        r["eager_ms"] = median_ms(step_fn(fwd, t), args.warmup, args.iters)
        r["eager_saved_bytes"] = saved_bytes(fwd, t)
        if not args.no_compile:
            cfwd = torch.compile(fwd)
            r["compile_ms"] = median_ms(step_fn(cfwd, t), args.warmup + 3, args.iters)
        r["torch_gemm_floor_ms"] = gemm_floor_ms(w, t, args.warmup, args.iters)
        rows.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
        del t
        torch.cuda.empty_cache()

    name = torch.cuda.get_device_name()
    today = datetime.date.today().isoformat()
    print(f"\nDevice: {name}; date: {today}; torch {torch.__version__}; "
          f"median of >= {args.iters} runs over >= {args.window_ms:.0f} ms each\n")
    print("| workload | ours ms | eager ms | compile ms | GEMM floor ms (ours / torch) | ours/eager | ours/compile | ours/floor | TFLOP/s | saved MiB (ours / eager) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    mib = lambda b: b / 2**20
    for r in rows:
        o = r["ours"] or {}
        ms = o.get("ms", float("nan"))
        floor = min(o.get("gemm_floor_ms", float("inf")), r["torch_gemm_floor_ms"])
        comp = r.get("compile_ms", float("nan"))
        print(f"| {r['workload']} | {ms:.3f} | {r['eager_ms']:.3f} | {comp:.3f} | "
              f"{o.get('gemm_floor_ms', float('nan')):.3f} / {r['torch_gemm_floor_ms']:.3f} | "
              f"{ms / r['eager_ms']:.3f} | {ms / comp:.3f} | {ms / floor:.3f} | {o.get('tflops', float('nan')):.0f} | "
              f"{mib(o.get('saved_bytes', 0)):.0f} / {mib(r['eager_saved_bytes']):.0f} |")
    if args.latest:
        write_latest(args, rows, name, today)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "date": today, "torch": torch.__version__, "iters": args.iters,
                       "window_ms": args.window_ms, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
