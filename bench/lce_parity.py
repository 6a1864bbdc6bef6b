#!/usr/bin/env python3
"""Parity of flexc's fused linear cross-entropy with PyTorch.

For a grid of options (reduction, ignore_index, label smoothing, z-loss, soft-capping,
bias), compares flexc's loss, lse and gradients (float32, through ctypes on libflexc.so)
with PyTorch's unfused float64 computation: logits = h @ w.T + bias, optional cap,
torch.nn.functional.cross_entropy, plus s * lse^2 per non-ignored token, and autograd.
Prints one JSON object per case; exits 1 if a case disagrees.

    python3 bench/lce_parity.py [path/to/libflexc.so]

Skips (exit 0) when numpy or torch is not installed.
"""
import ctypes
import json
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # optional dependencies
    print(json.dumps({"case": "lce_parity", "skipped": f"{e.name} is not installed"}))
    sys.exit(0)


class FxLce(ctypes.Structure):
    _fields_ = [
        ("N", ctypes.c_int64), ("D", ctypes.c_int64), ("V", ctypes.c_int64),
        ("ignore_index", ctypes.c_int64),
        ("reduction", ctypes.c_int),
        ("label_smoothing", ctypes.c_float), ("z_loss", ctypes.c_float), ("softcap", ctypes.c_float),
        ("chunk", ctypes.c_int64), ("vocab_chunk", ctypes.c_int64),
        # where the call runs: zero (the default) is the CPU and float32
        ("device", ctypes.c_int), ("stream", ctypes.c_void_p), ("dtype", ctypes.c_int),
    ]


REDUCTIONS = {"mean": 0, "sum": 1, "none": 2}


def load(path):
    lib = ctypes.CDLL(path)
    f = ctypes.POINTER(ctypes.c_float)
    i64 = ctypes.POINTER(ctypes.c_int64)
    lib.fx_linear_cross_entropy.argtypes = [ctypes.POINTER(FxLce), f, f, f, i64, f, f, f, f, f]
    lib.fx_linear_cross_entropy_backward.argtypes = [ctypes.POINTER(FxLce), f, f, f, i64, f, f, f, f, f]
    lib.fx_last_error.restype = ctypes.c_char_p
    return lib


def ptr(a):
    if a is None:
        return None
    ctype = ctypes.c_int64 if a.dtype == np.int64 else ctypes.c_float
    return a.ctypes.data_as(ctypes.POINTER(ctype))


def torch_reference(h, w, b, t, red, ignore, eps, zl, cap, grad):
    h = torch.tensor(h, dtype=torch.float64, requires_grad=True)
    w = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(b, dtype=torch.float64, requires_grad=True) if b is not None else None
    t = torch.tensor(t)
    z = h @ w.T
    if b is not None:
        z = z + b
    if cap > 0:
        z = cap * torch.tanh(z / cap)
    lse = torch.logsumexp(z, dim=1)
    valid = (t != ignore).to(torch.float64)
    tok = F.cross_entropy(z, t, ignore_index=ignore, reduction="none", label_smoothing=eps)
    tok = tok + zl * lse * lse * valid
    if red == "mean":
        loss = tok.sum() / valid.sum()
    elif red == "sum":
        loss = tok.sum()
    else:
        loss = tok
    upstream = torch.tensor(grad, dtype=torch.float64)
    (loss * upstream).sum().backward()
    out = {"loss": loss.detach().numpy(), "lse": lse.detach().numpy(), "dh": h.grad.numpy(), "dw": w.grad.numpy()}
    if b is not None:
        out["dbias"] = b.grad.numpy()
    return out


def rel_err(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    scale = max(np.abs(ref).max(), 1e-30)
    return float(np.abs(got - ref).max() / scale)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("FLEXC_BUILD_DIR", "build"), "libflexc.so")
    lib = load(path)
    rng = np.random.default_rng(0)
    N, D, V = 37, 24, 301
    bad = 0
    for red in ("mean", "sum", "none"):
        for eps in (0.0, 0.1):
            for zl in (0.0, 1e-3):
                for cap in (0.0, 5.0):
                    for with_bias in (False, True):
                        h = rng.uniform(-1, 1, (N, D)).astype(np.float32)
                        w = rng.uniform(-0.5, 0.5, (V, D)).astype(np.float32)
                        b = rng.uniform(-1, 1, V).astype(np.float32) if with_bias else None
                        t = rng.integers(0, V, N).astype(np.int64)
                        t[::5] = -100
                        grad = rng.uniform(-1, 1, N if red == "none" else 1).astype(np.float32)
                        p = FxLce(N, D, V, -100, REDUCTIONS[red], eps, zl, cap, 8, 0)
                        loss = np.zeros(N if red == "none" else 1, np.float32)
                        lse = np.zeros(N, np.float32)
                        dh = np.zeros((N, D), np.float32)
                        dw = np.zeros((V, D), np.float32)
                        db = np.zeros(V, np.float32) if with_bias else None
                        rc = lib.fx_linear_cross_entropy(ctypes.byref(p), ptr(h), ptr(w), ptr(b), ptr(t), ptr(loss),
                                                         ptr(lse), None, None, None)
                        rc = rc or lib.fx_linear_cross_entropy_backward(ctypes.byref(p), ptr(h), ptr(w), ptr(b), ptr(t),
                                                                       ptr(lse), ptr(grad), ptr(dh), ptr(dw), ptr(db))
                        case = {"case": "lce_parity", "reduction": red, "eps": eps, "z_loss": zl, "softcap": cap,
                                "bias": with_bias}
                        if rc != 0:
                            case["error"] = lib.fx_last_error().decode()
                            print(json.dumps(case))
                            bad += 1
                            continue
                        ref = torch_reference(h, w, b, t, red, -100, eps, zl, cap, grad if red == "none" else grad[0])
                        errs = {"loss": rel_err(loss, ref["loss"]), "lse": rel_err(lse, ref["lse"]),
                                "dh": rel_err(dh, ref["dh"]), "dw": rel_err(dw, ref["dw"])}
                        if with_bias:
                            errs["dbias"] = rel_err(db, ref["dbias"])
                        case["max_rel_err"] = errs
                        case["ok"] = all(e < 1e-4 for e in errs.values())
                        bad += not case["ok"]
                        print(json.dumps(case))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
