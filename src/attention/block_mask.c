/* Block masks: classification of every (q-block, kv-block) pair, visit lists in both
   directions, and bitmaps of the partial blocks. Layout: internal.h. */
#include "attention/internal.h"
#include "core/backend.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

enum { MAX_BLOCK = 4096, MAX_MASK_DEPTH = 32 };

/* ---- the size bound ----------------------------------------------------------------------- */

static _Atomic size_t max_bytes = FX_BLOCK_MASK_DEFAULT_MAX_BYTES;

void fx_block_mask_set_max_bytes(size_t bytes)
{
    atomic_store_explicit(&max_bytes, bytes ? bytes : FX_BLOCK_MASK_DEFAULT_MAX_BYTES, memory_order_relaxed);
}

size_t fx_block_mask_max_bytes(void)
{
    return atomic_load_explicit(&max_bytes, memory_order_relaxed);
}

/* a * b and a + b, SIZE_MAX when they overflow (then above any bound). */
static size_t sat_mul(size_t a, size_t b)
{
    size_t r;
    return fx__mul_size(a, b, &r) ? r : SIZE_MAX;
}

static size_t sat_add(size_t a, size_t b)
{
    size_t r;
    return fx__add_size(a, b, &r) ? r : SIZE_MAX;
}

/* "123456 bytes (0.1 MiB)" */
static const char *fmt_bytes(char *buf, size_t n, size_t bytes)
{
    if (bytes == SIZE_MAX)
        snprintf(buf, n, "more than %zu bytes", SIZE_MAX - 1);
    else
        snprintf(buf, n, "%zu bytes (%.1f MiB)", bytes, (double)bytes / (1 << 20));
    return buf;
}

/* Checks a built-in mask's ctx (recursively through and/or). */
static int check_mask(fx_mask_fn fn, const void *ctx, int64_t q_len, int64_t kv_len, int depth, const char *what)
{
    if (!fn)
        return fx__error(FX_EINVAL, "%s is NULL", what);
    if (depth > MAX_MASK_DEPTH)
        return fx__error(FX_EINVAL, "mask combinators nested deeper than %d", MAX_MASK_DEPTH);
    int kind = fx__mask_kind(fn);
    if (kind != FX__MASK_CAUSAL && kind != FX__MASK_CUSTOM && !ctx)
        return fx__error(FX_EINVAL, "%s: the built-in mask needs a ctx, got NULL", what);
    switch (kind) {
    case FX__MASK_SLIDING_WINDOW: {
        const fx_mask_sliding_window_ctx *c = ctx;
        if (c->window < 1)
            return fx__error(FX_EINVAL, "%s: sliding window = %lld must be >= 1", what, (long long)c->window);
        break;
    }
    case FX__MASK_PREFIX_LM: {
        const fx_mask_prefix_lm_ctx *c = ctx;
        if (!c->prefix_len || c->n < 1)
            return fx__error(FX_EINVAL, "%s: prefix_lm needs prefix_len != NULL and n >= 1 (n = %lld)", what,
                             (long long)c->n);
        break;
    }
    case FX__MASK_DOCUMENT: {
        const fx_mask_document_ctx *c = ctx;
        int64_t need = q_len > kv_len ? q_len : kv_len;
        if (!c->doc_ids)
            return fx__error(FX_EINVAL, "%s: document doc_ids is NULL", what);
        if (c->len < need)
            return fx__error(FX_EINVAL, "%s: document len = %lld must cover q_len and kv_len (%lld)", what,
                             (long long)c->len, (long long)need);
        if (c->batch_stride < 0)
            return fx__error(FX_EINVAL, "%s: document batch_stride = %lld must be >= 0", what,
                             (long long)c->batch_stride);
        break;
    }
    case FX__MASK_AND:
    case FX__MASK_OR: {
        const fx_mask_pair_ctx *c = ctx;
        int rc = check_mask(c->a, c->a_ctx, q_len, kv_len, depth + 1, "mask operand a");
        if (rc == FX_OK)
            rc = check_mask(c->b, c->b_ctx, q_len, kv_len, depth + 1, "mask operand b");
        return rc;
    }
    default:
        break;
    }
    return FX_OK;
}

