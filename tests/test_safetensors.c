/* safetensors: the reference implementation's vectors, every validation rule, round trips of
   every dtype, atomic saving, sharded checkpoints. Conversions are in test_safetensors_convert.c. */
#include "harness.h"
#include "tmpdir.h"

#include "safetensors/st_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- files ------------------------------------------------------------------------------------ */

static char tmpdir[512];


static const char *tpath(const char *name)
{
    static char p[8][1024];
    static int k;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof p[k], "%s/%s", tmpdir, name);
    return p[k];
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
}

static unsigned char *read_bytes(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc((size_t)len + 1);
    if (fread(p, 1, (size_t)len, f) != (size_t)len) {
        fclose(f);
        free(p);
        return NULL;
    }
    fclose(f);
    *n = (size_t)len;
    return p;
}

static int count_dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d)
        closedir(d);
    return n;
}

/* A file of: 8-byte length of `header` (hlen bytes), the header, then `data_len` bytes. */
static const char *file_with(const char *name, const char *header, size_t hlen, size_t data_len)
{
    size_t n = 8 + hlen + data_len;
    unsigned char *b = calloc(n + 1, 1);
    for (int k = 0; k < 8; k++)
        b[k] = (unsigned char)((uint64_t)hlen >> 8 * k);
    memcpy(b + 8, header, hlen);
    for (size_t i = 0; i < data_len; i++)
        b[8 + hlen + i] = (unsigned char)(i * 7 + 1);
    const char *p = tpath(name);
    write_bytes(p, b, n);
    free(b);
    return p;
}

static fx_safetensors *const SENTINEL = (fx_safetensors *)(uintptr_t)0x5a5a;

/* Opens a file made of `header` + data_len bytes and expects `status` with `msg` in the
   message; on failure *out must be left alone. */
#define EXPECT_HEADER(header, data_len, status, msg)                                         \
    do {                                                                                     \
        const char *p_ = file_with("h.safetensors", (header), strlen(header), (data_len));   \
        fx_safetensors *f_ = SENTINEL;                                                       \
        FXT_STATUS(fx_safetensors_open(&f_, p_), (status), (msg));                           \
        if ((status) != FX_OK)                                                               \
            FXT_CHECK(f_ == SENTINEL);                                                       \
        else if (f_ != SENTINEL)                                                             \
            fx_safetensors_free(f_);                                                        \
    } while (0)

/* A header and the data bytes after it, and what opening the file must give. */
typedef struct header_case {
    const char *header;
    size_t data_len;
    int status;
    const char *msg; /* a part of the error message ("" for FX_OK) */
} header_case;

/* EXPECT_HEADER for each case, naming the one that failed. */
static void expect_headers(const header_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const int before = fxt_failed_checks;
        EXPECT_HEADER(cases[i].header, cases[i].data_len, cases[i].status, cases[i].msg);
        if (fxt_failed_checks != before)
            fprintf(stderr, "    (case %zu: %s)\n", i, cases[i].header);
    }
}

#define EXPECT_BYTES(bytes, n, status, msg)                                                  \
    do {                                                                                     \
        const char *p_ = tpath("b.safetensors");                                             \
        write_bytes(p_, (bytes), (n));                                                       \
        fx_safetensors *f_ = SENTINEL;                                                       \
        FXT_STATUS(fx_safetensors_open(&f_, p_), (status), (msg));                           \
        if ((status) != FX_OK)                                                               \
            FXT_CHECK(f_ == SENTINEL);                                                       \
        else if (f_ != SENTINEL)                                                             \
            fx_safetensors_free(f_);                                                        \
    } while (0)

#define EXPECT_LIT(s, status, msg) EXPECT_BYTES(s, sizeof(s) - 1, status, msg)

/* ---- the reference implementation's vectors ------------------------------------------------ */

static void test_reference_deserialization(void)
{
    static const char v[] = "<\0\0\0\0\0\0\0{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}"
                            "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";
    const char *p = tpath("ref.safetensors");
    write_bytes(p, v, sizeof v - 1);
    fx_safetensors *f;
    FXT_OK(fx_safetensors_open(&f, p));
    FXT_EQ_INT(fx_safetensors_count(f), 1);
    const fx_tensor_view *t = fx_safetensors_find(f, "test");
    FXT_CHECK(t != NULL);
    if (t) {
        FXT_EQ_STR(t->name, "test");
        FXT_EQ_INT(t->dtype, FX_DT_I32);
        FXT_EQ_INT(t->ndim, 2);
        FXT_EQ_INT(t->shape[0], 2);
        FXT_EQ_INT(t->shape[1], 2);
        FXT_EQ_INT(t->nbytes, 16);
        static const unsigned char zero[16];
        FXT_CHECK(!memcmp(t->data, zero, 16));
    }
    FXT_CHECK(fx_safetensors_tensor(f, 0) == t);
    FXT_CHECK(fx_safetensors_tensor(f, 1) == NULL);
    FXT_CHECK(fx_safetensors_find(f, "nope") == NULL);
    FXT_CHECK(fx_safetensors_metadata(f, "format") == NULL);
    FXT_EQ_INT(fx_safetensors_header_size(f), 60);
    fx_safetensors_free(f);
}

static void test_reference_scalar_and_zero_size(void)
{
    /* test_empty_shapes_allowed: a scalar is shape [] and one element. */
    static const char s[] = "8\0\0\0\0\0\0\0{\"test\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[0,4]}}\0\0\0\0";
    const char *p = tpath("scalar.safetensors");
    write_bytes(p, s, sizeof s - 1);
    fx_safetensors *f;
    FXT_OK(fx_safetensors_open(&f, p));
    const fx_tensor_view *t = fx_safetensors_find(f, "test");
    FXT_CHECK(t && t->ndim == 0 && t->nbytes == 4 && fx_tensor_numel(t) == 1);
    fx_safetensors_free(f);

    /* test_zero_sized_tensor (note the space inside data_offsets: white space is JSON's). */
    static const char z[] = "<\0\0\0\0\0\0\0{\"test\":{\"dtype\":\"I32\",\"shape\":[2,0],\"data_offsets\":[0, 0]}}";
    write_bytes(p, z, sizeof z - 1);
    FXT_OK(fx_safetensors_open(&f, p));
    t = fx_safetensors_find(f, "test");
    FXT_CHECK(t && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 0 && t->nbytes == 0);
    FXT_EQ_INT(fx_tensor_numel(t), 0);
    size_t blen = 99;
    const void *buf = fx_safetensors_buffer(f, &blen);
    FXT_EQ_INT(blen, 0);
    FXT_CHECK(t && t->data == buf); /* in bounds (one past the end of an empty buffer) */
    fx_safetensors_free(f);
}

