/* Reading safetensors files: map, validate everything, then hand out views.
   The header is checked in passes, none of which builds a JSON tree: bytes (length, UTF-8), a
   lexical pre-scan that enforces what JSON allows but the format forbids (signs, fractions,
   exponents, integers past int64, deep nesting, long arrays), strict JSON syntax, then the
   structure, walked twice (count, then fill arrays of exactly that size), then duplicate names
   and the data layout. The parser's memory is the views, the sorted name index and the
   decoded strings: about twice the header's size at worst (docs/safetensors.md). */
#include "st_internal.h"

#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- small helpers ------------------------------------------------------------------------- */

static const char *quote(char buf[FX__ST_QUOTE_CAP], const char *s, bool quoted)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    if (quoted)
        buf[o++] = '\'';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (o + 8 >= FX__ST_QUOTE_CAP) {
            /* Cut at a character boundary so the message stays valid UTF-8. */
            while (o > 1 && ((unsigned char)buf[o - 1] & 0xc0) == 0x80)
                o--;
            if (o > 1 && (unsigned char)buf[o - 1] >= 0xc0)
                o--;
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (*p < 0x20 || *p == 0x7f || (quoted && (*p == '\\' || *p == '\''))) {
            buf[o++] = '\\';
            buf[o++] = 'x';
            buf[o++] = hex[*p >> 4];
            buf[o++] = hex[*p & 15];
        } else {
            buf[o++] = (char)*p;
        }
    }
    if (quoted)
        buf[o++] = '\'';
    buf[o] = '\0';
    return buf;
}

const char *fx__st_quote(char buf[FX__ST_QUOTE_CAP], const char *s) { return quote(buf, s, true); }
const char *fx__st_printable(char buf[FX__ST_QUOTE_CAP], const char *s) { return quote(buf, s, false); }

bool fx__st_utf8_valid(const unsigned char *s, size_t n, size_t *bad)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xc2 && c <= 0xdf) {
            len = 2, cp = c & 0x1f, min = 0x80;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3, cp = c & 0x0f, min = 0x800;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            *bad = i;
            return false;
        }
        if (n - i < len) {
            *bad = i;
            return false;
        }
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) {
                *bad = i;
                return false;
            }
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
            *bad = i;
            return false;
        }
        i += len;
    }
    return true;
}

/* ---- pass 2: lexical pre-scan -------------------------------------------------------------- */

/* JSON allows signed numbers (-0 too), reals and any nesting; the format wants non-negative
   integers and three levels. Refusing those here keeps every number the parser below reads a
   plain digit string that fits int64_t, and its recursion shallow. */
static int prescan(const unsigned char *h, size_t n)
{
    int depth = 0;
    bool is_array[FX__ST_MAX_DEPTH + 1] = {false};
    size_t count[FX__ST_MAX_DEPTH + 1] = {0};
    size_t i = 0;
    while (i < n) {
        unsigned char c = h[i];
        if (c == '"') {
            /* Skip the string; the syntax pass checks its escapes and characters. */
            i++;
            while (i < n && h[i] != '"')
                i += h[i] == '\\' ? 2 : 1;
            i++;
            continue;
        }
        if (c == '{' || c == '[') {
            if (depth == FX__ST_MAX_DEPTH)
                return fx__error(FX_EFORMAT, "header: JSON nested deeper than %d levels at byte %zu "
                                 "(the nesting-depth rule)", FX__ST_MAX_DEPTH, i);
            depth++;
            is_array[depth] = c == '[';
            count[depth] = 0;
        } else if (c == '}' || c == ']') {
            if (depth > 0)
                depth--;
        } else if (c == ',') {
            if (depth > 0 && is_array[depth] && ++count[depth] >= FX_MAX_DIMS)
                return fx__error(FX_EFORMAT, "header: array at byte %zu has more than %d elements "
                                 "(shapes have at most %d dimensions)", i, FX_MAX_DIMS, FX_MAX_DIMS);
        } else if (c == '-' || c == '+') {
            return fx__error(FX_EFORMAT, "header: signed number at byte %zu (numbers must be "
                             "non-negative integers)", i);
        } else if (c >= '0' && c <= '9') {
            size_t start = i;
            uint64_t v = 0;
            bool big = false;
            for (; i < n && h[i] >= '0' && h[i] <= '9'; i++) {
                unsigned d = h[i] - '0';
                if (v > (uint64_t)(INT64_MAX - d) / 10)
                    big = true;
                else
                    v = v * 10 + d;
            }
            if (i < n && (h[i] == '.' || h[i] == 'e' || h[i] == 'E'))
                return fx__error(FX_EFORMAT, "header: number at byte %zu has a fraction or exponent "
                                 "(numbers must be non-negative integers)", start);
            if (big)
                return fx__error(FX_EFORMAT, "header: integer at byte %zu is larger than %lld "
                                 "(the largest size flexc accepts)", start, (long long)INT64_MAX);
            continue;
        }
        i++;
    }
    return FX_OK;
}

/* ---- pass 3: strict JSON syntax ---------------------------------------------------------------
   A small parser for exactly what a header holds. It builds nothing: the syntax pass walks the
   whole text once, and the structure passes below read values where they lie. A general JSON
   tree (what jansson builds) costs tens of bytes per value, so a legal 100 MB header of a
   million small entries took gigabytes before anything could be said about it. */

typedef struct jcur {
    const unsigned char *s;
    size_t n, i;
} jcur;

