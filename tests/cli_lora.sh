#!/usr/bin/env bash
# flexc train --lora on a Hugging Face model: the run (a LoRA checkpoint, no model file), --until
# and --resume bit for bit, the same bits at 1 and 2 threads (--deterministic too), attention
# mods, generate from the run, export as a PEFT adapter and merged, a PEFT directory as --ckpt,
# and the options refused with their reason. (--parallel ddp: tests/mpi_hf.sh lora.)
set -u
flexc=${1:?path to flexc}
src=${FLEXC_SOURCE_DIR:-$(dirname "$0")/..}
fix="$src/tests/fixtures/models"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.sh"

for i in $(seq 1 120); do echo "The fortune $i you seek is in cookie $((i % 13)), in jar $((i % 5))."; done >"$tmp/text.txt"
base="$fix/llama_bf16"
lora=(--model "$base" --data "$tmp/text.txt" --lora 4 --lora-dropout 0.1 --steps 8 --batch 2 --seq 32)

# A run: its checkpoint holds the adapters (no model file); the header says what trains.
check train 0 "$flexc" train "${lora[@]}" --out "$tmp/run"
has train-header "$tmp/out" "lora: rank 4, alpha 8, dropout 0.1 on q,k,v,o,gate,up,down"
has train-frozen "$tmp/out" "frozen in BF16"
has train-saved "$tmp/out" "saved $tmp/run/checkpoint.safetensors (LoRA adapters) at step 8"
[[ -f "$tmp/run/checkpoint.safetensors" && ! -e "$tmp/run/model.safetensors" ]] && ok || bad "train: files"
check inspect 0 "$flexc" inspect "$tmp/run/checkpoint.safetensors"
has inspect-name "$tmp/out" "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"

# --until then --resume: the uninterrupted run's checkpoint, byte for byte; so at 1 thread.
check until 0 "$flexc" train "${lora[@]}" --out "$tmp/split" --until 3
check resume 0 "$flexc" train --resume --out "$tmp/split"
same resume-bitwise "$tmp/run/checkpoint.safetensors" "$tmp/split/checkpoint.safetensors"
check threads1 0 "$flexc" train "${lora[@]}" --out "$tmp/t1" --threads 1
same threads-bitwise "$tmp/run/checkpoint.safetensors" "$tmp/t1/checkpoint.safetensors"
check recompute 0 "$flexc" train "${lora[@]}" --out "$tmp/rc" --recompute
same recompute-bitwise "$tmp/run/checkpoint.safetensors" "$tmp/rc/checkpoint.safetensors"
# --dtype bf16: the base's rows read as bfloat16 in place; bitwise at 1 and 2 threads and over
# a resume; an F16 base is refused (its values are not bfloat16 ones).
check bf16 0 "$flexc" train "${lora[@]}" --dtype bf16 --out "$tmp/bf16"
has bf16-header "$tmp/out" "dtype bf16: bfloat16 inputs to the base's products"
check bf16-t1 0 "$flexc" train "${lora[@]}" --dtype bf16 --out "$tmp/bf16-t1" --threads 1
same bf16-threads "$tmp/bf16/checkpoint.safetensors" "$tmp/bf16-t1/checkpoint.safetensors"
check bf16-until 0 "$flexc" train "${lora[@]}" --dtype bf16 --out "$tmp/bf16-r" --until 3
check bf16-resume 0 "$flexc" train --resume --out "$tmp/bf16-r"
same bf16-resume-bitwise "$tmp/bf16/checkpoint.safetensors" "$tmp/bf16-r/checkpoint.safetensors"
check bf16-f16 2 "$flexc" train --model "$fix/mistral_f16" --data "$tmp/text.txt" --lora 4 --steps 1 --batch 2 --seq 32 --dtype bf16 --out "$tmp/x"
has bf16-f16-msg "$tmp/err" "is F16"
check targets 0 "$flexc" train "${lora[@]}" --lora-targets q,v --lora-alpha 4 --out "$tmp/qv" --steps 2
has targets-header "$tmp/out" "lora: rank 4, alpha 4, dropout 0.1 on q,v"

