/* Chat templates and chat data (src/tokenizer/chat*.c): the engine's Jinja subset against
   hand-written expectations, every fixture family of tests/fixtures/chat (made by
   scripts/make_chat_fixtures.py with transformers' apply_chat_template) byte for byte, id for id
   and label for label, the refusals (by name and line), raise_exception's message, JSONL errors
   with their line numbers, a known conversation's label mask, the bounds, and chat data packed
   for training (separators, the loss mask, the windows and the hash of fx__model_data). */
#include "harness.h"
#include "model/model.h"
#include "tokenizer/chat.h"

#include <jansson.h>
#include <unistd.h>

static char fixture_dir[4096];

static const char *const FAMILIES[] = {"llama3", "llama3_2", "qwen2", "mistral", "smollm2", "chatml"};

/* renders src with messages (role, content pairs, NULL-ended) and returns the text (static) */
static int render_s(const char *src, const char *const *rc, bool gen, char **out)
{
    fx__chat_template *t = NULL;
    fx__chat_msg m[16];
    size_t n = 0;
    for (; rc && rc[2 * n]; n++)
        m[n] = (fx__chat_msg){rc[2 * n], rc[2 * n + 1]};
    int r = fx__chat_template_compile(&t, src, strlen(src));
    if (r != FX_OK)
        return r;
    fx__chat_vars v = {.bos_token = "<s>", .eos_token = "</s>", .add_generation_prompt = gen, .date = "2024-09-05"};
    size_t len;
    r = fx__chat_template_render(t, m, n, &v, out, &len);
    if (r == FX_OK && strlen(*out) != len)
        r = FX_EINVAL;
    fx__chat_template_free(t);
    return r;
}

#define RENDERS(src, msgs, gen, want)                                                           \
    do {                                                                                        \
        char *got_ = NULL;                                                                      \
        FXT_OK(render_s(src, msgs, gen, &got_));                                                \
        FXT_EQ_STR(got_, want);                                                                 \
        free(got_);                                                                             \
    } while (0)

#define REFUSES(src, msgs, msg)                                                                 \
    do {                                                                                        \
        char *got_ = NULL;                                                                      \
        FXT_STATUS(render_s(src, msgs, false, &got_), FX_EFORMAT, msg);                         \
        FXT_CHECK(got_ == NULL);                                                                \
    } while (0)

static const char *const TWO[] = {"user", "Hi", "assistant", "Hello", NULL};

static void test_expressions(void)
{
    RENDERS("{{ 1 + 2 }}|{{ 'a' ~ 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 2 * 3 - 1 }}", NULL, false,
            "3|a3|3|-4|2|5");
    RENDERS("{{ 'x' if true else 'y' }}{{ 'z' if none }}|{{ not none }}|{{ 1 == true }}|{{ 'b' < 'ab' }}", NULL,
            false, "x|True|True|False");
    RENDERS("{{ [1, 2, 3][1:] | length }}{{ 'héllo'[1:3] }}{{ 'abc'[-1] }}{{ [1,2,3][::-1] | tojson }}", NULL,
            false, "2élc[3, 2, 1]");
    RENDERS("{{ {'a': 1, 'b': [true, none, 'q\"\\n']} | tojson }}", NULL, false,
            "{\"a\": 1, \"b\": [true, null, \"q\\\"\\n\"]}");
    RENDERS("{{ '  pad \\n' | trim }}|{{ 'AbC' | upper }}{{ 'AbC' | lower }}|{{ x | default('d') }}|{{ none }}", NULL,
            false, "pad|ABCabc|d|None");
    RENDERS("{% for k, v in {'a': 1, 'b': 2} | items %}{{ k }}={{ v }};{% endfor %}", NULL, false, "a=1;b=2;");
    RENDERS("{{ 'ell' in 'hello' }}{{ 2 in [1, 2] }}{{ 'a' not in {'a': 1} }}{{ x is defined }}{{ none is none }}"
            "{{ 'a' is string }}{{ 1 is not string }}",
            NULL, false, "TrueTrueFalseFalseTrueTrueTrue");
    RENDERS("{{ messages[0].role }} {{ messages[1]['content'] }} {{ messages | length }} {{ messages[5] is defined }}",
            TWO, false, "user Hello 2 False");
    RENDERS("{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}{{ tools is none }}{{ date_string is defined }}",
            NULL, true, "<s></s>TrueTrueFalse");
    RENDERS("{{ strftime_now('%d %b %Y') }}", NULL, false, "05 Sep 2024");
    RENDERS("{{ '  x '.strip() }}{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}", NULL, false, "xTrueTrue");
}

