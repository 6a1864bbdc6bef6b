/* The model (src/model/, include/flexc/model.h): each layer against float64 references and
   finite differences, the whole model's gradient against finite differences (reference and
   flex attention, fused and unfused loss; the byte-level GPT and a Llama-style configuration
   with head_dim != dim/heads, q/k/v biases, an untied head, llama3 RoPE and a sliding
   window), decoding against the full forward, the optimizer, thread-count determinism, and
   the public API: argument errors, save/load, generation. */
#include "harness.h"

#include "core/gemm_bf16.h"
#include "core/gemv.h"
#include "model/model.h"
#include "model/model_internal.h"
#include "model_fixtures.h"

#include <sys/stat.h>
#include <unistd.h>

/* A small model that still has every feature: GQA (4 query heads on 2 KV heads), 2 layers. */
static fx_model_config small_cfg(void)
{
    fx_model_config c;
    fx__model_preset(&c, "tiny");
    c.layers = 2, c.dim = 16, c.heads = 4, c.kv_heads = 2, c.ffn = 24, c.ctx = 16;
    return c;
}

/* Every feature of the Llama family at once: head_dim 6 (Hq * hd = 24 != dim 16), q/k/v
   biases, an untied LM head, llama3 RoPE scaling (with original_max_position_embeddings 8,
   the three frequencies fall in the three bands), a sliding window of 5. */
static fx_model_config llama_cfg(void)
{
    fx_model_config c = small_cfg();
    snprintf(c.arch, sizeof c.arch, "LlamaForCausalLM");
    c.head_dim = 6;
    c.qkv_bias = true;
    c.tied_embeddings = false;
    c.rope_scaling.type = FX_ROPE_SCALING_LLAMA3;
    c.rope_scaling.factor = 8.0f, c.rope_scaling.low_freq_factor = 1.0f, c.rope_scaling.high_freq_factor = 4.0f;
    c.rope_scaling.original_max_position_embeddings = 8;
    c.sliding_window = 5;
    return c;
}

/* Biases drawn like the matrices (their init is zero, which would hide them). */
static void randomize_biases(fx__model *m, uint64_t seed)
{
    for (size_t ti = 0; ti < m->lay.n; ti++)
        if (strstr(m->lay.t[ti].name, "attn.b"))
            fx_rng_fill_normal(m->params + m->lay.t[ti].offset, (int64_t)m->lay.t[ti].numel, 0.1f, seed, ti);
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

/* The AVX-512 row loops give the plain C ones' bits, forward and backward, at 1 and 3
   threads: rows of C = 37 (four lanes of 8 and a tail of 5; two vectors of 16 and a tail)
   and C = 150 (three channel blocks of the dw reduction, the last one short), values over
   several binades with zeros and a negative zero among them. */
static void test_rmsnorm_twins(void)
{
    const fx_isa best = fx_get_isa();
    const int before = fx_get_num_threads();
    const int64_t shapes[][2] = {{9, 37}, {13, 150}, {5, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t N = shapes[s][0], C = shapes[s][1], n = N * C;
        float *x = fxt_random((size_t)n, -3, 3, 11), *w = fxt_random((size_t)C, 0.25f, 4.0f, 12);
        float *dy = fxt_random((size_t)n, -1, 1, 13), *dx0 = fxt_random((size_t)n, -1, 1, 14);
        for (int64_t i = 0; i < n; i += 7)
            x[i] *= 1e-3f * (float)(i % 5);
        x[1] = -0.0f, dy[2] = 0.0f;
        float *ref[4] = {NULL}; /* y, rstd, dx, dw of the scalar loops at one thread */
        const fx_isa isas[] = {FX_ISA_SCALAR, FX_ISA_AVX2, FX_ISA_AVX512};
        for (size_t t = 0; t < sizeof isas / sizeof isas[0]; t++) {
            if (fx_set_isa(isas[t]) != FX_OK)
                continue;
            for (int threads = 1; threads <= 3; threads += 2) {
                fx_set_num_threads(threads);
                float *y = fxt_guarded((size_t)n), *rstd = fxt_guarded((size_t)N);
                float *dx = fxt_guarded_copy(dx0, (size_t)n), *dw = fxt_guarded((size_t)C);
                for (int64_t c = 0; c < C; c++)
                    dw[c] = 0.5f;
                fx__rmsnorm_forward(y, rstd, x, w, N, C, 1e-5f);
                fx__rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C);
                float *got[4] = {y, rstd, dx, dw};
                const size_t len[4] = {(size_t)n, (size_t)N, (size_t)n, (size_t)C};
                static const char *names[4] = {"y", "rstd", "dx", "dw"};
                for (int k = 0; k < 4; k++) {
                    if (!ref[k]) {
                        ref[k] = malloc(len[k] * sizeof(float));
                        memcpy(ref[k], got[k], len[k] * sizeof(float));
                        continue;
                    }
                    char what[96];
                    snprintf(what, sizeof what, "rmsnorm %s [%s, %d threads, C=%d] vs plain C at 1 thread", names[k],
                             fx_isa_name(isas[t]), threads, (int)C);
                    fxt_bitwise_f32(what, got[k], ref[k], len[k]);
                }
                fxt_guarded_free("y", y), fxt_guarded_free("rstd", rstd);
                fxt_guarded_free("dx", dx), fxt_guarded_free("dw", dw);
            }
        }
        for (int k = 0; k < 4; k++)
            free(ref[k]);
        free(x), free(w), free(dy), free(dx0);
    }
    fx_set_isa(best);
    fx_set_num_threads(before);
}

/* ---- RoPE, SwiGLU, embedding -------------------------------------------------------------- */

/* The reference RoPE table [ctx, hd/2, 2] (cos, sin), plain theta, computed position by
   position in float64. */
static void rope_table(float *rope, int64_t ctx, int64_t hd, float theta)
{
    int64_t half = hd / 2;
    for (int64_t t = 0; t < ctx; t++)
        for (int64_t i = 0; i < half; i++) {
            double freq = pow((double)theta, -2.0 * (double)i / (double)hd);
            double ang = (double)t * freq;
            rope[(t * half + i) * 2 + 0] = (float)cos(ang);
            rope[(t * half + i) * 2 + 1] = (float)sin(ang);
        }
}

static void test_rope(void)
{
    int64_t B = 2, T = 6, H = 3, hd = 8, n = B * T * H * hd;
    float *rope = malloc((size_t)(16 * hd) * sizeof(float));
    rope_table(rope, 16, hd, 10000.0f);
    float *x = fxt_random((size_t)n, -1, 1, 3), *y = fxt_guarded((size_t)n);
    fx__rope_forward(y, x, H * hd, rope, B, T, H, hd, 0);
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
    fx__rope_backward(dx, H * hd, g, rope, B, T, H, hd);
    double lhs = 0, rhs = 0;
    for (int64_t i = 0; i < n; i++)
        lhs += (double)y[i] * g[i], rhs += (double)x[i] * dx[i];
    FXT_NEAR(lhs, rhs, 1e-4, 1e-5);
    /* A position offset rotates as the later positions do. */
    float *y2 = fxt_guarded((size_t)(H * hd));
    fx__rope_forward(y2, x + (5 * H) * hd, H * hd, rope, 1, 1, H, hd, 5);
    for (int64_t h = 0; h < H; h++)
        fxt_bitwise_f32("rope offset", y2 + h * hd, y + (h * T + 5) * hd, (size_t)hd);
    /* Token rows further apart (a token's q, k and v side by side in one row): the same
       rotation read from, and its transpose written to, rows ld floats apart. */
    const int64_t ld = H * hd + 7, wide = B * T * ld;
    float *xw = fxt_random((size_t)wide, -1, 1, 8), *yw = fxt_guarded((size_t)n);
    float *dxw = fxt_guarded((size_t)wide), *dxw0 = malloc((size_t)wide * sizeof(float));
    for (int64_t bt = 0; bt < B * T; bt++)
        memcpy(xw + bt * ld, x + bt * H * hd, (size_t)(H * hd) * sizeof(float));
    memcpy(dxw0, dxw, (size_t)wide * sizeof(float));
    fx__rope_forward(yw, xw, ld, rope, B, T, H, hd, 0);
    fxt_bitwise_f32("rope, rows ld apart", yw, y, (size_t)n);
    fx__rope_backward(dxw, ld, g, rope, B, T, H, hd);
    for (int64_t bt = 0; bt < B * T; bt++) {
        fxt_bitwise_f32("rope backward, rows ld apart", dxw + bt * ld, dx + bt * H * hd, (size_t)(H * hd));
        fxt_bitwise_f32("rope backward leaves the rest of a row", dxw + bt * ld + H * hd, dxw0 + bt * ld + H * hd, 7);
    }
    fxt_guarded_free("y", y), fxt_guarded_free("dx", dx), fxt_guarded_free("y2", y2);
    fxt_guarded_free("yw", yw), fxt_guarded_free("dxw", dxw);
    free(rope), free(x), free(ref), free(g), free(xw), free(dxw0);
}

/* The q, k, v product's rows to heads in one pass, and back: the bits of RoPE on q and k and
   the plain transpose of v done one by one (GQA: 4 query heads, 2 kv heads). */
static void test_qkv_heads(void)
{
    enum { B = 2, T = 9, HQ = 4, HKV = 2, HD = 6, LD = (HQ + 2 * HKV) * HD };
    float *rope = malloc((size_t)(T * HD) * sizeof(float));
    rope_table(rope, T, HD, 10000.0f);
    float *qkv = fxt_random((size_t)(B * T * LD), -1, 1, 21);
    float *dq = fxt_random((size_t)(B * T * HQ * HD), -1, 1, 22), *dk = fxt_random((size_t)(B * T * HKV * HD), -1, 1, 23);
    float *dv = fxt_random((size_t)(B * T * HKV * HD), -1, 1, 24);
    const size_t nq = (size_t)(B * T * HQ * HD), nk = (size_t)(B * T * HKV * HD), nr = (size_t)(B * T * LD);
    float *q = fxt_guarded(nq), *k = fxt_guarded(nk), *v = fxt_guarded(nk);
    float *q1 = fxt_guarded(nq), *k1 = fxt_guarded(nk), *v1 = fxt_guarded(nk);
    const int64_t hs = T * HD; /* [B, H, T, HD] */
    fx__qkv_to_heads((fx__heads){q, hs, HQ * hs}, (fx__heads){k, hs, HKV * hs}, (fx__heads){v, hs, HKV * hs}, qkv, LD,
                     rope, false, B, T, 0, HQ, HKV, HD);
    fx__rope_forward(q1, qkv, LD, rope, B, T, HQ, HD, 0);
    fx__rope_forward(k1, qkv + HQ * HD, LD, rope, B, T, HKV, HD, 0);
    fx__to_heads(v1, qkv + (HQ + HKV) * HD, LD, B, T, HKV, HD);
    fxt_bitwise_f32("qkv to heads: q", q, q1, nq);
    fxt_bitwise_f32("qkv to heads: k", k, k1, nk);
    fxt_bitwise_f32("qkv to heads: v", v, v1, nk);
    float *d = fxt_guarded(nr), *d1 = fxt_guarded(nr);
    fx__qkv_from_heads(d, dq, dk, dv, rope, B, T, HQ, HKV, HD);
    fx__rope_backward(d1, LD, dq, rope, B, T, HQ, HD);
    fx__rope_backward(d1 + HQ * HD, LD, dk, rope, B, T, HKV, HD);
    fx__from_heads(d1 + (HQ + HKV) * HD, LD, dv, B, T, HKV, HD);
    fxt_bitwise_f32("qkv from heads", d, d1, nr);
    fxt_guarded_free("q", q), fxt_guarded_free("k", k), fxt_guarded_free("v", v);
    fxt_guarded_free("q1", q1), fxt_guarded_free("k1", k1), fxt_guarded_free("v1", v1);
    fxt_guarded_free("d", d), fxt_guarded_free("d1", d1);
    free(rope), free(qkv), free(dq), free(dk), free(dv);
}

/* The rows a mapped Hugging Face file gives (each head's rotated pairs as halves: x[i] with
   x[i + hd/2]) rotate to the bits of flexc's pairs (x[2i] with x[2i+1]) of the same numbers,
   one position after another from pos0 and straight into a cache's heads (cap positions a
   head): what decoding a mapped file and decoding flexc's own parameters each do. */
static void test_qkv_heads_halves(void)
{
    enum { T = 5, HQ = 4, HKV = 2, HD = 8, LD = (HQ + 2 * HKV) * HD, CAP = 16, P0 = 7 };
    float *rope = malloc((size_t)(CAP * HD) * sizeof(float));
    rope_table(rope, CAP, HD, 10000.0f);
    float *pairs = fxt_random((size_t)(T * LD), -1, 1, 31), *halves = malloc((size_t)(T * LD) * sizeof(float));
    /* halves: q and k heads permuted to rotate-half order, v as it is */
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < LD; j += HD)
            for (int64_t i = 0; i < HD; i++) {
                const bool rotated = j < (HQ + HKV) * HD;
                const int64_t src = rotated ? (i < HD / 2 ? 2 * i : 2 * (i - HD / 2) + 1) : i;
                halves[t * LD + j + i] = pairs[t * LD + j + src];
            }
    const size_t nq = (size_t)(HQ * T * HD), nc = (size_t)(HKV * CAP * HD);
    float *q = fxt_guarded(nq), *q1 = fxt_guarded(nq), *kc = fxt_guarded(nc), *kc1 = fxt_guarded(nc);
    float *vc = fxt_guarded(nc), *vc1 = fxt_guarded(nc);
    const fx__heads kh = {kc + P0 * HD, CAP * HD, 0}, vh = {vc + P0 * HD, CAP * HD, 0};
    fx__qkv_to_heads((fx__heads){q, T * HD, 0}, kh, vh, halves, LD, rope, true, 1, T, P0, HQ, HKV, HD);
    fx__qkv_to_heads((fx__heads){q1, T * HD, 0}, (fx__heads){kc1 + P0 * HD, CAP * HD, 0},
                     (fx__heads){vc1 + P0 * HD, CAP * HD, 0}, pairs, LD, rope, false, 1, T, P0, HQ, HKV, HD);
    /* Back to pairs order, head by head, then bitwise against the pairs path. */
    float *qp = malloc(nq * sizeof(float)), *kp = malloc(nc * sizeof(float));
    memcpy(kp, kc, nc * sizeof(float));
    for (size_t r = 0; r < nq; r += HD)
        for (int64_t i = 0; i < HD / 2; i++)
            qp[r + 2 * i] = q[r + i], qp[r + 2 * i + 1] = q[r + i + HD / 2];
    for (int64_t h = 0; h < HKV; h++)
        for (int64_t t = P0; t < P0 + T; t++)
            for (int64_t i = 0; i < HD / 2; i++) {
                const float *row = kc + (h * CAP + t) * HD;
                kp[(h * CAP + t) * HD + 2 * i] = row[i], kp[(h * CAP + t) * HD + 2 * i + 1] = row[i + HD / 2];
            }
    fxt_bitwise_f32("halves: q", qp, q1, nq);
    fxt_bitwise_f32("halves: k in the cache", kp, kc1, nc);
    fxt_bitwise_f32("halves: v in the cache", vc, vc1, nc);
    fxt_guarded_free("q", q), fxt_guarded_free("q1", q1), fxt_guarded_free("kc", kc), fxt_guarded_free("kc1", kc1);
    fxt_guarded_free("vc", vc), fxt_guarded_free("vc1", vc1);
    free(rope), free(pairs), free(halves), free(qp), free(kp);
}