typedef struct build {
    fx_mask_fn fn;
    const void *ctx;
    int kind;
    int64_t B, H, q_len, kv_len, bq, bk, nqb, nkb, words;
    size_t tables; /* bytes held whatever the mask: block classes, row and column offsets, ... */
} build;

/* Refuses a build whose bytes pass fx_block_mask_max_bytes(), before they are allocated:
   what (the part that passes it) and its bytes, besides the tables counted so far. */
static int over_limit(const build *s, const char *what, size_t bytes)
{
    size_t total = sat_add(s->tables, bytes), limit = fx_block_mask_max_bytes();
    if (total <= limit)
        return FX_OK;
    char need[64], lim[64];
    return fx__error(FX_EINVAL,
                     "block mask of B = %lld, H = %lld, %lld x %lld blocks of %lld x %lld (q_len = %lld, "
                     "kv_len = %lld): %s need %s, above the limit of %s (fx_block_mask_set_max_bytes)",
                     (long long)s->B, (long long)s->H, (long long)s->nqb, (long long)s->nkb, (long long)s->bq,
                     (long long)s->bk, (long long)s->q_len, (long long)s->kv_len, what,
                     fmt_bytes(need, sizeof need, total), fmt_bytes(lim, sizeof lim, limit));
}

/* Evaluates a block element by element until it has seen both a visible and a masked
   position (then it is partial). */
static int evaluate_block(const build *s, int64_t b, int64_t h, int64_t q0, int64_t q1, int64_t k0, int64_t k1)
{
    bool any_on = false, any_off = false;
    for (int64_t qi = q0; qi <= q1; qi++) {
        for (int64_t kj = k0; kj <= k1; kj++) {
            if (s->fn(b, h, qi, kj, s->ctx))
                any_on = true;
            else
                any_off = true;
            if (any_on && any_off)
                return FX__BLOCK_PARTIAL;
        }
    }
    return any_on ? FX__BLOCK_FULL : FX__BLOCK_EMPTY;
}

/* Fills a partial block's bitmap (zeroed by the caller). Causal and sliding-window masks set
   each row's visible range directly. */
static void fill_bits(const build *s, uint64_t *bits, int64_t b, int64_t h, int64_t qb, int64_t kb)
{
    int64_t q0 = qb * s->bq, k0 = kb * s->bk;
    int64_t nq = s->q_len - q0 < s->bq ? s->q_len - q0 : s->bq;
    int64_t nk = s->kv_len - k0 < s->bk ? s->kv_len - k0 : s->bk;
    for (int64_t i = 0; i < nq; i++) {
        uint64_t *row = bits + i * s->words;
        int64_t q = q0 + i;
        if (s->kind == FX__MASK_CAUSAL || s->kind == FX__MASK_SLIDING_WINDOW) {
            int64_t lo = 0, hi = q - k0; /* visible j in [lo, hi] */
            if (s->kind == FX__MASK_SLIDING_WINDOW) {
                /* hi - window + 1, compared first: the window may be as long as INT64_MAX. */
                const int64_t w = ((const fx_mask_sliding_window_ctx *)s->ctx)->window;
                lo = hi >= w ? hi - w + 1 : 0;
            }
            hi = hi >= nk ? nk - 1 : hi;
            for (int64_t j = lo; j <= hi; j++)
                row[j >> 6] |= (uint64_t)1 << (j & 63);
        } else {
            for (int64_t j = 0; j < nk; j++)
                if (s->fn(b, h, q, k0 + j, s->ctx))
                    row[j >> 6] |= (uint64_t)1 << (j & 63);
        }
    }
}

static void mask_free(fx_block_mask *m)
{
    if (!m)
        return;
    fx__free(m->kv_ptr);
    fx__free(m->kv_idx);
    fx__free(m->kv_bits);
    fx__free(m->q_ptr);
    fx__free(m->q_idx);
    fx__free(m->q_bits);
    fx__free(m->bits);
    fx__free(m);
}

