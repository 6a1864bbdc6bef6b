/* flexc train: trains the GPT of src/model on a text file or the default corpus, with
   checkpoints, resume, progress and metrics. See docs/train.md. */
#include "cli.h"

#include "train_data.h"

#include "bench/util.h"
#include "core/file.h"
#include "cuda/model_gpu.h"
#include "model/dist.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/run_params.h"
#include "outdir_lock.h"
#include "save_check.h"

#include <flexc/mod.h>

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


/* The signal that asks the run to stop after its current step (0: none; -1: a reason other
   than a signal to this process). */
static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { interrupted = sig; }

typedef struct train_opts {
    const char *data, *model, *attn, *score_mod, *mask_mod, *out, *parallel, *comm_log, *dtype, *device, *lora_targets;
    int64_t steps, batch, seq, seed, threads, accum, warmup, save_every, eval_every, eval_batches, log_every, until;
    int64_t layers, dim, heads, kv_heads, lora;
    double lora_alpha, lora_dropout;
    double lr, min_lr, weight_decay, clip, beta1, beta2, val_frac, comm_timeout;
    bool resume, quiet, bf16, force, adam_bf16, recompute, deterministic, no_memory_check;
    bool lossy_text;
} train_opts;

/* Marks an option the user did not give: a value no option accepts, so that "--steps -1"
   is refused rather than taken for the default. */
#define UNSET INT64_MIN

/* The outermost directory this run created for --out ("" if none): a run that fails before
   writing anything removes what it created, rather than leave empty directories behind. */
static char out_made[4096];

static int mkdir_made(const char *path)
{
    if (mkdir(path, 0777) == 0) {
        if (!out_made[0])
            snprintf(out_made, sizeof out_made, "%s", path);
        return 0;
    }
    return errno == EEXIST ? 0 : -1;
}

/* Removes the --out directories this run created, innermost first, where they are empty. */
static void out_unmake(const char *dir)
{
    char buf[4096];
    if (!out_made[0] || snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return;
    for (;;) {
        if (rmdir(buf) != 0 || strcmp(buf, out_made) == 0)
            return;
        char *slash = strrchr(buf, '/');
        if (!slash || slash == buf)
            return;
        *slash = '\0';
    }
}

static int mkdir_p(const char *dir)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return -1;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir_made(buf) != 0)
            return -1;
        *p = '/';
    }
    if (mkdir_made(buf) != 0)
        return -1;
    struct stat st;
    if (stat(buf, &st) == 0 && S_ISDIR(st.st_mode))
        return 0;
    errno = ENOTDIR; /* a file of that name: mkdir's EEXIST would read "File exists" */
    return -1;
}

/* The output directory must exist (or be creatable) and take a file, before any work. */
static int check_out_dir(const char *dir)
{
    if (mkdir_p(dir) != 0) {
        cli_error("--out %s: cannot create the directory: %s", dir, strerror(errno ? errno : ENOTDIR));
        return CLI_EXIT_FAIL;
    }
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.flexc-write-test.%d", dir, (int)getpid());
    FILE *f = fopen(probe, "wb");
    if (!f) {
        cli_error("--out %s: the directory is not writable: %s", dir, strerror(errno));
        return CLI_EXIT_FAIL;
    }
    fclose(f);
    remove(probe);
    return CLI_EXIT_OK;
}

static bool file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static void fmt_duration(char *buf, size_t n, double s)
{
    if (!(s >= 0) || s > 1e7)
        snprintf(buf, n, "--");
    else if (s >= 3600)
        snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    else if (s >= 60)
        snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else
        snprintf(buf, n, "%ds", (int)s);
}

/* Keeps the metrics lines of steps <= last (a resumed run rewrites what came after its
   checkpoint); a fresh run starts an empty file. */
