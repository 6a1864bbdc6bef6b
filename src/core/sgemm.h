/* The float32 GEMM's kernel table (which product fx__sgemm runs on each CPU path), and its
   own tiled path (fx__sgemm on the AVX-512 path; gemm.c): both operands packed block of k by
   block of k into panels, and a 12 x 32 register-blocked micro-kernel over C's tiles.
   Internal (fx__).

   Why not BLIS there: BLIS's run-time detection knows only the CPUs of its release, and on a
   newer one (Debian 12's BLIS 0.9 on AMD Zen 5, say) falls back to its generic C kernels at a
   sixth of the machine's float32 peak. This path ran at 80-90% of it there (docs/train-profile.md).

   How an element is computed: C[i, j] over K in blocks of FX__SG_KC values of k, each block's
   sum one fused multiply-add chain in increasing k from zero; the first block's sum s gives
   C = alpha s + beta C (beta 0 overwrites, NaN included), each later one C = alpha s + C.
   That depends on K alone, never on the call's M or N, the tile an element falls in or the
   thread that computes it: any split of C, any thread count, gives the same bits. */
#ifndef FX_CORE_SGEMM_H
#define FX_CORE_SGEMM_H

#include "core.h"

enum {
    FX__SG_MR = 12,  /* rows of a tile: one A panel */
    FX__SG_NR = 32,  /* columns of a tile: one B panel (two 16-float vectors) */
    FX__SG_KC = 512, /* k per block: within 5% of 1024's speed at the models' shapes, at half the scratch */
    /* Packed A per group of tiles (below): a group's A panels stay in L2 while the B panels
       pass over them. 1 MiB: one group up to 512 rows of A at kc 512 (the whole of A
       fits), groups of about 40 panels beyond. */
    FX__SG_GROUP_BYTES = 1 << 20,
};

/* A tile of C from one block of k: C [mr, nr] (mr <= FX__SG_MR, nr <= FX__SG_NR, rows ldc
   apart) = alpha * sum_k a[k * MR + r] b[k * NR + j] over kc values of k, plus beta * C
   (beta 0: nothing of C is read). */
typedef void (*fx__sgemm_tile_kernel)(int64_t kc, const float *a, const float *b, float alpha, float beta, float *C,
                                      int64_t ldc, int64_t mr, int64_t nr);

/* An operand as the packing reads it: float32 values; bfloat16 ones (uint16_t storage,
   widened exactly); or float32 ones rounded to bfloat16 as read (nearest even, NaN kept
   quiet: fx__bf16_round). The last two make the float32 route of the bfloat16 GEMM
   (gemm_bf16.h): the products of bfloat16 values are exact in float32. */
typedef enum { FX__SG_F32, FX__SG_BF16, FX__SG_F32_AS_BF16 } fx__sgemm_elem;
typedef struct fx__sgemm_mat {
    const void *p;
    fx__sgemm_elem elem;
} fx__sgemm_mat;

static inline fx__sgemm_mat fx__sgemm_f32(const float *p) { return (fx__sgemm_mat){p, FX__SG_F32}; }

/* Panel q of a block of k of one operand: lines [q * width, q * width + width) (rows of op(A),
   columns of op(B)) and k in [k0, k0 + kc), as dst [k * width + l], zeros past `lines`.
   Element (line l, k) of x is at l * ld + k when lk, else at k * ld + l. */
typedef void (*fx__sgemm_pack_fn)(float *dst, fx__sgemm_mat x, int64_t ld, bool lk, int64_t lines, int64_t k0,
                                  int64_t kc, int64_t width, int64_t q);

typedef struct fx__sgemm_path {
    fx__sgemm_tile_kernel kernel;
    fx__sgemm_pack_fn pack;
} fx__sgemm_path;

/* The AVX-512 path, and its plain C twin: the same packing and the same arithmetic (fmaf in
   the same order), so the two give the same bits; the tests hold them to it. */
extern const fx__sgemm_path fx__sgemm_path_avx512, fx__sgemm_path_scalar;
void fx__sgemm_kernel_avx512(int64_t kc, const float *a, const float *b, float alpha, float beta, float *C,
                             int64_t ldc, int64_t mr, int64_t nr);
void fx__sgemm_pack_avx512(float *dst, fx__sgemm_mat x, int64_t ld, bool lk, int64_t lines, int64_t k0, int64_t kc,
                           int64_t width, int64_t q);

/* How a call packs its operands, block of k by block of k. Both whole (FX__SG_BOTH), or one
   whole and shared by the threads while the other is streamed: each thread packs its panels
   of that one, one at a time, and runs each against every shared panel. Streaming reads the
   larger operand once and keeps its packed copy in the cache; packing it whole writes out and
   reads back several MiB per call when the other side is thin (256 rows: a GPT-2 step's
   tokens). FX__SG_AUTO shares the operand whose block is smaller where it fits
   FX__SG_GROUP_BYTES and packs both otherwise. Every scheme computes each element the same
   way (above): the choice changes speed, never bits. */
typedef enum { FX__SG_AUTO, FX__SG_BOTH, FX__SG_SHARE_A, FX__SG_SHARE_B } fx__sgemm_scheme;

