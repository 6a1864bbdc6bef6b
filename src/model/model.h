/*
 * The Llama family of `flexc train` / `flexc generate` (flexc's byte-level GPT is one of its
 * configurations): a decoder-only transformer written by hand, forward and backward, over
 * flat buffers (internal to the library; the CLI and tests use it).
 *
 *   tokens -> wte
 *          -> L x [ x += Wo . attn(rope(Wq . rms1(x) + bq), rope(Wk . rms1(x) + bk), Wv . rms1(x) + bv)
 *                   x += W2 . (silu(W1 . rms2(x)) * (W3 . rms2(x))) ]
 *          -> rmsf -> fused linear + cross-entropy against lm_head (wte when tied)
 *
 * The biases exist with qkv_bias (Qwen2), attention may be causal, sliding or per document,
 * and every tensor is declared once in the architecture table (arch.h).
 *
 * Memory (llm.c style): every parameter lives in one contiguous buffer, carved into named
 * views by a size table (fx__model_tensor); gradients and the two Adam moments are buffers of
 * the same layout, so the optimizer is one flat loop and a checkpoint is a list of views.
 * Activations are one more buffer sized up front for (B, T).
 *
 * A training step is, in order (the points where a multi-process trainer hooks in):
 *   fx__model_zero_grad (unless grads_zero: the last optimizer pass cleared them); for each
 *   micro-batch: fx__model_forward, fx__model_backward (which calls the optional per-layer
 *   gradient hook (hooks.h) as each layer's gradients become final); the gradient norm, then
 *   fx__model_adamw over the flat buffers (averaging and clipping folded into its gradient
 *   scale, the gradients cleared as they are read).
 */
#ifndef FX_MODEL_H
#define FX_MODEL_H

#include "core/core.h"
#include "flexc/model.h"
#include "arch.h"
#include "config.h"
#include "hooks.h"

/* ---- tokens ---------------------------------------------------------------------------- */

/* Byte-level vocabulary: ids 0..255 are bytes, then the special tokens. */
enum { FX__MODEL_EOT = 256, FX__MODEL_VOCAB = 257 };

/* The configuration is the public fx_model_config (include/flexc/model.h; its fields are
   declared once in config.h): vocab, ctx, layers, dim (C), heads (Hq), kv_heads (Hkv),
   head_dim (hd), ffn (F), RoPE, norm_eps, biases, tied head, window, eos. */

/* ---- attention mask and loss paths ----------------------------------------------------- */

typedef enum fx__model_mask {
    FX__MODEL_MASK_CAUSAL = 0,
    FX__MODEL_MASK_SLIDING = 1,  /* causal, keys within `window` positions back */
    FX__MODEL_MASK_DOCUMENT = 2, /* causal within documents split at end-of-text */
    FX__MODEL_MASK_CAUSAL_DENSE = 3 /* causal, computed densely (every block, causality by a score
                                     modifier): the baseline that block skipping is measured against */
} fx__model_mask;

/* "causal" | "sliding:W" | "document" | "dense" -> mask, window. */
int fx__model_mask_parse(const char *s, fx__model_mask *mask, int64_t *window);
/* The canonical spelling back ("sliding:256"). */
void fx__model_mask_name(fx__model_mask mask, int64_t window, char *buf, size_t n);

typedef enum fx__model_attn_impl {
    FX__MODEL_ATTN_FLEX = 0, /* fx_flex_attention / fx_flex_attention_backward */
    FX__MODEL_ATTN_REF = 1   /* materialised scores, float64 softmax: the tests' reference */
} fx__model_attn_impl;

typedef enum fx__model_loss_impl {
    FX__MODEL_LOSS_FUSED = 0,  /* fx_linear_cross_entropy: no [N, V] logits */
    FX__MODEL_LOSS_UNFUSED = 1 /* materialised logits + softmax: the baseline */
} fx__model_loss_impl;

/* The contexts of the built-in masks the model uses (fx_mask_causal, fx_mask_sliding_window,
   fx_mask_document); fx__model_mask_fn picks the function and its context. */
typedef struct fx__model_mask_ctx {
    fx_mask_sliding_window_ctx sliding;
    fx_mask_document_ctx document;
} fx__model_mask_ctx;
fx_mask_fn fx__model_mask_fn(fx__model_mask mask, const fx__model_mask_ctx *mc, const void **ctx);

/* ---- attention mods written as expressions (flexc/mod.h) ---------------------------------- */

/* The longest text of a mod a model, a checkpoint or the training state keeps (with its NUL). */
enum { FX__MOD_SRC_MAX = 1024 };
struct fx_mod;
struct fx_model;
/* Compiles a mod's text for a model (no captured tensors) and checks its kind: a mask mod must
   be bool, a score mod must not. FX_EINVAL with "expr:COL: problem", or with what is wrong with
   its kind or length. */
int fx__model_mod_compile(struct fx_mod **out, const char *src, bool mask);
/* Gives the model its attention mods (NULL or "": none), compiled, replacing those it had; on
   an error the model keeps its own. A mask mod replaces the built-in mask (mask and window are
   then unused); a score mod applies on top of the mask, built-in or not. */
