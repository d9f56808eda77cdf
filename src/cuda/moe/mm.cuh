/* mm.cuh: the expert matmul of the MoE stage (device body): stage 1 gate_up + SiLU, stage 2
 * down, over the jobs made by the grouping (group.cuh).  Its k step (moe_load, moe_compute),
 * B staging (moe_b_kofs, moe_b_put) and epilogue (moe_epilogue_at) are shared by both
 * schedules: the queue schedule (queue.cuh, the default) and the stage schedule below,
 * moe_mm_block, run by mm.cu's stage kernels (one launch per stage, the grid fixed by the
 * workspace) or by a persistent kernel that runs a stage as one phase on a range of work.
 *
 * Work is a flat list of items (job, group of MOE_WARPS tile pairs): total = njobs * ipj.  A
 * (virtual) block takes a contiguous range of items; each warp owns one tile pair per item (stage 1:
 * the 16 gate rows j and the 16 up rows I+j, so silu(gate)*up is formed in registers; stage
 * 2: 32 down rows).  Weights are the A operand of mma.m16n8k16 (16 weight rows), the job's
 * routes the B operand (8 columns, staged in shared memory once per job).  The weights are
 * repacked at upload so that a warp's two tiles form one contiguous stream of 2 KB k-step
 * blocks (plus 128 bytes of MXFP4 scales) in which every lane reads 16 contiguous bytes
 * holding exactly its A fragments for several k16 steps: four 512-byte warp loads per step,
 * two steps in flight in registers, and an L2 prefetch further ahead (a.pf: moe.h
 * sm_cuda_moe_ws.prefetch says when).  Dequantization in registers: dequant.cuh.
 * Per 128-k step and warp the MXFP4 k step issues 16 HMMA, 64 HMUL2, ~89 LOP3 and ~68 SHF: the
 * integer ops and the load latency, not the bytes, bound it (bench/moe.md).
 * W4A4 (docs/model.md section 6): the activations are rounded to MXFP4 per 32 values: h1 by
 * its producer (the pre-expert norm; sm_cuda_moe_ws.h1_mx) or, for other callers, as it is
 * staged (MOE_AQ_IN), and act by stage 1's epilogue (MOE_AQ_OUT).  Then either the FP8
 * tensor cores (the uploads' choice, moe.h SM_MOE_W4A4_FP8; kernel format MOE_F_MX8: the
 * codes in the e4m3 placement of dequant.cuh, the routes staged as e4m3, one wgmma m64n8k32 a
 * 32-block with the block's two scales applied in f32: mm4 term by term, with about 30% fewer
 * integer-pipe instructions a weight; the faster W4A4 path: bench/results.md) or, for the
 * layers whose scales the FP8 path cannot take, the bf16 tensor cores (kernel format MOE_F_MX4:
 * W4A16's layout, staging and dequant; an e2m1 value times a power of two is a bf16 value) with
 * each 32-block summed alone and added in block order (moe_compute_mxb<1>): mm4 again, the FP8
 * path's bits.  We rejected summing them in the mma's
 * order as W4A16 does: two blocks share every mma, so the sums round differently from mm4,
 * and act's MXFP4 rounding can turn one such rounding into a different scale for its block.
 * We rejected split-K across blocks (atomics make sums nondeterministic), and measured and
 * dropped one tile per warp in stage 2 (finer items: slower, bench/moe.md).
 */
#ifndef SM_CUDA_MOE_MM_CUH
#define SM_CUDA_MOE_MM_CUH
#include "cuda/common.cuh"
#include "cuda/moe/geom.cuh"
#include "cuda/moe/dequant.cuh"
#include "model/codec.h"

typedef struct moe_args {
    const uint8_t *blob;      /* expert weights, moe layout */
    const moe_desc *desc;     /* [E] */
    const int *njobs;         /* device scalar from the grouping */
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
    float *y32;               /* stage 2 with Y32 = 1 (moe_mm_block): f32 y NOT rounded per
                                 ROUTE, [n * K, rows_out] at row slot_route[slot] (out unused);
                                 NULL otherwise */
    int aq;                   /* W4A4 (MXFP4 only): MOE_AQ_IN `in` is rounded to MXFP4 as it is
                                 staged (stage 1, unless the caller's h1 comes rounded);
                                 MOE_AQ_OUT the stage-1 epilogue writes act rounded (stage 2
                                 then stages it as is) */
} moe_args;
#define MOE_AQ_IN 1
#define MOE_AQ_OUT 2

/* Dynamic shared memory of the body for a stage: the job's routes, [Kp/16][8 routes][4 t]
 * of uint2. */
static inline size_t moe_mm_smem(const moe_args &a) { return (size_t)a.Kp * 16; }

