/* flexc bench generate: prefill and decode tokens/s and peak memory of a model with the KV
   cache (bench/generate_vs_transformers.py runs it against transformers). */
#include "cli/cli.h"

#include "util.h"

#include <stdlib.h>
#include <string.h>

typedef struct gen_args {
    const char *model;
    int64_t plen, ntok, reps;
    bool json;
} gen_args;

/* a from the command line: CLI_PARSE_OK, CLI_PARSE_HELP (usage printed) or the exit status
   of an error (printed); the thread count is set. */
static int gen_args_parse(int argc, char **argv, gen_args *a)
{
    int64_t threads = 0;
    *a = (gen_args){.model = "small", .plen = 128, .ntok = 64, .reps = 3};
    const cli_opt opts[] = {
        {"--model", CLI_STRING, &a->model, "a preset (random weights) or a directory (default small)"},
        {"--prompt-len", CLI_INT, &a->plen, "prompt tokens prefilled (default 128)"},
        {"--tokens", CLI_INT, &a->ntok, "tokens generated: one from the prefill, the rest decode steps (default 64)"},
        {"--reps", CLI_INT, &a->reps, "runs; medians are reported (default 3)"},
        {"--threads", CLI_INT, &threads, "threads (default: all cores)"},
        {"--json", CLI_FLAG, &a->json, "one JSON object instead of text"},
    };
    int rc = cli_parse("bench generate", "[options]", argc, argv, opts, sizeof opts / sizeof opts[0], NULL, 0, NULL);
    if (rc != CLI_PARSE_OK)
        return rc;
    if (a->plen < 1 || a->plen > 1000000 || a->ntok < 2 || a->ntok > 1000000 || a->reps < 1 || a->reps > 64) {
        cli_error("bench generate: --prompt-len %lld, --tokens %lld or --reps %lld is outside [1, 1000000], "
                  "[2, 1000000], [1, 64]", (long long)a->plen, (long long)a->ntok, (long long)a->reps);
        return CLI_EXIT_USAGE;
    }
    return cli_threads("bench generate", threads);
}

/* The model of a->model (a preset gets random weights) in *m, with room in its context for
   the prompt and the tokens. CLI_EXIT_OK, or the exit status with the error printed. */
static int gen_model_open(const gen_args *a, fx_model_config *cfg, fx_model **m)
{
    int rc;
    *m = NULL;
    if ((rc = cli_model_open_for("--model", a->model, cfg, m, true)) != CLI_EXIT_OK)
        return rc;
    if (!*m && (rc = fx_model_create(m, cfg, 1)) != FX_OK)
        return cli_fail(rc, "--model");
    if (a->plen + a->ntok > cfg->ctx) {
        cli_error("bench generate: --prompt-len + --tokens = %lld is more than the model's context %lld",
                  (long long)(a->plen + a->ntok), (long long)cfg->ctx);
        fx_model_free(*m);
        *m = NULL;
        return CLI_EXIT_USAGE;
    }
    return CLI_EXIT_OK;
}

/* One run's buffers, and the tokens/s of each run. */
typedef struct gen_run {
    fx_model_cache *c;
    int32_t *prompt;
    float *logits;
    double *pre, *dec;
} gen_run;

/* Times a->reps prefills of a fixed prompt, each followed by greedy decoding, into r->pre and
   r->dec. CLI_EXIT_OK, or CLI_EXIT_FAIL with the error printed. */
