/* Mods as expressions (src/attention/mod.c): the language's semantics on single values,
   compile errors with their columns, score mods (values and the gradients of q, k, v and the
   captured tensors) against a float64 reference, the built-ins' hand-written twins, determinism
   of the tensors' gradients across thread counts, decoding, and mask expressions' block masks
   against hand-written masks. */
#include "harness.h"

#include <float.h>

#include "attention_ref.h"
#include <flexc/mod.h>

/* ---- single values ------------------------------------------------------------------------ */

/* The score mod's value at one position (score s, b = 1, h = 2). */
static float eval1(const char *expr, float s, int64_t q, int64_t kv, const fx_mod_tensor *t, int nt)
{
    fx_mod *m = NULL;
    int rc = fx_mod_compile(&m, expr, t, nt);
    if (rc != FX_OK) {
        FXT_FAIL("compile '%s': %s", expr, fx_last_error());
        return NAN;
    }
    if (fx_mod_is_mask(m)) {
        float r = fx_mod_mask(1, 2, q, kv, m) ? 1.0f : 0.0f;
        fx_mod_free(m);
        return r;
    }
    float x = s;
    fx_mod_score(&x, 1, 1, 1, 1, 2, q, kv, m);
    fx_mod_free(m);
    return x;
}

#define EV(expr, q, kv, want) FXT_NEAR(eval1(expr, 0.0f, q, kv, NULL, 0), (double)(want), 0, 0)

static void test_semantics(void)
{
    /* Python / PyTorch integer division and remainder: floor, sign of the divisor */
    EV("(q_idx - 7) // 2", 0, 0, -4);
    EV("(q_idx - 7) % 3", 0, 0, 2);
    EV("(q_idx + 7) % -3", 0, 0, -2);
    EV("(q_idx + 7) // -2", 0, 0, -4);
    EV("q_idx // 0", 5, 0, 0);   /* defined as 0 (PyTorch raises) */
    EV("q_idx % 0", 5, 0, 0);
    EV("-7.5 // 2", 0, 0, -4);   /* float floor division */
    EV("-7.5 % 2", 0, 0, 0.5);
    EV("7 / 2", 0, 0, 3.5);      /* true division of ints is float */
    EV("int(-2.7)", 0, 0, -2);   /* truncation toward zero, as .to(torch.int64) */
    EV("int(2.7) + kv_idx", 0, 3, 5);
    EV("float(q_idx) / 4", 3, 0, 0.75);
    EV("b * 100 + h * 10", 0, 0, 120);
    EV("abs(q_idx - kv_idx)", 3, 10, 7);
    EV("min(q_idx, kv_idx) + max(q_idx, kv_idx) * 10", 3, 10, 103);
    EV("clamp(q_idx - kv_idx, -2, 2)", 3, 10, -2);
    EV("pow(2, 10)", 0, 0, 1024);
    EV("2 ** 3 ** 2", 0, 0, 512); /* right associative */
    EV("-2 ** 2", 0, 0, -4);      /* ** binds tighter than unary minus */
    EV("floor(-0.5) + floor(q_idx)", 4, 0, 3);
    EV("where(q_idx > kv_idx, 1.5, -1)", 4, 0, 1.5);
    EV("where(q_idx > kv_idx, 1.5, -1)", 0, 4, -1);
    EV("sqrt(16) + exp(0) + log(1) + log1p(0) + tanh(0) + sigmoid(0)", 0, 0, 5.5);
    EV("float(q_idx < kv_idx) + float(q_idx == 3) * 2", 3, 4, 3);
    EV("float(True) + int(q_idx >= 3)", 3, 0, 2);
    EV("1 + 2 * 3 - 4 / 2", 0, 0, 5);
    /* masks */
    EV("kv_idx <= q_idx && not (q_idx - kv_idx > 2)", 5, 3, 1);
    EV("kv_idx <= q_idx and !(q_idx - kv_idx > 2)", 5, 2, 0);
    EV("q_idx == 0 || kv_idx == 0 or False", 5, 0, 1);
    EV("(q_idx - kv_idx) % 2 == 0", 5, 3, 1);
    /* the score and captured tensors, indices clamped into range */
    FXT_NEAR(eval1("score * 2 + 1", 1.25f, 0, 0, NULL, 0), 3.5, 0, 0);
    float tab[6] = {10, 11, 12, 13, 14, 15};
    int64_t ids[3] = {7, 8, 9};
    fx_mod_tensor t[2] = {{.name = "tab", .dtype = FX_DT_F32, .ndim = 2, .shape = {2, 3}, .data = tab},
                          {.name = "ids", .dtype = FX_DT_I64, .ndim = 1, .shape = {3}, .data = ids}};
    FXT_NEAR(eval1("tab[1, kv_idx]", 0, 0, 2, t, 2), 15, 0, 0);
    FXT_NEAR(eval1("tab[0, kv_idx]", 0, 0, 99, t, 2), 12, 0, 0);       /* clamped high */
    FXT_NEAR(eval1("tab[0, kv_idx - 5]", 0, 0, 0, t, 2), 10, 0, 0);    /* clamped low */
    FXT_NEAR(eval1("ids[q_idx] + ids[kv_idx] / 2", 0, 1, 2, t, 2), 12.5, 0, 0);
    FXT_NEAR(eval1("ids[q_idx] == 8", 0, 1, 2, t, 2), 1, 0, 0);
}

