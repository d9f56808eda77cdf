/* geom.cuh: the layout facts of the MoE expert stage, shared by host and device code: limits,
 * the repacked weight layout of one expert (tiles, pairs, k steps, byte offsets), the
 * per-expert descriptor, the workspace layout, and the map from a repacked row / pair to the
 * checkpoint row.  Every other file of moe/ takes its sizes and offsets from here.
 *
 * A matrix is stored as pairs of 16-row tiles (a warp's work: gate tile j and up tile j of
 * gate_up; down tiles 2p and 2p+1), each pair as one contiguous stream of k steps, each step
 * one block of sb bytes: [tile 2][sub 2][lane 32][16 bytes] and, for MXFP4, the scales
 * [tile 2][g 8][8 bytes].  FP8 row scales live apart: [pair][tile 2][16 rows] floats.
 * We rejected computing offsets in each kernel from the config: one struct filled once keeps
 * the repack, the matmul and the readback on the same layout by construction.
 */
#ifndef SM_CUDA_MOE_GEOM_CUH
#define SM_CUDA_MOE_GEOM_CUH
#include <stddef.h>
#include <stdint.h>
#include "cuda/moe/moe.h"
#include "model/codec.h"

#define MOE_WARPS 8
#define MOE_THREADS (MOE_WARPS * 32) /* threads of a block running the matmul body */
#define MOE_CH 8              /* routes per job: one mma n-tile */
#define MOE_KALIGN 128        /* contraction padded to this (zero weights, zero inputs) */
#define MOE_MAX_E 2048
#define MOE_MAX_ROUTES 4096   /* n * K per call */
#define MOE_TILE_BYTES 1024   /* one 16-row tile, one k step: 2 subs x 32 lanes x 16 bytes */

/* Kernel formats: the sm_expert_fmt values, and MOE_F_MX8: MXFP4 weights whose codes sit in
 * the e4m3 placement (dequant.cuh), run as W4A4 on the FP8 tensor cores (mm.cuh).  Its layout
 * is MXFP4's byte for byte (geometry, scales); only the bits inside each 16-byte chunk move.
 * MOE_F_MX4: MXFP4 in the bf16 placement (SM_EXP_MXFP4's layout and staging) run as W4A4 on
 * the bf16 tensor cores with each 32-block summed alone (mm4: the FP8 path's bits), for the
 * layers whose scales the FP8 path cannot take (sm_cuda_moe_layer.x8_ok). */
#define MOE_F_MX8 3
#define MOE_F_MX4 4
SM_HD int moe_is_mx(int f) { return f == SM_EXP_MXFP4 || f == MOE_F_MX8 || f == MOE_F_MX4; }
/* MXFP4 in the bf16 placement: the k permutation, staging and dequant of SM_EXP_MXFP4. */
SM_HD int moe_is_mxb(int f) { return f == SM_EXP_MXFP4 || f == MOE_F_MX4; }
/* MOE_F_MX8's B operand: a 32-block of a job's routes takes MOE_X8_BLK bytes (mm.cuh), the job's
 * B over a contraction of Kp moe_x8_bbytes(Kp). */
#define MOE_X8_BLK 288
SM_HD size_t moe_x8_bbytes(int Kp) { return (size_t)(Kp / 32) * MOE_X8_BLK; }
/* One of the queue schedule's two B buffers (MOE_F_MX8): the larger of the two stages' B. */
SM_HD size_t moe_x8_bbuf(int Kp1, int Kp2) { return moe_x8_bbytes(Kp1 > Kp2 ? Kp1 : Kp2); }

SM_HD int moe_rup(int x, int a) { return (x + a - 1) / a * a; }
SM_HD size_t moe_rupz(size_t x, size_t a) { return (x + a - 1) / a * a; }
/* k values per stored k step: MXFP4 128, FP8 64, BF16 32 (16 bytes a lane, two subs). */
SM_HD int moe_kstep(int fmt) { return fmt == SM_EXP_MXFP4 ? 128 : fmt == SM_EXP_FP8 ? 64 : 32; }
/* Bytes from one tile pair's stream to the next: ns step blocks of sb bytes (measured: an unused
 * block of padding after streams of a multiple of 8 KB, against DRAM conflicts of streams at
 * power-of-two strides, changed nothing beyond noise). */
SM_HD size_t moe_pstride(int ns, int sb) { return (size_t)ns * sb; }

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

