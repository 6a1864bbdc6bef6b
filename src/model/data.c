/* Training text: byte tokens with end-of-text between documents (or ids made elsewhere, with an
   optional per-token loss mask), a train/validation split, and batches drawn from a saveable
   counter-based generator. */
#include "model.h"

#include "core/file.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int64_t fx__utf8_invalid_at(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t len;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            return (int64_t)i;
        }
        if (i + len > n)
            return (int64_t)i;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return (int64_t)i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return (int64_t)i;
        i += len;
    }
    return -1;
}

/* A growable token array (uint32: vocabularies past 65536 ids). */
typedef struct fx__toks {
    uint32_t *p;
    int64_t n, cap;
    int64_t docs;
} fx__toks;

static int fx__toks_push(fx__toks *t, uint32_t v)
{
    if (t->n == t->cap) {
        int64_t cap = t->cap ? 2 * t->cap : 1 << 16;
        uint32_t *p = realloc(t->p, (size_t)cap * sizeof *p);
        if (!p)
            return fx__error(FX_ENOMEM, "cannot hold %lld tokens", (long long)cap);
        t->p = p, t->cap = cap;
    }
    t->p[t->n++] = v;
    if (v == FX__MODEL_EOT)
        t->docs++;
    return FX_OK;
}

/* Appends the tokens of text s[0..n): bytes, except that a line holding only "%" (the
   fortune separator) or the text <|endoftext|> becomes one end-of-text token. The text
   itself ends a document too. */
static int fx__tokenize(fx__toks *t, const unsigned char *s, size_t n)
{
    static const char eot[] = "<|endoftext|>";
    const size_t eot_len = sizeof eot - 1;
    size_t i = 0;
    int rc;
    while (i < n) {
        bool line_start = i == 0 || s[i - 1] == '\n';
        if (line_start && s[i] == '%') {
            size_t j = i + 1;
            if (j < n && s[j] == '\r')
                j++;
            if (j == n || s[j] == '\n') {
                if (t->n > 0 && t->p[t->n - 1] != FX__MODEL_EOT && (rc = fx__toks_push(t, FX__MODEL_EOT)))
                    return rc;
                i = j < n ? j + 1 : j;
                continue;
            }
        }
        if (s[i] == '<' && n - i >= eot_len && !memcmp(s + i, eot, eot_len)) {
            if ((rc = fx__toks_push(t, FX__MODEL_EOT)))
                return rc;
            i += eot_len;
            continue;
        }
        if ((rc = fx__toks_push(t, s[i])))
            return rc;
        i++;
    }
    if (t->n > 0 && t->p[t->n - 1] != FX__MODEL_EOT)
        return fx__toks_push(t, FX__MODEL_EOT);
    return FX_OK;
}

/* All of standard input ("--data -": a pipe makes sense there). */
static int fx__read_stdin(unsigned char **out, size_t *n)
{
    size_t cap = 1 << 16, len = 0;
    unsigned char *buf = malloc(cap);
    if (!buf)
        return fx__error(FX_ENOMEM, "cannot hold standard input");
    for (;;) {
        if (len == cap) {
            unsigned char *b = cap <= SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
            if (!b) {
                free(buf);
                return fx__error(FX_ENOMEM, "cannot hold standard input (more than %zu bytes)", len);
            }
            buf = b, cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, stdin);
        len += got;
        if (got == 0) {
            if (ferror(stdin)) {
                free(buf);
                return fx__error(FX_EIO, "cannot read standard input: %s", strerror(errno));
            }
            break;
        }
    }
    *out = buf;
    *n = len;
    return FX_OK;
}

