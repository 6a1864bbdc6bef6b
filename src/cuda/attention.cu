/* FlexAttention on CUDA: forward (with split-KV for few query rows), backward (dQ, dK/dV,
   and the rel_bias table's gradient), float32 or bfloat16 in and out, float32 arithmetic.

   The scalar kernels (bfloat16 forwards of the common head sizes run on tensor cores
   instead, attn_fwd_tc.cu; the split partials' merge here serves both). A thread block owns 16 query rows of one
   head inside one q-block of the mask (4 warps x 4 rows); it walks the kv-blocks that row
   block visits (the mask's list, or every block without a mask), 32 keys at a time through
   shared memory. Lane j scores key j of the tile for a row; the online softmax and O += P V
   run in registers, each lane holding Dv/32 output columns. Empty blocks are never read,
   full blocks skip the bitmap, partial blocks test it.

   Determinism: every sum has one order fixed by the sizes (keys ascending within a tile,
   tiles and kv-blocks ascending; dK/dV: query heads of the group ascending, then q-blocks
   ascending, then rows). No floating-point atomics anywhere, so the result does not depend
   on how the GPU schedules blocks. The forward's split-KV partials are merged in split
   order. */
#include "cuda/attn_rules.cuh"

/* The tensor-core forward (attn_fwd_tc.cu): whether it takes a call (bfloat16, D == Dv in
   {32, 64, 96, 128, 256}, 16-byte aligned tensors), and its launch, which writes out and lse, or
   with nsplit > 1 the split partials that combine_kernel merges. */
extern "C" int fx__cu_attn_tc_takes(const fx__cu_attn *a);
extern "C" int fx__cu_attn_forward_tc(const fx__cu_attn *a, float *part);
/* Its split count (its blocks hold up to 128 rows, not 16). */
extern "C" int fx__cu_attn_tc_splits(const fx__cu_attn *a, int sm_count);

