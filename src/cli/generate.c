/* flexc generate: samples text from a model (flexc/model.h) with a KV cache (the decoding
   path of fx_flex_attention) and streams it to stdout. Deterministic for a given --seed. */
#include "cli.h"

#include "gen_text.h"

#include "cuda/model_gpu.h"
#include "model/model.h" /* fx__utf8_invalid_at, FX__MODEL_EOT, FX__MODEL_VOCAB: the byte tokenizer */
#include "hf/hf.h"   /* fx__hf_config_read: the bos id */
#include "model/lora.h" /* a PEFT adapter: its base holds the tokenizer */
#include "tokenizer/chat.h"
#include "prompt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int generate_run(const char *ckpt, const char *model, const char *prompt, size_t plen, int64_t ntok,
                        double temp, int64_t top_k, double top_p, int64_t seed, bool json, bool cuda, bool chat);
static int generate_bos(int64_t *bos, const char *src);

int cmd_generate(int argc, char **argv)
{
    const char *ckpt = NULL, *model = NULL, *prompt_arg = NULL, *prompt_file = NULL, *device = NULL;
    int64_t ntok = 256, top_k = 40, seed = 1, threads = 0;
    double temp = 0.8, top_p = 1.0;
    bool json = false, no_memory_check = false, chat = false;
    const cli_opt opts[] = {
        {"--ckpt", CLI_STRING, &ckpt, "a training --out DIR, a .safetensors file, or a Hugging Face DIR"},
        {"--model", CLI_STRING, &model, "a preset (random weights) or a directory, as --ckpt"},
        {"--prompt", CLI_STRING, &prompt_arg, "text to continue (UTF-8; - reads standard input; default: a new document)"},
        {"--prompt-file", CLI_STRING, &prompt_file, "read the prompt from this file"},
        {"--tokens", CLI_INT, &ntok, "tokens to generate (default 256)"},
        {"--temperature", CLI_FLOAT, &temp, "sampling temperature, 0 = greedy (default 0.8)"},
        {"--top-k", CLI_INT, &top_k, "sample among the k most likely tokens, 0 = all (default 40)"},
        {"--top-p", CLI_FLOAT, &top_p, "then among the most likely tokens whose probability reaches p (default 1)"},
        {"--seed", CLI_INT, &seed, "sampling seed (default 1)"},
        {"--threads", CLI_INT, &threads, "threads (default: all cores)"},
        {"--device", CLI_STRING, &device, "cpu | cuda: where the model runs (default cpu; docs/cuda.md)"},
        {"--chat", CLI_FLAG, &chat, "the prompt is a user's turn, rendered with the model's chat template; stops at its end of turn"},
        {"--json", CLI_FLAG, &json, "print one line {\"prompt_ids\", \"ids\", \"text\"} instead of streaming"},
        {"--no-memory-check", CLI_FLAG, &no_memory_check, "generate even when the KV cache does not fit in memory"},
    };
    int rc = cli_parse("generate", "--ckpt DIR|FILE [options]", argc, argv, opts, sizeof opts / sizeof opts[0],
                       NULL, 0, NULL);
    if (rc == CLI_PARSE_HELP)
        return CLI_EXIT_OK;
    if (rc != CLI_PARSE_OK)
        return rc;
    if (!ckpt && !model) {
        cli_error("generate: --ckpt DIR|FILE is required (the --out directory of flexc train), or --model NAME|DIR");
        return CLI_EXIT_USAGE;
    }
    if (ckpt && model) {
        cli_error("generate: --ckpt and --model name the model twice; pass one");
        return CLI_EXIT_USAGE;
    }
    if (ntok < 0 || ntok > 10000000) {
        cli_error("generate: --tokens %lld is outside [0, 10000000]", (long long)ntok);
        return CLI_EXIT_USAGE;
    }
    if (top_k < 0) {
        cli_error("generate: --top-k %lld must be >= 0 (0: all tokens)", (long long)top_k);
        return CLI_EXIT_USAGE;
    }
    if (!(temp >= 0)) {
        cli_error("generate: --temperature %g must be >= 0 (0: greedy)", temp);
        return CLI_EXIT_USAGE;
    }
    if (!(top_p > 0 && top_p <= 1)) {
        cli_error("generate: --top-p %g is outside (0, 1]", top_p);
        return CLI_EXIT_USAGE;
    }
    if ((rc = cli_threads("generate", threads)) != CLI_EXIT_OK)
        return rc;
    if (no_memory_check)
        fx__mem_set_check(false);
    bool cuda;
    if ((rc = cli_device(device, &cuda)) != CLI_EXIT_OK)
        return rc;
    char *prompt = NULL;
    size_t plen = 0;
    if ((rc = cli_read_prompt(prompt_arg, prompt_file, &prompt, &plen)) != CLI_EXIT_OK)
        return rc;
    int64_t bad = fx__utf8_invalid_at((const unsigned char *)prompt, plen);
    if (bad >= 0)
        cli_error("%s is not valid UTF-8: byte 0x%02x at offset %lld", prompt_file ? "--prompt-file" : "--prompt",
                  (unsigned char)prompt[bad], (long long)bad);
    else
        rc = generate_run(ckpt, model, prompt, plen, ntok, temp, top_k, top_p, seed, json, cuda, chat);
    free(prompt);
    return bad >= 0 ? CLI_EXIT_USAGE : rc;
}