static int fx__read_file(const char *path, unsigned char **out, size_t *n)
{
    if (!strcmp(path, "-"))
        return fx__read_stdin(out, n);
    bool not_regular;
    FILE *f = fx__fopen_regular(path, &not_regular); /* a FIFO would block the read forever */
    if (!f && not_regular)
        return fx__error(FX_EIO, "'%s' is not a regular file", path);
    if (!f)
        return fx__error(FX_EIO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fclose(f);
        return fx__error(FX_EIO, "cannot stat '%s': %s", path, strerror(errno));
    }
    size_t size = (size_t)st.st_size;
    unsigned char *buf = malloc(size ? size : 1);
    if (!buf) {
        fclose(f);
        return fx__error(FX_ENOMEM, "cannot hold '%s' (%zu bytes)", path, size);
    }
    size_t got = fread(buf, 1, size, f);
    int err = ferror(f);
    fclose(f);
    if (err || got != size) {
        free(buf);
        return fx__error(FX_EIO, "cannot read '%s'", path);
    }
    *out = buf;
    *n = size;
    return FX_OK;
}

static int fx__cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every fortune text file of dir (not the .dat indexes, not the .u8 links), in name order. */
static int fx__load_fortunes(fx__toks *t, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return fx__error(FX_EIO,
                         "the default corpus '%s' is missing (%s): install the Debian package 'fortunes' "
                         "(scripts/deps.sh does) or pass --data FILE with any UTF-8 text",
                         dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = FX_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        if (nm[0] == '.' || strchr(nm, '.'))
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, nm);
        struct stat st;
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **p = realloc(names, cap * sizeof *p);
            if (!p) {
                rc = fx__error(FX_ENOMEM, "listing '%s'", dir);
                break;
            }
            names = p;
        }
        if (!(names[n] = strdup(nm))) {
            rc = fx__error(FX_ENOMEM, "listing '%s'", dir);
            break;
        }
        n++;
    }
    closedir(d);
    if (rc == FX_OK && n == 0)
        rc = fx__error(FX_EIO,
                       "the default corpus '%s' holds no fortune files: install the Debian package 'fortunes' "
                       "or pass --data FILE",
                       dir);
    if (rc == FX_OK)
        qsort(names, n, sizeof *names, fx__cmp_str);
    for (size_t i = 0; i < n && rc == FX_OK; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unsigned char *buf;
        size_t len;
        if ((rc = fx__read_file(path, &buf, &len)) != FX_OK)
            break;
        rc = fx__tokenize(t, buf, len);
        free(buf);
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}

/* The train / validation split and the hash; takes t's tokens and loss (a mask of t->n bytes, 0
   or 1, or NULL). */
static int fx__data_finish(fx__model_data *d, fx__toks *t, uint8_t *loss, double val_frac, int64_t min_tokens)
{
    /* Each part needs at least one window of min_tokens. */
    int64_t n_val = (int64_t)((double)t->n * val_frac);
    if (n_val < min_tokens)
        n_val = min_tokens;
    if (t->n - n_val < min_tokens) {
        free(t->p);
        free(loss);
        t->p = NULL;
        return fx__error(FX_EINVAL,
                         "%s holds %lld tokens; training needs at least %lld (one window of %lld for training and "
                         "one for validation): give more text or a smaller --seq",
                         d->source, (long long)t->n, (long long)(2 * min_tokens), (long long)min_tokens);
    }
    if (loss) {
        /* A window's targets are its tokens 1..T: each part needs one that carries the loss
           (the training windows' targets cover 1 .. n_train - 1, the validation windows' of
           T = min_tokens - 1 the first (n_val - 1) / T * T after n_train). */
        const int64_t n_train = t->n - n_val, T = min_tokens > 1 ? min_tokens - 1 : 1;
        int64_t in_train = 0, in_val = 0;
        for (int64_t i = 1; i < n_train; i++)
            in_train += loss[i];
        for (int64_t i = n_train + 1; i <= n_train + (n_val - 1) / T * T; i++)
            in_val += loss[i];
        if (!in_train || !in_val) {
            free(t->p);
            free(loss);
            t->p = NULL;
            return fx__error(FX_EINVAL,
                             "%s: its %s part (%lld tokens) has no window with a target that carries the loss (an "
                             "assistant's token): give more conversations with assistant turns, or a smaller --seq",
                             d->source, in_train ? "validation" : "training",
                             (long long)(in_train ? n_val : t->n - n_val));
        }
    }
    d->tok = t->p;
    d->loss = loss;
    d->n = t->n;
    d->n_train = t->n - n_val;
    d->docs = t->docs;
    /* FNV-1a over each token's two low bytes (and its two high ones when set: byte-level
       data hashes as it did with 16-bit tokens, so older checkpoints resume). */
    uint64_t h = 0xcbf29ce484222325ull;
    for (int64_t i = 0; i < t->n; i++) {
        uint32_t v = t->p[i];
        h = (h ^ (v & 0xff)) * 0x100000001b3ull;
        h = (h ^ ((v >> 8) & 0xff)) * 0x100000001b3ull;
        if (v >> 16) {
            h = (h ^ ((v >> 16) & 0xff)) * 0x100000001b3ull;
            h = (h ^ (v >> 24)) * 0x100000001b3ull;
        }
    }
    /* the loss mask after the tokens (data without one hashes as it always did) */
    if (loss) {
        h = (h ^ 'L') * 0x100000001b3ull;
        for (int64_t i = 0; i < t->n; i++)
            h = (h ^ loss[i]) * 0x100000001b3ull;
    }
    d->hash = h;
    return FX_OK;
}