static int metrics_open(FILE **out, const char *path, int64_t last, bool resume)
{
    if (resume && file_exists(path)) {
        bool not_regular;
        FILE *in = fx__fopen_regular(path, &not_regular); /* a FIFO there would block the read */
        if (!in) {
            cli_error("cannot read %s: %s", path, not_regular ? "not a regular file" : strerror(errno));
            return CLI_EXIT_FAIL;
        }
        char tmp[4300];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *o = fopen(tmp, "wb");
        if (!o) {
            fclose(in);
            cli_error("cannot write %s: %s", tmp, strerror(errno));
            return CLI_EXIT_FAIL;
        }
        char line[4096];
        while (fgets(line, sizeof line, in)) {
            const char *p = strstr(line, "\"step\":");
            if (p && strtoll(p + 7, NULL, 10) <= last)
                fputs(line, o);
        }
        fclose(in);
        if (fclose(o) != 0 || rename(tmp, path) != 0) {
            cli_error("cannot rewrite %s: %s", path, strerror(errno));
            return CLI_EXIT_FAIL;
        }
    }
    *out = fopen(path, resume ? "ab" : "wb");
    if (!*out) {
        cli_error("cannot write %s: %s", path, strerror(errno));
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}

/* "--batch 0 is outside [1, 65536]", or "--steps 0 must be >= 1" where there is no upper bound. */
static int int_outside(const char *opt, int64_t v, int64_t lo, int64_t hi)
{
    if (hi == INT64_MAX)
        cli_error("%s %lld must be >= %lld", opt, (long long)v, (long long)lo);
    else
        cli_error("%s %lld is outside [%lld, %lld]", opt, (long long)v, (long long)lo, (long long)hi);
    return CLI_EXIT_USAGE;
}

/* On resume, an option given on the command line must agree with the checkpoint. */
static int resume_mismatch(const char *opt, long long given, long long saved)
{
    cli_error("--resume: the checkpoint was trained with %s %lld, not %lld (drop %s, or start a new run "
              "in another --out)",
              opt, saved, given, opt);
    return CLI_EXIT_USAGE;
}

/* After a communication failure (a lost or diverging peer) the process reports and exits at
   once: MPI may still write the buffers of the failed collectives, and finalising with a
   lost peer can hang. */
static _Noreturn void comm_failed(void)
{
    fflush(stdout);
    cli_error("%s", fx_last_error());
    exit(CLI_EXIT_FAIL);
}

static bool comm_broken(fx_comm *world, const fx__dist *dist)
{
    return world && (fx_comm_status(world) != FX_OK || fx__dist_status(dist) != FX_OK);
}

/* Whether every rank reports ok (a collective: all ranks call it at the same point). */
static bool all_ok(fx_comm *world, bool ok)
{
    if (!world)
        return ok;
    float bad = ok ? 0.0f : 1.0f;
    if (fx_comm_all_reduce(world, &bad, 1, NULL) != FX_OK)
        comm_failed();
    return bad == 0.0f;
}

static int save_all(fx__model *m, const fx__model_train_state *s, const char *out, bool bf16)
{
    char path[4200];
    /* Training on a GPU: the writer reads the host's buffers, brought up to date first. */
    int rc = m->gpu ? fx__model_gpu_download(m) : FX_OK;
    if (rc)
        return cli_fail(rc, "reading the weights from the GPU");
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", out);
    rc = fx__model_save_checkpoint(m, s, path);
    if (rc)
        return cli_fail(rc, "saving the checkpoint");
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    rc = fx_model_save(m, path, bf16);
    if (rc)
        return cli_fail(rc, "saving the model");
    return CLI_EXIT_OK;
}

static int train_run(const train_opts *op, fx__par par, fx_comm *world, int rank, int nproc);

/* Saves from rank 0; under FSDP every rank takes part in gathering the shards first. */
static int save_dist(fx__model *m, fx__dist *dist, fx_comm *world, const fx__model_train_state *s, const char *out,
                     bool bf16)
{
    if (!dist)
        return save_all(m, s, out, bf16);
    fx__model *full = NULL;
    int rc = fx__dist_full(dist, &full);
    if (rc && comm_broken(world, dist))
        comm_failed();
    if (rc)
        return cli_fail(rc, "gathering the checkpoint");
    int ret = CLI_EXIT_OK;
    if (full)
        ret = save_all(full, s, out, bf16);
    fx__dist_full_release(dist, full);
    return all_ok(world, ret == CLI_EXIT_OK) ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}

/* --device: a device this build can reach, and no option the GPU step does not take (docs/cuda.md,
   "Training on the GPU"). */
static int device_check(const train_opts *o, fx__par par)
{
    bool cuda = false;
    if (o->device && strcmp(o->device, "cuda") == 0) {
        const struct { bool on; const char *opt, *why; } no[] = {
            {par != FX__PAR_NONE, par == FX__PAR_DDP ? "--parallel ddp" : "--parallel fsdp", "one GPU, one process"},
            {o->deterministic, "--deterministic", "the GPU step repeats bitwise without it"},
            {o->recompute, "--recompute", "every activation is kept in device memory"},
            {o->adam_bf16, "--adam-bf16", "the Adam moments stay float32"},
            {o->attn && strcmp(o->attn, "dense") == 0, "--attn dense", "the dense baseline is the CPU's"},
            {o->mask_mod || o->score_mod, o->mask_mod ? "--mask-mod" : "--score-mod", "attention mods run on the CPU"}};
        for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
            if (no[i].on) {
                cli_error("--device cuda does not take %s (%s)", no[i].opt, no[i].why);
                return CLI_EXIT_USAGE;
            }
    }
    return cli_device(o->device, &cuda);
}

/* The training state's field key (run_params.c) outside its range: "--batch 0 is outside
   [1, 65536]", "--steps 0 must be >= 1", named by its option; CLI_EXIT_OK when within. */
static int state_outside(const fx__model_train_state *st, const char *key, int64_t ctx)
{
    const fx__run_param *p = fx__run_param_find(key);
    int64_t v = *(const int64_t *)((const char *)st + p->offset);
    if (fx__run_param_ok_i64(p, v, ctx))
        return CLI_EXIT_OK;
    char rule[64];
    fx__run_param_rule(p, ctx, rule, sizeof rule);
    cli_error("%s %lld %s", p->option, (long long)v, rule);
    return CLI_EXIT_USAGE;
}

/* --lora's settings in range, given only with --lora, and no option the LoRA step does not
   take (docs/lora.md). */
static int lora_opts_check(const train_opts *o, fx__par par)
{
    if (o->lora == UNSET) {
        const char *stray = !isnan(o->lora_alpha)     ? "--lora-alpha"
                            : !isnan(o->lora_dropout) ? "--lora-dropout"
                            : o->lora_targets         ? "--lora-targets"
                                                      : NULL;
        if (stray && !o->resume) {
            cli_error("%s goes with --lora R (the adapters' rank)", stray);
            return CLI_EXIT_USAGE;
        }
        return CLI_EXIT_OK;
    }
    if (o->lora < 1 || o->lora > 65536)
        return int_outside("--lora", o->lora, 1, 65536);
    if (!isnan(o->lora_alpha) && !(isfinite(o->lora_alpha) && o->lora_alpha > 0)) {
        cli_error("--lora-alpha %g must be > 0", o->lora_alpha);
        return CLI_EXIT_USAGE;
    }
    if (!isnan(o->lora_dropout) && !(o->lora_dropout >= 0 && o->lora_dropout < 1)) {
        cli_error("--lora-dropout %g must be in [0, 1)", o->lora_dropout);
        return CLI_EXIT_USAGE;
    }
    unsigned targets;
    if (o->lora_targets && fx__lora_targets_parse(o->lora_targets, &targets) != FX_OK) {
        cli_error("--lora-targets %s: %s", o->lora_targets, fx_last_error());
        return CLI_EXIT_USAGE;
    }
    const struct { bool on; const char *opt, *why; } no[] = {
        {par == FX__PAR_FSDP, "--parallel fsdp",
         "it shards the weights that train, and the adapters are small enough for every process to hold: use "
         "--parallel ddp"},
        {o->device && !strcmp(o->device, "cuda"), "--device cuda", "the LoRA step runs on the CPU"},
        {o->adam_bf16, "--adam-bf16", "the adapters' moments stay float32"},
        {o->bf16, "--bf16", "a LoRA run writes its adapters, not a model file"}};
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        if (no[i].on) {
            cli_error("--lora does not take %s (%s)", no[i].opt, no[i].why);
            return CLI_EXIT_USAGE;
        }
    return CLI_EXIT_OK;
}

/* --score-mod and --mask-mod: each compiles, and is of its kind; --mask-mod replaces --attn. */
static int mods_opts_check(const train_opts *o)
{
    if (o->mask_mod && o->attn) {
        cli_error("--attn %s and --mask-mod both give the attention mask: pass one of them (a built-in mask is an "
                  "expression too, e.g. --mask-mod \"q_idx >= kv_idx\" for causal)", o->attn);
        return CLI_EXIT_USAGE;
    }
    if (o->score_mod && o->attn && !strcmp(o->attn, "dense")) {
        cli_error("--attn dense makes causality a score modifier of its own: it takes no --score-mod (use --attn "
                  "causal)");
        return CLI_EXIT_USAGE;
    }
    const struct { const char *opt, *src; bool mask; } mod[] = {{"--score-mod", o->score_mod, false},
                                                                {"--mask-mod", o->mask_mod, true}};
    for (size_t i = 0; i < 2; i++) {
        struct fx_mod *md = NULL;
        if (!mod[i].src)
            continue;
        if (fx__model_mod_compile(&md, mod[i].src, mod[i].mask) != FX_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", fx_last_error());
            /* An expression of the other kind compiles on its own: say where it goes. */
            const bool kind = strlen(mod[i].src) < FX__MOD_SRC_MAX && fx_mod_compile(&md, mod[i].src, NULL, 0) == FX_OK;
            fx_mod_free(md);
            cli_error("%s: %s%s", mod[i].opt, why,
                      kind ? (mod[i].mask ? " (a score modifier goes to --score-mod)" : " (a mask goes to --mask-mod)")
                           : "");
            return CLI_EXIT_USAGE;
        }
        fx_mod_free(md);
    }
    return CLI_EXIT_OK;
}

/* The checks of train's options that need neither data nor a model; *par the --parallel mode.
   A usage error is printed and its exit code returned. */
static int train_opts_check(const train_opts *o, fx__par *par)
{
    /* (mkdir_p would read past the end of an empty name.) */
    if (!o->out[0]) {
        cli_error("--out: the directory name is empty");
        return CLI_EXIT_USAGE;
    }
    if (o->resume && o->force) {
        cli_error("--resume continues the checkpoint in --out and --force starts over: pass one of them");
        return CLI_EXIT_USAGE;
    }
    /* Checkpoints record the seed as a signed integer: a negative one could not be read back. */
    if (o->seed != UNSET && o->seed < 0)
        return int_outside("--seed", o->seed, 0, INT64_MAX);
    if (o->dtype && strcmp(o->dtype, "f32") != 0 && strcmp(o->dtype, "bf16") != 0) {
        cli_error("--dtype %s: expected f32 or bf16", o->dtype);
        return CLI_EXIT_USAGE;
    }
    if (fx__par_parse(o->parallel, par) != FX_OK) {
        cli_error("%s", fx_last_error());
        return CLI_EXIT_USAGE;
    }
    if (o->comm_log && *par == FX__PAR_NONE) {
        cli_error("--comm-log %s: there are no collectives to record without --parallel ddp or fsdp", o->comm_log);
        return CLI_EXIT_USAGE;
    }
    int rc = device_check(o, *par);
    if (rc != CLI_EXIT_OK || (rc = lora_opts_check(o, *par)) != CLI_EXIT_OK || (rc = mods_opts_check(o)) != CLI_EXIT_OK)
        return rc;
    if (!(o->comm_timeout > 0)) {
        cli_error("--comm-timeout %g must be > 0 seconds", o->comm_timeout);
        return CLI_EXIT_USAGE;
    }
    /* Several processes started by mpirun without --parallel would each train alone and
       overwrite each other's files. */
    const char *np_env = getenv("OMPI_COMM_WORLD_SIZE");
    if (*par == FX__PAR_NONE && np_env && atoi(np_env) > 1) {
        cli_error("running as one of %s processes (mpirun): pass --parallel ddp or fsdp", np_env);
        return CLI_EXIT_USAGE;
    }
    return CLI_EXIT_OK;
}

/* The processes of mpirun under --parallel: the world communicator, with --comm-timeout and
   --comm-log; ranks other than 0 go quiet, and without --threads the processes of one node
   share its cores. */
static int train_comm_open(train_opts *o, fx_comm **world, int *rank, int *nproc)
{
    int rc;
    if ((rc = fx_comm_init(world, NULL, NULL)) != FX_OK)
        return cli_fail(rc, o->parallel[0] == 'd' ? "--parallel ddp" : "--parallel fsdp");
    *rank = fx_comm_rank(*world), *nproc = fx_comm_size(*world);
    fx_comm_set_timeout(*world, o->comm_timeout);
    fx_comm_set_dump_fd(2);
    fx_comm_install_sigusr1();
    if (o->comm_log && (rc = fx_comm_log_open(o->comm_log)) != FX_OK) {
        fx_comm_free(*world);
        *world = NULL;
        return cli_fail(rc, "--comm-log");
    }
    if (*rank != 0)
        o->quiet = true; /* only rank 0 prints and writes */
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (!o->threads && local && atoi(local) > 1) {
        int t = fx_get_num_threads() / atoi(local);
        fx_set_num_threads(t > 1 ? t : 1);
    }
    return CLI_EXIT_OK;
}

int cmd_train(int argc, char **argv)
{
    train_opts o = {.model = NULL, .attn = NULL, .out = "out", .steps = UNSET, .batch = UNSET, .seq = UNSET,
                    .seed = UNSET, .threads = 0, .accum = UNSET, .warmup = UNSET, .save_every = 0,
                    .eval_every = UNSET, .eval_batches = 4, .log_every = UNSET, .until = UNSET, .layers = UNSET,
                    .dim = UNSET, .heads = UNSET, .kv_heads = UNSET, .lora = UNSET,
                    .lora_alpha = NAN, .lora_dropout = NAN, .lr = NAN, .min_lr = NAN,
                    .weight_decay = NAN, .clip = NAN, .beta1 = 0.9, .beta2 = 0.95, .val_frac = 0.05,
                    .parallel = "none", .comm_timeout = FX_COMM_DEFAULT_TIMEOUT};
    const cli_opt opts[] = {
        {"--data", CLI_STRING, &o.data, "UTF-8 text to train on (default: the fortunes corpus)"},
        {"--lossy-text", CLI_FLAG, &o.lossy_text, "a Hugging Face model's --data may hold invalid UTF-8 (as U+FFFD)"},
        {"--model", CLI_STRING, &o.model, "tiny | small | gpt2, or a directory to fine-tune (default small)"},
        {"--layers", CLI_INT, &o.layers, "override the preset's layer count"},
        {"--dim", CLI_INT, &o.dim, "override the model width"},
        {"--heads", CLI_INT, &o.heads, "override the query heads"},
        {"--kv-heads", CLI_INT, &o.kv_heads, "override the key/value heads (GQA)"},
        {"--seq", CLI_INT, &o.seq, "sequence length T (default: the model's context)"},
        {"--attn", CLI_STRING, &o.attn, "causal | sliding:W | document | dense (default causal)"},
        {"--mask-mod", CLI_STRING, &o.mask_mod,
         "the attention mask as an expression over b, h, q_idx, kv_idx, in place of --attn (docs/attention.md)"},
        {"--score-mod", CLI_STRING, &o.score_mod,
         "a score modifier as an expression over score, b, h, q_idx, kv_idx, on top of the mask"},
        {"--steps", CLI_INT, &o.steps, "optimizer steps (default 1000)"},
        {"--batch", CLI_INT, &o.batch, "sequences per micro-batch (default 8)"},
        {"--accum", CLI_INT, &o.accum, "micro-batches per step (default 1)"},
        {"--lr", CLI_FLOAT, &o.lr, "peak learning rate (default 1e-3)"},
        {"--min-lr", CLI_FLOAT, &o.min_lr, "final learning rate of the cosine (default lr/10)"},
        {"--warmup", CLI_INT, &o.warmup, "linear warmup steps (default steps/20, at most 100)"},
        {"--weight-decay", CLI_FLOAT, &o.weight_decay, "AdamW decay on matrices (default 0.1)"},
        {"--clip", CLI_FLOAT, &o.clip, "gradient norm clip, 0 = off (default 1.0)"},
        {"--seed", CLI_INT, &o.seed, "initialisation and sampling seed (default 1337)"},
        {"--out", CLI_STRING, &o.out, "output directory (default out)"},
        {"--resume", CLI_FLAG, &o.resume, "continue from OUT/checkpoint.safetensors"},
        {"--force", CLI_FLAG, &o.force, "start over even if OUT holds a checkpoint"},
        {"--until", CLI_INT, &o.until, "stop after this step (checkpoint saved), keeping the schedule of --steps"},
        {"--save-every", CLI_INT, &o.save_every, "checkpoint every N steps (default: at the end)"},
        {"--eval-every", CLI_INT, &o.eval_every, "validation loss every N steps (default steps/10)"},
        {"--eval-batches", CLI_INT, &o.eval_batches, "validation batches per evaluation (default 4)"},
        {"--log-every", CLI_INT, &o.log_every, "progress line every N steps when not on a terminal"},
        {"--dtype", CLI_STRING, &o.dtype, "f32 | bf16: the matrix products' inputs (default f32; see docs/train.md)"},
        {"--bf16", CLI_FLAG, &o.bf16, "write model.safetensors in bfloat16"},
        {"--adam-bf16", CLI_FLAG, &o.adam_bf16, "keep the Adam moments in bfloat16 (half the optimizer memory)"},
        {"--recompute", CLI_FLAG, &o.recompute, "keep only layer inputs, recompute the rest in backward"},
        {"--lora", CLI_INT, &o.lora, "train LoRA adapters of rank R on a frozen Hugging Face --model (docs/lora.md)"},
        {"--lora-alpha", CLI_FLOAT, &o.lora_alpha, "the adapters' scale is alpha / R (default 2R)"},
        {"--lora-dropout", CLI_FLOAT, &o.lora_dropout, "dropout on the adapters' input, in [0, 1) (default 0)"},
        {"--lora-targets", CLI_STRING, &o.lora_targets,
         "the projections adapted: a subset of q,k,v,o,gate,up,down (default all)"},
        {"--device", CLI_STRING, &o.device, "cpu | cuda: where the training step runs (default cpu; docs/cuda.md)"},
        {"--threads", CLI_INT, &o.threads, "threads (default: all cores)"},
        {"--quiet", CLI_FLAG, &o.quiet, "no progress output"},
        {"--no-memory-check", CLI_FLAG, &o.no_memory_check, "train even when the run does not fit in memory"},
        {"--parallel", CLI_STRING, &o.parallel, "none | ddp | fsdp: training over the processes of mpirun"},
        {"--deterministic", CLI_FLAG, &o.deterministic, "bitwise the same results at any process count"},
        {"--comm-timeout", CLI_FLOAT, &o.comm_timeout, "seconds before a collective fails (default 600)"},
        {"--comm-log", CLI_STRING, &o.comm_log, "JSON-lines log of every collective, per rank ({rank} in FILE)"},
    };
    int rc = cli_parse("train", "[options]", argc, argv, opts, sizeof opts / sizeof opts[0], NULL, 0, NULL);
    if (rc == CLI_PARSE_HELP)
        return CLI_EXIT_OK;
    if (rc != CLI_PARSE_OK)
        return rc;
    if ((rc = cli_threads("train", o.threads)) != CLI_EXIT_OK)
        return rc;
    if (o.no_memory_check)
        fx__mem_set_check(false);
    fx__par par;
    if ((rc = train_opts_check(&o, &par)) != CLI_EXIT_OK)
        return rc;
    fx_comm *world = NULL;
    int rank = 0, nproc = 1;
    if (par != FX__PAR_NONE && (rc = train_comm_open(&o, &world, &rank, &nproc)) != CLI_EXIT_OK)
        return rc;
    rc = train_run(&o, par, world, rank, nproc);
    outdir_unlock();
    if (rc == CLI_EXIT_FAIL || rc == CLI_EXIT_USAGE)
        out_unmake(o.out);
    fx_comm_log_close();
    fx_comm_free(world);
    if (world && fx_comm_finalize() != FX_OK)
        comm_failed();
    return rc;
}

/* One run of train_run: its options, the configuration and schedule they give, and what it
   holds while it trains (released by job_free). */
typedef struct train_job {
    train_opts o;
    fx__par par;
    fx_comm *world;
    int rank, nproc;
    char ckpt[4200], mpath[4200];
    fx_model_config cfg;
    fx__model_train_state st;
    int64_t until, eval_every, log_every;
    fx__model_data data;
    bool have_data;
    fx_model *init; /* --model DIR: the model to fine-tune, until setup_model takes it over */
    bool lora;          /* --lora: adapters on a frozen, mapped base */
    bool keep_hf;       /* a new run from --model: at the first save its Hugging Face config and
                           tokenizer, if it has them, go to out/hf (every rank: the save's collective) */
    fx__lora_config lc; /* their settings */
    char base[4096];    /* and the base's directory (absolute) */
    fx__model *m;
    fx__dist *dist;
    int32_t *tokens, *targets;
    double step_tokens; /* tokens a step trains on */
    FILE *metrics;
    bool tty, metrics_failed;
    float first_loss, last_loss;
    fx__model_mem mem;   /* the planned peak (train_memory) */
    fx__mem_avail avail; /* and what was available then */
} train_job;

/* ---- configuration: the checkpoint's on resume, which the options may repeat, not change ---- */

/* --layers, --dim, --heads, --kv-heads over a preset: what a new run builds, and what a
   resume's --model must name. */
static void shape_options(const train_opts *o, fx_model_config *c)
{
    if (o->layers != UNSET)
        c->layers = o->layers;
    if (o->dim != UNSET)
        c->dim = o->dim, c->ffn = 0;
    if (o->heads != UNSET)
        c->heads = o->heads;
    if (o->kv_heads != UNSET)
        c->kv_heads = o->kv_heads;
    else if (o->heads != UNSET && c->heads % c->kv_heads)
        c->kv_heads = c->heads;
}

/* --model given on a resume: a preset (with any --layers, --dim, --heads, --kv-heads) that
   names the checkpoint's model. */
static int resume_model(const train_job *j)
{
    const train_opts *o = &j->o;
    const fx_model_config *cfg = &j->cfg;
    fx_model_config p;
    if (fx__model_preset(&p, o->model) != FX_OK) {
        cli_error("--resume: the checkpoint holds the model; --model %s is not a preset (drop --model)", o->model);
        return CLI_EXIT_USAGE;
    }
    shape_options(o, &p);
    /* The configuration a new run would build, compared field by field (config.c's table). */
    const fx__config_field *d = NULL;
    char why[300] = "";
    if (fx__model_config_check(&p) != FX_OK)
        snprintf(why, sizeof why, " (%s)", fx_last_error());
    else if ((d = fx__config_diff(&p, cfg)) != NULL) {
        char saved[96], given[96];
        fx__config_field_format(d, cfg, saved, sizeof saved);
        fx__config_field_format(d, &p, given, sizeof given);
        snprintf(why, sizeof why, " (its %s is %s, --model %s's %s)", d->key, saved, o->model, given);
    }
    if (why[0]) {
        cli_error("--resume: %s holds a model with %lld layers, dim %lld, %lld/%lld heads, context %lld, "
                  "not --model %s%s",
                  j->ckpt, (long long)cfg->layers, (long long)cfg->dim, (long long)cfg->heads,
                  (long long)cfg->kv_heads, (long long)cfg->ctx, o->model, why);
        return CLI_EXIT_USAGE;
    }
    return CLI_EXIT_OK;
}

/* The options that shape the model and its batches, and the mask: as the checkpoint's. */
static int resume_shape(const train_job *j)
{
    const train_opts *o = &j->o;
    const fx_model_config *cfg = &j->cfg;
    const fx__model_train_state *st = &j->st;
    const struct { const char *name; int64_t given, saved; } chk[] = {
        {"--layers", o->layers, cfg->layers}, {"--dim", o->dim, cfg->dim}, {"--heads", o->heads, cfg->heads},
        {"--kv-heads", o->kv_heads, cfg->kv_heads}, {"--batch", o->batch, st->batch}, {"--seq", o->seq, st->seq},
        {"--accum", o->accum, st->accum}, {"--warmup", o->warmup, st->warmup}};
    for (size_t i = 0; i < sizeof chk / sizeof chk[0]; i++)
        if (chk[i].given != UNSET && chk[i].given != chk[i].saved)
            return resume_mismatch(chk[i].name, chk[i].given, chk[i].saved);
    const bool mod = !strcmp(st->attn, "mod");
    if (o->attn && (mod || strcmp(o->attn, st->attn) != 0)) {
        if (mod)
            cli_error("--resume: the checkpoint was trained with --mask-mod \"%s\", not --attn %s", st->mask_mod,
                      o->attn);
        else
            cli_error("--resume: the checkpoint was trained with --attn %s, not %s", st->attn, o->attn);
        return CLI_EXIT_USAGE;
    }
    if (o->mask_mod && strcmp(o->mask_mod, st->mask_mod) != 0) {
        if (mod)
            cli_error("--resume: the checkpoint was trained with --mask-mod \"%s\", not \"%s\" (drop --mask-mod, or "
                      "start a new run in another --out)", st->mask_mod, o->mask_mod);
        else
            cli_error("--resume: the checkpoint was trained with --attn %s, not --mask-mod \"%s\"", st->attn,
                      o->mask_mod);
        return CLI_EXIT_USAGE;
    }
    if (o->score_mod && strcmp(o->score_mod, st->score_mod) != 0) {
        if (st->score_mod[0])
            cli_error("--resume: the checkpoint was trained with --score-mod \"%s\", not \"%s\" (drop --score-mod, "
                      "or start a new run in another --out)", st->score_mod, o->score_mod);
        else
            cli_error("--resume: the checkpoint was trained without --score-mod (drop it, or start a new run in "
                      "another --out)");
        return CLI_EXIT_USAGE;
    }
    return CLI_EXIT_OK;
}

/* The hyperparameters, the seed and the arithmetic (--dtype, --adam-bf16, --deterministic):
   as the checkpoint's, or taken from it. */
static int resume_run(train_job *j)
{
    train_opts *o = &j->o;
    const fx__model_train_state *st = &j->st;
    /* These would change the run too. A checkpoint keeps them as float32, and the default
       --min-lr is computed in float32 (lr/10), so "the same" is within float rounding. */
    const struct { const char *name; double given; float saved; } hp[] = {
        {"--lr", o->lr, st->lr}, {"--min-lr", o->min_lr, st->min_lr},
        {"--weight-decay", o->weight_decay, st->weight_decay}, {"--clip", o->clip, st->clip}};
    for (size_t i = 0; i < sizeof hp / sizeof hp[0]; i++)
        if (!isnan(hp[i].given) && fabs(hp[i].given - (double)hp[i].saved) > 1e-6 * fabs((double)hp[i].saved)) {
            cli_error("--resume: the checkpoint was trained with %s %g, not %g", hp[i].name, (double)hp[i].saved,
                      hp[i].given);
            return CLI_EXIT_USAGE;
        }
    if (o->seed != UNSET && (uint64_t)o->seed != st->seed) {
        cli_error("--resume: the checkpoint was trained with --seed %llu, not %lld (its sampler state is "
                  "restored; drop --seed)",
                  (unsigned long long)st->seed, (long long)o->seed);
        return CLI_EXIT_USAGE;
    }
    if (o->dtype && (strcmp(o->dtype, "bf16") == 0) != st->bf16) {
        cli_error("--resume: the checkpoint was trained with --dtype %s, not %s (drop --dtype)",
                  st->bf16 ? "bf16" : "f32", o->dtype);
        return CLI_EXIT_USAGE;
    }
    if (o->adam_bf16 && !st->adam_bf16) {
        cli_error("--resume: the checkpoint keeps its Adam moments in float32; drop --adam-bf16");
        return CLI_EXIT_USAGE;
    }
    /* --deterministic sums the gradients in another order: a run keeps the mode it started
       with, so a resume need not repeat the flag. */
    if (o->deterministic && !st->deterministic) {
        cli_error("--resume: the checkpoint was trained without --deterministic (drop --deterministic, or start "
                  "a new run in another --out)");
        return CLI_EXIT_USAGE;
    }
    if (st->deterministic && !o->deterministic) {
        o->deterministic = true;
        if (!o->quiet)
            printf("note: the checkpoint was trained with --deterministic; continuing with it\n");
    }
    return CLI_EXIT_OK;
}

/* --steps on a resume: at least the checkpoint's step; it extends or shortens the schedule. */
static int resume_steps(train_job *j)
{
    const train_opts *o = &j->o;
    fx__model_train_state *st = &j->st;
    if (o->steps != UNSET && o->steps < 1) {
        cli_error("--steps %lld must be >= 1", (long long)o->steps);
        return CLI_EXIT_USAGE;
    }
    if (o->steps != UNSET && o->steps < st->step) {
        cli_error("--resume: --steps %lld is below the checkpoint's step %lld (the schedule may end at or after "
                  "it)", (long long)o->steps, (long long)st->step);
        return CLI_EXIT_USAGE;
    }
    if (o->steps != UNSET)
        st->steps = o->steps;
    return CLI_EXIT_OK;
}

/* A LoRA run's checkpoint: its adapters' settings, which the options may repeat, and its base,
   mapped again (it must still be the model the adapters were trained on). */
static int lora_resume(train_job *j)
{
    const train_opts *o = &j->o;
    fx__lora_source src;
    bool found;
    int rc = fx__lora_source_find(j->ckpt, &src, &found);
    if (rc != FX_OK)
        return cli_fail(rc, "--resume");
    if (!found) {
        if (o->lora != UNSET) {
            cli_error("--resume: %s is a full fine-tuning run's checkpoint; drop --lora", j->ckpt);
            return CLI_EXIT_USAGE;
        }
        return CLI_EXIT_OK;
    }
    const fx__lora_config *lc = &src.cfg;
    unsigned targets = lc->targets;
    if (o->lora_targets)
        fx__lora_targets_parse(o->lora_targets, &targets);
    char saved[64];
    fx__lora_targets_format(lc->targets, saved, sizeof saved);
    if ((o->lora != UNSET && o->lora != lc->rank) ||
        (!isnan(o->lora_alpha) && (float)o->lora_alpha != lc->alpha) ||
        (!isnan(o->lora_dropout) && (float)o->lora_dropout != lc->dropout) || targets != lc->targets) {
        cli_error("--resume: the checkpoint trains LoRA adapters of rank %lld, alpha %g, dropout %g on %s; drop the "
                  "--lora options that differ", (long long)lc->rank, (double)lc->alpha, (double)lc->dropout, saved);
        return CLI_EXIT_USAGE;
    }
    struct stat a, b;
    char basecfg[4200];
    snprintf(basecfg, sizeof basecfg, "%s/config.json", src.base);
    if (!file_exists(basecfg)) {
        cli_error("--resume: the checkpoint's base model %s is not a Hugging Face model directory here (the adapters "
                  "train on top of the base they started on)", src.base);
        return CLI_EXIT_FAIL;
    }
    if (o->model && (stat(o->model, &a) != 0 || stat(src.base, &b) != 0 || a.st_dev != b.st_dev ||
                     a.st_ino != b.st_ino)) {
        cli_error("--resume: the checkpoint's adapters are on the base model %s, not --model %s (drop --model)",
                  src.base, o->model);
        return CLI_EXIT_USAGE;
    }
    fx_model_config bc;
    if ((rc = cli_model_open_for("the checkpoint's base model", src.base, &bc, &j->init, true)) != CLI_EXIT_OK)
        return rc;
    const fx__config_field *d = fx__config_diff(&bc, &j->cfg);
    if (d) {
        cli_error("--resume: the base model %s is no longer the one the adapters were trained on (its %s differs)",
                  src.base, d->key);
        return CLI_EXIT_FAIL;
    }
    j->lora = true;
    j->lc = *lc;
    snprintf(j->base, sizeof j->base, "%s", src.base);
    return CLI_EXIT_OK;
}

static int config_resume(train_job *j)
{
    if (!file_exists(j->ckpt)) {
        cli_error("--resume: no checkpoint at %s", j->ckpt);
        return CLI_EXIT_FAIL;
    }
    bool adam = false;
    int rc = fx__model_read_config(j->ckpt, &j->cfg, &j->st, &adam);
    if (rc != FX_OK)
        return cli_fail(rc, "--resume");
    if (!adam) {
        cli_error("--resume: %s holds no optimizer state", j->ckpt);
        return CLI_EXIT_FAIL;
    }
    if ((rc = lora_resume(j)) != CLI_EXIT_OK)
        return rc;
    if (!j->lora && j->o.model && (rc = resume_model(j)) != CLI_EXIT_OK)
        return rc;
    if ((rc = resume_shape(j)) != CLI_EXIT_OK || (rc = resume_run(j)) != CLI_EXIT_OK)
        return rc;
    return resume_steps(j);
}

/* The optimizer's settings of a new run: the options' float32 values, checked. */
static int config_new_optimizer(const train_opts *o, fx__model_train_state *st)
{
    st->lr = isnan(o->lr) ? 1e-3f : (float)o->lr;
    st->min_lr = isnan(o->min_lr) ? st->lr / 10.0f : (float)o->min_lr;
    st->weight_decay = isnan(o->weight_decay) ? 0.1f : (float)o->weight_decay;
    st->clip = isnan(o->clip) ? 1.0f : (float)o->clip;
    st->beta1 = (float)o->beta1;
    st->beta2 = (float)o->beta2;
    /* The float32 values are checked: a positive --lr below float's range would train at 0.
       Their ranges are the table's (model/run_params.c), which checkpoints are held to too;
       the message shows the value as given. */
    const struct { const char *key; double given; float value; } fl[] = {
        {"lr", isnan(o->lr) ? 1e-3 : o->lr, st->lr},
        {"min_lr", isnan(o->min_lr) ? st->min_lr : o->min_lr, st->min_lr},
        {"weight_decay", isnan(o->weight_decay) ? st->weight_decay : o->weight_decay, st->weight_decay},
        {"clip", isnan(o->clip) ? st->clip : o->clip, st->clip}};
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) {
        const fx__run_param *p = fx__run_param_find(fl[i].key);
        if (!fx__run_param_ok_f32(p, fl[i].value)) {
            char rule[64];
            fx__run_param_rule(p, 0, rule, sizeof rule);
            cli_error("%s %g %s", p->option, fl[i].given, rule);
            return CLI_EXIT_USAGE;
        }
    }
    if (st->min_lr > st->lr) {
        cli_error("--min-lr %g is above --lr %g (the cosine decays from --lr down to --min-lr)", fl[1].given,
                  fl[0].given);
        return CLI_EXIT_USAGE;
    }
    if (!fx__run_param_ok_f32(fx__run_param_find("beta1"), st->beta1) ||
        !fx__run_param_ok_f32(fx__run_param_find("beta2"), st->beta2)) {
        cli_error("the Adam betas %g, %g must be in [0, 1)", (double)st->beta1, (double)st->beta2);
        return CLI_EXIT_USAGE;
    }
    return CLI_EXIT_OK;
}