static void test_statements(void)
{
    RENDERS("{% for m in messages %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
            "{{ m.role }};{% endfor %}",
            TWO, false, "01TrueFalse2user;12FalseTrue2assistant;");
    RENDERS("{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set x = 9 %}"
            "{% endfor %}{{ ns.n }}{{ x is defined }}",
            TWO, false, "2False");
    RENDERS("{% if 1 > 2 %}a{% elif 2 > 1 %}b{% else %}c{% endif %}{% if false %}d{% else %}e{% endif %}", NULL,
            false, "be");
    RENDERS("{# a comment #}{% set m = messages[1:] %}{{ m[0].content }}", TWO, false, "Hello");
    /* whitespace: trim_blocks and lstrip_blocks, '-' on either side, '+' */
    RENDERS("a\n  {% if true %}\n  b\n  {% endif %}\nc", NULL, false, "a\n  b\nc");
    RENDERS("a  {{- ' b ' -}}  \n c", NULL, false, "a b c");
    RENDERS("a\n  {%+ if true %}x{% endif +%}\ny", NULL, false, "a\n  x\ny");
    RENDERS("a\n  {# c #}\nb {{ 'v' }}\n", NULL, false, "a\nb v\n");
}

static void test_refusals(void)
{
    REFUSES("x\n\n{% macro f() %}{% endmacro %}", NULL, "chat template line 3: unsupported Jinja construct 'macro'");
    REFUSES("{{ 'a' | replace('a', 'b') }}", NULL, "line 1: unsupported Jinja construct 'filter replace'");
    REFUSES("\n{{ x is divisibleby(3) }}", NULL, "line 2: unsupported Jinja construct 'test divisibleby'");
    REFUSES("{% for m in messages %}{% break %}{% endfor %}", NULL, "unsupported Jinja construct 'break'");
    REFUSES("{{ 1.5 }}", NULL, "unsupported Jinja construct 'float literal'");
    REFUSES("{{ 'a'.split(',') }}", NULL, "unsupported Jinja construct 'method split' of a string");
    REFUSES("{% for m in messages %}x", NULL, "line 1: 'for' is never closed by 'endfor'");
    REFUSES("{% if true %}", NULL, "'if' is never closed by 'endif'");
    REFUSES("{{ 1 + }}", NULL, "line 1: expected an expression");
    REFUSES("{{ 'unterminated }}", NULL, "unclosed");
    REFUSES("{{ [1] }}", NULL, "unsupported Jinja construct 'printing a list'");
    REFUSES("{{ x.y }}", NULL, "'y' of an undefined value");
    REFUSES("{{ 1 < 2 < 3 }}", NULL, "unsupported Jinja construct 'chained comparison'");
    REFUSES("{% set ns.x = 1 %}", NULL, "'ns' is not a namespace");
    REFUSES("{{ 1 // 0 }}", NULL, "division or modulo by zero");
    REFUSES("a\n{% if messages[0].role != 'system' %}{{ raise_exception('roles must alternate') }}{% endif %}", TWO,
            "chat template line 2: raise_exception: roles must alternate");
    REFUSES("{{ 'é' | upper }}", NULL, "'upper' of non-ASCII text");
}