int fx__model_set_mods(struct fx_model *m, const char *score, const char *mask);
/* Whether the text reads the leaf `b` or `h` (an identifier of that name): block masks are
   then built per batch row or per head, and decoding runs every head in one call. */
bool fx__mod_src_reads(const char *src, char leaf);
/* The metadata value "attn" of a model: its built-in mask's name ("sliding:256"); "mod" with a
   mask mod; "mod:NAME" with a score mod over the built-in mask NAME. Readers that know no mods
   refuse the last two, rather than run the model without them. */
void fx__model_attn_name(const struct fx_model *m, char *buf, size_t n);

/* ---- parameters ------------------------------------------------------------------------ */

typedef struct fx__model_tensor {
    char name[48];     /* "wte", "layers.3.attn.wq", "norm" */
    int ndim;
    int64_t shape[2];
    size_t offset;     /* in floats, from the start of the buffer */
    size_t numel;
    bool decay;        /* weight decay applies (matrices only) */
    const fx__arch_tensor *arch; /* its row of the architecture table (arch.h) */
    int64_t layer;     /* -1: one of the model's own tensors */
} fx__model_tensor;

/* The view table of a configuration, in the architecture table's order (arch.h): wte,
   L * per_layer tensors, norm, then lm_head when the head is not tied. */
typedef struct fx__model_layout {
    fx__model_tensor *t;
    size_t n;
    size_t total;     /* floats */
    size_t per_layer; /* the rows of the layer's architecture table the configuration has */
} fx__model_layout;

/* ---- weights kept in their file (generation) ------------------------------------------- */

/* One tensor where decoding reads it: float32 in the model's buffer, or the file's bytes. */
typedef struct fx__model_weight {
    const void *data;
    fx_dtype dtype; /* F32, BF16 or F16 */
} fx__model_weight;

/* A model loaded for generation (fx_model_load_inference): params stays NULL and the
   matrices are read in place from the mapped file, in its dtype. The vectors (norms,
   biases), and a matrix the file holds misaligned, are widened to float32 in `own`. The
   first call that needs float32 parameters (forward, tensor access, save) reads every
   tensor into a new params buffer through `read` and closes the file. */
typedef struct fx__model_mapped {
    fx__model_weight *t; /* [lay.n], layout order */
    float *own;
    bool rope_half;    /* the rows of wq, wk (bq, bk) are in rotate-half order (Hugging Face):
                          decoding rotates x[i] with x[i + hd/2], not x[2i] with x[2i+1] */
    void *file;
    int (*read)(void *file, size_t i, float *dst); /* tensor i, float32, flexc's row order */
    void (*close)(void *file);
} fx__model_mapped;

/* ---- the model ------------------------------------------------------------------------- */

/* The device copy of a model trained on a CUDA device (src/cuda/model_gpu.h). */
typedef struct fx__model_gpu fx__model_gpu;

/* A device that runs a model's calls: when a model has one (m->device, set with m->gpu by the
   device's attach call, e.g. src/cuda's fx__model_gpu_attach), fx__model_set_batch,
   fx__model_forward, fx__model_backward, fx__model_zero_grad, the training step's norm and
   optimizer, and fx__model_decode route to it, with the CPU path's semantics. The model
   reaches a device through this table only, so src/model includes no backend. */
struct fx__adamw;
typedef struct fx__model_device {
    const char *name;                          /* "cuda" */
    void (*release)(fx__model_gpu *g);         /* frees the device copy */
    int (*set_batch)(struct fx_model *m, int64_t B, int64_t T);
    int (*forward)(struct fx_model *m, const int32_t *tokens, const int32_t *targets, float *loss, bool grad);
    int (*backward)(struct fx_model *m);
    int (*zero_grad)(struct fx_model *m);
    int (*grad_norm)(struct fx_model *m, double *norm);
    int (*adamw)(struct fx_model *m, const struct fx__adamw *o, int64_t t);
    int (*sync)(const struct fx_model *m);     /* waits for the device's queued work */
    int (*decode)(struct fx_model *m, struct fx_model_cache *kc, const int32_t *tokens, int64_t n, float *logits);
} fx__model_device;

/* The public fx_model is this struct. */
typedef struct fx_model fx__model;
struct fx_model {
    fx_model_config c;
    fx__model_layout lay;
    float *params;    /* [P] */
    float *grads;     /* [P], NULL until fx__model_alloc_train */
    float *adam;      /* [2P]: m then v, float32 ... */
    uint16_t *adam16; /* ... or bfloat16 when adam_bf16 (exactly one of the two is set) */
    bool adam_bf16;   /* set before fx__model_alloc_train: half the optimizer memory and traffic */
    uint16_t *params16; /* [P] bfloat16 copy of params when training in bf16 (fx__model_set_bf16):
                           every matrix product reads the weights from it, AdamW refreshes it */
    bool map_bf16;      /* training over a mapped BF16 / F32 base in bf16 (fx__model_set_bf16 on a
                           mapped model): its products read the file's rows as bfloat16 in place */
    float *bf16_ws;     /* the bf16 products' scratch (fx__model_bf16_ws_floats), with params16 or
                           map_bf16 */
    size_t bf16_ws_floats;
    uint32_t *head16;   /* with map_bf16: the frozen head packed once for the loss's products
                           (fx__model_head16_*) on path head16_path, or NULL */
    const struct fx__gemm_bf16_kernels *head16_path;
    float *rope;      /* [rope_len, hd/2, 2] cos, sin: positions 0 .. rope_len-1, grown on
                         demand (fx__model_rope_ensure), never [ctx, ...] up front */
    int64_t rope_len;

