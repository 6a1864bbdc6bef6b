/* Split-KV decoding: a few query rows (Lq <= 16) against a long KV range.

   The prefill kernel parallelises over query blocks; with a single query block per head it
   has only B * (head groups) work items, each streaming the whole key range, which leaves
   threads idle when B is small. Here a work unit is (batch, kv-head, split): it reads one
   range of the keys once for every query row of the GQA group, keeping a running (max, sum,
   accumulator) per row (online softmax), and its tiles are shaped for a few rows (dot
   products along D instead of a transposed K). The splits' partial triples are then combined in split order:
       M = max_s m_s,  L = sum_s l_s exp(m_s - M),  out = (sum_s acc_s exp(m_s - M)) / L.
   The split plan depends on the shape only, never on the thread count, so the result is
   bitwise identical for any number of threads. */
#include "attention/backward.h"

#include <string.h>

enum {
    DEC_MAX_LQ = 16,      /* the path's query rows per call */
    DEC_MIN_LKV = 256,    /* below this the prefill kernel is as good */
    DEC_TARGET_UNITS = 64, /* work units to aim for: enough to balance any thread count */
};

bool fx__attention_use_decode(const fx_attention *a)
{
    return a->Lq <= DEC_MAX_LQ && a->Lkv >= DEC_MIN_LKV;
}

typedef struct dec_plan {
    const fx_attention *a;
    const float *q, *k, *v;
    const fx__attn_bwd_kernels *kr;
    const fx_block_mask *m;
    float scale;
    int64_t G, R;        /* query heads per kv-head; rows per unit = G * Lq */
    int64_t chunk;       /* keys per chunk: the mask's block_kv, or the dense block */
    int64_t nchunks;     /* chunks covering Lkv */
    int64_t per_split;   /* chunks per split */
    int64_t nsplit;
    int64_t ld;          /* row stride of the score tiles */
    float *part;         /* [B, Hkv, nsplit, R, Dv + 2]: acc, then m and l */
} dec_plan;

typedef struct dec_scratch {
    float *S, *P;      /* [R, ld] */
    float *acc;        /* [R, Dv] */
    float *mx, *sum, *rowmax, *alpha; /* [R]: running max and sum, row flags, rescale factors */
    int64_t *cursor;   /* [R]: position in each row's kv-block list */
} dec_scratch;

/* Status of kv-block kb for unit row rr (head hk*G + rr/Lq, local row rr%Lq), advancing the
   row's cursor through its ascending list. Sets *bits for a partial block. */
static int dec_status(const dec_plan *p, dec_scratch *s, int64_t b, int64_t hk, int64_t rr, int64_t kb,
                      const uint64_t **bits, int64_t *i0)
{
    const fx_block_mask *m = p->m;
    *bits = NULL;
    if (!m)
        return FX__BLOCK_FULL;
    int64_t h = hk * p->G + rr / p->a->Lq, qa = p->a->q_offset + rr % p->a->Lq, qb = qa / m->block_q;
    int64_t row = fx__bm_row(m, fx__bm_slot(m, b, h), qb), end = m->kv_ptr[row + 1];
    int64_t e = s->cursor[rr];
    while (e < end && m->kv_idx[e] < kb)
        e++;
    s->cursor[rr] = e;
    if (e == end || m->kv_idx[e] != kb)
        return FX__BLOCK_EMPTY;
    *bits = fx__bm_bits(m, m->kv_bits[e]);
    *i0 = qa - qb * m->block_q;
    return *bits ? FX__BLOCK_PARTIAL : FX__BLOCK_FULL;
}

