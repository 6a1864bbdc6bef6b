/* The attention's products in bfloat16 (FX__ATTN_BF16, the trainer's --dtype bf16): Q, K, V,
   dO, P and dS rounded to bfloat16 (nearest even, as fx__f32_to_bf16) as they enter a
   product, every product exact in float32 and the sums in float32 by vdpbf16ps. The
   softmax, lse, the running maxima and sums, dS = P (dP - D) and every output stay float32.

   Operands are 32-bit words, each the bfloat16 values of two consecutive k (the low half
   k = 2p, the high half 2p + 1; zero past the end), in one of two layouts:
     rows:  x [r, c] -> word r * ldw + c / 2  (a matrix whose rows hold its k: A of C = A B)
     pairs: x [r, c] -> word (r / 2) * ldw + c (rows 2p and 2p + 1 interleaved: B of C = A B,
            or A of C = A^T B read with its strides)
   Internal (fx__). */
#ifndef FX_ATTENTION_BF16_H
#define FX_ATTENTION_BF16_H

#include "core/core.h"

/* The kernel table of the bfloat16 products (docs/dispatch.md). */
typedef struct fx__attn16_kernels {
    const char *name; /* what `flexc --version` prints */
    /* dst in the rows layout of src [rows, cols] (rows lds floats apart): ceil(cols / 2)
       words a row, rows ldw words apart. */
    void (*rows)(uint32_t *dst, int64_t ldw, const float *src, int64_t lds, int64_t rows, int64_t cols);
    /* dst in the pairs layout of src [rows, cols]: ceil(rows / 2) rows of cols words, ldw
       apart (an odd last row paired with zeros). */
    void (*pairs)(uint32_t *dst, int64_t ldw, const float *src, int64_t lds, int64_t rows, int64_t cols);
    /* C [M, N] = alpha * A B (acc false), or C += A B (acc true; alpha ignored), over `np`
       pairs of k: A's word (i, p) at A [i * sa_m + p * sa_k], B's (p, n) at B [p * ldb + n].
       Each element is summed over the pairs in order, so the result does not depend on how C
       is cut into calls. */
    void (*mm)(float *C, int64_t ldc, const uint32_t *A, int64_t sa_m, int64_t sa_k, const uint32_t *B, int64_t ldb,
               int64_t M, int64_t N, int64_t np, float alpha, bool acc);
} fx__attn16_kernels;

extern const fx__attn16_kernels fx__attn16_kernels_avx512bf16;

/* The kernels of CPU path isa: the vdpbf16ps ones where the bfloat16 GEMM takes vdpbf16ps
   there too (fx__gemm_bf16_kernels_for: AMD's cores with AVX512-BF16, on the AVX-512 path),
   else NULL: a call with FX__ATTN_BF16 stays float32 (docs/bf16.md). */
const fx__attn16_kernels *fx__attn16_kernels_for(fx_isa isa);

/* Whether this CPU runs the attention's products in bfloat16 now (fx__attn16_kernels_for
   the current path). The forward's bfloat16 strips (forward_avx512bf16.c) run only here. */
bool fx__attn16_cpu(void);

/* The kernels the backward of a call with FX__ATTN_BF16 takes: the forced ones, else
   fx__attn16_kernels_for(fx_get_isa()) (NULL: float32). */
const fx__attn16_kernels *fx__attn16_kernels_now(void);

/* The force hook of the tests: later backward passes take kernels k (such as SIMDe's build of
   bf16_dp.h, on any CPU), whatever the CPU has; NULL restores the CPU's choice. Not inside a
   parallel region. */
void fx__attn16_force(const fx__attn16_kernels *k);

#endif