static void test_bounds(void)
{
    /* deep nesting, a long loop, a large output: errors, not crashes */
    char deep[4096] = "{{ ";
    for (int i = 0; i < 500; i++)
        strcat(deep, "(");
    strcat(deep, "1");
    for (int i = 0; i < 500; i++)
        strcat(deep, ")");
    strcat(deep, " }}");
    REFUSES(deep, NULL, "nesting deeper than");
    REFUSES("{% set l = [0,1,2,3,4,5,6,7,8,9] %}{% for a in l %}{% for b in l %}{% for c in l %}{% for d in l %}"
            "{% for e in l %}{% for f in l %}{% for g in l %}x{% endfor %}{% endfor %}{% endfor %}{% endfor %}"
            "{% endfor %}{% endfor %}{% endfor %}",
            NULL, "more than 65536 loop iterations");
    /* values nested 1000 deep: comparing or printing them is refused, not a deep recursion */
#define NEST "{% set ns = namespace(x=[]) %}{% set l = [0,1,2,3,4,5,6,7,8,9] %}{% for a in l %}{% for b in l %}" \
             "{% for c in l %}{% set ns.x = [ns.x] %}{% endfor %}{% endfor %}{% endfor %}"
    REFUSES(NEST "{{ ns.x == ns.x }}", NULL, "comparison of values nested deeper than 64");
    REFUSES(NEST "{{ ns.x | tojson }}", NULL, "tojson: nesting deeper than 64");
    RENDERS(NEST "{{ ns.x | length }}", NULL, false, "1");
#undef NEST
    /* doubling a string: the output or the memory bound stops it */
    char *out = NULL;
    fx_clear_error();
    int rc = render_s("{% set s = namespace(t='xxxxxxxxxxxxxxxx') %}{% set l = [0,1,2,3,4,5,6,7,8,9] %}{% for a in l %}"
                      "{% for b in l %}{% for c in l %}{% for d in l %}{{ s.t ~ s.t ~ s.t ~ s.t ~ s.t ~ s.t ~ s.t ~ s.t }}"
                      "{% endfor %}{% endfor %}{% endfor %}{% set s.t = s.t ~ s.t %}{% endfor %}",
                      NULL, false, &out);
    FXT_EQ_INT(rc, FX_EFORMAT);
    FXT_CHECK(strstr(fx_last_error(), "output longer than") || strstr(fx_last_error(), "rendering needs more than"));
}

static json_t *load_json(const char *path)
{
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    if (!j)
        FXT_FAIL("%s: %s", path, e.text);
    return j;
}

