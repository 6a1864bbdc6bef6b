/* Fused linear + cross-entropy against a float64 reference: every option combination, chunk
   and tile shapes that do not divide the sizes, upstream gradients, ignored tokens, huge
   logits, accumulation into a tied weight, determinism across thread counts, guard zones,
   and the argument checks. */
#include "harness.h"

#include "core/core.h"
#include "lce/lce_internal.h"

/* ---- the float64 reference ------------------------------------------------------------------ */

typedef struct ref_out {
    double *loss_tok; /* [N]: 0 for ignored tokens */
    double *lse;      /* [N] */
    double *dh;       /* [N,D] */
    double *dw;       /* [V,D]: dw0 + gradient */
    double *dbias;    /* [V]: db0 + gradient */
    double loss;      /* reduced (MEAN, SUM; NONE: sum) */
    int64_t n_valid;
} ref_out;

static void ref_free(ref_out *r)
{
    free(r->loss_tok), free(r->lse), free(r->dh), free(r->dw), free(r->dbias);
}

/* The loss of token i and, if gz is not NULL, d(loss_i)/d(raw logits) times scale into gz [V]. */
static double ref_token(const fx_lce *p, const float *h, const float *w, const float *bias, int64_t i, int64_t y,
                        double scale, double *lse_out, double *gz, double *zbuf)
{
    const int64_t D = p->D, V = p->V;
    double m = -INFINITY;
    for (int64_t j = 0; j < V; j++) {
        double z = 0.0;
        for (int64_t k = 0; k < D; k++)
            z += (double)h[i * D + k] * (double)w[j * D + k];
        if (bias)
            z += bias[j];
        if (p->softcap > 0)
            z = p->softcap * tanh(z / p->softcap);
        zbuf[j] = z;
        m = z > m ? z : m;
    }
    double s = 0.0, sz = 0.0;
    for (int64_t j = 0; j < V; j++)
        s += exp(zbuf[j] - m), sz += zbuf[j];
    const double lse = m + log(s), eps = p->label_smoothing, zl = p->z_loss;
    *lse_out = lse;
    if (y == p->ignore_index)
        return 0.0;
    if (gz) {
        for (int64_t j = 0; j < V; j++) {
            double pj = exp(zbuf[j] - lse);
            double g = pj * (1.0 + 2.0 * zl * lse) - eps / (double)V - (j == y ? 1.0 - eps : 0.0);
            if (p->softcap > 0) {
                double t = zbuf[j] / p->softcap;
                g *= 1.0 - t * t;
            }
            gz[j] = scale * g;
        }
    }
    return lse - (1.0 - eps) * zbuf[y] - (eps > 0 ? eps * sz / (double)V : 0.0) + zl * lse * lse;
}

/* grad_loss: NULL for the forward call's gradients, else the backward's upstream gradient. */
static ref_out ref_lce(const fx_lce *p, const float *h, const float *w, const float *bias, const int64_t *t,
                       const float *grad_loss, const float *dw0, const float *db0)
{
    const int64_t N = p->N, D = p->D, V = p->V;
    ref_out r = {fxt_alloc_f64(N), fxt_alloc_f64(N), fxt_alloc_f64(N * D), fxt_alloc_f64(V * D), fxt_alloc_f64(V), 0, 0};
    for (int64_t i = 0; i < N; i++)
        r.n_valid += t[i] != p->ignore_index;
    for (int64_t j = 0; j < V * D; j++)
        r.dw[j] = dw0 ? dw0[j] : 0.0;
    for (int64_t j = 0; j < V; j++)
        r.dbias[j] = db0 ? db0[j] : 0.0;
    double *gz = fxt_alloc_f64(V), *zbuf = fxt_alloc_f64(V);
    for (int64_t i = 0; i < N; i++) {
        double scale = 1.0;
        if (grad_loss)
            scale = p->reduction == FX_REDUCTION_NONE ? grad_loss[i] : grad_loss[0];
        if (p->reduction == FX_REDUCTION_MEAN)
            scale = r.n_valid ? scale / (double)r.n_valid : 0.0;
        for (int64_t j = 0; j < V; j++)
            gz[j] = 0.0;
        r.loss_tok[i] = ref_token(p, h, w, bias, i, t[i], scale, &r.lse[i], gz, zbuf);
        r.loss += r.loss_tok[i];
        for (int64_t j = 0; j < V; j++) {
            if (gz[j] == 0.0)
                continue;
            for (int64_t k = 0; k < D; k++) {
                r.dh[i * D + k] += gz[j] * w[j * D + k];
                r.dw[j * D + k] += gz[j] * h[i * D + k];
            }
            r.dbias[j] += gz[j];
        }
    }
    if (p->reduction == FX_REDUCTION_MEAN)
        r.loss = r.n_valid ? r.loss / (double)r.n_valid : NAN;
    free(gz), free(zbuf);
    return r;
}

/* ---- helpers ---------------------------------------------------------------------------------- */

