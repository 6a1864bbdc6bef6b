/* bfloat16 matrix products with float32 accumulation: the GEMM of `--dtype bf16` training, the
   bfloat16 <-> float32 conversions it needs, and their reference twins; a kernel table for
   each (docs/dispatch.md). Internal (fx__). */
#ifndef FX_CORE_GEMM_BF16_H
#define FX_CORE_GEMM_BF16_H

#include "core.h"

#include <string.h>

/* ---- conversions ----------------------------------------------------------------------------- */

/* bfloat16 -> float32 exactly; float32 -> bfloat16 to nearest even, NaN kept quiet (the rounding
   of fx_f32_to_bf16 and of --adam-bf16's moments). */
static inline float fx__bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t fx__f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* x rounded to the nearest bfloat16, as a float32. */
static inline float fx__bf16_round(float x) { return fx__bf16_to_f32(fx__f32_to_bf16(x)); }

/* dst [n] = bfloat16 of src [n] (no threads; the element loops of the paths, bitwise equal;
   fx__f32_to_bf16_n takes fx__bf16_kernels_now()'s, below). */
void fx__f32_to_bf16_n(uint16_t *dst, const float *src, int64_t n);
void fx__f32_to_bf16_n_scalar(uint16_t *dst, const float *src, int64_t n);
void fx__f32_to_bf16_n_avx2(uint16_t *dst, const float *src, int64_t n);

/* ---- the GEMM ------------------------------------------------------------------------------- */

/* An operand: bfloat16 values (bf16, uint16_t storage), or float32 ones that the GEMM rounds to
   bfloat16 (nearest even) as it reads them. */
typedef struct fx__bf16_mat {
    const void *p;
    bool bf16;
} fx__bf16_mat;

static inline fx__bf16_mat fx__bf16_of(const uint16_t *p) { return (fx__bf16_mat){p, true}; }
static inline fx__bf16_mat fx__bf16_of_f32(const float *p) { return (fx__bf16_mat){p, false}; }
/* The operand from x's element i on. */
static inline fx__bf16_mat fx__bf16_mat_at(fx__bf16_mat x, int64_t i)
{
    return x.bf16 ? fx__bf16_of((const uint16_t *)x.p + i) : fx__bf16_of_f32((const float *)x.p + i);
}

/* Floats of scratch fx__gemm_bf16 needs for (M, N, K): M*K + K*N, or the float32 GEMM's
   packed blocks (sgemm.h) where their padding makes those more. */
size_t fx__gemm_bf16_ws(int64_t M, int64_t N, int64_t K);

/* Row-major C[M,N] = op(A)[M,K] op(B)[K,N] + beta * C (beta 0 overwrites C, NaN included), A and
   B in bfloat16 (rounded as read when given in float32), every product exact in float32 and
   the sums in float32. lda/ldb/ldc as in fx__sgemm. ws: fx__gemm_bf16_ws(M, N, K) floats.
   Bitwise identical for any thread count. The paths (fx__gemm_bf16_kernels_now()):
     AMX-BF16:      on CPUs with AMX tiles (fx__cpu_amx_bf16) and the AVX-512 path, the
                    operands packed in bfloat16 pairs and multiplied by tdpbf16ps, 32 x 32
                    tiles of C (fx__bf16_tiled_amx);
     AVX512-BF16:   on AMD CPUs with vdpbf16ps (fx__cpu_avx512bf16) and the AVX-512 path,
                    both operands packed pair by pair and a 12 x 32 vdpbf16ps micro-kernel
                    (fx__bf16_tiled_dp);
     float32:       everywhere else (fx__bf16_tiled_f32): float32 products of the bfloat16
                    values, which are exact, so these are the products the two above make,
                    summed in another order. On the AVX-512 path the float32 GEMM's packing
                    reads the operands as given (sgemm.h's fx__sgemm_mat); on AVX2 and the
                    scalar path they are widened into ws, then fx__sgemm (BLIS).
   The first two take the float32 route when their packed operands would not fit in ws (a
   handful of rows or columns, or K below 32 for AMX). The paths differ in the order of the
   float32 sums only (docs/bf16.md). */
void fx__gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, fx__bf16_mat A, int64_t lda, fx__bf16_mat B,
                   int64_t ldb, float beta, float *C, int64_t ldc, float *ws);
/* The reference: the same contract, each element a float32 sum over k in increasing order
   (bfloat16 inputs, float32 accumulation, fixed order); the tests compare the paths to it. */
void fx__gemm_bf16_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, fx__bf16_mat A, int64_t lda,
                       fx__bf16_mat B, int64_t ldb, float beta, float *C, int64_t ldc);

