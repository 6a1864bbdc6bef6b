/* Fused linear + cross-entropy (docs/lce.md): the logits of a chunk of tokens are computed
   with one GEMM, reduced to the log-sum-exp and the loss, turned into gradients in place and
   fed to the dh and dw GEMMs, so the [N, V] logits never exist. A chunk's logits are held
   vocabulary-major, and the GEMMs are this module's own kernels (lce_internal.h), or
   BLIS's on the AVX2 path. */
#include "lce_internal.h"
#include "core/backend.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* ---- scalar reference kernels ------------------------------------------------------------- */

/* Elements per block of the online log-sum-exp: a block's max is found first, so each
   element needs one exp, and the block is still in L1 when the exps are summed. */
enum { LCE_BLOCK = 1024 };

static inline float lce_transform_scalar(float x, float bias, float cap)
{
    x += bias;
    return cap > 0.0f ? cap * tanhf(x / cap) : x;
}

static void lce_prep_scalar(float *z, int64_t n, const float *bias, float cap)
{
    if (!bias && cap <= 0.0f)
        return;
    for (int64_t j = 0; j < n; j++)
        z[j] = lce_transform_scalar(z[j], bias ? bias[j] : 0.0f, cap);
}

static void lce_stats_scalar(float *z, int64_t n, const float *bias, float cap, fx__lce_stat *st)
{
    for (int64_t j0 = 0; j0 < n; j0 += LCE_BLOCK) {
        int64_t j1 = j0 + LCE_BLOCK < n ? j0 + LCE_BLOCK : n;
        float bm = -INFINITY;
        double bz = 0.0;
        for (int64_t j = j0; j < j1; j++) {
            float x = lce_transform_scalar(z[j], bias ? bias[j] : 0.0f, cap);
            z[j] = x;
            bm = x > bm ? x : bm; /* a NaN reaches the result through the sum of exps */
            bz += x;
        }
        st->sum_z += bz;
        if (bm == -INFINITY)
            continue; /* a block of masked entries adds nothing to the sum of exps */
        if (bm > st->m) {
            st->s *= exp((double)st->m - (double)bm);
            st->m = bm;
        }
        double bs = 0.0;
        for (int64_t j = j0; j < j1; j++)
            bs += expf(z[j] - st->m);
        st->s += bs;
    }
}

static void lce_grad_scalar(float *z, int64_t n, float lse, float a, float b, float cap)
{
    for (int64_t j = 0; j < n; j++) {
        float x = z[j];
        float g = a * expf(x - lse) - b;
        if (cap > 0.0f) {
            float t = x / cap;
            g *= 1.0f - t * t;
        }
        z[j] = g;
    }
}

const fx__lce_row_kernels fx__lce_row_kernels_scalar = {lce_stats_scalar, lce_prep_scalar, lce_grad_scalar};

/* ---- scalar reference of the fused-pass kernels (lce_internal.h) -------------------------- */

static void lce_logits_scalar(int64_t nj, int64_t c, int64_t D, const float *w, const float *hT, int64_t ldh,
                              float *zt, int64_t ldz)
{
    for (int64_t j = 0; j < nj; j++) {
        float *z = zt + j * ldz;
        for (int64_t i = 0; i < c; i++)
            z[i] = 0.0f;
        for (int64_t d = 0; d < D; d++) {
            const float wd = w[j * D + d];
            const float *x = hT + d * ldh;
            for (int64_t i = 0; i < c; i++)
                z[i] += wd * x[i];
        }
    }
}

static void lce_stats_t_scalar(float *zt, int64_t nj, int64_t c, int64_t ldz, const float *bias, float cap,
                               float *pm, float *ps, float *pz)
{
    for (int64_t i = 0; i < c; i++) {
        float m = -INFINITY, sz = 0.0f, s = 0.0f;
        for (int64_t j = 0; j < nj; j++) {
            const float x = lce_transform_scalar(zt[j * ldz + i], bias ? bias[j] : 0.0f, cap);
            zt[j * ldz + i] = x;
            m = x > m ? x : m; /* a NaN reaches the result through the sum of exps */
            sz += x;
        }
        const float me = m == -INFINITY ? 0.0f : m; /* all masked: exp(-inf) = 0 */
        for (int64_t j = 0; j < nj; j++)
            s += expf(zt[j * ldz + i] - me);
        pm[i] = m, ps[i] = s, pz[i] = sz;
    }
}

static void lce_prep_t_scalar(float *zt, int64_t nj, int64_t c, int64_t ldz, const float *bias, float cap)
{
    if (!bias && cap <= 0.0f)
        return;
    for (int64_t j = 0; j < nj; j++)
        for (int64_t i = 0; i < c; i++)
            zt[j * ldz + i] = lce_transform_scalar(zt[j * ldz + i], bias ? bias[j] : 0.0f, cap);
}

static void lce_grad_t_scalar(float *zt, int64_t nj, int64_t c, int64_t ldz, const float *lse, const float *a,
                              const float *b, const float *keep, float cap)
{
    for (int64_t j = 0; j < nj; j++) {
        float *z = zt + j * ldz;
        for (int64_t i = 0; i < c; i++) {
            const float x = z[i];
            float g = a[i] * expf(x - lse[i]) - b[i];
            if (cap > 0.0f) {
                const float t = x / cap;
                g *= 1.0f - t * t;
            }
            z[i] = keep[i] != 0.0f ? g : 0.0f;
        }
    }
}

static void lce_dw_scalar(int64_t nj, int64_t c, int64_t D, const float *zt, int64_t ldz, const float *h, float *dw)
{
    for (int64_t j = 0; j < nj; j++) {
        for (int64_t d = 0; d < D; d++) {
            float s = 0.0f;
            for (int64_t i = 0; i < c; i++)
                s += zt[j * ldz + i] * h[i * D + d];
            dw[j * D + d] += s; /* the chunk's sum added last, as on the vector paths */
        }
    }
}

static void lce_dh_scalar(int64_t nj, int64_t c, int64_t D, int64_t d0, int64_t d1, const float *zt, int64_t ldz,
                          const float *w, float *dh, bool accumulate)
{
    for (int64_t i = 0; i < c; i++) {
        for (int64_t d = d0; d < d1; d++) {
            float s = 0.0f;
            for (int64_t j = 0; j < nj; j++)
                s += zt[j * ldz + i] * w[j * D + d];
            dh[i * D + d] = accumulate ? dh[i * D + d] + s : s;
        }
    }
}

const fx__lce_tile_kernels fx__lce_tile_kernels_scalar = {lce_stats_t_scalar, lce_prep_t_scalar, lce_grad_t_scalar};
const fx__lce_tile_gemms fx__lce_tile_gemms_scalar = {lce_logits_scalar, lce_dw_scalar, lce_dh_scalar};

