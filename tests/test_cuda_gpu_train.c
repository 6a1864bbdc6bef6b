/* The GPT's training step on a CUDA device (src/cuda/model_gpu.h) against the CPU model on a
   tiny configuration (2 layers, dim 64, 4 query heads over 2 KV heads, B 2, T 32): the loss
   and every gradient tensor of a forward and backward pass, in float32 and with bfloat16
   products, with qkv biases and an untied head, under the causal, sliding-window and
   document masks; a few optimizer steps; two runs bitwise equal; checkpoints written from
   one device and read on the other; decoding with the KV cache on the device, logits and
   greedy tokens against the CPU's. Skipped (77) without a GPU. */
#include "harness.h"
#include "tmpdir.h"

#include "cuda/model_gpu.h"

/* (cuda_gpu.h's buffer helpers are not needed: the model moves its own memory.) */
static void gpu_require(void)
{
    if (fx_cuda_device_count() > 0)
        return;
    printf("SKIP: no CUDA device is visible: the GPU tests need one\n");
    exit(77);
}

enum { B = 2, T = 32 };

static char tmp[512];

typedef struct variant {
    const char *name;
    bool qkv_bias, untied;
    const char *mask;
    bool llama3; /* Llama-3 RoPE scaling and head_dim 32 (heads x head_dim != dim), as a
                    Hugging Face model may have */
} variant;

static fx_model_config tiny(const variant *v)
{
    fx_model_config c;
    FXT_OK(fx__model_preset(&c, "tiny"));
    c.ctx = T;
    c.qkv_bias = v->qkv_bias;
    c.tied_embeddings = !v->untied;
    if (v->llama3) {
        c.head_dim = 32;
        c.rope_theta = 500000.0f;
        c.rope_scaling.type = FX_ROPE_SCALING_LLAMA3;
        c.rope_scaling.factor = 8.0f, c.rope_scaling.low_freq_factor = 1.0f, c.rope_scaling.high_freq_factor = 4.0f;
        c.rope_scaling.original_max_position_embeddings = 8;
    }
    FXT_OK(fx__model_config_check(&c));
    return c;
}

/* The model on the CPU or the device, same seed, training buffers and batch shape. */
static fx__model *make(const variant *v, bool gpu, bool bf16)
{
    fx_model_config c = tiny(v);
    fx__model *m = NULL;
    FXT_OK(fx__model_create(&m, &c, 7));
    FXT_OK(fx__model_alloc_train(m));
    FXT_OK(fx__model_mask_parse(v->mask, &m->mask, &m->window));
    if (c.qkv_bias) { /* created as zeros: give them values so that their gradients matter */
        for (size_t l = 0; l < (size_t)c.layers; l++)
            for (int k = FX__MODEL_BQ; k <= FX__MODEL_BV; k++) {
                const fx__model_tensor *t = &m->lay.t[1 + l * m->lay.per_layer + (size_t)k];
                for (size_t i = 0; i < t->numel; i++)
                    m->params[t->offset + i] = 0.05f * (float)((i * 7 + l + (size_t)k) % 11) - 0.25f;
            }
    }
    if (gpu)
        FXT_OK(fx__model_gpu_attach(m, 1, bf16));
    else if (bf16)
        FXT_OK(fx__model_set_bf16(m, true));
    FXT_OK(fx__model_set_batch(m, B, T));
    return m;
}

/* A batch with end-of-text tokens (documents) and ignored targets. */
static void batch(int32_t *tok, int32_t *tgt, uint64_t seed)
{
    fx_rng r;
    fx_rng_init(&r, seed, 1);
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)(fx_rng_u32(&r) % 256);
        if (i % 11 == 5)
            tok[i] = FX__MODEL_EOT;
        tgt[i] = i % 13 == 4 ? -100 : (int32_t)(fx_rng_u32(&r) % 257);
    }
}

/* Every tensor's gradient within atol_rel of the tensor's largest reference magnitude plus
   rtol relative. */
static void compare_grads(const fx__model *cpu, const float *g, double atol_rel, double rtol)
{
    for (size_t i = 0; i < cpu->lay.n; i++) {
        const fx__model_tensor *t = &cpu->lay.t[i];
        double *ref = fxt_alloc_f64(t->numel), big = 0.0;
        for (size_t j = 0; j < t->numel; j++) {
            ref[j] = cpu->grads[t->offset + j];
            big = fabs(ref[j]) > big ? fabs(ref[j]) : big;
        }
        char what[80];
        snprintf(what, sizeof what, "d %s", t->name);
        if (!fxt_close_f32(what, g + t->offset, ref, t->numel, atol_rel * big + 1e-7, rtol))
            fxt_failed_checks++;
        free(ref);
    }
}

