/* common.cuh: what every CUDA file shares: the CUDA check macros, the device check, bf16 helpers, warp/block
 * reductions, the argmax order, the mma.sync / cp.async / wgmma wrappers, and W4A4's activations
 * as e4m3 codes (written by ops/ and moe/ alike, which may not include each other).  The op
 * bodies live in ops/<family>.cuh, the MoE stage in moe/.
 *
 * bf16 conversions use the cuda_bf16.h intrinsics (round to nearest even, as codec.h's
 * sm_f32_to_bf16 for every non-NaN value); we rejected calling codec.h's memcpy-based
 * versions in hot loops.
 */
#ifndef SM_CUDA_COMMON_CUH
#define SM_CUDA_COMMON_CUH
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <stdio.h>
#include <math.h>
extern "C" {
#include "base/err.h"
#include "backend/kvcache.h"
}
#include "model/codec.h"

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
/* Same for cuBLAS calls on free paths: print to stderr instead. */
#define SM_CUBLAS_CHECK_PRINT(call)                                                          \
    do {                                                                                     \
        cublasStatus_t sm_bs_ = (call);                                                      \
        if (sm_bs_ != CUBLAS_STATUS_SUCCESS) {                                               \
            int sm_dev_ = -1;                                                                \
            cudaGetDevice(&sm_dev_);                                                         \
            fprintf(stderr, "%s failed at %s:%d (device %d): cublas status %d\n", #call,     \
                    __FILE__, __LINE__, sm_dev_, (int)sm_bs_);                               \
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

/* 0 when `device` exists (and, hopper != 0, is a compute capability 9.x device); else one
 * line "<who>: ..." naming the device (the backend's ranks, the monokernel's check, the bench). */
static inline int sm_cuda_device_check(int device, int hopper, const char *who, sm_err *e) {
    int n = 0;
    cudaError_t r = cudaGetDeviceCount(&n);
    if (r != cudaSuccess || n == 0)
        return sm_errf(e, "%s: no CUDA device available (%s)", who, r != cudaSuccess ? cudaGetErrorString(r) : "0 devices");
    if (device < 0 || device >= n)
        return sm_errf(e, "%s: device %d does not exist (%d CUDA device%s: 0..%d)", who, device, n, n == 1 ? "" : "s", n - 1);
    if (!hopper) return 0;
    cudaDeviceProp p;
    SM_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    if (p.major != 9)
        return sm_errf(e, "%s: device %d (%s) has compute capability %d.%d; this build targets sm_90a (Hopper)", who, device,
                       p.name, p.major, p.minor);
    return 0;
}

static inline int sm_cdiv(int a, int b) { return (a + b - 1) / b; }
static inline int sm_aligned(const void *p, size_t a) { return ((uintptr_t)p % a) == 0; }

/* ---- bf16 ---- */
__device__ __forceinline__ float sm_bf(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ uint16_t sm_tobf(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
__device__ __forceinline__ float sm_r16d(float f) { return sm_bf(sm_tobf(f)); }
/* Low / high element of a packed bf16 pair (low address = low half). */
__device__ __forceinline__ float sm_bf_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float sm_bf_hi(uint32_t u) { return __uint_as_float(u & 0xFFFF0000u); }
/* The 8 bf16 of a 16-byte word as f32, in memory order. */
__device__ __forceinline__ void sm_unpack8_bf(const uint4 u, float (&v)[8]) {
    v[0] = sm_bf_lo(u.x); v[1] = sm_bf_hi(u.x); v[2] = sm_bf_lo(u.y); v[3] = sm_bf_hi(u.y);
    v[4] = sm_bf_lo(u.z); v[5] = sm_bf_hi(u.z); v[6] = sm_bf_lo(u.w); v[7] = sm_bf_hi(u.w);
}

/* Memory-order and clock primitives of the waits that span blocks (the monokernel's grid
 * barrier: gpu scope) or devices (the cross-rank flags: system scope); the globaltimer in ns. */
__device__ __forceinline__ unsigned sm_ld_acquire_gpu_u32(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void sm_st_release_gpu_u32(unsigned *p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint64_t sm_ld_acquire_sys_u64(const uint64_t *p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void sm_st_release_sys_u64(uint64_t *p, uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t sm_now_ns(void) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* ---- reductions (butterfly: every lane ends with the same, bitwise identical value) ---- */
__device__ __forceinline__ float sm_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}
/* One level of sm_warp_sum_many: offset O, C values still a lane (template recursion keeps
 * every index a compile-time constant: the values stay in registers). */
template <int V, int O, int C>
__device__ __forceinline__ void sm_warp_sum_level(float (&v)[V], int lane) {
    if constexpr (C > 1) {
        const bool up = lane & O;
#pragma unroll
        for (int i = 0; i < C / 2; i++) {
            const float send = up ? v[i] : v[i + C / 2], keep = up ? v[i + C / 2] : v[i];
            v[i] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, O);
        }
    } else {
        v[0] += __shfl_xor_sync(0xFFFFFFFFu, v[0], O);
    }
    if constexpr (O > 1) sm_warp_sum_level<V, O / 2, (C > 1 ? C / 2 : 1)>(v, lane);
}
/* The warp sums of V values a lane (V a power of two) by recursive halving: at each offset o
 * (16, 8, .., as sm_warp_sum) a lane keeps half its values and adds the partner's copy of that
 * half, own + partner's: every sum is sm_warp_sum's bit for bit, in 31 shuffles when V >= 32
 * instead of 5 V.  On return v[j] (j < max(V / 32, 1)) is the sum of value
 * sm_warp_sum_many_idx<V>(lane, j); with V < 32 lanes 32 / V apart hold the same sum. */
template <int V>
__device__ __forceinline__ void sm_warp_sum_many(float (&v)[V]) {
    static_assert(V >= 1 && (V & (V - 1)) == 0, "sm_warp_sum_many: V must be a power of two");
    sm_warp_sum_level<V, 16, V>(v, (int)(threadIdx.x & 31));
}
template <int V>
__device__ __forceinline__ int sm_warp_sum_many_idx(int lane, int j) {
    if constexpr (V >= 32) return lane * (V / 32) + j;
    else return lane / (32 / V);
}
__device__ __forceinline__ float sm_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}
/* A team: the threads of one block that run one body call together, warp-aligned.  The stock
 * kernels pass the whole block (sm_team_block: bar 0 = __syncthreads); a persistent kernel
 * runs several teams in one block (thread slices, each with its own named barrier), so a body
 * never names threadIdx / blockDim / __syncthreads itself where a team is its argument. */
typedef struct sm_team {
    int tid; /* thread index in the team, 0 .. nt-1 */
    int nt;  /* threads of the team, a multiple of 32 */
    int bar; /* named barrier of the team: 0 = the whole block's (then nt == blockDim.x) */
} sm_team;
__device__ __forceinline__ sm_team sm_team_block(void) {
    sm_team t;
    t.tid = (int)threadIdx.x; t.nt = (int)blockDim.x; t.bar = 0;
    return t;
}
/* Team slice k of nt threads of the calling block (threads k nt .. k nt + nt - 1), barrier 1 + k
 * (barrier 0 stays the block's; the wgmma consumers use 1 only while no team runs). */
__device__ __forceinline__ sm_team sm_team_slice(int k, int nt) {
    sm_team t;
    t.tid = (int)threadIdx.x - k * nt; t.nt = nt; t.bar = 1 + k;
    return t;
}
__device__ __forceinline__ void sm_team_sync(const sm_team &t) {
    if (t.bar == 0) __syncthreads();
    else asm volatile("bar.sync %0, %1;\n" ::"r"(t.bar), "r"(t.nt) : "memory");
}
/* Sum over the team (at most 1024 threads); red: __shared__ [32] of this team.  Every thread
 * gets the total, in a fixed order (warp butterflies, then warps in order); contains
 * barriers, so every thread of the team must call it. */
__device__ __forceinline__ float sm_team_sum(float v, float *red, const sm_team &t) {
    v = sm_warp_sum(v);
    const int w = t.tid >> 5, l = t.tid & 31, nw = t.nt >> 5;
    sm_team_sync(t); /* red may still be read by a previous call */
    if (l == 0) red[w] = v;
    sm_team_sync(t);
    float s = (l < nw) ? red[l] : 0.0f;
    return sm_warp_sum(s);
}
/* Sum over the block (sm_team_sum of the whole block). */
__device__ __forceinline__ float sm_block_sum(float v, float *red) { return sm_team_sum(v, red, sm_team_block()); }
/* 1 in every thread of the block that arrives last of `total` blocks at counter *c, 0 in the
 * others: the block's global stores are made visible before it counts itself, the last one
 * resets the counter (the next launch finds it zero) and then sees every block's stores.
 * Every thread of the block calls it (it holds block barriers). */
__device__ __forceinline__ int sm_block_last_arrival(unsigned *c, unsigned total) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(c, 1u) == total - 1;
        if (last) *c = 0u;
    }
    __syncthreads();
    const int l = last;
    if (l) __threadfence();
    return l;
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
/* Four 8x8 bf16 matrices from shared memory (lane l gives the address of row l % 8 of matrix
 * l / 8); r[i] = this lane's pair of matrix i: (row l / 4, cols 2 (l % 4), +1), or with .trans
 * (rows 2 (l % 4), +1 of col l / 4). */
__device__ __forceinline__ void sm_ldsm_x4(uint32_t (&r)[4], const void *smem) {
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(sa));
}
__device__ __forceinline__ void sm_ldsm_x4_trans(uint32_t (&r)[4], const void *smem) {
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(sa));
}
/* 16-byte global -> shared copy; src_bytes 0 zero-fills the destination. */
__device__ __forceinline__ void sm_cp_async16(void *smem, const void *gmem, int src_bytes) {
    uint32_t sa = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem), "r"(src_bytes)
                 : "memory");
}
/* 4-byte global -> shared copy (through L1: for data written by an earlier launch). */
__device__ __forceinline__ void sm_cp_async4(void *smem, const void *gmem) {
    uint32_t sa = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(sa), "l"(gmem) : "memory");
}
__device__ __forceinline__ void sm_cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void sm_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
/* Programmatic dependent launch (sm_90): a kernel launched with sm_launch_pdl may start while
 * the kernel before it on the stream still runs; it must call sm_pdl_wait() before it reads
 * anything that kernel wrote (the wait returns once that grid has completed, its writes
 * visible).  sm_pdl_trigger() lets the next such kernel launch now (its own wait still waits
 * for this grid's completion). */
