/* Matrix-vector products over float32 / bfloat16 / float16 weights (see gemv.h): the
   scalar reference, the kernel tables and the thread split. */
#include "core/gemv.h"

#include "core/gemm_bf16.h"
#include "core/sgemm.h"

#include <string.h>

/* Element i of W as float32. */
static inline float fx__elem(const void *w, fx_dtype dt, size_t i)
{
    switch (dt) {
    case FX_DT_BF16: return fx_bf16_to_f32(((const uint16_t *)w)[i]);
    case FX_DT_F16: return fx_f16_to_f32(((const uint16_t *)w)[i]);
    default: return ((const float *)w)[i];
    }
}

void fx__gemv_rows_scalar(float *y, const void *w, fx_dtype dt, const float *x, int64_t r0, int64_t r1, int64_t I,
                          bool acc)
{
    for (int64_t r = r0; r < r1; r++) {
        float s = 0.0f;
        for (int64_t i = 0; i < I; i++)
            s += fx__elem(w, dt, (size_t)(r * I + i)) * x[i];
        y[r] = acc ? y[r] + s : s;
    }
}

static void fx__widen_scalar(float *dst, const void *src, fx_dtype dt, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = fx__elem(src, dt, (size_t)i);
}

const fx__gemv_kernels fx__gemv_kernels_scalar = {"scalar", fx__gemv_rows_scalar, fx__widen_scalar};
const fx__gemv_kernels fx__gemv_kernels_avx2 = {"avx2", fx__gemv_rows_avx2, fx__widen_avx2};

const fx__gemv_kernels *fx__gemv_kernels_for(fx_isa isa)
{
#ifdef FLEXC_REFERENCE_KERNELS
    (void)isa;
    return &fx__gemv_kernels_scalar;
#else
    return FX__PER_ISA(isa, &fx__gemv_kernels_scalar, &fx__gemv_kernels_avx2, &fx__gemv_kernels_avx2);
#endif
}

const fx__gemv_kernels *fx__gemv_kernels_now(void) { return fx__gemv_kernels_for(fx__isa()); }

/* Rows per block of the thread split. */
enum { FX__GEMV_BLOCK = 32 };

void fx__gemv(float *y, const void *w, fx_dtype dt, const float *x, int64_t O, int64_t I, bool acc)
{
    const fx__gemv_kernels *k = fx__gemv_kernels_now();
    const int64_t nb = (O + FX__GEMV_BLOCK - 1) / FX__GEMV_BLOCK;
    /* Threads only when the matrix is worth waking them for (about 64 KB of float32). */
#pragma omp parallel for schedule(static) if (O * I >= (1 << 14) && nb > 1)
    for (int64_t b = 0; b < nb; b++) {
        int64_t r0 = b * FX__GEMV_BLOCK, r1 = r0 + FX__GEMV_BLOCK < O ? r0 + FX__GEMV_BLOCK : O;
        k->rows(y, w, dt, x, r0, r1, I, acc);
    }
}

void fx__widen_rows(float *dst, const void *w, fx_dtype dt, int64_t r0, int64_t r1, int64_t I)
{
    const size_t esz = fx_dtype_size(dt);
    const unsigned char *src = (const unsigned char *)w + (size_t)(r0 * I) * esz;
    const int64_t n = (r1 - r0) * I;
    if (dt == FX_DT_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    const fx__gemv_kernels *k = fx__gemv_kernels_now();
    enum { CHUNK = 1 << 14 };
    const int64_t nc = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) if (nc > 1)
    for (int64_t c = 0; c < nc; c++) {
        int64_t a = c * CHUNK, e = a + CHUNK < n ? a + CHUNK : n;
        k->widen(dst + a, src + (size_t)a * esz, dt, e - a);
    }
}

/* The products over a widened matrix split their work among the threads in one parallel
   region: each thread widens its own tiles into its own scratch and multiplies them alone
   (fx__sgemm runs on the calling thread inside a region). Every element of the result is the
   same sum either way (fx__sgemm computes an element alike whatever the shape or thread), so
   the split changes no bit; it saves the two regions a tile (widening, then the product) that
   the tile-by-tile loop pays, thousands a training step on a large vocabulary. The split needs
   a tile of scratch per thread, allocated here; without it, or with fewer tiles (rows) than
   threads, the loop runs instead. */
