#!/usr/bin/env python3
"""A LoRA training step: flexc train --lora against PEFT + transformers, same model, CPU, threads.

    python3 bench/lora_vs_peft.py --flexc build/flexc [--model DIR] [--threads N] [--steps 6]
                                  [--batch 4] [--seq 512] [--rank 16] [--rounds 3] [--bf16] [--full]

The model: --model DIR (a Hugging Face Llama-family directory), else one made here with
SmolLM2-135M's shape (30 layers, dim 576, 9/3 heads, ffn 1536, vocab 49152, tied embeddings;
134.5M parameters) and random weights saved in BF16, as that model ships. Both train LoRA of
rank r, alpha 2r, on all seven projections (q, k, v, o, gate, up, down), AdamW, batch x seq
tokens a step, from the same token file (random ids):

  flexc   `flexc train --model DIR --lora r`: the base mapped in its file's dtype (BF16 widened
          as the float32 GEMM packs it), float32 adapters, the fused linear + cross-entropy;
  peer    PEFT's get_peft_model over transformers' AutoModelForCausalLM in float32, sdpa
          attention, torch.optim.AdamW over the adapters; with --bf16 also the same under
          torch.autocast("cpu", bfloat16) over the base loaded in its file's dtype (BF16: the
          base's products in bfloat16, the adapters float32; the peer of flexc's --dtype bf16,
          and the faster of the two forms: a float32 base under autocast is recast every step).

Each runs in its own process, the sides in turn for --rounds rounds (default 3). A side's
tokens/s is the median over the steps after the first, and over the rounds; each ratio is the
median of the rounds' ratios (a round's sides run next to each other); the peak is the
process's peak resident set (ru_maxrss from wait4: everything the process held, the
interpreter and PyTorch included for the peer, the mapped file's resident pages for flexc),
the largest of the rounds. --full also runs flexc's full fine-tuning at the same batch and
sequence, for the memory ratio. The last line is the summary as one JSON object.
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time


def make_model(path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                      rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1,
                      eos_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def make_tokens(path, n, vocab):
    """An llm.c token file (magic 20240520, uint16 ids)."""
    import random
    rnd = random.Random(0)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *(rnd.randrange(vocab) for _ in range(n))))


def run_measured(cmd, env=None):
    """Runs cmd; returns (stdout, peak resident bytes of that process)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({p.returncode})")
    return out.decode(), ru.ru_maxrss * 1024


def run_flexc(args, model, tokens, lora, extra=()):
    with tempfile.TemporaryDirectory(prefix="flexc-lora-bench-") as out:
        cmd = [args.flexc, "train", "--model", model, "--data", tokens, "--steps", str(args.steps), "--batch",
               str(args.batch), "--seq", str(args.seq), "--threads", str(args.threads), "--out", out,
               "--eval-every", "0", "--eval-batches", "1", "--quiet"]
        if lora:
            cmd += ["--lora", str(args.rank)]
        cmd += list(extra)
        _, peak = run_measured(cmd)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            steps = [json.loads(line) for line in f]
    return statistics.median(s["tokens_per_s"] for s in steps[1:]), peak, steps[-1]["loss"]


