/* The CUDA backend's host side: its table (fx__cuda_backend, core/backend.h), every check of a
   device call (arguments, dtype, device, where each pointer lives, the mask's device copy),
   the block mask's copy, the work plan, and the routing to the launchers in attention.cu and
   lce.cu. Built in every configuration: without CUDA (FLEXC_HAVE_CUDA undefined) the calls
   check their arguments and return FX_EUNSUPPORTED. */
#include "cuda/cuda.h"
#include "core/backend.h"
#include "attention/internal.h"
#include "lce/lce_internal.h"

#include <stdio.h>
#include <string.h>

#if defined(FX_CUDA_EMU)
#include "cuda/emu.h" /* the emu tests' build of this file */
#elif defined(FLEXC_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

/* ---- devices ------------------------------------------------------------------------------ */

int fx_cuda_device_count(void)
{
#ifdef FLEXC_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver or no GPU: not an error of a later call */
        return 0;
    }
    return n;
#else
    return 0;
#endif
}

/* The first device's name (what calls with device = 1 run on). */
static const char *cuda_device_name(char *buf, size_t cap)
{
#if defined(FLEXC_HAVE_CUDA) && !defined(FX_CUDA_EMU)
    struct cudaDeviceProp prop;
    if (fx_cuda_device_count() < 1 || cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    snprintf(buf, cap, "%s", prop.name);
    return buf;
#else
    (void)buf, (void)cap;
    return NULL;
#endif
}

int fx__cuda_status(int err, const char *what)
{
#ifdef FLEXC_HAVE_CUDA
    const char *msg = cudaGetErrorString((cudaError_t)err);
    (void)cudaGetLastError();
    if (err == cudaErrorMemoryAllocation)
        return fx__error(FX_ENOMEM, "%s: out of device memory (%s)", what, msg);
    return fx__error(FX_EDEVICE, "%s: %s", what, msg);
#else
    return fx__error(FX_EDEVICE, "%s: CUDA error %d", what, err);
#endif
}

/* dtype and device fields, before anything touches CUDA. who names the call. */
static int check_fields(const char *who, int device, int dtype)
{
    if (dtype != 0 && dtype != FX_DT_F32 && dtype != FX_DT_BF16)
        return fx__error(FX_EINVAL, "%s: dtype = %d is not 0, FX_DT_F32 (%d) or FX_DT_BF16 (%d)", who, dtype,
                         (int)FX_DT_F32, (int)FX_DT_BF16);
    if (device < 0)
        return fx__error(FX_EINVAL, "%s: device = %d must be >= 0 (0: the CPU, k > 0: CUDA device k - 1)", who,
                         device);
    if (device == 0 && dtype == FX_DT_BF16)
        return fx__error(FX_EUNSUPPORTED, "%s: dtype FX_DT_BF16 runs on CUDA devices only (device > 0); "
                                          "the CPU path takes float32", who);
    return FX_OK;
}

/* Makes CUDA device `device - 1` current for this call; *prev receives the one to restore. */
static int open_device(const char *who, int device, int *prev)
{
#ifdef FLEXC_HAVE_CUDA
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        const char *msg = cudaGetErrorString(e);
        (void)cudaGetLastError();
        return fx__error(FX_EUNSUPPORTED, "%s: device = %d: no CUDA device (%s)", who, device, msg);
    }
    if (n == 0)
        return fx__error(FX_EUNSUPPORTED, "%s: device = %d: no CUDA device is visible", who, device);
    if (device > n)
        return fx__error(FX_EINVAL, "%s: device = %d, but %d CUDA device%s visible (device k is CUDA device k - 1)",
                         who, device, n, n == 1 ? " is" : "s are");
    if ((e = cudaGetDevice(prev)) != cudaSuccess || (e = cudaSetDevice(device - 1)) != cudaSuccess)
        return fx__cuda_status(e, who);
    return FX_OK;
#else
    (void)prev;
    return fx__error(FX_EUNSUPPORTED, "%s: device = %d: this build of flexc has no CUDA backend "
                                      "(configure with -DFLEXC_CUDA=ON and a CUDA toolkit)", who, device);
#endif
}

static void close_device(int prev)
{
#ifdef FLEXC_HAVE_CUDA
    (void)cudaSetDevice(prev);
#else
    (void)prev;
#endif
}

