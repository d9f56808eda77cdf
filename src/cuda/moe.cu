/* moe.cu: the MoE expert stage on the GPU (moe.h): routing, gate_up + SiLU, down, post-norm
 * and the weighted route sum, for MXFP4 (W4A16), FP8 (e4m3 + row scale) and BF16 experts.
 *
 * Four launches per call, all with grids fixed by the workspace, no host synchronization:
 *   route:   one block groups the n*K routes by expert (counts, offsets, slots) and cuts each
 *            expert's routes into jobs of at most 8 (one mma n-tile).
 *   stage 1: a persistent grid walks the items (job, 128 outputs j); each warp owns 16 gate
 *            rows j and the 16 up rows I+j, so silu(gate)*up is formed in registers.
 *   stage 2: the same kernel over down rows (a warp owns 32 rows), y = r16(a @ down^T).
 *   combine: one block per row: post-expert norm of each route and the route-ordered sum.
 * Weights are the A operand of mma.m16n8k16 (16 weight rows), the job's routes the B operand
 * (8 columns, staged in shared memory once per job).  The weights are repacked at upload so
 * that a warp's two tiles form one contiguous stream of 2 KB k-step blocks (plus 128 bytes
 * of MXFP4 scales) in which every lane reads 16 contiguous bytes holding exactly its A
 * fragments for several k16 steps: four 512-byte warp loads per step, two steps in flight
 * in registers (an optional L2 prefetch further ahead, ws->prefetch, measured no gain).
 * MXFP4 dequant in registers: the nibble bits are stored so that one mask (or a rotate + mask)
 * puts sign at bit 15, exponent at bits 7-8 and mantissa at bit 6 of each bf16 half: the
 * e2m1 value times 2^-126 (a bf16 subnormal for codes +-0.5); one bf16x2 FMA by 2^(s-1) makes
 * the exact value.  k is permuted inside each 128-k step so the two halves of a register come
 * from two different 32-blocks: one bf16x2 scale register serves both halves, built from a
 * packed scale word by one shift + mask.  Scales above 2^1 overflow the bf16 multiplier; an
 * expert whose largest scale byte exceeds 128 stores every scale lowered by c and the f32
 * result is multiplied by 2^c.
 * Per 128-k step and warp the MXFP4 SASS is 16 HMMA, 64 HMUL2, ~89 LOP3 and ~68 SHF: at 8
 * rows the kernel is bound by these integer ops (ALU pipe ~60% busy) and load latency
 * (long-scoreboard stalls), not by bytes (bench/moe.md).
 * We rejected cuBLAS grouped GEMM on dequantized bf16 copies (4x the bytes of MXFP4) and a
 * fixed grid of (expert, tile) blocks that mostly exit (256 experts x tiles of launches for
 * ~55 touched ones at 8 rows); and split-K across blocks (atomics make sums nondeterministic).
 * Also measured and dropped: the dequant shifts as integer multiplies (FMA pipe), and one
 * tile per warp in stage 2 (finer items): both slower (bench/moe.md).
 */
#include "common.cuh"
#include "moe.h"
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdlib.h>
#include <string.h>

#define MOE_WARPS 8
#define MOE_THREADS (MOE_WARPS * 32)
#define MOE_CH 8              /* routes per job: one mma n-tile */
#define MOE_KALIGN 128        /* contraction padded to this (zero weights, zero inputs) */
#define MOE_MAX_E 2048
#define MOE_MAX_ROUTES 4096   /* n * K per call */
#define MOE_ROUTE_THREADS 1024
#define MOE_TILE_BYTES 1024   /* one 16-row tile, one k step: 2 subs x 32 lanes x 16 bytes */
#define MOE_PREFETCH_DEFAULT 0 /* k steps of L2 prefetch ahead of the register loads (measured: no gain) */

/* ---- geometry of the repacked layout (host and device) ---- */
static inline int moe_rup(int x, int a) { return (x + a - 1) / a * a; }
static inline size_t moe_rupz(size_t x, size_t a) { return (x + a - 1) / a * a; }
static inline int moe_kstep(int fmt) { return fmt == SM_EXP_MXFP4 ? 128 : fmt == SM_EXP_FP8 ? 64 : 32; }

/* A matrix is stored as pairs of 16-row tiles (a warp's work: gate tile j and up tile j of
 * gate_up; down tiles 2p and 2p+1), each pair as one contiguous stream of k steps, each step
 * one block of sb bytes: [tile 2][sub 2][lane 32][16 bytes] and, for MXFP4, the scales
 * [tile 2][g 8][8 bytes].  FP8 row scales live apart: [pair][tile 2][16 rows] floats. */
typedef struct moe_geom {
    int Ip, Hp;             /* I and Hm rounded up to 16 (tile rows) */
    int Kp1, Kp2;           /* contraction of gate_up (Hm) and down (I), rounded up to 128 */
    int ns1, ns2;           /* k steps per tile row of gate_up / down */
    int t1, t2;             /* 16-row tiles of gate_up (2 Ip / 16) and down (Hp / 16) */
    int p1, p2;             /* tile pairs of gate_up (Ip / 16) and down (t2 / 2 rounded up) */
    int sb;                 /* bytes of one pair-step block */
    size_t w1, s1, w2, s2;  /* bytes of gate_up weights / scales, down weights / scales */
    size_t o_s1, o_w2, o_s2;/* offsets inside one expert */
    size_t expert;          /* bytes of one expert (256-aligned) */
} moe_geom;

static moe_geom moe_geometry(int fmt, int Hm, int I) {
    moe_geom G;
    G.Ip = moe_rup(I, 16); G.Hp = moe_rup(Hm, 16);
    G.Kp1 = moe_rup(Hm, MOE_KALIGN); G.Kp2 = moe_rup(I, MOE_KALIGN);
    G.ns1 = G.Kp1 / moe_kstep(fmt); G.ns2 = G.Kp2 / moe_kstep(fmt);
    G.t1 = 2 * G.Ip / 16; G.t2 = G.Hp / 16;
    G.p1 = G.Ip / 16; G.p2 = (G.t2 + 1) / 2;
    G.sb = 2 * MOE_TILE_BYTES + (fmt == SM_EXP_MXFP4 ? 128 : 0);
    G.w1 = (size_t)G.p1 * G.ns1 * G.sb;
    G.w2 = (size_t)G.p2 * G.ns2 * G.sb;
    G.s1 = fmt == SM_EXP_FP8 ? (size_t)G.p1 * 32 * 4 : 0;
    G.s2 = fmt == SM_EXP_FP8 ? (size_t)G.p2 * 32 * 4 : 0;
    G.o_s1 = moe_rupz(G.w1, 256);
    G.o_w2 = G.o_s1 + moe_rupz(G.s1, 256);
    G.o_s2 = G.o_w2 + moe_rupz(G.w2, 256);
    G.expert = G.o_s2 + moe_rupz(G.s2, 256);
    return G;
}

/* Per expert, on the device: byte offsets into blob and the 2^c result factor per matrix. */
typedef struct moe_desc {
    unsigned long long w[2];  /* [gate_up, down] weights offset */
    unsigned long long s[2];  /* scales offset */
    float mul[2];             /* 2^c (MXFP4 scale offset), else 1 */
    int pad[2];
} moe_desc;

/* Workspace layout. */
typedef struct moe_wsl {
    size_t njobs, route_slot, slot_route, jobs, act, y, total;
    int maxjobs;
} moe_wsl;

static moe_wsl moe_ws_layout(int E, int K, int Hm, int I, int max_rows) {
    moe_wsl W;
    size_t R = (size_t)max_rows * K;
    W.maxjobs = (int)(R / MOE_CH + (R < (size_t)E ? R : (size_t)E) + 1);
    W.njobs = 0;
    W.route_slot = 256;
    W.slot_route = W.route_slot + moe_rupz(R * 4, 256);
    W.jobs = W.slot_route + moe_rupz(R * 4, 256);
    W.act = W.jobs + moe_rupz((size_t)W.maxjobs * 16, 256);
    W.y = W.act + moe_rupz(R * (size_t)I * 2, 256);
    W.total = W.y + moe_rupz(R * (size_t)Hm * 2, 256);
    return W;
}

/* ---- MXFP4 bit layout: where bit b (0 mantissa, 1-2 exponent, 3 sign) of the value in half
 * hf of A register i lives in the stored 32-bit word.  Register i is recovered as
 *   0: w & M   1: rotl(w,4) & M   2: rotl(w,10) & M   3: rotl(w,6) & M1 | rotl(w,14) & M2
 * with M = bits {6,7,8,15} of each half (M1 = bit 6, M2 = bits 7,8,15): 9 instructions for
 * four bf16x2 registers (no 4 rotations of M tile 32 bits; this is the cheapest cover). */