static void test_reference_errors(void)
{
    /* test_header_too_small */
    EXPECT_BYTES("", 0, FX_EFORMAT, "header too small");
    EXPECT_BYTES("\x01\0\0", 3, FX_EFORMAT, "shorter than the 8-byte");
    /* test_header_too_large */
    EXPECT_LIT(("<\x00\x00\x00\x00\xff\xff\xff{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}"
                     "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0"), FX_EFORMAT, "header too large");
    EXPECT_LIT(("\xff\xff\xff\xff\xff\xff\xff\xff{}"), FX_EFORMAT, "header too large");
    EXPECT_LIT(("\x01\xe1\xf5\x05\0\0\0\0{}"), FX_EFORMAT, "exceeds the limit"); /* 100,000,001 */
    /* test_invalid_header_length */
    EXPECT_LIT(("<\0\0\0\0\0\0\0"), FX_EFORMAT, "invalid header length");
    /* test_invalid_header_non_utf8 */
    EXPECT_LIT(("\x01\0\0\0\0\0\0\0\xff"), FX_EFORMAT, "not valid UTF-8");
    /* test_invalid_header_not_json */
    EXPECT_LIT(("\x01\0\0\0\0\0\0\0{"), FX_EFORMAT, "not strict JSON");
    /* test_invalid_info */
    EXPECT_LIT(("<\0\0\0\0\0\0\0{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0, 4]}}"),
                 FX_EFORMAT, "tensor 'test': data_offsets [0, 4) hold 4 bytes but I32 shape needs 16");
    /* test_metadata_incomplete_buffer: the polyglot file with extra bytes, then 2 bytes short */
    EXPECT_LIT(("<\0\0\0\0\0\0\0{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}"
                     "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0extra_bogus_data_for_polyglot_file"),
                 FX_EFORMAT, "34 trailing bytes");
    EXPECT_LIT(("<\0\0\0\0\0\0\0{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}"
                     "\0\0\0\0\0\0\0\0\0\0\0\0\0\0"),
                 FX_EFORMAT, "tensor 'test': data_offsets [0, 16) run past the end");
    /* test_validation_overflow: u64 values past int64 are refused by flexc's integer rule; the
       second vector is a product that fits in u64 but not in a size. */
    EXPECT_LIT(("O\0\0\0\0\0\0\0{\"test\":{\"dtype\":\"I32\",\"shape\":[2,18446744073709551614],\"data_offsets\":[0,16]}}"
                     "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0"), FX_EFORMAT, "is larger than 9223372036854775807");
    EXPECT_LIT(("N\0\0\0\0\0\0\0{\"test\":{\"dtype\":\"I32\",\"shape\":[2,9223372036854775807],\"data_offsets\":[0,16]}}"
                     "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0"), FX_EFORMAT, "tensor 'test': shape product times 4 bytes overflows");
}

/* test_json_attack: ten tensors all claiming the same 16 bytes. */
static void test_reference_json_attack(void)
{
    char h[2048];
    size_t o = 0;
    o += (size_t)snprintf(h + o, sizeof h - o, "{");
    for (int i = 0; i < 10; i++)
        o += (size_t)snprintf(h + o, sizeof h - o, "%s\"weight_%d\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}",
                              i ? "," : "", i);
    snprintf(h + o, sizeof h - o, "}");
    EXPECT_HEADER(h, 16, FX_EFORMAT, "overlap tensor 'weight_");
}

/* test_whitespace_padded_header, and leading white space (the reference parser accepts it; docs/safetensors.md). */
static void test_reference_whitespace(void)
{
    EXPECT_LIT(("\x06\0\0\0\0\0\0\0{}\x0d\x20\x09\x0a"), FX_OK, "");
    EXPECT_LIT(("\x06\0\0\0\0\0\0\0\x09\x0a{}\x0d\x20"), FX_OK, "");
    EXPECT_HEADER("{}        ", 0, FX_OK, "");
    EXPECT_HEADER("\n{ \"a\" : { \"dtype\" : \"U8\" , \"shape\" : [ 3 ] , \"data_offsets\" : [ 0 , 3 ] } }\t", 3, FX_OK, "");
}

/* test_serialization, test_serialization_forced_alignement, test_empty: the exact bytes the
   reference writes. */
static void test_reference_serialization_bytes(void)
{
    static const float vals[6] = {0, 1, 2, 3, 4, 5};
    static const unsigned char want1[] = {
        64, 0, 0, 0, 0, 0, 0, 0, 123, 34, 97, 116, 116, 110, 46, 48, 34, 58, 123, 34, 100,
        116, 121, 112, 101, 34, 58, 34, 70, 51, 50, 34, 44, 34, 115, 104, 97, 112, 101, 34,
        58, 91, 49, 44, 50, 44, 51, 93, 44, 34, 100, 97, 116, 97, 95, 111, 102, 102, 115,
        101, 116, 115, 34, 58, 91, 48, 44, 50, 52, 93, 125, 125, 0, 0, 0, 0, 0, 0, 128, 63,
        0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64, 0, 0, 160, 64};
    static const unsigned char want2[] = {
        72, 0, 0, 0, 0, 0, 0, 0, 123, 34, 97, 116, 116, 110, 48, 34, 58, 123, 34, 100, 116,
        121, 112, 101, 34, 58, 34, 70, 51, 50, 34, 44, 34, 115, 104, 97, 112, 101, 34, 58,
        91, 49, 44, 49, 44, 50, 44, 51, 93, 44, 34, 100, 97, 116, 97, 95, 111, 102, 102,
        115, 101, 116, 115, 34, 58, 91, 48, 44, 50, 52, 93, 125, 125, 32, 32, 32, 32, 32,
        32, 32, 0, 0, 0, 0, 0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64, 0, 0,
        160, 64};
    static const unsigned char want_empty[] = {8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32};
    static const unsigned char want_meta[] = {
        40, 0, 0, 0, 0, 0, 0, 0, 123, 34, 95, 95, 109, 101, 116, 97, 100, 97, 116, 97, 95,
        95, 34, 58, 123, 34, 102, 114, 97, 109, 101, 119, 111, 114, 107, 34, 58, 34, 112,
        116, 34, 125, 125, 32, 32, 32, 32, 32};
    const char *p = tpath("ser.safetensors");
    size_t n;
    unsigned char *got;

    fx_tensor_view t = {.name = "attn.0", .dtype = FX_DT_F32, .ndim = 3, .shape = {1, 2, 3}, .data = vals, .nbytes = 24};
    FXT_OK(fx_safetensors_save(p, &t, 1, NULL));
    got = read_bytes(p, &n);
    FXT_CHECK(got && n == sizeof want1 && !memcmp(got, want1, n));
    free(got);

    t = (fx_tensor_view){.name = "attn0", .dtype = FX_DT_F32, .ndim = 4, .shape = {1, 1, 2, 3}, .data = vals, .nbytes = 24};
    FXT_OK(fx_safetensors_save(p, &t, 1, NULL));
    got = read_bytes(p, &n);
    FXT_CHECK(got && n == sizeof want2 && !memcmp(got, want2, n));
    free(got);
    fx_safetensors *f;
    FXT_OK(fx_safetensors_open(&f, p));
    FXT_CHECK((uintptr_t)fx_safetensors_find(f, "attn0")->data % 4 == 0);
    fx_safetensors_free(f);

    FXT_OK(fx_safetensors_save(p, NULL, 0, NULL));
    got = read_bytes(p, &n);
    FXT_CHECK(got && n == sizeof want_empty && !memcmp(got, want_empty, n));
    free(got);

    const char *meta[] = {"framework", "pt", NULL};
    FXT_OK(fx_safetensors_save(p, NULL, 0, meta));
    got = read_bytes(p, &n);
    FXT_CHECK(got && n == sizeof want_meta && !memcmp(got, want_meta, n));
    free(got);
}

/* ---- every rule ------------------------------------------------------------------------------ */

#define T_U8 "{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}"

