/* Dtype names and sizes, and conversions to and from float32. Elements are read and written
   byte by byte in little-endian order, so any alignment and any host byte order work (the
   compiler turns the byte loads into plain loads on x86). */
#include "st_internal.h"

#include <math.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtypes[FX_DT_COUNT] = {
    [FX_DT_BOOL] = {"BOOL", 1},   [FX_DT_U8] = {"U8", 1},     [FX_DT_I8] = {"I8", 1},
    [FX_DT_I16] = {"I16", 2},     [FX_DT_U16] = {"U16", 2},   [FX_DT_F16] = {"F16", 2},
    [FX_DT_BF16] = {"BF16", 2},   [FX_DT_I32] = {"I32", 4},   [FX_DT_U32] = {"U32", 4},
    [FX_DT_F32] = {"F32", 4},     [FX_DT_F64] = {"F64", 8},   [FX_DT_I64] = {"I64", 8},
    [FX_DT_U64] = {"U64", 8},     [FX_DT_F8_E4M3] = {"F8_E4M3", 1}, [FX_DT_F8_E5M2] = {"F8_E5M2", 1},
};

static bool dtype_ok(fx_dtype dt) { return (unsigned)dt < FX_DT_COUNT; }

size_t fx_dtype_size(fx_dtype dt) { return dtype_ok(dt) ? dtypes[dt].size : 0; }

const char *fx_dtype_name(fx_dtype dt) { return dtype_ok(dt) ? dtypes[dt].name : NULL; }

int fx_dtype_from_name(fx_dtype *out, const char *name)
{
    if (!out || !name)
        return fx__error(FX_EINVAL, "%s is NULL", !out ? "out" : "name");
    for (int i = 0; i < FX_DT_COUNT; i++) {
        if (!strcmp(name, dtypes[i].name)) {
            *out = (fx_dtype)i;
            return FX_OK;
        }
    }
    char q[FX__ST_QUOTE_CAP];
    return fx__error(FX_EINVAL, "unknown dtype %s", fx__st_quote(q, name));
}

int64_t fx_tensor_numel(const fx_tensor_view *t)
{
    if (!t || t->ndim < 0 || t->ndim > FX_MAX_DIMS)
        return -1;
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] < 0 || __builtin_mul_overflow(n, t->shape[d], &n))
            return -1;
    return n;
}

/* ---- scalar conversions ------------------------------------------------------------------ */

