/*
 * The points where a multi-process trainer (src/model/dist.c) or another device's runtime
 * hooks into the model's passes: one struct of callbacks with the user pointer they all
 * receive. A model with no hooks (all NULL, the default) runs on its own flat buffers.
 *
 * Order within a training step (what each callback may rely on):
 *   forward:  layer(l, false) before layer l's forward, l = 0 .. L-1, then layer(L, false)
 *             before the final norm;
 *   backward: layer(L, true), grad(L, ...) when the final norm's gradient is final; then for
 *             l = L-1 .. 0: layer(l, true) before the layer's backward, grad(l, ...) after it;
 *             last grad(-1, ...) for the embedding (the loss and the inputs both add to it);
 *             with LoRA adapters (only they train) grad(l, ...) alone, over layer l's adapters;
 *   progress(): between the sub-operations of every layer, forward and backward.
 */
#ifndef FX_MODEL_HOOKS_H
#define FX_MODEL_HOOKS_H

#include <stdbool.h>
#include <stddef.h>

typedef struct fx__model_hooks {
    void *user; /* passed to every callback */
    /* A region of the gradient buffer is final for this micro-batch: layer = L for the final
       norm, L-1 .. 0 for each layer's tensors (contiguous), -1 for the embedding; with LoRA
       adapters layer l's adapter gradients (fx__lora_layer_grads) instead. */
    void (*grad)(int layer, float *grad, size_t numel, void *user);
    /* Before layer l's forward (backward false) and backward (l == L: the final norm): where
       sharded training gathers the layer. Non-zero aborts the pass with that status. */
    int (*layer)(int layer, bool backward, void *user);
    /* Between the sub-operations of a layer: where collectives in flight are driven
       forward (MPI advances them only inside its calls). */
    void (*progress)(void *user);
    /* Sharded training: layer l's parameters and gradients (l == L: the final norm) live in
       buffers of their own, laid out as in the flat buffer from the layer's first tensor;
       the embedding stays at offset 0 of the flat buffers. NULL: the flat buffers. */
    float **layer_params, **layer_grads;
} fx__model_hooks;

/* Whether any hook is set: the model may then not use gradient memory for anything else
   (parked activations), since a hook may read it. */
static inline bool fx__model_hooks_any(const fx__model_hooks *h)
{
    return h->grad || h->layer || h->progress || h->layer_params || h->layer_grads;
}

#endif
