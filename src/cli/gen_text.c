/* Text in and out of flexc generate: flexc's byte vocabulary, or a Hugging Face tokenizer
   (tokenizer.json beside the model). Generated text is streamed as it becomes valid UTF-8. */
#include "gen_text.h"

#include "core/file.h"
#include "model/model.h" /* FX__MODEL_EOT, FX__MODEL_VOCAB: the byte vocabulary */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* fx_ids and fx_text belong to the tokenizer library (fx__alloc'd): grown the same way. */
static int ids_push(fx_ids *ids, int32_t id)
{
    if (ids->n == ids->cap) {
        int64_t cap = ids->cap ? 2 * ids->cap : 64;
        int32_t *p = fx__alloc((size_t)cap * sizeof *p);
        if (!p) {
            cli_error("out of memory");
            return CLI_EXIT_FAIL;
        }
        if (ids->n)
            memcpy(p, ids->ids, (size_t)ids->n * sizeof *p);
        fx__free(ids->ids);
        ids->ids = p, ids->cap = cap;
    }
    ids->ids[ids->n++] = id;
    return CLI_EXIT_OK;
}

static int text_reserve(fx_text *t, size_t need)
{
    if (need <= t->cap)
        return CLI_EXIT_OK;
    char *p = fx__alloc(need);
    if (!p) {
        cli_error("out of memory");
        return CLI_EXIT_FAIL;
    }
    if (t->len)
        memcpy(p, t->data, t->len);
    fx__free(t->data);
    t->data = p, t->cap = need;
    return CLI_EXIT_OK;
}

int gen_text_open(gen_text *g, const char *src, const fx_model_config *cfg)
{
    memset(g, 0, sizeof *g);
    char path[4200];
    /* A Hugging Face directory, or a training directory fine-tuned from one (hf/). */
    const char *cands[] = {"%s/tokenizer.json", "%s/hf/tokenizer.json"};
    for (int i = 0; src && i < 2 && !g->tok; i++) {
        snprintf(path, sizeof path, cands[i], src);
        if (!fx__is_regular(path))
            continue;
        int rc = fx_tokenizer_load(&g->tok, path);
        if (rc != FX_OK)
            return cli_fail(rc, path);
    }
    if (g->tok) {
        if (fx_tokenizer_vocab_size(g->tok) > cfg->vocab) {
            cli_error("generate: the tokenizer has %lld ids, more than the model's vocabulary %lld",
                      (long long)fx_tokenizer_vocab_size(g->tok), (long long)cfg->vocab);
            return CLI_EXIT_FAIL;
        }
        return CLI_EXIT_OK;
    }
    if (cfg->vocab != FX__MODEL_VOCAB) {
        cli_error("generate: the model's vocabulary has %lld tokens and no tokenizer.json is beside it (flexc's "
                  "byte vocabulary has %d)", (long long)cfg->vocab, FX__MODEL_VOCAB);
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}

void gen_text_close(gen_text *g)
{
    fx_tokenizer_free(g->tok);
    fx_ids_free(&g->out);
    fx_text_free(&g->text);
}

int gen_text_encode(gen_text *g, fx_ids *ids, const char *text, size_t len)
{
    if (g->tok) {
        int rc = fx_tokenizer_encode(g->tok, ids, text, len);
        return rc == FX_OK ? CLI_EXIT_OK : cli_fail(rc, "encoding the prompt");
    }
    for (size_t i = 0; i < len; i++)
        if (ids_push(ids, (unsigned char)text[i]) != CLI_EXIT_OK)
            return CLI_EXIT_FAIL;
    return CLI_EXIT_OK;
}

/* The decoded text of everything generated; with the byte vocabulary, invalid UTF-8 becomes
   U+FFFD per byte that cannot start or continue a character. */
static int decode_all(gen_text *g)
{
    g->text.len = 0;
    if (g->text.data)
        g->text.data[0] = '\0';
    if (g->tok) {
        int rc = fx_tokenizer_decode(g->tok, &g->text, g->out.ids, g->out.n);
        return rc == FX_OK ? CLI_EXIT_OK : cli_fail(rc, "decoding");
    }
    if (text_reserve(&g->text, (size_t)g->out.n * 13 + 1) != CLI_EXIT_OK)
        return CLI_EXIT_FAIL;
    size_t k = 0;
    for (int64_t i = 0; i < g->out.n;) {
        if (g->out.ids[i] >= 256) { /* end-of-text, as the data files spell it */
            memcpy(g->text.data + k, "<|endoftext|>", 13);
            k += 13, i++;
            continue;
        }
        unsigned char c = (unsigned char)g->out.ids[i];
        int n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        unsigned char buf[4];
        int have = 0;
        while (n && have < n && i + have < g->out.n && g->out.ids[i + have] < 256 &&
               (have == 0 || (g->out.ids[i + have] & 0xC0) == 0x80))
            buf[have] = (unsigned char)g->out.ids[i + have], have++;
        if (n && have == n && fx__utf8_invalid_at(buf, (size_t)n) < 0) {
            memcpy(g->text.data + k, buf, (size_t)n);
            k += (size_t)n, i += n;
        } else if (n && have < n && i + have == g->out.n) {
            memcpy(g->text.data + k, "\xef\xbf\xbd", 3); /* incomplete at the end: held back */
            k += 3, i += have;
        } else {
            memcpy(g->text.data + k, "\xef\xbf\xbd", 3);
            k += 3, i += 1;
        }
    }
    g->text.data[k] = '\0';
    g->text.len = k;
    return CLI_EXIT_OK;
}

int gen_text_emit(gen_text *g, int32_t id, bool stream)
{
    if (ids_push(&g->out, id) != CLI_EXIT_OK)
        return CLI_EXIT_FAIL;
    if (!stream)
        return CLI_EXIT_OK;
    int rc = decode_all(g);
    if (rc != CLI_EXIT_OK)
        return rc;
    /* Print what is new, holding back a trailing U+FFFD: it may be a character whose bytes
       are still to come in the next tokens. */
    size_t end = g->text.len;
    while (end >= g->printed + 3 && memcmp(g->text.data + end - 3, "\xef\xbf\xbd", 3) == 0)
        end -= 3;
    if (end > g->printed) {
        fwrite(g->text.data + g->printed, 1, end - g->printed, stdout);
        fflush(stdout);
        g->printed = end;
    }
    return CLI_EXIT_OK;
}

int gen_text_finish(gen_text *g, bool stream)
{
    int rc = decode_all(g);
    if (rc == CLI_EXIT_OK && stream && g->text.len > g->printed)
        fwrite(g->text.data + g->printed, 1, g->text.len - g->printed, stdout);
    return rc;
}

void gen_json_string(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c == '\r')
            fputs("\\r", f);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}
