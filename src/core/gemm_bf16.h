/* bfloat16 matrix products with float32 accumulation: the GEMM of `--dtype bf16` training, the
   bfloat16 <-> float32 conversions it needs, and their reference twins. Internal (fx__). */
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

/* dst [n] = bfloat16 of src [n] (no threads; the element loops of the paths, bitwise equal). */
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

/* Floats of scratch fx__gemm_bf16 needs for (M, N, K): M*K + K*N. */
size_t fx__gemm_bf16_ws(int64_t M, int64_t N, int64_t K);

/* Row-major C[M,N] = op(A)[M,K] op(B)[K,N] + beta * C (beta 0 overwrites C, NaN included), A and
   B in bfloat16 (rounded as read when given in float32), every product exact in float32 and
   the sums in float32. lda/ldb/ldc as in fx__sgemm. ws: fx__gemm_bf16_ws(M, N, K) floats.
   Bitwise identical for any thread count. The paths (fx_get_isa()):
     AVX2, AVX-512: the operands widened to float32 with AVX2 into ws, then fx__sgemm (one
                    pass each; the products of bfloat16 values are exact in float32, so these
                    are the products a vdpbf16ps kernel makes, summed in another order);
     scalar:        the same with plain C widening: bitwise the AVX2 path's results.
     AVX512-BF16:   on CPUs with vdpbf16ps (fx__cpu_avx512bf16) and the AVX-512 path, the
                    operands packed in bfloat16 pairs and multiplied by fx__gemm_bf16_dp's
                    micro-kernel; when the packed operands would not fit in ws (a handful of
                    rows or columns), the widening path above.
   The paths differ in the order of the float32 sums only. No AMX-BF16 kernel exists (see
   docs/train.md). */
void fx__gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, fx__bf16_mat A, int64_t lda, fx__bf16_mat B,
                   int64_t ldb, float beta, float *C, int64_t ldc, float *ws);
/* The reference: the same contract, each element a float32 sum over k in increasing order
   (bfloat16 inputs, float32 accumulation, fixed order); the tests compare the paths to it. */
void fx__gemm_bf16_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, fx__bf16_mat A, int64_t lda,
                       fx__bf16_mat B, int64_t ldb, float beta, float *C, int64_t ldc);

/* ---- the vdpbf16ps path ------------------------------------------------------------------------ */

/* The micro-kernel's tile: FX__DP_MR rows of C by FX__DP_NR columns (two 16-lane vectors). */
enum { FX__DP_MR = 12, FX__DP_NR = 32 };

/* 32-bit words of the packed operands of (M, N, K): A and B in panels of FX__DP_MR and
   FX__DP_NR lines, each line (K + 1) / 2 pairs, the last panel and pair padded with zeros. */
static inline size_t fx__bf16_dp_words(int64_t M, int64_t N, int64_t K)
{
    const size_t K2 = (size_t)(K + 1) / 2;
    return ((size_t)(M + FX__DP_MR - 1) / FX__DP_MR * FX__DP_MR + (size_t)(N + FX__DP_NR - 1) / FX__DP_NR * FX__DP_NR) *
           K2;
}

/* Panel q of lines [q * width, q * width + width) of x, packed: word p * width + l holds the
   bfloat16 values of (line q * width + l, k = 2p) in its low half and (..., 2p + 1) in its
   high half, zeros past `lines` or K. Element (l, k) of x is at l * ld + k when lk (A not
   transposed, B transposed), else at k * ld + l. width <= FX__DP_NR. */
void fx__bf16_pack_pairs(uint32_t *dst, fx__bf16_mat x, int64_t ld, bool lk, int64_t lines, int64_t K, int64_t width,
                         int64_t q);

/* A micro-kernel: C [mr, nr] (mr <= FX__DP_MR, nr <= FX__DP_NR, rows ldc apart) = the sums over
   K2 pairs of panel a (FX__DP_MR words per pair) times panel b (FX__DP_NR words per pair),
   plus beta * C (beta 0 overwrites). gemm_bf16_dp.h is its body. */
typedef void (*fx__bf16_dp_kernel)(int64_t K2, const uint32_t *a, const uint32_t *b, float beta, float *C, int64_t ldc,
                                   int64_t mr, int64_t nr);
void fx__bf16_dp_kernel_avx512bf16(int64_t K2, const uint32_t *a, const uint32_t *b, float beta, float *C, int64_t ldc,
                                   int64_t mr, int64_t nr);

/* fx__gemm_bf16's contract, computed by packing both operands into ws (fx__bf16_dp_words(M,
   N, K) words, which must fit) and running `kernel` over C's tiles, each tile by one thread
   over all of K: bitwise identical for any thread count. The tests run it with the kernel
   built from SIMDe's portable intrinsics. */
void fx__gemm_bf16_dp(bool ta, bool tb, int64_t M, int64_t N, int64_t K, fx__bf16_mat A, int64_t lda, fx__bf16_mat B,
                      int64_t ldb, float beta, float *C, int64_t ldc, uint32_t *ws, fx__bf16_dp_kernel kernel);

/* dst [rows, cols] (contiguous) = src [rows, cols] (rows ld apart) as float32 bfloat16 values:
   the packing step of the paths above: the loops of each path (no threads), and the
   threaded one that picks the path. */
void fx__bf16_pack(float *dst, fx__bf16_mat src, int64_t rows, int64_t cols, int64_t ld);
void fx__bf16_pack_scalar(float *dst, fx__bf16_mat src, int64_t rows, int64_t cols, int64_t ld);
void fx__bf16_pack_avx2(float *dst, fx__bf16_mat src, int64_t rows, int64_t cols, int64_t ld);

#endif
