/* LoRA adapters (src/model/lora.c, layer.c, backward.c, step.c): the table (PEFT's names, only
   the targeted projections), B = 0 gives the base's logits bitwise, base + adapter against the
   merged weights, dA and dB against central differences, a frozen base, the loss falling over
   20 steps on one batch, and the same bits at 1 and 2 threads (with dropout). */
#include "harness.h"
#include "tmpdir.h"

#include "model/lora.h"
#include "model/model.h"
#include "model/model_internal.h"

#include <flexc/rng.h>

#include <string.h>

/* GQA, head_dim != dim / heads, q/k/v biases, an untied head: every product shape. */
static fx_model_config cfg(void)
{
    fx_model_config c;
    fx__model_preset(&c, "tiny");
    c.layers = 2, c.dim = 16, c.heads = 4, c.kv_heads = 2, c.ffn = 24, c.ctx = 16;
    snprintf(c.arch, sizeof c.arch, "LlamaForCausalLM");
    c.head_dim = 6;
    c.qkv_bias = true;
    c.tied_embeddings = false;
    return c;
}

enum { B = 2, T = 12 };

static void batch(int64_t V, uint64_t seed, int32_t *tok, int32_t *tgt)
{
    fx_rng r;
    fx_rng_init(&r, seed, 0);
    for (int64_t i = 0; i < B * T; i++) {
        tok[i] = (int32_t)(fx_rng_u32(&r) % (uint32_t)V);
        tgt[i] = (int32_t)(fx_rng_u32(&r) % (uint32_t)V);
    }
    tgt[3] = -100;
}

static fx__model *model(uint64_t seed)
{
    fx_model_config c = cfg();
    fx__model *m = NULL;
    FXT_OK(fx__model_create(&m, &c, seed));
    /* Biases and matrices away from their init, so every path carries a visible signal. */
    for (size_t ti = 0; ti < m->lay.n; ti++)
        for (size_t j = 0; j < m->lay.t[ti].numel; j++)
            m->params[m->lay.t[ti].offset + j] = m->lay.t[ti].ndim == 2 ? m->params[m->lay.t[ti].offset + j] * 5.0f
                                                                         : m->params[m->lay.t[ti].offset + j] +
                                                                               0.1f * (float)((j * 7 + ti) % 5);
    FXT_OK(fx__model_set_batch(m, B, T));
    return m;
}

static fx__lora *adapters(const fx__model *m, unsigned targets, int64_t r, float dropout, uint64_t seed)
{
    fx__lora_config lc = fx__lora_defaults(r);
    lc.targets = targets;
    lc.dropout = dropout;
    fx__lora *a = NULL;
    FXT_OK(fx__lora_create(&a, &m->c, &lc, seed));
    return a;
}

/* B drawn too (its init is zero, which would hide A's gradient and the adapter's output). */
static void randomize_b(fx__lora *a, uint64_t seed)
{
    for (size_t i = 0; i < a->n; i++)
        if (a->t[i].is_b)
            fx_rng_fill_uniform(a->params + a->t[i].offset, (int64_t)a->t[i].numel, -0.3f, 0.3f, seed, i);
}

static float *logits_of(fx__model *m, const int32_t *tok)
{
    float *lg = malloc((size_t)(B * T * m->c.vocab) * sizeof *lg);
    FXT_OK(fx__model_forward(m, tok, NULL, NULL, false));
    fx__model_logits(m, lg, false);
    return lg;
}

/* The table: q, v and down on each layer, A then B, PEFT's names and shapes; A within PEFT's
   default bound and B zero; bad configurations refused. */
