/* safetensors conversions: dtype helpers, float16 / bfloat16 / float8 / float64 <-> float32
   against independent references (exhaustive where the domain is small), round to nearest
   even, NaN and infinity, unaligned buffers, and thread-count independence. */
#include "harness.h"

/* ---- references ------------------------------------------------------------------------------- */

static float bits_f32(uint32_t b)
{
    float x;
    memcpy(&x, &b, 4);
    return x;
}

static uint32_t f32_bits(float x)
{
    uint32_t b;
    memcpy(&b, &x, 4);
    return b;
}

/* float16 from its fields, in double: the definition, not bit tricks. */
static double ref_f16_value(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double mag = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -mag : mag;
}

/* Nearest float16 to x by search over all finite magnitudes, ties to the even pattern; 65536
   stands for infinity (the next step after 65504), which makes overflow fall out of the same
   rule. */
static double mags[0x7c01];
static void ref_init(void)
{
    for (int h = 0; h < 0x7c00; h++)
        mags[h] = ref_f16_value((uint16_t)h);
    mags[0x7c00] = 65536.0;
}

static uint16_t ref_f32_to_f16(float x)
{
    if (isnan(x))
        return 0x7e00; /* any NaN; compared as "is NaN" */
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs((double)x);
    if (a >= 65536.0)
        return sign | 0x7c00;
    int lo = 0, hi = 0x7c00; /* mags[lo] <= a < mags[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (mags[mid] <= a)
            lo = mid;
        else
            hi = mid;
    }
    double dl = a - mags[lo], dh = mags[hi] - a;
    int pick = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
    return (uint16_t)(sign | pick);
}

/* Nearest bfloat16: the two candidates around x compared in double, ties to even. */
static uint16_t ref_f32_to_bf16(float x)
{
    uint32_t b = f32_bits(x);
    uint32_t sign = b & 0x80000000u, a = b & 0x7fffffffu;
    uint32_t lo = a & 0xffff0000u, hi = lo + 0x10000u;
    double v = fabs((double)x), vl = fabs((double)bits_f32(lo));
    double vh = hi >= 0x7f800000u ? ldexp(1.0, 128) : fabs((double)bits_f32(hi));
    double dl = v - vl, dh = vh - v;
    uint32_t pick = dl < dh ? lo : dh < dl ? hi : ((lo >> 16) % 2 == 0 ? lo : hi);
    return (uint16_t)((sign | pick) >> 16);
}

static double ref_e4m3(uint8_t v)
{
    int e = (v >> 3) & 15, m = v & 7;
    double mag = (e == 15 && m == 7) ? NAN : e == 0 ? m / 512.0 : (1 + m / 8.0) * ldexp(1, e - 7);
    return (v & 0x80) ? -mag : mag;
}

static double ref_e5m2(uint8_t v)
{
    int e = (v >> 2) & 31, m = v & 3;
    double mag = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? m / 4.0 * ldexp(1, -14) : (1 + m / 4.0) * ldexp(1, e - 15);
    return (v & 0x80) ? -mag : mag;
}

static bool same_f16(uint16_t got, uint16_t want)
{
    bool gn = (got & 0x7c00) == 0x7c00 && (got & 0x3ff), wn = (want & 0x7c00) == 0x7c00 && (want & 0x3ff);
    return gn || wn ? gn && wn : got == want;
}

static bool same_bf16(uint16_t got, uint16_t want)
{
    bool gn = (got & 0x7f80) == 0x7f80 && (got & 0x7f), wn = (want & 0x7f80) == 0x7f80 && (want & 0x7f);
    return gn || wn ? gn && wn : got == want;
}

/* ---- dtype helpers ------------------------------------------------------------------------------ */

static void test_dtype_helpers(void)
{
    static const struct {
        fx_dtype dt;
        const char *name;
        size_t size;
    } want[] = {
        {FX_DT_BOOL, "BOOL", 1}, {FX_DT_U8, "U8", 1},     {FX_DT_I8, "I8", 1},     {FX_DT_I16, "I16", 2},
        {FX_DT_U16, "U16", 2},   {FX_DT_F16, "F16", 2},   {FX_DT_BF16, "BF16", 2}, {FX_DT_I32, "I32", 4},
        {FX_DT_U32, "U32", 4},   {FX_DT_F32, "F32", 4},   {FX_DT_F64, "F64", 8},   {FX_DT_I64, "I64", 8},
        {FX_DT_U64, "U64", 8},   {FX_DT_F8_E4M3, "F8_E4M3", 1}, {FX_DT_F8_E5M2, "F8_E5M2", 1},
    };
    FXT_EQ_INT(sizeof want / sizeof want[0], FX_DT_COUNT);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        FXT_EQ_STR(fx_dtype_name(want[i].dt), want[i].name);
        FXT_EQ_INT(fx_dtype_size(want[i].dt), want[i].size);
        fx_dtype got = (fx_dtype)-1;
        FXT_OK(fx_dtype_from_name(&got, want[i].name));
        FXT_EQ_INT(got, want[i].dt);
    }
    fx_dtype keep = FX_DT_U8;
    FXT_STATUS(fx_dtype_from_name(&keep, "f32"), FX_EINVAL, "unknown dtype 'f32'");
    FXT_STATUS(fx_dtype_from_name(&keep, "F32\n"), FX_EINVAL, "unknown dtype 'F32\\x0a'");
    FXT_STATUS(fx_dtype_from_name(&keep, ""), FX_EINVAL, "unknown dtype");
    FXT_STATUS(fx_dtype_from_name(NULL, "F32"), FX_EINVAL, "out is NULL");
    FXT_EQ_INT(keep, FX_DT_U8);
    FXT_EQ_INT(fx_dtype_size((fx_dtype)FX_DT_COUNT), 0);
    FXT_EQ_INT(fx_dtype_size((fx_dtype)-1), 0);
    FXT_CHECK(fx_dtype_name((fx_dtype)99) == NULL);

    fx_tensor_view t = {.ndim = 0};
    FXT_EQ_INT(fx_tensor_numel(&t), 1);
    t = (fx_tensor_view){.ndim = 3, .shape = {2, 3, 4}};
    FXT_EQ_INT(fx_tensor_numel(&t), 24);
    t.shape[1] = 0;
    FXT_EQ_INT(fx_tensor_numel(&t), 0);
    t = (fx_tensor_view){.ndim = 2, .shape = {INT64_MAX, 2}};
    FXT_EQ_INT(fx_tensor_numel(&t), -1);
    t = (fx_tensor_view){.ndim = 1, .shape = {-1}};
    FXT_EQ_INT(fx_tensor_numel(&t), -1);
    t.ndim = 9;
    FXT_EQ_INT(fx_tensor_numel(&t), -1);
    FXT_EQ_INT(fx_tensor_numel(NULL), -1);
}

