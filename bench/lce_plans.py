#!/usr/bin/env python3
"""Time flexc's fused linear cross-entropy under different chunk plans, in one run.

One call (MEAN loss, dh and dw, float32) per plan, the plans in turn (A, B, A, B, ...) in
this process; prints each plan's chunk, tile and scratch bytes (fx_linear_cross_entropy_plan),
its median time, and the median over the rounds of its time / the first plan's time.

    python3 bench/lce_plans.py [path/to/libflexc.so] [--shape N,D,V] [--reps R]
                               [--plan CHUNK,VOCAB_CHUNK ...]

The default plans are the automatic one (0,0) and whole rows of 125 tokens (125,0), the
automatic plan before its 2 MiB budget at the default shape N=4096, D=512, V=32768. Threads:
OMP_NUM_THREADS. Skips (exit 0) when numpy or torch is not installed (lce_parity.py's
ctypes helpers need them).
"""
import argparse
import ctypes
import json
import os
import statistics
import time

from lce_parity import FxLce, load, ptr  # exits 0 when numpy or torch is missing

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib", nargs="?", default=os.path.join(os.environ.get("FLEXC_BUILD_DIR", "build"), "libflexc.so"))
    ap.add_argument("--shape", default="4096,512,32768", help="N,D,V")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--plan", action="append", help="CHUNK,VOCAB_CHUNK (repeatable; 0: automatic)")
    args = ap.parse_args()
    N, D, V = map(int, args.shape.split(","))
    plans = [tuple(map(int, p.split(","))) for p in (args.plan or ["0,0", "125,0"])]
    lib = load(args.lib)
    lib.fx_linear_cross_entropy_plan.argtypes = [ctypes.POINTER(FxLce), ctypes.POINTER(ctypes.c_int64),
                                                 ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_size_t)]
    rng = np.random.default_rng(0)
    h = rng.standard_normal((N, D), dtype=np.float32)
    w = (rng.standard_normal((V, D), dtype=np.float32) / np.float32(D**0.5)).astype(np.float32)
    t = rng.integers(0, V, N).astype(np.int64)
    dh, dw, loss = np.empty((N, D), np.float32), np.zeros((V, D), np.float32), np.zeros(1, np.float32)

    def params(chunk, vchunk):
        return FxLce(N=N, D=D, V=V, ignore_index=-100, reduction=0, chunk=chunk, vocab_chunk=vchunk)

    times = [[] for _ in plans]
    for _ in range(args.reps):
        for i, (chunk, vchunk) in enumerate(plans):
            p = params(chunk, vchunk)
            t0 = time.perf_counter()
            rc = lib.fx_linear_cross_entropy(ctypes.byref(p), ptr(h), ptr(w), None, ptr(t), ptr(loss), None, ptr(dh),
                                             ptr(dw), None)
            times[i].append(time.perf_counter() - t0)
            if rc != 0:
                raise SystemExit(f"plan {chunk},{vchunk}: {lib.fx_last_error().decode()}")
    for i, (chunk, vchunk) in enumerate(plans):
        c, vc, nbytes = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_size_t()
        lib.fx_linear_cross_entropy_plan(ctypes.byref(params(chunk, vchunk)), ctypes.byref(c), ctypes.byref(vc),
                                         ctypes.byref(nbytes))
        ratio = statistics.median(a / b for a, b in zip(times[i], times[0]))
        print(json.dumps({"case": "lce_plans", "N": N, "D": D, "V": V, "threads": os.environ.get("OMP_NUM_THREADS"),
                          "plan": [chunk, vchunk], "chunk": c.value, "vocab_chunk": vc.value,
                          "scratch_bytes": nbytes.value, "median_s": round(statistics.median(times[i]), 4),
                          "vs_first": round(ratio, 3), "reps": args.reps}))


if __name__ == "__main__":
    main()
