/* Hugging Face models: config.json parsing and refusals, the weight table and its checks, the
   RoPE row permutation, export (bitwise round trip), and a float64 forward over the tensors in
   flexc's layout against the transformers reference outputs of tests/fixtures/models (made by
   scripts/fixtures_models.py). */
#include "harness.h"
#include "tmpdir.h"

#include "model/model.h"
#include "hf/hf.h"

#include <flexc/model.h>

#include <dirent.h>
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const fixtures[] = {"llama3_tied", "llama_bf16", "mistral_f16", "qwen2_bias"};
enum { NFIX = sizeof fixtures / sizeof fixtures[0] };

static char tmpdir[512];


static void fixture_path(char *buf, size_t n, const char *name, const char *suffix)
{
    const char *src = getenv("FLEXC_SOURCE_DIR") ? getenv("FLEXC_SOURCE_DIR") : ".";
    snprintf(buf, n, "%s/tests/fixtures/models/%s%s", src, name, suffix);
}

static char *slurp(const char *path, size_t *len)
{
    char *text = NULL;
    size_t n = 0;
    if (fx__hf_read_text(&text, &n, path) != FX_OK) {
        fprintf(stderr, "cannot read %s: %s\n", path, fx_last_error());
        exit(2);
    }
    if (len)
        *len = n;
    return text;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        perror(path);
        exit(2);
    }
}

/* ---- configuration ------------------------------------------------------------------------- */

static void test_config_fixtures(void)
{
    fx__hf_config c;
    char dir[1024];
    fixture_path(dir, sizeof dir, "llama3_tied", "");
    FXT_OK(fx__hf_config_read(&c, dir));
    FXT_EQ_INT(c.arch, FX__HF_LLAMA);
    FXT_EQ_INT(c.m.vocab, 512);
    FXT_EQ_INT(c.m.dim, 64);
    FXT_EQ_INT(c.m.heads, 4);
    FXT_EQ_INT(c.m.kv_heads, 2);
    FXT_EQ_INT(c.m.head_dim, 16);
    FXT_EQ_INT(c.m.ffn, 128);
    FXT_EQ_INT(c.m.layers, 2);
    FXT_CHECK(c.m.tied_embeddings);
    FXT_CHECK(!c.m.qkv_bias);
    FXT_EQ_INT(c.m.sliding_window, 0);
    FXT_EQ_INT(c.m.rope_scaling.type, FX_ROPE_SCALING_LLAMA3); /* the rope_theta + rope_scaling spelling */
    FXT_NEAR(c.m.rope_theta, 10000.0, 0, 0);
    FXT_NEAR(c.m.rope_scaling.factor, 4.0, 0, 0);
    FXT_EQ_INT(c.m.rope_scaling.original_max_position_embeddings, 16);
    FXT_NEAR(c.m.norm_eps, 1e-5f, 0, 0); /* as the model holds it: a float */
    FXT_EQ_INT(c.m.n_eos, 1);
    FXT_EQ_INT(c.m.eos[0], 1);
    FXT_EQ_INT(c.bos, 0);
    FXT_EQ_INT(c.dtype, FX_DT_F32);

    fixture_path(dir, sizeof dir, "llama_bf16", "");
    FXT_OK(fx__hf_config_read(&c, dir));
    FXT_EQ_INT(c.m.head_dim, 32); /* != hidden / heads */
    FXT_EQ_INT(c.dtype, FX_DT_BF16);
    FXT_CHECK(!c.m.tied_embeddings);
    FXT_EQ_INT(c.m.rope_scaling.type, FX_ROPE_SCALING_NONE); /* rope_parameters */
    FXT_NEAR(c.m.rope_theta, 500000.0, 0, 0);
    FXT_EQ_INT(c.m.n_eos, 2);
    FXT_EQ_INT(c.m.eos[0], 1);
    FXT_EQ_INT(c.m.eos[1], 2);

    fixture_path(dir, sizeof dir, "mistral_f16", "");
    FXT_OK(fx__hf_config_read(&c, dir));
    FXT_EQ_INT(c.arch, FX__HF_MISTRAL);
    FXT_EQ_INT(c.m.sliding_window, 8);
    FXT_EQ_INT(c.m.kv_heads, 1);

    fixture_path(dir, sizeof dir, "qwen2_bias", "");
    FXT_OK(fx__hf_config_read(&c, dir));
    FXT_EQ_INT(c.arch, FX__HF_QWEN2);
    FXT_CHECK(c.m.qkv_bias);
    FXT_EQ_INT(c.m.sliding_window, 0); /* sliding_window null, use_sliding_window false */
    FXT_NEAR(c.m.rope_theta, 1e6, 0, 0);
}

/* The llama3_tied config.json with `patch` (a JSON object) merged in: a key set to null in the
   patch is deleted from the config. Returns the status of parsing it (gen: generation_config
   text or NULL). */
static int parse_patched(const char *patch, const char *gen, fx__hf_config *c)
{
    char path[1024];
    fixture_path(path, sizeof path, "llama3_tied", "/config.json");
    char *text = slurp(path, NULL);
    json_error_t e;
    json_t *root = json_loads(text, 0, &e), *p = json_loads(patch, 0, &e);
    fx__free(text);
    if (!root || !p) {
        fprintf(stderr, "bad patch %s: %s\n", patch, e.text);
        exit(2);
    }
    const char *k;
    json_t *v;
    json_object_foreach(p, k, v) {
        if (json_is_null(v))
            json_object_del(root, k);
        else
            json_object_set(root, k, v);
    }
    char *out = json_dumps(root, 0);
    json_decref(root);
    json_decref(p);
    fx__hf_config tmp;
    int rc = fx__hf_config_parse(c ? c : &tmp, out, strlen(out), gen, gen ? strlen(gen) : 0);
    free(out);
    return rc;
}

/* A config that parse_patched must refuse with `status` and a message containing `msg`. */
typedef struct config_case {
    const char *patch;
    const char *gen; /* generation_config.json text, or NULL */
    int status;
    const char *msg;
} config_case;

/* After a table case's checks: names the case if one of them failed since `before`. */
static void name_failed_case(int before, const char *what)
{
    if (fxt_failed_checks != before)
        fprintf(stderr, "    (case %s)\n", what);
}

/* FXT_STATUS for each case, naming the one that failed. */
static void expect_refusals(const config_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const int before = fxt_failed_checks;
        FXT_STATUS(parse_patched(cases[i].patch, cases[i].gen, NULL), cases[i].status, cases[i].msg);
        name_failed_case(before, cases[i].patch);
    }
}

/* Architectures, RoPE variants and features flexc does not implement. */
static void config_refuses_features(void)
{
    static const config_case cases[] = {
        {"{\"architectures\": [\"GPT2LMHeadModel\"]}", NULL, FX_EUNSUPPORTED,
         "architecture GPT2LMHeadModel is not supported"},
        {"{\"architectures\": [\"LlamaForCausalLM\", \"X\"]}", NULL, FX_EFORMAT, "architectures"},
        {"{\"architectures\": null, \"model_type\": \"gemma\"}", NULL, FX_EUNSUPPORTED, "model_type \"gemma\""},
        {"{\"model_type\": \"qwen2\"}", NULL, FX_EFORMAT, "disagrees"},
        {"{\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}", NULL, FX_EUNSUPPORTED,
         "type \"yarn\" is not supported"},
        {"{\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}}", NULL, FX_EUNSUPPORTED, "type \"linear\""},
        {"{\"rope_scaling\": null, \"rope_parameters\": {\"rope_type\": \"dynamic\", \"rope_theta\": 10000}}", NULL,
         FX_EUNSUPPORTED, "rope_parameters type \"dynamic\""},
        {"{\"rope_scaling\": {\"rope_type\": \"llama3\", \"low_freq_factor\": 1, \"high_freq_factor\": 4, "
         "\"original_max_position_embeddings\": 16}}", NULL, FX_EFORMAT, "\"factor\" is missing"},
        {"{\"rope_scaling\": {\"rope_type\": \"llama3\", \"type\": \"yarn\"}}", NULL, FX_EFORMAT, "differ"},
        {"{\"partial_rotary_factor\": 0.5}", NULL, FX_EUNSUPPORTED, "partial_rotary_factor"},
        {"{\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4}}", NULL, FX_EUNSUPPORTED,
         "quant_method gptq"},
        {"{\"hidden_act\": \"gelu\"}", NULL, FX_EUNSUPPORTED, "hidden_act \"gelu\""},
        {"{\"attention_bias\": true}", NULL, FX_EUNSUPPORTED, "attention_bias"},
        {"{\"mlp_bias\": true}", NULL, FX_EUNSUPPORTED, "mlp_bias"},
    };
    expect_refusals(cases, sizeof cases / sizeof cases[0]);
}

