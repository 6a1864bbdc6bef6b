#!/usr/bin/env python3
"""flexc's fused linear cross-entropy against PyTorch's, forward and backward, in float32.

For each shape, the same step is timed every way:
  flexc:           fx_linear_cross_entropy(h, w, target) -> loss, dh, dw   (libflexc.so, ctypes)
  flexc_torch:     flexc.torch.linear_cross_entropy(h, w, target).backward()  (the Python package)
  torch:           F.cross_entropy(h @ w.T, target).backward()             (unfused, eager)
  torch_fused:     F.linear_cross_entropy(h, w, target, options=LinearCrossEntropyOptions()).backward()
  torch_reference: F.linear_cross_entropy(h, w, target, options=None).backward()
Each measurement runs in a fresh child process (modes alternating: A, B, C, A, B, C, ...), and
each child reports its time for one step and the growth of its resident set's peak over that
step, after a warm-up and with the gradient buffers already in place (as in a training loop
that zeroes its gradients). Prints one JSON object per shape with the medians and the ratios
against torch (unfused) and torch_fused.

    python3 bench/lce_vs_torch.py [path/to/libflexc.so] [--threads T] [--reps R] [--shape N,D,V]
                                  [--modes flexc,flexc_torch,torch,torch_fused,torch_reference]

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

SHAPES = [(4096, 512, 32768), (2048, 1024, 128256)]
MODES = ["flexc", "flexc_torch", "torch", "torch_fused", "torch_reference"]


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


def child_torch_function(N, D, V, mode):
    """F.linear_cross_entropy (PyTorch's, or flexc.torch's) with autograd."""
    if mode == "flexc_torch":
        import flexc.torch as ft
        fn, kw = ft.linear_cross_entropy, {}
    else:
        from torch.nn import LinearCrossEntropyOptions
        fn, kw = F.linear_cross_entropy, {"options": LinearCrossEntropyOptions() if mode == "torch_fused" else None}
    h, w, t = inputs(N, D, V)
    h = torch.from_numpy(h).requires_grad_()
    w = torch.from_numpy(w).requires_grad_()
    t = torch.from_numpy(t)

    def step(n, v):
        loss = fn(h[:n], w[:v], t[:n].clamp(max=v - 1), **kw)
        loss.backward()
        return float(loss)

    step(min(N, 16), min(V, 1024))
    h.grad, w.grad = torch.zeros_like(h), torch.zeros_like(w)
    start = peak_reset()
    t0 = time.perf_counter()
    loss = step(N, V)
    seconds = time.perf_counter() - t0
    return seconds, peak_growth(start), loss


def run_child(args, mode, shape):
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    if mode == "flexc_torch":
        env.setdefault("FLEXC_LIBRARY", os.path.abspath(args.lib))
        tree = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python")
        env["PYTHONPATH"] = os.pathsep.join([tree] + [p for p in [env.get("PYTHONPATH")] if p])
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
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated, of " + ", ".join(MODES))
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in args.shape.split(","))] if args.shape else SHAPES
    modes = args.modes.split(",")
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes: each of {', '.join(MODES)}")

    if args.child:
        torch.set_num_threads(args.threads)
        N, D, V = shapes[0]
        if args.child == "flexc":
            seconds, rss, loss = child_flexc(args.lib, N, D, V)
        elif args.child == "torch":
            seconds, rss, loss = child_torch(N, D, V)
        else:
            seconds, rss, loss = child_torch_function(N, D, V, args.child)
        print(json.dumps({"seconds": seconds, "rss_growth": rss, "loss": loss}))
        return

    for N, D, V in shapes:
        runs = {m: [] for m in modes}
        for _ in range(args.reps):
            for mode in modes:
                runs[mode].append(run_child(args, mode, (N, D, V)))
        med = {m: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "rss_growth")} for m, rs in runs.items()}
        out = {"case": "lce_vs_torch", "N": N, "D": D, "V": V, "threads": args.threads, "reps": args.reps,
               "torch_version": torch.__version__, "logits_bytes": 4 * N * V}
        for m in modes:
            out[f"{m}_s"] = round(med[m]["seconds"], 4)
            out[f"{m}_rss_growth"] = int(med[m]["rss_growth"])
            out[f"{m}_loss"] = runs[m][0]["loss"]
        # Ratios: time of the peer / time of flexc (> 1: flexc is faster), memory of flexc / peer.
        for ours in ("flexc", "flexc_torch"):
            for peer in ("torch", "torch_fused"):
                if ours in modes and peer in modes:
                    out[f"speedup_{ours}_vs_{peer}"] = round(med[peer]["seconds"] / med[ours]["seconds"], 3)
                    out[f"rss_ratio_{ours}_vs_{peer}"] = round(
                        med[ours]["rss_growth"] / max(med[peer]["rss_growth"], 1), 4)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
