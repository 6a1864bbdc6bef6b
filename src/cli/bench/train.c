/* flexc bench train: training throughput and memory of the GPT with block-sparse flex
   attention and the fused loss, against the same model with dense attention and the
   unfused (materialised logits) loss, measured side by side in one run (bench/README.md).
   With --dtype bf16 the baseline is the same flex + fused model in float32 instead. */
#include "cli/cli.h"

#include "train_dist.h"
#include "util.h"
#include "cuda/model_gpu.h"
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

typedef struct variant {
    const char *name;
    fx__model *m;
    fx__model_train_state s;
    size_t own_bytes;  /* the model's buffers: parameters, gradients, Adam, activations */
    size_t step_peak;  /* the most the library held during a step, beyond what was held before */
    /* Each step's forward, backward, optimizer seconds: --steps (at most 64) after a warm-up,
       and with --gemm one untraced warm-up before those. */
    double phase[66][3];
    int steps;
    int rc;
} variant;

/* Median seconds of phase k over the timed steps (the warm-up step left out). */
static double phase_median(variant *v, int k)
{
    double x[65];
    int n = 0;
    for (int i = 1; i < v->steps; i++)
        x[n++] = v->phase[i][k];
    return n ? bench_median(x, n) : 0.0;
}

typedef struct bench_ctx {
    variant *v;
    const fx__model_data *d;
    int32_t *tok, *tgt;
} bench_ctx;

static void run_step(void *p)
{
    bench_ctx *c = p;
    variant *v = c->v;
    if (v->rc)
        return;
    size_t cur, peak;
    fx_mem_stats(&cur, &peak);
    fx_mem_reset_peak();
    fx__model_step_info info;
    v->rc = fx__model_train_step(v->m, c->d, &v->s, c->tok, c->tgt, &info);
    if (!v->rc && v->steps < 66) {
        for (int k = 0; k < 3; k++)
            v->phase[v->steps][k] = info.time_s[k];
        v->steps++;
    }
    size_t cur2, peak2;
    fx_mem_stats(&cur2, &peak2);
    if (peak2 - cur > v->step_peak)
        v->step_peak = peak2 - cur;
}

/* The run's options, checked, and what follows from them. */
typedef struct train_args {
    const char *model, *attn, *dtype, *device;
    int64_t batch, seq, steps;
    bool json, adam_bf16, recompute, gemm, ops, bf16, cuda;
    fx_model_config cfg;
    fx__model_mask mask;
    int64_t window;
    int first, last; /* the variants built and timed: 0 flex, 1 baseline */
} train_args;

/* a from the command line: CLI_PARSE_OK, CLI_PARSE_HELP (usage printed) or the exit status
   of an error (printed). */