/* Floats of scratch fx__sgemm_tiled needs for (M, N, K), whatever the scheme: two blocks of k
   of both packed operands (one where K <= FX__SG_KC), every panel whole. */
size_t fx__sgemm_tiled_ws(int64_t M, int64_t N, int64_t K);

/* fx__sgemm's contract on path p by the given scheme, ws holding fx__sgemm_tiled_ws(M, N, K)
   floats. Threads: the current team size (a streaming scheme takes at most one per streamed
   panel), or one inside a parallel region. */
void fx__sgemm_tiled(const fx__sgemm_path *p, fx__sgemm_scheme scheme, bool ta, bool tb, int64_t M, int64_t N,
                     int64_t K, float alpha, fx__sgemm_mat A, int64_t lda, fx__sgemm_mat B, int64_t ldb, float beta,
                     float *C, int64_t ldc, float *ws);

/* ---- the thin path --------------------------------------------------------------------------

   A product with one side of C at most FX__SG_THIN_MAX wide (the adapters' [N, r] products:
   u = x A^T, d(u) = dy B, and dB = dy^T u, dA = d(u)^T x with C's rows the thin side) wastes
   most of a 12 x 32 tile on that side. The thin path fits the tile to it: the thin operand
   packed whole once, its lines in one to three vectors (nv), and the wide one read a tile of
   24 / nv lines at a time where it lies when a k's lines are side by side in it (dB's dy^T,
   dA's x) or its lines are close enough not to crowd L1's sets; with one vector, lines 1 KiB
   apart or more are read in place in tiles of FX__SG_THIN_NARROW (or half as many where the
   spacing is 4 KiB or a multiple), others packed; where M is the thin side it computes C
   transposed. Each element is the same fused multiply-add chain, in the same blocks of k,
   combined with C the same way as on the tiled path (the product of two floats is the same
   in either order), so the two give the same bits. AVX-512 only (fx__sgemm on that path). */
enum {
    FX__SG_THIN_ACC = 24, /* accumulators of a thin tile: 24 rows of one vector, 12 of two, 8 of three */
    FX__SG_THIN_NARROW = 8, /* rows of one vector where the wide side's lines crowd L1's sets */
    FX__SG_THIN_MAX = 48, /* the widest thin side: three vectors */
    FX__SG_THIN_RATIO = 4, /* the other side at least this many times longer */
};

/* A thin tile: T [mr, nr] (nr <= 16 nv, mr <= 24 / nv, nv = ceil(nr / 16)) = alpha * sum_k
   a[k * as + r * ls] b[k * 16 nv + j] over kc values of k, stored in C[r * ldc + j] (ct
   false) or C[j * ldc + r] (ct), plus beta * C (beta 0: nothing of C is read). a's 24 / nv
   values of each k are read, mr or not (with one vector: FX__SG_THIN_NARROW of them where mr
   is at most that, half as many where mr is at most half): a packed tile (as its lines,
   ls = 1) or the wide operand where it lies (as or ls its leading dimension, the other 1). */
void fx__sgemm_thin_kernel_avx512(int64_t kc, const float *a, int64_t as, int64_t ls, const float *b, float alpha,
                                  float beta, float *C, int64_t ldc, int64_t mr, int64_t nr, bool ct);

/* Whether (M, N) takes the thin path: a side at most FX__SG_THIN_MAX and the other
   FX__SG_THIN_RATIO times longer. */
bool fx__sgemm_thin_fits(int64_t M, int64_t N);
/* Floats of scratch fx__sgemm_thin needs for (M, N, K) on `threads` threads. */
size_t fx__sgemm_thin_ws(int64_t M, int64_t N, int64_t K, int threads);
/* fx__sgemm's contract for a shape that fx__sgemm_thin_fits, ws holding fx__sgemm_thin_ws(M,
   N, K, fx__max_threads()) floats; threads as fx__sgemm_tiled's. */
void fx__sgemm_thin(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                    const float *B, int64_t ldb, float beta, float *C, int64_t ldc, float *ws);

/* ---- the kernel table (docs/dispatch.md) ------------------------------------------------ */

typedef struct fx__gemm_kernels {
    const char *name; /* what `flexc --version` prints: "own avx512", "blis", "reference" */
    /* fx__sgemm's contract (untraced): threads, blocks and all. */
    void (*sgemm)(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
    /* The tiled path behind sgemm, whose packing also reads bfloat16 operands (the float32
       route of fx__gemm_bf16); NULL: none, the operands are widened for sgemm. */
    const fx__sgemm_path *tiled;
} fx__gemm_kernels;

/* The own tiled path on AVX-512 (BLIS where its scratch cannot be had); BLIS, which computes
   each element the same way whatever the call's shape (gemm.c), on the other paths; the
   float64 reference (fx__sgemm_ref) in a build with FLEXC_REFERENCE_KERNELS. */
extern const fx__gemm_kernels fx__gemm_kernels_avx512, fx__gemm_kernels_blis, fx__gemm_kernels_ref;
/* The table of a CPU path, and of the path taken now (fx_get_isa()). */
const fx__gemm_kernels *fx__gemm_kernels_for(fx_isa isa);
const fx__gemm_kernels *fx__gemm_kernels_now(void);

#endif