namespace fxcu {
namespace {

enum { ROWS = 16, RPW = 4, KT = 32, THREADS = 128, DT = FX__CU_DMAX / 32 };

/* ---- score mods and masks ----------------------------------------------------------------- */

/* out row and lse from the running state (m, l, o): out = o / l, lse = m + log l; a row that
   saw no key gets zeros and -inf; a NaN anywhere in the row reaches both. */
template <typename T>
__device__ __forceinline__ void finish_row(const fx__cu_attn &a, int64_t grow, float m, float l, const float *o,
                                           int lane)
{
    const bool nan = l != l;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    T *out = (T *)a.out;
#pragma unroll
    for (int t = 0; t < DT; t++) {
        const int d = lane + 32 * t;
        if (d < a.Dv)
            store(out, grow * a.Dv + d, nan ? NAN : l > 0.0f ? o[t] * inv : 0.0f);
    }
    if (a.lse && lane == 0)
        a.lse[grow] = nan ? NAN : l > 0.0f ? m + logf(l) : -INFINITY;
}

/* ---- forward ------------------------------------------------------------------------------ */

/* Which 16 rows a thread block owns: head h of batch b, absolute positions [lo, hi), in the
   q-block whose first position is base. */
struct RowBlock {
    int64_t b, h, qbi, base, lo, hi;
};

__device__ __forceinline__ RowBlock row_block(const fx__cu_attn &a, int64_t x)
{
    RowBlock r;
    const int64_t nrc = (a.bq + ROWS - 1) / ROWS;
    const int64_t rc = x % nrc;
    x /= nrc;
    r.qbi = x % a.n_qb;
    x /= a.n_qb;
    r.h = x % a.Hq;
    r.b = x / a.Hq;
    r.base = a.has_mask ? (a.qb_lo + r.qbi) * a.bq : a.q_offset + r.qbi * a.bq;
    int64_t lo = r.base + rc * ROWS, hi = lo + ROWS;
    hi = min(hi, r.base + a.bq);
    hi = min(hi, a.q_offset + a.Lq);
    r.lo = max(lo, a.q_offset);
    r.hi = hi;
    return r;
}

/* The visited entries [e0, e1) of a row block's mask row (every kv-block without a mask). */
__device__ __forceinline__ void visit_range(const fx__cu_attn &a, const RowBlock &rb, int64_t *e0, int64_t *e1)
{
    if (a.has_mask) {
        const int64_t r = mask_slot(a.m, rb.b, rb.h) * a.m.nqb + a.qb_lo + rb.qbi;
        *e0 = a.m.kv_ptr[r];
        *e1 = a.m.kv_ptr[r + 1];
    } else {
        *e0 = 0;
        *e1 = a.nkb;
    }
}

/* Rows [row0, row0 + rows) of a row-major (., n) matrix into shared memory with leading
   dimension ld, by the whole thread block; rows from nvalid on are zeros. */
template <typename T>
__device__ __forceinline__ void stage_rows(float *dst, int ld, int rows, const T *src, int64_t row0, int nvalid, int n)
{
    for (int i = threadIdx.x; i < rows * n; i += THREADS) {
        const int j = i / n, d = i % n;
        dst[j * ld + d] = j < nvalid ? load(src, (row0 + j) * n + d) : 0.0f;
    }
}

/* Entry e of a row block's visited list: the block's first key *k0, its key count *nk in this
   call and its bitmap offset *boff (-1: a full block); false for a block past this call's keys
   (a mask longer than the call). */
__device__ __forceinline__ bool kv_entry(const fx__cu_attn &a, int64_t e, int64_t *k0, int64_t *nk, int64_t *boff)
{
    const int64_t kb = a.has_mask ? a.m.kv_idx[e] : e;
    *boff = a.has_mask ? a.m.kv_bits[e] : -1;
    *k0 = kb * a.bk;
    if (*k0 >= a.Lkv)
        return false;
    *nk = min(a.bk, a.Lkv - *k0);
    return true;
}

/* The backward's view of one visible (query, key) pair from its staged rows q (D), k (D),
   dout (Dv), v (Dv): *p, the probability, and the return value dS, the gradient w.r.t. the
   raw score (times scale). */
__device__ __forceinline__ float score_backward(const fx__cu_attn &a, const float *qr, const float *kr,
                                                const float *gr, const float *vr, int D, int Dv, int64_t h,
                                                int64_t qpos, int64_t kpos, float lse, float di, float *p)
{
    float acc = 0.0f, dp = 0.0f;
    for (int d = 0; d < D; d++)
        acc += qr[d] * kr[d];
    for (int d = 0; d < Dv; d++)
        dp += gr[d] * vr[d];
    const float raw = acc * a.scale;
    *p = expf(score_mod(a, raw, h, qpos, kpos) - lse);
    return score_grad(a, raw, *p * (dp - di)) * a.scale;
}

template <typename T>
__global__ void __launch_bounds__(THREADS) fwd_kernel(fx__cu_attn a, float *part)
{
    FX_DYN_SMEM(float, sm);
    const int D = (int)a.D, Dv = (int)a.Dv, ldk = D + 1, ldv = Dv + 1;
    float *Qs = sm, *Ks = Qs + ROWS * D, *Vs = Ks + KT * ldk;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const RowBlock rb = row_block(a, blockIdx.x);
    if (rb.lo >= rb.hi)
        return; /* the whole block: no row of this call lies here */
    const int nr = (int)(rb.hi - rb.lo);
    const T *q = (const T *)a.q, *k = (const T *)a.k, *v = (const T *)a.v;
    const int64_t qrow0 = (rb.b * a.Hq + rb.h) * a.Lq + (rb.lo - a.q_offset);
    const int64_t kbase = (rb.b * a.Hkv + rb.h / (a.Hq / a.Hkv)) * a.Lkv;
    stage_rows(Qs, D, ROWS, q, qrow0, nr, D);

    int64_t e0, e1;
    visit_range(a, rb, &e0, &e1);
    const int64_t per = (e1 - e0 + a.nsplit - 1) / a.nsplit;
    const int64_t s0 = min(e1, e0 + (int64_t)blockIdx.y * per), s1 = min(e1, s0 + per);

    float mrow[RPW], lrow[RPW], o[RPW][DT];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        mrow[rr] = -INFINITY;
        lrow[rr] = 0.0f;
#pragma unroll
        for (int t = 0; t < DT; t++)
            o[rr][t] = 0.0f;
    }

