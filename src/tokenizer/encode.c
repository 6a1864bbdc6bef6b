/* Encoding, in the order `tokenizers` runs it: added tokens that are matched on the raw text,
   then the normalizers on each remaining part, added tokens matched on normalized text, the
   pre-tokenizers, and the BPE model on each resulting word (with a bounded word cache). */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

enum {
    CACHE_SLOTS = 1 << 15,      /* power of two */
    CACHE_MAX_WORDS = 1 << 14,  /* then no more inserts, as `tokenizers` does */
    CACHE_MAX_WORD = 256,       /* longer words are not cached */
};

/* ---- scratch ---------------------------------------------------------------------------------- */

int fx__scratch_init(fx__scratch *s, fx__cache *cache)
{
    *s = (fx__scratch){0};
    int rc = fx__matcher_init(&s->m);
    if (rc != FX_OK)
        return rc;
    s->cache = cache;
    return FX_OK;
}

void fx__scratch_free(fx__scratch *s)
{
    fx__buf_free(&s->in);
    fx__buf_free(&s->norm[0]);
    fx__buf_free(&s->norm[1]);
    fx__buf_free(&s->arena);
    fx__buf_free(&s->word);
    fx__buf_free(&s->dec[0]);
    fx__buf_free(&s->dec[1]);
    fx__pieces_free(&s->seg);
    fx__pieces_free(&s->sub);
    fx__pieces_free(&s->nseg);
    fx__pieces_free(&s->pieces[0]);
    fx__pieces_free(&s->pieces[1]);
    fx__pieces_free(&s->dpieces[0]);
    fx__pieces_free(&s->dpieces[1]);
    fx__free(s->syms);
    fx__free(s->heap);
    fx__matcher_free(&s->m);
    *s = (fx__scratch){0};
}

int fx__scratch_acquire(const fx_tokenizer *t, fx__scratch *own, fx__scratch **s)
{
    fx_tokenizer *mt = (fx_tokenizer *)t; /* the lock and the shared scratch are not the tokenizer's state */
    if (pthread_mutex_trylock(&mt->lock) == 0) {
        *s = &mt->scratch;
        (*s)->m.source = t->path;
        fx__matcher_reset(&(*s)->m);
        return FX_OK;
    }
    *s = own;
    int rc = fx__scratch_init(own, NULL);
    own->m.source = t->path;
    return rc;
}

void fx__scratch_release(const fx_tokenizer *t, fx__scratch *own, fx__scratch *s)
{
    fx_tokenizer *mt = (fx_tokenizer *)t;
    if (s == &mt->scratch)
        pthread_mutex_unlock(&mt->lock);
    else
        fx__scratch_free(own);
}

void fx__cache_free(fx__cache *c)
{
    fx__free(c->slot);
    fx__buf_free(&c->keys);
    fx__free(c->ids);
    *c = (fx__cache){0};
}

/* ---- output ------------------------------------------------------------------------------- */

static int ids_reserve(fx_ids *out, size_t n)
{
    if ((int64_t)n > INT64_MAX / 8 - out->n)
        return fx__error(FX_ENOMEM, "too many ids");
    if (out->n + (int64_t)n > out->cap) {
        int64_t cap = out->cap ? out->cap : 256;
        while (cap < out->n + (int64_t)n)
            cap *= 2;
        int32_t *p = fx__alloc((size_t)cap * sizeof *p);
        if (!p)
            return FX_ENOMEM;
        if (out->n)
            memcpy(p, out->ids, (size_t)out->n * sizeof *p);
        fx__free(out->ids);
        out->ids = p;
        out->cap = cap;
    }
    return FX_OK;
}

static int ids_push(fx_ids *out, const int32_t *ids, size_t n)
{
    if (n == 0)
        return FX_OK;
    int rc = ids_reserve(out, n);
    if (rc != FX_OK)
        return rc;
    memcpy(out->ids + out->n, ids, n * sizeof *ids);
    out->n += (int64_t)n;
    return FX_OK;
}

/* ---- normalizers ---------------------------------------------------------------------------- */

static bool all_ascii(const char *s, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (w & 0x8080808080808080ull)
            return false;
    }
    for (; i < n; i++)
        if ((unsigned char)s[i] >= 0x80)
            return false;
    return true;
}

/* Replaces every match of re in in[0 .. n) with rep; empty matches insert rep and step over
   one character. */