static void dec_unit(const dec_plan *p, dec_scratch *s, int64_t b, int64_t hk, int64_t split)
{
    const fx_attention *a = p->a;
    const fx__attn_bwd_kernels *kr = p->kr;
    int64_t R = p->R, Lq = a->Lq, D = a->D, Dv = a->Dv, ld = p->ld;
    const float *kh = p->k + (b * a->Hkv + hk) * a->Lkv * D;
    const float *vh = p->v + (b * a->Hkv + hk) * a->Lkv * Dv;
    /* The group's query rows are contiguous: heads hk*G .. hk*G+G-1, Lq rows each. */
    const float *qg = p->q + (b * a->Hq + hk * p->G) * Lq * D;
    memset(s->acc, 0, (size_t)(R * Dv) * sizeof(float));
    for (int64_t r = 0; r < R; r++) {
        s->mx[r] = -INFINITY;
        s->sum[r] = 0.0f;
        if (p->m) {
            const fx_block_mask *m = p->m;
            int64_t h = hk * p->G + r / Lq, qb = (a->q_offset + r % Lq) / m->block_q;
            s->cursor[r] = m->kv_ptr[fx__bm_row(m, fx__bm_slot(m, b, h), qb)];
        }
    }
    int64_t c_lo = split * p->per_split, c_hi = c_lo + p->per_split < p->nchunks ? c_lo + p->per_split : p->nchunks;
    for (int64_t kb = c_lo; kb < c_hi; kb++) {
        int64_t k0 = kb * p->chunk, nk = a->Lkv - k0 < p->chunk ? a->Lkv - k0 : p->chunk;
        /* Which rows see this block at all; the chunk is skipped (never read) if none. */
        bool any = false;
        for (int64_t r = 0; r < R; r++) {
            const uint64_t *bits;
            int64_t i0 = 0;
            int st = dec_status(p, s, b, hk, r, kb, &bits, &i0);
            s->rowmax[r] = st == FX__BLOCK_EMPTY ? -INFINITY : 0.0f; /* -inf: the row skips this block */
            any |= st != FX__BLOCK_EMPTY;
        }
        if (!any)
            continue;
        kr->dots(s->S, ld, qg, kh + k0 * D, R, nk, D, p->scale);
        if (a->score_mod)
            for (int64_t g = 0; g < p->G; g++)
                a->score_mod(s->S + g * Lq * ld, ld, Lq, nk, b, hk * p->G + g, a->q_offset, k0, a->score_ctx);
        for (int64_t r = 0; r < R; r++) {
            float *Sr = s->S + r * ld;
            if (s->rowmax[r] == -INFINITY) {
                for (int64_t j = 0; j < nk; j++)
                    Sr[j] = -INFINITY;
            } else {
                const uint64_t *bits;
                int64_t i0 = 0;
                /* The cursor already sits on kb: this lookup is O(1). */
                dec_status(p, s, b, hk, r, kb, &bits, &i0);
                if (bits)
                    kr->mask_bits(Sr, ld, 1, nk, bits, p->m->bm_words, i0, 0);
            }
        }
        kr->softmax_chunk(s->P, s->S, ld, R, nk, s->mx, s->sum, s->alpha);
        for (int64_t r = 0; r < R; r++) {
            float al = s->alpha[r];
            if (al != 1.0f)
                for (int64_t d = 0; d < Dv; d++)
                    s->acc[r * Dv + d] *= al;
        }
        kr->nn(s->acc, Dv, s->P, ld, vh + k0 * Dv, Dv, R, Dv, nk, 1.0f, true);
    }
    float *dst = p->part + ((b * a->Hkv + hk) * p->nsplit + split) * R * (Dv + 2);
    for (int64_t r = 0; r < R; r++) {
        memcpy(dst + r * (Dv + 2), s->acc + r * Dv, (size_t)Dv * sizeof(float));
        dst[r * (Dv + 2) + Dv] = s->mx[r];
        dst[r * (Dv + 2) + Dv + 1] = s->sum[r];
    }
}

