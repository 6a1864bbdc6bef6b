/* Text helpers of the tokenizer: growing buffers, UTF-8, the byte-level alphabet, Unicode
   classes, hashing, string maps and regular expressions (PCRE2). */
#include "tok_internal.h"

#include <string.h>
#include <utf8proc.h>

/* ---- growing buffers ------------------------------------------------------------------------ */

static int grow(void **p, size_t *cap, size_t need, size_t elem, size_t used)
{
    if (need <= *cap)
        return FX_OK;
    size_t ncap = *cap ? *cap : 64;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2)
            return fx__error(FX_ENOMEM, "buffer of %zu elements overflows", need);
        ncap *= 2;
    }
    size_t bytes;
    if (!fx__mul_size(ncap, elem, &bytes))
        return fx__error(FX_ENOMEM, "buffer of %zu elements overflows", ncap);
    void *q = fx__alloc(bytes);
    if (!q)
        return FX_ENOMEM;
    if (*p && used)
        memcpy(q, *p, used * elem);
    fx__free(*p);
    *p = q;
    *cap = ncap;
    return FX_OK;
}

int fx__buf_reserve(fx__buf *b, size_t extra)
{
    size_t need;
    if (!fx__add_size(b->n, extra, &need) || !fx__add_size(need, 1, &need))
        return fx__error(FX_ENOMEM, "text of %zu bytes overflows", b->n);
    return grow((void **)&b->p, &b->cap, need, 1, b->n);
}

int fx__buf_put(fx__buf *b, const void *s, size_t n)
{
    int rc = fx__buf_reserve(b, n);
    if (rc != FX_OK)
        return rc;
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    return FX_OK;
}

void fx__buf_free(fx__buf *b)
{
    fx__free(b->p);
    *b = (fx__buf){0};
}

int fx__pieces_push(fx__pieces *v, fx__piece piece)
{
    if (v->n == v->cap) {
        int rc = grow((void **)&v->p, &v->cap, v->n + 1, sizeof *v->p, v->n);
        if (rc != FX_OK)
            return rc;
    }
    v->p[v->n++] = piece;
    return FX_OK;
}

void fx__pieces_free(fx__pieces *v)
{
    fx__free(v->p);
    *v = (fx__pieces){0};
}

/* ---- public growing arrays -------------------------------------------------------------- */

void fx_ids_free(fx_ids *ids)
{
    if (!ids)
        return;
    fx__free(ids->ids);
    *ids = (fx_ids){0};
}

void fx_text_free(fx_text *text)
{
    if (!text)
        return;
    fx__free(text->data);
    *text = (fx_text){0};
}

/* ---- UTF-8 -------------------------------------------------------------------------------- */

size_t fx__utf8_put(char *out, int32_t c)
{
    unsigned char *o = (unsigned char *)out;
    if (c < 0x80) {
        o[0] = (unsigned char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (unsigned char)(0xc0 | (c >> 6));
        o[1] = (unsigned char)(0x80 | (c & 0x3f));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (unsigned char)(0xe0 | (c >> 12));
        o[1] = (unsigned char)(0x80 | ((c >> 6) & 0x3f));
        o[2] = (unsigned char)(0x80 | (c & 0x3f));
        return 3;
    }
    o[0] = (unsigned char)(0xf0 | (c >> 18));
    o[1] = (unsigned char)(0x80 | ((c >> 12) & 0x3f));
    o[2] = (unsigned char)(0x80 | ((c >> 6) & 0x3f));
    o[3] = (unsigned char)(0x80 | (c & 0x3f));
    return 4;
}

/* Bytes of the valid character at s[0 .. n), or 0 when it is invalid; *bad then counts the
   bytes of its maximal invalid subpart (at least 1), which one U+FFFD replaces. */
static size_t utf8_char(const unsigned char *s, size_t n, size_t *bad)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0)
            lo = 0xa0;
        if (c == 0xed)
            hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0)
            lo = 0x90;
        if (c == 0xf4)
            hi = 0x8f;
    } else {
        *bad = 1;
        return 0;
    }
    for (size_t i = 1; i < len; i++) {
        unsigned d = i < n ? s[i] : 0;
        bool ok = i < n && (i == 1 ? (d >= lo && d <= hi) : (d >= 0x80 && d <= 0xbf));
        if (!ok) {
            *bad = i;
            return 0;
        }
    }
    return len;
}

size_t fx__utf8_valid_prefix(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        /* ASCII runs, eight at a time. */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, u + i, 8);
            if (w & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i >= n)
            break;
        size_t bad, k = utf8_char(u + i, n - i, &bad);
        if (!k)
            return i;
        i += k;
    }
    return n;
}

