/* FlexAttention forward on tensor cores (mma.sync m16n8k16, sm_80 and later) for bfloat16
   q, k, v, out with D == Dv in {32, 64, 96, 128, 256}; attention.cu routes those calls here
   (fx__cu_attn_tc_takes) and keeps its scalar kernels for every other shape.

   FlashAttention-2's schedule. A thread block of 4 warps owns 128 query rows of one head
   inside one q-block of the mask (two 16-row m-tiles a warp), or 64 rows (one m-tile a warp)
   when the q-blocks or the call are shorter or D = 256, and walks the kv-blocks that q-block
   visits (the mask's list, or every block without a mask) 64 keys a tile. K and V tiles are
   staged by 16-byte cp.async into two buffers, the next tile loading while this one is used.
   S = Q K^T by mma (Q fragments in registers with one m-tile, else from shared memory; K
   fragments by ldmatrix); the mask and the score mod are applied on the accumulator
   fragments, where each element knows its (row, key); the online softmax runs in base 2
   (scores times log2 e, exp2), and O += P V takes P from the same registers, rounded to the
   input type as A fragments (V by ldmatrix.trans). Shared rows are padded by 16 bytes so
   that the 8 rows one ldmatrix reads fall in different banks. Shared memory: 4 tiles (K and
   V, two stages), plus Q's rows where Q stays there (at D = 128: 68 KiB for 64 rows, 102 KiB
   for 128, two blocks a multiprocessor either way, as registers allow).

   Full kv-blocks skip the bitmap, partial blocks test it (a 64-key tile never straddles a
   64-bit word: tiles start at multiples of 64 inside a block), and keys past the block or
   past Lkv are masked. Rows the block holds beyond the call's rows are computed on zeros and
   not stored. Split-KV (a->nsplit > 1) writes the same partial state as the scalar kernel,
   merged by attention.cu's combine kernel.

   Determinism: every sum of a row has one order fixed by the sizes (tiles ascending, the
   mma's own order within one), no atomics; the result does not depend on scheduling. */
#include "cuda/attn_rules.cuh"
#include "cuda/mma.cuh"

#include <stdlib.h>

namespace fxcu {
namespace {

enum { BN = 64 };

template <typename T> struct Elem;
template <> struct Elem<bf16> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) { return pack_bf16(lo, hi); }
    static __device__ __forceinline__ void mma(float d[4], const uint32_t a[4], const uint32_t b[2])
    {
        mma_16816_bf16(d, a, b, d);
    }
};

/* The rows a block owns: head h of batch b, positions [lo, hi) of the q-block starting at
   base.

   The order the grid starts them in (the work of a block never depends on it): heaviest
   first over groups of hsec heads. Within a group the row blocks go from the last q-block to
   the first, all the group's heads at one q-block before the next, so the blocks that visit
   the most keys (the last rows under a causal mask; every row block but the first few under
   a sliding window) start first, on the whole GPU at once, and the last wave holds the
   shortest blocks. Walking each head from its last row block to its first instead (one head
   a group) saw-tooths: the last heads' longest blocks start in the final waves and run alone.
   A group's K and V (hsec / G KV heads) are sized by the launch to stay in L2 while its
   blocks run; the groups go in (batch, head) order. */
struct Rows {
    int64_t b, h, qbi, base, lo, hi;
};

__device__ __forceinline__ Rows tc_rows(const fx__cu_attn &a, int64_t x, int BM, int64_t hsec)
{
    const int64_t nch = (a.bq + BM - 1) / BM, per_head = a.n_qb * nch, nbh = a.B * a.Hq;
    const int64_t grp = x / (hsec * per_head), h0 = grp * hsec, nh = min(hsec, nbh - h0);
    const int64_t w = x - grp * hsec * per_head;
    const int64_t j = per_head - 1 - w / nh, bh = h0 + w % nh;
    Rows r;
    r.qbi = j / nch;
    r.h = bh % a.Hq;
    r.b = bh / a.Hq;
    r.base = a.has_mask ? (a.qb_lo + r.qbi) * a.bq : a.q_offset + r.qbi * a.bq;
    const int64_t lo = r.base + (j % nch) * BM;
    r.hi = min(min(lo + BM, r.base + a.bq), a.q_offset + a.Lq);
    r.lo = max(lo, a.q_offset);
    return r;
}

