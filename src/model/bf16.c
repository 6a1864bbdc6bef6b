/* bfloat16 training (--dtype bf16): the weights' bfloat16 copy and the scratch of the bf16
   matrix products. The products themselves go through fx__mm (model_internal.h); the copy
   is refreshed by fx__model_adamw in its pass over the parameters. */
#include "model_internal.h"

#include "core/gemv.h"

/* Floats per conversion task of fx__model_bf16_sync: fixed, so the work is shared the same
   way at any thread count (each element's value depends on nothing else anyway). */
enum { FX__BF16_SYNC_BLOCK = 1 << 14 };

void fx__model_bf16_sync(fx__model *m)
{
    if (!m->params16)
        return;
    const size_t P = m->lay.total, nblk = (P + FX__BF16_SYNC_BLOCK - 1) / FX__BF16_SYNC_BLOCK;
    const float *p = m->params;
    uint16_t *h = m->params16;
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nblk; b++) {
        size_t i = b * FX__BF16_SYNC_BLOCK, n = P - i < FX__BF16_SYNC_BLOCK ? P - i : FX__BF16_SYNC_BLOCK;
        fx__f32_to_bf16_n(h + i, p + i, (int64_t)n);
    }
}

/* fx__gemm_bf16's scratch for the three products of a projection of I inputs and O outputs
   over N tokens: forward [N, I] x [O, I]^T, d(input) [N, O] x [O, I], d(weight) [N, O]^T x [N, I]. */
static size_t fx__bf16_proj_ws(size_t N, size_t I, size_t O)
{
    size_t fwd = fx__gemm_bf16_ws((int64_t)N, (int64_t)O, (int64_t)I);
    size_t dx = fx__gemm_bf16_ws((int64_t)N, (int64_t)I, (int64_t)O);
    size_t dw = fx__gemm_bf16_ws((int64_t)O, (int64_t)I, (int64_t)N);
    size_t w = fwd > dx ? fwd : dx;
    return w > dw ? w : dw;
}

/* The largest scratch any product of a step needs: the four projections (q, k and v as one,
   the attention's output, gate and up as one, down), or the loss's rounded input [N, C] and
   widened head [V, C]. */
/* Over a mapped base (map_bf16): fx__linear_bf16's scratch for the products of the layer (q, k,
   v and gate, up as one product each, or apart: the larger) and of the loss's chunks of rows
   against the head. */
size_t fx__model_bf16_map_ws_floats(const fx_model_config *c, int64_t N)
{
    const int64_t C = c->dim, F = c->ffn, V = c->vocab, QD = c->heads * c->head_dim,
                  KD = c->kv_heads * c->head_dim;
    const int64_t proj[][2] = {{C, QD + 2 * KD}, {QD, C}, {C, 2 * F}, {F, C}};
    size_t need = fx__linear_bf16_ws(fx__loss_chunk(N, V), C, V);
    for (size_t i = 0; i < sizeof proj / sizeof proj[0]; i++) {
        const size_t w = fx__linear_bf16_ws(N, proj[i][0], proj[i][1]);
        need = w > need ? w : need;
    }
    return need;
}

size_t fx__model_bf16_ws_floats(const fx__model *m, int64_t B, int64_t T)
{
    const fx_model_config *c = &m->c;
    if (m->map_bf16)
        return fx__model_bf16_map_ws_floats(c, B * T);
    size_t N = (size_t)(B * T), C = (size_t)c->dim, F = (size_t)c->ffn, V = (size_t)c->vocab;
    size_t QD = (size_t)(c->heads * c->head_dim), KD = (size_t)(c->kv_heads * c->head_dim);
    const size_t proj[][2] = {{C, QD + 2 * KD}, {QD, C}, {C, 2 * F}, {F, C}};
    size_t need = N * C + V * C;
    for (size_t i = 0; i < sizeof proj / sizeof proj[0]; i++) {
        size_t w = fx__bf16_proj_ws(N, proj[i][0], proj[i][1]);
        need = w > need ? w : need;
    }
    return need;
}