/* ---- the tiled paths (AMX-BF16, AVX512-BF16) ------------------------------------------------- */

/* Both paths pack the operands as bfloat16 pairs along k, in panels of lines (rows of op(A),
   columns of op(B)), and run a kernel over C's tiles. A tile's kernel call:
     C [mr, nr] (mr <= tile's mr, nr <= its nr, rows ldc apart) = the sums over `pairs` pairs
     of A panel a times B panel b, plus beta * C (beta 0 overwrites). */
typedef void (*fx__bf16_tile_kernel)(int64_t pairs, const uint32_t *a, const uint32_t *b, float beta, float *C,
                                     int64_t ldc, int64_t mr, int64_t nr);

/* A path of fx__gemm_bf16: the GEMM's kernel table (docs/dispatch.md). */
typedef struct fx__gemm_bf16_kernels {
    const char *name;   /* what `flexc --version` prints: "amx", "vdpbf16ps", "float32" */
    int64_t mr, nr;     /* the kernel's tile of C: lines per A and per B panel */
    int64_t align;      /* pairs padded with zeros to a multiple of this */
    bool a_rows;        /* A's panels row by row (fx__bf16_pack_rows), else pair by pair */
    fx__bf16_tile_kernel kernel; /* NULL: the float32 route (fx__gemm_kernels_now()'s GEMM) */
    /* A thread's setup before its run of kernel calls and its end after it (AMX: the tile
       registers' configuration, once for all of a call's tiles); NULL: none. */
    void (*enter)(void);
    void (*leave)(void);
} fx__gemm_bf16_kernels;
/* The same table by the name of its tiled paths, which the tests and benchmarks use. */
typedef fx__gemm_bf16_kernels fx__bf16_tiled;

/* The paths: vdpbf16ps, 12 x 32 tiles, both operands pair by pair (gemm_bf16_dp.h); AMX,
   32 x 32 tiles from 16 x 16 ones, pairs in blocks of 16 (a tile's k is 32), A row by row
   within each block (gemm_bf16_amx.c); and fx__bf16_tiled_f32, no kernel: the float32 route
   of fx__gemm_bf16. */
void fx__bf16_dp_kernel_avx512bf16(int64_t pairs, const uint32_t *a, const uint32_t *b, float beta, float *C,
                                   int64_t ldc, int64_t mr, int64_t nr);
void fx__bf16_amx_kernel(int64_t pairs, const uint32_t *a, const uint32_t *b, float beta, float *C, int64_t ldc,
                         int64_t mr, int64_t nr);
/* The AMX path's enter and leave: the kernel runs on the calling thread between the two. */
void fx__bf16_amx_enter(void);
void fx__bf16_amx_leave(void);
enum { FX__DP_MR = 12, FX__DP_NR = 32, FX__AMX_MR = 32, FX__AMX_NR = 32, FX__AMX_PAIRS = 16 };
/* Packed A per group of tiles in fx__gemm_bf16_tiled: half of a 2 MiB L2. */
enum { FX__BF16_GROUP_BYTES = 1 << 20 };
extern const fx__bf16_tiled fx__bf16_tiled_dp, fx__bf16_tiled_amx, fx__bf16_tiled_f32;

/* The path fx__gemm_bf16 takes on this CPU on path isa when none is forced: AMX or vdpbf16ps
   (gemm_bf16.c says where) on AVX-512, else the float32 route, which a build with
   FLEXC_REFERENCE_KERNELS always takes. */
const fx__gemm_bf16_kernels *fx__gemm_bf16_kernels_for(fx_isa isa);
/* The path fx__gemm_bf16 takes now: the forced one, else fx_get_isa()'s. */
const fx__gemm_bf16_kernels *fx__gemm_bf16_kernels_now(void);
/* fx__gemm_bf16_kernels_for(fx_get_isa()) under the benchmarks' name. */
static inline const fx__gemm_bf16_kernels *fx__gemm_bf16_cpu_path(void)
{
    return fx__gemm_bf16_kernels_for(fx_get_isa());
}

/* The force hook of the tests and benchmarks: every later fx__gemm_bf16 takes path t (the
   tiled ones where their packed operands fit ws), whatever the CPU has; NULL restores the
   CPU's choice. Not for use inside a parallel region. */
void fx__gemm_bf16_force_tiled(const fx__bf16_tiled *t);

/* Pairs per line of a (K) product on path t: (K + 1) / 2 rounded up to t->align. */
static inline int64_t fx__bf16_tiled_pairs(const fx__bf16_tiled *t, int64_t K)
{
    return ((K + 1) / 2 + t->align - 1) / t->align * t->align;
}

