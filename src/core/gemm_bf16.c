/* The bfloat16 GEMM (bf16 inputs, float32 accumulation): the kernel tables of the GEMM and of
   the conversions, the plain-C packing and conversion loops, and the fixed-order reference.
   See gemm_bf16.h. */
#include "gemm_bf16.h"
#include "sgemm.h"

#include <stdatomic.h>

/* ---- conversions ----------------------------------------------------------------------------- */

void fx__f32_to_bf16_n_scalar(uint16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = fx__f32_to_bf16(src[i]);
}

void fx__f32_to_bf16_n(uint16_t *dst, const float *src, int64_t n) { fx__bf16_kernels_now()->to_bf16_n(dst, src, n); }

/* ---- packing --------------------------------------------------------------------------------- */

/* The conversions' kernel tables (gemm_bf16.h): the loops of one path each. */
const fx__bf16_kernels fx__bf16_kernels_scalar = {"scalar", fx__f32_to_bf16_n_scalar, fx__bf16_pack_scalar,
                                                  fx__bf16_pack_pairs_scalar, NULL, fx__bf16_pack_rows_scalar};
const fx__bf16_kernels fx__bf16_kernels_avx2 = {"avx2", fx__f32_to_bf16_n_avx2, fx__bf16_pack_avx2,
                                                fx__bf16_pack_pairs_scalar, NULL, fx__bf16_pack_rows_scalar};
const fx__bf16_kernels fx__bf16_kernels_avx512 = {"avx512", fx__f32_to_bf16_n_avx2, fx__bf16_pack_avx2,
                                                  fx__bf16_pack_pairs_avx512, fx__bf16_pack_pairs_sweep_avx512,
                                                  fx__bf16_pack_rows_avx512};

const fx__bf16_kernels *fx__bf16_kernels_for(fx_isa isa)
{
    return FX__PER_ISA(isa, &fx__bf16_kernels_scalar, &fx__bf16_kernels_avx2, &fx__bf16_kernels_avx512);
}

const fx__bf16_kernels *fx__bf16_kernels_now(void) { return fx__bf16_kernels_for(fx__isa()); }

void fx__bf16_pack_scalar(float *dst, fx__bf16_mat src, int64_t rows, int64_t cols, int64_t ld)
{
    for (int64_t r = 0; r < rows; r++) {
        float *d = dst + r * cols;
        if (src.bf16) {
            const uint16_t *s = (const uint16_t *)src.p + r * ld;
            for (int64_t c = 0; c < cols; c++)
                d[c] = fx__bf16_to_f32(s[c]);
        } else {
            const float *s = (const float *)src.p + r * ld;
            for (int64_t c = 0; c < cols; c++)
                d[c] = fx__bf16_round(s[c]);
        }
    }
}

/* Rows per packing task: the split depends on the shape only, and each element's value on
   nothing else, so the packed operand is the same at any thread count. */
enum { FX__PACK_ROWS = 32 };

void fx__bf16_pack(float *dst, fx__bf16_mat src, int64_t rows, int64_t cols, int64_t ld)
{
    void (*pack)(float *, fx__bf16_mat, int64_t, int64_t, int64_t) = fx__bf16_kernels_now()->pack;
    const int64_t ntask = (rows + FX__PACK_ROWS - 1) / FX__PACK_ROWS;
    const bool nested = fx__in_parallel();
    (void)nested; /* read only by the pragma, which is gone without OpenMP */
#pragma omp parallel for schedule(static) if (!nested && rows * cols >= (1 << 15))
    for (int64_t t = 0; t < ntask; t++) {
        const int64_t r0 = t * FX__PACK_ROWS, n = rows - r0 < FX__PACK_ROWS ? rows - r0 : FX__PACK_ROWS;
        fx__bf16_mat s = src;
        s.p = src.bf16 ? (const void *)((const uint16_t *)src.p + r0 * ld) : (const void *)((const float *)src.p + r0 * ld);
        pack(dst + r0 * cols, s, n, cols, ld);
    }
}