/* The attention of fx__layer_run in test_layer_weights_apart: att = q (same shape). */
static int attn_copy_q(void *ctx, const fx__layer_io *io)
{
    memcpy(io->att, io->q.p, (size_t)*(const int64_t *)ctx * sizeof(float));
    return FX_OK;
}

static void close_to(const char *what, const float *got, const float *want, size_t n)
{
    double *ref = fxt_alloc_f64(n);
    for (size_t i = 0; i < n; i++)
        ref[i] = want[i];
    fxt_close_f32(what, got, ref, n, 1e-5, 1e-5);
    free(ref);
}

/* A layer whose weights do not lie one after another (each where a mapped file puts it): q,
   k, v and gate, up are then one product each instead of one for the group, and the biases
   one add each. The layer's output, d(x) and every weight's gradient agree with the training
   layout's single products (the same sums, in another grouping), and the biases' gradients
   bitwise (the same column sums). */
static void test_layer_weights_apart(void)
{
    fx_model_config c = llama_cfg(); /* biases, Hq * hd != dim, GQA */
    fx__model *m = NULL;
    FXT_OK(fx__model_create(&m, &c, 5));
    if (!m)
        return;
    randomize_biases(m, 6);
    FXT_OK(fx__model_alloc_train(m));
    FXT_OK(fx__model_set_batch(m, 2, 8));
    const int64_t B = 2, T = 8, N = B * T, C = c.dim, F = c.ffn, hd = c.head_dim, QD = c.heads * hd;
    const int64_t KD = c.kv_heads * hd, QKV = QD + 2 * KD, wide = F > QD ? F : QD;
    const fx__layer_w W = fx__layer_w_train(m, 0);
    fx__layer_w Wa = W;
    static const int moved[] = {FX__MODEL_WK, FX__MODEL_WV, FX__MODEL_W3, FX__MODEL_BK, FX__MODEL_BV};
    float *own[5];
    for (int i = 0; i < 5; i++) {
        const fx__model_tensor *t = &fx__layer_first(m, 0)[moved[i]];
        own[i] = malloc(t->numel * sizeof(float));
        memcpy(own[i], W.t[moved[i]].data, t->numel * sizeof(float));
        Wa.t[moved[i]].data = own[i];
    }
    float *in = fxt_random((size_t)(N * C), -1, 1, 41);
    float *res[2];
    for (int run = 0; run < 2; run++) {
        float *f = calloc((size_t)(N * (3 * C + 2 + QKV + 2 * QD + 2 * KD + 2 * F + wide) + N * C), sizeof(float));
        res[run] = f;
        fx__layer_io io = {.in = in, .mid = f, .out = f + N * C, .xn1 = f + 2 * N * C, .xn2 = f + 3 * N * C};
        float *p = f + 4 * N * C;
        io.rstd1 = p, io.rstd2 = p + N, p += 2 * N;
        io.qkv = p, p += N * QKV;
        io.q = (fx__heads){p, T * hd, c.heads * T * hd}, p += N * QD;
        io.k = (fx__heads){p, T * hd, c.kv_heads * T * hd}, p += N * KD;
        io.v = (fx__heads){p, T * hd, c.kv_heads * T * hd}, p += N * KD;
        io.att = p, p += N * QD;
        io.h13 = p, p += 2 * N * F;
        io.work = p;
        int64_t nq = N * QD;
        const fx__layer_rows r = {.B = B, .T = T};
        FXT_OK(fx__layer_run(run ? &Wa : &W, &r, &io, attn_copy_q, &nq));
    }
    close_to("layer apart: out", res[1] + N * C, res[0] + N * C, (size_t)(N * C));
    close_to("layer apart: gate, up", res[1] + 4 * N * C + 2 * N + N * (QKV + 2 * QD + 2 * KD),
             res[0] + 4 * N * C + 2 * N + N * (QKV + 2 * QD + 2 * KD), (size_t)(2 * N * F));

    /* The backward of the q, k, v product and of the biases. */
    float *dy = fxt_random((size_t)(N * QKV), -1, 1, 42), *x = fxt_random((size_t)(N * C), -1, 1, 43);
    float *dx[2], *g[2];
    const size_t span = fx__layer_first(m, 1)->offset - fx__layer_first(m, 0)->offset;
    for (int run = 0; run < 2; run++) {
        memset(m->grads, 0, m->lay.total * sizeof(float));
        dx[run] = malloc((size_t)(N * C) * sizeof(float));
        fx__layer_group_backward(run ? &Wa : &W, 0, FX__GROUP_QKV, dx[run], dy, QKV, x, N, C); /* and the biases' */
        g[run] = malloc(span * sizeof(float));
        memcpy(g[run], fx__layer_grad(m, 0, FX__MODEL_LN1), span * sizeof(float));
    }
    close_to("layer apart: d(x)", dx[1], dx[0], (size_t)(N * C));
    close_to("layer apart: d(wq, wk, wv)", g[1], g[0], span);
    const size_t bq = fx__layer_first(m, 0)[FX__MODEL_BQ].offset - fx__layer_first(m, 0)->offset;
    fxt_bitwise_f32("layer apart: d(bq, bk, bv)", g[1] + bq, g[0] + bq, (size_t)QKV);
    for (int i = 0; i < 5; i++)
        free(own[i]);
    for (int run = 0; run < 2; run++)
        free(res[run]), free(dx[run]), free(g[run]);
    free(in), free(dy), free(x);
    fx__model_free(m);
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
        /* Each vector path runs its own twins (fx__swiglu_ops), not the scalar loops again,
           and the threaded calls are those loops over blocks of a row: the same bits. */
        const fx__swiglu_ops *op = fx__swiglu_ops_for(isas[t]);
        FXT_CHECK((isas[t] == FX_ISA_SCALAR) == (op->forward == fx__swiglu_forward_scalar));
        FXT_CHECK((isas[t] == FX_ISA_SCALAR) == (op->backward == fx__swiglu_backward_scalar));
        float *o = fxt_guarded((size_t)n), *da = fxt_guarded((size_t)n), *db = fxt_guarded((size_t)n);
        fx__swiglu_forward(o, n, a, b, n, 1, n);
        fx__swiglu_backward(da, db, n, g, n, a, b, 1, n);
        snprintf(what, sizeof what, "swiglu [%s]", fx_isa_name(isas[t]));
        float *lo = fxt_guarded((size_t)n), *lda = fxt_guarded((size_t)n), *ldb = fxt_guarded((size_t)n);
        op->forward(lo, a, b, n);
        op->backward(lda, ldb, g, a, b, n);
        fxt_bitwise_f32(what, o, lo, (size_t)n);
        fxt_bitwise_f32(what, da, lda, (size_t)n);
        fxt_bitwise_f32(what, db, ldb, (size_t)n);
        fxt_guarded_free("lo", lo), fxt_guarded_free("lda", lda), fxt_guarded_free("ldb", ldb);
        fxt_close_f32(what, o, ro, (size_t)n, 1e-6, 1e-5);
        fxt_close_f32(what, da, rda, (size_t)n, 1e-5, 1e-4);
        fxt_close_f32(what, db, rdb, (size_t)n, 1e-6, 1e-5);
        /* In place over a and b (the model's backward does this): the same values. */
        float *ia = fxt_guarded_copy(a, (size_t)n), *ib = fxt_guarded_copy(b, (size_t)n);
        fx__swiglu_backward(ia, ib, n, g, n, ia, ib, 1, n);
        fxt_bitwise_f32(what, ia, da, (size_t)n);
        fxt_bitwise_f32(what, ib, db, (size_t)n);
        fxt_guarded_free("ia", ia), fxt_guarded_free("ib", ib);
        /* As 7 rows of 29 with a row's gate and up side by side in one [7, 58] buffer (the
           model's layout), in place: the values of the same rows held apart, bit for bit. */
        enum { R = 7, F = 29 };
        float *h = fxt_guarded(2 * R * F), *o7 = fxt_guarded(R * F), *d7a = fxt_guarded(R * F),
              *d7b = fxt_guarded(R * F), *o7s = fxt_guarded(R * F);
        for (int64_t r = 0; r < R; r++)
            for (int64_t j = 0; j < F; j++)
                h[r * 2 * F + j] = a[r * F + j], h[r * 2 * F + F + j] = b[r * F + j];
        fx__swiglu_forward(o7, F, a, b, F, R, F);
        fx__swiglu_backward(d7a, d7b, F, g, F, a, b, R, F);
        fx__swiglu_forward(o7s, F, h, h + F, 2 * F, R, F);
        fxt_close_f32(what, o7, ro, (size_t)n, 1e-6, 1e-5);
        fxt_bitwise_f32("swiglu rows 2F apart", o7s, o7, (size_t)n);
        fx__swiglu_backward(h, h + F, 2 * F, g, F, h, h + F, R, F);
        for (int64_t r = 0; r < R; r++) {
            fxt_bitwise_f32("swiglu backward rows 2F apart (gate)", h + r * 2 * F, d7a + r * F, F);
            fxt_bitwise_f32("swiglu backward rows 2F apart (up)", h + r * 2 * F + F, d7b + r * F, F);
        }
        fxt_guarded_free("h", h), fxt_guarded_free("o7", o7), fxt_guarded_free("d7a", d7a);
        fxt_guarded_free("d7b", d7b), fxt_guarded_free("o7s", o7s);
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
        tok[3] = FX__MODEL_EOT;
        tok[T + 5] = FX__MODEL_EOT;
    }
    tgt[2] = -100;
}

/* Whole-model gradient against central differences: every tensor's largest-gradient
   entries plus a random direction over the whole buffer. */