    for (int64_t e = s0; e < s1; e++) {
        int64_t k0, nk, boff;
        if (!kv_entry(a, e, &k0, &nk, &boff))
            continue;
        for (int64_t t0 = 0; t0 < nk; t0 += KT) {
            const int nt = (int)min((int64_t)KT, nk - t0);
            __syncthreads();
            stage_rows(Ks, ldk, KT, k, kbase + k0 + t0, nt, D);
            stage_rows(Vs, ldv, KT, v, kbase + k0 + t0, nt, Dv);
            __syncthreads();
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) {
                const int r = warp * RPW + rr;
                if (r >= nr)
                    continue; /* uniform over the warp */
                const int64_t qpos = rb.lo + r, kpos = k0 + t0 + lane;
                float s = -INFINITY;
                if (lane < nt) {
                    const float *qr = Qs + r * D, *kr = Ks + lane * ldk;
                    float acc = 0.0f;
                    for (int d = 0; d < D; d++)
                        acc += qr[d] * kr[d];
                    s = score_mod(a, acc * a.scale, rb.h, qpos, kpos);
                    if (boff >= 0 && !mask_bit(a.m, boff, qpos - rb.base, t0 + lane))
                        s = -INFINITY;
                }
                const float mnew = nmax(mrow[rr], warp_max(s));
                if (mnew == -INFINITY)
                    continue; /* nothing visible in this row yet (uniform) */
                const float alpha = expf(mrow[rr] - mnew), p = expf(s - mnew);
                lrow[rr] = lrow[rr] * alpha + warp_sum(p);
#pragma unroll
                for (int t = 0; t < DT; t++)
                    o[rr][t] *= alpha;
                for (int j = 0; j < nt; j++) {
                    const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
                    for (int t = 0; t < DT; t++) {
                        const int d = lane + 32 * t;
                        if (d < Dv)
                            o[rr][t] += pj * Vs[j * ldv + d];
                    }
                }
                mrow[rr] = mnew;
            }
        }
    }

    const int64_t nrows = a.B * a.Hq * a.Lq;
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        const int r = warp * RPW + rr;
        if (r >= nr)
            continue;
        const int64_t grow = qrow0 + r;
        if (a.nsplit == 1) {
            finish_row<T>(a, grow, mrow[rr], lrow[rr], o[rr], lane);
        } else {
            float *pp = part + ((int64_t)blockIdx.y * nrows + grow) * (Dv + 2);
#pragma unroll
            for (int t = 0; t < DT; t++) {
                const int d = lane + 32 * t;
                if (d < Dv)
                    pp[d] = o[rr][t];
            }
            if (lane == 0) {
                pp[Dv] = mrow[rr];
                pp[Dv + 1] = lrow[rr];
            }
        }
    }
}

/* Merges the nsplit partial states of each row, in split order: one warp per row. */
template <typename T> __global__ void __launch_bounds__(THREADS) combine_kernel(fx__cu_attn a, const float *part)
{
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * (THREADS / 32) + (threadIdx.x >> 5);
    const int64_t nrows = a.B * a.Hq * a.Lq, Dv = a.Dv;
    if (row >= nrows)
        return;
    float M = -INFINITY;
    for (int s = 0; s < a.nsplit; s++)
        M = nmax(M, part[((int64_t)s * nrows + row) * (Dv + 2) + Dv]);
    float L = 0.0f, o[DT];
#pragma unroll
    for (int t = 0; t < DT; t++)
        o[t] = 0.0f;
    if (M != -INFINITY) {
        for (int s = 0; s < a.nsplit; s++) {
            const float *pp = part + ((int64_t)s * nrows + row) * (Dv + 2);
            const float ms = pp[Dv];
            if (ms == -INFINITY)
                continue; /* this split saw no key of the row */
            const float w = expf(ms - M);
            L += pp[Dv + 1] * w;
#pragma unroll
            for (int t = 0; t < DT; t++) {
                const int d = lane + 32 * t;
                if (d < Dv)
                    o[t] += pp[d] * w;
            }
        }
    }
    finish_row<T>(a, row, M, L, o, lane);
}

