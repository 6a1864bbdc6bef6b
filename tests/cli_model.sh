#!/usr/bin/env bash
# --model NAME|DIR in train, generate and bench train: a trained directory is fine-tuned from
# its weights (the first loss is the trained model's, not a fresh one's), generate reads the
# same directories as --ckpt, and a Hugging Face directory or a bad name gets a clear error.
set -u
flexc=${1:?path to flexc}
tmp=$(mktemp -d /tmp/flexc_cli_model.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.sh"
first_loss() { head -1 "$1" | sed 's/.*"loss":\([0-9.e-]*\).*/\1/'; }

for i in $(seq 1 300); do echo "the quick brown fox $((i % 10)) jumps over the lazy dog."; done > "$tmp/corpus.txt"
common=(--data "$tmp/corpus.txt" --batch 4 --seq 32 --lr 3e-3 --quiet --threads 1)

check base 0 "$flexc" train --model tiny "${common[@]}" --steps 40 --attn sliding:8 --out "$tmp/a"
# Fine-tuning: starts where the base run ended, with its mask.
check finetune 0 "$flexc" train --model "$tmp/a" "${common[@]}" --steps 2 --out "$tmp/ft"
a=$(grep val_loss "$tmp/a/metrics.jsonl" | tail -1 | sed 's/.*"loss":\([0-9.e-]*\).*/\1/')
f=$(first_loss "$tmp/ft/metrics.jsonl")
if awk -v a="$a" -v f="$f" 'BEGIN { exit !(f < 4.0 && f < a + 0.5) }'; then ok; else
    bad "finetune: first loss $f, the base run ended at $a"; fi
check fresh 0 "$flexc" train --model tiny "${common[@]}" --steps 2 --out "$tmp/fresh"
fr=$(first_loss "$tmp/fresh/metrics.jsonl")
if awk -v f="$f" -v r="$fr" 'BEGIN { exit !(f < r - 1.0) }'; then ok; else
    bad "finetune-vs-fresh: fine-tuned first loss $f, fresh $fr"; fi
check ft-inspect 0 "$flexc" inspect "$tmp/ft/model.safetensors"
has ft-mask "$tmp/out" "sliding:8"
check ft-overrides 2 "$flexc" train --model "$tmp/a" --dim 32 "${common[@]}" --out "$tmp/x"
has ft-overrides-msg "$tmp/err" "apply to presets only"
check bad-model 2 "$flexc" train --model nonsense "${common[@]}" --out "$tmp/x"
has bad-model-msg "$tmp/err" "--model nonsense is neither a preset (tiny, small, gpt2) nor a directory"
check resume-model-dir 2 "$flexc" train --resume --model "$tmp/a" --out "$tmp/ft" --quiet
has resume-model-dir-msg "$tmp/err" "drop --model"

# generate: --model DIR and --ckpt DIR are the same model.
check gen-ckpt 0 "$flexc" generate --ckpt "$tmp/a" --tokens 30 --seed 4 --top-p 0.9
cp "$tmp/out" "$tmp/gen1"
check gen-model 0 "$flexc" generate --model "$tmp/a" --tokens 30 --seed 4 --top-p 0.9
same gen-model-same "$tmp/gen1" "$tmp/out"
check gen-preset 0 "$flexc" generate --model tiny --tokens 5 --temperature 0
check gen-both 2 "$flexc" generate --ckpt "$tmp/a" --model tiny
check gen-top-p 2 "$flexc" generate --ckpt "$tmp/a" --top-p 0
has gen-top-p-msg "$tmp/err" "--top-p 0 is outside (0, 1]"
mkdir -p "$tmp/hf" && echo '{}' > "$tmp/hf/config.json"
check gen-hf 1 "$flexc" generate --ckpt "$tmp/hf"
contains gen-hf-msg "$tmp/err" "^flexc: error: --ckpt: "
check train-hf 1 "$flexc" train --model "$tmp/hf" "${common[@]}" --out "$tmp/x"
contains train-hf-msg "$tmp/err" "^flexc: error: --model "
check bench-dir 0 "$flexc" bench train --model "$tmp/a" --steps 2 --batch 1 --seq 16 --only flex
# --gemm with --dtype bf16 times the bfloat16 products (their storage named), not NaN rows.
check bench-gemm-bf16 0 "$flexc" bench train --model tiny --steps 1 --batch 1 --seq 16 --only flex --gemm --dtype bf16
contains bench-gemm-bf16-row "$tmp/out" '^    [NT][NT]  bf16 [hf][hf] '
lacks bench-gemm-bf16-f32 "$tmp/out" '  f32 '
lacks bench-gemm-bf16-nan "$tmp/out" 'nan'
check bench-gemm-f32 0 "$flexc" bench train --model tiny --steps 1 --batch 1 --seq 16 --only flex --gemm
contains bench-gemm-f32-row "$tmp/out" '^    [NT][NT]  f32 '
lacks bench-gemm-f32-bf16 "$tmp/out" '  bf16 '
# The fused loss's products (a dimension of 257, the vocabulary) are not rows of the table,
# on any CPU path (on AVX2 they are BLIS calls made outside a parallel region at this size).
lacks bench-gemm-f32-loss "$tmp/out" ' 257 '
# --ops: the step by op; on tiny (2 layers) each layer's attention runs once a step each way,
# and the rows cover the step (what they leave is printed as "the rest").
check bench-ops 0 "$flexc" bench train --model tiny --steps 1 --batch 1 --seq 16 --only flex --ops
contains bench-ops-products "$tmp/out" '^    matrix products  *[1-9][0-9]*\.0 '
contains bench-ops-attn-fwd "$tmp/out" '^    attention forward  *2\.0 '
contains bench-ops-attn-bwd "$tmp/out" '^    attention backward  *2\.0 '
contains bench-ops-norm "$tmp/out" '^    RMSNorm  *[1-9]'
contains bench-ops-loss "$tmp/out" '^    loss  *1\.0 '
contains bench-ops-rest "$tmp/out" '^    the rest '
lacks bench-ops-gemm-table "$tmp/out" 'matrix products per step'
lacks bench-ops-nan "$tmp/out" 'nan'
check bench-ops-json 0 "$flexc" bench train --model tiny --steps 1 --batch 1 --seq 16 --only flex --ops --json
contains bench-ops-json-line "$tmp/out" '^{"case":"train_ops","steps":[0-9]*,"step_s":[0-9.]*,"ops":\[{"op":"matrix products"'
check bench-ops-pair 2 "$flexc" bench train --model tiny --steps 1 --ops
has bench-ops-pair-msg "$tmp/err" "bench train --ops: needs --only flex or --only baseline"
finish cli_model
