/* The library's AMX-BF16 micro-kernel (the object of src/core/gemm_bf16_amx.c, as built into
   libflexc) on a bare emulated machine: boot.S starts it; it checks that the CPU reports
   AMX-TILE and AMX-BF16 and that XCR0 holds the tile state, then calls fx__bf16_amx_kernel
   (between fx__bf16_amx_enter and fx__bf16_amx_leave) on random packed panels at whole and
   partial tiles, several lengths of k, strides past the tile and beta 0 (over NaN), 1 and -0.5.
   Each element of the tile must match the float64 sum of the same bfloat16 products within
   test_gemm_bf16.c's bound, 1e-5 * (sum |a b| + |beta c|); nothing outside the tile may
   change. The verdict goes to port 0xE9 (Bochs prints it), one
   line starting "PASS" or "FAIL" (or "SKIP" where the CPU lacks AMX).
   Freestanding: no libc (memcpy and friends come from tests/freestanding_mem.S). */
#include <stdint.h>

#include "core/gemm_bf16.h"

enum { MR = FX__AMX_MR, NR = FX__AMX_NR, MAX_PAIRS = 272, MAX_LDC = 48 };

/* Test data lives above the image, the page tables and the stack (boot.S). */
#define AREA ((unsigned char *)0x200000)

/* Called by boot.S. */
void fxt_guest_main(void);
void fxt_guest_exception(uint32_t vector, const uint64_t *frame);

static void out_char(char c)
{
    __asm__ volatile("outb %0, %1" : : "a"(c), "Nd"((uint16_t)0xE9));
}

static void out_str(const char *s)
{
    while (*s)
        out_char(*s++);
}

static void out_u64(uint64_t v)
{
    char buf[24];
    int n = 0;
    do
        buf[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n)
        out_char(buf[--n]);
}

static void cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4])
{
    __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
}

static uint64_t rng_state = 0x9E3779B97F4A7C15u;

static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* A random bfloat16 in [-1, 1): sign, exponent 2^-1 .. 2^-8, 7 random mantissa bits. */
static uint16_t rng_bf16(void)
{
    uint64_t r = rng_next();
    return (uint16_t)(((r & 1) << 15) | ((119 + (r >> 1) % 8) << 7) | ((r >> 8) & 0x7F));
}

static float bf16_to_f32(uint16_t h)
{
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)h << 16};
    return v.f;
}

static float rng_f32(void)
{
    return (float)((int64_t)(rng_next() >> 40) - (1 << 23)) / (float)(1 << 23);
}

static double fabs_d(double x)
{
    return x < 0 ? -x : x;
}

static uint32_t f32_bits(float f)
{
    union {
        float f;
        uint32_t u;
    } v = {.f = f};
    return v.u;
}

/* One kernel call; returns the largest error as a multiple of 1e-6 of its bound, or -1 after
   printing what failed. */
