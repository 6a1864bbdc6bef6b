/* The expression mods' evaluator (mod.c), shared by its scalar path and its vector twins
   (mod_avx2.c, mod_avx512.c): the instructions, the register file, and every operation's
   semantics over a run of n positions. Each ISA file includes this header once with MOD_FN
   defined to name its copy of the loops; the vector files also define MOD_VEC_OP (mod_simd.h:
   exp, tanh, sigmoid and the affine index forms by hand), which give the loops' bits lane for
   lane.

   Bitwise agreement between the paths: integer operations are exact; float ones are single
   IEEE operations (add, sub, mul, div, sqrt, floor, min / max written as comparisons), each
   rounded on its own (these files are built with -ffp-contract=off); exp, tanh and sigmoid
   are this file's own, with the same sequence of fmaf / multiply / select in the scalar and
   the vector forms; log, log1p, pow and float % are libm's, called per element on every
   path. */
#ifndef FLEXC_ATTENTION_MOD_EVAL_H
#define FLEXC_ATTENTION_MOD_EVAL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "flexc.h" /* FX_DT_* */

enum {
    FX__MOD_CH = 128,     /* positions of a row evaluated per instruction */
    FX__MOD_REGS = 64,    /* registers of a program */
    FX__MOD_MAX_OUT = 66, /* outputs of a program */
    FX__MOD_OUT = -2      /* a destination: the caller's output row (fx__mod_env.o) */
};

enum {
    O_SCORE, O_B, O_H, O_Q, O_KV, O_ICONST, O_FCONST, O_READ, O_IDX,
    O_ADD, O_SUB, O_MUL, O_DIV, O_FLOORDIV, O_MOD, O_NEG, O_ABS, O_MIN, O_MAX, O_CLAMP,
    O_EXP, O_LOG, O_LOG1P, O_SQRT, O_TANH, O_SIGMOID, O_POW, O_FLOOR,
    O_LT, O_LE, O_GT, O_GE, O_EQ, O_NE, O_WHERE, O_AND, O_OR, O_NOT, O_TOF, O_TOI,
    O_GATHER, /* instructions only: dst = tensor t at the flat index in a */
    O_SPLAT,  /* instructions only: lanes 1 .. n-1 of dst = its lane 0 (a hoisted value) */
    /* Index arithmetic affine in kv_idx (mod.c, affine()), with hoisted operands read at lane 0:
       O_AFF: a + i * kv_idx (wrapping, as the integer operations it replaces);
       O_IDX_AFF: d + clamp(clamp(a + i * kv_idx, b, c), 0, shape[dim] - 1) * stride[dim], the
       flat index of a read whose indices other than dim are hoisted (their part is d);
       O_GATHER_AFF: tensor t at that index. */
    O_AFF, O_IDX_AFF, O_GATHER_AFF,
    O_FAFF /* float(a + i * kv_idx) */
};

typedef struct fx__mod_ins {
    uint8_t op, fl; /* fl: the operands are float */
    uint8_t dim;    /* O_IDX_AFF, O_GATHER_AFF */
    int16_t dst, a, b, c, d;
    int t;
    int64_t i;
    float f;
} fx__mod_ins;

typedef union fx__mod_slot {
    float f[FX__MOD_CH];
    int64_t i[FX__MOD_CH];
} fx__mod_slot;

typedef struct fx__mod_tensor {
    char name[64];
    int dtype, ndim;
    int64_t shape[4], stride[4], numel;
    const void *data;
    float *grad;
    int64_t goff; /* offset of its gradient in a partial buffer */
} fx__mod_tensor;

typedef struct fx__mod_env {
    const float *s;
    float *o; /* where an instruction with dst FX__MOD_OUT writes */
    int64_t b, h, q, kv0;
    const fx__mod_tensor *t;
} fx__mod_env;

/* A register program in three parts: code[0, pre) once per call and code[pre_end, row) once
   per row, each over one position (what depends on neither the score nor kv_idx, then what
   depends on q_idx but not on them), their values then copied to every lane where a later
   part reads them (O_SPLAT, in code[pre, pre_end) and code[row, row_end)); code[row_end, n)
   over the positions of a row. */
typedef struct fx__mod_prog {
    fx__mod_ins *code;
    int n, nregs, nout;
    bool direct; /* the last instruction writes output 0 straight into the row (dst FX__MOD_OUT) */
    int pre, pre_end, row, row_end;
    int out[FX__MOD_MAX_OUT];
} fx__mod_prog;

