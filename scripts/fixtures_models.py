#!/usr/bin/env python3
"""Tiny Hugging Face Llama-family models and their float32 reference outputs, for the C tests.

    python3 scripts/fixtures_models.py [--out tests/fixtures/models]

Needs torch, transformers, tokenizers and safetensors (pip). Writes, for each model NAME:

  NAME/                       a model directory as transformers writes it: config.json,
                              generation_config.json, tokenizer.json, tokenizer_config.json,
                              model.safetensors (or shards + model.safetensors.index.json)
  NAME.ref.safetensors        reference tensors, float32 / int64 (see below)
  NAME.ref.json               what the tensors mean: prompts, the step's tensor names, tolerances

Reference tensors (all computed by transformers in float32, eager attention, from the directory
as written, i.e. BF16 / F16 weights widened to float32):
  prompt{i}.ids      I64 [T]        the prompt's token ids (no special tokens)
  prompt{i}.logits   F32 [T, V]     logits at every position of the prompt
  greedy.ids         I64 [G]        greedy continuation of prompt 0 (full recompute per step)
  greedy.margin      F32 [G]        top-1 minus top-2 logit at each greedy step
  train.x, train.y   I64 [B, T]     a fixed batch (y is x shifted by one)
  train.loss         F32 [1]        mean cross-entropy of the batch
  train.grad_norm    F32 [1]        L2 norm of all gradients together
  train.grad_norms   F32 [P]        L2 norm per parameter, in the order of ref.json "grad_names"
                                    (Hugging Face names; a tied embedding appears once)

The variants covered (one model each):
  llama3_tied   LlamaForCausalLM, rope_theta + rope_scaling {rope_type: llama3} (the older
                spelling), GQA 4/2, tied embeddings, F32 weights, eos_token_id an int
  llama_bf16    LlamaForCausalLM, rope_parameters (as transformers 5 writes it), head_dim 32
                != hidden/heads, untied, BF16 weights, sharded with an index, eos a list
  mistral_f16   MistralForCausalLM, sliding_window 8 (shorter than the prompts), GQA 4/1,
                F16 weights
  qwen2_bias    Qwen2ForCausalLM, q/k/v biases, untied, F32 weights, eos a list

Random weights come from a fixed seed; rerunning gives the same files on the same library
versions (the references, not the models, may move in the last bits across torch versions).
"""
import argparse
import glob
import json
import os
import shutil

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (AutoModelForCausalLM, LlamaConfig, MistralConfig, PreTrainedTokenizerFast,
                          Qwen2Config)

VOCAB = 512
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]  # ids 0, 1, 2
PROMPTS = [
    "The fortune you seek is in another cookie, and the cookie is in another jar.",
    "Computers are useless. They can only give you answers.",
]
GREEDY = 8
TRAIN_B, TRAIN_T = 2, 24


def fortunes_text(limit=400_000):
    """The fortunes corpus (Debian's fortunes-min/fortunes), fixed order, first `limit` bytes."""
    parts = []
    for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if "." in os.path.basename(path) or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            parts.append(f.read())
    text = "".join(parts)
    if len(text) < 10_000:
        raise SystemExit("the fortunes corpus is missing: apt-get install fortunes-min")
    return text[:limit]


def train_tokenizer(text):
    """A byte-level BPE (GPT-2 / Llama-3 style) of VOCAB tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    docs = text.split("\n%\n")
    tok.train_from_iterator(docs, trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return tok


def variants():
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=64, rms_norm_eps=1e-5,
                  bos_token_id=0)
    return [
        dict(name="llama3_tied", seed=1, dtype=torch.float32, shards=1, eos=1, old_rope=True,
             config=LlamaConfig(**common, num_key_value_heads=2, tie_word_embeddings=True,
                                eos_token_id=1,
                                rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0,
                                                 "factor": 4.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0,
                                                 "original_max_position_embeddings": 16})),
        dict(name="llama_bf16", seed=2, dtype=torch.bfloat16, shards=2, eos=[1, 2], old_rope=False,
             config=LlamaConfig(**common, num_key_value_heads=2, head_dim=32,
                                tie_word_embeddings=False, eos_token_id=[1, 2],
                                rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
        dict(name="mistral_f16", seed=3, dtype=torch.float16, shards=1, eos=1, old_rope=False,
             config=MistralConfig(**common, num_key_value_heads=1, sliding_window=8,
                                  tie_word_embeddings=False, eos_token_id=1,
                                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        dict(name="qwen2_bias", seed=4, dtype=torch.float32, shards=1, eos=[1, 2], old_rope=False,
             config=Qwen2Config(**common, num_key_value_heads=2, tie_word_embeddings=False,
                                use_sliding_window=False, eos_token_id=[1, 2],
                                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    ]


def save_weights(model, out, dtype, shards):
    sd = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    names = sorted(sd)
    meta = {"format": "pt"}
    if shards == 1:
        save_file(sd, os.path.join(out, "model.safetensors"), metadata=meta)
        return
    per = (len(names) + shards - 1) // shards
    weight_map, total = {}, 0
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: sd[k] for k in names[s * per:(s + 1) * per]}
        save_file(part, os.path.join(out, fname), metadata=meta)
        for k, v in part.items():
            weight_map[k] = fname
            total += v.numel() * v.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")


def old_rope_spelling(path):
    """Rewrites config.json's rope_parameters as rope_theta + rope_scaling (older transformers)."""
    with open(path) as f:
        cfg = json.load(f)
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp.pop("rope_theta")
    cfg["rope_scaling"] = rp
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


