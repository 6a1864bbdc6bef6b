/* FlexAttention forward: block masks, built-in and custom masks / score mods, every CPU path
   against a float64 reference, GQA, odd shapes, q_offset, determinism, guard zones, errors. */
#include "harness.h"

#include "attention/internal.h"

#include <sys/resource.h>

/* ---- float64 reference ------------------------------------------------------------------- */

typedef struct ref_case {
    fx_attention a;
    fx_mask_fn mask; /* evaluated directly, element by element */
    const void *mask_ctx;
    int64_t mask_B, mask_H; /* 1: broadcast (evaluated at b = 0 / h = 0) */
} ref_case;

/* out [B,Hq,Lq,Dv], lse [B,Hq,Lq] in float64. The score mod is applied to each single score
   (a 1x1 tile), so tiling in the kernels cannot hide a position mix-up. */
static void reference(const ref_case *c, const float *q, const float *k, const float *v, double *out, double *lse)
{
    const fx_attention *a = &c->a;
    double scale = a->scale != 0.0f ? a->scale : 1.0 / sqrt((double)a->D);
    double *s = fxt_alloc_f64((size_t)a->Lkv);
    int64_t G = a->Hq / a->Hkv;
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t h = 0; h < a->Hq; h++)
            for (int64_t r = 0; r < a->Lq; r++) {
                int64_t qi = a->q_offset + r, hk = h / G;
                const float *qr = q + ((b * a->Hq + h) * a->Lq + r) * a->D;
                double mx = -INFINITY;
                for (int64_t j = 0; j < a->Lkv; j++) {
                    const float *kr = k + ((b * a->Hkv + hk) * a->Lkv + j) * a->D;
                    double acc = 0;
                    for (int64_t d = 0; d < a->D; d++)
                        acc += (double)qr[d] * kr[d];
                    acc *= scale;
                    if (a->score_mod) {
                        float f = (float)acc;
                        a->score_mod(&f, 1, 1, 1, b, h, qi, j, a->score_ctx);
                        acc = f;
                    }
                    if (c->mask && !c->mask(c->mask_B == 1 ? 0 : b, c->mask_H == 1 ? 0 : h, qi, j, c->mask_ctx))
                        acc = -INFINITY;
                    s[j] = acc;
                    mx = acc > mx ? acc : mx;
                }
                double *o = out + ((b * a->Hq + h) * a->Lq + r) * a->Dv;
                for (int64_t d = 0; d < a->Dv; d++)
                    o[d] = 0;
                double sum = 0;
                if (mx > -INFINITY) {
                    for (int64_t j = 0; j < a->Lkv; j++) {
                        double p = exp(s[j] - mx);
                        sum += p;
                        const float *vr = v + ((b * a->Hkv + hk) * a->Lkv + j) * a->Dv;
                        for (int64_t d = 0; d < a->Dv; d++)
                            o[d] += p * vr[d];
                    }
                    for (int64_t d = 0; d < a->Dv; d++)
                        o[d] /= sum;
                }
                if (lse)
                    lse[(b * a->Hq + h) * a->Lq + r] = mx > -INFINITY ? mx + log(sum) : -INFINITY;
            }
    free(s);
}

static const fx_isa all_isas[] = {FX_ISA_SCALAR, FX_ISA_AVX2, FX_ISA_AVX512};

/* Runs the case on every path this CPU has, against the reference, with guard zones; and
   checks 1 vs 2 threads bitwise on the best path. Returns the number of paths run. */
static int check_case(const char *what, ref_case *c, float lo, float hi, uint64_t seed, double atol, double rtol)
{
    fx_attention *a = &c->a;
    size_t nq = (size_t)(a->B * a->Hq * a->Lq), nk = (size_t)(a->B * a->Hkv * a->Lkv);
    float *q = fxt_random(nq * a->D, lo, hi, seed);
    float *k = fxt_random(nk * a->D, lo, hi, seed + 1);
    float *v = fxt_random(nk * a->Dv, -1, 1, seed + 2);
    double *ro = fxt_alloc_f64(nq * a->Dv), *rl = fxt_alloc_f64(nq);
    reference(c, q, k, v, ro, rl);
    fx_isa best = fx_get_isa();
    int ran = 0;
    char name[160];
    for (size_t t = 0; t < sizeof all_isas / sizeof all_isas[0]; t++) {
        if (fx_set_isa(all_isas[t]) != FX_OK)
            continue;
        ran++;
        float *out = fxt_guarded(nq * a->Dv), *lse = fxt_guarded(nq);
        FXT_OK(fx_flex_attention(a, q, k, v, out, lse));
        snprintf(name, sizeof name, "%s [%s] out", what, fx_isa_name(all_isas[t]));
        fxt_close_f32(name, out, ro, nq * a->Dv, atol, rtol);
        snprintf(name, sizeof name, "%s [%s] lse", what, fx_isa_name(all_isas[t]));
        fxt_close_f32(name, lse, rl, nq, atol, rtol);
        fxt_guarded_free(name, lse);
        fxt_guarded_free(name, out);
    }
    fx_set_isa(best);
    /* Determinism: 1 vs 2 threads. */
    int threads = fx_get_num_threads();
    float *o1 = fxt_guarded(nq * a->Dv), *o2 = fxt_guarded(nq * a->Dv), *l1 = fxt_guarded(nq), *l2 = fxt_guarded(nq);
    fx_set_num_threads(1);
    FXT_OK(fx_flex_attention(a, q, k, v, o1, l1));
    fx_set_num_threads(2);
    FXT_OK(fx_flex_attention(a, q, k, v, o2, l2));
    fx_set_num_threads(threads);
    snprintf(name, sizeof name, "%s threads 1 vs 2", what);
    fxt_bitwise_f32(name, o1, o2, nq * a->Dv);
    fxt_bitwise_f32(name, l1, l2, nq);
    fxt_guarded_free(name, o1);
    fxt_guarded_free(name, o2);
    fxt_guarded_free(name, l1);
    fxt_guarded_free(name, l2);
    free(q), free(k), free(v), free(ro), free(rl);
    return ran;
}

static fx_attention shape(int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lkv, int64_t D, int64_t Dv)
{
    fx_attention a = fx_attention_defaults(B, Hq, Hkv, Lq, Lkv, D);
    a.Dv = Dv;
    return a;
}

/* ---- block mask structure ------------------------------------------------------------------ */

/* Every block of every slot against the mask evaluated element by element: empty blocks have
   nothing visible, full blocks everything, partial bitmaps match bit for bit (and are 0 past
   the ends); the transposed lists hold the same entries. Returns the visited count. */
static int64_t check_structure(const char *what, const fx_block_mask *m, fx_mask_fn fn, const void *ctx)
{
    int64_t visited = 0, bad = 0;
    for (int64_t slot = 0; slot < m->nslots && bad < 5; slot++) {
        int64_t b = slot / m->H, h = slot % m->H;
        for (int64_t qb = 0; qb < m->nqb; qb++) {
            int64_t r = fx__bm_row(m, slot, qb), e = m->kv_ptr[r];
            for (int64_t kb = 0; kb < m->nkb; kb++) {
                bool listed = e < m->kv_ptr[r + 1] && m->kv_idx[e] == kb;
                const uint64_t *bits = listed ? fx__bm_bits(m, m->kv_bits[e]) : NULL;
                int64_t on = 0, off = 0;
                for (int64_t i = 0; i < m->block_q; i++)
                    for (int64_t j = 0; j < m->block_kv; j++) {
                        int64_t qi = qb * m->block_q + i, kj = kb * m->block_kv + j;
                        bool inside = qi < m->q_len && kj < m->kv_len;
                        bool want = inside && fn(b, h, qi, kj, ctx);
                        if (inside)
                            want ? on++ : off++;
                        if (bits && fx__bm_test(bits, m->bm_words, i, j) != want) {
                            if (bad++ < 5)
                                FXT_FAIL("%s: slot %lld block (%lld, %lld) bit (%lld, %lld) is %d", what,
                                         (long long)slot, (long long)qb, (long long)kb, (long long)i, (long long)j, !want);
                        }
                    }
                bool ok = listed ? (bits ? on > 0 && off > 0 : off == 0 && on > 0) : on == 0;
                if (!ok && bad++ < 5)
                    FXT_FAIL("%s: slot %lld block (%lld, %lld): listed %d partial %d, %lld visible, %lld masked", what,
                             (long long)slot, (long long)qb, (long long)kb, listed, bits != NULL, (long long)on,
                             (long long)off);
                if (listed) {
                    /* The transposed column has this q-block with the same bitmap. */
                    int64_t c = fx__bm_col(m, slot, kb), found = 0;
                    for (int64_t t = m->q_ptr[c]; t < m->q_ptr[c + 1]; t++) {
                        if (t > m->q_ptr[c] && m->q_idx[t] <= m->q_idx[t - 1])
                            FXT_FAIL("%s: column %lld not ascending", what, (long long)c);
                        if (m->q_idx[t] == qb && m->q_bits[t] == m->kv_bits[e])
                            found++;
                    }
                    if (found != 1 && bad++ < 5)
                        FXT_FAIL("%s: block (%lld, %lld) found %lld times in its column", what, (long long)qb,
                                 (long long)kb, (long long)found);
                    e++, visited++;
                }
            }
            if (e != m->kv_ptr[r + 1] && bad++ < 5)
                FXT_FAIL("%s: row %lld has unexpected entries", what, (long long)r);
        }
    }
    FXT_EQ_INT(visited, m->n_visited);
    FXT_EQ_INT(m->q_ptr[m->nslots * m->nkb], m->n_visited);
    FXT_NEAR(fx_block_mask_density(m), (double)visited / ((double)m->nslots * m->nqb * m->nkb), 1e-12, 0);
    FXT_CHECK(fx_block_mask_bytes(m) > 0);
    return visited;
}