/* 32-bit words of the packed operands of (M, N, K) on path t: every panel whole. */
static inline size_t fx__bf16_tiled_words(const fx__bf16_tiled *t, int64_t M, int64_t N, int64_t K)
{
    return ((size_t)((M + t->mr - 1) / t->mr * t->mr) + (size_t)((N + t->nr - 1) / t->nr * t->nr)) *
           (size_t)fx__bf16_tiled_pairs(t, K);
}

/* Panel q of lines [q * width, q * width + width) of x, as `pairs` pairs per line (zeros past
   `lines` and past K): pair by pair (word p * width + l) or row by row in blocks of 16 pairs
   (fx__bf16_row_word: each 16 lines by 16 pairs one contiguous AMX tile; pairs a multiple of 16),
   each word the bfloat16 values of (line, k = 2p) in its low half and (line, 2p + 1) in its
   high half. Element (l, k) of x is at l * ld + k when lk (A not transposed, B transposed),
   else at k * ld + l. width <= 32. fx__bf16_pack_pairs takes the loop of fx__bf16_kernels_now():
   the AVX-512 one (sixteen lines or pairs a step) or the plain C one, the same words. */
void fx__bf16_pack_pairs(uint32_t *dst, fx__bf16_mat x, int64_t ld, bool lk, int64_t lines, int64_t K, int64_t pairs,
                         int64_t width, int64_t q);
void fx__bf16_pack_pairs_scalar(uint32_t *dst, fx__bf16_mat x, int64_t ld, bool lk, int64_t lines, int64_t K,
                                int64_t pairs, int64_t width, int64_t q);
void fx__bf16_pack_pairs_avx512(uint32_t *dst, fx__bf16_mat x, int64_t ld, bool lk, int64_t lines, int64_t K,
                                int64_t pairs, int64_t width, int64_t q);

/* Pairs [p0, p1) (p1 <= pairs) of every panel of x (panel q at dst + q * width * pairs), when
   rows of x hold lines contiguously (not lk): each pair's two rows read front to back, zeros
   in the missing lines and past K. The same words as fx__bf16_pack_pairs over every panel;
   AVX-512 only. */
void fx__bf16_pack_pairs_sweep_avx512(uint32_t *dst, fx__bf16_mat x, int64_t ld, int64_t lines, int64_t K,
                                      int64_t pairs, int64_t width, int64_t p0, int64_t p1);

/* The end of a pair-by-pair panel of nl lines and K2 pairs of data: zeros in the missing
   lines and in the pairs past K2, up to `pairs` pairs of `width` words. */
static inline void fx__bf16_pack_pairs_pad(uint32_t *dst, int64_t K2, int64_t nl, int64_t pairs, int64_t width)
{
    /* A whole panel has nothing to pad but the pairs past K2: no call per pair. */
    for (int64_t p = 0; nl < width && p < K2; p++)
        memset(dst + p * width + nl, 0, (size_t)(width - nl) * sizeof(uint32_t));
    if (pairs > K2)
        memset(dst + K2 * width, 0, (size_t)((pairs - K2) * width) * sizeof(uint32_t));
}
/* Word (line l, pair p) of a panel packed row by row: the block of pairs p / 16 holds every
   line's 16 pairs, line by line. */
static inline int64_t fx__bf16_row_word(int64_t width, int64_t l, int64_t p)
{
    return p / FX__AMX_PAIRS * FX__AMX_PAIRS * width + l * FX__AMX_PAIRS + p % FX__AMX_PAIRS;
}
void fx__bf16_pack_rows(uint32_t *dst, fx__bf16_mat x, int64_t ld, bool lk, int64_t lines, int64_t K, int64_t pairs,
                        int64_t width, int64_t q);
void fx__bf16_pack_rows_scalar(uint32_t *dst, fx__bf16_mat x, int64_t ld, bool lk, int64_t lines, int64_t K,
                               int64_t pairs, int64_t width, int64_t q);
/* Row by row, sixteen pairs a step (of sixteen lines, transposed in registers, where the
   lines run across x's rows); the plain C loop's words. */
void fx__bf16_pack_rows_avx512(uint32_t *dst, fx__bf16_mat x, int64_t ld, bool lk, int64_t lines, int64_t K,
                               int64_t pairs, int64_t width, int64_t q);

/* The end of a tile kernel: C [mr, nr] (rows ldc apart) = tile [mr, nr] (rows ts apart) +
   beta * C, beta 0 overwriting (NaN included). */
static inline void fx__bf16_tile_store(const float *tile, int64_t ts, float beta, float *C, int64_t ldc, int64_t mr,
                                       int64_t nr)
{
    for (int64_t r = 0; r < mr; r++) {
        const float *t = tile + r * ts;
        float *c = C + r * ldc;
        if (beta == 0.0f)
            for (int64_t j = 0; j < nr; j++)
                c[j] = t[j];
        else
            for (int64_t j = 0; j < nr; j++)
                c[j] = t[j] + beta * c[j];
    }
}