/* From the class of every block (cls, [B*H*nqb*nkb], freed here) to the mask's lists: m is
   freed on failure, stored in *out on success. bits: the bitmaps of the partial blocks already
   packed in row order (block rows ascending, kv-blocks ascending within a row), owned by the
   mask from here on; NULL to fill them from s->fn. */
static int assemble(fx_block_mask **out, fx_block_mask *m, const build *s, uint8_t *cls, int64_t B, int64_t H,
                    uint64_t *bits)
{
    size_t nslots = (size_t)B * (size_t)H, nrows = nslots * (size_t)s->nqb, ncols = nslots * (size_t)s->nkb;
    int64_t q_len = s->q_len, kv_len = s->kv_len;
    m->B = B, m->H = H, m->q_len = q_len, m->kv_len = kv_len, m->block_q = s->bq, m->block_kv = s->bk;
    m->nqb = s->nqb, m->nkb = s->nkb, m->nslots = (int64_t)nslots, m->mask_kind = s->kind, m->bm_words = s->words;
    m->bits = bits;
    m->kv_ptr = fx__alloc((nrows + 1) * sizeof(int64_t));
    m->q_ptr = fx__calloc(ncols + 1, sizeof(int64_t));
    int64_t *part_ptr = fx__alloc((nrows + 1) * sizeof(int64_t)), nv = 0;
    if (!m->kv_ptr || !m->q_ptr || !part_ptr)
        goto nomem;
    int64_t np = 0;
    for (size_t r = 0; r < nrows; r++) {
        m->kv_ptr[r] = nv;
        part_ptr[r] = np;
        int64_t slot = (int64_t)r / s->nqb;
        for (int64_t kb = 0; kb < s->nkb; kb++) {
            int c = cls[r * s->nkb + kb];
            if (c != FX__BLOCK_EMPTY) {
                nv++;
                m->q_ptr[slot * s->nkb + kb + 1]++;
            }
            np += c == FX__BLOCK_PARTIAL;
        }
    }
    m->kv_ptr[nrows] = nv;
    part_ptr[nrows] = np;
    for (size_t c = 0; c < ncols; c++)
        m->q_ptr[c + 1] += m->q_ptr[c];
    m->n_visited = nv, m->n_partial = np, m->n_full = nv - np;

    size_t bm_floats = (size_t)s->bq * (size_t)s->words, nbits;
    if (!fx__mul_size((size_t)np, bm_floats, &nbits))
        goto nomem;
    size_t lists = sat_add(sat_mul((size_t)nv, 2 * (sizeof(int32_t) + sizeof(int64_t))),
                           sat_mul(nbits, sizeof(uint64_t)));
    char what[160];
    snprintf(what, sizeof what, "its tables with the lists of %lld visited blocks and the bitmaps of %lld partial ones",
             (long long)nv, (long long)np);
    int rc = over_limit(s, what, lists);
    if (rc != FX_OK) {
        fx__free(part_ptr);
        fx__free(cls);
        mask_free(m);
        return rc;
    }
    size_t nvs = nv ? (size_t)nv : 1;
    m->kv_idx = fx__alloc(nvs * sizeof(int32_t));
    m->kv_bits = fx__alloc(nvs * sizeof(int64_t));
    m->q_idx = fx__alloc(nvs * sizeof(int32_t));
    m->q_bits = fx__alloc(nvs * sizeof(int64_t));
    if (!bits)
        m->bits = np ? fx__calloc(nbits, sizeof(uint64_t)) : NULL;
    if (!m->kv_idx || !m->kv_bits || !m->q_idx || !m->q_bits || (np && !m->bits))
        goto nomem;

    /* Pass 2: visit lists and bitmaps, in parallel over rows. */
    const bool fill = !bits;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < (int64_t)nrows; r++) {
        int64_t slot = r / s->nqb, qb = r % s->nqb, b = slot / H, h = slot % H;
        int64_t e = m->kv_ptr[r], p = part_ptr[r];
        for (int64_t kb = 0; kb < s->nkb; kb++) {
            int c = cls[r * s->nkb + kb];
            if (c == FX__BLOCK_EMPTY)
                continue;
            m->kv_idx[e] = (int32_t)kb;
            m->kv_bits[e] = -1;
            if (c == FX__BLOCK_PARTIAL) {
                m->kv_bits[e] = p * (int64_t)bm_floats;
                if (fill)
                    fill_bits(s, m->bits + m->kv_bits[e], b, h, qb, kb);
                p++;
            }
            e++;
        }
    }
    /* Transposed lists: rows in ascending order append to their columns, so each column's
       q-blocks come out ascending. */
    int64_t *cursor = fx__alloc((ncols ? ncols : 1) * sizeof(int64_t));
    if (!cursor)
        goto nomem;
    memcpy(cursor, m->q_ptr, ncols * sizeof(int64_t));
    for (size_t r = 0; r < nrows; r++) {
        int64_t slot = (int64_t)r / s->nqb, qb = (int64_t)r % s->nqb;
        for (int64_t e = m->kv_ptr[r]; e < m->kv_ptr[r + 1]; e++) {
            int64_t c = slot * s->nkb + m->kv_idx[e];
            m->q_idx[cursor[c]] = (int32_t)qb;
            m->q_bits[cursor[c]] = m->kv_bits[e];
            cursor[c]++;
        }
    }
    fx__free(cursor);
    fx__free(part_ptr);
    fx__free(cls);
    m->bytes = sizeof *m + (nrows + 1 + ncols + 1) * sizeof(int64_t) +
               (size_t)nv * 2 * (sizeof(int32_t) + sizeof(int64_t)) + nbits * sizeof(uint64_t);
    *out = m;
    return FX_OK;