/* ---- the kernel tables (lce_internal.h) --------------------------------------------------- */

const fx__lce_kernels fx__lce_kernels_scalar = {"scalar", &fx__lce_row_kernels_scalar, &fx__lce_tile_kernels_scalar,
                                                &fx__lce_tile_gemms_scalar};
const fx__lce_kernels fx__lce_kernels_avx2 = {"avx2", &fx__lce_row_kernels_avx2, &fx__lce_tile_kernels_avx2, NULL};
const fx__lce_kernels fx__lce_kernels_avx512 = {"avx512", &fx__lce_row_kernels_avx512, &fx__lce_tile_kernels_avx512,
                                                &fx__lce_tile_gemms_avx512};

const fx__lce_kernels *fx__lce_kernels_for(fx_isa isa)
{
#ifdef FLEXC_REFERENCE_KERNELS
    (void)isa;
    return &fx__lce_kernels_scalar;
#else
    return FX__PER_ISA(isa, &fx__lce_kernels_scalar, &fx__lce_kernels_avx2, &fx__lce_kernels_avx512);
#endif
}

const fx__lce_kernels *fx__lce_kernels_now(void) { return fx__lce_kernels_for(fx__isa()); }

/* ---- the chunk plan ----------------------------------------------------------------------- */

/* Per token of a chunk: its running statistics, then its lse, loss and gradient scale. */
typedef struct lce_row {
    fx__lce_stat st;
    double loss;
    float z_y;   /* the target's (soft-capped) logit */
    float lse;
    float scale; /* d(reduced loss)/d(this token's loss) times the upstream gradient */
    int32_t valid;
} lce_row;

/* The automatic plan keeps the whole scratch within LCE_SCRATCH bytes (2 MiB: a few times
   less than a chunked PyTorch step holds, about the L2 caches of two cores). Whole rows are
   taken when at least LCE_ROWS_WHOLE tokens of them fit: three GEMMs per chunk. Otherwise
   the vocabulary is tiled, LCE_VTILE entries per tile (two blocks, one per thread of two),
   with as many tokens per chunk as fit: each tile's logits are then computed twice (four
   GEMMs instead of three), but chunks of 150 to 230 tokens run their GEMMs faster than the
   thin chunks of whole rows the same memory would allow (6 to 14 tokens at V = 32768 to
   128256). Tiles of 1024 entries in blocks of 512 (about 230 tokens at N=4096, D=512,
   V=32768) ran the call's products 1.09x faster than tiles of 2048 in blocks of 1024 (161
   tokens): thicker chunks, and GEMMs whose operands stay in L2.
   A chunk never has fewer than LCE_ROWS_MIN tokens (or N), below which the GEMMs lose much
   of their speed, whatever the budget. A given chunk with no vocab_chunk takes whole rows. */
#define LCE_SCRATCH ((double)(2u << 20))
enum { LCE_ROWS_MIN = 16, LCE_ROWS_WHOLE = 64, LCE_VTILE = 1024 };

static int64_t lce_min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t lce_max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Vocabulary entries per block: the unit of work a thread takes in the logits, statistics,
   gradient and dw steps (a block's logits of a 64-token chunk of whole rows, 256 KB, are
   still in L2 when its statistics or gradients are taken and its dw GEMM runs); half of
   that in a tiled plan, whose chunks are several times thicker. */
enum { LCE_VBLOCK = 1024, LCE_VBLOCK_TILED = 512 };

/* The block of a plan with tiles of vb entries. */
static int64_t lce_vblock(int64_t vb, int64_t V) { return vb < V ? LCE_VBLOCK_TILED : LCE_VBLOCK; }

/* Rows of w per step of the dh GEMM: each step adds its sums into dh's tiles once, so longer
   steps mean fewer read-modify-writes of dh. 256 measured best on two threads (64 ran about
   8% slower over the whole fused pass, 1024 about 4%); on one thread it makes no difference. */
enum { LCE_DH_ROWS = 256 };

/* The scratch of a call, in 64-byte aligned pieces:
     zt [vb, c]          a tile's logits, then gradients, vocabulary-major (lce_internal.h)
     hT [D, cs]          the chunk's h transposed (cs: c rounded up to 16)
     rows [c]            per token
     pm, ps, pz [nb, cs] statistics per vocabulary block and token, for every block of the
                         vocabulary (nb: blocks per tile times tiles), so that the tiles of the
                         forward pass need not wait for each other's statistics to be merged
     lse, a, b, keep [cs] per-token coefficients of the gradients
     dhp [LCE_SLABS - 1, c, D] dh of the chunk from every slab but the first (lce_slabbed) */
typedef struct lce_layout {
    size_t zt, hT, rows, part, coef, dhp, total;
} lce_layout;

static size_t lce_al(size_t n) { return (n + 63) & ~(size_t)63; }

/* Blocks of statistics a plan keeps: blocks per tile (lce_vblock), times tiles. */
static int64_t lce_stat_blocks(int64_t vb, int64_t V)
{
    const int64_t blk = lce_vblock(vb, V);
    return (vb + blk - 1) / blk * ((V + vb - 1) / vb);
}

/* The backward pass of a tiled plan splits the vocabulary into LCE_SLABS slabs: slab s is
   block s, s + LCE_SLABS, ... of every tile. Each slab recomputes its blocks' logits, writes
   their dw and dbias rows and sums its own dh of the chunk, without waiting for the other
   slabs; the slabs' dh are then added in slab order. The slabs are fixed by the plan, not by
   the thread count, so every element is summed in the same order on 1, 2 or 3 threads, and
   a chunk waits twice instead of twice per tile. The first slab sums into dh itself; each
   other slab needs a [c, D] buffer, hence only two (the blocks of a tile of two threads).
   Plans of one tile keep the per-tile split: their tile is resident or read once. */
enum { LCE_SLABS = 2 };

static bool lce_slabbed(int64_t vb, int64_t V)
{
    return vb < V && (vb + LCE_VBLOCK_TILED - 1) / LCE_VBLOCK_TILED >= LCE_SLABS;
}

static lce_layout lce_layout_of(int64_t c, int64_t vb, int64_t D, int64_t V)
{
    const size_t cs = (size_t)(c + 15) / 16 * 16, nb = (size_t)lce_stat_blocks(vb, V);
    lce_layout l;
    l.zt = 0;
    l.hT = l.zt + lce_al((size_t)c * (size_t)vb * sizeof(float));
    l.rows = l.hT + lce_al((size_t)D * cs * sizeof(float));
    l.part = l.rows + lce_al((size_t)c * sizeof(lce_row));
    l.coef = l.part + lce_al(3 * nb * cs * sizeof(float));
    l.dhp = l.coef + lce_al(4 * cs * sizeof(float));
    l.total = l.dhp + (lce_slabbed(vb, V) ? lce_al((size_t)(LCE_SLABS - 1) * (size_t)c * (size_t)D * sizeof(float)) : 0);
    return l;
}