static double max_abs(const double *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/* Float32 rounding of the inputs and of GEMMs over K terms: errors relative to the largest value. */
static bool close_scaled(const char *what, const float *got, const double *ref, size_t n, double rel)
{
    return fxt_close_f32(what, got, ref, n, rel * (max_abs(ref, n) + 1e-2), rel);
}

static int64_t *make_targets(int64_t N, int64_t V, uint64_t seed, int64_t ignore_index, int every_ignored)
{
    int64_t *t = malloc((size_t)N * sizeof *t);
    float *u = fxt_random((size_t)N, 0.0f, 1.0f, seed);
    for (int64_t i = 0; i < N; i++) {
        t[i] = (int64_t)(u[i] * (float)V);
        t[i] = t[i] >= V ? V - 1 : t[i];
        if (every_ignored && i % every_ignored == every_ignored - 1)
            t[i] = ignore_index;
    }
    free(u);
    return t;
}

typedef struct problem {
    fx_lce p;
    float *h, *w, *bias;
    int64_t *t;
    float *dw0, *db0, *grad; /* starting dw and dbias, upstream gradient [N] */
} problem;

static problem problem_make(int64_t N, int64_t D, int64_t V, float scale, bool with_bias, int every_ignored, uint64_t seed)
{
    problem pr = {.p = fx_lce_defaults(N, D, V)};
    pr.h = fxt_random((size_t)(N * D), -scale, scale, seed);
    pr.w = fxt_random((size_t)(V * D), -scale, scale, seed + 1);
    pr.bias = with_bias ? fxt_random((size_t)V, -1.0f, 1.0f, seed + 2) : NULL;
    pr.t = make_targets(N, V, seed + 3, pr.p.ignore_index, every_ignored);
    pr.dw0 = fxt_random((size_t)(V * D), -0.5f, 0.5f, seed + 4);
    pr.db0 = fxt_random((size_t)V, -0.5f, 0.5f, seed + 5);
    pr.grad = fxt_random((size_t)N, -2.0f, 2.0f, seed + 6);
    return pr;
}

static void problem_free(problem *pr)
{
    free(pr->h), free(pr->w), free(pr->bias), free(pr->t), free(pr->dw0), free(pr->db0), free(pr->grad);
}

typedef struct outputs {
    float *loss, *lse, *dh, *dw, *dbias;
} outputs;

static outputs outputs_make(const problem *pr)
{
    const fx_lce *p = &pr->p;
    outputs o;
    o.loss = fxt_guarded(p->reduction == FX_REDUCTION_NONE ? (size_t)p->N : 1);
    o.lse = fxt_guarded((size_t)p->N);
    o.dh = fxt_guarded((size_t)(p->N * p->D)); /* garbage: must be overwritten */
    o.dw = fxt_guarded_copy(pr->dw0, (size_t)(p->V * p->D));
    o.dbias = fxt_guarded_copy(pr->db0, (size_t)p->V);
    return o;
}

static void outputs_free(outputs *o)
{
    fxt_guarded_free("loss", o->loss), fxt_guarded_free("lse", o->lse), fxt_guarded_free("dh", o->dh);
    fxt_guarded_free("dw", o->dw), fxt_guarded_free("dbias", o->dbias);
}

static const double TOL = 2e-5;

/* The forward call with every output, and the backward call with pr->grad, against the reference. */
static bool check_problem(const problem *pr, const char *label)
{
    const fx_lce *p = &pr->p;
    const size_t N = (size_t)p->N, D = (size_t)p->D, V = (size_t)p->V;
    const int fails = fxt_failed_checks;
    outputs o = outputs_make(pr);
    FXT_OK(fx_linear_cross_entropy(p, pr->h, pr->w, pr->bias, pr->t, o.loss, o.lse, o.dh, o.dw,
                                   pr->bias ? o.dbias : NULL));
    ref_out r = ref_lce(p, pr->h, pr->w, pr->bias, pr->t, NULL, pr->dw0, pr->db0);
    if (p->reduction == FX_REDUCTION_NONE)
        close_scaled("loss[]", o.loss, r.loss_tok, N, TOL);
    else
        close_scaled("loss", o.loss, &r.loss, 1, TOL);
    close_scaled("lse", o.lse, r.lse, N, TOL);
    close_scaled("dh", o.dh, r.dh, N * D, TOL);
    close_scaled("dw", o.dw, r.dw, V * D, TOL);
    if (pr->bias)
        close_scaled("dbias", o.dbias, r.dbias, V, TOL);
    ref_free(&r);

    /* Backward from the saved lse with a general upstream gradient. */
    outputs b = outputs_make(pr);
    FXT_OK(fx_linear_cross_entropy_backward(p, pr->h, pr->w, pr->bias, pr->t, o.lse, pr->grad, b.dh, b.dw,
                                            pr->bias ? b.dbias : NULL));
    r = ref_lce(p, pr->h, pr->w, pr->bias, pr->t, pr->grad, pr->dw0, pr->db0);
    close_scaled("backward dh", b.dh, r.dh, N * D, TOL);
    close_scaled("backward dw", b.dw, r.dw, V * D, TOL);
    if (pr->bias)
        close_scaled("backward dbias", b.dbias, r.dbias, V, TOL);
    ref_free(&r);
    outputs_free(&b);
    outputs_free(&o);
    if (fxt_failed_checks != fails) {
        fprintf(stderr, "  in case: %s\n", label);
        return false;
    }
    return true;
}

/* ---- tests ------------------------------------------------------------------------------------ */

/* Reductions x smoothing x z-loss x cap x bias x ignored tokens x chunk plans x CPU paths. */
static void test_all_options(void)
{
    const fx_reduction reds[] = {FX_REDUCTION_MEAN, FX_REDUCTION_SUM, FX_REDUCTION_NONE};
    const float epss[] = {0.0f, 0.1f}, zls[] = {0.0f, 1e-3f}, caps[] = {0.0f, 2.5f};
    const int64_t chunks[][2] = {{0, 0}, {4, 0}, {5, 7}, {13, 37}};
    const fx_isa best = fx_get_isa();
    int cases = 0;
    for (int isa = 0; isa <= (int)best; isa++) {
        fx_set_isa((fx_isa)isa);
        for (int bias = 0; bias < 2; bias++) {
            for (int ign = 0; ign < 2; ign++) {
                problem pr = problem_make(13, 17, 37, 1.0f, bias, ign ? 3 : 0, 100 + (uint64_t)(bias * 2 + ign));
                for (size_t ri = 0; ri < 3; ri++)
                    for (size_t ei = 0; ei < 2; ei++)
                        for (size_t zi = 0; zi < 2; zi++)
                            for (size_t ci = 0; ci < 2; ci++)
                                for (size_t ki = 0; ki < 4; ki++) {
                                    pr.p.reduction = reds[ri];
                                    pr.p.label_smoothing = epss[ei];
                                    pr.p.z_loss = zls[zi];
                                    pr.p.softcap = caps[ci];
                                    pr.p.chunk = chunks[ki][0];
                                    pr.p.vocab_chunk = chunks[ki][1];
                                    char label[160];
                                    snprintf(label, sizeof label,
                                             "isa %s bias %d ignored %d reduction %d eps %g z %g cap %g chunk %lld x %lld",
                                             fx_isa_name(fx_get_isa()), bias, ign, (int)reds[ri], (double)epss[ei],
                                             (double)zls[zi], (double)caps[ci], (long long)chunks[ki][0],
                                             (long long)chunks[ki][1]);
                                    check_problem(&pr, label);
                                    cases++;
                                }
                problem_free(&pr);
            }
        }
    }
    fx_set_isa(best);
    FXT_EQ_INT(cases, ((int)best + 1) * 2 * 2 * 3 * 2 * 2 * 2 * 4);
}

/* V not a multiple of the tile, N below the chunk, a single class, D = 1, ignore_index a class. */
static void test_odd_sizes(void)
{
    const int64_t shapes[][5] = {
        /* N, D, V, chunk, vocab_chunk */
        {5, 9, 1000, 16, 300}, {3, 31, 257, 0, 0}, {1, 1, 1, 0, 0}, {7, 1, 5, 3, 2}, {40, 8, 67, 9, 16},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        problem pr = problem_make(shapes[s][0], shapes[s][1], shapes[s][2], 1.0f, true, 4, 200 + s);
        pr.p.chunk = shapes[s][3];
        pr.p.vocab_chunk = shapes[s][4];
        pr.p.label_smoothing = 0.05f;
        pr.p.softcap = 3.0f;
        char label[64];
        snprintf(label, sizeof label, "shape %zu", s);
        check_problem(&pr, label);
        pr.p.reduction = FX_REDUCTION_NONE;
        check_problem(&pr, label);
        problem_free(&pr);
    }
    /* Vocabulary entries masked with a -inf bias (a padded vocabulary), a whole block of them
       included: they take no probability and the loss stays finite. */
    const fx_isa best = fx_get_isa();
    for (int isa = 0; isa <= (int)best; isa++) {
        fx_set_isa((fx_isa)isa);
        problem pm = problem_make(6, 4, 2100, 1.0f, true, 0, 260);
        for (int64_t j = 0; j < 1100; j++)
            pm.bias[j] = -INFINITY;
        for (int64_t i = 0; i < pm.p.N; i++)
            pm.t[i] = 1100 + i * 37;
        pm.p.reduction = FX_REDUCTION_SUM;
        outputs o = outputs_make(&pm);
        FXT_OK(fx_linear_cross_entropy(&pm.p, pm.h, pm.w, pm.bias, pm.t, o.loss, o.lse, o.dh, o.dw, o.dbias));
        ref_out r = ref_lce(&pm.p, pm.h, pm.w, pm.bias, pm.t, NULL, pm.dw0, pm.db0);
        FXT_CHECK(isfinite(o.loss[0]));
        close_scaled("masked loss", o.loss, &r.loss, 1, TOL);
        close_scaled("masked lse", o.lse, r.lse, (size_t)pm.p.N, TOL);
        close_scaled("masked dh", o.dh, r.dh, (size_t)(pm.p.N * pm.p.D), TOL);
        close_scaled("masked dw", o.dw, r.dw, (size_t)(pm.p.V * pm.p.D), TOL);
        close_scaled("masked dbias", o.dbias, r.dbias, (size_t)pm.p.V, TOL);
        ref_free(&r);
        outputs_free(&o);
        problem_free(&pm);
    }
    fx_set_isa(best);
    /* ignore_index may name a class: that class's tokens are skipped. */
    problem pr = problem_make(20, 6, 11, 1.0f, false, 0, 250);
    pr.p.ignore_index = pr.t[0];
    check_problem(&pr, "ignore_index = a class");
    problem_free(&pr);
}

/* reduction = NONE with per-token upstream gradients (zeros and negatives included), over
   several chunks: the gradient of each token must carry its own weight. */
static void test_per_token_grad(void)
{
    problem pr = problem_make(29, 12, 50, 1.0f, true, 5, 300);
    pr.p.reduction = FX_REDUCTION_NONE;
    pr.p.chunk = 4;
    for (int64_t i = 0; i < pr.p.N; i += 3)
        pr.grad[i] = 0.0f;
    check_problem(&pr, "per-token");
    pr.p.vocab_chunk = 9;
    pr.p.z_loss = 1e-2f;
    check_problem(&pr, "per-token, tiled");
    /* A single token's weight moves only its own dh row. */
    outputs o = outputs_make(&pr);
    FXT_OK(fx_linear_cross_entropy(&pr.p, pr.h, pr.w, pr.bias, pr.t, o.loss, o.lse, NULL, NULL, NULL));
    float *g = calloc((size_t)pr.p.N, sizeof *g);
    g[1] = 1.0f;
    FXT_OK(fx_linear_cross_entropy_backward(&pr.p, pr.h, pr.w, pr.bias, pr.t, o.lse, g, o.dh, NULL, NULL));
    int nonzero_rows = 0;
    for (int64_t i = 0; i < pr.p.N; i++) {
        bool nz = false;
        for (int64_t k = 0; k < pr.p.D; k++)
            nz |= o.dh[i * pr.p.D + k] != 0.0f;
        nonzero_rows += nz;
    }
    FXT_EQ_INT(nonzero_rows, 1);
    free(g);
    outputs_free(&o);
    problem_free(&pr);
}

/* Every target ignored: MEAN gives NaN and zero gradients, SUM 0, NONE zeros; lse is still there. */
static void test_all_ignored(void)
{
    problem pr = problem_make(10, 8, 21, 1.0f, true, 1, 400);
    for (int red = 0; red < 3; red++) {
        pr.p.reduction = (fx_reduction)red;
        pr.p.label_smoothing = 0.1f;
        pr.p.chunk = 3;
        outputs o = outputs_make(&pr);
        FXT_OK(fx_linear_cross_entropy(&pr.p, pr.h, pr.w, pr.bias, pr.t, o.loss, o.lse, o.dh, o.dw, o.dbias));
        if (red == FX_REDUCTION_MEAN)
            FXT_CHECK(isnan(o.loss[0]));
        else if (red == FX_REDUCTION_SUM)
            FXT_EQ_INT(o.loss[0] == 0.0f, 1);
        else
            for (int64_t i = 0; i < pr.p.N; i++)
                FXT_EQ_INT(o.loss[i] == 0.0f, 1);
        for (int64_t i = 0; i < pr.p.N * pr.p.D; i++)
            if (o.dh[i] != 0.0f) {
                FXT_FAIL("dh[%lld] = %g, expected 0", (long long)i, (double)o.dh[i]);
                break;
            }
        fxt_bitwise_f32("dw unchanged", o.dw, pr.dw0, (size_t)(pr.p.V * pr.p.D));
        fxt_bitwise_f32("dbias unchanged", o.dbias, pr.db0, (size_t)pr.p.V);
        ref_out r = ref_lce(&pr.p, pr.h, pr.w, pr.bias, pr.t, NULL, NULL, NULL);
        close_scaled("lse", o.lse, r.lse, (size_t)pr.p.N, TOL);
        ref_free(&r);
        outputs_free(&o);
    }
    problem_free(&pr);
}

/* Logits around +-1e4: no overflow, no NaN; errors relative to the logits' size. */
static void test_large_logits(void)
{
    const fx_isa best = fx_get_isa();
    for (int isa = 0; isa <= (int)best; isa++) {
        fx_set_isa((fx_isa)isa);
        problem pr = problem_make(9, 4, 33, 70.0f, false, 0, 500); /* |z| up to 4 * 70^2 ~ 2e4 */
        for (int64_t i = 0; i < pr.p.N; i++)
            pr.t[i] = (i * 7) % pr.p.V;
        pr.p.reduction = FX_REDUCTION_SUM;
        pr.p.label_smoothing = 0.1f;
        pr.p.z_loss = 1e-6f;
        pr.p.chunk = 4;
        outputs o = outputs_make(&pr);
        FXT_OK(fx_linear_cross_entropy(&pr.p, pr.h, pr.w, NULL, pr.t, o.loss, o.lse, o.dh, o.dw, NULL));
        ref_out r = ref_lce(&pr.p, pr.h, pr.w, NULL, pr.t, NULL, pr.dw0, NULL);
        FXT_CHECK(max_abs(r.lse, (size_t)pr.p.N) > 5e3);
        FXT_CHECK(isfinite(o.loss[0]));
        /* A float32 logit of 1e4 carries an error of ~1e-3: compare at that scale. */
        fxt_close_f32("loss", o.loss, &r.loss, 1, 1e-6 * 2e4 * (double)pr.p.N, 1e-5);
        fxt_close_f32("lse", o.lse, r.lse, (size_t)pr.p.N, 1e-6 * 2e4, 1e-6);
        close_scaled("dh", o.dh, r.dh, (size_t)(pr.p.N * pr.p.D), 1e-4);
        close_scaled("dw", o.dw, r.dw, (size_t)(pr.p.V * pr.p.D), 1e-4);
        ref_free(&r);
        outputs_free(&o);
        problem_free(&pr);
    }
    fx_set_isa(best);
}

/* The trainer's use: w is the token embedding, and dw is the embedding's gradient that the
   lookup has already written into; the loss adds its share. */
static void test_tied_weight(void)
{
    problem pr = problem_make(24, 10, 40, 1.0f, false, 0, 600);
    const int64_t N = pr.p.N, D = pr.p.D, V = pr.p.V;
    float *demb = fxt_guarded((size_t)(V * D));
    memset(demb, 0, (size_t)(V * D) * sizeof(float));
    float *dx = fxt_random((size_t)(N * D), -1.0f, 1.0f, 601);
    int64_t *tokens = make_targets(N, V, 602, -100, 0);
    for (int64_t i = 0; i < N; i++) /* the embedding lookup's backward */
        for (int64_t k = 0; k < D; k++)
            demb[tokens[i] * D + k] += dx[i * D + k];
    float *before = malloc((size_t)(V * D) * sizeof(float));
    memcpy(before, demb, (size_t)(V * D) * sizeof(float));
    float loss;
    FXT_OK(fx_linear_cross_entropy(&pr.p, pr.h, pr.w, NULL, pr.t, &loss, NULL, NULL, demb, NULL));
    ref_out r = ref_lce(&pr.p, pr.h, pr.w, NULL, pr.t, NULL, before, NULL);
    close_scaled("tied dw", demb, r.dw, (size_t)(V * D), TOL);
    /* A second call adds the same gradient again. */
    FXT_OK(fx_linear_cross_entropy(&pr.p, pr.h, pr.w, NULL, pr.t, &loss, NULL, NULL, demb, NULL));
    for (int64_t j = 0; j < V * D; j++)
        r.dw[j] = 2.0 * r.dw[j] - before[j];
    close_scaled("tied dw, twice", demb, r.dw, (size_t)(V * D), TOL);
    ref_free(&r);
    fxt_guarded_free("demb", demb);
    free(dx), free(tokens), free(before);
    problem_free(&pr);
}

/* The bf16 training call (fx__linear_cross_entropy_bf16) with bfloat16 inputs, on each route
   of its products: float32 products of the bfloat16 values (the float32 call's kernels: the
   loss and lse bitwise the float32 call's), and the tile kernel of a path that packs pairs
   (vdpbf16ps: SIMDe's portable build of the kernel on any CPU, the library's own where the CPU
   has the instruction; its sums are in another order, so the loss is the float32 call's
   within rounding). On both, the gradients are those of the logits' gradient rounded to
   bfloat16: against a float64 reference that rounds its own gradient the same way, within
   TOL of the largest value, plus, for a term whose gradient lies within 1e-5 of a rounding
   midpoint (float32 and float64 may round it apart), one bfloat16 step of it. The float32
   call's gradients must miss that reference, so the check can fail. Each route bitwise the
   same at 1, 2 and 3 threads in whole-row, chunked and tiled (slabbed) plans, odd sizes, and
   without gradients; the pair route the same from h and w stored in bfloat16. */
static bool bf16_close(const char *what, const float *got, const double *ref, const double *amb, int64_t rows,
                       int64_t cols)
{
    const double tol = TOL * max_abs(ref, (size_t)(rows * cols));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            double err = fabs((double)got[r * cols + c] - ref[r * cols + c]);
            if (!(err <= tol + amb[r])) {
                FXT_FAIL("%s [%lld, %lld]: %.9g vs ref %.9g (error %.3g > %.3g)", what, (long long)r, (long long)c,
                         (double)got[r * cols + c], ref[r * cols + c], err, tol + amb[r]);
                return false;
            }
        }
    return true;
}