/* ---- custom mods ----------------------------------------------------------------------------- */

/* A scattered pattern (partial blocks everywhere), different per b and h, with the diagonal
   always visible. */
static bool mask_hash(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    (void)ctx;
    uint64_t x = (uint64_t)(q * 7919 + kv * 104729 + b * 31 + h * 17);
    x ^= x >> 13, x *= 0x9E3779B97F4A7C15ull, x ^= x >> 29;
    return q == kv || (x & 3) != 0;
}

/* Rows q % 5 == 2 see nothing; the rest are causal. */
static bool mask_some_rows_empty(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    (void)b, (void)h, (void)ctx;
    return q % 5 != 2 && kv <= q;
}

/* Queries before 70 see nothing: whole q-blocks with an empty visit list. */
static bool mask_late_rows(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    (void)b, (void)h, (void)ctx;
    return q >= 70 && kv <= q;
}

static bool mask_per_bh(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    (void)ctx;
    return kv <= q && (q - kv) < 20 + 30 * h + 50 * b;
}

/* Position-dependent, so a wrong q0 / kv0 / ld in the tile call shows. */
static void score_positions(float *s, int64_t ld, int64_t nq, int64_t nkv, int64_t b, int64_t h, int64_t q0,
                            int64_t kv0, const void *ctx)
{
    (void)ctx;
    for (int64_t i = 0; i < nq; i++)
        for (int64_t j = 0; j < nkv; j++)
            s[i * ld + j] = s[i * ld + j] * (1.0f + 0.1f * (float)h) + 0.01f * (float)(q0 + i) -
                            0.02f * (float)((kv0 + j) % 13) + 0.3f * (float)b;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_mask_causal_structure(void)
{
    fx_block_mask *m = NULL;
    FXT_OK(fx_block_mask_create(&m, fx_mask_causal, NULL, 1, 1, 300, 300, 64, 64));
    FXT_EQ_INT(m->nqb, 5);
    FXT_EQ_INT(m->nkb, 5);
    /* Row qb visits kv-blocks 0 .. qb; the diagonal is partial, the rest full. */
    for (int64_t qb = 0; qb < 5; qb++) {
        FXT_EQ_INT(m->kv_ptr[qb + 1] - m->kv_ptr[qb], qb + 1);
        for (int64_t e = m->kv_ptr[qb]; e < m->kv_ptr[qb + 1]; e++) {
            FXT_EQ_INT(m->kv_idx[e], e - m->kv_ptr[qb]);
            FXT_EQ_INT(m->kv_bits[e] >= 0, m->kv_idx[e] == qb);
        }
    }
    FXT_EQ_INT(m->n_partial, 5);
    FXT_EQ_INT(m->n_full, 10);
    FXT_NEAR(fx_block_mask_density(m), 15.0 / 25.0, 1e-12, 0);
    check_structure("causal", m, fx_mask_causal, NULL);
    fx_block_mask_free(m);
    /* Blocks not a multiple of 64 bits, lengths not a multiple of blocks, q_len != kv_len. */
    FXT_OK(fx_block_mask_create(&m, fx_mask_causal, NULL, 1, 1, 130, 211, 48, 80));
    check_structure("causal 48x80", m, fx_mask_causal, NULL);
    fx_block_mask_free(m);
}

static void test_mask_builtin_structure(void)
{
    fx_block_mask *m = NULL;
    fx_mask_sliding_window_ctx sw = {.window = 37};
    FXT_OK(fx_block_mask_create(&m, fx_mask_sliding_window, &sw, 1, 1, 333, 333, 32, 16));
    check_structure("sliding", m, fx_mask_sliding_window, &sw);
    fx_block_mask_free(m);
    /* A window longer than any distance is causal, also in blocks whose first keys come
       after some of their queries. */
    fx_mask_sliding_window_ctx sw_all = {.window = INT64_MAX};
    FXT_OK(fx_block_mask_create(&m, fx_mask_sliding_window, &sw_all, 1, 1, 64, 64, 32, 8));
    check_structure("sliding, window INT64_MAX", m, fx_mask_causal, NULL);
    fx_block_mask_free(m);

    int64_t prefix[2] = {50, 130};
    fx_mask_prefix_lm_ctx pl = {.prefix_len = prefix, .n = 2};
    FXT_OK(fx_block_mask_create(&m, fx_mask_prefix_lm, &pl, 2, 1, 200, 200, 32, 32));
    check_structure("prefix_lm", m, fx_mask_prefix_lm, &pl);
    fx_block_mask_free(m);

    /* Documents: sorted ids in batch 0, unsorted (a repeated id) in batch 1. */
    int64_t ids[2 * 180];
    for (int i = 0; i < 180; i++) {
        ids[i] = i / 45;
        ids[180 + i] = (i / 30) % 3;
    }
    fx_mask_document_ctx doc = {.doc_ids = ids, .len = 180, .batch_stride = 180};
    FXT_OK(fx_block_mask_create(&m, fx_mask_document, &doc, 2, 1, 180, 180, 32, 32));
    check_structure("document", m, fx_mask_document, &doc);
    fx_block_mask_free(m);

    /* Id ranges that overlap without a common id: block (1, 0) is empty although the
       analytic check cannot tell. */
    int64_t ids2[96];
    for (int i = 0; i < 96; i++)
        ids2[i] = i < 32 ? 1 : (i % 2 ? 0 : 2);
    fx_mask_document_ctx doc2 = {.doc_ids = ids2, .len = 96};
    FXT_OK(fx_block_mask_create(&m, fx_mask_document, &doc2, 1, 1, 96, 96, 32, 32));
    check_structure("document overlapping ids", m, fx_mask_document, &doc2);
    FXT_EQ_INT(m->kv_ptr[2] - m->kv_ptr[1], 1); /* only the diagonal */
    fx_block_mask_free(m);

    fx_mask_pair_ctx and_ctx = {fx_mask_sliding_window, &sw, mask_hash, NULL};
    FXT_OK(fx_block_mask_create(&m, fx_mask_and, &and_ctx, 1, 2, 150, 150, 32, 32));
    check_structure("sliding and custom", m, fx_mask_and, &and_ctx);
    fx_block_mask_free(m);

    fx_mask_pair_ctx or_ctx = {fx_mask_sliding_window, &sw, fx_mask_prefix_lm, &pl};
    FXT_OK(fx_block_mask_create(&m, fx_mask_or, &or_ctx, 2, 1, 200, 200, 32, 64));
    check_structure("sliding or prefix", m, fx_mask_or, &or_ctx);
    fx_block_mask_free(m);

    FXT_OK(fx_block_mask_create(&m, mask_hash, NULL, 1, 2, 130, 230, 50, 100));
    check_structure("custom 50x100 blocks", m, mask_hash, NULL);
    fx_block_mask_free(m);

    FXT_OK(fx_block_mask_create(&m, mask_per_bh, NULL, 2, 3, 160, 170, 0, 0));
    FXT_EQ_INT(m->block_q, 128);
    check_structure("custom per (b, h)", m, mask_per_bh, NULL);
    fx_block_mask_free(m);
}

/* A long sliding window is classified analytically: evaluating it element by element would
   take minutes, and the visited count is known in closed form. */
static void test_mask_analytic(void)
{
    const int64_t L = 1 << 18, W = 256, blk = 128;
    fx_mask_sliding_window_ctx sw = {.window = W};
    fx_block_mask *m = NULL;
    FXT_OK(fx_block_mask_create(&m, fx_mask_sliding_window, &sw, 1, 1, L, L, blk, blk));
    if (!m)
        return;
    /* Row qb sees blocks qb-2 .. qb (W = 2 blocks: keys back to q - 255). */
    int64_t nb = L / blk, expect = 3 * nb - 3;
    FXT_EQ_INT(m->n_visited, expect);
    FXT_NEAR(fx_block_mask_density(m), (double)expect / ((double)nb * nb), 1e-12, 0);
    fx_block_mask_free(m);
}

/* ---- masks from row bitmaps ------------------------------------------------------------- */

typedef struct rows_ctx {
    fx_mask_fn fn;
    int64_t kv_len;
    int64_t calls, next_row; /* calls made; the q0 expected next within a slot */
    int64_t fail_at;         /* call number that returns fail_rc (-1: never) */
    int fail_rc;
} rows_ctx;

/* Evaluates fn element by element into the rows, and sets every bit past kv_len in the last
   word (the builder must clear them). */
static int fill_rows(uint64_t *bits, int64_t words, int64_t b, int64_t h, int64_t q0, int64_t nq, void *ctx)
{
    rows_ctx *c = ctx;
    if (c->calls++ == c->fail_at)
        return c->fail_rc;
    if (words != (c->kv_len + 63) / 64 || (q0 != c->next_row && q0 != 0))
        return FX_EINVAL;
    c->next_row = q0 + nq;
    for (int64_t i = 0; i < nq; i++) {
        for (int64_t j = 0; j < c->kv_len; j++)
            if (bits[i * words + j / 64] & ((uint64_t)1 << (j % 64)))
                return FX_EINVAL; /* rows must arrive zeroed */
        for (int64_t j = 0; j < c->kv_len; j++)
            if (c->fn(b, h, q0 + i, j, NULL))
                bits[i * words + j / 64] |= (uint64_t)1 << (j % 64);
        for (int64_t j = c->kv_len; j < words * 64; j++)
            bits[i * words + j / 64] |= (uint64_t)1 << (j % 64);
    }
    return FX_OK;
}

/* Masks from rows match the element-by-element structure and give bitwise the output of the
   same mask built by fx_block_mask_create, for block sizes that are and are not whole words. */
static void test_mask_rows(void)
{
    static const struct {
        fx_mask_fn fn;
        int64_t B, H, q_len, kv_len, bq, bk;
    } cases[] = {
        {mask_hash, 1, 2, 130, 230, 50, 100}, {mask_hash, 2, 1, 40, 45, 7, 8},
        {mask_per_bh, 2, 2, 200, 200, 64, 64}, {mask_late_rows, 1, 1, 100, 100, 32, 32},
        {mask_some_rows_empty, 1, 1, 129, 300, 128, 128},
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        char what[64];
        snprintf(what, sizeof what, "rows case %zu", t);
        rows_ctx rc = {.fn = cases[t].fn, .kv_len = cases[t].kv_len, .fail_at = -1};
        fx_block_mask *m = NULL, *ref = NULL;
        FXT_OK(fx_block_mask_create_rows(&m, fill_rows, &rc, cases[t].B, cases[t].H, cases[t].q_len, cases[t].kv_len,
                                         cases[t].bq, cases[t].bk));
        FXT_OK(fx_block_mask_create(&ref, cases[t].fn, NULL, cases[t].B, cases[t].H, cases[t].q_len,
                                    cases[t].kv_len, cases[t].bq, cases[t].bk));
        if (!m || !ref) {
            fx_block_mask_free(m);
            fx_block_mask_free(ref);
            continue;
        }
        FXT_EQ_INT(rc.calls, cases[t].B * cases[t].H * ((cases[t].q_len + cases[t].bq - 1) / cases[t].bq));
        check_structure(what, m, cases[t].fn, NULL);
        FXT_EQ_INT(m->n_visited, ref->n_visited);
        FXT_EQ_INT(m->n_partial, ref->n_partial);
        FXT_CHECK(fx_block_mask_bytes(m) == fx_block_mask_bytes(ref));

        fx_attention a = shape(cases[t].B, cases[t].H == 1 ? 2 : cases[t].H, 1, cases[t].q_len, cases[t].kv_len, 16, 16);
        size_t nq = (size_t)(a.B * a.Hq * a.Lq), nk = (size_t)(a.B * a.Hkv * a.Lkv);
        float *q = fxt_random(nq * 16, -1, 1, 20 + t), *k = fxt_random(nk * 16, -1, 1, 30 + t);
        float *v = fxt_random(nk * 16, -1, 1, 40 + t);
        float *o1 = fxt_guarded(nq * 16), *o2 = fxt_guarded(nq * 16), *l1 = fxt_guarded(nq), *l2 = fxt_guarded(nq);
        a.mask = m;
        FXT_OK(fx_flex_attention(&a, q, k, v, o1, l1));
        a.mask = ref;
        FXT_OK(fx_flex_attention(&a, q, k, v, o2, l2));
        FXT_CHECK(memcmp(o1, o2, nq * 16 * sizeof(float)) == 0);
        FXT_CHECK(memcmp(l1, l2, nq * sizeof(float)) == 0);
        free(q), free(k), free(v);
        fxt_guarded_free("out", o1), fxt_guarded_free("out", o2);
        fxt_guarded_free("lse", l1), fxt_guarded_free("lse", l2);
        fx_block_mask_free(m);
        fx_block_mask_free(ref);
    }

    /* Errors: the callback's status is passed on (a positive one becomes FX_EINVAL), nothing
       leaks, *out stays NULL; sizes are checked before the first call. */
    fx_block_mask *m = NULL;
    rows_ctx fail = {.fn = mask_hash, .kv_len = 300, .fail_at = 5, .fail_rc = FX_ERANGE};
    FXT_STATUS(fx_block_mask_create_rows(&m, fill_rows, &fail, 1, 2, 300, 300, 16, 16), FX_ERANGE, "q0 = ");
    FXT_CHECK(m == NULL && fail.calls == 6);
    fail = (rows_ctx){.fn = mask_hash, .kv_len = 300, .fail_at = 0, .fail_rc = 7};
    FXT_STATUS(fx_block_mask_create_rows(&m, fill_rows, &fail, 1, 1, 300, 300, 0, 0), FX_EINVAL, "b = 0");
    FXT_STATUS(fx_block_mask_create_rows(&m, NULL, NULL, 1, 1, 8, 8, 0, 0), FX_EINVAL, "fill");
    FXT_STATUS(fx_block_mask_create_rows(NULL, fill_rows, &fail, 1, 1, 8, 8, 0, 0), FX_EINVAL, "out");
    fail.calls = 0;
    FXT_STATUS(fx_block_mask_create_rows(&m, fill_rows, &fail, 1, 1, 8, 8, 5000, 0), FX_EINVAL, "block_q");
    FXT_STATUS(fx_block_mask_create_rows(&m, fill_rows, &fail, 0, 1, 8, 8, 0, 0), FX_EINVAL, "B = 0");
    FXT_CHECK(m == NULL && fail.calls == 0);
}

static void test_dense(void)
{
    ref_case c = {.a = shape(2, 2, 2, 70, 150, 64, 64)};
    FXT_CHECK(check_case("dense", &c, -1, 1, 1, 2e-5, 2e-4) >= 1);
    ref_case c2 = {.a = shape(1, 3, 1, 257, 131, 40, 72)}; /* D = 40, Dv != D, GQA 3 */
    c2.a.scale = 0.3f;
    check_case("dense odd", &c2, -1, 1, 2, 2e-5, 2e-4);
}

/* The mask covers extra_kv keys more than the call uses. */
static void run_masked_ext(const char *what, fx_mask_fn fn, const void *ctx, int64_t mB, int64_t mH, fx_attention a,
                           int64_t bq, int64_t bk, uint64_t seed, int64_t extra_kv)
{
    fx_block_mask *m = NULL;
    FXT_OK(fx_block_mask_create(&m, fn, ctx, mB, mH, a.q_offset + a.Lq + 3, a.Lkv + extra_kv, bq, bk));
    if (!m)
        return;
    ref_case c = {.a = a, .mask = fn, .mask_ctx = ctx, .mask_B = mB, .mask_H = mH};
    c.a.mask = m;
    check_case(what, &c, -1, 1, seed, 2e-5, 2e-4);
    fx_block_mask_free(m);
}

static void run_masked(const char *what, fx_mask_fn fn, const void *ctx, int64_t mB, int64_t mH, fx_attention a,
                       int64_t bq, int64_t bk, uint64_t seed)
{
    run_masked_ext(what, fn, ctx, mB, mH, a, bq, bk, seed, 0);
}

static void test_builtin_masks(void)
{
    fx_mask_sliding_window_ctx sw = {.window = 45};
    int64_t prefix[2] = {33, 100};
    fx_mask_prefix_lm_ctx pl = {.prefix_len = prefix, .n = 2};
    int64_t ids[2 * 200];
    for (int i = 0; i < 200; i++) {
        ids[i] = i / 37;
        ids[200 + i] = (i / 23) % 4;
    }
    fx_mask_document_ctx doc = {.doc_ids = ids, .len = 200, .batch_stride = 200};
    fx_mask_pair_ctx both = {fx_mask_sliding_window, &sw, fx_mask_document, &doc};
    fx_mask_pair_ctx either = {fx_mask_prefix_lm, &pl, mask_hash, NULL};
    run_masked("causal", fx_mask_causal, NULL, 1, 1, shape(1, 2, 1, 190, 190, 40, 24), 32, 64, 3);
    run_masked("sliding", fx_mask_sliding_window, &sw, 1, 1, shape(2, 4, 2, 150, 150, 64, 64), 32, 32, 4);
    run_masked("prefix_lm", fx_mask_prefix_lm, &pl, 2, 1, shape(2, 2, 2, 120, 120, 32, 32), 32, 32, 5);
    run_masked("document", fx_mask_document, &doc, 2, 1, shape(2, 2, 1, 190, 190, 48, 48), 64, 48, 6);
    run_masked("and", fx_mask_and, &both, 2, 1, shape(2, 2, 2, 190, 190, 32, 32), 32, 32, 7);
    run_masked("or", fx_mask_or, &either, 2, 2, shape(2, 2, 2, 100, 100, 32, 32), 32, 32, 8);
}

static void test_custom_masks(void)
{
    run_masked("hash", mask_hash, NULL, 2, 4, shape(2, 4, 2, 100, 110, 40, 40), 32, 48, 9);
    run_masked("per (b,h)", mask_per_bh, NULL, 2, 2, shape(2, 2, 1, 200, 200, 32, 16), 64, 64, 10);
    /* Block sizes that are not whole vectors: 100 keys (two bitmap words), 8 keys (less than
       one AVX-512 vector), 50 and 7 queries. */
    run_masked("hash 50x100 blocks", mask_hash, NULL, 1, 2, shape(1, 2, 2, 130, 230, 24, 40), 50, 100, 12);
    run_masked("hash 7x8 blocks", mask_hash, NULL, 1, 1, shape(1, 2, 1, 40, 45, 16, 8), 7, 8, 13);
    /* Broadcast over B and H with B = 2, Hq = 4. */
    run_masked("hash broadcast", mask_hash, NULL, 1, 1, shape(2, 4, 2, 90, 90, 32, 32), 32, 32, 11);
}

static void test_gqa(void)
{
    static const int64_t ratios[] = {1, 2, 4, 8};
    fx_mask_sliding_window_ctx sw = {.window = 30};
    char what[64];
    for (size_t i = 0; i < 4; i++) {
        int64_t G = ratios[i];
        snprintf(what, sizeof what, "gqa %lld shared", (long long)G);
        run_masked(what, fx_mask_sliding_window, &sw, 1, 1, shape(1, 8, 8 / G, 100, 100, 32, 32), 32, 32, 20 + i);
        snprintf(what, sizeof what, "gqa %lld per head", (long long)G);
        run_masked(what, mask_per_bh, NULL, 1, 8, shape(1, 8, 8 / G, 70, 70, 16, 16), 32, 32, 30 + i);
        snprintf(what, sizeof what, "gqa %lld dense", (long long)G);
        ref_case c = {.a = shape(1, 8, 8 / G, 40, 60, 32, 48)};
        check_case(what, &c, -1, 1, 40 + i, 2e-5, 2e-4);
    }
}

static void test_score_mods(void)
{
    float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    fx_score_alibi_ctx al = {slopes};
    fx_score_softcap_ctx sc = {.cap = 2.0f};
    float table[4 * 41];
    for (int i = 0; i < 4 * 41; i++)
        table[i] = 0.05f * (float)((i * 7) % 23) - 0.5f;
    fx_score_rel_bias_ctx rb_head = {.table = table, .size = 41, .zero = 20, .heads = 4};
    fx_score_rel_bias_ctx rb_shared = {.table = table, .size = 30, .zero = 0, .heads = 1};
    struct {
        const char *name;
        fx_score_fn fn;
        const void *ctx;
    } mods[] = {
        {"alibi", fx_score_alibi, &al},           {"softcap", fx_score_softcap, &sc},
        {"rel_bias per head", fx_score_rel_bias, &rb_head}, {"rel_bias shared", fx_score_rel_bias, &rb_shared},
        {"custom positions", score_positions, NULL},
    };
    fx_mask_sliding_window_ctx sw = {.window = 60};
    char what[96];
    for (size_t i = 0; i < sizeof mods / sizeof mods[0]; i++) {
        fx_attention a = shape(2, 4, 2, 100, 100, 32, 40);
        a.score_mod = mods[i].fn, a.score_ctx = mods[i].ctx;
        ref_case c = {.a = a};
        snprintf(what, sizeof what, "%s dense", mods[i].name);
        check_case(what, &c, -2, 2, 50 + i, 3e-5, 3e-4);
        snprintf(what, sizeof what, "%s causal", mods[i].name);
        run_masked(what, fx_mask_causal, NULL, 1, 1, a, 32, 48, 60 + i);
        snprintf(what, sizeof what, "%s sliding, q_offset", mods[i].name);
        a.q_offset = 37, a.Lq = 50, a.Lkv = 90;
        run_masked(what, fx_mask_sliding_window, &sw, 1, 1, a, 32, 32, 70 + i);
    }
    /* Softcap across its range: scores from tiny to far beyond the cap. */
    fx_score_softcap_ctx sc2 = {.cap = 5.0f};
    fx_attention a = shape(1, 2, 2, 64, 64, 16, 16);
    a.score_mod = fx_score_softcap, a.score_ctx = &sc2, a.scale = 1.0f;
    ref_case c = {.a = a};
    check_case("softcap wide", &c, -3, 3, 80, 3e-5, 3e-4);
}

static void test_fully_masked_rows(void)
{
    run_masked("empty rows", mask_some_rows_empty, NULL, 1, 1, shape(1, 2, 1, 100, 100, 32, 32), 32, 32, 90);
    run_masked("empty q-blocks", mask_late_rows, NULL, 1, 1, shape(2, 2, 2, 150, 150, 32, 32), 32, 32, 91);
    /* Explicitly: out 0 and lse -inf, no NaN. */
    fx_block_mask *m = NULL;
    FXT_OK(fx_block_mask_create(&m, mask_late_rows, NULL, 1, 1, 100, 100, 32, 32));
    fx_attention a = shape(1, 1, 1, 100, 100, 16, 16);
    a.mask = m;
    float *q = fxt_random(1600, -1, 1, 1), *k = fxt_random(1600, -1, 1, 2), *v = fxt_random(1600, -1, 1, 3);
    float *out = fxt_guarded(1600), *lse = fxt_guarded(100);
    FXT_OK(fx_flex_attention(&a, q, k, v, out, lse));
    for (int i = 0; i < 100; i++) {
        if (i < 70) {
            FXT_CHECK(isinf(lse[i]) && lse[i] < 0);
            for (int d = 0; d < 16; d++)
                FXT_CHECK(out[i * 16 + d] == 0.0f && !signbit(out[i * 16 + d]));
        } else {
            FXT_CHECK(isfinite(lse[i]));
        }
    }
    fxt_guarded_free("out", out);
    fxt_guarded_free("lse", lse);
    free(q), free(k), free(v);
    fx_block_mask_free(m);
}

/* NaN in, NaN out: a row that meets a NaN score has lse = NaN (as in PyTorch), never -inf,
   which means "fully masked"; rows that never see the NaN are untouched, fully masked rows
   stay -inf, and the backward turns NaN rows into NaN gradients instead of zeros. Every path:
   the prefill kernels of each ISA, the split-KV decode, and the backward. */
static void nan_rows(const char *what, const fx_attention *a, const float *q, const float *k, const float *v,
                     const bool *want_nan, const bool *want_ninf)
{
    size_t nq = (size_t)(a->B * a->Hq * a->Lq);
    fx_isa best = fx_get_isa();
    for (size_t t = 0; t < sizeof all_isas / sizeof all_isas[0]; t++) {
        if (fx_set_isa(all_isas[t]) != FX_OK)
            continue;
        float *out = fxt_guarded(nq * (size_t)a->Dv), *lse = fxt_guarded(nq);
        FXT_OK(fx_flex_attention(a, q, k, v, out, lse));
        for (size_t r = 0; r < nq; r++) {
            bool ok = want_nan[r] ? isnan(lse[r]) && isnan(out[r * (size_t)a->Dv])
                    : want_ninf[r] ? isinf(lse[r]) && lse[r] < 0 && out[r * (size_t)a->Dv] == 0.0f
                                   : isfinite(lse[r]) && isfinite(out[r * (size_t)a->Dv]);
            if (!ok) {
                FXT_FAIL("%s [%s]: row %zu: lse %g, out[0] %g, expected %s", what, fx_isa_name(all_isas[t]), r,
                         (double)lse[r], (double)out[r * (size_t)a->Dv],
                         want_nan[r] ? "NaN" : want_ninf[r] ? "-inf" : "finite");
                break;
            }
        }
        fxt_guarded_free("nan out", out);
        fxt_guarded_free("nan lse", lse);
    }
    fx_set_isa(best);
}

static void test_nan_propagation(void)
{
    /* Prefill, causal: query row 40 of head 0 is NaN; key 70 is NaN (rows >= 70 see it). */
    fx_block_mask *m = NULL;
    FXT_OK(fx_block_mask_create(&m, fx_mask_causal, NULL, 1, 1, 100, 100, 32, 32));
    fx_attention a = shape(1, 2, 1, 100, 100, 16, 16);
    a.mask = m;
    float *q = fxt_random(3200, -1, 1, 1), *k = fxt_random(1600, -1, 1, 2), *v = fxt_random(1600, -1, 1, 3);
    bool nan[300] = {false}, ninf[300] = {false};
    q[40 * 16 + 3] = NAN;
    k[70 * 16 + 5] = NAN;
    for (int h = 0; h < 2; h++)
        for (int i = 70; i < 100; i++)
            nan[h * 100 + i] = true;
    nan[40] = true;
    nan_rows("prefill causal", &a, q, k, v, nan, ninf);

    /* The backward: NaN rows give NaN gradients, not the zeros of a masked row. */
    float *out = fxt_guarded(3200), *lse = fxt_guarded(200), *dout = fxt_random(3200, -1, 1, 4);
    float *dq = fxt_guarded(3200), *dk = fxt_guarded(1600), *dv = fxt_guarded(1600);
    FXT_OK(fx_flex_attention(&a, q, k, v, out, lse));
    FXT_OK(fx_flex_attention_backward(&a, q, k, v, out, lse, dout, dq, dk, dv));
    FXT_CHECK(isnan(dq[40 * 16]));
    FXT_CHECK(isnan(dq[100 * 16 + 80 * 16])); /* head 1, row 80: sees key 70 */
    FXT_CHECK(isfinite(dq[100 * 16 + 30 * 16])); /* head 1, row 30: before it */
    fxt_guarded_free("dq", dq), fxt_guarded_free("dk", dk), fxt_guarded_free("dv", dv);
    fxt_guarded_free("out", out), fxt_guarded_free("lse", lse);
    free(dout);
    fx_block_mask_free(m);

    /* Fully masked rows (queries before 70) stay -inf even when their query is NaN. */
    FXT_OK(fx_block_mask_create(&m, mask_late_rows, NULL, 1, 1, 100, 100, 32, 32));
    a.mask = m;
    memset(nan, 0, sizeof nan);
    q[40 * 16 + 3] = NAN;
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 100; i++)
            ninf[h * 100 + i] = i < 70, nan[h * 100 + i] = i >= 70;
    nan_rows("masked rows", &a, q, k, v, nan, ninf);
    fx_block_mask_free(m);
    free(q), free(k), free(v);

    /* Decode (split-KV): 2 query rows at positions 398, 399 against 400 keys, causal and
       dense; key 350 is NaN for both, then only a query. */
    FXT_OK(fx_block_mask_create(&m, fx_mask_causal, NULL, 1, 1, 400, 400, 64, 64));
    fx_attention d = shape(1, 4, 2, 2, 400, 16, 16);
    d.q_offset = 398;
    q = fxt_random(128, -1, 1, 5), k = fxt_random(12800, -1, 1, 6), v = fxt_random(12800, -1, 1, 7);
    memset(ninf, 0, sizeof ninf);
    memset(nan, 0, sizeof nan);
    for (int r = 0; r < 4; r++)
        nan[r] = true; /* heads 0, 1 share kv head 0 */
    k[350 * 16] = NAN;
    d.mask = NULL;
    nan_rows("decode dense, NaN key", &d, q, k, v, nan, ninf);
    d.mask = m;
    nan_rows("decode causal, NaN key", &d, q, k, v, nan, ninf);
    k[350 * 16] = 0.5f;
    memset(nan, 0, sizeof nan);
    q[5 * 16 + 2] = NAN; /* head 2, row 1 */
    nan[5] = true;
    nan_rows("decode causal, NaN query", &d, q, k, v, nan, ninf);
    d.mask = NULL;
    nan_rows("decode dense, NaN query", &d, q, k, v, nan, ninf);
    fx_block_mask_free(m);
    free(q), free(k), free(v);
}

