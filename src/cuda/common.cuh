/* common.cuh: what every stock-path .cu file shares: the CUDA check macros, bf16 helpers,
 * warp/block reductions, the mma / cp.async wrappers and the weight-streaming matmul core
 * (used by matmul.cu for y = r16(x W^T) and by logits.cu for the lm_head).
 *
 * The matmul core is here, not in matmul.cu, because two op families (matmul, logits) run
 * the same main loop with different epilogues; we rejected a run-time epilogue switch inside
 * one kernel (the logits epilogue needs registers and code the plain matmul should not pay).
 * bf16 conversions use the cuda_bf16.h intrinsics (round to nearest even, as codec.h's
 * sm_f32_to_bf16 for every non-NaN value); we rejected calling codec.h's memcpy-based
 * versions in hot loops.
 */
#ifndef SM_CUDA_COMMON_CUH
#define SM_CUDA_COMMON_CUH
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdio.h>
#include <math.h>
extern "C" {
#include "err.h"
#include "kvcache.h"
}
#include "codec.h"

/* ---- checks ---- */
/* Check a CUDA runtime call; on failure fill the sm_err `e` in scope and return -1. */
#define SM_CUDA_CHECK(call)                                                                  \
    do {                                                                                     \
        cudaError_t sm_rc_ = (call);                                                         \
        if (sm_rc_ != cudaSuccess) {                                                         \
            int sm_dev_ = -1;                                                                \
            cudaGetDevice(&sm_dev_);                                                         \
            return sm_errf(e, "%s failed at %s:%d (device %d): %s", #call, __FILE__,         \
                           __LINE__, sm_dev_, cudaGetErrorString(sm_rc_));                   \
        }                                                                                    \
    } while (0)
/* Same for functions that cannot return an error (free paths): print to stderr instead. */
#define SM_CUDA_CHECK_PRINT(call)                                                            \
    do {                                                                                     \
        cudaError_t sm_rc_ = (call);                                                         \
        if (sm_rc_ != cudaSuccess) {                                                         \
            int sm_dev_ = -1;                                                                \
            cudaGetDevice(&sm_dev_);                                                         \
            fprintf(stderr, "%s failed at %s:%d (device %d): %s\n", #call, __FILE__,         \
                    __LINE__, sm_dev_, cudaGetErrorString(sm_rc_));                          \
        }                                                                                    \
    } while (0)
/* cuBLAS status check, same contract as SM_CUDA_CHECK. */
#define SM_CUBLAS_CHECK(call)                                                                \
    do {                                                                                     \
        cublasStatus_t sm_bs_ = (call);                                                      \
        if (sm_bs_ != CUBLAS_STATUS_SUCCESS) {                                               \
            int sm_dev_ = -1;                                                                \
            cudaGetDevice(&sm_dev_);                                                         \
            return sm_errf(e, "%s failed at %s:%d (device %d): cublas status %d", #call,     \
                           __FILE__, __LINE__, sm_dev_, (int)sm_bs_);                        \
        }                                                                                    \
    } while (0)
/* After a <<<>>> launch: the launch error (configuration, resources), naming the kernel. */
#define SM_LAUNCH_CHECK(name)                                                                \
    do {                                                                                     \
        cudaError_t sm_rc_ = cudaGetLastError();                                             \
        if (sm_rc_ != cudaSuccess) {                                                         \
            int sm_dev_ = -1;                                                                \
            cudaGetDevice(&sm_dev_);                                                         \
            return sm_errf(e, "launch of %s failed at %s:%d (device %d): %s", name,          \
                           __FILE__, __LINE__, sm_dev_, cudaGetErrorString(sm_rc_));         \
        }                                                                                    \
    } while (0)

static inline int sm_cdiv(int a, int b) { return (a + b - 1) / b; }
static inline int sm_aligned(const void *p, size_t a) { return ((uintptr_t)p % a) == 0; }