/* Sizes, values and token ids that are missing, mistyped or out of range. */
static void config_refuses_values(void)
{
    static const config_case cases[] = {
        {"{\"hidden_size\": null}", NULL, FX_EFORMAT, "\"hidden_size\" is missing"},
        {"{\"hidden_size\": 64.5}", NULL, FX_EFORMAT, "\"hidden_size\" must be an integer"},
        {"{\"vocab_size\": 0}", NULL, FX_EFORMAT, "\"vocab_size\" = 0 is outside"},
        {"{\"num_key_value_heads\": 3}", NULL, FX_EFORMAT, "not a multiple of"},
        {"{\"head_dim\": 15}", NULL, FX_EFORMAT, "head_dim = 15 must be even"},
        {"{\"head_dim\": null, \"hidden_size\": 66}", NULL, FX_EFORMAT, "not a multiple of num_attention_heads"},
        {"{\"rms_norm_eps\": -1}", NULL, FX_EFORMAT, "rms_norm_eps"},
        {"{\"tie_word_embeddings\": 1}", NULL, FX_EFORMAT, "true or false"},
        {"{\"eos_token_id\": 512}", NULL, FX_EFORMAT, "outside the vocabulary"},
        {"{\"eos_token_id\": \"</s>\"}", NULL, FX_EFORMAT, "eos_token_id"},
        {"{\"eos_token_id\": [1, \"x\"]}", NULL, FX_EFORMAT, "eos_token_id\"[1]"},
        {"{}", "[1]", FX_EFORMAT, "generation_config.json is not a JSON object"},
    };
    expect_refusals(cases, sizeof cases / sizeof cases[0]);
}

/* The spellings that are accepted, and the values they give (defaults where a key is gone). */
static void config_accepts_spellings(void)
{
    fx__hf_config c;
    FXT_OK(parse_patched("{}", NULL, &c));
    FXT_OK(parse_patched("{\"architectures\": null, \"model_type\": \"mistral\"}", NULL, &c));
    FXT_EQ_INT(c.arch, FX__HF_MISTRAL);
    FXT_OK(parse_patched("{\"rope_scaling\": {\"type\": \"default\"}}", NULL, &c));
    FXT_EQ_INT(c.m.rope_scaling.type, FX_ROPE_SCALING_NONE);
    FXT_OK(parse_patched("{\"rope_scaling\": null, \"rope_theta\": null}", NULL, &c));
    FXT_NEAR(c.m.rope_theta, 10000.0, 0, 0); /* the default */
    FXT_OK(parse_patched("{\"rope_scaling\": {\"type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
                         "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}}", NULL, &c));
    FXT_EQ_INT(c.m.rope_scaling.type, FX_ROPE_SCALING_LLAMA3);
    FXT_EQ_INT(c.m.rope_scaling.original_max_position_embeddings, 8192);
    FXT_OK(parse_patched("{\"head_dim\": null, \"num_key_value_heads\": null}", NULL, &c));
    FXT_EQ_INT(c.m.head_dim, 16);
    FXT_EQ_INT(c.m.kv_heads, 4);
}

/* generation_config.json's ids win over config.json's; either dtype key is read. */
static void config_accepts_ids_dtype(void)
{
    fx__hf_config c;
    FXT_OK(parse_patched("{\"eos_token_id\": 7}", "{\"eos_token_id\": [3, 4, 5]}", &c));
    FXT_EQ_INT(c.m.n_eos, 3);
    FXT_EQ_INT(c.m.eos[2], 5);
    FXT_OK(parse_patched("{\"eos_token_id\": 7}", "{\"bos_token_id\": 9}", &c));
    FXT_EQ_INT(c.m.n_eos, 1);
    FXT_EQ_INT(c.m.eos[0], 7);
    FXT_EQ_INT(c.bos, 9);
    FXT_OK(parse_patched("{\"dtype\": null, \"torch_dtype\": \"bfloat16\"}", NULL, &c));
    FXT_EQ_INT(c.dtype, FX_DT_BF16);
    FXT_OK(parse_patched("{\"dtype\": \"float16\"}", NULL, &c));
    FXT_EQ_INT(c.dtype, FX_DT_F16);
    FXT_OK(parse_patched("{\"eos_token_id\": null, \"bos_token_id\": null}", NULL, &c));
    FXT_EQ_INT(c.m.n_eos, 0);
    FXT_EQ_INT(c.bos, -1);
}

/* The start of a Qwen2 config patch; the window keys follow. */
#define QWEN2_PATCH "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", "

/* Sliding windows: Mistral's is global; Qwen2's only when it covers every layer. */
static void config_windows(void)
{
    fx__hf_config c;
    FXT_OK(parse_patched("{\"architectures\": [\"MistralForCausalLM\"], \"model_type\": \"mistral\", "
                         "\"sliding_window\": 4096}", NULL, &c));
    FXT_EQ_INT(c.m.sliding_window, 4096);
    FXT_OK(parse_patched("{\"sliding_window\": 16}", NULL, &c));
    FXT_EQ_INT(c.m.sliding_window, 0); /* Llama has none */
    FXT_OK(parse_patched(QWEN2_PATCH "\"use_sliding_window\": true, \"sliding_window\": 32, \"max_window_layers\": 0}",
                         NULL, &c));
    FXT_EQ_INT(c.m.sliding_window, 32);
    FXT_CHECK(c.m.qkv_bias);
    FXT_OK(parse_patched(QWEN2_PATCH "\"use_sliding_window\": false, \"sliding_window\": 32}", NULL, &c));
    FXT_EQ_INT(c.m.sliding_window, 0);
    static const config_case cases[] = {
        {QWEN2_PATCH "\"use_sliding_window\": true, \"sliding_window\": 32, \"max_window_layers\": 1}", NULL,
         FX_EUNSUPPORTED, "sliding window on 1 of 2 layers"},
        {QWEN2_PATCH "\"use_sliding_window\": true, \"sliding_window\": 32, \"layer_types\": "
                     "[\"full_attention\", \"sliding_attention\"]}", NULL, FX_EUNSUPPORTED, "1 of 2 layers"},
        {QWEN2_PATCH "\"layer_types\": [\"full_attention\", \"chunked_attention\"]}", NULL, FX_EUNSUPPORTED,
         "chunked_attention"},
    };
    expect_refusals(cases, sizeof cases / sizeof cases[0]);
}

/* Text that is not JSON, not an object, or has duplicate keys; a directory without
   config.json, and one with a bad config.json (read from disk, the directory named). */
