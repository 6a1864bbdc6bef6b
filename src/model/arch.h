/*
 * The architecture table: every tensor of the Llama family, declared once (internal).
 *
 * One row per tensor: flexc's name, its Hugging Face name, its shape in terms of the
 * configuration, whether its rows are RoPE'd heads (permuted between flexc's interleaved
 * pairs and Hugging Face's rotate-half order), whether weight decay applies, how it is
 * initialised, and which configurations have it. The training layout (model.c), Hugging Face
 * import and export (src/hf), and checkpoints (by the layout's names) are all derived from
 * these rows, in this order; a later format (GGUF names, PEFT adapter names) is one more
 * column. Hugging Face tensor names appear in this file's source and nowhere else.
 *
 *   model:  wte, then L layers, then norm, then lm_head (untied heads only)
 *   layer:  norm1, attn.wq, attn.wk, attn.wv, attn.wo, norm2, mlp.w1 (gate), mlp.w3 (up),
 *           mlp.w2 (down), then attn.bq, attn.bk, attn.bv (qkv_bias only)
 *
 * The layer order is the parameter buffer's order, which checkpoints, the flat optimizer and
 * the gradient norm's summation order follow: append new tensors, never reorder.
 *
 * A row says which configurations have it by naming a bool field of fx_model_config
 * (present when it is true, or when it is false), and a vector row may be the bias of another
 * row's product: the layer (layer.c) adds every present bias to its product's output and
 * gives it its gradient, whatever the tensor. So an optional bias is a configuration field
 * and rows here, and no code elsewhere.
 */
#ifndef FX_MODEL_ARCH_H
#define FX_MODEL_ARCH_H

#include <flexc/model.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A length in terms of the configuration. */
typedef enum fx__arch_len {
    FX__LEN_NONE = 0, /* as cols: the tensor is a vector */
    FX__LEN_VOCAB,    /* V */
    FX__LEN_DIM,      /* C */
    FX__LEN_Q,        /* Hq * hd: the query heads */
    FX__LEN_KV,       /* Hkv * hd: the key/value heads */
    FX__LEN_FFN       /* F */
} fx__arch_len;

/* Which configurations have the tensor: all (on false), or those whose bool field at
   `field` (an offset in fx_model_config) is true (false when `unless`). */
typedef struct fx__arch_when {
    bool on;
    bool unless;
    size_t field;
} fx__arch_when;

/* How fx_model_create fills it. */
typedef enum fx__arch_init {
    FX__INIT_NORMAL = 0, /* N(0, 0.02) */
    FX__INIT_RESIDUAL,   /* N(0, 0.02 / sqrt(2L)): projections back into the residual stream */
    FX__INIT_ONES,       /* norms */
    FX__INIT_ZEROS       /* biases */
} fx__arch_init;

typedef struct fx__arch_tensor {
    const char *name;         /* flexc's ("attn.wq"); a layer's tensors sit under "layers.N." */
    const char *hf;           /* Hugging Face's ("self_attn.q_proj.weight"); a layer's under
                                 "model.layers.N." */
    fx__arch_len rows, cols;  /* cols FX__LEN_NONE: a vector of `rows` */
    fx__arch_len rope;        /* FX__LEN_Q or FX__LEN_KV: the rows are RoPE'd query or key
                                 heads of hd rows each; FX__LEN_NONE: not permuted */
    bool decay;               /* weight decay applies (the matrices) */
    fx__arch_init init;
    fx__arch_when when;
    int bias_of;              /* a layer's vector added to the output of the product of its
                                 row bias_of (an FX__MODEL_* index); -1: not a bias */
} fx__arch_tensor;

/* Indices of the layer's rows in fx__arch_layer (the buffer order) that code names; rows past
   these (more biases) need no name. */
enum {
    FX__MODEL_LN1, FX__MODEL_WQ, FX__MODEL_WK, FX__MODEL_WV, FX__MODEL_WO,
    FX__MODEL_LN2, FX__MODEL_W1, FX__MODEL_W3, FX__MODEL_W2,
    FX__MODEL_BQ, FX__MODEL_BK, FX__MODEL_BV
};
/* The model's own tensors, indexing fx__arch_model. */
enum { FX__ARCH_WTE, FX__ARCH_NORM, FX__ARCH_LM_HEAD, FX__ARCH_MODEL };
/* At most this many rows in a layer (the size of per-layer arrays indexed by row). */
enum { FX__ARCH_LAYER_MAX = 32 };

extern const fx__arch_tensor fx__arch_layer[];
extern const size_t fx__arch_nlayer; /* rows in fx__arch_layer */
extern const fx__arch_tensor fx__arch_model[FX__ARCH_MODEL];

/* The length `len` stands for in c (0 for FX__LEN_NONE); c's head_dim must be filled. */
int64_t fx__arch_len_of(fx__arch_len len, const fx_model_config *c);
/* Whether configuration c has tensor t. */
bool fx__arch_has(const fx__arch_tensor *t, const fx_model_config *c);
/* How many of the layer's rows configuration c has (the tensors of one layer). */
size_t fx__arch_layer_count(const fx_model_config *c);
/* The layer row that is the bias of row `which`'s product, or -1 (none in the table). */
int fx__arch_bias_row(int which);

/* One tensor of a configuration, as fx__arch_each hands it out. */
typedef struct fx__arch_entry {
    const fx__arch_tensor *t;
    int64_t layer;     /* -1 for the model's own tensors */
    char name[48];     /* "layers.3.attn.wq" */
    char hf[96];       /* "model.layers.3.self_attn.q_proj.weight" */
    int ndim;          /* 1 or 2 */
    int64_t shape[2];  /* [rows, cols] or [rows] */
    int64_t rope_heads;/* heads of hd rows to permute, 0 when not RoPE'd */
} fx__arch_entry;

/* Calls fn on every tensor of c in the table's order; stops at, and returns, the first
   status fn returns other than FX_OK. c must have passed fx_model_config_validate. */
int fx__arch_each(const fx_model_config *c, int (*fn)(void *ctx, const fx__arch_entry *e), void *ctx);
/* How many tensors c has. */
size_t fx__arch_count(const fx_model_config *c);

#endif