/* ---- configuration: a preset with overrides, or a model to fine-tune, and the options ---- */

/* --lora R on --model DIR: the base mapped, the adapters' settings. */
static int lora_new(train_job *j)
{
    const train_opts *o = &j->o;
    char cfgpath[4200];
    snprintf(cfgpath, sizeof cfgpath, "%s/config.json", o->model ? o->model : "");
    if (!o->model || !file_exists(cfgpath)) {
        cli_error("--lora adapts a Hugging Face model: pass --model DIR (a directory with config.json)%s%s",
                  o->model ? ", not " : "", o->model ? o->model : "");
        return CLI_EXIT_USAGE;
    }
    if (!realpath(o->model, j->base)) {
        cli_error("--model %s: %s", o->model, strerror(errno));
        return CLI_EXIT_FAIL;
    }
    int rc = cli_model_open_for("--model", o->model, &j->cfg, &j->init, true);
    if (rc != CLI_EXIT_OK)
        return rc;
    /* --dtype bf16 reads the base's rows as bfloat16: checked before anything is written. */
    if (o->dtype && !strcmp(o->dtype, "bf16") && fx__model_set_bf16(j->init, true) != FX_OK) {
        cli_error("--dtype bf16: %s", fx_last_error());
        return CLI_EXIT_USAGE;
    }
    j->lora = true;
    j->lc = fx__lora_defaults(o->lora);
    if (!isnan(o->lora_alpha))
        j->lc.alpha = (float)o->lora_alpha;
    if (!isnan(o->lora_dropout))
        j->lc.dropout = (float)o->lora_dropout;
    if (o->lora_targets)
        fx__lora_targets_parse(o->lora_targets, &j->lc.targets); /* checked with the options */
    return CLI_EXIT_OK;
}
static int config_new(train_job *j)
{
    const train_opts *o = &j->o;
    fx_model_config *cfg = &j->cfg;
    fx__model_train_state *st = &j->st;
    int rc;
    if (file_exists(j->ckpt) && !o->force) {
        cli_error("%s already exists: pass --resume to continue it, --force to start over, or another --out",
                  j->ckpt);
        return CLI_EXIT_USAGE;
    }
    /* A preset, or a model to fine-tune (its size is its own); under --lora a Hugging Face
       model, mapped in its file's dtype. */
    if (o->lora != UNSET && (rc = lora_new(j)) != CLI_EXIT_OK)
        return rc;
    if (o->lora == UNSET && (rc = cli_model_open("--model", o->model ? o->model : "small", cfg, &j->init)) != CLI_EXIT_OK)
        return rc;
    char tp[4200];
    if (cfg->vocab < FX__MODEL_VOCAB && !train_tokenizer_path(tp, sizeof tp, o->model) &&
        !train_is_token_file(o->data)) {
        cli_error("--model %s has %lld tokens and no tokenizer.json; pass --data as an llm.c token file", o->model,
                  (long long)cfg->vocab);
        return CLI_EXIT_USAGE;
    }
    if (j->init && (o->layers != UNSET || o->dim != UNSET || o->heads != UNSET || o->kv_heads != UNSET)) {
        cli_error("--model %s is a trained model: --layers, --dim, --heads and --kv-heads apply to presets only",
                  o->model);
        return CLI_EXIT_USAGE;
    }
    shape_options(o, cfg);
    if (fx__model_config_check(cfg) != FX_OK) {
        cli_error("model: %s", fx_last_error());
        return CLI_EXIT_USAGE;
    }
    st->steps = o->steps != UNSET ? o->steps : 1000;
    st->batch = o->batch != UNSET ? o->batch : 8;
    st->seq = o->seq != UNSET ? o->seq : cfg->ctx;
    st->accum = o->accum != UNSET ? o->accum : 1;
    st->warmup = o->warmup != UNSET ? o->warmup : (st->steps / 20 < 100 ? st->steps / 20 : 100);
    st->seed = o->seed != UNSET ? (uint64_t)o->seed : 1337;
    st->adam_bf16 = o->adam_bf16;
    st->deterministic = o->deterministic;
    st->bf16 = o->dtype && strcmp(o->dtype, "bf16") == 0;
    fx_rng_init(&st->rng, st->seed, 1);
    fx__model_mask mk;
    int64_t w;
    /* A trained model keeps its own mask and mods unless told otherwise. */
    char own[32] = "causal";
    if (j->init)
        fx__model_mask_name(j->init->mask, j->init->window, own, sizeof own);
    const char *own_mask = j->init && j->init->mask_src ? j->init->mask_src : NULL;
    const char *own_score = j->init && j->init->score_src ? j->init->score_src : NULL;
    const char *mask_mod = o->mask_mod ? o->mask_mod : o->attn ? NULL : own_mask;
    const char *score_mod = o->score_mod ? o->score_mod : own_score;
    if (!mask_mod && fx__model_mask_parse(o->attn ? o->attn : own, &mk, &w) != FX_OK) {
        cli_error("--attn: %s", fx_last_error());
        return CLI_EXIT_USAGE;
    }
    if (mask_mod)
        snprintf(st->attn, sizeof st->attn, "mod");
    else
        fx__model_mask_name(mk, w, st->attn, sizeof st->attn);
    snprintf(st->mask_mod, sizeof st->mask_mod, "%s", mask_mod ? mask_mod : "");
    snprintf(st->score_mod, sizeof st->score_mod, "%s", score_mod ? score_mod : "");
    if (score_mod && !strcmp(st->attn, "dense")) {
        cli_error("--attn dense makes causality a score modifier of its own: it takes no --score-mod (use --attn "
                  "causal)");
        return CLI_EXIT_USAGE;
    }
    /* Checks that need the config. */
    if (!fx__run_param_ok_i64(fx__run_param_find("seq"), st->seq, cfg->ctx)) {
        cli_error("--seq %lld is outside [1, %lld]: the model's context is %lld tokens", (long long)st->seq,
                  (long long)cfg->ctx, (long long)cfg->ctx);
        return CLI_EXIT_USAGE;
    }
    /* The ranges a checkpoint is held to as well (model/run_params.c). */
    static const char *const counts[] = {"steps", "batch", "accum", "warmup"};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        if ((rc = state_outside(st, counts[i], cfg->ctx)) != CLI_EXIT_OK)
            return rc;
    return config_new_optimizer(o, st);
}