static void config_bad_files(void)
{
    fx__hf_config c;
    FXT_STATUS(fx__hf_config_parse(&c, "{\"a\": ", 6, NULL, 0), FX_EFORMAT, "not valid JSON");
    FXT_STATUS(fx__hf_config_parse(&c, "[]", 2, NULL, 0), FX_EFORMAT, "not a JSON object");
    FXT_STATUS(fx__hf_config_parse(&c, "{\"a\": 1, \"a\": 2}", 16, NULL, 0), FX_EFORMAT, "not valid JSON");

    FXT_STATUS(fx__hf_config_read(&c, tmpdir), FX_EIO, "config.json");
    char path[1024];
    snprintf(path, sizeof path, "%s/bad", tmpdir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/bad/config.json", tmpdir);
    write_text(path, "{\"architectures\": [\"PhiForCausalLM\"]}");
    snprintf(path, sizeof path, "%s/bad", tmpdir);
    FXT_STATUS(fx__hf_config_read(&c, path), FX_EUNSUPPORTED, "PhiForCausalLM");
    FXT_HAS_STR(fx_last_error(), path); /* the directory is named */
}

static void test_config_refusals(void)
{
    config_accepts_spellings();
    config_refuses_features();
    config_refuses_values();
    config_accepts_ids_dtype();
    config_windows();
    config_bad_files();
}

/* c -> config.json text -> c again: every field kept. */
static void test_config_json_roundtrip(void)
{
    for (int f = 0; f < NFIX; f++) {
        char dir[1024];
        fixture_path(dir, sizeof dir, fixtures[f], "");
        fx__hf_config a, b;
        FXT_OK(fx__hf_config_read(&a, dir));
        char *text = NULL, *gen = NULL;
        FXT_OK(fx__hf_config_json(&text, &a, "float32"));
        FXT_OK(fx__hf_generation_json(&gen, &a));
        FXT_OK(fx__hf_config_parse(&b, text, strlen(text), gen, strlen(gen)));
        FXT_EQ_INT(b.arch, a.arch);
        FXT_EQ_INT(b.m.vocab, a.m.vocab);
        FXT_EQ_INT(b.m.dim, a.m.dim);
        FXT_EQ_INT(b.m.layers, a.m.layers);
        FXT_EQ_INT(b.m.heads, a.m.heads);
        FXT_EQ_INT(b.m.kv_heads, a.m.kv_heads);
        FXT_EQ_INT(b.m.head_dim, a.m.head_dim);
        FXT_EQ_INT(b.m.ffn, a.m.ffn);
        FXT_EQ_INT(b.m.ctx, a.m.ctx);
        FXT_CHECK(b.m.norm_eps == a.m.norm_eps);
        FXT_EQ_INT(b.m.tied_embeddings, a.m.tied_embeddings);
        FXT_EQ_INT(b.m.qkv_bias, a.m.qkv_bias);
        FXT_EQ_INT(b.m.sliding_window, a.m.sliding_window);
        FXT_CHECK(b.m.rope_theta == a.m.rope_theta);
        FXT_EQ_INT(b.m.rope_scaling.type, a.m.rope_scaling.type);
        FXT_CHECK(b.m.rope_scaling.factor == a.m.rope_scaling.factor && b.m.rope_scaling.low_freq_factor == a.m.rope_scaling.low_freq_factor &&
                  b.m.rope_scaling.high_freq_factor == a.m.rope_scaling.high_freq_factor);
        FXT_EQ_INT(b.m.rope_scaling.original_max_position_embeddings, a.m.rope_scaling.original_max_position_embeddings);
        FXT_EQ_INT(b.m.n_eos, a.m.n_eos);
        for (int i = 0; i < a.m.n_eos; i++)
            FXT_EQ_INT(b.m.eos[i], a.m.eos[i]);
        FXT_EQ_INT(b.bos, a.bos);
        fx__free(text);
        fx__free(gen);
    }
    /* A field a class implies (qkv_bias: Qwen2ForCausalLM) is written as that class or not at
       all. */
    fx__hf_config c;
    char dir[1024], *text = NULL;
    fixture_path(dir, sizeof dir, "qwen2_bias", "");
    FXT_OK(fx__hf_config_read(&c, dir));
    c.m.qkv_bias = false;
    FXT_STATUS(fx__hf_config_json(&text, &c, "float32"), FX_EUNSUPPORTED,
               "Qwen2ForCausalLM model always has qkv_bias = 1");
    c.m.qkv_bias = true;
    c.arch = FX__HF_MISTRAL;
    FXT_STATUS(fx__hf_config_json(&text, &c, "float32"), FX_EUNSUPPORTED,
               "MistralForCausalLM model always has qkv_bias = 0");
    FXT_CHECK(text == NULL);
}

/* The reference's RoPE frequencies, written after transformers (float64): rope_theta^(-2i/hd),
   with llama3 scaling when configured. */
static void ref_inv_freq(double *inv_freq, const fx_model_config *c)
{
    const int64_t half = c->head_dim / 2;
    for (int64_t i = 0; i < half; i++) {
        double f = pow(c->rope_theta, -2.0 * (double)i / (double)c->head_dim);
        if (c->rope_scaling.type == FX_ROPE_SCALING_LLAMA3) {
            /* Long wavelengths slowed by `factor`, short ones kept, a linear blend between. */
            const double old = (double)c->rope_scaling.original_max_position_embeddings;
            const double lo = c->rope_scaling.low_freq_factor, hi = c->rope_scaling.high_freq_factor;
            const double wavelen = 2.0 * M_PI / f;
            if (wavelen > old / lo) {
                f = f / c->rope_scaling.factor;
            } else if (!(wavelen < old / hi)) {
                double s = (old / wavelen - lo) / (hi - lo);
                f = (1.0 - s) * f / c->rope_scaling.factor + s * f;
            }
        }
        inv_freq[i] = f;
    }
}

/* llama3 scaling, the library's (fx__rope_freqs) against the rule written out (long
   wavelengths divided by factor, short kept) and against the reference. */
static void test_rope_llama3(void)
{
    fx_model_config c = {.head_dim = 128, .rope_theta = 500000.0f,
                         .rope_scaling = {FX_ROPE_SCALING_LLAMA3, 8.0f, 1.0f, 4.0f, 8192}};
    double f[64], plain[64], ref[64];
    fx__rope_freqs(f, &c);
    ref_inv_freq(ref, &c);
    c.rope_scaling.type = FX_ROPE_SCALING_NONE;
    fx__rope_freqs(plain, &c);
    int kept = 0, scaled = 0, blended = 0;
    for (int i = 0; i < 64; i++) {
        FXT_NEAR(f[i], ref[i], 0, 1e-15);
        double wl = 2 * M_PI / plain[i];
        if (wl < 8192.0 / 4) {
            FXT_CHECK(f[i] == plain[i]);
            kept++;
        } else if (wl > 8192.0) {
            FXT_NEAR(f[i], plain[i] / 8, 0, 1e-15);
            scaled++;
        } else {
            FXT_CHECK(f[i] < plain[i] && f[i] > plain[i] / 8);
            blended++;
        }
    }
    FXT_CHECK(kept > 0 && scaled > 0 && blended > 0);
}

/* ---- the weight table ---------------------------------------------------------------------- */

static json_t *load_ref_json(const char *name)
{
    char path[1024];
    fixture_path(path, sizeof path, name, ".ref.json");
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    if (!j) {
        fprintf(stderr, "%s: %s\n", path, e.text);
        exit(2);
    }
    return j;
}

/* Every fixture opens; the table's HF names are exactly transformers' parameter names. */
static void test_open_fixtures(void)
{
    static const fx_dtype want[NFIX] = {FX_DT_F32, FX_DT_BF16, FX_DT_F16, FX_DT_F32};
    for (int f = 0; f < NFIX; f++) {
        char dir[1024];
        fixture_path(dir, sizeof dir, fixtures[f], "");
        fx__hf_model *m = NULL;
        FXT_OK(fx__hf_open(&m, dir));
        if (!m)
            continue;
        FXT_EQ_INT(m->dtype, want[f]);
        FXT_CHECK((m->index != NULL) == (strcmp(fixtures[f], "llama_bf16") == 0));
        json_t *ref = load_ref_json(fixtures[f]);
        json_t *names = json_object_get(ref, "grad_names");
        FXT_EQ_INT(json_array_size(names), m->n);
        int64_t params = 0;
        for (size_t i = 0; i < json_array_size(names); i++) {
            const char *hn = json_string_value(json_array_get(names, i));
            bool found = false;
            for (size_t j = 0; j < m->n; j++)
                found |= strcmp(m->t[j].hf_name, hn) == 0;
            if (!found)
                FXT_FAIL("%s: transformers parameter %s is not in the table", fixtures[f], hn);
        }
        for (size_t j = 0; j < m->n; j++)
            params += m->t[j].shape[0] * (m->t[j].ndim == 2 ? m->t[j].shape[1] : 1);
        FXT_EQ_INT(params, m->params);
        FXT_CHECK((fx__hf_find(m->t, m->n, "lm_head") >= 0) == !m->c.m.tied_embeddings);
        FXT_CHECK((fx__hf_find(m->t, m->n, "layers.1.attn.bq") >= 0) == m->c.m.qkv_bias);
        json_decref(ref);
        fx__hf_close(m);
    }
}

/* One head of 8 rows: flexc order is HF rows 0,4,1,5,2,6,3,7; and back. */
static void test_rope_rows(void)
{
    float src[2 * 8 * 3], dst[2 * 8 * 3], back[2 * 8 * 3];
    for (int i = 0; i < 48; i++)
        src[i] = (float)i;
    fx__hf_rows_to_flexc(dst, src, 2, 8, 3);
    static const int order[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < 8; r++)
            for (int c = 0; c < 3; c++)
                FXT_EQ_INT(dst[(h * 8 + r) * 3 + c], src[(h * 8 + order[r]) * 3 + c]);
    fx__hf_rows_to_hf(back, dst, 2, 8, 3);
    fxt_bitwise_f32("rows back", back, src, 48);
}

/* ---- a float64 forward over the tensors in flexc's layout --------------------------------- */

typedef struct model_f32 {
    fx__hf_model *m;
    float **w; /* [n], flexc layout */
} model_f32;

static model_f32 load_model(const char *name)
{
    char dir[1024];
    fixture_path(dir, sizeof dir, name, "");
    model_f32 r = {0};
    if (fx__hf_open(&r.m, dir) != FX_OK) {
        fprintf(stderr, "%s: %s\n", dir, fx_last_error());
        exit(2);
    }
    r.w = calloc(r.m->n, sizeof *r.w);
    for (size_t i = 0; i < r.m->n; i++) {
        size_t numel = (size_t)fx_tensor_numel(r.m->views[i]);
        r.w[i] = fxt_guarded(numel);
        FXT_OK(fx__hf_tensor_read(r.m, i, r.w[i]));
    }
    return r;
}

static void free_model(model_f32 *r)
{
    for (size_t i = 0; i < r->m->n; i++)
        fxt_guarded_free(r->m->t[i].name, r->w[i]);
    free(r->w);
    fx__hf_close(r->m);
}

static const float *W(const model_f32 *r, int64_t layer, const char *name)
{
    char full[64];
    if (layer >= 0)
        snprintf(full, sizeof full, "layers.%lld.%s", (long long)layer, name);
    else
        snprintf(full, sizeof full, "%s", name);
    int64_t i = fx__hf_find(r->m->t, r->m->n, full);
    return i < 0 ? NULL : r->w[i];
}

/* y[T, O] = x[T, I] w[O, I]^T + b[O] (b may be NULL) */
static void linear(double *y, const double *x, const float *w, const float *b, int64_t T, int64_t I, int64_t O)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t o = 0; o < O; o++) {
            double s = b ? b[o] : 0.0;
            for (int64_t i = 0; i < I; i++)
                s += x[t * I + i] * (double)w[o * I + i];
            y[t * O + o] = s;
        }
}