/* One 64-key tile: keys k0 + t0 .. of the kv-block at list entry e (nk keys in this call,
   bitmap at boff, -1: full). nkb, nboff: the next entry's block and bitmap, read one entry
   ahead so that moving to it does not wait on memory. */
struct Tile {
    int64_t e, k0, nk, boff, t0, nkb, nboff;
    bool has;
};

__device__ __forceinline__ Tile at_entry(const fx__cu_attn &a, int64_t e, int64_t kb, int64_t boff, int64_t e1)
{
    Tile c;
    c.e = e;
    c.k0 = kb * a.bk;
    c.nk = min(a.bk, a.Lkv - c.k0);
    c.boff = boff;
    c.t0 = 0;
    c.has = true;
    c.nkb = e + 1 < e1 ? (a.has_mask ? (int64_t)a.m.kv_idx[e + 1] : e + 1) : -1;
    c.nboff = e + 1 < e1 && a.has_mask ? a.m.kv_bits[e + 1] : -1;
    return c;
}

/* The first tile of the first entry in [e, e1) whose block holds keys of this call. */
__device__ __forceinline__ Tile seek(const fx__cu_attn &a, int64_t e, int64_t e1)
{
    for (; e < e1; e++) {
        const int64_t kb = a.has_mask ? a.m.kv_idx[e] : e;
        if (kb * a.bk < a.Lkv) /* else a mask longer than the call */
            return at_entry(a, e, kb, a.has_mask ? a.m.kv_bits[e] : -1, e1);
    }
    Tile c;
    c.e = e1, c.k0 = c.nk = c.t0 = 0, c.boff = c.nkb = c.nboff = -1, c.has = false;
    return c;
}

__device__ __forceinline__ Tile next_tile(const fx__cu_attn &a, const Tile &c, int64_t e1)
{
    if (c.t0 + BN < c.nk) {
        Tile n = c;
        n.t0 += BN;
        return n;
    }
    if (c.nkb >= 0 && c.nkb * a.bk < a.Lkv)
        return at_entry(a, c.e + 1, c.nkb, c.nboff, e1);
    return seek(a, c.e + 1, e1);
}

/* Rows [row0, row0 + ROWS) of a row-major (., D) matrix into shared memory (row stride LD),
   rows from nvalid on zero-filled, by 16-byte cp.async of the whole block. Each thread moves
   one column chunk of every RSTEP-th row, so its addresses are one pointer plus constants
   (nothing per chunk stays live in registers across the walk). */
template <int D, int ROWS, int THREADS, typename T>
__device__ __forceinline__ void stage(T *dst, const T *src, int64_t row0, int nvalid, int tid)
{
    constexpr int CH = D / 8, LD = D + 8;
    if constexpr (THREADS % CH == 0) {
        constexpr int RSTEP = THREADS / CH;
        static_assert(ROWS % RSTEP == 0, "whole passes over the rows");
        const int r0 = tid / CH, c = tid % CH;
        const T *gsrc = src + (row0 + r0) * D + c * 8;
        T *sdst = dst + r0 * LD + c * 8;
#pragma unroll
        for (int it = 0; it < ROWS / RSTEP; it++) {
            const bool ok = r0 + it * RSTEP < nvalid;
            cp_async_16(sdst + it * RSTEP * LD, ok ? gsrc + it * RSTEP * D : src + row0 * D, ok ? 16 : 0);
        }
    } else {
#pragma unroll
        for (int i = tid; i < ROWS * CH; i += THREADS) {
            const int r = i / CH, c = i % CH;
            const bool ok = r < nvalid;
            cp_async_16(dst + r * LD + c * 8, src + (row0 + (ok ? r : 0)) * D + c * 8, ok ? 16 : 0);
        }
    }
}

/* The block shapes: WARPS warps of MT m-tiles (16 rows each), 16 * WARPS * MT rows. With one
   m-tile a warp keeps its Q fragments in registers (up to D = 128); with two, each K and V
   fragment read from shared memory serves both (half the shared-memory traffic per product),
   and Q is read from its own buffer at each tile to leave the registers to the accumulators,
   as it is at D = 256. */