typedef enum jkind { J_OBJECT, J_ARRAY, J_STRING, J_INTEGER, J_BOOL, J_NULL } jkind;

static const char *jkind_name(jkind k)
{
    switch (k) {
    case J_OBJECT: return "an object";
    case J_ARRAY: return "an array";
    case J_STRING: return "a string";
    case J_INTEGER: return "an integer";
    case J_BOOL: return "a boolean";
    case J_NULL: return "null";
    }
    return "unknown";
}

static void jws(jcur *c)
{
    while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\n' || c->s[c->i] == '\r'))
        c->i++;
}

static int jerr(const jcur *c, const char *what)
{
    return fx__error(FX_EFORMAT, "header is not strict JSON: %s at byte %zu", what, c->i);
}

static int hexval(unsigned char h)
{
    return h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
}

/* Four hex digits at s[i..i+4) -> *cp; false if they are not. */
static bool hex4(const jcur *c, size_t i, uint32_t *cp)
{
    if (c->n - i < 4)
        return false;
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(c->s[i + k]);
        if (h < 0)
            return false;
        v = v << 4 | (uint32_t)h;
    }
    *cp = v;
    return true;
}

/* The string at c->i (its opening quote), escapes decoded: the first `cap` bytes of the text go
   to dst (when not NULL), its whole decoded length to *len. The bytes were checked as UTF-8. */
static int jstring(jcur *c, char *dst, size_t cap, size_t *len)
{
    size_t i = c->i + 1, o = 0;
    for (;;) {
        if (i >= c->n) {
            c->i = i;
            return jerr(c, "unterminated string");
        }
        unsigned char ch = c->s[i];
        if (ch == '"')
            break;
        if (ch < 0x20) {
            c->i = i;
            return jerr(c, "control character in a string (it must be escaped)");
        }
        if (ch != '\\') {
            if (dst && o < cap)
                dst[o] = (char)ch;
            o++, i++;
            continue;
        }
        if (i + 1 >= c->n) {
            c->i = i;
            return jerr(c, "unterminated string");
        }
        uint32_t cp;
        unsigned char e = c->s[i + 1];
        switch (e) {
        case '"': case '\\': case '/': cp = e; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            if (!hex4(c, i + 2, &cp)) {
                c->i = i;
                return jerr(c, "invalid \\u escape");
            }
            if (cp >= 0xdc00 && cp <= 0xdfff) {
                c->i = i;
                return jerr(c, "invalid Unicode escape (a lone low surrogate)");
            }
            if (cp >= 0xd800 && cp <= 0xdbff) {
                uint32_t lo;
                if (c->n - i < 12 || c->s[i + 6] != '\\' || c->s[i + 7] != 'u' || !hex4(c, i + 8, &lo) ||
                    lo < 0xdc00 || lo > 0xdfff) {
                    c->i = i;
                    return jerr(c, "invalid Unicode escape (a high surrogate without its low one)");
                }
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                i += 6;
            }
            if (cp == 0) {
                c->i = i;
                return jerr(c, "\\u0000 (a NUL character) in a string");
            }
            i += 4;
            break;
        default:
            c->i = i;
            return jerr(c, "invalid escape in a string");
        }
        i += 2;
        unsigned char u[4];
        int nb = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        if (nb == 1)
            u[0] = (unsigned char)cp;
        else if (nb == 2)
            u[0] = (unsigned char)(0xc0 | cp >> 6), u[1] = (unsigned char)(0x80 | (cp & 0x3f));
        else if (nb == 3)
            u[0] = (unsigned char)(0xe0 | cp >> 12), u[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3f)),
            u[2] = (unsigned char)(0x80 | (cp & 0x3f));
        else
            u[0] = (unsigned char)(0xf0 | cp >> 18), u[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3f)),
            u[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3f)), u[3] = (unsigned char)(0x80 | (cp & 0x3f));
        for (int k = 0; k < nb; k++, o++)
            if (dst && o < cap)
                dst[o] = (char)u[k];
    }
    c->i = i + 1;
    *len = o;
    return FX_OK;
}

/* Skips the value at c->i (after whitespace), checking its syntax; *kind says what it was.
   Nesting is bounded by the pre-scan, so the recursion is too. */
static int jskip(jcur *c, jkind *kind)
{
    jws(c);
    if (c->i >= c->n)
        return jerr(c, "a value expected");
    unsigned char ch = c->s[c->i];
    size_t len;
    jkind k;
    int rc;
    if (ch == '{' || ch == '[') {
        bool obj = ch == '{';
        *kind = obj ? J_OBJECT : J_ARRAY;
        c->i++;
        jws(c);
        if (c->i < c->n && c->s[c->i] == (obj ? '}' : ']')) {
            c->i++;
            return FX_OK;
        }
        for (;;) {
            if (obj) {
                jws(c);
                if (c->i >= c->n || c->s[c->i] != '"')
                    return jerr(c, "a string (an object key) expected");
                if ((rc = jstring(c, NULL, 0, &len)) != FX_OK)
                    return rc;
                jws(c);
                if (c->i >= c->n || c->s[c->i] != ':')
                    return jerr(c, "':' expected");
                c->i++;
            }
            if ((rc = jskip(c, &k)) != FX_OK)
                return rc;
            jws(c);
            if (c->i < c->n && c->s[c->i] == ',') {
                c->i++;
                continue;
            }
            if (c->i < c->n && c->s[c->i] == (obj ? '}' : ']')) {
                c->i++;
                return FX_OK;
            }
            return jerr(c, obj ? "',' or '}' expected" : "',' or ']' expected");
        }
    }
    if (ch == '"') {
        *kind = J_STRING;
        return jstring(c, NULL, 0, &len);
    }
    if (ch >= '0' && ch <= '9') {
        *kind = J_INTEGER;
        if (ch == '0' && c->i + 1 < c->n && c->s[c->i + 1] >= '0' && c->s[c->i + 1] <= '9')
            return jerr(c, "a number with a leading zero");
        while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9')
            c->i++;
        return FX_OK;
    }
    static const struct { const char *word; jkind kind; } lit[] = {
        {"true", J_BOOL}, {"false", J_BOOL}, {"null", J_NULL}};
    for (size_t w = 0; w < 3; w++) {
        size_t wl = strlen(lit[w].word);
        if (c->n - c->i >= wl && !memcmp(c->s + c->i, lit[w].word, wl)) {
            c->i += wl;
            *kind = lit[w].kind;
            return FX_OK;
        }
    }
    return jerr(c, "a value expected");
}