static void test_large_scores(void)
{
    /* q, k in [11, 13], scale 1: scores around 9e3 .. 1e4; exp must not overflow. */
    fx_attention a = shape(1, 2, 1, 80, 80, 64, 16);
    a.scale = 1.0f;
    ref_case c = {.a = a};
    check_case("large scores dense", &c, 11, 13, 100, 2e-2, 1e-5);
    run_masked("large scores causal", fx_mask_causal, NULL, 1, 1, a, 32, 32, 101);
}

static void test_q_offset(void)
{
    /* Query rows 150 .. 189 of a causal mask built for 256 positions, keys 0 .. 189. */
    fx_mask_sliding_window_ctx sw = {.window = 70};
    fx_attention a = shape(1, 4, 2, 40, 190, 32, 32);
    a.q_offset = 150;
    run_masked("q_offset causal", fx_mask_causal, NULL, 1, 1, a, 64, 64, 110);
    run_masked("q_offset sliding", fx_mask_sliding_window, &sw, 1, 1, a, 32, 48, 111);
    /* The mask is longer than the keys: bits past Lkv must not count. */
    fx_mask_pair_ctx or_ctx = {fx_mask_sliding_window, &sw, mask_hash, NULL};
    run_masked_ext("q_offset, longer mask", fx_mask_or, &or_ctx, 1, 1, a, 32, 48, 114, 77);
    run_masked_ext("q_offset, longer dense-ish mask", mask_hash, NULL, 1, 4, a, 64, 64, 115, 30);
    a.Lq = 1, a.q_offset = 189; /* one decoding step */
    run_masked("q_offset one row", fx_mask_causal, NULL, 1, 1, a, 32, 32, 112);
    fx_attention d = shape(1, 2, 2, 5, 60, 16, 16); /* dense: positions shift for the mods */
    d.q_offset = 55;
    d.score_mod = score_positions;
    ref_case c = {.a = d};
    check_case("q_offset dense mod", &c, -1, 1, 113, 2e-5, 2e-4);
}