static int replace_all(fx__buf *out, const fx__regex *re, fx__matcher *m, const char *in, size_t n,
                       const char *rep, size_t rep_len)
{
    size_t pos = 0, copied = 0;
    fx__matcher_add(m, n);
    while (pos <= n) {
        size_t ms, me;
        int rc = fx__regex_next(re, m, in, n, pos, &ms, &me);
        if (rc < 0)
            return rc;
        if (rc == 1)
            break;
        if ((rc = fx__buf_put(out, in + copied, ms - copied)) != FX_OK || (rc = fx__buf_put(out, rep, rep_len)))
            return rc;
        copied = me;
        if (me == ms) {
            if (me >= n)
                break;
            size_t k = fx__utf8_len((unsigned char)in[me]);
            if ((rc = fx__buf_put(out, in + me, k)) != FX_OK)
                return rc;
            copied = me + k;
            pos = me + k;
        } else {
            pos = me;
        }
    }
    return fx__buf_put(out, in + copied, n - copied);
}

static int normalize_one(const fx__norm *nm, fx__scratch *s, fx__buf *out, const char *in, size_t n)
{
    out->n = 0;
    switch (nm->kind) {
    case FX__NORM_NFC: case FX__NORM_NFD: case FX__NORM_NFKC: case FX__NORM_NFKD: {
        if (all_ascii(in, n))
            return fx__buf_put(out, in, n);
        int opt = UTF8PROC_STABLE;
        opt |= (nm->kind == FX__NORM_NFC || nm->kind == FX__NORM_NFKC) ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
        if (nm->kind == FX__NORM_NFKC || nm->kind == FX__NORM_NFKD)
            opt |= UTF8PROC_COMPAT;
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)n, &dst,
                                          (utf8proc_option_t)opt);
        if (k < 0) {
            free(dst);
            return fx__error(k == UTF8PROC_ERROR_NOMEM ? FX_ENOMEM : FX_EINVAL, "normalization failed: %s",
                             utf8proc_errmsg(k));
        }
        int rc = fx__buf_put(out, dst, (size_t)k);
        free(dst);
        return rc;
    }
    case FX__NORM_LOWERCASE: {
        int rc = fx__buf_reserve(out, n);
        for (size_t i = 0; rc == FX_OK && i < n;) {
            unsigned char c = (unsigned char)in[i];
            if (c < 0x80) {
                char l = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
                rc = fx__buf_put(out, &l, 1);
                i++;
                continue;
            }
            size_t k;
            int32_t cp = fx__utf8_get(in + i, &k);
            i += k;
            char tmp[8];
            size_t m;
            if (cp == 0x130) { /* İ lowercases to two characters */
                memcpy(tmp, "i\xcc\x87", 3);
                m = 3;
            } else {
                m = fx__utf8_put(tmp, utf8proc_tolower(cp));
            }
            rc = fx__buf_put(out, tmp, m);
        }
        return rc;
    }
    case FX__NORM_STRIP: {
        size_t a = 0, b = n;
        while (nm->strip_left && a < b) {
            size_t k;
            if (!fx__uni_is_space(fx__utf8_get(in + a, &k)))
                break;
            a += k;
        }
        while (nm->strip_right && b > a) {
            size_t j = b - 1;
            while (j > a && ((unsigned char)in[j] & 0xc0) == 0x80)
                j--;
            size_t k;
            if (!fx__uni_is_space(fx__utf8_get(in + j, &k)))
                break;
            b = j;
        }
        return fx__buf_put(out, in + a, b - a);
    }
    case FX__NORM_REPLACE:
        return replace_all(out, &nm->pattern, &s->m, in, n, nm->content, nm->content_len);
    case FX__NORM_PREPEND: {
        int rc = FX_OK;
        if (n)
            rc = fx__buf_put(out, nm->content, nm->content_len);
        return rc == FX_OK ? fx__buf_put(out, in, n) : rc;
    }
    }
    return fx__error(FX_EINVAL, "unknown normalizer");
}