int fx__utf8_lossy(fx__buf *b, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t ok = fx__utf8_valid_prefix(s + i, n - i);
        int rc = fx__buf_put(b, s + i, ok);
        if (rc != FX_OK)
            return rc;
        i += ok;
        if (i >= n)
            break;
        size_t bad = 1;
        utf8_char(u + i, n - i, &bad);
        rc = fx__buf_put(b, "\xef\xbf\xbd", 3);
        if (rc != FX_OK)
            return rc;
        i += bad;
    }
    return FX_OK;
}

/* ---- Unicode classes ------------------------------------------------------------------------ */

bool fx__uni_is_space(int32_t c)
{
    return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
           c == 0x3000;
}

bool fx__uni_is_word(int32_t c)
{
    if (c < 0x80)
        return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c == '_';
    if (c == 0x200c || c == 0x200d || (c >= 0x24b6 && c <= 0x24e9) || (c >= 0x1f130 && c <= 0x1f149) ||
        (c >= 0x1f150 && c <= 0x1f169) || (c >= 0x1f170 && c <= 0x1f189))
        return true; /* Join_Control, and letters of category So that are Alphabetic */
    switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}

/* ---- the byte-level alphabet -------------------------------------------------------------- */

char fx__bl_utf8[256][2];
uint8_t fx__bl_len[256];
static int16_t bl_inv[324];
static pthread_once_t bl_once = PTHREAD_ONCE_INIT;

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others get
   256, 257, ... in byte order. */
static void bl_fill(void)
{
    for (int i = 0; i < 324; i++)
        bl_inv[i] = -1;
    int next = 256;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        int32_t cp = keep ? b : next++;
        char tmp[4];
        fx__bl_len[b] = (uint8_t)fx__utf8_put(tmp, cp);
        memcpy(fx__bl_utf8[b], tmp, 2);
        bl_inv[cp] = (int16_t)b;
    }
}

void fx__bytelevel_init(void) { pthread_once(&bl_once, bl_fill); }

int fx__bytelevel_byte(int32_t c) { return c >= 0 && c < 324 ? bl_inv[c] : -1; }

/* ---- hashing and string maps -------------------------------------------------------------- */

/* FNV-1a over 8-byte words then a final mix: fast on short words, never 0. */
uint64_t fx__hash_bytes(const void *s, size_t n)
{
    const unsigned char *p = s;
    uint64_t h = 0xcbf29ce484222325ull ^ (n * 0x9e3779b97f4a7c15ull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    return h ? h : 1;
}

int fx__strmap_build(fx__strmap *m, char *const *str, const uint32_t *len, int64_t n)
{
    size_t cap = 16;
    while (cap < (size_t)n * 2)
        cap *= 2;
    m->slot = fx__calloc(cap, sizeof *m->slot);
    if (!m->slot)
        return FX_ENOMEM;
    m->cap = cap;
    for (int64_t id = 0; id < n; id++) {
        if (!str[id])
            continue;
        size_t i = fx__hash_bytes(str[id], len[id]) & (cap - 1);
        while (m->slot[i])
            i = (i + 1) & (cap - 1);
        m->slot[i] = (int32_t)id + 1;
    }
    return FX_OK;
}

int32_t fx__strmap_get(const fx__strmap *m, char *const *str, const uint32_t *len, const char *s, size_t n)
{
    if (!m->cap)
        return -1;
    size_t i = fx__hash_bytes(s, n) & (m->cap - 1);
    for (;;) {
        int32_t v = m->slot[i];
        if (!v)
            return -1;
        if (len[v - 1] == n && !memcmp(str[v - 1], s, n))
            return v - 1;
        i = (i + 1) & (m->cap - 1);
    }
}

/* ---- regular expressions ---------------------------------------------------------------- */

/* The work counter: PCRE2 calls it before each item of the pattern (PCRE2_AUTO_CALLOUT), in
   JIT and interpreted matching alike. A step is the call plus the characters moved over since
   the last one, so that a repeat scanning far (a lookahead to the end of the text, tried at
   every position) is counted by its length, which PCRE2's own match limit does not do; nor
   does that limit add up over start positions and calls. A negative return abandons the
   match with that status. */
static int count_work(pcre2_callout_block *b, void *data)
{
    fx__matcher *m = data;
    size_t at = b->current_position;
    m->work += 1 + (at > m->at ? at - m->at : m->at - at);
    m->at = at;
    return m->work > m->budget ? PCRE2_ERROR_CALLOUT : 0;
}

int fx__matcher_init(fx__matcher *m)
{
    *m = (fx__matcher){0};
    m->md = pcre2_match_data_create(16, NULL);
    m->mc = pcre2_match_context_create(NULL);
    if (!m->md || !m->mc) {
        fx__matcher_free(m);
        return fx__error(FX_ENOMEM, "cannot allocate regex match data");
    }
    pcre2_set_callout(m->mc, count_work, m);
    pcre2_set_depth_limit(m->mc, FX__RE_DEPTH_LIMIT);
    pcre2_set_heap_limit(m->mc, FX__RE_HEAP_LIMIT_KIB);
    fx__matcher_reset(m);
    return FX_OK;
}

void fx__matcher_free(fx__matcher *m)
{
    if (m->md)
        pcre2_match_data_free(m->md);
    if (m->mc)
        pcre2_match_context_free(m->mc);
    *m = (fx__matcher){0};
}

void fx__matcher_reset(fx__matcher *m)
{
    m->work = 0;
    m->len = 0;
    m->budget = FX__RE_WORK_BASE;
}

void fx__matcher_add(fx__matcher *m, size_t n)
{
    m->len += n;
    m->budget += (uint64_t)FX__RE_WORK_PER_BYTE * n;
}

int fx__regex_init(fx__regex *re, const char *pattern, size_t len, bool literal, bool counted, const char *field)
{
    *re = (fx__regex){0};
    size_t fl = strlen(field);
    if (!(re->field = fx__alloc(fl + 1)))
        return FX_ENOMEM;
    memcpy(re->field, field, fl + 1);
    if (literal) {
        re->lit = fx__alloc(len + 1);
        if (!re->lit)
            return FX_ENOMEM;
        memcpy(re->lit, pattern, len);
        re->lit[len] = '\0';
        re->lit_len = len;
        return FX_OK;
    }
    int err;
    PCRE2_SIZE erroff;
    re->code = pcre2_compile((PCRE2_SPTR)pattern, len, PCRE2_UTF | PCRE2_UCP | (counted ? PCRE2_AUTO_CALLOUT : 0),
                             &err, &erroff, NULL);
    if (!re->code) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return fx__error(FX_EUNSUPPORTED, "%s: the regex does not compile (at byte %zu: %s)", field,
                         (size_t)erroff, (char *)msg);
    }
    /* JIT is an optimisation: without it (no JIT support here) matching is the same. */
    pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);
    return FX_OK;
}

