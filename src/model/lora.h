/* LoRA adapters on the model's projections (internal; docs/lora.md).

   For a target projection W [O, I] of layer l:  y = x W^T + scale (drop(x) A^T) B^T  with
   A [r, I], B [O, r], scale = alpha / r; B starts at zero and A as PEFT's default init
   (kaiming-uniform with a = sqrt(5): uniform(-1/sqrt(I), 1/sqrt(I))), drop is dropout of
   probability p on the adapter's input only (PEFT's lora_dropout). The base stays frozen.

   Every adapter tensor lives in one float32 buffer (with its gradients and AdamW moments),
   laid out by a table in the order layer, target (q, k, v, o, gate, up, down), A then B,
   each named as PEFT names it (base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight),
   so checkpoints and export walk the table.

     fx__lora_config lc = fx__lora_defaults(8);          // r 8, alpha 16, all seven targets
     fx__lora *a;
     fx__lora_create(&a, &m->c, &lc, seed);             // then fx__model_set_lora(m, a)
     for (size_t i = 0; i < a->n; i++) a->t[i].name, a->t[i].shape, a->params + a->t[i].offset;

   The q and k projections' B rows follow the base's row order: flexc's interleaved pairs on
   a model in the training layout, Hugging Face's rotate-half order on a mapped file (its
   `rope_heads` says how many heads of hd rows an exporter permutes, as fx__arch_entry's). */
#ifndef FX_MODEL_LORA_H
#define FX_MODEL_LORA_H

#include <flexc/model.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The projections an adapter can target, in the table's order. */
typedef enum fx__lora_target {
    FX__LORA_Q, FX__LORA_K, FX__LORA_V, FX__LORA_O, FX__LORA_GATE, FX__LORA_UP, FX__LORA_DOWN, FX__LORA_TARGETS
} fx__lora_target;
enum { FX__LORA_ALL = (1u << FX__LORA_TARGETS) - 1 };

typedef struct fx__lora_config {
    int64_t rank;     /* r >= 1 */
    float alpha;      /* scale = alpha / r */
    float dropout;    /* p in [0, 1) on the adapter's input while training */
    unsigned targets; /* bit t: target t (FX__LORA_ALL: all seven) */
} fx__lora_config;

/* One adapter tensor of the table. */
typedef struct fx__lora_tensor {
    char name[176];        /* PEFT's name */
    int64_t layer;
    fx__lora_target target;
    bool is_b;             /* lora_B [O, r]; else lora_A [r, I] */
    int64_t shape[2];
    int64_t rope_heads;    /* B of q / k: heads of hd rows (0 otherwise) */
    size_t offset, numel;  /* in the buffers, floats */
} fx__lora_tensor;

typedef struct fx__lora {
    fx__lora_config cfg;
    float scale;            /* alpha / r */
    int64_t layers;
    fx__lora_tensor *t;     /* [n] */
    size_t n, total;        /* tensors, floats */
    int32_t *index;         /* [layers * FX__LORA_TARGETS]: the A tensor's row in t, -1: none */
    float *params, *grads;  /* [total] */
    float *adam_m, *adam_v; /* [total], fx__lora_alloc_train */
    bool training;          /* dropout applies (the model's forward with grad sets it) */
    uint64_t drop_seed;     /* the dropout masks' seed: (drop_seed, drop_step, layer, target, element) */
    uint64_t drop_step;
    int64_t drop_row;       /* the row of the step's whole batch that a pass's row 0 is (a process's
                               or a sequence's share of it): masks follow the batch, not the pass */
    float *sink;            /* [dim]: where the frozen norms' gradients go (never read) */
    float *scratch;         /* grown to the largest need (fx__lora_scratch) */
    size_t scratch_n;
    int64_t in_max;         /* the widest input of a projection */
    int64_t kept_rows;      /* N > 0: the forward pass with gradients keeps each adapter's
                               drop(x) A^T [N, r] in the scratch for the backward pass */
} fx__lora;

