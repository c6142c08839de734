#!/usr/bin/env python3
"""bench/compare_attention.py — the fused causal attention against PyTorch's
scaled_dot_product_attention in one run, at the GPT shapes of `ffn-bench --attention`.

PyTorch side: bf16 q, k, v split from one [B, T, 3·H·D] tensor and viewed as [B, H, T, D]
(nanoGPT's layout, as our kernels read it), is_causal=True, each SDPA backend that runs
(flash, cuDNN, memory-efficient) timed alone: forward, and backward as autograd.grad of
the output; its GPU kernel time per call (torch.profiler) is what ours is compared with, its
CUDA-event time (with launch and autograd overhead) is printed beside it. Ours: `ffn-bench
--attention` (both CUDA implementations, and the Hopper forward with its other block size;
a call's share of the median CUDA-event time of four back-to-back calls, so the host's
launch work hides as in a training step; one or two kernels per call). Prints one table and
writes --json (a list, one object per shape and kernel).

    python3 bench/compare_attention.py --ffn-bench build-gpu/bench/ffn-bench [--json out.json]
"""
import argparse
import datetime
import json
import subprocess

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from compare_torch import median_ms  # CUDA-event median, as the other comparisons

SHAPES = {"gpt2_small": (16, 1024, 12, 64), "gpt2_t512": (32, 512, 12, 64),
          "shakespeare_char": (64, 256, 6, 64)}
BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def kernel_ms(fn, iters):
    """GPU kernel time per call (torch.profiler), and the three largest kernels."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    rows = [(e.self_device_time_total, e.key) for e in prof.key_averages() if e.self_device_time_total > 0]
    top = [f"{k[:40]} {t / iters / 1000:.3f}" for t, k in sorted(rows, reverse=True)[:3]]
    return sum(t for t, _ in rows) / iters / 1000, top


def torch_rows(warmup, iters):
    rows = {}
    for name, (b, t, h, d) in SHAPES.items():
        g = torch.Generator(device="cuda").manual_seed(9)
        qkv = torch.randn(b, t, 3 * h * d, device="cuda", dtype=torch.bfloat16, generator=g)
        dy = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, generator=g)
        qkv.requires_grad_(True)
        for backend, enum in BACKENDS.items():
            q, k, v = (x.view(b, t, h, d).transpose(1, 2) for x in qkv.split(h * d, dim=2))
            try:
                with sdpa_kernel([enum]):
                    def fwd():
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    out = fwd()
                    f_ms = median_ms(fwd, warmup, iters)
                    def bwd():
                        return torch.autograd.grad(out, qkv, dy, retain_graph=True)
                    b_ms = median_ms(bwd, warmup, iters)
                    fk, ftop = kernel_ms(fwd, iters)
                    bk, btop = kernel_ms(bwd, iters)
            except RuntimeError as e:  # backend not available for this shape/GPU
                print(f"# {name} {backend}: not run ({str(e).splitlines()[0][:100]})")
                continue
            # The ratios use the kernel times (no launch or autograd overhead counted against
            # PyTorch); the event times are printed beside them.
            rows[(name, backend)] = (fk, bk, f_ms, b_ms, ftop, btop)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ffn-bench", default="build-gpu/bench/ffn-bench")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    theirs = torch_rows(args.warmup, args.iters)
    ours = [json.loads(l) for l in subprocess.run(
        [args.ffn_bench, "--attention", "--iters", str(args.iters), "--warmup", str(args.warmup)],
        check=True, capture_output=True, text=True).stdout.splitlines() if l.startswith("{")]
    dev = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    out = []
    print(f"# {dev}, torch {torch.__version__}, {date}; ms (median of {args.iters})")
    print(f"{'shape':<17} {'kernel':<18} {'fwd ms':>8} {'bwd ms':>8}  fwd/best  bwd/best  "
          "(best SDPA backend per direction; PyTorch: GPU kernel time per call)")
    for name in SHAPES:
        mine = {be: fb for (n, be), fb in theirs.items() if n == name}
        for be, (f, b_, fe, be_, ftop, btop) in mine.items():
            print(f"{name:<17} {'torch ' + be:<18} {f:8.3f} {b_:8.3f}  (events {fe:.3f} / {be_:.3f}; "
                  f"fwd: {'; '.join(ftop)}; bwd: {'; '.join(btop)})")
        if not mine:
            continue
        bf = min((fb[0], be) for be, fb in mine.items())
        bb = min((fb[1], be) for be, fb in mine.items())
        for r in ours:
            if r["attention"] != name:
                continue
            rf, rb = r["forward_ms"] / bf[0], r["backward_ms"] / bb[0]
            print(f"{name:<17} {'ours ' + r['kernel']:<18} {r['forward_ms']:8.3f} "
                  f"{r['backward_ms']:8.3f}  {rf:8.3f}  {rb:8.3f}  ({bf[1]} / {bb[1]})")
            out.append({**r, "torch": {be: {"forward_kernel_ms": fb[0], "backward_kernel_ms": fb[1],
                                            "forward_event_ms": fb[2], "backward_event_ms": fb[3]}
                                       for be, fb in mine.items()},
                        "best_sdpa_forward": bf[1], "best_sdpa_backward": bb[1],
                        "forward_over_best_sdpa": rf, "backward_over_best_sdpa": rb,
                        "device": dev, "date": date, "command": "python3 bench/compare_attention.py"})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