/* ---- bf16 ---- */
__device__ __forceinline__ float sm_bf(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ uint16_t sm_tobf(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
__device__ __forceinline__ float sm_r16d(float f) { return sm_bf(sm_tobf(f)); }
/* Low / high element of a packed bf16 pair (low address = low half). */
__device__ __forceinline__ float sm_bf_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float sm_bf_hi(uint32_t u) { return __uint_as_float(u & 0xFFFF0000u); }

/* ---- reductions (butterfly: every lane ends with the same, bitwise identical value) ---- */
__device__ __forceinline__ float sm_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}
__device__ __forceinline__ float sm_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}
/* Sum over the block (blockDim.x a multiple of 32, at most 1024); red: __shared__ [32].
 * Every thread gets the total; contains barriers, so every thread must call it. */
__device__ __forceinline__ float sm_block_sum(float v, float *red) {
    v = sm_warp_sum(v);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads(); /* red may still be read by a previous call */
    if (l == 0) red[w] = v;
    __syncthreads();
    float t = (l < nw) ? red[l] : 0.0f;
    return sm_warp_sum(t);
}
/* (value, id) order of every argmax here: larger value first, then the lower id; id < 0 = none. */
__device__ __forceinline__ int sm_better(float v, int i, float bv, int bi) {
    return i >= 0 && (bi < 0 || v > bv || (v == bv && i < bi));
}

