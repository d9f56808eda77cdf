/* kstep.cu: the expert stage's MXFP4 k step alone, then with the queue schedule's structure
 * added back piece by piece (`gpu_test --bench kstep`): where the stage's time goes between
 * the weight stream and the floor.
 *
 * One synthetic MXFP4 layer at the real widths (Hm = I = 4096, E = 256, sm_cuda_moe_synth);
 * the gate_up matrices of 59 experts (the distinct experts of 8 rows under uniform top-8
 * routing), 1.05 GB, streamed by units as the queue schedule cuts them (a unit: one expert's 8
 * tile pairs, a pair a warp, the whole contraction), unit u run by block u mod grid.  Every
 * variant runs mm.cuh's k step itself (moe_load, moe_compute: three register buffers, loads
 * two steps ahead across unit boundaries) on 8 routes staged once:
 *   body      the warps stream their units with no block synchronization (2 blocks an SM);
 *   body/1    the same with one block an SM (8 warps: half the bytes in flight);
 *   units     + a block barrier at every unit's end (the queue's switch);
 *   +epi      + each warp's outputs of one route stored as bf16 before that barrier (64
 *             bytes a warp: the stage-1 epilogue's stores at 8 rows, about one route a job);
 *   +restage  + one route's B (8 KB) restaged from global memory after it, a second barrier;
 *   e4m3      the body's loads with another k step: the instruction mix of W4A4 on Hopper's FP8
 *             tensor cores (e2m1 codes are e4m3 values times 2^-6): per 32-k block and tile,
 *             the 16 codes of a lane to e4m3 bytes (one LOP3 for 8 codes, two shifts and two
 *             LOP3 for the other 8: the count of a placement a repack for it can give),
 *             one wgmma m64n8k32 (A from registers, B the job's e4m3 routes in shared memory,
 *             a fresh accumulator: the exact block sum), then the block's scale 2^(ew + ea) as
 *             an f32 built by one IMAD and one FFMA an output.  It runs on the layout of the
 *             bf16 k step, so its values mean nothing: only its time does (issue 34's notes:
 *             the accumulator keeps 14 bits, an exact block sum needs 13; its codes are
 *             converted after the wgmma fence, so ptxas injects arrives, C7519);
 *   x8        the body's loads with the landed W4A4 k step on the FP8 tensor cores
 *             (moe_compute<MOE_F_MX8>: the e4m3 placement's conversion, the 288-byte B blocks
 *             with their f32 factors, both scales a block in f32).  It reads the bf16 placement
 *             and random B bytes, so its values mean nothing either: only its time does;
 *   x8f       x8 without the activation blocks' factors (moe_compute_x8<0>: no FMUL and no
 *             shared load of them a block): what folding each route's factors into its e4m3 B
 *             would save (timing only; no such B exists).
 * Floor = the bytes streamed / the read bandwidth of the run; SM clock probed after each.  The
 * real stage adds the claim counter, the job table, the stage-2 waits, the grouping and the
 * combine launches: `gpu_test --bench moe` (SM_MOE_BENCH_PROF=1) times those.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda/common.cuh"
#include "cuda/moe/moe.h"
#include "cuda/moe/mm.cuh"
#include "cuda/ops/matmul.cuh"
#include "bench.h"

#define KS_EXPERTS 59 /* experts streamed */

enum { KS_BODY, KS_UNITS, KS_EPI, KS_RESTAGE, KS_E4M3, KS_X8, KS_X8F, KS_NVAR };

typedef struct ks_args {
    const uint8_t *blob;     /* the layer's experts (geom.cuh layout) */
    const int *ex;           /* [KS_EXPERTS] experts streamed */
    size_t expert;           /* bytes of one expert */
    int ns, sb, ipj;         /* gate_up: k steps, bytes of a pair-step block, units an expert */
    int U;                   /* units */
    const uint2 *bsrc;       /* [Kp / 16][8][4] the routes in fragment order (global) */
    int bwords;              /* uint4 words of bsrc */
    float *out;              /* [U][8 warps][8 lane groups][2] words of bf16 outputs (KS_EPI, KS_RESTAGE);
                                [grid * 256] sums (the others) */
} ks_args;

/* The load cursor of a warp: unit lu (its block's next units: lu + gridDim.x ...), step LS. */
typedef struct ks_cur {
    int lu, LS, live;
    const uint8_t *w;
} ks_cur;

__device__ __forceinline__ void ks_point(ks_cur &c, const ks_args &k, int warp) {
    if (c.lu >= k.U) { c.live = 0; return; }
    const int e = k.ex[c.lu / k.ipj], p = (c.lu % k.ipj) * MOE_WARPS + warp;
    c.w = k.blob + (size_t)e * k.expert + (size_t)p * moe_pstride(k.ns, k.sb);
    c.LS = 0;
}

