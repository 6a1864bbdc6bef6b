#!/usr/bin/env bash
# flexc tokenize: --text ids equal to Hugging Face `tokenizers` (expected ids below were made by
# it, encode(text, add_special_tokens=False), on the fixture tokenizers), token files equal to
# --text, stdin, progress on a large file, errors (exit 1) and usage errors (exit 2), 1 MB with
# every family quickly, and a catastrophic split regex refused quickly.
set -u
flexc=${1:?path to flexc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.sh"
fix="${FLEXC_SOURCE_DIR:-$(dirname "$0")/..}/tests/fixtures/tokenizers"

text='Hello, wörld! 12345 <|endoftext|><s>'
declare -A want=(
    [gpt2]='[40,468,79,12,265,128,115,82,326,1,508,18,19,20,21,221,0,28,83,30]'
    [llama3]='[44,474,83,16,269,132,119,86,330,5,225,21,22,23,24,25,922,96,434,641,731,1056,96,34,32,87,34]'
    [qwen2]='[42,472,81,14,267,130,117,84,328,3,223,19,20,21,22,23,223,0,30,85,32]'
    [llama2]='[489,590,1246,380,198,185,344,445,263,627,280,281,282,283,729,354,550,765,966,1089,354,292,1]'
    [mistral]='[489,590,341,274,380,198,185,344,445,263,627,280,281,282,283,729,354,550,765,966,350,346,354,292,1]'
)
for m in gpt2 llama3 qwen2 llama2 mistral; do
    check "text-$m" 0 "$flexc" tokenize --model "$fix/$m" --text "$text"
    has "text-$m-ids" "$tmp/out" "${want[$m]}"
done
# the file itself instead of its directory
check text-file 0 "$flexc" tokenize --model "$fix/gpt2/tokenizer.json" --text "$text"
has text-file-ids "$tmp/out" "${want[gpt2]}"
check text-empty 0 "$flexc" tokenize --model "$fix/gpt2" --text ""
has text-empty-ids "$tmp/out" "[]"

# A file: the token file holds what --text gives (header 20240520, 1, count; uint16 tokens).
printf '%s' "$text" >"$tmp/in.txt"
check file 0 "$flexc" tokenize --model "$fix/llama3" "$tmp/in.txt" -o "$tmp/tokens.bin"
has file-summary "$tmp/out" "tokenize: 27 tokens from 37 bytes written to $tmp/tokens.bin"
read -r -a head <<<"$(od -An -td4 -N12 "$tmp/tokens.bin")"
[[ "${head[*]}" == "20240520 1 27" ]] && ok || bad "file-header: ${head[*]}"
[[ $(stat -c %s "$tmp/tokens.bin") -eq $((1024 + 27 * 2)) ]] && ok || bad "file-size"
ids="[$(od -An -tu2 -j1024 -v "$tmp/tokens.bin" | tr -s ' \n' ',' | sed 's/^,//; s/,$//')]"
[[ "$ids" == "${want[llama3]}" ]] && ok || bad "file-ids: $ids"
check file-stdin 0 "$flexc" tokenize --model "$fix/llama3" - -o "$tmp/stdin.bin" <"$tmp/in.txt"
same file-stdin-same "$tmp/tokens.bin" "$tmp/stdin.bin"
check file-dash-o 0 "$flexc" tokenize --model "$fix/llama3" "$tmp/in.txt" --out "$tmp/tokens2.bin"
same file-out-same "$tmp/tokens.bin" "$tmp/tokens2.bin"

# A larger file (over 8 MB) is read in pieces cut where the tokenizer allows, with progress
# lines on stderr when it is not a terminal; the ids are those of the file encoded whole.
for f in "$fix"/*/tokenizer.json "$fix"/texts.json; do cat "$f"; done >"$tmp/part.txt"
for ((i = 0; i < 26; i++)); do cat "$tmp/part.txt"; done >"$tmp/big.txt"
check big 0 "$flexc" tokenize --model "$fix/qwen2" "$tmp/big.txt" -o "$tmp/big.bin"
contains big-progress "$tmp/err" "^tokenize: [0-9.]* MB | [0-9]* tokens | [0-9.]* MB/s$"
contains big-summary "$tmp/out" "^tokenize: [0-9]* tokens from $(stat -c %s "$tmp/big.txt") bytes"
check big-quiet 0 "$flexc" tokenize --model "$fix/qwen2" "$tmp/big.txt" -o "$tmp/big2.bin" --quiet
lacks big-quiet-progress "$tmp/err" "MB/s"
same big-same "$tmp/big.bin" "$tmp/big2.bin"

# Errors: exit 1 with the reason.
check no-model 1 "$flexc" tokenize --model "$tmp/nothing" --text hi
has no-model-msg "$tmp/err" "flexc: error: tokenize: $tmp/nothing: No such file or directory"
mkdir "$tmp/wp"
printf '{"model":{"type":"WordPiece","vocab":{}}}' >"$tmp/wp/tokenizer.json"
check unsupported 1 "$flexc" tokenize --model "$tmp/wp" --text hi
has unsupported-msg "$tmp/err" "model.type 'WordPiece' is not supported"
printf '{"model":' >"$tmp/wp/tokenizer.json"
check malformed 1 "$flexc" tokenize --model "$tmp/wp" --text hi
has malformed-msg "$tmp/err" "not valid JSON"
check no-input 1 "$flexc" tokenize --model "$fix/gpt2" "$tmp/none.txt" -o "$tmp/x.bin"
has no-input-msg "$tmp/err" "flexc: error: tokenize: $tmp/none.txt: No such file or directory"
check bad-out 1 "$flexc" tokenize --model "$fix/gpt2" "$tmp/in.txt" -o "$tmp/no/dir/x.bin"
has bad-out-msg "$tmp/err" "flexc: error: tokenize"
[[ ! -e "$tmp/x.bin" ]] && ok || bad "no-input left a file"

# Usage errors: exit 2.
check usage-no-model 2 "$flexc" tokenize --text hi
check usage-both 2 "$flexc" tokenize --model "$fix/gpt2" "$tmp/in.txt" --text hi
check usage-neither 2 "$flexc" tokenize --model "$fix/gpt2"
check usage-no-out 2 "$flexc" tokenize --model "$fix/gpt2" "$tmp/in.txt"
check usage-text-out 2 "$flexc" tokenize --model "$fix/gpt2" --text hi -o "$tmp/x.bin"
check usage-option 2 "$flexc" tokenize --model "$fix/gpt2" --bogus
check help 0 "$flexc" tokenize --help
has help-synopsis "$tmp/out" "--model DIR (FILE -o tokens.bin | --text S)"
check main-help 0 "$flexc" --help
has main-help-tokenize "$tmp/out" "tokenize"

# Long inputs: 1 MB of mixed text (the fixtures' files) encodes quickly with every family.
head -c 1048576 "$tmp/big.txt" >"$tmp/mb.txt"
for m in gpt2 llama3 qwen2 llama2 mistral smollm metaspace; do
    t0=$(date +%s%N)
    check "long-$m" 0 "$flexc" tokenize --model "$fix/$m" "$tmp/mb.txt" -o "$tmp/mb-$m.bin"
    ms=$((($(date +%s%N) - t0) / 1000000))
    ((ms < 10000)) && ok || bad "long-$m: ${ms} ms for 1 MB"
done

# A tokenizer.json whose split regex backtracks catastrophically: the error names the file and
# the pattern, in well under 10 s on 100 KB (before: "match limit exceeded", or minutes for a
# pattern that scans to the end of the text at every position).
mkdir "$tmp/hostile"
hostile() {
    printf '{"pre_tokenizer":{"type":"Split","pattern":{"Regex":"%s"},"behavior":"Isolated","invert":false},
"model":{"type":"BPE","vocab":{"a":0,"!":1," ":2},"merges":[]}}' "$1" >"$tmp/hostile/tokenizer.json"
}
a100k=$(printf 'a%.0s' $(seq 100000))
budget="flexc: error: tokenize: $tmp/hostile/tokenizer.json: pre_tokenizer.pattern: the regex exceeded its work budget"
k=0
for re in '(a+)+$' '\\w(?=\\w*$)|\\s'; do # exponential; a scan to the end at every position
    k=$((k + 1))
    hostile "$re"
    t0=$(date +%s%N)
    check "hostile-$k" 1 "$flexc" tokenize --model "$tmp/hostile" --text "$a100k!"
    ms=$((($(date +%s%N) - t0) / 1000000))
    ((ms < 10000)) && ok || bad "hostile-$k: ${ms} ms to fail"
    has "hostile-$k-msg" "$tmp/err" "$budget on 100001 bytes of text (25604352 steps: 4096 + 256 a byte)"
done
printf '%s!' "$a100k" >"$tmp/a.txt"
check hostile-file 1 "$flexc" tokenize --model "$tmp/hostile" "$tmp/a.txt" -o "$tmp/h.bin"
has hostile-file-msg "$tmp/err" "$budget on 100001 bytes of text"
[[ ! -e "$tmp/h.bin" ]] && ok || bad "hostile-file left $tmp/h.bin"
check hostile-short 0 "$flexc" tokenize --model "$tmp/hostile" --text "a a!"

finish cli_tokenize
