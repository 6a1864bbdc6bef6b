/* FlexAttention backward pass and decoding path: internal entry points and the per-ISA tile
   kernels they share. See docs/attention-backward.md for the algorithm. */
#ifndef FX_ATTENTION_BACKWARD_H
#define FX_ATTENTION_BACKWARD_H

#include "attention/internal.h"

/* The backward's kernel table (docs/dispatch.md): the tile kernels of one CPU path, which
   decoding shares (dots, softmax_chunk, mask_bits, nn). Matrices are row-major float32 with
   explicit row strides. */
typedef struct fx__attn_bwd_kernels {
    const char *name; /* what `flexc --version` prints */
    /* C[M,N] = alpha * A[M,K] B[K,N]  (acc false), or C += A B (acc true; alpha ignored).
       Each C element sums k = 0..K-1 in order (per vector lane), so the result does not
       depend on how C is cut into calls. */
    void (*nn)(float *C, int64_t ldc, const float *A, int64_t lda, const float *B, int64_t ldb,
               int64_t M, int64_t N, int64_t K, float alpha, bool acc);
    /* C[M,N] += A[K,M]^T B[K,N], k ascending. */
    void (*tn)(float *C, int64_t ldc, const float *A, int64_t lda, const float *B, int64_t ldb,
               int64_t M, int64_t N, int64_t K);
    /* P[i,j] = exp(S[i,j] - lse[i]); 0 where S is -inf or lse[i] is -inf. */
    void (*probs)(float *P, const float *S, int64_t ld, int64_t nq, int64_t nk, const float *lse);
    /* dP[i,j] = P[i,j] * (dP[i,j] - Di[i]) * alpha (in place). */
    void (*dscores)(float *dP, const float *P, int64_t ld, int64_t nq, int64_t nk, const float *Di,
                    float alpha);
    /* S[i,j] = -inf where bit (i0 + i, j0 + j) of a block bitmap is clear; j0 % 16 == 0. */
    void (*mask_bits)(float *S, int64_t ld, int64_t nq, int64_t nk, const uint64_t *bits,
                      int64_t words, int64_t i0, int64_t j0);
    /* Decoding: S[r, j] = alpha * (Q[r, :] . K[j, :]) for r < R, j < nk; Q [R, D], K [nk, D]
       with row strides D. */
    void (*dots)(float *S, int64_t ld, const float *Q, const float *K, int64_t R, int64_t nk, int64_t D,
                 float alpha);
    /* Decoding, one chunk of the online softmax per row i: m' = max(m[i], max_j S[i, j]);
       alpha[i] = exp(m[i] - m') (0 when m[i] = -inf, 1 when m' = -inf); P[i, j] = exp(S[i, j] - m')
       (0 where S is -inf, the whole row when m' = -inf); l[i] = l[i] * alpha[i] + sum_j P[i, j];
       m[i] = m'. */
    void (*softmax_chunk)(float *P, const float *S, int64_t ld, int64_t nq, int64_t nk, float *m, float *l,
                          float *alpha);
    /* dst[c, r] = src[r, c] for r < rows, c < cols. */
    void (*transpose)(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows, int64_t cols);
} fx__attn_bwd_kernels;

extern const fx__attn_bwd_kernels fx__attn_bwd_kernels_scalar;
extern const fx__attn_bwd_kernels fx__attn_bwd_kernels_avx2;
extern const fx__attn_bwd_kernels fx__attn_bwd_kernels_avx512;
/* The kernels of a CPU path (the scalar ones in a build with FLEXC_REFERENCE_KERNELS), and of
   the current one (fx_get_isa()). */
const fx__attn_bwd_kernels *fx__attn_bwd_kernels_for(fx_isa isa);
const fx__attn_bwd_kernels *fx__attn_bwd_kernels_now(void);

/* How the backward walks the blocks. Both orders give bitwise identical results; AUTO takes
   the single pass over kv-blocks when there are enough (batch, kv-head) pairs to share out. */
enum { FX__BWD_AUTO = 0, FX__BWD_ONE_PASS = 1, FX__BWD_TWO_PASS = 2 };
/* Tests only: forces a walk order (process-wide). */
void fx__attention_backward_set_mode(int mode);

/* Decoding path (split-KV). fx__attention_check must have passed; lse may be NULL. Bitwise
   identical at any thread count. FX_OK or FX_ENOMEM. */
int fx__attention_decode(const fx_attention *a, const float *q, const float *k, const float *v,
                         float *out, float *lse);
/* Whether fx_flex_attention routes a call to fx__attention_decode. */
bool fx__attention_use_decode(const fx_attention *a);

#endif
