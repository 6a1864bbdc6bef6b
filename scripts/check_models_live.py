#!/usr/bin/env python3
"""Re-runs the Hugging Face model comparisons live against transformers (when installed).

    python3 scripts/check_models_live.py [--build build]

For each fixture model in tests/fixtures/models (see scripts/fixtures_models.py):
  1. transformers, float32, eager attention: the prompt logits again, compared with the committed
     reference (a change here means the library moved, not flexc);
  2. the directories flexc's exporter writes (tests/test_hf with FLEXC_HF_KEEP_EXPORTS: the
     configuration generated from the parsed config, the weights written back in the source
     dtype) loaded by transformers: the same logits as the reference;
  3. when `flexc generate` reads Hugging Face directories: `--json` greedy ids and the prompt's
     ids against the reference, at every step where the reference's top-2 margin exceeds the
     logit tolerance.
Exits non-zero on any mismatch. Needs torch, transformers and safetensors; no network.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FIX = os.path.join(ROOT, "tests", "fixtures", "models")
NAMES = ["llama3_tied", "llama_bf16", "mistral_f16", "qwen2_bias"]
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


@torch.no_grad()
def logits(model_dir, ids):
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    m.eval()
    return m(torch.tensor([ids])).logits[0].float()


def rel_err(got, ref):
    return float((got - ref).abs().max() / ref.abs().max())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    args = ap.parse_args()
    refs = {n: load_file(os.path.join(FIX, n + ".ref.safetensors")) for n in NAMES}

    for n in NAMES:
        ids = refs[n]["prompt0.ids"].tolist()
        e = rel_err(logits(os.path.join(FIX, n), ids), refs[n]["prompt0.logits"])
        check(e <= 1e-5, f"{n}: transformers reproduces the committed logits (max error {e:.2e} of scale)")

    test_hf = os.path.join(args.build, "test_hf")
    if os.path.exists(test_hf):
        with tempfile.TemporaryDirectory() as keep:
            env = dict(os.environ, FLEXC_HF_KEEP_EXPORTS=keep, FLEXC_SOURCE_DIR=ROOT)
            r = subprocess.run([test_hf, "test_export_roundtrip"], env=env, capture_output=True, text=True)
            check(r.returncode == 0, "test_hf test_export_roundtrip wrote the exports")
            for n in NAMES:
                out = os.path.join(keep, n)
                if not os.path.isdir(out):
                    continue
                ids = refs[n]["prompt0.ids"].tolist()
                e = rel_err(logits(out, ids), refs[n]["prompt0.logits"])
                check(e == 0.0, f"{n}: transformers loads flexc's export, logits equal the reference (max error {e:.2e})")
    else:
        print(f"skip  exports: {test_hf} is not built")

    flexc = os.path.join(args.build, "flexc")
    for n in NAMES:
        ref = refs[n]
        meta = json.load(open(os.path.join(FIX, n + ".ref.json")))
        r = subprocess.run([flexc, "generate", "--model", os.path.join(FIX, n), "--prompt", meta["prompts"][0],
                            "--tokens", str(len(ref["greedy.ids"])), "--temperature", "0", "--json"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"skip  {n}: flexc generate --model does not read it ({r.stderr.strip()[:120]})")
            continue
        out = json.loads(r.stdout.strip().splitlines()[-1])
        check(out["prompt_ids"] == ref["prompt0.ids"].tolist(), f"{n}: flexc's prompt ids equal the tokenizer's")
        tol = 1e-4 * float(ref["prompt0.logits"].abs().max())
        for s, (got, want, margin) in enumerate(zip(out["ids"], ref["greedy.ids"].tolist(),
                                                     ref["greedy.margin"].tolist())):
            if margin <= tol:
                break  # a near tie: both continuations are right, and they may differ from here on
            check(got == want, f"{n}: greedy step {s}: flexc {got}, transformers {want} (margin {margin:.3g})")
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