static void test_rule_json_strict(void)
{
    EXPECT_HEADER("[]", 0, FX_EFORMAT, "not a JSON object");
    EXPECT_HEADER("\"x\"", 0, FX_EFORMAT, "not strict JSON");
    EXPECT_HEADER("{} x", 0, FX_EFORMAT, "not strict JSON");
    EXPECT_HEADER("{}{}", 0, FX_EFORMAT, "not strict JSON");
    EXPECT_HEADER("{\"a\":" T_U8 ",}", 4, FX_EFORMAT, "not strict JSON");
    EXPECT_HEADER("/* c */{}", 0, FX_EFORMAT, "not strict JSON");
    EXPECT_HEADER("{} // c", 0, FX_EFORMAT, "not strict JSON");
    EXPECT_HEADER("{'a':" T_U8 "}", 4, FX_EFORMAT, "not strict JSON");
    EXPECT_HEADER("{\"a\\q\":" T_U8 "}", 4, FX_EFORMAT, "not strict JSON");      /* bad escape */
    EXPECT_HEADER("{\"\\ud800\":" T_U8 "}", 4, FX_EFORMAT, "not strict JSON");   /* lone high surrogate */
    EXPECT_HEADER("{\"\\udc00x\":" T_U8 "}", 4, FX_EFORMAT, "not strict JSON");  /* lone low surrogate */
    EXPECT_HEADER("{\"a\tb\":" T_U8 "}", 4, FX_EFORMAT, "not strict JSON");      /* raw control character */
    EXPECT_HEADER("{\"a\\u0000b\":" T_U8 "}", 4, FX_EFORMAT, "NUL");              /* NUL in a name */
    EXPECT_HEADER("{\"a\":" T_U8 ",\"a\":" T_U8 "}", 4, FX_EFORMAT, "duplicate"); /* duplicate tensor */
    EXPECT_HEADER("{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, FX_EFORMAT,
                  "duplicate");
    EXPECT_HEADER("{\"a\":" T_U8 ",\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 4, FX_EFORMAT, "duplicate");
    EXPECT_HEADER("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]} \x01}", 4, FX_EFORMAT,
                  "not strict JSON");
    /* A surrogate pair is fine, and so is an escaped control character. */
    EXPECT_HEADER("{\"\\ud83d\\ude00\\u001b\":" T_U8 "}", 4, FX_OK, "");
    /* A raw NUL byte anywhere in the header. */
    const char h[] = "{\"a\":" T_U8 "}\0 ";
    const char *p = file_with("nul.safetensors", h, sizeof h - 1, 4);
    fx_safetensors *f = SENTINEL;
    FXT_STATUS(fx_safetensors_open(&f, p), FX_EFORMAT, "not strict JSON");
    FXT_CHECK(f == SENTINEL);
    /* Invalid UTF-8 inside a string: overlong, surrogate, past U+10FFFF, truncated. */
    EXPECT_HEADER("{\"\xc0\xaf\":" T_U8 "}", 4, FX_EFORMAT, "UTF-8");
    EXPECT_HEADER("{\"\xed\xa0\x80\":" T_U8 "}", 4, FX_EFORMAT, "UTF-8");
    EXPECT_HEADER("{\"\xf4\x90\x80\x80\":" T_U8 "}", 4, FX_EFORMAT, "UTF-8");
    EXPECT_HEADER("{\"\xe2\x82\":" T_U8 "}", 4, FX_EFORMAT, "UTF-8");
    EXPECT_HEADER("{\"\xe2\x82\xac\":" T_U8 "}", 4, FX_OK, ""); /* the euro sign is fine */
}

static void test_rule_numbers(void)
{
    static const header_case cases[] = {
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0, FX_EFORMAT, "signed number"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[-0],\"data_offsets\":[0,0]}}", 0, FX_EFORMAT, "signed number"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[+0,4]}}", 4, FX_EFORMAT, "signed number"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4.0],\"data_offsets\":[0,4]}}", 4, FX_EFORMAT, "fraction or exponent"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4e0],\"data_offsets\":[0,4]}}", 4, FX_EFORMAT, "fraction or exponent"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4E0]}}", 4, FX_EFORMAT, "fraction or exponent"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[04],\"data_offsets\":[0,4]}}", 4, FX_EFORMAT, "not strict JSON"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[9223372036854775808],\"data_offsets\":[0,4]}}", 4, FX_EFORMAT,
         "larger than"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[18446744073709551616],\"data_offsets\":[0,4]}}", 4, FX_EFORMAT,
         "larger than"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,99999999999999999999999]}}", 4, FX_EFORMAT,
         "larger than"},
        /* The largest accepted integer is fine as a number (it then fails the size rules). */
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[9223372036854775807],\"data_offsets\":[0,4]}}", 4, FX_EFORMAT,
         "hold 4 bytes"},
        /* Numbers inside strings are just text. */
        {"{\"__metadata__\":{\"lr\":\"-1.5e-3\"},\"a\":" T_U8 "}", 4, FX_OK, ""},
    };
    expect_headers(cases, sizeof cases / sizeof cases[0]);
}

static void test_rule_depth(void)
{
    /* 200,000 nested brackets: an error, not a stack overflow. */
    size_t n = 200000;
    char *h = malloc(2 * n + 1);
    memset(h, '[', n);
    memset(h + n, ']', n);
    h[2 * n] = '\0';
    EXPECT_HEADER(h, 0, FX_EFORMAT, "nested deeper than");
    memset(h, '{', n);
    h[n] = '\0';
    EXPECT_HEADER(h, 0, FX_EFORMAT, "nested deeper than");
    free(h);
    EXPECT_HEADER("{\"__metadata__\":{\"k\":{\"x\":{\"y\":[\"z\"]}}}}", 0, FX_EFORMAT, "nested deeper than");
    EXPECT_HEADER("{\"a\":{\"dtype\":\"U8\",\"shape\":[[[4]]],\"data_offsets\":[0,4]}}", 4, FX_EFORMAT, "nested deeper than");
    EXPECT_HEADER("{\"a\":{\"dtype\":\"U8\",\"shape\":[[4]],\"data_offsets\":[0,4]}}", 4, FX_EFORMAT,
                  "tensor 'a': shape[0] is an array");
}