/* Mods (given, or the checkpoint's) run on the CPU: not with --device cuda. */
static int mods_run_check(const train_job *j)
{
    const train_opts *o = &j->o;
    if ((j->st.score_mod[0] || j->st.mask_mod[0]) && o->device && !strcmp(o->device, "cuda")) {
        cli_error("%s does not go with --device cuda: attention mods run on the CPU",
                  j->st.mask_mod[0] ? "--mask-mod" : "--score-mod");
        return CLI_EXIT_USAGE;
    }
    return CLI_EXIT_OK;
}

/* The run's own options, checked against the configuration: where it stops, how often it
   evaluates, logs and saves, and what goes with several processes. */
static int config_schedule(train_job *j)
{
    const train_opts *o = &j->o;
    const fx__model_train_state *st = &j->st;
    /* The multi-process and deterministic paths run their own optimizer over their own
       buffers, which do not keep the weights' bfloat16 copy (LoRA's base has none: its
       products read the mapped file's rows as bfloat16). */
    if (st->bf16 && !j->lora && (j->par != FX__PAR_NONE || o->deterministic)) {
        cli_error("--dtype bf16 does not go with %s (float32 only)",
                  j->par != FX__PAR_NONE ? (j->par == FX__PAR_DDP ? "--parallel ddp" : "--parallel fsdp")
                                         : "--deterministic");
        return CLI_EXIT_USAGE;
    }
    int rc = mods_run_check(j);
    if (rc != CLI_EXIT_OK)
        return rc;
    if (o->save_every < 0)
        return int_outside("--save-every", o->save_every, 0, INT64_MAX);
    if (o->eval_every != UNSET && o->eval_every < 0)
        return int_outside("--eval-every", o->eval_every, 0, INT64_MAX);
    if (o->eval_batches < 1)
        return int_outside("--eval-batches", o->eval_batches, 1, INT64_MAX);
    if (o->log_every != UNSET && o->log_every < 1)
        return int_outside("--log-every", o->log_every, 1, INT64_MAX);
    if (o->until != UNSET && o->until < 1)
        return int_outside("--until", o->until, 1, INT64_MAX);
    if (o->until != UNSET && o->until > st->steps) {
        cli_error("--until %lld is above --steps %lld (--until stops a run early within its schedule)",
                  (long long)o->until, (long long)st->steps);
        return CLI_EXIT_USAGE;
    }
    j->until = o->until != UNSET ? o->until : st->steps;
    j->step_tokens = (double)(st->batch * st->seq * st->accum);
    j->eval_every = o->eval_every != UNSET ? o->eval_every : (st->steps / 10 > 0 ? st->steps / 10 : 1);
    /* By default about 50 lines, and at least one every 50 steps; a given --log-every is kept. */
    j->log_every = o->log_every != UNSET ? o->log_every : (st->steps / 50 > 0 ? st->steps / 50 : 1);
    if (o->log_every == UNSET && j->log_every > 50)
        j->log_every = 50;
    if (st->batch % j->nproc) {
        cli_error("--batch %lld is the global batch and must be a multiple of the %d processes",
                  (long long)st->batch, j->nproc);
        return CLI_EXIT_USAGE;
    }
    return CLI_EXIT_OK;
}