/* The non-negative integer at c->i (the pre-scan bounded it by INT64_MAX). */
static uint64_t jint(jcur *c)
{
    uint64_t v = 0;
    while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9')
        v = v * 10 + (uint64_t)(c->s[c->i++] - '0');
    return v;
}

/* The whole header: one object or array, then only whitespace. */
static int check_syntax(const unsigned char *h, size_t n)
{
    jcur c = {h, n, 0};
    jws(&c);
    if (c.i >= n || (h[c.i] != '{' && h[c.i] != '['))
        return jerr(&c, "'{' expected");
    jkind k;
    int rc = jskip(&c, &k);
    if (rc != FX_OK)
        return rc;
    jws(&c);
    if (c.i != n)
        return jerr(&c, "end of the header expected (one JSON value only)");
    return FX_OK;
}

/* ---- pass 4: structure, counted once and then filled ----------------------------------------- */

/* Views hold their data offset here until the layout is checked (the offset may lie past the
   buffer, where no pointer may point). */
static uint64_t view_offset(const fx_tensor_view *v) { return (uint64_t)(uintptr_t)v->data; }

typedef struct hdr {
    jcur c;
    fx_safetensors *f; /* fill pass: arrays allocated */
    bool fill;
    size_t n, nmeta, sbytes; /* count pass: totals; fill pass: positions */
    char *s;                 /* fill pass: where the next string goes */
} hdr;

/* The decoded start of the string at pos, quoted for a message. */
static const char *quote_at(const hdr *h, size_t pos, char q[FX__ST_QUOTE_CAP])
{
    char buf[2 * FX__ST_QUOTE_CAP];
    jcur c = {h->c.s, h->c.n, pos};
    size_t len = 0;
    if (jstring(&c, buf, sizeof buf - 1, &len) != FX_OK)
        len = 0;
    buf[len < sizeof buf - 1 ? len : sizeof buf - 1] = '\0';
    return fx__st_quote(q, buf);
}

/* The value at pos: its kind (syntax was checked). */
static jkind kind_at(const hdr *h, size_t pos)
{
    jcur c = {h->c.s, h->c.n, pos};
    jkind k = J_NULL;
    jskip(&c, &k);
    return k;
}

enum { KEY_DTYPE, KEY_SHAPE, KEY_OFFSETS };

/* An entry's keys, from the '{' at h->c.i: pos[KEY_*] the position of each value. Refuses a
   repeated key, then an unexpected one, then a missing one; *end is just past the '}'. */
static int entry_keys(hdr *h, size_t key_pos, size_t pos[3], size_t *end)
{
    char q[FX__ST_QUOTE_CAP], qk[FX__ST_QUOTE_CAP];
    jcur *c = &h->c;
    size_t unexpected = SIZE_MAX;
    pos[KEY_DTYPE] = pos[KEY_SHAPE] = pos[KEY_OFFSETS] = SIZE_MAX;
    c->i++;
    jws(c);
    while (c->s[c->i] != '}') {
        size_t kp = c->i, len;
        char key[16];
        jstring(c, key, sizeof key, &len);
        int which = len == 5 && !memcmp(key, "dtype", 5) ? KEY_DTYPE
                  : len == 5 && !memcmp(key, "shape", 5) ? KEY_SHAPE
                  : len == 12 && !memcmp(key, "data_offsets", 12) ? KEY_OFFSETS : -1;
        jws(c);
        c->i++; /* ':' */
        jws(c);
        if (which >= 0 && pos[which] != SIZE_MAX)
            return fx__error(FX_EFORMAT, "tensor %s: duplicate key %s", quote_at(h, key_pos, q),
                             quote_at(h, kp, qk));
        if (which >= 0)
            pos[which] = c->i;
        else if (unexpected == SIZE_MAX)
            unexpected = kp;
        jkind k;
        jskip(c, &k);
        jws(c);
        if (c->s[c->i] == ',') {
            c->i++;
            jws(c);
        }
    }
    *end = c->i + 1;
    if (unexpected != SIZE_MAX)
        return fx__error(FX_EFORMAT, "tensor %s: unexpected key %s (entries have exactly dtype, shape and "
                         "data_offsets)", quote_at(h, key_pos, q), quote_at(h, unexpected, qk));
    const char *missing = pos[KEY_DTYPE] == SIZE_MAX ? "dtype" : pos[KEY_SHAPE] == SIZE_MAX ? "shape"
                        : pos[KEY_OFFSETS] == SIZE_MAX ? "data_offsets" : NULL;
    if (missing)
        return fx__error(FX_EFORMAT, "tensor %s: missing key '%s'", quote_at(h, key_pos, q), missing);
    return FX_OK;
}

