#!/usr/bin/env python3
"""flexc's LoRA runs as PEFT and transformers read them (CTest lora_peft_interop).

    python3 tests/lora_peft_interop.py FLEXC LIBFLEXC

On a tiny model fixture (tests/fixtures/models/llama_bf16: BF16 weights, GQA, head_dim !=
dim / heads), with dropout: `flexc train --lora` for a few steps, then
  - `flexc export --to DIR` is a PEFT adapter: PeftModel.from_pretrained(base, DIR) gives the
    logits flexc gives for the run (fx_model_load + fx_model_forward through libflexc) within
    1e-4, relative to the logits' spread;
  - `flexc export --merge --dtype f32` is a whole model transformers loads, with the same logits.
Exits 77 (CTest's skip), saying why, when torch, transformers or peft cannot be imported.
"""
import ctypes
import os
import subprocess
import sys
import tempfile

try:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
except ImportError as e:
    print(f"lora_peft_interop: skipped: {e}")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = os.path.join(HERE, "fixtures", "models", "llama_bf16")


def flexc_logits(lib, path, ids):
    """Logits [T, V] of the model at path through the C library."""
    m = ctypes.c_void_p()
    lib.fx_model_load.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
    lib.fx_model_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    lib.fx_model_free.argtypes = [ctypes.c_void_p]
    lib.fx_last_error.restype = ctypes.c_char_p
    if lib.fx_model_load(ctypes.byref(m), path.encode()) != 0:
        raise RuntimeError(f"fx_model_load {path}: {lib.fx_last_error().decode()}")
    tok = torch.tensor(ids, dtype=torch.int32)
    V = AutoModelForCausalLM.from_pretrained(BASE).config.vocab_size
    out = torch.empty(len(ids), V, dtype=torch.float32)
    rc = lib.fx_model_forward(m, None, out.data_ptr(), tok.data_ptr(), None, 1, len(ids), 0)
    lib.fx_model_free(m)
    if rc != 0:
        raise RuntimeError(f"fx_model_forward: {lib.fx_last_error().decode()}")
    return out


def check(what, got, want):
    err = (got.double() - want.double()).abs().max().item()
    spread = want.double().abs().max().item()
    print(f"{what}: max |difference| {err:.3g} (logits up to {spread:.3g})")
    if not err <= 1e-4 * max(spread, 1.0):
        print(f"FAIL: {what}")
        sys.exit(1)


def main():
    flexc, lib = sys.argv[1], ctypes.CDLL(sys.argv[2])
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="flexc-peft-") as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w") as f:
            for i in range(200):
                f.write(f"The fortune {i} you seek is in cookie {i % 13}, and the cookie is in jar {i % 5}.\n")
        run, adapter, merged = (os.path.join(tmp, d) for d in ("run", "adapter", "merged"))
        subprocess.run([flexc, "train", "--model", BASE, "--lora", "4", "--lora-alpha", "16", "--lora-dropout",
                        "0.1", "--data", corpus, "--steps", "6", "--batch", "2", "--seq", "32", "--lr", "1e-2",
                        "--out", run, "--quiet"], check=True)
        subprocess.run([flexc, "export", "--ckpt", run, "--to", adapter], check=True)
        subprocess.run([flexc, "export", "--ckpt", run, "--to", merged, "--merge", "--dtype", "f32"], check=True)
        ids = [5 + (i * 37) % 400 for i in range(24)]
        ours = flexc_logits(lib, run, ids)

        base = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32, attn_implementation="eager")
        plain = base(torch.tensor([ids])).logits[0].detach()
        peft = PeftModel.from_pretrained(base, adapter).eval()
        with torch.no_grad():
            theirs = peft(torch.tensor([ids])).logits[0]
        moved = (theirs - plain).abs().max().item()
        print(f"the adapters move the logits by up to {moved:.3g}")
        if moved < 1e-3:
            print("FAIL: the trained adapters change nothing")
            sys.exit(1)
        check("PEFT on flexc's adapter vs flexc", theirs, ours)
        whole = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32, attn_implementation="eager")
        with torch.no_grad():
            check("transformers on flexc's merged model vs flexc", whole(torch.tensor([ids])).logits[0], ours)
    print("ok")


if __name__ == "__main__":
    main()