template <int D, int WARPS, int MT> struct Shape {
    static constexpr int BM = 16 * WARPS * MT, THREADS = 32 * WARPS;
    static constexpr bool QREG = MT == 1 && D <= 128;
};

/* ---- one warp's steps on one tile (inlined: the arrays stay in registers) --------------- */

/* s = Q K^T for the warp's MT m-tiles and the tile's 64 keys (key blocks past nt left 0). Q
   from the registers qf (QREG) or from shared memory Qs; K from Kt. */
template <int D, int MT, bool QREG, int QN, typename T>
__device__ __forceinline__ void qk_tile(float (&s)[MT][BN / 8][4], const uint32_t (&qf)[QN][4], const T *Qs,
                                        const T *Kt, int wrow, int lane, int nt)
{
    constexpr int LD = D + 8, NT = BN / 8;
    /* A fragments' rows: lane l reads row l % 8 (+ 8 for matrices 1 and 3) at column 8 (l / 16)
       of a 16 x 16 block; B fragments of 16 keys: matrices (keys +0, d +0), (+0, +8), (+8, +0),
       (+8, +8). */
    const int arow = (lane & 7) + 8 * ((lane >> 3) & 1), acol = 8 * (lane >> 4);
    const int krow = (lane & 7) + 8 * (lane >> 4), kcol = 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int j = 0; j < NT; j++)
            s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t qa[MT][4];
        if (!QREG)
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                ldmatrix_x4(qa[mt], Qs + (wrow + 16 * mt + arow) * LD + 16 * kk + acol);
#pragma unroll
        for (int jj = 0; jj < NT / 2; jj++) {
            if (16 * jj >= nt)
                break; /* keys past the tail: masked afterwards */
            uint32_t kb[4];
            ldmatrix_x4(kb, Kt + (16 * jj + krow) * LD + 16 * kk + kcol);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const uint32_t *af = QREG ? qf[kk] : qa[mt];
                Elem<T>::mma(s[mt][2 * jj], af, kb);
                Elem<T>::mma(s[mt][2 * jj + 1], af, kb + 2);
            }
        }
    }
}

/* The scores of a tile that is partial (bitmap), short (tail keys) or modified, into base-2
   units: scale, score mod, then -inf where the key is not visible. */
template <int MT>
__device__ __forceinline__ void mask_tile(const fx__cu_attn &a, float (&s)[MT][BN / 8][4], const Rows &rb,
                                          const Tile &cur, int nr, int wrow, int g, int t, int nt)
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const int r = wrow + 16 * mt + g + 8 * rr;
            const int64_t qpos = rb.lo + r;
            uint64_t word = ~(uint64_t)0;
            if (cur.boff >= 0)
                word = r < nr ? a.m.bits[cur.boff + (qpos - rb.base) * a.m.bm_words + (cur.t0 >> 6)] : 0;
#pragma unroll
            for (int j = 0; j < BN / 8; j++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int col = 8 * j + 2 * t + c;
                    float x = s[mt][j][2 * rr + c] * a.scale;
                    if (a.mod != FX__CU_MOD_NONE)
                        x = score_mod(a, x, rb.h, qpos, cur.k0 + cur.t0 + col);
                    const bool vis = col < nt && ((word >> col) & 1u);
                    s[mt][j][2 * rr + c] = vis ? x * LOG2E : -INFINITY;
                }
        }
}

/* True when any lane of the warp says so (every lane of the warp calls it). */
__device__ __forceinline__ bool warp_any(bool x)
{
#ifdef FX_CUDA_EMU
    return x; /* each lane alone: the callers' work is the identity where x is false */
#else
    return __any_sync(0xffffffffu, x);
#endif
}

/* The online softmax step of rows g and g + 8 of each m-tile (a row spans the 4 lanes of a
   quad): new max m, rescaled sum l and output o, and s turned into probabilities. The scores
   are s * mul in base-2 units. fmaxf drops a NaN from the max, but the NaN's own exp2 still
   makes the row sum, and with it out and lse, NaN. With one m-tile a warp, a row's o is
   rescaled only when the factor of that row in some quad of the warp differs from 1 (a
   maximum grew): the skipped products are by exactly 1, so the bits are those of rescaling
   always, and long rows, whose maximum seldom moves after the first tiles, skip D / 4
   multiplications a lane a row most tiles. Two m-tiles a warp always rescale: the test and
   its branch cost registers that shape does not have (ptxas spills at D = 128). */