/* The dtype value at `at`: a string naming a dtype. */
static int entry_dtype(hdr *h, size_t key_pos, size_t at, fx_dtype *dt)
{
    char q[FX__ST_QUOTE_CAP], qd[FX__ST_QUOTE_CAP];
    jkind k = kind_at(h, at);
    if (k != J_STRING)
        return fx__error(FX_EFORMAT, "tensor %s: dtype is %s, not a string", quote_at(h, key_pos, q), jkind_name(k));
    char dname[16];
    size_t dlen;
    h->c.i = at;
    jstring(&h->c, dname, sizeof dname - 1, &dlen);
    dname[dlen < sizeof dname - 1 ? dlen : sizeof dname - 1] = '\0';
    if (dlen >= sizeof dname - 1 || fx_dtype_from_name(dt, dname) != FX_OK)
        return fx__error(FX_EFORMAT, "tensor %s: unknown dtype %s (names are upper case, e.g. F32, BF16, I64)",
                         quote_at(h, key_pos, q), quote_at(h, at, qd));
    return FX_OK;
}

/* The shape value at `at`: an array of non-negative integers, shape [*nd]; *nbytes the
   tensor's size in dt, refused where the product of the dimensions, or that times the
   element size, overflows. */
static int entry_shape(hdr *h, size_t key_pos, size_t at, fx_dtype dt, int64_t shape[FX_MAX_DIMS], int *nd,
                       uint64_t *nbytes)
{
    char q[FX__ST_QUOTE_CAP];
    jcur *c = &h->c;
    jkind k = kind_at(h, at);
    if (k != J_ARRAY)
        return fx__error(FX_EFORMAT, "tensor %s: shape is %s, not an array", quote_at(h, key_pos, q), jkind_name(k));
    uint64_t numel = 1;
    bool overflow = false;
    c->i = at + 1;
    for (jws(c), *nd = 0; c->s[c->i] != ']'; ++*nd) {
        jws(c);
        if (*nd == FX_MAX_DIMS) /* not reached: the pre-scan refuses longer arrays */
            return fx__error(FX_EFORMAT, "tensor %s: shape has more than %d dimensions", quote_at(h, key_pos, q),
                             FX_MAX_DIMS);
        if ((k = kind_at(h, c->i)) != J_INTEGER)
            return fx__error(FX_EFORMAT, "tensor %s: shape[%d] is %s, not a non-negative integer",
                             quote_at(h, key_pos, q), *nd, jkind_name(k));
        uint64_t dim = jint(c);
        shape[*nd] = (int64_t)dim;
        /* Checked at each step: a product that wraps (possibly to 0) is an error, never an empty
           tensor. */
        if (!overflow && __builtin_mul_overflow(numel, dim, &numel))
            overflow = true;
        jws(c);
        if (c->s[c->i] == ',')
            c->i++;
        jws(c);
    }
    if (overflow || numel > (uint64_t)INT64_MAX || __builtin_mul_overflow(numel, (uint64_t)fx_dtype_size(dt), nbytes))
        return fx__error(FX_EFORMAT, "tensor %s: shape product times %zu bytes overflows (the size-overflow rule)",
                         quote_at(h, key_pos, q), fx_dtype_size(dt));
    return FX_OK;
}

/* The data_offsets value at `at`: an array of two non-negative integers [off[0], off[1]),
   nbytes apart. */
static int entry_offsets(hdr *h, size_t key_pos, size_t at, fx_dtype dt, uint64_t nbytes, uint64_t off[2])
{
    char q[FX__ST_QUOTE_CAP];
    jcur *c = &h->c;
    jkind k = kind_at(h, at);
    size_t count = 0;
    bool ints = true;
    off[0] = off[1] = 0;
    if (k == J_ARRAY) {
        c->i = at + 1;
        for (jws(c); c->s[c->i] != ']'; count++) {
            jws(c);
            jkind ek = kind_at(h, c->i);
            if (ek == J_INTEGER && count < 2)
                off[count] = jint(c);
            else
                jskip(c, &ek);
            ints &= ek == J_INTEGER;
            jws(c);
            if (c->s[c->i] == ',')
                c->i++;
            jws(c);
        }
    }
    if (k != J_ARRAY || count != 2)
        return fx__error(FX_EFORMAT, "tensor %s: data_offsets is %s%s, not an array of 2 integers",
                         quote_at(h, key_pos, q), jkind_name(k), k == J_ARRAY ? " of another length" : "");
    if (!ints)
        return fx__error(FX_EFORMAT, "tensor %s: data_offsets holds something other than non-negative integers",
                         quote_at(h, key_pos, q));
    if (off[1] < off[0])
        return fx__error(FX_EFORMAT, "tensor %s: data_offsets [%llu, %llu) end before they begin",
                         quote_at(h, key_pos, q), (unsigned long long)off[0], (unsigned long long)off[1]);
    if (off[1] - off[0] != nbytes)
        return fx__error(FX_EFORMAT, "tensor %s: data_offsets [%llu, %llu) hold %llu bytes but %s shape needs %llu "
                         "(the end - begin = byte size rule)", quote_at(h, key_pos, q), (unsigned long long)off[0],
                         (unsigned long long)off[1], (unsigned long long)(off[1] - off[0]), fx_dtype_name(dt),
                         (unsigned long long)nbytes);
    return FX_OK;
}

