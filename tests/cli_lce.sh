#!/usr/bin/env bash
# flexc bench lce: option errors, and a tiny run whose JSON carries every reported field.
set -u
flexc=${1:?path to flexc}
fails=0; passes=0
out=/tmp/cli_lce_out.$$ err=/tmp/cli_lce_err.$$
check() { # name, expected status, command...
    local name=$1 want=$2; shift 2
    "$@" >"$out" 2>"$err"; local got=$?
    if [[ $got -ne $want ]]; then
        echo "FAIL $name: exit $got, expected $want"; cat "$err"; fails=$((fails+1))
    else
        passes=$((passes+1))
    fi
}
contains() { # name, file, text
    if grep -q -- "$3" "$2"; then passes=$((passes+1)); else echo "FAIL $1: no '$3' in output"; cat "$2"; fails=$((fails+1)); fi
}

check help 0 "$flexc" bench lce --help
contains "help names --shape" "$out" "--shape"
check bad-reps 2 "$flexc" bench lce --reps 0
contains "bad-reps message" "$err" "flexc: error: bench lce: --reps 0"
check bad-shape 2 "$flexc" bench lce --shape 1,2
contains "bad-shape message" "$err" "is not N,D,V"
check bad-shape-zero 2 "$flexc" bench lce --shape 0,2,3
check bad-chunk 2 "$flexc" bench lce --chunk -4
check unknown-option 2 "$flexc" bench lce --bogus

check tiny-json 0 "$flexc" bench lce --json --shape 96,32,1000 --reps 1
for key in '"case":"lce"' '"N":96' '"fused_alloc_bytes"' '"fused_rss_delta_bytes"' '"unfused_rss_delta_bytes"' \
           '"time_ratio"' '"fused_gemm"' '"fused_vs_sgemm"' '"sgemm_gflops"' '"dh_max_rel_diff"'; do
    contains "json $key" "$out" "$key"
done
# The two computations agree.
python3 - "$out" <<'PY' && passes=$((passes+1)) || { echo "FAIL fused and unfused disagree"; cat "$out"; fails=$((fails+1)); }
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[0])
ok = abs(r["loss_fused"] - r["loss_unfused"]) <= 1e-5 * abs(r["loss_unfused"]) and r["dh_max_rel_diff"] < 1e-4 and r["dw_max_rel_diff"] < 1e-4
sys.exit(0 if ok else 1)
PY
check tiny-text 0 "$flexc" bench lce --shape 40,16,500 --reps 1 --no-rss --fresh --chunk 7
contains "text names the chunk" "$out" "chunk 7 x 500"

rm -f "$out" "$err"
echo "cli_lce: $passes passed, $fails failed"
[[ $fails -eq 0 ]]