/* Rows of a tile are evaluated as vectors: a wide tile gives what single positions give. */
static void test_tile_matches_points(void)
{
    const char *expr = "where(kv_idx % 3 == 0, score * 0.5, score - float(q_idx - kv_idx) / 7) + tab[h, kv_idx // 20]";
    float tab[2 * 10];
    for (int i = 0; i < 20; i++)
        tab[i] = 0.1f * (float)i - 0.7f;
    fx_mod_tensor t = {.name = "tab", .dtype = FX_DT_F32, .ndim = 2, .shape = {2, 10}, .data = tab};
    fx_mod *m;
    FXT_OK(fx_mod_compile(&m, expr, &t, 1));
    enum { NQ = 5, NK = 150, LD = 160 };
    static float s[NQ * LD];
    for (int i = 0; i < NQ * LD; i++)
        s[i] = (float)((i * 37) % 101) / 25.0f - 2.0f;
    static float s0[NQ * LD];
    memcpy(s0, s, sizeof s);
    fx_mod_score(s, LD, NQ, NK, 0, 1, 40, 3, m);
    for (int i = 0; i < NQ; i++)
        for (int j = 0; j < NK; j++) {
            float x = s0[i * LD + j];
            fx_mod_score(&x, 1, 1, 1, 0, 1, 40 + i, 3 + j, m);
            if (memcmp(&x, &s[i * LD + j], sizeof x)) {
                FXT_FAIL("tile [%d,%d] = %g, single = %g", i, j, (double)s[i * LD + j], (double)x);
                i = NQ;
                break;
            }
        }
    for (int j = NK; j < LD; j++) /* past nkv: untouched */
        FXT_CHECK(memcmp(&s[j], &s0[j], sizeof(float)) == 0);
    fx_mod_free(m);
}

/* ---- the evaluator's paths ------------------------------------------------------------------- */

/* Score mods over every kind of operand: each leaf (hoisted once per call: b, h, constants and
   reads at them; once per row: q_idx; per position: kv_idx, the score), the affine index forms
   (plain, clamped, scaled, past int32, wrapping int64), the vectorised exp / tanh / sigmoid,
   and integer tensors. */
static const char *path_exprs[] = {
    "score",
    "score + b * 0.25 + h * 0.5 + 3",
    "score * tab[h, 1] + tab[b, 2]",
    "score + float(q_idx) / 8 + tab[1, q_idx % 3]",
    "score - float(kv_idx % 7) + tab[h, kv_idx // 50]",
    "score + tab[h, clamp(q_idx - kv_idx + 2, 0, 2)]",
    "score + tab[h, q_idx - kv_idx]",
    "score + tab[1 - h, 3 * kv_idx - 2 * q_idx + 1] * tab[h, clamp(kv_idx, 1, 1)]",
    "score + float(kv_idx - q_idx) * tab[h, 0]",
    "score + float(kv_idx * 3000000000 - q_idx)",
    "score + tab[h, kv_idx * 4611686018427387904 + 1] + float(-(kv_idx * 7) + 2147483000)",
    "score + float(kv_idx - 2147483647) + tab[0, clamp(-kv_idx, -9223372036854775807, 9223372036854775807)]",
    "exp(score) + tanh(score * 3) + sigmoid(-score)",
    "where(score > 0.5, exp(score * 40), tanh(score / 0.001))",
    "score + float(ids[kv_idx % 3] * q_idx) + float(ids[clamp(kv_idx - q_idx, 0, 2)]) + float(flag[h, kv_idx])",
    "log1p(abs(score)) + pow(abs(score), 0.5) + score % 0.7 + sqrt(abs(score)) + floor(score * 3)",
    "where(kv_idx == q_idx, score, score * 0.5) + float((q_idx - kv_idx) // 3 + b)",
    /* unit steps through a wide table: runs of one element, consecutive ones (forwards and
       reversed), and the clamps' edges between */
    "score + big[h, clamp(q_idx - kv_idx + 150, 0, 299)] + big[b, kv_idx - q_idx + 100]",
    "score + big[h, clamp(q_idx - kv_idx + 60, 0, 299)] * big[1 - h, clamp(kv_idx - q_idx, 10, 20)]",
};

static float path_tab[2 * 3] = {0.5f, -1.25f, 2.0f, 0.75f, -0.5f, 1.5f};
static int64_t path_ids[3] = {4, -2, 9};
static uint8_t path_flag[2 * 2] = {0, 1, 1, 0};
static float path_big[2 * 300];
static fx_mod_tensor path_t[4] = {
    {.name = "tab", .dtype = FX_DT_F32, .ndim = 2, .shape = {2, 3}, .data = path_tab},
    {.name = "ids", .dtype = FX_DT_I64, .ndim = 1, .shape = {3}, .data = path_ids},
    {.name = "flag", .dtype = FX_DT_BOOL, .ndim = 2, .shape = {2, 2}, .data = path_flag},
    {.name = "big", .dtype = FX_DT_F32, .ndim = 2, .shape = {2, 300}, .data = path_big},
};

/* Scores with the edges of the functions: NaN, infinities, subnormals, the exp clamps, tanh's
   switch to its series, and a spread of ordinary values. */
static void path_scores(float *s, int n)
{
    static const float edge[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, -1e-40f, 0.0625f, -0.0625f,
                                 0.0624999f, -104.0f, -104.5f, -103.9f, 88.7f, 88.8f, 89.0f, 89.5f, -87.5f,
                                 1e30f, -1e30f, 20.0f, -20.0f, 9.0f, 0.5f};
    const int ne = (int)(sizeof edge / sizeof edge[0]);
    uint32_t r = 7u;
    for (int i = 0; i < n; i++) {
        r = r * 1664525u + 1013904223u;
        float u = (float)(r >> 8) / (float)(1u << 24) * 12.0f - 6.0f;
        s[i] = i % 5 == 0 ? edge[(i / 5) % ne] : i % 5 == 1 ? u * 0.012f : u; /* some in tanh's series */
    }
}

static bool same_bits(float a, float b) { return (a != a && b != b) || memcmp(&a, &b, sizeof a) == 0; }

/* The scalar, AVX2 and AVX-512 paths (those this CPU has) give the same bits for every
   expression, at tiles wider than a run of positions and at positions near and past int32's
   range; and at every path a tile gives what single positions give (the hoisted parts are
   those of each position). */