nomem:
    fx__free(part_ptr);
    fx__free(cls);
    nv = m->n_visited;
    mask_free(m);
    return fx__error(FX_ENOMEM, "block mask: out of memory (%lld visited blocks)", (long long)nv);
}

/* Checks what every creator shares (out, sizes, block sizes) and fills s's sizes; nblocks is
   the number of blocks of all slots. */
static int setup(build *s, fx_block_mask **out, int64_t B, int64_t H, int64_t q_len, int64_t kv_len, int64_t block_q,
                 int64_t block_kv, size_t *nblocks)
{
    if (!out)
        return fx__error(FX_EINVAL, "out is NULL");
    if (B < 1 || H < 1)
        return fx__error(FX_EINVAL, "B = %lld and H = %lld must be >= 1", (long long)B, (long long)H);
    if (q_len < 1 || kv_len < 1)
        return fx__error(FX_EINVAL, "q_len = %lld and kv_len = %lld must be >= 1", (long long)q_len,
                         (long long)kv_len);
    if (block_q < 0 || block_q > MAX_BLOCK || block_kv < 0 || block_kv > MAX_BLOCK)
        return fx__error(FX_EINVAL, "block_q = %lld and block_kv = %lld must be in [0, %d] (0: 128)",
                         (long long)block_q, (long long)block_kv, MAX_BLOCK);
    s->H = H, s->q_len = q_len, s->kv_len = kv_len;
    s->bq = block_q ? block_q : 128;
    s->bk = block_kv ? block_kv : 128;
    s->nqb = q_len / s->bq + (q_len % s->bq != 0); /* rounded up without overflow near INT64_MAX */
    s->nkb = kv_len / s->bk + (kv_len % s->bk != 0);
    s->words = (s->bk + 63) / 64;
    if (s->nqb > INT32_MAX || s->nkb > INT32_MAX)
        return fx__error(FX_EINVAL, "too many blocks (%lld x %lld)", (long long)s->nqb, (long long)s->nkb);
    size_t nslots, nrows, ncols;
    if (!fx__mul_size((size_t)B, (size_t)H, &nslots) || !fx__mul_size(nslots, (size_t)s->nqb, &nrows) ||
        !fx__mul_size(nslots, (size_t)s->nkb, &ncols) || !fx__mul_size(nrows, (size_t)s->nkb, nblocks))
        return fx__error(FX_EINVAL, "mask of %lld x %lld x %lld x %lld blocks is too large", (long long)B,
                         (long long)H, (long long)s->nqb, (long long)s->nkb);
    /* The mask, a class byte per block, the rows' offsets (kv_ptr and the partial blocks'),
       the columns' (q_ptr and the transposition's cursors). */
    s->B = B;
    s->tables = sat_add(sat_add(sizeof(fx_block_mask), *nblocks),
                        sat_add(sat_mul(sat_add(nrows, 1), 2 * sizeof(int64_t)),
                                sat_mul(sat_add(ncols, 1), 2 * sizeof(int64_t))));
    return over_limit(s, "its block tables", 0);
}

