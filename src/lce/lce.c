/* Fused linear + cross-entropy (DESIGN.md §4): the logits of a chunk of tokens are computed
   with one GEMM, reduced to the log-sum-exp and the loss, turned into gradients in place and
   fed to the dh and dw GEMMs, so the [N, V] logits never exist. */
#include "lce_internal.h"

#include <limits.h>
#include <pthread.h>
#include <math.h>
#include <string.h>

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

const fx__lce_kernels fx__lce_kernels_scalar = {lce_stats_scalar, lce_prep_scalar, lce_grad_scalar};

const fx__lce_kernels *fx__lce_kernels_now(void)
{
    switch (fx__isa()) {
    case FX_ISA_AVX512: return &fx__lce_kernels_avx512;
    case FX_ISA_AVX2: return &fx__lce_kernels_avx2;
    case FX_ISA_SCALAR: break;
    }
    return &fx__lce_kernels_scalar;
}

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

/* The automatic tile aims at about a core complex's last-level cache, never more than 1/32 of
   the logits it stands in for (so the loss always needs 32x less memory than materialising
   them), and at least LCE_ROWS_MIN tokens, below which the GEMMs lose much of their speed.
   When even LCE_ROWS_MIN whole rows exceed LCE_TILE_MAX, the vocabulary is tiled too. */
#define LCE_TILE_TARGET ((double)(32u << 20))
#define LCE_TILE_MIN ((double)(1u << 20))
#define LCE_TILE_MAX ((double)(128u << 20))
enum { LCE_ROWS_MIN = 16, LCE_ROWS_VTILED = 64 };

static int64_t lce_min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t lce_max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Vocabulary entries per block of a tile: a block's logits of a 64-token chunk (256 KB) are
   still in L2 when its statistics or gradients are taken and its dw GEMM runs. */
enum { LCE_VBLOCK = 1024 };

static size_t lce_tile_bytes(int64_t c, int64_t vb)
{
    size_t tile = (size_t)c * (size_t)vb * sizeof(float);
    return (tile + 63) & ~(size_t)63;
}

static void lce_plan(const fx_lce *p, int64_t *chunk, int64_t *vchunk, size_t *bytes)
{
    const int64_t N = p->N, V = p->V;
    int64_t vb = p->vocab_chunk > 0 ? lce_min64(p->vocab_chunk, V) : V;
    if (p->vocab_chunk == 0 && p->chunk == 0 && 4.0 * (double)lce_min64(N, LCE_ROWS_MIN) * (double)V > LCE_TILE_MAX)
        vb = lce_min64(V, lce_max64(256, (int64_t)(LCE_TILE_TARGET / (4.0 * LCE_ROWS_VTILED))));
    int64_t c;
    if (p->chunk > 0) {
        c = lce_min64(p->chunk, N);
    } else {
        double logits = 4.0 * (double)N * (double)V;
        double budget = fmin(LCE_TILE_TARGET, fmax(LCE_TILE_MIN, logits / 32.0));
        double per_row = 4.0 * (double)vb + (double)sizeof(lce_row) +
                         (double)((vb + LCE_VBLOCK - 1) / LCE_VBLOCK) * (double)sizeof(fx__lce_stat);
        c = (int64_t)(budget / per_row);
        c = lce_min64(lce_max64(c, lce_min64(N, LCE_ROWS_MIN)), N);
    }
    c = lce_min64(c, INT_MAX);
    /* Sizes were checked to fit; the tile of a user's chunk may still be huge, and then the
       allocation fails cleanly. */
    const size_t nb = (size_t)((vb + LCE_VBLOCK - 1) / LCE_VBLOCK);
    *chunk = c;
    *vchunk = vb;
    if (4.0 * (double)c * ((double)vb + 16.0) > (double)(SIZE_MAX / 4)) {
        *bytes = SIZE_MAX; /* no allocation can satisfy it: fx__alloc reports FX_ENOMEM */
        return;
    }
    *bytes = lce_tile_bytes(c, vb) + (size_t)c * (sizeof(lce_row) + nb * sizeof(fx__lce_stat));
}

