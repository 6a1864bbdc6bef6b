/* The GPT's training step on one CUDA device (model_gpu.h): the device copy of a model, its
   activation buffer, and forward, backward, gradient norm and AdamW written as calls of the
   layer kernels (train.h), the products (blas.h), the attention and the fused loss. The
   order of operations is the CPU model's (src/model/forward.c, backward.c, optim.c), so that
   the two can be compared tensor by tensor. Plain C; built in every configuration. */
#include "cuda/model_gpu.h"
#include "cuda/blas.h"
#include "cuda/cuda.h"
#include "cuda/train.h"

#include <math.h>
#include <string.h>

#if defined(FX_CUDA_EMU)
#include "cuda/emu.h" /* the emu tests' build of this file */
#elif defined(FLEXC_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

#ifdef FLEXC_HAVE_CUDA

/* The model's calls on the device (fx__model_device, model.h: the routes of their CPU twins). */
static void gpu_free(fx__model_gpu *g);
static int gpu_set_batch(fx__model *m, int64_t B, int64_t T);
static int gpu_forward(fx__model *m, const int32_t *tokens, const int32_t *targets, float *loss, bool grad);
static int gpu_backward(fx__model *m);
static int gpu_zero_grad(fx__model *m);
static int gpu_grad_norm(fx__model *m, double *norm);
static int gpu_adamw(fx__model *m, const fx__adamw *o, int64_t t);
static int gpu_sync(const fx__model *m);
/* fx__model_decode on the device (generation): the cache's keys and values live there, the
   block mask is the host cache's (built by fx__model_decode when len == 0) copied over, and
   the logits of the last token come back to logits [V]. Float32 throughout. */
static int gpu_decode(fx__model *m, fx__model_cache *kc, const int32_t *tokens, int64_t n, float *logits);

static const fx__model_device cuda_model = {
    .name = "cuda", .release = gpu_free, .set_batch = gpu_set_batch, .forward = gpu_forward,
    .backward = gpu_backward, .zero_grad = gpu_zero_grad, .grad_norm = gpu_grad_norm, .adamw = gpu_adamw,
    .sync = gpu_sync, .decode = gpu_decode};

/* ---- the device copy ------------------------------------------------------------------------ */

/* Consecutive tensors with the same weight decay: AdamW's launches. */
typedef struct gpu_run {
    size_t off, n;
    bool decay;
} gpu_run;

/* A layer's saved activations (A: float32, or bfloat16 under bf16). */
typedef struct gpu_layer {
    float *res;                /* [N, C] the residual stream entering the layer */
    void *xn1, *xn2;           /* [N, C] A: the norms' outputs (the products' inputs) */
    float *rstd1, *rstd2;      /* [N] */
    void *q, *k, *v, *att;     /* [B, H, T, hd] A */
    float *lse;                /* [B, Hq, T] */
    float *resm;               /* [N, C] after the attention */
    float *h13;                /* [N, 2F] gate and up */
} gpu_layer;

/* The activation buffer's views for (B, T): one device allocation. */
typedef struct gpu_acts {
    gpu_layer *layer;          /* [L] (host array of views) */
    float *res_out;            /* [N, C] the final norm's input */
    float *xnf, *rstdf;        /* [N, C], [N] */
    void *xnf16, *dxn16;       /* [N, C] bf16: the loss's input and its gradient */
    void *dw16;                /* [V, C] bf16: the head's gradient from the loss */
    float *qkv;                /* [N, QKV] the q, k, v product; later its gradient */
    void *work;                /* [N, max(F, QKV)] A: a product's input made on the way */
    float *dres, *dxn;         /* [N, C] */
    void *dres16;              /* [N, C] bf16: dres rounded for the products */
    float *wf;                 /* [N, max(F, QD)] a product's float32 output */
    float *dh13;               /* [N, 2F] */
    void *dh16;                /* [N, max(2F, QKV)] bf16: dh13 or dqkv rounded */
    void *datt, *dq, *dk, *dv; /* [B, H, T, hd] A */
    float *parts;              /* column sums' scratch */
    int32_t *tokens;           /* [N] */
    int64_t *targets;          /* [N] */
    int32_t *uniq, *ptr, *pos; /* the tokens grouped by id (embedding backward) */
    float *rope;               /* [T, hd/2, 2] */
    float *loss;               /* [1] */
} gpu_acts;

struct fx__model_gpu {
    int device; /* 1-based, as fx_attention.device */
    bool bf16;
    size_t P;
    float *params, *grads, *mom; /* [P], [P], [2P] (m then v); grads, mom NULL without training */
    uint16_t *params16;          /* [P] bf16 only */
    gpu_run *runs;
    size_t nruns;
    double *norm_parts, *norm_host;
    size_t nparts;

    int64_t B, T;
    void *acts_mem;
    gpu_acts a;
    /* Host scratch of a batch. */
    int32_t *h_count, *h_uniq, *h_ptr, *h_pos;
    int64_t *h_targets, *h_doc;
    int64_t U;
    fx_block_mask *bmask;
    fx__model_mask bmask_mask;
    int64_t bmask_window;
    bool grad_ready;

    /* Decoding: one allocation for the cache and the scratch of up to cap tokens. */
    void *dec_mem;
    const fx__model_cache *dec_for;
    int64_t dec_cap;
    float *dk, *dv;            /* [L, Hkv, cap, hd] */
    float *dx, *dxn, *drstd;   /* [cap, C], [cap, C], [cap] */
    float *dqkv, *dq, *dkn, *dvn, *datt, *dwork, *dh13, *dlogits, *drope; /* see decode_buffers */
    int32_t *dtok;
};

static int cu(cudaError_t e, const char *what)
{
    return e == cudaSuccess ? FX_OK : fx__cuda_status((int)e, what);
}

static int current(const fx__model_gpu *g)
{
    return cu(cudaSetDevice(g->device - 1), "selecting the training device");
}

/* The first float of tensor k of layer l (l == layers: the final norm, then lm_head). */
static size_t toff(const fx__model *m, int64_t l, int k)
{
    return m->lay.t[1 + (size_t)l * m->lay.per_layer + (size_t)k].offset;
}

static size_t head_off(const fx__model *m)
{
    return m->c.tied_embeddings ? 0 : toff(m, m->c.layers, 1);
}

/* A weight as the products read it: float32, or its bfloat16 copy. */
static const void *wt(const fx__model_gpu *g, size_t off)
{
    return g->bf16 ? (const void *)(g->params16 + off) : (const void *)(g->params + off);
}

