/* Chat data (chat.h): the model's chat template, conversations from JSONL, and a conversation
   rendered to ids with assistant-only labels, found by rendering its prefixes. */
#include "tokenizer/chat.h"

#include "core/core.h"
#include "core/file.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct fx__chat {
    fx__chat_template *tpl;
    const fx_tokenizer *tok;
    char *bos, *eos, *date;
};

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

int fx__chat_create(fx__chat **out, const char *tmpl, size_t len, const char *bos, const char *eos,
                    const fx_tokenizer *tok)
{
    *out = NULL;
    fx__chat *c = calloc(1, sizeof *c);
    if (!c)
        return fx__error(FX_ENOMEM, "chat: out of memory");
    c->tok = tok;
    int rc = fx__chat_template_compile(&c->tpl, tmpl, len);
    if (rc == FX_OK && ((bos && !(c->bos = dup_n(bos, strlen(bos)))) || (eos && !(c->eos = dup_n(eos, strlen(eos))))))
        rc = fx__error(FX_ENOMEM, "chat: out of memory");
    if (rc != FX_OK) {
        fx__chat_free(c);
        return rc;
    }
    *out = c;
    return FX_OK;
}

void fx__chat_free(fx__chat *c)
{
    if (!c)
        return;
    fx__chat_template_free(c->tpl);
    free(c->bos);
    free(c->eos);
    free(c->date);
    free(c);
}

void fx__chat_set_date(fx__chat *c, const char *date)
{
    free(c->date);
    c->date = date ? dup_n(date, strlen(date)) : NULL;
}

/* The whole of a regular file (never a FIFO or a device), at most max bytes, in an fx__alloc
   buffer with a NUL after it; errors name the path. */
static int read_all(const char *path, char **out, size_t *len, size_t max)
{
    if (access(path, F_OK) != 0)
        return fx__error(FX_EIO, "%s: %s", path, strerror(errno));
    int rc = fx__read_regular(out, len, path, max);
    return rc == FX_OK ? FX_OK : fx__error_context(rc, "%s", path);
}

/* tokenizer_config.json holds the template and a few settings; a chat data file any number of
   conversations (read whole: the loader checks every line before training starts). */
enum { CONFIG_MAX = 16 << 20 };
#define DATA_MAX ((size_t)8 << 30)

