#!/usr/bin/env python3
"""Encoding speed of flexc's tokenizer against Hugging Face `tokenizers` (Rust), one thread each,
on the fixture tokenizers (tests/fixtures/tokenizers) and a few MB of text: the fortunes corpus
(/usr/share/games/fortunes), repeated to size, as documents (one fortune each).

    python3 bench/tokenizer_vs_hf.py --tool build/tokenizer_tool [--mb 4] [--pairs 5]

flexc: tokenizer_tool time (a loop of fx_tokenizer_encode over the documents, load excluded).
HF: Tokenizer.encode_batch(docs, add_special_tokens=False) with RAYON_NUM_THREADS=1 (one
thread; load excluded). Runs alternate flexc, HF, flexc, HF, ...; each pair gives a ratio
(HF seconds / flexc seconds, > 1: flexc is faster); the median of the pairs is reported. Both
sides must give the same number of tokens. Prints one JSON object per tokenizer.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "tokenizers")
NAMES = ["gpt2", "llama3", "qwen2", "llama2", "mistral", "smollm", "metaspace"]


def documents(mb):
    items = []
    for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if path.endswith(".dat") or path.endswith(".u8") or os.path.isdir(path):
            continue
        with open(path, "rb") as f:
            items += [d for d in f.read().decode("utf-8", "replace").split("\n%\n") if d]
    if not items:
        sys.exit("tokenizer_vs_hf: no fortunes found (apt-get install fortunes fortunes-min)")
    docs, size = [], 0
    while size < mb * 1e6:
        for d in items:
            docs.append(d)
            size += len(d.encode("utf-8"))
            if size >= mb * 1e6:
                break
    return docs, size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True, help="build/tokenizer_tool")
    ap.add_argument("--mb", type=float, default=4.0)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--tokenizers", default=",".join(NAMES))
    args = ap.parse_args()
    from tokenizers import Tokenizer, __version__ as hf_version

    docs, nbytes = documents(args.mb)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "docs.txt")
        with open(path, "wb") as f:
            f.write("\x1e".join(docs).encode("utf-8"))
        for name in args.tokenizers.split(","):
            tj = os.path.join(FIXTURES, name, "tokenizer.json")
            hf = Tokenizer.from_file(tj)
            fx_s, hf_s, ratios = [], [], []
            fx_tokens = hf_tokens = None
            for _ in range(args.pairs):
                out = subprocess.run([args.tool, "time", tj, path], check=True, capture_output=True, text=True)
                r = json.loads(out.stdout)
                fx_s.append(r["seconds"])
                fx_tokens = r["tokens"]
                t0 = time.perf_counter()
                enc = hf.encode_batch(docs, add_special_tokens=False)
                hf_s.append(time.perf_counter() - t0)
                hf_tokens = sum(len(e.ids) for e in enc)
                del enc
                ratios.append(hf_s[-1] / fx_s[-1])
            print(json.dumps({
                "case": "tokenizer_encode", "tokenizer": name, "bytes": nbytes, "documents": len(docs),
                "threads": 1, "machine_threads": os.cpu_count(), "pairs": args.pairs,
                "flexc_s": statistics.median(fx_s), "hf_s": statistics.median(hf_s),
                "flexc_mb_s": nbytes / 1e6 / statistics.median(fx_s), "hf_mb_s": nbytes / 1e6 / statistics.median(hf_s),
                "speedup": statistics.median(ratios), "tokens_flexc": fx_tokens, "tokens_hf": hf_tokens,
                "same_token_count": fx_tokens == hf_tokens, "peer": f"tokenizers {hf_version} encode_batch, 1 thread",
            }))
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