/* C [M,N] = op(A) op(B) + beta C, A and B of the step's product type, float32 C. */
static int mm(const fx__model_gpu *g, int ta, int tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
              const void *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    const fx__cu_gemm p = {.m = M, .n = N, .k = K, .a = A, .b = B, .c = C, .lda = lda, .ldb = ldb, .ldc = ldc,
                           .ta = ta, .tb = tb, .ab_type = g->bf16 ? FX_DT_BF16 : FX_DT_F32, .c_type = FX_DT_F32,
                           .alpha = 1.0f, .beta = beta};
    return fx__cu_gemm_run(&p);
}

/* x rounded for a product under bf16 (into scratch), or x itself; nothing after an error. */
static const void *as_a(const fx__model_gpu *g, void *scratch, const float *x, int64_t n, int *rc)
{
    if (!g->bf16 || *rc != FX_OK)
        return x;
    *rc = fx__cu_round_bf16(scratch, 1, x, n);
    return scratch;
}

static void buffers_free(fx__model_gpu *g)
{
    if (g->acts_mem)
        (void)cudaFree(g->acts_mem);
    g->acts_mem = NULL;
    fx__free(g->a.layer);
    fx__free(g->h_count), fx__free(g->h_uniq), fx__free(g->h_ptr), fx__free(g->h_pos);
    fx__free(g->h_targets), fx__free(g->h_doc);
    g->a = (gpu_acts){0};
    g->h_count = g->h_uniq = g->h_ptr = g->h_pos = NULL;
    g->h_targets = g->h_doc = NULL;
    fx_block_mask_free(g->bmask);
    g->bmask = NULL;
    g->B = g->T = 0;
    g->grad_ready = false;
}

static void gpu_free(fx__model_gpu *g)
{
    if (!g)
        return;
    int prev = 0;
    bool switched = cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(g->device - 1) == cudaSuccess;
    buffers_free(g);
    void *dev[] = {g->params, g->grads, g->mom, g->params16, g->norm_parts, g->dec_mem};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i])
            (void)cudaFree(dev[i]);
    if (switched)
        (void)cudaSetDevice(prev);
    (void)cudaGetLastError();
    fx__free(g->runs);
    fx__free(g->norm_host);
    fx__free(g);
}

static int dalloc(void **p, size_t bytes, const char *what)
{
    return cu(cudaMalloc(p, bytes ? bytes : 4), what);
}

/* AdamW's runs: tensors merged while their decay agrees. */
static int make_runs(fx__model_gpu *g, const fx__model_layout *lay)
{
    if (!(g->runs = fx__calloc(lay->n, sizeof *g->runs)))
        return FX_ENOMEM;
    for (size_t i = 0; i < lay->n; i++) {
        const fx__model_tensor *t = &lay->t[i];
        gpu_run *last = g->nruns ? &g->runs[g->nruns - 1] : NULL;
        if (last && last->decay == t->decay && last->off + last->n == t->offset)
            last->n += t->numel;
        else
            g->runs[g->nruns++] = (gpu_run){t->offset, t->numel, t->decay};
    }
    return FX_OK;
}

static int attach_check(const fx__model *m, int device)
{
    if (device < 1)
        return fx__error(FX_EINVAL, "device = %d must be >= 1 (CUDA device device - 1)", device);
    if (fx_cuda_device_count() < 1)
        return fx__error(FX_EUNSUPPORTED, "no CUDA device is visible (no GPU, or no driver)");
    if (device > fx_cuda_device_count())
        return fx__error(FX_EINVAL, "device = %d, but %d CUDA device(s) are visible", device, fx_cuda_device_count());
    if (!m->params)
        return fx__error(FX_EINVAL, "the model has no float32 parameters (fx__model_own_params first)");
    if (m->adam16)
        return fx__error(FX_EUNSUPPORTED, "training on a GPU keeps the Adam moments in float32 (not --adam-bf16)");
    if (m->recompute)
        return fx__error(FX_EUNSUPPORTED, "training on a GPU keeps every activation (not --recompute)");
    if (m->hooks.layer_params || m->hooks.layer || m->hooks.grad)
        return fx__error(FX_EUNSUPPORTED, "training on a GPU runs one process (not --parallel or --deterministic)");
    if (m->c.head_dim > FX__CU_DMAX)
        return fx__error(FX_EUNSUPPORTED, "head_dim = %lld: the CUDA attention takes head sizes up to %d",
                         (long long)m->c.head_dim, FX__CU_DMAX);
    /* The GPU step adds the q/k/v biases only: a model with another bias (a row of the
       architecture table that is the bias of a product) is refused rather than run without it. */
    for (size_t k = 0; k < fx__arch_nlayer; k++) {
        const fx__arch_tensor *t = &fx__arch_layer[k];
        if (t->bias_of >= 0 && (k < FX__MODEL_BQ || k > FX__MODEL_BV) && fx__arch_has(t, &m->c))
            return fx__error(FX_EUNSUPPORTED, "the GPU step does not add the bias %s", t->name);
    }
    return FX_OK;
}

int fx__model_gpu_attach(fx__model *m, int device, bool bf16)
{
    if (!m)
        return fx__error(FX_EINVAL, "fx__model_gpu_attach: m is NULL");
    int rc = attach_check(m, device);
    if (rc != FX_OK)
        return rc;
    fx__model_gpu *g = fx__calloc(1, sizeof *g);
    if (!g)
        return FX_ENOMEM;
    g->device = device, g->bf16 = bf16, g->P = m->lay.total;
    const size_t P = g->P;
    g->nparts = (P + FX__CU_SUMSQ_CHUNK - 1) / FX__CU_SUMSQ_CHUNK;
    const bool train = m->grads != NULL;
    if ((rc = current(g)) != FX_OK || (rc = make_runs(g, &m->lay)) != FX_OK)
        goto fail;
    if (!(g->norm_host = fx__alloc(g->nparts * sizeof(double)))) {
        rc = FX_ENOMEM;
        goto fail;
    }
    if ((rc = dalloc((void **)&g->params, P * sizeof(float), "the weights")) != FX_OK ||
        (bf16 && (rc = dalloc((void **)&g->params16, P * sizeof(uint16_t), "the bfloat16 weights")) != FX_OK))
        goto fail;
    if (train && ((rc = dalloc((void **)&g->grads, P * sizeof(float), "the gradients")) != FX_OK ||
                  (rc = dalloc((void **)&g->mom, 2 * P * sizeof(float), "the Adam moments")) != FX_OK ||
                  (rc = dalloc((void **)&g->norm_parts, g->nparts * sizeof(double), "the norm's sums")) != FX_OK ||
                  (rc = cu(cudaMemset(g->grads, 0, P * sizeof(float)), "clearing the gradients")) != FX_OK ||
                  (rc = cu(cudaMemset(g->mom, 0, 2 * P * sizeof(float)), "clearing the moments")) != FX_OK))
        goto fail;
    gpu_free(m->gpu);
    m->gpu = g;
    m->device = &cuda_model;
    if ((rc = fx__model_gpu_upload(m)) != FX_OK) {
        m->gpu = NULL;
        m->device = NULL;
        goto fail;
    }
    m->grads_zero = train;
    return FX_OK;
fail:
    gpu_free(g);
    return rc;
}

