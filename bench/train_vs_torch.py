#!/usr/bin/env python3
"""flexc's training step against the same model trained by PyTorch on the CPU.

The model is flexc's GPT (docs/train.md) written in PyTorch: token embedding tied with the LM
head, pre-norm blocks of RMSNorm (eps 1e-5), attention with RoPE on interleaved pairs
(theta 10000) and grouped-query heads (query head h reads key/value head h // (Hq/Hkv)),
causal, through F.scaled_dot_product_attention; a SwiGLU MLP W2(silu(W1 x) * W3 x) of width
8/3 dim rounded up to 32; a final RMSNorm and the cross-entropy of the logits against the
embedding. GPT-2 initialisation (N(0, 0.02), the residual projections Wo and W2 scaled by
1/sqrt(2 layers), norms at 1). The step is the same as `flexc bench train`'s: forward and
backward, the gradient norm clipped to 1, AdamW (betas 0.9, 0.95, eps 1e-8, decay 0.1 on the
matrices only; PyTorch's fused CPU kernel), gradients cleared.

Shapes: `small` (6 layers, dim 384, 6/2 heads, byte vocabulary 257) at B=4, T=256, and the
GPT-2 124M shape (12 layers, dim 768, 12 heads, vocabulary 50257) at B=4, T=64.

Variants: PyTorch eager and torch.compile, each in float32 and with bfloat16 autocast,
against `flexc bench train --only flex` (flex attention + fused loss, float32) and, as
`flexc-bf16`, the same with `--dtype bf16` (bfloat16 inputs to every matrix product,
float32 master weights; compared with every PyTorch variant and with flexc in float32). Every
measurement runs in a fresh child process, in rounds (the order reversed every other round),
with the same threads and OMP_WAIT_POLICY; each child times its steps after a warm-up and
reports the median step time, its process's maximum resident set, and the growth of the
resident peak from just before the model was built (PyTorch) or the library's own peak
(flexc). Prints one JSON object per measurement, then per shape and variant the medians and
the ratios flexc / PyTorch (tokens/s: above 1 means flexc is faster; memory: below 1 means
flexc uses less), taken per round and then the median.

Before timing, the PyTorch model is checked to be flexc's: the same parameter count (from
`flexc bench train --json`), and the same loss from the same weights. flexc trains one step
at a learning rate of 1e-36 (its weights stay as initialised, bit for bit) on a generated
text, evaluating the validation loss of its first batch with those weights; then its
checkpoint's weights are replaced by random ones of unit scale (every layer then moves the
loss; at the initial scale the loss is near ln V whatever the layers do), and a resumed
second step evaluates again. PyTorch loads each model.safetensors and computes the loss of
the same validation windows in float32 and float64; the relative difference must stay
below 1e-5. The check uses the byte vocabulary (`flexc train` has no other).

    python3 bench/train_vs_torch.py [--flexc build/flexc] [--threads 2] [--rounds 2]
                                    [--steps 5] [--shapes small,gpt2] [--variants ...]

Skips (exit 0, one JSON line saying so) when torch, numpy or safetensors is missing.
"""
import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
except ImportError as e:  # optional dependencies
    print(json.dumps({"case": "train_vs_torch", "skipped": f"{e.name} is not installed"}))
    sys.exit(0)

from procmem import peak_reset, status_kb  # noqa: E402

SHAPES = {
    "small": dict(model="small", layers=6, dim=384, heads=6, kv_heads=2, vocab=257, B=4, T=256),
    "gpt2": dict(model="gpt2", layers=12, dim=768, heads=12, kv_heads=12, vocab=50257, B=4, T=64),
}
CTX = {"small": 256, "gpt2": 1024}
VARIANTS = ["flexc", "flexc-bf16", "torch-eager-f32", "torch-compile-f32", "torch-eager-bf16", "torch-compile-bf16"]


