/* FlexAttention backward: dq, dk, dv (and the relative-bias table's gradient) against float64
   reference gradients for every mask / score-mod combination, GQA, odd shapes and q_offset;
   the reference itself against finite differences; fully masked rows; determinism (1 vs 2
   threads, both block walks, repeated runs); guard zones; argument errors. Every test runs on
   each CPU path this machine has. */
#include "harness.h"

#include "attention/backward.h"
#include "attention/bf16.h"
#include "attention_ref.h"

/* ---- score mods as float64 functions, matching the library's -------------------------------- */

static double mod_alibi(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    (void)b;
    const fx_score_alibi_ctx *c = ctx;
    return s + (double)c->slopes[h] * (double)(kv - q);
}
static double grad_one(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    (void)s, (void)b, (void)h, (void)q, (void)kv, (void)ctx;
    return 1.0;
}
static double mod_softcap(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    (void)b, (void)h, (void)q, (void)kv;
    double c = ((const fx_score_softcap_ctx *)ctx)->cap;
    return c * tanh(s / c);
}
static double grad_softcap(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    (void)b, (void)h, (void)q, (void)kv;
    double c = ((const fx_score_softcap_ctx *)ctx)->cap, t = tanh(s / c);
    return 1.0 - t * t;
}
static int64_t bias_index(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    (void)b;
    const fx_score_rel_bias_ctx *c = ctx;
    int64_t e = q - kv + c->zero;
    e = e < 0 ? 0 : e >= c->size ? c->size - 1 : e;
    return (c->heads == 1 ? 0 : h) * c->size + e;
}
static double mod_rel_bias(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    const fx_score_rel_bias_ctx *c = ctx;
    return s + (double)c->table[bias_index(b, h, q, kv, ctx)];
}

/* A custom mod that is neither additive nor position-free: s + 0.3 sin(s) (1 + h/2) + 0.01 (q - kv). */
static double mod_custom_d(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    (void)b, (void)ctx;
    return s + 0.3 * sin(s) * (1.0 + 0.5 * (double)h) + 0.01 * (double)(q - kv);
}
static double grad_custom_d(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    (void)b, (void)q, (void)kv, (void)ctx;
    return 1.0 + 0.3 * cos(s) * (1.0 + 0.5 * (double)h);
}
static void mod_custom(float *s, int64_t ld, int64_t nq, int64_t nkv, int64_t b, int64_t h, int64_t q0,
                       int64_t kv0, const void *ctx)
{
    for (int64_t i = 0; i < nq; i++)
        for (int64_t j = 0; j < nkv; j++)
            s[i * ld + j] = (float)mod_custom_d(s[i * ld + j], b, h, q0 + i, kv0 + j, ctx);
}
static void grad_custom(const float *s, float *g, int64_t ld, int64_t nq, int64_t nkv, int64_t b, int64_t h,
                        int64_t q0, int64_t kv0, const void *ctx)
{
    for (int64_t i = 0; i < nq; i++)
        for (int64_t j = 0; j < nkv; j++)
            g[i * ld + j] *= (float)grad_custom_d(s[i * ld + j], b, h, q0 + i, kv0 + j, ctx);
}

/* ---- masks ----------------------------------------------------------------------------------- */

/* Custom: a strided pattern that leaves every 5th query row with no key at all. */
static bool mask_custom(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    (void)ctx;
    if (q % 5 == 3)
        return false;
    return ((q * 7 + kv * 3 + b + h) % 4) != 0;
}
/* Differs per head: head h sees keys within 3 + 4h of the query, both sides. */
static bool mask_per_head(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    (void)b, (void)ctx;
    int64_t d = q - kv;
    return d <= 3 + 4 * h && -d <= 3 + 4 * h;
}

enum { MASK_NONE, MASK_CAUSAL, MASK_SLIDING, MASK_PREFIX, MASK_DOCUMENT, MASK_AND, MASK_OR, MASK_CUSTOM,
       MASK_PER_HEAD, N_MASKS };
enum { MOD_NONE, MOD_ALIBI, MOD_SOFTCAP, MOD_BIAS_SHARED, MOD_BIAS_HEADS, MOD_CUSTOM, N_MODS };
static const char *mask_names[] = {"none", "causal", "sliding", "prefix_lm", "document", "and", "or", "custom", "per_head"};
static const char *mod_names[] = {"none", "alibi", "softcap", "rel_bias", "rel_bias_heads", "custom"};

/* Everything one case needs, owned together. */
typedef struct bcase {
    fx_attention a;
    ref_attn r;
    fx_block_mask *bm;
    fx_mask_fn mask;
    const void *mask_ctx;
    fx_mask_sliding_window_ctx sw;
    fx_mask_prefix_lm_ctx pl;
    int64_t prefix[4];
    fx_mask_document_ctx doc;
    int64_t *doc_ids;
    fx_mask_pair_ctx pair;
    float slopes[64];
    fx_score_alibi_ctx alibi;
    fx_score_softcap_ctx cap;
    fx_score_rel_bias_ctx bias;
    float *table;
    int64_t mask_len; /* mask q_len = kv_len */
    int64_t block_kv; /* 0: the block_q given to bcase_init */
} bcase;