/* The most tokens (at most N) whose scratch with tiles of vb entries fits LCE_SCRATCH; 0 when
   not even one does. */
static int64_t lce_plan_rows(int64_t N, int64_t D, int64_t V, int64_t vb)
{
    const double per_row = 4.0 * (double)vb + 4.0 * (double)D + (double)sizeof(lce_row) +
                           12.0 * (double)lce_stat_blocks(vb, V) + 16.0 +
                           (lce_slabbed(vb, V) ? 4.0 * (double)(LCE_SLABS - 1) * (double)D : 0.0);
    int64_t c = lce_min64((int64_t)(LCE_SCRATCH / per_row) + 1, N);
    /* The estimate leaves out the rounding of each piece: step down until it all fits. */
    while (c > 0 && (double)lce_layout_of(c, vb, D, V).total > LCE_SCRATCH)
        c--;
    return c;
}

static void lce_plan(const fx_lce *p, int64_t *chunk, int64_t *vchunk, size_t *bytes)
{
    const int64_t N = p->N, V = p->V, D = p->D, lo = lce_min64(N, LCE_ROWS_MIN);
    int64_t vb = p->vocab_chunk > 0 ? lce_min64(p->vocab_chunk, V) : V, c;
    if (p->chunk > 0) {
        c = lce_min64(p->chunk, N);
    } else {
        c = lce_plan_rows(N, D, V, vb);
        if (p->vocab_chunk == 0 && c < lce_min64(N, LCE_ROWS_WHOLE) && V > LCE_VTILE) {
            vb = LCE_VTILE;
            c = lce_plan_rows(N, D, V, vb);
        }
        c = lce_max64(c, lo);
    }
    c = lce_min64(c, INT_MAX);
    *chunk = c;
    *vchunk = vb;
    /* Sizes were checked to fit; the tile of a user's chunk may still be huge, and then the
       allocation fails cleanly. */
    if (4.0 * (double)c * ((double)vb + (double)D + 64.0) > (double)(SIZE_MAX / 4)) {
        *bytes = SIZE_MAX; /* no allocation can satisfy it: fx__alloc reports FX_ENOMEM */
        return;
    }
    *bytes = lce_layout_of(c, vb, D, V).total;
}

/* ---- checks ------------------------------------------------------------------------------- */

int fx__lce_check_params(const fx_lce *p)
{
    if (!p)
        return fx__error(FX_EINVAL, "p (the fx_lce parameters) is NULL");
    const struct { const char *name; int64_t v; } dims[] = {{"N", p->N}, {"D", p->D}, {"V", p->V}};
    for (size_t i = 0; i < 3; i++) {
        if (dims[i].v <= 0)
            return fx__error(FX_EINVAL, "%s = %lld must be > 0", dims[i].name, (long long)dims[i].v);
    }
    if (p->D > INT_MAX)
        return fx__error(FX_EINVAL, "D = %lld exceeds %d, the GEMM's limit", (long long)p->D, INT_MAX);
    if (p->V > INT_MAX)
        return fx__error(FX_EINVAL, "V = %lld exceeds %d, the GEMM's limit", (long long)p->V, INT_MAX);
    size_t t;
    if (!fx__mul_size((size_t)p->N, (size_t)p->D, &t) || !fx__mul_size(t, sizeof(float), &t) ||
        !fx__mul_size((size_t)p->V, (size_t)p->D, &t) || !fx__mul_size(t, sizeof(float), &t))
        return fx__error(FX_EINVAL, "N = %lld, D = %lld, V = %lld: the tensors' sizes overflow", (long long)p->N,
                         (long long)p->D, (long long)p->V);
    if (p->reduction != FX_REDUCTION_MEAN && p->reduction != FX_REDUCTION_SUM && p->reduction != FX_REDUCTION_NONE)
        return fx__error(FX_EINVAL, "reduction = %d is not FX_REDUCTION_MEAN, _SUM or _NONE", (int)p->reduction);
    if (!(p->label_smoothing >= 0.0f && p->label_smoothing <= 1.0f))
        return fx__error(FX_EINVAL, "label_smoothing = %g must be in [0, 1]", (double)p->label_smoothing);
    if (!(p->z_loss >= 0.0f && isfinite(p->z_loss)))
        return fx__error(FX_EINVAL, "z_loss = %g must be finite and >= 0", (double)p->z_loss);
    if (!(p->softcap >= 0.0f && isfinite(p->softcap)))
        return fx__error(FX_EINVAL, "softcap = %g must be finite and >= 0 (0: off)", (double)p->softcap);
    if (p->softcap > 0.0f && !isfinite(1.0f / p->softcap)) /* the vector paths multiply by 1/softcap */
        return fx__error(FX_EINVAL, "softcap = %g is too small: 1/softcap overflows float", (double)p->softcap);
    if (p->chunk < 0)
        return fx__error(FX_EINVAL, "chunk = %lld must be >= 0 (0: automatic)", (long long)p->chunk);
    if (p->vocab_chunk < 0)
        return fx__error(FX_EINVAL, "vocab_chunk = %lld must be >= 0 (0: automatic)", (long long)p->vocab_chunk);
    return FX_OK;
}

/* Every target in [0, V) or ignore_index (FX_ERANGE); counts those not ignored. */
static int lce_check_targets(const fx_lce *p, const int64_t *target, int64_t *n_valid)
{
    int64_t n = 0;
    for (int64_t i = 0; i < p->N; i++) {
        int64_t y = target[i];
        if (y == p->ignore_index)
            continue;
        if (y < 0 || y >= p->V)
            return fx__error(FX_ERANGE, "target[%lld] = %lld is outside [0, %lld) and is not ignore_index (%lld)",
                             (long long)i, (long long)y, (long long)p->V, (long long)p->ignore_index);
        n++;
    }
    *n_valid = n;
    return FX_OK;
}

/* ---- threads and GEMMs -------------------------------------------------------------------- */

/* With OpenMP, the work of a chunk is split into vocabulary blocks and hidden-size blocks
   that OpenMP threads share out, each calling a one-thread GEMM (fx__sgemm_untraced runs one
   thread inside a parallel region): the blocks are the same for any thread count, so every element
   is computed the same way whatever the count, and the small GEMMs of a chunk run at the
   speed of independent single-core GEMMs instead of paying a thread hand-off each. */

/* Tiles smaller than this run on one thread: waking the team would cost more. */
enum { LCE_PAR_MIN = 1 << 16 };

