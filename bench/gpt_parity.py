#!/usr/bin/env python3
"""bench/gpt_parity.py — do our weight files mean the same model to PyTorch? (issues 18, 15)

A GPT-2 written here in plain PyTorch with HuggingFace's names and Conv1D layout
(transformer.wte, transformer.h.N.attn.c_attn.weight [d, 3d], ...) loads a file written by
`ffn-convert --to hf-gpt2`; with --arch llama, a Llama written here (HF's names, RMSNorm,
rotate_half RoPE, repeat_kv GQA, gated MLP) loads a llama run's checkpoint as it is. Files are
read with the small safetensors reader below (Python's
standard library + torch: the `safetensors` package is not installed on our machines). For
each precision, `ffn-gpt-grads` (bench/gpt_grads.cpp) computes our loss and gradients on the
same weights and a seeded batch, and writes the batch with them; this script computes the
same in PyTorch and compares, per tensor, with the DESIGN.md rules:
  fp32: ours within 1e-5 relative (Frobenius norm of the difference over the norm of the
        fp64 reference) of PyTorch's fp64 result, on every batch;
  bf16: ours at most 2x the error of the same math done naively in bf16 (PyTorch autocast,
        its results rounded to bf16 as ours are), both measured against fp64. One batch's
        error is one draw of a noisy quantity (the two differ by 2x from batch to batch),
        so the rule compares the mean relative error over --seeds batches.
Prints a table and writes a JSON summary; exits 1 if a check fails.

  python3 bench/gpt_parity.py --bin build/bench/ffn-gpt-grads --config RUN/config.toml \
      --weights model-hf.safetensors --set model.vocab_size=50257 --out parity.json
"""
import argparse
import json
import math
import struct
import subprocess
import sys

import torch
import torch.nn.functional as F

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I32": torch.int32, "I64": torch.int64}


def read_safetensors(path):
    """name -> CPU tensor, from the format's definition: u64 header length, JSON header,
    then the raw little-endian data at each tensor's data_offsets."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        dt = DTYPES[e["dtype"]]
        raw = bytearray(blob[base + begin:base + end])
        t = torch.frombuffer(raw, dtype=dt) if raw else torch.empty(0, dtype=dt)
        out[name] = t.reshape(e["shape"]).clone()
    return out


def gpt2_loss(p, tokens, layers, heads, act, autocast):
    """Loss of a pre-LN GPT-2 with tied embeddings on tokens [B, T+1]; p: name -> leaf."""
    pre = "transformer."
    x_ids, y_ids = tokens[:, :-1], tokens[:, 1:]
    b, t = x_ids.shape
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if autocast else torch.autocast(
        "cuda", enabled=False)
    with ctx:
        x = p[pre + "wte.weight"][x_ids] + p[pre + "wpe.weight"][:t]
        d = x.shape[-1]
        for i in range(layers):
            h = f"{pre}h.{i}."
            a = F.layer_norm(x, (d,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], 1e-5)
            qkv = F.linear(a, p[h + "attn.c_attn.weight"].t(), p[h + "attn.c_attn.bias"])
            q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in qkv.split(d, -1))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = y.transpose(1, 2).reshape(b, t, d)
            x = x + F.linear(y, p[h + "attn.c_proj.weight"].t(), p[h + "attn.c_proj.bias"])
            a = F.layer_norm(x, (d,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], 1e-5)
            z = F.linear(a, p[h + "mlp.c_fc.weight"].t(), p[h + "mlp.c_fc.bias"])
            z = F.gelu(z, approximate="tanh" if act == "gelu_tanh" else "none")
            x = x + F.linear(z, p[h + "mlp.c_proj.weight"].t(), p[h + "mlp.c_proj.bias"])
        x = F.layer_norm(x, (d,), p[pre + "ln_f.weight"], p[pre + "ln_f.bias"], 1e-5)
        logits = F.linear(x, p[pre + "wte.weight"])
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y_ids.reshape(-1))


def rope(x, theta):
    """HF Llama's rotary embedding (rotate_half) on x [B, H, T, D], angles in f64."""
    t, d = x.shape[-2], x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    ang = torch.arange(t, dtype=torch.float64, device=x.device)[:, None] * inv[None]
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(torch.float32 if x.dtype != torch.float64
                                                    else torch.float64)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(cos.dtype)
    rot = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + rot * sin