static void test_paths_agree(void)
{
    enum { NQ = 5, NK = 150, LD = 160 };
    static const fx_isa isas[] = {FX_ISA_SCALAR, FX_ISA_AVX2, FX_ISA_AVX512};
    static const int64_t at[][2] = {{40, 3}, {2147483600, 2147483500}, {(int64_t)1 << 40, ((int64_t)1 << 40) - 70}};
    const fx_isa best = fx_get_isa();
    static float s0[NQ * LD], ref[NQ * LD], x[NQ * LD], g0[NQ * LD], gref[NQ * LD], gx[NQ * LD];
    path_scores(s0, NQ * LD);
    for (int i = 0; i < 2 * 300; i++)
        path_big[i] = (float)((i * 7919) % 601) / 300.0f - 1.0f;
    for (int i = 0; i < NQ * LD; i++)
        g0[i] = i % 7 == 0 ? 0.0f : (float)((i * 13) % 29) / 7.0f - 2.0f;
    int paths = 0;
    for (size_t e = 0; e < sizeof path_exprs / sizeof path_exprs[0]; e++) {
        fx_mod *m;
        FXT_OK(fx_mod_compile(&m, path_exprs[e], path_t, 4));
        if (!m)
            continue;
        for (size_t p = 0; p < sizeof at / sizeof at[0]; p++) {
            const int64_t q0 = at[p][0], kv0 = at[p][1];
            for (int t = 0; t < 3; t++) {
                if (fx_set_isa(isas[t]) != FX_OK)
                    continue;
                paths += e == 0 && p == 0;
                float *out = t == 0 ? ref : x, *gout = t == 0 ? gref : gx;
                memcpy(out, s0, sizeof s0);
                fx_mod_score(out, LD, NQ, NK, 1, 1, q0, kv0, m);
                memcpy(gout, g0, sizeof g0);
                fx_mod_score_grad(s0, gout, LD, NQ, NK, 1, 1, q0, kv0, m);
                for (int i = 0; i < NQ * LD; i++) {
                    if (t > 0 && (!same_bits(x[i], ref[i]) || !same_bits(gx[i], gref[i]))) {
                        FXT_FAIL("'%s' at q0 = %lld, %s: [%d] = %.9g / d %.9g, scalar %.9g / d %.9g", path_exprs[e],
                                 (long long)q0, fx_isa_name(isas[t]), i, (double)x[i], (double)gx[i],
                                 (double)ref[i], (double)gref[i]);
                        break;
                    }
                    int r = i / LD, c = i % LD;
                    if (c >= NK) { /* past nkv: untouched */
                        FXT_CHECK(memcmp(&out[i], &s0[i], sizeof(float)) == 0);
                        continue;
                    }
                    float one = s0[i];
                    fx_mod_score(&one, 1, 1, 1, 1, 1, q0 + r, kv0 + c, m);
                    if (!same_bits(one, out[i])) {
                        FXT_FAIL("'%s' at q0 = %lld, %s: tile [%d,%d] = %.9g, single = %.9g", path_exprs[e],
                                 (long long)q0, fx_isa_name(isas[t]), r, c, (double)out[i], (double)one);
                        break;
                    }
                }
            }
        }
        fx_mod_free(m);
    }
    fx_set_isa(best);
    fprintf(stderr, "  %d paths\n", paths);
}

/* exp, tanh and sigmoid (the language's own, mod_eval.h) against float64 over their range,
   and their special values. */