/* The output directory, checked and locked by rank 0; a fine-tuned Hugging Face model's
   configuration and tokenizer go with the run (out/hf, for resuming, generating and flexc
   export) once it saves, so that a run that fails before leaves none behind. */
static int out_prepare(train_job *j)
{
    const train_opts *o = &j->o;
    int rc = j->rank == 0 ? check_out_dir(o->out) : CLI_EXIT_OK;
    if (j->rank == 0 && rc == CLI_EXIT_OK)
        rc = outdir_lock(o->out); /* one lock for all ranks: only rank 0 writes */
    j->keep_hf = !o->resume && o->model;
    if (!all_ok(j->world, rc == CLI_EXIT_OK))
        return rc != CLI_EXIT_OK ? rc : CLI_EXIT_FAIL;
    return CLI_EXIT_OK;
}

/* ---- data and model ---- */

/* The bytes of a mapped base's tensors in its file (0: float32 parameters). */
static uint64_t mapped_bytes(const fx__model *m)
{
    uint64_t n = 0;
    for (size_t i = 0; m && m->mapped && i < m->lay.n; i++)
        n += (uint64_t)m->lay.t[i].numel * fx_dtype_size(m->mapped->t[i].dtype);
    return n;
}
static int setup_data(train_job *j)
{
    const train_opts *o = &j->o;
    fx__model_train_state *st = &j->st;
    /* A resumed run reads its checkpoint's data unless told otherwise, and checks it is the
       same text. */
    const char *data_path = o->data;
    if (o->resume && !o->data && st->data[0])
        data_path = st->data;
    char tokpath[4200];
    bool has_tok = train_tokenizer_path(tokpath, sizeof tokpath, o->resume ? o->out : o->model);
    int rc = train_data_load(&j->data, data_path, has_tok ? tokpath : NULL, &j->cfg, o->val_frac, st->seq + 1,
                             o->lossy_text);
    if (rc != CLI_EXIT_OK)
        return rc;
    j->have_data = true;
    /* Conversations packed into one sequence stay apart: a new run on chat data takes the
       document mask unless --attn (or the model's own sliding window) says otherwise, or the
       eos id that separates them also ends turns inside them (documents would then split a
       conversation: its replies would not see its prompt). */
    const bool split = j->data.chat && j->data.docs > j->data.conversations;
    if (j->data.chat && !o->resume && !o->attn && !strcmp(st->attn, "causal") && !split)
        snprintf(st->attn, sizeof st->attn, "document");
    if (split && !o->quiet && strcmp(st->attn, "mod") != 0 && (!o->attn || !strcmp(st->attn, "document")))
        printf("note: the model's eos id %d also ends turns inside the conversations, so the document mask would "
               "cut them apart; %s\n", j->cfg.eos[0],
               strcmp(st->attn, "document") ? "training with the causal mask (packed conversations see the ones "
                                              "before them in a window)"
                                            : "--attn document given: each turn attends within itself only");
    if (o->resume && j->data.hash != st->data_hash) {
        if (!o->data) {
            cli_error("--resume: %s is not the text the checkpoint was trained on (it changed); pass --data to "
                      "continue on other text",
                      j->data.source);
            return CLI_EXIT_FAIL;
        }
        if (!o->quiet)
            printf("note: --data %s differs from the checkpoint's training text; continuing on it\n", o->data);
    }
    if (data_path != st->data) {
        char abs[4096];
        const char *keep = data_path && realpath(data_path, abs) ? abs : data_path;
        snprintf(st->data, sizeof st->data, "%s", keep ? keep : "");
    }
    st->data_hash = j->data.hash;
    return CLI_EXIT_OK;
}

