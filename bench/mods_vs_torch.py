#!/usr/bin/env python3
"""FlexAttention with a score_mod written by the user: flexc against PyTorch on the CPU.

    python3 bench/mods_vs_torch.py [--threads T] [--reps R] [--L 8192] [--mod NAME ...]
                                   [--mask causal|sliding256 ...] [--no-backward]

B=1, H=8, D=64, float32, the same Python function given to both libraries as score_mod:
  softcap    30 * tanh(score / 30)                          (hand-written; built-in twin softcap)
  alibi      score - slopes[h] * (q_idx - kv_idx)            (a captured [H] tensor; twin alibi)
  rel_bias   score + table[h, q_idx - kv_idx + L - 1]        (a learned [H, 2L-1] tensor that
                                                              requires grad; twin rel_bias)
with a causal mask, or a causal sliding window of 256. Per case, in one process at the same
thread count, after a warm-up call each (which traces flexc's mod and compiles PyTorch's), the
sides are called in turn and times are medians:

  forward:            flexc.torch.flex_attention(score_mod=fn)  vs  torch.compile(flex_attention)
                      with the same fn and PyTorch's block mask (the issue's target: >= 3x);
  forward+backward:   flexc (q, k, v and the captured tensor's gradients) vs dense attention with
                      the mod applied in PyTorch eager (scores materialised, masked, softmax) --
                      compiled flex_attention has no CPU backward -- and vs flexc's built-in twin.

One JSON object per case and direction, then a summary. Imports python/ of this tree with
FLEXC_LIBRARY=build/libflexc.so (or the installed package). Skips (exit 0) without torch.
"""
import argparse
import json
import os
import sys
import warnings

try:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError as e:
    print(json.dumps({"case": "mods_vs_torch", "skipped": f"{e.name} is not installed"}))
    sys.exit(0)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import flexc  # noqa: E402
import flexc.torch as ft  # noqa: E402
from attention_vs_torch import first_line, rotate  # noqa: E402

B, H, D = 1, 8, 64


def mods(L):
    """name -> (score_mod, captured tensors, flexc's built-in twin)."""
    slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / H) for i in range(H)])
    table = (0.02 * torch.randn(H, 2 * L - 1, generator=torch.Generator().manual_seed(1))).requires_grad_()

    def softcap(score, b, h, q_idx, kv_idx):
        return 30.0 * torch.tanh(score / 30.0)

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx)

    def rel_bias(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx - kv_idx + L - 1]

    return {"softcap": (softcap, [], ft.softcap(30.0)),
            "alibi": (alibi, [], ft.alibi(slopes)),
            "rel_bias": (rel_bias, [table], ft.rel_bias(table, L - 1))}


def masks(name):
    if name == "causal":
        return lambda b, h, q, kv: q >= kv
    if name == "sliding256":
        return lambda b, h, q, kv: (q >= kv) & (q - kv < 256)
    raise SystemExit(f"unknown mask {name}")