#define MOE_M 0x81C081C0u
#define MOE_M1 0x00400040u
#define MOE_M2 0x81808180u
__host__ __device__ __forceinline__ int moe_mx_src(int i, int hf, int b) {
    int p = (b < 3 ? 6 + b : 15) + 16 * hf;
    switch (i) {
    case 0: return p;
    case 1: return (p - 4) & 31;
    case 2: return (p - 10) & 31;
    default: return ((p & 15) == 6) ? ((p - 6) & 31) : ((p - 14) & 31);
    }
}
/* Pack the 8 codes c[i][hf] of one word. */
__host__ __device__ __forceinline__ uint32_t moe_mx_pack(const unsigned c[4][2]) {
    uint32_t w = 0;
    for (int i = 0; i < 4; i++)
        for (int hf = 0; hf < 2; hf++)
            for (int b = 0; b < 4; b++) w |= (uint32_t)((c[i][hf] >> b) & 1u) << moe_mx_src(i, hf, b);
    return w;
}

/* ---- device helpers ---- */
__device__ __forceinline__ uint4 moe_ldg16(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
__device__ __forceinline__ uint2 moe_ldg8(const void *p) {
    uint2 r;
    asm volatile("ld.global.nc.v2.u32 {%0,%1}, [%2];\n" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}
__device__ __forceinline__ uint32_t moe_u4(const uint4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
/* d = a * b (bf16x2), exact for our operands; -0 addend keeps the sign of zero products. */
__device__ __forceinline__ uint32_t moe_hmul2(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
    return d;
}
/* Scale word [b'(g,blk0), b'(g+8,blk0), b'(g,blk1), b'(g+8,blk1)] -> bf16x2 multipliers
 * 2^(b'-127) for row g (lo: blk0, hi: blk1) and row g+8. */
__device__ __forceinline__ void moe_mx_mults(uint32_t sw, uint32_t &mg, uint32_t &mg8) {
    mg = (sw << 7) & 0x7F807F80u;
    mg8 = (sw >> 1) & 0x7F807F80u;
}
/* One stored word -> the four A registers of one k16 step. */
__device__ __forceinline__ void moe_dq_mx(uint32_t w, uint32_t mg, uint32_t mg8, uint32_t a[4]) {
    const uint32_t r0 = w & MOE_M;
    const uint32_t r1 = __funnelshift_l(w, w, 4) & MOE_M;
    const uint32_t r2 = __funnelshift_l(w, w, 10) & MOE_M;
    const uint32_t r3 = (__funnelshift_l(w, w, 6) & MOE_M1) | (__funnelshift_l(w, w, 14) & MOE_M2);
    a[0] = moe_hmul2(r0, mg);
    a[1] = moe_hmul2(r1, mg8);
    a[2] = moe_hmul2(r2, mg);
    a[3] = moe_hmul2(r3, mg8);
}
/* L2 prefetch of the 128-byte line at p (one per lane: a warp covers a pair-step block in
 * one instruction; the bulk-copy prefetch needs a warp-uniform address loop instead). */
__device__ __forceinline__ void moe_prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}
/* Two e4m3 bytes (lo = first) -> bf16x2 of r16(e4m3 * s) (f32 product, as codec/weights.h). */
__device__ __forceinline__ uint32_t moe_dq_fp8(uint32_t two, float s) {
    __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xFFFFu), __NV_E4M3);
    __half2 h;
    memcpy(&h, &hr, 4);
    const float2 f = __half22float2(h);
    __nv_bfloat162 b = __floats2bfloat162_rn(f.x * s, f.y * s);
    uint32_t u;
    memcpy(&u, &b, 4);
    return u;
}

/* ---- routing: group routes by expert, cut into jobs of <= MOE_CH routes ---- */
__global__ void __launch_bounds__(MOE_ROUTE_THREADS) moe_route_kernel(const int *__restrict__ idx, int nr, int E,
                                                                     int *njobs, int *route_slot, int *slot_route,
                                                                     int4 *jobs) {
    __shared__ int cnt[MOE_MAX_E], off[MOE_MAX_E], joff[MOE_MAX_E];
    __shared__ int wsum[2][32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int x = tid; x < E; x += MOE_ROUTE_THREADS) cnt[x] = 0;
    __syncthreads();
    /* count routes per expert; pos = rank of the route among its expert's routes */
    int ex[MOE_MAX_ROUTES / MOE_ROUTE_THREADS], pos[MOE_MAX_ROUTES / MOE_ROUTE_THREADS];
#pragma unroll
    for (int q = 0; q < MOE_MAX_ROUTES / MOE_ROUTE_THREADS; q++) {
        const int r = tid + q * MOE_ROUTE_THREADS;
        ex[q] = -1; pos[q] = 0;
        if (r < nr) {
            const int v = idx[r];
            if (v >= 0 && v < E) { ex[q] = v; pos[q] = atomicAdd(&cnt[v], 1); }
        }
    }
    __syncthreads();
    /* exclusive scans of counts (slot offsets) and jobs per expert (job offsets) */
    const int per = (E + MOE_ROUTE_THREADS - 1) / MOE_ROUTE_THREADS, b0 = tid * per;
    int sc = 0, sj = 0;
    for (int i = 0; i < per; i++) {
        const int x = b0 + i;
        if (x < E) { sc += cnt[x]; sj += (cnt[x] + MOE_CH - 1) / MOE_CH; }
    }
    int ic = sc, ij = sj;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int a = __shfl_up_sync(0xFFFFFFFFu, ic, o), b = __shfl_up_sync(0xFFFFFFFFu, ij, o);
        if (lane >= o) { ic += a; ij += b; }
    }
    if (lane == 31) { wsum[0][warp] = ic; wsum[1][warp] = ij; }
    __syncthreads();
    if (warp == 0) {
        int a = wsum[0][lane], b = wsum[1][lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int u = __shfl_up_sync(0xFFFFFFFFu, a, o), v = __shfl_up_sync(0xFFFFFFFFu, b, o);
            if (lane >= o) { a += u; b += v; }
        }
        wsum[0][lane] = a; wsum[1][lane] = b;
    }
    __syncthreads();
    int c0 = (warp ? wsum[0][warp - 1] : 0) + ic - sc, j0 = (warp ? wsum[1][warp - 1] : 0) + ij - sj;
    for (int i = 0; i < per; i++) {
        const int x = b0 + i;
        if (x < E) { off[x] = c0; joff[x] = j0; c0 += cnt[x]; j0 += (cnt[x] + MOE_CH - 1) / MOE_CH; }
    }
    if (tid == 0) *njobs = wsum[1][31];
    __syncthreads();
    /* slots: expert-major; route -> slot and slot -> route */
#pragma unroll
    for (int q = 0; q < MOE_MAX_ROUTES / MOE_ROUTE_THREADS; q++) {
        const int r = tid + q * MOE_ROUTE_THREADS;
        if (r < nr) {
            if (ex[q] >= 0) {
                const int s = off[ex[q]] + pos[q];
                route_slot[r] = s;
                slot_route[s] = r;
            } else {
                route_slot[r] = -1;
            }
        }
    }
    for (int x = tid; x < E; x += MOE_ROUTE_THREADS) {
        const int c = cnt[x];
        for (int j = 0; j * MOE_CH < c; j++)
            jobs[joff[x] + j] = make_int4(x, off[x] + j * MOE_CH, min(MOE_CH, c - j * MOE_CH), 0);
    }
}

/* ---- the expert matmul (stage 1: gate_up + SiLU, stage 2: down) ---- */
typedef struct moe_args {
    const uint8_t *blob;      /* expert weights, moe layout */
    const moe_desc *desc;     /* [E] */
    const int *njobs;         /* device scalar from the route kernel */
    const int4 *jobs;         /* [njobs] (expert, first slot, routes, -) */
    const int *slot_route;    /* [slots] route id (row * K + k) */
    const uint16_t *in;       /* stage 1: h1 [n, Hm]; stage 2: act [slots, I] */
    uint16_t *out;            /* stage 1: act [slots, I]; stage 2: y [slots, Hm] */
    int K;                    /* routes per row */
    int kin;                  /* valid contraction length = row length of `in` */
    int Kp, nsteps;           /* padded contraction, k steps */
    int rows_out;             /* valid outputs per route (I or Hm) = row length of `out` */
    int tiles;                /* stage 1: gate tiles (Ip/16); stage 2: all tiles (Hp/16) */
    int pairs;                /* tile pairs of the matrix */
    int sb;                   /* bytes of one pair-step block */
    int ipj;                  /* items per job */
    int pf;                   /* L2 prefetch distance in k steps (0: none) */
} moe_args;