/* Combines the splits of row r of unit (b, hk), in split order, into out / lse. */
static void dec_combine(const dec_plan *p, int64_t b, int64_t hk, int64_t r, float *out, float *lse)
{
    const fx_attention *a = p->a;
    int64_t Dv = a->Dv, stride = p->R * (Dv + 2);
    const float *src = p->part + (b * a->Hkv + hk) * p->nsplit * stride + r * (Dv + 2);
    int64_t h = hk * p->G + r / a->Lq, i = r % a->Lq;
    float *o = out + ((b * a->Hq + h) * a->Lq + i) * Dv;
    float M = -INFINITY;
    bool nan = false; /* a split that met a NaN score has a NaN sum (or max) */
    for (int64_t s = 0; s < p->nsplit; s++) {
        M = src[s * stride + Dv] > M ? src[s * stride + Dv] : M;
        nan |= isnan(src[s * stride + Dv]) || isnan(src[s * stride + Dv + 1]);
    }
    if (nan) {
        for (int64_t d = 0; d < Dv; d++)
            o[d] = NAN;
        if (lse)
            lse[(b * a->Hq + h) * a->Lq + i] = NAN;
        return;
    }
    for (int64_t d = 0; d < Dv; d++)
        o[d] = 0.0f;
    float L = 0.0f;
    if (M != -INFINITY) {
        for (int64_t s = 0; s < p->nsplit; s++) {
            const float *ps = src + s * stride;
            if (ps[Dv] == -INFINITY)
                continue;
            float w = expf(ps[Dv] - M);
            L += ps[Dv + 1] * w;
            for (int64_t d = 0; d < Dv; d++)
                o[d] += ps[d] * w;
        }
        float inv = 1.0f / L;
        for (int64_t d = 0; d < Dv; d++)
            o[d] *= inv;
    }
    if (lse)
        lse[(b * a->Hq + h) * a->Lq + i] = M == -INFINITY ? -INFINITY : M + logf(L);
}

int fx__attention_decode(const fx_attention *a, const float *q, const float *k, const float *v, float *out,
                         float *lse)
{
    dec_plan p = {.a = a, .q = q, .k = k, .v = v, .m = a->mask};
    p.kr = fx__attn_bwd_kernels_now();
    p.scale = fx__attention_scale(a);
    p.G = a->Hq / a->Hkv;
    p.R = p.G * a->Lq;
    p.chunk = p.m ? p.m->block_kv : FX__DENSE_BLOCK_KV;
    p.ld = (p.chunk + 15) / 16 * 16;
    p.nchunks = (a->Lkv + p.chunk - 1) / p.chunk;
    int64_t pairs = a->B * a->Hkv;
    int64_t want = (DEC_TARGET_UNITS + pairs - 1) / pairs;
    want = want < p.nchunks ? want : p.nchunks;
    p.per_split = (p.nchunks + want - 1) / want;
    p.nsplit = (p.nchunks + p.per_split - 1) / p.per_split;

    int nt = fx__max_threads();
    size_t per_thread_f = (size_t)(2 * p.R * p.ld + p.R * a->Dv + 4 * p.R);
    size_t part_n = (size_t)(pairs * p.nsplit * p.R * (a->Dv + 2));
    float *scr = fx__alloc((size_t)nt * per_thread_f * sizeof(float));
    int64_t *cur = fx__alloc((size_t)nt * (size_t)p.R * sizeof(int64_t));
    p.part = fx__alloc(part_n * sizeof(float));
    if (!scr || !cur || !p.part) {
        fx__free(scr);
        fx__free(cur);
        fx__free(p.part);
        return fx__error(FX_ENOMEM, "attention decode: out of memory for %zu bytes of scratch",
                         ((size_t)nt * per_thread_f + part_n) * sizeof(float));
    }
    int64_t units = pairs * p.nsplit;
#pragma omp parallel
    {
        int t = fx__thread_id();
        dec_scratch s;
        s.S = scr + (size_t)t * per_thread_f;
        s.P = s.S + p.R * p.ld;
        s.acc = s.P + p.R * p.ld;
        s.mx = s.acc + p.R * a->Dv;
        s.sum = s.mx + p.R;
        s.rowmax = s.sum + p.R;
        s.alpha = s.rowmax + p.R;
        s.cursor = cur + (size_t)t * (size_t)p.R;
        /* Round-robin: with a sliding window only the last splits of a row have work. */
#pragma omp for schedule(static, 1)
        for (int64_t u = 0; u < units; u++)
            dec_unit(&p, &s, u / p.nsplit / a->Hkv, u / p.nsplit % a->Hkv, u % p.nsplit);
        int64_t rows = pairs * p.R;
#pragma omp for schedule(static)
        for (int64_t x = 0; x < rows; x++)
            dec_combine(&p, x / p.R / a->Hkv, x / p.R % a->Hkv, x % p.R, out, lse);
    }
    fx__free(scr);
    fx__free(cur);
    fx__free(p.part);
    return FX_OK;
}
