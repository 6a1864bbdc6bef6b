/* The GPT's layers on a CUDA device (train.cu): the kernels a training step needs besides the
   matrix products (blas.h), the attention and the fused loss (cuda.h). Each launcher queues
   its kernels on the default stream, returns without waiting, and gives FX_OK or the launch
   error as a status. Device pointers throughout.

   Every result is the same bits on every run: no floating-point atomics; each sum over
   tokens (a norm's or a bias's weight gradient, the embedding's) runs in a fixed order, and
   the norms' row sums are float64 trees of a fixed shape. The arithmetic follows the CPU
   model's layers (src/model/layers.c) operation for operation, so the two agree to float
   rounding.

   "A" tensors (activations that feed a matrix product or the attention) are float32, or
   bfloat16 when the launcher's bf16 flag is set. */
#ifndef FX_CUDA_TRAIN_H
#define FX_CUDA_TRAIN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Rows per chunk of the two-pass column sums: the first pass writes one partial per chunk
   and column, the second adds the chunks in order. Scratch: ceil(N / this) x C floats. */
enum { FX__CU_COLSUM_ROWS = 256 };
/* Elements per partial sum of fx__cu_sumsq (as the CPU's gradient norm). */
enum { FX__CU_SUMSQ_CHUNK = 1 << 14 };

/* out [N,C] = wte[tokens] */
int fx__cu_embed_forward(float *out, const int32_t *tokens, const float *wte, int64_t N, int64_t C);
/* dwte [V,C] (+=) <- dout [N,C]: the tokens grouped by id on the host (uniq [U] distinct ids,
   their positions pos[ptr[u] .. ptr[u+1]) in ascending order); each row of dwte adds its
   tokens' rows in that order, as the CPU does. */
int fx__cu_embed_backward(float *dwte, const float *dout, const int32_t *uniq, const int32_t *ptr,
                          const int32_t *pos, int64_t U, int64_t C);
/* out [N,C] (A) = inp r w, rstd [N] = r = (mean inp^2 + eps)^-1/2 */
int fx__cu_rmsnorm_forward(void *out, int bf16, float *rstd, const float *inp, const float *w, int64_t N,
                           int64_t C, float eps);
/* dinp [N,C] (+=), dw [C] (+=) <- dout [N,C], inp [N,C], w [C], rstd [N]; parts: colsum scratch */
int fx__cu_rmsnorm_backward(float *dinp, float *dw, float *parts, const float *dout, const float *inp,
                            const float *w, const float *rstd, int64_t N, int64_t C);
/* out [C] (+=) the column sums of x [N,C], rows in order; parts: colsum scratch */
int fx__cu_colsum(float *out, float *parts, const float *x, int64_t N, int64_t C);
/* y [N,O] += b [O] */
int fx__cu_bias_forward(float *y, const float *b, int64_t N, int64_t O);
/* qkv [B,T,(Hq+2Hkv) hd] (float32) -> q [B,Hq,T,hd], k [B,Hkv,T,hd] rotated by position,
   v [B,Hkv,T,hd] as is (A). rope [T, hd/2, 2] cos, sin. */
int fx__cu_qkv_to_heads(void *q, void *k, void *v, int bf16, const float *qkv, const float *rope, int64_t B,
                        int64_t T, int64_t Hq, int64_t Hkv, int64_t hd);
/* The transpose: dqkv [B,T,QKV] (float32, overwritten) <- dq, dk, dv (A) */
int fx__cu_qkv_from_heads(float *dqkv, const void *dq, const void *dk, const void *dv, int bf16, const float *rope,
                          int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd);
/* out [B,H,T,hd] (A) <- x [B,T,H,hd] float32, rows ldx apart */
int fx__cu_to_heads(void *out, int bf16, const float *x, int64_t ldx, int64_t B, int64_t T, int64_t H, int64_t hd);
/* out [B,T,H,hd] (A, rows ldo apart) <- x [B,H,T,hd] (A) */
int fx__cu_from_heads(void *out, int64_t ldo, const void *x, int bf16, int64_t B, int64_t T, int64_t H, int64_t hd);
/* out [N,F] (A) = silu(gate) up, h13 [N,2F] a token's gate then up */
int fx__cu_swiglu_forward(void *out, int bf16, const float *h13, int64_t N, int64_t F);
/* dh13 [N,2F] (overwritten) <- dout [N,F], h13 [N,2F] */
int fx__cu_swiglu_backward(float *dh13, const float *dout, const float *h13, int64_t N, int64_t F);
/* out [n] = x rounded to bfloat16 (nearest even): as bfloat16 words (bf16) or as the float32
   values they hold */
int fx__cu_round_bf16(void *out, int bf16, const float *x, int64_t n);
/* out [n] = x widened to float32 (bfloat16 words), or out += that with acc */
int fx__cu_widen_bf16(float *out, int acc, const uint16_t *x, int64_t n);

/* AdamW's per-step constants (fx__adamw_k of src/model/model.h). */
typedef struct fx__cu_adamw_k {
    float gs, b1, nb1, b2, nb2, lr, bc1, bc2, eps, wd;
    int zero_grad;
} fx__cu_adamw_k;
/* n elements of p, g and the two moments, as fx__adamw_f32_scalar; p16 (NULL: none) gets the
   new weights in bfloat16. */
int fx__cu_adamw(float *p, float *g, float *m, float *v, uint16_t *p16, int64_t n, const fx__cu_adamw_k *k);
/* parts [ceil(n / FX__CU_SUMSQ_CHUNK)] = sum g^2 in float64 over each chunk */
int fx__cu_sumsq(double *parts, const float *g, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
