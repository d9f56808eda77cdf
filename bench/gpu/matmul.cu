/* matmul.cu: microbenchmark of the dense projections of a layer (`gpu_test --bench matmul`):
 * y [n, m] = x [n, k] @ W [m, k]^T in bf16 at the real widths, for the fused q/k/v/gate
 * projection [(2 nH + 2 nKV) D, H], o_proj [H, nH D], pooler [Hm, H] and unpooler [H, Hm], at
 * n = 8 .. 128 rows, through sm_k_mm (what a step runs: "auto") and each path of cuda/ops/ops.h
 * (mma.sync core, wgmma 128-row tiles, wgmma 256-row tiles).
 *
 * Each case rotates over copies of W, x and y that hold >= 3 L2 sizes together; floor bytes =
 * W + x read (y written is n x m, small); FLOPs 2 n k m.  For sm_k_mm the table also gives
 * "b2b": the time per call of two calls back to back on different copies (the second starts
 * while the first drains; the difference to one call is the launch's start and drain cost).
 * Only the sm_k_mm line of a case enters the summary.  We rejected timing inside CUDA graphs
 * here: the question is the kernel's own speed; the graph-level view is `sparkmono bench`.
 */
#include <stdio.h>
#include <string.h>
#include <math.h>
#include "cuda/common.cuh"
#include "bench.h"

typedef struct mm_case {
    const char *name;        /* table label */
    int m, k;                /* W [m, k] */
    int nsets;               /* copies of W, x, y */
    int n;                   /* rows of the call */
    int path;                /* SM_PATH_*; SM_PATH_AUTO calls sm_k_mm */
    uint16_t *w;             /* device [nsets][m][k] */
    uint16_t *x;             /* device [nsets][BH_MAX_ROWS][k] */
    uint16_t *y;             /* device [nsets][BH_MAX_ROWS][m] */
} mm_case;

static int mm_call(bh_run *r, void *arg, int set, sm_err *e) {
    const mm_case *c = (const mm_case *)arg;
    const uint16_t *w = c->w + (size_t)set * c->m * c->k, *x = c->x + (size_t)set * BH_MAX_ROWS * c->k;
    uint16_t *y = c->y + (size_t)set * BH_MAX_ROWS * c->m;
    if (c->path == SM_PATH_AUTO) return sm_k_mm(&r->kc, x, c->n, c->k, w, c->m, y, r->st, e);
    return sm_k_mm_path(&r->kc, c->path, x, c->n, c->k, w, c->m, y, r->st, e);
}

static const char *mm_path_name(int p) {
    return p == SM_PATH_SYNC ? "mma.sync" : p == SM_PATH_WG1 ? "wgmma128" : p == SM_PATH_WG2 ? "wgmma256" : "sm_k_mm";
}

/* Every row count and path of one matrix; c->w, x, y allocated here (freed by the caller). */
static int mm_matrix(bh_run *r, mm_case *c, sm_err *e) {
    const double wbytes = (double)c->m * c->k * 2;
    c->nsets = bh_sets(r, wbytes + (double)BH_MAX_ROWS * (c->k + c->m) * 2);
    const size_t S = (size_t)c->nsets;
    SM_CUDA_CHECK(cudaMalloc((void **)&c->w, S * c->m * c->k * 2));
    SM_CUDA_CHECK(cudaMalloc((void **)&c->x, S * BH_MAX_ROWS * c->k * 2));
    SM_CUDA_CHECK(cudaMalloc((void **)&c->y, S * BH_MAX_ROWS * c->m * 2));
    char nm[64];
    snprintf(nm, sizeof nm, "bench.matmul.%s.w", c->name);
    if (bh_normal_bf16(r, c->w, S * c->m * c->k, nm, 0.0f, 1.0f / sqrtf((float)c->k), e)) return -1;
    snprintf(nm, sizeof nm, "bench.matmul.%s.x", c->name);
    if (bh_normal_bf16(r, c->x, S * BH_MAX_ROWS * c->k, nm, 0.0f, 1.0f, e)) return -1;
    SM_CUDA_CHECK(cudaStreamSynchronize(r->st));
    for (int ri = 0; ri < BH_NROWS; ri++) {
        c->n = r->rows[ri];
        const double bytes = wbytes + (double)c->n * c->k * 2, flops = 2.0 * c->n * c->k * c->m;
        for (int p = SM_PATH_AUTO; p <= SM_PATH_WG2; p++) {
            if (!r->kc.tma_encode && (p == SM_PATH_WG1 || p == SM_PATH_WG2)) continue;
            c->path = p;
            float us = 0, b2b = 0;
            if (bh_time(r, mm_call, c, c->nsets, 1, &us, e)) return sm_errprefix(e, "%s %s n=%d", c->name, mm_path_name(p), c->n);
            char extra[48] = "";
            if (p == SM_PATH_AUTO) {
                if (bh_time(r, mm_call, c, c->nsets, 2, &b2b, e)) return sm_errprefix(e, "%s b2b n=%d", c->name, c->n);
                snprintf(extra, sizeof extra, "b2b %.2f us", b2b);
            }
            char what[40];
            snprintf(what, sizeof what, "%s %s", c->name, mm_path_name(p));
            bh_row(r, "matmul", what, c->n, us, bytes, flops, extra[0] ? extra : NULL, p == SM_PATH_AUTO);
        }
    }
    return 0;
}

int bench_matmul(bh_run *r, sm_err *e) {
    const sm_config *f = &r->cfg;
    const int QD = f->nH * f->D, KD = f->nKV * f->D;
    mm_case cs[4] = {
        {"qkvg", 2 * QD + 2 * KD, f->H, 0, 0, 0, NULL, NULL, NULL},
        {"o_proj", f->H, QD, 0, 0, 0, NULL, NULL, NULL},
        {"pooler", f->Hm, f->H, 0, 0, 0, NULL, NULL, NULL},
        {"unpooler", f->H, f->Hm, 0, 0, 0, NULL, NULL, NULL},
    };
    bh_head("matmul: y = x @ W^T, bf16 (sm_k_mm and its paths); qkvg [(2nH+2nKV)D, H], o_proj [H, nH D], pooler [Hm, H], "
            "unpooler [H, Hm]",
            "W + x read (y written: n x m, not counted); FLOPs 2 n k m; b2b = per call, two calls back to back");
    int rc = 0;
    for (int i = 0; i < 4 && !rc; i++) {
        rc = mm_matrix(r, &cs[i], e);
        if (cs[i].w) SM_CUDA_CHECK_PRINT(cudaFree(cs[i].w));
        if (cs[i].x) SM_CUDA_CHECK_PRINT(cudaFree(cs[i].x));
        if (cs[i].y) SM_CUDA_CHECK_PRINT(cudaFree(cs[i].y));
    }
    return rc;
}