#ifdef FLEXC_HAVE_CUDA
/* FX_OK when p (not NULL) is memory of CUDA device `device - 1` (or managed memory). */
static int check_ptr(const char *who, const char *name, const void *p, int device)
{
    struct cudaPointerAttributes at;
    cudaError_t e = cudaPointerGetAttributes(&at, p);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fx__error(FX_EINVAL, "%s: %s = %p is not CUDA memory (%s)", who, name, p, cudaGetErrorString(e));
    }
    if (at.type != cudaMemoryTypeDevice && at.type != cudaMemoryTypeManaged)
        return fx__error(FX_EINVAL, "%s: %s = %p is host memory; a call with device = %d takes memory of CUDA "
                                    "device %d", who, name, p, device, device - 1);
    if (at.type == cudaMemoryTypeDevice && at.device != device - 1)
        return fx__error(FX_EINVAL, "%s: %s is on CUDA device %d, but the call names device = %d (CUDA device %d)",
                         who, name, at.device, device, device - 1);
    return FX_OK;
}

/* Every named pointer that is not NULL. */
static int check_ptrs(const char *who, const fx__span *s, size_t n, int device)
{
    for (size_t i = 0; i < n; i++)
        if (s[i].ptr) {
            int rc = check_ptr(who, s[i].name, s[i].ptr, device);
            if (rc != FX_OK)
                return rc;
        }
    return FX_OK;
}
#endif

/* ---- block mask copy ---------------------------------------------------------------------- */

#ifdef FLEXC_HAVE_CUDA
typedef struct dev_mask {
    fx__cu_mask m;
    void *base; /* one allocation holding every array */
} dev_mask;
#endif

void fx__cuda_block_mask_release(fx_block_mask *m)
{
#ifdef FLEXC_HAVE_CUDA
    dev_mask *d = m->dev;
    if (d) {
        int prev = 0;
        bool switched = cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(m->dev_index - 1) == cudaSuccess;
        (void)cudaFree(d->base);
        if (switched)
            (void)cudaSetDevice(prev);
        (void)cudaGetLastError();
        fx__free(d);
    }
#endif
    m->dev = NULL;
    m->dev_index = 0;
}

int fx_block_mask_to_device(fx_block_mask *m, int device)
{
    static const char who[] = "fx_block_mask_to_device";
    if (!m)
        return fx__error(FX_EINVAL, "%s: m is NULL", who);
    if (device < 1)
        return fx__error(FX_EINVAL, "%s: device = %d must be >= 1 (CUDA device device - 1)", who, device);
    int prev = 0, rc = open_device(who, device, &prev);
    if (rc != FX_OK)
        return rc;
#ifdef FLEXC_HAVE_CUDA
    const int64_t nrows = m->nslots * m->nqb, ncols = m->nslots * m->nkb, nv = m->n_visited;
    const size_t nbits = (size_t)m->n_partial * (size_t)m->block_q * (size_t)m->bm_words;
    /* Arrays in one allocation, each aligned to 256 bytes. */
    const struct { const void *src; size_t bytes; } arr[] = {
        {m->kv_ptr, (size_t)(nrows + 1) * sizeof(int64_t)}, {m->kv_idx, (size_t)nv * sizeof(int32_t)},
        {m->kv_bits, (size_t)nv * sizeof(int64_t)},         {m->q_ptr, (size_t)(ncols + 1) * sizeof(int64_t)},
        {m->q_idx, (size_t)nv * sizeof(int32_t)},           {m->q_bits, (size_t)nv * sizeof(int64_t)},
        {m->bits, nbits * sizeof(uint64_t)},
    };
    enum { NARR = sizeof arr / sizeof arr[0] };
    size_t off[NARR], total = 0;
    for (int i = 0; i < NARR; i++) {
        off[i] = total;
        total += (arr[i].bytes + 255) & ~(size_t)255;
    }
    dev_mask *d = fx__calloc(1, sizeof *d);
    if (!d) {
        close_device(prev);
        return FX_ENOMEM;
    }
    cudaError_t e = cudaMalloc(&d->base, total ? total : 256);
    for (int i = 0; e == cudaSuccess && i < NARR; i++)
        if (arr[i].bytes)
            e = cudaMemcpy((char *)d->base + off[i], arr[i].src, arr[i].bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        rc = fx__cuda_status(e, who);
        if (d->base)
            (void)cudaFree(d->base);
        fx__free(d);
        close_device(prev);
        return rc;
    }
    char *b = d->base;
    d->m = (fx__cu_mask){.kv_ptr = (const int64_t *)(b + off[0]), .kv_idx = (const int32_t *)(b + off[1]),
                         .kv_bits = (const int64_t *)(b + off[2]), .q_ptr = (const int64_t *)(b + off[3]),
                         .q_idx = (const int32_t *)(b + off[4]), .q_bits = (const int64_t *)(b + off[5]),
                         .bits = (const uint64_t *)(b + off[6]), .B = m->B, .H = m->H, .nqb = m->nqb,
                         .nkb = m->nkb, .bm_words = m->bm_words};
    close_device(prev);
    fx__cuda_block_mask_release(m); /* an earlier copy, possibly on another device */
    m->dev = d;
    m->dev_index = device;
    return FX_OK;
#else
    (void)prev;
    return rc;
#endif
}

