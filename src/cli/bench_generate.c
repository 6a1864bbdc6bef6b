/* flexc bench generate: prefill and decode tokens/s and peak memory of a model with the KV
   cache (bench/generate_vs_transformers.py runs it against transformers). */
#include "cli.h"

#include "bench_util.h"

#include <stdlib.h>
#include <string.h>

int bench_generate(int argc, char **argv)
{
    const char *model = "small";
    int64_t plen = 128, ntok = 64, reps = 3, threads = 0;
    bool json = false;
    const cli_opt opts[] = {
        {"--model", CLI_STRING, &model, "a preset (random weights) or a directory (default small)"},
        {"--prompt-len", CLI_INT, &plen, "prompt tokens prefilled (default 128)"},
        {"--tokens", CLI_INT, &ntok, "tokens generated: one from the prefill, the rest decode steps (default 64)"},
        {"--reps", CLI_INT, &reps, "runs; medians are reported (default 3)"},
        {"--threads", CLI_INT, &threads, "threads (default: all cores)"},
        {"--json", CLI_FLAG, &json, "one JSON object instead of text"},
    };
    int rc = cli_parse("bench generate", "[options]", argc, argv, opts, sizeof opts / sizeof opts[0], NULL, 0, NULL);
    if (rc == CLI_PARSE_HELP)
        return CLI_EXIT_OK;
    if (rc != CLI_PARSE_OK)
        return rc;
    if (plen < 1 || plen > 1000000 || ntok < 2 || ntok > 1000000 || reps < 1 || reps > 64) {
        cli_error("bench generate: --prompt-len %lld, --tokens %lld or --reps %lld is outside [1, 1000000], "
                  "[2, 1000000], [1, 64]", (long long)plen, (long long)ntok, (long long)reps);
        return CLI_EXIT_USAGE;
    }
    if ((rc = cli_threads("bench generate", threads)) != CLI_EXIT_OK)
        return rc;
    fx_model_config cfg;
    fx_model *m = NULL;
    if ((rc = cli_model_open_for("--model", model, &cfg, &m, true)) != CLI_EXIT_OK)
        return rc;
    if (!m && (rc = fx_model_create(&m, &cfg, 1)) != FX_OK)
        return cli_fail(rc, "--model");
    const int64_t V = cfg.vocab;
    if (plen + ntok > cfg.ctx) {
        cli_error("bench generate: --prompt-len + --tokens = %lld is more than the model's context %lld",
                  (long long)(plen + ntok), (long long)cfg.ctx);
        fx_model_free(m);
        return CLI_EXIT_USAGE;
    }
    int exit_code = CLI_EXIT_FAIL;
    fx_model_cache *c = NULL;
    int32_t *prompt = malloc((size_t)plen * sizeof *prompt);
    float *logits = malloc((size_t)V * sizeof *logits);
    double *pre = calloc((size_t)reps, sizeof *pre), *dec = calloc((size_t)reps, sizeof *dec);
    if (!prompt || !logits || !pre || !dec) {
        cli_error("out of memory");
        goto done;
    }
    if ((rc = fx_model_cache_create(&c, m, plen + ntok)) != FX_OK) {
        cli_fail(rc, "KV cache");
        goto done;
    }
    /* A fixed pseudo-random prompt: the speed does not depend on the text. */
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < plen; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((s >> 33) % (uint64_t)V);
    }
    if ((rc = fx_model_prefill(m, c, logits, prompt, plen < 8 ? plen : 8)) != FX_OK) { /* warm-up */
        cli_fail(rc, "prefill");
        goto done;
    }
    for (int64_t r = 0; r < reps; r++) {
        double t0 = fx__seconds();
        if ((rc = fx_model_prefill(m, c, logits, prompt, plen)) != FX_OK) {
            cli_fail(rc, "prefill");
            goto done;
        }
        double t1 = fx__seconds();
        for (int64_t t = 1; t < ntok; t++) {
            int32_t next = 0; /* greedy */
            for (int64_t j = 1; j < V; j++)
                next = logits[j] > logits[next] ? (int32_t)j : next;
            if ((rc = fx_model_decode_step(m, c, logits, next)) != FX_OK) {
                cli_fail(rc, "decode");
                goto done;
            }
        }
        double t2 = fx__seconds();
        pre[r] = (double)plen / (t1 - t0);
        dec[r] = (double)(ntok - 1) / (t2 - t1);
    }
    double pm = bench_median(pre, (int)reps), dm = bench_median(dec, (int)reps);
    double rss = (double)bench_max_rss() / (1024.0 * 1024.0);
    if (json)
        printf("{\"case\": \"generate\", \"model\": \"%s\", \"arch\": \"%s\", \"params\": %zu, \"prompt_len\": %lld, "
               "\"tokens\": %lld, \"reps\": %lld, \"threads\": %d, \"prefill_tok_s\": %.3f, \"decode_tok_s\": %.3f, "
               "\"peak_rss_mib\": %.1f}\n",
               model, cfg.arch, fx_model_num_params(m), (long long)plen, (long long)ntok, (long long)reps,
               fx_get_num_threads(), pm, dm, rss);
    else
        printf("generate %s (%s, %zu parameters), %d threads: prefill %lld tokens %.1f tok/s, decode %lld tokens "
               "%.1f tok/s (medians of %lld), peak RSS %.0f MiB\n",
               model, cfg.arch, fx_model_num_params(m), fx_get_num_threads(), (long long)plen, pm,
               (long long)(ntok - 1), dm, (long long)reps, rss);
    exit_code = CLI_EXIT_OK;
done:
    fx_model_cache_free(c);
    fx_model_free(m);
    free(prompt), free(logits), free(pre), free(dec);
    return exit_code;
}