__device__ __forceinline__ void ks_load(ks_cur &c, moe_buf &b, const ks_args &k, int warp, int lane) {
    if (!c.live) return;
    if (c.LS == k.ns) {
        c.lu += gridDim.x;
        ks_point(c, k, warp);
        if (!c.live) return;
    }
    moe_load<SM_EXP_MXFP4>(b, moe_cur{0, 0, c.w, NULL}, lane);
    c.w += k.sb;
    c.LS++;
}

/* The end of a unit in variant V. */
template <int V>
__device__ __forceinline__ void ks_unit_end(const ks_args &k, int u, uint2 *Bs, float (&acc)[2][4], float &sum, int warp, int lane) {
    if (V >= KS_EPI) { /* one route's 32 outputs of the warp as bf16 (64 bytes: the stage-1 epilogue's at 8 rows) */
        if ((lane & 3) == 0) {
            uint2 *o = (uint2 *)(k.out + (((size_t)u * MOE_WARPS + warp) * 8 + (lane >> 2)) * 2);
            *o = make_uint2((uint32_t)sm_tobf(acc[0][0]) | ((uint32_t)sm_tobf(acc[0][2]) << 16),
                            (uint32_t)sm_tobf(acc[1][0]) | ((uint32_t)sm_tobf(acc[1][2]) << 16));
        }
    } else {
#pragma unroll
        for (int X = 0; X < 2; X++) sum += acc[X][0] + acc[X][1] + acc[X][2] + acc[X][3];
    }
#pragma unroll
    for (int X = 0; X < 2; X++) acc[X][0] = acc[X][1] = acc[X][2] = acc[X][3] = 0.0f;
    if (V >= KS_UNITS) __syncthreads();
    if (V >= KS_RESTAGE) { /* one route's entries: [ks][r = 0][t 0..3], two uint4 of each k16 step's 16 */
        const uint4 *src = (const uint4 *)k.bsrc;
        uint4 *dst = (uint4 *)Bs;
        for (int i = (int)threadIdx.x; i < k.bwords / 8; i += MOE_THREADS) dst[(i >> 1) * 16 + (i & 1)] = src[(i >> 1) * 16 + (i & 1)];
        __syncthreads();
    }
}

/* ---- the e4m3 k step (KS_E4M3: timing only) ---- */

/* e4m3 bytes (bits 7, 4..2 of each byte: sign, e1 e0 m) of the second 4 codes of a word: two
 * shifts and two LOP3, the count of a real placement (those codes at bits 0, 1, 5, 6 of each
 * byte, rotated by 6 and by 2; the first 4 sit in place: one LOP3).  This expression only
 * stands in for it: it reads bits the first 4 codes use (timing only). */
__device__ __forceinline__ uint32_t ks_e4m3_hi(uint32_t x) { return ((x >> 1) & 0x98989898u) | ((x << 2) & 0x04040404u); }

/* d = A (64 x 32 e4m3, this thread's 4 registers) x B (32 x 8 e4m3, descriptor db), a fresh sum. */
__device__ __forceinline__ void ks_wgmma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(0));
}

/* Shared-memory descriptor of a K-major 8 x 32 e4m3 B block at saddr (two 8 x 16-byte core
 * matrices, 128 bytes apart; no swizzle). */
__device__ __forceinline__ uint64_t ks_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)(128 >> 4) << 16) | ((uint64_t)(256 >> 4) << 32);
}

/* acc[X] += d[X] x 2^(ew + ea) for 32-k block blk: the rows' scale bytes from the weights'
 * block (b.s), the columns' ea << 23 from shared memory. */
__device__ __forceinline__ void ks_scale(float (&d)[2][4], const moe_buf &b, const int2 &ea, int blk, float (&acc)[2][4]) {
#pragma unroll
    for (int X = 0; X < 2; X++) {
#pragma unroll
        for (int i = 0; i < 4; i++) sm_wg_pin(d[X][i]);
        const uint32_t r0 = __byte_perm(b.s[X].x, 0, 0x4440 + blk), r1 = __byte_perm(b.s[X].y, 0, 0x4440 + blk);
        acc[X][0] = fmaf(d[X][0], __int_as_float((int)(r0 << 23) + ea.x), acc[X][0]);
        acc[X][1] = fmaf(d[X][1], __int_as_float((int)(r0 << 23) + ea.y), acc[X][1]);
        acc[X][2] = fmaf(d[X][2], __int_as_float((int)(r1 << 23) + ea.x), acc[X][2]);
        acc[X][3] = fmaf(d[X][3], __int_as_float((int)(r1 << 23) + ea.y), acc[X][3]);
    }
}