/* ---- attention ---------------------------------------------------------------------------- */

int64_t fx__cu_attn_row_blocks(const fx__cu_attn *a)
{
    return a->B * a->Hq * a->n_qb * ((a->bq + 15) / 16);
}

/* Row chunks of 16 holding rows of the call in the q-block at index qbi of the call. */
static int64_t busy_chunks(const fx__cu_attn *a, int64_t qbi)
{
    const int64_t base = a->has_mask ? (a->qb_lo + qbi) * a->bq : a->q_offset + qbi * a->bq;
    const int64_t lo = base > a->q_offset ? base : a->q_offset;
    const int64_t end = a->q_offset + a->Lq, hi = base + a->bq < end ? base + a->bq : end;
    return lo < hi ? (hi - 1 - base) / 16 - (lo - base) / 16 + 1 : 0;
}

int64_t fx__cu_attn_busy_blocks(const fx__cu_attn *a)
{
    if (a->n_qb <= 0)
        return 0;
    /* Only the first and the last q-block can be partly outside the call's rows. */
    int64_t per_head = busy_chunks(a, 0);
    if (a->n_qb > 1)
        per_head += busy_chunks(a, a->n_qb - 1) + (a->n_qb - 2) * ((a->bq + 15) / 16);
    return a->B * a->Hq * per_head;
}

int fx__cu_attn_splits(const fx__cu_attn *a, int sm_count)
{
    /* The blocks that work: with Lq = 1 every q-block has one busy row chunk of its
       (bq + 15) / 16, and counting the idle ones left decoding with one split. */
    const int64_t blocks = fx__cu_attn_busy_blocks(a), want = 2 * (int64_t)(sm_count > 0 ? sm_count : 1);
    if (blocks >= want || blocks == 0 || a->max_entries <= 1)
        return 1;
    int64_t s = (want + blocks - 1) / blocks;
    s = s < 32 ? s : 32;
    return (int)(s < a->max_entries ? s : a->max_entries);
}

static int check_attention_fields(const char *who, const fx_attention *a)
{
    int rc = check_fields(who, a->device, a->dtype);
    if (rc != FX_OK)
        return rc;
    if (a->device == 0)
        return FX_OK;
    int kind = fx__score_kind(a->score_mod);
    if (kind == FX__SCORE_CUSTOM)
        return fx__error(FX_EUNSUPPORTED, "%s: score_mod is a custom C function, which cannot run on a CUDA device "
                                          "(built-ins only: fx_score_alibi, fx_score_softcap, fx_score_rel_bias)", who);
    if (a->score_mod_grad) {
        fx_score_grad_fn own = kind == FX__SCORE_ALIBI     ? fx_score_alibi_grad
                               : kind == FX__SCORE_SOFTCAP ? fx_score_softcap_grad
                               : kind == FX__SCORE_REL_BIAS ? fx_score_rel_bias_grad
                                                            : NULL;
        if (a->score_mod_grad != own)
            return fx__error(FX_EUNSUPPORTED, "%s: score_mod_grad is a custom C function, which cannot run on a "
                                              "CUDA device (NULL or the built-in's own derivative)", who);
    }
    if (a->D > FX__CU_DMAX || a->Dv > FX__CU_DMAX)
        return fx__error(FX_EUNSUPPORTED, "%s: D = %lld, Dv = %lld: the CUDA kernels take head sizes up to %d", who,
                         (long long)a->D, (long long)a->Dv, FX__CU_DMAX);
    return FX_OK;
}

static size_t dtype_bytes(int dtype) { return dtype == FX_DT_BF16 ? 2 : 4; }