/* Sets up mask and mod of a case whose sizes are in c->a already. */
static void bcase_init(bcase *c, int mask, int mod, int64_t block)
{
    fx_attention *a = &c->a;
    int64_t L = c->mask_len;
    c->mask = NULL;
    c->mask_ctx = NULL;
    c->doc_ids = NULL;
    c->table = NULL;
    c->bm = NULL;
    int64_t mB = 1, mH = 1;
    switch (mask) {
    case MASK_CAUSAL:
        c->mask = fx_mask_causal;
        break;
    case MASK_SLIDING:
        c->sw.window = 7;
        c->mask = fx_mask_sliding_window;
        c->mask_ctx = &c->sw;
        break;
    case MASK_PREFIX:
        c->prefix[0] = 5, c->prefix[1] = 19, c->prefix[2] = 0, c->prefix[3] = 40;
        c->pl.prefix_len = c->prefix;
        c->pl.n = 4;
        c->mask = fx_mask_prefix_lm;
        c->mask_ctx = &c->pl;
        mB = a->B;
        break;
    case MASK_DOCUMENT:
        c->doc_ids = malloc(sizeof(int64_t) * (size_t)(L * a->B));
        for (int64_t b = 0; b < a->B; b++)
            for (int64_t i = 0; i < L; i++)
                c->doc_ids[b * L + i] = (i * (3 + b)) / 23;
        c->doc.doc_ids = c->doc_ids;
        c->doc.len = L;
        c->doc.batch_stride = L;
        c->mask = fx_mask_document;
        c->mask_ctx = &c->doc;
        mB = a->B;
        break;
    case MASK_AND:
        c->sw.window = 11;
        c->pair = (fx_mask_pair_ctx){.a = fx_mask_sliding_window, .a_ctx = &c->sw, .b = mask_custom, .b_ctx = NULL};
        c->mask = fx_mask_and;
        c->mask_ctx = &c->pair;
        mB = a->B;
        mH = a->Hq;
        break;
    case MASK_OR:
        c->sw.window = 4;
        c->pair = (fx_mask_pair_ctx){.a = fx_mask_sliding_window, .a_ctx = &c->sw, .b = mask_per_head, .b_ctx = NULL};
        c->mask = fx_mask_or;
        c->mask_ctx = &c->pair;
        mH = a->Hq;
        break;
    case MASK_CUSTOM:
        c->mask = mask_custom;
        mB = a->B;
        mH = a->Hq;
        break;
    case MASK_PER_HEAD:
        c->mask = mask_per_head;
        mH = a->Hq;
        break;
    default:
        break;
    }
    if (c->mask)
        FXT_OK(fx_block_mask_create(&c->bm, c->mask, c->mask_ctx, mB, mH, L, L, block, c->block_kv ? c->block_kv : block));
    a->mask = c->bm;
    a->score_mod = NULL;
    a->score_mod_grad = NULL;
    a->score_ctx = NULL;
    for (int i = 0; i < 64; i++)
        c->slopes[i] = 0.5f / (float)(1 << (i % 6));
    c->r = (ref_attn){.B = a->B, .Hq = a->Hq, .Hkv = a->Hkv, .Lq = a->Lq, .Lkv = a->Lkv, .D = a->D, .Dv = a->Dv,
                      .scale = a->scale != 0.0f ? a->scale : 1.0 / sqrt((double)a->D), .q_offset = a->q_offset,
                      .mask = c->mask, .mask_ctx = c->mask_ctx, .mask_B = mB, .mask_H = mH};
    switch (mod) {
    case MOD_ALIBI:
        c->alibi.slopes = c->slopes;
        a->score_mod = fx_score_alibi;
        a->score_ctx = &c->alibi;
        c->r.mod = mod_alibi;
        c->r.mod_grad = grad_one;
        break;
    case MOD_SOFTCAP:
        c->cap.cap = 1.5f;
        a->score_mod = fx_score_softcap;
        a->score_mod_grad = fx_score_softcap_grad;
        a->score_ctx = &c->cap;
        c->r.mod = mod_softcap;
        c->r.mod_grad = grad_softcap;
        break;
    case MOD_BIAS_SHARED:
    case MOD_BIAS_HEADS: {
        int64_t heads = mod == MOD_BIAS_SHARED ? 1 : a->Hq, size = 2 * L - 15; /* clamps at both ends */
        c->table = fxt_random((size_t)(heads * size), -1.0f, 1.0f, 77);
        c->bias = (fx_score_rel_bias_ctx){.table = c->table, .grad_table = NULL, .size = size, .zero = L - 9,
                                          .heads = heads};
        a->score_mod = fx_score_rel_bias;
        a->score_mod_grad = mod == MOD_BIAS_HEADS ? fx_score_rel_bias_grad : NULL; /* built-in either way */
        a->score_ctx = &c->bias;
        c->r.mod = mod_rel_bias;
        c->r.mod_grad = grad_one;
        c->r.table_index = bias_index;
        break;
    }
    case MOD_CUSTOM:
        a->score_mod = mod_custom;
        a->score_mod_grad = grad_custom;
        c->r.mod = mod_custom_d;
        c->r.mod_grad = grad_custom_d;
        break;
    default:
        break;
    }
    c->r.mod_ctx = a->score_ctx;
}

static void bcase_free(bcase *c)
{
    fx_block_mask_free(c->bm);
    free(c->doc_ids);
    free(c->table);
}

/* Runs forward + backward of a case on the current path and compares every gradient (and the
   table's, for rel_bias) against the float64 reference. Outputs carry guard zones. */
static void check_case(bcase *c, const char *what, uint64_t seed)
{
    fx_attention *a = &c->a;
    size_t nq = (size_t)(a->B * a->Hq * a->Lq * a->D), nk = (size_t)(a->B * a->Hkv * a->Lkv * a->D);
    size_t nv = (size_t)(a->B * a->Hkv * a->Lkv * a->Dv), no = (size_t)(a->B * a->Hq * a->Lq * a->Dv);
    size_t nl = (size_t)(a->B * a->Hq * a->Lq);
    float *q = fxt_random(nq, -1.5f, 1.5f, seed), *k = fxt_random(nk, -1.5f, 1.5f, seed + 1);
    float *v = fxt_random(nv, -1.0f, 1.0f, seed + 2), *dout = fxt_random(no, -1.0f, 1.0f, seed + 3);
    float *out = fxt_guarded(no), *lse = fxt_guarded(nl);
    float *dq = fxt_guarded(nq), *dk = fxt_guarded(nk), *dv = fxt_guarded(nv);
    double *rq = fxt_alloc_f64(nq), *rk = fxt_alloc_f64(nk), *rv = fxt_alloc_f64(nv);
    float *gt = NULL;
    double *rt = NULL;
    size_t nt = 0;
    if (c->table) {
        nt = (size_t)(c->bias.heads * c->bias.size);
        gt = fxt_guarded(nt);
        for (size_t i = 0; i < nt; i++)
            gt[i] = 0.25f; /* accumulated into, not overwritten */
        rt = fxt_alloc_f64(nt);
        for (size_t i = 0; i < nt; i++)
            rt[i] = 0.25;
        c->bias.grad_table = gt;
    }
    FXT_OK(fx_flex_attention(a, q, k, v, out, lse));
    FXT_OK(fx_flex_attention_backward(a, q, k, v, out, lse, dout, dq, dk, dv));
    ref_backward(&c->r, q, k, v, dout, rq, rk, rv, rt);
    char name[160];
    snprintf(name, sizeof name, "%s dq", what);
    fxt_close_f32(name, dq, rq, nq, 3e-5, 2e-3);
    snprintf(name, sizeof name, "%s dk", what);
    fxt_close_f32(name, dk, rk, nk, 3e-5, 2e-3);
    snprintf(name, sizeof name, "%s dv", what);
    fxt_close_f32(name, dv, rv, nv, 3e-5, 2e-3);
    if (gt) {
        snprintf(name, sizeof name, "%s grad_table", what);
        fxt_close_f32(name, gt, rt, nt, 1e-4, 2e-3);
        c->bias.grad_table = NULL;
    }
    for (size_t i = 0; i < nq; i++)
        if (!isfinite(dq[i])) {
            FXT_FAIL("%s: dq[%zu] = %g", what, i, (double)dq[i]);
            break;
        }
    fxt_guarded_free("out", out);
    fxt_guarded_free("lse", lse);
    fxt_guarded_free("dq", dq);
    fxt_guarded_free("dk", dk);
    fxt_guarded_free("dv", dv);
    fxt_guarded_free("grad_table", gt);
    free(q), free(k), free(v), free(dout), free(rq), free(rk), free(rv), free(rt);
}

