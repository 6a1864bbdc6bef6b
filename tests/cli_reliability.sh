#!/usr/bin/env bash
# The command against a hostile or careless user: one run per --out; non-finite numbers are
# named, not propagated; special files never hang a reader; contradicting options are refused;
# a save that cannot happen is found before the first step; prompts of any size; a
# tokenizer.json far too large is refused before it is read.
set -u
flexc=${1:?path to flexc}
source "$(dirname "$0")/lib/checks.sh"
scratch cli_rel 200
common=(--model tiny --data "$tmp/corpus.txt" --batch 2 --seq 16 --threads 1)
check base 0 "$flexc" train "${common[@]}" --steps 4 --until 2 --quiet --out "$tmp/r"

# setf32 FILE TENSOR INDEX VALUE: overwrite one float32 (or bfloat16) element in place.
setf32() {
    python3 - "$@" <<'PY'
import json, struct, sys
path, name, idx, val = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))[name]
    size = 4 if h["dtype"] == "F32" else 2
    f.seek(8 + n + h["data_offsets"][0] + idx * size)
    b = struct.pack("<f", val)
    f.write(b if size == 4 else b[2:])
PY
}

# ---- 1. one run per output directory ----
"$flexc" train "${common[@]}" --steps 100000 --eval-every 0 --quiet --out "$tmp/busy" & busy=$!
for _ in $(seq 100); do [[ -s $tmp/busy/.lock ]] && break; sleep 0.1; done
check lock-second 1 "$flexc" train "${common[@]}" --steps 2 --quiet --out "$tmp/busy"
has lock-msg "$tmp/err" "flexc: error: --out $tmp/busy is in use by another flexc train (pid $busy)"
check lock-force 1 "$flexc" train "${common[@]}" --steps 2 --quiet --force --out "$tmp/busy"
has lock-force-msg "$tmp/err" "(pid $busy)"
kill -KILL $busy; wait $busy 2>/dev/null
# A killed holder leaves its .lock file, but no lock: the next run proceeds.
check lock-after-kill 0 "$flexc" train "${common[@]}" --steps 2 --quiet --force --out "$tmp/busy"
[[ -e $tmp/busy/.lock ]] && bad "lock: .lock left after a finished run" || ok

# ---- 2. non-finite numbers ----
cp -r "$tmp/r" "$tmp/nan"
setf32 "$tmp/nan/model.safetensors" layers.1.attn.wq 37 nan
check gen-nan 1 "$flexc" generate --ckpt "$tmp/nan/model.safetensors" --tokens 4
has gen-nan-msg "$tmp/err" "tensor 'layers.1.attn.wq' holds NaN at index 37"
check inspect-nan 0 "$flexc" inspect "$tmp/nan/model.safetensors"
has inspect-nan-msg "$tmp/out" "non-finite: tensor layers.1.attn.wq holds NaN at index 37"
check inspect-nan-json 0 "$flexc" inspect --json "$tmp/nan/model.safetensors"
has inspect-nan-json-msg "$tmp/out" '"first_nonfinite":{"index":37,"value":"NaN"}'
setf32 "$tmp/nan/checkpoint.safetensors" wte 5 -inf
check resume-inf 1 "$flexc" train --resume --quiet --out "$tmp/nan"
has resume-inf-msg "$tmp/err" "tensor 'wte' holds -Inf at index 5"
# Corrupt optimizer state: a negative second moment, a non-finite first moment.
cp -r "$tmp/r" "$tmp/adam"
setf32 "$tmp/adam/checkpoint.safetensors" optim.v 11 -0.5
check resume-neg-v 1 "$flexc" train --resume --quiet --out "$tmp/adam"
has resume-neg-v-msg "$tmp/err" "is corrupt: optimizer state optim.v[11] = -0.5 is negative"
cp "$tmp/r/checkpoint.safetensors" "$tmp/adam/"
setf32 "$tmp/adam/checkpoint.safetensors" optim.m 3 inf
check resume-inf-m 1 "$flexc" train --resume --quiet --out "$tmp/adam"
has resume-inf-m-msg "$tmp/err" "is corrupt: optimizer state optim.m[3] is +Inf"
# A learning rate of 1e30 overflows the weights: the run stops at the first non-finite
# step with the previous step's checkpoint, and exits 1.
check overflow 1 "$flexc" train "${common[@]}" --steps 6 --warmup 0 --lr 1e30 --quiet --out "$tmp/of"
contains overflow-msg "$tmp/err" "^flexc: error: step \([0-9]*\): the \(loss\|gradient norm\) is [-+a-zA-Z]*; stopping with the checkpoint of step "
n=$(sed -n 's/.*step \([0-9]*\): the.*/\1/p' "$tmp/err")
saved=$("$flexc" inspect "$tmp/of/checkpoint.safetensors" | sed -n 's/^  step: //p')
[[ -n $n && $saved == $((n - 1)) ]] && ok || bad "overflow: stopped at step '$n', checkpoint step '$saved'"
check overflow-finite 0 "$flexc" inspect "$tmp/of/checkpoint.safetensors"
lacks overflow-finite-msg "$tmp/out" "non-finite"