int fx__normalize(const fx_tokenizer *t, fx__scratch *s, const char *in, size_t n, const char **out, size_t *out_n)
{
    const char *cur = in;
    size_t cur_n = n;
    for (size_t i = 0; i < t->n_norms; i++) {
        fx__buf *dst = &s->norm[i & 1];
        int rc = normalize_one(&t->norms[i], s, dst, cur, cur_n);
        if (rc != FX_OK)
            return rc;
        cur = dst->p ? dst->p : "";
        cur_n = dst->n;
    }
    *out = cur;
    *out_n = cur_n;
    return FX_OK;
}

/* ---- added tokens --------------------------------------------------------------------------- */

static bool ends_with_word(const char *s, size_t n)
{
    if (!n)
        return false;
    size_t j = n - 1, k;
    while (j > 0 && ((unsigned char)s[j] & 0xc0) == 0x80)
        j--;
    int32_t c = fx__utf8_get(s + j, &k);
    return fx__uni_is_word(c);
}

static bool starts_with_word(const char *s, size_t n)
{
    if (!n)
        return false;
    size_t k;
    int32_t c = fx__utf8_get(s, &k);
    return fx__uni_is_word(c);
}

/* Splits s[0 .. n) at the added tokens of one set (leftmost-longest, as `tokenizers`' Aho-Corasick
   matcher), honouring single_word, lstrip and rstrip. Appends to out: token pieces (token >= 0)
   and text pieces (offsets relative to s, shifted by base). */
static int split_added(const fx_tokenizer *t, bool normalized, const char *s, size_t n, size_t base, bool orig0,
                       fx__pieces *out)
{
    int32_t *const *tab = normalized ? t->nadded_by_byte : t->added_by_byte;
    size_t start_offset = 0, pos = 0;
    int rc;
    while (pos < n) {
        /* the next match */
        size_t ms = n, me = n;
        const fx__added *hit = NULL;
        for (size_t i = pos; i < n; i++) {
            const int32_t *cand = tab[(unsigned char)s[i]];
            if (!cand)
                continue;
            for (; *cand >= 0; cand++) {
                const fx__added *a = &t->added[*cand];
                const char *c = normalized ? a->norm : a->content;
                size_t len = normalized ? a->norm_len : a->len;
                if (len <= n - i && !memcmp(s + i, c, len)) {
                    hit = a;
                    ms = i;
                    me = i + len;
                    break;
                }
            }
            if (hit)
                break;
        }
        if (!hit)
            break;
        pos = me;
        size_t start = ms, stop = me;
        if (hit->single_word) {
            bool start_space = start == 0 || !ends_with_word(s, start);
            bool stop_space = stop == n || !starts_with_word(s + stop, n - stop);
            if (!start_space || !stop_space)
                continue;
        }
        if (hit->lstrip) {
            size_t j = start;
            while (j > 0) {
                size_t p = j - 1, k;
                while (p > 0 && ((unsigned char)s[p] & 0xc0) == 0x80)
                    p--;
                if (!fx__uni_is_space(fx__utf8_get(s + p, &k)))
                    break;
                j = p;
            }
            start = j > start_offset ? j : start_offset;
        }
        if (hit->rstrip) {
            while (stop < n) {
                size_t k;
                if (!fx__uni_is_space(fx__utf8_get(s + stop, &k)))
                    break;
                stop += k;
            }
        }
        if (start_offset < start) {
            rc = fx__pieces_push(out, (fx__piece){base + start_offset, start - start_offset, -1,
                                                  orig0 && start_offset == 0});
            if (rc != FX_OK)
                return rc;
        }
        rc = fx__pieces_push(out, (fx__piece){base + start, stop - start, hit->id, false});
        if (rc != FX_OK)
            return rc;
        start_offset = stop;
    }
    if (start_offset < n)
        return fx__pieces_push(out, (fx__piece){base + start_offset, n - start_offset, -1, orig0 && start_offset == 0});
    return FX_OK;
}

/* ---- pre-tokenizers --------------------------------------------------------------------------- */

