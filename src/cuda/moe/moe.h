/* moe.h: the MoE expert stage on the GPU (docs/model.md section 6, from h1 to m), shared by the
 * stock layers and the monokernel (both executors, src/cuda/exec/exec.h).  Included by .cu files
 * only (CUDA types allowed).
 *
 * Given h1 [n, Hm] (bf16, after pooler + pre-expert norm) and the routing of each row
 * (idx [n, K] expert ids, w [n, K] route weights, both on the device), computes for every
 * route gu = mm(h1, gate_up[e]), a = r16(silu(gate) * up), y = mm(a, down[e]),
 * t = r16(y * eff(post_expert_norm)), yn = t * rsqrt(mean(t^2) + 1e-8), and
 * m_out[r] = r16(sum_k w[r,k] * yn(r,k)) in route order k = 0..K-1.
 * Routes are grouped by expert ON THE DEVICE so each touched expert's weights are read once
 * per call; no host synchronization and no allocation inside forward, so it can be captured
 * in a CUDA graph.  The weight layout on the device is private to src/cuda/moe/ (it may
 * repack): geometry moe/geom.cuh, dequantizers moe/dequant.cuh, the phases' device bodies
 * moe/group.cuh, moe/mm.cuh, moe/combine.cuh (callable from a persistent kernel).
 *
 * Devices and streams: every function acts on the caller's CURRENT device (cudaSetDevice
 * before the call); a layer and a workspace belong to the device current at their creation.
 * Functions taking a stream run all their copies and kernels on it (never the legacy default
 * stream); the stream must belong to the current device.
 *
 * W4A4 layers (act_mx, docs/model.md section 6): h1 and act rounded to MXFP4 per 32 values
 * (h1 as staged unless the workspace says its producer rounded it: h1_mx), then the FP8 tensor
 * cores on e4m3 codes with exact block sums (x8), or the W4A16 matmul on those exact values
 * (sm_cuda_moe_set_acts chooses; SM_MOE_W4A4_FP8 is the uploads' choice).
 *
 * Limits (checked, error otherwise): Hm and I multiples of 32; E <= 2048; max_rows * K <=
 * 4096.  An expert of more than 8 routes in one call is processed in groups of 8 routes
 * (its weights are then read once per group).  Route ids outside [0, E) contribute nothing.
 *
 * W ranks (docs/parallelism.md section 2): a rank uploads the experts or expert slices its
 * shard holds (sm_cuda_moe_upload_shard: EP, experts [e0, e0 + ne) whole, the layer's E is
 * ne; TP, every expert's I slice [i0, i0 + ni), the layer's I is ni) and sizes its workspace
 * for that layer (sm_cuda_moe_ws_alloc_shard: the config with E = ne, I = ni; a shard may
 * hold fewer experts than K).  EP: sm_cuda_moe_forward_ep gives the f32 partial m of the
 * rank's routes, which the caller sums over ranks in rank order and rounds (r16).  TP:
 * sm_cuda_moe_forward_tp gives every route's f32 partial y over the rank's slice; the caller
 * sums them over ranks in rank order, then sm_cuda_moe_finalize makes m (the same norm and
 * route-ordered sum as the combine).  Nothing here communicates.
 */
#ifndef SM_CUDA_MOE_H
#define SM_CUDA_MOE_H
#include <cuda_runtime.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
#include "base/err.h"
#include "model/weights.h"
#include "parallel/shard.h"
#ifdef __cplusplus
}
#endif

