/* Helpers of the GPU tests (test_cuda_gpu_*.c): device buffers, bfloat16 conversion, the
   skip when no GPU is visible, and the comparisons the tests make against the CPU path.

   Built two ways: against the CUDA runtime (CTest label gpu: skipped, exit 77, without a
   GPU), and with FX_CUDA_EMU against the CPU emulation of src/cuda/emu.h (label emu: runs
   everywhere, executing the kernels' code on the CPU). */
#ifndef FLEXC_TEST_CUDA_GPU_H
#define FLEXC_TEST_CUDA_GPU_H

#include "harness.h"

#ifdef FX_CUDA_EMU
#include "cuda/emu.h"
#else
#include <cuda_runtime_api.h>
#endif

/* Exits 77 (CTest: skipped) with the reason when no CUDA device is visible. */
static void gpu_require(void)
{
    if (fx_cuda_device_count() > 0)
        return;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    printf("SKIP: no CUDA device is visible (%s): the GPU tests need one\n",
           e == cudaSuccess ? "device count 0" : cudaGetErrorString(e));
    exit(77);
}

static void *gpu_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 4) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc(%zu) failed\n", bytes);
        exit(2);
    }
    return p;
}

static void *gpu_upload(const void *host, size_t bytes)
{
    void *p = gpu_alloc(bytes);
    if (bytes && cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        fprintf(stderr, "cudaMemcpy to the device failed\n");
        exit(2);
    }
    return p;
}

static void gpu_download(void *host, const void *dev, size_t bytes)
{
    if (bytes && cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        fprintf(stderr, "cudaMemcpy from the device failed\n");
        exit(2);
    }
}

static void gpu_free(void *p)
{
    if (p)
        cudaFree(p);
}

/* bfloat16, round to nearest even (NaN kept a NaN). */
static uint16_t bf16_from(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_to(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* x rounded to bfloat16 in place (so the CPU reference sees the device's inputs). */
static void bf16_round(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = bf16_to(bf16_from(x[i]));
}

/* A device copy of host floats as float32 or bfloat16. */
static void *gpu_upload_as(const float *x, size_t n, bool bf16)
{
    if (!bf16)
        return gpu_upload(x, n * sizeof(float));
    uint16_t *h = (uint16_t *)malloc((n ? n : 1) * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++)
        h[i] = bf16_from(x[i]);
    void *p = gpu_upload(h, n * sizeof(uint16_t));
    free(h);
    return p;
}

/* n device values (float32 or bfloat16) as host floats. */
static void gpu_download_as(float *x, const void *dev, size_t n, bool bf16)
{
    if (!bf16) {
        gpu_download(x, dev, n * sizeof(float));
        return;
    }
    uint16_t *h = (uint16_t *)malloc((n ? n : 1) * sizeof(uint16_t));
    gpu_download(h, dev, n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++)
        x[i] = bf16_to(h[i]);
    free(h);
}

/* The device result against the CPU path's: float32 within 1e-5 relative (plus 1e-5 of the
   reference's largest magnitude, for values near zero); bfloat16 within 1e-2 of the
   reference's largest magnitude. Infinities and NaN must match exactly. */
static bool gpu_close(const char *what, const float *got, const float *ref, size_t n, bool bf16)
{
    double *r = fxt_alloc_f64(n), big = 0.0;
    for (size_t i = 0; i < n; i++) {
        r[i] = ref[i];
        if (isfinite(ref[i]) && fabs(ref[i]) > big)
            big = fabs(ref[i]);
    }
    bool ok = bf16 ? fxt_close_f32(what, got, r, n, 1e-2 * big, 0.0) : fxt_close_f32(what, got, r, n, 1e-5 * big, 1e-5);
    free(r);
    return ok;
}

/* Two runs of a device call gave the same bits. */
static bool gpu_same(const char *what, const float *a, const float *b, size_t n)
{
    return fxt_bitwise_f32(what, a, b, n);
}

#endif