static int gen_time(const gen_args *a, fx_model *m, int64_t V, gen_run *r)
{
    int rc;
    /* A fixed pseudo-random prompt: the speed does not depend on the text. */
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < a->plen; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        r->prompt[i] = (int32_t)((s >> 33) % (uint64_t)V);
    }
    if ((rc = fx_model_prefill(m, r->c, r->logits, r->prompt, a->plen < 8 ? a->plen : 8)) != FX_OK) /* warm-up */
        return cli_fail(rc, "prefill");
    for (int64_t k = 0; k < a->reps; k++) {
        double t0 = fx__seconds();
        if ((rc = fx_model_prefill(m, r->c, r->logits, r->prompt, a->plen)) != FX_OK)
            return cli_fail(rc, "prefill");
        double t1 = fx__seconds();
        for (int64_t t = 1; t < a->ntok; t++) {
            int32_t next = 0; /* greedy */
            for (int64_t j = 1; j < V; j++)
                next = r->logits[j] > r->logits[next] ? (int32_t)j : next;
            if ((rc = fx_model_decode_step(m, r->c, r->logits, next)) != FX_OK)
                return cli_fail(rc, "decode");
        }
        double t2 = fx__seconds();
        r->pre[k] = (double)a->plen / (t1 - t0);
        r->dec[k] = (double)(a->ntok - 1) / (t2 - t1);
    }
    return CLI_EXIT_OK;
}

/* Medians of the runs (sorts r->pre and r->dec) and the peak RSS, as text or one JSON line. */
static void gen_report(const gen_args *a, const fx_model_config *cfg, const fx_model *m, gen_run *r)
{
    double pm = bench_median(r->pre, (int)a->reps), dm = bench_median(r->dec, (int)a->reps);
    double rss = (double)bench_max_rss() / (1024.0 * 1024.0);
    if (a->json)
        printf("{\"case\": \"generate\", \"model\": \"%s\", \"arch\": \"%s\", \"params\": %zu, \"prompt_len\": %lld, "
               "\"tokens\": %lld, \"reps\": %lld, \"threads\": %d, \"prefill_tok_s\": %.3f, \"decode_tok_s\": %.3f, "
               "\"peak_rss_mib\": %.1f}\n",
               a->model, cfg->arch, fx_model_num_params(m), (long long)a->plen, (long long)a->ntok,
               (long long)a->reps, fx_get_num_threads(), pm, dm, rss);
    else
        printf("generate %s (%s, %zu parameters), %d threads: prefill %lld tokens %.1f tok/s, decode %lld tokens "
               "%.1f tok/s (medians of %lld), peak RSS %.0f MiB\n",
               a->model, cfg->arch, fx_model_num_params(m), fx_get_num_threads(), (long long)a->plen, pm,
               (long long)(a->ntok - 1), dm, (long long)a->reps, rss);
}

int bench_generate(int argc, char **argv)
{
    gen_args a;
    int rc = gen_args_parse(argc, argv, &a);
    if (rc == CLI_PARSE_HELP)
        return CLI_EXIT_OK;
    if (rc != CLI_PARSE_OK)
        return rc;
    fx_model_config cfg;
    fx_model *m;
    if ((rc = gen_model_open(&a, &cfg, &m)) != CLI_EXIT_OK)
        return rc;
    int exit_code = CLI_EXIT_FAIL;
    gen_run r = {.prompt = malloc((size_t)a.plen * sizeof *r.prompt),
                 .logits = malloc((size_t)cfg.vocab * sizeof *r.logits),
                 .pre = calloc((size_t)a.reps, sizeof *r.pre),
                 .dec = calloc((size_t)a.reps, sizeof *r.dec)};
    if (!r.prompt || !r.logits || !r.pre || !r.dec) {
        cli_error("out of memory");
        goto done;
    }
    if ((rc = fx_model_cache_create(&r.c, m, a.plen + a.ntok)) != FX_OK) {
        cli_fail(rc, "KV cache");
        goto done;
    }
    if (gen_time(&a, m, cfg.vocab, &r) != CLI_EXIT_OK)
        goto done;
    gen_report(&a, &cfg, m, &r);
    exit_code = CLI_EXIT_OK;
done:
    fx_model_cache_free(r.c);
    fx_model_free(m);
    free(r.prompt), free(r.logits), free(r.pre), free(r.dec);
    return exit_code;
}