/* ---- float16 --------------------------------------------------------------------------------- */

static void test_f16_decode_exhaustive(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float got = fx_f16_to_f32((uint16_t)h);
        double want = ref_f16_value((uint16_t)h);
        bool ok = isnan(want) ? isnan(got) : (double)got == want && !signbit(got) == !signbit(want);
        if (!ok && bad++ < 5)
            FXT_FAIL("f16 0x%04x -> %.9g, expected %.9g", h, (double)got, want);
        /* Every non-NaN float16 comes back exactly; NaN stays NaN with its sign. */
        uint16_t back = fx_f32_to_f16(got);
        if (!isnan(want) && back != h && bad++ < 5)
            FXT_FAIL("f16 0x%04x -> f32 -> 0x%04x", h, back);
        if (isnan(want) && (!same_f16(back, 0x7e00) || (back & 0x8000) != (h & 0x8000)) && bad++ < 5)
            FXT_FAIL("f16 NaN 0x%04x -> f32 -> 0x%04x", h, back);
    }
    FXT_EQ_INT(bad, 0);
}

static void test_f16_encode_rne(void)
{
    /* Hand-checked edge cases. */
    static const struct {
        float x;
        uint16_t h;
    } cases[] = {
        {0.0f, 0x0000}, {-0.0f, 0x8000}, {1.0f, 0x3c00}, {-2.0f, 0xc000}, {65504.0f, 0x7bff},
        {65519.99f, 0x7bff},               /* below the midpoint to 65536: stays finite */
        {65520.0f, 0x7c00},                /* the midpoint: ties to even = infinity */
        {1e9f, 0x7c00}, {-1e9f, 0xfc00}, {INFINITY, 0x7c00}, {-INFINITY, 0xfc00},
        {0x1p-24f, 0x0001},                /* smallest subnormal */
        {0x1p-25f, 0x0000},                /* half of it: tie, to even (zero) */
        {0x1.8p-25f, 0x0001},              /* 0.75 of it: up */
        {0x1.8p-24f, 0x0002},              /* 1.5 units: tie, to even (2) */
        {0x1.4p-23f, 0x0002},              /* 2.5 units: tie, to even (2) */
        {0x1.ffcp-15f, 0x0400},            /* rounds up into the smallest normal */
        {0x1p-14f, 0x0400},
        {1.0f + 0x1p-11f, 0x3c00},         /* tie between 1 and 1+2^-10: even is 1 */
        {1.0f + 0x1.8p-10f, 0x3c02},       /* tie between 1+2^-10 and 1+2^-9: even is 1+2^-9 */
        {1.0f + 0x1.02p-11f, 0x3c01},      /* just above the tie: up */
        {0x1p-30f, 0x0000}, {-0x1p-30f, 0x8000}, {0x1p-149f, 0x0000},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = fx_f32_to_f16(cases[i].x);
        if (got != cases[i].h && bad++ < 10)
            FXT_FAIL("f16(%a) = 0x%04x, expected 0x%04x", (double)cases[i].x, got, cases[i].h);
        if (ref_f32_to_f16(cases[i].x) != cases[i].h && bad++ < 10)
            FXT_FAIL("the reference disagrees on %a", (double)cases[i].x);
    }
    /* NaN: quiet, sign kept, payload top bits kept; a signalling NaN whose payload sits only in
       the low bits must not turn into infinity. */
    uint16_t n1 = fx_f32_to_f16(bits_f32(0x7f800001u)), n2 = fx_f32_to_f16(bits_f32(0xffc00000u));
    FXT_CHECK(same_f16(n1, 0x7e00) && !(n1 & 0x8000));
    FXT_CHECK(same_f16(n2, 0x7e00) && (n2 & 0x8000));
    FXT_EQ_INT(fx_f32_to_f16(bits_f32(0x7fa00000u)) & 0x3ff, 0x300); /* quiet bit set, payload bit kept */

    /* Against the reference: a stride through all 2^32 patterns, and a dense walk through the
       subnormal and overflow ranges where rounding is subtle. */
    size_t checked = 0;
    for (uint64_t b = 0; b < (1ull << 32); b += 4099) {
        float x = bits_f32((uint32_t)b);
        uint16_t got = fx_f32_to_f16(x), want = ref_f32_to_f16(x);
        checked++;
        if (!same_f16(got, want) && bad++ < 10)
            FXT_FAIL("f16(0x%08x = %a) = 0x%04x, reference 0x%04x", (uint32_t)b, (double)x, got, want);
    }
    for (uint32_t b = 0x33000000u - 1000; b < 0x38800000u + 1000; b += 61) {
        uint16_t got = fx_f32_to_f16(bits_f32(b)), want = ref_f32_to_f16(bits_f32(b));
        checked++;
        if (got != want && bad++ < 10)
            FXT_FAIL("f16(0x%08x) = 0x%04x, reference 0x%04x", b, got, want);
    }
    for (uint32_t b = 0x477fe000u - 5000; b < 0x47800000u + 5000; b++) {
        uint16_t got = fx_f32_to_f16(bits_f32(b)), want = ref_f32_to_f16(bits_f32(b));
        checked++;
        if (got != want && bad++ < 10)
            FXT_FAIL("f16(0x%08x) = 0x%04x, reference 0x%04x", b, got, want);
    }
    /* Every midpoint between neighbouring float16 values: ties to even. */
    for (uint32_t h = 0; h < 0x7c00; h++) {
        float mid = (float)((mags[h] + mags[h + 1]) / 2); /* exact in float */
        uint16_t want = (uint16_t)(h % 2 == 0 ? h : h + 1);
        checked++;
        if (fx_f32_to_f16(mid) != want && bad++ < 10)
            FXT_FAIL("tie %a: 0x%04x, expected 0x%04x", (double)mid, fx_f32_to_f16(mid), want);
        if (fx_f32_to_f16(-mid) != (want | 0x8000) && bad++ < 10)
            FXT_FAIL("tie %a: negative side", (double)-mid);
    }
    FXT_EQ_INT(bad, 0);
    FXT_CHECK(checked > 1000000);
}