#ifdef FXT_HAVE_SIMDE
void fxt_bf16_dp_kernel_simde(int64_t pairs, const uint32_t *a, const uint32_t *b, float beta, float *C, int64_t ldc,
                              int64_t mr, int64_t nr);
#endif
static _Atomic long dp_calls; /* calls of the counting kernel: the route was taken */

static void counting_dp_kernel(int64_t pairs, const uint32_t *a, const uint32_t *b, float beta, float *C,
                               int64_t ldc, int64_t mr, int64_t nr)
{
    dp_calls++;
#ifdef FXT_HAVE_SIMDE
    fxt_bf16_dp_kernel_simde(pairs, a, b, beta, C, ldc, mr, nr);
#else
    fx__bf16_dp_kernel_avx512bf16(pairs, a, b, beta, C, ldc, mr, nr);
#endif
}

/* The bfloat16-rounded reference's dh and dw, and the rounding-midpoint allowances. */
static void bf16_reference(const problem *pr, double *dh, double *dw, double *amb_h, double *amb_w)
{
    const int64_t N = pr->p.N, D = pr->p.D, V = pr->p.V;
    double *gz = fxt_alloc_f64(V), *zb = fxt_alloc_f64(V), lse;
    int64_t nv = 0;
    for (int64_t i = 0; i < N; i++)
        nv += pr->t[i] != pr->p.ignore_index;
    for (int64_t i = 0; i < N; i++) {
        for (int64_t j = 0; j < V; j++)
            gz[j] = 0.0;
        ref_token(&pr->p, pr->h, pr->w, NULL, i, pr->t[i], 1.0 / (double)nv, &lse, gz, zb);
        for (int64_t j = 0; j < V; j++) {
            double g = fx__bf16_round((float)gz[j]);
            if (fx__bf16_round((float)(gz[j] * (1 + 1e-5))) != fx__bf16_round((float)(gz[j] * (1 - 1e-5)))) {
                amb_h[i] += fabs(g) / 128.0;
                amb_w[j] += fabs(g) / 128.0;
            }
            for (int64_t k = 0; k < D; k++) {
                dh[i * D + k] += g * pr->w[j * D + k];
                dw[j * D + k] += g * pr->h[i * D + k];
            }
        }
    }
    free(gz), free(zb);
}

/* The bf16 call's problem: h and w rounded to bfloat16 (and stored so), the rounded
   reference's dh and dw, and their rounding-midpoint allowances. */
typedef struct bf16_fixture {
    problem pr;
    uint16_t *h16, *w16;
    double *dh, *dw, *amb_h, *amb_w;
} bf16_fixture;

static bf16_fixture bf16_fixture_make(void)
{
    bf16_fixture fx = {.pr = problem_make(29, 37, 1500, 1.0f, false, 0, 800)};
    const int64_t N = fx.pr.p.N, D = fx.pr.p.D, V = fx.pr.p.V;
    for (int64_t i = 0; i < N * D; i++)
        fx.pr.h[i] = fx__bf16_round(fx.pr.h[i]);
    for (int64_t i = 0; i < V * D; i++)
        fx.pr.w[i] = fx__bf16_round(fx.pr.w[i]);
    fx.dh = fxt_alloc_f64(N * D), fx.dw = fxt_alloc_f64(V * D);
    fx.amb_h = fxt_alloc_f64(N), fx.amb_w = fxt_alloc_f64(V);
    bf16_reference(&fx.pr, fx.dh, fx.dw, fx.amb_h, fx.amb_w);
    fx.h16 = malloc((size_t)(N * D) * sizeof(uint16_t)), fx.w16 = malloc((size_t)(V * D) * sizeof(uint16_t));
    fx__f32_to_bf16_n_scalar(fx.h16, fx.pr.h, N * D);
    fx__f32_to_bf16_n_scalar(fx.w16, fx.pr.w, V * D);
    return fx;
}

static void bf16_fixture_free(bf16_fixture *fx)
{
    free(fx->dh), free(fx->dw), free(fx->amb_h), free(fx->amb_w), free(fx->h16), free(fx->w16);
    problem_free(&fx->pr);
}

/* A route of the bf16 call's products. */
typedef struct bf16_route {
    fx__bf16_tiled tiled;
    const char *name;
    bool f32; /* the float32 route: bitwise the float32 call, refuses bfloat16 storage */
} bf16_route;

