/* Internal pieces of the fused linear + cross-entropy. The module's kernel table,
   fx__lce_kernels (at the end), holds one CPU path's parts, each with a scalar reference:
     fx__lce_row_kernels   one token's row of logits at a time (the benchmark's unfused peer);
     fx__lce_tile_kernels  the elementwise steps over a vocabulary-major tile of a chunk's
                           tokens (the fused pass), with AVX2 and AVX-512 twins as the above;
     fx__lce_tile_gemms    that pass's three float32 products, with an AVX-512 twin (lce.c
                           routes the products of a call: these, BLIS's or bfloat16 pairs). */
#ifndef FX_LCE_INTERNAL_H
#define FX_LCE_INTERNAL_H

#include "core/core.h"
#include "core/gemm_bf16.h"

/* The checks of p's sizes and options every call makes (FX_OK or FX_EINVAL), shared with
   the CUDA path. */
int fx__lce_check_params(const fx_lce *p);
/* fx__lce_check_params, and h, w and target given: what every call of the loss checks first. */
int fx__lce_check_inputs(const fx_lce *p, const float *h, const float *w, const int64_t *target);

/* fx_linear_cross_entropy for bfloat16 training (CPU): h and w are taken as bfloat16 values
   (float32 storage rounded as read, or bfloat16 storage), and the logits' gradient is rounded
   to bfloat16 before the dw, dh and dbias products, so every product has bfloat16 inputs;
   sums, softmax, loss and outputs stay float32. The pair route reads either storage; the
   float32 route (fx__lce_bf16_pairs() false) reads float32 storage only (bfloat16 storage:
   FX_EINVAL), whose values the caller has rounded, as its kernels do not round them. */
int fx__linear_cross_entropy_bf16(const fx_lce *p, fx__bf16_mat h, fx__bf16_mat w, const float *bias,
                                  const int64_t *target, float *loss, float *lse, float *dh, float *dw, float *dbias);
/* Whether fx__linear_cross_entropy_bf16 takes the pair route now (lce_dp below). */
bool fx__lce_bf16_pairs(void);

/* The running statistics of one token's logits row, folded tile by tile. */
typedef struct fx__lce_stat {
    float m;      /* max so far (-inf before the first tile) */
    double s;     /* sum of exp(z - m) */
    double sum_z; /* sum of z (label smoothing) */
} fx__lce_stat;

/* Per-row kernels over one row of a logits tile, z [n], in place.
   stats: z += bias (bias [n] or NULL), then z = cap tanh(z / cap) when cap > 0; folds z into st.
   prep:  the same transform without statistics (recomputed tiles).
   grad:  z (transformed logits) -> gradient w.r.t. the raw logits of the non-target terms:
          (a exp(z - lse) - b) (1 - (z/cap)^2 when cap > 0). */
typedef struct fx__lce_row_kernels {
    void (*stats)(float *z, int64_t n, const float *bias, float cap, fx__lce_stat *st);
    void (*prep)(float *z, int64_t n, const float *bias, float cap);
    void (*grad)(float *z, int64_t n, float lse, float a, float b, float cap);
} fx__lce_row_kernels;

extern const fx__lce_row_kernels fx__lce_row_kernels_scalar;
extern const fx__lce_row_kernels fx__lce_row_kernels_avx2;
extern const fx__lce_row_kernels fx__lce_row_kernels_avx512;


/* Kernels of the fused pass over one chunk of c tokens. A tile's logits, then gradients,
   are held vocabulary-major, zt [nj, ldz] (row j: entry j of every token), so that
   - the logits GEMM reads w [V, D] row by row as stored and packs only the chunk's h,
     transposed once per chunk into hT [D, ldh] (ldh >= c, a multiple of 16);
   - the per-token statistics and gradients are vectors across tokens;
   - the dw GEMM (rows of w's shape) and the dh GEMM both read zt rows directly.
   The elementwise steps:
   stats:  zt[j, :] = transform(zt[j, :] + bias[j]) (bias NULL: 0; cap as in fx__lce_row_kernels),
           then per token i: pm[i] = max_j, pz[i] = sum_j of the transformed values and
           ps[i] = sum_j exp(z - pm[i]) (exp(z) when pm[i] is -inf).
   prep:   the same transform, without statistics.
   grad:   zt[j, i] = keep[i] ? (a[i] exp(z - lse[i]) - b[i]) (1 - (z/cap)^2 when cap > 0) : 0.
   Every lane of a vector is computed alone, so a result does not depend on how rows or
   columns are grouped. */
typedef struct fx__lce_tile_kernels {
    void (*stats)(float *zt, int64_t nj, int64_t c, int64_t ldz, const float *bias, float cap, float *pm, float *ps,
                  float *pz);
    void (*prep)(float *zt, int64_t nj, int64_t c, int64_t ldz, const float *bias, float cap);
    void (*grad)(float *zt, int64_t nj, int64_t c, int64_t ldz, const float *lse, const float *a, const float *b,
                 const float *keep, float cap);
} fx__lce_tile_kernels;

