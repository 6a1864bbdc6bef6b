#!/usr/bin/env bash
# flexc train / generate / bench train end to end on a small corpus: the loss falls, a
# resumed run equals an uninterrupted one, 1 and 2 threads agree bitwise, generation is
# deterministic, and bad input gets a clear error without touching existing files.
set -u
flexc=${1:?path to flexc}
tmp=$(mktemp -d /tmp/flexc_cli_train.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.sh"
# metrics.jsonl without the timing fields, which differ from run to run
losses() { sed -e 's/"tokens_per_s":[^,]*,//' -e 's/"time_s":[^,}]*//' "$1"; }

# A small corpus: sentences with a pattern to learn, fortune-style separators.
for i in $(seq 1 300); do
    echo "the quick brown fox $((i % 10)) jumps over the lazy dog."
    (( i % 7 == 0 )) && echo "%"
done > "$tmp/corpus.txt"
common=(--model tiny --data "$tmp/corpus.txt" --batch 4 --seq 32 --lr 3e-3 --quiet)

# ---- training: the loss falls; metrics have the required fields ----
check train 0 "$flexc" train "${common[@]}" --steps 40 --out "$tmp/a" --threads 1
for f in checkpoint.safetensors model.safetensors metrics.jsonl; do
    [[ -f "$tmp/a/$f" ]] && ok || bad "train: no $f"
done
contains metrics-fields "$tmp/a/metrics.jsonl" '"step":40,"loss":[0-9.e-]*,"lr":[0-9.e-]*,"grad_norm":[0-9.e-]*,"tokens_per_s":[0-9.]*,"time_s":[0-9.]*,"val_loss":'
first=$(head -1 "$tmp/a/metrics.jsonl" | sed 's/.*"loss":\([0-9.e-]*\).*/\1/')
last=$(grep val_loss "$tmp/a/metrics.jsonl" | tail -1 | sed 's/.*"val_loss":\([0-9.e-]*\).*/\1/')
if awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }'; then ok; else
    bad "loss-falls: first loss $first, last validation loss $last"; fi

# ---- resume: 20 steps == 10 steps + 10 resumed, loss for loss, weight for weight ----
check straight 0 "$flexc" train "${common[@]}" --steps 20 --out "$tmp/s" --threads 1
check first-half 0 "$flexc" train "${common[@]}" --steps 20 --until 10 --out "$tmp/r" --threads 1
check second-half 0 "$flexc" train --resume --out "$tmp/r" --threads 1 --quiet
losses "$tmp/s/metrics.jsonl" > "$tmp/s.l"; losses "$tmp/r/metrics.jsonl" > "$tmp/r.l"
same resume-losses "$tmp/s.l" "$tmp/r.l"
same resume-model "$tmp/s/model.safetensors" "$tmp/r/model.safetensors"
same resume-checkpoint "$tmp/s/checkpoint.safetensors" "$tmp/r/checkpoint.safetensors"

# The same with bfloat16 Adam moments; a float32 checkpoint cannot switch to them.
check straight-bf16 0 "$flexc" train "${common[@]}" --steps 8 --adam-bf16 --out "$tmp/sb" --threads 1
check first-bf16 0 "$flexc" train "${common[@]}" --steps 8 --until 4 --adam-bf16 --out "$tmp/rb" --threads 1
check second-bf16 0 "$flexc" train --resume --out "$tmp/rb" --threads 1 --quiet
same resume-bf16 "$tmp/sb/checkpoint.safetensors" "$tmp/rb/checkpoint.safetensors"
check resume-switch 2 "$flexc" train --resume --adam-bf16 --out "$tmp/r" --quiet
# bfloat16 matrix products (--dtype bf16): the loss falls, stays within 2% of float32's
# after the same 20 steps, 1 and 2 threads agree bitwise, and a resumed run equals an
# uninterrupted one (the weights' bf16 copy is rebuilt from the checkpoint's float32 ones).
lastloss() { tail -n 1 "$1" | sed 's/.*"loss":\([0-9.e-]*\).*/\1/'; }
check bf16-straight 0 "$flexc" train "${common[@]}" --steps 20 --dtype bf16 --out "$tmp/h" --threads 1
contains bf16-metrics "$tmp/h/metrics.jsonl" '"step":20,.*"dtype":"bf16"}'
contains f32-metrics "$tmp/s/metrics.jsonl" '"step":20,.*"dtype":"f32"}'
first=$(head -1 "$tmp/h/metrics.jsonl" | sed 's/.*"loss":\([0-9.e-]*\).*/\1/')
lb=$(lastloss "$tmp/h/metrics.jsonl"); lf=$(lastloss "$tmp/s/metrics.jsonl")
if awk -v a="$first" -v b="$lb" 'BEGIN { exit !(b < a - 1.0) }'; then ok; else
    bad "bf16-loss-falls: first loss $first, last $lb"; fi