/* --chat: the prompt as one user turn with the template's generation prompt, as ids (replacing
   ids), and *eot the id the template ends an assistant's turn with (-1: none found; the
   model's eos ids stop it too). The template is the one beside the tokenizer (dir, or a
   training run's dir/hf). */
static int chat_prompt(const gen_text *g, const char *dir, const char *prompt, size_t plen, fx_ids *ids,
                       int32_t *eot)
{
    *eot = -1;
    if (!g->tok) {
        cli_error("generate: --chat needs a model with a tokenizer and a chat template");
        return CLI_EXIT_USAGE;
    }
    char tdir[4200], probe[4300];
    snprintf(tdir, sizeof tdir, "%s/hf", dir);
    snprintf(probe, sizeof probe, "%s/tokenizer.json", tdir);
    struct stat st;
    if (stat(probe, &st) != 0)
        snprintf(tdir, sizeof tdir, "%s", dir);
    fx__chat *chat = NULL;
    int rc = fx__chat_load(&chat, tdir, g->tok);
    if (rc != FX_OK)
        return cli_fail(rc, "--chat");
    char *user = malloc(plen + 1), *text = NULL, *probe_text = NULL;
    size_t len = 0, probe_len = 0;
    if (!user) {
        fx__chat_free(chat);
        return cli_fail(FX_ENOMEM, "--chat");
    }
    memcpy(user, prompt, plen);
    user[plen] = '\0';
    const fx__chat_msg turn = {.role = "user", .content = user};
    /* The end of an assistant's turn: what the template writes after a reply's text. */
    const fx__chat_msg both[2] = {turn, {.role = "assistant", .content = "\x01"}};
    fx_ids tail = {0};
    if ((rc = fx__chat_render(chat, &turn, 1, true, &text, &len)) == FX_OK)
        rc = fx__chat_render(chat, both, 2, false, &probe_text, &probe_len);
    if (rc == FX_OK) {
        ids->n = 0;
        rc = fx_tokenizer_encode(g->tok, ids, text, len);
    }
    const char *mark = rc == FX_OK ? memchr(probe_text, 1, probe_len) : NULL;
    if (mark && (rc = fx_tokenizer_encode(g->tok, &tail, mark + 1, probe_len - (size_t)(mark + 1 - probe_text))) == FX_OK &&
        tail.n > 0)
        *eot = tail.ids[0];
    fx_ids_free(&tail);
    free(text), free(probe_text), free(user);
    fx__chat_free(chat);
    return rc == FX_OK ? CLI_EXIT_OK : cli_fail(rc, "--chat");
}

