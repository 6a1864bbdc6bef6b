#!/usr/bin/env bash
# Hugging Face models on the command line: flexc export (a Hugging Face directory written back,
# config and tokenizer kept, the export loading again; a flexc training directory exported as
# LlamaForCausalLM), bench generate on a fixture, and the usage and input errors.
set -u
flexc=${1:?path to flexc}
src=${FLEXC_SOURCE_DIR:-$(dirname "$0")/..}
fix="$src/tests/fixtures/models"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.sh"

# Export of an unchanged Hugging Face directory: its own config.json, generation_config.json
# and tokenizer files, the source dtype; a sharded source becomes one file.
for m in llama3_tied llama_bf16 mistral_f16 qwen2_bias; do
    check "export-$m" 0 "$flexc" export --ckpt "$fix/$m" --to "$tmp/$m"
    has "export-$m-says" "$tmp/out" "wrote $tmp/$m"
    for f in config.json generation_config.json tokenizer.json tokenizer_config.json; do
        same "export-$m-$f" "$fix/$m/$f" "$tmp/$m/$f"
    done
    [[ -f "$tmp/$m/model.safetensors" && ! -e "$tmp/$m/model.safetensors.index.json" ]] && ok ||
        bad "export-$m: no single model.safetensors"
    # The export is a model flexc reads again, and exporting it again gives the same file.
    check "export-$m-again" 0 "$flexc" export --ckpt "$tmp/$m" --to "$tmp/$m-2"
    same "export-$m-idempotent" "$tmp/$m/model.safetensors" "$tmp/$m-2/model.safetensors"
done
check inspect-bf16 0 "$flexc" inspect "$tmp/llama_bf16/model.safetensors"
has inspect-bf16-dtype "$tmp/out" "BF16"
lacks inspect-bf16-f32 "$tmp/out" "F32"
check export-dtype 0 "$flexc" export --ckpt "$fix/llama_bf16" --to "$tmp/as-f32" --dtype f32
check inspect-f32 0 "$flexc" inspect "$tmp/as-f32/model.safetensors"
lacks inspect-f32-bf16 "$tmp/out" "BF16"

# A flexc training directory: exported as LlamaForCausalLM with a generated config.
check train-tiny 0 "$flexc" train --model tiny --steps 1 --batch 2 --seq 32 --out "$tmp/run"
check export-flexc 0 "$flexc" export --ckpt "$tmp/run" --to "$tmp/run-hf"
has export-flexc-arch "$tmp/run-hf/config.json" '"LlamaForCausalLM"'
has export-flexc-vocab "$tmp/run-hf/config.json" '"vocab_size": 257'
has export-flexc-note "$tmp/out" "no tokenizer"
check export-flexc-reads 0 "$flexc" export --ckpt "$tmp/run-hf" --to "$tmp/run-hf-2"
same export-flexc-idempotent "$tmp/run-hf/model.safetensors" "$tmp/run-hf-2/model.safetensors"

# Errors: usage (2), unreadable or refused input (1) with the reason.
check export-no-to 2 "$flexc" export --ckpt "$fix/llama3_tied"
has export-no-to-msg "$tmp/err" "--to HFDIR are required"
check export-bad-dtype 2 "$flexc" export --ckpt "$fix/llama3_tied" --to "$tmp/x" --dtype f8
has export-bad-dtype-msg "$tmp/err" "--dtype f8"
check export-missing 1 "$flexc" export --ckpt "$tmp/nowhere" --to "$tmp/x"
mkdir -p "$tmp/gemma"
sed 's/LlamaForCausalLM/GemmaForCausalLM/; s/"llama"/"gemma"/' "$fix/llama3_tied/config.json" >"$tmp/gemma/config.json"
cp "$fix/llama3_tied/model.safetensors" "$tmp/gemma/"
check export-refused 1 "$flexc" export --ckpt "$tmp/gemma" --to "$tmp/x"
has export-refused-msg "$tmp/err" "architecture GemmaForCausalLM is not supported"
check generate-refused 1 "$flexc" generate --model "$tmp/gemma" --tokens 2
has generate-refused-msg "$tmp/err" "GemmaForCausalLM"
echo '{}' >"$tmp/file"
check export-onto-file 1 "$flexc" export --ckpt "$fix/llama3_tied" --to "$tmp/file"

# bench generate on a fixture: the numbers are there and positive.
check bench 0 "$flexc" bench generate --model "$fix/mistral_f16" --prompt-len 12 --tokens 4 --reps 1 --json
contains bench-json "$tmp/out" '"case": "generate".*"arch": "MistralForCausalLM".*"prefill_tok_s": [0-9.]*[1-9].*"decode_tok_s": [0-9.]*[1-9].*"peak_rss_mib": [0-9.]*[1-9]'
check bench-too-long 2 "$flexc" bench generate --model "$fix/mistral_f16" --prompt-len 60 --tokens 10
has bench-too-long-msg "$tmp/err" "more than the model's context 64"
finish cli_hf
