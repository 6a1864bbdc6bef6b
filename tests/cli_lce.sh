#!/usr/bin/env bash
# flexc bench lce: option errors, and a tiny run whose JSON carries every reported field.
set -u
flexc=${1:?path to flexc}
tmp=$(mktemp -d /tmp/flexc_cli_lce.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.sh"
out=$tmp/out err=$tmp/err

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
python3 - "$out" <<'PY' && ok || { bad "fused and unfused disagree"; cat "$out"; }
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[0])
ok = abs(r["loss_fused"] - r["loss_unfused"]) <= 1e-5 * abs(r["loss_unfused"]) and r["dh_max_rel_diff"] < 1e-4 and r["dw_max_rel_diff"] < 1e-4
sys.exit(0 if ok else 1)
PY
check tiny-text 0 "$flexc" bench lce --shape 40,16,500 --reps 1 --no-rss --fresh --chunk 7
contains "text names the chunk" "$out" "chunk 7 x 500"

finish cli_lce
