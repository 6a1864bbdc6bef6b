#!/usr/bin/env bash
# The command against bad input: each bad value on the command line is refused with a
# one-line error that names it and the usage exit status (2), before any file is written;
# output that cannot be written, and interruptions, leave nothing half done or unreported.
set -u
flexc=${1:?path to flexc}
source "$(dirname "$0")/lib/checks.sh"
scratch cli_args 100
common=(--model tiny --data "$tmp/corpus.txt" --batch 2 --seq 16 --quiet --threads 1)

# -1 is a value like any other, not "use the default".
for opt in --steps --batch --seq --accum --warmup --until --layers --dim --heads --kv-heads --eval-every \
    --log-every; do
    check "train $opt -1" 2 "$flexc" train "${common[@]}" --steps 2 "$opt" -1 --out "$tmp/neg"
    contains "train $opt -1 message" "$tmp/err" "^flexc: error: .*-1"
    [[ -e "$tmp/neg" ]] && { bad "train $opt -1 created --out"; rm -rf "$tmp/neg"; } || ok
done

# On resume, a --steps below 1 would be saved in the checkpoint and make it unreadable.
check resume-base 0 "$flexc" train "${common[@]}" --steps 4 --until 2 --out "$tmp/r"
cp "$tmp/r/checkpoint.safetensors" "$tmp/r.ckpt"
for n in 0 -7; do
    check "resume --steps $n" 2 "$flexc" train --resume --steps "$n" --out "$tmp/r" --quiet
    contains "resume --steps $n message" "$tmp/err" "^flexc: error: --steps $n must be >= 1"
    same "resume --steps $n untouched" "$tmp/r.ckpt" "$tmp/r/checkpoint.safetensors"
done
check resume-after 0 "$flexc" train --resume --out "$tmp/r" --quiet --threads 1

# --threads is checked whole, not cut to an int (4294967297 would become 1).
for n in -1 4294967297 9223372036854775807; do
    check "train --threads $n" 2 "$flexc" train "${common[@]}" --steps 2 --threads "$n" --out "$tmp/th"
    contains "train --threads $n message" "$tmp/err" "^flexc: error: train --threads $n "
    check "generate --threads $n" 2 "$flexc" generate --ckpt "$tmp/r" --threads "$n"
    contains "generate --threads $n message" "$tmp/err" "^flexc: error: generate --threads $n "
    check "bench train --threads $n" 2 "$flexc" bench train --model tiny --steps 1 --threads "$n"
    contains "bench train --threads $n message" "$tmp/err" "^flexc: error: bench train --threads $n "
done
[[ -e "$tmp/th" ]] && bad "--threads: created --out" || ok

# Output that cannot be written is an error, not a success with the text lost.
if [[ -w /dev/full ]]; then
    "$flexc" inspect "$tmp/r/model.safetensors" > /dev/full 2> "$tmp/err"; rc=$?
    [[ $rc -eq 1 ]] && ok || bad "inspect > /dev/full: exit $rc, expected 1"
    contains full-inspect-msg "$tmp/err" "^flexc: error: cannot write the output: No space left on device"
    "$flexc" inspect --json "$tmp/r/model.safetensors" > /dev/full 2> "$tmp/err"; rc=$?
    [[ $rc -eq 1 ]] && ok || bad "inspect --json > /dev/full: exit $rc, expected 1"
    "$flexc" generate --ckpt "$tmp/r" --tokens 5 > /dev/full 2> "$tmp/err"; rc=$?
    [[ $rc -eq 1 ]] && ok || bad "generate > /dev/full: exit $rc, expected 1"
    "$flexc" --help > /dev/full 2> "$tmp/err"; rc=$?
    [[ $rc -eq 1 ]] && ok || bad "--help > /dev/full: exit $rc, expected 1"
fi

# bench attention's custom case: sizes whose products overflow int64 are refused up front.
check bench-attn-huge 2 "$flexc" bench attention --mask causal --L 4611686018427387904 --reps 1
contains bench-attn-huge-msg "$tmp/err" "^flexc: error: bench attention: custom case .*--L 4611686018427387904 "
check bench-attn-huge-B 2 "$flexc" bench attention --mask causal --L 1024 --B 1152921504606846976 --H 16 --reps 1