static void test_table(void)
{
    fx__model *m = model(1);
    const fx_model_config *c = &m->c;
    fx__lora *a = adapters(m, 1u << FX__LORA_Q | 1u << FX__LORA_V | 1u << FX__LORA_DOWN, 4, 0.0f, 3);
    FXT_CHECK(a->n == 2 * 3 * 2);
    FXT_CHECK(!strcmp(a->t[0].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
    FXT_CHECK(!strcmp(a->t[1].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"));
    FXT_CHECK(!strcmp(a->t[3].name, "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight"));
    FXT_CHECK(!strcmp(a->t[11].name, "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
    FXT_CHECK(a->t[0].shape[0] == 4 && a->t[0].shape[1] == c->dim);
    FXT_CHECK(a->t[1].shape[0] == c->heads * c->head_dim && a->t[1].shape[1] == 4 && a->t[1].rope_heads == c->heads);
    FXT_CHECK(a->t[3].rope_heads == 0);
    FXT_CHECK(a->t[4].shape[1] == c->ffn && a->t[5].shape[0] == c->dim);
    FXT_CHECK(fx__lora_find(a, "base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight") == 8);
    FXT_CHECK(fx__lora_find(a, "base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight") == -1);
    for (int64_t l = 0; l < 2; l++)
        for (int t = 0; t < FX__LORA_TARGETS; t++) {
            const bool want = t == FX__LORA_Q || t == FX__LORA_V || t == FX__LORA_DOWN;
            FXT_CHECK((fx__lora_a(a, l, (fx__lora_target)t) != NULL) == want);
        }
    FXT_CHECK(a->scale == 2.0f);
    for (size_t i = 0; i < a->n; i++) {
        const float bound = 1.0f / sqrtf((float)a->t[i].shape[1]);
        float lo = 0, hi = 0;
        for (size_t j = 0; j < a->t[i].numel; j++) {
            float v = a->params[a->t[i].offset + j];
            lo = v < lo ? v : lo, hi = v > hi ? v : hi;
        }
        if (a->t[i].is_b)
            FXT_CHECK(lo == 0.0f && hi == 0.0f);
        else
            FXT_CHECK(lo >= -bound && hi <= bound && hi - lo > bound); /* spread over the interval */
    }
    float v[4 * 16] = {0};
    FXT_CHECK(fx__lora_set(a, 0, v, 4 * 16) == FX_OK && a->params[a->t[0].offset] == 0.0f);
    FXT_CHECK(fx__lora_set(a, 0, v, 3) == FX_ERANGE);
    FXT_CHECK(fx__lora_set(a, 99, v, 4) == FX_ERANGE);
    fx__lora_config bad = fx__lora_defaults(0);
    fx__lora *x = NULL;
    FXT_CHECK(fx__lora_create(&x, c, &bad, 1) == FX_EINVAL && !x);
    bad = fx__lora_defaults(2), bad.dropout = 1.0f;
    FXT_CHECK(fx__lora_create(&x, c, &bad, 1) == FX_EINVAL);
    bad = fx__lora_defaults(2), bad.targets = 1u << 9;
    FXT_CHECK(fx__lora_create(&x, c, &bad, 1) == FX_EINVAL);
    fx__lora_free(a);
    fx__model_free(m);
}

/* B = 0 at init: the logits are the base's, bit for bit. */
static void test_zero_b(void)
{
    fx__model *m = model(2);
    int32_t tok[B * T], tgt[B * T];
    batch(m->c.vocab, 5, tok, tgt);
    float *base = logits_of(m, tok);
    FXT_OK(fx__model_set_lora(m, adapters(m, FX__LORA_ALL, 3, 0.0f, 7)));
    float *with = logits_of(m, tok);
    fxt_bitwise_f32("B = 0 logits", base, with, (size_t)(B * T * m->c.vocab));
    free(base), free(with);
    fx__model_free(m);
}

/* Base + adapter against the merged weights W + scale B A (float64, rounded once). */
static void test_merge(void)
{
    const unsigned sets[] = {FX__LORA_ALL, 1u << FX__LORA_K | 1u << FX__LORA_UP | 1u << FX__LORA_O};
    for (int s = 0; s < 2; s++) {
        fx__model *m = model(3), *merged = model(3);
        fx__lora *a = adapters(m, sets[s], 4, 0.0f, 9);
        randomize_b(a, 11);
        for (int64_t l = 0; l < m->c.layers; l++)
            for (int t = 0; t < FX__LORA_TARGETS; t++) {
                const int which = fx__lora_weight_of((fx__lora_target)t);
                const fx__model_tensor *w = fx__layer_first(merged, l) + which;
                fx__lora_merge(a, l, (fx__lora_target)t, merged->params + w->offset, w->shape[0], w->shape[1]);
            }
        FXT_OK(fx__model_set_lora(m, a));
        int32_t tok[B * T], tgt[B * T];
        batch(m->c.vocab, 6, tok, tgt);
        float *lg = logits_of(m, tok), *lm = logits_of(merged, tok);
        double *ref = fxt_alloc_f64((size_t)(B * T * m->c.vocab));
        for (size_t i = 0; i < (size_t)(B * T * m->c.vocab); i++)
            ref[i] = lm[i];
        fxt_close_f32(s ? "merged (k, up, o)" : "merged (all)", lg, ref, (size_t)(B * T * m->c.vocab), 1e-5, 1e-5);
        /* and the adapters did change the output */
        float *base = NULL;
        fx__model *plain = model(3);
        base = logits_of(plain, tok);
        double diff = 0;
        for (size_t i = 0; i < (size_t)(B * T * m->c.vocab); i++)
            diff = fmax(diff, fabs((double)base[i] - lg[i]));
        FXT_CHECK(diff > 1e-3);
        free(lg), free(lm), free(ref), free(base);
        fx__model_free(m), fx__model_free(merged), fx__model_free(plain);
    }
}

/* dA and dB against central differences of the loss (float64 differences of float32 losses:
   the same tolerance as test_model's whole-model check), for the adapters of `targets`: all
   seven, or some of a group's (q and v: columns apart in the q, k, v product). */
static void gradcheck(unsigned targets)
{
    fx__model *m = model(4);
    fx__lora *a = adapters(m, targets, 3, 0.0f, 13);
    randomize_b(a, 17);
    FXT_OK(fx__model_set_lora(m, a));
    FXT_CHECK(m->grads == NULL); /* no gradient buffer for the base */
    int32_t tok[B * T], tgt[B * T];
    batch(m->c.vocab, 8, tok, tgt);
    float loss;
    fx__model_zero_grad(m);
    FXT_OK(fx__model_forward(m, tok, tgt, &loss, true));
    FXT_OK(fx__model_backward(m));
    const float eps = 1e-3f;
    int checked = 0;
    for (size_t ti = 0; ti < a->n; ti++) {
        const fx__lora_tensor *t = &a->t[ti];
        size_t best = 0;
        for (size_t j = 1; j < t->numel; j++)
            if (fabsf(a->grads[t->offset + j]) > fabsf(a->grads[t->offset + best]))
                best = j;
        FXT_CHECK(a->grads[t->offset + best] != 0.0f);
        for (int pick = 0; pick < 2; pick++) {
            size_t i = t->offset + (pick == 0 ? best : ((size_t)pick * 7919 + 13) % t->numel);
            float keep = a->params[i], lp, lm;
            a->params[i] = keep + eps;
            FXT_OK(fx__model_forward(m, tok, tgt, &lp, false));
            a->params[i] = keep - eps;
            FXT_OK(fx__model_forward(m, tok, tgt, &lm, false));
            a->params[i] = keep;
            double fd = ((double)lp - lm) / (2.0 * eps), got = a->grads[i];
            if (fabs(got - fd) > 2e-3 + 3e-2 * fabs(fd))
                FXT_FAIL("%s[%zu]: grad %.6g vs finite difference %.6g", t->name, i - t->offset, got, fd);
            checked++;
        }
    }
    FXT_CHECK(checked == (int)(2 * a->n));
    fx__model_free(m);
}

static void test_gradcheck(void)
{
    gradcheck(FX__LORA_ALL);
    gradcheck(1u << FX__LORA_Q | 1u << FX__LORA_V | 1u << FX__LORA_UP | 1u << FX__LORA_DOWN);
}

/* n steps of the training step's work on one batch: zero, forward, backward, clip, AdamW on
   the adapters. Returns the first and last loss. */
static void steps(fx__model *m, const int32_t *tok, const int32_t *tgt, int n, float *first, float *last)
{
    FXT_OK(fx__lora_alloc_train(m->lora));
    for (int s = 0; s < n; s++) {
        float loss;
        fx__model_zero_grad(m);
        FXT_OK(fx__model_forward(m, tok, tgt, &loss, true));
        FXT_OK(fx__model_backward(m));
        double norm = fx__lora_grad_norm(m->lora);
        fx__adamw o = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.01f,
                       .grad_scale = norm > 1.0 ? (float)(1.0 / norm) : 1.0f, .zero_grad = true};
        fx__lora_adamw(m->lora, &o, s + 1);
        if (s == 0)
            *first = loss;
        *last = loss;
    }
}

/* 20 steps on one batch: the loss falls, the base's parameters are the same bits. */
static void test_train(void)
{
    fx__model *m = model(5);
    FXT_OK(fx__model_set_lora(m, adapters(m, FX__LORA_ALL, 4, 0.0f, 19)));
    const size_t P = m->lay.total;
    float *before = malloc(P * sizeof *before);
    memcpy(before, m->params, P * sizeof *before);
    int32_t tok[B * T], tgt[B * T];
    batch(m->c.vocab, 9, tok, tgt);
    float first, last;
    steps(m, tok, tgt, 20, &first, &last);
    fxt_bitwise_f32("frozen base", before, m->params, P);
    FXT_CHECK(last < 0.8f * first);
    printf("  loss %.4f -> %.4f over 20 steps\n", (double)first, (double)last);
    free(before);
    fx__model_free(m);
}

/* The same adapters after 3 steps (with dropout) at 1 and 2 threads, and the same loss. */
static void test_threads(void)
{
    const int before = fx_get_num_threads();
    float *got[2];
    float loss[2];
    size_t n = 0;
    for (int k = 0; k < 2; k++) {
        FXT_OK(fx_set_num_threads(k + 1));
        fx__model *m = model(6);
        FXT_OK(fx__model_set_lora(m, adapters(m, FX__LORA_ALL, 4, 0.2f, 23)));
        int32_t tok[B * T], tgt[B * T];
        batch(m->c.vocab, 10, tok, tgt);
        float first;
        steps(m, tok, tgt, 3, &first, &loss[k]);
        n = m->lora->total;
        got[k] = malloc(n * sizeof(float));
        memcpy(got[k], m->lora->params, n * sizeof(float));
        fx__model_free(m);
    }
    FXT_OK(fx_set_num_threads(before));
    fxt_bitwise_f32("adapters at 1 and 2 threads", got[0], got[1], n);
    FXT_CHECK(loss[0] == loss[1]);
    free(got[0]), free(got[1]);
}

/* One forward and backward pass over the batch of seed: a copy of the adapters' gradients
   ([*n], malloc'd). */
static float *grads_of(fx__model *m, uint64_t seed, size_t *n)
{
    int32_t tok[B * T], tgt[B * T];
    batch(m->c.vocab, seed, tok, tgt);
    float loss;
    fx__model_zero_grad(m);
    FXT_OK(fx__model_forward(m, tok, tgt, &loss, true));
    FXT_OK(fx__model_backward(m));
    *n = m->lora->total;
    float *g = malloc(*n * sizeof(float));
    memcpy(g, m->lora->grads, *n * sizeof(float));
    return g;
}

/* Dropout: the mask changes the adapter's input only while training, and d(A), d(B) follow
   it: with p > 0 the gradients differ from p = 0's, a forward without gradients does not. */
static void test_dropout(void)
{
    float *g[2];
    float *lg[2];
    size_t n = 0;
    for (int k = 0; k < 2; k++) {
        fx__model *m = model(7);
        fx__lora *a = adapters(m, FX__LORA_ALL, 2, k ? 0.5f : 0.0f, 29);
        randomize_b(a, 31);
        FXT_OK(fx__model_set_lora(m, a));
        g[k] = grads_of(m, 11, &n);
        int32_t tok[B * T], tgt[B * T];
        batch(m->c.vocab, 11, tok, tgt);
        lg[k] = logits_of(m, tok);
        fx__model_free(m);
    }
    const size_t V = (size_t)cfg().vocab;
    fxt_bitwise_f32("no dropout at inference", lg[0], lg[1], (size_t)(B * T) * V);
    bool differ = false;
    for (size_t i = 0; i < n; i++)
        differ |= g[0][i] != g[1][i];
    FXT_CHECK(differ);
    free(g[0]), free(g[1]), free(lg[0]), free(lg[1]);
}

/* fx__model_train_step with adapters: two micro-batches, clipping and the schedule as train
   runs them; the loss falls on a repeated corpus, the base is the same bits, the adapters' Adam
   moments exist and the base has no gradient or moment buffers. */
static void test_train_step(void)
{
    char dir[256], path[300], text[4096];
    fxt_make_tmpdir(dir, sizeof dir, "flexc-lora");
    snprintf(path, sizeof path, "%s/corpus.txt", dir);
    size_t n = 0;
    for (int i = 0; n + 64 < sizeof text; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "the cat %d sat on the mat.\n", i % 3);
    FILE *f = fopen(path, "wb");
    FXT_CHECK(f != NULL);
    if (!f)
        return;
    fwrite(text, 1, n, f);
    fclose(f);
    fx__model_data d;
    FXT_OK(fx__model_data_load(&d, path, NULL, 0.1, 17));
    fx_model_config c;
    fx__model_preset(&c, "tiny");
    c.layers = 2, c.dim = 32, c.heads = 4, c.kv_heads = 2, c.ffn = 48, c.ctx = 16;
    fx__model *m = NULL;
    FXT_OK(fx__model_create(&m, &c, 3));
    fx__lora_config lc = fx__lora_defaults(4);
    fx__lora *a = NULL;
    FXT_OK(fx__lora_create(&a, &m->c, &lc, 4));
    FXT_OK(fx__model_set_lora(m, a));
    float *before = malloc(m->lay.total * sizeof *before);
    memcpy(before, m->params, m->lay.total * sizeof *before);
    fx__model_train_state s = {.steps = 30, .warmup = 2, .batch = 2, .seq = 16, .accum = 2, .lr = 1e-2f,
                               .min_lr = 1e-3f, .weight_decay = 0.0f, .clip = 1.0f, .beta1 = 0.9f, .beta2 = 0.95f,
                               .seed = 5};
    fx_rng_init(&s.rng, 5, 1);
    int32_t tok[32], tgt[32];
    double first = 0, last = 0;
    for (int i = 0; i < 30; i++) {
        fx__model_step_info info;
        FXT_OK(fx__model_train_step(m, &d, &s, tok, tgt, &info));
        FXT_CHECK(isfinite(info.grad_norm) && info.grad_norm > 0.0f);
        if (i < 5)
            first += info.loss;
        if (i >= 25)
            last += info.loss;
    }
    FXT_CHECK(s.step == 30);
    printf("  train_step loss (mean of 5) %.4f -> %.4f\n", first / 5, last / 5);
    FXT_CHECK(last / 5 < first / 5 - 0.15); /* a corpus of three lines, varied batches */
    FXT_CHECK(a->adam_m && a->adam_v && !m->grads && !m->adam && !m->adam16);
    fxt_bitwise_f32("frozen base after train steps", before, m->params, m->lay.total);
    free(before);
    fx__model_data_free(&d);
    fx__model_free(m);
    fxt_rm_tree(dir);
}

/* ---- a mapped base (fx_model_load_inference: the file's dtype, not widened) ---------------------- */

static const char *const fixtures[] = {"llama3_tied", "llama_bf16", "mistral_f16", "qwen2_bias"};

static fx__model *load_mapped(const char *name, bool mapped)
{
    const char *src = getenv("FLEXC_SOURCE_DIR") ? getenv("FLEXC_SOURCE_DIR") : ".";
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/models/%s", src, name);
    fx_model *m = NULL;
    FXT_OK(mapped ? fx_model_load_inference(&m, dir) : fx_model_load(&m, dir));
    if (m)
        FXT_OK(fx__model_set_batch(m, B, T));
    return m;
}

/* Each fixture (F32 tied, BF16, F16, F32 with q/k/v biases) mapped: the forward over the file's
   dtype gives the float32 model's logits (fx_model_load's, the same values widened), B = 0
   adapters give the mapped base's logits bitwise, dA and dB match central differences, and
   20 steps on one batch lower the loss while the mapped bytes stay as they were. */
static void test_mapped(void)
{
    for (int f = 0; f < 4; f++) {
        fx__model *m = load_mapped(fixtures[f], true), *full = load_mapped(fixtures[f], false);
        if (!m || !full)
            return;
        FXT_CHECK(fx__model_on_map(m) && !m->grads);
        const int64_t V = m->c.vocab, NV = B * T * V;
        int32_t tok[B * T], tgt[B * T];
        batch(V, 40 + f, tok, tgt);
        float *base = logits_of(m, tok), *ref32 = logits_of(full, tok);
        double *ref = fxt_alloc_f64((size_t)NV);
        for (int64_t i = 0; i < NV; i++)
            ref[i] = ref32[i];
        char what[96];
        snprintf(what, sizeof what, "%s mapped vs float32 logits", fixtures[f]);
        fxt_close_f32(what, base, ref, (size_t)NV, 1e-4, 1e-4);
        /* B = 0 */
        fx__lora *a = adapters(m, FX__LORA_ALL, 4, 0.0f, 50 + f);
        FXT_OK(fx__model_set_lora(m, a));
        float *with = logits_of(m, tok);
        snprintf(what, sizeof what, "%s mapped B = 0", fixtures[f]);
        fxt_bitwise_f32(what, base, with, (size_t)NV);
        /* dA, dB */
        randomize_b(a, 60 + f);
        float loss;
        fx__model_zero_grad(m);
        FXT_OK(fx__model_forward(m, tok, tgt, &loss, true));
        FXT_OK(fx__model_backward(m));
        const float eps = 1e-2f;
        for (size_t ti = 0; ti < a->n; ti += 3) {
            const fx__lora_tensor *t = &a->t[ti];
            size_t best = 0;
            for (size_t j = 1; j < t->numel; j++)
                if (fabsf(a->grads[t->offset + j]) > fabsf(a->grads[t->offset + best]))
                    best = j;
            const size_t i = t->offset + best;
            float keep = a->params[i], lp, lm;
            a->params[i] = keep + eps;
            FXT_OK(fx__model_forward(m, tok, tgt, &lp, false));
            a->params[i] = keep - eps;
            FXT_OK(fx__model_forward(m, tok, tgt, &lm, false));
            a->params[i] = keep;
            const double fd = ((double)lp - lm) / (2.0 * eps), got = a->grads[i];
            FXT_CHECK(got != 0.0);
            if (fabs(got - fd) > 2e-3 + 3e-2 * fabs(fd))
                FXT_FAIL("%s %s: grad %.6g vs finite difference %.6g", fixtures[f], t->name, got, fd);
        }
        /* Training: the mapped bytes of a matrix stay, the loss falls. */
        const fx__model_weight w1 = m->mapped->t[2];
        const size_t bytes = (size_t)m->lay.t[2].numel * fx_dtype_size(w1.dtype);
        void *copy = malloc(bytes);
        memcpy(copy, w1.data, bytes);
        float first, last;
        steps(m, tok, tgt, 20, &first, &last);
        FXT_CHECK(!memcmp(copy, w1.data, bytes));
        FXT_CHECK(last < 0.8f * first);
        printf("  %s mapped: loss %.4f -> %.4f over 20 steps\n", fixtures[f], (double)first, (double)last);
        free(copy), free(base), free(ref32), free(ref), free(with);
        fx__model_free(m), fx__model_free(full);
    }
}

/* 1 and 2 threads over a mapped BF16 base: the same adapters after 3 steps with dropout. */
static void test_mapped_threads(void)
{
    const int before = fx_get_num_threads();
    float *got[2];
    size_t n = 0;
    for (int k = 0; k < 2; k++) {
        FXT_OK(fx_set_num_threads(k + 1));
        fx__model *m = load_mapped("llama_bf16", true);
        if (!m)
            return;
        FXT_OK(fx__model_set_lora(m, adapters(m, FX__LORA_ALL, 4, 0.1f, 70)));
        int32_t tok[B * T], tgt[B * T];
        batch(m->c.vocab, 71, tok, tgt);
        float first, last;
        steps(m, tok, tgt, 3, &first, &last);
        n = m->lora->total;
        got[k] = malloc(n * sizeof(float));
        memcpy(got[k], m->lora->params, n * sizeof(float));
        fx__model_free(m);
    }
    FXT_OK(fx_set_num_threads(before));
    fxt_bitwise_f32("mapped adapters at 1 and 2 threads", got[0], got[1], n);
    free(got[0]), free(got[1]);
}

/* bfloat16 products over a mapped BF16 base (--dtype bf16): the adapters' gradients of a step,
   with and without dropout, bitwise the same at 1 and 2 threads, within 3% (L2) of the float32
   products' and not equal to them. */
static void test_mapped_bf16(void)
{
    const int before = fx_get_num_threads();
    for (int d = 0; d < 2; d++) {
        float *g[3] = {NULL, NULL, NULL}; /* bf16 at 1 and 2 threads, float32 */
        size_t n = 0;
        for (int k = 0; k < 3; k++) {
            FXT_OK(fx_set_num_threads(k == 0 ? 1 : 2));
            fx__model *m = load_mapped("llama_bf16", true);
            if (!m)
                return;
            fx__lora *a = adapters(m, FX__LORA_ALL, 4, d ? 0.1f : 0.0f, 90);
            randomize_b(a, 91);
            FXT_OK(fx__model_set_lora(m, a));
            FXT_OK(fx__model_set_bf16(m, k < 2));
            g[k] = grads_of(m, 92, &n);
            fx__model_free(m);
        }
        fxt_bitwise_f32(d ? "bf16 adapters' gradients with dropout, 1 and 2 threads"
                          : "bf16 adapters' gradients, 1 and 2 threads",
                        g[0], g[1], n);
        double diff = 0, norm = 0;
        for (size_t i = 0; i < n; i++)
            diff += ((double)g[1][i] - g[2][i]) * ((double)g[1][i] - g[2][i]), norm += (double)g[2][i] * g[2][i];
        const double rel = sqrt(diff / norm);
        printf("  bf16 against float32 products%s: gradients %.3g apart (L2, relative)\n", d ? " (dropout)" : "", rel);
        FXT_CHECK(rel > 0.0 && rel < 3e-2);
        free(g[0]), free(g[1]), free(g[2]);
    }
    FXT_OK(fx_set_num_threads(before));
}

/* Decoding sees the adapters too (the one layer): a prompt through the KV cache gives the
   forward's last logits, over a float32 and a mapped BF16 base with random B. */
static void test_decode(void)
{
    for (int k = 0; k < 2; k++) {
        fx__model *m = k ? load_mapped("llama_bf16", true) : model(8);
        if (!m)
            return;
        fx__lora *a = adapters(m, FX__LORA_ALL, 4, 0.0f, 80);
        randomize_b(a, 81);
        FXT_OK(fx__model_set_lora(m, a));
        const int64_t V = m->c.vocab;
        int32_t tok[B * T], tgt[B * T];
        batch(V, 82, tok, tgt);
        float *lg = logits_of(m, tok);
        fx__model_cache *kc = NULL;
        FXT_OK(fx__model_cache_create(&kc, m, T));
        float *dl = malloc((size_t)V * sizeof *dl);
        FXT_OK(fx__model_decode(m, kc, tok, T, dl));
        double *ref = fxt_alloc_f64((size_t)V);
        for (int64_t v = 0; v < V; v++)
            ref[v] = lg[(T - 1) * V + v];
        fxt_close_f32(k ? "decode, mapped BF16 + adapters" : "decode, float32 + adapters", dl, ref, (size_t)V, 1e-4,
                      1e-4);
        /* and the adapters are in it: the base alone decodes otherwise */
        double diff = 0;
        fx__model_cache_free(kc);
        kc = NULL;
        FXT_OK(fx__model_set_lora(m, NULL));
        FXT_OK(fx__model_cache_create(&kc, m, T));
        float *bl = malloc((size_t)V * sizeof *bl);
        FXT_OK(fx__model_decode(m, kc, tok, T, bl));
        for (int64_t v = 0; v < V; v++)
            diff = fmax(diff, fabs((double)bl[v] - dl[v]));
        FXT_CHECK(diff > 1e-3);
        fx__model_cache_free(kc);
        free(lg), free(dl), free(bl), free(ref);
        fx__model_free(m);
    }
}

/* The memory plan: the adapters' floats as the table lays them out; params the base and the
   adapters, grads and adam the adapters' alone, the activations full training's. */
static void test_mem_plan(void)
{
    fx_model_config c;
    fx__model_preset(&c, "small");
    fx__lora_config lc = fx__lora_defaults(8);
    lc.targets = 1u << FX__LORA_Q | 1u << FX__LORA_V;
    fx__lora *a = NULL;
    fx__model *m = NULL;
    FXT_OK(fx__model_create(&m, &c, 1));
    FXT_OK(fx__lora_create(&a, &m->c, &lc, 1));
    FXT_CHECK(fx__lora_floats(&m->c, &lc) == a->total);
    const uint64_t A = a->total, P = m->lay.total;
    fx__lora_free(a);
    fx__model_free(m);
    const fx__model_mem_opts o = {.B = 4, .T = 64};
    fx__model_mem full, lora;
    FXT_OK(fx__model_mem_train(&full, &c, &o));
    FXT_OK(fx__lora_mem_train(&lora, &c, &lc, &o, 0));
    FXT_CHECK(lora.params == (P + A) * sizeof(float));
    FXT_CHECK(lora.grads == (A + (uint64_t)c.dim) * sizeof(float));
    FXT_CHECK(lora.adam == 2 * A * sizeof(float));
    FXT_CHECK(lora.acts == full.acts && lora.scratch > full.scratch);
    FXT_CHECK(lora.total < full.total);
    FXT_OK(fx__lora_mem_train(&lora, &c, &lc, &o, 1000));
    FXT_CHECK(lora.params == 1000 + A * sizeof(float));
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    FXT_RUN(test_table);
    FXT_RUN(test_zero_b);
    FXT_RUN(test_merge);
    FXT_RUN(test_gradcheck);
    FXT_RUN(test_train);
    FXT_RUN(test_threads);
    FXT_RUN(test_dropout);
    FXT_RUN(test_train_step);
    FXT_RUN(test_mem_plan);
    FXT_RUN(test_mapped);
    FXT_RUN(test_mapped_threads);
    FXT_RUN(test_mapped_bf16);
    FXT_RUN(test_decode);
    return fxt_finish();
}