typedef struct moe_buf {
    uint4 w[2][2];            /* [tile][sub]: 16 bytes of this lane */
    uint2 s[2];               /* [tile]: MXFP4 scale bytes of this lane; FP8: row scales g, g+8 */
} moe_buf;

typedef struct moe_cur {
    int it, S;                /* item and k step to load next */
    const uint8_t *w;         /* the pair-step block of (it, S) */
    const float *fs;          /* FP8: the pair's row scales */
} moe_cur;

/* ---- weight loads ---- */
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
/* L2 prefetch of the 128-byte line at p (one per lane: a warp covers a pair-step block in
 * one instruction; the bulk-copy prefetch needs a warp-uniform address loop instead). */
__device__ __forceinline__ void moe_prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

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
    c.w = a.blob + d->w[STAGE - 1] + (size_t)p * moe_pstride(a.nsteps, a.sb);
    c.fs = (const float *)(a.blob + d->s[STAGE - 1]) + p * 32;
}

template <int F>
__device__ __forceinline__ void moe_load(moe_buf &b, const moe_cur &c, int lane) {
    const uint8_t *w = c.w + lane * 16;
    b.w[0][0] = moe_ldg16(w);
    b.w[0][1] = moe_ldg16(w + 512);
    b.w[1][0] = moe_ldg16(w + 1024);
    b.w[1][1] = moe_ldg16(w + 1536);
    if (moe_is_mx(F)) {
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

/* ---- W4A4 on the FP8 tensor cores (MOE_F_MX8) ----
 * Per 32-block and tile, one wgmma m64n8k32 e4m3 (the warpgroup's 4 warps, each with its own
 * 16 rows of the 64 as A in registers; B the job's 8 routes in shared memory) into a fresh
 * accumulator: d = the block sum S_b x 2^-12 (products are multiples of 2^-14 and |S_b| <= 1152
 * needs 13 bits: exact); then acc += (d x 2^(ea - 127)) x 2^(ew - 115), the product exact and
 * one rounding for the add: docs/model.md's mm4 term by term, in block order (exact while
 * d x 2^(ea - 127) stays a normal float: activation blocks above 2^-112).
 * B of a block (MOE_X8_BLK bytes): two core matrices of 8 routes x 16 k slots (slots 0-15,
 * 16-31, in the weights' slot order: dequant.cuh), then the 8 routes' 2^(ea - 127) as f32. */

/* Shared-memory descriptor of one block's B: K-major, no swizzle, core matrices of 8 rows x 16
 * bytes, the two k-slot halves 128 bytes apart (LBO; SBO, the 8-row stride, never used with 8
 * routes, is set alike). */
__device__ __forceinline__ uint64_t moe_x8_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)(128 >> 4) << 16) | ((uint64_t)(128 >> 4) << 32);
}
/* d = A (this warp's 16 rows x 32 e4m3: a[0..3]) x B (32 x 8 e4m3 at descriptor db), a fresh
 * sum; read d only after a wait and sm_wg_pin. */
__device__ __forceinline__ void moe_x8_mma(float (&d)[4], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(0));
}
/* Keep the compiler from moving a register's definition past this point. */
__device__ __forceinline__ void moe_x8_pin(uint32_t &r) { asm volatile("" : "+r"(r)::"memory"); }
/* acc[X] += d[X] x 2^(ea - 127) x 2^(ew - 115) for block blk of the step: the rows' scale bytes
 * from the weights' scale words (b.s: [g blk0, g+8 blk0, g blk1, g+8 blk1] per half), the
 * columns' (2t, 2t+1) factors sa from shared memory.  SA = 0 leaves sa out: the cost of a k
 * step whose B had its routes' factors folded in (timing only: `gpu_test --bench kstep`, x8f;
 * no such B exists). */
template <int SA>
__device__ __forceinline__ void moe_x8_scale(float (&d)[2][4], const moe_buf &b, int blk, float2 sa, float (&acc)[2][4]) {
#pragma unroll
    for (int X = 0; X < 2; X++) {
#pragma unroll
        for (int i = 0; i < 4; i++) sm_wg_pin(d[X][i]);
        const uint32_t sw = blk < 2 ? b.s[X].x : b.s[X].y;
        const float wg = moe_x8_wscale(sw, 2 * (blk & 1)), wg8 = moe_x8_wscale(sw, 2 * (blk & 1) + 1);
        acc[X][0] = fmaf(SA ? d[X][0] * sa.x : d[X][0], wg, acc[X][0]);
        acc[X][1] = fmaf(SA ? d[X][1] * sa.y : d[X][1], wg, acc[X][1]);
        acc[X][2] = fmaf(SA ? d[X][2] * sa.x : d[X][2], wg8, acc[X][2]);
        acc[X][3] = fmaf(SA ? d[X][3] * sa.y : d[X][3], wg8, acc[X][3]);
    }
}
/* acc[X] += tile X rows (16) x the job's 8 routes over k step S (4 blocks), a block at a
 * time: its A fragments converted, its 2 wgmma (one a tile) issued and waited for, then
 * scaled.  (ptxas serializes wgmma whose A registers are written while others are in flight;
 * two blocks in flight made the queue kernel spill beside its three buffers and were slower in
 * the queue: bench/results.md.) */