static float f32_from_bits(uint32_t b)
{
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

static uint32_t f32_bits(float x)
{
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

float fx_bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

uint16_t fx_f32_to_bf16(float x)
{
    uint32_t b = f32_bits(x);
    if ((b & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((b >> 16) | 0x40); /* NaN: quiet it; truncation could make it Inf */
    /* Round to nearest even on the 16 dropped bits; a carry into the exponent is right,
       up to and including overflow to Inf. */
    return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

float fx_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f)
        return f32_from_bits(sign | 0x7f800000u | man << 13);
    if (exp == 0) {
        float v = (float)man * 0x1p-24f; /* subnormal: exact */
        return sign ? -v : v;
    }
    return f32_from_bits(sign | (exp + 112u) << 23 | man << 13);
}

uint16_t fx_f32_to_f16(float x)
{
    uint32_t b = f32_bits(x), a = b & 0x7fffffffu;
    uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN, quiet */
    if (a >= 0x477ff000u)                                       /* >= 65520 rounds to Inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) {                                     /* >= 2^-14: normal */
        uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
        return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
    }
    uint32_t e = a >> 23;
    if (e < 102) /* below 2^-25: rounds to zero */
        return sign;
    /* Subnormal result: the significand shifted to units of 2^-24, rounded to nearest even.
       A round up to 0x400 is the smallest normal, which is the right encoding. */
    uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    q += rem > half || (rem == half && (q & 1u));
    return (uint16_t)(sign | q);
}

/* float8 e4m3fn: bias 7, no infinities, S.1111.111 is NaN, largest 448. */
static float f8e4m3_to_f32(uint8_t v)
{
    unsigned exp = (v >> 3) & 0xfu, man = v & 7u;
    float mag;
    if (exp == 15 && man == 7)
        mag = NAN;
    else if (exp == 0)
        mag = ldexpf((float)man, -9);
    else
        mag = ldexpf((float)(8 + man), (int)exp - 10);
    return (v & 0x80) ? -mag : mag;
}

/* float8 e5m2 is the top byte of a float16. */
static float f8e5m2_to_f32(uint8_t v) { return fx_f16_to_f32((uint16_t)(v << 8)); }

/* ---- bulk conversions ---------------------------------------------------------------------- */

static uint16_t ld16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t ld32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t ld64(const unsigned char *p) { return ld32(p) | (uint64_t)ld32(p + 4) << 32; }
static void st16(unsigned char *p, uint16_t v) { p[0] = (unsigned char)v, p[1] = (unsigned char)(v >> 8); }
static void st64(unsigned char *p, uint64_t v)
{
    for (int k = 0; k < 8; k++)
        p[k] = (unsigned char)(v >> 8 * k);
}

/* Element-wise: threads only split the range, so any thread count gives the same bits. */
#define FX__ST_PAR_MIN 65536

int fx_tensor_to_f32(float *dst, size_t n, const fx_tensor_view *t)
{
    if (!t)
        return fx__error(FX_EINVAL, "tensor is NULL");
    char q[FX__ST_QUOTE_CAP];
    const char *nm = fx__st_quote(q, t->name ? t->name : "(unnamed)");
    if (!dtype_ok(t->dtype))
        return fx__error(FX_EINVAL, "tensor %s: dtype %d is not a dtype", nm, (int)t->dtype);
    int64_t numel = fx_tensor_numel(t);
    if (numel < 0)
        return fx__error(FX_EINVAL, "tensor %s: ndim %d or its shape is out of range", nm, t->ndim);
    if ((uint64_t)numel != (uint64_t)n)
        return fx__error(FX_EINVAL, "tensor %s: n = %zu but the tensor has %lld elements", nm, n,
                         (long long)numel);
    size_t es = dtypes[t->dtype].size;
    if ((uint64_t)numel > SIZE_MAX / es || t->nbytes != (size_t)numel * es)
        return fx__error(FX_EINVAL, "tensor %s: nbytes = %zu does not match %lld elements of %s", nm,
                         t->nbytes, (long long)numel, dtypes[t->dtype].name);
    if (n > 0 && (!dst || !t->data))
        return fx__error(FX_EINVAL, "tensor %s: %s is NULL", nm, !dst ? "dst" : "data");
    if (fx__bytes_overlap(dst, n * sizeof(float), t->data, t->nbytes))
        return fx__error(FX_EINVAL, "tensor %s: dst overlaps the tensor's data", nm);
    const unsigned char *p = t->data;
    int64_t m = (int64_t)n;
    switch (t->dtype) {
    case FX_DT_F32:
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        if (n > 0)
            memcpy(dst, p, n * sizeof(float));
#else
        for (int64_t i = 0; i < m; i++)
            dst[i] = f32_from_bits(ld32(p + 4 * i));
#endif
        break;
    case FX_DT_F64:
#pragma omp parallel for schedule(static) if (m >= FX__ST_PAR_MIN)
        for (int64_t i = 0; i < m; i++) {
            uint64_t b = ld64(p + 8 * i);
            double d;
            memcpy(&d, &b, sizeof d);
            dst[i] = (float)d;
        }
        break;
    case FX_DT_F16:
#pragma omp parallel for schedule(static) if (m >= FX__ST_PAR_MIN)
        for (int64_t i = 0; i < m; i++)
            dst[i] = fx_f16_to_f32(ld16(p + 2 * i));
        break;
    case FX_DT_BF16:
#pragma omp parallel for schedule(static) if (m >= FX__ST_PAR_MIN)
        for (int64_t i = 0; i < m; i++)
            dst[i] = fx_bf16_to_f32(ld16(p + 2 * i));
        break;
    case FX_DT_F8_E4M3:
        for (int64_t i = 0; i < m; i++)
            dst[i] = f8e4m3_to_f32(p[i]);
        break;
    case FX_DT_F8_E5M2:
        for (int64_t i = 0; i < m; i++)
            dst[i] = f8e5m2_to_f32(p[i]);
        break;
    default:
        return fx__error(FX_EUNSUPPORTED, "tensor %s: converting %s to float32 is not supported (F32, "
                         "F64, F16, BF16, F8_E4M3, F8_E5M2 are)", nm, dtypes[t->dtype].name);
    }
    return FX_OK;
}

int fx_f32_to_dtype(void *dst, fx_dtype dtype, const float *src, size_t n)
{
    if (n > 0 && (!dst || !src))
        return fx__error(FX_EINVAL, "%s is NULL", !dst ? "dst" : "src");
    if (!dtype_ok(dtype))
        return fx__error(FX_EINVAL, "dtype %d is not a dtype", (int)dtype);
    unsigned char *p = dst;
    if (n > INT64_MAX / 8)
        return fx__error(FX_EINVAL, "n = %zu is too large", n);
    if (fx__bytes_overlap(dst, n * dtypes[dtype].size, src, n * sizeof(float)))
        return fx__error(FX_EINVAL, "dst overlaps src");
    int64_t m = (int64_t)n;
    switch (dtype) {
    case FX_DT_F32:
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        if (n > 0)
            memmove(dst, src, n * sizeof(float));
#else
        for (int64_t i = 0; i < m; i++)
            for (int k = 0; k < 4; k++)
                p[4 * i + k] = (unsigned char)(f32_bits(src[i]) >> 8 * k);
#endif
        break;
    case FX_DT_F64:
#pragma omp parallel for schedule(static) if (m >= FX__ST_PAR_MIN)
        for (int64_t i = 0; i < m; i++) {
            double d = src[i];
            uint64_t b;
            memcpy(&b, &d, sizeof b);
            st64(p + 8 * i, b);
        }
        break;
    case FX_DT_F16:
#pragma omp parallel for schedule(static) if (m >= FX__ST_PAR_MIN)
        for (int64_t i = 0; i < m; i++)
            st16(p + 2 * i, fx_f32_to_f16(src[i]));
        break;
    case FX_DT_BF16:
#pragma omp parallel for schedule(static) if (m >= FX__ST_PAR_MIN)
        for (int64_t i = 0; i < m; i++)
            st16(p + 2 * i, fx_f32_to_bf16(src[i]));
        break;
    default:
        return fx__error(FX_EUNSUPPORTED, "converting float32 to %s is not supported (F32, F64, F16, "
                         "BF16 are)", dtypes[dtype].name);
    }
    return FX_OK;
}
