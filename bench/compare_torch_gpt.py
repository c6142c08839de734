#!/usr/bin/env python3
"""bench/compare_torch_gpt.py — ffn-train against PyTorch on the same GPU, in one run.

--arch gpt2 times configs/gpt2_small.toml (vocab 50257, padded inside) against nanoGPT's GPT-2
124M (vocab 50304, biases) under torch.compile only, 16 random-token sequences of 1024, and
reports tokens/s and the peak memory of live tensors on both sides (ffn-train's done line,
torch.cuda.max_memory_allocated). --arch llama swaps both sides for configs/llama_char.toml's Llama (RMSNorm, rotary
embeddings, 6 heads, SwiGLU, untied head, dropout 0.3, 3000 iterations; PyTorch's model written
below with nn.RMSNorm and scaled_dot_product_attention(enable_gqa=True), so kv < heads runs
grouped-query attention); the rest of the recipe is the same.

The model and recipe are configs/shakespeare_char.toml's (nanoGPT's shakespeare_char):
a 6-layer, 6-head, d=384, context-256 GPT without biases, tied embeddings, GELU MLP x4,
dropout 0.2, AdamW (fused) with lr 1e-3 / warmup 100 / cosine, betas (0.9, 0.99), weight
decay 0.1 on matrices, grad clip 1.0, batch 64, bf16 autocast. The PyTorch model is
written here in nanoGPT's style (scaled_dot_product_attention with is_causal). It is timed
in eager mode and under torch.compile; ffn-train is run on the same config in the same
invocation.

Timing: every iteration is one full training step (batch to device, forward, backward,
clip, optimizer step) ending in a device sync (both sides read the loss every step);
the figure is the median ms/iter after --warmup iterations. ffn-train's figure is the
median of its per-iteration times in metrics.jsonl (log_every = 1) over the same window.
--repeat N alternates the three N times (the PyTorch models keep training, so torch.compile
compiles once) and reports the medians over rounds and each round's ratio.

--quality also trains PyTorch eager for the full 5000 iterations and reports its best
val loss (eval every 250 iters on 200 batches, as the recipe says); --quality-only --seed S
does only that, with seed S (tools/gpu-check seeds runs several seeds side by side).
"""
import argparse
import datetime
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(s, d, h, p, bias=False):
        super().__init__()
        s.ln_1 = nn.LayerNorm(d, bias=bias)
        s.c_attn = nn.Linear(d, 3 * d, bias=bias)
        s.c_proj = nn.Linear(d, d, bias=bias)
        s.ln_2 = nn.LayerNorm(d, bias=bias)
        s.fc = nn.Linear(d, 4 * d, bias=bias)
        s.proj = nn.Linear(4 * d, d, bias=bias)
        s.h, s.p = h, p
        s.drop = nn.Dropout(p)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.c_attn(s.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.h, C // s.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=s.p if s.training else 0.0, is_causal=True)
        x = x + s.drop(s.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))
        return x + s.drop(s.proj(F.gelu(s.fc(s.ln_2(x)))))


