/* flexc bench train --parallel fsdp|ddp (under mpirun): the training step with its
   collectives overlapped against the same step with every collective waited for as soon as it
   starts (no prefetch), alternating in one run; the time blocked in collectives, the bytes
   communicated per step and the per-rank parameter + gradient + optimizer memory. */
#include "bench_train_dist.h"

#include "bench_util.h"
#include "cli.h"
#include "gpt/dist.h"

#include <stdlib.h>
#include <string.h>

/* Medians of a and b over n pairs (sorts them). */
typedef struct dist_sample {
    double step[64], wait[64], prog[64], head[64], tail[64];
} dist_sample;

static _Noreturn void bench_comm_failed(void)
{
    cli_error("%s", fx_last_error());
    exit(CLI_EXIT_FAIL);
}

int bench_train_dist(int argc, char **argv)
{
    const char *model = "small", *parallel = NULL;
    int64_t batch = 0, seq = 0, steps = 5, threads = 0;
    double timeout = 120.0;
    bool json = false;
    const cli_opt opts[] = {
        {"--parallel", CLI_STRING, &parallel, "fsdp | ddp (run under mpirun -np N)"},
        {"--model", CLI_STRING, &model, "tiny | small | gpt2, or a model directory (default small)"},
        {"--batch", CLI_INT, &batch, "global sequences per step (default: 2 per process)"},
        {"--seq", CLI_INT, &seq, "sequence length (default: the model's context)"},
        {"--steps", CLI_INT, &steps, "timed step pairs (default 5)"},
        {"--threads", CLI_INT, &threads, "threads per process (default: all cores)"},
        {"--comm-timeout", CLI_FLOAT, &timeout, "seconds before a collective fails (default 120)"},
        {"--json", CLI_FLAG, &json, "one JSON object"},
    };
    int rc = cli_parse("bench train", "--parallel fsdp|ddp [options]", argc, argv, opts, sizeof opts / sizeof opts[0],
                       NULL, 0, NULL);
    if (rc == CLI_PARSE_HELP)
        return CLI_EXIT_OK;
    if (rc != CLI_PARSE_OK)
        return rc;
    fx__par par;
    if (fx__par_parse(parallel, &par) != FX_OK || par == FX__PAR_NONE) {
        cli_error("bench train --parallel: '%s' is not fsdp or ddp", parallel ? parallel : "");
        return CLI_EXIT_USAGE;
    }
    if ((rc = cli_threads("bench train", threads)) != CLI_EXIT_OK)
        return rc;
    /* A preset, or the configuration of a saved model (the timing does not depend on the
       weights, so the benchmark draws its own). */
    fx__gpt_config cfg;
    fx_model *saved = NULL;
    if ((rc = cli_model_open("bench train --model", model, &cfg, &saved)) != CLI_EXIT_OK)
        return rc;
    fx_model_free(saved);
    if (seq == 0)
        seq = cfg.ctx;
    if (seq < 1 || seq > cfg.ctx || batch < 0 || steps < 1 || steps > 64 || !(timeout > 0)) {
        cli_error("bench train: --seq must be in [1, %lld], --steps in [1, 64], --comm-timeout > 0",
                  (long long)cfg.ctx);
        return CLI_EXIT_USAGE;
    }
    fx_comm *world = NULL;
    if ((rc = fx_comm_init(&world, NULL, NULL)) != FX_OK)
        return cli_fail(rc, "bench train --parallel");
    fx_comm_set_timeout(world, timeout);
    fx_comm_set_dump_fd(2);
    int rank = fx_comm_rank(world), N = fx_comm_size(world);
    if (batch == 0)
        batch = 2 * (int64_t)N;

    fx__gpt_data d = {.n = 1 << 20};
    d.n_train = d.n - (seq + 1);
    d.tok = malloc((size_t)d.n * sizeof *d.tok);
    int32_t *tok = malloc((size_t)(batch * seq) * sizeof *tok), *tgt = malloc((size_t)(batch * seq) * sizeof *tgt);
    fx__gpt *m = NULL;
    fx__dist *dist = NULL;
    int exit_code = CLI_EXIT_FAIL;
    if (!d.tok || !tok || !tgt) {
        cli_error("bench train: out of memory");
        goto done;
    }
    fx_rng r;
    fx_rng_init(&r, 7, 0);
    for (int64_t i = 0; i < d.n; i++)
        d.tok[i] = (uint32_t)(fx_rng_u32(&r) % (uint32_t)cfg.vocab);
    /* The library's allocation counter: the whole model before sharding, what stays after. */
    size_t mem0, mem_whole, mem_sharded, peak;
    fx_mem_stats(&mem0, &peak);
    if ((rc = fx_model_create(&m, &cfg, 1)) != FX_OK || (rc = fx__gpt_alloc_train(m)) != FX_OK) {
        cli_fail(rc, "bench train");
        goto done;
    }
    fx_mem_stats(&mem_whole, &peak);
    size_t full_state = 4 * m->lay.total * sizeof(float);
    if ((rc = fx__dist_create(&dist, m, world, par, false, batch)) != FX_OK) {
        if (fx_comm_status(world) != FX_OK)
            bench_comm_failed();
        cli_fail(rc, "bench train");
        goto done;
    }
    fx_mem_stats(&mem_sharded, &peak);
    fx__gpt_train_state s = {.steps = 1000, .warmup = 10, .batch = batch, .seq = seq, .accum = 1, .lr = 1e-4f,
                             .min_lr = 1e-5f, .weight_decay = 0.1f, .clip = 1.0f, .beta1 = 0.9f, .beta2 = 0.95f};
    fx_rng_init(&s.rng, 1, 1);
    static dist_sample ov, se;
    double bytes = 0, bytes_ov = 0;
    int64_t ncoll = 0, ncoll_ov = 0, npoll = 0;
    bool same_work = true;
    /* One warm-up step of each, then overlapped and serialised steps alternately; a barrier
       lines the ranks up before each timed step. */
    for (int64_t i = -1; i < steps; i++)
        for (int serial = 0; serial < 2; serial++) {
            fx__dist_set_serial(dist, serial == 1);
            if (fx_comm_barrier(world, NULL) != FX_OK)
                bench_comm_failed();
            double t0 = fx__seconds();
            rc = fx__dist_step(dist, &d, &s, tok, tgt, NULL, NULL);
            double dt = fx__seconds() - t0;
            if (rc && (fx_comm_status(world) != FX_OK || fx__dist_status(dist) != FX_OK))
                bench_comm_failed();
            if (rc) {
                cli_fail(rc, "bench train");
                goto done;
            }
            fx__dist_stats st = fx__dist_last_stats(dist);
            if (i < 0)
                continue;
            dist_sample *x = serial ? &se : &ov;
            x->step[i] = dt, x->wait[i] = st.wait_s, x->prog[i] = st.progress_s;
            x->head[i] = st.wait_head_s, x->tail[i] = st.wait_tail_s;
            bytes = st.comm_bytes, ncoll = st.collectives, npoll = st.progress_calls;
            /* Both modes must run the same collectives, or the comparison means nothing. */
            if (serial)
                same_work = same_work && st.comm_bytes == bytes_ov && st.collectives == ncoll_ov;
            else
                bytes_ov = st.comm_bytes, ncoll_ov = st.collectives;
        }
    /* Rank 0 reports the slowest rank's medians: the step ends when the last rank does. */
    enum { K = 10 };
    dist_sample *src[2] = {&ov, &se};
    float med[K];
    for (int k = 0; k < 2; k++) {
        med[5 * k + 0] = (float)bench_median(src[k]->step, (int)steps);
        med[5 * k + 1] = (float)bench_median(src[k]->wait, (int)steps);
        med[5 * k + 2] = (float)bench_median(src[k]->prog, (int)steps);
        med[5 * k + 3] = (float)bench_median(src[k]->head, (int)steps);
        med[5 * k + 4] = (float)bench_median(src[k]->tail, (int)steps);
    }
    float all[K * 64];
    if (N > 64 || fx_comm_all_gather_single(world, all, med, K, NULL) != FX_OK) {
        if (N <= 64)
            bench_comm_failed();
        memcpy(all, med, sizeof med), N = 1;
    }
    for (int k = 1; k < N; k++)
        for (int j = 0; j < K; j++)
            if (all[K * k + j] > med[j])
                med[j] = all[K * k + j];
    /* Communication time: what a rank spends inside communication calls (blocked in waits,
       plus starting collectives and the progress calls between the layers' operations, where
       this rank's core does MPI's copies).
       Serialised, every collective is waited for as it starts, so all of it is on the
       critical path: that is the step's communication time. Overlapped, the same calls'
       time is what stayed exposed; the rest was hidden behind compute. */
    double t_ov = med[0], w_ov = med[1], p_ov = med[2], h_ov = med[3], tl_ov = med[4];
    double t_se = med[5], w_se = med[6], p_se = med[7], h_se = med[8], tl_se = med[9];
    double comm = w_se + p_se, exposed = w_ov + p_ov;
    double hidden = comm > 0 ? 1.0 - exposed / comm : 0.0;
    double wait_cut = w_se > 0 ? 1.0 - w_ov / w_se : 0.0;
    double step_hidden = comm > 0 ? (t_se - t_ov) / comm : 0.0; /* the same, by step time */
    size_t state = fx__dist_state_bytes(dist), shards = fx__dist_shard_bytes(dist),
           layer = fx__dist_layer_bytes(dist);
    if (rank == 0) {
        if (json)
            printf("{\"case\":\"train_parallel\",\"parallel\":\"%s\",\"model\":\"%s\",\"params\":%zu,\"ranks\":%d,"
                   "\"batch\":%lld,\"seq\":%lld,\"threads\":%d,\"step_s\":%.6f,\"serial_step_s\":%.6f,"
                   "\"speedup\":%.3f,\"wait_s\":%.6f,\"serial_wait_s\":%.6f,\"progress_s\":%.6f,"
                   "\"serial_progress_s\":%.6f,\"head_wait_s\":%.6f,\"serial_head_wait_s\":%.6f,"
                   "\"tail_wait_s\":%.6f,\"serial_tail_wait_s\":%.6f,\"comm_s\":%.6f,\"exposed_s\":%.6f,"
                   "\"hidden_fraction\":%.3f,\"step_hidden_fraction\":%.3f,\"wait_reduction\":%.3f,"
                   "\"same_collectives\":%s,\"bytes_per_step\":%.0f,\"collectives_per_step\":%lld,"
                   "\"state_bytes\":%zu,\"shard_bytes\":%zu,\"layer_bytes\":%zu,"
                   "\"one_process_state_bytes\":%zu,\"state_ratio\":%.3f,"
                   "\"allocated_bytes\":%zu,\"one_process_allocated_bytes\":%zu}\n",
                   parallel, model, m->lay.total, N, (long long)batch, (long long)seq, fx_get_num_threads(), t_ov,
                   t_se, t_se / t_ov, w_ov, w_se, p_ov, p_se, h_ov, h_se, tl_ov, tl_se, comm, exposed, hidden,
                   step_hidden, wait_cut, same_work ? "true" : "false", bytes, (long long)ncoll, state, shards, layer,
                   full_state, (double)state / (double)full_state, mem_sharded - mem0, mem_whole - mem0);
        else {
            printf("train --parallel %s, %s: %.2fM params, %d processes, batch %lld x %lld, %d threads each "
                   "(median of %lld alternating pairs, slowest rank)\n",
                   parallel, model, (double)m->lay.total / 1e6, N, (long long)batch, (long long)seq,
                   fx_get_num_threads(), (long long)steps);
            printf("                   step   in waits (before layer 0 / after backward)   in other calls (starting, "
                   "progress)\n");
            printf("  overlapped %8.1f ms %8.1f ms (%5.1f / %5.1f ms)              %8.1f ms\n", t_ov * 1e3, w_ov * 1e3,
                   h_ov * 1e3, tl_ov * 1e3, p_ov * 1e3);
            printf("  serialised %8.1f ms %8.1f ms (%5.1f / %5.1f ms)              %8.1f ms\n", t_se * 1e3, w_se * 1e3,
                   h_se * 1e3, tl_se * 1e3, p_se * 1e3);
            printf("  communication time (serialised: waits + other calls) %.1f ms, exposed when overlapped %.1f ms: "
                   "%.0f%% hidden behind compute\n",
                   comm * 1e3, exposed * 1e3, 100.0 * hidden);
            printf("  step time: serialised / overlapped = %.3fx, the saving is %.0f%% of the communication time; "
                   "waits alone cut by %.0f%%\n",
                   t_se / t_ov, 100.0 * step_hidden, 100.0 * wait_cut);
            if (!same_work)
                printf("  warning: the two modes did not run the same collectives\n");
            printf("  %lld progress points per step\n", (long long)npoll);
            printf("  %.2f MB in %lld collectives per step per rank\n", bytes / 1e6, (long long)ncoll);
            printf("  parameter + gradient + optimizer memory %.2f MB per rank (%.2f MB of shards + %.2f MB gathered) "
                   "vs %.2f MB in one process (%.2fx)\n",
                   (double)state / 1e6, (double)shards / 1e6, (double)(state - shards) / 1e6,
                   (double)full_state / 1e6, (double)state / (double)full_state);
            printf("  allocated by the model before the first step (library counter): %.2f MB per rank vs %.2f MB "
                   "for the whole model (%.2fx)\n",
                   (double)(mem_sharded - mem0) / 1e6, (double)(mem_whole - mem0) / 1e6,
                   (double)(mem_sharded - mem0) / (double)(mem_whole - mem0));
        }
    }
    exit_code = CLI_EXIT_OK;
done:
    fx__dist_free(dist);
    fx_model_free(m);
    free(d.tok), free(tok), free(tgt);
    fx_comm_free(world);
    if (fx_comm_finalize() != FX_OK)
        bench_comm_failed();
    return exit_code;
}