static void check_pass(const variant *v, bool bf16)
{
    printf("  %s%s\n", v->name, bf16 ? " (bf16)" : "");
    fx__model *cpu = make(v, false, bf16), *gpu = make(v, true, bf16);
    int32_t tok[B * T], tgt[B * T];
    batch(tok, tgt, 11);
    float lc, lg;
    FXT_OK(fx__model_forward(cpu, tok, tgt, &lc, true));
    FXT_OK(fx__model_backward(cpu));
    FXT_OK(fx__model_forward(gpu, tok, tgt, &lg, true));
    FXT_OK(fx__model_backward(gpu));
    FXT_NEAR(lg, lc, bf16 ? 1e-2 : 1e-5, bf16 ? 1e-2 : 1e-5);
    float *g = malloc(gpu->lay.total * sizeof(float));
    FXT_OK(fx__model_gpu_grads(gpu, g));
    compare_grads(cpu, g, bf16 ? 3e-2 : 1e-4, bf16 ? 3e-2 : 1e-3);
    /* Evaluation (no gradients) gives the training forward's loss. */
    float le;
    FXT_OK(fx__model_forward(gpu, tok, tgt, &le, false));
    FXT_CHECK(le == lg);
    free(g);
    fx__model_free(cpu);
    fx__model_free(gpu);
}

/* A shape that is a multiple of nothing (dim 48, 3 query heads of 16 over one KV head, one
   layer, ffn 128) and more tokens than a column-sum chunk (3 x 96 = 288 > 256: the norms'
   and the bias's weight gradients add two chunks). */
static void test_odd_shape(void)
{
    fx_model_config c;
    FXT_OK(fx__model_preset(&c, "tiny"));
    c.ctx = 96, c.layers = 1, c.dim = 48, c.heads = 3, c.kv_heads = 1, c.ffn = 0, c.qkv_bias = true;
    c.tied_embeddings = false;
    FXT_OK(fx__model_config_check(&c));
    enum { b = 3, t = 96 };
    fx__model *m[2];
    for (int i = 0; i < 2; i++) {
        FXT_OK(fx__model_create(&m[i], &c, 21));
        FXT_OK(fx__model_alloc_train(m[i]));
        FXT_OK(fx__model_mask_parse("sliding:40", &m[i]->mask, &m[i]->window));
        for (size_t j = 0; j < m[i]->lay.total; j++) /* the zero biases and unit norms a little off */
            m[i]->params[j] += 0.01f * (float)(j % 7) - 0.03f;
        if (i == 1)
            FXT_OK(fx__model_gpu_attach(m[i], 1, false));
        FXT_OK(fx__model_set_batch(m[i], b, t));
    }
    int32_t tok[b * t], tgt[b * t];
    for (int i = 0; i < b * t; i++)
        tok[i] = (int32_t)((i * 37 + 5) % 257), tgt[i] = i % 9 == 2 ? -100 : (int32_t)((i * 53 + 1) % 257);
    float l[2];
    for (int i = 0; i < 2; i++) {
        FXT_OK(fx__model_forward(m[i], tok, tgt, &l[i], true));
        FXT_OK(fx__model_backward(m[i]));
    }
    FXT_NEAR(l[1], l[0], 1e-5, 1e-5);
    float *g = malloc(m[1]->lay.total * sizeof(float));
    FXT_OK(fx__model_gpu_grads(m[1], g));
    compare_grads(m[0], g, 1e-4, 1e-3);
    free(g);
    fx__model_free(m[0]), fx__model_free(m[1]);
}

static const variant variants[] = {
    {"causal", false, false, "causal", false},
    {"qkv bias, untied head", true, true, "causal", false},
    {"sliding:8", false, false, "sliding:8", false},
    {"document", false, true, "document", false},
    {"llama3 rope, head_dim 32", true, false, "causal", true},
};

static void test_gradients_f32(void)
{
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++)
        check_pass(&variants[i], false);
}

static void test_gradients_bf16(void)
{
    check_pass(&variants[0], true);
    check_pass(&variants[1], true);
}

/* Training data: a token stream with documents. */
static fx__model_data data(void)
{
    enum { n = 4096 };
    int32_t *ids = malloc(n * sizeof(int32_t));
    for (int i = 0; i < n; i++)
        ids[i] = i % 97 == 96 ? FX__MODEL_EOT : (int32_t)((i * 31 + i / 7) % 256);
    fx__model_data d;
    FXT_OK(fx__model_data_from_ids(&d, ids, n, FX__MODEL_EOT, "test ids", 0.1, T + 1));
    free(ids);
    return d;
}

