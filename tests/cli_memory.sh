#!/usr/bin/env bash
# The memory a run needs, added up before anything is allocated: train prints its planned peak
# and refuses a run that does not fit in what is available (the cgroup's room, MemAvailable),
# naming both and what to lower; generate refuses a model or KV cache that does not fit. The
# machine's memory is stood in for by FLEXC_MEM_AVAILABLE, so the results do not depend on it.
set -u
flexc=${1:?path to flexc}
src=${FLEXC_SOURCE_DIR:-$(dirname "$0")/..}
fix="$src/tests/fixtures/models"
source "$(dirname "$0")/lib/checks.sh"
scratch cli_mem 200
common=(--model tiny --data "$tmp/corpus.txt" --seq 16 --steps 1 --threads 1)

# ---- train: the planned peak, on the start-up lines ----
check plan-line 0 env FLEXC_MEM_AVAILABLE=4000000000 "$flexc" train "${common[@]}" --batch 2 --out "$tmp/a"
contains plan-line-parts "$tmp/out" '^memory: [0-9.]* MB planned (params [0-9.]* + grads [0-9.]* + adam [0-9.]* + activations [0-9.]* + scratch [0-9.]* + data [0-9.]* + process [0-9.]*), '
has plan-line-avail "$tmp/out" "GB available (90% of FLEXC_MEM_AVAILABLE)"
check plan-quiet 0 "$flexc" train "${common[@]}" --batch 2 --quiet --out "$tmp/q"
lacks plan-quiet-none "$tmp/out" "memory:"
# Without the override, the machine's own limit is named.
check plan-probe 0 "$flexc" train "${common[@]}" --batch 2 --out "$tmp/p"
contains plan-probe-source "$tmp/out" '^memory: .* available (90% of \(MemAvailable\|cgroup v[12] memory\.\)'

# ---- train: refused before it allocates when the sum does not fit ----
check refuse 1 env FLEXC_MEM_AVAILABLE=1000000 "$flexc" train "${common[@]}" --batch 2 --out "$tmp/r"
has refuse-msg "$tmp/err" "flexc: error: training needs "
contains refuse-parts "$tmp/err" 'needs [0-9.]* MB of memory (params [0-9.]* + grads .* + activations .*), and [0-9.]* MB is available (90% of FLEXC_MEM_AVAILABLE)'
has refuse-advice "$tmp/err" "lower --batch (2) or --seq (16), add --recompute, add --adam-bf16, or train a smaller model; --no-memory-check trains anyway"
[[ ! -e $tmp/r ]] && ok || bad "refuse: --out $tmp/r left behind"
# The same limit: a batch that fits runs, one whose activations do not is refused at once.
check fits 0 env FLEXC_MEM_AVAILABLE=200000000 "$flexc" train "${common[@]}" --batch 2 --quiet --out "$tmp/f"
start=$(date +%s%N)
check too-big 1 env FLEXC_MEM_AVAILABLE=200000000 "$flexc" train "${common[@]}" --seq 64 --batch 1024 --quiet \
    --out "$tmp/big"
ms=$((($(date +%s%N) - start) / 1000000))
contains too-big-msg "$tmp/err" 'training needs [0-9.]* MB of memory .*activations [0-9.]* .*, and [0-9.]* MB is available'
has too-big-advice "$tmp/err" "lower --batch (1024) or --seq (64)"
((ms < 5000)) && ok || bad "too-big: took $ms ms to refuse"
# --recompute keeps one layer's activations: what --recompute is named for.
check recompute-less 0 env FLEXC_MEM_AVAILABLE=4000000000 "$flexc" train "${common[@]}" --seq 64 --batch 64 \
    --out "$tmp/rc1"
full=$(sed -n 's/.*activations \([0-9.]*\) .*/\1/p' "$tmp/out")
check recompute-less2 0 env FLEXC_MEM_AVAILABLE=4000000000 "$flexc" train "${common[@]}" --seq 64 --batch 64 \
    --recompute --out "$tmp/rc2"