/* Splits piece (bytes in the arena) at the matches of re, by behavior; appends to out. */
static int split_regex(fx__scratch *s, const fx__regex *re, fx__split_behavior behavior, bool invert,
                       fx__piece piece, fx__pieces *out)
{
    /* The matches and gaps, in order, as (start, end, is_match); then merged by behavior.
       Kept in s->sub (token field holds is_match). */
    fx__pieces *m = &s->sub;
    m->n = 0;
    const char *str = s->arena.p + piece.off;
    size_t n = piece.len, prev = 0, pos = 0;
    int rc;
    fx__matcher_add(&s->m, n);
    while (pos <= n) {
        size_t ms, me;
        rc = fx__regex_next(re, &s->m, str, n, pos, &ms, &me);
        if (rc < 0)
            return rc;
        if (rc == 1)
            break;
        if (prev != ms && (rc = fx__pieces_push(m, (fx__piece){prev, ms - prev, invert, false})) != FX_OK)
            return rc;
        if ((rc = fx__pieces_push(m, (fx__piece){ms, me - ms, !invert, false})) != FX_OK)
            return rc;
        prev = me;
        if (me == ms) {
            if (me >= n)
                break;
            pos = me + fx__utf8_len((unsigned char)str[me]);
        } else {
            pos = me;
        }
    }
    if (prev != n && (rc = fx__pieces_push(m, (fx__piece){prev, n - prev, invert, false})) != FX_OK)
        return rc;

    /* merge by behavior (in place: w <= r) */
    size_t w = 0;
    if (behavior == FX__SPLIT_MERGED_NEXT) {
        /* right to left: a match joins the piece after it */
        bool prev_match = false;
        size_t cnt = m->n;
        size_t wr = cnt; /* write index from the right, exclusive */
        for (size_t r = cnt; r-- > 0;) {
            fx__piece p = m->p[r];
            bool is_match = p.token != 0;
            if (is_match && !prev_match && wr < cnt) {
                fx__piece *last = &m->p[wr];
                last->len = last->off + last->len - p.off;
                last->off = p.off;
            } else {
                m->p[--wr] = p;
            }
            prev_match = is_match;
        }
        memmove(m->p, m->p + wr, (cnt - wr) * sizeof *m->p);
        w = cnt - wr;
    } else {
        bool prev_match = false;
        for (size_t r = 0; r < m->n; r++) {
            fx__piece p = m->p[r];
            bool is_match = p.token != 0;
            if (behavior == FX__SPLIT_REMOVED) {
                if (!is_match)
                    m->p[w++] = p;
            } else if (behavior == FX__SPLIT_ISOLATED) {
                m->p[w++] = p;
            } else if (behavior == FX__SPLIT_MERGED_PREV) {
                if (is_match && !prev_match && w > 0)
                    m->p[w - 1].len = p.off + p.len - m->p[w - 1].off;
                else
                    m->p[w++] = p;
            } else { /* CONTIGUOUS */
                if (is_match == prev_match && w > 0)
                    m->p[w - 1].len = p.off + p.len - m->p[w - 1].off;
                else
                    m->p[w++] = p;
            }
            prev_match = is_match;
        }
    }
    for (size_t i = 0; i < w; i++) {
        fx__piece p = m->p[i];
        if (!p.len)
            continue;
        rc = fx__pieces_push(out, (fx__piece){piece.off + p.off, p.len, -1, piece.orig0 && p.off == 0});
        if (rc != FX_OK)
            return rc;
    }
    return FX_OK;
}

/* Copies the piece's bytes, mapped to the byte-level alphabet, to the end of the arena. */
static int bytelevel_map(fx__scratch *s, fx__piece p, fx__pieces *out)
{
    int rc = fx__buf_reserve(&s->arena, p.len * 2);
    if (rc != FX_OK)
        return rc;
    const unsigned char *src = (const unsigned char *)s->arena.p + p.off;
    char *dst = s->arena.p + s->arena.n;
    size_t o = 0;
    for (size_t i = 0; i < p.len; i++) {
        unsigned b = src[i];
        dst[o] = fx__bl_utf8[b][0];
        if (fx__bl_len[b] == 2)
            dst[o + 1] = fx__bl_utf8[b][1];
        o += fx__bl_len[b];
    }
    fx__piece q = {s->arena.n, o, -1, p.orig0};
    s->arena.n += o;
    return fx__pieces_push(out, q);
}