    /* Per-step settings. */
    fx__model_mask mask;
    int64_t window;
    fx__model_attn_impl attn_impl;
    fx__model_loss_impl loss_impl;
    bool recompute;   /* keep only each layer's input; backward recomputes the rest (set before
                         fx__model_set_batch): activation memory / (about) L, one more forward */
    /* Where this forward left its activations (read by the backward pass). */
    struct {
        bool acts_parked; /* layers 1 .. L-1's activations are parked in the gradient memory
                             of the layer below (recompute with clear gradients): the
                             backward pass recomputes nothing */
        bool res_two;     /* (recompute, no gradients) only two residual streams, in turn */
    } park;

    /* Activations for (B, T) and backward scratch: one buffer. */
    int64_t B, T;
    float *acts;
    size_t acts_floats;
    int64_t *targets;     /* [B*T] */
    int32_t *tokens;      /* [B*T] */
    int64_t *doc;         /* [B*T] document id of each position */
    fx_block_mask *bmask; /* built per batch for document masks, once per shape otherwise */
    fx__model_mask bmask_mask; /* what bmask was built for */
    int64_t bmask_window;
    fx__model_mask_ctx mctx;
    double *norm_parts;   /* per-chunk partial sums of the gradient norm */
    bool grads_zero;      /* the gradient buffer is all zeros: just allocated, zeroed, or
                             cleared by an optimizer step with zero_grad (the training step
                             then skips its own zeroing pass). Code that writes into grads
                             directly must clear this. */
    bool grad_ready;      /* a forward with grad ran, and its backward has not */

    fx__model_hooks hooks; /* distributed training's points of entry (hooks.h); all NULL alone */
    fx__model_mapped *mapped; /* generation-only weights (params NULL until needed), or NULL */
    fx__model_gpu *gpu;       /* training on a CUDA device (fx__model_gpu_attach): set_batch, forward,
                               backward and the step's optimizer run there; params and adam are
                               current only after fx__model_gpu_download */
    const fx__model_device *device; /* the calls of that device (set with gpu), or NULL */
    float *map_tile;          /* training over a mapped file: fx__linear_dt's widening scratch */
    /* Attention mods written as expressions (fx__model_set_mods), owned, or NULL: the mask mod
       replaces the built-in mask, the score mod applies on top of the mask; their texts as
       given (checkpoints record them), and whether either reads b or h. */
    struct fx_mod *score_mod, *mask_mod;
    char *score_src, *mask_src;
    bool mods_b, mods_h;
    bool bmask_of_mod;        /* bmask was built from mask_mod */
    struct fx__lora *lora;    /* LoRA adapters (lora.h, owned), or NULL: with them the base is
                                 frozen (no gradients for its weights, norms or embedding) and
                                 the training step trains the adapters only */
};

/* Grows the RoPE table to positions [0, len) (len <= ctx). */
int fx__model_rope_ensure(fx__model *m, int64_t len);
/* The LM head's parameters [V, C] (the embedding when tied) and gradients. */
float *fx__model_head(const fx__model *m, bool grads);
/* After a forward pass: logits [N, V] of every position, or [B, V] of each sequence's last
   one with last_only, from the final norm's output. */
void fx__model_logits(const fx__model *m, float *logits, bool last_only);
/* Allocates and initialises parameters (N(0, 0.02), output projections scaled by
   1/sqrt(2L), norms = 1) from seed. */
int fx__model_create(fx__model **out, const fx_model_config *c, uint64_t seed);
/* The model without initialising its parameters (their values are undefined): for a loader
   that fills every tensor, so a large model is not drawn at random first. */
int fx__model_new(fx__model **out, const fx_model_config *c);
void fx__model_free(fx__model *m);
/* The model without a parameter buffer, its weights in `mp` (taken over, also on failure:
   closed and freed). */
int fx__model_new_mapped(fx__model **out, const fx_model_config *c, fx__model_mapped *mp);
/* Float32 parameters for a mapped model: reads every tensor into a new buffer, then closes
   the file. FX_OK at once for a model that is not mapped. */
int fx__model_own_params(fx__model *m);
void fx__model_mapped_free(fx__model_mapped *mp);
/* Attaches adapters to m (taken over, also on failure; NULL detaches and frees them): made
   for m's configuration by fx__lora_create. Training then needs no fx__model_alloc_train:
   fx__lora_alloc_train gives the adapters' moments (fx__model_train_step calls it). */
