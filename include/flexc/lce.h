/*
 * Fused linear + cross-entropy: the loss of logits = h W^T + bias and its gradients,
 * without ever holding the [N, V] logits. See docs/lce.md.
 *
 *     fx_lce p = fx_lce_defaults(N, D, V);      // MEAN, ignore_index -100, automatic chunk
 *     float loss;
 *     int rc = fx_linear_cross_entropy(&p, h, w, NULL, target, &loss, NULL, dh, dw, NULL);
 *     if (rc != FX_OK)
 *         fprintf(stderr, "%s: %s\n", fx_strerror(rc), fx_last_error());
 *
 * Tokens are processed in chunks of at most `chunk` rows (shared evenly): a chunk's logits
 * are computed with one GEMM, turned into gradients in place, and fed to two more GEMMs
 * (dh and dw), so the working set is chunk x V floats. The vocabulary may be tiled as well
 * (vocab_chunk), and the logits of each tile are then computed twice: once for the
 * log-sum-exp, once for the gradients. The automatic plan keeps its scratch within 2 MiB,
 * tiling the vocabulary unless 64 tokens of whole rows fit.
 *
 * Per-token loss, with z the (soft-capped) logits and y the target:
 *     (1 - eps) (lse - z_y) + eps (lse - mean_j z_j) + s lse^2
 * MEAN divides the sum by the number of tokens whose target is not ignore_index; when all
 * are ignored the loss is NaN and the gradients are zero (as in PyTorch). Ignored tokens
 * have loss 0 under NONE and contribute no gradient.
 *
 * Results are bitwise identical for any thread count: the chunk plan depends only on the
 * sizes, chunks run in order, and threads share fixed vocabulary and hidden-size blocks,
 * each computed whole by one thread.
 */
#ifndef FLEXC_LCE_H
#define FLEXC_LCE_H

#include "../flexc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fx_reduction { FX_REDUCTION_MEAN = 0, FX_REDUCTION_SUM = 1, FX_REDUCTION_NONE = 2 } fx_reduction;

typedef struct fx_lce {
    int64_t N, D, V;       /* tokens, hidden size, vocabulary */
    int64_t ignore_index;  /* targets equal to it add nothing; PyTorch's default is -100 */
    fx_reduction reduction;
    float label_smoothing; /* eps in [0, 1] */
    float z_loss;          /* s: adds s * lse^2 per (non-ignored) token */
    float softcap;         /* 0: off; else logits = softcap * tanh(logits / softcap), with
                              1/softcap finite (softcap > 1/FLT_MAX, about 2.9e-39) */
    int64_t chunk;         /* tokens per chunk, at most (shared evenly); 0: automatic */
    int64_t vocab_chunk;   /* vocabulary entries per tile; 0: automatic (with chunk 0: whole
                              rows if 64 tokens of them fit in 2 MiB, else 1024; with a given
                              chunk: whole rows) */
    /* Where the call runs (docs/cuda.md); all zero keeps the CPU path and float32. */
    int device;            /* 0: the CPU; k > 0: CUDA device k - 1, every pointer in its memory */
    void *stream;          /* device calls: the cudaStream_t they are queued on, NULL: default */
    fx_dtype dtype;        /* FX_DT_F32: float32; FX_DT_BF16 (device only): h, w, bias, dh,
                              dw, dbias are bfloat16 (loss, lse, grad_loss stay float32). 0
                              (FX_DT_BOOL) is also taken as float32, so that a zero-initialised
                              struct is a float32 CPU call; fx_lce_defaults sets FX_DT_F32 */
} fx_lce;

/* N, D, V with PyTorch's defaults: MEAN, ignore_index -100, no smoothing, z-loss or cap,
   automatic chunking; the CPU, float32 (FX_DT_F32). */
FX_API fx_lce fx_lce_defaults(int64_t N, int64_t D, int64_t V);

/* h [N,D], w [V,D], bias [V] or NULL, target [N] -> loss [1] (MEAN, SUM) or [N] (NONE), lse [N] or NULL.
   dh [N,D] is overwritten; dw [V,D] and dbias [V] are accumulated (+=), so a tied embedding works.
   Any gradient pointer may be NULL, and so may loss. Gradients are those of the reduced loss
   (NONE: of its sum). lse is the natural log-sum-exp of each token's (soft-capped) logits,
   ignored tokens included. Outputs must not overlap inputs or each other. */
FX_API int fx_linear_cross_entropy(const fx_lce *p, const float *h, const float *w, const float *bias,
                                   const int64_t *target, float *loss, float *lse,
                                   float *dh, float *dw, float *dbias);
/* General upstream gradient: grad_loss [1] (MEAN, SUM) or [N] (NONE); lse from the forward call.
   Recomputes the logits chunk by chunk; dh overwritten, dw and dbias accumulated as above.
   With grad_loss = 1 the gradients are bitwise those of the forward call. */
FX_API int fx_linear_cross_entropy_backward(const fx_lce *p, const float *h, const float *w,
                                            const float *bias, const int64_t *target,
                                            const float *lse, const float *grad_loss,
                                            float *dh, float *dw, float *dbias);

/* The chunk plan for p: tokens per chunk, vocabulary entries per tile, and the scratch bytes
   a call allocates (the whole extra memory of a call). Any output pointer may be NULL.
   FX_EINVAL for the same bad sizes or options the calls reject. */
FX_API int fx_linear_cross_entropy_plan(const fx_lce *p, int64_t *chunk, int64_t *vocab_chunk,
                                        size_t *workspace_bytes);

#ifdef __cplusplus
}
#endif
#endif