# Chat data: the document mask by default, the loss on the assistants' turns, --resume.
cm="$src/tests/fixtures/chat_model"
chat=(--model "$cm" --data "$cm/train.jsonl" --lora 4 --steps 4 --batch 2 --seq 32)
check chat 0 "$flexc" train "${chat[@]}" --out "$tmp/chat"
has chat-mask "$tmp/out" "attention document"
has chat-data "$tmp/out" "(chat, 9 conversations)"
check chat-until 0 "$flexc" train "${chat[@]}" --out "$tmp/chat2" --until 2
check chat-resume 0 "$flexc" train --resume --out "$tmp/chat2"
same chat-resume-bitwise "$tmp/chat/checkpoint.safetensors" "$tmp/chat2/checkpoint.safetensors"
check chat-causal 0 "$flexc" train "${chat[@]}" --attn causal --out "$tmp/chat3" --steps 1
has chat-causal-mask "$tmp/out" "attention causal"
# A model whose eos id also ends each turn (as ChatML models' <|im_end|>): documents would cut
# a conversation apart, so the default stays causal, and says why.
mkdir -p "$tmp/eot-model"
cp -L "$cm"/* "$tmp/eot-model/"
sed -i 's/"eos_token_id": 1/"eos_token_id": 2/' "$tmp/eot-model/config.json" "$tmp/eot-model/generation_config.json"
check chat-split 0 "$flexc" train --model "$tmp/eot-model" --data "$cm/train.jsonl" --lora 4 --steps 1 --batch 2 --seq 32 --out "$tmp/chat4"
has chat-split-mask "$tmp/out" "attention causal"
has chat-split-note "$tmp/out" "also ends turns inside the conversations"

# generate --chat from the chat run: the prompt as a user's turn (the rendering tokenize --chat
# gives, then the template's generation prompt), the reply only, deterministic.
echo '{"messages": [{"role": "user", "content": "Hello there"}]}' >"$tmp/one.jsonl"
check chat-tokenize 0 "$flexc" tokenize --model "$cm" --chat "$tmp/one.jsonl"
cp "$tmp/out" "$tmp/turn.json"
check chat-gen 0 "$flexc" generate --ckpt "$tmp/chat" --chat --prompt "Hello there" --tokens 6 --temperature 0 --json
cp "$tmp/out" "$tmp/chat-gen.json"
if command -v python3 >/dev/null; then
    check chat-gen-prompt 0 python3 -c 'import json,sys; t=json.load(open(sys.argv[1])); g=json.load(open(sys.argv[2])); p=g["prompt_ids"]; assert p[:len(t)]==t and len(p)>len(t), (t, p)' "$tmp/turn.json" "$tmp/chat-gen.json"
fi
check chat-gen-stream 0 "$flexc" generate --ckpt "$tmp/chat" --chat --prompt "Hello there" --tokens 6 --temperature 0
lacks chat-gen-no-echo "$tmp/out" "Hello there"
check chat-gen-no-template 1 "$flexc" generate --model "$base" --chat --prompt "Hello" --tokens 2
has chat-gen-no-template-msg "$tmp/err" "no chat template"
check chat-gen-bytes 2 "$flexc" generate --model tiny --chat --prompt "Hello" --tokens 2
has chat-gen-bytes-msg "$tmp/err" "--chat needs a model with a tokenizer and a chat template"

# generate from the run (base + adapters), deterministic; the adapters change the output.
check gen 0 "$flexc" generate --ckpt "$tmp/run" --prompt "The fortune" --tokens 8 --temperature 0 --json
cp "$tmp/out" "$tmp/gen.json"
check gen-again 0 "$flexc" generate --ckpt "$tmp/run" --prompt "The fortune" --tokens 8 --temperature 0 --json
same gen-deterministic "$tmp/gen.json" "$tmp/out"

# export: a PEFT adapter (which loads back as the same model), or merged (a whole model).
check export 0 "$flexc" export --ckpt "$tmp/run" --to "$tmp/peft"
has export-says "$tmp/out" "a PEFT LoRA adapter"
has export-config "$tmp/peft/adapter_config.json" '"peft_type": "LORA"'
has export-dropout "$tmp/peft/adapter_config.json" '"lora_dropout": 0.1,'
check gen-peft 0 "$flexc" generate --ckpt "$tmp/peft" --prompt "The fortune" --tokens 8 --temperature 0 --json
same gen-peft-same "$tmp/gen.json" "$tmp/out"
check merge 0 "$flexc" export --ckpt "$tmp/run" --to "$tmp/merged" --merge --dtype f32
same merge-config "$base/config.json" "$tmp/merged/config.json"
same merge-tokenizer "$base/tokenizer.json" "$tmp/merged/tokenizer.json"
check gen-merged 0 "$flexc" generate --ckpt "$tmp/merged" --prompt "The fortune" --tokens 8 --temperature 0 --json
same gen-merged-same "$tmp/gen.json" "$tmp/out"
check merge-peft 0 "$flexc" export --ckpt "$tmp/peft" --to "$tmp/merged2" --merge --dtype f32
same merge-peft-same "$tmp/merged/model.safetensors" "$tmp/merged2/model.safetensors"
check merge-whole 2 "$flexc" export --ckpt "$base" --to "$tmp/x" --merge
has merge-whole-msg "$tmp/err" "holds no LoRA adapters"

# A full run over a LoRA run's directory (--force) and back: the files of the kind in use.
check full-over 0 "$flexc" train --model "$base" --data "$tmp/text.txt" --steps 1 --batch 2 --seq 32 --out "$tmp/t1" --force
check lora-over 0 "$flexc" train "${lora[@]}" --out "$tmp/t1" --force
[[ ! -e "$tmp/t1/model.safetensors" ]] && ok || bad "lora-over: the full run's model file is left"
same lora-over-bitwise "$tmp/run/checkpoint.safetensors" "$tmp/t1/checkpoint.safetensors"

# Refused, with the reason: usage errors (2).
# --deterministic (the sum of one sequence at a time that is bitwise at any process count):
# the same bits at 1 and 2 threads.
check det 0 "$flexc" train "${lora[@]}" --deterministic --out "$tmp/det"
check det-t1 0 "$flexc" train "${lora[@]}" --deterministic --out "$tmp/det-t1" --threads 1
same det-threads "$tmp/det/checkpoint.safetensors" "$tmp/det-t1/checkpoint.safetensors"

# Attention mods under LoRA: recorded in the checkpoint, kept over --until + --resume, run by
# generate (adapters that have not moved, lr 1e-30: the base's text without a mod, another
# text with one), refused by export (PEFT's config cannot hold them).
mods=(--score-mod "30 * tanh(score / 30)" --mask-mod "q_idx >= kv_idx && q_idx - kv_idx < 16")
check mods 0 "$flexc" train "${lora[@]}" "${mods[@]}" --out "$tmp/mods"
has mods-meta <(head -c 20000 "$tmp/mods/checkpoint.safetensors" | tr -d '\0') '"score_mod":"30 * tanh(score / 30)"'
check mods-until 0 "$flexc" train "${lora[@]}" "${mods[@]}" --out "$tmp/mods-r" --until 3
check mods-resume 0 "$flexc" train --resume --out "$tmp/mods-r"
same mods-resume-bitwise "$tmp/mods/checkpoint.safetensors" "$tmp/mods-r/checkpoint.safetensors"
still=(--model "$base" --data "$tmp/text.txt" --lora 4 --steps 2 --batch 2 --seq 32 --lr 1e-30)
check still 0 "$flexc" train "${still[@]}" --out "$tmp/still"
check still-mod 0 "$flexc" train "${still[@]}" --score-mod "score * 0" --out "$tmp/still-mod"
gen=(--prompt "The fortune" --tokens 12 --temperature 0 --json)
check gen-base 0 "$flexc" generate --model "$base" "${gen[@]}"
cp "$tmp/out" "$tmp/gen-base.json"
check gen-still 0 "$flexc" generate --ckpt "$tmp/still" "${gen[@]}"
same gen-still-is-base "$tmp/gen-base.json" "$tmp/out"
check gen-still-mod 0 "$flexc" generate --ckpt "$tmp/still-mod" "${gen[@]}"
cmp -s "$tmp/gen-base.json" "$tmp/out" && bad "generate --ckpt did not apply the run's score mod" || ok
for how in "" "--merge"; do
    # shellcheck disable=SC2086
    check "export-mods$how" 1 "$flexc" export --ckpt "$tmp/mods" --to "$tmp/x" $how
    has "export-mods$how-msg" "$tmp/err" "was trained with attention mods (--mask-mod"
done

check preset 2 "$flexc" train --model small --lora 4 --out "$tmp/x"
has preset-msg "$tmp/err" "--lora adapts a Hugging Face model"
check rank0 2 "$flexc" train "${lora[@]}" --lora 0 --out "$tmp/x"
has rank0-msg "$tmp/err" "--lora 0"
check dropout1 2 "$flexc" train "${lora[@]}" --lora-dropout 1 --out "$tmp/x"
has dropout1-msg "$tmp/err" "--lora-dropout 1 must be in [0, 1)"
check alpha0 2 "$flexc" train "${lora[@]}" --lora-alpha 0 --out "$tmp/x"
has alpha0-msg "$tmp/err" "--lora-alpha 0 must be > 0"
check target 2 "$flexc" train "${lora[@]}" --lora-targets q,lm_head --out "$tmp/x"
has target-msg "$tmp/err" "LoRA target 'lm_head' is not one of"
check stray 2 "$flexc" train --model "$base" --data "$tmp/text.txt" --lora-alpha 4 --out "$tmp/x"
has stray-msg "$tmp/err" "--lora-alpha goes with --lora R"
for opt in "--adam-bf16" "--bf16"; do
    # shellcheck disable=SC2086
    check "no${opt// /-}" 2 "$flexc" train "${lora[@]}" $opt --out "$tmp/x"
    has "no${opt// /-}-msg" "$tmp/err" "--lora does not take ${opt}"
done
check resume-rank 2 "$flexc" train --resume --out "$tmp/run" --lora 8 --steps 9
has resume-rank-msg "$tmp/err" "the checkpoint trains LoRA adapters of rank 4"
check full-resume-lora 0 "$flexc" train --model "$base" --data "$tmp/text.txt" --steps 1 --batch 2 --seq 32 --out "$tmp/full"
check full-resume-lora 2 "$flexc" train --resume --out "$tmp/full" --lora 4 --steps 2
has full-resume-lora-msg "$tmp/err" "full fine-tuning run's checkpoint; drop --lora"
check resume-other-base 2 "$flexc" train --resume --out "$tmp/run" --model "$fix/qwen2_bias" --steps 9
has resume-other-base-msg "$tmp/err" "adapters are on the base model"
[[ ! -e "$tmp/x" ]] && ok || bad "a refused run left $tmp/x"

# The base moved away: the run names it.
mkdir -p "$tmp/moved"
cp -r "$base" "$tmp/moved/base"
check moved-train 0 "$flexc" train --model "$tmp/moved/base" --data "$tmp/text.txt" --lora 2 --steps 1 --batch 2 --seq 32 --out "$tmp/mv"
rm -rf "$tmp/moved/base"
check moved-gen 1 "$flexc" generate --ckpt "$tmp/mv" --prompt "The" --tokens 2
has moved-gen-msg "$tmp/err" "its base model '$tmp/moved/base' is not a Hugging Face model directory here"
check moved-resume 1 "$flexc" train --resume --out "$tmp/mv" --steps 2
has moved-resume-msg "$tmp/err" "base model $tmp/moved/base is not a Hugging Face model directory here"
check moved-export 1 "$flexc" export --ckpt "$tmp/mv" --to "$tmp/mv-peft"
finish cli_lora