static int fx__dt_team(int64_t parts)
{
    const int nt = fx__in_parallel() ? 1 : fx__max_threads();
    return nt > 1 && parts >= nt ? nt : 1;
}

/* op(x) [N, K] times W as its op (W [O, I] in BF16) on the own tiled float32 GEMM, whose
   packing widens W's values as it reads them: one product over all of W (x packed once,
   not once per widened tile), each element computed as fx__sgemm computes it over the
   widened W, so a BF16 W and its float32 widening give the same bits. false where that GEMM
   is not this path's or its scratch cannot be had (the caller widens tiles instead). */
static bool fx__linear_bf16w(bool tw, int64_t M, int64_t N, int64_t K, const float *x, int64_t ldx, const void *w,
                             int64_t ldw, bool acc, float *y, int64_t ldy)
{
    const fx__sgemm_path *own = fx__gemm_kernels_now()->tiled;
    float *ws = own ? fx__alloc(fx__sgemm_tiled_ws(M, N, K) * sizeof(float)) : NULL;
    if (!ws)
        return false;
    const double t0 = fx__gemm_trace_begin();
    fx__sgemm_tiled(own, FX__SG_AUTO, false, tw, M, N, K, 1.0f, fx__sgemm_f32(x), ldx,
                    (fx__sgemm_mat){w, FX__SG_BF16}, ldw, acc ? 1.0f : 0.0f, y, ldy, ws);
    if (t0 >= 0.0)
        fx__gemm_trace_end(&(fx__gemm_shape){.tb = tw, .M = M, .N = N, .K = K, .b16 = true}, t0);
    fx__free(ws);
    return true;
}

void fx__linear_dt(float *y, int64_t ldy, const float *x, const void *w, fx_dtype dt, int64_t N, int64_t I,
                   int64_t O, bool acc, float *scratch)
{
    if (N == 1) {
        fx__gemv(y, w, dt, x, O, I, acc);
        return;
    }
    if (dt == FX_DT_F32) {
        fx__sgemm(false, true, N, O, I, 1.0f, x, I, w, I, acc ? 1.0f : 0.0f, y, ldy);
        return;
    }
    if (dt == FX_DT_BF16 && fx__linear_bf16w(true, N, O, I, x, I, w, I, acc, y, ldy))
        return;
    /* (A few rows, as a short prompt's, are cheap either way: no scratch a thread for them.) */
    const int64_t tiles = (O + FX__WIDEN_TILE - 1) / FX__WIDEN_TILE;
    const int nt = N >= 64 ? fx__dt_team(tiles) : 1;
    float *ws = nt > 1 ? fx__alloc((size_t)nt * FX__WIDEN_TILE * (size_t)I * sizeof(float)) : NULL;
    if (ws) {
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t tl = 0; tl < tiles; tl++) {
            float *mine = ws + (size_t)fx__thread_id() * FX__WIDEN_TILE * (size_t)I;
            const int64_t r0 = tl * FX__WIDEN_TILE, r1 = r0 + FX__WIDEN_TILE < O ? r0 + FX__WIDEN_TILE : O;
            fx__widen_rows(mine, w, dt, r0, r1, I);
            fx__sgemm(false, true, N, r1 - r0, I, 1.0f, x, I, mine, I, acc ? 1.0f : 0.0f, y + r0, ldy);
        }
        fx__free(ws);
        return;
    }
    for (int64_t r0 = 0; r0 < O; r0 += FX__WIDEN_TILE) {
        int64_t r1 = r0 + FX__WIDEN_TILE < O ? r0 + FX__WIDEN_TILE : O;
        fx__widen_rows(scratch, w, dt, r0, r1, I);
        fx__sgemm(false, true, N, r1 - r0, I, 1.0f, x, I, scratch, I, acc ? 1.0f : 0.0f, y + r0, ldy);
    }
}

