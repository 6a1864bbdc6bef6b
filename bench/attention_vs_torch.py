#!/usr/bin/env python3
"""flexc.torch.flex_attention against PyTorch's compiled flex_attention and SDPA on the CPU.

Cases (B=1, H=8, D=64, float32): L=32768 with a causal sliding window of 256, and L=8192 with
a window of 64. In one process, at the same thread count for both libraries:
  flexc:       flexc.torch.flex_attention(q, k, v, block_mask=<flexc mask>)   (+ backward)
  torch_flex:  torch.compile(flex_attention)(q, k, v, block_mask=<PyTorch mask>) (forward; its
               backward where PyTorch has one on the CPU)
  sdpa:        F.scaled_dot_product_attention(q, k, v, is_causal=True)           (+ backward),
               the dense computation a user without block sparsity runs
After one warm-up call each (which compiles PyTorch's), the three are called in turn (flexc,
torch_flex, sdpa, flexc, ...) and times are medians; peak memory is the growth of the resident
set's peak over one call (Linux), beyond the inputs. A peer that cannot run a direction (an
error, such as no CPU backward, or running out of memory) is reported as unsupported with its
error. The masks' build time is reported once each (PyTorch's with _compile=True). One JSON
object per case and direction, with the ratios peer time / flexc time (> 1: flexc is faster),
then a summary against the target (forward >= 3x PyTorch's compiled flex_attention).

    python3 bench/attention_vs_torch.py [--threads T] [--reps R] [--dense-reps R] [--case L,W ...]
                                        [--no-backward]

Imports the installed flexc package (pip install ./python), or python/ of this tree with
FLEXC_LIBRARY=build/libflexc.so. Skips (exit 0) without torch.
"""
import argparse
import json
import os
import statistics
import sys
import time
import warnings

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
from procmem import status_kb  # noqa: E402

CASES = [(8192, 64), (32768, 256)]


def measure(fn):
    """Seconds of one call and the growth of the resident peak over it."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    start = status_kb("VmRSS") * 1024
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    return seconds, status_kb("VmHWM") * 1024 - start


def rotate(fns, reps, limit=None):
    """Medians of seconds and resident-peak growth per function, calling them in turn (A, B, C,
    A, B, C, ...) so that a change in the machine's load falls on every side alike; limit[name]
    caps the calls of a slow one."""
    runs = {name: [] for name in fns}
    for i in range(reps):
        for name, fn in fns.items():
            if i < (limit or {}).get(name, reps):
                runs[name].append(measure(fn))
    return {name: (statistics.median(s for s, _ in r), int(statistics.median(m for _, m in r)))
            for name, r in runs.items()}


def report(**kw):
    print(json.dumps(kw), flush=True)


def first_line(e):
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--case", action="append", help="L,W (default: 8192,64 and 32768,256)")
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--dense-reps", type=int, help="calls of the dense SDPA peer (default: --reps; it is "
                    "the slowest by far, and it needs no warm-up call; 0 leaves it out)")
    args = ap.parse_args()
    cases = [tuple(int(x) for x in c.split(",")) for c in args.case] if args.case else CASES
    torch.set_num_threads(args.threads)
    flexc.set_num_threads(args.threads)
    B, H, D = 1, 8, 64
    # PyTorch 2.15 deprecates _compile=True (in favour of torch.compile(create_block_mask)) but still runs it.
    warnings.filterwarnings("ignore", message="_compile flag on create_block_mask")
    common = dict(threads=args.threads, reps=args.reps, dense_reps=args.dense_reps or args.reps,
                  torch_version=torch.__version__, B=B, H=H, D=D)
    summary = []

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
        # Compiled per case with static shapes: a recompile for a second length would otherwise
        # make the length dynamic, which PyTorch's CPU flex_attention runs by materialising the
        # [B, H, L, L] scores.
        torch._dynamo.reset()
        compiled_flex = torch.compile(flex_attention, dynamic=False)
        case = dict(L=L, window=W, density=round(fmask.density(), 5), flexc_mask_s=round(flexc_mask_s, 4),
                    torch_mask_s=round(torch_mask_s, 3), **common)

        for direction in ("forward",) if args.no_backward else ("forward", "forward+backward"):
            if direction == "forward":
                x, y, z = q, k, v

                def wrap(f):
                    return lambda: f(x, y, z)
            else:
                x, y, z = (t.clone().requires_grad_() for t in (q, k, v))
                dout = torch.randn(B, H, L, D, generator=g)

                def wrap(f):
                    def run():
                        x.grad = y.grad = z.grad = None
                        f(x, y, z).backward(dout)
                    return run
            fns = {"flexc": wrap(lambda a, b, c: ft.flex_attention(a, b, c, block_mask=fmask)),
                   "torch_compiled_flex": wrap(lambda a, b, c: compiled_flex(a, b, c, block_mask=tmask)),
                   "sdpa_dense_causal": wrap(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True))}
            # Warm-up (compiles PyTorch's flex); a peer that cannot run is reported instead of timed.
            failed = {}
            dense_reps = args.reps if args.dense_reps is None else args.dense_reps
            if dense_reps == 0:
                del fns["sdpa_dense_causal"]
            for name in list(fns):
                if name == "sdpa_dense_causal" and dense_reps < args.reps:
                    continue  # nothing to compile; its first call is timed
                try:
                    fns[name]()
                except Exception as e:  # noqa: BLE001 - e.g. no CPU backward for compiled flex_attention
                    failed[name] = first_line(e)
                    del fns[name]
            out = dict(case="attention_vs_torch", direction=direction, **case)
            if direction == "forward" and "torch_compiled_flex" in fns:
                with torch.no_grad():
                    out["max_abs_diff_vs_torch_flex"] = (ft.flex_attention(q, k, v, block_mask=fmask) -
                                                         compiled_flex(q, k, v, block_mask=tmask)).abs().max().item()
            med = rotate(fns, args.reps, {"sdpa_dense_causal": dense_reps})
            for name, (sec, mem) in med.items():
                out[f"{name}_s"], out[f"{name}_rss_growth"] = round(sec, 4), mem
            for name, why in failed.items():
                out[f"{name}_unsupported"] = why
            for peer in ("torch_compiled_flex", "sdpa_dense_causal"):
                if peer in med and "flexc" in med:
                    out[f"speedup_vs_{peer}"] = round(med[peer][0] / med["flexc"][0], 3)
            report(**out)
            summary.append(out)

    print(f"summary (threads {args.threads}, medians of {args.reps}; speedup = peer time / flexc time; "
          "target: forward >= 3x PyTorch's compiled flex_attention):")
    for out in summary:
        parts = []
        for peer in ("torch_compiled_flex", "sdpa_dense_causal"):
            if f"speedup_vs_{peer}" in out:
                parts.append(f"{out['speedup_vs_' + peer]:.2f}x vs {peer} ({out[peer + '_s']:.3f} s)")
            elif f"{peer}_unsupported" in out:
                parts.append(f"{peer} cannot run: {out[peer + '_unsupported']}")
        verdict = ""
        if out["direction"] == "forward" and "speedup_vs_torch_compiled_flex" in out:
            verdict = "; target " + ("met" if out["speedup_vs_torch_compiled_flex"] >= 3 else "missed")
        flexc_s = out.get("flexc_s", float("nan"))
        print(f"  L={out['L']} window={out['window']} {out['direction']}: flexc {flexc_s:.3f} s; " + "; ".join(parts)
              + verdict)


if __name__ == "__main__":
    main()