/* The CPU paths to run each test on: scalar, then every vector path this machine has. */
static int n_paths(fx_isa *paths)
{
    fx_isa best = fx_get_isa();
    int n = 0;
    paths[n++] = FX_ISA_SCALAR;
    if (best >= FX_ISA_AVX2)
        paths[n++] = FX_ISA_AVX2;
    if (best >= FX_ISA_AVX512)
        paths[n++] = FX_ISA_AVX512;
    return n;
}

/* ---- tests ----------------------------------------------------------------------------------- */

/* Every mask x every mod, GQA 2, odd lengths (not multiples of the 16-wide blocks), D != Dv. */
static void test_all_masks_and_mods(void)
{
    fx_isa paths[3], saved = fx_get_isa();
    int np = n_paths(paths);
    for (int p = 0; p < np; p++) {
        fx_set_isa(paths[p]);
        for (int mk = 0; mk < N_MASKS; mk++)
            for (int md = 0; md < N_MODS; md++) {
                /* Paths other than the best one: each mask once, mods in turn. */
                if (paths[p] != saved && md != mk % N_MODS)
                    continue;
                bcase c = {.a = {.B = 2, .Hq = 4, .Hkv = 2, .Lq = 45, .Lkv = 45, .D = 12, .Dv = 9}};
                c.mask_len = 45;
                bcase_init(&c, mk, md, 16);
                char what[96];
                snprintf(what, sizeof what, "%s/%s/%s", fx_isa_name(paths[p]), mask_names[mk], mod_names[md]);
                check_case(&c, what, 100 + (uint64_t)(mk * 10 + md));
                bcase_free(&c);
            }
    }
    fx_set_isa(saved);
}

/* GQA ratios 1, 4, 8, D = 40, a non-default scale, default 128 blocks with short lengths. */
static void test_gqa_and_shapes(void)
{
    static const int64_t hq[] = {2, 4, 8, 8}, hkv[] = {2, 1, 1, 4}, lq[] = {7, 130, 33, 1}, dd[] = {40, 16, 8, 24};
    fx_isa paths[3], saved = fx_get_isa();
    int np = n_paths(paths);
    for (int p = 0; p < np; p++) {
        fx_set_isa(paths[p]);
        for (int i = 0; i < 4; i++) {
            for (int mk = 0; mk < 3; mk++) {
                if (paths[p] != saved && mk != (i % 3)) /* other paths: one mask per shape */
                    continue;
                bcase c = {.a = {.B = 1, .Hq = hq[i], .Hkv = hkv[i], .Lq = lq[i], .Lkv = lq[i] + 3 * i, .D = dd[i],
                                 .Dv = 40 - dd[i] + 1, .scale = i == 2 ? 0.3f : 0.0f}};
                c.mask_len = c.a.Lkv > c.a.Lq ? c.a.Lkv : c.a.Lq;
                bcase_init(&c, mk == 0 ? MASK_NONE : mk == 1 ? MASK_CAUSAL : MASK_SLIDING, i == 3 ? MOD_ALIBI : MOD_SOFTCAP,
                           i == 1 ? 32 : 0);
                char what[96];
                snprintf(what, sizeof what, "%s/gqa %lld:%lld L %lld D %lld mask %d", fx_isa_name(paths[p]),
                         (long long)hq[i], (long long)hkv[i], (long long)lq[i], (long long)dd[i], mk);
                check_case(&c, what, 300 + (uint64_t)i);
                bcase_free(&c);
            }
        }
    }
    fx_set_isa(saved);
}

/* Queries at q_offset of a longer mask, and Lkv shorter than the mask's kv_len (a KV cache). */
static void test_q_offset(void)
{
    fx_isa paths[3], saved = fx_get_isa();
    int np = n_paths(paths);
    for (int p = 0; p < np; p++) {
        fx_set_isa(paths[p]);
        for (int mk = 0; mk < N_MASKS; mk += 2) {
            if (paths[p] != saved && mk != MASK_SLIDING && mk != MASK_OR)
                continue;
            bcase c = {.a = {.B = 2, .Hq = 4, .Hkv = 1, .Lq = 21, .Lkv = 61, .D = 8, .Dv = 8, .q_offset = 37}};
            c.mask_len = 80;
            c.block_kv = 40; /* blocks that are not squares, keys not a multiple of 16 */
            bcase_init(&c, mk, mk == MASK_SLIDING ? MOD_BIAS_HEADS : MOD_CUSTOM, 16);
            char what[96];
            snprintf(what, sizeof what, "%s/q_offset/%s", fx_isa_name(paths[p]), mask_names[mk]);
            check_case(&c, what, 500 + (uint64_t)mk);
            bcase_free(&c);
        }
    }
    fx_set_isa(saved);
}