typedef struct moe_buf {
    uint4 w[2][2];            /* [tile][sub]: 16 bytes of this lane */
    uint2 s[2];               /* [tile]: MXFP4 scale bytes of this lane; FP8: row scales g, g+8 */
} moe_buf;

typedef struct moe_cur {
    int it, S;                /* item and k step to load next */
    const uint8_t *w;         /* the pair-step block of (it, S) */
    const float *fs;          /* FP8: the pair's row scales */
} moe_cur;

/* Point the load cursor at step 0 of item it (past the block's items or the matrix's pairs:
 * at valid memory whose values are never written out). */
template <int F, int STAGE>
__device__ __forceinline__ void moe_set_item(moe_cur &c, int it, int i1, const moe_args &a, int warp) {
    c.it = it; c.S = 0;
    c.w = a.blob;
    c.fs = (const float *)a.blob;
    if (it >= i1) return;
    const int job = it / a.ipj, itile = it - job * a.ipj;
    const moe_desc *d = a.desc + a.jobs[job].x;
    int p = itile * MOE_WARPS + warp;
    if (p >= a.pairs) p = 0;
    c.w = a.blob + d->w[STAGE - 1] + (size_t)p * a.nsteps * a.sb;
    c.fs = (const float *)(a.blob + d->s[STAGE - 1]) + p * 32;
}

template <int F>
__device__ __forceinline__ void moe_load(moe_buf &b, const moe_cur &c, int lane) {
    const uint8_t *w = c.w + lane * 16;
    b.w[0][0] = moe_ldg16(w);
    b.w[0][1] = moe_ldg16(w + 512);
    b.w[1][0] = moe_ldg16(w + 1024);
    b.w[1][1] = moe_ldg16(w + 1536);
    if (F == SM_EXP_MXFP4) {
        const uint8_t *sp = c.w + 2048 + (lane >> 2) * 8;
        b.s[0] = moe_ldg8(sp);
        b.s[1] = moe_ldg8(sp + 64);
    } else if (F == SM_EXP_FP8) {
        const int g = lane >> 2;
        b.s[0] = make_uint2(__float_as_uint(__ldg(c.fs + g)), __float_as_uint(__ldg(c.fs + g + 8)));
        b.s[1] = make_uint2(__float_as_uint(__ldg(c.fs + 16 + g)), __float_as_uint(__ldg(c.fs + 24 + g)));
    }
}

template <int F, int STAGE>
__device__ __forceinline__ void moe_advance(moe_cur &c, int i1, const moe_args &a, int warp) {
    c.w += a.sb;
    if (++c.S == a.nsteps) moe_set_item<F, STAGE>(c, c.it + 1, i1, a, warp);
}

/* acc[X] += tile X rows (16) x the job's 8 routes over k step S. */
template <int F>
__device__ __forceinline__ void moe_compute(const moe_buf &b, int S, const uint2 *__restrict__ Bs, int lane,
                                            float (&acc)[2][4]) {
    const int g = lane >> 2, t = lane & 3;
    if (F == SM_EXP_MXFP4) {
        const uint2 *bs = Bs + (size_t)S * 8 * 32 + g * 4 + t;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t mg[2], mg8[2];
#pragma unroll
            for (int X = 0; X < 2; X++) moe_mx_mults(h ? b.s[X].y : b.s[X].x, mg[X], mg8[X]);
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const uint2 bf = bs[(h * 4 + q) * 32];
#pragma unroll
                for (int X = 0; X < 2; X++) {
                    uint32_t r[4];
                    moe_dq_mx(moe_u4(b.w[X][h], q), mg[X], mg8[X], r);
                    sm_mma16816(acc[X], r[0], r[1], r[2], r[3], bf.x, bf.y);
                }
            }
        }
    } else if (F == SM_EXP_FP8) {
        const uint2 *bs = Bs + (size_t)S * 4 * 32 + g * 4 + t;
#pragma unroll
        for (int q = 0; q < 2; q++) {
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const uint2 bf = bs[(q * 2 + j) * 32];
#pragma unroll
                for (int X = 0; X < 2; X++) {
                    const float sg = __uint_as_float(b.s[X].x), sg8 = __uint_as_float(b.s[X].y);
                    const uint32_t w0 = moe_u4(b.w[X][q], 2 * j), w1 = moe_u4(b.w[X][q], 2 * j + 1);
                    sm_mma16816(acc[X], moe_dq_fp8(w0, sg), moe_dq_fp8(w0 >> 16, sg8), moe_dq_fp8(w1, sg),
                                moe_dq_fp8(w1 >> 16, sg8), bf.x, bf.y);
                }
            }
        }
    } else {
        const uint2 *bs = Bs + (size_t)S * 2 * 32 + g * 4 + t;
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const uint2 bf = bs[q * 32];
#pragma unroll
            for (int X = 0; X < 2; X++)
                sm_mma16816(acc[X], b.w[X][q].x, b.w[X][q].y, b.w[X][q].z, b.w[X][q].w, bf.x, bf.y);
        }
    }
}

/* Stage the job's routes (B operand) into shared memory in fragment order:
 * Bs[ks][r][t] = the 4 bf16 of k16 step ks, route r that lane (g = r, t) feeds to the mma. */
template <int F, int STAGE>
__device__ __forceinline__ void moe_stage_b(const moe_args &a, int job, uint2 *Bs) {
    const int4 jb = a.jobs[job];
    const int s0 = jb.y, cnt = jb.z, nks = a.Kp / 16;
    for (int u = threadIdx.x; u < nks * MOE_CH; u += MOE_THREADS) {
        const int ks = u / MOE_CH, r = u % MOE_CH;
        uint4 A = make_uint4(0, 0, 0, 0), B = A;
        if (r < cnt) {
            const int slot = s0 + r;
            const uint16_t *row = STAGE == 1 ? a.in + (size_t)(a.slot_route[slot] / a.K) * a.kin
                                             : a.in + (size_t)slot * a.kin;
            int ka, kb;
            if (F == SM_EXP_MXFP4) { /* k permuted: lo halves from block 2h, hi halves from 2h+1 */
                const int S = ks >> 3, s = ks & 7;
                ka = S * 128 + (2 * (s >> 2)) * 32 + (s & 3) * 8;
                kb = ka + 32;
            } else {
                ka = ks * 16; kb = ka + 8;
            }
            if (ka < a.kin) A = __ldg((const uint4 *)(row + ka));
            if (kb < a.kin) B = __ldg((const uint4 *)(row + kb));
        }
        uint2 o[4];
        if (F == SM_EXP_MXFP4) {
            /* lane t: slots 2t, 2t+1, 2t+8, 2t+9 = A[t], B[t], A[t+4], B[t+4] */
            const uint32_t aw[4] = {A.x, A.y, A.z, A.w}, bw[4] = {B.x, B.y, B.z, B.w};
#pragma unroll
            for (int t = 0; t < 4; t++) {
                const uint32_t a0 = (aw[t >> 1] >> (16 * (t & 1))) & 0xFFFFu, b0 = (bw[t >> 1] >> (16 * (t & 1))) & 0xFFFFu;
                const uint32_t a4 = (aw[2 + (t >> 1)] >> (16 * (t & 1))) & 0xFFFFu,
                               b4 = (bw[2 + (t >> 1)] >> (16 * (t & 1))) & 0xFFFFu;
                o[t] = make_uint2(a0 | (b0 << 16), a4 | (b4 << 16));
            }
        } else {
            /* lane t: slots 2t, 2t+1 from the first 8 values, 2t+8, 2t+9 from the second */
            o[0] = make_uint2(A.x, B.x); o[1] = make_uint2(A.y, B.y);
            o[2] = make_uint2(A.z, B.z); o[3] = make_uint2(A.w, B.w);
        }
        uint4 *dst = (uint4 *)(Bs + (size_t)(ks * MOE_CH + r) * 4);
        dst[0] = make_uint4(o[0].x, o[0].y, o[1].x, o[1].y);
        dst[1] = make_uint4(o[2].x, o[2].y, o[3].x, o[3].y);
    }
}