def rms_norm(x, w, eps):
    xf = x.float() if x.dtype != torch.float64 else x
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w


def llama_loss(p, tokens, layers, heads, kv_heads, theta, eps, act, autocast):
    """Loss of a Llama (HF names: model.layers.N.self_attn.q_proj, ...; RMSNorm, RoPE,
    grouped-query attention by repeat_kv, gated MLP, untied or tied head) on tokens [B, T+1]."""
    x_ids, y_ids = tokens[:, :-1], tokens[:, 1:]
    b, t = x_ids.shape
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if autocast else torch.autocast(
        "cuda", enabled=False)
    with ctx:
        x = p["model.embed_tokens.weight"][x_ids]
        x = x.float() if x.dtype != torch.float64 else x
        d = x.shape[-1]
        hd = d // heads
        for i in range(layers):
            h = f"model.layers.{i}."
            a = rms_norm(x, p[h + "input_layernorm.weight"], eps)
            q = F.linear(a, p[h + "self_attn.q_proj.weight"]).view(b, t, heads, hd).transpose(1, 2)
            k = F.linear(a, p[h + "self_attn.k_proj.weight"]).view(b, t, kv_heads, hd).transpose(1, 2)
            v = F.linear(a, p[h + "self_attn.v_proj.weight"]).view(b, t, kv_heads, hd).transpose(1, 2)
            q, k = rope(q, theta), rope(k, theta)
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + F.linear(y.transpose(1, 2).reshape(b, t, d), p[h + "self_attn.o_proj.weight"])
            a = rms_norm(x, p[h + "post_attention_layernorm.weight"], eps)
            g = F.linear(a, p[h + "mlp.gate_proj.weight"])
            g = F.silu(g) if act == "swiglu" else F.gelu(g, approximate="tanh")
            x = x + F.linear(g * F.linear(a, p[h + "mlp.up_proj.weight"]),
                             p[h + "mlp.down_proj.weight"])
        x = rms_norm(x, p["model.norm.weight"], eps)
        head = p["lm_head.weight"] if "lm_head.weight" in p else p["model.embed_tokens.weight"]
        logits = F.linear(x, head)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y_ids.reshape(-1))


def torch_run(weights, tokens, args, dtype, autocast):
    p = {n: w.to("cuda", dtype).requires_grad_(True) for n, w in weights.items()}
    ids = tokens.to("cuda").long()
    if args.arch == "llama":
        layers = 1 + max(int(n.split(".")[2]) for n in p if n.startswith("model.layers."))
        loss = llama_loss(p, ids, layers, args.heads, args.kv_heads or args.heads, args.theta,
                          args.eps, args.act, autocast)
    else:
        layers = 1 + max(int(n.split(".")[2]) for n in p if n.startswith("transformer.h."))
        loss = gpt2_loss(p, ids, layers, args.heads, args.act, autocast)
    loss.backward()
    return loss.detach(), {n: w.grad for n, w in p.items()}