static int pre_one(const fx__pre *pre, fx__scratch *s, fx__piece p, fx__pieces *out)
{
    int rc;
    if (pre->kind == FX__PRE_SPLIT)
        return split_regex(s, &pre->pattern, pre->behavior, pre->invert, p, out);
    if (pre->kind == FX__PRE_BYTELEVEL) {
        if (pre->add_prefix_space && s->arena.p[p.off] != ' ') {
            if ((rc = fx__buf_reserve(&s->arena, p.len + 1)) != FX_OK)
                return rc;
            size_t off = s->arena.n;
            s->arena.p[off] = ' ';
            memcpy(s->arena.p + off + 1, s->arena.p + p.off, p.len);
            s->arena.n += p.len + 1;
            p.off = off;
            p.len += 1;
        }
        if (!pre->use_regex)
            return bytelevel_map(s, p, out);
        /* split, then map each part */
        size_t first = out->n;
        if ((rc = split_regex(s, &pre->pattern, FX__SPLIT_ISOLATED, false, p, out)) != FX_OK)
            return rc;
        size_t last = out->n;
        for (size_t i = first; i < last; i++) {
            fx__piece q = out->p[i];
            size_t before = out->n;
            if ((rc = bytelevel_map(s, q, out)) != FX_OK)
                return rc;
            out->p[i] = out->p[before];
            out->n = before;
        }
        return FX_OK;
    }
    /* Metaspace: spaces become the replacement, which is prepended by the scheme; then
       optionally split before each replacement. */
    char rep[4];
    size_t rl = fx__utf8_put(rep, pre->replacement);
    size_t spaces = 0;
    for (size_t i = 0; i < p.len; i++)
        spaces += s->arena.p[p.off + i] == ' ';
    if ((rc = fx__buf_reserve(&s->arena, p.len + spaces * rl + rl)) != FX_OK)
        return rc;
    const char *src = s->arena.p + p.off;
    size_t off = s->arena.n, o = 0;
    char *dst = s->arena.p + off;
    for (size_t i = 0; i < p.len; i++) {
        if (src[i] == ' ') {
            memcpy(dst + o, rep, rl);
            o += rl;
        } else {
            dst[o++] = src[i];
        }
    }
    bool starts = o >= rl && !memcmp(dst, rep, rl);
    bool prepend = !starts && (pre->prepend == FX__PREPEND_ALWAYS || (pre->prepend == FX__PREPEND_FIRST && p.orig0));
    if (prepend) {
        memmove(dst + rl, dst, o);
        memcpy(dst, rep, rl);
        o += rl;
    }
    s->arena.n += o;
    fx__piece q = {off, o, -1, p.orig0};
    if (!pre->split)
        return fx__pieces_push(out, q);
    fx__regex lit = {.code = NULL, .lit = rep, .lit_len = rl};
    return split_regex(s, &lit, FX__SPLIT_MERGED_NEXT, false, q, out);
}

/* ---- the BPE model ------------------------------------------------------------------------- */

static inline const fx__merge_slot *merge_get(const fx_tokenizer *t, int32_t a, int32_t b)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = fx__hash_bytes(&key, 8) & (t->merges_cap - 1);
    for (;;) {
        const fx__merge_slot *m = &t->merges[i];
        if (m->key == key)
            return m;
        if (m->key == UINT64_MAX)
            return NULL;
        i = (i + 1) & (t->merges_cap - 1);
    }
}