/* Rows with no visible key: zero gradients, no NaN, the rest still right. */
static void test_fully_masked_rows(void)
{
    bcase c = {.a = {.B = 1, .Hq = 2, .Hkv = 1, .Lq = 40, .Lkv = 40, .D = 8, .Dv = 8}};
    c.mask_len = 40;
    bcase_init(&c, MASK_CUSTOM, MOD_SOFTCAP, 16);
    check_case(&c, "fully masked rows", 700);
    /* dq of the masked rows is exactly 0 */
    size_t n = (size_t)(2 * 40 * 8);
    float *q = fxt_random(n, -1, 1, 1), *k = fxt_random(40 * 8, -1, 1, 2), *v = fxt_random(40 * 8, -1, 1, 3);
    float *dout = fxt_random(n, -1, 1, 4), *out = malloc(n * 4), *lse = malloc(80 * 4);
    float *dq = malloc(n * 4), *dk = malloc(320 * 4), *dv = malloc(320 * 4);
    FXT_OK(fx_flex_attention(&c.a, q, k, v, out, lse));
    FXT_OK(fx_flex_attention_backward(&c.a, q, k, v, out, lse, dout, dq, dk, dv));
    for (int h = 0; h < 2; h++)
        for (int r = 3; r < 40; r += 5) {
            FXT_CHECK(lse[h * 40 + r] == -INFINITY);
            for (int d = 0; d < 8; d++)
                FXT_CHECK(dq[(h * 40 + r) * 8 + d] == 0.0f);
        }
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
    bcase_free(&c);
}

/* The float64 reference gradients against central differences of the float64 loss, for a
   custom mod, softcap and the bias table: this is what makes the reference trustworthy. */
static void test_reference_finite_differences(void)
{
    for (int md = 0; md < N_MODS; md++) {
        bcase c = {.a = {.B = 1, .Hq = 2, .Hkv = 1, .Lq = 9, .Lkv = 11, .D = 4, .Dv = 3, .q_offset = 2}};
        c.mask_len = 11;
        bcase_init(&c, md % 2 ? MASK_SLIDING : MASK_CUSTOM, md, 4);
        ref_attn *r = &c.r;
        size_t nq = 2 * 9 * 4, nk = 11 * 4, nv = 11 * 3, no = 2 * 9 * 3;
        float *q = fxt_random(nq, -1, 1, 11), *k = fxt_random(nk, -1, 1, 12), *v = fxt_random(nv, -1, 1, 13);
        float *dout = fxt_random(no, -1, 1, 14);
        double *gq = fxt_alloc_f64(nq), *gk = fxt_alloc_f64(nk), *gv = fxt_alloc_f64(nv);
        size_t nt = c.table ? (size_t)(c.bias.heads * c.bias.size) : 0;
        double *gt = fxt_alloc_f64(nt);
        ref_backward(r, q, k, v, dout, gq, gk, gv, nt ? gt : NULL);
        float *xs[3] = {q, k, v};
        double *gs[3] = {gq, gk, gv};
        size_t ns[3] = {nq, nk, nv};
        for (int t = 0; t < 4; t++) {
            float *x = t < 3 ? xs[t] : c.table;
            double *g = t < 3 ? gs[t] : gt;
            size_t n = t < 3 ? ns[t] : nt;
            for (size_t i = 0; i < n; i++) {
                float x0 = x[i];
                float xp = x0 + 1e-3f, xm = x0 - 1e-3f;
                x[i] = xp;
                double lp = ref_loss(r, q, k, v, dout);
                x[i] = xm;
                double lm = ref_loss(r, q, k, v, dout);
                x[i] = x0;
                double fd = (lp - lm) / ((double)xp - (double)xm);
                FXT_NEAR(g[i], fd, 1e-5, 1e-3);
            }
        }
        free(q), free(k), free(v), free(dout), free(gq), free(gk), free(gv), free(gt);
        bcase_free(&c);
    }
}

/* The library's gradients against differences of the library's own float32 forward: checks
   that the backward differentiates what the forward computes (loose: float32 loss). */
static void test_library_finite_differences(void)
{
    bcase c = {.a = {.B = 1, .Hq = 2, .Hkv = 1, .Lq = 10, .Lkv = 12, .D = 4, .Dv = 4}};
    c.mask_len = 12;
    bcase_init(&c, MASK_SLIDING, MOD_CUSTOM, 4);
    size_t nq = 2 * 10 * 4, nk = 12 * 4, no = 2 * 10 * 4;
    float *q = fxt_random(nq, -1, 1, 21), *k = fxt_random(nk, -1, 1, 22), *v = fxt_random(nk, -1, 1, 23);
    float *dout = fxt_random(no, -1, 1, 24), *out = malloc(no * 4), *lse = malloc(20 * 4);
    float *dq = malloc(nq * 4), *dk = malloc(nk * 4), *dv = malloc(nk * 4);
    FXT_OK(fx_flex_attention(&c.a, q, k, v, out, lse));
    FXT_OK(fx_flex_attention_backward(&c.a, q, k, v, out, lse, dout, dq, dk, dv));
    float *xs[3] = {q, k, v}, *gs[3] = {dq, dk, dv};
    size_t ns[3] = {nq, nk, nk};
    for (int t = 0; t < 3; t++)
        for (size_t i = t; i < ns[t]; i += 5) {
            float x0 = xs[t][i];
            double l[2];
            for (int s = 0; s < 2; s++) {
                xs[t][i] = x0 + (s ? -1e-2f : 1e-2f);
                FXT_OK(fx_flex_attention(&c.a, q, k, v, out, NULL));
                double acc = 0;
                for (size_t j = 0; j < no; j++)
                    acc += (double)out[j] * dout[j];
                l[s] = acc;
            }
            xs[t][i] = x0;
            double fd = (l[0] - l[1]) / ((double)(x0 + 1e-2f) - (double)(x0 - 1e-2f));
            FXT_NEAR(gs[t][i], fd, 2e-3, 2e-2);
        }
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
    bcase_free(&c);
}

/* Bitwise: 1 vs 2 threads, one-pass vs two-pass walks, and a repeated run; with a bias
   table gradient too. */
