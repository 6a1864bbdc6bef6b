/* The GPT: each layer against float64 references and finite differences, the whole model's
   gradient against finite differences (reference and flex attention, fused and unfused
   loss), decoding against the full forward, the optimizer, thread-count determinism. */
#include "harness.h"

#include "gpt/gpt.h"

#include <sys/stat.h>
#include <unistd.h>

/* A small model that still has every feature: GQA (4 query heads on 2 KV heads), 2 layers. */
static fx__gpt_config small_cfg(void)
{
    fx__gpt_config c;
    fx__gpt_preset(&c, "tiny");
    c.layers = 2, c.dim = 16, c.heads = 4, c.kv_heads = 2, c.ffn = 24, c.ctx = 16;
    return c;
}

static double dot_f64(const float *a, const double *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

/* ---- RMSNorm ---------------------------------------------------------------------------- */

static void rms_loss(const float *x, const float *w, const double *r, int64_t N, int64_t C, double *loss)
{
    float *y = malloc((size_t)(N * C) * sizeof(float)), *rs = malloc((size_t)N * sizeof(float));
    fx__rmsnorm_forward(y, rs, x, w, N, C, 1e-5f);
    *loss = dot_f64(y, r, (size_t)(N * C));
    free(y), free(rs);
}

static void test_rmsnorm(void)
{
    int64_t N = 5, C = 24;
    float *x = fxt_random((size_t)(N * C), -2, 2, 1), *w = fxt_random((size_t)C, 0.5f, 1.5f, 2);
    float *y = fxt_guarded((size_t)(N * C)), *rstd = fxt_guarded((size_t)N);
    fx__rmsnorm_forward(y, rstd, x, w, N, C, 1e-5f);
    double *ref = fxt_alloc_f64((size_t)(N * C));
    for (int64_t n = 0; n < N; n++) {
        double ss = 0;
        for (int64_t c = 0; c < C; c++)
            ss += (double)x[n * C + c] * x[n * C + c];
        double r = 1.0 / sqrt(ss / C + 1e-5);
        for (int64_t c = 0; c < C; c++)
            ref[n * C + c] = x[n * C + c] * r * w[c];
    }
    fxt_close_f32("rmsnorm out", y, ref, (size_t)(N * C), 1e-6, 1e-5);
    /* Backward against central differences of sum(y * r). */
    double *r = fxt_alloc_f64((size_t)(N * C));
    for (int64_t i = 0; i < N * C; i++)
        r[i] = sin(0.7 * (double)i);
    float *dy = malloc((size_t)(N * C) * sizeof(float));
    for (int64_t i = 0; i < N * C; i++)
        dy[i] = (float)r[i];
    float *dx = fxt_guarded((size_t)(N * C)), *dw = fxt_guarded((size_t)C);
    memset(dx, 0, (size_t)(N * C) * sizeof(float));
    memset(dw, 0, (size_t)C * sizeof(float));
    fx__rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C);
    double *gx = fxt_alloc_f64((size_t)(N * C)), *gw = fxt_alloc_f64((size_t)C);
    const float eps = 1e-2f;
    for (int64_t i = 0; i < N * C; i++) {
        double lp, lm;
        float keep = x[i];
        x[i] = keep + eps, rms_loss(x, w, r, N, C, &lp);
        x[i] = keep - eps, rms_loss(x, w, r, N, C, &lm);
        x[i] = keep;
        gx[i] = (lp - lm) / (2 * eps);
    }
    for (int64_t c = 0; c < C; c++) {
        double lp, lm;
        float keep = w[c];
        w[c] = keep + eps, rms_loss(x, w, r, N, C, &lp);
        w[c] = keep - eps, rms_loss(x, w, r, N, C, &lm);
        w[c] = keep;
        gw[c] = (lp - lm) / (2 * eps);
    }
    fxt_close_f32("rmsnorm dx", dx, gx, (size_t)(N * C), 2e-3, 1e-2);
    fxt_close_f32("rmsnorm dw", dw, gw, (size_t)C, 2e-3, 1e-2);
    fxt_guarded_free("y", y), fxt_guarded_free("rstd", rstd), fxt_guarded_free("dx", dx), fxt_guarded_free("dw", dw);
    free(x), free(w), free(ref), free(r), free(dy), free(gx), free(gw);
}

/* ---- RoPE, SwiGLU, embedding -------------------------------------------------------------- */

static void test_rope(void)
{
    int64_t B = 2, T = 6, H = 3, hd = 8, n = B * T * H * hd;
    float *rope = malloc((size_t)(16 * hd) * sizeof(float));
    fx__rope_table(rope, 16, hd, 10000.0f);
    float *x = fxt_random((size_t)n, -1, 1, 3), *y = fxt_guarded((size_t)n);
    fx__rope_forward(y, x, rope, B, T, H, hd, 0);
    double *ref = fxt_alloc_f64((size_t)n);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < hd / 2; i++) {
                    double ang = t * pow(10000.0, -2.0 * i / hd);
                    const float *s = x + ((b * T + t) * H + h) * hd;
                    double *d = ref + ((b * H + h) * T + t) * hd;
                    d[2 * i] = s[2 * i] * cos(ang) - s[2 * i + 1] * sin(ang);
                    d[2 * i + 1] = s[2 * i] * sin(ang) + s[2 * i + 1] * cos(ang);
                }
    fxt_close_f32("rope", y, ref, (size_t)n, 1e-6, 1e-5);
    /* Backward is the transpose: <rope(x), g> == <x, rope_backward(g)>. */
    float *g = fxt_random((size_t)n, -1, 1, 4), *dx = fxt_guarded((size_t)n);
    fx__rope_backward(dx, g, rope, B, T, H, hd);
    double lhs = 0, rhs = 0;
    for (int64_t i = 0; i < n; i++)
        lhs += (double)y[i] * g[i], rhs += (double)x[i] * dx[i];
    FXT_NEAR(lhs, rhs, 1e-4, 1e-5);
    /* A position offset rotates as the later positions do. */
    float *y2 = fxt_guarded((size_t)(H * hd));
    fx__rope_forward(y2, x + (5 * H) * hd, rope, 1, 1, H, hd, 5);
    for (int64_t h = 0; h < H; h++)
        fxt_bitwise_f32("rope offset", y2 + h * hd, y + (h * T + 5) * hd, (size_t)hd);
    fxt_guarded_free("y", y), fxt_guarded_free("dx", dx), fxt_guarded_free("y2", y2);
    free(rope), free(x), free(ref), free(g);
}

