#!/usr/bin/env python3
"""How far `--dtype bf16` training ends from float32: `make run`'s configuration, several seeds.

For each seed, `flexc train` runs `make run`'s configuration (`small`, B=4, T=256, lr 2e-3,
warmup 15, 500 steps) once with `--dtype f32` and once with `--dtype bf16`, the two side by
side (one thread each, so they share the machine alike). Each run's own validation loss (the
4 batches `flexc train` evaluates) is read from its metrics.jsonl; then both models are
exported (`flexc export`) and evaluated by `transformers` on a larger held-out set: NWIN
windows of 256 tokens spread evenly over the last 5% of the corpus (the fortunes files in
name order, each fortune a document, byte tokens with end-of-text 256 between documents).

With `--torch`, the same comparison for PyTorch: the model of bench/train_vs_torch.py
trained on the same corpus with the same schedule (its own sampling), once in float32 and
once with every linear layer's products taken on bfloat16-rounded inputs (weights,
activations and, in the backward pass, the output gradient; float32 results), which is
what `--dtype bf16` does. It tells whether a gap belongs to bfloat16 rounding in general
or to flexc's implementation of it.

Prints one JSON object per run, then a summary: per seed the two losses and the gap
(bf16 / f32 - 1), on each measure.

    python3 bench/bf16_loss_gap.py [--flexc build/flexc] [--seeds 1337,7,2] [--steps 500]
                                   [--windows 256] [--torch] [--out DIR]

Needs transformers and torch for the held-out evaluation (skips it, exit 0, without them).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

CORPUS = "/usr/share/games/fortunes"
TRAIN = ["--model", "small", "--batch", "4", "--seq", "256", "--lr", "2e-3", "--warmup", "15", "--eval-every", "50",
         "--log-every", "50", "--threads", "1"]
T = 256


def corpus_tokens():
    """The corpus as byte tokens, end-of-text (256) after each fortune."""
    toks = []
    for name in sorted(os.listdir(CORPUS)):
        path = os.path.join(CORPUS, name)
        if "." in name or not os.path.isfile(path) or os.path.islink(path):
            continue
        with open(path, "rb") as f:
            for doc in f.read().split(b"\n%\n"):
                if doc.strip():
                    toks.extend(doc)
                    toks.append(256)
    return toks


def last_val_loss(run_dir):
    val = None
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if "val_loss" in rec:
                val = (rec["step"], rec["val_loss"])
    return val


def run_flexc(flexc, seeds, steps, out):
    procs = []
    for seed in seeds:
        for dtype in ("f32", "bf16"):
            d = os.path.join(out, f"seed{seed}_{dtype}")
            cmd = [flexc, "train", *TRAIN, "--steps", str(steps), "--seed", str(seed), "--dtype", dtype, "--out", d,
                   "--force"]
            log = open(d + ".log", "w")
            procs.append((seed, dtype, d, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log))
        for seed_, dtype, d, p, log in procs[-2:]:  # two at a time: one per core
            if p.wait() != 0:
                sys.exit(f"flexc train failed, see {d}.log")
            log.close()
    return [(seed, dtype, d) for seed, dtype, d, _, _ in procs]


def heldout_loss(hf_dir, windows, val):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    starts = torch.linspace(0, len(val) - T - 2, windows).long().tolist()
    total = 0.0
    with torch.no_grad():
        for i in range(0, windows, 8):
            w = torch.stack([val[s:s + T + 1] for s in starts[i:i + 8]])
            logits = model(w[:, :-1]).logits
            total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                                                       reduction="sum").item()
    return total / (windows * T)


def torch_run(seed, bf16, steps, val_windows, data):
    """The PyTorch twin trained in float32 or with bfloat16-rounded products; its held-out loss."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import train_vs_torch as tv

    def rnd(t):
        return t.to(torch.bfloat16).to(torch.float32)

    class Bf16Linear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            xr, wr = rnd(x), rnd(w)
            ctx.save_for_backward(xr, wr)
            return xr @ wr.t()

        @staticmethod
        def backward(ctx, dy):
            xr, wr = ctx.saved_tensors
            dyr = rnd(dy)
            return dyr @ wr, dyr.reshape(-1, dyr.shape[-1]).t() @ xr.reshape(-1, xr.shape[-1])

    linear, linear_forward = F.linear, torch.nn.Linear.forward
    if bf16:
        F.linear = lambda x, w, b=None: Bf16Linear.apply(x, w) if b is None else Bf16Linear.apply(x, w) + b
        torch.nn.Linear.forward = lambda self, x: F.linear(x, self.weight, self.bias)
    try:
        torch.manual_seed(seed)
        s = tv.SHAPES["small"]
        model = tv.GPT(ctx=T, **s)
        decay = [p for p in model.parameters() if p.ndim >= 2]
        rest = [p for p in model.parameters() if p.ndim < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                lr=2e-3, betas=(0.9, 0.95), eps=1e-8)
        train = data[:-len(data) // 20]
        g = torch.Generator().manual_seed(seed)
        params = list(model.parameters())
        for t in range(1, steps + 1):
            lr = 2e-3 * t / 15 if t <= 15 else 2e-4 + 0.9e-3 * (1 + math.cos(math.pi * (t - 15) / (steps - 15)))
            for group in opt.param_groups:
                group["lr"] = lr
            idx = torch.randint(0, len(train) - T - 1, (4,), generator=g).tolist()
            w = torch.stack([train[i:i + T + 1] for i in idx])
            model(w[:, :-1], w[:, 1:]).backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        starts = torch.linspace(0, len(val_windows) - T - 2, 256).long().tolist()
        with torch.no_grad():
            total = sum(model(torch.stack([val_windows[s:s + T + 1] for s in starts[i:i + 8]])[:, :-1],
                              torch.stack([val_windows[s:s + T + 1] for s in starts[i:i + 8]])[:, 1:]).item()
                        for i in range(0, 256, 8))
        return total / 32
    finally:
        F.linear, torch.nn.Linear.forward = linear, linear_forward


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flexc", default="build/flexc")
    ap.add_argument("--seeds", default="1337,7,2")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--windows", type=int, default=256)
    ap.add_argument("--torch", action="store_true")
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temporary directory)")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    tmp = None if a.out else tempfile.TemporaryDirectory(prefix="flexc-bf16-gap-")
    out = a.out or tmp.name
    os.makedirs(out, exist_ok=True)

    runs = run_flexc(a.flexc, seeds, a.steps, out)
    try:
        import torch  # noqa: F401  (the held-out evaluation)
        import transformers  # noqa: F401
        have_hf = True
    except ImportError:
        have_hf = False
    val = None
    if have_hf:
        import torch
        data = torch.tensor(corpus_tokens(), dtype=torch.long)
        val = data[-len(data) // 20:]
    res = {}
    for seed, dtype, d in runs:
        step, own = last_val_loss(d)
        rec = {"seed": seed, "dtype": dtype, "step": step, "val_loss": own}
        if have_hf:
            hf = d + "_hf"
            subprocess.run([a.flexc, "export", "--ckpt", d, "--to", hf], check=True, stdout=subprocess.DEVNULL)
            rec["heldout_loss"] = heldout_loss(hf, a.windows, val)
        print(json.dumps(rec), flush=True)
        res[(seed, dtype)] = rec
    if a.torch and have_hf:
        for seed in seeds:
            for bf16 in (False, True):
                loss = torch_run(seed, bf16, a.steps, val, data)
                rec = {"seed": seed, "dtype": "bf16" if bf16 else "f32", "torch": True, "heldout_loss": loss}
                print(json.dumps(rec), flush=True)
                res[(seed, "torch-" + rec["dtype"])] = rec
    print("summary: gap = bf16 / f32 - 1")
    for seed in seeds:
        f, b = res[(seed, "f32")], res[(seed, "bf16")]
        line = f"  seed {seed}: flexc own validation {b['val_loss'] / f['val_loss'] - 1:+.2%}"
        if have_hf:
            line += f", held-out {b['heldout_loss'] / f['heldout_loss'] - 1:+.2%}"
        if (seed, "torch-f32") in res:
            tf, tb = res[(seed, "torch-f32")]["heldout_loss"], res[(seed, "torch-bf16")]["heldout_loss"]
            line += f"; PyTorch twin held-out {tb / tf - 1:+.2%}"
        print(line)
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
