/* The GPT's training step on one CUDA device (docs/cuda.md, "Training on the GPU").

   fx__gpt_gpu_attach gives a host model (src/gpt/gpt.h) a device copy: the float32 weights
   in the host's flat layout, their bfloat16 copy under bf16, the gradients, the two Adam
   moments and the activations of a (B, T) batch. From then on the model's own calls run
   there: fx__gpt_set_batch, fx__gpt_forward, fx__gpt_backward, fx__gpt_zero_grad and the
   training step's norm and optimizer (src/gpt/step.c) route to the functions below when
   m->gpu is set, with the CPU path's semantics (the same loss, masks, clipping and AdamW).

   The host buffers are not kept in step: fx__gpt_gpu_download copies the weights and moments
   back (before a checkpoint is written by the usual writer), fx__gpt_gpu_upload sends them
   again (after a load). So checkpoints are the CPU's, and a run may resume on either.

   Matrix products go through cuBLASLt (blas.h), bfloat16 in and float32 accumulated under
   bf16; the attention and the fused loss are the device paths of fx_flex_attention and
   fx_linear_cross_entropy; the rest is train.cu. Every step repeats bitwise on one GPU.

   Built in every configuration: without CUDA, fx__gpt_gpu_attach returns FX_EUNSUPPORTED. */
#ifndef FX_CUDA_MODEL_GPU_H
#define FX_CUDA_MODEL_GPU_H

#include "gpt/gpt.h"

/* Moves training of m (with its training buffers, fx__gpt_alloc_train, and float32 Adam
   moments) to CUDA device `device` (>= 1: CUDA device device - 1): uploads the weights and
   moments; bf16 takes the matrix products' inputs in bfloat16 (as fx__gpt_set_bf16 on the
   CPU, whose host copy is then not needed). FX_EUNSUPPORTED names what is missing (no CUDA
   in the build, no device) or what the device path does not do (recompute, bfloat16 moments,
   the dense-causal baseline mask, head sizes above 256, sharded training). */
int fx__gpt_gpu_attach(fx__gpt *m, int device, bool bf16);
/* Frees the device copy (fx__gpt_free calls it). */
void fx__gpt_gpu_free(struct fx__gpt_gpu *g);
/* The device's weights and Adam moments into m->params and m->adam. */
int fx__gpt_gpu_download(fx__gpt *m);
/* m->params (and m->adam when the model has it) to the device, and the bfloat16 copy. */
int fx__gpt_gpu_upload(fx__gpt *m);
/* The device's gradients into grads [P] (tests). */
int fx__gpt_gpu_grads(const fx__gpt *m, float *grads);

/* The model's calls on the device (the routes of their CPU twins in gpt.h). */
int fx__gpt_gpu_set_batch(fx__gpt *m, int64_t B, int64_t T);
int fx__gpt_gpu_forward(fx__gpt *m, const int32_t *tokens, const int32_t *targets, float *loss, bool grad);
int fx__gpt_gpu_backward(fx__gpt *m);
int fx__gpt_gpu_zero_grad(fx__gpt *m);
int fx__gpt_gpu_grad_norm(fx__gpt *m, double *norm);
int fx__gpt_gpu_adamw(fx__gpt *m, const fx__adamw *o, int64_t t);
/* fx__gpt_decode on the device (generation): the cache's keys and values live there, the
   block mask is the host cache's (built by fx__gpt_decode when len == 0) copied over, and
   the logits of the last token come back to logits [V]. Float32 throughout. */
int fx__gpt_gpu_decode(fx__gpt *m, fx__gpt_cache *kc, const int32_t *tokens, int64_t n, float *logits);
/* Waits for the device's queued work (the step's timings). */
int fx__gpt_gpu_sync(const fx__gpt *m);

#endif