template <int STAGE>
__device__ __forceinline__ void moe_epilogue(const moe_args &a, int it, int warp, int lane, const float (&acc)[2][4]) {
    const int g = lane >> 2, t = lane & 3;
    const int job = it / a.ipj, itile = it - job * a.ipj;
    const int4 jb = a.jobs[job];
    const int s0 = jb.y, cnt = jb.z;
    const float mul = a.desc[jb.x].mul[STAGE - 1];
    const int p = itile * MOE_WARPS + warp;
    if (STAGE == 1) {
        if (p >= a.tiles) return;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int col = 2 * t + (i & 1), j = p * 16 + g + (i >> 1) * 8;
            if (col < cnt && j < a.rows_out) {
                /* gate, up = r16(sums); a = r16(silu(gate) * up) */
                const float gg = sm_r16d(acc[0][i] * mul), uu = sm_r16d(acc[1][i] * mul);
                const float v = gg * (1.0f / (1.0f + expf(-gg))) * uu;
                a.out[(size_t)(s0 + col) * a.rows_out + j] = sm_tobf(v);
            }
        }
    } else {
#pragma unroll
        for (int X = 0; X < 2; X++) {
            const int tile = 2 * p + X;
            if (tile >= a.tiles) continue;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int col = 2 * t + (i & 1), row = tile * 16 + g + (i >> 1) * 8;
                /* y = r16(sum) */
                if (col < cnt && row < a.rows_out) a.out[(size_t)(s0 + col) * a.rows_out + row] = sm_tobf(acc[X][i] * mul);
            }
        }
    }
}

/* The loop state of one block, and one k step of it: issue the loads two steps ahead (and
 * an L2 prefetch pf steps further), compute this step, and at an item's end write its
 * outputs (and restage B on a new job). */
typedef struct moe_loop {
    moe_cur lc;               /* load cursor */
    int it, S, N, i1, job;    /* compute cursor, steps of the block, item end, staged job */
    float acc[2][4];
} moe_loop;

template <int F, int STAGE>
__device__ __forceinline__ void moe_step(moe_loop &L, int p, const moe_buf &cur, moe_buf &n2, const moe_args &a,
                                         uint2 *Bs, int warp, int lane) {
    if (p + 2 < L.N) {
        moe_load<F>(n2, L.lc, lane);
        if (lane * 128 < a.sb && a.pf && L.lc.S + a.pf < a.nsteps && L.lc.it < L.i1)
            moe_prefetch_l2(L.lc.w + (size_t)a.pf * a.sb + lane * 128);
        moe_advance<F, STAGE>(L.lc, L.i1, a, warp);
    }
    moe_compute<F>(cur, L.S, Bs, lane, L.acc);
    if (++L.S == a.nsteps) {
        moe_epilogue<STAGE>(a, L.it, warp, lane, L.acc);
#pragma unroll
        for (int X = 0; X < 2; X++) L.acc[X][0] = L.acc[X][1] = L.acc[X][2] = L.acc[X][3] = 0.0f;
        L.S = 0;
        if (++L.it < L.i1) {
            const int nj = L.it / a.ipj;
            if (nj != L.job) {
                __syncthreads(); /* every warp done with the old routes */
                moe_stage_b<F, STAGE>(a, nj, Bs);
                __syncthreads();
                L.job = nj;
            }
        }
    }
}

template <int F, int STAGE>
__global__ void __launch_bounds__(MOE_THREADS, 2) moe_mm_kernel(const moe_args a) {
    extern __shared__ uint4 moe_smem[];
    uint2 *Bs = (uint2 *)moe_smem; /* [Kp/16][8 routes][4 lanes t] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int total = *a.njobs * a.ipj;
    const int i0 = (int)((long long)blockIdx.x * total / gridDim.x);
    const int i1 = (int)((long long)(blockIdx.x + 1) * total / gridDim.x);
    if (i0 >= i1) return;
    moe_loop L;
    L.N = (i1 - i0) * a.nsteps; L.it = i0; L.S = 0; L.i1 = i1; L.job = i0 / a.ipj;
#pragma unroll
    for (int X = 0; X < 2; X++) L.acc[X][0] = L.acc[X][1] = L.acc[X][2] = L.acc[X][3] = 0.0f;
    moe_set_item<F, STAGE>(L.lc, i0, i1, a, warp);
    if (lane * 128 < a.sb && a.pf) /* the first steps of the first item into L2 */
        for (int j = 2; j < a.pf + 2 && j < a.nsteps; j++) moe_prefetch_l2(L.lc.w + (size_t)j * a.sb + lane * 128);
    moe_buf X, Y, Z;
    moe_load<F>(X, L.lc, lane);
    moe_advance<F, STAGE>(L.lc, L.i1, a, warp);
    if (L.N > 1) {
        moe_load<F>(Y, L.lc, lane);
        moe_advance<F, STAGE>(L.lc, L.i1, a, warp);
    }
    moe_stage_b<F, STAGE>(a, L.job, Bs);
    __syncthreads();
    /* three register buffers in rotation: step p computes one while p+1, p+2 are in flight */
    for (int p = 0; p < L.N; p += 3) {
        moe_step<F, STAGE>(L, p, X, Z, a, Bs, warp, lane);
        if (p + 1 < L.N) moe_step<F, STAGE>(L, p + 1, Y, X, a, Bs, warp, lane);
        if (p + 2 < L.N) moe_step<F, STAGE>(L, p + 2, Z, Y, a, Bs, warp, lane);
    }
}

/* ---- combine: post-expert norm per route, route-ordered weighted sum per row ---- */
__global__ void __launch_bounds__(256) moe_combine_kernel(const uint16_t *__restrict__ y, const int *__restrict__ route_slot,
                                                          const float *__restrict__ w, const float *__restrict__ pn, int K,
                                                          int Hm, float eps, uint16_t *__restrict__ m_out) {
    extern __shared__ float msum[]; /* [Hm], each element owned by one thread */
    __shared__ float red[32];
    const int i = blockIdx.x;
    for (int x = threadIdx.x; x < Hm; x += blockDim.x) msum[x] = 0.0f;
    for (int k = 0; k < K; k++) {
        const int slot = route_slot[i * K + k];
        if (slot < 0) continue; /* invalid expert id: the route contributes nothing */
        const float wk = w[i * K + k];
        const uint16_t *yr = y + (size_t)slot * Hm;
        /* t = r16(y * eff(post_expert_norm)); sum of squares */
        float ss = 0.0f;
        for (int x = threadIdx.x; x < Hm; x += blockDim.x) {
            const float tv = sm_r16d(sm_bf(yr[x]) * pn[x]);
            ss += tv * tv;
        }
        ss = sm_block_sum(ss, red);
        /* yn = t * rsqrt(mean(t^2) + eps); m += w_k * yn */
        const float r = 1.0f / sqrtf(ss / (float)Hm + eps);
        for (int x = threadIdx.x; x < Hm; x += blockDim.x) {
            const float tv = sm_r16d(sm_bf(yr[x]) * pn[x]);
            msum[x] += wk * (tv * r);
        }
    }
    /* m = r16(sum) */
    for (int x = threadIdx.x; x < Hm; x += blockDim.x) m_out[(size_t)i * Hm + x] = sm_tobf(msum[x]);
}

/* ---- upload: repack kernels (raw checkpoint layout in a staging buffer -> blob) ---- */
/* Row rr of a repacked matrix -> row of the raw matrix, or -1 for padding.  gate_up: rows
 * [0, Ip) are gate rows (< I valid), [Ip, 2Ip) up rows; down: rows < R valid. */
__device__ __forceinline__ int moe_raw_row(int rr, int gu, int R, int Ip) {
    if (!gu) return rr < R ? rr : -1;
    const int I = R / 2;
    if (rr < Ip) return rr < I ? rr : -1;
    rr -= Ip;
    return rr < I ? I + rr : -1;
}

/* Tile X (0, 1) of pair P: gate_up pairs gate tile P with up tile Ip/16 + P; down pairs
 * tiles 2P and 2P+1. */
__device__ __forceinline__ int moe_pair_tile(int P, int X, int gu, int Ip) { return gu ? (X ? Ip / 16 + P : P) : 2 * P + X; }

