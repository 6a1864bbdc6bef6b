/* The model's attention mods written as expressions (fx__model_set_mods, flexc train
   --score-mod / --mask-mod): decoding (prefill and one-token steps) agrees with the training
   forward, a mask mod equal to the built-in causal mask gives its bits, flex attention agrees
   with the reference for masks that read b and h, gradients are bitwise at 1 and 2 threads,
   and files record the mods (and refuse inconsistent metadata). */
#include "harness.h"

#include "model/model.h"
#include "model/model_internal.h"

#include <flexc/mod.h>

#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];

/* GQA (4 query heads on 2 KV heads), 2 layers, a context of ctx. */
static fx_model_config cfg_of(int64_t ctx)
{
    fx_model_config c;
    fx__model_preset(&c, "tiny");
    c.layers = 2, c.dim = 16, c.heads = 4, c.kv_heads = 2, c.ffn = 24, c.ctx = ctx;
    return c;
}

/* A model with its matrices 5x the init, so that attention shapes the logits well above the
   tolerances. */
static fx__model *model_of(const fx_model_config *c, const char *score, const char *mask)
{
    fx__model *m = NULL;
    FXT_OK(fx__model_create(&m, c, 5));
    if (!m)
        return NULL;
    for (size_t ti = 0; ti < m->lay.n; ti++)
        for (size_t j = 0; j < m->lay.t[ti].numel && m->lay.t[ti].ndim == 2; j++)
            m->params[m->lay.t[ti].offset + j] *= 5.0f;
    FXT_OK(fx__model_set_mods(m, score, mask));
    return m;
}

static void tokens_of(int32_t *tok, int64_t n, int64_t V, uint64_t seed)
{
    fx_rng r;
    fx_rng_init(&r, seed, 0);
    for (int64_t i = 0; i < n; i++)
        tok[i] = (int32_t)(fx_rng_u32(&r) % (uint32_t)(V - 1));
}

static void test_src_reads(void)
{
    FXT_CHECK(fx__mod_src_reads("score - 0.5 * h", 'h'));
    FXT_CHECK(!fx__mod_src_reads("score - 0.5 * h", 'b'));
    FXT_CHECK(fx__mod_src_reads("where(b == 0, score, 1e-5 * score)", 'b'));
    FXT_CHECK(!fx__mod_src_reads("1e-5*score + 2E+3 + kv_idx", 'b'));
    FXT_CHECK(!fx__mod_src_reads("bh + hb", 'h'));
    FXT_CHECK(fx__mod_src_reads("(h)", 'h'));
    FXT_CHECK(!fx__mod_src_reads(NULL, 'h'));
}

/* The logits of fx__model_forward at every position against a prefill of 5 tokens followed by
   one-token decoding steps, whose logits are those of the last position fed. */
static void decode_agrees(const char *score, const char *mask)
{
    fx_model_config c = cfg_of(16);
    fx__model *m = model_of(&c, score, mask), *plain = model_of(&c, NULL, NULL);
    if (!m || !plain)
        return;
    const int64_t T = 16, V = c.vocab;
    int32_t tok[16];
    tokens_of(tok, T, V, 21);
    float *full = fxt_guarded((size_t)(T * V)), *base = fxt_guarded((size_t)(T * V));
    float *logits = fxt_guarded((size_t)V);
    FXT_OK(fx__model_set_batch(m, 1, T));
    FXT_OK(fx__model_forward(m, tok, NULL, NULL, false));
    fx__model_logits(m, full, false);
    /* The mods change the model's output (else agreement would say nothing). */
    FXT_OK(fx__model_set_batch(plain, 1, T));
    FXT_OK(fx__model_forward(plain, tok, NULL, NULL, false));
    fx__model_logits(plain, base, false);
    double diff = 0.0;
    for (int64_t i = 0; i < T * V; i++)
        diff = fmax(diff, fabs((double)full[i] - base[i]));
    FXT_CHECK(diff > 1e-2);
    fx__model_cache *kc = NULL;
    FXT_OK(fx__model_cache_create(&kc, m, 0));
    double *ref = fxt_alloc_f64((size_t)V);
    for (int64_t t = 0; kc && t < T;) {
        int64_t n = t == 0 ? 5 : 1;
        FXT_OK(fx__model_decode(m, kc, tok + t, n, logits));
        t += n;
        for (int64_t v = 0; v < V; v++)
            ref[v] = full[(t - 1) * V + v];
        char what[160];
        snprintf(what, sizeof what, "score mod %s, mask mod %s: logits at %lld", score ? score : "-",
                 mask ? mask : "-", (long long)(t - 1));
        fxt_close_f32(what, logits, ref, (size_t)V, 1e-4, 1e-4);
    }
    free(ref);
    fxt_guarded_free("logits", logits);
    fxt_guarded_free("full", full);
    fxt_guarded_free("base", base);
    fx__model_cache_free(kc);
    fx__model_free(m);
    fx__model_free(plain);
}