static void test_determinism(void)
{
    fx_isa paths[3], saved = fx_get_isa();
    int np = n_paths(paths), saved_threads = fx_get_num_threads();
    for (int p = 0; p < np; p++) {
        fx_set_isa(paths[p]);
        for (int md = paths[p] == saved ? 0 : 1; md < 2; md++) {
            bcase c = {.a = {.B = 1, .Hq = 8, .Hkv = 2, .Lq = 200, .Lkv = 230, .D = 32, .Dv = 16, .q_offset = 30}};
            c.mask_len = 260;
            bcase_init(&c, md ? MASK_SLIDING : MASK_PER_HEAD, md ? MOD_BIAS_SHARED : MOD_SOFTCAP, 64);
            fx_attention *a = &c.a;
            size_t nq = (size_t)(8 * 200 * 32), nk = (size_t)(2 * 230 * 32), nv = (size_t)(2 * 230 * 16);
            size_t no = (size_t)(8 * 200 * 16), nt = c.table ? (size_t)c.bias.size : 0;
            float *q = fxt_random(nq, -2, 2, 31), *k = fxt_random(nk, -2, 2, 32), *v = fxt_random(nv, -1, 1, 33);
            float *dout = fxt_random(no, -1, 1, 34), *out = malloc(no * 4), *lse = malloc(1600 * 4);
            FXT_OK(fx_flex_attention(a, q, k, v, out, lse));
            float *g[4][4]; /* run x {dq, dk, dv, table} */
            static const int threads[4] = {1, 2, 2, 2}, modes[4] = {FX__BWD_AUTO, FX__BWD_ONE_PASS, FX__BWD_TWO_PASS,
                                                                     FX__BWD_AUTO};
            for (int run = 0; run < 4; run++) {
                fx_set_num_threads(threads[run]);
                fx__attention_backward_set_mode(modes[run]);
                g[run][0] = fxt_guarded(nq), g[run][1] = fxt_guarded(nk), g[run][2] = fxt_guarded(nv);
                g[run][3] = fxt_guarded(nt ? nt : 1);
                memset(g[run][3], 0, (nt ? nt : 1) * 4);
                c.bias.grad_table = nt ? g[run][3] : NULL;
                FXT_OK(fx_flex_attention_backward(a, q, k, v, out, lse, dout, g[run][0], g[run][1], g[run][2]));
            }
            fx__attention_backward_set_mode(FX__BWD_AUTO);
            c.bias.grad_table = NULL;
            static const char *nm[4] = {"dq", "dk", "dv", "grad_table"};
            size_t ns[4] = {nq, nk, nv, nt};
            for (int run = 1; run < 4; run++)
                for (int t = 0; t < 4; t++)
                    fxt_bitwise_f32(nm[t], g[0][t], g[run][t], ns[t]);
            for (int run = 0; run < 4; run++)
                for (int t = 0; t < 4; t++)
                    fxt_guarded_free(nm[t], g[run][t]);
            free(q), free(k), free(v), free(dout), free(out), free(lse);
            bcase_free(&c);
        }
    }
    fx_set_num_threads(saved_threads);
    fx_set_isa(saved);
}

/* The two-pass walk (what AUTO takes when there are fewer (batch, kv-head) pairs than
   threads) against the reference: masks shared by a GQA group and a mask per head. */
static void test_two_pass_matches_reference(void)
{
    fx_isa paths[3], saved = fx_get_isa();
    int np = n_paths(paths);
    for (int p = 0; p < np; p++) {
        fx_set_isa(paths[p]);
        fx__attention_backward_set_mode(FX__BWD_TWO_PASS);
        static const int masks[] = {MASK_NONE, MASK_CAUSAL, MASK_DOCUMENT, MASK_PER_HEAD};
        for (int i = 0; i < 4; i++) {
            int mk = masks[i];
            bcase c = {.a = {.B = 1, .Hq = 4, .Hkv = 2, .Lq = 50, .Lkv = 47, .D = 16, .Dv = 16, .q_offset = 3}};
            c.mask_len = 53;
            c.block_kv = 24;
            bcase_init(&c, mk, MOD_CUSTOM, 32);
            char what[96];
            snprintf(what, sizeof what, "%s/two-pass/%s", fx_isa_name(paths[p]), mask_names[mk]);
            check_case(&c, what, 900 + (uint64_t)mk);
            bcase_free(&c);
        }
        fx__attention_backward_set_mode(FX__BWD_AUTO);
    }
    fx_set_isa(saved);
}

/* Scores around 1e3..1e4 (a large scale): exp(s - lse) must not overflow; gradients stay
   finite and close to the reference (looser: an ulp of a score of 1e4 is 1e-3). */
static void test_large_scores(void)
{
    fx_isa paths[3], saved = fx_get_isa();
    int np = n_paths(paths);
    for (int p = 0; p < np; p++) {
        fx_set_isa(paths[p]);
        bcase c = {.a = {.B = 1, .Hq = 2, .Hkv = 1, .Lq = 40, .Lkv = 40, .D = 16, .Dv = 8, .scale = 2000.0f}};
        c.mask_len = 40;
        bcase_init(&c, MASK_CAUSAL, MOD_NONE, 16);
        size_t nq = 2 * 40 * 16, nk = 40 * 16, nv = 40 * 8, no = 2 * 40 * 8;
        float *q = fxt_random(nq, -1, 1, 61), *k = fxt_random(nk, -1, 1, 62), *v = fxt_random(nv, -1, 1, 63);
        float *dout = fxt_random(no, -1, 1, 64), *out = malloc(no * 4), *lse = malloc(80 * 4);
        float *dq = fxt_guarded(nq), *dk = fxt_guarded(nk), *dv = fxt_guarded(nv);
        double *rq = fxt_alloc_f64(nq), *rk = fxt_alloc_f64(nk), *rv = fxt_alloc_f64(nv);
        FXT_OK(fx_flex_attention(&c.a, q, k, v, out, lse));
        FXT_OK(fx_flex_attention_backward(&c.a, q, k, v, out, lse, dout, dq, dk, dv));
        ref_backward(&c.r, q, k, v, dout, rq, rk, rv, NULL);
        FXT_CHECK(fabsf(lse[39]) > 100.0f);
        /* P is nearly one-hot, so the gradients stay O(1) while the scores are O(1e3). */
        fxt_close_f32("large dq", dq, rq, nq, 2e-2, 2e-2);
        fxt_close_f32("large dk", dk, rk, nk, 2e-2, 2e-2);
        fxt_close_f32("large dv", dv, rv, nv, 1e-2, 2e-2);
        fxt_guarded_free("dq", dq), fxt_guarded_free("dk", dk), fxt_guarded_free("dv", dv);
        free(q), free(k), free(v), free(dout), free(out), free(lse), free(rq), free(rk), free(rv);
        bcase_free(&c);
    }
    fx_set_isa(saved);
}