static fx__model_train_state state(void)
{
    fx__model_train_state s = {.steps = 20, .warmup = 2, .batch = B, .seq = T, .accum = 2, .lr = 3e-3f,
                             .min_lr = 3e-4f, .weight_decay = 0.1f, .clip = 1.0f, .beta1 = 0.9f, .beta2 = 0.95f,
                             .seed = 5};
    fx_rng_init(&s.rng, s.seed, 1);
    snprintf(s.attn, sizeof s.attn, "causal");
    return s;
}

/* k steps; the losses into loss[k]. */
static void steps(fx__model *m, const fx__model_data *d, fx__model_train_state *s, int k, float *loss)
{
    int32_t tok[B * T], tgt[B * T];
    for (int i = 0; i < k; i++) {
        fx__model_step_info info;
        FXT_OK(fx__model_train_step(m, d, s, tok, tgt, &info));
        loss[i] = info.loss;
    }
}

static void test_steps(void)
{
    fx__model_data d = data();
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        fx__model *cpu = make(&variants[0], false, bf16), *gpu = make(&variants[0], true, bf16);
        fx__model *again = make(&variants[0], true, bf16);
        fx__model_train_state sc = state(), sg = state(), sa = state();
        float lc[3], lg[3], la[3];
        steps(cpu, &d, &sc, 3, lc);
        steps(gpu, &d, &sg, 3, lg);
        steps(again, &d, &sa, 3, la);
        for (int i = 0; i < 3; i++) {
            printf("  %s step %d: cpu %.6f gpu %.6f\n", bf16 ? "bf16" : "f32", i + 1, (double)lc[i], (double)lg[i]);
            FXT_NEAR(lg[i], lc[i], bf16 ? 2e-2 : 1e-4, bf16 ? 1e-2 : 1e-4);
            FXT_CHECK(memcmp(&lg[i], &la[i], sizeof(float)) == 0);
        }
        FXT_CHECK(lg[2] < lg[0]);
        FXT_EQ_INT(sg.step, 3);
        /* Two runs: the same bits in every weight and moment. */
        FXT_OK(fx__model_gpu_download(gpu));
        FXT_OK(fx__model_gpu_download(again));
        FXT_CHECK(fxt_bitwise_f32("weights", gpu->params, again->params, gpu->lay.total));
        FXT_CHECK(fxt_bitwise_f32("moments", gpu->adam, again->adam, 2 * gpu->lay.total));
        fx__model_free(cpu), fx__model_free(gpu), fx__model_free(again);
    }
    fx__model_data_free(&d);
}

/* A checkpoint saved from the device continues on the CPU, and one saved on the CPU on the
   device: two more steps either way give the losses of an uninterrupted run. */
static void test_checkpoints(void)
{
    fx__model_data d = data();
    char path[600];
    snprintf(path, sizeof path, "%s/ck.safetensors", tmp);
    for (int from_gpu = 0; from_gpu <= 1; from_gpu++) {
        fx__model *a = make(&variants[1], from_gpu, false);
        fx__model_train_state s = state();
        float l[4], ref[4];
        steps(a, &d, &s, 2, l);
        if (from_gpu)
            FXT_OK(fx__model_gpu_download(a));
        FXT_OK(fx__model_save_checkpoint(a, &s, path));
        fx__model_train_state s_keep = s;
        steps(a, &d, &s, 2, ref); /* the uninterrupted run */

        fx__model *b = make(&variants[1], false, false);
        fx__model_train_state s2;
        fx_model_config c2;
        bool adam = false;
        FXT_OK(fx__model_read_config(path, &c2, &s2, &adam));
        FXT_CHECK(adam);
        FXT_OK(fx__model_load(b, path, true));
        FXT_EQ_INT(s2.step, s_keep.step);
        s2.rng = s_keep.rng; /* the sampler's state as saved */
        if (!from_gpu) {
            FXT_OK(fx__model_gpu_attach(b, 1, false));
            FXT_OK(fx__model_set_batch(b, B, T));
        }
        steps(b, &d, &s2, 2, l);
        printf("  %s -> %s: %.6f %.6f (uninterrupted %.6f %.6f)\n", from_gpu ? "gpu" : "cpu",
               from_gpu ? "cpu" : "gpu", (double)l[0], (double)l[1], (double)ref[0], (double)ref[1]);
        for (int i = 0; i < 2; i++)
            FXT_NEAR(l[i], ref[i], 1e-4, 1e-4);
        fx__model_free(a), fx__model_free(b);
    }
    fx__model_data_free(&d);
}

