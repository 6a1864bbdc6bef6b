#!/usr/bin/env python3
"""flexc's CUDA kernels and GPU training step against PyTorch on the same GPU (scripts/gpu-bench.sh).

Each case runs in rounds: flexc (build/bench_cuda, REPS timed calls, median) then each PyTorch
peer (the same shapes in this process, REPS timed calls with CUDA events, median), alternating;
the ratio of a round is peer_ms / flexc_ms (> 1: flexc faster), and a case reports the median
ratio over its rounds. One JSON object per case and peer on stdout.

Like is compared with like:
- attention forward against the peers' forward, and flexc's forward + backward against the
  peers' forward + backward (torch.autograd.grad of the output, no gradient accumulation);
- a masked case (sliding window, documents) against torch.compile(flex_attention) with the same
  mask_mod (block size 128, as flexc's); SDPA's flash and cuDNN backends only where they compute
  the same thing: dense causal attention (is_causal);
- decoding against torch.compile(flex_attention) and SDPA with GQA, and as a fraction of the
  GPU's copy bandwidth measured in the same run (bytes of K, V, Q and the output per call);
- the fused loss against F.linear_cross_entropy where the installed PyTorch has it, else the
  unfused F.cross_entropy(h @ w.T), forward + backward, with the memory each takes beyond its
  inputs against the bfloat16 logits [N, V] it never materialises;
- training (--train): `flexc bench train --device cuda` against the same Llama-style model in
  PyTorch (bench/train_vs_torch.py's), eager and torch.compile, bfloat16 autocast, fused AdamW,
  each in its own process; memory is each process's peak device memory as the driver reports
  it (nvidia-smi), measured the same way for both.

    python3 bench/cuda_vs_torch.py BUILD_DIR [--rounds 3] [--reps 10] [--quick] [--train]
                                   [--flexc BUILD_DIR/flexc] [--only attn,decode,lce,train]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import torch
import torch.nn.functional as F

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # an older PyTorch
    flex_attention = None
try:
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:
    sdpa_kernel = None

ATTN_CASES = [
    # name, B, Hq, Hkv, L, D, mask, in --quick
    ("causal 1x16x8192x128", 1, 16, 16, 8192, 128, "causal", True),
    ("sliding 1024, 1x16x8192x128", 1, 16, 16, 8192, 128, "sliding:1024", True),
    ("sliding 256, 1x8x32768x64", 1, 8, 8, 32768, 64, "sliding:256", False),
    ("document 16 docs, 1x8x16384x64", 1, 8, 8, 16384, 64, "document:16", False),
]
DECODE = (8, 32, 8, 32768, 128)  # B, Hq, Hkv, Lkv, D; one query row
LCE = (16384, 4096, 128256)
TRAIN_SHAPES = {
    # flexc preset, the PyTorch model's sizes (bench/train_vs_torch.py), batch, sequence
    "gpt2": dict(model="gpt2", layers=12, dim=768, heads=12, kv_heads=12, vocab=50257, ctx=1024, B=8, T=1024),
    "small": dict(model="small", layers=6, dim=384, heads=6, kv_heads=2, vocab=257, ctx=256, B=64, T=256),
}


def timed(fn, reps):
    fn()
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def flexc_run(build, args):
    r = subprocess.run([f"{build}/bench_cuda", *map(str, args)], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"bench_cuda {' '.join(map(str, args))}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def mask_mod_of(mask, L):
    if mask == "causal":
        return lambda b, h, q, kv: kv <= q
    if mask.startswith("sliding:"):
        w = int(mask.split(":")[1])
        return lambda b, h, q, kv: (kv <= q) & (q - kv < w)
    if mask.startswith("document:"):
        n = int(mask.split(":")[1])
        ids = (torch.arange(L, device="cuda") * n) // L
        return lambda b, h, q, kv: (ids[q] == ids[kv]) & (kv <= q)
    return None


def attn_peers(B, Hq, Hkv, Lq, Lkv, D, mask, backward):
    """The PyTorch calls that compute what flexc's call computes, by name."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Hq, Lq, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(backward)
    k = torch.randn(B, Hkv, Lkv, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(backward)
    v = torch.randn(B, Hkv, Lkv, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(backward)
    dout = torch.randn(B, Hq, Lq, D, device="cuda", dtype=torch.bfloat16, generator=g)
    gqa = Hq != Hkv

    def with_backward(f):
        if not backward:
            return f
        return lambda: torch.autograd.grad(f(), (q, k, v), dout)

    peers = {}
    if flex_attention is not None:
        mm = mask_mod_of(mask, Lkv)
        bm = create_block_mask(mm, None, None, Lq, Lkv, device="cuda") if mm else None
        fa = torch.compile(flex_attention)
        peers["torch.compile(flex_attention)"] = with_backward(lambda: fa(q, k, v, block_mask=bm, enable_gqa=gqa))
    if mask in ("causal", "none") and sdpa_kernel is not None:
        causal = mask == "causal"
        backends = [("SDPA flash", SDPBackend.FLASH_ATTENTION), ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION)]
        if Lq == 1:
            backends = [("SDPA (default backend)", None)]
        for name, be in backends:
            def call(be=be):
                if be is None:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
                with sdpa_kernel([be]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
            peers[name + (", is_causal" if causal else "")] = with_backward(call)
    return peers


def rounds(name, flexc_args, peers, n_rounds, reps, extra=None, flops=None):
    """Alternates flexc and each peer; prints one JSON object per peer."""
    build, args = flexc_args
    runs = {p: [] for p in peers}
    flexc = []
    for _ in range(n_rounds):
        for p, fn in peers.items():
            f = flexc_run(build, args)
            flexc.append(f)
            try:
                runs[p].append((f["ms"], timed(fn, reps)))
            except Exception as e:  # a peer that fails must not hide the others
                runs[p].append((f["ms"], None))
                print(json.dumps({"case": name, "peer": p, "error": str(e)[:300]}), flush=True)
    for p, pairs in runs.items():
        ok = [(a, b) for a, b in pairs if b is not None]
        if not ok:
            continue
        fl, pe = statistics.median(a for a, _ in ok), statistics.median(b for _, b in ok)
        out = {"case": name, "peer": p, "flexc_ms": round(fl, 4), "peer_ms": round(pe, 4),
               "ratio_peer_over_flexc": round(statistics.median(b / a for a, b in ok), 3), "rounds": len(ok),
               "reps": reps, "flexc_scratch_mb": round(flexc[-1].get("scratch_bytes", 0) / 2**20, 1)}
        if flops:
            out["flexc_tflops"] = round(flops / fl / 1e9, 1)
            out["peer_tflops"] = round(flops / pe / 1e9, 1)
        out.update(extra or {})
        print(json.dumps(out), flush=True)


def copy_bandwidth():
    """Device-to-device copy rate in bytes/s (read + written), the memory-bound ceiling."""
    n = 2**30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = timed(lambda: b.copy_(a), 10)
    del a, b
    return 2 * n / (ms / 1e3)


def bench_attention(o):
    for name, B, Hq, Hkv, L, D, mask, quick in ATTN_CASES:
        if o.quick and not quick:
            continue
        density = flexc_run(o.build, ["attn", B, Hq, Hkv, L, L, D, mask, "bf16", 1])["density"]
        fwd_flops = 4.0 * B * Hq * L * L * D * density  # by block density: what is computed
        for mode, mult in (("fwd", 1.0), ("fwdbwd", 3.5)):
            try:
                peers = attn_peers(B, Hq, Hkv, L, L, D, mask, mode == "fwdbwd")
                rounds(f"attention {name} {mode}", (o.build, ["attn", B, Hq, Hkv, L, L, D, mask, "bf16", o.reps, mode]),
                       peers, o.rounds, o.reps, {"dtype": "bf16", "mode": mode, "density": density},
                       fwd_flops * mult)
            except Exception as e:
                print(json.dumps({"case": f"attention {name} {mode}", "error": str(e)[:400]}), flush=True)
            torch.cuda.empty_cache()


def bench_decode(o):
    B, Hq, Hkv, Lkv, D = DECODE
    bw = copy_bandwidth()
    moved = 2 * (2 * B * Hkv * Lkv * D + 2 * B * Hq * D)  # bf16 K, V read; Q read, out written
    name = f"decode {B}x{Hq}/{Hkv} heads, Lkv {Lkv}, D {D}"
    try:
        f = flexc_run(o.build, ["attn", B, Hq, Hkv, 1, Lkv, D, "none", "bf16", o.reps])
        print(json.dumps({"case": name, "flexc_ms": f["ms"], "bytes": moved,
                          "flexc_gb_per_s": round(moved / f["ms"] / 1e6, 1),
                          "copy_gb_per_s": round(bw / 1e9, 1),
                          "fraction_of_copy_bandwidth": round(moved / (f["ms"] / 1e3) / bw, 3)}), flush=True)
        rounds(name, (o.build, ["attn", B, Hq, Hkv, 1, Lkv, D, "none", "bf16", o.reps]),
               attn_peers(B, Hq, Hkv, 1, Lkv, D, "none", False), o.rounds, o.reps, {"dtype": "bf16"})
    except Exception as e:
        print(json.dumps({"case": name, "error": str(e)[:400]}), flush=True)


def bench_lce(o):
    N, D, V = LCE
    name = f"fused loss N {N}, D {D}, V {V}, forward + backward"
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(N, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
    w = (torch.randn(V, D, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02).requires_grad_(True)
    t = torch.randint(0, V, (N,), device="cuda", generator=g)
    if hasattr(F, "linear_cross_entropy"):
        peer = "F.linear_cross_entropy"
        fn = lambda: torch.autograd.grad(F.linear_cross_entropy(h, w, t), (h, w))  # noqa: E731
    else:
        peer = "unfused F.cross_entropy(h @ w.T) (this PyTorch has no F.linear_cross_entropy)"
        fn = lambda: torch.autograd.grad(F.cross_entropy(F.linear(h, w).float(), t), (h, w))  # noqa: E731
    fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    peer_mem = torch.cuda.max_memory_allocated() - base
    logits = N * V * 2
    try:
        f = flexc_run(o.build, ["lce", N, D, V, "bf16", 1])
        flops = 6.0 * N * D * V  # h W^T, dh = G W, dW = G^T h
        rounds(name, (o.build, ["lce", N, D, V, "bf16", o.reps]), {peer: fn}, o.rounds, o.reps,
               {"dtype": "bf16", "logits_bf16_mb": round(logits / 2**20, 1),
                "flexc_scratch_over_logits": round(f["scratch_bytes"] / logits, 4),
                "peer_extra_mb": round(peer_mem / 2**20, 1)}, flops)
    except Exception as e:
        print(json.dumps({"case": name, "error": str(e)[:400]}), flush=True)
    del h, w, t
    torch.cuda.empty_cache()


# ---- training -----------------------------------------------------------------------------


class PeakMemory:
    """Polls nvidia-smi for the largest device memory a process (by pid) holds."""

    def __init__(self, pid):
        self.pid, self.peak, self.stop = pid, 0, False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop:
            r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True)
            for line in r.stdout.splitlines():
                p = line.split(",")
                if len(p) == 2 and p[0].strip() == str(self.pid):
                    self.peak = max(self.peak, int(p[1]) * 2**20)
            time.sleep(0.05)

    def done(self):
        self.stop = True
        self.t.join()
        return self.peak


def measured(cmd, timeout):
    """Runs cmd, returning its last JSON line and its peak device memory."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    mon = PeakMemory(p.pid)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        mon.done()
        return {"error": f"timed out after {timeout} s"}
    peak = mon.done()
    if p.returncode != 0:
        return {"error": err.strip()[-600:]}
    r = json.loads(out.strip().splitlines()[-1])
    r["device_peak_bytes"] = peak
    return r


def child_train(shape, compiled, steps):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from train_vs_torch import GPT  # the same model as the CPU comparison's

    s = TRAIN_SHAPES[shape]
    torch.manual_seed(0)
    model = GPT(**s).cuda()
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if compiled else model
    B, T = s["B"], s["T"]
    data = torch.randint(0, s["vocab"], (64, T + 1), device="cuda")
    params = list(model.parameters())

    def step(i):
        w = data[(i * B + torch.arange(B, device="cuda")) % data.shape[0]]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(w[:, :-1], w[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for i in range(3):
        step(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        step(3 + i)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    return {"tokens_per_s": B * T / dt, "step_s": dt, "params": sum(p.numel() for p in params)}


def bench_train(o):
    for shape in o.train_shapes.split(","):
        s = TRAIN_SHAPES[shape]
        flexc_cmd = [o.flexc, "bench", "train", "--device", "cuda", "--dtype", "bf16", "--model", s["model"],
                     "--vocab", str(s["vocab"]), "--batch", str(s["B"]), "--seq", str(s["T"]), "--only", "flex",
                     "--steps", str(o.train_steps), "--json"]
        res = {"flexc": [], "torch eager bf16": [], "torch.compile bf16": []}
        for _ in range(o.train_rounds):
            res["flexc"].append(measured(flexc_cmd, 600))
            for peer, comp in (("torch eager bf16", "eager"), ("torch.compile bf16", "compile")):
                res[peer].append(measured([sys.executable, os.path.abspath(__file__), "--train-child", shape, comp,
                                           str(o.train_steps)], 900))
        for r in (x for v in res.values() for x in v):
            if "error" in r:
                print(json.dumps({"case": f"train {shape}", "error": r["error"]}), flush=True)
        for peer in ("torch eager bf16", "torch.compile bf16"):
            pairs = [(a, b) for a, b in zip(res["flexc"], res[peer]) if "error" not in a and "error" not in b]
            if not pairs:
                continue
            print(json.dumps({
                "case": f"train {shape} B {s['B']} T {s['T']} bf16", "peer": peer,
                "flexc_tokens_per_s": round(statistics.median(a["tokens_per_s"] for a, _ in pairs), 1),
                "peer_tokens_per_s": round(statistics.median(b["tokens_per_s"] for _, b in pairs), 1),
                "ratio_flexc_over_peer_tokens_per_s": round(statistics.median(a["tokens_per_s"] / b["tokens_per_s"]
                                                                              for a, b in pairs), 3),
                "flexc_device_peak_mb": round(statistics.median(a["device_peak_bytes"] for a, _ in pairs) / 2**20),
                "peer_device_peak_mb": round(statistics.median(b["device_peak_bytes"] for _, b in pairs) / 2**20),
                "memory_ratio_flexc_over_peer": round(statistics.median(a["device_peak_bytes"] / max(b["device_peak_bytes"], 1)
                                                                        for a, b in pairs), 3),
                "rounds": len(pairs), "steps": o.train_steps}), flush=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--train-child":
        print(json.dumps(child_train(sys.argv[2], sys.argv[3] == "compile", int(sys.argv[4]))))
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="the two D=128 attention cases, decode and the loss")
    ap.add_argument("--only", default="attn,decode,lce", help="attn, decode, lce, train (comma-separated)")
    ap.add_argument("--flexc", default=None, help="the flexc command for --only train (default BUILD/flexc)")
    ap.add_argument("--train-shapes", default="gpt2")
    ap.add_argument("--train-steps", type=int, default=10)
    ap.add_argument("--train-rounds", type=int, default=2)
    o = ap.parse_args()
    o.flexc = o.flexc or f"{o.build}/flexc"
    if not torch.cuda.is_available():
        print("cuda_vs_torch: no CUDA device", file=sys.stderr)
        return 77
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(json.dumps(info), flush=True)
    only = o.only.split(",")
    if "attn" in only:
        bench_attention(o)
    if "decode" in only:
        bench_decode(o)
    if "lce" in only:
        bench_lce(o)
    if "train" in only:
        bench_train(o)
    return 0


if __name__ == "__main__":
    sys.exit(main())