int fx__model_set_lora(fx__model *m, struct fx__lora *a);
/* Gradient and Adam buffers (zeroed). */
int fx__model_alloc_train(fx__model *m);
/* The gradient buffer alone (zeroed), for forward / backward without the optimizer. */
int fx__model_alloc_grads(fx__model *m);
/* Activation buffers for batches of B sequences of T tokens (T <= ctx). Reallocates when
   the shape changes. */
int fx__model_set_batch(fx__model *m, int64_t B, int64_t T);
/* Floats of the activation buffer for (B, T) with the current paths. */
size_t fx__model_acts_floats(const fx__model *m, int64_t B, int64_t T);

const fx__model_tensor *fx__model_find(const fx__model *m, const char *name);

/* tokens [B,T], targets [B,T] (ids in [0,V), or -100 to ignore) -> *loss (mean over
   targets), keeping what backward needs. With grad, the loss's own gradient is made in the
   same pass (the fused loss produces it with the loss): dwte is accumulated into grads
   then, and fx__model_backward must follow before the next forward with grad. */
int fx__model_forward(fx__model *m, const int32_t *tokens, const int32_t *targets, float *loss, bool grad);
/* Accumulates (+=) the gradients of the last forward's mean loss into grads. */
int fx__model_backward(fx__model *m);
void fx__model_zero_grad(fx__model *m);

/* ---- bfloat16 matrix products (--dtype bf16) --------------------------------------------- */

/* On: allocates params16 (and the scratch for the current batch shape) and fills it from
   params; off: frees both, and the products are float32 again. Parameters changed outside
   fx__model_adamw afterwards (a load) need fx__model_bf16_sync. */
int fx__model_set_bf16(fx__model *m, bool on);
/* params16 = bfloat16 of params (nearest even), in parallel. */
void fx__model_bf16_sync(fx__model *m);
/* Floats of scratch the bf16 products of a (B, T) step need. */
size_t fx__model_bf16_ws_floats(const fx__model *m, int64_t B, int64_t T);
/* The same over a mapped base (map_bf16) of config c for N rows. */
size_t fx__model_bf16_map_ws_floats(const fx_model_config *c, int64_t N);
/* The mapped head's products in the loss over chunks of `rows` rows (map_bf16): the logits
   lg [nr, V] = bf16(x [nr, C]) E^T, and dx [nr, C] = bf16(dz [nr, V]) E, E the head [V, C]
   in the file's dtype. Both read the head packed once (m->head16, made at the first call)
   where the bf16 GEMM's tiled path takes every product of the loss and both packed forms
   fit in FX__HEAD16_MAX_BYTES; else fx__linear_bf16 and fx__linear_bf16_t, which pack it
   again each call. The same bits either way. */
enum { FX__HEAD16_MAX_BYTES = 256 << 20 };
/* Bytes of m->head16 for a loss over N rows of model c (0: none). */
size_t fx__model_head16_bytes(const fx_model_config *c, int64_t N);
void fx__model_head16_logits(fx__model *m, float *lg, const float *x, const void *w, fx_dtype dt, int64_t nr,
                             int64_t rows);
void fx__model_head16_dx(fx__model *m, float *dx, const float *dz, const void *w, fx_dtype dt, int64_t nr,
                         int64_t rows);
/* Grows bf16_ws for the current batch shape (with params16 only). */
int fx__model_bf16_ws_ensure(fx__model *m);

/* ---- optimizer ------------------------------------------------------------------------- */

typedef struct fx__adamw {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale; /* the gradient used is grads * grad_scale (0 means 1): averaging over
                         micro-batches and clipping, without a pass of their own */
    bool zero_grad;   /* clear the gradients as they are read (fx__model_zero_grad's work, done
                         in the optimizer's pass over the buffers) */
} fx__adamw;

/* sqrt(sum g^2) over the whole gradient buffer, in a fixed order (with LoRA adapters: theirs,
   fx__lora_grad_norm; fx__model_adamw likewise updates only them). */
double fx__model_grad_norm(const fx__model *m);
void fx__model_grad_scale(fx__model *m, float s);
/* One AdamW step (t counts from 1) over the flat buffers; decay on matrices only. With
   bfloat16 moments, each is widened, updated in float32 and rounded to nearest even (fine
   for beta2 <= 0.99: smaller relative updates than bfloat16's 2^-8 would be lost). */
void fx__model_adamw(fx__model *m, const fx__adamw *o, int64_t t);
/* The float32 AdamW update of n elements at step t with decay wd (the loop of fx__model_adamw;
   sharded training runs it on its shard, with the same results element for element). */
void fx__adamw_f32(float *p, float *g, float *m, float *v, int64_t n, const fx__adamw *o, float wd, int64_t t);
/* The per-element AdamW update with its constants worked out once per step and tensor:
   the element loops (a scalar reference and AVX2 / AVX-512 twins with bitwise the same
   results) over n elements of p, g and the two moments. With zero_grad the loop also
   clears g, so the next step needs no zeroing pass of its own. */
