#!/usr/bin/env bash
# The command's skeleton: help, version, unknown commands and options.
set -u
flexc=${1:?path to flexc}
tmp=$(mktemp -d /tmp/flexc_cli_basics.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.sh"

check help 0 "$flexc" --help
for c in train generate bench inspect; do contains "help lists $c" "$tmp/out" "^  $c "; done
# The bench line names every case that `flexc bench --help` lists.
"$flexc" bench --help >"$tmp/bench_help"
for c in $(sed -n 's/^  \([a-z]*\) .*/\1/p' "$tmp/bench_help"); do contains "help names bench $c" "$tmp/out" "^  bench .*\b$c\b"; done
check bench-train-help 0 "$flexc" bench train --help
contains bench-train-help-parallel "$tmp/out" "^  --parallel "
check bench-train-parallel-eq 0 "$flexc" bench train --parallel=fsdp --help
contains bench-train-parallel-eq-help "$tmp/out" "^  --comm-timeout "
check version 0 "$flexc" --version
contains version "$tmp/out" "^flexc [0-9]*\.[0-9]*\.[0-9]*$"
check no-args 2 "$flexc"
contains no-args-usage "$tmp/err" "usage: flexc"
check unknown 2 "$flexc" frobnicate
contains unknown-msg "$tmp/err" "flexc: error: unknown command 'frobnicate'"
check bench-unknown 2 "$flexc" bench nothing
check bench-bad-option 2 "$flexc" bench machine --bogus
contains bad-option-msg "$tmp/err" "unknown option '--bogus'"
check bench-bad-int 2 "$flexc" bench machine --gemm 12x
contains bad-int-msg "$tmp/err" "is not an integer"
check bench-help 0 "$flexc" bench machine --help
check bench-machine 0 "$flexc" bench machine --json --gemm 64
contains machine-json "$tmp/out" '"fma_peak_gflops"'
contains machine-json-sync "$tmp/out" '"barrier_us"'
finish cli_basics