/* One tensor entry at h->c.i (its key at key_pos, klen bytes decoded): exactly dtype, shape and
   data_offsets, sizes checked for overflow, in the order the checks were always made. The fill
   pass stores the view, its name copied into the string area. */
static int entry(hdr *h, size_t key_pos, size_t klen)
{
    char q[FX__ST_QUOTE_CAP];
    jkind k = kind_at(h, h->c.i);
    if (k != J_OBJECT)
        return fx__error(FX_EFORMAT, "tensor %s: entry is %s, not an object with dtype, shape and "
                         "data_offsets", quote_at(h, key_pos, q), jkind_name(k));
    size_t pos[3], end = 0;
    fx_dtype dt = FX_DT_F32;
    int64_t shape[FX_MAX_DIMS];
    int nd = 0;
    uint64_t nbytes = 0, off[2] = {0, 0};
    int rc = entry_keys(h, key_pos, pos, &end);
    if (rc == FX_OK)
        rc = entry_dtype(h, key_pos, pos[KEY_DTYPE], &dt);
    if (rc == FX_OK)
        rc = entry_shape(h, key_pos, pos[KEY_SHAPE], dt, shape, &nd, &nbytes);
    if (rc == FX_OK)
        rc = entry_offsets(h, key_pos, pos[KEY_OFFSETS], dt, nbytes, off);
    if (rc != FX_OK)
        return rc;
    h->c.i = end;
    if (h->fill) {
        fx_tensor_view *v = &h->f->views[h->n];
        jcur kc = {h->c.s, h->c.n, key_pos};
        size_t len;
        jstring(&kc, h->s, klen, &len);
        v->name = h->s;
        h->s += klen;
        *h->s++ = '\0';
        v->dtype = dt;
        v->ndim = nd;
        memset(v->shape, 0, sizeof v->shape);
        memcpy(v->shape, shape, (size_t)nd * sizeof shape[0]);
        v->data = (const void *)(uintptr_t)off[0];
        v->nbytes = (size_t)nbytes;
    }
    h->n++;
    h->sbytes += klen + 1;
    return FX_OK;
}

/* __metadata__ at h->c.i: an object of strings. */
static int metadata(hdr *h)
{
    jcur *c = &h->c;
    jkind k = kind_at(h, c->i);
    if (k != J_OBJECT)
        return fx__error(FX_EFORMAT, "__metadata__ is %s, not an object of strings", jkind_name(k));
    c->i++;
    jws(c);
    while (c->s[c->i] != '}') {
        size_t kp = c->i, klen, vlen;
        jstring(c, NULL, 0, &klen);
        jws(c);
        c->i++; /* ':' */
        jws(c);
        size_t vp = c->i;
        if ((k = kind_at(h, vp)) != J_STRING) {
            char q[FX__ST_QUOTE_CAP];
            return fx__error(FX_EFORMAT, "__metadata__ value of %s is %s, not a string (metadata maps strings to "
                             "strings)", quote_at(h, kp, q), jkind_name(k));
        }
        jstring(c, NULL, 0, &vlen);
        if (h->fill) {
            jcur kc = {c->s, c->n, kp}, vc = {c->s, c->n, vp};
            size_t len;
            h->f->meta[h->nmeta] = h->s;
            jstring(&kc, h->s, klen, &len);
            h->s += klen;
            *h->s++ = '\0';
            jstring(&vc, h->s, vlen, &len);
            h->s += vlen;
            *h->s++ = '\0';
        }
        h->nmeta++;
        h->sbytes += klen + 1 + vlen + 1;
        jws(c);
        if (c->s[c->i] == ',') {
            c->i++;
            jws(c);
        }
    }
    c->i++;
    return FX_OK;
}

