/* The AMX-BF16 kernel of the bfloat16 GEMM: a 32 x 32 tile of C as four 16 x 16 tiles, from an
   A panel packed row by row in blocks of 16 pairs (fx__bf16_pack_rows: each block 32 rows of
   16 words, its two 16-row tiles contiguous) and a B panel pair by pair (fx__bf16_pack_pairs:
   `pairs` rows of 32 words), `pairs` a multiple of 16 (a tile's 32 values of k). Built for
   CPUs with AMX and called only where fx__cpu_amx_bf16() says the CPU has it and the process
   may use it, between fx__bf16_amx_enter and fx__bf16_amx_leave. */
#include <immintrin.h>

#include "gemm_bf16.h"

/* ldtilecfg's operand (palette 1): bytes per row and rows of each tile register. */
typedef struct fx__amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} fx__amx_config;

/* tmm0-3: C's four 16 x 16 float tiles (rows 0-15 and 16-31, columns 0-15 and 16-31); tmm4-5:
   A's 16-row tiles of 16 pairs; tmm6-7: B's 16-column tiles of 16 pairs. All 16 rows of 64
   bytes. Loading the configuration costs about as much as a short tile's products: once per
   thread and GEMM, not per tile. */
void fx__bf16_amx_enter(void)
{
    /* In memory whatever the optimiser sees: GCC's _tile_loadconfig tells it of the first
       eight bytes read only, so a configuration built on the stack may lose its stores. */
    static const _Alignas(64) fx__amx_config cfg = {
        .palette = 1,
        .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
        .rows = {16, 16, 16, 16, 16, 16, 16, 16},
    };
    _tile_loadconfig(&cfg);
}

void fx__bf16_amx_leave(void) { _tile_release(); }

void fx__bf16_amx_kernel(int64_t pairs, const uint32_t *a, const uint32_t *b, float beta, float *C, int64_t ldc,
                         int64_t mr, int64_t nr)
{
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const size_t sa = FX__AMX_PAIRS * sizeof(uint32_t), sb = FX__AMX_NR * sizeof(uint32_t);
    for (int64_t p = 0; p < pairs; p += FX__AMX_PAIRS) {
        _tile_loadd(4, a + p * FX__AMX_MR, sa);
        _tile_loadd(5, a + p * FX__AMX_MR + 16 * FX__AMX_PAIRS, sa);
        _tile_loadd(6, b + p * FX__AMX_NR, sb);
        _tile_loadd(7, b + p * FX__AMX_NR + 16, sb);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    if (beta == 0.0f && mr == FX__AMX_MR && nr == FX__AMX_NR) { /* a whole tile overwritten: straight into C */
        const size_t sc = (size_t)ldc * sizeof(float);
        _tile_stored(0, C, sc);
        _tile_stored(1, C + 16, sc);
        _tile_stored(2, C + 16 * ldc, sc);
        _tile_stored(3, C + 16 * ldc + 16, sc);
        return;
    }
    float tile[FX__AMX_MR * FX__AMX_NR];
    const size_t st = FX__AMX_NR * sizeof(float);
    _tile_stored(0, tile, st);
    _tile_stored(1, tile + 16, st);
    _tile_stored(2, tile + 16 * FX__AMX_NR, st);
    _tile_stored(3, tile + 16 * FX__AMX_NR + 16, st);
    fx__bf16_tile_store(tile, FX__AMX_NR, beta, C, ldc, mr, nr);
}
