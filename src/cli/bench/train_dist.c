/* flexc bench train --parallel fsdp|ddp (under mpirun): the training step with its
   collectives overlapped against the same step with every collective waited for as soon as it
   starts (no prefetch), alternating in one run; the time blocked in collectives, the bytes
   communicated per step and the per-rank parameter + gradient + optimizer memory. */
#include "train_dist.h"

#include "util.h"
#include "cli/cli.h"
#include "model/dist.h"

#include <stdlib.h>
#include <string.h>

/* Per timed step of one mode (overlapped or serialised), in seconds: the step, the time
   blocked in waits (and of that, before layer 0 and after the backward), the time in the
   other communication calls. */
typedef struct dist_sample {
    double step[64], wait[64], prog[64], head[64], tail[64];
} dist_sample;

/* What the timed steps measured on this rank. */
typedef struct dist_run {
    dist_sample ov, se;   /* overlapped, serialised */
    double bytes;         /* communicated per step */
    int64_t collectives;  /* per step */
    int64_t progress;     /* progress points per step */
    bool same_work;       /* both modes ran the same collectives */
} dist_run;

/* The medians of the report, slowest rank's: step, wait, other calls, head and tail wait,
   overlapped then serialised. */
enum { DIST_MEDIANS = 10 };

/* The run's options, checked. */
typedef struct dist_args {
    const char *model, *parallel;
    int64_t batch, seq, steps;
    double timeout;
    bool json;
    fx__par par;
    fx_model_config cfg;
} dist_args;

static _Noreturn void bench_comm_failed(void)
{
    cli_error("%s", fx_last_error());
    exit(CLI_EXIT_FAIL);
}

/* a from the command line: CLI_PARSE_OK, CLI_PARSE_HELP (usage printed) or the exit status
   of an error (printed). --batch 0 stays 0 (2 per process, once the processes are known). */
static int dist_args_parse(int argc, char **argv, dist_args *a)
{
    int64_t threads = 0;
    *a = (dist_args){.model = "small", .steps = 5, .timeout = 120.0};
    const cli_opt opts[] = {
        {"--parallel", CLI_STRING, &a->parallel, "fsdp | ddp (run under mpirun -np N)"},
        {"--model", CLI_STRING, &a->model, "tiny | small | gpt2, or a model directory (default small)"},
        {"--batch", CLI_INT, &a->batch, "global sequences per step (default: 2 per process)"},
        {"--seq", CLI_INT, &a->seq, "sequence length (default: the model's context)"},
        {"--steps", CLI_INT, &a->steps, "timed step pairs (default 5)"},
        {"--threads", CLI_INT, &threads, "threads per process (default: all cores)"},
        {"--comm-timeout", CLI_FLOAT, &a->timeout, "seconds before a collective fails (default 120)"},
        {"--json", CLI_FLAG, &a->json, "one JSON object"},
    };
    int rc = cli_parse("bench train", "--parallel fsdp|ddp [options]", argc, argv, opts, sizeof opts / sizeof opts[0],
                       NULL, 0, NULL);
    if (rc != CLI_PARSE_OK)
        return rc;
    if (fx__par_parse(a->parallel, &a->par) != FX_OK || a->par == FX__PAR_NONE) {
        cli_error("bench train --parallel: '%s' is not fsdp or ddp", a->parallel ? a->parallel : "");
        return CLI_EXIT_USAGE;
    }
    if ((rc = cli_threads("bench train", threads)) != CLI_EXIT_OK)
        return rc;
    /* A preset, or the configuration of a saved model (the timing does not depend on the
       weights, so the benchmark draws its own). */
    fx_model *saved = NULL;
    if ((rc = cli_model_open("bench train --model", a->model, &a->cfg, &saved)) != CLI_EXIT_OK)
        return rc;
    fx_model_free(saved);
    if (a->seq == 0)
        a->seq = a->cfg.ctx;
    if (a->seq < 1 || a->seq > a->cfg.ctx || a->batch < 0 || a->steps < 1 || a->steps > 64 || !(a->timeout > 0)) {
        cli_error("bench train: --seq must be in [1, %lld], --steps in [1, 64], --comm-timeout > 0",
                  (long long)a->cfg.ctx);
        return CLI_EXIT_USAGE;
    }
    return CLI_PARSE_OK;
}

/* One warm-up step of each mode, then `steps` overlapped and serialised steps alternately,
   a barrier lining the ranks up before each; r gets what each timed step measured. A failed
   collective ends the process (bench_comm_failed); another failure is returned. */