static void rmsnorm(double *y, const double *x, const float *w, int64_t T, int64_t C, double eps)
{
    for (int64_t t = 0; t < T; t++) {
        double ss = 0;
        for (int64_t i = 0; i < C; i++)
            ss += x[t * C + i] * x[t * C + i];
        double r = 1.0 / sqrt(ss / (double)C + eps);
        for (int64_t i = 0; i < C; i++)
            y[t * C + i] = x[t * C + i] * r * w[i];
    }
}

/* flexc's RoPE: interleaved pairs (2i, 2i+1) rotated by position * inv_freq[i]. */
static void rope(double *x, int64_t T, int64_t H, int64_t hd, const double *inv_freq)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < hd / 2; i++) {
                double *p = x + (t * H + h) * hd + 2 * i;
                double c = cos((double)t * inv_freq[i]), s = sin((double)t * inv_freq[i]);
                double x0 = p[0], x1 = p[1];
                p[0] = x0 * c - x1 * s;
                p[1] = x0 * s + x1 * c;
            }
}

/* logits [T, V] of ids [T] */
static double *forward(const model_f32 *r, const int64_t *ids, int64_t T)
{
    const fx__hf_config *c = &r->m->c;
    const int64_t C = c->m.dim, hd = c->m.head_dim, Hq = c->m.heads, Hkv = c->m.kv_heads, F = c->m.ffn, V = c->m.vocab;
    double *x = fxt_alloc_f64((size_t)(T * C)), *h = fxt_alloc_f64((size_t)(T * C));
    double *q = fxt_alloc_f64((size_t)(T * Hq * hd)), *k = fxt_alloc_f64((size_t)(T * Hkv * hd));
    double *v = fxt_alloc_f64((size_t)(T * Hkv * hd)), *att = fxt_alloc_f64((size_t)(T * Hq * hd));
    double *o = fxt_alloc_f64((size_t)(T * C)), *g = fxt_alloc_f64((size_t)(T * F)), *u = fxt_alloc_f64((size_t)(T * F));
    double *p = fxt_alloc_f64((size_t)T), *logits = fxt_alloc_f64((size_t)(T * V));
    double inv_freq[512];
    ref_inv_freq(inv_freq, &c->m);
    const float *wte = W(r, -1, "wte");
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < C; i++)
            x[t * C + i] = wte[ids[t] * C + i];
    for (int64_t l = 0; l < c->m.layers; l++) {
        rmsnorm(h, x, W(r, l, "norm1"), T, C, c->m.norm_eps);
        linear(q, h, W(r, l, "attn.wq"), W(r, l, "attn.bq"), T, C, Hq * hd);
        linear(k, h, W(r, l, "attn.wk"), W(r, l, "attn.bk"), T, C, Hkv * hd);
        linear(v, h, W(r, l, "attn.wv"), W(r, l, "attn.bv"), T, C, Hkv * hd);
        rope(q, T, Hq, hd, inv_freq);
        rope(k, T, Hkv, hd, inv_freq);
        for (int64_t t = 0; t < T; t++)
            for (int64_t hh = 0; hh < Hq; hh++) {
                const int64_t kh = hh / (Hq / Hkv);
                const int64_t j0 = c->m.sliding_window && t - c->m.sliding_window + 1 > 0 ? t - c->m.sliding_window + 1 : 0;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = j0; j <= t; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < hd; d++)
                        s += q[(t * Hq + hh) * hd + d] * k[(j * Hkv + kh) * hd + d];
                    p[j] = s / sqrt((double)hd);
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int64_t j = j0; j <= t; j++)
                    sum += (p[j] = exp(p[j] - mx));
                for (int64_t d = 0; d < hd; d++) {
                    double acc = 0;
                    for (int64_t j = j0; j <= t; j++)
                        acc += p[j] * v[(j * Hkv + kh) * hd + d];
                    att[(t * Hq + hh) * hd + d] = acc / sum;
                }
            }
        linear(o, att, W(r, l, "attn.wo"), NULL, T, Hq * hd, C);
        for (int64_t i = 0; i < T * C; i++)
            x[i] += o[i];
        rmsnorm(h, x, W(r, l, "norm2"), T, C, c->m.norm_eps);
        linear(g, h, W(r, l, "mlp.w1"), NULL, T, C, F);
        linear(u, h, W(r, l, "mlp.w3"), NULL, T, C, F);
        for (int64_t i = 0; i < T * F; i++)
            g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
        linear(o, g, W(r, l, "mlp.w2"), NULL, T, F, C);
        for (int64_t i = 0; i < T * C; i++)
            x[i] += o[i];
    }
    rmsnorm(h, x, W(r, -1, "norm"), T, C, c->m.norm_eps);
    linear(logits, h, c->m.tied_embeddings ? wte : W(r, -1, "lm_head"), NULL, T, C, V);
    free(x), free(h), free(q), free(k), free(v), free(att), free(o), free(g), free(u), free(p);
    return logits;
}

static const fx_tensor_view *ref_tensor(fx_safetensors *f, const char *name)
{
    const fx_tensor_view *v = fx_safetensors_find(f, name);
    if (!v) {
        fprintf(stderr, "reference tensor %s is missing\n", name);
        exit(2);
    }
    return v;
}

static int64_t *ref_i64(fx_safetensors *f, const char *name, int64_t *n)
{
    const fx_tensor_view *v = ref_tensor(f, name);
    *n = fx_tensor_numel(v);
    int64_t *p = malloc((size_t)*n * sizeof *p + 1);
    memcpy(p, v->data, v->nbytes);
    return p;
}

static float *ref_f32(fx_safetensors *f, const char *name, int64_t *n)
{
    const fx_tensor_view *v = ref_tensor(f, name);
    *n = fx_tensor_numel(v);
    float *p = malloc((size_t)*n * sizeof *p + 1);
    memcpy(p, v->data, v->nbytes);
    return p;
}

/* The reference's prompt pi: its ids (*ids, *T of them) and, returned, its logits (*nl). */
static float *ref_prompt(fx_safetensors *f, int pi, int64_t **ids, int64_t *T, int64_t *nl)
{
    char name[64];
    snprintf(name, sizeof name, "prompt%d.ids", pi);
    *ids = ref_i64(f, name, T);
    snprintf(name, sizeof name, "prompt%d.logits", pi);
    return ref_f32(f, name, nl);
}