if awk -v b="$lb" -v f="$lf" 'BEGIN { d = b - f; if (d < 0) d = -d; exit !(d <= 0.02 * f && b != f) }'; then ok; else
    bad "bf16-near-f32: loss after 20 steps $lb (bf16) vs $lf (f32): not within 2%, or equal"; fi
check bf16-threads2 0 "$flexc" train "${common[@]}" --steps 20 --dtype bf16 --out "$tmp/h2" --threads 2
same bf16-threads "$tmp/h/checkpoint.safetensors" "$tmp/h2/checkpoint.safetensors"
check bf16-first-half 0 "$flexc" train "${common[@]}" --steps 20 --until 10 --dtype bf16 --out "$tmp/hr" --threads 1
check bf16-second-half 0 "$flexc" train --resume --out "$tmp/hr" --threads 1 --quiet
losses "$tmp/h/metrics.jsonl" > "$tmp/h.l"; losses "$tmp/hr/metrics.jsonl" > "$tmp/hr.l"
same bf16-resume-losses "$tmp/h.l" "$tmp/hr.l"
same bf16-resume-checkpoint "$tmp/h/checkpoint.safetensors" "$tmp/hr/checkpoint.safetensors"
check bf16-resume-same 0 "$flexc" train --resume --dtype bf16 --steps 21 --out "$tmp/hr" --threads 1 --quiet
check bf16-resume-switch 2 "$flexc" train --resume --dtype f32 --out "$tmp/hr" --quiet
contains bf16-resume-switch-msg "$tmp/err" "the checkpoint was trained with --dtype bf16, not f32"
check f32-resume-switch 2 "$flexc" train --resume --dtype bf16 --out "$tmp/r" --quiet
contains f32-resume-switch-msg "$tmp/err" "the checkpoint was trained with --dtype f32, not bf16"
check bad-dtype 2 "$flexc" train "${common[@]}" --dtype fp16 --out "$tmp/e-dt"
contains bad-dtype-msg "$tmp/err" "--dtype fp16: expected f32 or bf16"
check bad-dtype-empty 2 "$flexc" train "${common[@]}" --dtype "" --out "$tmp/e-dt"
check bf16-deterministic 2 "$flexc" train "${common[@]}" --dtype bf16 --deterministic --out "$tmp/e-dt"
contains bf16-deterministic-msg "$tmp/err" "--dtype bf16 does not go with --deterministic"
[[ ! -e "$tmp/e-dt" ]] && ok || bad "refused --dtype left $tmp/e-dt behind"
# The schedule, the optimizer's settings and the seed come from the checkpoint: a different
# value is refused (not ignored) and the checkpoint is left alone; the same value is accepted.
cp "$tmp/r/checkpoint.safetensors" "$tmp/r.ck"
for opt in "--min-lr 0.5" "--weight-decay 0.7" "--clip 0" "--seed 9"; do
    check "resume-refuses${opt% *}" 2 "$flexc" train --resume --out "$tmp/r" $opt --quiet
    contains "resume-refuses${opt% *}-msg" "$tmp/err" "the checkpoint was trained with ${opt% *} "
done
same resume-refused-untouched "$tmp/r.ck" "$tmp/r/checkpoint.safetensors"
check resume-same-values 0 "$flexc" train --resume --out "$tmp/r" --lr 3e-3 --min-lr 3e-4 --weight-decay 0.1 \
    --clip 1 --seed 1337 --threads 1 --quiet

# Progress off a terminal: the first step, every --log-every steps (as given, even above 50)
# and the evaluations.
check log-every 0 "$flexc" train --model tiny --data "$tmp/corpus.txt" --batch 2 --seq 16 --steps 60 --eval-every 0 \
    --log-every 100 --out "$tmp/log" --threads 1
