/* The vector forward, written once over the SIMD layer (simd_avx2.h / simd_avx512.h, see
   simd_math.h for its operations) and included by forward_avx2.c and forward_avx512.c, which
   also define NC: the microkernel tile is MRMAX (6) query rows x NC vectors of keys (or of Dv).

   Per work item (b, head group, q-block) and per visited kv-block, K is packed transposed
   once ([D, bkp], zero-padded to whole vectors) and shared by the gs query heads of the
   group; then, strip of MRMAX rows by strip: S = Q K^T * scale (registers), score mod, mask,
   online softmax in place, O = alpha O + P V (registers). Everything a strip touches stays
   in L1/L2. In a partial block a strip works only on the keys its rows can see.

   The softmax runs in base 2: scores are carried times log2(e) (folded into the scale when
   there is no score mod, else applied after it), P = 2^(S - max) and the row maxima are
   brought back to base e for lse. 2^x takes 6 multiplies and multiply-adds, e^x 10. */

#include <string.h>

#include "attention/transpose.h"

#define MRMAX 6 /* query rows per strip */
#define FWD_CACHED 4 /* packed kv-blocks kept per thread */

/* Kt[d, j] = K[j, d] for j < nk, zero for nk <= j < bkp. */
static void SIMD_FN(pack_kt)(const float *ks, int64_t D, int64_t nk, float *kt, int64_t bkp)
{
    fx__transpose(kt, bkp, ks, D, nk, D);
    if (nk < bkp)
        for (int64_t d = 0; d < D; d++)
            memset(kt + d * bkp + nk, 0, (size_t)(bkp - nk) * sizeof(float));
}

/* The strips' operands: float32 values, or with FWD_BF16 (forward_avx512bf16.c) bfloat16
   words, each two consecutive k (attention/bf16.h's layouts), one vdpbf16ps per word. A
   strip kernel's k runs over D values or D / 2 words, its keys over keys or pairs of keys. */
#ifdef FWD_BF16
typedef uint32_t fwd_op;
typedef __m512bh fwd_vec;
#define FWD_LOAD(p) ((__m512bh)_mm512_loadu_si512((const void *)(p)))
#define FWD_SET1(x) ((__m512bh)_mm512_set1_epi32((int)(x)))
#define FWD_MAC(a, b, acc) _mm512_dpbf16_ps(acc, a, b)
#else
typedef float fwd_op;
typedef vf fwd_vec;
#define FWD_LOAD(p) V_LOAD(p)
#define FWD_SET1(x) V_SET1(x)
#define FWD_MAC(a, b, acc) V_FMA(a, b, acc)
#endif

/* S[r, c0 .. c0 + nc*VL) = scale * sum_d Q[r, d] Kt[d, ...] for r < mr. */
static inline __attribute__((always_inline)) void SIMD_FN(qk_tile)(int mr, int nc, const fwd_op *qr, int64_t D,
                                                                    const fwd_op *kt, int64_t ldk, float *s,
                                                                    int64_t lds, float scale)
{
    vf acc[MRMAX][NC];
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            acc[r][c] = V_ZERO();
    for (int64_t d = 0; d < D; d++) {
        fwd_vec kv[NC];
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            kv[c] = FWD_LOAD(kt + d * ldk + c * VL);
#pragma GCC unroll 8
        for (int r = 0; r < mr; r++) {
            fwd_vec qb = FWD_SET1(qr[r * D + d]);
#pragma GCC unroll 8
            for (int c = 0; c < nc; c++)
                acc[r][c] = FWD_MAC(qb, kv[c], acc[r][c]);
        }
    }
    vf sc = V_SET1(scale);
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            V_STORE(s + r * lds + c * VL, V_MUL(acc[r][c], sc));
}