static void test_rule_entries(void)
{
    static const header_case cases[] = {
        {"{\"w\":5}", 0, FX_EFORMAT, "tensor 'w': entry is an integer, not an object"},
        {"{\"w\":[]}", 0, FX_EFORMAT, "tensor 'w': entry is an array"},
        {"{\"w\":{\"dtype\":\"U8\",\"shape\":[4]}}", 4, FX_EFORMAT, "tensor 'w': missing key 'data_offsets'"},
        {"{\"w\":{\"shape\":[4],\"data_offsets\":[0,4]}}", 4, FX_EFORMAT, "tensor 'w': missing key 'dtype'"},
        {"{\"w\":{\"dtype\":\"U8\",\"data_offsets\":[0,4]}}", 4, FX_EFORMAT, "tensor 'w': missing key 'shape'"},
        {"{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4],\"x\":1}}", 4, FX_EFORMAT,
         "tensor 'w': unexpected key 'x'"},
        {"{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4,4]}}", 4, FX_EFORMAT,
         "tensor 'w': data_offsets is an array of another length"},
        {"{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4]}}", 4, FX_EFORMAT,
         "tensor 'w': data_offsets is an array of another length"},
        {"{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":{\"a\":0}}}", 4, FX_EFORMAT,
         "tensor 'w': data_offsets is an object"},
        {"{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[\"0\",4]}}", 4, FX_EFORMAT,
         "tensor 'w': data_offsets holds something other than"},
        {"{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[null,4]}}", 4, FX_EFORMAT,
         "tensor 'w': data_offsets holds"},
        {"{\"w\":{\"dtype\":\"U8\",\"shape\":4,\"data_offsets\":[0,4]}}", 4, FX_EFORMAT,
         "tensor 'w': shape is an integer, not an array"},
        {"{\"w\":{\"dtype\":\"U8\",\"shape\":[true],\"data_offsets\":[0,1]}}", 1, FX_EFORMAT,
         "tensor 'w': shape[0] is a boolean"},
        {"{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, FX_EFORMAT,
         "more than 8 elements"},
        {"{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, FX_OK, ""},
        /* dtype names as the reference spells them. */
        {"{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, FX_EFORMAT,
         "tensor 'w': unknown dtype 'f32'"},
        {"{\"w\":{\"dtype\":\"float32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, FX_EFORMAT, "unknown dtype"},
        {"{\"w\":{\"dtype\":\"F32 \",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, FX_EFORMAT, "unknown dtype"},
        {"{\"w\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, FX_EFORMAT,
         "tensor 'w': dtype is an integer, not a string"},
        /* Names are quoted with control bytes escaped in messages. */
        {"{\"\\u001b[31m\":5}", 0, FX_EFORMAT, "tensor '\\x1b[31m'"},
    };
    expect_headers(cases, sizeof cases / sizeof cases[0]);
    /* A long name is cut, at a character boundary: the message stays valid UTF-8. */
    char h[1024] = "{\"";
    for (int i = 0; i < 150; i++)
        strcat(h, "\xc3\xa9");
    strcat(h, "\":5}");
    EXPECT_HEADER(h, 0, FX_EFORMAT, "\xc3\xa9...': entry is");
    size_t bad;
    FXT_CHECK(fx__st_utf8_valid((const unsigned char *)fx_last_error(), strlen(fx_last_error()), &bad));
}

static void test_rule_sizes(void)
{
    static const header_case cases[] = {
        /* Products that wrap: to 0 (2^32 * 2^32) and past int64. Both are errors, never an empty
           tensor. */
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0,
         FX_EFORMAT, "tensor 'w': shape product times 4 bytes overflows"},
        {"{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,0],\"data_offsets\":[0,0]}}", 0,
         FX_EFORMAT, "overflows"},
        {"{\"w\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,0]}}", 0,
         FX_EFORMAT, "tensor 'w': shape product times 8 bytes overflows"},
        {"{\"w\":{\"dtype\":\"U8\",\"shape\":[3037000500,3037000500],\"data_offsets\":[0,0]}}", 0,
         FX_EFORMAT, "overflows"},
        /* A genuinely empty tensor with a huge other dimension is fine when nothing overflows. */
        {"{\"w\":{\"dtype\":\"U8\",\"shape\":[0,4294967296],\"data_offsets\":[0,0]}}", 0, FX_OK, ""},
        /* end - begin = byte size */
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, FX_EFORMAT,
         "tensor 'w': data_offsets [0, 4) hold 4 bytes but F32 shape needs 8"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 4, FX_EFORMAT,
         "tensor 'w': data_offsets [8, 4) end before they begin"},
    };
    expect_headers(cases, sizeof cases / sizeof cases[0]);
}

static void test_rule_layout(void)
{
    /* A hole between two tensors. */
    EXPECT_HEADER("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,12]}}", 12, FX_EFORMAT,
                  "tensor 'b': data_offsets [8, 12) leave a hole");
    /* A hole at the start. */
    EXPECT_HEADER("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}", 8, FX_EFORMAT, "leave a hole");
    /* Overlap, named on both sides. */
    EXPECT_HEADER("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[4,12]}}", 12, FX_EFORMAT,
                  "tensor 'b': data_offsets [4, 12) overlap tensor 'a', which ends at 8");
    /* Trailing bytes after the last tensor; a buffer with no tensor at all. */
    EXPECT_HEADER("{\"a\":" T_U8 "}", 5, FX_EFORMAT, "1 trailing byte belongs to no tensor");
    EXPECT_HEADER("{}", 3, FX_EFORMAT, "3 trailing bytes");
    /* Past the end of the file (including offsets far past it). */
    EXPECT_HEADER("{\"a\":" T_U8 "}", 3, FX_EFORMAT, "tensor 'a': data_offsets [0, 4) run past the end");
    EXPECT_HEADER("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[9223372036854775800,9223372036854775804]}}",
                  0, FX_EFORMAT, "leave a hole");
    /* Zero-size tensors anywhere, including at the same offset as others and at the end. */
    EXPECT_HEADER("{\"z1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
                  "\"a\":" T_U8 ",\"z0\":{\"dtype\":\"I64\",\"shape\":[3,0],\"data_offsets\":[0,0]},"
                  "\"z2\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 4, FX_OK, "");
    /* A zero-size tensor cannot sit inside another tensor's bytes... */
    EXPECT_HEADER("{\"a\":" T_U8 ",\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,2]}}", 4, FX_EFORMAT,
                  "overlap");
    /* ...nor past the end. */
    EXPECT_HEADER("{\"a\":" T_U8 ",\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[5,5]}}", 4, FX_EFORMAT,
                  "leave a hole");
}

static void test_rule_metadata(void)
{
    EXPECT_HEADER("{\"__metadata__\":{\"a\":\"b\",\"c\":\"\"}}", 0, FX_OK, "");
    EXPECT_HEADER("{\"__metadata__\":{\"a\":1}}", 0, FX_EFORMAT, "__metadata__ value of 'a' is an integer, not a string");
    EXPECT_HEADER("{\"__metadata__\":{\"a\":null}}", 0, FX_EFORMAT, "not a string");
    EXPECT_HEADER("{\"__metadata__\":{\"a\":[\"b\"]}}", 0, FX_EFORMAT, "not a string");
    EXPECT_HEADER("{\"__metadata__\":\"x\"}", 0, FX_EFORMAT, "__metadata__ is a string, not an object");
    EXPECT_HEADER("{\"__metadata__\":[]}", 0, FX_EFORMAT, "__metadata__ is an array");
    EXPECT_HEADER("{\"__metadata__\":{\"a\":\"x\\u0000y\"}}", 0, FX_EFORMAT, "NUL");

    const char *h = "{\"__metadata__\":{\"format\":\"pt\",\"step\":\"12\",\"note\":\"\\u00fc\\n\"},\"a\":" T_U8 "}";
    const char *p = file_with("meta.safetensors", h, strlen(h), 4);
    fx_safetensors *f;
    FXT_OK(fx_safetensors_open(&f, p));
    FXT_EQ_INT(fx_safetensors_count(f), 1);
    FXT_EQ_STR(fx_safetensors_metadata(f, "format"), "pt");
    FXT_EQ_STR(fx_safetensors_metadata(f, "step"), "12");
    FXT_EQ_STR(fx_safetensors_metadata(f, "note"), "\xc3\xbc\n");
    FXT_CHECK(fx_safetensors_metadata(f, "absent") == NULL);
    FXT_CHECK(fx_safetensors_metadata(f, NULL) == NULL);
    FXT_EQ_STR(fx_safetensors_metadata_key(f, 0), "format");
    FXT_EQ_STR(fx_safetensors_metadata_key(f, 1), "step");
    FXT_EQ_STR(fx_safetensors_metadata_key(f, 2), "note");
    FXT_CHECK(fx_safetensors_metadata_key(f, 3) == NULL);
    FXT_CHECK(fx_safetensors_find(f, "__metadata__") == NULL);
    fx_safetensors_free(f);
}

static void test_open_io_errors(void)
{
    fx_safetensors *f = SENTINEL;
    FXT_STATUS(fx_safetensors_open(&f, tpath("does-not-exist")), FX_EIO, "cannot open");
    FXT_STATUS(fx_safetensors_open(&f, tmpdir), FX_EIO, "not a regular file");
    /* A FIFO with no writer: refused at once (opening it for reading blocked forever); the
       alarm turns a hang into a failure. */
    const char *fifo = tpath("fifo.safetensors");
    unlink(fifo);
    FXT_CHECK(mkfifo(fifo, 0600) == 0);
    alarm(20);
    FXT_STATUS(fx_safetensors_open(&f, fifo), FX_EIO, "not a regular file");
    char idx[4096];
    snprintf(idx, sizeof idx, "%s", tpath("fifo.json"));
    unlink(idx);
    FXT_CHECK(mkfifo(idx, 0600) == 0);
    fx_safetensors_index *x = NULL;
    FXT_STATUS(fx_safetensors_index_open(&x, idx), FX_EIO, "not a regular file");
    alarm(0);
    unlink(fifo);
    unlink(idx);
    FXT_STATUS(fx_safetensors_open(NULL, tpath("x")), FX_EINVAL, "out is NULL");
    FXT_STATUS(fx_safetensors_open(&f, NULL), FX_EINVAL, "path is NULL");
    FXT_CHECK(f == SENTINEL);
    /* The message starts with the file's name. */
    const char *p = file_with("named.safetensors", "{\"w\":5}", 7, 0);
    FXT_STATUS(fx_safetensors_open(&f, p), FX_EFORMAT, "named.safetensors: tensor 'w'");
    /* NULL handles are harmless. */
    fx_safetensors_free(NULL);
    FXT_EQ_INT(fx_safetensors_count(NULL), 0);
    FXT_CHECK(fx_safetensors_find(NULL, "a") == NULL);
}

/* File order is data order; the header's order does not matter. Unaligned data is fine. */
static void test_order_and_alignment(void)
{
    /* Header of 7 bytes past a multiple of 8: the F32 data start unaligned in the mapping. */
    const char *h = "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[1,9]},"
                    "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
    size_t hl = strlen(h);
    unsigned char file[256] = {0};
    for (int k = 0; k < 8; k++)
        file[k] = (unsigned char)((uint64_t)hl >> 8 * k);
    memcpy(file + 8, h, hl);
    float v[2] = {1.5f, -2.25f};
    file[8 + hl] = 7;
    memcpy(file + 8 + hl + 1, v, sizeof v);
    const char *p = tpath("order.safetensors");
    write_bytes(p, file, 8 + hl + 9);
    fx_safetensors *f;
    FXT_OK(fx_safetensors_open(&f, p));
    FXT_EQ_STR(fx_safetensors_tensor(f, 0)->name, "a");
    FXT_EQ_STR(fx_safetensors_tensor(f, 1)->name, "b");
    const fx_tensor_view *b = fx_safetensors_find(f, "b");
    FXT_CHECK(((uintptr_t)b->data & 3) != 0 || ((8 + hl + 1) & 3) == 0);
    float got[2];
    FXT_OK(fx_tensor_to_f32(got, 2, b));
    FXT_CHECK(got[0] == 1.5f && got[1] == -2.25f);
    size_t blen;
    const unsigned char *buf = fx_safetensors_buffer(f, &blen);
    FXT_EQ_INT(blen, 9);
    FXT_EQ_INT((const unsigned char *)b->data - buf, 1);
    FXT_EQ_INT(buf[0], 7);
    fx_safetensors_free(f);
}

/* Many tensors: lookup by name is exact for each. */
static void test_find_many(void)
{
    enum { N = 500 };
    char names[N][16];
    fx_tensor_view t[N];
    uint8_t data[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "t%d", (i * 7919) % N);
        data[i] = (uint8_t)i;
        t[i] = (fx_tensor_view){.name = names[i], .dtype = FX_DT_U8, .ndim = 1, .shape = {1}, .data = &data[i], .nbytes = 1};
    }
    const char *p = tpath("many.safetensors");
    FXT_OK(fx_safetensors_save(p, t, N, NULL));
    fx_safetensors *f;
    FXT_OK(fx_safetensors_open(&f, p));
    FXT_EQ_INT(fx_safetensors_count(f), N);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        const fx_tensor_view *v = fx_safetensors_find(f, names[i]);
        bad += !v || strcmp(v->name, names[i]) || *(const uint8_t *)v->data != (uint8_t)i;
        /* same dtype: file order is caller order */
        bad += strcmp(fx_safetensors_tensor(f, (size_t)i)->name, names[i]) != 0;
    }
    FXT_EQ_INT(bad, 0);
    FXT_CHECK(fx_safetensors_find(f, "t") == NULL && fx_safetensors_find(f, "t5000") == NULL);
    fx_safetensors_free(f);
}

/* ---- round trips ------------------------------------------------------------------------------ */

static void test_roundtrip_every_dtype(void)
{
    enum { NT = 2 * FX_DT_COUNT + 2 };
    fx_tensor_view t[NT];
    char names[NT][48];
    unsigned char *bufs[NT];
    uint64_t rng = 12345;
    for (int i = 0; i < NT; i++) {
        fx_dtype dt = (fx_dtype)(i % FX_DT_COUNT);
        t[i] = (fx_tensor_view){.dtype = dt};
        if (i < 2 * FX_DT_COUNT) {
            t[i].ndim = i / FX_DT_COUNT ? 3 : 1; /* odd element counts mis-align what follows */
            for (int d = 0; d < t[i].ndim; d++)
                t[i].shape[d] = 1 + (i + 2 * d) % 5;
        } else if (i == 2 * FX_DT_COUNT) {
            dt = t[i].dtype = FX_DT_F64, t[i].ndim = 0; /* scalar */
        } else {
            dt = t[i].dtype = FX_DT_BF16, t[i].ndim = 2, t[i].shape[0] = 5, t[i].shape[1] = 0; /* empty */
        }
        snprintf(names[i], sizeof names[i], "layer.%d.%s \"q\"\\\n\x01\xc3\xa9", i, fx_dtype_name(dt));
        t[i].name = names[i];
        t[i].nbytes = (size_t)fx_tensor_numel(&t[i]) * fx_dtype_size(dt);
        bufs[i] = malloc(t[i].nbytes + 1);
        for (size_t j = 0; j < t[i].nbytes; j++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            bufs[i][j] = dt == FX_DT_BOOL ? (unsigned char)(rng >> 63) : (unsigned char)(rng >> 56);
        }
        t[i].data = t[i].nbytes ? bufs[i] : NULL; /* NULL is allowed for zero bytes */
    }
    const char *meta[] = {"format", "pt", "step", "42", "\xe2\x82\xac \"k\"", "v\tw", NULL};
    const char *p = tpath("rt.safetensors");
    FXT_OK(fx_safetensors_save(p, t, NT, meta));
    fx_safetensors *f;
    FXT_OK(fx_safetensors_open(&f, p));
    FXT_EQ_INT(fx_safetensors_count(f), NT);
    FXT_EQ_INT(fx_safetensors_header_size(f) % 8, 0);
    for (int i = 0; i < NT; i++) {
        const fx_tensor_view *v = fx_safetensors_find(f, names[i]);
        FXT_CHECK(v != NULL);
        if (!v)
            continue;
        FXT_EQ_INT(v->dtype, t[i].dtype);
        FXT_EQ_INT(v->ndim, t[i].ndim);
        FXT_CHECK(!memcmp(v->shape, t[i].shape, sizeof v->shape));
        FXT_EQ_INT(v->nbytes, t[i].nbytes);
        FXT_CHECK(!t[i].nbytes || !memcmp(v->data, t[i].data, t[i].nbytes));
        FXT_EQ_INT((uintptr_t)v->data % fx_dtype_size(v->dtype), 0); /* aligned for its dtype */
    }
    /* Widest dtypes first. */
    for (size_t i = 1; i < fx_safetensors_count(f); i++)
        FXT_CHECK(fx_dtype_size(fx_safetensors_tensor(f, i - 1)->dtype) >= fx_dtype_size(fx_safetensors_tensor(f, i)->dtype));
    for (int k = 0; meta[k]; k += 2)
        FXT_EQ_STR(fx_safetensors_metadata(f, meta[k]), meta[k + 1]);

    /* Save the views of the open file over the same path: the mapping keeps the old file, the
       new one is identical byte for byte. */
    size_t n1, n2;
    unsigned char *before = read_bytes(p, &n1);
    fx_tensor_view copy[NT];
    for (size_t i = 0; i < fx_safetensors_count(f); i++)
        copy[i] = *fx_safetensors_tensor(f, i);
    FXT_OK(fx_safetensors_save(p, copy, NT, meta));
    unsigned char *after = read_bytes(p, &n2);
    FXT_CHECK(before && after && n1 == n2 && !memcmp(before, after, n1));
    free(before);
    free(after);
    fx_safetensors_free(f);
    for (int i = 0; i < NT; i++)
        free(bufs[i]);
}

/* ---- saving --------------------------------------------------------------------------------------- */

static void test_save_invalid(void)
{
    const char *p = tpath("keep.safetensors");
    float x[4] = {1, 2, 3, 4};
    fx_tensor_view good = {.name = "w", .dtype = FX_DT_F32, .ndim = 1, .shape = {4}, .data = x, .nbytes = 16};
    FXT_OK(fx_safetensors_save(p, &good, 1, NULL));
    size_t n0;
    unsigned char *orig = read_bytes(p, &n0);
    int entries = count_dir_entries(tmpdir);

    fx_tensor_view t[2] = {good, good};
    t[1].name = "b";
#define SAVE_FAILS(mod, meta, msg)                                                  \
    do {                                                                            \
        fx_tensor_view s_[2] = {t[0], t[1]};                                        \
        mod;                                                                        \
        FXT_STATUS(fx_safetensors_save(p, s_, 2, (meta)), FX_EINVAL, (msg));        \
    } while (0)
    SAVE_FAILS(s_[1].nbytes = 12, NULL, "tensor 'b': nbytes = 12 but shape x F32 needs 16");
    SAVE_FAILS(s_[1].shape[0] = 5, NULL, "nbytes = 16 but shape x F32 needs 20");
    SAVE_FAILS(s_[1].data = NULL, NULL, "tensor 'b': data is NULL");
    SAVE_FAILS(s_[1].name = "w", NULL, "tensor name 'w' appears twice");
    SAVE_FAILS(s_[1].name = NULL, NULL, "tensors.name[1] is NULL");
    SAVE_FAILS(s_[1].name = "\xff", NULL, "not valid UTF-8");
    SAVE_FAILS(s_[1].name = "__metadata__", NULL, "reserves");
    SAVE_FAILS(s_[1].dtype = (fx_dtype)99, NULL, "dtype 99 is not a dtype");
    SAVE_FAILS(s_[1].ndim = 9, NULL, "ndim = 9 is outside [0, 8]");
    SAVE_FAILS(s_[1].ndim = -1, NULL, "ndim = -1");
    SAVE_FAILS((s_[1].shape[0] = -4, s_[1].nbytes = 0), NULL, "shape[0] = -4 is negative");
    SAVE_FAILS((s_[1].ndim = 2, s_[1].shape[0] = INT64_MAX, s_[1].shape[1] = 4), NULL, "overflows");
    SAVE_FAILS((void)0, ((const char *const[]){"k", "v", "k2", NULL, NULL}), "metadata key 'k2' has no value");
    SAVE_FAILS((void)0, ((const char *const[]){"k", "v", "k", "w", NULL}), "metadata key 'k' appears twice");
    SAVE_FAILS((void)0, ((const char *const[]){"k", "\xc3", NULL}), "metadata value[0] is not valid UTF-8");
    FXT_STATUS(fx_safetensors_save(p, NULL, 2, NULL), FX_EINVAL, "tensors is NULL");
    FXT_STATUS(fx_safetensors_save(NULL, t, 2, NULL), FX_EINVAL, "path is NULL");
    FXT_STATUS(fx_safetensors_save("", t, 2, NULL), FX_EINVAL, "path is empty");
#undef SAVE_FAILS
    /* The existing file is untouched and no temporary is left behind. */
    size_t n1;
    unsigned char *now = read_bytes(p, &n1);
    FXT_CHECK(orig && now && n0 == n1 && !memcmp(orig, now, n0));
    FXT_EQ_INT(count_dir_entries(tmpdir), entries);
    free(orig);
    free(now);

    /* A directory that does not exist is an I/O error. */
    FXT_STATUS(fx_safetensors_save(tpath("no/such/dir.safetensors"), t, 2, NULL), FX_EIO, "temporary file");
    /* The target is a directory: rename fails, the temporary is removed. */
    const char *d = tpath("adir");
    mkdir(d, 0755);
    entries = count_dir_entries(tmpdir);
    FXT_STATUS(fx_safetensors_save(d, t, 2, NULL), FX_EIO, "cannot rename");
    FXT_EQ_INT(count_dir_entries(tmpdir), entries);
    rmdir(d);
}

static void test_save_replaces_atomically(void)
{
    const char *p = tpath("atomic.safetensors");
    uint8_t a = 1, b = 2;
    fx_tensor_view t = {.name = "x", .dtype = FX_DT_U8, .ndim = 1, .shape = {1}, .data = &a, .nbytes = 1};
    FXT_OK(fx_safetensors_save(p, &t, 1, NULL));
    fx_safetensors *old;
    FXT_OK(fx_safetensors_open(&old, p));
    t.data = &b;
    int entries = count_dir_entries(tmpdir);
    FXT_OK(fx_safetensors_save(p, &t, 1, NULL));
    FXT_EQ_INT(count_dir_entries(tmpdir), entries); /* replaced, nothing left over */
    fx_safetensors *neu;
    FXT_OK(fx_safetensors_open(&neu, p));
    FXT_EQ_INT(*(const uint8_t *)fx_safetensors_find(old, "x")->data, 1); /* old mapping intact */
    FXT_EQ_INT(*(const uint8_t *)fx_safetensors_find(neu, "x")->data, 2);
    fx_safetensors_free(old);
    fx_safetensors_free(neu);
    /* Default permissions: 0666 minus the umask, as for any new file. */
    mode_t saved = umask(022);
    FXT_OK(fx_safetensors_save(p, &t, 1, NULL));
    umask(saved);
    struct stat st;
    FXT_CHECK(stat(p, &st) == 0 && (st.st_mode & 0777) == 0644);
    /* A relative path (no directory part) works too. */
    char cwd[1024];
    if (getcwd(cwd, sizeof cwd) && chdir(tmpdir) == 0) {
        FXT_OK(fx_safetensors_save("rel.safetensors", &t, 1, NULL));
        FXT_CHECK(access("rel.safetensors", R_OK) == 0);
        FXT_CHECK(chdir(cwd) == 0);
    }
}

/* ---- sharded checkpoints ------------------------------------------------------------------- */

static void save_u8(const char *path, const char *const *names, int n, uint8_t base)
{
    fx_tensor_view t[8];
    static uint8_t vals[64];
    for (int i = 0; i < n; i++) {
        vals[base + i] = (uint8_t)(base + i);
        t[i] = (fx_tensor_view){.name = names[i], .dtype = FX_DT_U8, .ndim = 1, .shape = {1}, .data = &vals[base + i], .nbytes = 1};
    }
    if (fx_safetensors_save(path, t, (size_t)n, (const char *const[]){"format", "pt", NULL}) != FX_OK) {
        fprintf(stderr, "save %s: %s\n", path, fx_last_error());
        exit(2);
    }
}

static void write_text(const char *path, const char *s) { write_bytes(path, s, strlen(s)); }

static void test_index(void)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/model", tmpdir);
    mkdir(dir, 0755);
    char p1[700], p2[700], pi[700], sub[700];
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", dir);
    snprintf(pi, sizeof pi, "%s/model.safetensors.index.json", dir);
    save_u8(p1, (const char *const[]){"a", "b"}, 2, 0);
    save_u8(p2, (const char *const[]){"c", "d", "extra"}, 3, 10);
    write_text(pi, "{\"metadata\":{\"total_size\":5},\"weight_map\":{"
                   "\"d\":\"model-00002-of-00002.safetensors\",\"a\":\"model-00001-of-00002.safetensors\","
                   "\"c\":\"model-00002-of-00002.safetensors\",\"b\":\"model-00001-of-00002.safetensors\"}}");
    fx_safetensors_index *x = NULL;
    FXT_OK(fx_safetensors_index_open(&x, pi));
    if (!x)
        return;
    FXT_EQ_INT(fx_safetensors_index_count(x), 4);
    FXT_EQ_INT(fx_safetensors_index_shard_count(x), 2);
    FXT_EQ_STR(fx_safetensors_index_shard_name(x, 0), "model-00001-of-00002.safetensors");
    FXT_EQ_STR(fx_safetensors_index_shard_name(x, 1), "model-00002-of-00002.safetensors");
    FXT_CHECK(fx_safetensors_index_shard_name(x, 2) == NULL);
    size_t s = 99;
    const fx_tensor_view *v = fx_safetensors_index_tensor(x, 0, &s);
    FXT_CHECK(v && !strcmp(v->name, "d") && s == 1); /* weight_map order */
    FXT_CHECK(fx_safetensors_index_tensor(x, 4, NULL) == NULL);
    const char *all[] = {"a", "b", "c", "d"};
    const uint8_t want[] = {0, 1, 10, 11};
    for (int i = 0; i < 4; i++) {
        v = fx_safetensors_index_find(x, all[i]);
        FXT_CHECK(v && !strcmp(v->name, all[i]) && *(const uint8_t *)v->data == want[i]);
    }
    FXT_CHECK(fx_safetensors_index_find(x, "extra") == NULL); /* not in weight_map */
    FXT_CHECK(fx_safetensors_index_find(x, "zz") == NULL);
    FXT_EQ_STR(fx_safetensors_metadata(fx_safetensors_index_shard(x, 1), "format"), "pt");
    fx_safetensors_index_free(x);

    /* A shard in a subdirectory is inside the directory. */
    snprintf(sub, sizeof sub, "%s/sub", dir);
    mkdir(sub, 0755);
    char ps[800];
    snprintf(ps, sizeof ps, "%s/s.safetensors", sub);
    save_u8(ps, (const char *const[]){"q"}, 1, 20);
    write_text(pi, "{\"weight_map\":{\"q\":\"sub/s.safetensors\"}}");
    x = NULL;
    FXT_OK(fx_safetensors_index_open(&x, pi));
    FXT_CHECK(x && fx_safetensors_index_find(x, "q"));
    fx_safetensors_index_free(x);

    /* An outside file that exists, reachable by "..": refused before it is opened. */
    char outside[700];
    snprintf(outside, sizeof outside, "%s/outside.safetensors", tmpdir);
    save_u8(outside, (const char *const[]){"a"}, 1, 30);
    struct {
        const char *json, *msg;
        int status;
    } bad[] = {
        {"{\"weight_map\":{\"a\":\"../outside.safetensors\"}}", "shard name '../outside.safetensors' of tensor 'a' has an empty, '.' or '..' component", FX_EFORMAT},
        {"{\"weight_map\":{\"a\":\"sub/../../outside.safetensors\"}}", "'..' component", FX_EFORMAT},
        {"{\"weight_map\":{\"a\":\"..\"}}", "'..' component", FX_EFORMAT},
        {"{\"weight_map\":{\"a\":\"./model-00001-of-00002.safetensors\"}}", "'.' or '..'", FX_EFORMAT},
        {"{\"weight_map\":{\"a\":\"sub//s.safetensors\"}}", "empty", FX_EFORMAT},
        {"{\"weight_map\":{\"a\":\"sub/\"}}", "ends with '/'", FX_EFORMAT},
        {"{\"weight_map\":{\"a\":\"\"}}", "is empty", FX_EFORMAT},
        {"{\"weight_map\":{\"a\":\"..\\\\outside.safetensors\"}}", "backslash", FX_EFORMAT},
        {"{\"weight_map\":{\"a\":\"/etc/passwd\"}}", "absolute path", FX_EFORMAT},
        {"{\"weight_map\":{\"a\":5}}", "the shard of tensor 'a' is not a string", FX_EFORMAT},
        {"{\"weight_map\":[]}", "no \"weight_map\" object", FX_EFORMAT},
        {"{\"metadata\":{}}", "no \"weight_map\" object", FX_EFORMAT},
        {"[]", "not a JSON object", FX_EFORMAT},
        {"{\"weight_map\":{\"a\":\"x\",\"a\":\"y\"}}", "duplicate", FX_EFORMAT},
        {"{\"weight_map\":{}} x", "not strict JSON", FX_EFORMAT},
        {"{\"weight_map\":{\"zz\":\"model-00001-of-00002.safetensors\"}}",
         "tensor 'zz' is listed in shard 'model-00001-of-00002.safetensors', which has no such tensor", FX_EFORMAT},
        {"{\"weight_map\":{\"a\":\"missing.safetensors\"}}", "missing.safetensors: cannot open", FX_EIO},
        {"{\"weight_map\":{\"a\":\"broken.safetensors\"}}", "broken.safetensors: file is 3 bytes, shorter than the 8-byte header length", FX_EFORMAT},
    };
    char broken[700];
    snprintf(broken, sizeof broken, "%s/broken.safetensors", dir);
    write_text(broken, "abc");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(pi, bad[i].json);
        fx_safetensors_index *y = (fx_safetensors_index *)(uintptr_t)0x77;
        FXT_STATUS(fx_safetensors_index_open(&y, pi), bad[i].status, bad[i].msg);
        FXT_CHECK(y == (fx_safetensors_index *)(uintptr_t)0x77);
        FXT_HAS_STR(fx_last_error(), "model.safetensors.index.json: ");
    }
    /* An empty weight_map is an empty set. */
    write_text(pi, "{\"weight_map\":{}}");
    x = NULL;
    FXT_OK(fx_safetensors_index_open(&x, pi));
    FXT_EQ_INT(fx_safetensors_index_count(x), 0);
    fx_safetensors_index_free(x);
    FXT_STATUS(fx_safetensors_index_open(&x, tpath("none.json")), FX_EIO, "cannot open");
    FXT_STATUS(fx_safetensors_index_open(NULL, pi), FX_EINVAL, "out is NULL");
    fx_safetensors_index_free(NULL);
}

