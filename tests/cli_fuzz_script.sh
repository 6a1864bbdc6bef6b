#!/usr/bin/env bash
# scripts/fuzz.sh (make fuzz) fails when a target fails, and passes when every target does.
# Stand-in targets keep this fast; the flexc argument is not needed.
set -u
tmp=$(mktemp -d /tmp/flexc_cli_fuzz_script.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.sh"
fuzz="$(cd "$(dirname "$0")/.." && pwd)/scripts/fuzz.sh"

mkdir "$tmp/pass" "$tmp/fail"
printf '#!/bin/sh\necho "Done 10 runs in 1 second(s)"\nexit 0\n' > "$tmp/pass/fuzz_ok"
printf '#!/bin/sh\necho "==1==ERROR: AddressSanitizer: heap-buffer-overflow"\nexit 1\n' > "$tmp/fail/fuzz_crash"
cp "$tmp/pass/fuzz_ok" "$tmp/fail/fuzz_a_ok"
chmod +x "$tmp"/*/fuzz_*

check fuzz-pass 0 bash "$fuzz" "$tmp/pass" 1
contains fuzz-pass-ran "$tmp/out" "fuzz: fuzz_ok for 1s"
check fuzz-crash 1 bash "$fuzz" "$tmp/fail" 1
contains fuzz-crash-msg "$tmp/out" "fuzz: fuzz_crash failed (exit 1)"
contains fuzz-crash-shown "$tmp/out" "ERROR: AddressSanitizer"
finish cli_fuzz_script