[[ $(grep -c '^step ' "$tmp/out") == 2 ]] && ok || bad "log-every: $(grep -c '^step ' "$tmp/out") progress lines, not 2"
contains log-every-first "$tmp/out" "^step 1/60 "
contains log-every-last "$tmp/out" "^step 60/60 .*val_loss"

# A closed output pipe stops the run after the step, with the checkpoint saved, and fails
# (it killed the run mid-step, leaving only the last --save-every checkpoint).
"$flexc" train --model tiny --data "$tmp/corpus.txt" --batch 2 --seq 16 --steps 100000 --eval-every 0 \
    --log-every 1 --threads 1 --out "$tmp/pipe" 2>"$tmp/pipe.err" | head -1 >/dev/null
rc=${PIPESTATUS[0]}
[[ $rc == 1 ]] && ok || bad "pipe: exit $rc, not 1"
has pipe-message "$tmp/pipe.err" "flexc: error: cannot write the output"
check pipe-resume 0 "$flexc" train --resume --out "$tmp/pipe" --until 1 --quiet --threads 1

# Recomputing activations changes memory, not results.
check recompute 0 "$flexc" train "${common[@]}" --steps 20 --recompute --out "$tmp/rc" --threads 1
same recompute-same "$tmp/s/checkpoint.safetensors" "$tmp/rc/checkpoint.safetensors"
# With one sequence per step, a layer's activations fit in the gradient memory of the layer
# below: parked instead of recomputed, with the same results (and at 2 threads as at 1).
one=(--model tiny --data "$tmp/corpus.txt" --batch 1 --seq 32 --lr 3e-3 --quiet --steps 6)
check straight-b1 0 "$flexc" train "${one[@]}" --out "$tmp/s1" --threads 1
check recompute-b1 0 "$flexc" train "${one[@]}" --recompute --out "$tmp/rc1" --threads 2
same recompute-parked-same "$tmp/s1/checkpoint.safetensors" "$tmp/rc1/checkpoint.safetensors"

# ---- 1 and 2 threads agree bitwise, for each attention mask ----
for attn in causal document sliding:8 dense; do
    check "t1-$attn" 0 "$flexc" train "${common[@]}" --steps 3 --attn "$attn" --out "$tmp/t1-$attn" --threads 1
    check "t2-$attn" 0 "$flexc" train "${common[@]}" --steps 3 --attn "$attn" --out "$tmp/t2-$attn" --threads 2
    same "threads-$attn" "$tmp/t1-$attn/model.safetensors" "$tmp/t2-$attn/model.safetensors"
done

# ---- generation: deterministic for a seed, streams the prompt first ----
check gen1 0 "$flexc" generate --ckpt "$tmp/a" --prompt "the quick" --tokens 40 --seed 5
cp "$tmp/out" "$tmp/gen1"
check gen2 0 "$flexc" generate --ckpt "$tmp/a" --prompt "the quick" --tokens 40 --seed 5 --threads 1
same gen-deterministic "$tmp/gen1" "$tmp/out"
contains gen-prompt "$tmp/gen1" "^the quick"
check gen-file 0 "$flexc" generate --ckpt "$tmp/a/checkpoint.safetensors" --tokens 10 --temperature 0
check gen-document 0 "$flexc" generate --ckpt "$tmp/t1-document" --tokens 20 --seed 2
check gen-sliding 0 "$flexc" generate --ckpt "$tmp/t1-sliding:8" --tokens 40 --seed 2
check train-bf16 0 "$flexc" train "${common[@]}" --steps 2 --out "$tmp/bf" --bf16
check gen-bf16 0 "$flexc" generate --ckpt "$tmp/bf" --tokens 10