/* The former destructor names, fx_safetensors_close and fx_safetensors_index_close, are kept
   exported for callers linked against them: they release what the _free names release. */
static void test_close_aliases(void)
{
    char dir[600], p1[700], pi[700];
    snprintf(dir, sizeof dir, "%s/alias", tmpdir);
    mkdir(dir, 0755);
    snprintf(p1, sizeof p1, "%s/one.safetensors", dir);
    snprintf(pi, sizeof pi, "%s/model.safetensors.index.json", dir);
    save_u8(p1, (const char *const[]){"a", "b"}, 2, 0);
    write_text(pi, "{\"weight_map\":{\"a\":\"one.safetensors\",\"b\":\"one.safetensors\"}}");
    size_t before, now, peak;
    fx_mem_stats(&before, &peak);
    fx_safetensors *f = NULL;
    FXT_OK(fx_safetensors_open(&f, p1));
    fx_mem_stats(&now, &peak);
    FXT_CHECK(now > before);
    fx_safetensors_close(f);
    fx_mem_stats(&now, &peak);
    FXT_EQ_INT(now, before);
    fx_safetensors_index *x = NULL;
    FXT_OK(fx_safetensors_index_open(&x, pi));
    FXT_CHECK(x && fx_safetensors_index_find(x, "b"));
    fx_mem_stats(&now, &peak);
    FXT_CHECK(now > before);
    fx_safetensors_index_close(x);
    fx_mem_stats(&now, &peak);
    FXT_EQ_INT(now, before);
    fx_safetensors_close(NULL);
    fx_safetensors_index_close(NULL);
}