/* r, alpha 2r, no dropout, all seven targets. */
fx__lora_config fx__lora_defaults(int64_t rank);
/* The table of c's adapters for lc, with parameters: A from (seed), B zero; gradients zero.
   FX_EINVAL naming a bad rank, dropout or target set. */
int fx__lora_create(fx__lora **out, const fx_model_config *c, const fx__lora_config *lc, uint64_t seed);
/* AdamW moments (zero). */
int fx__lora_alloc_train(fx__lora *a);
void fx__lora_free(fx__lora *a);
/* The row of table entry named `name` (PEFT's), or -1. */
ptrdiff_t fx__lora_find(const fx__lora *a, const char *name);
/* Copies values [numel] into tensor i (loading adapters). FX_ERANGE for a bad i. */
int fx__lora_set(fx__lora *a, size_t i, const float *values, size_t numel);
/* The adapter's A, or NULL where layer l's target t has none. */
const float *fx__lora_a(const fx__lora *a, int64_t l, fx__lora_target t);
const float *fx__lora_b(const fx__lora *a, int64_t l, fx__lora_target t);
/* The architecture table's layer tensor (FX__MODEL_*) a target adapts, and back (-1: none). */
int fx__lora_weight_of(fx__lora_target t);
int fx__lora_target_of(int which);
/* Floats of scratch the adapters need to train on N rows of model c (the backward's, and
   each adapter's drop(x) A^T kept from the forward pass: grow it with fx__lora_scratch and set
   kept_rows = N before a forward pass with gradients over N rows). */
size_t fx__lora_scratch_floats(const fx__lora *a, const fx_model_config *c, int64_t N);
/* Grows a->scratch to at least n floats. */
int fx__lora_scratch(fx__lora *a, size_t n);
/* Bytes the adapters hold: parameters, gradients, with_adam the two moments. */
size_t fx__lora_bytes(const fx__lora *a, bool with_adam);
/* Floats of c's adapters for lc (the buffer's size, each tensor padded to 16 floats). */
size_t fx__lora_floats(const fx_model_config *c, const fx__lora_config *lc);

/* ---- the products (layer.c calls them) ---------------------------------------------------------- */

/* Rows per pass of fx__lora_group_forward (its scratch is reserved at creation). */
enum { FX__LORA_ROWS = 256 };

/* A projection of a group that reads one input (q, k, v; gate, up; or one alone): its target,
   which has an adapter, and its outputs' columns [col, col + O) of the group's rows. */
typedef struct fx__lora_part {
    fx__lora_target t;
    int64_t col, O;
} fx__lora_part;
enum { FX__LORA_GROUP_MAX = 3 };

/* y [N, columns] (rows ldy apart) += scale (drop(x) A_i^T) B_i^T into each part's columns, for
   the n parts p of layer l; x [N, I]. Without dropout one product makes every part's
   drop(x) A_i^T (x read once). */
void fx__lora_group_forward(fx__lora *a, int64_t l, const fx__lora_part *p, int n, float *y, int64_t ldy,
                            const float *x, int64_t N, int64_t I);
/* The backward of fx__lora_group_forward in two calls, for dy [N, columns] (rows ldy apart)
   and the forward's input x: fx__lora_group_grads adds the parts' dA and dB and keeps their
   d(u) in the scratch; fx__lora_group_dx then adds the adapters' d(x) into dx [N, I]. In
   between the caller may overwrite x (the base's d(x) into memory x shares), and must make
   no other adapter call. */
void fx__lora_group_grads(fx__lora *a, int64_t l, const fx__lora_part *p, int n, const float *dy, int64_t ldy,
                          const float *x, int64_t N, int64_t I);
void fx__lora_group_dx(fx__lora *a, int64_t l, const fx__lora_part *p, int n, float *dx, int64_t N, int64_t I);

/* W + scale B A for layer l's target t, in float64, rounded to float32 into w [O, I] (w holds
   W in float32 on entry). */
void fx__lora_merge(const fx__lora *a, int64_t l, fx__lora_target t, float *w, int64_t O, int64_t I);

