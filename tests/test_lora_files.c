/* LoRA adapters in files (src/model/lora_ckpt.c): PEFT's adapters (tests/fixtures/lora, made by
   scripts/make_lora_fixtures.py) give PEFT's logits through flexc, unmerged on the mapped base
   and merged into a float32 one; a LoRA checkpoint reads back bit for bit (adapters, moments,
   dropout stream); an exported PEFT directory reads back as the same model; adapter files that
   are not what they claim are refused by name. */
#include "harness.h"
#include "tmpdir.h"

#include "model/lora.h"
#include "model/model.h"
#include "model/model_internal.h"

#include <flexc/safetensors.h>

#include <limits.h>
#include <string.h>

static const char *src_dir(void)
{
    return getenv("FLEXC_SOURCE_DIR") ? getenv("FLEXC_SOURCE_DIR") : ".";
}

/* Logits [T, V] of tokens through m. */
static float *logits_of(fx_model *m, const int32_t *tok, int64_t T)
{
    float *l = malloc((size_t)(T * m->c.vocab) * sizeof *l);
    FXT_OK(fx_model_forward(m, NULL, l, tok, NULL, 1, T, 0));
    return l;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    FXT_CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    s[fread(s, 1, (size_t)n, f)] = '\0';
    fclose(f);
    return s;
}

static const char *const peft_fixtures[] = {"llama_bf16", "qwen2_bias"};

/* PEFT's adapter through flexc: PEFT's logits (float32) within 1e-4, unmerged on the mapped
   base (fx_model_load and fx_model_load_inference) and merged into float32 weights. */
static void test_peft_fixture(void)
{
    for (size_t f = 0; f < sizeof peft_fixtures / sizeof peft_fixtures[0]; f++) {
        char dir[1024], ref_path[1024];
        snprintf(dir, sizeof dir, "%s/tests/fixtures/lora/%s", src_dir(), peft_fixtures[f]);
        snprintf(ref_path, sizeof ref_path, "%s/tests/fixtures/lora/%s.ref.safetensors", src_dir(), peft_fixtures[f]);
        fx_safetensors *ref = NULL;
        FXT_OK(fx_safetensors_open(&ref, ref_path));
        if (!ref)
            return;
        const fx_tensor_view *tv = fx_safetensors_find(ref, "tokens"), *lv = fx_safetensors_find(ref, "logits");
        const int64_t T = tv->shape[0], V = lv->shape[1];
        int32_t tok[64];
        FXT_CHECK(T <= 64);
        for (int64_t t = 0; t < T; t++)
            tok[t] = (int32_t)((const int64_t *)tv->data)[t];
        double *want = fxt_alloc_f64((size_t)(T * V));
        for (int64_t i = 0; i < T * V; i++)
            want[i] = ((const float *)lv->data)[i];

        fx_model *m = NULL, *mi = NULL, *merged = NULL;
        FXT_OK(fx_model_load(&m, dir));
        FXT_OK(fx_model_load_inference(&mi, dir));
        fx__lora_source src;
        bool found = false;
        FXT_OK(fx__lora_source_find(dir, &src, &found));
        FXT_CHECK(found && src.peft);
        FXT_OK(fx__lora_open(&merged, &src, true));
        if (!m || !mi || !merged)
            return;
        FXT_CHECK(m->lora && fx__model_on_map(m) && !merged->lora && !fx__model_on_map(merged));
        /* Decoding on the mapped base (the prompt's prefill, then one step): PEFT's last rows. */
        fx_model_cache *cache = NULL;
        float *last = malloc((size_t)V * sizeof *last);
        FXT_OK(fx_model_cache_create(&cache, mi, T));
        FXT_OK(fx_model_prefill(mi, cache, last, tok, T - 1));
        FXT_CHECK(fx__model_on_map(mi));
        fxt_close_f32("prefill's last logits", last, want + (T - 2) * V, (size_t)V, 1e-4, 1e-4);
        FXT_OK(fx_model_decode_step(mi, cache, last, tok[T - 1]));
        fxt_close_f32("a decoding step's logits", last, want + (T - 1) * V, (size_t)V, 1e-4, 1e-4);
        fx_model_cache_free(cache);
        free(last);
        float *got = logits_of(m, tok, T), *got_i = logits_of(mi, tok, T), *got_m = logits_of(merged, tok, T);
        char what[128];
        snprintf(what, sizeof what, "%s: PEFT's logits, adapters on the mapped base", peft_fixtures[f]);
        fxt_close_f32(what, got, want, (size_t)(T * V), 1e-4, 1e-4);
        fxt_bitwise_f32("fx_model_load_inference", got, got_i, (size_t)(T * V));
        snprintf(what, sizeof what, "%s: PEFT's logits, adapters merged", peft_fixtures[f]);
        fxt_close_f32(what, got_m, want, (size_t)(T * V), 1e-4, 1e-4);
        free(got), free(got_i), free(got_m), free(want);
        fx_model_free(m), fx_model_free(mi), fx_model_free(merged);
        fx_safetensors_close(ref);
    }
}