static void test_swiglu(void)
{
    int64_t n = 203; /* vector bodies and a tail */
    float *a = fxt_random((size_t)n, -4, 4, 5), *b = fxt_random((size_t)n, -2, 2, 6);
    float *g = fxt_random((size_t)n, -1, 1, 7);
    a[3] = -30.0f, a[4] = 30.0f, a[5] = -100.0f, a[6] = 0.0f; /* saturated sigmoid both ways */
    double *ro = fxt_alloc_f64((size_t)n), *rda = fxt_alloc_f64((size_t)n), *rdb = fxt_alloc_f64((size_t)n);
    for (int64_t i = 0; i < n; i++) {
        double s = 1 / (1 + exp(-(double)a[i])), h = 1e-4;
        ro[i] = a[i] * s * b[i];
        double ap = a[i] + h, am = a[i] - h;
        double fp = ap / (1 + exp(-ap)) * b[i], fm = am / (1 + exp(-am)) * b[i];
        rda[i] = g[i] * (fp - fm) / (2 * h);
        rdb[i] = g[i] * a[i] * s;
    }
    const fx_isa isas[] = {FX_ISA_SCALAR, FX_ISA_AVX2, FX_ISA_AVX512};
    fx_isa best = fx_get_isa();
    char what[64];
    for (size_t t = 0; t < sizeof isas / sizeof isas[0]; t++) {
        if (fx_set_isa(isas[t]) != FX_OK)
            continue;
        float *o = fxt_guarded((size_t)n), *da = fxt_guarded((size_t)n), *db = fxt_guarded((size_t)n);
        fx__swiglu_forward(o, a, b, n);
        fx__swiglu_backward(da, db, g, a, b, n);
        snprintf(what, sizeof what, "swiglu [%s]", fx_isa_name(isas[t]));
        fxt_close_f32(what, o, ro, (size_t)n, 1e-6, 1e-5);
        fxt_close_f32(what, da, rda, (size_t)n, 1e-5, 1e-4);
        fxt_close_f32(what, db, rdb, (size_t)n, 1e-6, 1e-5);
        /* In place over a and b (the model's backward does this): the same values. */
        float *ia = fxt_guarded_copy(a, (size_t)n), *ib = fxt_guarded_copy(b, (size_t)n);
        fx__swiglu_backward(ia, ib, g, ia, ib, n);
        fxt_bitwise_f32(what, ia, da, (size_t)n);
        fxt_bitwise_f32(what, ib, db, (size_t)n);
        fxt_guarded_free("ia", ia), fxt_guarded_free("ib", ib);
        fxt_guarded_free("o", o), fxt_guarded_free("da", da), fxt_guarded_free("db", db);
    }
    fx_set_isa(best);
    free(a), free(b), free(g), free(ro), free(rda), free(rdb);
}

static void test_embedding(void)
{
    int64_t V = 7, C = 70, N = 12; /* C > one channel block */
    int32_t tok[12] = {3, 1, 3, 6, 0, 3, 1, 2, 2, 5, 4, 3};
    float *wte = fxt_random((size_t)(V * C), -1, 1, 8), *out = fxt_guarded((size_t)(N * C));
    fx__embed_forward(out, tok, wte, N, C);
    for (int64_t n = 0; n < N; n++)
        fxt_bitwise_f32("embed row", out + n * C, wte + tok[n] * C, (size_t)C);
    float *g = fxt_random((size_t)(N * C), -1, 1, 9), *dw = fxt_guarded((size_t)(V * C));
    for (int64_t i = 0; i < V * C; i++)
        dw[i] = 0.5f;
    fx__embed_backward(dw, g, tok, N, C);
    double *ref = fxt_alloc_f64((size_t)(V * C));
    for (int64_t i = 0; i < V * C; i++)
        ref[i] = 0.5;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            ref[tok[n] * C + c] += g[n * C + c];
    fxt_close_f32("embed backward", dw, ref, (size_t)(V * C), 1e-6, 1e-6);
    fxt_guarded_free("out", out), fxt_guarded_free("dw", dw);
    free(wte), free(g), free(ref);
}

/* ---- reference attention and unfused loss ------------------------------------------------ */

static void attn_loss(const fx__attn_ref *a, const float *q, const float *k, const float *v, const double *r,
                      double *loss)
{
    size_t n = (size_t)(a->B * a->Hq * a->Lq * a->D);
    float *o = malloc(n * sizeof(float)), *lse = malloc((size_t)(a->B * a->Hq * a->Lq) * sizeof(float));
    fx__attn_ref_forward(a, q, k, v, o, lse);
    *loss = dot_f64(o, r, n);
    free(o), free(lse);
}

static void test_attn_ref_grad(void)
{
    /* Document mask with GQA and a query offset; the first document's last row is masked. */
    int64_t doc[2 * 6] = {0, 0, 1, 1, 1, 2, 0, 0, 0, 0, 0, 0};
    fx_mask_document_ctx mc = {.doc_ids = doc, .len = 6, .batch_stride = 6};
    fx__attn_ref a = {.B = 2, .Hq = 4, .Hkv = 2, .Lq = 6, .Lkv = 6, .D = 4, .q_offset = 0,
                      .mask = fx_mask_document, .ctx = &mc};
    size_t nq = 2 * 4 * 6 * 4, nk = 2 * 2 * 6 * 4;
    float *q = fxt_random(nq, -1, 1, 10), *k = fxt_random(nk, -1, 1, 11), *v = fxt_random(nk, -1, 1, 12);
    double *r = fxt_alloc_f64(nq);
    for (size_t i = 0; i < nq; i++)
        r[i] = cos(1.3 * (double)i);
    float *o = malloc(nq * sizeof(float)), *lse = malloc(48 * sizeof(float)), *dout = malloc(nq * sizeof(float));
    for (size_t i = 0; i < nq; i++)
        dout[i] = (float)r[i];
    fx__attn_ref_forward(&a, q, k, v, o, lse);
    float *dq = fxt_guarded(nq), *dk = fxt_guarded(nk), *dv = fxt_guarded(nk);
    fx__attn_ref_backward(&a, q, k, v, o, lse, dout, dq, dk, dv);
    float *ps[3] = {q, k, v}, *gs[3] = {dq, dk, dv};
    size_t ns[3] = {nq, nk, nk};
    for (int t = 0; t < 3; t++) {
        double *fd = fxt_alloc_f64(ns[t]);
        for (size_t i = 0; i < ns[t]; i++) {
            double lp, lm;
            float keep = ps[t][i];
            ps[t][i] = keep + 1e-2f, attn_loss(&a, q, k, v, r, &lp);
            ps[t][i] = keep - 1e-2f, attn_loss(&a, q, k, v, r, &lm);
            ps[t][i] = keep;
            fd[i] = (lp - lm) / 2e-2;
        }
        fxt_close_f32(t == 0 ? "dq" : t == 1 ? "dk" : "dv", gs[t], fd, ns[t], 2e-3, 1e-2);
        free(fd);
    }
    fxt_guarded_free("dq", dq), fxt_guarded_free("dk", dk), fxt_guarded_free("dv", dv);
    free(q), free(k), free(v), free(r), free(o), free(lse), free(dout);
}

static void test_loss_unfused(void)
{
    int64_t N = 6, D = 8, V = 11;
    float *h = fxt_random((size_t)(N * D), -1, 1, 13), *w = fxt_random((size_t)(V * D), -1, 1, 14);
    int64_t tgt[6] = {3, -100, 10, 0, 7, 3};
    float *logits = malloc((size_t)(N * V) * sizeof(float)), rl[6];
    float *dh = fxt_guarded((size_t)(N * D)), *dw = fxt_guarded((size_t)(V * D));
    memset(dw, 0, (size_t)(V * D) * sizeof(float));
    float loss = fx__loss_unfused(logits, rl, h, w, tgt, N, D, V, dh, dw);
    double ref = 0;
    int cnt = 0;
    for (int64_t n = 0; n < N; n++) {
        if (tgt[n] < 0)
            continue;
        double z[11], mx = -1e300, s = 0;
        for (int64_t j = 0; j < V; j++) {
            z[j] = 0;
            for (int64_t d = 0; d < D; d++)
                z[j] += (double)h[n * D + d] * w[j * D + d];
            mx = z[j] > mx ? z[j] : mx;
        }
        for (int64_t j = 0; j < V; j++)
            s += exp(z[j] - mx);
        ref += mx + log(s) - z[tgt[n]];
        cnt++;
    }
    FXT_NEAR(loss, ref / cnt, 1e-5, 1e-5);
    /* Gradient of h by central differences. */
    double *fd = fxt_alloc_f64((size_t)(N * D));
    for (int64_t i = 0; i < N * D; i++) {
        float keep = h[i];
        h[i] = keep + 1e-2f;
        float lp = fx__loss_unfused(logits, rl, h, w, tgt, N, D, V, NULL, NULL);
        h[i] = keep - 1e-2f;
        float lm = fx__loss_unfused(logits, rl, h, w, tgt, N, D, V, NULL, NULL);
        h[i] = keep;
        fd[i] = ((double)lp - lm) / 2e-2;
    }
    fxt_close_f32("unfused dh", dh, fd, (size_t)(N * D), 1e-3, 1e-2);
    fxt_guarded_free("dh", dh), fxt_guarded_free("dw", dw);
    free(h), free(w), free(logits), free(fd);
}