static int train_args_parse(int argc, char **argv, train_args *a)
{
    const char *only = NULL, *parallel = NULL;
    int64_t vocab = 0, threads = 0;
    *a = (train_args){.model = "small", .attn = "causal", .dtype = "f32", .batch = 4, .steps = 5};
    const cli_opt opts[] = {
        {"--model", CLI_STRING, &a->model, "tiny | small | gpt2, or a model directory (default small)"},
        {"--attn", CLI_STRING, &a->attn, "mask of the flex variant: causal | sliding:W | document (default causal)"},
        {"--batch", CLI_INT, &a->batch, "sequences per step (default 4)"},
        {"--seq", CLI_INT, &a->seq, "sequence length (default: the model's context)"},
        {"--vocab", CLI_INT, &vocab, "vocabulary size (default 257, bytes; 50257 for a GPT-2 comparison)"},
        {"--steps", CLI_INT, &a->steps, "timed step pairs (default 5)"},
        {"--threads", CLI_INT, &threads, "threads (default: all cores)"},
        {"--only", CLI_STRING, &only, "flex | baseline: build and time one variant (its process max RSS is then its own)"},
        {"--adam-bf16", CLI_FLAG, &a->adam_bf16, "both variants keep the Adam moments in bfloat16"},
        {"--dtype", CLI_STRING, &a->dtype, "f32 | bf16: the flex variant's matrix products; bf16 compares it with "
                                           "the same model in f32 (default f32)"},
        {"--recompute", CLI_FLAG, &a->recompute, "the flex variant recomputes activations in backward"},
        {"--device", CLI_STRING, &a->device, "cpu | cuda: where the flex variant's step runs (cuda: with --only flex)"},
        {"--json", CLI_FLAG, &a->json, "one JSON object"},
        {"--gemm", CLI_FLAG, &a->gemm, "with --only: the step's matrix products by shape, against BLIS alone at each"},
        {"--ops", CLI_FLAG, &a->ops, "with --only: the step's time by op (matrix products, attention, norms, RoPE, "
                                     "SwiGLU, loss, embedding, optimizer, the rest)"},
        /* Never parsed here: --parallel selects bench_train_dist. Listed for --help. */
        {"--parallel", CLI_STRING, &parallel, "fsdp | ddp: overlapped vs. serialised steps under mpirun (options: "
                                              "flexc bench train --parallel fsdp --help)"},
    };
    int rc = cli_parse("bench train", "[options]", argc, argv, opts, sizeof opts / sizeof opts[0], NULL, 0, NULL);
    if (rc != CLI_PARSE_OK)
        return rc;
    if ((rc = cli_threads("bench train", threads)) != CLI_EXIT_OK)
        return rc;
    if (strcmp(a->dtype, "f32") != 0 && strcmp(a->dtype, "bf16") != 0) {
        cli_error("bench train --dtype %s: expected f32 or bf16", a->dtype);
        return CLI_EXIT_USAGE;
    }
    a->bf16 = strcmp(a->dtype, "bf16") == 0;
    /* A preset, or the configuration of a saved model (the timing does not depend on the
       weights, so the benchmark draws its own). */
    fx_model *saved = NULL;
    if ((rc = cli_model_open("bench train --model", a->model, &a->cfg, &saved)) != CLI_EXIT_OK)
        return rc;
    fx_model_free(saved);
    if (vocab)
        a->cfg.vocab = vocab;
    if (a->seq == 0)
        a->seq = a->cfg.ctx;
    if (fx__model_config_check(&a->cfg) != FX_OK || fx__model_mask_parse(a->attn, &a->mask, &a->window) != FX_OK) {
        cli_error("bench train: %s", fx_last_error());
        return CLI_EXIT_USAGE;
    }
    a->first = only && !strcmp(only, "baseline");
    a->last = only && !strcmp(only, "flex") ? 0 : 1;
    if (only && a->first == 0 && a->last == 1) {
        cli_error("bench train --only: '%s' is not flex or baseline", only);
        return CLI_EXIT_USAGE;
    }
    if ((a->gemm || a->ops) && !only) {
        cli_error("bench train %s: needs --only flex or --only baseline", a->gemm ? "--gemm" : "--ops");
        return CLI_EXIT_USAGE;
    }
    /* On a GPU only the flex variant, with the options the GPU step takes. */
    if (a->device && strcmp(a->device, "cuda") == 0 && (a->first != 0 || a->last != 0 || a->gemm || a->ops ||
                                                        a->recompute || a->adam_bf16)) {
        cli_error("bench train --device cuda: times --only flex, without --gemm, --ops, --recompute or --adam-bf16");
        return CLI_EXIT_USAGE;
    }
    if ((rc = cli_device(a->device, &a->cuda)) != CLI_EXIT_OK)
        return rc;
    const struct { const char *name; int64_t v, lo, hi; } lim[] = {
        {"--seq", a->seq, 1, a->cfg.ctx}, {"--batch", a->batch, 1, 4096}, {"--steps", a->steps, 1, 64}};
    for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++)
        if (lim[i].v < lim[i].lo || lim[i].v > lim[i].hi) {
            cli_error("bench train: %s %lld is outside [%lld, %lld]", lim[i].name, (long long)lim[i].v,
                      (long long)lim[i].lo, (long long)lim[i].hi);
            return CLI_EXIT_USAGE;
        }
    /* The random tokens are stored as uint16. */
    if (a->cfg.vocab > 65535) {
        cli_error("bench train: --vocab %lld is outside [2, 65535]", (long long)a->cfg.vocab);
        return CLI_EXIT_USAGE;
    }
    return CLI_PARSE_OK;
}

/* Variant i's model (0: flex attention and the fused loss, in bfloat16 with --dtype bf16;
   1: the baseline) and training state, with the memory its buffers took. */