/* A mapped base with adapters of random B, AdamW moments from two steps. */
static fx_model *trained(const char *name, const fx__lora_config *lc, char *base, size_t n)
{
    snprintf(base, n, "%s/tests/fixtures/models/%s", src_dir(), name);
    fx_model *m = NULL;
    FXT_OK(fx_model_load_inference(&m, base));
    fx__lora *a = NULL;
    FXT_OK(fx__lora_create(&a, &m->c, lc, 7));
    for (size_t i = 0; i < a->total; i++)
        a->params[i] += 0.01f * (float)((i * 2654435761u) % 1000) / 1000.0f;
    FXT_OK(fx__model_set_lora(m, a));
    FXT_OK(fx__model_set_batch(m, 1, 16));
    int32_t tok[16], tgt[16];
    for (int t = 0; t < 16; t++)
        tok[t] = (t * 37 + 5) % (int)m->c.vocab, tgt[t] = (t * 53 + 11) % (int)m->c.vocab;
    for (int s = 0; s < 2; s++) {
        float loss;
        fx__model_zero_grad(m);
        FXT_OK(fx__model_forward(m, tok, tgt, &loss, true));
        FXT_OK(fx__model_backward(m));
        FXT_OK(fx__lora_alloc_train(a));
        const fx__adamw o = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f};
        fx__lora_adamw(a, &o, s + 1);
    }
    return m;
}

/* A LoRA checkpoint: saved, read back into a fresh mapped base with the same adapters,
   moments and dropout stream, bit for bit; fx_model_load of the file gives the same logits. */
static void test_checkpoint(void)
{
    char dir[256], path[512], base[1024];
    fxt_make_tmpdir(dir, sizeof dir, "flexc-lora-files");
    fx__lora_config lc = fx__lora_defaults(3);
    lc.dropout = 0.25f;
    lc.targets = 1u << FX__LORA_Q | 1u << FX__LORA_V | 1u << FX__LORA_DOWN;
    fx_model *m = trained("qwen2_bias", &lc, base, sizeof base);
    if (!m)
        return;
    m->lora->drop_step = 42;
    fx__model_train_state st = {.step = 2, .steps = 10, .batch = 1, .seq = 16, .accum = 1, .lr = 1e-2f,
                                .min_lr = 1e-3f, .weight_decay = 0.0f, .clip = 1.0f, .beta1 = 0.9f, .beta2 = 0.95f,
                                .seed = 7, .data = "corpus.txt"};
    snprintf(st.attn, sizeof st.attn, "causal");
    fx_rng_init(&st.rng, 7, 1);
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", dir);
    FXT_OK(fx__lora_save_checkpoint(m, &st, base, path));

    fx_model *back = NULL;
    FXT_OK(fx_model_load_inference(&back, base));
    if (!back)
        return;
    FXT_OK(fx__lora_load(back, path, true));
    const fx__lora *a = m->lora, *b = back->lora;
    FXT_CHECK(b && b->total == a->total && b->cfg.targets == a->cfg.targets && b->cfg.rank == 3);
    FXT_CHECK(b->cfg.dropout == 0.25f && b->drop_seed == a->drop_seed && b->drop_step == 42);
    if (b && b->total == a->total) {
        fxt_bitwise_f32("adapters", a->params, b->params, a->total);
        fxt_bitwise_f32("first moments", a->adam_m, b->adam_m, a->total);
        fxt_bitwise_f32("second moments", a->adam_v, b->adam_v, a->total);
    }
    /* The model file's reader refuses it, naming what it is. */
    FXT_CHECK(fx__model_load(back, path, false) == FX_EFORMAT && strstr(fx_last_error(), "LoRA adapters"));
    /* Opened on its own: the base it names, mapped, and the adapters. */
    fx_model *opened = NULL;
    FXT_OK(fx_model_load(&opened, dir));
    int32_t tok[12] = {1, 5, 9, 33, 2, 7, 100, 8, 3, 4, 60, 11};
    if (opened) {
        FXT_CHECK(opened->lora && fx__model_on_map(opened));
        float *l0 = logits_of(m, tok, 12), *l1 = logits_of(opened, tok, 12);
        fxt_bitwise_f32("logits of the checkpoint opened", l0, l1, (size_t)(12 * m->c.vocab));
        free(l0), free(l1);
    }
    /* Another base's config: refused. */
    fx_model *other = NULL;
    char obase[1024];
    snprintf(obase, sizeof obase, "%s/tests/fixtures/models/llama_bf16", src_dir());
    FXT_OK(fx_model_load_inference(&other, obase));
    FXT_CHECK(fx__lora_load(other, path, false) == FX_EINVAL && strstr(fx_last_error(), "another model"));
    fx_model_free(other), fx_model_free(opened), fx_model_free(back), fx_model_free(m);
    fxt_rm_tree(dir);
}