/* Decoding on the device: a prompt, then four tokens one at a time, the logits of each within
   float rounding of the CPU's (under each mask), and greedy choices the same. */
static void test_decode(void)
{
    for (size_t vi = 0; vi < sizeof variants / sizeof variants[0]; vi++) {
        const variant *v = &variants[vi];
        fx_model_config c = tiny(v);
        fx__model *cpu = NULL, *gpu = NULL;
        FXT_OK(fx__model_create(&cpu, &c, 9));
        FXT_OK(fx__model_create(&gpu, &c, 9));
        FXT_OK(fx__model_mask_parse(v->mask, &cpu->mask, &cpu->window));
        FXT_OK(fx__model_mask_parse(v->mask, &gpu->mask, &gpu->window));
        FXT_OK(fx__model_gpu_attach(gpu, 1, false));
        fx__model_cache *kc = NULL, *kg = NULL;
        FXT_OK(fx__model_cache_create(&kc, cpu, 24));
        FXT_OK(fx__model_cache_create(&kg, gpu, 24));
        const int64_t V = c.vocab;
        float *lc = malloc((size_t)V * sizeof(float)), *lg = malloc((size_t)V * sizeof(float));
        double *ref = fxt_alloc_f64((size_t)V);
        int32_t prompt[6] = {FX__MODEL_EOT, 't', 'h', 'e', ' ', 'q'}, next = 0;
        for (int step = 0; step < 5; step++) {
            if (step == 0) {
                FXT_OK(fx__model_decode(cpu, kc, prompt, 6, lc));
                FXT_OK(fx__model_decode(gpu, kg, prompt, 6, lg));
            } else {
                FXT_OK(fx__model_decode(cpu, kc, &next, 1, lc));
                FXT_OK(fx__model_decode(gpu, kg, &next, 1, lg));
            }
            double big = 0.0;
            int32_t bc = 0, bg = 0;
            for (int64_t i = 0; i < V; i++) {
                ref[i] = lc[i];
                big = fabs(ref[i]) > big ? fabs(ref[i]) : big;
                bc = lc[i] > lc[bc] ? (int32_t)i : bc;
                bg = lg[i] > lg[bg] ? (int32_t)i : bg;
            }
            if (!fxt_close_f32(v->name, lg, ref, (size_t)V, 1e-4 * big, 1e-4))
                fxt_failed_checks++;
            FXT_EQ_INT(bg, bc);
            next = bc;
        }
        FXT_EQ_INT(kg->len, 10);
        free(lc), free(lg), free(ref);
        fx__model_cache_free(kc), fx__model_cache_free(kg);
        fx__model_free(cpu), fx__model_free(gpu);
    }
}

static void test_refusals(void)
{
    fx__model *m = make(&variants[0], false, false);
    FXT_STATUS(fx__model_gpu_attach(m, 0, false), FX_EINVAL, "device = 0");
    m->recompute = true;
    FXT_STATUS(fx__model_gpu_attach(m, 1, false), FX_EUNSUPPORTED, "recompute");
    m->recompute = false;
    FXT_OK(fx__model_gpu_attach(m, 1, false));
    FXT_OK(fx__model_set_batch(m, B, T));
    m->mask = FX__MODEL_MASK_CAUSAL_DENSE;
    int32_t tok[B * T], tgt[B * T];
    batch(tok, tgt, 3);
    float l;
    FXT_STATUS(fx__model_forward(m, tok, tgt, &l, true), FX_EUNSUPPORTED, "--attn dense");
    m->mask = FX__MODEL_MASK_CAUSAL;
    tok[3] = 300;
    FXT_STATUS(fx__model_forward(m, tok, tgt, &l, true), FX_ERANGE, "token[3] = 300");
    FXT_STATUS(fx__model_backward(m), FX_EINVAL, "no forward");
    fx__model_free(m);
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    gpu_require();
    fxt_make_tmpdir(tmp, sizeof tmp, "flexc-gpu-train");
    FXT_RUN(test_refusals);
    FXT_RUN(test_gradients_f32);
    FXT_RUN(test_odd_shape);
    FXT_RUN(test_gradients_bf16);
    FXT_RUN(test_steps);
    FXT_RUN(test_checkpoints);
    FXT_RUN(test_decode);
    fxt_rm_tree(tmp);
    return fxt_finish();
}