/* ---- backward ----------------------------------------------------------------------------- */

/* Di[r] = sum_d dout[r, d] * out[r, d], in order. */
template <typename T> __global__ void delta_kernel(fx__cu_attn a, float *Di)
{
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= a.B * a.Hq * a.Lq)
        return;
    const T *dout = (const T *)a.dout, *out = (const T *)a.out;
    float acc = 0.0f;
    for (int64_t d = 0; d < a.Dv; d++)
        acc += load(dout, r * a.Dv + d) * load(out, r * a.Dv + d);
    Di[r] = acc;
}

/* dQ of 16 rows: dQ_i = sum over visited keys j (ascending) of dS_ij K_j. */
template <typename T> __global__ void __launch_bounds__(THREADS) dq_kernel(fx__cu_attn a, const float *Di)
{
    FX_DYN_SMEM(float, sm);
    const int D = (int)a.D, Dv = (int)a.Dv, ldk = D + 1, ldv = Dv + 1;
    float *Qs = sm, *dOs = Qs + ROWS * D, *Ks = dOs + ROWS * Dv, *Vs = Ks + KT * ldk;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const RowBlock rb = row_block(a, blockIdx.x);
    if (rb.lo >= rb.hi)
        return;
    const int nr = (int)(rb.hi - rb.lo);
    const T *q = (const T *)a.q, *k = (const T *)a.k, *v = (const T *)a.v, *dout = (const T *)a.dout;
    const int64_t qrow0 = (rb.b * a.Hq + rb.h) * a.Lq + (rb.lo - a.q_offset);
    const int64_t kbase = (rb.b * a.Hkv + rb.h / (a.Hq / a.Hkv)) * a.Lkv;
    stage_rows(Qs, D, ROWS, q, qrow0, nr, D);
    stage_rows(dOs, Dv, ROWS, dout, qrow0, nr, Dv);
    float lse_r[RPW], di_r[RPW], dq[RPW][DT];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        const int r = warp * RPW + rr;
        lse_r[rr] = r < nr ? a.lse[qrow0 + r] : 0.0f;
        di_r[rr] = r < nr ? Di[qrow0 + r] : 0.0f;
#pragma unroll
        for (int t = 0; t < DT; t++)
            dq[rr][t] = 0.0f;
    }
    int64_t e0, e1;
    visit_range(a, rb, &e0, &e1);
    for (int64_t e = e0; e < e1; e++) {
        int64_t k0, nk, boff;
        if (!kv_entry(a, e, &k0, &nk, &boff))
            continue;
        for (int64_t t0 = 0; t0 < nk; t0 += KT) {
            const int nt = (int)min((int64_t)KT, nk - t0);
            __syncthreads();
            stage_rows(Ks, ldk, KT, k, kbase + k0 + t0, nt, D);
            stage_rows(Vs, ldv, KT, v, kbase + k0 + t0, nt, Dv);
            __syncthreads();
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) {
                const int r = warp * RPW + rr;
                if (r >= nr)
                    continue;
                const int64_t qpos = rb.lo + r, kpos = k0 + t0 + lane;
                float ds = 0.0f;
                if (lane < nt && lse_r[rr] != -INFINITY &&
                    (boff < 0 || mask_bit(a.m, boff, qpos - rb.base, t0 + lane))) {
                    float p;
                    ds = score_backward(a, Qs + r * D, Ks + lane * ldk, dOs + r * Dv, Vs + lane * ldv, D, Dv, rb.h,
                                        qpos, kpos, lse_r[rr], di_r[rr], &p);
                }
                for (int j = 0; j < nt; j++) {
                    const float dj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
                    for (int t = 0; t < DT; t++) {
                        const int d = lane + 32 * t;
                        if (d < D)
                            dq[rr][t] += dj * Ks[j * ldk + d];
                    }
                }
            }
        }
    }
    T *dqp = (T *)a.dq;
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        const int r = warp * RPW + rr;
        if (r >= nr)
            continue;