int fx__model_gpu_upload(fx__model *m)
{
    fx__model_gpu *g = m->gpu;
    const size_t P = g->P;
    int rc = current(g);
    if (rc == FX_OK)
        rc = cu(cudaMemcpy(g->params, m->params, P * sizeof(float), cudaMemcpyHostToDevice), "uploading the weights");
    if (rc == FX_OK && g->mom && m->adam)
        rc = cu(cudaMemcpy(g->mom, m->adam, 2 * P * sizeof(float), cudaMemcpyHostToDevice), "uploading the moments");
    if (rc == FX_OK && g->params16)
        rc = fx__cu_round_bf16(g->params16, 1, g->params, (int64_t)P);
    return rc == FX_OK ? gpu_sync(m) : rc;
}

int fx__model_gpu_download(fx__model *m)
{
    fx__model_gpu *g = m->gpu;
    const size_t P = g->P;
    int rc = current(g);
    if (rc == FX_OK)
        rc = cu(cudaMemcpy(m->params, g->params, P * sizeof(float), cudaMemcpyDeviceToHost), "reading the weights");
    if (rc == FX_OK && g->mom && m->adam)
        rc = cu(cudaMemcpy(m->adam, g->mom, 2 * P * sizeof(float), cudaMemcpyDeviceToHost), "reading the moments");
    if (rc == FX_OK && m->params16)
        fx__model_bf16_sync(m);
    return rc;
}

int fx__model_gpu_grads(const fx__model *m, float *grads)
{
    const fx__model_gpu *g = m->gpu;
    if (!g->grads)
        return fx__error(FX_EINVAL, "the device copy has no gradients");
    int rc = current(g);
    return rc ? rc : cu(cudaMemcpy(grads, g->grads, g->P * sizeof(float), cudaMemcpyDeviceToHost), "reading the gradients");
}

static int gpu_sync(const fx__model *m)
{
    int rc = current(m->gpu);
    return rc ? rc : cu(cudaStreamSynchronize(NULL), "the training step");
}

/* ---- the batch's buffers -------------------------------------------------------------------- */

/* Carves (base NULL: counts) the activation buffer; returns its bytes. */
static size_t acts_carve(gpu_acts *a, char *base, const fx__model *m, bool bf16, int64_t B, int64_t T)
{
    const fx_model_config *c = &m->c;
    const size_t N = (size_t)(B * T), C = (size_t)c->dim, F = (size_t)c->ffn, L = (size_t)c->layers;
    const size_t hd = (size_t)c->head_dim, QD = (size_t)c->heads * hd, KD = (size_t)c->kv_heads * hd;
    const size_t QKV = QD + 2 * KD, V = (size_t)c->vocab, e = bf16 ? 2 : 4, f = sizeof(float);
    const size_t wide = F > QKV ? F : QKV, cs = C > QKV ? C : QKV, F2 = 2 * F > QKV ? 2 * F : QKV;
    const size_t nch = (N + FX__CU_COLSUM_ROWS - 1) / FX__CU_COLSUM_ROWS;
    size_t off = 0;
#define CARVE(ptr, bytes) ((ptr) = (void *)(base ? base + off : NULL), off += ((bytes) + 255) / 256 * 256)
    for (size_t l = 0; l < L; l++) {
        gpu_layer x, *y = a->layer ? &a->layer[l] : &x;
        CARVE(y->res, N * C * f);
        CARVE(y->xn1, N * C * e);
        CARVE(y->xn2, N * C * e);
        CARVE(y->rstd1, N * f);
        CARVE(y->rstd2, N * f);
        CARVE(y->q, N * QD * e);
        CARVE(y->k, N * KD * e);
        CARVE(y->v, N * KD * e);
        CARVE(y->att, N * QD * e);
        CARVE(y->lse, N * (size_t)c->heads * f);
        CARVE(y->resm, N * C * f);
        CARVE(y->h13, N * 2 * F * f);
    }
    CARVE(a->res_out, N * C * f);
    CARVE(a->xnf, N * C * f);
    CARVE(a->rstdf, N * f);
    if (bf16) {
        CARVE(a->xnf16, N * C * e);
        CARVE(a->dxn16, N * C * e);
        CARVE(a->dw16, V * C * e);
        CARVE(a->dres16, N * C * e);
        CARVE(a->dh16, N * F2 * e);
    }
    CARVE(a->qkv, N * QKV * f);
    CARVE(a->work, N * wide * e);
    CARVE(a->dres, N * C * f);
    CARVE(a->dxn, N * C * f);
    CARVE(a->wf, N * (F > QD ? F : QD) * f);
    CARVE(a->dh13, N * 2 * F * f);
    CARVE(a->datt, N * QD * e);
    CARVE(a->dq, N * QD * e);
    CARVE(a->dk, N * KD * e);
    CARVE(a->dv, N * KD * e);
    CARVE(a->parts, nch * cs * f);
    CARVE(a->tokens, N * sizeof(int32_t));
    CARVE(a->targets, N * sizeof(int64_t));
    CARVE(a->uniq, N * sizeof(int32_t));
    CARVE(a->ptr, (N + 1) * sizeof(int32_t));
    CARVE(a->pos, N * sizeof(int32_t));
    CARVE(a->rope, (size_t)T * hd * f);
    CARVE(a->loss, f);
#undef CARVE
    return off;
}

