/* The data of flexc train: flexc's byte-level text, text read through the Hugging Face
   tokenizer of the model being fine-tuned, chat JSONL rendered with its chat template, or an
   llm.c token file. */
#include "train_data.h"

#include "core/file.h"
#include "hf/hf.h"
#include "tokenizer/chat.h"

#include <flexc/tokenizer.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h> /* mkdir */
#include <unistd.h>

bool train_is_token_file(const char *path)
{
    bool not_regular; /* a FIFO would block here: the loader then says what it is */
    FILE *f = path ? fx__fopen_regular(path, &not_regular) : NULL;
    if (!f)
        return false;
    unsigned char b[4];
    bool ok = fread(b, 1, 4, f) == 4;
    fclose(f);
    uint32_t magic = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    return ok && (magic == 20240520u || magic == 20240801u);
}

bool train_tokenizer_path(char *buf, size_t n, const char *dir)
{
    if (!dir)
        return false;
    snprintf(buf, n, "%s/tokenizer.json", dir);
    if (fx__is_regular(buf))
        return true;
    snprintf(buf, n, "%s/hf/tokenizer.json", dir);
    return fx__is_regular(buf);
}

/* Appends the ids of one document and the end-of-text id. */
static int encode_doc(const fx_tokenizer *tok, fx_ids *ids, const char *s, size_t n, int32_t eot)
{
    if (n == 0)
        return FX_OK;
    int rc = fx_tokenizer_encode(tok, ids, s, n);
    if (rc == FX_OK && eot >= 0) {
        if (ids->n == ids->cap) { /* fx_ids is the tokenizer library's (fx__alloc'd) */
            int64_t cap = ids->cap ? 2 * ids->cap : 1024;
            int32_t *p = fx__alloc((size_t)cap * sizeof *p);
            if (!p)
                return FX_ENOMEM;
            if (ids->n)
                memcpy(p, ids->ids, (size_t)ids->n * sizeof *p);
            fx__free(ids->ids);
            ids->ids = p, ids->cap = cap;
        }
        ids->ids[ids->n++] = eot;
    }
    return rc;
}

bool train_is_chat(const char *path, const char *tokenizer)
{
    size_t n = path ? strlen(path) : 0;
    return tokenizer && n > 6 && !strcmp(path + n - 6, ".jsonl");
}

/* Chat JSONL: every line parsed and checked, then every conversation rendered with the chat
   template of the tokenizer's directory and encoded with its labels, packed with the model's
   first eos id after each and a loss mask (the assistants' tokens). */
static int chat_load(fx__model_data *d, const char *path, const char *tokenizer, const fx_tokenizer *tok,
                     int32_t eot, double val_frac, int64_t min_tokens)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", tokenizer);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof dir, ".");
    fx__chat_data data;
    int rc = fx__chat_data_load(&data, path);
    if (rc != FX_OK)
        return cli_fail(rc, "--data");
    fx__chat *chat = NULL;
    if ((rc = fx__chat_load(&chat, dir, tok)) != FX_OK) {
        fx__chat_data_free(&data);
        cli_error("--data: %s is chat data (a .jsonl file) and needs the model's chat template: %s", path,
                  fx_last_error());
        return CLI_EXIT_FAIL;
    }
    fx_ids ids = {0};
    uint8_t *loss = NULL;
    rc = fx__chat_pack(chat, &data, path, eot, &ids, &loss);
    char source[600];
    snprintf(source, sizeof source, "%s (chat, %zu conversation%s)", path, data.n, data.n == 1 ? "" : "s");
    const int64_t conversations = (int64_t)data.n;
    fx__chat_free(chat);
    fx__chat_data_free(&data);
    if (rc == FX_OK)
        rc = fx__model_data_from_ids_loss(d, ids.ids, loss, ids.n, eot, source, val_frac, min_tokens);
    free(loss);
    fx_ids_free(&ids);
    if (rc != FX_OK)
        return cli_fail(rc, "--data");
    d->chat = true;
    d->conversations = conversations;
    return CLI_EXIT_OK;
}