/* ---- bfloat16 ------------------------------------------------------------------------------------ */

static void test_bf16(void)
{
    int bad = 0;
    /* Decode is exact (the top half of a float32); encode of every bfloat16 is the identity. */
    for (uint32_t h = 0; h < 65536; h++) {
        float x = fx_bf16_to_f32((uint16_t)h);
        if (f32_bits(x) != h << 16 && bad++ < 5)
            FXT_FAIL("bf16 0x%04x decodes to 0x%08x", h, f32_bits(x));
        uint16_t back = fx_f32_to_bf16(x);
        bool nan = isnan(x);
        if ((nan ? !(same_bf16(back, 0x7fc0) && (back & 0x8000) == (h & 0x8000)) : back != h) && bad++ < 5)
            FXT_FAIL("bf16 0x%04x -> 0x%04x", h, back);
    }
    static const struct {
        uint32_t in;
        uint16_t out;
    } cases[] = {
        {0x3f808000u, 0x3f80}, /* tie, even below */
        {0x3f818000u, 0x3f82}, /* tie, even above */
        {0x3f808001u, 0x3f81}, /* above the tie */
        {0x3f807fffu, 0x3f80}, /* below the tie */
        {0x7f7fffffu, 0x7f80}, /* largest float rounds to infinity */
        {0x7f7f7fffu, 0x7f7f}, /* stays finite */
        {0xff7fffffu, 0xff80},
        {0x7f800000u, 0x7f80}, {0xff800000u, 0xff80},
        {0x00000001u, 0x0000}, /* denormal, rounds to zero */
        {0x00008000u, 0x0000}, /* tie to even zero */
        {0x00018000u, 0x0002},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = fx_f32_to_bf16(bits_f32(cases[i].in));
        if (got != cases[i].out && bad++ < 10)
            FXT_FAIL("bf16(0x%08x) = 0x%04x, expected 0x%04x", cases[i].in, got, cases[i].out);
        if (ref_f32_to_bf16(bits_f32(cases[i].in)) != cases[i].out && bad++ < 10)
            FXT_FAIL("the reference disagrees on 0x%08x", cases[i].in);
    }
    /* A NaN whose payload is only in the low 16 bits must stay NaN (truncation gives Inf). */
    uint16_t n = fx_f32_to_bf16(bits_f32(0x7f800001u));
    FXT_CHECK(same_bf16(n, 0x7fc0) && !(n & 0x8000));
    n = fx_f32_to_bf16(bits_f32(0xff800001u));
    FXT_CHECK(same_bf16(n, 0x7fc0) && (n & 0x8000));
    for (uint64_t b = 0; b < (1ull << 32); b += 1021) {
        float x = bits_f32((uint32_t)b);
        uint16_t got = fx_f32_to_bf16(x), want = ref_f32_to_bf16(x);
        if (!(isnan(x) ? same_bf16(got, 0x7fc0) : got == want) && bad++ < 10)
            FXT_FAIL("bf16(0x%08x) = 0x%04x, reference 0x%04x", (uint32_t)b, got, want);
    }
    FXT_EQ_INT(bad, 0);
}