/* Without gradients (an evaluation): the same loss and lse. */
static void bf16_check_eval(const bf16_fixture *fx, const outputs *o0)
{
    const problem *pr = &fx->pr;
    const int64_t N = pr->p.N;
    float loss_eval, *lse_eval = fxt_guarded((size_t)N);
    FXT_OK(fx__linear_cross_entropy_bf16(&pr->p, fx__bf16_of_f32(pr->h), fx__bf16_of_f32(pr->w), NULL, pr->t,
                                         &loss_eval, lse_eval, NULL, NULL, NULL));
    fxt_bitwise_f32("bf16 loss without gradients", o0->loss, &loss_eval, 1);
    fxt_bitwise_f32("bf16 lse without gradients", o0->lse, lse_eval, (size_t)N);
    fxt_guarded_free("lse_eval", lse_eval);
}

/* h and w in bfloat16 storage: the same results on the pair route, refused on the float32
   one (its kernels read float32). */
static void bf16_check_storage(const bf16_fixture *fx, const outputs *o0, const bf16_route *route)
{
    const problem *pr = &fx->pr;
    const int64_t N = pr->p.N, D = pr->p.D, V = pr->p.V;
    outputs s16 = outputs_make(pr);
    memset(s16.dw, 0, (size_t)(V * D) * sizeof(float));
#define BF16_STORED fx__linear_cross_entropy_bf16(&pr->p, fx__bf16_of(fx->h16), fx__bf16_of(fx->w16), NULL, pr->t, \
                                                  s16.loss, s16.lse, s16.dh, s16.dw, NULL)
    if (route->f32) {
        FXT_STATUS(BF16_STORED, FX_EINVAL, "bfloat16 storage");
    } else {
        FXT_OK(BF16_STORED);
        fxt_bitwise_f32("bf16 loss, bfloat16 storage", o0->loss, s16.loss, 1);
        fxt_bitwise_f32("bf16 dh, bfloat16 storage", o0->dh, s16.dh, (size_t)(N * D));
        fxt_bitwise_f32("bf16 dw, bfloat16 storage", o0->dw, s16.dw, (size_t)(V * D));
    }
#undef BF16_STORED
    outputs_free(&s16);
}

/* The route's outputs at 1, 2 and 3 threads (left at 3), with the evaluation and storage
   checks made on the route; then every output bitwise the same across thread counts. */
static void bf16_run_route(const bf16_fixture *fx, const bf16_route *route, outputs o[3])
{
    const problem *pr = &fx->pr;
    const int64_t N = pr->p.N, D = pr->p.D, V = pr->p.V;
    const int threads0 = fx_get_num_threads();
    fx__gemm_bf16_force_tiled(&route->tiled);
    dp_calls = 0;
    for (int th = 0; th < 3; th++) {
        fx_set_num_threads(th + 1);
        o[th] = outputs_make(pr);
        memset(o[th].dw, 0, (size_t)(V * D) * sizeof(float));
        FXT_OK(fx__linear_cross_entropy_bf16(&pr->p, fx__bf16_of_f32(pr->h), fx__bf16_of_f32(pr->w), NULL, pr->t,
                                             o[th].loss, o[th].lse, o[th].dh, o[th].dw, NULL));
    }
    bf16_check_eval(fx, &o[0]);
    bf16_check_storage(fx, &o[0], route);
    fx__gemm_bf16_force_tiled(NULL);
    fx_set_num_threads(threads0);
    if (route->tiled.kernel == counting_dp_kernel && dp_calls == 0)
        FXT_FAIL("%s: the tile kernel was never called", route->name);
    for (int th = 1; th < 3; th++) {
        fxt_bitwise_f32("bf16 loss, 1 vs 2, 3 threads", o[0].loss, o[th].loss, 1);
        fxt_bitwise_f32("bf16 lse, 1 vs 2, 3 threads", o[0].lse, o[th].lse, (size_t)N);
        fxt_bitwise_f32("bf16 dh, 1 vs 2, 3 threads", o[0].dh, o[th].dh, (size_t)(N * D));
        fxt_bitwise_f32("bf16 dw, 1 vs 2, 3 threads", o[0].dw, o[th].dw, (size_t)(V * D));
    }
}

/* The float32 call's dh must fail the reference check (without the midpoint allowance). */
static void bf16_check_reference_bites(const bf16_fixture *fx, const outputs *b)
{
    const int64_t N = fx->pr.p.N, D = fx->pr.p.D;
    double miss = 0.0;
    for (int64_t i = 0; i < N * D; i++)
        miss = fabs(b->dh[i] - fx->dh[i]) > miss ? fabs(b->dh[i] - fx->dh[i]) : miss;
    if (!(miss > 10 * TOL * max_abs(fx->dh, (size_t)(N * D))))
        FXT_FAIL("the float32 call's dh is within 10x the tolerance of the bf16 reference (largest "
                 "error %.3g): the check cannot tell them apart", miss);
}

/* The route's loss and lse against the float32 call's, its gradients against the rounded
   reference. */
static void bf16_check_results(const bf16_fixture *fx, const outputs *o0, const bf16_route *route, size_t pl)
{
    const problem *pr = &fx->pr;
    const int64_t N = pr->p.N, D = pr->p.D, V = pr->p.V;
    outputs b = outputs_make(pr);
    FXT_OK(fx_linear_cross_entropy(&pr->p, pr->h, pr->w, NULL, pr->t, b.loss, b.lse, b.dh, b.dw, NULL));
    if (route->f32) {
        fxt_bitwise_f32("bf16 loss (float32 route)", o0->loss, b.loss, 1);
        fxt_bitwise_f32("bf16 lse (float32 route)", o0->lse, b.lse, (size_t)N);
    } else {
        FXT_NEAR(o0->loss[0], b.loss[0], 0, 1e-6);
        for (int64_t i = 0; i < N; i++)
            FXT_NEAR(o0->lse[i], b.lse[i], 0, 1e-6);
    }
    if (!bf16_close(route->name, o0->dh, fx->dh, fx->amb_h, N, D) ||
        !bf16_close(route->name, o0->dw, fx->dw, fx->amb_w, V, D))
        fprintf(stderr, "  (%s, plan %zu)\n", route->name, pl);
    if (route->f32 && pl == 0)
        bf16_check_reference_bites(fx, &b);
    outputs_free(&b);
}

static void test_bf16_call(void)
{
    bf16_fixture fx = bf16_fixture_make();
    bf16_route routes[3] = {{fx__bf16_tiled_f32, "float32 route", true},
                            {fx__bf16_tiled_dp, "vdpbf16ps (counted)", false},
                            {fx__bf16_tiled_dp, "vdpbf16ps (AVX512-BF16)", false}};
    routes[1].tiled.kernel = counting_dp_kernel;
    int nroutes = fx__cpu_avx512bf16() ? 3 : 2;
#ifndef FXT_HAVE_SIMDE
    if (nroutes == 2) {
        fprintf(stderr, "  (no SIMDe and no AVX512-BF16: the bf16 call's pair route is not tested)\n");
        nroutes = 1;
    }
#endif
    const int64_t plans[][2] = {{0, 0}, {13, 0}, {13, 1100}}; /* whole rows; chunks; tiles in slabs */
    for (int r = 0; r < nroutes; r++)
        for (size_t pl = 0; pl < 3; pl++) {
            fx.pr.p.chunk = plans[pl][0], fx.pr.p.vocab_chunk = plans[pl][1];
            outputs o[3];
            bf16_run_route(&fx, &routes[r], o);
            bf16_check_results(&fx, &o[0], &routes[r], pl);
            for (int th = 0; th < 3; th++)
                outputs_free(&o[th]);
        }
    bf16_fixture_free(&fx);
}

/* Every output bitwise equal at 1 and 2 threads, in whole-row and tiled plans, forward and
   backward; and the forward's gradients bitwise equal to a backward with grad_loss = 1. */
static void test_threads_bitwise(void)
{
    /* D, V and one chunk above 384, a common BLAS K block: the sizes where a BLAS's 1-thread
       and multi-thread paths may sum differently. */
    problem pr = problem_make(400, 400, 500, 0.2f, true, 7, 700);
    pr.p.label_smoothing = 0.1f;
    pr.p.z_loss = 1e-4f;
    pr.p.softcap = 15.0f;
    const size_t N = (size_t)pr.p.N, D = (size_t)pr.p.D, V = (size_t)pr.p.V;
    const int64_t plans[][2] = {{0, 0}, {390, 0}, {100, 390}};
    const int threads0 = fx_get_num_threads();
    for (size_t pl = 0; pl < 3; pl++) {
        for (int red = 0; red < 3; red += 2) { /* MEAN and NONE */
            pr.p.chunk = plans[pl][0];
            pr.p.vocab_chunk = plans[pl][1];
            pr.p.reduction = (fx_reduction)red;
            outputs o[2], b[2];
            for (int run = 0; run < 2; run++) {
                fx_set_num_threads(run + 1);
                o[run] = outputs_make(&pr);
                b[run] = outputs_make(&pr);
                FXT_OK(fx_linear_cross_entropy(&pr.p, pr.h, pr.w, pr.bias, pr.t, o[run].loss, o[run].lse, o[run].dh,
                                               o[run].dw, o[run].dbias));
                FXT_OK(fx_linear_cross_entropy_backward(&pr.p, pr.h, pr.w, pr.bias, pr.t, o[run].lse, pr.grad,
                                                        b[run].dh, b[run].dw, b[run].dbias));
            }
            const size_t nl = red == FX_REDUCTION_NONE ? N : 1;
            fxt_bitwise_f32("loss", o[0].loss, o[1].loss, nl);
            fxt_bitwise_f32("lse", o[0].lse, o[1].lse, N);
            fxt_bitwise_f32("dh", o[0].dh, o[1].dh, N * D);
            fxt_bitwise_f32("dw", o[0].dw, o[1].dw, V * D);
            fxt_bitwise_f32("dbias", o[0].dbias, o[1].dbias, V);
            fxt_bitwise_f32("backward dh", b[0].dh, b[1].dh, N * D);
            fxt_bitwise_f32("backward dw", b[0].dw, b[1].dw, V * D);
            fxt_bitwise_f32("backward dbias", b[0].dbias, b[1].dbias, V);

            /* grad_loss = 1: the backward reproduces the forward's gradients exactly. */
            float *ones = malloc(N * sizeof *ones);
            for (size_t i = 0; i < N; i++)
                ones[i] = 1.0f;
            outputs c = outputs_make(&pr);
            FXT_OK(fx_linear_cross_entropy_backward(&pr.p, pr.h, pr.w, pr.bias, pr.t, o[1].lse, ones, c.dh, c.dw,
                                                    c.dbias));
            fxt_bitwise_f32("forward vs backward dh", o[1].dh, c.dh, N * D);
            fxt_bitwise_f32("forward vs backward dw", o[1].dw, c.dw, V * D);
            fxt_bitwise_f32("forward vs backward dbias", o[1].dbias, c.dbias, V);
            outputs_free(&c);
            free(ones);
            for (int run = 0; run < 2; run++)
                outputs_free(&o[run]), outputs_free(&b[run]);
        }
    }
    fx_set_num_threads(threads0);
    problem_free(&pr);
}