/* Fills the launch description shared by both directions (the device is open). */
static int attn_describe(const char *who, const fx_attention *a, fx__cu_attn *c)
{
    memset(c, 0, sizeof *c);
    c->bf16 = a->dtype == FX_DT_BF16;
    c->B = a->B, c->Hq = a->Hq, c->Hkv = a->Hkv, c->Lq = a->Lq, c->Lkv = a->Lkv, c->D = a->D, c->Dv = a->Dv;
    c->q_offset = a->q_offset;
    c->scale = fx__attention_scale(a);
    c->stream = a->stream;
    const fx_block_mask *m = a->mask;
    if (m) {
        if (!m->dev || m->dev_index != a->device)
            return fx__error(FX_EINVAL, "%s: the mask has no copy on device %d: call fx_block_mask_to_device(m, %d) "
                                        "first", who, a->device, a->device);
#ifdef FLEXC_HAVE_CUDA
        c->m = ((const dev_mask *)m->dev)->m;
#endif
        c->has_mask = 1;
        c->bq = m->block_q, c->bk = m->block_kv;
        c->qb_lo = a->q_offset / c->bq;
        c->n_qb = (a->q_offset + a->Lq - 1) / c->bq - c->qb_lo + 1;
        /* The longest visit list among the rows this call reads. */
        for (int64_t slot = 0; slot < m->nslots; slot++)
            for (int64_t qb = c->qb_lo; qb < c->qb_lo + c->n_qb; qb++) {
                const int64_t r = fx__bm_row(m, slot, qb), n = m->kv_ptr[r + 1] - m->kv_ptr[r];
                c->max_entries = n > c->max_entries ? n : c->max_entries;
            }
    } else {
        c->bq = FX__DENSE_BLOCK_Q, c->bk = FX__DENSE_BLOCK_KV;
        c->qb_lo = 0;
        c->n_qb = (a->Lq + c->bq - 1) / c->bq;
    }
    c->nkb = (a->Lkv + c->bk - 1) / c->bk;
    if (!m)
        c->max_entries = c->nkb;
    switch (fx__score_kind(a->score_mod)) {
    case FX__SCORE_ALIBI:
        c->mod = FX__CU_MOD_ALIBI;
        c->slopes = ((const fx_score_alibi_ctx *)a->score_ctx)->slopes;
        break;
    case FX__SCORE_SOFTCAP:
        c->mod = FX__CU_MOD_SOFTCAP;
        c->cap = ((const fx_score_softcap_ctx *)a->score_ctx)->cap;
        break;
    case FX__SCORE_REL_BIAS: {
        const fx_score_rel_bias_ctx *t = a->score_ctx;
        c->mod = FX__CU_MOD_REL_BIAS;
        c->table = t->table;
        c->grad_table = t->grad_table;
        c->tsize = t->size, c->tzero = t->zero, c->theads = t->heads;
        break;
    }
    default:
        c->mod = FX__CU_MOD_NONE;
        break;
    }
    return FX_OK;
}

#ifdef FLEXC_HAVE_CUDA
/* The score mod's device arrays. */
static int check_mod_ptrs(const char *who, const fx__cu_attn *c, int device, bool backward)
{
    const fx__span s[] = {{"score_ctx slopes", c->slopes, 0},
                          {"score_ctx table", c->table, 0},
                          {"score_ctx grad_table", backward ? c->grad_table : NULL, 0}};
    return check_ptrs(who, s, 3, device);
}
#endif

/* What the forward and the backward do once their buffers are known: none may overlap an
   output, the device becomes current (*prev: what close_device restores), *c describes the
   call and every buffer must live on that device. On failure the device is closed again. */
static int attn_open(const char *who, const fx_attention *a, const fx__span *in, size_t nin, const fx__span *outs,
                     size_t nout, bool backward, fx__cu_attn *c, int *prev)
{
    int rc = fx__check_overlaps(in, nin, outs, nout);
    if (rc != FX_OK || (rc = open_device(who, a->device, prev)) != FX_OK)
        return rc;
    rc = attn_describe(who, a, c);
#ifdef FLEXC_HAVE_CUDA
    if (rc == FX_OK)
        rc = check_ptrs(who, in, nin, a->device);
    if (rc == FX_OK)
        rc = check_ptrs(who, outs, nout, a->device);
    if (rc == FX_OK)
        rc = check_mod_ptrs(who, c, a->device, backward);
#else
    (void)backward;
#endif
    if (rc != FX_OK)
        close_device(*prev);
    return rc;
}

