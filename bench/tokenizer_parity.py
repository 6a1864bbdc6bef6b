#!/usr/bin/env python3
"""Live parity of flexc's tokenizer with Hugging Face `tokenizers`, on the fixture tokenizers
(tests/fixtures/tokenizers): the fixture texts, fresh random Unicode strings, invalid UTF-8 byte
strings, and a larger mixed text (fortunes and random strings, one string). For each tokenizer
the ids must be identical and decode(encode(x)) equal to HF's decode of its ids.

    python3 bench/tokenizer_parity.py --tool build/tokenizer_tool [--random 3000] [--seed S]

Prints one JSON object per tokenizer; exits 1 on any difference (the first is printed), 77 when
`tokenizers` is not installed.
"""
import argparse
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tokenizers")
NAMES = ["gpt2", "llama3", "qwen2", "llama2", "mistral", "smollm", "metaspace"]


def load_fixture_module():
    spec = importlib.util.spec_from_file_location("fixtures_tokenizers", os.path.join(ROOT, "scripts",
                                                                                       "fixtures_tokenizers.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True, help="build/tokenizer_tool")
    ap.add_argument("--random", type=int, default=3000, help="random strings")
    ap.add_argument("--seed", type=int, default=None, help="default: a fresh seed, printed")
    ap.add_argument("--big-kb", type=int, default=300, help="size of the mixed text")
    args = ap.parse_args()
    try:
        from tokenizers import Tokenizer
    except ImportError:
        print("tokenizer_parity: the Python package tokenizers is not installed: skipped")
        return 77
    fx = load_fixture_module()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    rng = random.Random(seed)
    with open(os.path.join(FIXTURES, "texts.json"), encoding="utf-8") as f:
        fixed = json.load(f)
    texts = fixed["texts"] + fx.random_texts(rng, args.random)
    big = []
    try:
        items = fx.corpus(limit_bytes=args.big_kb * 1000)
    except SystemExit:
        items = []
    size = 0
    while size < args.big_kb * 1000:
        piece = rng.choice(items) if items and rng.random() < 0.7 else fx.random_string(rng, rng.randint(1, 80))
        big.append(piece)
        size += len(piece.encode("utf-8"))
    texts.append("\n".join(big))
    invalid = [bytes.fromhex(h) for h in fixed["invalid_utf8_hex"]]
    invalid += [bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))) for _ in range(500)]

    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        inp = os.path.join(tmp, "in.json")
        with open(inp, "w", encoding="utf-8") as f:
            json.dump({"texts": texts, "hex": [b.hex() for b in invalid]}, f, ensure_ascii=False)
        for name in NAMES:
            path = os.path.join(FIXTURES, name, "tokenizer.json")
            out = os.path.join(tmp, name + ".json")
            subprocess.run([args.tool, "encode", path, inp, out], check=True)
            with open(out, encoding="utf-8") as f:
                got = json.load(f)
            tok = Tokenizer.from_file(path)
            bad_ids = bad_dec = 0
            first = None
            for i, t in enumerate(texts):
                ids = tok.encode(t, add_special_tokens=False).ids
                if ids != got["ids"][i]:
                    bad_ids += 1
                    if first is None:
                        k = next((j for j, (a, b) in enumerate(zip(ids, got["ids"][i])) if a != b),
                                 min(len(ids), len(got["ids"][i])))
                        first = {"text": t[:200], "index": k, "hf": ids[k:k + 5], "flexc": got["ids"][i][k:k + 5]}
                elif tok.decode(ids, skip_special_tokens=False) != got["decoded"][i]:
                    bad_dec += 1
                    if first is None:
                        first = {"text": t[:200], "decode_hf": tok.decode(ids, skip_special_tokens=False)[:200],
                                 "decode_flexc": got["decoded"][i][:200]}
            for i, b in enumerate(invalid):
                ids = tok.encode(b.decode("utf-8", "replace"), add_special_tokens=False).ids
                if ids != got["hex_ids"][i]:
                    bad_ids += 1
                    if first is None:
                        first = {"bytes": b.hex(), "hf": ids, "flexc": got["hex_ids"][i]}
            report = {"tokenizer": name, "seed": seed, "texts": len(texts), "invalid_utf8": len(invalid),
                      "big_text_bytes": len(texts[-1].encode("utf-8")), "id_mismatches": bad_ids,
                      "decode_mismatches": bad_dec}
            if first is not None:
                report["first"] = first
                failed = True
            print(json.dumps(report, ensure_ascii=False))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