def dense(q, k, v, score_mod, mask_mod):
    """Attention with the mod applied in PyTorch eager: [L, L] scores per head, masked, softmax."""
    L = q.shape[2]
    s = (q @ k.transpose(-1, -2)) / D ** 0.5
    b = torch.zeros(1, 1, 1, 1, dtype=torch.long)
    h = torch.arange(H).view(1, H, 1, 1)
    qi = torch.arange(L).view(1, 1, L, 1)
    kv = torch.arange(L).view(1, 1, 1, L)
    s = score_mod(s, b, h, qi, kv)
    s = s.masked_fill(~mask_mod(b, h, qi, kv), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def compare(fns, out, reps, peers, check=None):
    """Warms each side up (a side that fails is reported with its error), times them in turn
    (attention_vs_torch's rotate: medians), and adds each peer's time / flexc's to out.
    check(fns) may add a comparison of the results first."""
    for n in list(fns):
        try:
            fns[n]()
        except Exception as e:  # noqa: BLE001 - e.g. no CPU backward for a peer
            out[f"{n}_unsupported"] = first_line(e)
            del fns[n]
    if check:
        check(fns)
    med = {n: sec for n, (sec, _) in rotate(fns, reps).items()}
    for n, sec in med.items():
        out[f"{n}_s"] = round(sec, 4)
    for peer in peers:
        if peer in med and "flexc" in med:
            out[f"ratio_{peer}_over_flexc"] = round(med[peer] / med["flexc"], 3)
    print(json.dumps(out), flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--L", type=int, default=8192)
    ap.add_argument("--mod", action="append", choices=["softcap", "alibi", "rel_bias"])
    ap.add_argument("--mask", action="append", choices=["causal", "sliding256"])
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--no-dense", action="store_true", help="leave out the dense eager peer (the slowest)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    flexc.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message="_compile flag on create_block_mask")
    L = args.L
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g) for _ in range(3))
    dout = torch.randn(B, H, L, D, generator=g)
    all_mods = mods(L)
    summary = []
    for mask_name in args.mask or ["causal", "sliding256"]:
        mask_mod = masks(mask_name)
        fmask = ft.create_block_mask(mask_mod, None, None, L, L)
        tmask = create_block_mask(mask_mod, None, None, L, L, device="cpu", _compile=True)
        for mod_name in args.mod or ["softcap", "alibi", "rel_bias"]:
            fn, captured, twin = all_mods[mod_name]
            torch._dynamo.reset()
            compiled = torch.compile(flex_attention, dynamic=False)
            base = dict(case="mods_vs_torch", mod=mod_name, mask=mask_name, L=L, B=B, H=H, D=D,
                        threads=args.threads, reps=args.reps, torch_version=torch.__version__)
            # forward
            with torch.no_grad():
                fns = {"flexc": lambda: ft.flex_attention(q, k, v, score_mod=fn, block_mask=fmask),
                       "flexc_builtin": lambda: ft.flex_attention(q, k, v, score_mod=twin, block_mask=fmask),
                       "torch_compiled_flex": lambda: compiled(q, k, v, score_mod=fn, block_mask=tmask)}
                out = dict(direction="forward", **base)

                def check(fns):
                    if "torch_compiled_flex" in fns:
                        out["max_abs_diff_vs_torch"] = (fns["flexc"]() - fns["torch_compiled_flex"]()).abs().max().item()
                summary.append(compare(fns, out, args.reps, ("torch_compiled_flex", "flexc_builtin"), check))
            if args.no_backward:
                continue
            # forward + backward
            x, y, z = (t.clone().requires_grad_() for t in (q, k, v))

            def fb(f):
                def run():
                    x.grad = y.grad = z.grad = None
                    for t in captured:
                        t.grad = None
                    f().backward(dout)
                return run
            fns = {"flexc": fb(lambda: ft.flex_attention(x, y, z, score_mod=fn, block_mask=fmask)),
                   "flexc_builtin": fb(lambda: ft.flex_attention(x, y, z, score_mod=twin, block_mask=fmask))}
            if not args.no_dense:
                fns["dense_eager"] = fb(lambda: dense(x, y, z, fn, mask_mod))
            out = dict(direction="forward+backward", **base)
            summary.append(compare(fns, out, args.reps, ("dense_eager", "flexc_builtin")))
    print(f"summary (L={L}, threads {args.threads}, medians of {args.reps}; ratio = peer time / flexc time):")
    for o in summary:
        parts = [f"{p} {o['ratio_' + p + '_over_flexc']:.2f}x" for p in ("torch_compiled_flex", "dense_eager",
                                                                         "flexc_builtin")
                 if "ratio_" + p + "_over_flexc" in o]
        parts += [f"{p} cannot run ({o[p + '_unsupported']})" for p in ("torch_compiled_flex", "dense_eager")
                  if p + "_unsupported" in o]
        print(f"  {o['mod']:8s} {o['mask']:10s} {o['direction']:16s} flexc {o.get('flexc_s', float('nan')):.3f} s; "
              + "; ".join(parts))


if __name__ == "__main__":
    main()