template <int SA = 1>
__device__ __forceinline__ void moe_compute_x8(const moe_buf &b, int S, const uint2 *__restrict__ Bs, int lane, float (&acc)[2][4]) {
    const uint8_t *bb = (const uint8_t *)Bs + (size_t)S * 4 * MOE_X8_BLK;
    const uint32_t bq = sm_wg_u32(bb);
    const int t = lane & 3;
#pragma unroll
    for (int blk = 0; blk < 4; blk++) {
        uint32_t a[2][4];
#pragma unroll
        for (int X = 0; X < 2; X++) { /* the block's codes: words 2 (blk & 1), + 1 of chunk blk >> 1 */
            moe_x8_regs(moe_u4(b.w[X][blk >> 1], 2 * (blk & 1)), a[X][0], a[X][1]);
            moe_x8_regs(moe_u4(b.w[X][blk >> 1], 2 * (blk & 1) + 1), a[X][2], a[X][3]);
#pragma unroll
            for (int i = 0; i < 4; i++) moe_x8_pin(a[X][i]);
        }
        float d[2][4];
        sm_wg_fence();
#pragma unroll
        for (int X = 0; X < 2; X++) moe_x8_mma(d[X], a[X], moe_x8_desc(bq + (uint32_t)(blk * MOE_X8_BLK)));
        sm_wg_commit();
        sm_wg_wait<0>();
        moe_x8_scale<SA>(d, b, blk, SA ? *(const float2 *)(bb + blk * MOE_X8_BLK + 256 + 8 * t) : make_float2(1.0f, 1.0f), acc);
    }
}

/* MXFP4 in the bf16 placement: acc[X] += tile X rows x the job's routes over k step S.  EX = 0
 * (W4A16, or W4A4 summed in the mma's order): one mma a k16 step.  EX = 1 (MOE_F_MX4): mm4 term
 * by term.  A register's two bf16 halves hold k 2t (block 2h) and k 2t + 1 (block 2h + 1) of a
 * k16 step (dequant.cuh's permutation, moe_b_kofs), so the mma runs each half h of the step
 * twice, with the routes' odd, then even, halves zeroed: one fresh f32 sum per 32-block, exact
 * (32 products of e2m1 x e2m1 times the block's one power of two: at most 13 significant bits),
 * then added to acc in block order with one rounding each, as docs/model.md's mm4 does. */
template <int EX>
__device__ __forceinline__ void moe_compute_mxb(const moe_buf &b, int S, const uint2 *__restrict__ Bs, int lane,
                                                float (&acc)[2][4]) {
    const int g = lane >> 2, t = lane & 3;
    const uint2 *bs = Bs + (size_t)S * 8 * 32 + g * 4 + t;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        uint32_t mg[2], mg8[2];
#pragma unroll
        for (int X = 0; X < 2; X++) moe_mx_mults(h ? b.s[X].y : b.s[X].x, mg[X], mg8[X]);
        float s0[2][4], s1[2][4]; /* EX: [X] the sums of block 2h, of block 2h + 1 */
        if (EX)
#pragma unroll
            for (int X = 0; X < 2; X++)
#pragma unroll
                for (int i = 0; i < 4; i++) s0[X][i] = s1[X][i] = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const uint2 bf = bs[(h * 4 + q) * 32];
#pragma unroll
            for (int X = 0; X < 2; X++) {
                uint32_t r[4];
                moe_dq_mx(moe_u4(b.w[X][h], q), mg[X], mg8[X], r);
                if (EX) {
                    sm_mma16816(s0[X], r[0], r[1], r[2], r[3], bf.x & 0x0000FFFFu, bf.y & 0x0000FFFFu);
                    sm_mma16816(s1[X], r[0], r[1], r[2], r[3], bf.x & 0xFFFF0000u, bf.y & 0xFFFF0000u);
                } else {
                    sm_mma16816(acc[X], r[0], r[1], r[2], r[3], bf.x, bf.y);
                }
            }
        }
        if (EX)
#pragma unroll
            for (int X = 0; X < 2; X++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[X][i] = __fadd_rn(__fadd_rn(acc[X][i], s0[X][i]), s1[X][i]);
    }
}