/* ---- the whole model ------------------------------------------------------------------------ */

static void make_batch(int64_t B, int64_t T, int64_t V, uint64_t seed, int32_t *tok, int32_t *tgt, bool eot)
{
    fx_rng r;
    fx_rng_init(&r, seed, 0);
    for (int64_t i = 0; i < B * T; i++) {
        tok[i] = (int32_t)(fx_rng_u32(&r) % (uint32_t)(V - 1));
        tgt[i] = (int32_t)(fx_rng_u32(&r) % (uint32_t)(V - 1));
    }
    if (eot) {
        tok[3] = FX__GPT_EOT;
        tok[T + 5] = FX__GPT_EOT;
    }
    tgt[2] = -100;
}

/* Whole-model gradient against central differences: every tensor's largest-gradient
   entries plus a random direction over the whole buffer. */
static void gradcheck(fx__gpt_attn_impl ai, fx__gpt_loss_impl li, fx__gpt_mask mask, int64_t window)
{
    fx__gpt_config c = small_cfg();
    fx__gpt *m = NULL;
    FXT_OK(fx__gpt_create(&m, &c, 42));
    if (!m)
        return;
    m->attn_impl = ai, m->loss_impl = li, m->mask = mask, m->window = window;
    int64_t B = 2, T = 12, V = c.vocab;
    FXT_OK(fx__gpt_alloc_train(m));
    FXT_OK(fx__gpt_set_batch(m, B, T));
    int32_t tok[24], tgt[24];
    make_batch(B, T, V, 7, tok, tgt, mask == FX__GPT_MASK_DOCUMENT);
    /* Matrices 5x the init, so every path carries a visible gradient. */
    for (size_t ti = 0; ti < m->lay.n; ti++)
        for (size_t j = 0; j < m->lay.t[ti].numel && m->lay.t[ti].ndim == 2; j++)
            m->params[m->lay.t[ti].offset + j] *= 5.0f;
    float loss;
    FXT_OK(fx__gpt_forward(m, tok, tgt, &loss, true));
    FXT_OK(fx__gpt_backward(m));
    const float eps = 1e-3f;
    int checked = 0;
    for (size_t ti = 0; ti < m->lay.n; ti++) {
        const fx__gpt_tensor *t = &m->lay.t[ti];
        /* The largest |grad| entry of the tensor and two others. */
        size_t best = 0;
        for (size_t j = 1; j < t->numel; j++)
            if (fabsf(m->grads[t->offset + j]) > fabsf(m->grads[t->offset + best]))
                best = j;
        for (int pick = 0; pick < 3; pick++) {
            size_t i = t->offset + (pick == 0 ? best : ((size_t)pick * 7919 + 13) % t->numel);
            float keep = m->params[i], lp, lm;
            m->params[i] = keep + eps;
            FXT_OK(fx__gpt_forward(m, tok, tgt, &lp, false));
            m->params[i] = keep - eps;
            FXT_OK(fx__gpt_forward(m, tok, tgt, &lm, false));
            m->params[i] = keep;
            double fd = ((double)lp - lm) / (2.0 * eps);
            double got = m->grads[i];
            if (fabs(got - fd) > 2e-3 + 3e-2 * fabs(fd)) {
                FXT_FAIL("%s[%zu]: grad %.6g vs finite difference %.6g", t->name, i - t->offset, got, fd);
            }
            checked++;
        }
    }
    FXT_CHECK(checked == (int)(3 * m->lay.n));
    /* Directional derivative over the whole buffer. */
    size_t P = m->lay.total;
    float *dir = fxt_random(P, -1, 1, 99), *p0 = malloc(P * sizeof(float));
    memcpy(p0, m->params, P * sizeof(float));
    double gd = 0.0;
    for (size_t i = 0; i < P; i++)
        gd += (double)dir[i] * m->grads[i];
    const float h = 1e-3f;
    float lp, lm;
    for (size_t i = 0; i < P; i++)
        m->params[i] = p0[i] + h * dir[i];
    FXT_OK(fx__gpt_forward(m, tok, tgt, &lp, false));
    for (size_t i = 0; i < P; i++)
        m->params[i] = p0[i] - h * dir[i];
    FXT_OK(fx__gpt_forward(m, tok, tgt, &lm, false));
    double fd = ((double)lp - lm) / (2.0 * h);
    FXT_NEAR(gd, fd, 1e-3, 2e-2);
    free(dir), free(p0);
    fx__gpt_free(m);
}

static void test_gradcheck_ref(void)
{
    gradcheck(FX__GPT_ATTN_REF, FX__GPT_LOSS_UNFUSED, FX__GPT_MASK_CAUSAL, 0);
    gradcheck(FX__GPT_ATTN_REF, FX__GPT_LOSS_UNFUSED, FX__GPT_MASK_SLIDING, 3);
    gradcheck(FX__GPT_ATTN_REF, FX__GPT_LOSS_UNFUSED, FX__GPT_MASK_DOCUMENT, 0);
}

static void test_gradcheck_flex(void)
{
    gradcheck(FX__GPT_ATTN_FLEX, FX__GPT_LOSS_FUSED, FX__GPT_MASK_CAUSAL, 0);
    gradcheck(FX__GPT_ATTN_FLEX, FX__GPT_LOSS_FUSED, FX__GPT_MASK_SLIDING, 3);
    gradcheck(FX__GPT_ATTN_FLEX, FX__GPT_LOSS_FUSED, FX__GPT_MASK_DOCUMENT, 0);
    gradcheck(FX__GPT_ATTN_FLEX, FX__GPT_LOSS_FUSED, FX__GPT_MASK_CAUSAL_DENSE, 0);
}

/* Flex + fused against reference + unfused: the same loss and gradients. */
static void test_flex_matches_reference(void)
{
    const char *masks[] = {"causal", "sliding:4", "document", "dense"};
    for (int mi = 0; mi < 4; mi++) {
        fx__gpt_config c = small_cfg();
        fx__gpt *a = NULL, *b = NULL;
        FXT_OK(fx__gpt_create(&a, &c, 3));
        FXT_OK(fx__gpt_create(&b, &c, 3));
        if (!a || !b)
            return;
        fx__gpt_mask mk;
        int64_t w;
        FXT_OK(fx__gpt_mask_parse(masks[mi], &mk, &w));
        a->mask = b->mask = mk, a->window = b->window = w;
        b->attn_impl = FX__GPT_ATTN_REF, b->loss_impl = FX__GPT_LOSS_UNFUSED;
        FXT_OK(fx__gpt_alloc_train(a));
        FXT_OK(fx__gpt_alloc_train(b));
        FXT_OK(fx__gpt_set_batch(a, 2, 16));
        FXT_OK(fx__gpt_set_batch(b, 2, 16));
        int32_t tok[32], tgt[32];
        make_batch(2, 16, c.vocab, 11, tok, tgt, true);
        float la, lb;
        FXT_OK(fx__gpt_forward(a, tok, tgt, &la, true));
        FXT_OK(fx__gpt_backward(a));
        FXT_OK(fx__gpt_forward(b, tok, tgt, &lb, true));
        FXT_OK(fx__gpt_backward(b));
        FXT_NEAR(la, lb, 1e-5, 1e-5);
        double *ref = fxt_alloc_f64(a->lay.total);
        for (size_t i = 0; i < a->lay.total; i++)
            ref[i] = b->grads[i];
        fxt_close_f32(masks[mi], a->grads, ref, a->lay.total, 1e-5, 1e-3);
        free(ref);
        fx__gpt_free(a), fx__gpt_free(b);
    }
}