/* Every family's fixture: text byte-identical, ids identical, labels identical. */
static void test_fixtures(void)
{
    for (size_t f = 0; f < sizeof FAMILIES / sizeof *FAMILIES; f++) {
        char dir[4200], path[4300];
        snprintf(dir, sizeof dir, "%s/chat/%s", fixture_dir, FAMILIES[f]);
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        fx_tokenizer *tok = NULL;
        FXT_OK(fx_tokenizer_load(&tok, path));
        fx__chat *chat = NULL;
        FXT_OK(fx__chat_load(&chat, dir, tok));
        snprintf(path, sizeof path, "%s/expected.json", dir);
        json_t *exp = load_json(path);
        if (!tok || !chat || !exp) {
            fx__chat_free(chat);
            fx_tokenizer_free(tok);
            json_decref(exp);
            continue;
        }
        fx__chat_set_date(chat, json_string_value(json_object_get(exp, "date")));
        size_t ci, checked = 0;
        json_t *cs;
        json_array_foreach(json_object_get(exp, "cases"), ci, cs) {
            json_t *msgs = json_object_get(cs, "messages");
            fx__chat_conv conv = {.n = json_array_size(msgs)};
            fx__chat_msg m[8];
            conv.msg = m;
            for (size_t i = 0; i < conv.n && i < 8; i++)
                m[i] = (fx__chat_msg){json_string_value(json_object_get(json_array_get(msgs, i), "role")),
                                      json_string_value(json_object_get(json_array_get(msgs, i), "content"))};
            bool gen = json_is_true(json_object_get(cs, "add_generation_prompt"));
            char *text = NULL;
            size_t len = 0;
            FXT_OK(fx__chat_render(chat, m, conv.n, gen, &text, &len));
            json_t *want = json_object_get(cs, "text");
            if (!text || len != json_string_length(want) || memcmp(text, json_string_value(want), len))
                FXT_FAIL("%s case %zu: text\n  got  %s\n  want %s", FAMILIES[f], ci, text ? text : "(null)",
                         json_string_value(want));
            free(text);
            json_t *jl = json_object_get(cs, "labels");
            if (gen) { /* the ids of the text with the generation prompt */
                snprintf(path, sizeof path, "%s", "");
                char *t2 = NULL;
                size_t l2 = 0;
                fx_ids ids = {0};
                FXT_OK(fx__chat_render(chat, m, conv.n, true, &t2, &l2));
                FXT_OK(fx_tokenizer_encode(tok, &ids, t2 ? t2 : "", l2));
                json_t *wi = json_object_get(cs, "ids");
                bool same = ids.n == (int64_t)json_array_size(wi);
                for (int64_t i = 0; same && i < ids.n; i++)
                    same = ids.ids[i] == json_integer_value(json_array_get(wi, (size_t)i));
                if (!same)
                    FXT_FAIL("%s case %zu: ids differ (%lld vs %zu)", FAMILIES[f], ci, (long long)ids.n,
                             json_array_size(wi));
                free(t2);
                fx_ids_free(&ids);
            } else {
                fx_ids ids = {0};
                int32_t *lab = NULL;
                FXT_OK(fx__chat_encode(chat, &conv, &ids, &lab));
                json_t *wi = json_object_get(cs, "ids");
                bool same = ids.n == (int64_t)json_array_size(wi) && ids.n == (int64_t)json_array_size(jl);
                for (int64_t i = 0; same && i < ids.n; i++)
                    same = ids.ids[i] == json_integer_value(json_array_get(wi, (size_t)i)) &&
                           lab[i] == json_integer_value(json_array_get(jl, (size_t)i));
                if (!same)
                    FXT_FAIL("%s case %zu: ids or labels differ", FAMILIES[f], ci);
                free(lab);
                fx_ids_free(&ids);
            }
            checked++;
        }
        FXT_EQ_INT(checked, 10);
        json_decref(exp);
        fx__chat_free(chat);
        fx_tokenizer_free(tok);
    }
}

/* A known conversation on the ChatML template with the gpt2 fixture tokenizer: the label mask is
   exactly the tokens of each assistant's content and its "<|im_end|>\n". */
static void test_label_mask(void)
{
    char path[4300];
    snprintf(path, sizeof path, "%s/chat/chatml/tokenizer.json", fixture_dir);
    fx_tokenizer *tok = NULL;
    FXT_OK(fx_tokenizer_load(&tok, path));
    if (!tok)
        return;
    const char *tmpl = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                       "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                       "{% endif %}";
    fx__chat *chat = NULL;
    FXT_OK(fx__chat_create(&chat, tmpl, strlen(tmpl), NULL, NULL, tok));
    fx__chat_msg m[4] = {{"user", "Hi"}, {"assistant", "Yo"}, {"user", "Bye"}, {"assistant", "Ciao"}};
    fx__chat_conv conv = {m, 4, 1};
    fx_ids ids = {0};
    int32_t *lab = NULL;
    FXT_OK(fx__chat_encode(chat, &conv, &ids, &lab));
    /* the labelled tokens decode to the two replies with their end of turn, the rest to the rest */
    fx_text in = {0}, out = {0};
    int32_t *buf = malloc((size_t)(ids.n ? ids.n : 1) * sizeof *buf);
    int64_t nl = 0, no = 0;
    int32_t *other = malloc((size_t)(ids.n ? ids.n : 1) * sizeof *other);
    for (int64_t i = 0; lab && i < ids.n; i++) {
        if (lab[i] == FX__CHAT_IGNORE)
            other[no++] = ids.ids[i];
        else {
            FXT_EQ_INT(lab[i], ids.ids[i]);
            buf[nl++] = ids.ids[i];
        }
    }
    FXT_OK(fx_tokenizer_decode(tok, &in, buf, nl));
    FXT_OK(fx_tokenizer_decode(tok, &out, other, no));
    FXT_EQ_STR(in.data, "Yo<|im_end|>\nCiao<|im_end|>\n");
    FXT_EQ_STR(out.data, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<|im_start|>user\nBye<|im_end|>\n"
                         "<|im_start|>assistant\n");
    /* a label run is contiguous per reply: two runs */
    int runs = 0;
    for (int64_t i = 0; lab && i < ids.n; i++)
        runs += lab[i] != FX__CHAT_IGNORE && (i == 0 || lab[i - 1] == FX__CHAT_IGNORE);
    FXT_EQ_INT(runs, 2);
    free(buf);
    free(other);
    fx_text_free(&in);
    fx_text_free(&out);
    free(lab);
    fx_ids_free(&ids);
    fx__chat_free(chat);

    /* a template whose earlier turns change with later ones is refused for labels */
    const char *bad = "{% for m in messages %}{{ m.content }}{% if loop.last %}!{% endif %}|{% endfor %}";
    FXT_OK(fx__chat_create(&chat, bad, strlen(bad), NULL, NULL, tok));
    ids = (fx_ids){0};
    lab = NULL;
    FXT_STATUS(fx__chat_encode(chat, &conv, &ids, &lab), FX_EFORMAT,
               "the rendering of message 2 (assistant) is not a prefix of the conversation's");
    free(lab);
    fx_ids_free(&ids);
    fx__chat_free(chat);
    fx_tokenizer_free(tok);
}