int fx__model_data_from_ids_loss(fx__model_data *d, const int32_t *ids, const uint8_t *loss, int64_t n, int32_t eot,
                                 const char *source, double val_frac, int64_t min_tokens)
{
    memset(d, 0, sizeof *d);
    if (!(val_frac > 0.0 && val_frac < 1.0))
        return fx__error(FX_EINVAL, "validation fraction %g is outside (0, 1)", val_frac);
    if (n < 0 || (n > 0 && !ids))
        return fx__error(FX_EINVAL, "fx__model_data_from_ids: %lld ids at %p", (long long)n, (const void *)ids);
    fx__toks t = {0};
    uint8_t *mask = NULL;
    if (n > 0 && !(t.p = malloc((size_t)n * sizeof *t.p)))
        return fx__error(FX_ENOMEM, "cannot hold %lld tokens", (long long)n);
    if (loss && !(mask = malloc(n > 0 ? (size_t)n : 1))) {
        free(t.p);
        return fx__error(FX_ENOMEM, "cannot hold the loss mask of %lld tokens", (long long)n);
    }
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0) {
            free(t.p);
            free(mask);
            return fx__error(FX_ERANGE, "token %lld = %d is negative", (long long)i, ids[i]);
        }
        t.p[i] = (uint32_t)ids[i];
        t.docs += ids[i] == eot;
        if (mask)
            mask[i] = loss[i] != 0;
    }
    t.n = t.cap = n;
    snprintf(d->source, sizeof d->source, "%s", source ? source : "tokens");
    return fx__data_finish(d, &t, mask, val_frac, min_tokens);
}

int fx__model_data_from_ids(fx__model_data *d, const int32_t *ids, int64_t n, int32_t eot, const char *source,
                          double val_frac, int64_t min_tokens)
{
    return fx__model_data_from_ids_loss(d, ids, NULL, n, eot, source, val_frac, min_tokens);
}

int fx__model_data_load(fx__model_data *d, const char *path, const char *default_dir, double val_frac,
                      int64_t min_tokens)
{
    memset(d, 0, sizeof *d);
    if (!(val_frac > 0.0 && val_frac < 1.0))
        return fx__error(FX_EINVAL, "validation fraction %g is outside (0, 1)", val_frac);
    fx__toks t = {0};
    int rc;
    if (path) {
        unsigned char *buf;
        size_t len;
        if ((rc = fx__read_file(path, &buf, &len)) != FX_OK)
            return rc;
        if (len == 0) {
            free(buf);
            return fx__error(FX_EINVAL, "data file '%s' is empty", path);
        }
        int64_t bad = fx__utf8_invalid_at(buf, len);
        if (bad >= 0) {
            unsigned byte = buf[bad];
            free(buf);
            return fx__error(FX_EFORMAT, "data file '%s' is not UTF-8 text: invalid byte 0x%02x at offset %lld", path,
                             byte, (long long)bad);
        }
        rc = fx__tokenize(&t, buf, len);
        free(buf);
        snprintf(d->source, sizeof d->source, "%s", path);
    } else {
        rc = fx__load_fortunes(&t, default_dir);
        snprintf(d->source, sizeof d->source, "%s", default_dir);
    }
    if (rc) {
        free(t.p);
        return rc;
    }
    /* Each part needs at least one window of min_tokens. */
    int64_t n_val = (int64_t)((double)t.n * val_frac);
    if (n_val < min_tokens)
        n_val = min_tokens;
    if (t.n - n_val < min_tokens) {
        free(t.p);
        return fx__error(FX_EINVAL,
                         "%s holds %lld token%s; training needs at least %lld (one window of %lld for training and "
                         "one for validation): give more text or a smaller --seq",
                         d->source, (long long)t.n, t.n == 1 ? "" : "s", (long long)(2 * min_tokens),
                         (long long)min_tokens);
    }
    return fx__data_finish(d, &t, NULL, val_frac, min_tokens);
}