#pragma unroll
        for (int t = 0; t < DT; t++) {
            const int d = lane + 32 * t;
            if (d < D)
                store(dqp, (qrow0 + r) * a.D + d, dq[rr][t]);
        }
    }
}

/* dK, dV of 16 keys of one kv-block: sums over the group's query heads (ascending), the
   q-blocks that visit the kv-block (ascending) and their rows (ascending). */
template <typename T> __global__ void __launch_bounds__(THREADS) dkv_kernel(fx__cu_attn a, const float *Di)
{
    FX_DYN_SMEM(float, sm);
    const int D = (int)a.D, Dv = (int)a.Dv, ldq = D + 1, ldo = Dv + 1;
    float *Kr = sm, *Vr = Kr + ROWS * D, *Qt = Vr + ROWS * Dv, *dOt = Qt + KT * ldq, *lse_t = dOt + KT * ldo,
          *di_t = lse_t + KT;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t nkc = (a.bk + ROWS - 1) / ROWS;
    int64_t x = blockIdx.x;
    const int64_t kc = x % nkc;
    x /= nkc;
    const int64_t kb = x % a.nkb;
    x /= a.nkb;
    const int64_t hkv = x % a.Hkv, b = x / a.Hkv;
    const int64_t kpos0 = kb * a.bk + kc * ROWS;
    const int nkeys = (int)min(min((int64_t)ROWS, a.bk - kc * ROWS), a.Lkv - kpos0);
    if (nkeys <= 0)
        return;
    const T *q = (const T *)a.q, *k = (const T *)a.k, *v = (const T *)a.v, *dout = (const T *)a.dout;
    const int64_t krow0 = (b * a.Hkv + hkv) * a.Lkv + kpos0;
    stage_rows(Kr, D, ROWS, k, krow0, nkeys, D);
    stage_rows(Vr, Dv, ROWS, v, krow0, nkeys, Dv);
    float dk[RPW][DT], dv[RPW][DT];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++)
#pragma unroll
        for (int t = 0; t < DT; t++)
            dk[rr][t] = dv[rr][t] = 0.0f;

    const int64_t G = a.Hq / a.Hkv;
    for (int64_t g = 0; g < G; g++) {
        const int64_t h = hkv * G + g;
        int64_t f0 = 0, f1 = a.n_qb;
        if (a.has_mask) {
            const int64_t c = mask_slot(a.m, b, h) * a.m.nkb + kb;
            f0 = a.m.q_ptr[c];
            f1 = a.m.q_ptr[c + 1];
        }
        for (int64_t f = f0; f < f1; f++) {
            int64_t base, boff = -1;
            if (a.has_mask) {
                const int64_t qb = a.m.q_idx[f];
                if (qb < a.qb_lo || qb >= a.qb_lo + a.n_qb)
                    continue; /* a q-block outside this call's rows */
                base = qb * a.bq;
                boff = a.m.q_bits[f];
            } else {
                base = a.q_offset + f * a.bq;
            }
            const int64_t rlo = max(base, a.q_offset), rhi = min(base + a.bq, a.q_offset + a.Lq);
            const int64_t qrow = (b * a.Hq + h) * a.Lq - a.q_offset; /* + position: the row */
            for (int64_t t0 = rlo; t0 < rhi; t0 += KT) {
                const int nt = (int)min((int64_t)KT, rhi - t0);
                __syncthreads();
                stage_rows(Qt, ldq, KT, q, qrow + t0, nt, D);
                stage_rows(dOt, ldo, KT, dout, qrow + t0, nt, Dv);
                if (tid < KT) {
                    lse_t[tid] = tid < nt ? a.lse[qrow + t0 + tid] : -INFINITY;
                    di_t[tid] = tid < nt ? Di[qrow + t0 + tid] : 0.0f;
                }
                __syncthreads();
#pragma unroll
                for (int rr = 0; rr < RPW; rr++) {
                    const int key = warp * RPW + rr;
                    if (key >= nkeys)
                        continue;
                    const int64_t kpos = kpos0 + key, qpos = t0 + lane;
                    float p = 0.0f, ds = 0.0f;
                    if (lane < nt && lse_t[lane] != -INFINITY &&
                        (boff < 0 || mask_bit(a.m, boff, qpos - base, kpos - kb * a.bk))) {
                        ds = score_backward(a, Qt + lane * ldq, Kr + key * D, dOt + lane * ldo, Vr + key * Dv, D, Dv,
                                            h, qpos, kpos, lse_t[lane], di_t[lane], &p);
                    }
                    for (int i = 0; i < nt; i++) {
                        const float pi = __shfl_sync(0xffffffffu, p, i), dsi = __shfl_sync(0xffffffffu, ds, i);
#pragma unroll
                        for (int t = 0; t < DT; t++) {
                            const int d = lane + 32 * t;
                            if (d < Dv)
                                dv[rr][t] += pi * dOt[i * ldo + d];
                            if (d < D)
                                dk[rr][t] += dsi * Qt[i * ldq + d];
                        }
                    }
                }
            }
        }
    }
    T *dkp = (T *)a.dk, *dvp = (T *)a.dv;
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
        const int key = warp * RPW + rr;
        if (key >= nkeys)
            continue;