int fx_block_mask_create(fx_block_mask **out, fx_mask_fn mask, const void *ctx, int64_t B, int64_t H,
                         int64_t q_len, int64_t kv_len, int64_t block_q, int64_t block_kv)
{
    build s = {.fn = mask, .ctx = ctx, .kind = fx__mask_kind(mask)};
    size_t nblocks, nrows;
    int rc = setup(&s, out, B, H, q_len, kv_len, block_q, block_kv, &nblocks);
    if (rc == FX_OK)
        rc = check_mask(mask, ctx, q_len, kv_len, 0, "mask");
    if (rc != FX_OK)
        return rc;
    nrows = nblocks / (size_t)s.nkb;

    /* Pass 1: the class of every block, O(number of blocks) for built-ins. */
    uint8_t *cls = fx__alloc(nblocks);
    fx_block_mask *m = fx__calloc(1, sizeof *m);
    if (!cls || !m) {
        fx__free(cls);
        fx__free(m);
        return fx__error(FX_ENOMEM, "block mask: out of memory for %zu block classes", nblocks);
    }
    /* A document mask: the id range of every block, once per batch row, so each block is
       classified in O(1). */
    int64_t *doc = NULL, doc_rows = 0;
    if (s.kind == FX__MASK_DOCUMENT) {
        const fx_mask_document_ctx *dc = ctx;
        doc_rows = B > 1 && dc->batch_stride ? B : 1;
        size_t ranges = sat_mul(sat_mul((size_t)doc_rows, (size_t)(s.nqb + s.nkb)), 2 * sizeof(int64_t));
        if ((rc = over_limit(&s, "its tables with the documents' id ranges", ranges)) != FX_OK) {
            fx__free(cls);
            fx__free(m);
            return rc;
        }
        doc = fx__alloc((size_t)doc_rows * (size_t)(s.nqb + s.nkb) * 2 * sizeof(int64_t));
        if (!doc) {
            fx__free(cls);
            fx__free(m);
            return fx__error(FX_ENOMEM, "block mask: out of memory for document id ranges");
        }
        for (int64_t row = 0; row < doc_rows; row++) {
            const int64_t *id = dc->doc_ids + row * dc->batch_stride;
            int64_t *qr = doc + row * (s.nqb + s.nkb) * 2, *kr = qr + 2 * s.nqb;
            for (int side = 0; side < 2; side++) {
                int64_t blk = side ? s.bk : s.bq, len = side ? kv_len : q_len, *dst = side ? kr : qr;
                for (int64_t i0 = 0; i0 < len; i0 += blk) {
                    int64_t lo = id[i0], hi = id[i0];
                    for (int64_t i = i0 + 1; i < i0 + blk && i < len; i++) {
                        lo = id[i] < lo ? id[i] : lo;
                        hi = id[i] > hi ? id[i] : hi;
                    }
                    dst[2 * (i0 / blk)] = lo, dst[2 * (i0 / blk) + 1] = hi;
                }
            }
        }
    }
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < (int64_t)nrows; r++) {
        int64_t slot = r / s.nqb, qb = r % s.nqb, b = slot / H, h = slot % H;
        int64_t q0 = qb * s.bq, q1 = (q0 + s.bq < q_len ? q0 + s.bq : q_len) - 1;
        const int64_t *qr = doc ? doc + (doc_rows > 1 ? b : 0) * (s.nqb + s.nkb) * 2 : NULL;
        const int64_t *kr = qr ? qr + 2 * s.nqb : NULL;
        for (int64_t kb = 0; kb < s.nkb; kb++) {
            int64_t k0 = kb * s.bk, k1 = (k0 + s.bk < kv_len ? k0 + s.bk : kv_len) - 1;
            int c = doc ? fx__classify_document_ranges(qr[2 * qb], qr[2 * qb + 1], kr[2 * kb], kr[2 * kb + 1], q0, q1,
                                                       k0, k1)
                        : fx__mask_classify(mask, ctx, b, h, q0, q1, k0, k1);
            if (c < 0 || c == FX__BLOCK_PARTIAL)
                c = evaluate_block(&s, b, h, q0, q1, k0, k1);
            cls[r * s.nkb + kb] = (uint8_t)c;
        }
    }

    fx__free(doc);
    return assemble(out, m, &s, cls, B, H, NULL);
}

