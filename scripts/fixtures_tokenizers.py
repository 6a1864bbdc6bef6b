#!/usr/bin/env python3
"""Trains small BPE tokenizers configured like GPT-2, Llama 3, Qwen2, Llama 2, Mistral, SmolLM and an older
Metaspace conversion (split at each "▁") on the
fortunes corpus (/usr/share/games/fortunes, Debian packages fortunes and fortunes-min) and
writes, for each, tests/fixtures/tokenizers/<name>/tokenizer.json and reference.json: the ids
Hugging Face `tokenizers` gives for a varied text set (encode(s, add_special_tokens=False)),
the decodes of those ids, and decodes of random id sequences. tests/test_tokenizer.c compares
flexc against these files.

    python3 scripts/fixtures_tokenizers.py [--out tests/fixtures/tokenizers] [--seed 1]

The texts are written to tests/fixtures/tokenizers/texts.json once (shared by every
tokenizer): a fixed set (several scripts, emoji, whitespace runs, numbers, code, special tokens
inside text, combining marks, the empty string), random Unicode strings, and invalid UTF-8
byte strings (hex) whose reference is HF's encoding of bytes.decode("utf-8", "replace").
"""
import argparse
import glob
import json
import os
import random
import sys
import unicodedata

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

FIXED_TEXTS = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and trailing spaces   ",
    "tabs\tand\t\tmore\ttabs\n\nnew lines\r\nwindows\rold mac",
    "many     spaces      between\n\n\n\nand blank lines \n \n",
    "Café crème brûlée, naïve façade, Ångström, jalapeño, Øresund, Łódź, Škoda.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Καλημέρα κόσμε!",
    "我能吞下玻璃而不伤身体。日本語のテキスト、カタカナとひらがな。한국어 문장입니다.",
    "مرحبا بالعالم، هذه جملة عربية للاختبار.",
    "हिन्दी में एक वाक्य, नमस्ते दुनिया।",
    "Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇫🇷 and text after.",
    "Digits 0 12 345 6789 1234567890 3.14159 -42 1e10 ９８７ ٣٤٥ ४२",
    "A long number: 98765432109876543210987654321",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }\n\tif (x != y && z) return -1;",
    "I'm sure they'll say it's what we've done, I'd THINK. DON'T SHOUT'S 'T",
    "<|endoftext|>",
    "text before<|endoftext|>text after",
    "<|begin_of_text|>Hello<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>",
    "<s>Hello</s> <s> spaced </s><unk> and <0x41> literal",
    "a <mask> token and <mask>and  <mask>  with spaces",
    "single word: hello world and hello worlds and xhello world",
    "Combining: e\u0301 a\u0308 o\u0302 n\u0303 A\u030a \u1e0a\u0323 q\u0307\u0323 \uac00 \u1100\u1161",
    "Compatibility: ﬁ ﬂ ① ² ｆｕｌｌ ㌀ Ⅻ",
    "Zero width: a\u200bb\u200cc\u200dd \ufeffBOM",
    "Unicode spaces:\u00a0nbsp\u2003em\u3000ideographic\u2028line\u2029para\u0085nel\u000bvt\u000cff",
    "Mixed: English, Français, Русский, Ελληνικά, 中文, العربية, हिन्दी 😀",
    "   ",
    "\n",
    " ",
    "a",
    "ſt ſs 'ſ 'S 'ſ",
    "Ŀ İstanbul ΣΑΣ ǅ",
    "\u2581already metaspace\u2581\u2581 here",
    "x" * 300,
    "ab" * 200 + " " + "abc " * 50,
    "Ġhello Ċ byte-level chars",
    "\U0001f600" * 20,
    "line one\nline two\n\nline four",
    "Numbers 1,000,000 and 2024-05-20 and 12:30:45.678",
    "\x00\x01\x7f control \x1b[31m ansi",
    "cafe\u0301 and café and CAFÉ, cafés",
    "<tool>   after tool <tool>\n\nx<tool>",
    "hello world<s>hello world</s> hello world",
]

