/* Two builds of libflexc side by side: the FlexAttention forward of each, called in turn
   (A, B, A, B, ...) in one process, so a change in the machine's load falls on both alike.
   B=1, H=8, D=64, float32, a causal sliding window (W = 0: causal). Prints one JSON object:
   the medians of each build's seconds, the median of the per-pair ratios A / B (> 1: B is
   faster), and whether the two builds' outputs and lse are bitwise equal.

       cc -O2 -Iinclude bench/attention_ab.c -o attention_ab -ldl
       cp build/libflexc.so /tmp/old.so          # before the change; rebuild after it
       OMP_NUM_THREADS=2 ./attention_ab /tmp/old.so build/libflexc.so 32768 256 15 --fresh

   --fresh gives every call a newly allocated output (as flexc.torch does: its first writes
   fault pages in), else both write into outputs written before. --cpu times process CPU
   seconds instead of wall seconds (less sensitive to other processes taking a core). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flexc/attention.h"

typedef int (*create_fn)(fx_block_mask **, fx_mask_fn, const void *, int64_t, int64_t, int64_t, int64_t, int64_t,
                         int64_t);
typedef void (*free_fn)(fx_block_mask *);
typedef int (*forward_fn)(const fx_attention *, const float *, const float *, const float *, float *, float *);

typedef struct build {
    const char *path;
    void *dl;
    forward_fn forward;
    free_fn mask_free;
    fx_block_mask *mask;
    fx_mask_sliding_window_ctx window;
} build;

enum { MAX_REPS = 256 };

static bool use_cpu;

static double now(void)
{
    struct timespec t;
    clock_gettime(use_cpu ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "attention_ab: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    exit(1);
}

/* Each build gets its own copy of the library (RTLD_LOCAL) and builds its own mask. */
static void load(build *bd, int64_t L, int64_t W)
{
    bd->dl = dlopen(bd->path, RTLD_NOW | RTLD_LOCAL);
    if (!bd->dl)
        die("cannot load", dlerror());
    create_fn create = (create_fn)dlsym(bd->dl, "fx_block_mask_create");
    bd->mask_free = (free_fn)dlsym(bd->dl, "fx_block_mask_free");
    bd->forward = (forward_fn)dlsym(bd->dl, "fx_flex_attention");
    fx_mask_fn fn = (fx_mask_fn)dlsym(bd->dl, W > 0 ? "fx_mask_sliding_window" : "fx_mask_causal");
    if (!create || !bd->mask_free || !bd->forward || !fn)
        die("missing symbols in", bd->path);
    bd->window.window = W;
    if (create(&bd->mask, fn, W > 0 ? &bd->window : NULL, 1, 1, L, L, 0, 0) != FX_OK)
        die("block mask failed in", bd->path);
}

static float *floats(size_t n)
{
    float *p = malloc(n * sizeof(float));
    if (!p)
        die("out of memory", NULL);
    return p;
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: attention_ab A.so B.so L W REPS [--fresh] [--cpu]\n");
        return 2;
    }
    build bd[2] = {{.path = argv[1]}, {.path = argv[2]}};
    const int64_t L = atoll(argv[3]), W = atoll(argv[4]);
    int reps = atoi(argv[5]);
    bool fresh = false;
    for (int i = 6; i < argc; i++) {
        if (!strcmp(argv[i], "--fresh"))
            fresh = true;
        else if (!strcmp(argv[i], "--cpu"))
            use_cpu = true;
        else
            die("unknown option", argv[i]);
    }
    if (L < 1 || W < 0 || reps < 1 || reps > MAX_REPS)
        die("need L >= 1, W >= 0 and 1 <= REPS <= 256", NULL);
    load(&bd[0], L, W);
    load(&bd[1], L, W);

    const int64_t H = 8, D = 64;
    const size_t n = (size_t)(H * L * D), nl = (size_t)(H * L);
    float *q = floats(n), *k = floats(n), *v = floats(n);
    uint64_t x = 88172645463325252ull; /* xorshift: the same inputs on every run */
    for (size_t i = 0; i < 3 * n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        float r = (float)(x >> 40) / (float)(1 << 24) - 0.5f;
        (i < n ? q : i < 2 * n ? k : v)[i % n] = r;
    }
    fx_attention a = {.B = 1, .Hq = H, .Hkv = H, .Lq = L, .Lkv = L, .D = D, .Dv = D};
    float *out[2] = {floats(n), floats(n)}, *lse[2] = {floats(nl), floats(nl)};
    for (int s = 0; s < 2; s++) { /* warm-up, and the outputs compared below */
        a.mask = bd[s].mask;
        if (bd[s].forward(&a, q, k, v, out[s], lse[s]) != FX_OK)
            die("forward failed in", bd[s].path);
    }
    const bool same = !memcmp(out[0], out[1], n * sizeof(float)) && !memcmp(lse[0], lse[1], nl * sizeof(float));

    double t[2][MAX_REPS], ratio[MAX_REPS];
    for (int r = 0; r < reps; r++) {
        for (int s = 0; s < 2; s++) {
            if (fresh) {
                free(out[s]), free(lse[s]);
                out[s] = NULL, lse[s] = NULL;
            }
            a.mask = bd[s].mask;
            double t0 = now();
            if (fresh)
                out[s] = floats(n), lse[s] = floats(nl);
            if (bd[s].forward(&a, q, k, v, out[s], lse[s]) != FX_OK)
                die("forward failed in", bd[s].path);
            t[s][r] = now() - t0;
        }
        ratio[r] = t[0][r] / t[1][r];
    }
    const char *threads = getenv("OMP_NUM_THREADS");
    printf("{\"case\":\"attention_ab\",\"L\":%lld,\"window\":%lld,\"reps\":%d,\"fresh_output\":%s,\"clock\":\"%s\","
           "\"omp_num_threads\":\"%s\",\"a\":\"%s\",\"b\":\"%s\",\"a_s\":%.4f,\"b_s\":%.4f,\"a_over_b\":%.3f,"
           "\"bitwise_equal\":%s}\n",
           (long long)L, (long long)W, reps, fresh ? "true" : "false", use_cpu ? "cpu" : "wall",
           threads ? threads : "", bd[0].path, bd[1].path, median(t[0], reps), median(t[1], reps),
           median(ratio, reps), same ? "true" : "false");
    for (int s = 0; s < 2; s++) {
        bd[s].mask_free(bd[s].mask);
        free(out[s]), free(lse[s]);
    }
    free(q), free(k), free(v);
    return 0;
}
