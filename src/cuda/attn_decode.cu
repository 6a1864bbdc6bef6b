/* FlexAttention forward for few query rows (decoding): one thread block per (batch, KV head,
   row group, KV split) reads each K and V row of its split once for every query row of the
   GQA group (all G query heads times all Lq positions, at most RT rows a block), so the
   cache is read once per KV head instead of once per query head.

   Memory-bound by design, so K and V stream through shared memory in tiles of 16 KiB (each
   thread's 64 + 64 bytes, copied by cp.async and read back by the same thread), DSTAGES = 4
   tiles rotating: while a tile's products run, the next three are in flight. A lane group of
   D / 8 lanes takes a few keys of each tile, 8 elements a lane; the lanes keep their slice
   of the query rows and of the output in registers, and the dot products are summed across
   the group by shuffles (the first level splits the keys between the group's halves, which
   turn their half into probabilities and trade them back). Arithmetic is float32 (scores in
   base 2, exp2 by the hardware).
   Each lane group runs its own online softmax over its share of the keys; at the end the
   groups are merged in group order, and the splits (when there are several) in split order
   by a second kernel. No atomics: the result is the same on every run.

   Sizes (nvcc -Xptxas -v, sm_90a): bfloat16, D = 128, 4 rows a block (G = 4, Lq = 1): 156
   registers and 64 KiB of stages, 3 blocks (12 warps) a multiprocessor, 3 x 48 KiB = 144 KiB
   in flight a multiprocessor during the products (96 KiB while a block waits on a tile),
   against the ~25 KiB that 4.2 TB/s at ~700 ns of latency needs. 8 rows: about 250
   registers, 2 blocks.

   Masks: per window of DWIN kv-blocks, the rows' visit lists are walked, each row with its
   own cursor, into each row's view of each block and the list of blocks some row visits;
   only those are streamed (a block no row visits is never read), a partial block tests the
   bitmap per row and key, keys past a block's end arrive as zeros and score -inf. Score mods
   and q_offset as in attention.cu. Calls outside what this kernel takes
   (fx__cu_attn_decode_fits) go to the general forward. */
#include "cuda/attn_rules.cuh"
#include "cuda/mma.cuh"

