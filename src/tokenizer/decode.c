/* Decoding: ids to their token strings, then the decoder chain over the list of strings (as
   `tokenizers` runs decode_chain), then joined. No decoder: the tokens joined by spaces. */
#include "tok_internal.h"

#include <string.h>

/* The current list: pieces over one buffer. Each decoder writes a new list into the other. */
typedef struct dlist {
    fx__buf *buf;
    fx__pieces *p;
} dlist;

static int out_piece(dlist *d, size_t start)
{
    return fx__pieces_push(d->p, (fx__piece){start, d->buf->n - start, -1, false});
}

static int dec_bytelevel(const dlist *in, dlist *out)
{
    /* A token whose characters are all stand-ins becomes its bytes; any other stays as it is.
       The bytes are then read as UTF-8, invalid parts replaced. */
    fx__buf raw = {0};
    int rc = FX_OK;
    for (size_t i = 0; i < in->p->n && rc == FX_OK; i++) {
        const char *s = in->buf->p + in->p->p[i].off;
        size_t n = in->p->p[i].len, before = raw.n;
        bool all = true;
        for (size_t j = 0; j < n && rc == FX_OK;) {
            size_t k;
            int b = fx__bytelevel_byte(fx__utf8_get(s + j, &k));
            j += k;
            if (b < 0) {
                all = false;
                break;
            }
            unsigned char c = (unsigned char)b;
            rc = fx__buf_put(&raw, &c, 1);
        }
        if (rc == FX_OK && !all) {
            raw.n = before;
            rc = fx__buf_put(&raw, s, n);
        }
    }
    size_t start = out->buf->n;
    if (rc == FX_OK)
        rc = fx__utf8_lossy(out->buf, raw.p ? raw.p : "", raw.n);
    fx__buf_free(&raw);
    return rc == FX_OK ? out_piece(out, start) : rc;
}

static int dec_bytefallback(const dlist *in, dlist *out)
{
    static const char hex[] = "0123456789abcdef";
    fx__buf bytes = {0};
    int rc = FX_OK;
    for (size_t i = 0; i <= in->p->n && rc == FX_OK; i++) {
        const char *s = i < in->p->n ? in->buf->p + in->p->p[i].off : NULL;
        size_t n = i < in->p->n ? in->p->p[i].len : 0;
        /* "<0xHH>" (digits of either case; u8::from_str_radix also takes a leading '+') */
        int v = -1;
        if (s && n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>') {
            int d[2];
            for (int k = 0; k < 2; k++) {
                char c = s[3 + k];
                const char *h = c >= 'A' && c <= 'F' ? strchr(hex, c + 32) : (c ? strchr(hex, c) : NULL);
                d[k] = h ? (int)(h - hex) : (k == 0 && c == '+' ? -2 : -1);
            }
            if (d[0] >= 0 && d[1] >= 0)
                v = d[0] * 16 + d[1];
            else if (d[0] == -2 && d[1] >= 0)
                v = d[1];
        }
        if (v >= 0) {
            unsigned char c = (unsigned char)v;
            rc = fx__buf_put(&bytes, &c, 1);
            continue;
        }
        if (bytes.n) {
            size_t start = out->buf->n;
            if (fx__utf8_valid_prefix(bytes.p, bytes.n) == bytes.n) {
                rc = fx__buf_put(out->buf, bytes.p, bytes.n);
                if (rc == FX_OK)
                    rc = out_piece(out, start);
            } else {
                /* one U+FFFD per byte, each its own token */
                for (size_t k = 0; k < bytes.n && rc == FX_OK; k++) {
                    start = out->buf->n;
                    rc = fx__buf_put(out->buf, "\xef\xbf\xbd", 3);
                    if (rc == FX_OK)
                        rc = out_piece(out, start);
                }
            }
            bytes.n = 0;
        }
        if (s && rc == FX_OK) {
            size_t start = out->buf->n;
            rc = fx__buf_put(out->buf, s, n);
            if (rc == FX_OK)
                rc = out_piece(out, start);
        }
    }
    fx__buf_free(&bytes);
    return rc;
}