# Each refused value is named in the message.
msg() { # NAME EXPECTED-MESSAGE ARGS...: exit 2 and the message
    local name=$1 want=$2
    shift 2
    check "$name" 2 "$flexc" "$@"
    has "$name message" "$tmp/err" "flexc: error: $want"
}
t=(train "${common[@]}" --out "$tmp/m")
msg steps-0 "--steps 0 must be >= 1" "${t[@]}" --steps 0
msg batch-0 "--batch 0 is outside [1, 65536]" "${t[@]}" --batch 0
msg batch-big "--batch 65537 is outside [1, 65536]" "${t[@]}" --batch 65537
msg accum-0 "--accum 0 is outside [1, 65536]" "${t[@]}" --accum 0
msg warmup-neg "--warmup -3 must be >= 0" "${t[@]}" --warmup -3
msg lr-0 "--lr 0 must be > 0" "${t[@]}" --lr 0
msg lr-tiny "--lr 1e-50 must be > 0" "${t[@]}" --lr 1e-50
msg lr-neg "--lr -0.5 must be > 0" "${t[@]}" --lr -0.5
msg min-lr-neg "--min-lr -1 must be >= 0" "${t[@]}" --min-lr -1
msg wd-neg "--weight-decay -0.1 must be >= 0" "${t[@]}" --weight-decay -0.1
msg clip-neg "--clip -2 must be >= 0" "${t[@]}" --clip -2
msg save-every-neg "--save-every -2 must be >= 0" "${t[@]}" --save-every -2
msg eval-every-neg "--eval-every -2 must be >= 0" "${t[@]}" --eval-every -2
msg eval-batches-0 "--eval-batches 0 must be >= 1" "${t[@]}" --eval-batches 0
msg log-every-0 "--log-every 0 must be >= 1" "${t[@]}" --log-every 0
msg until-neg "--until -2 must be >= 1" "${t[@]}" --until -2
msg seed-neg "--seed -1 must be >= 0" "${t[@]}" --seed -1
msg out-empty "--out: the directory name is empty" train "${common[@]}" --out ""
msg comm-log-alone "--comm-log $tmp/c.log: there are no collectives to record without --parallel" "${t[@]}" \
    --comm-log "$tmp/c.log"
msg resume-force "--resume continues the checkpoint in --out and --force starts over" train --resume --force \
    --out "$tmp/r" --quiet
[[ -e "$tmp/m" ]] && bad "refused options created --out" || ok
g=(generate --ckpt "$tmp/r")
msg tokens-neg "generate: --tokens -1 is outside [0, 10000000]" "${g[@]}" --tokens -1
msg tokens-big "generate: --tokens 10000001 is outside [0, 10000000]" "${g[@]}" --tokens 10000001
msg top-k-neg "generate: --top-k -5 must be >= 0" "${g[@]}" --top-k -5
msg temp-neg "generate: --temperature -0.5 must be >= 0" "${g[@]}" --temperature -0.5

# The largest seed a checkpoint can hold resumes.
check seed-max 0 "$flexc" train "${common[@]}" --steps 2 --until 1 --seed 9223372036854775807 --out "$tmp/sd"
check seed-max-resume 0 "$flexc" train --resume --out "$tmp/sd" --quiet --threads 1

# metrics.jsonl that cannot be written stops the run with an error (it went on, losing them),
# after saving the checkpoint of the step done.
if [[ -w /dev/full ]]; then
    mkdir "$tmp/mf" && ln -s /dev/full "$tmp/mf/metrics.jsonl"
    check metrics-full 1 "$flexc" train "${common[@]}" --steps 3 --out "$tmp/mf"
    contains metrics-full-msg "$tmp/err" "^flexc: error: cannot write $tmp/mf/metrics.jsonl: No space left on device"
    rm "$tmp/mf/metrics.jsonl"
    check metrics-full-resume 0 "$flexc" train --resume --out "$tmp/mf" --quiet --threads 1 --until 2
    contains metrics-full-saved "$tmp/mf/metrics.jsonl" "^{\"step\":2,"
fi