static void lce_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    fx__sgemm_untraced(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

/* ---- the fused pass ----------------------------------------------------------------------- */

typedef struct lce_call {
    const fx_lce *p;
    const float *h, *w, *bias;
    const int64_t *target;
    float *loss, *lse_out;     /* forward */
    const float *lse_in;       /* backward: the saved lse (NULL in the forward call) */
    const float *grad_loss;    /* backward */
    float *dh, *dw, *dbias;
    int64_t n_valid, C, Vb;
    int64_t blk;               /* vocabulary entries per block (lce_vblock) */
    float *zt;                 /* [Vb, c] */
    float *hT;                 /* [D, cs] */
    lce_row *rows;             /* [C] */
    float *pm, *ps, *pz;       /* [blocks of the vocabulary, cs] */
    float *c_lse, *c_a, *c_b, *c_keep; /* [cs] */
    float *dhp;                /* [LCE_SLABS - 1, c, D] when lce_slabbed */
    int64_t cs;                /* row stride of hT and of the statistics */
    const fx__lce_tile_kernels *kern;
    const struct lce_products *prod; /* the route of the products (lce_route) */
    const fx__lce_tile_gemms *gemm;  /* the own kernels' route: the CPU path's GEMMs (NULL: none) */
    bool round_g;              /* bf16 training: the logits' gradient rounded to bfloat16 before
                                  the dw and dh products (fx__linear_cross_entropy_bf16) */
    fx__lce_dp dp;             /* bf16 training on a pair-by-pair path: the products (dp.t set) */
    fx__bf16_mat h16, w16;     /* h and w as that path reads them (h and w: NULL there when
                                  they are stored in bfloat16) */
} lce_call;

/* ---- the routes of the products ---------------------------------------------------------
   A call's three products take one route, chosen once (lce_route): this module's own
   float32 kernels (the CPU path's fx__lce_tile_gemms), BLIS's float32 GEMMs (the AVX2 path,
   which has no kernels of its own), or the bfloat16 pair kernels (lce_dp.c) of the bf16
   call on a vdpbf16ps path. Every route computes each element the same way whichever
   thread makes it and however the columns of dh are shared. */
typedef struct lce_products {
    const char *name;
    /* Once per chunk [n0, n0+c), before its products: h laid out as the route reads it. */
    void (*pack_h)(lce_call *k, int64_t n0, int64_t c);
    /* Z [n, c] = the logits of vocabulary rows [v, v+n) for the chunk's tokens. */
    void (*logits)(const lce_call *k, int64_t n0, int64_t c, int64_t v, int64_t n, float *Z);
    /* dw[v : v+n] += G [n, c] h[n0 : n0+c]. */
    void (*dw)(const lce_call *k, int64_t n0, int64_t c, int64_t v, int64_t n, const float *G);
    /* dh[:, d0:d1] = (accumulate ? dh : 0) + Gᵀ w[v : v+n, d0:d1], G [n, c], dh [c, D]: one
       thread's work. */
    void (*dh)(const lce_call *k, int64_t c, int64_t v, int64_t n, int64_t d0, int64_t d1, const float *G,
               float *dh, bool accumulate);
    /* The width of the column blocks in which a team shares a tile's dh, on nt threads. */
    int64_t (*dh_width)(int64_t D, int nt);
} lce_products;

/* Columns of dh in one block per thread, in units of 16 (the kernels' sums do not depend on
   the split). */
static int64_t lce_width_per_thread(int64_t D, int nt) { return ((D + 15) / 16 + nt - 1) / nt * 16; }

/* Column blocks of dh on the BLAS route: a fixed count (at most 4, widths multiples of 16),
   independent of the thread count, that 1, 2 or 4 threads share evenly; each block's GEMM
   packs all of G again, so more blocks would cost more than they balance. */
enum { LCE_DBLOCKS = 4 };

static int64_t lce_width_fixed(int64_t D, int nt)
{
    (void)nt;
    const int64_t nb = (D + 15) / 16 < LCE_DBLOCKS ? (D + 15) / 16 : LCE_DBLOCKS;
    return ((D + nb - 1) / nb + 15) / 16 * 16;
}

/* h of chunk [n0, n0+c) transposed into hT [D, cs], the lanes past c zeroed. */
static void lce_pack_h_own(lce_call *k, int64_t n0, int64_t c)
{
    const int64_t D = k->p->D, cs = k->cs;
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
        const int64_t d1 = lce_min64(D, d0 + 16);
        for (int64_t r = 0; r < cs; r++) {
            const float *src = k->h + (n0 + r) * D;
            for (int64_t d = d0; d < d1; d++)
                k->hT[d * cs + r] = r < c ? src[d] : 0.0f;
        }
    }
}

static void lce_logits_own(const lce_call *k, int64_t n0, int64_t c, int64_t v, int64_t n, float *Z)
{
    (void)n0; /* the chunk is in hT */
    k->gemm->logits(n, c, k->p->D, k->w + v * k->p->D, k->hT, k->cs, Z, c);
}

static void lce_dw_own(const lce_call *k, int64_t n0, int64_t c, int64_t v, int64_t n, const float *G)
{
    const int64_t D = k->p->D;
    k->gemm->dw(n, c, D, G, c, k->h + n0 * D, k->dw + v * D);
}

static void lce_dh_own(const lce_call *k, int64_t c, int64_t v, int64_t n, int64_t d0, int64_t d1, const float *G,
                       float *dh, bool accumulate)
{
    const int64_t D = k->p->D;
    for (int64_t i = 0; i < n; i += LCE_DH_ROWS)
        k->gemm->dh(lce_min64(LCE_DH_ROWS, n - i), c, D, d0, d1, G + i * c, c, k->w + (v + i) * D, dh,
                    accumulate || i > 0);
}

static const lce_products lce_products_own = {"lce kernels", lce_pack_h_own, lce_logits_own, lce_dw_own, lce_dh_own,
                                              lce_width_per_thread};

static void lce_pack_h_blas(lce_call *k, int64_t n0, int64_t c) { (void)k, (void)n0, (void)c; }

static void lce_logits_blas(const lce_call *k, int64_t n0, int64_t c, int64_t v, int64_t n, float *Z)
{
    const int64_t D = k->p->D;
    lce_sgemm(false, true, n, c, D, k->w + v * D, D, k->h + n0 * D, D, 0.0f, Z, c);
}

static void lce_dw_blas(const lce_call *k, int64_t n0, int64_t c, int64_t v, int64_t n, const float *G)
{
    const int64_t D = k->p->D;
    lce_sgemm(false, false, n, D, c, G, c, k->h + n0 * D, D, 1.0f, k->dw + v * D, D);
}

static void lce_dh_blas(const lce_call *k, int64_t c, int64_t v, int64_t n, int64_t d0, int64_t d1, const float *G,
                        float *dh, bool accumulate)
{
    const int64_t D = k->p->D;
    lce_sgemm(true, false, c, d1 - d0, n, G, c, k->w + v * D + d0, D, accumulate ? 1.0f : 0.0f, dh + d0, D);
}