less=$(sed -n 's/.*activations \([0-9.]*\) .*/\1/p' "$tmp/out")
awk -v a="$full" -v b="$less" 'BEGIN { exit !(b > 0 && b < a / 1.5) }' && ok ||
    bad "recompute: activations $less MB with --recompute, $full MB without"
# Fine-tuning a Hugging Face model: its weights count as held.
check hf-refuse 1 env FLEXC_MEM_AVAILABLE=1000000 "$flexc" train --model "$fix/llama3_tied" --data "$tmp/corpus.txt" \
    --seq 16 --batch 2 --steps 1 --out "$tmp/hf"
has hf-refuse-msg "$tmp/err" "training needs "
check hf-fits 0 env FLEXC_MEM_AVAILABLE=4000000000 "$flexc" train --model "$fix/llama3_tied" \
    --data "$tmp/corpus.txt" --seq 16 --batch 2 --steps 1 --out "$tmp/hf"
has hf-fits-line "$tmp/out" "planned (params "

# ---- the overrides ----
check no-check 0 env FLEXC_MEM_AVAILABLE=1000000 "$flexc" train "${common[@]}" --batch 2 --no-memory-check --out "$tmp/n1"
has no-check-line "$tmp/out" "(90% of FLEXC_MEM_AVAILABLE), not checked"
check no-check-env 0 env FLEXC_MEM_AVAILABLE=1000000 FLEXC_NO_MEMORY_CHECK=1 "$flexc" train "${common[@]}" \
    --batch 2 --quiet --out "$tmp/n2"
check bad-override 1 env FLEXC_MEM_AVAILABLE=lots "$flexc" train "${common[@]}" --batch 2 --quiet --out "$tmp/n3"
has bad-override-msg "$tmp/err" "FLEXC_MEM_AVAILABLE='lots' is not a number of bytes"
check help 0 "$flexc" train --help
has help-flag "$tmp/out" "--no-memory-check"

# ---- the machine's own memory: a run no machine holds is refused at once ----
start=$(date +%s%N)
check machine 1 "$flexc" train --model gpt2 --batch 65536 --quiet --out "$tmp/m"
ms=$((($(date +%s%N) - start) / 1000000))
contains machine-msg "$tmp/err" 'training needs [0-9.]* GB of memory (params .*), and [0-9.]* [MG]B is available (90% of '
((ms < 5000)) && ok || bad "machine: took $ms ms to refuse"

# ---- generate: the model's weights and the KV cache ----
check gen-model 1 env FLEXC_MEM_AVAILABLE=1000 "$flexc" generate --model tiny --tokens 4
has gen-model-msg "$tmp/err" "flexc: error: --model: the model needs 0.46 MB of memory (its float32 parameters), and 0.00 MB is available (90% of FLEXC_MEM_AVAILABLE)"
check gen-ckpt 1 env FLEXC_MEM_AVAILABLE=1000 "$flexc" generate --ckpt "$tmp/a" --tokens 4
has gen-ckpt-msg "$tmp/err" "the model needs 0.46 MB of memory (its float32 parameters)"
# A context of a million positions: the cache for 200000 new tokens does not fit, 8 do.
mkdir "$tmp/long"
cp "$fix/llama3_tied/"* "$tmp/long/"
sed -i 's/"max_position_embeddings": 64/"max_position_embeddings": 1000000/' "$tmp/long/config.json"
check gen-cache 1 timeout 60 env FLEXC_MEM_AVAILABLE=100000000 "$flexc" generate --model "$tmp/long" --prompt hi \
    --tokens 200000
contains gen-cache-msg "$tmp/err" 'flexc: error: KV cache: a KV cache of 200003 positions needs [0-9.]* MB of memory, and 90.00 MB is available (90% of FLEXC_MEM_AVAILABLE): lower --tokens (200000) or shorten the prompt (2 tokens)'
check gen-cache-fits 0 env FLEXC_MEM_AVAILABLE=100000000 "$flexc" generate --model "$tmp/long" --prompt hi --tokens 8
check gen-help 0 "$flexc" generate --help
has gen-help-flag "$tmp/out" "--no-memory-check"

finish cli_memory
