/* router.cu: microbenchmark of the MoE router (`gpu_test --bench router`) at the real widths
 * (router f32 [E = 256, H = 8192], K = 8) and n = 8 .. 128 rows: sm_k_route (logits = xf @
 * router^T in f32, sigmoid, top-K with the correction bias, route weights), and its logits
 * matmul sm_k_mm_f32w alone (the rest is the top-K kernel).
 *
 * Every layer has its own 8.4 MB router, so the case rotates over >= 3 L2 sizes of sets (router,
 * bias, xf, outputs).  Floor bytes = router + bias + xf read (logits, ids and weights written
 * are small: n x (E + 2K) words); FLOPs 2 n H E (far under the byte floor).  Inputs: xf N(0, 1)
 * bf16, router N(0, 1/H), bias N(0, 0.01^2) (DESIGN.md: a small bias routes like a trained
 * model).  The "cold" line times sm_k_route with the L2 flushed and 256 KB of other code run on
 * every SM ahead of each call (bh_evict_icache): its code comes from device memory, as the
 * layer's other kernels leave it.  Only the sm_k_route line enters the summary.  We rejected
 * timing the top-K kernel alone: it reads the logits the matmul just wrote, so it only exists
 * after it.
 */
#include <stdio.h>
#include <string.h>
#include <math.h>
#include "cuda/common.cuh"
#include "bench.h"

typedef struct rt_case {
    int n;                   /* rows of the call */
    int nsets;               /* rotated sets */
    int full;                /* 1: sm_k_route, 0: sm_k_mm_f32w only */
    float *router;           /* device [nsets][E][H] f32 */
    float *bias;             /* device [nsets][E] f32 */
    uint16_t *xf;            /* device [nsets][n][H] bf16 */
    float *logits;           /* device [nsets][n][E] f32 */
    int *idx;                /* device [nsets][n][K] */
    float *w;                /* device [nsets][n][K] */
} rt_case;

static int rt_call(bh_run *r, void *arg, int set, sm_err *e) {
    const rt_case *c = (const rt_case *)arg;
    const sm_config *f = &r->cfg;
    const size_t s = (size_t)set;
    const float *W = c->router + s * f->E * f->H, *b = c->bias + s * f->E;
    const uint16_t *xf = c->xf + s * c->n * f->H;
    float *lg = c->logits + s * c->n * f->E, *w = c->w + s * c->n * f->K;
    int *idx = c->idx + s * c->n * f->K;
    if (!c->full) return sm_k_mm_f32w(&r->kc, xf, c->n, f->H, W, f->E, lg, r->st, e);
    return sm_k_route(&r->kc, xf, c->n, f->H, W, b, f->E, f->K, f->out_mult, f->route_scale, lg, idx, w, r->st, e);
}

static int rt_run(bh_run *r, rt_case *c, sm_err *e) {
    const sm_config *f = &r->cfg;
    const double bytes = (double)f->E * f->H * 4 + f->E * 4.0 + (double)c->n * f->H * 2;
    c->nsets = bh_sets(r, bytes);
    const size_t S = (size_t)c->nsets;
    SM_CUDA_CHECK(cudaMalloc((void **)&c->router, S * f->E * f->H * 4));
    SM_CUDA_CHECK(cudaMalloc((void **)&c->bias, S * f->E * 4));
    SM_CUDA_CHECK(cudaMalloc((void **)&c->xf, S * c->n * f->H * 2));
    SM_CUDA_CHECK(cudaMalloc((void **)&c->logits, S * c->n * f->E * 4));
    SM_CUDA_CHECK(cudaMalloc((void **)&c->idx, S * c->n * f->K * 4));
    SM_CUDA_CHECK(cudaMalloc((void **)&c->w, S * c->n * f->K * 4));
    if (bh_normal_f32(r, c->router, S * f->E * f->H, "bench.router.w", 0.0f, 1.0f / sqrtf((float)f->H), e) ||
        bh_normal_f32(r, c->bias, S * f->E, "bench.router.bias", 0.0f, 0.01f, e) ||
        bh_normal_bf16(r, c->xf, S * c->n * f->H, "bench.router.xf", 0.0f, 1.0f, e))
        return -1;
    SM_CUDA_CHECK(cudaStreamSynchronize(r->st));
    for (c->full = 1; c->full >= 0; c->full--) {
        float us = 0;
        const char *what = c->full ? "sm_k_route" : "mm_f32w";
        if (bh_time(r, rt_call, c, c->nsets, 1, &us, e)) return sm_errprefix(e, "%s n=%d", what, c->n);
        bh_row(r, "router", what, c->n, us, bytes, 2.0 * c->n * f->H * f->E, NULL, c->full);
    }
    /* sm_k_route again with its code out of the instruction caches, as in a layer */
    float us = 0;
    c->full = 1;
    r->evict = 1;
    const int rc = bh_time(r, rt_call, c, c->nsets, 1, &us, e);
    r->evict = 0;
    if (rc) return sm_errprefix(e, "sm_k_route cold n=%d", c->n);
    bh_row(r, "router", "sm_k_route cold", c->n, us, bytes, 2.0 * c->n * f->H * f->E, NULL, 0);
    return 0;
}

int bench_router(bh_run *r, sm_err *e) {
    bh_head("router: logits = xf @ router^T (f32 weights), sigmoid, top-K + bias, weights (sm_k_route; mm_f32w = its "
            "matmul alone)",
            "router [E, H] f32 + bias + xf read (logits, ids, weights written: small); FLOPs 2 n H E");
    int rc = 0;
    for (int ri = 0; ri < BH_NROWS && !rc; ri++) {
        rt_case c;
        memset(&c, 0, sizeof c);
        c.n = r->rows[ri];
        rc = rt_run(r, &c, e);
        if (c.router) SM_CUDA_CHECK_PRINT(cudaFree(c.router));
        if (c.bias) SM_CUDA_CHECK_PRINT(cudaFree(c.bias));
        if (c.xf) SM_CUDA_CHECK_PRINT(cudaFree(c.xf));
        if (c.logits) SM_CUDA_CHECK_PRINT(cudaFree(c.logits));
        if (c.idx) SM_CUDA_CHECK_PRINT(cudaFree(c.idx));
        if (c.w) SM_CUDA_CHECK_PRINT(cudaFree(c.w));
    }
    return rc;
}