template <int MT, int OT>
__device__ __forceinline__ void softmax_tile(float (&s)[MT][BN / 8][4], float (&o)[MT][OT][4], float (&m)[MT][2],
                                             float (&l)[MT][2], float mul)
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < BN / 8; j++)
                mx = fmaxf(mx, fmaxf(s[mt][j][2 * rr], s[mt][j][2 * rr + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mnew = fmaxf(m[mt][rr], mx * mul), base = mnew == -INFINITY ? 0.0f : mnew;
            const float alpha = exp2_fast(m[mt][rr] - base);
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < BN / 8; j++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const float p = exp2_fast(fmaf(s[mt][j][2 * rr + c], mul, -base));
                    s[mt][j][2 * rr + c] = p;
                    sum += p;
                }
            l[mt][rr] = l[mt][rr] * alpha + sum;
            if (MT > 1 || warp_any(alpha != 1.0f))
#pragma unroll
                for (int d = 0; d < OT; d++) {
                    o[mt][d][2 * rr] *= alpha;
                    o[mt][d][2 * rr + 1] *= alpha;
                }
            m[mt][rr] = mnew;
        }
}

/* o += P V, 16 keys at a time: P's accumulators are the A fragments as they are, rounded to
   T; V^T's B fragments by the transposing load, matrices (keys +0, d +0), (+8, +0), (+0, +8),
   (+8, +8). */
template <int D, int MT, typename T>
__device__ __forceinline__ void pv_tile(float (&o)[MT][D / 8][4], const float (&p)[MT][BN / 8][4], const T *Vt,
                                        int lane, int nt)
{
    constexpr int LD = D + 8;
    const int vrow = (lane & 7) + 8 * ((lane >> 3) & 1), vcol = 8 * (lane >> 4);
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
        if (16 * kk >= nt)
            break; /* p = 0 there */
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            pa[mt][0] = Elem<T>::pack(p[mt][2 * kk][0], p[mt][2 * kk][1]);
            pa[mt][1] = Elem<T>::pack(p[mt][2 * kk][2], p[mt][2 * kk][3]);
            pa[mt][2] = Elem<T>::pack(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
            pa[mt][3] = Elem<T>::pack(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dd = 0; dd < D / 16; dd++) {
            uint32_t vb[4];
            ldmatrix_x4_trans(vb, Vt + (16 * kk + vrow) * LD + 16 * dd + vcol);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                Elem<T>::mma(o[mt][2 * dd], pa[mt], vb);
                Elem<T>::mma(o[mt][2 * dd + 1], pa[mt], vb + 2);
            }
        }
    }
}

/* The split partials of the warp's rows, as the scalar kernel writes them: o unnormalised, the
   max in natural-log units (the combine kernel's), the row sum. */
template <int D, int MT>
__device__ __forceinline__ void store_partial(float *pp0, const float (&o)[MT][D / 8][4], const float (&m)[MT][2],
                                              const float (&l)[MT][2], int nr, int wrow, int g, int t)
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const int r = wrow + 16 * mt + g + 8 * rr;
            if (r >= nr)
                continue;
            float *pp = pp0 + (int64_t)r * (D + 2);
#pragma unroll
            for (int d = 0; d < D / 8; d++) {
                pp[8 * d + 2 * t] = o[mt][d][2 * rr];
                pp[8 * d + 2 * t + 1] = o[mt][d][2 * rr + 1];
            }
            if (t == 0) {
                pp[D] = m[mt][rr] * LN2;
                pp[D + 1] = l[mt][rr];
            }
        }
}

/* out = o / l of the warp's rows into shared memory Os (as T), and lse. A NaN row is NaN; a
   row that saw no key is zeros (whatever V held under its mask) with lse -inf. */