/* One walk over the top-level object (syntax already checked). */
static int walk(hdr *h)
{
    jcur *c = &h->c;
    c->i = 0;
    jws(c);
    if (c->s[c->i] != '{')
        return fx__error(FX_EFORMAT, "header is %s, not a JSON object", jkind_name(kind_at(h, c->i)));
    c->i++;
    jws(c);
    bool seen_meta = false;
    while (c->s[c->i] != '}') {
        size_t kp = c->i, klen;
        char key[16];
        jstring(c, key, sizeof key, &klen);
        jws(c);
        c->i++; /* ':' */
        jws(c);
        int rc;
        if (klen == 12 && !memcmp(key, "__metadata__", 12)) {
            if (seen_meta)
                return fx__error(FX_EFORMAT, "header: duplicate key '__metadata__'");
            seen_meta = true;
            rc = metadata(h);
        } else {
            rc = entry(h, kp, klen);
        }
        if (rc != FX_OK)
            return rc;
        jws(c);
        if (c->s[c->i] == ',') {
            c->i++;
            jws(c);
        }
    }
    return FX_OK;
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_view_name(const void *a, const void *b)
{
    const fx_tensor_view *x = *(const fx_tensor_view *const *)a, *y = *(const fx_tensor_view *const *)b;
    return strcmp(x->name, y->name);
}

/* File order: by data offset, then end, then header order (the views' addresses while they are
   still in header order). */
static int cmp_view_span(const void *a, const void *b)
{
    const fx_tensor_view *x = *(const fx_tensor_view *const *)a, *y = *(const fx_tensor_view *const *)b;
    uint64_t xb = view_offset(x), yb = view_offset(y);
    if (xb != yb)
        return xb < yb ? -1 : 1;
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? -1 : 1;
    return x < y ? -1 : x > y;
}

void fx__st_release(fx_safetensors *f)
{
    fx__free(f->views);
    fx__free(f->by_name);
    fx__free(f->meta);
    fx__free(f->strings);
    f->views = NULL;
    f->by_name = NULL;
    f->meta = NULL;
    f->strings = NULL;
}

/* The data layout: sorted by offset, tensors must tile [0, buffer length) exactly. sorted holds
   the views in file order. */
static int check_layout(const fx_safetensors *f, const fx_tensor_view *const *sorted, size_t n)
{
    uint64_t expect = 0;
    char q[FX__ST_QUOTE_CAP], qp[FX__ST_QUOTE_CAP];
    for (size_t i = 0; i < n; i++) {
        const fx_tensor_view *v = sorted[i];
        uint64_t b = view_offset(v), e = b + v->nbytes;
        if (b > expect)
            return fx__error(FX_EFORMAT, "tensor %s: data_offsets [%llu, %llu) leave a hole: the data before "
                             "them ends at %llu (offsets must tile the buffer)", fx__st_quote(q, v->name),
                             (unsigned long long)b, (unsigned long long)e, (unsigned long long)expect);
        if (b < expect)
            return fx__error(FX_EFORMAT, "tensor %s: data_offsets [%llu, %llu) overlap tensor %s, which ends at "
                             "%llu (offsets must not overlap)", fx__st_quote(q, v->name), (unsigned long long)b,
                             (unsigned long long)e, fx__st_quote(qp, sorted[i - 1]->name),
                             (unsigned long long)expect);
        if (e > f->buffer_len)
            return fx__error(FX_EFORMAT, "tensor %s: data_offsets [%llu, %llu) run past the end of the data "
                             "buffer (%zu byte%s; the file is incomplete)", fx__st_quote(q, v->name),
                             (unsigned long long)b, (unsigned long long)e, f->buffer_len,
                             f->buffer_len == 1 ? "" : "s");
        expect = e;
    }
    if (expect != f->buffer_len)
        return fx__error(FX_EFORMAT, "the tensors cover %llu bytes of the data buffer but it holds %zu: %zu "
                         "trailing byte%s belong%s to no tensor (the buffer must be covered exactly)",
                         (unsigned long long)expect, f->buffer_len, f->buffer_len - (size_t)expect,
                         f->buffer_len - (size_t)expect == 1 ? "" : "s",
                         f->buffer_len - (size_t)expect == 1 ? "s" : "");
    return FX_OK;
}

static int parse_json(fx_safetensors *f, const unsigned char *text, size_t len)
{
    int rc = check_syntax(text, len);
    if (rc != FX_OK)
        return rc;
    /* Count, so that each array is allocated once at its exact size, then fill. */
    hdr h = {.c = {text, len, 0}, .f = f};
    if ((rc = walk(&h)) != FX_OK)
        return rc;
    size_t n = h.n, nmeta = h.nmeta;
    f->views = fx__alloc((n ? n : 1) * sizeof *f->views);
    f->by_name = fx__alloc((n ? n : 1) * sizeof *f->by_name);
    f->meta = fx__alloc((nmeta ? nmeta : 1) * sizeof *f->meta);
    f->strings = fx__alloc(h.sbytes ? h.sbytes : 1);
    if (!f->views || !f->by_name || !f->meta || !f->strings) {
        fx__st_release(f);
        return FX_ENOMEM;
    }
    h = (hdr){.c = {text, len, 0}, .f = f, .fill = true, .s = f->strings};
    walk(&h); /* cannot fail: the same walk succeeded */
    f->n = n;
    f->nmeta = nmeta;

    /* Duplicate metadata keys (header order is kept, so a sorted copy is checked). */
    if (nmeta > 1) {
        const char **keys = fx__alloc(nmeta * sizeof *keys);
        if (!keys) {
            fx__st_release(f);
            return FX_ENOMEM;
        }
        memcpy(keys, f->meta, nmeta * sizeof *keys);
        qsort(keys, nmeta, sizeof *keys, cmp_str_ptr);
        for (size_t i = 1; i < nmeta && rc == FX_OK; i++)
            if (!strcmp(keys[i - 1], keys[i])) {
                char q[FX__ST_QUOTE_CAP];
                rc = fx__error(FX_EFORMAT, "__metadata__: duplicate key %s", fx__st_quote(q, keys[i]));
            }
        fx__free(keys);
        if (rc != FX_OK) {
            fx__st_release(f);
            return rc;
        }
    }

    /* The layout, in file order; by_name serves as the permutation. A duplicate name outranks a
       layout error (the duplicate is the cause). */
    const fx_tensor_view **order = f->by_name;
    for (size_t i = 0; i < n; i++)
        order[i] = &f->views[i];
    qsort(order, n, sizeof *order, cmp_view_span);
    int layout = check_layout(f, order, n);
    if (layout == FX_OK) {
        /* Views into file order, in place: views[j] = old views[order[j]], cycle by cycle. */
        for (size_t i = 0; i < n; i++) {
            if (!order[i])
                continue;
            fx_tensor_view keep = f->views[i];
            for (size_t j = i;;) {
                size_t k = (size_t)(order[j] - f->views);
                order[j] = NULL;
                if (k == i) {
                    f->views[j] = keep;
                    break;
                }
                f->views[j] = f->views[k];
                j = k;
            }
        }
        for (size_t i = 0; i < n; i++)
            f->views[i].data = f->buffer + view_offset(&f->views[i]);
    }
    for (size_t i = 0; i < n; i++)
        f->by_name[i] = &f->views[i];
    qsort(f->by_name, n, sizeof *f->by_name, cmp_view_name);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(f->by_name[i - 1]->name, f->by_name[i]->name)) {
            char q[FX__ST_QUOTE_CAP];
            rc = fx__error(FX_EFORMAT, "header: duplicate tensor name %s", fx__st_quote(q, f->by_name[i]->name));
            fx__st_release(f);
            return rc;
        }
    if (layout != FX_OK) {
        fx__st_release(f);
        return layout;
    }
    return FX_OK;
}