static const lce_products lce_products_blas = {"blas", lce_pack_h_blas, lce_logits_blas, lce_dw_blas, lce_dh_blas,
                                               lce_width_fixed};

static void lce_pack_h_pairs(lce_call *k, int64_t n0, int64_t c)
{
    fx__lce_dp_pack_h(&k->dp, fx__bf16_mat_at(k->h16, n0 * k->p->D), c);
}

static void lce_logits_pairs(const lce_call *k, int64_t n0, int64_t c, int64_t v, int64_t n, float *Z)
{
    (void)n0; /* the chunk is in the packed h */
    fx__lce_dp_logits(&k->dp, n, fx__bf16_mat_at(k->w16, v * k->p->D), Z, c);
}

static void lce_dw_pairs(const lce_call *k, int64_t n0, int64_t c, int64_t v, int64_t n, const float *G)
{
    (void)n0;
    fx__lce_dp_dw(&k->dp, n, G, c, k->dw + v * k->p->D);
}

static void lce_dh_pairs(const lce_call *k, int64_t c, int64_t v, int64_t n, int64_t d0, int64_t d1, const float *G,
                         float *dh, bool accumulate)
{
    const int64_t D = k->p->D;
    for (int64_t i = 0; i < n; i += LCE_DH_ROWS)
        fx__lce_dp_dh(&k->dp, lce_min64(LCE_DH_ROWS, n - i), d0, d1, G + i * c, c,
                      fx__bf16_mat_at(k->w16, (v + i) * D), dh, accumulate || i > 0);
}

static const lce_products lce_products_pairs = {"bfloat16 pairs", lce_pack_h_pairs, lce_logits_pairs, lce_dw_pairs,
                                                lce_dh_pairs, lce_width_per_thread};

/* The route of k's products (k->dp.t set: the bf16 call's pair route), and the elementwise
   kernels, from the current CPU path's table. */
static void lce_route(lce_call *k)
{
    const fx__lce_kernels *t = fx__lce_kernels_now();
    k->kern = t->tile;
    k->gemm = t->gemm;
    if (k->dp.t)
        k->prod = &lce_products_pairs;
    else if (!t->gemm)
        k->prod = &lce_products_blas;
    else
        k->prod = &lce_products_own;
}

const char *fx__lce_f32_products(void)
{
    lce_call k = {0};
    lce_route(&k);
    return k.prod->name;
}

/* Logits of block b of tile [v0, v0+vb) of chunk [n0, n0+c), then either their statistics
   per token (forward) or just the bias and cap (recomputation); the targets' logits are
   kept for the gradients. A block's statistics go to slot (v0 / Vb) * blocks per tile + b. */
static void lce_block_logits(const lce_call *k, int64_t n0, int64_t c, int64_t v0, int64_t vb, int64_t b, bool stats)
{
    const fx_lce *p = k->p;
    const int64_t j0 = b * k->blk, n = lce_min64(k->blk, vb - j0);
    float *Z = k->zt + j0 * c;
    k->prod->logits(k, n0, c, v0 + j0, n, Z);
    const float *bias = k->bias ? k->bias + v0 + j0 : NULL;
    if (stats) {
        const int64_t g = v0 / k->Vb * ((k->Vb + k->blk - 1) / k->blk) + b;
        k->kern->stats(Z, n, c, c, bias, p->softcap, k->pm + g * k->cs, k->ps + g * k->cs, k->pz + g * k->cs);
    } else {
        k->kern->prep(Z, n, c, c, bias, p->softcap);
    }
    for (int64_t r = 0; r < c; r++) {
        const int64_t y = k->target[n0 + r];
        if (y != p->ignore_index && y >= v0 + j0 && y < v0 + j0 + n)
            k->rows[r].z_y = Z[(y - v0 - j0) * c + r];
    }
}

/* Folds the block statistics of every tile into token r's running statistics, tile by tile
   and block by block. */
static void lce_row_merge(const lce_call *k, int64_t r)
{
    const int64_t V = k->p->V, nbt = (k->Vb + k->blk - 1) / k->blk;
    fx__lce_stat *st = &k->rows[r].st;
    for (int64_t v0 = 0, g0 = 0; v0 < V; v0 += k->Vb, g0 += nbt) {
        const int64_t nb = (lce_min64(k->Vb, V - v0) + k->blk - 1) / k->blk;
        for (int64_t g = g0; g < g0 + nb; g++) {
            const float qm = k->pm[g * k->cs + r];
            st->sum_z += (double)k->pz[g * k->cs + r];
            if (qm == -INFINITY)
                continue; /* a block of masked entries adds nothing to the sum of exps */
            const double qs = (double)k->ps[g * k->cs + r];
            if (qm > st->m) {
                st->s = st->s * exp((double)st->m - (double)qm) + qs;
                st->m = qm;
            } else {
                st->s += qs * exp((double)qm - (double)st->m);
            }
        }
    }
}

/* Gradients of block b of a tile, in place, then its dw and dbias updates. */
static void lce_block_grad(const lce_call *k, int64_t n0, int64_t c, int64_t v0, int64_t vb, int64_t b)
{
    const fx_lce *p = k->p;
    const int64_t j0 = b * k->blk, n = lce_min64(k->blk, vb - j0);
    const float cap = p->softcap, eps = p->label_smoothing;
    float *G = k->zt + j0 * c;
    k->kern->grad(G, n, c, c, k->c_lse, k->c_a, k->c_b, k->c_keep, cap);
    /* The target's entry: d loss / d z_y = p_y (1 + 2 s lse) - eps/V - (1-eps). */
    for (int64_t r = 0; r < c; r++) {
        const int64_t y = k->target[n0 + r] - v0 - j0;
        if (!k->rows[r].valid || y < 0 || y >= n)
            continue;
        const float zy = k->rows[r].z_y, t = k->rows[r].scale * (1.0f - eps);
        float d = 1.0f;
        if (cap > 0.0f) {
            const float u = zy / cap;
            d = 1.0f - u * u;
        }
        G[y * c + r] = (k->c_a[r] * expf(zy - k->c_lse[r]) - k->c_b[r] - t) * d;
    }
    if (k->round_g)
        for (int64_t i = 0; i < n * c; i++)
            G[i] = fx__bf16_round(G[i]);
    if (k->dw)
        k->prod->dw(k, n0, c, v0 + j0, n, G);
    if (k->dbias) {
        float *db = k->dbias + v0 + j0;
        for (int64_t j = 0; j < n; j++) {
            const float *g = G + j * c;
            float s = 0.0f;
            for (int64_t r = 0; r < c; r++)
                s += g[r];
            db[j] += s;
        }
    }
}