static void gradcheck_cfg(const fx_model_config *cfg, fx__model_attn_impl ai, fx__model_loss_impl li, fx__model_mask mask,
                          int64_t window)
{
    fx_model_config c = *cfg;
    fx__model *m = NULL;
    FXT_OK(fx__model_create(&m, &c, 42));
    if (!m)
        return;
    randomize_biases(m, 43);
    m->attn_impl = ai, m->loss_impl = li, m->mask = mask, m->window = window;
    int64_t B = 2, T = 12, V = c.vocab;
    FXT_OK(fx__model_alloc_train(m));
    FXT_OK(fx__model_set_batch(m, B, T));
    int32_t tok[24], tgt[24];
    make_batch(B, T, V, 7, tok, tgt, mask == FX__MODEL_MASK_DOCUMENT);
    /* Matrices 5x the init, so every path carries a visible gradient. */
    for (size_t ti = 0; ti < m->lay.n; ti++)
        for (size_t j = 0; j < m->lay.t[ti].numel && m->lay.t[ti].ndim == 2; j++)
            m->params[m->lay.t[ti].offset + j] *= 5.0f;
    float loss;
    FXT_OK(fx__model_forward(m, tok, tgt, &loss, true));
    FXT_OK(fx__model_backward(m));
    const float eps = 1e-3f;
    int checked = 0;
    for (size_t ti = 0; ti < m->lay.n; ti++) {
        const fx__model_tensor *t = &m->lay.t[ti];
        /* The largest |grad| entry of the tensor and two others. */
        size_t best = 0;
        for (size_t j = 1; j < t->numel; j++)
            if (fabsf(m->grads[t->offset + j]) > fabsf(m->grads[t->offset + best]))
                best = j;
        for (int pick = 0; pick < 3; pick++) {
            size_t i = t->offset + (pick == 0 ? best : ((size_t)pick * 7919 + 13) % t->numel);
            float keep = m->params[i], lp, lm;
            m->params[i] = keep + eps;
            FXT_OK(fx__model_forward(m, tok, tgt, &lp, false));
            m->params[i] = keep - eps;
            FXT_OK(fx__model_forward(m, tok, tgt, &lm, false));
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
    FXT_OK(fx__model_forward(m, tok, tgt, &lp, false));
    for (size_t i = 0; i < P; i++)
        m->params[i] = p0[i] - h * dir[i];
    FXT_OK(fx__model_forward(m, tok, tgt, &lm, false));
    double fd = ((double)lp - lm) / (2.0 * h);
    FXT_NEAR(gd, fd, 1e-3, 2e-2);
    free(dir), free(p0);
    fx__model_free(m);
}

static void gradcheck(fx__model_attn_impl ai, fx__model_loss_impl li, fx__model_mask mask, int64_t window)
{
    fx_model_config c = small_cfg();
    gradcheck_cfg(&c, ai, li, mask, window);
}

static void test_gradcheck_ref(void)
{
    gradcheck(FX__MODEL_ATTN_REF, FX__MODEL_LOSS_UNFUSED, FX__MODEL_MASK_CAUSAL, 0);
    gradcheck(FX__MODEL_ATTN_REF, FX__MODEL_LOSS_UNFUSED, FX__MODEL_MASK_SLIDING, 3);
    gradcheck(FX__MODEL_ATTN_REF, FX__MODEL_LOSS_UNFUSED, FX__MODEL_MASK_DOCUMENT, 0);
    fx_model_config c = llama_cfg();
    gradcheck_cfg(&c, FX__MODEL_ATTN_REF, FX__MODEL_LOSS_UNFUSED, FX__MODEL_MASK_SLIDING, c.sliding_window);
}

static void test_gradcheck_flex(void)
{
    gradcheck(FX__MODEL_ATTN_FLEX, FX__MODEL_LOSS_FUSED, FX__MODEL_MASK_CAUSAL, 0);
    gradcheck(FX__MODEL_ATTN_FLEX, FX__MODEL_LOSS_FUSED, FX__MODEL_MASK_SLIDING, 3);
    gradcheck(FX__MODEL_ATTN_FLEX, FX__MODEL_LOSS_FUSED, FX__MODEL_MASK_DOCUMENT, 0);
    gradcheck(FX__MODEL_ATTN_FLEX, FX__MODEL_LOSS_FUSED, FX__MODEL_MASK_CAUSAL_DENSE, 0);
    fx_model_config c = llama_cfg();
    gradcheck_cfg(&c, FX__MODEL_ATTN_FLEX, FX__MODEL_LOSS_FUSED, FX__MODEL_MASK_SLIDING, c.sliding_window);
}

/* Flex + fused against reference + unfused: the same loss and gradients. */
static void test_flex_matches_reference(void)
{
    const char *masks[] = {"causal", "sliding:4", "document", "dense", "sliding:5", "causal"};
    for (int mi = 0; mi < 6; mi++) {
        fx_model_config c = mi < 4 ? small_cfg() : llama_cfg();
        if (mi == 5)
            c.sliding_window = 0;
        fx__model *a = NULL, *b = NULL;
        FXT_OK(fx__model_create(&a, &c, 3));
        FXT_OK(fx__model_create(&b, &c, 3));
        if (!a || !b)
            return;
        randomize_biases(a, 8), randomize_biases(b, 8);
        fx__model_mask mk;
        int64_t w;
        FXT_OK(fx__model_mask_parse(masks[mi], &mk, &w));
        a->mask = b->mask = mk, a->window = b->window = w;
        b->attn_impl = FX__MODEL_ATTN_REF, b->loss_impl = FX__MODEL_LOSS_UNFUSED;
        FXT_OK(fx__model_alloc_train(a));
        FXT_OK(fx__model_alloc_train(b));
        FXT_OK(fx__model_set_batch(a, 2, 16));
        FXT_OK(fx__model_set_batch(b, 2, 16));
        int32_t tok[32], tgt[32];
        make_batch(2, 16, c.vocab, 11, tok, tgt, true);
        float la, lb;
        FXT_OK(fx__model_forward(a, tok, tgt, &la, true));
        FXT_OK(fx__model_backward(a));
        FXT_OK(fx__model_forward(b, tok, tgt, &lb, true));
        FXT_OK(fx__model_backward(b));
        FXT_NEAR(la, lb, 1e-5, 1e-5);
        double *ref = fxt_alloc_f64(a->lay.total);
        for (size_t i = 0; i < a->lay.total; i++)
            ref[i] = b->grads[i];
        fxt_close_f32(masks[mi], a->grads, ref, a->lay.total, 1e-5, 1e-3);
        free(ref);
        fx__model_free(a), fx__model_free(b);
    }
}

/* Recomputing the layers in backward gives bitwise the gradients of keeping them. */
static void test_recompute_bitwise(void)
{
    const char *masks[] = {"causal", "document", "sliding:5", "dense", "sliding:5"};
    for (int mi = 0; mi < 5; mi++) {
        fx_model_config c = mi < 4 ? small_cfg() : llama_cfg();
        fx__model *a = NULL, *b = NULL;
        FXT_OK(fx__model_create(&a, &c, 4));
        FXT_OK(fx__model_create(&b, &c, 4));
        if (!a || !b)
            return;
        randomize_biases(a, 5), randomize_biases(b, 5);
        FXT_OK(fx__model_mask_parse(masks[mi], &a->mask, &a->window));
        FXT_OK(fx__model_mask_parse(masks[mi], &b->mask, &b->window));
        b->recompute = true;
        FXT_OK(fx__model_alloc_train(a));
        FXT_OK(fx__model_alloc_train(b));
        FXT_OK(fx__model_set_batch(a, 2, 16));
        FXT_OK(fx__model_set_batch(b, 2, 16));
        FXT_CHECK(b->acts_floats < a->acts_floats);
        int32_t tok[32], tgt[32];
        make_batch(2, 16, c.vocab, 12, tok, tgt, true);
        float la, lb;
        FXT_OK(fx__model_forward(a, tok, tgt, &la, true));
        FXT_OK(fx__model_backward(a));
        FXT_OK(fx__model_forward(b, tok, tgt, &lb, true));
        FXT_OK(fx__model_backward(b));
        FXT_CHECK(la == lb);
        FXT_CHECK(!b->park.acts_parked); /* this model's layers are too small to park 32 tokens */
        fxt_bitwise_f32(masks[mi], b->grads, a->grads, a->lay.total);
        fx__model_free(a), fx__model_free(b);
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
    fx_model_config c = small_cfg();
    fx__model *m = NULL;
    FXT_OK(fx__model_create(&m, &c, 3));
    if (!m)
        return;
    FXT_OK(fx__model_alloc_train(m));
    FXT_OK(fx__model_set_batch(m, 2, 8));
    hook_log h = {.base = m->grads};
    m->hooks.grad = record_hook, m->hooks.user = &h;
    int32_t tok[16], tgt[16];
    make_batch(2, 8, c.vocab, 3, tok, tgt, false);
    float loss;
    FXT_OK(fx__model_forward(m, tok, tgt, &loss, true));
    FXT_OK(fx__model_backward(m));
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
    fx__model_free(m);
}

/* Decoding token by token (KV cache, q_offset, Lq = 1) gives the forward pass's loss. */
static void decode_check_cfg(const fx_model_config *cfg, fx__model_attn_impl ai, const char *mask)
{
    fx_model_config c = *cfg;
    fx__model *m = NULL;
    FXT_OK(fx__model_create(&m, &c, 5));
    if (!m)
        return;
    randomize_biases(m, 6);
    m->attn_impl = ai;
    FXT_OK(fx__model_mask_parse(mask, &m->mask, &m->window));
    int64_t T = 16;
    int32_t tok[16], tgt[16];
    make_batch(1, T, c.vocab, 21, tok, tgt, false);
    tok[0] = FX__MODEL_EOT;
    for (int64_t t = 0; t < T; t++)
        tgt[t] = t + 1 < T ? tok[t + 1] : 65;
    FXT_OK(fx__model_set_batch(m, 1, T));
    /* Weights 5x the init, so that attention shapes the logits well above the tolerance. */
    for (size_t ti = 0; ti < m->lay.n; ti++)
        for (size_t j = 0; j < m->lay.t[ti].numel && m->lay.t[ti].ndim == 2; j++)
            m->params[m->lay.t[ti].offset + j] *= 5.0f;
    fx__model_cache *kc = NULL;
    FXT_OK(fx__model_cache_create(&kc, m, 0));
    if (!kc)
        return;
    float *logits = fxt_guarded((size_t)c.vocab);
    /* A prefill of 5 tokens, then one at a time; after each call the logits are those of the
       last position fed, which a forward pass with only that target must agree with. */
    for (int64_t t = 0; t < T;) {
        int64_t n = t == 0 ? 5 : 1;
        FXT_OK(fx__model_decode(m, kc, tok + t, n, logits));
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
        FXT_OK(fx__model_forward(m, tok, one, &want, false));
        FXT_NEAR(mx + log(s) - logits[tgt[t - 1]], want, 1e-4, 1e-4);
    }
    FXT_EQ_INT(kc->len, T);
    fxt_guarded_free("logits", logits);
    fx__model_cache_free(kc);
    fx__model_free(m);
}

static void decode_check(fx__model_attn_impl ai, const char *mask)
{
    fx_model_config c = small_cfg();
    decode_check_cfg(&c, ai, mask);
}

static void test_decode_ref(void)
{
    fx_model_config c = llama_cfg();
    decode_check_cfg(&c, FX__MODEL_ATTN_REF, "sliding:5");
    decode_check(FX__MODEL_ATTN_REF, "causal");
    decode_check(FX__MODEL_ATTN_REF, "sliding:5");
    decode_check(FX__MODEL_ATTN_REF, "document");
}

static void test_decode_flex(void)
{
    decode_check(FX__MODEL_ATTN_FLEX, "causal");
    decode_check(FX__MODEL_ATTN_FLEX, "sliding:5");
    decode_check(FX__MODEL_ATTN_FLEX, "document");
    decode_check(FX__MODEL_ATTN_FLEX, "dense");
    fx_model_config c = llama_cfg();
    decode_check_cfg(&c, FX__MODEL_ATTN_FLEX, "sliding:5");
    c.sliding_window = 0;
    decode_check_cfg(&c, FX__MODEL_ATTN_FLEX, "causal");
}

/* ---- optimizer ------------------------------------------------------------------------------ */

/* One AdamW step t of the float64 reference over m's parameters p from m's gradients (lr
   1e-2, betas 0.9 and 0.95, eps 1e-8, decay 0.1 on the matrices only): the moments mm, vv
   advance and p moves. moments16: the moments are kept rounded to bfloat16 (--adam-bf16), the
   step itself taking them unrounded. */
static void adamw_reference(const fx__model *m, double *p, double *mm, double *vv, int t, bool moments16)
{
    for (size_t ti = 0; ti < m->lay.n; ti++) {
        const fx__model_tensor *tt = &m->lay.t[ti];
        const double wd = tt->ndim == 2 ? 0.1 : 0.0;
        for (size_t j = tt->offset; j < tt->offset + tt->numel; j++) {
            const double g = m->grads[j], mj = 0.9 * mm[j] + 0.1 * g, vj = 0.95 * vv[j] + 0.05 * g * g;
            mm[j] = moments16 ? fx_bf16_to_f32(fx_f32_to_bf16((float)mj)) : mj;
            vv[j] = moments16 ? fx_bf16_to_f32(fx_f32_to_bf16((float)vj)) : vj;
            const double mh = mj / (1 - pow(0.9, t)), vh = vj / (1 - pow(0.95, t));
            p[j] -= 1e-2 * (mh / (sqrt(vh) + 1e-8) + wd * p[j]);
        }
    }
}

/* The AdamW options of adamw_reference. */
static const fx__adamw adamw_opts = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};

/* A few AdamW steps of a small_cfg model on random gradients against adamw_reference, with
   float32 or bfloat16 moments (moments16: also the stored moments against the reference's).
   Returns the model after them for further checks, or NULL. */
static fx__model *adamw_against_reference(bool moments16)
{
    fx_model_config c = small_cfg();
    fx__model *m = NULL;
    FXT_OK(fx__model_create(&m, &c, 1));
    if (!m)
        return NULL;
    m->adam_bf16 = moments16;
    FXT_OK(fx__model_alloc_train(m));
    FXT_CHECK(moments16 ? m->adam16 && !m->adam : m->adam && !m->adam16);
    const size_t P = m->lay.total;
    double *p = fxt_alloc_f64(P), *mm = fxt_alloc_f64(P), *vv = fxt_alloc_f64(P);
    for (size_t i = 0; i < P; i++)
        p[i] = m->params[i];
    for (int t = 1; t <= (moments16 ? 4 : 3); t++) {
        fx_rng_fill_uniform(m->grads, (int64_t)P, -1, 1, moments16 ? 78 : 77, (uint64_t)t);
        fx__model_adamw(m, &adamw_opts, t);
        adamw_reference(m, p, mm, vv, t, moments16);
    }
    if (moments16) {
        fxt_close_f32("adamw bf16 params", m->params, p, P, 1e-5, 1e-3);
        size_t off = 0;
        for (size_t i = 0; i < P; i++)
            off += fx_bf16_to_f32(m->adam16[i]) != mm[i] &&
                   fabs(fx_bf16_to_f32(m->adam16[i]) - mm[i]) > 1e-2 * fabs(mm[i]);
        FXT_EQ_INT(off, 0);
    } else {
        fxt_close_f32("adamw params", m->params, p, P, 1e-6, 1e-4);
    }
    free(p), free(mm), free(vv);
    return m;
}

static void test_adamw(void)
{
    fx__model *m = adamw_against_reference(false);
    if (!m)
        return;
    const size_t P = m->lay.total;
    /* A gradient scale is the same as scaling the gradients first. */
    fx__model *m2 = NULL;
    FXT_OK(fx__model_create(&m2, &m->c, 1));
    if (m2) {
        FXT_OK(fx__model_alloc_train(m2));
        memcpy(m2->params, m->params, P * sizeof(float));
        memcpy(m2->adam, m->adam, 2 * P * sizeof(float));
        memcpy(m2->grads, m->grads, P * sizeof(float));
        fx__model_grad_scale(m2, 0.375f);
        fx__adamw o2 = adamw_opts;
        o2.grad_scale = 0.375f;
        fx__model_adamw(m, &o2, 4);
        fx__model_adamw(m2, &adamw_opts, 4);
        fxt_bitwise_f32("grad_scale", m->params, m2->params, P);
        fx__model_free(m2);
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
    FXT_NEAR(fx__model_grad_norm(m), sqrt(ss), 1e-9, 1e-12);
    fx__model_free(m);
}

/* bfloat16 moments: the same update with the moments rounded to bfloat16 after each step. */
static void test_adamw_bf16(void)
{
    fx__model *m = adamw_against_reference(true);
    fx__model_free(m);
}

/* bf16 training (--dtype bf16): gradients close to float32's yet not equal to them (every
   product's inputs rounded), bitwise the same at 1 and 2 threads and with recomputation,
   the weights' bfloat16 copy refreshed by AdamW, and the unfused loss refused. Tolerance:
   each tensor's gradient within 2.5% of float32's in L2 norm (bfloat16 keeps 8 bits; seen:
   at most 0.75% on these models), the loss within 1%. */
static void bf16_grads(const fx_model_config *c, bool bf16, bool recompute, int threads, float *grads, float *loss)
{
    fx__model *m = NULL;
    FXT_OK(fx__model_create(&m, c, 4));
    if (!m)
        return;
    randomize_biases(m, 5);
    m->recompute = recompute;
    FXT_OK(fx__model_alloc_train(m));
    FXT_OK(fx__model_set_batch(m, 2, 16));
    FXT_OK(fx__model_set_bf16(m, bf16));
    FXT_CHECK((m->params16 != NULL) == bf16);
    int32_t tok[32], tgt[32];
    make_batch(2, 16, c->vocab, 12, tok, tgt, true);
    int before = fx_get_num_threads();
    fx_set_num_threads(threads);
    FXT_OK(fx__model_forward(m, tok, tgt, loss, true));
    FXT_OK(fx__model_backward(m));
    fx_set_num_threads(before);
    memcpy(grads, m->grads, m->lay.total * sizeof(float));
    fx__model_free(m);
}

#ifdef FXT_HAVE_SIMDE
void fxt_bf16_dp_kernel_simde(int64_t pairs, const uint32_t *a, const uint32_t *b, float beta, float *C, int64_t ldc,
                              int64_t mr, int64_t nr);
#endif

static void test_bf16_step(void)
{
    for (int ci = 0; ci < 2; ci++) {
        fx_model_config c = ci ? llama_cfg() : small_cfg();
        fx__model *m = NULL;
        FXT_OK(fx__model_create(&m, &c, 4));
        if (!m)
            return;
        size_t P = m->lay.total;
        float *g32 = malloc(P * sizeof(float)), *g1 = malloc(P * sizeof(float)), *g2 = malloc(P * sizeof(float));
        float *gr = malloc(P * sizeof(float));
        float l32, l1, l2, lr;
        bf16_grads(&c, false, false, 1, g32, &l32);
        bf16_grads(&c, true, false, 1, g1, &l1);
        bf16_grads(&c, true, false, 2, g2, &l2);
        bf16_grads(&c, true, true, 2, gr, &lr);
        FXT_CHECK(l1 == l2 && l1 == lr);
        fxt_bitwise_f32("bf16 gradients, 1 vs 2 threads", g1, g2, P);
        fxt_bitwise_f32("bf16 gradients, recomputed", g1, gr, P);
        FXT_NEAR(l1, l32, 0, 1e-2);
        FXT_CHECK(l1 != l32); /* the products were rounded */
        for (size_t t = 0; t < m->lay.n; t++) {
            const fx__model_tensor *tt = &m->lay.t[t];
            double d2 = 0.0, r2 = 0.0;
            for (size_t i = tt->offset; i < tt->offset + tt->numel; i++) {
                d2 += ((double)g1[i] - g32[i]) * ((double)g1[i] - g32[i]);
                r2 += (double)g32[i] * g32[i];
            }
            /* A key bias adds q . b to every score of a row, which the softmax ignores: its
               gradient is zero in exact arithmetic, both values are rounding noise, and
               the scale they are measured against is the query bias's gradient. */
            double ref2 = r2;
            const size_t nl = strlen(tt->name);
            if (nl > 3 && !strcmp(tt->name + nl - 3, ".bk")) {
                char qname[96];
                ref2 = 0.0;
                snprintf(qname, sizeof qname, "%.*sbq", (int)(nl - 2), tt->name);
                const fx__model_tensor *tq = fx__model_find(m, qname);
                FXT_CHECK(tq != NULL);
                for (size_t i = tq ? tq->offset : 0; tq && i < tq->offset + tq->numel; i++)
                    ref2 += (double)g32[i] * g32[i];
            }
            if (!(sqrt(d2) <= 0.025 * sqrt(ref2) + 1e-7))
                FXT_FAIL("%s: bf16 gradient off float32's by %.3g of its norm %.3g", tt->name, sqrt(d2 / (r2 + 1e-300)),
                         sqrt(r2));
        }
#ifdef FXT_HAVE_SIMDE
        /* The same step on the vdpbf16ps path (its kernel built from SIMDe's portable
           intrinsics), as a CPU with AVX512-BF16 runs it: bitwise the same at 1 and 2
           threads, not bitwise the widening path's (another summation order) but as close
           to it as the order allows, and as close to float32 as bf16 is. */
        fx__bf16_tiled dp = fx__bf16_tiled_dp;
        dp.kernel = fxt_bf16_dp_kernel_simde;
        float *gt1 = malloc(P * sizeof(float)), *gt2 = malloc(P * sizeof(float)), lt1, lt2;
        fx__gemm_bf16_force_tiled(&dp);
        bf16_grads(&c, true, false, 1, gt1, &lt1);
        bf16_grads(&c, true, false, 2, gt2, &lt2);
        fx__gemm_bf16_force_tiled(NULL);
        FXT_CHECK(lt1 == lt2);
        fxt_bitwise_f32("bf16 gradients on the vdpbf16ps path, 1 vs 2 threads", gt1, gt2, P);
        FXT_CHECK(memcmp(gt1, g1, P * sizeof(float)) != 0); /* the path was taken */
        FXT_NEAR(lt1, l1, 0, 1e-3);
        double worst = 0.0;
        for (size_t t = 0; t < m->lay.n; t++) {
            const fx__model_tensor *tt = &m->lay.t[t];
            double d2 = 0.0, r2 = 0.0;
            for (size_t i = tt->offset; i < tt->offset + tt->numel; i++) {
                d2 += ((double)gt1[i] - g1[i]) * ((double)gt1[i] - g1[i]);
                r2 += (double)g1[i] * g1[i];
            }
            const double rel = sqrt(d2 / (r2 + 1e-300));
            worst = rel > worst ? rel : worst;
            if (!(sqrt(d2) <= 1e-2 * sqrt(r2) + 1e-7))
                FXT_FAIL("%s: the vdpbf16ps path's gradient off the widening path's by %.3g of its norm", tt->name,
                         rel);
        }
        fprintf(stderr, "  vdpbf16ps path vs widening path: largest gradient difference %.3g of a tensor's norm\n",
                worst);
        free(gt1), free(gt2);
#else
        fprintf(stderr, "  (no SIMDe: the vdpbf16ps path's step is not tested)\n");
#endif
        free(g32), free(g1), free(g2), free(gr);

        /* AdamW keeps the copy: params16 is bfloat16(params) after every step. */
        FXT_OK(fx__model_alloc_train(m));
        FXT_OK(fx__model_set_bf16(m, true));
        fx__adamw o = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
        for (int t = 1; t <= 2; t++) {
            fx_rng_fill_uniform(m->grads, (int64_t)P, -1, 1, 78, (uint64_t)t);
            fx__model_adamw(m, &o, t);
            size_t bad = 0, first = 0;
            for (size_t i = 0; i < P; i++)
                if (m->params16[i] != fx_f32_to_bf16(m->params[i]) && !bad++)
                    first = i;
            if (bad)
                FXT_FAIL("step %d: %zu of %zu bf16 weights stale; first at [%zu]", t, bad, P, first);
        }
        /* The unfused loss has no bf16 path: refused, not silently float32. */
        int32_t tok[32], tgt[32];
        make_batch(2, 16, c.vocab, 12, tok, tgt, false);
        FXT_OK(fx__model_set_batch(m, 2, 16));
        m->loss_impl = FX__MODEL_LOSS_UNFUSED;
        float l;
        FXT_STATUS(fx__model_forward(m, tok, tgt, &l, true), FX_EUNSUPPORTED, "fused loss");
        FXT_OK(fx__model_set_bf16(m, false));
        FXT_CHECK(!m->params16 && !m->bf16_ws);
        fx__model_free(m);
    }
}

/* The head packed once for the loss (fx__model_head16_*): the logits and d(x) bitwise those
   of fx__linear_bf16 and fx__linear_bf16_t, which pack it each call, over a vocabulary of
   three pieces (the last partial) and a chunk of rows that leaves partial tiles; on the
   vdpbf16ps path (SIMDe's kernel) and on the CPU's own tiled path where it has one, the
   head packed again when the path changes. */
static void test_bf16_packed_head(void)
{
    fx_model_config c = small_cfg();
    c.dim = 64, c.vocab = 2 * FX__BF16_ROWS + 452;
    fx__model *m = NULL;
    FXT_OK(fx__model_create(&m, &c, 4));
    if (!m)
        return;
    FXT_OK(fx__model_alloc_train(m));
    FXT_OK(fx__model_set_batch(m, 4, 16));
    FXT_OK(fx__model_set_bf16(m, true));
    const int64_t C = c.dim, V = c.vocab, nr = 45;
    float *e32 = fxt_random((size_t)(V * C), -1, 1, 31), *x = fxt_random((size_t)(nr * C), -1, 1, 32);
    float *dz = fxt_random((size_t)(nr * V), -1, 1, 33);
    uint16_t *E = malloc((size_t)(V * C) * sizeof(uint16_t));
    fx__f32_to_bf16_n(E, e32, V * C);
    float *lg[2] = {malloc((size_t)(nr * V) * sizeof(float)), malloc((size_t)(nr * V) * sizeof(float))};
    float *dx[2] = {malloc((size_t)(nr * C) * sizeof(float)), malloc((size_t)(nr * C) * sizeof(float))};
    fx__bf16_tiled paths[2];
    const char *names[2];
    int n = 0;
#ifdef FXT_HAVE_SIMDE
    paths[n] = fx__bf16_tiled_dp, paths[n].kernel = fxt_bf16_dp_kernel_simde, names[n++] = "vdpbf16ps (SIMDe)";
#else
    fprintf(stderr, "  (no SIMDe: the packed head is tested on the CPU's own path only)\n");
#endif
    const fx__bf16_tiled *own = fx__gemm_bf16_cpu_path();
    if (own->kernel)
        paths[n] = *own, names[n++] = own->name;
    for (int p = 0; p < n; p++) {
        fx__gemm_bf16_force_tiled(&paths[p]);
        fx__model_head16_logits(m, lg[0], x, E, FX_DT_BF16, nr, nr);
        fx__model_head16_dx(m, dx[0], dz, E, FX_DT_BF16, nr, nr);
        FXT_CHECK(m->head16 != NULL && m->head16_path == &paths[p]);
        fx__linear_bf16(lg[1], V, x, E, FX_DT_BF16, nr, C, V, false, m->bf16_ws);
        fx__linear_bf16_t(dx[1], dz, V, E, FX_DT_BF16, nr, C, V, false, m->bf16_ws);
        fx__gemm_bf16_force_tiled(NULL);
        char what[96];
        snprintf(what, sizeof what, "packed head's logits, %s", names[p]);
        fxt_bitwise_f32(what, lg[0], lg[1], (size_t)(nr * V));
        snprintf(what, sizeof what, "packed head's d(x), %s", names[p]);
        fxt_bitwise_f32(what, dx[0], dx[1], (size_t)(nr * C));
    }
    FXT_CHECK(fx__model_head16_bytes(&c, 64) > 0 || !n);
    free(e32), free(x), free(dz), free(E), free(lg[0]), free(lg[1]), free(dx[0]), free(dx[1]);
    fx__model_free(m);
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
            const fx__optim_ops *op = fx__optim_ops_for(isas[t]);
            /* twins, not the reference again (which would give the same bits) */
            FXT_CHECK(op->sumsq != fx__sumsq_scalar && op->adamw_f32 != fx__adamw_f32_scalar &&
                      op->adamw_bf16 != fx__adamw_bf16_scalar);
            char what[96];
            float *p = fxt_guarded_copy(p0, (size_t)n), *g = fxt_guarded_copy(g0, (size_t)n);
            float *mm = fxt_guarded_copy(m0, (size_t)n), *vv = fxt_guarded_copy(v0, (size_t)n);
            op->adamw_f32(p, g, mm, vv, n, &k);
            snprintf(what, sizeof what, "adamw f32 [%s] zero_grad %d", fx_isa_name(isas[t]), zero);
            fxt_bitwise_f32(what, p, rp, (size_t)n);
            fxt_bitwise_f32(what, g, rg, (size_t)n);
            fxt_bitwise_f32(what, mm, rm, (size_t)n);
            fxt_bitwise_f32(what, vv, rv, (size_t)n);
            fxt_guarded_free(what, p), fxt_guarded_free(what, g), fxt_guarded_free(what, mm), fxt_guarded_free(what, vv);
            p = fxt_guarded_copy(p0, (size_t)n), g = fxt_guarded_copy(g0, (size_t)n);
            uint16_t *m2 = malloc((size_t)n * 2), *v2 = malloc((size_t)n * 2);
            memcpy(m2, m16, (size_t)n * 2), memcpy(v2, v16, (size_t)n * 2);
            op->adamw_bf16(p, g, m2, v2, n, &k);
            snprintf(what, sizeof what, "adamw bf16 [%s] zero_grad %d", fx_isa_name(isas[t]), zero);
            fxt_bitwise_f32(what, p, bp, (size_t)n);
            fxt_bitwise_f32(what, g, bg, (size_t)n);
            FXT_CHECK(!memcmp(m2, bm, (size_t)n * 2) && !memcmp(v2, bv, (size_t)n * 2));
            fxt_guarded_free(what, p), fxt_guarded_free(what, g);
            free(m2), free(v2);
            /* Every length, so each tail is covered. */
            for (int64_t len = 0; len <= 40; len++) {
                double a = fx__sumsq_scalar(p0 + 3, len), b = op->sumsq(p0 + 3, len);
                if (memcmp(&a, &b, sizeof a)) {
                    FXT_FAIL("sumsq [%s] n %lld: %.17g vs scalar %.17g", fx_isa_name(isas[t]), (long long)len, b, a);
                    break;
                }
            }
            double sv = op->sumsq(p0, n);
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
    fx__model_data d;
    FXT_OK(fx__model_data_load(&d, write_tmp("a.txt", text, strlen(text)), NULL, 0.5, 2));
    /* a b \n EOT c d EOT e \n EOT */
    int32_t want[] = {'a', 'b', '\n', FX__MODEL_EOT, 'c', 'd', FX__MODEL_EOT, 'e', '\n', FX__MODEL_EOT};
    FXT_EQ_INT(d.n, 10);
    for (int i = 0; i < 10 && d.n == 10; i++)
        FXT_EQ_INT(d.tok[i], want[i]);
    FXT_EQ_INT(d.docs, 3);
    FXT_EQ_INT(d.n_train, 5);
    /* Batches are windows of the training part with next-token targets. */
    fx_rng r;
    fx_rng_init(&r, 1, 1);
    int32_t tk[6], tg[6];
    fx__model_data_batch(&d, &r, 3, 2, tk, tg);
    for (int b = 0; b < 3; b++) {
        bool found = false;
        for (int off = 0; off + 2 < 5 + 1 && !found; off++)
            found = tk[2 * b] == (int32_t)d.tok[off] && tk[2 * b + 1] == (int32_t)d.tok[off + 1] &&
                    tg[2 * b + 1] == (int32_t)d.tok[off + 2];
        FXT_CHECK(found);
    }
    fx__model_data_free(&d);
    FXT_STATUS(fx__model_data_load(&d, write_tmp("empty.txt", "", 0), NULL, 0.1, 2), FX_EINVAL, "is empty");
    FXT_STATUS(fx__model_data_load(&d, "/nonexistent/x.txt", NULL, 0.1, 2), FX_EIO, "cannot open");
    FXT_STATUS(fx__model_data_load(&d, write_tmp("bad.txt", "ok\xff\xfe", 4), NULL, 0.1, 2), FX_EFORMAT, "offset 2");
    FXT_STATUS(fx__model_data_load(&d, write_tmp("short.txt", "abc", 3), NULL, 0.1, 65), FX_EINVAL, "smaller --seq");
    FXT_STATUS(fx__model_data_load(&d, NULL, "/nonexistent/fortunes", 0.1, 2), FX_EIO, "--data FILE");
    /* UTF-8 validation. */
    FXT_EQ_INT(fx__utf8_invalid_at((const unsigned char *)"h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80", 15), -1);
    FXT_EQ_INT(fx__utf8_invalid_at((const unsigned char *)"a\xc0\xafz", 4), 1);       /* overlong */
    FXT_EQ_INT(fx__utf8_invalid_at((const unsigned char *)"ab\xed\xa0\x80", 5), 2);   /* surrogate */
    FXT_EQ_INT(fx__utf8_invalid_at((const unsigned char *)"abc\xe2\x82", 5), 3);      /* truncated */
}

/* ---- checkpoints and the training step ----------------------------------------------------------- */

static fx__model_train_state train_state(void)
{
    fx__model_train_state s = {.steps = 8, .warmup = 2, .batch = 2, .seq = 16, .accum = 2, .lr = 3e-3f,
                             .min_lr = 3e-4f, .weight_decay = 0.1f, .clip = 1.0f, .beta1 = 0.9f, .beta2 = 0.95f,
                             .seed = 5};
    fx_rng_init(&s.rng, 5, 1);
    snprintf(s.attn, sizeof s.attn, "causal");
    return s;
}

static fx__model_data corpus(void)
{
    char text[4096];
    size_t n = 0;
    for (int i = 0; n + 64 < sizeof text; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "the cat %d sat on the mat.\n%s", i % 7, i % 5 == 4 ? "%\n" : "");
    fx__model_data d;
    FXT_OK(fx__model_data_load(&d, write_tmp("corpus.txt", text, n), NULL, 0.1, 17));
    return d;
}

/* n steps; losses out. */
static void run_steps(fx__model *m, const fx__model_data *d, fx__model_train_state *s, int n, float *losses)
{
    int32_t tok[32], tgt[32];
    for (int i = 0; i < n; i++) {
        fx__model_step_info info;
        FXT_OK(fx__model_train_step(m, d, s, tok, tgt, &info));
        losses[i] = info.loss;
    }
}

/* A step whose loss is not finite is not applied: weights, Adam moments and the step count
   stay as they were (the caller saves them and stops). */
static void test_step_nonfinite_not_applied(void)
{
    fx__model_data d = corpus();
    fx_model_config c = small_cfg();
    fx__model *m = NULL;
    FXT_OK(fx__model_create(&m, &c, 9));
    if (!m)
        return;
    FXT_OK(fx__model_alloc_train(m));
    fx__model_train_state s = train_state();
    float l[2];
    run_steps(m, &d, &s, 2, l);
    size_t P = m->lay.total;
    m->params[m->lay.t[1].offset] = NAN; /* the first layer's norm: every position sees it */
    float *w = malloc(P * sizeof *w), *mo = malloc(2 * P * sizeof *mo);
    memcpy(w, m->params, P * sizeof *w);
    memcpy(mo, m->adam, 2 * P * sizeof *mo);
    int32_t tok[32], tgt[32];
    fx__model_step_info info;
    FXT_OK(fx__model_train_step(m, &d, &s, tok, tgt, &info));
    FXT_CHECK(isnan(info.loss));
    FXT_EQ_INT(s.step, 2);
    FXT_CHECK(memcmp(w, m->params, P * sizeof *w) == 0);
    FXT_CHECK(memcmp(mo, m->adam, 2 * P * sizeof *mo) == 0);
    free(w), free(mo);
    fx__model_free(m);
    fx__model_data_free(&d);
}

static void test_resume_bitwise(void)
{
    fx__model_data d = corpus();
    fx_model_config c = small_cfg();
    fx__model *a = NULL, *b = NULL, *r = NULL;
    FXT_OK(fx__model_create(&a, &c, 9));
    FXT_OK(fx__model_create(&b, &c, 9));
    FXT_OK(fx__model_create(&r, &c, 1234)); /* different init: everything must come from the file */
    if (!a || !b || !r)
        return;
    FXT_OK(fx__model_alloc_train(a));
    FXT_OK(fx__model_alloc_train(b));
    FXT_OK(fx__model_alloc_train(r));
    fx__model_train_state sa = train_state(), sb = train_state();
    float la[8], lb[8];
    run_steps(a, &d, &sa, 8, la);
    run_steps(b, &d, &sb, 4, lb);
    char path[512];
    snprintf(path, sizeof path, "%s/ck.safetensors", tmpdir);
    FXT_OK(fx__model_save_checkpoint(b, &sb, path));
    fx_model_config c2;
    fx__model_train_state sr;
    bool adam = false;
    FXT_OK(fx__model_read_config(path, &c2, &sr, &adam));
    FXT_CHECK(adam);
    FXT_EQ_INT(c2.dim, c.dim);
    FXT_EQ_INT(sr.step, 4);
    FXT_EQ_INT(sr.data_pos, sb.data_pos);
    FXT_CHECK(!memcmp(&sr.rng, &sb.rng, sizeof sr.rng));
    FXT_OK(fx__model_load(r, path, true));
    run_steps(r, &d, &sr, 4, lb + 4);
    fxt_bitwise_f32("resumed losses", lb, la, 8);
    fxt_bitwise_f32("resumed params", r->params, a->params, a->lay.total);
    fxt_bitwise_f32("resumed adam", r->adam, a->adam, 2 * a->lay.total);
    /* The loss falls over these steps. */
    FXT_CHECK(la[7] < la[0]);

    /* A model file (weights only, bf16 or f32) loads into a fresh model. */
    fx__model *g = NULL;
    FXT_OK(fx__model_create(&g, &c, 77));
    snprintf(path, sizeof path, "%s/model.safetensors", tmpdir);
    FXT_OK(fx__model_save_model(a, path, false));
    FXT_OK(fx__model_load(g, path, false));
    fxt_bitwise_f32("model f32", g->params, a->params, a->lay.total);
    FXT_OK(fx__model_save_model(a, path, true));
    FXT_OK(fx__model_load(g, path, false));
    double *ref = fxt_alloc_f64(a->lay.total);
    for (size_t i = 0; i < a->lay.total; i++)
        ref[i] = a->params[i];
    fxt_close_f32("model bf16", g->params, ref, a->lay.total, 1e-30, 1.0 / 256);
    free(ref);
    /* A model file cannot resume training. */
    FXT_STATUS(fx__model_load(r, path, true), FX_EFORMAT, "no optimizer state");

    /* A mismatched config is refused, and the model is untouched. */
    fx_model_config c3 = c;
    c3.dim = 32;
    fx__model *x = NULL;
    FXT_OK(fx__model_create(&x, &c3, 1));
    float keep = x->params[0];
    snprintf(path, sizeof path, "%s/ck.safetensors", tmpdir);
    FXT_STATUS(fx__model_load(x, path, false), FX_EINVAL, "dim=16");
    FXT_CHECK(x->params[0] == keep);
    /* A corrupted file is refused. */
    FILE *f = fopen(path, "r+b");
    if (f) {
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        FXT_CHECK(ftruncate(fileno(f), size / 2) == 0);
        fclose(f);
    }
    int rc = fx__model_load(r, path, true);
    FXT_CHECK(rc == FX_EFORMAT || rc == FX_EIO);
    FXT_CHECK(fx_last_error()[0] != '\0');
    fx__model_free(x), fx__model_free(g);
    fx__model_free(a), fx__model_free(b), fx__model_free(r);
    fx__model_data_free(&d);
}

/* 1 and 2 threads give bitwise the same training, for every mask. */
/* Recompute with parked activations (a model whose layers' gradient memory holds a layer's
   activations): training steps with two micro-batches (the first parks, the second, on
   gradients no longer clear, recomputes) give bitwise the weights and losses of keeping
   every activation, and a forward and backward on clear gradients gives their gradients. */
static void test_recompute_parked(void)
{
    fx__model_data d = corpus();
    const char *masks[] = {"causal", "document"};
    for (int mi = 0; mi < 2; mi++) {
        fx__model *m[2] = {NULL, NULL};
        float l[2][4];
        for (int v = 0; v < 2; v++) {
            fx_model_config c = small_cfg();
            c.layers = 3, c.dim = 64, c.heads = 4, c.kv_heads = 2, c.ffn = 160;
            FXT_OK(fx__model_create(&m[v], &c, 6));
            if (!m[v])
                break;
            FXT_OK(fx__model_mask_parse(masks[mi], &m[v]->mask, &m[v]->window));
            m[v]->recompute = v == 1;
            FXT_OK(fx__model_alloc_train(m[v]));
            fx__model_train_state s = train_state();
            run_steps(m[v], &d, &s, 3, l[v]);
            /* One more forward and backward by hand, on clear gradients. */
            int32_t tok[32], tgt[32];
            make_batch(2, 16, c.vocab, 13, tok, tgt, true);
            fx__model_zero_grad(m[v]);
            float loss;
            FXT_OK(fx__model_forward(m[v], tok, tgt, &loss, true));
            FXT_CHECK(m[v]->park.acts_parked == (v == 1));
            FXT_OK(fx__model_backward(m[v]));
            /* A forward pass without gradients (two residual streams in turn with recompute). */
            FXT_OK(fx__model_forward(m[v], tok, tgt, &l[v][3], false));
        }
        if (m[0] && m[1]) {
            fxt_bitwise_f32(masks[mi], m[1]->params, m[0]->params, m[0]->lay.total);
            fxt_bitwise_f32("losses", l[1], l[0], 4); /* the last: the forward without gradients */
            fxt_bitwise_f32("gradients", m[1]->grads, m[0]->grads, m[0]->lay.total);
        }
        fx__model_free(m[0]), fx__model_free(m[1]);
    }
    fx__model_data_free(&d);
}

/* The training step leaves the gradients cleared by the optimizer's pass and skips its own
   zeroing then; gradients written by anything else are zeroed first. */
static void test_step_zeroing(void)
{
    fx__model_data d = corpus();
    float *p[2] = {NULL, NULL}, l[2][2];
    for (int v = 0; v < 2; v++) {
        fx_model_config c = small_cfg();
        fx__model *m = NULL;
        FXT_OK(fx__model_create(&m, &c, 5));
        if (!m)
            break;
        FXT_OK(fx__model_alloc_train(m));
        FXT_CHECK(m->grads_zero);
        fx__model_train_state s = train_state();
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
        fx__model_free(m);
    }
    free(p[0]), free(p[1]);
    fx__model_data_free(&d);
}

static void test_threads_bitwise(void)
{
    fx__model_data d = corpus();
    const char *masks[] = {"causal", "document", "sliding:5", "dense"};
    for (int mi = 0; mi < 4; mi++) {
        float *p[2], l[2][3];
        for (int th = 0; th < 2; th++) {
            FXT_OK(fx_set_num_threads(th + 1));
            fx_model_config c = small_cfg();
            c.dim = 128, c.heads = 4, c.kv_heads = 2, c.ffn = 160; /* wide enough to split */
            fx__model *m = NULL;
            FXT_OK(fx__model_create(&m, &c, 9));
            if (!m)
                return;
            FXT_OK(fx__model_mask_parse(masks[mi], &m->mask, &m->window));
            FXT_OK(fx__model_alloc_train(m));
            fx__model_train_state s = train_state();
            run_steps(m, &d, &s, 3, l[th]);
            p[th] = malloc(m->lay.total * sizeof(float));
            memcpy(p[th], m->params, m->lay.total * sizeof(float));
            if (th == 1) {
                fxt_bitwise_f32(masks[mi], p[0], p[1], m->lay.total);
                fxt_bitwise_f32("losses", l[0], l[1], 3);
            }
            fx__model_free(m);
        }
        free(p[0]), free(p[1]);
    }
    fx_set_num_threads(2);
    fx__model_data_free(&d);
}

static void test_config_errors(void)
{
    fx_model_config c;
    FXT_STATUS(fx__model_preset(&c, "huge"), FX_EINVAL, "'huge'");
    FXT_OK(fx__model_preset(&c, "small"));
    FXT_OK(fx__model_config_check(&c));
    FXT_EQ_INT(c.ffn, 1024);
    fx__model *m = NULL;
    FXT_OK(fx__model_create(&m, &c, 1));
    if (m) {
        /* about 10M parameters */
        FXT_CHECK(m->lay.total > 9000000 && m->lay.total < 11000000);
        FXT_STATUS(fx__model_set_batch(m, 1, 257), FX_EINVAL, "context");
        fx__model_free(m);
    }
    c.heads = 5;
    FXT_STATUS(fx__model_config_check(&c), FX_EINVAL, "heads = 5");
    FXT_OK(fx__model_preset(&c, "small"));
    c.kv_heads = 4;
    FXT_STATUS(fx__model_config_check(&c), FX_EINVAL, "kv_heads = 4");
    fx__model_mask mk;
    int64_t w;
    FXT_STATUS(fx__model_mask_parse("sliding:x", &mk, &w), FX_EINVAL, "sliding:x");
    FXT_STATUS(fx__model_mask_parse("full", &mk, &w), FX_EINVAL, "'full'");
    FXT_OK(fx__model_mask_parse("sliding:128", &mk, &w));
    FXT_EQ_INT(w, 128);
    /* Token ids are checked before any work. */
    FXT_OK(fx__model_preset(&c, "tiny"));
    FXT_OK(fx__model_create(&m, &c, 1));
    if (m) {
        FXT_OK(fx__model_set_batch(m, 1, 4));
        int32_t tok[4] = {1, 2, 300, 4}, tgt[4] = {1, 2, 3, 4};
        float loss = 7;
        FXT_STATUS(fx__model_forward(m, tok, tgt, &loss, false), FX_ERANGE, "token[2] = 300");
        FXT_CHECK(loss == 7);
        fx__model_free(m);
    }
}

/* A configuration as one line from the field table: the fields every file has, and the later
   ones only where they differ from what a file without them means. */
static void test_config_format(void)
{
    fx_model_config c;
    FXT_OK(fx__model_preset(&c, "small"));
    FXT_OK(fx__model_config_check(&c));
    char buf[512];
    const char *want = "vocab=257 ctx=256 layers=6 dim=384 heads=6 kv_heads=2 ffn=1024 rope_theta=10000 "
                       "norm_eps=1e-05 head_dim=64";
    FXT_EQ_INT((long long)fx__config_format(&c, buf, sizeof buf), (long long)strlen(want));
    FXT_EQ_STR(buf, want);
    /* Every later field away from its default. */
    c = llama_cfg();
    c.eos[0] = 3, c.eos[1] = 7, c.n_eos = 2;
    FXT_OK(fx__model_config_check(&c));
    const size_t len = fx__config_format(&c, buf, sizeof buf);
    FXT_EQ_STR(buf, "vocab=257 ctx=16 layers=2 dim=16 heads=4 kv_heads=2 ffn=24 rope_theta=10000 norm_eps=1e-05 "
                    "arch=LlamaForCausalLM head_dim=6 qkv_bias=1 tied_embeddings=0 sliding_window=5 "
                    "rope_scaling=llama3:8:1:4:8 eos=3,7");
    /* As snprintf: the whole length, a truncated NUL-terminated prefix. */
    FXT_EQ_INT((long long)fx__config_format(&c, NULL, 0), (long long)len);
    char small[12];
    FXT_EQ_INT((long long)fx__config_format(&c, small, sizeof small), (long long)len);
    FXT_EQ_STR(small, "vocab=257 c");
}

/* The architecture table's columns agree with the configuration's: a row is present by a bool
   shape field, a bias is a vector as long as its product's output (permuted as its rows are),
   and a layout holds the rows a configuration has, in the table's order. */
static void test_arch_table(void)
{
    for (size_t k = 0; k < fx__arch_nlayer + FX__ARCH_MODEL; k++) {
        const fx__arch_tensor *t = k < fx__arch_nlayer ? &fx__arch_layer[k] : &fx__arch_model[k - fx__arch_nlayer];
        if (t->when.on) {
            const fx__config_field *f = NULL;
            for (size_t i = 0; i < fx__config_nfields; i++)
                if (fx__config_fields[i].offset == t->when.field)
                    f = &fx__config_fields[i];
            FXT_CHECK(f && f->kind == FX__FIELD_BOOL && f->shape);
        }
        if (t->bias_of < 0)
            continue;
        FXT_CHECK(k < fx__arch_nlayer && t->cols == FX__LEN_NONE && (size_t)t->bias_of < fx__arch_nlayer);
        const fx__arch_tensor *w = &fx__arch_layer[t->bias_of];
        FXT_CHECK(w->cols != FX__LEN_NONE && w->rows == t->rows && w->rope == t->rope);
        FXT_EQ_INT(fx__arch_bias_row(t->bias_of), (long long)k);
    }
    FXT_EQ_INT(fx__arch_bias_row(FX__MODEL_WQ), FX__MODEL_BQ);
    FXT_EQ_INT(fx__arch_bias_row(FX__MODEL_WO), -1);
    FXT_EQ_INT(fx__arch_bias_row(-1), -1);
    for (int bias = 0; bias < 2; bias++) {
        fx_model_config c = small_cfg();
        c.qkv_bias = bias;
        fx__model *m = NULL;
        FXT_OK(fx__model_create(&m, &c, 1));
        if (!m)
            continue;
        FXT_EQ_INT((long long)m->lay.per_layer, bias ? 12 : 9);
        FXT_EQ_INT((long long)fx__arch_layer_count(&c), (long long)m->lay.per_layer);
        const fx__model_tensor *t = fx__layer_first(m, 1);
        for (size_t i = 1; i < m->lay.per_layer; i++)
            FXT_CHECK(t[i].arch > t[i - 1].arch && t[i].arch < fx__arch_layer + fx__arch_nlayer);
        fx__model_free(m);
    }
}

/* ---- Llama-family features ------------------------------------------------------------------- */

/* llama3 RoPE frequencies against transformers' (float32) for three configurations; plain
   theta is the pow of the table the GPT always used. */
static void test_rope_llama3(void)
{
    for (size_t k = 0; k < sizeof fxt_rope_cases / sizeof fxt_rope_cases[0]; k++) {
        const fxt_rope_case *rc = &fxt_rope_cases[k];
        fx_model_config c = small_cfg();
        c.head_dim = rc->head_dim, c.rope_theta = rc->theta;
        c.rope_scaling.type = FX_ROPE_SCALING_LLAMA3;
        c.rope_scaling.factor = rc->factor, c.rope_scaling.low_freq_factor = rc->low;
        c.rope_scaling.high_freq_factor = rc->high, c.rope_scaling.original_max_position_embeddings = rc->original;
        FXT_OK(fx__model_config_check(&c));
        int64_t half = rc->head_dim / 2;
        double *freq = fxt_alloc_f64((size_t)half), *ref = fxt_alloc_f64((size_t)half);
        fx__rope_freqs(freq, &c);
        float *got = malloc((size_t)half * sizeof(float));
        for (int64_t i = 0; i < half; i++)
            got[i] = (float)freq[i], ref[i] = rc->inv_freq[i];
        /* transformers computes theta^(-2i/hd) in float32: a few ulp. */
        fxt_close_f32("llama3 inv_freq", got, ref, (size_t)half, 0.0, 4e-6);
        c.rope_scaling.type = FX_ROPE_SCALING_NONE;
        fx__rope_freqs(freq, &c);
        for (int64_t i = 0; i < half; i++)
            FXT_CHECK(freq[i] == pow((double)rc->theta, -2.0 * (double)i / (double)rc->head_dim));
        free(freq), free(ref), free(got);
    }
    /* The table rows: cos, sin of position * frequency, for any range of positions. */
    fx_model_config c = llama_cfg();
    FXT_OK(fx__model_config_check(&c));
    double freq[3];
    fx__rope_freqs(freq, &c);
    float rows[10 * 6];
    fx__rope_rows(rows, 0, 10, freq, 6);
    float tail[10 * 6];
    fx__rope_rows(tail, 7, 10, freq, 6);
    fxt_bitwise_f32("rope rows 7..9", tail + 7 * 6, rows + 7 * 6, 3 * 6);
    FXT_NEAR(rows[9 * 6 + 2 * 2 + 1], sin(9.0 * freq[2]), 1e-7, 0);
}

/* A model with Llama 3's context (131072) never builds a [ctx, ...] RoPE table: the table
   covers the positions in use. */
static void test_rope_lazy(void)
{
    fx_model_config c = small_cfg();
    c.ctx = 131072;
    fx__model *m = NULL;
    FXT_OK(fx__model_create(&m, &c, 1));
    if (!m)
        return;
    FXT_EQ_INT(m->rope_len, 0);
    FXT_OK(fx__model_set_batch(m, 1, 12));
    FXT_CHECK(m->rope_len >= 12 && m->rope_len <= 24);
    fx__model_cache *kc = NULL;
    FXT_OK(fx__model_cache_create(&kc, m, 100));
    FXT_CHECK(m->rope_len >= 100 && m->rope_len <= 200);
    /* Growing keeps the rows already there and adds the same rows a fresh table has. */
    double freq[2];
    fx__rope_freqs(freq, &m->c);
    float *fresh = malloc((size_t)(m->rope_len * 4) * sizeof(float));
    fx__rope_rows(fresh, 0, m->rope_len, freq, 4);
    fxt_bitwise_f32("grown rope table", m->rope, fresh, (size_t)(m->rope_len * 4));
    free(fresh);
    fx__model_cache_free(kc);
    FXT_STATUS(fx__model_rope_ensure(m, 131073), FX_EINVAL, "context");
    fx__model_free(m);
}

/* The sliding window follows transformers' Mistral convention: a query at i sees the keys j
   with i - W < j <= i. */
static void test_sliding_window_convention(void)
{
    fx_model_config c = llama_cfg();
    fx__model *m = NULL;
    FXT_OK(fx__model_create(&m, &c, 1));
    if (!m)
        return;
    FXT_EQ_INT(m->mask, FX__MODEL_MASK_SLIDING);
    FXT_EQ_INT(m->window, 5);
    fx__model_mask_ctx mc = {.sliding = {.window = m->window}};
    const void *ctx;
    fx_mask_fn fn = fx__model_mask_fn(m->mask, &mc, &ctx);
    for (int64_t i = 0; i < 12; i++)
        for (int64_t j = 0; j < 12; j++)
            if (fn(0, 0, i, j, ctx) != (i - 5 < j && j <= i))
                FXT_FAIL("query %lld, key %lld: visible = %d", (long long)i, (long long)j, (int)fn(0, 0, i, j, ctx));
    fx__model_free(m);
}

/* --attn document splits at the model's first eos id (a Hugging Face model's, not flexc's
   byte end-of-text 256, which is an ordinary token of a larger vocabulary): the second
   document's logits equal those of the document alone, and the first document's (the eos
   closes it; it holds a 256) those of a causal run over it. */
static void test_document_eos(void)
{
    fx_model_config c = small_cfg();
    c.vocab = 300, c.eos[0] = 1, c.n_eos = 1;
    const int32_t full[12] = {5, 6, 7, 256, 8, 1, 9, 10, 11, 12, 13, 14};
    const int64_t V = c.vocab, split = 6;
    for (int impl = 0; impl < 2; impl++) {
        fx__model *m = NULL;
        FXT_OK(fx__model_create(&m, &c, 3));
        if (!m)
            return;
        m->attn_impl = impl ? FX__MODEL_ATTN_REF : FX__MODEL_ATTN_FLEX;
        float *got = malloc((size_t)(12 * V) * sizeof(float)), *part = malloc((size_t)(12 * V) * sizeof(float));
        double *ref = malloc((size_t)(12 * V) * sizeof(double));
        float loss;
        m->mask = FX__MODEL_MASK_DOCUMENT;
        FXT_OK(fx__model_set_batch(m, 1, 12));
        FXT_OK(fx__model_forward(m, full, NULL, &loss, false));
        fx__model_logits(m, got, false);
        /* The second document alone (RoPE is relative: equal within rounding). */
        FXT_OK(fx__model_set_batch(m, 1, 12 - split));
        FXT_OK(fx__model_forward(m, full + split, NULL, &loss, false));
        fx__model_logits(m, part, false);
        for (int64_t i = 0; i < (12 - split) * V; i++)
            ref[i] = part[i];
        fxt_close_f32(impl ? "second document (reference attention)" : "second document", got + split * V, ref,
                      (size_t)((12 - split) * V), 1e-4, 1e-4);
        /* The first document, eos included, under a plain causal mask. */
        m->mask = FX__MODEL_MASK_CAUSAL;
        FXT_OK(fx__model_set_batch(m, 1, split));
        FXT_OK(fx__model_forward(m, full, NULL, &loss, false));
        fx__model_logits(m, part, false);
        for (int64_t i = 0; i < split * V; i++)
            ref[i] = part[i];
        fxt_close_f32(impl ? "first document (reference attention)" : "first document", got, ref,
                      (size_t)(split * V), 1e-5, 1e-5);
        /* Decoding with the KV cache splits where training does: a prompt that starts with the
           eos id is a new document after it (the last position's logits as the forward's). */
        const int32_t seq[4] = {1, 8, 9, 10};
        m->mask = FX__MODEL_MASK_DOCUMENT;
        FXT_OK(fx__model_set_batch(m, 1, 4));
        FXT_OK(fx__model_forward(m, seq, NULL, &loss, false));
        fx__model_logits(m, part, false);
        fx__model_cache *kc = NULL;
        FXT_OK(fx__model_cache_create(&kc, m, 8));
        if (kc) {
            FXT_OK(fx__model_decode(m, kc, seq, 4, got));
            for (int64_t i = 0; i < V; i++)
                ref[i] = part[3 * V + i];
            fxt_close_f32(impl ? "decode after eos (reference attention)" : "decode after eos", got, ref, (size_t)V,
                          1e-4, 1e-4);
            fx__model_cache_free(kc);
        }
        free(got), free(part), free(ref);
        fx__model_free(m);
    }
}

/* Builds a model from a fixture of transformers (see scripts/make_model_fixtures.py) through
   the public API: config, create, tensors by name. */
static fx_model *hf_fixture_model(const fxt_hf_case *h)
{
    fx_model_config c = {.vocab = h->vocab, .ctx = h->ctx, .layers = h->layers, .dim = h->dim, .heads = h->heads,
                         .kv_heads = h->kv_heads, .head_dim = h->head_dim, .ffn = h->ffn, .rope_theta = h->theta,
                         .norm_eps = h->norm_eps, .qkv_bias = h->qkv_bias, .tied_embeddings = h->tied,
                         .sliding_window = h->window};
    snprintf(c.arch, sizeof c.arch, "%s", h->arch);
    if (h->llama3) {
        c.rope_scaling.type = FX_ROPE_SCALING_LLAMA3;
        c.rope_scaling.factor = h->factor, c.rope_scaling.low_freq_factor = h->low;
        c.rope_scaling.high_freq_factor = h->high, c.rope_scaling.original_max_position_embeddings = h->original;
    }
    fx_model *m = NULL;
    FXT_OK(fx_model_create(&m, &c, 1));
    if (!m)
        return NULL;
    FXT_EQ_INT(fx_model_tensor_count(m), h->n_tensors);
    for (int i = 0; i < h->n_tensors; i++) {
        fx_model_tensor t;
        FXT_OK(fx_model_tensor_find(m, h->tensors[i].name, &t));
        FXT_EQ_INT(t.numel, h->tensors[i].numel);
        if (t.data && t.numel == (size_t)h->tensors[i].numel)
            memcpy(t.data, h->tensors[i].data, t.numel * sizeof(float));
    }
    return m;
}

/* Qwen2 (q/k/v biases, untied head), Llama with llama3 RoPE and Mistral with a sliding
   window, head_dim 6 != 8 / 2: logits against transformers' float64 forward, through the
   forward pass (flex and reference attention) and the KV cache. */
static void test_hf_reference(void)
{
    for (size_t k = 0; k < sizeof fxt_hf_cases / sizeof fxt_hf_cases[0]; k++) {
        const fxt_hf_case *h = &fxt_hf_cases[k];
        fx_model *m = hf_fixture_model(h);
        if (!m)
            return;
        int64_t T = h->T, V = h->vocab;
        float *logits = fxt_guarded((size_t)(T * V));
        char what[96];
        for (int impl = 0; impl < 2; impl++) {
            m->attn_impl = impl ? FX__MODEL_ATTN_REF : FX__MODEL_ATTN_FLEX;
            FXT_OK(fx_model_forward(m, NULL, logits, h->tokens, NULL, 1, T, 0));
            snprintf(what, sizeof what, "%s logits (%s attention)", h->arch, impl ? "reference" : "flex");
            fxt_close_f32(what, logits, h->logits, (size_t)(T * V), 1e-4, 1e-4);
        }
        m->attn_impl = FX__MODEL_ATTN_FLEX;
        /* Decoding: a prefill of 3, then one token at a time; each step's logits are the row of
           the position just fed. */
        fx_model_cache *c = NULL;
        FXT_OK(fx_model_cache_create(&c, m, T));
        float *row = fxt_guarded((size_t)V);
        for (int64_t t = 0; c && t < T;) {
            if (t == 0) {
                FXT_OK(fx_model_prefill(m, c, row, h->tokens, 3));
                t = 3;
            } else {
                FXT_OK(fx_model_decode_step(m, c, row, h->tokens[t]));
                t++;
            }
            snprintf(what, sizeof what, "%s decode position %lld", h->arch, (long long)(t - 1));
            fxt_close_f32(what, row, h->logits + (t - 1) * V, (size_t)V, 1e-4, 1e-4);
        }
        fxt_guarded_free("decode logits", row);
        fxt_guarded_free("logits", logits);
        fx_model_cache_free(c);
        fx_model_free(m);
    }
}

/* A Llama 3 vocabulary (128256) through the fused loss: the loss and every gradient as the
   unfused path's, ids at the top of the range included. */
static void test_large_vocab(void)
{
    fx_model_config c = small_cfg();
    c.vocab = 128256, c.dim = 8, c.heads = 2, c.kv_heads = 1, c.ffn = 16, c.layers = 1, c.ctx = 8;
    c.tied_embeddings = false;
    fx__model *a = NULL, *b = NULL;
    FXT_OK(fx__model_create(&a, &c, 2));
    FXT_OK(fx__model_create(&b, &c, 2));
    if (!a || !b)
        return;
    b->loss_impl = FX__MODEL_LOSS_UNFUSED;
    FXT_OK(fx__model_alloc_grads(a));
    FXT_OK(fx__model_alloc_grads(b));
    FXT_OK(fx__model_set_batch(a, 2, 8));
    FXT_OK(fx__model_set_batch(b, 2, 8));
    int32_t tok[16], tgt[16];
    make_batch(2, 8, c.vocab, 31, tok, tgt, false);
    tok[1] = (int32_t)c.vocab - 1, tgt[4] = (int32_t)c.vocab - 1, tgt[9] = 0;
    float la, lb;
    FXT_OK(fx__model_forward(a, tok, tgt, &la, true));
    FXT_OK(fx__model_backward(a));
    FXT_OK(fx__model_forward(b, tok, tgt, &lb, true));
    FXT_OK(fx__model_backward(b));
    FXT_NEAR(la, lb, 1e-5, 1e-5);
    FXT_NEAR(la, log(128256.0), 0.05, 0); /* a fresh model is about uniform */
    double *ref = fxt_alloc_f64(a->lay.total);
    for (size_t i = 0; i < a->lay.total; i++)
        ref[i] = b->grads[i];
    fxt_close_f32("grads, vocab 128256", a->grads, ref, a->lay.total, 1e-7, 1e-3);
    free(ref);
    fx__model_free(a), fx__model_free(b);
    /* The id range is the int32 range. */
    c.vocab = (int64_t)INT32_MAX + 1;
    FXT_STATUS(fx__model_config_check(&c), FX_EINVAL, "vocab = 2147483648");
}

/* Every feature at once, forward + backward + logits + decoding: bitwise the same at 1 and
   2 threads. */
static void test_features_threads_bitwise(void)
{
    float *g[2] = {0}, *lg[2] = {0}, *dl[2] = {0};
    size_t P = 0;
    int64_t B = 2, T = 16, V = 257;
    for (int th = 0; th < 2; th++) {
        FXT_OK(fx_set_num_threads(th + 1));
        fx_model_config c = llama_cfg();
        c.dim = 128, c.heads = 4, c.kv_heads = 2, c.head_dim = 40, c.ffn = 160; /* wide enough to split */
        fx__model *m = NULL;
        FXT_OK(fx__model_create(&m, &c, 9));
        if (!m)
            return;
        randomize_biases(m, 10);
        int32_t tok[32], tgt[32];
        make_batch(B, T, V, 13, tok, tgt, false);
        float loss;
        lg[th] = malloc((size_t)(B * T * V) * sizeof(float));
        dl[th] = malloc((size_t)V * sizeof(float));
        FXT_OK(fx_model_forward(m, &loss, lg[th], tok, tgt, B, T, FX_MODEL_GRAD));
        FXT_OK(fx_model_backward(m));
        P = m->lay.total;
        g[th] = malloc(P * sizeof(float));
        memcpy(g[th], m->grads, P * sizeof(float));
        fx_model_cache *kc = NULL;
        FXT_OK(fx_model_cache_create(&kc, m, T));
        FXT_OK(fx_model_prefill(m, kc, dl[th], tok, T - 1));
        FXT_OK(fx_model_decode_step(m, kc, dl[th], tok[T - 1]));
        fx_model_cache_free(kc);
        fx__model_free(m);
    }
    if (g[0] && g[1]) {
        fxt_bitwise_f32("gradients", g[0], g[1], P);
        fxt_bitwise_f32("logits", lg[0], lg[1], (size_t)(B * T * V));
        fxt_bitwise_f32("decoded logits", dl[0], dl[1], (size_t)V);
    }
    for (int th = 0; th < 2; th++)
        free(g[th]), free(lg[th]), free(dl[th]);
    fx_set_num_threads(2);
}

/* A model file written before the model API (no head_dim, eos, ... in its metadata) loads
   as the byte-level GPT it is, with its tensors as stored. */
static void test_old_model_file(void)
{
    const char *src = getenv("FLEXC_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/gpt_v1_tiny.safetensors", src ? src : "..");
    fx_model *m = NULL;
    FXT_OK(fx_model_load(&m, path));
    if (!m)
        return;
    const fx_model_config *c = fx_model_get_config(m);
    FXT_EQ_STR(c->arch, "flexc-gpt");
    FXT_EQ_INT(c->vocab, 257);
    FXT_EQ_INT(c->dim, 16);
    FXT_EQ_INT(c->head_dim, 8);
    FXT_CHECK(c->tied_embeddings && !c->qkv_bias && c->sliding_window == 0);
    FXT_CHECK(c->rope_scaling.type == FX_ROPE_SCALING_NONE);
    FXT_EQ_INT(c->n_eos, 1);
    FXT_EQ_INT(c->eos[0], 256);
    fx_safetensors *f = NULL;
    FXT_OK(fx_safetensors_open(&f, path));
    FXT_EQ_INT(fx_safetensors_count(f), fx_model_tensor_count(m));
    for (size_t i = 0; f && i < fx_model_tensor_count(m); i++) {
        fx_model_tensor t;
        FXT_OK(fx_model_tensor_at(m, i, &t));
        const fx_tensor_view *v = fx_safetensors_find(f, t.name);
        FXT_CHECK(v && v->nbytes == t.numel * sizeof(float));
        if (v && v->nbytes == t.numel * sizeof(float))
            fxt_bitwise_f32(t.name, t.data, v->data, t.numel);
    }
    fx_safetensors_free(f);
    fx_model_free(m);
}

/* A checkpoint's values are held to the ranges train's options are (model/run_params.c) and
   the configuration's (fx__model_config_check), whoever reads it: fx__model_read_config and
   the public fx_model_load refuse a value out of range with FX_EFORMAT, naming the file, the
   key and the value; a good state reads back. */
static void test_ckpt_values_checked(void)
{
    fx_model_config c = small_cfg();
    fx__model *m = NULL;
    FXT_OK(fx__model_create(&m, &c, 3));
    if (!m)
        return;
    FXT_OK(fx__model_alloc_train(m));
    char path[512];
    snprintf(path, sizeof path, "%s/values.safetensors", tmpdir);
    fx_model_config rc;
    fx__model_train_state rs;
    fx_model *pm = NULL;
    fx__model_train_state good = train_state();
    FXT_OK(fx__model_save_checkpoint(m, &good, path));
    FXT_OK(fx__model_read_config(path, &rc, &rs, NULL));
    FXT_CHECK(rs.lr == good.lr && rs.batch == good.batch);
    FXT_OK(fx_model_load(&pm, path));
    fx_model_free(pm);
    pm = NULL;

    static const char *const msgs[] = {
        "training state lr = -1 must be > 0",
        "training state steps = 0 must be >= 1",
        "training state batch = 99999 is outside [1, 65536]",
        "training state beta1 = 1 must be in [0, 1)",
        "training state min_lr = 0.5 is above lr = 0.00300000003",
        "training state seq = 0 is outside [1, ",
    };
    fx__model_train_state s[6];
    for (int i = 0; i < 6; i++)
        s[i] = good;
    s[0].lr = -1;
    s[1].steps = 0;
    s[2].batch = 99999;
    s[3].beta1 = 1;
    s[4].min_lr = 0.5f;
    s[5].seq = 0;
    char want[700];
    for (int i = 0; i < 6; i++) {
        FXT_OK(fx__model_save_checkpoint(m, &s[i], path));
        snprintf(want, sizeof want, "'%s': %s", path, msgs[i]);
        FXT_STATUS(fx__model_read_config(path, &rc, &rs, NULL), FX_EFORMAT, want);
        FXT_STATUS(fx_model_load(&pm, path), FX_EFORMAT, want);
        FXT_CHECK(pm == NULL);
    }
    /* The configuration: head_dim 0 and an unknown arch, as a file would carry them. */
    m->c.head_dim = 0;
    FXT_OK(fx__model_save_checkpoint(m, &good, path));
    m->c.head_dim = c.dim / c.heads;
    snprintf(want, sizeof want, "'%s': metadata head_dim = 0", path);
    FXT_STATUS(fx_model_load(&pm, path), FX_EFORMAT, want);
    snprintf(m->c.arch, sizeof m->c.arch, "GPT5ForCausalLM");
    FXT_OK(fx__model_save_checkpoint(m, &good, path));
    snprintf(m->c.arch, sizeof m->c.arch, "flexc-gpt");
    snprintf(want, sizeof want, "'%s': metadata arch = 'GPT5ForCausalLM' is not flexc-gpt", path);
    FXT_STATUS(fx_model_load(&pm, path), FX_EFORMAT, want);
    FXT_STATUS(fx__model_read_config(path, &rc, NULL, NULL), FX_EFORMAT, want);
    fx__model_free(m);
}

/* ---- the public API ------------------------------------------------------------------------------ */

static void test_api_config(void)
{
    fx_model_config c;
    FXT_STATUS(fx_model_preset(&c, "huge"), FX_EINVAL, "'huge'");
    FXT_OK(fx_model_preset(&c, "tiny"));
    FXT_CHECK(c.tied_embeddings && c.n_eos == 1 && c.eos[0] == 256);
    FXT_OK(fx_model_config_validate(&c));
    FXT_EQ_INT(c.head_dim, 16);
    FXT_EQ_STR(c.arch, "flexc-gpt");
    fx_model_config d = c;
    d.head_dim = 7;
    FXT_STATUS(fx_model_config_validate(&d), FX_EINVAL, "head_dim = 7");
    d = c, d.vocab = 1;
    FXT_STATUS(fx_model_config_validate(&d), FX_EINVAL, "vocab = 1");
    d = c, d.sliding_window = -1;
    FXT_STATUS(fx_model_config_validate(&d), FX_EINVAL, "sliding_window = -1");
    d = c, d.eos[0] = 300;
    FXT_STATUS(fx_model_config_validate(&d), FX_EINVAL, "eos[0] = 300");
    d = c, d.n_eos = 9;
    FXT_STATUS(fx_model_config_validate(&d), FX_EINVAL, "n_eos = 9");
    d = c, d.rope_scaling.type = FX_ROPE_SCALING_LLAMA3;
    FXT_STATUS(fx_model_config_validate(&d), FX_EINVAL, "rope_scaling.factor");
    d.rope_scaling.factor = 8, d.rope_scaling.low_freq_factor = 4, d.rope_scaling.high_freq_factor = 1;
    FXT_STATUS(fx_model_config_validate(&d), FX_EINVAL, "low_freq_factor");
    d.rope_scaling.low_freq_factor = 1, d.rope_scaling.high_freq_factor = 4;
    FXT_STATUS(fx_model_config_validate(&d), FX_EINVAL, "original_max_position_embeddings");
    d = c, d.norm_eps = 0;
    FXT_STATUS(fx_model_config_validate(&d), FX_EINVAL, "norm_eps");
    d = c, d.dim = 18, d.head_dim = 0;
    FXT_STATUS(fx_model_config_validate(&d), FX_EINVAL, "dim = 18 is not a multiple of heads = 4");
    d.head_dim = 6; /* Hq * hd = 24 != dim: allowed */
    FXT_OK(fx_model_config_validate(&d));
    fx_model *m = (fx_model *)&d; /* must stay untouched */
    FXT_STATUS(fx_model_create(&m, NULL, 1), FX_EINVAL, "config");
    FXT_CHECK(m == (fx_model *)&d);
    d.layers = 0;
    FXT_STATUS(fx_model_create(&m, &d, 1), FX_EINVAL, "layers = 0");
    FXT_CHECK(m == (fx_model *)&d);
    FXT_STATUS(fx_model_load(&m, "/nonexistent/model"), FX_EIO, "no such file");
    FXT_CHECK(m == (fx_model *)&d);
    char hf[300];
    snprintf(hf, sizeof hf, "%s/empty", tmpdir);
    mkdir(hf, 0700);
    FXT_STATUS(fx_model_load(&m, hf), FX_EINVAL, "holds neither");
    snprintf(hf, sizeof hf, "%s/hf", tmpdir);
    mkdir(hf, 0700);
    snprintf(hf, sizeof hf, "%s/hf/config.json", tmpdir);
    FILE *fp = fopen(hf, "w");
    if (fp)
        fputs("{}", fp), fclose(fp);
    snprintf(hf, sizeof hf, "%s/hf", tmpdir);
    int rc = fx_model_load(&m, hf); /* the Hugging Face loader: whatever it says, it says it cleanly */
    FXT_CHECK(rc != FX_OK);
    FXT_CHECK(m == (fx_model *)&d);
}

static fx_model *api_model(uint64_t seed)
{
    fx_model_config c = llama_cfg();
    fx_model *m = NULL;
    FXT_OK(fx_model_create(&m, &c, seed));
    if (m)
        randomize_biases(m, seed + 1);
    return m;
}

/* Bad arguments: the right status, a message, and outputs untouched. */
static void test_api_errors(void)
{
    fx_model *m = api_model(3);
    if (!m)
        return;
    int64_t V = 257;
    int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tgt[8] = {2, 3, 4, 5, 6, 7, 8, -100};
    float loss = 7.0f;
    float *logits = fxt_guarded((size_t)(8 * V));
    for (int64_t i = 0; i < 8 * V; i++)
        logits[i] = 3.0f;
    tok[5] = 257;
    FXT_STATUS(fx_model_forward(m, &loss, logits, tok, tgt, 1, 8, 0), FX_ERANGE, "token[5] = 257");
    tok[5] = 6, tgt[6] = -1;
    FXT_STATUS(fx_model_forward(m, &loss, logits, tok, tgt, 1, 8, 0), FX_ERANGE, "target[6] = -1");
    tgt[6] = 8;
    FXT_STATUS(fx_model_forward(m, &loss, logits, tok, tgt, 1, 17, 0), FX_EINVAL, "T = 17");
    FXT_STATUS(fx_model_forward(m, &loss, logits, tok, tgt, 0, 8, 0), FX_EINVAL, "B = 0");
    FXT_STATUS(fx_model_forward(m, &loss, logits, tok, NULL, 1, 8, 0), FX_EINVAL, "needs targets");
    FXT_STATUS(fx_model_forward(m, NULL, logits, tok, NULL, 1, 8, FX_MODEL_GRAD), FX_EINVAL, "needs targets");
    FXT_STATUS(fx_model_forward(m, NULL, logits, tok, tgt, 1, 8, 8), FX_EINVAL, "flags");
    FXT_STATUS(fx_model_forward(m, NULL, logits, NULL, tgt, 1, 8, 0), FX_EINVAL, "tokens");
    FXT_CHECK(loss == 7.0f);
    bool same = true;
    for (int64_t i = 0; i < 8 * V; i++)
        same &= logits[i] == 3.0f;
    FXT_CHECK(same);
    FXT_STATUS(fx_model_backward(m), FX_EINVAL, "no forward with gradients");
    fx_model_zero_grad(m); /* no gradient buffer yet: a no-op */
    fx_model_tensor t = {.name = "keep"};
    FXT_STATUS(fx_model_tensor_at(m, fx_model_tensor_count(m), &t), FX_ERANGE, "tensor");
    FXT_STATUS(fx_model_tensor_find(m, "layers.9.attn.wq", &t), FX_EINVAL, "layers.9.attn.wq");
    FXT_EQ_STR(t.name, "keep");
    FXT_OK(fx_model_tensor_find(m, "lm_head", &t));
    FXT_CHECK(t.ndim == 2 && t.shape[0] == V && t.shape[1] == 16 && t.grad == NULL);
    FXT_OK(fx_model_tensor_find(m, "layers.1.attn.bk", &t));
    FXT_CHECK(t.ndim == 1 && t.shape[0] == 12);
    FXT_OK(fx_model_tensor_find(m, "layers.0.attn.wq", &t));
    FXT_CHECK(t.shape[0] == 24 && t.shape[1] == 16);
    /* Caches: sized by the caller, within the context. */
    fx_model_cache *c = NULL;
    FXT_STATUS(fx_model_cache_create(&c, m, 0), FX_EINVAL, "max_len = 0");
    FXT_STATUS(fx_model_cache_create(&c, m, 17), FX_EINVAL, "max_len = 17");
    FXT_CHECK(c == NULL);
    FXT_OK(fx_model_cache_create(&c, m, 4));
    if (!c)
        return;
    FXT_EQ_INT(fx_model_cache_capacity(c), 4);
    float *row = fxt_guarded((size_t)V);
    row[0] = 5.0f;
    FXT_STATUS(fx_model_decode_step(m, c, row, 1), FX_EINVAL, "empty");
    FXT_STATUS(fx_model_prefill(m, c, row, tok, 5), FX_ERANGE, "5 tokens");
    tok[1] = -3;
    FXT_STATUS(fx_model_prefill(m, c, row, tok, 3), FX_ERANGE, "token[1] = -3");
    tok[1] = 2;
    FXT_CHECK(row[0] == 5.0f);
    FXT_EQ_INT(fx_model_cache_len(c), 0);
    FXT_OK(fx_model_prefill(m, c, row, tok, 3));
    FXT_STATUS(fx_model_decode_step(m, c, row, 300), FX_ERANGE, "token[0] = 300");
    FXT_OK(fx_model_decode_step(m, c, row, 4));
    FXT_EQ_INT(fx_model_cache_len(c), 4);
    row[0] = 5.0f;
    FXT_STATUS(fx_model_decode_step(m, c, row, 5), FX_ERANGE, "full");
    FXT_CHECK(row[0] == 5.0f);
    FXT_EQ_INT(fx_model_cache_len(c), 4);
    fx_model *other = api_model(3);
    FXT_STATUS(fx_model_prefill(other, c, row, tok, 2), FX_EINVAL, "another model");
    fx_model_free(other);
    /* Sampling options. */
    int32_t out = 99;
    fx_sample_opts so = {.temperature = 1, .top_k = 0, .top_p = 0};
    fx_rng rng;
    fx_rng_init(&rng, 1, 0);
    FXT_STATUS(fx_sample(&out, row, V, &so, &rng, NULL), FX_EINVAL, "top_p = 0");
    so.top_p = 1, so.top_k = -1;
    FXT_STATUS(fx_sample(&out, row, V, &so, &rng, NULL), FX_EINVAL, "top_k = -1");
    so.top_k = 0, so.temperature = -1;
    FXT_STATUS(fx_sample(&out, row, V, &so, &rng, NULL), FX_EINVAL, "temperature = -1");
    so.temperature = 1;
    FXT_STATUS(fx_sample(&out, row, V, &so, &rng, NULL), FX_EINVAL, "scratch");
    FXT_EQ_INT(out, 99);
    fx_generate_opts g = fx_generate_defaults();
    int64_t n_out = 42;
    int32_t gen[8];
    FXT_STATUS(fx_model_generate(m, c, gen, &n_out, tok, 5, &g), FX_ERANGE, "5 tokens");
    FXT_EQ_INT(n_out, 42);
    fxt_guarded_free("row", row);
    fxt_guarded_free("logits", logits);
    fx_model_cache_free(c);
    fx_model_free(m);
}

/* The gradient buffer through the public API: forward + backward accumulate, zero_grad
   clears, and the tensor views point into it. */
static void test_api_train(void)
{
    fx_model *m = api_model(4);
    if (!m)
        return;
    int32_t tok[16], tgt[16];
    make_batch(1, 16, 257, 5, tok, tgt, false);
    float l1, l2;
    FXT_OK(fx_model_forward(m, &l1, NULL, tok, tgt, 1, 16, FX_MODEL_GRAD));
    FXT_OK(fx_model_backward(m));
    size_t P = fx_model_num_params(m);
    float *g1 = malloc(P * sizeof(float));
    memcpy(g1, m->grads, P * sizeof(float));
    FXT_OK(fx_model_forward(m, &l2, NULL, tok, tgt, 1, 16, FX_MODEL_GRAD));
    FXT_OK(fx_model_backward(m));
    FXT_CHECK(l1 == l2);
    /* Accumulated: twice the first (within rounding: a GEMM may add in blocks). */
    double *twice = fxt_alloc_f64(P);
    for (size_t i = 0; i < P; i++)
        twice[i] = 2.0 * g1[i];
    fxt_close_f32("two backward passes", m->grads, twice, P, 1e-7, 1e-5);
    free(twice);
    fx_model_tensor t;
    FXT_OK(fx_model_tensor_find(m, "layers.0.attn.bq", &t));
    FXT_CHECK(t.grad == m->grads + (t.data - m->params));
    double s = 0;
    for (size_t i = 0; i < t.numel; i++)
        s += fabs(t.grad[i]);
    FXT_CHECK(s > 0);
    fx_model_zero_grad(m);
    bool zero = true;
    for (size_t i = 0; i < P; i++)
        zero &= m->grads[i] == 0.0f;
    FXT_CHECK(zero);
    /* A forward without targets gives the logits the loss is made from. */
    float *lg = malloc(16 * 257 * sizeof(float)), *last = malloc(257 * sizeof(float));
    FXT_OK(fx_model_forward(m, NULL, lg, tok, NULL, 1, 16, 0));
    FXT_OK(fx_model_forward(m, NULL, last, tok, NULL, 1, 16, FX_MODEL_LOGITS_LAST));
    double *lref = fxt_alloc_f64(257);
    for (int v = 0; v < 257; v++)
        lref[v] = lg[15 * 257 + v];
    fxt_close_f32("last position's logits", last, lref, 257, 1e-6, 1e-5);
    free(lref);
    double loss = 0;
    int cnt = 0;
    for (int64_t i = 0; i < 16; i++) {
        if (tgt[i] < 0)
            continue;
        double mx = -1e300, z = 0;
        for (int64_t v = 0; v < 257; v++)
            mx = lg[i * 257 + v] > mx ? lg[i * 257 + v] : mx;
        for (int64_t v = 0; v < 257; v++)
            z += exp(lg[i * 257 + v] - mx);
        loss += mx + log(z) - lg[i * 257 + tgt[i]], cnt++;
    }
    FXT_NEAR(l1, loss / cnt, 1e-5, 1e-5);
    free(g1), free(lg), free(last);
    fx_model_free(m);
}

/* Save then load: the same tensors bit for bit (float32), or rounded to bfloat16. */
static void test_api_save_load(void)
{
    fx_model *m = api_model(6);
    if (!m)
        return;
    char path[300], dir[300];
    snprintf(path, sizeof path, "%s/llama.safetensors", tmpdir);
    FXT_STATUS(fx_model_save(m, NULL, false), FX_EINVAL, "path");
    FXT_OK(fx_model_save(m, path, false));
    for (int bf16 = 0; bf16 < 2; bf16++) {
        if (bf16) {
            snprintf(dir, sizeof dir, "%s/run", tmpdir);
            mkdir(dir, 0700);
            snprintf(path, sizeof path, "%s/run/model.safetensors", tmpdir);
            FXT_OK(fx_model_save(m, path, true));
        }
        fx_model *r = NULL;
        FXT_OK(fx_model_load(&r, bf16 ? dir : path)); /* a training directory, or a file */
        if (!r)
            continue;
        const fx_model_config *a = fx_model_get_config(m), *b = fx_model_get_config(r);
        FXT_EQ_STR(b->arch, "LlamaForCausalLM");
        FXT_CHECK(b->head_dim == 6 && b->qkv_bias && !b->tied_embeddings && b->sliding_window == 5);
        FXT_CHECK(b->rope_scaling.type == FX_ROPE_SCALING_LLAMA3 && b->rope_scaling.factor == 8.0f &&
                  b->rope_scaling.original_max_position_embeddings == 8);
        FXT_CHECK(b->n_eos == a->n_eos && b->eos[0] == a->eos[0]);
        FXT_EQ_INT(r->mask, FX__MODEL_MASK_SLIDING);
        FXT_EQ_INT(fx_model_num_params(r), fx_model_num_params(m));
        size_t P = fx_model_num_params(m);
        if (!bf16) {
            fxt_bitwise_f32("reloaded parameters", r->params, m->params, P);
        } else {
            float *want = malloc(P * sizeof(float));
            for (size_t i = 0; i < P; i++)
                want[i] = fx_bf16_to_f32(fx_f32_to_bf16(m->params[i]));
            fxt_bitwise_f32("reloaded bfloat16 parameters", r->params, want, P);
            free(want);
        }
        fx_model_free(r);
    }
    fx_model_free(m);
}

static int count_tokens(int32_t t, void *user)
{
    (void)t;
    return ++*(int *)user >= 1000;
}

/* Greedy generation is deterministic and is the argmax of the full forward pass at every
   step; it stops at an eos id (kept) and when the cache is full. */
static void test_api_generate(void)
{
    fx_model *m = api_model(7);
    if (!m)
        return;
    fx_model_cache *c = NULL;
    FXT_OK(fx_model_cache_create(&c, m, 16));
    if (!c)
        return;
    int32_t prompt[3] = {10, 20, 30}, out[2][12];
    int64_t n[2];
    fx_generate_opts g = fx_generate_defaults();
    g.max_tokens = 12, g.sample.temperature = 0, g.stop_at_eos = false;
    int calls = 0;
    g.on_token = count_tokens, g.user = &calls;
    for (int r = 0; r < 2; r++)
        FXT_OK(fx_model_generate(m, c, out[r], &n[r], prompt, 3, &g));
    FXT_EQ_INT(n[0], 12);
    FXT_EQ_INT(calls, 24);
    FXT_CHECK(!memcmp(out[0], out[1], sizeof out[0]));
    /* Against the forward pass over the whole sequence so far. */
    int32_t seq[16];
    memcpy(seq, prompt, sizeof prompt);
    float *last = malloc(257 * sizeof(float));
    for (int64_t t = 0; t < 12; t++) {
        FXT_OK(fx_model_forward(m, NULL, last, seq, NULL, 1, 3 + t, FX_MODEL_LOGITS_LAST));
        int32_t best = 0;
        for (int v = 1; v < 257; v++)
            best = last[v] > last[best] ? v : best;
        if (best != out[0][t]) {
            FXT_FAIL("greedy token %lld: %d, the forward pass's argmax is %d", (long long)t, out[0][t], best);
            break;
        }
        seq[3 + t] = best;
    }
    free(last);
    /* Sampling: the same seed, the same tokens; another seed, others. */
    g.sample = (fx_sample_opts){.temperature = 1.5f, .top_k = 0, .top_p = 0.95f};
    int32_t s1[12], s2[12], s3[12];
    int64_t n1, n2, n3;
    FXT_OK(fx_model_generate(m, c, s1, &n1, prompt, 3, &g));
    FXT_OK(fx_model_generate(m, c, s2, &n2, prompt, 3, &g));
    g.seed = 2;
    FXT_OK(fx_model_generate(m, c, s3, &n3, prompt, 3, &g));
    FXT_CHECK(n1 == 12 && n2 == 12 && !memcmp(s1, s2, sizeof s1));
    FXT_CHECK(memcmp(s1, s3, sizeof s1) != 0);
    /* EOS: a model whose eos is the greedy run's 5th token stops right after producing it
       (the same weights: the init does not depend on eos). */
    int64_t first = 0; /* where that token first appears */
    while (out[0][first] != out[0][4])
        first++;
    fx_model_config ce = llama_cfg();
    ce.eos[0] = out[0][4], ce.n_eos = 1;
    fx_model *e = NULL;
    FXT_OK(fx_model_create(&e, &ce, 7));
    if (e) {
        randomize_biases(e, 8);
        fx_model_cache *ec = NULL;
        FXT_OK(fx_model_cache_create(&ec, e, 16));
        g.sample.temperature = 0, g.stop_at_eos = true, g.seed = 1;
        int32_t eo[12];
        int64_t en = 0;
        FXT_OK(fx_model_generate(e, ec, eo, &en, prompt, 3, &g));
        FXT_EQ_INT(en, first + 1);
        FXT_EQ_INT(eo[en - 1], out[0][4]);
        fx_model_cache_free(ec);
        fx_model_free(e);
    }
    /* The cache: 16 positions hold the prompt and 13 generated tokens but the last, so a
       request for 20 stops after 14. */
    int32_t big[20];
    int64_t nb = 0;
    g.max_tokens = 20, g.stop_at_eos = false;
    FXT_OK(fx_model_generate(m, c, big, &nb, prompt, 3, &g));
    FXT_EQ_INT(nb, 14);
    FXT_EQ_INT(fx_model_cache_len(c), 16);
    FXT_CHECK(!memcmp(big, out[0], sizeof out[0]));
    /* The callback stops generation (not an error). */
    calls = 997;
    FXT_OK(fx_model_generate(m, c, big, &nb, prompt, 3, &g));
    FXT_EQ_INT(nb, 3);
    fx_model_cache_free(c);
    fx_model_free(m);
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/fx_test_model.%d", (int)getpid());
    if (mkdir(tmpdir, 0700) != 0) {
        fprintf(stderr, "cannot create %s\n", tmpdir);
        return 2;
    }
    FXT_RUN(test_rmsnorm);
    FXT_RUN(test_rmsnorm_twins);
    FXT_RUN(test_rope);
    FXT_RUN(test_qkv_heads);
    FXT_RUN(test_qkv_heads_halves);
    FXT_RUN(test_layer_weights_apart);
    FXT_RUN(test_swiglu);
    FXT_RUN(test_embedding);
    FXT_RUN(test_attn_ref_grad);
    FXT_RUN(test_loss_unfused);
    FXT_RUN(test_config_errors);
    FXT_RUN(test_config_format);
    FXT_RUN(test_arch_table);
    FXT_RUN(test_adamw);
    FXT_RUN(test_adamw_bf16);
    FXT_RUN(test_bf16_step);
    FXT_RUN(test_bf16_packed_head);
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
    FXT_RUN(test_rope_llama3);
    FXT_RUN(test_rope_lazy);
    FXT_RUN(test_sliding_window_convention);
    FXT_RUN(test_document_eos);
    FXT_RUN(test_hf_reference);
    FXT_RUN(test_large_vocab);
    FXT_RUN(test_features_threads_bitwise);
    FXT_RUN(test_old_model_file);
    FXT_RUN(test_ckpt_values_checked);
    FXT_RUN(test_api_config);
    FXT_RUN(test_api_errors);
    FXT_RUN(test_api_train);
    FXT_RUN(test_api_save_load);
    FXT_RUN(test_api_generate);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return fxt_finish();
}
