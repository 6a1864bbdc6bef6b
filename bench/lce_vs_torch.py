#!/usr/bin/env python3
"""flexc's fused linear cross-entropy against PyTorch's eager, unfused computation.

For each shape, the same step is timed both ways, forward and backward, in float32:
  flexc:   fx_linear_cross_entropy(h, w, target) -> loss, dh, dw   (libflexc.so, ctypes)
  PyTorch: loss = F.cross_entropy(h @ w.T, target); loss.backward()
Each measurement runs in a fresh child process (A, B, A, B, ...), so that the two OpenMP
runtimes never share a process, and each child reports its time for one call and the growth
of its resident set's peak over that call, after a warm-up and with the gradient buffers
already in place (as in a training loop that zeroes its gradients). Prints one JSON object per
shape with the medians and the ratios flexc / PyTorch.

    python3 bench/lce_vs_torch.py [path/to/libflexc.so] [--threads T] [--reps R] [--shape N,D,V]

Default shapes are those of `flexc bench lce`. Skips (exit 0) when numpy or torch is not
installed.
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

SHAPES = [(4096, 1024, 32768), (2048, 1024, 128256)]


def rss_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_reset():
    """Starts a peak-memory window: resets the resident high-water mark (Linux 4.0+) and
    returns the current resident set in bytes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss_kb("VmRSS") * 1024


def peak_growth(start):
    return rss_kb("VmHWM") * 1024 - start


def inputs(N, D, V):
    rng = np.random.default_rng(0)
    h = rng.standard_normal((N, D), dtype=np.float32)
    w = (rng.standard_normal((V, D), dtype=np.float32) * (1.0 / D**0.5)).astype(np.float32)
    t = rng.integers(0, V, N).astype(np.int64)
    return h, w, t


def child_flexc(lib_path, N, D, V):
    lib = load(lib_path)
    h, w, t = inputs(N, D, V)
    dh = np.ones((N, D), np.float32)  # written, so that their pages are resident
    dw = np.ones((V, D), np.float32)
    loss = np.zeros(1, np.float32)

    def step(n, v):
        p = FxLce(n, D, v, -100, 0, 0.0, 0.0, 0.0, 0, 0)
        rc = lib.fx_linear_cross_entropy(ctypes.byref(p), ptr(h), ptr(w), None, ptr(np.minimum(t[:n], v - 1)),
                                         ptr(loss), None, ptr(dh), ptr(dw), None)
        if rc != 0:
            raise RuntimeError(lib.fx_last_error().decode())

    step(min(N, 16), min(V, 1024))  # warm-up: thread pool and code, not the problem's memory
    start = peak_reset()
    t0 = time.perf_counter()
    step(N, V)
    seconds = time.perf_counter() - t0
    return seconds, peak_growth(start), float(loss[0])


def child_torch(N, D, V):
    h, w, t = inputs(N, D, V)
    h = torch.from_numpy(h).requires_grad_()
    w = torch.from_numpy(w).requires_grad_()
    t = torch.from_numpy(t)

    def step(n, v):
        loss = F.cross_entropy(h[:n] @ w[:v].T, t[:n].clamp(max=v - 1))
        loss.backward()
        return float(loss)

    step(min(N, 16), min(V, 1024))
    h.grad, w.grad = torch.zeros_like(h), torch.zeros_like(w)  # accumulated into, as in training
    start = peak_reset()
    t0 = time.perf_counter()
    loss = step(N, V)
    seconds = time.perf_counter() - t0
    return seconds, peak_growth(start), loss


def run_child(args, mode, shape):
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    cmd = [sys.executable, os.path.abspath(__file__), args.lib, "--child", mode, "--shape", ",".join(map(str, shape)),
           "--threads", str(args.threads)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib", nargs="?", default=os.path.join(os.environ.get("FLEXC_BUILD_DIR", "build"), "libflexc.so"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--shape", help="N,D,V (default: the shapes of `flexc bench lce`)")
    ap.add_argument("--child", choices=["flexc", "torch"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in args.shape.split(","))] if args.shape else SHAPES

    if args.child:
        torch.set_num_threads(args.threads)
        N, D, V = shapes[0]
        seconds, rss, loss = child_flexc(args.lib, N, D, V) if args.child == "flexc" else child_torch(N, D, V)
        print(json.dumps({"seconds": seconds, "rss_growth": rss, "loss": loss}))
        return

    for N, D, V in shapes:
        runs = {"flexc": [], "torch": []}
        for _ in range(args.reps):
            for mode in ("flexc", "torch"):
                runs[mode].append(run_child(args, mode, (N, D, V)))
        med = {m: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "rss_growth")} for m, rs in runs.items()}
        print(json.dumps({
            "case": "lce_vs_torch", "N": N, "D": D, "V": V, "threads": args.threads, "reps": args.reps,
            "torch_version": torch.__version__, "logits_bytes": 4 * N * V,
            "flexc_s": round(med["flexc"]["seconds"], 4), "torch_s": round(med["torch"]["seconds"], 4),
            "time_ratio": round(med["flexc"]["seconds"] / med["torch"]["seconds"], 3),
            "flexc_rss_growth": int(med["flexc"]["rss_growth"]), "torch_rss_growth": int(med["torch"]["rss_growth"]),
            "rss_ratio": round(med["flexc"]["rss_growth"] / max(med["torch"]["rss_growth"], 1), 4),
            "loss_flexc": runs["flexc"][0]["loss"], "loss_torch": runs["torch"][0]["loss"],
        }), flush=True)


if __name__ == "__main__":
    main()
