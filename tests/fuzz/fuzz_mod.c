/* libFuzzer target: the expression-mod compiler (src/attention/mod.c) on arbitrary strings.
   The first byte picks which captured tensors exist; the rest is the expression. Beyond "no
   crash, no out-of-bounds access, no undefined behaviour" it checks properties of every mod
   that compiles: a tile gives what single positions give, the derivative program runs and
   the tensors' gradient lands inside them, and a mask's block mask agrees with fx_mod_mask. */
#include "attention/mod_internal.h"
#include "attention/internal.h"
#include "core/fuzz_check.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static float bias[2 * 9] = {0.5f, -1, 2, 3, -4, 5, 6, 7, 8, 9, 10, 11, 12, -13, 14, 15, 16, 17};
static int64_t ids[3 * 5] = {0, 0, 1, 1, 2, 5, 5, 5, 6, 7, -3, 0, 9, 9, 9};
static int32_t small[4] = {-1, 0, 7, 1000};
static uint8_t flags[6] = {1, 0, 0, 1, 1, 0};

/* The device backend is left out of this target (no block mask here has a device copy). */
void fx__backend_block_mask_release(fx_block_mask *m);
void fx__backend_block_mask_release(fx_block_mask *m) { (void)m; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096)
        return 0;
    char *expr = malloc(size);
    FUZZ_CHECK(expr);
    memcpy(expr, data + 1, size - 1);
    expr[size - 1] = 0;
    static float gbias[2 * 9];
    fx_mod_tensor all[4] = {
        {.name = "bias", .dtype = FX_DT_F32, .ndim = 2, .shape = {2, 9}, .data = bias, .grad = gbias},
        {.name = "ids", .dtype = FX_DT_I64, .ndim = 3, .shape = {1, 3, 5}, .data = ids},
        {.name = "small", .dtype = FX_DT_I32, .ndim = 1, .shape = {4}, .data = small},
        {.name = "flags", .dtype = FX_DT_BOOL, .ndim = 4, .shape = {1, 2, 3, 1}, .data = flags},
    };
    fx_mod_tensor t[4];
    int nt = 0;
    for (int i = 0; i < 4; i++)
        if (data[0] & (1u << i))
            t[nt++] = all[i];
    fx_mod *m = NULL;
    int rc = fx_mod_compile(&m, expr, t, nt);
    free(expr);
    if (rc != FX_OK) {
        FUZZ_CHECK(rc == FX_EINVAL && m == NULL);
        return 0;
    }
    enum { NQ = 3, NK = 70, LD = 72 };
    static float s[NQ * LD], s0[NQ * LD], g[NQ * LD];
    for (int i = 0; i < NQ * LD; i++)
        s[i] = (float)((i * 7919) % 23) / 3.0f - 3.5f;
    memcpy(s0, s, sizeof s);
    if (fx_mod_is_mask(m)) {
        for (int i = 0; i < NQ; i++)
            for (int j = 0; j < NK; j++)
                (void)fx_mod_mask(1, 1, 5 + i, j, m);
        fx_block_mask *bm = NULL;
        if (fx_block_mask_create_mod(&bm, m, 1, 2, 40, 37, 8, 16) == FX_OK) {
            /* every position of the block mask (interval-classified or evaluated) against
               fx_mod_mask at that position */
            for (int64_t h = 0; h < 2; h++)
                for (int64_t qb = 0; qb < bm->nqb; qb++) {
                    int64_t r = fx__bm_row(bm, fx__bm_slot(bm, 0, h), qb);
                    bool seen[8][37] = {{false}};
                    for (int64_t e = bm->kv_ptr[r]; e < bm->kv_ptr[r + 1]; e++) {
                        int64_t kb = bm->kv_idx[e];
                        const uint64_t *bits = fx__bm_bits(bm, bm->kv_bits[e]);
                        for (int64_t i = 0; i < 8; i++)
                            for (int64_t j = 0; j < 16 && kb * 16 + j < 37; j++)
                                seen[i][kb * 16 + j] = !bits || fx__bm_test(bits, bm->bm_words, i, j);
                    }
                    for (int64_t i = 0; i < 8; i++)
                        for (int64_t kv = 0; kv < 37; kv++)
                            FUZZ_CHECK(seen[i][kv] == fx_mod_mask(0, h, qb * 8 + i, kv, m));
                }
            fx_block_mask_free(bm);
        }
    } else {
        fx_mod_score(s, LD, NQ, NK, 1, 1, 5, 2, m);
        for (int i = 0; i < NQ; i++)
            for (int j = 0; j < NK; j += 13) {
                float x = s0[i * LD + j];
                fx_mod_score(&x, 1, 1, 1, 1, 1, 5 + i, 2 + j, m);
                FUZZ_CHECK(memcmp(&x, &s[i * LD + j], sizeof x) == 0 || (isnan(x) && isnan(s[i * LD + j])));
            }
        for (int i = 0; i < NQ * LD; i++)
            g[i] = (i % 5) ? 1.0f : 0.0f;
        fx_mod_score_grad(s0, g, LD, NQ, NK, 1, 1, 5, 2, m);
        int64_t n = fx__mod_grad_elems(m);
        if (n) {
            FUZZ_CHECK(n == 18);
            double *part = calloc((size_t)n, sizeof(double));
            FUZZ_CHECK(part);
            fx__mod_grad_accum(m, part, s0, g, LD, NQ, NK, 1, 1, 5, 2);
            fx__mod_grad_reduce(m, part, 1);
            free(part);
        }
    }
    fx_mod_free(m);
    return 0;
}