extern const fx__lce_tile_kernels fx__lce_tile_kernels_scalar;
extern const fx__lce_tile_kernels fx__lce_tile_kernels_avx2;
extern const fx__lce_tile_kernels fx__lce_tile_kernels_avx512;


/* The fused pass's products, in the layout above:
   logits: zt[j, i] = sum_d w[j, d] hT[d, i], j < nj, i < c.
   dw:     dw[j, :] += sum_i zt[j, i] h[i, :], j < nj, i < c (h rows D apart).
   dh:     dh[i, d] = (accumulate ? dh[i, d] : 0) + sum_j zt[j, i] w[j, d], d in [d0, d1).
   dw and dh form each sum first and add it to the output last (errors grow with the calls,
   not with every term); the caller gives dh a few hundred rows of w per call. As above, a
   result does not depend on how rows or columns are grouped. */
typedef struct fx__lce_tile_gemms {
    void (*logits)(int64_t nj, int64_t c, int64_t D, const float *w, const float *hT, int64_t ldh, float *zt,
                   int64_t ldz);
    void (*dw)(int64_t nj, int64_t c, int64_t D, const float *zt, int64_t ldz, const float *h, float *dw);
    void (*dh)(int64_t nj, int64_t c, int64_t D, int64_t d0, int64_t d1, const float *zt, int64_t ldz,
               const float *w, float *dh, bool accumulate);
} fx__lce_tile_gemms;

extern const fx__lce_tile_gemms fx__lce_tile_gemms_scalar;
extern const fx__lce_tile_gemms fx__lce_tile_gemms_avx512;

/* The module's kernel table (docs/dispatch.md): the parts of one CPU path. */
typedef struct fx__lce_kernels {
    const char *name; /* what `flexc --version` prints */
    const fx__lce_row_kernels *row;
    const fx__lce_tile_kernels *tile;
    /* The fused pass's float32 products; NULL: BLIS's (the AVX2 path, which has none of its
       own). A bf16 call on a vdpbf16ps path takes the bfloat16 pairs (lce_dp.c) instead. */
    const fx__lce_tile_gemms *gemm;
} fx__lce_kernels;
extern const fx__lce_kernels fx__lce_kernels_scalar, fx__lce_kernels_avx2, fx__lce_kernels_avx512;
/* The table of a CPU path (the scalar one in a build with FLEXC_REFERENCE_KERNELS), and of the
   current one (fx_get_isa()). */
const fx__lce_kernels *fx__lce_kernels_for(fx_isa isa);
const fx__lce_kernels *fx__lce_kernels_now(void);
/* The row kernels of the current path, under the benchmark's name. */
static inline const fx__lce_row_kernels *fx__lce_row_kernels_now(void) { return fx__lce_kernels_now()->row; }

/* Which products a float32 call takes on the current CPU path: "lce kernels" (this module's
   own, fx__lce_tile_gemms) or "blas" (BLIS's, on the AVX2 path). */
const char *fx__lce_f32_products(void);

/* The three products of fx__linear_cross_entropy_bf16 on a tiled bfloat16 path t whose panels
   are packed pair by pair (t->kernel set, !t->a_rows: vdpbf16ps), lce_dp.c. A chunk's h is
   packed once (fx__lce_dp_pack_h) as the B panels of the logits and of dw; each call then packs
   its own panels of w or of the gradients g in the calling thread's part of the scratch and
   runs t's kernel over them. The contracts are the float32 tile kernels' (logits, dw, dh
   above, hT replaced by the packed h), every element one kernel sum per call whichever thread
   makes it; dh takes at most `rows` rows of w per call. */
typedef struct fx__lce_dp {
    const fx__bf16_tiled *t;
    int64_t c, D, rows;           /* the chunk's tokens (at most), h's width, rows of w per dh call */
    int64_t pd, pc;               /* pairs along D and along c */
    size_t hl_words, hw_words;    /* the packed h: the logits' B panels, dw's */
    size_t thr_words;             /* a thread's panels */
    int threads;                  /* threads with a part of the scratch */
    uint32_t *hl, *hw, *thr;      /* in the scratch (fx__lce_dp_bind) */
} fx__lce_dp;

/* The plan of chunks of up to c tokens on `threads` threads at most; its scratch, in words. */
fx__lce_dp fx__lce_dp_plan(const fx__bf16_tiled *t, int64_t c, int64_t D, int64_t rows, int threads);
size_t fx__lce_dp_words(const fx__lce_dp *d);
void fx__lce_dp_bind(fx__lce_dp *d, uint32_t *ws);
/* The chunk's h [c, D] (c at most the plan's), for the calls that follow. w: nj rows of the
   weights (D apart). */
void fx__lce_dp_pack_h(fx__lce_dp *d, fx__bf16_mat h, int64_t c);
void fx__lce_dp_logits(const fx__lce_dp *d, int64_t nj, fx__bf16_mat w, float *zt, int64_t ldz);
void fx__lce_dp_dw(const fx__lce_dp *d, int64_t nj, const float *g, int64_t ldz, float *dw);
void fx__lce_dp_dh(const fx__lce_dp *d, int64_t nj, int64_t d0, int64_t d1, const float *g, int64_t ldz,
                   fx__bf16_mat w, float *dh, bool accumulate);

#endif