namespace fxcu {
namespace {

enum { DTHREADS = 128, DWARPS = DTHREADS / 32, DROWS = 64, DPOS = 8, DMAXSPLIT = 64 };

/* ---- 16-byte loads ------------------------------------------------------------------------- */

__device__ __forceinline__ uint4 ld16(const void *p)
{
#ifdef FX_CUDA_EMU
    return *(const uint4 *)p;
#else
    return __ldg((const uint4 *)p);
#endif
}

__device__ __forceinline__ float bits_float(unsigned u)
{
#ifdef FX_CUDA_EMU
    float f;
    memcpy(&f, &u, 4);
    return f;
#else
    return __uint_as_float(u);
#endif
}

/* 16-byte words a lane loads for its 8 elements of a row. */
template <typename T> struct Words {
    enum { N = 8 * (int)sizeof(T) / 16 };
};

/* Raw words to 8 floats. */
template <typename T> __device__ __forceinline__ void unpack8(const uint4 *w, float *f);
template <> __device__ __forceinline__ void unpack8<float>(const uint4 *w, float *f)
{
#pragma unroll
    for (int i = 0; i < 2; i++) {
        f[4 * i + 0] = bits_float(w[i].x);
        f[4 * i + 1] = bits_float(w[i].y);
        f[4 * i + 2] = bits_float(w[i].z);
        f[4 * i + 3] = bits_float(w[i].w);
    }
}
template <> __device__ __forceinline__ void unpack8<bf16>(const uint4 *w, float *f)
{
    const unsigned u[4] = {w[0].x, w[0].y, w[0].z, w[0].w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = bits_float(u[i] << 16);
        f[2 * i + 1] = bits_float(u[i] & 0xffff0000u);
    }
}

/* ---- the kernel ---------------------------------------------------------------------------- */

/* Keys a lane group takes from one tile: 64 bytes a lane of K and as many of V. */
template <typename T> struct KeysPerStep {
    enum { N = sizeof(T) == 2 ? 4 : 2 };
};

/* The K/V pipeline. A tile is the block's DTHREADS x 128 bytes (16 KiB: 32 keys at D = 128
   in bfloat16, 16 in float32, in general 8192 / (D sizeof(T)) keys); each thread copies its
   own 64 + 64 bytes of it into shared memory by cp.async and later reads them back itself,
   so the pipeline needs no barrier. DSTAGES tiles rotate: tile c + DSTAGES - 1 is issued
   once tile c is in (into the stage tile c - 1 left), so that DSTAGES - 1 tiles, 48 KiB a
   block, are in flight during tile c's products. DWIN: kv-blocks whose per-row views are
   staged at once (a window). */
enum { DSTAGES = 4, DTILE_WORDS = 8, DWIN = 32 };

/* LG: lanes per key (D / 8); RT: query rows per block. Block (x = (b, hkv, row group), y =
   split). With nsplit == 1 the block writes out and lse; else its partial state (o, m, l per
   row, attention.cu's layout) for decode_combine. */
template <typename T, int LG, int RT>
__global__ void __launch_bounds__(DTHREADS) decode_kernel(fx__cu_attn a, int64_t ngroups, int nsplit, float *part)
{
    constexpr int KB = KeysPerStep<T>::N, KH = KB / 2, W = Words<T>::N, NG = DTHREADS / LG, TK = NG * KB;
    static_assert(2 * KB * W == DTILE_WORDS, "a thread's share of a tile");
    FX_DYN_SMEM(uint4, smv);
    float *sm = (float *)smv; /* after the key loop: the lane groups' states */
    const int tid = threadIdx.x, gl = tid % LG, grp = tid / LG;
    const int64_t D = a.D, G = a.Hq / a.Hkv, R = a.Lq * G;
    int64_t x = blockIdx.x;
    const int64_t rg = x % ngroups;
    x /= ngroups;
    const int64_t hkv = x % a.Hkv, b = x / a.Hkv;
    const int split = (int)blockIdx.y;
    const int nr = (int)min((int64_t)RT, R - rg * RT);
    const int64_t kvbase = (b * a.Hkv + hkv) * a.Lkv;
    const T *k = (const T *)a.k, *v = (const T *)a.v, *q = (const T *)a.q;

    /* The rows: row rg RT + rr is query head hkv G + r / Lq at position q_offset + r % Lq.
       What the key loop needs of them lives in shared memory (registers go to the query and
       output slices); thread rr < nr walks row rr's visit list. Per window of DWIN
       kv-blocks: each row's view of each block (not visited, full: -1, or partial: the
       bitmap offset) and the list of blocks some row visits. */
    __shared__ int64_t s_h[RT], s_qpos[RT], s_qbase[RT], s_boff[DWIN][RT];
    __shared__ int s_vis[DWIN][RT], s_list[DWIN], s_nlist;
    float qf[RT][8], o[RT][8], mrow[RT], lrow[RT];
#pragma unroll
    for (int rr = 0; rr < RT; rr++) {
        const int64_t r = min(rg * RT + rr, R - 1); /* rows past R repeat the last (unused) */
        const int64_t gr = (b * a.Hq + hkv * G + r / a.Lq) * a.Lq + r % a.Lq;
        mrow[rr] = -INFINITY;
        lrow[rr] = 0.0f;
        uint4 w[W];
#pragma unroll
        for (int i = 0; i < W; i++)
            w[i] = ld16(q + gr * D + gl * 8 + i * (8 / W));
        unpack8<T>(w, qf[rr]);
#pragma unroll
        for (int e = 0; e < 8; e++)
            o[rr][e] = 0.0f;
    }
    /* Each row's mask row, and the span of kv-blocks the rows visit. */
    int64_t lo_kb = 0, hi_kb = a.nkb - 1, cur = 0, end = 0;
    if (a.has_mask) {
        lo_kb = INT64_MAX, hi_kb = -1;
        for (int rr = 0; rr < nr; rr++) {
            const int64_t r = rg * RT + rr, h = hkv * G + r / a.Lq, qb = (a.q_offset + r % a.Lq) / a.bq;
            const int64_t mr = ((a.m.B == 1 ? 0 : b) * a.m.H + (a.m.H == 1 ? 0 : h)) * a.m.nqb + qb;
            const int64_t c0 = a.m.kv_ptr[mr], c1 = a.m.kv_ptr[mr + 1];
            if (c0 < c1) {
                lo_kb = min(lo_kb, (int64_t)a.m.kv_idx[c0]);
                hi_kb = max(hi_kb, (int64_t)a.m.kv_idx[c1 - 1]);
            }
            if (tid == rr)
                cur = c0, end = c1;
        }
        hi_kb = min(hi_kb, a.nkb - 1); /* blocks past this call's keys */
    }
    if (tid < RT) {
        const int64_t r = min(rg * RT + tid, R - 1);
        s_h[tid] = hkv * G + r / a.Lq;
        s_qpos[tid] = a.q_offset + r % a.Lq;
        s_qbase[tid] = a.has_mask ? s_qpos[tid] / a.bq * a.bq : 0;
    }

    /* This split's kv-blocks: an even share of the rows' span. */
    int64_t s0 = 0, s1 = 0;
    if (hi_kb >= lo_kb) {
        const int64_t per = (hi_kb - lo_kb + nsplit) / nsplit;
        s0 = min(hi_kb + 1, lo_kb + split * per);
        s1 = min(hi_kb + 1, s0 + per);
    }
    if (a.has_mask && tid < nr) { /* the cursor to the first entry >= s0 */
        int64_t hi = end;
        while (cur < hi) {
            const int64_t mid = cur + (hi - cur) / 2;
            if (a.m.kv_idx[mid] < s0)
                cur = mid + 1;
            else
                hi = mid;
        }
    }

    /* Tile t of a window: kv-block w0 + s_list[e], keys k0 + j for j in [jt, jt + TK) of
       the block's nk; this thread's keys are jt + grp KB + u. */
    struct Tile {
        int e, jt;
    };
    const int64_t bk = a.bk;
    for (int64_t w0 = s0; w0 < s1; w0 += DWIN) {
        const int nw = (int)min((int64_t)DWIN, s1 - w0);
        __syncthreads(); /* the previous window's views are read */
        if (tid < RT)
            for (int w = 0; w < nw; w++) {
                bool vis = tid < nr;
                int64_t boff = -1;
                if (a.has_mask && vis) {
                    while (cur < end && a.m.kv_idx[cur] < w0 + w)
                        cur++;
                    vis = cur < end && a.m.kv_idx[cur] == w0 + w;
                    boff = vis ? a.m.kv_bits[cur] : -1;
                }
                s_vis[w][tid] = vis;
                s_boff[w][tid] = boff;
            }
        __syncthreads();
        if (tid == 0) {
            int n = 0;
            for (int w = 0; w < nw; w++) {
                bool any = false;
                for (int rr = 0; rr < RT; rr++)
                    any |= s_vis[w][rr] != 0;
                if (any)
                    s_list[n++] = w;
            }
            s_nlist = n;
        }
        __syncthreads();
        const int nl = s_nlist;
        auto block_keys = [&](int e) { return (int)min(bk, a.Lkv - (w0 + s_list[e]) * bk); };
        auto next = [&](Tile &t) {
            t.jt += TK;
            if (t.jt >= block_keys(t.e))
                t.e++, t.jt = 0;
        };
        /* Issues tile t into stage st, or nothing past the list (an empty group all the same,
           so that the waits count tiles). Keys past the block's end are zeros. */
        auto issue = [&](const Tile &t, int st) {
            if (t.e < nl) {
                const int64_t k0 = (w0 + s_list[t.e]) * bk;
                const int nk = block_keys(t.e);
                uint4 *dst = smv + (int64_t)st * DTILE_WORDS * DTHREADS + tid;
#pragma unroll
                for (int u = 0; u < KB; u++) {
                    const int j = t.jt + grp * KB + u;
                    const int64_t off = (kvbase + k0 + (j < nk ? j : 0)) * D + gl * 8;
                    const int bytes = j < nk ? 16 : 0;
#pragma unroll
                    for (int i = 0; i < W; i++) {
                        cp_async_16(dst + (u * W + i) * DTHREADS, k + off + i * (8 / W), bytes);
                        cp_async_16(dst + (KB * W + u * W + i) * DTHREADS, v + off + i * (8 / W), bytes);
                    }
                }
            }
            cp_async_commit();
        };
        Tile pt = {0, 0}, ct = {0, 0};
#pragma unroll
        for (int st = 0; st < DSTAGES - 1; st++) {
            issue(pt, st);
            if (pt.e < nl)
                next(pt);
        }
        for (int c = 0; ct.e < nl; c++) {
            cp_async_wait<DSTAGES - 2>(); /* this thread's share of tile c is in */
            /* Tile c + DSTAGES - 1 into the stage tile c - 1 left (read by this thread only,
               one tile ago); then tile c's products while DSTAGES - 1 tiles are in flight. */
            issue(pt, (c + DSTAGES - 1) % DSTAGES);
            if (pt.e < nl)
                next(pt);
            const int w = s_list[ct.e];
            const int64_t k0 = (w0 + w) * bk;
            const int nk = block_keys(ct.e), t0 = ct.jt;
            next(ct);
            const uint4 *src = smv + (c % DSTAGES) * DTILE_WORDS * DTHREADS + tid;
            float s[RT][KB];
#pragma unroll
            for (int u = 0; u < KB; u++) {
                uint4 kw[W];
#pragma unroll
                for (int i = 0; i < W; i++)
                    kw[i] = src[(u * W + i) * DTHREADS];
                float kf[8];
                unpack8<T>(kw, kf);
#pragma unroll
                for (int rr = 0; rr < RT; rr++) {
                    float acc = 0.0f;
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        acc += qf[rr][e] * kf[e];
                    s[rr][u] = acc;
                }
            }
            /* Sums across the lane group. The first level splits the keys: the lower half of
               the group goes on with keys 0 .. KH - 1, the upper with KH .. KB - 1 (both
               halves add lower + upper); then a butterfly in each half, so that every lane
               of a half holds the same sums. */
            const bool hi = (gl & (LG / 2)) != 0;
            float sh[RT][KH];
#pragma unroll
            for (int rr = 0; rr < RT; rr++)
#pragma unroll
                for (int u = 0; u < KH; u++) {
                    const float mine = hi ? s[rr][u + KH] : s[rr][u], send = hi ? s[rr][u] : s[rr][u + KH];
                    const float got = __shfl_xor_sync(0xffffffffu, send, LG / 2);
                    sh[rr][u] = hi ? got + mine : mine + got;
                }
#pragma unroll
            for (int off = LG / 4; off > 0; off >>= 1)
#pragma unroll
                for (int rr = 0; rr < RT; rr++)
#pragma unroll
                    for (int u = 0; u < KH; u++)
                        sh[rr][u] += __shfl_xor_sync(0xffffffffu, sh[rr][u], off);
            /* Per row: each half's scores to probabilities, the maximum and the sum across
               the halves, every probability back in s for o += p V; act: rows that take this
               tile's values (uniform over the lane group). The shuffles run for every row
               some row of the block visits, in every lane. */
            bool act[RT];
#pragma unroll
            for (int rr = 0; rr < RT; rr++) {
                act[rr] = false;
                if (!s_vis[w][rr])
                    continue; /* uniform over the block */
                const int64_t boff = s_boff[w][rr], qp = s_qpos[rr];
                float mb = -INFINITY;
#pragma unroll
                for (int u = 0; u < KH; u++) {
                    const int j = t0 + grp * KB + (hi ? u + KH : u);
                    /* Scores and row maxima in base 2 (times log2 e) within the key
                       loop; the states handed on are in base e again. */
                    float sc = -INFINITY;
                    if (j < nk && (boff < 0 || mask_bit(a.m, boff, qp - s_qbase[rr], j)))
                        sc = score_mod(a, sh[rr][u] * a.scale, s_h[rr], qp, k0 + j) * LOG2E;
                    sh[rr][u] = sc;
                    mb = nmax(mb, sc);
                }
                const float mo = __shfl_xor_sync(0xffffffffu, mb, LG / 2);
                const float mnew = nmax(mrow[rr], hi ? nmax(mo, mb) : nmax(mb, mo));
                const bool live = mnew != -INFINITY; /* else nothing visible to this row yet */
                float ps = 0.0f;
#pragma unroll
                for (int u = 0; u < KH; u++) {
                    sh[rr][u] = live ? exp2_fast(sh[rr][u] - mnew) : 0.0f;
                    ps += sh[rr][u];
                }
                const float po = __shfl_xor_sync(0xffffffffu, ps, LG / 2);
#pragma unroll
                for (int u = 0; u < KH; u++) {
                    const float other = __shfl_xor_sync(0xffffffffu, sh[rr][u], LG / 2);
                    s[rr][u] = hi ? other : sh[rr][u];
                    s[rr][u + KH] = hi ? sh[rr][u] : other;
                }
                if (!live)
                    continue;
                if (mnew != mrow[rr]) { /* else alpha would be 1 (mostly: a steady maximum) */
                    const float alpha = exp2_fast(mrow[rr] - mnew);
                    lrow[rr] *= alpha;
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        o[rr][e] *= alpha;
                    mrow[rr] = mnew;
                }
                lrow[rr] += hi ? po + ps : ps + po;
                act[rr] = true;
            }
            /* o += p V, each V word read and unpacked once for all rows (keys in order). */
#pragma unroll
            for (int u = 0; u < KB; u++) {
                uint4 vw[W];
#pragma unroll
                for (int i = 0; i < W; i++)
                    vw[i] = src[(KB * W + u * W + i) * DTHREADS];
                float vf[8];
                unpack8<T>(vw, vf);
#pragma unroll
                for (int rr = 0; rr < RT; rr++)
                    if (act[rr])
#pragma unroll
                        for (int e = 0; e < 8; e++)
                            o[rr][e] += s[rr][u] * vf[e];
            }
        }
    }
    __syncthreads(); /* every thread is past its last tile: the stages become the states */
    /* The lane groups' states, merged in group order. */
    const int64_t Dv = a.Dv, ld = Dv + 2;
#pragma unroll
    for (int rr = 0; rr < RT; rr++) {
        float *st = sm + ((int64_t)grp * RT + rr) * ld;
#pragma unroll
        for (int e = 0; e < 8; e++)
            st[gl * 8 + e] = o[rr][e];
        if (gl == 0) {
            st[Dv] = mrow[rr] * LN2;
            st[Dv + 1] = lrow[rr];
        }
    }
    __syncthreads();
    const int64_t nrows = a.B * a.Hq * a.Lq;
    T *out = (T *)a.out;
    for (int64_t idx = tid; idx < (int64_t)nr * Dv; idx += DTHREADS) {
        const int rr = (int)(idx / Dv);
        const int64_t d = idx % Dv;
        float M = -INFINITY;
        for (int g = 0; g < NG; g++)
            M = nmax(M, sm[((int64_t)g * RT + rr) * ld + Dv]);
        float L = 0.0f, O = 0.0f;
        if (M != -INFINITY)
            for (int g = 0; g < NG; g++) {
                const float *st = sm + ((int64_t)g * RT + rr) * ld;
                if (st[Dv] == -INFINITY)
                    continue; /* this group saw no key of the row */
                const float w = expf(st[Dv] - M);
                L += st[Dv + 1] * w;
                O += st[d] * w;
            }
        const int64_t r = rg * RT + rr, gr = (b * a.Hq + hkv * G + r / a.Lq) * a.Lq + r % a.Lq;
        if (nsplit == 1) {
            const bool nan = L != L;
            store(out, gr * Dv + d, nan ? NAN : L > 0.0f ? O * (1.0f / L) : 0.0f);
            if (d == 0 && a.lse)
                a.lse[gr] = nan ? NAN : L > 0.0f ? M + logf(L) : -INFINITY;
        } else {
            float *pp = part + ((int64_t)split * nrows + gr) * ld;
            pp[d] = O;
            if (d == 0) {
                pp[Dv] = M;
                pp[Dv + 1] = L;
            }
        }
    }
}

/* The split partials of each row merged in split order (one warp a row), as attention.cu's
   combine_kernel does for its own splits. */
template <typename T>
__global__ void __launch_bounds__(DTHREADS) decode_combine(fx__cu_attn a, int nsplit, const float *part)
{
    constexpr int DT = FX__CU_DMAX / 32;
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * DWARPS + (threadIdx.x >> 5);
    const int64_t nrows = a.B * a.Hq * a.Lq, Dv = a.Dv;
    if (row >= nrows)
        return;
    float M = -INFINITY;
    for (int s = 0; s < nsplit; s++)
        M = nmax(M, part[((int64_t)s * nrows + row) * (Dv + 2) + Dv]);
    float L = 0.0f, o[DT];
#pragma unroll
    for (int t = 0; t < DT; t++)
        o[t] = 0.0f;
    if (M != -INFINITY)
        for (int s = 0; s < nsplit; s++) {
            const float *pp = part + ((int64_t)s * nrows + row) * (Dv + 2);
            if (pp[Dv] == -INFINITY)
                continue;
            const float w = expf(pp[Dv] - M);
            L += pp[Dv + 1] * w;
#pragma unroll
            for (int t = 0; t < DT; t++) {
                const int64_t d = lane + 32 * t;
                if (d < Dv)
                    o[t] += pp[d] * w;
            }
        }
    const bool nan = L != L;
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    T *out = (T *)a.out;
#pragma unroll
    for (int t = 0; t < DT; t++) {
        const int64_t d = lane + 32 * t;
        if (d < Dv)
            store(out, row * Dv + d, nan ? NAN : L > 0.0f ? o[t] * inv : 0.0f);
    }
    if (a.lse && lane == 0)
        a.lse[row] = nan ? NAN : L > 0.0f ? M + logf(L) : -INFINITY;
}

/* ---- launch -------------------------------------------------------------------------------- */

/* Query rows per block for R rows of a group: the fewest registers that hold them, at most 8
   (more rows make more row groups, each reading the split's keys again). */
int rows_per_block(int64_t R) { return R <= 1 ? 1 : R <= 2 ? 2 : R <= 4 ? 4 : 8; }

/* Splits: the count whose blocks fill the GPU's resident slots (slots: blocks a
   multiprocessor holds at once, times the multiprocessors) in the fewest waves per unit of
   work, the smallest such, within two waves (more splits only add merging); at most one per
   kv-block a row visits and DMAXSPLIT. Depends on the sizes, the kernel and the device
   only. */
int decode_splits(const fx__cu_attn *a, int64_t blocks, int64_t slots)
{
    const int64_t smax = min((int64_t)DMAXSPLIT, max(a->max_entries, (int64_t)1));
    int64_t best = 1;
    double best_cost = 0.0;
    for (int64_t s = 1; s <= smax && (s == 1 || blocks * s <= 2 * slots); s++) {
        const int64_t waves = (blocks * s + slots - 1) / slots;
        const double cost = (double)waves / (double)s; /* a block's work shrinks as 1 / s */
        if (s == 1 || cost < best_cost * 0.98)
            best = s, best_cost = cost;
    }
    return (int)best;
}

/* Waits for the stream and turns a failure of any queued kernel into a status. */
int decode_finish(cudaStream_t st, int rc)
{
    const cudaError_t e = cudaStreamSynchronize(st);
    return rc == FX_OK && e != cudaSuccess ? fx__cuda_status((int)e, "attention decode") : rc;
}

template <typename T, int LG, int RT> int launch_rt(const fx__cu_attn *a, int64_t ng)
{
    cudaStream_t st = (cudaStream_t)a->stream;
    /* The stages, later the lane groups' states (at most 35 KiB). */
    const size_t pipe = (size_t)DSTAGES * DTILE_WORDS * DTHREADS * 16,
                 states = (size_t)(DTHREADS / LG) * RT * (size_t)(a->Dv + 2) * sizeof(float);
    const size_t smem = pipe > states ? pipe : states;
    auto kernel = decode_kernel<T, LG, RT>;
    int rc = allow_smem(kernel, smem, "attention decode");
    if (rc != FX_OK)
        return rc;
    int dev = 0, sms = 0, per_sm = 3; /* the emulation's: what 156 registers and 64 KiB allow */
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
#ifndef FX_CUDA_EMU
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, DTHREADS, smem);
#endif
    if (e != cudaSuccess)
        return fx__cuda_status((int)e, "attention decode");
    const int64_t blocks = a->B * a->Hkv * ng;
    const int nsplit = decode_splits(a, blocks, (int64_t)max(sms, 1) * max(per_sm, 1));
    const int64_t nrows = a->B * a->Hq * a->Lq;
    float *part = NULL;
    if (nsplit > 1) {
        e = cudaMallocAsync((void **)&part, (size_t)nsplit * (size_t)nrows * (size_t)(a->Dv + 2) * sizeof(float), st);
        if (e != cudaSuccess)
            return fx__cuda_status((int)e, "attention decode: split partials");
    }
    const dim3 grid((unsigned)blocks, (unsigned)nsplit);
    FX_LAUNCH(kernel, grid, DTHREADS, smem, st)(*a, ng, nsplit, part);
    rc = launched("attention decode");
    if (rc == FX_OK && nsplit > 1) {
        FX_LAUNCH(decode_combine<T>, (unsigned)((nrows + DWARPS - 1) / DWARPS), DTHREADS, 0, st)(*a, nsplit, part);
        rc = launched("attention decode: merging splits");
    }
    if (part)
        (void)cudaFreeAsync(part, st);
    return decode_finish(st, rc);
}

template <typename T, int LG> int launch_lg(const fx__cu_attn *a, int rt, int64_t ng)
{
    switch (rt) {
    case 1:
        return launch_rt<T, LG, 1>(a, ng);
    case 2:
        return launch_rt<T, LG, 2>(a, ng);
    case 4:
        return launch_rt<T, LG, 4>(a, ng);
    default:
        return launch_rt<T, LG, 8>(a, ng);
    }
}

template <typename T> int decode(const fx__cu_attn *a)
{
    const int64_t R = a->Lq * (a->Hq / a->Hkv);
    const int rt = rows_per_block(R);
    const int64_t ng = (R + rt - 1) / rt;
    switch (a->D) {
    case 32:
        return launch_lg<T, 4>(a, rt, ng);
    case 64:
        return launch_lg<T, 8>(a, rt, ng);
    case 128:
        return launch_lg<T, 16>(a, rt, ng);
    default:
        return launch_lg<T, 32>(a, rt, ng);
    }
}

} // namespace
} // namespace fxcu

extern "C" bool fx__cu_attn_decode_fits(const fx__cu_attn *a)
{
    const int64_t D = a->D;
    if (a->Hkv <= 0 || a->Hq % a->Hkv != 0 || a->Dv != D || (D != 32 && D != 64 && D != 128 && D != 256))
        return false;
    /* Up to 8 positions: a row group holds 8 rows, so beyond that the kernel would read the
       cache more often than the general forward, which reads it once per query head. */
    if (a->Lq * (a->Hq / a->Hkv) > fxcu::DROWS || a->Lq < 1 || a->Lq > fxcu::DPOS)
        return false;
    /* 16-byte loads of q, k and v rows. */
    if (((uintptr_t)a->q | (uintptr_t)a->k | (uintptr_t)a->v) & 15u)
        return false;
    const int64_t R = a->Lq * (a->Hq / a->Hkv), rt = fxcu::rows_per_block(R);
    return a->B * a->Hkv * ((R + rt - 1) / rt) <= INT32_MAX;
}

extern "C" int fx__cu_attn_decode(const fx__cu_attn *a)
{
    return a->bf16 ? fxcu::decode<fxcu::bf16>(a) : fxcu::decode<float>(a);
}
