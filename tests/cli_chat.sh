#!/usr/bin/env bash
# flexc tokenize --chat: for every family of tests/fixtures/chat (made by
# scripts/make_chat_fixtures.py with transformers' apply_chat_template), --render prints the text
# byte for byte and --labels the ids and assistant-only labels; the plain form prints the ids;
# prompt/completion lines; errors: a malformed JSONL line (with its number, before any output),
# raise_exception's message, a template refused by name and line, usage errors (exit 2).
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

finish cli_chat