/* ---- checks ------------------------------------------------------------------------------- */

static int lce_check_params(const fx_lce *p)
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
    if (p->chunk < 0)
        return fx__error(FX_EINVAL, "chunk = %lld must be >= 0 (0: automatic)", (long long)p->chunk);
    if (p->vocab_chunk < 0)
        return fx__error(FX_EINVAL, "vocab_chunk = %lld must be >= 0 (0: automatic)", (long long)p->vocab_chunk);
    return FX_OK;
}

typedef struct lce_span {
    const char *name;
    const void *ptr;
    size_t bytes;
} lce_span;

static bool lce_overlap(const lce_span *a, const lce_span *b)
{
    uintptr_t a0 = (uintptr_t)a->ptr, b0 = (uintptr_t)b->ptr;
    return a->ptr && b->ptr && a0 < b0 + b->bytes && b0 < a0 + a->bytes;
}

/* Outputs against inputs and against each other: a chunk's dh is written while h is still
   read, so aliasing would silently corrupt the result. */
static int lce_check_overlaps(const lce_span *in, size_t nin, const lce_span *out, size_t nout)
{
    for (size_t i = 0; i < nout; i++) {
        for (size_t j = 0; j < nin; j++)
            if (lce_overlap(&out[i], &in[j]))
                return fx__error(FX_EINVAL, "%s overlaps the input %s", out[i].name, in[j].name);
        for (size_t j = 0; j < i; j++)
            if (lce_overlap(&out[i], &out[j]))
                return fx__error(FX_EINVAL, "%s overlaps %s", out[i].name, out[j].name);
    }
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

/* OpenBLAS's own controls, declared here because not every cblas.h declares them. */
int openblas_get_parallel(void);
int openblas_get_num_threads(void);
void openblas_set_num_threads(int num_threads);

/* With OpenMP, the work of a chunk is split into vocabulary blocks and hidden-size blocks
   that OpenMP threads share out, each calling a one-thread GEMM: the blocks are the same for
   any thread count, so every element is computed the same way whatever the count, and the
   small GEMMs of a chunk run at the speed of independent single-core GEMMs instead of
   paying a thread hand-off each. A pthreads OpenBLAS is set to one thread for the duration
   of the call (and restored after); an OpenMP OpenBLAS runs one thread inside a parallel
   region by itself. */
#if defined(_OPENMP) && !defined(FLEXC_REFERENCE_KERNELS)
static pthread_mutex_t lce_blas_lock = PTHREAD_MUTEX_INITIALIZER;
static int lce_blas_users, lce_blas_saved;
#endif

static bool lce_blas_serial_begin(void)
{
#if defined(_OPENMP) && !defined(FLEXC_REFERENCE_KERNELS)
    const int kind = openblas_get_parallel();
    if (kind == 0)
        return true;
    if (kind != 1)
        return false;
    pthread_mutex_lock(&lce_blas_lock);
    if (lce_blas_users++ == 0) {
        lce_blas_saved = openblas_get_num_threads();
        if (lce_blas_saved > 1)
            openblas_set_num_threads(1);
    }
    pthread_mutex_unlock(&lce_blas_lock);
    return true;
#else
    return false;
#endif
}

static void lce_blas_serial_end(bool serial)
{
#if defined(_OPENMP) && !defined(FLEXC_REFERENCE_KERNELS)
    if (!serial || openblas_get_parallel() != 1)
        return;
    pthread_mutex_lock(&lce_blas_lock);
    if (--lce_blas_users == 0 && lce_blas_saved > 1)
        openblas_set_num_threads(lce_blas_saved);
    pthread_mutex_unlock(&lce_blas_lock);
#else
    (void)serial;
#endif
}

/* When the GEMMs may run on several BLAS threads, their K is cut into blocks of at most
   LCE_KBLOCK, added in order: OpenBLAS splits K differently on one thread than on several
   once K exceeds its GEMM_Q (384 on current x86 cores, 256 or more everywhere), and a GEMM
   whose K fits one block is computed the same way on any number of threads. */
enum { LCE_KBLOCK = 256 };

/* Tiles smaller than this run on one thread: waking the team would cost more. */
enum { LCE_PAR_MIN = 1 << 16 };

static void lce_sgemm(bool serial, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    const int64_t step = serial ? K : LCE_KBLOCK;
    for (int64_t k0 = 0; k0 < K; k0 += step) {
        const int64_t kb = K - k0 < step ? K - k0 : step;
        fx__sgemm(ta, tb, M, N, kb, 1.0f, ta ? A + k0 * lda : A + k0, lda, tb ? B + k0 : B + k0 * ldb, ldb,
                  k0 == 0 ? beta : 1.0f, C, ldc);
    }
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
    float *tile;               /* [C, Vb] */
    lce_row *rows;             /* [C] */
    fx__lce_stat *part;        /* [C, blocks of a tile]: statistics per vocabulary block */
    const fx__lce_kernels *kern;
    bool serial;               /* the BLAS runs one thread per call */
} lce_call;

/* Columns per block of dh: a fixed count of blocks (at most 4, widths multiples of 16),
   independent of the thread count, that 1, 2 or 4 threads share evenly; each block's GEMM
   packs all of G again, so more blocks would cost more than they balance. */
enum { LCE_DBLOCKS = 4 };

static int64_t lce_dblock(int64_t D)
{
    int64_t nb = (D + 15) / 16 < LCE_DBLOCKS ? (D + 15) / 16 : LCE_DBLOCKS;
    return ((D + nb - 1) / nb + 15) / 16 * 16;
}

/* Tile [v0, v0+vb) of chunk [n0, n0+c): logits of each vocabulary block (one GEMM), then
   either its statistics per row (into k->part) or just the bias and cap (recomputation). */
static void lce_block_logits(const lce_call *k, int64_t n0, int64_t c, int64_t v0, int64_t vb, int64_t b,
                             bool stats)
{
    const fx_lce *p = k->p;
    const int64_t D = p->D, j0 = b * LCE_VBLOCK, n = lce_min64(LCE_VBLOCK, vb - j0);
    const int64_t nb = (vb + LCE_VBLOCK - 1) / LCE_VBLOCK;
    float *Z = k->tile + j0;
    lce_sgemm(k->serial, false, true, c, n, D, k->h + n0 * D, D, k->w + (v0 + j0) * D, D, 0.0f, Z, vb);
    const float *bias = k->bias ? k->bias + v0 + j0 : NULL;
    for (int64_t r = 0; r < c; r++) {
        float *z = Z + r * vb;
        if (!stats) {
            k->kern->prep(z, n, bias, p->softcap);
            continue;
        }
        fx__lce_stat *st = &k->part[r * nb + b];
        *st = (fx__lce_stat){-INFINITY, 0.0, 0.0};
        k->kern->stats(z, n, bias, p->softcap, st);
        const int64_t y = k->target[n0 + r];
        if (y != p->ignore_index && y >= v0 + j0 && y < v0 + j0 + n)
            k->rows[r].z_y = z[y - v0 - j0];
    }
}

/* Folds the block statistics of a tile into each row's running statistics, in block order. */
static void lce_row_merge(const lce_call *k, int64_t r, int64_t nb)
{
    fx__lce_stat *st = &k->rows[r].st;
    for (int64_t b = 0; b < nb; b++) {
        const fx__lce_stat *q = &k->part[r * nb + b];
        const float m = q->m > st->m ? q->m : st->m;
        st->sum_z += q->sum_z;
        if (m == -INFINITY)
            continue; /* nothing but -inf so far (masked entries): keep s = 0 */
        st->s = st->s * exp((double)st->m - (double)m) + q->s * exp((double)q->m - (double)m);
        st->m = m;
    }
}

/* Gradients of one vocabulary block of a tile, in place, and its dw and dbias updates. */
static void lce_block_grad(const lce_call *k, int64_t n0, int64_t c, int64_t v0, int64_t vb, int64_t b)
{
    const fx_lce *p = k->p;
    const int64_t D = p->D, j0 = b * LCE_VBLOCK, n = lce_min64(LCE_VBLOCK, vb - j0);
    const float cap = p->softcap, eps = p->label_smoothing, zl = p->z_loss;
    const float inv_v = (float)(1.0 / (double)p->V);
    float *G = k->tile + j0;
    for (int64_t r = 0; r < c; r++) {
        float *z = G + r * vb;
        const lce_row *row = &k->rows[r];
        if (!row->valid) {
            memset(z, 0, (size_t)n * sizeof *z);
            continue;
        }
        const float sc = row->scale, lse = row->lse;
        /* d loss / d z_j = p_j (1 + 2 s lse) - eps/V - (1-eps) [j == y] */
        const float a = sc * (1.0f + 2.0f * zl * lse), bb = sc * eps * inv_v, t = sc * (1.0f - eps);
        const int64_t y = k->target[n0 + r] - v0 - j0;
        const bool has_y = y >= 0 && y < n;
        const float zy = has_y ? z[y] : 0.0f;
        k->kern->grad(z, n, lse, a, bb, cap);
        if (has_y) {
            float d = 1.0f;
            if (cap > 0.0f) {
                float u = zy / cap;
                d = 1.0f - u * u;
            }
            z[y] = (a * expf(zy - lse) - bb - t) * d;
        }
    }
    if (k->dw)
        lce_sgemm(k->serial, true, false, n, D, c, G, vb, k->h + n0 * D, D, 1.0f, k->dw + (v0 + j0) * D, D);
    if (k->dbias) {
        float *db = k->dbias + v0 + j0;
        for (int64_t r = 0; r < c; r++) {
            const float *g = G + r * vb;
            for (int64_t j = 0; j < n; j++)
                db[j] += g[j];
        }
    }
}

/* Statistics of chunk [n0, n0+c) over every tile; the last tile's logits stay in k->tile. */
static void lce_chunk_stats(const lce_call *k, int64_t n0, int64_t c)
{
    const fx_lce *p = k->p;
    for (int64_t r = 0; r < c; r++) {
        k->rows[r].st = (fx__lce_stat){-INFINITY, 0.0, 0.0};
        k->rows[r].z_y = 0.0f;
    }
    for (int64_t v0 = 0; v0 < p->V; v0 += k->Vb) {
        const int64_t vb = lce_min64(k->Vb, p->V - v0), nb = (vb + LCE_VBLOCK - 1) / LCE_VBLOCK;
#pragma omp parallel if (c * vb >= LCE_PAR_MIN)
        {
#pragma omp for schedule(static)
            for (int64_t b = 0; b < nb; b++)
                lce_block_logits(k, n0, c, v0, vb, b, true);
#pragma omp for schedule(static)
            for (int64_t r = 0; r < c; r++)
                lce_row_merge(k, r, nb);
        }
    }
}

/* Gradients of tile [v0, v0+vb) of chunk [n0, n0+c): recomputed logits unless resident,
   then dw, dbias per vocabulary block and dh (+)= G w[v0:v0+vb] per block of columns
   (overwritten by the first tile). */
static void lce_tile_backprop(const lce_call *k, int64_t n0, int64_t c, int64_t v0, int64_t vb, bool resident)
{
    const int64_t D = k->p->D, nb = (vb + LCE_VBLOCK - 1) / LCE_VBLOCK;
    const int64_t db = lce_dblock(D), nd = (D + db - 1) / db;
#pragma omp parallel if (c * vb >= LCE_PAR_MIN)
    {
#pragma omp for schedule(static)
        for (int64_t b = 0; b < nb; b++) {
            if (!resident)
                lce_block_logits(k, n0, c, v0, vb, b, false);
            lce_block_grad(k, n0, c, v0, vb, b);
        }
        if (k->dh) {
#pragma omp for schedule(static)
            for (int64_t q = 0; q < nd; q++) {
                const int64_t d0 = q * db, dn = lce_min64(db, D - d0);
                lce_sgemm(k->serial, false, false, c, dn, vb, k->tile, vb, k->w + v0 * D + d0, D, v0 == 0 ? 0.0f : 1.0f,
                          k->dh + n0 * D + d0, D);
            }
        }
    }
}

static int lce_run(lce_call *k)
{
    const fx_lce *p = k->p;
    const bool forward = k->lse_in == NULL;
    const bool grads = k->dh || k->dw || k->dbias;
    const float eps = p->label_smoothing, zl = p->z_loss;
    const int64_t N = p->N, V = p->V, D = p->D;

    size_t bytes;
    lce_plan(p, &k->C, &k->Vb, &bytes);
    unsigned char *scratch = bytes == SIZE_MAX ? NULL : fx__alloc(bytes);
    if (!scratch)
        return fx__error(FX_ENOMEM, "fused cross-entropy: cannot allocate %zu bytes of scratch (chunk %lld x %lld)",
                         bytes, (long long)k->C, (long long)k->Vb);
    const size_t tile_bytes = lce_tile_bytes(k->C, k->Vb);
    k->tile = (float *)scratch;
    k->rows = (lce_row *)(scratch + tile_bytes);
    k->part = (fx__lce_stat *)(scratch + tile_bytes + (size_t)k->C * sizeof(lce_row));
    k->kern = fx__lce_kernels_now();
    k->serial = lce_blas_serial_begin();

    /* d(reduced loss)/d(token loss) times the upstream gradient, for MEAN and SUM. */
    double gscale = 1.0;
    if (!forward && p->reduction != FX_REDUCTION_NONE)
        gscale = (double)k->grad_loss[0];
    if (p->reduction == FX_REDUCTION_MEAN)
        gscale = k->n_valid > 0 ? gscale / (double)k->n_valid : 0.0;

    double total = 0.0;
    for (int64_t n0 = 0; n0 < N; n0 += k->C) {
        const int64_t c = lce_min64(k->C, N - n0);
        bool any_valid = false;
        for (int64_t r = 0; r < c; r++) {
            lce_row *row = &k->rows[r];
            row->valid = k->target[n0 + r] != p->ignore_index;
            any_valid |= row->valid != 0;
            if (!forward)
                row->scale = (float)(p->reduction == FX_REDUCTION_NONE ? (double)k->grad_loss[n0 + r] : gscale);
            else
                row->scale = (float)gscale;
        }
        if (forward) {
            lce_chunk_stats(k, n0, c);
            for (int64_t r = 0; r < c; r++) {
                lce_row *row = &k->rows[r];
                double lse = (double)row->st.m + log(row->st.s);
                row->lse = (float)lse;
                row->loss = 0.0;
                if (row->valid) {
                    row->loss = lse - (1.0 - (double)eps) * (double)row->z_y + (double)zl * lse * lse;
                    if (eps > 0.0f) /* sum_z is -inf when entries are masked with -inf */
                        row->loss -= (double)eps * row->st.sum_z / (double)V;
                }
                if (k->lse_out)
                    k->lse_out[n0 + r] = row->lse;
                if (k->loss && p->reduction == FX_REDUCTION_NONE)
                    k->loss[n0 + r] = (float)row->loss;
                total += row->loss;
            }
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
        /* With one tile per chunk, the forward's logits are still in the buffer. */
        const bool resident = forward && k->Vb >= V;
        for (int64_t v0 = 0; v0 < V; v0 += k->Vb)
            lce_tile_backprop(k, n0, c, v0, lce_min64(k->Vb, V - v0), resident);
    }
    if (forward && k->loss && p->reduction != FX_REDUCTION_NONE) {
        if (p->reduction == FX_REDUCTION_MEAN)
            k->loss[0] = k->n_valid > 0 ? (float)(total / (double)k->n_valid) : NAN;
        else
            k->loss[0] = (float)total;
    }
    lce_blas_serial_end(k->serial);
    fx__free(scratch);
    return FX_OK;
}

/* ---- public entry points ------------------------------------------------------------------ */

fx_lce fx_lce_defaults(int64_t N, int64_t D, int64_t V)
{
    return (fx_lce){.N = N, .D = D, .V = V, .ignore_index = -100, .reduction = FX_REDUCTION_MEAN};
}

int fx_linear_cross_entropy_plan(const fx_lce *p, int64_t *chunk, int64_t *vocab_chunk, size_t *workspace_bytes)
{
    int rc = lce_check_params(p);
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

static int lce_check_common(const fx_lce *p, const float *h, const float *w, const int64_t *target)
{
    int rc = lce_check_params(p);
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

int fx_linear_cross_entropy(const fx_lce *p, const float *h, const float *w, const float *bias,
                            const int64_t *target, float *loss, float *lse, float *dh, float *dw, float *dbias)
{
    int rc = lce_check_common(p, h, w, target);
    if (rc != FX_OK)
        return rc;
    const size_t N = (size_t)p->N, D = (size_t)p->D, V = (size_t)p->V, f = sizeof(float);
    const size_t nloss = p->reduction == FX_REDUCTION_NONE ? N : 1;
    const lce_span in[] = {{"h", h, N * D * f}, {"w", w, V * D * f}, {"bias", bias, V * f},
                           {"target", target, N * sizeof(int64_t)}};
    const lce_span out[] = {{"loss", loss, nloss * f}, {"lse", lse, N * f}, {"dh", dh, N * D * f},
                            {"dw", dw, V * D * f}, {"dbias", dbias, V * f}};
    if ((rc = lce_check_overlaps(in, 4, out, 5)) != FX_OK)
        return rc;
    lce_call k = {.p = p, .h = h, .w = w, .bias = bias, .target = target, .loss = loss, .lse_out = lse,
                  .dh = dh, .dw = dw, .dbias = dbias};
    if ((rc = lce_check_targets(p, target, &k.n_valid)) != FX_OK)
        return rc;
    return lce_run(&k);
}

int fx_linear_cross_entropy_backward(const fx_lce *p, const float *h, const float *w, const float *bias,
                                     const int64_t *target, const float *lse, const float *grad_loss,
                                     float *dh, float *dw, float *dbias)
{
    int rc = lce_check_common(p, h, w, target);
    if (rc != FX_OK)
        return rc;
    if (!lse)
        return fx__error(FX_EINVAL, "lse is NULL (pass the lse of the forward call)");
    if (!grad_loss)
        return fx__error(FX_EINVAL, "grad_loss is NULL");
    const size_t N = (size_t)p->N, D = (size_t)p->D, V = (size_t)p->V, f = sizeof(float);
    const size_t ngrad = p->reduction == FX_REDUCTION_NONE ? N : 1;
    const lce_span in[] = {{"h", h, N * D * f}, {"w", w, V * D * f}, {"bias", bias, V * f},
                           {"target", target, N * sizeof(int64_t)}, {"lse", lse, N * f},
                           {"grad_loss", grad_loss, ngrad * f}};
    const lce_span out[] = {{"dh", dh, N * D * f}, {"dw", dw, V * D * f}, {"dbias", dbias, V * f}};
    if ((rc = lce_check_overlaps(in, 6, out, 3)) != FX_OK)
        return rc;
    lce_call k = {.p = p, .h = h, .w = w, .bias = bias, .target = target, .lse_in = lse,
                  .grad_loss = grad_loss, .dh = dh, .dw = dw, .dbias = dbias};
    if ((rc = lce_check_targets(p, target, &k.n_valid)) != FX_OK)
        return rc;
    return lce_run(&k);
}