/* ---- tensors --------------------------------------------------------------------------------------- */

static void test_tensor_to_f32_every_float_dtype(void)
{
    enum { N = 1000 };
    /* Data at offset 1 of the buffer: never aligned for the dtype. */
    unsigned char *raw = malloc(8 * N + 1);
    float *out = fxt_guarded(N);
    double *ref = fxt_alloc_f64(N);
    uint64_t rng = 7;
    const fx_dtype dts[] = {FX_DT_F32, FX_DT_F64, FX_DT_F16, FX_DT_BF16, FX_DT_F8_E4M3, FX_DT_F8_E5M2};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        fx_dtype dt = dts[k];
        size_t es = fx_dtype_size(dt);
        unsigned char *p = raw + 1;
        for (size_t i = 0; i < N * es; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            p[i] = (unsigned char)(rng >> 56);
        }
        /* The whole float8 domain first, in order. */
        if (es == 1)
            for (int i = 0; i < 256; i++)
                p[i] = (unsigned char)i;
        for (size_t i = 0; i < N; i++) {
            const unsigned char *e = p + i * es;
            uint64_t b = 0;
            for (size_t j = 0; j < es; j++)
                b |= (uint64_t)e[j] << 8 * j;
            switch (dt) {
            case FX_DT_F32: ref[i] = bits_f32((uint32_t)b); break;
            case FX_DT_F64: { double d; memcpy(&d, &b, 8); ref[i] = (double)(float)d; break; }
            case FX_DT_F16: ref[i] = ref_f16_value((uint16_t)b); break;
            case FX_DT_BF16: ref[i] = bits_f32((uint32_t)b << 16); break;
            case FX_DT_F8_E4M3: ref[i] = ref_e4m3((uint8_t)b); break;
            default: ref[i] = ref_e5m2((uint8_t)b); break;
            }
        }
        fx_tensor_view t = {.name = "t", .dtype = dt, .ndim = 2, .shape = {N / 10, 10}, .data = p, .nbytes = N * es};
        FXT_OK(fx_tensor_to_f32(out, N, &t));
        char what[32];
        snprintf(what, sizeof what, "%s -> f32", fx_dtype_name(dt));
        fxt_close_f32(what, out, ref, N, 0.0, 0.0); /* exact */
    }
    /* Spot values of float8. */
    FXT_EQ_INT(ref_e4m3(0x7e) == 448.0, 1);
    FXT_EQ_INT(ref_e5m2(0x7b) == 57344.0, 1);
    fxt_guarded_free("out", out);
    free(ref);
    free(raw);
}

