/* The bfloat16 GEMM of `--dtype bf16` (fx__gemm_bf16, the CPU's path) against oneDNN's
   matmul primitive (bfloat16 A and B, float32 C) on the same operands, at the same shapes as
   bench/gemm_bf16.c: the projections of the `small` and `gpt2` models (forward x W^T,
   backward dy W and dy^T x). Both read bfloat16 storage, and flexc also the same values in
   float32 storage (rounded as read, as a training step's activations are); calls
   alternate, medians; prints one JSON object per shape with the rates, oneDNN's
   implementation and flexc / oneDNN, and whether oneDNN's C on one thread is bitwise its C on
   OMP_NUM_THREADS (flexc's is: tests/test_gemm_bf16.c). A last shape with a long K and little
   else is there for that check only.
   Built by CMake as bench_gemm_bf16_onednn where oneDNN is installed (Debian: libdnnl-dev).
   Threads: OMP_NUM_THREADS (oneDNN's Debian build runs on OpenMP too).

       OMP_NUM_THREADS=2 build/bench_gemm_bf16_onednn [REPS] */
#include <stdio.h>
#include <stdlib.h>

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <string.h>

#include "gemm_bf16_shapes.h"
#include "median.h"
#include "core/gemm_bf16.h"

enum { MAX_REPS = 64 };

#define DNNL_OK(call)                                                                                                \
    do {                                                                                                             \
        dnnl_status_t st_ = (call);                                                                                  \
        if (st_ != dnnl_success) {                                                                                   \
            fprintf(stderr, "bench_gemm_bf16_onednn: %s failed (status %d)\n", #call, (int)st_);                   \
            exit(1);                                                                                                 \
        }                                                                                                            \
    } while (0)

/* oneDNN's C = A B for A [M, K] and B [K, N] in bfloat16 (row-major, or transposed when ta /
   tb: stored as [K, M] / [N, K]), C [M, N] float32 row-major. */
typedef struct onednn_gemm {
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
    const char *impl;
    dnnl_primitive_desc_t pd;
} onednn_gemm;

static onednn_gemm onednn_gemm_create(dnnl_engine_t eng, int64_t M, int64_t N, int64_t K, bool ta, bool tb,
                                      uint16_t *A, uint16_t *B, float *C)
{
    onednn_gemm g;
    dnnl_memory_desc_t a_md, b_md, c_md;
    const dnnl_dims_t ad = {M, K}, bd = {K, N}, cd = {M, N};
    DNNL_OK(dnnl_memory_desc_init_by_tag(&a_md, 2, ad, dnnl_bf16, ta ? dnnl_ba : dnnl_ab));
    DNNL_OK(dnnl_memory_desc_init_by_tag(&b_md, 2, bd, dnnl_bf16, tb ? dnnl_ba : dnnl_ab));
    DNNL_OK(dnnl_memory_desc_init_by_tag(&c_md, 2, cd, dnnl_f32, dnnl_ab));
    dnnl_matmul_desc_t md;
    DNNL_OK(dnnl_matmul_desc_init(&md, &a_md, &b_md, NULL, &c_md));
    DNNL_OK(dnnl_primitive_desc_create(&g.pd, &md, NULL, eng, NULL));
    DNNL_OK(dnnl_primitive_create(&g.prim, g.pd));
    DNNL_OK(dnnl_primitive_desc_query(g.pd, dnnl_query_impl_info_str, 0, &g.impl));
    DNNL_OK(dnnl_memory_create(&g.a, &a_md, eng, A));
    DNNL_OK(dnnl_memory_create(&g.b, &b_md, eng, B));
    DNNL_OK(dnnl_memory_create(&g.c, &c_md, eng, C));
    return g;
}

static void onednn_gemm_run(const onednn_gemm *g, dnnl_stream_t s)
{
    const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, g->a}, {DNNL_ARG_WEIGHTS, g->b}, {DNNL_ARG_DST, g->c}};
    DNNL_OK(dnnl_primitive_execute(g->prim, s, 3, args));
    DNNL_OK(dnnl_stream_wait(s));
}