/* fx__gemm_bf16's contract on path t: both operands packed into ws (fx__bf16_tiled_words
   words, which must fit), then t's kernel over C's tiles, each tile by one thread over all
   of K: bitwise identical for any thread count. The tests also run it with kernels of the
   same contracts that run on any CPU (SIMDe's build of the vdpbf16ps one, a plain C one). */
void fx__gemm_bf16_tiled(const fx__bf16_tiled *t, bool ta, bool tb, int64_t M, int64_t N, int64_t K, fx__bf16_mat A,
                         int64_t lda, fx__bf16_mat B, int64_t ldb, float beta, float *C, int64_t ldc, uint32_t *ws);

/* The tiled path fx__gemm_bf16 takes for (M, N, K) now, or NULL where it takes the float32
   route (no tiled path on this CPU, or packed operands that would not fit its scratch). */
const fx__bf16_tiled *fx__gemm_bf16_tiled_route(int64_t M, int64_t N, int64_t K);

/* B packed once for many products on path t (a frozen weight that every chunk of rows reads):
   fx__bf16_packed_b_words(t, N, K) words of dst hold op(B) [K, N] (B rows ldb apart; tb as
   in fx__gemm_bf16), packed as fx__gemm_bf16_tiled packs it; threads: the current team (one
   inside a parallel region). fx__gemm_bf16_tiled_b is fx__gemm_bf16_tiled with that B, A
   packed into ws (its part of fx__bf16_tiled_words): the same bits. */
size_t fx__bf16_packed_b_words(const fx__bf16_tiled *t, int64_t N, int64_t K);
void fx__bf16_pack_b(const fx__bf16_tiled *t, uint32_t *dst, bool tb, int64_t N, int64_t K, fx__bf16_mat B,
                     int64_t ldb);
void fx__gemm_bf16_tiled_b(const fx__bf16_tiled *t, bool ta, int64_t M, int64_t N, int64_t K, fx__bf16_mat A,
                           int64_t lda, const uint32_t *bp, float beta, float *C, int64_t ldc, uint32_t *ws);

/* dst [rows, cols] (contiguous) = src [rows, cols] (rows ld apart) as float32 bfloat16 values:
   the packing step of the paths above: the loops of each path (no threads), and the
   threaded one that takes fx__bf16_kernels_now()'s. */
void fx__bf16_pack(float *dst, fx__bf16_mat src, int64_t rows, int64_t cols, int64_t ld);
void fx__bf16_pack_scalar(float *dst, fx__bf16_mat src, int64_t rows, int64_t cols, int64_t ld);
void fx__bf16_pack_avx2(float *dst, fx__bf16_mat src, int64_t rows, int64_t cols, int64_t ld);

/* ---- the conversions' kernel table (docs/dispatch.md) ------------------------------------- */

typedef struct fx__bf16_kernels {
    const char *name; /* what `flexc --version` prints */
    void (*to_bf16_n)(uint16_t *dst, const float *src, int64_t n);                    /* fx__f32_to_bf16_n */
    void (*pack)(float *dst, fx__bf16_mat src, int64_t rows, int64_t cols, int64_t ld); /* fx__bf16_pack's rows */
    void (*pack_pairs)(uint32_t *dst, fx__bf16_mat x, int64_t ld, bool lk, int64_t lines, int64_t K, int64_t pairs,
                       int64_t width, int64_t q); /* fx__bf16_pack_pairs */
    /* fx__bf16_pack_pairs_sweep_avx512's contract; NULL: the path has none (panel by panel). */
    void (*pack_pairs_sweep)(uint32_t *dst, fx__bf16_mat x, int64_t ld, int64_t lines, int64_t K, int64_t pairs,
                             int64_t width, int64_t p0, int64_t p1);
    void (*pack_rows)(uint32_t *dst, fx__bf16_mat x, int64_t ld, bool lk, int64_t lines, int64_t K, int64_t pairs,
                      int64_t width, int64_t q); /* fx__bf16_pack_rows */
} fx__bf16_kernels;
/* The plain C loops on the scalar path, the AVX2 ones on AVX2, and the AVX-512 packings with
   them on AVX-512. */
extern const fx__bf16_kernels fx__bf16_kernels_scalar, fx__bf16_kernels_avx2, fx__bf16_kernels_avx512;
const fx__bf16_kernels *fx__bf16_kernels_for(fx_isa isa);
const fx__bf16_kernels *fx__bf16_kernels_now(void); /* fx_get_isa()'s */

#endif