/* The automatic plan where it tiles the vocabulary (as it does at the benchmark shapes), or
   a given tile of five blocks (vocab_chunk, the backward's two slabs of unequal size),
   with every option and a short last tile: the float64 reference, the whole-row plan it
   replaced (within float32 rounding), bitwise equal results at 1, 2 and 3 threads and from
   run to run, forward and backward; and a call allocates the plan's bytes, then frees them.
   On every CPU path this machine has. */
static void auto_tiled_case(int64_t vocab_chunk)
{
    problem pr = problem_make(500, 16, 9000, 0.2f, true, 7, 1300);
    pr.p.vocab_chunk = vocab_chunk;
    pr.p.label_smoothing = 0.1f;
    pr.p.z_loss = 1e-4f;
    pr.p.softcap = 15.0f;
    const size_t N = (size_t)pr.p.N, D = (size_t)pr.p.D, V = (size_t)pr.p.V;
    int64_t c, vb;
    size_t bytes;
    FXT_OK(fx_linear_cross_entropy_plan(&pr.p, &c, &vb, &bytes));
    if (!(vb < pr.p.V && pr.p.V % vb != 0 && c < pr.p.N))
        FXT_FAIL("plan %lld x %lld: want several chunks and tiles, the last one short", (long long)c,
                 (long long)vb);
    check_problem(&pr, fx_isa_name(fx_get_isa()));

    const int threads0 = fx_get_num_threads();
    for (int red = 0; red < 3; red += 2) { /* MEAN and NONE */
        pr.p.reduction = (fx_reduction)red;
        pr.p.chunk = 0;
        pr.p.vocab_chunk = vocab_chunk;
        outputs o[4], b[4];
        for (int run = 0; run < 4; run++) {
            fx_set_num_threads(run < 3 ? run + 1 : 2);
            o[run] = outputs_make(&pr);
            b[run] = outputs_make(&pr);
            FXT_OK(fx_linear_cross_entropy(&pr.p, pr.h, pr.w, pr.bias, pr.t, o[run].loss, o[run].lse, o[run].dh,
                                           o[run].dw, o[run].dbias));
            FXT_OK(fx_linear_cross_entropy_backward(&pr.p, pr.h, pr.w, pr.bias, pr.t, o[run].lse, pr.grad,
                                                    b[run].dh, b[run].dw, b[run].dbias));
        }
        fx_set_num_threads(threads0);
        const size_t nl = red == FX_REDUCTION_NONE ? N : 1;
        for (int run = 1; run < 4; run++) {
            fxt_bitwise_f32("loss", o[0].loss, o[run].loss, nl);
            fxt_bitwise_f32("lse", o[0].lse, o[run].lse, N);
            fxt_bitwise_f32("dh", o[0].dh, o[run].dh, N * D);
            fxt_bitwise_f32("dw", o[0].dw, o[run].dw, V * D);
            fxt_bitwise_f32("dbias", o[0].dbias, o[run].dbias, V);
            fxt_bitwise_f32("backward dh", b[0].dh, b[run].dh, N * D);
            fxt_bitwise_f32("backward dw", b[0].dw, b[run].dw, V * D);
            fxt_bitwise_f32("backward dbias", b[0].dbias, b[run].dbias, V);
        }

        /* The same calls with chunks of whole rows, as the automatic plan took before. */
        pr.p.chunk = 57;
        pr.p.vocab_chunk = 0;
        outputs w = outputs_make(&pr);
        FXT_OK(fx_linear_cross_entropy(&pr.p, pr.h, pr.w, pr.bias, pr.t, w.loss, w.lse, w.dh, w.dw, w.dbias));
        const float *got[] = {o[0].loss, o[0].lse, o[0].dh, o[0].dw, o[0].dbias};
        const float *want[] = {w.loss, w.lse, w.dh, w.dw, w.dbias};
        const char *names[] = {"tiled vs whole rows: loss", "lse", "dh", "dw", "dbias"};
        const size_t lens[] = {nl, N, N * D, V * D, V};
        for (int i = 0; i < 5; i++) {
            double *ref = fxt_alloc_f64(lens[i]);
            for (size_t j = 0; j < lens[i]; j++)
                ref[j] = want[i][j];
            close_scaled(names[i], got[i], ref, lens[i], TOL);
            free(ref);
        }
        outputs_free(&w);
        for (int run = 0; run < 4; run++)
            outputs_free(&o[run]), outputs_free(&b[run]);
    }

    /* The library's allocation during the automatic call is the plan's bytes, then freed. */
    pr.p.chunk = 0;
    pr.p.vocab_chunk = vocab_chunk;
    pr.p.reduction = FX_REDUCTION_MEAN;
    size_t cur0, cur1, peak;
    fx_mem_stats(&cur0, &peak);
    fx_mem_reset_peak();
    outputs o = outputs_make(&pr);
    FXT_OK(fx_linear_cross_entropy(&pr.p, pr.h, pr.w, pr.bias, pr.t, o.loss, o.lse, o.dh, o.dw, o.dbias));
    fx_mem_stats(&cur1, &peak);
    FXT_EQ_INT(cur1, cur0);
    FXT_EQ_INT(peak - cur0, bytes);
    outputs_free(&o);
    problem_free(&pr);
}

static void test_auto_tiled(void)
{
    const fx_isa best = fx_get_isa();
    for (int isa = 0; isa <= (int)best; isa++) {
        fx_set_isa((fx_isa)isa);
        auto_tiled_case(0);
        /* Tiles of five blocks (the last one short): the two slabs of the backward pass of
           unequal size. */
        auto_tiled_case(2500);
    }
    fx_set_isa(best);
}

/* The reference's gradients against central differences of its own loss, so that the
   formulas (smoothing, z-loss, cap, bias) are checked independently of the code under test. */
static void test_reference_gradients(void)
{
    problem pr = problem_make(4, 3, 6, 1.0f, true, 0, 800);
    pr.p.reduction = FX_REDUCTION_SUM;
    pr.p.label_smoothing = 0.2f;
    pr.p.z_loss = 0.05f;
    pr.p.softcap = 1.5f;
    ref_out r = ref_lce(&pr.p, pr.h, pr.w, pr.bias, pr.t, NULL, NULL, NULL);
    /* Perturb in float64 by evaluating the loss with a modified copy (float inputs, so the step
       is representable: h = 2^-10 granularity). */
    const float step = 1.0f / 1024.0f;
    struct { float *x; const double *g; int64_t n; const char *name; } params[] = {
        {pr.h, r.dh, pr.p.N * pr.p.D, "h"}, {pr.w, r.dw, pr.p.V * pr.p.D, "w"}, {pr.bias, r.dbias, pr.p.V, "bias"}};
    for (size_t q = 0; q < 3; q++) {
        for (int64_t i = 0; i < params[q].n; i++) {
            float keep = params[q].x[i];
            params[q].x[i] = keep + step;
            ref_out a = ref_lce(&pr.p, pr.h, pr.w, pr.bias, pr.t, NULL, NULL, NULL);
            params[q].x[i] = keep - step;
            ref_out b = ref_lce(&pr.p, pr.h, pr.w, pr.bias, pr.t, NULL, NULL, NULL);
            params[q].x[i] = keep;
            double fd = (a.loss - b.loss) / (2.0 * (double)step);
            if (fabs(fd - params[q].g[i]) > 1e-5 + 1e-4 * fabs(fd))
                FXT_FAIL("d loss / d %s[%lld]: analytic %.9g vs central difference %.9g", params[q].name, (long long)i,
                         params[q].g[i], fd);
            ref_free(&a), ref_free(&b);
        }
    }
    ref_free(&r);
    problem_free(&pr);
}

/* Errors: each bad argument is reported by name, with FX_ERANGE for a target, and no output
   is touched. */
static int lce_call(const fx_lce *p, const problem *pr, const outputs *o)
{
    return fx_linear_cross_entropy(p, pr->h, pr->w, pr->bias, pr->t, o->loss, o->lse, o->dh, o->dw, o->dbias);
}

static int lce_bwd(const fx_lce *p, const problem *pr, const outputs *o, const float *lse_in)
{
    return fx_linear_cross_entropy_backward(p, pr->h, pr->w, pr->bias, pr->t, lse_in, pr->grad, o->dh, o->dw,
                                            o->dbias);
}

/* One bad parameter: the field set to value (exact in a double for every case), through the
   training call or the backward one. */
typedef enum { P_N, P_D, P_V, P_REDUCTION, P_SMOOTHING, P_Z_LOSS, P_SOFTCAP, P_CHUNK, P_VOCAB_CHUNK } param_field;