static double max_abs(const float *x, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/* The tensors as loaded (names mapped, RoPE rows permuted, BF16/F16 widened, llama3 scaling,
   window, biases, GQA, tying) reproduce transformers' logits, greedy tokens and loss. */
static void test_reference_forward(void)
{
    for (int f = 0; f < NFIX; f++) {
        model_f32 r = load_model(fixtures[f]);
        char path[1024];
        fixture_path(path, sizeof path, fixtures[f], ".ref.safetensors");
        fx_safetensors *ref = NULL;
        FXT_OK(fx_safetensors_open(&ref, path));
        const int64_t V = r.m->c.m.vocab;
        for (int pi = 0; pi < 2; pi++) {
            int64_t T, nl;
            int64_t *ids;
            float *want = ref_prompt(ref, pi, &ids, &T, &nl);
            FXT_EQ_INT(nl, T * V);
            double *got = forward(&r, ids, T);
            /* Compared as float32 values against the transformers output taken as the reference:
               within 1e-4 of the logits' scale. */
            float *gotf = malloc((size_t)(T * V) * sizeof(float));
            double *wantd = fxt_alloc_f64((size_t)(T * V));
            for (int64_t i = 0; i < T * V; i++)
                gotf[i] = (float)got[i], wantd[i] = want[i];
            char what[96];
            snprintf(what, sizeof what, "%s prompt%d logits", fixtures[f], pi);
            fxt_close_f32(what, gotf, wantd, (size_t)(T * V), 1e-4 * max_abs(want, T * V), 0);
            free(ids), free(want), free(got), free(gotf), free(wantd);
        }

        /* Greedy, teacher-forced on the reference's tokens: ours must agree wherever the
           reference's top-2 margin exceeds the tolerance. */
        int64_t T0, G, nm;
        int64_t *p0 = ref_i64(ref, "prompt0.ids", &T0);
        int64_t *gen = ref_i64(ref, "greedy.ids", &G);
        float *margin = ref_f32(ref, "greedy.margin", &nm);
        int64_t *seq = malloc((size_t)(T0 + G) * sizeof *seq);
        memcpy(seq, p0, (size_t)T0 * sizeof *seq);
        memcpy(seq + T0, gen, (size_t)G * sizeof *seq);
        double *lg = forward(&r, seq, T0 + G - 1);
        int compared = 0;
        for (int64_t s = 0; s < G; s++) {
            const double *row = lg + (T0 - 1 + s) * V;
            int64_t best = 0;
            for (int64_t j = 1; j < V; j++)
                best = row[j] > row[best] ? j : best;
            double scale = 0;
            for (int64_t j = 0; j < V; j++)
                scale = fabs(row[j]) > scale ? fabs(row[j]) : scale;
            const double tol = 1e-4 * scale; /* the logit tolerance */
            if (margin[s] > tol) {
                compared++;
                if (best != gen[s])
                    FXT_FAIL("%s greedy step %lld: %lld, reference %lld (margin %.3g)", fixtures[f], (long long)s,
                             (long long)best, (long long)gen[s], (double)margin[s]);
            }
        }
        FXT_CHECK(compared >= G / 2);
        free(p0), free(gen), free(margin), free(seq), free(lg);

        /* The training batch's loss. */
        int64_t nx, ny, one;
        int64_t *x = ref_i64(ref, "train.x", &nx);
        int64_t *y = ref_i64(ref, "train.y", &ny);
        float *loss = ref_f32(ref, "train.loss", &one);
        const fx_tensor_view *xv = ref_tensor(ref, "train.x");
        const int64_t B = xv->shape[0], T = xv->shape[1];
        double sum = 0;
        for (int64_t b = 0; b < B; b++) {
            double *l2 = forward(&r, x + b * T, T);
            for (int64_t t = 0; t < T; t++) {
                const double *row = l2 + t * V;
                double mx = row[0], se = 0;
                for (int64_t j = 1; j < V; j++)
                    mx = row[j] > mx ? row[j] : mx;
                for (int64_t j = 0; j < V; j++)
                    se += exp(row[j] - mx);
                sum += mx + log(se) - row[y[b * T + t]];
            }
            free(l2);
        }
        FXT_NEAR(sum / (double)(B * T), loss[0], 0, 1e-4);
        free(x), free(y), free(loss);
        fx_safetensors_free(ref);
        free_model(&r);
    }
}

/* ---- export -------------------------------------------------------------------------------- */

static bool same_file(const char *a, const char *b)
{
    size_t na, nb;
    char *x = slurp(a, &na), *y = slurp(b, &nb);
    bool same = na == nb && memcmp(x, y, na) == 0;
    fx__free(x);
    fx__free(y);
    return same;
}

/* Import -> export of an unchanged model: the same tensors, bitwise, in the source dtype; the
   configuration and tokenizer files as they were. */
static void test_export_roundtrip(void)
{
    for (int f = 0; f < NFIX; f++) {
        model_f32 r = load_model(fixtures[f]);
        char src[1024], out[1024], a[1200], b[1200];
        fixture_path(src, sizeof src, fixtures[f], "");
        snprintf(out, sizeof out, "%s/export-%s", tmpdir, fixtures[f]);
        fx__hf_export_spec s = {.c = &r.m->c, .data = (const float *const *)r.w, .dtype = r.m->dtype,
                                .config_text = r.m->config_text, .gen_text = r.m->gen_text,
                                .tokenizer_dir = src};
        FXT_OK(fx__hf_export(out, &s));
        fx__hf_model *e = NULL;
        FXT_OK(fx__hf_open(&e, out));
        if (e) {
            FXT_EQ_INT(e->n, r.m->n);
            FXT_EQ_INT(e->dtype, r.m->dtype);
            FXT_CHECK(e->file != NULL); /* one file, even from shards */
            for (size_t i = 0; i < e->n && i < r.m->n; i++) {
                const fx_tensor_view *x = r.m->views[i], *y = e->views[i];
                if (x->nbytes != y->nbytes || memcmp(x->data, y->data, x->nbytes) != 0)
                    FXT_FAIL("%s: tensor %s differs after import -> export", fixtures[f], r.m->t[i].hf_name);
            }
            fx__hf_close(e);
        }
        static const char *const files[] = {"config.json", "generation_config.json", "tokenizer.json",
                                            "tokenizer_config.json"};
        for (int i = 0; i < 4; i++) {
            snprintf(a, sizeof a, "%s/%s", src, files[i]);
            snprintf(b, sizeof b, "%s/%s", out, files[i]);
            if (!same_file(a, b))
                FXT_FAIL("%s: %s differs after export", fixtures[f], files[i]);
        }

        /* Generated config (a model that did not come from a directory) and another dtype:
           reads back as the same model, values within the dtype's rounding. */
        snprintf(out, sizeof out, "%s/export-gen-%s", tmpdir, fixtures[f]);
        s.config_text = s.gen_text = NULL;
        s.tokenizer_dir = NULL;
        s.dtype = FX_DT_BF16;
        FXT_OK(fx__hf_export(out, &s));
        FXT_OK(fx__hf_open(&e, out));
        if (e) {
            FXT_EQ_INT(e->dtype, FX_DT_BF16);
            FXT_EQ_INT(e->c.m.sliding_window, r.m->c.m.sliding_window);
            FXT_EQ_INT(e->c.m.rope_scaling.type, r.m->c.m.rope_scaling.type);
            FXT_EQ_INT(e->c.m.n_eos, r.m->c.m.n_eos);
            for (size_t i = 0; i < e->n; i++) {
                size_t n = (size_t)fx_tensor_numel(e->views[i]);
                float *back = malloc(n * sizeof *back);
                double *ref = fxt_alloc_f64(n);
                FXT_OK(fx__hf_tensor_read(e, i, back));
                for (size_t j = 0; j < n; j++)
                    ref[j] = r.w[i][j];
                fxt_close_f32(e->t[i].name, back, ref, n, 0, 1.0 / 256);
                free(back), free(ref);
            }
            fx__hf_close(e);
        }
        /* A tensor without data is refused by its name, and nothing is written. */
        if (f == 0 && r.m->n > 2) {
            const float **holes = malloc(r.m->n * sizeof *holes);
            memcpy(holes, r.w, r.m->n * sizeof *holes);
            holes[2] = NULL;
            fx__hf_export_spec h = {.c = &r.m->c, .data = holes, .dtype = FX_DT_F32};
            char msg[160];
            snprintf(msg, sizeof msg, "tensor %s has no data", r.m->t[2].name);
            snprintf(out, sizeof out, "%s/export-hole", tmpdir);
            FXT_STATUS(fx__hf_export(out, &h), FX_EINVAL, msg);
            FXT_CHECK(access(out, F_OK) != 0);
            free(holes);
        }
        const char *keep = getenv("FLEXC_HF_KEEP_EXPORTS");
        if (keep) {
            /* For scripts/check_models_live.py: transformers loads what export wrote. */
            snprintf(out, sizeof out, "%s/%s", keep, fixtures[f]);
            s.tokenizer_dir = src;
            s.dtype = r.m->dtype;
            FXT_OK(fx__hf_export(out, &s));
        }
        free_model(&r);
    }
    fx__hf_config c;
    memset(&c, 0, sizeof c);
    fx__hf_export_spec bad = {.c = &c, .data = NULL, .dtype = FX_DT_F32};
    FXT_STATUS(fx__hf_export(tmpdir, &bad), FX_EINVAL, "must not be NULL");
}

/* ---- bad weight files ---------------------------------------------------------------------- */

/* dir/config.json from the fixture `name` (optionally patched), dir/model.safetensors from the
   fixture's tensors with `drop` removed, `extra` added, `reshape` given shape[0] - 1, and
   `retype` stored as I8 bytes, `half` stored as BF16, and element 5 of `poison` (F32) set to
   `poison_value`. */
typedef struct variant {
    const char *drop, *reshape, *retype, *half, *poison;
    float poison_value;
    const fx_tensor_view *extra;
} variant;

static void write_variant(const char *dir, const char *name, const variant *v)
{
    char path[1200];
    mkdir(dir, 0755);
    fixture_path(path, sizeof path, name, "/config.json");
    char *cfg = slurp(path, NULL);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, cfg);
    fx__free(cfg);
    fx_safetensors *f = NULL;
    fixture_path(path, sizeof path, name, "/model.safetensors");
    if (fx_safetensors_open(&f, path) != FX_OK) {
        fprintf(stderr, "%s: %s\n", path, fx_last_error());
        exit(2);
    }
    size_t n = fx_safetensors_count(f), k = 0;
    fx_tensor_view *t = calloc(n + 1, sizeof *t);
    void *half = NULL, *poisoned = NULL;
    for (size_t i = 0; i < n; i++) {
        fx_tensor_view x = *fx_safetensors_tensor(f, i);
        if (v->drop && strcmp(x.name, v->drop) == 0)
            continue;
        if (v->reshape && strcmp(x.name, v->reshape) == 0) {
            x.shape[0] -= 1;
            x.nbytes = (size_t)fx_tensor_numel(&x) * fx_dtype_size(x.dtype);
        }
        if (v->retype && strcmp(x.name, v->retype) == 0) {
            x.dtype = FX_DT_I8;
            x.shape[x.ndim - 1] *= 4;
        }
        if (v->half && strcmp(x.name, v->half) == 0) {
            size_t ne = (size_t)fx_tensor_numel(&x);
            half = malloc(ne * 2);
            fx_f32_to_dtype(half, FX_DT_BF16, x.data, ne);
            x.dtype = FX_DT_BF16;
            x.data = half;
            x.nbytes = ne * 2;
        }
        if (v->poison && strcmp(x.name, v->poison) == 0) {
            poisoned = malloc(x.nbytes);
            memcpy(poisoned, x.data, x.nbytes);
            ((float *)poisoned)[5] = v->poison_value;
            x.data = poisoned;
        }
        t[k++] = x;
    }
    if (v->extra)
        t[k++] = *v->extra;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (fx_safetensors_save(path, t, k, NULL) != FX_OK) {
        fprintf(stderr, "%s: %s\n", path, fx_last_error());
        exit(2);
    }
    free(half);
    free(poisoned);
    free(t);
    fx_safetensors_free(f);
}

