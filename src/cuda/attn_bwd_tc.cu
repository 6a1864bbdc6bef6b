/* FlexAttention backward on tensor cores: bfloat16 Q, K, V, dO (mma.sync m16n8k16, float32
   accumulation) for D = Dv = 32, 64, 96 or 128. attention.cu computes D_i = rowsum(dO O)
   and then hands the call here when fx__cu_attn_backward_tc_ok() says so; everything else
   keeps the scalar kernels.

   Two kernels, FlashAttention-2 style, each recomputing S = Q K^T and P = exp(S' - lse) from
   the forward's lse (S' the modified, masked score), with thread blocks of 8 warps owning 128
   rows when the mask's blocks on that side are multiples of 128 rows, else 4 warps and 64:
   - dK/dV: a thread block owns the keys of one kv-block tile of one (batch, kv head) and
     walks, for each query head of its GQA group (ascending), the q-blocks that visit the
     kv-block (the mask's transposed lists; every q-block without a mask), 64 query rows at a
     time. Each warp owns 16 keys and works in the transposed frame: S^T = K Q^T and
     dP^T = V dO^T stay in registers, P^T and dS^T = P^T (dP^T - D) are rounded to bf16 and
     fed straight back as the A operands of dV += P^T dO and dK += dS^T Q.
   - dQ: a thread block owns query rows of one q-block of one head and walks the kv-blocks
     the rows visit, 64 keys at a time: S, dP, dS as above, dQ += dS K. Each warp keeps its
     16 rows' Q fragments in registers for the whole walk (dO's are read from shared memory
     at each use: the registers hold dQ).
   Q/dO (dK/dV kernel) and K/V (dQ kernel) tiles stream through shared memory by cp.async,
   double-buffered; rows are padded by 16 bytes so that ldmatrix reads are free of bank
   conflicts. Full blocks skip the bitmap; partial blocks test it; keys past a block or the
   call and rows outside the call are zero-filled and masked; a row whose lse is -inf adds
   nothing.

   Determinism: no atomics. Each output element is summed by one thread in an order fixed by
   the sizes (q-blocks, rows and keys ascending, k-steps ascending inside mma). When the key
   tiles alone cannot fill the GPU and a kv head serves several query heads, the group is cut
   into hs contiguous head ranges, each thread block writes float32 partial dK/dV to scratch
   and a second kernel adds the ranges in ascending order; hs depends only on the sizes and
   the device's multiprocessor count, so a call repeats bitwise on one GPU. */
#include "cuda/attn_rules.cuh"
#include "cuda/mma.cuh"