typedef struct fx__adamw_k {
    float gs, b1, nb1, b2, nb2, lr, bc1, bc2, eps, wd; /* nb1 = 1 - b1, bc1 = 1 - b1^t, ... */
    bool zero_grad;
} fx__adamw_k;
fx__adamw_k fx__adamw_consts(const fx__adamw *o, float wd, int64_t t);
void fx__adamw_f32_scalar(float *p, float *g, float *m, float *v, int64_t n, const fx__adamw_k *k);
void fx__adamw_bf16_scalar(float *p, float *g, uint16_t *m, uint16_t *v, int64_t n, const fx__adamw_k *k);
void fx__adamw_f32_avx2(float *p, float *g, float *m, float *v, int64_t n, const fx__adamw_k *k);
void fx__adamw_bf16_avx2(float *p, float *g, uint16_t *m, uint16_t *v, int64_t n, const fx__adamw_k *k);
void fx__adamw_f32_avx512(float *p, float *g, float *m, float *v, int64_t n, const fx__adamw_k *k);
void fx__adamw_bf16_avx512(float *p, float *g, uint16_t *m, uint16_t *v, int64_t n, const fx__adamw_k *k);
/* sum g[i]^2 in float64, in a fixed order that depends on n only: 16 lanes (element i in
   lane i % 16, the tail of fewer than 16 in lanes 0..), then the lanes pairwise. The scalar
   reference and its vector twins give bitwise the same sum. */
double fx__sumsq_scalar(const float *g, int64_t n);
double fx__sumsq_avx2(const float *g, int64_t n);
double fx__sumsq_avx512(const float *g, int64_t n);
/* The end of all three: adds the tail to lane[0..16) and sums the lanes pairwise. */
static inline double fx__sumsq_finish(double *lane, const float *tail, int64_t n)
{
    for (int64_t j = 0; j < n; j++)
        lane[j] += (double)tail[j] * tail[j];
    for (int w = 8; w >= 1; w /= 2)
        for (int j = 0; j < w; j++)
            lane[j] += lane[j + w];
    return lane[0];
}
/* The optimizer's element loops of one path: the scalar reference or its AVX2 / AVX-512 twins,
   one table a path, as RMSNorm's (fx__rms_ops). */
typedef struct fx__optim_ops {
    double (*sumsq)(const float *g, int64_t n);
    void (*adamw_f32)(float *p, float *g, float *m, float *v, int64_t n, const fx__adamw_k *k);
    void (*adamw_bf16)(float *p, float *g, uint16_t *m, uint16_t *v, int64_t n, const fx__adamw_k *k);
} fx__optim_ops;
const fx__optim_ops *fx__optim_ops_for(fx_isa isa); /* plain C on the scalar path */
/* Linear warmup to lr, then cosine down to min_lr at step `total`. step counts from 0. */
float fx__lr_schedule(int64_t step, int64_t warmup, int64_t total, float lr, float min_lr);

/* ---- layers (exposed for the tests) ------------------------------------------------------ */

/* out [N,C], rstd [N] <- inp [N,C], w [C] */
void fx__rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int64_t N, int64_t C, float eps);
/* The same, and copy [N,C] = inp (copy NULL: none) while each row is in cache: the residual
   stream that the next product accumulates onto. */
void fx__rmsnorm_forward_copy(float *out, float *rstd, float *copy, const float *inp, const float *w, int64_t N,
                              int64_t C, float eps);
/* dinp [N,C] (+=; overlaps neither dout nor inp), dw [C] (+=) <- dout [N,C], inp [N,C], w [C],
   rstd [N] */
void fx__rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                          const float *rstd, int64_t N, int64_t C);
/* The row loops of the two (no threads), chosen once per call: the plain C ones (layers.c)
   and their AVX-512 and AVX2 twins (rmsnorm_avx512.c, rmsnorm_avx2.c), which give the same
   bits (the same float64 lanes, the same roundings, nothing contracted into an FMA; the tests
   hold them to that). */
enum { FX__RMS_LANES = 8 };
typedef struct fx__rms_ops {
    double (*sumsq)(const float *x, int64_t C);                                   /* sum x^2, in lanes */
    double (*dot3)(const float *dy, const float *w, const float *x, int64_t C);   /* sum dy w x, in lanes */
    void (*scale)(float *y, const float *x, float r, const float *w, int64_t C); /* y = x r w */
    void (*dx)(float *dx, const float *dy, const float *w, const float *x, float r, float k,
               int64_t C);                                                     /* dx += r dy w - k x */
    void (*dw)(float *acc, const float *dy, const float *x, float r, int64_t n); /* acc += dy x r */
} fx__rms_ops;
extern const fx__rms_ops fx__rms_ops_avx512, fx__rms_ops_avx2;
const fx__rms_ops *fx__rms_ops_for(fx_isa isa); /* the twin of that path, plain C on the scalar one */
/* The 8 lanes added pairwise (lane j += lane j + w for w = 4, 2, 1); lane is overwritten. */
double fx__rms_lanes_sum(double *lane);
/* Rotates x [B,T,H,hd] (token-major, as a projection writes it; a token's row ldx floats
   after the previous one's, H*hd when x holds nothing else) by position t and writes it
   head-major to out [B,H,T,hd]. rope [ctx, hd/2, 2]. */
void fx__rope_forward(float *out, const float *x, int64_t ldx, const float *rope, int64_t B, int64_t T, int64_t H,
                      int64_t hd, int64_t pos0);