static void onednn_gemm_free(onednn_gemm *g)
{
    dnnl_memory_destroy(g->a), dnnl_memory_destroy(g->b), dnnl_memory_destroy(g->c);
    dnnl_primitive_destroy(g->prim);
    dnnl_primitive_desc_destroy(g->pd);
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 7;
    if (argc > 2 || reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "usage: bench_gemm_bf16_onednn [REPS (1..%d, default 7)]\n", MAX_REPS);
        return 2;
    }
    bench_gemm_shape shapes[BENCH_GEMM_STEP_SHAPES + 1];
    for (int s = 0; s < BENCH_GEMM_STEP_SHAPES; s++)
        shapes[s] = bench_gemm_step_shapes[s];
    shapes[BENCH_GEMM_STEP_SHAPES] = (bench_gemm_shape){"long K", 16, 64, 4096, true, false};
    const fx__bf16_tiled *cpu = fx__gemm_bf16_cpu_path();
    const char *path = cpu == &fx__bf16_tiled_amx ? "AMX" : cpu == &fx__bf16_tiled_dp ? "vdpbf16ps" : "float32";
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    DNNL_OK(dnnl_engine_create(&eng, dnnl_cpu, 0));
    DNNL_OK(dnnl_stream_create(&stream, eng, dnnl_stream_default_flags));
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t M = shapes[s].M, N = shapes[s].N, K = shapes[s].K;
        const bool ta = shapes[s].ta, tb = shapes[s].tb;
        uint16_t *A = malloc((size_t)(M * K) * sizeof(uint16_t)), *B = malloc((size_t)(K * N) * sizeof(uint16_t));
        float *C = malloc((size_t)(M * N) * sizeof(float)), *ws = malloc(fx__gemm_bf16_ws(M, N, K) * sizeof(float));
        float *A32 = malloc((size_t)(M * K) * sizeof(float)), *B32 = malloc((size_t)(K * N) * sizeof(float));
        float *C1 = malloc((size_t)(M * N) * sizeof(float));
        if (!A || !B || !C || !ws || !A32 || !B32 || !C1) {
            fprintf(stderr, "bench_gemm_bf16_onednn: out of memory\n");
            return 1;
        }
        bench_gemm_operands(&shapes[s], A32, B32);
        fx__f32_to_bf16_n(A, A32, M * K);
        fx__f32_to_bf16_n(B, B32, K * N);
        const int64_t lda = ta ? M : K, ldb = tb ? K : N;
        onednn_gemm g = onednn_gemm_create(eng, M, N, K, ta, tb, A, B, C);
        double tf[MAX_REPS], t32[MAX_REPS], td[MAX_REPS];
        for (int r = -1; r < reps; r++) { /* r = -1: a warm-up of each */
            double t0 = fx__seconds();
            fx__gemm_bf16(ta, tb, M, N, K, fx__bf16_of(A), lda, fx__bf16_of(B), ldb, 0.0f, C, N, ws);
            const double a = fx__seconds() - t0;
            t0 = fx__seconds();
            fx__gemm_bf16(ta, tb, M, N, K, fx__bf16_of_f32(A32), lda, fx__bf16_of_f32(B32), ldb, 0.0f, C, N, ws);
            const double a32 = fx__seconds() - t0;
            t0 = fx__seconds();
            onednn_gemm_run(&g, stream);
            const double b = fx__seconds() - t0;
            if (r >= 0)
                tf[r] = a, t32[r] = a32, td[r] = b;
        }
        const double mf = median(tf, reps), m32 = median(t32, reps), md = median(td, reps);
        const double gf = 2e-9 * (double)(M * N * K);
        /* oneDNN's C on one thread (a primitive made for one) against its C on all of them,
           which the timed loop's last call left in C */
        const int threads = omp_get_max_threads();
        omp_set_num_threads(1);
        onednn_gemm g1 = onednn_gemm_create(eng, M, N, K, ta, tb, A, B, C1);
        onednn_gemm_run(&g1, stream);
        onednn_gemm_free(&g1);
        omp_set_num_threads(threads);
        const bool same = memcmp(C, C1, (size_t)(M * N) * sizeof(float)) == 0;
        printf("{\"case\":\"gemm_bf16_onednn\",\"shape\":\"%s\",\"M\":%lld,\"N\":%lld,\"K\":%lld,\"flexc_path\":\"%s\","
               "\"onednn_impl\":\"%s\",\"threads\":%d,\"reps\":%d,\"flexc_gflops\":%.1f,\"flexc_f32_storage_gflops\":%.1f,"
               "\"onednn_gflops\":%.1f,\"flexc_over_onednn\":%.2f,\"onednn_1_thread_bitwise\":%s}\n",
               shapes[s].name, (long long)M, (long long)N, (long long)K, path, g.impl, threads, reps, gf / mf,
               gf / m32, gf / md, md / mf, same ? "true" : "false");
        onednn_gemm_free(&g);
        free(A), free(B), free(C), free(C1), free(ws), free(A32), free(B32);
    }
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(eng);
    return 0;
}