namespace fxcu {
namespace {

/* A thread block of W warps (4 or 8) owns RT = 16 W rows (keys for dK/dV, queries for dQ),
   16 a warp, and streams the other side through shared memory BT = 64 rows at a time. Each
   warp computes S in halves of HALF columns to keep its registers for dK/dV or dQ. */
enum { BT = 64, HALF = 32 };

/* The tensor-core product and the packing for the element type. */
template <typename T> struct tc_type;
template <> struct tc_type<bf16> {
    static __device__ __forceinline__ void mma(float d[4], const uint32_t a[4], const uint32_t b[2])
    {
        mma_16816_bf16(d, a, b, d);
    }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) { return pack_bf16(lo, hi); }
};

/* ---- shared-memory tiles ------------------------------------------------------------------ */

/* Tiles of HD-element rows of 16-bit elements, LDS apart: 16 bytes of padding per row put the
   8 rows an ldmatrix reads on 8 different 16-byte bank groups. */
template <int HD> struct Tile {
    static constexpr int LDS = HD + 8, ELEMS = BT * LDS; /* ELEMS: a streamed tile */
};

/* Rows [row0, row0 + nvalid) of a row-major [., HD] tensor into the first ROWS rows of a
   tile by cp.async (NTH threads); rows from nvalid on are zeros. Each thread moves one
   column piece of every RSTEP-th row, so that its addresses are one pointer plus constants
   (no division or 64-bit product per piece in the loops that stream the tiles). */
template <int HD, int NTH, int ROWS>
__device__ __forceinline__ void tile_load(uint16_t *dst, const uint16_t *src, int64_t row0, int nvalid)
{
    constexpr int CPR = HD / 8, LDS = Tile<HD>::LDS; /* CPR: 16-byte pieces per row */
    if constexpr (NTH % CPR == 0 && ROWS % (NTH / CPR) == 0) {
        constexpr int RSTEP = NTH / CPR;
        const int r0 = threadIdx.x / CPR, c = threadIdx.x % CPR;
        const uint16_t *gsrc = src + (row0 + r0) * HD + c * 8;
        uint16_t *sdst = dst + r0 * LDS + c * 8;
#pragma unroll
        for (int it = 0; it < ROWS / RSTEP; it++) {
            const bool ok = r0 + it * RSTEP < nvalid;
            cp_async_16(sdst + it * RSTEP * LDS, ok ? gsrc + it * RSTEP * HD : src, ok ? 16 : 0);
        }
    } else {
        for (int i = threadIdx.x; i < ROWS * CPR; i += NTH) {
            const int r = i / CPR, c = i % CPR;
            const bool ok = r < nvalid;
            cp_async_16(dst + r * LDS + c * 8, ok ? src + (row0 + r) * HD + c * 8 : src, ok ? 16 : 0);
        }
    }
}

/* A operand (16 x 16, rows row0.., columns k0..) of a row-major tile. */
template <int HD> __device__ __forceinline__ void ld_a(uint32_t r[4], const uint16_t *t, int row0, int k0)
{
    const int l = threadIdx.x & 31, m = l >> 3;
    ldmatrix_x4(r, t + (row0 + (m & 1) * 8 + (l & 7)) * Tile<HD>::LDS + k0 + (m >> 1) * 8);
}

/* B operands of two n-tiles (n0.., n0 + 8..) at k-step k0 where B[k][n] = tile[n][k]:
   {r[0], r[1]} for n0, {r[2], r[3]} for n0 + 8. */
template <int HD> __device__ __forceinline__ void ld_b_rows(uint32_t r[4], const uint16_t *t, int n0, int k0)
{
    const int l = threadIdx.x & 31, m = l >> 3;
    ldmatrix_x4(r, t + (n0 + (m >> 1) * 8 + (l & 7)) * Tile<HD>::LDS + k0 + (m & 1) * 8);
}

/* The same where B[k][n] = tile[k][n] (transposed by ldmatrix). */
template <int HD> __device__ __forceinline__ void ld_b_cols(uint32_t r[4], const uint16_t *t, int k0, int n0)
{
    const int l = threadIdx.x & 31, m = l >> 3;
    ldmatrix_x4_trans(r, t + (k0 + (m & 1) * 8 + (l & 7)) * Tile<HD>::LDS + n0 + (m >> 1) * 8);
}

/* ---- scores ------------------------------------------------------------------------------- */

/* One visible pair from its dot products s = q.k and dp = dO.v: *p = exp(S' - lse) with
   lse2 = lse log2(e), and the return value: the gradient w.r.t. the raw score s * scale,
   before the scale (applied once to the sums). MOD: a.mod may be other than NONE. */
template <bool MOD>
__device__ __forceinline__ float pair_grad(const fx__cu_attn &a, float s, float dp, float lse2, float di, int64_t h,
                                           int64_t qpos, int64_t kpos, float *p)
{
    if (!MOD) {
        *p = exp2_fast(fmaf(s, a.scale * LOG2E, -lse2)); /* the product is hoisted out of the loops */
        return *p * (dp - di);
    }
    const float raw = s * a.scale;
    float m = raw, gf = 1.0f;
    if (a.mod == FX__CU_MOD_ALIBI) {
        m = raw + a.slopes[h] * (float)(kpos - qpos);
    } else if (a.mod == FX__CU_MOD_SOFTCAP) {
        const float th = tanhf(raw / a.cap);
        m = a.cap * th;
        gf = 1.0f - th * th;
    } else if (a.mod == FX__CU_MOD_REL_BIAS) {
        m = raw + a.table[(a.theads == 1 ? 0 : h) * a.tsize + rel_entry(a, qpos - kpos)];
    }
    *p = exp2_fast(fmaf(m, LOG2E, -lse2));
    return *p * (dp - di) * gf;
}

/* lse in the form pair_grad takes: +inf for a row that sees nothing (P = 0), NaN kept. */
__device__ __forceinline__ float lse_log2(float lse) { return lse == -INFINITY ? INFINITY : lse * LOG2E; }

/* Two floats as one 32-bit store of T (column pairs of an accumulator). */
template <typename T> __device__ __forceinline__ void store2(T *p, int64_t i, float lo, float hi)
{
    *(uint32_t *)(p + i) = tc_type<T>::pack(lo, hi);
}

/* ---- the order of the thread blocks --------------------------------------------------------- */

/* Thread block x's unit (returned: 0 .. per - 1, a row or key tile of a head) and head (*hd:
   0 .. nh - 1, batch-major) when every head has per units. The order the grid starts them
   in, not their work: heaviest first over groups of hsec heads. Within a group the units go
   by descending index (rev: the dQ kernel's row tiles, whose last q-blocks visit the most
   kv-blocks under a causal mask) or ascending (the dK/dV kernel's key tiles, whose first
   kv-blocks are visited by the most q-blocks), all the group's heads at one unit before the
   next, so the longest blocks start first on the whole GPU and the last wave holds the
   shortest. Each head walking its own units instead saw-tooths: the last heads' longest
   blocks start in the final waves and run alone. The group (what its blocks read of the
   other side) is sized by the launch to stay in L2; groups go in head order. */
__device__ __forceinline__ int64_t sched_order(int64_t x, int64_t per, int64_t nh, int64_t hsec, bool rev,
                                               int64_t *hd)
{
    const int64_t grp = x / (hsec * per), h0 = grp * hsec, n = min(hsec, nh - h0), w = x - grp * hsec * per;
    *hd = h0 + w % n;
    return rev ? per - 1 - w / n : w / n;
}

/* ---- dK, dV ------------------------------------------------------------------------------- */

/* A run of at most BT query rows of head h: positions [pos, pos + n) of the q-block starting at
   base, whose bitmap is at word offset boff (-1: a full block). */
struct QChunk {
    int64_t h, pos, n, base, boff;
};

/* The dK/dV block's walk: heads [h, hend) of the group, the q-blocks visiting kv-block kb (list
   entries [f, f1)), rows [pos, end) of the current q-block. */
struct QWalk {
    int64_t b, kb, h, hend, f, f1, pos, end, base, boff, nqb, nqboff;
};

/* nqb, nqboff: entry f's q-block (f itself without a mask) and bitmap, read when the entry
   before it is taken, so that moving to a new q-block (which decides the next tiles'
   addresses, before this chunk's products) does not wait on memory. */
__device__ __forceinline__ void qwalk_fetch(const fx__cu_attn &a, QWalk &w)
{
    if (w.f < w.f1) {
        w.nqb = a.has_mask ? (int64_t)a.m.q_idx[w.f] : w.f;
        w.nqboff = a.has_mask ? a.m.q_bits[w.f] : -1;
    }
}

__device__ __forceinline__ bool qwalk_next(const fx__cu_attn &a, QWalk &w, QChunk &c)
{
    for (;;) {
        if (w.pos < w.end) {
            c.h = w.h, c.pos = w.pos, c.n = min((int64_t)BT, w.end - w.pos), c.base = w.base, c.boff = w.boff;
            w.pos += c.n;
            return true;
        }
        if (w.f < w.f1) {
            const int64_t qb = w.nqb, boff = w.nqboff;
            w.f++;
            qwalk_fetch(a, w);
            if (a.has_mask) {
                if (qb < a.qb_lo || qb >= a.qb_lo + a.n_qb)
                    continue; /* a q-block outside this call's rows */
                w.base = qb * a.bq;
                w.boff = boff;
            } else {
                w.base = a.q_offset + qb * a.bq;
                w.boff = -1;
            }
            w.pos = max(w.base, a.q_offset);
            w.end = min(w.base + a.bq, a.q_offset + a.Lq);
            continue;
        }
        if (w.h + 1 >= w.hend)
            return false;
        w.h++;
        if (a.has_mask) {
            const int64_t col = mask_slot(a.m, w.b, w.h) * a.m.nkb + w.kb;
            w.f = a.m.q_ptr[col];
            w.f1 = a.m.q_ptr[col + 1];
        } else {
            w.f = 0;
            w.f1 = a.n_qb;
        }
        qwalk_fetch(a, w);
    }
}

/* Q and dO rows of a chunk into buffer tiles (cp.async). */
template <int HD, int NTH>
__device__ __forceinline__ void qchunk_load(const fx__cu_attn &a, const QChunk &c, uint16_t *Qs, uint16_t *dOs)
{
    const int64_t grow = c.h * a.Lq + c.pos - a.q_offset; /* a's pointers start at the batch */
    tile_load<HD, NTH, BT>(Qs, (const uint16_t *)a.q, grow, (int)c.n);
    tile_load<HD, NTH, BT>(dOs, (const uint16_t *)a.dout, grow, (int)c.n);
}

/* Row threadIdx.x of a chunk (threads 0 .. BT - 1): its lse (-inf past the chunk) and D_i,
   read into registers so that the loads can fly while the current chunk is used, then
   stored to shared memory in the form pair_grad takes. */
struct QRow {
    float lse, di;
};

__device__ __forceinline__ QRow qrow_read(const fx__cu_attn &a, const float *Di, const QChunk &c)
{
    QRow r = {-INFINITY, 0.0f};
    if (threadIdx.x < c.n) {
        const int64_t i = c.h * a.Lq + c.pos - a.q_offset + threadIdx.x;
        r.lse = a.lse[i];
        r.di = Di[i];
    }
    return r;
}

__device__ __forceinline__ void qrow_store(float *lse2, float *di, const QRow &r)
{
    if (threadIdx.x < BT) {
        lse2[threadIdx.x] = lse_log2(r.lse); /* +inf past the chunk: P = 0 there */
        di[threadIdx.x] = r.di;
    }
}

template <typename T, int HD, int W, bool MOD>
__global__ void __launch_bounds__(32 * W)
    dkv_tc_kernel(fx__cu_attn a, const float *Di, float *part, int hs, int64_t hsec)
{
    typedef tc_type<T> tc;
    constexpr int TE = Tile<HD>::ELEMS, NT = HD / 8, RT = 16 * W, NTH = 32 * W;
    FX_DYN_SMEM(float, sm);
    uint16_t *Ks = (uint16_t *)sm, *Vs = Ks + RT * Tile<HD>::LDS, *Qs = Vs + RT * Tile<HD>::LDS, *dOs = Qs + 2 * TE;
    float *lse_s = (float *)(dOs + 2 * TE), *di_s = lse_s + 2 * BT;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int64_t x;

    /* Key tiles of the first kv-blocks first, over groups of hsec KV heads (sched_order). */
    const int64_t nkt = (a.bk + RT - 1) / RT;
    const int64_t j = sched_order(blockIdx.x, a.nkb * nkt, a.B * a.Hkv, hsec, false, &x);
    const int64_t kc = j % nkt, kb = j / nkt, hkv = x % a.Hkv, b = x / a.Hkv;
    const int64_t kpos0 = kb * a.bk + kc * RT;
    const int nkeys = (int)min(min((int64_t)RT, a.bk - kc * RT), a.Lkv - kpos0);
    if (nkeys <= 0)
        return;
    const int64_t G = a.Hq / a.Hkv, split = blockIdx.y;
    /* The batch's rows: chunks index heads and rows from here. */
    fx__cu_attn ab = a;
    ab.q = (const uint16_t *)a.q + b * a.Hq * a.Lq * HD;
    ab.dout = (const uint16_t *)a.dout + b * a.Hq * a.Lq * HD;
    ab.lse = a.lse + b * a.Hq * a.Lq;
    const float *Dib = Di + b * a.Hq * a.Lq;

    const int64_t krow0 = (b * a.Hkv + hkv) * a.Lkv + kpos0;
    tile_load<HD, NTH, RT>(Ks, (const uint16_t *)a.k, krow0, nkeys);
    tile_load<HD, NTH, RT>(Vs, (const uint16_t *)a.v, krow0, nkeys);

    QWalk w;
    w.b = b, w.kb = kb;
    w.h = hkv * G + split * G / hs - 1, w.hend = hkv * G + (split + 1) * G / hs;
    w.f = w.f1 = w.pos = w.end = w.base = 0, w.boff = w.nqb = w.nqboff = -1;
    QChunk cur = {}, nxt = {};
    bool have = qwalk_next(ab, w, cur);
    static_assert(NTH >= BT, "a row of a chunk a thread");
    if (have) {
        qchunk_load<HD, NTH>(ab, cur, Qs, dOs);
        qrow_store(lse_s, di_s, qrow_read(ab, Dib, cur));
    }
    cp_async_commit();

    float dk[NT][4], dv[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            dk[j][i] = dv[j][i] = 0.0f;

    const int krow = warp * 16; /* this warp's keys in the tile */
    int buf = 0;
    while (have) {
        const bool more = qwalk_next(ab, w, nxt);
        QRow nrow = {-INFINITY, 0.0f};
        if (more) {
            qchunk_load<HD, NTH>(ab, nxt, Qs + (buf ^ 1) * TE, dOs + (buf ^ 1) * TE);
            nrow = qrow_read(ab, Dib, nxt); /* stored after this chunk's products */
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const uint16_t *Qb = Qs + buf * TE, *dOb = dOs + buf * TE;
        const float *lb = lse_s + buf * BT, *db = di_s + buf * BT;
#pragma unroll 1
        for (int qh = 0; qh < BT / HALF; qh++) {
            if (qh * HALF >= cur.n)
                break; /* uniform: rows past the chunk */
            float st[HALF / 8][4], dpt[HALF / 8][4];
#pragma unroll
            for (int j = 0; j < HALF / 8; j++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    st[j][i] = dpt[j][i] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                uint32_t ka[4], va[4];
                ld_a<HD>(ka, Ks, krow, kk * 16);
                ld_a<HD>(va, Vs, krow, kk * 16);
#pragma unroll
                for (int nn = 0; nn < HALF / 16; nn++) {
                    uint32_t qb[4], ob[4];
                    ld_b_rows<HD>(qb, Qb, qh * HALF + nn * 16, kk * 16);
                    ld_b_rows<HD>(ob, dOb, qh * HALF + nn * 16, kk * 16);
                    tc::mma(st[2 * nn], ka, qb);
                    tc::mma(st[2 * nn + 1], ka, qb + 2);
                    tc::mma(dpt[2 * nn], va, ob);
                    tc::mma(dpt[2 * nn + 1], va, ob + 2);
                }
            }
            /* P^T and dS^T, element (key, query) = (krow + g + 8 (i / 2), 8 j + 2 t + i % 2). */
            uint32_t pa[HALF / 16][4], da[HALF / 16][4];
#pragma unroll
            for (int j = 0; j < HALF / 8; j++) {
                float p[4], ds[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int key = krow + g + 8 * (i >> 1), qr = qh * HALF + 8 * j + 2 * t + (i & 1);
                    const int64_t qpos = cur.pos + qr, kpos = kpos0 + key, kin = kc * RT + key; /* in the block */
                    const float l2 = lb[qr];
                    bool vis = l2 != INFINITY;
                    if (vis && cur.boff >= 0)
                        vis = (a.m.bits[cur.boff + (qpos - cur.base) * a.m.bm_words + (kin >> 6)] >> (kin & 63)) & 1u;
                    p[i] = 0.0f, ds[i] = 0.0f;
                    if (vis)
                        ds[i] = pair_grad<MOD>(a, st[j][i], dpt[j][i], l2, db[qr], cur.h, qpos, kpos, &p[i]);
                }
                pa[j >> 1][(j & 1) * 2] = tc::pack(p[0], p[1]);
                pa[j >> 1][(j & 1) * 2 + 1] = tc::pack(p[2], p[3]);
                da[j >> 1][(j & 1) * 2] = tc::pack(ds[0], ds[1]);
                da[j >> 1][(j & 1) * 2 + 1] = tc::pack(ds[2], ds[3]);
            }
            /* dV += P^T dO, dK += dS^T Q over these HALF queries. */
#pragma unroll
            for (int kk = 0; kk < HALF / 16; kk++) {
#pragma unroll
                for (int nd = 0; nd < HD / 16; nd++) {
                    uint32_t ob[4], qb[4];
                    ld_b_cols<HD>(ob, dOb, qh * HALF + kk * 16, nd * 16);
                    ld_b_cols<HD>(qb, Qb, qh * HALF + kk * 16, nd * 16);
                    tc::mma(dv[2 * nd], pa[kk], ob);
                    tc::mma(dv[2 * nd + 1], pa[kk], ob + 2);
                    tc::mma(dk[2 * nd], da[kk], qb);
                    tc::mma(dk[2 * nd + 1], da[kk], qb + 2);
                }
            }
        }
        /* The next chunk's rows: the other buffer's, which every warp finished reading
           before the barrier that ended the last chunk. */
        if (more)
            qrow_store(lse_s + (buf ^ 1) * BT, di_s + (buf ^ 1) * BT, nrow);
        __syncthreads(); /* the buffer is refilled two chunks on */
        cur = nxt;
        have = more;
        buf ^= 1;
    }
    cp_async_wait<0>();

    /* Rows krow + g and krow + g + 8, columns 8 j + 2 t, + 1. */
    const int64_t nk = a.B * a.Hkv * a.Lkv;
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
        const int key = krow + g + 8 * hi;
        if (key >= nkeys)
            continue;
        const int64_t row = krow0 + key;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const int col = 8 * j + 2 * t;
            const float k0 = dk[j][2 * hi] * a.scale, k1 = dk[j][2 * hi + 1] * a.scale;
            const float v0 = dv[j][2 * hi], v1 = dv[j][2 * hi + 1];
            if (hs == 1) {
                store2((T *)a.dk, row * HD + col, k0, k1);
                store2((T *)a.dv, row * HD + col, v0, v1);
            } else {
                float *pk = part + (split * nk + row) * HD + col, *pv = pk + (int64_t)hs * nk * HD;
                pk[0] = k0, pk[1] = k1;
                pv[0] = v0, pv[1] = v1;
            }
        }
    }
}

/* dK, dV from the hs head ranges' partials, added in range order. */
template <typename T, int HD> __global__ void dkv_reduce_kernel(fx__cu_attn a, const float *part, int hs)
{
    const int64_t nk = a.B * a.Hkv * a.Lkv, n = nk * HD;
    const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 2;
    if (i >= 2 * n)
        return;
    const bool isv = i >= n;
    const int64_t e = isv ? i - n : i;
    const float *p = part + (isv ? (int64_t)hs * n : 0) + e;
    float lo = 0.0f, hi = 0.0f;
    for (int s = 0; s < hs; s++) {
        lo += p[(int64_t)s * n];
        hi += p[(int64_t)s * n + 1];
    }
    store2((T *)(isv ? a.dv : a.dk), e, lo, hi);
}

/* ---- dQ ----------------------------------------------------------------------------------- */

/* A run of at most BT keys: positions [pos, pos + n) of the kv-block starting at base (bitmap
   at word offset boff, -1: full). */
struct KChunk {
    int64_t pos, n, base, boff;
};

/* The dQ block's walk: list entries [e, e1), keys [pos, end) of the current kv-block. nkb,
   nboff: entry e's block and bitmap, read when the entry before it is taken, so that moving
   to a new kv-block (which decides the next tiles' addresses) does not wait on memory. */
struct KWalk {
    int64_t e, e1, pos, end, base, boff, nkb, nboff;
};

__device__ __forceinline__ void kwalk_fetch(const fx__cu_attn &a, KWalk &w)
{
    if (w.e < w.e1) {
        w.nkb = a.has_mask ? (int64_t)a.m.kv_idx[w.e] : w.e;
        w.nboff = a.has_mask ? a.m.kv_bits[w.e] : -1;
    }
}

__device__ __forceinline__ bool kwalk_next(const fx__cu_attn &a, KWalk &w, KChunk &c)
{
    for (;;) {
        if (w.pos < w.end) {
            c.pos = w.pos, c.n = min((int64_t)BT, w.end - w.pos), c.base = w.base, c.boff = w.boff;
            w.pos += c.n;
            return true;
        }
        if (w.e >= w.e1)
            return false;
        w.base = w.nkb * a.bk;
        w.boff = w.nboff;
        w.e++;
        kwalk_fetch(a, w);
        w.pos = w.base;
        w.end = min(w.base + a.bk, a.Lkv); /* empty for a block past this call's keys */
    }
}

template <typename T, int HD, int W, bool MOD>
__global__ void __launch_bounds__(32 * W) dq_tc_kernel(fx__cu_attn a, const float *Di, int64_t hsec)
{
    typedef tc_type<T> tc;
    constexpr int TE = Tile<HD>::ELEMS, NT = HD / 8, RT = 16 * W, NTH = 32 * W;
    FX_DYN_SMEM(float, sm);
    uint16_t *Qs = (uint16_t *)sm, *dOs = Qs + RT * Tile<HD>::LDS, *Ks = dOs + RT * Tile<HD>::LDS, *Vs = Ks + 2 * TE;
    float *lse_s = (float *)(Vs + 2 * TE), *di_s = lse_s + RT;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;

    /* Row blocks of the last q-blocks first, over groups of hsec heads (sched_order). */
    const int64_t nrc = (a.bq + RT - 1) / RT;
    int64_t x;
    const int64_t j = sched_order(blockIdx.x, a.n_qb * nrc, a.B * a.Hq, hsec, true, &x);
    const int64_t rc = j % nrc, qbi = j / nrc, h = x % a.Hq, b = x / a.Hq;
    const int64_t base = a.has_mask ? (a.qb_lo + qbi) * a.bq : a.q_offset + qbi * a.bq;
    const int64_t lo = max(base + rc * RT, a.q_offset);
    const int64_t hi = min(min(base + rc * RT + RT, base + a.bq), a.q_offset + a.Lq);
    if (lo >= hi)
        return;
    const int nr = (int)(hi - lo);
    const int64_t qrow0 = (b * a.Hq + h) * a.Lq + (lo - a.q_offset);
    const int64_t kbase = (b * a.Hkv + h / (a.Hq / a.Hkv)) * a.Lkv;
    tile_load<HD, NTH, RT>(Qs, (const uint16_t *)a.q, qrow0, nr);
    tile_load<HD, NTH, RT>(dOs, (const uint16_t *)a.dout, qrow0, nr);
    cp_async_commit(); /* a group of its own: Q goes to registers before the first keys land */
    for (int r = threadIdx.x; r < RT; r += NTH) {
        lse_s[r] = r < nr ? lse_log2(a.lse[qrow0 + r]) : INFINITY;
        di_s[r] = r < nr ? Di[qrow0 + r] : 0.0f;
    }

    KWalk w;
    if (a.has_mask) {
        const int64_t r = mask_slot(a.m, b, h) * a.m.nqb + a.qb_lo + qbi;
        w.e = a.m.kv_ptr[r], w.e1 = a.m.kv_ptr[r + 1];
    } else {
        w.e = 0, w.e1 = a.nkb;
    }
    w.pos = w.end = w.base = 0, w.boff = w.nkb = w.nboff = -1;
    kwalk_fetch(a, w);
    KChunk cur = {}, nxt = {};
    bool have = kwalk_next(a, w, cur);
    if (have) {
        tile_load<HD, NTH, BT>(Ks, (const uint16_t *)a.k, kbase + cur.pos, (int)cur.n);
        tile_load<HD, NTH, BT>(Vs, (const uint16_t *)a.v, kbase + cur.pos, (int)cur.n);
    }
    cp_async_commit();

    const int qr = warp * 16; /* this warp's rows in the tile */
    __syncthreads();          /* lse_s, di_s */
    float l2[2], dr[2];
    int64_t qpos[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l2[i] = lse_s[qr + g + 8 * i];
        dr[i] = di_s[qr + g + 8 * i];
        qpos[i] = lo + qr + g + 8 * i;
    }
    float dq[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            dq[j][i] = 0.0f;
    /* The warp's Q fragments stay in registers for the whole walk (the same for every key
       tile); dO's are read from shared memory at each half, for want of registers. */
    uint32_t qf[HD / 16][4];
    cp_async_wait<1>();
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        ld_a<HD>(qf[kk], Qs, qr, kk * 16);

    int buf = 0;
    while (have) {
        const bool more = kwalk_next(a, w, nxt);
        if (more) {
            tile_load<HD, NTH, BT>(Ks + (buf ^ 1) * TE, (const uint16_t *)a.k, kbase + nxt.pos, (int)nxt.n);
            tile_load<HD, NTH, BT>(Vs + (buf ^ 1) * TE, (const uint16_t *)a.v, kbase + nxt.pos, (int)nxt.n);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const uint16_t *Kb = Ks + buf * TE, *Vb = Vs + buf * TE;
        /* The bitmap words of this thread's two rows for these keys: chunks start at multiples of
           BT = 64 keys into the block, so one word each. */
        uint64_t bw[2] = {~0ull, ~0ull};
        if (cur.boff >= 0)
#pragma unroll
            for (int i = 0; i < 2; i++)
                if (qpos[i] < hi)
                    bw[i] = a.m.bits[cur.boff + (qpos[i] - base) * a.m.bm_words + (cur.pos - cur.base) / BT];
#pragma unroll 1
        for (int kh = 0; kh < BT / HALF; kh++) {
            if (kh * HALF >= cur.n)
                break;
            float s[HALF / 8][4], dp[HALF / 8][4];
#pragma unroll
            for (int j = 0; j < HALF / 8; j++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    s[j][i] = dp[j][i] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                uint32_t oa[4];
                ld_a<HD>(oa, dOs, qr, kk * 16);
#pragma unroll
                for (int nn = 0; nn < HALF / 16; nn++) {
                    uint32_t kb2[4], vb2[4];
                    ld_b_rows<HD>(kb2, Kb, kh * HALF + nn * 16, kk * 16);
                    ld_b_rows<HD>(vb2, Vb, kh * HALF + nn * 16, kk * 16);
                    tc::mma(s[2 * nn], qf[kk], kb2);
                    tc::mma(s[2 * nn + 1], qf[kk], kb2 + 2);
                    tc::mma(dp[2 * nn], oa, vb2);
                    tc::mma(dp[2 * nn + 1], oa, vb2 + 2);
                }
            }
            /* dS, element (row, key) = (qr + g + 8 (i / 2), 8 j + 2 t + i % 2). */
            uint32_t da[HALF / 16][4];
#pragma unroll
            for (int j = 0; j < HALF / 8; j++) {
                float ds[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int r = i >> 1, key = kh * HALF + 8 * j + 2 * t + (i & 1);
                    const bool vis = key < cur.n && l2[r] != INFINITY && ((bw[r] >> key) & 1u);
                    float p;
                    ds[i] = vis ? pair_grad<MOD>(a, s[j][i], dp[j][i], l2[r], dr[r], h, qpos[r], cur.pos + key, &p)
                                : 0.0f;
                }
                da[j >> 1][(j & 1) * 2] = tc::pack(ds[0], ds[1]);
                da[j >> 1][(j & 1) * 2 + 1] = tc::pack(ds[2], ds[3]);
            }
            /* dQ += dS K over these HALF keys. */
#pragma unroll
            for (int kk = 0; kk < HALF / 16; kk++) {
#pragma unroll
                for (int nd = 0; nd < HD / 16; nd++) {
                    uint32_t kb2[4];
                    ld_b_cols<HD>(kb2, Kb, kh * HALF + kk * 16, nd * 16);
                    tc::mma(dq[2 * nd], da[kk], kb2);
                    tc::mma(dq[2 * nd + 1], da[kk], kb2 + 2);
                }
            }
        }
        __syncthreads();
        cur = nxt;
        have = more;
        buf ^= 1;
    }
    cp_async_wait<0>();

#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = qr + g + 8 * i;
        if (r >= nr)
            continue;
#pragma unroll
        for (int j = 0; j < NT; j++)
            store2((T *)a.dq, (qrow0 + r) * HD + 8 * j + 2 * t, dq[j][2 * i] * a.scale, dq[j][2 * i + 1] * a.scale);
    }
}

/* ---- launcher ----------------------------------------------------------------------------- */

/* Shared memory: the RT owned rows (two tiles), two buffers of two streamed tiles, and the
   rows' lse and D_i. */
template <int HD, int W> constexpr size_t dkv_smem()
{
    return (size_t)(2 * 16 * W + 4 * BT) * Tile<HD>::LDS * 2 + 4 * BT * sizeof(float);
}
template <int HD, int W> constexpr size_t dq_smem()
{
    return (size_t)(2 * 16 * W + 4 * BT) * Tile<HD>::LDS * 2 + 2 * 16 * W * sizeof(float);
}

int tc_status(const char *what)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? FX_OK : fx__cuda_status((int)e, what);
}

int too_many_blocks(void)
{
    return fx__error(FX_EUNSUPPORTED, "attention backward: too many thread blocks for the grid; use larger mask "
                                      "blocks or split the batch");
}

/* Warps per thread block: 4 (64 owned rows). The 8-warp shape (128 rows, half the global
   reads) was slower on an H200 (causal 1x16x8192x128: 6.34 ms against 5.77; sliding 1024:
   1.87 against 1.76), its 231-253 registers allowing one block per multiprocessor.
   FLEXC_CUDA_BWD_WARPS=8 runs it where the mask's blocks are a multiple of 128 rows. */
int warps_for(int64_t block)
{
    const char *e = getenv("FLEXC_CUDA_BWD_WARPS");
    return e && atoi(e) == 8 && block % 128 == 0 ? 8 : 4;
}

/* Head ranges per GQA group for the dK/dV kernel: enough thread blocks for two waves. */
int head_splits(const fx__cu_attn *a, int64_t blocks)
{
    const int64_t G = a->Hq / a->Hkv;
    if (G == 1)
        return 1;
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        (void)cudaGetLastError(); /* not the launches' error, which tc_status reads */
        sms = 132;
    }
    const int64_t want = 2 * (int64_t)sms;
    if (blocks >= want)
        return 1;
    const int64_t hs = (want + blocks - 1) / blocks;
    return (int)(hs < G ? hs : G);
}

