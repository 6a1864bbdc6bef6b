#!/usr/bin/env bash
# flexc inspect: valid files and indexes (text and --json), invalid ones (exit 1 with the
# reason), usage errors (exit 2), and the safetensors benchmark on a small file.
set -u
flexc=${1:?path to flexc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.sh"
# mkfile PATH HEADER DATA_BYTES: 8-byte little-endian length, header, data
mkfile() {
    local n=${#2} le="" i
    for ((i = 0; i < 8; i++)); do le+=$(printf '\\x%02x' $(((n >> (8 * i)) & 255))); done
    { printf "$le"; printf '%s' "$2"; head -c "$3" /dev/zero; } >"$1"
}

f="$tmp/model.safetensors"
mkfile "$f" '{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"BF16","shape":[3],"data_offsets":[24,30]}}' 30
check valid 0 "$flexc" inspect "$f"
has valid-meta "$tmp/out" "format: pt"
has valid-header "$tmp/out" "name"
has valid-row "$tmp/out" "w     F32      [2, 3]"
has valid-row2 "$tmp/out" "BF16"
has valid-total "$tmp/out" "total: 2 tensors, 9 parameters, 30 bytes of data"
check json 0 "$flexc" inspect "$f" --json
has json-name "$tmp/out" '"name":"w","dtype":"F32","shape":[2,3],"bytes":24,"offset":0'
has json-totals "$tmp/out" '"totals":{"tensors":2,"parameters":9,"bytes":30}'
if command -v python3 >/dev/null; then
    cp "$tmp/out" "$tmp/inspect.json"
    check json-parses 0 python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["metadata"]=={"format":"pt"}' "$tmp/inspect.json"
fi

# Names are printed with control bytes escaped.
mkfile "$tmp/esc.safetensors" '{"\u001b[2Jx":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}' 1
check escaped 0 "$flexc" inspect "$tmp/esc.safetensors"
has escaped-name "$tmp/out" '\x1b[2Jx'
lacks escaped-raw "$tmp/out" $'\x1b'

# Invalid files: exit 1, "flexc: error: FILE: reason".
mkfile "$tmp/bad.safetensors" '{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}}' 20
check invalid 1 "$flexc" inspect "$tmp/bad.safetensors"
has invalid-msg "$tmp/err" "flexc: error: $tmp/bad.safetensors: tensor 'w': data_offsets [0, 20) hold 20 bytes but F32 shape needs 24"
mkfile "$tmp/overlap.safetensors" '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}' 6
check overlap 1 "$flexc" inspect "$tmp/overlap.safetensors"
has overlap-msg "$tmp/err" "overlap tensor 'a'"
printf 'abc' >"$tmp/short.safetensors"
check short 1 "$flexc" inspect "$tmp/short.safetensors" --json
has short-msg "$tmp/err" "flexc: error: $tmp/short.safetensors: file is 3 bytes"
check missing 1 "$flexc" inspect "$tmp/nope.safetensors"
has missing-msg "$tmp/err" "flexc: error: $tmp/nope.safetensors: cannot open"

# Usage errors.
check no-file 2 "$flexc" inspect
check two-files 2 "$flexc" inspect "$f" "$f"
check bad-option 2 "$flexc" inspect "$f" --bogus
check help 0 "$flexc" inspect --help

# A sharded checkpoint.
mkdir "$tmp/sharded"
mkfile "$tmp/sharded/m-1.safetensors" '{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}' 4
mkfile "$tmp/sharded/m-2.safetensors" '{"b":{"dtype":"I64","shape":[1,1],"data_offsets":[0,8]}}' 8
printf '{"metadata":{"total_size":12},"weight_map":{"a":"m-1.safetensors","b":"m-2.safetensors"}}' >"$tmp/sharded/model.safetensors.index.json"
check index 0 "$flexc" inspect "$tmp/sharded/model.safetensors.index.json"
has index-shard "$tmp/out" "m-2.safetensors"
has index-total "$tmp/out" "total: 2 tensors in 2 shards, 3 parameters, 12 bytes of data"
check index-json 0 "$flexc" inspect "$tmp/sharded/model.safetensors.index.json" --json
has index-json-row "$tmp/out" '"name":"b","dtype":"I64","shape":[1,1],"bytes":8,"offset":0,"shard":"m-2.safetensors"'
printf '{"weight_map":{"a":"../model.safetensors"}}' >"$tmp/sharded/evil.index.json"
check index-traversal 1 "$flexc" inspect "$tmp/sharded/evil.index.json"
has index-traversal-msg "$tmp/err" "flexc: error: $tmp/sharded/evil.index.json: weight_map: shard name '../model.safetensors' of tensor 'a' has an empty, '.' or '..' component"

# The benchmark runs (tiny size; it reports, it does not assert times).
check bench 0 "$flexc" bench safetensors --size-mib 2 --tensors 10 --reps 1 --dir "$tmp" --json
has bench-json "$tmp/out" '"case":"safetensors"'
has bench-ratio "$tmp/out" '"read_over_open"'
check bench-bad 2 "$flexc" bench safetensors --tensors 0

finish cli_inspect