/* The paths' table (docs/dispatch.md). run: instructions code[0 .. n_ins) over n <= CH
   positions; score / score_grad: fx_mod_score / fx_mod_score_grad's tile loops over program p
   (its first output), t the mod's tensors. */
typedef struct fx__mod_kernels {
    const char *name;
    void (*run)(const fx__mod_ins *code, int n_ins, fx__mod_slot *R, int64_t n, const fx__mod_env *e);
    void (*score)(const fx__mod_prog *p, const fx__mod_tensor *t, float *s, int64_t ld, int64_t nq, int64_t nkv,
                  int64_t b, int64_t h, int64_t q0, int64_t kv0);
    void (*score_grad)(const fx__mod_prog *p, const fx__mod_tensor *t, const float *s, float *g, int64_t ld,
                       int64_t nq, int64_t nkv, int64_t b, int64_t h, int64_t q0, int64_t kv0);
} fx__mod_kernels;

extern const fx__mod_kernels fx__mod_kernels_scalar;
extern const fx__mod_kernels fx__mod_kernels_avx2;
extern const fx__mod_kernels fx__mod_kernels_avx512;

/* ---- the scalar semantics ------------------------------------------------------------------ */

static inline int64_t fx__mod_wrap_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static inline int64_t fx__mod_wrap_sub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
static inline int64_t fx__mod_wrap_mul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }
static inline int64_t fx__mod_floordiv(int64_t a, int64_t b)
{
    if (b == 0)
        return 0;
    if (b == -1)
        return fx__mod_wrap_sub(0, a);
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t fx__mod_imod(int64_t a, int64_t b)
{
    if (b == 0 || b == -1)
        return 0;
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline float fx__mod_fmodpy(float a, float b)
{
    float r = fmodf(a, b);
    return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
}
static inline int64_t fx__mod_f2i(float x)
{
    if (x != x)
        return 0;
    if (x >= 9.2233720368547758e18f)
        return INT64_MAX;
    if (x <= -9.2233720368547758e18f)
        return INT64_MIN;
    return (int64_t)x;
}
static inline float fx__mod_fmax(float a, float b) { return (a != a || b != b) ? NAN : a > b ? a : b; }
static inline float fx__mod_fmin(float a, float b) { return (a != a || b != b) ? NAN : a < b ? a : b; }

static inline uint32_t fx__mod_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static inline float fx__mod_float(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* Constants of exp: ln 2 in two parts (n * hi exact for |n| < 2^11) and the clamps. */
#define FX__MOD_LOG2E 1.44269504088896341f
#define FX__MOD_LN2HI 0.693145751953125f
#define FX__MOD_LN2LO 1.428606765330187045e-06f
#define FX__MOD_EXP_LO -104.0f /* e^x rounds to 0 below */
#define FX__MOD_EXP_HI 89.0f   /* e^x overflows above */

/* e^x on all floats: 2^n e^r with n = round(x log2 e), r = x - n ln2 (|r| <= ln2 / 2, Cody and
   Waite with fmaf) and a degree-7 Taylor polynomial (relative error < 1e-8 before rounding);
   2^n applied as two exact halves so that subnormal results round once. Below -104: 0; above
   89: +inf; NaN stays NaN. Every step is one the vector twins take, in the same order. */
static inline float fx__mod_exp(float x)
{
    float xc = FX__MOD_EXP_LO > x ? FX__MOD_EXP_LO : x; /* max(lo, x): x when NaN, as maxps */
    xc = FX__MOD_EXP_HI < xc ? FX__MOD_EXP_HI : xc;     /* min(hi, xc) */
    float n = rintf(xc * FX__MOD_LOG2E);
    float r = fmaf(n, -FX__MOD_LN2HI, xc);
    r = fmaf(n, -FX__MOD_LN2LO, r);
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int32_t k = n == n ? (int32_t)n : 0, k1 = k >> 1, k2 = k - k1; /* k in [-150, 129] */
    p = p * fx__mod_float((uint32_t)(k1 + 127) << 23);
    p = p * fx__mod_float((uint32_t)(k2 + 127) << 23);
    p = x < FX__MOD_EXP_LO ? 0.0f : p;
    return x != x ? x : p;
}

/* tanh(x): an odd series near 0 (where 1 - e^-2|x| would cancel), (1 - t) / (1 + t) with
   t = e^-2|x| elsewhere, the sign put back (as the built-in softcap's vtanh, simd_math.h). */
static inline float fx__mod_tanh(float x)
{
    float ax = fx__mod_float(fx__mod_bits(x) & 0x7fffffffu);
    float t = fx__mod_exp(ax * -2.0f);
    float big = (1.0f - t) / (1.0f + t);
    float x2 = ax * ax;
    float p = -17.0f / 315.0f;
    p = fmaf(p, x2, 2.0f / 15.0f);
    p = fmaf(p, x2, -1.0f / 3.0f);
    p = fmaf(p, x2, 1.0f);
    float small = p * ax;
    float y = ax < 0.0625f ? small : big;
    return fx__mod_float(fx__mod_bits(y) | (fx__mod_bits(x) & 0x80000000u));
}

static inline float fx__mod_sigmoid(float x) { return 1.0f / (1.0f + fx__mod_exp(-x)); }

#endif /* FLEXC_ATTENTION_MOD_EVAL_H */

/* ---- the loops, once per including file ------------------------------------------------------ */
#ifdef MOD_FN

/* Row loops: vectorised by the compiler for the file's ISA (GCC's -O2 keeps them scalar). */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3")))
#endif
static void MOD_FN(run_op)(const fx__mod_ins *I, fx__mod_slot *R, int64_t n, const fx__mod_env *e)
{
    float *restrict df = I->dst == FX__MOD_OUT ? e->o : R[I->dst].f;
    int64_t *restrict di = I->dst == FX__MOD_OUT ? NULL : R[I->dst].i; /* FX__MOD_OUT: a float result */
    const fx__mod_slot *A = &R[I->a < 0 ? 0 : I->a], *B = &R[I->b < 0 ? 0 : I->b], *C = &R[I->c < 0 ? 0 : I->c];
    const float *af = A->f, *bf = B->f, *cf = C->f;
    const int64_t *ai = A->i, *bi = B->i, *ci = C->i;
    const bool fl = I->fl;
#ifdef MOD_VEC_OP
    if (MOD_VEC_OP(I, R, n, e))
        return;
#endif
#define L(x)                                                                                                           \
    do {                                                                                                               \
        for (int64_t j = 0; j < n; j++) {                                                                              \
            x;                                                                                                         \
        }                                                                                                              \
    } while (0)
    switch (I->op) {
    case O_SCORE: L(df[j] = e->s[j]); break;
    case O_B: L(di[j] = e->b); break;
    case O_H: L(di[j] = e->h); break;
    case O_Q: L(di[j] = e->q); break;
    case O_KV: L(di[j] = fx__mod_wrap_add(e->kv0, j)); break;
    case O_ICONST: L(di[j] = I->i); break;
    case O_FCONST: L(df[j] = I->f); break;
    case O_SPLAT:
        if (fl) {
            const float v = df[0];
            L(df[j] = v);
        } else {
            const int64_t v = di[0];
            L(di[j] = v);
        }
        break;
    case O_AFF: {
        const int64_t c = I->i, u0 = fx__mod_wrap_add(ai[0], fx__mod_wrap_mul(c, e->kv0));
        L(di[j] = fx__mod_wrap_add(u0, fx__mod_wrap_mul(c, j)));
        break;
    }
    case O_FAFF: {
        const int64_t c = I->i, u0 = fx__mod_wrap_add(ai[0], fx__mod_wrap_mul(c, e->kv0));
        L(df[j] = (float)fx__mod_wrap_add(u0, fx__mod_wrap_mul(c, j)));
        break;
    }
    case O_IDX_AFF:
    case O_GATHER_AFF: {
        const fx__mod_tensor *t = &e->t[I->t];
        const int64_t c = I->i, u0 = fx__mod_wrap_add(ai[0], fx__mod_wrap_mul(c, e->kv0)), lo = bi[0], hi = ci[0];
        const int64_t off = R[I->d].i[0], top = t->shape[I->dim] - 1, st = t->stride[I->dim];
#define AFF_INDEX(j)                                                                                                   \
    int64_t v = fx__mod_wrap_add(u0, fx__mod_wrap_mul(c, j));                                                          \
    v = v > lo ? v : lo;                                                                                               \
    v = v < hi ? v : hi;                                                                                               \
    v = v < 0 ? 0 : v > top ? top : v;                                                                                 \
    const int64_t x = off + v * st
        if (I->op == O_IDX_AFF) {
            L(AFF_INDEX(j); di[j] = x);
            break;
        }
        switch (t->dtype) {
        case FX_DT_F32: { const float *p = t->data; L(AFF_INDEX(j); df[j] = p[x]); break; }
        case FX_DT_I64: { const int64_t *p = t->data; L(AFF_INDEX(j); di[j] = p[x]); break; }
        case FX_DT_I32: { const int32_t *p = t->data; L(AFF_INDEX(j); di[j] = p[x]); break; }
        default: { const uint8_t *p = t->data; L(AFF_INDEX(j); di[j] = p[x] != 0); break; }
        }
#undef AFF_INDEX
        break;
    }
    case O_IDX: {
        const fx__mod_tensor *t = &e->t[I->t];
        const int16_t r[4] = {I->a, I->b, I->c, I->d};
        L(di[j] = 0);
        for (int d = 0; d < t->ndim; d++) {
            const int64_t *x = R[r[d]].i, hi = t->shape[d] - 1, st = t->stride[d];
            L(int64_t v = x[j]; v = v < 0 ? 0 : v > hi ? hi : v; di[j] += v * st);
        }
        break;
    }
    case O_GATHER: {
        const fx__mod_tensor *t = &e->t[I->t];
        switch (t->dtype) {
        case FX_DT_F32: { const float *p = t->data; L(df[j] = p[ai[j]]); break; }
        case FX_DT_I64: { const int64_t *p = t->data; L(di[j] = p[ai[j]]); break; }
        case FX_DT_I32: { const int32_t *p = t->data; L(di[j] = p[ai[j]]); break; }
        default: { const uint8_t *p = t->data; L(di[j] = p[ai[j]] != 0); break; }
        }
        break;
    }
    case O_ADD: if (fl) L(df[j] = af[j] + bf[j]); else L(di[j] = fx__mod_wrap_add(ai[j], bi[j])); break;
    case O_SUB: if (fl) L(df[j] = af[j] - bf[j]); else L(di[j] = fx__mod_wrap_sub(ai[j], bi[j])); break;
    case O_MUL: if (fl) L(df[j] = af[j] * bf[j]); else L(di[j] = fx__mod_wrap_mul(ai[j], bi[j])); break;
    case O_DIV: L(df[j] = af[j] / bf[j]); break;
    case O_FLOORDIV:
        if (fl)
            L(df[j] = floorf(af[j] / bf[j]));
        else
            L(di[j] = fx__mod_floordiv(ai[j], bi[j]));
        break;
    case O_MOD: if (fl) L(df[j] = fx__mod_fmodpy(af[j], bf[j])); else L(di[j] = fx__mod_imod(ai[j], bi[j])); break;
    case O_NEG: if (fl) L(df[j] = -af[j]); else L(di[j] = fx__mod_wrap_sub(0, ai[j])); break;
    case O_ABS:
        if (fl)
            L(df[j] = fabsf(af[j]));
        else
            L(di[j] = ai[j] < 0 ? fx__mod_wrap_sub(0, ai[j]) : ai[j]);
        break;
    case O_MIN: if (fl) L(df[j] = fx__mod_fmin(af[j], bf[j])); else L(di[j] = ai[j] < bi[j] ? ai[j] : bi[j]); break;
    case O_MAX: if (fl) L(df[j] = fx__mod_fmax(af[j], bf[j])); else L(di[j] = ai[j] > bi[j] ? ai[j] : bi[j]); break;
    case O_CLAMP: /* torch.clamp: min(max(x, lo), hi) */
        if (fl)
            L(df[j] = fx__mod_fmin(fx__mod_fmax(af[j], bf[j]), cf[j]));
        else
            L(int64_t v = ai[j] > bi[j] ? ai[j] : bi[j]; di[j] = v < ci[j] ? v : ci[j]);
        break;
    case O_EXP: L(df[j] = fx__mod_exp(af[j])); break;
    case O_LOG: L(df[j] = logf(af[j])); break;
    case O_LOG1P: L(df[j] = log1pf(af[j])); break;
    case O_SQRT: L(df[j] = sqrtf(af[j])); break;
    case O_TANH: L(df[j] = fx__mod_tanh(af[j])); break;
    case O_SIGMOID: L(df[j] = fx__mod_sigmoid(af[j])); break;
    case O_POW: L(df[j] = powf(af[j], bf[j])); break;
    case O_FLOOR: if (fl) L(df[j] = floorf(af[j])); else L(di[j] = ai[j]); break;
    case O_LT: if (fl) L(di[j] = af[j] < bf[j]); else L(di[j] = ai[j] < bi[j]); break;
    case O_LE: if (fl) L(di[j] = af[j] <= bf[j]); else L(di[j] = ai[j] <= bi[j]); break;
    case O_GT: if (fl) L(di[j] = af[j] > bf[j]); else L(di[j] = ai[j] > bi[j]); break;
    case O_GE: if (fl) L(di[j] = af[j] >= bf[j]); else L(di[j] = ai[j] >= bi[j]); break;
    case O_EQ: if (fl) L(di[j] = af[j] == bf[j]); else L(di[j] = ai[j] == bi[j]); break;
    case O_NE: if (fl) L(di[j] = af[j] != bf[j]); else L(di[j] = ai[j] != bi[j]); break;
    case O_WHERE: if (fl) L(df[j] = ai[j] ? bf[j] : cf[j]); else L(di[j] = ai[j] ? bi[j] : ci[j]); break;
    case O_AND: L(di[j] = ai[j] & bi[j]); break;
    case O_OR: L(di[j] = ai[j] | bi[j]); break;
    case O_NOT: L(di[j] = !ai[j]); break;
    case O_TOF: L(df[j] = (float)ai[j]); break;
    case O_TOI: L(di[j] = fx__mod_f2i(af[j])); break;
    default: break;
    }
#undef L
}

static void MOD_FN(run)(const fx__mod_ins *code, int n_ins, fx__mod_slot *R, int64_t n, const fx__mod_env *e)
{
    for (int i = 0; i < n_ins; i++)
        MOD_FN(run_op)(&code[i], R, n, e);
}

static void MOD_FN(begin)(const fx__mod_prog *p, fx__mod_slot *R, const fx__mod_env *e)
{
    MOD_FN(run)(p->code, p->pre, R, 1, e);
    MOD_FN(run)(p->code + p->pre, p->pre_end - p->pre, R, FX__MOD_CH, e);
}

static void MOD_FN(row)(const fx__mod_prog *p, fx__mod_slot *R, const fx__mod_env *e)
{
    MOD_FN(run)(p->code + p->pre_end, p->row - p->pre_end, R, 1, e);
    MOD_FN(run)(p->code + p->row, p->row_end - p->row, R, FX__MOD_CH, e);
}

static void MOD_FN(score)(const fx__mod_prog *p, const fx__mod_tensor *t, float *s, int64_t ld, int64_t nq,
                          int64_t nkv, int64_t b, int64_t h, int64_t q0, int64_t kv0)
{
    fx__mod_slot R[FX__MOD_REGS];
    fx__mod_env e = {.s = NULL, .o = NULL, .b = b, .h = h, .q = q0, .kv0 = kv0, .t = t};
    MOD_FN(begin)(p, R, &e);
    const float *o = R[p->out[0]].f;
    for (int64_t i = 0; i < nq; i++) {
        e.q = q0 + i;
        MOD_FN(row)(p, R, &e);
        for (int64_t j0 = 0; j0 < nkv; j0 += FX__MOD_CH) {
            const int64_t n = nkv - j0 < FX__MOD_CH ? nkv - j0 : FX__MOD_CH;
            float *row = s + i * ld + j0;
            e.s = row, e.o = row, e.kv0 = kv0 + j0;
            MOD_FN(run)(p->code + p->row_end, p->n - p->row_end, R, n, &e);
            if (!p->direct)
                memcpy(row, o, (size_t)n * sizeof(float));
        }
    }
}

#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3")))
#endif
static void MOD_FN(score_grad)(const fx__mod_prog *p, const fx__mod_tensor *t, const float *s, float *g, int64_t ld,
                               int64_t nq, int64_t nkv, int64_t b, int64_t h, int64_t q0, int64_t kv0)
{
    fx__mod_slot R[FX__MOD_REGS];
    fx__mod_env e = {.s = NULL, .o = NULL, .b = b, .h = h, .q = q0, .kv0 = kv0, .t = t};
    MOD_FN(begin)(p, R, &e);
    const float *d = R[p->out[0]].f;
    for (int64_t i = 0; i < nq; i++) {
        e.q = q0 + i;
        MOD_FN(row)(p, R, &e);
        for (int64_t j0 = 0; j0 < nkv; j0 += FX__MOD_CH) {
            const int64_t n = nkv - j0 < FX__MOD_CH ? nkv - j0 : FX__MOD_CH;
            float *restrict gr = g + i * ld + j0;
            e.s = s + i * ld + j0, e.kv0 = kv0 + j0;
            MOD_FN(run)(p->code + p->row_end, p->n - p->row_end, R, n, &e);
            /* a zero gradient (a masked position) stays exactly 0, whatever the derivative there */
            for (int64_t j = 0; j < n; j++)
                gr[j] = gr[j] != 0.0f ? gr[j] * d[j] : 0.0f;
        }
    }
}

#endif /* MOD_FN */