# A run that fails before writing anything leaves no --out directory behind (it left an empty
# one, and its missing parents).
check out-unmade 1 "$flexc" train "${common[@]}" --steps 2 --data "$tmp/missing.txt" --out "$tmp/new/sub/dir"
[[ -e "$tmp/new" ]] && bad "out-unmade: $tmp/new left behind" || ok
mkdir "$tmp/keep"
check out-kept 1 "$flexc" train "${common[@]}" --steps 2 --data "$tmp/missing.txt" --out "$tmp/keep/sub"
[[ -d "$tmp/keep" && ! -e "$tmp/keep/sub" ]] && ok || bad "out-kept: $tmp/keep removed or $tmp/keep/sub left"
check out-unmade-nan 1 "$flexc" train "${common[@]}" --steps 2 --lr 1e30 --out "$tmp/nan"
[[ -f "$tmp/nan/metrics.jsonl" ]] && ok || bad "out-unmade-nan: the metrics of the failed run were removed"

# --out naming a file says so.
touch "$tmp/afile"
check out-file 1 "$flexc" train "${common[@]}" --steps 2 --out "$tmp/afile"
contains out-file-msg "$tmp/err" "^flexc: error: --out $tmp/afile: cannot create the directory: Not a directory"

# bench train names the refused value; a vocabulary its uint16 tokens cannot hold is a usage
# error that says so (it said "out of memory").
msg bench-seq "bench train: --seq 65 is outside [1, 64]" bench train --model tiny --seq 65
msg bench-batch "bench train: --batch 0 is outside [1, 4096]" bench train --model tiny --batch 0
msg bench-steps "bench train: --steps 65 is outside [1, 64]" bench train --model tiny --steps 65
msg bench-vocab "bench train: --vocab 70000 is outside [2, 65535]" bench train --model tiny --steps 1 --vocab 70000

# bench safetensors stopped by SIGTERM (a background job ignores SIGINT): its file is removed,
# not left in the directory.
mkdir "$tmp/bs"
"$flexc" bench safetensors --size-mib 64 --tensors 16 --reps 64 --dir "$tmp/bs" > /dev/null 2>&1 &
job=$!
# the file under its final name: the timed runs (seconds) have begun
for _ in $(seq 500); do compgen -G "$tmp/bs/flexc-bench-*.safetensors" > /dev/null && break; sleep 0.02; done
kill -TERM $job
wait $job
rc=$?
[[ $rc == 143 ]] && ok || bad "bench safetensors interrupted: exit $rc, expected 143"
[[ -z $(ls -A "$tmp/bs") ]] && ok || bad "bench safetensors interrupted: left $(ls -A "$tmp/bs")"

msg bench-attn-reps "bench attention: --reps -1 is outside [0, 64] (0: by size)" bench attention --reps -1

# bench safetensors times at most 64 pairs; it accepted up to 1000 and reported that many.
msg bench-st-reps "bench safetensors: --reps 65 is outside [1, 64]" bench safetensors --size-mib 1 --reps 65
msg bench-st-size "bench safetensors: --size-mib 0 is outside [1, 65536]" bench safetensors --size-mib 0
# An empty --dir put the file in /.
msg bench-st-dir "bench safetensors: --dir is empty" bench safetensors --size-mib 1 --dir ""

# A window too large for an integer was clamped to INT64_MAX without a word.
msg sliding-overflow "--attn: attention 'sliding:99999999999999999999': the window after 'sliding:' must be an integer >= 1" "${t[@]}" \
    --attn sliding:99999999999999999999

# On resume, --model (with --layers, --dim, --heads, --kv-heads) must name the checkpoint's
# model; the refusal names the first field that differs with both values.
check resume-model-base 0 "$flexc" train "${common[@]}" --steps 4 --until 2 --out "$tmp/rm"
check resume-model-kv 2 "$flexc" train --resume --model tiny --kv-heads 4 --out "$tmp/rm" --quiet
has resume-model-kv-msg "$tmp/err" "holds a model with 2 layers, dim 64, 4/2 heads, context 64, not --model tiny (its kv_heads is 2, --model tiny's 4)"
check resume-model-small 2 "$flexc" train --resume --model small --out "$tmp/rm" --quiet
has resume-model-small-msg "$tmp/err" "(its ctx is 64, --model small's 256)"
check resume-model-same 0 "$flexc" train --resume --model tiny --layers 2 --out "$tmp/rm" --quiet --threads 1

finish cli_args