static void test_decode_agrees(void)
{
    decode_agrees("30 * tanh(score / 30)", "q_idx >= kv_idx && q_idx - kv_idx < 6");
    decode_agrees("score - 0.5 * (q_idx - kv_idx)", NULL);
    /* Prefix-LM: the first 4 positions see each other both ways. */
    decode_agrees(NULL, "kv_idx < 4 || kv_idx <= q_idx");
    /* Reading h: every head in one call over the gathered cache. */
    decode_agrees("score - 0.25 * (h + 1) * (q_idx - kv_idx)", "kv_idx < 4 || kv_idx <= q_idx");
    decode_agrees(NULL, "q_idx >= kv_idx && (h % 2 == 0 || q_idx - kv_idx < 3)");
}

/* --mask-mod "q_idx >= kv_idx" is the built-in causal mask bit for bit: loss and gradients,
   over several blocks (T = 256 in blocks of 128) and two sequences. */
static void test_causal_mod_bitwise(void)
{
    fx_model_config c = cfg_of(256);
    fx__model *a = model_of(&c, NULL, NULL), *b = model_of(&c, NULL, "q_idx >= kv_idx");
    if (!a || !b)
        return;
    const int64_t B = 2, T = 256;
    int32_t *tok = malloc((size_t)(B * T) * sizeof *tok), *tgt = malloc((size_t)(B * T) * sizeof *tgt);
    tokens_of(tok, B * T, c.vocab, 3);
    tokens_of(tgt, B * T, c.vocab, 4);
    fx__model *ms[2] = {a, b};
    float loss[2] = {0};
    for (int i = 0; i < 2; i++) {
        FXT_OK(fx__model_alloc_grads(ms[i]));
        FXT_OK(fx__model_set_batch(ms[i], B, T));
        FXT_OK(fx__model_forward(ms[i], tok, tgt, &loss[i], true));
        FXT_OK(fx__model_backward(ms[i]));
    }
    FXT_CHECK(memcmp(&loss[0], &loss[1], sizeof(float)) == 0);
    fxt_bitwise_f32("gradients, causal vs its mask mod", a->grads, b->grads, a->lay.total);
    free(tok), free(tgt);
    fx__model_free(a), fx__model_free(b);
}

/* Masks that read b and h: the block mask is built per batch row and head, and flex attention
   gives the reference's loss (which evaluates the mask at every element). */
