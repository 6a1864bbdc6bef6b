/* libFuzzer target: a Hugging Face checkpoint's config.json and generation_config.json on
   arbitrary bytes. The input is config.json, then optionally a NUL byte and
   generation_config.json (JSON text holds no raw NUL). Beyond "no crash, no leak": a
   configuration that parses is written back (fx__hf_config_json, the export's writer) and
   parses again to the same fields, and the writer's generation_config.json gives the same
   special ids. */
#include "hf/hf.h"
#include "model/config.h"
#include "core/fuzz_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *dtype_name(fx_dtype d)
{
    return d == FX_DT_BF16 ? "bfloat16" : d == FX_DT_F16 ? "float16" : "float32";
}

/* Every field: the model's by its field table, then the file's own. */
static bool same(const fx__hf_config *a, const fx__hf_config *b)
{
    return !fx__config_diff(&a->m, &b->m) && a->arch == b->arch && a->bos == b->bos && a->dtype == b->dtype;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    const char *nul = memchr(text, '\0', size);
    const size_t len = nul ? (size_t)(nul - text) : size;
    const char *gen = nul ? nul + 1 : NULL;
    const size_t gen_len = nul ? size - len - 1 : 0;

    fx__hf_config c;
    memset(&c, 0x5a, sizeof c);
    if (fx__hf_config_parse(&c, text, len, gen, gen_len) != FX_OK)
        return 0;
    char *json = NULL, *gjson = NULL;
    FUZZ_CHECK(fx__hf_config_json(&json, &c, dtype_name(c.dtype)) == FX_OK);
    FUZZ_CHECK(fx__hf_generation_json(&gjson, &c) == FX_OK);
    fx__hf_config back, gback;
    FUZZ_CHECK(fx__hf_config_parse(&back, json, strlen(json), NULL, 0) == FX_OK);
    FUZZ_CHECK(same(&c, &back));
    /* The special ids from the written generation_config.json, over the written config.json. */
    FUZZ_CHECK(fx__hf_config_parse(&gback, json, strlen(json), gjson, strlen(gjson)) == FX_OK);
    FUZZ_CHECK(same(&c, &gback));
    fx__free(json);
    fx__free(gjson);
    return 0;
}
