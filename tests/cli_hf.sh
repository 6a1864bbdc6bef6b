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

# generate --model HFDIR: the prompt through the model's tokenizer (the ids flexc tokenize
# gives), --json's text is the stream's, and the run is deterministic.
if command -v python3 >/dev/null; then
    for m in llama3_tied llama_bf16 mistral_f16 qwen2_bias; do
        check "gen-$m-json" 0 "$flexc" generate --model "$fix/$m" --prompt "Computers are" --tokens 12 --temperature 0 --json
        cp "$tmp/out" "$tmp/gen.json"
        check "gen-$m-tokenize" 0 "$flexc" tokenize --model "$fix/$m" --text "Computers are"
        cp "$tmp/out" "$tmp/tok.json"
        check "gen-$m-prompt-ids" 0 python3 -c 'import json,sys; g=json.load(open(sys.argv[1])); t=json.load(open(sys.argv[2])); assert g["prompt_ids"]==t, (g, t); assert 1 <= len(g["ids"]) <= 12' "$tmp/gen.json" "$tmp/tok.json"
        check "gen-$m-stream" 0 "$flexc" generate --model "$fix/$m" --prompt "Computers are" --tokens 12 --temperature 0
        cp "$tmp/out" "$tmp/stream.txt"
        check "gen-$m-same-text" 0 python3 -c 'import json,sys; g=json.load(open(sys.argv[1])); s=open(sys.argv[2],encoding="utf-8").read(); eos=g["ids"] and g["ids"][-1] in (1,2); assert eos or s == "Computers are" + g["text"] + "\n", (s, g["text"])' "$tmp/gen.json" "$tmp/stream.txt"
        check "gen-$m-again" 0 "$flexc" generate --model "$fix/$m" --prompt "Computers are" --tokens 12 --temperature 0 --json
        same "gen-$m-deterministic" "$tmp/gen.json" "$tmp/out"
    done
    check gen-sampled 0 "$flexc" generate --model "$fix/qwen2_bias" --prompt "The" --tokens 16 --temperature 0.9 --top-k 50 --top-p 0.9 --seed 7 --json
    cp "$tmp/out" "$tmp/s1.json"
    check gen-sampled-again 0 "$flexc" generate --model "$fix/qwen2_bias" --prompt "The" --tokens 16 --temperature 0.9 --top-k 50 --top-p 0.9 --seed 7 --json
    same gen-sampled-seed "$tmp/s1.json" "$tmp/out"
fi
mkdir -p "$tmp/notok"
cp "$fix/qwen2_bias/config.json" "$fix/qwen2_bias/model.safetensors" "$tmp/notok/"
check gen-no-tokenizer 1 "$flexc" generate --model "$tmp/notok" --prompt "x" --tokens 2
has gen-no-tokenizer-msg "$tmp/err" "no tokenizer.json"
# An empty prompt starts from the model's bos id (as transformers does); without one, or with
# a context too small for the prompt, the error names that cause.
check gen-empty 0 "$flexc" generate --model "$fix/llama3_tied" --tokens 5 --temperature 0 --json
contains gen-empty-ids "$tmp/out" '"prompt_ids": \[\], "ids": \[[0-9]*, [0-9]*, [0-9]*, [0-9]*, [0-9]*\]'
check gen-empty-arg 0 "$flexc" generate --model "$fix/qwen2_bias" --prompt "" --tokens 3 --temperature 0
mkdir -p "$tmp/nobos" "$tmp/nullbos" "$tmp/ctx1"
sed '/"bos_token_id"/d' "$fix/qwen2_bias/config.json" >"$tmp/nobos/config.json"
sed 's/"bos_token_id": [0-9]*/"bos_token_id": null/' "$fix/qwen2_bias/config.json" >"$tmp/nullbos/config.json"
sed 's/"max_position_embeddings": [0-9]*/"max_position_embeddings": 1/' "$fix/qwen2_bias/config.json" >"$tmp/ctx1/config.json"
for d in nobos nullbos ctx1; do
    cp "$fix/qwen2_bias/model.safetensors" "$fix/qwen2_bias/tokenizer.json" "$tmp/$d/"
done
check gen-no-bos 1 "$flexc" generate --model "$tmp/nobos" --tokens 2
has gen-no-bos-msg "$tmp/err" "config has no bos_token_id"
check gen-null-bos 1 "$flexc" generate --model "$tmp/nullbos" --prompt "" --tokens 2
has gen-null-bos-msg "$tmp/err" "config has no bos_token_id"
check gen-small-ctx 1 "$flexc" generate --model "$tmp/ctx1" --prompt "Computers are" --tokens 2
has gen-small-ctx-msg "$tmp/err" "context (1 tokens) is too small for the prompt (6 tokens)"

# Fine-tuning a Hugging Face model on text, resuming, generating from the run, exporting it.
head -c 20000 /usr/share/games/fortunes/computers >"$tmp/text.txt" 2>/dev/null || head -c 20000 "$0" >"$tmp/text.txt"
check ft 0 "$flexc" train --model "$fix/qwen2_bias" --data "$tmp/text.txt" --steps 2 --batch 2 --seq 32 --out "$tmp/ft"
for f in config.json generation_config.json tokenizer.json; do
    same "ft-keeps-$f" "$fix/qwen2_bias/$f" "$tmp/ft/hf/$f"
done
check ft-resume 0 "$flexc" train --resume --out "$tmp/ft" --steps 3
has ft-resume-step "$tmp/out" "step 3/3"
check ft-generate 0 "$flexc" generate --ckpt "$tmp/ft" --prompt "Computers are" --tokens 4 --temperature 0 --json
has ft-generate-ids "$tmp/out" '"prompt_ids": [37, 302, 82, 306, 350, 378]'
check ft-export 0 "$flexc" export --ckpt "$tmp/ft" --to "$tmp/ft-hf"
has ft-export-arch "$tmp/out" "Qwen2ForCausalLM"
same ft-export-config "$fix/qwen2_bias/config.json" "$tmp/ft-hf/config.json"
same ft-export-tokenizer "$fix/qwen2_bias/tokenizer.json" "$tmp/ft-hf/tokenizer.json"
# The same text as an llm.c token file: read as is.
check tokfile 0 "$flexc" tokenize --model "$fix/qwen2_bias" "$tmp/text.txt" -o "$tmp/text.bin"
check ft-tokfile 0 "$flexc" train --model "$fix/qwen2_bias" --data "$tmp/text.bin" --steps 1 --batch 2 --seq 32 --out "$tmp/ft2"
check ft-no-data 2 "$flexc" train --model "$fix/qwen2_bias" --steps 1 --out "$tmp/ft3"
has ft-no-data-msg "$tmp/err" "--data FILE is required with a Hugging Face model"
finish cli_hf