static void test_mask_b_h_reference(void)
{
    fx_model_config c = cfg_of(32);
    const char *mask = "kv_idx <= q_idx && (b == 0 || h % 2 == 1 || q_idx - kv_idx < 3)";
    fx__model *f = model_of(&c, NULL, mask), *r = model_of(&c, NULL, mask);
    if (!f || !r)
        return;
    FXT_CHECK(f->mods_b && f->mods_h);
    r->attn_impl = FX__MODEL_ATTN_REF;
    const int64_t B = 2, T = 32;
    int32_t tok[64], tgt[64];
    tokens_of(tok, B * T, c.vocab, 7);
    tokens_of(tgt, B * T, c.vocab, 8);
    float lf, lr;
    FXT_OK(fx__model_set_batch(f, B, T));
    FXT_OK(fx__model_set_batch(r, B, T));
    FXT_OK(fx__model_forward(f, tok, tgt, &lf, false));
    FXT_OK(fx__model_forward(r, tok, tgt, &lr, false));
    FXT_NEAR(lf, lr, 1e-5, 1e-5);
    /* The reference takes no score mod. */
    FXT_OK(fx__model_set_mods(r, "score * 2", NULL));
    FXT_STATUS(fx__model_forward(r, tok, tgt, &lr, false), FX_EUNSUPPORTED, "score mod");
    fx__model_free(f), fx__model_free(r);
}

/* Gradients with a score mod and a mask mod: bitwise at 1 and 2 threads. */
static void test_threads_bitwise(void)
{
    fx_model_config c = cfg_of(160);
    const int64_t B = 2, T = 160;
    int32_t *tok = malloc((size_t)(B * T) * sizeof *tok), *tgt = malloc((size_t)(B * T) * sizeof *tgt);
    tokens_of(tok, B * T, c.vocab, 11);
    tokens_of(tgt, B * T, c.vocab, 12);
    fx__model *ms[2] = {NULL, NULL};
    const int was = fx_get_num_threads();
    for (int i = 0; i < 2; i++) {
        fx_set_num_threads(i + 1);
        ms[i] = model_of(&c, "30 * tanh(score / 30) - 0.1 * (h + 1) * (q_idx - kv_idx)",
                         "q_idx >= kv_idx && q_idx - kv_idx < 100");
        if (!ms[i])
            break;
        float l;
        FXT_OK(fx__model_alloc_grads(ms[i]));
        FXT_OK(fx__model_set_batch(ms[i], B, T));
        FXT_OK(fx__model_forward(ms[i], tok, tgt, &l, true));
        FXT_OK(fx__model_backward(ms[i]));
    }
    fx_set_num_threads(was);
    if (ms[0] && ms[1])
        fxt_bitwise_f32("gradients at 1 and 2 threads", ms[0]->grads, ms[1]->grads, ms[0]->lay.total);
    free(tok), free(tgt);
    fx__model_free(ms[0]), fx__model_free(ms[1]);
}

/* Overwrites the first `from` in the file's header with `to` (the same length). */
static void patch_header(const char *path, const char *from, const char *to)
{
    FILE *f = fopen(path, "r+b");
    FXT_CHECK(f != NULL);
    if (!f)
        return;
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    char *at = NULL;
    for (size_t i = 8; i + strlen(from) <= n && !at; i++)
        if (!memcmp(buf + i, from, strlen(from)))
            at = buf + i;
    FXT_CHECK(at != NULL && strlen(from) == strlen(to));
    if (at) {
        fseek(f, (long)(at - buf), SEEK_SET);
        fwrite(to, 1, strlen(to), f);
    }
    fclose(f);
}