/* O[r, c0 .. c0 + nc*VL) = alpha[r] O[r, ...] + sum_{j < nk} P[r, j] V[j, ...] for r < mr. */
static inline __attribute__((always_inline)) void SIMD_FN(pv_tile)(int mr, int nc, const fwd_op *p, int64_t ldp,
                                                                    const fwd_op *vv, int64_t ldv, int64_t nk,
                                                                    float *o, int64_t ldo, const float *alpha)
{
    vf acc[MRMAX][NC];
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) {
        vf al = V_SET1(alpha[r]);
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            acc[r][c] = V_MUL(V_LOAD(o + r * ldo + c * VL), al);
    }
    for (int64_t j = 0; j < nk; j++) {
        fwd_vec vr[NC];
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            vr[c] = FWD_LOAD(vv + j * ldv + c * VL);
#pragma GCC unroll 8
        for (int r = 0; r < mr; r++) {
            fwd_vec pb = FWD_SET1(p[r * ldp + j]);
#pragma GCC unroll 8
            for (int c = 0; c < nc; c++)
                acc[r][c] = FWD_MAC(pb, vr[c], acc[r][c]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            V_STORE(o + r * ldo + c * VL, acc[r][c]);
}

/* Instantiations for every (mr, nc) a strip can need, behind one call. */
#define SIMD_NC_CASES(KERNEL, MRV, ...)                                                            \
    switch (nc) {                                                                                  \
    case 1: KERNEL(MRV, 1, __VA_ARGS__); break;                                                    \
    case 2: KERNEL(MRV, 2 <= NC ? 2 : 1, __VA_ARGS__); break;                                      \
    case 3: KERNEL(MRV, 3 <= NC ? 3 : 1, __VA_ARGS__); break;                                      \
    default: KERNEL(MRV, 4 <= NC ? 4 : 1, __VA_ARGS__); break;                                     \
    }
#define SIMD_MR_CASES(KERNEL, ...)                                                                 \
    switch (mr) {                                                                                  \
    case 1: SIMD_NC_CASES(KERNEL, 1, __VA_ARGS__) break;                                           \
    case 2: SIMD_NC_CASES(KERNEL, 2, __VA_ARGS__) break;                                           \
    case 3: SIMD_NC_CASES(KERNEL, 3, __VA_ARGS__) break;                                           \
    case 4: SIMD_NC_CASES(KERNEL, 4, __VA_ARGS__) break;                                           \
    case 5: SIMD_NC_CASES(KERNEL, 5, __VA_ARGS__) break;                                           \
    default: SIMD_NC_CASES(KERNEL, 6, __VA_ARGS__) break;                                          \
    }

/* S[r, 0 .. width) for r < mr; width is a whole number of vectors. */
static void SIMD_FN(qk_strip)(int mr, const fwd_op *qr, int64_t D, const fwd_op *kt, int64_t ldk, float *s,
                              int64_t lds, int64_t width, float scale)
{
    for (int64_t c0 = 0; c0 < width; c0 += NC * VL) {
        int nc = (int)((width - c0) / VL < NC ? (width - c0) / VL : NC);
#define QK_(MRV, NCV, ...) SIMD_FN(qk_tile)(MRV, NCV, qr, D, kt + c0, ldk, s + c0, lds, scale)
        SIMD_MR_CASES(QK_, 0)
#undef QK_
    }
}

/* O[r, ...] = alpha[r] O[r, ...] + sum_{j < nk} P[r, j] V[j0 + j, ...] over V packed by pack_v
   (keys j, or with FWD_BF16 pairs of keys: pack_v16, bk pairs a panel). */
static void SIMD_FN(pv_strip)(int mr, const fwd_op *p, int64_t ldp, const fwd_op *vp, int64_t bk, int64_t j0,
                              int64_t nk, float *o, int64_t dvp, const float *alpha)
{
    for (int64_t c0 = 0; c0 < dvp; c0 += NC * VL) {
        const int64_t w = dvp - c0 < NC * VL ? dvp - c0 : NC * VL;
        const int nc = (int)(w / VL);
        const fwd_op *vv = vp + c0 * bk + j0 * w;
#define PV_(MRV, NCV, ...) SIMD_FN(pv_tile)(MRV, NCV, p, ldp, vv, w, nk, o + c0, dvp, alpha)
        SIMD_MR_CASES(PV_, 0)
#undef PV_
    }
}

#ifdef FWD_BF16
#include "attention/forward_bf16.h" /* the bfloat16 packing */
#else
/* V of a kv-block packed as the column panels pv_strip reads: the panel of columns
   [c, c + w) (w = NC*VL, or what is left of dvp) starts at vp + c * bk and holds row j at
   j * w, so a strip streams each panel contiguously instead of one line per 4 rows of V.
   Columns past Dv are zero. */
static void SIMD_FN(pack_v)(const float *vs, int64_t Dv, int64_t nk, float *vp, int64_t bk, int64_t dvp)
{
    for (int64_t j = 0; j < nk; j++) /* V's rows in order: one stream from memory */
        for (int64_t c = 0; c < dvp; c += NC * VL) {
            const int64_t w = dvp - c < NC * VL ? dvp - c : NC * VL;
            for (int64_t x = 0; x < w; x += VL) {
                const float *src = vs + j * Dv + c + x;
                const int64_t n = Dv - c - x;
                const vf y = n >= VL ? V_LOAD(src) : n > 0 ? V_MLOAD(V_TAIL((int)n), src) : V_ZERO();
                V_STORE(vp + c * bk + j * w + x, y);
            }
        }
}

#endif

#define LOG2E 1.44269504088896341f
#define LN2 0.693147180559945309f

/* S[r, 0 .. width) *= f for r < mr; width is a whole number of vectors. */
static void SIMD_FN(strip_scale)(int mr, float *s, int64_t lds, int64_t width, float f)
{
    const vf vf_ = V_SET1(f);
    for (int r = 0; r < mr; r++)
        for (int64_t j = 0; j < width; j += VL)
            V_STORE(s + r * lds + j, V_MUL(V_LOAD(s + r * lds + j), vf_));
}

/* Built-in score mods on a strip of mr rows x width columns (row r is query qa + r, column
   j key k0 + j), each result then times `unit` in the same pass (log2 e: into base 2). */
static void SIMD_FN(score_builtin)(int kind, const void *ctx, float *s, int64_t lds, int64_t width, int mr, int64_t h,
                                   int64_t qa, int64_t k0, float unit)
{
    const vf vu = V_SET1(unit);
    if (kind == FX__SCORE_SOFTCAP) {
        float c = ((const fx_score_softcap_ctx *)ctx)->cap;
        vf vc = V_SET1(c), vinv = V_SET1(1.0f / c);
        for (int r = 0; r < mr; r++)
            for (int64_t j = 0; j < width; j += VL)
                V_STORE(s + r * lds + j, V_MUL(V_MUL(vc, SIMD_FN(vtanh)(V_MUL(V_LOAD(s + r * lds + j), vinv))), vu));
    } else if (kind == FX__SCORE_REL_BIAS) {
        /* s += table[clamp(q - kv + zero)]: the entry index, exact in float below 2^24, is
           clamped in float and gathered. */
        const fx_score_rel_bias_ctx *c = ctx;
        const float *t = c->table + (c->heads == 1 ? 0 : h) * c->size;
        const vf hi = V_SET1((float)(c->size - 1)), zero = V_ZERO();
        for (int r = 0; r < mr; r++)
            for (int64_t j = 0; j < width; j += VL) {
                /* -(kv + lane - q - zero) = q - kv + zero for the lanes' keys */
                vf e = V_SUB(zero, V_FROM_I((int32_t)(k0 + j - (qa + r) - c->zero)));
                e = V_MIN(V_MAX(e, zero), hi);
                V_STORE(s + r * lds + j, V_MUL(V_ADD(V_LOAD(s + r * lds + j), V_GATHER(t, e)), vu));
            }
    } else { /* alibi: s += slope * (kv - q), with the distance exact in int32 then converted */
        vf slope = V_SET1(((const fx_score_alibi_ctx *)ctx)->slopes[h]);
        for (int r = 0; r < mr; r++)
            for (int64_t j = 0; j < width; j += VL) {
                vf dist = V_FROM_I((int32_t)(k0 + j - (qa + r)));
                V_STORE(s + r * lds + j, V_MUL(V_FMA(slope, dist, V_LOAD(s + r * lds + j)), vu));
            }
    }
}

/* The packed kv-blocks a thread holds: a tag per slot ((b * Hkv + hkv) * nkb + kb, -1 for
   none) and when each was last used. */
typedef struct SIMD_FN(fwd_cache) {
    int64_t tag[FWD_CACHED], used[FWD_CACHED], clock;
    int n;
} SIMD_FN(fwd_cache);

/* The slot holding block `key`, or the least recently used one, retagged (*fresh: it must be
   packed). */
static int SIMD_FN(cache_slot)(SIMD_FN(fwd_cache) *c, int64_t key, bool *fresh)
{
    int slot = -1, lru = 0;
    for (int i = 0; i < c->n; i++) {
        slot = c->tag[i] == key ? i : slot;
        lru = c->used[i] < c->used[lru] ? i : lru;
    }
    *fresh = slot < 0;
    if (slot < 0)
        slot = lru, c->tag[slot] = key;
    c->used[slot] = ++c->clock;
    return slot;
}

/* The rows of the next kv-block, fetched towards L2 a share per strip while the strips of
   this one compute, so that packing it next does not stall on memory. */
typedef struct fwd_ahead {
    const char *k, *v;
    int64_t k_lines, v_lines, step, at;
} fwd_ahead;

static inline void SIMD_FN(ahead_step)(fwd_ahead *f)
{
    for (int64_t x = 0; x < f->step; x++, f->at++) {
        if (f->at < f->k_lines)
            __builtin_prefetch(f->k + f->at * 64, 0, 2);
        if (f->at < f->v_lines)
            __builtin_prefetch(f->v + f->at * 64, 0, 2);
    }
}

/* Columns [*c0, *c1) (whole vectors) of a partial block holding every key rows r0 .. r0 + mr - 1
   of its bitmap see among its first nk, and [*p0, *p1) within them from the first such key to
   the last; false when they see none there. */
static inline bool SIMD_FN(strip_keys)(const fx_block_mask *m, const uint64_t *bits, int64_t r0, int mr, int64_t nk,
                                       int64_t *c0, int64_t *c1, int64_t *p0, int64_t *p1)
{
    int64_t jlo = INT64_MAX, jhi = -1;
    for (int64_t w = 0; w < m->bm_words; w++) {
        uint64_t u = 0;
        for (int r = 0; r < mr; r++)
            u |= bits[(r0 + r) * m->bm_words + w];
        if (u) {
            jlo = jlo == INT64_MAX ? w * 64 + __builtin_ctzll(u) : jlo;
            jhi = w * 64 + 63 - __builtin_clzll(u);
        }
    }
    jhi = jhi < nk ? jhi : nk - 1;
    if (jlo > jhi)
        return false;
    *c0 = jlo / VL * VL, *c1 = (jhi / VL + 1) * VL;
    *p0 = jlo, *p1 = jhi + 1;
    return true;
}

/* The online softmax of a strip's scores S[r, c0 .. c1) in place, in base 2 (rows lds apart;
   keys kend and on are padding): keys hidden by the bitmap rows (NULL: none) become -inf, the
   rows' maxima M and sums L are updated, alpha[r] = 2^(old max - new max) rescales what the
   row summed before, and S becomes P = 2^(S - max). */
static inline void SIMD_FN(strip_softmax)(int mr, float *S, int64_t lds, int64_t c0, int64_t c1, int64_t kend,
                                          const uint64_t *bits, int64_t words, float *M, float *L, float *alpha)
{
    float muse[VL];
    for (int r = 0; r < VL; r++)
        alpha[r] = 0.0f;
    for (int r = 0; r < mr; r++) {
        float *s = S + r * lds;
        for (int64_t j = kend; j < c1; j++)
            s[j] = -INFINITY;
        /* Masking (only vectors with a hidden key: a window's edge rows see most of theirs) in
           the same pass as the maximum. */
        vf mx = V_SET1(-INFINITY);
        if (bits) {
            const uint64_t *row = bits + r * words;
            const uint32_t all = (uint32_t)((1ull << VL) - 1);
            for (int64_t j = c0; j < c1; j += VL) {
                const uint32_t w = (uint32_t)(row[j >> 6] >> (j & 63)) & all;
                vf x = V_LOAD(s + j);
                if (w != all) {
                    x = V_BITS(x, w);
                    V_STORE(s + j, x);
                }
                mx = V_MAX(mx, x);
            }
        } else {
            for (int64_t j = c0; j < c1; j += VL)
                mx = V_MAX(mx, V_LOAD(s + j));
        }
        float mnew = V_HMAX(mx);
        mnew = mnew > M[r] ? mnew : M[r];
        /* Nothing visible yet: exponents against 0 give P = 0 and, from M = -inf, alpha = 0. */
        muse[r] = mnew == -INFINITY ? 0.0f : mnew;
        alpha[r] = M[r] - muse[r];
        M[r] = mnew;
    }
    /* Every row's rescale factor in one vector exp, then P and its row sums. */
    V_STORE(alpha, SIMD_FN(vexp2)(V_LOAD(alpha)));
    for (int r = 0; r < mr; r++) {
        float *s = S + r * lds;
        const vf vm_ = V_SET1(muse[r]);
        vf sum = V_ZERO();
        for (int64_t j = c0; j < c1; j += VL) {
            vf pj = SIMD_FN(vexp2)(V_SUB(V_LOAD(s + j), vm_));
            V_STORE(s + j, pj);
            sum = V_ADD(sum, pj);
        }
        L[r] = L[r] * alpha[r] + V_HSUM(sum);
    }
}

/* Items per chunk of the schedule. When every item visits at most FWD_CACHED - 1 kv-blocks
   (a window), neighbouring q-blocks share most of them: runs of consecutive items per thread
   let the packed blocks be reused, and the items cost about the same, so runs of up to 16,
   at least 16 per thread, keep the threads within one run of even. Otherwise (causal, dense:
   costs grow along the rows) items go one by one. Chunks are handed out as threads free
   up: dealt in turn, a causal call with two q-blocks gave one of two threads every short
   item and the other every long one (the first thread then waited a quarter of the call).
   Items are independent, so any chunk and any thread give the same bits. */
static int64_t SIMD_FN(fwd_chunk)(const fx__fwd_plan *p, const fx_attention *a, int nt)
{
    const fx_block_mask *m = a->mask;
    if (!m || nt < 1)
        return 1;
    int64_t most = 0;
    for (int64_t s = 0; s < m->nslots; s++)
        for (int64_t qb = p->qb_lo; qb < p->qb_lo + p->n_qb; qb++) {
            const int64_t r = fx__bm_row(m, s, qb);
            most = m->kv_ptr[r + 1] - m->kv_ptr[r] > most ? m->kv_ptr[r + 1] - m->kv_ptr[r] : most;
        }
    if (most > FWD_CACHED - 1)
        return 1;
    const int64_t c = p->n_items / ((int64_t)nt * 16);
    return c < 1 ? 1 : c > 16 ? 16 : c;
}

#ifndef FWD_ENTRY
#define FWD_ENTRY SIMD_FN(fx__flex_forward)
#endif

int FWD_ENTRY(const fx_attention *a, const float *q, const float *k, const float *v, float *out, float *lse)
{
    fx__fwd_plan p;
    fx__fwd_plan_init(&p, a);
    const fx_block_mask *m = a->mask;
    const int64_t D = a->D, Dv = a->Dv, bq = p.bq, bk = p.bk, gs = p.gs;
    const int64_t bkp = (bk + VL - 1) / VL * VL, dvp = (Dv + VL - 1) / VL * VL;
    const int score_kind = fx__score_kind(a->score_mod);
    /* scores in base 2: log2(e) goes into the scale, or after the score mod */
    const float qk_scale = a->score_mod ? p.scale : p.scale * LOG2E;
    /* Alibi distances go through int32, relative-bias indices through float: beyond those
       ranges the generic per-tile call is exact. */
    const int64_t far = a->q_offset + a->Lq > a->Lkv ? a->q_offset + a->Lq : a->Lkv;
    bool fast_mod = score_kind == FX__SCORE_SOFTCAP || (score_kind == FX__SCORE_ALIBI && far < INT32_MAX / 2);
    if (score_kind == FX__SCORE_REL_BIAS) {
        const fx_score_rel_bias_ctx *rb = a->score_ctx;
        const int64_t lim = (int64_t)1 << 22;
        fast_mod = far < lim && rb->size < lim && rb->zero < lim && rb->zero > -lim;
    }
    /* Per-thread scratch, in floats, each part a whole number of 64-byte lines. */
#define LINES_(n) (((size_t)(n) + 15) / 16 * 16)
    const size_t kt_len = LINES_(D * bkp), vp_len = LINES_(bk * dvp), s_len = LINES_(MRMAX * bkp),
                 o_len = LINES_(gs * bq * dvp), ml_len = LINES_(gs * bq), al_len = LINES_(MRMAX);
#ifdef FWD_BF16
    /* Words: the item's Q rows and a strip's P (rows layout), and the float32 Kt that
       pack_kt16 pairs up; a panel's Kt2 and V2 fit in its float32 room. */
    const int64_t D2 = (D + 1) / 2, bk2 = (bk + 1) / 2;
    const size_t x_len = LINES_(gs * bq * D2) + LINES_(MRMAX * bkp / 2) + kt_len;
#else
    const size_t x_len = 0;
#endif
#undef LINES_
    const int nt = fx__max_threads();
    const int64_t chunk = SIMD_FN(fwd_chunk)(&p, a, nt);
    /* Packed blocks kept per thread: FWD_CACHED for runs of a window's items, else one (the
       scratch of a small call, such as a short prompt, stays small). */
    const int cached = chunk > 1 ? FWD_CACHED : 1;
    const size_t panel = kt_len + vp_len;
    const size_t per = (size_t)cached * panel + s_len + o_len + 2 * ml_len + al_len + x_len;
    float *scratch = fx__alloc((size_t)nt * per * sizeof(float));
    if (!scratch)
        return fx__error(FX_ENOMEM, "attention: out of memory for %d x %zu scratch floats", nt, per);

#pragma omp parallel
    {
        float *const panels = scratch + (size_t)fx__thread_id() * per, *S = panels + cached * panel, *O = S + s_len;
        float *M = O + o_len, *L = M + ml_len, *alpha = L + ml_len;
#ifdef FWD_BF16
        uint32_t *const Q2 = (uint32_t *)(alpha + al_len), *const P2 = Q2 + (gs * bq * D2 + 15) / 16 * 16;
        float *const kt_tmp = (float *)(P2 + (MRMAX * bkp / 2 + 15) / 16 * 16);
#endif
        SIMD_FN(fwd_cache) cache = {.clock = 0, .n = cached};
        for (int c = 0; c < cached; c++)
            cache.tag[c] = -1, cache.used[c] = 0;
#pragma omp for schedule(dynamic, chunk) nowait /* the region's end joins the threads */
        for (int64_t item = 0; item < p.n_items; item++) {
            fx__fwd_item it;
            fx__fwd_item_init(&p, a, item, &it);
            const int64_t b = it.b, h0 = it.h0, hkv = it.hkv, qa0 = it.qa0, nr = it.nr, brow = it.brow;
            fx__fwd_state_reset(M, L, gs * bq, O, (size_t)(gs * bq * dvp));

            const float *kh = fx__fwd_kv_rows(a, &it, k, D);
            const float *vh = fx__fwd_kv_rows(a, &it, v, Dv);
#ifdef FWD_BF16
            for (int64_t g = 0; g < gs; g++)
                fx__attn16_kernels_avx512bf16.rows(Q2 + g * bq * D2, D2, fx__fwd_q_rows(a, &it, q, h0 + g), D, nr, D);
#endif
            for (int64_t e = it.e0; e < it.e1; e++) {
                int64_t kb, k0, nk;
                const uint64_t *bits;
                if (!fx__fwd_kv_block(m, a, bk, e, &kb, &k0, &nk, &bits))
                    continue;
                /* K^T (zero columns past nk) and V's panels of this block: packed once while they
                   stay among the thread's `cached` latest, so a window's next q-block reuses
                   them. Packing is a copy: a reused block is the same bits as a new one. */
                bool fresh;
                const int slot = SIMD_FN(cache_slot)(&cache, (b * a->Hkv + hkv) * p.nkb + kb, &fresh);
                const float *Kt = panels + slot * panel, *Vp = Kt + kt_len;
                if (fresh) {
#ifdef FWD_BF16
                    SIMD_FN(pack_kt16)(kh + k0 * D, D, nk, (uint32_t *)(panels + slot * panel), bkp, kt_tmp);
                    SIMD_FN(pack_v16)(vh + k0 * Dv, Dv, nk, (uint32_t *)(panels + slot * panel + kt_len), bk2, dvp);
#else
                    SIMD_FN(pack_kt)(kh + k0 * D, D, nk, panels + slot * panel, bkp);
                    SIMD_FN(pack_v)(vh + k0 * Dv, Dv, nk, panels + slot * panel + kt_len, bk, dvp);
#endif
                }
                /* In a run of a window's items, the next one packs the block after this item's
                   last: fetch it while this one computes. */
                fwd_ahead ahead = {0};
                if (chunk > 1 && e == it.e1 - 1 && k0 + bk < a->Lkv && (item + 1) % chunk != 0 &&
                    (item + 1) % p.n_qb != 0) {
                    const int64_t rows = a->Lkv - k0 - bk < bk ? a->Lkv - k0 - bk : bk;
                    const int64_t strips = (nr + MRMAX - 1) / MRMAX * gs;
                    ahead.k = (const char *)(kh + (k0 + bk) * D), ahead.v = (const char *)(vh + (k0 + bk) * Dv);
                    ahead.k_lines = rows * D * (int64_t)sizeof(float) / 64;
                    ahead.v_lines = rows * Dv * (int64_t)sizeof(float) / 64;
                    ahead.step = ((ahead.k_lines > ahead.v_lines ? ahead.k_lines : ahead.v_lines) + strips - 1) / strips;
                }
                for (int64_t g = 0; g < gs; g++) {
                    const int64_t h = h0 + g;
                    const float *qh = fx__fwd_q_rows(a, &it, q, h);
                    int mr;
                    for (int64_t i0 = 0; i0 < nr; i0 += mr) {
                        /* Strips of MRMAX rows; the last 7 .. 11 rows go as two strips of about
                           half (128 = 20 x 6 + 4 + 4, not + 6 + 2: a 2-row tile leaves the FMA
                           units half idle). A row's result does not depend on its strip mates: the keys they
                           add to its columns are masked (P = 0). */
                        mr = (int)(nr - i0 >= 2 * MRMAX ? MRMAX : nr - i0 > MRMAX ? (nr - i0 + 1) / 2 : nr - i0);
                        SIMD_FN(ahead_step)(&ahead);
                        /* In a partial block the strip computes only the keys its rows can see
                           (half of a diagonal block, most of a sliding window's edge blocks). */
                        int64_t c0 = 0, c1 = bkp, p0 = 0, p1 = nk;
                        if (bits && !SIMD_FN(strip_keys)(m, bits, brow + i0, mr, nk, &c0, &c1, &p0, &p1))
                            continue; /* no key visible to these rows here: their state stays */
                        const int64_t kend = nk < c1 ? nk : c1; /* keys c0 .. kend - 1 are real */
#ifdef FWD_BF16
                        (void)qh;
                        SIMD_FN(qk_strip)(mr, Q2 + (g * bq + i0) * D2, D2, (const uint32_t *)Kt + c0, bkp, S + c0, bkp,
                                          c1 - c0, qk_scale);
#else
                        SIMD_FN(qk_strip)(mr, qh + i0 * D, D, Kt + c0, bkp, S + c0, bkp, c1 - c0, qk_scale);
#endif
                        if (a->score_mod) {
                            if (fast_mod) {
                                SIMD_FN(score_builtin)(score_kind, a->score_ctx, S + c0, bkp, c1 - c0, mr, h,
                                                       qa0 + i0, k0 + c0, LOG2E);
                            } else {
                                a->score_mod(S + c0, bkp, mr, kend - c0, b, h, qa0 + i0, k0 + c0, a->score_ctx);
                                SIMD_FN(strip_scale)(mr, S + c0, bkp, c1 - c0, LOG2E);
                            }
                        }
                        const int64_t ri = g * bq + i0;
                        SIMD_FN(strip_softmax)(mr, S, bkp, c0, c1, kend,
                                               bits ? bits + (brow + i0) * m->bm_words : NULL, m ? m->bm_words : 0,
                                               M + ri, L + ri, alpha);
                        /* Keys outside [p0, p1) have P = 0 for every row of the strip: P V skips
                           them (the vector tails at a window's edges). */
#ifdef FWD_BF16
                        /* In pairs of keys from an even one: the keys a pair adds past [p0, p1)
                           have P = 0 (masked for every row, or padding), inside [c0, c1). */
                        const int64_t pe = p0 / 2 * 2, np2 = (p1 - pe + 1) / 2;
                        fx__attn16_kernels_avx512bf16.rows(P2, bkp / 2, S + pe, bkp, mr, 2 * np2);
                        SIMD_FN(pv_strip)(mr, P2, bkp / 2, (const uint32_t *)Vp, bk2, pe / 2, np2, O + ri * dvp, dvp,
                                          alpha);
#else
                        SIMD_FN(pv_strip)(mr, S + p0, bkp, Vp, bk, p0, p1 - p0, O + ri * dvp, dvp, alpha);
#endif
                    }
                }
            }
            for (int64_t i = 0; i < gs * bq; i++)
                M[i] *= LN2; /* back to base e */
            fx__fwd_item_store(&p, a, &it, O, dvp, M, L, out, lse);
        }
    }
    fx__free(scratch);
    return FX_OK;
}