static void test_tensor_to_f32_errors(void)
{
    float out[4] = {7, 7, 7, 7};
    int32_t ints[4] = {1, 2, 3, 4};
    fx_tensor_view t = {.name = "w", .dtype = FX_DT_I32, .ndim = 1, .shape = {4}, .data = ints, .nbytes = 16};
    FXT_STATUS(fx_tensor_to_f32(out, 4, &t), FX_EUNSUPPORTED, "tensor 'w': converting I32 to float32 is not supported");
    t.dtype = FX_DT_F32;
    FXT_STATUS(fx_tensor_to_f32(out, 3, &t), FX_EINVAL, "tensor 'w': n = 3 but the tensor has 4 elements");
    t.nbytes = 12;
    FXT_STATUS(fx_tensor_to_f32(out, 4, &t), FX_EINVAL, "nbytes = 12 does not match 4 elements of F32");
    t.nbytes = 16;
    FXT_STATUS(fx_tensor_to_f32(NULL, 4, &t), FX_EINVAL, "dst is NULL");
    t.data = NULL;
    FXT_STATUS(fx_tensor_to_f32(out, 4, &t), FX_EINVAL, "data is NULL");
    FXT_STATUS(fx_tensor_to_f32(out, 4, NULL), FX_EINVAL, "tensor is NULL");
    t = (fx_tensor_view){.name = "w", .dtype = (fx_dtype)77, .ndim = 1, .shape = {4}, .data = ints, .nbytes = 16};
    FXT_STATUS(fx_tensor_to_f32(out, 4, &t), FX_EINVAL, "dtype 77 is not a dtype");
    t = (fx_tensor_view){.name = "w", .dtype = FX_DT_F32, .ndim = 9, .data = ints, .nbytes = 16};
    FXT_STATUS(fx_tensor_to_f32(out, 4, &t), FX_EINVAL, "ndim 9");
    /* Converted in place, the first values would overwrite input not yet read. */
    uint16_t buf[8] = {0x3c00, 0x4000, 0x4200, 0x4400, 0, 0, 0, 0}; /* F16 1, 2, 3, 4 */
    t = (fx_tensor_view){.name = "h", .dtype = FX_DT_F16, .ndim = 1, .shape = {4}, .data = buf, .nbytes = 8};
    FXT_STATUS(fx_tensor_to_f32((float *)(void *)buf, 4, &t), FX_EINVAL, "tensor 'h': dst overlaps the tensor's data");
    FXT_EQ_INT(buf[1], 0x4000);
    for (int i = 0; i < 4; i++)
        FXT_CHECK(out[i] == 7); /* untouched on error */
    /* Empty tensors convert nothing. */
    t = (fx_tensor_view){.name = "e", .dtype = FX_DT_BF16, .ndim = 2, .shape = {0, 3}, .data = NULL, .nbytes = 0};
    FXT_OK(fx_tensor_to_f32(NULL, 0, &t));
}