#pragma unroll
        for (int t = 0; t < DT; t++) {
            const int d = lane + 32 * t;
            if (d < D)
                store(dkp, (krow0 + key) * a.D + d, dk[rr][t]);
            if (d < Dv)
                store(dvp, (krow0 + key) * a.Dv + d, dv[rr][t]);
        }
    }
}

/* Is key j visible to query qpos of (b, h)? (Within a visited block, and its bit set.) */
__device__ bool visible(const fx__cu_attn &a, int64_t b, int64_t h, int64_t qpos, int64_t j)
{
    if (!a.has_mask)
        return true;
    const int64_t qb = qpos / a.bq, kb = j / a.bk;
    const int64_t r = mask_slot(a.m, b, h) * a.m.nqb + qb;
    int64_t lo = a.m.kv_ptr[r], hi = a.m.kv_ptr[r + 1]; /* kv_idx ascending: binary search */
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (a.m.kv_idx[mid] < kb)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == a.m.kv_ptr[r + 1] || a.m.kv_idx[lo] != kb)
        return false;
    const int64_t off = a.m.kv_bits[lo];
    return off < 0 || mask_bit(a.m, off, qpos - qb * a.bq, j - kb * a.bk);
}

enum { TAB_THREADS = 256 };

/* The rel_bias table's gradient: block (hh, e) sums dS' (the gradient w.r.t. the modified
   score) over every visible (query, key) pair whose distance maps to entry e, in float64,
   each thread over a fixed set of rows and then a fixed tree; one writer per entry. */
