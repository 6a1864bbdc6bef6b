/* The attention's bfloat16 kernels (src/attention/bf16_dp.h) built from SIMDe's portable
   definitions of the AVX-512 intrinsics, so that test_attention_backward runs the bfloat16
   backward's code on any CPU; the library's own build runs only where the CPU has
   vdpbf16ps. */
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <stdint.h>
#include <string.h>

/* Masked loads and stores, and the 32-to-16-bit truncation, which Debian's SIMDe (0.7.4)
   does not define: lane by lane through memory. */
static inline simde__m512 fxt_maskz_loadu_ps(simde__mmask16 m, const void *p)
{
    float t[16] = {0};
    for (int i = 0; i < 16; i++)
        if (m >> i & 1)
            memcpy(&t[i], (const char *)p + 4 * i, 4);
    return simde_mm512_loadu_ps(t);
}

static inline simde__m512i fxt_maskz_loadu_epi32(simde__mmask16 m, const void *p)
{
    return simde_mm512_castps_si512(fxt_maskz_loadu_ps(m, p));
}

static inline void fxt_mask_storeu_ps(void *p, simde__mmask16 m, simde__m512 x)
{
    float t[16];
    simde_mm512_storeu_ps(t, x);
    for (int i = 0; i < 16; i++)
        if (m >> i & 1)
            memcpy((char *)p + 4 * i, &t[i], 4);
}

static inline void fxt_mask_storeu_epi32(void *p, simde__mmask16 m, simde__m512i x)
{
    fxt_mask_storeu_ps(p, m, simde_mm512_castsi512_ps(x));
}

static inline simde__m256i fxt_cvtepi32_epi16(simde__m512i x)
{
    int32_t w[16];
    int16_t h[16];
    simde_mm512_storeu_si512(w, x);
    for (int i = 0; i < 16; i++)
        h[i] = (int16_t)(uint16_t)(uint32_t)w[i];
    return simde_mm256_loadu_si256(h);
}

#define _mm512_maskz_loadu_ps fxt_maskz_loadu_ps
#define _mm512_maskz_loadu_epi32 fxt_maskz_loadu_epi32
#define _mm512_mask_storeu_ps fxt_mask_storeu_ps
#define _mm512_mask_storeu_epi32 fxt_mask_storeu_epi32
#define _mm512_cvtepi32_epi16 fxt_cvtepi32_epi16

#define FX__ATTN16_TABLE fxt_attn16_kernels_simde
#define FX__A16_MASK simde__mmask16
#include "attention/bf16_dp.h"