static inline bool heap_less(fx__heap_item a, fx__heap_item b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(fx__heap_item *h, size_t *n, fx__heap_item x)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(x, h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static fx__heap_item heap_pop(fx__heap_item *h, size_t *n)
{
    fx__heap_item top = h[0], x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && heap_less(h[c + 1], h[c]))
            c++;
        if (!heap_less(h[c], x))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = x;
    return top;
}

static int sym_add(fx__scratch *s, size_t *ns, int32_t id, uint32_t len)
{
    if (*ns == s->syms_cap) {
        size_t cap = s->syms_cap ? s->syms_cap * 2 : 256;
        fx__sym *p = fx__alloc(cap * sizeof *p);
        if (!p)
            return FX_ENOMEM;
        if (*ns)
            memcpy(p, s->syms, *ns * sizeof *p);
        fx__free(s->syms);
        s->syms = p;
        s->syms_cap = cap;
    }
    int32_t i = (int32_t)*ns;
    if (i > 0)
        s->syms[i - 1].next = i;
    s->syms[i] = (fx__sym){id, i - 1, -1, len};
    (*ns)++;
    return FX_OK;
}

static int32_t vocab_lookup(const fx_tokenizer *t, const char *s, size_t n)
{
    return fx__strmap_get(&t->vocab, t->vocab_str, t->vocab_len, s, n);
}

static int cache_get(const fx__cache *c, uint64_t h, const char *w, size_t n, const int32_t **ids, size_t *nids)
{
    if (!c->slot)
        return 0;
    size_t i = h & (CACHE_SLOTS - 1);
    for (;;) {
        const fx__cache_slot *e = &c->slot[i];
        if (!e->hash)
            return 0;
        if (e->hash == h && e->key_len == n && !memcmp(c->keys.p + e->key_off, w, n)) {
            *ids = c->ids + e->ids_off;
            *nids = e->ids_len;
            return 1;
        }
        i = (i + 1) & (CACHE_SLOTS - 1);
    }
}

static void cache_put(fx__cache *c, uint64_t h, const char *w, size_t n, const int32_t *ids, size_t nids)
{
    if (c->used >= CACHE_MAX_WORDS)
        return;
    if (!c->slot) {
        c->slot = fx__calloc(CACHE_SLOTS, sizeof *c->slot);
        if (!c->slot)
            return; /* no cache is only slower */
    }
    if (c->nids + nids > c->ids_cap) {
        size_t cap = c->ids_cap ? c->ids_cap * 2 : 4096;
        while (cap < c->nids + nids)
            cap *= 2;
        int32_t *p = fx__alloc(cap * sizeof *p);
        if (!p)
            return;
        if (c->nids)
            memcpy(p, c->ids, c->nids * sizeof *p);
        fx__free(c->ids);
        c->ids = p;
        c->ids_cap = cap;
    }
    size_t key_off = c->keys.n;
    if (fx__buf_put(&c->keys, w, n) != FX_OK)
        return;
    memcpy(c->ids + c->nids, ids, nids * sizeof *ids);
    size_t i = h & (CACHE_SLOTS - 1);
    while (c->slot[i].hash)
        i = (i + 1) & (CACHE_SLOTS - 1);
    c->slot[i] = (fx__cache_slot){h, (uint32_t)key_off, (uint32_t)n, (uint32_t)c->nids, (uint32_t)nids};
    c->nids += nids;
    c->used++;
}

/* A word's symbols before any merge, s->syms [*ns]: each character (with the model's
   continuing-subword prefix on all but the first and its end-of-word suffix on the last) as
   its vocabulary id, else as its bytes' fallback ids, else as the unk token (a run of unknown
   characters one unk where the model fuses them). */
static int word_symbols(const fx_tokenizer *t, fx__scratch *s, const char *w, size_t n, size_t *ns)
{
    int32_t unk = -1;
    uint32_t unk_len = 0;
    int rc;
    *ns = 0;
    for (size_t i = 0; i < n;) {
        size_t k = fx__utf8_len((unsigned char)w[i]);
        if (k > n - i)
            k = n - i;
        const char *c = w + i;
        size_t cn = k;
        bool first = i == 0, last = i + k == n;
        if ((!first && t->prefix) || (last && t->suffix)) {
            fx__buf *b = &s->word;
            b->n = 0;
            if ((!first && t->prefix && (rc = fx__buf_put(b, t->prefix, t->prefix_len)) != FX_OK) ||
                (rc = fx__buf_put(b, c, k)) != FX_OK ||
                (last && t->suffix && (rc = fx__buf_put(b, t->suffix, t->suffix_len)) != FX_OK))
                return rc;
            c = b->p;
            cn = b->n;
        }
        i += k;
        int32_t id = vocab_lookup(t, c, cn);
        if (id >= 0) {
            if (unk >= 0) {
                if ((rc = sym_add(s, ns, unk, unk_len)) != FX_OK)
                    return rc;
                unk = -1;
            }
            if ((rc = sym_add(s, ns, id, (uint32_t)k)) != FX_OK)
                return rc;
            continue;
        }
        if (t->byte_fallback) {
            bool all = true;
            for (size_t j = 0; j < cn; j++)
                all &= t->byte_ids[(unsigned char)c[j]] >= 0;
            if (all) {
                for (size_t j = 0; j < cn; j++)
                    if ((rc = sym_add(s, ns, t->byte_ids[(unsigned char)c[j]], 1)) != FX_OK)
                        return rc;
                continue;
            }
        }
        if (t->unk_missing)
            return fx__error(FX_EFORMAT, "model.unk_token is not in the vocabulary, and this text needs it");
        if (t->unk_id >= 0) {
            if (unk >= 0 && t->fuse_unk) {
                unk_len += (uint32_t)k;
            } else {
                if (unk >= 0 && (rc = sym_add(s, ns, unk, unk_len)) != FX_OK)
                    return rc;
                unk = t->unk_id;
                unk_len = (uint32_t)k;
            }
        }
    }
    if (unk >= 0 && (rc = sym_add(s, ns, unk, unk_len)) != FX_OK)
        return rc;
    return FX_OK;
}

/* The merges over s->syms [ns], lowest rank first (leftmost among equals): a merged symbol
   keeps the left one's slot, the right one's length drops to 0, and the new pairs with its
   neighbours become candidates. A popped candidate whose pair has changed since is stale. */
static int word_merge(const fx_tokenizer *t, fx__scratch *s, size_t ns)
{
    if (ns < 2)
        return FX_OK;
    /* Pushes: ns - 1 pairs, then at most two per merge, and there are fewer than ns merges. */
    if (s->heap_cap < ns * 3) {
        fx__free(s->heap);
        s->heap_cap = ns * 3 > 256 ? ns * 3 : 256;
        s->heap = fx__alloc(s->heap_cap * sizeof *s->heap);
        if (!s->heap) {
            s->heap_cap = 0;
            return FX_ENOMEM;
        }
    }
    fx__sym *sy = s->syms;
    size_t hn = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const fx__merge_slot *m = merge_get(t, sy[i].id, sy[i + 1].id);
        if (m)
            heap_push(s->heap, &hn, (fx__heap_item){m->rank, (uint32_t)i, m->id});
    }
    while (hn) {
        fx__heap_item top = heap_pop(s->heap, &hn);
        fx__sym *cur = &sy[top.pos];
        if (cur->len == 0 || cur->next == -1)
            continue;
        fx__sym *right = &sy[cur->next];
        const fx__merge_slot *m = merge_get(t, cur->id, right->id);
        if (!m || m->id != top.id)
            continue;
        cur->id = top.id;
        cur->len += right->len;
        cur->next = right->next;
        right->len = 0;
        if (cur->next >= 0)
            sy[cur->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0) {
            const fx__merge_slot *pm = merge_get(t, sy[cur->prev].id, cur->id);
            if (pm)
                heap_push(s->heap, &hn, (fx__heap_item){pm->rank, (uint32_t)cur->prev, pm->id});
        }
        if (cur->next >= 0) {
            const fx__merge_slot *nm = merge_get(t, cur->id, sy[cur->next].id);
            if (nm)
                heap_push(s->heap, &hn, (fx__heap_item){nm->rank, top.pos, nm->id});
        }
    }
    return FX_OK;
}