void fx__model_data_free(fx__model_data *d)
{
    free(d->tok);
    free(d->loss);
    d->tok = NULL;
    d->loss = NULL;
}

/* The window of T+1 tokens at off: T inputs and their next tokens as targets (-100 where the
   mask says no loss). */
static void fx__window(const fx__model_data *d, int64_t off, int64_t T, int32_t *tokens, int32_t *targets)
{
    const uint32_t *src = d->tok + off;
    for (int64_t t = 0; t < T; t++) {
        tokens[t] = (int32_t)src[t];
        targets[t] = (int32_t)src[t + 1];
    }
    if (d->loss) {
        const uint8_t *loss = d->loss + off;
        for (int64_t t = 0; t < T; t++)
            if (!loss[t + 1])
                targets[t] = -100;
    }
}

/* Whether the window at off has a target that carries the loss. */
static bool fx__window_has_loss(const fx__model_data *d, int64_t off, int64_t T)
{
    return memchr(d->loss + off + 1, 1, (size_t)T) != NULL;
}

/* Rejections before the sampler walks to the next window with a target that carries the loss. */
enum { FX__DATA_TRIES = 64 };

void fx__model_data_batch(const fx__model_data *d, fx_rng *rng, int64_t B, int64_t T, int32_t *tokens, int32_t *targets)
{
    uint64_t range = (uint64_t)(d->n_train - T); /* offsets 0 .. n_train - T - 1 */
    for (int64_t b = 0; b < B; b++) {
        uint64_t r = ((uint64_t)fx_rng_u32(rng) << 32) | fx_rng_u32(rng);
        int64_t off = (int64_t)(r % range);
        /* With a loss mask, a window whose every target is ignored would give a batch no loss
           to take the mean of: such offsets are drawn again (uniform over the windows that
           have one), and after FX__DATA_TRIES the next such window is taken. */
        for (int tries = 1; d->loss && !fx__window_has_loss(d, off, T); tries++) {
            if (tries < FX__DATA_TRIES) {
                r = ((uint64_t)fx_rng_u32(rng) << 32) | fx_rng_u32(rng);
                off = (int64_t)(r % range);
                continue;
            }
            int64_t o = off;
            for (uint64_t k = 1; k < range && !fx__window_has_loss(d, o, T); k++)
                o = (int64_t)(((uint64_t)off + k) % range);
            off = o;
            break;
        }
        fx__window(d, off, T, tokens + b * T, targets + b * T);
    }
}

void fx__model_data_val_batch(const fx__model_data *d, int64_t i, int64_t B, int64_t T, int32_t *tokens, int32_t *targets)
{
    int64_t nval = d->n - d->n_train, windows = (nval - 1) / T;
    /* With a loss mask, the windows with a target that carries the loss, in order. */
    int64_t kept = windows;
    if (d->loss) {
        kept = 0;
        for (int64_t w = 0; w < windows; w++)
            kept += fx__window_has_loss(d, d->n_train + w * T, T);
    }
    for (int64_t b = 0; b < B; b++) {
        int64_t w = (i * B + b) % (kept ? kept : windows);
        if (d->loss && kept) {
            int64_t k = w;
            for (w = 0; w < windows; w++)
                if (fx__window_has_loss(d, d->n_train + w * T, T) && k-- == 0)
                    break;
        }
        fx__window(d, d->n_train + w * T, T, tokens + b * T, targets + b * T);
    }
}
