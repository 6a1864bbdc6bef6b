/*
 * FlexAttention mods written as expressions (docs/attention.md, "Mods as expressions"):
 * compiled once into a small register program that runs over a tile row at a time, with its
 * derivative w.r.t. the score and w.r.t. every read of a captured float tensor.
 *
 *     float bias[8 * 128];                       // learned, [H, 128]
 *     float gbias[8 * 128] = {0};                // the backward ADDS d loss / d bias here
 *     fx_mod_tensor t = {.name = "bias", .dtype = FX_DT_F32, .ndim = 2, .shape = {8, 128},
 *                        .data = bias, .grad = gbias};
 *     fx_mod *m;
 *     int rc = fx_mod_compile(&m, "score + bias[h, clamp(q_idx - kv_idx + 64, 0, 127)]", &t, 1);
 *     a.score_mod = fx_mod_score, a.score_mod_grad = fx_mod_score_grad, a.score_ctx = m;
 *     ... fx_flex_attention(&a, ...), fx_flex_attention_backward(&a, ...) ...
 *     fx_mod_free(m);
 *
 * The tensors' data is read at every call (not copied): update it in place between steps.
 */
#ifndef FLEXC_MOD_H
#define FLEXC_MOD_H

#include "attention.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fx_mod fx_mod;

typedef struct fx_mod_tensor {
    const char *name;  /* an identifier; not a leaf or function name */
    int dtype;         /* FX_DT_F32, FX_DT_I64, FX_DT_I32 or FX_DT_BOOL (one byte, 0 or not) */
    int ndim;          /* 1 .. 4 */
    int64_t shape[4];  /* each >= 1; row-major, contiguous */
    const void *data;
    float *grad;       /* NULL, or float32 of the same shape (F32 tensors only): the backward
                          pass ADDS d loss / d tensor here, deterministically */
} fx_mod_tensor;

/* Compiles expr. A bool result makes a mask mod, anything else a score mod (its result is
   converted to float). tensors are copied by description (name, dtype, shape, pointers); the
   pointers must stay valid while the mod is used. Errors: FX_EINVAL with "expr:COL: problem". */
FX_API int fx_mod_compile(fx_mod **out, const char *expr, const fx_mod_tensor *tensors, int ntensors);
FX_API void fx_mod_free(fx_mod *m);
FX_API bool fx_mod_is_mask(const fx_mod *m);
/* Whether the score mod reads `score` or float tensors with a grad, i.e. the backward does work. */
FX_API int fx_mod_nregs(const fx_mod *m); /* registers of the forward program (for tests) */

/* fx_score_fn / fx_score_grad_fn / fx_mask_fn with ctx = the fx_mod. */
FX_API void fx_mod_score(float *s, int64_t ld, int64_t nq, int64_t nkv, int64_t b, int64_t h, int64_t q0,
                         int64_t kv0, const void *ctx);
FX_API void fx_mod_score_grad(const float *s, float *g, int64_t ld, int64_t nq, int64_t nkv, int64_t b,
                              int64_t h, int64_t q0, int64_t kv0, const void *ctx);
FX_API bool fx_mod_mask(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx);

/* A block mask from a mask mod: blocks whose value interval arithmetic proves constant over the
   block are classified without evaluating them; the others are evaluated a row at a time. */
FX_API int fx_block_mask_create_mod(fx_block_mask **out, const fx_mod *mask, int64_t B, int64_t H,
                                    int64_t q_len, int64_t kv_len, int64_t block_q, int64_t block_kv);

#ifdef __cplusplus
}
#endif
#endif