static void test_functions(void)
{
    fx_mod *me, *mt, *ms;
    FXT_OK(fx_mod_compile(&me, "exp(score)", NULL, 0));
    FXT_OK(fx_mod_compile(&mt, "tanh(score)", NULL, 0));
    FXT_OK(fx_mod_compile(&ms, "sigmoid(score)", NULL, 0));
    enum { N = 200001 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    fx_mod *mods[3] = {me, mt, ms};
    for (int f = 0; f < 3; f++) {
        double lo = f == 0 ? -110.0 : -25.0, hi = f == 0 ? 95.0 : 25.0, worst = 0;
        for (int i = 0; i < N; i++)
            x[i] = (float)(lo + (hi - lo) * i / (N - 1)), y[i] = x[i];
        fx_mod_score(y, N, 1, N, 0, 0, 0, 0, mods[f]);
        for (int i = 0; i < N; i++) {
            double v = x[i], want = f == 0 ? exp(v) : f == 1 ? tanh(v) : 1.0 / (1.0 + exp(-v));
            if (want > FLT_MAX) {
                FXT_CHECK(y[i] == INFINITY);
                continue;
            }
            double err = fabs((double)y[i] - want) / fmax(fabs(want), 1.1754943508222875e-38);
            worst = err > worst ? err : worst;
            if (!(err <= 1e-6 || (f == 0 && fabs((double)y[i] - want) <= 1.5e-45))) {
                FXT_FAIL("%s(%.9g) = %.9g, want %.9g", f == 0 ? "exp" : f == 1 ? "tanh" : "sigmoid", v,
                         (double)y[i], want);
                break;
            }
        }
        fprintf(stderr, "  %s: largest relative error %.2g\n", f == 0 ? "exp" : f == 1 ? "tanh" : "sigmoid", worst);
    }
    /* special values */
    static const float in[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -104.5f, 89.5f};
    static const float want[3][7] = {{1, 1, INFINITY, 0, NAN, 0, INFINITY},
                                     {0, -0.0f, 1, -1, NAN, -1, 1},
                                     {0.5f, 0.5f, 1, 0, NAN, 0, 1}};
    for (int f = 0; f < 3; f++)
        for (int i = 0; i < 7; i++) {
            float v = in[i];
            fx_mod_score(&v, 1, 1, 1, 0, 0, 0, 0, mods[f]);
            if (!same_bits(v, want[f][i]) && !(want[f][i] == 0 && v == 0 && f != 1))
                FXT_FAIL("function %d at %g: %g, want %g", f, (double)in[i], (double)v, (double)want[f][i]);
        }
    free(x), free(y);
    fx_mod_free(me), fx_mod_free(mt), fx_mod_free(ms);
}

/* An expression whose hoisted values alone would need more registers than a program has is
   compiled without hoisting, and gives the same values. */
static void test_many_hoisted(void)
{
    char expr[4096] = "score";
    size_t n = strlen(expr);
    for (int i = 0; i < 70; i++)
        n += (size_t)snprintf(expr + n, sizeof expr - n, " + score * tab[h, %d]", i % 3);
    fx_mod *m;
    FXT_OK(fx_mod_compile(&m, expr, path_t, 3));
    if (!m)
        return;
    float s[4] = {0.5f, -1.0f, 2.0f, 0.25f}, want[4];
    for (int j = 0; j < 4; j++) {
        float t = s[j];
        for (int i = 0; i < 70; i++) /* in the expression's order, in float */
            t = t + s[j] * path_tab[3 + i % 3];
        want[j] = t;
    }
    fx_mod_score(s, 4, 1, 4, 0, 1, 5, 0, m);
    fxt_bitwise_f32("sum of 70 reads", s, want, 4);
    fx_mod_free(m);
}

static void bad(const char *expr, const char *msg)
{
    float tab[4] = {0};
    fx_mod_tensor t = {.name = "bias", .dtype = FX_DT_F32, .ndim = 2, .shape = {2, 2}, .data = tab};
    fx_mod *m = NULL;
    fx_clear_error();
    int rc = fx_mod_compile(&m, expr, &t, 1);
    if (rc != FX_EINVAL)
        FXT_FAIL("'%s' compiled (rc %d), expected \"%s\"", expr, rc, msg);
    else if (!strstr(fx_last_error(), msg))
        FXT_FAIL("'%s': message \"%s\" does not contain \"%s\"", expr, fx_last_error(), msg);
    fx_mod_free(rc == FX_OK ? m : NULL);
}

static void test_compile_errors(void)
{
    bad("score + tanhh(score)", "expr:9: unknown function 'tanhh'");
    bad("(score - kv_idx % 2) == 0 && kv_idx <= q_idx", "expr:1: a mask (a bool expression) cannot read score");
    bad("score + foo", "expr:9: unknown name 'foo'");
    bad("score +", "expr:8: expected a value, got the end");
    bad("(score + 1", "expr:11: expected ')' to close '('");
    bad("score $ 2", "expr:7: unexpected '$' after the expression");
    bad("bias[h]", "expr:1: 'bias' has 2 dimensions, got 1 index");
    bad("bias[h, 1, 2]", "expr:12: 'bias' has 2 dimensions, got more indices");
    bad("bias[h, score]", "expr:9: index 2 of 'bias' is a float");
    bad("bias[0, -1]", "expr:9: index 2 of 'bias' is always out of range [0, 2)");
    bad("bias[h, q_idx + 5]", "index 2 of 'bias' is always out of range");
    bad("q_idx < kv_idx < 3", "expr:16: chained comparison");
    bad("q_idx && kv_idx", "expr:7: '&&' needs bool operands");
    bad("where(q_idx, 1, 2)", "expr:7: where's condition must be bool");
    bad("clamp(score, 1)", "expr:1: 'clamp' takes 3 arguments, got 2");
    bad("min(score, 1, 2, 3)", "expr:18: too many arguments to 'min' (it takes 2)");
    bad("not score", "expr:1: '!' needs a bool operand");
    bad("12abc", "expr:1: bad number '12a'");
    bad("99999999999999999999", "does not fit in int64");
    bad("score = 1", "expr:7: unexpected '='");
    bad("", "expr:1: expected a value, got the end");
    bad("bias", "expr:5: expected '[' after a tensor's name");
    /* deep nesting is refused, not a stack overflow */
    char deep[2100];
    memset(deep, '(', 1000);
    strcpy(deep + 1000, "score");
    memset(deep + 1005, ')', 1000);
    deep[2005] = 0;
    bad(deep, "nested deeper than");
    /* bad tensors */
    fx_mod *m;
    float x = 0;
    fx_mod_tensor t = {.name = "kv_idx", .dtype = FX_DT_F32, .ndim = 1, .shape = {1}, .data = &x};
    FXT_STATUS(fx_mod_compile(&m, "score", &t, 1), FX_EINVAL, "reserved");
    t.name = "t", t.ndim = 5;
    FXT_STATUS(fx_mod_compile(&m, "score", &t, 1), FX_EINVAL, "ndim = 5");
    t.ndim = 1, t.dtype = FX_DT_F16;
    FXT_STATUS(fx_mod_compile(&m, "score", &t, 1), FX_EINVAL, "dtype");
    t.dtype = FX_DT_I64, t.grad = &x;
    FXT_STATUS(fx_mod_compile(&m, "score", &t, 1), FX_EINVAL, "only float32 tensors have a grad");
    /* constants fold: a constant expression needs one register */
    FXT_OK(fx_mod_compile(&m, "(3 * 4 - 2) / 5.0 + sqrt(4.0) * (1 + 1) + score", NULL, 0));
    FXT_EQ_INT(fx_mod_nregs(m), 3); /* the constant 6.0, the score, their sum */
    fx_mod_free(m);
}

/* ---- score mods against the float64 reference ------------------------------------------------ */

enum { B = 2, HQ = 4, HKV = 2, L = 70, D = 16 };

typedef struct mcase {
    const char *name, *expr;
    double (*fn)(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const struct mcase *c);
    fx_mod_tensor t[2];
    int nt;
} mcase;

static const float *T0(const mcase *c) { return c->t[0].data; }

static double f_relbias(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const mcase *c)
{
    (void)b;
    int64_t e = q - kv + 64;
    e = e < 0 ? 0 : e > 127 ? 127 : e;
    return s + T0(c)[h * 128 + e];
}
static int64_t t5_bucket(int64_t n)
{
    if (n < 16)
        return n > 0 ? n : 0;
    /* as the expression computes it: float32 log, division, multiplication, floor */
    float x = floorf(logf((float)n / 16.0f) / 2.0794415f * 16.0f);
    int64_t v = 16 + (int64_t)x;
    return v < 31 ? v : 31;
}
static double f_t5(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const mcase *c)
{
    (void)b;
    return s + T0(c)[h * 32 + t5_bucket(q - kv)];
}
static double f_alibi(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const mcase *c)
{
    (void)b;
    return s + (double)T0(c)[h] * (double)(kv - q);
}
static double f_softcap(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const mcase *c)
{
    (void)b, (void)h, (void)q, (void)kv, (void)c;
    return 2.5 * tanh(s / 2.5);
}
static double f_temp(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const mcase *c)
{
    (void)b, (void)q, (void)kv;
    return s * T0(c)[h];
}
static double f_sink(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const mcase *c)
{
    (void)b, (void)q;
    return kv == 0 ? s + T0(c)[h] : s;
}
static double f_mix(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const mcase *c)
{
    (void)q, (void)kv, (void)c;
    double sg = 1.0 / (1.0 + exp(-s));
    return s + 0.1 * sg - 0.05 * fabs(s) + 0.1 * fmax(s, 0.2) + 0.01 * pow(fabs(s) + 1.0, 1.5) +
           fmin(fmax(s, -0.5), 0.5) + 0.02 * sqrt(s * s + 1.0) + 0.03 * exp(-s * s) + 0.01 * log1p(s * s) +
           0.1 * (double)b * s / (1.0 + (double)h);
}
static double f_bscale(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const mcase *c)
{
    (void)h, (void)q, (void)kv;
    const float *w = c->t[0].data;
    return s * (double)w[b * 2 + (kv & 1)] + (double)((const float *)c->t[1].data)[b];
}

static float tab_relbias[HQ * 128], tab_t5[HQ * 32], tab_slopes[HQ], tab_temp[HQ], tab_sink[HQ], tab_w[B * 2],
    tab_off[B];
static float g_relbias[HQ * 128], g_t5[HQ * 32], g_slopes[HQ], g_temp[HQ], g_sink[HQ], g_w[B * 2], g_off[B];

#define TENS(n, arr, g, ...) {.name = n, .dtype = FX_DT_F32, .ndim = sizeof((int64_t[]){__VA_ARGS__}) / 8, .shape = {__VA_ARGS__}, .data = arr, .grad = g}

static mcase cases[] = {
    {"rel_bias", "score + bias[h, clamp(q_idx - kv_idx + 64, 0, 127)]", f_relbias,
     {TENS("bias", tab_relbias, g_relbias, HQ, 128)}, 1},
    {"t5", "score + bias[h, where(q_idx - kv_idx < 16, max(q_idx - kv_idx, 0), "
           "min(16 + int(floor(log(float(q_idx - kv_idx) / 16.0) / 2.0794415 * 16.0)), 31))]",
     f_t5, {TENS("bias", tab_t5, g_t5, HQ, 32)}, 1},
    {"alibi", "score + slopes[h] * (kv_idx - q_idx)", f_alibi, {TENS("slopes", tab_slopes, g_slopes, HQ)}, 1},
    {"softcap", "2.5 * tanh(score / 2.5)", f_softcap, {{0}}, 0},
    {"temperature", "score * temp[h]", f_temp, {TENS("temp", tab_temp, g_temp, HQ)}, 1},
    {"sink", "where(kv_idx == 0, score + sink[h], score)", f_sink, {TENS("sink", tab_sink, g_sink, HQ)}, 1},
    {"mix", "score + 0.1 * sigmoid(score) - 0.05 * abs(score) + 0.1 * max(score, 0.2) + "
            "0.01 * pow(abs(score) + 1, 1.5) + clamp(score, -0.5, 0.5) + 0.02 * sqrt(score * score + 1) + "
            "0.03 * exp(-score * score) + 0.01 * log1p(score ** 2) + 0.1 * b * score / (1 + h)",
     f_mix, {{0}}, 0},
    {"batch", "score * w[b, kv_idx % 2] + off[b]", f_bscale,
     {TENS("w", tab_w, g_w, B, 2), TENS("off", tab_off, g_off, B)}, 2},
};

static double ref_mod_cb(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    const mcase *c = ctx;
    return c->fn(s, b, h, q, kv, c);
}
/* d mod / d s by central differences of the float64 function (the kinks have measure zero) */
static double ref_grad_cb(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    const mcase *c = ctx;
    double e = 1e-6 * fmax(1.0, fabs(s));
    return (c->fn(s + e, b, h, q, kv, c) - c->fn(s - e, b, h, q, kv, c)) / (2 * e);
}

static uint32_t rng = 12345u;
static float frand(void)
{
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
}

static void fill_tables(void)
{
    for (int i = 0; i < HQ * 128; i++)
        tab_relbias[i] = 0.5f * frand();
    for (int i = 0; i < HQ * 32; i++)
        tab_t5[i] = 0.5f * frand();
    for (int h = 0; h < HQ; h++) {
        tab_slopes[h] = 0.05f * (float)(h + 1) * (h % 2 ? -1.0f : 1.0f);
        tab_temp[h] = 0.7f + 0.2f * (float)h;
        tab_sink[h] = 0.3f * frand();
    }
    for (int i = 0; i < B * 2; i++)
        tab_w[i] = 1.0f + 0.3f * frand();
    for (int i = 0; i < B; i++)
        tab_off[i] = frand();
}

/* Gradient of the reference loss w.r.t. each element of tensor t by central differences. */
static void fd_tensor_grad(ref_attn *r, const float *q, const float *k, const float *v, const float *dout,
                           fx_mod_tensor *t, double *out)
{
    float *x = (float *)t->data;
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    for (int64_t i = 0; i < n; i++) {
        float x0 = x[i], e = 2e-4f * fmaxf(1.0f, fabsf(x0));
        x[i] = x0 + e;
        double hi = ref_loss(r, q, k, v, dout), ehi = (double)x[i] - x0;
        x[i] = x0 - e;
        double lo = ref_loss(r, q, k, v, dout), elo = (double)x0 - x[i];
        x[i] = x0;
        out[i] = (hi - lo) / (ehi + elo);
    }
}

typedef struct data {
    float *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv;
} data;

static data mkdata(void)
{
    size_t nq = (size_t)B * HQ * L * D, nk = (size_t)B * HKV * L * D;
    data d = {malloc(nq * 4), malloc(nk * 4), malloc(nk * 4), malloc(nq * 4), malloc(nq * 4),
              malloc((size_t)B * HQ * L * 4), malloc(nq * 4), malloc(nk * 4), malloc(nk * 4)};
    for (size_t i = 0; i < nq; i++)
        d.q[i] = 1.5f * frand(), d.dout[i] = frand();
    for (size_t i = 0; i < nk; i++)
        d.k[i] = 1.5f * frand(), d.v[i] = frand();
    return d;
}
static void freedata(data *d)
{
    free(d->q), free(d->k), free(d->v), free(d->dout), free(d->out), free(d->lse), free(d->dq), free(d->dk),
        free(d->dv);
}

static void test_score_mods_vs_reference(void)
{
    fill_tables();
    data d = mkdata();
    fx_block_mask *causal;
    FXT_OK(fx_block_mask_create(&causal, fx_mask_causal, NULL, 1, 1, L, L, 32, 32));
    size_t nq = (size_t)B * HQ * L * D, nk = (size_t)B * HKV * L * D;
    double *rout = malloc(nq * 8), *rlse = malloc((size_t)B * HQ * L * 8), *rdq = malloc(nq * 8),
           *rdk = malloc(nk * 8), *rdv = malloc(nk * 8), *rg = malloc(HQ * 128 * 8);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        mcase *c = &cases[ci];
        fprintf(stderr, "  case %s\n", c->name);
        for (int masked = 0; masked < 2; masked++) {
            fx_mod *m;
            FXT_OK(fx_mod_compile(&m, c->expr, c->t, c->nt));
            if (!m)
                continue;
            FXT_CHECK(!fx_mod_is_mask(m));
            fx_attention a = fx_attention_defaults(B, HQ, HKV, L, L, D);
            a.scale = 0.5f;
            a.mask = masked ? causal : NULL;
            a.score_mod = fx_mod_score, a.score_mod_grad = fx_mod_score_grad, a.score_ctx = m;
            ref_attn r = {.B = B, .Hq = HQ, .Hkv = HKV, .Lq = L, .Lkv = L, .D = D, .Dv = D, .scale = 0.5,
                          .mask = masked ? fx_mask_causal : NULL, .mod = ref_mod_cb, .mod_grad = ref_grad_cb,
                          .mod_ctx = c, .mask_B = 1, .mask_H = 1};
            FXT_OK(fx_flex_attention(&a, d.q, d.k, d.v, d.out, d.lse));
            ref_forward(&r, d.q, d.k, d.v, rout, rlse);
            fxt_close_f32("out", d.out, rout, nq, 2e-5, 2e-4);
            fxt_close_f32("lse", d.lse, rlse, (size_t)B * HQ * L, 2e-5, 2e-5);
            for (int i = 0; i < c->nt; i++)
                memset(c->t[i].grad, 0, sizeof(float) * (size_t)(c->t[i].shape[0] * (c->t[i].ndim > 1 ? c->t[i].shape[1] : 1)));
            FXT_OK(fx_flex_attention_backward(&a, d.q, d.k, d.v, d.out, d.lse, d.dout, d.dq, d.dk, d.dv));
            ref_backward(&r, d.q, d.k, d.v, d.dout, rdq, rdk, rdv, NULL);
            fxt_close_f32("dq", d.dq, rdq, nq, 1e-4, 1e-3);
            fxt_close_f32("dk", d.dk, rdk, nk, 1e-4, 1e-3);
            fxt_close_f32("dv", d.dv, rdv, nk, 1e-4, 1e-3);
            for (int i = 0; i < c->nt; i++) {
                int64_t n = c->t[i].shape[0] * (c->t[i].ndim > 1 ? c->t[i].shape[1] : 1);
                fd_tensor_grad(&r, d.q, d.k, d.v, d.dout, &c->t[i], rg);
                char what[64];
                snprintf(what, sizeof what, "d %s (%s)", c->t[i].name, masked ? "causal" : "no mask");
                fxt_close_f32(what, c->t[i].grad, rg, (size_t)n, 2e-4, 2e-3);
            }
            fx_mod_free(m);
        }
    }
    fx_block_mask_free(causal);
    free(rout), free(rlse), free(rdq), free(rdk), free(rdv), free(rg);
    freedata(&d);
}