/* The gradient norm over the adapters (fixed order) and AdamW on them: as fx__model_adamw
   does for the parameters (decay on every adapter tensor). */
double fx__lora_grad_norm(const fx__lora *a);
struct fx__adamw;
void fx__lora_adamw(fx__lora *a, const struct fx__adamw *o, int64_t t);
void fx__lora_zero_grad(fx__lora *a);
/* Layer l's adapter gradients, one contiguous run of *numel floats (the table is in layer
   order): what multi-process training reduces as the backward pass finishes each layer. */
float *fx__lora_layer_grads(fx__lora *a, int64_t l, size_t *numel);

/* The memory plan of LoRA training (fx__model_mem_train's, o as for full training): the base
   weights as they are held (base_bytes: the mapped file's tensors, or 0 for float32
   parameters), the adapters with them in params, the adapters' gradients and the norm's
   partial sums in grads, their two moments in adam (no base gradients or moments); the
   activations, scratch, data and process as full training's, plus the adapters' scratch.
   o->params_held says a float32 base is held already, as for full training (a mapped base:
   pass false; its resident pages are taken out of process, being counted in params). */
struct fx__model_mem;
struct fx__model_mem_opts;
int fx__lora_mem_train(struct fx__model_mem *mem, const fx_model_config *c, const fx__lora_config *lc,
                       const struct fx__model_mem_opts *o, uint64_t base_bytes);

/* ---- files (lora_ckpt.c) ------------------------------------------------------------------------ */

/* "q,k,v,o,gate,up,down" (any subset, also PEFT's q_proj, ...; or "all") to target bits, and
   back (short names, table order). FX_EINVAL naming an unknown name. */
struct fx_model;
struct fx__model_train_state;
int fx__lora_targets_parse(const char *s, unsigned *out);
void fx__lora_targets_format(unsigned targets, char *buf, size_t n);

/* Where adapters are: a LoRA run's checkpoint (a training --out directory without a whole
   model file, or the checkpoint file itself; kind "lora") or a PEFT adapter directory
   (adapter_config.json + adapter_model.safetensors). */
typedef struct fx__lora_source {
    bool peft;            /* a PEFT directory; else a LoRA checkpoint */
    char file[4200];      /* the checkpoint, or adapter_model.safetensors */
    char base[4096];      /* the base model's Hugging Face directory */
    fx__lora_config cfg;
} fx__lora_source;

/* *found: path holds adapters (src filled: settings and base, checked); FX_OK with *found
   false when it holds something else (a whole model, a Hugging Face directory). */
int fx__lora_source_find(const char *path, fx__lora_source *src, bool *found);
/* The base of src with its adapters attached: mapped in its file's dtype (as
   fx_model_load_inference), or, merged, read into float32 with W + scale B A in place of each
   adapted matrix (no adapters left: a whole model to save or export). */
int fx__lora_open(struct fx_model **out, const fx__lora_source *src, bool merged);

/* A LoRA run's checkpoint: kind "lora", the config of m (the base's), the training state s,
   the adapters (PEFT's names, float32), their AdamW moments (optim.m, optim.v over the
   buffer), the dropout stream, and base (the base model's directory). */
int fx__lora_save_checkpoint(const struct fx_model *m, const struct fx__model_train_state *s, const char *base,
                             const char *path);
/* The adapters of the checkpoint at path attached to m (the base: its config must be the
   file's), with their AdamW moments and dropout stream when load_adam. Checked whole first. */
int fx__lora_load(struct fx_model *m, const char *path, bool load_adam);
/* The q / k adapters' B rows from Hugging Face's rotate-half order (a mapped base's) to
   flexc's interleaved pairs (a float32 base in the training layout). */
int fx__lora_rows_to_flexc(fx__lora *a, int64_t hd);
/* dir/adapter_config.json and dir/adapter_model.safetensors (tensors in dtype) as PEFT writes
   them, naming base as base_model_name_or_path; PeftModel.from_pretrained loads the directory. */
int fx__lora_export_peft(const fx__lora *a, const char *dir, const char *base, fx_dtype dtype);

#endif
