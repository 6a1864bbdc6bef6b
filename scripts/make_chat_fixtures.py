#!/usr/bin/env python3
"""Writes tests/fixtures/chat/<family>/: tokenizer_config.json (the family's chat template, as a
model directory holds it, with its bos/eos tokens), tokenizer.json (a link to a fixture tokenizer
of the repository), cases.jsonl with labels.out and render.out (what `flexc tokenize --chat
cases.jsonl --labels` and `--render` must print) and expected.json: for each case, the conversation, add_generation_prompt, the
text transformers' apply_chat_template renders, its ids (the tokenizer's encode of that text,
add_special_tokens=False, as apply_chat_template(tokenize=True) does) and, without a generation
prompt, the assistant-only labels found by the prefix rule of docs/chat.md (computed here from
transformers' renderings, independently of flexc). tests/test_chat.c and tests/cli_chat.sh compare
flexc against these files, with no Python at test time.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install transformers jinja2 tokenizers
    /tmp/venv/bin/python scripts/make_chat_fixtures.py [--out tests/fixtures/chat]

No Hugging Face Hub access is needed: the templates are written below (the upstream templates of
each family, lightly trimmed of tool branches where noted) and the tokenizers are the
repository's fixtures. strftime_now is pinned to 2024-09-05 (flexc: FLEXC_CHAT_DATE=2024-09-05).
"""
import argparse
import datetime as _dt
import json
import os

import transformers.utils.chat_template_utils as ctu
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

DATE = _dt.datetime(2024, 9, 5, 12, 0, 0)


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return DATE


ctu.datetime = _FixedDatetime  # strftime_now reads datetime.now()

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
           "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
           "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
          "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

LLAMA3_2 = r'''{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
'''

QWEN2_5 = r'''{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
'''

MISTRAL = r'''{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
'''

# family: (template, tokenizer.json relative to tests/fixtures, bos, eos)
FAMILIES = {
    "llama3": (LLAMA3, "models/llama3_tied/tokenizer.json", "<|begin_of_text|>", "<|eot_id|>"),
    "llama3_2": (LLAMA3_2, "models/llama3_tied/tokenizer.json", "<|begin_of_text|>", "<|eot_id|>"),
    "qwen2": (QWEN2_5, "tokenizers/qwen2/tokenizer.json", None, "<|im_end|>"),
    "mistral": (MISTRAL, "tokenizers/mistral/tokenizer.json", "<s>", "</s>"),
    "smollm2": (SMOLLM2, "tokenizers/smollm/tokenizer.json", "<|im_start|>", "<|im_end|>"),
    "chatml": (CHATML, "tokenizers/gpt2/tokenizer.json", None, "<|endoftext|>"),
}

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi there. How can I help?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"},
     {"role": "assistant", "content": "6, of course."}],
    [{"role": "user", "content": "Grüß dich! 日本語で話せますか？ 🙂"},
     {"role": "assistant", "content": "はい、少し。 Ça va? — «oui»"}],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}],
    [{"role": "user", "content": "  spaced out \n"}, {"role": "assistant", "content": "\nA reply\twith \"quotes\"\n"}],
]


def lcp(x, y):
    n = 0
    while n < len(x) and n < len(y) and x[n] == y[n]:
        n += 1
    return n


def labels_for(tok, render, msgs, ids):
    """docs/chat.md's rule: for assistant message m, P = render(msgs[:m], generation prompt),
    W = render(msgs[:m+1]); the text must be prefixes (P of W, W of the whole). The tokens from
    the first one where ids(P) and ids are not the same, to the end of ids(W) (or, when a token
    spans W's end, to that token included) carry the loss."""
    full = render(msgs, False)
    labels = [-100] * len(ids)
    for m, msg in enumerate(msgs):
        if msg["role"] != "assistant":
            continue
        pre, with_ = render(msgs[:m], True), render(msgs[:m + 1], False)
        assert with_.startswith(pre) and full.startswith(with_), "text prefix property"
        a = lcp(tok.encode(pre, add_special_tokens=False).ids, ids)
        w = tok.encode(with_, add_special_tokens=False).ids
        b = len(w) if lcp(w, ids) == len(w) else lcp(w, ids) + 1
        for i in range(a, b):
            labels[i] = ids[i]
    return labels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/chat")
    args = ap.parse_args()
    fixtures = os.path.dirname(os.path.abspath(args.out.rstrip("/")))
    for family, (tmpl, tok_rel, bos, eos) in FAMILIES.items():
        d = os.path.join(args.out, family)
        os.makedirs(d, exist_ok=True)
        link = os.path.join(d, "tokenizer.json")
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(os.path.join("..", "..", tok_rel), link)
        cfg = {"chat_template": tmpl, "eos_token": eos}
        if bos is not None:
            cfg["bos_token"] = bos
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, ensure_ascii=False, indent=1)
            f.write("\n")
        tok_path = os.path.join(fixtures, tok_rel)
        hf = PreTrainedTokenizerFast(tokenizer_file=tok_path, bos_token=bos, eos_token=eos)
        tok = Tokenizer.from_file(tok_path)

        def render(msgs, gen):
            return hf.apply_chat_template(msgs, chat_template=tmpl, tokenize=False, add_generation_prompt=gen)

        cases = []
        for conv in CONVERSATIONS:
            for msgs, gen in ((conv, False), (conv[:-1], True)):
                text = render(msgs, gen)
                ids = tok.encode(text, add_special_tokens=False).ids
                assert ids == hf.apply_chat_template(msgs, chat_template=tmpl, tokenize=True,
                                                     add_generation_prompt=gen, return_dict=False)
                case = {"messages": msgs, "add_generation_prompt": gen, "text": text, "ids": ids}
                if not gen:
                    case["labels"] = labels_for(tok, render, msgs, ids)
                cases.append(case)
        # for tests/cli_chat.sh: the conversations and what tokenize --chat prints for them
        plain = [c for c in cases if not c["add_generation_prompt"]]
        with open(os.path.join(d, "cases.jsonl"), "w", encoding="utf-8") as f:
            for c in plain:
                f.write(json.dumps({"messages": c["messages"]}, ensure_ascii=False) + "\n")
        with open(os.path.join(d, "labels.out"), "w", encoding="utf-8") as f:
            for c in plain:
                f.write(json.dumps({"ids": c["ids"], "labels": c["labels"]}, separators=(",", ":")) + "\n")
        with open(os.path.join(d, "render.out"), "w", encoding="utf-8") as f:
            for c in plain:
                f.write(json.dumps(c["text"], ensure_ascii=False) + "\n")
        with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
            json.dump({"family": family, "date": DATE.strftime("%Y-%m-%d"), "cases": cases}, f,
                      ensure_ascii=False)
            f.write("\n")
        print(f"{family}: {len(cases)} cases")


if __name__ == "__main__":
    main()