static int generate_run(const char *ckpt, const char *model, const char *prompt, size_t plen, int64_t ntok,
                        double temp, int64_t top_k, double top_p, int64_t seed, bool json, bool cuda, bool chat)
{
    int rc;
    fx_model *m = NULL;
    if (ckpt) {
        if ((rc = fx_model_load(&m, ckpt)) != FX_OK)
            return cli_fail(rc, "--ckpt");
    } else {
        fx_model_config pc;
        if ((rc = cli_model_open_for("--model", model, &pc, &m, true)) != CLI_EXIT_OK)
            return rc;
        if (!m && (rc = fx_model_create(&m, &pc, (uint64_t)seed)) != FX_OK)
            return cli_fail(rc, "--model");
    }
    /* On a GPU: the weights in float32 (a mapped file is read whole first), sent over once. */
    if (cuda && ((rc = fx__model_own_params(m)) != FX_OK || (rc = fx__model_gpu_attach(m, 1, false)) != FX_OK)) {
        fx_model_free(m);
        return cli_fail(rc, "--device cuda");
    }
    const fx_model_config *cfg = fx_model_get_config(m);
    fx_model_cache *kc = NULL;
    float *logits = NULL;
    void *scratch = NULL;
    int32_t *hist = NULL;
    int exit_code = CLI_EXIT_FAIL;
    gen_text g;
    fx_ids pids = {0};
    /* The tokenizer and config beside the model; a PEFT adapter's are its base's. */
    const char *dir = ckpt ? ckpt : model;
    fx__lora_source lsrc;
    bool lora = false;
    if (ckpt && fx__lora_source_find(ckpt, &lsrc, &lora) == FX_OK && lora && lsrc.peft)
        dir = lsrc.base;
    if ((rc = gen_text_open(&g, dir, cfg)) != CLI_EXIT_OK) {
        exit_code = rc;
        goto done;
    }
    /* The prompt's ids (no special tokens added). A byte-vocabulary model starts a document
       with end-of-text; a tokenizer's model starts from the prompt (or from bos when it is
       empty). */
    int32_t eot = -1;
    if ((rc = chat ? chat_prompt(&g, dir, prompt, plen, &pids, &eot) : gen_text_encode(&g, &pids, prompt, plen)) !=
        CLI_EXIT_OK) {
        exit_code = rc;
        goto done;
    }
    /* The cache holds the context in use: the whole context, or less when the prompt and the
       tokens asked for fit in less (a long-context model needs no cache of its full length). */
    int64_t V = cfg->vocab, ctx = cfg->ctx;
    int64_t want = pids.n + 1 + ntok, cap = want < ctx ? want : ctx;
    if ((rc = fx_model_cache_create(&kc, m, cap)) != FX_OK) {
        if (rc == FX_ENOMEM)
            cli_error("KV cache: %s: lower --tokens (%lld) or shorten the prompt (%lld tokens); --no-memory-check "
                      "generates anyway",
                      fx_last_error(), (long long)ntok, (long long)pids.n);
        else
            cli_fail(rc, "KV cache");
        goto done;
    }
    logits = malloc((size_t)V * sizeof *logits);
    scratch = malloc(fx_sample_scratch_bytes(V));
    hist = malloc((size_t)cap * sizeof *hist);
    if (!logits || !scratch || !hist) {
        cli_error("out of memory");
        goto done;
    }
    /* The context: the prompt's ids, preceded by end-of-text for a byte model (a document
       starts). A prompt that leaves no room for the tokens asked for keeps its end, at most
       half the context. */
    int64_t n = 0, keep = pids.n + 1 + ntok > ctx && pids.n > ctx / 2 ? ctx / 2 : pids.n;
    if (!g.tok && n + keep < cap && keep == pids.n)
        hist[n++] = FX__MODEL_EOT;
    for (int64_t i = pids.n - keep; i < pids.n; i++)
        hist[n++] = pids.ids[i];
    if (n == 0 && pids.n > 0) {
        cli_error("generate: the model's context (%lld tokens) is too small for the prompt (%lld tokens)",
                  (long long)ctx, (long long)pids.n);
        goto done;
    }
    if (n == 0) {
        /* An empty prompt starts from bos, as transformers' generate does. */
        int64_t bos;
        if ((rc = generate_bos(&bos, dir)) != CLI_EXIT_OK) {
            exit_code = rc;
            goto done;
        }
        if (bos < 0) {
            cli_error("generate: the prompt is empty and the model's config has no bos_token_id to start from: "
                      "give a --prompt");
            goto done;
        }
        hist[n++] = (int32_t)bos;
    }
    if (!json && !chat) { /* a chat prints the reply only */
        fwrite(prompt, 1, plen, stdout);
        fflush(stdout);
    }

    fx_rng rng;
    fx_rng_init(&rng, (uint64_t)seed, 2);
    fx_sample_opts so = {.temperature = (float)temp, .top_k = top_k, .top_p = (float)top_p};
    bool fed = false; /* hist[0 .. n-1] is in the cache */
    for (int64_t t = 0; t < ntok; t++) {
        rc = fed ? fx_model_decode_step(m, kc, logits, hist[n - 1]) : fx_model_prefill(m, kc, logits, hist, n);
        if (rc != FX_OK) {
            cli_fail(rc, "decoding");
            goto done;
        }
        fed = true;
        int32_t next;
        if ((rc = fx_sample(&next, logits, V, &so, &rng, scratch)) != FX_OK) {
            cli_fail(rc, "sampling");
            goto done;
        }
        bool eos = next == eot;
        for (int i = 0; i < cfg->n_eos; i++)
            eos |= next == cfg->eos[i];
        /* --json lists the eos id that ended the text; the stream does not print it. */
        if ((!eos || json) && (rc = gen_text_emit(&g, next, !json)) != CLI_EXIT_OK)
            goto done;
        if (eos)
            break;
        if (n == cap) {
            /* The context is full: keep its second half and start the cache over. */
            int64_t half = cap / 2;
            memmove(hist, hist + cap - half, (size_t)half * sizeof *hist);
            n = half;
            fed = false;
        }
        hist[n++] = next;
    }
    if ((rc = gen_text_finish(&g, !json)) != CLI_EXIT_OK)
        goto done;
    if (json) {
        fputs("{\"prompt_ids\": [", stdout);
        for (int64_t i = 0; i < pids.n; i++)
            printf("%s%d", i ? ", " : "", pids.ids[i]);
        fputs("], \"ids\": [", stdout);
        for (int64_t i = 0; i < g.out.n; i++)
            printf("%s%d", i ? ", " : "", g.out.ids[i]);
        fputs("], \"text\": ", stdout);
        gen_json_string(stdout, g.text.data ? g.text.data : "", g.text.len);
        fputs("}\n", stdout);
    } else {
        fputc('\n', stdout);
    }
    fflush(stdout);
    exit_code = CLI_EXIT_OK;
done:
    gen_text_close(&g);
    fx_ids_free(&pids);
    free(logits), free(scratch), free(hist);
    fx_model_cache_free(kc);
    fx_model_free(m);
    return exit_code;
}

/* The bos id of the Hugging Face model in src (a directory, or a training directory fine-tuned
   from one: hf/), -1 when its config has none. */
static int generate_bos(int64_t *bos, const char *src)
{
    *bos = -1;
    char path[4200];
    const char *dirs[] = {"%s", "%s/hf"};
    for (int i = 0; src && i < 2; i++) {
        char dir[4100];
        snprintf(dir, sizeof dir, dirs[i], src);
        snprintf(path, sizeof path, "%s/config.json", dir);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        fx__hf_config hc;
        int rc = fx__hf_config_read(&hc, dir);
        if (rc != FX_OK)
            return cli_fail(rc, path);
        *bos = hc.bos;
        return CLI_EXIT_OK;
    }
    return CLI_EXIT_OK;
}