static void test_lse_optional(void)
{
    fx_attention a = shape(1, 1, 1, 20, 20, 8, 8);
    float *q = fxt_random(160, -1, 1, 1), *k = fxt_random(160, -1, 1, 2), *v = fxt_random(160, -1, 1, 3);
    float *o1 = fxt_guarded(160), *o2 = fxt_guarded(160), *lse = fxt_guarded(20);
    FXT_OK(fx_flex_attention(&a, q, k, v, o1, NULL));
    FXT_OK(fx_flex_attention(&a, q, k, v, o2, lse));
    fxt_bitwise_f32("lse NULL", o1, o2, 160);
    fxt_guarded_free("o1", o1), fxt_guarded_free("o2", o2), fxt_guarded_free("lse", lse);
    free(q), free(k), free(v);
}

static void test_determinism_large(void)
{
    /* More work items than threads, uneven per item: bitwise equal at 1 and 2 threads. */
    fx_mask_sliding_window_ctx sw = {.window = 200};
    run_masked("deterministic", fx_mask_sliding_window, &sw, 1, 1, shape(1, 4, 2, 520, 520, 48, 48), 128, 128, 120);
}

/* Lowers the address-space limit to what the process maps now plus `extra`, so that a mask
   that ever got past the size check fails to allocate instead of reaching the OOM killer.
   Not under AddressSanitizer, whose shadow memory needs the address space. false: left. */