static void test_errors(void)
{
    bcase c = {.a = {.B = 1, .Hq = 2, .Hkv = 1, .Lq = 8, .Lkv = 8, .D = 4, .Dv = 4}};
    c.mask_len = 8;
    bcase_init(&c, MASK_CAUSAL, MOD_CUSTOM, 4);
    float *q = fxt_random(64, -1, 1, 1), *k = fxt_random(32, -1, 1, 2), *v = fxt_random(32, -1, 1, 3);
    float *dout = fxt_random(64, -1, 1, 4), *out = malloc(64 * 4), *lse = malloc(16 * 4);
    FXT_OK(fx_flex_attention(&c.a, q, k, v, out, lse));
    float *dq = fxt_guarded(64), *dk = fxt_guarded(32), *dv = fxt_guarded(32);
    fx_attention a = c.a;
    a.score_mod_grad = NULL;
    FXT_STATUS(fx_flex_attention_backward(&a, q, k, v, out, lse, dout, dq, dk, dv), FX_EINVAL, "score_mod_grad");
    FXT_STATUS(fx_flex_attention_backward(&c.a, q, k, v, out, NULL, dout, dq, dk, dv), FX_EINVAL, "lse");
    FXT_STATUS(fx_flex_attention_backward(&c.a, q, k, v, NULL, lse, dout, dq, dk, dv), FX_EINVAL, "out");
    FXT_STATUS(fx_flex_attention_backward(&c.a, q, k, v, out, lse, NULL, dq, dk, dv), FX_EINVAL, "dout");
    FXT_STATUS(fx_flex_attention_backward(&c.a, q, k, v, out, lse, dout, dq, NULL, dv), FX_EINVAL, "dk");
    FXT_STATUS(fx_flex_attention_backward(&c.a, NULL, k, v, out, lse, dout, dq, dk, dv), FX_EINVAL, "q");
    /* Gradients written over an input (or each other) would be read back by later tiles. */
    float *qc = malloc(64 * 4), *doc = malloc(64 * 4), *kc = malloc(32 * 4);
    memcpy(qc, q, 64 * 4), memcpy(doc, dout, 64 * 4), memcpy(kc, k, 32 * 4);
    FXT_STATUS(fx_flex_attention_backward(&c.a, qc, k, v, out, lse, dout, qc, dk, dv), FX_EINVAL,
               "dq overlaps the input q");
    FXT_STATUS(fx_flex_attention_backward(&c.a, q, kc, v, out, lse, dout, dq, kc, dv), FX_EINVAL,
               "dk overlaps the input k");
    FXT_STATUS(fx_flex_attention_backward(&c.a, q, k, v, out, lse, doc, doc, dk, dv), FX_EINVAL,
               "dq overlaps the input dout");
    FXT_STATUS(fx_flex_attention_backward(&c.a, q, k, v, out, lse, dout, dq, dk, out + 8), FX_EINVAL,
               "dv overlaps the input out");
    FXT_STATUS(fx_flex_attention_backward(&c.a, q, k, v, out, lse, dout, dq, dk, dk + 4), FX_EINVAL,
               "dv overlaps dk");
    free(qc), free(doc), free(kc);
    a = c.a;
    a.Hkv = 3;
    FXT_STATUS(fx_flex_attention_backward(&a, q, k, v, out, lse, dout, dq, dk, dv), FX_EINVAL, "Hkv");
    a = c.a;
    a.Lq = 9;
    FXT_STATUS(fx_flex_attention_backward(&a, q, k, v, out, lse, dout, dq, dk, dv), FX_EINVAL, "q_len");
    FXT_STATUS(fx_flex_attention_backward(NULL, q, k, v, out, lse, dout, dq, dk, dv), FX_EINVAL, "NULL");
    /* Built-in mods need no derivative from the caller. */
    fx_score_softcap_ctx cap = {.cap = 2.0f};
    a = c.a;
    a.score_mod = fx_score_softcap;
    a.score_mod_grad = NULL;
    a.score_ctx = &cap;
    FXT_OK(fx_flex_attention(&a, q, k, v, out, lse));
    /* Outputs untouched by the failed calls above: still the guard pattern. */
    uint32_t bitsv;
    memcpy(&bitsv, dq, 4);
    FXT_EQ_INT(bitsv, FXT_GUARD_BITS);
    FXT_OK(fx_flex_attention_backward(&a, q, k, v, out, lse, dout, dq, dk, dv));
    fxt_guarded_free("dq", dq);
    fxt_guarded_free("dk", dk);
    fxt_guarded_free("dv", dv);
    free(q), free(k), free(v), free(dout), free(out), free(lse);
    bcase_free(&c);
}

/* rel_bias's zero is any int64_t: far out, every distance clamps to one end of the table, in
   the forward and in the table's gradient, exactly as a zero just past the distances does. */