@torch.no_grad()
def logits_of(model, ids):
    return model(torch.tensor([ids])).logits[0].float()


def build(v, tok_fast, corpus_ids, outdir):
    name = v["name"]
    out = os.path.join(outdir, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    torch.manual_seed(v["seed"])
    cfg = v["config"]
    cfg.initializer_range = 0.2  # larger than the default so that the logits are not flat
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif n.endswith(".bias"):
                p.copy_(0.5 * torch.randn_like(p))
    model.config.architectures = [type(model).__name__]
    model.config.dtype = v["dtype"]  # as transformers records the dtype a model was saved in
    model.config.save_pretrained(out)
    model.generation_config.eos_token_id = v["eos"]
    model.generation_config.bos_token_id = 0
    model.generation_config.save_pretrained(out)
    save_weights(model, out, v["dtype"], v["shards"])
    tok_fast.save_pretrained(out)
    if v["old_rope"]:
        old_rope_spelling(os.path.join(out, "config.json"))
    for junk in ("chat_template.jinja", "special_tokens_map.json"):
        if os.path.exists(os.path.join(out, junk)):
            os.remove(os.path.join(out, junk))

    # The reference: the directory as written, read back by transformers in float32.
    ref = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    ref.eval()
    tensors, meta = {}, {"model": name, "prompts": PROMPTS, "vocab": VOCAB}
    for i, p in enumerate(PROMPTS):
        ids = tok_fast(p, add_special_tokens=False)["input_ids"]
        tensors[f"prompt{i}.ids"] = torch.tensor(ids, dtype=torch.int64)
        tensors[f"prompt{i}.logits"] = logits_of(ref, ids).contiguous()
    ids = list(tensors["prompt0.ids"].tolist())
    gen, margin = [], []
    for _ in range(GREEDY):
        last = logits_of(ref, ids)[-1]
        top = torch.topk(last, 2)
        gen.append(int(top.indices[0]))
        margin.append(float(top.values[0] - top.values[1]))
        ids.append(gen[-1])
    tensors["greedy.ids"] = torch.tensor(gen, dtype=torch.int64)
    tensors["greedy.margin"] = torch.tensor(margin, dtype=torch.float32)

    # One training step's loss and gradients on a fixed batch from the corpus.
    start = 1000 + 97 * v["seed"]
    seq = torch.tensor(corpus_ids[start:start + TRAIN_B * TRAIN_T + 1], dtype=torch.int64)
    x = torch.stack([seq[b * TRAIN_T:(b + 1) * TRAIN_T] for b in range(TRAIN_B)])
    y = torch.stack([seq[b * TRAIN_T + 1:(b + 1) * TRAIN_T + 1] for b in range(TRAIN_B)])
    ref.train()
    ref.zero_grad()
    logits = ref(x).logits.float()
    loss = torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), y.view(-1))
    loss.backward()
    names, norms = [], []
    for n, p in ref.named_parameters():
        names.append(n)
        norms.append(float(p.grad.double().norm()))
    tensors["train.x"], tensors["train.y"] = x, y
    tensors["train.loss"] = torch.tensor([loss.item()], dtype=torch.float32)
    tensors["train.grad_norm"] = torch.tensor([sum(n * n for n in norms) ** 0.5], dtype=torch.float32)
    tensors["train.grad_norms"] = torch.tensor(norms, dtype=torch.float32)
    meta["grad_names"] = names
    meta["greedy_from"] = "prompt0"
    meta["dtype"] = str(v["dtype"]).replace("torch.", "")
    save_file(tensors, os.path.join(outdir, name + ".ref.safetensors"))
    with open(os.path.join(outdir, name + ".ref.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(f"{name}: {sum(p.numel() for p in ref.parameters())} parameters, loss {loss.item():.4f}, "
          f"greedy {gen}, smallest margin {min(margin):.3g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "models"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    text = fortunes_text()
    tok = train_tokenizer(text)
    tok_fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIALS[0], eos_token=SPECIALS[1])
    corpus_ids = tok.encode(text[:20_000]).ids
    for v in variants():
        build(v, tok_fast, corpus_ids, args.out)


if __name__ == "__main__":
    main()