typedef struct param_case {
    param_field field;
    double value;
    bool bwd;
    const char *msg; /* a part of the error message */
} param_case;

static fx_lce param_case_apply(fx_lce p, const param_case *pc)
{
    switch (pc->field) {
    case P_N: p.N = (int64_t)pc->value; break;
    case P_D: p.D = (int64_t)pc->value; break;
    case P_V: p.V = (int64_t)pc->value; break;
    case P_REDUCTION: p.reduction = (fx_reduction)pc->value; break;
    case P_SMOOTHING: p.label_smoothing = (float)pc->value; break;
    case P_Z_LOSS: p.z_loss = (float)pc->value; break;
    case P_SOFTCAP: p.softcap = (float)pc->value; break;
    case P_CHUNK: p.chunk = (int64_t)pc->value; break;
    case P_VOCAB_CHUNK: p.vocab_chunk = (int64_t)pc->value; break;
    }
    return p;
}

static void expect_param_errors(const problem *pr, const outputs *o, const float *lse_in)
{
    static const param_case cases[] = {
        {P_N, 0, false, "N = 0 must be > 0"},
        {P_D, -3, false, "D = -3 must be > 0"},
        {P_V, 0, true, "V = 0 must be > 0"},
        {P_V, 1099511627776.0, false, "V = 1099511627776 exceeds"}, /* 2^40 */
        {P_N, 4611686018427387904.0, false, "overflow"},            /* 2^62 */
        {P_REDUCTION, 7, false, "reduction = 7"},
        {P_SMOOTHING, 1.5f, false, "label_smoothing = 1.5 must be in [0, 1]"},
        {P_SMOOTHING, -0.1f, false, "label_smoothing = -0.1"},
        {P_SMOOTHING, NAN, false, "label_smoothing = nan"},
        {P_Z_LOSS, -1.0f, false, "z_loss = -1 must be finite and >= 0"},
        {P_SOFTCAP, -2.0f, true, "softcap = -2"},
        {P_SOFTCAP, INFINITY, false, "softcap = inf"},
        {P_SOFTCAP, 1e-39f, false, "softcap = 1e-39 is too small"}, /* its reciprocal overflows */
        {P_SOFTCAP, 1e-39f, true, "softcap = 1e-39 is too small"},
        {P_CHUNK, -1, false, "chunk = -1 must be >= 0"},
        {P_VOCAB_CHUNK, -5, false, "vocab_chunk = -5"},
    };
    FXT_STATUS(lce_call(NULL, pr, o), FX_EINVAL, "p (the fx_lce parameters) is NULL");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int before = fxt_failed_checks;
        const fx_lce p = param_case_apply(pr->p, &cases[i]);
        if (cases[i].bwd)
            FXT_STATUS(lce_bwd(&p, pr, o, lse_in), FX_EINVAL, cases[i].msg);
        else
            FXT_STATUS(lce_call(&p, pr, o), FX_EINVAL, cases[i].msg);
        if (fxt_failed_checks != before)
            fprintf(stderr, "    (case %zu: %s)\n", i, cases[i].msg);
    }
}

/* Missing inputs, and outputs on top of an input or of another output. */
static void expect_pointer_errors(const problem *pr, const outputs *o, const float *lse_in)
{
    const fx_lce *p = &pr->p;
    FXT_STATUS(fx_linear_cross_entropy(p, NULL, pr->w, NULL, pr->t, o->loss, NULL, NULL, NULL, NULL), FX_EINVAL,
               "h is NULL");
    FXT_STATUS(fx_linear_cross_entropy(p, pr->h, NULL, NULL, pr->t, o->loss, NULL, NULL, NULL, NULL), FX_EINVAL,
               "w is NULL");
    FXT_STATUS(fx_linear_cross_entropy(p, pr->h, pr->w, NULL, NULL, o->loss, NULL, NULL, NULL, NULL), FX_EINVAL,
               "target is NULL");
    FXT_STATUS(fx_linear_cross_entropy_backward(p, pr->h, pr->w, NULL, pr->t, NULL, pr->grad, o->dh, NULL, NULL),
               FX_EINVAL, "lse is NULL");
    FXT_STATUS(fx_linear_cross_entropy_backward(p, pr->h, pr->w, NULL, pr->t, lse_in, NULL, o->dh, NULL, NULL),
               FX_EINVAL, "grad_loss is NULL");
    /* Aliasing: dh on top of h, dw on top of w, two outputs sharing memory. */
    FXT_STATUS(fx_linear_cross_entropy(p, pr->h, pr->w, NULL, pr->t, o->loss, NULL, pr->h, NULL, NULL), FX_EINVAL,
               "dh overlaps the input h");
    FXT_STATUS(fx_linear_cross_entropy_backward(p, pr->h, pr->w, NULL, pr->t, lse_in, pr->grad, o->dh, pr->w + 4,
                                                NULL),
               FX_EINVAL, "dw overlaps the input w");
    FXT_STATUS(fx_linear_cross_entropy(p, pr->h, pr->w, NULL, pr->t, o->loss, o->dh + 2, o->dh, NULL, NULL),
               FX_EINVAL, "dh overlaps lse");
}

/* Targets: the first bad one is named; ignore_index is fine anywhere. Leaves pr's targets bad. */
static void expect_target_errors(problem *pr, const outputs *o, const float *lse_in)
{
    pr->t[2] = -100;
    pr->t[3] = 9;
    pr->t[5] = -1;
    FXT_STATUS(lce_call(&pr->p, pr, o), FX_ERANGE, "target[3] = 9 is outside [0, 9) and is not ignore_index (-100)");
    FXT_STATUS(lce_bwd(&pr->p, pr, o, lse_in), FX_ERANGE, "target[3] = 9");
    pr->t[3] = 0;
    FXT_STATUS(lce_call(&pr->p, pr, o), FX_ERANGE, "target[5] = -1 is outside [0, 9)");
    fx_lce p = pr->p;
    p.ignore_index = -1;
    FXT_STATUS(lce_call(&p, pr, o), FX_ERANGE, "target[2] = -100");
}

/* Nothing was written: every output still holds its starting contents. */
static void expect_untouched(const problem *pr, const outputs *o, size_t N, size_t D, size_t V)
{
    const uint32_t guard = FXT_GUARD_BITS;
    float g;
    memcpy(&g, &guard, sizeof g);
    for (size_t i = 0; i < N; i++) {
        FXT_CHECK(memcmp(&o->lse[i], &g, sizeof g) == 0);
        FXT_CHECK(memcmp(&o->loss[i < 1 ? i : 0], &g, sizeof g) == 0);
    }
    for (size_t i = 0; i < N * D; i++)
        FXT_CHECK(memcmp(&o->dh[i], &g, sizeof g) == 0);
    fxt_bitwise_f32("dw untouched", o->dw, pr->dw0, V * D);
    fxt_bitwise_f32("dbias untouched", o->dbias, pr->db0, V);
}

/* The plan's own checks: NULL parameters; a tile too large to address plans SIZE_MAX bytes,
   so the call fails with FX_ENOMEM before any work. */
static void expect_plan_errors(void)
{
    FXT_STATUS(fx_linear_cross_entropy_plan(NULL, NULL, NULL, NULL), FX_EINVAL, "is NULL");
    fx_lce huge = fx_lce_defaults((int64_t)1 << 40, 1, (int64_t)1 << 30);
    huge.chunk = huge.N;
    size_t hb = 0;
    FXT_OK(fx_linear_cross_entropy_plan(&huge, NULL, NULL, &hb));
    FXT_EQ_INT(hb == SIZE_MAX, 1);
}

static void test_errors(void)
{
    problem pr = problem_make(6, 4, 9, 1.0f, true, 0, 900);
    outputs o = outputs_make(&pr);
    const size_t N = 6, D = 4, V = 9;
    float *lse_in = fxt_random(N, 1.0f, 2.0f, 901);
    expect_param_errors(&pr, &o, lse_in);
    expect_pointer_errors(&pr, &o, lse_in);
    expect_target_errors(&pr, &o, lse_in);
    expect_untouched(&pr, &o, N, D, V);
    expect_plan_errors();
    free(lse_in);
    outputs_free(&o);
    problem_free(&pr);
}

/* The automatic plan: its scratch stays within 2 MiB (under 1/8 of a chunked PyTorch step's
   extra memory at the benchmark shapes, N=4096 D=512 V=32768 and N=2048 D=1024 V=128256),
   tiling the vocabulary where fewer than 64 tokens of whole rows would fit; a small
   vocabulary keeps whole rows; a huge one is tiled; a given chunk is kept, with whole rows;
   and the scratch a call takes is what the plan says. */