/* ---- the GEMM ------------------------------------------------------------------------------- */

size_t fx__gemm_bf16_ws(int64_t M, int64_t N, int64_t K)
{
    /* The widened operands, or the float32 route's packed blocks where their panels' padding
       makes those more, so that the route never depends on the shape's rounding. */
    const size_t widened = (size_t)M * (size_t)K + (size_t)K * (size_t)N, packed = fx__sgemm_tiled_ws(M, N, K);
    return widened > packed ? widened : packed;
}

/* The path the tests force (fx__gemm_bf16_force_tiled); NULL: the CPU's. */
static _Atomic(const fx__bf16_tiled *) fx__bf16_forced;

void fx__gemm_bf16_force_tiled(const fx__bf16_tiled *t) { atomic_store(&fx__bf16_forced, t); }

/* The CPU's path. AMX where it has AMX-BF16. vdpbf16ps only on AMD's cores (on Zen 5 it ran
   at 1.5-2.5x the float32 GEMM at the models' shapes): a Xeon of family 6 model 207 (Emerald
   Rapids) issues it at a quarter of the rate of float32 fused multiply-adds, for half their
   FLOPs (85 against 173 GFLOP/s on one core), so there, as on any CPU not measured, the
   float32 route, which reads the same bfloat16 values, is the one taken (docs/bf16.md). */
const fx__gemm_bf16_kernels *fx__gemm_bf16_kernels_for(fx_isa isa)
{
#ifdef FLEXC_REFERENCE_KERNELS
    (void)isa;
#else
    if (isa == FX_ISA_AVX512 && fx__cpu_has_amx_bf16())
        return &fx__bf16_tiled_amx;
    if (isa == FX_ISA_AVX512 && fx__cpu_has_avx512bf16() && fx__cpu_vendor_amd())
        return &fx__bf16_tiled_dp;
#endif
    return &fx__bf16_tiled_f32;
}

const fx__gemm_bf16_kernels *fx__gemm_bf16_kernels_now(void)
{
#ifdef FLEXC_REFERENCE_KERNELS
    return &fx__bf16_tiled_f32;
#else
    const fx__bf16_tiled *t = atomic_load(&fx__bf16_forced);
    return t ? t : fx__gemm_bf16_kernels_for(fx__isa());
#endif
}

static void fx__gemm_bf16_run(bool ta, bool tb, int64_t M, int64_t N, int64_t K, fx__bf16_mat A, int64_t lda,
                              fx__bf16_mat B, int64_t ldb, float beta, float *C, int64_t ldc, float *ws);

void fx__gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, fx__bf16_mat A, int64_t lda, fx__bf16_mat B,
                   int64_t ldb, float beta, float *C, int64_t ldc, float *ws)
{
    const double t0 = fx__gemm_trace_begin();
    fx__gemm_bf16_run(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, ws);
    if (t0 >= 0.0)
        fx__gemm_trace_end(&(fx__gemm_shape){.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .bf16 = true, .a16 = A.bf16,
                                             .b16 = B.bf16},
                           t0);
}