/* Fuse: every piece joined into one. */
static int dec_fuse(const dlist *in, dlist *out)
{
    int rc = FX_OK;
    size_t start = out->buf->n;
    for (size_t i = 0; i < in->p->n && rc == FX_OK; i++)
        rc = fx__buf_put(out->buf, in->buf->p + in->p->p[i].off, in->p->p[i].len);
    return rc == FX_OK ? out_piece(out, start) : rc;
}

/* Replace: every match of d's pattern in a piece by d's content (an empty match also moves
   one character on, copied). */
static int dec_replace(const fx__dec *d, fx__scratch *sc, const dlist *in, dlist *out)
{
    int rc = FX_OK;
    for (size_t i = 0; i < in->p->n && rc == FX_OK; i++) {
        const char *s = in->buf->p + in->p->p[i].off;
        size_t n = in->p->p[i].len, start = out->buf->n, pos = 0, copied = 0;
        fx__matcher_add(&sc->m, n);
        while (rc == FX_OK && pos <= n) {
            size_t ms, me;
            int r = fx__regex_next(&d->pattern, &sc->m, s, n, pos, &ms, &me);
            if (r < 0)
                return r;
            if (r == 1)
                break;
            rc = fx__buf_put(out->buf, s + copied, ms - copied);
            if (rc == FX_OK)
                rc = fx__buf_put(out->buf, d->content, d->content_len);
            copied = me;
            if (me == ms) {
                if (me >= n)
                    break;
                size_t k = fx__utf8_len((unsigned char)s[me]);
                if (rc == FX_OK)
                    rc = fx__buf_put(out->buf, s + me, k);
                copied = pos = me + k;
            } else {
                pos = me;
            }
        }
        if (rc == FX_OK)
            rc = fx__buf_put(out->buf, s + copied, n - copied);
        if (rc == FX_OK)
            rc = out_piece(out, start);
    }
    return rc;
}

/* Strip: up to d->strip_start copies of d's character off the start of each piece, and up
   to d->strip_stop off its end. */
static int dec_strip(const fx__dec *d, const dlist *in, dlist *out)
{
    int rc = FX_OK;
    for (size_t i = 0; i < in->p->n && rc == FX_OK; i++) {
        const char *s = in->buf->p + in->p->p[i].off;
        size_t n = in->p->p[i].len, a = 0, b = n, k;
        for (int64_t j = 0; j < d->strip_start && a < n; j++) {
            if (fx__utf8_get(s + a, &k) != d->strip_char)
                break;
            a += k;
        }
        for (int64_t j = 0; j < d->strip_stop && b > a; j++) {
            size_t p = b - 1;
            while (p > a && ((unsigned char)s[p] & 0xc0) == 0x80)
                p--;
            if (fx__utf8_get(s + p, &k) != d->strip_char)
                break;
            b = p;
        }
        size_t start = out->buf->n;
        rc = fx__buf_put(out->buf, s + a, b - a);
        if (rc == FX_OK)
            rc = out_piece(out, start);
    }
    return rc;
}

/* Metaspace: d's replacement character back to spaces. The first piece loses its
   replacement characters (all of them, as `tokenizers` does) unless the prepend scheme is
   never. */
static int dec_metaspace(const fx__dec *d, const dlist *in, dlist *out)
{
    int rc = FX_OK;
    for (size_t i = 0; i < in->p->n && rc == FX_OK; i++) {
        const char *s = in->buf->p + in->p->p[i].off;
        size_t n = in->p->p[i].len, start = out->buf->n;
        bool drop = i == 0 && d->prepend != FX__PREPEND_NEVER;
        for (size_t j = 0; j < n && rc == FX_OK;) {
            size_t k;
            int32_t c = fx__utf8_get(s + j, &k);
            if (c == d->strip_char) {
                if (!drop)
                    rc = fx__buf_put(out->buf, " ", 1);
            } else {
                rc = fx__buf_put(out->buf, s + j, k);
            }
            j += k;
        }
        if (rc == FX_OK)
            rc = out_piece(out, start);
    }
    return rc;
}