/* Statistics of chunk [n0, n0+c) over every tile; the last tile's logits stay in k->zt.
   One parallel region for all tiles: a thread goes on to its blocks of the next tile without
   waiting for the others (a static schedule gives it the same blocks, hence the same part of
   zt, whenever two tiles have as many blocks), and the statistics are merged at the end. */
static void lce_chunk_stats(const lce_call *k, int64_t n0, int64_t c)
{
    const fx_lce *p = k->p;
    for (int64_t r = 0; r < c; r++) {
        k->rows[r].st = (fx__lce_stat){-INFINITY, 0.0, 0.0};
        k->rows[r].z_y = 0.0f;
    }
#pragma omp parallel if (c * k->Vb >= LCE_PAR_MIN)
    {
        for (int64_t v0 = 0; v0 < p->V; v0 += k->Vb) {
            const int64_t vb = lce_min64(k->Vb, p->V - v0), nb = (vb + k->blk - 1) / k->blk;
            const int64_t v1 = v0 + k->Vb, nb1 = v1 < p->V ? (lce_min64(k->Vb, p->V - v1) + k->blk - 1) / k->blk : 0;
            if (nb1 == nb) {
#pragma omp for schedule(static) nowait
                for (int64_t b = 0; b < nb; b++)
                    lce_block_logits(k, n0, c, v0, vb, b, true);
            } else {
#pragma omp for schedule(static)
                for (int64_t b = 0; b < nb; b++)
                    lce_block_logits(k, n0, c, v0, vb, b, true);
            }
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < c; r++)
            lce_row_merge(k, r);
    }
}

/* Gradients of tile [v0, v0+vb) of chunk [n0, n0+c): recomputed logits unless resident,
   then dw and dbias per vocabulary block, and dh (+)= G w[v0:v0+vb] (overwritten by the
   first tile), w's rows taken in order for every element. Called by every thread of a
   team (or by one thread outside any); it returns once the tile's zt may be reused. */
static void lce_tile_backprop(const lce_call *k, int64_t n0, int64_t c, int64_t v0, int64_t vb, bool resident)
{
    const int64_t D = k->p->D, nb = (vb + k->blk - 1) / k->blk;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        if (!resident)
            lce_block_logits(k, n0, c, v0, vb, b, false);
        lce_block_grad(k, n0, c, v0, vb, b);
    }
    if (!k->dh)
        return;
    int nt = 1;
#ifdef _OPENMP
    nt = omp_get_num_threads();
#endif
    const int64_t db = k->prod->dh_width(D, nt), nd = (D + db - 1) / db;
#pragma omp for schedule(static)
    for (int64_t q = 0; q < nd; q++)
        k->prod->dh(k, c, v0, vb, q * db, lce_min64(D, (q + 1) * db), k->zt, k->dh + n0 * D, v0 > 0);
}

/* The gradients of chunk [n0, n0+c), tile by tile, in one parallel region. */
static void lce_chunk_backprop(const lce_call *k, int64_t n0, int64_t c, bool resident)
{
    const int64_t V = k->p->V;
#pragma omp parallel if (c * k->Vb >= LCE_PAR_MIN)
    for (int64_t v0 = 0; v0 < V; v0 += k->Vb)
        lce_tile_backprop(k, n0, c, v0, lce_min64(k->Vb, V - v0), resident);
}

/* The gradients of slab s (lce_slabbed) of chunk [n0, n0+c): every block's logits again,
   then its gradients, dw and dbias, and the slab's dh, summed block after block into dh
   (slab 0) or the slab's partial [c, D]. */
static void lce_slab_backprop(const lce_call *k, int64_t n0, int64_t c, int64_t s)
{
    const int64_t V = k->p->V, D = k->p->D;
    float *dh = k->dh ? (s == 0 ? k->dh + n0 * D : k->dhp + (s - 1) * c * D) : NULL;
    bool first = true;
    for (int64_t v0 = 0; v0 < V; v0 += k->Vb) {
        const int64_t vb = lce_min64(k->Vb, V - v0), nb = (vb + k->blk - 1) / k->blk;
        for (int64_t b = s; b < nb; b += LCE_SLABS) {
            lce_block_logits(k, n0, c, v0, vb, b, false);
            lce_block_grad(k, n0, c, v0, vb, b);
            if (!dh)
                continue;
            const int64_t j0 = b * k->blk, n = lce_min64(k->blk, vb - j0);
            k->prod->dh(k, c, v0 + j0, n, 0, D, k->zt + j0 * c, dh, !first);
            first = false;
        }
    }
    if (dh && first) /* no block in this slab (the first tile has LCE_SLABS blocks or more) */
        memset(dh, 0, (size_t)(c * D) * sizeof(float));
}

/* The gradients of chunk [n0, n0+c) slab by slab (lce_slabbed), then dh = the slabs' dh
   added in slab order: two waits per chunk. */
static void lce_chunk_backprop_slabs(const lce_call *k, int64_t n0, int64_t c)
{
    const int64_t D = k->p->D;
#pragma omp parallel if (c * k->Vb >= LCE_PAR_MIN)
    {
#pragma omp for schedule(static)
        for (int64_t s = 0; s < LCE_SLABS; s++)
            lce_slab_backprop(k, n0, c, s);
        if (k->dh) {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < c; r++) {
                float *dst = k->dh + (n0 + r) * D;
                for (int64_t s = 1; s < LCE_SLABS; s++) {
                    const float *src = k->dhp + ((s - 1) * c + r) * D;
                    for (int64_t d = 0; d < D; d++)
                        dst[d] += src[d];
                }
            }
        }
    }
}

/* k's plan (chunk k->C, vocabulary block k->Vb) and its scratch: one allocation (*scratch, for
   the caller to free) laid out into k's buffers, the vdpbf16ps route's packed pairs last. */
static int lce_scratch(lce_call *k, unsigned char **scratch)
{
    const int64_t V = k->p->V, D = k->p->D;
    size_t bytes;
    lce_plan(k->p, &k->C, &k->Vb, &bytes);
    k->blk = lce_vblock(k->Vb, V);
    size_t dp_bytes = 0;
    if (k->dp.t) {
#ifdef _OPENMP
        const int threads = omp_get_max_threads();
#else
        const int threads = 1;
#endif
        k->dp = fx__lce_dp_plan(k->dp.t, k->C, D, LCE_DH_ROWS, threads);
        dp_bytes = lce_al(fx__lce_dp_words(&k->dp) * sizeof(uint32_t));
    }
    const size_t all = bytes == SIZE_MAX ? SIZE_MAX : lce_al(bytes) + dp_bytes;
    unsigned char *s = all == SIZE_MAX ? NULL : fx__alloc(all);
    if (!s)
        return fx__error(FX_ENOMEM, "fused cross-entropy: cannot allocate %zu bytes of scratch (chunk %lld x %lld)",
                         all, (long long)k->C, (long long)k->Vb);
    if (k->dp.t)
        fx__lce_dp_bind(&k->dp, (uint32_t *)(s + lce_al(bytes)));
    const lce_layout lay = lce_layout_of(k->C, k->Vb, D, V);
    const int64_t nbmax = lce_stat_blocks(k->Vb, V);
    k->cs = (k->C + 15) / 16 * 16;
    k->zt = (float *)(s + lay.zt);
    k->hT = (float *)(s + lay.hT);
    k->rows = (lce_row *)(s + lay.rows);
    k->pm = (float *)(s + lay.part);
    k->ps = k->pm + nbmax * k->cs;
    k->pz = k->ps + nbmax * k->cs;
    k->c_lse = (float *)(s + lay.coef);
    k->c_a = k->c_lse + k->cs;
    k->c_b = k->c_a + k->cs;
    k->c_keep = k->c_b + k->cs;
    k->dhp = lce_slabbed(k->Vb, V) ? (float *)(s + lay.dhp) : NULL;
    *scratch = s;
    return FX_OK;
}