template <int F>
__global__ void moe_repack_w_kernel(const uint8_t *__restrict__ raw, int R, int K, int gu, int Ip, int npairs, int nsteps,
                                    int sb, uint8_t *__restrict__ dst) {
    const long long u = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= (long long)npairs * nsteps * 128) return;
    const int lane = (int)(u & 31), q = (int)((u >> 5) & 1), X = (int)((u >> 6) & 1);
    const long long ps = u >> 7;
    const int S = (int)(ps % nsteps), P = (int)(ps / nsteps), T = moe_pair_tile(P, X, gu, Ip);
    const int g = lane >> 2, t = lane & 3;
    int rows[2];
    rows[0] = moe_raw_row(T * 16 + g, gu, R, Ip);
    rows[1] = moe_raw_row(T * 16 + g + 8, gu, R, Ip);
    uint32_t wd[4];
    if (F == SM_EXP_MXFP4) {
#pragma unroll
        for (int s4 = 0; s4 < 4; s4++) {
            const int s = q * 4 + s4; /* k16 step inside the 128-k step */
            unsigned c[4][2];
            for (int i = 0; i < 4; i++)
                for (int hf = 0; hf < 2; hf++) {
                    const int row = rows[i & 1];
                    const int k = S * 128 + (2 * (s >> 2) + hf) * 32 + (s & 3) * 8 + t + 4 * (i >> 1);
                    c[i][hf] = (row >= 0 && k < K) ? sm_mx_code(raw + (size_t)row * (K / 2), k) : 0u;
                }
            wd[s4] = moe_mx_pack(c);
        }
    } else if (F == SM_EXP_FP8) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int s = q * 2 + j;
            for (int wi = 0; wi < 2; wi++) { /* word 2j: a0 a1; word 2j+1: a2 a3 */
                uint32_t v = 0;
                for (int ii = 0; ii < 2; ii++) {
                    const int i = wi * 2 + ii, row = rows[i & 1];
                    for (int hf = 0; hf < 2; hf++) {
                        const int k = S * 64 + s * 16 + 2 * t + hf + 8 * (i >> 1);
                        const uint32_t b = (row >= 0 && k < K) ? raw[(size_t)row * K + k] : 0u;
                        v |= b << (8 * (ii * 2 + hf));
                    }
                }
                wd[2 * j + wi] = v;
            }
        }
    } else {
        const uint16_t *r16 = (const uint16_t *)raw;
        for (int i = 0; i < 4; i++) {
            const int row = rows[i & 1];
            const int k = S * 32 + q * 16 + 2 * t + 8 * (i >> 1);
            const uint32_t lo = (row >= 0 && k < K) ? r16[(size_t)row * K + k] : 0u;
            const uint32_t hi = (row >= 0 && k + 1 < K) ? r16[(size_t)row * K + k + 1] : 0u;
            wd[i] = lo | (hi << 16);
        }
    }
    *(uint4 *)(dst + (size_t)(P * nsteps + S) * sb + X * 1024 + q * 512 + lane * 16) = make_uint4(wd[0], wd[1], wd[2], wd[3]);
}

/* MXFP4 scales: (pair, step, tile, g) -> 8 bytes after the step's weights, word h =
 * [b'(g,2h), b'(g+8,2h), b'(g,2h+1), b'(g+8,2h+1)], b' = b + 126 - c clamped to [1, 254]
 * (multiplier 2^(b-1-c)). */
__global__ void moe_repack_mxs_kernel(const uint8_t *__restrict__ raws, int R, int K, int gu, int Ip, int npairs,
                                      int nsteps, int sb, int c, uint8_t *__restrict__ dst) {
    const long long u = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= (long long)npairs * nsteps * 16) return;
    const int g = (int)(u & 7), X = (int)((u >> 3) & 1);
    const long long ps = u >> 4;
    const int S = (int)(ps % nsteps), P = (int)(ps / nsteps), T = moe_pair_tile(P, X, gu, Ip);
    const int nb = K / 32;
    uint32_t wv[2];
    for (int h = 0; h < 2; h++) {
        uint32_t v = 0;
        for (int j = 0; j < 4; j++) {
            const int row = moe_raw_row(T * 16 + g + 8 * (j & 1), gu, R, Ip);
            const int blk = S * 4 + 2 * h + (j >> 1);
            int bp = 127;
            if (row >= 0 && blk < nb) {
                bp = (int)raws[(size_t)row * nb + blk] + 126 - c;
                bp = bp < 1 ? 1 : bp > 254 ? 254 : bp;
            }
            v |= (uint32_t)bp << (8 * j);
        }
        wv[h] = v;
    }
    *(uint2 *)(dst + (size_t)(P * nsteps + S) * sb + 2048 + X * 64 + g * 8) = make_uint2(wv[0], wv[1]);
}

/* FP8 row scales -> float [pair][tile 2][16 rows], 0 on padding rows. */
__global__ void moe_repack_f8s_kernel(const float *__restrict__ raws, int R, int gu, int Ip, int npairs, float *__restrict__ dst) {
    const int u = blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= npairs * 32) return;
    const int r = u & 15, X = (u >> 4) & 1, P = u >> 5;
    const int row = moe_raw_row(moe_pair_tile(P, X, gu, Ip) * 16 + r, gu, R, Ip);
    dst[u] = row >= 0 ? raws[row] : 0.0f;
}

/* Largest scale byte and whether a NaN byte (0xFF) is present: flags[0] max, flags[1] NaN. */
__global__ void moe_scan_scales_kernel(const uint8_t *__restrict__ s, long long n, int *flags) {
    int mx = 0, nan = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int b = s[i];
        if (b == 0xFF) nan = 1; else mx = max(mx, b);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        mx = max(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
        nan |= __shfl_xor_sync(0xFFFFFFFFu, nan, o);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicMax(&flags[0], mx);
        if (nan) atomicOr(&flags[1], 1);
    }
}

/* ---- synthetic experts (raw checkpoint layout, then the upload path) ---- */
__host__ __device__ __forceinline__ uint64_t moe_mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* N(0, 1) from (key, counter) by Box-Muller on two 24-bit uniforms. */
__device__ __forceinline__ float moe_normal(uint64_t key, uint64_t i) {
    const uint64_t h = moe_mix(key ^ moe_mix(i));
    const float u1 = ((float)(h >> 40) + 0.5f) * 5.9604645e-8f, u2 = ((float)(h & 0xFFFFFFu) + 0.5f) * 5.9604645e-8f;
    return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

__global__ void moe_synth_mx_kernel(uint64_t key, int R, int K, float sd, uint8_t *w, uint8_t *s) {
    const long long u = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int nb = K / 32;
    if (u >= (long long)R * nb) return;
    const int row = (int)(u / nb), blk = (int)(u % nb);
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = sd * moe_normal(key, (uint64_t)row * K + blk * 32 + j);
    uint8_t q[16];
    s[(size_t)row * nb + blk] = sm_mx_quantize_block(x, q);
    for (int j = 0; j < 16; j++) w[(size_t)row * (K / 2) + blk * 16 + j] = q[j];
}

__global__ void moe_synth_f8_kernel(uint64_t key, int R, int K, float sd, uint8_t *w, float *s) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= R) return;
    float amax = 0.0f;
    for (int k = 0; k < K; k++) amax = fmaxf(amax, fabsf(sd * moe_normal(key, (uint64_t)row * K + k)));
    const float sc = amax > 0.0f ? amax / 448.0f : 1.0f;
    for (int k = 0; k < K; k++) w[(size_t)row * K + k] = sm_f32_to_e4m3(sd * moe_normal(key, (uint64_t)row * K + k) / sc);
    s[row] = sc;
}

__global__ void moe_synth_bf_kernel(uint64_t key, int R, int K, float sd, uint16_t *w) {
    const long long u = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= (long long)R * K) return;
    w[u] = sm_f32_to_bf16(sd * moe_normal(key, (uint64_t)u));
}

/* ---- host side ---- */
static int moe_check_dims(const sm_config *c, int fmt, sm_err *e) {
    if (fmt != SM_EXP_BF16 && fmt != SM_EXP_FP8 && fmt != SM_EXP_MXFP4) return sm_errf(e, "cuda moe: unknown expert format %d", fmt);
    if (c->Hm <= 0 || c->I <= 0 || c->Hm % 32 || c->I % 32)
        return sm_errf(e, "cuda moe: moe_hidden_size %d and moe_intermediate_size %d must be positive multiples of 32", c->Hm, c->I);
    if (c->E < 1 || c->E > MOE_MAX_E) return sm_errf(e, "cuda moe: num_local_experts %d outside [1, %d]", c->E, MOE_MAX_E);
    if (c->K < 1 || c->K > c->E) return sm_errf(e, "cuda moe: num_experts_per_tok %d outside [1, E = %d]", c->K, c->E);
    if ((size_t)moe_rup(c->Hm > c->I ? c->Hm : c->I, MOE_KALIGN) * 16 > 200 * 1024)
        return sm_errf(e, "cuda moe: widths Hm %d / I %d too large for the staged routes in shared memory", c->Hm, c->I);
    return 0;
}

static int moe_layer_alloc(const sm_config *c, int fmt, sm_cuda_moe_layer *L, sm_err *e) {
    memset(L, 0, sizeof *L);
    if (moe_check_dims(c, fmt, e)) return -1;
    const moe_geom G = moe_geometry(fmt, c->Hm, c->I);
    L->fmt = fmt; L->E = c->E; L->K = c->K; L->Hm = c->Hm; L->I = c->I; L->post_eps = c->post_eps;
    L->expert_bytes = G.expert;
    L->touched_bytes = G.w1 + G.s1 + G.w2 + G.s2;
    L->blob_bytes = G.expert * (size_t)c->E;
    cudaError_t rc = cudaMalloc(&L->blob, L->blob_bytes);
    if (rc == cudaSuccess) rc = cudaMalloc(&L->desc, sizeof(moe_desc) * (size_t)c->E);
    if (rc == cudaSuccess) rc = cudaMalloc((void **)&L->post_norm, sizeof(float) * (size_t)c->Hm);
    if (rc != cudaSuccess) {
        size_t need = L->blob_bytes;
        sm_cuda_moe_free(L);
        return sm_errf(e, "cuda moe: device allocation of %zu bytes for a layer's experts failed: %s", need, cudaGetErrorString(rc));
    }
    return 0;
}