static void test_files(void)
{
    fx_model_config c = cfg_of(16);
    char path[128];
    snprintf(path, sizeof path, "%s/mods.safetensors", tmpdir);
    /* A score mod over the built-in mask: attn "mod:NAME", the mask kept. */
    fx__model *m = model_of(&c, "score - 0.5 * (q_idx - kv_idx)", NULL);
    if (!m)
        return;
    FXT_OK(fx__model_mask_parse("sliding:6", &m->mask, &m->window));
    FXT_OK(fx__model_save_model(m, path, false));
    fx__model_train_state st;
    fx_model_config rc;
    FXT_OK(fx__model_read_config(path, &rc, &st, NULL));
    FXT_EQ_STR(st.attn, "sliding:6");
    FXT_EQ_STR(st.score_mod, "score - 0.5 * (q_idx - kv_idx)");
    FXT_EQ_STR(st.mask_mod, "");
    fx_model *l = NULL;
    FXT_OK(fx_model_load(&l, path));
    if (l) {
        FXT_CHECK(l->score_src && !strcmp(l->score_src, "score - 0.5 * (q_idx - kv_idx)"));
        FXT_CHECK(!l->mask_mod && l->mask == FX__MODEL_MASK_SLIDING && l->window == 6);
        fx_model_free(l);
    }
    patch_header(path, "mod:sliding:6", "xyz:sliding:6");
    FXT_STATUS(fx__model_read_config(path, &rc, &st, NULL), FX_EFORMAT, "not a known mask");
    /* A mask mod: attn "mod"; loading gives the model both mods. */
    FXT_OK(fx__model_set_mods(m, "score * 0.5", "kv_idx < 3 || kv_idx <= q_idx"));
    FXT_OK(fx__model_save_model(m, path, false));
    FXT_OK(fx__model_read_config(path, &rc, &st, NULL));
    FXT_EQ_STR(st.attn, "mod");
    FXT_EQ_STR(st.mask_mod, "kv_idx < 3 || kv_idx <= q_idx");
    FXT_EQ_STR(st.score_mod, "score * 0.5");
    fx__model *back = NULL;
    FXT_OK(fx__model_create(&back, &c, 9));
    if (back) {
        FXT_OK(fx__model_load(back, path, false));
        FXT_CHECK(back->mask_src && !strcmp(back->mask_src, "kv_idx < 3 || kv_idx <= q_idx"));
        FXT_CHECK(back->score_src && !strcmp(back->score_src, "score * 0.5"));
        FXT_CHECK(!memcmp(back->params, m->params, m->lay.total * sizeof(float)));
        fx__model_free(back);
    }
    /* attn "mod" without its expression; an expression of the wrong kind. */
    patch_header(path, "\"mask_mod\"", "\"mask_xxx\"");
    FXT_STATUS(fx__model_read_config(path, &rc, &st, NULL), FX_EFORMAT, "without mask_mod");
    FXT_OK(fx__model_save_model(m, path, false));
    patch_header(path, "score * 0.5", "score < 0.5");
    FXT_STATUS(fx__model_read_config(path, &rc, &st, NULL), FX_EFORMAT, "score_mod");
    /* Without mods the metadata is as before: attn alone. */
    FXT_OK(fx__model_set_mods(m, NULL, NULL));
    FXT_OK(fx__model_save_model(m, path, false));
    FXT_OK(fx__model_read_config(path, &rc, &st, NULL));
    FXT_EQ_STR(st.attn, "sliding:6");
    FXT_EQ_STR(st.score_mod, "");
    fx__model_free(m);
    /* Kinds and errors. */
    fx_mod *md = NULL;
    FXT_STATUS(fx__model_mod_compile(&md, "q_idx >= kv_idx", false), FX_EINVAL, "is a mask");
    FXT_STATUS(fx__model_mod_compile(&md, "score * 2", true), FX_EINVAL, "not a mask");
    FXT_STATUS(fx__model_mod_compile(&md, "score * (2", false), FX_EINVAL, "expr:");
    FXT_CHECK(md == NULL);
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/fx_test_model_mods.%d", (int)getpid());
    if (mkdir(tmpdir, 0700) != 0) {
        fprintf(stderr, "cannot create %s\n", tmpdir);
        return 2;
    }
    FXT_RUN(test_src_reads);
    FXT_RUN(test_decode_agrees);
    FXT_RUN(test_causal_mod_bitwise);
    FXT_RUN(test_mask_b_h_reference);
    FXT_RUN(test_threads_bitwise);
    FXT_RUN(test_files);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return fxt_finish();
}