template <typename T> __global__ void __launch_bounds__(TAB_THREADS) table_kernel(fx__cu_attn a, const float *Di)
{
    __shared__ double red[TAB_THREADS];
    const int64_t e = blockIdx.x % a.tsize, hh = blockIdx.x / a.tsize;
    /* Distances d with entry(d) == e: [dlo, dhi], exact in 128 bits. */
    __int128 dlo, dhi;
    const __int128 big = (__int128)1 << 100;
    if (a.tsize == 1) {
        dlo = -big, dhi = big;
    } else if (e == 0) {
        dlo = -big, dhi = -(__int128)a.tzero;
    } else if (e == a.tsize - 1) {
        dlo = (__int128)(a.tsize - 1) - a.tzero, dhi = big;
    } else {
        dlo = dhi = (__int128)e - a.tzero;
    }
    const T *q = (const T *)a.q, *k = (const T *)a.k, *v = (const T *)a.v, *dout = (const T *)a.dout;
    const int64_t nh = a.theads == 1 ? a.Hq : 1, nrows = a.B * nh * a.Lq, G = a.Hq / a.Hkv;
    double acc = 0.0;
    for (int64_t x = threadIdx.x; x < nrows; x += TAB_THREADS) {
        const int64_t i = x % a.Lq, hi_ = (x / a.Lq) % nh, b = x / a.Lq / nh;
        const int64_t h = a.theads == 1 ? hi_ : hh, qpos = a.q_offset + i;
        const int64_t row = (b * a.Hq + h) * a.Lq + i;
        const float l = a.lse[row];
        if (l == -INFINITY)
            continue;
        __int128 jlo = (__int128)qpos - dhi, jhi = (__int128)qpos - dlo;
        jlo = jlo < 0 ? 0 : jlo;
        jhi = jhi > a.Lkv - 1 ? a.Lkv - 1 : jhi;
        if (jlo > jhi)
            continue;
        const int64_t kr0 = (b * a.Hkv + h / G) * a.Lkv;
        for (int64_t j = (int64_t)jlo; j <= (int64_t)jhi; j++) {
            if (!visible(a, b, h, qpos, j))
                continue;
            float s = 0.0f, dp = 0.0f;
            for (int64_t d = 0; d < a.D; d++)
                s += load(q, row * a.D + d) * load(k, (kr0 + j) * a.D + d);
            for (int64_t d = 0; d < a.Dv; d++)
                dp += load(dout, row * a.Dv + d) * load(v, (kr0 + j) * a.Dv + d);
            const float p = expf(score_mod(a, s * a.scale, h, qpos, j) - l);
            acc += (double)(p * (dp - Di[row]));
        }
    }
    red[threadIdx.x] = acc;
    __syncthreads();
    for (int s = TAB_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        a.grad_table[hh * a.tsize + e] += (float)red[0];
}

/* ---- launchers ---------------------------------------------------------------------------- */

size_t fwd_smem(const fx__cu_attn *a)
{
    return (size_t)(ROWS * a->D + KT * (a->D + 1) + KT * (a->Dv + 1)) * sizeof(float);
}

size_t bwd_smem(const fx__cu_attn *a)
{
    return (size_t)(ROWS * a->D + ROWS * a->Dv + KT * (a->D + 1) + KT * (a->Dv + 1) + 2 * KT) * sizeof(float);
}

/* Waits for the stream and turns a failure of any queued kernel into a status. */
int finish_stream(cudaStream_t st, int rc, const char *what)
{
    cudaError_t e = cudaStreamSynchronize(st);
    if (rc == FX_OK && e != cudaSuccess)
        return fx__cuda_status((int)e, what);
    return rc;
}

/* Grids the kernels index with 32-bit block numbers. */
int grid_fits(int64_t blocks, const char *what)
{
    if (blocks <= INT32_MAX)
        return FX_OK;
    return fx__error(FX_EUNSUPPORTED, "%s: %lld thread blocks are past the grid limit; use larger mask blocks or split "
                                      "the batch", what, (long long)blocks);
}

template <typename T> int forward(const fx__cu_attn *call)
{
    cudaStream_t st = (cudaStream_t)call->stream;
    const bool tc = fx__cu_attn_tc_takes(call);
    fx__cu_attn tcall = *call;
    if (tc) {
        int dev = 0, sms = 1;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            sms = 1;
        }
        tcall.nsplit = fx__cu_attn_tc_splits(call, sms);
    }
    const fx__cu_attn *a = &tcall;
    const size_t smem = fwd_smem(a);
    int rc = tc ? FX_OK : grid_fits(fx__cu_attn_row_blocks(a), "attention forward");
    if (rc == FX_OK && !tc)
        rc = allow_smem(fwd_kernel<T>, smem, "attention forward");
    if (rc != FX_OK)
        return rc;
    const int64_t nrows = a->B * a->Hq * a->Lq;
    float *part = NULL;
    if (a->nsplit > 1) {
        const size_t bytes = (size_t)a->nsplit * (size_t)nrows * (size_t)(a->Dv + 2) * sizeof(float);
        cudaError_t e = cudaMallocAsync((void **)&part, bytes, st);
        if (e != cudaSuccess)
            return fx__cuda_status((int)e, "attention forward: split-KV partials");
    }
    if (tc) {
        rc = fx__cu_attn_forward_tc(a, part);
    } else {
        const dim3 grid((unsigned)fx__cu_attn_row_blocks(a), (unsigned)a->nsplit);
        FX_LAUNCH(fwd_kernel<T>, grid, THREADS, smem, st)(*a, part);
        rc = launched("attention forward");
    }
    if (rc == FX_OK && a->nsplit > 1) {
        FX_LAUNCH(combine_kernel<T>, (unsigned)((nrows + THREADS / 32 - 1) / (THREADS / 32)), THREADS, 0, st)(*a, part);
        rc = launched("attention forward: merging splits");
    }
    if (part)
        (void)cudaFreeAsync(part, st);
    return finish_stream(st, rc, "attention forward");
}

} // namespace
} // namespace fxcu

