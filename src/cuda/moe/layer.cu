/* layer.cu: the device memory of the MoE stage: checks of the widths against the limits of
 * moe.h, a layer's allocation and release, the bytes of one expert in the device layout, and
 * the workspace (sized for max_rows, kernel attributes set, persistent grid chosen).
 * Everything here acts on the caller's current device.
 * We rejected allocating inside forward: it must be capturable in a CUDA graph.
 */
#include "cuda/moe/build.h"
#include "cuda/moe/geom.cuh"
#include "cuda/moe/mm.cuh"
#include "cuda/moe/combine.cuh"
#include <string.h>

/* L2 prefetch of the expert weights of W4A4 on the FP8 tensor cores (the official numerics)
 * ahead of the register loads (sm_cuda_moe_ws.prefetch): k steps, in calls of at most
 * MOE_PREFETCH_ROWS rows.  Measured (bench/results.md): where the register buffers' bytes in
 * flight do not cover the read rate it streams the units up to 12% faster; where they do (an
 * H100 at 32+ rows, BF16 experts) the extra traffic costs more than it gains.  (The other
 * formats' kernels are left without it: its per-step check alone made W4A16 1% slower.) */
#define MOE_PREFETCH_DEFAULT 4
#define MOE_PREFETCH_ROWS 16

int moe_check_dims(const sm_config *c, int fmt, int shard, sm_err *e) {
    if (fmt != SM_EXP_BF16 && fmt != SM_EXP_FP8 && fmt != SM_EXP_MXFP4) return sm_errf(e, "cuda moe: unknown expert format %d", fmt);
    if (c->Hm <= 0 || c->I <= 0 || c->Hm % 32 || c->I % 32)
        return sm_errf(e, "cuda moe: moe_hidden_size %d and moe_intermediate_size %d must be positive multiples of 32", c->Hm, c->I);
    if (c->E < 1 || c->E > MOE_MAX_E) return sm_errf(e, "cuda moe: num_local_experts %d outside [1, %d]", c->E, MOE_MAX_E);
    if (c->K < 1 || (!shard && c->K > c->E)) return sm_errf(e, "cuda moe: num_experts_per_tok %d outside [1, E = %d]", c->K, c->E);
    if ((size_t)moe_rup(c->Hm > c->I ? c->Hm : c->I, MOE_KALIGN) * 16 > 200 * 1024)
        return sm_errf(e, "cuda moe: widths Hm %d / I %d too large for the staged routes in shared memory", c->Hm, c->I);
    return 0;
}

int moe_layer_alloc(const sm_config *c, int fmt, int shard, sm_cuda_moe_layer *L, sm_err *e) {
    memset(L, 0, sizeof *L);
    if (moe_check_dims(c, fmt, shard, e)) return -1;
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

extern "C" void sm_cuda_moe_free(sm_cuda_moe_layer *L) {
    if (!L) return;
    cudaFree(L->blob);
    cudaFree(L->desc);
    cudaFree(L->post_norm);
    memset(L, 0, sizeof *L);
}

extern "C" size_t sm_cuda_moe_device_expert_bytes(const sm_config *c, int fmt) {
    if (!c || c->Hm <= 0 || c->I <= 0) return 0;
    return moe_geometry(fmt, c->Hm, c->I).expert;
}

extern "C" size_t sm_cuda_moe_ws_bytes(const sm_config *c, int max_rows) {
    if (!c || max_rows < 1) return 0;
    return moe_ws_layout(c->E, c->K, c->Hm, c->I, max_rows).total;
}

/* The workspace of a layer of config c (shard: as moe_check_dims). */
static int moe_ws_alloc(const sm_config *c, int shard, int max_rows, sm_cuda_moe_ws *ws, sm_err *e) {
    memset(ws, 0, sizeof *ws);
    if (moe_check_dims(c, SM_EXP_MXFP4, shard, e)) return -1;
    if (max_rows < 1 || (long long)max_rows * c->K > MOE_MAX_ROUTES)
        return sm_errf(e, "cuda moe workspace: max_rows %d x K %d routes outside [1, %d]", max_rows, c->K, MOE_MAX_ROUTES);
    int occ = 1 << 30;
    if (moe_mm_prepare(c->Hm, c->I, &occ, e)) return -1;
    if (occ < 1) return sm_errf(e, "cuda moe workspace: the expert kernels cannot be resident (Hm %d, I %d)", c->Hm, c->I);
    if (moe_combine_prepare(c->Hm, e)) return -1;
    int dev = 0, sms = 0;
    SM_CUDA_CHECK(cudaGetDevice(&dev));
    SM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const moe_wsl W = moe_ws_layout(c->E, c->K, c->Hm, c->I, max_rows);
    cudaError_t rc = cudaMalloc(&ws->buf, W.total);
    if (rc != cudaSuccess) {
        ws->buf = NULL;
        return sm_errf(e, "cuda moe workspace: device allocation of %zu bytes failed: %s", W.total, cudaGetErrorString(rc));
    }
    rc = cudaMemset(ws->buf, 0, W.total); /* the images' padding blocks stay zero codes */
    if (rc != cudaSuccess) {
        cudaFree(ws->buf);
        ws->buf = NULL;
        return sm_errf(e, "cuda moe workspace: clearing %zu bytes failed: %s", W.total, cudaGetErrorString(rc));
    }
    ws->bytes = W.total;
    ws->max_rows = max_rows;
    ws->E = c->E; ws->K = c->K; ws->Hm = c->Hm; ws->I = c->I;
    ws->grid = sms * (occ < 2 ? occ : 2);
    ws->prefetch = MOE_PREFETCH_DEFAULT;
    ws->prefetch_rows = MOE_PREFETCH_ROWS;
    ws->sched = SM_MOE_SCHED_QUEUE;
    return 0;
}

extern "C" int sm_cuda_moe_ws_alloc(const sm_config *c, int max_rows, sm_cuda_moe_ws *ws, sm_err *e) {
    if (!c || !ws) return sm_errf(e, "cuda moe workspace: NULL config or workspace");
    return moe_ws_alloc(c, 0, max_rows, ws, e);
}

/* The shard's config: c with E = X->ne experts and I = X->ni. */
sm_config moe_shard_config(const sm_config *c, const sm_shard_experts *X) {
    sm_config s = *c;
    s.E = X->ne;
    s.I = X->ni;
    return s;
}

extern "C" size_t sm_cuda_moe_ws_bytes_shard(const sm_config *c, const sm_shard_experts *X, int max_rows) {
    if (!c || !X) return 0;
    const sm_config s = moe_shard_config(c, X);
    return sm_cuda_moe_ws_bytes(&s, max_rows);
}

extern "C" int sm_cuda_moe_ws_alloc_shard(const sm_config *c, const sm_shard_experts *X, int max_rows, sm_cuda_moe_ws *ws, sm_err *e) {
    if (!c || !X || !ws) return sm_errf(e, "cuda moe workspace: NULL config, shard or workspace");
    const sm_config s = moe_shard_config(c, X);
    return moe_ws_alloc(&s, 1, max_rows, ws, e);
}

extern "C" void sm_cuda_moe_ws_free(sm_cuda_moe_ws *ws) {
    if (!ws) return;
    cudaFree(ws->buf);
    memset(ws, 0, sizeof *ws);
}