__device__ __forceinline__ void sm_pdl_wait(void) { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void sm_pdl_trigger(void) { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
/* Launch kernel k<<<grid, block, smem, st>>>(args...) with programmatic stream serialization
 * (the kernel calls sm_pdl_wait first). */
template <typename... P, typename... A>
static inline cudaError_t sm_launch_pdl(void (*k)(P...), unsigned grid, unsigned block, size_t smem, cudaStream_t st, A &&...args) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, k, static_cast<A &&>(args)...);
}

/* A load of data no thread writes during the kernel, issued where it stands: volatile asm, so
 * the compiler does not sink it into the branch that uses it (a body puts its independent round
 * trips in flight together this way). */
__device__ __forceinline__ int sm_ld_now_s32(const int *p) {
    int v;
    asm volatile("ld.global.nc.s32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ int64_t sm_ld_now_s64(const int64_t *p) {
    int64_t v;
    asm volatile("ld.global.nc.s64 %0, [%1];" : "=l"(v) : "l"(p));
    return v;
}
/* Streaming 16-byte load of data read once (weights): evict-first in L2, no L1 allocation. */
__device__ __forceinline__ uint4 sm_ld_stream(const uint4 *p) { return __ldcs(p); }

/* ---- wgmma (sm_90a) window, shared by the dense matmuls (ops/matmul.cuh) and the expert
 * stage's FP8 k step (moe/mm.cuh) ---- */
__device__ __forceinline__ uint32_t sm_wg_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void sm_wg_fence(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void sm_wg_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int K> __device__ __forceinline__ void sm_wg_wait(void) { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(K) : "memory"); }
/* Keep the compiler from moving accumulator accesses across the asynchronous wgmma window. */
__device__ __forceinline__ void sm_wg_pin(float &r) { asm volatile("" : "+f"(r)::"memory"); }

/* ---- W4A4's activations for the FP8 tensor cores (the expert stage's B operand, moe/mm.cuh) ----
 * A route's 32-block of activations, already rounded to MXFP4 under scale byte sb (e = sb - 127),
 * is 32 e4m3 codes (value x 2^-(e + 6): an e2m1 value x 2^-6, exact) in the slot order of the
 * weights' e4m3 placement (moe/dequant.cuh), slot 16 cm + 4t + c holding k = 8c + 4cm + t, and
 * the f32 factor 2^(sb - 127).
 * Three writers place them: the staging from bf16 rows (moe/mm.cuh moe_x8_entry), the
 * pre-expert norm (ops/norm.cuh: h1's image, a row at a time) and stage 1's epilogue (act's
 * image, a job at a time); all take the slot and the codes from here.  sm_x8_img: h1's image,
 * written by h1's producer beside h1 for the expert stage to copy: per row, codes [kp] and the
 * factors 2^(e - 127) [kp / 32]. */
typedef struct sm_x8_img {
    uint8_t *codes;           /* [rows, kp]; NULL: no image */
    float *fac;               /* [rows, kp / 32] */
    int kp;                   /* codes a row: the contraction padded (>= the row, whole 32-blocks) */
} sm_x8_img;
/* Slot of k (0..31) in a block's 32 code bytes: core matrix (slot >> 4), byte (slot & 15). */
__host__ __device__ __forceinline__ int sm_x8_slot(int k) { return 16 * ((k >> 2) & 1) + 4 * (k & 3) + (k >> 3); }
/* 2^-(e + 6) for scale byte sb: the factor from an MXFP4 value to its e4m3 code. */
__device__ __forceinline__ float sm_x8_inv(uint8_t sb) { return sm_e8m0_inv(sb) * 0.015625f; }
/* The e4m3 codes of two values rounded under the byte whose sm_x8_inv is inv: a (low byte)
 * and b. */
__device__ __forceinline__ uint32_t sm_x8_code2(float a, float b, float inv) {
    return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(a * inv, b * inv), __NV_SATFINITE, __NV_E4M3);
}