# ---- 3. special files ----
mkfifo "$tmp/fifo"
t5() { timeout 10 "$@"; }
check fifo-data 1 t5 "$flexc" train "${common[@]}" --steps 2 --quiet --data "$tmp/fifo" --out "$tmp/ff"
has fifo-data-msg "$tmp/err" "'$tmp/fifo' is not a regular file"
check fifo-inspect 1 t5 "$flexc" inspect "$tmp/fifo"
has fifo-inspect-msg "$tmp/err" "$tmp/fifo: not a regular file"
check fifo-index 1 t5 "$flexc" inspect "$tmp/fifo.json" # absent: cannot open
mkfifo "$tmp/f.json"
check fifo-index2 1 t5 "$flexc" inspect "$tmp/f.json"
has fifo-index-msg "$tmp/err" "not a regular file"
check fifo-ckpt 1 t5 "$flexc" generate --ckpt "$tmp/fifo"
has fifo-ckpt-msg "$tmp/err" "not a regular file"
mkdir "$tmp/fd" && mkfifo "$tmp/fd/checkpoint.safetensors"
check fifo-resume 1 t5 "$flexc" train --resume --quiet --out "$tmp/fd"
has fifo-resume-msg "$tmp/err" "not a regular file"
cp -r "$tmp/r" "$tmp/fm" && rm "$tmp/fm/metrics.jsonl" && mkfifo "$tmp/fm/metrics.jsonl"
check fifo-metrics 1 t5 "$flexc" train --resume --quiet --out "$tmp/fm"
has fifo-metrics-msg "$tmp/err" "cannot read $tmp/fm/metrics.jsonl: not a regular file"
check fifo-prompt 1 t5 "$flexc" generate --ckpt "$tmp/r" --prompt-file "$tmp/fifo"
has fifo-prompt-msg "$tmp/err" "--prompt-file $tmp/fifo: not a regular file"
# A Hugging Face directory whose generation_config.json is a FIFO (its open blocked forever).
cp -r "$(dirname "$0")/fixtures/models/qwen2_bias" "$tmp/fh" && rm "$tmp/fh/generation_config.json"
mkfifo "$tmp/fh/generation_config.json"
check fifo-hf-config 1 t5 "$flexc" generate --model "$tmp/fh" --tokens 2
has fifo-hf-config-msg "$tmp/err" "$tmp/fh/generation_config.json: not a regular file"
# Standard input is a stream where one makes sense.
check data-stdin 0 bash -c "\"$flexc\" train ${common[*]} --data - --steps 2 --quiet --out \"$tmp/in\" < \"$tmp/corpus.txt\""