/* The library keeps nothing once everything is closed. */
/* Short distinct names: base-62 numbers. */
static size_t short_name(char *dst, size_t i)
{
    static const char d[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    size_t n = 0;
    do {
        dst[n++] = d[i % 62];
        i /= 62;
    } while (i);
    return n;
}

/* Cost proportional to the header: a legal header of many zero-size tensors (or many metadata
   keys) is parsed with at most 3x its size plus 1 MiB of the library's memory, and names the
   tensors right; a caller that wants one kind of file can refuse it by its metadata without
   building the table. */
static void test_header_cost(void)
{
    enum { NT = 200000 };
    static const char entry[] = "\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},";
    size_t cap = (size_t)NT * (sizeof entry + 8) + 64, o = 0;
    char *h = malloc(cap);
    o += (size_t)sprintf(h + o, "{\"__metadata__\":{\"format\":\"pt\"},");
    for (size_t i = 0; i < NT; i++) {
        h[o++] = '"';
        o += short_name(h + o, i);
        memcpy(h + o, entry, sizeof entry - 1);
        o += sizeof entry - 1;
    }
    h[o - 1] = '}';
    const char *p = file_with("many.safetensors", h, o, 0);
    size_t before, peak;
    fx_mem_stats(&before, NULL);
    fx_mem_reset_peak();
    fx_safetensors *f = NULL;
    FXT_OK(fx_safetensors_open(&f, p));
    fx_mem_stats(NULL, &peak);
    size_t used = peak - before, limit = 3 * o + (1u << 20);
    printf("  %d zero-size tensors, header %zu bytes: the parser held at most %zu bytes (%.2fx the header)\n", NT, o,
           used, (double)used / (double)o);
    if (used > limit)
        FXT_FAIL("parsing a %zu-byte header took %zu bytes, more than 3x + 1 MiB = %zu", o, used, limit);
    if (f) {
        FXT_CHECK(fx_safetensors_count(f) == NT);
        char name[16];
        name[short_name(name, NT - 1)] = '\0';
        const fx_tensor_view *v = fx_safetensors_find(f, name);
        FXT_CHECK(v && v->nbytes == 0 && v->ndim == 1 && v->shape[0] == 0);
        /* Zero-size tensors at one offset keep header order. */
        name[short_name(name, 5)] = '\0';
        FXT_EQ_STR(fx_safetensors_tensor(f, 5)->name, name);
        FXT_EQ_STR(fx_safetensors_metadata(f, "format"), "pt");
        fx_safetensors_free(f);
    }
    /* The peek: the format key without the tensor table, and nothing of the header's size. */
    char fmt[8];
    bool found = false;
    fx_mem_stats(&before, NULL);
    fx_mem_reset_peak();
    FXT_OK(fx_safetensors_peek_metadata(p, "format", fmt, sizeof fmt, &found));
    fx_mem_stats(NULL, &peak);
    FXT_CHECK(found);
    FXT_EQ_STR(fmt, "pt");
    if (peak - before > 4096)
        FXT_FAIL("the peek allocated %zu bytes", peak - before);
    FXT_OK(fx_safetensors_peek_metadata(p, "absent", fmt, sizeof fmt, &found));
    FXT_CHECK(!found && fmt[0] == '\0');
    FXT_STATUS(fx_safetensors_peek_metadata(p, "format", fmt, 2, &found), FX_ERANGE, "metadata 'format' is 2 bytes");
    free(h);

    /* Metadata-heavy: many one-letter keys with empty values. */
    enum { NM = 150000 };
    cap = (size_t)NM * 16 + 64, o = 0;
    h = malloc(cap);
    o += (size_t)sprintf(h + o, "{\"__metadata__\":{");
    for (size_t i = 0; i < NM; i++) {
        h[o++] = '"';
        o += short_name(h + o, i);
        memcpy(h + o, "\":\"\",", 5);
        o += 5;
    }
    h[o - 1] = '}';
    h[o++] = '}';
    p = file_with("meta.safetensors", h, o, 0);
    fx_mem_stats(&before, NULL);
    fx_mem_reset_peak();
    f = NULL;
    FXT_OK(fx_safetensors_open(&f, p));
    fx_mem_stats(NULL, &peak);
    used = peak - before, limit = 3 * o + (1u << 20);
    printf("  %d metadata keys, header %zu bytes: the parser held at most %zu bytes (%.2fx the header)\n", NM, o, used,
           (double)used / (double)o);
    if (used > limit)
        FXT_FAIL("parsing a %zu-byte header took %zu bytes, more than 3x + 1 MiB = %zu", o, used, limit);
    if (f) {
        char key[16];
        key[short_name(key, NM - 1)] = '\0';
        FXT_EQ_STR(fx_safetensors_metadata(f, key), "");
        FXT_EQ_STR(fx_safetensors_metadata_key(f, NM - 1), key);
        fx_safetensors_free(f);
    }
    free(h);
    /* The peek checks the syntax and the kind of __metadata__. */
    p = file_with("bad.safetensors", "{\"__metadata__\":[1]}", 20, 0);
    FXT_STATUS(fx_safetensors_peek_metadata(p, "format", fmt, sizeof fmt, &found), FX_EFORMAT, "__metadata__ is an array");
    p = file_with("bad.safetensors", "{\"a\":1,}", 8, 0);
    FXT_STATUS(fx_safetensors_peek_metadata(p, "format", fmt, sizeof fmt, &found), FX_EFORMAT, "not strict JSON");
    FXT_STATUS(fx_safetensors_peek_metadata(tpath("none"), "format", fmt, sizeof fmt, &found), FX_EIO, "cannot open");
}

static void test_no_leaks(void)
{
    size_t before, after, peak;
    fx_mem_stats(&before, &peak);
    const char *h = "{\"__metadata__\":{\"a\":\"b\"},\"w\":" T_U8 "}";
    const char *p = file_with("leak.safetensors", h, strlen(h), 4);
    for (int i = 0; i < 3; i++) {
        fx_safetensors *f;
        FXT_OK(fx_safetensors_open(&f, p));
        fx_safetensors_free(f);
        p = file_with("leak2.safetensors", "{\"w\":5}", 7, 0);
        FXT_STATUS(fx_safetensors_open(&f, p), FX_EFORMAT, "");
        p = file_with("leak.safetensors", h, strlen(h), 4);
    }
    fx_mem_stats(&after, &peak);
    FXT_EQ_INT(after, before);
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    fxt_make_tmpdir(tmpdir, sizeof tmpdir, "flexc-st");
    FXT_RUN(test_reference_deserialization);
    FXT_RUN(test_reference_scalar_and_zero_size);
    FXT_RUN(test_reference_errors);
    FXT_RUN(test_reference_json_attack);
    FXT_RUN(test_reference_whitespace);
    FXT_RUN(test_reference_serialization_bytes);
    FXT_RUN(test_rule_json_strict);
    FXT_RUN(test_rule_numbers);
    FXT_RUN(test_rule_depth);
    FXT_RUN(test_rule_entries);
    FXT_RUN(test_rule_sizes);
    FXT_RUN(test_rule_layout);
    FXT_RUN(test_rule_metadata);
    FXT_RUN(test_open_io_errors);
    FXT_RUN(test_order_and_alignment);
    FXT_RUN(test_find_many);
    FXT_RUN(test_roundtrip_every_dtype);
    FXT_RUN(test_save_invalid);
    FXT_RUN(test_save_replaces_atomically);
    FXT_RUN(test_index);
    FXT_RUN(test_close_aliases);
    FXT_RUN(test_header_cost);
    FXT_RUN(test_no_leaks);
    fxt_rm_tree(tmpdir);
    return fxt_finish();
}