template <int D, int MT, typename T>
__device__ __forceinline__ void finish_rows(const fx__cu_attn &a, T *Os, int64_t qrow0, const float (&o)[MT][D / 8][4],
                                            const float (&m)[MT][2], const float (&l)[MT][2], int nr, int wrow, int g,
                                            int t)
{
    constexpr int LD = D + 8;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const int r = wrow + 16 * mt + g + 8 * rr;
            const float lr = l[mt][rr];
            const bool nan = lr != lr, some = lr > 0.0f;
            const float inv = some ? 1.0f / lr : 0.0f;
#pragma unroll
            for (int d = 0; d < D / 8; d++) {
                const float x0 = nan ? NAN : some ? o[mt][d][2 * rr] * inv : 0.0f;
                const float x1 = nan ? NAN : some ? o[mt][d][2 * rr + 1] * inv : 0.0f;
                store_u32(Os + r * LD + 8 * d + 2 * t, Elem<T>::pack(x0, x1));
            }
            if (a.lse && t == 0 && r < nr)
                a.lse[qrow0 + r] = nan ? NAN : some ? m[mt][rr] * LN2 + logf(lr) : -INFINITY;
        }
}

/* ---- the kernel --------------------------------------------------------------------------- */

template <int D, int WARPS, int MT, typename T>
__global__ void __launch_bounds__(32 * WARPS, WARPS == 4 ? 2 : 1)
    fwd_tc_kernel(fx__cu_attn a, float *part, int64_t hsec)
{
    using S = Shape<D, WARPS, MT>;
    constexpr int BM = S::BM, THREADS = S::THREADS, LD = D + 8, KS = D / 16, OT = D / 8;
    constexpr int TILE = BN * LD, QOFF = S::QREG ? 2 * TILE : 4 * TILE;
    static_assert(BM <= 2 * BN, "Q staged in the second buffer pair");
    FX_DYN_SMEM(uint4, smv);
    /* [stage 0: K, V][stage 1: K, V], each BN x LD; Q (BM x LD) in stage 1 until the first
       tile is used (QREG), else after the stages. */
    T *sm = (T *)smv;
    const T *Qs = sm + QOFF;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const Rows rb = tc_rows(a, blockIdx.x, BM, hsec);
    if (rb.lo >= rb.hi)
        return; /* the whole block: no row of this call lies here */
    const int nr = (int)(rb.hi - rb.lo), wrow = warp * 16 * MT;
    const bool active = wrow < nr; /* uniform over the warp */
    const T *q = (const T *)a.q, *k = (const T *)a.k, *v = (const T *)a.v;
    const int64_t qrow0 = (rb.b * a.Hq + rb.h) * a.Lq + (rb.lo - a.q_offset);
    const int64_t kbase = (rb.b * a.Hkv + rb.h / (a.Hq / a.Hkv)) * a.Lkv;

    int64_t e0 = 0, e1 = a.nkb;
    if (a.has_mask) {
        const int64_t r = ((a.m.B == 1 ? 0 : rb.b) * a.m.H + (a.m.H == 1 ? 0 : rb.h)) * a.m.nqb + a.qb_lo + rb.qbi;
        e0 = a.m.kv_ptr[r];
        e1 = a.m.kv_ptr[r + 1];
    }
    const int64_t per = (e1 - e0 + a.nsplit - 1) / a.nsplit;
    const int64_t s0 = min(e1, e0 + (int64_t)blockIdx.y * per), s1 = min(e1, s0 + per);

    stage<D, BM, THREADS>(sm + QOFF, q, qrow0, nr, tid);
    Tile cur = seek(a, s0, s1);
    if (cur.has) {
        const int nt = (int)min((int64_t)BN, cur.nk);
        stage<D, BN, THREADS>(sm, k, kbase + cur.k0, nt, tid);
        stage<D, BN, THREADS>(sm + TILE, v, kbase + cur.k0, nt, tid);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    uint32_t qf[S::QREG ? KS : 1][4];
    if (S::QREG) {
        const int arow = (lane & 7) + 8 * ((lane >> 3) & 1), acol = 8 * (lane >> 4);
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
            ldmatrix_x4(qf[kk], Qs + (wrow + arow) * LD + 16 * kk + acol);
        __syncthreads(); /* stage 1 is free for the second tile */
    }

    float o[MT][OT][4], m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
#pragma unroll
        for (int d = 0; d < OT; d++)
            o[mt][d][0] = o[mt][d][1] = o[mt][d][2] = o[mt][d][3] = 0.0f;
    }
    const float sl2 = a.scale * LOG2E;
    int st = 0;
    while (cur.has) {
        const Tile nx = next_tile(a, cur, s1);
        if (nx.has) {
            const int nt = (int)min((int64_t)BN, nx.nk - nx.t0);
            T *dst = sm + (st ^ 1) * 2 * TILE;
            stage<D, BN, THREADS>(dst, k, kbase + nx.k0 + nx.t0, nt, tid);
            stage<D, BN, THREADS>(dst + TILE, v, kbase + nx.k0 + nx.t0, nt, tid);
        }
        cp_async_commit();
        cp_async_wait<1>(); /* this tile's group has landed; the next one may still fly */
        __syncthreads();
        const int nt = (int)min((int64_t)BN, cur.nk - cur.t0);
        if (active) {
            const T *Kt = sm + st * 2 * TILE, *Vt = Kt + TILE;
            float s[MT][BN / 8][4];
            qk_tile<D, MT, S::QREG>(s, qf, Qs, Kt, wrow, lane, nt);
            /* A full tile without a mod keeps the raw products: the scale goes into the
               exponent's FMA (the row max commutes with a positive scale, rounding included). */
            const bool plain = cur.boff < 0 && nt == BN && a.mod == FX__CU_MOD_NONE && sl2 > 0.0f;
            if (!plain)
                mask_tile<MT>(a, s, rb, cur, nr, wrow, g, t, nt);
            softmax_tile<MT, OT>(s, o, m, l, plain ? sl2 : 1.0f);
            pv_tile<D, MT, T>(o, s, Vt, lane, nt);
        }
        __syncthreads(); /* every warp is done with this stage before it is refilled */
        st ^= 1;
        cur = nx;
    }

    /* Row sums over the row's 4 lanes (the same sum in each), then the results. */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            l[mt][rr] += __shfl_xor_sync(0xffffffffu, l[mt][rr], 1);
            l[mt][rr] += __shfl_xor_sync(0xffffffffu, l[mt][rr], 2);
        }
    if (a.nsplit > 1) {
        if (active)
            store_partial<D, MT>(part + ((int64_t)blockIdx.y * a.B * a.Hq * a.Lq + qrow0) * (D + 2), o, m, l, nr, wrow,
                                 g, t);
        return;
    }
    /* out through shared memory (the stages), so that rows leave in 16-byte pieces. */
    T *Os = sm;
    if (active)
        finish_rows<D, MT, T>(a, Os, qrow0, o, m, l, nr, wrow, g, t);
    __syncthreads();
    T *out = (T *)a.out;