static void fx__gemm_bf16_run(bool ta, bool tb, int64_t M, int64_t N, int64_t K, fx__bf16_mat A, int64_t lda,
                              fx__bf16_mat B, int64_t ldb, float beta, float *C, int64_t ldc, float *ws)
{
#ifdef FLEXC_REFERENCE_KERNELS
    (void)ws;
    fx__gemm_bf16_ref(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
#else
    if (M == 0 || N == 0)
        return;
    /* AMX or vdpbf16ps multiply the bfloat16 pairs directly where their packed operands fit
       (about half the widened ones' room, plus the panels' padding). */
    const fx__gemm_bf16_kernels *t = fx__gemm_bf16_tiled_route(M, N, K);
    if (t) {
        fx__gemm_bf16_tiled(t, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, (uint32_t *)ws);
        return;
    }
    /* Otherwise float32 products of the bfloat16 values. On the AVX-512 path the float32
       GEMM's packing reads the operands as they are (sgemm.h: one block of k at a time; ws
       holds its blocks, fx__gemm_bf16_ws); elsewhere they are widened into ws first and
       multiplied by fx__sgemm, keeping their stored orientation. Both give the same bits:
       the same values through the same tiled GEMM on AVX-512, BLIS on the other paths. */
    const fx__sgemm_elem ea = A.bf16 ? FX__SG_BF16 : FX__SG_F32_AS_BF16, eb = B.bf16 ? FX__SG_BF16 : FX__SG_F32_AS_BF16;
    const fx__sgemm_path *own = fx__gemm_kernels_now()->tiled;
    if (own) {
        fx__sgemm_tiled(own, FX__SG_AUTO, ta, tb, M, N, K, 1.0f, (fx__sgemm_mat){A.p, ea}, lda, (fx__sgemm_mat){B.p, eb},
                        ldb, beta, C, ldc, ws);
        return;
    }
    const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    float *a32 = ws, *b32 = ws + ar * ac;
    fx__bf16_pack(a32, A, ar, ac, lda);
    fx__bf16_pack(b32, B, br, bc, ldb);
    fx__sgemm(ta, tb, M, N, K, 1.0f, a32, ac, b32, bc, beta, C, ldc);
#endif
}

/* ---- the tiled paths ------------------------------------------------------------------------- */

const fx__bf16_tiled fx__bf16_tiled_dp = {"vdpbf16ps", FX__DP_MR, FX__DP_NR, 1, false, fx__bf16_dp_kernel_avx512bf16,
                                          NULL, NULL};
const fx__bf16_tiled fx__bf16_tiled_amx = {"amx", FX__AMX_MR, FX__AMX_NR, FX__AMX_PAIRS, true, fx__bf16_amx_kernel,
                                           fx__bf16_amx_enter, fx__bf16_amx_leave};
const fx__bf16_tiled fx__bf16_tiled_f32 = {"float32", 0, 0, 1, false, NULL, NULL, NULL};

/* dst [n] = the bfloat16 values of x's n elements from flat index i on. */
static void fx__bf16_bits_n(uint16_t *dst, fx__bf16_mat x, int64_t i, int64_t n)
{
    if (x.bf16)
        memcpy(dst, (const uint16_t *)x.p + i, (size_t)n * sizeof(uint16_t));
    else
        fx__f32_to_bf16_n(dst, (const float *)x.p + i, n);
}

/* Pairs converted per step (by fx__f32_to_bf16_n's vector loop) along a line whose k are
   contiguous; the widest panel (fx__bf16_pack_pairs' width). */
enum { FX__PACK_PAIRS = 64, FX__PACK_WIDTH = 32 };

/* Words [p0, p0 + np) of line (l0 + l) of a panel whose lines have their k contiguous (lk):
   dst [i] = pair p0 + i, zero past K. */
static void fx__bf16_line_words(uint32_t *dst, fx__bf16_mat x, int64_t ld, int64_t line, int64_t K, int64_t p0,
                                int64_t np)
{
    uint16_t h[2 * FX__PACK_PAIRS];
    const int64_t nk = K - 2 * p0 < 2 * np ? K - 2 * p0 : 2 * np;
    fx__bf16_bits_n(h, x, line * ld + 2 * p0, nk);
    if (nk < 2 * np)
        h[nk] = 0; /* past an odd K */
    for (int64_t i = 0; i < np; i++)
        dst[i] = (uint32_t)h[2 * i] | (uint32_t)h[2 * i + 1] << 16;
}

/* Pair p of the panel's nl lines when rows of x hold lines contiguously (not lk): rows 2p and
   2p + 1 interleaved, dst [l * stride]. */
static void fx__bf16_pair_words(uint32_t *dst, int64_t stride, fx__bf16_mat x, int64_t ld, int64_t l0, int64_t nl,
                                int64_t K, int64_t p)
{
    uint16_t lo[FX__PACK_WIDTH], hi[FX__PACK_WIDTH];
    fx__bf16_bits_n(lo, x, 2 * p * ld + l0, nl);
    if (2 * p + 1 < K)
        fx__bf16_bits_n(hi, x, (2 * p + 1) * ld + l0, nl);
    else
        memset(hi, 0, sizeof hi);
    for (int64_t l = 0; l < nl; l++)
        dst[l * stride] = (uint32_t)lo[l] | (uint32_t)hi[l] << 16;
}

void fx__bf16_pack_pairs_scalar(uint32_t *dst, fx__bf16_mat x, int64_t ld, bool lk, int64_t lines, int64_t K,
                                int64_t pairs, int64_t width, int64_t q)
{
    const int64_t K2 = (K + 1) / 2, l0 = q * width, nl = lines - l0 < width ? lines - l0 : width;
    if (lk) {
        /* Line by line (its k contiguous), each run of words scattered to the line's column. */
        uint32_t w[FX__PACK_PAIRS];
        for (int64_t l = 0; l < nl; l++)
            for (int64_t p0 = 0; p0 < K2; p0 += FX__PACK_PAIRS) {
                const int64_t np = K2 - p0 < FX__PACK_PAIRS ? K2 - p0 : FX__PACK_PAIRS;
                fx__bf16_line_words(w, x, ld, l0 + l, K, p0, np);
                for (int64_t i = 0; i < np; i++)
                    dst[(p0 + i) * width + l] = w[i];
            }
    } else {
        for (int64_t p = 0; p < K2; p++)
            fx__bf16_pair_words(dst + p * width, 1, x, ld, l0, nl, K, p);
    }
    fx__bf16_pack_pairs_pad(dst, K2, nl, pairs, width);
}

void fx__bf16_pack_pairs(uint32_t *dst, fx__bf16_mat x, int64_t ld, bool lk, int64_t lines, int64_t K, int64_t pairs,
                         int64_t width, int64_t q)
{
    fx__bf16_kernels_now()->pack_pairs(dst, x, ld, lk, lines, K, pairs, width, q);
}

void fx__bf16_pack_rows(uint32_t *dst, fx__bf16_mat x, int64_t ld, bool lk, int64_t lines, int64_t K, int64_t pairs,
                        int64_t width, int64_t q)
{
    fx__bf16_kernels_now()->pack_rows(dst, x, ld, lk, lines, K, pairs, width, q);
}

void fx__bf16_pack_rows_scalar(uint32_t *dst, fx__bf16_mat x, int64_t ld, bool lk, int64_t lines, int64_t K,
                               int64_t pairs, int64_t width, int64_t q)
{
    const int64_t K2 = (K + 1) / 2, l0 = q * width, nl = lines - l0 < width ? lines - l0 : width;
    memset(dst, 0, (size_t)(width * pairs) * sizeof(uint32_t)); /* the pairs past K, the missing lines */
    if (lk) {
        uint32_t w[FX__PACK_PAIRS];
        for (int64_t l = 0; l < nl; l++)
            for (int64_t p0 = 0; p0 < K2; p0 += FX__PACK_PAIRS) {
                const int64_t np = K2 - p0 < FX__PACK_PAIRS ? K2 - p0 : FX__PACK_PAIRS;
                fx__bf16_line_words(w, x, ld, l0 + l, K, p0, np);
                for (int64_t i = 0; i < np; i++)
                    dst[fx__bf16_row_word(width, l, p0 + i)] = w[i];
            }
    } else {
        uint32_t w[FX__PACK_WIDTH];
        for (int64_t p = 0; p < K2; p++) {
            fx__bf16_pair_words(w, 1, x, ld, l0, nl, K, p);
            for (int64_t l = 0; l < nl; l++)
                dst[fx__bf16_row_word(width, l, p)] = w[l];
        }
    }
}

/* Pairs per task of the AVX-512 sweep (fx__bf16_pack_panels). */
enum { FX__SWEEP_PAIRS = 8 };

/* Every panel of one operand into dst, shared among the threads of the enclosing parallel
   region (no barrier at the end): panel by panel, or, on the AVX-512 path for an operand whose
   rows hold lines (not lk), pair by pair across all panels so that its rows are read front to
   back. Either split gives the same words. */
static void fx__bf16_pack_panels(const fx__bf16_tiled *t, bool a, uint32_t *dst, fx__bf16_mat x, int64_t ld, bool lk,
                                 int64_t lines, int64_t K, int64_t pairs)
{
    const int64_t width = a ? t->mr : t->nr, panels = (lines + width - 1) / width;
    const fx__bf16_kernels *kc = fx__bf16_kernels_now();
    if (!(a && t->a_rows) && !lk && kc->pack_pairs_sweep) {
        const int64_t ntask = (pairs + FX__SWEEP_PAIRS - 1) / FX__SWEEP_PAIRS;
#pragma omp for schedule(static) nowait
        for (int64_t k = 0; k < ntask; k++) {
            const int64_t p0 = k * FX__SWEEP_PAIRS, p1 = pairs - p0 < FX__SWEEP_PAIRS ? pairs : p0 + FX__SWEEP_PAIRS;
            kc->pack_pairs_sweep(dst, x, ld, lines, K, pairs, width, p0, p1);
        }
        return;
    }
#pragma omp for schedule(static) nowait
    for (int64_t q = 0; q < panels; q++) {
        if (a && t->a_rows)
            fx__bf16_pack_rows(dst + q * width * pairs, x, ld, lk, lines, K, pairs, width, q);
        else
            kc->pack_pairs(dst + q * width * pairs, x, ld, lk, lines, K, pairs, width, q);
    }
}

/* fx__gemm_bf16_tiled's work, B packed here (bp NULL: into ws after A) or already (bp). */
static void fx__gemm_bf16_tiles(const fx__bf16_tiled *t, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                                fx__bf16_mat A, int64_t lda, fx__bf16_mat B, int64_t ldb, const uint32_t *bp,
                                float beta, float *C, int64_t ldc, uint32_t *ws)
{
    const int64_t P = fx__bf16_tiled_pairs(t, K), mp = (M + t->mr - 1) / t->mr, np = (N + t->nr - 1) / t->nr;
    uint32_t *ap = ws, *bw = bp ? NULL : ws + mp * t->mr * P;
    const uint32_t *b = bp ? bp : bw;
    const bool nested = fx__in_parallel();
    (void)nested; /* read only by the pragmas, which are gone without OpenMP */
    /* A panels per group: a group's panels stay in L2 while every B panel passes over them,
       each B panel in L1 over the group's consecutive tiles. */
    const int64_t panel_bytes = t->mr * P * (int64_t)sizeof(uint32_t); /* 0 where K is */
    const int64_t fit = panel_bytes > 0 ? FX__BF16_GROUP_BYTES / panel_bytes : mp, group = fit > 1 ? fit : 1;
    /* Each panel word is packed by one thread and each tile of C computed by one, over all of
       K in order: the split changes who computes an element, never how. */
#pragma omp parallel if (!nested && M * N * K >= (1 << 18))
    {
        fx__bf16_pack_panels(t, true, ap, A, lda, !ta, M, K, P);
        if (bw)
            fx__bf16_pack_panels(t, false, bw, B, ldb, tb, N, K, P);
#pragma omp barrier
        if (t->enter)
            t->enter();
#pragma omp for schedule(static)
        for (int64_t k = 0; k < mp * np; k++) {
            /* Tile k: group g's tiles go B panel by B panel, A panel by A panel within one. */
            const int64_t g = k / (group * np), first = g * group, size = mp - first < group ? mp - first : group;
            const int64_t r = k - first * np, i = first + r % size, j = r / size;
            const int64_t mr = M - i * t->mr, nr = N - j * t->nr;
            t->kernel(P, ap + i * t->mr * P, b + j * t->nr * P, beta, C + i * t->mr * ldc + j * t->nr, ldc,
                      mr < t->mr ? mr : t->mr, nr < t->nr ? nr : t->nr);
        }
        if (t->leave)
            t->leave();
    }
}

void fx__gemm_bf16_tiled(const fx__bf16_tiled *t, bool ta, bool tb, int64_t M, int64_t N, int64_t K, fx__bf16_mat A,
                         int64_t lda, fx__bf16_mat B, int64_t ldb, float beta, float *C, int64_t ldc, uint32_t *ws)
{
    fx__gemm_bf16_tiles(t, ta, tb, M, N, K, A, lda, B, ldb, NULL, beta, C, ldc, ws);
}

size_t fx__bf16_packed_b_words(const fx__bf16_tiled *t, int64_t N, int64_t K)
{
    return (size_t)((N + t->nr - 1) / t->nr * t->nr) * (size_t)fx__bf16_tiled_pairs(t, K);
}

void fx__bf16_pack_b(const fx__bf16_tiled *t, uint32_t *dst, bool tb, int64_t N, int64_t K, fx__bf16_mat B,
                     int64_t ldb)
{
    const bool nested = fx__in_parallel();
    (void)nested; /* read only by the pragma, which is gone without OpenMP */
#pragma omp parallel if (!nested && N * K >= (1 << 15))
    fx__bf16_pack_panels(t, false, dst, B, ldb, tb, N, K, fx__bf16_tiled_pairs(t, K));
}

void fx__gemm_bf16_tiled_b(const fx__bf16_tiled *t, bool ta, int64_t M, int64_t N, int64_t K, fx__bf16_mat A,
                           int64_t lda, const uint32_t *bp, float beta, float *C, int64_t ldc, uint32_t *ws)
{
    const double t0 = fx__gemm_trace_begin(); /* traced as fx__gemm_bf16 is, B counted as bfloat16 */
    fx__gemm_bf16_tiles(t, ta, false, M, N, K, A, lda, fx__bf16_of(NULL), 0, bp, beta, C, ldc, ws);
    if (t0 >= 0.0)
        fx__gemm_trace_end(
            &(fx__gemm_shape){.ta = ta, .M = M, .N = N, .K = K, .bf16 = true, .a16 = A.bf16, .b16 = true}, t0);
}

const fx__bf16_tiled *fx__gemm_bf16_tiled_route(int64_t M, int64_t N, int64_t K)
{
#ifdef FLEXC_REFERENCE_KERNELS
    (void)M, (void)N, (void)K;
    return NULL;
#else
    const fx__gemm_bf16_kernels *t = fx__gemm_bf16_kernels_now();
    return M > 0 && N > 0 && t->kernel && fx__bf16_tiled_words(t, M, N, K) <= fx__gemm_bf16_ws(M, N, K) ? t : NULL;
#endif
}

static inline float fx__bf16_at(fx__bf16_mat x, int64_t i)
{
    return x.bf16 ? fx__bf16_to_f32(((const uint16_t *)x.p)[i]) : fx__bf16_round(((const float *)x.p)[i]);
}

void fx__gemm_bf16_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, fx__bf16_mat A, int64_t lda,
                       fx__bf16_mat B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++)
                acc += fx__bf16_at(A, ta ? k * lda + i : i * lda + k) * fx__bf16_at(B, tb ? j * ldb + k : k * ldb + j);
            /* beta == 0 overwrites, as BLAS does, so NaN garbage in C does not survive. */
            C[i * ldc + j] = beta == 0.0f ? acc : acc + beta * C[i * ldc + j];
        }
    }
}