/* The transpose: dx [B,T,H,hd] (overwritten; rows ldx apart) <- dout [B,H,T,hd]. */
void fx__rope_backward(float *dx, int64_t ldx, const float *dout, const float *rope, int64_t B, int64_t T, int64_t H,
                       int64_t hd);
/* Plain transposes [B,T,H,hd] <-> [B,H,T,hd] (the V projection and the attention output), the
   token-major side's rows ld apart. */
void fx__to_heads(float *out, const float *x, int64_t ldx, int64_t B, int64_t T, int64_t H, int64_t hd);
void fx__from_heads(float *out, int64_t ldo, const float *x, int64_t B, int64_t T, int64_t H, int64_t hd);
/* Where a tensor's heads go: head h of sequence b starts at p + b * seq + h * head, its
   positions hd floats apart ([B,H,T,hd]: head = T hd, seq = H T hd; a KV cache of cap
   positions: head = cap hd, p at the first new position). */
typedef struct fx__heads {
    float *p;
    int64_t head, seq;
} fx__heads;
/* The three of one layer's q, k, v rows at once (one pass, one parallel region): the [B,T]
   rows of qkv (ld floats apart; q, k, v side by side, QD + 2 KD floats) to q's and k's heads
   rotated by position pos0 + t (pairs x[2i], x[2i+1]; with halves, x[i] and x[i + hd/2]) and
   v's heads as they are; and the gradients back into dqkv's rows (overwritten; pairs, from
   position 0, [B,H,T,hd]). The same bits as fx__rope_forward / fx__to_heads and their
   transposes. */
void fx__qkv_to_heads(fx__heads q, fx__heads k, fx__heads v, const float *qkv, int64_t ld, const float *rope,
                      bool halves, int64_t B, int64_t T, int64_t pos0, int64_t Hq, int64_t Hkv, int64_t hd);
void fx__qkv_from_heads(float *dqkv, const float *dq, const float *dk, const float *dv, const float *rope, int64_t B,
                        int64_t T, int64_t Hq, int64_t Hkv, int64_t hd);
/* The hd/2 frequencies of the config (plain theta, or llama3-scaled as transformers does). */
void fx__rope_freqs(double *freq, const fx_model_config *c);
/* Rows t0 .. t1-1 of the table: rope [t, i] = cos, sin of t * freq[i] (computed in double). */
void fx__rope_rows(float *rope, int64_t t0, int64_t t1, const double *freq, int64_t hd);
/* y [N,O] += b [O] on every row (rows ldy apart) */
void fx__bias_forward(float *y, int64_t ldy, const float *b, int64_t N, int64_t O);
/* db [O] (+=) <- dy [N,O] (rows ldy apart): the sum over rows, in row order. */
void fx__bias_backward(float *db, const float *dy, int64_t ldy, int64_t N, int64_t O);
/* out [rows, cols] (rows ldo apart) = silu(a) * b, a and b [rows, cols] with rows ld apart
   (the gate and up halves of one [N, 2F] product: b = a + F, ld = 2F). */
void fx__swiglu_forward(float *out, int64_t ldo, const float *a, const float *b, int64_t ld, int64_t rows,
                        int64_t cols);
/* da, db [rows, cols] (rows ld apart, overwritten; may be a and b themselves) <- dout (rows
   ldo apart) */
void fx__swiglu_backward(float *da, float *db, int64_t ld, const float *dout, int64_t ldo, const float *a,
                         const float *b, int64_t rows, int64_t cols);
/* The element loops of the two (no threads) on one path: the scalar reference or its vector
   twins (a polynomial exp, within a few ulp of expf), one table a path, as RMSNorm's. */
typedef struct fx__swiglu_ops {
    void (*forward)(float *out, const float *a, const float *b, int64_t n);
    void (*backward)(float *da, float *db, const float *dout, const float *a, const float *b, int64_t n);
} fx__swiglu_ops;
extern const fx__swiglu_ops fx__swiglu_ops_avx512, fx__swiglu_ops_avx2;
const fx__swiglu_ops *fx__swiglu_ops_for(fx_isa isa); /* plain C on the scalar path */
void fx__swiglu_forward_scalar(float *out, const float *a, const float *b, int64_t n);
void fx__swiglu_backward_scalar(float *da, float *db, const float *dout, const float *a, const float *b, int64_t n);
/* out [N,C] = wte[tokens] */
void fx__embed_forward(float *out, const int32_t *tokens, const float *wte, int64_t N, int64_t C);
/* dwte [V,C] (+=) <- dout [N,C]; fixed order over tokens. */
void fx__embed_backward(float *dwte, const float *dout, const int32_t *tokens, int64_t N, int64_t C);

/* The reference attention: same contract as fx_flex_attention(_backward) for the model's
   masks (mask_fn on absolute positions; NULL = all visible). */