static int gpu_set_batch(fx__model *m, int64_t B, int64_t T)
{
    fx__model_gpu *g = m->gpu;
    if (B < 1 || B > (1 << 20))
        return fx__error(FX_EINVAL, "batch = %lld is outside [1, 1048576]", (long long)B);
    if (T < 1 || T > m->c.ctx)
        return fx__error(FX_EINVAL, "sequence length %lld is outside [1, %lld] (the model's context)", (long long)T,
                         (long long)m->c.ctx);
    if (g->acts_mem && g->B == B && g->T == T)
        return FX_OK;
    int rc = current(g);
    if (rc == FX_OK)
        rc = fx__model_rope_ensure(m, T);
    if (rc != FX_OK)
        return rc;
    buffers_free(g);
    const size_t N = (size_t)(B * T), bytes = acts_carve(&g->a, NULL, m, g->bf16, B, T);
    g->a.layer = fx__calloc((size_t)m->c.layers, sizeof(gpu_layer));
    g->h_count = fx__calloc((size_t)m->c.vocab, sizeof(int32_t));
    g->h_uniq = fx__alloc(N * sizeof(int32_t)), g->h_ptr = fx__alloc((N + 1) * sizeof(int32_t));
    g->h_pos = fx__alloc(N * sizeof(int32_t));
    g->h_targets = fx__alloc(N * sizeof(int64_t)), g->h_doc = fx__alloc(N * sizeof(int64_t));
    if (!g->a.layer || !g->h_count || !g->h_uniq || !g->h_ptr || !g->h_pos || !g->h_targets || !g->h_doc) {
        buffers_free(g);
        return FX_ENOMEM;
    }
    if ((rc = dalloc(&g->acts_mem, bytes, "the activations")) != FX_OK) {
        buffers_free(g);
        return fx__error_context(rc, "a batch of %lld x %lld tokens (%.1f GiB of activations)", (long long)B,
                                 (long long)T, (double)bytes / (1 << 30));
    }
    acts_carve(&g->a, g->acts_mem, m, g->bf16, B, T);
    rc = cu(cudaMemcpy(g->a.rope, m->rope, (size_t)(T * m->c.head_dim) * sizeof(float), cudaMemcpyHostToDevice),
            "uploading the RoPE table");
    if (rc != FX_OK) {
        buffers_free(g);
        return rc;
    }
    g->B = B, g->T = T;
    m->B = B, m->T = T;
    return FX_OK;
}

/* ---- forward -------------------------------------------------------------------------------- */

/* The batch checked and uploaded: tokens, targets (int64, -100 ignored), document ids on the
   host (the mask), and with grad the tokens grouped by id for the embedding's backward. */
static int forward_inputs(fx__model *m, const int32_t *tokens, const int32_t *targets, bool grad)
{
    fx__model_gpu *g = m->gpu;
    const int64_t B = g->B, T = g->T, N = B * T, V = m->c.vocab;
    for (int64_t i = 0; i < N; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return fx__error(FX_ERANGE, "token[%lld] = %d is outside [0, %lld)", (long long)i, tokens[i], (long long)V);
        if (targets && targets[i] != -100 && (targets[i] < 0 || targets[i] >= V))
            return fx__error(FX_ERANGE, "target[%lld] = %d is outside [0, %lld)", (long long)i, targets[i],
                             (long long)V);
        g->h_targets[i] = targets ? targets[i] : -100;
    }
    const int32_t sep = m->c.n_eos ? m->c.eos[0] : -1;
    for (int64_t b = 0; b < B; b++) {
        int64_t d = 0;
        for (int64_t t = 0; t < T; t++) {
            g->h_doc[b * T + t] = d;
            d += tokens[b * T + t] == sep;
        }
    }
    int rc = cu(cudaMemcpy(g->a.tokens, tokens, (size_t)N * sizeof(int32_t), cudaMemcpyHostToDevice), "tokens");
    if (rc == FX_OK)
        rc = cu(cudaMemcpy(g->a.targets, g->h_targets, (size_t)N * sizeof(int64_t), cudaMemcpyHostToDevice),
                "targets");
    if (rc != FX_OK || !grad)
        return rc;
    /* A counting sort by id: ids ascending, each id's positions ascending. */
    g->U = 0;
    for (int64_t i = 0; i < N; i++)
        g->h_count[tokens[i]]++;
    int32_t at = 0;
    for (int64_t v = 0; v < V; v++)
        if (g->h_count[v]) {
            g->h_uniq[g->U] = (int32_t)v;
            g->h_ptr[g->U++] = at;
            at += g->h_count[v];
            g->h_count[v] = at - g->h_count[v]; /* the id's next free slot */
        }
    g->h_ptr[g->U] = at;
    for (int64_t i = 0; i < N; i++)
        g->h_pos[g->h_count[tokens[i]]++] = (int32_t)i;
    for (int64_t u = 0; u < g->U; u++)
        g->h_count[g->h_uniq[u]] = 0;
    const struct { void *dst; const void *src; size_t n; } up[] = {
        {g->a.uniq, g->h_uniq, (size_t)g->U}, {g->a.ptr, g->h_ptr, (size_t)g->U + 1}, {g->a.pos, g->h_pos, (size_t)N}};
    for (size_t i = 0; rc == FX_OK && i < 3; i++)
        rc = cu(cudaMemcpy(up[i].dst, up[i].src, up[i].n * sizeof(int32_t), cudaMemcpyHostToDevice), "token groups");
    return rc;
}

/* The block mask of the batch, built on the host and copied to the device: once per shape,
   or per batch for document masks (as fx__train_attn). */
static int forward_mask(fx__model *m)
{
    fx__model_gpu *g = m->gpu;
    if (m->mask == FX__MODEL_MASK_CAUSAL_DENSE)
        return fx__error(FX_EUNSUPPORTED, "the dense-causal baseline (--attn dense) runs on the CPU only "
                                          "(its causality is a C score modifier); use --attn causal");
    const bool doc = m->mask == FX__MODEL_MASK_DOCUMENT;
    if (g->bmask && !doc && g->bmask_mask == m->mask && g->bmask_window == m->window)
        return FX_OK;
    fx_block_mask_free(g->bmask);
    g->bmask = NULL;
    fx__model_mask_ctx mc = {.sliding = {.window = m->window},
                           .document = {.doc_ids = g->h_doc, .len = g->T, .batch_stride = g->T}};
    const void *ctx;
    fx_mask_fn fn = fx__model_mask_fn(m->mask, &mc, &ctx);
    int rc = fx_block_mask_create(&g->bmask, fn, ctx, doc ? g->B : 1, 1, g->T, g->T, 0, 0);
    if (rc == FX_OK)
        rc = fx_block_mask_to_device(g->bmask, g->device);
    if (rc != FX_OK)
        return fx__error_context(rc, "attention mask");
    g->bmask_mask = m->mask, g->bmask_window = m->window;
    return FX_OK;
}

static fx_attention attn_desc(const fx__model *m)
{
    const fx__model_gpu *g = m->gpu;
    return (fx_attention){.B = g->B, .Hq = m->c.heads, .Hkv = m->c.kv_heads, .Lq = g->T, .Lkv = g->T,
                          .D = m->c.head_dim, .Dv = m->c.head_dim, .mask = g->bmask, .device = g->device,
                          .dtype = g->bf16 ? FX_DT_BF16 : FX_DT_F32};
}