typedef struct sm_cuda_moe_layer {
    int fmt;                 /* sm_expert_fmt */
    int E, K, Hm, I;
    float post_eps;          /* post_norm_eps of the config (1e-8) */
    void *blob;              /* device: all expert weights + scales in moe/geom.cuh's layout */
    size_t blob_bytes;
    size_t expert_bytes;     /* bytes of one expert in blob (weights + scales, padded) */
    size_t touched_bytes;    /* bytes one call reads per touched expert (for floors) */
    void *desc;              /* device: per-expert offsets or pointers into blob */
    float *post_norm;        /* device [Hm] eff(post_expert_norm) */
    int act_mx;              /* 1: W4A4 (fmt MXFP4 only): both matmuls take their activations
                                (h1, act) rounded to MXFP4 per 32 values as the B operand is
                                staged (docs/model.md section 6); set by the uploads from the
                                shard, by sm_cuda_moe_set_acts */
    int x8;                  /* 1: W4A4 runs on the FP8 tensor cores (the kernel format MOE_F_MX8 of
                                moe/geom.cuh): the MXFP4 codes sit in the e4m3 placement of
                                moe/dequant.cuh.  0: the bf16 placement (W4A16, or W4A4 with bf16
                                products).  Kept in step with act_mx by sm_cuda_moe_set_acts */
    int x8_ok;               /* 1: the layer may run MOE_F_MX8 exactly: MXFP4, and every matrix's
                                stored scale bytes >= 115 (moe_x8_wscale; set by the build) */
} sm_cuda_moe_layer;

typedef struct sm_cuda_moe_ws {
    void *buf;               /* device workspace, sm_cuda_moe_ws_bytes(...) bytes */
    size_t bytes;
    int max_rows;
    int E, K, Hm, I;         /* the config the workspace was sized for */
    int grid;                /* persistent CTAs of the matmul stages (SMs x resident blocks) */
    int prefetch;            /* k steps (of 2 KB per warp) the expert weights of W4A4 layers on
                                the FP8 tensor cores (sm_cuda_moe_kfmt MOE_F_MX8) are prefetched
                                into L2 ahead of the register loads, in calls of at most
                                prefetch_rows rows (0: none); the defaults: layer.cu; benchmarks
                                may change them (the results are the same bits) */
    int prefetch_rows;
    int h1_mx;               /* 1: the callers' h1 of W4A4 layers comes rounded to MXFP4 already
                                (the stock and monokernel pre-expert norms round it), so stage 1
                                stages it as is, and for layers on the FP8 tensor cores with its
                                e4m3 image (sm_cuda_moe_h1_img) written beside it; 0 (the
                                default): the forward rounds h1 and makes the image itself
                                (idempotent: the same bits either way) */
    int sched;               /* schedule of the expert matmul: SM_MOE_SCHED_QUEUE (the default) or
                                SM_MOE_SCHED_STAGES; benchmarks and tests may change it (the
                                results are the same bits) */
    unsigned long long *prof; /* NULL, or (benchmarks) a device buffer of SM_MOE_PROF_MAX_UNITS x 3
                                 + 2: per unit of the queue schedule (begin ns, end ns, block), then
                                 the first block's entry (atomicMin: set it to ~0 first) and the
                                 last block's exit */
} sm_cuda_moe_ws;
#define SM_MOE_PROF_MAX_UNITS 65536

/* Schedules of the expert matmul (sm_cuda_moe_ws.sched). */
enum {
    SM_MOE_SCHED_STAGES = 0, /* two launches (gate_up, down), static item ranges (mm.cuh) */
    SM_MOE_SCHED_QUEUE = 1   /* one launch, a queue of units, stage 2 after its job's stage 1 (queue.cuh) */
};

