#!/usr/bin/env bash
# flexc bench attention: a sliding-window case also prints the backward line with its fields.
set -u
flexc="$1"
fail=0
out=$("$flexc" bench attention --json --mask sliding --L 300 --H 4 --Hkv 2 --D 40 --window 50 --reps 1) || {
    echo "bench failed"; fail=1; }
line=$(echo "$out" | grep '"case":"custom_backward"') || { echo "no backward line in: $out"; fail=1; }
for f in B H Hkv L D window density fwd_ms bwd_ms bwd_over_fwd bwd_gflops peak_gflops bwd_peak_fraction deterministic; do
    echo "$line" | grep -q "\"$f\":" || { echo "missing field $f in: $line"; fail=1; }
done
echo "$line" | grep -q '"Hkv":2' || { echo "Hkv not reported: $line"; fail=1; }
out=$("$flexc" bench attention --json --mask causal --L 200 --reps 1) || { echo "causal failed"; fail=1; }
echo "$out" | grep -q '_backward' && { echo "backward line for a non-sliding case: $out"; fail=1; }
exit $fail