/* Every rank runs the same options on the same tokens (fx__dist_agree), before the model. */
static int ranks_agree(const train_job *j)
{
    const fx__dist_run run = {.cfg = &j->cfg, .st = &j->st, .data = &j->data, .mode = j->par, .until = j->until,
                              .eval_every = j->eval_every, .eval_batches = j->o.eval_batches,
                              .save_every = j->o.save_every, .lora = j->lora ? &j->lc : NULL};
    int rc = fx__dist_agree(j->world, &run);
    if (rc && fx_comm_status(j->world) != FX_OK)
        comm_failed();
    if (rc)
        cli_error("%s", fx_last_error());
    return rc ? CLI_EXIT_USAGE : CLI_EXIT_OK;
}

/* The run's peak memory, planned before anything is allocated for the model, and refused when
   it does not fit in what is available (docs/train.md, "Memory"). */
static int train_memory(train_job *j)
{
    const train_opts *o = &j->o;
    const fx__model_train_state *st = &j->st;
    /* A process's micro-batch (the deterministic sum steps one sequence at a time, but
       evaluates them together); its sum keeps a stack of partial gradients. */
    const int64_t local = st->batch / j->nproc;
    const fx__model_mem_opts mo = {.B = local, .T = st->seq, .adam_bf16 = st->adam_bf16, .bf16 = st->bf16,
                                   .recompute = o->recompute, .device = o->device && !strcmp(o->device, "cuda"),
                                   .params_held = j->init != NULL && !j->lora,
                                   .sum_slices = o->deterministic && j->par != FX__PAR_FSDP ? local : 0,
                                   .data = (uint64_t)j->data.n * sizeof *j->data.tok};
    int rc = j->lora ? fx__lora_mem_train(&j->mem, &j->cfg, &j->lc, &mo, mapped_bytes(j->init))
                     : fx__model_mem_train(&j->mem, &j->cfg, &mo);
    if (rc == FX_OK)
        rc = fx__model_mem_check(&j->mem, &j->avail);
    if (rc == FX_ENOMEM)
        cli_error("%s: lower --batch (%lld) or --seq (%lld)%s%s, or train a smaller model; --no-memory-check trains "
                  "anyway",
                  fx_last_error(), (long long)st->batch, (long long)st->seq, o->recompute ? "" : ", add --recompute",
                  st->adam_bf16 ? "" : ", add --adam-bf16");
    else if (rc)
        cli_fail(rc, "memory");
    return all_ok(j->world, rc == FX_OK) ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}

/* --lora: new adapters (drawn from the seed), or the checkpoint's with their moments. */
static int lora_attach(train_job *j)
{
    fx__model *m = j->m;
    fx__lora *a = NULL;
    int rc = j->o.resume ? fx__lora_load(m, j->ckpt, true) : fx__lora_create(&a, &m->c, &j->lc, j->st.seed);
    if (rc == FX_OK && a)
        rc = fx__model_set_lora(m, a);
    if (rc == FX_OK)
        rc = fx__lora_alloc_train(m->lora);
    return rc == FX_OK ? CLI_EXIT_OK : cli_fail(rc, j->o.resume ? "--resume" : "--lora");
}