/* The chunk's tokens [n0, n0 + c): which count, and the scale of each one's loss gradient
   (gscale, or the upstream gradient of each token's own loss). Whether any counts. */
static bool lce_chunk_rows(lce_call *k, int64_t n0, int64_t c, double gscale)
{
    const fx_lce *p = k->p;
    bool any_valid = false;
    for (int64_t r = 0; r < c; r++) {
        lce_row *row = &k->rows[r];
        row->valid = k->target[n0 + r] != p->ignore_index;
        any_valid |= row->valid != 0;
        if (k->lse_in && p->reduction == FX_REDUCTION_NONE)
            row->scale = k->grad_loss[n0 + r];
        else
            row->scale = (float)gscale;
    }
    return any_valid;
}

/* The forward's token losses from the chunk's statistics: each row's lse and loss, written to
   the outputs that were asked for. Returns the chunk's sum of losses. */
static double lce_chunk_losses(lce_call *k, int64_t n0, int64_t c)
{
    const fx_lce *p = k->p;
    const float eps = p->label_smoothing, zl = p->z_loss;
    double total = 0.0;
    for (int64_t r = 0; r < c; r++) {
        lce_row *row = &k->rows[r];
        double lse = (double)row->st.m + log(row->st.s);
        row->lse = (float)lse;
        row->loss = 0.0;
        if (row->valid) {
            row->loss = lse - (1.0 - (double)eps) * (double)row->z_y + (double)zl * lse * lse;
            if (eps > 0.0f) /* sum_z is -inf when entries are masked with -inf */
                row->loss -= (double)eps * row->st.sum_z / (double)p->V;
        }
        if (k->lse_out)
            k->lse_out[n0 + r] = row->lse;
        if (k->loss && p->reduction == FX_REDUCTION_NONE)
            k->loss[n0 + r] = (float)row->loss;
        total += row->loss;
    }
    return total;
}

/* The chunk's coefficients of d loss / d z_j = p_j (1 + 2 s lse) - eps/V - (1-eps) [j == y],
   per token. */
static void lce_chunk_coefs(lce_call *k, int64_t c)
{
    const float eps = k->p->label_smoothing, zl = k->p->z_loss;
    const float inv_v = (float)(1.0 / (double)k->p->V);
    for (int64_t r = 0; r < c; r++) {
        const lce_row *row = &k->rows[r];
        const float sc = row->valid ? row->scale : 0.0f;
        k->c_lse[r] = row->lse;
        k->c_a[r] = sc * (1.0f + 2.0f * zl * row->lse);
        k->c_b[r] = sc * eps * inv_v;
        k->c_keep[r] = row->valid ? 1.0f : 0.0f;
    }
}

/* The call, chunk by chunk: the forward (no lse_in) computes each chunk's statistics and
   losses, and with gradients asked for backpropagates them at once; the backward (lse_in)
   backpropagates from the given lse. */
static int lce_run(lce_call *k)
{
    const fx_lce *p = k->p;
    const bool forward = k->lse_in == NULL;
    const bool grads = k->dh || k->dw || k->dbias;
    const int64_t N = p->N, V = p->V, D = p->D;
    unsigned char *scratch = NULL;
    int rc = lce_scratch(k, &scratch);
    if (rc != FX_OK)
        return rc;
    lce_route(k);

    /* d(reduced loss)/d(token loss) times the upstream gradient, for MEAN and SUM. */
    double gscale = 1.0;
    if (!forward && p->reduction != FX_REDUCTION_NONE)
        gscale = (double)k->grad_loss[0];
    if (p->reduction == FX_REDUCTION_MEAN)
        gscale = k->n_valid > 0 ? gscale / (double)k->n_valid : 0.0;

    /* The chunks share the tokens evenly (at most C each): a short last chunk would cost a
       whole pass over w and dw for a few tokens, in vectors mostly empty. */
    const int64_t nch = (N + k->C - 1) / k->C, base = N / nch, rem = N % nch;
    double total = 0.0;
    for (int64_t q = 0; q < nch; q++) {
        const int64_t n0 = q * base + lce_min64(q, rem), c = base + (q < rem);
        const bool any_valid = lce_chunk_rows(k, n0, c, gscale);
        if (!forward && (!grads || !any_valid)) {
            if (k->dh)
                memset(k->dh + n0 * D, 0, (size_t)(c * D) * sizeof(float));
            continue;
        }
        k->prod->pack_h(k, n0, c);
        if (forward) {
            lce_chunk_stats(k, n0, c);
            total += lce_chunk_losses(k, n0, c);
        } else {
            for (int64_t r = 0; r < c; r++)
                k->rows[r].lse = k->lse_in[n0 + r];
        }
        if (!grads)
            continue;
        if (!any_valid) {
            /* Nothing to add to dw or dbias; dh of this chunk is zero. */
            if (k->dh)
                memset(k->dh + n0 * D, 0, (size_t)(c * D) * sizeof(float));
            continue;
        }
        lce_chunk_coefs(k, c);
        /* With one tile per chunk, the forward's logits are still in the buffer. */
        const bool resident = forward && k->Vb >= V;
        if (lce_slabbed(k->Vb, V))
            lce_chunk_backprop_slabs(k, n0, c);
        else
            lce_chunk_backprop(k, n0, c, resident);
    }
    if (forward && k->loss && p->reduction != FX_REDUCTION_NONE) {
        if (p->reduction == FX_REDUCTION_MEAN)
            k->loss[0] = k->n_valid > 0 ? (float)(total / (double)k->n_valid) : NAN;
        else
            k->loss[0] = (float)total;
    }
    fx__free(scratch);
    return FX_OK;
}

/* ---- public entry points ------------------------------------------------------------------ */

fx_lce fx_lce_defaults(int64_t N, int64_t D, int64_t V)
{
    return (fx_lce){.N = N, .D = D, .V = V, .ignore_index = -100, .reduction = FX_REDUCTION_MEAN,
                    .dtype = FX_DT_F32};
}