static int dec_one(const fx__dec *d, fx__scratch *sc, const dlist *in, dlist *out)
{
    switch (d->kind) {
    case FX__DEC_BYTELEVEL:
        return dec_bytelevel(in, out);
    case FX__DEC_BYTEFALLBACK:
        return dec_bytefallback(in, out);
    case FX__DEC_FUSE:
        return dec_fuse(in, out);
    case FX__DEC_REPLACE:
        return dec_replace(d, sc, in, out);
    case FX__DEC_STRIP:
        return dec_strip(d, in, out);
    case FX__DEC_METASPACE:
        return dec_metaspace(d, in, out);
    }
    return fx__error(FX_EINVAL, "unknown decoder");
}

static int text_put(fx_text *out, const char *s, size_t n)
{
    size_t need;
    if (!fx__add_size(out->len, n, &need) || !fx__add_size(need, 1, &need))
        return fx__error(FX_ENOMEM, "decoded text overflows");
    if (need > out->cap) {
        size_t cap = out->cap ? out->cap : 256;
        while (cap < need)
            cap *= 2;
        char *p = fx__alloc(cap);
        if (!p)
            return FX_ENOMEM;
        if (out->len)
            memcpy(p, out->data, out->len);
        fx__free(out->data);
        out->data = p;
        out->cap = cap;
    }
    if (n)
        memcpy(out->data + out->len, s, n);
    out->len += n;
    out->data[out->len] = '\0';
    return FX_OK;
}

static int decode_with(const fx_tokenizer *t, fx__scratch *s, fx_text *out, const int32_t *ids, int64_t n)
{
    int rc;
    if ((rc = text_put(out, NULL, 0)) != FX_OK)
        return rc;
    dlist cur = {&s->dec[0], &s->dpieces[0]}, nxt = {&s->dec[1], &s->dpieces[1]};
    cur.buf->n = 0;
    nxt.buf->n = 0;
    /* Both buffers exist from here on (pieces of empty tokens point into them). */
    if ((rc = fx__buf_reserve(cur.buf, 0)) != FX_OK || (rc = fx__buf_reserve(nxt.buf, 0)) != FX_OK)
        return rc;
    cur.p->n = 0;
    for (int64_t i = 0; i < n; i++) {
        size_t len;
        const char *tok = fx_tokenizer_id_to_token(t, ids[i], &len);
        if (!tok)
            return fx__error(FX_ERANGE, "id %d at %lld is not a token of this vocabulary (size %lld)", (int)ids[i],
                             (long long)i, (long long)t->n_ids);
        if (!t->has_decoder && i > 0 && (rc = fx__buf_put(cur.buf, " ", 1)) != FX_OK)
            return rc;
        size_t start = cur.buf->n;
        if ((rc = fx__buf_put(cur.buf, tok, len)) != FX_OK || (rc = out_piece(&cur, start)) != FX_OK)
            return rc;
    }
    if (!t->has_decoder)
        return text_put(out, cur.buf->p, cur.buf->n);
    for (size_t k = 0; k < t->n_decs; k++) {
        nxt.buf->n = 0;
        nxt.p->n = 0;
        if ((rc = dec_one(&t->decs[k], s, &cur, &nxt)) != FX_OK)
            return rc;
        dlist tmp = cur;
        cur = nxt;
        nxt = tmp;
    }
    for (size_t i = 0; i < cur.p->n; i++)
        if ((rc = text_put(out, cur.buf->p + cur.p->p[i].off, cur.p->p[i].len)) != FX_OK)
            return rc;
    return FX_OK;
}

int fx_tokenizer_decode(const fx_tokenizer *t, fx_text *out, const int32_t *ids, int64_t n)
{
    if (!t || !out || (!ids && n) || n < 0)
        return fx__error(FX_EINVAL, "tokenizer, out and ids must not be NULL, n >= 0");
    size_t len0 = out->len;
    fx__scratch own, *s;
    int rc = fx__scratch_acquire(t, &own, &s);
    if (rc == FX_OK)
        rc = decode_with(t, s, out, ids, n);
    fx__scratch_release(t, &own, s);
    if (rc != FX_OK && out->data) {
        out->len = len0;
        out->data[len0] = '\0';
    }
    return rc;
}