/* ---- masks from row bitmaps ------------------------------------------------------------ */

/* Bits [k0, k0 + nk) of a row (src, past its last word reads as 0) into dst[0 .. ceil(nk/64)). */
static void copy_bits(uint64_t *dst, const uint64_t *src, int64_t src_words, int64_t k0, int64_t nk)
{
    int64_t shift = k0 & 63;
    for (int64_t w = 0; w * 64 < nk; w++) {
        int64_t at = (k0 >> 6) + w;
        uint64_t x = at < src_words ? src[at] >> shift : 0;
        if (shift && at + 1 < src_words)
            x |= src[at + 1] << (64 - shift);
        if (nk - w * 64 < 64)
            x &= ((uint64_t)1 << (nk - w * 64)) - 1;
        dst[w] = x;
    }
}

/* Ones among bits [k0, k0 + nk) of a row. */
static int64_t count_bits(const uint64_t *row, int64_t k0, int64_t nk)
{
    int64_t n = 0;
    for (int64_t j = k0; j < k0 + nk;) {
        int64_t take = 64 - (j & 63) < k0 + nk - j ? 64 - (j & 63) : k0 + nk - j;
        uint64_t x = row[j >> 6] >> (j & 63);
        if (take < 64)
            x &= ((uint64_t)1 << take) - 1;
        n += __builtin_popcountll(x);
        j += take;
    }
    return n;
}