/* Layer l: from x->res to the next layer's input `out`. */
static int layer_forward(fx__model *m, int64_t l, float *out)
{
    const fx__model_gpu *g = m->gpu;
    const gpu_acts *a = &g->a;
    const gpu_layer *x = &a->layer[l];
    const fx_model_config *c = &m->c;
    const int64_t B = g->B, T = g->T, N = B * T, C = c->dim, F = c->ffn, Hq = c->heads, Hkv = c->kv_heads;
    const int64_t hd = c->head_dim, QD = Hq * hd, QKV = QD + 2 * Hkv * hd;
    const float eps = c->norm_eps;
    int rc = fx__cu_rmsnorm_forward(x->xn1, g->bf16, x->rstd1, x->res, g->params + toff(m, l, FX__MODEL_LN1), N, C, eps);
    /* q, k and v in one product: wq, wk, wv (and their biases) are adjacent, as on the CPU. */
    if (rc == FX_OK)
        rc = mm(g, 0, 1, N, QKV, C, x->xn1, C, wt(g, toff(m, l, FX__MODEL_WQ)), C, 0.0f, a->qkv, QKV);
    if (rc == FX_OK && c->qkv_bias)
        rc = fx__cu_bias_forward(a->qkv, g->params + toff(m, l, FX__MODEL_BQ), N, QKV);
    if (rc == FX_OK)
        rc = fx__cu_qkv_to_heads(x->q, x->k, x->v, g->bf16, a->qkv, a->rope, B, T, Hq, Hkv, hd);
    if (rc == FX_OK) {
        fx_attention at = attn_desc(m);
        if ((rc = fx_flex_attention(&at, x->q, x->k, x->v, x->att, x->lse)) != FX_OK)
            return fx__error_context(rc, "layer %lld attention", (long long)l);
    }
    if (rc == FX_OK)
        rc = fx__cu_from_heads(a->work, QD, x->att, g->bf16, B, T, Hq, hd);
    if (rc == FX_OK)
        rc = cu(cudaMemcpyAsync(x->resm, x->res, (size_t)(N * C) * sizeof(float), cudaMemcpyDeviceToDevice, NULL),
                "residual");
    if (rc == FX_OK)
        rc = mm(g, 0, 1, N, C, QD, a->work, QD, wt(g, toff(m, l, FX__MODEL_WO)), QD, 1.0f, x->resm, C);
    if (rc == FX_OK)
        rc = fx__cu_rmsnorm_forward(x->xn2, g->bf16, x->rstd2, x->resm, g->params + toff(m, l, FX__MODEL_LN2), N, C, eps);
    /* gate and up in one product: w1 and w3 are adjacent. */
    if (rc == FX_OK)
        rc = mm(g, 0, 1, N, 2 * F, C, x->xn2, C, wt(g, toff(m, l, FX__MODEL_W1)), C, 0.0f, x->h13, 2 * F);
    if (rc == FX_OK)
        rc = fx__cu_swiglu_forward(a->work, g->bf16, x->h13, N, F);
    if (rc == FX_OK)
        rc = cu(cudaMemcpyAsync(out, x->resm, (size_t)(N * C) * sizeof(float), cudaMemcpyDeviceToDevice, NULL),
                "residual");
    if (rc == FX_OK)
        rc = mm(g, 0, 1, N, C, F, a->work, F, wt(g, toff(m, l, FX__MODEL_W2)), F, 1.0f, out, C);
    return rc;
}

/* The largest logits chunk (bytes) the bf16 loss takes in one piece. */
enum { LOSS_ONE_CHUNK = 1 << 30 };

/* The loss of xnf against the targets; with grad, d(xnf) into dxn (overwritten) and the
   head's gradient accumulated. Under bf16 the loss takes its bfloat16 route: xnf rounded and
   the head's bfloat16 copy in (the CPU's bf16 step reads the same values), the logits'
   gradient rounded to bfloat16 for the two products out (as on the CPU), and d(xnf) and the
   head's gradient come back as bfloat16, widened into the float32 buffers. The head's
   gradient is rounded once: the tokens go in one chunk when their logits fit in 1 GiB
   (bfloat16 gradients add up in their own type from chunk to chunk). */
static int forward_loss(fx__model *m, bool grad, float *loss)
{
    const fx__model_gpu *g = m->gpu;
    const gpu_acts *a = &g->a;
    const int64_t N = g->B * g->T, C = m->c.dim, V = m->c.vocab;
    fx_lce p = {.N = N, .D = C, .V = V, .ignore_index = -100, .reduction = FX_REDUCTION_MEAN, .device = g->device};
    int rc;
    if (!g->bf16) {
        rc = fx_linear_cross_entropy(&p, a->xnf, g->params + head_off(m), NULL, a->targets, a->loss, NULL,
                                     grad ? a->dxn : NULL, grad ? g->grads + head_off(m) : NULL, NULL);
    } else {
        p.dtype = FX_DT_BF16;
        p.chunk = N * V * (int64_t)sizeof(float) <= LOSS_ONE_CHUNK ? N : 0;
        rc = fx__cu_round_bf16(a->xnf16, 1, a->xnf, N * C);
        if (rc == FX_OK && grad)
            rc = cu(cudaMemsetAsync(a->dw16, 0, (size_t)(V * C) * sizeof(uint16_t), NULL), "clearing the head's gradient");
        if (rc == FX_OK)
            rc = fx_linear_cross_entropy(&p, a->xnf16, (const float *)(g->params16 + head_off(m)), NULL, a->targets,
                                         a->loss, NULL, grad ? a->dxn16 : NULL, grad ? a->dw16 : NULL, NULL);
        if (rc == FX_OK && grad && (rc = fx__cu_widen_bf16(a->dxn, 0, a->dxn16, N * C)) == FX_OK)
            rc = fx__cu_widen_bf16(g->grads + head_off(m), 1, a->dw16, V * C);
    }
    if (rc != FX_OK)
        return fx__error_context(rc, "loss");
    return cu(cudaMemcpy(loss, a->loss, sizeof(float), cudaMemcpyDeviceToHost), "reading the loss");
}

