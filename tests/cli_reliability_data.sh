#!/usr/bin/env bash
# Training data that is not text: a Hugging Face model's --data is refused, as a byte-level
# model's is, when it is neither UTF-8 text nor an llm.c token file, naming the offset of the
# first invalid byte (random bytes, a binary, a truncated, overlong or surrogate sequence deep
# in a text), instead of training on U+FFFD noise; --lossy-text accepts such text; UTF-8 text
# and token files train as before.
set -u
flexc=${1:?path to flexc}
source "$(dirname "$0")/lib/checks.sh"
scratch cli_rel_data
hf="${FLEXC_SOURCE_DIR:-$(dirname "$0")/..}/tests/fixtures/models/qwen2_bias"
common=(--model "$hf" --batch 2 --seq 16 --steps 1 --threads 1 --quiet)
neither="is neither UTF-8 text nor an llm.c token file"

# Random bytes (a fixed draw): the first invalid byte is 0xff at offset 3.
printf 'ok \377\376 \001\200\300\301' >"$tmp/random.bin"
head -c 20000 /dev/urandom >>"$tmp/random.bin"
check random 1 "$flexc" train "${common[@]}" --data "$tmp/random.bin" --out "$tmp/r"
has random-msg "$tmp/err" \
    "flexc: error: --data: data file '$tmp/random.bin' $neither: invalid byte 0xff at offset 3 (--lossy-text"
[[ ! -e "$tmp/r/checkpoint.safetensors" ]] && ok || bad "random: a checkpoint was written"

# One bad sequence after 20000 bytes of good text: its offset, whatever the kind.
corpus "$tmp/good.txt" 600
head -c 20000 "$tmp/good.txt" >"$tmp/head.txt"
for kind in truncated:'\342\202' overlong:'\300\257' surrogate:'\355\240\200' stray:'\200' above:'\364\220\200\200'; do
    name=${kind%%:*}
    { cat "$tmp/head.txt"; printf "${kind#*:}"; printf ' and more text\n'; } >"$tmp/$name.txt"
    check "$name" 1 "$flexc" train "${common[@]}" --data "$tmp/$name.txt" --out "$tmp/$name"
    has "$name-msg" "$tmp/err" "at offset 20000 (--lossy-text trains on it with invalid bytes as U+FFFD)"
done

# --lossy-text trains on it (each invalid sequence a U+FFFD), and a resume reads it again
# with the option.
check lossy 0 "$flexc" train "${common[@]}" --data "$tmp/random.bin" --out "$tmp/lossy" --lossy-text
[[ -f "$tmp/lossy/checkpoint.safetensors" ]] && ok || bad "lossy: no checkpoint"
check lossy-resume-refused 1 "$flexc" train --resume --out "$tmp/lossy" --steps 2 --quiet
has lossy-resume-refused-msg "$tmp/err" "$neither: invalid byte 0xff at offset 3"
check lossy-resume 0 "$flexc" train --resume --out "$tmp/lossy" --steps 2 --quiet --lossy-text

# UTF-8 text, multi-byte characters included, and a token file (not UTF-8 itself) train.
{ cat "$tmp/head.txt"; printf 'Caf\303\251, \346\225\260\346\215\256, \360\237\231\202\n'; } >"$tmp/utf8.txt"
check utf8 0 "$flexc" train "${common[@]}" --data "$tmp/utf8.txt" --out "$tmp/utf8"
check tokenize 0 "$flexc" tokenize --model "$hf" "$tmp/utf8.txt" -o "$tmp/utf8.bin" --quiet
check token-file 0 "$flexc" train "${common[@]}" --data "$tmp/utf8.bin" --out "$tmp/tokens"

# flexc's byte-level models: invalid text refused as before, --lossy-text refused (usage).
check preset 1 "$flexc" train --model tiny --steps 1 --quiet --data "$tmp/random.bin" --out "$tmp/p"
has preset-msg "$tmp/err" "data file '$tmp/random.bin' is not UTF-8 text: invalid byte 0xff at offset 3"
check preset-lossy 2 "$flexc" train --model tiny --steps 1 --quiet --data "$tmp/utf8.txt" --out "$tmp/p" --lossy-text
has preset-lossy-msg "$tmp/err" "--lossy-text: only a Hugging Face model's text may hold invalid UTF-8"
check help 0 "$flexc" train --help
has help-lossy "$tmp/out" "--lossy-text"

finish cli_reliability_data