/* A variant of llama3_tied, written to tmpdir/dir, that fx__hf_open must accept (status
   FX_OK) or refuse with `status` and a message containing `msg`. */
typedef struct weight_case {
    const char *dir;
    int status;
    const char *msg;
    variant v;
} weight_case;

/* Writes and opens each case, naming the one that failed. */
static void expect_weights(const weight_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/%s", tmpdir, cases[i].dir);
        const int before = fxt_failed_checks;
        write_variant(dir, "llama3_tied", &cases[i].v);
        fx__hf_model *m = NULL;
        if (cases[i].status == FX_OK)
            FXT_OK(fx__hf_open(&m, dir));
        else
            FXT_STATUS(fx__hf_open(&m, dir), cases[i].status, cases[i].msg);
        fx__hf_close(m); /* NULL unless it opened */
        name_failed_case(before, cases[i].dir);
    }
}

/* A tensor missing, unexpected, of another shape or dtype, or not finite (named with its
   index); a derived one (inv_freq) is skipped. */
static void bad_weights_tensors(void)
{
    static const float extra_data[4] = {1, 2, 3, 4};
    static const fx_tensor_view bias = {.name = "model.layers.0.self_attn.o_proj.bias", .dtype = FX_DT_F32,
                                        .ndim = 1, .shape = {4}, .data = extra_data, .nbytes = 16};
    static const fx_tensor_view inv_freq = {.name = "model.layers.0.self_attn.rotary_emb.inv_freq",
                                            .dtype = FX_DT_F32, .ndim = 1, .shape = {4}, .data = extra_data,
                                            .nbytes = 16};
    static const weight_case cases[] = {
        {"w-ok", FX_OK, "", {0}},
        {"w-missing", FX_EFORMAT, "tensor model.layers.1.mlp.up_proj.weight is missing",
         {.drop = "model.layers.1.mlp.up_proj.weight"}},
        {"w-unexpected", FX_EFORMAT, "unexpected tensor model.layers.0.self_attn.o_proj.bias", {.extra = &bias}},
        {"w-invfreq", FX_OK, "", {.extra = &inv_freq}},
        {"w-shape", FX_EFORMAT,
         "tensor model.layers.0.self_attn.k_proj.weight has shape [31, 64], config.json implies [32, 64]",
         {.reshape = "model.layers.0.self_attn.k_proj.weight"}},
        {"w-dtype", FX_EUNSUPPORTED, "tensor model.norm.weight is I8", {.retype = "model.norm.weight"}},
        {"w-nan", FX_EFORMAT, "tensor model.layers.1.mlp.down_proj.weight holds NaN at index 5",
         {.poison = "model.layers.1.mlp.down_proj.weight", .poison_value = NAN}},
        {"w-inf", FX_EFORMAT, "tensor model.embed_tokens.weight holds -Inf at index 5",
         {.poison = "model.embed_tokens.weight", .poison_value = -INFINITY}},
        {"w-mixed", FX_EUNSUPPORTED, "model.norm.weight is BF16", {.half = "model.norm.weight"}},
    };
    expect_weights(cases, sizeof cases / sizeof cases[0]);

    /* Non-finite weights are refused on every kind of load. */
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/w-nan", tmpdir);
    fx_model *bad = NULL;
    FXT_STATUS(fx_model_load(&bad, dir), FX_EFORMAT, "model.layers.1.mlp.down_proj.weight holds NaN");
    FXT_STATUS(fx_model_load_inference(&bad, dir), FX_EFORMAT, "model.layers.1.mlp.down_proj.weight holds NaN");
    FXT_CHECK(bad == NULL);
}

/* A tied model with lm_head.weight stored: accepted when it is the embedding. */
static void bad_weights_tied_head(void)
{
    fx_safetensors *f = NULL;
    char path[1200];
    fixture_path(path, sizeof path, "llama3_tied", "/model.safetensors");
    FXT_OK(fx_safetensors_open(&f, path));
    fx_tensor_view head = *fx_safetensors_find(f, "model.embed_tokens.weight");
    head.name = "lm_head.weight";
    const fx_tensor_view *gate = fx_safetensors_find(f, "model.layers.0.mlp.gate_proj.weight");
    fx_tensor_view other = head; /* same size, other bytes */
    other.data = gate->data;
    other.nbytes = gate->nbytes;
    other.shape[0] = 128;
    other.shape[1] = 64;
    const weight_case cases[] = {
        {"w-tied-head", FX_OK, "", {.extra = &head}},
        {"w-tied-other", FX_EFORMAT, "lm_head.weight differs from model.embed_tokens.weight", {.extra = &other}},
    };
    expect_weights(cases, sizeof cases / sizeof cases[0]);
    fx_safetensors_free(f);
}

/* No weights; a config the weights do not follow (heads changed). */
static void bad_weights_config(void)
{
    char dir[1024], path[1200];
    fx__hf_model *m = NULL;
    snprintf(dir, sizeof dir, "%s/w-none", tmpdir);
    mkdir(dir, 0755);
    fixture_path(path, sizeof path, "llama3_tied", "/config.json");
    char *cfg = slurp(path, NULL);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, cfg);
    FXT_STATUS(fx__hf_open(&m, dir), FX_EIO, "neither model.safetensors nor model.safetensors.index.json");
    fx__free(cfg);
    snprintf(dir, sizeof dir, "%s/w-ok", tmpdir); /* written by bad_weights_tensors */
    snprintf(path, sizeof path, "%s/config.json", dir);
    FXT_OK(parse_patched("{}", NULL, NULL));
    write_text(path, "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 512, \"hidden_size\": 64, "
                     "\"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                     "\"num_key_value_heads\": 2, \"max_position_embeddings\": 64, \"tie_word_embeddings\": true}");
    FXT_STATUS(fx__hf_open(&m, dir), FX_EFORMAT, "config.json implies [96, 64]");
}

/* A sharded model whose index names a shard that is not there. */
static void bad_weights_shards(void)
{
    char dir[1024], path[1200];
    fx__hf_model *m = NULL;
    snprintf(dir, sizeof dir, "%s/w-shards", tmpdir);
    mkdir(dir, 0755);
    static const char *const copy[] = {"config.json", "model.safetensors.index.json",
                                       "model-00001-of-00002.safetensors"};
    for (int i = 0; i < 3; i++) {
        char from[1200];
        fixture_path(from, sizeof from, "llama_bf16/", copy[i]);
        size_t len;
        char *text = slurp(from, &len);
        snprintf(path, sizeof path, "%s/%s", dir, copy[i]);
        FILE *o = fopen(path, "wb");
        fwrite(text, 1, len, o);
        fclose(o);
        fx__free(text);
    }
    FXT_STATUS(fx__hf_open(&m, dir), FX_EIO, "model-00002-of-00002.safetensors");
    FXT_EQ_INT(fx__hf_open(NULL, dir), FX_EINVAL);
}

static void test_bad_weights(void)
{
    bad_weights_tensors();
    bad_weights_tied_head();
    bad_weights_config();
    bad_weights_shards();
}

/* ---- the model (fx_model) against transformers ------------------------------------------------ */

/* The reference's greedy run: prompt0 as tokens, transformers' tokens after it and each step's
   top-2 margin, and the logit tolerance (1e-4 of prompt0's logit scale). */
typedef struct greedy_ref {
    int64_t T0, G;
    int32_t *prompt;
    int64_t *gen;
    float *margin;
    double tol;
} greedy_ref;

static greedy_ref load_greedy(fx_safetensors *ref)
{
    greedy_ref g;
    int64_t nm, nlog;
    int64_t *p0 = ref_i64(ref, "prompt0.ids", &g.T0);
    g.gen = ref_i64(ref, "greedy.ids", &g.G);
    g.margin = ref_f32(ref, "greedy.margin", &nm);
    float *l0 = ref_f32(ref, "prompt0.logits", &nlog);
    g.tol = 1e-4 * max_abs(l0, nlog);
    g.prompt = malloc((size_t)g.T0 * sizeof *g.prompt);
    for (int64_t i = 0; i < g.T0; i++)
        g.prompt[i] = (int32_t)p0[i];
    free(p0), free(l0);
    return g;
}