static int gpu_forward(fx__model *m, const int32_t *tokens, const int32_t *targets, float *loss, bool grad)
{
    fx__model_gpu *g = m->gpu;
    if (!g->acts_mem || !tokens)
        return fx__error(FX_EINVAL, "fx__model_forward: no tokens or batch shape (fx__model_set_batch)");
    if (grad && (!g->grads || !targets))
        return fx__error(FX_EINVAL, "fx__model_forward: gradients need targets and fx__model_alloc_train");
    if (m->loss_impl == FX__MODEL_LOSS_UNFUSED)
        return fx__error(FX_EUNSUPPORTED, "the unfused loss runs on the CPU only");
    g->grad_ready = false;
    int rc = current(g);
    if (rc == FX_OK)
        rc = forward_inputs(m, tokens, targets, grad);
    if (rc == FX_OK)
        rc = forward_mask(m);
    const fx_model_config *c = &m->c;
    const int64_t N = g->B * g->T, C = c->dim, L = c->layers;
    const gpu_acts *a = &g->a;
    if (rc == FX_OK)
        rc = fx__cu_embed_forward(a->layer[0].res, a->tokens, g->params, N, C);
    for (int64_t l = 0; rc == FX_OK && l < L; l++)
        rc = layer_forward(m, l, l + 1 < L ? a->layer[l + 1].res : a->res_out);
    if (rc == FX_OK)
        rc = fx__cu_rmsnorm_forward(a->xnf, 0, a->rstdf, a->res_out, g->params + toff(m, L, 0), N, C, c->norm_eps);
    if (rc != FX_OK || !targets)
        return rc;
    float l_out;
    if ((rc = forward_loss(m, grad, &l_out)) != FX_OK)
        return rc;
    g->grad_ready = grad;
    if (grad)
        m->grads_zero = false;
    if (loss)
        *loss = l_out;
    return FX_OK;
}

/* ---- backward ------------------------------------------------------------------------------- */

/* Layer l's gradients, dres holding d(out) on entry and d(res) on return. */
static int layer_backward(fx__model *m, int64_t l)
{
    const fx__model_gpu *g = m->gpu;
    const gpu_acts *a = &g->a;
    const gpu_layer *x = &a->layer[l];
    const fx_model_config *c = &m->c;
    const int64_t B = g->B, T = g->T, N = B * T, C = c->dim, F = c->ffn, Hq = c->heads, Hkv = c->kv_heads;
    const int64_t hd = c->head_dim, QD = Hq * hd, KD = Hkv * hd, QKV = QD + 2 * KD;
    float *gr = g->grads;
    /* MLP: out = resm + swiglu(gate, up) W2^T. */
    int rc = fx__cu_swiglu_forward(a->work, g->bf16, x->h13, N, F);
    const void *dres = as_a(g, a->dres16, a->dres, N * C, &rc);
    if (rc == FX_OK)
        rc = mm(g, 1, 0, C, F, N, dres, C, a->work, F, 1.0f, gr + toff(m, l, FX__MODEL_W2), F);
    if (rc == FX_OK)
        rc = mm(g, 0, 0, N, F, C, dres, C, wt(g, toff(m, l, FX__MODEL_W2)), F, 0.0f, a->wf, F);
    if (rc == FX_OK)
        rc = fx__cu_swiglu_backward(a->dh13, a->wf, x->h13, N, F);
    const void *dh13 = as_a(g, a->dh16, a->dh13, N * 2 * F, &rc);
    if (rc == FX_OK)
        rc = mm(g, 0, 0, N, C, 2 * F, dh13, 2 * F, wt(g, toff(m, l, FX__MODEL_W1)), C, 0.0f, a->dxn, C);
    if (rc == FX_OK)
        rc = mm(g, 1, 0, 2 * F, C, N, dh13, 2 * F, x->xn2, C, 1.0f, gr + toff(m, l, FX__MODEL_W1), C);
    if (rc == FX_OK)
        rc = fx__cu_rmsnorm_backward(a->dres, gr + toff(m, l, FX__MODEL_LN2), a->parts, a->dxn, x->resm,
                                     g->params + toff(m, l, FX__MODEL_LN2), x->rstd2, N, C);
    /* Attention: resm = res + from_heads(att) Wo^T. */
    if (rc == FX_OK)
        rc = fx__cu_from_heads(a->work, QD, x->att, g->bf16, B, T, Hq, hd);
    dres = as_a(g, a->dres16, a->dres, N * C, &rc);
    if (rc == FX_OK)
        rc = mm(g, 1, 0, C, QD, N, dres, C, a->work, QD, 1.0f, gr + toff(m, l, FX__MODEL_WO), QD);
    if (rc == FX_OK)
        rc = mm(g, 0, 0, N, QD, C, dres, C, wt(g, toff(m, l, FX__MODEL_WO)), QD, 0.0f, a->wf, QD);
    if (rc == FX_OK)
        rc = fx__cu_to_heads(a->datt, g->bf16, a->wf, QD, B, T, Hq, hd);
    if (rc == FX_OK) {
        fx_attention at = attn_desc(m);
        rc = fx_flex_attention_backward(&at, x->q, x->k, x->v, x->att, x->lse, a->datt, a->dq, a->dk, a->dv);
        if (rc != FX_OK)
            return fx__error_context(rc, "layer %lld attention backward", (long long)l);
    }
    /* The one q, k, v product's gradients: d(xn1) over all of QKV, d(wq, wk, wv) as one matrix. */
    if (rc == FX_OK)
        rc = fx__cu_qkv_from_heads(a->qkv, a->dq, a->dk, a->dv, g->bf16, a->rope, B, T, Hq, Hkv, hd);
    if (rc == FX_OK && c->qkv_bias)
        rc = fx__cu_colsum(gr + toff(m, l, FX__MODEL_BQ), a->parts, a->qkv, N, QKV);
    const void *dqkv = as_a(g, a->dh16, a->qkv, N * QKV, &rc);
    if (rc == FX_OK)
        rc = mm(g, 0, 0, N, C, QKV, dqkv, QKV, wt(g, toff(m, l, FX__MODEL_WQ)), C, 0.0f, a->dxn, C);
    if (rc == FX_OK)
        rc = mm(g, 1, 0, QKV, C, N, dqkv, QKV, x->xn1, C, 1.0f, gr + toff(m, l, FX__MODEL_WQ), C);
    if (rc == FX_OK)
        rc = fx__cu_rmsnorm_backward(a->dres, gr + toff(m, l, FX__MODEL_LN1), a->parts, a->dxn, x->res,
                                     g->params + toff(m, l, FX__MODEL_LN1), x->rstd1, N, C);
    return rc;
}