static bool limit_address_space(struct rlimit *saved, size_t extra)
{
#if defined(__SANITIZE_ADDRESS__)
    (void)saved, (void)extra;
    return false;
#else
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long vm_kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %llu kB", &vm_kb) == 1)
            break;
    if (f)
        fclose(f);
    if (!vm_kb || getrlimit(RLIMIT_AS, saved) != 0)
        return false;
    struct rlimit lower = *saved;
    rlim_t want = (rlim_t)(vm_kb * 1024 + extra);
    if (lower.rlim_cur != RLIM_INFINITY && lower.rlim_cur < want)
        return false;
    lower.rlim_cur = want;
    return setrlimit(RLIMIT_AS, &lower) == 0;
#endif
}

/* A row callback that makes every block partial (a checkerboard) and counts its calls. */
static int fill_checkerboard(uint64_t *bits, int64_t words, int64_t b, int64_t h, int64_t q0, int64_t nq, void *ctx)
{
    (void)b, (void)h;
    ++*(int64_t *)ctx;
    for (int64_t i = 0; i < nq; i++)
        for (int64_t w = 0; w < words; w++)
            bits[i * words + w] = (q0 + i) % 2 ? 0xaaaaaaaaaaaaaaaau : 0x5555555555555555u;
    return FX_OK;
}

/* A mask's bytes are bounded (fx_block_mask_max_bytes) in every dimension before anything is
   allocated: B = 2^31 at 64 x 64 positions (the batch of Python's create_block_mask(causal_mask,
   2**31, None, 64, 64)), H, the q-blocks and the kv-blocks are each refused with FX_EINVAL
   naming the dimensions, the bytes and the bound, with no allocation; the visit lists and
   the partial blocks' bitmaps are checked once their counts are known, before they are
   allocated; a mask within the bound is built, and the build never holds more. */
