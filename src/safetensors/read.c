/* Reading safetensors files: map, validate everything, then hand out views.
   The header is checked in three passes: bytes (length, UTF-8), a lexical pre-scan that
   enforces what jansson would accept but the format forbids (signs, fractions, exponents,
   integers past int64, deep nesting, long arrays), then jansson's strict parse with duplicate
   keys refused, then the structure and the data layout. */
#include "st_internal.h"

#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
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

/* jansson accepts -0 (as 0), negative numbers, reals and nesting up to 2048 levels; the
   format wants non-negative integers and three levels. Refusing those here keeps every
   number jansson sees a plain digit string that fits int64_t. */
static int prescan(const unsigned char *h, size_t n)
{
    int depth = 0;
    bool is_array[FX__ST_MAX_DEPTH + 1] = {false};
    size_t count[FX__ST_MAX_DEPTH + 1] = {0};
    size_t i = 0;
    while (i < n) {
        unsigned char c = h[i];
        if (c == '"') {
            /* Skip the string; jansson checks its escapes and characters. */
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

/* ---- pass 3 and 4: JSON and structure -------------------------------------------------------- */

typedef struct span {
    uint64_t begin, end;
    size_t idx; /* header order */
} span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static int cmp_view_name(const void *a, const void *b)
{
    const fx_tensor_view *x = *(const fx_tensor_view *const *)a, *y = *(const fx_tensor_view *const *)b;
    return strcmp(x->name, y->name);
}

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "unknown";
}

/* A non-negative JSON integer (the pre-scan already refused signs and overflow; this is the
   belt to its braces). */
static bool json_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

typedef struct entry {
    fx_dtype dtype;
    int ndim;
    int64_t shape[FX_MAX_DIMS];
    uint64_t begin, end, nbytes;
} entry;

/* One tensor entry: exactly dtype, shape, data_offsets; sizes checked for overflow. */
static int check_entry(const char *name, const json_t *v, entry *e)
{
    char q[FX__ST_QUOTE_CAP];
    if (!json_is_object(v))
        return fx__error(FX_EFORMAT, "tensor %s: entry is %s, not an object with dtype, shape and "
                         "data_offsets", fx__st_quote(q, name), json_kind(v));
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets")) {
            char qk[FX__ST_QUOTE_CAP];
            return fx__error(FX_EFORMAT, "tensor %s: unexpected key %s (entries have exactly dtype, "
                             "shape and data_offsets)", fx__st_quote(q, name), fx__st_quote(qk, key));
        }
    }
    const json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
                 *off = json_object_get(v, "data_offsets");
    const char *missing = !dt ? "dtype" : !sh ? "shape" : !off ? "data_offsets" : NULL;
    if (missing)
        return fx__error(FX_EFORMAT, "tensor %s: missing key '%s'", fx__st_quote(q, name), missing);

    if (!json_is_string(dt))
        return fx__error(FX_EFORMAT, "tensor %s: dtype is %s, not a string", fx__st_quote(q, name),
                         json_kind(dt));
    if (fx_dtype_from_name(&e->dtype, json_string_value(dt)) != FX_OK) {
        char qd[FX__ST_QUOTE_CAP];
        return fx__error(FX_EFORMAT, "tensor %s: unknown dtype %s (names are upper case, e.g. F32, "
                         "BF16, I64)", fx__st_quote(q, name), fx__st_quote(qd, json_string_value(dt)));
    }

    if (!json_is_array(sh))
        return fx__error(FX_EFORMAT, "tensor %s: shape is %s, not an array", fx__st_quote(q, name),
                         json_kind(sh));
    size_t nd = json_array_size(sh);
    if (nd > FX_MAX_DIMS)
        return fx__error(FX_EFORMAT, "tensor %s: shape has %zu dimensions, more than %d",
                         fx__st_quote(q, name), nd, FX_MAX_DIMS);
    e->ndim = (int)nd;
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t d = 0; d < nd; d++) {
        uint64_t dim;
        if (!json_u64(json_array_get(sh, d), &dim))
            return fx__error(FX_EFORMAT, "tensor %s: shape[%zu] is %s, not a non-negative integer",
                             fx__st_quote(q, name), d, json_kind(json_array_get(sh, d)));
        e->shape[d] = (int64_t)dim;
        /* Checked at each step: a product that wraps (possibly to 0) is an error, never an
           empty tensor. */
        if (!overflow && __builtin_mul_overflow(numel, dim, &numel))
            overflow = true;
    }
    uint64_t nbytes;
    if (overflow || numel > (uint64_t)INT64_MAX || __builtin_mul_overflow(numel, (uint64_t)fx_dtype_size(e->dtype), &nbytes))
        return fx__error(FX_EFORMAT, "tensor %s: shape product times %zu bytes overflows (the "
                         "size-overflow rule)", fx__st_quote(q, name), fx_dtype_size(e->dtype));

    if (!json_is_array(off) || json_array_size(off) != 2)
        return fx__error(FX_EFORMAT, "tensor %s: data_offsets is %s%s, not an array of 2 integers",
                         fx__st_quote(q, name), json_kind(off), json_is_array(off) ? " of another length" : "");
    if (!json_u64(json_array_get(off, 0), &e->begin) || !json_u64(json_array_get(off, 1), &e->end))
        return fx__error(FX_EFORMAT, "tensor %s: data_offsets holds something other than "
                         "non-negative integers", fx__st_quote(q, name));
    if (e->end < e->begin)
        return fx__error(FX_EFORMAT, "tensor %s: data_offsets [%llu, %llu) end before they begin",
                         fx__st_quote(q, name), (unsigned long long)e->begin, (unsigned long long)e->end);
    if (e->end - e->begin != nbytes)
        return fx__error(FX_EFORMAT, "tensor %s: data_offsets [%llu, %llu) hold %llu bytes but %s "
                         "shape needs %llu (the end - begin = byte size rule)", fx__st_quote(q, name),
                         (unsigned long long)e->begin, (unsigned long long)e->end,
                         (unsigned long long)(e->end - e->begin), fx_dtype_name(e->dtype),
                         (unsigned long long)nbytes);
    e->nbytes = nbytes;
    return FX_OK;
}