static int gpu_backward(fx__model *m)
{
    fx__model_gpu *g = m->gpu;
    if (!g->grads || !g->acts_mem || !g->grad_ready)
        return fx__error(FX_EINVAL, "fx__model_backward: no forward with gradients before it");
    g->grad_ready = false;
    m->grads_zero = false;
    const fx_model_config *c = &m->c;
    const int64_t N = g->B * g->T, C = c->dim, L = c->layers;
    const gpu_acts *a = &g->a;
    int rc = current(g);
    if (rc == FX_OK)
        rc = cu(cudaMemsetAsync(a->dres, 0, (size_t)(N * C) * sizeof(float), NULL), "clearing d(res)");
    if (rc == FX_OK)
        rc = fx__cu_rmsnorm_backward(a->dres, g->grads + toff(m, L, 0), a->parts, a->dxn, a->res_out,
                                     g->params + toff(m, L, 0), a->rstdf, N, C);
    for (int64_t l = L - 1; rc == FX_OK && l >= 0; l--)
        rc = layer_backward(m, l);
    if (rc == FX_OK)
        rc = fx__cu_embed_backward(g->grads, a->dres, a->uniq, a->ptr, a->pos, g->U, C);
    return rc;
}

/* ---- optimizer ------------------------------------------------------------------------------ */

static int gpu_zero_grad(fx__model *m)
{
    fx__model_gpu *g = m->gpu;
    int rc = current(g);
    if (rc == FX_OK && g->grads)
        rc = cu(cudaMemsetAsync(g->grads, 0, g->P * sizeof(float), NULL), "clearing the gradients");
    m->grads_zero = rc == FX_OK && g->grads;
    return rc;
}

static int gpu_grad_norm(fx__model *m, double *norm)
{
    fx__model_gpu *g = m->gpu;
    int rc = current(g);
    if (rc == FX_OK)
        rc = fx__cu_sumsq(g->norm_parts, g->grads, (int64_t)g->P);
    if (rc == FX_OK)
        rc = cu(cudaMemcpy(g->norm_host, g->norm_parts, g->nparts * sizeof(double), cudaMemcpyDeviceToHost),
                "the gradient norm");
    if (rc != FX_OK)
        return rc;
    double total = 0.0;
    for (size_t i = 0; i < g->nparts; i++)
        total += g->norm_host[i];
    *norm = sqrt(total);
    return FX_OK;
}

static fx__cu_adamw_k adamw_k(const fx__adamw *o, float wd, int64_t t)
{
    const fx__adamw_k k = fx__adamw_consts(o, wd, t);
    return (fx__cu_adamw_k){k.gs, k.b1, k.nb1, k.b2, k.nb2, k.lr, k.bc1, k.bc2, k.eps, k.wd, k.zero_grad};
}

static int gpu_adamw(fx__model *m, const fx__adamw *o, int64_t t)
{
    fx__model_gpu *g = m->gpu;
    if (!g->mom)
        return fx__error(FX_EINVAL, "fx__model_adamw: no optimizer buffers on the device");
    const fx__cu_adamw_k kd = adamw_k(o, o->weight_decay, t), k0 = adamw_k(o, 0.0f, t);
    int rc = current(g);
    for (size_t i = 0; rc == FX_OK && i < g->nruns; i++) {
        const gpu_run *r = &g->runs[i];
        rc = fx__cu_adamw(g->params + r->off, g->grads + r->off, g->mom + r->off, g->mom + g->P + r->off,
                          g->params16 ? g->params16 + r->off : NULL, (int64_t)r->n, r->decay ? &kd : &k0);
    }
    if (rc == FX_OK && o->zero_grad)
        m->grads_zero = true;
    return rc;
}

/* ---- decoding ------------------------------------------------------------------------------- */

/* The cache and scratch for kc (allocated when the cache changes; a new cache starts empty). */
static int decode_buffers(fx__model *m, const fx__model_cache *kc)
{
    fx__model_gpu *g = m->gpu;
    if (g->dec_mem && g->dec_for == kc && g->dec_cap == kc->cap)
        return FX_OK;
    if (kc->len != 0)
        return fx__error(FX_EINVAL, "decoding on the GPU: this cache was filled elsewhere (start it over: len 0)");
    if (g->dec_mem)
        (void)cudaFree(g->dec_mem);
    g->dec_mem = NULL;
    const fx_model_config *c = &m->c;
    const size_t cap = (size_t)kc->cap, C = (size_t)c->dim, F = (size_t)c->ffn, hd = (size_t)c->head_dim;
    const size_t QD = (size_t)c->heads * hd, KD = (size_t)c->kv_heads * hd, QKV = QD + 2 * KD;
    const size_t wide = F > QD ? F : QD, f = sizeof(float);
    const size_t sizes[] = {(size_t)c->layers * KD * cap * f, (size_t)c->layers * KD * cap * f, cap * C * f,
                            cap * C * f, cap * f, cap * QKV * f, cap * QD * f, cap * KD * f, cap * KD * f,
                            cap * QD * f, cap * wide * f, cap * 2 * F * f, (size_t)c->vocab * f, cap * hd * f,
                            cap * sizeof(int32_t)};
    void **views[] = {(void **)&g->dk, (void **)&g->dv, (void **)&g->dx, (void **)&g->dxn, (void **)&g->drstd,
                      (void **)&g->dqkv, (void **)&g->dq, (void **)&g->dkn, (void **)&g->dvn, (void **)&g->datt,
                      (void **)&g->dwork, (void **)&g->dh13, (void **)&g->dlogits, (void **)&g->drope,
                      (void **)&g->dtok};
    enum { NV = sizeof sizes / sizeof sizes[0] };
    size_t off[NV], total = 0;
    for (int i = 0; i < NV; i++) {
        off[i] = total;
        total += (sizes[i] + 255) / 256 * 256;
    }
    /* Cleared once: the attention reads the whole cache (masked beyond the filled positions),
       and zeros there cannot turn a product with a zero probability into a NaN. */
    int rc = dalloc(&g->dec_mem, total, "the KV cache");
    if (rc == FX_OK && (rc = cu(cudaMemset(g->dec_mem, 0, total), "clearing the KV cache")) != FX_OK)
        (void)cudaFree(g->dec_mem), g->dec_mem = NULL;
    if (rc != FX_OK)
        return rc;
    for (int i = 0; i < NV; i++)
        *views[i] = (char *)g->dec_mem + off[i];
    if ((rc = fx__model_rope_ensure(m, kc->cap)) != FX_OK ||
        (rc = cu(cudaMemcpy(g->drope, m->rope, cap * hd * f, cudaMemcpyHostToDevice), "the RoPE table")) != FX_OK) {
        (void)cudaFree(g->dec_mem);
        g->dec_mem = NULL;
        return rc;
    }
    g->dec_for = kc, g->dec_cap = kc->cap;
    return FX_OK;
}