typedef struct fx__attn_ref {
    int64_t B, Hq, Hkv, Lq, Lkv, D, q_offset;
    fx_mask_fn mask;
    const void *ctx;
} fx__attn_ref;
void fx__attn_ref_forward(const fx__attn_ref *a, const float *q, const float *k, const float *v, float *out, float *lse);
void fx__attn_ref_backward(const fx__attn_ref *a, const float *q, const float *k, const float *v,
                           const float *out, const float *lse, const float *dout, float *dq, float *dk, float *dv);


/* The unfused loss: logits [N,V] materialised in `logits`, row_loss [N] scratch. dh
   overwritten, dw accumulated; either may be NULL. Returns the mean loss over targets >= 0. */
float fx__loss_unfused(float *logits, float *row_loss, const float *h, const float *w, const int64_t *target,
                       int64_t N, int64_t D, int64_t V, float *dh, float *dw);

/* ---- decoding ---------------------------------------------------------------------------- */

/* The public fx_model_cache is this struct. */
typedef struct fx_model_cache fx__model_cache;
struct fx_model_cache {
    const fx__model *m; /* the model it was made for */
    int64_t len;      /* positions held */
    int64_t cap;      /* positions it can hold (<= ctx) */
    float *k, *v;     /* [L, Hkv, cap, hd] each */
    float *scratch;
    int64_t *doc;         /* [cap] document ids by position */
    fx__model_mask_ctx mctx;
    fx_block_mask *bmask; /* [cap, cap] over absolute positions, built when len == 0 */
    float *kvm;           /* with mods that read h: one layer's k and v gathered [2, Hkv, len, hd] */
};

/* A cache for max_len positions (0: the model's context); the model's RoPE table grows to
   max_len here. */
int fx__model_cache_create(fx__model_cache **out, fx__model *m, int64_t max_len);
/* The bytes fx__model_cache_create allocates for cap positions (the RoPE table aside). */
typedef struct fx__model_cache_bytes {
    size_t kv;      /* each of k and v */
    size_t doc;     /* the document ids */
    size_t scratch; /* a decoding call's rows, and the widening tile of bfloat16 weights */
} fx__model_cache_bytes;
fx__model_cache_bytes fx__model_cache_size(const fx__model *m, int64_t cap);
void fx__model_cache_free(fx__model_cache *c);
/* Feeds n tokens at positions len..len+n-1 (len+n <= cap) and writes the logits of the
   last one to logits [V]. Set len = 0 to start over. */
int fx__model_decode(fx__model *m, fx__model_cache *c, const int32_t *tokens, int64_t n, float *logits);

/* ---- data -------------------------------------------------------------------------------- */

typedef struct fx__model_data {
    uint32_t *tok;    /* all tokens; train = [0, n_train), val = [n_train, n) */
    uint8_t *loss;    /* [n] or NULL: loss[i] == 0 where token i, as a target, carries no loss (a
                         window's target is then -100); NULL: every token carries the loss */
    int64_t n, n_train;
    int64_t docs;
    uint64_t hash;    /* FNV-1a of the tokens, then of the loss mask when there is one: a resumed
                         run checks it reads the same data */
    bool chat;        /* conversations (chat JSONL) packed with the model's first eos id between
                         them: training defaults to the document mask */
    int64_t conversations; /* chat: how many; docs exceeds it when the eos id also ends turns
                              inside them (the document mask would then split a conversation) */
    char source[512]; /* what was read, for messages and checkpoints */
} fx__model_data;

/* Reads a UTF-8 text file (or every fortune file of the default corpus when path is NULL):
   bytes become tokens; a line holding only "%", or the text <|endoftext|>, ends a
   document (FX__MODEL_EOT). val_frac of the tokens (at least one window) go to validation. */
int fx__model_data_load(fx__model_data *d, const char *path, const char *default_dir, double val_frac,
                      int64_t min_tokens);
/* Token ids already made (a tokenizer's, or a token file's): documents end at eot (counted;
   -1: none), the same split. source names them in messages. */
int fx__model_data_from_ids(fx__model_data *d, const int32_t *ids, int64_t n, int32_t eot, const char *source,
                          double val_frac, int64_t min_tokens);
/* The same with a loss mask (copied; NULL: as fx__model_data_from_ids): loss[i] == 0 where token
   i carries no loss as a target. FX_EINVAL when either part holds no token that carries it. */
int fx__model_data_from_ids_loss(fx__model_data *d, const int32_t *ids, const uint8_t *loss, int64_t n, int32_t eot,
                                 const char *source, double val_frac, int64_t min_tokens);
void fx__model_data_free(fx__model_data *d);
/* B windows of T+1 tokens from the training part at offsets drawn from rng (targets -100 where
   the loss mask says the token carries no loss; the same below). */
void fx__model_data_batch(const fx__model_data *d, fx_rng *rng, int64_t B, int64_t T, int32_t *tokens, int32_t *targets);
/* Validation window i (sequential, wraps). */
void fx__model_data_val_batch(const fx__model_data *d, int64_t i, int64_t B, int64_t T, int32_t *tokens, int32_t *targets);
/* Index of the first byte that is not valid UTF-8, or -1. */
int64_t fx__utf8_invalid_at(const unsigned char *s, size_t n);

/* ---- checkpoints ------------------------------------------------------------------------- */