#ifdef __cplusplus
extern "C" {
#endif
/* Upload layer l's experts (reads from the mapped checkpoint, expert by expert) on stream st;
 * the layer is complete on return (st synchronized). */
int sm_cuda_moe_upload(const sm_model *m, int l, sm_cuda_moe_layer *L, cudaStream_t st, sm_err *e);
/* Upload what shard X (layer l's sm_shard_experts of an sm_shard_make of m) holds, reading
 * only through X's views: local expert j = global expert X->e0 + j, gate/up rows and down
 * columns of X's I slice.  The layer has E = X->ne, I = X->ni (fmt, K, Hm and the post norm
 * of m's layer l).  sm_cuda_moe_upload is this for the whole layer (one path).  TP with
 * MXFP4 experts needs X->ni % 32 == 0 (sm_shard_make refuses otherwise); every format needs
 * X->ni % 32 == 0 (moe.h limits).  Complete on return (st synchronized). */
int sm_cuda_moe_upload_shard(const sm_model *m, int l, const sm_shard_experts *X, sm_cuda_moe_layer *L, cudaStream_t st,
                             sm_err *e);
/* Fill a layer of config c with device-generated random experts of format fmt
 * (sm_expert_fmt), on stream st, complete on return: the values of make-model (src/model/rng.h
 * streams keyed by make-model's expert names, N(0, 1/fan_in), quantized as make-model does:
 * MXFP4 sm_mx_quantize_block, FP8 per-row scale amax/448, BF16 round to nearest even) and
 * its eff(post_expert_norm), so a synthetic layer equals the uploaded layer of a make-model
 * checkpoint of the same seed.  For benchmarks of the real widths without a checkpoint. */
int sm_cuda_moe_synth(const sm_config *c, int l, int fmt, uint64_t seed, sm_cuda_moe_layer *L, cudaStream_t st, sm_err *e);
void sm_cuda_moe_free(sm_cuda_moe_layer *L);
/* Set a layer's activations: act_mx 1 W4A4 (MXFP4 experts whose I holds whole 32-blocks only),
 * 0 W4A16; for W4A4 the tensor cores: fp8 1 (e4m3 operands, exact block sums, docs/model.md's
 * mm4 term by term) or 0 (the same products in bf16, summed in the mma's order); fp8 falls
 * back to 0 on a layer without x8_ok.  Moves the codes between the two placements on st when
 * the choice changes (complete on return).  The graphs and plans that hold the layer's kernel
 * format are the caller's to drop. */
int sm_cuda_moe_set_acts(sm_cuda_moe_layer *L, int act_mx, int fp8, cudaStream_t st, sm_err *e);
/* The fp8 the uploads pass (W4A4's tensor cores by default): the FP8 path, docs/model.md's mm4
 * term by term, as the bf16 path (MOE_F_MX4) is, and the faster of the two (bench/results.md:
 * the expert stage 8-9% faster than MOE_F_MX4 on the H100 at 8 and 128 rows). */
#define SM_MOE_W4A4_FP8 1
/* The kernel format a forward runs for L: moe/geom.cuh's MOE_F_MX8 for W4A4 on the FP8 tensor
 * cores, MOE_F_MX4 for W4A4 on the bf16 tensor cores (the same bits), else L->fmt. */
int sm_cuda_moe_kfmt(const sm_cuda_moe_layer *L);
/* The L2 prefetch distance (k steps) a forward of n rows of L runs with under ws (ws->prefetch,
 * prefetch_rows): 0 but for MOE_F_MX8. */
int sm_cuda_moe_prefetch(const sm_cuda_moe_layer *L, const sm_cuda_moe_ws *ws, int n);
/* Where the pre-expert norm of layer L writes h1's e4m3 image for the expert stage (in ws;
 * common.cuh sm_x8_img, sm_k_rms_bf16's img_*): 1 and *codes, *fac, *kp set when L runs
 * MOE_F_MX8 and ws->h1_mx says its callers round h1 (they must then write this image of the
 * same rows, or the results are wrong); 0 and NULL, NULL, 0 otherwise. */
int sm_cuda_moe_h1_img(const sm_cuda_moe_layer *L, const sm_cuda_moe_ws *ws, uint8_t **codes, float **fac, int *kp);
size_t sm_cuda_moe_ws_bytes(const sm_config *c, int max_rows);
int sm_cuda_moe_ws_alloc(const sm_config *c, int max_rows, sm_cuda_moe_ws *ws, sm_err *e);
/* The workspace (and its bytes) of a layer uploaded from shard X of a model of config c. */
size_t sm_cuda_moe_ws_bytes_shard(const sm_config *c, const sm_shard_experts *X, int max_rows);
int sm_cuda_moe_ws_alloc_shard(const sm_config *c, const sm_shard_experts *X, int max_rows, sm_cuda_moe_ws *ws, sm_err *e);
void sm_cuda_moe_ws_free(sm_cuda_moe_ws *ws);
/* h1 [n, Hm] bf16, idx [n, K] int32, w [n, K] f32, m_out [n, Hm] bf16; all device pointers. */
int sm_cuda_moe_forward(const sm_cuda_moe_layer *L, const uint16_t *h1, const int *idx, const float *w,
                        int n, uint16_t *m_out, const sm_cuda_moe_ws *ws, cudaStream_t st, sm_err *e);
/* EP rank: L holds global experts [e0, e0 + L->E) (sm_cuda_moe_upload_shard).  m_part [n, Hm]
 * f32 (device) = sum over the routes k = 0..K-1 of row i whose id lies in [e0, e0 + L->E), in
 * route order, of w[i, k] * yn(i, k), NOT rounded; 0 for a row with none of them (the CPU
 * rank's partial m before expert_sum).  Other routes contribute nothing.  h1, idx, w as
 * sm_cuda_moe_forward (idx holds GLOBAL expert ids). */
int sm_cuda_moe_forward_ep(const sm_cuda_moe_layer *L, int e0, const uint16_t *h1, const int *idx, const float *w, int n,
                           float *m_part, const sm_cuda_moe_ws *ws, cudaStream_t st, sm_err *e);
/* TP rank: L holds every expert's slice of I (L->I = ni).  y_part [n * K, Hm] f32 (device):
 * for route r = i * K + k, act = r16(silu(r16(h1_i . gate_slice)) * r16(h1_i . up_slice)) and
 * y_part[r] = act . down[:, slice]^T, f32 NOT rounded (the CPU rank's partial y before
 * expert_sum); 0 for a route whose id lies outside [0, E). */
int sm_cuda_moe_forward_tp(const sm_cuda_moe_layer *L, const uint16_t *h1, const int *idx, int n, float *y_part,
                           const sm_cuda_moe_ws *ws, cudaStream_t st, sm_err *e);
/* TP finalize: from y [n * K, Hm] f32 (the rank-order sum of every rank's y_part), m_out
 * [n, Hm] bf16 = r16(sum over the routes k of row i with 0 <= idx < E, in route order, of
 * w[i, k] * yn), yn = t * rsqrt(mean(t^2) + eps), t = r16(r16(y) * eff(post_expert_norm)).
 * Reads no workspace data (ws: only checked), so rows lo..hi of a token-sharded finalize are
 * (y, idx + lo K, w + lo K, hi - lo). */
int sm_cuda_moe_finalize(const sm_cuda_moe_layer *L, const float *y, const int *idx, const float *w, int n,
                         uint16_t *m_out, const sm_cuda_moe_ws *ws, cudaStream_t st, sm_err *e);
/* Bytes one expert of format fmt takes in the DEVICE layout (weights + scales, padded; the
 * same as sm_cuda_moe_layer.expert_bytes), 0 for widths <= 0.  Not the checkpoint bytes. */
size_t sm_cuda_moe_device_expert_bytes(const sm_config *c, int fmt);
/* Self-check of the device dequantizers against codec.h, run on the device (stream st): every
 * e2m1 code x every e8m0 scale byte (MXFP4 path incl. the exponent-offset path of scales >
 * 2^1), every e4m3 byte x several row scales (FP8 path), and the repack bit layout.  Returns
 * the number of mismatches (0 = pass) or -1 with e filled on a CUDA error. */
int sm_cuda_moe_selfcheck(cudaStream_t st, sm_err *e);
/* Matrix mat (0: gate_up [2I, Hm], 1: down [Hm, I]) of expert x read back from the device
 * layout through the matmul's dequantizers into out (device, [rows, cols] f32: the value each
 * weight has in the matmul, scale offsets included), on st (not synchronized).  For tests. */
int sm_cuda_moe_dequant(const sm_cuda_moe_layer *L, int x, int mat, float *out, cudaStream_t st, sm_err *e);
#ifdef __cplusplus
}
#endif
#endif
