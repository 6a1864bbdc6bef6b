#!/usr/bin/env bash
# flexc train --deterministic on one process (no MPI needed): the sliced step is independent of
# the thread count, resumes bitwise, and trains like the plain step (within rounding).
set -u
flexc=${1:?path to flexc}
tmp=$(mktemp -d /tmp/flexc_cli_train_dist.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.sh"
losses() { sed -e 's/"tokens_per_s":[^,]*,//' -e 's/"time_s":[^,}]*//' "$1"; }

for i in $(seq 1 200); do
    echo "the quick brown fox $((i % 10)) jumps over the lazy dog."
    ((i % 7 == 0)) && echo "%"
done >"$tmp/corpus.txt"
common=(--model tiny --data "$tmp/corpus.txt" --batch 3 --accum 2 --seq 32 --lr 3e-3 --quiet --steps 6)

"$flexc" train "${common[@]}" --deterministic --threads 1 --out "$tmp/d1" || bad "deterministic, 1 thread"
"$flexc" train "${common[@]}" --deterministic --threads 2 --out "$tmp/d2" || bad "deterministic, 2 threads"
same threads "$tmp/d1/checkpoint.safetensors" "$tmp/d2/checkpoint.safetensors"
"$flexc" train "${common[@]}" --deterministic --threads 1 --until 3 --out "$tmp/r" || bad "first half"
# --deterministic is in the checkpoint: the resume continues with it without being told
"$flexc" train --resume --threads 1 --out "$tmp/r" >"$tmp/r.out" || bad "second half"
grep -q "note: the checkpoint was trained with --deterministic" "$tmp/r.out" && ok || bad "no note on the restored --deterministic"
same resume "$tmp/d1/checkpoint.safetensors" "$tmp/r/checkpoint.safetensors"
losses "$tmp/d1/metrics.jsonl" >"$tmp/a"
losses "$tmp/r/metrics.jsonl" >"$tmp/b"
same resume-losses "$tmp/a" "$tmp/b"
# the plain step: the same training within rounding
"$flexc" train "${common[@]}" --threads 1 --out "$tmp/p" || bad "plain"
if paste -d' ' <(sed 's/.*"loss":\([0-9.e-]*\).*/\1/' "$tmp/p/metrics.jsonl") \
    <(sed 's/.*"loss":\([0-9.e-]*\).*/\1/' "$tmp/d1/metrics.jsonl") |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4 * $1) bad = 1 } END { exit bad }'; then ok; else
    bad "deterministic vs plain losses differ beyond 1e-4"
    paste "$tmp/p/metrics.jsonl" "$tmp/d1/metrics.jsonl" | cut -c1-200
fi
# a plain checkpoint resumed with --deterministic: a clear refusal, nothing written
cp "$tmp/p/checkpoint.safetensors" "$tmp/p.ckpt"
"$flexc" train --resume --deterministic --steps 8 --threads 1 --quiet --out "$tmp/p" 2>"$tmp/conflict.err"
rc=$?
[[ $rc == 2 ]] && ok || bad "resume --deterministic of a plain run: exit $rc, not 2"
grep -q "trained without --deterministic" "$tmp/conflict.err" && ok || bad "conflict message: $(cat "$tmp/conflict.err")"
same conflict-untouched "$tmp/p.ckpt" "$tmp/p/checkpoint.safetensors"
finish cli_train_dist
