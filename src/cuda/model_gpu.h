/* The GPT's training step on one CUDA device (docs/cuda.md, "Training on the GPU").

   fx__model_gpu_attach gives a host model (src/model/model.h) a device copy: the float32 weights
   in the host's flat layout, their bfloat16 copy under bf16, the gradients, the two Adam
   moments and the activations of a (B, T) batch. From then on the model's own calls run
   there: fx__model_set_batch, fx__model_forward, fx__model_backward, fx__model_zero_grad, the
   training step's norm and optimizer (src/model/step.c) and fx__model_decode route to this
   file's table (m->device, fx__model_device in model.h), with the CPU path's semantics (the
   same loss, masks, clipping and AdamW).

   The host buffers are not kept in step: fx__model_gpu_download copies the weights and moments
   back (before a checkpoint is written by the usual writer), fx__model_gpu_upload sends them
   again (after a load). So checkpoints are the CPU's, and a run may resume on either.

   Matrix products go through cuBLASLt (blas.h), bfloat16 in and float32 accumulated under
   bf16; the attention and the fused loss are the device paths of fx_flex_attention and
   fx_linear_cross_entropy; the rest is train.cu. Every step repeats bitwise on one GPU.

   Built in every configuration: without CUDA, fx__model_gpu_attach returns FX_EUNSUPPORTED. */
#ifndef FX_CUDA_MODEL_GPU_H
#define FX_CUDA_MODEL_GPU_H

#include "model/model.h"

/* Moves training of m (with its training buffers, fx__model_alloc_train, and float32 Adam
   moments) to CUDA device `device` (>= 1: CUDA device device - 1): uploads the weights and
   moments; bf16 takes the matrix products' inputs in bfloat16 (as fx__model_set_bf16 on the
   CPU, whose host copy is then not needed). FX_EUNSUPPORTED names what is missing (no CUDA
   in the build, no device) or what the device path does not do (recompute, bfloat16 moments,
   the dense-causal baseline mask, head sizes above 256, sharded training). */
int fx__model_gpu_attach(fx__model *m, int device, bool bf16);
/* The device's weights and Adam moments into m->params and m->adam. */
int fx__model_gpu_download(fx__model *m);
/* m->params (and m->adam when the model has it) to the device, and the bfloat16 copy. */
int fx__model_gpu_upload(fx__model *m);
/* The device's gradients into grads [P] (tests). */
int fx__model_gpu_grads(const fx__model *m, float *grads);

/* The model's own calls then run on the device through m->device (fx__model_device, model.h). */

#endif