# ---- bad input ----
check missing-data 1 "$flexc" train "${common[@]}" --data "$tmp/nope.txt" --out "$tmp/e1"
contains missing-data-msg "$tmp/err" "flexc: error: --data: cannot open '$tmp/nope.txt'"
: > "$tmp/empty.txt"
check empty-data 1 "$flexc" train "${common[@]}" --data "$tmp/empty.txt" --out "$tmp/e2"
contains empty-data-msg "$tmp/err" "is empty"
printf 'abc\xff\xfedef' > "$tmp/latin.txt"
check non-utf8-data 1 "$flexc" train "${common[@]}" --data "$tmp/latin.txt" --out "$tmp/e3"
contains non-utf8-data-msg "$tmp/err" "not UTF-8 text: invalid byte 0xff at offset 3"
echo hi > "$tmp/hi.txt"
check tiny-data 1 "$flexc" train "${common[@]}" --data "$tmp/hi.txt" --out "$tmp/e4"
contains tiny-data-msg "$tmp/err" "holds 4 tokens; training needs at least 66"
check dir-data 1 "$flexc" train "${common[@]}" --data "$tmp" --out "$tmp/e4"
contains dir-data-msg "$tmp/err" "is not a regular file"
touch "$tmp/afile"
check unwritable-out 1 "$flexc" train "${common[@]}" --out "$tmp/afile/sub"
contains unwritable-msg "$tmp/err" "--out $tmp/afile/sub"
check seq-too-long 2 "$flexc" train "${common[@]}" --seq 65 --out "$tmp/e5"
contains seq-msg "$tmp/err" "the model's context is 64 tokens"
check bad-attn 2 "$flexc" train "${common[@]}" --attn sliding:x --out "$tmp/e6"
check bad-model 2 "$flexc" train --model huge --out "$tmp/e7"
check bad-heads 2 "$flexc" train --model tiny --heads 3 --out "$tmp/e8"
check exists 2 "$flexc" train "${common[@]}" --steps 2 --out "$tmp/a"
contains exists-msg "$tmp/err" "pass --resume"
check resume-mismatch 2 "$flexc" train --resume --out "$tmp/a" --dim 128 --quiet
contains mismatch-msg "$tmp/err" "trained with --dim 64"
check resume-none 1 "$flexc" train --resume --out "$tmp/e9"
# A corrupt checkpoint: a clear error, and nothing is overwritten.
cp "$tmp/a/checkpoint.safetensors" "$tmp/ck.bak"
head -c 1000 "$tmp/ck.bak" > "$tmp/a/checkpoint.safetensors"
cp "$tmp/a/checkpoint.safetensors" "$tmp/ck.cut"; cp "$tmp/a/model.safetensors" "$tmp/model.bak"
cp "$tmp/a/metrics.jsonl" "$tmp/metrics.bak"
check corrupt-resume 1 "$flexc" train --resume --out "$tmp/a" --quiet
contains corrupt-msg "$tmp/err" "flexc: error: --resume:"
same corrupt-untouched "$tmp/ck.cut" "$tmp/a/checkpoint.safetensors"
same corrupt-model-untouched "$tmp/model.bak" "$tmp/a/model.safetensors"
same corrupt-metrics-untouched "$tmp/metrics.bak" "$tmp/a/metrics.jsonl"
check corrupt-generate 1 "$flexc" generate --ckpt "$tmp/a/checkpoint.safetensors"
printf 'not a model' > "$tmp/junk.safetensors"
check junk-generate 1 "$flexc" generate --ckpt "$tmp/junk.safetensors"
check gen-no-ckpt 2 "$flexc" generate --prompt hi
check gen-missing-ckpt 1 "$flexc" generate --ckpt "$tmp/nothing"
check gen-bad-prompt 2 "$flexc" generate --ckpt "$tmp/s" --prompt $'caf\xe9'
contains bad-prompt-msg "$tmp/err" "--prompt is not valid UTF-8: byte 0xe9 at offset 3"
check gen-bad-temp 2 "$flexc" generate --ckpt "$tmp/s" --temperature -1

# ---- the benchmark runs and reports both variants ----
check bench 0 "$flexc" bench train --model tiny --batch 2 --seq 32 --steps 1 --json
contains bench-json "$tmp/out" '"speedup":'
contains bench-mem "$tmp/out" '"memory_ratio":'
check bench-bf16 0 "$flexc" bench train --model tiny --batch 2 --seq 32 --steps 1 --dtype bf16 --json
contains bench-bf16-json "$tmp/out" '"dtype":"bf16","baseline":"flex+fused f32".*"speedup":'
check bench-bad-dtype 2 "$flexc" bench train --model tiny --dtype f16
contains bench-bad-dtype-msg "$tmp/err" "--dtype f16: expected f32 or bf16"

finish cli_train