/* Recomputing the layers in backward gives bitwise the gradients of keeping them. */
static void test_recompute_bitwise(void)
{
    const char *masks[] = {"causal", "document", "sliding:5", "dense"};
    for (int mi = 0; mi < 4; mi++) {
        fx__gpt_config c = small_cfg();
        fx__gpt *a = NULL, *b = NULL;
        FXT_OK(fx__gpt_create(&a, &c, 4));
        FXT_OK(fx__gpt_create(&b, &c, 4));
        if (!a || !b)
            return;
        FXT_OK(fx__gpt_mask_parse(masks[mi], &a->mask, &a->window));
        FXT_OK(fx__gpt_mask_parse(masks[mi], &b->mask, &b->window));
        b->recompute = true;
        FXT_OK(fx__gpt_alloc_train(a));
        FXT_OK(fx__gpt_alloc_train(b));
        FXT_OK(fx__gpt_set_batch(a, 2, 16));
        FXT_OK(fx__gpt_set_batch(b, 2, 16));
        FXT_CHECK(b->acts_floats < a->acts_floats);
        int32_t tok[32], tgt[32];
        make_batch(2, 16, c.vocab, 12, tok, tgt, true);
        float la, lb;
        FXT_OK(fx__gpt_forward(a, tok, tgt, &la, true));
        FXT_OK(fx__gpt_backward(a));
        FXT_OK(fx__gpt_forward(b, tok, tgt, &lb, true));
        FXT_OK(fx__gpt_backward(b));
        FXT_CHECK(la == lb);
        FXT_CHECK(!b->park.acts_parked); /* this model's layers are too small to park 32 tokens */
        fxt_bitwise_f32(masks[mi], b->grads, a->grads, a->lay.total);
        fx__gpt_free(a), fx__gpt_free(b);
    }
}


/* The gradient hook sees every region once, in the documented order, after it is final. */
typedef struct hook_log {
    int n, layer[64];
    size_t off[64], numel[64];
    const float *base;
    float first[64]; /* the region's first gradient when the hook saw it */
} hook_log;

static void record_hook(int layer, float *grad, size_t numel, void *user)
{
    hook_log *h = user;
    if (h->n < 64) {
        h->layer[h->n] = layer, h->off[h->n] = (size_t)(grad - h->base), h->numel[h->n] = numel;
        h->first[h->n] = grad[0];
        h->n++;
    }
}

static void test_grad_hook(void)
{
    fx__gpt_config c = small_cfg();
    fx__gpt *m = NULL;
    FXT_OK(fx__gpt_create(&m, &c, 3));
    if (!m)
        return;
    FXT_OK(fx__gpt_alloc_train(m));
    FXT_OK(fx__gpt_set_batch(m, 2, 8));
    hook_log h = {.base = m->grads};
    m->hooks.grad = record_hook, m->hooks.user = &h;
    int32_t tok[16], tgt[16];
    make_batch(2, 8, c.vocab, 3, tok, tgt, false);
    float loss;
    FXT_OK(fx__gpt_forward(m, tok, tgt, &loss, true));
    FXT_OK(fx__gpt_backward(m));
    FXT_EQ_INT(h.n, c.layers + 2);
    if (h.n != c.layers + 2)
        return;
    FXT_EQ_INT(h.layer[0], c.layers);
    FXT_EQ_INT(h.layer[h.n - 1], -1);
    size_t covered = 0;
    for (int i = 0; i < h.n; i++) {
        if (i > 0 && i < h.n - 1)
            FXT_EQ_INT(h.layer[i], c.layers - i);
        covered += h.numel[i];
        /* Final when seen: the backward does not change it afterwards. */
        FXT_CHECK(memcmp(&h.first[i], m->grads + h.off[i], sizeof(float)) == 0);
    }
    FXT_EQ_INT(covered, m->lay.total);
    FXT_EQ_INT(h.off[h.n - 1], 0);
    FXT_EQ_INT(h.off[0] + h.numel[0], m->lay.total);
    fx__gpt_free(m);
}

/* Decoding token by token (KV cache, q_offset, Lq = 1) gives the forward pass's loss. */
static void decode_check(fx__gpt_attn_impl ai, const char *mask)
{
    fx__gpt_config c = small_cfg();
    fx__gpt *m = NULL;
    FXT_OK(fx__gpt_create(&m, &c, 5));
    if (!m)
        return;
    m->attn_impl = ai;
    FXT_OK(fx__gpt_mask_parse(mask, &m->mask, &m->window));
    int64_t T = 16;
    int32_t tok[16], tgt[16];
    make_batch(1, T, c.vocab, 21, tok, tgt, false);
    tok[0] = FX__GPT_EOT;
    for (int64_t t = 0; t < T; t++)
        tgt[t] = t + 1 < T ? tok[t + 1] : 65;
    FXT_OK(fx__gpt_set_batch(m, 1, T));
    /* Weights 5x the init, so that attention shapes the logits well above the tolerance. */
    for (size_t ti = 0; ti < m->lay.n; ti++)
        for (size_t j = 0; j < m->lay.t[ti].numel && m->lay.t[ti].ndim == 2; j++)
            m->params[m->lay.t[ti].offset + j] *= 5.0f;
    fx__gpt_cache *kc = NULL;
    FXT_OK(fx__gpt_cache_create(&kc, m, 0));
    if (!kc)
        return;
    float *logits = fxt_guarded((size_t)c.vocab);
    /* A prefill of 5 tokens, then one at a time; after each call the logits are those of the
       last position fed, which a forward pass with only that target must agree with. */
    for (int64_t t = 0; t < T;) {
        int64_t n = t == 0 ? 5 : 1;
        FXT_OK(fx__gpt_decode(m, kc, tok + t, n, logits));
        t += n;
        double mx = -1e300, s = 0;
        for (int64_t v = 0; v < c.vocab; v++)
            mx = logits[v] > mx ? logits[v] : mx;
        for (int64_t v = 0; v < c.vocab; v++)
            s += exp(logits[v] - mx);
        int32_t one[16];
        for (int64_t j = 0; j < T; j++)
            one[j] = j == t - 1 ? tgt[j] : -100;
        float want;
        FXT_OK(fx__gpt_forward(m, tok, one, &want, false));
        FXT_NEAR(mx + log(s) - logits[tgt[t - 1]], want, 1e-4, 1e-4);
    }
    FXT_EQ_INT(kc->len, T);
    fxt_guarded_free("logits", logits);
    fx__gpt_cache_free(kc);
    fx__gpt_free(m);
}

static void test_decode_ref(void)
{
    decode_check(FX__GPT_ATTN_REF, "causal");
    decode_check(FX__GPT_ATTN_REF, "sliding:5");
    decode_check(FX__GPT_ATTN_REF, "document");
}

static void test_decode_flex(void)
{
    decode_check(FX__GPT_ATTN_FLEX, "causal");
    decode_check(FX__GPT_ATTN_FLEX, "sliding:5");
    decode_check(FX__GPT_ATTN_FLEX, "document");
    decode_check(FX__GPT_ATTN_FLEX, "dense");
}

/* ---- optimizer ------------------------------------------------------------------------------ */