/* The captured tensors' gradients (and dq, dk, dv) are bitwise the same at 1, 2 and 3 threads. */
static void test_determinism(void)
{
    fill_tables();
    data d = mkdata();
    size_t nq = (size_t)B * HQ * L * D;
    fx_mod *m;
    fx_mod_tensor t[2] = {TENS("bias", tab_relbias, g_relbias, HQ, 128), TENS("temp", tab_temp, g_temp, HQ)};
    FXT_OK(fx_mod_compile(&m, "score * temp[h] + bias[h, clamp(q_idx - kv_idx + 64, 0, 127)]", t, 2));
    fx_attention a = fx_attention_defaults(B, HQ, HKV, L, L, D);
    a.score_mod = fx_mod_score, a.score_mod_grad = fx_mod_score_grad, a.score_ctx = m;
    FXT_OK(fx_flex_attention(&a, d.q, d.k, d.v, d.out, d.lse));
    int saved = fx_get_num_threads();
    static float first_bias[HQ * 128], first_temp[HQ];
    float *first_dq = malloc(nq * 4);
    static const int threads[] = {1, 2, 3, 2};
    for (int run = 0; run < 4; run++) {
        fx_set_num_threads(threads[run]);
        memset(g_relbias, 0, sizeof g_relbias);
        memset(g_temp, 0, sizeof g_temp);
        FXT_OK(fx_flex_attention_backward(&a, d.q, d.k, d.v, d.out, d.lse, d.dout, d.dq, d.dk, d.dv));
        if (run == 0) {
            memcpy(first_bias, g_relbias, sizeof g_relbias);
            memcpy(first_temp, g_temp, sizeof g_temp);
            memcpy(first_dq, d.dq, nq * 4);
        } else {
            fxt_bitwise_f32("d bias", g_relbias, first_bias, HQ * 128);
            fxt_bitwise_f32("d temp", g_temp, first_temp, HQ);
            fxt_bitwise_f32("dq", d.dq, first_dq, nq);
        }
    }
    /* the backward ADDS into grad */
    FXT_OK(fx_flex_attention_backward(&a, d.q, d.k, d.v, d.out, d.lse, d.dout, d.dq, d.dk, d.dv));
    FXT_NEAR(g_temp[1], 2.0 * first_temp[1], 1e-6, 1e-6);
    fx_set_num_threads(saved);
    free(first_dq);
    fx_mod_free(m);
    freedata(&d);
}

