/* The CUDA backend (docs/cuda.md): the launch descriptions shared by the host side (device.c,
   plain C, built in every configuration) and the kernels (attention.cu, lce.cu, built only
   with CUDA).

   device.c fills the backend's table (fx__cuda_backend, core/backend.h), which the public
   calls reach when they name a device (device > 0) or a dtype other than float32; it does
   every check a call needs (arguments, device, pointers' memory, the mask's copy) and fills
   an fx__cu_* description; the kernels' launchers only launch. Without CUDA in the build,
   the calls still check their arguments and then return FX_EUNSUPPORTED, so the host-side
   logic is tested everywhere. The modules never include this header: the backend depends on
   them (attention/internal.h, lce/lce_internal.h), not the reverse. */
#ifndef FX_CUDA_H
#define FX_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

#include "core/core.h" /* C declarations: inside the extern "C" block for the .cu files */

/* ---- host side (device.c) ---------------------------------------------------------------- */

/* fx__cuda_backend.block_mask_release: frees the device copy of a block mask, if it has one
   (fx_block_mask_free calls it by this name). */
void fx__cuda_block_mask_release(fx_block_mask *m);

/* A CUDA runtime error as a status: FX_ENOMEM for an allocation failure, else FX_EDEVICE,
   with "what: <the runtime's message>". err is a cudaError_t. */
int fx__cuda_status(int err, const char *what);

/* ---- launch descriptions (device pointers) ------------------------------------------------ */

/* Score mods the kernels know (the FX__SCORE_* of attention/internal.h). */
enum { FX__CU_MOD_NONE = 0, FX__CU_MOD_ALIBI = 1, FX__CU_MOD_SOFTCAP = 2, FX__CU_MOD_REL_BIAS = 3 };
/* Head sizes the kernels hold in registers: D, Dv <= this. */
enum { FX__CU_DMAX = 256 };

/* A block mask's lists and bitmaps on the device (layout as in attention/internal.h). */
typedef struct fx__cu_mask {
    const int64_t *kv_ptr;
    const int32_t *kv_idx;
    const int64_t *kv_bits;
    const int64_t *q_ptr;
    const int32_t *q_idx;
    const int64_t *q_bits;
    const uint64_t *bits;
    int64_t B, H, nqb, nkb, bm_words;
} fx__cu_mask;

typedef struct fx__cu_attn {
    int bf16;                 /* element type of q, k, v, out, dout, dq, dk, dv */
    const void *q, *k, *v;    /* [B,Hq,Lq,D], [B,Hkv,Lkv,D], [B,Hkv,Lkv,Dv] */
    void *out;                /* [B,Hq,Lq,Dv]: written by the forward, read by the backward */
    float *lse;               /* [B,Hq,Lq]: forward: NULL or written; backward: read */
    const void *dout;         /* [B,Hq,Lq,Dv] (backward) */
    void *dq, *dk, *dv;       /* overwritten (backward) */
    int64_t B, Hq, Hkv, Lq, Lkv, D, Dv, q_offset;
    float scale;
    int has_mask;
    fx__cu_mask m;
    int64_t bq, bk;           /* block sizes: the mask's, or the dense 128 x 128 */
    int64_t qb_lo, n_qb;      /* q-blocks holding rows q_offset .. q_offset + Lq - 1 */
    int64_t nkb;              /* kv-blocks holding keys 0 .. Lkv - 1 */
    int64_t max_entries;      /* the most kv-blocks a q-block row visits */
    int mod;                  /* FX__CU_MOD_* */
    float cap;                /* softcap */
    const float *slopes;      /* alibi [Hq] */
    const float *table;       /* rel_bias [heads, tsize] */
    float *grad_table;        /* rel_bias gradient (backward), NULL: not wanted */
    int64_t tsize, tzero, theads;
    int nsplit;               /* forward: KV splits per row block (fx__cu_attn_splits), >= 1 */
    void *stream;             /* cudaStream_t */
} fx__cu_attn;

/* Forward (with split-KV when there are too few row blocks for the GPU) and backward
   (dQ, dK/dV, and the rel_bias table, each summed in a fixed order without atomics).
   FX_OK or a status from fx__cuda_status. */
int fx__cu_attn_forward(const fx__cu_attn *a);
int fx__cu_attn_backward(const fx__cu_attn *a);
/* KV splits for the forward (device.c): 1 when the row blocks that hold rows of the call
   (fx__cu_attn_busy_blocks) fill sm_count multiprocessors twice over, else up to 32, never
   more than max_entries. The result depends on the sizes and the device's multiprocessor
   count only, so a call repeats bitwise on one GPU. */
int fx__cu_attn_splits(const fx__cu_attn *a, int sm_count);
/* Row blocks (thread blocks before splitting) of the forward grid: B * Hq * n_qb * row
   chunks of 16 per q-block. */
int64_t fx__cu_attn_row_blocks(const fx__cu_attn *a);

typedef struct fx__cu_lce {
    int bf16;                 /* element type of h, w, bias, dh, dw, dbias */
    const void *h, *w, *bias; /* [N,D], [V,D], [V] or NULL */
    const int64_t *target;    /* [N] (device) */
    const int64_t *host_target; /* [N]: the same, copied and checked on the host */
    float *loss, *lse_out;    /* [1] or [N], [N]; either may be NULL */
    const float *lse_in;      /* [N] backward: the forward's lse; NULL: forward call */
    const float *grad_loss;   /* [1] or [N] (backward) */
    void *dh, *dw, *dbias;    /* dh overwritten; dw, dbias accumulated; each may be NULL */
    int64_t N, D, V, ignore_index, n_valid;
    int reduction;
    float eps, zl, cap;
    int64_t chunk;            /* tokens per chunk */
    void *stream;
} fx__cu_lce;

int fx__cu_lce_run(const fx__cu_lce *p);
/* Tokens per chunk for the device path: chunk when set, else what keeps the chunk's float32
   logits within an eighth of the bfloat16 logits of all N tokens, less 64 MiB (the products'
   workspace), and between 128 MiB and 1 GiB; at most N, at least 1. */
int64_t fx__cu_lce_chunk(int64_t N, int64_t V, int64_t chunk);

/* Row blocks of the forward grid (fx__cu_attn_row_blocks) that hold at least one row of the
   call: what fx__cu_attn_splits weighs against the multiprocessors. */
int64_t fx__cu_attn_busy_blocks(const fx__cu_attn *a);

/* ---- decoding (attn_decode.cu) ------------------------------------------------------------ */

/* The forward for few query rows: one thread block per (batch, KV head, split) reads each K/V
   row once for all Lq x (Hq / Hkv) query rows of the group. Takes D == Dv in {32, 64, 128,
   256}, Lq <= 8, Lq Hq / Hkv <= 64 and 16-byte aligned q, k, v; masks, score mods and
   q_offset as the general forward. fx__cu_attn_forward routes the calls it fits to
   fx__cu_attn_decode, which chooses its own split count (a->nsplit is not read). */
bool fx__cu_attn_decode_fits(const fx__cu_attn *a);
int fx__cu_attn_decode(const fx__cu_attn *a);

#ifdef __cplusplus
}
#endif
#endif
