#!/usr/bin/env bash
# flexc train / generate / bench train --device: a bad name and the options the GPU step does
# not take are refused by name; without a GPU (or without CUDA in the build) --device cuda says
# which is missing and leaves no --out behind. With a GPU: 20 steps on it against 20 on the
# CPU (the losses within float rounding), a run that switches device at its checkpoint either
# way, greedy generation that gives the CPU's tokens, the same for Hugging Face models, and
# the benchmark's GPU step.
set -u
flexc=${1:?path to flexc}
source "$(dirname "$0")/lib/checks.sh"
scratch cli_device 300
common=(--model tiny --data "$tmp/corpus.txt" --batch 4 --seq 32 --lr 3e-3 --quiet)

check bad-device 2 "$flexc" train "${common[@]}" --steps 2 --device bogus --out "$tmp/e"
has bad-device-msg "$tmp/err" "--device bogus: expected cpu or cuda"
check bad-device-empty 2 "$flexc" train "${common[@]}" --steps 2 --device "" --out "$tmp/e"
for opt in --recompute --adam-bf16 --deterministic "--attn dense"; do
    # shellcheck disable=SC2086 # "--attn dense" is two words
    check "refused $opt" 2 "$flexc" train "${common[@]}" --steps 2 --device cuda $opt --out "$tmp/e"
    has "refused-msg $opt" "$tmp/err" "--device cuda does not take ${opt%% *}"
done
check gen-bad-device 2 "$flexc" generate --model tiny --tokens 4 --device bogus
has gen-bad-device-msg "$tmp/err" "--device bogus: expected cpu or cuda"
check cpu-explicit 0 "$flexc" train "${common[@]}" --steps 2 --device cpu --out "$tmp/cpu"
bench=(bench train --model tiny --batch 2 --seq 32 --steps 1 --json)
check bench-bad-device 2 "$flexc" "${bench[@]}" --only flex --device bogus
check bench-cuda-pair 2 "$flexc" "${bench[@]}" --device cuda
has bench-cuda-pair-msg "$tmp/err" "bench train --device cuda: times --only flex"

"$flexc" train "${common[@]}" --steps 2 --device cuda --out "$tmp/probe" >"$tmp/out" 2>"$tmp/err"
status=$?
if [[ $status -ne 0 ]]; then
    # No GPU here: the reason, exit status 1, and nothing written.
    [[ $status -eq 1 ]] && ok || bad "no-gpu: exit $status, expected 1"
    contains no-gpu-msg "$tmp/err" "--device cuda: \(no CUDA device is visible\|this build of flexc has no CUDA backend\)"
    [[ ! -e "$tmp/probe" ]] && ok || bad "no-gpu: $tmp/probe was created"
    check gen-no-gpu 1 "$flexc" generate --model tiny --tokens 4 --device cuda
    contains gen-no-gpu-msg "$tmp/err" "--device cuda: "
    check bench-no-gpu 1 "$flexc" "${bench[@]}" --only flex --device cuda
    finish cli_device
    exit
fi

# ---- a GPU: the same run on both devices ----
lossat() { grep "\"step\":$2," "$1" | sed 's/.*"loss":\([0-9.e-]*\).*/\1/'; }
close() { # NAME A B TOL: |A - B| <= TOL (1 + |B|)
    if awk -v a="$2" -v b="$3" -v t="$4" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b;
                                                  exit !(d <= t * (1 + m)) }'; then ok; else
        bad "$1: $2 vs $3"; fi
}
for dt in f32 bf16; do
    tol=$([[ $dt == f32 ]] && echo 1e-3 || echo 2e-2)
    check "cpu-$dt" 0 "$flexc" train "${common[@]}" --steps 20 --dtype $dt --out "$tmp/c-$dt"
    check "gpu-$dt" 0 "$flexc" train "${common[@]}" --steps 20 --dtype $dt --device cuda --out "$tmp/g-$dt"
    for s in 1 10 20; do
        close "loss-$dt-step$s" "$(lossat "$tmp/g-$dt/metrics.jsonl" $s)" "$(lossat "$tmp/c-$dt/metrics.jsonl" $s)" "$tol"
    done
    contains "gpu-$dt-metrics" "$tmp/g-$dt/metrics.jsonl" '"step":20,"loss":[0-9.e-]*,"lr":[0-9.e-]*,"grad_norm":[0-9.e-]*,"tokens_per_s":[0-9.]*'
