/* Times flexc's device calls for scripts/gpu-bench.sh (bench/cuda_vs_torch.py runs it
   alternately with the PyTorch peers and takes the ratios). One case per run; prints one
   JSON object: the case, the median milliseconds of `reps` timed calls after two warm-up
   calls (CUDA events on the call's stream), and the device memory the calls took beyond
   their inputs and outputs (scratch_bytes: the stream-ordered pool's high-water mark plus
   what stayed allocated after the first call, such as a matrix library's workspace).

     bench_cuda attn  B Hq Hkv L Lkv D MASK DTYPE REPS [fwd|bwd|fwdbwd]
     bench_cuda lce   N D V DTYPE REPS
   MASK: none | causal | sliding:W | document:NDOCS; DTYPE: f32 | bf16; Lq = L except
   with Lkv > L, where the L query rows are the last ones (q_offset = Lkv - L). The attention
   mode times the forward (default), the backward alone, or both in one call pair (what a
   training step pays, and what a framework's forward + backward is compared with). The
   loss always runs forward and backward in one call (the fused call makes the gradients
   with the loss). */
#include <flexc.h>

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what)
{
    fprintf(stderr, "bench_cuda: %s: %s\n", what, fx_last_error());
    exit(1);
}

static void *dev_random(size_t n, int bf16, uint64_t seed)
{
    float *h = malloc(n * sizeof(float));
    fx_rng_fill_uniform(h, (int64_t)n, -1.0f, 1.0f, seed, 0);
    size_t bytes = n * (bf16 ? 2 : 4);
    if (bf16) {
        uint16_t *b = (uint16_t *)h;
        for (size_t i = 0; i < n; i++)
            b[i] = fx_f32_to_bf16(h[i]);
    }
    void *d = NULL;
    if (cudaMalloc(&d, bytes ? bytes : 4) != cudaSuccess || cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        fprintf(stderr, "bench_cuda: device allocation of %zu bytes failed\n", bytes);
        exit(1);
    }
    free(h);
    return d;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Device bytes in use now (every allocation of the process, the context's included). */
static size_t dev_used(void)
{
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    return total - free_b;
}

/* The default memory pool's high-water mark of stream-ordered allocations since the last
   reset (the library takes its scratch from it with cudaMallocAsync). */
static size_t pool_high(int reset)
{
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, 0) != cudaSuccess)
        return 0;
    unsigned long long v = 0; /* cuuint64_t */
    if (reset)
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &v);
    else
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &v);
    return (size_t)v;
}

typedef int (*call_fn)(void *ctx);

/* The median of reps timed calls after two warm-ups; *scratch: the bytes the calls took
   beyond what was allocated before the first one (see the header). */
static float time_median(call_fn fn, void *ctx, int reps, cudaStream_t st, size_t *scratch)
{
    cudaDeviceSynchronize();
    const size_t used0 = dev_used();
    pool_high(1);
    for (int i = 0; i < 2; i++)
        if (fn(ctx) != FX_OK)
            die("warm-up call");
    cudaDeviceSynchronize();
    const size_t used1 = dev_used(), kept = used1 > used0 ? used1 - used0 : 0;
    float *ms = malloc((size_t)reps * sizeof(float));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int r = 0; r < reps; r++) {
        cudaEventRecord(e0, st);
        if (fn(ctx) != FX_OK)
            die("timed call");
        cudaEventRecord(e1, st);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms[r], e0, e1);
    }
    *scratch = kept + pool_high(0);
    qsort(ms, (size_t)reps, sizeof(float), cmp_float);
    float med = ms[reps / 2];
    free(ms);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return med;
}

typedef struct attn_ctx {
    fx_attention a;
    void *q, *k, *v, *out, *dout, *dq, *dk, *dv;
    float *lse;
} attn_ctx;

static int attn_fwd(void *p)
{
    attn_ctx *c = p;
    return fx_flex_attention(&c->a, c->q, c->k, c->v, c->out, c->lse);
}

static int attn_bwd(void *p)
{
    attn_ctx *c = p;
    return fx_flex_attention_backward(&c->a, c->q, c->k, c->v, c->out, c->lse, c->dout, c->dq, c->dk, c->dv);
}

static int attn_fwdbwd(void *p)
{
    int rc = attn_fwd(p);
    return rc != FX_OK ? rc : attn_bwd(p);
}