static void test_jsonl(void)
{
    fx__chat_data d;
    const char *good = "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"U\"},"
                       " {\"role\": \"assistant\", \"content\": \"A\"}]}\n\n  \n{\"prompt\": \"P\", \"completion\": \"C\"}\n";
    FXT_OK(fx__chat_data_parse(&d, "g.jsonl", good, strlen(good)));
    FXT_EQ_INT(d.n, 2);
    if (d.n == 2) {
        FXT_EQ_INT(d.conv[0].n, 3);
        FXT_EQ_STR(d.conv[0].msg[2].role, "assistant");
        FXT_EQ_STR(d.conv[1].msg[0].role, "user");
        FXT_EQ_STR(d.conv[1].msg[0].content, "P");
        FXT_EQ_STR(d.conv[1].msg[1].role, "assistant");
        FXT_EQ_STR(d.conv[1].msg[1].content, "C");
        FXT_EQ_INT(d.conv[1].line, 4);
    }
    fx__chat_data_free(&d);
    struct {
        const char *text, *msg;
    } bad[] = {
        {"{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"messages\": [}\n", "b.jsonl:2: not valid JSON"},
        {"\n\n[1, 2]\n", "b.jsonl:3: a line must be a JSON object"},
        {"{\"messages\": []}", "b.jsonl:1: \"messages\" must be a non-empty array"},
        {"{\"messages\": [{\"role\": \"user\"}]}", "b.jsonl:1: message 1: \"content\" must be a string"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"content\": \"y\"}]}",
         "b.jsonl:1: message 2: \"role\" must be a non-empty string"},
        {"{\"prompt\": \"a\"}", "b.jsonl:1: \"prompt\" and \"completion\" must both be strings"},
        {"{\"text\": \"a\"}", "b.jsonl:1: no \"messages\" and no \"prompt\"/\"completion\""},
        {"{\"prompt\": \"a\", \"completion\": \"b\", \"messages\": [{}]}", "b.jsonl:1: give either"},
        {"{\"prompt\": \"a\\u0000\", \"completion\": \"b\"}", "b.jsonl:1: not valid JSON: \\u0000 is not allowed"},
        {"\n \n", "b.jsonl: no conversations"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        FXT_STATUS(fx__chat_data_parse(&d, "b.jsonl", bad[i].text, strlen(bad[i].text)), FX_EFORMAT, bad[i].msg);
        FXT_EQ_INT(d.n, 0);
    }
}

static void test_config_forms(void)
{
    /* tokenizer_config.json with a list of named templates, AddedToken-style special tokens, and
       chat_template.jinja taking precedence */
    char dir[] = "/tmp/flexc_chat_XXXXXX";
    if (!mkdtemp(dir)) {
        FXT_FAIL("mkdtemp");
        return;
    }
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"bos_token\": {\"content\": \"<B>\"}, \"eos_token\": \"<E>\", \"chat_template\": ["
          "{\"name\": \"tool_use\", \"template\": \"T\"}, {\"name\": \"default\", \"template\": \"{{ bos_token }}D{{ eos_token }}\"}]}",
          f);
    fclose(f);
    fx__chat *chat = NULL;
    FXT_OK(fx__chat_load(&chat, dir, NULL));
    char *text = NULL;
    size_t len;
    if (chat) {
        FXT_OK(fx__chat_render(chat, NULL, 0, false, &text, &len));
        FXT_EQ_STR(text, "<B>D<E>");
        free(text);
        fx__chat_free(chat);
    }
    char jpath[256];
    snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", dir);
    f = fopen(jpath, "w");
    fputs("J{{ eos_token }}\n", f);
    fclose(f);
    FXT_OK(fx__chat_load(&chat, dir, NULL));
    if (chat) {
        FXT_OK(fx__chat_render(chat, NULL, 0, false, &text, &len));
        FXT_EQ_STR(text, "J<E>\n");
        free(text);
        fx__chat_free(chat);
    }
    remove(jpath);
    f = fopen(path, "w");
    fputs("{\"eos_token\": \"<E>\"}", f);
    fclose(f);
    FXT_STATUS(fx__chat_load(&chat, dir, NULL), FX_EFORMAT, "no chat template");
    f = fopen(path, "w");
    fputs("{\"chat_template\": \"\\n{% include 'x' %}\"}", f);
    fclose(f);
    FXT_STATUS(fx__chat_load(&chat, dir, NULL), FX_EFORMAT,
               "tokenizer_config.json: chat template line 2: unsupported Jinja construct 'include'");
    remove(path);
    rmdir(dir);
}