static int dist_time_steps(fx__dist *dist, fx_comm *world, const fx__model_data *d, fx__model_train_state *s,
                           int32_t *tok, int32_t *tgt, int64_t steps, dist_run *r)
{
    double bytes_ov = 0;
    int64_t ncoll_ov = 0;
    r->same_work = true;
    for (int64_t i = -1; i < steps; i++)
        for (int serial = 0; serial < 2; serial++) {
            fx__dist_set_serial(dist, serial == 1);
            if (fx_comm_barrier(world, NULL) != FX_OK)
                bench_comm_failed();
            const double t0 = fx__seconds();
            const int rc = fx__dist_step(dist, d, s, tok, tgt, NULL, NULL);
            const double dt = fx__seconds() - t0;
            if (rc && (fx_comm_status(world) != FX_OK || fx__dist_status(dist) != FX_OK))
                bench_comm_failed();
            if (rc)
                return rc;
            const fx__dist_stats st = fx__dist_last_stats(dist);
            if (i < 0)
                continue;
            dist_sample *x = serial ? &r->se : &r->ov;
            x->step[i] = dt, x->wait[i] = st.wait_s, x->prog[i] = st.progress_s;
            x->head[i] = st.wait_head_s, x->tail[i] = st.wait_tail_s;
            r->bytes = st.comm_bytes, r->collectives = st.collectives, r->progress = st.progress_calls;
            /* Both modes must run the same collectives, or the comparison means nothing. */
            if (serial)
                r->same_work = r->same_work && st.comm_bytes == bytes_ov && st.collectives == ncoll_ov;
            else
                bytes_ov = st.comm_bytes, ncoll_ov = st.collectives;
        }
    return FX_OK;
}

/* med: the slowest rank's medians of r (the step ends when the last rank does); this rank's
   own where they cannot be gathered (more than 64 ranks). Sorts r's samples. */
static void dist_slowest_medians(fx_comm *world, dist_run *r, int64_t steps, float med[DIST_MEDIANS])
{
    dist_sample *src[2] = {&r->ov, &r->se};
    for (int k = 0; k < 2; k++) {
        med[5 * k + 0] = (float)bench_median(src[k]->step, (int)steps);
        med[5 * k + 1] = (float)bench_median(src[k]->wait, (int)steps);
        med[5 * k + 2] = (float)bench_median(src[k]->prog, (int)steps);
        med[5 * k + 3] = (float)bench_median(src[k]->head, (int)steps);
        med[5 * k + 4] = (float)bench_median(src[k]->tail, (int)steps);
    }
    float all[DIST_MEDIANS * 64];
    const int n = fx_comm_size(world);
    if (n > 64)
        return;
    if (fx_comm_all_gather_single(world, all, med, DIST_MEDIANS, NULL) != FX_OK)
        bench_comm_failed();
    for (int k = 1; k < n; k++)
        for (int j = 0; j < DIST_MEDIANS; j++)
            if (all[DIST_MEDIANS * k + j] > med[j])
                med[j] = all[DIST_MEDIANS * k + j];
}

/* The memory figures of the report, in bytes: parameter, gradient and optimizer state per
   rank (shards, and the largest layer gathered), the same in one process, and what the
   library allocated for the model sharded and whole. */
typedef struct dist_mem {
    size_t state, shards, layer, full_state, allocated, allocated_whole;
} dist_mem;

static void dist_report(const dist_args *a, const fx__model *m, int ranks, const dist_run *r,
                        const float med[DIST_MEDIANS], const dist_mem *mem)
{
    /* Communication time: what a rank spends inside communication calls (blocked in waits,
       plus starting collectives and the progress calls between the layers' operations, where
       this rank's core does MPI's copies).
       Serialised, every collective is waited for as it starts, so all of it is on the
       critical path: that is the step's communication time. Overlapped, the same calls'
       time is what stayed exposed; the rest was hidden behind compute. */
    const double t_ov = med[0], w_ov = med[1], p_ov = med[2], h_ov = med[3], tl_ov = med[4];
    const double t_se = med[5], w_se = med[6], p_se = med[7], h_se = med[8], tl_se = med[9];
    const double comm = w_se + p_se, exposed = w_ov + p_ov;
    const double hidden = comm > 0 ? 1.0 - exposed / comm : 0.0;
    const double wait_cut = w_se > 0 ? 1.0 - w_ov / w_se : 0.0;
    const double step_hidden = comm > 0 ? (t_se - t_ov) / comm : 0.0; /* the same, by step time */
    const double state = (double)mem->state, full = (double)mem->full_state;
    if (a->json) {
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
               a->parallel, a->model, m->lay.total, ranks, (long long)a->batch, (long long)a->seq,
               fx_get_num_threads(), t_ov, t_se, t_se / t_ov, w_ov, w_se, p_ov, p_se, h_ov, h_se, tl_ov, tl_se, comm,
               exposed, hidden, step_hidden, wait_cut, r->same_work ? "true" : "false", r->bytes,
               (long long)r->collectives, mem->state, mem->shards, mem->layer, mem->full_state, state / full,
               mem->allocated, mem->allocated_whole);
        return;
    }
    printf("train --parallel %s, %s: %.2fM params, %d processes, batch %lld x %lld, %d threads each "
           "(median of %lld alternating pairs, slowest rank)\n",
           a->parallel, a->model, (double)m->lay.total / 1e6, ranks, (long long)a->batch, (long long)a->seq,
           fx_get_num_threads(), (long long)a->steps);
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
    if (!r->same_work)
        printf("  warning: the two modes did not run the same collectives\n");
    printf("  %lld progress points per step\n", (long long)r->progress);
    printf("  %.2f MB in %lld collectives per step per rank\n", r->bytes / 1e6, (long long)r->collectives);
    printf("  parameter + gradient + optimizer memory %.2f MB per rank (%.2f MB of shards + %.2f MB gathered) "
           "vs %.2f MB in one process (%.2fx)\n",
           state / 1e6, (double)mem->shards / 1e6, (double)(mem->state - mem->shards) / 1e6, full / 1e6,
           state / full);
    printf("  allocated by the model before the first step (library counter): %.2f MB per rank vs %.2f MB "
           "for the whole model (%.2fx)\n",
           (double)mem->allocated / 1e6, (double)mem->allocated_whole / 1e6,
           (double)mem->allocated / (double)mem->allocated_whole);
}