/* Repack one matrix (mat 0: gate_up [2I, Hm], 1: down [Hm, I]) from the staging buffer
 * (weights at sw, scales at ss) into the blob of expert x; returns the scale offset c
 * through *cexp, or -1 with e filled ("nan" set when a 0xFF scale byte was found). */
static int moe_repack(sm_cuda_moe_layer *L, int x, int mat, const uint8_t *sw, const uint8_t *ss, int *flags_d,
                      moe_desc *hd, int *nan, sm_err *e) {
    const int fmt = L->fmt;
    const moe_geom G = moe_geometry(fmt, L->Hm, L->I);
    const int R = mat ? L->Hm : 2 * L->I, K = mat ? L->I : L->Hm, gu = !mat;
    const int npairs = mat ? G.p2 : G.p1, nsteps = mat ? G.ns2 : G.ns1;
    uint8_t *base = (uint8_t *)L->blob + G.expert * (size_t)x;
    const size_t ow = mat ? G.o_w2 : 0, os = mat ? G.o_s2 : G.o_s1;
    hd->w[mat] = G.expert * (size_t)x + ow;
    hd->s[mat] = G.expert * (size_t)x + os;
    hd->mul[mat] = 1.0f;
    *nan = 0;
    int c = 0;
    if (fmt == SM_EXP_MXFP4) {
        int hf[2] = {0, 0};
        SM_CUDA_CHECK(cudaMemset(flags_d, 0, 2 * sizeof(int)));
        const long long n = (long long)R * (K / 32);
        moe_scan_scales_kernel<<<256, 256>>>(ss, n, flags_d);
        SM_LAUNCH_CHECK("moe_scan_scales_kernel");
        SM_CUDA_CHECK(cudaMemcpy(hf, flags_d, sizeof hf, cudaMemcpyDeviceToHost));
        if (hf[1]) { *nan = 1; return -1; }
        c = hf[0] > 128 ? hf[0] - 128 : 0;
        hd->mul[mat] = ldexpf(1.0f, c);
        const long long ns = (long long)npairs * nsteps * 16;
        moe_repack_mxs_kernel<<<(unsigned)((ns + 255) / 256), 256>>>(ss, R, K, gu, G.Ip, npairs, nsteps, G.sb, c, base + ow);
        SM_LAUNCH_CHECK("moe_repack_mxs_kernel");
    } else if (fmt == SM_EXP_FP8) {
        moe_repack_f8s_kernel<<<(npairs * 32 + 255) / 256, 256>>>((const float *)ss, R, gu, G.Ip, npairs, (float *)(base + os));
        SM_LAUNCH_CHECK("moe_repack_f8s_kernel");
    }
    const long long nt = (long long)npairs * nsteps * 128;
    const unsigned blocks = (unsigned)((nt + 255) / 256);
    if (fmt == SM_EXP_MXFP4) moe_repack_w_kernel<SM_EXP_MXFP4><<<blocks, 256>>>(sw, R, K, gu, G.Ip, npairs, nsteps, G.sb, base + ow);
    else if (fmt == SM_EXP_FP8) moe_repack_w_kernel<SM_EXP_FP8><<<blocks, 256>>>(sw, R, K, gu, G.Ip, npairs, nsteps, G.sb, base + ow);
    else moe_repack_w_kernel<SM_EXP_BF16><<<blocks, 256>>>(sw, R, K, gu, G.Ip, npairs, nsteps, G.sb, base + ow);
    SM_LAUNCH_CHECK("moe_repack_w_kernel");
    return 0;
}

/* Raw (checkpoint layout) bytes of one matrix: weights and scales. */
static void moe_raw_bytes(int fmt, int R, int K, size_t *wb, size_t *sb) {
    if (fmt == SM_EXP_MXFP4) { *wb = (size_t)R * K / 2; *sb = (size_t)R * (K / 32); }
    else if (fmt == SM_EXP_FP8) { *wb = (size_t)R * K; *sb = (size_t)R * 4; }
    else { *wb = (size_t)R * K * 2; *sb = 0; }
}

static const char *moe_mat_name(int mat) { return mat ? "down_proj" : "gate_up_proj"; }

typedef struct moe_stage_buf {
    uint8_t *buf;             /* device staging: weights at 0, scales at sofs */
    size_t sofs, bytes;
    int *flags;               /* device [2] */
} moe_stage_buf;

static int moe_stage_alloc(const sm_cuda_moe_layer *L, moe_stage_buf *sb, sm_err *e) {
    size_t w0, s0, w1, s1;
    moe_raw_bytes(L->fmt, 2 * L->I, L->Hm, &w0, &s0);
    moe_raw_bytes(L->fmt, L->Hm, L->I, &w1, &s1);
    const size_t wmax = w0 > w1 ? w0 : w1, smax = s0 > s1 ? s0 : s1;
    sb->sofs = moe_rupz(wmax, 256);
    sb->bytes = sb->sofs + moe_rupz(smax, 256) + 256;
    sb->buf = NULL; sb->flags = NULL;
    cudaError_t rc = cudaMalloc((void **)&sb->buf, sb->bytes);
    if (rc == cudaSuccess) rc = cudaMalloc((void **)&sb->flags, 2 * sizeof(int));
    if (rc != cudaSuccess) {
        cudaFree(sb->buf); cudaFree(sb->flags);
        return sm_errf(e, "cuda moe: device allocation of the %zu-byte upload staging buffer failed: %s", sb->bytes,
                       cudaGetErrorString(rc));
    }
    return 0;
}
static void moe_stage_free(moe_stage_buf *sb) {
    cudaFree(sb->buf);
    cudaFree(sb->flags);
    sb->buf = NULL; sb->flags = NULL;
}

static int moe_upload_impl(const sm_model *m, int l, sm_cuda_moe_layer *L, moe_stage_buf *sb, moe_desc *hd, sm_err *e) {
    const sm_config *c = &m->cfg;
    const sm_experts *X = &m->layers[l].ex;
    for (int x = 0; x < c->E; x++) {
        for (int mat = 0; mat < 2; mat++) {
            const int R = mat ? c->Hm : 2 * c->I, K = mat ? c->I : c->Hm;
            const void *w = mat ? X->dn[x] : X->gu[x];
            const void *s = mat ? X->dns[x] : X->gus[x];
            size_t wb, sbb;
            moe_raw_bytes(L->fmt, R, K, &wb, &sbb);
            if (!w || (sbb && !s))
                return sm_errf(e, "cuda moe: layer %d expert %d %s: missing %s", l, x, moe_mat_name(mat), !w ? "weights" : "scales");
            SM_CUDA_CHECK(cudaMemcpy(sb->buf, w, wb, cudaMemcpyHostToDevice));
            if (sbb) SM_CUDA_CHECK(cudaMemcpy(sb->buf + sb->sofs, s, sbb, cudaMemcpyHostToDevice));
            int nan = 0;
            if (moe_repack(L, x, mat, sb->buf, sb->buf + sb->sofs, sb->flags, hd + x, &nan, e)) {
                if (nan)
                    return sm_errf(e, "cuda moe: layer %d expert %d %s.weight_scale holds the e8m0 NaN byte 0xFF", l, x,
                                   moe_mat_name(mat));
                return -1;
            }
        }
    }
    SM_CUDA_CHECK(cudaMemcpy(L->desc, hd, sizeof(moe_desc) * (size_t)c->E, cudaMemcpyHostToDevice));
    SM_CUDA_CHECK(cudaMemcpy(L->post_norm, m->layers[l].post_expert_norm, sizeof(float) * (size_t)c->Hm, cudaMemcpyHostToDevice));
    SM_CUDA_CHECK(cudaDeviceSynchronize());
    return 0;
}