/* a and b agree to rtol (relative to the larger magnitude) + atol. */
static void near_f32(const char *what, const float *a, const float *b, size_t n, double atol, double rtol)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)a[i] - b[i]) <= atol + rtol * fmax(fabs(a[i]), fabs(b[i])))) {
            FXT_FAIL("%s: [%zu] of %zu: %.9g vs %.9g", what, i, n, (double)a[i], (double)b[i]);
            return;
        }
}

/* Hand-written twins of the built-ins. rel_bias gives the built-in's bits, forward and backward
   (its table gradient included): both run the same float operations. softcap and ALiBi are
   near-equal (a few float32 ulps): the built-ins run fused into the forward kernel (its own
   vectorised tanh, the bias added in another order), the expressions as a score_mod call. */
static void test_builtin_twins(void)
{
    fill_tables();
    data d = mkdata(), e = mkdata();
    memcpy(e.q, d.q, (size_t)B * HQ * L * D * 4);
    memcpy(e.k, d.k, (size_t)B * HKV * L * D * 4);
    memcpy(e.v, d.v, (size_t)B * HKV * L * D * 4);
    memcpy(e.dout, d.dout, (size_t)B * HQ * L * D * 4);
    size_t nq = (size_t)B * HQ * L * D, nk = (size_t)B * HKV * L * D;
    fx_block_mask *causal;
    FXT_OK(fx_block_mask_create(&causal, fx_mask_causal, NULL, 1, 1, L, L, 32, 32));
    static float g_builtin[HQ * 128];
    fx_score_softcap_ctx sc = {.cap = 30.0f};
    fx_score_alibi_ctx al = {.slopes = tab_slopes};
    fx_score_rel_bias_ctx rb = {.table = tab_relbias, .grad_table = g_builtin, .size = 128, .zero = 64, .heads = HQ};
    struct {
        const char *expr;
        fx_score_fn fn;
        fx_score_grad_fn grad;
        const void *ctx;
    } tw[] = {
        {"30 * tanh(score / 30)", fx_score_softcap, fx_score_softcap_grad, &sc},
        {"score + slopes[h] * (kv_idx - q_idx)", fx_score_alibi, fx_score_alibi_grad, &al},
        {"score + bias[h, clamp(q_idx - kv_idx + 64, 0, 127)]", fx_score_rel_bias, fx_score_rel_bias_grad, &rb},
    };
    fx_mod_tensor t[2] = {TENS("slopes", tab_slopes, NULL, HQ), TENS("bias", tab_relbias, g_relbias, HQ, 128)};
    for (int i = 0; i < 3; i++) {
        fx_mod *m;
        FXT_OK(fx_mod_compile(&m, tw[i].expr, t, 2));
        fx_attention a = fx_attention_defaults(B, HQ, HKV, L, L, D), x;
        a.scale = 2.0f; /* large scores: the softcap bends */
        a.mask = causal;
        x = a;
        a.score_mod = fx_mod_score, a.score_mod_grad = fx_mod_score_grad, a.score_ctx = m;
        x.score_mod = tw[i].fn, x.score_mod_grad = tw[i].grad, x.score_ctx = tw[i].ctx;
        FXT_OK(fx_flex_attention(&a, d.q, d.k, d.v, d.out, d.lse));
        FXT_OK(fx_flex_attention(&x, e.q, e.k, e.v, e.out, e.lse));
        if (i == 2)
            fxt_bitwise_f32(tw[i].expr, d.out, e.out, nq);
        else
            near_f32(tw[i].expr, d.out, e.out, nq, 1e-5, 1e-4);
        memset(g_relbias, 0, sizeof g_relbias);
        memset(g_builtin, 0, sizeof g_builtin);
        FXT_OK(fx_flex_attention_backward(&a, d.q, d.k, d.v, d.out, d.lse, d.dout, d.dq, d.dk, d.dv));
        FXT_OK(fx_flex_attention_backward(&x, e.q, e.k, e.v, e.out, e.lse, e.dout, e.dq, e.dk, e.dv));
        if (i == 2) {
            fxt_bitwise_f32("dq", d.dq, e.dq, nq);
            fxt_bitwise_f32("dk", d.dk, e.dk, nk);
            fxt_bitwise_f32("dv", d.dv, e.dv, nk);
            fxt_bitwise_f32("d table", g_relbias, g_builtin, HQ * 128);
        } else {
            near_f32("dq", d.dq, e.dq, nq, 1e-5, 1e-4);
            near_f32("dk", d.dk, e.dk, nk, 1e-5, 1e-4);
            near_f32("dv", d.dv, e.dv, nk, 1e-5, 1e-4);
        }
        fx_mod_free(m);
    }
    fx_block_mask_free(causal);
    freedata(&d), freedata(&e);
}