int fx__model_bf16_ws_ensure(fx__model *m)
{
    if (!m->params16 && !m->map_bf16)
        return FX_OK;
    size_t need = fx__model_bf16_ws_floats(m, m->B, m->T);
    if (m->bf16_ws && m->bf16_ws_floats >= need)
        return FX_OK;
    fx__free(m->bf16_ws);
    m->bf16_ws_floats = 0;
    if (!(m->bf16_ws = fx__alloc_huge(need * sizeof(float))))
        return fx__error(FX_ENOMEM, "bf16 training: cannot allocate %zu bytes of scratch", need * sizeof(float));
    m->bf16_ws_floats = need;
    return FX_OK;
}

/* ---- the mapped head, packed once ------------------------------------------------------------ */

/* The head's two packed forms on path t: E^T [C, V] whole (the logits), then E [V, C] piece by
   piece of FX__BF16_ROWS rows (d(x), as fx__linear_bf16_t sums it). */
static size_t head16_fwd_words(const fx__bf16_tiled *t, int64_t C, int64_t V)
{
    return fx__bf16_packed_b_words(t, V, C);
}

static size_t head16_piece_words(const fx__bf16_tiled *t, int64_t C, int64_t V)
{
    return fx__bf16_packed_b_words(t, C, V < FX__BF16_ROWS ? V : FX__BF16_ROWS);
}

/* The tiled path every product of the loss takes for chunks of nr rows (fx__linear_bf16's
   pieces of the head: the logits' [nr, R] x [R, C]^T and d(x)'s [nr, R] x [R, C], R the
   pieces' two lengths), or NULL. */
static const fx__bf16_tiled *head16_route(int64_t nr, int64_t C, int64_t V)
{
    const int64_t R = V < FX__BF16_ROWS ? V : FX__BF16_ROWS, last = V - (V - 1) / FX__BF16_ROWS * FX__BF16_ROWS;
    const fx__bf16_tiled *t = fx__gemm_bf16_tiled_route(nr, R, C);
    if (!t || t != fx__gemm_bf16_tiled_route(nr, last, C) || t != fx__gemm_bf16_tiled_route(nr, C, R) ||
        t != fx__gemm_bf16_tiled_route(nr, C, last))
        return NULL;
    return t;
}

/* Bytes of the packed head for a loss in chunks of `rows` rows (0: not packed). */
static size_t head16_bytes(const fx_model_config *c, int64_t rows)
{
    const int64_t C = c->dim, V = c->vocab, pieces = (V + FX__BF16_ROWS - 1) / FX__BF16_ROWS;
    const fx__bf16_tiled *t = head16_route(rows, C, V);
    if (!t)
        return 0;
    const size_t bytes = (head16_fwd_words(t, C, V) + (size_t)pieces * head16_piece_words(t, C, V)) * sizeof(uint32_t);
    return bytes <= FX__HEAD16_MAX_BYTES ? bytes : 0;
}

size_t fx__model_head16_bytes(const fx_model_config *c, int64_t N)
{
    return head16_bytes(c, fx__loss_chunk(N, c->vocab));
}

/* m->head16 for chunks of nr rows of a loss whose chunks are `rows` long: packed at the first
   call (or again after the CPU's path changed); NULL where the loss takes fx__linear_bf16. */
static const uint32_t *head16_of(fx__model *m, const void *w, fx_dtype dt, int64_t nr, int64_t rows)
{
    const int64_t C = m->c.dim, V = m->c.vocab;
    const fx__bf16_tiled *t = head16_route(nr, C, V);
    if (!t)
        return NULL;
    if (m->head16 && m->head16_path == t)
        return m->head16;
    const size_t bytes = head16_bytes(&m->c, rows);
    fx__free(m->head16);
    m->head16 = NULL, m->head16_path = NULL;
    if (!bytes || !(m->head16 = fx__alloc(bytes)))
        return NULL; /* packed again each call instead */
    const fx__bf16_mat E = dt == FX_DT_BF16 ? fx__bf16_of(w) : fx__bf16_of_f32(w);
    fx__bf16_pack_b(t, m->head16, true, V, C, E, C);
    uint32_t *piece = m->head16 + head16_fwd_words(t, C, V);
    for (int64_t r0 = 0; r0 < V; r0 += FX__BF16_ROWS, piece += head16_piece_words(t, C, V)) {
        const int64_t R = V - r0 < FX__BF16_ROWS ? V - r0 : FX__BF16_ROWS;
        fx__bf16_pack_b(t, piece, false, C, R, fx__bf16_mat_at(E, r0 * C), C);
    }
    m->head16_path = t;
    return m->head16;
}