static void test_f32_to_dtype(void)
{
    enum { N = 777 };
    float *src = fxt_random(N, -70000.0f, 70000.0f, 3); /* includes overflow for float16 */
    src[0] = NAN, src[1] = -INFINITY, src[2] = 0x1p-20f, src[3] = -0.0f;
    unsigned char *raw = malloc(8 * N + 4);
    const fx_dtype dts[] = {FX_DT_F32, FX_DT_F64, FX_DT_F16, FX_DT_BF16};
    int bad = 0;
    for (size_t k = 0; k < 4; k++) {
        fx_dtype dt = dts[k];
        size_t es = fx_dtype_size(dt);
        unsigned char *p = raw + 3; /* unaligned */
        memset(raw, 0xee, 8 * N + 4);
        FXT_OK(fx_f32_to_dtype(p, dt, src, N));
        FXT_EQ_INT(raw[2], 0xee);
        for (size_t i = 0; i < N; i++) {
            uint64_t b = 0;
            for (size_t j = 0; j < es; j++)
                b |= (uint64_t)p[i * es + j] << 8 * j;
            bool ok;
            switch (dt) {
            case FX_DT_F32: ok = (uint32_t)b == f32_bits(src[i]); break;
            case FX_DT_F64: { double d; memcpy(&d, &b, 8); ok = isnan(src[i]) ? isnan(d) : d == (double)src[i]; break; }
            case FX_DT_F16: ok = same_f16((uint16_t)b, ref_f32_to_f16(src[i])); break;
            default: ok = same_bf16((uint16_t)b, ref_f32_to_bf16(src[i])); break;
            }
            if (!ok && bad++ < 5)
                FXT_FAIL("%s[%zu] of %a: bits 0x%llx", fx_dtype_name(dt), i, (double)src[i], (unsigned long long)b);
        }
        FXT_EQ_INT(p[N * es], 0xee); /* nothing written past the end */
        /* And back through a view: F16/BF16 give the rounded value, F32/F64 the same. */
        fx_tensor_view t = {.name = "r", .dtype = dt, .ndim = 1, .shape = {N}, .data = p, .nbytes = N * es};
        float *back = fxt_guarded(N);
        FXT_OK(fx_tensor_to_f32(back, N, &t));
        for (size_t i = 0; i < N; i++) {
            float want = dt == FX_DT_F16 ? fx_f16_to_f32(fx_f32_to_f16(src[i]))
                       : dt == FX_DT_BF16 ? fx_bf16_to_f32(fx_f32_to_bf16(src[i])) : src[i];
            if (!(isnan(want) ? isnan(back[i]) : back[i] == want) && bad++ < 5)
                FXT_FAIL("%s round trip [%zu]: %a vs %a", fx_dtype_name(dt), i, (double)back[i], (double)want);
        }
        fxt_guarded_free("back", back);
    }
    FXT_EQ_INT(bad, 0);
    FXT_STATUS(fx_f32_to_dtype(raw, FX_DT_I8, src, N), FX_EUNSUPPORTED, "converting float32 to I8 is not supported");
    FXT_STATUS(fx_f32_to_dtype(raw, (fx_dtype)50, src, N), FX_EINVAL, "dtype 50");
    FXT_STATUS(fx_f32_to_dtype(NULL, FX_DT_F16, src, N), FX_EINVAL, "dst is NULL");
    FXT_STATUS(fx_f32_to_dtype(raw, FX_DT_F16, NULL, N), FX_EINVAL, "src is NULL");
    FXT_OK(fx_f32_to_dtype(NULL, FX_DT_F16, NULL, 0));
    /* Written over its own input: refused, the input left as it was. */
    float *inplace = fxt_random(2 * N, -1.0f, 1.0f, 4), first = inplace[0]; /* room for F64 */
    FXT_STATUS(fx_f32_to_dtype(inplace, FX_DT_F64, inplace, N), FX_EINVAL, "dst overlaps src");
    FXT_STATUS(fx_f32_to_dtype((char *)inplace + 2, FX_DT_BF16, inplace, N), FX_EINVAL, "dst overlaps src");
    FXT_CHECK(inplace[0] == first);
    free(inplace);
    free(raw);
    free(src);
}