static int run_attn(int argc, char **argv)
{
    if (argc < 11)
        return fprintf(stderr, "usage: bench_cuda attn B Hq Hkv L Lkv D MASK DTYPE REPS [fwd|bwd|fwdbwd]\n"), 2;
    attn_ctx c = {0};
    const int64_t B = atoll(argv[2]), Hq = atoll(argv[3]), Hkv = atoll(argv[4]), L = atoll(argv[5]),
                  Lkv = atoll(argv[6]), D = atoll(argv[7]);
    const char *mask = argv[8];
    const int bf16 = strcmp(argv[9], "bf16") == 0, reps = atoi(argv[10]);
    const char *mode = argc > 11 ? argv[11] : "fwd";
    call_fn fn = !strcmp(mode, "fwd") ? attn_fwd : !strcmp(mode, "bwd") ? attn_bwd : !strcmp(mode, "fwdbwd") ? attn_fwdbwd : NULL;
    if (!fn)
        return fprintf(stderr, "bench_cuda: unknown attention mode %s (fwd, bwd, fwdbwd)\n", mode), 2;
    c.a = (fx_attention){.B = B, .Hq = Hq, .Hkv = Hkv, .Lq = L, .Lkv = Lkv, .D = D, .Dv = D, .device = 1,
                         .dtype = bf16 ? FX_DT_BF16 : 0};
    c.a.q_offset = Lkv > L ? Lkv - L : 0;
    fx_block_mask *m = NULL;
    fx_mask_sliding_window_ctx w = {0};
    int64_t *ids = NULL;
    fx_mask_document_ctx doc = {0};
    if (strcmp(mask, "causal") == 0) {
        if (fx_block_mask_create(&m, fx_mask_causal, NULL, 1, 1, Lkv, Lkv, 0, 0) != FX_OK)
            die("mask");
    } else if (strncmp(mask, "sliding:", 8) == 0) {
        w.window = atoll(mask + 8);
        if (fx_block_mask_create(&m, fx_mask_sliding_window, &w, 1, 1, Lkv, Lkv, 0, 0) != FX_OK)
            die("mask");
    } else if (strncmp(mask, "document:", 9) == 0) {
        const int64_t n = atoll(mask + 9);
        ids = malloc((size_t)Lkv * sizeof(int64_t));
        for (int64_t i = 0; i < Lkv; i++)
            ids[i] = i * n / Lkv;
        doc = (fx_mask_document_ctx){.doc_ids = ids, .len = Lkv};
        if (fx_block_mask_create(&m, fx_mask_document, &doc, 1, 1, Lkv, Lkv, 0, 0) != FX_OK)
            die("mask");
    } else if (strcmp(mask, "none") != 0) {
        return fprintf(stderr, "bench_cuda: unknown mask %s\n", mask), 2;
    }
    if (m && fx_block_mask_to_device(m, 1) != FX_OK)
        die("fx_block_mask_to_device");
    c.a.mask = m;
    const size_t nq = (size_t)(B * Hq * L), nk = (size_t)(B * Hkv * Lkv);
    c.q = dev_random(nq * D, bf16, 1), c.k = dev_random(nk * D, bf16, 2), c.v = dev_random(nk * D, bf16, 3);
    c.out = dev_random(nq * D, bf16, 4), c.dout = dev_random(nq * D, bf16, 5);
    c.dq = dev_random(nq * D, bf16, 6), c.dk = dev_random(nk * D, bf16, 7), c.dv = dev_random(nk * D, bf16, 8);
    c.lse = dev_random(nq, 0, 9);
    if (attn_fwd(&c) != FX_OK)
        die("forward");
    size_t scratch = 0;
    float ms = time_median(fn, &c, reps, NULL, &scratch);
    printf("{\"op\": \"attention\", \"mode\": \"%s\", \"B\": %lld, \"Hq\": %lld, \"Hkv\": %lld, \"L\": %lld, "
           "\"Lkv\": %lld, \"D\": %lld, \"mask\": \"%s\", \"dtype\": \"%s\", \"density\": %.5f, \"reps\": %d, "
           "\"ms\": %.4f, \"scratch_bytes\": %zu}\n",
           mode, (long long)B, (long long)Hq, (long long)Hkv, (long long)L, (long long)Lkv, (long long)D, mask,
           bf16 ? "bf16" : "f32", m ? fx_block_mask_density(m) : 1.0, reps, ms, scratch);
    fx_block_mask_free(m);
    free(ids);
    return 0;
}

typedef struct lce_ctx {
    fx_lce p;
    void *h, *w, *dh, *dw;
    int64_t *t;
    float *loss;
} lce_ctx;

static int lce_call(void *p)
{
    lce_ctx *c = p;
    return fx_linear_cross_entropy(&c->p, c->h, c->w, NULL, c->t, c->loss, NULL, c->dh, c->dw, NULL);
}

static int run_lce(int argc, char **argv)
{
    if (argc < 7)
        return fprintf(stderr, "usage: bench_cuda lce N D V DTYPE REPS\n"), 2;
    const int64_t N = atoll(argv[2]), D = atoll(argv[3]), V = atoll(argv[4]);
    const int bf16 = strcmp(argv[5], "bf16") == 0, reps = atoi(argv[6]);
    lce_ctx c = {.p = fx_lce_defaults(N, D, V)};
    c.p.device = 1;
    c.p.dtype = bf16 ? FX_DT_BF16 : 0;
    c.h = dev_random((size_t)(N * D), bf16, 1), c.w = dev_random((size_t)(V * D), bf16, 2);
    c.dh = dev_random((size_t)(N * D), bf16, 3), c.dw = dev_random((size_t)(V * D), bf16, 4);
    c.loss = dev_random(1, 0, 5);
    int64_t *ht = malloc((size_t)N * sizeof(int64_t));
    for (int64_t i = 0; i < N; i++)
        ht[i] = (i * 7919) % V;
    cudaMalloc((void **)&c.t, (size_t)N * sizeof(int64_t));
    cudaMemcpy(c.t, ht, (size_t)N * sizeof(int64_t), cudaMemcpyHostToDevice);
    free(ht);
    size_t scratch = 0;
    float ms = time_median(lce_call, &c, reps, NULL, &scratch);
    printf("{\"op\": \"lce\", \"N\": %lld, \"D\": %lld, \"V\": %lld, \"dtype\": \"%s\", \"reps\": %d, \"ms\": %.4f, "
           "\"scratch_bytes\": %zu}\n",
           (long long)N, (long long)D, (long long)V, bf16 ? "bf16" : "f32", reps, ms, scratch);
    return 0;
}

int main(int argc, char **argv)
{
    if (fx_cuda_device_count() == 0) {
        fprintf(stderr, "bench_cuda: no CUDA device visible\n");
        return 77;
    }
    if (argc > 1 && strcmp(argv[1], "attn") == 0)
        return run_attn(argc, argv);
    if (argc > 1 && strcmp(argv[1], "lce") == 0)
        return run_lce(argc, argv);
    fprintf(stderr, "usage: bench_cuda attn ... | lce ...\n");
    return 2;
}