class GPT(nn.Module):
    def __init__(s, vocab, ctx, layers=6, heads=6, d=384, p=0.2, bias=False):
        super().__init__()
        s.wte = nn.Embedding(vocab, d)
        s.wpe = nn.Embedding(ctx, d)
        s.drop = nn.Dropout(p)
        s.h = nn.ModuleList(Block(d, heads, p, bias) for _ in range(layers))
        s.ln_f = nn.LayerNorm(d, bias=bias)
        for n, w in s.named_parameters():
            if w.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if n.endswith(("c_proj.weight", "proj.weight")) else 0.02
                nn.init.normal_(w, 0.0, std)

    def forward(s, idx, targets):
        T = idx.shape[1]
        x = s.drop(s.wte(idx) + s.wpe(torch.arange(T, device=idx.device)))
        for b in s.h:
            x = b(x)
        logits = F.linear(s.ln_f(x), s.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class LlamaBlock(nn.Module):
    """configs/llama_char.toml's block: RMSNorm, rotary embeddings (rotate_half), h query
    heads sharing kv key/value heads (the config: 6 and 6), SwiGLU of width 1024, no biases,
    dropout p on the attention probabilities and each branch output."""

    def __init__(s, d, h, kv, hidden, p):
        super().__init__()
        s.input_layernorm = nn.RMSNorm(d, eps=1e-5)
        s.q_proj = nn.Linear(d, d, bias=False)
        s.k_proj = nn.Linear(d, kv * (d // h), bias=False)
        s.v_proj = nn.Linear(d, kv * (d // h), bias=False)
        s.o_proj = nn.Linear(d, d, bias=False)
        s.post_attention_layernorm = nn.RMSNorm(d, eps=1e-5)
        s.gate_proj = nn.Linear(d, hidden, bias=False)
        s.up_proj = nn.Linear(d, hidden, bias=False)
        s.down_proj = nn.Linear(hidden, d, bias=False)
        s.h, s.kv, s.p = h, kv, p
        s.drop = nn.Dropout(p)

    @staticmethod
    def rope(x, cos, sin):
        T, D = x.shape[-2], x.shape[-1]
        rot = torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1)
        return x * cos[:T] + rot * sin[:T]

    def forward(s, x, cos, sin):
        B, T, C = x.shape
        D = C // s.h
        a = s.input_layernorm(x)
        q = s.q_proj(a).view(B, T, s.h, D).transpose(1, 2)
        k = s.k_proj(a).view(B, T, s.kv, D).transpose(1, 2)
        v = s.v_proj(a).view(B, T, s.kv, D).transpose(1, 2)
        q, k = s.rope(q, cos, sin), s.rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=s.p if s.training else 0.0,
                                           is_causal=True, enable_gqa=True)
        x = x + s.drop(s.o_proj(y.transpose(1, 2).contiguous().view(B, T, C)))
        a = s.post_attention_layernorm(x)
        return x + s.drop(s.down_proj(F.silu(s.gate_proj(a)) * s.up_proj(a)))


class Llama(nn.Module):
    def __init__(s, vocab, ctx, layers=6, heads=6, kv=6, d=384, hidden=1024, p=0.3):
        super().__init__()
        D = d // heads
        inv = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
        ang = torch.arange(ctx, dtype=torch.float64)[:, None] * inv[None]
        s.register_buffer("cos", torch.cat([ang.cos(), ang.cos()], -1).float(), persistent=False)
        s.register_buffer("sin", torch.cat([ang.sin(), ang.sin()], -1).float(), persistent=False)
        s.embed_tokens = nn.Embedding(vocab, d)
        s.drop = nn.Dropout(p)
        s.layers = nn.ModuleList(LlamaBlock(d, heads, kv, hidden, p) for _ in range(layers))
        s.norm = nn.RMSNorm(d, eps=1e-5)
        s.lm_head = nn.Linear(d, vocab, bias=False)
        for n, w in s.named_parameters():
            if w.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if n.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                nn.init.normal_(w, 0.0, std)

    def forward(s, idx, targets):
        x = s.drop(s.embed_tokens(idx))
        for b in s.layers:
            x = b(x, s.cos, s.sin)
        logits = s.lm_head(s.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


ARCH = "gpt"  # --arch: which model make() builds
PROFILE_TOP = 25  # --profile-top
OURS_SET = []  # --ours-set: extra config overrides for ffn-train


def load(path):
    text = open(path, "rb").read()
    chars = sorted(set(text))
    lut = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([lut[c] for c in text], dtype=torch.long)
    n = int(len(data) * 0.9)
    return data[:n], data[n:], len(chars)


def batch(data, B, T, gen, dev):
    ix = torch.randint(len(data) - T, (B,), generator=gen)
    x = torch.stack([data[i : i + T] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + T] for i in ix])
    return x.pin_memory().to(dev, non_blocking=True), y.pin_memory().to(dev, non_blocking=True)


def lr_at(it, lr=1e-3, min_lr=1e-4, warmup=100, decay=5000):
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay:
        return min_lr
    r = (it - warmup) / (decay - warmup)
    return min_lr + 0.5 * (1 + math.cos(math.pi * r)) * (lr - min_lr)


def make(vocab, dev, compile_, seed=1337):
    torch.manual_seed(seed)
    if ARCH == "gpt2":  # GPT-2 124M as nanoGPT trains it: vocab padded to 50304, biases
        m = GPT(50304, 1024, layers=12, heads=12, d=768, p=0.0, bias=True).to(dev)
    else:
        m = (Llama(vocab, 256) if ARCH == "llama" else GPT(vocab, 256)).to(dev)
    decay = [p for p in m.parameters() if p.dim() >= 2]
    nodecay = [p for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99), fused=True)
    return (torch.compile(m) if compile_ else m), m, opt


def step(model, opt, train, gen, dev, it):
    for g in opt.param_groups:
        g["lr"] = lr_at(it, decay=3000 if ARCH == "llama" else 5000)  # the configs' decay_iters
    if ARCH == "gpt2":  # random tokens of GPT-2's vocabulary, 16 sequences of 1024
        ids = torch.randint(0, 50257, (16, 1025), generator=gen).to(dev, non_blocking=True)
        x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    else:
        x, y = batch(train, 64, 256, gen, dev)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def torch_runner(train, vocab, dev, compile_):
    """A PyTorch model + optimizer that keeps training across timing rounds (so a compiled
    model is compiled once). run(n, warmup) -> median ms/iter of the last n of warmup + n."""
    model, _, opt = make(vocab, dev, compile_)
    gen = torch.Generator().manual_seed(1)
    state = {"it": 0}

    def run(n, warmup):
        torch.cuda.reset_peak_memory_stats()
        ms = []
        for k in range(warmup + n):
            t0 = time.perf_counter()
            step(model, opt, train, gen, dev, state["it"])
            torch.cuda.synchronize()
            state["it"] += 1
            if k >= warmup:
                ms.append((time.perf_counter() - t0) * 1e3)
        PEAK["compile" if compile_ else "eager"] = torch.cuda.max_memory_allocated()
        return statistics.median(ms)

    def profile(n, label):
        gpu_profile(model, opt, train, gen, dev, state["it"], n, label)

    return run, profile


def gpu_profile(model, opt, train, gen, dev, it0, n, label):
    """GPU kernel time per step (torch.profiler), to set against the wall time per step."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for it in range(it0, it0 + n):
            step(model, opt, train, gen, dev, it)
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total, e.count) for e in prof.key_averages() if e.device_time_total > 0]
    tot = sum(r[1] for r in rows)
    print(f"torch {label}: GPU kernel time {tot / n / 1e3:.2f} ms/iter over {n} iters", file=sys.stderr)
    for k, t, c in sorted(rows, key=lambda r: -r[1])[:PROFILE_TOP]:
        print(f"  {t / tot * 100:5.1f}%  {t / n:8.1f} us/iter  x{c // n:<4} {k[:90]}", file=sys.stderr)


@torch.no_grad()
def estimate(model, data, gen, dev):
    model.eval()
    out = []
    for _ in range(200):
        x, y = batch(data, 64, 256, gen, dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out.append(model(x, y).item())
    model.train()
    return sum(out) / len(out)


def quality(train, val, vocab, dev, iters, seed=1337):
    model, _, opt = make(vocab, dev, False, seed)
    # Seed 1337 keeps the batch and eval generators of the earlier runs (1 and 2).
    bseed, eseed = (1, 2) if seed == 1337 else (seed * 1000 + 1, seed * 1000 + 2)
    gen, egen = torch.Generator().manual_seed(bseed), torch.Generator().manual_seed(eseed)
    best, curve, t0 = float("inf"), [], time.time()
    for it in range(iters + 1):
        if it % 250 == 0 or it == iters:
            v = estimate(model, val, egen, dev)
            best = min(best, v)
            curve.append((it, v))
            print(f"torch eager seed {seed} iter {it}: val {v:.4f} (best {best:.4f}, {time.time() - t0:.0f} s)",
                  file=sys.stderr)
        if it < iters:
            step(model, opt, train, gen, dev, it)
    return best, curve


PEAK = {}  # ffn-train's peak tensor memory (bytes) of the last run, from its done line


def time_ours(bin_, config, data, warmup, iters, run_dir):
    args = [bin_, config, "--overwrite", "--set", f"run.dir={run_dir}",
            "--set", f"train.iters={warmup + iters}", "--set", "run.eval_every=100000",
            "--set", "run.log_every=1", "--set", "run.eval_iters=1", "--set", "run.checkpoint_every=100000"]
    args += ["--set", "data.kind=synthetic"] if ARCH == "gpt2" else ["--set", f"data.path={data}"]
    for kv in OURS_SET:
        args += ["--set", kv]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    m = re.search(r"peak memory ([0-9.]+) (B|KiB|MiB|GiB|TiB)", out)
    if m:
        PEAK["ours"] = float(m.group(1)) * 1024 ** ["B", "KiB", "MiB", "GiB", "TiB"].index(m.group(2))
    ms = []
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        r = json.loads(line)
        if "ms_per_iter" in r and r["iter"] > warmup:
            ms.append(r["ms_per_iter"])
    return statistics.median(ms)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ffn-train", required=True, help="path to the ffn-train binary")
    ap.add_argument("--config", help="default: configs/shakespeare_char.toml, or "
                    "configs/llama_char.toml with --arch llama")
    ap.add_argument("--arch", default="gpt", choices=["gpt", "llama", "gpt2"],
                    help="the models: shakespeare_char's GPT, llama_char.toml's Llama, or "
                    "GPT-2 124M on random tokens (configs/gpt2_small.toml, B = 16, T = 1024)")
    ap.add_argument("--data", default="../shared/data/tinyshakespeare.txt")
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--quality", type=int, default=0, help="also train torch eager this many iters (5000: the recipe)")
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--run-dir", default="runs/compare_torch_gpt")
    ap.add_argument("--profile", type=int, default=0, help="also print PyTorch's GPU kernel time over this many iters")
    ap.add_argument("--profile-top", type=int, default=25, help="--profile: how many kernels to list (the most time first)")
    ap.add_argument("--ours-set", action="append", default=[], metavar="KEY=VALUE",
                    help="also pass --set KEY=VALUE to ffn-train (repeatable), e.g. runtime.fp32_residual=false")
    ap.add_argument("--repeat", type=int, default=1, help="alternating timing rounds (ours, eager, compile)")
    ap.add_argument("--seed", type=int, default=1337, help="--quality: the PyTorch run's seed (init, dropout, batches)")
    ap.add_argument("--quality-only", action="store_true", help="only the --quality run, no timing")
    a = ap.parse_args()
    global ARCH, PROFILE_TOP, OURS_SET
    ARCH, PROFILE_TOP, OURS_SET = a.arch, a.profile_top, a.ours_set
    if not a.config:
        a.config = {"llama": "configs/llama_char.toml", "gpt2": "configs/gpt2_small.toml"}.get(
            a.arch, "configs/shakespeare_char.toml")
    dev = "cuda"
    train, val, vocab = (None, None, 50257) if a.arch == "gpt2" else load(a.data)
    res = {"device": torch.cuda.get_device_name(0), "date": datetime.date.today().isoformat(),
           "torch": torch.__version__, "warmup": a.warmup, "iters": a.iters, "arch": a.arch,
           "config": a.config, "ours_set": a.ours_set}
    if a.quality_only:
        best, curve = quality(train, val, vocab, dev, a.quality or 5000, a.seed)
        res.update(seed=a.seed, torch_best_val=best, torch_val_curve=curve)
        print(f"PyTorch eager seed {a.seed}: best val loss {best:.4f} over {a.quality or 5000} iters")
        if a.json:
            json.dump(res, open(a.json, "w"), indent=1)
        return
    # Rounds alternate ours, eager, compiled (each after its own warm-up in round 1), so a
    # drift of the machine shows up in every column; the figures are medians over rounds.
    # gpt2: no eager model, so the compiled one is alone on the GPU and its peak memory is its
    # own (the other configs keep both PyTorch models resident; their peaks include both).
    with_eager = a.arch != "gpt2"
    eager, eager_prof = torch_runner(train, vocab, dev, False) if with_eager else (None, None)
    comp, comp_prof = torch_runner(train, vocab, dev, True)
    rounds = []
    for r in range(a.repeat):
        w = a.warmup if r == 0 else 5
        o = time_ours(a.ffn_train, a.config, a.data, a.warmup, a.iters, a.run_dir)
        e = eager(a.iters, w) if with_eager else float("nan")
        c = comp(a.iters, w)
        rounds.append({"ours_ms": o, "eager_ms": e, "compile_ms": c, "ours_over_compile": o / c})
        print(f"round {r + 1}: ours {o:.2f}, eager {e:.2f}, compile {c:.2f} ms/iter "
              f"(ours / compile {o / c:.3f})", file=sys.stderr)
    if a.profile:
        if with_eager:
            eager_prof(a.profile, "eager")
        comp_prof(a.profile, "compile")
    res["rounds"] = rounds
    res["ours_peak_bytes"] = PEAK.get("ours")
    res["eager_peak_bytes"], res["compile_peak_bytes"] = PEAK.get("eager"), PEAK.get("compile")
    tokens = 16 * 1024 if a.arch == "gpt2" else 64 * 256
    for k in ("ours_ms", "eager_ms", "compile_ms"):
        res[k] = statistics.median(r[k] for r in rounds)
    res["ours_over_eager"] = res["ours_ms"] / res["eager_ms"]
    res["ours_over_compile"] = res["ours_ms"] / res["compile_ms"]
    ratios = [r["ours_over_compile"] for r in rounds]
    if a.quality:
        res["torch_best_val"], res["torch_val_curve"] = quality(train, val, vocab, dev, a.quality)
    label = {"llama": "llama_char", "gpt2": "gpt2_small"}.get(a.arch, "shakespeare_char")
    for k in ("ours", "eager", "compile"):
        res[f"{k}_tok_s"] = tokens / (res[f"{k}_ms"] / 1e3)
    gib = lambda b: f"{b / 2**30:.2f} GiB" if b else "?"
    print(f"| {label} step ({res['device']}, {res['date']}) | ms/iter | tok/s | ours / it | peak memory |")
    print("|---|---:|---:|---:|---:|")
    ours = "fused-ffn (ffn-train" + "".join(f", {kv}" for kv in a.ours_set) + ")"
    print(f"| {ours} | {res['ours_ms']:.2f} | {res['ours_tok_s'] / 1e3:.1f}k | 1.00 | "
          f"{gib(res['ours_peak_bytes'])} |")
    print(f"| PyTorch eager | {res['eager_ms']:.2f} | {res['eager_tok_s'] / 1e3:.1f}k | "
          f"{res['ours_over_eager']:.3f} | {gib(res['eager_peak_bytes'])} |")
    print(f"| PyTorch torch.compile | {res['compile_ms']:.2f} | {res['compile_tok_s'] / 1e3:.1f}k | "
          f"{res['ours_over_compile']:.3f} | {gib(res['compile_peak_bytes'])} |")
    if a.repeat > 1:
        print(f"\nours / torch.compile per round: {', '.join(f'{x:.3f}' for x in ratios)} "
              f"(medians over {a.repeat} alternating rounds above)")
    if a.quality:
        print(f"\nPyTorch eager best val loss over {a.quality} iters: {res['torch_best_val']:.4f}")
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