/* The model (created, or read from --model or the checkpoint), its training buffers, the
   batch's tokens, the room a save needs and the metrics file. */
static int setup_model(train_job *j)
{
    const train_opts *o = &j->o;
    const fx__model_train_state *st = &j->st;
    int rc;
    if ((rc = train_memory(j)) != CLI_EXIT_OK)
        return rc;
    if (j->init)
        j->m = j->init, j->init = NULL; /* fine-tuning: the weights read from --model */
    else if ((rc = fx_model_create(&j->m, &j->cfg, st->seed)) != FX_OK)
        return cli_fail(rc, "model");
    fx__model *m = j->m;
    const bool gpu = o->device && strcmp(o->device, "cuda") == 0;
    m->adam_bf16 = st->adam_bf16;
    m->recompute = o->recompute;
    if (!j->lora && (rc = fx__model_alloc_train(m)) != FX_OK)
        return cli_fail(rc, "model");
    if (strcmp(st->attn, "mod") != 0)
        fx__model_mask_parse(st->attn, &m->mask, &m->window);
    if ((rc = fx__model_set_mods(m, st->score_mod, st->mask_mod)) != FX_OK)
        return cli_fail(rc, "attention mods");
    if (j->lora && (rc = lora_attach(j)) != CLI_EXIT_OK)
        return rc;
    if (!j->lora && o->resume && (rc = fx__model_load(m, j->ckpt, true)) != FX_OK)
        return cli_fail(rc, "--resume");
    /* On a GPU the device holds the weights' bfloat16 copy, and the host none. */
    if (gpu && (rc = fx__model_gpu_attach(m, 1, st->bf16)) != FX_OK)
        return cli_fail(rc, "--device cuda");
    if (!gpu && st->bf16 && (rc = fx__model_set_bf16(m, true)) != FX_OK)
        return cli_fail(rc, "--dtype bf16");
    if ((j->par != FX__PAR_NONE || o->deterministic) &&
        (rc = fx__dist_create(&j->dist, m, j->world, j->par, o->deterministic, st->batch)) != FX_OK) {
        if (comm_broken(j->world, j->dist))
            comm_failed();
        cli_fail(rc, j->par == FX__PAR_NONE ? "--deterministic" : o->parallel);
        /* options that do not go together, e.g. fsdp and --adam-bf16 */
        return rc == FX_EUNSUPPORTED ? CLI_EXIT_USAGE : CLI_EXIT_FAIL;
    }
    if (!j->dist && (rc = fx__model_set_batch(m, st->batch, st->seq)) != FX_OK)
        return cli_fail(rc, "model");
    j->tokens = malloc((size_t)(st->batch * st->seq) * sizeof *j->tokens);
    j->targets = malloc((size_t)(st->batch * st->seq) * sizeof *j->targets);
    if (!j->tokens || !j->targets) {
        cli_error("out of memory");
        return CLI_EXIT_FAIL;
    }
    /* What a save writes: weights, the two Adam moments, the model file, and their headers. */
    uint64_t P = m->lay.total, need = P * 4 + 2 * P * (st->adam_bf16 ? 2 : 4) + P * (o->bf16 ? 2 : 4) + (1u << 17);
    if (j->lora)
        need = 3 * (uint64_t)m->lora->total * sizeof(float) + (1u << 17); /* adapters and moments */
    rc = j->rank == 0 ? save_check(o->out, need) : CLI_EXIT_OK;
    if (!all_ok(j->world, rc == CLI_EXIT_OK))
        return CLI_EXIT_FAIL;
    snprintf(j->mpath, sizeof j->mpath, "%s/metrics.jsonl", o->out);
    rc = j->rank == 0 ? metrics_open(&j->metrics, j->mpath, st->step, o->resume) : CLI_EXIT_OK;
    if (!all_ok(j->world, rc == CLI_EXIT_OK))
        return CLI_EXIT_FAIL;
    return CLI_EXIT_OK;
}

/* "memory: 1.23 GB planned (params 0.10 + ...), 20.10 GB available (90% of MemAvailable)": available
   as the check counts it, with what the process holds already. */
static void print_memory(const train_job *j)
{
    char parts[256];
    fx__model_mem_parts(parts, sizeof parts, &j->mem);
    double s, sa;
    const char *u = fx__mem_unit(j->mem.total, &s);
    printf("memory: %.2f %s planned (%s), ", (double)j->mem.total / s, u, parts);
    if (j->avail.bytes == UINT64_MAX) {
        printf("available unknown\n");
        return;
    }
    uint64_t room = fx__mem_room(&j->avail, j->mem.held);
    const char *ua = fx__mem_unit(room, &sa);
    printf("%.2f %s available (%d%% of %s)%s\n", (double)room / sa, ua, FX__MEM_USABLE_PERCENT, j->avail.source,
           fx__mem_check_on() ? "" : ", not checked");
}

static uint64_t lora_params(const fx__lora *a)
{
    uint64_t n = 0;
    for (size_t i = 0; i < a->n; i++)
        n += a->t[i].numel;
    return n;
}

static void print_header(const train_job *j)
{
    const fx_model_config *cfg = &j->cfg;
    const fx__model_train_state *st = &j->st;
    const fx__model_data *data = &j->data;
    char line[1024];
    fx__config_format(cfg, line, sizeof line); /* from the config's field table */
    char attn[2 * FX__MOD_SRC_MAX + 64];
    if (st->mask_mod[0])
        snprintf(attn, sizeof attn, "mask mod \"%s\"", st->mask_mod);
    else
        snprintf(attn, sizeof attn, "%s", st->attn);
    if (st->score_mod[0])
        snprintf(attn + strlen(attn), sizeof attn - strlen(attn), ", score mod \"%s\"", st->score_mod);
    printf("flexc train: %.2fM parameters, attention %s\nmodel: %s\n", (double)j->m->lay.total / 1e6, attn, line);
    printf("data: %s: %lld tokens, %lld document%s (%lld train, %lld validation)\n", data->source,
           (long long)data->n, (long long)data->docs, cli_s((uint64_t)data->docs), (long long)data->n_train,
           (long long)(data->n - data->n_train));
    printf("steps %lld..%lld of %lld, batch %lld x %lld tokens x accum %lld, lr %g (warmup %lld, cosine to %g), "
           "%d thread%s, out %s\n",
           (long long)st->step + 1, (long long)j->until, (long long)st->steps, (long long)st->batch,
           (long long)st->seq, (long long)st->accum, (double)st->lr, (long long)st->warmup, (double)st->min_lr,
           fx_get_num_threads(), cli_s((uint64_t)fx_get_num_threads()), j->o.out);
    if (j->lora) {
        char targets[64];
        fx__lora_targets_format(j->lc.targets, targets, sizeof targets);
        const fx__model *m = j->m;
        printf("lora: rank %lld, alpha %g, dropout %g on %s: %.2fM trainable parameters (%.2f%% of the base, "
               "frozen in %s)\n",
               (long long)j->lc.rank, (double)j->lc.alpha, (double)j->lc.dropout, targets,
               (double)lora_params(m->lora) / 1e6, 100.0 * (double)lora_params(m->lora) / (double)m->lay.total,
               fx_dtype_name(m->mapped->t[0].dtype));
    }
    if (st->bf16 && j->lora)
        printf("dtype bf16: bfloat16 inputs to the base's products (its file's rows as they are) and the "
               "attention's; float32 adapters, sums and loss\n");
    else if (st->bf16)
        printf("dtype bf16: bfloat16 inputs to every matrix product, float32 weights, sums and loss\n");
    if (j->m->gpu)
        printf("device cuda: the training step on CUDA device 0 (weights, optimizer and activations there)\n");
    if (j->world)
        printf("parallel %s over %d processes (%lld sequences each)%s, communication timeout %g s\n", j->o.parallel,
               j->nproc, (long long)(st->batch / j->nproc), j->o.deterministic ? ", deterministic" : "",
               fx_comm_timeout(j->world));
    print_memory(j);
    fflush(stdout);
}

/* ---- the loop ---- */

/* A LoRA run's checkpoint (its adapters). A model file an earlier run left there goes, since
   generate and export would read it rather than the adapters. */
static int save_lora(const train_job *j, const fx__model_train_state *st)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/checkpoint.safetensors", j->o.out);
    int rc = fx__lora_save_checkpoint(j->m, st, j->base, path);
    if (rc)
        return cli_fail(rc, "saving the checkpoint");
    snprintf(path, sizeof path, "%s/model.safetensors", j->o.out);
    if (unlink(path) != 0 && errno != ENOENT) {
        cli_error("cannot remove %s, an earlier run's model that would be read instead of the adapters: %s", path,
                  strerror(errno));
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}

/* Saves the run from rank 0: the whole model's checkpoint and model file (FSDP gathers it
   first), or a LoRA run's checkpoint; the first save also keeps the Hugging Face files. */