/* One word through the model: its symbols, their merges, then the survivors in order onto
   out (and into the word cache). */
static int bpe_word(const fx_tokenizer *t, fx__scratch *s, fx_ids *out, const char *w, size_t n)
{
    if (!n)
        return FX_OK;
    if (t->ignore_merges) {
        int32_t id = vocab_lookup(t, w, n);
        if (id >= 0)
            return ids_push(out, &id, 1);
    }
    uint64_t h = 0;
    bool cacheable = s->cache && n < CACHE_MAX_WORD;
    if (cacheable) {
        const int32_t *ids;
        size_t nids;
        h = fx__hash_bytes(w, n);
        if (cache_get(s->cache, h, w, n, &ids, &nids))
            return ids_push(out, ids, nids);
    }
    size_t ns;
    int rc;
    if ((rc = word_symbols(t, s, w, n, &ns)) != FX_OK || (rc = word_merge(t, s, ns)) != FX_OK)
        return rc;
    size_t m = 0;
    for (size_t i = 0; i < ns; i++)
        m += s->syms[i].len != 0;
    if (m == 0)
        return FX_OK; /* every character unknown, and no unk token: nothing, as in `tokenizers` */
    if ((rc = ids_reserve(out, m)) != FX_OK)
        return rc;
    int32_t *dst = out->ids + out->n;
    for (size_t i = 0, k = 0; i < ns; i++)
        if (s->syms[i].len)
            dst[k++] = s->syms[i].id;
    out->n += (int64_t)m;
    if (cacheable)
        cache_put(s->cache, h, w, n, dst, m);
    return FX_OK;
}

/* ---- the pipeline ----------------------------------------------------------------------------- */