static void test_adamw(void)
{
    fx__gpt_config c = small_cfg();
    fx__gpt *m = NULL;
    FXT_OK(fx__gpt_create(&m, &c, 1));
    if (!m)
        return;
    FXT_OK(fx__gpt_alloc_train(m));
    size_t P = m->lay.total;
    double *p = fxt_alloc_f64(P), *mm = fxt_alloc_f64(P), *vv = fxt_alloc_f64(P);
    for (size_t i = 0; i < P; i++)
        p[i] = m->params[i];
    fx__adamw o = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    for (int t = 1; t <= 3; t++) {
        fx_rng_fill_uniform(m->grads, (int64_t)P, -1, 1, 77, (uint64_t)t);
        fx__gpt_adamw(m, &o, t);
        for (size_t ti = 0; ti < m->lay.n; ti++) {
            const fx__gpt_tensor *tt = &m->lay.t[ti];
            double wd = tt->ndim == 2 ? 0.1 : 0.0;
            for (size_t j = tt->offset; j < tt->offset + tt->numel; j++) {
                double g = m->grads[j];
                mm[j] = 0.9 * mm[j] + 0.1 * g;
                vv[j] = 0.95 * vv[j] + 0.05 * g * g;
                double mh = mm[j] / (1 - pow(0.9, t)), vh = vv[j] / (1 - pow(0.95, t));
                p[j] -= 1e-2 * (mh / (sqrt(vh) + 1e-8) + wd * p[j]);
            }
        }
    }
    fxt_close_f32("adamw params", m->params, p, P, 1e-6, 1e-4);
    /* A gradient scale is the same as scaling the gradients first. */
    fx__gpt *m2 = NULL;
    FXT_OK(fx__gpt_create(&m2, &c, 1));
    if (m2) {
        FXT_OK(fx__gpt_alloc_train(m2));
        memcpy(m2->params, m->params, P * sizeof(float));
        memcpy(m2->adam, m->adam, 2 * P * sizeof(float));
        memcpy(m2->grads, m->grads, P * sizeof(float));
        fx__gpt_grad_scale(m2, 0.375f);
        fx__adamw o2 = o;
        o2.grad_scale = 0.375f;
        fx__gpt_adamw(m, &o2, 4);
        fx__gpt_adamw(m2, &o, 4);
        fxt_bitwise_f32("grad_scale", m->params, m2->params, P);
        fx__gpt_free(m2);
    }
    /* Norms have no decay: with a zero gradient they stay exactly. */
    FXT_CHECK(!m->lay.t[1].decay && m->lay.t[2].decay && m->lay.t[0].decay);
    /* The schedule: warmup, peak, cosine, floor. */
    FXT_NEAR(fx__lr_schedule(0, 10, 100, 1.0f, 0.1f), 0.1, 1e-7, 0);
    FXT_NEAR(fx__lr_schedule(9, 10, 100, 1.0f, 0.1f), 1.0, 1e-7, 0);
    FXT_NEAR(fx__lr_schedule(55, 10, 100, 1.0f, 0.1f), 0.55, 1e-6, 0);
    FXT_NEAR(fx__lr_schedule(100, 10, 100, 1.0f, 0.1f), 0.1, 1e-7, 0);
    /* The gradient norm in double against a plain sum. */
    double ss = 0;
    for (size_t i = 0; i < P; i++)
        ss += (double)m->grads[i] * m->grads[i];
    FXT_NEAR(fx__gpt_grad_norm(m), sqrt(ss), 1e-9, 1e-12);
    free(p), free(mm), free(vv);
    fx__gpt_free(m);
}

/* bfloat16 moments: the same update with the moments rounded to bfloat16 after each step. */
static void test_adamw_bf16(void)
{
    fx__gpt_config c = small_cfg();
    fx__gpt *m = NULL;
    FXT_OK(fx__gpt_create(&m, &c, 1));
    if (!m)
        return;
    m->adam_bf16 = true;
    FXT_OK(fx__gpt_alloc_train(m));
    FXT_CHECK(m->adam16 && !m->adam);
    size_t P = m->lay.total;
    double *p = fxt_alloc_f64(P);
    float *mm = calloc(P, sizeof(float)), *vv = calloc(P, sizeof(float));
    for (size_t i = 0; i < P; i++)
        p[i] = m->params[i];
    fx__adamw o = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    for (int t = 1; t <= 4; t++) {
        fx_rng_fill_uniform(m->grads, (int64_t)P, -1, 1, 78, (uint64_t)t);
        fx__gpt_adamw(m, &o, t);
        for (size_t ti = 0; ti < m->lay.n; ti++) {
            const fx__gpt_tensor *tt = &m->lay.t[ti];
            double wd = tt->ndim == 2 ? 0.1 : 0.0;
            for (size_t j = tt->offset; j < tt->offset + tt->numel; j++) {
                double g = m->grads[j];
                double mj = 0.9 * mm[j] + 0.1 * g, vj = 0.95 * vv[j] + 0.05 * g * g;
                mm[j] = fx_bf16_to_f32(fx_f32_to_bf16((float)mj));
                vv[j] = fx_bf16_to_f32(fx_f32_to_bf16((float)vj));
                double mh = mj / (1 - pow(0.9, t)), vh = vj / (1 - pow(0.95, t));
                p[j] -= 1e-2 * (mh / (sqrt(vh) + 1e-8) + wd * p[j]);
            }
        }
    }
    fxt_close_f32("adamw bf16 params", m->params, p, P, 1e-5, 1e-3);
    size_t off = 0;
    for (size_t i = 0; i < P; i++)
        off += fx_bf16_to_f32(m->adam16[i]) != mm[i] && fabsf(fx_bf16_to_f32(m->adam16[i]) - mm[i]) > 1e-2f * fabsf(mm[i]);
    FXT_EQ_INT(off, 0);
    free(p), free(mm), free(vv);
    fx__gpt_free(m);
}

/* The optimizer's element loops and the gradient norm's sum: every vector path bitwise equal
   to the scalar reference (which the tests above check against float64), including the
   tails, bfloat16 rounding of NaN and infinities, and the fused clearing of the gradients. */
