#!/usr/bin/env bash
# flexc tokenize --chat: for every family of tests/fixtures/chat (made by
# scripts/make_chat_fixtures.py with transformers' apply_chat_template), --render prints the text
# byte for byte and --labels the ids and assistant-only labels; the plain form prints the ids;
# prompt/completion lines; errors: a malformed JSONL line (with its number, before any output),
# raise_exception's message, a template refused by name and line, usage errors (exit 2); flexc
# train on chat JSONL (tests/fixtures/chat_model: a fixture model with Llama 3's template): it
# trains with a finite loss, resumes bit for bit from its own out/hf (chat_template.jinja kept),
# and refuses a malformed line, a template that cannot label and a missing template before
# training.
set -u
flexc=${1:?path to flexc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.sh"
fix="${FLEXC_SOURCE_DIR:-$(dirname "$0")/..}/tests/fixtures/chat"
export FLEXC_CHAT_DATE=2024-09-05 # what strftime_now formats (the fixtures' date)

for f in llama3 llama3_2 qwen2 mistral smollm2 chatml; do
    check "render-$f" 0 "$flexc" tokenize --model "$fix/$f" --chat "$fix/$f/cases.jsonl" --render
    same "render-$f-text" "$tmp/out" "$fix/$f/render.out"
    check "labels-$f" 0 "$flexc" tokenize --model "$fix/$f" --chat "$fix/$f/cases.jsonl" --labels
    same "labels-$f-ids" "$tmp/out" "$fix/$f/labels.out"
    check "ids-$f" 0 "$flexc" tokenize --model "$fix/$f" --chat "$fix/$f/cases.jsonl"
    sed 's/^{"ids":\(\[[^]]*\]\),.*/\1/' "$fix/$f/labels.out" >"$tmp/ids.want"
    same "ids-$f-ids" "$tmp/out" "$tmp/ids.want"
done

# prompt/completion is a user turn and an assistant turn
printf '{"prompt": "Hello!", "completion": "Hi there. How can I help?"}\n' >"$tmp/pc.jsonl"
check prompt-completion 0 "$flexc" tokenize --model "$fix/chatml" --chat "$tmp/pc.jsonl" --labels
head -1 "$fix/chatml/labels.out" >"$tmp/pc.want"
same prompt-completion-same "$tmp/out" "$tmp/pc.want"

# A bad line anywhere: its number and what is wrong, and nothing printed.
{ head -2 "$fix/chatml/cases.jsonl"; echo; printf '{"messages": [{"role": "user", "content": 3}]}\n'; } >"$tmp/bad.jsonl"
check bad-line 1 "$flexc" tokenize --model "$fix/chatml" --chat "$tmp/bad.jsonl"
has bad-line-msg "$tmp/err" "flexc: error: tokenize: $tmp/bad.jsonl:4: message 1: \"content\" must be a string"
[[ ! -s "$tmp/out" ]] && ok || bad "bad-line: printed before the error"
printf '{"messages": [{"role": "user", "content": "a"}]}\n{"messages": \n' >"$tmp/bad2.jsonl"
check bad-json 1 "$flexc" tokenize --model "$fix/chatml" --chat "$tmp/bad2.jsonl"
has bad-json-msg "$tmp/err" "$tmp/bad2.jsonl:2: not valid JSON"

# The template's own refusal (Mistral: roles must alternate), with the line of the conversation.
printf '{"messages": [{"role": "user", "content": "a"}]}\n{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}\n' >"$tmp/alt.jsonl"
check raise 1 "$flexc" tokenize --model "$fix/mistral" --chat "$tmp/alt.jsonl"
has raise-msg "$tmp/err" "$tmp/alt.jsonl:2: chat template line 11: raise_exception: After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."

# A template outside the subset: refused by name and line.
mkdir "$tmp/m"
cp "$fix/chatml/tokenizer.json" "$tmp/m/"
printf '{"chat_template": "{%% for m in messages %%}\\n{%% macro x() %%}{%% endmacro %%}{%% endfor %%}"}' >"$tmp/m/tokenizer_config.json"
check macro 1 "$flexc" tokenize --model "$tmp/m" --chat "$fix/chatml/cases.jsonl"
has macro-msg "$tmp/err" "tokenizer_config.json: chat template line 2: unsupported Jinja construct 'macro'"
# chat_template.jinja wins over tokenizer_config.json
printf '{{ messages[0].content }}|' >"$tmp/m/chat_template.jinja"
check jinja 0 "$flexc" tokenize --model "$tmp/m" --chat "$tmp/pc.jsonl" --render
has jinja-text "$tmp/out" '"Hello!|"'
printf '{"eos_token": "x"}' >"$tmp/m/tokenizer_config.json"
rm "$tmp/m/chat_template.jinja"
check no-template 1 "$flexc" tokenize --model "$tmp/m" --chat "$tmp/pc.jsonl"
has no-template-msg "$tmp/err" "no chat template"

# Usage errors.
check labels-alone 2 "$flexc" tokenize --model "$fix/chatml" --text hi --labels
has labels-alone-msg "$tmp/err" "--labels and --render go with --chat"
check chat-text 2 "$flexc" tokenize --model "$fix/chatml" --chat "$tmp/pc.jsonl" --text hi
check chat-both 2 "$flexc" tokenize --model "$fix/chatml" --chat "$tmp/pc.jsonl" --labels --render
check chat-file-model 2 "$flexc" tokenize --model "$fix/chatml/tokenizer.json" --chat "$tmp/pc.jsonl"
has chat-file-model-msg "$tmp/err" "--chat needs --model DIR"
check no-file 1 "$flexc" tokenize --model "$fix/chatml" --chat "$tmp/nothing.jsonl"
has no-file-msg "$tmp/err" "$tmp/nothing.jsonl: No such file or directory"

# flexc train --data FILE.jsonl: chat data, the loss on the assistants' tokens.
cm="${FLEXC_SOURCE_DIR:-$(dirname "$0")/..}/tests/fixtures/chat_model"
train=(train --batch 2 --seq 32)
check train 0 "$flexc" "${train[@]}" --model "$cm" --data "$cm/train.jsonl" --steps 3 --out "$tmp/run" --quiet
[[ -s "$tmp/run/checkpoint.safetensors" && -s "$tmp/run/model.safetensors" ]] && ok || bad "train: no checkpoint"
[[ $(grep -c '"step"' "$tmp/run/metrics.jsonl") -eq 3 ]] && ok || bad "train: not 3 steps in metrics.jsonl"
if grep -qiE '"(val_)?loss":(nan|inf|-inf)' "$tmp/run/metrics.jsonl"; then bad "train: a loss is not finite"; else ok; fi
check train-header 0 "$flexc" "${train[@]}" --model "$cm" --data "$cm/train.jsonl" --steps 1 --out "$tmp/run1"
has train-source "$tmp/out" "data: $cm/train.jsonl (chat, 9 conversations): "
# the document mask keeps the packed conversations apart
check train-document 0 "$flexc" "${train[@]}" --model "$cm" --data "$cm/train.jsonl" --steps 2 --attn document \
    --out "$tmp/rdoc" --quiet

# --resume: the template from the run's own out/hf (here chat_template.jinja, the model's
# directory gone by then), the same bits as a run straight through.
mkdir "$tmp/m2"
cp -L "$cm"/{config.json,generation_config.json,model.safetensors,tokenizer.json} "$tmp/m2/"
printf '{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}' >"$tmp/m2/tokenizer_config.json"
printf '%s' "{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + \
'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}\
{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}\
{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}" >"$tmp/m2/chat_template.jinja"
check m2-ids 0 "$flexc" tokenize --model "$tmp/m2" --chat "$cm/train.jsonl" --labels
mv "$tmp/out" "$tmp/m2.labels"
check cm-ids 0 "$flexc" tokenize --model "$cm" --chat "$cm/train.jsonl" --labels
same m2-same-labels "$tmp/out" "$tmp/m2.labels"
cp "$cm/train.jsonl" "$tmp/train.jsonl"
check straight 0 "$flexc" "${train[@]}" --model "$tmp/m2" --data "$tmp/train.jsonl" --steps 5 --out "$tmp/r5" --quiet
check until 0 "$flexc" "${train[@]}" --model "$tmp/m2" --data "$tmp/train.jsonl" --steps 5 --until 3 --out "$tmp/r3" \
    --quiet
same kept-template "$tmp/r3/hf/chat_template.jinja" "$tmp/m2/chat_template.jinja"
rm -rf "$tmp/m2"
check resume 0 "$flexc" train --resume --out "$tmp/r3"
has resume-step "$tmp/out" "step 5/5"
same resume-bits "$tmp/r3/model.safetensors" "$tmp/r5/model.safetensors"
# the conversations changed: the resumed run says so
sed -i 's/Paris\./Lyon./' "$tmp/train.jsonl"
check resume-changed 1 "$flexc" train --resume --out "$tmp/r5" --steps 6
has resume-changed-msg "$tmp/err" "is not the text the checkpoint was trained on"

# Refused before training: a malformed line (with its number), a template that cannot say which
# tokens are the assistant's, a model without a template.
{ head -3 "$cm/train.jsonl"; printf '{"messages": [{"role": "user"}]}\n'; } >"$tmp/badtrain.jsonl"
check train-bad-line 1 "$flexc" "${train[@]}" --model "$cm" --data "$tmp/badtrain.jsonl" --steps 3 --out "$tmp/rb"
has train-bad-line-msg "$tmp/err" "flexc: error: --data: $tmp/badtrain.jsonl:4: message 1: \"content\" must be a string"
[[ ! -e "$tmp/rb/checkpoint.safetensors" && ! -e "$tmp/rb/hf" ]] && ok ||
    bad "train-bad-line: a checkpoint or the model's files were written: $(ls "$tmp/rb")"
lacks train-bad-line-steps "$tmp/out" "step 1"
mkdir "$tmp/m3"
cp -L "$cm"/{config.json,generation_config.json,model.safetensors,tokenizer.json} "$tmp/m3/"
printf '{"chat_template": "{%% for m in messages %%}{{ m.content }}{%% if loop.last %%}!{%% endif %%}|{%% endfor %%}"}' \
    >"$tmp/m3/tokenizer_config.json"
check train-unlabelled 1 "$flexc" "${train[@]}" --model "$tmp/m3" --data "$cm/train.jsonl" --steps 3 --out "$tmp/ru"
has train-unlabelled-msg "$tmp/err" "$cm/train.jsonl:1: chat template: the rendering of message 2 (assistant) is not a prefix of the conversation's; assistant labels cannot be found with this template"
printf '{"eos_token": "x"}' >"$tmp/m3/tokenizer_config.json"
check train-no-template 1 "$flexc" "${train[@]}" --model "$tmp/m3" --data "$cm/train.jsonl" --steps 3 --out "$tmp/rn"
has train-no-template-msg "$tmp/err" "--data: $cm/train.jsonl is chat data (a .jsonl file) and needs the model's chat template: "
has train-no-template-why "$tmp/err" "no chat template"
check train-lossy 2 "$flexc" "${train[@]}" --model "$cm" --data "$cm/train.jsonl" --lossy-text --out "$tmp/rl"

finish cli_chat
