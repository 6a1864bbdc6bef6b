/* libFuzzer target: the tokenizer on arbitrary bytes. The first byte picks what to do:
     even: the rest is a tokenizer.json; when it loads, encode and decode a fixed text with it;
     odd:  the rest is text for fixture tokenizer (byte / 2) % 7 (tests/fixtures/tokenizers,
           found from the working directory or FLEXC_SOURCE_DIR): encode it, decode the ids, and
           decode the text's bytes read as ids.
   Beyond "no crash, no leak": encoding is the same twice, and for byte-level tokenizers
   decoding valid UTF-8 text gives the text back. */
#include "tokenizer/tok_internal.h"
#include "core/fuzz_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const NAMES[] = {"gpt2", "llama3", "qwen2", "llama2", "mistral", "smollm", "metaspace"};
enum { NFIX = 7 };
static fx_tokenizer *fixtures[NFIX];

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
    return 0;
}

static void roundtrip(const fx_tokenizer *t, const char *text, size_t n, bool byte_level)
{
    fx_ids a = {0}, b = {0};
    int rc = fx_tokenizer_encode(t, &a, text, n);
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
            roundtrip(t, text, sizeof text - 1, false);
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
    roundtrip(t, rest, n, k == 1 || k == 5);
    int32_t ids[64];
    size_t m = n / 2 < 64 ? n / 2 : 64;
    for (size_t i = 0; i < m; i++)
        ids[i] = (int32_t)(((uint8_t)rest[2 * i] | (uint8_t)rest[2 * i + 1] << 8) % fx_tokenizer_vocab_size(t));
    fx_text out = {0};
    (void)fx_tokenizer_decode(t, &out, ids, (int64_t)m);
    fx_text_free(&out);
    return 0;
}