static void test_optim_kernels(void)
{
    const int64_t n = 16 * 70 + 13;
    float *g0 = fxt_random((size_t)n, -2, 2, 91), *p0 = fxt_random((size_t)n, -1, 1, 92);
    float *m0 = fxt_random((size_t)n, -0.5f, 0.5f, 93), *v0 = fxt_random((size_t)n, 0, 0.5f, 94);
    g0[5] = NAN, g0[17] = INFINITY, g0[40] = 0.0f, g0[41] = -0.0f, g0[n - 1] = 1e-30f;
    uint16_t *m16 = malloc((size_t)n * 2), *v16 = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++)
        m16[i] = fx_f32_to_bf16(m0[i]), v16[i] = fx_f32_to_bf16(v0[i]);
    fx__adamw o = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .grad_scale = 0.7f};
    const fx_isa isas[] = {FX_ISA_AVX2, FX_ISA_AVX512};
    void (*f32s[])(float *, float *, float *, float *, int64_t, const fx__adamw_k *) = {fx__adamw_f32_avx2,
                                                                                     fx__adamw_f32_avx512};
    void (*bf16s[])(float *, float *, uint16_t *, uint16_t *, int64_t, const fx__adamw_k *) = {
        fx__adamw_bf16_avx2, fx__adamw_bf16_avx512};
    double (*sumsqs[])(const float *, int64_t) = {fx__sumsq_avx2, fx__sumsq_avx512};
    fx_isa best = fx_get_isa();
    int ran = 0;
    for (int zero = 0; zero < 2; zero++) {
        o.zero_grad = zero;
        fx__adamw_k k = fx__adamw_consts(&o, 0.1f, 3);
        /* The reference: the scalar loops. */
        float *rp = fxt_guarded_copy(p0, (size_t)n), *rg = fxt_guarded_copy(g0, (size_t)n);
        float *rm = fxt_guarded_copy(m0, (size_t)n), *rv = fxt_guarded_copy(v0, (size_t)n);
        float *bp = fxt_guarded_copy(p0, (size_t)n), *bg = fxt_guarded_copy(g0, (size_t)n);
        uint16_t *bm = malloc((size_t)n * 2), *bv = malloc((size_t)n * 2);
        memcpy(bm, m16, (size_t)n * 2), memcpy(bv, v16, (size_t)n * 2);
        fx__adamw_f32_scalar(rp, rg, rm, rv, n, &k);
        fx__adamw_bf16_scalar(bp, bg, bm, bv, n, &k);
        for (int64_t i = 0; i < n; i++)
            if ((zero && (rg[i] != 0.0f || bg[i] != 0.0f)) || (!zero && (memcmp(&rg[i], &g0[i], 4) || memcmp(&bg[i], &g0[i], 4)))) {
                FXT_FAIL("scalar adamw gradient %lld: %g (zero_grad %d)", (long long)i, (double)rg[i], zero);
                break;
            }
        FXT_CHECK(bm[5] == 0x7fc0 || (bm[5] & 0x7f80) == 0x7f80); /* a NaN gradient stays NaN */
        FXT_CHECK(isnan(rp[5]) && isnan(bp[5]));
        double ref = 0.0;
        for (int64_t i = 0; i < n; i++)
            ref += (double)p0[i] * p0[i];
        double sref = fx__sumsq_scalar(p0, n);
        FXT_NEAR(sref, ref, 0, 1e-13);
        for (size_t t = 0; t < sizeof isas / sizeof isas[0]; t++) {
            if (fx_set_isa(isas[t]) != FX_OK)
                continue;
            ran++;
            char what[96];
            float *p = fxt_guarded_copy(p0, (size_t)n), *g = fxt_guarded_copy(g0, (size_t)n);
            float *mm = fxt_guarded_copy(m0, (size_t)n), *vv = fxt_guarded_copy(v0, (size_t)n);
            f32s[t](p, g, mm, vv, n, &k);
            snprintf(what, sizeof what, "adamw f32 [%s] zero_grad %d", fx_isa_name(isas[t]), zero);
            fxt_bitwise_f32(what, p, rp, (size_t)n);
            fxt_bitwise_f32(what, g, rg, (size_t)n);
            fxt_bitwise_f32(what, mm, rm, (size_t)n);
            fxt_bitwise_f32(what, vv, rv, (size_t)n);
            fxt_guarded_free(what, p), fxt_guarded_free(what, g), fxt_guarded_free(what, mm), fxt_guarded_free(what, vv);
            p = fxt_guarded_copy(p0, (size_t)n), g = fxt_guarded_copy(g0, (size_t)n);
            uint16_t *m2 = malloc((size_t)n * 2), *v2 = malloc((size_t)n * 2);
            memcpy(m2, m16, (size_t)n * 2), memcpy(v2, v16, (size_t)n * 2);
            bf16s[t](p, g, m2, v2, n, &k);
            snprintf(what, sizeof what, "adamw bf16 [%s] zero_grad %d", fx_isa_name(isas[t]), zero);
            fxt_bitwise_f32(what, p, bp, (size_t)n);
            fxt_bitwise_f32(what, g, bg, (size_t)n);
            FXT_CHECK(!memcmp(m2, bm, (size_t)n * 2) && !memcmp(v2, bv, (size_t)n * 2));
            fxt_guarded_free(what, p), fxt_guarded_free(what, g);
            free(m2), free(v2);
            /* Every length, so each tail is covered. */
            for (int64_t len = 0; len <= 40; len++) {
                double a = fx__sumsq_scalar(p0 + 3, len), b = sumsqs[t](p0 + 3, len);
                if (memcmp(&a, &b, sizeof a)) {
                    FXT_FAIL("sumsq [%s] n %lld: %.17g vs scalar %.17g", fx_isa_name(isas[t]), (long long)len, b, a);
                    break;
                }
            }
            double sv = sumsqs[t](p0, n);
            FXT_CHECK(!memcmp(&sv, &sref, sizeof sv));
        }
        fx_set_isa(best);
        fxt_guarded_free("ref", rp), fxt_guarded_free("ref", rg), fxt_guarded_free("ref", rm), fxt_guarded_free("ref", rv);
        fxt_guarded_free("ref", bp), fxt_guarded_free("ref", bg);
        free(bm), free(bv);
    }
    if (!ran)
        fprintf(stderr, "  (no vector path on this CPU: scalar only)\n");
    free(g0), free(p0), free(m0), free(v0), free(m16), free(v16);
}

/* ---- data ------------------------------------------------------------------------------------- */

static char tmpdir[256];

static const char *write_tmp(const char *name, const void *data, size_t n)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        FXT_FAIL("cannot write %s", path);
        return path;
    }
    fwrite(data, 1, n, f);
    fclose(f);
    return path;
}

static void test_data(void)
{
    const char *text = "ab\n%\ncd<|endoftext|>e\n%\n";
    fx__gpt_data d;
    FXT_OK(fx__gpt_data_load(&d, write_tmp("a.txt", text, strlen(text)), NULL, 0.5, 2));
    /* a b \n EOT c d EOT e \n EOT */
    int32_t want[] = {'a', 'b', '\n', FX__GPT_EOT, 'c', 'd', FX__GPT_EOT, 'e', '\n', FX__GPT_EOT};
    FXT_EQ_INT(d.n, 10);
    for (int i = 0; i < 10 && d.n == 10; i++)
        FXT_EQ_INT(d.tok[i], want[i]);
    FXT_EQ_INT(d.docs, 3);
    FXT_EQ_INT(d.n_train, 5);
    /* Batches are windows of the training part with next-token targets. */
    fx_rng r;
    fx_rng_init(&r, 1, 1);
    int32_t tk[6], tg[6];
    fx__gpt_data_batch(&d, &r, 3, 2, tk, tg);
    for (int b = 0; b < 3; b++) {
        bool found = false;
        for (int off = 0; off + 2 < 5 + 1 && !found; off++)
            found = tk[2 * b] == (int32_t)d.tok[off] && tk[2 * b + 1] == (int32_t)d.tok[off + 1] &&
                    tg[2 * b + 1] == (int32_t)d.tok[off + 2];
        FXT_CHECK(found);
    }
    fx__gpt_data_free(&d);
    FXT_STATUS(fx__gpt_data_load(&d, write_tmp("empty.txt", "", 0), NULL, 0.1, 2), FX_EINVAL, "is empty");
    FXT_STATUS(fx__gpt_data_load(&d, "/nonexistent/x.txt", NULL, 0.1, 2), FX_EIO, "cannot open");
    FXT_STATUS(fx__gpt_data_load(&d, write_tmp("bad.txt", "ok\xff\xfe", 4), NULL, 0.1, 2), FX_EFORMAT, "offset 2");
    FXT_STATUS(fx__gpt_data_load(&d, write_tmp("short.txt", "abc", 3), NULL, 0.1, 65), FX_EINVAL, "smaller --seq");
    FXT_STATUS(fx__gpt_data_load(&d, NULL, "/nonexistent/fortunes", 0.1, 2), FX_EIO, "--data FILE");
    /* UTF-8 validation. */
    FXT_EQ_INT(fx__utf8_invalid_at((const unsigned char *)"h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80", 15), -1);
    FXT_EQ_INT(fx__utf8_invalid_at((const unsigned char *)"a\xc0\xafz", 4), 1);       /* overlong */
    FXT_EQ_INT(fx__utf8_invalid_at((const unsigned char *)"ab\xed\xa0\x80", 5), 2);   /* surrogate */
    FXT_EQ_INT(fx__utf8_invalid_at((const unsigned char *)"abc\xe2\x82", 5), 3);      /* truncated */
}

/* ---- checkpoints and the training step ----------------------------------------------------------- */

static fx__gpt_train_state train_state(void)
{
    fx__gpt_train_state s = {.steps = 8, .warmup = 2, .batch = 2, .seq = 16, .accum = 2, .lr = 3e-3f,
                             .min_lr = 3e-4f, .weight_decay = 0.1f, .clip = 1.0f, .beta1 = 0.9f, .beta2 = 0.95f,
                             .seed = 5};
    fx_rng_init(&s.rng, 5, 1);
    snprintf(s.attn, sizeof s.attn, "causal");
    return s;
}