def ffn_width(dim):
    return (8 * dim // 3 + 31) // 32 * 32


# ---- the model ---------------------------------------------------------------------------


def rope_tables(ctx, hd, theta=10000.0):
    """cos, sin [ctx, hd/2] as flexc computes them: in float64, then rounded to float32."""
    i = torch.arange(hd // 2, dtype=torch.float64)
    freq = theta ** (-2.0 * i / hd)
    ang = torch.arange(ctx, dtype=torch.float64)[:, None] * freq[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def rope(x, cos, sin):
    """x [B, T, H, hd]: each pair (2i, 2i+1) rotated by the angle of (position, i)."""
    B, T, H, hd = x.shape
    xp = x.view(B, T, H, hd // 2, 2)
    x0, x1 = xp[..., 0], xp[..., 1]
    c, s = cos[:T].view(1, T, 1, hd // 2), sin[:T].view(1, T, 1, hd // 2)
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, ffn, eps):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.norm1 = nn.RMSNorm(dim, eps=eps)
        self.attn = nn.Module()
        self.attn.wq = nn.Linear(dim, heads * self.hd, bias=False)
        self.attn.wk = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.attn.wv = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.attn.wo = nn.Linear(heads * self.hd, dim, bias=False)
        self.norm2 = nn.RMSNorm(dim, eps=eps)
        self.mlp = nn.Module()
        self.mlp.w1 = nn.Linear(dim, ffn, bias=False)
        self.mlp.w3 = nn.Linear(dim, ffn, bias=False)
        self.mlp.w2 = nn.Linear(ffn, dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.norm1(x)
        q = rope(self.attn.wq(h).view(B, T, self.heads, self.hd), cos, sin).transpose(1, 2)
        k = rope(self.attn.wk(h).view(B, T, self.kv_heads, self.hd), cos, sin).transpose(1, 2)
        v = self.attn.wv(h).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        x = x + self.attn.wo(a.transpose(1, 2).reshape(B, T, C))
        h = self.norm2(x)
        return x + self.mlp.w2(F.silu(self.mlp.w1(h)) * self.mlp.w3(h))


class GPT(nn.Module):
    def __init__(self, layers, dim, heads, kv_heads, vocab, ctx, eps=1e-5, **_):
        super().__init__()
        self.vocab = vocab
        self.wte = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, kv_heads, ffn_width(dim), eps) for _ in range(layers))
        self.norm = nn.RMSNorm(dim, eps=eps)
        cos, sin = rope_tables(ctx, dim // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        resid_std = 0.02 / math.sqrt(2 * layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.ndim == 1:
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, resid_std if name.endswith(("attn.wo.weight", "mlp.w2.weight")) else 0.02)

    def forward(self, idx, targets):
        x = self.wte(idx)
        for blk in self.layers:
            x = blk(x, self.cos, self.sin)
        logits = F.linear(self.norm(x), self.wte.weight)  # tied embedding
        return F.cross_entropy(logits.float().view(-1, self.vocab), targets.reshape(-1))


# ---- children: one measurement each ------------------------------------------------------


def child_torch(shape, compiled, dtype, steps, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    s = SHAPES[shape]
    B, T = s["B"], s["T"]
    rss_import = status_kb("VmHWM") * 1024
    start = peak_reset()
    model = GPT(ctx=CTX[shape], **s)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    kw = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    try:
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                fused=True, **kw)
        fused = True
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                **kw)
        fused = False
    fwd = torch.compile(model) if compiled else model
    g = torch.Generator().manual_seed(7)
    data = torch.randint(0, s["vocab"], (64, T + 1), generator=g)
    params = list(model.parameters())

    def step(i):
        w = data[(i * B + torch.arange(B)) % data.shape[0]]
        x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    t0 = time.perf_counter()
    for i in range(2):  # warm-up (and compilation)
        step(i)
    warm = time.perf_counter() - t0
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        step(2 + i)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    hwm = status_kb("VmHWM") * 1024
    return {"tokens_per_s": B * T / med, "step_s": med, "warmup_s": warm, "fused_adamw": fused,
            "peak_growth_bytes": hwm - start, "max_rss_bytes": max(hwm, rss_import),
            "params": sum(p.numel() for p in params)}


def run_flexc(flexc, shape, steps, threads, env, dtype="f32"):
    s = SHAPES[shape]
    cmd = [flexc, "bench", "train", "--model", s["model"], "--vocab", str(s["vocab"]), "--batch", str(s["B"]),
           "--seq", str(s["T"]), "--only", "flex", "--steps", str(steps), "--threads", str(threads),
           "--dtype", dtype, "--json"]
    # Through a shell that forks it: a process exec'd straight from this one would report
    # this process's resident peak (Linux keeps the maximum RSS across exec).
    out = subprocess.run(["sh", "-c", '"$@" & wait $!', "sh"] + cmd, env=env, capture_output=True, text=True,
                         check=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return {"tokens_per_s": r["tokens_per_s"], "step_s": s["B"] * s["T"] / r["tokens_per_s"],
            "peak_growth_bytes": r["peak_bytes"], "max_rss_bytes": r["max_rss_bytes"], "params": int(r["params"])}


def run_torch(shape, variant, steps, threads, env, timeout):
    _, mode, dtype = variant.split("-")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", shape, mode, dtype, str(steps), str(threads)]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if out.returncode != 0:
        raise RuntimeError(f"{variant} {shape} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- the same model: parameters and loss --------------------------------------------------


def check_parity(flexc, shape, threads, env, work):
    """flexc's loss and PyTorch's on the same weights and windows (byte vocabulary): flexc's
    initial weights, then random weights of unit scale that make every part of the network
    matter (at the initial scale the loss is close to ln V whatever the layers do)."""
    s = dict(SHAPES[shape], vocab=257)
    B, T = s["B"], s["T"]
    rng = random.Random(5)
    words = ["the", "model", "reads", "bytes", "and", "learns", "a", "GPT", "of", "text", "with", "loss", "attention"]
    text = " ".join(rng.choice(words) for _ in range(6000)).encode()  # no '%' lines, no end-of-text marker
    path = os.path.join(work, f"parity_{shape}.txt")
    with open(path, "wb") as f:
        f.write(text)
    out = os.path.join(work, f"parity_{shape}")
    # Step 1 at a learning rate of 1e-36 leaves the weights as they were; the validation loss
    # after it is the loss of those weights.
    run = [flexc, "train", "--threads", str(threads), "--quiet", "--out", out]
    subprocess.run(run + ["--data", path, "--model", s["model"], "--batch", str(B), "--seq", str(T), "--steps", "2",
                          "--until", "1", "--lr", "1e-30", "--min-lr", "0", "--warmup", "1000000",
                          "--eval-every", "1", "--eval-batches", "1", "--force"], env=env, check=True)
    init = load_file(os.path.join(out, "model.safetensors"))
    # Step 2 from the checkpoint with its weights replaced.
    ck = os.path.join(out, "checkpoint.safetensors")
    with safe_open(ck, "pt") as f:
        meta = f.metadata()
    sd = load_file(ck)
    g = torch.Generator().manual_seed(3)
    for k, v in sd.items():
        if not k.startswith("optim"):
            sd[k] = (torch.randn(v.shape, generator=g) / v.shape[1] ** 0.5 if v.ndim == 2
                     else 0.5 + torch.rand(v.shape, generator=g)).contiguous()
    save_file(sd, ck, metadata=meta)
    subprocess.run(run + ["--resume", "--eval-every", "1", "--eval-batches", "1"], env=env, check=True)
    unit = load_file(os.path.join(out, "model.safetensors"))
    with open(os.path.join(out, "metrics.jsonl")) as f:
        fx_loss = [json.loads(line)["val_loss"] for line in f]
    for f in os.listdir(out):  # the gpt2 checkpoint is about 1.4 GB
        os.unlink(os.path.join(out, f))
    # flexc's tokens: the bytes, then one end-of-text token (256) closing the file; the last
    # 5% (at least one window) for validation, read in windows of T+1 starting T apart.
    tok = list(text) + [256]
    n = len(tok)
    n_val = max(int(n * 0.05), T + 1)
    n_train = n - n_val
    windows = (n_val - 1) // T
    rows = [tok[n_train + (b % windows) * T: n_train + (b % windows) * T + T + 1] for b in range(B)]
    w = torch.tensor(rows, dtype=torch.long)
    x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()
    res = {"case": "train_vs_torch_parity", "shape": shape, "vocab": 257, "batch": B, "seq": T}
    for name, weights, fl in (("init", init, fx_loss[0]), ("unit", unit, fx_loss[1])):
        model = GPT(ctx=CTX[shape], **s)
        model.load_state_dict({k + ".weight": v for k, v in weights.items()}, strict=True)
        res["params_torch"] = sum(p.numel() for p in model.parameters())
        with torch.no_grad():
            l32 = model(x, y).item()
            l64 = model.double()(x, y).item()
        res[name] = {"flexc_val_loss": fl, "torch_loss_f32": l32, "torch_loss_f64": l64,
                     "abs_diff_f32": abs(fl - l32), "rel_diff_f64": abs(fl - l64) / abs(l64)}
    return res


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        shape, mode, dtype, steps, threads = sys.argv[2:7]
        print(json.dumps(child_torch(shape, mode == "compile", dtype, int(steps), int(threads))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flexc", default="build/flexc")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per measurement")
    ap.add_argument("--shapes", default="small,gpt2")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds a PyTorch measurement may take (compilation included); past it the "
                         "measurement is reported as timed out and left out of the ratios")
    ap.add_argument("--no-parity", action="store_true", help="skip the parameter and loss check")
    a = ap.parse_args()
    shapes, variants = a.shapes.split(","), a.variants.split(",")
    for s in shapes:
        if s not in SHAPES:
            ap.error(f"--shapes: '{s}' is not one of {', '.join(SHAPES)}")
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"--variants: '{v}' is not one of {', '.join(VARIANTS)}")
    if "flexc" not in variants:
        variants.insert(0, "flexc")
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"))
    ok = True
    with tempfile.TemporaryDirectory(prefix="flexc_vs_torch.") as work:
        for shape in shapes:
            if not a.no_parity:
                p = check_parity(a.flexc, shape, a.threads, env, work)
                print(json.dumps(p), flush=True)
                ok &= p["init"]["rel_diff_f64"] < 1e-5 and p["unit"]["rel_diff_f64"] < 1e-5
            res = {v: [] for v in variants}
            for r in range(a.rounds):
                order = variants if r % 2 == 0 else variants[::-1]
                for v in order:
                    if v.startswith("flexc"):
                        m = run_flexc(a.flexc, shape, a.steps, a.threads, env, "bf16" if v == "flexc-bf16" else "f32")
                    else:
                        m = run_torch(shape, v, a.steps, a.threads, env, a.timeout)
                    res[v].append(m)
                    print(json.dumps({"case": "train_vs_torch_run", "shape": shape, "variant": v, "round": r,
                                      "threads": a.threads, **m}), flush=True)
            params = {v: m["params"] for v in variants for m in res[v] if "params" in m}
            if len(set(params.values())) != 1:
                print(json.dumps({"case": "train_vs_torch", "shape": shape, "error": "parameter counts differ",
                                  "params": params}))
                ok = False
            # Each flexc variant against every PyTorch variant; flexc-bf16 also against flexc.
            rows = [(b, v) for b in ("flexc", "flexc-bf16") if b in variants for v in variants
                    if not v.startswith("flexc") or (b == "flexc-bf16" and v == "flexc")]
            for base, v in rows:
                fx = res[base]
                pairs = [(f, t) for f, t in zip(fx, res[v]) if "error" not in t]  # the rounds it finished
                if not pairs:
                    print(json.dumps({"case": "train_vs_torch", "shape": shape, "flexc_variant": base, "peer": v,
                                      "error": res[v][0]["error"]}))
                    continue
                fx_ok, ms = [f for f, _ in pairs], [t for _, t in pairs]
                row = {"case": "train_vs_torch", "shape": shape, "flexc_variant": base, "peer": v, "threads": a.threads,
                       "batch": SHAPES[shape]["B"], "seq": SHAPES[shape]["T"], "vocab": SHAPES[shape]["vocab"],
                       "params": params[base], "rounds": len(pairs), "steps": a.steps,
                       "flexc_tokens_per_s": statistics.median(m["tokens_per_s"] for m in fx_ok),
                       "torch_tokens_per_s": statistics.median(m["tokens_per_s"] for m in ms),
                       "speedup": statistics.median(f["tokens_per_s"] / t["tokens_per_s"] for f, t in pairs),
                       "flexc_max_rss_bytes": statistics.median(m["max_rss_bytes"] for m in fx_ok),
                       "torch_max_rss_bytes": statistics.median(m["max_rss_bytes"] for m in ms),
                       "max_rss_ratio": statistics.median(f["max_rss_bytes"] / t["max_rss_bytes"]
                                                          for f, t in pairs),
                       "flexc_peak_bytes": statistics.median(m["peak_growth_bytes"] for m in fx_ok),
                       "torch_peak_growth_bytes": statistics.median(m["peak_growth_bytes"] for m in ms),
                       "peak_ratio": statistics.median(f["peak_growth_bytes"] / t["peak_growth_bytes"]
                                                       for f, t in pairs)}
                print(json.dumps(row), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
