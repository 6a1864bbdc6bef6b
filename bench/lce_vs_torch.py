#!/usr/bin/env python3
"""flexc's fused linear cross-entropy against PyTorch's, forward and backward, in float32.

For each shape, the same training step (loss, then input.grad and weight.grad) is run every way:
  flexc_torch:      flexc.torch.linear_cross_entropy(h, w, target).backward()  (the Python package)
  torch_fused:      F.linear_cross_entropy(h, w, target, options=LinearCrossEntropyOptions()).backward()
                    (PyTorch's chunked path)
  torch_reference:  F.linear_cross_entropy(h, w, target, options=None).backward()  (unchunked: logits)
  flexc_torch_c16:  flexc_torch with LinearCrossEntropyOptions(batch_chunk_size=16): 16-token chunks,
                    a smaller scratch for more, smaller GEMMs
  flexc:            fx_linear_cross_entropy(h, w, target) -> loss, dh, dw   (libflexc.so, ctypes: the
                    kernel alone, without the package's glue)
  torch:            F.cross_entropy(h @ w.T, target).backward()  (unfused, eager; not run by default)
Each measurement runs in a fresh child process, the modes in turn (A, B, C, A, B, C, ...); each
child warms up on small separate tensors, then reports its time for one step and the growth of
its resident set's peak over it. The autograd modes start from .grad None (as after
optimizer.zero_grad()), so the step allocates its outputs; the C call is handed its outputs.
Extra memory, the same for every mode: the peak growth beyond the outputs every implementation
returns (loss, input.grad, weight.grad). A mode whose child fails (for instance out of memory)
is reported as failed. Prints one JSON object per shape with the medians and the ratios, then a
summary against the targets (>= 1.5x faster than torch_fused at <= 1/8 of its extra memory).

    python3 bench/lce_vs_torch.py [path/to/libflexc.so] [--threads T] [--reps R] [--shape N,D,V ...]
                                  [--modes flexc_torch,torch_fused,torch_reference,flexc_torch_c16,flexc,torch]

flexc_torch imports the installed flexc package (pip install ./python), or python/ of this tree
with FLEXC_LIBRARY pointing at the library given. Default shapes: N=4096, D=512, V=32768 and
N=2048, D=1024, V=128256. Skips (exit 0) when numpy or torch is not installed.
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # optional dependencies
    print(json.dumps({"case": "lce_vs_torch", "skipped": f"{e.name} is not installed"}))
    sys.exit(0)

from lce_parity import FxLce, load, ptr
from procmem import peak_growth, peak_reset

SHAPES = [(4096, 512, 32768), (2048, 1024, 128256)]
MODES = ["flexc", "flexc_torch", "flexc_torch_c16", "torch", "torch_fused", "torch_reference"]
DEFAULT_MODES = ["flexc_torch", "torch_fused", "torch_reference", "flexc_torch_c16", "flexc"]


def inputs(N, D, V):
    rng = np.random.default_rng(0)
    h = rng.standard_normal((N, D), dtype=np.float32)
    w = (rng.standard_normal((V, D), dtype=np.float32) * (1.0 / D**0.5)).astype(np.float32)
    t = rng.integers(0, V, N).astype(np.int64)
    return h, w, t


def child_flexc(lib_path, N, D, V):
    lib = load(lib_path)
    h, w, t = inputs(N, D, V)
    dh = np.empty((N, D), np.float32)  # the outputs, written first so that their pages are resident
    dw = np.empty((V, D), np.float32)
    dh.fill(0.0), dw.fill(0.0)
    loss = np.zeros(1, np.float32)

    def step(hh, ww, tt, dhh, dww, n, v):
        p = FxLce(n, D, v, -100, 0, 0.0, 0.0, 0.0, 0, 0)
        rc = lib.fx_linear_cross_entropy(ctypes.byref(p), ptr(hh), ptr(ww), None, ptr(tt), ptr(loss), None,
                                         ptr(dhh), ptr(dww), None)
        if rc != 0:
            raise RuntimeError(lib.fx_last_error().decode())

    # Warm-up (thread pool, code) on small separate arrays: no large block is freed before the window.
    n, v = min(N, 16), min(V, 1024)
    step(h[:n].copy(), w[:v].copy(), np.minimum(t[:n], v - 1), np.zeros((n, D), np.float32),
         np.zeros((v, D), np.float32), n, v)
    start = peak_reset()
    t0 = time.perf_counter()
    step(h, w, t, dh, dw, N, V)
    seconds = time.perf_counter() - t0
    return seconds, peak_growth(start), float(loss[0]), 0


def child_torch(N, D, V, mode):
    """One autograd step, from .grad None (as after optimizer.zero_grad()): the step returns the
    loss, input.grad and weight.grad."""
    if mode == "torch":
        def fn(h, w, t):
            return F.cross_entropy(h @ w.T, t)
    elif mode in ("flexc_torch", "flexc_torch_c16"):
        import flexc.torch as ft
        from torch.nn import LinearCrossEntropyOptions
        opts = LinearCrossEntropyOptions(batch_chunk_size=16) if mode == "flexc_torch_c16" else None

        def fn(h, w, t):
            return ft.linear_cross_entropy(h, w, t, options=opts)
    else:
        from torch.nn import LinearCrossEntropyOptions
        opts = LinearCrossEntropyOptions() if mode == "torch_fused" else None

        def fn(h, w, t):
            return F.linear_cross_entropy(h, w, t, options=opts)

    def step(h, w, t):
        loss = fn(h, w, t)
        loss.backward()
        return float(loss)

    # Warm-up on small separate tensors: no large block is allocated and freed before the window,
    # so the window's peak is not hidden by memory the allocator kept.
    hs, ws, ts = inputs(min(N, 16), D, min(V, 1024))
    step(torch.from_numpy(hs).requires_grad_(), torch.from_numpy(ws).requires_grad_(), torch.from_numpy(ts))
    h, w, t = inputs(N, D, V)
    h = torch.from_numpy(h).requires_grad_()
    w = torch.from_numpy(w).requires_grad_()
    t = torch.from_numpy(t)
    start = peak_reset()
    t0 = time.perf_counter()
    loss = step(h, w, t)
    seconds = time.perf_counter() - t0
    growth = peak_growth(start)
    assert h.grad is not None and w.grad is not None
    return seconds, growth, loss, h.grad.nbytes + w.grad.nbytes


def run_child(args, mode, shape):
    """{"seconds", "rss_growth", "loss", "out_bytes"} of one step in a fresh process, or
    {"failed": why} when the child fails (for instance out of memory)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    if mode.startswith("flexc_torch"):
        env.setdefault("FLEXC_LIBRARY", os.path.abspath(args.lib))
        tree = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python")
        env["PYTHONPATH"] = os.pathsep.join([tree] + [p for p in [env.get("PYTHONPATH")] if p])
    cmd = [sys.executable, os.path.abspath(__file__), args.lib, "--child", mode, "--shape", ",".join(map(str, shape)),
           "--threads", str(args.threads)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
        return {"failed": f"exit status {r.returncode}: {tail[:200]}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib", nargs="?", default=os.path.join(os.environ.get("FLEXC_BUILD_DIR", "build"), "libflexc.so"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--shape", action="append", help="N,D,V (repeatable; default: " +
                    " and ".join(",".join(map(str, s)) for s in SHAPES) + ")")
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES), help="comma-separated, of " + ", ".join(MODES))
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shape] if args.shape else SHAPES
    modes = args.modes.split(",")
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes: each of {', '.join(MODES)}")

    if args.child:
        torch.set_num_threads(args.threads)
        N, D, V = shapes[0]
        if args.child == "flexc":
            seconds, rss, loss, out_bytes = child_flexc(args.lib, N, D, V)
        else:
            seconds, rss, loss, out_bytes = child_torch(N, D, V, args.child)
        print(json.dumps({"seconds": seconds, "rss_growth": rss, "loss": loss, "out_bytes": out_bytes}))
        return

    summary = []
    for N, D, V in shapes:
        runs = {m: [] for m in modes}
        for _ in range(args.reps):
            for mode in modes:
                runs[mode].append(run_child(args, mode, (N, D, V)))
                # Each step as it comes, on stderr: a run cut short still leaves its measurements.
                print(json.dumps({"step": mode, "N": N, "D": D, "V": V, **runs[mode][-1]}), file=sys.stderr, flush=True)
        out = {"case": "lce_vs_torch", "N": N, "D": D, "V": V, "threads": args.threads, "reps": args.reps,
               "torch_version": torch.__version__, "logits_bytes": 4 * N * V, "grads_bytes": 4 * (N * D + V * D)}
        med = {}
        for m in modes:
            ok = [r for r in runs[m] if "failed" not in r]
            if len(ok) < len(runs[m]):
                out[f"{m}_failed"] = next(r["failed"] for r in runs[m] if "failed" in r)
                continue
            # Extra memory: the peak growth over the step beyond the outputs every implementation
            # returns (loss, input.grad, weight.grad; the C call is handed its outputs beforehand).
            med[m] = {"seconds": statistics.median(r["seconds"] for r in ok),
                      "extra": statistics.median(r["rss_growth"] - r["out_bytes"] for r in ok)}
            out[f"{m}_s"] = round(med[m]["seconds"], 4)
            out[f"{m}_extra_bytes"] = int(med[m]["extra"])
            out[f"{m}_loss"] = ok[0]["loss"]
        # Ratios: time of the peer / time of flexc (> 1: flexc is faster); extra memory of flexc /
        # of the peer (< 1: flexc needs less).
        for ours in ("flexc", "flexc_torch", "flexc_torch_c16"):
            for peer in ("torch_fused", "torch_reference", "torch"):
                if ours in med and peer in med:
                    out[f"speedup_{ours}_vs_{peer}"] = round(med[peer]["seconds"] / med[ours]["seconds"], 3)
                    out[f"extra_ratio_{ours}_vs_{peer}"] = round(med[ours]["extra"] / max(med[peer]["extra"], 1), 4)
        print(json.dumps(out), flush=True)
        summary.append(out)

    print(f"summary (threads {args.threads}, medians of {args.reps}; targets against torch_fused: "
          "speedup >= 1.5, extra memory <= 1/8):")
    for out in summary:
        head = f"  N={out['N']} D={out['D']} V={out['V']}:"
        for ours in ("flexc_torch", "flexc_torch_c16", "flexc"):
            sp, ex = out.get(f"speedup_{ours}_vs_torch_fused"), out.get(f"extra_ratio_{ours}_vs_torch_fused")
            if sp is None:
                continue
            line = (f"{head} {ours} {out[ours + '_s']:.3f} s, +{out[ours + '_extra_bytes'] / 2**20:.1f} MiB; "
                    f"torch_fused {out['torch_fused_s']:.3f} s, +{out['torch_fused_extra_bytes'] / 2**20:.1f} MiB: "
                    f"{sp:.2f}x faster ({'met' if sp >= 1.5 else 'missed'}), {ex:.3f} of its extra memory "
                    f"({'met' if ex <= 0.125 else 'missed'})")
            if "torch_reference_s" in out:
                line += (f"; torch_reference {out['torch_reference_s']:.3f} s, "
                         f"+{out['torch_reference_extra_bytes'] / 2**20:.1f} MiB")
            print(line)
        for m in modes:
            if f"{m}_failed" in out:
                print(f"{head} {m} could not run: {out[m + '_failed']}")


if __name__ == "__main__":
    main()
