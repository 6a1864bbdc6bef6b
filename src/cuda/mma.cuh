/* Warp-level tensor-core primitives (sm_80 and later): mma.sync m16n8k16 with float
   accumulation, ldmatrix, cp.async and the packing of two floats into a bf16x2 or f16x2
   register. Included after common.cuh.

   Fragment layouts are those of the PTX ISA. With g = lane / 4 and t = lane % 4:
     A (16 x 16, row-major), a[4]: a[0] = (row g, cols 2t, 2t+1), a[1] = (g + 8, 2t..),
                                   a[2] = (g, 2t + 8..),          a[3] = (g + 8, 2t + 8..)
     B (16 x 8, "col"), b[2]:      b[0] = (rows 2t, 2t+1; col g),  b[1] = (rows 2t + 8, 2t + 9; col g)
     C, D (16 x 8 float), c[4]:    c[0], c[1] = (row g, cols 2t, 2t+1), c[2], c[3] = (row g + 8, ..)
   The lower-numbered element of a pair sits in the register's low half.

   On a GPU these are inline PTX. Under FX_CUDA_EMU (src/cuda/emu.h) each call exchanges the
   lanes' operands (fxemu::warp_gather) and computes the same fragments on the CPU: products
   and sums in float, k ascending; cp.async copies at once. */
#ifndef FX_CUDA_MMA_CUH
#define FX_CUDA_MMA_CUH

#include <stdint.h>

#ifndef FX_CUDA_EMU
#include <cuda_fp16.h>
#endif

namespace fxcu {

typedef __half f16;

#ifndef FX_CUDA_EMU

/* D = A B + C, bf16 (or f16) inputs, float accumulators. */
__device__ __forceinline__ void mma_16816_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
                   "f"(c[2]), "f"(c[3]));
}

__device__ __forceinline__ void mma_16816_f16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
                   "f"(c[2]), "f"(c[3]));
}

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* ldmatrix.m8n8.b16: lane l gives the address of row l % 8 of matrix l / 8 (16 bytes, 16-byte
   aligned); r[i] receives matrix i's (row g, cols 2t, 2t+1), or with .trans its (rows 2t,
   2t+1; col g). */
__device__ __forceinline__ void ldmatrix_x1(uint32_t r[1], const void *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(smem_addr(row)));
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], const void *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(row)));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row)));
}

__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t r[2], const void *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(row)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *row)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row)));
}

/* 16 bytes global -> shared, bypassing L1; bytes src_bytes.. of the 16 are zeros. With
   src_bytes = 0 nothing is read, but gmem should still be a valid address. */
__device__ __forceinline__ void cp_async_16(void *smem, const void *gmem, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
                 "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/* Waits until at most N committed groups of this thread are pending. */
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ uint32_t pack_f16(float lo, float hi)
{
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* A 4-byte store and a 16-byte copy (both addresses 16-byte aligned), shared or global. */
__device__ __forceinline__ void store_u32(void *p, uint32_t x) { *(uint32_t *)p = x; }
__device__ __forceinline__ void copy_16(void *dst, const void *src) { *(uint4 *)dst = *(const uint4 *)src; }

#else /* FX_CUDA_EMU */

namespace emu_mma {

inline float bf16_bits(uint32_t h) { return __bfloat162float(__nv_bfloat16{(uint16_t)h}); }
inline float f16_bits(uint32_t h) { return __half2float(__half{(uint16_t)h}); }

/* Element (row, col) of the A fragment set of a warp: frag[lane][4], halves of 16 bits. */
template <float (*CVT)(uint32_t)> inline float a_elem(const uint32_t (*frag)[6], int row, int col)
{
    const int lane = (row & 7) * 4 + ((col & 7) >> 1);
    const int reg = (row >> 3) + 2 * (col >> 3);
    return CVT((frag[lane][reg] >> (16 * (col & 1))) & 0xffffu);
}

/* Element (k, n) of the B fragment set: b in slots 4 and 5. */
template <float (*CVT)(uint32_t)> inline float b_elem(const uint32_t (*frag)[6], int k, int n)
{
    const int lane = n * 4 + ((k & 7) >> 1);
    const int reg = 4 + (k >> 3);
    return CVT((frag[lane][reg] >> (16 * (k & 1))) & 0xffffu);
}

template <float (*CVT)(uint32_t)> inline void mma(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4])
{
    uint32_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]}, all[32][6];
    fxemu::warp_gather(mine, all, sizeof mine);
    const int lane = (int)(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
    float r[4];
    for (int i = 0; i < 4; i++) {
        const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        float acc = c[i];
        for (int k = 0; k < 16; k++)
            acc += a_elem<CVT>(all, row, k) * b_elem<CVT>(all, k, col);
        r[i] = acc;
    }
    for (int i = 0; i < 4; i++)
        d[i] = r[i];
}

/* ldmatrix of n matrices, transposed or not, from the lanes' row addresses. */
inline void ldmatrix(uint32_t *r, int n, bool trans, const void *row)
{
    const void *all[32];
    fxemu::warp_gather(&row, all, sizeof row);
    const int lane = (int)(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
    for (int i = 0; i < n; i++) {
        uint16_t h[2];
        for (int j = 0; j < 2; j++) {
            if (trans)
                std::memcpy(&h[j], (const char *)all[i * 8 + 2 * t + j] + 2 * g, 2);
            else
                std::memcpy(&h[j], (const char *)all[i * 8 + g] + 2 * (2 * t + j), 2);
        }
        r[i] = (uint32_t)h[0] | (uint32_t)h[1] << 16;
    }
}

} // namespace emu_mma

inline void mma_16816_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4])
{
    emu_mma::mma<emu_mma::bf16_bits>(d, a, b, c);
}
inline void mma_16816_f16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4])
{
    emu_mma::mma<emu_mma::f16_bits>(d, a, b, c);
}
inline void ldmatrix_x1(uint32_t r[1], const void *row) { emu_mma::ldmatrix(r, 1, false, row); }
inline void ldmatrix_x2(uint32_t r[2], const void *row) { emu_mma::ldmatrix(r, 2, false, row); }
inline void ldmatrix_x4(uint32_t r[4], const void *row) { emu_mma::ldmatrix(r, 4, false, row); }
inline void ldmatrix_x2_trans(uint32_t r[2], const void *row) { emu_mma::ldmatrix(r, 2, true, row); }
inline void ldmatrix_x4_trans(uint32_t r[4], const void *row) { emu_mma::ldmatrix(r, 4, true, row); }

inline void cp_async_16(void *smem, const void *gmem, int src_bytes)
{
    if (src_bytes > 0)
        std::memcpy(smem, gmem, (size_t)src_bytes);
    std::memset((char *)smem + src_bytes, 0, (size_t)(16 - src_bytes));
}
inline void cp_async_commit() {}
template <int N> inline void cp_async_wait() {}

inline uint32_t pack_bf16(float lo, float hi)
{
    return (uint32_t)__float2bfloat16_rn(lo).x | (uint32_t)__float2bfloat16_rn(hi).x << 16;
}
inline uint32_t pack_f16(float lo, float hi)
{
    return (uint32_t)__float2half_rn(lo).x | (uint32_t)__float2half_rn(hi).x << 16;
}

inline void store_u32(void *p, uint32_t x) { std::memcpy(p, &x, 4); }
inline void copy_16(void *dst, const void *src) { std::memcpy(dst, src, 16); }

#endif /* FX_CUDA_EMU */

} // namespace fxcu

#endif