static fx__gpt_data corpus(void)
{
    char text[4096];
    size_t n = 0;
    for (int i = 0; n + 64 < sizeof text; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "the cat %d sat on the mat.\n%s", i % 7, i % 5 == 4 ? "%\n" : "");
    fx__gpt_data d;
    FXT_OK(fx__gpt_data_load(&d, write_tmp("corpus.txt", text, n), NULL, 0.1, 17));
    return d;
}

/* n steps; losses out. */
static void run_steps(fx__gpt *m, const fx__gpt_data *d, fx__gpt_train_state *s, int n, float *losses)
{
    int32_t tok[32], tgt[32];
    for (int i = 0; i < n; i++) {
        fx__gpt_step_info info;
        FXT_OK(fx__gpt_train_step(m, d, s, tok, tgt, &info));
        losses[i] = info.loss;
    }
}

/* A step whose loss is not finite is not applied: weights, Adam moments and the step count
   stay as they were (the caller saves them and stops). */
static void test_step_nonfinite_not_applied(void)
{
    fx__gpt_data d = corpus();
    fx__gpt_config c = small_cfg();
    fx__gpt *m = NULL;
    FXT_OK(fx__gpt_create(&m, &c, 9));
    if (!m)
        return;
    FXT_OK(fx__gpt_alloc_train(m));
    fx__gpt_train_state s = train_state();
    float l[2];
    run_steps(m, &d, &s, 2, l);
    size_t P = m->lay.total;
    m->params[m->lay.t[1].offset] = NAN; /* the first layer's norm: every position sees it */
    float *w = malloc(P * sizeof *w), *mo = malloc(2 * P * sizeof *mo);
    memcpy(w, m->params, P * sizeof *w);
    memcpy(mo, m->adam, 2 * P * sizeof *mo);
    int32_t tok[32], tgt[32];
    fx__gpt_step_info info;
    FXT_OK(fx__gpt_train_step(m, &d, &s, tok, tgt, &info));
    FXT_CHECK(isnan(info.loss));
    FXT_EQ_INT(s.step, 2);
    FXT_CHECK(memcmp(w, m->params, P * sizeof *w) == 0);
    FXT_CHECK(memcmp(mo, m->adam, 2 * P * sizeof *mo) == 0);
    free(w), free(mo);
    fx__gpt_free(m);
    fx__gpt_data_free(&d);
}

static void test_resume_bitwise(void)
{
    fx__gpt_data d = corpus();
    fx__gpt_config c = small_cfg();
    fx__gpt *a = NULL, *b = NULL, *r = NULL;
    FXT_OK(fx__gpt_create(&a, &c, 9));
    FXT_OK(fx__gpt_create(&b, &c, 9));
    FXT_OK(fx__gpt_create(&r, &c, 1234)); /* different init: everything must come from the file */
    if (!a || !b || !r)
        return;
    FXT_OK(fx__gpt_alloc_train(a));
    FXT_OK(fx__gpt_alloc_train(b));
    FXT_OK(fx__gpt_alloc_train(r));
    fx__gpt_train_state sa = train_state(), sb = train_state();
    float la[8], lb[8];
    run_steps(a, &d, &sa, 8, la);
    run_steps(b, &d, &sb, 4, lb);
    char path[512];
    snprintf(path, sizeof path, "%s/ck.safetensors", tmpdir);
    FXT_OK(fx__gpt_save_checkpoint(b, &sb, path));
    fx__gpt_config c2;
    fx__gpt_train_state sr;
    bool adam = false;
    FXT_OK(fx__gpt_read_config(path, &c2, &sr, &adam));
    FXT_CHECK(adam);
    FXT_EQ_INT(c2.dim, c.dim);
    FXT_EQ_INT(sr.step, 4);
    FXT_EQ_INT(sr.data_pos, sb.data_pos);
    FXT_CHECK(!memcmp(&sr.rng, &sb.rng, sizeof sr.rng));
    FXT_OK(fx__gpt_load(r, path, true));
    run_steps(r, &d, &sr, 4, lb + 4);
    fxt_bitwise_f32("resumed losses", lb, la, 8);
    fxt_bitwise_f32("resumed params", r->params, a->params, a->lay.total);
    fxt_bitwise_f32("resumed adam", r->adam, a->adam, 2 * a->lay.total);
    /* The loss falls over these steps. */
    FXT_CHECK(la[7] < la[0]);

    /* A model file (weights only, bf16 or f32) loads into a fresh model. */
    fx__gpt *g = NULL;
    FXT_OK(fx__gpt_create(&g, &c, 77));
    snprintf(path, sizeof path, "%s/model.safetensors", tmpdir);
    FXT_OK(fx__gpt_save_model(a, path, false));
    FXT_OK(fx__gpt_load(g, path, false));
    fxt_bitwise_f32("model f32", g->params, a->params, a->lay.total);
    FXT_OK(fx__gpt_save_model(a, path, true));
    FXT_OK(fx__gpt_load(g, path, false));
    double *ref = fxt_alloc_f64(a->lay.total);
    for (size_t i = 0; i < a->lay.total; i++)
        ref[i] = a->params[i];
    fxt_close_f32("model bf16", g->params, ref, a->lay.total, 1e-30, 1.0 / 256);
    free(ref);
    /* A model file cannot resume training. */
    FXT_STATUS(fx__gpt_load(r, path, true), FX_EFORMAT, "no optimizer state");

    /* A mismatched config is refused, and the model is untouched. */
    fx__gpt_config c3 = c;
    c3.dim = 32;
    fx__gpt *x = NULL;
    FXT_OK(fx__gpt_create(&x, &c3, 1));
    float keep = x->params[0];
    snprintf(path, sizeof path, "%s/ck.safetensors", tmpdir);
    FXT_STATUS(fx__gpt_load(x, path, false), FX_EINVAL, "dim=16");
    FXT_CHECK(x->params[0] == keep);
    /* A corrupted file is refused. */
    FILE *f = fopen(path, "r+b");
    if (f) {
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        FXT_CHECK(ftruncate(fileno(f), size / 2) == 0);
        fclose(f);
    }
    int rc = fx__gpt_load(r, path, true);
    FXT_CHECK(rc == FX_EFORMAT || rc == FX_EIO);
    FXT_CHECK(fx_last_error()[0] != '\0');
    fx__gpt_free(x), fx__gpt_free(g);
    fx__gpt_free(a), fx__gpt_free(b), fx__gpt_free(r);
    fx__gpt_data_free(&d);
}

/* 1 and 2 threads give bitwise the same training, for every mask. */
/* Recompute with parked activations (a model whose layers' gradient memory holds a layer's
   activations): training steps with two micro-batches (the first parks, the second, on
   gradients no longer clear, recomputes) give bitwise the weights and losses of keeping
   every activation, and a forward and backward on clear gradients gives their gradients. */