#pragma unroll
    for (int i = tid; i < BM * OT; i += THREADS) {
        const int r = i / OT, c = i % OT;
        if (r < nr)
            copy_16(out + (qrow0 + r) * D + c * 8, Os + r * LD + c * 8);
    }
}

/* The large shape (128 rows a block) when the mask's q-blocks hold that many rows and the
   call has them; else 64 rows, which wastes less on small q-blocks and short calls. D = 256
   has registers for one m-tile only. */
bool tc_large(const fx__cu_attn *a) { return a->bq >= 128 && a->Lq >= 128 && a->D <= 128; }

template <int D, int WARPS, int MT> size_t tc_smem()
{
    using S = Shape<D, WARPS, MT>;
    return ((size_t)4 * BN + (S::QREG ? 0 : (size_t)S::BM)) * (size_t)(D + 8) * 2;
}

int64_t tc_blocks(const fx__cu_attn *a)
{
    const int64_t bm = tc_large(a) ? 128 : 64;
    return a->B * a->Hq * a->n_qb * ((a->bq + bm - 1) / bm);
}

/* Query heads a scheduling group (tc_rows): whole GQA groups, as many KV heads as keep their
   K and V within 32 MiB (most of the L2 of an H100 or H200: 8 heads at Lkv = 8192, D = 128).
   FLEXC_CUDA_L2_HEADS=n sets n KV heads a group instead (the order changes, the results do
   not; the tests use it for groups that do not divide the heads). */