static int cuda_flex_attention(const fx_attention *a, const float *q, const float *k, const float *v, float *out,
                               float *lse)
{
    static const char who[] = "fx_flex_attention";
    int rc = fx__attention_check(a, q, k, v);
    if (rc != FX_OK || (rc = check_attention_fields(who, a)) != FX_OK)
        return rc;
    if (!out)
        return fx__error(FX_EINVAL, "out is NULL");
    const size_t nq = (size_t)(a->B * a->Hq * a->Lq), nkv = (size_t)(a->B * a->Hkv * a->Lkv);
    const size_t f = dtype_bytes(a->dtype);
    const fx__span in[] = {{"q", q, nq * (size_t)a->D * f}, {"k", k, nkv * (size_t)a->D * f},
                           {"v", v, nkv * (size_t)a->Dv * f}};
    const fx__span outs[] = {{"out", out, nq * (size_t)a->Dv * f}, {"lse", lse, nq * sizeof(float)}};
    int prev = 0;
    fx__cu_attn c;
    if ((rc = attn_open(who, a, in, 3, outs, 2, false, &c, &prev)) != FX_OK)
        return rc;
#ifdef FLEXC_HAVE_CUDA
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, a->device - 1) != cudaSuccess)
        sms = 1;
    c.q = q, c.k = k, c.v = v, c.out = out, c.lse = lse;
    c.nsplit = fx__cu_attn_splits(&c, sms);
    rc = fx__cu_attn_forward(&c);
#endif
    close_device(prev);
    return rc;
}

static int cuda_flex_attention_backward(const fx_attention *a, const float *q, const float *k, const float *v,
                                        const float *out, const float *lse, const float *dout, float *dq, float *dk,
                                        float *dv)
{
    static const char who[] = "fx_flex_attention_backward";
    int rc = fx__attention_check(a, q, k, v);
    if (rc != FX_OK || (rc = check_attention_fields(who, a)) != FX_OK)
        return rc;
    const struct { const char *name; const void *p; } need[] = {
        {"out", out}, {"lse", lse}, {"dout", dout}, {"dq", dq}, {"dk", dk}, {"dv", dv}};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!need[i].p)
            return fx__error(FX_EINVAL, "%s is NULL", need[i].name);
    const size_t nq = (size_t)(a->B * a->Hq * a->Lq), nkv = (size_t)(a->B * a->Hkv * a->Lkv);
    const size_t f = dtype_bytes(a->dtype);
    const size_t qd = nq * (size_t)a->D * f, qv = nq * (size_t)a->Dv * f;
    const size_t kd = nkv * (size_t)a->D * f, kv = nkv * (size_t)a->Dv * f;
    const fx__span in[] = {{"q", q, qd},     {"k", k, kd},         {"v", v, kv},
                           {"out", out, qv}, {"lse", lse, nq * sizeof(float)}, {"dout", dout, qv}};
    const fx__span outs[] = {{"dq", dq, qd}, {"dk", dk, kd}, {"dv", dv, kv}};
    int prev = 0;
    fx__cu_attn c;
    if ((rc = attn_open(who, a, in, 6, outs, 3, true, &c, &prev)) != FX_OK)
        return rc;
#ifdef FLEXC_HAVE_CUDA
    c.q = q, c.k = k, c.v = v, c.out = (void *)out, c.lse = (float *)lse, c.dout = dout;
    c.dq = dq, c.dk = dk, c.dv = dv;
    c.nsplit = 1;
    rc = fx__cu_attn_backward(&c);
#endif
    close_device(prev);
    return rc;
}

/* ---- fused linear + cross-entropy --------------------------------------------------------- */

int64_t fx__cu_lce_chunk(int64_t N, int64_t V, int64_t chunk)
{
    if (chunk > 0)
        return chunk < N ? chunk : N;
    /* The chunk's float32 logits within an eighth of the bfloat16 logits of all N tokens
       (what an unfused loss holds), less 64 MiB for the products' workspace and the library's
       own; never below 128 MiB (thinner chunks make memory-bound products) nor above 1 GiB. */
    const double lo = (double)((int64_t)128 << 20), hi = (double)((int64_t)1 << 30);
    double budget = (double)N * (double)V * 2.0 / 8.0 - (double)((int64_t)64 << 20);
    budget = budget < lo ? lo : budget > hi ? hi : budget;
    int64_t c = (int64_t)(budget / ((double)V * (double)sizeof(float)));
    c = c < 1 ? 1 : c;
    return c < N ? c : N;
}

