#!/usr/bin/env python3
"""flexc.torch.flex_attention against PyTorch's compiled flex_attention and SDPA on the CPU.

Cases (B=1, H=8, D=64, float32): L=32768 with a causal sliding window of 256, and L=8192 with
a window of 64. In one process, at the same thread count for both libraries:
  flexc:       flexc.torch.flex_attention(q, k, v, block_mask=<flexc mask>)   (+ backward)
  torch_flex:  torch.compile(flex_attention)(q, k, v, block_mask=<PyTorch mask>) (forward; its
               backward where PyTorch has one on the CPU)
  sdpa:        F.scaled_dot_product_attention(q, k, v, is_causal=True)           (+ backward),
               the dense computation a user without block sparsity runs
Times are medians of alternating pairs (flexc, peer, flexc, peer, ...); peak memory is the
growth of the resident set's peak over one call (Linux), beyond the inputs. The masks' build
time is reported once each (PyTorch's with _compile=True). One JSON object per case and
direction, with the ratios peer time / flexc time (> 1: flexc is faster).

    python3 bench/attention_vs_torch.py [--threads T] [--reps R] [--case L,W ...] [--no-backward]

Imports the installed flexc package (pip install ./python), or python/ of this tree with
FLEXC_LIBRARY=build/libflexc.so. Skips (exit 0) without torch.
"""
import argparse
import json
import os
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError as e:
    print(json.dumps({"case": "attention_vs_torch", "skipped": f"{e.name} is not installed"}))
    sys.exit(0)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import flexc  # noqa: E402
import flexc.torch as ft  # noqa: E402

CASES = [(32768, 256), (8192, 64)]


def rss_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(fn):
    """Seconds of one call and the growth of the resident peak over it."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    start = rss_kb("VmRSS") * 1024
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    return seconds, rss_kb("VmHWM") * 1024 - start


def pairs(a, b, reps):
    ta, tb, ma, mb = [], [], [], []
    for _ in range(reps):
        s, m = measure(a)
        ta.append(s), ma.append(m)
        s, m = measure(b)
        tb.append(s), mb.append(m)
    return statistics.median(ta), statistics.median(tb), int(statistics.median(ma)), int(statistics.median(mb))


def report(**kw):
    print(json.dumps(kw), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--case", action="append", help="L,W (default: 32768,256 and 8192,64)")
    ap.add_argument("--no-backward", action="store_true")
    args = ap.parse_args()
    cases = [tuple(int(x) for x in c.split(",")) for c in args.case] if args.case else CASES
    torch.set_num_threads(args.threads)
    flexc.set_num_threads(args.threads)
    B, H, D = 1, 8, 64
    compiled_flex = torch.compile(flex_attention)
    common = dict(threads=args.threads, reps=args.reps, torch_version=torch.__version__, B=B, H=H, D=D)

    for L, W in cases:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, H, L, D, generator=g) for _ in range(3))
        mod = ft.sliding_window_mask(W)
        t0 = time.perf_counter()
        fmask = ft.create_block_mask(mod, None, None, L, L)
        flexc_mask_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        tmask = create_block_mask(mod, None, None, L, L, device="cpu", _compile=True)
        torch_mask_s = time.perf_counter() - t0
        case = dict(L=L, window=W, density=round(fmask.density(), 5), **common)

        def f_flexc():
            return ft.flex_attention(q, k, v, block_mask=fmask)

        def f_torch():
            return compiled_flex(q, k, v, block_mask=tmask)

        def f_sdpa():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        ref = f_torch()  # compiles
        err = (f_flexc() - ref).abs().max().item()
        a, b, ma, mb = pairs(f_flexc, f_torch, args.reps)
        report(case="attention_vs_torch", direction="forward", peer="torch_compiled_flex", flexc_s=round(a, 4),
               peer_s=round(b, 4), speedup=round(b / a, 3), flexc_rss_growth=ma, peer_rss_growth=mb,
               max_abs_diff=err, flexc_mask_s=round(flexc_mask_s, 4), torch_mask_s=round(torch_mask_s, 3), **case)
        a, b, ma, mb = pairs(f_flexc, f_sdpa, args.reps)
        report(case="attention_vs_torch", direction="forward", peer="sdpa_dense_causal", flexc_s=round(a, 4),
               peer_s=round(b, 4), speedup=round(b / a, 3), flexc_rss_growth=ma, peer_rss_growth=mb, **case)
        if args.no_backward:
            continue

        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        dout = torch.randn(B, H, L, D, generator=g)

        def fb(fn):
            def run():
                qg.grad = kg.grad = vg.grad = None
                fn(qg, kg, vg).backward(dout)
            return run

        flexc_fb = fb(lambda x, y, z: ft.flex_attention(x, y, z, block_mask=fmask))
        try:
            torch_fb = fb(lambda x, y, z: compiled_flex(x, y, z, block_mask=tmask))
            torch_fb()
            a, b, ma, mb = pairs(flexc_fb, torch_fb, args.reps)
            report(case="attention_vs_torch", direction="forward+backward", peer="torch_compiled_flex",
                   flexc_s=round(a, 4), peer_s=round(b, 4), speedup=round(b / a, 3), flexc_rss_growth=ma,
                   peer_rss_growth=mb, **case)
        except Exception as e:  # noqa: BLE001 - PyTorch has no CPU backward for flex_attention
            report(case="attention_vs_torch", direction="forward+backward", peer="torch_compiled_flex",
                   unsupported=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", **case)
        sdpa_fb = fb(lambda x, y, z: F.scaled_dot_product_attention(x, y, z, is_causal=True))
        a, b, ma, mb = pairs(flexc_fb, sdpa_fb, args.reps)
        report(case="attention_vs_torch", direction="forward+backward", peer="sdpa_dense_causal", flexc_s=round(a, 4),
               peer_s=round(b, 4), speedup=round(b / a, 3), flexc_rss_growth=ma, peer_rss_growth=mb, **case)


if __name__ == "__main__":
    main()