SM_HD moe_geom moe_geometry(int fmt, int Hm, int I) {
    moe_geom G;
    G.Ip = moe_rup(I, 16); G.Hp = moe_rup(Hm, 16);
    G.Kp1 = moe_rup(Hm, MOE_KALIGN); G.Kp2 = moe_rup(I, MOE_KALIGN);
    G.ns1 = G.Kp1 / moe_kstep(fmt); G.ns2 = G.Kp2 / moe_kstep(fmt);
    G.t1 = 2 * G.Ip / 16; G.t2 = G.Hp / 16;
    G.p1 = G.Ip / 16; G.p2 = (G.t2 + 1) / 2;
    G.sb = 2 * MOE_TILE_BYTES + (fmt == SM_EXP_MXFP4 ? 128 : 0);
    G.w1 = (size_t)G.p1 * moe_pstride(G.ns1, G.sb);
    G.w2 = (size_t)G.p2 * moe_pstride(G.ns2, G.sb);
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

/* Per job, on the device: what a unit of the queue schedule (queue.cuh) needs of its job, in
 * one 64-byte entry written by the grouping, so a unit costs one copy of metadata. */
typedef struct moe_jobt {
    unsigned long long w[2];  /* the expert's moe_desc.w: [gate_up, down] weights offset */
    unsigned long long s[2];  /* its moe_desc.s: scales offset */
    float mul[2];             /* its moe_desc.mul */
    int s0, cnt;              /* first slot, routes (<= MOE_CH) */
    unsigned short row[MOE_CH]; /* input row (route / K) of each slot: stage 1's h1 rows */
} moe_jobt;
static_assert(sizeof(moe_jobt) == 64, "moe_jobt: one 64-byte entry (four 16-byte copies)");

/* Workspace layout: byte offsets into sm_cuda_moe_ws.buf. */
typedef struct moe_wsl {
    size_t njobs;             /* int: jobs the grouping made */
    size_t qctr;              /* int: units of the queue schedule claimed (zeroed by the grouping) */
    size_t route_slot;        /* int [R]: slot of route r, -1 for an invalid expert id */
    size_t slot_route;        /* int [R]: route of slot s (slots are expert-major) */
    size_t jobs;              /* int4 [maxjobs]: (expert, first slot, routes, 0) */
    size_t jobt;              /* moe_jobt [maxjobs]: the jobs for the queue schedule */
    size_t done1;             /* int [maxjobs]: stage-1 units finished per job (queue schedule) */
    size_t act;               /* bf16 [R, I]: a = r16(silu(gate) * up) per slot */
    size_t y;                 /* bf16 [R, Hm]: y = r16(a down^T) per slot */
    size_t rs;                /* f32 [R]: the post-expert norm scale of route r (the combine) */
    size_t act8;              /* MOE_F_MX8: [maxjobs] stage 2's B of each job (act as e4m3 codes,
                                 moe_x8_bbytes(Kp2) bytes a job), written by stage 1's epilogue */
    size_t h1c, h1f;          /* MOE_F_MX8: h1's image (written by its producer or the grouping
                                 launch), per row e4m3 codes u8 [Kp1] and factors f32 [Kp1 / 32]
                                 (common.cuh sm_x8_img) */
    int kp1;                  /* Kp1: the image's codes per row */
    size_t total;             /* bytes of the workspace */
    int maxjobs;              /* upper bound of jobs for R = max_rows * K routes */
} moe_wsl;

SM_HD moe_wsl moe_ws_layout(int E, int K, int Hm, int I, int max_rows) {
    moe_wsl W;
    size_t R = (size_t)max_rows * K;
    W.maxjobs = (int)(R / MOE_CH + (R < (size_t)E ? R : (size_t)E) + 1);
    W.njobs = 0;
    W.qctr = 64;
    W.route_slot = 256;
    W.slot_route = W.route_slot + moe_rupz(R * 4, 256);
    W.jobs = W.slot_route + moe_rupz(R * 4, 256);
    W.jobt = W.jobs + moe_rupz((size_t)W.maxjobs * 16, 256);
    W.done1 = W.jobt + moe_rupz((size_t)W.maxjobs * sizeof(moe_jobt), 256);
    W.act = W.done1 + moe_rupz((size_t)W.maxjobs * 4, 256);
    W.y = W.act + moe_rupz(R * (size_t)I * 2, 256);
    W.rs = W.y + moe_rupz(R * (size_t)Hm * 2, 256);
    W.act8 = W.rs + moe_rupz(R * 4, 256);
    W.kp1 = moe_rup(Hm, MOE_KALIGN);
    W.h1c = W.act8 + moe_rupz((size_t)W.maxjobs * moe_x8_bbytes(moe_rup(I, MOE_KALIGN)), 256);
    W.h1f = W.h1c + moe_rupz((size_t)max_rows * W.kp1, 256);
    W.total = W.h1f + moe_rupz((size_t)max_rows * (W.kp1 / 32) * 4, 256);
    return W;
}

/* Row rr of a repacked matrix -> row of the raw matrix, or -1 for padding.  gate_up: rows
 * [0, Ip) are gate rows (< I valid), [Ip, 2Ip) up rows; down: rows < R valid. */
SM_HD int moe_raw_row(int rr, int gu, int R, int Ip) {
    if (!gu) return rr < R ? rr : -1;
    const int I = R / 2;
    if (rr < Ip) return rr < I ? rr : -1;
    rr -= Ip;
    return rr < I ? I + rr : -1;
}

/* Tile X (0, 1) of pair P: gate_up pairs gate tile P with up tile Ip/16 + P; down pairs
 * tiles 2P and 2P+1. */
SM_HD int moe_pair_tile(int P, int X, int gu, int Ip) { return gu ? (X ? Ip / 16 + P : P) : 2 * P + X; }

#endif