extern "C" int sm_cuda_moe_upload(const sm_model *m, int l, sm_cuda_moe_layer *L, sm_err *e) {
    if (!m || !L) return sm_errf(e, "cuda moe upload: NULL model or layer");
    memset(L, 0, sizeof *L);
    if (l < 0 || l >= m->cfg.L) return sm_errf(e, "cuda moe upload: layer %d outside [0, %d)", l, m->cfg.L);
    const sm_layer *ly = &m->layers[l];
    if (!ly->post_expert_norm) return sm_errf(e, "cuda moe upload: layer %d has no post_expert_norm", l);
    if (!ly->ex.gu || !ly->ex.dn) return sm_errf(e, "cuda moe upload: layer %d has no experts", l);
    if (moe_layer_alloc(&m->cfg, (int)ly->ex.fmt, L, e)) return sm_errprefix(e, "layer %d", l);
    moe_stage_buf sb;
    if (moe_stage_alloc(L, &sb, e)) { sm_cuda_moe_free(L); return -1; }
    moe_desc *hd = (moe_desc *)calloc((size_t)m->cfg.E, sizeof(moe_desc));
    int rc = hd ? moe_upload_impl(m, l, L, &sb, hd, e) : sm_errf(e, "cuda moe upload: out of host memory");
    free(hd);
    moe_stage_free(&sb);
    if (rc) sm_cuda_moe_free(L);
    return rc;
}

static int moe_synth_impl(const sm_config *c, int l, uint64_t seed, sm_cuda_moe_layer *L, moe_stage_buf *sb, moe_desc *hd,
                          sm_err *e) {
    for (int x = 0; x < c->E; x++) {
        for (int mat = 0; mat < 2; mat++) {
            const int R = mat ? c->Hm : 2 * c->I, K = mat ? c->I : c->Hm;
            const uint64_t key = moe_mix(seed ^ moe_mix(((uint64_t)l << 40) ^ ((uint64_t)x << 8) ^ (uint64_t)mat));
            const float sd = 1.0f / sqrtf((float)K);
            if (L->fmt == SM_EXP_MXFP4) {
                const long long n = (long long)R * (K / 32);
                moe_synth_mx_kernel<<<(unsigned)((n + 127) / 128), 128>>>(key, R, K, sd, sb->buf, sb->buf + sb->sofs);
            } else if (L->fmt == SM_EXP_FP8) {
                moe_synth_f8_kernel<<<(R + 127) / 128, 128>>>(key, R, K, sd, sb->buf, (float *)(sb->buf + sb->sofs));
            } else {
                const long long n = (long long)R * K;
                moe_synth_bf_kernel<<<(unsigned)((n + 255) / 256), 256>>>(key, R, K, sd, (uint16_t *)sb->buf);
            }
            SM_LAUNCH_CHECK("moe_synth_kernel");
            int nan = 0;
            if (moe_repack(L, x, mat, sb->buf, sb->buf + sb->sofs, sb->flags, hd + x, &nan, e)) {
                if (nan) return sm_errf(e, "cuda moe synth: layer %d expert %d %s: NaN scale generated", l, x, moe_mat_name(mat));
                return -1;
            }
        }
    }
    /* eff(post_expert_norm) = r16(1 + g), g ~ N(0, 0.02) */
    float *pn = (float *)malloc(sizeof(float) * (size_t)c->Hm);
    if (!pn) return sm_errf(e, "cuda moe synth: out of host memory");
    for (int i = 0; i < c->Hm; i++) {
        const uint64_t h = moe_mix(seed ^ moe_mix(0xEFFull + ((uint64_t)l << 32) + (uint64_t)i));
        const float u1 = ((float)(h >> 40) + 0.5f) * 5.9604645e-8f, u2 = ((float)(h & 0xFFFFFFu) + 0.5f) * 5.9604645e-8f;
        const float z = sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
        pn[i] = sm_r16(1.0f + 0.02f * z);
    }
    cudaError_t rc = cudaMemcpy(L->post_norm, pn, sizeof(float) * (size_t)c->Hm, cudaMemcpyHostToDevice);
    free(pn);
    SM_CUDA_CHECK(rc);
    SM_CUDA_CHECK(cudaMemcpy(L->desc, hd, sizeof(moe_desc) * (size_t)c->E, cudaMemcpyHostToDevice));
    SM_CUDA_CHECK(cudaDeviceSynchronize());
    return 0;
}

extern "C" int sm_cuda_moe_synth(const sm_config *c, int l, int fmt, uint64_t seed, sm_cuda_moe_layer *L, sm_err *e) {
    if (!c || !L) return sm_errf(e, "cuda moe synth: NULL config or layer");
    memset(L, 0, sizeof *L);
    if (moe_layer_alloc(c, fmt, L, e)) return -1;
    moe_stage_buf sb;
    if (moe_stage_alloc(L, &sb, e)) { sm_cuda_moe_free(L); return -1; }
    moe_desc *hd = (moe_desc *)calloc((size_t)c->E, sizeof(moe_desc));
    int rc = hd ? moe_synth_impl(c, l, seed, L, &sb, hd, e) : sm_errf(e, "cuda moe synth: out of host memory");
    free(hd);
    moe_stage_free(&sb);
    if (rc) sm_cuda_moe_free(L);
    return rc;
}

extern "C" void sm_cuda_moe_free(sm_cuda_moe_layer *L) {
    if (!L) return;
    cudaFree(L->blob);
    cudaFree(L->desc);
    cudaFree(L->post_norm);
    memset(L, 0, sizeof *L);
}

extern "C" size_t sm_cuda_moe_ws_bytes(const sm_config *c, int max_rows) {
    if (!c || max_rows < 1) return 0;
    return moe_ws_layout(c->E, c->K, c->Hm, c->I, max_rows).total;
}

/* Kernel attributes (shared memory above 48 KB) and the resident blocks. */
template <int F, int STAGE>
static int moe_prep_kernel(size_t smem, int *occ, sm_err *e) {
    SM_CUDA_CHECK(cudaFuncSetAttribute(moe_mm_kernel<F, STAGE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int o = 0;
    SM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, moe_mm_kernel<F, STAGE>, MOE_THREADS, smem));
    if (o < *occ) *occ = o;
    return 0;
}

extern "C" int sm_cuda_moe_ws_alloc(const sm_config *c, int max_rows, sm_cuda_moe_ws *ws, sm_err *e) {
    if (!c || !ws) return sm_errf(e, "cuda moe workspace: NULL config or workspace");
    memset(ws, 0, sizeof *ws);
    if (moe_check_dims(c, SM_EXP_MXFP4, e)) return -1;
    if (max_rows < 1 || (long long)max_rows * c->K > MOE_MAX_ROUTES)
        return sm_errf(e, "cuda moe workspace: max_rows %d x K %d routes outside [1, %d]", max_rows, c->K, MOE_MAX_ROUTES);
    const size_t s1 = (size_t)moe_rup(c->Hm, MOE_KALIGN) * 16, s2 = (size_t)moe_rup(c->I, MOE_KALIGN) * 16;
    int occ = 1 << 30;
    if (moe_prep_kernel<SM_EXP_MXFP4, 1>(s1, &occ, e) || moe_prep_kernel<SM_EXP_MXFP4, 2>(s2, &occ, e) ||
        moe_prep_kernel<SM_EXP_FP8, 1>(s1, &occ, e) || moe_prep_kernel<SM_EXP_FP8, 2>(s2, &occ, e) ||
        moe_prep_kernel<SM_EXP_BF16, 1>(s1, &occ, e) || moe_prep_kernel<SM_EXP_BF16, 2>(s2, &occ, e))
        return -1;
    if (occ < 1) return sm_errf(e, "cuda moe workspace: the expert kernels cannot be resident (Hm %d, I %d)", c->Hm, c->I);
    const size_t csm = sizeof(float) * (size_t)c->Hm;
    if (csm > 48 * 1024) SM_CUDA_CHECK(cudaFuncSetAttribute(moe_combine_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)csm));
    int dev = 0, sms = 0;
    SM_CUDA_CHECK(cudaGetDevice(&dev));
    SM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const moe_wsl W = moe_ws_layout(c->E, c->K, c->Hm, c->I, max_rows);
    cudaError_t rc = cudaMalloc(&ws->buf, W.total);
    if (rc != cudaSuccess) {
        ws->buf = NULL;
        return sm_errf(e, "cuda moe workspace: device allocation of %zu bytes failed: %s", W.total, cudaGetErrorString(rc));
    }
    ws->bytes = W.total;
    ws->max_rows = max_rows;
    ws->E = c->E; ws->K = c->K; ws->Hm = c->Hm; ws->I = c->I;
    ws->grid = sms * (occ < 2 ? occ : 2);
    ws->prefetch = MOE_PREFETCH_DEFAULT;
    return 0;
}

extern "C" void sm_cuda_moe_ws_free(sm_cuda_moe_ws *ws) {
    if (!ws) return;
    cudaFree(ws->buf);
    memset(ws, 0, sizeof *ws);
}

