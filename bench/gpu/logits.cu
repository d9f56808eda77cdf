/* logits.cu: microbenchmark of the final logits (`gpu_test --bench logits`): h [n, H] (bf16) @
 * lm_head [V, H]^T, softcap, the vocab_used mask and the argmax, at the real widths (H 8192,
 * V 202048) and n = 8 .. 128 rows, through sm_k_logits (what a verify step runs: argmax only,
 * no logits written) and each forced path of sm_k_logits_path.
 *
 * lm_head is 3.3 GB, beyond L2 alone; the case still rotates over 2 copies (and their h) so
 * the tail one call leaves in L2 is not the head the next one reads.  Floor bytes = lm_head + h
 * read; FLOPs 2 n H V (at 128 rows the FLOP floor is about 3/4 of the byte floor).  For
 * sm_k_logits "b2b" is the time per call of two calls back to back.  We rejected writing the
 * f32 logits here: a verify step asks for the argmax only.
 */
#include <stdio.h>
#include <string.h>
#include "cuda/common.cuh"
#include "bench.h"

typedef struct lg_case {
    int nsets;               /* copies of lm_head and h */
    int n;                   /* rows of the call */
    int path;                /* SM_PATH_*; SM_PATH_AUTO calls sm_k_logits */
    uint16_t *lm;            /* device [nsets][V][H] */
    uint16_t *h;             /* device [nsets][BH_MAX_ROWS][H] */
    int *am;                 /* device [nsets][BH_MAX_ROWS] argmax */
} lg_case;

static int lg_call(bh_run *r, void *arg, int set, sm_err *e) {
    const lg_case *c = (const lg_case *)arg;
    const sm_config *f = &r->cfg;
    const uint16_t *lm = c->lm + (size_t)set * f->V * f->H, *h = c->h + (size_t)set * BH_MAX_ROWS * f->H;
    int *am = c->am + (size_t)set * BH_MAX_ROWS;
    if (c->path == SM_PATH_AUTO)
        return sm_k_logits(&r->kc, h, c->n, f->H, lm, f->V, f->vocab_used, f->out_mult, f->softcap, NULL, am, r->st, e);
    return sm_k_logits_path(&r->kc, c->path, h, c->n, f->H, lm, f->V, f->vocab_used, f->out_mult, f->softcap, NULL, am,
                            r->st, e);
}

static const char *lg_path_name(int p) {
    return p == SM_PATH_SYNC ? "mma.sync" : p == SM_PATH_WG1 ? "wgmma128" : p == SM_PATH_WG2 ? "wgmma256" : "sm_k_logits";
}

static int lg_run(bh_run *r, lg_case *c, sm_err *e) {
    const sm_config *f = &r->cfg;
    const double lbytes = (double)f->V * f->H * 2;
    c->nsets = bh_sets(r, lbytes);
    const size_t S = (size_t)c->nsets;
    SM_CUDA_CHECK(cudaMalloc((void **)&c->lm, S * f->V * f->H * 2));
    SM_CUDA_CHECK(cudaMalloc((void **)&c->h, S * BH_MAX_ROWS * f->H * 2));
    SM_CUDA_CHECK(cudaMalloc((void **)&c->am, S * BH_MAX_ROWS * sizeof(int)));
    /* lm_head N(0, 0.3^2) and h N(0, 1): raw logits of a few tens, so the softcap's tanh works */
    if (bh_normal_bf16(r, c->lm, S * f->V * f->H, "bench.logits.lm_head", 0.0f, 0.3f, e) ||
        bh_normal_bf16(r, c->h, S * BH_MAX_ROWS * f->H, "bench.logits.h", 0.0f, 1.0f, e))
        return -1;
    SM_CUDA_CHECK(cudaStreamSynchronize(r->st));
    for (int ri = 0; ri < BH_NROWS; ri++) {
        c->n = r->rows[ri];
        const double bytes = lbytes + (double)c->n * f->H * 2, flops = 2.0 * c->n * f->H * (double)f->V;
        for (int p = SM_PATH_AUTO; p <= SM_PATH_WG2; p++) {
            if (!r->kc.tma_encode && (p == SM_PATH_WG1 || p == SM_PATH_WG2)) continue;
            c->path = p;
            float us = 0, b2b = 0;
            if (bh_time(r, lg_call, c, c->nsets, 1, &us, e)) return sm_errprefix(e, "%s n=%d", lg_path_name(p), c->n);
            char extra[48] = "";
            if (p == SM_PATH_AUTO) {
                if (bh_time(r, lg_call, c, c->nsets, 2, &b2b, e)) return sm_errprefix(e, "b2b n=%d", c->n);
                snprintf(extra, sizeof extra, "b2b %.2f us", b2b);
            }
            bh_row(r, "logits", lg_path_name(p), c->n, us, bytes, flops, extra[0] ? extra : NULL, p == SM_PATH_AUTO);
        }
    }
    return 0;
}

int bench_logits(bh_run *r, sm_err *e) {
    bh_head("logits: h @ lm_head^T, softcap, mask, argmax (sm_k_logits and its paths); lm_head [V, H] bf16",
            "lm_head + h read (argmax written); FLOPs 2 n H V; b2b = per call, two calls back to back");
    lg_case c;
    memset(&c, 0, sizeof c);
    const int rc = lg_run(r, &c, e);
    if (c.lm) SM_CUDA_CHECK_PRINT(cudaFree(c.lm));
    if (c.h) SM_CUDA_CHECK_PRINT(cudaFree(c.h));
    if (c.am) SM_CUDA_CHECK_PRINT(cudaFree(c.am));
    return rc;
}