/* One 128-k step: 4 blocks x 2 tiles of wgmma, block b + 1's issued before block b is scaled. */
__device__ __forceinline__ void ks_compute_e4m3(const moe_buf &b, int S, uint32_t bq, const int2 *eas, int lane, float (&acc)[2][4]) {
    float d[2][2][4];
#pragma unroll
    for (int blk = 0; blk < 4; blk++) {
        const int cur = blk & 1;
        sm_wg_fence();
#pragma unroll
        for (int X = 0; X < 2; X++) {
            const uint32_t in0 = moe_u4(b.w[X][blk >> 1], 2 * (blk & 1)), in1 = moe_u4(b.w[X][blk >> 1], 2 * (blk & 1) + 1);
            ks_wgmma_e4m3(d[cur][X], in0 & 0x9C9C9C9Cu, ks_e4m3_hi(in0), in1 & 0x9C9C9C9Cu, ks_e4m3_hi(in1),
                          ks_desc(bq + (uint32_t)((S * 4 + blk) * 256)));
        }
        sm_wg_commit();
        if (blk > 0) {
            sm_wg_wait<1>();
            ks_scale(d[cur ^ 1], b, eas[(S * 4 + blk - 1) * 4 + (lane & 3)], blk - 1, acc);
        }
    }
    sm_wg_wait<0>();
    ks_scale(d[1], b, eas[(S * 4 + 3) * 4 + (lane & 3)], 3, acc);
}

template <int V>
__global__ void __launch_bounds__(MOE_THREADS, 2) ks_kernel(const ks_args k) {
    extern __shared__ uint4 ks_dyn[];
    uint2 *Bs = (uint2 *)ks_dyn;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int i = (int)threadIdx.x; i < k.bwords; i += MOE_THREADS) ks_dyn[i] = ((const uint4 *)k.bsrc)[i];
    moe_b_fence<MOE_F_MX8>(); /* KS_E4M3, KS_X8, KS_X8F: the tensor cores read B through the async proxy */
    __syncthreads();
    ks_cur c;
    c.lu = blockIdx.x; c.live = 1; c.w = k.blob; c.LS = 0;
    ks_point(c, k, warp);
    if (!c.live) return;
    float acc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}}, sum = 0.0f;
    moe_buf X, Y, Z;
    ks_load(c, X, k, warp, lane);
    ks_load(c, Y, k, warp, lane);
    int u = blockIdx.x, S = 0;
    const uint32_t bq = sm_wg_u32(Bs);                                   /* KS_E4M3: B as e4m3 [block][256 bytes] */
    const int2 *eas = (const int2 *)((const uint8_t *)Bs + (size_t)k.ns * 4 * 256); /* KS_E4M3: [block][t] ea << 23 */
    /* three register buffers in rotation, as the queue: compute one while two are in flight */
#define KS_STEP(B)                                                                                       \
    if (V == KS_E4M3) ks_compute_e4m3(B, S, bq, eas, lane, acc);                                         \
    else if (V == KS_X8) moe_compute<MOE_F_MX8>(B, S, Bs, lane, acc);                                    \
    else if (V == KS_X8F) moe_compute_x8<0>(B, S, Bs, lane, acc);                                        \
    else moe_compute<SM_EXP_MXFP4>(B, S, Bs, lane, acc);                                                 \
    if (++S == k.ns) {                                                                                   \
        ks_unit_end<V >= KS_E4M3 ? KS_BODY : V>(k, u, Bs, acc, sum, warp, lane);                         \
        S = 0;                                                                                           \
        if ((u += gridDim.x) >= k.U) break;                                                              \
    }
    for (;;) {
        ks_load(c, Z, k, warp, lane);
        KS_STEP(X)
        ks_load(c, X, k, warp, lane);
        KS_STEP(Y)
        ks_load(c, Y, k, warp, lane);
        KS_STEP(Z)
    }
#undef KS_STEP
    if (V < KS_EPI || V >= KS_E4M3) k.out[(size_t)blockIdx.x * MOE_THREADS + threadIdx.x] = sum; /* keeps the sums live */
}

typedef struct ks_case {
    ks_args k;
    int var, grid;
    size_t smem;
} ks_case;

static void (*const ks_kernels[KS_NVAR])(const ks_args) = {ks_kernel<KS_BODY>, ks_kernel<KS_UNITS>, ks_kernel<KS_EPI>,
                                                           ks_kernel<KS_RESTAGE>, ks_kernel<KS_E4M3>, ks_kernel<KS_X8>,
                                                           ks_kernel<KS_X8F>};

static int ks_call(bh_run *r, void *arg, int set, sm_err *e) {
    (void)set;
    const ks_case *c = (const ks_case *)arg;
    ks_kernels[c->var]<<<c->grid, MOE_THREADS, c->smem, r->st>>>(c->k);
    SM_LAUNCH_CHECK("ks_kernel");
    return 0;
}