template <int F>
static int moe_launch(const sm_cuda_moe_layer *L, const uint16_t *h1, const sm_cuda_moe_ws *ws, cudaStream_t st, sm_err *e) {
    const moe_geom G = moe_geometry(F, L->Hm, L->I);
    const moe_wsl W = moe_ws_layout(L->E, L->K, L->Hm, L->I, ws->max_rows);
    uint8_t *wb = (uint8_t *)ws->buf;
    moe_args a;
    a.blob = (const uint8_t *)L->blob;
    a.desc = (const moe_desc *)L->desc;
    a.njobs = (const int *)(wb + W.njobs);
    a.jobs = (const int4 *)(wb + W.jobs);
    a.slot_route = (const int *)(wb + W.slot_route);
    a.K = L->K;
    a.sb = G.sb;
    a.pf = ws->prefetch < 0 ? 0 : ws->prefetch;
    /* stage 1: act = r16(silu(r16(h1 gate^T)) * r16(h1 up^T)) */
    a.in = h1; a.out = (uint16_t *)(wb + W.act);
    a.kin = L->Hm; a.Kp = G.Kp1; a.nsteps = G.ns1; a.rows_out = L->I;
    a.tiles = G.Ip / 16; a.pairs = G.p1; a.ipj = (G.p1 + MOE_WARPS - 1) / MOE_WARPS;
    moe_mm_kernel<F, 1><<<ws->grid, MOE_THREADS, (size_t)G.Kp1 * 16, st>>>(a);
    SM_LAUNCH_CHECK("moe_mm_kernel (gate_up)");
    /* stage 2: y = r16(act down^T) */
    a.in = (const uint16_t *)(wb + W.act); a.out = (uint16_t *)(wb + W.y);
    a.kin = L->I; a.Kp = G.Kp2; a.nsteps = G.ns2; a.rows_out = L->Hm;
    a.tiles = G.t2; a.pairs = G.p2; a.ipj = (G.p2 + MOE_WARPS - 1) / MOE_WARPS;
    moe_mm_kernel<F, 2><<<ws->grid, MOE_THREADS, (size_t)G.Kp2 * 16, st>>>(a);
    SM_LAUNCH_CHECK("moe_mm_kernel (down)");
    return 0;
}

extern "C" int sm_cuda_moe_forward(const sm_cuda_moe_layer *L, const uint16_t *h1, const int *idx, const float *w, int n,
                                   uint16_t *m_out, const sm_cuda_moe_ws *ws, cudaStream_t st, sm_err *e) {
    if (!L || !L->blob || !ws || !ws->buf) return sm_errf(e, "cuda moe forward: layer or workspace not allocated");
    if (n < 0 || n > ws->max_rows) return sm_errf(e, "cuda moe forward: %d rows outside [0, max_rows = %d] of the workspace", n, ws->max_rows);
    if (ws->E != L->E || ws->K != L->K || ws->Hm != L->Hm || ws->I != L->I)
        return sm_errf(e, "cuda moe forward: workspace sized for E %d K %d Hm %d I %d, layer has E %d K %d Hm %d I %d", ws->E,
                       ws->K, ws->Hm, ws->I, L->E, L->K, L->Hm, L->I);
    if (n == 0) return 0;
    if (!h1 || !idx || !w || !m_out) return sm_errf(e, "cuda moe forward: NULL h1, idx, w or m_out");
    if (!sm_aligned(h1, 16)) return sm_errf(e, "cuda moe forward: h1 must be 16-byte aligned");
    const moe_wsl W = moe_ws_layout(L->E, L->K, L->Hm, L->I, ws->max_rows);
    uint8_t *wb = (uint8_t *)ws->buf;
    /* group routes by expert */
    moe_route_kernel<<<1, MOE_ROUTE_THREADS, 0, st>>>(idx, n * L->K, L->E, (int *)(wb + W.njobs), (int *)(wb + W.route_slot),
                                                      (int *)(wb + W.slot_route), (int4 *)(wb + W.jobs));
    SM_LAUNCH_CHECK("moe_route_kernel");
    int rc;
    switch (L->fmt) {
    case SM_EXP_MXFP4: rc = moe_launch<SM_EXP_MXFP4>(L, h1, ws, st, e); break;
    case SM_EXP_FP8: rc = moe_launch<SM_EXP_FP8>(L, h1, ws, st, e); break;
    case SM_EXP_BF16: rc = moe_launch<SM_EXP_BF16>(L, h1, ws, st, e); break;
    default: return sm_errf(e, "cuda moe forward: unknown expert format %d", L->fmt);
    }
    if (rc) return -1;
    /* post-expert norm and the route-ordered weighted sum */
    moe_combine_kernel<<<n, 256, sizeof(float) * (size_t)L->Hm, st>>>((const uint16_t *)(wb + W.y), (const int *)(wb + W.route_slot),
                                                                     w, L->post_norm, L->K, L->Hm, L->post_eps, m_out);
    SM_LAUNCH_CHECK("moe_combine_kernel");
    return 0;
}

/* ---- self-check of the dequantizers against codec.h ---- */
__global__ void moe_selfcheck_kernel(int *bad) {
    const int u = blockIdx.x * blockDim.x + threadIdx.x;
    if (u < 16 * 255) {
        /* MXFP4: code x scale byte, through the packed word and scale word the kernel reads */
        const unsigned code = (unsigned)(u & 15);
        const int b = u >> 4, c = b > 128 ? b - 128 : 0, bp = b + 126 - c;
        unsigned cs[4][2];
        for (int i = 0; i < 4; i++) { cs[i][0] = code; cs[i][1] = (code + 5u * (unsigned)i + 3u) & 15u; }
        const uint32_t w = moe_mx_pack(cs);
        const uint32_t sw = (uint32_t)bp | ((uint32_t)bp << 8) | ((uint32_t)bp << 16) | ((uint32_t)bp << 24);
        {
            uint32_t mg, mg8, r[4];
            moe_mx_mults(sw, mg, mg8);
            moe_dq_mx(w, mg, mg8, r);
            for (int i = 0; i < 4; i++)
                for (int hf = 0; hf < 2; hf++) {
                    const float got = ldexpf(__uint_as_float((hf ? (r[i] >> 16) : (r[i] & 0xFFFFu)) << 16), c);
                    const float ref = sm_e2m1_to_f32(cs[i][hf]) * sm_e8m0_to_f32((uint8_t)b);
                    if (__float_as_uint(got) != __float_as_uint(ref)) atomicAdd(bad, 1);
                }
        }
    } else if (u < 16 * 255 + 256 * 4) {
        /* FP8: byte x row scale, r16(e4m3 * s) */
        const int v = u - 16 * 255, byte = v & 255, si = v >> 8;
        const float scales[4] = {1.0f, 0.0123f, 3.7e-3f, 250.0f};
        if (byte == 0x7F || byte == 0xFF) return;
        const uint32_t two = (uint32_t)byte | ((uint32_t)((byte * 7 + 1) & 0x7E) << 8);
        const uint32_t got = moe_dq_fp8(two, scales[si]);
        const uint16_t r0 = sm_f32_to_bf16(sm_e4m3_to_f32((uint8_t)byte) * scales[si]);
        const uint16_t r1 = sm_f32_to_bf16(sm_e4m3_to_f32((uint8_t)((byte * 7 + 1) & 0x7E)) * scales[si]);
        if ((got & 0xFFFFu) != r0 || (got >> 16) != r1) atomicAdd(bad, 1);
    }
}

extern "C" int sm_cuda_moe_selfcheck(sm_err *e) {
    /* host: the MXFP4 bit layout is a permutation of the 32 bits */
    uint32_t seen = 0;
    int bad = 0;
    for (int i = 0; i < 4; i++)
        for (int hf = 0; hf < 2; hf++)
            for (int b = 0; b < 4; b++) {
                const uint32_t bit = 1u << moe_mx_src(i, hf, b);
                if (seen & bit) bad++;
                seen |= bit;
            }
    if (seen != 0xFFFFFFFFu) bad++;
    int *d = NULL;
    SM_CUDA_CHECK(cudaMalloc((void **)&d, sizeof(int)));
    cudaError_t rc = cudaMemset(d, 0, sizeof(int));
    if (rc == cudaSuccess) {
        moe_selfcheck_kernel<<<(16 * 255 + 256 * 4 + 255) / 256, 256>>>(d);
        rc = cudaGetLastError();
    }
    int dbad = 0;
    if (rc == cudaSuccess) rc = cudaMemcpy(&dbad, d, sizeof(int), cudaMemcpyDeviceToHost);
    cudaFree(d);
    if (rc != cudaSuccess) return sm_errf(e, "cuda moe selfcheck: %s", cudaGetErrorString(rc));
    return bad + dbad;
}