int fx__st_parse(fx_safetensors *f, const unsigned char *file, size_t len)
{
    memset(f, 0, sizeof *f);
    if (len < 8)
        return fx__error(FX_EFORMAT, "file is %zu bytes, shorter than the 8-byte header length "
                         "(header too small)", len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | file[i];
    if (n > FX__ST_MAX_HEADER)
        return fx__error(FX_EFORMAT, "header length %llu exceeds the limit of %llu bytes (header too "
                         "large)", (unsigned long long)n, FX__ST_MAX_HEADER);
    uint64_t stop;
    if (__builtin_add_overflow(n, (uint64_t)8, &stop) || stop > len)
        return fx__error(FX_EFORMAT, "header length %llu runs past the end of the %zu-byte file "
                         "(invalid header length)", (unsigned long long)n, len);
    const unsigned char *hdr = file + 8;
    size_t bad;
    if (!fx__st_utf8_valid(hdr, (size_t)n, &bad))
        return fx__error(FX_EFORMAT, "header is not valid UTF-8 (byte 0x%02x at header offset %zu)",
                         hdr[bad], bad);
    int rc = prescan(hdr, (size_t)n);
    if (rc != FX_OK)
        return rc;
    f->file = file;
    f->file_len = len;
    f->header_len = (size_t)n;
    f->buffer = file + stop;
    f->buffer_len = len - (size_t)stop;
    return parse_json(f, hdr, (size_t)n);
}

/* ---- the public API -------------------------------------------------------------------------- */

/* Maps `path` read-only (*map NULL for an empty file). A FIFO or device at `path` is refused
   before anything could block on it. */
static int map_file(const char *path, void **map, size_t *len)
{
    bool not_regular;
    int fd = fx__open_regular(path, &not_regular);
    if (fd < 0 && not_regular)
        return fx__error(FX_EIO, "%s: not a regular file", path);
    if (fd < 0)
        return fx__error(FX_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return fx__error(FX_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    *len = (size_t)st.st_size;
    *map = NULL;
    if (*len > 0) {
        void *m = mmap(NULL, *len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return fx__error(FX_EIO, "%s: cannot map %zu bytes: %s", path, *len, strerror(e));
        }
        *map = m;
    }
    close(fd); /* the mapping keeps the file */
    return FX_OK;
}

int fx_safetensors_open(fx_safetensors **out, const char *path)
{
    if (!out)
        return fx__error(FX_EINVAL, "out is NULL");
    if (!path)
        return fx__error(FX_EINVAL, "path is NULL");
    void *map;
    size_t len;
    int rc = map_file(path, &map, &len);
    if (rc != FX_OK)
        return rc;
    fx_safetensors *f = fx__calloc(1, sizeof *f);
    if (!f) {
        if (map)
            munmap(map, len);
        return fx__error_context(FX_ENOMEM, "%s", path);
    }
    static const unsigned char empty[1];
    rc = fx__st_parse(f, map ? (const unsigned char *)map : empty, len);
    if (rc != FX_OK) {
        if (map)
            munmap(map, len);
        fx__free(f);
        return fx__error_context(rc, "%s", path);
    }
    f->map = map;
    *out = f;
    return FX_OK;
}

/* The header of file[0..len) checked as fx__st_parse does up to the JSON syntax: *hdr and *n. */
static int header_syntax(const unsigned char *file, size_t len, const unsigned char **hdr, size_t *n)
{
    if (len < 8)
        return fx__error(FX_EFORMAT, "file is %zu byte%s, shorter than the 8-byte header length (header too small)",
                         len, len == 1 ? "" : "s");
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | file[i];
    if (hl > FX__ST_MAX_HEADER || hl > len - 8)
        return fx__error(FX_EFORMAT, "header length %llu is past the limit or the end of the file (header too large "
                         "or invalid header length)", (unsigned long long)hl);
    size_t bad;
    if (!fx__st_utf8_valid(file + 8, (size_t)hl, &bad))
        return fx__error(FX_EFORMAT, "header is not valid UTF-8 (byte 0x%02x at header offset %zu)", file[8 + bad],
                         bad);
    int rc = prescan(file + 8, (size_t)hl);
    if (rc == FX_OK)
        rc = check_syntax(file + 8, (size_t)hl);
    *hdr = file + 8;
    *n = (size_t)hl;
    return rc;
}

/* Whether the key at c->i decodes to key[0..klen): one byte more than it has is decoded, so a
   longer key does not match. */
static int key_is(jcur *c, const char *key, size_t klen, bool *match)
{
    char small[256], *kb = klen + 2 <= sizeof small ? small : fx__alloc(klen + 2);
    if (!kb)
        return FX_ENOMEM;
    size_t l;
    jstring(c, kb, klen + 1, &l);
    *match = l == klen && !memcmp(kb, key, klen);
    if (kb != small)
        fx__free(kb);
    return FX_OK;
}

/* The string at c (not moved) into value[0..cap), NUL-terminated, when it fits. */
static int copy_value(const jcur *c, const char *key, char *value, size_t cap)
{
    jcur vc = *c;
    size_t l;
    jstring(&vc, NULL, 0, &l);
    if (l >= cap)
        return fx__error(FX_ERANGE, "metadata '%s' is %zu bytes; the buffer holds %zu", key, l, cap ? cap - 1 : 0);
    vc = *c;
    jstring(&vc, value, l, &l);
    value[l] = '\0';
    return FX_OK;
}

/* `key` in the __metadata__ value at h->c.i. Its entries are checked up to the one found. */
static int peek_in_metadata(hdr *h, const char *key, char *value, size_t cap, bool *found)
{
    jcur *c = &h->c;
    jkind k = kind_at(h, c->i);
    if (k != J_OBJECT)
        return fx__error(FX_EFORMAT, "__metadata__ is %s, not an object of strings", jkind_name(k));
    const size_t klen = strlen(key);
    c->i++;
    jws(c);
    while (c->s[c->i] != '}') {
        size_t kp = c->i, l;
        bool match;
        int rc = key_is(c, key, klen, &match);
        if (rc != FX_OK)
            return rc;
        jws(c);
        c->i++; /* ':' */
        jws(c);
        if ((k = kind_at(h, c->i)) != J_STRING) {
            char q[FX__ST_QUOTE_CAP];
            return fx__error(FX_EFORMAT, "__metadata__ value of %s is %s, not a string", quote_at(h, kp, q),
                             jkind_name(k));
        }
        if (match) {
            if ((rc = copy_value(c, key, value, cap)) == FX_OK)
                *found = true;
            return rc;
        }
        jstring(c, NULL, 0, &l);
        jws(c);
        if (c->s[c->i] == ',') {
            c->i++;
            jws(c);
        }
    }
    return FX_OK;
}

/* The top-level members of the header text[0..n) (syntax checked): only __metadata__ is looked
   into. */
static int peek_header(const unsigned char *text, size_t n, const char *key, char *value, size_t cap, bool *found)
{
    hdr h = {.c = {text, n, 0}};
    jcur *c = &h.c;
    jws(c);
    if (text[c->i] != '{')
        return fx__error(FX_EFORMAT, "header is %s, not a JSON object", jkind_name(kind_at(&h, c->i)));
    c->i++;
    jws(c);
    while (text[c->i] != '}') {
        char name[16];
        size_t nl;
        jstring(c, name, sizeof name, &nl);
        jws(c);
        c->i++; /* ':' */
        jws(c);
        if (nl == 12 && !memcmp(name, "__metadata__", 12))
            return peek_in_metadata(&h, key, value, cap, found);
        jkind k;
        jskip(c, &k);
        jws(c);
        if (text[c->i] == ',') {
            c->i++;
            jws(c);
        }
    }
    return FX_OK;
}

int fx_safetensors_peek_metadata(const char *path, const char *key, char *value, size_t cap, bool *found)
{
    if (!path || !key || !found || (cap && !value))
        return fx__error(FX_EINVAL, "%s is NULL", !path ? "path" : !key ? "key" : !found ? "found" : "value");
    *found = false;
    if (cap)
        value[0] = '\0';
    void *map;
    size_t len;
    int rc = map_file(path, &map, &len);
    if (rc != FX_OK)
        return rc;
    static const unsigned char empty[1];
    const unsigned char *text = NULL;
    size_t n = 0;
    if ((rc = header_syntax(map ? map : empty, len, &text, &n)) == FX_OK)
        rc = peek_header(text, n, key, value, cap, found);
    if (map)
        munmap(map, len);
    return rc == FX_OK ? FX_OK : fx__error_context(rc, "%s", path);
}

size_t fx_safetensors_count(const fx_safetensors *f) { return f ? f->n : 0; }

const fx_tensor_view *fx_safetensors_tensor(const fx_safetensors *f, size_t i)
{
    return f && i < f->n ? &f->views[i] : NULL;
}

const fx_tensor_view *fx_safetensors_find(const fx_safetensors *f, const char *name)
{
    if (!f || !name)
        return NULL;
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->by_name[mid]->name);
        if (c == 0)
            return f->by_name[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

const char *fx_safetensors_metadata(const fx_safetensors *f, const char *key)
{
    if (!f || !key)
        return NULL;
    for (size_t i = 0; i < f->nmeta; i++)
        if (!strcmp(f->meta[i], key))
            return f->meta[i] + strlen(f->meta[i]) + 1; /* the value follows its key */
    return NULL;
}

const char *fx_safetensors_metadata_key(const fx_safetensors *f, size_t i)
{
    return f && i < f->nmeta ? f->meta[i] : NULL;
}

const void *fx_safetensors_buffer(const fx_safetensors *f, size_t *nbytes)
{
    if (nbytes)
        *nbytes = f ? f->buffer_len : 0;
    return f ? f->buffer : NULL;
}

size_t fx_safetensors_header_size(const fx_safetensors *f) { return f ? f->header_len : 0; }

void fx_safetensors_free(fx_safetensors *f)
{
    if (!f)
        return;
    fx__st_release(f);
    if (f->map)
        munmap(f->map, f->file_len);
    fx__free(f);
}

/* The former name, exported for the callers linked against it (deprecated). */
void fx_safetensors_close(fx_safetensors *f) { fx_safetensors_free(f); }