void fx__regex_free(fx__regex *re)
{
    if (re->code)
        pcre2_code_free(re->code);
    fx__free(re->lit);
    fx__free(re->field);
    *re = (fx__regex){0};
}

/* One pcre2_match from `from`, its work counted into m's pass. */
static int match_counted(const fx__regex *re, fx__matcher *m, const char *s, size_t n, size_t from, uint32_t opts)
{
    uint64_t left = m->budget > m->work ? m->budget - m->work : 0;
    /* PCRE2's own count, a second bound: it counts less than count_work. */
    pcre2_set_match_limit(m->mc, left < UINT32_MAX ? (uint32_t)left + 1 : UINT32_MAX);
    m->at = from;
    return pcre2_match(re->code, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK | opts, m->md, m->mc);
}

int fx__regex_next(const fx__regex *re, fx__matcher *m, const char *s, size_t n, size_t from, size_t *ms, size_t *me)
{
    if (!re->code) {
        if (re->lit_len == 0 || from >= n || n - from < re->lit_len)
            return 1;
        const char *hit = memmem(s + from, n - from, re->lit, re->lit_len);
        if (!hit)
            return 1;
        *ms = (size_t)(hit - s);
        *me = *ms + re->lit_len;
        return FX_OK;
    }
    if (from > n)
        return 1;
    int rc = match_counted(re, m, s, n, from, 0);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = match_counted(re, m, s, n, from, PCRE2_NO_JIT);
    if (rc == PCRE2_ERROR_NOMATCH)
        return 1;
    const char *src = m->source ? m->source : "", *sep = m->source ? ": " : "";
    if (rc == PCRE2_ERROR_CALLOUT || rc == PCRE2_ERROR_MATCHLIMIT)
        return fx__error(FX_EFORMAT,
                         "%s%s%s: the regex exceeded its work budget on %zu bytes of text (%llu steps: %d + %d a "
                         "byte): the pattern backtracks catastrophically",
                         src, sep, re->field, m->len, (unsigned long long)m->budget, FX__RE_WORK_BASE,
                         FX__RE_WORK_PER_BYTE);
    if (rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT)
        return fx__error(FX_EFORMAT,
                         "%s%s%s: the regex exceeded its backtracking limit on %zu bytes of text (depth %d, %d "
                         "KiB): the pattern nests its backtracking too deep",
                         src, sep, re->field, m->len, FX__RE_DEPTH_LIMIT, FX__RE_HEAP_LIMIT_KIB);
    if (rc < 0) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return fx__error(FX_EINVAL, "%s%s%s: regex match failed: %s", src, sep, re->field, (char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
    *ms = ov[0];
    *me = ov[1];
    return FX_OK;
}