/* Large enough to run on several threads: the same bits at 1 and 2 threads. */
static void test_threads_bitwise(void)
{
    enum { N = 300000 };
    float *src = fxt_random(N, -1e5f, 1e5f, 11);
    uint16_t *h1 = malloc(N * 2), *h2 = malloc(N * 2);
    float *o1 = malloc(N * 4), *o2 = malloc(N * 4);
    int saved = fx_get_num_threads();
    const fx_dtype dts[] = {FX_DT_F16, FX_DT_BF16};
    for (int k = 0; k < 2; k++) {
        fx_set_num_threads(1);
        FXT_OK(fx_f32_to_dtype(h1, dts[k], src, N));
        fx_tensor_view t = {.name = "t", .dtype = dts[k], .ndim = 1, .shape = {N}, .data = h1, .nbytes = N * 2};
        FXT_OK(fx_tensor_to_f32(o1, N, &t));
        fx_set_num_threads(2);
        FXT_OK(fx_f32_to_dtype(h2, dts[k], src, N));
        t.data = h2;
        FXT_OK(fx_tensor_to_f32(o2, N, &t));
        FXT_CHECK(!memcmp(h1, h2, N * 2));
        fxt_bitwise_f32("to_f32 1 vs 2 threads", o1, o2, N);
    }
    fx_set_num_threads(saved);
    free(src), free(h1), free(h2), free(o1), free(o2);
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    ref_init();
    FXT_RUN(test_dtype_helpers);
    FXT_RUN(test_f16_decode_exhaustive);
    FXT_RUN(test_f16_encode_rne);
    FXT_RUN(test_bf16);
    FXT_RUN(test_tensor_to_f32_every_float_dtype);
    FXT_RUN(test_tensor_to_f32_errors);
    FXT_RUN(test_f32_to_dtype);
    FXT_RUN(test_threads_bitwise);
    return fxt_finish();
}