/* Round the 8 values v (k0..k0 + 7 of a row; k0 % 8 == 0) to MXFP4 by codec.h's rule: the
 * amax of their 32-block over the 4 lanes holding it (consecutive lanes, which call this
 * together), its scale byte, each value by sm_mx_round_value (idempotent: values already
 * rounded keep their bits).  codes non-NULL: also write the row's image of them (codes
 * [kp], fac [kp / 32] of the row: the e4m3 codes at their slots, the factor by the block's
 * first lane); the byte of a rounded block's amax is the byte it was rounded under, as
 * moe_x8_entry finds it. */
__device__ __forceinline__ void sm_mx_round8(float (&v)[8], uint8_t *codes, float *fac, int k0) {
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(v[j]));
    const unsigned mask = 0xFu << ((threadIdx.x & 31) & ~3u);
    m = fmaxf(m, __shfl_xor_sync(mask, m, 1));
    m = fmaxf(m, __shfl_xor_sync(mask, m, 2));
    const uint8_t b = sm_mx_scale_byte(m);
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = sm_mx_round_value(v[j], b);
    if (!codes) return;
    const float inv = sm_x8_inv(b);
    uint8_t *cb = codes + (k0 & ~31);
    const int q = (k0 >> 3) & 3; /* the chunk's place in its block: k = 8q + j */
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
        const uint32_t c2 = sm_x8_code2(v[j], v[j + 1], inv);
        cb[sm_x8_slot(8 * q + j)] = (uint8_t)c2;
        cb[sm_x8_slot(8 * q + j + 1)] = (uint8_t)(c2 >> 8);
    }
    if (q == 0) fac[k0 >> 5] = sm_e8m0_to_f32(b);
}

#endif
