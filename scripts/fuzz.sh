#!/usr/bin/env bash
# Runs every libFuzzer target built in $1 (files named fuzz_*) for $2 seconds each, starting
# from its seed corpus in tests/fuzz/<target>/ when there is one. Fails on any crash.
set -euo pipefail
build=${1:?build dir}
seconds=${2:-60}
shopt -s nullglob
targets=("$build"/fuzz_*)
if [[ ${#targets[@]} -eq 0 ]]; then
    echo "fuzz: no targets built"
    exit 0
fi
for t in "${targets[@]}"; do
    name=$(basename "$t")
    corpus=$(mktemp -d)
    seeds="tests/fuzz/${name#fuzz_}"
    [[ -d "$seeds" ]] && cp -r "$seeds"/. "$corpus"/
    echo "fuzz: $name for ${seconds}s"
    # The target's status, not the filter's: a pipeline's PIPESTATUS is gone once '|| true' runs.
    status=0
    "$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "$corpus" \
        >"$corpus.log" 2>&1 || status=$?
    grep -E "stat::number_of_executed_units|Done|ERROR|SUMMARY" "$corpus.log" || true
    rm -rf "$corpus" "$corpus.log"
    if [[ $status -ne 0 ]]; then
        echo "fuzz: $name failed (exit $status)"
        exit 1
    fi
done