static const char *special(json_t *cfg, const char *key)
{
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v))
        v = json_object_get(v, "content");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static int load(fx__chat **out, const char *dir, const fx_tokenizer *tok)
{
    *out = NULL;
    char path[4096], jpath[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", dir);
    json_error_t je;
    char *text;
    size_t tlen;
    int rc = read_all(path, &text, &tlen, CONFIG_MAX);
    if (rc != FX_OK)
        return rc;
    json_t *cfg = json_loadb(text, tlen, JSON_DECODE_INT_AS_REAL, &je); /* model_max_length can be 1e30 */
    fx__free(text);
    if (!cfg)
        return fx__error(FX_EFORMAT, "%s: %s", path, je.text);
    const char *bos = special(cfg, "bos_token"), *eos = special(cfg, "eos_token");
    char *jinja = NULL;
    size_t jlen = 0;
    if (access(jpath, F_OK) == 0) {
        if ((rc = read_all(jpath, &jinja, &jlen, FX__CHAT_MAX_SOURCE)) != FX_OK) {
            json_decref(cfg);
            return rc;
        }
        rc = fx__chat_create(out, jinja, jlen, bos, eos, tok);
        fx__free(jinja);
        if (rc != FX_OK)
            fx__error_context(rc, "%s", jpath);
        json_decref(cfg);
        return rc;
    }
    json_t *t = json_object_get(cfg, "chat_template");
    if (json_is_array(t)) {
        json_t *found = NULL, *e;
        size_t i;
        json_array_foreach(t, i, e) {
            json_t *nm = json_object_get(e, "name");
            if (json_is_string(nm) && !strcmp(json_string_value(nm), "default"))
                found = json_object_get(e, "template");
        }
        t = found;
        if (!t) {
            json_decref(cfg);
            return fx__error(FX_EFORMAT, "%s: chat_template is a list without a \"default\" template", path);
        }
    }
    if (!json_is_string(t)) {
        json_decref(cfg);
        return fx__error(FX_EFORMAT, "%s: no chat template (no chat_template string and no chat_template.jinja)", path);
    }
    rc = fx__chat_create(out, json_string_value(t), json_string_length(t), bos, eos, tok);
    if (rc != FX_OK)
        fx__error_context(rc, "%s", path);
    json_decref(cfg);
    return rc;
}

int fx__chat_load(fx__chat **out, const char *dir, const fx_tokenizer *tok)
{
    int rc = load(out, dir, tok);
    if (rc == FX_OK)
        fx__chat_set_date(*out, getenv("FLEXC_CHAT_DATE"));
    return rc;
}

int fx__chat_render(const fx__chat *c, const fx__chat_msg *msgs, size_t n, bool gen, char **text, size_t *len)
{
    fx__chat_vars v = {.bos_token = c->bos, .eos_token = c->eos, .add_generation_prompt = gen, .date = c->date};
    return fx__chat_template_render(c->tpl, msgs, n, &v, text, len);
}

static int64_t lcp(const int32_t *x, int64_t nx, const int32_t *y, int64_t ny)
{
    int64_t n = 0;
    while (n < nx && n < ny && x[n] == y[n])
        n++;
    return n;
}

static int encode(const fx__chat *c, const char *text, size_t len, fx_ids *ids)
{
    ids->n = 0;
    return fx_tokenizer_encode(c->tok, ids, text, len);
}

int fx__chat_encode(const fx__chat *c, const fx__chat_conv *conv, fx_ids *ids, int32_t **labels)
{
    char *full = NULL, *pre = NULL, *with = NULL;
    size_t flen, plen, wlen;
    fx_ids tmp = {0};
    int rc = fx__chat_render(c, conv->msg, conv->n, false, &full, &flen);
    if (rc == FX_OK)
        rc = encode(c, full, flen, ids);
    int32_t *lab = NULL;
    if (rc == FX_OK) {
        lab = realloc(*labels, (size_t)(ids->n ? ids->n : 1) * sizeof *lab);
        if (!lab)
            rc = fx__error(FX_ENOMEM, "chat: out of memory");
        else {
            *labels = lab;
            for (int64_t i = 0; i < ids->n; i++)
                lab[i] = FX__CHAT_IGNORE;
        }
    }
    for (size_t m = 0; rc == FX_OK && m < conv->n; m++) {
        if (!conv->msg[m].role || strcmp(conv->msg[m].role, "assistant"))
            continue;
        /* the conversation before message m with the generation prompt, and up to m included */
        free(pre);
        free(with);
        pre = with = NULL;
        rc = fx__chat_render(c, conv->msg, m, true, &pre, &plen);
        if (rc == FX_OK)
            rc = fx__chat_render(c, conv->msg, m + 1, false, &with, &wlen);
        if (rc != FX_OK)
            break;
        if (plen > wlen || memcmp(pre, with, plen) || wlen > flen || memcmp(with, full, wlen)) {
            rc = fx__error(FX_EFORMAT,
                           "chat template: the rendering of message %zu (assistant) is not a prefix of the "
                           "conversation's; assistant labels cannot be found with this template", m + 1);
            break;
        }
        /* a: the first token where the prefix's ids and the conversation's part (a token that
           spans the start of the reply belongs to it); b: the end of the ids up to the reply
           included (or past the token that spans its end) */
        if ((rc = encode(c, pre, plen, &tmp)) != FX_OK)
            break;
        int64_t a = lcp(tmp.ids, tmp.n, ids->ids, ids->n);
        if ((rc = encode(c, with, wlen, &tmp)) != FX_OK)
            break;
        int64_t l = lcp(tmp.ids, tmp.n, ids->ids, ids->n), b = l == tmp.n ? l : l + 1;
        for (int64_t i = a; i < b; i++)
            lab[i] = ids->ids[i];
    }
    free(full);
    free(pre);
    free(with);
    fx_ids_free(&tmp);
    return rc;
}

/* ids->ids grown to hold n more (fx_ids is the tokenizer library's: fx__alloc'd). */
static int ids_room(fx_ids *ids, int64_t more)
{
    if (ids->n + more <= ids->cap)
        return FX_OK;
    int64_t cap = ids->cap ? ids->cap : 1024;
    while (cap < ids->n + more)
        cap *= 2;
    int32_t *p = fx__alloc((size_t)cap * sizeof *p);
    if (!p)
        return fx__error(FX_ENOMEM, "chat: cannot hold %lld ids", (long long)cap);
    if (ids->n)
        memcpy(p, ids->ids, (size_t)ids->n * sizeof *p);
    fx__free(ids->ids);
    ids->ids = p, ids->cap = cap;
    return FX_OK;
}

int fx__chat_pack(const fx__chat *c, const fx__chat_data *data, const char *name, int32_t sep, fx_ids *ids,
                  uint8_t **loss)
{
    ids->n = 0;
    fx_ids one = {0};
    int32_t *lab = NULL;
    uint8_t *mask = *loss;
    int64_t cap = 0;
    int rc = FX_OK;
    for (size_t i = 0; rc == FX_OK && i < data->n; i++) {
        if ((rc = fx__chat_encode(c, &data->conv[i], &one, &lab)) != FX_OK) {
            fx__error_context(rc, "%s:%lld", name, (long long)data->conv[i].line);
            break;
        }
        const bool add_sep = sep >= 0 && (one.n == 0 || one.ids[one.n - 1] != sep);
        const int64_t more = one.n + add_sep;
        if ((rc = ids_room(ids, more)) != FX_OK)
            break;
        if (ids->n + more > cap) {
            int64_t nc = cap ? cap : 1024;
            while (nc < ids->n + more)
                nc *= 2;
            uint8_t *p = realloc(mask, (size_t)nc);
            if (!p) {
                rc = fx__error(FX_ENOMEM, "chat: cannot hold the loss mask of %lld ids", (long long)nc);
                break;
            }
            mask = p, cap = nc;
        }
        for (int64_t k = 0; k < one.n; k++) {
            ids->ids[ids->n + k] = one.ids[k];
            mask[ids->n + k] = lab[k] != FX__CHAT_IGNORE;
        }
        ids->n += one.n;
        if (add_sep) {
            ids->ids[ids->n] = sep;
            mask[ids->n++] = 0;
        }
    }
    *loss = mask;
    free(lab);
    fx_ids_free(&one);
    return rc;
}

/* ---- JSONL ------------------------------------------------------------------------------ */

void fx__chat_data_free(fx__chat_data *d)
{
    for (size_t i = 0; i < d->n; i++) {
        for (size_t m = 0; m < d->conv[i].n; m++) {
            free((char *)d->conv[i].msg[m].role);
            free((char *)d->conv[i].msg[m].content);
        }
        free(d->conv[i].msg);
    }
    free(d->conv);
    d->conv = NULL;
    d->n = 0;
}

static int bad(const char *name, int64_t line, const char *what, const char *detail)
{
    return fx__error(FX_EFORMAT, "%s:%lld: %s%s", name, (long long)line, what, detail ? detail : "");
}

static int add_msg(fx__chat_conv *cv, const char *role, json_t *content)
{
    fx__chat_msg *m = realloc(cv->msg, (cv->n + 1) * sizeof *m);
    if (!m)
        return FX_ENOMEM;
    cv->msg = m;
    m[cv->n].role = dup_n(role, strlen(role));
    m[cv->n].content = dup_n(json_string_value(content), json_string_length(content));
    cv->n++;
    if (!m[cv->n - 1].role || !m[cv->n - 1].content)
        return FX_ENOMEM;
    return FX_OK;
}

static int parse_line(fx__chat_conv *cv, const char *name, int64_t ln, const char *s, size_t n)
{
    json_error_t je;
    json_t *j = json_loadb(s, n, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        char d[200];
        snprintf(d, sizeof d, "%s (column %d)", je.text, je.column);
        return bad(name, ln, "not valid JSON: ", d);
    }
    int rc = FX_OK;
    json_t *msgs = json_object_get(j, "messages"), *p = json_object_get(j, "prompt"),
           *cpl = json_object_get(j, "completion");
    if (!json_is_object(j))
        rc = bad(name, ln, "a line must be a JSON object", NULL);
    else if (msgs && (p || cpl))
        rc = bad(name, ln, "give either \"messages\" or \"prompt\" and \"completion\", not both", NULL);
    else if (msgs) {
        if (!json_is_array(msgs) || json_array_size(msgs) == 0)
            rc = bad(name, ln, "\"messages\" must be a non-empty array", NULL);
        size_t i;
        json_t *e;
        json_array_foreach(msgs, i, e) {
            if (rc != FX_OK)
                break;
            char w[160];
            json_t *role = json_object_get(e, "role"), *content = json_object_get(e, "content");
            if (!json_is_object(e)) {
                snprintf(w, sizeof w, "message %zu is not an object", i + 1);
                rc = bad(name, ln, w, NULL);
            } else if (!json_is_string(role) || json_string_length(role) == 0 ||
                       strlen(json_string_value(role)) != json_string_length(role)) {
                snprintf(w, sizeof w, "message %zu: \"role\" must be a non-empty string", i + 1);
                rc = bad(name, ln, w, NULL);
            } else if (!json_is_string(content)) {
                snprintf(w, sizeof w, "message %zu: \"content\" must be a string", i + 1);
                rc = bad(name, ln, w, NULL);
            } else if (strlen(json_string_value(content)) != json_string_length(content)) {
                snprintf(w, sizeof w, "message %zu: \"content\" holds a NUL character", i + 1);
                rc = bad(name, ln, w, NULL);
            } else if (add_msg(cv, json_string_value(role), content) != FX_OK)
                rc = fx__error(FX_ENOMEM, "%s: out of memory", name);
        }
    } else if (p || cpl) {
        if (!json_is_string(p) || !json_is_string(cpl))
            rc = bad(name, ln, "\"prompt\" and \"completion\" must both be strings", NULL);
        else if (strlen(json_string_value(p)) != json_string_length(p) ||
                 strlen(json_string_value(cpl)) != json_string_length(cpl))
            rc = bad(name, ln, "\"prompt\" or \"completion\" holds a NUL character", NULL);
        else if (add_msg(cv, "user", p) != FX_OK || add_msg(cv, "assistant", cpl) != FX_OK)
            rc = fx__error(FX_ENOMEM, "%s: out of memory", name);
    } else
        rc = bad(name, ln, "no \"messages\" and no \"prompt\"/\"completion\"", NULL);
    json_decref(j);
    return rc;
}

int fx__chat_data_parse(fx__chat_data *out, const char *name, const char *text, size_t len)
{
    memset(out, 0, sizeof *out);
    size_t cap = 0;
    int64_t ln = 0;
    int rc = FX_OK;
    for (size_t i = 0; i < len && rc == FX_OK;) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - text) : len;
        ln++;
        size_t a = i;
        while (a < e && (text[a] == ' ' || text[a] == '\t' || text[a] == '\r'))
            a++;
        if (a < e) {
            if (out->n == cap) {
                cap = cap ? 2 * cap : 16;
                fx__chat_conv *nc = realloc(out->conv, cap * sizeof *nc);
                if (!nc) {
                    rc = fx__error(FX_ENOMEM, "%s: out of memory", name);
                    break;
                }
                out->conv = nc;
            }
            fx__chat_conv *cv = &out->conv[out->n++];
            memset(cv, 0, sizeof *cv);
            cv->line = ln;
            rc = parse_line(cv, name, ln, text + i, e - i);
        }
        i = e + 1;
    }
    if (rc == FX_OK && out->n == 0)
        rc = fx__error(FX_EFORMAT, "%s: no conversations", name);
    if (rc != FX_OK)
        fx__chat_data_free(out);
    return rc;
}

int fx__chat_data_load(fx__chat_data *out, const char *path)
{
    memset(out, 0, sizeof *out);
    char *text;
    size_t len;
    int rc = read_all(path, &text, &len, DATA_MAX);
    if (rc != FX_OK)
        return rc;
    rc = fx__chat_data_parse(out, path, text, len);
    fx__free(text);
    return rc;
}