static int variant_setup(variant *v, const train_args *a, int i)
{
    size_t before, after, peak;
    fx_mem_stats(&before, &peak);
    int rc = fx_model_create(&v->m, &a->cfg, 1);
    if (rc != FX_OK)
        return rc;
    v->m->adam_bf16 = a->adam_bf16;
    v->m->recompute = a->recompute && i == 0;
    if ((rc = fx__model_alloc_train(v->m)) != FX_OK)
        return rc;
    v->m->mask = i == 0 || a->bf16 ? a->mask : FX__MODEL_MASK_CAUSAL_DENSE;
    v->m->window = a->window;
    v->m->loss_impl = i == 0 || a->bf16 ? FX__MODEL_LOSS_FUSED : FX__MODEL_LOSS_UNFUSED;
    /* On a GPU the device holds the weights' bfloat16 copy (and the batch's activations). */
    if (a->cuda && (rc = fx__model_gpu_attach(v->m, 1, a->bf16)) != FX_OK)
        return rc;
    if ((rc = fx__model_set_batch(v->m, a->batch, a->seq)) != FX_OK ||
        (rc = fx__model_set_bf16(v->m, a->bf16 && i == 0 && !a->cuda)) != FX_OK)
        return rc;
    fx_mem_stats(&after, &peak);
    v->own_bytes = after - before;
    v->s = (fx__model_train_state){.steps = 1000, .warmup = 10, .batch = a->batch, .seq = a->seq, .accum = 1,
                                 .lr = 1e-4f, .min_lr = 1e-5f, .weight_decay = 0.1f, .clip = 1.0f,
                                 .beta1 = 0.9f, .beta2 = 0.95f};
    fx_rng_init(&v->s.rng, 1, 1);
    return FX_OK;
}

/* What the traced steps (--gemm, --ops) recorded: the products by shape and the other work by
   op, over the variant's steps from `from` on. */
typedef struct step_trace {
    fx__gemm_shape shapes[64];
    int nshapes;
    int64_t dropped;
    fx__op_time ops[FX__OP_COUNT];
    int from;
} step_trace;

/* The traced steps' mean seconds: the whole step, and (optim, may be NULL) its gradient norm
   and optimizer phase. 0 when no step was traced. */
static double traced_step_s(const variant *x, const step_trace *tr, double *optim)
{
    const int steps = x->steps - tr->from;
    double step_s = 0.0, optim_s = 0.0;
    for (int i = tr->from; i < x->steps; i++)
        step_s += x->phase[i][0] + x->phase[i][1] + x->phase[i][2], optim_s += x->phase[i][2];
    if (optim)
        *optim = steps > 0 ? optim_s / steps : 0.0;
    return steps > 0 ? step_s / steps : 0.0;
}

/* --ops: the traced steps' mean time by op, the products (all shapes) first, the gradient norm
   and optimizer (the step's own phase) and what no row covers last. */
static void report_ops(const train_args *a, const variant *x, const step_trace *tr)
{
    const int steps = x->steps - tr->from;
    if (steps <= 0)
        return;
    double optim_s, gemm_s = 0.0, gemm_calls = 0.0;
    const double step_s = traced_step_s(x, tr, &optim_s);
    for (int i = 0; i < tr->nshapes; i++)
        gemm_s += tr->shapes[i].seconds, gemm_calls += (double)tr->shapes[i].calls;
    struct op_row {
        const char *name;
        double calls, s; /* a step's */
    } row[FX__OP_COUNT + 3];
    int n = 0;
    row[n++] = (struct op_row){"matrix products", gemm_calls / steps, gemm_s / steps};
    for (int op = 0; op < FX__OP_COUNT; op++)
        row[n++] = (struct op_row){fx__op_name((fx__op)op), (double)tr->ops[op].calls / steps,
                                     tr->ops[op].seconds / steps};
    row[n++] = (struct op_row){"gradient norm and optimizer", 1.0, optim_s};
    double rest = step_s;
    for (int i = 0; i < n; i++)
        rest -= row[i].s;
    row[n++] = (struct op_row){"the rest", 0.0, rest};
    if (a->json) {
        printf("{\"case\":\"train_ops\",\"steps\":%d,\"step_s\":%.5f,\"ops\":[", steps, step_s);
        for (int i = 0; i < n; i++)
            printf("%s{\"op\":\"%s\",\"calls\":%.1f,\"s\":%.5f,\"share\":%.4f}", i ? "," : "", row[i].name,
                   row[i].calls, row[i].s, row[i].s / step_s);
        printf("]}\n");
        return;
    }
    printf("  the step by op (mean of %d traced steps, %.3f s a step):\n    %-28s %7s %9s %7s\n", steps, step_s, "op",
           "calls", "ms", "share");
    for (int i = 0; i < n; i++)
        printf("    %-28s %7.1f %9.2f %6.1f%%\n", row[i].name, row[i].calls, 1e3 * row[i].s, 100.0 * row[i].s / step_s);
}