def rel_err(a, ref):
    a, ref = a.double().cpu(), ref.double().cpu()
    den = ref.norm().item()
    return (a - ref).norm().item() / den if den > 0 else (a - ref).norm().item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="build/bench/ffn-gpt-grads")
    ap.add_argument("--config", required=True)
    ap.add_argument("--weights", required=True,
                    help="gpt: an hf-gpt2 layout .safetensors file; llama: the checkpoint's own")
    ap.add_argument("--set", action="append", default=[], help="config overrides for ours")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--act", default="gelu", choices=["gelu", "gelu_tanh", "swiglu", "geglu"])
    ap.add_argument("--arch", default="gpt", choices=["gpt", "llama"])
    ap.add_argument("--kv-heads", type=int, default=0, help="llama: key/value heads (0: heads)")
    ap.add_argument("--theta", type=float, default=10000.0, help="llama: the rotary base")
    ap.add_argument("--eps", type=float, default=1e-5, help="llama: RMSNorm's eps")
    ap.add_argument("--seeds", type=int, default=8, help="batches; errors are their means")
    ap.add_argument("--out", default="parity.json")
    ap.add_argument("--tmp", default="/tmp")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    weights = read_safetensors(args.weights)
    rows, ok = [], True
    for precision in ("fp32", "bf16"):
        errs = {}  # name -> [(ours, torch)] over the batches
        for seed in range(1, args.seeds + 1):
            ours_file = f"{args.tmp}/ours-{precision}.safetensors"
            cmd = [args.bin, args.config, args.weights, ours_file, "--precision", precision,
                   "--device", "cuda", "--batch", str(args.batch), "--seq", str(args.seq),
                   "--seed", str(seed)]
            for s in args.set:
                cmd += ["--set", s]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            ours = read_safetensors(ours_file)
            tokens = ours.pop("tokens")
            ours_loss = ours.pop("loss")[0]
            run = lambda dt, ac: torch_run(weights, tokens, args, dt, ac)
            ref_loss, ref = run(torch.float64, False)
            naive_loss, naive = run(torch.float32, precision == "bf16")
            if precision == "bf16":  # the naive bf16 math ends in bf16 tensors, as ours do
                naive = {n: g.to(torch.bfloat16) for n, g in naive.items()}
            missing = sorted(set(ref) ^ set(ours))
            if missing:
                print(f"gradient names differ: {missing}", file=sys.stderr)
                return 1
            errs.setdefault("loss", []).append(
                (rel_err(ours_loss.reshape(1), ref_loss.reshape(1)),
                 rel_err(naive_loss.reshape(1), ref_loss.reshape(1))))
            for name in ref:
                errs.setdefault(name, []).append((rel_err(ours[name], ref[name]),
                                                  rel_err(naive[name], ref[name])))
            print(f"{precision} batch {seed}: loss ours {ours_loss.item():.6f}, "
                  f"torch fp64 {ref_loss.item():.6f}")
        for name, e in errs.items():
            e_ours = sum(o for o, _ in e) / len(e)
            e_naive = sum(t for _, t in e) / len(e)
            if precision == "fp32":
                passed = max(o for o, _ in e) <= 1e-5
            else:
                passed = e_ours <= 2 * e_naive and math.isfinite(e_ours)
            ok = ok and passed
            rows.append({"precision": precision, "tensor": name, "ours_rel_err": e_ours,
                         "torch_rel_err": e_naive, "ours_max_rel_err": max(o for o, _ in e),
                         "pass": passed})
    print(f"{'precision':9} {'tensor':44} {'ours err':>10} {'torch err':>10} {'ratio':>6}")
    for r in rows:
        ratio = r["ours_rel_err"] / r["torch_rel_err"] if r["torch_rel_err"] > 0 else float("inf")
        print(f"{r['precision']:9} {r['tensor']:44} {r['ours_rel_err']:10.2e} "
              f"{r['torch_rel_err']:10.2e} {ratio:6.2f}{'' if r['pass'] else '  FAIL'}")
    worst = {p: max(r["ours_rel_err"] / max(r["torch_rel_err"], 1e-300) for r in rows
                    if r["precision"] == p) for p in ("fp32", "bf16")}
    summary = {"pass": ok, "checks": len(rows), "batches": args.seeds, "worst_ratio": worst,
               "worst_fp32_rel_err": max(r["ours_max_rel_err"] for r in rows
                                         if r["precision"] == "fp32"),
               "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    print(f"parity: {'PASS' if ok else 'FAIL'} ({len(rows)} checks over {args.seeds} batches; "
          f"worst fp32 rel err "
          f"{summary['worst_fp32_rel_err']:.2e}; worst bf16 ours/torch {worst['bf16']:.2f})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