/* Decoding: one query row at q_offset, as a KV cache step does. */
static void test_decode(void)
{
    fill_tables();
    data d = mkdata();
    fx_mod *m;
    fx_mod_tensor t = TENS("slopes", tab_slopes, NULL, HQ);
    FXT_OK(fx_mod_compile(&m, "score + slopes[h] * (kv_idx - q_idx)", &t, 1));
    fx_score_alibi_ctx al = {.slopes = tab_slopes};
    fx_block_mask *causal;
    FXT_OK(fx_block_mask_create(&causal, fx_mask_causal, NULL, 1, 1, L, L, 32, 32));
    fx_attention a = fx_attention_defaults(B, HQ, HKV, 1, L, D);
    a.q_offset = 40, a.mask = causal;
    fx_attention x = a;
    a.score_mod = fx_mod_score, a.score_mod_grad = fx_mod_score_grad, a.score_ctx = m;
    x.score_mod = fx_score_alibi, x.score_mod_grad = fx_score_alibi_grad, x.score_ctx = &al;
    static float o1[B * HQ * D], o2[B * HQ * D];
    FXT_OK(fx_flex_attention(&a, d.q, d.k, d.v, o1, NULL));
    FXT_OK(fx_flex_attention(&x, d.q, d.k, d.v, o2, NULL));
    near_f32("decode out", o1, o2, B * HQ * D, 1e-6, 1e-5);
    fx_block_mask_free(causal);
    fx_mod_free(m);
    freedata(&d);
}

