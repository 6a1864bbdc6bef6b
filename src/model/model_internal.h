/* What the model's source files (model.c, forward.c, backward.c, decode.c, optim.c) share:
   the activation buffer's views, the attention call, the per-layer views of the parameters
   and the hook points. Not used outside src/model/. */
#ifndef FX_MODEL_MODEL_INTERNAL_H
#define FX_MODEL_MODEL_INTERNAL_H

#include "core/gemm_bf16.h"
#include "model.h"
#include "model/lora.h"

#include <assert.h>

/* Gradient-norm partial sums: one per fixed chunk of the flat buffer. */
enum { FX__NORM_CHUNK = 1 << 14 };

/* The first tensor of layer l (l == layers: the final norm). */
static inline const fx__model_tensor *fx__layer_first(const fx__model *m, int64_t l)
{
    return &m->lay.t[1 + (size_t)l * m->lay.per_layer];
}

/* Whether m's weights are a mapped file's with no float32 parameters: the forward and backward
   passes then read them in the file's dtype (adapters train over them, the base frozen). */
static inline bool fx__model_on_map(const fx__model *m) { return m->mapped && !m->params; }

/* The mapped file's tensor i of the layout (fx__model_on_map). */
static inline fx__model_weight fx__map_t(const fx__model *m, size_t i) { return m->mapped->t[i]; }
/* ---- the activation buffer ------------------------------------------------------------- */

/* Views of the activation buffer for (B, T). Carved in a fixed order; `base` NULL only
   counts. */
typedef struct fx__acts {
    float *res;   /* [L+1, N, C] residual stream entering each layer, then the last */
    float *xn1;   /* [L, N, C] */
    float *rstd1; /* [L, N] */
    float *q;     /* [L, B, Hq, T, hd] after RoPE */
    float *k;     /* [L, B, Hkv, T, hd] after RoPE */
    float *v;     /* [L, B, Hkv, T, hd] */
    float *att;   /* [L, B, Hq, T, hd] attention output */
    float *lse;   /* [L, B, Hq, T] */
    float *resm;  /* [L, N, C] residual after attention */
    float *xn2;   /* [L, N, max(C, QD)]: [N, C] used, the rest holds d(att) in backward */
    float *rstd2; /* [L, N] */
    float *h13;   /* [L, N, 2F]: a token's gate (x W1^T) and up (x W3^T) side by side */
    float *xnf;   /* [N, C] */
    float *rstdf; /* [N] */
    /* Scratch (forward and backward): each use ends before the next begins; what would need
       a second buffer goes to saved activations that are dead by then. */
    float *work; /* [N * max(F, 2 (QD + 2 KD))] */
    float *dres, *dxn; /* [N, C]; dxn holds d(xnf) from forward to backward */
    float *logits; /* [N, V] unfused loss only */
    float *rowloss; /* [N] */
    size_t total;
} fx__acts;


/* Carves a (base NULL: only counts). With recompute, the per-layer activations have one
   slot (the layer being worked on) and only the residual stream is kept for every layer. */
void fx__acts_carve(fx__acts *a, float *base, const fx_model_config *c, int64_t B, int64_t T, bool unfused,
                    bool recompute);
/* Tokens per chunk of the fused loss over N rows and a vocabulary of V (forward.c): what its
   scratch is sized for. */
int64_t fx__loss_chunk(int64_t N, int64_t V);

/* ---- attention ---------------------------------------------------------------------------- */

typedef struct fx__attn_call {
    int64_t B, Hq, Hkv, Lq, Lkv, D, q_offset;
    const fx_block_mask *bm; /* flex: the block mask (NULL: dense with causal score_mod, or none) */
    bool dense_causal;       /* flex, no block mask: causality by score_mod */
    fx_mask_fn fn;           /* reference: the mask function */
    const void *ctx;
    const struct fx_mod *score; /* flex: the model's score mod, or NULL */
} fx__attn_call;

/* Through fx_flex_attention(_backward) or the reference, as m->attn_impl says. */
int fx__attn_fwd(const fx__model *m, const fx__attn_call *c, const float *q, const float *k, const float *v,
                 float *out, float *lse);
int fx__attn_bwd(const fx__model *m, const fx__attn_call *c, const float *q, const float *k, const float *v,
                 const float *out, const float *lse, const float *dout, float *dq, float *dk, float *dv);
/* The training-shape attention call; builds the block mask when the flex path needs one
   (the backward pass reuses the forward's). */
int fx__train_attn(fx__model *m, fx__attn_call *c, bool build);

/* ---- linear layers -------------------------------------------------------------------------- */