static void test_rel_bias_far_zero(void)
{
    fx_attention a = {.B = 1, .Hq = 2, .Hkv = 1, .Lq = 40, .Lkv = 40, .D = 8, .Dv = 8};
    const size_t nq = 2 * 40 * 8, nk = 40 * 8;
    float *q = fxt_random(nq, -1, 1, 11), *k = fxt_random(nk, -1, 1, 12), *v = fxt_random(nk, -1, 1, 13);
    float *dout = fxt_random(nq, -1, 1, 14), table[5] = {0.3f, -0.2f, 0.1f, 0.5f, -0.4f};
    const int64_t zeros[2][2] = {{INT64_MAX, 1000}, {INT64_MIN, -1000}};
    fx_isa saved = fx_get_isa();
    fx_set_isa(FX_ISA_SCALAR); /* both runs through the generic tile call */
    for (int z = 0; z < 2; z++) {
        float *out[2], *lse[2], *dq[2], *dk[2], *dv[2], gt[2][5];
        for (int r = 0; r < 2; r++) {
            memset(gt[r], 0, sizeof gt[r]);
            fx_score_rel_bias_ctx rb = {.table = table, .grad_table = gt[r], .size = 5, .zero = zeros[z][r], .heads = 1};
            a.score_mod = fx_score_rel_bias, a.score_mod_grad = fx_score_rel_bias_grad, a.score_ctx = &rb;
            out[r] = fxt_guarded(nq), lse[r] = fxt_guarded(80), dq[r] = fxt_guarded(nq);
            dk[r] = fxt_guarded(nk), dv[r] = fxt_guarded(nk);
            FXT_OK(fx_flex_attention(&a, q, k, v, out[r], lse[r]));
            FXT_OK(fx_flex_attention_backward(&a, q, k, v, out[r], lse[r], dout, dq[r], dk[r], dv[r]));
        }
        fxt_bitwise_f32("far zero out", out[0], out[1], nq);
        fxt_bitwise_f32("far zero dq", dq[0], dq[1], nq);
        fxt_bitwise_f32("far zero dk", dk[0], dk[1], nk);
        fxt_bitwise_f32("far zero table grad", gt[0], gt[1], 5);
        for (int r = 0; r < 2; r++) {
            fxt_guarded_free("out", out[r]), fxt_guarded_free("lse", lse[r]), fxt_guarded_free("dq", dq[r]);
            fxt_guarded_free("dk", dk[r]), fxt_guarded_free("dv", dv[r]);
        }
    }
    fx_set_isa(saved);
    free(q), free(k), free(v), free(dout);
}

/* ---- products in bfloat16 (FX__ATTN_BF16) ------------------------------------------------------ */

/* sqrt(sum (got - ref)^2 / sum ref^2) over the finite elements of ref; an element where ref
   is infinite (a fully masked row's lse) must be equal, or the result is infinite. */
static double rel_l2(const float *got, const double *ref, size_t n)
{
    double d2 = 0.0, r2 = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(ref[i])) {
            d2 += got[i] == ref[i] ? 0.0 : INFINITY;
            continue;
        }
        d2 += (got[i] - ref[i]) * (got[i] - ref[i]);
        r2 += ref[i] * ref[i];
    }
    return sqrt(d2 / (r2 > 0.0 ? r2 : 1.0));
}

/* One case with the products in bfloat16: forward and backward against the float64
   reference, each output within 1% of it in L2 norm (bfloat16 keeps 8 bits, 0.4% an
   operand; seen: 0.2-0.4%), not float32's bits, and the same bits at 1 and 2 threads and in
   both backward walks. Where the CPU has no vdpbf16ps path the call is float32's to the bit. */
static void check_bf16_case(bcase *c, const char *what, uint64_t seed)
{
    const fx_attention *a = &c->a;
    const size_t nq = (size_t)(a->B * a->Hq * a->Lq * a->D), nk = (size_t)(a->B * a->Hkv * a->Lkv * a->D);
    const size_t nv = (size_t)(a->B * a->Hkv * a->Lkv * a->Dv), no = (size_t)(a->B * a->Hq * a->Lq * a->Dv);
    const size_t nl = (size_t)(a->B * a->Hq * a->Lq);
    float *q = fxt_random(nq, -1.5f, 1.5f, seed), *k = fxt_random(nk, -1.5f, 1.5f, seed + 1);
    float *v = fxt_random(nv, -1.0f, 1.0f, seed + 2), *dout = fxt_random(no, -1.0f, 1.0f, seed + 3);
    /* [run][out, lse, dq, dk, dv]: run 0 float32, 1 bf16 at 2 threads, 2 at 1 thread, 3 two-pass */
    const size_t ns[5] = {no, nl, nq, nk, nv};
    static const char *nm[5] = {"out", "lse", "dq", "dk", "dv"};
    float *x[4][5];
    const int saved_threads = fx_get_num_threads();
    for (int run = 0; run < 4; run++) {
        for (int t = 0; t < 5; t++)
            x[run][t] = fxt_guarded(ns[t]);
        fx_set_num_threads(run == 2 ? 1 : 2);
        fx__attention_backward_set_mode(run == 3 ? FX__BWD_TWO_PASS : FX__BWD_AUTO);
        const unsigned flags = run == 0 ? 0u : FX__ATTN_BF16;
        FXT_OK(fx__flex_attention_with(a, flags, q, k, v, x[run][0], x[run][1]));
        FXT_OK(fx__flex_attention_backward_with(a, flags, q, k, v, x[run][0], x[run][1], dout, x[run][2], x[run][3],
                                                x[run][4]));
    }
    fx__attention_backward_set_mode(FX__BWD_AUTO);
    fx_set_num_threads(saved_threads);
    char name[160];
    for (int t = 0; t < 5; t++)
        for (int run = 2; run < 4; run++) {
            snprintf(name, sizeof name, "%s bf16 %s, %s", what, nm[t], run == 2 ? "1 vs 2 threads" : "two-pass walk");
            fxt_bitwise_f32(name, x[1][t], x[run][t], ns[t]);
        }
    if (!fx__attn16_kernels_now()) {
        for (int t = 0; t < 5; t++) {
            snprintf(name, sizeof name, "%s: bf16 %s without a vdpbf16ps path", what, nm[t]);
            fxt_bitwise_f32(name, x[0][t], x[1][t], ns[t]);
        }
    } else {
        double *ro = fxt_alloc_f64(no), *rl = fxt_alloc_f64(nl), *rq = fxt_alloc_f64(nq), *rk = fxt_alloc_f64(nk);
        double *rv = fxt_alloc_f64(nv);
        ref_forward(&c->r, q, k, v, ro, rl);
        ref_backward(&c->r, q, k, v, dout, rq, rk, rv, NULL);
        const double *ref[5] = {ro, rl, rq, rk, rv};
        bool differs = false;
        for (int t = 0; t < 5; t++) {
            const double e = rel_l2(x[1][t], ref[t], ns[t]);
            if (!(e <= 1e-2))
                FXT_FAIL("%s: bf16 %s off the reference by %.3g of its norm", what, nm[t], e);
            differs = differs || memcmp(x[0][t], x[1][t], ns[t] * sizeof(float)) != 0;
        }
        if (!differs)
            FXT_FAIL("%s: bf16 products gave float32's bits (the path was not taken)", what);
        free(ro), free(rl), free(rq), free(rk), free(rv);
    }
    for (int run = 0; run < 4; run++)
        for (int t = 0; t < 5; t++)
            fxt_guarded_free(nm[t], x[run][t]);
    free(q), free(k), free(v), free(dout);
}