INVALID_UTF8 = [
    b"\xff",
    b"abc\xffdef",
    b"\xc3",
    b"\xc3(",
    b"\xe2\x82",
    b"\xe2\x82(",
    b"\xf0\x9f\x98",
    b"\xed\xa0\x80 surrogate",
    b"\xc0\xaf overlong",
    b"\xf4\x90\x80\x80 beyond",
    b"\x80\x80\x80 continuation",
    b"ok \xf0\x9f\x98\x80 then \xf0\x9f bad",
]

# Code point ranges the random strings draw from (no surrogates), with weights.
RANGES = [
    ((0x20, 0x7e), 30), ((0x09, 0x0d), 4), ((0xa0, 0x24f), 8), ((0x370, 0x3ff), 3),
    ((0x400, 0x4ff), 4), ((0x590, 0x6ff), 3), ((0x900, 0x97f), 3), ((0x300, 0x36f), 3),
    ((0x1100, 0x11ff), 1), ((0x2000, 0x206f), 3), ((0x3000, 0x30ff), 3), ((0x4e00, 0x9fff), 4),
    ((0xac00, 0xd7a3), 2), ((0xe000, 0xf8ff), 1), ((0xfb00, 0xfb4f), 1), ((0xfe00, 0xfe0f), 1),
    ((0xff00, 0xffef), 2), ((0x1f300, 0x1faff), 4), ((0x10000, 0x10ffff), 1), ((0x80, 0x9f), 1),
]


def corpus(limit_bytes=3_000_000):
    """Fortunes texts (not the .dat indexes, not the .u8 links), one fortune per item."""
    items = []
    total = 0
    for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if path.endswith(".dat") or path.endswith(".u8") or os.path.isdir(path):
            continue
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        for item in text.split("\n%\n"):
            items.append(item)
            total += len(item)
            if total > limit_bytes:
                return items
    if not items:
        sys.exit("fixtures_tokenizers: no fortunes found (apt-get install fortunes fortunes-min)")
    return items


def random_string(rng, n):
    cps = []
    for _ in range(n):
        (lo, hi), = rng.choices([r for r, _ in RANGES], weights=[w for _, w in RANGES])
        cp = rng.randint(lo, hi)
        if 0xd800 <= cp <= 0xdfff:
            continue
        # Code points unassigned in this Python's Unicode (14.0) are left out: regex engines of
        # different Unicode versions may classify them differently.
        if unicodedata.category(chr(cp)) == "Cn":
            continue
        cps.append(chr(cp))
    return "".join(cps)


def random_texts(rng, count):
    words = ["the", " the", "hello", " world", "Ωμέγα", "жизнь", "数据", "😀", "👨‍👩‍👧", "123", "4567",
             "  ", "\n", "\t", "'s", "'LL", "<|endoftext|>", "<|eot_id|>", "<s>", "</s>", "<mask>",
             " <mask> ", "hello world", "e\u0301", "\u2581", "<0x41>", ".", ",", "!?", "  \n  "]
    out = []
    for i in range(count):
        if i % 2 == 0:
            out.append(random_string(rng, rng.randint(1, 40)))
        else:
            out.append("".join(rng.choice(words) if rng.random() < 0.7 else random_string(rng, 3)
                               for _ in range(rng.randint(1, 12))))
    return out