void fx__model_head16_logits(fx__model *m, float *lg, const float *x, const void *w, fx_dtype dt, int64_t nr,
                             int64_t rows)
{
    const int64_t C = m->c.dim, V = m->c.vocab;
    const uint32_t *h = head16_of(m, w, dt, nr, rows);
    if (!h) {
        fx__linear_bf16(lg, V, x, w, dt, nr, C, V, false, m->bf16_ws);
        return;
    }
    /* One product over all of V: each logit summed over C in order, as in the pieces. */
    fx__gemm_bf16_tiled_b(m->head16_path, false, nr, V, C, fx__bf16_of_f32(x), C, h, 0.0f, lg, V,
                          (uint32_t *)m->bf16_ws);
}

void fx__model_head16_dx(fx__model *m, float *dx, const float *dz, const void *w, fx_dtype dt, int64_t nr,
                         int64_t rows)
{
    const int64_t C = m->c.dim, V = m->c.vocab;
    const uint32_t *h = head16_of(m, w, dt, nr, rows);
    if (!h) {
        fx__linear_bf16_t(dx, dz, V, w, dt, nr, C, V, false, m->bf16_ws);
        return;
    }
    const fx__bf16_tiled *t = m->head16_path;
    const uint32_t *piece = h + head16_fwd_words(t, C, V);
    for (int64_t r0 = 0; r0 < V; r0 += FX__BF16_ROWS, piece += head16_piece_words(t, C, V)) {
        const int64_t R = V - r0 < FX__BF16_ROWS ? V - r0 : FX__BF16_ROWS;
        fx__gemm_bf16_tiled_b(t, false, nr, C, R, fx__bf16_of_f32(dz + r0), V, piece, r0 ? 1.0f : 0.0f, dx, C,
                              (uint32_t *)m->bf16_ws);
    }
}

int fx__model_set_bf16(fx__model *m, bool on)
{
    if (!on) {
        fx__free(m->params16);
        fx__free(m->bf16_ws);
        fx__free(m->head16);
        m->params16 = NULL, m->bf16_ws = NULL, m->bf16_ws_floats = 0, m->head16 = NULL, m->head16_path = NULL;
        m->map_bf16 = false;
        return FX_OK;
    }
    /* A mapped base (adapters on a frozen file): its rows are read as bfloat16 in place, so
       its matrices must be BF16, or F32 (rounded as read); F16 values are not bfloat16 ones. */
    if (fx__model_on_map(m)) {
        for (size_t i = 0; i < m->lay.n; i++)
            if (m->lay.t[i].ndim == 2 && m->mapped->t[i].dtype == FX_DT_F16)
                return fx__error(FX_EUNSUPPORTED, "bf16 products over a mapped base read its rows as bfloat16: "
                                 "%s is F16 (train it in f32, or convert the model to BF16)", m->lay.t[i].name);
        m->map_bf16 = true;
        return m->acts ? fx__model_bf16_ws_ensure(m) : FX_OK;
    }
    /* Sharded training keeps each layer's parameters in a buffer of its own, which a flat
       copy would not follow. */
    if (m->hooks.layer_params)
        return fx__error(FX_EUNSUPPORTED, "bf16 matrix products need the flat parameter buffer (not sharded training)");
    if (!m->params16 && !(m->params16 = fx__alloc_huge(m->lay.total * sizeof(uint16_t))))
        return fx__error(FX_ENOMEM, "bf16 training: cannot allocate the weights' bfloat16 copy");
    fx__model_bf16_sync(m);
    return m->acts ? fx__model_bf16_ws_ensure(m) : FX_OK;
}