/* FNV-1a of ids as fx__model_data hashes plain data (two low bytes, two high ones when set). */
static uint64_t plain_hash(const int32_t *ids, int64_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int64_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        h = (h ^ (v & 0xff)) * 0x100000001b3ull;
        h = (h ^ ((v >> 8) & 0xff)) * 0x100000001b3ull;
        if (v >> 16) {
            h = (h ^ ((v >> 16) & 0xff)) * 0x100000001b3ull;
            h = (h ^ (v >> 24)) * 0x100000001b3ull;
        }
    }
    return h;
}

/* Every window of B x T from a batch call: some offset of d's tokens matches the inputs, and its
   targets are the next tokens where they carry the loss and -100 exactly where they do not; at
   least one target per window carries it. */
static void check_windows(const fx__model_data *d, const int32_t *tok, const int32_t *tgt, int64_t B, int64_t T,
                          int64_t lo, int64_t hi)
{
    for (int64_t b = 0; b < B; b++) {
        const int32_t *x = tok + b * T, *y = tgt + b * T;
        bool found = false;
        for (int64_t off = lo; off + T < hi && !found; off++) {
            bool same = true;
            for (int64_t t = 0; t < T && same; t++)
                same = x[t] == (int32_t)d->tok[off + t] &&
                       y[t] == (d->loss[off + t + 1] ? (int32_t)d->tok[off + t + 1] : -100);
            found = same;
        }
        int64_t carried = 0;
        for (int64_t t = 0; t < T; t++)
            carried += y[t] != -100;
        if (!found || !carried)
            FXT_FAIL("window %lld: %s", (long long)b, found ? "no target carries the loss" : "no offset matches");
    }
}

/* Conversations packed for training (fx__chat_pack) on the chat_model fixture (Llama 3's template
   over the llama3_tied model's tokenizer, eos 1 = <|end_of_text|>, end of turn 2 = <|eot_id|>):
   the ids are each conversation's with a separator after it, the mask is exactly the labels; then
   fx__model_data over them: windows honour the mask, the hash covers it, plain data unchanged. */