static void free_greedy(greedy_ref *g)
{
    free(g->prompt), free(g->gen), free(g->margin);
}

/* The logits of both prompts, within 1e-4 of the reference's logit scale. */
static void model_logits_parity(int f, fx_model *m, fx_safetensors *ref)
{
    const int64_t V = fx_model_get_config(m)->vocab;
    for (int pi = 0; pi < 2; pi++) {
        int64_t T, nl;
        int64_t *ids;
        float *want = ref_prompt(ref, pi, &ids, &T, &nl);
        int32_t *tok = malloc((size_t)T * sizeof *tok);
        for (int64_t i = 0; i < T; i++)
            tok[i] = (int32_t)ids[i];
        float *got = fxt_guarded((size_t)(T * V));
        FXT_OK(fx_model_forward(m, NULL, got, tok, NULL, 1, T, 0));
        double *wantd = fxt_alloc_f64((size_t)(T * V));
        for (int64_t i = 0; i < T * V; i++)
            wantd[i] = want[i];
        char what[96];
        snprintf(what, sizeof what, "%s prompt%d logits (fx_model)", fixtures[f], pi);
        fxt_close_f32(what, got, wantd, (size_t)(T * V), 1e-4 * max_abs(want, T * V), 0);
        fxt_guarded_free("logits", got);
        free(ids), free(want), free(tok), free(wantd);
    }
}

/* Greedy generation with the KV cache: the reference's tokens until the first step whose
   top-2 margin is within the logit tolerance (a near tie may go either way). */
static void model_greedy_parity(int f, fx_model *m, fx_safetensors *ref)
{
    greedy_ref g = load_greedy(ref);
    int32_t out[64];
    fx_model_cache *cache = NULL;
    FXT_OK(fx_model_cache_create(&cache, m, g.T0 + g.G));
    fx_generate_opts o = fx_generate_defaults();
    o.max_tokens = g.G;
    o.sample.temperature = 0;
    o.stop_at_eos = false;
    int64_t n_out = 0;
    FXT_OK(fx_model_generate(m, cache, out, &n_out, g.prompt, g.T0, &o));
    FXT_EQ_INT(n_out, g.G);
    for (int64_t s = 0; s < n_out && s < g.G && g.margin[s] > g.tol; s++)
        if (out[s] != g.gen[s])
            FXT_FAIL("%s greedy step %lld: %d, transformers %lld (margin %.3g)", fixtures[f], (long long)s,
                     out[s], (long long)g.gen[s], (double)g.margin[s]);
    fx_model_cache_free(cache);
    free_greedy(&g);
}

/* flexc's name for the Hugging Face tensor hf_name in the layout, or NULL. */
static const char *layout_name(const fx__hf_tensor *lay, size_t nlay, const char *hf_name)
{
    const char *fn = NULL;
    for (size_t j = 0; j < nlay; j++)
        if (strcmp(lay[j].hf_name, hf_name) == 0)
            fn = lay[j].name;
    return fn;
}

/* After a backward pass: each gradient's norm against transformers' (in the order of the
   .ref.json's grad_names), and the total norm. */
static void grad_norms_parity(int f, fx_model *m, const char *dir, const float *gns_ref, const float *gn_ref)
{
    json_t *rj = load_ref_json(fixtures[f]);
    json_t *names = json_object_get(rj, "grad_names");
    fx__hf_tensor *lay = NULL;
    size_t nlay = 0;
    fx__hf_config hc;
    FXT_OK(fx__hf_config_read(&hc, dir));
    FXT_OK(fx__hf_layout(&lay, &nlay, &hc.m));
    double total = 0;
    for (size_t i = 0; i < json_array_size(names); i++) {
        const char *hn = json_string_value(json_array_get(names, i));
        const char *fn = layout_name(lay, nlay, hn);
        fx_model_tensor t;
        if (!fn || fx_model_tensor_find(m, fn, &t) != FX_OK || !t.grad) {
            FXT_FAIL("%s: no gradient for %s", fixtures[f], hn);
            continue;
        }
        double ss = 0;
        for (size_t k = 0; k < t.numel; k++)
            ss += (double)t.grad[k] * t.grad[k];
        total += ss;
        if (!(fabs(sqrt(ss) - gns_ref[i]) <= 1e-4 * gns_ref[i] + 1e-6 * gn_ref[0]))
            FXT_FAIL("%s: |grad %s| = %.7g, transformers %.7g", fixtures[f], hn, sqrt(ss), (double)gns_ref[i]);
    }
    FXT_NEAR(sqrt(total), gn_ref[0], 0, 1e-4);
    fx__free(lay);
    json_decref(rj);
}

/* One training step: the loss and the gradient norms, total and per tensor. */
static void model_train_parity(int f, fx_model *m, fx_safetensors *ref, const char *dir)
{
    int64_t nx, ny, one, ng;
    int64_t *x = ref_i64(ref, "train.x", &nx);
    int64_t *y = ref_i64(ref, "train.y", &ny);
    float *loss_ref = ref_f32(ref, "train.loss", &one);
    float *gn_ref = ref_f32(ref, "train.grad_norm", &one);
    float *gns_ref = ref_f32(ref, "train.grad_norms", &ng);
    const fx_tensor_view *xv = ref_tensor(ref, "train.x");
    const int64_t B = xv->shape[0], T = xv->shape[1];
    int32_t *xt = malloc((size_t)nx * sizeof *xt), *yt = malloc((size_t)ny * sizeof *yt);
    for (int64_t i = 0; i < nx; i++)
        xt[i] = (int32_t)x[i], yt[i] = (int32_t)y[i];
    float loss = NAN;
    FXT_OK(fx_model_forward(m, &loss, NULL, xt, yt, B, T, FX_MODEL_GRAD));
    FXT_OK(fx_model_backward(m));
    FXT_NEAR(loss, loss_ref[0], 0, 1e-4);
    grad_norms_parity(f, m, dir, gns_ref, gn_ref);
    free(x), free(y), free(loss_ref), free(gn_ref), free(gns_ref), free(xt), free(yt);
}

/* A refused directory is refused through the public load call too, with the reason. */
static void expect_refused_load(int (*load)(fx_model **, const char *))
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/m-dtype", tmpdir);
    write_variant(dir, "llama3_tied", &(variant){.retype = "model.norm.weight"});
    fx_model *m = NULL;
    FXT_STATUS(load(&m, dir), FX_EUNSUPPORTED, "tensor model.norm.weight is I8");
    FXT_CHECK(m == NULL);
}

/* fx_model_load reads each fixture; its logits, greedy tokens (with the KV cache), loss and
   gradient norms match transformers'. */
static void test_model_parity(void)
{
    for (int f = 0; f < NFIX; f++) {
        char dir[1024], path[1024];
        fixture_path(dir, sizeof dir, fixtures[f], "");
        fixture_path(path, sizeof path, fixtures[f], ".ref.safetensors");
        fx_model *m = NULL;
        fx_safetensors *ref = NULL;
        FXT_OK(fx_model_load(&m, dir));
        FXT_OK(fx_safetensors_open(&ref, path));
        if (m && ref) {
            FXT_EQ_STR(fx_model_get_config(m)->arch,
                       fx__hf_arch_name(f == 2 ? FX__HF_MISTRAL : f == 3 ? FX__HF_QWEN2 : FX__HF_LLAMA));
            model_logits_parity(f, m, ref);
            model_greedy_parity(f, m, ref);
            model_train_parity(f, m, ref, dir);
        }
        fx_safetensors_free(ref);
        fx_model_free(m);
    }
    expect_refused_load(fx_model_load);
}

/* Mapped: no parameter buffer; every matrix read where the file holds it, in its dtype. */
static void check_mapped(int f, const fx_model *b)
{
    static const fx_dtype want_dt[NFIX] = {FX_DT_F32, FX_DT_BF16, FX_DT_F16, FX_DT_F32};
    FXT_CHECK(b->params == NULL && b->mapped != NULL && b->mapped->rope_half);
    for (size_t i = 0; b->mapped && i < b->lay.n; i++)
        if (b->lay.t[i].ndim == 2 && b->mapped->t[i].dtype != want_dt[f])
            FXT_FAIL("%s: %s is read as %s, the file holds %s", fixtures[f], b->lay.t[i].name,
                     fx_dtype_name(b->mapped->t[i].dtype), fx_dtype_name(want_dt[f]));
}

static int32_t argmax(const float *x, int64_t n)
{
    int32_t best = 0;
    for (int64_t v = 1; v < n; v++)
        best = x[v] > x[best] ? (int32_t)v : best;
    return best;
}

/* Prefill and decode with a (float32) and b (mapped), each fed b's greedy token: b's logits
   within the tolerance of a's, its tokens transformers' until the first step within the
   tolerance. *cur_cache: the memory in use once both caches are made. */