static void test_recompute_parked(void)
{
    fx__gpt_data d = corpus();
    const char *masks[] = {"causal", "document"};
    for (int mi = 0; mi < 2; mi++) {
        fx__gpt *m[2] = {NULL, NULL};
        float l[2][4];
        for (int v = 0; v < 2; v++) {
            fx__gpt_config c = small_cfg();
            c.layers = 3, c.dim = 64, c.heads = 4, c.kv_heads = 2, c.ffn = 160;
            FXT_OK(fx__gpt_create(&m[v], &c, 6));
            if (!m[v])
                break;
            FXT_OK(fx__gpt_mask_parse(masks[mi], &m[v]->mask, &m[v]->window));
            m[v]->recompute = v == 1;
            FXT_OK(fx__gpt_alloc_train(m[v]));
            fx__gpt_train_state s = train_state();
            run_steps(m[v], &d, &s, 3, l[v]);
            /* One more forward and backward by hand, on clear gradients. */
            int32_t tok[32], tgt[32];
            make_batch(2, 16, c.vocab, 13, tok, tgt, true);
            fx__gpt_zero_grad(m[v]);
            float loss;
            FXT_OK(fx__gpt_forward(m[v], tok, tgt, &loss, true));
            FXT_CHECK(m[v]->park.acts_parked == (v == 1));
            FXT_OK(fx__gpt_backward(m[v]));
            /* A forward pass without gradients (two residual streams in turn with recompute). */
            FXT_OK(fx__gpt_forward(m[v], tok, tgt, &l[v][3], false));
        }
        if (m[0] && m[1]) {
            fxt_bitwise_f32(masks[mi], m[1]->params, m[0]->params, m[0]->lay.total);
            fxt_bitwise_f32("losses", l[1], l[0], 4); /* the last: the forward without gradients */
            fxt_bitwise_f32("gradients", m[1]->grads, m[0]->grads, m[0]->lay.total);
        }
        fx__gpt_free(m[0]), fx__gpt_free(m[1]);
    }
    fx__gpt_data_free(&d);
}

/* The training step leaves the gradients cleared by the optimizer's pass and skips its own
   zeroing then; gradients written by anything else are zeroed first. */
static void test_step_zeroing(void)
{
    fx__gpt_data d = corpus();
    float *p[2] = {NULL, NULL}, l[2][2];
    for (int v = 0; v < 2; v++) {
        fx__gpt_config c = small_cfg();
        fx__gpt *m = NULL;
        FXT_OK(fx__gpt_create(&m, &c, 5));
        if (!m)
            break;
        FXT_OK(fx__gpt_alloc_train(m));
        FXT_CHECK(m->grads_zero);
        fx__gpt_train_state s = train_state();
        run_steps(m, &d, &s, 1, l[v]);
        size_t nz = 0;
        for (size_t i = 0; i < m->lay.total; i++)
            nz += m->grads[i] != 0.0f;
        FXT_EQ_INT(nz, 0);
        FXT_CHECK(m->grads_zero);
        if (v == 1) { /* stale gradients, as a caller's own forward and backward leave them */
            fx_rng_fill_uniform(m->grads, (int64_t)m->lay.total, -1, 1, 3, 0);
            m->grads_zero = false;
        }
        run_steps(m, &d, &s, 1, l[v] + 1);
        p[v] = malloc(m->lay.total * sizeof(float));
        if (p[v])
            memcpy(p[v], m->params, m->lay.total * sizeof(float));
        if (v == 1 && p[0] && p[1]) {
            fxt_bitwise_f32("params after stale gradients", p[1], p[0], m->lay.total);
            fxt_bitwise_f32("losses", l[1], l[0], 2);
        }
        fx__gpt_free(m);
    }
    free(p[0]), free(p[1]);
    fx__gpt_data_free(&d);
}

static void test_threads_bitwise(void)
{
    fx__gpt_data d = corpus();
    const char *masks[] = {"causal", "document", "sliding:5", "dense"};
    for (int mi = 0; mi < 4; mi++) {
        float *p[2], l[2][3];
        for (int th = 0; th < 2; th++) {
            FXT_OK(fx_set_num_threads(th + 1));
            fx__gpt_config c = small_cfg();
            c.dim = 128, c.heads = 4, c.kv_heads = 2, c.ffn = 160; /* wide enough to split */
            fx__gpt *m = NULL;
            FXT_OK(fx__gpt_create(&m, &c, 9));
            if (!m)
                return;
            FXT_OK(fx__gpt_mask_parse(masks[mi], &m->mask, &m->window));
            FXT_OK(fx__gpt_alloc_train(m));
            fx__gpt_train_state s = train_state();
            run_steps(m, &d, &s, 3, l[th]);
            p[th] = malloc(m->lay.total * sizeof(float));
            memcpy(p[th], m->params, m->lay.total * sizeof(float));
            if (th == 1) {
                fxt_bitwise_f32(masks[mi], p[0], p[1], m->lay.total);
                fxt_bitwise_f32("losses", l[0], l[1], 3);
            }
            fx__gpt_free(m);
        }
        free(p[0]), free(p[1]);
    }
    fx_set_num_threads(2);
    fx__gpt_data_free(&d);
}

static void test_config_errors(void)
{
    fx__gpt_config c;
    FXT_STATUS(fx__gpt_preset(&c, "huge"), FX_EINVAL, "'huge'");
    FXT_OK(fx__gpt_preset(&c, "small"));
    FXT_OK(fx__gpt_config_check(&c));
    FXT_EQ_INT(c.ffn, 1024);
    fx__gpt *m = NULL;
    FXT_OK(fx__gpt_create(&m, &c, 1));
    if (m) {
        /* about 10M parameters */
        FXT_CHECK(m->lay.total > 9000000 && m->lay.total < 11000000);
        FXT_STATUS(fx__gpt_set_batch(m, 1, 257), FX_EINVAL, "context");
        fx__gpt_free(m);
    }
    c.heads = 5;
    FXT_STATUS(fx__gpt_config_check(&c), FX_EINVAL, "heads = 5");
    FXT_OK(fx__gpt_preset(&c, "small"));
    c.kv_heads = 4;
    FXT_STATUS(fx__gpt_config_check(&c), FX_EINVAL, "kv_heads = 4");
    fx__gpt_mask mk;
    int64_t w;
    FXT_STATUS(fx__gpt_mask_parse("sliding:x", &mk, &w), FX_EINVAL, "sliding:x");
    FXT_STATUS(fx__gpt_mask_parse("full", &mk, &w), FX_EINVAL, "'full'");
    FXT_OK(fx__gpt_mask_parse("sliding:128", &mk, &w));
    FXT_EQ_INT(w, 128);
    /* Token ids are checked before any work. */
    FXT_OK(fx__gpt_preset(&c, "tiny"));
    FXT_OK(fx__gpt_create(&m, &c, 1));
    if (m) {
        FXT_OK(fx__gpt_set_batch(m, 1, 4));
        int32_t tok[4] = {1, 2, 300, 4}, tgt[4] = {1, 2, 3, 4};
        float loss = 7;
        FXT_STATUS(fx__gpt_forward(m, tok, tgt, &loss, false), FX_ERANGE, "token[2] = 300");
        FXT_CHECK(loss == 7);
        fx__gpt_free(m);
    }
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/fx_test_gpt.%d", (int)getpid());
    if (mkdir(tmpdir, 0700) != 0) {
        fprintf(stderr, "cannot create %s\n", tmpdir);
        return 2;
    }
    FXT_RUN(test_rmsnorm);
    FXT_RUN(test_rope);
    FXT_RUN(test_swiglu);
    FXT_RUN(test_embedding);
    FXT_RUN(test_attn_ref_grad);
    FXT_RUN(test_loss_unfused);
    FXT_RUN(test_config_errors);
    FXT_RUN(test_adamw);
    FXT_RUN(test_adamw_bf16);
    FXT_RUN(test_optim_kernels);
    FXT_RUN(test_data);
    FXT_RUN(test_gradcheck_ref);
    FXT_RUN(test_decode_ref);
    FXT_RUN(test_gradcheck_flex);
    FXT_RUN(test_flex_matches_reference);
    FXT_RUN(test_recompute_bitwise);
    FXT_RUN(test_recompute_parked);
    FXT_RUN(test_grad_hook);
    FXT_RUN(test_decode_flex);
    FXT_RUN(test_step_nonfinite_not_applied);
    FXT_RUN(test_resume_bitwise);
    FXT_RUN(test_threads_bitwise);
    FXT_RUN(test_step_zeroing);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return fxt_finish();
}
