#!/usr/bin/env python3
"""PEFT LoRA adapters on the tiny model fixtures, and PEFT's logits through them, for the C tests.

    python3 scripts/make_lora_fixtures.py [--out tests/fixtures/lora]

Needs torch, transformers, peft and safetensors (pip), and the model fixtures of
scripts/fixtures_models.py (tests/fixtures/models). Writes, for each model NAME below:

  NAME/                     a PEFT adapter directory as PeftModel.save_pretrained writes it:
                            adapter_config.json (base_model_name_or_path relative to it:
                            ../../models/NAME) and adapter_model.safetensors
  NAME.ref.safetensors      tokens I64 [T] (prompt 0 of the model's reference) and logits
                            F32 [T, V]: PEFT's forward, float32, adapters unmerged

The adapters are not PEFT's fresh ones (B = 0 would test nothing): A and B are drawn from a
fixed seed with a scale that moves the logits by about as much as the base's spread. Each
fixture adapts another subset of the projections, with its own rank and alpha.
"""
import argparse
import json
import os
import shutil

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "tests", "fixtures", "models")

# name: (rank, alpha, targets)
VARIANTS = {
    "llama_bf16": (4, 8.0, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "qwen2_bias": (3, 12.0, ["k_proj", "o_proj", "up_proj"]),
}


def make(name, outdir):
    rank, alpha, targets = VARIANTS[name]
    base_dir = os.path.join(MODELS, name)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
    cfg = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none",
                     task_type="CAUSAL_LM")
    model = get_peft_model(base, cfg)
    gen = torch.Generator().manual_seed(1234 + rank)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.5 / p.shape[1] ** 0.5))
    model.eval()
    out = os.path.join(outdir, name)
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    # The base as a path relative to the adapter, so that the fixtures move with the tree.
    path = os.path.join(out, "adapter_config.json")
    with open(path) as f:
        ac = json.load(f)
    ac["base_model_name_or_path"] = os.path.join("..", "..", "models", name)
    with open(path, "w") as f:
        json.dump(ac, f, indent=2, sort_keys=True)
        f.write("\n")
    for junk in ("README.md",):
        if os.path.exists(os.path.join(out, junk)):
            os.remove(os.path.join(out, junk))

    # PEFT's logits, reading the directory back as a user would.
    fresh = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
    peft = PeftModel.from_pretrained(fresh, out)
    peft.eval()
    ids = load_file(os.path.join(MODELS, name + ".ref.safetensors"))["prompt0.ids"]
    with torch.no_grad():
        logits = peft(ids[None]).logits[0].float().contiguous()
        with peft.disable_adapter():
            plain = peft(ids[None]).logits[0]
    save_file({"tokens": ids.to(torch.int64), "logits": logits}, os.path.join(outdir, name + ".ref.safetensors"))
    moved = (logits - plain).abs().max().item()
    print(f"{name}: rank {rank}, alpha {alpha}, {len(targets)} targets, logits {tuple(logits.shape)}, "
          f"max |adapted - base| {moved:.3g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "..", "tests", "fixtures", "lora"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    for name in VARIANTS:
        make(name, args.out)


if __name__ == "__main__":
    main()