/* Heads a scheduling group (sched_order): as many as keep the other side's tensors that
   their blocks stream within 32 MiB (most of the L2 of an H100 or H200): K and V of the KV
   heads for dQ (whole GQA groups of query heads), Q and dO of the query heads a KV head
   serves for dK/dV (8 heads at L = 8192, D = 128 either way). FLEXC_CUDA_L2_HEADS=n sets n
   KV heads a group instead (the order changes, the results do not; the tests use it for
   groups that do not divide the heads). Returns the group in KV heads. */
int64_t sched_kv_heads(const fx__cu_attn *a, int64_t bytes_per_kv_head)
{
    int64_t n = bytes_per_kv_head > 0 ? ((int64_t)32 << 20) / bytes_per_kv_head : 0;
    const char *e = getenv("FLEXC_CUDA_L2_HEADS");
    if (e && atoi(e) > 0)
        n = atoi(e);
    n = n < 1 ? 1 : n;
    return n < a->B * a->Hkv ? n : a->B * a->Hkv;
}

template <typename T, int HD, int W, bool MOD> int launch_dq(const fx__cu_attn *a, const float *Di, cudaStream_t st)
{
    const int64_t blocks = a->B * a->Hq * a->n_qb * ((a->bq + 16 * W - 1) / (16 * W));
    if (blocks > INT32_MAX)
        return too_many_blocks();
    /* Named first: a template's commas would split the launch macro's arguments. */
    auto k = &dq_tc_kernel<T, HD, W, MOD>;
    const size_t smem = dq_smem<HD, W>();
    int rc = allow_smem(k, smem, "attention backward: dq");
    if (rc != FX_OK)
        return rc;
    const int64_t G = a->Hq / a->Hkv, hsec = G * sched_kv_heads(a, a->Lkv * (a->D + a->Dv) * 2);
    FX_LAUNCH(k, (unsigned)blocks, 32 * W, smem, st)(*a, Di, hsec);
    return tc_status("attention backward: dq");
}