/* The report of one variant timed alone (--only) at t seconds a step; --gemm and --ops: what
   the traced steps recorded. */
static void report_one(const train_args *a, variant *x, double t, const step_trace *tr)
{
    const double tokens = (double)(a->batch * a->seq), mem = (double)(x->own_bytes + x->step_peak);
    const double params = (double)x->m->lay.total;
    if (a->json)
        printf("{\"case\":\"train\",\"variant\":\"%s\",\"device\":\"%s\",\"dtype\":\"%s\",\"recompute\":%s,\"adam\":\"%s\","
               "\"model\":\"%s\","
               "\"params\":%.0f,\"vocab\":%lld,\"batch\":%lld,\"seq\":%lld,\"threads\":%d,\"tokens_per_s\":%.1f,"
               "\"forward_s\":%.4f,\"backward_s\":%.4f,\"optimizer_s\":%.4f,\"peak_bytes\":%.0f,\"max_rss_bytes\":%zu}\n",
               x->name, a->cuda ? "cuda" : "cpu", x->m->params16 || (x->m->gpu && a->bf16) ? "bf16" : "f32",
               x->m->recompute ? "true" : "false",
               a->adam_bf16 ? "bf16" : "f32", a->model, params, (long long)a->cfg.vocab, (long long)a->batch,
               (long long)a->seq, fx_get_num_threads(), tokens / t, phase_median(x, 0), phase_median(x, 1),
               phase_median(x, 2), mem, bench_max_rss());
    else
        printf("train %s (%s%s): %.2fM params, batch %lld x %lld, %d threads: %.1f tokens/s, library peak %.1f MB, "
               "process max RSS %.1f MB\n"
               "  per step (median): forward with the loss %.3f s, backward %.3f s, norm and optimizer %.3f s\n",
               a->model, x->name, a->cuda ? ", on CUDA device 0" : "", params / 1e6, (long long)a->batch, (long long)a->seq, fx_get_num_threads(),
               tokens / t, mem / 1048576.0, (double)bench_max_rss() / 1048576.0, phase_median(x, 0),
               phase_median(x, 1), phase_median(x, 2));
    if (a->gemm) {
        /* The traced steps' mean: the products' time is a sum over the same steps. */
        const int traced = x->steps - tr->from;
        bench_gemm_report(tr->shapes, tr->nshapes, tr->dropped, traced, traced > 0 ? traced_step_s(x, tr, NULL) : t,
                          a->json);
    }
    if (a->ops)
        report_ops(a, x, tr);
}

/* The report of both variants timed side by side: ta and tb seconds a step. */
static void report_pair(const train_args *a, const variant v[2], double ta, double tb)
{
    const double tokens = (double)(a->batch * a->seq), params = (double)v[0].m->lay.total;
    const double mem_a = (double)(v[0].own_bytes + v[0].step_peak), mem_b = (double)(v[1].own_bytes + v[1].step_peak);
    char an[32];
    fx__model_mask_name(a->mask, a->window, an, sizeof an);
    const fx_model_config *c = &a->cfg;
    if (a->json) {
        printf("{\"case\":\"train\",\"dtype\":\"%s\",\"baseline\":\"%s\",\"recompute\":%s,\"adam\":\"%s\",\"model\":\"%s\","
               "\"params\":%.0f,\"layers\":%lld,\"dim\":%lld,\"heads\":%lld,"
               "\"kv_heads\":%lld,\"vocab\":%lld,\"batch\":%lld,\"seq\":%lld,\"threads\":%d,\"attn\":\"%s\","
               "\"tokens_per_s\":%.1f,\"baseline_tokens_per_s\":%.1f,\"speedup\":%.3f,"
               "\"peak_bytes\":%.0f,\"baseline_peak_bytes\":%.0f,\"memory_ratio\":%.3f,\"max_rss_bytes\":%zu}\n",
               a->dtype, a->bf16 ? "flex+fused f32" : "dense+unfused", a->recompute ? "true" : "false",
               a->adam_bf16 ? "bf16" : "f32", a->model, params, (long long)c->layers, (long long)c->dim,
               (long long)c->heads, (long long)c->kv_heads, (long long)c->vocab, (long long)a->batch,
               (long long)a->seq, fx_get_num_threads(), an, tokens / ta, tokens / tb, tb / ta, mem_a, mem_b,
               mem_a / mem_b, bench_max_rss());
        return;
    }
    printf("train %s: %.2fM params, vocab %lld, batch %lld x %lld, %d threads (median of %lld step pairs)\n", a->model,
           params / 1e6, (long long)c->vocab, (long long)a->batch, (long long)a->seq, fx_get_num_threads(),
           (long long)a->steps);
    printf("  %-28s %10.1f tokens/s  peak %8.1f MB\n", a->bf16 ? "flex + fused, bf16" : "flex (attention mask) + fused",
           tokens / ta, mem_a / 1048576.0);
    printf("  %-28s %10.1f tokens/s  peak %8.1f MB\n", a->bf16 ? "flex + fused, f32" : "dense + unfused loss",
           tokens / tb, mem_b / 1048576.0);
    printf("  speedup %.2fx, memory %.2fx of the baseline (mask %s); process max RSS %.1f MB\n", tb / ta,
           mem_a / mem_b, an, (double)bench_max_rss() / 1048576.0);
}