/* ---- tensor-core and async-copy primitives (sm_80+) ---- */
/* d += A (16x16 bf16, row) * B (16x8 bf16, col), f32 accumulate. */
__device__ __forceinline__ void sm_mma16816(float *d, uint32_t a0, uint32_t a1, uint32_t a2,
                                            uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/* 16-byte global -> shared copy; src_bytes 0 zero-fills the destination. */
__device__ __forceinline__ void sm_cp_async16(void *smem, const void *gmem, int src_bytes) {
    uint32_t sa = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void sm_cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void sm_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
/* Streaming 16-byte load of data read once (weights): evict-first in L2, no L1 allocation. */
__device__ __forceinline__ uint4 sm_ld_stream(const uint4 *p) { return __ldcs(p); }

/* ---- the weight-streaming matmul core ("swap AB") ----
 * One block of SM_MM_WARPS warps computes C[r, j] = sum_k W[r, k] * x[j, k] for the block's
 * SM_MM_ROWS rows r of W (warp w: rows row0 + 16w .. +15) and all tokens j < NT*8, over the
 * chunks [c0, c1) of 32 k values.  W rows are the M side of mma.m16n8k16, tokens the N side.
 * k is permuted consistently for A and B so that every lane reads 16 contiguous bytes:
 * within a chunk lane (g, t) holds k = 8t .. 8t+7; mma step 0 takes 8t+0..3 (positions
 * 2t, 2t+1, 2t+8, 2t+9), step 1 takes 8t+4..7.  W goes global -> registers one slab ahead
 * (4 chunks = 16 rows x 256 bytes per warp in flight); x goes global -> shared by cp.async,
 * double-buffered per slab, rows padded by 64 bytes so the fragment reads are conflict-free.
 * Result: acc[nt][0..1] = C[row0 + 16w + g][nt*8 + 2t + {0,1}], acc[nt][2..3] the same at
 * row + 8.  Rows >= m read row m-1 (the caller drops them); tokens >= n read zeros. */
#define SM_MM_WARPS 4
#define SM_MM_ROWS (SM_MM_WARPS * 16)
#define SM_MM_CPS 4                     /* chunks of 32 k per slab */
#define SM_MM_ROWU (SM_MM_CPS * 4 + 4)  /* uint4 per shared row: 16 data + 4 pad (64 bytes) */
/* Dynamic shared memory of the core for NT token tiles. */
#define SM_MM_SMEM(NT) ((size_t)2 * (NT) * 8 * SM_MM_ROWU * 16)

template <int NT>
__device__ __forceinline__ void sm_mm_stage_x(uint4 *dst, const uint16_t *x, int n, int k, int cb, int ce) {
    const int per_row = SM_MM_CPS * 4;
    for (int i = threadIdx.x; i < NT * 8 * per_row; i += blockDim.x) {
        const int r = i / per_row, u = i % per_row, c = cb + (u >> 2);
        const int ok = r < n && c < ce;
        const uint4 *src = ok ? (const uint4 *)(x + (size_t)r * k) + c * 4 + (u & 3) : (const uint4 *)x;
        sm_cp_async16(dst + r * SM_MM_ROWU + u, src, ok ? 16 : 0);
    }
}

template <int NT>
__device__ __forceinline__ void sm_mm_core(const uint16_t *__restrict__ x, int n, int k,
                                           const uint16_t *__restrict__ W, int m, int row0,
                                           int c0, int c1, uint4 *xs, float (&acc)[NT][4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int ra = min(row0 + g, m - 1), rb = min(row0 + g + 8, m - 1);
    const uint4 *wa = (const uint4 *)(W + (size_t)ra * k) + t; /* chunk c: wa[4c] */
    const uint4 *wb = (const uint4 *)(W + (size_t)rb * k) + t;
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const int nslab = (c1 - c0 + SM_MM_CPS - 1) / SM_MM_CPS;
    /* prologue: slab 0 of x to buffer 0, slab 0 of W to registers */
    sm_mm_stage_x<NT>(xs, x, n, k, c0, min(c0 + SM_MM_CPS, c1));
    sm_cp_async_commit();
    uint4 ca[SM_MM_CPS], cb[SM_MM_CPS];
#pragma unroll
    for (int j = 0; j < SM_MM_CPS; j++) {
        const int c = c0 + j;
        ca[j] = c < c1 ? sm_ld_stream(wa + 4 * c) : zero;
        cb[j] = c < c1 ? sm_ld_stream(wb + 4 * c) : zero;
    }
    for (int s = 0; s < nslab; s++) {
        const int cs = c0 + s * SM_MM_CPS, cn = cs + SM_MM_CPS;
        /* next slab of W in flight while this one computes */
        uint4 na[SM_MM_CPS], nb[SM_MM_CPS];
#pragma unroll
        for (int j = 0; j < SM_MM_CPS; j++) {
            const int c = cn + j;
            na[j] = c < c1 ? sm_ld_stream(wa + 4 * c) : zero;
            nb[j] = c < c1 ? sm_ld_stream(wb + 4 * c) : zero;
        }
        /* next slab of x into the other buffer (freed by the barrier ending slab s-1) */
        if (cn < c1) sm_mm_stage_x<NT>(xs + ((s + 1) & 1) * NT * 8 * SM_MM_ROWU, x, n, k, cn, min(cn + SM_MM_CPS, c1));
        sm_cp_async_commit();
        sm_cp_async_wait<1>(); /* this thread's copies of slab s landed */
        __syncthreads();       /* ... and everyone's */
        const uint4 *xb = xs + (s & 1) * NT * 8 * SM_MM_ROWU;
#pragma unroll
        for (int j = 0; j < SM_MM_CPS; j++) {
            if (cs + j < c1) {
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const uint4 b = xb[(nt * 8 + g) * SM_MM_ROWU + j * 4 + t];
                    /* step 0: k 8t+0..3; step 1: k 8t+4..7 */
                    sm_mma16816(acc[nt], ca[j].x, cb[j].x, ca[j].y, cb[j].y, b.x, b.y);
                    sm_mma16816(acc[nt], ca[j].z, cb[j].z, ca[j].w, cb[j].w, b.z, b.w);
                }
            }
        }
        __syncthreads(); /* buffer (s & 1) free for slab s + 2 */
#pragma unroll
        for (int j = 0; j < SM_MM_CPS; j++) { ca[j] = na[j]; cb[j] = nb[j]; }
    }
    sm_cp_async_wait<0>(); /* nothing left in flight (empty trailing groups) */
}

#endif