def peer(args):
    """The PEFT side, in its own process: prints its tokens/s as JSON."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    # Under autocast the base is loaded in its file's dtype, as flexc maps it (module docstring).
    base = AutoModelForCausalLM.from_pretrained(args.model, dtype="auto" if args.autocast else torch.float32,
                                                attn_implementation="sdpa")
    cfg = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = get_peft_model(base, cfg)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.1)
    with open(args.tokens, "rb") as f:
        f.seek(1024)
        ids = torch.frombuffer(bytearray(f.read()), dtype=torch.int16).to(torch.int64) & 0xFFFF
    gen = torch.Generator().manual_seed(0)
    times, loss = [], None
    for _ in range(args.steps):
        off = torch.randint(0, ids.numel() - args.seq - 1, (args.batch,), generator=gen)
        x = torch.stack([ids[o:o + args.seq] for o in off])
        y = torch.stack([ids[o + 1:o + args.seq + 1] for o in off])
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast):
            loss = model(input_ids=x, labels=None).logits
        loss = torch.nn.functional.cross_entropy(loss.view(-1, loss.shape[-1]).float(), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    tps = [args.batch * args.seq / t for t in times[1:]]
    print(json.dumps({"tokens_per_s": statistics.median(tps), "loss": loss.item()}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flexc", default="build/flexc")
    ap.add_argument("--model")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the sides in turn (the ratios' medians)")
    ap.add_argument("--full", action="store_true", help="also flexc's full fine-tuning (memory ratio)")
    ap.add_argument("--bf16", action="store_true", help="also flexc train --lora --dtype bf16")
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--autocast", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer:
        return peer(args)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="flexc-lora-model-") as tmp:
        if not args.model:
            args.model = os.path.join(tmp, "smollm2-135m-shape")
            n = make_model(args.model)
            print(f"model: SmolLM2-135M's shape, random BF16 weights, {n / 1e6:.1f}M parameters")
        with open(os.path.join(args.model, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        tokens = os.path.join(tmp, "tokens.bin")
        make_tokens(tokens, 200_000, vocab)
        print(f"LoRA r={args.rank} alpha={2 * args.rank} on q,k,v,o,gate,up,down; batch {args.batch} x seq "
              f"{args.seq}; {args.threads} threads; {args.steps} steps (median after the first); "
              f"{args.rounds} rounds, the sides in turn")

        def run_peer(*extra):
            out, peak = run_measured([sys.executable, os.path.abspath(__file__), "--peer", "--model", args.model,
                                      "--tokens", tokens, "--threads", str(args.threads), "--steps",
                                      str(args.steps), "--batch", str(args.batch), "--seq", str(args.seq),
                                      "--rank", str(args.rank), *extra])
            r = json.loads(out.strip().splitlines()[-1])
            return r["tokens_per_s"], peak, r["loss"]

        # The sides, each run once a round in this order: name -> (tokens/s, peak, last loss).
        sides = [("flexc", lambda: run_flexc(args, args.model, tokens, True)), ("peft", run_peer)]
        if args.bf16:
            sides += [("flexc_bf16", lambda: run_flexc(args, args.model, tokens, True, ("--dtype", "bf16"))),
                      ("peft_autocast", lambda: run_peer("--autocast"))]
        if args.full:
            sides += [("flexc_full", lambda: run_flexc(args, args.model, tokens, False))]
        # The ratios, each the median of its rounds' (a round's sides ran next to each other).
        ratios = [("flexc", "peft")]
        if args.bf16:
            ratios += [("flexc_bf16", "peft_autocast"), ("flexc_bf16", "peft")]
        runs = {name: [] for name, _ in sides}
        mib = 1 << 20
        for r in range(args.rounds):
            for name, run in sides:
                runs[name].append(run())
            print(f"round {r + 1}: " + ", ".join(f"{name} {runs[name][-1][0]:.1f}" for name, _ in sides) + " tokens/s", flush=True)
        summary = {"case": "lora_vs_peft", "model": args.model, "rank": args.rank, "batch": args.batch,
                   "seq": args.seq, "threads": args.threads, "steps": args.steps, "rounds": args.rounds}
        for name, _ in sides:
            tps = statistics.median(x[0] for x in runs[name])
            peak = max(x[1] for x in runs[name])
            summary[f"{name}_tokens_per_s"], summary[f"{name}_peak_mib"] = round(tps, 1), round(peak / mib)
            print(f"{name:14s} {tps:8.1f} tokens/s (median)  peak {peak / mib:7.0f} MiB  "
                  f"(last loss {runs[name][-1][2]:.3f})")
        for a, b in ratios:
            ratio = statistics.median(x[0] / y[0] for x, y in zip(runs[a], runs[b]))
            mem = max(x[1] for x in runs[a]) / max(y[1] for y in runs[b])
            summary[f"{a}_over_{b}"], summary[f"{a}_over_{b}_peak"] = round(ratio, 2), round(mem, 2)
            print(f"{a} / {b}: tokens/s {ratio:.2f}x (median of the rounds' ratios), peak memory {mem:.2f}x")
        if args.full:
            mem = max(x[1] for x in runs["flexc"]) / max(x[1] for x in runs["flexc_full"])
            summary["lora_over_full_peak"] = round(mem, 2)
            print(f"flexc LoRA / full fine-tuning peak memory {mem:.2f}x")
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