static void inference_steps(int f, fx_model *a, fx_model *b, const greedy_ref *g, size_t *cur_cache)
{
    const int64_t V = fx_model_get_config(a)->vocab;
    fx_model_cache *ca = NULL, *cb = NULL;
    size_t peak_cache;
    FXT_OK(fx_model_cache_create(&ca, a, g->T0 + g->G));
    FXT_OK(fx_model_cache_create(&cb, b, g->T0 + g->G));
    fx_mem_stats(cur_cache, &peak_cache);
    float *la = fxt_guarded((size_t)V), *lb = fxt_guarded((size_t)V);
    double *lad = fxt_alloc_f64((size_t)V);
    bool agree = true;
    int32_t tok = 0;
    for (int64_t s = 0; s <= g->G && ca && cb; s++) {
        if (s == 0) {
            FXT_OK(fx_model_prefill(a, ca, la, g->prompt, g->T0));
            FXT_OK(fx_model_prefill(b, cb, lb, g->prompt, g->T0));
        } else {
            FXT_OK(fx_model_decode_step(a, ca, la, tok));
            FXT_OK(fx_model_decode_step(b, cb, lb, tok));
        }
        for (int64_t v = 0; v < V; v++)
            lad[v] = la[v];
        char what[96];
        snprintf(what, sizeof what, "%s step %lld logits (mapped vs float32)", fixtures[f], (long long)s);
        fxt_close_f32(what, lb, lad, (size_t)V, g->tol, 0);
        const int32_t best = argmax(lb, V);
        if (s < g->G) {
            agree = agree && g->margin[s] > g->tol;
            if (agree && best != g->gen[s])
                FXT_FAIL("%s greedy step %lld: %d, transformers %lld (margin %.3g)", fixtures[f], (long long)s,
                         best, (long long)g->gen[s], (double)g->margin[s]);
        }
        tok = best;
    }
    fxt_guarded_free("logits a", la), fxt_guarded_free("logits b", lb);
    fx_model_cache_free(ca), fx_model_cache_free(cb);
    free(lad);
}

/* Loading allocated tables, not parameters; generation past the cache (sized by its
   capacity) only the attention mask and small scratch; no training buffers. The sizes are
   fx_mem_stats' since the peak was reset before loading. */
static void check_inference_memory(int f, const fx_model *b, size_t cur0, size_t peak_load, size_t cur_cache,
                                   size_t peak1)
{
    const size_t param_bytes = fx_model_num_params(b) * sizeof(float);
    FXT_CHECK(b->params == NULL && b->grads == NULL && b->adam == NULL && b->adam16 == NULL && b->acts == NULL);
    if (!(peak_load - cur0 < param_bytes / 8))
        FXT_FAIL("%s: loading peaked at %zu bytes, the float32 parameters are %zu", fixtures[f], peak_load - cur0,
                 param_bytes);
    if (!(peak1 - cur_cache < param_bytes / 4))
        FXT_FAIL("%s: generation peaked at %zu bytes above the cache, the float32 parameters are %zu", fixtures[f],
                 peak1 - cur_cache, param_bytes);
}

/* A forward pass needs float32 parameters: read on demand, then the model is fx_model_load's,
   bit for bit. */
static void check_read_on_demand(int f, fx_model *a, fx_model *b, const greedy_ref *g)
{
    const int64_t V = fx_model_get_config(a)->vocab, n = g->T0 * V;
    float *fa = malloc((size_t)n * sizeof *fa), *fb = malloc((size_t)n * sizeof *fb);
    FXT_OK(fx_model_forward(a, NULL, fa, g->prompt, NULL, 1, g->T0, 0));
    FXT_OK(fx_model_forward(b, NULL, fb, g->prompt, NULL, 1, g->T0, 0));
    FXT_CHECK(b->params != NULL && b->mapped == NULL);
    char what[96];
    snprintf(what, sizeof what, "%s forward after reading the parameters", fixtures[f]);
    fxt_bitwise_f32(what, fa, fb, (size_t)n);
    fx_model_tensor ta, tb;
    for (size_t i = 0; i < fx_model_tensor_count(a); i++) {
        FXT_OK(fx_model_tensor_at(a, i, &ta));
        FXT_OK(fx_model_tensor_at(b, i, &tb));
        if (memcmp(ta.data, tb.data, ta.numel * sizeof(float)) != 0)
            FXT_FAIL("%s: tensor %s differs from fx_model_load's", fixtures[f], ta.name);
    }
    free(fa), free(fb);
}

/* fixture f loaded both ways: mapped, within budget, and fx_model_load's results. */
static void inference_fixture_parity(int f)
{
    char dir[1024], path[1024];
    fixture_path(dir, sizeof dir, fixtures[f], "");
    fixture_path(path, sizeof path, fixtures[f], ".ref.safetensors");
    fx_model *a = NULL, *b = NULL;
    fx_safetensors *ref = NULL;
    FXT_OK(fx_model_load(&a, dir));
    size_t cur0, peak0, cur_load, peak_load, cur_cache, cur1, peak1;
    fx_mem_reset_peak();
    fx_mem_stats(&cur0, &peak0);
    FXT_OK(fx_model_load_inference(&b, dir));
    fx_mem_stats(&cur_load, &peak_load);
    FXT_OK(fx_safetensors_open(&ref, path));
    if (a && b && ref) {
        check_mapped(f, b);
        greedy_ref g = load_greedy(ref);
        inference_steps(f, a, b, &g, &cur_cache);
        fx_mem_stats(&cur1, &peak1);
        check_inference_memory(f, b, cur0, peak_load, cur_cache, peak1);
        check_read_on_demand(f, a, b, &g);
        free_greedy(&g);
    }
    fx_safetensors_free(ref);
    fx_model_free(a), fx_model_free(b);
}

/* fx_model_load_inference: the weights stay in the mapped file in its dtype (F32 in place,
   BF16 / F16 widened per product, q/k rows in rotate-half order), nothing of training is
   allocated, and prefill + decode give fx_model_load's logits and transformers' greedy
   tokens. The first call that needs float32 parameters reads them, with the same result. */
static void test_inference_parity(void)
{
    for (int f = 0; f < NFIX; f++)
        inference_fixture_parity(f);
    /* A tensor access reads the parameters too; a refused directory is refused alike. */
    char dir[1024];
    fixture_path(dir, sizeof dir, "llama_bf16", "");
    fx_model *m = NULL;
    FXT_OK(fx_model_load_inference(&m, dir));
    fx_model_tensor t;
    FXT_OK(fx_model_tensor_find(m, "layers.0.attn.wq", &t));
    FXT_CHECK(m && m->params != NULL && t.data != NULL);
    fx_model_free(m);
    expect_refused_load(fx_model_load_inference);
}

/* Training data from token ids of a large vocabulary: ids past 65535 reach the batches whole;
   documents are counted at the end-of-text id. */
static void test_data_large_vocab(void)
{
    enum { N = 4096 };
    int32_t *ids = malloc(N * sizeof *ids);
    for (int i = 0; i < N; i++)
        ids[i] = i % 100 == 99 ? 128001 : 65536 + (i * 7919) % 62000;
    fx__model_data d;
    FXT_OK(fx__model_data_from_ids(&d, ids, N, 128001, "ids", 0.1, 33));
    FXT_EQ_INT(d.n, N);
    FXT_EQ_INT(d.docs, N / 100);
    FXT_EQ_INT(d.n_train, N - (int64_t)(N * 0.1));
    int32_t tok[2 * 32], tgt[2 * 32];
    fx__model_data_val_batch(&d, 0, 2, 32, tok, tgt);
    for (int i = 0; i < 64; i++) {
        FXT_EQ_INT(tok[i], ids[d.n_train + i]);
        FXT_EQ_INT(tgt[i], ids[d.n_train + i + 1]);
    }
    fx__model_data d2;
    ids[5] += 65536; /* differs only above bit 16: the hash sees it */
    FXT_OK(fx__model_data_from_ids(&d2, ids, N, 128001, "ids", 0.1, 33));
    FXT_CHECK(d2.hash != d.hash);
    fx__model_data_free(&d2);
    FXT_STATUS(fx__model_data_from_ids(&d2, ids, 40, 128001, "ids", 0.1, 33), FX_EINVAL, "ids holds 40 tokens");
    ids[7] = -3;
    FXT_STATUS(fx__model_data_from_ids(&d2, ids, N, 128001, "ids", 0.1, 33), FX_ERANGE, "token 7 = -3");
    fx__model_data_free(&d);
    free(ids);
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    fxt_make_tmpdir(tmpdir, sizeof tmpdir, "flexc-hf");
    FXT_RUN(test_config_fixtures);
    FXT_RUN(test_config_refusals);
    FXT_RUN(test_config_json_roundtrip);
    FXT_RUN(test_rope_llama3);
    FXT_RUN(test_open_fixtures);
    FXT_RUN(test_rope_rows);
    FXT_RUN(test_reference_forward);
    FXT_RUN(test_export_roundtrip);
    FXT_RUN(test_bad_weights);
    FXT_RUN(test_model_parity);
    FXT_RUN(test_inference_parity);
    FXT_RUN(test_data_large_vocab);
    fxt_rm_tree(tmpdir);
    return fxt_finish();
}