int fx_block_mask_create_rows(fx_block_mask **out, fx_mask_rows_fn fill, void *ctx, int64_t B, int64_t H,
                              int64_t q_len, int64_t kv_len, int64_t block_q, int64_t block_kv)
{
    build s = {.fn = NULL, .ctx = NULL, .kind = FX__MASK_CUSTOM};
    size_t nblocks;
    int rc = setup(&s, out, B, H, q_len, kv_len, block_q, block_kv, &nblocks);
    if (rc != FX_OK)
        return rc;
    if (!fill)
        return fx__error(FX_EINVAL, "fill is NULL");
    const int64_t rwords = kv_len / 64 + (kv_len % 64 != 0);
    size_t row_words, blk_words = (size_t)s.bq * (size_t)s.words;
    if (!fx__mul_size((size_t)s.bq, (size_t)rwords, &row_words))
        return fx__error(FX_EINVAL, "a block row of %lld x %lld positions is too large", (long long)s.bq,
                         (long long)kv_len);
    const size_t row_bytes = sat_mul(row_words, sizeof(uint64_t)), blk_bytes = blk_words * sizeof(uint64_t);
    if ((rc = over_limit(&s, "its tables and a block row of bits", row_bytes)) != FX_OK)
        return rc;
    uint8_t *cls = fx__alloc(nblocks);
    uint64_t *row = fx__alloc(row_words * sizeof(uint64_t));
    fx_block_mask *m = fx__calloc(1, sizeof *m);
    uint64_t *bits = NULL;
    size_t np = 0, cap = 0;
    if (!cls || !row || !m) {
        rc = fx__error(FX_ENOMEM, "block mask: out of memory for %zu block classes and a block row", nblocks);
        goto fail;
    }
    /* One block row at a time, in order, on the calling thread: fill need not be thread-safe,
       and only one row of bits is held besides the partial blocks' bitmaps. */
    for (int64_t r = 0; r < (int64_t)(nblocks / (size_t)s.nkb); r++) {
        int64_t slot = r / s.nqb, qb = r % s.nqb, b = slot / H, h = slot % H;
        int64_t q0 = qb * s.bq, nq = q_len - q0 < s.bq ? q_len - q0 : s.bq;
        memset(row, 0, (size_t)nq * (size_t)rwords * sizeof(uint64_t));
        rc = fill(row, rwords, b, h, q0, nq, ctx);
        if (rc != FX_OK) {
            rc = rc < 0 ? rc : FX_EINVAL;
            fx__error(rc, "block mask: the row callback failed at b = %lld, h = %lld, q0 = %lld", (long long)b,
                      (long long)h, (long long)q0);
            goto fail;
        }
        if (kv_len % 64) /* bits past kv_len are 0, whatever the callback left there */
            for (int64_t i = 0; i < nq; i++)
                row[i * rwords + rwords - 1] &= ((uint64_t)1 << (kv_len % 64)) - 1;
        for (int64_t kb = 0; kb < s.nkb; kb++) {
            int64_t k0 = kb * s.bk, nk = kv_len - k0 < s.bk ? kv_len - k0 : s.bk, on = 0;
            for (int64_t i = 0; i < nq; i++)
                on += count_bits(row + i * rwords, k0, nk);
            int c = on == 0 ? FX__BLOCK_EMPTY : on == nq * nk ? FX__BLOCK_FULL : FX__BLOCK_PARTIAL;
            cls[r * s.nkb + kb] = (uint8_t)c;
            if (c != FX__BLOCK_PARTIAL)
                continue;
            if (np == cap) { /* grow the bitmaps by half (at least 16 blocks), within the bound */
                char what[96];
                snprintf(what, sizeof what, "its tables, a block row and the bitmaps of %zu partial blocks", np + 1);
                if ((rc = over_limit(&s, what, sat_add(row_bytes, sat_mul(np + 1, blk_bytes)))) != FX_OK)
                    goto fail;
                size_t used = sat_add(s.tables, row_bytes), limit = fx_block_mask_max_bytes();
                size_t fit = limit > used ? (limit - used) / blk_bytes : 0;
                size_t ncap = cap + cap / 2 + 16, nbytes;
                ncap = ncap < fit ? ncap : fit > np ? fit : np + 1;
                uint64_t *nb = NULL;
                if (fx__mul_size(ncap, blk_words * sizeof(uint64_t), &nbytes))
                    nb = fx__calloc(nbytes, 1);
                if (!nb) {
                    rc = fx__error(FX_ENOMEM, "block mask: out of memory for %zu partial blocks", ncap);
                    goto fail;
                }
                if (np)
                    memcpy(nb, bits, np * blk_words * sizeof(uint64_t));
                fx__free(bits);
                bits = nb, cap = ncap;
            }
            uint64_t *dst = bits + np * blk_words;
            for (int64_t i = 0; i < nq; i++)
                copy_bits(dst + i * s.words, row + i * rwords, rwords, k0, nk);
            np++;
        }
    }
    fx__free(row);
    return assemble(out, m, &s, cls, B, H, bits);

fail:
    fx__free(bits);
    fx__free(row);
    fx__free(cls);
    fx__free(m);
    return rc;
}

void fx_block_mask_free(fx_block_mask *m)
{
    if (m)
        fx__backend_block_mask_release(m);
    mask_free(m);
}

double fx_block_mask_density(const fx_block_mask *m)
{
    if (!m)
        return 0.0;
    double all = (double)m->nslots * (double)m->nqb * (double)m->nkb;
    return all > 0 ? (double)m->n_visited / all : 0.0;
}

size_t fx_block_mask_bytes(const fx_block_mask *m)
{
    return m ? m->bytes : 0;
}