/* An exported PEFT directory (float32) reads back as the same model, bit for bit; in BF16 its
   tensors are the float32 ones rounded. */
static void test_export(void)
{
    char dir[256], base[1024], abs_base[PATH_MAX];
    fxt_make_tmpdir(dir, sizeof dir, "flexc-lora-export");
    fx__lora_config lc = fx__lora_defaults(2);
    lc.alpha = 5.0f;
    fx_model *m = trained("llama_bf16", &lc, base, sizeof base);
    if (!m || !realpath(base, abs_base))
        return;
    FXT_OK(fx__lora_export_peft(m->lora, dir, abs_base, FX_DT_F32));
    char path[512];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *cfg = read_file(path);
    FXT_CHECK(cfg && strstr(cfg, "\"lora_alpha\": 5.0") && strstr(cfg, "\"r\": 2") &&
              strstr(cfg, "\"peft_type\": \"LORA\"") && strstr(cfg, "\"down_proj\""));
    free(cfg);
    fx_model *back = NULL;
    FXT_OK(fx_model_load(&back, dir));
    int32_t tok[10] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
    if (back) {
        float *l0 = logits_of(m, tok, 10), *l1 = logits_of(back, tok, 10);
        fxt_bitwise_f32("logits through the exported adapter", l0, l1, (size_t)(10 * m->c.vocab));
        free(l0), free(l1);
    }
    fx_model_free(back);
    fx_model_free(m);
    fxt_rm_tree(dir);
}

/* Adapter directories that are not PEFT's plain LoRA on this base are refused by name. */
static void test_refusals(void)
{
    char dir[256], path[1100], fixture[1024];
    fxt_make_tmpdir(dir, sizeof dir, "flexc-lora-bad");
    snprintf(fixture, sizeof fixture, "%s/tests/fixtures/lora/qwen2_bias", src_dir());
    char *good = NULL;
    snprintf(path, sizeof path, "%s/adapter_config.json", fixture);
    good = read_file(path);
    FXT_CHECK(good != NULL);
    if (!good)
        return;
    char abs_base[PATH_MAX], rel[1100];
    snprintf(rel, sizeof rel, "%s/tests/fixtures/models/qwen2_bias", src_dir());
    FXT_CHECK(realpath(rel, abs_base) != NULL);
    /* The adapter's tensors, linked from the fixture. */
    char tensors[512], target[1100];
    snprintf(tensors, sizeof tensors, "%s/adapter_model.safetensors", dir);
    snprintf(target, sizeof target, "%s/adapter_model.safetensors", fixture);
    char real_target[PATH_MAX];
    FXT_CHECK(realpath(target, real_target) != NULL);
    FXT_CHECK(symlink(real_target, tensors) == 0);
    const struct { const char *from, *to, *error; } cases[] = {
        {"\"use_dora\": false", "\"use_dora\": true", "use_dora"},
        {"\"use_rslora\": false", "\"use_rslora\": true", "use_rslora"},
        {"\"k_proj\",", "\"k_proj\", \"lm_head\",", "lm_head"},
        {"\"r\": 3", "\"r\": 4", "is not ["},
        {"\"up_proj\"", "\"up_proj\", \"down_proj\"", "holds"},
        {"\"peft_type\": \"LORA\"", "\"peft_type\": \"IA3\"", "peft_type"},
        {"\"layers_to_transform\": null", "\"layers_to_transform\": [0]", "layers_to_transform"},
        {"\"../../models/qwen2_bias\"", "\"/nonexistent/base\"", "not a Hugging Face model directory"},
        {"\"bias\": \"none\"", "\"bias\": \"all\"", "bias"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *at = strstr(good, cases[i].from);
        FXT_CHECK(at != NULL);
        if (!at)
            continue;
        char text[8192];
        snprintf(text, sizeof text, "%.*s%s%s", (int)(at - good), good, cases[i].to, at + strlen(cases[i].from));
        /* The base: an absolute path (the fixture's is relative to its own directory). */
        char *rb = strstr(text, "\"../../models/qwen2_bias\"");
        if (rb) {
            char fixed[8192];
            snprintf(fixed, sizeof fixed, "%.*s\"%s\"%s", (int)(rb - text), text, abs_base,
                     rb + strlen("\"../../models/qwen2_bias\""));
            memcpy(text, fixed, strlen(fixed) + 1);
        }
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        write_file(path, text);
        fx_model *m = NULL;
        int rc = fx_model_load(&m, dir);
        if (rc == FX_OK || !strstr(fx_last_error(), cases[i].error))
            FXT_FAIL("case %zu (%s): rc %d, error '%s', expected one naming '%s'", i, cases[i].to, rc,
                     fx_last_error(), cases[i].error);
        fx_model_free(m);
    }
    free(good);
    fxt_rm_tree(dir);
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    FXT_RUN(test_peft_fixture);
    FXT_RUN(test_checkpoint);
    FXT_RUN(test_export);
    FXT_RUN(test_refusals);
    return fxt_finish();
}