/* dx [n rows from dx, dy] += or = dy W over the tiles of W in order, widened into tile. */
static void fx__linear_dt_t_rows(float *dx, const float *dy, int64_t ldy, const void *w, fx_dtype dt, int64_t n,
                                 int64_t I, int64_t O, bool acc, float *tile)
{
    if (O == 0 && !acc)
        memset(dx, 0, (size_t)(n * I) * sizeof *dx);
    for (int64_t r0 = 0; r0 < O; r0 += FX__WIDEN_TILE) {
        int64_t r1 = r0 + FX__WIDEN_TILE < O ? r0 + FX__WIDEN_TILE : O;
        fx__widen_rows(tile, w, dt, r0, r1, I);
        fx__sgemm(false, false, n, I, r1 - r0, 1.0f, dy + r0, ldy, tile, I, acc || r0 ? 1.0f : 0.0f, dx, I);
    }
}

void fx__linear_dt_t(float *dx, const float *dy, int64_t ldy, const void *w, fx_dtype dt, int64_t N, int64_t I,
                     int64_t O, bool acc, float *scratch)
{
    if (dt == FX_DT_F32) {
        fx__sgemm(false, false, N, I, O, 1.0f, dy, ldy, w, I, acc ? 1.0f : 0.0f, dx, I);
        return;
    }
    if (dt == FX_DT_BF16 && fx__linear_bf16w(false, N, I, O, dy, ldy, w, I, acc, dx, I))
        return;
    /* Split by rows of dx (each thread all of W's tiles, in order: the same sums); worth it
       when each thread has rows enough to amortise widening W again. */
    const int nt = fx__dt_team(N / 64);
    float *ws = nt > 1 ? fx__alloc((size_t)nt * FX__WIDEN_TILE * (size_t)I * sizeof(float)) : NULL;
    if (ws) {
        const int64_t per = (N + nt - 1) / nt;
#pragma omp parallel num_threads(nt)
        {
            const int t = fx__thread_id();
            const int64_t n0 = t * per, n1 = n0 + per < N ? n0 + per : N;
            if (n1 > n0)
                fx__linear_dt_t_rows(dx + n0 * I, dy + n0 * ldy, ldy, w, dt, n1 - n0, I, O, acc,
                                     ws + (size_t)t * FX__WIDEN_TILE * (size_t)I);
        }
        fx__free(ws);
        return;
    }
    fx__linear_dt_t_rows(dx, dy, ldy, w, dt, N, I, O, acc, scratch);
}

/* ---- bfloat16 products ------------------------------------------------------------------------ */

static fx__bf16_mat fx__bf16_rows(const void *w, fx_dtype dt, int64_t r0, int64_t I)
{
    return dt == FX_DT_BF16 ? fx__bf16_of((const uint16_t *)w + r0 * I) : fx__bf16_of_f32((const float *)w + r0 * I);
}

size_t fx__linear_bf16_ws(int64_t N, int64_t I, int64_t O)
{
    const int64_t R = O < FX__BF16_ROWS ? O : FX__BF16_ROWS;
    const size_t fwd = fx__gemm_bf16_ws(N, R, I), dx = fx__gemm_bf16_ws(N, I, R);
    return fwd > dx ? fwd : dx;
}

void fx__linear_bf16(float *y, int64_t ldy, const float *x, const void *w, fx_dtype dt, int64_t N, int64_t I,
                     int64_t O, bool acc, float *ws)
{
    for (int64_t r0 = 0; r0 < O; r0 += FX__BF16_ROWS) {
        const int64_t r1 = r0 + FX__BF16_ROWS < O ? r0 + FX__BF16_ROWS : O;
        fx__gemm_bf16(false, true, N, r1 - r0, I, fx__bf16_of_f32(x), I, fx__bf16_rows(w, dt, r0, I), I,
                      acc ? 1.0f : 0.0f, y + r0, ldy, ws);
    }
}

void fx__linear_bf16_t(float *dx, const float *dy, int64_t ldy, const void *w, fx_dtype dt, int64_t N, int64_t I,
                       int64_t O, bool acc, float *ws)
{
    if (O == 0 && !acc)
        memset(dx, 0, (size_t)(N * I) * sizeof *dx);
    for (int64_t r0 = 0; r0 < O; r0 += FX__BF16_ROWS) {
        const int64_t r1 = r0 + FX__BF16_ROWS < O ? r0 + FX__BF16_ROWS : O;
        fx__gemm_bf16(false, false, N, I, r1 - r0, fx__bf16_of_f32(dy + r0), ldy, fx__bf16_rows(w, dt, r0, I), I,
                      acc || r0 ? 1.0f : 0.0f, dx, I, ws);
    }
}