template <typename T, int HD, int W, bool MOD> int launch_dkv(const fx__cu_attn *a, const float *Di, cudaStream_t st)
{
    const int64_t blocks = a->B * a->Hkv * a->nkb * ((a->bk + 16 * W - 1) / (16 * W));
    if (blocks > INT32_MAX)
        return too_many_blocks();
    auto k = &dkv_tc_kernel<T, HD, W, MOD>;
    auto red = &dkv_reduce_kernel<T, HD>;
    const size_t smem = dkv_smem<HD, W>();
    int rc = allow_smem(k, smem, "attention backward: dk, dv");
    if (rc != FX_OK)
        return rc;
    const int hs = head_splits(a, blocks);
    float *part = NULL;
    const int64_t n = a->B * a->Hkv * a->Lkv * HD;
    if (hs > 1) {
        cudaError_t e = cudaMallocAsync((void **)&part, (size_t)hs * 2 * (size_t)n * sizeof(float), st);
        if (e != cudaSuccess)
            return fx__cuda_status((int)e, "attention backward: dk, dv partials");
    }
    const int64_t hsec = sched_kv_heads(a, a->Hq / a->Hkv * a->Lq * (a->D + a->Dv) * 2);
    FX_LAUNCH(k, dim3((unsigned)blocks, (unsigned)hs), 32 * W, smem, st)(*a, Di, part, hs, hsec);
    rc = tc_status("attention backward: dk, dv");
    if (rc == FX_OK && hs > 1) {
        FX_LAUNCH(red, (unsigned)((n + 255) / 256), 256, 0, st)(*a, part, hs);
        rc = tc_status("attention backward: dk, dv sums");
    }
    if (part)
        (void)cudaFreeAsync(part, st);
    return rc;
}