def byte_level(vocab_size, items, pre, normalizer=None, special=(), added=(), ignore_merges=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False, special_tokens=list(special),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(items, trainer)
    if added:
        tok.add_tokens(list(added))
    return tok


def sentencepiece_like(vocab_size, items, metaspace_pretok, added=(), split=False, scheme="first"):
    """Llama 2 / Mistral layout: <unk> <s> </s>, the 256 <0xXX> byte tokens, then learned
    pieces; byte_fallback, unk fused."""
    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False, limit_alphabet=150,
                                  special_tokens=["<unk>"])
    trainer_tok.train_from_iterator(items, trainer)
    trained = json.loads(trainer_tok.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.add_special_tokens([AddedToken("<unk>", normalized=False, special=True),
                            AddedToken("<s>", normalized=False, special=True),
                            AddedToken("</s>", normalized=False, special=True)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    if added:
        tok.add_tokens(list(added))
    if metaspace_pretok:
        # Mistral: the Metaspace pre-tokenizer (prepend only at the start), Metaspace decoder.
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme, split=split)
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=scheme, split=split)
    else:
        # Llama 2 / TinyLlama: the normalizer does the metaspace, no pre-tokenizer.
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    return tok


def build(items):
    toks = {}
    toks["gpt2"] = byte_level(
        1000, items, pre_tokenizers.ByteLevel(add_prefix_space=False),
        special=["<|endoftext|>"],
        added=[AddedToken("<mask>", lstrip=True, rstrip=True, special=False, normalized=False),
               AddedToken("hello world", single_word=True, normalized=True)])
    toks["gpt2"].post_processor = processors.ByteLevel(trim_offsets=False)
    toks["llama3"] = byte_level(
        1500, items,
        pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
                                 pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)]),
        special=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        ignore_merges=True)
    toks["llama3"].post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", 0)])])
    toks["qwen2"] = byte_level(
        1200, items,
        pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
                                 pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)]),
        normalizer=normalizers.NFC(),
        special=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        added=[AddedToken("café", normalized=True), AddedToken("<tool>", rstrip=True, normalized=False)])
    toks["qwen2"].post_processor = processors.ByteLevel(trim_offsets=False)
    toks["llama2"] = sentencepiece_like(1200, items, metaspace_pretok=False,
                                        added=[AddedToken("hello world", normalized=True)])
    toks["mistral"] = sentencepiece_like(800, items, metaspace_pretok=True)
    # SmolLM (StarCoder's layout): digits one by one, then GPT-2's byte-level split.
    toks["smollm"] = byte_level(
        900, items,
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                 pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)]),
        special=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    # Older SentencePiece conversions: Metaspace splitting at each "▁", prefix always.
    toks["metaspace"] = sentencepiece_like(700, items, metaspace_pretok=True, split=True, scheme="always")
    return toks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "tokenizers"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--random", type=int, default=300, help="random strings")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    items = corpus()
    toks = build(items)
    texts = FIXED_TEXTS + random_texts(rng, args.random)
    invalid = INVALID_UTF8 + [bytes(rng.randrange(256) for _ in range(rng.randint(1, 24))) for _ in range(40)]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "texts.json"), "w", encoding="utf-8") as f:
        json.dump({"texts": texts, "invalid_utf8_hex": [b.hex() for b in invalid]}, f, ensure_ascii=False, indent=0)
    for name, tok in toks.items():
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        if name == "gpt2":
            # GPT-2's own file spells merges as "a b" strings (the others keep ["a", "b"] pairs).
            with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
                j = json.load(f)
            j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
            with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
                json.dump(j, f, ensure_ascii=False, indent=2)
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))  # what the file says, reloaded
        ids = [tok.encode(t, add_special_tokens=False).ids for t in texts]
        dec = [tok.decode(i, skip_special_tokens=False) for i in ids]
        inv_ids = [tok.encode(b.decode("utf-8", "replace"), add_special_tokens=False).ids for b in invalid]
        vocab = tok.get_vocab_size(with_added_tokens=True)
        rand_ids = [[rng.randrange(vocab) for _ in range(rng.randint(0, 12))] for _ in range(200)]
        rand_dec = [tok.decode(i, skip_special_tokens=False) for i in rand_ids]
        ref = {"ids": ids, "decoded": dec, "invalid_ids": inv_ids, "random_ids": rand_ids, "random_decoded": rand_dec,
               "vocab_size": vocab}
        with open(os.path.join(d, "reference.json"), "w", encoding="utf-8") as f:
            json.dump(ref, f, ensure_ascii=False, separators=(",", ":"))
        print(f"{name}: vocab {vocab}, {sum(map(len, ids))} tokens over {len(texts)} texts")


if __name__ == "__main__":
    main()