/* y [N,O] = x [N,I] W[O,I]^T (+ y when acc) */
static inline void fx__linear(float *y, const float *x, const float *w, int64_t N, int64_t I, int64_t O, bool acc)
{
    fx__sgemm(false, true, N, O, I, 1.0f, x, I, w, I, acc ? 1.0f : 0.0f, y, O);
}

/* dx [N,I] (= or +=) dy [N,O] W [O,I];  dW [O,I] += dy^T x */
static inline void fx__linear_backward(float *dx, float *dw, const float *dy, const float *x, const float *w,
                                       int64_t N, int64_t I, int64_t O, bool acc_dx)
{
    fx__sgemm(false, false, N, I, O, 1.0f, dy, O, w, I, acc_dx ? 1.0f : 0.0f, dx, I);
    fx__sgemm(true, false, O, I, N, 1.0f, dy, O, x, I, 1.0f, dw, I);
}

/* The model's matrix products: C [M,N] = op(A) op(B) + beta C, as fx__sgemm, or with
   bfloat16 inputs and float32 accumulation when training in bf16 (params16 set): an operand
   that is a parameter (a_w, b_w: a pointer into params) is read from its bfloat16 copy, the
   others (activations, gradients) are rounded to bfloat16 as the product reads them. */
static inline void fx__mm(const fx__model *m, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A,
                          bool a_w, int64_t lda, const float *B, bool b_w, int64_t ldb, float beta, float *C,
                          int64_t ldc)
{
    if (!m->params16) {
        fx__sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    assert(fx__gemm_bf16_ws(M, N, K) <= m->bf16_ws_floats); /* fx__model_bf16_ws_floats counts every product */
    fx__bf16_mat a = a_w ? fx__bf16_of(m->params16 + (A - m->params)) : fx__bf16_of_f32(A);
    fx__bf16_mat b = b_w ? fx__bf16_of(m->params16 + (B - m->params)) : fx__bf16_of_f32(B);
    fx__gemm_bf16(ta, tb, M, N, K, a, lda, b, ldb, beta, C, ldc, m->bf16_ws);
}

/* ---- a layer's parameters, and the hook points ------------------------------------------------ */

/* Layer l's first float (l == layers: the final norm) in the parameters or the gradients:
   in the flat buffer, or in the layer's own buffer when sharded training set one. */
static inline float *fx__layer_base(const fx__model *m, bool grads, int64_t l)
{
    float **own = grads ? m->hooks.layer_grads : m->hooks.layer_params;
    if (own)
        return own[l];
    return (grads ? m->grads : m->params) + fx__layer_first(m, l)->offset;
}

/* The final norm's weight as the passes read it (float32: the mapped file's vectors are widened). */
static inline const float *fx__final_norm_w(const fx__model *m)
{
    if (fx__model_on_map(m))
        return (const float *)fx__map_t(m, (size_t)(fx__layer_first(m, m->c.layers) - m->lay.t)).data;
    return fx__layer_base(m, false, m->c.layers);
}

static inline int fx__layer_hook(fx__model *m, int64_t l, bool backward)
{
    return m->hooks.layer ? m->hooks.layer((int)l, backward, m->hooks.user) : FX_OK;
}

/* Between the sub-operations of a layer: lets a multi-process trainer drive its collectives
   in flight (MPI moves them only inside its calls; each stage of a transfer waits for one). */
static inline void fx__progress_point(const fx__model *m)
{
    if (m->hooks.progress)
        m->hooks.progress(m->hooks.user);
}

static inline void fx__grad_hook(fx__model *m, int layer, float *grad, size_t numel)
{
    if (m->hooks.grad)
        m->hooks.grad(layer, grad, numel, m->hooks.user);
}

/* ---- a layer's saved activations ---------------------------------------------------------------- */

/* Layer l's saved activations: slot l, or slot 0 when they are recomputed. */
typedef struct fx__layer_acts {
    float *res, *xn1, *rstd1, *q, *k, *v, *att, *lse, *resm, *xn2, *rstd2, *h13, *out;
} fx__layer_acts;

/* The residual stream entering layer l (l == layers: the final norm's input): parked, or
   in the activation buffer; a forward pass without gradients keeps only two, in turn. */
float *fx__res_at(const fx__model *m, const fx__acts *a, int64_t l);
fx__layer_acts fx__layer_acts_at(const fx__model *m, const fx__acts *a, int64_t l);
/* Clears what is parked in layer l's gradient memory (layer l+1's activations and input,
   or the final norm's input when l is the last layer), before its gradients go there. */
void fx__park_clear(const fx__model *m, const fx__acts *a, int64_t l);
/* Layer l from its input res[l]; writes res[l+1] when write_out (a recomputation for the
   backward pass does not: the stream is already there, bit for bit). */
int fx__layer_forward(fx__model *m, const fx__acts *a, const fx__attn_call *call, int64_t l, bool write_out);

/* ---- one layer, for training and decoding (layer.c) ------------------------------------------ */

/* Where one layer's weights are and how they are multiplied: each tensor of the architecture
   table (arch.h) as its bytes and dtype, indexed by its row (data NULL where the config has
   no such tensor). */
typedef struct fx__layer_w {
    const fx__model *m;
    fx__model_weight t[FX__ARCH_LAYER_MAX];
    bool train;   /* the model's products (fx__mm: float32, or the weights' bfloat16 copy when
                     training in bf16); else fx__linear_dt (one row: fx__gemv; BF16, F16 widened) */
    bool halves;  /* q and k rotate halves (x[i] with x[i + hd/2]: a Hugging Face file as mapped) */
    float *tile;  /* fx__linear_dt's widening scratch (FX__WIDEN_TILE rows of the widest input) */
    bool bf16;    /* (not train) bfloat16 products over the mapped rows (fx__linear_bf16), scratch ws */
    float *ws;
    fx__lora *lora; /* the model's adapters (added to the products of the tensors they target;
                       the base is then frozen: no gradients for its weights), or NULL */
    int64_t l;      /* the layer */
} fx__layer_w;

/* Layer l's weights in the float32 parameters (flat, or the layer's own buffer), for training. */
fx__layer_w fx__layer_w_train(const fx__model *m, int64_t l);
/* Layer l's weights for decoding: where the mapped file holds them, or the parameters. */
fx__layer_w fx__layer_w_decode(const fx__model *m, int64_t l, float *tile);
/* The gradient of layer l's tensor `which` (a row of the layer's table, FX__MODEL_*), which
   the config has. */
float *fx__layer_grad(const fx__model *m, int64_t l, int which);

/* The rows a layer runs on: B sequences of T tokens at positions pos0 .. pos0 + T - 1. */
typedef struct fx__layer_rows {
    int64_t B, T, pos0;
} fx__layer_rows;

/* Where each step of a layer reads and writes; N = B T rows. */
typedef struct fx__layer_io {
    const float *in;      /* [N, C] the residual stream entering */
    float *mid;           /* in + the attention's output: a buffer of its own (in is copied), or in */
    float *out;           /* mid + the MLP's: a buffer of its own, or mid; NULL: stop after gate and up */
    float *xn1, *rstd1;   /* the attention's norm [N, C], [N] */
    float *xn2, *rstd2;   /* the MLP's */
    float *qkv;           /* [N, QD + 2 KD] the projections, side by side */
    fx__heads q, k, v;    /* where the rotated q, k and v go */
    float *att, *lse;     /* the attention's output [B, Hq, T, hd] and lse [B, Hq, T] (the callback's) */
    float *h13;           /* [N, 2F] gate and up */
    float *work;          /* [N, max(QD, F)] */
} fx__layer_io;

/* The attention of io's q, k, v into io->att (and io->lse): over the batch with its block
   mask (training), or over a KV cache the step has just written k and v into (decoding). */
typedef int (*fx__layer_attn_fn)(void *ctx, const fx__layer_io *io);

/* One layer forward; the attention by attn(ctx, io). */
int fx__layer_run(const fx__layer_w *W, const fx__layer_rows *r, const fx__layer_io *io, fx__layer_attn_fn attn,
                  void *ctx);

/* The tensors one product reads when they are one matrix (fx__layer_run's q, k, v; gate, up). */
typedef enum fx__group { FX__GROUP_QKV, FX__GROUP_GATE_UP } fx__group;
/* The backward of a group's product y = x W^T (+ the tensors' biases; dy's rows ldy apart):
   dx [N, I] = dy W (overwritten) and each tensor's gradient += dy^T x, as one product or one
   per tensor, and each bias's += dy's column sums (not for a frozen base). */
void fx__layer_group_backward(const fx__layer_w *W, int64_t l, fx__group g, float *dx, const float *dy, int64_t ldy,
                              const float *x, int64_t N, int64_t I);
/* The backward of one tensor's product y = x W^T (+ its bias; W->t[which], [O, I]; dy's rows
   ldy apart): the weight's gradient += dy^T x and the bias's += dy's column sums (not for a
   frozen base), the adapter's, and dx [N, I] = dy W (+ the adapter's d(x)); dx may be x (x is
   read before dx is written). */
void fx__layer_product_backward(const fx__layer_w *W, int which, float *dx, const float *dy, int64_t ldy,
                                const float *x, int64_t N, int64_t I, int64_t O);

#endif