done
# Twice on the GPU: the same bits.
check gpu-again 0 "$flexc" train "${common[@]}" --steps 20 --device cuda --out "$tmp/g2"
same gpu-rerun "$tmp/g-f32/model.safetensors" "$tmp/g2/model.safetensors"
# Resume across devices: 10 steps on one, 10 on the other.
check cpu-then 0 "$flexc" train "${common[@]}" --steps 20 --until 10 --out "$tmp/x"
check gpu-now 0 "$flexc" train --resume --device cuda --out "$tmp/x" --quiet
close cpu-to-gpu "$(lossat "$tmp/x/metrics.jsonl" 20)" "$(lossat "$tmp/c-f32/metrics.jsonl" 20)" 1e-3
check gpu-then 0 "$flexc" train "${common[@]}" --steps 20 --until 10 --device cuda --out "$tmp/y"
check cpu-now 0 "$flexc" train --resume --out "$tmp/y" --quiet
close gpu-to-cpu "$(lossat "$tmp/y/metrics.jsonl" 20)" "$(lossat "$tmp/c-f32/metrics.jsonl" 20)" 1e-3
check bench-gpu 0 "$flexc" "${bench[@]}" --only flex --device cuda --dtype bf16
contains bench-gpu-json "$tmp/out" '"device":"cuda","dtype":"bf16".*"tokens_per_s":'
# Greedy generation: the CPU's tokens.
check gen-cpu 0 "$flexc" generate --ckpt "$tmp/c-f32" --prompt "the quick" --tokens 24 --temperature 0 --json
cp "$tmp/out" "$tmp/gen-cpu"
check gen-gpu 0 "$flexc" generate --ckpt "$tmp/c-f32" --prompt "the quick" --tokens 24 --temperature 0 --json --device cuda
same gen-tokens "$tmp/gen-cpu" "$tmp/out"
# Hugging Face models (qkv biases; Llama-3 RoPE, a tied head): fine-tuning and greedy
# generation (the weights read from their file, rotate-half rows made flexc's) on both devices.
fix="${FLEXC_SOURCE_DIR:-$(dirname "$0")/..}/tests/fixtures/models"
head -c 20000 "$0" >"$tmp/text.txt"
for mdl in qwen2_bias llama3_tied; do
    hf=(--model "$fix/$mdl" --data "$tmp/text.txt" --steps 4 --batch 2 --seq 32 --quiet)
    check "hf-cpu-$mdl" 0 "$flexc" train "${hf[@]}" --out "$tmp/hc-$mdl"
    check "hf-gpu-$mdl" 0 "$flexc" train "${hf[@]}" --device cuda --out "$tmp/hg-$mdl"
    close "hf-loss-$mdl" "$(lossat "$tmp/hg-$mdl/metrics.jsonl" 4)" "$(lossat "$tmp/hc-$mdl/metrics.jsonl" 4)" 1e-3
    check "hf-gen-cpu-$mdl" 0 "$flexc" generate --model "$fix/$mdl" --prompt "The" --tokens 12 --temperature 0 --json
    cp "$tmp/out" "$tmp/hf-gen-cpu"
    check "hf-gen-gpu-$mdl" 0 "$flexc" generate --model "$fix/$mdl" --prompt "The" --tokens 12 --temperature 0 --json \
        --device cuda
    same "hf-gen-$mdl" "$tmp/hf-gen-cpu" "$tmp/out"
done
finish cli_device