/* ---- mask expressions ------------------------------------------------------------------------ */

static int64_t doc_ids[B * L];
static int64_t prefix[B] = {13, 40};

static bool m_prefix(int64_t b, int64_t h, int64_t q, int64_t kv, const void *c)
{
    (void)h, (void)c;
    return kv < prefix[b] || kv <= q;
}
static bool m_window(int64_t b, int64_t h, int64_t q, int64_t kv, const void *c)
{
    (void)b, (void)h, (void)c;
    return kv <= q && q - kv < 20;
}
static bool m_doc(int64_t b, int64_t h, int64_t q, int64_t kv, const void *c)
{
    (void)h, (void)c;
    return doc_ids[b * L + q] == doc_ids[b * L + kv] && kv <= q;
}
static bool m_dilated(int64_t b, int64_t h, int64_t q, int64_t kv, const void *c)
{
    (void)b, (void)h, (void)c;
    return (q - kv) % 2 == 0 && kv <= q;
}
static bool m_batch_head(int64_t b, int64_t h, int64_t q, int64_t kv, const void *c)
{
    (void)c;
    return b == 0 ? kv <= q : (h % 2 == 0 ? kv >= q - 5 : q >= 50);
}

static void test_masks(void)
{
    for (int b = 0; b < B; b++)
        for (int i = 0; i < L; i++)
            doc_ids[b * L + i] = b == 0 ? i / 23 : (i < 5 ? 0 : i < 47 ? 1 : 2);
    fx_mod_tensor t[2] = {{.name = "doc", .dtype = FX_DT_I64, .ndim = 2, .shape = {B, L}, .data = doc_ids},
                          {.name = "prefix", .dtype = FX_DT_I64, .ndim = 1, .shape = {B}, .data = prefix}};
    struct {
        const char *expr;
        fx_mask_fn fn;
        int64_t mb, mh;
    } mk[] = {
        {"kv_idx < prefix[b] || kv_idx <= q_idx", m_prefix, B, 1},
        {"kv_idx <= q_idx && q_idx - kv_idx < 20", m_window, 1, 1},
        {"doc[b, q_idx] == doc[b, kv_idx] && kv_idx <= q_idx", m_doc, B, 1},
        {"(q_idx - kv_idx) % 2 == 0 && kv_idx <= q_idx", m_dilated, 1, 1},
        {"where(b == 0, kv_idx <= q_idx, where(h % 2 == 0, kv_idx >= q_idx - 5, q_idx >= 50))", m_batch_head, B, HQ},
    };
    data d = mkdata(), e = mkdata();
    size_t nq = (size_t)B * HQ * L * D;
    for (size_t i = 0; i < sizeof mk / sizeof mk[0]; i++) {
        fx_mod *m;
        FXT_OK(fx_mod_compile(&m, mk[i].expr, t, 2));
        if (!m)
            continue;
        FXT_CHECK(fx_mod_is_mask(m));
        int bad_points = 0;
        for (int64_t b = 0; b < mk[i].mb; b++)
            for (int64_t h = 0; h < mk[i].mh; h++)
                for (int64_t q = 0; q < L; q++)
                    for (int64_t kv = 0; kv < L; kv++)
                        bad_points += fx_mod_mask(b, h, q, kv, m) != mk[i].fn(b, h, q, kv, NULL);
        if (bad_points)
            FXT_FAIL("%s: %d points differ from the hand-written mask", mk[i].expr, bad_points);
        for (int bs = 8; bs <= 16; bs += 8) {
            fx_block_mask *bm1, *bm2;
            FXT_OK(fx_block_mask_create_mod(&bm1, m, mk[i].mb, mk[i].mh, L, L, bs, bs));
            FXT_OK(fx_block_mask_create(&bm2, mk[i].fn, NULL, mk[i].mb, mk[i].mh, L, L, bs, bs));
            FXT_NEAR(fx_block_mask_density(bm1), fx_block_mask_density(bm2), 0, 0);
            FXT_EQ_INT((long long)fx_block_mask_bytes(bm1), (long long)fx_block_mask_bytes(bm2));
            fx_attention a = fx_attention_defaults(B, HQ, HKV, L, L, D), x;
            a.mask = bm1, x = a, x.mask = bm2;
            FXT_OK(fx_flex_attention(&a, d.q, d.k, d.v, d.out, d.lse));
            FXT_OK(fx_flex_attention(&x, d.q, d.k, d.v, e.out, e.lse));
            fxt_bitwise_f32(mk[i].expr, d.out, e.out, nq);
            fx_block_mask_free(bm1);
            fx_block_mask_free(bm2);
        }
        fx_mod_free(m);
    }
    /* a score mod is not a mask */
    fx_mod *s;
    FXT_OK(fx_mod_compile(&s, "score + 1", NULL, 0));
    fx_block_mask *bm;
    FXT_STATUS(fx_block_mask_create_mod(&bm, s, 1, 1, L, L, 16, 16), FX_EINVAL, "score mod");
    fx_mod_free(s);
    freedata(&d), freedata(&e);
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    FXT_RUN(test_semantics);
    FXT_RUN(test_tile_matches_points);
    FXT_RUN(test_paths_agree);
    FXT_RUN(test_functions);
    FXT_RUN(test_many_hoisted);
    FXT_RUN(test_compile_errors);
    FXT_RUN(test_score_mods_vs_reference);
    FXT_RUN(test_determinism);
    FXT_RUN(test_builtin_twins);
    FXT_RUN(test_decode);
    FXT_RUN(test_masks);
    return fxt_finish();
}