static void test_pack(void)
{
    char dir[4200], path[4300];
    snprintf(dir, sizeof dir, "%s/chat_model", fixture_dir);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    fx_tokenizer *tok = NULL;
    FXT_OK(fx_tokenizer_load(&tok, path));
    fx__chat *chat = NULL;
    FXT_OK(fx__chat_load(&chat, dir, tok));
    snprintf(path, sizeof path, "%s/train.jsonl", dir);
    fx__chat_data data;
    FXT_OK(fx__chat_data_load(&data, path));
    if (!tok || !chat || data.n < 3) {
        fx__chat_data_free(&data);
        fx__chat_free(chat);
        fx_tokenizer_free(tok);
        return;
    }
    const int32_t SEP = 1, EOT = 2;
    fx_ids ids = {0};
    uint8_t *loss = NULL;
    FXT_OK(fx__chat_pack(chat, &data, "train.jsonl", SEP, &ids, &loss));
    /* the same by hand: each conversation's ids and labels, then the separator (no loss) */
    fx_ids one = {0};
    int32_t *lab = NULL;
    int64_t at = 0, labelled = 0;
    for (size_t i = 0; i < data.n; i++) {
        FXT_OK(fx__chat_encode(chat, &data.conv[i], &one, &lab));
        FXT_CHECK(one.n > 0 && one.ids[one.n - 1] == EOT); /* the template ends with the turn's end */
        for (int64_t k = 0; k < one.n && at + k < ids.n; k++) {
            if (ids.ids[at + k] != one.ids[k] || loss[at + k] != (lab[k] != FX__CHAT_IGNORE)) {
                FXT_FAIL("conversation %zu token %lld: id %d loss %d, want %d %d", i, (long long)k, ids.ids[at + k],
                         loss[at + k], one.ids[k], lab[k] != FX__CHAT_IGNORE);
                break;
            }
            labelled += lab[k] != FX__CHAT_IGNORE;
        }
        at += one.n;
        FXT_CHECK(at < ids.n && ids.ids[at] == SEP && loss[at] == 0);
        at++;
    }
    FXT_EQ_INT(at, ids.n);
    /* the labelled tokens decode to the replies and their end of turn, nothing else */
    int64_t nl = 0;
    int32_t *sel = malloc((size_t)ids.n * sizeof *sel);
    for (int64_t i = 0; i < ids.n; i++)
        if (loss[i])
            sel[nl++] = ids.ids[i];
    FXT_EQ_INT(nl, labelled);
    fx_text txt = {0};
    FXT_OK(fx_tokenizer_decode(tok, &txt, sel, nl));
    const char *replies = "Hi there. How can I help?<|eot_id|>4<|eot_id|>6, of course.<|eot_id|>Blue.<|eot_id|>";
    if (!txt.data || strncmp(txt.data, replies, strlen(replies)))
        FXT_FAIL("labelled tokens: %s", txt.data ? txt.data : "(null)");
    fx_text_free(&txt);
    free(sel);

    /* a separator already at the end is not doubled: with the end of turn as separator, the
       packing is the conversations back to back */
    fx_ids ids2 = {0};
    uint8_t *loss2 = NULL;
    FXT_OK(fx__chat_pack(chat, &data, "train.jsonl", EOT, &ids2, &loss2));
    FXT_EQ_INT(ids2.n, ids.n - (int64_t)data.n);
    fx_ids_free(&ids2);
    free(loss2);

    /* the data: windows and validation windows honour the mask */
    enum { T = 16, B = 4 };
    fx__model_data d, plain, plain2, flip;
    FXT_OK(fx__model_data_from_ids_loss(&d, ids.ids, loss, ids.n, SEP, "chat", 0.1, T + 1));
    FXT_EQ_INT(d.docs, (int64_t)data.n);
    FXT_CHECK(d.loss != NULL && !d.chat); /* chat is the CLI's to say */
    int32_t tk[B * T], tg[B * T];
    fx_rng rng;
    fx_rng_init(&rng, 7, 0);
    for (int rep = 0; rep < 50; rep++) {
        fx__model_data_batch(&d, &rng, B, T, tk, tg);
        check_windows(&d, tk, tg, B, T, 0, d.n_train);
    }
    for (int64_t i = 0; i < 3; i++) {
        fx__model_data_val_batch(&d, i, B, T, tk, tg);
        check_windows(&d, tk, tg, B, T, d.n_train, d.n);
    }
    /* the hash: plain data as it always was, the mask covered */
    FXT_OK(fx__model_data_from_ids(&plain, ids.ids, ids.n, SEP, "plain", 0.1, T + 1));
    FXT_OK(fx__model_data_from_ids_loss(&plain2, ids.ids, NULL, ids.n, SEP, "plain", 0.1, T + 1));
    FXT_CHECK(plain.loss == NULL && plain2.loss == NULL);
    FXT_CHECK(plain.hash == plain_hash(ids.ids, ids.n));
    FXT_CHECK(plain2.hash == plain.hash);
    FXT_CHECK(d.hash != plain.hash);
    int64_t k = 0;
    while (k < ids.n && !loss[k])
        k++;
    loss[k] = 0; /* one label less */
    FXT_OK(fx__model_data_from_ids_loss(&flip, ids.ids, loss, ids.n, SEP, "chat", 0.1, T + 1));
    FXT_CHECK(flip.hash != d.hash && flip.hash != plain.hash);
    fx__model_data_free(&flip);
    loss[k] = 1;
    FXT_OK(fx__model_data_from_ids_loss(&flip, ids.ids, loss, ids.n, SEP, "chat", 0.1, T + 1));
    FXT_CHECK(flip.hash == d.hash);
    fx__model_data_free(&flip);
    /* plain windows: every target the next token, the same draws as before the mask existed */
    fx_rng r1, r2;
    fx_rng_init(&r1, 9, 0);
    fx_rng_init(&r2, 9, 0);
    int32_t tk2[B * T], tg2[B * T];
    fx__model_data_batch(&plain, &r1, B, T, tk, tg);
    for (int b = 0; b < B; b++) {
        uint64_t r = ((uint64_t)fx_rng_u32(&r2) << 32) | fx_rng_u32(&r2);
        int64_t off = (int64_t)(r % (uint64_t)(plain.n_train - T));
        for (int t = 0; t < T; t++)
            tk2[b * T + t] = ids.ids[off + t], tg2[b * T + t] = ids.ids[off + t + 1];
    }
    FXT_CHECK(!memcmp(tk, tk2, sizeof tk) && !memcmp(tg, tg2, sizeof tg));
    /* no target that carries the loss: refused */
    memset(loss, 0, (size_t)ids.n);
    FXT_STATUS(fx__model_data_from_ids_loss(&flip, ids.ids, loss, ids.n, SEP, "chat", 0.1, T + 1), FX_EINVAL,
               "chat: its training part");
    FXT_CHECK(flip.tok == NULL && flip.loss == NULL);
    fx__model_data_free(&plain);
    fx__model_data_free(&plain2);
    fx__model_data_free(&d);

    /* a conversation the template cannot label: refused with its line */
    const char *bad = "{% for m in messages %}{{ m.content }}{% if loop.last %}!{% endif %}|{% endfor %}";
    fx__chat *bc = NULL;
    FXT_OK(fx__chat_create(&bc, bad, strlen(bad), NULL, NULL, tok));
    FXT_STATUS(fx__chat_pack(bc, &data, "train.jsonl", SEP, &ids, &loss), FX_EFORMAT,
               "train.jsonl:1: chat template: the rendering of message 2 (assistant) is not a prefix");
    fx__chat_free(bc);

    free(lab);
    free(loss);
    fx_ids_free(&one);
    fx_ids_free(&ids);
    fx__chat_data_free(&data);
    fx__chat_free(chat);
    fx_tokenizer_free(tok);
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    const char *src = getenv("FLEXC_SOURCE_DIR");
    snprintf(fixture_dir, sizeof fixture_dir, "%s/tests/fixtures", src ? src : "..");
    FXT_RUN(test_expressions);
    FXT_RUN(test_statements);
    FXT_RUN(test_refusals);
    FXT_RUN(test_bounds);
    FXT_RUN(test_fixtures);
    FXT_RUN(test_label_mask);
    FXT_RUN(test_jsonl);
    FXT_RUN(test_config_forms);
    FXT_RUN(test_pack);
    return fxt_finish();
}