int bench_train_dist(int argc, char **argv)
{
    dist_args a;
    int rc = dist_args_parse(argc, argv, &a);
    if (rc == CLI_PARSE_HELP)
        return CLI_EXIT_OK;
    if (rc != CLI_PARSE_OK)
        return rc;
    fx_comm *world = NULL;
    if ((rc = fx_comm_init(&world, NULL, NULL)) != FX_OK)
        return cli_fail(rc, "bench train --parallel");
    fx_comm_set_timeout(world, a.timeout);
    fx_comm_set_dump_fd(2);
    const int rank = fx_comm_rank(world), N = fx_comm_size(world);
    if (a.batch == 0)
        a.batch = 2 * (int64_t)N;

    const int64_t seq = a.seq, batch = a.batch;
    bench_train_data data;
    fx__model *m = NULL;
    fx__dist *dist = NULL;
    int exit_code = CLI_EXIT_FAIL;
    if (!bench_train_data_new(&data, 1 << 20, seq, batch, a.cfg.vocab))
        goto done;
    /* The library's allocation counter: the whole model before sharding, what stays after. */
    size_t mem0, mem_whole, mem_sharded, peak;
    fx_mem_stats(&mem0, &peak);
    if ((rc = fx_model_create(&m, &a.cfg, 1)) != FX_OK || (rc = fx__model_alloc_train(m)) != FX_OK) {
        cli_fail(rc, "bench train");
        goto done;
    }
    fx_mem_stats(&mem_whole, &peak);
    if ((rc = fx__dist_create(&dist, m, world, a.par, false, batch)) != FX_OK) {
        if (fx_comm_status(world) != FX_OK)
            bench_comm_failed();
        cli_fail(rc, "bench train");
        goto done;
    }
    fx_mem_stats(&mem_sharded, &peak);
    fx__model_train_state s = {.steps = 1000, .warmup = 10, .batch = batch, .seq = seq, .accum = 1, .lr = 1e-4f,
                             .min_lr = 1e-5f, .weight_decay = 0.1f, .clip = 1.0f, .beta1 = 0.9f, .beta2 = 0.95f};
    fx_rng_init(&s.rng, 1, 1);
    static dist_run run; /* 5 KiB of samples */
    if ((rc = dist_time_steps(dist, world, &data.d, &s, data.tok, data.tgt, a.steps, &run)) != FX_OK) {
        cli_fail(rc, "bench train");
        goto done;
    }
    float med[DIST_MEDIANS];
    dist_slowest_medians(world, &run, a.steps, med);
    const dist_mem mem = {.state = fx__dist_state_bytes(dist),
                          .shards = fx__dist_shard_bytes(dist),
                          .layer = fx__dist_layer_bytes(dist),
                          .full_state = 4 * m->lay.total * sizeof(float),
                          .allocated = mem_sharded - mem0,
                          .allocated_whole = mem_whole - mem0};
    if (rank == 0)
        dist_report(&a, m, N, &run, med, &mem);
    exit_code = CLI_EXIT_OK;
done:
    fx__dist_free(dist);
    fx_model_free(m);
    bench_train_data_free(&data);
    fx_comm_free(world);
    if (fx_comm_finalize() != FX_OK)
        bench_comm_failed();
    return exit_code;
}
