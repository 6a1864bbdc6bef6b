/* Compiled expression mods (mod.c): what the backward pass needs to scatter the gradients of
   captured tensors. */
#ifndef FLEXC_ATTENTION_MOD_INTERNAL_H
#define FLEXC_ATTENTION_MOD_INTERNAL_H

#include "flexc/mod.h"

/* Elements of the partial buffer one backward unit needs for the gradients of the mod's
   captured tensors (0: none wanted). */
int64_t fx__mod_grad_elems(const fx_mod *m);
/* Adds g * d result / d read of every read of a captured tensor with a grad into part (laid out
   as the tensors with grads, one after another), for a tile: s raw scores, g the gradient
   w.r.t. the modified scores. */
void fx__mod_grad_accum(const fx_mod *m, double *part, const float *s, const float *g, int64_t ld, int64_t nq,
                        int64_t nkv, int64_t b, int64_t h, int64_t q0, int64_t kv0);
/* Adds the reduced partials (sum, in a fixed order, of nparts buffers) into the tensors' grads. */
void fx__mod_grad_reduce(const fx_mod *m, const double *parts, int64_t nparts);

#endif