static int cuda_lce(const fx_lce *p, const float *h, const float *w, const float *bias, const int64_t *target,
                    float *loss, float *lse, const float *lse_in, const float *grad_loss, float *dh, float *dw,
                    float *dbias)
{
    const bool backward = lse_in != NULL || grad_loss != NULL;
    const char *who = backward ? "fx_linear_cross_entropy_backward" : "fx_linear_cross_entropy";
    int rc = fx__lce_check_inputs(p, h, w, target);
    if (rc != FX_OK)
        return rc;
    if (backward && !lse_in)
        return fx__error(FX_EINVAL, "lse is NULL (pass the lse of the forward call)");
    if (backward && !grad_loss)
        return fx__error(FX_EINVAL, "grad_loss is NULL");
    if ((rc = check_fields(who, p->device, p->dtype)) != FX_OK)
        return rc;
    const size_t N = (size_t)p->N, D = (size_t)p->D, V = (size_t)p->V, f = dtype_bytes(p->dtype), f32 = sizeof(float);
    const size_t nloss = p->reduction == FX_REDUCTION_NONE ? N : 1;
    const fx__span in[] = {{"h", h, N * D * f},
                           {"w", w, V * D * f},
                           {"bias", bias, V * f},
                           {"target", target, N * sizeof(int64_t)},
                           {"lse", lse_in, N * f32},
                           {"grad_loss", grad_loss, nloss * f32}};
    const fx__span outs[] = {{"loss", loss, nloss * f32}, {"lse", lse, N * f32}, {"dh", dh, N * D * f},
                             {"dw", dw, V * D * f},       {"dbias", dbias, V * f}};
    if ((rc = fx__check_overlaps(in, 6, outs, 5)) != FX_OK)
        return rc;
    int prev = 0;
    if ((rc = open_device(who, p->device, &prev)) != FX_OK)
        return rc;
#ifdef FLEXC_HAVE_CUDA
    if ((rc = check_ptrs(who, in, 6, p->device)) != FX_OK || (rc = check_ptrs(who, outs, 5, p->device)) != FX_OK) {
        close_device(prev);
        return rc;
    }
    /* The targets are checked (and counted) here: MEAN divides by the count, and an id out
       of range must be refused before any kernel reads w with it. */
    int64_t *ht = fx__alloc(N * sizeof(int64_t));
    if (!ht) {
        close_device(prev);
        return FX_ENOMEM;
    }
    cudaError_t e = cudaMemcpyAsync(ht, target, N * sizeof(int64_t), cudaMemcpyDeviceToHost, (cudaStream_t)p->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize((cudaStream_t)p->stream);
    if (e != cudaSuccess)
        rc = fx__cuda_status(e, "fused cross-entropy: reading target");
    int64_t n_valid = 0;
    for (int64_t i = 0; rc == FX_OK && i < p->N; i++) {
        const int64_t y = ht[i];
        if (y == p->ignore_index)
            continue;
        if (y < 0 || y >= p->V)
            rc = fx__error(FX_ERANGE, "target[%lld] = %lld is outside [0, %lld) and is not ignore_index (%lld)",
                           (long long)i, (long long)y, (long long)p->V, (long long)p->ignore_index);
        n_valid++;
    }
    if (rc == FX_OK) {
        const fx__cu_lce c = {.bf16 = p->dtype == FX_DT_BF16, .h = h, .w = w, .bias = bias, .target = target,
                              .host_target = ht, .loss = backward ? NULL : loss, .lse_out = backward ? NULL : lse,
                              .lse_in = lse_in, .grad_loss = grad_loss, .dh = dh, .dw = dw, .dbias = dbias,
                              .N = p->N, .D = p->D, .V = p->V, .ignore_index = p->ignore_index,
                              .n_valid = n_valid, .reduction = (int)p->reduction, .eps = p->label_smoothing,
                              .zl = p->z_loss, .cap = p->softcap, .chunk = fx__cu_lce_chunk(p->N, p->V, p->chunk),
                              .stream = p->stream};
        rc = fx__cu_lce_run(&c);
    }
    fx__free(ht);
#else
    (void)dw, (void)dh, (void)dbias, (void)loss, (void)lse;
#endif
    close_device(prev);
    return rc;
}

/* ---- the backend's table ------------------------------------------------------------------ */

const fx__backend fx__cuda_backend = {
    .name = "cuda",
    .device_name = cuda_device_name,
    .flex_attention = cuda_flex_attention,
    .flex_attention_backward = cuda_flex_attention_backward,
    .lce = cuda_lce,
    .block_mask_release = fx__cuda_block_mask_release,
};