int fx_linear_cross_entropy_plan(const fx_lce *p, int64_t *chunk, int64_t *vocab_chunk, size_t *workspace_bytes)
{
    int rc = fx__lce_check_params(p);
    if (rc != FX_OK)
        return rc;
    int64_t c, vb;
    size_t bytes;
    lce_plan(p, &c, &vb, &bytes);
    if (chunk)
        *chunk = c;
    if (vocab_chunk)
        *vocab_chunk = vb;
    if (workspace_bytes)
        *workspace_bytes = bytes;
    return FX_OK;
}

int fx__lce_check_inputs(const fx_lce *p, const float *h, const float *w, const int64_t *target)
{
    int rc = fx__lce_check_params(p);
    if (rc != FX_OK)
        return rc;
    if (!h)
        return fx__error(FX_EINVAL, "h is NULL");
    if (!w)
        return fx__error(FX_EINVAL, "w is NULL");
    if (!target)
        return fx__error(FX_EINVAL, "target is NULL");
    return FX_OK;
}

/* The bf16 call's products: in bfloat16 pairs on a path that packs its panels pair by pair
   (vdpbf16ps), else float32 products of the bfloat16 values by the float32 call's kernels. */
static const fx__bf16_tiled *lce_dp_path(void)
{
    const fx__bf16_tiled *t = fx__gemm_bf16_kernels_now();
    return t->kernel && !t->a_rows ? t : NULL;
}

/* The forward call; h and w stored in bfloat16 only on the pair route (dp set, round_g). */
static int lce_forward(const fx_lce *p, fx__bf16_mat h, fx__bf16_mat w, const fx__bf16_tiled *dp, const float *bias,
                       const int64_t *target, float *loss, float *lse, float *dh, float *dw, float *dbias,
                       bool round_g)
{
    int rc = fx__lce_check_inputs(p, h.p, w.p, target);
    if (rc != FX_OK)
        return rc;
    const size_t N = (size_t)p->N, D = (size_t)p->D, V = (size_t)p->V, f = sizeof(float);
    const size_t nloss = p->reduction == FX_REDUCTION_NONE ? N : 1, fh = h.bf16 ? 2 : f, fw = w.bf16 ? 2 : f;
    const fx__span in[] = {{"h", h.p, N * D * fh}, {"w", w.p, V * D * fw}, {"bias", bias, V * f},
                           {"target", target, N * sizeof(int64_t)}};
    const fx__span out[] = {{"loss", loss, nloss * f}, {"lse", lse, N * f}, {"dh", dh, N * D * f},
                            {"dw", dw, V * D * f}, {"dbias", dbias, V * f}};
    if ((rc = fx__check_overlaps(in, 4, out, 5)) != FX_OK)
        return rc;
    lce_call k = {.p = p, .h = h.bf16 ? NULL : h.p, .w = w.bf16 ? NULL : w.p, .bias = bias, .target = target,
                  .loss = loss, .lse_out = lse, .dh = dh, .dw = dw, .dbias = dbias, .round_g = round_g,
                  .dp = {.t = dp}, .h16 = h, .w16 = w};
    if ((rc = lce_check_targets(p, target, &k.n_valid)) != FX_OK)
        return rc;
    return lce_run(&k);
}

int fx_linear_cross_entropy(const fx_lce *p, const float *h, const float *w, const float *bias,
                            const int64_t *target, float *loss, float *lse, float *dh, float *dw, float *dbias)
{
    const fx__backend *dev = p ? fx__backend_of(p->device, p->dtype) : NULL;
    if (dev) /* device memory or bfloat16 tensors: that backend's call */
        return dev->lce(p, h, w, bias, target, loss, lse, NULL, NULL, dh, dw, dbias);
    return lce_forward(p, fx__bf16_of_f32(h), fx__bf16_of_f32(w), NULL, bias, target, loss, lse, dh, dw, dbias, false);
}

bool fx__lce_bf16_pairs(void) { return lce_dp_path() != NULL; }

int fx__linear_cross_entropy_bf16(const fx_lce *p, fx__bf16_mat h, fx__bf16_mat w, const float *bias,
                                  const int64_t *target, float *loss, float *lse, float *dh, float *dw, float *dbias)
{
    if (p && fx__backend_of(p->device, p->dtype))
        return fx__error(FX_EINVAL, "fx__linear_cross_entropy_bf16: the CPU's float32 call only");
    const fx__bf16_tiled *dp = lce_dp_path();
    if (!dp && (h.bf16 || w.bf16))
        return fx__error(FX_EINVAL, "fx__linear_cross_entropy_bf16: h and w in bfloat16 storage need the pair route "
                                    "(the float32 route's kernels read float32)");
    return lce_forward(p, h, w, dp, bias, target, loss, lse, dh, dw, dbias, true);
}

int fx_linear_cross_entropy_backward(const fx_lce *p, const float *h, const float *w, const float *bias,
                                     const int64_t *target, const float *lse, const float *grad_loss,
                                     float *dh, float *dw, float *dbias)
{
    const fx__backend *dev = p ? fx__backend_of(p->device, p->dtype) : NULL;
    if (dev) /* device memory or bfloat16 tensors: that backend's call */
        return dev->lce(p, h, w, bias, target, NULL, NULL, lse, grad_loss, dh, dw, dbias);
    int rc = fx__lce_check_inputs(p, h, w, target);
    if (rc != FX_OK)
        return rc;
    if (!lse)
        return fx__error(FX_EINVAL, "lse is NULL (pass the lse of the forward call)");
    if (!grad_loss)
        return fx__error(FX_EINVAL, "grad_loss is NULL");
    const size_t N = (size_t)p->N, D = (size_t)p->D, V = (size_t)p->V, f = sizeof(float);
    const size_t ngrad = p->reduction == FX_REDUCTION_NONE ? N : 1;
    const fx__span in[] = {{"h", h, N * D * f}, {"w", w, V * D * f}, {"bias", bias, V * f},
                           {"target", target, N * sizeof(int64_t)}, {"lse", lse, N * f},
                           {"grad_loss", grad_loss, ngrad * f}};
    const fx__span out[] = {{"dh", dh, N * D * f}, {"dw", dw, V * D * f}, {"dbias", dbias, V * f}};
    if ((rc = fx__check_overlaps(in, 6, out, 3)) != FX_OK)
        return rc;
    lce_call k = {.p = p, .h = h, .w = w, .bias = bias, .target = target, .lse_in = lse,
                  .grad_loss = grad_loss, .dh = dh, .dw = dw, .dbias = dbias};
    if ((rc = lce_check_targets(p, target, &k.n_valid)) != FX_OK)
        return rc;
    return lce_run(&k);
}