static void test_mask_size_limit(void)
{
    FXT_CHECK(fx_block_mask_max_bytes() == FX_BLOCK_MASK_DEFAULT_MAX_BYTES);
    FXT_CHECK(FX_BLOCK_MASK_DEFAULT_MAX_BYTES == (size_t)4 << 30);
    fx_block_mask *m = NULL;
    int64_t calls = 0;
    size_t before, peak;
    struct rlimit saved;
    bool limited = limit_address_space(&saved, (size_t)1 << 30);
    fx_mem_stats(&before, &peak);
    fx_mem_reset_peak();
    const int64_t big = (int64_t)1 << 31;
    FXT_STATUS(fx_block_mask_create(&m, fx_mask_causal, NULL, big, 1, 64, 64, 0, 0), FX_EINVAL,
               "block mask of B = 2147483648, H = 1, 1 x 1 blocks of 128 x 128 (q_len = 64, kv_len = 64): its "
               "block tables need ");
    FXT_HAS_STR(fx_last_error(), "above the limit of 4294967296 bytes (4096.0 MiB) (fx_block_mask_set_max_bytes)");
    FXT_STATUS(fx_block_mask_create_rows(&m, fill_checkerboard, &calls, big, 1, 64, 64, 0, 0), FX_EINVAL,
               "block mask of B = 2147483648, H = 1, 1 x 1 blocks");
    FXT_STATUS(fx_block_mask_create(&m, fx_mask_causal, NULL, 1, big, 64, 64, 0, 0), FX_EINVAL,
               "B = 1, H = 2147483648, 1 x 1 blocks");
    /* 2^30 q-blocks, or kv-blocks, of 128 positions: 17 GiB of tables */
    FXT_STATUS(fx_block_mask_create(&m, fx_mask_causal, NULL, 1, 1, (int64_t)1 << 37, 64, 0, 0), FX_EINVAL,
               "B = 1, H = 1, 1073741824 x 1 blocks of 128 x 128 (q_len = 137438953472, kv_len = 64)");
    FXT_STATUS(fx_block_mask_create(&m, fx_mask_causal, NULL, 1, 1, 64, (int64_t)1 << 37, 0, 0), FX_EINVAL,
               "1 x 1073741824 blocks");
    FXT_STATUS(fx_block_mask_create_rows(&m, fill_checkerboard, &calls, 1, 1, 64, (int64_t)1 << 37, 0, 0),
               FX_EINVAL, "1 x 1073741824 blocks");
    /* 2^61 slots of one block: a block count that fits a size_t, offsets whose bytes do not */
    FXT_STATUS(fx_block_mask_create(&m, fx_mask_causal, NULL, big, (int64_t)1 << 30, 64, 64, 0, 0), FX_EINVAL,
               "need more than 18446744073709551614 bytes");
    fx_mem_stats(&peak, &peak);
    FXT_EQ_INT(peak, before); /* nothing was allocated */
    FXT_CHECK(m == NULL && calls == 0);
    if (limited)
        setrlimit(RLIMIT_AS, &saved);

    /* Causal at 4096 positions in blocks of 16: 256 x 256 blocks, 32896 visited, 256 partial.
       Its tables (about 82 KB) fit 200 KB, its lists (790 KB) and bitmaps (33 KB) do not. */
    fx_block_mask_set_max_bytes(200 << 10);
    FXT_CHECK(fx_block_mask_max_bytes() == 200 << 10);
    fx_mem_reset_peak();
    FXT_STATUS(fx_block_mask_create(&m, fx_mask_causal, NULL, 1, 1, 4096, 4096, 16, 16), FX_EINVAL,
               "256 x 256 blocks of 16 x 16 (q_len = 4096, kv_len = 4096): its tables with the lists of 32896 "
               "visited blocks and the bitmaps of 256 partial ones need ");
    FXT_HAS_STR(fx_last_error(), "above the limit of 204800 bytes (0.2 MiB)");
    fx_mem_stats(&before, &peak);
    FXT_CHECK(peak - before <= 200 << 10);
    /* From rows, every block partial: refused as the bitmaps grow past the bound. */
    FXT_STATUS(fx_block_mask_create_rows(&m, fill_checkerboard, &calls, 1, 1, 4096, 4096, 16, 16), FX_EINVAL,
               "its tables, a block row and the bitmaps of ");
    FXT_CHECK(calls > 0 && calls < 256);
    FXT_CHECK(m == NULL);

    /* Within the bound: built, and the build's peak stays within it too. */
    fx_block_mask_set_max_bytes(1 << 20);
    fx_mem_stats(&before, &peak);
    fx_mem_reset_peak();
    FXT_OK(fx_block_mask_create(&m, fx_mask_causal, NULL, 1, 1, 4096, 4096, 16, 16));
    fx_mem_stats(NULL, &peak);
    FXT_CHECK(peak - before <= 1 << 20);
    FXT_CHECK(fx_block_mask_bytes(m) <= 1 << 20);
    FXT_EQ_INT(m ? m->n_visited : 0, 32896);
    fx_block_mask_free(m);
    m = NULL;
    calls = 0;
    FXT_OK(fx_block_mask_create_rows(&m, fill_checkerboard, &calls, 1, 1, 512, 512, 16, 16));
    FXT_EQ_INT(m ? m->n_partial : 0, 32 * 32);
    fx_block_mask_free(m);
    fx_block_mask_set_max_bytes(0); /* the default again */
    FXT_CHECK(fx_block_mask_max_bytes() == FX_BLOCK_MASK_DEFAULT_MAX_BYTES);
}

/* fx_attention_defaults: the sizes, Dv = D and every option off, dtype FX_DT_F32 written out;
   a zero-initialised struct (dtype 0, FX_DT_BOOL's value) is the same float32 CPU call,
   bit for bit; a dtype that is neither is refused. */
static void test_attention_defaults(void)
{
    fx_attention a = fx_attention_defaults(2, 4, 2, 33, 40, 16);
    FXT_EQ_INT(a.B, 2);
    FXT_EQ_INT(a.Hq, 4);
    FXT_EQ_INT(a.Hkv, 2);
    FXT_EQ_INT(a.Lq, 33);
    FXT_EQ_INT(a.Lkv, 40);
    FXT_EQ_INT(a.D, 16);
    FXT_EQ_INT(a.Dv, 16);
    FXT_CHECK(a.scale == 0.0f);
    FXT_EQ_INT(a.q_offset, 0);
    FXT_CHECK(a.mask == NULL && a.score_mod == NULL && a.score_mod_grad == NULL && a.score_ctx == NULL);
    FXT_EQ_INT(a.device, 0);
    FXT_CHECK(a.stream == NULL);
    FXT_EQ_INT(a.dtype, FX_DT_F32);

    const int64_t nq = 2 * 4 * 33, nkv = 2 * 2 * 40;
    float *q = fxt_random(nq * 16, -1, 1, 11), *k = fxt_random(nkv * 16, -1, 1, 12), *v = fxt_random(nkv * 16, -1, 1, 13);
    float *o1 = fxt_guarded(nq * 16), *o2 = fxt_guarded(nq * 16), *l1 = fxt_guarded(nq), *l2 = fxt_guarded(nq);
    FXT_OK(fx_flex_attention(&a, q, k, v, o1, l1));
    fx_attention zero = {.B = 2, .Hq = 4, .Hkv = 2, .Lq = 33, .Lkv = 40, .D = 16, .Dv = 16};
    FXT_EQ_INT(zero.dtype, 0);
    FXT_OK(fx_flex_attention(&zero, q, k, v, o2, l2));
    fxt_bitwise_f32("defaults vs zero-initialised", o1, o2, nq * 16);
    fxt_bitwise_f32("defaults vs zero-initialised lse", l1, l2, nq);
    /* and both are attention: the reference's answer */
    ref_case c = {.a = a};
    double *ro = fxt_alloc_f64(nq * 16), *rl = fxt_alloc_f64(nq);
    reference(&c, q, k, v, ro, rl);
    fxt_close_f32("defaults vs reference", o1, ro, nq * 16, 1e-5, 1e-4);
    fxt_close_f32("defaults vs reference lse", l1, rl, nq, 1e-5, 1e-4);

    fx_attention f16 = a;
    f16.dtype = FX_DT_F16;
    FXT_STATUS(fx_flex_attention(&f16, q, k, v, o2, l2), FX_EINVAL, "dtype");
    fxt_guarded_free("o1", o1);
    fxt_guarded_free("o2", o2);
    fxt_guarded_free("l1", l1);
    fxt_guarded_free("l2", l2);
    free(q), free(k), free(v), free(ro), free(rl);
}

