#!/usr/bin/env python3
"""Generation with a Hugging Face Llama model: flexc against transformers, same threads.

    python3 bench/generate_vs_transformers.py [--flexc build/flexc] [--threads T] [--pairs R]
                                              [--prompt-len P] [--tokens N] [--dir DIR]
                                              [--dtype float32|bfloat16]

A ~100M-parameter Llama configuration (vocabulary 32000, hidden 768, 12 layers, 12 heads, 4 KV
heads, MLP 2048, tied embeddings) with random weights is built with transformers and saved
once, in --dtype, to a temporary directory (or DIR, reused when it is there and holds that
dtype). Then, alternating flexc, transformers (, transformers) ... for R rounds, each in a
fresh child process on the same directory:
  flexc:        flexc bench generate --model DIR --prompt-len P --tokens N --threads T --json
                (fx_model_load_inference: the weights stay in the mapped file, in its dtype)
  transformers: from_pretrained(DIR, dtype=float32), and for a bfloat16 checkpoint also
                dtype=bfloat16 (what a user would pick); model(prompt) with a cache, then
                N-1 greedy decode steps with the cache (eager attention,
                torch.set_num_threads(T)), in torch.inference_mode
Each child reports prefill and decode tokens/s; its peak resident set comes from wait4()
(the whole process: interpreter and libraries included for transformers, as a user runs it;
for flexc the mapped file's pages count as they are touched). This script itself never
imports torch and builds the model in a child of its own: Linux starts a child's peak RSS
at its parent's resident set when the child calls exec, so a parent holding torch and the
model (1.2 GB) would be counted in every child.
Prints one JSON object per transformers case: medians per side and the ratios
flexc / transformers (decode speed, prefill speed, peak memory), each the median of the
per-round ratios. Skips (exit 0) when torch or transformers is not installed.
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile

for _mod in ("torch", "transformers"):  # optional dependencies, looked up without importing
    if importlib.util.find_spec(_mod) is None:
        print(json.dumps({"case": "generate_vs_transformers", "skipped": f"{_mod} is not installed"}))
        sys.exit(0)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

CONFIG = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
              num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048,
              rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
              rope_parameters={"rope_type": "default", "rope_theta": 500000.0})

# The transformers side, run in its own process: prints {"prefill_tok_s", "decode_tok_s"}.
HF_CHILD = r"""
import json, sys, time, torch
from transformers import AutoModelForCausalLM
d, P, N, T, dt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.set_num_threads(T)
m = AutoModelForCausalLM.from_pretrained(d, dtype=getattr(torch, dt), attn_implementation="eager").eval()
g = torch.Generator().manual_seed(1)
ids = torch.randint(3, m.config.vocab_size, (1, P), generator=g)
with torch.inference_mode():
    m(ids[:, :8])                                   # warm-up
    t0 = time.perf_counter()
    out = m(ids, use_cache=True)
    t1 = time.perf_counter()
    past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(N - 1):
        out = m(tok, past_key_values=past, use_cache=True)
        past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    t2 = time.perf_counter()
print(json.dumps({"prefill_tok_s": P / (t1 - t0), "decode_tok_s": (N - 1) / (t2 - t1)}))
"""


# Builds the model with random weights and saves it in a dtype, in its own process.
MAKE_CHILD = r"""
import json, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
d, dtype, config = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
torch.manual_seed(0)
m = LlamaForCausalLM(LlamaConfig(**config))
m.config.architectures = ["LlamaForCausalLM"]
if dtype != "float32":
    m = m.to(getattr(torch, dtype))
m.save_pretrained(d)
"""


def make_model(d, dtype):
    """Saves the model in dtype to d, or checks that d already holds it in dtype."""
    cfg = os.path.join(d, "config.json")
    if os.path.exists(cfg):
        with open(cfg) as f:
            have = json.load(f).get("dtype") or "float32"
        if have != dtype:
            raise SystemExit(f"{d} holds a {have} model; --dtype {dtype} wants another directory")
        return
    subprocess.run([sys.executable, "-c", MAKE_CHILD, d, dtype, json.dumps(CONFIG)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(cmd):
    """One child; peak RSS via wait4 (Popen.wait reaps the child, so we reap it ourselves)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = p.stdout.read()
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} ... failed ({p.returncode}): {err.strip()[-400:]}")
    r = json.loads(out.strip().splitlines()[-1])
    r["peak_rss_mib"] = ru.ru_maxrss / 1024.0
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flexc", default=os.path.join(ROOT, "build", "flexc"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--pairs", type=int, default=3, help="rounds (each runs every side once)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="the saved checkpoint's dtype (default float32)")
    ap.add_argument("--dir", default=None, help="where the model is saved (default: a temporary directory)")
    a = ap.parse_args()
    tmp = None
    d = a.dir
    if d is None:
        tmp = tempfile.TemporaryDirectory()
        d = tmp.name
    os.makedirs(d, exist_ok=True)
    make_model(d, a.dtype)
    fx_cmd = [a.flexc, "bench", "generate", "--model", d, "--prompt-len", str(a.prompt_len), "--tokens",
              str(a.tokens), "--threads", str(a.threads), "--json"]
    hf_dtypes = ["float32"] + (["bfloat16"] if a.dtype == "bfloat16" else [])
    hf_cmds = {dt: [sys.executable, "-c", HF_CHILD, d, str(a.prompt_len), str(a.tokens), str(a.threads), dt]
               for dt in hf_dtypes}
    fx, hf = [], {dt: [] for dt in hf_dtypes}
    for _ in range(a.pairs):
        fx.append(measure(fx_cmd))
        for dt in hf_dtypes:
            hf[dt].append(measure(hf_cmds[dt]))

    keys = ("prefill_tok_s", "decode_tok_s", "peak_rss_mib")

    def med(rs, k):
        return statistics.median(r[k] for r in rs)

    for dt in hf_dtypes:
        def ratio(k):  # median of the per-round ratios
            return statistics.median(f[k] / h[k] for f, h in zip(fx, hf[dt]))
        res = {"case": "generate_vs_transformers", "params": fx[0]["params"], "checkpoint_dtype": a.dtype,
               "transformers_dtype": dt, "threads": a.threads, "prompt_len": a.prompt_len, "tokens": a.tokens,
               "pairs": a.pairs,
               "flexc": {k: med(fx, k) for k in keys},
               "transformers": {k: med(hf[dt], k) for k in keys},
               "decode_speedup": ratio("decode_tok_s"), "prefill_speedup": ratio("prefill_tok_s"),
               "memory_ratio": ratio("peak_rss_mib")}
        print(json.dumps(res))
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