static void test_plan(void)
{
    const size_t budget = (size_t)2 << 20;
    const int64_t shapes[][3] = {{4096, 512, 32768}, {2048, 1024, 128256}, {4096, 1024, 32768}, {8192, 768, 50257},
                                 {64, 512, 32768}};
    for (size_t s = 0; s < 5; s++) {
        fx_lce p = fx_lce_defaults(shapes[s][0], shapes[s][1], shapes[s][2]);
        int64_t c, vb;
        size_t bytes;
        FXT_OK(fx_linear_cross_entropy_plan(&p, &c, &vb, &bytes));
        if (bytes > budget || vb != 1024 || c < 16 || c > p.N)
            FXT_FAIL("N=%lld D=%lld V=%lld: plan %lld x %lld, %zu bytes; want 1024-entry tiles within %zu bytes",
                     (long long)p.N, (long long)p.D, (long long)p.V, (long long)c, (long long)vb, bytes, budget);
        /* 228 and 129 at the two benchmark shapes (the second slab's dh buffer takes 4 D bytes
           per token). */
        if (s < 2 && c < 96)
            FXT_FAIL("benchmark shape %zu: chunk %lld, want >= 96 tokens for the GEMMs' speed", s, (long long)c);
    }
    {
        fx_lce p = fx_lce_defaults(4096, 256, 4000);
        int64_t c, vb;
        size_t bytes;
        FXT_OK(fx_linear_cross_entropy_plan(&p, &c, &vb, &bytes));
        FXT_EQ_INT(vb, 4000);
        FXT_CHECK(c >= 64 && bytes <= budget);
    }
    fx_lce p = fx_lce_defaults(4096, 64, 4000000);
    int64_t c, vb;
    size_t bytes;
    FXT_OK(fx_linear_cross_entropy_plan(&p, &c, &vb, &bytes));
    FXT_CHECK(vb < p.V);
    FXT_CHECK(c >= 16 && bytes <= budget);
    p = fx_lce_defaults(100, 8, 50);
    p.chunk = 7;
    FXT_OK(fx_linear_cross_entropy_plan(&p, &c, &vb, &bytes));
    FXT_EQ_INT(c, 7);
    FXT_EQ_INT(vb, 50);
    p.chunk = 1000;
    FXT_OK(fx_linear_cross_entropy_plan(&p, &c, NULL, NULL));
    FXT_EQ_INT(c, 100);

    /* The library's own allocation during a call is exactly the plan's workspace, and is freed. */
    problem pr = problem_make(50, 16, 300, 1.0f, false, 0, 1000);
    pr.p.chunk = 8;
    FXT_OK(fx_linear_cross_entropy_plan(&pr.p, NULL, NULL, &bytes));
    size_t cur0, peak;
    fx_mem_stats(&cur0, &peak);
    fx_mem_reset_peak();
    float loss;
    float *dh = malloc((size_t)(50 * 16) * sizeof *dh);
    FXT_OK(fx_linear_cross_entropy(&pr.p, pr.h, pr.w, NULL, pr.t, &loss, NULL, dh, NULL, NULL));
    size_t cur1;
    fx_mem_stats(&cur1, &peak);
    FXT_EQ_INT(cur1, cur0);
    FXT_EQ_INT(peak - cur0, bytes);
    free(dh);
    problem_free(&pr);
}

/* The vector row kernels against the scalar reference: tails of every length, a bias, the
   cap, values whose exponentials underflow, and NaN propagation. */
static void test_row_kernels(void)
{
    const fx_isa best = fx_get_isa();
    const fx__lce_row_kernels *vec[] = {&fx__lce_row_kernels_avx2, &fx__lce_row_kernels_avx512};
    const size_t lens[] = {1, 7, 8, 9, 15, 16, 17, 100, 1023, 1024, 1025, 3001};
    float *bias = fxt_random(4096, -2.0f, 2.0f, 1100);
    for (int v = 0; v < 2; v++) {
        if ((int)best < v + 1)
            break; /* this CPU cannot run that path */
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const size_t un = lens[li];
            const int64_t n = (int64_t)un;
            if (un == 0 || un > 4096) /* bounds the sizes for the compiler's overflow analysis */
                continue;
            for (int cfg = 0; cfg < 4; cfg++) {
                const float cap = cfg & 1 ? 7.5f : 0.0f;
                const float *b = cfg & 2 ? bias : NULL;
                float *z0 = fxt_random(un, -40.0f, 40.0f, 1200 + (uint64_t)n);
                z0[n / 2] = -200.0f; /* exp underflows to 0 */
                float *zs = fxt_guarded_copy(z0, un), *zv = fxt_guarded_copy(z0, un);
                fx__lce_stat ss = {-INFINITY, 0.0, 0.0}, sv = ss;
                fx__lce_row_kernels_scalar.stats(zs, n, b, cap, &ss);
                vec[v]->stats(zv, n, b, cap, &sv);
                double *ref = fxt_alloc_f64(un);
                for (int64_t j = 0; j < n; j++)
                    ref[j] = zs[j];
                fxt_close_f32("transformed logits", zv, ref, un, 1e-5 * (cap > 0 ? cap : 1.0), 1e-6);
                FXT_NEAR(sv.m, ss.m, 1e-5, 1e-6);
                FXT_NEAR(sv.s, ss.s, 0.0, 1e-5);
                FXT_NEAR(sv.sum_z, ss.sum_z, 1e-4 * (double)n, 1e-5);
                const float lse = (float)(ss.m + log(ss.s));
                fx__lce_row_kernels_scalar.grad(zs, n, lse, 0.7f, 0.01f, cap);
                vec[v]->grad(zv, n, lse, 0.7f, 0.01f, cap);
                for (int64_t j = 0; j < n; j++)
                    ref[j] = zs[j];
                fxt_close_f32("gradient", zv, ref, un, 1e-6, 1e-5);
                /* prep is the transform of stats without the statistics */
                float *zp = fxt_guarded_copy(z0, un), *zq = fxt_guarded_copy(z0, un);
                vec[v]->prep(zp, n, b, cap);
                fx__lce_stat dummy = {-INFINITY, 0.0, 0.0};
                vec[v]->stats(zq, n, b, cap, &dummy);
                fxt_bitwise_f32("prep == stats transform", zp, zq, un);
                free(ref), free(z0);
                fxt_guarded_free("zs", zs), fxt_guarded_free("zv", zv), fxt_guarded_free("zp", zp), fxt_guarded_free("zq", zq);
            }
        }
        /* A NaN logit makes the row's statistics NaN on every path. */
        float z[20];
        for (int j = 0; j < 20; j++)
            z[j] = (float)j;
        z[11] = NAN;
        fx__lce_stat st = {-INFINITY, 0.0, 0.0};
        vec[v]->stats(z, 20, NULL, 0.0f, &st);
        FXT_CHECK(isnan(st.s) || isnan(st.m));
    }
    free(bias);
}

/* The fused-pass kernels of each path: the GEMMs (the scalar reference and the AVX-512
   twin; the AVX2 path leaves its products to BLIS) against a float64 GEMM, the vector
   paths' elementwise kernels against the scalar ones; at every remainder of the register
   tiles: vocabulary rows (6 per tile), tokens (vectors of 16, four per tile), hidden columns
   (vectors of 16, four per tile), and a column range of dh that starts and ends inside the
   row. Outputs carry guard zones. */
/* A path's fused-pass kernels. */
typedef struct tile_path {
    fx_isa isa;
    const fx__lce_tile_kernels *kern; /* NULL: the reference itself */
    const fx__lce_tile_gemms *gemm;   /* NULL: the path has none of its own */
} tile_path;

/* One tile shape's inputs: nj vocabulary rows w [nj,D], c tokens h [c,D] (and transposed,
   hT [D,ldh]), gradients-like values g [nj,c], and a float64 buffer for the references. */
typedef struct tile_case {
    const tile_path *path;
    int64_t nj, c, D, ldh;
    size_t uz, uw, uh;
    uint64_t seed;
    float *w, *h, *hT, *g;
    double *ref;
} tile_case;

static tile_case tile_case_make(const tile_path *path, int64_t nj, int64_t c, int64_t D, uint64_t seed)
{
    tile_case tc = {.path = path, .nj = nj, .c = c, .D = D, .ldh = (c + 15) / 16 * 16, .uz = (size_t)(nj * c),
                    .uw = (size_t)(nj * D), .uh = (size_t)(c * D), .seed = seed};
    tc.w = fxt_random(tc.uw, -1.0f, 1.0f, seed), tc.h = fxt_random(tc.uh, -1.0f, 1.0f, seed + 1);
    tc.hT = fxt_random((size_t)(D * tc.ldh), -1.0f, 1.0f, seed + 2);
    for (int64_t i = 0; i < c; i++)
        for (int64_t d = 0; d < D; d++)
            tc.hT[d * tc.ldh + i] = tc.h[i * D + d];
    const size_t uz = tc.uz, uw = tc.uw, uh = tc.uh;
    tc.ref = fxt_alloc_f64(uz > uh ? (uz > uw ? uz : uw) : (uh > uw ? uh : uw));
    /* gradients-like values, a few exactly zero */
    tc.g = fxt_random(uz, -1.0f, 1.0f, seed + 3);
    tc.g[0] = 0.0f;
    return tc;
}

static void tile_case_free(tile_case *tc)
{
    free(tc->g), free(tc->w), free(tc->h), free(tc->hT), free(tc->ref);
}

/* The float64 GEMM: ref[m, n] = c0[m, n] (0 without c0) + the sum over k of a[m, k] b[k, n],
   each operand addressed through its two strides. */
static void ref_gemm(double *ref, int64_t M, int64_t N, int64_t K, const float *a, int64_t am, int64_t ak,
                     const float *b, int64_t bk, int64_t bn, const float *c0)
{
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = c0 ? c0[m * N + n] : 0.0;
            for (int64_t k = 0; k < K; k++)
                acc += (double)a[m * am + k * ak] * b[k * bk + n * bn];
            ref[m * N + n] = acc;
        }
}

/* A GEMM's output against tc->ref, named by path, kernel and tile shape (and suffix). */
static void tile_gemm_close(const tile_case *tc, const char *kernel, const char *suffix, const float *got, size_t n,
                            double atol)
{
    char what[96];
    snprintf(what, sizeof what, "%s %s nj %lld c %lld D %lld%s", fx_isa_name(tc->path->isa), kernel,
             (long long)tc->nj, (long long)tc->c, (long long)tc->D, suffix);
    fxt_close_f32(what, got, tc->ref, n, atol, 1e-5);
}