static void test_errors(void)
{
    fx_block_mask *m = NULL;
    FXT_STATUS(fx_block_mask_create(NULL, fx_mask_causal, NULL, 1, 1, 8, 8, 0, 0), FX_EINVAL, "out");
    FXT_STATUS(fx_block_mask_create(&m, NULL, NULL, 1, 1, 8, 8, 0, 0), FX_EINVAL, "mask");
    FXT_STATUS(fx_block_mask_create(&m, fx_mask_causal, NULL, 0, 1, 8, 8, 0, 0), FX_EINVAL, "B = 0");
    FXT_STATUS(fx_block_mask_create(&m, fx_mask_causal, NULL, 1, -2, 8, 8, 0, 0), FX_EINVAL, "H = -2");
    FXT_STATUS(fx_block_mask_create(&m, fx_mask_causal, NULL, 1, 1, 0, 8, 0, 0), FX_EINVAL, "q_len = 0");
    FXT_STATUS(fx_block_mask_create(&m, fx_mask_causal, NULL, 1, 1, 8, -1, 0, 0), FX_EINVAL, "kv_len = -1");
    FXT_STATUS(fx_block_mask_create(&m, fx_mask_causal, NULL, 1, 1, 8, 8, -1, 0), FX_EINVAL, "block_q = -1");
    FXT_STATUS(fx_block_mask_create(&m, fx_mask_causal, NULL, 1, 1, INT64_MAX, 8, 0, 0), FX_EINVAL, "too many blocks");
    FXT_STATUS(fx_block_mask_create(&m, fx_mask_causal, NULL, 1, 1, 8, INT64_MAX - 1, 0, 100), FX_EINVAL,
               "too many blocks");
    FXT_STATUS(fx_block_mask_create(&m, fx_mask_sliding_window, NULL, 1, 1, 8, 8, 0, 0), FX_EINVAL, "ctx");
    fx_mask_sliding_window_ctx sw0 = {.window = 0};
    FXT_STATUS(fx_block_mask_create(&m, fx_mask_sliding_window, &sw0, 1, 1, 8, 8, 0, 0), FX_EINVAL, "window = 0");
    int64_t ids[8] = {0};
    fx_mask_document_ctx doc = {.doc_ids = ids, .len = 8};
    FXT_STATUS(fx_block_mask_create(&m, fx_mask_document, &doc, 1, 1, 8, 9, 0, 0), FX_EINVAL, "len = 8");
    fx_mask_pair_ctx pair = {fx_mask_causal, NULL, NULL, NULL};
    FXT_STATUS(fx_block_mask_create(&m, fx_mask_and, &pair, 1, 1, 8, 8, 0, 0), FX_EINVAL, "operand b");
    FXT_CHECK(m == NULL);

    FXT_OK(fx_block_mask_create(&m, fx_mask_causal, NULL, 1, 1, 64, 64, 16, 16));
    float *q = fxt_random(4 * 64 * 8, -1, 1, 1), *k = fxt_random(4 * 64 * 8, -1, 1, 2), *v = fxt_random(4 * 64 * 8, -1, 1, 3);
    float *out = fxt_guarded(4 * 64 * 8), *lse = fxt_guarded(4 * 64);
    fx_attention good = shape(1, 4, 2, 64, 64, 8, 8), a;
    good.mask = m;
    FXT_OK(fx_flex_attention(&good, q, k, v, out, lse));
    for (int i = 0; i < 4 * 64 * 8; i++)
        out[i] = 1234.0f; /* must survive every failing call */
#define BAD(field, value, msg)                                                                    \
    do {                                                                                          \
        a = good;                                                                                 \
        a.field = value;                                                                          \
        FXT_STATUS(fx_flex_attention(&a, q, k, v, out, lse), FX_EINVAL, msg);                      \
    } while (0)
    BAD(Hkv, 3, "Hq = 4 is not a multiple of Hkv = 3");
    BAD(B, 0, "B = 0");
    BAD(Hq, -4, "Hq = -4");
    BAD(Lq, 0, "Lq = 0");
    BAD(Lkv, -1, "Lkv = -1");
    BAD(D, 0, "D = 0");
    BAD(Dv, 0, "Dv = 0");
    BAD(D, INT64_C(1) << 50, "scratch size overflows"); /* the tensors' sizes alone would fit */
    BAD(Hq, INT64_C(1) << 50, "scratch size overflows");
    BAD(q_offset, -1, "q_offset = -1");
    BAD(q_offset, 1, "mask q_len = 64 is shorter than q_offset + Lq = 65");
    BAD(Lkv, 65, "mask kv_len = 64 is shorter than Lkv = 65");
    BAD(scale, NAN, "scale");
    BAD(score_mod, fx_score_alibi, "slopes");
    BAD(score_mod, fx_score_softcap, "cap");
    fx_score_softcap_ctx tiny_cap = {.cap = 1e-39f};
    good.score_ctx = &tiny_cap;
    BAD(score_mod, fx_score_softcap, "cap = 1e-39 is too small");
    good.score_ctx = NULL;
    BAD(score_mod, fx_score_rel_bias, "table");
#undef BAD
    FXT_STATUS(fx_flex_attention(NULL, q, k, v, out, lse), FX_EINVAL, "a is NULL");
    FXT_STATUS(fx_flex_attention(&good, NULL, k, v, out, lse), FX_EINVAL, "q is NULL");
    FXT_STATUS(fx_flex_attention(&good, q, NULL, v, out, lse), FX_EINVAL, "k is NULL");
    FXT_STATUS(fx_flex_attention(&good, q, k, NULL, out, lse), FX_EINVAL, "v is NULL");
    FXT_STATUS(fx_flex_attention(&good, q, k, v, NULL, lse), FX_EINVAL, "out is NULL");
    /* Outputs overlapping inputs or each other: a later tile would read what an earlier one
       wrote. */
    FXT_STATUS(fx_flex_attention(&good, q, k, v, k, lse), FX_EINVAL, "out overlaps the input k");
    FXT_STATUS(fx_flex_attention(&good, q, k, v, out, v + 5), FX_EINVAL, "lse overlaps the input v");
    FXT_STATUS(fx_flex_attention(&good, q, k, v, out, out + 64), FX_EINVAL, "lse overlaps out");
    FXT_STATUS(fx_flex_attention(&good, q, k, v, q, lse), FX_EINVAL, "out overlaps the input q");
    fx_block_mask *mh = NULL;
    FXT_OK(fx_block_mask_create(&mh, fx_mask_causal, NULL, 2, 3, 64, 64, 16, 16));
    a = good;
    a.mask = mh;
    FXT_STATUS(fx_flex_attention(&a, q, k, v, out, lse), FX_EINVAL, "mask B = 2 must be 1 or B = 1");
    a.B = 2;
    FXT_STATUS(fx_flex_attention(&a, q, k, v, out, lse), FX_EINVAL, "mask H = 3 must be 1 or Hq = 4");
    for (int i = 0; i < 4 * 64 * 8; i++)
        if (out[i] != 1234.0f) {
            FXT_FAIL("out[%d] changed by a failing call", i);
            break;
        }
    fxt_guarded_free("out", out);
    fxt_guarded_free("lse", lse);
    free(q), free(k), free(v);
    fx_block_mask_free(mh);
    fx_block_mask_free(m);
    fx_block_mask_free(NULL);
    FXT_EQ_INT(fx_block_mask_bytes(NULL), 0);
}

static int64_t sweep_next(uint64_t *state, int64_t n)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (int64_t)((*state >> 33) % (uint64_t)n);
}

/* Many small random configurations: shapes, GQA, offsets, block sizes, masks and mods. */
static void test_random_sweep(void)
{
    uint64_t state = 12345;
#define NEXT(n) sweep_next(&state, n)
    fx_mask_sliding_window_ctx sw = {.window = 1};
    float slopes[8] = {0.3f, 0.2f, 0.1f, 0.05f, 0.4f, 0.6f, 0.01f, 0.02f};
    fx_score_alibi_ctx al = {slopes};
    fx_score_softcap_ctx sc = {.cap = 1.5f};
    for (int it = 0; it < 40; it++) {
        int64_t G = 1 + NEXT(3), Hkv = 1 + NEXT(2), B = 1 + NEXT(2);
        int64_t Lq = 1 + NEXT(70), Lkv = 1 + NEXT(90), D = 1 + NEXT(40), Dv = 1 + NEXT(40);
        fx_attention a = shape(B, G * Hkv, Hkv, Lq, Lkv, D, Dv);
        a.q_offset = NEXT(3) == 0 ? 0 : NEXT(50);
        int mod = (int)NEXT(4);
        a.score_mod = mod == 1 ? fx_score_alibi : mod == 2 ? fx_score_softcap : mod == 3 ? score_positions : NULL;
        a.score_ctx = mod == 1 ? (const void *)&al : mod == 2 ? (const void *)&sc : NULL;
        int64_t bq = 1 + NEXT(40), bk = 1 + NEXT(70);
        sw.window = 1 + NEXT(60);
        char what[96];
        snprintf(what, sizeof what, "sweep %d", it);
        int64_t extra = NEXT(20), mB = NEXT(2) ? B : 1, mH = NEXT(2) ? a.Hq : 1;
        switch (NEXT(4)) {
        case 0: {
            ref_case c = {.a = a};
            check_case(what, &c, -1, 1, 200 + (uint64_t)it, 3e-5, 3e-4);
            break;
        }
        case 1:
            run_masked_ext(what, fx_mask_sliding_window, &sw, 1, 1, a, bq, bk, 200 + (uint64_t)it, extra);
            break;
        case 2:
            run_masked_ext(what, mask_hash, NULL, mB, mH, a, bq, bk, 200 + (uint64_t)it, extra);
            break;
        default:
            run_masked_ext(what, mask_some_rows_empty, NULL, 1, 1, a, bq, bk, 200 + (uint64_t)it, 0);
            break;
        }
    }
#undef NEXT
}

static long mask_calls;

static bool mask_counting(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    __atomic_fetch_add(&mask_calls, 1, __ATOMIC_RELAXED);
    return mask_hash(b, h, q, kv, ctx);
}

static bool same_mask(const fx_block_mask *x, const fx_block_mask *y)
{
    size_t rows = (size_t)(x->nslots * x->nqb + 1), cols = (size_t)(x->nslots * x->nkb + 1);
    size_t nv = (size_t)x->n_visited, nb = (size_t)(x->n_partial * x->block_q * x->bm_words);
    return x->n_visited == y->n_visited && x->n_partial == y->n_partial &&
           !memcmp(x->kv_ptr, y->kv_ptr, rows * sizeof(int64_t)) && !memcmp(x->q_ptr, y->q_ptr, cols * sizeof(int64_t)) &&
           !memcmp(x->kv_idx, y->kv_idx, nv * sizeof(int32_t)) && !memcmp(x->kv_bits, y->kv_bits, nv * sizeof(int64_t)) &&
           !memcmp(x->q_idx, y->q_idx, nv * sizeof(int32_t)) && !memcmp(x->q_bits, y->q_bits, nv * sizeof(int64_t)) &&
           (nb == 0 || !memcmp(x->bits, y->bits, nb * sizeof(uint64_t)));
}

/* A custom mask is evaluated while the mask is built, never by the kernel; the mask built
   on 1 and 2 threads is the same. */
