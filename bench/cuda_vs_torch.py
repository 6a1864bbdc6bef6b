#!/usr/bin/env python3
"""flexc's CUDA kernels against the PyTorch peers on the same GPU (scripts/gpu-bench.sh).

Each case runs in rounds: flexc (build/bench_cuda, REPS timed calls, median) then PyTorch
(the same shapes in this process, REPS timed calls with CUDA events, median), alternating;
the ratio of each round is peer_ms / flexc_ms (> 1: flexc faster), and the case reports the
median ratio over the rounds. One JSON object per case and peer on stdout.

Peers: torch.compile(flex_attention) with create_block_mask, and SDPA
(F.scaled_dot_product_attention, flash / efficient kernels, dense or is_causal) for the
attention cases; for the fused loss, the unfused F.cross_entropy(h @ w.T) forward and
backward (materialised logits), with its peak memory.

    python3 bench/cuda_vs_torch.py BUILD_DIR [--rounds 5] [--reps 10] [--quick]
"""
import argparse
import json
import subprocess
import statistics
import sys

import torch
import torch.nn.functional as F

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # an older PyTorch
    flex_attention = None

ATTN_CASES = [
    # name, B, Hq, Hkv, L, Lkv, D, mask, backward
    ("sliding window 256, L 32768", 1, 8, 8, 32768, 32768, 64, "sliding:256", False),
    ("sliding window 64, L 8192", 1, 8, 8, 8192, 8192, 64, "sliding:64", False),
    ("sliding window 64, L 8192, backward", 1, 8, 8, 8192, 8192, 64, "sliding:64", True),
    ("causal, L 8192", 1, 8, 8, 8192, 8192, 64, "causal", False),
    ("document 16 docs, L 16384", 1, 8, 8, 16384, 16384, 64, "document:16", False),
    ("decode, Lq 1 x Lkv 32768, GQA 32/8", 8, 32, 8, 1, 32768, 128, "none", False),
]
LCE_CASES = [(4096, 1024, 32768), (2048, 1024, 128256)]


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


def flexc_ms(build, args):
    r = subprocess.run([f"{build}/bench_cuda", *map(str, args)], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"bench_cuda {' '.join(map(str, args))}: {r.stderr.strip()}")
    return json.loads(r.stdout)["ms"]


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


def torch_attention(B, Hq, Hkv, L, Lkv, D, mask, backward):
    q = torch.randn(B, Hq, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
    k = torch.randn(B, Hkv, Lkv, D, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
    v = torch.randn(B, Hkv, Lkv, D, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
    peers = {}
    mm = mask_mod_of(mask, Lkv)
    if flex_attention is not None:
        bm = create_block_mask(mm, 1, 1, Lkv, Lkv, device="cuda") if mm else None
        fa = torch.compile(flex_attention)
        gqa = Hq != Hkv

        def flex():
            o = fa(q, k, v, block_mask=bm, enable_gqa=gqa)
            if backward:
                o.sum().backward()

        peers["torch.compile(flex_attention)"] = flex
    kr = k.repeat_interleave(Hq // Hkv, dim=1) if Hq != Hkv else k
    vr = v.repeat_interleave(Hq // Hkv, dim=1) if Hq != Hkv else v

    def sdpa():
        o = F.scaled_dot_product_attention(q, kr, vr, is_causal=mm is not None and L == Lkv)
        if backward:
            o.sum().backward()

    peers["SDPA (dense" + (", is_causal)" if mm is not None else ")")] = sdpa
    return peers


def torch_lce(N, D, V):
    h = torch.randn(N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(V, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) * 0.02
    w = w.detach().requires_grad_(True)
    t = torch.randint(0, V, (N,), device="cuda")

    def unfused():
        loss = F.cross_entropy((h @ w.T).float(), t)
        loss.backward()

    return {"unfused F.cross_entropy(h @ w.T)": unfused}


def rounds(name, flexc_args, peers, n_rounds, reps, extra):
    for peer, fn in peers.items():
        ratios, fl, pe = [], [], []
        torch.cuda.reset_peak_memory_stats()
        for _ in range(n_rounds):
            a = flexc_ms(*flexc_args)
            b = timed(fn, reps)
            fl.append(a)
            pe.append(b)
            ratios.append(b / a)
        out = {"case": name, "peer": peer, "flexc_ms": statistics.median(fl), "peer_ms": statistics.median(pe),
               "ratio_peer_over_flexc": statistics.median(ratios), "rounds": n_rounds, "reps": reps,
               "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "peer_peak_mem_mb": torch.cuda.max_memory_allocated() / 2**20}
        out.update(extra)
        print(json.dumps(out), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="the first attention case and the first loss case only")
    o = ap.parse_args()
    if not torch.cuda.is_available():
        print("cuda_vs_torch: no CUDA device", file=sys.stderr)
        return 77
    cases = ATTN_CASES[:1] if o.quick else ATTN_CASES
    for name, B, Hq, Hkv, L, Lkv, D, mask, bwd in cases:
        args = ["attn", B, Hq, Hkv, L, Lkv, D, mask, "bf16", o.reps] + (["bwd"] if bwd else [])
        try:
            rounds(name, (o.build, args), torch_attention(B, Hq, Hkv, L, Lkv, D, mask, bwd), o.rounds, o.reps,
                   {"dtype": "bf16"})
        except Exception as e:  # one failing case must not hide the others
            print(json.dumps({"case": name, "error": str(e)[:400]}), flush=True)
    for N, D, V in LCE_CASES[:1] if o.quick else LCE_CASES:
        name = f"fused loss N {N}, D {D}, V {V}"
        try:
            rounds(name, (o.build, ["lce", N, D, V, "bf16", o.reps]), torch_lce(N, D, V), o.rounds, o.reps,
                   {"dtype": "bf16"})
        except Exception as e:
            print(json.dumps({"case": name, "error": str(e)[:400]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