static int check_metadata(const json_t *v, size_t *count, size_t *bytes)
{
    if (!json_is_object(v))
        return fx__error(FX_EFORMAT, "__metadata__ is %s, not an object of strings", json_kind(v));
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val) {
        if (!json_is_string(val)) {
            char q[FX__ST_QUOTE_CAP];
            return fx__error(FX_EFORMAT, "__metadata__ value of %s is %s, not a string (metadata maps "
                             "strings to strings)", fx__st_quote(q, key), json_kind(val));
        }
        if (strlen(json_string_value(val)) != json_string_length(val)) {
            char q[FX__ST_QUOTE_CAP];
            return fx__error(FX_EFORMAT, "__metadata__ value of %s contains a NUL character",
                             fx__st_quote(q, key));
        }
        *bytes += strlen(key) + 1 + json_string_length(val) + 1;
        (*count)++;
    }
    return FX_OK;
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

static int parse_json(fx_safetensors *f, const char *hdr, size_t hlen)
{
    json_error_t jerr;
    json_t *root = json_loadb(hdr, hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        char q[FX__ST_QUOTE_CAP];
        return fx__error(FX_EFORMAT, "header is not strict JSON: %s at byte %d (line %d, column %d)",
                         fx__st_printable(q, jerr.text), jerr.position, jerr.line, jerr.column);
    }
    int rc = FX_OK;
    entry *ents = NULL;
    span *spans = NULL;
    if (!json_is_object(root)) {
        rc = fx__error(FX_EFORMAT, "header is %s, not a JSON object", json_kind(root));
        goto done;
    }

    /* Count and size everything first, so one allocation of each kind suffices. */
    size_t total = json_object_size(root), nmeta = 0, sbytes = 0;
    const json_t *meta = json_object_get(root, "__metadata__");
    if (meta && (rc = check_metadata(meta, &nmeta, &sbytes)) != FX_OK)
        goto done;
    size_t n = total - (meta != NULL);

    ents = fx__calloc(n ? n : 1, sizeof *ents);
    spans = fx__calloc(n ? n : 1, sizeof *spans);
    if (!ents || !spans) {
        rc = FX_ENOMEM;
        goto done;
    }
    const char *key;
    json_t *val;
    size_t k = 0;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__"))
            continue;
        if ((rc = check_entry(key, val, &ents[k])) != FX_OK)
            goto done;
        spans[k] = (span){ents[k].begin, ents[k].end, k};
        sbytes += strlen(key) + 1;
        k++;
    }

    /* The data layout: sorted by offset, tensors must tile [0, buffer length) exactly. */
    qsort(spans, n, sizeof *spans, cmp_span);
    uint64_t expect = 0;
    for (size_t i = 0; i < n; i++) {
        const span *s = &spans[i];
        if (s->begin != expect || s->end > f->buffer_len) {
            /* Name both sides of a gap or overlap: that is what a reader needs to see. */
            const char *nm = NULL, *prev = NULL;
            size_t j = 0;
            json_object_foreach(root, key, val) {
                if (!strcmp(key, "__metadata__"))
                    continue;
                if (j == s->idx)
                    nm = key;
                if (i > 0 && j == spans[i - 1].idx)
                    prev = key;
                j++;
            }
            char q[FX__ST_QUOTE_CAP], qp[FX__ST_QUOTE_CAP];
            if (s->begin > expect)
                rc = fx__error(FX_EFORMAT, "tensor %s: data_offsets [%llu, %llu) leave a hole: the "
                               "data before them ends at %llu (offsets must tile the buffer)",
                               fx__st_quote(q, nm), (unsigned long long)s->begin,
                               (unsigned long long)s->end, (unsigned long long)expect);
            else if (s->begin < expect)
                rc = fx__error(FX_EFORMAT, "tensor %s: data_offsets [%llu, %llu) overlap tensor %s, "
                               "which ends at %llu (offsets must not overlap)", fx__st_quote(q, nm),
                               (unsigned long long)s->begin, (unsigned long long)s->end,
                               fx__st_quote(qp, prev ? prev : "?"), (unsigned long long)expect);
            else
                rc = fx__error(FX_EFORMAT, "tensor %s: data_offsets [%llu, %llu) run past the end of "
                               "the data buffer (%zu bytes; the file is incomplete)", fx__st_quote(q, nm),
                               (unsigned long long)s->begin, (unsigned long long)s->end, f->buffer_len);
            goto done;
        }
        expect = s->end;
    }
    if (expect != f->buffer_len) {
        rc = fx__error(FX_EFORMAT, "the tensors cover %llu bytes of the data buffer but it holds %zu: "
                       "%zu trailing bytes belong to no tensor (the buffer must be covered exactly)",
                       (unsigned long long)expect, f->buffer_len, f->buffer_len - (size_t)expect);
        goto done;
    }

    /* Everything holds: build the views. */
    f->views = fx__calloc(n ? n : 1, sizeof *f->views);
    f->by_name = fx__calloc(n ? n : 1, sizeof *f->by_name);
    f->meta = fx__calloc(nmeta ? 2 * nmeta : 1, sizeof *f->meta);
    f->strings = fx__alloc(sbytes ? sbytes : 1);
    if (!f->views || !f->by_name || !f->meta || !f->strings) {
        rc = FX_ENOMEM;
        goto done;
    }
    char *s = f->strings;
    /* Header order -> names, then place each view at its rank in file order. */
    const char **names = (const char **)f->by_name; /* borrowed as scratch until filled below */
    k = 0;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__"))
            continue;
        size_t len = strlen(key) + 1;
        memcpy(s, key, len);
        names[k++] = s;
        s += len;
    }
    for (size_t i = 0; i < n; i++) {
        const entry *e = &ents[spans[i].idx];
        fx_tensor_view *v = &f->views[i];
        v->name = names[spans[i].idx];
        v->dtype = e->dtype;
        v->ndim = e->ndim;
        memcpy(v->shape, e->shape, sizeof v->shape);
        v->data = f->buffer + e->begin;
        v->nbytes = (size_t)e->nbytes;
    }
    for (size_t i = 0; i < n; i++)
        f->by_name[i] = &f->views[i];
    qsort(f->by_name, n, sizeof *f->by_name, cmp_view_name);
    f->n = n;
    if (meta) {
        size_t m = 0;
        json_object_foreach((json_t *)meta, key, val) {
            size_t kl = strlen(key) + 1, vl = json_string_length(val) + 1;
            memcpy(s, key, kl);
            f->meta[2 * m] = s;
            s += kl;
            memcpy(s, json_string_value(val), vl);
            f->meta[2 * m + 1] = s;
            s += vl;
            m++;
        }
    }
    f->nmeta = nmeta;

