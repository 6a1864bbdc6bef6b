#!/usr/bin/env bash
# The command's skeleton: help, version, unknown commands and options.
set -u
flexc=${1:?path to flexc}
fails=0; passes=0
check() { # name, expected status, command...
    local name=$1 want=$2; shift 2
    "$@" >/tmp/cli_out.$$ 2>/tmp/cli_err.$$; local got=$?
    if [[ $got -ne $want ]]; then
        echo "FAIL $name: exit $got, expected $want"; cat /tmp/cli_err.$$; fails=$((fails+1))
    else
        passes=$((passes+1))
    fi
}
contains() { # name, file, text
    if grep -q -- "$3" "$2"; then passes=$((passes+1)); else echo "FAIL $1: no '$3' in output"; cat "$2"; fails=$((fails+1)); fi
}

check help 0 "$flexc" --help
for c in train generate bench inspect; do contains "help lists $c" /tmp/cli_out.$$ "^  $c "; done
check version 0 "$flexc" --version
contains version /tmp/cli_out.$$ "^flexc [0-9]*\.[0-9]*\.[0-9]*$"
check no-args 2 "$flexc"
contains no-args-usage /tmp/cli_err.$$ "usage: flexc"
check unknown 2 "$flexc" frobnicate
contains unknown-msg /tmp/cli_err.$$ "flexc: error: unknown command 'frobnicate'"
check bench-unknown 2 "$flexc" bench nothing
check bench-bad-option 2 "$flexc" bench machine --bogus
contains bad-option-msg /tmp/cli_err.$$ "unknown option '--bogus'"
check bench-bad-int 2 "$flexc" bench machine --gemm 12x
contains bad-int-msg /tmp/cli_err.$$ "is not an integer"
check bench-help 0 "$flexc" bench machine --help
check bench-machine 0 "$flexc" bench machine --json --gemm 64
contains machine-json /tmp/cli_out.$$ '"fma_peak_gflops"'
rm -f /tmp/cli_out.$$ /tmp/cli_err.$$
echo "$passes passed, $fails failed"
[[ $fails -eq 0 ]]
