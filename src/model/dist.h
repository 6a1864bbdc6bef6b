/*
 * Training the GPT over several processes (`flexc train --parallel ddp|fsdp`), and the
 * deterministic sliced step (`--deterministic`) that makes N ranks bitwise equal to 1.
 *
 * DDP: every rank holds the whole model. Each rank draws the whole global batch from the
 * shared sampler and keeps its `batch / N` sequences; the backward pass's gradient hook starts
 * a non-blocking all-reduce of each layer's gradients as soon as they are final, so the
 * reduction of layer l overlaps the backward of layers l-1 .. 0.
 *
 * FSDP: each unit (the embedding, each layer, the final norm) is one flat range padded to a
 * multiple of N and split in N shards; a rank keeps only its shard of the parameters, the
 * gradients and both Adam moments. A layer's parameters are all-gathered (on `world`) just
 * before its forward and its backward, the next layer's gather prefetched; its gradients are
 * reduce-scattered on a second communicator, so they overlap the gathers. AdamW runs on the
 * shard. The embedding (used first and last: embedding and tied LM head) and the final norm
 * stay gathered for the whole step.
 *
 * Deterministic: gradients are computed one sequence at a time ("slices") and summed by the
 * left-aligned pairwise tree of fx_comm_sum_pairwise: each rank sums its K = batch/N slices
 * (K a power of two), the deterministic all-reduce / reduce-scatter sums the ranks' partial
 * sums with the same tree, and 1 process sums all `batch` slices at once, which is the same
 * tree. FSDP reduces each layer as its backward ends, so it takes one slice per rank per
 * micro-batch (batch == N; --accum for more). See docs/distributed.md.
 */
#ifndef FX_MODEL_DIST_H
#define FX_MODEL_DIST_H

#include "model.h"
#include "flexc/comm.h"

typedef enum fx__par {
    FX__PAR_NONE = 0, /* one process (with --deterministic: the sliced step) */
    FX__PAR_DDP = 1,
    FX__PAR_FSDP = 2
} fx__par;

/* "none" | "ddp" | "fsdp" */
int fx__par_parse(const char *s, fx__par *out);

typedef struct fx__dist_stats {
    double comm_bytes;   /* bytes of the collectives' buffers in the last step (all-gather: the
                            gathered output; reduce-scatter: the input; all-reduce: the buffer) */
    double wait_s;       /* seconds blocked waiting for collectives in the last step ... */
    double wait_head_s;  /* ... of which before the first layer's forward could start (FSDP: the
                            embedding and layer 0; nothing to overlap them with) */
    double wait_tail_s;  /* ... and after the last backward (the last reduce-scatters, the
                            gradient norm, the loss and stop flag; DDP: the all-reduces) */
    double progress_s;   /* seconds in the other communication calls: starting the non-blocking
                            collectives, and the progress calls between the layers' operations
                            (MPI's copies of collectives in flight happen there, on this rank's
                            core) */
    int64_t collectives; /* started in the last step */
    int64_t progress_calls; /* progress points passed in the last step */
} fx__dist_stats;

typedef struct fx__dist fx__dist;

/* What the ranks of one run must hold alike (fx__dist_agree). */
typedef struct fx__dist_run {
    const fx_model_config *cfg;
    const fx__model_train_state *st; /* the schedule, optimizer, seed, mask, arithmetic, start */
    const fx__model_data *data;      /* its tokens, hashed (data->hash), and their split */
    fx__par mode;
    int64_t until, eval_every, eval_batches, save_every; /* when the collectives happen */
    const struct fx__lora_config *lora;                 /* the adapters' settings, or NULL */
} fx__dist_run;

/* Collective, at start-up: every rank's run against every other's, by one all-gather of a
   fixed-size record (a hash and a short text per option). FX_EINVAL on every rank when they
   differ, naming the first option that does (in the order of fx__dist_run's fields, the data
   last), rank 0's value and the first rank with another ("ranks disagree on --lr: rank 0
   has 0.001, rank 1 has 0.002"). Per-rank settings are not compared (the CLI's --threads,
   --quiet, --log-every, --out, --bf16, --force, --recompute, --comm-timeout, --comm-log, and
   the --data path itself: its tokens are). docs/distributed.md. */
int fx__dist_agree(fx_comm *world, const fx__dist_run *run);

/* Takes over m (a whole model with gradient and Adam buffers, initialised or loaded: the same on
   every rank; or a frozen base with LoRA adapters in training, whose gradients alone are then
   reduced, not under FSDP) for training at global `batch` sequences per micro-batch. world: NULL for one
   process (mode NONE). FSDP shards m here: its flat buffers are freed (m->params keeps the
   gathered embedding only), so m must then be used through fx__dist_* only. Collective: the
   ranks' weights and Adam moments are compared first (hashed), FX_EINVAL on every rank naming
   the first rank whose differ from rank 0's (another --model directory or checkpoint). */
int fx__dist_create(fx__dist **out, fx__model *m, fx_comm *world, fx__par mode, bool deterministic, int64_t batch);
/* The deterministic sum's stack of partial gradients for `slices` sequences summed in fixed
   order: this many rows of P + 1 floats (and one more row for the sum). */
int fx__dist_sum_levels(int64_t slices);
/* Releases what fx__dist_create added (not m, not world); m stays unusable after FSDP. */
void fx__dist_free(fx__dist *d);
/* fx__model_train_step over the ranks: the same contract; tokens/targets hold the global batch.
   *stop in: this rank wants to stop (a signal); out: some rank does (so all stop together). */
int fx__dist_step(fx__dist *d, const fx__model_data *data, fx__model_train_state *s, int32_t *tokens,
                  int32_t *targets, fx__model_step_info *info, bool *stop);
/* The mean validation loss over `batches` global batches, the ranks splitting each batch. */
int fx__dist_eval(fx__dist *d, const fx__model_data *data, int64_t batches, int64_t seq, int32_t *tokens,
                  int32_t *targets, float *loss);
/* The whole model (parameters and Adam moments) for a checkpoint. Collective under FSDP: the
   shards are gathered into a temporary model that only rank 0 receives; otherwise *full is
   the model itself on rank 0. NULL on the other ranks: only rank 0 writes checkpoints.
   Release with fx__dist_full_release. */
int fx__dist_full(fx__dist *d, fx__model **full);
void fx__dist_full_release(fx__dist *d, fx__model *full);
/* FX_OK, or the status of the communication failure (on any of its communicators) that
   makes further training impossible: the process should report fx_last_error() and exit. */
int fx__dist_status(const fx__dist *d);
/* Benchmark switch: wait for every collective as soon as it starts and prefetch nothing (the
   same step with communication serialised). */
void fx__dist_set_serial(fx__dist *d, bool on);
fx__dist_stats fx__dist_last_stats(const fx__dist *d);
/* Bytes this rank holds for parameters, gradients and optimizer state, gathered buffers
   included (FSDP: shards + gathered embedding, norm and layer slots). */
size_t fx__dist_state_bytes(const fx__dist *d);
/* The part of fx__dist_state_bytes that is this rank's shards (FSDP: parameters, gradients
   and both Adam moments, 1/N of the model each, padded); the rest is gathered buffers. */
size_t fx__dist_shard_bytes(const fx__dist *d);
/* FSDP: the bytes of one whole-layer buffer (the largest layer, padded); 0 otherwise. */
size_t fx__dist_layer_bytes(const fx__dist *d);

#endif