# ---- 5. a save that cannot happen is found at the start ----
mkdir -p "$tmp/dirckpt/checkpoint.safetensors"
check dir-at-ckpt 1 "$flexc" train "${common[@]}" --steps 2 --force --out "$tmp/dirckpt"
has dir-at-ckpt-msg "$tmp/err" "$tmp/dirckpt/checkpoint.safetensors is a directory"
[[ -e $tmp/dirckpt/metrics.jsonl ]] && bad "dir-at-ckpt: a step ran" || ok
if unshare -rm true 2>/dev/null; then
    # A 1 MiB file system: the tiny model's checkpoint and model need about 1.9 MB.
    check small-fs 1 unshare -rm bash -c "mount -t tmpfs -o size=1m tmpfs \"$tmp/fd\" && \"$flexc\" train ${common[*]} --steps 1 --quiet --out \"$tmp/fd/o\""
    contains small-fs-warn "$tmp/err" "^flexc: warning: --out $tmp/fd/o has [0-9]* bytes free, but saving the checkpoint and the model takes about [0-9]* bytes"
    check big-fs 0 unshare -rm bash -c "mount -t tmpfs -o size=8m tmpfs \"$tmp/fd\" && \"$flexc\" train ${common[*]} --steps 1 --quiet --out \"$tmp/fd/o\""
    lacks big-fs-warn "$tmp/err" "warning"
    check ro-fs 1 unshare -rm bash -c "mkdir -p \"$tmp/ro/o\" && mount -t tmpfs -o ro tmpfs \"$tmp/ro\" && \"$flexc\" train ${common[*]} --steps 1 --quiet --out \"$tmp/ro\""
    contains ro-fs-msg "$tmp/err" "not writable: Read-only file system"
else
    echo "note: unshare -rm is not permitted here; the free-space checks did not run"
fi

# ---- 6. options that contradict each other ----
t=(train "${common[@]}" --quiet --out "$tmp/m")
check min-lr-above 2 "${flexc}" "${t[@]}" --lr 1e-3 --min-lr 2e-3
has min-lr-above-msg "$tmp/err" "flexc: error: --min-lr 0.002 is above --lr 0.001"
check until-0 2 "$flexc" "${t[@]}" --until 0
has until-0-msg "$tmp/err" "flexc: error: --until 0 must be >= 1"
check until-above 2 "$flexc" "${t[@]}" --steps 5 --until 6
has until-above-msg "$tmp/err" "flexc: error: --until 6 is above --steps 5"
check resume-steps-below 2 "$flexc" train --resume --steps 1 --quiet --out "$tmp/r"
has resume-steps-below-msg "$tmp/err" "flexc: error: --resume: --steps 1 is below the checkpoint's step 2"
[[ -e $tmp/m ]] && bad "refused options created --out" || ok
cores=$(nproc)
check threads-above 0 "$flexc" train "${common[@]}" --threads $((cores + 1)) --steps 1 --quiet --out "$tmp/th"
has threads-above-msg "$tmp/err" "flexc: warning: train --threads $((cores + 1)) is more than the $cores cores of this machine"
[[ $(wc -l <"$tmp/err") == 1 ]] && ok || bad "threads-above: not one line: $(cat "$tmp/err")"
# More threads than the process may create: refused as a usage error, not a crash inside OpenMP.
check threads-huge-train 2 "$flexc" train "${common[@]}" --threads 100000 --steps 1 --quiet --out "$tmp/th2"
has threads-huge-train-msg "$tmp/err" "flexc: error: train --threads 100000: thread count 100000 is more than the bound of"
check threads-huge-gen 2 "$flexc" generate --ckpt "$tmp/r" --threads 100000 --tokens 2
has threads-huge-gen-msg "$tmp/err" "flexc: error: generate --threads 100000: thread count 100000 is more than the bound of"
[[ -e $tmp/th2 ]] && bad "threads-huge: the refused run created --out" || ok