/* Training state besides the buffers. */
typedef struct fx__model_train_state {
    int64_t step;      /* optimizer steps done */
    int64_t data_pos;  /* training windows drawn */
    fx_rng rng;        /* the data sampler */
    char attn[32];     /* mask name ("mod": the mask mod) */
    char score_mod[FX__MOD_SRC_MAX], mask_mod[FX__MOD_SRC_MAX]; /* the mods' texts ("": none) */
    char data[4096];   /* the --data file, absolute ("" for the default corpus) */
    bool adam_bf16;    /* the checkpoint's Adam moments are bfloat16 */
    bool deterministic; /* trained with --deterministic (the sliced, fixed-order gradient sum) */
    bool bf16;         /* trained with --dtype bf16 (bfloat16 matrix products) */
    uint64_t data_hash;
    /* Hyper-parameters, kept so a resume continues the same schedule. */
    int64_t steps, warmup, batch, seq, accum;
    float lr, min_lr, weight_decay, clip, beta1, beta2;
    uint64_t seed;
} fx__model_train_state;

/* DIR/checkpoint.safetensors: parameters, Adam moments, state and config. Atomic. */
int fx__model_save_checkpoint(const fx__model *m, const fx__model_train_state *s, const char *path);
/* The weights alone, float32 or bfloat16, with the config in metadata. Atomic. */
int fx__model_save_model(const fx__model *m, const char *path, bool bf16);
/* Reads the config (and state, when s != NULL) of a checkpoint or model file. */
int fx__model_read_config(const char *path, fx_model_config *c, fx__model_train_state *s, bool *has_adam);
/* Loads a file's parameters (and Adam moments when the model has them and load_adam) into a
   model of the same config; every tensor is checked before anything is copied. */
int fx__model_load(fx__model *m, const char *path, bool load_adam);

/* ---- the training step ------------------------------------------------------------------- */

typedef struct fx__model_step_info {
    float loss;       /* mean over the micro-batches */
    float lr;
    float grad_norm;  /* before clipping */
    double time_s[3]; /* seconds in forward passes (with the loss and its gradient), backward
                         passes, and the gradient norm and optimizer */
} fx__model_step_info;

/* One optimizer step from state s: accum micro-batches of (batch, seq) drawn from d with
   s->rng, the gradient averaged, clipped to s->clip (0: off), AdamW at the scheduled lr.
   Advances s->step and s->data_pos. tokens, targets: [batch * seq] scratch. When the loss or
   the gradient norm is not finite the update is not applied: the weights, the optimizer state
   and s->step stay as they were (s->data_pos and s->rng have moved on), info says which. */
int fx__model_train_step(fx__model *m, const fx__model_data *d, fx__model_train_state *s, int32_t *tokens,
                       int32_t *targets, fx__model_step_info *info);
/* Mean loss over `batches` validation batches (no gradients). */
int fx__model_eval(fx__model *m, const fx__model_data *d, int64_t batches, int32_t *tokens, int32_t *targets,
                 float *loss);

/* ---- memory plans (api.c) ------------------------------------------------------------------ */

/* The bytes a training run takes at its peak, by part, sized by the functions that size the
   buffers (the layout, fx__model_acts_floats, fx__model_bf16_ws_floats, the loss's plan). */
typedef struct fx__model_mem {
    uint64_t params;  /* float32 weights, and their bfloat16 copy with bf16 */
    uint64_t grads;   /* gradients, the norm's partial sums, the deterministic sum's stack */
    uint64_t adam;    /* the two moments */
    uint64_t acts;    /* activations for (B, T), the batch's ids, the bf16 products' scratch */
    uint64_t scratch; /* the fused loss's chunk, the attention backward's row sums, RoPE */
    uint64_t data;    /* the training tokens (held) */
    uint64_t process; /* the rest of the process now: code, libraries, a tokenizer (held) */
    uint64_t held;    /* of the total, what the process holds already */
    uint64_t total;
} fx__model_mem;

typedef struct fx__model_mem_opts {
    int64_t B, T;     /* one process's micro-batch */
    bool adam_bf16, bf16, recompute;
    bool device;      /* the step runs on a GPU: activations and scratch are the device's */
    bool params_held; /* the weights are in memory already (a model read to fine-tune) */
    int64_t sum_slices; /* --deterministic: the sequences summed in a fixed order (0: none) */
    uint64_t data;    /* bytes of training tokens held */
} fx__model_mem_opts;

/* The plan of training a model of config c as o says; process is what this process holds
   now (/proc/self/statm) less the data and held weights. */
int fx__model_mem_train(fx__model_mem *mem, const fx_model_config *c, const fx__model_mem_opts *o);
/* "params 0.04 + grads 0.04 + ... + process 0.01", in the unit of the total (fx__mem_unit). */
void fx__model_mem_parts(char *buf, size_t n, const fx__model_mem *mem);
/* fx__mem_check of the plan: FX_ENOMEM, "training needs 22.61 GB of memory (params ... +
   process 0.01), and 21.30 GB is available (MemAvailable)", when it does not fit. */
int fx__model_mem_check(const fx__model_mem *mem, fx__mem_avail *avail);

#endif