#ifdef FXT_HAVE_SIMDE
extern const fx__attn16_kernels fxt_attn16_kernels_simde;
#endif

/* Masks and mods with odd lengths, odd D and Dv (a pair half past the end), GQA, and the
   trainer's shape (full and diagonal 128-blocks, causal without a mask as well). */
static void bf16_cases(const char *tag)
{
    static const struct {
        int mask, mod;
        int64_t B, Hq, Hkv, L, D, Dv, block;
    } cases[] = {
        {MASK_NONE, MOD_NONE, 2, 4, 2, 45, 12, 9, 16},       {MASK_CAUSAL, MOD_SOFTCAP, 2, 4, 2, 45, 13, 11, 16},
        {MASK_SLIDING, MOD_ALIBI, 1, 4, 1, 77, 16, 16, 32},  {MASK_DOCUMENT, MOD_CUSTOM, 2, 2, 2, 45, 8, 7, 16},
        {MASK_PER_HEAD, MOD_BIAS_HEADS, 1, 4, 2, 50, 24, 24, 16}, {MASK_CAUSAL, MOD_NONE, 2, 6, 2, 256, 64, 64, 128},
        {MASK_NONE, MOD_NONE, 1, 6, 2, 200, 64, 64, 0},       {MASK_CUSTOM, MOD_SOFTCAP, 1, 2, 1, 40, 8, 8, 16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bcase c = {.a = {.B = cases[i].B, .Hq = cases[i].Hq, .Hkv = cases[i].Hkv, .Lq = cases[i].L, .Lkv = cases[i].L,
                         .D = cases[i].D, .Dv = cases[i].Dv}};
        c.mask_len = cases[i].L;
        bcase_init(&c, cases[i].mask, cases[i].mod, cases[i].block);
        char what[128];
        snprintf(what, sizeof what, "%s/%s L=%lld D=%lld%s", mask_names[cases[i].mask], mod_names[cases[i].mod],
                 (long long)cases[i].L, (long long)cases[i].D, tag);
        check_bf16_case(&c, what, 900 + 10 * (uint64_t)i);
        bcase_free(&c);
    }
}

/* NaN in, NaN out with the products in bfloat16 too: a query row holding a NaN gives that
   row NaN in out, lse and dq (the rounding keeps NaN a NaN), and leaves the other rows
   finite. */
static void test_bf16_nan(void)
{
    const int64_t L = 40, D = 16;
    fx_block_mask *bm = NULL;
    FXT_OK(fx_block_mask_create(&bm, fx_mask_causal, NULL, 1, 1, L, L, 16, 16));
    const fx_attention a = {.B = 1, .Hq = 1, .Hkv = 1, .Lq = L, .Lkv = L, .D = D, .Dv = D, .mask = bm};
    float *q = fxt_random((size_t)(L * D), -1, 1, 5), *k = fxt_random((size_t)(L * D), -1, 1, 6);
    float *v = fxt_random((size_t)(L * D), -1, 1, 7), *dout = fxt_random((size_t)(L * D), -1, 1, 8);
    float *out = malloc((size_t)(L * D) * 4), *lse = malloc((size_t)L * 4), *dq = malloc((size_t)(L * D) * 4);
    float *dk = malloc((size_t)(L * D) * 4), *dv = malloc((size_t)(L * D) * 4);
    q[5 * D + 3] = NAN;
    FXT_OK(fx__flex_attention_with(&a, FX__ATTN_BF16, q, k, v, out, lse));
    FXT_OK(fx__flex_attention_backward_with(&a, FX__ATTN_BF16, q, k, v, out, lse, dout, dq, dk, dv));
    for (int64_t r = 0; r < L; r++) {
        const bool want = r == 5;
        if (isnan(lse[r]) != want || isnan(out[r * D]) != want || isnan(dq[r * D]) != want)
            FXT_FAIL("row %lld: lse %g, out %g, dq %g (want %s)", (long long)r, (double)lse[r], (double)out[r * D],
                     (double)dq[r * D], want ? "NaN" : "finite");
    }
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
    fx_block_mask_free(bm);
}

/* The cases with the CPU's kernels, then with the backward's built from SIMDe (any CPU; the
   forward's strips stay the CPU's: bfloat16 where it has them, else float32). */
static void test_bf16_products(void)
{
    if (!fx__attn16_kernels_now())
        fprintf(stderr, "  (no vdpbf16ps path on this CPU: FX__ATTN_BF16 checked to give float32's bits)\n");
    bf16_cases("");
#ifdef FXT_HAVE_SIMDE
    fx__attn16_force(&fxt_attn16_kernels_simde);
    bf16_cases(" (SIMDe backward)");
    fx__attn16_force(NULL);
#else
    fprintf(stderr, "  (no SIMDe: the bfloat16 backward is tested only where the CPU has vdpbf16ps)\n");
#endif
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    FXT_RUN(test_reference_finite_differences);
    FXT_RUN(test_all_masks_and_mods);
    FXT_RUN(test_gqa_and_shapes);
    FXT_RUN(test_q_offset);
    FXT_RUN(test_fully_masked_rows);
    FXT_RUN(test_library_finite_differences);
    FXT_RUN(test_determinism);
    FXT_RUN(test_two_pass_matches_reference);
    FXT_RUN(test_large_scores);
    FXT_RUN(test_errors);
    FXT_RUN(test_rel_bias_far_zero);
    FXT_RUN(test_bf16_products);
    FXT_RUN(test_bf16_nan);
    return fxt_finish();
}