/* The tensor-core backward (attn_bwd_tc.cu): whether it takes a call, and its dq, dk, dv
   kernels queued after the row sums Di. */
extern "C" int fx__cu_attn_backward_tc_ok(const fx__cu_attn *a);
extern "C" int fx__cu_attn_backward_tc(const fx__cu_attn *a, const float *Di);

namespace fxcu {
namespace {

template <typename T> int backward(const fx__cu_attn *a)
{
    cudaStream_t st = (cudaStream_t)a->stream;
    const size_t smem = bwd_smem(a);
    const int64_t nkc = (a->bk + ROWS - 1) / ROWS;
    const bool tc = fx__cu_attn_backward_tc_ok(a); /* tensor cores for dq, dk, dv (attn_bwd_tc.cu) */
    int rc = FX_OK;
    if (!tc) {
        rc = grid_fits(fx__cu_attn_row_blocks(a), "attention backward");
        if (rc == FX_OK)
            rc = grid_fits(a->B * a->Hkv * a->nkb * nkc, "attention backward");
        if (rc == FX_OK)
            rc = allow_smem(dq_kernel<T>, smem, "attention backward");
        if (rc == FX_OK)
            rc = allow_smem(dkv_kernel<T>, smem, "attention backward");
    }
    if (rc == FX_OK && a->grad_table)
        rc = grid_fits(a->theads * a->tsize, "attention backward: rel_bias table");
    if (rc != FX_OK)
        return rc;
    const int64_t nrows = a->B * a->Hq * a->Lq;
    float *Di = NULL;
    cudaError_t e = cudaMallocAsync((void **)&Di, (size_t)nrows * sizeof(float), st);
    if (e != cudaSuccess)
        return fx__cuda_status((int)e, "attention backward: row sums");
    FX_LAUNCH(delta_kernel<T>, (unsigned)((nrows + 255) / 256), 256, 0, st)(*a, Di);
    rc = launched("attention backward: row sums");
    if (rc == FX_OK && tc)
        rc = fx__cu_attn_backward_tc(a, Di);
    if (rc == FX_OK && !tc) {
        FX_LAUNCH(dq_kernel<T>, (unsigned)fx__cu_attn_row_blocks(a), THREADS, smem, st)(*a, Di);
        rc = launched("attention backward: dq");
    }
    if (rc == FX_OK && !tc) {
        FX_LAUNCH(dkv_kernel<T>, (unsigned)(a->B * a->Hkv * a->nkb * nkc), THREADS, smem, st)(*a, Di);
        rc = launched("attention backward: dk, dv");
    }
    if (rc == FX_OK && a->mod == FX__CU_MOD_REL_BIAS && a->grad_table) {
        FX_LAUNCH(table_kernel<T>, (unsigned)(a->theads * a->tsize), TAB_THREADS, 0, st)(*a, Di);
        rc = launched("attention backward: rel_bias table");
    }
    (void)cudaFreeAsync(Di, st);
    return finish_stream(st, rc, "attention backward");
}

} // namespace
} // namespace fxcu

extern "C" int fx__cu_attn_forward(const fx__cu_attn *a)
{
    if (fx__cu_attn_decode_fits(a))
        return fx__cu_attn_decode(a);
    return a->bf16 ? fxcu::forward<fxcu::bf16>(a) : fxcu::forward<float>(a);
}

extern "C" int fx__cu_attn_backward(const fx__cu_attn *a)
{
    return a->bf16 ? fxcu::backward<fxcu::bf16>(a) : fxcu::backward<float>(a);
}