/* One stretch of normalized text without added tokens: pre-tokenizers, then the model. */
static int encode_words(const fx_tokenizer *t, fx__scratch *s, fx_ids *out, const char *text, size_t n, bool orig0)
{
    if (!n)
        return FX_OK;
    s->arena.n = 0;
    int rc = fx__buf_put(&s->arena, text, n);
    if (rc != FX_OK)
        return rc;
    fx__pieces *cur = &s->pieces[0], *nxt = &s->pieces[1];
    cur->n = 0;
    if ((rc = fx__pieces_push(cur, (fx__piece){0, n, -1, orig0})) != FX_OK)
        return rc;
    for (size_t i = 0; i < t->n_pres; i++) {
        nxt->n = 0;
        for (size_t j = 0; j < cur->n; j++)
            if ((rc = pre_one(&t->pres[i], s, cur->p[j], nxt)) != FX_OK)
                return rc;
        fx__pieces *tmp = cur;
        cur = nxt;
        nxt = tmp;
    }
    for (size_t j = 0; j < cur->n; j++)
        if ((rc = bpe_word(t, s, out, s->arena.p + cur->p[j].off, cur->p[j].len)) != FX_OK)
            return rc;
    return FX_OK;
}

static int encode_with(const fx_tokenizer *t, fx__scratch *s, fx_ids *out, const char *text, size_t len)
{
    int rc;
    if (fx__utf8_valid_prefix(text, len) != len) {
        s->in.n = 0;
        if ((rc = fx__utf8_lossy(&s->in, text, len)) != FX_OK)
            return rc;
        text = s->in.p;
        len = s->in.n;
    }
    s->seg.n = 0;
    if ((rc = split_added(t, false, text, len, 0, true, &s->seg)) != FX_OK)
        return rc;
    for (size_t i = 0; i < s->seg.n; i++) {
        fx__piece g = s->seg.p[i];
        if (g.token >= 0) {
            if ((rc = ids_push(out, &g.token, 1)) != FX_OK)
                return rc;
            continue;
        }
        const char *nt;
        size_t nn;
        if ((rc = fx__normalize(t, s, text + g.off, g.len, &nt, &nn)) != FX_OK)
            return rc;
        /* Normalized added tokens: split again (the pieces index the normalized text). */
        if (!t->has_nadded) {
            if ((rc = encode_words(t, s, out, nt, nn, g.orig0)) != FX_OK)
                return rc;
            continue;
        }
        s->nseg.n = 0;
        if ((rc = split_added(t, true, nt, nn, 0, g.orig0, &s->nseg)) != FX_OK)
            return rc;
        for (size_t j = 0; j < s->nseg.n; j++) {
            fx__piece q = s->nseg.p[j];
            rc = q.token >= 0 ? ids_push(out, &q.token, 1) : encode_words(t, s, out, nt + q.off, q.len, q.orig0);
            if (rc != FX_OK)
                return rc;
        }
    }
    return FX_OK;
}

int fx_tokenizer_encode(const fx_tokenizer *t, fx_ids *out, const char *text, size_t len)
{
    if (!t || !out || (!text && len))
        return fx__error(FX_EINVAL, "tokenizer, out and text must not be NULL");
    if (!text)
        text = "";
    int64_t n0 = out->n;
    fx__scratch own, *s;
    int rc = fx__scratch_acquire(t, &own, &s);
    if (rc == FX_OK)
        rc = encode_with(t, s, out, text, len);
    fx__scratch_release(t, &own, s);
    if (rc != FX_OK)
        out->n = n0;
    return rc;
}

/* ---- safe cuts -------------------------------------------------------------------------------- */

size_t fx_tokenizer_safe_cut(const fx_tokenizer *t, const char *text, size_t len)
{
    if (!t || !text || !t->safe_cut || len < 3)
        return 0;
    /* "x\nA": one line feed after a printable non-space ASCII character, before an ASCII
       letter. Every supported pattern ends a piece at the line feed there, whatever follows. */
    for (size_t i = len - 1; i >= 2; i--) {
        unsigned char c = (unsigned char)text[i], b = (unsigned char)text[i - 2];
        if (text[i - 1] == '\n' && (c | 0x20) >= 'a' && (c | 0x20) <= 'z' && b > ' ' && b < 0x7f)
            return i;
    }
    return 0;
}
