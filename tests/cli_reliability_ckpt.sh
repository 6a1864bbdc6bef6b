#!/usr/bin/env bash
# A checkpoint's metadata is held to the ranges the command line is held to: a hand-edited
# or corrupt value (lr -1, steps 0, batch 99999, head_dim 0, an unknown kind or arch, NaN) is
# refused by train --resume, generate and export, naming the file, the key and the value,
# instead of being trained or decoded with.
set -u
flexc=${1:?path to flexc}
source "$(dirname "$0")/lib/checks.sh"
scratch cli_rel_ckpt 200
check base 0 "$flexc" train --model tiny --data "$tmp/corpus.txt" --batch 2 --seq 16 --threads 1 --steps 4 \
    --until 2 --quiet --out "$tmp/r"
cp "$tmp/r/checkpoint.safetensors" "$tmp/good.safetensors"

# setmeta FILE KEY VALUE: rewrite one metadata value (the header is JSON; the data follows it
# unchanged).
setmeta() {
    python3 - "$@" <<'PY'
import json, struct, sys
path, key, val = sys.argv[1:4]
b = open(path, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
assert key in h["__metadata__"], key
h["__metadata__"][key] = val
t = json.dumps(h, separators=(",", ":")).encode()
t += b" " * (-len(t) % 8)
open(path, "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
PY
}

# bad NAME KEY VALUE MESSAGE: the run's checkpoint with KEY = VALUE is refused by train
# --resume, generate --ckpt and export with MESSAGE, and left as it is.
bad_value() {
    local name=$1 key=$2 val=$3 msg=$4 f=$tmp/r/checkpoint.safetensors
    cp "$tmp/good.safetensors" "$f"
    setmeta "$f" "$key" "$val"
    cp "$f" "$tmp/bad.safetensors"
    check "$name resume" 1 "$flexc" train --resume --out "$tmp/r" --quiet --threads 1
    has "$name resume message" "$tmp/err" "flexc: error: --resume: '$f': $msg"
    same "$name untouched" "$f" "$tmp/bad.safetensors"
    check "$name generate" 1 "$flexc" generate --ckpt "$f" --tokens 2 --threads 1
    has "$name generate message" "$tmp/err" "'$f': $msg"
    check "$name export" 1 "$flexc" export --ckpt "$f" --to "$tmp/ex_$name"
    has "$name export message" "$tmp/err" "'$f': $msg"
}

bad_value lr lr -1 "training state lr = -1 must be > 0"
bad_value min-lr min_lr -0.5 "training state min_lr = -0.5 must be >= 0"
bad_value min-lr-above min_lr 5 "training state min_lr = 5 is above lr = "
bad_value steps steps 0 "training state steps = 0 must be >= 1"
bad_value batch batch 99999 "training state batch = 99999 is outside [1, 65536]"
bad_value accum accum 0 "training state accum = 0 is outside [1, 65536]"
bad_value seq seq 100000 "training state seq = 100000 is outside [1, "
bad_value beta2 beta2 1 "training state beta2 = 1 must be in [0, 1)"
bad_value warmup warmup -3 "training state warmup = -3 must be >= 0"
bad_value head-dim head_dim 0 "metadata head_dim = 0"
bad_value kind kind weights "metadata kind = 'weights' is not checkpoint, model or lora"
bad_value arch arch GPT5ForCausalLM "metadata arch = 'GPT5ForCausalLM' is not flexc-gpt"
bad_value nan lr nan "metadata 'lr' = 'nan' is not a finite number"
bad_value nan-clip clip NaN "metadata 'clip' = 'NaN' is not a finite number"

# The untouched checkpoint still resumes (the tampering helper changes nothing else).
cp "$tmp/good.safetensors" "$tmp/r/checkpoint.safetensors"
setmeta "$tmp/r/checkpoint.safetensors" lr 0.001
check good-resume 0 "$flexc" train --resume --out "$tmp/r" --quiet --threads 1
finish cli_reliability_ckpt
