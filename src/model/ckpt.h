/* The files flexc writes for a model (ckpt.c): safetensors whose metadata holds the config,
   the mask, the kind of file ("checkpoint", "model", or "lora": a LoRA run's adapters) and,
   in a checkpoint, the training state. Shared by the whole model's files (ckpt.c) and a LoRA
   run's (lora_ckpt.c). */
#ifndef FX_MODEL_CKPT_H
#define FX_MODEL_CKPT_H

#include "model.h"

#include <flexc/safetensors.h>

#define FX__FORMAT "flexc-gpt"
#define FX__FORMAT_VERSION "1"

/* ---- writing: the metadata as key/value pairs for fx_safetensors_save ---- */

enum { FX__META_MAX = 64, FX__META_LEN = 96 };

typedef struct fx__meta {
    const char *kv[2 * FX__META_MAX + 1]; /* NULL-terminated */
    char val[FX__META_MAX][FX__META_LEN];
    int n;
} fx__meta;

void fx__meta_add(fx__meta *m, const char *key, const char *fmt, ...) FX__PRINTF(3, 4);
/* value is borrowed (it may be longer than FX__META_LEN) and must outlive the save. */
void fx__meta_add_ref(fx__meta *m, const char *key, const char *value);
/* format, version, kind, every config field, the mask, the tokenizer. */
void fx__meta_config(fx__meta *md, const fx__model *m, const char *kind);
/* The training state (step, generator, schedule, optimizer settings, data). */
void fx__meta_state(fx__meta *md, const fx__model_train_state *s);

/* ---- reading ---- */

/* The format of path from its metadata alone (FX_EFORMAT naming it when not flexc's). */
int fx__check_format(const char *path);
/* The config of an open file of any kind, checked, and with s its training state (when it
   holds optimizer moments); *has_adam whether it does. */
int fx__ckpt_read(const fx_safetensors *f, const char *path, fx_model_config *c, fx__model_train_state *s,
                  bool *has_adam);
int fx__meta_i64(const fx_safetensors *f, const char *path, const char *key, int64_t *out);
int fx__meta_f32(const fx_safetensors *f, const char *path, const char *key, float *out);
/* Tensor `name` present, F32 (or BF16 when allowed), of the shape given. */
int fx__check_view(const char *path, const fx_tensor_view *v, const char *name, int ndim, const int64_t *shape,
                   bool allow_bf16);
/* Adam moments: finite, the second never negative. */
int fx__check_moments(const char *path, const fx_tensor_view *mv, const fx_tensor_view *vv);

#endif