int train_data_load(fx__model_data *d, const char *path, const char *tokenizer, const fx_model_config *cfg,
                    double val_frac, int64_t min_tokens, bool lossy_text)
{
    const int32_t eot = cfg->n_eos ? cfg->eos[0] : -1;
    if (train_is_token_file(path)) {
        fx_ids ids = {0};
        int rc = fx_tokens_load(&ids, path, cfg->vocab);
        if (rc == FX_OK)
            rc = fx__model_data_from_ids(d, ids.ids, ids.n, eot, path, val_frac, min_tokens);
        fx_ids_free(&ids);
        return rc == FX_OK ? CLI_EXIT_OK : cli_fail(rc, "--data");
    }
    if (!tokenizer) {
        if (lossy_text) {
            cli_error("--lossy-text: only a Hugging Face model's text may hold invalid UTF-8 (flexc's byte-level "
                      "models train on UTF-8 text)");
            return CLI_EXIT_USAGE;
        }
        if (cfg->vocab != FX__MODEL_VOCAB) {
            cli_error("--data: the model has %lld tokens and no tokenizer.json beside it: pass --data as an llm.c "
                      "token file (flexc tokenize) or fine-tune from a Hugging Face directory", (long long)cfg->vocab);
            return CLI_EXIT_USAGE;
        }
        int rc = fx__model_data_load(d, path, TRAIN_DEFAULT_CORPUS, val_frac, min_tokens);
        return rc == FX_OK ? CLI_EXIT_OK : cli_fail(rc, path ? "--data" : "default corpus");
    }
    if (!path) {
        cli_error("--data FILE is required with a Hugging Face model (text read with its tokenizer, or an llm.c "
                  "token file)");
        return CLI_EXIT_USAGE;
    }
    fx_tokenizer *tok = NULL;
    int rc = fx_tokenizer_load(&tok, tokenizer);
    if (rc != FX_OK)
        return cli_fail(rc, tokenizer);
    if (fx_tokenizer_vocab_size(tok) > cfg->vocab) {
        cli_error("%s has %lld ids, more than the model's vocabulary %lld", tokenizer,
                  (long long)fx_tokenizer_vocab_size(tok), (long long)cfg->vocab);
        fx_tokenizer_free(tok);
        return CLI_EXIT_FAIL;
    }
    if (train_is_chat(path, tokenizer)) {
        if (lossy_text) {
            cli_error("--lossy-text: %s is chat data (JSON, always UTF-8); --lossy-text is for text files", path);
            fx_tokenizer_free(tok);
            return CLI_EXIT_USAGE;
        }
        rc = chat_load(d, path, tokenizer, tok, eot, val_frac, min_tokens);
        fx_tokenizer_free(tok);
        return rc;
    }
    char *text = NULL;
    size_t len = 0;
    /* The whole text at once (no size limit beyond memory: the tokens take about as much). */
    if ((rc = fx__read_regular(&text, &len, path, SIZE_MAX - 1)) != FX_OK) {
        fx__error_context(rc, "%s", path);
        fx_tokenizer_free(tok);
        return cli_fail(rc, "--data");
    }
    /* Checked as the byte-level models' text is: random bytes, a binary or a compressed file
       would otherwise train as U+FFFD noise (the tokenizer's reading of invalid UTF-8). */
    int64_t bad = lossy_text ? -1 : fx__utf8_invalid_at((const unsigned char *)text, len);
    if (bad >= 0) {
        cli_error("--data: data file '%s' is neither UTF-8 text nor an llm.c token file: invalid byte 0x%02x at "
                  "offset %lld (--lossy-text trains on it with invalid bytes as U+FFFD)",
                  path, (unsigned)(unsigned char)text[bad], (long long)bad);
        fx__free(text);
        fx_tokenizer_free(tok);
        return CLI_EXIT_FAIL;
    }
    /* Documents end at a line holding only "%" (the fortune format) and at the end of the
       text; each is followed by the model's first eos id. */
    fx_ids ids = {0};
    size_t start = 0;
    for (size_t i = 0; i <= len && rc == FX_OK; i++) {
        bool sep = i < len && (i == 0 || text[i - 1] == '\n') && text[i] == '%' &&
                   (i + 1 == len || text[i + 1] == '\n');
        if (sep || i == len) {
            rc = encode_doc(tok, &ids, text + start, i - start, eot);
            start = sep ? (i + 2 <= len ? i + 2 : len) : len;
        }
    }
    fx__free(text);
    fx_tokenizer_free(tok);
    if (rc == FX_OK)
        rc = fx__model_data_from_ids(d, ids.ids, ids.n, eot, path, val_frac, min_tokens);
    fx_ids_free(&ids);
    return rc == FX_OK ? CLI_EXIT_OK : cli_fail(rc, "--data");
}

int train_keep_hf(const char *out, const char *src)
{
    static const char *const names[] = {"config.json",           "generation_config.json",  "tokenizer.json",
                                        "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                                        "chat_template.jinja"};
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/hf", out);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        cli_error("--out: cannot create %s: %s", dir, strerror(errno));
        return CLI_EXIT_FAIL;
    }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char from[4200], to[4300];
        snprintf(from, sizeof from, "%s/%s", src, names[i]);
        if (!fx__is_regular(from))
            continue;
        snprintf(to, sizeof to, "%s/%s", dir, names[i]);
        char *text = NULL;
        size_t len = 0;
        int rc = fx__hf_read_text(&text, &len, from);
        FILE *f = rc == FX_OK ? fopen(to, "wb") : NULL;
        bool ok = f && fwrite(text, 1, len, f) == len;
        if (f && fclose(f) != 0)
            ok = false;
        fx__free(text);
        if (!ok) {
            cli_error("--out: cannot copy %s to %s", from, to);
            return CLI_EXIT_FAIL;
        }
    }
    return CLI_EXIT_OK;
}