/* acc[X] += tile X rows (16) x the job's 8 routes over k step S. */
template <int F>
__device__ __forceinline__ void moe_compute(const moe_buf &b, int S, const uint2 *__restrict__ Bs, int lane,
                                            float (&acc)[2][4]) {
    const int g = lane >> 2, t = lane & 3;
    if (F == MOE_F_MX8) {
        moe_compute_x8(b, S, Bs, lane, acc);
    } else if (moe_is_mxb(F)) {
        moe_compute_mxb<F == MOE_F_MX4>(b, S, Bs, lane, acc);
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

/* Load 16 bytes of an input row: through the read-only data path (RO = 1: the input was
 * written by an earlier launch) or a plain load (RO = 0: written earlier in the same
 * persistent launch, ordered by its grid barrier; the read-only path is outside the memory
 * model and may serve stale lines). */
template <int RO>
__device__ __forceinline__ uint4 moe_ld_in(const uint16_t *p) {
    if (RO) return __ldg((const uint4 *)p);
    return *(const uint4 *)p;
}

/* The k offsets (ka, kb) in an input row of the two 8-value groups that k16 step ks of the
 * B operand takes (MXFP4: k permuted inside each 128-k step, lo halves from block 2h, hi
 * halves from 2h+1, as the weights). */
template <int F>
__device__ __forceinline__ void moe_b_kofs(int ks, int &ka, int &kb) {
    if (moe_is_mxb(F)) {
        const int S = ks >> 3, s = ks & 7;
        ka = S * 128 + (2 * (s >> 2)) * 32 + (s & 3) * 8;
        kb = ka + 32;
    } else {
        ka = ks * 16; kb = ka + 8;
    }
}

/* W4A4 (docs/model.md section 6): round a staged entry's two 8-value groups to MXFP4 in
 * place, A of one 32-block and B of the next (moe_b_kofs), as bf16 (exact: e2m1 x 2^e).  The
 * other 24 values of both blocks are held by the three lanes lane ^ D1, lane ^ D2,
 * lane ^ D1 ^ D2, which call it together (mask: those four lanes).  Each block's scale byte
 * comes from its amax (codec.h's rule), each value from sm_mx_round_value: the CPU quantizer's
 * values.  Rounding is idempotent, so a row staged by several blocks gets the same bits. */
__device__ __forceinline__ uint32_t moe_aq_amax8(const uint4 &v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) m = max(m, max(w[i] & 0x7FFFu, (w[i] >> 16) & 0x7FFFu));
    return m; /* |bf16| bits order as the magnitudes (finite inputs) */
}
__device__ __forceinline__ uint32_t moe_aq_word(uint32_t w, uint8_t b) {
    const float lo = sm_mx_round_value(__uint_as_float(w << 16), b);
    const float hi = sm_mx_round_value(__uint_as_float(w & 0xFFFF0000u), b);
    return (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xFFFF0000u);
}
/* W4A4: the two bf16 values of p rounded to MXFP4, each under the scale byte of the block amax
 * in the same half of m (sm_mx_scale_byte's rule), in bf16x2 arithmetic: for each half the bits
 * sm_mx_round_value(x, sm_mx_scale_byte(amax)) gives (tests/gpu/moe.cu checks every bf16 value
 * against every amax), in about half its instructions, for stage 1's epilogue.  The same rule
 * at bf16 width: exponent fields are bits 7..14 of a half; the amax rounds up at bf16 bit 5
 * (f32 bit 21); 2^-e has field 256 - max(ex, 2), 2^e field max(ex, 2) - 2 (the subnormal 2^-127
 * for field 0); C = 2^(max(ey, 0) + 6) has the grid step as its bf16 ulp.  No half carries into
 * the other: every field sum stays below 2^16. */
__device__ __forceinline__ uint32_t moe_aq_round2(uint32_t p, uint32_t m) {
    const uint32_t ex = __vmaxu2((m + 0x00200020u) & 0x7F807F80u, 0x01000100u); /* max(ex, 2) << 7 */
    const uint32_t inv = 0x80008000u - ex;                                             /* 2^-e */
    const uint32_t sc = __vmaxu2(ex - 0x01000100u, 0x00400040u);                  /* 2^e */
    const __nv_bfloat162 y = __hmul2(__habs2(*(const __nv_bfloat162 *)&p), *(const __nv_bfloat162 *)&inv);
    const uint32_t cb = __vmaxu2(*(const uint32_t *)&y & 0x7F807F80u, 0x3F803F80u) + 0x03000300u;
    const uint32_t six = 0x40C040C0u, zero = 0u;                                        /* bf16 6, +0 */
    const __nv_bfloat162 c = *(const __nv_bfloat162 *)&cb;
    const __nv_bfloat162 q = __hmin2(__hsub2_rn(__hadd2_rn(y, c), c), *(const __nv_bfloat162 *)&six);
    const uint32_t qs = *(const uint32_t *)&q | (p & 0x80008000u);                     /* copysign */
    const __nv_bfloat162 r = __hfma2(*(const __nv_bfloat162 *)&qs, *(const __nv_bfloat162 *)&sc,
                                     *(const __nv_bfloat162 *)&zero);                  /* x 2^e; -0 -> +0 */
    return *(const uint32_t *)&r;
}
template <int D1, int D2>
__device__ __forceinline__ void moe_aq_round(uint4 &A, uint4 &B, unsigned mask) {
    uint32_t ma = moe_aq_amax8(A), mb = moe_aq_amax8(B);
    ma = max(ma, __shfl_xor_sync(mask, ma, D1));
    mb = max(mb, __shfl_xor_sync(mask, mb, D1));
    ma = max(ma, __shfl_xor_sync(mask, ma, D2));
    mb = max(mb, __shfl_xor_sync(mask, mb, D2));
    const uint8_t ba = sm_mx_scale_byte(__uint_as_float(ma << 16)), bb = sm_mx_scale_byte(__uint_as_float(mb << 16));
    A = make_uint4(moe_aq_word(A.x, ba), moe_aq_word(A.y, ba), moe_aq_word(A.z, ba), moe_aq_word(A.w, ba));
    B = make_uint4(moe_aq_word(B.x, bb), moe_aq_word(B.y, bb), moe_aq_word(B.z, bb), moe_aq_word(B.w, bb));
}

/* Write the fragment-order B entry (k16 step, route) made of the input groups A (at ka) and
 * B (at kb) to dst (32 bytes): the 4 lanes t of the route each find their 4 bf16 there. */
template <int F>
__device__ __forceinline__ void moe_b_put(const uint4 &A, const uint4 &B, uint2 *dst_) {
    uint2 o[4];
    if (moe_is_mxb(F)) {
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
    uint4 *dst = (uint4 *)dst_;
    dst[0] = make_uint4(o[0].x, o[0].y, o[1].x, o[1].y);
    dst[1] = make_uint4(o[2].x, o[2].y, o[3].x, o[3].y);
}

/* MOE_F_MX8: entry A (values 16h..16h+7 of a route's 32-block), B (16h+8..16h+15) to its
 * e4m3 codes, the other half of the block being in lane ^ D (mask: both lanes): the block's
 * scale byte from its amax (codec.h's rule; for values already rounded to MXFP4 the byte they
 * were rounded under), the values rounded under it first if aq (as moe_aq_round), then each
 * value / 2^(e + 6) converted (exact: an e2m1 value times 2^-6).  Out: A = the 8 pairs
 * (code of A[i], code of B[i]) as 16-bit words, B.x = the block's factor 2^(ea - 127) (f32). */
template <int D>
__device__ __forceinline__ void moe_x8_entry(uint4 &A, uint4 &B, int aq, unsigned mask) {
    uint32_t m = max(moe_aq_amax8(A), moe_aq_amax8(B));
    m = max(m, __shfl_xor_sync(mask, m, D));
    const uint8_t sb = sm_mx_scale_byte(__uint_as_float(m << 16));
    if (aq) {
        A = make_uint4(moe_aq_word(A.x, sb), moe_aq_word(A.y, sb), moe_aq_word(A.z, sb), moe_aq_word(A.w, sb));
        B = make_uint4(moe_aq_word(B.x, sb), moe_aq_word(B.y, sb), moe_aq_word(B.z, sb), moe_aq_word(B.w, sb));
    }
    const float inv = sm_x8_inv(sb); /* 2^-(e + 6), a power of two >= 2^-133 */
    const uint32_t av[4] = {A.x, A.y, A.z, A.w}, bv[4] = {B.x, B.y, B.z, B.w};
    uint32_t o[4];
#pragma unroll
    for (int p = 0; p < 4; p++)
        o[p] = sm_x8_code2(sm_bf_lo(av[p]), sm_bf_lo(bv[p]), inv) | (sm_x8_code2(sm_bf_hi(av[p]), sm_bf_hi(bv[p]), inv) << 16);
    A = make_uint4(o[0], o[1], o[2], o[3]);
    B.x = __float_as_uint(sm_e8m0_to_f32(sb));
}
/* Store the entry (k16 step ks = 32-block ks >> 1, half h = ks & 1; route r) moe_x8_entry made:
 * pair i = 4 cm + t holds k 16h + 4cm + t and that + 8, slots 4t + 2h and 4t + 2h + 1 of core
 * matrix cm (dequant.cuh: slot 16 cm + 4t + c holds k = 8c + 4cm + t); half 0 also stores the
 * route's factor. */
__device__ __forceinline__ void moe_x8_put(const uint4 &P, uint32_t sa, uint2 *Bs, int ks, int r) {
    uint8_t *blk = (uint8_t *)Bs + (size_t)(ks >> 1) * MOE_X8_BLK;
    const int h = ks & 1;
    const uint32_t pw[4] = {P.x, P.y, P.z, P.w};
#pragma unroll
    for (int i = 0; i < 8; i++)
        *(uint16_t *)(blk + (i >> 2) * 128 + r * 16 + (i & 3) * 4 + 2 * h) = (uint16_t)(pw[i >> 1] >> (16 * (i & 1)));
    if (!h) *(uint32_t *)(blk + 256 + 4 * r) = sa;
}
/* After a thread's last generic store of B, before the barrier that lets wgmma read it (the
 * tensor cores read shared memory through the async proxy). */
template <int F>
__device__ __forceinline__ void moe_b_fence(void) {
    if (F == MOE_F_MX8) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* Stage the job's routes (B operand) into shared memory in fragment order:
 * Bs[ks][r][t] = the 4 bf16 of k16 step ks, route r that lane (g = r, t) feeds to the mma. */
template <int F, int STAGE, int RO>
__device__ __forceinline__ void moe_stage_b(const moe_args &a, int job, uint2 *Bs, int tid) {
    const int4 jb = a.jobs[job];
    const int s0 = jb.y, cnt = jb.z, nks = a.Kp / 16;
    for (int u = tid; u < nks * MOE_CH; u += MOE_THREADS) {
        const int ks = u / MOE_CH, r = u % MOE_CH;
        uint4 A = make_uint4(0, 0, 0, 0), B = A;
        if (r < cnt) {
            const int slot = s0 + r;
            const uint16_t *row = STAGE == 1 ? a.in + (size_t)(a.slot_route[slot] / a.K) * a.kin
                                             : a.in + (size_t)slot * a.kin;
            int ka, kb;
            moe_b_kofs<F>(ks, ka, kb);
            if (ka < a.kin) A = moe_ld_in<RO>(row + ka);
            if (kb < a.kin) B = moe_ld_in<RO>(row + kb);
        }
        /* W4A4: a block's 4 groups are in lanes r, r + 8, r + 16, r + 24 (nks * MOE_CH is a
         * multiple of 64: whole warps take every turn of this loop) */
        if (moe_is_mxb(F) && (a.aq & MOE_AQ_IN)) moe_aq_round<8, 16>(A, B, 0xFFFFFFFFu);
        if (F == MOE_F_MX8) { /* the block's other half: entry (ks ^ 1, r), lane ^ 8 */
            moe_x8_entry<8>(A, B, a.aq & MOE_AQ_IN, 0xFFFFFFFFu);
            moe_x8_put(A, B.x, Bs, ks, r);
        } else {
            moe_b_put<F>(A, B, Bs + (size_t)(ks * MOE_CH + r) * 4);
        }
    }
    moe_b_fence<F>();
}

/* Write the outputs of tile pair p of a job (first slot s0, cnt routes, result factor mul)
 * from the accumulators: stage 1 act = r16(silu(r16(gate)) * r16(up)), stage 2 y = r16(sum)
 * (Y32: f32 y per route).  Stage 1 with MOE_AQ_OUT (W4A4): act rounded to MXFP4 per 32 values
 * of a route, a block being the 16 rows of this warp and the 16 of warp ^ 1 (tile pairs 2k,
 * 2k + 1): each warp's per-route amax goes through amx (shared, [MOE_WARPS][MOE_CH / 2] route pairs) and
 * every warp of the team must call it (a team barrier; the early return waits for it). */
template <int STAGE, int Y32>
__device__ __forceinline__ void moe_epilogue_at(const moe_args &a, int p, int s0, int cnt, float mul, int lane,
                                                const float (&acc)[2][4], __nv_bfloat162 *amx = NULL,
                                                const sm_team *tm = NULL, uint8_t *img = NULL) {
    const int g = lane >> 2, t = lane & 3;
    if (STAGE == 1) {
        uint16_t o[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            /* gate, up = r16(sums); a = r16(silu(gate) * up) */
            const float gg = sm_r16d(acc[0][i] * mul), uu = sm_r16d(acc[1][i] * mul);
            o[i] = sm_tobf(gg * (1.0f / (1.0f + expf(-gg))) * uu);
        }
        if (a.aq & MOE_AQ_OUT) {
            /* the block amax of columns 2t, 2t+1 as one bf16 pair: rows g, g+8 of the lane,
             * the warp's 8 g, the partner warp; then each pair rounded */
            const int warp = (tm->tid >> 5);
            const __nv_bfloat162 p0 = __halves2bfloat162(__ushort_as_bfloat16(o[0]), __ushort_as_bfloat16(o[1]));
            const __nv_bfloat162 p1 = __halves2bfloat162(__ushort_as_bfloat16(o[2]), __ushort_as_bfloat16(o[3]));
            __nv_bfloat162 m = __hmax2(__habs2(p0), __habs2(p1));
#pragma unroll
            for (int d = 4; d < 32; d <<= 1) m = __hmax2(m, __shfl_xor_sync(0xFFFFFFFFu, m, d));
            if (g == 0) amx[warp * MOE_CH / 2 + t] = m;
            sm_team_sync(*tm);
            m = __hmax2(m, amx[(warp ^ 1) * MOE_CH / 2 + t]);
            const uint32_t r0 = moe_aq_round2(*(const uint32_t *)&p0, *(const uint32_t *)&m);
            const uint32_t r1 = moe_aq_round2(*(const uint32_t *)&p1, *(const uint32_t *)&m);
            o[0] = (uint16_t)r0; o[1] = (uint16_t)(r0 >> 16); o[2] = (uint16_t)r1; o[3] = (uint16_t)(r1 >> 16);
            if (img && p < a.tiles) {
                /* act's e4m3 image (MOE_F_MX8: stage 2's B, img = the job's): this warp's rows
                 * are k 16 (p & 1) + g (+ 8: the next slot) of 32-block p >> 1; the byte of
                 * the rounded block's amax is the one it was rounded under (common.cuh
                 * sm_mx_round8) */
                uint8_t *blk = img + (size_t)(p >> 1) * MOE_X8_BLK;
                const int sl = sm_x8_slot(16 * (p & 1) + g);
                const uint8_t b0 = sm_mx_scale_byte(__low2float(m)), b1 = sm_mx_scale_byte(__high2float(m));
                const int j = p * 16 + g;
                const int in0 = j < a.rows_out, in8 = j + 8 < a.rows_out; /* rows past I: +0 */
                const uint32_t c0 = sm_x8_code2(in0 ? sm_bf(o[0]) : 0.0f, in8 ? sm_bf(o[2]) : 0.0f, sm_x8_inv(b0));
                const uint32_t c1 = sm_x8_code2(in0 ? sm_bf(o[1]) : 0.0f, in8 ? sm_bf(o[3]) : 0.0f, sm_x8_inv(b1));
                if (2 * t < cnt) *(uint16_t *)(blk + (sl >> 4) * 128 + (2 * t) * 16 + (sl & 15)) = (uint16_t)c0;
                if (2 * t + 1 < cnt) *(uint16_t *)(blk + (sl >> 4) * 128 + (2 * t + 1) * 16 + (sl & 15)) = (uint16_t)c1;
                if (g == 0 && !(p & 1)) {
                    if (2 * t < cnt) *(float *)(blk + 256 + 4 * (2 * t)) = sm_e8m0_to_f32(b0);
                    if (2 * t + 1 < cnt) *(float *)(blk + 256 + 4 * (2 * t + 1)) = sm_e8m0_to_f32(b1);
                }
            }
        }
        if (p >= a.tiles) return;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int col = 2 * t + (i & 1), j = p * 16 + g + (i >> 1) * 8;
            if (col < cnt && j < a.rows_out) a.out[(size_t)(s0 + col) * a.rows_out + j] = o[i];
        }
    } else {
#pragma unroll
        for (int X = 0; X < 2; X++) {
            const int tile = 2 * p + X;
            if (tile >= a.tiles) continue;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int col = 2 * t + (i & 1), row = tile * 16 + g + (i >> 1) * 8;
                if (col < cnt && row < a.rows_out) {
                    if (Y32) a.y32[(size_t)a.slot_route[s0 + col] * a.rows_out + row] = acc[X][i] * mul; /* y, f32 by route */
                    else a.out[(size_t)(s0 + col) * a.rows_out + row] = sm_tobf(acc[X][i] * mul);     /* y = r16(sum) */
                }
            }
        }
    }
}

template <int STAGE, int Y32>
__device__ __forceinline__ void moe_epilogue(const moe_args &a, int it, int warp, int lane, const float (&acc)[2][4], __nv_bfloat162 *amx,
                                             const sm_team &tm) {
    const int job = it / a.ipj, itile = it - job * a.ipj;
    const int4 jb = a.jobs[job];
    moe_epilogue_at<STAGE, Y32>(a, itile * MOE_WARPS + warp, jb.y, jb.z, a.desc[jb.x].mul[STAGE - 1], lane, acc, amx, &tm);
}

/* The loop state of one block, and one k step of it: issue the loads two steps ahead (and
 * an L2 prefetch pf steps further), compute this step, and at an item's end write its
 * outputs (and restage B on a new job). */
typedef struct moe_loop {
    moe_cur lc;               /* load cursor */
    int it, S, N, i1, job;    /* compute cursor, steps of the block, item end, staged job */
    float acc[2][4];
} moe_loop;

template <int F, int STAGE, int RO, int Y32>
__device__ __forceinline__ void moe_step(moe_loop &L, int p, const moe_buf &cur, moe_buf &n2, const moe_args &a,
                                         uint2 *Bs, int warp, int lane, const sm_team &tm) {
    if (p + 2 < L.N) {
        moe_load<F>(n2, L.lc, lane);
        if (lane * 128 < a.sb && a.pf && L.lc.S + a.pf < a.nsteps && L.lc.it < L.i1)
            moe_prefetch_l2(L.lc.w + (size_t)a.pf * a.sb + lane * 128);
        moe_advance<F, STAGE>(L.lc, L.i1, a, warp);
    }
    moe_compute<F>(cur, L.S, Bs, lane, L.acc);
    if (++L.S == a.nsteps) {
        /* W4A4: the warps' act amax (moe_epilogue_at), two sets by item parity: a warp writes
         * a set again only after the next item's barrier, which its partner passes after
         * reading that set (no barrier separates consecutive items of one job) */
        __shared__ __nv_bfloat162 amx[2][MOE_WARPS * MOE_CH / 2];
        moe_epilogue<STAGE, Y32>(a, L.it, warp, lane, L.acc, amx[L.it & 1], tm);
#pragma unroll
        for (int X = 0; X < 2; X++) L.acc[X][0] = L.acc[X][1] = L.acc[X][2] = L.acc[X][3] = 0.0f;
        L.S = 0;
        if (++L.it < L.i1) {
            const int nj = L.it / a.ipj;
            if (nj != L.job) {
                sm_team_sync(tm); /* every warp done with the old routes */
                moe_stage_b<F, STAGE, RO>(a, nj, Bs, tm.tid);
                sm_team_sync(tm);
                L.job = nj;
            }
        }
    }
}

/* Run stage STAGE (1: gate_up + SiLU, 2: down) for weight format F as virtual block vb of
 * nb (vb < nb): items [vb * total / nb, (vb+1) * total / nb) of total = njobs * ipj.  The
 * stock kernel passes (blockIdx.x, gridDim.x); a persistent kernel its own block index and
 * count (unsigned, as the built-ins: the same arithmetic, the same code).
 * Run by one team tm of exactly MOE_THREADS threads (common.cuh; the stock kernel: its block),
 * all of which call it (it holds team barriers); smem: moe_mm_smem(a) bytes of shared memory
 * of the team, 16-byte aligned.  RO: 1 if a.in was written
 * by an earlier launch (stock path), 0 if earlier in the same persistent launch.  On return
 * other warps of the team may still read smem: sync the team before reusing it.  Y32 (stage 2
 * only): store y in f32 per route into a.y32 instead of bf16 per slot (a TP rank's partial y).
 * Needs
 * the grouping complete (a.njobs, a.jobs, a.slot_route) and, for stage 2, every item of
 * stage 1 (act): a persistent kernel separates the phases by grid barriers.
 * (One function, not a range body plus a wrapper: the split changed register allocation.) */
template <int F, int STAGE, int RO, int Y32 = 0>
__device__ __forceinline__ void moe_mm_block(const moe_args &a, unsigned vb, unsigned nb, void *smem, const sm_team &tm) {
    static_assert(!Y32 || STAGE == 2, "moe_mm_block: f32 output is a stage 2 option");
    uint2 *Bs = (uint2 *)smem; /* [Kp/16][8 routes][4 lanes t] */
    const int warp = tm.tid >> 5, lane = tm.tid & 31;
    const int total = *a.njobs * a.ipj;
    const int i0 = (int)((long long)vb * total / nb);
    const int i1 = (int)((long long)(vb + 1) * total / nb);
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
    moe_stage_b<F, STAGE, RO>(a, L.job, Bs, tm.tid);
    sm_team_sync(tm);
    /* three register buffers in rotation: step p computes one while p+1, p+2 are in flight */
    for (int p = 0; p < L.N; p += 3) {
        moe_step<F, STAGE, RO, Y32>(L, p, X, Z, a, Bs, warp, lane, tm);
        if (p + 1 < L.N) moe_step<F, STAGE, RO, Y32>(L, p + 1, Y, X, a, Bs, warp, lane, tm);
        if (p + 2 < L.N) moe_step<F, STAGE, RO, Y32>(L, p + 2, Z, Y, a, Bs, warp, lane, tm);
    }
}

/* ---- host side (mm.cu) ---- */
/* The arguments of stage `stage` (1, 2) for layer L, input h1 (stage 1) of n rows and workspace
 * ws. */
moe_args moe_mm_make(const sm_cuda_moe_layer *L, const uint16_t *h1, int n, const sm_cuda_moe_ws *ws, int stage);
/* Kernel attributes (shared memory above 48 KB) of the stock kernels of every format and
 * stage for widths Hm, I; *occ lowered to the fewest resident blocks per SM among them. */
int moe_mm_prepare(int Hm, int I, int *occ, sm_err *e);

#endif