int64_t sched_heads(const fx__cu_attn *a)
{
    const int64_t G = a->Hq / a->Hkv, per = a->Lkv * (a->D + a->Dv) * 2;
    int64_t n = per > 0 ? ((int64_t)32 << 20) / per : 0;
    const char *e = getenv("FLEXC_CUDA_L2_HEADS");
    if (e && atoi(e) > 0)
        n = atoi(e);
    n = n < 1 ? 1 : n;
    return (n < a->B * a->Hkv ? n : a->B * a->Hkv) * G;
}

template <int D, int WARPS, int MT> int launch_tc(const fx__cu_attn *a, float *part)
{
    const size_t smem = tc_smem<D, WARPS, MT>();
    int rc = allow_smem(fwd_tc_kernel<D, WARPS, MT, bf16>, smem, "attention forward");
    if (rc != FX_OK)
        return rc;
    const dim3 grid((unsigned)tc_blocks(a), (unsigned)a->nsplit);
    FX_LAUNCH((fwd_tc_kernel<D, WARPS, MT, bf16>), grid, 32 * WARPS, smem, (cudaStream_t)a->stream)
    (*a, part, sched_heads(a));
    return launched("attention forward");
}

/* The 128-row shape: 4 warps of two m-tiles (FlashAttention-2's choice: two blocks a
   multiprocessor at D = 128, 255 registers), or with FLEXC_CUDA_FWD_WARPS=8 8 warps of one
   m-tile (Q in registers, 218 registers, one block a multiprocessor), to compare the two. */
bool eight_warps()
{
    const char *e = getenv("FLEXC_CUDA_FWD_WARPS");
    return e && atoi(e) == 8;
}

template <int D> int launch_tc_shape(const fx__cu_attn *a, float *part)
{
    if constexpr (D > 128)
        return launch_tc<D, 4, 1>(a, part);
    else if (!tc_large(a))
        return launch_tc<D, 4, 1>(a, part);
    else
        return eight_warps() ? launch_tc<D, 8, 1>(a, part) : launch_tc<D, 4, 2>(a, part);
}

int launch_tc_d(const fx__cu_attn *a, float *part)
{
    switch (a->D) {
    case 32:
        return launch_tc_shape<32>(a, part);
    case 64:
        return launch_tc_shape<64>(a, part);
    case 96:
        return launch_tc_shape<96>(a, part);
    case 128:
        return launch_tc_shape<128>(a, part);
    default:
        return launch_tc_shape<256>(a, part);
    }
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

} // namespace
} // namespace fxcu

extern "C" int fx__cu_attn_tc_takes(const fx__cu_attn *a)
{
    if (!a->bf16)
        return 0;
    if (a->D != a->Dv || (a->D != 32 && a->D != 64 && a->D != 96 && a->D != 128 && a->D != 256))
        return 0;
    if (!fxcu::aligned16(a->q) || !fxcu::aligned16(a->k) || !fxcu::aligned16(a->v) || !fxcu::aligned16(a->out))
        return 0; /* rows are moved in 16-byte pieces */
    return fxcu::tc_blocks(a) <= INT32_MAX && a->nsplit <= 65535;
}

/* KV splits for the tensor-core grid: as fx__cu_attn_splits, but weighed with this kernel's
   own blocks (up to 128 rows each, two resident a multiprocessor), so a call whose blocks
   cannot fill the GPU twice over is cut along its kv-blocks. Depends on the sizes and
   sm_count only. */
extern "C" int fx__cu_attn_tc_splits(const fx__cu_attn *a, int sm_count)
{
    const int64_t blocks = fxcu::tc_blocks(a), want = 4 * (int64_t)(sm_count > 0 ? sm_count : 1);
    if (blocks >= want || a->max_entries <= 1)
        return 1;
    int64_t s = (want + blocks - 1) / blocks;
    s = s < 32 ? s : 32;
    return (int)(s < a->max_entries ? s : a->max_entries);
}

/* float16 would need an Elem<f16> (pack_f16, mma_16816_f16) and its launch here, once the
   calls take that type. */
extern "C" int fx__cu_attn_forward_tc(const fx__cu_attn *a, float *part)
{
    return fxcu::launch_tc_d(a, part);
}