int bench_kstep(bh_run *r, sm_err *e) {
    sm_config cf = r->cfg;
    cf.L = 1;
    sm_cuda_moe_layer L;
    memset(&L, 0, sizeof L);
    if (sm_cuda_moe_synth(&cf, 0, SM_EXP_MXFP4, r->seed, &L, r->st, e)) return sm_errprefix(e, "bench kstep: synth");
    const moe_geom G = moe_geometry(SM_EXP_MXFP4, cf.Hm, cf.I);
    ks_case c;
    memset(&c, 0, sizeof c);
    c.k.blob = (const uint8_t *)L.blob;
    c.k.expert = G.expert;
    c.k.ns = G.ns1;
    c.k.sb = G.sb;
    c.k.ipj = (G.p1 + MOE_WARPS - 1) / MOE_WARPS;
    c.k.U = KS_EXPERTS * c.k.ipj;
    c.smem = (size_t)G.Kp1 * 16; /* the routes in fragment order: 16 bytes a k value */
    c.k.bwords = (int)(c.smem / 16);
    int hx[KS_EXPERTS], *dx = NULL;
    for (int i = 0; i < KS_EXPERTS; i++) hx[i] = (i * 97 + 13) % cf.E; /* distinct: 97 is odd, E a power of 2 */
    int rc = 0;
    uint16_t *bsrc = NULL;
    float *out = NULL;
    /* the stores of +epi and +restage, or the sums of the others (at most 2 blocks an SM) */
    const size_t epin = (size_t)c.k.U * MOE_WARPS * 8 * 2, sumn = (size_t)2 * r->sms * MOE_THREADS;
    const size_t outn = epin > sumn ? epin : sumn;
    if (cudaMalloc((void **)&dx, sizeof hx) != cudaSuccess || cudaMalloc((void **)&bsrc, c.smem) != cudaSuccess ||
        cudaMalloc((void **)&out, outn * sizeof(float)) != cudaSuccess) {
        rc = sm_errf(e, "bench kstep: cudaMalloc failed");
        goto done;
    }
    if (cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice) != cudaSuccess) { rc = sm_errf(e, "bench kstep: copy failed"); goto done; }
    if (bh_normal_bf16(r, bsrc, c.smem / 2, "bench.kstep.b", 0.0f, 1.0f, e)) { rc = -1; goto done; }
    c.k.ex = dx;
    c.k.bsrc = (const uint2 *)bsrc;
    c.k.out = out;
    {
        const int pairs = c.k.U * MOE_WARPS;
        const double bytes = (double)pairs * G.ns1 * G.sb;
        printf("\n== kstep: the MXFP4 k step (mm.cuh) over the gate_up of %d experts (%.0f MB), queue-shaped units of "
               "8 pairs, then the schedule's structure added back; floor = bytes / read bandwidth\n",
               KS_EXPERTS, bytes / 1e6);
        printf("%-10s %6s %10s %9s %9s %8s\n", "variant", "blocks", "us", "TB/s", "floor us", "% floor");
        static const char *names[KS_NVAR] = {"body", "units", "+epi", "+restage", "e4m3", "x8", "x8f"};
        for (int v = 0; v < KS_NVAR; v++)
            SM_CUDA_CHECK(cudaFuncSetAttribute(ks_kernels[v], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)c.smem));
        for (int v = -1; v < KS_NVAR && !rc; v++) {
            c.var = v < 0 ? KS_BODY : v;
            c.grid = r->sms * (v < 0 ? 1 : 2); /* v = -1: the body with one block an SM */
            float us = 0;
            double mhz = 0;
            if (bh_time(r, ks_call, &c, 1, 1, &us, e) || bh_sm_mhz(r, &mhz, e)) { rc = -1; break; }
            const double fl = bytes / r->bw * 1e6;
            char name[32];
            snprintf(name, sizeof name, "%s%s", names[c.var], v < 0 ? "/1" : "");
            printf("%-10s %6d %10.2f %9.2f %9.2f %7.1f%%   %4.0f MHz\n", name, c.grid, us, bytes / (us * 1e-6) / 1e12, fl, 100.0 * fl / us, mhz);
            char op[48];
            snprintf(op, sizeof op, "kstep %s", name);
            bh_add(r, op, 8, us, fl);
        }
        fflush(stdout);
    }
done:
    if (dx) SM_CUDA_CHECK_PRINT(cudaFree(dx));
    if (bsrc) SM_CUDA_CHECK_PRINT(cudaFree(bsrc));
    if (out) SM_CUDA_CHECK_PRINT(cudaFree(out));
    sm_cuda_moe_free(&L);
    return rc;
}
