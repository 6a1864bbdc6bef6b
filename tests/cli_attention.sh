#!/usr/bin/env bash
# flexc bench attention: a small custom case prints one JSON line with the documented fields;
# bad options exit 2.
set -u
flexc="$1"
fail=0
out=$("$flexc" bench attention --json --mask sliding --L 300 --H 2 --D 40 --window 50 --reps 1) || { echo "bench failed"; fail=1; }
for f in case B H L D window density flex_ms dense_ms speedup gflops peak_fraction; do
    echo "$out" | grep -q "\"$f\":" || { echo "missing field $f in: $out"; fail=1; }
done
echo "$out" | grep -q '"window":50' || { echo "window not reported: $out"; fail=1; }
out=$("$flexc" bench attention --json --mask causal --L 200 --H 4 --Hkv 2 --reps 1) || { echo "causal failed"; fail=1; }
echo "$out" | grep -q '"window":null' || { echo "window should be null: $out"; fail=1; }
"$flexc" bench attention --mask diagonal --L 100 >/dev/null 2>&1; [ $? -eq 2 ] || { echo "bad mask not rejected"; fail=1; }
"$flexc" bench attention --case nothing >/dev/null 2>&1; [ $? -eq 2 ] || { echo "bad case not rejected"; fail=1; }
"$flexc" bench attention --mask dense --L 64 --H 3 --Hkv 2 >/dev/null 2>&1; [ $? -eq 2 ] || { echo "H % Hkv not rejected"; fail=1; }
exit $fail