static int save_run(train_job *j, const fx__model_train_state *st)
{
    if (j->keep_hf) {
        char cfg[4200];
        snprintf(cfg, sizeof cfg, "%s/config.json", j->o.model);
        int rc = j->rank == 0 && file_exists(cfg) ? train_keep_hf(j->o.out, j->o.model) : CLI_EXIT_OK;
        if (!all_ok(j->world, rc == CLI_EXIT_OK))
            return CLI_EXIT_FAIL;
        j->keep_hf = false;
    }
    if (!j->lora)
        return save_dist(j->m, j->dist, j->world, st, j->o.out, j->o.bf16);
    int ret = j->rank == 0 ? save_lora(j, st) : CLI_EXIT_OK; /* every rank holds the adapters alike */
    return all_ok(j->world, ret == CLI_EXIT_OK) ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}

/* "saved OUT/checkpoint.safetensors and OUT/model.safetensors" (a LoRA run: its adapters). */
static void print_saved(const train_job *j)
{
    if (j->lora)
        printf("saved %s/checkpoint.safetensors (LoRA adapters)", j->o.out);
    else
        printf("saved %s/checkpoint.safetensors and %s/model.safetensors", j->o.out, j->o.out);
}

/* A finished step's metrics line (val: the validation loss, when the step evaluated). A line that
   cannot be written (a full disk) stops the run as a signal would (every process after the
   same step, the checkpoint saved), and the run then fails. */
static void record_metrics(train_job *j, const fx__model_step_info *info, double tps, double elapsed, bool eval,
                           float val)
{
    if (!j->metrics)
        return;
    fprintf(j->metrics,
            "{\"step\":%lld,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"tokens_per_s\":%.1f,\"time_s\":%.3f",
            (long long)j->st.step, (double)info->loss, (double)info->lr, (double)info->grad_norm, tps, elapsed);
    if (eval)
        fprintf(j->metrics, ",\"val_loss\":%.9g", (double)val);
    fprintf(j->metrics, ",\"dtype\":\"%s\"}\n", j->st.bf16 ? "bf16" : "f32");
    if (fflush(j->metrics) != 0 || ferror(j->metrics)) {
        cli_error("cannot write %s: %s; stopping", j->mpath, strerror(errno));
        fclose(j->metrics);
        j->metrics = NULL;
        j->metrics_failed = true;
        if (!interrupted)
            interrupted = -1;
    }
}

/* The progress line: rewritten in place on a terminal, else every --log-every steps and
   at each evaluation. avg: tokens/s since the run (or resume) started. */
static void print_progress(const train_job *j, const fx__model_step_info *info, double avg, int64_t first, bool eval,
                           float val)
{
    const fx__model_train_state *st = &j->st;
    char eta[32];
    fmt_duration(eta, sizeof eta, (double)(j->until - st->step) * j->step_tokens / avg);
    double mem = (double)bench_max_rss() / (1 << 20);
    if (j->tty) {
        printf("\r\033[Kstep %lld/%lld | loss %.4f | lr %.2e | %.0f tok/s | ETA %s | mem %.0f MB", (long long)st->step,
               (long long)st->steps, (double)info->loss, (double)info->lr, avg, eta, mem);
        if (eval)
            printf(" | val %.4f\n", (double)val);
        fflush(stdout);
    } else if (eval || st->step % j->log_every == 0 || st->step == first + 1) {
        printf("step %lld/%lld loss %.4f lr %.2e %.0f tok/s eta %s mem %.0fMB", (long long)st->step,
               (long long)st->steps, (double)info->loss, (double)info->lr, avg, eta, mem);
        if (eval)
            printf(" val_loss %.4f", (double)val);
        printf("\n");
        fflush(stdout);
    }
}

/* Steps until --until or a signal, each recorded, with evaluations and saves on schedule. */
static int train_loop(train_job *j)
{
    const train_opts *o = &j->o;
    fx__model_train_state *st = &j->st;
    int rc;
    signal(SIGINT, on_sigint);
    signal(SIGTERM, on_sigint);
    /* A closed output pipe (`flexc train ... | head`) stops the run like a signal, with the
       checkpoint saved, instead of killing it mid-step; main() then reports the lost output. */
    signal(SIGPIPE, on_sigint);
    double t_start = fx__seconds();
    int64_t first = st->step;
    /* Over several processes a signal reaches each at its own moment: a rank stops only when
       the step's reduction says some rank was signalled, so that all leave the loop after the
       same step (one leaving alone would meet the others' next step with its own collectives). */
    bool all_stop = false;
    while (st->step < j->until && !(j->dist ? all_stop : interrupted)) {
        double t0 = fx__seconds();
        fx__model_step_info info;
        fx__model_train_state before = *st; /* what is saved if this step goes non-finite */
        bool stop = interrupted;
        rc = j->dist ? fx__dist_step(j->dist, &j->data, st, j->tokens, j->targets, &info, &stop)
                     : fx__model_train_step(j->m, &j->data, st, j->tokens, j->targets, &info);
        if (rc && comm_broken(j->world, j->dist))
            comm_failed();
        if (rc)
            return cli_fail(rc, "training step");
        if (stop) {
            if (!interrupted)
                interrupted = -1; /* another process was signalled */
            all_stop = true;
        }
        double tps = j->step_tokens / (fx__seconds() - t0);
        if (!isfinite(info.loss) || !isfinite(info.grad_norm)) {
            /* The step was not applied: save the previous one, then fail. */
            *st = before;
            bool lossbad = !isfinite(info.loss);
            float x = lossbad ? info.loss : info.grad_norm;
            cli_error("step %lld: the %s is %s; stopping with the checkpoint of step %lld (a lower --lr may help)",
                      (long long)st->step + 1, lossbad ? "loss" : "gradient norm",
                      isnan(x) ? "NaN" : x > 0 ? "+Inf" : "-Inf", (long long)st->step);
            if (save_run(j, st) == CLI_EXIT_OK && !o->quiet) {
                print_saved(j);
                printf(" at step %lld\n", (long long)st->step);
            }
            return CLI_EXIT_FAIL;
        }
        if (isnan(j->first_loss))
            j->first_loss = info.loss;
        j->last_loss = info.loss;
        bool eval = st->step == j->until || (j->eval_every > 0 && st->step % j->eval_every == 0);
        float val = NAN;
        if (eval) {
            rc = j->dist ? fx__dist_eval(j->dist, &j->data, o->eval_batches, st->seq, j->tokens, j->targets, &val)
                         : fx__model_eval(j->m, &j->data, o->eval_batches, j->tokens, j->targets, &val);
            if (rc && comm_broken(j->world, j->dist))
                comm_failed();
            if (rc)
                return cli_fail(rc, "validation");
        }
        double elapsed = fx__seconds() - t_start;
        record_metrics(j, &info, tps, elapsed, eval, val);
        if (!o->quiet)
            print_progress(j, &info, (double)(st->step - first) * j->step_tokens / elapsed, first, eval, val);
        if (o->save_every > 0 && st->step % o->save_every == 0 && st->step < j->until &&
            save_run(j, st) != CLI_EXIT_OK)
            return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}

/* The last save and the closing line; the exit code says how the run ended. */
static int train_finish(train_job *j)
{
    const train_opts *o = &j->o;
    if (save_run(j, &j->st) != CLI_EXIT_OK)
        return CLI_EXIT_FAIL;
    if (!o->quiet) {
        if (j->tty)
            printf("\r\033[K");
        if (interrupted && !j->metrics_failed)
            printf("interrupted at step %lld; ", (long long)j->st.step);
        print_saved(j);
        printf(" at step %lld", (long long)j->st.step);
        if (!isnan(j->first_loss))
            printf(" (loss %.4f -> %.4f)", (double)j->first_loss, (double)j->last_loss);
        printf("\n");
    }
    return j->metrics_failed || interrupted == SIGPIPE ? CLI_EXIT_FAIL : interrupted ? 130 : CLI_EXIT_OK;
}

static void job_free(train_job *j)
{
    if (j->metrics)
        fclose(j->metrics);
    free(j->tokens), free(j->targets);
    fx__dist_free(j->dist);
    fx_model_free(j->m);
    fx_model_free(j->init);
    if (j->have_data)
        fx__model_data_free(&j->data);
}

static int train_run(const train_opts *op, fx__par par, fx_comm *world, int rank, int nproc)
{
    train_job j = {.o = *op, .par = par, .world = world, .rank = rank, .nproc = nproc, .first_loss = NAN,
                   .last_loss = NAN};
    snprintf(j.ckpt, sizeof j.ckpt, "%s/checkpoint.safetensors", j.o.out);
    int rc = j.o.resume ? config_resume(&j) : config_new(&j);
    if (rc == CLI_EXIT_OK)
        rc = config_schedule(&j);
    if (rc == CLI_EXIT_OK)
        rc = out_prepare(&j);
    if (rc == CLI_EXIT_OK)
        rc = setup_data(&j);
    if (rc == CLI_EXIT_OK && j.world)
        rc = ranks_agree(&j);
    if (rc == CLI_EXIT_OK)
        rc = setup_model(&j);
    if (rc == CLI_EXIT_OK) {
        j.tty = isatty(STDOUT_FILENO);
        if (!j.o.quiet)
            print_header(&j);
        rc = train_loop(&j);
    }
    if (rc == CLI_EXIT_OK)
        rc = train_finish(&j);
    job_free(&j);
    return rc;
}