/* Layer l for the n tokens in dx at positions p0..: the new keys and values into the cache,
   the queries over all of it in one call (q_offset p0; the sequence's mask hides the
   positions after each query, so the cache's unfilled end is never seen), and the output
   projection and MLP added into dx. */
static int decode_layer(fx__model *m, const fx__model_cache *kc, int64_t l, int64_t n)
{
    const fx__model_gpu *g = m->gpu;
    const fx_model_config *c = &m->c;
    const int64_t C = c->dim, F = c->ffn, Hq = c->heads, Hkv = c->kv_heads, hd = c->head_dim;
    const int64_t QD = Hq * hd, KD = Hkv * hd, QKV = QD + 2 * KD, cap = kc->cap, p0 = kc->len;
    float *kl = g->dk + l * KD * cap, *vl = g->dv + l * KD * cap;
    int rc = fx__cu_rmsnorm_forward(g->dxn, 0, g->drstd, g->dx, g->params + toff(m, l, FX__MODEL_LN1), n, C,
                                    c->norm_eps);
    if (rc == FX_OK)
        rc = mm(g, 0, 1, n, QKV, C, g->dxn, C, wt(g, toff(m, l, FX__MODEL_WQ)), C, 0.0f, g->dqkv, QKV);
    if (rc == FX_OK && c->qkv_bias)
        rc = fx__cu_bias_forward(g->dqkv, g->params + toff(m, l, FX__MODEL_BQ), n, QKV);
    if (rc == FX_OK)
        rc = fx__cu_qkv_to_heads(g->dq, g->dkn, g->dvn, 0, g->dqkv, g->drope + p0 * hd, 1, n, Hq, Hkv, hd);
    for (int64_t h = 0; rc == FX_OK && h < Hkv; h++) {
        const size_t bytes = (size_t)(n * hd) * sizeof(float);
        rc = cu(cudaMemcpyAsync(kl + (h * cap + p0) * hd, g->dkn + h * n * hd, bytes, cudaMemcpyDeviceToDevice,
                                NULL), "the KV cache");
        if (rc == FX_OK)
            rc = cu(cudaMemcpyAsync(vl + (h * cap + p0) * hd, g->dvn + h * n * hd, bytes, cudaMemcpyDeviceToDevice,
                                    NULL), "the KV cache");
    }
    if (rc == FX_OK) {
        fx_attention at = {.B = 1, .Hq = Hq, .Hkv = Hkv, .Lq = n, .Lkv = cap, .D = hd, .Dv = hd, .q_offset = p0,
                           .mask = kc->bmask, .device = g->device, .dtype = FX_DT_F32};
        if ((rc = fx_flex_attention(&at, g->dq, kl, vl, g->datt, NULL)) != FX_OK)
            return fx__error_context(rc, "layer %lld attention", (long long)l);
    }
    if (rc == FX_OK)
        rc = fx__cu_from_heads(g->dwork, QD, g->datt, 0, 1, n, Hq, hd);
    if (rc == FX_OK)
        rc = mm(g, 0, 1, n, C, QD, g->dwork, QD, wt(g, toff(m, l, FX__MODEL_WO)), QD, 1.0f, g->dx, C);
    if (rc == FX_OK)
        rc = fx__cu_rmsnorm_forward(g->dxn, 0, g->drstd, g->dx, g->params + toff(m, l, FX__MODEL_LN2), n, C,
                                    c->norm_eps);
    if (rc == FX_OK)
        rc = mm(g, 0, 1, n, 2 * F, C, g->dxn, C, wt(g, toff(m, l, FX__MODEL_W1)), C, 0.0f, g->dh13, 2 * F);
    if (rc == FX_OK)
        rc = fx__cu_swiglu_forward(g->dwork, 0, g->dh13, n, F);
    if (rc == FX_OK)
        rc = mm(g, 0, 1, n, C, F, g->dwork, F, wt(g, toff(m, l, FX__MODEL_W2)), F, 1.0f, g->dx, C);
    return rc;
}

static int gpu_decode(fx__model *m, fx__model_cache *kc, const int32_t *tokens, int64_t n, float *logits)
{
    fx__model_gpu *g = m->gpu;
    if (g->bf16)
        return fx__error(FX_EUNSUPPORTED, "decoding on the GPU takes float32 weights (attach with bf16 off)");
    if (!kc->bmask) /* fx__model_decode builds it unless the reference attention is chosen */
        return fx__error(FX_EUNSUPPORTED, "decoding on the GPU uses the flex attention (not the reference)");
    const fx_model_config *c = &m->c;
    const int64_t C = c->dim, V = c->vocab, L = c->layers;
    int rc = current(g);
    if (rc == FX_OK)
        rc = decode_buffers(m, kc);
    /* The mask fx__model_decode built for this sequence, copied when the sequence starts. */
    if (rc == FX_OK && kc->len == 0)
        rc = fx_block_mask_to_device(kc->bmask, g->device);
    if (rc == FX_OK)
        rc = cu(cudaMemcpy(g->dtok, tokens, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice), "tokens");
    if (rc == FX_OK)
        rc = fx__cu_embed_forward(g->dx, g->dtok, g->params, n, C);
    for (int64_t l = 0; rc == FX_OK && l < L; l++)
        rc = decode_layer(m, kc, l, n);
    if (rc == FX_OK)
        rc = fx__cu_rmsnorm_forward(g->dxn, 0, g->drstd, g->dx + (n - 1) * C, g->params + toff(m, L, 0), 1, C,
                                    c->norm_eps);
    if (rc == FX_OK)
        rc = mm(g, 0, 1, 1, V, C, g->dxn, C, wt(g, head_off(m)), C, 0.0f, g->dlogits, V);
    if (rc == FX_OK)
        rc = cu(cudaMemcpy(logits, g->dlogits, (size_t)V * sizeof(float), cudaMemcpyDeviceToHost), "the logits");
    if (rc == FX_OK)
        kc->len += n;
    return rc;
}

#else /* no CUDA in the build */

static int no_cuda(void)
{
    return fx__error(FX_EUNSUPPORTED, "this build of flexc has no CUDA backend (configure with -DFLEXC_CUDA=ON and a "
                                      "CUDA toolkit)");
}

int fx__model_gpu_attach(fx__model *m, int device, bool bf16)
{
    (void)m, (void)device, (void)bf16;
    return no_cuda();
}
int fx__model_gpu_download(fx__model *m) { return (void)m, no_cuda(); }
int fx__model_gpu_upload(fx__model *m) { return (void)m, no_cuda(); }
int fx__model_gpu_grads(const fx__model *m, float *grads) { return (void)m, (void)grads, no_cuda(); }

#endif