static void test_mask_evaluation(void)
{
    int threads = fx_get_num_threads();
    fx_block_mask *m1 = NULL, *m2 = NULL;
    fx_set_num_threads(1);
    mask_calls = 0;
    FXT_OK(fx_block_mask_create(&m1, mask_counting, NULL, 2, 2, 150, 140, 32, 48));
    FXT_CHECK(mask_calls >= 2 * 2 * 150 * 140); /* every block is partial: each element seen */
    fx_set_num_threads(2);
    FXT_OK(fx_block_mask_create(&m2, mask_counting, NULL, 2, 2, 150, 140, 32, 48));
    fx_set_num_threads(threads);
    if (!m1 || !m2)
        return;
    FXT_CHECK(same_mask(m1, m2));
    fx_attention a = shape(2, 2, 1, 150, 140, 16, 16);
    a.mask = m2;
    size_t nq = 2 * 2 * 150 * 16, nk = 2 * 140 * 16;
    float *q = fxt_random(nq, -1, 1, 1), *k = fxt_random(nk, -1, 1, 2), *v = fxt_random(nk, -1, 1, 3);
    float *out = fxt_guarded(nq);
    mask_calls = 0;
    fx_isa best = fx_get_isa();
    for (size_t t = 0; t < sizeof all_isas / sizeof all_isas[0]; t++)
        if (fx_set_isa(all_isas[t]) == FX_OK)
            FXT_OK(fx_flex_attention(&a, q, k, v, out, NULL));
    fx_set_isa(best);
    FXT_EQ_INT(mask_calls, 0);
    fxt_guarded_free("out", out);
    free(q), free(k), free(v);
    fx_block_mask_free(m1);
    fx_block_mask_free(m2);
}

static void test_no_leak(void)
{
    size_t before, after, peak;
    fx_mem_stats(&before, &peak);
    run_masked("leak", fx_mask_causal, NULL, 1, 1, shape(1, 2, 2, 50, 50, 16, 16), 16, 16, 130);
    fx_mem_stats(&after, &peak);
    FXT_EQ_INT(after, before);
}

/* Windows cut into many q-blocks: each thread takes runs of consecutive items and reuses the
   kv-blocks it packed for the previous one (and prefetches the next one's). How many items a
   run holds depends on the thread count (44 items: runs of 2 at 1 thread, of 1 at 2 and 3;
   147 items: 9, 4 and 3), so 1, 2 and 3 threads must agree bit for bit, and every path must
   match the reference. The cases cut blocks every way: D and Dv not whole vectors (V's last
   panel partly loaded), a last kv-block shorter than the others (the prefetch of a short
   block), q_offset inside a block, GQA sharing one item's blocks, a window as wide as the
   three blocks an item can hold and one narrower than a block, and heads so short that a run
   goes on into the next head's first blocks (the same block numbers of other K and V). */
static void window_runs(const char *what, int64_t window, fx_attention a, int64_t bq, int64_t bk, uint64_t seed)
{
    fx_mask_sliding_window_ctx sw = {.window = window};
    fx_block_mask *m = NULL;
    FXT_OK(fx_block_mask_create(&m, fx_mask_sliding_window, &sw, 1, 1, a.q_offset + a.Lq, a.Lkv, bq, bk));
    if (!m)
        return;
    ref_case c = {.a = a, .mask = fx_mask_sliding_window, .mask_ctx = &sw, .mask_B = 1, .mask_H = 1};
    c.a.mask = m;
    check_case(what, &c, -1, 1, seed, 2e-5, 2e-4);
    size_t nq = (size_t)(a.B * a.Hq * a.Lq), nk = (size_t)(a.B * a.Hkv * a.Lkv);
    float *q = fxt_random(nq * a.D, -1, 1, seed + 7), *k = fxt_random(nk * a.D, -1, 1, seed + 8);
    float *v = fxt_random(nk * a.Dv, -1, 1, seed + 9);
    float *o1 = fxt_guarded(nq * a.Dv), *o3 = fxt_guarded(nq * a.Dv), *l1 = fxt_guarded(nq), *l3 = fxt_guarded(nq);
    int threads = fx_get_num_threads();
    fx_set_num_threads(1);
    FXT_OK(fx_flex_attention(&c.a, q, k, v, o1, l1));
    fx_set_num_threads(3);
    FXT_OK(fx_flex_attention(&c.a, q, k, v, o3, l3));
    fx_set_num_threads(threads);
    char name[160];
    snprintf(name, sizeof name, "%s threads 1 vs 3", what);
    fxt_bitwise_f32(name, o1, o3, nq * a.Dv);
    fxt_bitwise_f32(name, l1, l3, nq);
    fxt_guarded_free(name, o1), fxt_guarded_free(name, o3), fxt_guarded_free(name, l1), fxt_guarded_free(name, l3);
    free(q), free(k), free(v);
    fx_block_mask_free(m);
}

static void test_window_runs(void)
{
    fx_attention a = shape(1, 4, 2, 700, 700, 24, 20); /* 2 head groups x 22 q-blocks */
    window_runs("window runs gqa", 40, a, 32, 32, 130);
    a = shape(1, 3, 3, 1150, 1190, 16, 40); /* 3 heads x 49 q-blocks, last kv-block 6 keys */
    a.q_offset = 37;
    window_runs("window runs q_offset", 49, a, 24, 32, 131);
    a = shape(2, 2, 1, 600, 600, 8, 8);
    window_runs("window runs narrow", 5, a, 16, 16, 132);
    a = shape(2, 8, 8, 90, 90, 16, 16); /* 16 (b, head) x 3 q-blocks: runs cross heads and batches */
    window_runs("window runs short heads", 40, a, 32, 32, 133);
}

/* A forward whose output is large enough (16 MiB) to be advised onto huge pages and streamed
   to memory, written at 1 MiB + 16 bytes past a 2 MiB boundary (rows 16-byte aligned: the
   streaming stores) and at 1 MiB + 4 bytes (misaligned rows: plain stores). Both equal, bit
   for bit, two calls on half of the heads each, whose 8 MiB outputs are neither advised nor
   streamed; the bytes around the output (filled beforehand) stay untouched. */
static void test_large_output(void)
{
    fx_mask_sliding_window_ctx sw = {.window = 64};
    fx_attention a = shape(1, 8, 8, 8192, 8192, 32, 64), half = shape(1, 4, 4, 8192, 8192, 32, 64);
    fx_block_mask *m = NULL;
    FXT_OK(fx_block_mask_create(&m, fx_mask_sliding_window, &sw, 1, 1, a.Lq, a.Lkv, 0, 0));
    if (!m)
        return;
    a.mask = half.mask = m;
    const size_t nq = (size_t)(a.B * a.Hq * a.Lq), nk = (size_t)(a.B * a.Hkv * a.Lkv), n = nq * (size_t)a.Dv;
    FXT_CHECK(n * sizeof(float) >= ((size_t)16 << 20));
    const size_t mib = (size_t)1 << 20, total = n * sizeof(float) + 4 * mib;
    float *q = fxt_random(nq * a.D, -1, 1, 140), *k = fxt_random(nk * a.D, -1, 1, 141);
    float *v = fxt_random(nk * a.Dv, -1, 1, 142);
    float *ref = fxt_guarded(n), *lref = fxt_guarded(nq), *lse = fxt_guarded(nq);
    for (size_t s = 0; s < 2; s++) /* heads 4s .. 4s + 3 */
        FXT_OK(fx_flex_attention(&half, q + s * nq / 2 * (size_t)a.D, k + s * nk / 2 * (size_t)a.D,
                                 v + s * nk / 2 * (size_t)a.Dv, ref + s * n / 2, lref + s * nq / 2));
    unsigned char *big = malloc(total);
    FXT_CHECK(big != NULL);
    const size_t shifts[] = {16, 4};
    for (size_t t = 0; big && t < 2; t++) {
        const size_t shift = shifts[t];
        char what[64];
        snprintf(what, sizeof what, "large output at +%zu bytes", shift);
        memset(big, 0xa5, total);
        const uintptr_t at = ((uintptr_t)big + 2 * mib - 1) & ~(uintptr_t)(2 * mib - 1);
        float *out = (float *)(at + mib + shift);
        FXT_OK(fx_flex_attention(&a, q, k, v, out, lse));
        fxt_bitwise_f32(what, out, ref, n);
        fxt_bitwise_f32(what, lse, lref, nq);
        const unsigned char *end = (const unsigned char *)(out + n);
        size_t bad = 0, first = 0;
        for (const unsigned char *p = big; p < big + total; p++)
            if ((p < (const unsigned char *)out || p >= end) && *p != 0xa5 && bad++ == 0)
                first = (size_t)(p - big);
        if (bad)
            FXT_FAIL("%s: %zu bytes around the output changed, first at byte %zu", what, bad, first);
    }
    free(big);
    fxt_guarded_free("ref", ref), fxt_guarded_free("lref", lref), fxt_guarded_free("lse", lse);
    free(q), free(k), free(v);
    fx_block_mask_free(m);
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    FXT_RUN(test_mask_causal_structure);
    FXT_RUN(test_mask_builtin_structure);
    FXT_RUN(test_mask_analytic);
    FXT_RUN(test_mask_rows);
    FXT_RUN(test_dense);
    FXT_RUN(test_builtin_masks);
    FXT_RUN(test_custom_masks);
    FXT_RUN(test_gqa);
    FXT_RUN(test_score_mods);
    FXT_RUN(test_fully_masked_rows);
    FXT_RUN(test_nan_propagation);
    FXT_RUN(test_large_scores);
    FXT_RUN(test_q_offset);
    FXT_RUN(test_lse_optional);
    FXT_RUN(test_determinism_large);
    FXT_RUN(test_window_runs);
    FXT_RUN(test_large_output);
    FXT_RUN(test_attention_defaults);
    FXT_RUN(test_errors);
    FXT_RUN(test_mask_size_limit);
    FXT_RUN(test_random_sweep);
    FXT_RUN(test_mask_evaluation);
    FXT_RUN(test_no_leak);
    return fxt_finish();
}
