/* libFuzzer target: the tokenizer on arbitrary bytes. The first byte picks what to do:
     even: the rest is a tokenizer.json; when it loads, encode and decode a fixed text with it;
     odd:  the rest is text for fixture tokenizer (byte / 2) % 7 (tests/fixtures/tokenizers,
           found from the working directory or FLEXC_SOURCE_DIR): encode it, decode the ids, and
           decode the text's bytes read as ids.
   Beyond "no crash, no leak": encoding is the same twice, and for byte-level tokenizers
   decoding valid UTF-8 text gives the text back. The regexes' cost: a fixture encodes any
   text (never over its work budget), the family patterns counted take at most 32 steps a
   byte of it, and each regex of a fuzzed tokenizer.json runs over a 4 KB text within its
   budget and well within a second. */
#include "tokenizer/tok_internal.h"
#include "core/fuzz_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const NAMES[] = {"gpt2", "llama3", "qwen2", "llama2", "mistral", "smollm", "metaspace"};
enum { NFIX = 7 };
static fx_tokenizer *fixtures[NFIX];
static fx__regex counted[FX__FAMILY_PATTERNS]; /* the family patterns, their work counted */
static fx__matcher matcher;
static char long_text[4096];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *src = getenv("FLEXC_SOURCE_DIR");
    for (int i = 0; i < NFIX; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tests/fixtures/tokenizers/%s/tokenizer.json", src ? src : ".", NAMES[i]);
        if (fx_tokenizer_load(&fixtures[i], path) != FX_OK) {
            fprintf(stderr, "fuzz_tokenizer: %s\n", fx_last_error());
            exit(1);
        }
    }
    for (int i = 0; i < FX__FAMILY_PATTERNS; i++)
        if (fx__regex_init(&counted[i], fx__family_patterns[i], strlen(fx__family_patterns[i]), false, true,
                           "family") != FX_OK)
            exit(1);
    if (fx__matcher_init(&matcher) != FX_OK)
        exit(1);
    static const char *const units[] = {"aaaaaaaaaaaaaaaaaaa ", "word ", "  \n", "12345", "!!'s",
                                        "\xc3\xa9\xe6\x95\xb0"};
    for (size_t k = 0, i = 0; k + 32 < sizeof long_text; i++) {
        const char *u = units[(i * 7 + i / 5) % 6];
        size_t reps = 1 + (i * 13) % 40, ul = strlen(u);
        for (size_t r = 0; r < reps && k + ul + 1 < sizeof long_text; r++, k += ul)
            memcpy(long_text + k, u, ul);
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Every match of re in s[0 .. n) with a fresh budget, as the pre-tokenizer splits: the status
   (FX_OK, or over the budget or a limit) and the work. */
static int regex_pass(const fx__regex *re, const char *s, size_t n, uint64_t *work)
{
    fx__matcher_reset(&matcher);
    fx__matcher_add(&matcher, n);
    size_t pos = 0, ms, me;
    int rc;
    while ((rc = fx__regex_next(re, &matcher, s, n, pos, &ms, &me)) == FX_OK) {
        if (me > ms)
            pos = me;
        else if (me < n)
            pos = me + fx__utf8_len((unsigned char)s[me]);
        else
            break;
    }
    *work = matcher.work;
    return rc == 1 ? FX_OK : rc;
}

/* A fuzzed tokenizer's regexes over the long text: each ends in its budget (a step past it at
   most, the one that crossed it) and soon. */
static void regex_costs(const fx_tokenizer *t)
{
    const fx__regex *res[64];
    size_t n = 0;
    for (size_t i = 0; i < t->n_norms && n < 64; i++)
        res[n++] = &t->norms[i].pattern;
    for (size_t i = 0; i < t->n_pres && n < 64; i++)
        res[n++] = &t->pres[i].pattern;
    for (size_t i = 0; i < t->n_decs && n < 64; i++)
        res[n++] = &t->decs[i].pattern;
    size_t len = strlen(long_text);
    for (size_t i = 0; i < n; i++) {
        if (!res[i]->code)
            continue;
        uint64_t work;
        double t0 = now_s();
        int rc = regex_pass(res[i], long_text, len, &work);
        FUZZ_CHECK(rc == FX_OK || fx_last_error()[0]); /* over the budget or a limit: said so */
        FUZZ_CHECK(work <= matcher.budget + 1 + len);
        FUZZ_CHECK(now_s() - t0 < 1.0);
    }
}

static void roundtrip(const fx_tokenizer *t, const char *text, size_t n, bool byte_level, bool fixture)
{
    fx_ids a = {0}, b = {0};
    int rc = fx_tokenizer_encode(t, &a, text, n);
    FUZZ_CHECK(rc == FX_OK || !fixture);
    if (rc == FX_OK) {
        FUZZ_CHECK(fx_tokenizer_encode(t, &b, text, n) == FX_OK);
        FUZZ_CHECK(a.n == b.n && (a.n == 0 || !memcmp(a.ids, b.ids, (size_t)a.n * 4)));
        fx_text out = {0};
        FUZZ_CHECK(fx_tokenizer_decode(t, &out, a.ids, a.n) == FX_OK);
        if (byte_level && fx__utf8_valid_prefix(text, n) == n)
            FUZZ_CHECK(out.len == n && (n == 0 || !memcmp(out.data, text, n)));
        fx_text_free(&out);
    }
    fx_ids_free(&a);
    fx_ids_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const char *rest = (const char *)data + 1;
    size_t n = size - 1;
    if (data[0] % 2 == 0) {
        fx_tokenizer *t = NULL;
        if (fx_tokenizer_load_json(&t, rest, n) == FX_OK) {
            static const char text[] = "Hello, w\xc3\xb6rld! 12 <s>  \n\xe4\xb8\xad \xff";
            roundtrip(t, text, sizeof text - 1, false, false);
            regex_costs(t);
            int32_t ids[4] = {0, 1, 2, (int32_t)fx_tokenizer_vocab_size(t) - 1};
            fx_text out = {0};
            (void)fx_tokenizer_decode(t, &out, ids, fx_tokenizer_vocab_size(t) >= 3 ? 4 : 0);
            fx_text_free(&out);
            fx_tokenizer_free(t);
        }
        return 0;
    }
    int k = (data[0] / 2) % NFIX;
    const fx_tokenizer *t = fixtures[k];
    /* llama3 and smollm give valid text back exactly (gpt2 has an lstrip token, qwen2
       normalizes). */
    roundtrip(t, rest, n, k == 1 || k == 5, true);
    /* The family patterns' work on this text (made valid UTF-8, as encoding does). */
    fx__buf valid = {0};
    FUZZ_CHECK(fx__utf8_lossy(&valid, rest, n) == FX_OK);
    for (int i = 0; i < FX__FAMILY_PATTERNS; i++) {
        uint64_t work;
        FUZZ_CHECK(regex_pass(&counted[i], valid.p ? valid.p : "", valid.n, &work) == FX_OK);
        FUZZ_CHECK(work <= 64 + 32 * (uint64_t)valid.n);
    }
    fx__buf_free(&valid);
    int32_t ids[64];
    size_t m = n / 2 < 64 ? n / 2 : 64;
    for (size_t i = 0; i < m; i++)
        ids[i] = (int32_t)(((uint8_t)rest[2 * i] | (uint8_t)rest[2 * i + 1] << 8) % fx_tokenizer_vocab_size(t));
    fx_text out = {0};
    (void)fx_tokenizer_decode(t, &out, ids, (int64_t)m);
    fx_text_free(&out);
    return 0;
}