done:
    if (rc != FX_OK)
        fx__st_release(f);
    fx__free(ents);
    fx__free(spans);
    json_decref(root);
    return rc;
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
    return parse_json(f, (const char *)hdr, (size_t)n);
}

/* ---- the public API -------------------------------------------------------------------------- */

int fx_safetensors_open(fx_safetensors **out, const char *path)
{
    if (!out)
        return fx__error(FX_EINVAL, "out is NULL");
    if (!path)
        return fx__error(FX_EINVAL, "path is NULL");
    /* A FIFO or device at `path` is refused before anything could block on it. */
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
    size_t len = (size_t)st.st_size;
    void *map = NULL;
    if (len > 0) {
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return fx__error(FX_EIO, "%s: cannot map %zu bytes: %s", path, len, strerror(e));
        }
    }
    close(fd); /* the mapping keeps the file */
    fx_safetensors *f = fx__calloc(1, sizeof *f);
    if (!f) {
        if (map)
            munmap(map, len);
        return fx__error_context(FX_ENOMEM, "%s", path);
    }
    static const unsigned char empty[1];
    int rc = fx__st_parse(f, map ? (const unsigned char *)map : empty, len);
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
        if (!strcmp(f->meta[2 * i], key))
            return f->meta[2 * i + 1];
    return NULL;
}

const char *fx_safetensors_metadata_key(const fx_safetensors *f, size_t i)
{
    return f && i < f->nmeta ? f->meta[2 * i] : NULL;
}

const void *fx_safetensors_buffer(const fx_safetensors *f, size_t *nbytes)
{
    if (nbytes)
        *nbytes = f ? f->buffer_len : 0;
    return f ? f->buffer : NULL;
}

size_t fx_safetensors_header_size(const fx_safetensors *f) { return f ? f->header_len : 0; }

void fx_safetensors_close(fx_safetensors *f)
{
    if (!f)
        return;
    fx__st_release(f);
    if (f->map)
        munmap(f->map, f->file_len);
    fx__free(f);
}
