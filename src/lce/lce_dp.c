/* The fused loss's three products in bfloat16 pairs (fx__linear_cross_entropy_bf16 on a tiled
   bfloat16 path whose panels are packed pair by pair, the vdpbf16ps one): each product is a
   series of the path's tile-kernel calls (core/gemm_bf16.h) over panels packed here, with the
   contracts of the float32 kernels they replace (lce_internal.h). */
#include "lce_internal.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static int64_t dp_min(int64_t a, int64_t b) { return a < b ? a : b; }

/* Words of a panel set: every panel of `lines` lines whole, `pairs` pairs each. */
static size_t dp_words(int64_t lines, int64_t width, int64_t pairs)
{
    return (size_t)((lines + width - 1) / width * width) * (size_t)pairs;
}

fx__lce_dp fx__lce_dp_plan(const fx__bf16_tiled *t, int64_t c, int64_t D, int64_t rows, int threads)
{
    fx__lce_dp d = {.t = t, .c = c, .D = D, .rows = rows};
    d.pd = fx__bf16_tiled_pairs(t, D);
    d.pc = fx__bf16_tiled_pairs(t, c);
    const int64_t pr = fx__bf16_tiled_pairs(t, rows);
    d.hl_words = dp_words(c, t->nr, d.pd);
    d.hw_words = dp_words(D, t->nr, d.pc);
    /* A thread's panels: one of w (logits) or of g (dw), or g's transpose and one of w (dh). */
    size_t thr = (size_t)(t->mr * (d.pd > d.pc ? d.pd : d.pc));
    const size_t dh = dp_words(c, t->mr, pr) + (size_t)(t->nr * pr);
    d.thr_words = ((thr > dh ? thr : dh) + 15) / 16 * 16; /* 64-byte apart */
    d.threads = threads;
    return d;
}

size_t fx__lce_dp_words(const fx__lce_dp *d)
{
    return d->hl_words + d->hw_words + (size_t)d->threads * d->thr_words;
}

void fx__lce_dp_bind(fx__lce_dp *d, uint32_t *ws)
{
    d->hl = ws;
    d->hw = ws + d->hl_words;
    d->thr = d->hw + d->hw_words;
}

/* This thread's panels. */
static uint32_t *dp_mine(const fx__lce_dp *d)
{
#ifdef _OPENMP
    return d->thr + (size_t)omp_get_thread_num() * d->thr_words;
#else
    return d->thr;
#endif
}

void fx__lce_dp_pack_h(fx__lce_dp *d, fx__bf16_mat x, int64_t c)
{
    const fx__bf16_tiled *t = d->t;
    d->c = c;
    d->pc = fx__bf16_tiled_pairs(t, c);
    /* the logits' B: tokens as lines, d as k */
    for (int64_t q = 0; q * t->nr < d->c; q++)
        fx__bf16_pack_pairs(d->hl + q * t->nr * d->pd, x, d->D, true, d->c, d->D, d->pd, t->nr, q);
    /* dw's B: d as lines, tokens as k */
    for (int64_t q = 0; q * t->nr < d->D; q++)
        fx__bf16_pack_pairs(d->hw + q * t->nr * d->pc, x, d->D, false, d->D, d->c, d->pc, t->nr, q);
}

void fx__lce_dp_logits(const fx__lce_dp *d, int64_t nj, fx__bf16_mat w, float *zt, int64_t ldz)
{
    const fx__bf16_tiled *t = d->t;
    uint32_t *a = dp_mine(d);
    for (int64_t j0 = 0; j0 < nj; j0 += t->mr) {
        const int64_t mr = dp_min(t->mr, nj - j0);
        fx__bf16_pack_pairs(a, fx__bf16_mat_at(w, j0 * d->D), d->D, true, mr, d->D, d->pd, t->mr, 0);
        for (int64_t i0 = 0; i0 < d->c; i0 += t->nr)
            t->kernel(d->pd, a, d->hl + i0 * d->pd, 0.0f, zt + j0 * ldz + i0, ldz, mr, dp_min(t->nr, d->c - i0));
    }
}

void fx__lce_dp_dw(const fx__lce_dp *d, int64_t nj, const float *g, int64_t ldz, float *dw)
{
    const fx__bf16_tiled *t = d->t;
    uint32_t *a = dp_mine(d);
    for (int64_t j0 = 0; j0 < nj; j0 += t->mr) {
        const int64_t mr = dp_min(t->mr, nj - j0);
        fx__bf16_pack_pairs(a, fx__bf16_of_f32(g + j0 * ldz), ldz, true, mr, d->c, d->pc, t->mr, 0);
        for (int64_t c0 = 0; c0 < d->D; c0 += t->nr)
            t->kernel(d->pc, a, d->hw + c0 * d->pc, 1.0f, dw + j0 * d->D + c0, d->D, mr, dp_min(t->nr, d->D - c0));
    }
}

void fx__lce_dp_dh(const fx__lce_dp *d, int64_t nj, int64_t d0, int64_t d1, const float *g, int64_t ldz,
                   fx__bf16_mat w, float *dh, bool accumulate)
{
    const fx__bf16_tiled *t = d->t;
    const int64_t pr = fx__bf16_tiled_pairs(t, nj);
    /* g's transpose (tokens as lines, w's rows as k), then w's columns [d0, d1) a panel at a
       time (columns as lines, rows as k). */
    uint32_t *gt = dp_mine(d), *b = gt + dp_words(d->c, t->mr, pr);
    for (int64_t q = 0; q * t->mr < d->c; q++)
        fx__bf16_pack_pairs(gt + q * t->mr * pr, fx__bf16_of_f32(g), ldz, false, d->c, nj, pr, t->mr, q);
    const float beta = accumulate ? 1.0f : 0.0f;
    for (int64_t c0 = d0; c0 < d1; c0 += t->nr) {
        const int64_t nr = dp_min(t->nr, d1 - c0);
        fx__bf16_pack_pairs(b, fx__bf16_mat_at(w, c0), d->D, false, nr, nj, pr, t->nr, 0);
        for (int64_t i0 = 0; i0 < d->c; i0 += t->mr)
            t->kernel(pr, gt + i0 * pr, b, beta, dh + i0 * d->D + c0, d->D, dp_min(t->mr, d->c - i0), nr);
    }
}