int bench_train(int argc, char **argv)
{
    for (int i = 0; i < argc; i++) /* over MPI processes: a benchmark of its own */
        if (!strcmp(argv[i], "--parallel") || !strncmp(argv[i], "--parallel=", 11))
            return bench_train_dist(argc, argv);
    train_args a;
    int rc = train_args_parse(argc, argv, &a);
    if (rc == CLI_PARSE_HELP)
        return CLI_EXIT_OK;
    if (rc != CLI_PARSE_OK)
        return rc;

    /* 64K tokens are plenty of distinct windows, and keep the benchmark's own data out of the
       process's memory. */
    bench_train_data data;
    const int64_t ntok = (a.seq + 1) * 64 > (1 << 16) ? (a.seq + 1) * 64 : 1 << 16;
    if (!bench_train_data_new(&data, ntok, a.seq, a.batch, a.cfg.vocab))
        return CLI_EXIT_FAIL;

    variant v[2] = {{.name = a.bf16 ? "flex+fused bf16" : "flex+fused"},
                    {.name = a.bf16 ? "flex+fused f32" : "dense+unfused"}};
    int exit_code = CLI_EXIT_FAIL;
    for (int i = a.first; i <= a.last; i++)
        if ((rc = variant_setup(&v[i], &a, i)) != FX_OK) {
            cli_fail(rc, "bench train");
            goto done;
        }
    bench_ctx ca = {&v[0], &data.d, data.tok, data.tgt}, cb = {&v[1], &data.d, data.tok, data.tgt};
    double ta = 0, tb = 0;
    /* --gemm, --ops: one warm-up step untraced, then every step bench_time runs (its own
       warm-up included, all warm by then). */
    step_trace tr = {0};
    const bool traced = a.gemm || a.ops;
    if (traced) {
        run_step(a.first == 0 ? &ca : &cb);
        tr.from = v[a.first].steps;
        fx__gemm_trace_start(tr.shapes, (int)(sizeof tr.shapes / sizeof tr.shapes[0]));
        if (a.ops)
            fx__op_trace_start(tr.ops);
    }
    if (a.first == 0 && a.last == 1)
        bench_pair(run_step, &ca, run_step, &cb, (int)a.steps, &ta, &tb);
    else if (a.first == 0)
        ta = bench_time(run_step, &ca, (int)a.steps);
    else
        tb = bench_time(run_step, &cb, (int)a.steps);
    if (traced) {
        tr.nshapes = fx__gemm_trace_stop(&tr.dropped);
        fx__op_trace_stop();
    }
    for (int i = a.first; i <= a.last; i++)
        if (v[i].rc) {
            cli_fail(v[i].rc, v[i].name);
            goto done;
        }
    if (a.first == a.last)
        report_one(&a, &v[a.first], a.first == 0 ? ta : tb, &tr);
    else
        report_pair(&a, v, ta, tb);
    exit_code = CLI_EXIT_OK;
done:
    fx_model_free(v[0].m), fx_model_free(v[1].m);
    bench_train_data_free(&data);
    return exit_code;
}