static int64_t check_call(int64_t pairs, int64_t mr, int64_t nr, int64_t ldc, float beta)
{
    uint32_t *a = (uint32_t *)AREA;
    uint32_t *b = a + MR * MAX_PAIRS;
    float *c = (float *)(b + NR * MAX_PAIRS), *c0 = c + (MR + 1) * MAX_LDC;
    for (int64_t i = 0; i < MR * pairs; i++)
        a[i] = rng_bf16() | (uint32_t)rng_bf16() << 16;
    for (int64_t i = 0; i < NR * pairs; i++)
        b[i] = rng_bf16() | (uint32_t)rng_bf16() << 16;
    const int64_t rows = mr + 1; /* one row past the tile: it must stay as it was */
    for (int64_t i = 0; i < rows * ldc; i++) {
        int in_tile = i / ldc < mr && i % ldc < nr;
        c0[i] = c[i] = beta == 0.0f && in_tile ? __builtin_nanf("") : rng_f32();
    }
    fx__bf16_amx_enter();
    fx__bf16_amx_kernel(pairs, a, b, beta, c, ldc, mr, nr);
    fx__bf16_amx_leave();
    double worst = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < ldc; j++) {
            const int64_t i = r * ldc + j;
            if (r >= mr || j >= nr) {
                if (f32_bits(c[i]) != f32_bits(c0[i])) {
                    out_str("FAIL: C outside the tile changed at row ");
                    out_u64((uint64_t)r), out_str(" column "), out_u64((uint64_t)j), out_str("\n");
                    return -1;
                }
                continue;
            }
            double acc = 0, mag = 0;
            for (int64_t p = 0; p < pairs; p++) {
                const uint32_t wa = a[fx__bf16_row_word(MR, r, p)], wb = b[p * NR + j];
                for (int h = 0; h < 32; h += 16) {
                    double prod = (double)bf16_to_f32((uint16_t)(wa >> h)) * bf16_to_f32((uint16_t)(wb >> h));
                    acc += prod, mag += fabs_d(prod);
                }
            }
            const double base = beta == 0.0f ? 0 : (double)beta * c0[i];
            const double err = fabs_d(c[i] - (acc + base)), bound = 1e-5 * (mag + fabs_d(base)) + 1e-30;
            if (!(err <= bound)) { /* NaN included */
                out_str("FAIL: pairs "), out_u64((uint64_t)pairs), out_str(" mr "), out_u64((uint64_t)mr);
                out_str(" nr "), out_u64((uint64_t)nr), out_str(" ldc "), out_u64((uint64_t)ldc);
                out_str(": C["), out_u64((uint64_t)r), out_str("]["), out_u64((uint64_t)j);
                out_str("] off by more than its bound (error/bound x 1e6: ");
                out_u64(err == err ? (uint64_t)(err / bound * 1e6) : UINT64_MAX), out_str(")\n");
                return -1;
            }
            if (err / bound > worst)
                worst = err / bound;
        }
    return (int64_t)(worst * 1e6);
}

void fxt_guest_main(void)
{
    uint32_t r[4];
    cpuid(7, 0, r);
    const int amx_bf16 = (r[3] >> 22) & 1, amx_tile = (r[3] >> 24) & 1;
    uint32_t xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if (!amx_bf16 || !amx_tile || (xcr0_lo & 0x60000) != 0x60000) {
        out_str("SKIP: the CPU reports no AMX-TILE/AMX-BF16, or XCR0 lacks the tile state\n");
        return;
    }
    /* (pairs, mr, nr, ldc): whole tiles, every tail of rows and columns, one k step, long k. */
    static const int16_t shapes[][4] = {{16, 32, 32, 32}, {32, 32, 32, 40}, {48, 31, 32, 33},
                                        {272, 32, 17, 20}, {16, 1, 1, 1},    {128, 16, 16, 16},
                                        {64, 17, 31, 48}, {16, 5, 9, 11}};
    static const float betas[] = {0.0f, 1.0f, -0.5f};
    int64_t worst = 0, calls = 0;
    for (unsigned s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (unsigned k = 0; k < sizeof betas / sizeof betas[0]; k++) {
            const int64_t w = check_call(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], betas[k]);
            if (w < 0)
                return;
            worst = w > worst ? w : worst;
            calls++;
        }
    out_str("PASS: "), out_u64((uint64_t)calls), out_str(" calls of fx__bf16_amx_kernel; largest error ");
    out_u64((uint64_t)worst), out_str(" millionths of its bound\n");
}

/* Called by boot.S on a CPU exception, with its vector and the stack it left: the error code
   (for the vectors that push one), then the faulting rip. */
void fxt_guest_exception(uint32_t vector, const uint64_t *frame)
{
    const int has_code = vector == 8 || (vector >= 10 && vector <= 14) || vector == 17 || vector == 21 ||
                         vector == 29 || vector == 30;
    out_str("FAIL: CPU exception "), out_u64(vector), out_str(" at rip ");
    out_u64(frame[has_code]), out_str("\n");
}