# ---- 7. prompts of any size ----
head -c 1000000 /dev/zero | tr '\0' 'x' >"$tmp/big.txt"
check prompt-file 0 "$flexc" generate --ckpt "$tmp/r" --prompt-file "$tmp/big.txt" --tokens 3 --seed 2
[[ $(head -c 1000000 "$tmp/out" | tr -d x | wc -c) == 0 && $(wc -c <"$tmp/out") -gt 1000000 ]] && ok ||
    bad "prompt-file: the prompt was not echoed"
tail -c +1000001 "$tmp/out" >"$tmp/gen-file"
check prompt-stdin 0 bash -c "\"$flexc\" generate --ckpt \"$tmp/r\" --prompt - --tokens 3 --seed 2 < \"$tmp/big.txt\""
tail -c +1000001 "$tmp/out" >"$tmp/gen-stdin"
same prompt-stdin-same "$tmp/gen-file" "$tmp/gen-stdin"
printf 'the quick' >"$tmp/p.txt"
check prompt-small-file 0 "$flexc" generate --ckpt "$tmp/r" --prompt-file "$tmp/p.txt" --tokens 20 --seed 4
cp "$tmp/out" "$tmp/p1"
check prompt-small-arg 0 "$flexc" generate --ckpt "$tmp/r" --prompt "the quick" --tokens 20 --seed 4
same prompt-file-equals-arg "$tmp/p1" "$tmp/out"
check prompt-both 2 "$flexc" generate --ckpt "$tmp/r" --prompt x --prompt-file "$tmp/p.txt"
has prompt-both-msg "$tmp/err" "--prompt and --prompt-file $tmp/p.txt both give the prompt"
printf '\xff' >"$tmp/bad.txt"
check prompt-file-utf8 2 "$flexc" generate --ckpt "$tmp/r" --prompt-file "$tmp/bad.txt"
has prompt-file-utf8-msg "$tmp/err" "--prompt-file is not valid UTF-8: byte 0xff at offset 0"

# ---- 8. messages ----
python3 - "$tmp/r/model.safetensors" "$tmp/i32.safetensors" <<'PY'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
b = open(src, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h["wte"]["dtype"] = "I32"
t = json.dumps(h, separators=(",", ":")).encode()
t += b" " * (-len(t) % 8)
open(dst, "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
PY
check dtype-name 1 "$flexc" generate --ckpt "$tmp/i32.safetensors"
has dtype-name-msg "$tmp/err" "tensor 'wte' has dtype I32, not F32 or BF16"
mk() { # FILE HEADER DATA_BYTES
    python3 -c 'import struct,sys; h=sys.argv[2].encode(); open(sys.argv[1],"wb").write(struct.pack("<Q",len(h))+h+bytes(int(sys.argv[3])))' "$@"
}
mk "$tmp/bidi.safetensors" '{"a\u202eb\u2066c\u200fd":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}' 4
check bidi 0 "$flexc" inspect "$tmp/bidi.safetensors"
has bidi-escaped "$tmp/out" 'a\u202eb\u2066c\u200fd'
lacks bidi-raw "$tmp/out" $'\u202e'
has one-tensor "$tmp/out" "total: 1 tensor, 1 parameter, 4 bytes of data"
# ---- 9. a tokenizer.json far too large is refused from its size, before it is read ----
cp -r "$(dirname "$0")/fixtures/models/llama3_tied" "$tmp/bigtok" && rm "$tmp/bigtok/tokenizer.json"
truncate -s 300M "$tmp/bigtok/tokenizer.json" # sparse: no disk used
start=$(date +%s%N)
check tok-huge 1 t5 "$flexc" tokenize --model "$tmp/bigtok" --text hi
ms=$((($(date +%s%N) - start) / 1000000))
has tok-huge-msg "$tmp/err" "$tmp/bigtok/tokenizer.json: 314572800 bytes, more than the 268435456-byte (256 MiB) limit of a tokenizer.json"
((ms < 2000)) && ok || bad "tok-huge: took $ms ms (the file must not be read)"
finish cli_reliability