template <typename T, int HD, bool MOD> int launch_tc(const fx__cu_attn *a, const float *Di)
{
    cudaStream_t st = (cudaStream_t)a->stream;
    int rc = warps_for(a->bq) == 8 ? launch_dq<T, HD, 8, MOD>(a, Di, st) : launch_dq<T, HD, 4, MOD>(a, Di, st);
    if (rc == FX_OK)
        rc = warps_for(a->bk) == 8 ? launch_dkv<T, HD, 8, MOD>(a, Di, st) : launch_dkv<T, HD, 4, MOD>(a, Di, st);
    return rc;
}

template <typename T, int HD> int launch_tc_mod(const fx__cu_attn *a, const float *Di)
{
    return a->mod == FX__CU_MOD_NONE ? launch_tc<T, HD, false>(a, Di) : launch_tc<T, HD, true>(a, Di);
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

} // namespace
} // namespace fxcu

/* True when the tensor-core backward takes this call: bfloat16, D = Dv = 32, 64, 96 or 128
   (larger heads would not keep dK and dV in registers), and every tensor 16-byte aligned
   (cp.async and the paired stores). */
extern "C" int fx__cu_attn_backward_tc_ok(const fx__cu_attn *a)
{
    using fxcu::aligned16;
    if (!a->bf16 || a->D != a->Dv || (a->D != 32 && a->D != 64 && a->D != 96 && a->D != 128))
        return 0;
    return aligned16(a->q) && aligned16(a->k) && aligned16(a->v) && aligned16(a->dout) && aligned16(a->dq) &&
           aligned16(a->dk) && aligned16(a->dv);
}

/* dQ, dK, dV of a call fx__cu_attn_backward_tc_ok() accepts, from the row sums Di; queued on
   the call's stream, not waited for. */
extern "C" int fx__cu_attn_backward_tc(const fx__cu_attn *a, const float *Di)
{
    switch (a->D) {
    case 32:
        return fxcu::launch_tc_mod<fxcu::bf16, 32>(a, Di);
    case 64:
        return fxcu::launch_tc_mod<fxcu::bf16, 64>(a, Di);
    case 96:
        return fxcu::launch_tc_mod<fxcu::bf16, 96>(a, Di);
    default:
        return fxcu::launch_tc_mod<fxcu::bf16, 128>(a, Di);
    }
}