/* The logits GEMM, z = w h^T. */
static void check_tile_logits(const tile_case *tc)
{
    const int64_t nj = tc->nj, c = tc->c, D = tc->D;
    float *zt = fxt_guarded(tc->uz);
    tc->path->gemm->logits(nj, c, D, tc->w, tc->hT, tc->ldh, zt, c);
    ref_gemm(tc->ref, nj, c, D, tc->w, D, 1, tc->h, 1, D, NULL);
    tile_gemm_close(tc, "logits", "", zt, tc->uz, 1e-5 * (double)D);
    fxt_guarded_free("zt", zt);
}

/* The dw GEMM, dw += g h. */
static void check_tile_dw(const tile_case *tc)
{
    const int64_t nj = tc->nj, c = tc->c, D = tc->D;
    float *dw0 = fxt_random(tc->uw, -1.0f, 1.0f, tc->seed + 4);
    float *dw = fxt_guarded_copy(dw0, tc->uw);
    tc->path->gemm->dw(nj, c, D, tc->g, c, tc->h, dw);
    ref_gemm(tc->ref, nj, D, c, tc->g, c, 1, tc->h, D, 1, dw0);
    tile_gemm_close(tc, "dw", "", dw, tc->uw, 1e-5 * (double)c);
    fxt_guarded_free("dw", dw);
    free(dw0);
}

/* The dh GEMM, dh (=|+=) g^T w, overwriting and accumulating. */
static void check_tile_dh(const tile_case *tc)
{
    const int64_t nj = tc->nj, c = tc->c, D = tc->D;
    float *dh0 = fxt_random(tc->uh, -1.0f, 1.0f, tc->seed + 5);
    /* columns [d0, d1): inside the row when D allows, the rest untouched */
    const int64_t d0 = D > 32 ? 16 : 0, d1 = D > 32 ? D - 1 : D;
    for (int acc_in = 0; acc_in < 2; acc_in++) {
        float *dh = fxt_guarded_copy(dh0, tc->uh);
        tc->path->gemm->dh(nj, c, D, d0, d1, tc->g, c, tc->w, dh, acc_in != 0);
        for (int64_t i = 0; i < c; i++)
            for (int64_t d = 0; d < D; d++) {
                double x = d < d0 || d >= d1 || acc_in ? dh0[i * D + d] : 0.0;
                if (d >= d0 && d < d1)
                    for (int64_t j = 0; j < nj; j++)
                        x += (double)tc->g[j * c + i] * tc->w[j * D + d];
                tc->ref[i * D + d] = x;
            }
        tile_gemm_close(tc, "dh", acc_in ? " acc 1" : " acc 0", dh, tc->uh, 1e-5 * (double)nj);
        fxt_guarded_free("dh", dh);
    }
    free(dh0);
}

/* Statistics, transform and gradients against the scalar twins, with the cap if cap > 0 and
   a bias if bias; coef holds lse, the two gradient coefficients and keep, [c] each. */
static void check_tile_elementwise(const tile_case *tc, float cap, const float *bias, float *coef, int cfg)
{
    const fx__lce_tile_kernels *o = tc->path->kern;
    const int64_t nj = tc->nj, c = tc->c;
    const size_t uz = tc->uz;
    if (uz == 0 || uz > (size_t)1 << 24) { /* bounds the sizes for the compiler's overflow analysis */
        FXT_FAIL("tile of %zu logits: not a size this test makes", uz);
        return;
    }
    float *z0 = fxt_random(uz, -30.0f, 30.0f, tc->seed + 8);
    z0[uz / 2] = -200.0f;
    float *zs = fxt_guarded_copy(z0, uz), *zv = fxt_guarded_copy(z0, uz);
    float *st_s = fxt_guarded((size_t)(3 * c)), *st_v = fxt_guarded((size_t)(3 * c));
    fx__lce_tile_kernels_scalar.stats(zs, nj, c, c, bias, cap, st_s, st_s + c, st_s + 2 * c);
    o->stats(zv, nj, c, c, bias, cap, st_v, st_v + c, st_v + 2 * c);
    for (size_t i = 0; i < uz; i++)
        tc->ref[i] = zs[i];
    char what[96];
    snprintf(what, sizeof what, "%s stats nj %lld c %lld cfg %d", fx_isa_name(tc->path->isa), (long long)nj,
             (long long)c, cfg);
    fxt_close_f32(what, zv, tc->ref, uz, 1e-5 * (cap > 0 ? cap : 1.0), 1e-6);
    for (int64_t i = 0; i < c; i++) {
        FXT_NEAR(st_v[i], st_s[i], 1e-5, 1e-6);
        FXT_NEAR(st_v[c + i], st_s[c + i], 0.0, 1e-5);
        FXT_NEAR(st_v[2 * c + i], st_s[2 * c + i], 1e-4 * (double)nj, 1e-5);
    }
    float *zp = fxt_guarded_copy(z0, uz);
    o->prep(zp, nj, c, c, bias, cap);
    fxt_bitwise_f32("prep == stats transform", zp, zv, uz);
    float *lse = coef, *ca = coef + c, *cb = coef + 2 * c, *keep = coef + 3 * c;
    for (int64_t i = 0; i < c; i++)
        lse[i] = st_s[i] + logf(st_s[c + i]);
    fx__lce_tile_kernels_scalar.grad(zs, nj, c, c, lse, ca, cb, keep, cap);
    o->grad(zv, nj, c, c, lse, ca, cb, keep, cap);
    for (size_t i = 0; i < uz; i++)
        tc->ref[i] = zs[i];
    snprintf(what, sizeof what, "%s grad nj %lld c %lld cfg %d", fx_isa_name(tc->path->isa), (long long)nj,
             (long long)c, cfg);
    fxt_close_f32(what, zv, tc->ref, uz, 1e-6, 1e-5);
    for (int64_t j = 0; j < nj; j++)
        for (int64_t i = 0; i < c; i++)
            if (keep[i] == 0.0f)
                FXT_CHECK(zv[j * c + i] == 0.0f);
    free(z0);
    fxt_guarded_free("zs", zs), fxt_guarded_free("zv", zv), fxt_guarded_free("zp", zp);
    fxt_guarded_free("st_s", st_s), fxt_guarded_free("st_v", st_v);
}

/* Every check of one path at one tile shape. */
static void check_tile_case(const tile_case *tc)
{
    if (tc->path->gemm) {
        check_tile_logits(tc);
        check_tile_dw(tc);
        check_tile_dh(tc);
    }
    float *bias = fxt_random((size_t)tc->nj, -2.0f, 2.0f, tc->seed + 6);
    float *coef = fxt_random((size_t)(4 * tc->c), 0.5f, 1.5f, tc->seed + 7);
    for (int64_t i = 0; i < tc->c; i++)
        coef[3 * tc->c + i] = (float)(i % 3 != 1); /* keep: some tokens ignored */
    for (int cfg = 0; tc->path->kern && cfg < 4; cfg++)
        check_tile_elementwise(tc, cfg & 1 ? 7.5f : 0.0f, cfg & 2 ? bias : NULL, coef, cfg);
    free(bias), free(coef);
}

static void test_fused_kernels(void)
{
    const fx_isa best = fx_get_isa();
    const tile_path paths[] = {{FX_ISA_SCALAR, NULL, &fx__lce_tile_gemms_scalar},
                               {FX_ISA_AVX2, &fx__lce_tile_kernels_avx2, NULL},
                               {FX_ISA_AVX512, &fx__lce_tile_kernels_avx512, &fx__lce_tile_gemms_avx512}};
    const int64_t njs[] = {1, 5, 6, 7, 13, 64};
    const int64_t cs[] = {1, 15, 16, 17, 63, 70};
    const int64_t Ds[] = {1, 16, 17, 65, 130};
    for (int v = 0; v < 3; v++) {
        if (best < paths[v].isa)
            break; /* this CPU cannot run that path */
        for (size_t a = 0; a < sizeof njs / sizeof njs[0]; a++)
            for (size_t b = 0; b < sizeof cs / sizeof cs[0]; b++)
                for (size_t e = 0; e < sizeof Ds / sizeof Ds[0]; e++) {
                    tile_case tc = tile_case_make(&paths[v], njs[a], cs[b], Ds[e], 3000 + 100 * a + 10 * b + e);
                    check_tile_case(&tc);
                    tile_case_free(&tc);
                }
    }
}

/* Each CPU path's float32 call takes the products meant for it: the module's own kernels
   on the scalar and AVX-512 paths, BLIS's on AVX2 (a route lost to another would still pass
   every numerical check). */
static void test_product_routes(void)
{
    const fx_isa best = fx_get_isa();
    const char *want[] = {[FX_ISA_SCALAR] = "lce kernels", [FX_ISA_AVX2] = "blas", [FX_ISA_AVX512] = "lce kernels"};
    for (int isa = FX_ISA_SCALAR; isa <= (int)best; isa++) {
        fx_set_isa((fx_isa)isa);
        const char *got = fx__lce_f32_products();
        if (strcmp(got, want[isa]) != 0)
            FXT_FAIL("%s path: products by '%s', not '%s'", fx_isa_name((fx_isa)isa), got, want[isa]);
    }
    fx_set_isa(best);
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    FXT_RUN(test_reference_gradients);
    FXT_RUN(test_row_kernels);
    FXT_RUN(test_fused_kernels);
    FXT_RUN(test_product_routes);
    FXT_RUN(test_all_options);
    FXT_RUN(test_odd_sizes);
    FXT_RUN(test_per_token_grad);
    FXT_RUN(test_all_ignored);
    FXT_RUN(test_large_logits);
    FXT_RUN(test_tied_weight);
    FXT_RUN(test_threads_bitwise);
    FXT_RUN(test_auto_tiled);
    FXT_RUN(test_bf16_call);
    FXT_RUN(test_errors);
    FXT_RUN(test_plan);
    return fxt_finish();
}
